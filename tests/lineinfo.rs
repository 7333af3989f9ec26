//! Line info: kernels compile with `-lineinfo` by default, so ncu can map SASS to
//! the `.cu` source (`scripts/ncu.sh`), and `KernelBuild::lineinfo(false)` (the
//! `--no-lineinfo` of the CLI's live commands, the quickstart and the benchmarks) turns
//! it off.
//! Needs NVRTC (no GPU): with `TGPU_REQUIRE_TOOLS=1` its absence fails the test,
//! otherwise the test says it skipped.
#![cfg(feature = "cuda")]

use tracing_gpu::cuda::{compile, ensure_nvrtc, KernelBuild};

const SOURCE: &str = r#"
extern "C" __global__ void scale(float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        x[i] = a * x[i];
    }
}
"#;

fn nvrtc_or_skip() -> bool {
    match ensure_nvrtc() {
        Ok(()) => true,
        Err(e) if std::env::var_os("TGPU_REQUIRE_TOOLS").is_some_and(|v| v == "1") => {
            panic!("TGPU_REQUIRE_TOOLS=1 but NVRTC is missing: {e}")
        }
        Err(e) => {
            eprintln!("skipped: {e}");
            false
        }
    }
}

#[test]
fn ptx_carries_file_and_loc_by_default_and_not_when_turned_off() {
    if !nvrtc_or_skip() {
        return;
    }
    let on = KernelBuild::new("scale.cu", "sm_90");
    assert!(on.lineinfo, "line info must be on by default");
    let ptx = compile(SOURCE, &on).expect("compiles").to_src();
    // The file table names the program, and the body has locations into it:
    // `.loc <file> <line> <column>`, with the line of `x[i] = a * x[i];` (5).
    let file = ptx
        .lines()
        .find(|l| l.trim_start().starts_with(".file") && l.contains("scale.cu"))
        .unwrap_or_else(|| panic!("no .file entry for scale.cu in:\n{ptx}"));
    let index: u32 = file
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .expect(".file index");
    let locs: Vec<(u32, u32)> = ptx
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            (w.next()? == ".loc").then_some(())?;
            Some((w.next()?.parse().ok()?, w.next()?.parse().ok()?))
        })
        .collect();
    assert!(
        locs.iter().any(|&(f, line)| f == index && line == 5),
        "no .loc for line 5 in {locs:?}"
    );

    // Off: no location and no file table, whether set through the field or the builder.
    let off = KernelBuild::new("scale.cu", "sm_90").lineinfo(false);
    assert!(!off.lineinfo);
    for build in [
        off,
        KernelBuild {
            lineinfo: false,
            ..on
        },
    ] {
        let ptx = compile(SOURCE, &build).expect("compiles").to_src();
        for directive in [".loc", ".file"] {
            assert!(
                !ptx.lines().any(|l| l.trim_start().starts_with(directive)),
                "{directive} present with line info off:\n{ptx}"
            );
        }
        assert!(ptx.contains(".entry scale("), "no kernel in:\n{ptx}");
    }
}
