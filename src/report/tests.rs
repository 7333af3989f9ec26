//! The report's tests: statistics and the SVG from known captures.

use super::picture::*;
use super::svg::*;
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
    let mut tl = Timeline::with_svg(SvgOptions::default());
    tl.set_names(&registry);
    tl.set_sm_count(6);
    tl.add_buffer(&capture);
    let r = tl.report();
    assert_eq!(
        (r.launches, r.events, r.events_lost, r.migrated_warps),
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
    let svg = tl.to_svg().expect("made with_svg");
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
    let tl = Timeline::with_svg(SvgOptions::default());
    let r = tl.report();
    assert_eq!((r.events, r.window_ns, r.sms.len()), (0, 0, 0));
    let _ = r.to_string();
    let svg = tl.to_svg().expect("made with_svg");
    roxmltree::Document::parse(&svg).expect("valid XML");
    assert!(Timeline::new().to_svg().is_none());
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
    // Warps of one SM in increasing start: (first_ts, last_ts) → lane.
    let lanes = |cap: u32, warps: &[(u32, u64, u64)]| {
        let mut p = Picture::new(SvgOptions {
            max_lanes_per_sm: cap,
            ..Default::default()
        });
        let lanes: Vec<u32> = warps
            .iter()
            .map(|&(sm, a, b)| p.assign_lane(sm, a, b))
            .collect();
        (p.lanes_per_sm(), lanes)
    };
    let warps = [(0, 0, 10), (0, 5, 20), (0, 10, 30), (0, 12, 13), (1, 0, 5)];
    assert_eq!(lanes(8, &warps), (3, vec![0, 1, 0, 2, 0]));
    // A cap of one lane: everything shares it.
    assert_eq!(lanes(1, &warps), (1, vec![0, 0, 0, 0, 0]));
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
    let mut tl = Timeline::with_svg(SvgOptions::default());
    tl.set_title("gemm <bf16> & co");
    tl.set_name(1, "wait");
    tl.set_name(2, "mma");
    // 1600 px over 6400 ns with 6400 bins: one bin per ns, events on bin edges.
    tl.push_slot(
        &slot(0, 0, 6400),
        [range(1, 0, 1600), range(2, 1600, 3200), instant(1, 4000)],
    );
    tl.push_slot(&slot(1, 3200, 6400), [range(2, 3200, 6400)]);
    let svg = tl.to_svg().expect("made with_svg");
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
    let huge = |options: SvgOptions| {
        let mut tl = Timeline::with_svg(options);
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
        tl.to_svg().expect("made with_svg")
    };
    let options = SvgOptions {
        max_rects: 50_000,
        ..Default::default()
    };
    let svg = huge(options.clone());
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
    let svg = huge(SvgOptions {
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

/// A fixed xorshift64 stream, for random but repeatable inputs.
fn xorshift(mut state: u64) -> impl FnMut() -> u64 {
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    }
}

#[test]
fn percentiles_past_the_exact_ones_stay_within_a_thousandth() {
    let mut next = xorshift(0x2545_F491_4F6C_DD1D);
    for n in [1_000usize, 1_025, 100_000] {
        let mut tl = Timeline::new();
        // Durations over six decades, and a few huge ones.
        let mut durations: Vec<u64> = (0..n)
            .map(|i| match i % 1000 {
                0 => u64::MAX / 2 + next() % 1000,
                _ => 1 + next() % 10u64.pow(1 + (next() % 6) as u32),
            })
            .collect();
        let events = durations.iter().map(|&d| range(1, 0, d));
        tl.push_slot(&slot(0, 0, u64::MAX), events);
        let t = &tl.report().types[0];
        durations.sort_unstable();
        assert_eq!(
            (t.count, t.min_ns, t.max_ns),
            (n as u64, durations[0], durations[n - 1])
        );
        for (p, got) in [(50.0, t.p50_ns), (99.0, t.p99_ns)] {
            let exact = nearest_rank(&durations, p);
            if n <= EXACT_UP_TO {
                assert_eq!(got, exact, "n {n} p{p}");
            } else {
                let err = (got as f64 - exact as f64).abs() / exact as f64;
                assert!(err <= 1.0 / 1024.0, "n {n} p{p}: {got} vs {exact}");
            }
        }
        // The sum does not wrap: it saturates.
        let sum: u128 = durations.iter().map(|&d| u128::from(d)).sum();
        assert_eq!(t.total_ns, u64::try_from(sum).unwrap_or(u64::MAX), "n {n}");
    }
}

#[test]
fn any_sm_id_gets_a_row_of_its_own() {
    let mut tl = Timeline::with_svg(SvgOptions::default());
    tl.set_sm_count(u32::MAX);
    tl.set_sm_count(4);
    tl.push_slot(&slot(u32::MAX, 0, 100), [range(1, 0, 100)]);
    tl.push_slot(&slot(2, 0, 100), [range(1, 0, 50)]);
    let r = tl.report();
    let sms: Vec<u32> = r.sms.iter().map(|s| s.sm).collect();
    assert_eq!(sms, [0, 1, 2, 3, u32::MAX]);
    assert_eq!(r.sms[4].busy_ns, 100);
    let svg = tl.to_svg().unwrap();
    assert!(svg.contains(", 5 SMs,"), "{svg}");
    assert!(svg.contains(">SM 4294967295<"));
    // The SM count is capped.
    let mut tl = Timeline::new();
    tl.set_sm_count(u32::MAX);
    assert_eq!(tl.report().sms.len(), MAX_SM_COUNT as usize);
}

/// Per bin, per type, the coverage a dense sum gives (what the sweep must match).
fn dense_cover(pieces: &[Piece], dur: f64, bins: u32) -> Vec<BTreeMap<u32, f64>> {
    let bin_ns = dur / f64::from(bins);
    let mut cover = vec![BTreeMap::<u32, f64>::new(); bins as usize];
    for p in pieces {
        let (fa, fb) = (p.a / bin_ns, p.b / bin_ns);
        let first = (fa.floor() as u32).min(bins - 1);
        let last = (fb.ceil() as u32).clamp(first + 1, bins);
        for bin in first..last {
            let c = (fb.min(f64::from(bin + 1)) - fa.max(f64::from(bin))).max(0.0);
            *cover[bin as usize].entry(p.k).or_default() += c * f64::from(p.w);
        }
    }
    cover
}

/// The drawn runs of a dense sum: dominant type (ties: lowest), opacity level.
fn dense_dominant(cover: &[BTreeMap<u32, f64>]) -> Vec<(u32, u32, u32, u16)> {
    let full = f64::from(FULL);
    let mut runs: Vec<(u32, u32, u32, u16)> = Vec::new();
    for (bin, c) in cover.iter().enumerate() {
        let sum: f64 = c.values().sum();
        let level = (sum.min(full) / full * f64::from(LEVELS) - 1e-6)
            .ceil()
            .max(0.0) as u16;
        let Some((&k, _)) = c
            .iter()
            .rev()
            .max_by(|x, y| x.1.partial_cmp(y.1).unwrap())
            .filter(|_| sum > 1e-3 * full && level > 0)
        else {
            continue;
        };
        let bin = bin as u32;
        match runs.last_mut() {
            Some(r) if r.1 == bin && r.2 == k && r.3 == level => r.1 = bin + 1,
            _ => runs.push((bin, bin + 1, k, level)),
        }
    }
    runs
}

#[test]
fn the_sweep_matches_a_dense_sum() {
    let mut next = xorshift(0x9E37_79B9_7F4A_7C15);
    for case in 0..200 {
        let bins = 1 + (next() % 300) as u32;
        let dur = 10_000.0;
        // Overlapping pieces (lanes shared past the cap, resampled runs) of
        // many types and weights; some long, most short.
        let pieces: Vec<Piece> = (0..1 + next() % 60)
            .map(|_| {
                let a = (next() % 10_000) as f64 + (next() % 7) as f64 / 7.0;
                let len = if next().is_multiple_of(4) {
                    next() % 5_000
                } else {
                    next() % 200
                } + 1;
                Piece {
                    sm: 0,
                    lane: 0,
                    a,
                    b: (a + len as f64).min(dur),
                    k: (next() % 14) as u32,
                    w: 1 + (next() % u64::from(FULL)) as u16,
                }
            })
            .collect();
        let cover = dense_cover(&pieces, dur, bins);
        let drawn: Vec<(u32, u32, u32, u16)> =
            bin_runs(&lanes_of(&pieces), dur, bins, Cells::Dominant, None)
                .unwrap()
                .iter()
                .map(|r| (r.start, r.end, r.k, r.level))
                .collect();
        assert_eq!(drawn, dense_dominant(&cover), "case {case}, {bins} bins");
        // What is kept: every type's coverage of every bin, rounded; past ten
        // types in a bin, the ten heaviest and the others together.
        let mut kept = vec![BTreeMap::<u32, u16>::new(); bins as usize];
        for r in bin_runs(&lanes_of(&pieces), dur, bins, Cells::Coverage, None).unwrap() {
            for bin in r.start..r.end {
                assert!(kept[bin as usize].insert(r.k, r.level).is_none());
            }
        }
        for (bin, (kept, dense)) in kept.iter().zip(&cover).enumerate() {
            let mut dense: Vec<(u32, u16)> = dense
                .iter()
                .map(|(&k, &c)| (k, c.round() as u16))
                .filter(|&(_, q)| q > 0)
                .collect();
            dense.sort_by_key(|&(k, q)| (std::cmp::Reverse(q), k));
            let rest: u16 = dense.iter().skip(10).map(|t| t.1).sum();
            dense.truncate(10);
            let mut dense: BTreeMap<u32, u16> = dense.into_iter().collect();
            if rest > 0 {
                dense.insert(OTHER_TYPES, rest);
            }
            assert_eq!(kept, &dense, "case {case}, bin {bin}");
        }
    }
}

/// A GEMM-like launch on `sms` SMs from `t0`: a producer and two consumer
/// warps per SM, `ktiles` k-tiles; a launch of its own if `begin`.
fn gemm_launch(tl: &mut Timeline, t0: u64, sms: u32, ktiles: u64, begin: bool) {
    if begin {
        tl.begin_capture();
    }
    for sm in 0..sms {
        let s0 = t0 + u64::from(sm) * 37;
        let end = s0 + ktiles * 1_000 + 3_000;
        tl.push_slot(
            &slot(sm, s0, end),
            (0..ktiles).map(|k| range(1, s0 + k * 1_000, s0 + k * 1_000 + 640)),
        );
        for w in 1..3u64 {
            let events = (0..ktiles).flat_map(|k| {
                let s = s0 + k * 1_000 + 640 + w * 16;
                let mid = s + 90 + k % 7 * 40;
                [range(2, s, mid), range(3, mid, s + 950)]
            });
            tl.push_slot(&slot(sm, s0, end), events);
        }
    }
}

/// Per drawn colour, the area its rectangles cover (width × opacity), in
/// plot widths × lanes.
fn colour_areas(svg: &str) -> BTreeMap<String, f64> {
    let doc = roxmltree::Document::parse(svg).expect("valid XML");
    let mut areas = BTreeMap::new();
    for (class, _, _, w, _) in svg_events(&doc) {
        let mut words = class.split(' ');
        let colour = words.next().unwrap().to_string();
        let opacity = words
            .next()
            .map_or(1.0, |o| o[1..].parse::<f64>().unwrap() / f64::from(LEVELS));
        *areas.entry(colour).or_insert(0.0) += w * opacity / 1600.0;
    }
    areas
}

#[test]
fn launches_binned_one_at_a_time_draw_as_if_binned_together() {
    // Two launches 5 ms apart: on one axis, each launch's phases shrink.
    // Binned launch by launch and resampled, the picture shows each colour
    // over the area it has when the same slots are given as one launch
    // (every event binned on the final axis at once), within a few percent.
    // A budget that one launch alone overflows at its finest bins: what is
    // kept of it is coarse, and must still resample right.
    let options = SvgOptions {
        max_rects: 2_000,
        ..Default::default()
    };
    let mut apart = Timeline::with_svg(options.clone());
    gemm_launch(&mut apart, 0, 32, 200, true);
    gemm_launch(&mut apart, 5_000_000, 32, 200, true);
    let mut together = Timeline::with_svg(options);
    gemm_launch(&mut together, 0, 32, 200, true);
    gemm_launch(&mut together, 5_000_000, 32, 200, false);
    assert_eq!(
        (apart.report().launches, together.report().launches),
        (2, 1)
    );
    let (a, t) = (
        colour_areas(&apart.to_svg().unwrap()),
        colour_areas(&together.to_svg().unwrap()),
    );
    let total: f64 = t.values().sum();
    assert!(total > 1.0, "{t:?}");
    for class in a.keys().chain(t.keys()) {
        let (x, y) = (a.get(class).unwrap_or(&0.0), t.get(class).unwrap_or(&0.0));
        assert!(
            (x - y).abs() <= 0.05 * total,
            "{class}: {x:.2} apart, {y:.2} together\n{a:?}\n{t:?}"
        );
    }
}

#[test]
fn a_timeline_keeps_no_events() {
    use crate::format::BufferBuilder;
    // Eight launches one after the other, of 64 warps × 2,000 ranges.
    let buffers: Vec<Vec<u8>> = (0..8u64)
        .map(|launch| {
            let t0 = launch * 300_000;
            let mut b = BufferBuilder::new([32, 1, 1], [64, 1, 1], 2_000);
            for block in 0..32u32 {
                for w in 0..2 {
                    let s = b.warp(block, w).unwrap().sm(block, block);
                    for k in 0..2_000u64 {
                        s.range(1 + (k % 3) as u16, t0 + k * 100, t0 + k * 100 + 80, 0);
                    }
                }
            }
            b.finish()
        })
        .collect();
    let budget = 5_000;
    let mut tl = Timeline::with_svg(SvgOptions {
        max_rects: budget,
        ..Default::default()
    });
    let mut most = 0;
    for bytes in &buffers {
        tl.add_buffer(&Buffer::decode(bytes, None).unwrap());
        most = most.max(tl.picture.as_ref().unwrap().stored());
    }
    assert_eq!(tl.event_count(), 8 * 128_000);
    // Nothing of the events: no pending copy, no durations past the exact
    // ones (histograms instead), and a picture of at most a few budgets
    // (layers merge past two budgets' worth; one launch adds one).
    assert_eq!(tl.pending.events.capacity(), 0);
    assert!(tl
        .types
        .values()
        .all(|t| matches!(t.durations, Durations::Many(_))));
    assert!(most <= 3 * KEEP * budget, "{most}");
    let svg = tl.to_svg().unwrap();
    assert!(svg_events(&roxmltree::Document::parse(&svg).unwrap()).len() <= budget);
}

#[test]
fn types_past_the_palette_share_a_colour() {
    let types: Vec<TypeStats> = (0..12u16)
        .map(|id| TypeStats {
            id,
            name: format!("t{id}"),
            count: 1,
            instants: 0,
            // Types 0 and 1 have the least time: they are the "other" ones.
            total_ns: if id < 3 {
                u64::from(id)
            } else {
                100 + u64::from(id)
            },
            mean_ns: 0.0,
            p50_ns: 0,
            p99_ns: 0,
            min_ns: 0,
            max_ns: 0,
        })
        .collect();
    let c = Colours::new(&types);
    assert_eq!(c.legend.len(), PALETTE.len());
    let slots: Vec<u32> = (0..12).map(|id| c.slot(id)).collect();
    assert_eq!(slots, [9, 9, 9, 0, 1, 2, 3, 4, 5, 6, 7, 8]);
    assert_eq!(c.legend[9], "3 other types: 3 events");
    assert_eq!(c.names[0], "t3");
    // Few types: one colour each, by id.
    let c = Colours::new(&types[..4]);
    assert_eq!(
        (0..4).map(|id| c.slot(id)).collect::<Vec<_>>(),
        [0, 1, 2, 3]
    );
}

/// `bytes` (a v1 buffer) as the `n` packed parts a drain would deliver: each
/// warp's events, in the order they end, cut into `n` runs, each slot's times
/// those of its events (its first and last part's, the warp's own).
fn in_parts(bytes: &[u8], n: usize) -> Vec<Vec<u8>> {
    use crate::format::PackedWriter;
    let whole = Buffer::decode(bytes, None).unwrap();
    (0..n)
        .map(|p| {
            let mut w = PackedWriter::new(whole.header());
            for slot in whole.slots() {
                let events: Vec<Event> = slot.events().collect();
                let per = events.len().div_ceil(n);
                let mine = &events[(p * per).min(events.len())..((p + 1) * per).min(events.len())];
                if mine.is_empty() {
                    continue;
                }
                let mut h = slot.header;
                if p > 0 {
                    h.first_ts = mine.iter().map(|e| e.start_ns).min().unwrap();
                }
                if p + 1 < n {
                    h.last_ts = mine.iter().map(|e| e.end_ns).max().unwrap();
                    h.events_lost = 0;
                }
                w.slot(&h, mine);
            }
            w.finish()
        })
        .collect()
}

#[test]
fn a_launch_in_parts_reports_as_whole() {
    use crate::format::BufferBuilder;
    // 16 warps on 4 SMs, nested ranges (an outer one per warp, which ends in
    // the last part but starts in the first), instants, a migrated warp, drops.
    let mut b = BufferBuilder::new([8, 1, 1], [64, 1, 1], 64);
    for block in 0..8u32 {
        for warp in 0..2 {
            let t0 = 1_000 * u64::from(block) + 37 * u64::from(warp);
            let s = b.warp(block, warp).unwrap();
            s.sm(block % 4, if block == 5 { 9 } else { block % 4 });
            for k in 0..60u64 {
                let t = t0 + 10 + k * 50;
                s.range(1 + (k % 3) as u16, t, t + 30 + k % 7, 0);
                if k % 11 == 0 {
                    s.instant(4, t + 40, 0);
                }
            }
            s.range(0, t0 + 5, t0 + 10 + 60 * 50, 0);
        }
    }
    let bytes = b.finish();
    let whole = {
        let mut tl = Timeline::with_svg(SvgOptions::default());
        tl.set_sm_count(6);
        tl.add_buffer(&Buffer::decode(&bytes, None).unwrap());
        tl
    };
    let r = whole.report();
    assert_eq!((r.events, r.migrated_warps), (16 * 64, 2));
    assert!(r.events_lost > 0);
    for n in [1, 2, 3, 7] {
        let parts = in_parts(&bytes, n);
        let mut tl = Timeline::with_svg(SvgOptions::default());
        tl.set_sm_count(6);
        for (p, part) in parts.iter().enumerate() {
            tl.add_part(7, &Buffer::decode(part, None).unwrap(), p + 1 == n);
            assert_eq!(tl.streaming.len(), usize::from(p + 1 < n));
        }
        assert_eq!(tl.report(), r, "{n} parts");
        let svg = tl.to_svg().unwrap();
        let doc = roxmltree::Document::parse(&svg).unwrap();
        assert!(!svg_events(&doc).is_empty());
        // A launch whose last part never came is added as it stands.
        let mut open = Timeline::new();
        open.set_sm_count(6);
        for part in &parts[..n.max(2) - 1] {
            open.add_part(7, &Buffer::decode(part, None).unwrap(), false);
        }
        open.end_parts();
        assert_eq!(open.report().launches, 1);
    }
}

#[test]
fn a_streamed_launch_keeps_no_events() {
    use crate::format::PackedWriter;
    // One launch of 100 parts, each 64 warps × 100 ranges, one after the
    // other: what it keeps between parts stays as small after the last part
    // as after the first (its warps, and per SM the union of its ranges).
    let header = *Buffer::decode(
        &crate::format::BufferBuilder::new([32, 1, 1], [64, 1, 1], 1).finish(),
        None,
    )
    .unwrap()
    .header();
    let part = |p: u64| {
        let mut w = PackedWriter::new(&header);
        let t0 = p * 20_000;
        for block in 0..32u32 {
            for warp in 0..2 {
                let events: Vec<Event> = (0..100)
                    .map(|k| {
                        range(
                            1 + (k % 3) as u16,
                            t0 + k * 200,
                            t0 + k * 200 + 150 + 50 * warp as u64,
                        )
                    })
                    .collect();
                let mut h = slot(block, t0, t0 + 100 * 200);
                (h.block_linear, h.warp, h.block) = (block, warp, [block, 0, 0]);
                w.slot(&h, &events);
            }
        }
        w.finish()
    };
    let mut tl = Timeline::with_svg(SvgOptions::default());
    let mut kept = Vec::new();
    for p in 0..100 {
        tl.add_part(1, &Buffer::decode(&part(p), None).unwrap(), p == 99);
        if let Some(open) = tl.streaming.get(&1) {
            kept.push(open.kept());
        }
    }
    assert!(kept.iter().all(|&k| k == (64, 32)), "{kept:?}");
    let r = tl.report();
    assert_eq!((r.launches, r.events, r.sms.len()), (1, 100 * 64 * 100, 32));
    assert_eq!(r.sms[0].warps, 2);
    // Each SM's second warp keeps it busy throughout.
    assert_eq!(r.sms[0].busy_ns, 100 * 20_000);
    assert!(tl.to_svg().is_some());
}

#[test]
fn a_sampled_launch_says_what_it_covers() {
    use crate::format::{BufferBuilder, Sampling};
    let sampling = Sampling::default().warps(0b1).blocks(4, 0);
    let mut b = BufferBuilder::new([8, 1, 1], [256, 1, 1], 8);
    b.sampling(sampling);
    for block in [0, 4] {
        b.warp(block, 0).unwrap().range(1, 1_000, 2_000, 0);
    }
    let bytes = b.finish();
    let mut tl = Timeline::new();
    tl.add_buffer(&Buffer::decode(&bytes, None).unwrap());
    // And a launch of every warp: it adds nothing to say.
    tl.add_buffer(
        &Buffer::decode(&BufferBuilder::new([1, 1, 1], [32, 1, 1], 8).finish(), None).unwrap(),
    );
    let r = tl.report();
    assert_eq!(
        r.sampled,
        ["1 of 8 warps per block (mask 0x1), 1 block in 4"]
    );
    assert_eq!(r.events, 2);
    let text = r.to_string();
    assert!(
        text.contains("sampled: 1 of 8 warps per block (mask 0x1), 1 block in 4; every figure below is over the sampled warps only"),
        "{text}"
    );
    // Unsampled, nothing is said.
    let mut tl = Timeline::new();
    tl.add_buffer(
        &Buffer::decode(&BufferBuilder::new([1, 1, 1], [32, 1, 1], 8).finish(), None).unwrap(),
    );
    assert!(tl.report().sampled.is_empty());
    assert!(!tl.report().to_string().contains("sampled"));
}
