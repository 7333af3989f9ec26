//! How fast launches can be delivered once they are back on the host: the work
//! the profiler's collector thread does per launch after the copy (decode the
//! buffer, hand the batch to the subscriber), for small launches, with and
//! without a `PerfettoLayer` and with the plain device spans on or off. No GPU.
//!
//! ```text
//! cargo run --release --example delivery_rate -- [--batches 3000]
//! ```
//!
//! Each batch is one block of 8 warps, 4 events each (32 events, a 33 KB
//! buffer at 256 records per warp), like `examples/profile_overhead.rs`'s
//! launches. If the collector needs longer per launch than the application
//! needs to make one, launches queue up and hold their trace buffers, and the
//! pool grows (see `Profiler::reserve`).

use std::sync::Arc;
use std::time::Instant;

use tracing::Dispatch;
use tracing_gpu::bridge::{self, Batch, DeviceInfo, LaunchInfo};
use tracing_gpu::clock::{Calibration, HostClock};
use tracing_gpu::decode::{CaptureBuilder, OwnedCapture};
use tracing_gpu::perfetto::PerfettoLayer;
use tracing_gpu::registry::EventRegistry;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::EnvFilter;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut batches = 3000usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match (a.as_str(), args.next().and_then(|v| v.parse().ok())) {
            ("--batches", Some(n)) if n > 0 => batches = n,
            _ => return Err("usage: delivery_rate [--batches N]".into()),
        }
    }
    let registry = Arc::new(EventRegistry::from_pairs([
        (1, "load"),
        (2, "compute"),
        (3, "store"),
        (4, "done"),
    ])?);
    let mut b = CaptureBuilder::new([1, 1, 1], [256, 1, 1], 256);
    for w in 0..8 {
        b.warp(0, w)
            .expect("in the grid")
            .range(1, 1_000, 1_100, 0)
            .range(2, 1_100, 1_200, 0)
            .range(3, 1_200, 1_300, 0)
            .instant(4, 1_300, 1);
    }
    let bytes = b.finish();
    let dir = std::env::temp_dir().join(format!("tgpu-delivery-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;

    println!("| subscriber | plain device spans | µs per launch (decode + deliver) |");
    println!("|---|---|---:|");
    for (perfetto, plain) in [(false, false), (false, true), (true, false), (true, true)] {
        let filter = EnvFilter::new(if plain {
            "trace"
        } else {
            "trace,tracing_gpu::device=off"
        });
        let (layer, guard) = if perfetto {
            let (l, g) = PerfettoLayer::builder()
                .file(dir.join("delivery.perfetto-trace"))
                .build()?;
            (Some(l), Some(g))
        } else {
            (None, None)
        };
        let dispatch = Dispatch::new(tracing_subscriber::registry().with(filter).with(layer));
        // Device times land a second from now, after the launch spans.
        let calibration = Arc::new(Calibration::exact(
            1_000,
            HostClock::Boottime.now_ns() + 1_000_000_000,
            0.0,
        ));
        let device = Arc::new(DeviceInfo::default());
        let t = Instant::now();
        for i in 0..batches {
            let span = tracing::dispatcher::with_default(&dispatch, || {
                let s = tracing::info_span!("launch", gpu.launch_id = i as u64);
                s.in_scope(|| ());
                s
            });
            let mut buffer = bytes.clone();
            let mut header = *b.header();
            header.launch_id = i as u64;
            header.write_to(&mut buffer);
            let capture = OwnedCapture::decode(buffer, Some(&registry))?;
            let batch = Arc::new(Batch {
                device: device.clone(),
                launch: LaunchInfo {
                    launch_id: i as u64,
                    kernel: "launch".into(),
                    grid: header.grid,
                    block: header.block,
                    parent: span.id(),
                    ..Default::default()
                },
                capture: Arc::new(capture),
                calibration: calibration.clone(),
                registry: registry.clone(),
            });
            bridge::deliver(&dispatch, batch);
        }
        bridge::flush(&dispatch);
        let per = t.elapsed().as_secs_f64() * 1e6 / batches as f64;
        if let Some(g) = guard {
            g.finish()?;
        }
        println!(
            "| {} | {} | {per:.1} |",
            if perfetto {
                "registry + PerfettoLayer"
            } else {
                "registry"
            },
            if plain { "on" } else { "off" }
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
