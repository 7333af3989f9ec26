//! stream: a persistent, warp-specialized kernel recorded whole while it runs
//! (`tools/bench/kernels/stream.cu`; issue #13), against the same kernel with the
//! gate off and with fixed slots.
//!
//! ```sh
//! cargo build --release -p tracing-gpu-bench --bin stream
//! target/release/stream [--seconds 10] [--every 8] [--work 64] [--warps 4]
//!                       [--modes off,fixed,memory,watch,perfetto] [--json PATH]
//!                       [--watch-every 1.0]
//!                       [--probe [--probe-at 1.0] [--probe-thread]] [--no-recalibration]
//!                       [--drain-threads N] [--unfiltered] [--capacity R --memory-limit B]
//!                       [--walkers N] [--perfetto-encoders N]
//!                       [--perfetto-zlib LEVEL [--perfetto-when-behind]]
//!                       [--header FILE] [--define NAME=VALUE]
//! ```
//!
//! One block per SM of `--warps` warps (one producer, the rest consumers), each looping
//! `iters` times (found from a short gate-off launch so that one launch takes about
//! `--seconds`); the events each warp records are known from the loop (stream.cu says
//! how). Modes, one launch each, in order:
//! - `off`: the gate off, no profiler: the kernel's own time;
//! - `fixed`: recorded into fixed slots (`--capacity` records per warp: the first events
//!   are kept, the rest lost and counted), delivered to an in-memory sink;
//! - `memory`: streamed (`Profiler::streamed`), delivered to an in-memory sink that
//!   counts events, walking every one on `--walkers` threads of its own (4; 0: on the
//!   collector's thread, which then bounds the rate delivered at about one core's walk);
//! - `watch`: as `memory`, the kernel built with `TGPU_WATCH=1` (issue #32) and the
//!   profiler's watchdog taking a snapshot every `--watch-every` seconds from the
//!   first: the run fails unless a snapshot came each period, and each names only the
//!   phases the kernel can be in (a producer in load or between ranges, after load or
//!   issue; a consumer in wait, after mma or nothing yet, or in mma, after wait), for at
//!   most every warp of the grid; its slowdown against `memory` is what watch mode costs
//!   beyond recording;
//! - `perfetto`: streamed into a Perfetto file on local disk (a temporary folder).
//!
//! Per mode: the kernel's time (CUDA events around the kernel, inside the profiled
//! call), the launch call's time (the first streamed launch allocates the streaming
//! memory), the slowdown against `off`, events produced (from the loop) against
//! delivered and lost (events), the drain's stalls for the collector
//! (`ProfilerStats::stream_stalls`) and the longest its rings went unread
//! (`stream_longest_gap`), the parts, the clock checkpoints taken, the
//! sustained events/s delivered over the kernel's time, how long after the kernel the
//! last part arrived, how late the parts arrived (from their cut to the sink: median,
//! 99th percentile, largest, and the largest in each quarter of the run), the streaming
//! memory, the process's peak resident memory, and the CPU time of the profiler's threads
//! (the collector, the drain threads, the others, and the busiest thread of each) and of
//! the process's other threads (the launching thread waits for the kernel on a blocking
//! event, not spinning); for the profiler's roles, also how long their threads waited for
//! a core (all, and the one that waited most) and their minor page faults. The subscriber filters at `INFO`, as the README's, so that
//! `deliver` makes no plain spans (`--unfiltered`: no filter). A mode fails the run if
//! produced ≠ delivered + lost (in events).
//!
//! At startup it prints `CUDA_MODULE_LOADING` and `CUDA_DEVICE_MAX_CONNECTIONS` (or
//! `unset`). `--probe` (a diagnostic, off by default: it slows the kernel and holds
//! the launching thread) asks, in every mode, what the GPU still runs beside the
//! persistent kernel (with `off`: beside a kernel that records nothing and touches no
//! host memory; with `fixed`: one that records into device memory): before the launch it prepares an empty kernel, its streams
//! and a calibrator (`tracing_gpu_bench::probe`); `--probe-at` seconds after the
//! launch, from the launching thread and before it waits for the kernel, it launches
//! the empty kernel on streams made before and during the kernel, loads and runs a
//! fresh module, and calibrates with the calibrator made before and with one made
//! then, each bounded (3 s for a kernel, 5 s for a call that may block). One line
//! per probe (`probe memory: empty kernel: launch 4.1 us, done after 12 us [...]`),
//! and a `"probe"` object in the mode's JSON. Give the kernel time for all of them
//! (`--seconds 40`): each line says whether it still ran. With `--probe-thread` the
//! probes run on a thread of their own while the launching thread waits for the
//! kernel (`cuEventSynchronize`), as the collector's recalibrations do.

