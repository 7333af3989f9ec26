//! Shared by the integration tests: batches with known contents, made the way
//! the profiler and a capture's replay make them.
#![allow(dead_code)] // each test file uses its own part of this module

use std::sync::Arc;

use tracing_gpu::batch::{Batch, DeviceInfo, LaunchInfo};
use tracing_gpu::clock::{Calibration, HostClock};
use tracing_gpu::decode::OwnedBuffer;
use tracing_gpu::format::BufferBuilder;
use tracing_gpu::registry::EventRegistry;

/// The GPU every test batch claims to come from.
pub fn h200() -> DeviceInfo {
    DeviceInfo {
        ordinal: 0,
        name: "NVIDIA H200".into(),
        uuid: "GPU-5e0b6a3c-1111-2222-3333-444455556666".into(),
        sm_count: 132,
        driver_version: "580.95.05".into(),
        compute_capability: (9, 0),
    }
}

/// A batch of `buffer` (decoded against `registry`) on [`h200`].
pub fn batch_of(
    buffer: Vec<u8>,
    registry: EventRegistry,
    calibration: Calibration,
    launch: LaunchInfo,
) -> Arc<Batch> {
    let buffer = OwnedBuffer::decode(buffer, Some(&registry)).expect("a valid test buffer");
    Arc::new(Batch {
        device: Arc::new(h200()),
        launch,
        buffer: Arc::new(buffer),
        calibration: Arc::new(calibration),
        registry: Arc::new(registry),
    })
}

/// Launch `launch_id` of kernel "k": 4 blocks of 2 warps, each warp 8 `mma`
/// ranges of 600 ns, its device clock mapped exactly onto the trace clock now.
pub fn batch(launch_id: u64) -> Arc<Batch> {
    let base = 1_000_000_000;
    let mut b = BufferBuilder::new([4, 1, 1], [64, 1, 1], 32);
    b.launch_id(launch_id);
    for block in 0..4 {
        for warp in 0..2 {
            let slot = b.warp(block, warp).unwrap();
            for k in 0..8u64 {
                let t = base + k * 1_000;
                slot.range(1, t, t + 600, k as u32);
            }
        }
    }
    let now = HostClock::Boottime.now_ns();
    batch_of(
        b.finish(),
        EventRegistry::from_pairs([(1, "mma")]).unwrap(),
        Calibration::exact(base, now, 0.0),
        LaunchInfo {
            launch_id,
            kernel: "k".into(),
            host_launch_ns: now,
            host_complete_ns: now + 20_000,
            grid: [4, 1, 1],
            block: [64, 1, 1],
            ..LaunchInfo::default()
        },
    )
}
