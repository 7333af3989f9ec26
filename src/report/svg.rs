//! The SVG timeline: SMs against time, in a picture of bounded size.

use std::fmt::Write as _;

use super::{format_ns, SlotRec, Timeline};
use crate::format::{Event, EventKind};

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

/// A qualitative palette (Tableau 10), readable on white, one color per type.
pub(super) const PALETTE: [&str; 10] = [
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#bab0ac",
];

/// Opacity levels of a partly covered bin; quantized so that neighbours merge.
pub(super) const LEVELS: u8 = 4;

pub(super) const MARGIN_LEFT: f64 = 64.0;
pub(super) const MARGIN_RIGHT: f64 = 24.0;
/// Top of the legend; the plot starts below the legend.
pub(super) const PLOT_TOP_BASE: f64 = 56.0;
pub(super) const ROW_GAP: f64 = 1.0;

/// Lanes of the SM rows.
pub(super) struct Layout {
    /// Lanes per SM row.
    pub(super) lanes_per_sm: u32,
    /// Per slot, its lane (row-major: `sm * lanes_per_sm + lane`).
    pub(super) lane_of_slot: Vec<u32>,
}

/// Assigns each slot a lane within its SM row: a warp takes the first lane that
/// is free when it starts (interval colouring), so concurrent warps stack and
/// warps that follow each other share a lane. Past `cap` lanes, a warp shares
/// the lane that frees first.
pub(super) fn layout(slots: &[SlotRec], cap: u32) -> Layout {
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
pub(super) fn flatten(events: &[Event], sorted: &mut Vec<Event>, out: &mut Vec<(u64, u64, u16)>) {
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
pub(super) fn nice_step(min: f64) -> f64 {
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
pub(super) fn xml_escape(s: &str) -> String {
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
pub(super) struct Run {
    lane: u32,
    start: u32,
    end: u32,
    k: u16,
    level: u8,
}

/// Bins every lane's segments (`(start, end, type slot)`, device ns) at
/// `bins` bins over `[t0, t0 + dur)` and returns the runs of bins that share
/// their dominant type and opacity level.
pub(super) fn bin_runs(
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
pub(super) fn rect(
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
pub(super) fn push_fixed2(out: &mut String, v: f64) {
    let c = (v.max(0.0) * 100.0).round() as u64;
    let _ = write!(out, "{}.{:02}", c / 100, c % 100);
}

/// `2.5000` → `"2.5"`, `3.0` → `"3"`.
pub(super) fn trim_float(v: f64) -> String {
    let s = format!("{v:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".into()
    } else {
        s.into()
    }
}
