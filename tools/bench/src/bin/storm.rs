//! A storm of short launches, plain against profiled (issue #12): what `gpu_profile!`
//! adds to a launch call when launches come back to back, what the GPU then does, and
//! whether every profiled launch is delivered or counted.
//!
//! ```text
//! cargo run --release -p tracing-gpu-bench --bin storm -- [--launches 100000] [--threads 1] \
//!     [--stream legacy|own] [--capacity 16] [--memory BYTES] [--work 1024] [--block 1000] \
//!     [--blocks N] [--settle]
//! ```
//!
//! The kernel is [`tracing_gpu_bench::short`]'s (one block of 128 threads per SM, or
//! `--blocks`, a few µs; the plain launch passes a null trace). Four variants:
//! - *plain*: the launch alone;
//! - *floor*: the launch, then the driver calls the profiled launch makes besides
//!   it (`cuStreamIsCapturing`, skipped on the legacy stream, which cannot capture;
//!   `cuEventRecord` of one reused event): what the design cannot go under;
//! - *no subscriber*: `gpu_profile!` with no subscriber (the launch span disabled);
//! - *gpu_profile!*: with the Perfetto layer, the launch span included.
//!
//! `--launches` launch calls of each variant are made in blocks of `--block`, the
//! variants in turn (one warm-up block of each first, not counted), by `--threads`
//! threads in step (each block starts
//! on all threads at once and ends when all have synchronized): on the legacy stream,
//! or each thread on a stream of its own (`--stream own`). Each launch call is timed
//! with `Instant` (p50, p99, mean over all calls of all threads). With `--settle`, the
//! collector is waited for after each block (`Profiler::flush`, not timed), so that no
//! block's calls meet the draining of an earlier block's launches. The subscriber is a
//! `PerfettoLayer` writing to a temporary file, so the launch span is recorded.
//!
//! The GPU side: *kernel alone* is the median of 101 launches timed by CUDA events,
//! each alone on the GPU; *wall per launch* is the blocks' wall time (first launch call
//! to last synchronize) per launch; *GPU busy* is launches × kernel alone / wall: the
//! share of the storm's wall time the GPU needs for the kernels (1: the host kept the
//! GPU fed; below: the GPU waited for launch calls; above 1 when several streams'
//! kernels overlap). *Peak arena in use* is `ProfilerStats::arena_in_use` read at the
//! end of each profiled block, before its synchronize, where the queue is longest.
//! After `Profiler::flush`, launches must equal delivered + skipped + failed, and be
//! the number of profiled launch calls made; the run fails otherwise.
//!
//! cudarc's event tracking is switched off (each thread's buffers are used on its
//! stream alone), so that the plain launch is one driver call.
//!
//! Output: a table, then one JSON line (`{"bench":"storm",...}`).

use std::error::Error;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use clap::Parser;
use parking_lot::Mutex;
use tracing_gpu::cuda::cudarc::driver::{result, sys, CudaStream, DriverError};
use tracing_gpu::cuda::{gpu_profile, Profiler, ProfilerError, DEFAULT_MEMORY_LIMIT};
use tracing_gpu::format::KernelArg;
use tracing_gpu_bench::cli::{self, StreamKind};
use tracing_gpu_bench::device::Timer;
use tracing_gpu_bench::quickstart;
use tracing_gpu_bench::short::{Buffers, Short};
use tracing_gpu_bench::stats::Calls;
use tracing_gpu_bench::trace::PerfettoTrace;

/// Short launches back to back, plain against profiled.
#[derive(Parser, Debug)]
#[command(name = "storm")]
struct Args {
    /// Launch calls of each variant (all threads together), warm-up not counted.
    #[arg(long, default_value_t = 100_000, value_parser = cli::positive::<usize>)]
    launches: usize,
    /// Launching threads, in step.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    threads: u16,
    /// The stream: the legacy one for all threads, or one of its own per thread.
    #[arg(long, value_enum, default_value_t = StreamKind::Legacy)]
    stream: StreamKind,
    /// Records per warp slot (`ProfilerBuilder::capacity`); each warp records 4.
    #[arg(long, default_value_t = 16, value_parser = cli::positive::<u32>)]
    capacity: u32,
    /// The profiler's arena in bytes (`ProfilerBuilder::memory_limit`).
    #[arg(long, default_value_t = DEFAULT_MEMORY_LIMIT, value_parser = cli::positive::<usize>)]
    memory: usize,
    /// Dependent FMAs per thread: the kernel's length.
    #[arg(long, default_value_t = 1024, value_parser = cli::positive::<u32>)]
    work: u32,
    /// Launch calls per block (all threads together); blocks take the variants in turn.
    #[arg(long, default_value_t = 1000, value_parser = cli::positive::<usize>)]
    block: usize,
    /// Blocks per launch (default: one per SM); fewer blocks record fewer events.
    #[arg(long, value_parser = cli::positive::<u32>)]
    blocks: Option<u32>,
    /// After each block, wait until the collector has delivered every launch
    /// (`Profiler::flush`, not timed), so that no block runs beside the draining
    /// of an earlier one: each variant's calls then meet only their own drain.
    #[arg(long)]
    settle: bool,
}

