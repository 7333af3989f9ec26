//! The pipelined bf16 GEMM of `kernels/gemm.cu`, live on the GPU: checked against
//! cuBLAS on fresh random inputs, timed against cuBLAS, and with `--trace` profiled
//! through the real `Profiler`: host spans and every warp's k-tile phases in one
//! Perfetto trace, and with `--capture` a replayable capture file.
//!
//! ```text
//! cargo run --release --features cuda --example gemm -- [--size M N K] [--reps R]
//!     [--variants off,phases,phases-wg,full] [--f32] [--no-lineinfo]
//!     [--trace gemm.perfetto-trace [--capture gemm.tgpu] [--launches 4]]
//! ```
//!
//! Prints one line per check and a table of TFLOP/s (median of interleaved repeats,
//! CUDA events, after warm-up). Exits non-zero if any check fails.


use std::process::ExitCode;

use tracing_gpu_bench::gemm::{
    check, median, registry, time_interleaved, Gemm, Out, Problem, Reference, TraceBuffer, Variant,
};
use tracing_gpu::cuda::cudarc::driver::CudaContext;
use tracing_gpu::cuda::{ensure_libraries, gpu_profile, DumpRecorder, Profiler};
use tracing_gpu::perfetto::PerfettoLayer;
use tracing_subscriber::layer::SubscriberExt;

/// The tolerance the issue sets: ‖C − ref‖ / ‖ref‖ for bf16 inputs.
const TOLERANCE: f64 = 1e-2;

