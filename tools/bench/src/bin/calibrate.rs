//! Calibrates every GPU's `%globaltimer` against the host clock and prints the
//! offset, drift and error bound of each; optionally measures what calibration
//! costs, compares the host clocks, and follows the drift for a while.
//!
//! ```text
//! cargo run --release -p tracing-gpu-bench --bin calibrate -- \
//!     [--rounds 2000] [--costs] [--pollers 1,2,4,8] [--clocks R] [--seconds T --every K] \
//!     [--out results.json] [--raw samples.csv] [--refit samples.csv]
//! ```
//!
//! - `--costs`: time `sample(n)` and the fit for several `n`.
//! - `--pollers 1,2,4,8`: R (`--clocks`, at least 3) BOOTTIME bursts for each
//!   count of GPU pollers, interleaved: round trips and bounds of each.
//! - `--clocks R`: R bursts per host clock (REALTIME, MONOTONIC, MONOTONIC_RAW,
//!   BOOTTIME), interleaved: round trips, bounds and fit residuals of each.
//! - `--seconds T --every K`: a first calibration, then a cheap one every K
//!   seconds for T seconds: offset and drift over time, and a leave-one-out
//!   check of the interpolation between checkpoints.
//! - `--out`: every figure as JSON; `--raw`: the raw samples of some bursts as CSV.
//! - `--refit samples.csv` (no GPU): fits the bursts of a `--raw` file again
//!   with variants of the fit (one-sided samples or not, tolerated outliers).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use tracing_gpu::clock::{Calibration, Checkpoint, ClockMap, HostClock, Sample};
use tracing_gpu::cuda::calibrate::Calibrator;
use tracing_gpu::cuda::cudarc::driver::CudaContext;
use tracing_gpu_bench::cli;
use tracing_gpu_bench::stats::upper_median as median;

/// Calibrates every GPU's clock against the host's and prints offset, drift and bound.
#[derive(Parser, Debug)]
#[command(name = "calibrate")]
struct Args {
    /// Rounds of the first calibration (and of each burst).
    #[arg(long, default_value_t = Calibrator::INITIAL_ROUNDS)]
    rounds: usize,
    /// Time `sample(n)` and the fit for several n.
    #[arg(long)]
    costs: bool,
    /// R bursts per host clock (REALTIME, MONOTONIC, MONOTONIC_RAW, BOOTTIME), interleaved.
    #[arg(long, value_name = "R", default_value_t = 0)]
    clocks: usize,
    /// BOOTTIME bursts (R of --clocks, at least 3) for each of these counts of GPU pollers.
    #[arg(long, value_name = "P,P,...", value_delimiter = ',')]
    pollers: Vec<u32>,
    /// Follow the drift for this many seconds: a cheap calibration every --every seconds.
    #[arg(long, value_name = "T", default_value_t = 0.0)]
    seconds: f64,
    /// Seconds between the drift run's calibrations.
    #[arg(long, value_name = "K", default_value_t = 1.0, value_parser = cli::positive::<f64>)]
    every: f64,
    /// Every figure as JSON.
    #[arg(long, value_name = "F.json")]
    out: Option<PathBuf>,
    /// The raw samples of some bursts as CSV.
    #[arg(long, value_name = "F.csv")]
    raw: Option<PathBuf>,
    /// No GPU: fit the bursts of a --raw file again with variants of the fit.
    #[arg(long, value_name = "F.csv")]
    refit: Option<PathBuf>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let result = match &args.refit {
        Some(path) => refit(path),
        None => run(&args),
    };
    cli::exit("calibrate", result.map(|()| true))
}

fn two_sided(samples: &[Sample]) -> Vec<Sample> {
    samples
        .iter()
        .copied()
        .filter(Sample::is_two_sided)
        .collect()
}

/// Appends `samples` to the raw CSV: GPU `ordinal`, what was sampled (`label`), the burst.
fn write_raw(
    raw: &mut String,
    ordinal: usize,
    label: &str,
    burst: impl std::fmt::Display,
    samples: &[Sample],
) {
    for x in samples {
        let _ = writeln!(
            raw,
            "{ordinal},{label},{burst},{},{},{},{}",
            x.is_two_sided() as u8,
            x.host_before,
            x.device,
            x.host_after
        );
    }
}

