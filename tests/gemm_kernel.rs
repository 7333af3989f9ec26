//! The GEMM kernel (`kernels/gemm.cu`) on the CPU: it compiles under NVRTC for
//! sm_90a with the recorder gate off and on, its PTX carries line info, and the
//! machine code (ptxas + cuobjdump) holds the instructions the design relies on:
//! HGMMA (wgmma), UTMALDG (TMA loads), no local-memory spills, and exactly the PTX's
//! timer reads.
//!
//! Needs NVRTC, ptxas and cuobjdump (the PyPI CUDA wheels, `scripts/test-env.sh`); the
//! test skips with a reason when they are missing, or fails if TGPU_REQUIRE_TOOLS=1.
#![cfg(feature = "cuda")]

// Only the build recipes (`Variant::build`, `SOURCE`, `KERNEL`) are used here; the
// launch code is for the examples.
#[allow(dead_code)]
#[path = "../examples/common/gemm.rs"]
mod gemm;

use std::path::PathBuf;
use std::process::Command;

use gemm::{Out, Variant};

/// Returns the CUDA bin folder, or `None` (after printing why) if the test must skip.
fn tools() -> Option<PathBuf> {
    let required = std::env::var("TGPU_REQUIRE_TOOLS").is_ok_and(|v| v == "1");
    let missing = |why: String| {
        assert!(!required, "TGPU_REQUIRE_TOOLS=1 but {why}");
        println!("skipped: {why}");
        None
    };
    if let Err(e) = tracing_gpu::cuda::ensure_nvrtc() {
        return missing(format!("no NVRTC ({e})"));
    }
    let Ok(home) = std::env::var("TGPU_CUDA_HOME") else {
        return missing("TGPU_CUDA_HOME is not set (eval \"$(scripts/test-env.sh)\")".into());
    };
    let bin = PathBuf::from(home).join("bin");
    for tool in ["ptxas", "cuobjdump"] {
        if !bin.join(tool).is_file() {
            return missing(format!("{tool} is not in {}", bin.display()));
        }
    }
    Some(bin)
}

fn ptx(variant: Variant, out: Out) -> String {
    tracing_gpu::cuda::compile(gemm::SOURCE, &variant.build(out))
        .unwrap_or_else(|e| panic!("{}: {e}", variant.name()))
        .to_src()
}

/// Assembles `ptx` for sm_90a and returns the SASS text.
fn sass(bin: &std::path::Path, ptx: &str, name: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join(format!("{name}.ptx"));
    let cubin = dir.path().join(format!("{name}.cubin"));
    std::fs::write(&src, ptx).unwrap();
    let st = Command::new(bin.join("ptxas"))
        .args(["-arch=sm_90a", "-o"])
        .arg(&cubin)
        .arg(&src)
        .output()
        .unwrap();
    assert!(
        st.status.success(),
        "ptxas {name}: {}",
        String::from_utf8_lossy(&st.stderr)
    );
    let warnings = String::from_utf8_lossy(&st.stderr);
    // C7508: setmaxnreg ignored, which would starve the consumers of registers.
    assert!(
        !warnings.contains("C7508"),
        "ptxas {name} ignored setmaxnreg: {warnings}"
    );
    let dump = Command::new(bin.join("cuobjdump"))
        .arg("-sass")
        .arg(&cubin)
        .output()
        .unwrap();
    assert!(
        dump.status.success(),
        "cuobjdump {name}: {}",
        String::from_utf8_lossy(&dump.stderr)
    );
    String::from_utf8(dump.stdout).unwrap()
}

fn count(text: &str, needle: &str) -> usize {
    text.matches(needle).count()
}

/// The kernel's parameter list in the PTX, between `.entry NAME(` and `)`.
fn params(ptx: &str) -> usize {
    let start = ptx
        .find(&format!(".entry {}(", gemm::KERNEL))
        .expect("entry in PTX");
    let end = start + ptx[start..].find(')').unwrap();
    count(&ptx[start..end], ".param")
}

