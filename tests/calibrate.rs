//! The clock calibration kernels under real compilers (NVRTC and the wheel's
//! ptxas, no GPU needed), and a calibration on a real GPU where there is one.
#![cfg(feature = "cuda")]

mod cuda_tools;

use cuda_tools::{run, skip, tool};
use tracing_gpu::cuda::calibrate::{CALIBRATE_SOURCE, LANES};
use tracing_gpu::cuda::{compile, ensure_nvrtc, KernelBuild};

fn ptx(arch: &'static str) -> Option<String> {
    if let Err(e) = ensure_nvrtc() {
        skip(&format!("NVRTC is not available: {e}"));
        return None;
    }
    let build = KernelBuild::new("calibrate.cu", arch);
    Some(
        compile(CALIBRATE_SOURCE, &build)
            .unwrap_or_else(|e| panic!("{arch}: {e}"))
            .to_src(),
    )
}

/// The body of one `.entry` in PTX.
fn entry<'a>(ptx: &'a str, name: &str) -> &'a str {
    let start = ptx
        .find(&format!(".entry {name}("))
        .unwrap_or_else(|| panic!("no entry {name}"));
    let rest = &ptx[start..];
    let end = rest[1..].find(".entry ").map_or(rest.len(), |e| e + 1);
    &rest[..end]
}

#[test]
fn kernels_compile_and_poll_right_after_reading_the_timer() {
    // (kernel, timer reads, claims rounds through a global atomic)
    let kernels = [
        ("tgpu_calibrate", 2, false),
        ("tgpu_calibrate_pollers", 4, true),
    ];
    for arch in ["compute_75", "sm_90"] {
        let Some(ptx) = ptx(arch) else { return };
        for (name, reads, claims) in kernels {
            let cal = entry(&ptx, name);
            // The stale-poll bound needs the timer read right before the poll's
            // load is issued: the instruction before the volatile load reads the timer.
            let instructions: Vec<&str> = cal
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with("//") && !l.starts_with(".loc"))
                .collect();
            let load = instructions
                .iter()
                .position(|l| l.starts_with("ld.volatile.global.u64"))
                .expect("the poll is a volatile load");
            assert!(
                instructions[load - 1].contains("%globaltimer"),
                "{arch} {name}: no timer read right before the poll:\n{cal}"
            );
            // Poll and answer (and, with pollers, start and stagger).
            assert_eq!(
                cal.matches("%globaltimer").count(),
                reads,
                "{arch} {name}:\n{cal}"
            );
            assert_eq!(
                cal.contains("atom.global.max.u64"),
                claims,
                "{arch} {name}:\n{cal}"
            );
            // No shared memory: such a kernel does not start beside a long kernel
            // that fills every SM without any (kernels/calibrate.cu).
            assert!(!cal.contains(".shared"), "{arch} {name}:\n{cal}");
            // Answers are volatile stores (each a posted PCIe write).
            assert_eq!(
                cal.matches("st.volatile.global.u64").count(),
                2,
                "{arch} {name}:\n{cal}"
            );
        }
        assert!(entry(&ptx, "tgpu_timer_step").contains("%globaltimer"));
        // One claim word per lane slot of the calibrator.
        let words = ptx
            .lines()
            .find_map(|l| {
                let l = l.trim();
                l.strip_prefix(".global .align 8 .b8 tgpu_cal_answered[")?
                    .strip_suffix("];")?
                    .parse::<usize>()
                    .ok()
            })
            .unwrap_or_else(|| panic!("{arch}: no tgpu_cal_answered in:\n{ptx}"))
            / 8;
        assert!(
            words >= LANES,
            "{arch}: {words} claim words for {LANES} lanes"
        );
        assert!(!ptx.contains(".shared"), "{arch}: shared memory in\n{ptx}");
    }
}

#[test]
fn kernels_assemble_for_sm90_under_the_wheels_ptxas() {
    let Some(ptxas) = tool("ptxas") else {
        skip("ptxas from the CUDA wheels not found ($TGPU_CUDA_HOME/bin/ptxas)");
        return;
    };
    let Some(ptx) = ptx("sm_90") else { return };
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("calibrate.ptx");
    std::fs::write(&src, ptx).unwrap();
    let out = dir.path().join("calibrate.cubin");
    run(std::process::Command::new(ptxas)
        .arg("-arch=sm_90")
        .arg("-Werror")
        .arg(&src)
        .arg("-o")
        .arg(&out));
    assert!(std::fs::metadata(&out).unwrap().len() > 0);
}

/// On a GPU: a calibration with sane samples and a bound of microseconds.
#[test]
fn calibrates_a_real_gpu() {
    use tracing_gpu::clock::{Calibration, HostClock};
    use tracing_gpu::cuda::calibrate::Calibrator;
    use tracing_gpu::cuda::cudarc::driver::CudaContext;

    if tracing_gpu::cuda::ensure_libraries().is_err() {
        eprintln!("skipped: no GPU");
        return;
    }
    let Ok(ctx) = CudaContext::new(0) else {
        eprintln!("skipped: no GPU");
        return;
    };
    let mut cal = Calibrator::new(&ctx).expect("calibrator");
    assert!(
        cal.timer_step_ns() > 0 && cal.timer_step_ns() <= 1000,
        "step {}",
        cal.timer_step_ns()
    );
    let samples = cal.sample(300).expect("samples");
    let two: Vec<_> = samples.iter().filter(|s| s.is_two_sided()).collect();
    assert_eq!(two.len(), 300);
    assert!(two.iter().all(|s| s.host_before < s.host_after));
    assert!(two
        .windows(2)
        .all(|w| w[0].device < w[1].device && w[0].host_after <= w[1].host_before));
    let first = cal.checkpoint(&samples).expect("fit");
    assert!(
        first.map.bound_ns() < 20_000,
        "bound {} ns",
        first.map.bound_ns()
    );
    let mut calibration = Calibration::new(first);
    calibration
        .push(
            cal.calibrate(Calibrator::PERIODIC_ROUNDS)
                .expect("recalibration"),
        )
        .expect("later");
    // A device time read now maps to about now.
    let now_dev = cal.sample(1).expect("one round")[0];
    let mapped = calibration.to_host(HostClock::Boottime, now_dev.device);
    let slack = calibration.bound_ns(now_dev.device);
    assert!(
        mapped + slack >= now_dev.host_before && mapped <= now_dev.host_after + slack,
        "{now_dev:?} mapped to {mapped} ± {slack}"
    );
}
