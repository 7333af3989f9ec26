//! `tracing-gpu report` and `report --svg` stay bounded in time and memory
//! whatever a capture says: the shipped captures with a slot's `%smid` or the
//! device's SM count changed to hostile values, captures with many distinct
//! event ids, and huge `--width`s. Each run must end within 10 s of CPU time
//! and 512 MB of peak RSS (the child's own, from `wait4`), and either print a
//! sane report or exit 4 with one line.
//!
//! The bound is on CPU time (user + system) rather than wall time, because
//! the machines that run these tests are shared; a run still going after
//! [`WALL_LIMIT`] is killed and fails. Runs go one at a time (a lock), so each
//! one's figures are its own.
#![cfg(feature = "cli")]

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing_gpu::batch::{DeviceInfo, LaunchInfo};
use tracing_gpu::capture::{Capture, CaptureDevice, CaptureLaunch};
use tracing_gpu::decode::OwnedBuffer;
use tracing_gpu::format::{wire, BufferBuilder};
use tracing_gpu::registry::EventRegistry;

mod support;
use support::cli::{run_cli, Limits, Run};

const CPU_LIMIT_S: f64 = 10.0;
const RSS_LIMIT_KB: libc::c_long = 512 * 1024;
const WALL_LIMIT: Duration = Duration::from_secs(60);
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Runs the binary with `args`, one at a time, measuring its own CPU time and
/// peak RSS.
fn run(args: &[&str]) -> Run {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let r = run_cli(args, Limits::wall(WALL_LIMIT));
    assert!(
        !r.timed_out,
        "{args:?}: still running after {WALL_LIMIT:?}, killed"
    );
    r
}

/// `report CAPTURE` and `report CAPTURE --svg`: both within the bounds, and
/// both either a report (returned: stdout, and the SVG's text) or exit 4.
fn report_both(capture: &Path, dir: &Path) -> Option<(String, String)> {
    let svg = dir.join(format!(
        "{}.svg",
        capture.file_stem().unwrap().to_string_lossy()
    ));
    let text = run(&["report", capture.to_str().unwrap()]);
    let drawn = run(&[
        "report",
        capture.to_str().unwrap(),
        "--svg",
        svg.to_str().unwrap(),
    ]);
    for (what, r) in [("report", &text), ("report --svg", &drawn)] {
        let context = format!(
            "{what} {}: exit {:?}, {:.1} s CPU, {} MB peak, stderr: {}",
            capture.display(),
            r.code,
            r.cpu_s,
            r.peak_rss_kb / 1024,
            r.stderr
        );
        assert!(r.cpu_s < CPU_LIMIT_S, "{context}");
        assert!(r.peak_rss_kb < RSS_LIMIT_KB, "{context}");
        assert!(!r.stderr.contains("panicked"), "{context}");
        match r.code {
            Some(0) => {}
            Some(4) => assert_eq!(r.stderr.trim_end().lines().count(), 1, "{context}"),
            _ => panic!("{context}"),
        }
    }
    assert_eq!(text.code, drawn.code);
    if text.code != Some(0) {
        return None;
    }
    assert!(text.stdout.contains(" events, "), "{}", text.stdout);
    Some((text.stdout, std::fs::read_to_string(&svg).expect("the SVG")))
}

/// `SM` cells in the report's per-SM table, and whether SM `sm` is among them.
fn sm_cells(report: &str, sm: u32) -> (usize, bool) {
    let cells: Vec<&str> = report
        .split("SM")
        .skip(1)
        .filter_map(|c| c.split_whitespace().next())
        .filter(|w| w.parse::<u32>().is_ok())
        .collect();
    let wanted = sm.to_string();
    (cells.len(), cells.contains(&wanted.as_str()))
}

/// SM rows of an SVG timeline, as its subtitle gives them, after checking
/// that it is XML.
fn svg_rows(svg: &str) -> usize {
    let doc = roxmltree::Document::parse(svg).expect("the SVG is XML");
    let subtitle = doc
        .descendants()
        .filter_map(|n| n.text())
        .find(|t| t.contains(" warps, "))
        .expect("a subtitle");
    let after = &subtitle[subtitle.find(" warps, ").unwrap() + 8..];
    after.split_whitespace().next().unwrap().parse().unwrap()
}

fn shipped(name: &str) -> Capture {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("captures")
        .join(name);
    Capture::read(&path).expect("the shipped capture reads")
}

