//! The SVG timeline's picture, built one launch at a time and kept binned.
//!
//! When a launch is added, its warps get lanes in their SM's row, their phases
//! are flattened (a nested phase hides its parent) and binned over the launch's
//! own window; what is kept (a [`Layer`]) is, per lane and event type, the runs
//! of bins that the type covers equally, never the events. Drawing resamples
//! the layers onto one time axis and gives each bin the type that covers most
//! of it. Keeping the coverage of every type, rather than only the dominant
//! one, is what lets a launch binned coarsely on its own axis still be drawn
//! right when it is resampled. Memory is bounded by the picture: at most
//! `KEEP × max_rects` runs and `max_rects` marks a launch, and the layers are
//! merged into one whenever they hold more than twice that.
//!
//! Binning costs O(pieces · log) per pass whatever the number of event types:
//! a sweep over each lane's pieces keeps the coverage of the pieces open across
//! whole bins (a map from type to weight, and the heaviest in a sorted set) and
//! adds the partly covered edge bins of each piece as it reaches them.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

/// The narrowest plot area [`SvgOptions::width`] gives (narrower is widened).
pub const MIN_SVG_WIDTH: u32 = 100;
/// The widest plot area [`SvgOptions::width`] gives (wider is narrowed): the
/// finest bins are four a pixel, so the work of drawing grows with the width.
pub const MAX_SVG_WIDTH: u32 = 20_000;
/// The most lanes an SM row can have, whatever [`SvgOptions::max_lanes_per_sm`] says.
const LANES_CAP: u32 = 64;

/// How to draw the SVG timeline.
#[derive(Debug, Clone)]
pub struct SvgOptions {
    /// Width of the plot area in pixels (the picture adds margins), within
    /// [`MIN_SVG_WIDTH`]`..=`[`MAX_SVG_WIDTH`].
    pub width: u32,
    /// Most rectangles to draw, events and instants together. Bins get wider
    /// (down to 64 per lane) until the picture fits.
    pub max_rects: usize,
    /// Most lanes (concurrent warps) per SM row, at most 64; warps beyond it
    /// share lanes.
    pub max_lanes_per_sm: u32,
    /// Give each rectangle a tooltip (`<title>`: type, start, end, SM) when
    /// the picture has at most this many (tooltips triple the size).
    pub tooltips_up_to: usize,
}

impl Default for SvgOptions {
    fn default() -> Self {
        SvgOptions {
            width: 1600,
            max_rects: 100_000,
            max_lanes_per_sm: 8,
            tooltips_up_to: 20_000,
        }
    }
}

impl SvgOptions {
    /// The options with every field in its range.
    fn bounded(mut self) -> SvgOptions {
        self.width = self.width.clamp(MIN_SVG_WIDTH, MAX_SVG_WIDTH);
        self.max_rects = self.max_rects.max(1);
        self.max_lanes_per_sm = self.max_lanes_per_sm.clamp(1, LANES_CAP);
        self
    }
}

/// A launch's runs are kept at up to this many times the picture's budget
/// (`max_rects`), so that resampling them onto the whole picture's axis, where
/// they shrink, still has detail to draw from.
pub(super) const KEEP: usize = 8;

/// The most layers kept before they are merged, whatever they hold: each
/// costs a step of the merge that resamples them.
const MAX_LAYERS: usize = 64;

/// Opacity levels of a partly covered bin; quantized so that neighbours merge.
pub(super) const LEVELS: u8 = 4;

/// A whole bin's coverage in the weights of [`Piece`] and of kept runs.
pub(super) const FULL: u16 = 1 << 12;

/// Coverage of type `k` (an event id, [`OTHER_TYPES`], or a colour slot) over `[a, b)`, in ns
/// from the start of the window being binned, with weight `w` ([`FULL`]: a
/// phase; less: a kept run whose bins the type covers in part).
#[derive(Debug, Clone, Copy)]
pub(super) struct Piece {
    pub(super) sm: u32,
    pub(super) lane: u32,
    pub(super) a: f64,
    pub(super) b: f64,
    pub(super) k: u32,
    pub(super) w: u16,
}

