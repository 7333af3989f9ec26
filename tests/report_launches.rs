//! `tracing-gpu report` on the shipped multi-launch captures: `--launch` takes
//! launch ids; the text and the SVG header word the launch windows and the wall
//! span alike; by default the SVG draws the busiest launch, filling the plot,
//! where every launch on one axis leaves it mostly empty.
#![cfg(feature = "cli")]

mod support;

use std::path::Path;
use std::time::Duration;

use support::cli::{run_cli, Limits, Run};

/// The longest any one run may take before the test fails.
const WALL: Duration = Duration::from_secs(120);
const QUICKSTART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/captures/h200-quickstart.tgpu");
const GEMM: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/captures/h200-gemm.tgpu");

/// `report CAPTURE --svg OUT extra…`: the run, its stdout, and the SVG.
fn report(capture: &str, svg: &Path, extra: &[&str]) -> (Run, String, String) {
    let mut args = vec!["report", capture, "--svg", svg.to_str().unwrap()];
    args.extend_from_slice(extra);
    let o = run(&args);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    let text = o.stdout.clone();
    let picture = std::fs::read_to_string(svg).expect("the SVG");
    (o, text, picture)
}

fn run(args: &[&str]) -> Run {
    let o = run_cli(args, Limits::wall(WALL));
    assert!(!o.timed_out, "{args:?} ran past {WALL:?}: {}", o.stderr);
    o
}

/// The SVG's title and subtitle (its first two `<text>`s).
fn header(svg: &str) -> (String, String) {
    let doc = roxmltree::Document::parse(svg).expect("the SVG is XML");
    let mut texts = doc
        .descendants()
        .filter(|n| n.has_tag_name("text"))
        .map(|n| n.text().unwrap_or("").to_string());
    (texts.next().unwrap(), texts.next().unwrap())
}

/// The share of the plot's width (1600 px from x = 64) that some event
/// rectangle covers.
/// Every `<text>` of the SVG: title, subtitle, legend, row labels.
fn texts(svg: &str) -> Vec<String> {
    let doc = roxmltree::Document::parse(svg).expect("the SVG is XML");
    doc.descendants()
        .filter(|n| n.has_tag_name("text"))
        .map(|n| n.text().unwrap_or("").to_string())
        .collect()
}

fn covered(svg: &str) -> f64 {
    let doc = roxmltree::Document::parse(svg).unwrap();
    let events = doc
        .descendants()
        .find(|n| n.attribute("class") == Some("events"))
        .expect("the events group");
    let mut spans: Vec<(f64, f64)> = events
        .children()
        .filter(|n| n.has_tag_name("rect"))
        .map(|r| {
            let x: f64 = r.attribute("x").unwrap().parse().unwrap();
            let w: f64 = r.attribute("width").unwrap().parse().unwrap();
            (x, x + w)
        })
        .collect();
    spans.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (mut total, mut end) = (0.0, f64::MIN);
    for (a, b) in spans {
        let a = a.max(end);
        if b > a {
            total += b - a;
            end = b;
        }
    }
    total / 1600.0
}

/// The line of the text report after the title: counts and times.
fn summary(text: &str) -> &str {
    text.lines().nth(1).unwrap()
}

#[test]
fn the_default_svg_draws_the_busiest_launch_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("t.svg");
    let (o, text, picture) = report(QUICKSTART, &svg, &[]);
    // The text covers every launch, and says what its times are.
    assert!(
        summary(&text).starts_with("4 launches, 211200 events, 0 events lost"),
        "{text}"
    );
    assert!(
        summary(&text).contains("launch windows 37.7 µs summed")
            && summary(&text).contains("wall span 3.26 ms"),
        "{text}"
    );
    assert!(text.contains("total (summed over warps)"), "{text}");
    // The picture is one launch, named, with how to draw another.
    let (title, subtitle) = header(&picture);
    assert!(
        title.contains("launch 1 (tiled_poly), the one with the most events of 4"),
        "{title}"
    );
    assert!(title.contains("--launch ID") && title.contains("--launch all"));
    assert!(subtitle.starts_with("52800 events"), "{subtitle}");
    assert!(
        subtitle.contains("1 launch; launch window 9.66 µs"),
        "{subtitle}"
    );
    let err = &o.stderr;
    assert!(err.contains("the one with the most events of 4"), "{err}");
    // Readable: the launch fills the plot.
    let filled = covered(&picture);
    assert!(filled > 0.9, "{filled}");

    // Every launch on one axis: the header has the text's times, and the
    // launches are slivers in a mostly empty plot.
    let (_, text_all, all) = report(QUICKSTART, &svg, &["--launch", "all"]);
    assert_eq!(summary(&text_all), summary(&text));
    let (title, subtitle) = header(&all);
    assert_eq!(title, "tiled_poly on GPU 0 (NVIDIA H200)");
    let times = summary(&text).split_once("; ").unwrap().1;
    assert!(subtitle.contains(times), "{subtitle} / {times}");
    let filled = covered(&all);
    assert!(filled < 0.1, "{filled}");
}

#[test]
fn launch_picks_a_launch_by_its_id() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("t.svg");
    // The GEMM capture's launches are 1 and 2; the second is drawn alone.
    let (_, text, picture) = report(GEMM, &svg, &["--launch", "2"]);
    assert!(summary(&text).starts_with("1 launch, "), "{text}");
    let (title, subtitle) = header(&picture);
    assert_eq!(
        title, "tgpu_gemm_bf16 on GPU 0 (NVIDIA H200)",
        "no note: chosen"
    );
    let window = summary(&text).split_once("; ").unwrap().1;
    assert!(subtitle.contains(window), "{subtitle} / {window}");
    assert!(covered(&picture) > 0.9);

    let o = run(&["report", GEMM, "--launch", "0"]);
    assert_eq!(o.code, Some(2));
    let err = &o.stderr;
    assert!(
        err.contains("no launch with that id (its 2 launches have ids 1 to 2)"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
fn a_streamed_launch_reports_as_the_launch_recorded_whole() {
    let dir = tempfile::tempdir().unwrap();
    // Each launch in three parts, the two launches' parts interleaved.
    let streamed = dir.path().join("streamed.tgpu");
    support::streamed_capture(Path::new(GEMM), 3, &streamed);
    let streamed = streamed.to_str().unwrap();
    let svg = |name: &str| dir.path().join(name);
    // Every launch, the busiest drawn; one launch by id; every launch drawn.
    for extra in [&[][..], &["--launch", "2"], &["--launch", "all"]] {
        let (_, whole_text, whole_svg) = report(GEMM, &svg("whole.svg"), extra);
        let (_, parts_text, parts_svg) = report(streamed, &svg("parts.svg"), extra);
        assert_eq!(parts_text, whole_text, "{extra:?}");
        // The same picture but for its phases' rectangles: a streamed launch is drawn
        // from per-part summaries binned to the picture's width (bounded memory), a
        // launch read whole from its events.
        assert_eq!(texts(&parts_svg), texts(&whole_svg), "{extra:?}");
        let (parts, whole) = (covered(&parts_svg), covered(&whole_svg));
        assert!((parts - whole).abs() < 0.02, "{extra:?}: {parts} / {whole}");
    }
    let (_, text, _) = report(streamed, &svg("one.svg"), &["--launch", "2"]);
    assert!(summary(&text).starts_with("1 launch,"), "{text}");
}
