//! Streamed launches ([`Profiler::streamed`]): for kernels that run for
//! seconds or minutes (persistent kernels, megakernels, decode loops), whose
//! records would overflow any fixed slot. Each warp's slot is a ring in host
//! memory mapped into the device (docs/format.md, "Streaming slots"); the
//! collector's drain threads read the rings while the kernel runs (`drain/`) and it delivers
//! the launch in parts ([`crate::batch::Part`]), at
//! [`ProfilerBuilder::stream_interval`]. The kernel's code does not change:
//! the trace argument says the mode. Build it with `TGPU_STREAM=1` (and
//! `TGPU_ENABLED=1`): without it the recorder has no streaming code, and a
//! streamed launch records nothing.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use tracing_gpu::cuda::{gpu_profile, Profiler};
//! use tracing_gpu::cuda::cudarc::driver::{LaunchConfig, PushKernelArg};
//! # let (ctx, module) = todo_context();
//! let profiler = Profiler::builder().context(ctx.clone()).events([(1, "tile")]).build()?;
//! let stream = ctx.new_stream()?;
//! let f = module.load_function("persistent")?;
//! let cfg = LaunchConfig { grid_dim: (132, 1, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 };
//! gpu_profile!(profiler.streamed(), &stream, "persistent", cfg, |trace| unsafe {
//!     stream.launch_builder(&f).arg(&trace).launch(cfg)
//! })?;
//! # Ok(()) }
//! # fn todo_context() -> (std::sync::Arc<tracing_gpu::cuda::cudarc::driver::CudaContext>, std::sync::Arc<tracing_gpu::cuda::cudarc::driver::CudaModule>) { unimplemented!() }
//! ```

use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::{sys, CudaStream, LaunchConfig};

use crate::batch::DeviceInfo;
use crate::cuda::device::allocate_mapped;
use crate::cuda::device::Arena;
use crate::cuda::device::{Place, Shape};
use crate::cuda::error::ProfilerError;
use crate::cuda::job::{Watchdog, Work};
use crate::cuda::profiler::{Profiler, ProfilerBuilder};
use crate::format::{self, BufferHeader, KernelArg, TRACE_STREAM};

use super::sampler::Sampler;

/// Any ring size, to count a launch's warps.
const MIN_RING: u32 = 32;

impl ProfilerBuilder {
    /// Bytes of the streaming arena (default [`super::DEFAULT_STREAM_MEMORY`]): pinned
    /// host memory mapped into the device, allocated at the first streamed
    /// launch, whatever the runs' length. A streamed launch takes one ring per
    /// warp of its grid; when the arena is full it runs unrecorded (counted
    /// in [`ProfilerStats::skipped`](crate::cuda::ProfilerStats::skipped)).
    pub fn stream_memory(mut self, bytes: usize) -> Self {
        self.stream.memory = bytes;
        self
    }

    /// Records of 16 bytes per warp's ring: a power of two from 32 to 2¹⁹ (16
    /// records are one 256-byte chunk of 31 entries). By default each launch
    /// gets the largest rings whose total is at most half of
    /// [`ProfilerBuilder::stream_memory`]: a ring holds as long a burst as
    /// memory allows. A warp that writes faster than the rings are read drops
    /// its newest entries when its ring is full, and counts them.
    pub fn stream_capacity(mut self, records: u32) -> Self {
        self.stream.capacity = Some(records);
        self
    }

    /// How often a running streamed launch delivers a part to the sinks
    /// (default [`super::DEFAULT_STREAM_INTERVAL`]). The rings are read every
    /// millisecond whatever this is; a part is also cut early when it is large.
    pub fn stream_interval(mut self, every: Duration) -> Self {
        self.stream.interval = every;
        self
    }

    /// Threads that read a running streamed launch's rings, each a share of its
    /// warps (default: three quarters of the cores, up to 12, each with 4
    /// warps at least). One core rebuilds about 50 M entries a second: a kernel
    /// that records faster than its drain threads read fills its rings and
    /// drops entries.
    pub fn stream_drain_threads(mut self, threads: usize) -> Self {
        self.stream.drain_threads = Some(threads);
        self
    }
}

impl Profiler {
    /// Streamed launches on this profiler: `gpu_profile!(profiler.streamed(), ..)`
    /// makes the launch as `gpu_profile!(profiler, ..)` does, but its records
    /// reach the subscriber while it runs, in parts (see the module docs).
    pub fn streamed(&self) -> Streaming<'_> {
        Streaming {
            profiler: self,
            watchdog: self.stream_settings.watchdog,
            sampler: &self.sampler,
        }
    }
}

/// A [`Profiler`] that streams its launches; made by [`Profiler::streamed`].
#[derive(Debug, Clone, Copy)]
pub struct Streaming<'a> {
    profiler: &'a Profiler,
    sampler: &'a Sampler,
    watchdog: Option<Watchdog>,
}

