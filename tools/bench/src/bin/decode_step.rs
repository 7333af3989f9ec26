//! One LLM decode step, as a CUDA graph and as a storm of launches, gate off against null
//! trace against profiled (issue #28): what the recorder costs where inference runs.
//!
//! ```text
//! cargo run --release -p tracing-gpu-bench --bin decode_step -- [--layers 16] [--batch 1] \
//!     [--hidden 2048] [--heads H] [--kv-heads H] [--intermediate I] [--tokens 2048] \
//!     [--replays 1000] [--block 50] [--every 10] [--capacity 8] [--regions 4] \
//!     [--memory BYTES] [--no-check] [--json FILE] [--define NAME=VALUE] [--header FILE] \
//!     [--lead-us US]
//! ```
//!
//! The step ([`tracing_gpu_bench::decode`], kernels `tools/bench/kernels/decode_step.cu`):
//! `embed`, then per layer `rmsnorm`, `gemv_qkv`, `rope` (and the KV cache append),
//! `attention` (split over a cache of `--tokens` tokens), `attn_combine`, `gemv_o`,
//! `residual_add`, `rmsnorm`, `gemv_gate_up`, `silu_mul`, `gemv_down`, `residual_add`:
//! 1 + 12 × `--layers` kernels of 2-20 µs (defaults: hidden 2048, 16 heads of 128, as many
//! kv heads, intermediate 2.75 × hidden; bf16, fp32 accumulation), every warp recording a
//! range per phase (2 to 6). The kernels are built twice: without the recorder (the gate
//! off: the step a user ships, **the baseline**) and with it.
//!
//! First, unless `--no-check`, a two-layer model of two sequences is run one step in each
//! way the kernels launch (gate off, null trace, `gpu_profile!`) and compared with the
//! host's computation of the same step: the run fails if any is off by more than 1 %
//! (relative L2). Then each kernel of the step alone, gate off and null trace: the median
//! of 21 interleaved bursts of 20 back-to-back launches, per launch (CUDA events).
//!
//! Then the variants, `--replays` steps each, in blocks of `--block` back-to-back steps,
//! all variants in turn (the order rotated each round, one warm-up block of each first),
//! each step timed on the GPU by CUDA events around it (p50, p99, mean), its host calls
//! by `Instant`; after each block the profiler is flushed (not timed), so that each
//! block's recorded and skipped launches are its own and no block meets an earlier one's
//! draining:
//! - `graph off`: the step captured into a CUDA graph from the gate-off build (`cuGraphLaunch`);
//! - `graph null trace`: from the recorder's build, every node given a null trace;
//! - `graph profiled`: the recorder's build through `gpu_profile!`, adopted by
//!   `Profiler::graph`, every replay through `Profiler::launch_graph`;
//! - `graph 1 in N` (`--every N`): one replay in N through `Profiler::launch_graph`, the
//!   others of the null-trace graph (a second graph a user would keep);
//! - `graph 1 in N, rest off`: the same, the others through
//!   `Profiler::launch_graph_unrecorded`: the profiled graph without the recorder (its
//!   nodes are `TracedKernel`s), as a user who samples replays does;
//! - `storm off`, `storm null trace`, `storm profiled`: the step's kernels launched one
//!   by one on the stream (the gate-off build; the recorder's with a null trace;
//!   `gpu_profile!` each, as a `TracedKernel`: a launch that finds no room runs the build
//!   without the recorder).
//!
//! Slowdowns are against the gate-off step of the same kind (graph off for the graphs,
//! storm off for the storms), the null trace a row of its own; profiled rows also against
//! the null trace. *Recorded* is the share of the variant's profiled launches that were
//! recorded (the rest found their replay region or the arena in use, and ran unrecorded:
//! counted as skipped).
//!
//! After the last block: every launch of the profiler delivered, skipped or failed (none
//! failed), replays and launches as made; every delivered launch holds exactly the
//! events its kernel records (warps × ranges, nothing dropped), and these sum to the
//! profiler's count; the graphs' outputs within 1 % of the gate-off one's. The run fails
//! otherwise. The subscriber is a `PerfettoLayer` writing to a temporary file, and the
//! checking sink ([`tracing_gpu_bench::decode::Delivered`]).
//!
//! Output: the check, a table of the kernels alone, the variants' table, the counts; with
//! `--json FILE`, every figure in one JSON object (written whole or not at all).

