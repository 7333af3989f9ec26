//! A storm of short launches, gate off against null trace against profiled (issues #12,
//! #28): what `gpu_profile!` adds to a launch call when launches come back to back, over
//! the kernel a user ships, what the GPU then does, and whether every profiled launch is
//! delivered or counted.
//!
//! ```text
//! cargo run --release -p tracing-gpu-bench --bin storm -- [--launches 100000] [--threads 1] \
//!     [--stream legacy|own] [--capacity 16] [--memory BYTES] [--work 1024] [--block 1000] \
//!     [--blocks N] [--settle] [--gap US] [--variants off,plain,floor,unsubscribed,profiled] \
//!     [--bisect] [--pin] [--bring-back-ms 5] [--define NAME=VALUE] [--header FILE]
//! ```
//!
//! The kernel is [`tracing_gpu_bench::short`]'s (one block of 128 threads per SM, or
//! `--blocks`, a few µs), in two builds: without the recorder (the gate off) and with it.
//! The variants (`--variants`, a comma-separated list; *off* and *plain* are always
//! measured, the first five are the default):
//! - `off`: the launch alone of the build without the recorder, which takes no trace:
//!   the kernel a user ships, the baseline of the added times;
//! - `plain`: the launch alone of the recorder's build, given a null trace (it records
//!   nothing): the *null trace* baseline, which the variants below build on;
//! - `floor`: the launch, then the driver call the profiled launch makes besides it
//!   on a stream of its own (`cuStreamIsCapturing`; none on the legacy stream, which
//!   cannot capture): what the design cannot go under;
//! - `floor-event`: *floor* and `cuEventRecord` of one reused event, as a launching
//!   thread recorded with each launch before the collector marked launches itself
//!   (many with one event): minus *floor*, what that saves;
//! - `floor-cell`: *floor* and `cuStreamWriteValue32` into a cell of mapped host
//!   memory: a mark the collector could read without asking the driver (weighed in
//!   docs/architecture.md; it costs the launch call more than the event);
//! - `unsubscribed`: `gpu_profile!` with no subscriber (the launch span disabled);
//! - `profiled`: `gpu_profile!` with the Perfetto layer, the launch span included.
//! - `span`: the plain launch inside the launch span as `gpu_profile!` makes it (the
//!   same fields, entered around the launch, the clock read) under the Perfetto layer,
//!   with no profiler; the spans are closed after
//!   their block, untimed (the profiler closes them on its collector thread). Minus
//!   *plain*: what the span costs the launch call itself, its cache misses in the
//!   driver's call included, which a benchmark of the span alone does not see.
//!
//! And two that take the profiled call apart (suspects of issue #12):
//! - `floor-collector`: *floor*, with an event per launch from a ring of the thread's
//!   own, while a stand-in collector thread makes an event-asking collector's driver calls on
//!   those events and on memory of the arena's size
//!   ([`tracing_gpu_bench::fake_collector`]: an event query per finished launch, a
//!   copy back and a memset of their trace bytes on a non-blocking stream of its own,
//!   each waited for). Minus *floor*: what such a collector's driver calls cost the
//!   launch call inside the driver. It has no lock, no channel, no span. With
//!   `--bisect` its collector asks about log2(launches) events a pass instead of one
//!   per launch: whether the event queries are what costs;
//! - `host-only`: *profiled* (Perfetto layer), but the kernel gets the trace with its
//!   base set to 0, so that it records nothing and is as long as the plain one; the
//!   host does all it does for a recorded launch (a region, the event, the job; the
//!   collector copies, zeroes and decodes the region). *Profiled* minus it: what the
//!   longer recorded kernel costs the call (the queue waiting for the device); it
//!   minus *floor-collector*: the profiler's host path beyond the driver calls (locks,
//!   channel, span, names).
//!
//! `--launches` launch calls of each variant are made in blocks of `--block`, the
//! variants in turn (one warm-up block of each first, not counted), by `--threads`
//! threads in step (each block starts
//! on all threads at once and ends when all have synchronized): on the legacy stream,
//! or each thread on a stream of its own (`--stream own`). Each launch call is timed
//! with `Instant` (p50, p99, mean over all calls of all threads). With `--settle`, the
//! collector is waited for after each block (`Profiler::flush`, not timed), so that no
//! block's calls meet the draining of an earlier block's launches. With `--gap US`,
//! each thread spins that long after each launch call (not timed): with a gap longer
//! than the kernel the device queue stays short, so that no call waits for the device.
//! The subscriber is a `PerfettoLayer` writing to a temporary file, so the launch span
//! is recorded.
//!
//! The GPU side: *kernel alone* is the median of 101 launches timed by CUDA events,
//! each alone on the GPU, of what the variant launches (the gate-off build, the
//! recorder's given a null trace, or the recorder's recording); *wall per launch* is
//! the blocks' wall time (first launch call to last synchronize, gaps included) per
//! launch; *GPU busy* is launches × kernel alone / wall: the share of the storm's wall
//! time the GPU needs for the kernels (1: the host kept the GPU fed; below: the GPU
//! waited for launch calls; above 1 when several streams' kernels overlap). *Peak arena
//! in use* is `ProfilerStats::arena_in_use` read at the end of each profiled block,
//! before its synchronize, where the queue is longest.
//! After `Profiler::flush`, launches must equal delivered + skipped + failed, and be
//! the number of profiled launch calls made; the run fails otherwise.
//!
//! cudarc's event tracking is switched off (each thread's buffers are used on its
//! stream alone), so that the plain launch is one driver call.
//!
//! With `--pin`, each launching thread runs on a physical core of its own, and every
//! other thread of the process (the profiler's collector and drain threads, the
//! Perfetto writer, the driver's threads, the stand-in collector) on the other cores
//! (`tracing_gpu_bench::host::Cores`): whether those threads sharing a core with a
//! launching thread is part of what the profiled call adds. The run also prints what
//! a read of the trace's clock (`CLOCK_BOOTTIME`) and of `Instant` costs here, and the
//! kernel's clock source: a clock the vDSO cannot read is a system call.
//!
//! Output: a table; the added time per launch call of each variant, named by baseline:
//! against *off* (p50, p99 and wall per launch) and, in columns of their own, against
//! *plain* (the null trace); the decomposition when the variants it needs ran (its
//! first part, *plain* − *off*, is what the compiled-in recorder costs the call); then
//! one JSON line (`{"bench":"storm",...}`: `added_vs_off_*` and `added_vs_null_*` are
//! *profiled* against each baseline).

