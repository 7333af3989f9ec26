//! Causality check of the live path: every device event, mapped to the host's
//! trace clock, must fall between the host time read just before its launch call
//! and the host time read just after the `synchronize` that waited for it.
//!
//! ```text
//! cargo run --release -p tracing-gpu-bench --bin causality -- [--launches 1000] [--out summary.md] \
//!     [--periodic-rounds 128] [--pollers 1] [--graph] [--replays 1000] [--stream legacy|own]
//! ```
//!
//! It makes `--launches` profiled launches of a small instrumented kernel
//! (`kernels/examples/quickstart.cu`) of varied shapes and lengths, with varied
//! idle gaps between them (so the clock mapping is exercised across
//! recalibrations), each followed by a `synchronize`. The device events reach it
//! the way they reach any sink: whole batches, to a `BatchSink` of its own in
//! the subscriber (see `tracing_gpu::deliver`), every event mapped with
//! `Batch::trace_ns`, the mapping every output uses. The launch time is the one
//! the profiler read just before the launch call (`LaunchInfo::host_launch_ns`).
//!
//! With `--graph`, it then does the same for `--replays` replays of a CUDA
//! graph (`Profiler::launch_graph`) whose 36 profiled kernel nodes take the
//! shapes and lengths of the direct launches' cycle, each replay followed by a
//! `synchronize` and the same idle gaps: every node's events must fall between
//! the replay call and the synchronize after it.
//!
//! A batch's window ends at the first synchronize after its launch time, so a
//! launch skipped for want of room (counted) shifts nothing.
//!
//! It prints the number of violations and the distribution of the margins
//! (how far inside its window each launch's earliest and latest event fell),
//! and exits non-zero on any violation. Without a GPU it says so and exits 2.

use std::fmt::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use parking_lot::Mutex;
use tracing_gpu::batch::{Batch, BatchSink};
use tracing_gpu::clock::{Calibration, HostClock};
use tracing_gpu::cuda::calibrate::Calibrator;
use tracing_gpu::cuda::cudarc::driver::{sys, LaunchConfig};
use tracing_gpu::cuda::{self, gpu_profile, Profiler, ProfilerError};
use tracing_gpu::deliver::SinkLayer;
use tracing_gpu_bench::cli::StreamKind;
use tracing_gpu_bench::quickstart::{Kernel, EVENTS};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::SubscriberExt;

/// What the sink learns of one batch: the launch time, and the device events'
/// extent (earliest start, latest end, count), if it has events.
struct Seen {
    host_launch_ns: u64,
    extent: Option<(u64, u64, u64)>,
}

#[derive(Clone, Default)]
struct Collect(Arc<Mutex<(Vec<Seen>, u64)>>);