/// One burst's figures, as JSON.
fn burst_json(map: &ClockMap, two: &ClockMap) -> String {
    let s = map.stats();
    format!(
        "{{\"min_rtt_ns\":{},\"median_rtt_ns\":{},\"bound_ns\":{},\"bound_anchor_ns\":{},\"bound_two_sided_ns\":{},\"bound_anchor_two_sided_ns\":{},\"residual_rms_ns\":{:.1},\"drift_ppm\":{:.3},\"offset_ns\":{},\"used\":{},\"rejected\":{}}}",
        s.min_round_trip_ns,
        s.median_round_trip_ns,
        map.bound_ns(),
        map.parts().bound_anchor_ns,
        two.bound_ns(),
        two.parts().bound_anchor_ns,
        s.residual_rms_ns,
        map.drift_ppm(),
        map.offset_ns(),
        s.used,
        s.rejected
    )
}

/// Fits the bursts of a `--raw` CSV again, with variants of the fit options.
fn refit(path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    use std::collections::BTreeMap;
    use tracing_gpu::clock::FitOptions;
    let text = std::fs::read_to_string(path)?;
    let mut bursts: BTreeMap<(String, String, String), Vec<Sample>> = BTreeMap::new();
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        if f.len() != 7 {
            return Err(format!("bad line: {line}").into());
        }
        let s = Sample {
            host_before: f[4].parse()?,
            device: f[5].parse()?,
            host_after: f[6].parse()?,
        };
        bursts
            .entry((f[0].into(), f[1].into(), f[2].into()))
            .or_default()
            .push(s);
    }
    println!("device clock          burst  two-sided  one-sided  min rtt  anchor bound: r=0   r=1   r=2  two-sided r=2  window bound r=2");
    for ((dev, clock, burst), samples) in &bursts {
        let two = two_sided(samples);
        let fit = |s: &[Sample], r: usize| {
            ClockMap::fit_with(
                s,
                &FitOptions {
                    tolerated_outliers: r,
                    ..FitOptions::default()
                },
            )
        };
        let (a0, a1, a2, t2) = (
            fit(samples, 0)?,
            fit(samples, 1)?,
            fit(samples, 2)?,
            fit(&two, 2)?,
        );
        let b = |m: &ClockMap| m.parts().bound_anchor_ns;
        println!(
            "{dev:6} {clock:14} {burst:>5} {:10} {:10} {:8} {:17} {:5} {:5} {:14} {:17}",
            two.len(),
            samples.len() - two.len(),
            a2.stats().min_round_trip_ns,
            b(&a0),
            b(&a1),
            b(&a2),
            b(&t2),
            a2.bound_ns()
        );
    }
    Ok(())
}

fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    tracing_gpu::cuda::ensure_libraries()?;
    let count = CudaContext::device_count()?;
    let mut json = String::from("{\"devices\":[");
    let mut raw = String::from("device,clock,burst,two_sided,host_before,device_ns,host_after\n");
    for ordinal in 0..count as usize {
        let ctx = CudaContext::new(ordinal)?;
        let name = ctx.name()?;
        let t0 = Instant::now();
        let mut cal = Calibrator::new(&ctx)?;
        let create_ms = t0.elapsed().as_secs_f64() * 1e3;
        println!(
            "GPU {ordinal}: {name}; calibrator ready in {create_ms:.1} ms; %globaltimer step {} ns; {} pollers",
            cal.timer_step_ns(),
            cal.pollers()
        );
        // A broken variant should fail fast, not after the default 2 s.
        cal.set_timeout(Duration::from_millis(300));
        // Warm up the path once; then the calibration this example reports.
        if let Err(e) = cal.calibrate(args.rounds) {
            println!("  {} pollers failed ({e}); using 1", cal.pollers());
            cal.set_pollers(1)?;
            cal.calibrate(args.rounds)?;
        }
        let t = Instant::now();
        let first_samples = cal.sample(args.rounds)?;
        let first = cal.checkpoint(&first_samples)?;
        let first_ms = t.elapsed().as_secs_f64() * 1e3;
        let first_two = cal.fit(&two_sided(&first_samples))?;
        let m = &first.map;
        println!(
            "  offset {} ns (host − device), drift {:+.3} ppm (consistent range {:+.1} .. {:+.1}), bound {} ns at the anchor, {} ns over the {:.2} ms window; {} rounds in {first_ms:.2} ms",
            m.offset_ns(),
            m.drift_ppm(),
            m.drift_range_ppm().0,
            m.drift_range_ppm().1,
            m.parts().bound_anchor_ns,
            m.bound_ns(),
            (m.window().1 - m.window().0) as f64 / 1e6,
            args.rounds
        );
        let _ = write!(
            json,
            "{}{{\"ordinal\":{ordinal},\"name\":{},\"timer_step_ns\":{},\"pollers\":{},\"create_ms\":{create_ms:.2},\"first\":{},\"first_ms\":{first_ms:.3}",
            if ordinal > 0 { "," } else { "" },
            cli::json_string(&name),
            cal.timer_step_ns(),
            cal.pollers(),
            burst_json(m, &first_two)
        );

        if args.costs {
            json.push_str(",\"costs\":[");
            println!("  cost     rounds  sample (median µs)  fit (median µs)  per round (ns)");
            for (k, &n) in [16usize, 64, 128, 256, 1000, 2000, 4000].iter().enumerate() {
                let (mut ts, mut tf) = (Vec::new(), Vec::new());
                for _ in 0..7 {
                    let t = Instant::now();
                    let s = cal.sample(n)?;
                    ts.push(t.elapsed().as_secs_f64() * 1e6);
                    let t = Instant::now();
                    cal.checkpoint(&s)?;
                    tf.push(t.elapsed().as_secs_f64() * 1e6);
                }
                let (s, f) = (median(&mut ts), median(&mut tf));
                println!(
                    "           {n:6}  {s:18.1}  {f:15.1}  {:14.0}",
                    s * 1e3 / n as f64
                );
                let _ = write!(
                    json,
                    "{}{{\"rounds\":{n},\"sample_us\":{s:.1},\"fit_us\":{f:.1}}}",
                    if k > 0 { "," } else { "" }
                );
            }
            json.push(']');
        }

        if !args.pollers.is_empty() {
            pollers_compare(args, &mut cal, &mut json, &mut raw, ordinal)?;
        }

        if args.clocks > 0 {
            json.push_str(",\"clocks\":{");
            let mut per: Vec<Vec<(ClockMap, ClockMap)>> = vec![Vec::new(); 4];
            for r in 0..args.clocks {
                for (c, &clock) in HostClock::ALL.iter().enumerate() {
                    let s = cal.sample_with(clock, args.rounds)?;
                    if r < 2 {
                        write_raw(&mut raw, ordinal, clock.name(), r, &s);
                    }
                    per[c].push((cal.fit(&s)?, cal.fit(&two_sided(&s))?));
                }
            }
            println!(
                "  clocks ({} bursts of {} rounds each, medians)",
                args.clocks, args.rounds
            );
            println!("    clock          min rtt  med rtt  bound@anchor  bound(window)  two-sided@anchor  resid rms  drift ppm");
            for (c, &clock) in HostClock::ALL.iter().enumerate() {
                let b = &per[c];
                let f = |g: &dyn Fn(&(ClockMap, ClockMap)) -> f64| {
                    median(&mut b.iter().map(g).collect::<Vec<_>>())
                };
                println!(
                    "    {:13} {:8.0} {:8.0} {:13.0} {:14.0} {:17.0} {:10.1} {:10.2}",
                    clock.name(),
                    f(&|x| x.0.stats().min_round_trip_ns as f64),
                    f(&|x| x.0.stats().median_round_trip_ns as f64),
                    f(&|x| x.0.parts().bound_anchor_ns as f64),
                    f(&|x| x.0.bound_ns() as f64),
                    f(&|x| x.1.parts().bound_anchor_ns as f64),
                    f(&|x| x.0.stats().residual_rms_ns),
                    f(&|x| x.0.drift_ppm()),
                );
                let _ = write!(
                    json,
                    "{}\"{}\":[",
                    if c > 0 { "," } else { "" },
                    clock.name()
                );
                for (i, (a, t)) in b.iter().enumerate() {
                    let _ = write!(json, "{}{}", if i > 0 { "," } else { "" }, burst_json(a, t));
                }
                json.push(']');
            }
            json.push('}');
        }

        if args.seconds > 0.0 {
            drift_run(args, &mut cal, first, &mut json, &mut raw, ordinal)?;
        }
        json.push('}');
    }
    json.push_str("]}\n");
    if let Some(path) = &args.out {
        std::fs::write(path, &json)?;
    }
    if let Some(path) = &args.raw {
        std::fs::write(path, &raw)?;
    }
    Ok(())
}

