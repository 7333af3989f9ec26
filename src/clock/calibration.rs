//! A run's calibration: checkpoints, piecewise mapping, drift history.

use super::fit::clamp_u64;
use super::line::Line;
use super::{ClockError, ClockMap, HostClock, HostOffsets};

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
