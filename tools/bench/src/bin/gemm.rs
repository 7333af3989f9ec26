//! The pipelined bf16 GEMM of `kernels/gemm.cu`, live on the GPU: checked against
//! cuBLAS on fresh random inputs, timed against cuBLAS, and with `--trace` profiled
//! through the real `Profiler`: host spans and every warp's k-tile phases in one
//! Perfetto trace, and with `--capture` a replayable capture file.
//!
//! ```text
//! cargo run --release -p tracing-gpu-bench --bin gemm -- [--size M N K] [--reps R]
//!     [--variants off,phases,phases-wg,full] [--f32] [--no-lineinfo]
//!     [--trace gemm.perfetto-trace [--capture gemm.tgpu] [--launches 4]]
//! ```
//!
//! Prints one line per check and a table of TFLOP/s (median of interleaved repeats,
//! CUDA events, after warm-up). Exits non-zero if any check fails.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Parser;
use tracing_gpu::cuda::{gpu_profile, CaptureRecorder, Profiler};
use tracing_gpu::perfetto::PerfettoLayer;
use tracing_gpu_bench::cli::{self, LineInfo, Size};
use tracing_gpu_bench::device;
use tracing_gpu_bench::gemm::{
    check, registry, time_interleaved, Gemm, Out, Problem, Reference, TraceBuffer, Variant,
};
use tracing_gpu_bench::stats::median;
use tracing_subscriber::layer::SubscriberExt;

/// The GEMM of kernels/gemm.cu: checked and timed against cuBLAS, and traced live.
#[derive(Parser, Debug)]
#[command(name = "gemm")]
struct Args {
    #[command(flatten)]
    size: Size,
    /// Timed rounds (after 3 of warm-up); the table gives medians.
    #[arg(long, default_value_t = 30)]
    reps: usize,
    /// The builds to check and time, by name.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "off,phases,phases-wg,full"
    )]
    variants: Vec<Variant>,
    /// Also profile the per-k-tile (phases) GEMM live through the Profiler, and write
    /// its Perfetto trace here.
    #[arg(long, value_name = "T.perfetto-trace")]
    trace: Option<PathBuf>,
    /// With --trace: also record the run into this capture file.
    #[arg(long, value_name = "C.tgpu")]
    capture: Option<PathBuf>,
    /// With --trace: the profiled launches.
    #[arg(long, default_value_t = 4)]
    launches: u32,
    /// C in fp32 rather than bf16.
    #[arg(long = "f32")]
    f32: bool,
    #[command(flatten)]
    lineinfo: LineInfo,
}

impl Args {
    fn out(&self) -> Out {
        if self.f32 {
            Out::F32
        } else {
            Out::Bf16
        }
    }
}

fn main() -> ExitCode {
    cli::exit("gemm", run(&Args::parse()))
}

