//! NVRTC for the tests (through `tracing_gpu::cuda::compile`, feature `cuda`): a test
//! declares this module beside `cuda_tools`, which it needs for `skip`. Not a child of
//! `cuda_tools`: the benchmarks (`tools/bench`) include that module too, and have no
//! `cuda` feature to gate this one on.

#![allow(dead_code)] // each test binary uses its own part of this module

use tracing_gpu::cuda::{compile, ensure_nvrtc, KernelBuild};

use crate::cuda_tools::skip;

/// Whether NVRTC loads; if not, the test fails (tools required) or says it skipped.
pub fn available() -> bool {
    match ensure_nvrtc() {
        Ok(()) => true,
        Err(e) => {
            skip(&format!("NVRTC is not available: {e}"));
            false
        }
    }
}

/// The PTX of `src` built as `build` with `defines` added; panics with NVRTC's log.
pub fn ptx(src: &str, build: KernelBuild, defines: &[&str]) -> String {
    let what = format!("{} {} {defines:?}", build.name, build.arch);
    let build = defines.iter().fold(build, |b, d| b.define(*d));
    compile(src, &build)
        .unwrap_or_else(|e| panic!("{what}: {e}"))
        .to_src()
}
