//! Watch mode in the recorder header (`TGPU_WATCH=1`), under NVRTC with no GPU: it builds
//! for sm_80 and sm_90 and publishes each entry with one 16-byte store; with it off, the
//! PTX is the recorder's without any watch code (every `#if TGPU_WATCH` block of the
//! header deleted), so a kernel that does not ask for it gets exactly what it got before;
//! and it is refused where it cannot work (v1, streaming off).

mod cuda_tools;
#[cfg(feature = "cuda")]
mod nvrtc_tools;

const HEADER: &str = include_str!("../kernels/include/tracing_gpu.cuh");

/// The header with every `#if TGPU_WATCH` block deleted: the lines up to its `#else`
/// (whose other side stays) or `#endif`, nested blocks included.
fn without_watch(header: &str) -> String {
    let mut out = Vec::new();
    // For each open `#if`: whether it is a watch block, and whether its lines are dropped.
    let mut stack: Vec<(bool, bool)> = Vec::new();
    for line in header.lines() {
        let t = line.trim_start();
        let dropping = stack.iter().any(|&(_, drop)| drop);
        if t.starts_with("#if") {
            let watch = t == "#if TGPU_WATCH";
            stack.push((watch, watch));
            if watch || dropping {
                continue;
            }
        } else if t.starts_with("#else") || t.starts_with("#elif") {
            let top = stack.last_mut().expect("#else inside an #if");
            if top.0 {
                top.1 = false;
                continue;
            }
        } else if t.starts_with("#endif") {
            let (watch, _) = stack.pop().expect("#endif closes an #if");
            if watch || dropping {
                continue;
            }
        }
        if !dropping {
            out.push(line);
        }
    }
    assert!(stack.is_empty(), "unbalanced #if in the header");
    out.join("\n")
}

#[test]
fn the_watch_blocks_are_found_and_only_they_go() {
    let stripped = without_watch(HEADER);
    assert!(HEADER.contains("#if TGPU_WATCH"));
    for code in [
        "watch_stamp_if",
        "watch_start",
        "watch_at",
        "cell_",
        "depth_",
        "#if TGPU_WATCH",
    ] {
        assert!(!stripped.contains(code), "{code} is left");
    }
    // The recorder's own stamp and staging stay.
    for kept in [
        "detail::stamp_if<Word>(turn_, time_, word_);",
        "@q mov.u32 %1, %7;",
        "#define TGPU_STREAM 0",
        "class Recorder",
    ] {
        assert!(stripped.contains(kept), "{kept} was deleted");
    }
    let blocks = HEADER.matches("#if TGPU_WATCH").count();
    assert!(blocks >= 6, "only {blocks} watch blocks");
}

#[cfg(feature = "cuda")]
mod nvrtc {
    use super::*;
    use crate::nvrtc_tools::available;
    use tracing_gpu::cuda::{compile, CudaError, KernelBuild};

    const KERNELS: [(&str, &str); 4] = [
        ("phases", include_str!("../kernels/examples/phases.cu")),
        ("deadlock", include_str!("../kernels/examples/deadlock.cu")),
        (
            "warp_specialized",
            include_str!("../kernels/examples/warp_specialized.cu"),
        ),
        (
            "persistent",
            include_str!("../kernels/examples/persistent.cu"),
        ),
    ];

    /// The PTX of `src` with `header` as its tracing_gpu.cuh (a build's own headers come
    /// after the embedded one on the include path, so the kernel includes it by another
    /// path; no line info, which would name that path).
    fn ptx(name: &str, arch: &'static str, src: &str, header: &str, defines: &[&str]) -> String {
        let src = src.replace(
            "#include \"tracing_gpu.cuh\"",
            "#include \"under_test/tracing_gpu.cuh\"",
        );
        let build = defines.iter().fold(
            KernelBuild::new(name, arch)
                .header("under_test/tracing_gpu.cuh", header)
                .lineinfo(false),
            |b, d| b.define(*d),
        );
        compile(&src, &build)
            .unwrap_or_else(|e| panic!("{name} {arch} {defines:?}: {e}"))
            .to_src()
    }

