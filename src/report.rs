//! What a capture says, at a glance: statistics per event type and per SM, as
//! a text table, and a timeline of SMs against time as an SVG picture that
//! opens in any browser.
//!
//! Everything here works in device nanoseconds (`%globaltimer`): a report needs
//! durations and overlaps within one GPU, not host alignment.
//!
//! A [`Timeline`] collects the events of one or more decoded captures once;
//! [`Timeline::report`] computes the [`Report`] (its `Display` is the text
//! table) and [`Timeline::to_svg`] draws the picture. The SVG has a bounded
//! size whatever the capture holds (see [`SvgOptions::max_rects`]): events
//! narrower than a bin are aggregated into the bin, drawn with the color of
//! the type that covers most of it, and with an opacity that says how much of
//! it is covered.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};

use crate::decode::Buffer;
use crate::format::SlotHeader;
use crate::format::{Event, EventKind};
use crate::registry::{unknown_event_name, EventRegistry};

/// The slot (one warp) events came from: where and when it ran.
#[derive(Debug, Clone, Copy)]
struct SlotRec {
    /// Which capture (launch) of the timeline.
    capture: u32,
    sm: u32,
    first_ts: u64,
    last_ts: u64,
    /// Its events: `events[ev_start..ev_end]`.
    ev_start: usize,
    ev_end: usize,
}

/// Per capture (launch): its window and its counters.
#[derive(Debug, Clone, Copy)]
struct CaptureRec {
    first_ts: u64,
    last_ts: u64,
}

/// The events of one or more captures, collected once for [`Timeline::report`]
/// and [`Timeline::to_svg`].
///
/// Captures added to one timeline should come from the same GPU: their times
/// share one device clock, so several launches of a kernel show side by side.
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    slots: Vec<SlotRec>,
    events: Vec<Event>,
    captures: Vec<CaptureRec>,
    names: BTreeMap<u16, String>,
    sm_count: u32,
    dropped: u64,
    migrated: u64,
    title: String,
}

/// Statistics of one event type.
#[derive(Debug, Clone, PartialEq)]
pub struct TypeStats {
    /// Event type id.
    pub id: u16,
    /// Its name from the registry, or `event <id>`.
    pub name: String,
    /// Number of events (ranges and instants).
    pub count: u64,
    /// How many of them are instants (which have no duration).
    pub instants: u64,
    /// Sum of the range durations, ns.
    pub total_ns: u64,
    /// Mean range duration, ns (zero without ranges).
    pub mean_ns: f64,
    /// Median range duration (nearest rank), ns.
    pub p50_ns: u64,
    /// 99th percentile of the range durations (nearest rank), ns.
    pub p99_ns: u64,
    /// Shortest range, ns.
    pub min_ns: u64,
    /// Longest range, ns.
    pub max_ns: u64,
}

/// Statistics of one SM.
#[derive(Debug, Clone, PartialEq)]
pub struct SmStats {
    /// `%smid`.
    pub sm: u32,
    /// Warps (slots) that started on it.
    pub warps: u64,
    /// Events recorded by those warps.
    pub events: u64,
    /// Time during which at least one recorded range was open on the SM, ns,
    /// summed over the launches.
    pub busy_ns: u64,
    /// `busy_ns` over the launch windows (from the first warp's start to the
    /// last warp's flush of each launch, summed): 0 to 1.
    pub busy_fraction: f64,
}

/// The statistics of a [`Timeline`]. Its `Display` is a plain-text table.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// Optional title (the kernel's name, for instance).
    pub title: String,
    /// Number of launches (captures).
    pub launches: usize,
    /// Sum of the launch windows, ns.
    pub window_ns: u64,
    /// Events recorded.
    pub events: u64,
    /// Records the device dropped because a slot was full.
    pub dropped: u64,
    /// Warps that ran on more than one SM (counted on their first).
    pub migrated_warps: u64,
    /// Per event type, by id.
    pub types: Vec<TypeStats>,
    /// Per SM, by `%smid`; SMs that recorded nothing are listed (busy 0) up to
    /// the SM count, when it is known.
    pub sms: Vec<SmStats>,
}

/// How to draw the SVG timeline.
#[derive(Debug, Clone)]
pub struct SvgOptions {
    /// Width of the plot area in pixels (the picture adds margins).
    pub width: u32,
    /// Most rectangles to draw, events and instants together. Bins get wider
    /// (down to 64 per lane) until the picture fits.
    pub max_rects: usize,
    /// Most lanes (concurrent warps) per SM row; warps beyond it share lanes.
    pub max_lanes_per_sm: u32,
    /// Give each rectangle a tooltip (`<title>`: type, start, end, SM) when
    /// the timeline holds at most this many events (tooltips triple the size).
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

impl Timeline {
    /// An empty timeline.
    pub fn new() -> Self {
        Self::default()
    }

    /// Names event type `id` (otherwise it shows as `event <id>`).
    pub fn set_name(&mut self, id: u16, name: impl Into<String>) {
        self.names.insert(id, name.into());
    }

    /// Names every event type the registry knows.
    pub fn set_names(&mut self, registry: &EventRegistry) {
        for (id, info) in registry.iter() {
            self.names.insert(id, info.name.to_string());
        }
    }

    /// Adds a decoded capture (one launch): all its flushed slots and events.
    pub fn add_buffer(&mut self, capture: &Buffer<'_>) {
        self.begin_capture();
        for slot in capture.slots() {
            self.push_slot(&slot.header, slot.events());
        }
    }

    /// Sets the GPU's SM count, so that SMs that recorded nothing still show
    /// (with zero busy time) in the report and the picture.
    pub fn set_sm_count(&mut self, sm_count: u32) {
        self.sm_count = sm_count;
    }

    /// Sets the title of the report and the picture.
    pub fn set_title(&mut self, title: impl Into<String>) {
        self.title = title.into();
    }

    /// Starts a new capture (launch): the slots pushed next belong to it
    /// ([`Timeline::add_buffer`] does this itself).
    /// Busy fractions are taken over each launch's own window, so that the
    /// time between launches does not count as idle.
    pub fn begin_capture(&mut self) {
        self.captures.push(CaptureRec {
            first_ts: u64::MAX,
            last_ts: 0,
        });
    }

