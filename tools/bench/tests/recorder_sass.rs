//! What the recorder costs in SASS: the benchmark kernel (`tools/bench/kernels/recorder_bench.cu`)
//! assembled by the wheel's ptxas for sm_90 in each of its builds, disassembled with
//! cuobjdump, and the instructions of its event loop counted, gate on against gate off.
//! Each range is 64 dependent FMAs between its two stamps, so the loop body's FMA count
//! says how many ranges one pass holds. Printed (run with `--nocapture`) and bounded.
//!
//! The stall figure is ptxas's own schedule: the stall counts it encodes in each
//! instruction's control bits, summed over the loop body: a static estimate of the cycles
//! one warp alone on its scheduler spends per pass (variable-latency waits excluded).

#[path = "../../../tests/cuda_tools/mod.rs"]
mod cuda_tools;

use std::path::Path;
use std::process::Command;

use cuda_tools::{nvcc, run, skip, source, tool};

/// One SASS instruction: its text and the stall cycles ptxas scheduled after it.
struct Instr {
    addr: u64,
    text: String,
    stall: u32,
}

/// Parses `cuobjdump -sass`: each instruction line `/*addr*/ TEXT ; /* 0xlo */` is followed
/// by a line `/* 0xhi */`; on sm_70 and later the stall count is bits 41..45 of `hi`.
fn disassemble(cuobjdump: &Path, cubin: &Path) -> Vec<Instr> {
    let out = run(Command::new(cuobjdump).arg("-sass").arg(cubin));
    let lines: Vec<&str> = out.lines().collect();
    let mut instrs = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let t = line.trim_start();
        let Some(rest) = t.strip_prefix("/*") else {
            continue;
        };
        let Some((addr, rest)) = rest.split_once("*/") else {
            continue;
        };
        let Ok(addr) = u64::from_str_radix(addr, 16) else {
            continue;
        };
        let Some((text, _)) = rest.split_once(';') else {
            continue;
        };
        let hi = lines
            .get(i + 1)
            .and_then(|l| l.trim().strip_prefix("/* 0x"))
            .and_then(|l| l.strip_suffix(" */"))
            .and_then(|h| u64::from_str_radix(h, 16).ok())
            .unwrap_or_else(|| panic!("no control word after {line}"));
        instrs.push(Instr {
            addr,
            text: text.trim().to_string(),
            stall: ((hi >> 41) & 0xf) as u32,
        });
    }
    assert!(
        !instrs.is_empty(),
        "cuobjdump printed no instructions:\n{out}"
    );
    instrs
}

/// The event loop: the body of the backward branch holding the most FMAs.
fn loop_body(instrs: &[Instr]) -> &[Instr] {
    let mut best: Option<&[Instr]> = None;
    for (end, ins) in instrs.iter().enumerate() {
        let Some(target) = ins.text.split("BRA 0x").nth(1) else {
            continue;
        };
        let target = u64::from_str_radix(target.trim(), 16).unwrap();
        if target >= ins.addr {
            continue;
        }
        let start = instrs.iter().position(|x| x.addr == target).unwrap();
        let body = &instrs[start..=end];
        if best.is_none_or(|b| fmas(body) > fmas(b)) {
            best = Some(body);
        }
    }
    best.expect("no loop in the kernel")
}

fn fmas(body: &[Instr]) -> usize {
    body.iter()
        .filter(|i| i.text.starts_with("FFMA ") || i.text.contains(" FFMA "))
        .count()
}

struct Loop {
    instrs: usize,
    stalls: u32,
    ranges: usize,
    /// Timer reads (`S2UR`/`CS2R` of `SR_GLOBALTIMER*`) in the body.
    timer_reads: usize,
}

