//! Device clock → host clock: calibration samples in, a mapping with offset,
//! drift and an error bound out. Pure math: no CUDA, no tracing.
//!
//! The **trace clock** is [`HostClock::Boottime`]: Perfetto host spans, launch
//! times and the device mapping all use it (Perfetto's default clock, builtin id 6).
//!
//! # The pieces
//!
//! - [`Sample`]: one ping-pong, the host clock read before and after the device
//!   read its timer.
//! - [`ClockMap::fit`]: many samples taken close together (a *burst*) become one
//!   linear map `host = anchor_host + (device − anchor_device) · (1 + drift)`, with
//!   a rigorous error bound at every device time ([`ClockMap::bound_at`]).
//! - [`Calibration`]: the maps of one device over a whole run. Each recalibration
//!   adds a [`Checkpoint`] (a map plus the measured offsets between the host clocks,
//!   [`HostOffsets`]); device times between two checkpoints are interpolated
//!   between them, so long runs stay correct while the drift wanders.
//!   [`Calibration::to_host`] answers on any [`HostClock`].
//!
//! # Where the bound comes from
//!
//! A sample says that the device read its timer at some instant between
//! `host_before` and `host_after`. The device value is a *reading* of a counter
//! that steps every `q` ns (32 ns for `%globaltimer` on Hopper), so the true
//! device instant lies in `[device, device + q)`. Let `f(d)` be the host time at
//! which the device counter reads `d`. Then every sample gives
//!
//! ```text
//!     host_before − q ≤ f(device) ≤ host_after
//! ```
//!
//! whatever the split of the round trip into forward and return delay: no
//! symmetry is assumed. If `f` is linear over the burst (constant drift), the
//! true line satisfies every sample. At any device time `d`, `f(d)` therefore
//! lies between the lowest and the highest of the lines that satisfy the
//! samples (the *band*); the reported map is the line through the middle of the
//! band at both ends of the burst, and its bound is its distance to the farther
//! band edge, plus `q/2` for the reading of the event being mapped. With many
//! samples the band's width is about the *smallest* forward delay plus the
//! *smallest* return delay seen, not the round trip of any one sample. Outside
//! the burst the band widens with the uncertainty of the drift.
//!
//! A wrong sample (an outlier) would narrow the band around the wrong place.
//! Gross ones are dropped against a robust first fit. Against subtle ones the
//! band can be made of the lines that violate at most `r` samples on each side,
//! `r = tolerated_outliers` ([`FitOptions`], 0 by default): the bound then
//! holds as long as no more than `r` samples per side are wrong, at the cost of
//! the gap between the smallest and the (r+1)-th smallest delay. With `r = 0`,
//! samples that no line satisfies are an error rather than a wrong bound. See
//! [`ClockMap::fit_with`].

use std::cmp::Ordering;

/// A host clock that outputs can stamp with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HostClock {
    /// `CLOCK_REALTIME`: wall time, for OTLP. Can be stepped.
    Realtime,
    /// `CLOCK_MONOTONIC`: slewed by NTP, stops in suspend.
    Monotonic,
    /// `CLOCK_MONOTONIC_RAW`: the raw oscillator, never slewed.
    MonotonicRaw,
    /// `CLOCK_BOOTTIME`: monotonic, counts suspend; the trace clock.
    Boottime,
}

impl HostClock {
    /// Every host clock, in a fixed order.
    pub const ALL: [HostClock; 4] = [
        HostClock::Realtime,
        HostClock::Monotonic,
        HostClock::MonotonicRaw,
        HostClock::Boottime,
    ];

    fn clock_id(self) -> libc::clockid_t {
        match self {
            HostClock::Realtime => libc::CLOCK_REALTIME,
            HostClock::Monotonic => libc::CLOCK_MONOTONIC,
            HostClock::MonotonicRaw => libc::CLOCK_MONOTONIC_RAW,
            HostClock::Boottime => libc::CLOCK_BOOTTIME,
        }
    }

    /// The clock's current reading in nanoseconds.
    #[inline]
    pub fn now_ns(self) -> u64 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid timespec; the clock ids above exist on Linux.
        unsafe { libc::clock_gettime(self.clock_id(), &mut ts) };
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    }

    /// A short lower-case name (`"boottime"`, ...), for tables and files.
    pub fn name(self) -> &'static str {
        match self {
            HostClock::Realtime => "realtime",
            HostClock::Monotonic => "monotonic",
            HostClock::MonotonicRaw => "monotonic_raw",
            HostClock::Boottime => "boottime",
        }
    }
}

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

