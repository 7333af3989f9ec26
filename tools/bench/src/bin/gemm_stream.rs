//! gemm_stream: the persistent GEMM of `kernels/gemm.cu` recorded while it runs for
//! seconds (issue #13): its blocks walk the problem's tiles `reps` times over
//! (`GEMM_REPS`), recording per-k-tile phases, streamed (`Profiler::streamed`), against
//! the same kernel with the gate off and recording into fixed slots.
//!
//! ```sh
//! cargo build --release -p tracing-gpu-bench --bin gemm_stream
//! target/release/gemm_stream [--size 4096 4096 4096] [--seconds 10]
//!                            [--variant phases|phases-wg] [--modes off,fixed,memory]
//!                            [--sample-warps 0x21] [--sample-blocks 4]
//!                            [--stream-memory BYTES] [--drain-threads N]
//! ```
//!
//! `reps` comes from one gate-off launch of a single pass, so that a launch takes about
//! `--seconds`. Modes, one launch each, in order: `off` (the gate off), `fixed` (fixed
//! slots of one pass's records per warp: the first pass kept, the rest lost and
//! counted), `memory` (streamed; the collector counts what it delivers). Per mode: the
//! kernel's time (CUDA events around the kernel, inside the profiled call), the slowdown
//! against `off`, the events produced (`Gemm::expected_records` × reps: known from the
//! loops) against delivered and lost (events), the rates, the drain's stalls, the CPU
//! time of the drain threads, of the collector and of the rest of the process
//! (`host::profiler_cpu`; the launching thread waits on a blocking event), and C
//! checked against cuBLAS (every pass writes the same C). A recorded mode fails the run
//! if delivered + lost ≠ produced (in events, counted per warp), or C is wrong.
//!
//! `--sample-warps MASK` and `--sample-blocks STRIDE` record only those warps of every
//! block (bit w: warp w; warp 0 is the producer, 4-11 the consumers) and every
//! STRIDE-th block (issue #31); produced then counts the sampled warps' events.

use std::error::Error;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use cudarc::driver::CudaStream;
use tracing::Dispatch;
use tracing_gpu::cuda::{gpu_profile, Profiler, Sampler, DEFAULT_STREAM_MEMORY};
use tracing_gpu::format::{KernelArg, Sampling};
use tracing_gpu_bench::cli::{self, Size};
use tracing_gpu_bench::device::{self, Timer};
use tracing_gpu_bench::gemm::{
    registry, relative_error, Gemm, Out, Problem, Reference, Variant, BK, BM, BN, THREADS,
    TOLERANCE,
};
use tracing_gpu_bench::host::{profiler_cpu, ProfilerCpu};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::SubscriberExt;

/// The persistent GEMM streamed for seconds, against fixed slots and the gate off.
#[derive(Parser, Debug)]
#[command(name = "gemm_stream")]
struct Args {
    #[command(flatten)]
    size: Size,
    /// About how long one launch runs.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// What the warps record: `phases` (every warp) or `phases-wg` (the producer and
    /// one warp per consumer warpgroup).
    #[arg(long, value_enum, default_value = "phases")]
    variant: Variant,
    /// Modes to run, in order: off, fixed, memory.
    #[arg(long, value_delimiter = ',', default_value = "off,fixed,memory")]
    modes: Vec<String>,
    /// Record only these warps of each block (bit w: warp w, `0x21` or `33`; 0: all).
    #[arg(long, value_parser = mask, default_value = "0")]
    sample_warps: u32,
    /// Record only every this-many-th block (from block 0; 1: all).
    #[arg(long, default_value_t = 1)]
    sample_blocks: u32,
    /// Bytes of the streaming arena (`ProfilerBuilder::stream_memory`): the rings take
    /// up to half of it.
    #[arg(long, default_value_t = DEFAULT_STREAM_MEMORY)]
    stream_memory: usize,
    /// Threads reading the rings (`ProfilerBuilder::stream_drain_threads`); by default
    /// the profiler's choice.
    #[arg(long, value_parser = cli::positive::<usize>)]
    drain_threads: Option<usize>,
}

/// A warp mask, in hex (`0x..`) or decimal.
fn mask(s: &str) -> Result<u32, String> {
    match s.strip_prefix("0x") {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => s.parse(),
    }
    .map_err(|e| format!("{s:?}: {e}"))
}

