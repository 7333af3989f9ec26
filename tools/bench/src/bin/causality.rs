//! Causality check of the live path: every device event, mapped to the host's
//! trace clock, must fall between the host time read just before its launch call
//! and the host time read just after the `synchronize` that waited for it.
//!
//! ```text
//! cargo run --release -p tracing-gpu-bench --bin causality -- [--launches 1000] [--out summary.md] \
//!     [--periodic-rounds 128] [--pollers 1]
//! ```
//!
//! It makes `--launches` profiled launches of a small instrumented kernel
//! (`kernels/examples/quickstart.cu`) of varied shapes and lengths, with varied
//! idle gaps between them (so the clock mapping is exercised across
//! recalibrations), each followed by a `synchronize`. The device events reach it
//! the way they reach any sink: whole batches, to a `BatchSink` of its own in
//! the subscriber (see `tracing_gpu::deliver`), every event mapped with
//! `Batch::trace_ns`, the mapping every output uses. The launch time is the one
//! the profiler read just before the launch call (`LaunchInfo::host_launch_ns`,
//! also `gpu.host_launch_ns` on the launch span).
//!
//! It prints the number of violations and the distribution of the margins
//! (how far inside its window each launch's earliest and latest event fell),
//! and exits non-zero on any violation. Without a GPU it says so and exits 2.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use parking_lot::Mutex;
use tracing_gpu::batch::{Batch, BatchSink};
use tracing_gpu::clock::HostClock;
use tracing_gpu::cuda::calibrate::Calibrator;
use tracing_gpu::cuda::cudarc::driver::LaunchConfig;
use tracing_gpu::cuda::{self, gpu_profile, Profiler, ProfilerError};
use tracing_gpu::deliver::SinkLayer;
use tracing_gpu_bench::quickstart::{Kernel, EVENTS};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::SubscriberExt;

/// What the sink learns: per launch id, the launch time and the device events' extent.
#[derive(Default)]
struct Seen {
    /// Launch ids in the order their batches arrived (= launch order here).
    order: Vec<u64>,
    host_launch_ns: HashMap<u64, u64>,
    /// (earliest start, latest end, events) per launch.
    extent: HashMap<u64, (u64, u64, u64)>,
    /// Events whose own start > end (never expected).
    inverted: u64,
}

#[derive(Clone, Default)]
struct Collect(Arc<Mutex<Seen>>);

impl BatchSink for Collect {
    fn on_batch(&self, batch: &Arc<Batch>) {
        let launch = batch.launch.launch_id;
        let (mut first, mut last, mut n, mut inverted) = (u64::MAX, 0, 0, 0);
        for slot in batch.buffer.view().slots() {
            for ev in slot.events() {
                let (s, e) = (batch.trace_ns(ev.start_ns), batch.trace_ns(ev.end_ns));
                inverted += u64::from(s > e);
                (first, last, n) = (first.min(s), last.max(e), n + 1);
            }
        }
        let mut seen = self.0.lock();
        seen.order.push(launch);
        seen.inverted += inverted;
        if batch.launch.host_launch_ns != 0 {
            seen.host_launch_ns
                .insert(launch, batch.launch.host_launch_ns);
        }
        if n > 0 {
            seen.extent.insert(launch, (first, last, n));
        }
    }
    fn flush(&self) {}
}

/// Every device event, on the host's clock, between its launch call and the
/// synchronize after it.
#[derive(Parser, Debug)]
#[command(name = "causality")]
struct Args {
    /// Profiled launches, each followed by a synchronize.
    #[arg(long, default_value_t = 1000)]
    launches: usize,
    /// Also write the summary here.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Rounds of each periodic recalibration.
    #[arg(long, default_value_t = Calibrator::PERIODIC_ROUNDS)]
    periodic_rounds: usize,
    /// GPU pollers of the calibration.
    #[arg(long, default_value_t = Calibrator::DEFAULT_POLLERS)]
    pollers: u32,
}