/// In what is kept, the types of a bin past its [`TYPES_KEPT`] heaviest, together.
pub(super) const OTHER_TYPES: u32 = 1 << 16;

/// Types whose coverage a kept bin gives one by one: as many as the palette
/// has colours, so that a picture of few types loses nothing, and what is kept
/// of a lane is bounded by its bins whatever the number of types.
const TYPES_KEPT: usize = 10;

/// Bins `[start, end)` of lane `lane` of SM `sm` and type `k`: drawn, `level`
/// is the opacity (1 to [`LEVELS`]); kept in a layer, it is how much of each
/// bin the type covers (in 1/[`FULL`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Run {
    pub(super) sm: u32,
    pub(super) lane: u32,
    pub(super) start: u32,
    pub(super) end: u32,
    pub(super) k: u32,
    pub(super) level: u16,
}

/// What a binning pass gives per bin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Cells {
    /// The dominant type and an opacity level: what is drawn.
    Dominant,
    /// Every type's coverage: what is kept, to resample later.
    Coverage,
}

/// An instant: lane, device time, type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Mark {
    pub(super) sm: u32,
    pub(super) lane: u32,
    pub(super) t: u64,
    pub(super) k: u16,
}

/// What is kept of one launch (or of several, merged): its window, its
/// coverage runs at `bins` bins over the window, types by event id, and its
/// instants.
#[derive(Debug, Clone)]
struct Layer {
    /// The axis its bins divide.
    t0: u64,
    t1: u64,
    /// The time its launch (or part) covers, within the axis: what the picture's
    /// window spans.
    extent: (u64, u64),
    bins: u32,
    runs: Vec<Run>,
    marks: Vec<Mark>,
}

impl Layer {
    fn bin_ns(&self) -> f64 {
        span(self.t0, self.t1) / f64::from(self.bins)
    }
}

/// The window's length in ns, at least 1.
fn span(t0: u64, t1: u64) -> f64 {
    t1.saturating_sub(t0).max(1) as f64
}

/// The picture so far: lanes in use per SM and the binned launches.
#[derive(Debug, Clone)]
pub(super) struct Picture {
    options: SvgOptions,
    /// Per SM, when each of its lanes frees (the latest `last_ts` drawn in it).
    lane_end: BTreeMap<u32, Vec<u64>>,
    lanes_per_sm: u32,
    layers: Vec<Layer>,
    /// Runs and marks in `layers`.
    stored: usize,
    /// Merge the layers when `stored` passes this.
    merge_at: usize,
    /// Instants not kept (over a launch's budget).
    cut: u64,
}

/// A picture resampled onto one axis, ready to draw.
pub(super) struct Fitted {
    pub(super) t0: u64,
    pub(super) dur: f64,
    pub(super) bins: u32,
    pub(super) runs: Vec<Run>,
}

impl Picture {
    pub(super) fn new(options: SvgOptions) -> Picture {
        let options = options.bounded();
        Picture {
            merge_at: 2 * KEEP * options.max_rects,
            options,
            lane_end: BTreeMap::new(),
            lanes_per_sm: 1,
            layers: Vec::new(),
            stored: 0,
            cut: 0,
        }
    }

    pub(super) fn options(&self) -> &SvgOptions {
        &self.options
    }

    pub(super) fn lanes_per_sm(&self) -> u32 {
        self.lanes_per_sm
    }

    /// Runs and marks kept.
    #[cfg(test)]
    pub(super) fn stored(&self) -> usize {
        self.stored
    }

    /// Instants left out for the budget while adding launches.
    pub(super) fn cut(&self) -> u64 {
        self.cut
    }

    /// Every instant kept.
    pub(super) fn marks(&self) -> impl Iterator<Item = &Mark> {
        self.layers.iter().flat_map(|l| &l.marks)
    }

    /// The window over all launches: earliest warp start, latest flush.
    pub(super) fn window(&self) -> Option<(u64, u64)> {
        let t0 = self.layers.iter().map(|l| l.extent.0).min()?;
        let t1 = self.layers.iter().map(|l| l.extent.1).max()?;
        Some((t0, t1.max(t0)))
    }