use std::error::Error;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use tracing_gpu::cuda::cudarc::driver::{CudaContext, CudaStream, DriverError};
use tracing_gpu::cuda::{
    gpu_profile, Profiler, ProfilerError, ProfilerStats, DEFAULT_GRAPH_REGIONS,
    DEFAULT_MEMORY_LIMIT,
};
use tracing_gpu::format::KernelArg;
use tracing_gpu_bench::cli;
use tracing_gpu_bench::decode::{reference, Builds, Delivered, Node, Shape, Step, EVENTS};
use tracing_gpu_bench::device::{capture, Lead, Timer};
use tracing_gpu_bench::stats::{median, percent, quantile, Calls};
use tracing_gpu_bench::trace::PerfettoTrace;

/// One decode step as a graph and as a storm, gate off against null trace against profiled.
#[derive(Parser, Debug)]
#[command(name = "decode_step")]
struct Args {
    /// Transformer layers (32: a 7B-class depth).
    #[arg(long, default_value_t = 16, value_parser = cli::positive::<usize>)]
    layers: usize,
    /// Sequences decoded together (at most 4).
    #[arg(long, default_value_t = 1, value_parser = cli::positive::<usize>)]
    batch: usize,
    /// The residual stream's width: heads × 128.
    #[arg(long, default_value_t = 2048, value_parser = cli::positive::<usize>)]
    hidden: usize,
    /// Query heads (default hidden / 128).
    #[arg(long, value_parser = cli::positive::<usize>)]
    heads: Option<usize>,
    /// Key/value heads, a divisor of heads (default: heads).
    #[arg(long, value_parser = cli::positive::<usize>)]
    kv_heads: Option<usize>,
    /// The MLP's width, a multiple of 8 (default 2.75 × hidden).
    #[arg(long, value_parser = cli::positive::<usize>)]
    intermediate: Option<usize>,
    /// Tokens in the KV cache, the step's own included.
    #[arg(long, default_value_t = 2048, value_parser = cli::positive::<usize>)]
    tokens: usize,
    /// Steps of each variant, warm-up not counted.
    #[arg(long, default_value_t = 1000, value_parser = cli::positive::<usize>)]
    replays: usize,
    /// Back-to-back steps per block; blocks take the variants in turn.
    #[arg(long, default_value_t = 50, value_parser = cli::positive::<usize>)]
    block: usize,
    /// The sampled graph records one replay in this many.
    #[arg(long, default_value_t = 10, value_parser = cli::positive::<usize>)]
    every: usize,
    /// Records per warp slot (`ProfilerBuilder::capacity`); a warp records at most 7
    /// entries (6 ranges).
    #[arg(long, default_value_t = 8, value_parser = cli::positive::<u32>)]
    capacity: u32,
    /// Replay regions of the profiled graph (`ProfilerBuilder::graph_regions`).
    #[arg(long, default_value_t = DEFAULT_GRAPH_REGIONS, value_parser = cli::positive::<usize>)]
    regions: usize,
    /// The profiler's arena in bytes (`ProfilerBuilder::memory_limit`).
    #[arg(long, default_value_t = DEFAULT_MEMORY_LIMIT, value_parser = cli::positive::<usize>)]
    memory: usize,
    /// Skip the check against the host's reference.
    #[arg(long)]
    no_check: bool,
    /// Also write every figure here, as one JSON object.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// A define added to the kernels' build with the recorder on (`NAME=VALUE`, such as
    /// `TGPU_FORMAT=1`); repeatable. The gate-off build stays the baseline.
    #[arg(long = "define", value_name = "NAME=VALUE")]
    defines: Vec<String>,
    /// The recorder's build includes this file instead of the embedded
    /// `tracing_gpu.cuh` (a variant of the header, beside the shipped one in one call).
    #[arg(long, value_name = "FILE")]
    header: Option<PathBuf>,
    /// Before each timed block, a kernel of this many µs, not timed, so that the host has
    /// enqueued the block's launches before the GPU reaches them: the block's GPU time is
    /// then the launches' work alone, not the host's first calls after the last block's
    /// flush. 0: none.
    #[arg(long, default_value_t = 0)]
    lead_us: u64,
}