/// Errors of clock fitting and calibration bookkeeping.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ClockError {
    /// Too few usable samples to fit a line.
    #[error("not enough calibration samples: {got} usable, {needed} needed")]
    NotEnoughSamples {
        /// Usable two-sided samples (0 < host_before ≤ host_after < u64::MAX).
        got: usize,
        /// The minimum.
        needed: usize,
    },
    /// Every sample has the same device time: the drift cannot be fitted.
    #[error("the calibration samples span no device time")]
    NoDeviceSpan,
    /// More samples disagree with the fit than agree with it.
    #[error("calibration samples are inconsistent: {rejected} of {total} rejected as outliers")]
    TooManyOutliers {
        /// Samples rejected.
        rejected: usize,
        /// Samples given.
        total: usize,
    },
    /// A fit option is out of range.
    #[error("invalid clock fit option: {0}")]
    InvalidOptions(&'static str),
    /// No line satisfies the samples: some are wrong, by less than the
    /// gross-outlier tolerance (see [`FitOptions::tolerated_outliers`]).
    #[error("no clock line satisfies all calibration samples (a subtly wrong sample? see FitOptions::tolerated_outliers)")]
    Inconsistent,
    /// [`ClockMapParts`] that do not describe a map.
    #[error("invalid clock map: {0}")]
    InvalidParts(&'static str),
    /// A checkpoint that does not come after the last one (device and host time
    /// must both advance).
    #[error("checkpoint at device {next} ns does not follow the last one at device {last} ns")]
    NotLater {
        /// Anchor device time of the last checkpoint.
        last: u64,
        /// Anchor device time of the rejected one.
        next: u64,
    },
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
    parts: ClockMapParts,
    stats: FitStats,
    /// `parts`' anchor and drift, as [`ClockMap::to_host`] evaluates them.
    line: Line,
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
    /// with the drift in 64-bit fixed point (see [`Line`]). Saturates at 0 and
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

/// One sample as a constraint on the offset `f(x) − x` at device time `x`
/// (all relative to the fit's bases).
struct Constraint {
    x: f64,
    lo: f64,
    hi: f64,
}

impl Constraint {
    fn mid(&self) -> f64 {
        0.5 * (self.lo + self.hi)
    }

    /// How far the value `y` lies outside `[lo, hi]` (0 inside).
    fn violation(&self, y: f64) -> f64 {
        (self.lo - y).max(y - self.hi).max(0.0)
    }
}

/// The band of lines `o(u) = a + s·u` (u: device time, centred and scaled)
/// that violate at most `r` lower and `r` upper constraints.
///
/// For a fixed slope `s`, such lines have `a` between the (r+1)-th largest
/// `lo_i − s·u_i` and the (r+1)-th smallest `hi_i − s·u_i`. Slopes are scanned
/// on a grid refined around the feasible ones; each grid point stands for a
/// cell of width `2h`, over which those order statistics move by at most
/// `h·max|u_i|` (each line moves that much), so widening every cell by that
/// slack makes the band cover every consistent line, not just those on the grid.
struct Band {
    /// Feasible cells: slope at the cell's centre, lowest and highest `a` there.
    cells: Vec<(f64, f64, f64)>,
    /// Half a cell's width (in s).
    h: f64,
    /// Largest |u_i|.
    umax: f64,
}

impl Band {
    /// Points per refinement pass, points of the final pass, and the most passes.
    const GRID: usize = 64;
    const GRID_FINAL: usize = 512;
    const PASSES: usize = 12;

    /// The band, or `None` when no line violates at most `r` constraints per side
    /// with a slope in `[−s_lim, s_lim]`.
    fn new(cons: &[&Constraint], centre: f64, half: f64, r: usize, s_lim: f64) -> Option<Band> {
        // Each side as lines v − s·u whose (r+1)-th smallest is wanted: the
        // upper edge from (hi, u), the lower edge (negated) from (−lo, −u).
        let us: Vec<f64> = cons.iter().map(|c| (c.x - centre) / half).collect();
        let umax = us.iter().fold(0.0f64, |m, u| m.max(u.abs()));
        let upper_all: Vec<(f64, f64)> = cons.iter().zip(&us).map(|(c, &u)| (c.hi, u)).collect();
        let lower_all: Vec<(f64, f64)> = cons.iter().zip(&us).map(|(c, &u)| (-c.lo, -u)).collect();
        let mut scratch = Vec::with_capacity(cons.len());
        let (mut start, mut end) = (-s_lim, s_lim);
        let mut grid = Self::GRID;
        let mut best: Option<Band> = None;
        for _ in 0..Self::PASSES {
            let (mid, delta) = (0.5 * (start + end), 0.5 * (end - start));
            let upper = prune(&upper_all, mid, delta, r, &mut scratch);
            let lower = prune(&lower_all, mid, delta, r, &mut scratch);
            let h = delta / grid as f64;
            let slack = h * umax;
            let cells: Vec<(f64, f64, f64)> = (0..grid)
                .map(|j| start + (2 * j + 1) as f64 * h)
                .filter_map(|sj| {
                    let lo = -kth_line(&lower, sj, r, &mut scratch);
                    let hi = kth_line(&upper, sj, r, &mut scratch);
                    (lo - slack <= hi + slack).then_some((sj, lo, hi))
                })
                .collect();
            if cells.is_empty() {
                // Only possible on the first pass: every later range holds a feasible cell.
                return best;
            }
            let (first, last) = (cells[0].0 - h, cells[cells.len() - 1].0 + h);
            let shrunk = last - first < 0.5 * (end - start);
            best = Some(Band { cells, h, umax });
            if slack < 0.25 || grid == Self::GRID_FINAL {
                break;
            }
            if !shrunk {
                // The feasible slopes fill the range: resolve it finely once.
                grid = Self::GRID_FINAL;
            }
            (start, end) = (first, last);
        }
        best
    }

    /// The lowest and highest value at `u` of any line in the band.
    fn at(&self, u: f64) -> (f64, f64) {
        let slack = self.h * (self.umax + u.abs());
        let (lo, hi) = self.cells.iter().fold(
            (f64::INFINITY, f64::NEG_INFINITY),
            |(lo, hi), &(s, l, h)| (lo.min(l + s * u), hi.max(h + s * u)),
        );
        (lo - slack, hi + slack)
    }

    /// The smallest and largest slope in the band.
    fn slope_range(&self) -> (f64, f64) {
        (
            self.cells[0].0 - self.h,
            self.cells[self.cells.len() - 1].0 + self.h,
        )
    }
}

/// The (r+1)-th smallest of the lines `v − s·u` at slope `s`.
fn kth_line(lines: &[(f64, f64)], s: f64, r: usize, scratch: &mut Vec<f64>) -> f64 {
    scratch.clear();
    scratch.extend(lines.iter().map(|&(v, u)| v - s * u));
    kth_smallest(scratch, r)
}

/// The lines that can be among the (r+1) smallest anywhere on slopes
/// `mid ± delta` (a line moves by at most `delta·|u|` from its value at `mid`).
fn prune(
    lines: &[(f64, f64)],
    mid: f64,
    delta: f64,
    r: usize,
    scratch: &mut Vec<f64>,
) -> Vec<(f64, f64)> {
    scratch.clear();
    scratch.extend(lines.iter().map(|&(v, u)| v - mid * u + delta * u.abs()));
    let worst = kth_smallest(scratch, r);
    lines
        .iter()
        .copied()
        .filter(|&(v, u)| v - mid * u - delta * u.abs() <= worst)
        .collect()
}

/// The (k+1)-th smallest value (reorders `v`; `k` is clamped to the last).
fn kth_smallest(v: &mut [f64], k: usize) -> f64 {
    let k = k.min(v.len() - 1);
    *v.select_nth_unstable_by(k, |a, b| a.partial_cmp(b).unwrap_or(Ordering::Equal))
        .1
}

/// Theil–Sen line through the constraints' midpoints: slope (clamped to
/// ±`k_max`) and value at x = 0. At most 256 points, spread over the window,
/// keep it cheap for large bursts.
fn theil_sen(cons: &[Constraint], k_max: f64) -> (f64, f64) {
    let mut pts: Vec<(f64, f64)> = cons.iter().map(|c| (c.x, c.mid())).collect();
    pts.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap_or(Ordering::Equal));
    const MAX_POINTS: usize = 256;
    if pts.len() > MAX_POINTS {
        let step = pts.len() as f64 / MAX_POINTS as f64;
        pts = (0..MAX_POINTS)
            .map(|i| pts[(i as f64 * step) as usize])
            .collect();
    }
    let mut slopes = Vec::with_capacity(pts.len() * pts.len() / 2);
    for i in 0..pts.len() {
        for j in i + 1..pts.len() {
            let dx = pts[j].0 - pts[i].0;
            if dx > 0.0 {
                slopes.push((pts[j].1 - pts[i].1) / dx);
            }
        }
    }
    let k = if slopes.is_empty() {
        0.0
    } else {
        median(&mut slopes).clamp(-k_max, k_max)
    };
    let mut icepts: Vec<f64> = pts.iter().map(|&(x, y)| y - k * x).collect();
    (k, median(&mut icepts))
}

/// Median of a non-empty slice (reorders it); 0 for an empty one.
fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mid = v.len() / 2;
    let (_, m, _) =
        v.select_nth_unstable_by(mid, |a, b| a.partial_cmp(b).unwrap_or(Ordering::Equal));
    *m
}

