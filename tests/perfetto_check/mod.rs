//! Runs `tests/check_perfetto.py` (Perfetto's own `perfetto_trace_pb2`) on a
//! trace a test wrote. Shared by the `perfetto_*` tests.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The checker script.
pub fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/check_perfetto.py")
}

/// Runs the checker with `args`; returns its summary (`key=value` pairs), or
/// `None` (after saying why) when there is no Python with `perfetto` and
/// `TGPU_REQUIRE_TOOLS` is not set. Panics with the checker's messages if
/// the trace fails a check.
pub fn check(trace: &Path, args: &[&str]) -> Option<HashMap<String, u64>> {
    let required = std::env::var("TGPU_REQUIRE_TOOLS").is_ok_and(|v| v == "1");
    let Ok(python) = std::env::var("TGPU_PYTHON") else {
        assert!(
            !required,
            "TGPU_REQUIRE_TOOLS=1 but TGPU_PYTHON is not set (eval \"$(scripts/test-env.sh)\")"
        );
        println!("skipped: TGPU_PYTHON not set, the Perfetto schema check did not run");
        return None;
    };
    let out = Command::new(&python)
        .arg(script())
        .arg(trace)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {python}: {e}"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.code() == Some(2) && !required {
        println!("skipped: the checker cannot run here: {stderr}");
        return None;
    }
    assert!(
        out.status.success(),
        "check_perfetto failed on {}:\n{stderr}",
        trace.display()
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let summary = stdout
        .split_once(": OK: ")
        .unwrap_or_else(|| panic!("unexpected checker output: {stdout}"))
        .1;
    Some(
        summary
            .trim()
            .split(", ")
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.parse().unwrap_or(u64::MAX)))
            .collect(),
    )
}

/// Runs the checker's self-test (one good trace passes, broken ones fail);
/// `false` if it was skipped.
// Not every crate that includes this module runs the self-test.
#[allow(dead_code)]
pub fn self_test() -> bool {
    let required = std::env::var("TGPU_REQUIRE_TOOLS").is_ok_and(|v| v == "1");
    let Ok(python) = std::env::var("TGPU_PYTHON") else {
        assert!(!required, "TGPU_REQUIRE_TOOLS=1 but TGPU_PYTHON is not set");
        println!("skipped: TGPU_PYTHON not set, the checker's self-test did not run");
        return false;
    };
    let out = Command::new(&python)
        .arg(script())
        .arg("--self-test")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {python}: {e}"));
    assert!(
        out.status.success(),
        "check_perfetto --self-test failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    true
}

/// The slices the checker lists (`--slices-out`), each warp lane's track named
/// after its warp: a range that encloses ranges of earlier parts opens after
/// their packets were written, so it goes on a second lane of its warp
/// (`block 0 warp 1 #2`), where the whole launch has it on the first.
// Not every crate that includes this module compares slices.
#[allow(dead_code)]
pub fn slices_by_warp(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines: Vec<String> = text
        .lines()
        .map(|l| {
            let (track, rest) = l.split_once("\", ").unwrap();
            let track = match track.rfind(" #") {
                Some(i) if track[i + 2..].bytes().all(|b| b.is_ascii_digit()) => &track[..i],
                _ => track,
            };
            format!("{track}\", {rest}")
        })
        .collect();
    lines.sort();
    lines
}
