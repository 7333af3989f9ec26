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

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::{sys, CudaContext, CudaGraph, CudaStream, DeviceRepr, LaunchConfig};

mod builder;
mod clock;
mod graph;
mod launch;
mod names;
mod rings;
mod sampled;
mod sampler;
mod streamed;
mod unrecorded;

pub use builder::{
    ProfilerBuilder, DEFAULT_CAPACITY, DEFAULT_GRAPH_REGIONS, DEFAULT_MEMORY_LIMIT,
    DEFAULT_RECALIBRATION,
};
pub use graph::{ProfiledGraph, MAX_GRAPHS, MAX_GRAPH_NODES};
pub use rings::{DEFAULT_STREAM_INTERVAL, DEFAULT_STREAM_MEMORY};
pub use sampled::Sampled;
pub use sampler::Sampler;
pub use streamed::Streaming;

use crate::batch::{DeviceInfo, LaunchInfo};
use crate::clock::{Calibration, HostClock};
use crate::cuda::collector::Collector;
use crate::cuda::device::{Arena, Events, Memory, Place, Region, Shape};
use crate::cuda::error::ProfilerError;
use crate::cuda::job::{InFlight, Work};
use crate::cuda::ledger::{Ledger, ProfilerStats};
use crate::format::{self, BufferHeader, KernelArg};
use graph::Graphs;
use names::{kernel_name, thread_name};
use rings::{MappedArena, RingSettings};