    /// A lane in SM `sm`'s row for a warp running `[first_ts, last_ts]`; call it
    /// for one SM's warps in increasing `first_ts`. The warp takes the first
    /// lane that is free when it starts (interval colouring), so concurrent
    /// warps stack and warps that follow each other share a lane; past the cap,
    /// it shares the lane that frees first.
    pub(super) fn assign_lane(&mut self, sm: u32, first_ts: u64, last_ts: u64) -> u32 {
        let ends = self.lane_end.entry(sm).or_default();
        let lane = match ends.iter().position(|&end| end <= first_ts) {
            Some(l) => l,
            None if (ends.len() as u32) < self.options.max_lanes_per_sm => {
                ends.push(0);
                ends.len() - 1
            }
            None => {
                let (l, _) = ends
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, &e)| e)
                    .unwrap_or((0, &0));
                l
            }
        };
        ends[lane] = ends[lane].max(last_ts);
        self.lanes_per_sm = self.lanes_per_sm.max(ends.len() as u32);
        lane as u32
    }

    /// Keeps lane `lane` of SM `sm` for a warp that had it in an earlier part of
    /// its launch and runs until `last_ts` now; returns it.
    pub(super) fn keep_lane(&mut self, sm: u32, lane: u32, last_ts: u64) -> u32 {
        let ends = self.lane_end.entry(sm).or_default();
        let at = lane as usize;
        if ends.len() <= at {
            ends.resize(at + 1, 0);
        }
        ends[at] = ends[at].max(last_ts);
        self.lanes_per_sm = self.lanes_per_sm.max(ends.len() as u32);
        lane
    }

    /// Bins one launch (or a part of one) that covers `extent` over the axis
    /// `[t0, t1]` (its window, or, for a part, a longer one: a part binned on
    /// its launch's axis adds few runs): its pieces (types by event id,
    /// `a`/`b` from `t0`) and its instants. Keeps at most `KEEP × max_rects`
    /// runs (unless even 64 bins a lane hold more) and `max_rects` instants.
    pub(super) fn add_launch(
        &mut self,
        (t0, t1): (u64, u64),
        extent: (u64, u64),
        mut pieces: Vec<Piece>,
        marks: Vec<Mark>,
    ) {
        group_by_lane(&mut pieces);
        let (bins, runs) = fit(
            &lanes_of(&pieces),
            pieces.len(),
            span(t0, t1),
            4 * self.options.width,
            KEEP * self.options.max_rects,
            Cells::Coverage,
        );
        drop(pieces);
        let marks = self.thin_marks(t0, t1, marks);
        self.stored += runs.len() + marks.len();
        self.layers.push(Layer {
            t0,
            t1,
            extent,
            bins,
            runs,
            marks,
        });
        if self.stored > self.merge_at || self.layers.len() > MAX_LAYERS {
            self.merge();
        }
    }

    /// One mark per (lane, pixel of `[t0, t1]`, type), at most `max_rects`.
    fn thin_marks(&mut self, t0: u64, t1: u64, mut marks: Vec<Mark>) -> Vec<Mark> {
        let scale = f64::from(self.options.width) / span(t0, t1);
        let pixel = |m: &Mark| (m.t.saturating_sub(t0) as f64 * scale) as u64;
        marks.sort_unstable_by_key(|m| (m.sm, m.lane, pixel(m), m.k));
        marks.dedup_by_key(|m| (m.sm, m.lane, pixel(m), m.k));
        let keep = self.options.max_rects;
        self.cut += marks.len().saturating_sub(keep) as u64;
        marks.truncate(keep);
        marks
    }

    /// Folds every layer into one over their joint window, at the finest
    /// bins that fit the budget.
    fn merge(&mut self) {
        let Some((t0, t1)) = self.window() else {
            return;
        };
        let (bins, runs) = self.resample(
            t0,
            t1,
            KEEP * self.options.max_rects,
            Cells::Coverage,
            |k| k,
        );
        let marks: Vec<Mark> = self.layers.drain(..).flat_map(|l| l.marks).collect();
        let marks = self.thin_marks(t0, t1, marks);
        self.stored = runs.len() + marks.len();
        // A picture that does not fit even at the coarsest bins merges again
        // only once it has doubled, not at every launch.
        self.merge_at = 2 * self.stored.max(KEEP * self.options.max_rects);
        self.layers.push(Layer {
            t0,
            t1,
            extent: (t0, t1),
            bins,
            runs,
            marks,
        });
    }

    /// The layers' runs over `[t0, t1]` at the finest bins that fit the
    /// budget and that the layers resolve, types mapped through `key`: `cells`
    /// says whether to keep every type's coverage or draw the dominant one.
    fn resample(
        &self,
        t0: u64,
        t1: u64,
        budget: usize,
        cells: Cells,
        key: impl Fn(u32) -> u32,
    ) -> (u32, Vec<Run>) {
        let dur = span(t0, t1);
        let finest = self
            .layers
            .iter()
            .map(|l| snap(dur / l.bin_ns()).ceil().min(f64::from(u32::MAX)) as u32)
            .max()
            .unwrap_or(1)
            .min(4 * self.options.width);
        let piece = |l: &Layer, r: &Run| {
            let (bin_ns, from) = (l.bin_ns(), l.t0.saturating_sub(t0) as f64);
            Piece {
                sm: r.sm,
                lane: r.lane,
                a: from + f64::from(r.start) * bin_ns,
                b: from + f64::from(r.end) * bin_ns,
                k: key(r.k),
                w: r.level,
            }
        };
        // Lane by lane, merging the layers (each holds its runs lane by lane,
        // in order), so that only one lane's pieces exist at a time.
        let lanes = |visit: &mut Visit<'_>| {
            let mut at = vec![0usize; self.layers.len()];
            let mut next: BinaryHeap<Reverse<(u32, u32, usize)>> = self
                .layers
                .iter()
                .enumerate()
                .filter_map(|(i, l)| l.runs.first().map(|r| Reverse((r.sm, r.lane, i))))
                .collect();
            let mut pieces = Vec::new();
            while let Some(&Reverse((sm, lane, _))) = next.peek() {
                pieces.clear();
                while let Some(&Reverse((_, _, i))) =
                    next.peek().filter(|Reverse(n)| (n.0, n.1) == (sm, lane))
                {
                    next.pop();
                    let l = &self.layers[i];
                    let runs = &l.runs[at[i]..];
                    let n = runs.partition_point(|r| (r.sm, r.lane) == (sm, lane));
                    pieces.extend(runs[..n].iter().map(|r| piece(l, r)));
                    at[i] += n;
                    if let Some(r) = runs.get(n) {
                        next.push(Reverse((r.sm, r.lane, i)));
                    }
                }
                if !visit(&pieces) {
                    return;
                }
            }
        };
        let total = self.layers.iter().map(|l| l.runs.len()).sum();
        fit(&lanes, total, dur, finest, budget, cells)
    }

    /// The whole picture on one axis, types mapped through `key` (colour slots).
    pub(super) fn fitted(&self, key: impl Fn(u32) -> u32) -> Option<Fitted> {
        let (t0, t1) = self.window()?;
        let (bins, runs) = self.resample(t0, t1, self.options.max_rects, Cells::Dominant, key);
        Some(Fitted {
            t0,
            dur: span(t0, t1),
            bins,
            runs,
        })
    }
}