/// Quantiles of a sorted slice, nearest rank.
fn q(sorted: &[i64], p: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn main() -> ExitCode {
    match run(&Args::parse()) {
        Ok(0) => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        Err(ProfilerError::Cuda(e @ cuda::CudaError::LibraryMissing(_))) => {
            eprintln!("causality: skipped: no GPU ({e})");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("causality: {e}");
            ExitCode::from(2)
        }
    }
}

/// Runs the check; returns the number of violations.
fn run(args: &Args) -> Result<u64, ProfilerError> {
    let collect = Collect::default();
    // INFO: whole batches to the sink, no plain span per device event.
    let subscriber = tracing_subscriber::registry()
        .with(LevelFilter::INFO)
        .with(SinkLayer::new(collect.clone()).expect("a sink slot"));
    tracing::subscriber::set_global_default(subscriber).expect("first subscriber");

    // At most 3 × 4 tiles + 1 events per warp.
    let profiler = Profiler::builder()
        .device(0)
        .events(EVENTS)
        .capacity(16)
        .calibration_rounds(Calibrator::INITIAL_ROUNDS, args.periodic_rounds)
        .calibration_pollers(args.pollers)
        .build()?;
    let kernel = Kernel::load(&profiler, true)?;
    let stream = profiler.context().default_stream();

    // Shapes and lengths cycle; so do idle gaps, so that launches land at
    // every distance from a clock checkpoint.
    let grids = [1u32, 16, 132];
    let blocks = [64u32, 256];
    let tiles = [1u32, 4];
    let works = [16u32, 512, 4096];
    let max_n = (132 * 256 * 4) as usize;
    let x = stream.clone_htod(&vec![0.5f32; max_n])?;
    let mut y = stream.alloc_zeros::<f32>(max_n)?;

    let mut after: Vec<u64> = Vec::with_capacity(args.launches);
    let t_start = std::time::Instant::now();
    for i in 0..args.launches {
        let (g, b, t, w) = (
            grids[i % 3],
            blocks[(i / 3) % 2],
            tiles[(i / 6) % 2],
            works[(i / 12) % 3],
        );
        let cfg = LaunchConfig {
            grid_dim: (g, 1, 1),
            block_dim: (b, 1, 1),
            shared_mem_bytes: b * 4,
        };
        let n = g * b * t;
        // SAFETY: x and y hold max_n ≥ n elements; 4 bytes of shared memory per thread.
        gpu_profile!(profiler, &stream, "tiled_poly", cfg, |trace| unsafe {
            kernel.launch(&stream, cfg, (&x, &mut y), [n, t, w], &trace)
        })?;
        stream.synchronize()?;
        after.push(HostClock::Boottime.now_ns());
        match i % 10 {
            0 => std::thread::sleep(Duration::from_millis(20)),
            1..=4 => std::thread::sleep(Duration::from_millis(1)),
            _ => {}
        }
    }
    let wall = t_start.elapsed();
    profiler.flush()?;
    let stats = profiler.stats();
    let calibration = profiler.calibration();
    drop(profiler);

    let seen = collect.0.lock();
    let mut violations = 0u64;
    let (mut start_margins, mut end_margins) = (Vec::new(), Vec::new());
    let mut events = 0u64;
    let mut missing = 0u64;
    // The error bound the mapping gives each launch's events: at the device
    // time of the launch's middle (found through the first checkpoint's
    // offset, which is microseconds exact: enough to pick the bound, a smooth
    // function of time).
    let offset = calibration.checkpoints()[0].map.offset_ns();
    let mut launch_bounds = Vec::new();
    for (i, launch) in seen.order.iter().enumerate() {
        let (Some(&t0), Some(&(first, last, n))) =
            (seen.host_launch_ns.get(launch), seen.extent.get(launch))
        else {
            missing += 1;
            continue;
        };
        let t1 = after[i];
        events += n;
        let mid_device = ((first / 2 + last / 2) as i64 - offset) as u64;
        launch_bounds.push(calibration.bound_ns(mid_device) as i64);
        // The extent's earliest start and latest end decide every event's fate.
        let (ms, me) = (first as i64 - t0 as i64, t1 as i64 - last as i64);
        if ms < 0 || me < 0 {
            violations += 1;
        }
        start_margins.push(ms);
        end_margins.push(me);
    }
    start_margins.sort_unstable();
    end_margins.sort_unstable();
    launch_bounds.sort_unstable();
    let median = |mut v: Vec<u64>| {
        v.sort_unstable();
        v.get(v.len() / 2).copied().unwrap_or(0)
    };
    let cps = calibration.checkpoints();
    let anchor_bound = median(cps.iter().map(|c| c.map.parts().bound_anchor_ns).collect());
    let window_bound = median(cps.iter().map(|c| c.map.bound_ns()).collect());

    let mut report = String::new();
    use std::fmt::Write;
    let _ = writeln!(
        report,
        "launches: {} in {:.1} s; events checked: {events}",
        seen.order.len(),
        wall.as_secs_f64()
    );
    let _ = writeln!(
        report,
        "profiler: delivered {} failed {} skipped {} dropped events {}; clock checkpoints {} (median bound at the anchor {anchor_bound} ns, over the sampling window {window_bound} ns)",
        stats.delivered, stats.failed, stats.skipped, stats.dropped_events, stats.calibrations
    );
    let _ = writeln!(
        report,
        "error bound of the mapping at each launch (ns): median {}, p99 {}, max {}",
        q(&launch_bounds, 0.5),
        q(&launch_bounds, 0.99),
        q(&launch_bounds, 1.0)
    );
    let _ = writeln!(
        report,
        "launches without events or launch time: {missing}; events with start > end: {}",
        seen.inverted
    );
    let _ = writeln!(report, "violations (launches with an event outside [launch call, after synchronize]): {violations}");
    let _ = writeln!(
        report,
        "\n| margin (ns) | min | p1 | p50 | p99 | max |\n|---|---:|---:|---:|---:|---:|"
    );
    for (name, m) in [
        ("launch call → first event start", &start_margins),
        ("last event end → after synchronize", &end_margins),
    ] {
        let _ = writeln!(
            report,
            "| {name} | {} | {} | {} | {} | {} |",
            q(m, 0.0),
            q(m, 0.01),
            q(m, 0.5),
            q(m, 0.99),
            q(m, 1.0)
        );
    }
    print!("{report}");
    if let Some(path) = &args.out {
        std::fs::write(path, &report)
            .map_err(|e| ProfilerError::Invalid(format!("{}: {e}", path.display())))?;
    }
    let bad = violations + missing + seen.inverted + stats.failed;
    Ok(bad)
}