    #[test]
    fn watch_off_is_the_recorder_without_watch_code() {
        if !available() {
            return;
        }
        let before = without_watch(HEADER);
        for (name, src) in KERNELS {
            for arch in ["sm_80", "sm_90"] {
                for defines in [
                    &["TGPU_ENABLED=1"][..],
                    &["TGPU_ENABLED=1", "TGPU_STREAM=1"],
                    &["TGPU_ENABLED=1", "TGPU_STREAM=1", "TGPU_WATCH=0"],
                    &["TGPU_ENABLED=1", "TGPU_FORMAT=1"],
                    &[],
                ] {
                    assert_eq!(
                        ptx(name, arch, src, HEADER, defines),
                        ptx(name, arch, src, &before, defines),
                        "{name} {arch} {defines:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn watch_mode_publishes_each_entry() {
        if !available() {
            return;
        }
        for (name, src) in KERNELS {
            for arch in ["sm_80", "sm_90"] {
                let watch = ptx(name, arch, src, HEADER, &["TGPU_ENABLED=1", "TGPU_WATCH=1"]);
                let stream = ptx(
                    name,
                    arch,
                    src,
                    HEADER,
                    &["TGPU_ENABLED=1", "TGPU_STREAM=1"],
                );
                // TGPU_WATCH=1 is a streaming build (it implies TGPU_STREAM=1).
                assert!(watch.contains("ld.volatile.global.u32"), "{name} {arch}");
                // The watch record: one v4 store per call site, predicated, with the
                // 64-bit timer read beside it; streaming alone has neither.
                let calls = src
                    .lines()
                    .filter(|l| l.trim_start().starts_with("rec."))
                    .count();
                let stores = watch.matches("st.global.v4.u32 [a]").count();
                assert!(
                    stores >= calls,
                    "{name} {arch}: {stores} watch stores for {calls} calls"
                );
                assert!(!stream.contains("st.global.v4.u32 [a]"), "{name} {arch}");
                assert!(watch.contains("mov.u64 t, %globaltimer;"), "{name} {arch}");
                assert_ne!(watch, stream, "{name} {arch}");
                // The head, written at the start and at the flush: "WTCH" and "WEND".
                for magic in [0x4843_5457u32, 0x444E_4557] {
                    assert!(
                        watch.contains(&magic.to_string()),
                        "{name} {arch}: {magic:#x}"
                    );
                }
            }
        }
        // With the gate off, TGPU_WATCH changes nothing.
        let (name, src) = KERNELS[0];
        assert_eq!(
            ptx(name, "sm_90", src, HEADER, &["TGPU_WATCH=1"]),
            ptx(name, "sm_90", src, HEADER, &[])
        );
    }

    #[test]
    fn watch_mode_is_refused_where_it_cannot_work() {
        if !available() {
            return;
        }
        let (name, src) = KERNELS[0];
        for (defines, message) in [
            (
                &["TGPU_ENABLED=1", "TGPU_WATCH=1", "TGPU_STREAM=0"][..],
                "TGPU_WATCH=1 needs TGPU_STREAM=1",
            ),
            (
                &["TGPU_ENABLED=1", "TGPU_WATCH=1", "TGPU_FORMAT=1"],
                "TGPU_WATCH=1 needs the v2 recorder",
            ),
        ] {
            let build = defines
                .iter()
                .fold(KernelBuild::new(name, "sm_90"), |b, d| b.define(*d));
            match compile(src, &build) {
                Err(CudaError::Compile { message: log, .. }) => {
                    assert!(log.contains(message), "{defines:?}: {log}")
                }
                other => panic!("{defines:?}: compiled: {}", other.is_ok()),
            }
        }
    }
}
