//! [`Profiler`]: one per CUDA context. It owns the device's clock calibration,
//! an arena of trace memory, and a collector thread that brings profiled
//! launches back in bulk, decodes them and hands them to the subscriber
//! ([`crate::deliver`]).
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use tracing_gpu::cuda::{gpu_profile, Profiler};
//! use tracing_gpu::cuda::cudarc::driver::{LaunchConfig, PushKernelArg};
//! # let (ctx, module) = todo_context();
//! let profiler = Profiler::builder().context(ctx.clone()).events([(1, "load"), (2, "mma")]).build()?;
//! let stream = ctx.new_stream()?;
//! let f = module.load_function("gemm")?;
//! let cfg = LaunchConfig { grid_dim: (132, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
//! gpu_profile!(profiler, &stream, "gemm", cfg, |trace| unsafe {
//!     stream.launch_builder(&f).arg(&trace).launch(cfg)
//! })?;
//! profiler.flush()?; // optional: waits until the trace has it
//! # Ok(()) }
//! # fn todo_context() -> (std::sync::Arc<tracing_gpu::cuda::cudarc::driver::CudaContext>, std::sync::Arc<tracing_gpu::cuda::cudarc::driver::CudaModule>) { unimplemented!() }
//! ```
//!
//! # What a launch costs the application
//!
//! On the launching thread: a host span, a region of the arena (a short lock
//! shared with the collector, which holds it only to give regions back), one
//! clock read, the launch itself, a clone of the stream's `Arc` and a channel
//! send. Besides the launch, one driver call: asking whether the stream is
//! capturing a graph (not asked of the legacy stream, which cannot capture).
//! The launching thread records no event: the collector records one on the
//! stream when it next looks, for all the launches made there since (it holds
//! the stream until then); only on a per-thread default stream, and for a
//! graph replay ([`Profiler::launch_graph`]), does the launching thread record
//! it. Nothing is allocated on the device, and no copy, memset or
//! synchronisation is added to the application's stream: the
//! arena was zeroed when it was made, and the collector zeroes each region
//! (on its own stream) before giving it back. The device never reads the
//! buffer header (`docs/format.md`), so the collector writes it into the host
//! copy.
//!
//! The collector asks each stream for its finished launches every few
//! milliseconds, copies every finished one back at once (one copy per run of neighbouring regions),
//! zeroes them, and decodes (`collector.rs`); docs/architecture.md says why
//! it is built this way, and which designs were weighed.
//!
//! The application never waits for profiling unless it asks: when the arena
//! is full, a launch runs without recording (counted in
//! [`ProfilerStats::skipped`]) unless [`ProfilerBuilder::wait_for_buffers`] is
//! set. [`Profiler::flush`] and dropping the profiler wait for every launch made
//! so far to reach the subscriber.
//!
//! # CUDA graphs
//!
//! `gpu_profile!` on a stream that is capturing makes the launch a profiled
//! kernel node (`graph.rs`); [`Profiler::graph`] adopts the captured graph, and
//! [`Profiler::launch_graph`] replays it: one batch per profiled node per
//! replay, each with its own launch id, under the replay's span.
//!
//! # Several GPUs
//!
//! Build one profiler per context. Each calibrates its own device, numbers its
//! launches from one process-wide counter (so launch ids never collide in a
//! trace), and delivers to the dispatcher current at each launch: they all
//! feed one trace, with one GPU track per device.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::{sys, CudaContext, CudaGraph, CudaStream, DeviceRepr, LaunchConfig};

mod clock;
mod graph;
mod launch;
mod names;
mod rings;
mod streamed;

pub use graph::{ProfiledGraph, MAX_GRAPHS, MAX_GRAPH_NODES};
pub use rings::{DEFAULT_STREAM_INTERVAL, DEFAULT_STREAM_MEMORY};
pub use streamed::Streaming;

use crate::cuda::collector::{Collector, CollectorConfig, BRING_BACK_EVERY};
use crate::cuda::calibrate::Calibrator;
use crate::cuda::device::{allocate, device_info, CudaDevice, Events};
use crate::cuda::device::{Arena, Kind, Memory, Place, Region, Shape};
use crate::cuda::drain::{DrainConfig, DrainThreads, BACKLOG_BYTES};
use crate::cuda::error::ProfilerError;
use crate::cuda::job::Work;
use crate::cuda::ledger::{Ledger, ProfilerStats};
use crate::cuda::recorder::CaptureRecorder;
use clock::start_clock;
use graph::Graphs;
use names::{kernel_name, thread_name};
use rings::{MappedArena, RingSettings};
use crate::batch::{DeviceInfo, LaunchInfo};
use crate::clock::{Calibration, HostClock};
use crate::format::{self, BufferHeader, KernelArg};
use crate::registry::EventRegistry;