/// The minimum of a convex function on `[a, b]`, by golden-section search.
fn argmin_convex(f: &impl Fn(f64) -> f64, mut a: f64, mut b: f64) -> f64 {
    const INV_PHI: f64 = 0.618_033_988_749_895;
    let mut c = b - INV_PHI * (b - a);
    let mut d = a + INV_PHI * (b - a);
    let (mut fc, mut fd) = (f(c), f(d));
    // 0.5 ns is enough; the iteration cap guards inputs where f64 cannot resolve that.
    for _ in 0..200 {
        if b - a <= 0.5 {
            break;
        }
        if fc <= fd {
            b = d;
            d = c;
            fd = fc;
            c = b - INV_PHI * (b - a);
            fc = f(c);
        } else {
            a = c;
            c = d;
            fc = fd;
            d = a + INV_PHI * (b - a);
            fd = f(d);
        }
    }
    0.5 * (a + b)
}

fn clamp_u64(v: i128) -> u64 {
    v.clamp(0, u64::MAX as i128) as u64
}

/// The other host clocks minus [`HostClock::Boottime`], read together at one
/// moment (each checkpoint stores one set).
///
/// `CLOCK_REALTIME` and `CLOCK_MONOTONIC` tick at the same NTP-disciplined rate
/// as `CLOCK_BOOTTIME`, so their differences from it are constant between
/// events: a wall-clock step (settimeofday, an NTP step, a leap second) moves
/// `realtime_ns`, and a suspend moves both. `CLOCK_MONOTONIC_RAW` is not slewed,
/// so its difference creeps at the NTP correction (a few ppm). A
/// [`Calibration`] interpolates these differences between checkpoints: exact
/// for the creep, and a step between two checkpoints is smeared across the
/// interval between them (and seen exactly from the next checkpoint on).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HostOffsets {
    /// `CLOCK_REALTIME − CLOCK_BOOTTIME` (ns).
    pub realtime_ns: i64,
    /// `CLOCK_MONOTONIC − CLOCK_BOOTTIME` (ns).
    pub monotonic_ns: i64,
    /// `CLOCK_MONOTONIC_RAW − CLOCK_BOOTTIME` (ns).
    pub monotonic_raw_ns: i64,
    /// How far each difference may be off (ns): half the gap between the two
    /// BOOTTIME reads that bracket the other clock's read, at worst.
    pub uncertainty_ns: u64,
}

