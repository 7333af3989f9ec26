//! What a capture says, at a glance: statistics per event type and per SM, as
//! a text table, and a timeline of SMs against time as an SVG picture that
//! opens in any browser.
//!
//! Everything here works in device nanoseconds (`%globaltimer`): a report needs
//! durations and overlaps within one GPU, not host alignment.
//!
//! A [`Timeline`] takes launches one at a time ([`Timeline::add_buffer`]) and
//! keeps none of their events: per event type, counts and a histogram of the
//! durations; per SM, the time a range was open, computed per launch; and, if
//! made with [`Timeline::with_svg`], the launch's binned picture. So its memory
//! is bounded by the number of event types, of SMs seen and by the picture,
//! not by the number of events; while a launch is added, it also needs work
//! space in proportion to that launch. [`Timeline::report`] computes the
//! [`Report`] (its `Display` is the text table) and [`Timeline::to_svg`] draws
//! the picture. The SVG has a bounded size whatever the capture holds (see
//! [`SvgOptions::max_rects`]): events narrower than a bin are aggregated into
//! the bin, drawn with the color of the type that covers most of it, and with
//! an opacity that says how much of it is covered.
//!
//! Nothing read from a capture sizes the work: SMs are keyed by the `%smid`s
//! actually seen (any `u32`), idle SMs are listed only up to the device's SM
//! count, itself capped at [`MAX_SM_COUNT`].

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use hdrhistogram::Histogram;

use crate::decode::Buffer;
use crate::format::SlotHeader;
use crate::format::{Event, EventKind};
use crate::registry::{unknown_event_name, EventRegistry};

mod launch;
mod open;
mod picture;
mod svg;
#[cfg(test)]
mod tests;
mod watchdog;

use open::{Open, MAX_OPEN, NO_LANE};
use picture::Picture;
pub use picture::{SvgOptions, MAX_SVG_WIDTH, MIN_SVG_WIDTH};

/// The most SMs a device may declare: [`Timeline::set_sm_count`] caps its
/// argument here, so a capture cannot make the report list billions of idle SMs
/// (an H200 has 132; the largest GPUs today, under 200).
pub const MAX_SM_COUNT: u32 = 4096;

/// Durations kept exactly, per event type, before they go into a histogram:
/// up to this many, percentiles are exact (and a type with few events costs
/// 8 bytes each, not a histogram's kilobytes).
const EXACT_UP_TO: usize = 1024;
/// Significant digits of the duration histograms: 3 keeps every value within
/// 1 part in 1024 (under 0.1%), what the report's three digits show.
const SIGNIFICANT_DIGITS: u8 = 3;

/// The events of one or more launches, summed up as they are added, for
/// [`Timeline::report`] and [`Timeline::to_svg`].
///
/// Launches added to one timeline should come from the same GPU: their times
/// share one device clock, so several launches of a kernel show side by side.
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    names: BTreeMap<u16, String>,
    sm_count: u32,
    title: String,
    types: BTreeMap<u16, TypeAcc>,
    sms: BTreeMap<u32, SmAcc>,
    launches: usize,
    window_ns: u64,
    /// The earliest warp start and the latest warp end over the launches.
    span: Option<(u64, u64)>,
    events: u64,
    warps: u64,
    dropped: u64,
    migrated: u64,
    /// The launch being given slot by slot ([`Timeline::push_slot`]).
    pending: Pending,
    /// The streamed launches whose last part is still to come
    /// ([`Timeline::add_part`]), by launch id.
    streaming: BTreeMap<u64, Open>,
    /// Parts added so far.
    parts: u64,
    /// What the sampled buffers sampled, each way once (at most
    /// [`MAX_SAMPLINGS`]).
    sampled: BTreeSet<String>,
    picture: Option<Picture>,
}

/// Ways of sampling a report names; past them, it says there were more.
const MAX_SAMPLINGS: usize = 8;

/// A launch given slot by slot, kept until the next one begins.
#[derive(Debug, Clone, Default)]
struct Pending {
    open: bool,
    slots: Vec<SlotRec>,
    events: Vec<Event>,
}

impl Pending {
    fn push(&mut self, header: &SlotHeader, events: impl IntoIterator<Item = Event>) {
        let at = self.events.len();
        self.events.extend(events);
        let len = self.events.len() - at;
        self.slots.push(SlotRec::new(header, at, len));
    }
}

/// One slot (warp) of the launch being added.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SlotRec {
    /// Its warp: (linear block index, warp in the block).
    warp: (u32, u32),
    sm: u32,
    first_ts: u64,
    last_ts: u64,
    dropped: u32,
    migrated: bool,
    /// Where its events are: the slot's position in the buffer's list, or its
    /// first event in [`Pending::events`].
    at: usize,
    len: usize,
    /// Its lane in the picture, once a part of its launch drew it.
    lane: u32,
}