use std::error::Error;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DriverError, LaunchConfig, PushKernelArg,
};
use tracing::Dispatch;
use tracing_gpu::batch::{Batch, BatchSink};
use tracing_gpu::cuda::{
    compile, gpu_profile, KernelBuild, Profiler, ProfilerStats, DEFAULT_MEMORY_LIMIT,
    DEFAULT_RECALIBRATION, DEFAULT_STREAM_MEMORY,
};
use tracing_gpu::deliver::SinkLayer;
use tracing_gpu::format::KernelArg;
use tracing_gpu::perfetto::PerfettoLayer;
use tracing_gpu_bench::host::{profiler_cpu, ProfilerCpu};
use tracing_gpu_bench::kernels::STREAM;
use tracing_gpu_bench::probe::{self, Probe};
use tracing_gpu_bench::snapshots::{self, Snapshots};
use tracing_gpu_bench::{cli, device, device::Timer};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::SubscriberExt;

type Result<T> = std::result::Result<T, Box<dyn Error>>;

const FMA_A: f32 = 0.999_023_4;
const FMA_B: f32 = 0.001_220_7;
const EVENTS: [(u16, &str); 4] = [(1, "load"), (2, "wait"), (3, "mma"), (4, "issue")];

/// A persistent kernel streamed while it runs, against fixed slots and the gate off.
#[derive(Parser, Debug)]
#[command(name = "stream")]
struct Options {
    /// About how long one launch runs.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Iterations per warp (instead of deriving them from --seconds).
    #[arg(long)]
    iters: Option<u32>,
    /// Every this many iterations a payload (and the producer's instant).
    #[arg(long, default_value_t = 8, value_parser = cli::positive::<u32>)]
    every: u32,
    /// FMAs per phase: sets the event rate.
    #[arg(long, default_value_t = 64, value_parser = cli::positive::<i32>)]
    work: i32,
    /// Warps per block (one producer, the rest consumers); at least 2.
    #[arg(long, default_value_t = 4, value_parser = cli::positive::<u32>)]
    warps: u32,
    /// Records per warp's ring (a power of two, 32 to 2^19) when streaming; by
    /// default the profiler sizes them to half the streaming memory.
    #[arg(long)]
    ring: Option<u32>,
    /// Records per warp with fixed slots.
    #[arg(long, default_value_t = 256)]
    capacity: u32,
    /// The profiler's arena in bytes (`ProfilerBuilder::memory_limit`): with a
    /// `--capacity` large enough for every record, `fixed` stores them all in
    /// device memory instead of dropping past its slots (what storing alone costs).
    #[arg(long, default_value_t = DEFAULT_MEMORY_LIMIT)]
    memory_limit: usize,
    /// Bytes of the streaming arena.
    #[arg(long, default_value_t = DEFAULT_STREAM_MEMORY)]
    stream_memory: usize,
    /// Milliseconds between two parts.
    #[arg(long, default_value_t = 100)]
    interval_ms: u64,
    /// Modes to run, in order: off, fixed, memory, watch, perfetto.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "off,fixed,memory,watch,perfetto"
    )]
    modes: Vec<String>,
    /// Encoder threads of the `perfetto` mode's layer
    /// (`PerfettoLayerBuilder::encoder_threads`; its default: the cores, at most 4).
    #[arg(long)]
    perfetto_encoders: Option<usize>,
    /// The `perfetto` mode's trace zlib-compressed at this level
    /// (`PerfettoLayerBuilder::compress`: each encoder deflates its own output).
    #[arg(long)]
    perfetto_zlib: Option<u32>,
    /// With `--perfetto-zlib`: deflate only while the disk is behind
    /// (`PerfettoLayerBuilder::compress_when_behind`).
    #[arg(long, requires = "perfetto_zlib")]
    perfetto_when_behind: bool,
    /// Seconds between the watchdog's snapshots in `watch` (the first at this deadline).
    #[arg(long, default_value_t = 1.0)]
    watch_every: f64,
    /// Also write every figure as JSON lines here.
    #[arg(long, value_name = "PATH")]
    json: Option<PathBuf>,
    /// In every mode, probe what still runs beside the kernel: an empty kernel
    /// on old and new streams, a fresh module, calibrations (tools/bench/src/probe.rs).
    #[arg(long)]
    probe: bool,
    /// Seconds after the launch at which the probes start.
    #[arg(long, default_value_t = 1.0)]
    probe_at: f64,
    /// Probe from a thread of its own while the launching thread waits for the
    /// kernel (in cuEventSynchronize), instead of from the launching thread before.
    #[arg(long, requires = "probe")]
    probe_thread: bool,
    /// No periodic recalibration (`ProfilerBuilder::recalibrate_every(None)`): every
    /// launch is mapped with the first calibration.
    #[arg(long)]
    no_recalibration: bool,
    /// Threads reading the rings (`ProfilerBuilder::stream_drain_threads`); by
    /// default three quarters of the cores, up to 12.
    #[arg(long)]
    drain_threads: Option<usize>,
    /// Threads the in-memory sink hands its batches to, to walk their events (0: it
    /// walks them in `on_batch`, on the collector's thread).
    #[arg(long, default_value_t = 4)]
    walkers: usize,
    /// The subscriber without a filter (the runs before 2026-12-04 had none):
    /// `deliver` then also makes each part's first 4096 events plain spans on the
    /// collector thread. By default it filters at `INFO`, as the README's.
    #[arg(long)]
    unfiltered: bool,
    /// The recorder's builds (every mode but `off`) include this file instead of the
    /// embedded `tracing_gpu.cuh` (a variant of the header, beside the shipped one in one
    /// call).
    #[arg(long, value_name = "FILE")]
    header: Option<PathBuf>,
    /// A define added to the recorder's builds (every mode but `off`; `NAME=VALUE`, such
    /// as `TGPU_FLOOR_MODE=3` with the floor's `--header`); repeatable.
    #[arg(long = "define", value_name = "NAME=VALUE")]
    defines: Vec<String>,
}