/// What a block of launch calls does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    Plain,
    Floor,
    Unsubscribed,
    Profiled,
}

impl Variant {
    const ALL: [Variant; 4] = [
        Variant::Plain,
        Variant::Floor,
        Variant::Unsubscribed,
        Variant::Profiled,
    ];

    fn name(self) -> &'static str {
        match self {
            Variant::Plain => "plain",
            Variant::Floor => "floor (+ driver calls)",
            Variant::Unsubscribed => "gpu_profile!, no subscriber",
            Variant::Profiled => "gpu_profile!, Perfetto layer",
        }
    }

    fn key(self) -> &'static str {
        match self {
            Variant::Plain => "plain",
            Variant::Floor => "floor",
            Variant::Unsubscribed => "unsubscribed",
            Variant::Profiled => "profiled",
        }
    }

    fn profiled(self) -> bool {
        matches!(self, Variant::Unsubscribed | Variant::Profiled)
    }
}

fn main() -> ExitCode {
    cli::exit("storm", run(&Args::parse()))
}

/// One variant's figures.
#[derive(Default)]
struct Side {
    calls: Calls,
    wall: Duration,
    launches: u64,
    kernel_us: f64,
}

impl Side {
    fn wall_per_launch_us(&self) -> f64 {
        self.wall.as_secs_f64() * 1e6 / self.launches as f64
    }
    fn busy(&self) -> f64 {
        self.launches as f64 * self.kernel_us / (self.wall.as_secs_f64() * 1e6)
    }
    fn json(&self) -> String {
        format!(
            r#"{{"p50_us":{:.3},"p99_us":{:.3},"mean_us":{:.3},"wall_per_launch_us":{:.3},"kernel_us":{:.3},"busy":{:.3}}}"#,
            self.calls.us(0.5),
            self.calls.us(0.99),
            self.calls.mean_us(),
            self.wall_per_launch_us(),
            self.kernel_us,
            self.busy()
        )
    }
}

/// The storm's schedule and what its threads share.
struct Storm<'a> {
    profiler: &'a Profiler,
    short: &'a Short,
    threads: usize,
    /// `Args::settle`.
    settle: bool,
    /// Per block: the variant, launch calls (all threads). The first four are warm-up.
    blocks: Vec<(Variant, usize)>,
    barrier: Barrier,
    failed: AtomicBool,
    error: Mutex<Option<ProfilerError>>,
}

/// What one thread measured: calls per variant; thread 0 also the walls and the peak.
#[derive(Default)]
struct Tally {
    sides: [Side; 4],
    peak_in_use: u64,
}

const WARM_UP: usize = Variant::ALL.len();

impl Storm<'_> {
    /// Thread `t`'s part of every block, in step with the others. An error stops
    /// every thread at the next block (each still meets the barriers).
    fn thread(&self, t: usize, stream: &Arc<CudaStream>, b: &mut Buffers) -> Tally {
        let mut tally = Tally::default();
        if let Err(e) = self.profiler.context().bind_to_thread() {
            self.fail(e.into());
        }
        let event = match Event::new() {
            Ok(e) => e,
            Err(e) => {
                self.fail(e.into());
                Event(std::ptr::null_mut())
            }
        };
        for (i, &(variant, count)) in self.blocks.iter().enumerate() {
            self.barrier.wait();
            if self.failed.load(Ordering::Relaxed) {
                break;
            }
            let start = Instant::now();
            let mut calls = Calls::default();
            let mine = count / self.threads + usize::from(t < count % self.threads);
            let peak = &mut tally.peak_in_use;
            let none = tracing::Dispatch::none();
            let result = match variant {
                Variant::Unsubscribed => tracing::dispatcher::with_default(&none, || {
                    self.block(t == 0, variant, mine, stream, b, &event, &mut calls, peak)
                }),
                _ => self.block(t == 0, variant, mine, stream, b, &event, &mut calls, peak),
            };
            if let Err(e) = result {
                self.fail(e);
            }
            self.barrier.wait();
            let wall = start.elapsed();
            if self.settle && t == 0 {
                if let Err(e) = self.profiler.flush() {
                    self.fail(e);
                }
            }
            if i >= WARM_UP {
                let side = &mut tally.sides[variant as usize];
                side.calls.add(&calls);
                side.wall += wall;
                side.launches += count as u64;
            }
        }
        tally
    }

    fn fail(&self, e: ProfilerError) {
        self.error.lock().get_or_insert(e);
        self.failed.store(true, Ordering::Relaxed);
    }

    /// `count` launch calls, each timed, then the synchronize.
    #[allow(clippy::too_many_arguments)]
    fn block(
        &self,
        sample: bool,
        variant: Variant,
        count: usize,
        stream: &Arc<CudaStream>,
        b: &mut Buffers,
        event: &Event,
        calls: &mut Calls,
        peak: &mut u64,
    ) -> Result<(), ProfilerError> {
        let (short, cfg) = (self.short, self.short.cfg());
        for _ in 0..count {
            let t = Instant::now();
            match variant {
                Variant::Plain => short.launch(stream, b, &KernelArg::default())?,
                Variant::Floor => {
                    short.launch(stream, b, &KernelArg::default())?;
                    event.after_capture_check(stream)?;
                }
                Variant::Unsubscribed | Variant::Profiled => {
                    gpu_profile!(self.profiler, stream, "tiled_poly", cfg, |trace| short
                        .launch(stream, b, &trace))?
                }
            }
            calls.record(t.elapsed());
        }
        if sample && variant == Variant::Profiled {
            *peak = (*peak).max(self.profiler.stats().arena_in_use);
        }
        stream.synchronize()?;
        Ok(())
    }
}

