//! The clock module's tests: simulated clocks through the fit and the calibration.

use super::line::{div_round, Line};
use super::*;

/// splitmix64: a small deterministic generator for simulated clocks.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn exp(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.unit()).ln()
    }
    fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }
}

/// A simulated GPU clock against a host clock. The device's true time `t`
/// (ns, f64) maps to host time `f(t)`; the device reads `floor((t − phase)/step)·step + phase`.
struct SimClock {
    /// Host time at device time `t0`.
    h0: f64,
    t0: f64,
    /// Drift at t0 (fraction) and its rate of change (per device ns).
    drift: f64,
    drift_rate: f64,
    step: f64,
    phase: f64,
}

impl SimClock {
    fn new(rng: &mut Rng) -> SimClock {
        SimClock {
            // A %globaltimer seeded from wall time, behind a boot-time host clock by ~1.7e18.
            t0: 1.764e18 + rng.range(0.0, 1e12),
            h0: 3.6e12 + rng.range(0.0, 1e12),
            drift: rng.range(-50e-6, 50e-6),
            drift_rate: 0.0,
            step: GLOBALTIMER_STEP_NS as f64,
            phase: rng.range(0.0, 32.0).floor(),
        }
    }
    /// f(t), exactly (t as an offset from t0 keeps f64 precise).
    fn host(&self, dt: f64) -> f64 {
        self.h0 + dt + self.drift * dt + 0.5 * self.drift_rate * dt * dt
    }
    fn read(&self, dt: f64) -> u64 {
        let t = self.t0 as u64 as i128 + dt.floor() as i128;
        let rel = t - self.phase as i128;
        (rel - rel.rem_euclid(self.step as i128) + self.phase as i128) as u64
    }
    /// Device time of a reading, relative to t0, at the middle of its step... not needed:
    /// tests pick a true instant and compare against the reading's mapping.
    fn dt_of(&self, device: u64) -> f64 {
        (device as i128 - self.t0 as u64 as i128) as f64
    }
}

/// Delays of a ping-pong: forward (host stamp → device read) and return.
struct Delays {
    fwd_min: f64,
    ret_min: f64,
    jitter: f64,
}

/// A burst of `n` samples starting at device time `start` (relative to t0),
/// one every `period` ns.
fn burst(
    clock: &SimClock,
    rng: &mut Rng,
    d: &Delays,
    start: f64,
    n: usize,
    period: f64,
) -> Vec<Sample> {
    (0..n)
        .map(|i| {
            let dt = start + i as f64 * period + rng.range(0.0, period * 0.5);
            let h = clock.host(dt);
            let fwd = d.fwd_min + rng.exp(d.jitter);
            let ret = d.ret_min + rng.exp(d.jitter);
            Sample {
                host_before: (h - fwd).floor() as u64,
                device: clock.read(dt),
                host_after: (h + ret).floor() as u64,
            }
        })
        .collect()
}

/// The worst |to_host − truth| / bound over readings across and around the
/// window, asserting each error is within the bound.
fn check_map(map: &ClockMap, clock: &SimClock, rng: &mut Rng, lo: f64, hi: f64, what: &str) {
    for _ in 0..400 {
        let dt = rng.range(lo, hi);
        let d = clock.read(dt);
        let truth = clock.host(dt);
        let got = map.to_host(d) as f64;
        let err = (got - truth).abs();
        let bound = map.bound_at(d) as f64;
        assert!(
            err <= bound,
            "{what}: error {err:.1} ns > bound {bound} ns at dt {dt:.0} (window {:?})",
            map.window()
        );
    }
}

fn window_rel(map: &ClockMap, clock: &SimClock) -> (f64, f64) {
    (clock.dt_of(map.window().0), clock.dt_of(map.window().1))
}