/// What the in-memory sink saw.
#[derive(Default)]
struct Count {
    events: AtomicU64,
    last_ns: AtomicU64,
    /// Per batch: when it was cut (a part; the last: when the launch was found
    /// complete), and how long after that it reached the sink (ns).
    lags: parking_lot::Mutex<Vec<(u64, u64)>>,
}

impl Count {
    /// The lags of the parts cut in each quarter of `[start_ns, end_ns]` (the
    /// largest in each), and their median, 99th percentile and largest, in ms.
    fn lags(&self, start_ns: u64, end_ns: u64) -> ([f64; 4], [f64; 3]) {
        let lags = self.lags.lock();
        let ms = |ns: u64| ns as f64 / 1e6;
        let mut quarters = [0.0f64; 4];
        let span = end_ns.saturating_sub(start_ns).max(1);
        for &(cut, lag) in lags.iter() {
            let q = (cut.saturating_sub(start_ns) * 4 / span).min(3) as usize;
            quarters[q] = quarters[q].max(ms(lag));
        }
        let mut sorted: Vec<u64> = lags.iter().map(|&(_, l)| l).collect();
        sorted.sort_unstable();
        let at = |q: f64| {
            sorted
                .get(((sorted.len() as f64 - 1.0) * q).round() as usize)
                .map_or(f64::NAN, |&l| ms(l))
        };
        (quarters, [at(0.5), at(0.99), at(1.0)])
    }
}

/// The in-memory sink: walks every event, as a sink that uses them would, and keeps
/// nothing. As the profiler's own sinks do, it hands each batch over (`on_batch` runs
/// on the collector's thread): to `--walkers` threads, in turn, over channels that
/// block when full, so that nothing is lost and a walker behind holds the collector
/// back; with `--walkers 0` it walks on the collector's thread.
#[derive(Clone)]
struct CountSink {
    count: Arc<Count>,
    walkers: Arc<Walkers>,
}

/// The walker threads' channels, and the batches handed to them not yet walked.
struct Walkers {
    senders: Vec<std::sync::mpsc::SyncSender<Arc<Batch>>>,
    next: AtomicU64,
    pending: Arc<AtomicU64>,
}

impl CountSink {
    fn new(count: Arc<Count>, threads: usize) -> Result<CountSink> {
        let mut senders = Vec::with_capacity(threads);
        let pending = Arc::new(AtomicU64::new(0));
        for i in 0..threads {
            let (tx, rx) = std::sync::mpsc::sync_channel::<Arc<Batch>>(4);
            let (count, pending) = (count.clone(), pending.clone());
            std::thread::Builder::new()
                .name(format!("walker-{i}"))
                .spawn(move || {
                    for batch in rx {
                        walk(&count, &batch);
                        pending.fetch_sub(1, Ordering::Release);
                    }
                })?;
            senders.push(tx);
        }
        Ok(CountSink {
            count,
            walkers: Arc::new(Walkers {
                senders,
                next: AtomicU64::new(0),
                pending,
            }),
        })
    }
}

