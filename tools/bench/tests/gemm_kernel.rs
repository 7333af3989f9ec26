//! The GEMM kernel (`tools/bench/kernels/gemm.cu`) on the CPU: it compiles under NVRTC for
//! sm_90a with the recorder gate off and on, its PTX carries line info, and the
//! machine code (ptxas + cuobjdump) holds the instructions the design relies on:
//! HGMMA (wgmma), UTMALDG (TMA loads), no local-memory spills, and exactly the PTX's
//! timer reads.
//!
//! Needs NVRTC, ptxas and cuobjdump (the PyPI CUDA wheels, `scripts/test-env.sh`); the
//! test skips with a reason when they are missing, or fails if TGPU_REQUIRE_TOOLS=1.

use std::path::PathBuf;
use std::process::Command;

use tracing_gpu_bench::gemm::{self, Out, Variant};

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

/// Assembles `ptx` for sm_90a: the SASS text, and ptxas's `-v` report.
fn sass(bin: &std::path::Path, ptx: &str, name: &str) -> (String, String) {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join(format!("{name}.ptx"));
    let cubin = dir.path().join(format!("{name}.cubin"));
    std::fs::write(&src, ptx).unwrap();
    let st = Command::new(bin.join("ptxas"))
        .args(["-arch=sm_90a", "-v", "-o"])
        .arg(&cubin)
        .arg(&src)
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&st.stderr).into_owned();
    assert!(st.status.success(), "ptxas {name}: {log}");
    // C7508: setmaxnreg ignored, which would starve the consumers of registers.
    assert!(
        !log.contains("C7508"),
        "ptxas {name} ignored setmaxnreg: {log}"
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
    (String::from_utf8(dump.stdout).unwrap(), log)
}

/// Timer reads in SASS text: (32-bit, 64-bit). A 64-bit read is a `CS2R` of the register
/// pair (no `.32`); a 32-bit one a `CS2R.32` or an `S2UR`/`S2R`.
fn timer_reads_by_width(sass: &str) -> (usize, usize) {
    let reads: Vec<&str> = sass
        .lines()
        .filter(|l| l.contains("SR_GLOBALTIMER"))
        .collect();
    let wide = reads
        .iter()
        .filter(|l| l.contains("CS2R ") && !l.contains("CS2R.32"))
        .count();
    (reads.len() - wide, wide)
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
        (Variant::PhasesKept, Out::Bf16),
        (Variant::PhasesWg, Out::Bf16),
        (Variant::PhasesV1, Out::Bf16),
        (Variant::PhasesWgV1, Out::Bf16),
        (Variant::Full, Out::Bf16),
        (Variant::Seed, Out::Bf16),
        (Variant::FlashInfer, Out::Bf16),
        (Variant::Stamps, Out::Bf16),
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
        let (sass, _) = sass(&bin, &text, &name);
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
        // Every 32-bit timer read (the stamps) of the PTX, and no other: ptxas read no
        // stamp again where its value is used (rematerialized it), which would move a
        // record's end. Of the 64-bit reads (a recorder's start, its flush) ptxas may drop
        // one whose value nothing uses (a silent warp's), but adds none.
        let (reads32, reads64) = timer_reads_by_width(&sass);
        assert_eq!(
            reads32,
            count(&text, "%globaltimer_lo"),
            "{name}: 32-bit timer reads in SASS and PTX"
        );
        assert!(
            reads64 <= count(&text, "%globaltimer;"),
            "{name}: {reads64} 64-bit timer reads in SASS, {} in PTX",
            count(&text, "%globaltimer;")
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

/// The benchmarks' check that a warp's phases tile time exactly, on made-up traces: the
/// consumer's pattern (wait, mma per k-tile, then the epilogue; a release instant and a
/// tile range around them, as in the full build) passes; an end stamp that moved, as a
/// rematerialized timer read moves it, fails; a gap after an epilogue is allowed.
#[test]
fn phases_must_follow_each_other_without_gaps() {
    use tracing_gpu::decode::Buffer;
    use tracing_gpu::format::BufferBuilder;
    let id = |name: &str| gemm::EVENTS.iter().find(|e| e.1 == name).unwrap().0;
    let (wait, mma, epilogue, tile, release) = (
        id("wait"),
        id("mma"),
        id("epilogue"),
        id("tile"),
        id("release"),
    );
    // Two tiles of two k-tiles each, 100 ns per phase, 50 ns between the tiles; `shift`
    // moves the end of the second tile's first wait.
    let trace = |shift: u64| {
        let mut b = BufferBuilder::new([1, 1, 1], [32, 1, 1], 32);
        let w = b.warp(0, 0).unwrap();
        let mut t = 1_000;
        for tile_index in 0..2u32 {
            let tile_start = t;
            for kt in 0..2u32 {
                let moved = if tile_index == 1 && kt == 0 { shift } else { 0 };
                w.range(wait, t, t + 100 + moved, kt);
                if kt > 0 {
                    w.instant(release, t + 150, kt - 1);
                }
                w.range(mma, t + 100, t + 200, kt);
                t += 200;
            }
            w.range(epilogue, t, t + 100, tile_index);
            w.range(tile, tile_start, t + 100, tile_index);
            t += 150;
        }
        b.finish()
    };
    let good = trace(0);
    gemm::check_contiguous(&Buffer::decode(&good, None).unwrap()).expect("contiguous phases");
    let bad = trace(30);
    let err = gemm::check_contiguous(&Buffer::decode(&bad, None).unwrap())
        .expect_err("a moved end must fail");
    assert!(err.to_string().contains("starts -30 ns after"), "{err}");
}

/// One SASS instruction: its address and text.
struct Instr {
    addr: u64,
    text: String,
}

/// The instructions of `cuobjdump -sass` output (`/*addr*/ TEXT ;` lines).
fn instructions(sass: &str) -> Vec<Instr> {
    sass.lines()
        .filter_map(|l| {
            let rest = l.trim_start().strip_prefix("/*")?;
            let (addr, rest) = rest.split_once("*/")?;
            let addr = u64::from_str_radix(addr, 16).ok()?;
            let (text, _) = rest.split_once(';')?;
            Some(Instr {
                addr,
                text: text.trim().to_string(),
            })
        })
        .collect()
}

/// The bodies of the innermost loops (from a backward branch's target to the branch)
/// that hold `n` instructions containing `needle`: the k-loops, told apart by their 4
/// HGMMA (consumer) or 2 TMA loads (producer). Branches after the last EXIT are left
/// out: they return from the out-of-line retries of barrier waits into the middle of a
/// loop, and are no loop of the source.
fn k_loops<'a>(ins: &'a [Instr], needle: &str, n: usize) -> Vec<&'a [Instr]> {
    let holding = |body: &[Instr]| body.iter().filter(|i| i.text.contains(needle)).count();
    let last_exit = ins
        .iter()
        .rposition(|i| i.text.ends_with("EXIT"))
        .expect("an EXIT");
    let mut loops: Vec<(usize, usize)> = Vec::new();
    for (end, i) in ins[..last_exit].iter().enumerate() {
        let Some(target) = i.text.split("BRA 0x").nth(1) else {
            continue;
        };
        let Ok(target) = u64::from_str_radix(target.trim(), 16) else {
            continue;
        };
        if target > i.addr {
            continue;
        }
        let start = ins.iter().position(|x| x.addr == target).unwrap();
        if holding(&ins[start..=end]) == n {
            loops.push((start, end));
        }
    }
    let inner = |&(s, e): &(usize, usize)| {
        !loops
            .iter()
            .any(|&(s2, e2)| (s2, e2) != (s, e) && s <= s2 && e2 <= e)
    };
    loops
        .iter()
        .filter(|l| inner(l))
        .map(|&(s, e)| &ins[s..=e])
        .collect()
}