/// Brings each lane's pieces together (the sweep needs no order within a
/// lane). A stable sort: a launch's pieces come SM by SM, each SM's lane by
/// lane, so it is about linear here.
fn group_by_lane(pieces: &mut [Piece]) {
    pieces.sort_by_key(|p| (p.sm, p.lane));
}

/// Pieces grouped by lane, as [`fit`] and [`bin_runs`] visit them.
pub(super) fn lanes_of(pieces: &[Piece]) -> impl Fn(&mut Visit<'_>) + '_ {
    move |visit| {
        for lane in pieces.chunk_by(|p, q| (p.sm, p.lane) == (q.sm, q.lane)) {
            if !visit(lane) {
                return;
            }
        }
    }
}

/// What is done with one lane's pieces; `false` stops the pass.
pub(super) type Visit<'a> = dyn FnMut(&[Piece]) -> bool + 'a;

/// Something that gives each lane's pieces in turn, lanes in increasing
/// `(sm, lane)` (a pass may be made several times).
pub(super) type Lanes<'a> = dyn Fn(&mut Visit<'_>) + 'a;

/// The finest bin count, from `finest` down to 64, whose runs fit `budget`,
/// within about 10%: the finest if it fits; otherwise a count scaled from how
/// far over the budget a pass went (runs grow about in proportion to the
/// bins), refined up or down, six passes at most. A pass stops as soon as it
/// is over the budget, so no more than a budget of runs (and one lane's) is
/// ever made. What overflows even at 64 bins is returned whole (the drawing
/// cuts it and says so). `pieces` is how many pieces the lanes hold.
pub(super) fn fit(
    lanes: &Lanes<'_>,
    pieces: usize,
    dur: f64,
    finest: u32,
    budget: usize,
    cells: Cells,
) -> (u32, Vec<Run>) {
    let finest = finest.max(1);
    let coarsest = finest.min(64);
    let (mut bins, mut over) = (finest, finest + 1);
    let mut best: Option<(u32, Vec<Run>)> = None;
    for _ in 0..6 {
        let scaled = |runs: f64, margin: f64| {
            (f64::from(bins) * budget as f64 / runs.max(1.0) * margin).min(f64::from(u32::MAX))
                as u32
        };
        let next = match bin_runs(lanes, dur, bins, cells, Some((budget, pieces))) {
            Ok(runs) => {
                let next = scaled(runs.len() as f64, 0.95).min(over - 1);
                best = Some((bins, runs));
                // Close enough to the budget, or to what does not fit.
                if next <= bins + bins / 10 {
                    break;
                }
                next
            }
            Err(runs) => {
                over = bins;
                let floor = best.as_ref().map_or(coarsest, |b| b.0);
                let next = scaled(runs, 0.9).min(bins - 1);
                if next <= floor {
                    break;
                }
                next
            }
        };
        bins = next;
    }
    best.unwrap_or_else(|| {
        let runs = bin_runs(lanes, dur, coarsest, cells, None).unwrap_or_default();
        (coarsest, runs)
    })
}