fn run(a: &Args) -> Result<bool, Box<dyn Error>> {
    let trace = PerfettoTrace::new("storm")?;
    let _default = tracing::dispatcher::set_default(&trace.dispatch);
    let profiler = Profiler::builder()
        .device(0)
        .events(quickstart::EVENTS)
        .capacity(a.capacity)
        .memory_limit(a.memory)
        .build()?;
    let threads = usize::from(a.threads);
    let short = Short::load(&profiler, a.work, a.blocks)?;
    let ctx = profiler.context().clone();
    let streams = (0..threads)
        .map(|_| a.stream.open(&ctx))
        .collect::<Result<Vec<_>, _>>()?;
    let mut buffers = streams
        .iter()
        .map(|s| short.buffers(s))
        .collect::<Result<Vec<_>, _>>()?;
    for s in &streams {
        s.synchronize()?;
    }
    // SAFETY: each thread's buffers were allocated on its stream, are used there alone,
    // and are freed after the last synchronize; the profiler tracks nothing through
    // cudarc's slices.
    unsafe { ctx.disable_event_tracking() };

    // The kernel alone, each variant (these profiled launches count in the stats).
    let (s0, b0) = (&streams[0], &mut buffers[0]);
    const ALONE: usize = 101;
    let plain_ms = Timer::median_ms(&ctx, s0, ALONE, || {
        short.launch(s0, b0, &KernelArg::default())
    })?;
    let profiled_ms = Timer::median_ms(&ctx, s0, ALONE, || {
        gpu_profile!(profiler, s0, "tiled_poly", short.cfg(), |trace| short
            .launch(s0, b0, &trace))
    })?;

    let mut blocks: Vec<(Variant, usize)> = Variant::ALL.iter().map(|&v| (v, a.block)).collect();
    for r in 0..a.launches.div_ceil(a.block) {
        let count = a.block.min(a.launches - r * a.block);
        // Each round in another order, so that no variant always follows the same one.
        let mut order = Variant::ALL;
        order.rotate_left(r % Variant::ALL.len());
        blocks.extend(order.iter().map(|&v| (v, count)));
    }
    let made = ALONE as u64
        + blocks
            .iter()
            .filter(|(v, _)| v.profiled())
            .map(|(_, n)| *n as u64)
            .sum::<u64>();
    let storm = Storm {
        profiler: &profiler,
        short: &short,
        threads,
        settle: a.settle,
        blocks,
        barrier: Barrier::new(threads),
        failed: AtomicBool::new(false),
        error: Mutex::new(None),
    };
    let tallies: Vec<Tally> = std::thread::scope(|scope| {
        let handles: Vec<_> = streams
            .iter()
            .zip(buffers.iter_mut())
            .enumerate()
            .map(|(t, (stream, b))| {
                let (storm, dispatch) = (&storm, &trace.dispatch);
                scope.spawn(move || {
                    tracing::dispatcher::with_default(dispatch, || storm.thread(t, stream, b))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a storm thread panicked"))
            .collect()
    });
    if let Some(e) = storm.error.lock().take() {
        return Err(e.into());
    }
    profiler.flush()?;
    let stats = profiler.stats();
    drop(storm);
    drop(profiler);
    let written = trace.finish()?;

    let mut sides: [Side; 4] = Default::default();
    for (k, side) in sides.iter_mut().enumerate() {
        for t in &tallies {
            side.calls.add(&t.sides[k].calls);
        }
        side.wall = tallies[0].sides[k].wall;
        side.launches = tallies[0].sides[k].launches;
    }
    sides[0].kernel_us = plain_ms * 1e3;
    sides[1].kernel_us = plain_ms * 1e3;
    sides[2].kernel_us = profiled_ms * 1e3;
    sides[3].kernel_us = profiled_ms * 1e3;
    let peak = tallies[0].peak_in_use;
    let counted = stats.delivered + stats.skipped + stats.failed;
    let ok = stats.launches == made && stats.launches == counted;

    let cfg = short.cfg();
    println!(
        "storm: {} launches of each variant in blocks of {}{}, {threads} thread(s), {} stream; \
         tiled_poly {}×{} threads, work {}; {} records per warp ({:.1} KB of trace per launch)",
        a.launches,
        a.block,
        if a.settle { " (settled)" } else { "" },
        a.stream.name(),
        cfg.grid_dim.0,
        cfg.block_dim.0,
        a.work,
        a.capacity,
        short.trace_bytes(a.capacity) as f64 / 1e3
    );
    println!("| launch call | p50 µs | p99 µs | mean µs | wall per launch µs | kernel alone µs | GPU busy |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for v in Variant::ALL {
        let s = &sides[v as usize];
        println!(
            "| {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
            v.name(),
            s.calls.us(0.5),
            s.calls.us(0.99),
            s.calls.mean_us(),
            s.wall_per_launch_us(),
            s.kernel_us,
            s.busy()
        );
    }
    let p = &sides[0];
    let added = |v: Variant| {
        let q = &sides[v as usize];
        (
            q.calls.us(0.5) - p.calls.us(0.5),
            q.calls.us(0.99) - p.calls.us(0.99),
        )
    };
    for v in &Variant::ALL[1..] {
        let (d50, d99) = added(*v);
        println!("| added: {} | {d50:+.2} | {d99:+.2} | | | | |", v.name());
    }
    let (d50, d99) = added(Variant::Profiled);
    println!(
        "memory: {:.1} MB held by the profiler, peak arena in use {:.1} MB (of {:.1} MB)",
        stats.memory_bytes as f64 / 1e6,
        peak as f64 / 1e6,
        a.memory as f64 / 1e6
    );
    println!(
        "counts: {} profiled launch calls made; launches {} = delivered {} + skipped {} + failed {}: {}; \
         events {}, dropped {}; Perfetto trace {:.1} MB",
        made,
        stats.launches,
        stats.delivered,
        stats.skipped,
        stats.failed,
        if ok { "ok" } else { "MISMATCH" },
        stats.events,
        stats.dropped_events,
        written.bytes as f64 / 1e6
    );
    println!(
        r#"{{"bench":"storm","launches":{},"block":{},"settle":{},"threads":{threads},"stream":"{}","work":{},"capacity":{},"memory":{},"variants":{{{}}},"added_p50_us":{d50:.3},"added_p99_us":{d99:.3},"memory_bytes":{},"peak_arena_in_use":{peak},"made":{made},"stats_launches":{},"delivered":{},"skipped":{},"failed":{},"events":{},"dropped_events":{},"counts_ok":{ok}}}"#,
        a.launches,
        a.block,
        a.settle,
        a.stream.name(),
        a.work,
        a.capacity,
        a.memory,
        Variant::ALL
            .iter()
            .map(|v| format!(r#""{}":{}"#, v.key(), sides[*v as usize].json()))
            .collect::<Vec<_>>()
            .join(","),
        stats.memory_bytes,
        stats.launches,
        stats.delivered,
        stats.skipped,
        stats.failed,
        stats.events,
        stats.dropped_events,
    );
    Ok(ok)
}

/// A driver event of its own, recorded after a capture check: the floor variant's
/// driver calls, as `Profiler::launch` makes them.
struct Event(sys::CUevent);

impl Event {
    fn new() -> Result<Event, DriverError> {
        let mut raw = std::ptr::null_mut();
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        // SAFETY: a valid out-pointer; the thread has bound the profiler's context.
        unsafe { sys::cuEventCreate(&mut raw, flags).result()? };
        Ok(Event(raw))
    }

    fn after_capture_check(&self, stream: &CudaStream) -> Result<(), DriverError> {
        // SAFETY: a live stream and event of the bound context.
        unsafe {
            if !stream.cu_stream().is_null() {
                result::stream::is_capturing(stream.cu_stream())?;
            }
            sys::cuEventRecord(self.0, stream.cu_stream()).result()
        }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: owned, destroyed once.
            let _ = unsafe { sys::cuEventDestroy_v2(self.0) };
        }
    }
}
