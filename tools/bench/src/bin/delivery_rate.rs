//! How fast launches can be delivered once they are back on the host: the work
//! the profiler's collector thread does per launch after the copy (decode the
//! buffer, hand the batch to the subscriber), for small launches, with and
//! without a `PerfettoLayer` and with the plain device spans on or off. No GPU.
//!
//! ```text
//! cargo run --release -p tracing-gpu-bench --bin delivery_rate -- [--batches 3000] [--same-times]
//! ```
//!
//! Each batch is one block of 8 warps, 4 events each (32 events, a 33 KB
//! buffer at 256 records per warp), like `profile_overhead`'s
//! launches, one launch every 10 µs on the device. If the collector needs
//! longer per launch than the application needs to make one, launches queue
//! up and hold their trace buffers, and the pool grows (see `Profiler::reserve`).
//!
//! Besides the wall time per launch, it prints the CPU time per launch of the
//! delivering thread (the collector's share) and of the other threads (the
//! Perfetto layer's writer), which a machine shared with other work does not
//! inflate. `--same-times` puts every launch at the same device times instead:
//! launches that all overlap, so the Perfetto writer gives each warp one more
//! lane per launch (what an earlier version of this benchmark measured by
//! accident).

use rustix::time::ClockId;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use clap::Parser;
use tracing::Dispatch;
use tracing_gpu::batch::{Batch, DeviceInfo, LaunchInfo};
use tracing_gpu::clock::{Calibration, HostClock};
use tracing_gpu::decode::OwnedBuffer;
use tracing_gpu::deliver;
use tracing_gpu::format::BufferBuilder;
use tracing_gpu::perfetto::PerfettoLayer;
use tracing_gpu::registry::EventRegistry;
use tracing_gpu_bench::cli;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::EnvFilter;

/// How fast the collector's work per launch (decode, deliver) goes, without a GPU.
#[derive(Parser, Debug)]
#[command(name = "delivery_rate")]
struct Args {
    /// Launches delivered per configuration.
    #[arg(long, default_value_t = 3000, value_parser = cli::positive::<usize>)]
    batches: usize,
    /// Put every launch at the same device times (all overlapping).
    #[arg(long)]
    same_times: bool,
}

fn main() -> ExitCode {
    cli::exit("delivery_rate", run(&Args::parse()).map(|()| true))
}

fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let Args {
        batches,
        same_times,
    } = *args;
    let registry = Arc::new(EventRegistry::from_pairs([
        (1, "load"),
        (2, "compute"),
        (3, "store"),
        (4, "done"),
    ])?);
    let mut b = BufferBuilder::new([1, 1, 1], [256, 1, 1], 256);
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

    println!(
        "| subscriber | plain device spans | µs per launch (decode + deliver), wall | \
         CPU µs per launch, delivering thread | CPU µs per launch, other threads |"
    );
    println!("|---|---|---:|---:|---:|");
    for (perfetto, plain) in [(false, false), (false, true), (true, false), (true, true)] {
        let filter = EnvFilter::new(if plain {
            "trace"
        } else {
            "trace,tracing_gpu::device=info"
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
        // Device times land a second from now, after the launch spans, one
        // launch every 10 µs (or all at once).
        let h0 = HostClock::Boottime.now_ns() + 1_000_000_000;
        let step = if same_times { 0 } else { 10_000 };
        let device = Arc::new(DeviceInfo::default());
        let (t, thread0, process0) = (
            Instant::now(),
            cpu_ns(ClockId::ThreadCPUTime),
            cpu_ns(ClockId::ProcessCPUTime),
        );
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
            let capture = OwnedBuffer::decode(buffer, Some(&registry))?;
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
                buffer: Arc::new(capture),
                calibration: Arc::new(Calibration::exact(1_000, h0 + i as u64 * step, 0.0)),
                registry: registry.clone(),
            });
            deliver::deliver(&dispatch, batch);
        }
        deliver::flush(&dispatch);
        let per = t.elapsed().as_secs_f64() * 1e6 / batches as f64;
        let thread = cpu_ns(ClockId::ThreadCPUTime) - thread0;
        let others = (cpu_ns(ClockId::ProcessCPUTime) - process0).saturating_sub(thread);
        let us = |ns: u64| ns as f64 / 1e3 / batches as f64;
        if let Some(g) = guard {
            g.finish()?;
        }
        println!(
            "| {} | {} | {per:.1} | {:.1} | {:.1} |",
            if perfetto {
                "registry + PerfettoLayer"
            } else {
                "registry"
            },
            if plain { "on" } else { "off" },
            us(thread),
            us(others)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// CPU time of `clock` (this thread's, or the whole process's), ns.
fn cpu_ns(clock: ClockId) -> u64 {
    let ts = rustix::time::clock_gettime(clock);
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