/// `x` rounded when it is an integer but for rounding errors, so that a run
/// resampled onto its own bins lands on them exactly.
fn snap(x: f64) -> f64 {
    let r = x.round();
    if (x - r).abs() <= 1e-9 * r.abs().max(1.0) {
        r
    } else {
        x
    }
}

/// Bins pieces grouped by lane at `bins` bins over `[0, dur)`, lane by lane:
/// the runs of bins that share their dominant type and opacity level, or
/// those that share a type's coverage. With `limit = (budget, pieces)`, stops
/// once past `budget` runs and gives how many the whole pass would have made,
/// scaled from the share of the `pieces` done.
pub(super) fn bin_runs(
    lanes: &Lanes<'_>,
    dur: f64,
    bins: u32,
    cells: Cells,
    limit: Option<(usize, usize)>,
) -> Result<Vec<Run>, f64> {
    let bin_ns = dur / f64::from(bins);
    let (budget, pieces) = limit.unwrap_or((usize::MAX, 0));
    let (mut runs, mut done) = (Vec::new(), 0usize);
    let mut sweep = Sweep::default();
    lanes(&mut |lane| {
        if !lane.is_empty() {
            sweep.lane(lane, bin_ns, bins, cells, &mut runs);
        }
        done += lane.len();
        runs.len() <= budget
    });
    if runs.len() <= budget {
        Ok(runs)
    } else {
        Err(runs.len() as f64 * pieces.max(done) as f64 / done.max(1) as f64)
    }
}

/// What changes at a bin: a piece starts or stops covering whole bins, or
/// covers part of that bin alone.
#[derive(Debug, Clone, Copy)]
enum Change {
    /// Type `k` covers the bins from here on with weight `w` (negative: stops).
    Whole(i32),
    /// Type `k` covers this bin by this much (in 1/FULL of the bin).
    Part(f64),
}

