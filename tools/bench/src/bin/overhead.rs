//! What recording costs on a real kernel: the GEMM of `kernels/gemm.cu` built ten
//! ways and timed in the same run, interleaved (CUDA events, medians after warm-up):
//!
//! - `off`: the production kernel, no recorder (built twice: the two copies' difference
//!   is the noise floor of the comparison);
//! - `phases`: our recorder, per-k-tile phases (the producer warp records a load per
//!   k-tile; every consumer warp records wait and mma per k-tile, and the epilogue);
//! - `phases-kept`: the same built with `TGPU_KEEP_SLOT=1` (each warp keeps its slot's
//!   address in registers once found, instead of finding it at every group store);
//! - `phases-wg`: the same phases from one warp per consumer warpgroup (and the
//!   producer): the four warps of a warpgroup run the same wgmma in step;
//! - `phases-v1`, `phases-wg-v1`: the same two with recorder v1 (`phases` and
//!   `phases-wg` record v2, the default);
//! - `full`: our recorder, every event (also the producer's wait apart from its load, a
//!   tile range and a release instant per k-tile);
//! - `seed-style`: the seed's published design at the phases' call sites;
//! - `flashinfer-style`: FlashInfer's published design at the same call sites;
//! - `stamps`: the timer reads alone at the phases' call sites, what any recorder there
//!   pays at least (it records nothing: each warp that would record stores one word);
//! - with `--idle`, `phases, base 0`: the `phases` kernel given a trace whose base is 0,
//!   so that its recorder's per-event code runs (the turns, counts and group tests) with
//!   no timer read and nothing stored: what that code alone costs the GEMM.
//!
//! Each instrumented variant is first checked against cuBLAS and must have recorded
//! exactly the events expected, so all of them do the same work.
//!
//! ```text
//! cargo run --release -p tracing-gpu-bench --bin overhead -- [--size M N K] [--reps R] [--idle] [--no-lineinfo]
//! ```
//!
//! Overhead per k-tile = (median time − median time off) / k-tiles one block walks in
//! sequence (tiles per block × K/64): the cost a k-tile's critical path sees.

use std::process::ExitCode;

use clap::Parser;
use tracing_gpu_bench::cli::{self, LineInfo, Size};
use tracing_gpu_bench::device;
use tracing_gpu_bench::gemm::{
    check, time_interleaved, Checked, Gemm, Out, Problem, Reference, TraceBuffer, Variant, BK, BM,
    BN,
};
use tracing_gpu_bench::stats::median;

/// What recording costs the GEMM: ten builds timed interleaved, per k-tile.
#[derive(Parser, Debug)]
#[command(name = "overhead")]
struct Args {
    #[command(flatten)]
    size: Size,
    /// Timed rounds (after 5 of warm-up); the figures are medians.
    #[arg(long, default_value_t = 50)]
    reps: usize,
    /// Also time the `phases` kernel given a trace whose base is 0 (it records nothing).
    #[arg(long)]
    idle: bool,
    #[command(flatten)]
    lineinfo: LineInfo,
}

fn main() -> ExitCode {
    cli::exit("overhead", run(&Args::parse()))
}

