//! The pipelined bf16 GEMM of `kernels/gemm.cu`, live on the GPU: checked against
//! cuBLAS on fresh random inputs, timed against cuBLAS, and run once with the
//! recorder on, its raw trace buffer written out for the other tools.
//!
//! ```text
//! cargo run --release --features cuda --example gemm -- [--size M N K] [--reps R]
//!     [--variants off,phases,full] [--raw trace.bin] [--f32]
//! ```
//!
//! Prints one line per check and a table of TFLOP/s (median of interleaved repeats,
//! CUDA events, after warm-up). Exits non-zero if any check fails.

#[allow(dead_code)] // each example uses its own part of the shared code
mod common;

use std::process::ExitCode;

use common::gemm::{
    check, median, time_interleaved, Gemm, Out, Problem, Reference, TraceBuffer, Variant, EVENTS,
};
use tracing_gpu::clock::HostClock;
use tracing_gpu::cuda::cudarc::driver::CudaContext;
use tracing_gpu::cuda::ensure_libraries;

/// The tolerance the issue sets: ‖C − ref‖ / ‖ref‖ for bf16 inputs.
const TOLERANCE: f64 = 1e-2;

struct Args {
    shape: (usize, usize, usize),
    reps: usize,
    variants: Vec<Variant>,
    raw: Option<std::path::PathBuf>,
    out: Out,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        shape: (4096, 4096, 4096),
        reps: 30,
        variants: vec![Variant::Off, Variant::Phases, Variant::Full],
        raw: None,
        out: Out::Bf16,
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
            "--raw" => a.raw = Some(it.next().ok_or("--raw: missing path")?.into()),
            "--f32" => a.out = Out::F32,
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
                return Err("usage: gemm [--size M N K] [--reps R] [--variants off,phases,full,seed-style,flashinfer-style] [--raw FILE] [--f32]".into())
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
        .map(|&v| Gemm::compile(&ctx, v, args.out))
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

    // One traced launch into a clean buffer, written out raw for the decoder and the
    // CLI, with what a reader needs to know about the launch beside it.
    if let Some(path) = &args.raw {
        let g = gemms
            .iter()
            .find(|g| matches!(g.variant, Variant::Phases | Variant::Full))
            .ok_or("--raw needs phases or full in --variants")?;
        let t = TraceBuffer::new(&stream, g, &p)?;
        let before = HostClock::Boottime.now_ns();
        g.launch(&stream, &mut p, Some(&t.arg))?;
        stream.synchronize()?;
        let after = HostClock::Boottime.now_ns();
        let bytes = t.bytes(&stream)?;
        write_maybe_gz(path, &bytes)?;
        let cfg = g.config(&p);
        let events: Vec<String> = EVENTS
            .iter()
            .map(|(id, name)| format!("\"{id}\": \"{name}\""))
            .collect();
        let meta = format!(
            "{{\n  \"device\": \"{}\",\n  \"kernel\": \"{}\",\n  \"variant\": \"{}\",\n  \"shape\": [{}, {}, {}],\n  \"grid\": [{}, 1, 1],\n  \"block\": [{}, 1, 1],\n  \"slot_count\": {},\n  \"capacity\": {},\n  \"host_launch_boottime_ns\": {before},\n  \"host_complete_boottime_ns\": {after},\n  \"events\": {{{}}}\n}}\n",
            ctx.name()?,
            common::gemm::KERNEL,
            g.variant.name(),
            p.m,
            p.n,
            p.k,
            cfg.grid_dim.0,
            cfg.block_dim.0,
            t.arg.slot_count,
            t.arg.capacity,
            events.join(", ")
        );
        let meta_path = path.with_extension("json");
        std::fs::write(&meta_path, meta)?;
        println!(
            "\nwrote {} ({} bytes raw, variant {}, {} slots of {} records) and {}",
            path.display(),
            bytes.len(),
            g.variant.name(),
            t.arg.slot_count,
            t.arg.capacity,
            meta_path.display()
        );
    }
    Ok(ok)
}

/// Writes `bytes` to `path`, gzip-compressed if the name ends in `.gz`.
fn write_maybe_gz(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    if path.extension().is_some_and(|e| e == "gz") {
        let mut z = flate2::write::GzEncoder::new(
            std::fs::File::create(path)?,
            flate2::Compression::default(),
        );
        z.write_all(bytes)?;
        z.finish()?.sync_all()
    } else {
        std::fs::write(path, bytes)
    }
}