    /// Adds one flushed slot (one warp) and its events, in the order the
    /// device wrote them. Starts a capture first if none was begun.
    pub fn push_slot(&mut self, header: &SlotHeader, events: impl IntoIterator<Item = Event>) {
        if self.captures.is_empty() {
            self.begin_capture();
        }
        let capture = self.captures.len() - 1;
        let ev_start = self.events.len();
        self.events.extend(events);
        let c = &mut self.captures[capture];
        c.first_ts = c.first_ts.min(header.first_ts);
        c.last_ts = c.last_ts.max(header.last_ts);
        self.dropped += u64::from(header.drop_count);
        if header.sm_first != header.sm_last {
            self.migrated += 1;
        }
        self.slots.push(SlotRec {
            capture: capture as u32,
            sm: header.sm_first,
            first_ts: header.first_ts,
            last_ts: header.last_ts,
            ev_start,
            ev_end: self.events.len(),
        });
    }

    /// Number of events collected.
    pub fn event_count(&self) -> usize {
        self.events.len()
    }

    fn name_of(&self, id: u16) -> String {
        self.names
            .get(&id)
            .cloned()
            .unwrap_or_else(|| unknown_event_name(id))
    }

    /// SM rows: `0..max(sm_count, highest SM seen + 1)`.
    fn sm_rows(&self) -> u32 {
        let seen = self.slots.iter().map(|s| s.sm + 1).max().unwrap_or(0);
        seen.max(self.sm_count)
    }

    /// The window over all captures: earliest warp start, latest flush.
    fn span(&self) -> Option<(u64, u64)> {
        let first = self.slots.iter().map(|s| s.first_ts).min()?;
        let last = self.slots.iter().map(|s| s.last_ts).max()?;
        Some((first, last.max(first)))
    }

