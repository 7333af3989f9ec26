//! Without a GPU (here: no devices visible, or no driver at all), every GPU benchmark
//! stops at once with one line on stderr that names it and says why, and a failing exit
//! status: never a panic, never a hang.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs `bin` with no device visible; returns its exit code and stderr.
fn without_gpu(bin: &str, args: &[&str]) -> (Option<i32>, String) {
    let start = Instant::now();
    let out = Command::new(bin)
        .args(args)
        .env("CUDA_VISIBLE_DEVICES", "")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {bin}: {e}"));
    // Loading the libraries and finding no device is quick; a run would take seconds.
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "{bin}: {:?}",
        start.elapsed()
    );
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn gpu_benchmarks_say_why_they_stop_without_a_gpu() {
    let bins: [(&str, &str, &[&str]); 7] = [
        ("storm", env!("CARGO_BIN_EXE_storm"), &["--launches", "10"]),
        (
            "gemm_loop",
            env!("CARGO_BIN_EXE_gemm_loop"),
            &["--size", "512", "512", "512", "--launches", "2"],
        ),
        (
            "graph_replay",
            env!("CARGO_BIN_EXE_graph_replay"),
            &["--nodes", "2", "--replays", "2"],
        ),
        (
            "decode_step",
            env!("CARGO_BIN_EXE_decode_step"),
            &["--layers", "1", "--replays", "2"],
        ),
        (
            "causality",
            env!("CARGO_BIN_EXE_causality"),
            &["--launches", "2", "--graph", "--replays", "2"],
        ),
        (
            "gemm_stream",
            env!("CARGO_BIN_EXE_gemm_stream"),
            &["--seconds", "0.01"],
        ),
        (
            "profile_overhead",
            env!("CARGO_BIN_EXE_profile_overhead"),
            &["--rounds", "1", "--launches", "1"],
        ),
    ];
    for (name, bin, args) in bins {
        let (code, stderr) = without_gpu(bin, args);
        // 101 is Rust's panic status; 0 would claim figures that were never measured.
        assert!(
            matches!(code, Some(1 | 2)),
            "{name}: exit {code:?}, stderr:\n{stderr}"
        );
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{name}: stderr:\n{stderr}");
        assert!(
            lines[0].starts_with(&format!("{name}: ")),
            "{name}: {stderr}"
        );
        assert!(
            ["CUDA", "libcuda", "libnvrtc", "device", "GPU"]
                .iter()
                .any(|w| lines[0].contains(w)),
            "{name}: the message does not say what is missing: {stderr}"
        );
    }
}

/// The storm's options (`--threads`, `--gap`, `--variants`) and the shared `--stream`
/// are checked before anything runs.
#[test]
fn bad_storm_options_are_usage_errors() {
    for args in [
        &["--threads", "0"][..],
        &["--threads", "65"],
        &["--stream", "other"],
        &["--launches", "0"],
        &["--gap=-1"],
        &["--gap", "inf"],
        &["--variants", "plain,bogus"],
    ] {
        let (code, stderr) = without_gpu(env!("CARGO_BIN_EXE_storm"), args);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains("error: invalid value"),
            "{args:?}: {stderr}"
        );
    }
}

/// The decode step's model shape is checked before anything runs: a shape its kernels
/// cannot run is a usage error, said in one line, without a GPU.
#[test]
fn shapes_decode_step_cannot_run_are_refused_at_once() {
    for args in [
        &["--hidden", "2000"][..],
        &["--kv-heads", "3"],
        &["--batch", "5"],
        &["--intermediate", "5630"],
        &["--tokens", "20000"],
    ] {
        let (code, stderr) = without_gpu(env!("CARGO_BIN_EXE_decode_step"), args);
        assert_eq!(code, Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.starts_with("decode_step: ") && stderr.lines().count() == 1,
            "{args:?}: {stderr}"
        );
    }
}