// SAFETY: `KernelArg` is `repr(C)`, 16 bytes of plain integers, the layout of
// `tgpu::Trace` in the header: it can be copied into the parameter bank as is.
unsafe impl DeviceRepr for KernelArg {}

/// Launch ids: one counter for the whole process, so that launches of several
/// profilers (several GPUs) never share an id in one trace.
static NEXT_LAUNCH_ID: AtomicU64 = AtomicU64::new(1);

/// The next launch id.
pub fn next_launch_id() -> u64 {
    NEXT_LAUNCH_ID.fetch_add(1, Ordering::Relaxed)
}

/// `n` consecutive launch ids (a graph replay's nodes); returns the first.
pub(crate) fn reserve_launch_ids(n: u64) -> u64 {
    NEXT_LAUNCH_ID.fetch_add(n, Ordering::Relaxed)
}

/// Default records per warp slot.
pub const DEFAULT_CAPACITY: u32 = 256;
/// Default size of the arena: 128 MiB of device memory (and as much pinned
/// host memory), allocated when the profiler is built.
pub const DEFAULT_MEMORY_LIMIT: usize = 128 << 20;
/// Default number of replay regions of a profiled graph: replays in flight
/// (launched, not yet brought back) beyond it run unrecorded and are counted.
pub const DEFAULT_GRAPH_REGIONS: usize = 4;
/// How long a launch waits for room with [`ProfilerBuilder::wait_for_buffers`]
/// before it runs unrecorded.
const WAIT_FOR_ROOM: Duration = Duration::from_secs(10);
/// Default recalibration period.
pub const DEFAULT_RECALIBRATION: Duration = Duration::from_secs(1);

/// Builds a [`Profiler`]; see [`Profiler::builder`].
#[derive(Debug, Clone)]
pub struct ProfilerBuilder {
    device: Option<usize>,
    context: Option<Arc<CudaContext>>,
    capacity: u32,
    memory_limit: usize,
    wait_for_buffers: bool,
    graph_regions: usize,
    registries: Vec<EventRegistry>,
    events: Vec<(u16, String)>,
    recalibrate_every: Option<Duration>,
    bring_back_every: Duration,
    rounds: (usize, usize),
    pollers: u32,
    recorder: Option<Arc<CaptureRecorder>>,
    lineinfo: bool,
    pub(super) stream: RingSettings,
}

impl Default for ProfilerBuilder {
    fn default() -> Self {
        ProfilerBuilder {
            device: None,
            context: None,
            capacity: DEFAULT_CAPACITY,
            memory_limit: DEFAULT_MEMORY_LIMIT,
            wait_for_buffers: false,
            graph_regions: DEFAULT_GRAPH_REGIONS,
            registries: Vec::new(),
            events: Vec::new(),
            recalibrate_every: Some(DEFAULT_RECALIBRATION),
            bring_back_every: BRING_BACK_EVERY,
            rounds: (Calibrator::INITIAL_ROUNDS, Calibrator::PERIODIC_ROUNDS),
            pollers: Calibrator::DEFAULT_POLLERS,
            recorder: None,
            lineinfo: true,
            stream: RingSettings::default(),
        }
    }
}

impl ProfilerBuilder {
    /// Profile on the primary context of GPU `ordinal` (default 0).
    pub fn device(mut self, ordinal: usize) -> Self {
        self.device = Some(ordinal);
        self
    }

    /// Profile on this context (the application's own).
    pub fn context(mut self, ctx: Arc<CudaContext>) -> Self {
        self.context = Some(ctx);
        self
    }

    /// Records per warp slot (default [`DEFAULT_CAPACITY`]); a warp that records
    /// more drops the rest and the trace says how many.
    pub fn capacity(mut self, records: u32) -> Self {
        self.capacity = records;
        self
    }

