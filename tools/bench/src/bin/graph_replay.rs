//! A CUDA graph of short kernels replayed, gate off against null trace against profiled
//! (issues #12, #28): what `Profiler::launch_graph` adds per replay and per kernel node
//! over the kernel a user ships, and whether every node of every replay is delivered or
//! counted.
//!
//! ```text
//! cargo run --release -p tracing-gpu-bench --bin graph_replay -- [--nodes 100] [--replays 1000] \
//!     [--block 50] [--capacity 16] [--regions 4] [--memory BYTES] [--work 1024] [--profiled N] \
//!     [--drain] [--define NAME=VALUE] [--header FILE] [--lead-us US]
//! ```
//!
//! Three graphs of `--nodes` launches of [`tracing_gpu_bench::short`]'s kernel are
//! captured on a stream of their own (`CU_STREAM_CAPTURE_MODE_GLOBAL`): *off*, the
//! kernel built without the recorder (the gate off: the graph a user ships); *null
//! trace*, the kernel built with the recorder, every node given a null trace; and
//! *profiled*, the recorder's build through `gpu_profile!` (which puts the prologue in
//! front; the kernel a `TracedKernel`, so that a replay launched while every replay
//! region is in flight runs the graph built without the recorder), adopted by
//! `Profiler::graph`. Each is replayed `--replays` times, in blocks
//! of `--block` back-to-back replays, the three in turn (`CudaGraph::launch` for off
//! and null trace, `Profiler::launch_graph` for profiled; the order rotated each round,
//! after one warm-up block of each, not counted). Per variant: the replay call (p50,
//! p99, `Instant`), the wall time per replay (a block's calls and its synchronize, over
//! its replays), the GPU time per replay (CUDA events around the block, over its
//! replays), both per kernel node. Then what each adds, named by its baseline:
//! *profiled vs off* (the headline: what profiling costs the graph a user ships),
//! *null trace vs off* (what the compiled-in recorder costs when it records nothing),
//! and *profiled vs null trace* (what the profiler adds beyond the compiled-in
//! recorder), each in µs and in %. `--regions` is `ProfilerBuilder::graph_regions`:
//! replays in flight beyond it are skipped. `--profiled N` profiles only the profiled
//! graph's first N nodes (the others are launched as in the null-trace graph): with
//! N = 1 the slowdown is what a replay pays once, its prologue node and one recorded
//! node, apart from what every node pays. Replays that find no free region run
//! unrecorded, so by default the profiled row mixes recorded and skipped replays;
//! `--drain --block B` with B ≤ `--regions` flushes after each profiled block (not
//! timed) and records every replay.
//!
//! After `Profiler::flush`: replays must be the profiled replays made, launches
//! replays × nodes, and launches = delivered + skipped + failed; the run fails
//! otherwise. The subscriber is a `PerfettoLayer` writing to a temporary file.
//!
//! Output: a table, then one JSON line (`{"bench":"graph_replay",...}`: per variant
//! `off`, `null_trace`, `profiled`; the slowdowns `slowdown_vs_off_pct`,
//! `null_trace_vs_off_pct`, `slowdown_vs_null_pct`, each `{"wall":…,"gpu":…}`).

use std::error::Error;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;

use tracing_gpu::cuda::{
    gpu_profile, Profiler, ProfilerError, DEFAULT_GRAPH_REGIONS, DEFAULT_MEMORY_LIMIT,
};
use tracing_gpu::format::KernelArg;
use tracing_gpu_bench::cli;
use tracing_gpu_bench::device::{capture, Lead, Timer};
use tracing_gpu_bench::quickstart;
use tracing_gpu_bench::short::Short;
use tracing_gpu_bench::stats::{percent, Calls};
use tracing_gpu_bench::trace::PerfettoTrace;

