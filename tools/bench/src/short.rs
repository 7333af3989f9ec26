//! The short kernel of the launch storms (`storm`, `graph_replay`): the quickstart's
//! `tiled_poly` (`kernels/examples/quickstart.cu`), one block of [`THREADS`] threads per
//! SM, one tile, `work` dependent FMAs per thread: a few µs on an H200 (1024: about 2 µs
//! of FMAs; the binaries measure it). Two builds of it: with the recorder on
//! ([`Short::launch`], given a trace: every warp records three ranges, load, compute
//! and store, and an instant; given a null trace, nothing) and with the gate off
//! ([`Short::launch_off`]: [`crate::quickstart_off`], the kernel a user ships, the
//! baseline of every overhead the storms print). Both again as one
//! [`TracedKernel`] ([`Short::launch_traced`]), which runs the build without the recorder
//! when nothing is recorded, so that a profiled graph of it replays without the recorder
//! when its regions are all in flight.

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, DriverError, LaunchConfig};
use tracing_gpu::cuda::cudarc::driver::PushKernelArg;
use tracing_gpu::cuda::{self, KernelBuild, Profiler, ProfilerError, TracedKernel};
use tracing_gpu::format::{self, KernelArg};

use crate::cli::{self, Header};
use crate::device;
use crate::{quickstart, quickstart_off};

/// Threads per block: four warps.
pub const THREADS: u32 = 128;
/// Events each warp records: three ranges and an instant.
pub const EVENTS_PER_WARP: u32 = 4;

/// The kernel's two builds, its launch shape and its work.
pub struct Short {
    /// The build with the recorder on, for launches given a trace of their own.
    on: CudaFunction,
    off: quickstart_off::Kernel,
    traced: TracedKernel,
    cfg: LaunchConfig,
    n: u32,
    work: u32,
}

/// A launch's input and output (each launching thread has its own).
pub struct Buffers {
    x: CudaSlice<f32>,
    y: CudaSlice<f32>,
}

impl Short {
    /// Compiles and loads both builds of the kernel for the profiler's GPU: `blocks`
    /// blocks (default one per SM), `work` FMAs per thread; `defines` (`NAME=VALUE`, such
    /// as `TGPU_FORMAT=1`) are added to the build with the recorder on, which includes
    /// `header` (`--header`), if any, in place of the embedded recorder header.
    pub fn load(
        profiler: &Profiler,
        work: u32,
        blocks: Option<u32>,
        defines: &[String],
        header: Option<&Header>,
    ) -> Result<Short, ProfilerError> {
        let blocks = match blocks {
            Some(b) => b,
            None => device::sm_count(profiler.context())?,
        };
        let ctx = profiler.context();
        let (source, on_build) = cli::variant(
            quickstart::SOURCE,
            quickstart::Kernel::build(profiler, true),
            defines,
            header,
        );
        let load = |source: &str, build: &KernelBuild| -> Result<CudaFunction, ProfilerError> {
            let ptx = cuda::compile(source, build)?;
            Ok(ctx.load_module(ptx)?.load_function("tiled_poly")?)
        };
        let on = load(&source, &on_build)?;
        let traced = TracedKernel::new(
            on.clone(),
            load(quickstart::SOURCE, &quickstart_off::build(profiler.arch()))?,
        );
        Ok(Short {
            traced,
            on,
            off: quickstart_off::Kernel::load(profiler)?,
            cfg: LaunchConfig {
                grid_dim: (blocks, 1, 1),
                block_dim: (THREADS, 1, 1),
                // The tile: 4 bytes per thread.
                shared_mem_bytes: THREADS * 4,
            },
            n: blocks * THREADS,
            work,
        })
    }

    /// The launch shape.
    pub fn cfg(&self) -> LaunchConfig {
        self.cfg
    }

    /// Bytes of the trace buffer a launch takes with `capacity` records per warp.
    pub fn trace_bytes(&self, capacity: u32) -> usize {
        let warps = self.cfg.grid_dim.0 * THREADS.div_ceil(32);
        format::wire::buffer_size(warps, capacity).unwrap_or(usize::MAX)
    }

    /// Input and output for launches on `stream`.
    pub fn buffers(&self, stream: &Arc<CudaStream>) -> Result<Buffers, DriverError> {
        Ok(Buffers {
            x: stream.clone_htod(&vec![0.5f32; self.n as usize])?,
            y: stream.alloc_zeros::<f32>(self.n as usize)?,
        })
    }

    /// Enqueues one launch of the build with the recorder on `stream`, recording into
    /// `trace` (nothing if its base is 0).
    pub fn launch(
        &self,
        stream: &CudaStream,
        b: &mut Buffers,
        trace: &KernelArg,
    ) -> Result<(), DriverError> {
        let tiles = 1u32;
        // SAFETY: `buffers` made x and y of n elements; cfg gives each block 4 bytes of
        // shared memory per thread; the kernel was loaded in the profiler's context,
        // whose streams these are; the arguments are the kernel's (quickstart.cu), the
        // trace last.
        unsafe {
            stream
                .launch_builder(&self.on)
                .arg(&b.x)
                .arg(&mut b.y)
                .arg(&self.n)
                .arg(&tiles)
                .arg(&self.work)
                .arg(trace)
                .launch(self.cfg)?;
        }
        Ok(())
    }

    /// Enqueues one launch of the [`TracedKernel`]: the recorder's build if `trace`
    /// records (its base is not 0: a graph node's always is), else the gate-off build.
    pub fn launch_traced(
        &self,
        stream: &CudaStream,
        b: &mut Buffers,
        trace: &KernelArg,
    ) -> Result<(), DriverError> {
        let tiles = 1u32;
        // SAFETY: as in `launch`; the arguments are the kernel's own, the trace appended.
        unsafe {
            self.traced
                .launch_builder(stream, trace)
                .arg(&b.x)
                .arg(&mut b.y)
                .arg(&self.n)
                .arg(&tiles)
                .arg(&self.work)
                .launch(self.cfg)?;
        }
        Ok(())
    }

    /// Enqueues one launch of the gate-off build (no recorder, no trace) on `stream`.
    pub fn launch_off(&self, stream: &CudaStream, b: &mut Buffers) -> Result<(), DriverError> {
        // SAFETY: as in `launch`.
        unsafe {
            self.off
                .launch(stream, self.cfg, (&b.x, &mut b.y), [self.n, 1, self.work])
        }
    }
}