/// The highest general register (`Rn`) an instruction of `body` names, plus one. (An
/// HGMMA names only the first of its 128 accumulators; the epilogue names them all.)
fn registers(body: &[Instr]) -> u32 {
    body.iter()
        .flat_map(|i| {
            i.text
                .split(|c: char| !c.is_ascii_alphanumeric())
                .filter_map(|w| w.strip_prefix('R')?.parse::<u32>().ok())
        })
        .max()
        .map_or(0, |r| r + 1)
}

fn timer_reads(body: &[Instr]) -> usize {
    body.iter()
        .filter(|i| i.text.contains("SR_GLOBALTIMER"))
        .count()
}

/// The 32-bit timer reads: the stamps (v2's anchor at a group store is a 64-bit read).
fn stamps(body: &[Instr]) -> usize {
    body.iter()
        .filter(|i| i.text.contains("SR_GLOBALTIMER") && i.text.contains(".32 "))
        .count()
}

/// What the phases cost in the k-loops' machine code, per k-tile and warp: off, phases
/// (every consumer warp records) and phases-wg (one warp per consumer warpgroup: a
/// recording and a silent copy of the consumer loop), with recorder v1 and v2 (whose
/// loops also hold the group stores, which run once per 32 entries of a call site,
/// behind a branch: counted in the length, not in what a pass issues). Printed with `--nocapture`:
/// instructions per k-tile (each loop body is straight-line code but for the branches
/// of its barrier wait and exit, so its length is what one pass issues), the difference
/// from off, its timer reads and stores, and the registers: ptxas's report and the
/// highest the code names.
#[test]
fn gemm_k_loop_sass_per_variant() {
    let Some(bin) = tools() else { return };
    println!(
        "GEMM k-loops, sm_90a, NVRTC PTX + the wheel's ptxas; instructions per k-tile per warp:"
    );
    println!(
        "{:<10} {:<22} {:>7} {:>8} {:>6} {:>4}",
        "build", "loop", "instr", "vs off", "stamps", "STG"
    );
    let mut off = (0usize, 0usize); // (consumer, producer) loop lengths of the off build
    let variants = [
        Variant::Off,
        Variant::PhasesV1,
        Variant::PhasesWgV1,
        Variant::Phases,
        Variant::PhasesWg,
    ];
    for variant in variants {
        let name = variant.name();
        let v2 = matches!(variant, Variant::Phases | Variant::PhasesWg);
        let (text, log) = sass(&bin, &ptx(variant, Out::Bf16), name);
        let ins = instructions(&text);
        let consumer = k_loops(&ins, "HGMMA", 4);
        let producer = k_loops(&ins, "UTMALDG", 2);
        assert_eq!(producer.len(), 1, "{name}: producer k-loops");
        let one_warp = matches!(variant, Variant::PhasesWg | Variant::PhasesWgV1);
        let copies = if one_warp { 2 } else { 1 };
        assert_eq!(consumer.len(), copies, "{name}: consumer k-loops");
        if variant == Variant::Off {
            off = (consumer[0].len(), producer[0].len());
        }
        let mut rows: Vec<(&str, &[Instr], usize)> = Vec::new();
        for body in &consumer {
            let recording = timer_reads(body) > 0;
            let what = match (one_warp, recording) {
                (true, true) => "consumer, recording",
                (true, false) => "consumer, silent",
                _ => "consumer",
            };
            rows.push((what, body, off.0));
        }
        rows.push(("producer", producer[0], off.1));
        for (what, body, base) in rows {
            println!(
                "{name:<10} {what:<22} {:>7} {:>+8} {:>6} {:>4}",
                body.len(),
                body.len() as i64 - base as i64,
                timer_reads(body),
                body.iter().filter(|i| i.text.contains("STG")).count(),
            );
        }
        let used = log
            .lines()
            .find_map(|l| l.split("Used ").nth(1))
            .and_then(|l| l.split_whitespace().next())
            .unwrap_or("?");
        println!(
            "{name:<10} registers: ptxas {used} per thread at launch ({}); the code names \
             R0-R{} (the consumers', after setmaxnreg.inc 232), the producer's k-loop R0-R{} \
             (after setmaxnreg.dec 40)",
            if log.contains(" 0 bytes spill stores, 0 bytes spill loads") {
                "no spills"
            } else {
                "SPILLS"
            },
            registers(&ins) - 1,
            registers(producer[0]) - 1
        );
        // The shape the design relies on. A recording consumer loop stamps twice per
        // k-tile (wait->mma, mma->wait) and stores the two records; a silent one and
        // the off build's stamp nothing; the producer stamps once (load->load).
        for body in &consumer {
            let (reads, stores) = (
                timer_reads(body),
                body.iter().filter(|i| i.text.contains("STG")).count(),
            );
            // v2: the two stamps; the other reads (64-bit: the anchors) and the stores
            // are its call sites' group stores.
            match (variant, reads) {
                (Variant::Off, _) => assert_eq!(reads, 0, "{name}"),
                (_, 0) if one_warp => assert_eq!(stores, 0, "{name}: silent copy stores"),
                _ if v2 => assert_eq!(stamps(body), 2, "{name}: stamps"),
                _ => assert_eq!((reads, stores), (2, 2), "{name}"),
            }
        }
        let expected_producer_stamps = usize::from(variant != Variant::Off);
        assert_eq!(
            stamps(producer[0]).max(usize::from(!v2) * timer_reads(producer[0])),
            expected_producer_stamps,
            "{name}: producer stamps"
        );
        // setmaxnreg.dec 40 leaves the producer 40 registers.
        assert!(
            registers(producer[0]) <= 40,
            "{name}: the producer loop names R{}",
            registers(producer[0]) - 1
        );
        assert!(log.contains("0 bytes spill stores"), "{name}: {log}");
    }
}

/// Line info off: the GEMM's PTX has no `.file` or `.loc`, and its machine code is the
/// same instruction for instruction as with line info on (it only maps code to source).
#[test]
fn gemm_without_line_info_is_the_same_machine_code() {
    let Some(bin) = tools() else { return };
    for variant in [Variant::Phases, Variant::PhasesWg] {
        let name = variant.name();
        let build = variant.build(Out::Bf16);
        assert!(build.lineinfo, "{name}: line info is on by default");
        let off = tracing_gpu::cuda::compile(gemm::SOURCE, &build.clone().lineinfo(false))
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .to_src();
        for directive in [".loc", ".file"] {
            assert!(
                !off.lines().any(|l| l.trim_start().starts_with(directive)),
                "{name}: {directive} with line info off"
            );
        }
        let code = |ptx: &str, tag: &str| -> Vec<String> {
            instructions(&sass(&bin, ptx, &format!("{name}-{tag}")).0)
                .into_iter()
                .map(|i| i.text)
                .collect()
        };
        assert_eq!(
            code(&ptx(variant, Out::Bf16), "on"),
            code(&off, "off"),
            "{name}: line info changed the machine code"
        );
    }
}