struct Args {
    shape: (usize, usize, usize),
    reps: usize,
    variants: Vec<Variant>,
    trace: Option<std::path::PathBuf>,
    capture: Option<std::path::PathBuf>,
    launches: u32,
    out: Out,
    lineinfo: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        shape: (4096, 4096, 4096),
        reps: 30,
        variants: vec![
            Variant::Off,
            Variant::Phases,
            Variant::PhasesWg,
            Variant::Full,
        ],
        trace: None,
        capture: None,
        launches: 4,
        out: Out::Bf16,
        lineinfo: true,
    };
    let mut it = std::env::args().skip(1);
    let num = |v: Option<String>, what: &str| -> Result<usize, String> {
        v.ok_or(format!("{what}: missing value"))?
            .parse()
            .map_err(|e| format!("{what}: {e}"))
    };
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--size" => {
                a.shape = (num(it.next(), "--size")?, num(it.next(), "--size")?, num(it.next(), "--size")?)
            }
            "--reps" => a.reps = num(it.next(), "--reps")?.max(1),
            "--trace" => a.trace = Some(it.next().ok_or("--trace: missing path")?.into()),
            "--capture" => a.capture = Some(it.next().ok_or("--capture: missing path")?.into()),
            "--launches" => a.launches = num(it.next(), "--launches")?.max(1) as u32,
            "--f32" => a.out = Out::F32,
            "--no-lineinfo" => a.lineinfo = false,
            "--variants" => {
                let list = it.next().ok_or("--variants: missing list")?;
                a.variants = list
                    .split(',')
                    .map(|name| {
                        Variant::ALL
                            .into_iter()
                            .find(|v| v.name() == name)
                            .ok_or(format!("--variants: unknown variant {name:?}"))
                    })
                    .collect::<Result<_, _>>()?;
            }
            "-h" | "--help" => {
                return Err("usage: gemm [--size M N K] [--reps R] [--variants off,phases,phases-wg,full,seed-style,flashinfer-style] [--trace T.perfetto-trace [--capture C.tgpu] [--launches N]] [--f32] [--no-lineinfo]".into())
            }
            other => return Err(format!("unknown argument {other:?} (try --help)")),
        }
    }
    Ok(a)
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("gemm: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("gemm: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<bool, Box<dyn std::error::Error>> {
    ensure_libraries()?;
    let ctx = CudaContext::new(0)?;
    let stream = ctx.default_stream();
    println!(
        "device: {} (sm_{}{}), GEMM {}×{}×{}, C {:?}",
        ctx.name()?,
        ctx.compute_capability()?.0,
        ctx.compute_capability()?.1,
        args.shape.0,
        args.shape.1,
        args.shape.2,
        args.out
    );
    let reference = Reference::new(&stream)?;
    let gemms: Vec<Gemm> = args
        .variants
        .iter()
        .map(|&v| Gemm::compile(&ctx, v, args.out, args.lineinfo))
        .collect::<Result<_, _>>()?;

    // Correctness: fresh random inputs for every check, the full shape twice and two
    // odd shapes (several tiles per block, a partial last wave).
    let mut ok = true;
    let shapes = [args.shape, args.shape, (384, 768, 320), (1280, 2560, 1088)];
    for (i, &shape) in shapes.iter().enumerate() {
        let mut p = Problem::new(&stream, shape, args.out, 0x5EED + i as u64)?;
        // SAFETY: written by cuBLAS before it is read.
        let mut c_ref = unsafe { stream.alloc::<u8>(p.m * p.n * 4) }?;
        reference.gemm(&p, &mut c_ref, Out::F32)?;
        let ref_bytes = stream.clone_dtoh(&c_ref)?;
        let ref_values: Vec<f32> = ref_bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        for g in &gemms {
            let trace = g
                .variant
                .traced()
                .then(|| TraceBuffer::new(&stream, g, &p))
                .transpose()?;
            let result = check(
                g,
                &ref_values,
                &stream,
                &mut p,
                trace.as_ref().map(|t| &t.arg),
            )
            .and_then(|err| {
                Ok((
                    err,
                    trace.as_ref().map(|t| t.recorded(&stream)).transpose()?,
                ))
            });
            let label = format!(
                "check {}×{}×{} {:<16}",
                shape.0,
                shape.1,
                shape.2,
                g.variant.name()
            );
            match result {
                Ok((err, recorded)) => {
                    let want = g.expected_records(&p);
                    let pass = err <= TOLERANCE && recorded.is_none_or(|r| r == want);
                    ok &= pass;
                    let records = match recorded {
                        Some(r) => format!(", {r} records of {want} expected"),
                        None => String::new(),
                    };
                    println!(
                        "{label} rel err {err:.3e}{records} {}",
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
    let mut p = Problem::new(&stream, args.shape, args.out, 0xBE7C)?;
    // SAFETY: written by cuBLAS before anything reads it.
    let mut c_blas = unsafe { stream.alloc::<u8>(p.m * p.n * args.out.size()) }?;
    let mut traces: Vec<Option<TraceBuffer>> = gemms
        .iter()
        .map(|g| {
            g.variant
                .traced()
                .then(|| TraceBuffer::new(&stream, g, &p))
                .transpose()
        })
        .collect::<Result<_, _>>()?;
    let mut times = time_interleaved(
        &ctx,
        &stream,
        &gemms,
        &mut traces,
        &mut p,
        |p| reference.gemm(p, &mut c_blas, args.out),
        (3, args.reps),
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
fn profiled(args: &Args, out: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    let (perfetto, guard) = PerfettoLayer::builder()
        .file(out)
        .process_name("gemm")
        .build()?;
    let recorder = args.capture.as_deref().map(DumpRecorder::new);
    let subscriber = tracing_subscriber::registry()
        .with(perfetto)
        .with(recorder.as_ref().map(|r| r.layer()));
    let stats = tracing::subscriber::with_default(
        subscriber,
        || -> Result<_, Box<dyn std::error::Error>> {
            let _run = tracing::info_span!("gemm_run").entered();
            let ctx = CudaContext::new(0)?;
            let stream = ctx.default_stream();
            let g = tracing::info_span!("compile")
                .in_scope(|| Gemm::compile(&ctx, Variant::Phases, args.out, args.lineinfo))?;
            let mut p = tracing::info_span!("upload")
                .in_scope(|| Problem::new(&stream, args.shape, args.out, 0x7ACE))?;
            let cfg = g.config(&p);
            // Records per warp: as TraceBuffer sizes it.
            let capacity = (g.tiles_per_block(&p) * (3 * (p.k / tracing_gpu_bench::gemm::BK) + 2)) as u32;
            let profiler = {
                let _s = tracing::info_span!("profiler_setup").entered();
                let mut b = Profiler::builder()
                    .context(ctx.clone())
                    .registry(registry())
                    .capacity(capacity)
                    .lineinfo(args.lineinfo);
                if let Some(r) = &recorder {
                    b = b.dump(r.clone());
                }
                b.build()?
            };
            for step in 0..args.launches {
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
        "\ntrace {}: {} launches, {} device events ({} dropped), {} bytes{}",
        out.display(),
        stats.delivered,
        stats.events,
        stats.dropped_events,
        written.bytes,
        args.capture
            .as_deref()
            .map(|c| format!("; capture {}", c.display()))
            .unwrap_or_default()
    );
    Ok(())
}