    /// Size of the arena, the device memory that launches' records go to
    /// (default [`DEFAULT_MEMORY_LIMIT`]), allocated once when the profiler is
    /// built, with as much pinned host memory to copy it back into. A launch
    /// that finds no room runs unrecorded ([`ProfilerStats::skipped`]).
    pub fn memory_limit(mut self, bytes: usize) -> Self {
        self.memory_limit = bytes;
        self
    }

    /// When the arena is full: wait for room (`true`, up to 10 s, then the
    /// launch runs unrecorded), or launch without recording (`false`, the
    /// default: profiling never blocks the application).
    pub fn wait_for_buffers(mut self, wait: bool) -> Self {
        self.wait_for_buffers = wait;
        self
    }

    /// Replay regions of each profiled graph (default [`DEFAULT_GRAPH_REGIONS`],
    /// rounded up to a power of two): how many replays may be in flight, not
    /// yet brought back, before further ones run unrecorded. Each holds every
    /// profiled node's buffer, allocated by [`Profiler::graph`].
    pub fn graph_regions(mut self, regions: usize) -> Self {
        self.graph_regions = regions;
        self
    }

    /// Event types: names, categories, descriptions and declared payloads
    /// (adds to those given before; a conflict fails the build).
    pub fn registry(mut self, registry: EventRegistry) -> Self {
        self.registries.push(registry);
        self
    }