use std::error::Error;
use std::hint::black_box;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use parking_lot::Mutex;
use tracing_gpu::clock::HostClock;
use tracing_gpu::cuda::cudarc::driver::CudaStream;
use tracing_gpu::cuda::{gpu_profile, Profiler, ProfilerError, DEFAULT_MEMORY_LIMIT};
use tracing_gpu::format::KernelArg;
use tracing_gpu_bench::cli::{self, StreamKind};
use tracing_gpu_bench::device::Timer;
use tracing_gpu_bench::fake_collector::{FakeCollector, Marks, Passes, Queries};
use tracing_gpu_bench::floor::{Floor, Mark};
use tracing_gpu_bench::host::{ClockCosts, Cores};
use tracing_gpu_bench::quickstart;
use tracing_gpu_bench::short::{Buffers, Short};
use tracing_gpu_bench::stats::Calls;
use tracing_gpu_bench::trace::PerfettoTrace;

/// Short launches back to back, gate off against null trace against profiled.
///
/// With all the variants, the profiled call's time over off is taken apart: plain − off
/// (the compiled-in recorder, given a null trace), floor − plain (the call's other
/// driver calls), floor-collector − floor (the collector's driver calls, met inside the
/// driver), host-only − floor-collector (the profiler's host path: arena and event
/// locks, job channel, span, names), profiled − host-only (the longer recorded kernel:
/// the queue waiting for the device); and floor-cell −
/// floor (a cell written by the stream instead of an event).
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
    /// Microseconds each thread spins after each launch call (not timed); longer than
    /// the kernel, it keeps the device queue short, so that no call waits for the device.
    #[arg(long, default_value_t = 0.0, value_parser = microseconds)]
    gap: f64,
    /// The `floor-collector` variant's collector asks the newest event of each stream,
    /// then bisects, instead of every launch's event as the real collector does: about
    /// log2(launches) queries a pass instead of one per launch.
    #[arg(long)]
    bisect: bool,
    /// Each launching thread on a physical core of its own, every other thread elsewhere.
    #[arg(long)]
    pin: bool,
    /// How often the collector brings finished launches back, in ms
    /// (`ProfilerBuilder::bring_back_every`; with a large `--memory`, a long one keeps
    /// its copies and zeroing out of the storm).
    #[arg(long, default_value_t = 5.0, value_parser = milliseconds)]
    bring_back_ms: f64,
    /// The variants, comma-separated (off and plain are always measured; see the module
    /// docs).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_values_t = [Variant::Off, Variant::Plain, Variant::Floor, Variant::Unsubscribed, Variant::Profiled]
    )]
    variants: Vec<Variant>,
    /// A define added to the kernel's build with the recorder on (`NAME=VALUE`, such as
    /// `TGPU_FORMAT=1`); repeatable. The gate-off build stays the baseline.
    #[arg(long = "define", value_name = "NAME=VALUE")]
    defines: Vec<String>,
    /// The build with the recorder on includes this file instead of the embedded
    /// `tracing_gpu.cuh` (a variant of the header, beside the shipped one in one call).
    #[arg(long, value_name = "FILE")]
    header: Option<PathBuf>,
}