/// `capture` with the `%smid` at the first event of the `nth` flushed slot of
/// its first launch set to `sm` (the bytes of the buffer, as a capture file
/// changed in a few bytes would carry them).
fn with_sm_first(capture: &Capture, nth: usize, sm: u32) -> Capture {
    let mut capture = capture.clone();
    let launch = &mut capture.launches[0];
    let view = launch.buffer.view();
    let stride = wire::slot_stride(view.header().slot_capacity);
    let index = view.slots().nth(nth).expect("a flushed slot").index as usize;
    // The wire format: a buffer read from a capture keeps only its flushed slots.
    let mut bytes = launch.buffer.wire().into_owned();
    let at = wire::BUFFER_HEADER_SIZE + index * stride + wire::slot_offsets::SM_FIRST;
    bytes[at..at + 4].copy_from_slice(&sm.to_le_bytes());
    launch.buffer = Arc::new(OwnedBuffer::decode(bytes, Some(&capture.registry)).unwrap());
    capture
}

fn write(capture: &Capture, dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    capture.write(&path).expect("the capture writes");
    path
}

#[test]
fn hostile_sm_ids_cost_what_the_capture_holds() {
    let dir = tempfile::tempdir().unwrap();
    for (name, values) in [
        (
            "h200-quickstart.tgpu",
            &[u32::MAX, 1 << 31, 100_000_000][..],
        ),
        ("h200-gemm.tgpu", &[u32::MAX][..]),
    ] {
        let original = shipped(name);
        let sm_count = original.devices[0].info.sm_count;
        for &sm in values {
            let path = write(
                &with_sm_first(&original, 0, sm),
                dir.path(),
                &format!("{sm}-{name}"),
            );
            let (report, svg) = report_both(&path, dir.path()).expect("a report");
            // The SMs of the device, and the odd one: nothing in between.
            let (cells, listed) = sm_cells(&report, sm);
            assert!(listed, "SM {sm} is not listed: {report}");
            assert_eq!(cells, sm_count as usize + 1, "{report}");
            assert!(report.len() < 64 << 10, "{} bytes", report.len());
            assert_eq!(svg_rows(&svg), sm_count as usize + 1);
        }
    }
}

#[test]
fn random_flips_of_sm_ids_stay_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let original = shipped("h200-quickstart.tgpu");
    let slots = original.launches[0].buffer.view().slots().len();
    // xorshift64, fixed seed: the same flips every run.
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for case in 0..4 {
        let mut capture = original.clone();
        let (mut flipped, mut used) = (Vec::new(), Vec::new());
        while flipped.len() < 3 {
            let nth = (next() % slots as u64) as usize;
            if used.contains(&nth) {
                continue;
            }
            used.push(nth);
            let bit = next() % 32;
            let view = capture.launches[0].buffer.view();
            let old = view.slots().nth(nth).unwrap().header.sm_first;
            let sm = old ^ (1 << bit);
            flipped.push(sm);
            capture = with_sm_first(&capture, nth, sm);
        }
        let path = write(&capture, dir.path(), &format!("flip{case}.tgpu"));
        let (report, svg) = report_both(&path, dir.path()).expect("a report");
        for sm in flipped {
            assert!(sm_cells(&report, sm).1, "SM {sm}: {report}");
        }
        assert!((132..=132 + 3).contains(&svg_rows(&svg)));
    }
}

#[test]
fn a_huge_sm_count_is_capped() {
    let dir = tempfile::tempdir().unwrap();
    let mut capture = shipped("h200-quickstart.tgpu");
    capture.devices[0].info.sm_count = 1 << 31;
    let path = write(&capture, dir.path(), "sm-count.tgpu");
    let (report, svg) = report_both(&path, dir.path()).expect("a report");
    // Idle SMs are listed up to the cap, 4096, not 2³¹.
    assert!(
        report.contains("3964 of 4096 SMs recorded nothing"),
        "{report}"
    );
    assert_eq!(sm_cells(&report, 4095), (4096, true));
    assert!(!sm_cells(&report, 4096).1);
    assert_eq!(svg_rows(&svg), 4096);
}

/// One GPU, one launch per buffer; no calibration (the report needs none).
fn synthetic(registry: EventRegistry, buffers: Vec<(BufferBuilder, [u32; 3])>) -> Capture {
    let launches = buffers
        .into_iter()
        .enumerate()
        .map(|(i, (mut b, grid))| {
            b.launch_id(i as u64 + 1);
            let buffer = Arc::new(OwnedBuffer::decode(b.finish(), Some(&registry)).unwrap());
            let info = LaunchInfo {
                launch_id: i as u64 + 1,
                kernel: "many_ids".into(),
                host_launch_ns: 1_000,
                host_complete_ns: 2_000,
                grid,
                block: [32, 1, 1],
                parent: None,
                host_thread: "main".into(),
                part: None,
            };
            CaptureLaunch::new(0, &info, buffer)
        })
        .collect();
    Capture {
        metadata: vec![("tool".into(), "tests/report_bounds.rs".into())],
        devices: vec![CaptureDevice {
            info: DeviceInfo {
                ordinal: 0,
                name: "NVIDIA H200".into(),
                uuid: "GPU-00000000-0000-0000-0000-000000000000".into(),
                sm_count: 132,
                driver_version: "580.159.04".into(),
                compute_capability: (9, 0),
            },
            calibrations: vec![],
        }],
        registry,
        launches,
        host_spans: vec![],
    }
}