// SAFETY: `KernelArg` is `repr(C)`, 32 bytes of plain integers, the layout of
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
    /// The streaming arena, made at the first streamed launch (`streamed.rs`).
    pub(super) streaming: MappedArena,
    /// Which launches, blocks and warps `launch` (and `streamed`) records.
    pub(super) sampler: Sampler,
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
    /// launch that fails (returns `Err`) is not traced. A launch the profiler's
    /// [`Sampler`] leaves out gets a null trace and is counted in
    /// [`ProfilerStats::unsampled`].
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
        self.launch_sampled(
            &self.sampler,
            (stream, kernel, cfg, launch_id, span),
            launch,
        )
    }

    /// [`Profiler::launch`], sampled by `sampler`.
    pub(super) fn launch_sampled<T, E, F>(
        &self,
        sampler: &Sampler,
        (stream, kernel, cfg, launch_id, span): (
            &Arc<CudaStream>,
            &str,
            LaunchConfig,
            u64,
            tracing::Span,
        ),
        launch: F,
    ) -> Result<T, ProfilerError>
    where
        F: FnOnce(KernelArg) -> Result<T, E>,
        E: Into<ProfilerError>,
    {
        self.check_stream(stream)?;
        if !sampler.takes(kernel, &cfg) {
            self.shared.count_unsampled();
            let _entered = span.enter();
            return launch(KernelArg::default()).map_err(Into::into);
        }
        let mut sampling = sampler.sampling();
        self.ctx.bind_to_thread()?;
        // The legacy default stream (null) cannot capture: spare it the call.
        let capture = if stream.cu_stream().is_null() {
            sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
        } else {
            // SAFETY: the stream is live (borrowed) and its context is bound.
            unsafe { cudarc::driver::result::stream::is_capturing(stream.cu_stream())? }
        };
        let captured = capture != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        if captured {
            // A node records at every replay or at none (one in n chose above);
            // its blocks and warps are sampled as a launch's are.
            sampling = sampling.launches(0);
        }
        let shape = Shape::sampled(&cfg, self.capacity, self.arena.capacity(), &sampling)?;
        let header = BufferHeader {
            version: format::VERSION,
            slot_capacity: self.capacity,
            slot_count: shape.slots,
            warps_per_block: shape.warps_per_block,
            launch_id,
            grid: [cfg.grid_dim.0, cfg.grid_dim.1, cfg.grid_dim.2],
            block: [cfg.block_dim.0, cfg.block_dim.1, cfg.block_dim.2],
            flags: 0,
            sampling,
        };
        if captured {
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
            // The device finds slot 0 64 bytes after `base` (docs/format.md).
            |r| KernelArg {
                base: memory.dptr + (r.offset + header.size() - format::BUFFER_HEADER_SIZE) as u64,
                capacity: self.capacity,
                slot_count: shape.slots,
                sampling,
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
    /// runs unrecorded and its nodes are counted as skipped. Where the host
    /// knows it beforehand (every region in flight) and every profiled node is
    /// a [`TracedKernel`](crate::cuda::TracedKernel)'s, the replay runs the
    /// graph built without the recorder, as
    /// [`Profiler::launch_graph_unrecorded`] does, in a span `gpu.graph` with
    /// `gpu.recorded = false` (no replay number or launch id).
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
        self.check_stream(stream)?;
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
        if let Some(unrecorded) = &graph.unrecorded {
            if ready.count.in_flight() > ready.mask {
                // Every region is still in flight, so this replay's prologue would find
                // its region in use and record nothing: replay the graph without the
                // recorder instead, which costs what the user's graph does.
                let span = tracing::info_span!(
                    "gpu.graph",
                    gpu.graph = name,
                    gpu.nodes = n as i64,
                    gpu.device = self.device.ordinal as i64,
                    gpu.recorded = false,
                );
                let _entered = span.enter();
                // SAFETY: a live executable graph and stream of this context.
                unsafe { sys::cuGraphLaunch(unrecorded.exec(), stream.cu_stream()).result()? };
                self.shared.count_unrecorded_replay(n);
                return Ok(());
            }
        }
        let first_id = reserve_launch_ids(n);
        let order = ready.order.lock();
        let replay = ready.count.launched();
        ready.count.set_launched(replay + 1);
        let span = tracing::info_span!(
            "gpu.graph",
            gpu.graph = name,
            gpu.replay = replay as i64,
            gpu.launch_id = first_id as i64,
            gpu.nodes = n as i64,
            gpu.device = self.device.ordinal as i64,
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
            in_flight: InFlight::new(&ready.count),
        };
        self.hand_over(stream, span, launch, work);
        Ok(())
    }

    /// Replays `graph` on `stream` without recording: the graph built without the recorder
    /// (its profiled nodes given their `TracedKernel`'s production build, no prologue), so
    /// that the replay costs what the graph a user ships does. The replay is counted in
    /// [`ProfilerStats::replays`], its profiled nodes as skipped launches; no span is made
    /// and nothing reaches the subscriber. For the replays not worth recording, such as all
    /// but one step in N of a decode loop. An error if some profiled node was not launched
    /// through a `TracedKernel` ([`ProfiledGraph::replays_unrecorded`]).
    pub fn launch_graph_unrecorded(
        &self,
        graph: &ProfiledGraph,
        stream: &Arc<CudaStream>,
    ) -> Result<(), ProfilerError> {
        self.check_stream(stream)?;
        self.ctx.bind_to_thread()?;
        let (exec, nodes) =
            match (&graph.ready, &graph.unrecorded) {
                (None, _) => (graph.graph().cu_graph_exec(), 0),
                (Some(ready), Some(u)) => (u.exec(), ready.nodes.len() as u64),
                (Some(_), None) => return Err(ProfilerError::Invalid(
                    "this graph has no build without the recorder: launch each of its profiled \
                     kernels through a TracedKernel (alive until the graph is adopted)"
                        .into(),
                )),
            };
        // SAFETY: a live executable graph and stream of this context.
        unsafe { sys::cuGraphLaunch(exec, stream.cu_stream()).result()? };
        if nodes > 0 {
            self.shared.count_unrecorded_replay(nodes);
        }
        Ok(())
    }

    /// `stream` belongs to this profiler's context, or the error that says it does not.
    pub(crate) fn check_stream(&self, stream: &CudaStream) -> Result<(), ProfilerError> {
        if **stream.context() != *self.ctx {
            return Err(ProfilerError::WrongContext {
                profiler_device: self.ctx.ordinal(),
                stream_device: stream.context().ordinal(),
            });
        }
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
            gpu.launch_id = __tgpu_id as i64,
            gpu.device = __tgpu_profiler.device().ordinal as i64,
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
            gpu.launch_id = __tgpu_id as i64,
            gpu.device = __tgpu_profiler.device().ordinal as i64,
        );
        __tgpu_profiler.launch($stream, __tgpu_name, $cfg, __tgpu_id, __tgpu_span, $launch)
    }};
}

#[cfg(test)]
mod tests;
