//! `tracing-gpu report` on a capture that keeps a watchdog's snapshot (issue #32) with
//! every warp's state (docs/capture.md, "Watchdog snapshots"): the text is told from
//! the warps, and `--svg` draws the SMs against their current phases beside the
//! timeline, with every count in its legend; `convert` draws it in the Perfetto trace as
//! a live run does.
#![cfg(feature = "cli")]

use std::path::Path;
use std::time::Duration;

mod perfetto_check;
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

/// Launch 1's snapshot, 4 µs in: of its 264 warps, the first in mma since 2 µs (after
/// load, k-tile 3), the others not started yet. The launch then finished.
const FINISHED: &str = "tgpu-watch 1
launch 1 snapshot 0 grid 132 1 1 warps_per_block 2 now_ns 1001004000 running_ns 4000 warps 264
kernel synthetic
r 0 -4000 -3000 0:3 1@-2000
- 263
";

#[test]
fn convert_leaves_open_where_a_launch_that_never_finished_was() {
    let dir = tempfile::tempdir().unwrap();
    let capture = dir.path().join("hung.tgpu");
    let mut c = support::synthetic_capture(1, 2, 8);
    c.registry.declare_payload(0, "k_tile").unwrap();
    for (key, warps) in [("1.0", FINISHED), ("2.0", WARPS)] {
        c.metadata
            .push((format!("watchdog {key}"), "the text as logged".into()));
        c.metadata
            .push((format!("watchdog-warps {key}"), warps.into()));
    }
    c.write(&capture).unwrap();
    let out = dir.path().join("hung.perfetto-trace");
    let o = run(&[
        "convert",
        capture.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    // Launch 1, and launch 2 left open.
    assert!(o.stderr.contains("(2 launches,"), "{}", o.stderr);
    let slices = dir.path().join("hung.slices");
    let args = [
        "--allow-open-slices",
        "--slices-out",
        slices.to_str().unwrap(),
    ];
    let Some(s) = perfetto_check::check(&out, &args) else {
        return;
    };
    // Launch 2's kernel, and the 7 warps in a range at its snapshot: 4 on SM 5 (a load,
    // 3 mma), 3 on SM 7 (mma); none of launch 1, which finished.
    assert_eq!(
        (s["open_kernel_slices"], s["open_device_slices"]),
        (1, 7),
        "{s:?}"
    );
    let text = std::fs::read_to_string(&slices).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let open: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.contains(", null, "))
        .collect();
    let on = |sm: &str, name: &str| {
        open.iter()
            .filter(|l| l.contains(&format!("/SM {sm}/")) && l.contains(&format!("\"{name}\"")))
            .count()
    };
    assert_eq!(
        (on("5", "load"), on("5", "mma"), on("7", "mma")),
        (1, 3, 3),
        "{text}"
    );
    // The kernel slice of launch 2, from its launch 3.2 s before the snapshot (the
    // capture's device and host clocks agree).
    assert!(
        open.iter()
            .any(|l| l.contains("/kernels\", \"pipeline\", 1001800000000, null")),
        "{text}"
    );
    // Both snapshots' instants, on the GPU's watchdog track, told from the warps.
    for (name, at) in [
        ("watchdog snapshot 1 of synthetic", 1_001_004_000u64),
        ("watchdog snapshot 1 of pipeline", 1_005_000_000_000),
    ] {
        let instant = lines
            .iter()
            .find(|l| l.contains(&format!("/watchdog\", \"{name}\", {at}, {at}")))
            .unwrap_or_else(|| panic!("no {name} at {at} in:\n{text}"));
        assert!(instant.contains("in mma for"), "{instant}");
        assert!(!instant.contains("as logged"), "{instant}");
    }
}
