//! dense: what recording costs a kernel of many short-lived warps that record densely
//! (`tools/bench/kernels/dense.cu`), with recorder v1 and v2, and what the recorder alone
//! costs a warp that records nothing.
//!
//! ```sh
//! cargo build --release -p tracing-gpu-bench --bin dense
//! target/release/dense [--blocks 1440] [--steps 12] [--work 192] [--repeats 51] [--json PATH] \
//!     [--define NAME=VALUE] [--header FILE]
//! ```
//!
//! Blocks of 8 warps (as many as `--blocks`, several waves of them on every SM); each
//! warp runs `steps` steps of two FMA chains of `work` links, recording per step a range,
//! a range nested in it and an instant (3 events; the outer range's end carries the step
//! as payload). Builds: off (timed twice: the second is the noise), v1 and v2 recording,
//! and v1 and v2 *silent* (the recorder declared, no call made: its setup and flush
//! alone). Builds are interleaved, the order rotating each repeat, timed with CUDA events;
//! figures are medians. Per build: the slowdown against off, the SM cost per event
//! ((t − t_off) × SMs / events) and, silent, per warp ((t − t_off) × SMs / warps).
//! Checks, after the timing: every output equals the gate-off build's bit for bit; the
//! recording builds' buffers decode strictly to exactly each warp's events; v1 silent
//! flushes every warp with no record, and v2 silent writes nothing at all.
//!
//! `--define` and `--header` change the v2 builds alone (recording and silent), so that a
//! candidate recorder that writes v2's format (such as `tools/bench/kernels/floor.cuh`'s
//! mode 3, or a header with `TGPU_DIRECT`) is measured and checked at full occupancy beside
//! v1 as shipped.

use std::collections::BTreeMap;
use std::error::Error;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use cudarc::driver::PushKernelArg;
use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig};
use tracing_gpu::cuda::{compile, KernelBuild};
use tracing_gpu::decode::Buffer;
use tracing_gpu::format::{EventKind, KernelArg};
use tracing_gpu::registry::EventRegistry;
use tracing_gpu_bench::kernels::DENSE;
use tracing_gpu_bench::stats::median;
use tracing_gpu_bench::{cli, device, device::Timer};

type Result<T> = std::result::Result<T, Box<dyn Error>>;

const FMA_A: f32 = 0.999_023_4;
const FMA_B: f32 = 0.001_220_7;
/// Threads per block: 8 warps.
const THREADS: u32 = 256;
/// Events one warp records per step.
const PER_STEP: u32 = 3;

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Build {
    Off,
    OffAgain,
    V1,
    V2,
    V1Silent,
    V2Silent,
}

impl Build {
    const ALL: [Build; 6] = [
        Build::Off,
        Build::OffAgain,
        Build::V1,
        Build::V2,
        Build::V1Silent,
        Build::V2Silent,
    ];

    fn name(self) -> &'static str {
        match self {
            Build::Off => "off",
            Build::OffAgain => "off-again",
            Build::V1 => "v1",
            Build::V2 => "v2",
            Build::V1Silent => "v1-silent",
            Build::V2Silent => "v2-silent",
        }
    }

    fn defines(self) -> &'static [&'static str] {
        match self {
            Build::Off | Build::OffAgain => &[],
            Build::V1 => &["TGPU_ENABLED=1", "TGPU_FORMAT=1"],
            Build::V2 => &["TGPU_ENABLED=1"],
            Build::V1Silent => &["TGPU_ENABLED=1", "TGPU_FORMAT=1", "DENSE_SILENT=1"],
            Build::V2Silent => &["TGPU_ENABLED=1", "DENSE_SILENT=1"],
        }
    }

    fn traced(self) -> bool {
        !matches!(self, Build::Off | Build::OffAgain)
    }

    fn silent(self) -> bool {
        matches!(self, Build::V1Silent | Build::V2Silent)
    }
}

/// Short-lived warps that record densely: recording on and off, v1 and v2.
#[derive(Parser, Debug)]
#[command(name = "dense")]
struct Options {
    /// Blocks of 8 warps.
    #[arg(long, default_value_t = 1440, value_parser = cli::positive::<u32>)]
    blocks: u32,
    /// Steps per warp (3 events each).
    #[arg(long, default_value_t = 12, value_parser = cli::positive::<u32>)]
    steps: u32,
    /// FMAs per chain (two chains per step).
    #[arg(long, default_value_t = 192, value_parser = cli::positive::<u32>)]
    work: u32,
    /// Timed repeats (interleaved); the figures are medians.
    #[arg(long, default_value_t = 51, value_parser = cli::positive::<u32>)]
    repeats: u32,
    /// Untimed repeats first.
    #[arg(long, default_value_t = 5)]
    warmup: u32,
    /// Also write every figure and sample as JSON here.
    #[arg(long, value_name = "PATH")]
    json: Option<PathBuf>,
    /// A define added to the v2 builds (`NAME=VALUE`); repeatable.
    #[arg(long = "define", value_name = "NAME=VALUE")]
    defines: Vec<String>,
    /// The v2 builds include this file instead of the embedded `tracing_gpu.cuh`.
    #[arg(long, value_name = "FILE")]
    header: Option<PathBuf>,
}

