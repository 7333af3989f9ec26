//! The recorder header under real compilers, with no GPU: NVRTC (through
//! `tracing_gpu::cuda::compile`, feature `cuda`) and the PyPI wheel's nvcc, for sm_80 and
//! sm_90, on the example kernels in `kernels/examples/` (one of them warp-specialized, one
//! persistent); and the gate: with `TGPU_ENABLED` off, an instrumented kernel's PTX is
//! identical to the same kernel with its instrumentation lines deleted.

mod cuda_tools;
#[cfg(feature = "cuda")]
mod nvrtc_tools;

use cuda_tools::{nvcc, skip, tool};

/// The example kernels: (name, which is also the entry point; source).
const KERNELS: [(&str, &str); 3] = [
    ("phases", include_str!("../kernels/examples/phases.cu")),
    (
        "warp_specialized",
        include_str!("../kernels/examples/warp_specialized.cu"),
    ),
    (
        "persistent",
        include_str!("../kernels/examples/persistent.cu"),
    ),
];

const ARCHS: [&str; 2] = ["sm_80", "sm_90"];

/// A line the production kernel would not have: it names the gate's macros, the recorder
/// (`rec.`) or the header.
fn is_instrumentation(line: &str) -> bool {
    line.contains("TGPU_") || line.contains("rec.") || line.contains("tracing_gpu.cuh")
}

