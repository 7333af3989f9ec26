//! One burst of samples → a [`ClockMap`]: a linear mapping with an error bound.

use super::band::{argmin_convex, median, theil_sen, Band, Constraint};
use super::line::{Line, Slope};
use super::ClockError;

/// The step of `%globaltimer` on Hopper (sm_90): it advances in 32 ns steps.
pub const GLOBALTIMER_STEP_NS: u64 = 32;

/// One calibration sample: the host clock read just before and just after the
/// device read its timer. The device time lies in `[host_before, host_after]`
/// on the host's timeline. A sample may bound one side only: `host_before = 0`
/// (see [`Sample::at_most`]) or `host_after = u64::MAX`; such samples sharpen
/// the fit but do not count towards `min_samples` or the round-trip statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sample {
    /// Host clock before the device read (ns).
    pub host_before: u64,
    /// Device `%globaltimer` (ns).
    pub device: u64,
    /// Host clock after the device read (ns).
    pub host_after: u64,
}

impl Sample {
    /// A one-sided sample: the device read `device` no later than host time
    /// `host` (`host_before` is 0: no lower bound). The calibration kernel
    /// yields these from the polls that did not yet see the host's flag.
    pub fn at_most(device: u64, host: u64) -> Sample {
        Sample {
            host_before: 0,
            device,
            host_after: host,
        }
    }

    /// Whether both host stamps are known (`host_before` ≠ 0 and `host_after` ≠ `u64::MAX`).
    pub fn is_two_sided(&self) -> bool {
        self.host_before != 0 && self.host_after != u64::MAX
    }

    /// The round trip `host_after − host_before` (ns); 0 for a malformed sample.
    pub fn round_trip_ns(&self) -> u64 {
        self.host_after.saturating_sub(self.host_before)
    }
}

/// How [`ClockMap::fit_with`] works. [`Default`] suits `%globaltimer` on Hopper.
#[derive(Debug, Clone, PartialEq)]
pub struct FitOptions {
    /// The device timer's step (ns): 32 for `%globaltimer` on sm_90.
    pub timer_step_ns: u64,
    /// Fraction of samples, those with the shortest round trips, used for the
    /// robust first estimate that outliers are judged against (0 < f ≤ 1).
    pub tight_fraction: f64,
    /// Prior bound on |drift| (ppm). Only limits how wide the band may be when
    /// the samples alone cannot pin the drift (a very short burst). Crystal
    /// oscillators are within ±100 ppm and NTP slews host clocks by ≤ 500 ppm.
    pub max_drift_ppm: f64,
    /// Fewest usable samples accepted (≥ 2).
    pub min_samples: usize,
    /// How many samples per side (after gross outliers are dropped) may be
    /// wrong by any amount without breaking the bound. Each one tolerated lets
    /// the band ignore one more of the tightest samples. 0 by default: in the
    /// ping-pong a sample can only be wrong by a broken clock or protocol (the
    /// stamps bracket the device read by construction), while on the H200 the
    /// fast rounds that make the band narrow are few (about 1 in 200), so each
    /// one ignored costs about 100 ns of bound (docs/calibration.md).
    pub tolerated_outliers: usize,
}

impl Default for FitOptions {
    fn default() -> Self {
        FitOptions {
            timer_step_ns: GLOBALTIMER_STEP_NS,
            tight_fraction: 0.5,
            max_drift_ppm: 1000.0,
            min_samples: 3,
            tolerated_outliers: 0,
        }
    }
}

impl FitOptions {
    fn validate(&self) -> Result<(), ClockError> {
        if !(self.tight_fraction > 0.0 && self.tight_fraction <= 1.0) {
            return Err(ClockError::InvalidOptions(
                "tight_fraction must be in (0, 1]",
            ));
        }
        if !(self.max_drift_ppm > 0.0 && self.max_drift_ppm <= 1e5) {
            return Err(ClockError::InvalidOptions(
                "max_drift_ppm must be in (0, 100000]",
            ));
        }
        if self.min_samples < 2 {
            return Err(ClockError::InvalidOptions("min_samples must be at least 2"));
        }
        if self.timer_step_ns > 1_000_000 {
            return Err(ClockError::InvalidOptions(
                "timer_step_ns must be at most 1 ms",
            ));
        }
        Ok(())
    }
}