/// A graph of short kernels replayed, gate off against null trace against profiled.
#[derive(Parser, Debug)]
#[command(name = "graph_replay")]
struct Args {
    /// Kernel nodes of each graph.
    #[arg(long, default_value_t = 100, value_parser = cli::positive::<usize>)]
    nodes: usize,
    /// Replays of each graph, warm-up not counted.
    #[arg(long, default_value_t = 1000, value_parser = cli::positive::<usize>)]
    replays: usize,
    /// Back-to-back replays per block; blocks take off, null trace and profiled in turn.
    #[arg(long, default_value_t = 50, value_parser = cli::positive::<usize>)]
    block: usize,
    /// Records per warp slot (`ProfilerBuilder::capacity`); each warp records 4.
    #[arg(long, default_value_t = 16, value_parser = cli::positive::<u32>)]
    capacity: u32,
    /// Replay regions of the profiled graph (`ProfilerBuilder::graph_regions`).
    #[arg(long, default_value_t = DEFAULT_GRAPH_REGIONS, value_parser = cli::positive::<usize>)]
    regions: usize,
    /// The profiler's arena in bytes (`ProfilerBuilder::memory_limit`).
    #[arg(long, default_value_t = DEFAULT_MEMORY_LIMIT, value_parser = cli::positive::<usize>)]
    memory: usize,
    /// Dependent FMAs per thread: each kernel's length.
    #[arg(long, default_value_t = 1024, value_parser = cli::positive::<u32>)]
    work: u32,
    /// Blocks per kernel (default: one per SM); fewer blocks record fewer events.
    #[arg(long, value_parser = cli::positive::<u32>)]
    blocks: Option<u32>,
    /// Profiled nodes, the first of the profiled graph (default: every node); the others
    /// are launched with a null trace, as in the null-trace graph.
    #[arg(long, value_parser = cli::positive::<usize>)]
    profiled: Option<usize>,
    /// A define added to the kernel's build with the recorder on (`NAME=VALUE`, such as
    /// `TGPU_FORMAT=1`); repeatable. The gate-off build stays the baseline.
    #[arg(long = "define", value_name = "NAME=VALUE")]
    defines: Vec<String>,
    /// The build with the recorder on includes this file instead of the embedded
    /// `tracing_gpu.cuh` (a variant of the header, beside the shipped one in one call).
    #[arg(long, value_name = "FILE")]
    header: Option<PathBuf>,
    /// Before each timed block, a kernel of this many µs, not timed, so that the host has
    /// enqueued the block's launches before the GPU reaches them: the block's GPU time is
    /// then the launches' work alone, not the host's first calls after the last block's
    /// flush. 0: none.
    #[arg(long, default_value_t = 0)]
    lead_us: u64,
    /// Flush the profiler after each profiled block (not timed), as `decode_step` does:
    /// with `--block` at most `--regions`, every profiled replay is recorded, so the
    /// profiled row is what a recorded replay costs, not a mix with skipped ones.
    #[arg(long)]
    drain: bool,
}

fn main() -> ExitCode {
    cli::exit("graph_replay", run(&Args::parse()))
}

/// One variant's figures.
#[derive(Default)]
struct Side {
    calls: Calls,
    wall: Duration,
    gpu_ms: f64,
    replays: u64,
}

impl Side {
    fn wall_us(&self) -> f64 {
        self.wall.as_secs_f64() * 1e6 / self.replays as f64
    }
    fn gpu_us(&self) -> f64 {
        self.gpu_ms * 1e3 / self.replays as f64
    }
}

/// The variants, in their table's order (the index of their `Side`).
const OFF: usize = 0;
const NULL: usize = 1;
const PROFILED: usize = 2;
const NAMES: [&str; 3] = [
    "off: gate off (cuGraphLaunch)",
    "null trace (cuGraphLaunch)",
    "profiled (Profiler::launch_graph)",
];

