//! Shared by the integration tests: batches with known contents, made the way
//! the profiler and a capture's replay make them.
#![allow(dead_code)] // each test file uses its own part of this module

pub mod backends;
pub mod cli;
pub mod streamed;

use std::sync::Arc;

use tracing_gpu::batch::{Batch, DeviceInfo, HostSpan, LaunchInfo, Part};
use tracing_gpu::capture::{CalibrationRound, Capture, CaptureDevice, CaptureLaunch};
use tracing_gpu::clock::{Calibration, HostClock, Sample};
use tracing_gpu::decode::OwnedBuffer;
use tracing_gpu::format::BufferBuilder;
use tracing_gpu::registry::EventRegistry;

/// The GEMM's phases, as the Perfetto tests name them.
pub const LOAD: u16 = 1;
/// See [`LOAD`].
pub const MMA: u16 = 2;
/// See [`LOAD`].
pub const EPILOGUE: u16 = 3;
/// See [`LOAD`].
pub const MAINLOOP: u16 = 4;

/// The registry of the GEMM's phases: `load` carries its k-tile index as
/// payload, and so does `mma` when `mma_payload`; epilogue and mainloop declare
/// none (their slices have no argument).
pub fn gemm_registry(mma_payload: bool) -> Arc<EventRegistry> {
    let mut r = EventRegistry::new();
    for (id, name) in [
        (LOAD, "load"),
        (MMA, "mma"),
        (EPILOGUE, "epilogue"),
        (MAINLOOP, "mainloop"),
    ] {
        r.register(id, name).unwrap();
    }
    r.declare_payload(LOAD, "k_tile").unwrap();
    if mma_payload {
        r.declare_payload(MMA, "k_tile").unwrap();
    }
    Arc::new(r)
}

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

/// `whole` delivered as a streamed launch would be: one batch per part, the
/// parts cut at device times `cuts` (increasing). Each range goes to the part
/// that drains its end (the first part whose cut is past its end; the last
/// part after the last cut), so a warp is in several parts and no range is
/// split. A warp that dropped records is in the last part only, whole (its
/// slot overflowed while that part was drained). A part before the last says
/// it was drained at its cut.
pub fn in_parts(whole: &Batch, cuts: &[u64]) -> Vec<Arc<Batch>> {
    use tracing_gpu::format::Event;
    let view = whole.buffer.view();
    let h = view.header();
    let n = cuts.len() + 1;
    // Per part, per slot: (header, its events in this part, first / last part).
    type Piece = (tracing_gpu::format::SlotHeader, Vec<Event>, bool, bool);
    let mut parts: Vec<Vec<Piece>> = vec![Vec::new(); n];
    for slot in view.slots() {
        let s = slot.header;
        if s.events_lost > 0 {
            parts[n - 1].push((s, slot.events().collect(), true, true));
            continue;
        }
        let mut mine: Vec<Vec<Event>> = vec![Vec::new(); n];
        for e in slot.events() {
            let part = cuts.iter().position(|&c| e.end_ns < c).unwrap_or(n - 1);
            mine[part].push(e);
        }
        let used: Vec<usize> = (0..n).filter(|&p| !mine[p].is_empty()).collect();
        for (k, events) in mine.into_iter().enumerate() {
            if !events.is_empty() {
                let (first, last) = (Some(&k) == used.first(), Some(&k) == used.last());
                parts[k].push((s, events, first, last));
            }
        }
    }
    parts
        .iter()
        .enumerate()
        .map(|(index, pieces)| {
            // Each part as the collector trims a buffer: room for its
            // longest slot, as v1 records (a v2 slot holds more events than
            // its capacity in records); a slot that dropped records is the
            // longest, full, and drops them again.
            let capacity = pieces.iter().map(|p| p.1.len() as u32).max().unwrap_or(1);
            let mut b = BufferBuilder::new(h.grid, h.block, capacity.max(1));
            b.launch_id(h.launch_id);
            for (s, events, first, last) in pieces {
                let w = b.warp(s.block_linear, s.warp).unwrap();
                w.sm(s.sm_first, s.sm_last);
                events.iter().for_each(|&e| {
                    w.push(e);
                });
                // The warp's first timer read and its flush, in its first and last parts.
                if *first {
                    w.first_ts(s.first_ts);
                }
                if *last {
                    w.last_ts(s.last_ts);
                }
                if s.events_lost > 0 {
                    assert_eq!(events.len() as u32, capacity, "a full slot dropped");
                    for _ in 0..s.events_lost {
                        w.instant(0, s.last_ts, 0);
                    }
                }
            }
            let last = index == n - 1;
            let buffer = OwnedBuffer::decode(b.finish(), Some(&whole.registry)).unwrap();
            Arc::new(Batch {
                launch: LaunchInfo {
                    host_complete_ns: match last {
                        true => whole.launch.host_complete_ns,
                        false => whole.trace_ns(cuts[index]),
                    },
                    part: Some(Part {
                        index: index as u32,
                        last,
                    }),
                    ..whole.launch.clone()
                },
                buffer: Arc::new(buffer),
                ..whole.clone()
            })
        })
        .collect()
}

