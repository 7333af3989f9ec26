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
use std::fmt;

use crate::decode::Buffer;
use crate::format::SlotHeader;
use crate::format::{Event, EventKind};
use crate::registry::{unknown_event_name, EventRegistry};

mod svg;
#[cfg(test)]
mod tests;

pub use svg::SvgOptions;

/// The slot (one warp) events came from: where and when it ran.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SlotRec {
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
pub(crate) struct CaptureRec {
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