#[test]
fn gemm_compiles_with_line_info_and_tensor_core_code() {
    let Some(bin) = tools() else { return };
    let off = ptx(Variant::Off, Out::Bf16);
    for (variant, out) in [
        (Variant::Off, Out::Bf16),
        (Variant::Off, Out::F32),
        (Variant::Phases, Out::Bf16),
        (Variant::Full, Out::Bf16),
        (Variant::Seed, Out::Bf16),
        (Variant::FlashInfer, Out::Bf16),
    ] {
        let name = format!("{}-{:?}", variant.name(), out);
        let text = if (variant, out) == (Variant::Off, Out::Bf16) {
            off.clone()
        } else {
            ptx(variant, out)
        };
        // Line info: a file table entry and locations, so ncu can map SASS to gemm.cu.
        assert!(text.contains(".file"), "{name}: no .file in PTX");
        assert!(count(&text, ".loc") > 100, "{name}: too few .loc lines");
        assert!(
            text.contains("gemm.cu"),
            "{name}: line info does not name gemm.cu"
        );
        // The gate: the untraced kernel has the 6 production parameters and no timer;
        // a traced one takes the trace argument too and reads %globaltimer.
        if variant.traced() {
            assert_eq!(params(&text), 7, "{name}: parameters");
            assert!(text.contains("%globaltimer"), "{name}: no timer reads");
        } else {
            assert_eq!(params(&text), 6, "{name}: parameters");
            assert!(
                !text.contains("globaltimer"),
                "{name}: timer reads with the gate off"
            );
        }
        let sass = sass(&bin, &text, &name);
        // 4 wgmma m64n256k16 per k-tile (BK = 64), TMA loads of A and B.
        assert!(
            count(&sass, "HGMMA.64x256x16.F32.BF16") >= 4,
            "{name}: no HGMMA in SASS"
        );
        assert!(
            count(&sass, "UTMALDG.2D") >= 2,
            "{name}: no TMA loads in SASS"
        );
        assert_eq!(count(&sass, "HMMA"), 0, "{name}: fell back to mma.sync");
        assert_eq!(
            count(&sass, "STL"),
            0,
            "{name}: local-memory stores (spills)"
        );
        // Every timer read of the PTX, and no other: ptxas read no stamp again where its
        // value is used (rematerialized it), which would move a record's end.
        assert_eq!(
            count(&sass, "SR_GLOBALTIMER"),
            count(&text, "%globaltimer"),
            "{name}: timer reads in SASS and PTX"
        );
        println!(
            "{name}: {} PTX lines, {} SASS instructions, {} HGMMA",
            text.lines().count(),
            sass.lines()
                .filter(|l| l.trim_start().starts_with("/*") && l.contains(" ;"))
                .count(),
            count(&sass, "HGMMA")
        );
    }
}

/// With the gate off, the instrumented GEMM is the production GEMM: its PTX (line info
/// included) is identical to that of the source with every recorder line blanked and
/// the trace parameter removed.
#[test]
fn gate_off_gemm_is_the_uninstrumented_gemm() {
    if tools().is_none() {
        return;
    }
    let mut blanked = 0;
    let stripped: Vec<String> = gemm::SOURCE
        .lines()
        .map(|l| {
            if l.contains("rec.") || l.contains("GEMM_RECORDER_DECL(rec") {
                blanked += 1;
                String::new()
            } else {
                l.replace(" TGPU_TRACE_PARAM", "")
            }
        })
        .collect();
    assert!(
        blanked >= 12,
        "only {blanked} recorder lines found: the test would prove little"
    );
    let stripped = stripped.join("\n") + "\n";
    assert!(!stripped.contains("TGPU_TRACE_PARAM"));
    let build = Variant::Off.build(Out::Bf16);
    let compile = |src: &str| tracing_gpu::cuda::compile(src, &build).unwrap().to_src();
    let (a, b) = (compile(gemm::SOURCE), compile(&stripped));
    if let Some((i, (x, y))) = a
        .lines()
        .zip(b.lines())
        .enumerate()
        .find(|(_, (x, y))| x != y)
    {
        panic!(
            "gate-off PTX differs from the uninstrumented kernel's at line {}:\n  {x}\n  {y}",
            i + 1
        );
    }
    assert_eq!(
        a.lines().count(),
        b.lines().count(),
        "gate-off PTX differs in length"
    );
}