impl<'a> Streaming<'a> {
    /// This launch's watchdog deadline, in place of the profiler's
    /// ([`ProfilerBuilder::watchdog`]; its period stays): a snapshot of every warp if
    /// the launch is still running `deadline` after its launch call.
    pub fn watchdog(mut self, deadline: Duration) -> Self {
        let every = self.watchdog.and_then(|w| w.every);
        self.watchdog = Some(Watchdog { deadline, every });
        self
    }

    /// No watchdog for this launch.
    pub fn without_watchdog(mut self) -> Self {
        self.watchdog = None;
        self
    }

    /// The profiled GPU.
    pub fn device(&self) -> &Arc<DeviceInfo> {
        self.profiler.device()
    }

    /// Streamed launches sampled by `sampler` instead of the profiler's own:
    /// `gpu_profile!(profiler.streamed().sampled(&sampler), ..)`. Only the
    /// sampled warps get rings, so that each is larger in the same memory and
    /// the drain reads only what was chosen.
    pub fn sampled(self, sampler: &'a Sampler) -> Streaming<'a> {
        Streaming { sampler, ..self }
    }

    /// As [`Profiler::launch`], streamed: the kernel gets a [`KernelArg`] whose
    /// slots are rings, read while it runs. A stream that is capturing a graph
    /// is refused (graph nodes do not stream), and so is a grid whose rings do
    /// not fit in [`ProfilerBuilder::stream_memory`].
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
        let p = self.profiler;
        p.check_stream(stream)?;
        if !self.sampler.takes(kernel, &cfg) {
            p.shared.count_unsampled();
            let _entered = span.enter();
            return launch(KernelArg::default()).map_err(Into::into);
        }
        let sampling = self.sampler.sampling();
        let settings = p.stream_settings;
        let warps = Shape::sampled(&cfg, MIN_RING, usize::MAX, &sampling)?.slots;
        let capacity = settings.capacity_for(warps as u64);
        let mut shape = Shape::sampled(&cfg, capacity, settings.memory, &sampling)?;
        // The warps' watch cells follow the rings (read only by a TGPU_WATCH=1 kernel).
        let cells = shape.slots as usize * format::WATCH_CELL_SIZE;
        shape.bytes = shape
            .bytes
            .checked_add(cells)
            .filter(|&b| b <= settings.memory)
            .ok_or(ProfilerError::BufferTooLarge {
                needed: shape.bytes as u128 + cells as u128,
                slots: shape.slots as u64,
                capacity,
                limit: settings.memory,
            })?;
        p.ctx.bind_to_thread()?;
        if !stream.cu_stream().is_null() {
            // SAFETY: the stream is live (borrowed) and its context is bound.
            let capture =
                unsafe { cudarc::driver::result::stream::is_capturing(stream.cu_stream())? };
            if capture != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
                return Err(ProfilerError::Invalid(
                    "a streamed launch cannot be captured into a graph".into(),
                ));
            }
        }
        let (memory, arena) = {
            let mut slot = p.streaming.lock();
            match &*slot {
                Some(pair) => pair.clone(),
                None => {
                    let memory = Arc::new(allocate_mapped(&p.ctx, settings.memory)?);
                    let pair = (memory, Arc::new(Arena::new(settings.memory)));
                    *slot = Some(pair.clone());
                    pair
                }
            }
        };
        let header = BufferHeader {
            version: format::VERSION,
            slot_capacity: capacity,
            slot_count: shape.slots,
            warps_per_block: shape.warps_per_block,
            launch_id,
            grid: [cfg.grid_dim.0, cfg.grid_dim.1, cfg.grid_dim.2],
            block: [cfg.block_dim.0, cfg.block_dim.1, cfg.block_dim.2],
            flags: 0,
            sampling,
        };
        let region = arena.alloc(shape.bytes, None);
        let (dptr, ring) = (memory.dptr, arena.clone());
        p.launch_in(
            (stream, kernel, header, span),
            (&ring, region),
            // The device finds slot 0 64 bytes after `base` (docs/format.md).
            |r| KernelArg {
                base: dptr + (r.offset + header.size() - format::BUFFER_HEADER_SIZE) as u64,
                capacity: capacity | TRACE_STREAM,
                slot_count: shape.slots,
                sampling,
            },
            launch,
            |region| Work::Streamed {
                header,
                place: Place { memory, region },
                arena,
                drain: None,
                // The snapshot names a cell's warp from its place in the grid: a launch
                // that samples blocks or warps is not watched yet.
                watch: self.watchdog.filter(|_| sampling.is_all()).map(|w| (w, 0)),
            },
        )
    }
}