/// The kernel with its instrumentation deleted: the trace parameter macro goes from the
/// signature, and every other instrumentation line is blanked (not removed, so that line
/// numbers, and so line info, stay the same).
fn strip(src: &str) -> String {
    src.lines()
        .map(|l| {
            let l = l.replace(" TGPU_TRACE_PARAM", "");
            if is_instrumentation(&l) {
                String::new()
            } else {
                l
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn stripping_leaves_a_plain_cuda_kernel() {
    for (name, src) in KERNELS {
        let stripped = strip(src);
        let removed = src.lines().filter(|l| is_instrumentation(l)).count();
        // The include, the events, the parameter, the recorder and at least two calls.
        assert!(removed >= 6, "{name}: only {removed} instrumentation lines");
        assert!(
            src.contains(" TGPU_TRACE_PARAM)"),
            "{name}: no trace parameter"
        );
        for needle in ["TGPU", "rec.", "tgpu", "tracing_gpu"] {
            assert!(
                !stripped.contains(needle),
                "{name}: {needle} left after stripping"
            );
        }
        assert_eq!(stripped.lines().count(), src.lines().count());
    }
}

/// PTX that must show the recorder of record format `format` at work (1 or 2: the gate
/// on; 3: v2 built with `TGPU_STREAM=1`) or not at all (0: the gate off).
fn check_ptx(name: &str, arch: &str, format: u8, ptx: &str) {
    let on = format != 0;
    let name_arch = format!("{name} {arch} format {format} (0: gate off)");
    assert!(
        ptx.contains(&format!(".entry {name}(")),
        "{name_arch}: no entry point in the PTX"
    );
    // v1: lane 0 stores 16-byte records, streaming; v2: each lane its staged 8-byte
    // entry, among the lanes `activemask` found; v2 with TGPU_STREAM=1 also (chosen at
    // run time, so in the code) a ring's chunks: the host's `read` loaded past the
    // caches, and the flush's vote on whether the warp stored any.
    let stores: &[&str] = match format {
        1 => &["st.global.cs.v4.u32"],
        2 => &["st.global.v2.u32", "activemask.b32", "%lanemask_lt"],
        _ => &[
            "st.global.v2.u32",
            "activemask.b32",
            "%lanemask_lt",
            "ld.volatile.global.u32",
            "vote.sync.any.pred",
        ],
    };
    if on {
        for needle in ["%globaltimer_lo", "%globaltimer;", "%smid"]
            .iter()
            .chain(stores)
        {
            assert!(ptx.contains(needle), "{name_arch}: no {needle} in the PTX");
        }
        // Only v2 built to stream loads what the host writes; v1 and plain v2 have
        // no streaming code at all.
        assert_eq!(
            ptx.contains("ld.volatile"),
            format == 3,
            "{name_arch}: only v2 with TGPU_STREAM=1 streams"
        );
        assert_eq!(
            ptx.contains("%cluster_ctarank"),
            arch == "sm_90",
            "{name_arch}: %cluster_ctarank is read on sm_90 only"
        );
    } else {
        assert!(
            !ptx.contains("globaltimer"),
            "{name_arch}: the PTX reads the timer"
        );
    }
}

#[cfg(feature = "cuda")]
mod nvrtc {
    use super::*;
    use crate::nvrtc_tools::available;
    use tracing_gpu::cuda::{compile, CudaError, KernelBuild};

    fn ptx(name: &str, arch: &'static str, src: &str, defines: &[&str]) -> String {
        crate::nvrtc_tools::ptx(src, KernelBuild::new(name, arch), defines)
    }

    #[test]
    fn examples_compile_for_sm80_and_sm90() {
        if !available() {
            return;
        }
        for (name, src) in KERNELS {
            for arch in ARCHS {
                check_ptx(name, arch, 2, &ptx(name, arch, src, &["TGPU_ENABLED=1"]));
                let stream = ptx(name, arch, src, &["TGPU_ENABLED=1", "TGPU_STREAM=1"]);
                check_ptx(name, arch, 3, &stream);
                let v1 = ptx(name, arch, src, &["TGPU_ENABLED=1", "TGPU_FORMAT=1"]);
                check_ptx(name, arch, 1, &v1);
                check_ptx(name, arch, 0, &ptx(name, arch, src, &[]));
            }
        }
    }

    #[test]
    fn gate_off_ptx_is_identical_to_the_stripped_kernel() {
        if !available() {
            return;
        }
        for (name, src) in KERNELS {
            for arch in ARCHS {
                let stripped = ptx(name, arch, &strip(src), &[]);
                // Undefined, and defined to 0: both are "off".
                assert_eq!(
                    ptx(name, arch, src, &[]),
                    stripped,
                    "{name} {arch}: gate undefined"
                );
                assert_eq!(
                    ptx(name, arch, src, &["TGPU_ENABLED=0"]),
                    stripped,
                    "{name} {arch}: gate 0"
                );
                // The comparison can fail: with the gate on the PTX is not the same.
                assert_ne!(
                    ptx(name, arch, src, &["TGPU_ENABLED=1"]),
                    stripped,
                    "{name} {arch}: gate on"
                );
            }
        }
    }

    /// The one fenced block of `lang` in `doc` (a file of the repository).
    fn doc_block(doc: &str, lang: &str) -> String {
        let text =
            std::fs::read_to_string(format!("{}/{doc}", env!("CARGO_MANIFEST_DIR"))).unwrap();
        let open = format!("\n```{lang}\n");
        let mut blocks = text.split(&open).skip(1);
        let block = blocks
            .next()
            .unwrap_or_else(|| panic!("{doc}: no {lang} block"));
        assert!(blocks.next().is_none(), "{doc}: more than one {lang} block");
        block.split("\n```").next().unwrap().to_string()
    }

    /// The README's instrumented kernel, as shown, built both ways.
    #[test]
    fn the_readmes_kernel_compiles() {
        if !available() {
            return;
        }
        let src = doc_block("README.md", "cuda");
        for arch in ARCHS {
            check_ptx(
                "gemm",
                arch,
                2,
                &ptx("gemm", arch, &src, &["TGPU_ENABLED=1"]),
            );
            check_ptx("gemm", arch, 0, &ptx("gemm", arch, &src, &[]));
        }
    }

    /// docs/format.md's kernel argument, as shown: 32 bytes, the header's
    /// `tgpu::Trace` field for field.
    #[test]
    fn the_documented_kernel_argument_is_the_headers() {
        if !available() {
            return;
        }
        let shown = doc_block("docs/format.md", "c");
        let src = format!(
            "#include \"tracing_gpu.cuh\"\n{shown}\n\
             static_assert(sizeof(Trace) == 32, \"32 bytes\");\n\
             static_assert(sizeof(Trace) == sizeof(tgpu::Trace), \"the header's size\");\n\
             static_assert(__builtin_offsetof(Trace, capacity) == __builtin_offsetof(tgpu::Trace, capacity), \"\");\n\
             static_assert(__builtin_offsetof(Trace, slot_count) == __builtin_offsetof(tgpu::Trace, slot_count), \"\");\n\
             static_assert(__builtin_offsetof(Trace, warp_mask) == __builtin_offsetof(tgpu::Trace, warp_mask), \"\");\n\
             static_assert(__builtin_offsetof(Trace, block_stride) == __builtin_offsetof(tgpu::Trace, block_stride), \"\");\n\
             static_assert(__builtin_offsetof(Trace, block_offset) == __builtin_offsetof(tgpu::Trace, block_offset), \"\");\n\
             static_assert(__builtin_offsetof(Trace, launch_every) == __builtin_offsetof(tgpu::Trace, launch_every), \"\");\n\
             extern \"C\" __global__ void k() {{}}\n"
        );
        ptx("k", "sm_90", &src, &[]);
    }

    #[test]
    fn every_build_takes_the_32_byte_argument_and_reads_its_sampling() {
        if !available() {
            return;
        }
        // format::KernelArg is 32 bytes, 8-aligned: so must the kernel's parameter be,
        // or the launch passes the wrong bytes. Every recording build reads the
        // sampling's warp mask, block stride and block offset (offsets 16, 20, 24), at
        // construction; the gated-off kernel has no such parameter.
        let src = "#include \"tracing_gpu.cuh\"\nTGPU_EVENT(A, 1);\n\
                   extern \"C\" __global__ void k(float* out TGPU_TRACE_PARAM) {\n\
                   TGPU_RECORDER(rec, A);\nrec.begin<A>();\nout[threadIdx.x] = 1.0f;\nrec.end<A>(7);\n}\n";
        for defines in [
            &["TGPU_ENABLED=1"][..],
            &["TGPU_ENABLED=1", "TGPU_FORMAT=1"],
            &["TGPU_ENABLED=1", "TGPU_STREAM=1"],
            &["TGPU_ENABLED=1", "TGPU_KEEP_SLOT=1"],
        ] {
            let ptx = ptx("k", "sm_90", src, defines);
            assert!(
                ptx.contains(".param .align 8 .b8 k_param_1[32]"),
                "{defines:?}: the trace parameter\n{ptx}"
            );
            // (Scalar loads, or pairs: +16 with +20, +24 with +28.)
            for word in ["k_param_1+16]", "k_param_1+24]"] {
                assert!(ptx.contains(word), "{defines:?}: {word} not read\n{ptx}");
            }
        }
        assert!(!ptx("k", "sm_90", src, &[]).contains("k_param_1"));
    }

    #[test]
    fn the_trace_forwards_to_a_device_function() {
        if !available() {
            return;
        }
        // The kernel's body lives in a device function that owns the recorder.
        let src = "#include \"tracing_gpu.cuh\"\nTGPU_EVENT(A, 1);\n\
                   __device__ void body(float* out TGPU_TRACE_PARAM) {\n\
                   TGPU_RECORDER(rec, A);\nrec.begin<A>();\nout[threadIdx.x] = 1.0f;\nrec.end<A>(7);\n}\n\
                   extern \"C\" __global__ void k(float* out TGPU_TRACE_PARAM) { body(out TGPU_TRACE_ARG); }\n";
        check_ptx(
            "k",
            "sm_90",
            2,
            &ptx("k", "sm_90", src, &["TGPU_ENABLED=1"]),
        );
        check_ptx("k", "sm_90", 0, &ptx("k", "sm_90", src, &[]));
    }

    #[test]
    fn a_build_supplies_its_own_headers() {
        if !available() {
            return;
        }
        // Two builds bring different files under one name: each sees its own.
        let src = "#include \"tracing_gpu.cuh\"\n#include \"bench/value.cuh\"\n\
                   extern \"C\" __global__ void k(unsigned* out) { *out = VALUE; }\n";
        for value in [0x1234_5678u32, 0x0BAD_CAFE] {
            let build = KernelBuild::new("k", "sm_90")
                .header("bench/value.cuh", format!("#define VALUE {value}u\n"));
            let p = compile(src, &build).expect("compiles").to_src();
            assert!(p.contains(&value.to_string()), "{value}: not in\n{p}");
        }
        let bad = KernelBuild::new("k", "sm_90").header("../escape.cuh", "");
        match compile(src, &bad) {
            Err(CudaError::Compile { message, .. }) => {
                assert!(message.contains("escape.cuh"), "{message}")
            }
            other => panic!("a header name with `..` was accepted: {other:?}"),
        }
    }

    /// Compiles a kernel that must be rejected, gate on and off, and returns NVRTC's logs.
    fn rejected(body: &str) -> Vec<String> {
        let src = format!(
            "#include \"tracing_gpu.cuh\"\nTGPU_EVENT(A, 1);\nTGPU_EVENT(B, 2);\n\
             extern \"C\" __global__ void k(int n TGPU_TRACE_PARAM) {{\n{body}\n}}\n"
        );
        [&["TGPU_ENABLED=1"][..], &[][..]]
            .iter()
            .map(|defines| {
                let mut build = KernelBuild::new("misuse", "sm_90");
                for d in *defines {
                    build = build.define(*d);
                }
                match compile(&src, &build) {
                    Err(CudaError::Compile { message, .. }) => message,
                    Err(e) => panic!("{body}: unexpected error {e}"),
                    Ok(_) => panic!("{body} {defines:?}: compiled, but must not"),
                }
            })
            .collect()
    }

    #[test]
    fn misuse_is_a_compile_error_with_the_gate_on_and_off() {
        if !available() {
            return;
        }
        let cases = [
            (
                "TGPU_RECORDER(rec, A);\nrec.begin<B>();",
                "event type not in this Recorder's list",
            ),
            (
                "TGPU_RECORDER(rec, A);\nrec.switch_to<A, B>(n);",
                "event type not in this Recorder's list",
            ),
            (
                "TGPU_RECORDER(rec, A, A);\nrec.end<A>(n);",
                "each event type may appear once",
            ),
            (
                "TGPU_EVENT(C, 70000);\nTGPU_RECORDER(rec, C);\nrec.instant<C>(n);",
                "event ids are 16-bit",
            ),
        ];
        for (body, message) in cases {
            for log in rejected(body) {
                assert!(
                    log.contains(message),
                    "{body}: expected \"{message}\" in:\n{log}"
                );
            }
        }
    }
}

#[test]
fn examples_compile_under_the_wheels_nvcc() {
    let Some(nvcc_path) = tool("nvcc") else {
        skip("nvcc from the CUDA wheels not found ($TGPU_CUDA_HOME/bin/nvcc)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    for (name, src) in KERNELS {
        for arch in ARCHS {
            for define in ["-DTGPU_ENABLED=1", "-DTGPU_ENABLED=0"] {
                // Through ptxas to a cubin: the whole chain, warnings as errors.
                let arch_flag = format!("-arch={arch}");
                let cubin = nvcc(
                    &nvcc_path,
                    dir.path(),
                    name,
                    src,
                    &[&arch_flag, define, "-cubin"],
                    "k.cubin",
                );
                assert!(std::fs::metadata(&cubin).unwrap().len() > 0);
            }
        }
    }
}

#[test]
fn gate_off_ptx_is_identical_under_nvcc() {
    let Some(nvcc_path) = tool("nvcc") else {
        skip("nvcc from the CUDA wheels not found ($TGPU_CUDA_HOME/bin/nvcc)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    for (name, src) in KERNELS {
        for arch in ARCHS {
            let arch_flag = format!("-arch={arch}");
            let ptx_of = |source: &str, define: &str| {
                let p = nvcc(
                    &nvcc_path,
                    dir.path(),
                    name,
                    source,
                    &[&arch_flag, define, "-ptx"],
                    "k.ptx",
                );
                std::fs::read_to_string(p).unwrap()
            };
            let stripped = ptx_of(&strip(src), "-DTGPU_UNUSED=1");
            let off = ptx_of(src, "-DTGPU_ENABLED=0");
            let on = ptx_of(src, "-DTGPU_ENABLED=1");
            check_ptx(name, arch, 0, &off);
            check_ptx(name, arch, 2, &on);
            assert_eq!(off, stripped, "{name} {arch}");
            assert_ne!(on, stripped, "{name} {arch}: gate on");
        }
    }
}