/// Events the sampled warps of `gemm` make in `reps` passes over `p`'s tiles: each
/// block walks the tiles `b, b + grid, ...`, and per tile its producer (warp 0)
/// records one event per k-tile, each recording consumer warp (4-11; with
/// `phases-wg` warps 5 and 10) two per k-tile and an epilogue.
fn produced_by(gemm: &Gemm, p: &Problem, reps: u64, sampling: &Sampling) -> u64 {
    let grid = u64::from(gemm.config(p).grid_dim.0);
    let tiles = (p.m / BM * (p.n / BN)) as u64 * reps;
    let kt = (p.k / BK) as u64;
    let warps = THREADS / 32;
    let per_tile = |w: u32| match w {
        0 => kt,
        4..=11 if gemm.variant != Variant::PhasesWg || w == 5 || w == 10 => 2 * kt + 1,
        _ => 0,
    };
    (0..grid.min(tiles))
        .map(|b| {
            let sampled = (0..warps).filter(|&w| sampling.slot_of(b as u32, w, warps).is_some());
            (tiles - b).div_ceil(grid) * sampled.map(per_tile).sum::<u64>()
        })
        .sum()
}

fn main() -> ExitCode {
    cli::exit("gemm_stream", run(&Args::parse()))
}

fn run(a: &Args) -> Result<bool, Box<dyn Error>> {
    if !matches!(a.variant, Variant::Phases | Variant::PhasesWg) {
        return Err("--variant: phases or phases-wg".into());
    }
    if let Some(m) = a
        .modes
        .iter()
        .find(|m| !["off", "fixed", "memory"].contains(&m.as_str()))
    {
        return Err(format!("unknown mode {m:?}: off, fixed, memory").into());
    }
    let ctx = device::open(0)?;
    let stream = ctx.new_stream()?;
    let mut p = Problem::new(&stream, a.size.shape(), Out::Bf16, 0x5EED)?;
    let reference = Reference::new(&stream)?.values(&p)?;
    // Waited for on a blocking primitive: a launching thread spinning for the 10 s
    // would take one of the host's cores from the drain threads.
    let timer = Timer::blocking(&ctx)?;
    // One pass, gate off: how many passes make --seconds.
    let one = Gemm::compile(&ctx, Variant::Off, Out::Bf16, false)?;
    one.launch(&stream, &mut p, None)?;
    timer.around(&stream, || one.launch(&stream, &mut p, None))?;
    let pass_s = timer.ms()? / 1e3;
    // The kernel counts the tiles of all passes in an int, and adds the grid to it.
    let (m, n, k) = a.size.shape();
    let tiles = (m / BM * (n / BN)) as u64;
    let reps = ((a.seconds / pass_s).round() as u64).clamp(1, (i32::MAX / 2) as u64 / tiles);
    let defines = |stream: bool| {
        let mut d = vec![format!("GEMM_REPS={reps}")];
        if stream {
            d.push("TGPU_STREAM=1".into());
        }
        d
    };
    let off = Gemm::compile_with(&ctx, Variant::Off, Out::Bf16, false, &defines(false))?;
    let traced = Gemm::compile_with(&ctx, a.variant, Out::Bf16, false, &defines(true))?;
    let sampling = Sampling::default()
        .warps(a.sample_warps)
        .blocks(a.sample_blocks, 0);
    let produced = produced_by(&traced, &p, reps, &sampling);
    if sampling.is_all() {
        // The loops' count agrees with the kernel's own.
        assert_eq!(produced, traced.expected_records(&p) * reps);
    } else {
        println!("sampled: {}", sampling.describe(THREADS / 32));
    }
    println!(
        "gemm_stream: {m}×{n}×{k} bf16, {} passes of {:.3} ms, {} recording; {produced} events \
         ({:.0} M events/s at the gate-off pass's speed)",
        reps,
        pass_s * 1e3,
        a.variant.name(),
        produced as f64 / (pass_s * reps as f64) / 1e6
    );
    let mut off_s = None;
    let mut ok = true;
    for mode in &a.modes {
        p.poison(&stream)?;
        let (kernel_s, stats) = match mode.as_str() {
            "off" => {
                timer.around(&stream, || off.launch(&stream, &mut p, None))?;
                (timer.ms()? / 1e3, None)
            }
            "fixed" | "memory" => {
                let sampler = Sampler::new(sampling);
                let fixed = mode == "fixed";
                let (ran, cpu) = profiler_cpu(|| {
                    profiled(
                        &ctx,
                        &stream,
                        (&traced, &mut p, &timer),
                        fixed,
                        sampler,
                        (a.stream_memory, a.drain_threads),
                    )
                });
                let (s, st) = ran?;
                (s, Some((st, cpu)))
            }
            _ => unreachable!("the modes are checked above"),
        };
        let (err, bad) = relative_error(&p.c_values(&stream)?, &reference);
        let c_ok = bad == 0 && err <= TOLERANCE;
        if mode == "off" {
            off_s = Some(kernel_s);
        }
        let slow = off_s.map_or(f64::NAN, |o| (kernel_s / o - 1.0) * 100.0);
        match stats {
            None => println!(
                "{mode:<7} kernel {kernel_s:.3} s ({slow:+.2}% vs off)  C rel err {err:.2e}: {}",
                if c_ok { "ok" } else { "WRONG" }
            ),
            Some((st, cpu)) => {
                let exact = st.events + st.events_lost == produced;
                println!(
                    "{mode:<7} kernel {kernel_s:.3} s ({slow:+.2}% vs off)  produced {produced} ({:.0} M/s)  \
                     delivered {} ({:.1} %, {:.1} M/s)  lost {}  (drain stalls {}, rings unread at most {:.1} ms)  parts {}  \
                     drain / collector / rest of the process cpu {:.1} / {:.1} / {:.1} s  C rel err {err:.2e}: {}",
                    produced as f64 / kernel_s / 1e6,
                    st.events,
                    100.0 * st.events as f64 / produced as f64,
                    st.events as f64 / kernel_s / 1e6,
                    st.events_lost,
                    st.stream_stalls,
                    st.stream_longest_gap.as_secs_f64() * 1e3,
                    st.parts,
                    cpu.by_role[ProfilerCpu::DRAIN],
                    cpu.by_role[ProfilerCpu::COLLECTOR],
                    cpu.by_role[ProfilerCpu::APP],
                    if c_ok { "ok" } else { "WRONG" }
                );
                if !exact || st.failed != 0 {
                    println!(
                        "  FAIL: delivered {} + lost {} = {} events, produced {produced} (failed {})",
                        st.events,
                        st.events_lost,
                        st.events + st.events_lost,
                        st.failed
                    );
                    ok = false;
                }
            }
        }
        ok &= c_ok;
    }
    Ok(ok)
}

