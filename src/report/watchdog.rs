//! The watchdog's snapshots drawn (issue #32): SMs against their current phases.
//!
//! A panel per snapshot: one row per SM, each warp running there a cell coloured by its
//! innermost open phase (the timeline's colour for that event type) and shaded by how
//! long it has been in it, the warps between phases outlined; the warps done on an SM
//! are counted at the end of its row, those not started in the legend, with every
//! count. A row's cells are sorted (by phase, then the longest first) and each run of
//! equal cells is one rectangle, so a panel holds a few rectangles per SM whatever the
//! number of warps.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use super::svg::{push_fixed2, xml_escape, Colours, MARGIN_LEFT, MARGIN_RIGHT, PALETTE};
use super::{SvgOptions, Timeline};
use crate::capture::Capture;
use crate::registry::EventRegistry;
use crate::watch::{count, duration, group_line, Snapshot, State};

/// The most snapshots a picture draws: the latest (the text tells every one).
const MAX_PANELS: usize = 8;
/// The most SM rows a panel draws (a GPU has under 200 SMs).
const MAX_ROWS: usize = 1024;
/// The most rectangles of warps a panel draws.
const MAX_RUNS: usize = 20_000;
/// Shades of the time in a phase: a quarter of the longest, a half, ...
const SHADES: u8 = 4;
/// Room right of the cells for the count of warps done.
const DONE_W: f64 = 90.0;
/// The widest cell (a warp), in px.
const CELL_MAX: f64 = 14.0;
/// The colour of phases past the palette.
const OTHER: &str = "#7f7f7f";

/// What a running warp does, for its colour: its innermost open phase, or none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Doing {
    Phase(u16),
    Between,
}

/// Equal cells of a row: how many, and the least and most time in what they do.
#[derive(Debug, Clone, Copy)]
struct Cells {
    warps: u32,
    least_ns: u64,
    most_ns: u64,
}

/// One SM's warps.
#[derive(Debug, Default)]
struct Row {
    /// The running ones, by what they do and shade, darkest first.
    cells: BTreeMap<(Doing, Reverse<u8>), Cells>,
    running: u32,
    done: u32,
}

/// A snapshot sorted for drawing: what the panel shows, without its warps.
struct Panel {
    launch_id: u64,
    index: u32,
    title: String,
    /// The group of warps in one place longest, told.
    stuck: String,
    blocks_never_started: u32,
    rows: BTreeMap<u32, Row>,
    /// Running warps by what they do.
    doing: BTreeMap<Doing, u32>,
    done: u32,
    not_started: u32,
    /// The longest time a running warp has been in what it does.
    longest_ns: u64,
}

impl Panel {
    fn new(s: &Snapshot, registry: &EventRegistry) -> Panel {
        let age = |since: Option<u64>| s.now_ns.saturating_sub(since.unwrap_or(s.now_ns));
        let longest_ns = s.warps.iter().map(|w| age(w.since_ns())).max().unwrap_or(0);
        let [x, y, z] = s.grid;
        let title = format!(
            "launch {} ({}, grid {x}x{y}x{z}, {} per block), snapshot {}: still running after {}",
            s.launch_id,
            s.kernel,
            count(s.warps_per_block, "warp"),
            s.index + 1,
            duration(s.running_ns)
        );
        let mut stuck = String::new();
        match s.groups().first() {
            Some(g) => {
                stuck.push_str("longest: ");
                group_line(&mut stuck, g, registry);
            }
            None => stuck.push_str("no warp running"),
        }
        let mut p = Panel {
            launch_id: s.launch_id,
            index: s.index,
            title,
            stuck,
            blocks_never_started: s.blocks().never_started,
            rows: BTreeMap::new(),
            doing: BTreeMap::new(),
            done: 0,
            not_started: 0,
            longest_ns,
        };
        for w in &s.warps {
            let open = match &w.state {
                State::NotStarted => {
                    p.not_started += 1;
                    continue;
                }
                State::Done { .. } => {
                    p.done += 1;
                    p.rows.entry(w.sm).or_default().done += 1;
                    continue;
                }
                State::Running { open, .. } => open,
            };
            let doing = open.last().map_or(Doing::Between, |o| Doing::Phase(o.id));
            let ns = age(w.since_ns());
            *p.doing.entry(doing).or_default() += 1;
            let row = p.rows.entry(w.sm).or_default();
            row.running += 1;
            let c = row
                .cells
                .entry((doing, Reverse(shade(ns, longest_ns))))
                .or_insert(Cells {
                    warps: 0,
                    least_ns: ns,
                    most_ns: ns,
                });
            c.warps += 1;
            c.least_ns = c.least_ns.min(ns);
            c.most_ns = c.most_ns.max(ns);
        }
        p
    }
}

