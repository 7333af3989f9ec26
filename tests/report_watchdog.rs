//! `tracing-gpu report` on a capture that keeps a watchdog's snapshot (issue #32) with
//! every warp's state (docs/capture.md, "Watchdog snapshots"): the text is told from
//! the warps, and `--svg` draws the SMs against their current phases beside the
//! timeline, with every count in its legend.
#![cfg(feature = "cli")]

use std::path::Path;
use std::time::Duration;

mod support;
use support::cli::{run_cli, Limits, Run};

const WALL: Duration = Duration::from_secs(120);

fn run(args: &[&str]) -> Run {
    let o = run_cli(args, Limits::wall(WALL));
    assert!(!o.timed_out, "{args:?} ran past {WALL:?}: {}", o.stderr);
    o
}

/// Launch 2, a pipeline of 4 blocks of 4 warps still running after 3.2 s, written as the
/// recorder writes it: block 0 on SM 5, its producer in load (k-tile 18, after 17) and
/// its 3 consumers in mma; block 1 done on SM 9; block 2 on SM 7, a warp between
/// phases since it stored 2.0 s ago and 3 in mma; block 3 never started.
const WARPS: &str = "tgpu-watch 1
launch 2 snapshot 0 grid 4 1 1 warps_per_block 4 now_ns 1005000000000 running_ns 3200000000 warps 16
kernel pipeline
r 5 -3200000000 -3100000000 0:17 0@-3100000000
r 5 -3200000000 -3100000000 1:16 1@-3100000000
r 5 -3200000000 -3100000000 1:16 1@-3100000000
r 5 -3200000000 -3100000000 1:16 1@-3100000000
d 9 -1000000000
d 9 -1000000000
d 9 -1000000000
d 9 -1000000000
r 7 -3200000000 -2000000000 2
r 7 -3200000000 -3100000000 1:16 1@-3100000000
r 7 -3200000000 -3100000000 1:16 1@-3100000000
r 7 -3200000000 -3100000000 1:16 1@-3100000000
- 4
";

/// A capture of launch 1 (load, mma, store on 132 SMs) that keeps launch 2's snapshot.
fn watched(path: &Path) {
    let mut capture = support::synthetic_capture(1, 2, 8);
    capture.registry.declare_payload(0, "k_tile").unwrap();
    capture
        .metadata
        .push(("watchdog 2.0".into(), "the text as logged".into()));
    capture
        .metadata
        .push(("watchdog-warps 2.0".into(), WARPS.into()));
    capture.write(path).unwrap();
}

#[test]
fn report_tells_and_draws_where_every_warp_was() {
    let dir = tempfile::tempdir().unwrap();
    let capture = dir.path().join("hung.tgpu");
    watched(&capture);
    let svg = dir.path().join("hung.svg");
    let o = run(&[
        "report",
        capture.to_str().unwrap(),
        "--svg",
        svg.to_str().unwrap(),
    ]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    // Told from the warps: the stuck warps' phase and payload.
    let text = "watchdog, snapshot 1 of launch 2:
launch 2 (pipeline, grid 4x1x1, 4 warps per block) still running after 3.2 s:
  6 warps in mma for 3.1 s, after mma (payload 16)
  1 warp in load for 3.1 s, after load (k_tile 17)
  1 warp between ranges for 2.0 s, after store
  1 block never started; 1 block done
";
    assert!(o.stdout.ends_with(text), "{}", o.stdout);
    assert!(!o.stdout.contains("as logged"), "{}", o.stdout);

    // The picture beside the timeline: a row per SM, every kind of warp counted.
    let drawn = dir.path().join("hung.watchdog.svg");
    assert!(
        o.stderr
            .contains(&format!("snapshots: {}", drawn.display())),
        "{}",
        o.stderr
    );
    assert!(svg.exists());
    let picture = std::fs::read_to_string(&drawn).unwrap();
    let doc = roxmltree::Document::parse(&picture).expect("valid XML");
    let class = |n: &roxmltree::Node, c: &str| n.attribute("class") == Some(c);
    let rows: Vec<&str> = doc
        .descendants()
        .filter(|n| class(n, "sm"))
        .map(|n| n.attribute("data-sm").unwrap())
        .collect();
    assert_eq!(rows, ["5", "7", "9"]);
    let legend: Vec<(&str, &str)> = doc
        .descendants()
        .filter(|n| class(n, "legend"))
        .flat_map(|g| g.children().filter(|n| n.has_tag_name("text")))
        .map(|t| {
            let swatch = t.prev_sibling_element().unwrap();
            (swatch.attribute("class").unwrap(), t.text().unwrap())
        })
        .collect();
    // The timeline colours load, mma and store t0, t1, t2: so does the snapshot.
    assert_eq!(
        legend,
        [
            ("t0", "load: 1 warp"),
            ("t1", "mma: 6 warps"),
            ("between", "between phases: 1 warp"),
            ("done", "done: 4 warps"),
            ("ns", "not started: 4 warps (1 block never started)"),
        ]
    );
    let tips: Vec<&str> = doc
        .descendants()
        .filter(|n| n.has_tag_name("title"))
        .filter_map(|t| t.text())
        .collect();
    for tip in [
        "SM 5: 3 warps in mma for 3.1 s",
        "SM 5: 1 warp in load for 3.1 s",
        "SM 7: 3 warps in mma for 3.1 s",
        "SM 7: 1 warp between phases for 2.0 s",
    ] {
        assert!(tips.contains(&tip), "{tip:?} in {tips:?}");
    }

    // The snapshot's launch alone (it has no launch record: it never finished), and
    // another launch, whose report has no snapshot.
    let o = run(&["report", capture.to_str().unwrap(), "--launch", "2"]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    assert!(o.stdout.ends_with(text), "{}", o.stdout);
    std::fs::remove_file(&drawn).unwrap();
    let o = run(&[
        "report",
        capture.to_str().unwrap(),
        "--launch",
        "1",
        "--svg",
        svg.to_str().unwrap(),
    ]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    assert!(!o.stdout.contains("watchdog"), "{}", o.stdout);
    assert!(!drawn.exists());
}

#[test]
fn a_malformed_snapshot_is_a_bad_capture() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.tgpu");
    let mut capture = support::synthetic_capture(1, 1, 1);
    let value = WARPS.replacen("r 7 -3200000000 -2000000000 2", "r 7 -x - -", 1);
    let n = capture.metadata.len();
    capture
        .metadata
        .push(("watchdog 2.0".into(), "text".into()));
    capture.metadata.push(("watchdog-warps 2.0".into(), value));
    capture.write(&path).unwrap();
    let o = run(&["report", path.to_str().unwrap()]);
    assert_eq!(o.code, Some(4), "{}", o.stderr);
    let expected = format!(
        "metadata note {} (a watchdog snapshot's warps), line 12: not a time in range",
        n + 1
    );
    assert!(o.stderr.contains(&expected), "{}", o.stderr);
    assert_eq!(o.stderr.lines().count(), 1, "{}", o.stderr);
}