/// What a block of launch calls does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Variant {
    /// The launch alone, of the build without the recorder (no trace).
    Off,
    /// The launch alone, of the recorder's build given a null trace.
    Plain,
    /// The launch and the profiled call's other driver call.
    Floor,
    /// `floor`, with an event for the mark.
    FloorEvent,
    /// `floor`, with a cell of mapped host memory for the mark.
    FloorCell,
    /// `floor`, with an event per launch, beside a thread making the collector's driver calls.
    FloorCollector,
    /// `gpu_profile!` without a subscriber.
    Unsubscribed,
    /// `gpu_profile!` with the Perfetto layer, the kernel recording nothing (trace base 0).
    HostOnly,
    /// `gpu_profile!` with the Perfetto layer.
    Profiled,
    /// The plain launch inside the launch span, Perfetto layer, no profiler.
    Span,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Off => "off (gate off)",
            Variant::Plain => "plain (null trace)",
            Variant::Floor => "floor (+ capture check)",
            Variant::FloorEvent => "floor, event for the mark",
            Variant::FloorCell => "floor, cell for the mark",
            Variant::FloorCollector => "floor + collector's driver calls",
            Variant::Unsubscribed => "gpu_profile!, no subscriber",
            Variant::HostOnly => "gpu_profile!, kernel not recording",
            Variant::Profiled => "gpu_profile!, Perfetto layer",
            Variant::Span => "plain in the launch span",
        }
    }

    fn key(self) -> &'static str {
        match self {
            Variant::Off => "off",
            Variant::Plain => "plain",
            Variant::Floor => "floor",
            Variant::FloorEvent => "floor_event",
            Variant::FloorCell => "floor_cell",
            Variant::FloorCollector => "floor_collector",
            Variant::Unsubscribed => "unsubscribed",
            Variant::HostOnly => "host_only",
            Variant::Profiled => "profiled",
            Variant::Span => "span",
        }
    }

    fn profiled(self) -> bool {
        matches!(
            self,
            Variant::Unsubscribed | Variant::HostOnly | Variant::Profiled
        )
    }

    /// Whether the kernel records (it is then longer than the plain one).
    fn records(self) -> bool {
        matches!(self, Variant::Unsubscribed | Variant::Profiled)
    }
}

/// A number of milliseconds, 0 to an hour (`--bring-back-ms`).
fn milliseconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(ms) if (0.0..=3.6e6).contains(&ms) => Ok(ms),
        _ => Err("must be a number of milliseconds, 0 to 3600000".into()),
    }
}

/// A number of microseconds, 0 or more (`--gap`).
fn microseconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(us) if us.is_finite() && us >= 0.0 => Ok(us),
        _ => Err("must be a number of microseconds, 0 or more".into()),
    }
}

/// The variants to measure: `asked`, off and plain first, each once.
fn chosen(asked: &[Variant]) -> Vec<Variant> {
    let mut v = vec![Variant::Off, Variant::Plain];
    for &a in asked {
        if !v.contains(&a) {
            v.push(a);
        }
    }
    v
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
    /// `Args::gap`.
    gap: Duration,
    /// The variants measured (`chosen`).
    variants: Vec<Variant>,
    /// Per block: the variant's index in `variants`, launch calls (all threads). The
    /// first block of each variant is a warm-up.
    blocks: Vec<(usize, usize)>,
    /// Each thread's events for `floor-collector` (empty without it).
    marks: Vec<Marks>,
    barrier: Barrier,
    failed: AtomicBool,
    error: Mutex<Option<ProfilerError>>,
}

