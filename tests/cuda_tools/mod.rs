//! Finding the CUDA compilers the tests need (the PyPI wheels that `scripts/test-env.sh`
//! installs): a missing tool fails the test when `TGPU_REQUIRE_TOOLS=1`, and skips it with
//! a message otherwise.

#![allow(dead_code)] // each test binary uses its own part of this module

use std::path::{Path, PathBuf};
use std::process::Command;

/// The recorder header's folder, for `-I`: `kernels/include` of the crate, or of the
/// workspace above it (the benchmarks, `tools/bench`, include this module too).
pub fn include_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .map(|dir| dir.join("kernels/include"))
        .find(|dir| dir.join("tracing_gpu.cuh").is_file())
        .expect("kernels/include/tracing_gpu.cuh above the crate")
}

/// A file of the crate's source tree, read.
pub fn source(rel: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Whether missing tools are a failure (CI, scripts/test.sh) rather than a skip.
pub fn required() -> bool {
    std::env::var("TGPU_REQUIRE_TOOLS").is_ok_and(|v| v == "1")
}

/// Fails (tools required) or prints why the test is skipped. Returns so the caller can
/// `return` right after.
pub fn skip(reason: &str) {
    if required() {
        panic!("{reason} (TGPU_REQUIRE_TOOLS=1): run `eval \"$(scripts/test-env.sh)\"` first");
    }
    eprintln!("skipped: {reason}");
}

/// `$TGPU_CUDA_HOME/bin/<name>`, if it is there.
pub fn tool(name: &str) -> Option<PathBuf> {
    let home = std::env::var_os("TGPU_CUDA_HOME")?;
    let path = Path::new(&home).join("bin").join(name);
    path.is_file().then_some(path)
}

/// Runs a command; panics with its output when it fails.
pub fn run(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{cmd:?} failed:\n{stdout}\n{stderr}");
    stdout
}

/// nvcc, compiling `src` (C++17, the header on the include path) with `args`, into a file
/// of `dir` named `out`; returns that file's path. nvcc's diagnostics are errors.
pub fn nvcc(nvcc: &Path, dir: &Path, name: &str, src: &str, args: &[&str], out: &str) -> PathBuf {
    let cu = dir.join(format!("{name}.cu"));
    std::fs::write(&cu, src).unwrap();
    let target = dir.join(out);
    let mut cmd = Command::new(nvcc);
    cmd.arg("-std=c++17")
        .arg("-I")
        .arg(include_dir())
        .args(["-Werror", "all-warnings"])
        .args(args)
        .arg("-o")
        .arg(&target)
        .arg(&cu);
    run(&mut cmd);
    target
}
