//! `stream --probe`: what the GPU still runs, and which driver calls still return,
//! while a persistent kernel holds it, to find why the collector's recalibrations
//! time out beside one.
//!
//! [`Probe::prepare`] (before the persistent launch) compiles and loads an empty
//! kernel, runs it once on each of its streams, and makes a [`Calibrator`] that
//! calibrates once, so that everything the first probes use is loaded and warm.
//! [`Probe::run`] (while the kernel runs, from the launching thread or one of its
//! own: `stream --probe-thread`) then tries, in order, each bounded:
//! - `empty kernel`: the empty kernel on a non-blocking stream made before;
//! - `top priority`: the same on a stream of the context's highest priority made
//!   before (the calibrator's kind of stream);
//! - `fresh stream`: the same on a stream made now (its creation timed);
//! - `fresh module`: a kernel of a module loaded now (compiled before), on a stream
//!   made before: the module's load and first launch (lazy loading);
//! - `calibrator`: `calibrate(PERIODIC_ROUNDS)` of the calibrator made before;
//! - `new calibrator`: the same with a calibrator made now (its creation timed:
//!   NVRTC, a module load, pinning, a stream, and a synchronized timer-step kernel).
//!
//! A kernel is polled with `cuStreamQuery` for up to 3 s from its launch call; a
//! call that may block in the driver (stream, module or calibrator creation) runs
//! on a helper thread that is waited on for up to 5 s and otherwise left behind.
//! A launch call itself runs on the probing thread: one blocked in the driver
//! presumably returns when the persistent kernel ends, which the line then says
//! (each line ends with when the probe was over, in seconds after the launch, and
//! whether the persistent kernel still ran then).

use std::fmt::Write as _;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{sys, CudaContext, CudaFunction, CudaStream, DriverError, LaunchConfig};
use cudarc::nvrtc::Ptx;
use tracing_gpu::cuda::calibrate::Calibrator;
use tracing_gpu::cuda::{compile, KernelBuild};

use crate::{cli, device, BenchError, Result};

const EMPTY: &str = r#"extern "C" __global__ void tgpu_probe_empty() {}"#;
const FRESH: &str = r#"extern "C" __global__ void tgpu_probe_fresh() {}"#;
/// How long a probe kernel may take, from its launch call, to be seen done.
const RUN_LIMIT: Duration = Duration::from_secs(3);
/// How long a helper thread's blocking call may take.
const BLOCK_LIMIT: Duration = Duration::from_secs(5);
/// The environment variables that change how the driver queues and loads.
pub const ENV: [&str; 2] = ["CUDA_MODULE_LOADING", "CUDA_DEVICE_MAX_CONNECTIONS"];

/// `NAME=value` (or `unset`) for each of [`ENV`].
pub fn env_line() -> String {
    ENV.iter()
        .map(|k| format!("{k}={}", env_value(k)))
        .collect::<Vec<_>>()
        .join(" ")
}

fn env_value(k: &str) -> String {
    std::env::var(k).unwrap_or_else(|_| "unset".into())
}

/// One probe's outcome: its name, a line of text, and a JSON object.
pub struct Outcome {
    pub name: &'static str,
    pub text: String,
    pub json: String,
}

/// Everything the probes need, made before the persistent launch.
pub struct Probe {
    ctx: Arc<CudaContext>,
    empty: CudaFunction,
    /// Non-blocking, default priority: `empty kernel`.
    plain: Arc<CudaStream>,
    /// Non-blocking, the context's highest priority: `top priority`.
    top: Arc<CudaStream>,
    /// Non-blocking, default priority: `fresh module`.
    module_stream: Arc<CudaStream>,
    fresh_ptx: Ptx,
    calibrator: Calibrator,
}

impl Probe {
    /// Compiles and loads the empty kernel, runs it once on each stream, compiles
    /// (without loading) the fresh module, and makes a calibrator that calibrates
    /// once. Waits for the GPU: call it before the persistent launch.
    pub fn prepare(ctx: &Arc<CudaContext>) -> Result<Probe> {
        let arch = device::arch(ctx)?;
        let module = ctx.load_module(compile(EMPTY, &KernelBuild::new("probe_empty", arch))?)?;
        let empty = module.load_function("tgpu_probe_empty")?;
        let fresh_ptx = compile(FRESH, &KernelBuild::new("probe_fresh", arch))?;
        let plain = ctx.new_stream()?;
        let (_, top_priority) = cudarc::driver::result::stream::get_priority_range()?;
        let top = ctx.new_stream_with_priority(top_priority)?;
        let module_stream = ctx.new_stream()?;
        for s in [&plain, &top, &module_stream] {
            launch(&empty, s)?;
            s.synchronize()?;
        }
        let calibrator =
            || -> std::result::Result<Calibrator, tracing_gpu::cuda::CalibrateError> {
                let mut c = Calibrator::new(ctx)?;
                c.calibrate(Calibrator::PERIODIC_ROUNDS)?;
                Ok(c)
            };
        let calibrator =
            calibrator().map_err(|e| BenchError::Invalid(format!("probe calibrator: {e}")))?;
        Ok(Probe {
            ctx: ctx.clone(),
            empty,
            plain,
            top,
            module_stream,
            fresh_ptx,
            calibrator,
        })
    }

