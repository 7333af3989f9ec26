//! What `gpu_profile!` costs the launching thread: the host time of a launch
//! call with and without it, for the same kernel (`kernels/examples/quickstart.cu`,
//! one block, built with the recorder on; the plain launch passes a null trace).
//!
//! ```text
//! cargo run --release --features cuda --example profile_overhead -- [--rounds 30] [--launches 200] [--reserve 0] \
//!     [--subscriber perfetto|registry|none] [--stream default|new]
//! ```
//!
//! Each round times `--launches` back-to-back launch calls of each variant (in
//! alternating order), then synchronizes; the figures are medians over rounds of
//! the mean time per call. The subscriber is a `PerfettoLayer` writing to a
//! temporary file, so the launch span is really recorded. The profiled variant
//! also counts how many launches the pool had to skip (none expected).
//! `--reserve N` allocates N trace buffers before the loop (`Profiler::reserve`);
//! without it, a loop that outruns the collector grows the pool from the
//! launching thread, and those allocations are part of the time measured.
//! `--subscriber` picks what receives the spans and batches (default: the
//! Perfetto layer; `registry`: a bare registry; `none`: no subscriber at all),
//! and `--stream` the stream launched on (default: the legacy default stream;
//! `new`: a stream of its own), to tell the launch path apart from what the
//! sinks and the stream cost.

use std::process::ExitCode;
use std::time::Instant;

use tracing_gpu::cuda::cudarc::driver::{LaunchConfig, PushKernelArg};
use tracing_gpu::cuda::{self, gpu_profile, KernelBuild, Profiler, ProfilerError};
use tracing_gpu::format::KernelArg;
use tracing_gpu::perfetto::PerfettoLayer;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::EnvFilter;

const SOURCE: &str = include_str!("../../../../kernels/examples/quickstart.cu");

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// What the run measures.
struct Args {
    rounds: usize,
    launches: usize,
    reserve: usize,
    subscriber: String,
    own_stream: bool,
}

fn main() -> ExitCode {
    let mut a = Args {
        rounds: 30,
        launches: 200,
        reserve: 0,
        subscriber: "perfetto".into(),
        own_stream: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let v = args.next().unwrap_or_default();
        let n = v.parse::<usize>().ok();
        match (flag.as_str(), v.as_str(), n) {
            ("--rounds", _, Some(n)) if n > 0 => a.rounds = n,
            ("--launches", _, Some(n)) if n > 0 => a.launches = n,
            ("--reserve", _, Some(n)) => a.reserve = n,
            ("--subscriber", "perfetto" | "registry" | "none", _) => a.subscriber = v,
            ("--stream", "default" | "new", _) => a.own_stream = v == "new",
            _ => {
                eprintln!("usage: profile_overhead [--rounds N] [--launches N] [--reserve N] [--subscriber perfetto|registry|none] [--stream default|new]");
                return ExitCode::from(2);
            }
        }
    }
    match run(&a) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("profile_overhead: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(a: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let (rounds, launches, reserve) = (a.rounds, a.launches, a.reserve);
    let dir = std::env::temp_dir().join(format!("tgpu-overhead-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    // Device events go to the Perfetto layer in bulk; no plain spans (see tracing_gpu::bridge).
    let filter = || EnvFilter::new("trace,tracing_gpu::device=off");
    let (dispatch, guard) = match a.subscriber.as_str() {
        "perfetto" => {
            let (layer, guard) = PerfettoLayer::builder()
                .file(dir.join("overhead.perfetto-trace"))
                .build()?;
            let s = tracing_subscriber::registry().with(filter()).with(layer);
            (tracing::Dispatch::new(s), Some(guard))
        }
        "registry" => (
            tracing::Dispatch::new(tracing_subscriber::registry().with(filter())),
            None,
        ),
        _ => (tracing::Dispatch::none(), None),
    };
    let _default = tracing::dispatcher::set_default(&dispatch);

    let profiler = Profiler::builder()
        .device(0)
        .events([(1, "load"), (2, "compute"), (3, "store"), (4, "done")])
        .build()?;
    let ctx = profiler.context().clone();
    let ptx = cuda::compile(
        SOURCE,
        &KernelBuild::new("quickstart.cu", profiler.arch()).define("TGPU_ENABLED=1"),
    )?;
    let kernel = ctx.load_module(ptx)?.load_function("tiled_poly")?;
    let stream = if a.own_stream {
        ctx.new_stream()?
    } else {
        ctx.default_stream()
    };
    let (n, tiles, work) = (256u32, 1u32, 16u32);
    let x = stream.clone_htod(&vec![0.5f32; n as usize])?;
    let mut y = stream.alloc_zeros::<f32>(n as usize)?;
    let cfg = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 1024,
    };
    // Buffers allocated up front (Profiler::reserve) rather than by the loop.
    let reserved = profiler.reserve(&cfg, reserve)?;

    let mut per_call = [Vec::new(), Vec::new()];
    // One warm-up round, not counted (first buffer allocation, module load).
    for round in 0..=rounds {
        for k in 0..2 {
            let profiled = (k + round) % 2 == 1;
            let t = Instant::now();
            for _ in 0..launches {
                if profiled {
                    gpu_profile!(profiler, &stream, "tiled_poly", cfg, |trace| unsafe {
                        stream
                            .launch_builder(&kernel)
                            .arg(&x)
                            .arg(&mut y)
                            .arg(&n)
                            .arg(&tiles)
                            .arg(&work)
                            .arg(&trace)
                            .launch(cfg)
                    })?;
                } else {
                    let off = KernelArg::default();
                    unsafe {
                        stream
                            .launch_builder(&kernel)
                            .arg(&x)
                            .arg(&mut y)
                            .arg(&n)
                            .arg(&tiles)
                            .arg(&work)
                            .arg(&off)
                            .launch(cfg)
                    }
                    .map_err(ProfilerError::from)?;
                }
            }
            let dt = t.elapsed().as_secs_f64() * 1e6 / launches as f64;
            stream.synchronize()?;
            if round > 0 {
                per_call[profiled as usize].push(dt);
            }
        }
    }
    profiler.flush()?;
    let stats = profiler.stats();
    drop(profiler);
    if let Some(guard) = guard {
        guard.finish()?;
    }
    let _ = std::fs::remove_dir_all(&dir);

    let plain = median(&mut per_call[0]);
    let profiled = median(&mut per_call[1]);
    println!(
        "subscriber {}, {} stream",
        a.subscriber,
        if a.own_stream { "own" } else { "default" }
    );
    println!("| launch call | µs per call (median of {rounds} rounds × {launches}) |");
    println!("|---|---:|");
    println!("| plain | {plain:.2} |");
    println!("| gpu_profile! | {profiled:.2} |");
    println!("| added by profiling | {:.2} |", profiled - plain);
    println!(
        "profiled launches: {} delivered, {} skipped (pool full), {} failed, {} device events; {reserved} buffers reserved; pool {:.1} MB at the end",
        stats.delivered, stats.skipped, stats.failed, stats.events, stats.pool_bytes as f64 / 1e6
    );
    Ok(())
}