impl BatchSink for Collect {
    fn on_batch(&self, batch: &Arc<Batch>) {
        let (mut first, mut last, mut n, mut inverted) = (u64::MAX, 0, 0, 0);
        for slot in batch.buffer.view().slots() {
            for ev in slot.events() {
                let (s, e) = (batch.trace_ns(ev.start_ns), batch.trace_ns(ev.end_ns));
                inverted += u64::from(s > e);
                (first, last, n) = (first.min(s), last.max(e), n + 1);
            }
        }
        let mut seen = self.0.lock();
        seen.0.push(Seen {
            host_launch_ns: batch.launch.host_launch_ns,
            extent: (n > 0).then_some((first, last, n)),
        });
        // Events whose own start > end (never expected).
        seen.1 += inverted;
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
    /// Then check replays of a CUDA graph of profiled kernels.
    #[arg(long)]
    graph: bool,
    /// Graph replays (with `--graph`), each followed by a synchronize.
    #[arg(long, default_value_t = 1000)]
    replays: usize,
    /// The stream of the direct launches (graphs are captured on one of their own).
    #[arg(long, value_enum, default_value_t = StreamKind::Legacy)]
    stream: StreamKind,
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

/// The largest launch of the cycle: 132 blocks of 256 threads, 4 tiles.
const MAX_N: usize = 132 * 256 * 4;
/// The cycle of shapes and lengths: grids, blocks, tiles and works vary.
const CYCLE: usize = 36;

/// Launch `i`'s shape, and its `[n, tiles, work]`.
fn shape(i: usize) -> (LaunchConfig, [u32; 3]) {
    let (g, b, t, w) = (
        [1u32, 16, 132][i % 3],
        [64u32, 256][(i / 3) % 2],
        [1u32, 4][(i / 6) % 2],
        [16u32, 512, 4096][(i / 12) % 3],
    );
    let cfg = LaunchConfig {
        grid_dim: (g, 1, 1),
        block_dim: (b, 1, 1),
        shared_mem_bytes: b * 4,
    };
    (cfg, [g * b * t, t, w])
}

/// Runs `count` steps (each a launch or a replay, then a synchronize), with
/// idle gaps that cycle, so that launches land at every distance from a clock
/// checkpoint; returns the host time after each step.
fn steps(
    count: usize,
    mut step: impl FnMut(usize) -> Result<(), ProfilerError>,
) -> Result<Vec<u64>, ProfilerError> {
    let mut after = Vec::with_capacity(count);
    for i in 0..count {
        step(i)?;
        after.push(HostClock::Boottime.now_ns());
        match i % 10 {
            0 => std::thread::sleep(Duration::from_millis(20)),
            1..=4 => std::thread::sleep(Duration::from_millis(1)),
            _ => {}
        }
    }
    Ok(after)
}

/// One phase's outcome.
#[derive(Default)]
struct Check {
    batches: usize,
    events: u64,
    /// Batches without events, or without a launch time or a synchronize after it.
    missing: u64,
    violations: u64,
    start_margins: Vec<i64>,
    end_margins: Vec<i64>,
    bounds: Vec<i64>,
}

/// Checks each batch against its window: its launch time, and the first host
/// time after a synchronize that follows it (`after` is ascending).
fn check(seen: &[Seen], after: &[u64], calibration: &Calibration) -> Check {
    let mut c = Check {
        batches: seen.len(),
        ..Default::default()
    };
    // The error bound the mapping gives each launch's events: at the device
    // time of the launch's middle (found through the first checkpoint's
    // offset, which is microseconds exact: enough to pick the bound, a smooth
    // function of time).
    let offset = calibration.checkpoints()[0].map.offset_ns();
    for b in seen {
        let t0 = b.host_launch_ns;
        let t1 = after.get(after.partition_point(|&a| a < t0)).copied();
        let (Some((first, last, n)), Some(t1), true) = (b.extent, t1, t0 != 0) else {
            c.missing += 1;
            continue;
        };
        c.events += n;
        let mid_device = ((first / 2 + last / 2) as i64 - offset) as u64;
        c.bounds.push(calibration.bound_ns(mid_device) as i64);
        // The extent's earliest start and latest end decide every event's fate.
        let (ms, me) = (first as i64 - t0 as i64, t1 as i64 - last as i64);
        if ms < 0 || me < 0 {
            c.violations += 1;
        }
        c.start_margins.push(ms);
        c.end_margins.push(me);
    }
    for v in [&mut c.start_margins, &mut c.end_margins, &mut c.bounds] {
        v.sort_unstable();
    }
    c
}

impl Check {
    fn report(&self, out: &mut String, what: &str, wall: Duration) {
        let _ = writeln!(
            out,
            "{what}: {} batches in {:.1} s; events checked: {}",
            self.batches,
            wall.as_secs_f64(),
            self.events
        );
        let _ = writeln!(
            out,
            "error bound of the mapping at each launch (ns): median {}, p99 {}, max {}",
            q(&self.bounds, 0.5),
            q(&self.bounds, 0.99),
            q(&self.bounds, 1.0)
        );
        let _ = writeln!(
            out,
            "launches without events or launch time: {}",
            self.missing
        );
        let _ = writeln!(
            out,
            "violations (launches with an event outside [launch call, after synchronize]): {}",
            self.violations
        );
        let _ = writeln!(
            out,
            "\n| margin (ns) | min | p1 | p50 | p99 | max |\n|---|---:|---:|---:|---:|---:|"
        );
        for (name, m) in [
            ("launch call → first event start", &self.start_margins),
            ("last event end → after synchronize", &self.end_margins),
        ] {
            let _ = writeln!(
                out,
                "| {name} | {} | {} | {} | {} | {} |",
                q(m, 0.0),
                q(m, 0.01),
                q(m, 0.5),
                q(m, 0.99),
                q(m, 1.0)
            );
        }
    }
}

/// Runs the check; returns the number of violations and losses.
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
    let ctx = profiler.context().clone();
    let stream = args.stream.open(&ctx)?;
    let x = stream.clone_htod(&vec![0.5f32; MAX_N])?;
    let mut y = stream.alloc_zeros::<f32>(MAX_N)?;
    let batches = || std::mem::take(&mut collect.0.lock().0);

    let t_start = Instant::now();
    let after = steps(args.launches, |i| {
        let (cfg, a) = shape(i);
        // SAFETY: x and y hold MAX_N ≥ n elements; 4 bytes of shared memory per thread.
        gpu_profile!(profiler, &stream, "tiled_poly", cfg, |trace| unsafe {
            kernel.launch(&stream, cfg, (&x, &mut y), a, &trace)
        })?;
        Ok(stream.synchronize()?)
    })?;
    let direct_wall = t_start.elapsed();
    profiler.flush()?;
    let direct = check(&batches(), &after, &profiler.calibration());

    let mut graph = None;
    if args.graph {
        // A capture needs a stream of its own; the graph's buffers live there.
        let gs = ctx.new_stream()?;
        let gx = gs.clone_htod(&vec![0.5f32; MAX_N])?;
        let mut gy = gs.alloc_zeros::<f32>(MAX_N)?;
        gs.synchronize()?;
        // SAFETY: gx and gy are used on `gs` alone, x and y no more; all are freed
        // after the last synchronize. (Tracking would put event nodes in the graph.)
        unsafe { ctx.disable_event_tracking() };
        gs.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL)?;
        let captured = (0..CYCLE).try_for_each(|i| {
            let (cfg, a) = shape(i);
            // SAFETY: as above, with gx and gy.
            gpu_profile!(profiler, &gs, "tiled_poly", cfg, |trace| unsafe {
                kernel.launch(&gs, cfg, (&gx, &mut gy), a, &trace)
            })
        });
        let ended = gs.end_capture(sys::CUgraphInstantiate_flags(0));
        captured?;
        let g = ended?.ok_or_else(|| ProfilerError::Invalid("the capture made no graph".into()))?;
        let g = profiler.graph(g)?;
        let t_start = Instant::now();
        let after = steps(args.replays, |_| {
            profiler.launch_graph(&g, &gs, "causality")?;
            Ok(gs.synchronize()?)
        })?;
        let wall = t_start.elapsed();
        profiler.flush()?;
        graph = Some((check(&batches(), &after, &profiler.calibration()), wall));
    }
    let stats = profiler.stats();
    let calibration = profiler.calibration();
    drop(profiler);

