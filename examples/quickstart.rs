//! Quickstart: one instrumented kernel, host spans around it, one Perfetto trace.
//!
//! ```text
//! cargo run --release --features cuda --example quickstart -- quickstart.perfetto-trace [--capture run.tgpu] [--launches 8] [--no-lineinfo]
//! ```
//!
//! Open the trace at <https://ui.perfetto.dev>: the host thread shows
//! `quickstart` → `step` → `tiled_poly` (the launch), with a flow arrow to the
//! kernel slice on the GPU's track; under it each SM and each warp shows its
//! `load` / `compute` / `store` phases, on the host's clock, each with the
//! tile it worked on (the payload the kernel writes, declared in [`registry`]).
//!
//! The kernel is `kernels/examples/quickstart.cu`; the three things a kernel
//! needs are `TGPU_EVENT`, `TGPU_TRACE_PARAM` and `TGPU_RECORDER`. On the host:
//! a [`PerfettoLayer`] in the subscriber, a [`Profiler`], and `gpu_profile!`
//! around the launch. With `--capture`, the run is also recorded into a capture
//! file (devices, calibrations, launches, host spans) that
//! `tracing-gpu convert` / `report` replay without a GPU.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use tracing_gpu::cuda::cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, DriverError, LaunchConfig, PushKernelArg,
};
use tracing_gpu::cuda::{self, CaptureRecorder, ProfilerError, ProfilerStats};
use tracing_gpu::{gpu_profile, EventRegistry, KernelArg, KernelBuild, PerfettoLayer, Profiler};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::EnvFilter;

/// The example kernel (also used by the benchmarks' `causality` and `profile_overhead`).
pub const SOURCE: &str = include_str!("../kernels/examples/quickstart.cu");
/// Its event types, as `TGPU_EVENT` declares them.
pub const EVENTS: [(u16, &str); 4] = [(1, "load"), (2, "compute"), (3, "store"), (4, "done")];

/// [`EVENTS`] with what the kernel puts in each payload: the tile index for
/// the phases, the number of tiles for `done`.
pub fn registry() -> EventRegistry {
    EventRegistry::from_pairs(EVENTS)
        .and_then(|r| r.with_payload(1, "tile"))
        .and_then(|r| r.with_payload(2, "tile"))
        .and_then(|r| r.with_payload(3, "tile"))
        .and_then(|r| r.with_payload(4, "tiles"))
        .expect("EVENTS has distinct ids")
}

/// The kernel `tiled_poly` of [`SOURCE`], compiled with the recorder on and loaded.
pub struct Kernel(CudaFunction);

impl Kernel {
    /// Compiles [`SOURCE`] for the profiler's GPU (with line info if `lineinfo`) and
    /// loads it there.
    pub fn load(profiler: &Profiler, lineinfo: bool) -> Result<Self, ProfilerError> {
        Self::load_build(profiler, Self::build(profiler, lineinfo))
    }

    /// The build [`Kernel::load`] compiles: the recorder on, line info if `lineinfo`.
    pub fn build(profiler: &Profiler, lineinfo: bool) -> KernelBuild {
        KernelBuild::new("quickstart.cu", profiler.arch())
            .define("TGPU_ENABLED=1")
            .lineinfo(lineinfo)
    }

    /// Compiles [`SOURCE`] with `build` (for example [`Kernel::build`] with
    /// `TGPU_FORMAT=1` added) and loads it on the profiler's GPU.
    pub fn load_build(profiler: &Profiler, build: KernelBuild) -> Result<Self, ProfilerError> {
        let ptx = cuda::compile(SOURCE, &build)?;
        let module = profiler.context().load_module(ptx)?;
        Ok(Kernel(module.load_function("tiled_poly")?))
    }

    /// Enqueues one launch on `stream`: each block walks `tiles` tiles of `x`, and each
    /// thread writes into `y` a polynomial of degree `work` of its element (`n` elements
    /// in all). The recorder writes into `trace` (nothing if its `base` is 0).
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
        trace: &KernelArg,
    ) -> Result<(), DriverError> {
        stream
            .launch_builder(&self.0)
            .arg(x)
            .arg(y)
            .arg(&n)
            .arg(&tiles)
            .arg(&work)
            .arg(trace)
            .launch(cfg)?;
        Ok(())
    }
}

/// What one run produced.
#[derive(Debug)]
pub struct Summary {
    /// The profiler's counters.
    pub stats: ProfilerStats,
    /// Slices and bytes the Perfetto writer wrote.
    pub trace: tracing_gpu::perfetto::WriteStats,
}