#[test]
fn recovers_offset_and_drift_within_a_tight_bound() {
    let mut worst_ratio: f64 = 0.0;
    for seed in 0..120 {
        let mut rng = Rng(seed);
        let clock = SimClock::new(&mut rng);
        let delays = Delays {
            fwd_min: rng.range(300.0, 1200.0),
            ret_min: rng.range(300.0, 1200.0),
            jitter: rng.range(50.0, 1500.0),
        };
        let samples = burst(&clock, &mut rng, &delays, 0.0, 1000, 3000.0);
        let map = ClockMap::fit(&samples).unwrap();
        let (w0, w1) = window_rel(&map, &clock);
        check_map(&map, &clock, &mut rng, w0, w1, &format!("seed {seed}"));
        // Tight: about half the smallest forward plus return delay, plus the step.
        let ideal = 0.5 * (delays.fwd_min + delays.ret_min) + 32.0;
        let ratio = map.bound_ns() as f64 / ideal;
        worst_ratio = worst_ratio.max(ratio);
        assert!(
            ratio < 1.6,
            "seed {seed}: bound {} ns vs ideal {ideal:.0} ns",
            map.bound_ns()
        );
        assert!(
            map.bound_ns() >= (0.5 * (delays.fwd_min + delays.ret_min)) as u64,
            "seed {seed}: bound below what the delays allow"
        );
        let true_drift_ppm = clock.drift * 1e6;
        let (dmin, dmax) = map.drift_range_ppm();
        assert!(
            dmin <= true_drift_ppm && true_drift_ppm <= dmax,
            "seed {seed}: drift {true_drift_ppm} outside [{dmin}, {dmax}]"
        );
        assert_eq!(
            map.stats().rejected,
            0,
            "seed {seed}: no outliers were simulated"
        );
    }
    assert!(
        worst_ratio > 1.0,
        "the bound must not be below the ideal: {worst_ratio}"
    );
}

#[test]
fn the_offset_is_right_not_just_bounded() {
    let mut rng = Rng(7);
    let mut clock = SimClock::new(&mut rng);
    clock.drift = 5e-6;
    let delays = Delays {
        fwd_min: 900.0,
        ret_min: 1000.0,
        jitter: 400.0,
    };
    let samples = burst(&clock, &mut rng, &delays, 0.0, 2000, 3000.0);
    let map = ClockMap::fit(&samples).unwrap();
    let (d, h) = map.anchor();
    let truth = clock.host(clock.dt_of(d) + 16.0);
    assert!((h as f64 - truth).abs() <= map.bound_at(d) as f64);
    let expect_offset = truth - d as f64;
    assert!((map.offset_ns() as f64 - expect_offset).abs() < 1100.0);
    assert!(
        (map.drift_ppm() - 5.0).abs() < 200.0,
        "drift {}",
        map.drift_ppm()
    );
    let s = map.stats();
    assert_eq!((s.samples, s.used, s.rejected), (2000, 2000, 0));
    assert!(
        s.min_round_trip_ns >= 1900 && s.min_round_trip_ns < 2100,
        "{s:?}"
    );
}

#[test]
fn one_sided_samples_tighten_the_bound() {
    // The kernel's stale polls: a read issued at device time t_issue reached
    // the host (after req_min + jitter) before the flag was written at
    // w ≤ hb2, so f(t_issue) ≤ hb2. With a short request latency they bound
    // the upper side better than the return path does.
    for seed in 0..100 {
        let mut rng = Rng(20_000 + seed);
        let clock = SimClock::new(&mut rng);
        let d = Delays {
            fwd_min: 900.0,
            ret_min: 1000.0,
            jitter: 300.0,
        };
        let req_min = 400.0;
        let mut two = Vec::new();
        let mut one = Vec::new();
        for i in 0..1000 {
            let w_dt = i as f64 * 3000.0;
            let w = clock.host(w_dt);
            let hb = (w - 20.0).floor() as u64;
            let hb2 = (w + 15.0).floor() as u64;
            let fwd = d.fwd_min + rng.exp(d.jitter);
            let t = w_dt + fwd - 20.0;
            let ha = (clock.host(t) + d.ret_min + rng.exp(d.jitter)).floor() as u64;
            two.push(Sample {
                host_before: hb,
                device: clock.read(t),
                host_after: ha,
            });
            let t_issue = w_dt - req_min - rng.exp(d.jitter) - rng.range(0.0, 800.0);
            one.push(Sample::at_most(clock.read(t_issue), hb2));
        }
        let plain = ClockMap::fit(&two).unwrap();
        let all: Vec<Sample> = two.iter().chain(&one).copied().collect();
        let sharp = ClockMap::fit(&all).unwrap();
        let (w0, w1) = window_rel(&sharp, &clock);
        check_map(&sharp, &clock, &mut rng, w0, w1, &format!("seed {seed}"));
        assert!(
            sharp.bound_ns() < plain.bound_ns(),
            "seed {seed}: {} vs {}",
            sharp.bound_ns(),
            plain.bound_ns()
        );
        // Mid-window, where samples lie on both sides, the gain is nearly all of
        // (return − request latency)/2 = 300 ns; at least half of it.
        let (sa, pa) = (sharp.parts().bound_anchor_ns, plain.parts().bound_anchor_ns);
        assert!(sa + 150 < pa, "seed {seed}: {sa} vs {pa} at the anchor");
        assert!(sa < 800, "seed {seed}: {sa} at the anchor, ideal 700");
        assert_eq!(
            sharp.stats().min_round_trip_ns,
            plain.stats().min_round_trip_ns
        );
        assert_eq!(
            sharp.stats().median_round_trip_ns,
            plain.stats().median_round_trip_ns
        );
    }
    // One-sided samples alone cannot make a fit.
    let only: Vec<Sample> = (0..10)
        .map(|i| Sample::at_most(1000 + i * 10, 5000 + i * 10))
        .collect();
    assert_eq!(
        ClockMap::fit(&only),
        Err(ClockError::NotEnoughSamples { got: 0, needed: 3 })
    );
}

