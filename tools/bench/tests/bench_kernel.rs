//! The recorder benchmark's kernel (`tools/bench/kernels/recorder_bench.cu`) under NVRTC,
//! with no GPU: every build that `recorder_bench` times compiles, and only ours and the
//! bound store records. Needs NVRTC: with `TGPU_REQUIRE_TOOLS=1` its absence fails the
//! test, otherwise the test says it skipped.

#[path = "../../../tests/cuda_tools/mod.rs"]
mod cuda_tools;

use cuda_tools::skip;
use tracing_gpu::cuda::{compile, ensure_nvrtc, KernelBuild};

fn available() -> bool {
    match ensure_nvrtc() {
        Ok(()) => true,
        Err(e) => {
            skip(&format!("NVRTC is not available: {e}"));
            false
        }
    }
}

/// The comparison recorders the bench's seed build includes (as the benchmarks supply them).
const BASELINES: &str = include_str!("../kernels/baselines.cuh");

fn ptx(name: &str, arch: &'static str, src: &str, defines: &[&str]) -> String {
    let mut build = KernelBuild::new(name, arch).header("baselines.cuh", BASELINES);
    for d in defines {
        build = build.define(*d);
    }
    compile(src, &build)
        .unwrap_or_else(|e| panic!("{name} {arch} {defines:?}: {e}"))
        .to_src()
}

#[test]
fn bench_kernel_compiles_in_every_build() {
    if !available() {
        return;
    }
    let src = include_str!("../kernels/recorder_bench.cu");
    let builds: [&[&str]; 6] = [
        &[],
        &["TGPU_BENCH_FLOOR=1"],
        &["TGPU_ENABLED=1"],
        &["TGPU_ENABLED=1", "TGPU_BENCH_SWITCH=1"],
        &["TGPU_BENCH_SEED=1"],
        &["TGPU_BENCH_BOUND=1"],
    ];
    for defines in builds {
        for unroll in ["TGPU_BENCH_UNROLL=1", "TGPU_BENCH_UNROLL=4"] {
            let mut d = defines.to_vec();
            d.push(unroll);
            let p = ptx("recorder_bench", "sm_90", src, &d);
            // Ours and the bound store 16-byte evict-first records; no other build does.
            assert_eq!(
                p.contains("st.global.cs.v4.u32"),
                defines.contains(&"TGPU_ENABLED=1") || defines.contains(&"TGPU_BENCH_BOUND=1"),
                "{d:?}"
            );
        }
    }
}
