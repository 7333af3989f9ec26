//! A kernel from a user's own folder, compiled and profiled the way the README shows:
//! its source read from a file anywhere, compiled through `tracing_gpu::cuda::compile`
//! with the recorder's header, launched through `gpu_profile!`. `scripts/ncu-check.sh`
//! runs it under Nsight Compute to check that the SASS maps to both the user's file and
//! `tracing_gpu.cuh`.
//!
//! ```text
//! cargo run --release -p tracing-gpu-bench --bin user_kernel -- DIR/scale.cu
//!     [--kernel scale] [--launches 2] [--no-lineinfo]
//! ```
//!
//! The kernel's signature is the README's `scale`:
//! `(float* x, float a, unsigned n TGPU_TRACE_PARAM)`. Line info names the program by
//! the file's name alone, as the README's `KernelBuild::new("scale.cu", ..)` does, so
//! Nsight Compute needs the folder (`scripts/ncu.sh -S DIR`).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use tracing_gpu::cuda::cudarc::driver::{LaunchConfig, PushKernelArg};
use tracing_gpu::cuda::{compile, gpu_profile, KernelBuild, Profiler};
use tracing_gpu_bench::cli::{self, LineInfo};

/// Compiles a user's kernel file with the recorder on and profiles a few launches.
#[derive(Parser, Debug)]
#[command(name = "user_kernel")]
struct Args {
    /// The kernel's source file.
    source: PathBuf,
    /// The kernel's name in the source.
    #[arg(long, default_value = "scale")]
    kernel: String,
    /// Profiled launches.
    #[arg(long, default_value_t = 2, value_parser = cli::positive::<u32>)]
    launches: u32,
    #[command(flatten)]
    lineinfo: LineInfo,
}

fn run(args: &Args) -> Result<bool, Box<dyn std::error::Error>> {
    let source = std::fs::read_to_string(&args.source)
        .map_err(|e| format!("cannot read {}: {e}", args.source.display()))?;
    let name = args
        .source
        .file_name()
        .ok_or("the source path names no file")?
        .to_string_lossy()
        .into_owned();
    let profiler = Profiler::builder()
        .device(0)
        .events([(1, "scale")])
        // One range per warp: 2 entries. The default capacity (256) would ask for
        // 136 MB of arena for this grid of 32,768 warps.
        .capacity(16)
        .lineinfo(args.lineinfo.on())
        .build()?;
    let ctx = profiler.context().clone();
    let build = KernelBuild::new(name, profiler.arch())
        .define("TGPU_ENABLED=1")
        .lineinfo(args.lineinfo.on());
    let kernel = ctx
        .load_module(compile(&source, &build)?)?
        .load_function(&args.kernel)?;
    let stream = ctx.new_stream()?;
    let n = 1u32 << 20;
    let mut x = stream.clone_htod(&vec![1.0f32; n as usize])?;
    let cfg = LaunchConfig::for_num_elems(n);
    for _ in 0..args.launches {
        // SAFETY: x holds n floats; the signature is the README's `scale`.
        gpu_profile!(profiler, &stream, "scale", cfg, |trace| unsafe {
            stream
                .launch_builder(&kernel)
                .arg(&mut x)
                .arg(&2.0f32)
                .arg(&n)
                .arg(&trace)
                .launch(cfg)
        })?;
    }
    profiler.flush()?;
    let stats = profiler.stats();
    println!(
        "{}: {} launches, {} device events",
        args.source.display(),
        stats.delivered,
        stats.events
    );
    Ok(stats.delivered == u64::from(args.launches))
}

fn main() -> ExitCode {
    let args = Args::parse();
    cli::exit("user_kernel", run(&args))
}