fn measure(nvcc_path: &Path, cuobjdump: &Path, dir: &Path, defines: &[&str], unroll: u32) -> Loop {
    let src = source("kernels/recorder_bench.cu");
    let unroll_flag = format!("-DTGPU_BENCH_UNROLL={unroll}");
    // The seed build includes baselines.cuh from the bench's folder.
    let bench_dir = format!("-I{}/kernels", env!("CARGO_MANIFEST_DIR"));
    let mut args = vec![
        "-arch=sm_90",
        "-cubin",
        unroll_flag.as_str(),
        bench_dir.as_str(),
    ];
    args.extend_from_slice(defines);
    let cubin = nvcc(nvcc_path, dir, "recorder_bench", &src, &args, "bench.cubin");
    let instrs = disassemble(cuobjdump, &cubin);
    let body = loop_body(&instrs);
    let f = fmas(body);
    assert_eq!(f % 64, 0, "{defines:?}: {f} FMAs in the loop");
    Loop {
        instrs: body.len(),
        stalls: body.iter().map(|i| i.stall).sum(),
        ranges: f / 64,
        timer_reads: body
            .iter()
            .filter(|i| i.text.contains("SR_GLOBALTIMER"))
            .count(),
    }
}

#[test]
fn recorder_sass_per_range_event() {
    let (Some(nvcc_path), Some(cuobjdump)) = (tool("nvcc"), tool("cuobjdump")) else {
        skip("nvcc or cuobjdump from the CUDA wheels not found under $TGPU_CUDA_HOME/bin");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // (name, defines, timer reads per range as written)
    let variants: [(&str, &[&str], usize); 6] = [
        ("off", &[], 0),
        ("floor: 2 bare timer reads", &["-DTGPU_BENCH_FLOOR=1"], 2),
        ("bound: stamps + store", &["-DTGPU_BENCH_BOUND=1"], 2),
        ("ours: begin/end", &["-DTGPU_ENABLED=1"], 2),
        (
            "ours: switch_to",
            &["-DTGPU_ENABLED=1", "-DTGPU_BENCH_SWITCH=1"],
            1,
        ),
        ("seed-style", &["-DTGPU_BENCH_SEED=1"], 2),
    ];
    println!("SASS per range event, sm_90, event loop of tools/bench/kernels/recorder_bench.cu:");
    println!(
        "{:<28} {:>6} {:>14} {:>18}",
        "build", "unroll", "instr/range", "stall cyc/range"
    );
    for unroll in [1, 4] {
        let off = measure(&nvcc_path, &cuobjdump, dir.path(), &[], unroll);
        assert_eq!(
            off.ranges, unroll as usize,
            "the gated-off loop holds one range per unrolled pass"
        );
        // Without the recorder, the loop is its FMAs and the loop control.
        assert!(
            off.instrs <= off.ranges * 64 + 4,
            "off: {} instructions",
            off.instrs
        );
        let mut per_range = Vec::new();
        for (name, defines, reads) in variants {
            let l = measure(&nvcc_path, &cuobjdump, dir.path(), defines, unroll);
            assert_eq!(
                l.ranges, off.ranges,
                "{name}: another loop shape than the gated-off one"
            );
            // As many timer reads as the source has stamps: ptxas read none of them
            // again (rematerialized) nor dropped one.
            assert_eq!(
                l.timer_reads,
                reads * l.ranges,
                "{name}, unroll {unroll}: timer reads in the loop"
            );
            let instrs = (l.instrs as f64 - off.instrs as f64) / l.ranges as f64;
            let stalls = (l.stalls as f64 - off.stalls as f64) / l.ranges as f64;
            println!("{name:<28} {unroll:>6} {instrs:>14.2} {stalls:>18.2}");
            per_range.push(instrs);
        }
        let [_, floor, bound, ours, switch, seed] = per_range[..] else {
            unreachable!()
        };
        // The bounds this design meets; a change that adds instructions per event fails here.
        assert!(
            ours <= 12.0,
            "ours: {ours} instructions per range (bound 12)"
        );
        assert!(
            switch <= 12.0,
            "switch_to: {switch} instructions per range (bound 12)"
        );
        assert!(
            floor <= bound && bound <= ours,
            "floor {floor}, bound {bound}, ours {ours}: the yardsticks no longer bracket ours"
        );
        assert!(
            seed >= 2.0 * ours,
            "seed-style {seed} vs ours {ours}: the comparison kernel changed"
        );
    }
}
