//! A kernel built twice: with the recorder, and without it (the production kernel), so
//! that a launch that records nothing runs exactly the kernel a user ships.
//!
//! Compiled in, the recorder costs a warp that records nothing a few instructions per
//! call and at its construction. In a long kernel that is noise; in a short one it is
//! not: on an H100, a graph of 100 kernels of 3.6 µs with four ranges per warp replayed
//! 3.4-5.4 % slower with a null trace than the same graph built without the recorder,
//! whichever record format (docs/performance.md). No code in the kernel costs nothing,
//! so the launch that records nothing does not run the recorder's build at all.

use std::sync::{Arc, Weak};

use cudarc::driver::{
    sys, CudaContext, CudaEvent, CudaFunction, CudaStream, DriverError, LaunchArgs, LaunchConfig,
    PushKernelArg,
};
use parking_lot::Mutex;

use crate::cuda::compile::{compile, KernelBuild};
use crate::cuda::error::CudaError;
use crate::format::KernelArg;

/// The gate: a define that turns the recorder on (kernels/include/tracing_gpu.cuh).
const GATE: &str = "TGPU_ENABLED";

/// One kernel of a CUDA source, loaded twice: the recorder's build (`TGPU_ENABLED=1`,
/// with the trace parameter) and the production build (the gate off: no trace
/// parameter, no recorder code). Launch it with [`TracedKernel::launch_builder`] inside
/// [`gpu_profile!`](crate::gpu_profile): a launch that records (a trace with a buffer)
/// runs the recorder's build and gets the trace as its last argument; one that records
/// nothing (a null trace: the profiler's memory was full) runs the production kernel.
///
/// ```no_run
/// # use tracing_gpu::cuda::cudarc::driver::{LaunchConfig, PushKernelArg};
/// # use tracing_gpu::cuda::TracedKernel;
/// # use tracing_gpu::{gpu_profile, KernelBuild, Profiler};
/// # fn f(profiler: &Profiler, source: &str) -> Result<(), Box<dyn std::error::Error>> {
/// let build = KernelBuild::new("scale.cu", profiler.arch()); // no TGPU_ENABLED: both builds
/// let kernel = TracedKernel::load(profiler.context(), source, &build, "scale")?;
/// let stream = profiler.context().new_stream()?;
/// let mut x = stream.alloc_zeros::<f32>(1 << 20)?;
/// let (a, n) = (2.0f32, 1u32 << 20);
/// let cfg = LaunchConfig::for_num_elems(n);
/// gpu_profile!(profiler, &stream, "scale", cfg, |trace| unsafe {
///     kernel.launch_builder(&stream, &trace).arg(&mut x).arg(&a).arg(&n).launch(cfg)
/// })?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct TracedKernel(Arc<Builds>);

#[derive(Debug)]
struct Builds {
    recording: CudaFunction,
    production: CudaFunction,
}

/// Every live `TracedKernel`'s builds, by the recording build's function: where a profiled
/// graph finds the production build of each of its nodes (`profiler/unrecorded.rs`).
static KERNELS: Mutex<Vec<(usize, Weak<Builds>)>> = Mutex::new(Vec::new());

/// The production build of the `TracedKernel` whose recording build is `f`, if one lives.
pub(crate) fn production_of(f: sys::CUfunction) -> Option<CudaFunction> {
    KERNELS
        .lock()
        .iter()
        .find(|(k, _)| *k == f as usize)
        .and_then(|(_, b)| b.upgrade())
        .map(|b| b.production.clone())
}

impl TracedKernel {
    /// Compiles `source` twice with NVRTC, `build` with `TGPU_ENABLED=1` added and `build`
    /// as it is (any `TGPU_ENABLED` define of its own left out of both), and loads the
    /// entry point `name` of each into `ctx`.
    pub fn load(
        ctx: &Arc<CudaContext>,
        source: &str,
        build: &KernelBuild,
        name: &str,
    ) -> Result<TracedKernel, CudaError> {
        let (recording, production) = builds(build);
        let load = |b: &KernelBuild| -> Result<CudaFunction, CudaError> {
            let ptx = compile(source, b)?;
            Ok(ctx.load_module(ptx)?.load_function(name)?)
        };
        Ok(TracedKernel::new(load(&recording)?, load(&production)?))
    }

    /// The pair from builds made elsewhere (nvcc, one module with several kernels): the
    /// same kernel compiled with `TGPU_ENABLED=1` (`recording`, its last parameter the
    /// trace) and without (`production`), in one context.
    pub fn new(recording: CudaFunction, production: CudaFunction) -> TracedKernel {
        let builds = Arc::new(Builds {
            recording,
            production,
        });
        let mut known = KERNELS.lock();
        known.retain(|(_, b)| b.strong_count() > 0);
        known.push((
            builds.recording.cu_function() as usize,
            Arc::downgrade(&builds),
        ));
        TracedKernel(builds)
    }

