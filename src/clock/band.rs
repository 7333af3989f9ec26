//! The robust fit's internals: the band of consistent lines, order statistics, Theil–Sen.

use std::cmp::Ordering;

/// One sample as a constraint on the offset `f(x) − x` at device time `x`
/// (all relative to the fit's bases).
pub(super) struct Constraint {
    pub(super) x: f64,
    pub(super) lo: f64,
    pub(super) hi: f64,
}

impl Constraint {
    pub(super) fn mid(&self) -> f64 {
        0.5 * (self.lo + self.hi)
    }

    /// How far the value `y` lies outside `[lo, hi]` (0 inside).
    pub(super) fn violation(&self, y: f64) -> f64 {
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
pub(super) struct Band {
    /// Feasible cells: slope at the cell's centre, lowest and highest `a` there.
    pub(super) cells: Vec<(f64, f64, f64)>,
    /// Half a cell's width (in s).
    pub(super) h: f64,
    /// Largest |u_i|.
    pub(super) umax: f64,
}

impl Band {
    /// Points per refinement pass, points of the final pass, and the most passes.
    const GRID: usize = 64;
    const GRID_FINAL: usize = 512;
    const PASSES: usize = 12;

    /// The band, or `None` when no line violates at most `r` constraints per side
    /// with a slope in `[−s_lim, s_lim]`.
    pub(super) fn new(
        cons: &[&Constraint],
        centre: f64,
        half: f64,
        r: usize,
        s_lim: f64,
    ) -> Option<Band> {
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
    pub(super) fn at(&self, u: f64) -> (f64, f64) {
        let slack = self.h * (self.umax + u.abs());
        let (lo, hi) = self.cells.iter().fold(
            (f64::INFINITY, f64::NEG_INFINITY),
            |(lo, hi), &(s, l, h)| (lo.min(l + s * u), hi.max(h + s * u)),
        );
        (lo - slack, hi + slack)
    }

    /// The smallest and largest slope in the band.
    pub(super) fn slope_range(&self) -> (f64, f64) {
        (
            self.cells[0].0 - self.h,
            self.cells[self.cells.len() - 1].0 + self.h,
        )
    }
}

/// The (r+1)-th smallest of the lines `v − s·u` at slope `s`.
pub(super) fn kth_line(lines: &[(f64, f64)], s: f64, r: usize, scratch: &mut Vec<f64>) -> f64 {
    scratch.clear();
    scratch.extend(lines.iter().map(|&(v, u)| v - s * u));
    kth_smallest(scratch, r)
}

/// The lines that can be among the (r+1) smallest anywhere on slopes
/// `mid ± delta` (a line moves by at most `delta·|u|` from its value at `mid`).
pub(super) fn prune(
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
pub(super) fn kth_smallest(v: &mut [f64], k: usize) -> f64 {
    let k = k.min(v.len() - 1);
    *v.select_nth_unstable_by(k, |a, b| a.partial_cmp(b).unwrap_or(Ordering::Equal))
        .1
}

/// Theil–Sen line through the constraints' midpoints: slope (clamped to
/// ±`k_max`) and value at x = 0. At most 256 points, spread over the window,
/// keep it cheap for large bursts.
pub(super) fn theil_sen(cons: &[Constraint], k_max: f64) -> (f64, f64) {
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
pub(super) fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mid = v.len() / 2;
    let (_, m, _) =
        v.select_nth_unstable_by(mid, |a, b| a.partial_cmp(b).unwrap_or(Ordering::Equal));
    *m
}

/// The minimum of a convex function on `[a, b]`, by golden-section search.
pub(super) fn argmin_convex(f: &impl Fn(f64) -> f64, mut a: f64, mut b: f64) -> f64 {
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