/// `blocks` one-warp blocks of `per_warp` back-to-back ranges each, the
/// `n`th range of the launch of type `id(n)`.
fn ranges(blocks: u32, per_warp: u32, id: impl Fn(u64) -> u16) -> (BufferBuilder, [u32; 3]) {
    let mut b = BufferBuilder::new([blocks, 1, 1], [32, 1, 1], per_warp);
    for block in 0..blocks {
        let w = b.warp(block, 0).unwrap().sm(block % 132, block % 132);
        for k in 0..u64::from(per_warp) {
            let n = u64::from(block) * u64::from(per_warp) + k;
            let t = 1_000_000 + u64::from(block) * 7 + k * 100;
            w.range(id(n), t, t + 60 + n % 37, 0);
        }
    }
    (b, [blocks, 1, 1])
}

#[test]
fn many_event_ids_cost_what_the_capture_holds() {
    let dir = tempfile::tempdir().unwrap();
    // The ids share a few names: reading a registry of many distinct names is
    // the capture reader's matter (and slow today), not the report's.
    let names: Vec<String> = (0..16).map(|i| format!("phase{i}")).collect();
    let registry = |n: usize| {
        EventRegistry::from_pairs((0..n).map(|id| (id as u16, names[id % 16].as_str()))).unwrap()
    };
    // One id per record: 65,536 types of one range each.
    let one_each = synthetic(registry(1 << 16), vec![ranges(256, 256, |n| n as u16)]);
    // 4,000 types of 50 ranges; 64 types of 2,000 ranges (past the exact
    // percentiles, into the histograms), over two launches.
    let many = synthetic(
        registry(4_000),
        vec![
            ranges(400, 500, |n| (n % 4_000) as u16),
            ranges(128, 1_000, |n| (n % 64) as u16),
        ],
    );
    for (name, capture, types) in [
        ("one-each.tgpu", one_each, 1 << 16),
        ("many.tgpu", many, 4_000),
    ] {
        let path = write(&capture, dir.path(), name);
        let (report, svg) = report_both(&path, dir.path()).expect("a report");
        let rows = report.lines().filter(|l| l.starts_with("phase")).count();
        assert_eq!(rows, types, "{name}");
        // The legend: nine types of their own and the others together.
        assert!(
            svg.contains(&format!("{} other types: ", types - 9)),
            "{name}"
        );
        let doc = roxmltree::Document::parse(&svg).unwrap();
        let legend = doc
            .descendants()
            .find(|n| n.attribute("class") == Some("legend"))
            .unwrap();
        assert_eq!(
            legend.children().filter(|n| n.has_tag_name("rect")).count(),
            10
        );
    }
}

#[test]
fn width_is_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let capture = Path::new(env!("CARGO_MANIFEST_DIR")).join("captures/h200-quickstart.tgpu");
    let svg = dir.path().join("wide.svg");
    for width in ["4294967295", "10000000", "20001", "99", "0"] {
        let r = run(&[
            "report",
            capture.to_str().unwrap(),
            "--svg",
            svg.to_str().unwrap(),
            "--width",
            width,
        ]);
        assert_eq!(r.code, Some(2), "--width {width}: {}", r.stderr);
        assert!(r.stderr.contains("100..=20000"), "{}", r.stderr);
        assert!(r.cpu_s < 1.0, "{:.1} s", r.cpu_s);
    }
    // The widest allowed: within the bounds, and as wide as asked.
    let r = run(&[
        "report",
        capture.to_str().unwrap(),
        "--svg",
        svg.to_str().unwrap(),
        "--width",
        "20000",
    ]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(
        r.cpu_s < CPU_LIMIT_S && r.peak_rss_kb < RSS_LIMIT_KB,
        "{:.1} s, {} KB",
        r.cpu_s,
        r.peak_rss_kb
    );
    let text = std::fs::read_to_string(&svg).unwrap();
    let doc = roxmltree::Document::parse(&text).unwrap();
    let w: f64 = doc
        .root_element()
        .attribute("width")
        .unwrap()
        .parse()
        .unwrap();
    assert!(w > 20_000.0, "{w}");
    assert!(r.stdout_bytes < 64 << 10);
}