    /// Event names as `(id, name)` pairs (adds to those given before).
    pub fn events<'a>(mut self, pairs: impl IntoIterator<Item = (u16, &'a str)>) -> Self {
        self.events
            .extend(pairs.into_iter().map(|(id, n)| (id, n.to_string())));
        self
    }

    /// How often to refresh the clock calibration while launches are profiled
    /// (default [`DEFAULT_RECALIBRATION`]); `None` keeps the first one.
    pub fn recalibrate_every(mut self, period: Option<Duration>) -> Self {
        self.recalibrate_every = period;
        self
    }

    /// How often the collector asks the driver which launches have finished and
    /// brings them back (default 5 ms). Its queries, copies and zeroing meet the
    /// launching threads' calls inside the driver; longer delays them less
    /// often, at the price of more of the arena held. It asks sooner anyway
    /// when the pending launches hold an eighth of the arena, a graph replay
    /// waits, or a flush does.
    pub fn bring_back_every(mut self, every: Duration) -> Self {
        self.bring_back_every = every;
        self
    }

    /// Ping-pong rounds of the first calibration and of each periodic one
    /// (default [`Calibrator::INITIAL_ROUNDS`] and [`Calibrator::PERIODIC_ROUNDS`]):
    /// more rounds find tighter samples (a smaller error bound) and cost the
    /// collector thread about 3 µs each (docs/calibration.md).
    pub fn calibration_rounds(mut self, initial: usize, periodic: usize) -> Self {
        self.rounds = (initial, periodic);
        self
    }

    /// GPU pollers in the calibration kernel (default
    /// [`Calibrator::DEFAULT_POLLERS`]; see [`Calibrator::set_pollers`]).
    pub fn calibration_pollers(mut self, pollers: u32) -> Self {
        self.pollers = pollers;
        self
    }

    /// Also record the run (devices, calibrations, launches) into a capture
    /// file at `path`, written when the profiler is dropped, with each launch's
    /// own span (from the clock read before the launch call to its completion),
    /// so that a replay has launch slices and arrows to the kernels. The other
    /// host spans are recorded only by the recorder's layer in the subscriber:
    /// for them, and for one file from several profilers, make a
    /// [`CaptureRecorder`], add its [`layer`](CaptureRecorder::layer) to the
    /// subscriber and pass it to [`ProfilerBuilder::recorder`]. A capture
    /// without them says so in its metadata, and the CLI says it when it
    /// replays the file.
    pub fn capture_to(self, path: impl Into<PathBuf>) -> Self {
        self.recorder(CaptureRecorder::new(path))
    }

    /// Also record the run into `recorder` (shared by several profilers, and
    /// with its [`CaptureRecorder::layer`] for the host spans).
    pub fn recorder(mut self, recorder: Arc<CaptureRecorder>) -> Self {
        self.recorder = Some(recorder);
        self
    }

    /// Whether the kernels the profiler compiles (its clock calibration's) carry line
    /// info ([`super::KernelBuild::lineinfo()`]); on by default.
    pub fn lineinfo(mut self, on: bool) -> Self {
        self.lineinfo = on;
        self
    }

    /// Checks the libraries and the device, calibrates the clock, and starts the
    /// collector thread.
    pub fn build(mut self) -> Result<Profiler, ProfilerError> {
        super::ensure_libraries()?;
        let ctx = match self.context.take() {
            Some(c) => c,
            None => {
                let ordinal = self.device.unwrap_or(0);
                let count = CudaContext::device_count()? as usize;
                if ordinal >= count {
                    return Err(ProfilerError::NoDevice { ordinal, count });
                }
                CudaContext::new(ordinal)?
            }
        };
        if self.capacity == 0 || self.capacity & format::TRACE_INDIRECT != 0 {
            return Err(ProfilerError::Invalid(format!(
                "capacity must be 1 to {} records per warp",
                format::TRACE_INDIRECT - 1
            )));
        }
        self.stream.check()?;
        let mut registry = EventRegistry::new();
        for r in &self.registries {
            registry.merge(r)?;
        }
        for (id, name) in &self.events {
            registry.register(*id, name)?;
        }
        let device = Arc::new(device_info(&ctx)?);
        if self.rounds.0 == 0 || self.rounds.1 == 0 {
            return Err(ProfilerError::Invalid(
                "calibration rounds must be at least one".into(),
            ));
        }
        let (first, recalibrate) = start_clock(
            &ctx,
            self.recalibrate_every,
            self.rounds,
            self.pollers,
            self.lineinfo,
        )?;
        let archive = match &self.recorder {
            Some(rec) => {
                rec.add_registry(&registry)?;
                rec.add_device(&device);
                let mut a = rec.archive();
                a.calibration(&device, &first);
                Some(a)
            }
            None => None,
        };
        let shared = Ledger::new(Calibration::new(first.checkpoint.clone()));
        let memory = Arc::new(allocate(&ctx, Kind::Arena, self.memory_limit, None, None)?);
        let arena = Arc::new(Arena::new(self.memory_limit));
        // Enough for the launches a busy stream holds in its queue.
        let events = Arc::new(Events::new(&ctx, 1024)?);
        let graphs = Graphs::new(&ctx, self.lineinfo)?;
        let bind = ctx.clone();
        let collector = Collector::spawn(
            CollectorConfig {
                device: device.clone(),
                registry: Arc::new(registry),
                recalibrate,
                archive,
                backend: Box::new(CudaDevice::new(&ctx, events.clone())?),
                arena: arena.clone(),
                // Half the cores, up to 4: the application and the sinks' writer
                // threads need the rest.
                decoders: std::thread::available_parallelism()
                    .map_or(1, |n| n.get() / 2)
                    .clamp(1, 4),
                drain: DrainConfig {
                    threads: self
                        .stream
                        .drain_threads
                        .map_or_else(DrainThreads::by_cores, DrainThreads::exactly),
                    interval: self.stream.interval,
                    backlog: BACKLOG_BYTES,
                },
                bring_back_every: self.bring_back_every,
                on_start: Some(Box::new(move || {
                    let _ = bind.bind_to_thread();
                    // The collector's calls must not invalidate a graph the
                    // application captures meanwhile (in the global mode,
                    // another thread's "unsafe" call would).
                    let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
                    // SAFETY: a valid in/out pointer.
                    let _ = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) };
                })),
            },
            shared.clone(),
        )?;
        Ok(Profiler {
            ctx,
            device,
            capacity: self.capacity,
            wait: self.wait_for_buffers.then_some(WAIT_FOR_ROOM),
            graph_regions: self.graph_regions,
            memory,
            arena,
            events,
            graphs,
            shared,
            collector,
            stream_settings: self.stream,
            streaming: MappedArena::default(),
        })
    }
}

/// One CUDA context's profiler: see the module docs.
pub struct Profiler {
    pub(super) ctx: Arc<CudaContext>,
    device: Arc<DeviceInfo>,
    capacity: u32,
    wait: Option<Duration>,
    graph_regions: usize,
    /// The arena's device memory and mirror; `arena` says which bytes are whose.
    memory: Arc<Memory>,
    arena: Arc<Arena>,
    pub(super) events: Arc<Events>,
    graphs: Arc<Graphs>,
    pub(super) shared: Arc<Ledger>,
    pub(super) collector: Collector,
    pub(super) stream_settings: RingSettings,
    /// The streaming arena, made at the first streamed launch (`streaming.rs`).
    pub(super) streaming: MappedArena,
}

