//! The GPU side the benchmarks share: opening a device, its SM count and target, trace
//! buffers in the wire format, and timing stream work with CUDA events.

use std::sync::Arc;

use cudarc::driver::{
    sys, CudaContext, CudaEvent, CudaGraph, CudaSlice, CudaStream, DriverError, LaunchConfig,
};
use tracing_gpu::cuda::{ensure_libraries, ProfilerError};
use tracing_gpu::format::{self, BufferHeader};

use crate::{BenchError, Result};

/// GPU `ordinal`, once the driver and NVRTC are known to load (cudarc would panic
/// without them).
pub fn open(ordinal: usize) -> Result<Arc<CudaContext>> {
    ensure_libraries()?;
    Ok(CudaContext::new(ordinal)?)
}

/// The device's streaming multiprocessors.
pub fn sm_count(ctx: &CudaContext) -> Result<u32, DriverError> {
    let n = ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
    Ok(n as u32)
}

/// The device's NVRTC target, `sm_XY`.
pub fn arch(ctx: &CudaContext) -> Result<&'static str, DriverError> {
    let (major, minor) = ctx.compute_capability()?;
    Ok(Box::leak(format!("sm_{major}{minor}").into_boxed_str()))
}

/// A zeroed trace buffer in the wire format for launches of shape `cfg`, `slot_count`
/// slots of `capacity` records, its header written as the profiler writes it before a
/// launch (launch id 1).
pub fn trace_buffer(
    stream: &Arc<CudaStream>,
    cfg: &LaunchConfig,
    capacity: u32,
    slot_count: u32,
) -> Result<CudaSlice<u8>> {
    let size = format::wire::buffer_size(slot_count, capacity)
        .ok_or_else(|| BenchError::Invalid("trace buffer too large".into()))?;
    let mut buf = stream.alloc_zeros::<u8>(size)?;
    let (g, b) = (cfg.grid_dim, cfg.block_dim);
    let mut header = [0u8; format::wire::BUFFER_HEADER_SIZE];
    BufferHeader {
        version: format::wire::VERSION,
        slot_capacity: capacity,
        slot_count,
        warps_per_block: (b.0 * b.1 * b.2).div_ceil(32),
        launch_id: 1,
        grid: [g.0, g.1, g.2],
        block: [b.0, b.1, b.2],
        flags: 0,
        sampling: Default::default(),
    }
    .write_to(&mut header);
    stream.memcpy_htod(&header, &mut buf.slice_mut(..header.len()))?;
    Ok(buf)
}

/// A pair of timing events around one piece of stream work.
pub struct Timer {
    start: CudaEvent,
    end: CudaEvent,
}

impl Timer {
    /// Two timing events in `ctx`.
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Self, DriverError> {
        Timer::ending(ctx, sys::CUevent_flags::CU_EVENT_DEFAULT)
    }

    /// Two timing events in `ctx` whose end is waited for on a blocking primitive: for
    /// launches of seconds run beside the profiler's threads, where a spinning wait
    /// (the default event's) would take one of the host's cores from them.
    pub fn blocking(ctx: &Arc<CudaContext>) -> Result<Self, DriverError> {
        Timer::ending(ctx, sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC)
    }

    /// A default start event and an end event with `flags`.
    fn ending(ctx: &Arc<CudaContext>, flags: sys::CUevent_flags) -> Result<Self, DriverError> {
        Ok(Timer {
            start: ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))?,
            end: ctx.new_event(Some(flags))?,
        })
    }

    /// `count` timers.
    pub fn many(ctx: &Arc<CudaContext>, count: usize) -> Result<Vec<Self>, DriverError> {
        (0..count).map(|_| Timer::new(ctx)).collect()
    }

    /// Records the start, runs `f` (which enqueues work on `stream`), records the end.
    pub fn around<E: From<DriverError>>(
        &self,
        stream: &Arc<CudaStream>,
        f: impl FnOnce() -> Result<(), E>,
    ) -> Result<(), E> {
        self.record_start(stream)?;
        f()?;
        self.record_end(stream)?;
        Ok(())
    }

    /// Records the start on `stream`, for work enqueued after host work that is not
    /// to be timed (`around` times from before `f`).
    pub fn record_start(&self, stream: &Arc<CudaStream>) -> Result<(), DriverError> {
        self.start.record(stream)
    }

    /// Records the end on `stream`.
    pub fn record_end(&self, stream: &Arc<CudaStream>) -> Result<(), DriverError> {
        self.end.record(stream)
    }

    /// Milliseconds between the two events (waits for the end).
    pub fn ms(&self) -> Result<f64, DriverError> {
        self.end.synchronize()?;
        Ok(self.start.elapsed_ms(&self.end)? as f64)
    }

    /// The median over `count` runs of `f` (which enqueues work on `stream`), each
    /// alone on the GPU (waited for before the next), of the milliseconds between the
    /// events around it.
    pub fn median_ms<E: From<DriverError>>(
        ctx: &Arc<CudaContext>,
        stream: &Arc<CudaStream>,
        count: usize,
        mut f: impl FnMut() -> Result<(), E>,
    ) -> Result<f64, E> {
        let timer = Timer::new(ctx)?;
        let mut ms = Vec::with_capacity(count);
        for _ in 0..count {
            timer.around(stream, &mut f)?;
            ms.push(timer.ms()?);
        }
        Ok(crate::stats::median(&mut ms))
    }
}

/// The graph `f` captures on `stream`; the capture ends whatever `f` returns.
pub fn capture(
    stream: &Arc<CudaStream>,
    f: impl FnOnce() -> std::result::Result<(), ProfilerError>,
) -> std::result::Result<CudaGraph, ProfilerError> {
    stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL)?;
    let made = f();
    let graph = stream.end_capture(sys::CUgraphInstantiate_flags(0));
    made?;
    graph?.ok_or_else(|| ProfilerError::Invalid("the capture made no graph".into()))
}

/// A kernel that keeps the GPU busy for a while (one thread spinning on `%globaltimer`),
/// enqueued ahead of a timed block and not timed itself, so that the host enqueues the
/// block's launches while the GPU is still busy: the block's GPU time is then the work's
/// alone, not the host's first calls (`--lead-us`).
pub struct Lead {
    spin: cudarc::driver::CudaFunction,
    ns: u64,
}

/// [`Lead`]'s kernel, `tgpu_bench_lead`.
pub const LEAD_SOURCE: &str = r#"
extern "C" __global__ void tgpu_bench_lead(unsigned long long ns) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}
"#;

impl Lead {
    /// The lead kernel, `us` µs long, compiled for `ctx`'s GPU; `None` for 0.
    pub fn new(ctx: &Arc<CudaContext>, us: u64) -> Result<Option<Lead>> {
        if us == 0 {
            return Ok(None);
        }
        let build = tracing_gpu::cuda::KernelBuild::new("lead.cu", arch(ctx)?);
        let ptx = tracing_gpu::cuda::compile(LEAD_SOURCE, &build)?;
        let spin = ctx.load_module(ptx)?.load_function("tgpu_bench_lead")?;
        Ok(Some(Lead {
            spin,
            ns: us * 1000,
        }))
    }

    /// Enqueues it on `stream`.
    pub fn launch(&self, stream: &Arc<CudaStream>) -> Result<(), DriverError> {
        use cudarc::driver::PushKernelArg;
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the kernel takes one u64 by value and touches no memory.
        unsafe { stream.launch_builder(&self.spin).arg(&self.ns).launch(cfg) }?;
        Ok(())
    }
}
