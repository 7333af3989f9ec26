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

mod common;

use std::process::ExitCode;
use std::sync::Arc;

use common::gemm::{check, median, Gemm, Out, Problem, Reference, Timer, Variant, WARPS_PER_BLOCK};
use tracing_gpu::cuda::cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use tracing_gpu::cuda::{ensure_libraries, CudaError};
use tracing_gpu::format::{self, BufferHeader, KernelArg};

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

/// A zeroed trace buffer with its header, sized for `gemm` on `p`, and its kernel argument.
struct TraceBuffer {
    buf: CudaSlice<u8>,
    arg: KernelArg,
}

impl TraceBuffer {
    fn new(stream: &Arc<CudaStream>, gemm: &Gemm, p: &Problem) -> Result<Self, CudaError> {
        let cfg = gemm.config(p);
        let slot_count = cfg.grid_dim.0 * WARPS_PER_BLOCK;
        // Records per warp: at most 3 per k-tile (wait, load or mma, release) and 2 per
        // tile (epilogue, tile), for each tile the block walks.
        let capacity = (gemm.tiles_per_block(p) * (3 * (p.k / common::gemm::BK) + 2)) as u32;
        let size = format::buffer_size(slot_count, capacity)
            .ok_or_else(|| CudaError::Invalid("trace buffer too large".into()))?;
        let mut host = vec![0u8; size];
        BufferHeader {
            version: format::VERSION,
            slot_capacity: capacity,
            slot_count,
            warps_per_block: WARPS_PER_BLOCK,
            launch_id: 1,
            grid: [cfg.grid_dim.0, cfg.grid_dim.1, cfg.grid_dim.2],
            block: [cfg.block_dim.0, cfg.block_dim.1, cfg.block_dim.2],
            flags: 0,
        }
        .write_to(&mut host);
        let buf = stream.clone_htod(&host)?;
        let base = {
            use tracing_gpu::cuda::cudarc::driver::DevicePtr;
            buf.device_ptr(stream).0
        };
        Ok(TraceBuffer {
            buf,
            arg: KernelArg {
                base,
                capacity,
                slot_count,
            },
        })
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
            let trace = if g.variant.traced() {
                Some(TraceBuffer::new(&stream, g, &p)?)
            } else {
                None
            };
            match check(
                g,
                &ref_values,
                &stream,
                &mut p,
                trace.as_ref().map(|t| &t.arg),
            ) {
                Ok(err) => {
                    let pass = err <= TOLERANCE;
                    ok &= pass;
                    println!(
                        "check {}×{}×{} {:<16} rel err {:.3e} {}",
                        shape.0,
                        shape.1,
                        shape.2,
                        g.variant.name(),
                        err,
                        if pass { "ok" } else { "FAIL" }
                    );
                }
                Err(e) => {
                    ok = false;
                    println!(
                        "check {}×{}×{} {:<16} FAIL: {e}",
                        shape.0,
                        shape.1,
                        shape.2,
                        g.variant.name()
                    );
                }
            }
        }
    }

    // Speed: every variant and cuBLAS (same output type), interleaved, after warm-up.
    let mut p = Problem::new(&stream, args.shape, args.out, 0xBE7C)?;
    // SAFETY: written by cuBLAS before anything reads it.
    let mut c_blas = unsafe { stream.alloc::<u8>(p.m * p.n * args.out.size()) }?;
    let traces: Vec<Option<TraceBuffer>> = gemms
        .iter()
        .map(|g| {
            g.variant
                .traced()
                .then(|| TraceBuffer::new(&stream, g, &p))
                .transpose()
        })
        .collect::<Result<_, _>>()?;
    let timers: Vec<Timer> = (0..=gemms.len())
        .map(|_| Timer::new(&ctx))
        .collect::<Result<_, _>>()?;
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); gemms.len() + 1];
    for rep in 0..args.reps + 3 {
        for (i, g) in gemms.iter().enumerate() {
            timers[i].around(&stream, || {
                g.launch(&stream, &mut p, traces[i].as_ref().map(|t| &t.arg))
            })?;
        }
        timers[gemms.len()].around(&stream, || reference.gemm(&p, &mut c_blas, args.out))?;
        for (i, t) in timers.iter().enumerate() {
            let ms = t.ms()? as f64;
            if rep >= 3 {
                times[i].push(ms);
            }
        }
    }
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

    // One traced launch into a clean buffer, written out raw for the decoder and the CLI.
    if let Some(path) = &args.raw {
        let g = gemms
            .iter()
            .find(|g| g.variant.traced())
            .ok_or("--raw needs a traced variant in --variants")?;
        let t = TraceBuffer::new(&stream, g, &p)?;
        g.launch(&stream, &mut p, Some(&t.arg))?;
        stream.synchronize()?;
        let bytes = stream.clone_dtoh(&t.buf)?;
        std::fs::write(path, &bytes)?;
        println!(
            "\nwrote {} ({} bytes, variant {}, {} slots of {} records)",
            path.display(),
            bytes.len(),
            g.variant.name(),
            t.arg.slot_count,
            t.arg.capacity
        );
    }
    Ok(ok)
}