/// What changes the v2 builds: `--define`s and `--header`.
struct Variant {
    defines: Vec<String>,
    header: Option<cli::Header>,
}

fn ensure(ok: bool, what: impl FnOnce() -> String) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(what().into())
    }
}

fn load(ctx: &Arc<CudaContext>, arch: &'static str, b: Build, v: &Variant) -> Result<CudaFunction> {
    let mut build = KernelBuild::new("dense", arch);
    for d in b.defines() {
        build = build.define(*d);
    }
    let (source, build) = match b {
        Build::V2 | Build::V2Silent => cli::variant(DENSE, build, &v.defines, v.header.as_ref()),
        _ => (DENSE.to_owned(), build),
    };
    let module = ctx.load_module(compile(&source, &build)?)?;
    Ok(module.load_function("dense")?)
}

/// Each build's launch: its kernel, output and trace argument.
struct Run {
    f: CudaFunction,
    out: CudaSlice<f32>,
    trace: Option<(CudaSlice<u8>, KernelArg)>,
}

impl Run {
    fn launch(&self, stream: &Arc<CudaStream>, cfg: LaunchConfig, o: &Options) -> Result<()> {
        let (steps, work) = (o.steps as i32, o.work as i32);
        let mut l = stream.launch_builder(&self.f);
        l.arg(&self.out)
            .arg(&FMA_A)
            .arg(&FMA_B)
            .arg(&steps)
            .arg(&work);
        if let Some((_, arg)) = &self.trace {
            l.arg(arg);
        }
        // SAFETY: the arguments match dense()'s parameter list for this build.
        unsafe { l.launch(cfg) }?;
        Ok(())
    }
}

/// What one build's buffer must hold: every warp's 3 events per step (or, silent, none).
fn check_trace(b: Build, bytes: &[u8], o: &Options, warps: u32) -> Result<()> {
    let reg = EventRegistry::from_pairs([(1, "step"), (2, "inner"), (3, "mark")])?;
    let capture = Buffer::decode(bytes, Some(&reg))?;
    let flushed = match b {
        Build::V2Silent => 0,
        _ => warps as usize,
    };
    ensure(capture.flushed_slot_count() == flushed, || {
        format!(
            "{}: {} of {warps} slots flushed",
            b.name(),
            capture.flushed_slot_count()
        )
    })?;
    ensure(
        b != Build::V2Silent || bytes[64..].iter().all(|&x| x == 0),
        || "v2-silent: the buffer was written".into(),
    )?;
    let want: Vec<(u16, EventKind, u32)> = if b.silent() {
        Vec::new()
    } else {
        (0..o.steps)
            .flat_map(|s| {
                [
                    (2, EventKind::Range, 0),
                    (3, EventKind::Instant, 0),
                    (1, EventKind::Range, s),
                ]
            })
            .collect()
    };
    for slot in capture.slots() {
        let got: Vec<_> = slot.events().map(|e| (e.id, e.kind, e.payload)).collect();
        ensure(
            got == want && slot.events_lost() == 0 && !slot.open_at_flush(),
            || format!("{} slot {}: {got:?}", b.name(), slot.index),
        )?;
    }
    Ok(())
}

fn main() -> ExitCode {
    cli::exit("dense", run(&Options::parse()))
}

