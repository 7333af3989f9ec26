//! The `tracing-gpu` binary, run as a user would: good and bad inputs, messages
//! and exit codes (see `tracing-gpu --help`).
#![cfg(feature = "cli")]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tracing_gpu::batch::{DeviceInfo, HostSpan, LaunchInfo};
use tracing_gpu::capture::{CalibrationRound, Capture, CaptureDevice, CaptureLaunch};
use tracing_gpu::clock::Sample;
use tracing_gpu::decode::OwnedBuffer;
use tracing_gpu::format::BufferBuilder;
use tracing_gpu::registry::EventRegistry;

#[cfg(feature = "otlp")]
mod otlp_receiver;
mod perfetto_check;
mod support;

use support::cli::{run_cli, run_cli_with_env, Limits, Run};

/// The longest any one run may take before the test fails.
const WALL: Duration = Duration::from_secs(120);

fn run(args: &[&str]) -> Run {
    let o = run_cli(args, Limits::wall(WALL));
    assert!(!o.timed_out, "{args:?} ran past {WALL:?}: {}", o.stderr);
    o
}

/// A small but complete capture: one 8-SM GPU, calibrated, two launches of a
/// GEMM-like kernel (a producer and two consumer warps per block), host spans.
fn sample_dump() -> Capture {
    let registry =
        EventRegistry::from_pairs([(1, "load"), (2, "wait"), (3, "mma"), (4, "epilogue")]).unwrap();
    // The device clock runs 5 µs behind the host's, and the samples say so.
    let offset = 5_000u64;
    let host0 = 1_000_000_000u64;
    let samples: Vec<Sample> = (0..64u64)
        .map(|i| {
            let host = host0 + i * 10_000;
            Sample {
                host_before: host,
                device: host + 1_000 - offset,
                host_after: host + 2_000,
            }
        })
        .collect();
    let info = DeviceInfo {
        ordinal: 0,
        name: "NVIDIA H200".into(),
        uuid: "GPU-00000000-0000-0000-0000-000000000000".into(),
        sm_count: 8,
        driver_version: "580.159.04".into(),
        compute_capability: (9, 0),
    };
    let mut launches = Vec::new();
    let mut host_spans = Vec::new();
    for launch in 0..2u64 {
        let t0 = host0 + 1_000_000 + launch * 200_000 - offset;
        let mut b = BufferBuilder::new([8, 1, 1], [96, 1, 1], 64);
        b.launch_id(launch + 1);
        for block in 0..8u32 {
            let start = t0 + u64::from(block) * 300;
            let p = b.warp(block, 0).unwrap().sm(block, block);
            for k in 0..8u64 {
                p.range(1, start + k * 1_000, start + k * 1_000 + 700, k as u32);
            }
            for w in 1..3u32 {
                let c = b.warp(block, w).unwrap().sm(block, block);
                for k in 0..8u64 {
                    let s = start + k * 1_000 + 700;
                    c.range(2, s, s + 100, k as u32)
                        .range(3, s + 100, s + 900, k as u32);
                }
                let e = start + 8_700;
                c.range(4, e, e + 1_500, 0);
            }
        }
        let capture = Arc::new(OwnedBuffer::decode(b.finish(), Some(&registry)).unwrap());
        let info = LaunchInfo {
            launch_id: launch + 1,
            kernel: "gemm".into(),
            host_launch_ns: t0 + offset - 10_000,
            host_complete_ns: t0 + offset + 20_000,
            grid: [8, 1, 1],
            block: [96, 1, 1],
            parent: None,
            host_thread: "main".into(),
            part: None,
        };
        host_spans.push(HostSpan {
            name: "gemm".into(),
            target: "cli_test".into(),
            thread_name: "main".into(),
            thread_id: 1,
            start_ns: info.host_launch_ns - 1_000,
            end_ns: info.host_complete_ns + 1_000,
            parent: None,
            launch_id: Some(launch + 1),
            fields: vec![],
        });
        launches.push(CaptureLaunch::new(0, &info, capture));
    }
    Capture {
        metadata: vec![("tool".into(), "tests/cli.rs".into())],
        devices: vec![CaptureDevice {
            info,
            calibrations: vec![CalibrationRound {
                samples,
                ..Default::default()
            }],
        }],
        registry,
        launches,
        host_spans,
    }
}