impl SlotRec {
    fn new(h: &SlotHeader, at: usize, len: usize) -> SlotRec {
        SlotRec {
            warp: (h.block_linear, h.warp),
            sm: h.sm_first,
            first_ts: h.first_ts,
            last_ts: h.last_ts,
            dropped: h.events_lost,
            migrated: h.sm_first != h.sm_last,
            at,
            len,
            lane: NO_LANE,
        }
    }
}

/// Per event type, as events arrive.
#[derive(Debug, Clone, Default)]
struct TypeAcc {
    count: u64,
    instants: u64,
    ranges: u64,
    total: u128,
    min: u64,
    max: u64,
    durations: Durations,
}

/// The range durations of one type: exactly while few, then a histogram.
#[derive(Debug, Clone)]
enum Durations {
    Few(Vec<u64>),
    Many(Box<Histogram<u64>>),
}

impl Default for Durations {
    fn default() -> Self {
        Durations::Few(Vec::new())
    }
}

impl TypeAcc {
    fn add(&mut self, e: &Event) {
        self.count += 1;
        if e.kind == EventKind::Instant {
            self.instants += 1;
            return;
        }
        let d = e.end_ns.saturating_sub(e.start_ns);
        self.min = if self.ranges == 0 { d } else { self.min.min(d) };
        self.max = self.max.max(d);
        self.ranges += 1;
        self.total += u128::from(d);
        match &mut self.durations {
            Durations::Few(v) if v.len() < EXACT_UP_TO => v.push(d),
            Durations::Few(v) => {
                let mut h = Histogram::new(SIGNIFICANT_DIGITS)
                    .expect("3 significant digits is a valid histogram");
                for &x in v.iter().chain([&d]) {
                    record(&mut h, x);
                }
                self.durations = Durations::Many(Box::new(h));
            }
            Durations::Many(h) => record(h, d),
        }
    }

    /// Nearest-rank percentile `p` of the range durations: exact from the few
    /// kept, else from the histogram (within its precision, and never outside
    /// the exact minimum and maximum).
    fn percentile(&self, p: f64) -> u64 {
        match &self.durations {
            Durations::Few(v) => {
                let mut v = v.clone();
                v.sort_unstable();
                nearest_rank(&v, p)
            }
            Durations::Many(h) => h.value_at_quantile(p / 100.0).clamp(self.min, self.max),
        }
    }
}

/// Records `v`; the histogram grows to any `u64`, and were it to fail, the
/// value is clamped into its range rather than lost.
fn record(h: &mut Histogram<u64>, v: u64) {
    if h.record(v).is_err() {
        h.saturating_record(v);
    }
}

/// Per SM, as launches are added.
#[derive(Debug, Clone, Copy, Default)]
struct SmAcc {
    warps: u64,
    events: u64,
    busy_ns: u64,
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
    /// Sum of the range durations over all warps, ns (saturates at `u64::MAX`).
    pub total_ns: u64,
    /// Mean range duration, ns (zero without ranges).
    pub mean_ns: f64,
    /// Median range duration (nearest rank), ns: exact up to 1024 ranges of
    /// the type, within 0.1% beyond (a histogram).
    pub p50_ns: u64,
    /// 99th percentile of the range durations (nearest rank), ns; exact or
    /// within 0.1% as `p50_ns`.
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
    /// Sum of the launch windows (each from its first warp's start to its
    /// last warp's end), ns.
    pub window_ns: u64,
    /// From the earliest warp start to the latest warp end over all the
    /// launches, ns (device clock): the wall time they spread over, gaps
    /// between launches included; what the SVG's time axis spans. Equals
    /// `window_ns` for one launch.
    pub span_ns: u64,
    /// Events recorded.
    pub events: u64,
    /// Events lost: made by the warps, not in the buffers (a full slot or
    /// ring; [`crate::decode::Slot::events_lost`]).
    pub events_lost: u64,
    /// Warps that ran on more than one SM (counted on their first).
    pub migrated_warps: u64,
    /// What the launches sampled, each way once (`Sampling::describe`), and
    /// "more" past eight ways; empty when every launch recorded every warp.
    /// The statistics are over the sampled warps only.
    pub sampled: Vec<String>,
    /// Per event type, by id.
    pub types: Vec<TypeStats>,
    /// Per SM, by `%smid`: every SM that recorded something, and those that
    /// recorded nothing (busy 0) below the SM count, when it is known.
    pub sms: Vec<SmStats>,
}