    /// Runs every probe in turn (see the module's docs), `kernel` being the stream
    /// the persistent kernel runs on, `launched` when it was launched. Leaks the
    /// probe: kernels given up on may still be queued on its streams.
    pub fn run(mut self, kernel: &CudaStream, launched: Instant) -> Vec<Outcome> {
        let mut out = Vec::new();
        let mut note = |name: &'static str, mut text: String, mut json: Json| {
            let at = launched.elapsed().as_secs_f64();
            let running = matches!(query(kernel), Ok(false));
            let state = if running {
                "kernel still running"
            } else {
                "KERNEL ENDED"
            };
            let _ = write!(text, " [over {at:.2} s after the launch, {state}]");
            json.num("over_s", at);
            json.raw("kernel_running", running.to_string());
            out.push(Outcome {
                name,
                text,
                json: json.finish(),
            });
        };
        let _ = self.ctx.bind_to_thread();

        let (t, j) = run_kernel(&self.empty, &self.plain);
        note("empty kernel", t, j);

        let (t, j) = run_kernel(&self.empty, &self.top);
        note("top priority", t, j);

        let ctx = self.ctx.clone();
        let (t, j) = match bounded(move || ctx.new_stream()) {
            (None, took) => blocked("stream creation", took),
            (Some(Err(e)), took) => failed("stream creation", took, &e),
            (Some(Ok(stream)), took) => {
                let (t, mut j) = run_kernel(&self.empty, &stream);
                j.num("create_us", us(took));
                // Kept: the kernel may still be queued on it.
                std::mem::forget(stream);
                (format!("stream creation {}, {t}", fmt(took)), j)
            }
        };
        note("fresh stream", t, j);

        let (ctx, ptx) = (self.ctx.clone(), self.fresh_ptx.clone());
        let load = move || -> std::result::Result<CudaFunction, DriverError> {
            let module = ctx.load_module(ptx)?;
            module.load_function("tgpu_probe_fresh")
        };
        let (t, j) = match bounded(load) {
            (None, took) => blocked("module load", took),
            (Some(Err(e)), took) => failed("module load", took, &e),
            (Some(Ok(f)), took) => {
                let (t, mut j) = run_kernel(&f, &self.module_stream);
                j.num("load_us", us(took));
                // Kept, with its module: the kernel may still be queued.
                std::mem::forget(f);
                (format!("module load {}, {t}", fmt(took)), j)
            }
        };
        note("fresh module", t, j);

        let (t, j) = calibrate(&mut self.calibrator);
        note("calibrator", t, j);

        let ctx = self.ctx.clone();
        let (t, j) = match bounded(move || Calibrator::new(&ctx)) {
            (None, took) => blocked("creation", took),
            (Some(Err(e)), took) => failed("creation", took, &e),
            (Some(Ok(mut c)), took) => {
                let (t, mut j) = calibrate(&mut c);
                j.num("create_us", us(took));
                // Kept: its kernel may still be queued.
                std::mem::forget(c);
                (format!("creation {}, {t}", fmt(took)), j)
            }
        };
        note("new calibrator", t, j);
        // Kernels may still be queued on the streams, running the modules' code:
        // nothing is destroyed, unloaded or unpinned under them (the process ends
        // soon after).
        std::mem::forget(self);
        out
    }
}

/// The probes' JSON object: `"probe":{"env":{..},"empty_kernel":{..},..}`.
pub fn json(outcomes: &[Outcome]) -> String {
    let mut env = Json::default();
    for k in ENV {
        env.str(k, &env_value(k));
    }
    let mut j = Json::default();
    j.raw("env", env.finish());
    for o in outcomes {
        j.raw(&o.name.replace(' ', "_"), o.json.clone());
    }
    j.finish()
}