impl std::fmt::Debug for Profiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Profiler")
            .field("device", &self.device)
            .field("capacity", &self.capacity)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl Profiler {
    /// A builder: device 0, [`DEFAULT_CAPACITY`] records per warp,
    /// [`DEFAULT_MEMORY_LIMIT`], recalibration every [`DEFAULT_RECALIBRATION`].
    pub fn builder() -> ProfilerBuilder {
        ProfilerBuilder::default()
    }

    /// The profiler's context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The profiled GPU.
    pub fn device(&self) -> &Arc<DeviceInfo> {
        &self.device
    }

    /// The NVRTC target for this GPU (`"sm_90"` on an H200), for
    /// [`super::KernelBuild`]: its own compute capability, or the newest one
    /// below it that this crate knows.
    pub fn arch(&self) -> &'static str {
        const KNOWN: [((u32, u32), &str); 10] = [
            ((12, 0), "sm_120"),
            ((10, 0), "sm_100"),
            ((9, 0), "sm_90"),
            ((8, 9), "sm_89"),
            ((8, 7), "sm_87"),
            ((8, 6), "sm_86"),
            ((8, 0), "sm_80"),
            ((7, 5), "sm_75"),
            ((7, 2), "sm_72"),
            ((7, 0), "sm_70"),
        ];
        let cc = self.device.compute_capability;
        KNOWN
            .iter()
            .find(|(k, _)| *k <= cc)
            .map_or("sm_70", |(_, a)| a)
    }

    /// The current device → host clock mapping.
    pub fn calibration(&self) -> Arc<Calibration> {
        self.shared.calibration()
    }

    /// Counters so far.
    pub fn stats(&self) -> ProfilerStats {
        ProfilerStats {
            memory_bytes: (self.arena.capacity() + self.streaming.bytes()) as u64,
            arena_in_use: self.arena.used() as u64,
            ..self.shared.stats()
        }
    }

    /// Runs `launch` with a trace buffer for a launch of shape `cfg` on `stream`,
    /// inside `span` (`gpu_profile!` calls this; use it directly to choose the
    /// span yourself). `launch` gets the [`KernelArg`] to pass to the kernel (as
    /// `tgpu::Trace`, by value) and must make exactly one launch on `stream`.
    ///
    /// The host time is read just before `launch` runs; the launch's completion
    /// is queued for the collector; the launch's result is returned as it is. A
    /// launch that fails (returns `Err`) is not traced.
    pub fn launch<T, E, F>(
        &self,
        stream: &Arc<CudaStream>,
        kernel: &str,
        cfg: LaunchConfig,
        launch_id: u64,
        span: tracing::Span,
        launch: F,
    ) -> Result<T, ProfilerError>
    where
        F: FnOnce(KernelArg) -> Result<T, E>,
        E: Into<ProfilerError>,
    {
        if **stream.context() != *self.ctx {
            return Err(ProfilerError::WrongContext {
                profiler_device: self.ctx.ordinal(),
                stream_device: stream.context().ordinal(),
            });
        }
        let shape = Shape::of(&cfg, self.capacity, self.arena.capacity())?;
        let header = BufferHeader {
            version: format::VERSION,
            slot_capacity: self.capacity,
            slot_count: shape.slots,
            warps_per_block: shape.warps_per_block,
            launch_id,
            grid: [cfg.grid_dim.0, cfg.grid_dim.1, cfg.grid_dim.2],
            block: [cfg.block_dim.0, cfg.block_dim.1, cfg.block_dim.2],
            flags: 0,
        };
        self.ctx.bind_to_thread()?;
        // The legacy default stream (null) cannot capture: spare it the call.
        let capture = if stream.cu_stream().is_null() {
            sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
        } else {
            // SAFETY: the stream is live (borrowed) and its context is bound.
            unsafe { cudarc::driver::result::stream::is_capturing(stream.cu_stream())? }
        };
        if capture != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
            // A node of a graph: it finds its memory at each replay (graph.rs).
            let _entered = span.enter();
            return self
                .graphs
                .launch_captured(stream, kernel, &shape, header, launch);
        }
        let region = self.arena.alloc(shape.bytes, self.wait);
        let memory = &self.memory;
        self.launch_in(
            (stream, kernel, header, span),
            (&self.arena, region),
            |r| KernelArg {
                base: memory.dptr + r.offset as u64,
                capacity: self.capacity,
                slot_count: shape.slots,
            },
            launch,
            |region| Work::Launch {
                header,
                place: Place {
                    memory: memory.clone(),
                    region,
                },
            },
        )
    }

    /// Adopts a graph captured with profiled launches in it (made with
    /// [`gpu_profile!`](crate::gpu_profile) while its stream captured), so that
    /// [`Profiler::launch_graph`] records every replay: allocates its replay
    /// regions ([`ProfilerBuilder::graph_regions`]) and writes its state on the
    /// device. A graph without profiled launches is adopted as it is.
    pub fn graph(&self, graph: CudaGraph) -> Result<ProfiledGraph, ProfilerError> {
        self.graphs.adopt(graph, self.graph_regions)
    }

    /// Replays `graph` on `stream`, inside an `INFO` span `gpu.graph` (fields
    /// `gpu.graph`: `name`, `gpu.replay`, `gpu.launch_id` of its first node,
    /// `gpu.nodes`): one batch per profiled kernel node reaches the
    /// subscriber, each with its own launch id (consecutive, in capture
    /// order), under the replay's span. A replay that finds its region still
    /// in use (more than [`ProfilerBuilder::graph_regions`] replays in flight)
    /// runs unrecorded and its nodes are counted as skipped.
    ///
    /// Every replay of a profiled graph must go through here: the device
    /// numbers replays as they run, and the host numbers them here. The
    /// collector compares the two counts after each replay; once they
    /// disagree (the graph was replayed another way, or its executable graph
    /// updated in place), this returns [`ProfilerError::GraphOutOfStep`] for
    /// the graph without launching it, and so does the next
    /// [`Profiler::flush`].
    pub fn launch_graph(
        &self,
        graph: &ProfiledGraph,
        stream: &Arc<CudaStream>,
        name: &str,
    ) -> Result<(), ProfilerError> {
        if **stream.context() != *self.ctx {
            return Err(ProfilerError::WrongContext {
                profiler_device: self.ctx.ordinal(),
                stream_device: stream.context().ordinal(),
            });
        }
        self.ctx.bind_to_thread()?;
        let exec = graph.graph().cu_graph_exec();
        let Some(ready) = &graph.ready else {
            // SAFETY: a live executable graph and stream of this context.
            unsafe { sys::cuGraphLaunch(exec, stream.cu_stream()).result()? };
            return Ok(());
        };
        if let Some(o) = ready.count.out_of_step() {
            return Err(o.error(name));
        }
        let n = ready.nodes.len() as u64;
        let first_id = reserve_launch_ids(n);
        let order = ready.order.lock();
        let replay = ready.count.launched();
        ready.count.set_launched(replay + 1);
        let span = tracing::info_span!(
            "gpu.graph",
            gpu.graph = name,
            gpu.replay = replay,
            gpu.launch_id = first_id,
            gpu.nodes = n,
            gpu.device = self.device.ordinal as u64,
        );
        let entered = span.enter();
        let host_launch_ns = HostClock::Boottime.now_ns();
        // SAFETY: a live executable graph and stream of this context.
        if let Err(e) = unsafe { sys::cuGraphLaunch(exec, stream.cu_stream()).result() } {
            ready.count.set_launched(replay);
            return Err(e.into());
        }
        drop(order);
        drop(entered);
        self.shared.count_replay(n);
        let place = Place {
            memory: ready.ring.clone(),
            region: Region {
                offset: (replay & ready.mask) as usize * ready.region,
                len: ready.region,
                seq: replay,
            },
        };
        let launch = LaunchInfo {
            launch_id: first_id,
            kernel: kernel_name(name),
            host_launch_ns,
            host_complete_ns: 0,
            parent: span.id(),
            host_thread: thread_name(),
            ..Default::default()
        };
        let work = Work::Replay {
            replay,
            place,
            nodes: ready.nodes.clone(),
            count: ready.count.clone(),
        };
        self.hand_over(stream, span, launch, work);
        Ok(())
    }

    /// Waits until every launch made so far has reached the subscriber, then
    /// flushes our layers in the dispatchers delivered to. Returns the first
    /// error since the last flush (a buffer that did not decode, a failed
    /// recalibration); [`ProfilerStats::failed`] counts them all.
    pub fn flush(&self) -> Result<(), ProfilerError> {
        self.collector.flush()
    }
}