impl Args {
    fn shape(&self) -> Shape {
        let heads = self.heads.unwrap_or(self.hidden / 128);
        Shape {
            layers: self.layers,
            batch: self.batch,
            hidden: self.hidden,
            heads,
            kv_heads: self.kv_heads.unwrap_or(heads),
            intermediate: self.intermediate.unwrap_or(self.hidden * 11 / 4),
            tokens: self.tokens,
            vocab: 32_000,
        }
    }
}

fn main() -> ExitCode {
    cli::exit("decode_step", run(&Args::parse()))
}

/// What a block of steps does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    GraphOff,
    GraphNull,
    GraphProfiled,
    GraphSampled,
    GraphSampledOff,
    StormOff,
    StormNull,
    StormProfiled,
}

const VARIANTS: [Variant; 8] = [
    Variant::GraphOff,
    Variant::GraphNull,
    Variant::GraphProfiled,
    Variant::GraphSampled,
    Variant::GraphSampledOff,
    Variant::StormOff,
    Variant::StormNull,
    Variant::StormProfiled,
];

impl Variant {
    fn name(self, every: usize) -> String {
        match self {
            Variant::GraphOff => "graph off (gate off)".into(),
            Variant::GraphNull => "graph null trace".into(),
            Variant::GraphProfiled => "graph profiled, every replay".into(),
            Variant::GraphSampled => format!("graph profiled 1 in {every}, rest null trace"),
            Variant::GraphSampledOff => {
                format!("graph profiled 1 in {every}, rest unrecorded (gate off)")
            }
            Variant::StormOff => "storm off (gate off)".into(),
            Variant::StormNull => "storm null trace".into(),
            Variant::StormProfiled => "storm gpu_profile!".into(),
        }
    }

    fn key(self) -> &'static str {
        match self {
            Variant::GraphOff => "graph_off",
            Variant::GraphNull => "graph_null_trace",
            Variant::GraphProfiled => "graph_profiled",
            Variant::GraphSampled => "graph_sampled",
            Variant::GraphSampledOff => "graph_sampled_rest_off",
            Variant::StormOff => "storm_off",
            Variant::StormNull => "storm_null_trace",
            Variant::StormProfiled => "storm_profiled",
        }
    }

    /// The gate-off variant it is measured against, and its null-trace one.
    fn baselines(self) -> (Variant, Variant) {
        match self {
            Variant::StormOff | Variant::StormNull | Variant::StormProfiled => {
                (Variant::StormOff, Variant::StormNull)
            }
            _ => (Variant::GraphOff, Variant::GraphNull),
        }
    }

    fn profiled(self) -> bool {
        matches!(
            self,
            Variant::GraphProfiled
                | Variant::GraphSampled
                | Variant::GraphSampledOff
                | Variant::StormProfiled
        )
    }
}

/// One variant's figures.
#[derive(Default)]
struct Side {
    /// GPU µs of each step.
    gpu_us: Vec<f64>,
    /// The host's calls per step: one graph launch, or the storm's launch calls.
    calls: Calls,
    wall: Duration,
    steps: u64,
    /// The profiler's counts over the variant's blocks.
    launches: u64,
    delivered: u64,
    skipped: u64,
    failed: u64,
    /// Graph replays through `launch_graph`.
    replays: u64,
}

/// p50, p99 and mean of the GPU time per step.
#[derive(Clone, Copy)]
struct Gpu {
    p50: f64,
    p99: f64,
    mean: f64,
}

impl Side {
    fn gpu(&self) -> Gpu {
        let mut v = self.gpu_us.clone();
        Gpu {
            p50: quantile(&mut v, 0.5),
            p99: quantile(&mut v, 0.99),
            mean: v.iter().sum::<f64>() / v.len().max(1) as f64,
        }
    }

