//! A real loop (issue #12): the GEMM of `kernels/gemm.cu` at a small size, launched
//! back to back, with and without profiling: how much slower the whole loop gets.
//!
//! ```text
//! cargo run --release -p tracing-gpu-bench --bin gemm_loop -- [--size 1024 1024 1024] \
//!     [--launches 200] [--rounds 10]
//! ```
//!
//! Three variants, on a stream of their own, in turn (rotated each round, after one
//! warm-up round): the GEMM built without the recorder (`off`), the per-k-tile build
//! launched with a null trace (`phases, null trace`: the recorder compiled in, off),
//! and the same through `gpu_profile!` with a `PerfettoLayer` as the subscriber
//! (`phases, gpu_profile!`). A round times `--launches` launch calls and the
//! synchronize after them (`Instant`); the table gives the median over rounds, per
//! launch, and each variant's slowdown against `off`. After `Profiler::flush`,
//! launches must equal delivered + skipped + failed.

use std::error::Error;
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use tracing_gpu::cuda::{gpu_profile, Profiler};
use tracing_gpu::format::KernelArg;
use tracing_gpu_bench::cli::{self, Size};
use tracing_gpu_bench::device;
use tracing_gpu_bench::gemm::{registry, Gemm, Out, Problem, Variant};
use tracing_gpu_bench::stats::median;
use tracing_gpu_bench::trace::PerfettoTrace;

/// The GEMM back to back, with and without profiling.
#[derive(Parser, Debug)]
#[command(name = "gemm_loop")]
struct Args {
    #[command(flatten)]
    size: Size,
    /// Launches per round.
    #[arg(long, default_value_t = 200, value_parser = cli::positive::<usize>)]
    launches: usize,
    /// Timed rounds (after one of warm-up).
    #[arg(long, default_value_t = 10, value_parser = cli::positive::<usize>)]
    rounds: usize,
}

fn main() -> ExitCode {
    cli::exit("gemm_loop", run(&Args::parse()))
}

const NAMES: [&str; 3] = ["off", "phases, null trace", "phases, gpu_profile!"];

fn run(a: &Args) -> Result<bool, Box<dyn Error>> {
    let trace = PerfettoTrace::new("gemm_loop")?;
    let _default = tracing::dispatcher::set_default(&trace.dispatch);
    let ctx = device::open(0)?;
    let stream = ctx.new_stream()?;
    let shape = a.size.shape();
    let off = Gemm::compile(&ctx, Variant::Off, Out::Bf16, true)?;
    let phases = Gemm::compile(&ctx, Variant::Phases, Out::Bf16, true)?;
    let mut p = Problem::new(&stream, shape, Out::Bf16, 0x100B)?;
    let cfg = phases.config(&p);
    let profiler = Profiler::builder()
        .context(ctx.clone())
        .registry(registry())
        .capacity(phases.capacity(&p))
        .build()?;
    let mut times: [Vec<f64>; 3] = Default::default();
    for round in 0..=a.rounds {
        let mut order = [0usize, 1, 2];
        order.rotate_left(round % 3);
        for v in order {
            let t = Instant::now();
            for _ in 0..a.launches {
                match v {
                    0 => off.launch(&stream, &mut p, None)?,
                    1 => phases.launch(&stream, &mut p, Some(&KernelArg::default()))?,
                    _ => gpu_profile!(profiler, &stream, "tgpu_gemm_bf16", cfg, |trace| phases
                        .launch(&stream, &mut p, Some(&trace)))?,
                }
            }
            stream.synchronize()?;
            if round > 0 {
                times[v].push(t.elapsed().as_secs_f64() * 1e6 / a.launches as f64);
            }
        }
    }
    profiler.flush()?;
    let stats = profiler.stats();
    drop(profiler);
    trace.finish()?;
    let us: Vec<f64> = times.iter_mut().map(|t| median(t)).collect();
    println!(
        "gemm_loop: {}×{}×{} bf16, {} launches back to back per round, median of {} rounds",
        shape.0, shape.1, shape.2, a.launches, a.rounds
    );
    println!("| variant | µs per launch (wall) | vs off |");
    println!("|---|---:|---:|");
    for (name, t) in NAMES.iter().zip(&us) {
        println!("| {name} | {t:.2} | {:+.2} % |", 100.0 * (t / us[0] - 1.0));
    }
    println!(
        "profiled: {:+.2} % against the null trace",
        100.0 * (us[2] / us[1] - 1.0)
    );
    let counted = stats.delivered + stats.skipped + stats.failed;
    let ok = stats.launches == counted;
    println!(
        "counts: launches {} = delivered {} + skipped {} + failed {}: {}; events {}, lost {}",
        stats.launches,
        stats.delivered,
        stats.skipped,
        stats.failed,
        if ok { "ok" } else { "MISMATCH" },
        stats.events,
        stats.events_lost
    );
    println!(
        r#"{{"bench":"gemm_loop","m":{},"n":{},"k":{},"launches":{},"rounds":{},"off_us":{:.3},"null_us":{:.3},"profiled_us":{:.3},"delivered":{},"skipped":{},"failed":{},"counts_ok":{ok}}}"#,
        shape.0,
        shape.1,
        shape.2,
        a.launches,
        a.rounds,
        us[0],
        us[1],
        us[2],
        stats.delivered,
        stats.skipped,
        stats.failed
    );
    Ok(ok)
}
