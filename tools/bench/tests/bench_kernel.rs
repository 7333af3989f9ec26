//! The recorder benchmark's kernel (`tools/bench/kernels/recorder_bench.cu`) under NVRTC,
//! with no GPU: every build that `recorder_bench` times compiles, only v1 and the bound
//! store 16-byte records, and only v2 stages entries across the lanes. Needs NVRTC: with `TGPU_REQUIRE_TOOLS=1` its absence fails the
//! test, otherwise the test says it skipped.

#[path = "../../../tests/cuda_tools/mod.rs"]
mod cuda_tools;
#[path = "../../../tests/nvrtc_tools/mod.rs"]
mod nvrtc_tools;

use nvrtc_tools::available;
use tracing_gpu::cuda::KernelBuild;
use tracing_gpu_bench::kernels::{BASELINES, RECORDER_BENCH};

fn ptx(name: &str, arch: &'static str, src: &str, defines: &[&str]) -> String {
    // The comparison recorders the bench's seed build includes (as the benchmarks supply them).
    let build = KernelBuild::new(name, arch).header("baselines.cuh", BASELINES);
    nvrtc_tools::ptx(src, build, defines)
}

#[test]
fn bench_kernel_compiles_in_every_build() {
    if !available() {
        return;
    }
    let src = RECORDER_BENCH;
    let builds: [&[&str]; 10] = [
        &[],
        &["TGPU_BENCH_FLOOR=1"],
        &["TGPU_ENABLED=1", "TGPU_FORMAT=1"],
        &["TGPU_ENABLED=1", "TGPU_FORMAT=1", "TGPU_BENCH_SWITCH=1"],
        &["TGPU_ENABLED=1"],
        &["TGPU_ENABLED=1", "TGPU_BENCH_SWITCH=1"],
        &[
            "TGPU_ENABLED=1",
            "TGPU_BENCH_SWITCH=1",
            "TGPU_BENCH_PAYLOAD=0",
        ],
        &["TGPU_BENCH_SEED=1"],
        &["TGPU_BENCH_BOUND=1"],
        &["TGPU_BENCH_FLASHINFER=1"],
    ];
    for defines in builds {
        for unroll in ["TGPU_BENCH_UNROLL=1", "TGPU_BENCH_UNROLL=4"] {
            let mut d = defines.to_vec();
            d.push(unroll);
            let p = ptx("recorder_bench", "sm_90", src, &d);
            let on = defines.contains(&"TGPU_ENABLED=1");
            let v1 = on && defines.contains(&"TGPU_FORMAT=1");
            // v1 and the bound store 16-byte evict-first records; no other build does.
            assert_eq!(
                p.contains("st.global.cs.v4.u32"),
                v1 || defines.contains(&"TGPU_BENCH_BOUND=1"),
                "{d:?}"
            );
            // v2 stores each lane's 8-byte entry, among the lanes it found active.
            assert_eq!(
                p.contains("activemask.b32") && p.contains("st.global.v2.u32"),
                on && !v1,
                "{d:?}"
            );
        }
    }
}

/// The dense kernel (`dense`) under NVRTC in every build it times: the gate off has no
/// trace parameter and no timer, the recording builds store their format's writes, and
/// the silent ones keep the recorder's setup and flush.
#[test]
fn dense_kernel_compiles_in_every_build() {
    if !available() {
        return;
    }
    let builds: [&[&str]; 5] = [
        &[],
        &["TGPU_ENABLED=1", "TGPU_FORMAT=1"],
        &["TGPU_ENABLED=1"],
        &["TGPU_ENABLED=1", "TGPU_FORMAT=1", "DENSE_SILENT=1"],
        &["TGPU_ENABLED=1", "DENSE_SILENT=1"],
    ];
    for defines in builds {
        let p = ptx("dense", "sm_90", tracing_gpu_bench::kernels::DENSE, defines);
        let on = !defines.is_empty();
        let v1 = defines.contains(&"TGPU_FORMAT=1");
        assert_eq!(p.contains("%globaltimer"), on, "{defines:?}");
        assert_eq!(p.contains("st.global.cs.v4.u32"), v1, "{defines:?}");
        assert_eq!(p.contains("activemask.b32"), on && !v1, "{defines:?}");
    }
}

/// The streaming benchmark's kernel (`stream_bench`) under NVRTC: the gate off has no timer
/// and no trace parameter; v2 built with `TGPU_STREAM=1` holds the streaming path (the
/// host's `read` loaded past the caches); plain v2 and v1 compile too and never load it.
#[test]
fn stream_kernel_compiles_in_every_build() {
    if !available() {
        return;
    }
    let builds: [&[&str]; 4] = [
        &[],
        &["TGPU_ENABLED=1"],
        &["TGPU_ENABLED=1", "TGPU_STREAM=1"],
        &["TGPU_ENABLED=1", "TGPU_FORMAT=1"],
    ];
    for defines in builds {
        for arch in ["sm_80", "sm_90"] {
            let p = ptx(
                "stream_bench",
                arch,
                tracing_gpu_bench::kernels::STREAM,
                defines,
            );
            let on = !defines.is_empty();
            let streams = defines.contains(&"TGPU_STREAM=1");
            assert!(p.contains(".entry stream_bench("), "{defines:?}");
            assert_eq!(p.contains("%globaltimer"), on, "{defines:?}");
            assert_eq!(p.contains("ld.volatile.global.u32"), streams, "{defines:?}");
        }
    }
}