/// The capture at `from` with every launch streamed, written to `to`: each
/// cut in `parts` parts of equal device time ([`in_parts`]), and the parts of
/// all launches interleaved (part 0 of each, then part 1 of each, ...), as
/// launches streaming at once would be recorded.
pub fn streamed_capture(from: &std::path::Path, parts: u64, to: &std::path::Path) {
    let mut capture = Capture::read(from).unwrap();
    let batches = capture.batches().unwrap();
    let mut launches: Vec<std::vec::IntoIter<CaptureLaunch>> = batches
        .iter()
        .zip(&capture.launches)
        .map(|(b, l)| {
            let view = b.buffer.view();
            let first = view.slots().map(|s| s.header.first_ts).min().unwrap();
            let last = view.slots().map(|s| s.header.last_ts).max().unwrap();
            let step = (last - first) / parts;
            let cuts: Vec<u64> = (1..parts).map(|k| first + k * step).collect();
            let parts: Vec<CaptureLaunch> = in_parts(b, &cuts)
                .iter()
                .map(|p| CaptureLaunch::new(l.device, &p.launch, p.buffer.clone()))
                .collect();
            parts.into_iter()
        })
        .collect();
    capture.launches.clear();
    while launches.iter().any(|l| l.len() > 0) {
        capture
            .launches
            .extend(launches.iter_mut().filter_map(Iterator::next));
    }
    capture.write(to).unwrap();
}

/// A calibrated H200 whose device clock reads the host's.
fn calibrated_h200() -> CaptureDevice {
    CaptureDevice {
        info: DeviceInfo {
            ordinal: 0,
            name: "NVIDIA H200".into(),
            uuid: "GPU-00000000-0000-0000-0000-000000000000".into(),
            sm_count: 132,
            driver_version: "580.159.04".into(),
            compute_capability: (9, 0),
        },
        calibrations: vec![CalibrationRound {
            samples: (0..64u64)
                .map(|i| {
                    let t = 1_000_000_000 + i * 10_000;
                    Sample {
                        host_before: t,
                        device: t + 500,
                        host_after: t + 1_000,
                    }
                })
                .collect(),
            ..Default::default()
        }],
    }
}