fn run(args: &Args) -> Result<bool, Box<dyn std::error::Error>> {
    let (shape, out, lineinfo) = (args.size.shape(), args.out(), args.lineinfo.on());
    let ctx = device::open(0)?;
    let stream = ctx.default_stream();
    println!(
        "device: {} ({}), GEMM {}×{}×{}, C {out:?}",
        ctx.name()?,
        device::arch(&ctx)?,
        shape.0,
        shape.1,
        shape.2,
    );
    let reference = Reference::new(&stream)?;
    let gemms: Vec<Gemm> = args
        .variants
        .iter()
        .map(|&v| Gemm::compile(&ctx, v, out, lineinfo))
        .collect::<Result<_, _>>()?;

    // Correctness: fresh random inputs for every check, the full shape twice and two
    // odd shapes (several tiles per block, a partial last wave).
    let mut ok = true;
    let shapes = [shape, shape, (384, 768, 320), (1280, 2560, 1088)];
    for (i, &shape) in shapes.iter().enumerate() {
        let mut p = Problem::new(&stream, shape, out, 0x5EED + i as u64)?;
        let ref_values = reference.values(&p)?;
        for g in &gemms {
            let trace = TraceBuffer::of(&stream, g, &p)?;
            let result = check(g, &ref_values, &stream, &mut p, trace.as_ref());
            let label = format!(
                "check {}×{}×{} {:<16}",
                shape.0,
                shape.1,
                shape.2,
                g.variant.name()
            );
            match result {
                Ok(c) => {
                    let pass = c.pass();
                    ok &= pass;
                    let records = match c.recorded {
                        Some(r) => format!(", {r} records of {} expected", c.want),
                        None => String::new(),
                    };
                    println!(
                        "{label} rel err {:.3e}{records} {}",
                        c.err,
                        if pass { "ok" } else { "FAIL" }
                    );
                }
                Err(e) => {
                    ok = false;
                    println!("{label} FAIL: {e}");
                }
            }
        }
    }

    // Speed: every variant and cuBLAS (same output type), interleaved, after warm-up.
    let mut p = Problem::new(&stream, shape, out, 0xBE7C)?;
    let mut c_blas = reference.output(&p, out)?;
    let mut traces = TraceBuffer::all(&stream, &gemms, &p)?;
    let mut times = time_interleaved(
        &ctx,
        &stream,
        &gemms,
        &mut traces,
        &mut p,
        |p| reference.gemm(p, &mut c_blas, out),
        (3, args.reps.max(1)),
    )?;
    let flops = p.flops();
    let blas_ms = median(&mut times[gemms.len()].clone());
    println!(
        "\n{:<18} {:>10} {:>9} {:>9}",
        "kernel", "median ms", "TFLOP/s", "% cuBLAS"
    );
    for (i, g) in gemms.iter().enumerate() {
        let ms = median(&mut times[i]);
        println!(
            "{:<18} {:>10.4} {:>9.1} {:>8.1}%",
            g.variant.name(),
            ms,
            flops / ms / 1e9,
            100.0 * blas_ms / ms
        );
    }
    println!(
        "{:<18} {:>10.4} {:>9.1} {:>8.1}%",
        "cuBLAS",
        blas_ms,
        flops / blas_ms / 1e9,
        100.0
    );

    if let Some(trace) = &args.trace {
        profiled(args, trace)?;
    }
    Ok(ok)
}

/// The live trace: `args.launches` launches of the per-k-tile (phases) GEMM through
/// the real `Profiler` and `gpu_profile!`, host spans around them, one Perfetto trace
/// at `out`, and with `--capture` the whole run as a replayable capture file.
fn profiled(args: &Args, out: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let (perfetto, guard) = PerfettoLayer::builder()
        .file(out)
        .process_name("gemm")
        .build()?;
    let recorder = args.capture.as_deref().map(CaptureRecorder::new);
    let subscriber = tracing_subscriber::registry()
        .with(perfetto)
        .with(recorder.as_ref().map(|r| r.layer()));
    let stats = tracing::subscriber::with_default(
        subscriber,
        || -> Result<_, Box<dyn std::error::Error>> {
            let _run = tracing::info_span!("gemm_run").entered();
            let ctx = device::open(0)?;
            let stream = ctx.default_stream();
            let (shape, lineinfo) = (args.size.shape(), args.lineinfo.on());
            let g = tracing::info_span!("compile")
                .in_scope(|| Gemm::compile(&ctx, Variant::Phases, args.out(), lineinfo))?;
            let mut p = tracing::info_span!("upload")
                .in_scope(|| Problem::new(&stream, shape, args.out(), 0x7ACE))?;
            let cfg = g.config(&p);
            let profiler = {
                let _s = tracing::info_span!("profiler_setup").entered();
                let mut b = Profiler::builder()
                    .context(ctx.clone())
                    .registry(registry())
                    .capacity(g.capacity(&p))
                    .lineinfo(lineinfo);
                if let Some(r) = &recorder {
                    b = b.recorder(r.clone());
                }
                b.build()?
            };
            for step in 0..args.launches.max(1) {
                let _s = tracing::info_span!("step", step).entered();
                gpu_profile!(profiler, &stream, "tgpu_gemm_bf16", cfg, |trace| g.launch(
                    &stream,
                    &mut p,
                    Some(&trace)
                ))?;
                tracing::info_span!("synchronize").in_scope(|| stream.synchronize())?;
            }
            profiler.flush()?;
            Ok(profiler.stats())
            // Dropping the profiler writes the capture file.
        },
    )?;
    let written = guard.finish()?;
    println!(
        "\ntrace {}: {} launches, {} device events ({} lost), {} bytes{}",
        out.display(),
        stats.delivered,
        stats.events,
        stats.events_lost,
        written.bytes,
        args.capture
            .as_deref()
            .map(|c| format!("; capture {}", c.display()))
            .unwrap_or_default()
    );
    Ok(())
}