#[test]
fn precise_when_the_delays_are_small() {
    // Fast, steady paths: a bound of a few tens of ns, which a mapping that
    // lost nanoseconds anywhere (f64 cannot hold a 1.8e18 ns offset to the
    // ns) would break.
    for seed in 0..30 {
        let mut rng = Rng(40_000 + seed);
        let clock = SimClock::new(&mut rng);
        let delays = Delays {
            fwd_min: 30.0,
            ret_min: 40.0,
            jitter: 5.0,
        };
        let samples = burst(&clock, &mut rng, &delays, 0.0, 500, 3000.0);
        let map = ClockMap::fit(&samples).unwrap();
        assert!(
            map.parts().bound_anchor_ns < 80,
            "seed {seed}: {:?}",
            map.parts()
        );
        let (w0, w1) = window_rel(&map, &clock);
        check_map(&map, &clock, &mut rng, w0, w1, &format!("seed {seed}"));
        let cal = Calibration::new(Checkpoint {
            map: map.clone(),
            host_offsets: HostOffsets {
                realtime_ns: 1_796_218_821_660_592_641,
                ..HostOffsets::default()
            },
        });
        let d = map.anchor().0;
        assert_eq!(
            cal.to_host(HostClock::Realtime, d),
            map.to_host(d) + 1_796_218_821_660_592_641
        );
    }
}

#[test]
fn extrapolation_grows_the_bound_and_stays_right() {
    for seed in 0..50 {
        let mut rng = Rng(1000 + seed);
        let clock = SimClock::new(&mut rng);
        let delays = Delays {
            fwd_min: 800.0,
            ret_min: 900.0,
            jitter: 500.0,
        };
        let samples = burst(&clock, &mut rng, &delays, 0.0, 500, 3000.0);
        let map = ClockMap::fit(&samples).unwrap();
        let (w0, w1) = window_rel(&map, &clock);
        let span = w1 - w0;
        check_map(
            &map,
            &clock,
            &mut rng,
            w0 - 20.0 * span,
            w1 + 20.0 * span,
            &format!("seed {seed}"),
        );
        let far = map.window().1 + 10 * (map.window().1 - map.window().0);
        assert!(
            map.bound_at(far) > 2 * map.bound_ns(),
            "the bound must grow away from the window"
        );
    }
}