impl HostOffsets {
    /// Reads the clocks now: each other clock between two BOOTTIME reads, the
    /// tightest of 16 tries.
    pub fn measure() -> HostOffsets {
        let mut out = HostOffsets::default();
        for clock in [
            HostClock::Realtime,
            HostClock::Monotonic,
            HostClock::MonotonicRaw,
        ] {
            let mut best: Option<(u64, i64)> = None;
            for _ in 0..16 {
                let b1 = HostClock::Boottime.now_ns();
                let x = clock.now_ns();
                let b2 = HostClock::Boottime.now_ns();
                let gap = b2.saturating_sub(b1);
                let mid = b1 as i128 + (gap / 2) as i128;
                let off = (x as i128 - mid).clamp(i64::MIN as i128, i64::MAX as i128) as i64;
                if best.is_none_or(|(g, _)| gap < g) {
                    best = Some((gap, off));
                }
            }
            let (gap, off) = best.unwrap_or_default();
            match clock {
                HostClock::Realtime => out.realtime_ns = off,
                HostClock::Monotonic => out.monotonic_ns = off,
                _ => out.monotonic_raw_ns = off,
            }
            out.uncertainty_ns = out.uncertainty_ns.max(gap.div_ceil(2) + 1);
        }
        out
    }

    /// `clock − CLOCK_BOOTTIME` (ns); 0 for Boottime itself.
    pub fn of(&self, clock: HostClock) -> i64 {
        match clock {
            HostClock::Realtime => self.realtime_ns,
            HostClock::Monotonic => self.monotonic_ns,
            HostClock::MonotonicRaw => self.monotonic_raw_ns,
            HostClock::Boottime => 0,
        }
    }
}