/// The shade of `ns` in a phase, 1 (under a quarter of the longest) to [`SHADES`].
fn shade(ns: u64, longest_ns: u64) -> u8 {
    if longest_ns == 0 {
        return SHADES;
    }
    let s = (u128::from(ns) * u128::from(SHADES)).div_ceil(u128::from(longest_ns));
    s.clamp(1, u128::from(SHADES)) as u8
}

/// Each phase's CSS class: the timeline's colour where it has one for the type, else a
/// colour it leaves free (by id), else [`OTHER`]'s.
fn phase_classes(colours: &Colours, ids: &BTreeSet<u16>) -> BTreeMap<u16, String> {
    let mut free = colours.names.len()..PALETTE.len();
    ids.iter()
        .map(|&id| {
            let class = match colours.known(id).or_else(|| free.next().map(|s| s as u32)) {
                Some(slot) => format!("t{slot}"),
                None => "tx".to_string(),
            };
            (id, class)
        })
        .collect()
}

impl Timeline {
    /// Draws the watchdog's snapshots that `capture` keeps (issue #32: launches still
    /// running past their deadline), of launch `launch` only if given, the latest 8: for
    /// each, SMs against their current phases. One row per SM; each warp running there
    /// is a cell coloured by its innermost open phase, as this timeline colours that
    /// event type, and shaded by how long it has been in it (full: the longest); warps
    /// between phases are outlined, those done counted at the row's end, those not
    /// started in the legend, which counts every kind. As wide as this timeline's
    /// picture ([`SvgOptions::width`]; the default for a timeline without one). `None`
    /// if the capture keeps no such snapshot (a capture before they were kept holds
    /// only their text: [`Capture::snapshots`]).
    pub fn snapshots_svg(&self, capture: &Capture, launch: Option<u64>) -> Option<String> {
        let notes: Vec<usize> = capture
            .kept_snapshots()
            .filter(|&(_, id)| launch.is_none_or(|l| l == id))
            .map(|(note, _)| note)
            .collect();
        let skipped = notes.len().saturating_sub(MAX_PANELS);
        // Read one at a time, each kept as what its panel shows.
        let panels: Vec<Panel> = notes[skipped..]
            .iter()
            .filter_map(|&note| capture.kept_snapshot(note))
            .map(|s| Panel::new(&s, &capture.registry))
            .collect();
        if panels.is_empty() {
            return None;
        }
        let ids: BTreeSet<u16> = panels
            .iter()
            .flat_map(|p| p.doing.keys())
            .filter_map(|d| match d {
                Doing::Phase(id) => Some(*id),
                Doing::Between => None,
            })
            .collect();
        let colours = Colours::new(&self.report().types);
        let classes = phase_classes(&colours, &ids);
        let width = f64::from(
            self.picture
                .as_ref()
                .map_or(SvgOptions::default().width, |p| p.options().width),
        );
        let mut body = String::new();
        let mut top = 0.0;
        if skipped > 0 {
            let _ = write!(
                body,
                "<text x=\"{MARGIN_LEFT}\" y=\"20\" class=\"lab\">the latest {MAX_PANELS} of {} snapshots (the text tells every one)</text>",
                skipped + MAX_PANELS
            );
            top = 28.0;
        }
        for p in &panels {
            top += draw_panel(&mut body, top, p, &capture.registry, &classes, width);
        }
        let total_w = MARGIN_LEFT + width + MARGIN_RIGHT;
        let mut svg = String::with_capacity(body.len() + 1024);
        let _ = write!(
            svg,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{total_w:.0}" height="{top:.0}" viewBox="0 0 {total_w:.0} {top:.0}" font-family="sans-serif" font-size="12">"#
        );
        svg.push_str("\n<style>");
        for (i, colour) in PALETTE.iter().enumerate() {
            let _ = write!(svg, ".t{i}{{fill:{colour}}}");
        }
        for l in 1..SHADES {
            let _ = write!(
                svg,
                ".o{l}{{fill-opacity:{:.2}}}",
                f64::from(l) / f64::from(SHADES)
            );
        }
        let _ = writeln!(
            svg,
            ".tx{{fill:{OTHER}}}.between{{fill:#fff;stroke:#555;stroke-width:0.8}}.done{{fill:#c7c7c7}}.ns{{fill:#fff;stroke:#999;stroke-dasharray:2 2}}.lab{{fill:#333}}</style>"
        );
        svg.push_str(r##"<rect width="100%" height="100%" fill="#fff"/>"##);
        svg.push_str(&body);
        svg.push_str("</svg>\n");
        Some(svg)
    }
}

/// Draws panel `p` at `top`: its title, legend and SM rows. Returns its height.
fn draw_panel(
    svg: &mut String,
    top: f64,
    p: &Panel,
    registry: &EventRegistry,
    classes: &BTreeMap<u16, String>,
    width: f64,
) -> f64 {
    let _ = write!(
        svg,
        "\n<g class=\"snapshot\" data-launch=\"{}\" data-snapshot=\"{}\">",
        p.launch_id, p.index
    );
    let _ = write!(
        svg,
        "<text x=\"{MARGIN_LEFT}\" y=\"{:.1}\" font-size=\"15\" font-weight=\"bold\">{}</text><text x=\"{MARGIN_LEFT}\" y=\"{:.1}\" class=\"lab\">{}</text>",
        top + 20.0,
        xml_escape(&p.title),
        top + 36.0,
        xml_escape(&p.stuck)
    );

    // The legend: every kind of cell, with its count.
    let mut legend: Vec<(&str, String)> = Vec::new();
    for (doing, &n) in &p.doing {
        legend.push(match doing {
            Doing::Phase(id) => (
                classes.get(id).map_or("tx", String::as_str),
                format!("{}: {}", registry.display_name(*id), count(n, "warp")),
            ),
            Doing::Between => ("between", format!("between phases: {}", count(n, "warp"))),
        });
    }
    if p.done > 0 {
        legend.push(("done", format!("done: {}", count(p.done, "warp"))));
    }
    if p.not_started > 0 {
        let never = p.blocks_never_started;
        let mut text = format!("not started: {}", count(p.not_started, "warp"));
        if never > 0 {
            let _ = write!(text, " ({} never started)", count(never, "block"));
        }
        legend.push(("ns", text));
    }
    let legend_top = top + 48.0;
    svg.push_str("<g class=\"legend\">");
    for (i, (class, text)) in legend.iter().enumerate() {
        let x = MARGIN_LEFT + (i % 4) as f64 * (width / 4.0);
        let y = legend_top + (i / 4) as f64 * 20.0;
        let _ = write!(
            svg,
            "<rect class=\"{class}\" x=\"{x:.1}\" y=\"{y:.1}\" width=\"14\" height=\"14\"/><text x=\"{:.1}\" y=\"{:.1}\">{}</text>",
            x + 20.0,
            y + 11.5,
            xml_escape(text)
        );
    }
    svg.push_str("</g>");
    let shade_y = legend_top + legend.len().div_ceil(4) as f64 * 20.0 + 12.0;
    let _ = write!(
        svg,
        "<text x=\"{MARGIN_LEFT}\" y=\"{shade_y:.1}\" class=\"lab\" font-size=\"11\">shade: how long a warp has been in its phase (between phases: since its latest entry), full at {}, lightest under {}</text>",
        duration(p.longest_ns),
        duration(p.longest_ns / u64::from(SHADES))
    );

    // The rows.
    let rows_top = shade_y + 12.0;
    let n_rows = p.rows.len().min(MAX_ROWS);
    let row_h = (1200.0 / n_rows.max(1) as f64).clamp(4.0, 12.0);
    let label_every = (11.0 / row_h).ceil().max(1.0) as usize;
    let most = p.rows.values().map(|r| r.running).max().unwrap_or(0).max(1);
    let cell_w = ((width - DONE_W) / f64::from(most)).min(CELL_MAX);
    let mut runs = 0usize;
    let mut runs_cut = 0usize;
    for (i, (sm, row)) in p.rows.iter().take(MAX_ROWS).enumerate() {
        let y = rows_top + i as f64 * row_h;
        let _ = write!(svg, "\n<g class=\"sm\" data-sm=\"{sm}\">");
        if i % label_every == 0 {
            let _ = write!(
                svg,
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" class=\"lab\" font-size=\"10\" dominant-baseline=\"middle\">SM {sm}</text>",
                MARGIN_LEFT - 6.0,
                y + row_h / 2.0
            );
        }
        let mut at = 0u32;
        for (&(doing, Reverse(level)), c) in &row.cells {
            if runs == MAX_RUNS {
                runs_cut += 1;
                continue;
            }
            runs += 1;
            let (class, what) = match doing {
                Doing::Phase(id) => (
                    classes.get(&id).map_or("tx", String::as_str),
                    format!("in {}", registry.display_name(id)),
                ),
                Doing::Between => ("between", "between phases".to_string()),
            };
            let _ = write!(svg, "<rect class=\"{class}");
            if level < SHADES {
                let _ = write!(svg, " o{level}");
            }
            svg.push_str("\" x=\"");
            push_fixed2(svg, MARGIN_LEFT + f64::from(at) * cell_w);
            svg.push_str("\" y=\"");
            push_fixed2(svg, y);
            svg.push_str("\" width=\"");
            push_fixed2(svg, f64::from(c.warps) * cell_w);
            svg.push_str("\" height=\"");
            push_fixed2(svg, row_h - 1.0);
            let mut tip = format!("SM {sm}: {} {what} for ", count(c.warps, "warp"));
            if duration(c.least_ns) != duration(c.most_ns) {
                let _ = write!(tip, "{} to ", duration(c.least_ns));
            }
            tip.push_str(&duration(c.most_ns));
            let _ = write!(svg, "\"><title>{}</title></rect>", xml_escape(&tip));
            at += c.warps;
        }
        if row.done > 0 {
            let _ = write!(
                svg,
                "<text x=\"{:.1}\" y=\"{:.1}\" class=\"lab\" font-size=\"10\" dominant-baseline=\"middle\">{} done</text>",
                MARGIN_LEFT + f64::from(most) * cell_w + 6.0,
                y + row_h / 2.0,
                count(row.done, "warp")
            );
        }
        svg.push_str("</g>");
    }
    let mut bottom = rows_top + n_rows as f64 * row_h + 8.0;
    let mut notes = Vec::new();
    if p.rows.len() > MAX_ROWS {
        notes.push(format!("{} more SMs not drawn", p.rows.len() - MAX_ROWS));
    }
    if runs_cut > 0 {
        notes.push(format!("{runs_cut} runs of warps not drawn"));
    }
    if !notes.is_empty() {
        bottom += 12.0;
        let _ = write!(
            svg,
            "<text x=\"{MARGIN_LEFT}\" y=\"{bottom:.1}\" class=\"lab\">{}</text>",
            notes.join("; ")
        );
    }
    svg.push_str("</g>");
    bottom + 16.0 - top
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::KeptSnapshot;
    use crate::format::BufferBuilder;
    use crate::watch::tests::{pipeline, registry, snapshot};
    use crate::watch::{Last, Open, Warp};

    const LOAD: u16 = 1;
    const WAIT: u16 = 2;
    const MAIN: u16 = 3;

    /// A capture keeping `snapshots`, named by `registry()`.
    fn keeping(snapshots: &[Snapshot]) -> Capture {
        let mut c = Capture {
            registry: registry(),
            ..Capture::default()
        };
        for s in snapshots {
            c.push_snapshot(KeptSnapshot::new(s, "text"));
        }
        c
    }

    /// Each SM row's `data-sm`, and the legend's texts.
    fn rows_and_legend(svg: &str) -> (Vec<u32>, Vec<String>) {
        let doc = roxmltree::Document::parse(svg).expect("valid XML");
        let class = |n: &roxmltree::Node, c: &str| n.attribute("class") == Some(c);
        let rows = doc
            .descendants()
            .filter(|n| class(n, "sm"))
            .map(|n| n.attribute("data-sm").unwrap().parse().unwrap())
            .collect();
        let legend = doc
            .descendants()
            .filter(|n| class(n, "legend"))
            .flat_map(|g| g.children().filter(|n| n.has_tag_name("text")))
            .map(|t| t.text().unwrap().to_string())
            .collect();
        (rows, legend)
    }

    /// The class of the cells that show warps in phase `name`: their tooltips say it.
    fn class_of(svg: &str, name: &str) -> String {
        let doc = roxmltree::Document::parse(svg).unwrap();
        let needle = format!("in {name} for");
        let cell = doc
            .descendants()
            .filter(|n| n.has_tag_name("rect"))
            .find(|r| {
                r.children()
                    .any(|t| t.text().is_some_and(|t| t.contains(&needle)))
            })
            .unwrap_or_else(|| panic!("no cell in {name}:\n{svg}"));
        let class = cell.attribute("class").unwrap();
        class.split(' ').next().unwrap().to_string()
    }

    #[test]
    fn a_snapshot_draws_its_sms_with_every_warp_counted() {
        // Block 0 on SM 0, block 1 on SM 1 (its producer stuck in load), block 2 done
        // on SM 2, block 3 never started.
        let s = snapshot(&pipeline(), 16, 4, 4_000_000_100);
        let svg = Timeline::new()
            .snapshots_svg(&keeping(&[s]), None)
            .expect("a snapshot kept");
        let (rows, legend) = rows_and_legend(&svg);
        assert_eq!(rows, [0, 1, 2]);
        assert_eq!(
            legend,
            [
                "load: 1 warp",
                "wait: 7 warps",
                "done: 4 warps",
                "not started: 4 warps (1 block never started)"
            ]
        );
        assert!(svg.contains(">4 warps done</text>"), "{svg}");
        assert!(
            svg.contains("longest: 7 warps in mainloop &gt; wait for 3.0 s"),
            "{svg}"
        );
        // SM 1: its 3 waiting warps in one cell, its producer in another.
        assert!(
            svg.contains("<title>SM 1: 3 warps in wait for 3.0 s</title>"),
            "{svg}"
        );
        assert!(
            svg.contains("<title>SM 1: 1 warp in load for 3.0 s</title>"),
            "{svg}"
        );
        // Of another launch only: nothing to draw.
        assert_eq!(Timeline::new().snapshots_svg(&keeping(&[]), None), None);
        let s = snapshot(&pipeline(), 16, 4, 4_000_000_100);
        assert_eq!(Timeline::new().snapshots_svg(&keeping(&[s]), Some(8)), None);
    }

    #[test]
    fn phases_take_the_timelines_colours() {
        // A timeline that saw wait and mainloop (ids 2 and 3): wait is its first colour,
        // and load, which it never saw, takes the first colour it leaves free.
        let mut b = BufferBuilder::new([1, 1, 1], [32, 1, 1], 8);
        b.warp(0, 0)
            .unwrap()
            .sm(0, 0)
            .range(WAIT, 10, 20, 0)
            .range(MAIN, 20, 30, 0);
        let bytes = b.finish();
        let mut t = Timeline::new();
        t.add_buffer(&crate::decode::Buffer::decode(&bytes, None).unwrap());
        let s = snapshot(&pipeline(), 16, 4, 4_000_000_100);
        let svg = t.snapshots_svg(&keeping(&[s]), None).unwrap();
        assert_eq!(class_of(&svg, "wait"), "t0");
        assert_eq!(class_of(&svg, "load"), "t2");
        // The timeline's own legend gives wait the same class.
        let mut t = Timeline::with_svg(SvgOptions::default());
        t.set_names(&registry());
        t.add_buffer(&crate::decode::Buffer::decode(&bytes, None).unwrap());
        let timeline = t.to_svg().unwrap();
        let wait = timeline.find(">wait: ").expect("wait in the legend");
        let swatch = timeline[..wait].rfind("<rect class=\"").unwrap();
        assert!(
            timeline[swatch..].starts_with("<rect class=\"t0\""),
            "{timeline}"
        );
    }

    #[test]
    fn a_full_gpu_is_a_small_picture() {
        // 132 SMs of 64 warps: a producer per 4 warps loading, the others waiting, each
        // since its own time; a few warps between phases.
        let now = 10_000_000_000u64;
        let warps = (0..132 * 64u32)
            .map(|slot| {
                let phase = if slot % 4 == 0 { LOAD } else { WAIT };
                let since = now - 1_000_000 * u64::from(slot % 97 + 1);
                let open = match slot % 61 {
                    0 => vec![],
                    _ => vec![
                        Open {
                            id: MAIN,
                            since_ns: 1_000,
                        },
                        Open {
                            id: phase,
                            since_ns: since,
                        },
                    ],
                };
                Warp {
                    slot,
                    sm: slot / 64,
                    state: State::Running {
                        open,
                        last: Some(Last {
                            id: LOAD,
                            payload: Some(slot % 7),
                        }),
                        last_entry_ns: Some(since),
                        started_ns: 1_000,
                    },
                }
            })
            .collect();
        let s = Snapshot {
            launch_id: 3,
            kernel: "persistent".into(),
            grid: [132, 1, 1],
            warps_per_block: 64,
            now_ns: now,
            running_ns: now,
            index: 0,
            warps,
        };
        let svg = Timeline::new().snapshots_svg(&keeping(&[s]), None).unwrap();
        let (rows, legend) = rows_and_legend(&svg);
        assert_eq!(rows, (0..132).collect::<Vec<_>>());
        let between = (0..132 * 64).filter(|s| s % 61 == 0).count();
        let load = (0..132 * 64).filter(|s| s % 4 == 0 && s % 61 != 0).count();
        assert_eq!(
            legend,
            [
                format!("load: {}", count(load as u32, "warp")),
                format!(
                    "wait: {}",
                    count((132 * 64 - load - between) as u32, "warp")
                ),
                format!("between phases: {between} warps"),
            ]
        );
        // At most a rectangle per SM and kind of cell and shade.
        let rects = svg.matches("<rect").count();
        assert!(
            rects <= 132 * 3 * SHADES as usize + 16,
            "{rects} rectangles"
        );
        assert!(svg.len() < 300_000, "{} bytes", svg.len());
    }

    #[test]
    fn the_latest_snapshots_are_drawn() {
        let s = |index| {
            let mut s = snapshot(&pipeline(), 16, 4, 4_000_000_100);
            s.index = index;
            s
        };
        let all: Vec<Snapshot> = (0..MAX_PANELS as u32 + 3).map(s).collect();
        let svg = Timeline::new().snapshots_svg(&keeping(&all), None).unwrap();
        let doc = roxmltree::Document::parse(&svg).unwrap();
        let drawn: Vec<u32> = doc
            .descendants()
            .filter_map(|n| n.attribute("data-snapshot"))
            .map(|i| i.parse().unwrap())
            .collect();
        assert_eq!(drawn, (3..MAX_PANELS as u32 + 3).collect::<Vec<_>>());
        assert!(svg.contains("the latest 8 of 11 snapshots"), "{svg}");
    }

    #[test]
    fn shades_split_the_longest_time_in_quarters() {
        assert_eq!(shade(0, 0), SHADES);
        assert_eq!(shade(0, 100), 1);
        assert_eq!(shade(25, 100), 1);
        assert_eq!(shade(26, 100), 2);
        assert_eq!(shade(100, 100), 4);
        assert_eq!(shade(u64::MAX, u64::MAX), 4);
    }
}