#[test]
fn outliers_are_rejected() {
    let mut broken = 0u32;
    for seed in 0..80 {
        let mut rng = Rng(5000 + seed);
        let clock = SimClock::new(&mut rng);
        let delays = Delays {
            fwd_min: rng.range(500.0, 1000.0),
            ret_min: rng.range(500.0, 1000.0),
            jitter: 600.0,
        };
        let mut samples = burst(&clock, &mut rng, &delays, 0.0, 1000, 3000.0);
        // 10% gross outliers of several kinds.
        let mut planted = 0;
        for s in samples.iter_mut() {
            let p = rng.unit();
            if p < 0.10 {
                planted += 1;
                match rng.next() % 5 {
                    // A stale device answer from an earlier round.
                    0 => s.device -= 20_000 + rng.range(0.0, 50_000.0) as u64,
                    // A device value from the future.
                    1 => s.device += 20_000 + rng.range(0.0, 50_000.0) as u64,
                    // Garbage.
                    2 => s.device = rng.next() >> 1,
                    // Host stamps swapped (a stepped clock).
                    3 => std::mem::swap(&mut s.host_before, &mut s.host_after),
                    // Host stamps shifted together.
                    _ => {
                        let shift = 20_000 + rng.range(0.0, 100_000.0) as u64;
                        s.host_before += shift;
                        s.host_after += shift;
                    }
                }
            }
        }
        let map = ClockMap::fit(&samples).unwrap();
        let (w0, w1) = window_rel(&map, &clock);
        check_map(&map, &clock, &mut rng, w0, w1, &format!("seed {seed}"));
        // Gross ones are all caught.
        let rejected = map.stats().rejected;
        assert!(
            rejected == planted,
            "seed {seed}: {rejected} rejected of {planted} planted"
        );
        let ideal = 0.5 * (delays.fwd_min + delays.ret_min) + 32.0;
        assert!(
            (map.bound_ns() as f64) < 1.6 * ideal,
            "seed {seed}: bound {} vs ideal {ideal}",
            map.bound_ns()
        );

        // Two subtle ones: wrong by up to a round trip, which no robust first
        // fit can tell from jitter. Tolerating two per side keeps the bound.
        let opts = FitOptions {
            tolerated_outliers: 2,
            ..FitOptions::default()
        };
        for _ in 0..opts.tolerated_outliers {
            let s = &mut samples[(rng.next() % 1000) as usize];
            let shift = 1000 + rng.range(0.0, 2000.0) as u64;
            if rng.next().is_multiple_of(2) {
                s.host_before += shift;
                s.host_after += shift;
            } else {
                s.host_before -= shift;
                s.host_after -= shift;
            }
        }
        let tolerant = ClockMap::fit_with(&samples, &opts).unwrap();
        let (w0, w1) = window_rel(&tolerant, &clock);
        check_map(
            &tolerant,
            &clock,
            &mut rng,
            w0,
            w1,
            &format!("seed {seed}, tolerant"),
        );
        assert!(
            (tolerant.bound_ns() as f64) < 1.6 * ideal,
            "seed {seed}: {}",
            tolerant.bound_ns()
        );
        // Without the tolerance they can pull the map outside its bound (or
        // leave no consistent line at all).
        match ClockMap::fit(&samples) {
            Err(_) => broken += 1,
            Ok(m) => {
                let (w0, w1) = window_rel(&m, &clock);
                let wrong = (0..400).any(|_| {
                    let dt = rng.range(w0, w1);
                    let d = clock.read(dt);
                    (m.to_host(d) as f64 - clock.host(dt)).abs() > m.bound_at(d) as f64
                });
                broken += wrong as u32;
            }
        }
    }
    assert!(
        broken > 10,
        "subtle outliers never mattered: {broken} of 120 seeds"
    );
}