    fn wall_us(&self) -> f64 {
        self.wall.as_secs_f64() * 1e6 / self.steps.max(1) as f64
    }

    fn recorded_pct(&self) -> f64 {
        100.0 * self.delivered as f64 / self.launches.max(1) as f64
    }
}

/// How one step is launched in the check.
#[derive(Clone, Copy)]
enum Way {
    Off,
    Null,
    Profiled,
}

/// One step of `step` launched `way`, directly, and its output.
fn one_step(
    profiler: &Profiler,
    stream: &Arc<CudaStream>,
    step: &Step,
    way: Way,
) -> Result<Vec<u16>, ProfilerError> {
    for (i, node) in step.nodes().iter().enumerate() {
        match way {
            Way::Off => step.launch_off(stream, i)?,
            Way::Null => step.launch(stream, i, &KernelArg::default())?,
            Way::Profiled => gpu_profile!(profiler, stream, node.name, node.cfg, |trace| step
                .launch_traced(stream, i, &trace))?,
        }
    }
    Ok(step.output(stream)?)
}

/// The small model's step in every way, against the host's reference: a line each, and
/// whether all are within 1 %; also the profiled launches made.
fn check(
    profiler: &Profiler,
    builds: &Arc<Builds>,
    stream: &Arc<CudaStream>,
    json: &mut String,
) -> Result<(bool, u64), Box<dyn Error>> {
    let step = Step::new(builds, stream, Shape::check(), 7)?;
    let want = reference::step(step.shape(), &step.host(stream)?);
    let mut ok = true;
    let mut parts = Vec::new();
    for (name, way) in [
        ("gate off", Way::Off),
        ("null trace", Way::Null),
        ("gpu_profile!", Way::Profiled),
    ] {
        let (rel, max) = reference::distance(&one_step(profiler, stream, &step, way)?, &want);
        let pass = rel <= 0.01;
        ok &= pass;
        println!(
            "check ({:?}): {name}: relative L2 error {rel:.2e}, largest difference {max:.3e}: {}",
            step.shape(),
            if pass { "ok" } else { "WRONG" }
        );
        parts.push(format!(
            r#""{name}":{{"relative_l2":{},"max_abs":{},"ok":{pass}}}"#,
            num(rel),
            num(max)
        ));
    }
    write!(json, r#""check":{{{}}},"#, parts.join(","))?;
    Ok((ok, step.nodes().len() as u64))
}

/// Launches per timed burst of one kernel alone.
const ALONE_BURST: usize = 20;

/// One kernel of the step timed alone: the first node of its name.
struct Alone<'a> {
    node: &'a Node,
    /// µs per launch, gate off and null trace.
    off_us: f64,
    null_us: f64,
    /// Nodes of this name per step.
    count: usize,
}

/// µs per launch of `off` and of `null`: the medians of 21 bursts of [`ALONE_BURST`]
/// back-to-back launches each, the two interleaved (so that drift in clocks or
/// temperature falls on both alike), each burst between CUDA events and waited for.
fn time_alone(
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    mut off: impl FnMut() -> Result<(), DriverError>,
    mut null: impl FnMut() -> Result<(), DriverError>,
) -> Result<(f64, f64), DriverError> {
    let timer = Timer::new(ctx)?;
    let (mut off_ms, mut null_ms) = (Vec::with_capacity(21), Vec::with_capacity(21));
    for _ in 0..21 {
        for (f, ms) in [
            (
                &mut off as &mut dyn FnMut() -> Result<(), DriverError>,
                &mut off_ms,
            ),
            (&mut null, &mut null_ms),
        ] {
            timer.around(stream, || (0..ALONE_BURST).try_for_each(|_| f()))?;
            ms.push(timer.ms()?);
        }
    }
    let per_launch = |ms: &mut Vec<f64>| 1e3 * median(ms) / ALONE_BURST as f64;
    Ok((per_launch(&mut off_ms), per_launch(&mut null_ms)))
}

/// A number for JSON: NaN and infinities are `null`.
fn num(x: f64) -> String {
    match x.is_finite() {
        true => format!("{x:.4}"),
        false => "null".into(),
    }
}