/// How a fit went: what was used, what was rejected, and the spread.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct FitStats {
    /// Samples given.
    pub samples: usize,
    /// Samples whose constraints shaped the map.
    pub used: usize,
    /// Samples rejected: malformed (host_after < host_before) or outliers.
    pub rejected: usize,
    /// Shortest round trip among the usable two-sided samples (ns).
    pub min_round_trip_ns: u64,
    /// Median round trip among the usable two-sided samples (ns).
    pub median_round_trip_ns: u64,
    /// Root mean square of the tight samples' midpoint residuals from the map
    /// (ns): how well a "midpoint" estimator would agree with the fit.
    pub residual_rms_ns: f64,
}

/// A linear device → host mapping fitted from one burst of samples, with an
/// error bound for every device time.
///
/// `to_host(d) = anchor_host + (d − anchor_device) · (1 + drift)`, where the
/// anchor is the device time inside the burst at which the bound is smallest.
/// Within the burst's window the bound is at most [`ClockMap::bound_ns`];
/// outside it grows linearly with the distance, at the drift's uncertainty
/// ([`ClockMap::bound_at`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ClockMap {
    pub(super) parts: ClockMapParts,
    pub(super) stats: FitStats,
    /// `parts`' anchor and drift, as [`ClockMap::to_host`] evaluates them.
    pub(super) line: Line,
}

/// Everything that defines a [`ClockMap`], as plain numbers: what a capture
/// file stores. [`ClockMap::from_parts`] checks them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClockMapParts {
    /// Device time at which the map is anchored (ns).
    pub anchor_device_ns: u64,
    /// Host time the device time `anchor_device_ns` maps to (ns).
    pub anchor_host_ns: u64,
    /// Fitted drift: host ns per device ns, minus 1 (so 5e-6 is 5 ppm).
    pub drift: f64,
    /// Smallest drift consistent with the samples (same unit).
    pub drift_min: f64,
    /// Largest drift consistent with the samples (same unit).
    pub drift_max: f64,
    /// First device time of the burst (ns).
    pub window_start_ns: u64,
    /// Last device time of the burst (ns).
    pub window_end_ns: u64,
    /// Bound at `window_start_ns` (ns).
    pub bound_start_ns: u64,
    /// Bound at `anchor_device_ns` (ns), the smallest in the window.
    pub bound_anchor_ns: u64,
    /// Bound at `window_end_ns` (ns).
    pub bound_end_ns: u64,
}

impl ClockMap {
    /// Fits a map to samples of one burst, with [`FitOptions::default`].
    pub fn fit(samples: &[Sample]) -> Result<ClockMap, ClockError> {
        ClockMap::fit_with(samples, &FitOptions::default())
    }