#[test]
fn coarse_timer_steps_are_accounted_for() {
    // An older GPU whose timer moves in 1 µs steps: the bound must widen by about half a step.
    for seed in 0..50 {
        let mut rng = Rng(9000 + seed);
        let mut clock = SimClock::new(&mut rng);
        clock.step = 1000.0;
        let delays = Delays {
            fwd_min: 700.0,
            ret_min: 700.0,
            jitter: 300.0,
        };
        let samples = burst(&clock, &mut rng, &delays, 0.0, 1000, 3000.0);
        let opts = FitOptions {
            timer_step_ns: 1000,
            ..FitOptions::default()
        };
        let map = ClockMap::fit_with(&samples, &opts).unwrap();
        let (w0, w1) = window_rel(&map, &clock);
        check_map(&map, &clock, &mut rng, w0, w1, &format!("seed {seed}"));
        assert!(
            map.bound_ns() >= 1200,
            "a 1 µs step cannot be mapped closer than ±500 ns: {}",
            map.bound_ns()
        );
        // Ignoring the step (claiming 32 ns) must be caught out on some reading.
        if seed == 0 {
            let wrong = ClockMap::fit(&samples).unwrap();
            let bad = (0..2000).any(|_| {
                let dt = rng.range(w0, w1);
                let d = clock.read(dt);
                (wrong.to_host(d) as f64 - clock.host(dt)).abs() > wrong.bound_at(d) as f64
            });
            assert!(
                bad,
                "the simulation must be able to expose an ignored timer step"
            );
        }
    }
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    assert_eq!(
        ClockMap::fit(&[]),
        Err(ClockError::NotEnoughSamples { got: 0, needed: 3 })
    );
    let s = Sample {
        host_before: 10,
        device: 5,
        host_after: 20,
    };
    assert_eq!(ClockMap::fit(&[s; 10]), Err(ClockError::NoDeviceSpan));
    let swapped = Sample {
        host_before: 20,
        device: 5,
        host_after: 10,
    };
    assert_eq!(
        ClockMap::fit(&[swapped; 10]),
        Err(ClockError::NotEnoughSamples { got: 0, needed: 3 })
    );
    let opts = FitOptions {
        tight_fraction: 0.0,
        ..FitOptions::default()
    };
    assert!(matches!(
        ClockMap::fit_with(&[s; 3], &opts),
        Err(ClockError::InvalidOptions(_))
    ));
    // Half the samples on one line, half on another 1 ms away: no majority.
    let mut v = Vec::new();
    for i in 0..20u64 {
        let shift = if i % 2 == 0 { 0 } else { 1_000_000 };
        v.push(Sample {
            host_before: 1_000_000_000 + i * 3000 + shift,
            device: 5_000 + i * 3000,
            host_after: 1_000_002_000 + i * 3000 + shift,
        });
    }
    assert!(matches!(
        ClockMap::fit(&v),
        Err(ClockError::TooManyOutliers { .. } | ClockError::Inconsistent)
    ));
    // One sample that contradicts the others by less than the gross tolerance.
    let mut w: Vec<Sample> = (0..50u64)
        .map(|i| Sample {
            host_before: 1_000_000_000 + i * 3000,
            device: 5_000 + i * 3000,
            host_after: 1_000_002_000 + i * 3000,
        })
        .collect();
    w[25].host_before += 1900;
    w[25].host_after += 1900;
    w[10].host_before -= 1900;
    w[10].host_after -= 1900;
    assert_eq!(ClockMap::fit(&w), Err(ClockError::Inconsistent));
    let tolerant = FitOptions {
        tolerated_outliers: 1,
        ..FitOptions::default()
    };
    assert!(ClockMap::fit_with(&w, &tolerant).is_ok());
    // Extreme values do not panic.
    let ext = [
        Sample {
            host_before: 0,
            device: 0,
            host_after: u64::MAX,
        },
        Sample {
            host_before: u64::MAX - 5,
            device: u64::MAX,
            host_after: u64::MAX,
        },
        Sample {
            host_before: 1,
            device: u64::MAX / 2,
            host_after: 2,
        },
    ];
    if let Ok(m) = ClockMap::fit(&ext) {
        let _ = (
            m.to_host(0),
            m.to_host(u64::MAX),
            m.bound_at(0),
            m.bound_at(u64::MAX),
        );
    }
}

#[test]
fn parts_round_trip_and_are_checked() {
    let mut rng = Rng(3);
    let clock = SimClock::new(&mut rng);
    let samples = burst(
        &clock,
        &mut rng,
        &Delays {
            fwd_min: 800.0,
            ret_min: 800.0,
            jitter: 300.0,
        },
        0.0,
        300,
        3000.0,
    );
    let map = ClockMap::fit(&samples).unwrap();
    let back = ClockMap::from_parts(*map.parts()).unwrap();
    for d in [
        map.window().0,
        map.anchor().0,
        map.window().1,
        map.window().1 + 1_000_000_000,
    ] {
        assert_eq!(back.to_host(d), map.to_host(d));
        assert_eq!(back.bound_at(d), map.bound_at(d));
    }
    let mut bad = *map.parts();
    bad.anchor_device_ns = bad.window_end_ns + 1;
    assert!(matches!(
        ClockMap::from_parts(bad),
        Err(ClockError::InvalidParts(_))
    ));
    let mut bad = *map.parts();
    bad.drift = f64::NAN;
    assert!(matches!(
        ClockMap::from_parts(bad),
        Err(ClockError::InvalidParts(_))
    ));
}