    /// Computes the statistics.
    pub fn report(&self) -> Report {
        // Per type: durations of the ranges, for percentiles.
        let mut per_type: BTreeMap<u16, (u64, Vec<u64>)> = BTreeMap::new();
        for e in &self.events {
            let entry = per_type.entry(e.id).or_default();
            if e.kind == EventKind::Instant {
                entry.0 += 1;
            } else {
                entry.1.push(e.end_ns.saturating_sub(e.start_ns));
            }
        }
        let types = per_type
            .into_iter()
            .map(|(id, (instants, mut d))| {
                d.sort_unstable();
                let total: u64 = d.iter().sum();
                TypeStats {
                    id,
                    name: self.name_of(id),
                    count: instants + d.len() as u64,
                    instants,
                    total_ns: total,
                    mean_ns: if d.is_empty() {
                        0.0
                    } else {
                        total as f64 / d.len() as f64
                    },
                    p50_ns: nearest_rank(&d, 50.0),
                    p99_ns: nearest_rank(&d, 99.0),
                    min_ns: d.first().copied().unwrap_or(0),
                    max_ns: d.last().copied().unwrap_or(0),
                }
            })
            .collect();

        let window_ns: u64 = self
            .captures
            .iter()
            .filter(|c| c.last_ts >= c.first_ts)
            .map(|c| c.last_ts - c.first_ts)
            .sum();

        // Per SM: busy time is the union of the ranges of all its warps, taken
        // per launch (slots grouped by capture, then SM).
        let rows = self.sm_rows() as usize;
        let mut sms: Vec<SmStats> = (0..rows)
            .map(|sm| SmStats {
                sm: sm as u32,
                warps: 0,
                events: 0,
                busy_ns: 0,
                busy_fraction: 0.0,
            })
            .collect();
        let mut order: Vec<usize> = (0..self.slots.len()).collect();
        order.sort_unstable_by_key(|&i| (self.slots[i].capture, self.slots[i].sm));
        let mut intervals: Vec<(u64, u64)> = Vec::new();
        for group in order.chunk_by(|&a, &b| {
            (self.slots[a].capture, self.slots[a].sm) == (self.slots[b].capture, self.slots[b].sm)
        }) {
            let sm = self.slots[group[0]].sm as usize;
            intervals.clear();
            for &i in group {
                let s = &self.slots[i];
                sms[sm].warps += 1;
                sms[sm].events += (s.ev_end - s.ev_start) as u64;
                intervals.extend(
                    self.events[s.ev_start..s.ev_end]
                        .iter()
                        .filter(|e| e.kind == EventKind::Range && e.end_ns > e.start_ns)
                        .map(|e| (e.start_ns, e.end_ns)),
                );
            }
            sms[sm].busy_ns += union_length(&mut intervals);
        }
        for s in &mut sms {
            s.busy_fraction = if window_ns == 0 {
                0.0
            } else {
                (s.busy_ns as f64 / window_ns as f64).min(1.0)
            };
        }

        Report {
            title: self.title.clone(),
            launches: self.captures.len(),
            window_ns,
            events: self.events.len() as u64,
            dropped: self.dropped,
            migrated_warps: self.migrated,
            types,
            sms,
        }
    }
}

/// Nearest-rank percentile of sorted values (zero when empty). Shared with the
/// OTLP phase summaries, so both outputs report the same p50 and p99.
pub(crate) fn nearest_rank(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Total length covered by the intervals (sorts them in place).
fn union_length(intervals: &mut [(u64, u64)]) -> u64 {
    intervals.sort_unstable();
    let mut total = 0;
    let mut current: Option<(u64, u64)> = None;
    for &(a, b) in intervals.iter() {
        match current {
            Some((ca, cb)) if a <= cb => current = Some((ca, cb.max(b))),
            Some((ca, cb)) => {
                total += cb - ca;
                current = Some((a, b));
            }
            None => current = Some((a, b)),
        }
    }
    if let Some((ca, cb)) = current {
        total += cb - ca;
    }
    total
}

/// `1234` → `"1.23 µs"`: three significant digits, a unit that fits.
pub fn format_ns(ns: f64) -> String {
    let (v, unit) = if ns < 1e3 {
        (ns, "ns")
    } else if ns < 1e6 {
        (ns / 1e3, "µs")
    } else if ns < 1e9 {
        (ns / 1e6, "ms")
    } else {
        (ns / 1e9, "s")
    };
    if unit == "ns" {
        format!("{v:.0} {unit}")
    } else if v < 10.0 {
        format!("{v:.2} {unit}")
    } else if v < 100.0 {
        format!("{v:.1} {unit}")
    } else {
        format!("{v:.0} {unit}")
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.title.is_empty() {
            writeln!(f, "{}", self.title)?;
        }
        writeln!(
            f,
            "{} launch{}, {} events over {}, {} dropped, {} migrated warp{}",
            self.launches,
            if self.launches == 1 { "" } else { "es" },
            self.events,
            format_ns(self.window_ns as f64),
            self.dropped,
            self.migrated_warps,
            if self.migrated_warps == 1 { "" } else { "s" },
        )?;
        writeln!(f)?;
        let name_w = self
            .types
            .iter()
            .map(|t| t.name.chars().count())
            .max()
            .unwrap_or(0)
            .max(5);
        writeln!(
            f,
            "{:<name_w$}  {:>10}  {:>10}  {:>10}  {:>10}  {:>10}  {:>10}",
            "event", "count", "total", "mean", "p50", "p99", "max"
        )?;
        for t in &self.types {
            writeln!(
                f,
                "{:<name_w$}  {:>10}  {:>10}  {:>10}  {:>10}  {:>10}  {:>10}",
                t.name,
                t.count,
                format_ns(t.total_ns as f64),
                format_ns(t.mean_ns),
                format_ns(t.p50_ns as f64),
                format_ns(t.p99_ns as f64),
                format_ns(t.max_ns as f64),
            )?;
        }
        if self.sms.is_empty() {
            return Ok(());
        }
        writeln!(f)?;
        let mut busy: Vec<f64> = self.sms.iter().map(|s| s.busy_fraction).collect();
        busy.sort_unstable_by(f64::total_cmp);
        let idle = self.sms.iter().filter(|s| s.warps == 0).count();
        writeln!(
            f,
            "SM busy (time with a recorded range open, over the launch window): min {:.1}%, median {:.1}%, max {:.1}%; {} of {} SMs recorded nothing",
            100.0 * busy[0],
            100.0 * busy[busy.len() / 2],
            100.0 * busy[busy.len() - 1],
            idle,
            self.sms.len(),
        )?;
        for row in self.sms.chunks(6) {
            let cells: Vec<String> = row
                .iter()
                .map(|s| format!("SM{:>4} {:>5.1}%", s.sm, 100.0 * s.busy_fraction))
                .collect();
            writeln!(f, "  {}", cells.join("   "))?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// The SVG timeline.

/// A qualitative palette (Tableau 10), readable on white, one color per type.
const PALETTE: [&str; 10] = [
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#bab0ac",
];

/// Opacity levels of a partly covered bin; quantized so that neighbours merge.
const LEVELS: u8 = 4;

const MARGIN_LEFT: f64 = 64.0;
const MARGIN_RIGHT: f64 = 24.0;
/// Top of the legend; the plot starts below the legend.
const PLOT_TOP_BASE: f64 = 56.0;
const ROW_GAP: f64 = 1.0;

/// Lanes of the SM rows.
struct Layout {
    /// Lanes per SM row.
    lanes_per_sm: u32,
    /// Per slot, its lane (row-major: `sm * lanes_per_sm + lane`).
    lane_of_slot: Vec<u32>,
}

/// Assigns each slot a lane within its SM row: a warp takes the first lane that
/// is free when it starts (interval colouring), so concurrent warps stack and
/// warps that follow each other share a lane. Past `cap` lanes, a warp shares
/// the lane that frees first.
fn layout(slots: &[SlotRec], cap: u32) -> Layout {
    let mut order: Vec<usize> = (0..slots.len()).collect();
    order.sort_unstable_by_key(|&i| (slots[i].sm, slots[i].first_ts));
    let mut local = vec![0u32; slots.len()];
    let mut used = 1u32;
    let mut lane_end: Vec<u64> = Vec::new();
    for group in order.chunk_by(|&a, &b| slots[a].sm == slots[b].sm) {
        lane_end.clear();
        for &i in group {
            let s = &slots[i];
            let lane = match lane_end.iter().position(|&end| end <= s.first_ts) {
                Some(l) => l,
                None if (lane_end.len() as u32) < cap => {
                    lane_end.push(0);
                    lane_end.len() - 1
                }
                None => {
                    // Full: share the lane that frees first.
                    let (l, _) = lane_end
                        .iter()
                        .enumerate()
                        .min_by_key(|(_, &e)| e)
                        .unwrap_or((0, &0));
                    l
                }
            };
            lane_end[lane] = lane_end[lane].max(s.last_ts);
            local[i] = lane as u32;
        }
        used = used.max(lane_end.len() as u32);
    }
    let lanes_per_sm = used.max(1);
    let lane_of_slot = slots
        .iter()
        .zip(&local)
        .map(|(s, &l)| s.sm * lanes_per_sm + l)
        .collect();
    Layout {
        lanes_per_sm,
        lane_of_slot,
    }
}

/// Splits one warp's ranges into segments that each show the innermost open
/// range: a nested phase hides its parent while it runs.
fn flatten(events: &[Event], sorted: &mut Vec<Event>, out: &mut Vec<(u64, u64, u16)>) {
    sorted.clear();
    sorted.extend(
        events
            .iter()
            .filter(|e| e.kind == EventKind::Range && e.end_ns > e.start_ns),
    );
    // Outer ranges first when two start together.
    sorted.sort_unstable_by(|a, b| a.start_ns.cmp(&b.start_ns).then(b.end_ns.cmp(&a.end_ns)));
    let mut stack: Vec<(u64, u16)> = Vec::new();
    let mut cursor = 0u64;
    let emit = |a: u64, b: u64, id: u16, out: &mut Vec<(u64, u64, u16)>| {
        if b > a {
            out.push((a, b, id));
        }
    };
    for e in sorted.iter() {
        while let Some(&(end, id)) = stack.last() {
            if end > e.start_ns {
                break;
            }
            emit(cursor, end, id, out);
            cursor = cursor.max(end);
            stack.pop();
        }
        if let Some(&(_, id)) = stack.last() {
            emit(cursor, e.start_ns, id, out);
        }
        cursor = cursor.max(e.start_ns);
        stack.push((e.end_ns, e.id));
    }
    while let Some((end, id)) = stack.pop() {
        emit(cursor, end, id, out);
        cursor = cursor.max(end);
    }
}

/// A 1-2-5 step of at least `min` (for axis ticks).
fn nice_step(min: f64) -> f64 {
    if min <= 0.0 || !min.is_finite() {
        return 1.0;
    }
    let p = 10f64.powf(min.log10().floor());
    for m in [1.0, 2.0, 5.0, 10.0] {
        if m * p >= min {
            return m * p;
        }
    }
    10.0 * p
}

/// Escapes text for XML content and attribute values.
fn xml_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            // Control characters are not allowed in XML 1.0.
            c if (c as u32) < 0x20 && c != '\t' && c != '\n' => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// One drawn rectangle: bins `[start, end)` of a lane, type slot `k`, opacity level.
#[derive(Debug, Clone, Copy)]
struct Run {
    lane: u32,
    start: u32,
    end: u32,
    k: u16,
    level: u8,
}

/// Bins every lane's segments (`(start, end, type slot)`, device ns) at
/// `bins` bins over `[t0, t0 + dur)` and returns the runs of bins that share
/// their dominant type and opacity level.
fn bin_runs(
    per_lane: &[Vec<(u64, u64, u16)>],
    t0: u64,
    dur: f64,
    bins: usize,
    ntypes: usize,
) -> Vec<Run> {
    let bin_ns = dur / bins as f64;
    let mut cover = vec![0f32; bins * ntypes];
    let mut runs = Vec::new();
    for (lane, segs) in per_lane.iter().enumerate() {
        if segs.is_empty() {
            continue;
        }
        let (mut lo, mut hi) = (bins, 0usize);
        for &(a, b, k) in segs {
            let fa = a.saturating_sub(t0) as f64 / bin_ns;
            let fb = b.saturating_sub(t0) as f64 / bin_ns;
            let first = (fa.floor() as usize).min(bins - 1);
            let last = (fb.ceil() as usize).clamp(first + 1, bins);
            lo = lo.min(first);
            hi = hi.max(last);
            // Only the two edge bins can be partly covered.
            for bin in first..last {
                let overlap = if bin > first && bin + 1 < last {
                    1.0
                } else {
                    (fb.min((bin + 1) as f64) - fa.max(bin as f64)).max(0.0) as f32
                };
                cover[bin * ntypes + usize::from(k)] += overlap;
            }
        }
        let mut open: Option<Run> = None;
        for bin in lo..hi {
            let c = &cover[bin * ntypes..(bin + 1) * ntypes];
            let (k, _) = c
                .iter()
                .enumerate()
                .fold((0, 0f32), |m, (k, &v)| if v > m.1 { (k, v) } else { m });
            let sum: f32 = c.iter().sum();
            let level = ((sum.min(1.0) * f32::from(LEVELS)).ceil() as u8).min(LEVELS);
            let cell = (sum > 1e-3 && level > 0).then_some((k as u16, level));
            match (&mut open, cell) {
                (Some(r), Some((k, level))) if r.k == k && r.level == level => {
                    r.end = bin as u32 + 1
                }
                _ => {
                    runs.extend(open.take());
                    open = cell.map(|(k, level)| Run {
                        lane: lane as u32,
                        start: bin as u32,
                        end: bin as u32 + 1,
                        k,
                        level,
                    });
                }
            }
        }
        runs.extend(open);
        cover[lo * ntypes..hi * ntypes].fill(0.0);
    }
    runs
}

impl Timeline {
    /// Draws the timeline: one row per SM (top to bottom), time left to right,
    /// each warp's phases as colored rectangles in its lane, instants as thin
    /// marks, a legend and a time axis from the first warp's start.
    pub fn to_svg(&self, options: &SvgOptions) -> String {
        let report = self.report();
        let rows = self.sm_rows().max(1);
        let width = f64::from(options.width.max(100));
        let (t0, t1) = self.span().unwrap_or((0, 1));
        let dur = (t1 - t0).max(1) as f64;
        let budget = options.max_rects.max(1);

        let lay = layout(&self.slots, options.max_lanes_per_sm.max(1));
        let lanes = rows * lay.lanes_per_sm;
        // Lane height: aim for a picture about 1600 px tall, 1 to 8 px a lane.
        let lane_h = (1600.0 / f64::from(lanes)).clamp(1.0, 8.0);
        let row_h = lane_h * f64::from(lay.lanes_per_sm) + ROW_GAP;
        let lane_y = |lane: u32| {
            PLOT_TOP_BASE
                + f64::from(lane / lay.lanes_per_sm) * row_h
                + f64::from(lane % lay.lanes_per_sm) * lane_h
        };

        // Type → palette slot, by id order (stable across pictures of one kernel).
        let type_ids: Vec<u16> = report.types.iter().map(|t| t.id).collect();
        let type_index = |id: u16| type_ids.binary_search(&id).unwrap_or(0) as u16;
        let ntypes = type_ids.len().max(1);

        // Segments per lane, and instants.
        let mut per_lane: Vec<Vec<(u64, u64, u16)>> = vec![Vec::new(); lanes as usize];
        let mut instants: Vec<(u32, u64, u16)> = Vec::new();
        let mut scratch = Vec::new();
        for (slot, &lane) in self.slots.iter().zip(&lay.lane_of_slot) {
            let evs = &self.events[slot.ev_start..slot.ev_end];
            let segs = &mut per_lane[lane as usize];
            let from = segs.len();
            flatten(evs, &mut scratch, segs);
            for s in &mut segs[from..] {
                s.2 = type_index(s.2);
            }
            instants.extend(
                evs.iter()
                    .filter(|e| e.kind == EventKind::Instant)
                    .map(|e| (lane, e.start_ns, type_index(e.id))),
            );
        }

        // The finest bins (4 a pixel) whose runs fit the budget: the finest if
        // it fits; otherwise bisect (in log scale) between 64 bins a lane and
        // the finest, six passes in all. What still overflows at 64 is cut.
        let (bins, runs) = {
            let finest = (options.width as usize * 4).max(64);
            let runs = bin_runs(&per_lane, t0, dur, finest, ntypes);
            if runs.len() <= budget {
                (finest, runs)
            } else {
                let (mut lo, mut hi) = (64usize, finest);
                let mut fit: Option<(usize, Vec<Run>)> = None;
                for _ in 0..5 {
                    let mid = ((lo as f64 * hi as f64).sqrt() as usize).clamp(lo, hi);
                    if mid == lo || mid == hi {
                        break;
                    }
                    let runs = bin_runs(&per_lane, t0, dur, mid, ntypes);
                    if runs.len() <= budget {
                        lo = mid;
                        fit = Some((mid, runs));
                    } else {
                        hi = mid;
                    }
                }
                fit.unwrap_or_else(|| (64, bin_runs(&per_lane, t0, dur, 64, ntypes)))
            }
        };
        let bin_ns = dur / bins as f64;
        let bin_px = width / bins as f64;

        // Instants: one mark per (lane, pixel, type), in what the budget leaves.
        let pixel = |t: u64| (t.saturating_sub(t0) as f64 / dur * width) as u64;
        instants.sort_unstable_by_key(|&(lane, t, k)| (lane, pixel(t), k));
        instants.dedup_by_key(|&mut (lane, t, k)| (lane, pixel(t), k));
        let room = budget.saturating_sub(runs.len());
        let cut = runs.len().saturating_sub(budget) + instants.len().saturating_sub(room);

        let header_h = 22.0 * report.types.len().div_ceil(4) as f64;
        let plot_top = PLOT_TOP_BASE + header_h;
        let plot_h = row_h * f64::from(rows);
        let total_w = MARGIN_LEFT + width + MARGIN_RIGHT;
        let total_h = plot_top + plot_h + 44.0;

        let mut svg = String::with_capacity(64 * (runs.len() + instants.len()).min(budget) + 4096);
        let _ = write!(
            svg,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{total_w:.0}" height="{total_h:.0}" viewBox="0 0 {total_w:.0} {total_h:.0}" font-family="sans-serif" font-size="12">"#
        );
        svg.push_str("\n<style>");
        for i in 0..ntypes {
            let _ = write!(svg, ".t{i}{{fill:{}}}", PALETTE[i % PALETTE.len()]);
        }
        for l in 1..LEVELS {
            let _ = write!(
                svg,
                ".o{l}{{fill-opacity:{:.2}}}",
                f64::from(l) / f64::from(LEVELS)
            );
        }
        svg.push_str(".i{stroke:#222;stroke-width:0.5}.lab{fill:#333}.grid{stroke:#ddd;stroke-width:1}</style>\n");
        svg.push_str(r##"<rect width="100%" height="100%" fill="#fff"/>"##);

        // Title, subtitle and legend.
        let title = if self.title.is_empty() {
            "tracing-gpu timeline"
        } else {
            &self.title
        };
        let subtitle = format!(
            "{} events, {} warps, {} SMs, {} launch{}, {}. One row per SM, one lane per concurrent warp; a nested phase hides its parent.",
            report.events,
            self.slots.len(),
            rows,
            report.launches,
            if report.launches == 1 { "" } else { "es" },
            format_ns(dur)
        );
        let _ = write!(
            svg,
            "\n<text x=\"{MARGIN_LEFT}\" y=\"20\" font-size=\"15\" font-weight=\"bold\">{}</text><text x=\"{MARGIN_LEFT}\" y=\"36\" class=\"lab\">{}</text>",
            xml_escape(title),
            xml_escape(&subtitle)
        );
        svg.push_str("\n<g class=\"legend\">");
        for (i, t) in report.types.iter().enumerate() {
            let x = MARGIN_LEFT + (i % 4) as f64 * (width / 4.0);
            let y = PLOT_TOP_BASE - 8.0 + (i / 4) as f64 * 22.0;
            let _ = write!(
                svg,
                "<rect class=\"t{i}\" x=\"{x:.1}\" y=\"{y:.1}\" width=\"14\" height=\"14\"/><text x=\"{:.1}\" y=\"{:.1}\">{}</text>",
                x + 20.0,
                y + 11.5,
                xml_escape(&format!(
                    "{}: {} × p50 {} p99 {}",
                    t.name,
                    t.count,
                    format_ns(t.p50_ns as f64),
                    format_ns(t.p99_ns as f64)
                ))
            );
        }
        svg.push_str("</g>");

        // Everything below the legend is shifted down by its height.
        let _ = write!(svg, "\n<g transform=\"translate(0,{header_h:.1})\">");

        // Row stripes and labels, labels at least 11 px apart.
        let label_every = (11.0 / row_h).ceil().max(1.0) as u32;
        svg.push_str("\n<g class=\"rows\">");
        for sm in 0..rows {
            let y = lane_y(sm * lay.lanes_per_sm);
            if sm % 2 == 1 {
                let _ = write!(
                    svg,
                    r##"<rect x="{MARGIN_LEFT}" y="{y:.2}" width="{width:.1}" height="{:.2}" fill="#f0f0f0"/>"##,
                    row_h - ROW_GAP
                );
            }
            if sm % label_every == 0 {
                let _ = write!(
                    svg,
                    "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" class=\"lab\" font-size=\"10\" dominant-baseline=\"middle\">SM {sm}</text>",
                    MARGIN_LEFT - 6.0,
                    y + (row_h - ROW_GAP) / 2.0
                );
            }
        }
        svg.push_str("</g>");

        // Time axis: grid lines and labels below the plot.
        let axis_top = PLOT_TOP_BASE;
        let step = nice_step(dur / 10.0);
        let (unit_div, unit) = if dur >= 1e6 {
            (1e6, "ms")
        } else {
            (1e3, "µs")
        };
        svg.push_str("\n<g class=\"axis\">");
        let mut k = 0u32;
        while f64::from(k) * step <= dur * (1.0 + 1e-9) {
            let t = f64::from(k) * step;
            let x = MARGIN_LEFT + t / dur * width;
            let _ = write!(
                svg,
                "<line class=\"grid\" x1=\"{x:.1}\" y1=\"{axis_top:.1}\" x2=\"{x:.1}\" y2=\"{:.1}\"/><text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\" class=\"lab\">{}</text>",
                axis_top + plot_h + 4.0,
                axis_top + plot_h + 18.0,
                trim_float(t / unit_div)
            );
            k += 1;
        }
        let _ = write!(
            svg,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" class=\"lab\">time since the first warp started ({unit})</text></g>",
            MARGIN_LEFT + width / 2.0,
            axis_top + plot_h + 36.0
        );

        // The events. Rectangles are the bulk of the file: their numbers are
        // written as fixed-point integers, cheaper than float formatting.
        let tooltips = runs.len().min(budget) + instants.len().min(room) <= options.tooltips_up_to;
        svg.push_str("\n<g class=\"events\">");
        for r in runs.iter().take(budget) {
            let tip = tooltips.then(|| {
                format!(
                    "{}: {} to {} (SM {})",
                    report.types[usize::from(r.k)].name,
                    format_ns(f64::from(r.start) * bin_ns),
                    format_ns(f64::from(r.end) * bin_ns),
                    r.lane / lay.lanes_per_sm
                )
            });
            let x = MARGIN_LEFT + f64::from(r.start) * bin_px;
            let w = f64::from(r.end - r.start) * bin_px;
            let level = (r.level < LEVELS).then_some(r.level);
            rect(
                &mut svg,
                (r.k, level, false),
                (x, lane_y(r.lane), w, lane_h),
                tip,
            );
        }
        for &(lane, t, k) in instants.iter().take(room) {
            let x = MARGIN_LEFT + t.saturating_sub(t0) as f64 / dur * width - 0.5;
            let tip = tooltips.then(|| {
                format!(
                    "{} at {} (SM {})",
                    report.types[usize::from(k)].name,
                    format_ns(t.saturating_sub(t0) as f64),
                    lane / lay.lanes_per_sm
                )
            });
            rect(
                &mut svg,
                (k, None, true),
                (x, lane_y(lane), 1.0, lane_h),
                tip,
            );
        }
        svg.push_str("</g>");
        if cut > 0 {
            let _ = write!(
                svg,
                "\n<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" class=\"lab\">{cut} marks not drawn (over the rectangle budget)</text>",
                MARGIN_LEFT + width,
                axis_top + plot_h + 36.0
            );
        }
        svg.push_str("\n</g>\n</svg>\n");
        svg
    }
}

/// Writes one `<rect>`: type slot, opacity level (none: opaque), whether it
/// marks an instant; position and size; a tooltip if given.
fn rect(
    out: &mut String,
    (k, level, instant): (u16, Option<u8>, bool),
    (x, y, w, h): (f64, f64, f64, f64),
    tip: Option<String>,
) {
    let _ = write!(out, "<rect class=\"t{k}");
    if let Some(l) = level {
        let _ = write!(out, " o{l}");
    }
    if instant {
        out.push_str(" i");
    }
    out.push_str("\" x=\"");
    push_fixed2(out, x);
    out.push_str("\" y=\"");
    push_fixed2(out, y);
    out.push_str("\" width=\"");
    push_fixed2(out, w);
    out.push_str("\" height=\"");
    push_fixed2(out, h);
    out.push('"');
    match tip {
        Some(tip) => {
            let _ = write!(out, "><title>{}</title></rect>", xml_escape(&tip));
        }
        None => out.push_str("/>"),
    }
}

/// Writes a non-negative number with two decimals (negative ones as 0).
fn push_fixed2(out: &mut String, v: f64) {
    let c = (v.max(0.0) * 100.0).round() as u64;
    let _ = write!(out, "{}.{:02}", c / 100, c % 100);
}

/// `2.5000` → `"2.5"`, `3.0` → `"3"`.
fn trim_float(v: f64) -> String {
    let s = format!("{v:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".into()
    } else {
        s.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::SLOT_MAGIC;

    fn slot(sm: u32, first_ts: u64, last_ts: u64) -> SlotHeader {
        SlotHeader {
            magic: SLOT_MAGIC,
            first_ts,
            last_ts,
            sm_first: sm,
            sm_last: sm,
            ..Default::default()
        }
    }

    fn range(id: u16, start_ns: u64, end_ns: u64) -> Event {
        Event {
            id,
            kind: EventKind::Range,
            start_ns,
            end_ns,
            payload: 0,
        }
    }

    fn instant(id: u16, at: u64) -> Event {
        Event {
            id,
            kind: EventKind::Instant,
            payload: 0,
            start_ns: at,
            end_ns: at,
        }
    }

    #[test]
    fn percentiles_use_nearest_rank() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(nearest_rank(&v, 50.0), 50);
        assert_eq!(nearest_rank(&v, 99.0), 99);
        assert_eq!(nearest_rank(&[7], 99.0), 7);
        assert_eq!(nearest_rank(&[], 50.0), 0);
        let v: Vec<u64> = (1..=1000).collect();
        assert_eq!(nearest_rank(&v, 99.0), 990);
    }

    #[test]
    fn union_merges_overlaps_and_touching() {
        let mut v = vec![(10, 20), (0, 5), (15, 30), (30, 31), (40, 40)];
        assert_eq!(union_length(&mut v), 5 + 21);
        assert_eq!(union_length(&mut []), 0);
    }

    #[test]
    fn report_counts_types_and_busy_sms() {
        let mut tl = Timeline::new();
        tl.set_name(1, "load");
        tl.set_sm_count(4);
        // SM 0: two warps whose ranges overlap: busy [0, 300) of a 1000 ns window.
        tl.push_slot(
            &slot(0, 0, 1000),
            [range(1, 0, 100), range(2, 100, 200), instant(3, 150)],
        );
        tl.push_slot(&slot(0, 50, 400), [range(1, 50, 150), range(2, 200, 300)]);
        // SM 2: one warp, busy 500 ns.
        tl.push_slot(&slot(2, 400, 900), [range(2, 400, 900)]);
        let r = tl.report();
        assert_eq!(r.events, 6);
        assert_eq!(r.launches, 1);
        assert_eq!(r.window_ns, 1000);
        assert_eq!(r.types.len(), 3);
        let load = &r.types[0];
        assert_eq!(
            (load.id, load.name.as_str(), load.count, load.total_ns),
            (1, "load", 2, 200)
        );
        assert_eq!(
            (load.p50_ns, load.p99_ns, load.min_ns, load.max_ns),
            (100, 100, 100, 100)
        );
        let t2 = &r.types[1];
        assert_eq!(t2.name, "event 2");
        assert_eq!(
            (t2.count, t2.total_ns, t2.p50_ns, t2.p99_ns),
            (3, 700, 100, 500)
        );
        assert!((t2.mean_ns - 700.0 / 3.0).abs() < 1e-9);
        let t3 = &r.types[2];
        assert_eq!((t3.count, t3.instants, t3.total_ns), (1, 1, 0));
        assert_eq!(r.sms.len(), 4);
        assert_eq!(
            (r.sms[0].warps, r.sms[0].events, r.sms[0].busy_ns),
            (2, 5, 300)
        );
        assert!((r.sms[0].busy_fraction - 0.3).abs() < 1e-12);
        assert_eq!((r.sms[1].warps, r.sms[1].busy_ns), (0, 0));
        assert!((r.sms[2].busy_fraction - 0.5).abs() < 1e-12);
        let text = r.to_string();
        assert!(text.contains("load"), "{text}");
        assert!(text.contains("SM   0  30.0%"), "{text}");
        assert!(text.contains("2 of 4 SMs recorded nothing"), "{text}");
    }

    #[test]
    fn decoded_captures_feed_the_report() {
        use crate::format::BufferBuilder;
        let registry = EventRegistry::from_pairs([(1, "load"), (2, "mma")]).unwrap();
        // Two blocks of 64 threads (2 warps each) on SMs 3 and 4.
        let mut b = BufferBuilder::new([2, 1, 1], [64, 1, 1], 4);
        b.warp(0, 0)
            .unwrap()
            .sm(3, 3)
            .range(1, 1_000, 1_400, 0)
            .range(2, 1_400, 2_000, 0);
        b.warp(0, 1)
            .unwrap()
            .sm(3, 3)
            .range(2, 1_200, 1_500, 0)
            .instant(1, 1_600, 9);
        b.warp(1, 0)
            .unwrap()
            .sm(4, 5)
            .first_ts(1_000)
            .last_ts(3_000)
            .range(2, 2_000, 2_500, 0);
        // Capacity 4: the fifth record is dropped.
        let w = b.warp(1, 1).unwrap().sm(4, 4);
        for k in 0..5 {
            w.range(1, 2_000 + 100 * k, 2_050 + 100 * k, k as u32);
        }
        let bytes = b.finish();
        let capture = Buffer::decode(&bytes, Some(&registry)).unwrap();
        let mut tl = Timeline::new();
        tl.set_names(&registry);
        tl.set_sm_count(6);
        tl.add_buffer(&capture);
        let r = tl.report();
        assert_eq!(
            (r.launches, r.events, r.dropped, r.migrated_warps),
            (1, 9, 1, 1)
        );
        assert_eq!(r.window_ns, 2_000);
        let names: Vec<_> = r.types.iter().map(|t| (t.name.as_str(), t.count)).collect();
        assert_eq!(names, [("load", 6), ("mma", 3)]);
        // SM 3: [1000, 2000) busy; SM 4: [2000, 2500) plus nothing else outside it.
        assert_eq!(r.sms[3].busy_ns, 1_000);
        assert_eq!(r.sms[4].busy_ns, 500);
        assert!((r.sms[3].busy_fraction - 0.5).abs() < 1e-12);
        assert_eq!((r.sms[4].warps, r.sms[5].warps), (2, 0));
        let svg = tl.to_svg(&SvgOptions::default());
        let doc = roxmltree::Document::parse(&svg).expect("valid XML");
        assert!(!svg_events(&doc).is_empty());
    }

    #[test]
    fn busy_time_is_per_launch() {
        // Two launches, 1 ms apart: the gap between them is not idle time.
        let mut tl = Timeline::new();
        tl.begin_capture();
        tl.push_slot(&slot(0, 0, 100), [range(1, 0, 100)]);
        tl.begin_capture();
        tl.push_slot(
            &slot(0, 1_000_000, 1_000_100),
            [range(1, 1_000_000, 1_000_050)],
        );
        let r = tl.report();
        assert_eq!((r.launches, r.window_ns), (2, 200));
        assert_eq!(r.sms[0].busy_ns, 150);
        assert!((r.sms[0].busy_fraction - 0.75).abs() < 1e-12);
    }

    #[test]
    fn empty_timeline_reports_and_draws() {
        let tl = Timeline::new();
        let r = tl.report();
        assert_eq!((r.events, r.window_ns, r.sms.len()), (0, 0, 0));
        let _ = r.to_string();
        let svg = tl.to_svg(&SvgOptions::default());
        roxmltree::Document::parse(&svg).expect("valid XML");
    }

    #[test]
    fn flatten_shows_the_innermost_range() {
        let events = [
            range(1, 0, 100),
            range(2, 10, 20),
            range(3, 30, 40),
            range(4, 100, 150),
        ];
        let (mut scratch, mut out) = (Vec::new(), Vec::new());
        flatten(&events, &mut scratch, &mut out);
        assert_eq!(
            out,
            vec![
                (0, 10, 1),
                (10, 20, 2),
                (20, 30, 1),
                (30, 40, 3),
                (40, 100, 1),
                (100, 150, 4)
            ]
        );
        // Partial overlap (begin A, begin B, end A, end B) loses no time and never panics.
        out.clear();
        flatten(&[range(1, 0, 10), range(2, 5, 15)], &mut scratch, &mut out);
        assert_eq!(out, vec![(0, 5, 1), (5, 15, 2)]);
    }

    #[test]
    fn lanes_stack_concurrent_warps_and_reuse_free_ones() {
        let s = |sm, a, b| SlotRec {
            capture: 0,
            sm,
            first_ts: a,
            last_ts: b,
            ev_start: 0,
            ev_end: 0,
        };
        let slots = [
            s(0, 0, 10),
            s(0, 5, 20),
            s(0, 10, 30),
            s(1, 0, 5),
            s(0, 12, 13),
        ];
        let lay = layout(&slots, 8);
        assert_eq!(lay.lanes_per_sm, 3);
        assert_eq!(lay.lane_of_slot, vec![0, 1, 0, 3, 2]);
        // A cap of one lane: everything shares it.
        let lay = layout(&slots, 1);
        assert_eq!(lay.lanes_per_sm, 1);
        assert_eq!(lay.lane_of_slot, vec![0, 0, 0, 1, 0]);
    }

    fn svg_events(doc: &roxmltree::Document) -> Vec<(String, f64, f64, f64, f64)> {
        let group = doc
            .descendants()
            .find(|n| n.attribute("class") == Some("events"))
            .expect("an events group");
        group
            .children()
            .filter(|n| n.has_tag_name("rect"))
            .map(|n| {
                let num = |a: &str| n.attribute(a).unwrap().parse::<f64>().unwrap();
                (
                    n.attribute("class").unwrap().to_string(),
                    num("x"),
                    num("y"),
                    num("width"),
                    num("height"),
                )
            })
            .collect()
    }

    #[test]
    fn svg_draws_each_event_at_its_place() {
        let mut tl = Timeline::new();
        tl.set_title("gemm <bf16> & co");
        tl.set_name(1, "wait");
        tl.set_name(2, "mma");
        // 1600 px over 6400 ns with 6400 bins: one bin per ns, events on bin edges.
        tl.push_slot(
            &slot(0, 0, 6400),
            [range(1, 0, 1600), range(2, 1600, 3200), instant(1, 4000)],
        );
        tl.push_slot(&slot(1, 3200, 6400), [range(2, 3200, 6400)]);
        let svg = tl.to_svg(&SvgOptions::default());
        let doc = roxmltree::Document::parse(&svg).expect("valid XML");
        let root = doc.root_element();
        assert_eq!(root.tag_name().name(), "svg");
        let (w, h): (f64, f64) = (
            root.attribute("width").unwrap().parse().unwrap(),
            root.attribute("height").unwrap().parse().unwrap(),
        );
        let rects = svg_events(&doc);
        assert_eq!(rects.len(), 4, "{rects:?}");
        // wait: first quarter of the plot; mma: second quarter, same lane.
        let (c, x, y, rw, rh) = &rects[0];
        assert_eq!(c, "t0");
        assert!(
            (x - MARGIN_LEFT).abs() < 0.01 && (rw - 400.0).abs() < 0.01,
            "{rects:?}"
        );
        assert_eq!((rects[1].0.as_str(), rects[1].2), ("t1", *y));
        assert!((rects[1].1 - (MARGIN_LEFT + 400.0)).abs() < 0.01);
        // SM 1's warp: a lower row, the second half.
        assert!(rects[2].2 > *y && (rects[2].1 - (MARGIN_LEFT + 800.0)).abs() < 0.01);
        assert!((rects[2].3 - 800.0).abs() < 0.01);
        // The instant: a 1 px mark at 1000 px.
        assert_eq!(rects[3].0, "t0 i");
        assert!((rects[3].1 - (MARGIN_LEFT + 999.5)).abs() < 0.01);
        for (_, x, y, rw, rh2) in &rects {
            assert!(*x >= 0.0 && x + rw <= w && *y >= 0.0 && y + rh2 <= h);
            assert_eq!(rh2, rh);
        }
        // The title is escaped and the legend names both types; tooltips are on.
        assert!(doc
            .descendants()
            .any(|n| n.text() == Some("gemm <bf16> & co")));
        assert!(doc
            .descendants()
            .any(|n| n.text().is_some_and(|t| t.starts_with("mma: 2 ×"))));
        assert_eq!(
            doc.descendants()
                .filter(|n| n.has_tag_name("title"))
                .count(),
            4
        );
    }

    #[test]
    fn svg_size_is_bounded_for_huge_captures() {
        // 132 SMs × 4 warps × 1000 sub-pixel events: 528 k events.
        let mut tl = Timeline::new();
        tl.set_sm_count(132);
        for sm in 0..132u32 {
            for w in 0..4u64 {
                let events = (0..1000u64).map(|k| {
                    let t = k * 500 + w * 7;
                    range((k % 3) as u16, t, t + 200 + (k % 5) * 50)
                });
                tl.push_slot(&slot(sm, 0, 500_000), events);
            }
        }
        let options = SvgOptions {
            max_rects: 50_000,
            ..Default::default()
        };
        let svg = tl.to_svg(&options);
        let doc = roxmltree::Document::parse(&svg).expect("valid XML");
        let rects = svg_events(&doc);
        assert!(
            !rects.is_empty() && rects.len() <= 50_000,
            "{} rects",
            rects.len()
        );
        assert!(svg.len() < 5_000_000, "{} bytes", svg.len());
        // No tooltips past the limit.
        assert_eq!(
            doc.descendants()
                .filter(|n| n.has_tag_name("title"))
                .count(),
            0
        );
        // Each lane's runs stay in the plot and do not overlap.
        let right = MARGIN_LEFT + f64::from(options.width);
        let mut by_row: BTreeMap<u64, Vec<(f64, f64)>> = BTreeMap::new();
        for (_, x, y, w, _) in &rects {
            assert!(
                *x >= MARGIN_LEFT - 0.01 && x + w <= right + 0.01,
                "x {x} w {w}"
            );
            by_row
                .entry((y * 100.0) as u64)
                .or_default()
                .push((*x, x + w));
        }
        for runs in by_row.values() {
            for pair in runs.windows(2) {
                assert!(pair[0].1 <= pair[1].0 + 0.02, "{pair:?}");
            }
        }
        assert!(!svg.contains("not drawn"));
        // A budget too small even at the coarsest bins: cut, and said so.
        let svg = tl.to_svg(&SvgOptions {
            max_rects: 100,
            ..Default::default()
        });
        let doc = roxmltree::Document::parse(&svg).expect("valid XML");
        assert_eq!(svg_events(&doc).len(), 100);
        assert!(svg.contains("marks not drawn (over the rectangle budget)"));
    }

    #[test]
    fn durations_format_with_three_digits() {
        assert_eq!(format_ns(532.0), "532 ns");
        assert_eq!(format_ns(1234.0), "1.23 µs");
        assert_eq!(format_ns(12_345.0), "12.3 µs");
        assert_eq!(format_ns(4_560_000.0), "4.56 ms");
        assert_eq!(format_ns(2.5e9), "2.50 s");
        assert_eq!(trim_float(2.5), "2.5");
        assert_eq!(trim_float(3.0), "3");
        assert_eq!(nice_step(0.7), 1.0);
        assert_eq!(nice_step(130.0), 200.0);
    }
}
