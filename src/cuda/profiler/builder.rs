//! [`ProfilerBuilder`]: a profiler's configuration, and building it (the
//! arena, the first calibration, the collector thread).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::{sys, CudaContext};

use crate::clock::Calibration;
use crate::cuda::calibrate::Calibrator;
use crate::cuda::collector::{Collector, CollectorConfig, BRING_BACK_EVERY};
use crate::cuda::compile::ensure_libraries;
use crate::cuda::device::{allocate, device_info, Arena, CudaDevice, Events, Kind};
use crate::cuda::drain::{DrainConfig, DrainThreads, BACKLOG_BYTES};
use crate::cuda::error::ProfilerError;
use crate::cuda::job::Watchdog;
use crate::cuda::ledger::Ledger;
use crate::cuda::recorder::CaptureRecorder;
use crate::format;
use crate::registry::EventRegistry;

use super::clock::start_clock;
use super::graph::Graphs;
use super::rings::{MappedArena, RingSettings};
use super::sampler::Sampler;
use super::Profiler;

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
#[must_use = "a builder does nothing until `build` is called"]
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
    sampler: Sampler,
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
            sampler: Sampler::default(),
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
    /// that finds no room runs unrecorded ([`ProfilerStats::skipped`](crate::cuda::ProfilerStats::skipped)).
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
    /// info ([`KernelBuild::lineinfo()`](crate::cuda::KernelBuild::lineinfo)); on by default.
    pub fn lineinfo(mut self, on: bool) -> Self {
        self.lineinfo = on;
        self
    }

    /// A watchdog for streamed launches (issue #32): a streamed launch still running
    /// `deadline` after its launch call gets a snapshot of every warp of its grid, what
    /// each is in, with the payload it closed last, and since when, grouped so that the
    /// stuck ones stand out, as one ERROR event (target `tracing_gpu::watchdog`) under
    /// its launch span. The kernel must be built with `TGPU_WATCH=1`, which publishes
    /// each entry as it is stamped; a kernel built without it shows every block as not
    /// started. Off by default; the variable `TGPU_WATCHDOG` (seconds) sets it when
    /// this is not called, and [`Streaming::watchdog`](super::Streaming::watchdog) per
    /// launch. The collector thread reads the mapped watch cells: no driver call, and
    /// nothing on the launch path.
    pub fn watchdog(mut self, deadline: Duration) -> Self {
        let every = self.stream.watchdog.and_then(|w| w.every);
        self.stream.watchdog = Some(Watchdog { deadline, every });
        self
    }

    /// After the watchdog's first snapshot, another every `every` while the launch
    /// runs: a live view of a persistent kernel (`TGPU_WATCHDOG_EVERY`, seconds, when
    /// not called). Needs [`ProfilerBuilder::watchdog`] (or `TGPU_WATCHDOG`).
    pub fn watchdog_every(mut self, every: Duration) -> Self {
        let deadline = self.stream.watchdog.map(|w| w.deadline);
        self.stream.watchdog = Some(Watchdog {
            deadline: deadline.unwrap_or(Duration::ZERO),
            every: Some(every),
        });
        self
    }

    /// Which launches, blocks and warps to record (default: all of them); a
    /// launch can choose its own ([`Profiler::sampled`]).
    pub fn sampler(mut self, sampler: Sampler) -> Self {
        self.sampler = sampler;
        self
    }

    /// Checks the libraries and the device, calibrates the clock, and starts the
    /// collector thread.
    pub fn build(mut self) -> Result<Profiler, ProfilerError> {
        ensure_libraries()?;
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
        self.stream.watchdog = self.watchdog_setting(|name| std::env::var(name).ok())?;
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
            sampler: self.sampler,
        })
    }
}

impl ProfilerBuilder {
    /// The watchdog: the builder's, with what it did not set taken from the
    /// environment (`var`); refused if it has a period but no deadline.
    pub(super) fn watchdog_setting(
        &self,
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Watchdog>, ProfilerError> {
        let env = Watchdog::from_env(&var)?;
        let set = self.stream.watchdog;
        let every = set.and_then(|w| w.every).or(env.and_then(|w| w.every));
        let deadline = set
            .map(|w| w.deadline)
            .filter(|d| !d.is_zero())
            .or(env.map(|w| w.deadline));
        match (deadline, every) {
            (Some(deadline), every) => Ok(Some(Watchdog { deadline, every })),
            (None, None) => Ok(None),
            (None, Some(_)) => Err(ProfilerError::Invalid(
                "watchdog_every needs a watchdog deadline (ProfilerBuilder::watchdog or TGPU_WATCHDOG)"
                    .into(),
            )),
        }
    }
}

impl Profiler {
    /// A builder: device 0, [`DEFAULT_CAPACITY`] records per warp,
    /// [`DEFAULT_MEMORY_LIMIT`], recalibration every [`DEFAULT_RECALIBRATION`].
    pub fn builder() -> ProfilerBuilder {
        ProfilerBuilder::default()
    }
}