fn run(args: &Args) -> Result<bool, Box<dyn std::error::Error>> {
    let (shape, reps) = (args.size.shape(), args.reps.max(1));
    let ctx = device::open(0)?;
    let stream = ctx.default_stream();
    println!(
        "device: {}, GEMM {}×{}×{} bf16, {reps} interleaved rounds",
        ctx.name()?,
        shape.0,
        shape.1,
        shape.2
    );

    // Off twice: the spread between two identical kernels bounds what can be resolved.
    // With --idle, the phases kernel once more before it, to be given a base of 0.
    let idle = args.idle.then_some(Variant::ALL.len());
    let all: Vec<Variant> = Variant::ALL
        .into_iter()
        .chain(idle.map(|_| Variant::Phases))
        .chain([Variant::Off])
        .collect();
    let gemms: Vec<Gemm> = all
        .iter()
        .map(|&v| Gemm::compile(&ctx, v, Out::Bf16, args.lineinfo.on()))
        .collect::<Result<_, _>>()?;
    let name = |i: usize, v: Variant| {
        if i == all.len() - 1 {
            "off (again)"
        } else if Some(i) == idle {
            "phases, base 0"
        } else {
            v.name()
        }
    };

    let mut p = Problem::new(&stream, shape, Out::Bf16, 0x0E7E)?;
    let reference = Reference::new(&stream)?;
    let ref_values = reference.values(&p)?;
    let mut traces = TraceBuffer::all(&stream, &gemms, &p)?;
    if let Some(t) = idle.and_then(|i| traces[i].as_mut()) {
        t.arg.base = 0;
    }
    // A variant that fails its check is reported and left out of the timing (the run
    // then fails at the end), so that one recorder's fault does not void the others'.
    let mut passed = Vec::new();
    for (i, g) in gemms.iter().enumerate() {
        let verdict = match check(g, &ref_values, &stream, &mut p, traces[i].as_ref()) {
            Ok(c) => {
                // The kernel given a base of 0 must record nothing.
                let want = if Some(i) == idle { 0 } else { c.want };
                let what = format!(
                    "rel err {:.3e}, {} records of {want} expected",
                    c.err,
                    c.recorded.unwrap_or(0),
                );
                (Checked { want, ..c }.pass(), what)
            }
            Err(e) => (false, e.to_string()),
        };
        let (pass, what) = verdict;
        let word = if pass { "ok" } else { "FAIL" };
        println!("check {:<16} {what} {word}", name(i, all[i]));
        passed.push(pass);
    }
    if !passed[0] || !passed[all.len() - 1] {
        return Ok(false);
    }
    let keep = |i: &usize| passed[*i];
    let variants: Vec<Variant> = (0..all.len()).filter(keep).map(|i| all[i]).collect();
    let names: Vec<&str> = (0..all.len())
        .filter(keep)
        .map(|i| name(i, all[i]))
        .collect();
    let (gemms, mut traces): (Vec<Gemm>, Vec<Option<TraceBuffer>>) = gemms
        .into_iter()
        .zip(traces)
        .enumerate()
        .filter(|(i, _)| passed[*i])
        .map(|(_, gt)| gt)
        .unzip();

    let mut c_blas = reference.output(&p, Out::Bf16)?;
    let times = time_interleaved(
        &ctx,
        &stream,
        &gemms,
        &mut traces,
        &mut p,
        |p| reference.gemm(p, &mut c_blas, Out::Bf16),
        (5, reps),
    )?;

    let ktiles_seq = (gemms[0].tiles_per_block(&p) * (p.k / BK)) as f64;
    let kt_total = (p.m / BM * (p.n / BN) * (p.k / BK)) as f64;
    let off = median(&mut times[0].clone());
    // Per-round paired differences against `off`: drifts in clock and temperature cancel.
    let delta_ms = |i: usize| {
        let mut d: Vec<f64> = times[i].iter().zip(&times[0]).map(|(t, o)| t - o).collect();
        median(&mut d)
    };
    let again = names.len() - 1;
    let noise_ns = delta_ms(again).abs() * 1e6 / ktiles_seq;
    // The two recordings of per-k-tile phases the others are compared with (if checked).
    let bases = [Variant::Phases, Variant::PhasesWg].map(|v| {
        let i = variants.iter().position(|&x| x == v)?;
        Some((i, delta_ms(i) * 1e6 / ktiles_seq))
    });
    // (Not for the stamps, which record nothing, nor the phases kernel given a base of 0.)
    let per_ktile: Vec<String> = gemms[1..gemms.len() - 1]
        .iter()
        .zip(&names[1..])
        .filter(|(g, &name)| g.variant != Variant::Stamps && name == g.variant.name())
        .map(|(g, name)| {
            let records = g.expected_records(&p) as f64 / kt_total;
            format!("{name} {records}")
        })
        .collect();
    println!(
        "\n{ktiles_seq} k-tiles per block in sequence; records per k-tile (whole block): {}",
        per_ktile.join(", ")
    );
    println!(
        "\n| variant | median ms | TFLOP/s | slowdown | ns per k-tile | vs phases | vs phases-wg |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (i, name) in names.iter().enumerate() {
        let ms = median(&mut times[i].clone());
        let d = if i == 0 { 0.0 } else { delta_ms(i) };
        let per_ktile = d * 1e6 / ktiles_seq;
        let ratio = |base: Option<(usize, f64)>| {
            let Some((base, base_ns)) = base else {
                return "-".to_string();
            };
            match i {
                0 => "-".to_string(),
                _ if i == base || i == again => "-".to_string(),
                // Below the noise floor a cost is not resolved: a ratio to it is a bound, or
                // nothing when both are below it.
                _ if base_ns < noise_ns && per_ktile < noise_ns => "-".to_string(),
                _ if base_ns < noise_ns => format!("≥ {:.0}×", per_ktile / noise_ns.max(0.1)),
                _ => format!("{:.1}×", per_ktile / base_ns),
            }
        };
        println!(
            "| {name} | {ms:.4} | {:.1} | {:+.2}% | {per_ktile:.1} | {} | {} |",
            p.flops() / ms / 1e9,
            100.0 * d / off,
            ratio(bases[0]),
            ratio(bases[1]),
        );
    }
    let blas = median(&mut times[gemms.len()].clone());
    println!(
        "| cuBLAS | {blas:.4} | {:.1} | | | |",
        p.flops() / blas / 1e9
    );
    println!(
        "\nslowdown and ns per k-tile: medians of per-round differences from off; noise floor \
         (|off again − off|): {noise_ns:.1} ns per k-tile, {:.2}%",
        100.0 * delta_ms(again).abs() / off
    );
    Ok(passed.iter().all(|&ok| ok))
}