/// One launch of `gemm` through `gpu_profile!`, into fixed slots of one pass's records
/// per warp or streamed; the kernel's seconds and the profiler's counts once delivered.
fn profiled(
    ctx: &Arc<cudarc::driver::CudaContext>,
    stream: &Arc<CudaStream>,
    (gemm, p, timer): (&Gemm, &mut Problem, &Timer),
    fixed: bool,
    sampler: Sampler,
    (stream_memory, drain_threads): (usize, Option<usize>),
) -> Result<(f64, tracing_gpu::cuda::ProfilerStats), Box<dyn Error>> {
    let dispatch = Dispatch::new(tracing_subscriber::registry().with(LevelFilter::INFO));
    let _default = tracing::dispatcher::set_default(&dispatch);
    let per_pass = gemm.capacity(p);
    let mut builder = Profiler::builder()
        .context(ctx.clone())
        .registry(registry())
        .capacity(per_pass)
        .sampler(sampler)
        .stream_memory(stream_memory);
    if let Some(n) = drain_threads {
        builder = builder.stream_drain_threads(n);
    }
    let profiler = builder.build()?;
    let cfg = gemm.config(p);
    let launch = |trace: KernelArg| {
        timer.record_start(stream)?;
        gemm.launch(stream, p, Some(&trace))
    };
    if fixed {
        gpu_profile!(profiler, stream, "tgpu_gemm_bf16", cfg, launch)?;
    } else {
        gpu_profile!(profiler.streamed(), stream, "tgpu_gemm_bf16", cfg, launch)?;
    }
    timer.record_end(stream)?;
    let kernel_s = timer.ms()? / 1e3;
    profiler.flush()?;
    Ok((kernel_s, profiler.stats()))
}
