//! The short kernel of the launch storms (`storm`, `graph_replay`): the quickstart's
//! `tiled_poly` (`kernels/examples/quickstart.cu`, built with the recorder on), one
//! block of [`THREADS`] threads per SM, one tile, `work` dependent FMAs per thread: a
//! few µs on an H200 (1024: about 2 µs of FMAs; the binaries measure it). Every warp
//! records three ranges (load, compute, store) and an instant.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DriverError, LaunchConfig};
use tracing_gpu::cuda::{Profiler, ProfilerError};
use tracing_gpu::format::{self, KernelArg};

use crate::device;
use crate::quickstart::Kernel;

/// Threads per block: four warps.
pub const THREADS: u32 = 128;
/// Events each warp records: three ranges and an instant.
pub const EVENTS_PER_WARP: u32 = 4;

/// The kernel, its launch shape and its work.
pub struct Short {
    kernel: Kernel,
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
    /// Compiles and loads the kernel for the profiler's GPU: `blocks` blocks (default
    /// one per SM), `work` FMAs per thread.
    pub fn load(
        profiler: &Profiler,
        work: u32,
        blocks: Option<u32>,
    ) -> Result<Short, ProfilerError> {
        let blocks = match blocks {
            Some(b) => b,
            None => device::sm_count(profiler.context())?,
        };
        Ok(Short {
            kernel: Kernel::load(profiler, true)?,
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

    /// Enqueues one launch on `stream`, recording into `trace` (nothing if its base is 0).
    pub fn launch(
        &self,
        stream: &CudaStream,
        b: &mut Buffers,
        trace: &KernelArg,
    ) -> Result<(), DriverError> {
        // SAFETY: `buffers` made x and y of n elements; cfg gives each block 4 bytes of
        // shared memory per thread; the kernel was loaded in the profiler's context,
        // whose streams these are.
        unsafe {
            self.kernel.launch(
                stream,
                self.cfg,
                (&b.x, &mut b.y),
                [self.n, 1, self.work],
                trace,
            )
        }
    }
}