/// One calibration of a device: its map (device → BOOTTIME) and the host
/// clocks' offsets measured with it.
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    /// Device → `CLOCK_BOOTTIME` map from this calibration's samples.
    pub map: ClockMap,
    /// The other host clocks against BOOTTIME, read right after the samples.
    pub host_offsets: HostOffsets,
}

impl Checkpoint {
    /// A checkpoint from a map, with the host offsets read now.
    pub fn now(map: ClockMap) -> Checkpoint {
        Checkpoint {
            map,
            host_offsets: HostOffsets::measure(),
        }
    }
}

/// The drift between two consecutive checkpoints, for display.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DriftSegment {
    /// Device time of the earlier checkpoint's anchor (ns).
    pub start_device_ns: u64,
    /// Device time of the later checkpoint's anchor (ns).
    pub end_device_ns: u64,
    /// BOOTTIME of the earlier anchor (ns).
    pub start_host_ns: u64,
    /// `host − device` at the earlier anchor (ns).
    pub offset_ns: i64,
    /// Drift of BOOTTIME against the device clock over the segment (ppm).
    pub drift_ppm: f64,
    /// ± uncertainty of `drift_ppm` (ppm): the anchors' bounds over the segment's length.
    pub uncertainty_ppm: f64,
}

/// Device → host mappings for one device over a run: a [`Checkpoint`] per
/// (re)calibration, in device-time order.
///
/// The map is piecewise linear through the checkpoints' anchors. A device time
/// between two anchors is interpolated between them: the drift over the segment
/// is measured over its whole length, and the bound is interpolated between the
/// anchors' bounds (exact if the drift is constant over the segment; a drift
/// that changes by Δk over a segment of length T adds at most Δk·T/8, which
/// frequent checkpoints keep small). Before the first and after the last anchor
/// the nearest segment is extended and the bound grows with the distance. With
/// one checkpoint, its own [`ClockMap`] answers.
///
/// For the tightest bounds, map device times that lie between two checkpoints:
/// recalibrate (cheaply, a few samples) after the work being traced.
///
/// Each `to_host` is a binary search and a few integer operations.
#[derive(Debug, Clone, PartialEq)]
pub struct Calibration {
    checkpoints: Vec<Checkpoint>,
    /// `segments[i]`: the line through the anchors of checkpoints `i` and `i + 1`.
    segments: Vec<Line>,
}

impl Calibration {
    /// A calibration with its first checkpoint.
    pub fn new(first: Checkpoint) -> Calibration {
        Calibration {
            checkpoints: vec![first],
            segments: Vec::new(),
        }
    }

    /// A declared calibration (bound 0, host clocks all equal to BOOTTIME), for
    /// synthetic captures and tests: see [`ClockMap::exact`].
    pub fn exact(device_ns: u64, host_ns: u64, drift_ppm: f64) -> Calibration {
        Calibration::new(Checkpoint {
            map: ClockMap::exact(device_ns, host_ns, drift_ppm),
            host_offsets: HostOffsets::default(),
        })
    }

    /// Adds a recalibration. Its anchor must come after the last one, in device
    /// and in host time.
    pub fn push(&mut self, checkpoint: Checkpoint) -> Result<(), ClockError> {
        let (ld, lh) = self.latest().map.anchor();
        let (nd, nh) = checkpoint.map.anchor();
        if nd <= ld || nh <= lh {
            return Err(ClockError::NotLater { last: ld, next: nd });
        }
        self.segments.push(Line::through(ld, lh, nd, nh));
        self.checkpoints.push(checkpoint);
        Ok(())
    }