fn write_sample(dir: &Path) -> PathBuf {
    let path = dir.join("sample.tgpu");
    sample_dump().write(&path).unwrap();
    path
}

/// `demo --replay` of the sample capture (written into `dir`), with `extra`
/// arguments; returns the run and the trace's path.
fn replay_sample(dir: &Path, extra: &[&str]) -> (Run, PathBuf) {
    let capture = write_sample(dir);
    let out = dir.join("demo.perfetto-trace");
    let mut args = vec!["demo", "--replay"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&[
        "--capture",
        capture.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    (run(&args), out)
}

fn assert_exit(o: &Run, code: i32, needle: &str) {
    let err = &o.stderr;
    assert_eq!(o.code, Some(code), "stderr: {err}\nstdout: {}", o.stdout);
    assert!(err.contains(needle), "expected {needle:?} in stderr: {err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn help_lists_the_exit_codes() {
    let o = run(&["--help"]);
    assert_eq!(o.code, Some(0));
    let out = &o.stdout;
    for line in [
        "3  an input file cannot be read",
        "4  an input file is not a valid capture",
        "6  no GPU",
    ] {
        assert!(out.contains(line), "{out}");
    }
}

#[test]
fn report_prints_statistics_and_draws_the_timeline() {
    let dir = tempfile::tempdir().unwrap();
    let capture = write_sample(dir.path());
    let svg = dir.path().join("timeline.svg");
    let o = run(&[
        "report",
        capture.to_str().unwrap(),
        "--svg",
        svg.to_str().unwrap(),
    ]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    let out = &o.stdout;
    assert!(out.contains("gemm on GPU 0 (NVIDIA H200)"), "{out}");
    assert!(out.contains("2 launches"), "{out}");
    // 2 launches × 8 blocks: 8 loads per producer, 8 waits and mmas per consumer.
    let row = |name: &str| {
        out.lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("{name}: {out}"))
            .to_string()
    };
    assert!(
        row("load").split_whitespace().nth(1) == Some("128"),
        "{}",
        row("load")
    );
    assert!(
        row("mma").split_whitespace().nth(1) == Some("256"),
        "{}",
        row("mma")
    );
    assert!(row("epilogue").contains("1.50 µs"), "{}", row("epilogue"));
    assert!(out.contains("SM   7"), "{out}");
    let text = std::fs::read_to_string(&svg).unwrap();
    let doc = roxmltree::Document::parse(&text).expect("the SVG is XML");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    assert!(doc.descendants().filter(|n| n.has_tag_name("rect")).count() > 16);
    assert!(o.stderr.contains("open it in a browser"));

    // One launch only, by its launch id (1 and 2 here).
    for id in ["1", "2"] {
        let o = run(&["report", capture.to_str().unwrap(), "--launch", id]);
        assert_eq!(o.code, Some(0), "{}", o.stderr);
        assert!(o.stdout.contains("1 launch,"), "{}", o.stdout);
    }
    let o = run(&["report", capture.to_str().unwrap(), "--launch", "3"]);
    assert_exit(
        &o,
        2,
        "no launch with that id (its 2 launches have ids 1 to 2)",
    );
    let o = run(&["report", capture.to_str().unwrap(), "--launch", "first"]);
    assert_exit(&o, 2, "neither a launch id");
}

/// A capture holds the watchdog's snapshots (issue #32) as notes; `report` shows those
/// of the launches it shows.
#[test]
fn report_shows_the_watchdogs_snapshots() {
    let dir = tempfile::tempdir().unwrap();
    let mut capture = sample_dump();
    let text = "launch 2 (gemm, grid 8x1x1, 4 warps per block) still running after 1.0 s:\n  \
                3 warps in wait for 1.0 s, after mma (k_tile 16)";
    capture.metadata.push(("watchdog 2.0".into(), text.into()));
    capture
        .metadata
        .push(("watchdog 2.x".into(), "not a snapshot".into()));
    let told: Vec<_> = capture
        .snapshots()
        .map(|(id, n, t)| (id, n, t.into_owned()))
        .collect();
    assert_eq!(told, [(2, 0, text.to_string())]);
    let path = dir.path().join("watched.tgpu");
    capture.write(&path).unwrap();
    let o = run(&["report", path.to_str().unwrap()]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    assert!(
        o.stdout
            .contains(&format!("watchdog, snapshot 1 of launch 2:\n{text}\n")),
        "{}",
        o.stdout
    );
    assert!(!o.stdout.contains("not a snapshot"), "{}", o.stdout);
    // Another launch alone: not its snapshot.
    let o = run(&["report", path.to_str().unwrap(), "--launch", "1"]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    assert!(!o.stdout.contains("watchdog"), "{}", o.stdout);
}

/// A capture recorded without `CaptureRecorder::layer()` says so, and
/// `convert` repeats it: no launch spans, and how to get them.
#[test]
fn convert_says_how_to_get_missing_host_spans() {
    let dir = tempfile::tempdir().unwrap();
    let mut capture = sample_dump();
    capture.host_spans.clear();
    capture.metadata.push((
        tracing_gpu::capture::HOST_SPANS_NOTE.into(),
        "not recorded: add CaptureRecorder::layer() to the subscriber".into(),
    ));
    let path = dir.path().join("bare.tgpu");
    capture.write(&path).unwrap();
    let out = dir.path().join("bare.perfetto-trace");
    let o = run(&[
        "convert",
        path.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    assert!(
        o.stderr.contains(
            "has no host spans (not recorded: add CaptureRecorder::layer() to the subscriber)"
        ),
        "{}",
        o.stderr
    );
    // Recorded without the layer: the launch spans only, and the note says so.
    let mut launches_only = sample_dump();
    launches_only.host_spans.retain(|s| s.launch_id.is_some());
    launches_only.metadata.push((
        tracing_gpu::capture::HOST_SPANS_NOTE.into(),
        "only the launch spans: add CaptureRecorder::layer() to the subscriber for the others"
            .into(),
    ));
    let some = dir.path().join("launches-only.tgpu");
    launches_only.write(&some).unwrap();
    let o = run(&[
        "convert",
        some.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    assert!(
        o.stderr
            .contains("has some host spans only (only the launch spans"),
        "{}",
        o.stderr
    );
    // With host spans, no such note.
    let o = run(&[
        "convert",
        write_sample(dir.path()).to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(!o.stderr.contains("no host spans"), "{}", o.stderr);
}

#[test]
fn missing_and_unreadable_inputs_exit_3() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.tgpu");
    let o = run(&["report", missing.to_str().unwrap()]);
    assert_exit(&o, 3, "cannot read");
    assert!(o.stderr.contains("No such file"), "{}", o.stderr);
    // A directory is not a file.
    let o = run(&["report", dir.path().to_str().unwrap()]);
    assert_exit(&o, 3, "cannot read");
}

#[test]
fn invalid_captures_exit_4_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let good = std::fs::read(write_sample(dir.path())).unwrap();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "wrong-magic",
            b"PK\x03\x04 this is a zip file, not a capture".to_vec(),
            "not a tracing-gpu capture: magic",
        ),
        ("empty", Vec::new(), "truncated"),
        ("truncated-header", good[..12].to_vec(), "truncated"),
        (
            "truncated-body",
            good[..good.len() / 2].to_vec(),
            "truncated",
        ),
        (
            "corrupt-body",
            {
                let mut b = good.clone();
                let mid = b.len() / 2;
                for x in &mut b[mid..mid + 16] {
                    *x ^= 0x5a;
                }
                b
            },
            "not a valid tracing-gpu capture",
        ),
        (
            "future-version",
            {
                let mut b = good.clone();
                b[8] = 99;
                b
            },
            "unsupported capture version 99",
        ),
        (
            "trailing-garbage",
            {
                let mut b = good.clone();
                b.extend_from_slice(b"garbage");
                b
            },
            "bytes after the compressed body",
        ),
    ];
    for (name, bytes, needle) in cases {
        let path = dir.path().join(format!("{name}.tgpu"));
        std::fs::write(&path, bytes).unwrap();
        let o = run(&["report", path.to_str().unwrap()]);
        assert_exit(&o, 4, needle);
        assert!(
            o.stderr.contains(path.to_str().unwrap()),
            "{name}: the message names the file"
        );
    }
}

#[test]
fn unwritable_output_exits_5() {
    let dir = tempfile::tempdir().unwrap();
    let capture = write_sample(dir.path());
    let svg = dir.path().join("no-such-folder").join("t.svg");
    let o = run(&[
        "report",
        capture.to_str().unwrap(),
        "--svg",
        svg.to_str().unwrap(),
    ]);
    assert_exit(&o, 5, "cannot write");
}

/// A capture read from a FIFO (as from `cat c.tgpu | tracing-gpu convert /dev/stdin`)
/// converts and reports as the file does: the reader spools what is not a regular file.
#[test]
fn a_capture_from_a_fifo_converts_and_reports_as_the_file_does() {
    let dir = tempfile::tempdir().unwrap();
    let capture = write_sample(dir.path());
    let fifo = dir.path().join("capture.fifo");
    let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a path we own, as a C string.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    let feed = |fifo: PathBuf, capture: PathBuf| {
        // Opening a FIFO for writing waits for its reader: the CLI, started next.
        std::thread::spawn(move || std::fs::write(&fifo, std::fs::read(&capture).unwrap()))
    };
    // A writer the CLI never read from still waits for a reader: one that opens
    // without waiting, and closes, lets it end (with an error) instead of hanging.
    let fed = |writer: std::thread::JoinHandle<std::io::Result<()>>, fifo: &Path| {
        use std::os::unix::fs::OpenOptionsExt;
        if !writer.is_finished() {
            let _ = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(fifo);
        }
        writer.join().unwrap()
    };
    let from_file = dir.path().join("file.perfetto-trace");
    let o = run(&[
        "convert",
        capture.to_str().unwrap(),
        "-o",
        from_file.to_str().unwrap(),
    ]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    let from_fifo = dir.path().join("fifo.perfetto-trace");
    let writer = feed(fifo.clone(), capture.clone());
    let o = run(&[
        "convert",
        fifo.to_str().unwrap(),
        "-o",
        from_fifo.to_str().unwrap(),
    ]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    fed(writer, &fifo).unwrap();
    // The same trace but for its sequence ids (random): the same size and contents.
    let size = |p: &Path| std::fs::metadata(p).unwrap().len();
    assert_eq!(size(&from_fifo), size(&from_file));
    assert_eq!(
        perfetto_check::check(&from_fifo, &[]),
        perfetto_check::check(&from_file, &[])
    );
    let writer = feed(fifo.clone(), capture.clone());
    let report = run(&["report", fifo.to_str().unwrap()]);
    assert_eq!(report.code, Some(0), "{}", report.stderr);
    fed(writer, &fifo).unwrap();
    assert_eq!(
        report.stdout,
        run(&["report", capture.to_str().unwrap()]).stdout
    );
}

/// An output that would replace the command's input, or another of its outputs, is
/// refused before anything is written (exit 2), and the input stays as it was.
#[test]
fn an_output_over_the_input_or_another_output_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let capture = write_sample(dir.path());
    let original = std::fs::read(&capture).unwrap();
    let c = capture.to_str().unwrap();
    // The same file by another spelling, and through a link to it.
    let respelled = dir.path().join(".").join("sample.tgpu");
    let link = dir.path().join("link.tgpu");
    std::os::unix::fs::symlink(&capture, &link).unwrap();
    let (respelled, link) = (respelled.to_str().unwrap(), link.to_str().unwrap());
    for args in [
        vec!["convert", c, "-o", c],
        vec!["convert", link, "-o", respelled],
        vec!["report", c, "--svg", c],
        vec!["demo", "--replay", "--capture", c, "-o", c],
    ] {
        let o = run(&args);
        assert_exit(&o, 2, "is the input");
        assert_eq!(
            o.stderr.trim_end().lines().count(),
            1,
            "{args:?}: {}",
            o.stderr
        );
        assert_eq!(
            std::fs::read(&capture).unwrap(),
            original,
            "{args:?} changed the input"
        );
    }
    // The demo's trace and its timeline (beside it, `.svg`) in one file.
    let out = dir.path().join("t.svg");
    let o = run(&[
        "demo",
        "--replay",
        "--capture",
        c,
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_exit(&o, 2, "would both be written to");
    assert!(!out.exists(), "nothing is written");
    // Outputs beside the input, and over a link to it (the link is replaced, never
    // its target), are allowed.
    let o = run(&["convert", c, "-o", link]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    assert_eq!(std::fs::read(&capture).unwrap(), original);
    assert!(!std::fs::symlink_metadata(link).unwrap().is_symlink());
}

#[test]
fn bad_usage_exits_2() {
    let o = run(&["report"]);
    assert_eq!(o.code, Some(2));
    let o = run(&["frobnicate"]);
    assert_eq!(o.code, Some(2));
    assert!(o.stderr.contains("unrecognized subcommand"), "{}", o.stderr);
}

#[test]
fn convert_writes_a_trace_that_passes_the_schema_check() {
    let dir = tempfile::tempdir().unwrap();
    let capture = write_sample(dir.path());
    let out = dir.path().join("sample.perfetto-trace");
    let o = run(&[
        "convert",
        capture.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    assert!(o.stderr.contains("https://ui.perfetto.dev"), "{}", o.stderr);
    // 2 launches × 8 blocks × (8 loads + 2 × (16 + 1)): 672 device slices;
    // the 2 launch spans on the host's thread, each with a flow to its kernel.
    if let Some(s) = perfetto_check::check(
        &out,
        &[
            "--expect-kernels",
            "2",
            "--expect-device-slices",
            "672",
            "--expect-host-slices",
            "2",
            "--expect-flows",
            "2",
        ],
    ) {
        assert_eq!(s.get("kernel_slices"), Some(&2), "{s:?}");
    }
    // No partial file is left when the output cannot be written.
    let bad = dir.path().join("missing-dir").join("t.perfetto-trace");
    let o = run(&[
        "convert",
        capture.to_str().unwrap(),
        "-o",
        bad.to_str().unwrap(),
    ]);
    assert_exit(&o, 5, "cannot write");
    let o = run(&[
        "convert",
        dir.path().join("nope").to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_exit(&o, 3, "cannot read");
}

#[test]
fn convert_replays_a_streamed_capture_as_the_launches_recorded_whole() {
    let dir = tempfile::tempdir().unwrap();
    let whole = write_sample(dir.path());
    let streamed = dir.path().join("streamed.tgpu");
    support::streamed_capture(&whole, 3, &streamed);
    let mut listed = Vec::new();
    for (name, capture) in [("whole", &whole), ("streamed", &streamed)] {
        let out = dir.path().join(format!("{name}.perfetto-trace"));
        let o = run(&[
            "convert",
            capture.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ]);
        assert_eq!(o.code, Some(0), "{}", o.stderr);
        let slices = dir.path().join(format!("{name}.slices"));
        let args = [
            "--expect-kernels",
            "2",
            "--expect-device-slices",
            "672",
            "--expect-flows",
            "2",
            "--slices-out",
            slices.to_str().unwrap(),
        ];
        if perfetto_check::check(&out, &args).is_none() {
            return;
        }
        listed.push(perfetto_check::slices_by_warp(&slices));
    }
    assert_eq!(listed[0], listed[1]);
}

#[test]
fn demo_without_a_gpu_replays_a_capture_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    // --replay: the same path as a machine without a GPU takes.
    let (o, out) = replay_sample(dir.path(), &[]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    let err = &o.stderr;
    assert!(
        err.contains("replaying") && err.contains("NVIDIA H200"),
        "{err}"
    );
    assert!(err.contains("https://ui.perfetto.dev"), "{err}");
    assert!(
        o.stdout.contains("load"),
        "the report is printed: {}",
        o.stdout
    );
    let svg = std::fs::read_to_string(out.with_extension("svg")).unwrap();
    roxmltree::Document::parse(&svg).expect("the SVG is XML");
    perfetto_check::check(&out, &["--expect-kernels", "2", "--expect-flows", "2"]);
}

#[test]
fn demo_replays_the_shipped_capture() {
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("captures/h200-quickstart.tgpu");
    assert!(shipped.exists(), "{} is missing", shipped.display());
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("demo.perfetto-trace");
    let o = run(&["demo", "--replay", "-o", out.to_str().unwrap()]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    assert!(o.stderr.contains("replaying"), "{}", o.stderr);
    // The capture holds 4 launches and 211,200 device events, none dropped,
    // and 16 host spans (the root, setup, compile, upload, and per launch a
    // step, the launch span and a synchronize): a live run's trace has the
    // same slices and a flow from each launch span to its kernel.
    perfetto_check::check(
        &out,
        &[
            "--expect-kernels",
            "4",
            "--expect-device-slices",
            "211200",
            "--expect-host-slices",
            "16",
            "--expect-flows",
            "4",
        ],
    );
}

#[test]
fn the_shipped_gemm_capture_converts_to_a_checked_trace() {
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("captures/h200-gemm.tgpu");
    assert!(shipped.exists(), "{} is missing", shipped.display());
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("gemm.perfetto-trace");
    let o = run(&[
        "convert",
        shipped.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    // Two launches of the warp-specialized GEMM at 3072³ on the H200: 237,312
    // records each (producer loads, consumer waits and mmas per k-tile,
    // epilogues), none dropped, on every SM; 10 host spans (the run, compile,
    // upload, profiler setup, and per launch a step, the launch span and a
    // synchronize); the payloads under their declared names.
    perfetto_check::check(
        &out,
        &[
            "--expect-gpus",
            "1",
            "--expect-kernels",
            "2",
            "--expect-device-slices",
            "474624",
            "--expect-host-slices",
            "10",
            "--expect-flows",
            "2",
            "--expect-payload",
            "mma=k_tile",
            "--expect-payload",
            "epilogue=tile",
        ],
    );
}

#[test]
fn a_capture_without_calibration_cannot_be_placed_on_the_host_timeline() {
    let dir = tempfile::tempdir().unwrap();
    let mut dump = sample_dump();
    dump.devices[0].calibrations.clear();
    let path = dir.path().join("uncalibrated.tgpu");
    dump.write(&path).unwrap();
    let out = dir.path().join("t.perfetto-trace");
    let o = run(&[
        "convert",
        path.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_exit(
        &o,
        4,
        "cannot be replayed: launch 0: device 0 has no calibration",
    );
    assert!(!out.exists());
    // The report needs no host times: it still works.
    let o = run(&["report", path.to_str().unwrap()]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
}

#[test]
fn calibrate_without_a_gpu_exits_6() {
    let o = run(&["calibrate"]);
    if o.code == Some(0) {
        // A GPU machine: one row per GPU with its offset, drift and bound.
        assert!(o.stdout.contains("ppm"), "{}", o.stdout);
        return;
    }
    assert_exit(&o, 6, "cannot calibrate");
}

#[test]
fn the_live_commands_take_no_lineinfo() {
    for command in ["demo", "calibrate"] {
        let o = run(&[command, "--help"]);
        assert_eq!(o.code, Some(0), "{}", o.stderr);
        assert!(
            o.stdout.contains("--no-lineinfo"),
            "{command} --help: {}",
            o.stdout
        );
    }
    // A replay compiles nothing: the flag is accepted and changes nothing.
    let dir = tempfile::tempdir().unwrap();
    let (o, out) = replay_sample(dir.path(), &["--no-lineinfo"]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    perfetto_check::check(&out, &["--expect-kernels", "2"]);
    // Without a GPU, calibrate still says so (6), not bad usage (2).
    let o = run(&["calibrate", "--no-lineinfo", "--samples", "50"]);
    if o.code != Some(0) {
        assert_exit(&o, 6, "cannot calibrate");
    }
}

#[cfg(feature = "otlp")]
#[test]
fn convert_sends_host_and_device_spans_to_an_otlp_receiver() {
    use otlp_receiver::{Receiver, Transport};
    let dir = tempfile::tempdir().unwrap();
    let capture = write_sample(dir.path());
    for (transport, protocol) in [
        (Transport::Http, "http/protobuf"),
        (Transport::Grpc, "grpc"),
    ] {
        let receiver = Receiver::start(transport);
        let endpoint = receiver.endpoint();
        let o = run(&[
            "convert",
            capture.to_str().unwrap(),
            "--otlp",
            &endpoint,
            "--otlp-protocol",
            protocol,
        ]);
        assert_eq!(o.code, Some(0), "{protocol}: {}", o.stderr);
        assert!(o.stderr.contains("spans exported"), "{}", o.stderr);
        // The two launch spans from the capture's host spans, and device spans under them.
        let spans = receiver.wait_for("the host spans and device phases", |s| {
            s.iter().filter(|r| r.span.name == "gemm").count() >= 2
                && s.iter().any(|r| r.span.name.contains("mma"))
        });
        let host: Vec<_> = spans.iter().filter(|r| r.span.name == "gemm").collect();
        let device = spans.iter().find(|r| r.span.name.contains("mma")).unwrap();
        assert!(
            host.iter().any(|h| h.span.trace_id == device.span.trace_id),
            "{protocol}: the device span is not in a launch span's trace"
        );
    }
}

/// The service a collector shows: `OTEL_SERVICE_NAME`, else a `service.name` in
/// `OTEL_RESOURCE_ATTRIBUTES` (whose other attributes go along), else `tracing-gpu`.
#[cfg(feature = "otlp")]
#[test]
fn convert_otlp_names_the_service_as_the_environment_says() {
    use otlp_receiver::{Receiver, Transport};
    let dir = tempfile::tempdir().unwrap();
    let capture = write_sample(dir.path());
    let attrs = "service.name=from-attributes,deployment.environment=test";
    for (name, attributes, want) in [
        (None, None, "tracing-gpu"),
        (Some("my-service"), None, "my-service"),
        (Some("my-service"), Some(attrs), "my-service"),
        (None, Some(attrs), "from-attributes"),
    ] {
        let receiver = Receiver::start(Transport::Http);
        let endpoint = receiver.endpoint();
        let args = [
            "convert",
            capture.to_str().unwrap(),
            "--otlp",
            &endpoint,
            "--detail",
            "kernel",
        ];
        let env = [
            ("OTEL_SERVICE_NAME", name),
            ("OTEL_RESOURCE_ATTRIBUTES", attributes),
        ];
        let o = run_cli_with_env(&args, &env, Limits::wall(WALL));
        assert_eq!(o.code, Some(0), "{env:?}: {}", o.stderr);
        let spans = receiver.spans();
        assert!(!spans.is_empty(), "{env:?}: nothing received");
        for s in &spans {
            assert_eq!(
                s.resource_str("service.name"),
                Some(want),
                "{env:?}: {}",
                s.span.name
            );
            if attributes.is_some() {
                assert_eq!(
                    s.resource_str("deployment.environment"),
                    Some("test"),
                    "{env:?}"
                );
            }
        }
    }
}

/// `convert --otlp --detail`: one kernel span a launch, or phases, or every
/// event under its warp's span (2 launches × 8 blocks × 3 warps here).
#[cfg(feature = "otlp")]
#[test]
fn convert_otlp_detail_picks_the_spans() {
    use otlp_receiver::{Receiver, Transport};
    let dir = tempfile::tempdir().unwrap();
    let capture = write_sample(dir.path());
    // (detail, warp spans, mma spans): Phase has one mma span per launch and
    // consumer role (warps 1 and 2).
    for (detail, warps, mmas) in [("kernel", 0, 0), ("phase", 0, 4), ("warp", 48, 256)] {
        let receiver = Receiver::start(Transport::Http);
        let endpoint = receiver.endpoint();
        let o = run(&[
            "convert",
            capture.to_str().unwrap(),
            "--otlp",
            &endpoint,
            "--detail",
            detail,
        ]);
        assert_eq!(o.code, Some(0), "{detail}: {}", o.stderr);
        // The export has ended: everything is in.
        let spans = receiver.spans();
        let count = |f: &dyn Fn(&str) -> bool| spans.iter().filter(|r| f(&r.span.name)).count();
        assert_eq!(count(&|n| n.starts_with("block ")), warps, "{detail}");
        // Warp detail: event spans named for their type; phase detail: for
        // their type and warp role.
        let mma = |n: &str| n == "mma" || n.starts_with("mma (warp ");
        assert_eq!(count(&mma), mmas, "{detail}");
        // Two launch spans and two kernel spans, whatever the detail, told apart.
        assert_eq!(count(&|n| n == "gemm"), 2, "{detail}");
        assert_eq!(count(&|n| n == "gemm on GPU 0"), 2, "{detail}");
    }
    let o = run(&["convert", capture.to_str().unwrap(), "--detail", "warp"]);
    assert_eq!(o.code, Some(2), "--detail needs --otlp");
}

#[test]
fn otlp_export_failures_exit_7() {
    let dir = tempfile::tempdir().unwrap();
    let capture = write_sample(dir.path());
    // Nothing listens on port 1.
    let o = run(&[
        "convert",
        capture.to_str().unwrap(),
        "--otlp",
        "http://127.0.0.1:1",
    ]);
    assert_exit(&o, 7, "http://127.0.0.1:1");
}

#[test]
fn live_demo_on_a_gpu_writes_a_checked_trace() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("live.perfetto-trace");
    let o = run(&["demo", "-o", out.to_str().unwrap()]);
    if o.stderr.contains("no live run") {
        println!(
            "skipped: no GPU ({})",
            o.stderr.lines().next().unwrap_or("")
        );
        return;
    }
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    assert!(o.stderr.contains("live run on GPU 0"), "{}", o.stderr);
    // 8 profiled launches, each a kernel slice with a flow from its launch span;
    // the phases carry the tile they worked on, `done` the number of tiles.
    perfetto_check::check(
        &out,
        &[
            "--expect-kernels",
            "8",
            "--expect-flows",
            "8",
            "--expect-payload",
            "load=tile",
            "--expect-payload",
            "done=tiles",
        ],
    );
    let o = run(&["report", out.with_extension("tgpu").to_str().unwrap()]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
}
