//! The SVG timeline: SMs against time, in a picture of bounded size, drawn
//! from the binned launches (`picture.rs`).

use std::fmt::Write as _;

use super::picture::{Fitted, LEVELS};
use super::{format_ns, Timeline, TypeStats};

/// A qualitative palette (Tableau 10), readable on white, one color per type;
/// with more types than colors, the last is "other".
pub(super) const PALETTE: [&str; 10] = [
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#bab0ac",
];

pub(super) const MARGIN_LEFT: f64 = 64.0;
pub(super) const MARGIN_RIGHT: f64 = 24.0;
/// Top of the legend; the plot starts below the legend.
pub(super) const PLOT_TOP_BASE: f64 = 56.0;
pub(super) const ROW_GAP: f64 = 1.0;

/// Which colour each event type gets: its own while the types fit the
/// palette, by id order (stable across pictures of one kernel); otherwise the
/// types with the most time get one each, by id order, and the others share
/// the last colour ("other"), so the picture's size and the cost of binning
/// do not grow with the number of types.
pub(super) struct Colours {
    /// `(event id, colour slot)`, by id.
    slot_of: Vec<(u16, u16)>,
    /// Per colour slot, its legend text.
    pub(super) legend: Vec<String>,
    /// Per colour slot, the name tooltips give.
    pub(super) names: Vec<String>,
}

impl Colours {
    pub(super) fn new(types: &[TypeStats]) -> Colours {
        let legend_of = |t: &TypeStats| {
            format!(
                "{}: {} × p50 {} p99 {}",
                t.name,
                t.count,
                format_ns(t.p50_ns as f64),
                format_ns(t.p99_ns as f64)
            )
        };
        if types.len() <= PALETTE.len() {
            return Colours {
                slot_of: types.iter().zip(0..).map(|(t, i)| (t.id, i)).collect(),
                legend: types.iter().map(legend_of).collect(),
                names: types.iter().map(|t| t.name.clone()).collect(),
            };
        }
        let own = PALETTE.len() - 1;
        let mut by_time: Vec<&TypeStats> = types.iter().collect();
        by_time.sort_unstable_by_key(|t| (std::cmp::Reverse((t.total_ns, t.count)), t.id));
        let mut chosen: Vec<&TypeStats> = by_time[..own].to_vec();
        chosen.sort_unstable_by_key(|t| t.id);
        let others = &by_time[own..];
        let mut legend: Vec<String> = chosen.iter().map(|t| legend_of(t)).collect();
        legend.push(format!(
            "{} other types: {} events",
            others.len(),
            others.iter().map(|t| t.count).sum::<u64>()
        ));
        let mut names: Vec<String> = chosen.iter().map(|t| t.name.clone()).collect();
        names.push("other".into());
        Colours {
            slot_of: chosen.iter().zip(0..).map(|(t, i)| (t.id, i)).collect(),
            legend,
            names,
        }
    }

    /// The colour slot of event type `id` in a picture drawn beside this one: its own,
    /// or "other" for a type this picture puts there; `None` for a type it does not
    /// know, which the other picture colours itself.
    pub(super) fn known(&self, id: u16) -> Option<u32> {
        match self.slot_of.binary_search_by_key(&id, |&(i, _)| i) {
            Ok(i) => Some(u32::from(self.slot_of[i].1)),
            // More types than colours: the others share the last.
            Err(_) if self.names.len() > self.slot_of.len() => Some(self.slot_of.len() as u32),
            Err(_) => None,
        }
    }

    /// The colour slot of event type `id` (any other value: "other").
    pub(super) fn slot(&self, id: u32) -> u32 {
        match u16::try_from(id).map(|id| self.slot_of.binary_search_by_key(&id, |&(i, _)| i)) {
            Ok(Ok(i)) => u32::from(self.slot_of[i].1),
            _ => (self.legend.len() - 1) as u32,
        }
    }
}

