//! What `gpu_profile!` costs the launching thread: the host time of a launch call with
//! and without it, for the quickstart's kernel (`kernels/examples/quickstart.cu`, one
//! block) in three variants: *off*, built without the recorder (the gate off: the
//! kernel a user ships, the baseline); *null trace*, built with it and given a null
//! trace; *gpu_profile!*, that build profiled. The added time is printed against off
//! and, on a row of its own, against the null trace.
//!
//! ```text
//! cargo run --release -p tracing-gpu-bench --bin profile_overhead -- [--rounds 30] [--launches 200] \
//!     [--subscriber perfetto|registry|none] [--stream legacy|own]
//! ```
//!
//! Each round times `--launches` back-to-back launch calls of each variant (the order
//! rotated each round), each variant's followed by a synchronize; the figures are medians over rounds of
//! the mean time per call. The subscriber is a `PerfettoLayer` writing to a
//! temporary file, so the launch span is really recorded. The profiled variant
//! also counts how many launches found the arena full and ran unrecorded
//! (skipped; none expected), and says how much memory the profiler holds.
//! `--subscriber` picks what receives the spans and batches (default: the
//! Perfetto layer; `registry`: a bare registry; `none`: no subscriber at all),
//! and `--stream` the stream launched on (default: the legacy default stream;
//! `own`: a stream of its own), to tell the launch path apart from what the
//! sinks and the stream cost. `storm` measures the same at 100,000 launches.

use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, ValueEnum};
use tracing_gpu::cuda::cudarc::driver::LaunchConfig;
use tracing_gpu::cuda::{gpu_profile, Profiler};
use tracing_gpu::format::KernelArg;
use tracing_gpu_bench::cli::{self, StreamKind};
use tracing_gpu_bench::quickstart::{self, Kernel};
use tracing_gpu_bench::quickstart_off;
use tracing_gpu_bench::stats::upper_median;
use tracing_gpu_bench::trace::{self, PerfettoTrace};
use tracing_subscriber::layer::SubscriberExt;

/// What receives the spans and batches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Subscriber {
    /// A `PerfettoLayer` writing to a temporary file.
    Perfetto,
    /// A bare registry.
    Registry,
    /// No subscriber at all.
    None,
}

/// What `gpu_profile!` costs the launching thread.
#[derive(Parser, Debug)]
#[command(name = "profile_overhead")]
struct Args {
    /// Timed rounds (after one of warm-up); the figures are medians over rounds.
    #[arg(long, default_value_t = 30, value_parser = cli::positive::<usize>)]
    rounds: usize,
    /// Back-to-back launch calls of each variant per round.
    #[arg(long, default_value_t = 200, value_parser = cli::positive::<usize>)]
    launches: usize,
    /// What receives the spans and batches.
    #[arg(long, value_enum, default_value_t = Subscriber::Perfetto)]
    subscriber: Subscriber,
    /// The stream launched on.
    #[arg(long, value_enum, default_value_t = StreamKind::Legacy)]
    stream: StreamKind,
}

fn main() -> ExitCode {
    cli::exit("profile_overhead", run(&Args::parse()).map(|()| true))
}

fn run(a: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let (rounds, launches) = (a.rounds, a.launches);
    let (dispatch, perfetto) = match a.subscriber {
        Subscriber::Perfetto => {
            let t = PerfettoTrace::new("overhead")?;
            (t.dispatch.clone(), Some(t))
        }
        Subscriber::Registry => (
            tracing::Dispatch::new(tracing_subscriber::registry().with(trace::filter())),
            None,
        ),
        Subscriber::None => (tracing::Dispatch::none(), None),
    };
    let _default = tracing::dispatcher::set_default(&dispatch);

    let profiler = Profiler::builder()
        .device(0)
        .events(quickstart::EVENTS)
        .build()?;
    let kernel = Kernel::load(&profiler, true)?;
    let off = quickstart_off::Kernel::load(&profiler)?;
    let ctx = profiler.context();
    let stream = a.stream.open(ctx)?;
    let (n, tiles, work) = (256u32, 1u32, 16u32);
    let x = stream.clone_htod(&vec![0.5f32; n as usize])?;
    let mut y = stream.alloc_zeros::<f32>(n as usize)?;
    let cfg = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 1024,
    };
    // Per variant (off, null trace, profiled): the mean µs per call of each round.
    let mut per_call: [Vec<f64>; 3] = Default::default();
    // One warm-up round, not counted (module load, first launches).
    for round in 0..=rounds {
        for k in 0..3 {
            let v = (k + round) % 3;
            let t = Instant::now();
            for _ in 0..launches {
                // SAFETY: x and y hold n elements; 4 bytes of shared memory per thread.
                let mut launch = |trace: &KernelArg| unsafe {
                    kernel.launch(&stream, cfg, (&x, &mut y), [n, tiles, work], trace)
                };
                match v {
                    // SAFETY: as `launch`.
                    0 => unsafe { off.launch(&stream, cfg, (&x, &mut y), [n, tiles, work])? },
                    // A null trace: the recorder records nothing.
                    1 => launch(&KernelArg::default())?,
                    _ => {
                        gpu_profile!(profiler, &stream, "tiled_poly", cfg, |trace| launch(&trace))?
                    }
                }
            }
            let dt = t.elapsed().as_secs_f64() * 1e6 / launches as f64;
            stream.synchronize()?;
            if round > 0 {
                per_call[v].push(dt);
            }
        }
    }
    profiler.flush()?;
    let stats = profiler.stats();
    drop(profiler);
    if let Some(t) = perfetto {
        t.finish()?;
    }

    let [off, null, profiled] = per_call.map(|mut v| upper_median(&mut v));
    println!(
        "subscriber {}, {} stream",
        a.subscriber
            .to_possible_value()
            .expect("not skipped")
            .get_name(),
        a.stream.name()
    );
    println!("| launch call | µs per call (median of {rounds} rounds × {launches}) |");
    println!("|---|---:|");
    println!("| off (gate off) | {off:.2} |");
    println!("| null trace | {null:.2} |");
    println!("| gpu_profile! | {profiled:.2} |");
    println!(
        "| **added: gpu_profile! vs off** | {:+.2} |",
        profiled - off
    );
    println!("| added: null trace vs off | {:+.2} |", null - off);
    println!(
        "| added: gpu_profile! vs null trace | {:+.2} |",
        profiled - null
    );
    println!(
        "profiled launches: {} made, {} delivered, {} skipped (arena full), {} failed, {} device events; \
         profiler memory {:.1} MB, arena in use at the end {:.1} MB",
        stats.launches,
        stats.delivered,
        stats.skipped,
        stats.failed,
        stats.events,
        stats.memory_bytes as f64 / 1e6,
        stats.arena_in_use as f64 / 1e6
    );
    Ok(())
}