/// BOOTTIME bursts for each count of pollers, interleaved.
fn pollers_compare(
    args: &Args,
    cal: &mut Calibrator,
    json: &mut String,
    raw: &mut String,
    ordinal: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let keep = cal.pollers();
    let mut per: Vec<Vec<ClockMap>> = vec![Vec::new(); args.pollers.len()];
    for r in 0..args.clocks.max(3) {
        for (k, &p) in args.pollers.iter().enumerate() {
            cal.set_pollers(p)?;
            match cal.sample(args.rounds) {
                Ok(s) => {
                    if r < 2 {
                        write_raw(raw, ordinal, &format!("pollers{p}"), r, &s);
                    }
                    per[k].push(cal.fit(&s)?);
                }
                Err(e) => println!("  {p} pollers, burst {r}: {e}"),
            }
        }
    }
    cal.set_pollers(keep)?;
    println!(
        "  pollers ({} BOOTTIME bursts of {} rounds each, medians)",
        args.clocks.max(3),
        args.rounds
    );
    println!("    pollers  min rtt  med rtt  bound@anchor  bound(window)  resid rms");
    json.push_str(",\"pollers\":{");
    for (k, &p) in args.pollers.iter().enumerate() {
        let b = &per[k];
        let f = |g: &dyn Fn(&ClockMap) -> f64| median(&mut b.iter().map(g).collect::<Vec<_>>());
        println!(
            "    {p:7} {:8.0} {:8.0} {:13.0} {:14.0} {:10.1}",
            f(&|m| m.stats().min_round_trip_ns as f64),
            f(&|m| m.stats().median_round_trip_ns as f64),
            f(&|m| m.parts().bound_anchor_ns as f64),
            f(&|m| m.bound_ns() as f64),
            f(&|m| m.stats().residual_rms_ns),
        );
        let _ = write!(json, "{}\"{p}\":[", if k > 0 { "," } else { "" });
        for (i, m) in b.iter().enumerate() {
            let _ = write!(json, "{}{}", if i > 0 { "," } else { "" }, burst_json(m, m));
        }
        json.push(']');
    }
    json.push('}');
    Ok(())
}