    /// Every checkpoint, oldest first (never empty).
    pub fn checkpoints(&self) -> &[Checkpoint] {
        &self.checkpoints
    }

    /// The most recent checkpoint.
    pub fn latest(&self) -> &Checkpoint {
        // Never empty: `new` takes the first checkpoint and nothing removes one.
        &self.checkpoints[self.checkpoints.len() - 1]
    }

    /// Host time on `clock` (ns) of the device reading `device_ns`.
    /// [`HostClock::Boottime`] is the trace clock; see [`HostOffsets`] for how
    /// the others follow from it.
    pub fn to_host(&self, clock: HostClock, device_ns: u64) -> u64 {
        let boot = self.boottime_i128(device_ns);
        let off = match clock {
            HostClock::Boottime => 0,
            other => self.offset_at(other, device_ns),
        };
        clamp_u64(boot + off as i128)
    }

    /// The bound (ns) of [`Calibration::to_host`] on the trace clock (BOOTTIME)
    /// at `device_ns`.
    pub fn bound_ns(&self, device_ns: u64) -> u64 {
        let cps = &self.checkpoints;
        match self.locate(device_ns) {
            Locus::Single => cps[0].map.bound_at(device_ns),
            Locus::Between(i) => {
                let (xa, _) = cps[i].map.anchor();
                let (xb, _) = cps[i + 1].map.anchor();
                let (ba, bb) = (
                    cps[i].map.parts.bound_anchor_ns,
                    cps[i + 1].map.parts.bound_anchor_ns,
                );
                let t = (device_ns - xa) as f64 / (xb - xa) as f64;
                (ba as f64 + (bb as f64 - ba as f64) * t).ceil() as u64
            }
            Locus::Before | Locus::After => {
                let (i, near) = if matches!(self.locate(device_ns), Locus::Before) {
                    (0, 0)
                } else {
                    (cps.len() - 2, cps.len() - 1)
                };
                let (xa, _) = cps[i].map.anchor();
                let (xb, _) = cps[i + 1].map.anchor();
                let (ba, bb) = (
                    cps[i].map.parts.bound_anchor_ns,
                    cps[i + 1].map.parts.bound_anchor_ns,
                );
                let (xn, _) = cps[near].map.anchor();
                let dist = device_ns.abs_diff(xn) as f64;
                let grow = (ba + bb) as f64 * dist / (xb - xa) as f64;
                cps[near]
                    .map
                    .parts
                    .bound_anchor_ns
                    .saturating_add(grow.ceil().min(u64::MAX as f64) as u64)
            }
        }
    }

    /// The bound (ns) on `clock`: [`Calibration::bound_ns`] plus the
    /// uncertainty of the host offsets for clocks other than BOOTTIME.
    pub fn bound_ns_on(&self, clock: HostClock, device_ns: u64) -> u64 {
        let b = self.bound_ns(device_ns);
        if clock == HostClock::Boottime {
            return b;
        }
        let (i, j) = self.neighbours(device_ns);
        let unc = self.checkpoints[i]
            .host_offsets
            .uncertainty_ns
            .max(self.checkpoints[j].host_offsets.uncertainty_ns);
        b.saturating_add(unc)
    }

    /// The drift between consecutive checkpoints, oldest first (empty with one
    /// checkpoint: then the map's own [`ClockMap::drift_ppm`] is all there is).
    pub fn drift_history(&self) -> Vec<DriftSegment> {
        self.checkpoints
            .windows(2)
            .map(|w| {
                let (xa, ya) = w[0].map.anchor();
                let (xb, yb) = w[1].map.anchor();
                let dx = (xb - xa) as f64;
                let (ba, bb) = (
                    w[0].map.parts.bound_anchor_ns,
                    w[1].map.parts.bound_anchor_ns,
                );
                DriftSegment {
                    start_device_ns: xa,
                    end_device_ns: xb,
                    start_host_ns: ya,
                    offset_ns: w[0].map.offset_ns(),
                    drift_ppm: ((yb as i128 - ya as i128) as f64 - dx) / dx * 1e6,
                    uncertainty_ppm: (ba + bb) as f64 / dx * 1e6,
                }
            })
            .collect()
    }