#[test]
fn exact_maps_are_exact() {
    let m = ClockMap::exact(1_000, 5_000, 10.0);
    assert_eq!(m.to_host(1_000), 5_000);
    assert_eq!(m.to_host(1_000_001_000), 5_000 + 1_000_000_000 + 10_000);
    assert_eq!(m.to_host(0), 4_000);
    assert_eq!(m.bound_at(1_000), 0);
    assert_eq!(m.offset_ns(), 4_000);
    let c = Calibration::exact(1_000, 5_000, 0.0);
    assert_eq!(c.to_host(HostClock::Boottime, 2_000), 6_000);
    assert_eq!(c.to_host(HostClock::Realtime, 2_000), 6_000);
}

/// A long run: a burst every `every` ns of device time while the drift wanders.
fn long_run(seed: u64, every: f64, bursts: usize, drift_rate: f64) -> (SimClock, Calibration, Rng) {
    let mut rng = Rng(seed);
    let mut clock = SimClock::new(&mut rng);
    clock.drift_rate = drift_rate;
    let delays = Delays {
        fwd_min: 900.0,
        ret_min: 1000.0,
        jitter: 700.0,
    };
    let mut cal: Option<Calibration> = None;
    for b in 0..bursts {
        // The first calibration is thorough, the periodic ones cheap.
        let n = if b == 0 { 1000 } else { 64 };
        let samples = burst(&clock, &mut rng, &delays, b as f64 * every, n, 3000.0);
        // Realtime − boottime: constant but for a 1 s step at burst 5; monotonic_raw creeps 3 ppm.
        let host_offsets = HostOffsets {
            realtime_ns: 1_700_000_000_000_000_000 + if b >= 5 { 1_000_000_000 } else { 0 },
            monotonic_ns: -42,
            monotonic_raw_ns: (b as f64 * every * 3e-6) as i64,
            uncertainty_ns: 20,
        };
        let cp = Checkpoint {
            map: ClockMap::fit(&samples).unwrap(),
            host_offsets,
        };
        match cal.as_mut() {
            None => cal = Some(Calibration::new(cp)),
            Some(c) => c.push(cp).unwrap(),
        }
    }
    (clock, cal.unwrap(), rng)
}

#[test]
fn recalibration_keeps_a_long_run_within_bounds() {
    // 100 s, a checkpoint every second, the drift moving by 2 ppm over the run.
    for seed in 0..20 {
        let every = 1e9;
        let (clock, cal, mut rng) = long_run(700 + seed, every, 101, 2e-6 / 100e9);
        assert_eq!(cal.checkpoints().len(), 101);
        let mut worst: u64 = 0;
        for _ in 0..5000 {
            let dt = rng.range(0.0, 100.0 * every);
            let d = clock.read(dt);
            let got = cal.to_host(HostClock::Boottime, d) as f64;
            let err = (got - clock.host(dt)).abs();
            let bound = cal.bound_ns(d);
            assert!(
                err <= bound as f64,
                "seed {seed}: error {err} > bound {bound} at {dt}"
            );
            worst = worst.max(bound);
        }
        // Between checkpoints the bound stays near the anchors' (no drift blow-up over 1 s).
        assert!(
            worst < 2000,
            "seed {seed}: worst bound {worst} ns between checkpoints"
        );
        // A single map extrapolated over the run would be far off: the recalibration matters.
        let first = &cal.checkpoints()[0].map;
        let end = clock.read(100.0 * every);
        assert!(first.bound_at(end) > 100 * worst);
        // The drift history shows the drift moving.
        let h = cal.drift_history();
        assert_eq!(h.len(), 100);
        let (k0, k1) = (h[0].drift_ppm, h[99].drift_ppm);
        let (t0, t1) = (
            clock.drift * 1e6,
            (clock.drift + clock.drift_rate * 100e9) * 1e6,
        );
        assert!(
            (k0 - t0).abs() <= h[0].uncertainty_ppm + 0.02,
            "{k0} vs {t0} ± {}",
            h[0].uncertainty_ppm
        );
        assert!(
            (k1 - t1).abs() <= h[99].uncertainty_ppm + 0.02,
            "{k1} vs {t1} ± {}",
            h[99].uncertainty_ppm
        );
        // ±(two anchors' bounds)/1 s: about 2 ppm per one-second segment.
        assert!(
            h.iter().all(|s| s.uncertainty_ppm < 3.0),
            "1 s segments pin the drift to < 3 ppm"
        );
    }
}