/// The quickstart's kernel in the two builds the launch benchmarks time: the gate-off
/// build (`quickstart_off::build`, their baseline) has no trace parameter and no timer;
/// the same build with the gate takes the trace as a sixth parameter and reads the timer.
#[test]
fn quickstart_off_build_has_no_recorder() {
    if !available() {
        return;
    }
    use tracing_gpu_bench::{quickstart, quickstart_off};
    for arch in ["sm_80", "sm_90"] {
        for defines in [&[][..], &["TGPU_ENABLED=1"]] {
            let p = nvrtc_tools::ptx(quickstart::SOURCE, quickstart_off::build(arch), defines);
            let on = !defines.is_empty();
            assert!(p.contains("tiled_poly_param_4"), "{arch} {defines:?}");
            assert_eq!(p.contains("tiled_poly_param_5"), on, "{arch} {defines:?}");
            assert_eq!(p.contains("%globaltimer"), on, "{arch} {defines:?}");
        }
    }
}

/// The decode step's kernels (`decode_step`) under NVRTC in the two builds it times: the
/// gate off has no trace parameter and no timer; with the gate every kernel of the step
/// takes the trace as one more parameter and reads the timer, and `fill` (set-up, not
/// instrumented) is the same in both.
#[test]
fn decode_step_kernels_compile_with_the_gate_off_and_on() {
    if !available() {
        return;
    }
    // Each kernel of the step and its parameter count without the trace.
    let kernels = [
        ("embed", 4),
        ("rmsnorm", 5),
        ("gemv", 6),
        ("rope", 9),
        ("attention", 10),
        ("combine", 5),
        ("residual", 3),
        ("silu_mul", 4),
    ];
    for arch in ["sm_80", "sm_90"] {
        for defines in [&[][..], &["TGPU_ENABLED=1"]] {
            let p = nvrtc_tools::ptx(
                tracing_gpu_bench::kernels::DECODE_STEP,
                KernelBuild::new("decode_step.cu", arch),
                defines,
            );
            let on = !defines.is_empty();
            assert_eq!(p.contains("%globaltimer"), on, "{arch} {defines:?}");
            assert!(p.contains(".entry fill(") && p.contains("fill_param_4"));
            assert!(!p.contains("fill_param_5"), "{arch} {defines:?}");
            for (name, params) in kernels {
                assert!(p.contains(&format!(".entry {name}(")), "{name} {arch}");
                let last = format!("{name}_param_{}", params - 1);
                let trace = format!("{name}_param_{params}");
                assert!(p.contains(&last), "{name} {arch} {defines:?}");
                assert_eq!(p.contains(&trace), on, "{name} {arch} {defines:?}");
            }
        }
    }
}

/// `--header FILE` (`cli::Header`): the decode step's recorder build compiles the variant,
/// not the embedded header. The variant here is the shipped header with a marker kernel
/// appended, which the PTX then holds; a file that cannot be read is a clear error.
#[test]
fn a_header_variant_replaces_the_embedded_one() {
    if !available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("variant.cuh");
    let marker = "extern \"C\" __global__ void tgpu_header_variant_marker() {}\n";
    std::fs::write(
        &path,
        format!("{}{marker}", tracing_gpu::cuda::HEADER_SOURCE),
    )
    .unwrap();
    let header = tracing_gpu_bench::cli::Header::read(Some(&path))
        .unwrap()
        .expect("a header");
    let (src, build) = header.apply(
        tracing_gpu_bench::kernels::DECODE_STEP,
        KernelBuild::new("decode_step.cu", "sm_90"),
    );
    let with = nvrtc_tools::ptx(&src, build, &["TGPU_ENABLED=1"]);
    assert!(with.contains("tgpu_header_variant_marker"));
    let without = nvrtc_tools::ptx(
        tracing_gpu_bench::kernels::DECODE_STEP,
        KernelBuild::new("decode_step.cu", "sm_90"),
        &["TGPU_ENABLED=1"],
    );
    assert!(!without.contains("tgpu_header_variant_marker"));
    let missing = tracing_gpu_bench::cli::Header::read(Some(&dir.path().join("none.cuh")));
    assert!(missing.unwrap_err().to_string().contains("none.cuh"));
}

/// The lead kernel that `--lead-us` puts ahead of each timed block compiles, and spins on
/// the timer it reads (a loop on `%globaltimer`, not a fixed count of iterations).
#[test]
fn the_lead_kernel_compiles() {
    if !available() {
        return;
    }
    let ptx = nvrtc_tools::ptx(
        tracing_gpu_bench::device::LEAD_SOURCE,
        KernelBuild::new("lead.cu", "sm_90"),
        &[],
    );
    assert!(ptx.contains(".entry tgpu_bench_lead"), "{ptx}");
    assert!(ptx.contains("%globaltimer"), "{ptx}");
}