/// The scratch state of a sweep, kept between lanes to reuse its memory.
#[derive(Default)]
struct Sweep {
    changes: Vec<(u32, Change, u32)>,
    /// Whole-bin weight per type, and the same ordered by weight (ties: lowest type).
    whole: BTreeMap<u32, i32>,
    heaviest: BTreeSet<(i32, Reverse<u32>)>,
    whole_sum: i32,
    /// Partial coverage of the current bin, per type.
    parts: Vec<(u32, f64)>,
    /// Each type's coverage of the current bin (`Cells::Coverage`).
    types: Vec<(u32, u16)>,
    /// The runs still growing: one (`Cells::Dominant`) or one per type, by type.
    open: Vec<Run>,
    still_open: Vec<Run>,
}

impl Sweep {
    fn lane(
        &mut self,
        pieces: &[Piece],
        bin_ns: f64,
        bins: u32,
        cells: Cells,
        runs: &mut Vec<Run>,
    ) {
        let (sm, lane) = (pieces[0].sm, pieces[0].lane);
        self.changes.clear();
        for p in pieces {
            let fa = snap(p.a / bin_ns).max(0.0);
            let fb = snap(p.b / bin_ns).max(fa);
            let first = (fa.floor() as u32).min(bins - 1);
            let last = (fb.ceil() as u32).clamp(first + 1, bins);
            let w = f64::from(p.w);
            let cover = |bin: u32| (fb.min(f64::from(bin + 1)) - fa.max(f64::from(bin))).max(0.0);
            // In increasing bin, so that pieces in time order give changes in order.
            self.changes
                .push((first, Change::Part(cover(first) * w), p.k));
            if last - first >= 3 {
                self.changes
                    .push((first + 1, Change::Whole(i32::from(p.w)), p.k));
                self.changes
                    .push((last - 1, Change::Whole(-i32::from(p.w)), p.k));
            }
            if last - first >= 2 {
                self.changes
                    .push((last - 1, Change::Part(cover(last - 1) * w), p.k));
            }
        }
        // Every change of a bin is applied before the bin is read: order within
        // one is free. Pieces mostly come in time order, so the changes mostly
        // are already.
        if !self.changes.is_sorted_by_key(|c| c.0) {
            self.changes.sort_by_key(|c| c.0);
        }
        let at = |r: Run| Run { sm, lane, ..r };
        let mut i = 0;
        while i < self.changes.len() {
            let bin = self.changes[i].0;
            self.parts.clear();
            while i < self.changes.len() && self.changes[i].0 == bin {
                let (_, change, k) = self.changes[i];
                match change {
                    Change::Whole(dw) => self.add_whole(k, dw),
                    Change::Part(c) => self.parts.push((k, c)),
                }
                i += 1;
            }
            self.parts.sort_unstable_by_key(|p| p.0);
            self.emit(runs, cells, bin, bin + 1, at);
            // Until the next change, only whole-bin coverage remains.
            let next = self.changes.get(i).map_or(bins, |c| c.0);
            if next > bin + 1 {
                self.parts.clear();
                self.emit(runs, cells, bin + 1, next, at);
            }
        }
        runs.append(&mut self.open);
        debug_assert!(self.whole.is_empty() && self.whole_sum == 0);
    }

    fn add_whole(&mut self, k: u32, dw: i32) {
        let w = self.whole.entry(k).or_insert(0);
        self.heaviest.remove(&(*w, Reverse(k)));
        *w += dw;
        self.whole_sum += dw;
        if *w == 0 {
            self.whole.remove(&k);
        } else {
            self.heaviest.insert((*w, Reverse(k)));
        }
    }

    /// The dominant type and opacity level of a bin with the current whole
    /// coverage and `parts`; `None` if (almost) nothing covers it.
    fn dominant(&self) -> Option<(u32, u16)> {
        let mut best: Option<(f64, u32)> = self
            .heaviest
            .last()
            .map(|&(w, Reverse(k))| (f64::from(w), k));
        let mut sum = f64::from(self.whole_sum);
        for same in self.parts.chunk_by(|x, y| x.0 == y.0) {
            let k = same[0].0;
            let part: f64 = same.iter().map(|p| p.1).sum();
            sum += part;
            let c = part + f64::from(self.whole.get(&k).copied().unwrap_or(0));
            best = match best {
                Some((bc, bk)) if bc > c || (bc == c && bk < k) => Some((bc, bk)),
                _ => Some((c, k)),
            };
        }
        let full = f64::from(FULL);
        // Coverage in [0, 1] in LEVELS steps; the slack absorbs rounding in
        // resampled runs.
        let level = ((sum.min(full) / full * f64::from(LEVELS)) - 1e-6)
            .ceil()
            .max(0.0) as u16;
        match best {
            Some((_, k)) if sum > 1e-3 * full && level > 0 => Some((k, level)),
            _ => None,
        }
    }