#[test]
fn mapping_is_monotonic_across_checkpoints() {
    let (clock, cal, _) = long_run(11, 1e8, 20, 0.0);
    let mut last = 0;
    let start = clock.read(-1e6);
    let end = clock.read(20.0 * 1e8);
    let mut d = start;
    while d < end {
        let h = cal.to_host(HostClock::Boottime, d);
        assert!(h >= last, "time went backwards at {d}");
        last = h;
        d += 99_991;
    }
}

#[test]
fn extrapolation_beyond_the_last_checkpoint_is_bounded() {
    let (clock, cal, mut rng) = long_run(23, 1e9, 5, 0.0);
    for _ in 0..2000 {
        let dt = rng.range(-3e9, 9e9);
        let d = clock.read(dt);
        let err = (cal.to_host(HostClock::Boottime, d) as f64 - clock.host(dt)).abs();
        assert!(
            err <= cal.bound_ns(d) as f64,
            "error {err} > bound {} at {dt}",
            cal.bound_ns(d)
        );
    }
    let last = cal.latest().map.anchor().0;
    assert!(cal.bound_ns(last + 5_000_000_000) > cal.bound_ns(last));
}

#[test]
fn other_host_clocks_follow_the_measured_offsets() {
    let (clock, cal, _) = long_run(31, 1e9, 10, 0.0);
    let a2 = cal.checkpoints()[2].map.anchor().0;
    let boot = cal.to_host(HostClock::Boottime, a2);
    assert_eq!(
        cal.to_host(HostClock::Realtime, a2),
        boot + 1_700_000_000_000_000_000
    );
    assert_eq!(cal.to_host(HostClock::Monotonic, a2), boot - 42);
    assert_eq!(
        cal.bound_ns_on(HostClock::Realtime, a2),
        cal.bound_ns(a2) + 20
    );
    assert_eq!(cal.bound_ns_on(HostClock::Boottime, a2), cal.bound_ns(a2));
    // Monotonic_raw creeps 3 ppm against boottime: interpolated between checkpoints.
    let mid = clock.read(2.5e9);
    let raw = cal.to_host(HostClock::MonotonicRaw, mid) as i128
        - cal.to_host(HostClock::Boottime, mid) as i128;
    assert!((raw - 7500).abs() <= 200, "{raw}");
    // After the step at checkpoint 5, realtime is a second ahead.
    let a6 = cal.checkpoints()[6].map.anchor().0;
    assert_eq!(
        cal.to_host(HostClock::Realtime, a6),
        cal.to_host(HostClock::Boottime, a6) + 1_700_000_001_000_000_000
    );
}

#[test]
fn slices_answer_like_the_whole() {
    let (clock, cal, mut rng) = long_run(41, 1e9, 30, 1e-17);
    for (lo, hi) in [
        (3.2e9, 3.9e9),
        (-2e9, -1e9),
        (31e9, 35e9),
        (0.0, 29e9),
        (10e9, 10e9),
    ] {
        let (dlo, dhi) = (clock.read(lo), clock.read(hi));
        let s = cal.slice(dlo, dhi);
        assert!(s.checkpoints().len() >= 2 && s.checkpoints().len() <= cal.checkpoints().len());
        for _ in 0..200 {
            let d = clock.read(rng.range(lo, hi + 1.0));
            for c in HostClock::ALL {
                assert_eq!(s.to_host(c, d), cal.to_host(c, d));
                assert_eq!(s.bound_ns_on(c, d), cal.bound_ns_on(c, d));
            }
        }
    }
    assert_eq!(
        cal.slice(clock.read(3.2e9), clock.read(3.9e9))
            .checkpoints()
            .len(),
        2
    );
}