    /// The checkpoints needed to map device times in `[lo, hi]`: a smaller
    /// calibration that answers exactly as this one does there (a batch carries
    /// this rather than a whole run's history).
    pub fn slice(&self, lo: u64, hi: u64) -> Calibration {
        let n = self.checkpoints.len();
        if n == 1 {
            return self.clone();
        }
        let anchors_le = |d: u64| self.checkpoints.partition_point(|c| c.map.anchor().0 <= d);
        let first = anchors_le(lo).saturating_sub(1).min(n - 2);
        let last = anchors_le(hi.max(lo)).clamp(first + 1, n - 1);
        Calibration {
            checkpoints: self.checkpoints[first..=last].to_vec(),
            segments: self.segments[first..last].to_vec(),
        }
    }

    /// A [`Mapper`] for device times in `[lo, hi]`: the segment of `lo` is
    /// looked up once, and device times in it map without a search.
    pub fn mapper(&self, lo: u64, hi: u64) -> Mapper<'_> {
        let seg = self.segment(lo);
        // The last device time that falls in `lo`'s segment (see `locate`).
        let end = match seg {
            Some(i) if i + 2 < self.checkpoints.len() => self.checkpoints[i + 1].map.anchor().0 - 1,
            _ => u64::MAX,
        };
        Mapper {
            calibration: self,
            lo,
            span: hi.min(end).saturating_sub(lo),
            line: *self.line(seg),
        }
    }

    /// The segment whose line maps `device_ns` (`None`: the single map's).
    fn segment(&self, device_ns: u64) -> Option<usize> {
        match self.locate(device_ns) {
            Locus::Single => None,
            Locus::Between(i) => Some(i),
            Locus::Before => Some(0),
            Locus::After => Some(self.checkpoints.len() - 2),
        }
    }

    fn line(&self, segment: Option<usize>) -> &Line {
        match segment {
            None => &self.checkpoints[0].map.line,
            Some(i) => &self.segments[i],
        }
    }

    /// BOOTTIME of `device_ns`, unclamped.
    fn boottime_i128(&self, device_ns: u64) -> i128 {
        self.line(self.segment(device_ns)).at(device_ns)
    }

    /// `clock − BOOTTIME` at `device_ns`, interpolated between the neighbouring checkpoints.
    fn offset_at(&self, clock: HostClock, device_ns: u64) -> i64 {
        let (i, j) = self.neighbours(device_ns);
        let (a, b) = (&self.checkpoints[i], &self.checkpoints[j]);
        let (oa, ob) = (a.host_offsets.of(clock), b.host_offsets.of(clock));
        if i == j || oa == ob {
            return oa;
        }
        let (xa, _) = a.map.anchor();
        let (xb, _) = b.map.anchor();
        let t = ((device_ns as f64 - xa as f64) / (xb - xa) as f64).clamp(0.0, 1.0);
        // The offsets themselves are too large for f64 to keep nanoseconds: only their difference is scaled.
        let step = ((ob as i128 - oa as i128) as f64 * t).round() as i128;
        (oa as i128 + step).clamp(i64::MIN as i128, i64::MAX as i128) as i64
    }

    /// The checkpoints whose host offsets apply at `device_ns` (the same one twice outside the anchors).
    fn neighbours(&self, device_ns: u64) -> (usize, usize) {
        match self.locate(device_ns) {
            Locus::Single | Locus::Before => (0, 0),
            Locus::After => (self.checkpoints.len() - 1, self.checkpoints.len() - 1),
            Locus::Between(i) => (i, i + 1),
        }
    }

    fn locate(&self, device_ns: u64) -> Locus {
        let n = self.checkpoints.len();
        if n == 1 {
            return Locus::Single;
        }
        match self
            .checkpoints
            .partition_point(|c| c.map.anchor().0 <= device_ns)
        {
            0 => Locus::Before,
            i if i == n => {
                if self.checkpoints[n - 1].map.anchor().0 == device_ns {
                    Locus::Between(n - 2)
                } else {
                    Locus::After
                }
            }
            i => Locus::Between(i - 1),
        }
    }
}

/// Where a device time falls among a calibration's anchors.
enum Locus {
    /// There is one checkpoint.
    Single,
    /// Before the first anchor.
    Before,
    /// Between anchors `i` and `i + 1` (inclusive).
    Between(usize),
    /// After the last anchor.
    After,
}