    /// The recorder's build: its last parameter is the trace.
    pub fn recording(&self) -> &CudaFunction {
        &self.0.recording
    }

    /// The production build, without the recorder.
    pub fn production(&self) -> &CudaFunction {
        &self.0.production
    }

    /// A launch on `stream` of the build `trace` asks for: the recorder's if the trace
    /// has a buffer (`trace.base != 0`: direct, streamed or a graph node's), else the
    /// production kernel. Push the kernel's own arguments, then
    /// [`launch`](TracedLaunch::launch), which appends the trace for the recorder's build.
    pub fn launch_builder<'a>(
        &'a self,
        stream: &'a CudaStream,
        trace: &'a KernelArg,
    ) -> TracedLaunch<'a> {
        let records = trace.base != 0;
        let function = match records {
            true => &self.0.recording,
            false => &self.0.production,
        };
        TracedLaunch {
            args: stream.launch_builder(function),
            trace: records.then_some(trace),
        }
    }
}

/// The recorder's build and the production build of `build`: its `TGPU_ENABLED` defines
/// left out of both, then `TGPU_ENABLED=1` added to the first.
fn builds(build: &KernelBuild) -> (KernelBuild, KernelBuild) {
    let mut production = build.clone();
    production
        .defines
        .retain(|d| d.split('=').next() != Some(GATE));
    (production.clone().define(format!("{GATE}=1")), production)
}

/// A launch of a [`TracedKernel`] being built: cudarc's [`LaunchArgs`] for the chosen
/// build, and the trace it takes last if it records.
#[derive(Debug)]
pub struct TracedLaunch<'a> {
    args: LaunchArgs<'a>,
    trace: Option<&'a KernelArg>,
}

impl TracedLaunch<'_> {
    /// Appends the trace (the recorder's build only; once, however often it launches)
    /// and launches.
    ///
    /// # Safety
    ///
    /// As cudarc's [`LaunchArgs::launch`]: the arguments pushed are the kernel's own
    /// parameters, in order, without the trace.
    pub unsafe fn launch(
        &mut self,
        cfg: LaunchConfig,
    ) -> Result<Option<(CudaEvent, CudaEvent)>, DriverError> {
        if let Some(trace) = self.trace.take() {
            self.args.arg(trace);
        }
        // SAFETY: the caller's promise, and the trace is the recorder's build's last
        // parameter (`TGPU_TRACE_PARAM`).
        unsafe { self.args.launch(cfg) }
    }
}

// SAFETY: every argument goes to the `LaunchArgs` inside, through its own implementation.
unsafe impl<'a, T> PushKernelArg<T> for TracedLaunch<'a>
where
    LaunchArgs<'a>: PushKernelArg<T>,
{
    #[inline(always)]
    fn arg(&mut self, arg: T) -> &mut Self {
        self.args.arg(arg);
        self
    }
}

#[cfg(test)]
mod tests {
    use crate::cuda::compile::{compile, ensure_nvrtc, KernelBuild};

    const SOURCE: &str = "#include \"tracing_gpu.cuh\"\nTGPU_EVENT(A, 1);\n\
        extern \"C\" __global__ void k(float* x TGPU_TRACE_PARAM) {\n\
        TGPU_RECORDER(rec, A);\nrec.begin<A>();\nx[threadIdx.x] += 1.0f;\nrec.end<A>();\n}\n";

    /// The two builds `load` makes: the gate stripped from the user's build, then added
    /// back for the recorder's. Their PTX differs by the trace parameter.
    #[test]
    fn the_builds_differ_by_the_gate_alone() {
        if ensure_nvrtc().is_err() {
            eprintln!("skipped (needs NVRTC, installed by scripts/test-env.sh)");
            return;
        }
        let user = KernelBuild::new("k.cu", "sm_90")
            .define("TGPU_ENABLED")
            .define("OTHER=2")
            .define("TGPU_ENABLED=0");
        let (recording, production) = super::builds(&user);
        assert_eq!(production.defines, ["OTHER=2"]);
        assert_eq!(recording.defines, ["OTHER=2", "TGPU_ENABLED=1"]);
        let off = compile(SOURCE, &production.lineinfo(false)).unwrap();
        let on = compile(SOURCE, &recording.lineinfo(false)).unwrap();
        let (off, on) = (off.to_src(), on.to_src());
        assert!(!off.contains("globaltimer") && on.contains("globaltimer"));
        let params = |ptx: &str| ptx.matches(".param .").count();
        assert_eq!(
            params(&on),
            params(&off) + 1,
            "the trace: one parameter more"
        );
    }
}
