//! The quickstart's kernel (`kernels/examples/quickstart.cu`) built without the recorder:
//! no `TGPU_ENABLED=1`, the gate off, the kernel a user ships. It is the baseline of the
//! launch benchmarks (`storm`, `graph_replay`, `profile_overhead`); the same source built
//! with the recorder and given a null trace ([`crate::quickstart::Kernel`]) is a column
//! of its own, named *null trace*. Without the gate `TGPU_TRACE_PARAM` adds no
//! parameter and the recorder compiles to nothing, so a launch passes no trace.

use tracing_gpu::cuda::cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, DriverError, LaunchConfig, PushKernelArg,
};
use tracing_gpu::cuda::{self, KernelBuild, Profiler, ProfilerError};

use crate::quickstart::SOURCE;

/// The NVRTC build of [`SOURCE`] for `arch`: the quickstart's own as the benchmarks load
/// it (line info on, the default), less the gate.
pub fn build(arch: &'static str) -> KernelBuild {
    KernelBuild::new("quickstart.cu", arch)
}

/// The kernel `tiled_poly` of [`SOURCE`], compiled with the recorder off and loaded.
pub struct Kernel(CudaFunction);

impl Kernel {
    /// Compiles [`SOURCE`] ([`build`]) for the profiler's GPU and loads it there.
    pub fn load(profiler: &Profiler) -> Result<Self, ProfilerError> {
        let ptx = cuda::compile(SOURCE, &build(profiler.arch()))?;
        let module = profiler.context().load_module(ptx)?;
        Ok(Kernel(module.load_function("tiled_poly")?))
    }

    /// Enqueues one launch on `stream`, as [`crate::quickstart::Kernel::launch`] does,
    /// without the trace.
    ///
    /// # Safety
    ///
    /// `x` and `y` hold at least `n` elements, `cfg` gives each block 4 bytes of dynamic
    /// shared memory per thread, and `stream` belongs to the kernel's context.
    pub unsafe fn launch(
        &self,
        stream: &CudaStream,
        cfg: LaunchConfig,
        (x, y): (&CudaSlice<f32>, &mut CudaSlice<f32>),
        [n, tiles, work]: [u32; 3],
    ) -> Result<(), DriverError> {
        stream
            .launch_builder(&self.0)
            .arg(x)
            .arg(y)
            .arg(&n)
            .arg(&tiles)
            .arg(&work)
            .launch(cfg)?;
        Ok(())
    }
}