/// [`Calibration::to_host`] on [`HostClock::Boottime`] for many device times
/// in one window (a batch's), from [`Calibration::mapper`]: the same answers,
/// without a checkpoint search or a floating-point operation per call for
/// the times that fall in the window's first segment (all of them, unless a
/// recalibration lies inside the window).
#[derive(Debug, Clone, Copy)]
pub struct Mapper<'a> {
    calibration: &'a Calibration,
    /// The device times `lo ..= lo + span` lie in `line`'s segment.
    lo: u64,
    span: u64,
    line: Line,
}

impl Mapper<'_> {
    /// BOOTTIME (ns) of the device reading `device_ns`: exactly
    /// `calibration.to_host(HostClock::Boottime, device_ns)`.
    #[inline]
    pub fn boottime(&self, device_ns: u64) -> u64 {
        if device_ns.wrapping_sub(self.lo) <= self.span {
            clamp_u64(self.line.at(device_ns))
        } else {
            self.calibration.to_host(HostClock::Boottime, device_ns)
        }
    }
}

/// A device → BOOTTIME line, `y = y0 + t + round(t · slope)` with
/// `t = x − x0`: every mapping of this module is one (a [`ClockMap`]'s, or a
/// [`Calibration`] segment's), so that every caller gets the same rounding.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Line {
    x0: u64,
    y0: u64,
    slope: Slope,
}

/// The slope of a [`Line`] minus 1: the drift.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Slope {
    /// In units of 2⁻⁶⁴, |slope| < 1/4: every real clock. `t · slope` is then
    /// one integer multiply, exact for any `t` (|t| < 2⁶⁴, the product < 2¹²⁶)
    /// and the slope itself is within 2⁻⁶⁵ of the exact one, so the result is
    /// within 1 ns of the exactly rounded line even 2⁶⁴ ns from its origin.
    Fixed(i64),
    /// A slope no clock has (a checkpoint pair or a declared drift ≥ 25 %):
    /// evaluated in floating point; nothing depends on its precision.
    Float(f64),
}

impl Slope {
    /// A drift given as a ratio (host ns per device ns, minus 1).
    fn of_drift(drift: f64) -> Slope {
        if drift.abs() < 0.25 {
            Slope::Fixed((drift * TWO_64).round() as i64)
        } else if drift.is_finite() {
            Slope::Float(drift)
        } else {
            Slope::Fixed(0)
        }
    }
}

/// 2⁶⁴, the scale of [`Slope::Fixed`].
const TWO_64: f64 = 18_446_744_073_709_551_616.0;

impl Line {
    fn new(x0: u64, y0: u64, slope: Slope) -> Line {
        Line { x0, y0, slope }
    }

    /// The line through `(xa, ya)` and `(xb, yb)`, xa < xb, with its slope
    /// from the exact ratio `((yb − ya) − (xb − xa)) / (xb − xa)`.
    fn through(xa: u64, ya: u64, xb: u64, yb: u64) -> Line {
        let dx = xb as i128 - xa as i128;
        let excess = (yb as i128 - ya as i128) - dx;
        let slope = if excess.abs() < dx / 4 {
            // |excess| < 2⁶², so the shift cannot overflow, and the quotient is < 2⁶².
            Slope::Fixed(div_round(excess << 64, dx) as i64)
        } else {
            Slope::Float(excess as f64 / dx as f64)
        };
        Line::new(xa, ya, slope)
    }

    /// The line at `x`, rounded to the nearest ns (halves up).
    #[inline]
    fn at(&self, x: u64) -> i128 {
        let t = x as i128 - self.x0 as i128;
        let corr = match self.slope {
            Slope::Fixed(k) => (t * k as i128 + (1 << 63)) >> 64,
            Slope::Float(k) => (t as f64 * k).round() as i128,
        };
        self.y0 as i128 + t + corr
    }
}

/// `n / d` rounded to nearest (d > 0).
fn div_round(n: i128, d: i128) -> i128 {
    if n >= 0 {
        (n + d / 2) / d
    } else {
        -((-n + d / 2) / d)
    }
}

#[cfg(test)]
mod tests {
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
                if rng.next() % 2 == 0 {
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
    fn long_run(
        seed: u64,
        every: f64,
        bursts: usize,
        drift_rate: f64,
    ) -> (SimClock, Calibration, Rng) {
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
}