fn run(a: &Args) -> Result<bool, Box<dyn Error>> {
    let trace = PerfettoTrace::new("graph_replay")?;
    let _default = tracing::dispatcher::set_default(&trace.dispatch);
    let profiler = Profiler::builder()
        .device(0)
        .events(quickstart::EVENTS)
        .capacity(a.capacity)
        .graph_regions(a.regions)
        .memory_limit(a.memory)
        .build()?;
    let header = cli::Header::read(a.header.as_deref())?;
    let short = Short::load(&profiler, a.work, a.blocks, &a.defines, header.as_ref())?;
    let ctx = profiler.context().clone();
    let stream = ctx.new_stream()?;
    let mut b = short.buffers(&stream)?;
    stream.synchronize()?;
    // SAFETY: the buffers were allocated on `stream`, are used there alone, and are
    // freed after the last synchronize; the profiler tracks nothing through cudarc's
    // slices. (Tracking would also put event nodes in the graphs.)
    unsafe { ctx.disable_event_tracking() };

    let off = capture(&stream, || {
        for _ in 0..a.nodes {
            short.launch_off(&stream, &mut b)?;
        }
        Ok(())
    })?;
    let null = capture(&stream, || {
        for _ in 0..a.nodes {
            short.launch(&stream, &mut b, &KernelArg::default())?;
        }
        Ok(())
    })?;
    let cfg = short.cfg();
    let wanted = a.profiled.unwrap_or(a.nodes).min(a.nodes);
    let profiled = profiler.graph(capture(&stream, || {
        for i in 0..a.nodes {
            match i < wanted {
                true => gpu_profile!(profiler, &stream, "tiled_poly", cfg, |trace| short
                    .launch_traced(&stream, &mut b, &trace))?,
                false => short.launch(&stream, &mut b, &KernelArg::default())?,
            }
        }
        Ok(())
    })?)?;
    if profiled.profiled_nodes() != wanted {
        return Err(format!(
            "the profiled graph has {} profiled nodes, not {wanted}",
            profiled.profiled_nodes(),
        )
        .into());
    }
    off.upload()?;
    null.upload()?;
    profiled.graph().upload()?;

    // Per block: the variant, its replays; one warm-up block of each first.
    let mut blocks: Vec<(usize, usize)> = (0..NAMES.len()).map(|v| (v, a.block)).collect();
    for r in 0..a.replays.div_ceil(a.block) {
        let count = a.block.min(a.replays - r * a.block);
        // Each round in another order, so that no variant always follows the same one.
        blocks.extend((0..NAMES.len()).map(|k| ((k + r) % NAMES.len(), count)));
    }
    let made: u64 = blocks
        .iter()
        .filter(|(v, _)| *v == PROFILED)
        .map(|(_, n)| *n as u64)
        .sum();
    let mut sides: [Side; 3] = Default::default();
    let timer = Timer::new(&ctx)?;
    let lead = Lead::new(&ctx, a.lead_us)?;
    for (i, &(v, count)) in blocks.iter().enumerate() {
        let mut calls = Calls::default();
        let start = Instant::now();
        if let Some(lead) = &lead {
            lead.launch(&stream)?;
        }
        timer.around(&stream, || {
            for _ in 0..count {
                let t = Instant::now();
                match v {
                    OFF => off.launch()?,
                    NULL => null.launch()?,
                    _ => profiler.launch_graph(&profiled, &stream, "storm_graph")?,
                }
                calls.record(t.elapsed());
            }
            Ok::<(), ProfilerError>(())
        })?;
        stream.synchronize()?;
        let wall = start.elapsed();
        let gpu_ms = timer.ms()?;
        if a.drain && v == PROFILED {
            profiler.flush()?;
        }
        if i >= NAMES.len() {
            let side = &mut sides[v];
            side.calls.add(&calls);
            side.wall += wall;
            side.gpu_ms += gpu_ms;
            side.replays += count as u64;
        }
    }
    profiler.flush()?;
    let stats = profiler.stats();
    drop(profiled);
    drop(profiler);
    let written = trace.finish()?;

    let nodes = wanted as u64;
    let counted = stats.delivered + stats.skipped + stats.failed;
    let ok = stats.replays == made && stats.launches == made * nodes && stats.launches == counted;
    let n = a.nodes as f64;
    println!(
        "graph_replay: a graph of {} tiled_poly nodes ({}×{} threads, work {}; {wanted} profiled), \
         {} replays of each variant in blocks of {}; {} records per warp, {} replay regions; \
         recorder build {}",
        a.nodes,
        cfg.grid_dim.0,
        cfg.block_dim.0,
        a.work,
        a.replays,
        a.block,
        a.capacity,
        a.regions,
        cli::recorder_build_with(&a.defines, header.as_ref())
    );
    println!("| replay | call p50 µs | call p99 µs | wall per replay µs | GPU per replay µs | wall per node µs | GPU per node µs |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (name, s) in NAMES.iter().zip(&sides) {
        println!(
            "| {name} | {:.2} | {:.2} | {:.1} | {:.1} | {:.3} | {:.3} |",
            s.calls.us(0.5),
            s.calls.us(0.99),
            s.wall_us(),
            s.gpu_us(),
            s.wall_us() / n,
            s.gpu_us() / n
        );
    }
    // What `x` adds over its baseline `base`, as a row; the wall and GPU slowdowns in %.
    let added = |name: &str, x: &Side, base: &Side| {
        let (wall_pct, gpu_pct) = (
            percent(base.wall_us(), x.wall_us()),
            percent(base.gpu_us(), x.gpu_us()),
        );
        println!(
            "| {name} | {:+.2} | {:+.2} | {:+.1} ({wall_pct:+.1} %) | {:+.1} ({gpu_pct:+.1} %) | {:+.3} | {:+.3} |",
            x.calls.us(0.5) - base.calls.us(0.5),
            x.calls.us(0.99) - base.calls.us(0.99),
            x.wall_us() - base.wall_us(),
            x.gpu_us() - base.gpu_us(),
            (x.wall_us() - base.wall_us()) / n,
            (x.gpu_us() - base.gpu_us()) / n
        );
        format!(r#"{{"wall":{wall_pct:.2},"gpu":{gpu_pct:.2}}}"#)
    };
    let vs_off = added("**added: profiled vs off**", &sides[PROFILED], &sides[OFF]);
    let null_vs_off = added("added: null trace vs off", &sides[NULL], &sides[OFF]);
    let vs_null = added(
        "added: profiled vs null trace",
        &sides[PROFILED],
        &sides[NULL],
    );
    println!(
        "counts: {made} profiled replays made, replays {}; launches {} (= {made} × {nodes}) = delivered {} \
         + skipped {} + failed {}: {}; events {}, lost {}; memory {:.1} MB; Perfetto trace {:.1} MB",
        stats.replays,
        stats.launches,
        stats.delivered,
        stats.skipped,
        stats.failed,
        if ok { "ok" } else { "MISMATCH" },
        stats.events,
        stats.events_lost,
        stats.memory_bytes as f64 / 1e6,
        written.bytes as f64 / 1e6
    );
    let side = |s: &Side| {
        format!(
            r#"{{"call_p50_us":{:.3},"call_p99_us":{:.3},"wall_per_replay_us":{:.3},"gpu_per_replay_us":{:.3}}}"#,
            s.calls.us(0.5),
            s.calls.us(0.99),
            s.wall_us(),
            s.gpu_us()
        )
    };
    println!(
        r#"{{"bench":"graph_replay","recorder_build":{},"nodes":{},"profiled_nodes":{nodes},"replays":{},"block":{},"work":{},"capacity":{},"regions":{},"off":{},"null_trace":{},"profiled":{},"slowdown_vs_off_pct":{vs_off},"null_trace_vs_off_pct":{null_vs_off},"slowdown_vs_null_pct":{vs_null},"made":{made},"stats_replays":{},"stats_launches":{},"delivered":{},"skipped":{},"failed":{},"events":{},"memory_bytes":{},"counts_ok":{ok}}}"#,
        cli::json_string(&cli::recorder_build_with(&a.defines, header.as_ref())),
        a.nodes,
        a.replays,
        a.block,
        a.work,
        a.capacity,
        a.regions,
        side(&sides[OFF]),
        side(&sides[NULL]),
        side(&sides[PROFILED]),
        stats.replays,
        stats.launches,
        stats.delivered,
        stats.skipped,
        stats.failed,
        stats.events,
        stats.memory_bytes,
    );
    Ok(ok)
}