/// What one thread measured: calls per variant; thread 0 also the walls and the peak.
struct Tally {
    sides: Vec<Side>,
    peak_in_use: u64,
}

impl Storm<'_> {
    /// Thread `t`'s part of every block, in step with the others. An error stops
    /// every thread at the next block (each still meets the barriers).
    fn thread(&self, t: usize, stream: &Arc<CudaStream>, b: &mut Buffers) -> Tally {
        let mut tally = Tally {
            sides: self.variants.iter().map(|_| Side::default()).collect(),
            peak_in_use: 0,
        };
        if let Err(e) = self.profiler.context().bind_to_thread() {
            self.fail(e.into());
        }
        let floor = match Floor::new() {
            Ok(f) => f,
            Err(e) => {
                self.fail(e.into());
                Floor::default()
            }
        };
        for (i, &(k, count)) in self.blocks.iter().enumerate() {
            let variant = self.variants[k];
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
                    self.block(t, variant, mine, stream, b, &floor, &mut calls, peak)
                }),
                _ => self.block(t, variant, mine, stream, b, &floor, &mut calls, peak),
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
            if i >= self.variants.len() {
                let side = &mut tally.sides[k];
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

    /// Thread `t`'s `count` launch calls, each timed, then the synchronize.
    #[allow(clippy::too_many_arguments)]
    fn block(
        &self,
        t: usize,
        variant: Variant,
        count: usize,
        stream: &Arc<CudaStream>,
        b: &mut Buffers,
        floor: &Floor,
        calls: &mut Calls,
        peak: &mut u64,
    ) -> Result<(), ProfilerError> {
        let (short, cfg) = (self.short, self.short.cfg());
        // The span variant's spans, closed after the block (allocated before it).
        let mut spans = Vec::with_capacity(if variant == Variant::Span { count } else { 0 });
        for i in 0..count {
            let start = Instant::now();
            match variant {
                Variant::Off => short.launch_off(stream, b)?,
                Variant::Plain => short.launch(stream, b, &KernelArg::default())?,
                Variant::Floor | Variant::FloorEvent | Variant::FloorCell => {
                    short.launch(stream, b, &KernelArg::default())?;
                    let mark = match variant {
                        Variant::FloorEvent => Mark::Event,
                        Variant::FloorCell => Mark::Cell,
                        _ => Mark::None,
                    };
                    floor.after_capture_check(stream, mark)?;
                }
                Variant::FloorCollector => {
                    short.launch(stream, b, &KernelArg::default())?;
                    self.marks[t].record(stream)?;
                }
                Variant::Unsubscribed | Variant::Profiled => {
                    gpu_profile!(self.profiler, stream, "tiled_poly", cfg, |trace| short
                        .launch(stream, b, &trace))?
                }
                Variant::HostOnly => {
                    gpu_profile!(self.profiler, stream, "tiled_poly", cfg, |trace| {
                        short.launch(stream, b, &KernelArg { base: 0, ..trace })
                    })?
                }
                Variant::Span => {
                    // As gpu_profile! makes, enters and records it (src/cuda/profiler/launch.rs).
                    let span = tracing::info_span!(
                        "tiled_poly",
                        gpu.launch_id = i as u64,
                        gpu.device = 0u64,
                    );
                    let entered = span.enter();
                    black_box(HostClock::Boottime.now_ns());
                    short.launch(stream, b, &KernelArg::default())?;
                    drop(entered);
                    spans.push(span);
                }
            }
            let call = start.elapsed();
            calls.record(call);
            while start.elapsed() < call + self.gap {
                std::hint::spin_loop();
            }
        }
        drop(spans);
        if t == 0 && variant == Variant::Profiled {
            *peak = (*peak).max(self.profiler.stats().arena_in_use);
        }
        stream.synchronize()?;
        Ok(())
    }
}