    let median = |mut v: Vec<u64>| {
        v.sort_unstable();
        v.get(v.len() / 2).copied().unwrap_or(0)
    };
    let cps = calibration.checkpoints();
    let anchor_bound = median(cps.iter().map(|c| c.map.parts().bound_anchor_ns).collect());
    let window_bound = median(cps.iter().map(|c| c.map.bound_ns()).collect());
    let inverted = collect.0.lock().1;
    let counted = stats.delivered + stats.skipped + stats.failed == stats.launches;

    let mut report = String::new();
    let _ = writeln!(
        report,
        "profiler: launches {} (replays {}) = delivered {} + skipped {} + failed {}: {}; events lost {}; \
         clock checkpoints {} (median bound at the anchor {anchor_bound} ns, over the sampling window {window_bound} ns)",
        stats.launches,
        stats.replays,
        stats.delivered,
        stats.skipped,
        stats.failed,
        if counted { "ok" } else { "MISMATCH" },
        stats.events_lost,
        stats.calibrations
    );
    let _ = writeln!(report, "events with start > end: {inverted}");
    direct.report(&mut report, "direct launches", direct_wall);
    let mut bad = direct.violations + direct.missing;
    if let Some((g, wall)) = &graph {
        let _ = writeln!(report);
        g.report(
            &mut report,
            &format!("graph replays ({} × {CYCLE} nodes)", args.replays),
            *wall,
        );
        bad += g.violations + g.missing;
    }
    print!("{report}");
    if let Some(path) = &args.out {
        std::fs::write(path, &report)
            .map_err(|e| ProfilerError::Invalid(format!("{}: {e}", path.display())))?;
    }
    Ok(bad + inverted + stats.failed + u64::from(!counted))
}