impl Timeline {
    /// Draws the timeline: one row per SM (top to bottom), time left to right,
    /// each warp's phases as colored rectangles in its lane, instants as thin
    /// marks, a legend and a time axis from the first warp's start. `None`
    /// for a timeline made without [`Timeline::with_svg`].
    pub fn to_svg(&self) -> Option<String> {
        let t = self.closed();
        let picture = t.picture.as_ref()?;
        let options = picture.options();
        let report = t.report();
        let colours = Colours::new(&report.types);
        let slot = |id: u32| colours.slot(id);
        let Fitted {
            t0,
            dur,
            bins,
            runs,
        } = picture.fitted(slot).unwrap_or(Fitted {
            t0: 0,
            dur: 1.0,
            bins: 64,
            runs: Vec::new(),
        });
        // One row per SM of the report: those seen, and the idle ones below the SM count.
        let rows = report.sms.len().max(1) as u64;
        let row_of = |sm: u32| report.sms.binary_search_by_key(&sm, |s| s.sm).unwrap_or(0) as u64;
        let lanes_per_sm = u64::from(picture.lanes_per_sm());
        let lane_of = |sm: u32, lane: u32| row_of(sm) * lanes_per_sm + u64::from(lane);
        let width = f64::from(options.width);
        let budget = options.max_rects;
        // Lane height: aim for a picture about 1600 px tall, 1 to 8 px a lane.
        let lane_h = (1600.0 / (rows * lanes_per_sm) as f64).clamp(1.0, 8.0);
        let row_h = lane_h * lanes_per_sm as f64 + ROW_GAP;
        let lane_y = |lane: u64| {
            PLOT_TOP_BASE
                + (lane / lanes_per_sm) as f64 * row_h
                + (lane % lanes_per_sm) as f64 * lane_h
        };
        let bin_ns = dur / f64::from(bins);
        let bin_px = width / f64::from(bins);

        // Instants: one mark per (lane, pixel, colour), in what the budget leaves.
        let pixel = |t: u64| (t.saturating_sub(t0) as f64 / dur * width) as u64;
        let mut instants: Vec<(u64, u64, u32)> = picture
            .marks()
            .map(|m| (lane_of(m.sm, m.lane), m.t, slot(u32::from(m.k))))
            .collect();
        instants.sort_unstable_by_key(|&(lane, t, k)| (lane, pixel(t), k));
        instants.dedup_by_key(|&mut (lane, t, k)| (lane, pixel(t), k));
        let room = budget.saturating_sub(runs.len());
        let cut = (runs.len().saturating_sub(budget) + instants.len().saturating_sub(room)) as u64
            + picture.cut();

        let header_h = 22.0 * colours.legend.len().div_ceil(4) as f64;
        let plot_top = PLOT_TOP_BASE + header_h;
        let plot_h = row_h * rows as f64;
        let total_w = MARGIN_LEFT + width + MARGIN_RIGHT;
        let total_h = plot_top + plot_h + 44.0;

        let mut svg = String::with_capacity(64 * (runs.len() + instants.len()).min(budget) + 4096);
        let _ = write!(
            svg,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{total_w:.0}" height="{total_h:.0}" viewBox="0 0 {total_w:.0} {total_h:.0}" font-family="sans-serif" font-size="12">"#
        );
        svg.push_str("\n<style>");
        for (i, colour) in PALETTE.iter().enumerate().take(colours.legend.len().max(1)) {
            let _ = write!(svg, ".t{i}{{fill:{colour}}}");
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
        let title = if t.title.is_empty() {
            "tracing-gpu timeline"
        } else {
            &t.title
        };
        let subtitle = format!(
            "{} events, {} warps, {} SMs, {} launch{}; {}. One row per SM, one lane per concurrent warp; a nested phase hides its parent.",
            report.events,
            t.warps,
            rows,
            report.launches,
            if report.launches == 1 { "" } else { "es" },
            report.time_line()
        );
        let _ = write!(
            svg,
            "\n<text x=\"{MARGIN_LEFT}\" y=\"20\" font-size=\"15\" font-weight=\"bold\">{}</text><text x=\"{MARGIN_LEFT}\" y=\"36\" class=\"lab\">{}</text>",
            xml_escape(title),
            xml_escape(&subtitle)
        );
        svg.push_str("\n<g class=\"legend\">");
        for (i, text) in colours.legend.iter().enumerate() {
            let x = MARGIN_LEFT + (i % 4) as f64 * (width / 4.0);
            let y = PLOT_TOP_BASE - 8.0 + (i / 4) as f64 * 22.0;
            let _ = write!(
                svg,
                "<rect class=\"t{i}\" x=\"{x:.1}\" y=\"{y:.1}\" width=\"14\" height=\"14\"/><text x=\"{:.1}\" y=\"{:.1}\">{}</text>",
                x + 20.0,
                y + 11.5,
                xml_escape(text)
            );
        }
        svg.push_str("</g>");

        // Everything below the legend is shifted down by its height.
        let _ = write!(svg, "\n<g transform=\"translate(0,{header_h:.1})\">");

        // Row stripes and labels, labels at least 11 px apart.
        let label_every = (11.0 / row_h).ceil().max(1.0) as usize;
        svg.push_str("\n<g class=\"rows\">");
        for (row, s) in report.sms.iter().enumerate() {
            let y = lane_y(row as u64 * lanes_per_sm);
            if row % 2 == 1 {
                let _ = write!(
                    svg,
                    r##"<rect x="{MARGIN_LEFT}" y="{y:.2}" width="{width:.1}" height="{:.2}" fill="#f0f0f0"/>"##,
                    row_h - ROW_GAP
                );
            }
            if row % label_every == 0 {
                let _ = write!(
                    svg,
                    "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" class=\"lab\" font-size=\"10\" dominant-baseline=\"middle\">SM {}</text>",
                    MARGIN_LEFT - 6.0,
                    y + (row_h - ROW_GAP) / 2.0,
                    s.sm
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
                    colours.names[r.k as usize],
                    format_ns(f64::from(r.start) * bin_ns),
                    format_ns(f64::from(r.end) * bin_ns),
                    r.sm
                )
            });
            let x = MARGIN_LEFT + f64::from(r.start) * bin_px;
            let w = f64::from(r.end - r.start) * bin_px;
            let level = (r.level < u16::from(LEVELS)).then_some(r.level);
            rect(
                &mut svg,
                (r.k, level, false),
                (x, lane_y(lane_of(r.sm, r.lane)), w, lane_h),
                tip,
            );
        }
        for &(lane, t, k) in instants.iter().take(room) {
            let x = MARGIN_LEFT + t.saturating_sub(t0) as f64 / dur * width - 0.5;
            let tip = tooltips.then(|| {
                format!(
                    "{} at {} (SM {})",
                    colours.names[k as usize],
                    format_ns(t.saturating_sub(t0) as f64),
                    report.sms[(lane / lanes_per_sm) as usize].sm
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
        Some(svg)
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

/// Writes one `<rect>`: type slot, opacity level (none: opaque), whether it
/// marks an instant; position and size; a tooltip if given.
pub(super) fn rect(
    out: &mut String,
    (k, level, instant): (u32, Option<u16>, bool),
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