fn launch(f: &CudaFunction, stream: &CudaStream) -> std::result::Result<(), DriverError> {
    let cfg = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (32, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut l = stream.launch_builder(f);
    // SAFETY: the kernel takes no parameters and touches no memory.
    unsafe { l.launch(cfg) }?;
    Ok(())
}

/// Whether `stream` has nothing left to run; never waits.
fn query(stream: &CudaStream) -> std::result::Result<bool, DriverError> {
    // SAFETY: a live stream of the context bound to this thread.
    match unsafe { sys::cuStreamQuery(stream.cu_stream()) } {
        sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
        r => r.result().map(|()| true),
    }
}

/// Launches `f` on `stream` and polls until it is done, up to [`RUN_LIMIT`] from
/// the launch call.
fn run_kernel(f: &CudaFunction, stream: &CudaStream) -> (String, Json) {
    let mut j = Json::default();
    let start = Instant::now();
    let launched = launch(f, stream);
    let took = start.elapsed();
    j.num("launch_us", us(took));
    if let Err(e) = launched {
        j.str("error", &format!("{e:?}"));
        return (format!("launch failed after {}: {e:?}", fmt(took)), j);
    }
    loop {
        match query(stream) {
            Ok(true) => {
                let done = start.elapsed();
                j.num("done_us", us(done));
                return (format!("launch {}, done after {}", fmt(took), fmt(done)), j);
            }
            Ok(false) if start.elapsed() > RUN_LIMIT => {
                j.raw("done_us", "null".into());
                return (
                    format!(
                        "launch {}, not run within {} s",
                        fmt(took),
                        RUN_LIMIT.as_secs()
                    ),
                    j,
                );
            }
            Ok(false) => std::hint::spin_loop(),
            Err(e) => {
                j.str("error", &format!("{e:?}"));
                return (format!("launch {}, query failed: {e:?}", fmt(took)), j);
            }
        }
    }
}

/// One periodic calibration, timed (bounded by the calibrator's own timeout).
fn calibrate(c: &mut Calibrator) -> (String, Json) {
    let mut j = Json::default();
    let start = Instant::now();
    let r = c.calibrate(Calibrator::PERIODIC_ROUNDS);
    let took = start.elapsed();
    j.num("took_us", us(took));
    let t = match r {
        Ok(cp) => {
            let bound = cp.map.bound_ns();
            j.raw("ok", "true".into());
            j.raw("bound_ns", bound.to_string());
            format!("ok, bound {bound} ns, took {}", fmt(took))
        }
        Err(e) => {
            j.raw("ok", "false".into());
            j.str("error", &format!("{e:?}"));
            format!("{e:?} after {}", fmt(took))
        }
    };
    (t, j)
}

/// Runs `f` on a helper thread and waits up to [`BLOCK_LIMIT`] for it: its value
/// (`None` if still blocked; the thread is then left behind) and how long it took.
fn bounded<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> (Option<T>, Duration) {
    let (tx, rx) = mpsc::channel();
    let start = Instant::now();
    let spawned = std::thread::Builder::new()
        .name("probe-helper".into())
        .spawn(move || {
            let v = f();
            if let Err(mpsc::SendError((v, _))) = tx.send((v, start.elapsed())) {
                // Given up on: nothing is destroyed or unpinned under a kernel
                // that may still be queued.
                std::mem::forget(v);
            }
        });
    if spawned.is_err() {
        return (None, Duration::ZERO);
    }
    match rx.recv_timeout(BLOCK_LIMIT) {
        Ok((v, took)) => (Some(v), took),
        Err(_) => (None, start.elapsed()),
    }
}

fn blocked(what: &str, took: Duration) -> (String, Json) {
    let mut j = Json::default();
    j.raw("blocked", "true".into());
    j.num("waited_us", us(took));
    (format!("{what} still blocked after {}", fmt(took)), j)
}

fn failed(what: &str, took: Duration, e: &dyn std::fmt::Debug) -> (String, Json) {
    let mut j = Json::default();
    j.num("took_us", us(took));
    j.str("error", &format!("{e:?}"));
    (format!("{what} failed after {}: {e:?}", fmt(took)), j)
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// `4.1 us`, `12.3 ms`, `2.01 s`.
fn fmt(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s < 1e-3 {
        format!("{:.1} us", s * 1e6)
    } else if s < 1.0 {
        format!("{:.1} ms", s * 1e3)
    } else {
        format!("{s:.2} s")
    }
}

/// A flat JSON object, built field by field.
#[derive(Default)]
struct Json(Vec<String>);

impl Json {
    fn raw(&mut self, k: &str, v: String) {
        self.0.push(format!("{}:{v}", cli::json_string(k)));
    }
    fn num(&mut self, k: &str, v: f64) {
        self.raw(k, format!("{v:.3}"));
    }
    fn str(&mut self, k: &str, v: &str) {
        self.raw(k, cli::json_string(v));
    }
    fn finish(self) -> String {
        format!("{{{}}}", self.0.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_is_flat_and_escaped() {
        let mut j = Json::default();
        j.num("launch_us", 4.125);
        j.str("error", "Timeout { round: 0, \"x\" }\n");
        j.raw("done_us", "null".into());
        assert_eq!(
            j.finish(),
            r#"{"launch_us":4.125,"error":"Timeout { round: 0, \"x\" }\u000a","done_us":null}"#
        );
        let o = Outcome {
            name: "empty kernel",
            text: String::new(),
            json: "{}".into(),
        };
        let all = json(&[o]);
        assert!(
            all.starts_with(r#"{"env":{"CUDA_MODULE_LOADING":"#),
            "{all}"
        );
        assert!(all.ends_with(r#","empty_kernel":{}}"#), "{all}");
    }

    #[test]
    fn durations_read_well() {
        assert_eq!(fmt(Duration::from_nanos(4_100)), "4.1 us");
        assert_eq!(fmt(Duration::from_micros(12_300)), "12.3 ms");
        assert_eq!(fmt(Duration::from_millis(2_010)), "2.01 s");
    }
}