#[test]
fn mappers_answer_like_to_host() {
    let (clock, cal, mut rng) = long_run(43, 1e9, 6, 1e-17);
    let single = Calibration::exact(1_000, 5_000_000, 7.3);
    let anchors: Vec<u64> = cal.checkpoints().iter().map(|c| c.map.anchor().0).collect();
    for (c, lo, hi) in [
        (&cal, clock.read(1.2e9), clock.read(1.9e9)),
        (&cal, clock.read(-2e9), clock.read(-1e9)),
        (&cal, clock.read(0.5e9), clock.read(3.5e9)), // across checkpoints
        (&cal, clock.read(4e9), clock.read(9e9)),
        (&cal, anchors[2], anchors[3]),
        (&cal, 0, u64::MAX),
        (&single, 0, u64::MAX),
        (&single, 900, 2_000_000_000),
    ] {
        let m = c.mapper(lo, hi);
        let mut probes: Vec<u64> = (0..500)
            .map(|_| lo + (rng.next() % (hi - lo).max(1)))
            .collect();
        probes.extend([lo, hi, lo.wrapping_sub(1), hi.wrapping_add(1), 0, u64::MAX]);
        probes.extend(anchors.iter().flat_map(|&a| [a - 1, a, a + 1]));
        for d in probes {
            assert_eq!(m.boottime(d), c.to_host(HostClock::Boottime, d), "at {d}");
        }
    }
}

#[test]
fn fixed_point_lines_round_like_exact_arithmetic() {
    // Segment slopes in 2⁻⁶⁴ units: within 1 ns of the exactly rounded
    // line, and exact wherever the exact value is not near a half.
    let mut rng = Rng(77);
    for _ in 0..2000 {
        let xa = rng.next() >> 2;
        let dx = 1 + (rng.next() >> 24);
        let excess = (rng.next() % (2 * (dx / 1000 + 1))) as i128 - (dx / 1000) as i128;
        let ya = rng.next() >> 2;
        let yb = (ya as i128 + dx as i128 + excess) as u64;
        let l = Line::through(xa, ya, xa + dx, yb);
        let t = (rng.next() >> 3) as i128 - (1 << 60);
        let x = (xa as i128 + t).clamp(0, u64::MAX as i128) as u64;
        let t = x as i128 - xa as i128;
        let exact_num = t * excess; // |t| < 2⁶², |excess| < 2⁴⁰
        let want = ya as i128 + t + div_round(exact_num, dx as i128);
        let got = l.at(x);
        assert!((got - want).abs() <= 1, "{got} vs {want}");
        // The slope is within 2⁻⁶⁵ of exact: off by at most |t|·2⁻⁶⁵ before rounding.
        let from_half = (exact_num.rem_euclid(dx as i128) * 2 - dx as i128).abs();
        if from_half << 63 > t.abs() * dx as i128 {
            assert_eq!(got, want, "away from a half the rounding is exact");
        }
    }
}

#[test]
fn checkpoints_must_advance() {
    let mut c = Calibration::exact(1_000_000, 5_000_000, 0.0);
    let older = Checkpoint {
        map: ClockMap::exact(500_000, 4_500_000, 0.0),
        host_offsets: HostOffsets::default(),
    };
    assert_eq!(
        c.push(older),
        Err(ClockError::NotLater {
            last: 1_000_000,
            next: 500_000
        })
    );
    let newer = Checkpoint {
        map: ClockMap::exact(2_000_000, 6_000_100, 0.0),
        host_offsets: HostOffsets::default(),
    };
    c.push(newer).unwrap();
    assert_eq!(c.checkpoints().len(), 2);
    assert_eq!(c.to_host(HostClock::Boottime, 1_500_000), 5_500_050);
}

#[test]
fn host_offsets_are_measured_consistently() {
    let o = HostOffsets::measure();
    assert!(o.uncertainty_ns < 1_000_000, "{o:?}");
    assert_eq!(o.of(HostClock::Boottime), 0);
    // Realtime is after 2020 in any sane environment; boottime is smaller.
    assert!(
        o.realtime_ns > 1_577_836_800_000_000_000 - 1_000_000_000_000_000,
        "{o:?}"
    );
    let b = HostClock::Boottime.now_ns() as i128;
    let r = HostClock::Realtime.now_ns() as i128;
    assert!((r - b - o.realtime_ns as i128).abs() < 10_000_000);
}