fn run(o: &Options) -> Result<bool> {
    let variant = Variant {
        defines: o.defines.clone(),
        header: cli::Header::read(o.header.as_deref())?,
    };
    let ctx = match device::open(0) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("skipped: no GPU ({e})");
            return Ok(true);
        }
    };
    // SAFETY: every buffer is used on this one stream only.
    unsafe { ctx.disable_event_tracking() };
    let stream = ctx.default_stream();
    let (arch, sms) = (device::arch(&ctx)?, device::sm_count(&ctx)?);
    let cfg = LaunchConfig {
        grid_dim: (o.blocks, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let warps = o.blocks * THREADS / 32;
    let capacity = PER_STEP * o.steps; // exactly: v1's records, v2's 6 entries a step
    let mut runs = Vec::new();
    for b in Build::ALL {
        let f = if b == Build::OffAgain {
            runs.first().map(|r: &Run| r.f.clone()).expect("off first")
        } else {
            load(&ctx, arch, b, &variant)?
        };
        let trace = if b.traced() {
            let buf = device::trace_buffer(&stream, &cfg, capacity, warps)?;
            let arg = KernelArg {
                base: buf.device_ptr(&stream).0,
                capacity,
                slot_count: warps,
                ..KernelArg::default()
            };
            Some((buf, arg))
        } else {
            None
        };
        let out = stream.alloc_zeros::<f32>((o.blocks * THREADS) as usize)?;
        runs.push(Run { f, out, trace });
    }
    let fit = runs[0]
        .f
        .occupancy_max_active_blocks_per_multiprocessor(THREADS, 0, None)?;
    let waves = o.blocks as f64 / (fit * sms) as f64;
    let marks = Timer::many(&ctx, runs.len())?;
    let mut times: BTreeMap<Build, Vec<f64>> = BTreeMap::new();
    for rep in 0..o.warmup + o.repeats {
        // An untimed launch first: the GPU is busy while the timed ones queue.
        runs[0].launch(&stream, cfg, o)?;
        for k in 0..runs.len() {
            let i = (k + rep as usize) % runs.len();
            marks[i].around(&stream, || runs[i].launch(&stream, cfg, o))?;
        }
        for (i, b) in Build::ALL.iter().enumerate() {
            let ms = marks[i].ms()?;
            if rep >= o.warmup {
                times.entry(*b).or_default().push(ms);
            }
        }
    }
    let med = |b: Build| median(&mut times[&b].clone());
    let off = med(Build::Off);
    let events = warps as f64 * (PER_STEP * o.steps) as f64;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "dense: {} SMs, {arch}; {} blocks of 8 warps ({waves:.2} waves of {fit} blocks per SM), {} steps of 2 x {} FMAs, {} events per warp; medians of {} interleaved repeats",
        sms, o.blocks, o.steps, o.work, PER_STEP * o.steps, o.repeats
    );
    let v2_build = cli::recorder_build_with(&variant.defines, variant.header.as_ref());
    let _ = writeln!(s, "v2 builds: {v2_build}");
    let _ = writeln!(
        s,
        "{:<10} {:>10} {:>9} {:>16} {:>15}",
        "build", "median us", "slowdown", "SM ns per event", "SM ns per warp"
    );
    let mut json = format!(
        "{{\"sms\":{sms},\"arch\":\"{arch}\",\"v2_build\":{},\"blocks\":{},\"steps\":{},\"work\":{},\"repeats\":{},\"builds\":{{",
        cli::json_string(&v2_build),
        o.blocks, o.steps, o.work, o.repeats
    );
    for (i, b) in Build::ALL.iter().enumerate() {
        let t = med(*b);
        let d_ns = (t - off) * 1e6 * sms as f64;
        let per_event = if b.silent() { f64::NAN } else { d_ns / events };
        let _ = writeln!(
            s,
            "{:<10} {:>10.2} {:>+8.2}% {:>16.3} {:>15.2}",
            b.name(),
            t * 1e3,
            (t / off - 1.0) * 100.0,
            per_event,
            d_ns / warps as f64
        );
        let samples: Vec<String> = times[b].iter().map(|x| format!("{x:.6}")).collect();
        let _ = write!(
            json,
            "{}\"{}\":{{\"median_ms\":{t:.6},\"samples_ms\":[{}]}}",
            if i > 0 { "," } else { "" },
            b.name(),
            samples.join(",")
        );
    }
    json.push_str("}}\n");
    // The checks: outputs, then what each traced build wrote (its last launch).
    let reference = stream.clone_dtoh(&runs[0].out)?;
    let mut findings = Vec::new();
    for (b, r) in Build::ALL.iter().zip(&runs).skip(1) {
        let got = stream.clone_dtoh(&r.out)?;
        if got
            .iter()
            .zip(&reference)
            .any(|(x, y)| x.to_bits() != y.to_bits())
        {
            findings.push(format!(
                "{}: output differs from the gate-off build",
                b.name()
            ));
        }
        if let Some((buf, _)) = &r.trace {
            if let Err(e) = check_trace(*b, &stream.clone_dtoh(buf)?, o, warps) {
                findings.push(e.to_string());
            }
        }
    }
    for f in &findings {
        let _ = writeln!(s, "FINDING: {f}");
    }
    print!("{s}");
    if let Some(path) = &o.json {
        std::fs::write(path, json)?;
    }
    Ok(findings.is_empty())
}
