//! The live path on a real GPU: profiler, collector, delivery, PerfettoLayer. Runs
//! the quickstart example's `run` and checks its trace with Perfetto's own schema
//! (`tests/check_perfetto.py`). Prints "skipped: no GPU" and passes where there is
//! no GPU.

#![cfg(feature = "cuda")]

#[allow(dead_code)]
#[path = "../examples/quickstart.rs"]
mod quickstart;

use std::process::Command;

fn gpu_present() -> bool {
    tracing_gpu::cuda::ensure_libraries().is_ok()
        && tracing_gpu::cuda::cudarc::driver::CudaContext::device_count().is_ok_and(|n| n > 0)
}

#[test]
fn live_trace_passes_the_schema_check() {
    if !gpu_present() {
        println!("skipped: no GPU");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("live.perfetto-trace");
    let dump = dir.path().join("live.tgpu");
    let launches = 4;
    let s = quickstart::run(&trace, Some(&dump), launches, true).unwrap();
    assert_eq!(s.stats.delivered, launches as u64);
    assert_eq!((s.stats.failed, s.stats.skipped), (0, 0));
    assert!(s.stats.events > 0);
    assert_eq!(s.trace.device_events, s.stats.events);
    assert_eq!(s.trace.kernels, launches as u64);
    assert_eq!(s.trace.flows, launches as u64);

    // The capture reads back with every launch.
    let back = tracing_gpu::capture::Capture::read(&dump).unwrap();
    assert_eq!(back.launches.len(), launches as usize);
    assert!(back.devices[0]
        .calibrations
        .iter()
        .all(|c| !c.samples.is_empty()));
    assert!(
        back.host_spans
            .iter()
            .filter(|h| h.launch_id.is_some())
            .count()
            == launches as usize
    );

    let Ok(python) = std::env::var("TGPU_PYTHON") else {
        assert!(
            std::env::var("TGPU_REQUIRE_TOOLS").is_err(),
            "TGPU_REQUIRE_TOOLS is set but TGPU_PYTHON is not"
        );
        println!("skipped the schema check: TGPU_PYTHON not set (eval \"$(scripts/test-env.sh)\")");
        return;
    };
    let out = Command::new(python)
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/check_perfetto.py"
        ))
        .arg(&trace)
        .args(["--expect-gpus", "1"])
        .args(["--expect-kernels", &launches.to_string()])
        .args(["--expect-flows", &launches.to_string()])
        .args(["--expect-device-slices", &s.stats.events.to_string()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "check_perfetto failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