    /// Fits a map to samples of one burst.
    ///
    /// 1. Malformed samples (`host_after < host_before`) are dropped.
    /// 2. A robust first line (Theil–Sen on the midpoints of the tightest
    ///    `tight_fraction` of samples, by round trip) is the reference.
    /// 3. Samples whose interval misses that line by more than a tolerance
    ///    (the larger of 4 robust standard deviations and the tight samples'
    ///    longest round trip) are gross outliers.
    /// 4. The band is made of the lines that violate at most
    ///    `r = tolerated_outliers` of the remaining samples'
    ///    lower bounds, and at most `r` of their upper bounds.
    /// 5. The map is the line through the band's middle at both ends of the
    ///    window; its bound is the distance to the farther band edge (see the
    ///    module documentation). Samples that no line in the band passes
    ///    through count as rejected.
    ///
    /// Fails when fewer than `min_samples` are usable, when they span no device
    /// time, when half or more are gross outliers, or when no line satisfies
    /// all but `tolerated_outliers` per side of the rest.
    pub fn fit_with(samples: &[Sample], opts: &FitOptions) -> Result<ClockMap, ClockError> {
        opts.validate()?;
        let q = opts.timer_step_ns as f64;
        let mut valid: Vec<Sample> = samples
            .iter()
            .copied()
            .filter(|s| s.host_after >= s.host_before)
            .collect();
        // Two-sided samples first, by round trip; one-sided ones only add bounds.
        valid.sort_by_key(|s| (!s.is_two_sided(), s.round_trip_ns()));
        let two_sided = valid.iter().take_while(|s| s.is_two_sided()).count();
        if two_sided < opts.min_samples {
            return Err(ClockError::NotEnoughSamples {
                got: two_sided,
                needed: opts.min_samples,
            });
        }
        let min_rtt = valid[0].round_trip_ns();
        let median_rtt = valid[two_sided / 2].round_trip_ns();
        let tight_n = ((two_sided as f64 * opts.tight_fraction).ceil() as usize)
            .clamp(opts.min_samples, two_sided);

        // Work in small f64 numbers: device times and offsets (host − device)
        // relative to the tight samples' medians (a median, so that an outlier
        // cannot put the origin where f64 loses the nanoseconds).
        let mut devices: Vec<u64> = valid[..tight_n].iter().map(|s| s.device).collect();
        let mid = devices.len() / 2;
        let base_d = *devices.select_nth_unstable(mid).1;
        let mut offsets: Vec<i128> = valid[..tight_n]
            .iter()
            .map(|s| s.host_before as i128 - s.device as i128)
            .collect();
        let base_o = *offsets.select_nth_unstable(mid).1;
        let cons: Vec<Constraint> = valid
            .iter()
            .map(|s| {
                let x = (s.device as i128 - base_d as i128) as f64;
                let o_lo = s.host_before as i128 - s.device as i128 - base_o;
                let o_hi = s.host_after as i128 - s.device as i128 - base_o;
                Constraint {
                    x,
                    lo: o_lo as f64 - q,
                    hi: o_hi as f64,
                }
            })
            .collect();
        if cons.iter().all(|c| c.x == 0.0) {
            return Err(ClockError::NoDeviceSpan);
        }
        let k_max = opts.max_drift_ppm * 1e-6;

        // 2. Robust reference line from the tight samples' midpoints.
        let tight = &cons[..tight_n];
        let (ref_k, ref_o) = theil_sen(tight, k_max);
        let reference = |x: f64| ref_o + ref_k * x;
        let mut mid_res: Vec<f64> = tight.iter().map(|c| c.mid() - reference(c.x)).collect();
        let med = median(&mut mid_res);
        let mut abs_dev: Vec<f64> = mid_res.iter().map(|r| (r - med).abs()).collect();
        let sigma = 1.4826 * median(&mut abs_dev);
        let tolerance = (4.0 * sigma).max(tight.iter().map(|c| c.hi - c.lo).fold(0.0, f64::max));

        // 3. Gross outliers out.
        let candidates: Vec<&Constraint> = cons
            .iter()
            .filter(|c| c.violation(reference(c.x)) <= tolerance)
            .collect();
        if candidates.len() * 2 <= valid.len() {
            return Err(ClockError::TooManyOutliers {
                rejected: samples.len() - candidates.len(),
                total: samples.len(),
            });
        }
        // 4. The band of lines that violate at most r of the rest per side.
        // Lines are parametrised over u = (x − centre)/half, so that offset and
        // slope have like magnitudes; the scale comes from the tight samples
        // (robustly: an outlier's device time must not set it).
        let mut xs: Vec<f64> = tight.iter().map(|c| c.x).collect();
        let centre = median(&mut xs);
        let mut spread: Vec<f64> = xs.iter().map(|x| (x - centre).abs()).collect();
        let half = (2.0 * median(&mut spread)).max(1.0);
        let r = opts.tolerated_outliers;
        let lines = Band::new(&candidates, centre, half, r, k_max * half)
            .ok_or(ClockError::Inconsistent)?;
        let band = |x: f64| lines.at((x - centre) / half);
        // A sample is used if some line in the band passes through its interval.
        let used_x: Vec<f64> = candidates
            .iter()
            .filter(|c| {
                let (lo, hi) = band(c.x);
                c.lo <= hi && c.hi >= lo
            })
            .map(|c| c.x)
            .collect();
        let used = used_x.len();
        let rejected = samples.len() - used;
        let x0 = used_x.iter().copied().fold(f64::INFINITY, f64::min);
        let x1 = used_x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if x1 - x0 < 1.0 {
            return Err(ClockError::NoDeviceSpan);
        }

        // 5. The map: the line through the band's middle at both ends of the window.
        let (lo0, hi0) = band(x0);
        let (lo1, hi1) = band(x1);
        let (m0, m1) = (0.5 * (lo0 + hi0), 0.5 * (lo1 + hi1));
        let fit_k = (m1 - m0) / (x1 - x0);
        let fit = |x: f64| m0 + fit_k * (x - x0);
        let raw_bound = |x: f64| {
            let (lo, hi) = band(x);
            (hi - fit(x)).max(fit(x) - lo).max(0.0)
        };
        let xa = argmin_convex(&raw_bound, x0, x1).round();
        let (s_lo, s_hi) = lines.slope_range();
        let (drift_min, drift_max) = (s_lo / half, s_hi / half);
        // The event being mapped is a reading too: its instant lies up to q
        // after it, so the map answers for the middle of that step (+q/2) and
        // the bound covers half a step more. +1 ns covers rounding to integers.
        let extra = 0.5 * q + 1.0;
        let to_ns = |b: f64| (b + extra).ceil() as u64;
        let device_at = |x: f64| clamp_u64(base_d as i128 + x as i128);
        let anchor_device_ns = device_at(xa);
        // In integers: the offset itself (~1.8e18 ns against a wall-clock-seeded
        // timer) is beyond f64's nanosecond precision (its ulp there is 256 ns).
        let anchor_host = anchor_device_ns as i128 + base_o + (fit(xa) + 0.5 * q).round() as i128;
        let parts = ClockMapParts {
            anchor_device_ns,
            anchor_host_ns: clamp_u64(anchor_host),
            drift: fit_k,
            drift_min: drift_min.min(fit_k),
            drift_max: drift_max.max(fit_k),
            window_start_ns: device_at(x0),
            window_end_ns: device_at(x1),
            bound_start_ns: to_ns(raw_bound(x0)),
            bound_anchor_ns: to_ns(raw_bound(xa)),
            bound_end_ns: to_ns(raw_bound(x1)),
        };
        let res: Vec<f64> = tight
            .iter()
            .filter(|c| c.violation(fit(c.x)) <= tolerance)
            .map(|c| c.mid() - fit(c.x))
            .collect();
        let residual_rms_ns =
            (res.iter().map(|r| r * r).sum::<f64>() / res.len().max(1) as f64).sqrt();
        let stats = FitStats {
            samples: samples.len(),
            used,
            rejected,
            min_round_trip_ns: min_rtt,
            median_round_trip_ns: median_rtt,
            residual_rms_ns,
        };
        Ok(ClockMap::new(parts, stats))
    }