fn run(a: &Args) -> Result<bool, Box<dyn Error>> {
    let variants = chosen(&a.variants);
    let threads = usize::from(a.threads);
    // Before the Perfetto writer and the profiler start their threads, which inherit it.
    let cores = a.pin.then(|| Cores::split(threads)).transpose()?;
    if let Some(c) = &cores {
        c.pin_rest()?;
    }
    let clock = ClockCosts::measure(1_000_000);
    let trace = PerfettoTrace::new("storm")?;
    let _default = tracing::dispatcher::set_default(&trace.dispatch);
    let profiler = Profiler::builder()
        .device(0)
        .events(quickstart::EVENTS)
        .capacity(a.capacity)
        .memory_limit(a.memory)
        .bring_back_every(Duration::from_secs_f64(a.bring_back_ms * 1e-3))
        .build()?;
    let header = cli::Header::read(a.header.as_deref())?;
    let short = Short::load(&profiler, a.work, a.blocks, &a.defines, header.as_ref())?;
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
    // The stand-in collector and its events, made here (context bound) before the storm.
    let fake = match variants.contains(&Variant::FloorCollector) {
        true => {
            ctx.bind_to_thread()?;
            let marks = (0..threads)
                .map(|_| Marks::new())
                .collect::<Result<Vec<_>, _>>()?;
            Some((FakeCollector::new(a.memory)?, marks))
        }
        false => None,
    };
    // SAFETY: each thread's buffers were allocated on its stream, are used there alone,
    // and are freed after the last synchronize; the profiler tracks nothing through
    // cudarc's slices.
    unsafe { ctx.disable_event_tracking() };

    // The kernel alone, each build (these profiled launches count in the stats).
    let (s0, b0) = (&streams[0], &mut buffers[0]);
    const ALONE: usize = 101;
    let off_ms = Timer::median_ms(&ctx, s0, ALONE, || short.launch_off(s0, b0))?;
    let plain_ms = Timer::median_ms(&ctx, s0, ALONE, || {
        short.launch(s0, b0, &KernelArg::default())
    })?;
    let profiled_ms = Timer::median_ms(&ctx, s0, ALONE, || {
        gpu_profile!(profiler, s0, "tiled_poly", short.cfg(), |trace| short
            .launch(s0, b0, &trace))
    })?;

    let n = variants.len();
    let mut blocks: Vec<(usize, usize)> = (0..n).map(|k| (k, a.block)).collect();
    for r in 0..a.launches.div_ceil(a.block) {
        let count = a.block.min(a.launches - r * a.block);
        // Each round in another order, so that no variant always follows the same one.
        blocks.extend((0..n).map(|k| ((k + r) % n, count)));
    }
    let made = ALONE as u64
        + blocks
            .iter()
            .filter(|(k, _)| variants[*k].profiled())
            .map(|(_, n)| *n as u64)
            .sum::<u64>();
    let (collector, marks) = match fake {
        Some((c, m)) => (Some(c), m),
        None => (None, Vec::new()),
    };
    let storm = Storm {
        profiler: &profiler,
        short: &short,
        threads,
        settle: a.settle,
        gap: Duration::from_secs_f64(a.gap * 1e-6),
        variants: variants.clone(),
        blocks,
        marks,
        barrier: Barrier::new(threads),
        failed: AtomicBool::new(false),
        error: Mutex::new(None),
    };
    let trace_bytes = short.trace_bytes(a.capacity);
    let stop = AtomicBool::new(false);
    let queries = match a.bisect {
        true => Queries::Bisect,
        false => Queries::PerLaunch,
    };
    let (tallies, passes) = std::thread::scope(|scope| {
        let fake = collector.as_ref().map(|c| {
            let (storm, stop, ctx) = (&storm, &stop, &ctx);
            scope.spawn(move || {
                ctx.bind_to_thread()?;
                c.run(&storm.marks, trace_bytes, queries, stop)
            })
        });
        let handles: Vec<_> = streams
            .iter()
            .zip(buffers.iter_mut())
            .enumerate()
            .map(|(t, (stream, b))| {
                let (storm, dispatch, cores) = (&storm, &trace.dispatch, &cores);
                scope.spawn(move || {
                    if let Some(c) = cores {
                        // An allowed CPU (Cores::split): no reason to fail.
                        c.pin_launcher(t).expect("pinning a launching thread");
                    }
                    tracing::dispatcher::with_default(dispatch, || storm.thread(t, stream, b))
                })
            })
            .collect();
        let tallies: Vec<Tally> = handles
            .into_iter()
            .map(|h| h.join().expect("a storm thread panicked"))
            .collect();
        stop.store(true, Ordering::Release);
        let passes = fake.map(|h| h.join().expect("the fake collector panicked"));
        (tallies, passes)
    });
    if let Some(e) = storm.error.lock().take() {
        return Err(e.into());
    }
    let passes: Option<Passes> = passes.transpose()?;
    profiler.flush()?;
    let stats = profiler.stats();
    drop(storm);
    drop(collector);
    drop(profiler);
    let written = trace.finish()?;

    let mut sides: Vec<Side> = variants.iter().map(|_| Side::default()).collect();
    for (k, side) in sides.iter_mut().enumerate() {
        for t in &tallies {
            side.calls.add(&t.sides[k].calls);
        }
        side.wall = tallies[0].sides[k].wall;
        side.launches = tallies[0].sides[k].launches;
        side.kernel_us = match variants[k] {
            Variant::Off => off_ms,
            v if v.records() => profiled_ms,
            _ => plain_ms,
        } * 1e3;
    }
    let peak = tallies[0].peak_in_use;
    let counted = stats.delivered + stats.skipped + stats.failed;
    let ok = stats.launches == made && stats.launches == counted;

    let cfg = short.cfg();
    println!(
        "storm: {} launches of each variant in blocks of {}{}{}, {threads} thread(s), {} stream; \
         tiled_poly {}×{} threads, work {}; {} records per warp ({:.1} KB of trace per launch); \
         recorder build {}",
        a.launches,
        a.block,
        if a.settle { " (settled)" } else { "" },
        if a.gap > 0.0 {
            format!(", {} µs gap after each call", a.gap)
        } else {
            String::new()
        },
        a.stream.name(),
        cfg.grid_dim.0,
        cfg.block_dim.0,
        a.work,
        a.capacity,
        trace_bytes as f64 / 1e3,
        cli::recorder_build_with(&a.defines, header.as_ref())
    );
    println!(
        "host: a CLOCK_BOOTTIME read {:.1} ns, Instant::now {:.1} ns, clock source {}; {}",
        clock.boottime_ns,
        clock.instant_ns,
        clock.source,
        match &cores {
            Some(c) => format!(
                "launching threads pinned to CPUs {:?}, the rest of the process on {} other CPUs",
                c.launchers, c.rest_count
            ),
            None => "threads not pinned".into(),
        }
    );
    println!("| launch call | p50 µs | p99 µs | mean µs | wall per launch µs | kernel alone µs | GPU busy |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (v, s) in variants.iter().zip(&sides) {
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
    let side = |v: Variant| variants.iter().position(|&w| w == v).map(|k| &sides[k]);
    // `a` − `b` at p50 and p99, if both ran.
    let minus = |a: Variant, b: Variant| {
        let (p, q) = (side(a)?, side(b)?);
        Some((
            p.calls.us(0.5) - q.calls.us(0.5),
            p.calls.us(0.99) - q.calls.us(0.99),
        ))
    };
    // Each variant against the two baselines (both always run).
    let (off, null) = (
        side(Variant::Off).expect("always run"),
        side(Variant::Plain).expect("always run"),
    );
    println!(
        "\n| added per launch call | p50 µs vs off | p99 µs vs off | wall per launch µs vs off \
         | p50 µs vs null trace | p99 µs vs null trace |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for (v, s) in variants.iter().zip(&sides) {
        if *v == Variant::Off {
            continue;
        }
        let vs_null = match v {
            Variant::Plain => " | ".into(),
            _ => format!(
                "{:+.2} | {:+.2}",
                s.calls.us(0.5) - null.calls.us(0.5),
                s.calls.us(0.99) - null.calls.us(0.99)
            ),
        };
        println!(
            "| {} | {:+.2} | {:+.2} | {:+.2} | {vs_null} |",
            v.name(),
            s.calls.us(0.5) - off.calls.us(0.5),
            s.calls.us(0.99) - off.calls.us(0.99),
            s.wall_per_launch_us() - off.wall_per_launch_us(),
        );
    }
    // The profiled call's time over off, taken apart (module docs).
    let parts = [
        ("null_trace", Variant::Plain, Variant::Off),
        ("floor", Variant::Floor, Variant::Plain),
        ("event_mark", Variant::FloorEvent, Variant::Floor),
        ("cell_mark", Variant::FloorCell, Variant::Floor),
        ("collector_calls", Variant::FloorCollector, Variant::Floor),
        ("host_path", Variant::HostOnly, Variant::FloorCollector),
        ("longer_kernel", Variant::Profiled, Variant::HostOnly),
        ("span", Variant::Span, Variant::Plain),
        ("profiler_no_span", Variant::Unsubscribed, Variant::Floor),
        ("span_in_profiled", Variant::Profiled, Variant::Unsubscribed),
    ];
    let parts: Vec<_> = parts
        .iter()
        .filter_map(|&(key, a, b)| Some((key, a, b, minus(a, b)?)))
        .collect();
    println!("\n| part: variant − variant | p50 µs | p99 µs |");
    println!("|---|---:|---:|");
    for (_, a, b, (d50, d99)) in &parts {
        println!("| {} − {} | {d50:+.2} | {d99:+.2} |", a.name(), b.name());
    }
    if let Some(p) = &passes {
        println!(
            "fake collector{}: {} passes with launches ({:.1} launches each), {} idle, {} event queries",
            if a.bisect { " (bisect)" } else { "" },
            p.bulk,
            p.launches as f64 / p.bulk.max(1) as f64,
            p.idle,
            p.queries
        );
    }
    let [(off50, off99), (null50, null99)] = [Variant::Off, Variant::Plain]
        .map(|base| minus(Variant::Profiled, base).unwrap_or((f64::NAN, f64::NAN)));
    println!(
        "memory: {:.1} MB held by the profiler, peak arena in use {:.1} MB (of {:.1} MB)",
        stats.memory_bytes as f64 / 1e6,
        peak as f64 / 1e6,
        a.memory as f64 / 1e6
    );
    println!(
        "counts: {} profiled launch calls made; launches {} = delivered {} + skipped {} + failed {}: {}; \
         events {}, lost {}; Perfetto trace {:.1} MB",
        made,
        stats.launches,
        stats.delivered,
        stats.skipped,
        stats.failed,
        if ok { "ok" } else { "MISMATCH" },
        stats.events,
        stats.events_lost,
        written.bytes as f64 / 1e6
    );
    let json_parts = parts
        .iter()
        .map(|(key, _, _, (d50, d99))| {
            format!(r#""{key}":{{"p50_us":{d50:.3},"p99_us":{d99:.3}}}"#)
        })
        .collect::<Vec<_>>()
        .join(",");
    let json_fake = match &passes {
        Some(p) => format!(
            r#"{{"bulk_passes":{},"idle_passes":{},"launches":{},"queries":{}}}"#,
            p.bulk, p.idle, p.launches, p.queries
        ),
        None => "null".into(),
    };
    // NaN (profiled not run) is not JSON.
    let num = |x: f64| match x.is_finite() {
        true => format!("{x:.3}"),
        false => "null".into(),
    };
    println!(
        r#"{{"bench":"storm","launches":{},"block":{},"settle":{},"gap_us":{},"threads":{threads},"stream":"{}","work":{},"blocks":{},"capacity":{},"memory":{},"variants":{{{}}},"parts":{{{json_parts}}},"bisect":{},"fake_collector":{json_fake},"clock":{},"pinned":{},"bring_back_ms":{},"added_vs_off_p50_us":{},"added_vs_off_p99_us":{},"added_vs_null_p50_us":{},"added_vs_null_p99_us":{},"memory_bytes":{},"peak_arena_in_use":{peak},"made":{made},"stats_launches":{},"delivered":{},"skipped":{},"failed":{},"events":{},"events_lost":{},"counts_ok":{ok}}}"#,
        a.launches,
        a.block,
        a.settle,
        a.gap,
        a.stream.name(),
        a.work,
        cfg.grid_dim.0,
        a.capacity,
        a.memory,
        variants
            .iter()
            .zip(&sides)
            .map(|(v, s)| format!(r#""{}":{}"#, v.key(), s.json()))
            .collect::<Vec<_>>()
            .join(","),
        a.bisect,
        clock.json(),
        cores.is_some(),
        a.bring_back_ms,
        num(off50),
        num(off99),
        num(null50),
        num(null99),
        stats.memory_bytes,
        stats.launches,
        stats.delivered,
        stats.skipped,
        stats.failed,
        stats.events,
        stats.events_lost,
    );
    Ok(ok)
}