/// A capture of `launches` launches (ids from 1) of 132 blocks × `warps` warps, each warp
/// `events` ranges (capacity 256), with one host span per launch.
pub fn synthetic_capture(launches: u64, warps: u32, events: u32) -> Capture {
    let registry = EventRegistry::from_pairs([(0, "load"), (1, "mma"), (2, "store")]).unwrap();
    let mut capture = Capture {
        metadata: vec![("command".into(), "capture_bounds".into())],
        devices: vec![calibrated_h200()],
        registry,
        ..Capture::default()
    };
    for id in 1..=launches {
        let t0 = 1_000_000_000 + id * 1_000_000;
        let (grid, block) = ([132, 1, 1], [32 * warps, 1, 1]);
        let mut b = BufferBuilder::new(grid, block, 256);
        b.launch_id(id);
        for block in 0..132 {
            for warp in 0..warps {
                let s = b.warp(block, warp).unwrap().sm(block, block);
                for k in 0..events {
                    let t = t0 + u64::from(k) * 1_000 + u64::from(warp) * 10;
                    s.range((k % 3) as u16, t, t + 900, k);
                }
            }
        }
        let buffer = Arc::new(OwnedBuffer::decode(b.finish(), None).unwrap());
        let info = LaunchInfo {
            launch_id: id,
            kernel: "synthetic".into(),
            host_launch_ns: t0 - 5_000,
            host_complete_ns: t0 + u64::from(events) * 1_000 + 5_000,
            grid,
            block,
            parent: None,
            host_thread: "main".into(),
            part: None,
        };
        capture.host_spans.push(HostSpan {
            name: "launch".into(),
            target: "capture_bounds".into(),
            thread_name: "main".into(),
            thread_id: 1,
            start_ns: info.host_launch_ns,
            end_ns: info.host_complete_ns,
            parent: None,
            launch_id: Some(id),
            fields: vec![],
        });
        capture.launches.push(CaptureLaunch::new(0, &info, buffer));
    }
    capture
}

/// A capture of `launches` launches (ids from 1) of one warp and one event,
/// all at the same device time: every kernel slice overlaps every other.
pub fn overlapping_capture(launches: u64) -> Capture {
    let registry = EventRegistry::from_pairs([(0, "load")]).unwrap();
    let mut capture = Capture {
        metadata: vec![("command".into(), "overlapping".into())],
        devices: vec![calibrated_h200()],
        registry,
        ..Capture::default()
    };
    let t0 = 1_000_000_000;
    for id in 1..=launches {
        let (grid, block) = ([1, 1, 1], [32, 1, 1]);
        let mut b = BufferBuilder::new(grid, block, 4);
        b.launch_id(id);
        b.warp(0, 0).unwrap().sm(0, 0).range(0, t0, t0 + 900, 0);
        let buffer = Arc::new(OwnedBuffer::decode(b.finish(), None).unwrap());
        let info = LaunchInfo {
            launch_id: id,
            kernel: "overlapping".into(),
            host_launch_ns: t0 - 5_000,
            host_complete_ns: t0 + 5_000,
            grid,
            block,
            parent: None,
            host_thread: "main".into(),
            part: None,
        };
        capture.launches.push(CaptureLaunch::new(0, &info, buffer));
    }
    capture
}

/// The capture at `from` cut down to its first `launches` launches and, in
/// each, the warps of its first `blocks` blocks: small enough to ship every
/// event, with the recorded times and host spans.
pub fn trimmed_capture(from: &str, blocks: u32, launches: usize) -> Capture {
    let mut capture = Capture::read(from).unwrap();
    let batches = capture.batches().unwrap();
    capture.launches.truncate(launches);
    for (launch, batch) in capture.launches.iter_mut().zip(&batches) {
        let view = batch.buffer.view();
        let h = view.header();
        let kept: Vec<_> = view
            .slots()
            .filter(|s| s.header.block_linear < blocks)
            .collect();
        let capacity = kept.iter().map(|s| s.events().count()).max().unwrap_or(1) as u32;
        let mut b = BufferBuilder::new(h.grid, h.block, capacity.max(1));
        b.launch_id(h.launch_id);
        for slot in kept {
            let s = slot.header;
            let w = b.warp(s.block_linear, s.warp).unwrap();
            w.sm(s.sm_first, s.sm_last)
                .first_ts(s.first_ts)
                .last_ts(s.last_ts);
            for e in slot.events() {
                w.push(e);
            }
        }
        let buffer = OwnedBuffer::decode(b.finish(), Some(&batch.registry)).unwrap();
        *launch = CaptureLaunch::new(launch.device, &batch.launch, Arc::new(buffer));
    }
    capture
}