impl Timeline {
    /// An empty timeline that keeps statistics only ([`Timeline::to_svg`] has
    /// no picture to draw).
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty timeline that also bins each launch, as it is added, for
    /// [`Timeline::to_svg`] (out-of-range options are brought into range).
    pub fn with_svg(options: SvgOptions) -> Self {
        Timeline {
            picture: Some(Picture::new(options)),
            ..Self::default()
        }
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

    /// Adds a decoded buffer (one launch): all its flushed slots and events.
    /// Nothing of it is kept but its statistics (and its binned picture).
    pub fn add_buffer(&mut self, buffer: &Buffer<'_>) {
        self.close_pending();
        let mut open = Open::default();
        self.fold_buffer(&mut open, buffer, false);
        self.close_open(open);
    }

    /// Folds a buffer's slots into `open`.
    fn fold_buffer(&mut self, open: &mut Open, buffer: &Buffer<'_>, streamed: bool) {
        let h = buffer.header();
        if h.is_sampled() && self.sampled.len() <= MAX_SAMPLINGS {
            self.sampled.insert(h.sampling.describe(h.warps_per_block));
        }
        let slots: Vec<_> = buffer.slots().collect();
        let mut recs: Vec<SlotRec> = slots
            .iter()
            .enumerate()
            .map(|(i, s)| SlotRec::new(&s.header, i, s.event_count() as usize))
            .collect();
        self.fold_slots(open, &mut recs, streamed, |r, out| {
            out.extend(slots[r.at].events())
        });
    }

    /// Sets the GPU's SM count, so that SMs that recorded nothing still show
    /// (with zero busy time) in the report and the picture; capped at
    /// [`MAX_SM_COUNT`].
    pub fn set_sm_count(&mut self, sm_count: u32) {
        self.sm_count = sm_count.min(MAX_SM_COUNT);
    }

    /// Sets the title of the report and the picture.
    pub fn set_title(&mut self, title: impl Into<String>) {
        self.title = title.into();
    }

    /// Starts a new launch: the slots pushed next ([`Timeline::push_slot`])
    /// belong to it ([`Timeline::add_buffer`] does this itself). Busy
    /// fractions are taken over each launch's own window, so that the time
    /// between launches does not count as idle.
    pub fn begin_capture(&mut self) {
        self.close_pending();
        self.pending.open = true;
    }

    /// Adds one flushed slot (one warp) and its events, in the order the
    /// device wrote them. Starts a launch first if none was begun. The
    /// launch's events are kept until the next one begins (or the report is
    /// made): prefer [`Timeline::add_buffer`], which keeps none.
    pub fn push_slot(&mut self, header: &SlotHeader, events: impl IntoIterator<Item = Event>) {
        if !self.pending.open {
            self.begin_capture();
        }
        self.pending.push(header, events);
    }

    /// Number of events added.
    pub fn event_count(&self) -> usize {
        usize::try_from(self.events).unwrap_or(usize::MAX) + self.pending.events.len()
    }

    fn name_of(&self, id: u16) -> String {
        self.names
            .get(&id)
            .cloned()
            .unwrap_or_else(|| unknown_event_name(id))
    }

    /// Adds a part of streamed launch `launch_id` (a long-running kernel
    /// drained while it ran, in parts), as it comes; the parts of several
    /// launches may come interleaved. The part is folded in at once and none
    /// of its events is kept: its last part (`last`) adds the launch, all its
    /// parts as one launch, a warp in several parts one warp (counted on its
    /// first part's SM), the launch window over every part. What a launch
    /// keeps between its parts is bounded whatever its length (its warps, up
    /// to 2²⁰ of them, and per SM the union of its ranges, up to 2²⁰ intervals
    /// in all, past which the oldest are summed); at most 1024 launches are
    /// followed at once (past that, the one updated longest ago is added as
    /// it stands).
    pub fn add_part(&mut self, launch_id: u64, buffer: &Buffer<'_>, last: bool) {
        self.close_pending();
        self.parts += 1;
        let mut open = match self.streaming.remove(&launch_id) {
            Some(open) => open,
            None => {
                if self.streaming.len() >= MAX_OPEN {
                    let stalest = self.streaming.iter().min_by_key(|(_, o)| o.touched);
                    if let Some(id) = stalest.map(|(&id, _)| id) {
                        let open = self.streaming.remove(&id).unwrap_or_default();
                        self.close_open(open);
                    }
                }
                Open::default()
            }
        };
        open.touched = self.parts;
        self.fold_buffer(&mut open, buffer, true);
        if last {
            self.close_open(open);
        } else {
            self.streaming.insert(launch_id, open);
        }
    }

    /// Adds the streamed launches whose last part has not come (the run ended
    /// while they ran) with what their parts hold.
    pub fn end_parts(&mut self) {
        for (_, open) in std::mem::take(&mut self.streaming) {
            self.close_open(open);
        }
    }

    /// Folds the launch given slot by slot into the statistics.
    fn close_pending(&mut self) {
        if !self.pending.open {
            return;
        }
        let Pending {
            mut slots, events, ..
        } = std::mem::take(&mut self.pending);
        let mut open = Open::default();
        self.fold_slots(&mut open, &mut slots, false, |r, out| {
            out.extend_from_slice(&events[r.at..r.at + r.len])
        });
        self.close_open(open);
    }

    /// The timeline with the launch given slot by slot folded in.
    fn closed(&self) -> Cow<'_, Timeline> {
        if !self.pending.open {
            Cow::Borrowed(self)
        } else {
            let mut t = self.clone();
            t.close_pending();
            Cow::Owned(t)
        }
    }