/// Writes `text` to `path` whole (a temporary file beside it, renamed) or not at all.
fn write_whole(path: &Path, text: &str) -> Result<(), Box<dyn Error>> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all(text.as_bytes())?;
    tmp.persist(path)?;
    Ok(())
}

fn delta(after: &ProfilerStats, before: &ProfilerStats, side: &mut Side) {
    side.launches += after.launches - before.launches;
    side.delivered += after.delivered - before.delivered;
    side.skipped += after.skipped - before.skipped;
    side.failed += after.failed - before.failed;
    side.replays += after.replays - before.replays;
}

fn run(a: &Args) -> Result<bool, Box<dyn Error>> {
    let shape = a.shape();
    shape.validate()?;
    let (trace, delivered) = PerfettoTrace::with_sink("decode_step", Delivered::default())?;
    let _default = tracing::dispatcher::set_default(&trace.dispatch);
    let profiler = Profiler::builder()
        .device(0)
        .events(EVENTS)
        .capacity(a.capacity)
        .graph_regions(a.regions)
        .memory_limit(a.memory)
        .build()?;
    let ctx = profiler.context().clone();
    let stream = ctx.new_stream()?;
    let card = profiler.device().name.clone();
    let header = cli::Header::read(a.header.as_deref())?;
    let build = cli::recorder_build_with(&a.defines, header.as_ref());
    println!("decode_step on {card}; recorder build {build}");
    let mut json = format!(
        r#"{{"bench":"decode_step","card":{},"recorder_build":{},"#,
        cli::json_string(&card),
        cli::json_string(&build)
    );

    let builds = Builds::load(&profiler, &a.defines, header.as_ref())?;
    let (mut ok, mut direct) = (true, 0u64);
    if !a.no_check {
        (ok, direct) = check(&profiler, &builds, &stream, &mut json)?;
    }
    let step = Step::new(&builds, &stream, shape, 1)?;
    stream.synchronize()?;
    profiler.flush()?;
    // SAFETY: every buffer is used on `stream` alone and freed after the last
    // synchronize; the profiler tracks nothing through cudarc's slices (tracking would
    // also put event nodes in the graphs).
    unsafe { ctx.disable_event_tracking() };
    let nodes = step.nodes();
    let n = nodes.len();

    // Each kernel alone: the first node of each name, gate off and null trace, so that a
    // null-trace cost of the whole step can be traced to the kernels that carry it.
    let mut alone: Vec<Alone> = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        if alone.iter().any(|k| k.node.name == node.name) {
            continue;
        }
        let (off_us, null_us) = time_alone(
            &ctx,
            &stream,
            || step.launch_off(&stream, i),
            || step.launch(&stream, i, &KernelArg::default()),
        )?;
        let count = nodes.iter().filter(|m| m.name == node.name).count();
        alone.push(Alone {
            node,
            off_us,
            null_us,
            count,
        });
    }

    let off = capture(&stream, || {
        (0..n).try_for_each(|i| Ok(step.launch_off(&stream, i)?))
    })?;
    let null = capture(&stream, || {
        (0..n).try_for_each(|i| Ok(step.launch(&stream, i, &KernelArg::default())?))
    })?;
    let profiled = profiler.graph(capture(&stream, || {
        for (i, node) in nodes.iter().enumerate() {
            gpu_profile!(profiler, &stream, node.name, node.cfg, |trace| step
                .launch_traced(&stream, i, &trace))?;
        }
        Ok(())
    })?)?;
    if !profiled.replays_unrecorded() {
        return Err("the profiled graph has no build without the recorder".into());
    }
    if profiled.profiled_nodes() != n {
        return Err(format!(
            "the profiled graph has {} nodes, not {n}",
            profiled.profiled_nodes()
        )
        .into());
    }
    off.upload()?;
    null.upload()?;
    profiled.graph().upload()?;

    // Per block: the variant, its steps; one warm-up block of each first.
    let v = VARIANTS.len();
    let mut blocks: Vec<(usize, usize)> = (0..v).map(|k| (k, a.block)).collect();
    for r in 0..a.replays.div_ceil(a.block) {
        let count = a.block.min(a.replays - r * a.block);
        blocks.extend((0..v).map(|k| ((k + r) % v, count)));
    }
    let mut sides: Vec<Side> = VARIANTS.iter().map(|_| Side::default()).collect();
    // The first error a flush returned (a launch that did not decode: counted as failed).
    let mut flush_error: Option<ProfilerError> = None;
    // Replays made so far of each sampled variant: which ones are recorded.
    let mut made = [0usize; 8];
    // Profiled graph replays and profiled launches made (the check's included).
    let (mut made_replays, mut made_launches) = (0u64, direct);
    let timers = Timer::many(&ctx, a.block)?;
    let lead = Lead::new(&ctx, a.lead_us)?;
    for (b, &(k, count)) in blocks.iter().enumerate() {
        let variant = VARIANTS[k];
        let before = profiler.stats();
        let mut calls = Calls::default();
        let start = Instant::now();
        if let Some(lead) = &lead {
            lead.launch(&stream)?;
        }
        for timer in &timers[..count] {
            timer.record_start(&stream)?;
            let t = Instant::now();
            match variant {
                Variant::GraphOff => off.launch()?,
                Variant::GraphNull => null.launch()?,
                Variant::GraphProfiled => {
                    profiler.launch_graph(&profiled, &stream, "decode_step")?;
                    made_replays += 1;
                }
                Variant::GraphSampled | Variant::GraphSampledOff => {
                    match (made[k] % a.every == 0, variant) {
                        (true, _) => {
                            profiler.launch_graph(&profiled, &stream, "decode_step")?;
                            made_replays += 1;
                        }
                        (false, Variant::GraphSampled) => null.launch()?,
                        (false, _) => {
                            profiler.launch_graph_unrecorded(&profiled, &stream)?;
                            made_replays += 1;
                        }
                    }
                    made[k] += 1;
                }
                Variant::StormOff => (0..n).try_for_each(|i| step.launch_off(&stream, i))?,
                Variant::StormNull => {
                    (0..n).try_for_each(|i| step.launch(&stream, i, &KernelArg::default()))?
                }
                Variant::StormProfiled => {
                    for (i, node) in nodes.iter().enumerate() {
                        gpu_profile!(profiler, &stream, node.name, node.cfg, |trace| step
                            .launch_traced(&stream, i, &trace))?;
                    }
                    made_launches += n as u64;
                }
            }
            calls.record(t.elapsed());
            timer.record_end(&stream)?;
        }
        stream.synchronize()?;
        let wall = start.elapsed();
        // Not timed: the block's launches delivered before the next block starts.
        if let Err(e) = profiler.flush() {
            flush_error.get_or_insert(e);
        }
        if b < v {
            continue;
        }
        let side = &mut sides[k];
        delta(&profiler.stats(), &before, side);
        for timer in &timers[..count] {
            side.gpu_us.push(timer.ms()? * 1e3);
        }
        side.calls.add(&calls);
        side.wall += wall;
        side.steps += count as u64;
    }

    // The graphs' outputs in every build, against the gate-off one.
    off.launch()?;
    let gate_off = step.output(&stream)?;
    null.launch()?;
    let null_trace = step.output(&stream)?;
    profiler.launch_graph(&profiled, &stream, "decode_step")?;
    made_replays += 1;
    let recorded = step.output(&stream)?;
    let identical = gate_off == null_trace && gate_off == recorded;
    // Not required to be bit for bit (the builds may contract or order floating point
    // differently): within the check's 1 %.
    let distance = [&null_trace, &recorded]
        .map(|o| reference::distance(o, &gate_off).0)
        .into_iter()
        .fold(0.0, f64::max);
    let same_output = distance <= 0.01;
    made_launches += made_replays * n as u64;
    drop(profiled);
    if let Err(e) = profiler.flush() {
        flush_error.get_or_insert(e);
    }
    let stats = profiler.stats();
    drop(profiler);
    let tally = delivered.tally();
    let written = trace.finish()?;
    ok &= same_output;
    if let Some(e) = &flush_error {
        println!("a flush of the profiler failed: {e}");
        ok = false;
    }

    // Counts: every launch as made, and accounted for.
    let launches_made = made_launches;
    let counted = stats.delivered + stats.skipped + stats.failed;
    let counts_ok = stats.launches == launches_made
        && stats.replays == made_replays
        && stats.launches == counted
        && stats.failed == 0
        && stats.events_lost == 0
        && tally.batches == stats.delivered
        && tally.events == stats.events
        && tally.wrong == 0;
    ok &= counts_ok;

    let s = &shape;
    println!(
        "model: {} layers, batch {}, hidden {}, {} heads × 128 ({} kv heads), intermediate {}, \
         {} tokens cached ({} splits); {} kernels per step, {:.1} MB of weights per layer; \
         {} events per step ({:.1} MB of trace per recorded step), {} records per warp, {} replay regions",
        s.layers,
        s.batch,
        s.hidden,
        s.heads,
        s.kv_heads,
        s.intermediate,
        s.tokens,
        s.splits(),
        n,
        s.layer_weight_bytes() as f64 / 1e6,
        step.events(),
        nodes
            .iter()
            .map(|m| tracing_gpu::format::wire::buffer_size(m.warps() as u32, a.capacity).unwrap_or(0))
            .sum::<usize>() as f64
            / 1e6,
        a.capacity,
        a.regions
    );
    println!(
        "\n| kernel alone, {ALONE_BURST} back to back | off µs | null trace µs | null vs off | per step | grid | threads | warps | events per launch |"
    );
    println!("|---|---:|---:|---:|---:|---|---:|---:|---:|");
    let mut json_alone = Vec::new();
    for k in &alone {
        let (node, name, count) = (k.node, k.node.name, k.count);
        let g = node.cfg.grid_dim;
        println!(
            "| {name} | {:.2} | {:.2} | {:+.2} % | {count} | {}×{}×{} | {} | {} | {} |",
            k.off_us,
            k.null_us,
            percent(k.off_us, k.null_us),
            g.0,
            g.1,
            g.2,
            node.cfg.block_dim.0,
            node.warps(),
            node.events()
        );
        json_alone.push(format!(
            r#""{name}":{{"us":{},"null_trace_us":{},"per_step":{count},"warps":{},"events":{}}}"#,
            num(k.off_us),
            num(k.null_us),
            node.warps(),
            node.events()
        ));
    }
    let sum_alone: f64 = alone.iter().map(|k| k.off_us * k.count as f64).sum();
    let sum_null: f64 = alone.iter().map(|k| k.null_us * k.count as f64).sum();
    println!(
        "sum of the kernels alone per step: {sum_alone:.1} µs off, {sum_null:.1} µs null trace ({:+.2} %)",
        percent(sum_alone, sum_null)
    );

    let gpu: Vec<Gpu> = sides.iter().map(Side::gpu).collect();
    let at = |w: Variant| VARIANTS.iter().position(|&x| x == w).expect("a variant");
    println!(
        "\n{} steps of each variant in blocks of {}; GPU µs per step by CUDA events; slowdowns \
         of the mean against **off** of the same kind (the gate-off build), and against its null trace",
        a.replays, a.block
    );
    println!("| step | GPU p50 µs | GPU p99 µs | GPU mean µs | **vs off** | vs null trace | wall per step µs | host calls p50 / p99 µs | recorded |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut json_sides = Vec::new();
    for (k, variant) in VARIANTS.iter().enumerate() {
        let (off_v, null_v) = variant.baselines();
        let (g, base, nullg) = (gpu[k], gpu[at(off_v)], gpu[at(null_v)]);
        let side = &sides[k];
        let vs_off = percent(base.mean, g.mean);
        let vs_null = percent(nullg.mean, g.mean);
        let show_off = *variant != off_v;
        let show_null = variant.profiled();
        println!(
            "| {} | {:.1} | {:.1} | {:.1} | {} | {} | {:.1} | {:.2} / {:.2} | {} |",
            variant.name(a.every),
            g.p50,
            g.p99,
            g.mean,
            if show_off {
                format!("**{vs_off:+.2} %**")
            } else {
                "baseline".into()
            },
            if show_null {
                format!("{vs_null:+.2} %")
            } else {
                String::new()
            },
            side.wall_us(),
            side.calls.us(0.5),
            side.calls.us(0.99),
            if variant.profiled() {
                format!("{:.1} %", side.recorded_pct())
            } else {
                String::new()
            },
        );
        json_sides.push(format!(
            r#""{}":{{"gpu_p50_us":{},"gpu_p99_us":{},"gpu_mean_us":{},"vs_off_mean_pct":{},"vs_off_p50_pct":{},"vs_null_trace_mean_pct":{},"baseline":"{}","wall_per_step_us":{},"call_p50_us":{},"call_p99_us":{},"steps":{},"launches":{},"delivered":{},"skipped":{},"failed":{},"replays":{}}}"#,
            variant.key(),
            num(g.p50),
            num(g.p99),
            num(g.mean),
            if show_off { num(vs_off) } else { "null".into() },
            if show_off { num(percent(base.p50, g.p50)) } else { "null".into() },
            if show_null { num(vs_null) } else { "null".into() },
            off_v.key(),
            num(side.wall_us()),
            num(side.calls.us(0.5)),
            num(side.calls.us(0.99)),
            side.steps,
            side.launches,
            side.delivered,
            side.skipped,
            side.failed,
            side.replays,
        ));
    }
    println!(
        "\ncounts: launches {} (made {launches_made}) = delivered {} + skipped {} + failed {}; \
         replays {}; events {} (sink: {} in {} batches, {} wrong{}), dropped {}; outputs of the \
         three graphs {} (relative L2 {:.1e} at most): {}; memory {:.1} MB; Perfetto trace {:.1} MB",
        stats.launches,
        stats.delivered,
        stats.skipped,
        stats.failed,
        stats.replays,
        stats.events,
        tally.events,
        tally.batches,
        tally.wrong,
        tally
            .first_wrong
            .as_ref()
            .map(|w| format!(", first: {w}"))
            .unwrap_or_default(),
        stats.events_lost,
        match (identical, same_output) {
            (true, _) => "identical",
            (false, true) => "close",
            (false, false) => "DIFFERENT",
        },
        distance,
        if ok { "ok" } else { "MISMATCH" },
        stats.memory_bytes as f64 / 1e6,
        written.bytes as f64 / 1e6
    );
    write!(
        json,
        r#""shape":{{"layers":{},"batch":{},"hidden":{},"heads":{},"kv_heads":{},"intermediate":{},"tokens":{},"head_dim":128}},"kernels_per_step":{n},"events_per_step":{},"replays":{},"block":{},"every":{},"capacity":{},"regions":{},"memory":{},"kernels_alone":{{{}}},"sum_of_kernels_alone_us":{},"sum_of_kernels_alone_null_trace_us":{},"variants":{{{}}},"stats":{{"launches":{},"launches_made":{launches_made},"replays":{},"delivered":{},"skipped":{},"failed":{},"events":{},"events_lost":{},"memory_bytes":{}}},"sink":{{"batches":{},"events":{},"wrong":{}}},"outputs":{{"identical":{identical},"relative_l2":{},"ok":{same_output}}},"perfetto_bytes":{},"counts_ok":{counts_ok},"ok":{ok}}}"#,
        s.layers,
        s.batch,
        s.hidden,
        s.heads,
        s.kv_heads,
        s.intermediate,
        s.tokens,
        step.events(),
        a.replays,
        a.block,
        a.every,
        a.capacity,
        a.regions,
        a.memory,
        json_alone.join(","),
        num(sum_alone),
        num(sum_null),
        json_sides.join(","),
        stats.launches,
        stats.replays,
        stats.delivered,
        stats.skipped,
        stats.failed,
        stats.events,
        stats.events_lost,
        stats.memory_bytes,
        tally.batches,
        tally.events,
        tally.wrong,
        num(distance),
        written.bytes,
    )?;
    if let Some(path) = &a.json {
        write_whole(path, &json)?;
    }
    Ok(ok)
}