    fn new(parts: ClockMapParts, stats: FitStats) -> ClockMap {
        ClockMap {
            line: Line::new(
                parts.anchor_device_ns,
                parts.anchor_host_ns,
                Slope::of_drift(parts.drift),
            ),
            parts,
            stats,
        }
    }

    /// A map declared rather than measured: `host = host_ns + (d − device_ns)·(1 + drift_ppm·1e-6)`,
    /// bound 0. For synthetic captures and tests; real maps come from [`ClockMap::fit`].
    pub fn exact(device_ns: u64, host_ns: u64, drift_ppm: f64) -> ClockMap {
        let drift = if drift_ppm.is_finite() {
            drift_ppm * 1e-6
        } else {
            0.0
        };
        ClockMap::new(
            ClockMapParts {
                anchor_device_ns: device_ns,
                anchor_host_ns: host_ns,
                drift,
                drift_min: drift,
                drift_max: drift,
                window_start_ns: device_ns,
                window_end_ns: device_ns,
                bound_start_ns: 0,
                bound_anchor_ns: 0,
                bound_end_ns: 0,
            },
            FitStats::default(),
        )
    }

    /// Rebuilds a map from its parts (as a capture file stores them), checking them.
    pub fn from_parts(parts: ClockMapParts) -> Result<ClockMap, ClockError> {
        let p = &parts;
        if !(p.window_start_ns <= p.anchor_device_ns && p.anchor_device_ns <= p.window_end_ns) {
            return Err(ClockError::InvalidParts(
                "the anchor must lie in the window",
            ));
        }
        if ![p.drift, p.drift_min, p.drift_max]
            .iter()
            .all(|d| d.is_finite() && d.abs() < 0.1)
        {
            return Err(ClockError::InvalidParts(
                "drifts must be finite and below 10%",
            ));
        }
        if !(p.drift_min <= p.drift && p.drift <= p.drift_max) {
            return Err(ClockError::InvalidParts(
                "drift must lie in [drift_min, drift_max]",
            ));
        }
        if p.bound_anchor_ns > p.bound_start_ns.max(p.bound_end_ns) {
            return Err(ClockError::InvalidParts(
                "the anchor's bound cannot exceed both window bounds",
            ));
        }
        Ok(ClockMap::new(parts, FitStats::default()))
    }