    /// Computes the statistics.
    pub fn report(&self) -> Report {
        let t = self.closed();
        let types = t
            .types
            .iter()
            .map(|(&id, a)| TypeStats {
                id,
                name: t.name_of(id),
                count: a.count,
                instants: a.instants,
                total_ns: u64::try_from(a.total).unwrap_or(u64::MAX),
                mean_ns: if a.ranges == 0 {
                    0.0
                } else {
                    a.total as f64 / a.ranges as f64
                },
                p50_ns: a.percentile(50.0),
                p99_ns: a.percentile(99.0),
                min_ns: a.min,
                max_ns: a.max,
            })
            .collect();
        // The SMs seen, and the idle ones below the SM count.
        let mut sms: BTreeMap<u32, SmAcc> =
            (0..t.sm_count).map(|sm| (sm, SmAcc::default())).collect();
        sms.extend(t.sms.iter().map(|(&sm, &a)| (sm, a)));
        let sms = sms
            .into_iter()
            .map(|(sm, a)| SmStats {
                sm,
                warps: a.warps,
                events: a.events,
                busy_ns: a.busy_ns,
                busy_fraction: if t.window_ns == 0 {
                    0.0
                } else {
                    (a.busy_ns as f64 / t.window_ns as f64).min(1.0)
                },
            })
            .collect();
        Report {
            title: t.title.clone(),
            launches: t.launches,
            window_ns: t.window_ns,
            span_ns: t.span.map_or(0, |(a, b)| b - a),
            events: t.events,
            events_lost: t.dropped,
            migrated_warps: t.migrated,
            sampled: {
                let mut ways: Vec<String> = t.sampled.iter().take(MAX_SAMPLINGS).cloned().collect();
                if t.sampled.len() > MAX_SAMPLINGS {
                    ways.push("more".into());
                }
                ways
            },
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

/// Splits one warp's ranges into segments `(start, end, id)` that each show the
/// innermost open range: a nested phase hides its parent while it runs.
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

/// Total length covered by the intervals (sorts them in place).
pub(crate) fn union_length(intervals: &mut [(u64, u64)]) -> u64 {
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
fn format_ns(ns: f64) -> String {
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

impl Report {
    /// The launch window(s) and the wall span, worded alike in the text and
    /// in the SVG's header.
    pub(crate) fn time_line(&self) -> String {
        if self.launches <= 1 {
            format!(
                "launch window {} (first warp start to last warp end)",
                format_ns(self.window_ns as f64)
            )
        } else {
            format!(
                "launch windows {} summed (each first warp start to last warp end), wall span {} (first launch start to last launch end)",
                format_ns(self.window_ns as f64),
                format_ns(self.span_ns as f64)
            )
        }
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.title.is_empty() {
            writeln!(f, "{}", self.title)?;
        }
        writeln!(
            f,
            "{} launch{}, {} events, {} events lost, {} migrated warp{}; {}",
            self.launches,
            if self.launches == 1 { "" } else { "es" },
            self.events,
            self.events_lost,
            self.migrated_warps,
            if self.migrated_warps == 1 { "" } else { "s" },
            self.time_line(),
        )?;
        if !self.sampled.is_empty() {
            writeln!(
                f,
                "sampled: {}; every figure below is over the sampled warps only",
                self.sampled.join("; ")
            )?;
        }
        writeln!(
            f,
            "durations: total summed over warps; p50 and p99 exact up to {EXACT_UP_TO} ranges of a type, within 0.1% beyond"
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
            "{:<name_w$}  {:>10}  {:>25}  {:>10}  {:>10}  {:>10}  {:>10}",
            "event", "count", "total (summed over warps)", "mean", "p50", "p99", "max"
        )?;
        for t in &self.types {
            writeln!(
                f,
                "{:<name_w$}  {:>10}  {:>25}  {:>10}  {:>10}  {:>10}  {:>10}",
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