/// Counts the batch's events, walking every one.
fn walk(count: &Count, batch: &Batch) {
    let mut n = 0u64;
    for slot in batch.buffer.view().slots() {
        n += slot
            .events()
            .map(|e| u64::from(e.end_ns >= e.start_ns))
            .sum::<u64>();
    }
    count.events.fetch_add(n, Ordering::Relaxed);
}

impl BatchSink for CountSink {
    fn on_batch(&self, batch: &Arc<Batch>) {
        let now = now_ns();
        self.count.last_ns.store(now, Ordering::Relaxed);
        let cut = batch.launch.host_complete_ns;
        self.count.lags.lock().push((cut, now.saturating_sub(cut)));
        let w = &self.walkers;
        if w.senders.is_empty() {
            return walk(&self.count, batch);
        }
        let i = w.next.fetch_add(1, Ordering::Relaxed) as usize % w.senders.len();
        w.pending.fetch_add(1, Ordering::Relaxed);
        if w.senders[i].send(batch.clone()).is_err() {
            w.pending.fetch_sub(1, Ordering::Relaxed);
        }
    }
    /// Waits until every batch handed over has been walked.
    fn flush(&self) {
        while self.walkers.pending.load(Ordering::Acquire) != 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

fn now_ns() -> u64 {
    tracing_gpu::clock::HostClock::Boottime.now_ns()
}

struct Kernel {
    f: CudaFunction,
    cfg: LaunchConfig,
    out: CudaSlice<f32>,
}

impl Kernel {
    fn load(
        ctx: &Arc<CudaContext>,
        stream: &Arc<CudaStream>,
        mode: &str,
        o: &Options,
    ) -> Result<Kernel> {
        let mut build = KernelBuild::new("stream_bench", device::arch(ctx)?);
        if mode != "off" {
            build = build.define("TGPU_ENABLED=1");
        }
        // Only the streamed modes carry the streaming code: fixed slots are timed with
        // the recorder a kernel gets by default.
        if mode == "memory" || mode == "perfetto" || mode == "watch" {
            build = build.define("TGPU_STREAM=1");
        }
        if mode == "watch" {
            build = build.define("TGPU_WATCH=1");
        }
        let (source, build) = match mode {
            "off" => (STREAM.to_owned(), build),
            _ => cli::variant(
                STREAM,
                build,
                &o.defines,
                cli::Header::read(o.header.as_deref())?.as_ref(),
            ),
        };
        let module = ctx.load_module(compile(&source, &build)?)?;
        let sms = device::sm_count(ctx)?;
        let cfg = LaunchConfig {
            grid_dim: (sms, 1, 1),
            block_dim: (32 * o.warps, 1, 1),
            shared_mem_bytes: 0,
        };
        // One float per thread, and the zero word stream.cu reads after them.
        let out = stream.alloc_zeros::<f32>((sms * 32 * o.warps) as usize + 1)?;
        Ok(Kernel {
            f: module.load_function("stream_bench")?,
            cfg,
            out,
        })
    }

    fn launch(
        &self,
        stream: &Arc<CudaStream>,
        iters: u32,
        o: &Options,
        trace: Option<KernelArg>,
    ) -> std::result::Result<(), DriverError> {
        let mut l = stream.launch_builder(&self.f);
        l.arg(&self.out)
            .arg(&FMA_A)
            .arg(&FMA_B)
            .arg(&iters)
            .arg(&o.every)
            .arg(&o.work);
        if let Some(t) = &trace {
            l.arg(t);
        }
        // SAFETY: the arguments match stream_bench's parameter list for this build.
        unsafe { l.launch(self.cfg) }?;
        Ok(())
    }

    /// Events the launch records, from the loop (stream.cu).
    fn produced(&self, iters: u32, o: &Options) -> u64 {
        let (i, p) = (iters as u64, iters.div_ceil(o.every) as u64);
        let per_block = i + p + (o.warps as u64 - 1) * (2 * i + 1);
        self.cfg.grid_dim.0 as u64 * per_block
    }
}

struct Figures {
    mode: String,
    /// Events the in-memory sink walked.
    seen: u64,
    kernel_s: f64,
    /// How long the launch call took (s): the first streamed launch's includes the
    /// streaming arena's allocation.
    call_s: f64,
    produced: u64,
    stats: ProfilerStats,
    delivered_after_s: f64,
    /// How late the parts reached the sink, in ms: the largest in each quarter of
    /// the run, and the median, 99th percentile and largest of all.
    lag_quarters_ms: [f64; 4],
    lag_ms: [f64; 3],
    cpu: ProfilerCpu,
    /// The process's peak resident memory during the mode (bytes).
    peak_rss: Option<u64>,
    /// `--probe`'s JSON object.
    probe: Option<String>,
    /// The watchdog's snapshots (`watch`): their text, and seconds after the launch.
    snapshots: Vec<(String, f64)>,
}

/// `--probe`: the probes, `--probe-at` after the launch; prints them, returns the JSON.
fn probe_beside(
    p: Probe,
    stream: &CudaStream,
    launched: Instant,
    o: &Options,
    mode: &str,
) -> String {
    let at = Duration::from_secs_f64(o.probe_at);
    std::thread::sleep(at.saturating_sub(launched.elapsed()));
    let outcomes = p.run(stream, launched);
    for x in &outcomes {
        println!("probe {mode}: {}: {}", x.name, x.text);
    }
    probe::json(&outcomes)
}

fn run_mode(mode: &str, ctx: &Arc<CudaContext>, iters: u32, o: &Options) -> Result<Figures> {
    // The peak resident memory is the process's own, reset per mode (Linux).
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let stream = ctx.new_stream()?;
    // Waited for on a blocking primitive: a launching thread spinning for the 10 s
    // would take one of the host's cores from the profiler's threads.
    let timer = Timer::blocking(ctx)?;
    let kernel = Kernel::load(ctx, &stream, mode, o)?;
    let produced = kernel.produced(iters, o);
    if mode == "off" {
        // Probed too: whether anything runs beside a kernel that records nothing.
        let probe = o.probe.then(|| Probe::prepare(ctx)).transpose()?;
        let launched = Instant::now();
        timer.around(&stream, || kernel.launch(&stream, iters, o, None))?;
        let call_s = launched.elapsed().as_secs_f64();
        let probe = probe.map(|p| probe_beside(p, &stream, launched, o, mode));
        return Ok(Figures {
            mode: mode.into(),
            seen: 0,
            kernel_s: timer.ms()? / 1e3,
            call_s,
            produced,
            stats: ProfilerStats::default(),
            delivered_after_s: 0.0,
            lag_quarters_ms: [f64::NAN; 4],
            lag_ms: [f64::NAN; 3],
            cpu: ProfilerCpu::default(),
            peak_rss: peak_rss(),
            probe,
            snapshots: Vec::new(),
        });
    }
    let count = Arc::new(Count::default());
    let dir = tempfile::tempdir()?;
    let (perfetto, guard) = match mode {
        "perfetto" => {
            let mut builder =
                PerfettoLayer::builder().file(dir.path().join("stream.perfetto-trace"));
            if let Some(n) = o.perfetto_encoders {
                builder = builder.encoder_threads(n);
            }
            builder = match (o.perfetto_zlib, o.perfetto_when_behind) {
                (Some(level), true) => builder.compress_when_behind(level),
                (Some(level), false) => builder.compress(level),
                (None, _) => builder,
            };
            let (layer, guard) = builder.build()?;
            (Some(layer), Some(guard))
        }
        _ => (None, None),
    };
    let snapshots = Snapshots::default();
    let layers = tracing_subscriber::registry()
        .with(snapshots.clone())
        .with(perfetto)
        .with(SinkLayer::new(CountSink::new(count.clone(), o.walkers)?)?);
    let dispatch = match o.unfiltered {
        true => Dispatch::new(layers),
        false => Dispatch::new(layers.with(LevelFilter::INFO)),
    };
    let _default = tracing::dispatcher::set_default(&dispatch);
    let mut builder = Profiler::builder();
    if let Some(r) = o.ring {
        builder = builder.stream_capacity(r);
    }
    if let Some(n) = o.drain_threads {
        builder = builder.stream_drain_threads(n);
    }
    if mode == "watch" {
        let every = Duration::from_secs_f64(o.watch_every);
        builder = builder.watchdog(every).watchdog_every(every);
    }
    let profiler = builder
        .context(ctx.clone())
        .events(EVENTS)
        .capacity(o.capacity)
        .memory_limit(o.memory_limit)
        .stream_memory(o.stream_memory)
        .stream_interval(Duration::from_millis(o.interval_ms))
        .recalibrate_every(if o.no_recalibration {
            None
        } else {
            Some(DEFAULT_RECALIBRATION)
        })
        .build()?;
    // Prepared before the launch: everything the first probes use is loaded.
    let probe = match o.probe {
        true => Some(Probe::prepare(ctx)?),
        false => None,
    };
    let launched = Instant::now();
    let (ran, cpu) = profiler_cpu(|| -> Result<(f64, f64, u64, u64, Option<String>, _)> {
        let launched_ns = now_ns();
        // The timer starts inside the profiled call, right before the kernel: the
        // first streamed launch's setup (its arena of pinned memory, allocated and
        // zeroed by the launching thread) is the launch call's, printed apart.
        let launch = |trace| {
            timer.record_start(&stream)?;
            kernel.launch(&stream, iters, o, Some(trace))
        };
        match mode {
            "fixed" => gpu_profile!(profiler, &stream, "stream_bench", kernel.cfg, launch)?,
            _ => gpu_profile!(
                profiler.streamed(),
                &stream,
                "stream_bench",
                kernel.cfg,
                launch
            )?,
        }
        timer.record_end(&stream)?;
        let call_s = launched.elapsed().as_secs_f64();
        let run_probe = |p: Probe| probe_beside(p, &stream, launched, o, mode);
        let (probed, kernel_s) = std::thread::scope(|s| -> Result<(Option<String>, f64)> {
            // The probes from the launching thread before it waits, or (as the
            // collector's recalibrations are) from another thread while it waits.
            let (now, later) = match probe {
                Some(p) if o.probe_thread => (None, Some(s.spawn(move || run_probe(p)))),
                Some(p) => (Some(run_probe(p)), None),
                None => (None, None),
            };
            let kernel_s = timer.ms()? / 1e3;
            let later = match later {
                Some(h) => Some(h.join().map_err(|_| "the probe thread panicked")?),
                None => None,
            };
            Ok((now.or(later), kernel_s))
        })?;
        let done_ns = now_ns();
        // A failed recalibration (say, the GPU too busy for the calibration kernel)
        // is reported, and the figures are still printed.
        let flushed = profiler.flush().err().map(|e| e.to_string());
        Ok((kernel_s, call_s, launched_ns, done_ns, flushed, probed))
    });
    let (kernel_s, call_s, launched_ns, done_ns, flushed, probe) = ran?;
    if let Some(e) = &flushed {
        println!("  flush: {e}");
    }
    let stats = profiler.stats();
    if stats.calibrations_missed > 0 {
        println!(
            "  {} recalibration(s) failed while the kernel ran: its parts went with the checkpoints before",
            stats.calibrations_missed
        );
    }
    drop(profiler);
    if let Some(g) = guard {
        let w = g.finish()?;
        println!(
            "  perfetto: {} device events, {} bytes",
            w.device_events, w.bytes
        );
    }
    let last = count.last_ns.load(Ordering::Relaxed);
    let (lag_quarters_ms, lag_ms) = count.lags(launched_ns, done_ns);
    let snapshots: Vec<(String, f64)> = snapshots
        .0
        .lock()
        .iter()
        .map(|(t, at)| (t.clone(), at.duration_since(launched).as_secs_f64()))
        .collect();
    Ok(Figures {
        mode: mode.into(),
        seen: count.events.load(Ordering::Relaxed),
        kernel_s,
        call_s,
        produced,
        stats,
        delivered_after_s: last.saturating_sub(done_ns) as f64 / 1e9,
        lag_quarters_ms,
        lag_ms,
        cpu,
        peak_rss: peak_rss(),
        probe,
        snapshots,
    })
}

/// `watch`: whether a snapshot came each period of the kernel's run and each names only
/// the phases stream.cu's warps can be in, for at most `warps` warps; prints what fails.
fn snapshots_hold(f: &Figures, o: &Options, warps: u64) -> bool {
    let due = (f.kernel_s / o.watch_every).floor() as usize;
    // (A snapshot taken as the kernel ends may find every warp done.)
    let running = f
        .snapshots
        .iter()
        .any(|(t, _)| !snapshots::groups(t).0.is_empty());
    let mut ok = f.snapshots.len() + 1 >= due && running;
    if !ok {
        println!(
            "  FAIL: {} snapshots in {:.1} s, one each {} s",
            f.snapshots.len(),
            f.kernel_s,
            o.watch_every
        );
    }
    for (text, at) in &f.snapshots {
        let (lines, more) = snapshots::groups(text);
        let seen = lines.iter().map(|l| l.warps).sum::<u64>() + more;
        fn last(l: &snapshots::GroupLine) -> Option<&str> {
            l.last.as_ref().map(|(n, _)| n.as_str())
        }
        let bad: Vec<_> = lines
            .iter()
            .filter(|l| {
                let open: Vec<&str> = l.open.iter().map(String::as_str).collect();
                !matches!(
                    (open.as_slice(), last(l)),
                    ([] | ["load"], Some("load" | "issue"))
                        | (["load"], None)
                        | (["wait"], Some("mma") | None)
                        | (["mma"], Some("wait"))
                )
            })
            .collect();
        if seen > warps || !bad.is_empty() {
            println!("  FAIL: the snapshot at {at:.2} s ({seen} warps of {warps}; not the kernel's: {bad:?}):\n{text}");
            ok = false;
        }
    }
    if let Some((text, at)) = f.snapshots.first() {
        println!("  first snapshot, {at:.2} s after the launch:\n{text}");
    }
    ok
}

/// The process's peak resident memory since the mode began (`VmHWM`), in bytes.
fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib << 10)
}