impl Drop for Profiler {
    fn drop(&mut self) {
        // Waits for the outstanding launches; errors have nowhere to go here
        // (call `flush` first to see them).
        let _ = self.collector.stop();
    }
}

/// `gpu_profile!(profiler, &stream, "name", cfg, |trace| launch)`: profiles one
/// kernel launch.
///
/// - `profiler`: a [`Profiler`] (or a reference, or an `Arc`);
/// - `&stream`: the `Arc<CudaStream>` the launch goes to (of the profiler's context; the
///   collector holds a clone until it has marked the launch);
/// - `"name"`: the launch's name in the trace (the kernel slice's): a string
///   literal, which also names the host span, or any `&str` expression (a
///   kernel chosen at run time), for which the host span is named `gpu.launch`
///   and carries the name in its `gpu.kernel` field (span names are static in
///   `tracing`);
/// - `cfg`: the launch's `LaunchConfig` (the trace buffer is sized from it);
/// - `|trace| launch`: makes the launch, passing `trace` (a [`KernelArg`], which
///   is `tgpu::Trace` on the device) as a kernel argument, and returns its result
///   (`Result<_, E>` with `E: Into<ProfilerError>`, such as cudarc's `DriverError`).
///
/// It opens an `INFO` span (fields `gpu.launch_id` and `gpu.device`), entered
/// around the launch, reads the host clock just before the launch (the batch's
/// `LaunchInfo::host_launch_ns`: every output shows the launch's latency from
/// it), queues the completion for the collector, and returns
/// `Result<T, ProfilerError>` with the launch's own value. The launch time is
/// not recorded on the span: a field recorded after the launch cost the call
/// a fifth of the span's time (`cargo bench --bench launch_path`).
/// A missing library, a stream of another context, or a buffer over the memory
/// limit is an error, never a panic; nothing is launched then.
///
/// ```no_run
/// # use tracing_gpu::cuda::{gpu_profile, Profiler, ProfilerError};
/// # use std::sync::Arc;
/// # use tracing_gpu::cuda::cudarc::driver::{CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
/// # fn f(profiler: &Profiler, stream: &Arc<CudaStream>, k: &CudaFunction, n: u32) -> Result<(), ProfilerError> {
/// let cfg = LaunchConfig::for_num_elems(n);
/// gpu_profile!(profiler, stream, "scale", cfg, |trace| unsafe {
///     stream.launch_builder(k).arg(&n).arg(&trace).launch(cfg)
/// })?;
/// let name = format!("scale_{n}");
/// gpu_profile!(profiler, stream, &name, cfg, |trace| unsafe {
///     stream.launch_builder(k).arg(&n).arg(&trace).launch(cfg)
/// })?;
/// # Ok(()) }
/// ```
#[macro_export]
macro_rules! gpu_profile {
    ($profiler:expr, $stream:expr, $name:literal, $cfg:expr, $launch:expr $(,)?) => {{
        let __tgpu_profiler = &$profiler;
        let __tgpu_id = $crate::cuda::__private::next_launch_id();
        let __tgpu_span = $crate::cuda::__private::tracing::info_span!(
            $name,
            gpu.launch_id = __tgpu_id,
            gpu.device = __tgpu_profiler.device().ordinal as u64,
        );
        __tgpu_profiler.launch($stream, $name, $cfg, __tgpu_id, __tgpu_span, $launch)
    }};
    ($profiler:expr, $stream:expr, $name:expr, $cfg:expr, $launch:expr $(,)?) => {{
        let __tgpu_profiler = &$profiler;
        let __tgpu_name: &str = $name;
        let __tgpu_id = $crate::cuda::__private::next_launch_id();
        let __tgpu_span = $crate::cuda::__private::tracing::info_span!(
            "gpu.launch",
            gpu.kernel = __tgpu_name,
            gpu.launch_id = __tgpu_id,
            gpu.device = __tgpu_profiler.device().ordinal as u64,
        );
        __tgpu_profiler.launch($stream, __tgpu_name, $cfg, __tgpu_id, __tgpu_span, $launch)
    }};
}

#[cfg(test)]
mod tests;