    /// The map as plain numbers (see [`ClockMapParts`]).
    pub fn parts(&self) -> &ClockMapParts {
        &self.parts
    }

    /// Host time (ns) of the device reading `device_ns`:
    /// `anchor_host + dx + round(dx · drift)`, `dx = device_ns − anchor_device`,
    /// with the drift in 64-bit fixed point. Saturates at 0 and
    /// `u64::MAX` rather than wrapping, for readings absurdly far from the window.
    pub fn to_host(&self, device_ns: u64) -> u64 {
        clamp_u64(self.line.at(device_ns))
    }

    /// The largest bound (ns) inside the burst's window: `|to_host(d) − true host time| ≤ bound_ns()`
    /// for every device reading `d` in [`ClockMap::window`].
    pub fn bound_ns(&self) -> u64 {
        self.parts.bound_start_ns.max(self.parts.bound_end_ns)
    }

    /// The bound (ns) at one device time. Inside the window it is interpolated
    /// between the bounds at the window's ends and the anchor (the true bound is
    /// a convex function of `d`, so this never understates it); outside, it
    /// grows by the drift's uncertainty times the distance to the window.
    pub fn bound_at(&self, device_ns: u64) -> u64 {
        let p = &self.parts;
        let d = device_ns;
        let chord = |x0: u64, b0: u64, x1: u64, b1: u64| -> u64 {
            if x1 <= x0 {
                return b0.max(b1);
            }
            let t = (d - x0) as f64 / (x1 - x0) as f64;
            (b0 as f64 + (b1 as f64 - b0 as f64) * t).ceil() as u64
        };
        let unc = self.drift_uncertainty();
        if d < p.window_start_ns {
            p.bound_start_ns
                .saturating_add(((p.window_start_ns - d) as f64 * unc).ceil() as u64)
        } else if d > p.window_end_ns {
            p.bound_end_ns
                .saturating_add(((d - p.window_end_ns) as f64 * unc).ceil() as u64)
        } else if d <= p.anchor_device_ns {
            chord(
                p.window_start_ns,
                p.bound_start_ns,
                p.anchor_device_ns,
                p.bound_anchor_ns,
            )
        } else {
            chord(
                p.anchor_device_ns,
                p.bound_anchor_ns,
                p.window_end_ns,
                p.bound_end_ns,
            )
        }
    }

    /// The larger distance from the fitted drift to the ends of its consistent range.
    fn drift_uncertainty(&self) -> f64 {
        let p = &self.parts;
        (p.drift_max - p.drift).max(p.drift - p.drift_min).max(0.0)
    }

    /// `host − device` at the anchor (ns).
    pub fn offset_ns(&self) -> i64 {
        let p = &self.parts;
        (p.anchor_host_ns as i128 - p.anchor_device_ns as i128)
            .clamp(i64::MIN as i128, i64::MAX as i128) as i64
    }

    /// Fitted drift of the host clock against the device clock, in ppm
    /// (host ns per device ns, minus 1, times 10⁶).
    pub fn drift_ppm(&self) -> f64 {
        self.parts.drift * 1e6
    }

    /// The range of drifts (ppm) consistent with the samples.
    pub fn drift_range_ppm(&self) -> (f64, f64) {
        (self.parts.drift_min * 1e6, self.parts.drift_max * 1e6)
    }

    /// The burst's first and last device times (ns).
    pub fn window(&self) -> (u64, u64) {
        (self.parts.window_start_ns, self.parts.window_end_ns)
    }

    /// The anchor: a device time inside the window and the host time it maps to.
    pub fn anchor(&self) -> (u64, u64) {
        (self.parts.anchor_device_ns, self.parts.anchor_host_ns)
    }

    /// How the fit went (all zero for [`ClockMap::exact`] and [`ClockMap::from_parts`]).
    pub fn stats(&self) -> &FitStats {
        &self.stats
    }
}

pub(super) fn clamp_u64(v: i128) -> u64 {
    v.clamp(0, u64::MAX as i128) as u64
}