fn run(o: &Options) -> Result<bool> {
    if o.warps < 2 {
        return Err("--warps must be at least 2 (a producer and a consumer)".into());
    }
    if !(0.0..=3600.0).contains(&o.probe_at) {
        return Err("--probe-at must be 0 to 3600 seconds".into());
    }
    println!("stream: {}", probe::env_line());
    if o.header.is_some() || !o.defines.is_empty() {
        let header = cli::Header::read(o.header.as_deref())?;
        println!(
            "stream: recorder build {}",
            cli::recorder_build_with(&o.defines, header.as_ref())
        );
    }
    let ctx = device::open(0)?;
    let iters = match o.iters {
        Some(i) => i,
        None => {
            // A short gate-off launch sets the loop's length.
            let stream = ctx.new_stream()?;
            let timer = Timer::new(&ctx)?;
            let kernel = Kernel::load(&ctx, &stream, "off", o)?;
            let probe = 20_000;
            timer.around(&stream, || kernel.launch(&stream, probe, o, None))?;
            let ms = timer.ms()?;
            ((o.seconds * 1e3 / ms.max(1e-3)) * probe as f64).clamp(1.0, u32::MAX as f64) as u32
        }
    };
    // stream.cu finds the iterations with a payload by adding `every` to a 32-bit count.
    if u64::from(iters) + u64::from(o.every) >= 1 << 32 {
        return Err(format!(
            "{iters} iterations and --every {}: their sum must be below 2^32",
            o.every
        )
        .into());
    }
    println!(
        "stream: {} SMs, {} warps per block, {iters} iterations per warp",
        device::sm_count(&ctx)?,
        o.warps
    );
    let mut off_s = None;
    let mut fixed_s = None;
    let mut memory_s = None;
    let mut ok = true;
    let mut json = String::new();
    for mode in &o.modes {
        if !["off", "fixed", "memory", "watch", "perfetto"].contains(&mode.as_str()) {
            return Err(format!("unknown mode {mode}").into());
        }
        let f = run_mode(mode, &ctx, iters, o)?;
        let st = &f.stats;
        if mode == "off" {
            off_s = Some(f.kernel_s);
        }
        if mode == "fixed" {
            fixed_s = Some(f.kernel_s);
        }
        if mode == "memory" {
            memory_s = Some(f.kernel_s);
        }
        let slow = |base: Option<f64>| base.map_or(f64::NAN, |b| (f.kernel_s / b - 1.0) * 100.0);
        let rate = st.events as f64 / f.kernel_s / 1e6;
        println!(
            "{:<9} kernel {:.3} s ({:+.2}% vs off, {:+.2}% vs fixed, {:+.2}% vs memory)  launch call {:.1} ms  produced {}  delivered {}  lost {}  \
             (drain stalls {}, rings unread at most {:.1} ms)  parts {}  checkpoints {}  {:.1} M events/s  last part {:.3} s after the kernel  memory {} MiB  peak RSS {} MiB  profiler threads' cpu {:.1} s \
             (collector {:.1}, drain {:.1}, other {:.1}; busiest thread {:.1} / {:.1} / {:.1}; the process's other threads {:.1}; waited for a core {:.2} / {:.2} / {:.2}, \
             the most one thread {:.3} / {:.3} / {:.3}; minor faults {:.0} / {:.0} / {:.0})  part lag ms: p50 {:.0} p99 {:.0} max {:.0}, \
             largest by quarter of the run {:.0} {:.0} {:.0} {:.0}",
            f.mode,
            f.kernel_s,
            slow(off_s),
            slow(fixed_s),
            slow(memory_s),
            f.call_s * 1e3,
            f.produced,
            st.events,
            st.events_lost,
            st.stream_stalls,
            st.stream_longest_gap.as_secs_f64() * 1e3,
            st.parts,
            st.calibrations,
            rate,
            f.delivered_after_s,
            st.memory_bytes >> 20,
            f.peak_rss.map_or("?".into(), |b| (b >> 20).to_string()),
            f.cpu.total(),
            f.cpu.by_role[ProfilerCpu::COLLECTOR],
            f.cpu.by_role[ProfilerCpu::DRAIN],
            f.cpu.by_role[ProfilerCpu::OTHER],
            f.cpu.busiest[ProfilerCpu::COLLECTOR],
            f.cpu.busiest[ProfilerCpu::DRAIN],
            f.cpu.busiest[ProfilerCpu::OTHER],
            f.cpu.by_role[ProfilerCpu::APP],
            f.cpu.waited[ProfilerCpu::COLLECTOR],
            f.cpu.waited[ProfilerCpu::DRAIN],
            f.cpu.waited[ProfilerCpu::OTHER],
            f.cpu.most_waited[ProfilerCpu::COLLECTOR],
            f.cpu.most_waited[ProfilerCpu::DRAIN],
            f.cpu.most_waited[ProfilerCpu::OTHER],
            f.cpu.faults[ProfilerCpu::COLLECTOR],
            f.cpu.faults[ProfilerCpu::DRAIN],
            f.cpu.faults[ProfilerCpu::OTHER],
            f.lag_ms[0],
            f.lag_ms[1],
            f.lag_ms[2],
            f.lag_quarters_ms[0],
            f.lag_quarters_ms[1],
            f.lag_quarters_ms[2],
            f.lag_quarters_ms[3],
        );
        json.push_str(&format!(
            "{{\"mode\":\"{}\",\"kernel_s\":{},\"launch_call_s\":{},\"produced\":{},\"delivered\":{},\"events_lost\":{},\"stream_stalls\":{},\"stream_longest_gap_s\":{},\"parts\":{},\"calibrations\":{},\
             \"events_per_s\":{},\"last_part_after_s\":{},\"memory_bytes\":{},\"peak_rss_bytes\":{},\"cpu_s\":{},\"cpu_by_role_s\":{:?},\"busiest_thread_by_role_s\":{:?},\
             \"waited_by_role_s\":{:?},\"most_waited_by_role_s\":{:?},\"minor_faults_by_role\":{:?},\"part_lag_ms\":{},\"part_lag_by_quarter_ms\":{},\"failed\":{}{}}}\n",
            f.mode,
            f.kernel_s,
            f.call_s,
            f.produced,
            st.events,
            st.events_lost,
            st.stream_stalls,
            st.stream_longest_gap.as_secs_f64(),
            st.parts,
            st.calibrations,
            st.events as f64 / f.kernel_s,
            f.delivered_after_s,
            st.memory_bytes,
            f.peak_rss.map_or("null".into(), |b| b.to_string()),
            f.cpu.total(),
            f.cpu.by_role,
            f.cpu.busiest,
            f.cpu.waited,
            f.cpu.most_waited,
            f.cpu.faults,
            json_ms(&f.lag_ms),
            json_ms(&f.lag_quarters_ms),
            st.failed,
            f.probe
                .as_ref()
                .map_or(String::new(), |p| format!(",\"probe\":{p}"))
        ));
        // Recorded: every event produced is delivered or counted lost, exactly (the
        // fixed slots lose what does not fit, a stream what outruns the drain).
        let recorded = mode != "off";
        let exact = st.events + st.events_lost == f.produced;
        if recorded && (!exact || st.failed != 0 || st.delivered != 1 || f.seen != st.events) {
            println!(
                "  FAIL: produced {}, delivered {} + lost {} = {} (sink saw {}, failed {})",
                f.produced,
                st.events,
                st.events_lost,
                st.events + st.events_lost,
                f.seen,
                st.failed
            );
            ok = false;
        }
        if mode == "watch" {
            let grid = device::sm_count(&ctx)? as u64 * o.warps as u64;
            ok &= snapshots_hold(&f, o, grid);
        }
    }
    if let Some(p) = &o.json {
        std::fs::write(p, json)?;
    }
    Ok(ok)
}

/// Milliseconds as a JSON array (`null` for none).
fn json_ms(v: &[f64]) -> String {
    let items: Vec<String> = v
        .iter()
        .map(|x| match x.is_finite() {
            true => format!("{x:.3}"),
            false => "null".into(),
        })
        .collect();
    format!("[{}]", items.join(","))
}

fn main() -> ExitCode {
    let o = Options::parse();
    let start = Instant::now();
    let r = run(&o);
    eprintln!("stream: {:.1} s", start.elapsed().as_secs_f64());
    cli::exit("stream", r)
}