    /// Each type's coverage of a bin with the current whole coverage and
    /// `parts`, into `types` (by type; none that round to nothing).
    fn coverage(&mut self) {
        self.types.clear();
        let mut parts = self.parts.chunk_by(|x, y| x.0 == y.0).peekable();
        let mut whole = self.whole.iter().peekable();
        loop {
            let (k, c) = match (whole.peek(), parts.peek()) {
                (Some(&(&kw, &w)), Some(p)) if kw < p[0].0 => {
                    whole.next();
                    (kw, f64::from(w))
                }
                (Some(&(&kw, &w)), Some(p)) if kw == p[0].0 => {
                    whole.next();
                    let p = parts.next().unwrap_or_default();
                    (kw, f64::from(w) + p.iter().map(|x| x.1).sum::<f64>())
                }
                (_, Some(_)) => {
                    let p = parts.next().unwrap_or_default();
                    (p[0].0, p.iter().map(|x| x.1).sum::<f64>())
                }
                (Some(&(&kw, &w)), None) => {
                    whole.next();
                    (kw, f64::from(w))
                }
                (None, None) => break,
            };
            // More than sixteen warps over each other in one lane saturate.
            // (A float-to-int cast saturates.)
            let q = (c + 0.5) as u16;
            if q > 0 {
                self.types.push((k, q));
            }
        }
        if self.types.len() > TYPES_KEPT {
            // The heaviest (ties: lowest type) one by one, the others together.
            self.types
                .select_nth_unstable_by_key(TYPES_KEPT - 1, |&(k, q)| (Reverse(q), k));
            let rest = self.types[TYPES_KEPT..]
                .iter()
                .fold(0u16, |sum, t| sum.saturating_add(t.1));
            self.types.truncate(TYPES_KEPT);
            self.types.sort_unstable_by_key(|t| t.0);
            self.types.push((OTHER_TYPES, rest));
        }
    }

    /// Gives bins `[start, end)` their cells: extends the open runs whose
    /// type and level go on, closes the others and opens new ones.
    fn emit(
        &mut self,
        runs: &mut Vec<Run>,
        cells: Cells,
        start: u32,
        end: u32,
        at: impl Fn(Run) -> Run,
    ) {
        match cells {
            Cells::Dominant => {
                let cell = self.dominant();
                match (self.open.first_mut(), cell) {
                    (Some(r), Some((k, level)))
                        if r.k == k && r.level == level && r.end == start =>
                    {
                        r.end = end;
                        return;
                    }
                    _ => {}
                }
                runs.append(&mut self.open);
                self.open.extend(cell.map(|(k, level)| {
                    at(Run {
                        sm: 0,
                        lane: 0,
                        start,
                        end,
                        k,
                        level,
                    })
                }));
            }
            Cells::Coverage => {
                self.coverage();
                // Both by type: walk them together.
                let mut open = std::mem::take(&mut self.open).into_iter().peekable();
                self.still_open.clear();
                for &(k, level) in &self.types {
                    while let Some(r) = open.next_if(|r| r.k < k) {
                        runs.push(r);
                    }
                    match open.next_if(|r| r.k == k) {
                        Some(mut r) if r.level == level && r.end == start => {
                            r.end = end;
                            self.still_open.push(r);
                        }
                        closed => {
                            runs.extend(closed);
                            self.still_open.push(at(Run {
                                sm: 0,
                                lane: 0,
                                start,
                                end,
                                k,
                                level,
                            }));
                        }
                    }
                }
                runs.extend(open);
                std::mem::swap(&mut self.open, &mut self.still_open);
            }
        }
    }
}