/// Recalibrates every `args.every` seconds for `args.seconds` seconds.
fn drift_run(
    args: &Args,
    cal: &mut Calibrator,
    first: Checkpoint,
    json: &mut String,
    raw: &mut String,
    ordinal: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let start = Instant::now();
    let mut calibration = Calibration::new(first);
    let mut costs = Vec::new();
    let mut k = 1u32;
    while start.elapsed().as_secs_f64() < args.seconds {
        let next = Duration::from_secs_f64(args.every * k as f64);
        if let Some(wait) = next.checked_sub(start.elapsed()) {
            std::thread::sleep(wait);
        }
        let t = Instant::now();
        let samples = cal.sample(Calibrator::PERIODIC_ROUNDS)?;
        let cp = cal.checkpoint(&samples)?;
        costs.push(t.elapsed().as_secs_f64() * 1e6);
        if k <= 3 {
            write_raw(raw, ordinal, "periodic", k, &samples);
        }
        calibration.push(cp)?;
        k += 1;
    }
    let cps = calibration.checkpoints();
    let hist = calibration.drift_history();
    let (a0, h0) = cps[0].map.anchor();
    let t_of = |d: u64| (d - a0) as f64 / 1e9;
    println!(
        "  drift run: {} checkpoints over {:.0} s ({} rounds each, median cost {:.0} µs)",
        cps.len(),
        args.seconds,
        Calibrator::PERIODIC_ROUNDS,
        median(&mut costs.clone())
    );
    println!("    t (s)   offset − first (ns)  segment drift (ppm)  ± (ppm)  bound@anchor (ns)  realtime−boottime Δ (ns)  raw−boottime Δ (ns)");
    let step = (cps.len() / 12).max(1);
    for (i, cp) in cps.iter().enumerate() {
        if i % step != 0 && i + 1 != cps.len() {
            continue;
        }
        let (d, h) = cp.map.anchor();
        let rel = (h as i128 - h0 as i128) - (d as i128 - a0 as i128);
        let seg = hist.get(i.min(hist.len().saturating_sub(1)));
        println!(
            "    {:6.1} {:20} {:20.3} {:8.3} {:18} {:25} {:20}",
            t_of(d),
            rel,
            seg.map_or(f64::NAN, |s| s.drift_ppm),
            seg.map_or(f64::NAN, |s| s.uncertainty_ppm),
            cp.map.parts().bound_anchor_ns,
            cp.host_offsets.realtime_ns - cps[0].host_offsets.realtime_ns,
            cp.host_offsets.monotonic_raw_ns - cps[0].host_offsets.monotonic_raw_ns,
        );
    }
    // The whole run's drift, first to last anchor.
    let (an, hn) = cps[cps.len() - 1].map.anchor();
    let dx = (an - a0) as f64;
    let total_ppm = ((hn as i128 - h0 as i128) as f64 - dx) / dx * 1e6;
    let total_unc = (cps[0].map.parts().bound_anchor_ns
        + cps[cps.len() - 1].map.parts().bound_anchor_ns) as f64
        / dx
        * 1e6;
    // Leave one out: predict each inner checkpoint's anchor from its neighbours.
    let (mut worst, mut violations, mut errs) = (0i128, 0usize, Vec::new());
    for i in 1..cps.len().saturating_sub(1) {
        let mut loo = Calibration::new(cps[0].clone());
        for (j, c) in cps.iter().enumerate().skip(1) {
            if j != i {
                loo.push(c.clone())?;
            }
        }
        let (d, h) = cps[i].map.anchor();
        let err = loo.to_host(HostClock::Boottime, d) as i128 - h as i128;
        let allowed = (loo.bound_ns(d) + cps[i].map.parts().bound_anchor_ns) as i128;
        worst = worst.max(err.abs());
        errs.push(err.abs() as f64);
        if err.abs() > allowed {
            violations += 1;
        }
    }
    let mut bounds: Vec<f64> = cps
        .iter()
        .map(|c| c.map.parts().bound_anchor_ns as f64)
        .collect();
    println!(
        "    whole run: drift {total_ppm:+.4} ± {total_unc:.4} ppm; periodic bound@anchor median {:.0} ns; leave-one-out error median {:.0} ns, max {worst} ns, {violations} of {} beyond the two bounds",
        median(&mut bounds),
        median(&mut errs),
        cps.len().saturating_sub(2)
    );
    let _ = write!(
        json,
        ",\"drift_run\":{{\"seconds\":{},\"every_s\":{},\"rounds\":{},\"cost_us_median\":{:.1},\"total_drift_ppm\":{total_ppm:.5},\"total_drift_unc_ppm\":{total_unc:.5},\"loo_median_ns\":{:.1},\"loo_max_ns\":{worst},\"loo_violations\":{violations},\"loo_count\":{},\"checkpoints\":[",
        args.seconds,
        args.every,
        Calibrator::PERIODIC_ROUNDS,
        median(&mut costs),
        median(&mut errs.clone()),
        cps.len().saturating_sub(2)
    );
    for (i, cp) in cps.iter().enumerate() {
        let (d, h) = cp.map.anchor();
        let s = cp.map.stats();
        let _ = write!(
            json,
            "{}{{\"t_s\":{:.3},\"device_ns\":{d},\"host_ns\":{h},\"bound_anchor_ns\":{},\"bound_ns\":{},\"drift_ppm\":{:.3},\"min_rtt_ns\":{},\"realtime_minus_boottime_ns\":{},\"monotonic_minus_boottime_ns\":{},\"raw_minus_boottime_ns\":{}}}",
            if i > 0 { "," } else { "" },
            t_of(d),
            cp.map.parts().bound_anchor_ns,
            cp.map.bound_ns(),
            cp.map.drift_ppm(),
            s.min_round_trip_ns,
            cp.host_offsets.realtime_ns,
            cp.host_offsets.monotonic_ns,
            cp.host_offsets.monotonic_raw_ns
        );
    }
    json.push_str("]}");
    Ok(())
}