/// Runs `launches` profiled launches and writes the trace to `out` (and the
/// capture to `capture`); the kernels carry line info if `lineinfo`. The subscriber is
/// scoped to this call.
pub fn run(
    out: &Path,
    capture: Option<&Path>,
    launches: u32,
    lineinfo: bool,
) -> Result<Summary, Box<dyn std::error::Error>> {
    let (perfetto, guard) = PerfettoLayer::builder()
        .file(out)
        .process_name("quickstart")
        .build()?;
    let recorder = capture.map(CaptureRecorder::new);
    // Our layers take device events in bulk. An unfiltered subscriber would
    // also ask for one plain span per device event (for other layers, see
    // `tracing_gpu::deliver`); nobody here wants them.
    let subscriber = tracing_subscriber::registry()
        .with(EnvFilter::new("trace,tracing_gpu::device=info"))
        .with(perfetto)
        .with(recorder.as_ref().map(|r| r.layer()));
    let stats = tracing::subscriber::with_default(
        subscriber,
        || -> Result<_, Box<dyn std::error::Error>> {
            let _main = tracing::info_span!("quickstart").entered();
            let profiler = {
                let _s = tracing::info_span!("setup").entered();
                // Each warp records 3 phases × `tiles` + 1 events: 25 of 32 places.
                let mut b = Profiler::builder()
                    .device(0)
                    .registry(registry())
                    .capacity(32)
                    .lineinfo(lineinfo);
                if let Some(r) = &recorder {
                    b = b.recorder(r.clone());
                }
                b.build()?
            };
            let kernel = tracing::info_span!("compile", arch = profiler.arch())
                .in_scope(|| Kernel::load(&profiler, lineinfo))?;
            let stream = profiler.context().default_stream();
            let (blocks, threads, tiles, work) =
                (2 * profiler.device().sm_count, 256u32, 8u32, 256u32);
            let n = blocks * threads * tiles;
            let (x, mut y) = {
                let _s = tracing::info_span!("upload", n).entered();
                (
                    stream.clone_htod(&vec![0.5f32; n as usize])?,
                    stream.alloc_zeros::<f32>(n as usize)?,
                )
            };
            let cfg = LaunchConfig {
                grid_dim: (blocks, 1, 1),
                block_dim: (threads, 1, 1),
                shared_mem_bytes: threads * 4,
            };
            for step in 0..launches {
                let _s = tracing::info_span!("step", step).entered();
                // SAFETY: x and y hold n elements; 4 bytes of shared memory per thread.
                gpu_profile!(profiler, &stream, "tiled_poly", cfg, |trace| unsafe {
                    kernel.launch(&stream, cfg, (&x, &mut y), [n, tiles, work], &trace)
                })?;
                tracing::info_span!("synchronize").in_scope(|| stream.synchronize())?;
            }
            profiler.flush()?;
            Ok(profiler.stats())
        },
    )?;
    // The profiler wrote the capture when it was dropped; write it again now
    // that the outermost span has ended too.
    if let Some(r) = &recorder {
        r.write()?;
    }
    let trace = guard.finish()?;
    Ok(Summary { stats, trace })
}

#[allow(dead_code)] // tests/gpu_live.rs includes this file for `run`.
fn main() -> ExitCode {
    let mut out: Option<PathBuf> = None;
    let mut capture: Option<PathBuf> = None;
    let mut launches = 8;
    let mut lineinfo = true;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            // `--dump`: its old name, for scripts.
            "--capture" | "--dump" => capture = args.next().map(PathBuf::from),
            "--no-lineinfo" => lineinfo = false,
            "--launches" => launches = args.next().and_then(|v| v.parse().ok()).unwrap_or(0),
            _ if out.is_none() && !a.starts_with("--") => out = Some(a.into()),
            _ => out = None,
        }
    }
    let Some(out) = out.filter(|_| launches > 0) else {
        eprintln!(
            "usage: quickstart TRACE.perfetto-trace [--capture CAPTURE.tgpu] [--launches N] [--no-lineinfo]"
        );
        return ExitCode::from(2);
    };
    match run(&out, capture.as_deref(), launches, lineinfo) {
        Ok(s) => {
            println!(
                "{}: {} launches, {} device events ({} lost), {} clock checkpoints; {} bytes",
                out.display(),
                s.stats.delivered,
                s.stats.events,
                s.stats.events_lost,
                s.stats.calibrations,
                s.trace.bytes
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("quickstart: {e}");
            ExitCode::FAILURE
        }
    }
}
