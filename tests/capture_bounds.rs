//! Captures in bounded memory: hostile files that inflate far beyond their size
//! are refused (exit 4, one line) without taking the memory they ask for, and
//! `convert` streams a capture a launch at a time. The CLI runs as a child
//! whose address space is capped (RLIMIT_AS): an allocation past the cap
//! fails, and the CLI aborts.
//!
//! (A cap rather than a measure: tests/support/cli.rs says why.)
#![cfg(feature = "cli")]

use std::ffi::OsStr;
use std::io::Write;
use std::path::Path;
use std::time::Duration;

use flate2::write::ZlibEncoder;
use flate2::Compression;
use tracing_gpu::capture::{Capture, CAPTURE_MAGIC, CAPTURE_VERSION};

mod support;
use support::cli::{run_cli_with_env, Limits, Run};

/// The address space the CLI gets: about three times what converting a small
/// capture takes (the binary, its libraries, a launch), and less than the
/// trace buffers of the large capture below, or the allocations the hostile
/// captures once asked for.
const CAP: u64 = 96 << 20;

/// Far beyond any of these runs, even in a debug build: a hang, not a slow run.
const WALL: Duration = Duration::from_secs(300);

/// Runs the CLI with its address space capped at [`CAP`], and one malloc arena:
/// glibc gives a thread whose first allocation meets the main one's lock an arena
/// of its own, 64 MiB of address space reserved at once, so the CLI's signal
/// thread, when it happened to, took two thirds of the cap (one CI run in several:
/// "memory allocation of 64000 bytes failed" in `report`). The cap bounds what
/// the CLI allocates, not what glibc reserves.
fn run<S: AsRef<OsStr>>(args: &[S]) -> Run {
    run_cli_with_env(args, ONE_ARENA, Limits::wall(WALL).memory(CAP))
}

/// The environment of every capped run ([`run`]).
const ONE_ARENA: &[(&str, Option<&str>)] = &[("MALLOC_ARENA_MAX", Some("1"))];

/// Exit 4 and one line naming `needle` (an abort, out of memory, has no exit
/// code).
fn refused(o: &Run, needle: &str) {
    let err = &o.stderr;
    assert_eq!(o.code, Some(4), "{:?}: {err}", o.code);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains(needle), "{needle:?} in {err}");
}

/// Writes a capture file whose body is `head`, `zeros` zero bytes, then
/// `tail`, compressed as it goes, and declared `declared` bytes long (the real
/// length if `None`).
fn write_body(path: &Path, head: &[u8], zeros: u64, tail: &[u8], declared: Option<u64>) {
    let len = head.len() as u64 + zeros + tail.len() as u64;
    let mut file = CAPTURE_MAGIC.to_vec();
    file.extend_from_slice(&CAPTURE_VERSION.to_le_bytes());
    file.extend_from_slice(&declared.unwrap_or(len).to_le_bytes());
    // Level 6: zlib-rs's level 1 packs zeros only about 100:1, too little for a bomb.
    let mut z = ZlibEncoder::new(file, Compression::default());
    z.write_all(head).unwrap();
    let chunk = vec![0u8; 1 << 20];
    let mut left = zeros;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        z.write_all(&chunk[..n]).unwrap();
        left -= n as u64;
    }
    z.write_all(tail).unwrap();
    std::fs::write(path, z.finish().unwrap()).unwrap();
}

/// `convert` and `report` of `capture` both refuse it.
fn both_refuse(dir: &Path, capture: &Path, needle: &str) {
    let out = dir.join("out.perfetto-trace");
    let c = run(&[
        OsStr::new("convert"),
        capture.as_os_str(),
        OsStr::new("-o"),
        out.as_os_str(),
    ]);
    refused(&c, needle);
    assert!(!out.exists(), "a refused capture leaves no trace");
    let r = run(&[OsStr::new("report"), capture.as_os_str()]);
    refused(&r, needle);
}

#[test]
fn twenty_five_million_empty_metadata_pairs_are_refused_at_once() {
    // 200 MB of body in a 200 KB file: as pairs of strings, 1.2 GB (which
    // the reader once reserved at the count).
    let dir = tempfile::tempdir().unwrap();
    let capture = dir.path().join("pairs.tgpu");
    let n: u32 = 25_000_000;
    write_body(&capture, &n.to_le_bytes(), u64::from(n) * 8 + 16, &[], None);
    assert!(std::fs::metadata(&capture).unwrap().len() < 1 << 20);
    both_refuse(dir.path(), &capture, "memory");
}

#[test]
fn fifty_million_empty_host_spans_are_refused_at_once() {
    // 2.1 GB of body (42 zero bytes is an empty span) in a 2 MB file; as host
    // spans, 7 GB.
    let dir = tempfile::tempdir().unwrap();
    let capture = dir.path().join("spans.tgpu");
    let n: u32 = 50_000_000;
    let mut head = vec![0u8; 16]; // no metadata, devices, events, launches
    head.extend_from_slice(&n.to_le_bytes());
    write_body(&capture, &head, u64::from(n) * 42, &[], None);
    both_refuse(dir.path(), &capture, "memory");
}

#[test]
fn lengths_the_stream_does_not_back_allocate_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let capture = dir.path().join("lies.tgpu");
    // A body declared 1 TB long whose first string claims 200 MB and has 10.
    let mut head = 1u32.to_le_bytes().to_vec();
    head.extend_from_slice(&(200u32 << 20).to_le_bytes());
    head.extend_from_slice(b"tool: none");
    write_body(&capture, &head, 0, &[], Some(1 << 40));
    both_refuse(dir.path(), &capture, "truncated");
    // A launch whose trace buffer claims 1 TB and has 64 bytes: its device
    // first (ordinal 0, empty strings, no calibration), then the launch.
    let mut head = 0u32.to_le_bytes().to_vec(); // metadata
    head.extend_from_slice(&1u32.to_le_bytes()); // one device
    head.extend_from_slice(&[0; 32]); // ordinal 0, empty names, no rounds
    head.extend_from_slice(&0u32.to_le_bytes()); // registry
    head.extend_from_slice(&1u32.to_le_bytes()); // one launch
    head.extend_from_slice(&[0; 4 + 8 + 4 + 8 + 8 + 12 + 12 + 4]); // device 0 … host_thread
    head.extend_from_slice(&(1u64 << 40).to_le_bytes());
    write_body(&capture, &head, 64, &[], Some(2 << 40));
    both_refuse(dir.path(), &capture, "truncated");
}

#[test]
fn duplicate_launch_ids_are_refused() {
    // Two launches with id 1: the trace would start one flow and end two.
    let dir = tempfile::tempdir().unwrap();
    let mut capture = support::synthetic_capture(1, 1, 1);
    capture.launches.push(capture.launches[0].clone());
    let path = dir.path().join("twice.tgpu");
    capture.write(&path).unwrap();
    both_refuse(dir.path(), &path, "launch id 1 appears twice");
}

/// Converts `capture` (written into `dir` as `name`); what it said.
fn convert(dir: &Path, name: &str, capture: &Capture) -> String {
    let path = dir.join(name);
    capture.write(&path).unwrap();
    let out = path.with_extension("perfetto-trace");
    let r = run(&[
        OsStr::new("convert"),
        path.as_os_str(),
        OsStr::new("-o"),
        out.as_os_str(),
    ]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    r.stderr
}

#[test]
fn convert_takes_the_same_memory_for_ten_times_the_launches() {
    // Each launch holds 2.2 MB of trace buffer (528 warps × 256 records, 8
    // each written): 8 launches 18 MB, 80 launches 176 MB, more than the cap.
    // Read whole, the large one took 370 MB; a launch at a time, both take
    // about 17 MB.
    let dir = tempfile::tempdir().unwrap();
    for n in [8, 80] {
        let said = convert(
            dir.path(),
            &format!("{n}.tgpu"),
            &support::synthetic_capture(n, 4, 8),
        );
        let stats = format!(
            "({n} launches, {} device events, {n} host spans",
            n * 528 * 8
        );
        assert!(said.contains(&stats), "{stats} in {said}");
    }
}

#[test]
fn fifty_thousand_overlapping_launches_convert_in_seconds() {
    // Every kernel slice overlaps every other, and so does every launch's
    // warp: 50,000 kernel lanes, and 50,000 lanes of one warp. Scanning every
    // lane for a free one took 52 s in a debug build (over 600 s for 100,000
    // launches in a release build); found in a tree of the lanes' free
    // times, 1.4 s.
    const LIMIT: Duration = Duration::from_secs(10);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("overlapping.tgpu");
    support::overlapping_capture(50_000).write(&path).unwrap();
    let out = path.with_extension("perfetto-trace");
    let r = run_cli_with_env(
        &[
            OsStr::new("convert"),
            path.as_os_str(),
            OsStr::new("-o"),
            out.as_os_str(),
        ],
        ONE_ARENA,
        Limits::wall(LIMIT).memory(CAP),
    );
    assert!(!r.timed_out, "convert ran past {LIMIT:?}");
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stderr.contains("(50000 launches"), "{}", r.stderr);
}

#[test]
fn a_streamed_launch_is_read_part_by_part() {
    // One launch streamed in 16 parts of 132 × 4 warps × 250 events: 2.1 M
    // events, 54 MB of parts. Held whole (as report once held a streamed
    // launch until its last part) its events alone take 68 MB, past the cap
    // with the binary; a part at a time, each command takes what one part does.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("streamed.tgpu");
    let shape = support::streamed::Streamed {
        parts: 16,
        warps: 4,
        events: 250,
        alike: false,
    };
    shape.write(&path);
    let out = path.with_extension("perfetto-trace");
    let p = |p: &Path| p.as_os_str().to_owned();
    // (`report --svg` is bounded in tests/capture_bombs.rs, by peak RSS: under
    // an address-space cap a debug build's picture needs more than this one.)
    for args in [
        vec!["convert".into(), p(&path), "-o".into(), p(&out)],
        vec!["report".into(), p(&path)],
    ] {
        let r = run(&args);
        assert_eq!(r.code, Some(0), "{args:?}: {}", r.stderr);
        if args[0] == "report" {
            let events = format!("1 launch, {} events", shape.total());
            assert!(r.stdout.contains(&events), "{events} in {}", r.stdout);
        }
    }
}

/// Writes the synthetic captures that docs/performance.md measures into
/// `$TGPU_SYNTHETIC_DIR` (launches of 132 blocks × 4 warps × 200 events:
/// 105,600 events each), one per event count in `$TGPU_SYNTHETIC_EVENTS`
/// (default 1000000,10000000), as `events-<count>.tgpu`.
#[test]
#[ignore = "writes large files for measurements; run by hand"]
fn write_synthetic_captures() {
    let dir = std::env::var("TGPU_SYNTHETIC_DIR").expect("TGPU_SYNTHETIC_DIR");
    let counts =
        std::env::var("TGPU_SYNTHETIC_EVENTS").unwrap_or_else(|_| "1000000,10000000".into());
    for count in counts.split(',') {
        let count: u64 = count.trim().parse().unwrap();
        let launches = count.div_ceil(132 * 4 * 200);
        let path = Path::new(&dir).join(format!("events-{count}.tgpu"));
        support::synthetic_capture(launches, 4, 200)
            .write(&path)
            .unwrap();
        eprintln!("{}: {launches} launches", path.display());
    }
}

/// Writes a capture of one streamed launch into `$TGPU_SYNTHETIC_DIR` for the
/// measurements of issue #29, as `streamed-<count>.tgpu`: parts of 132 blocks
/// × 4 warps × 200 events (105,600 events a part), `$TGPU_STREAMED_EVENTS`
/// events in all (default 100,000,000); and `parts-bomb.tgpu`, 3 parts of
/// 2,112 slots × 4,000 alike records (25 M events in a file of 600 KB).
#[test]
#[ignore = "writes large files for measurements; run by hand"]
fn write_streamed_captures() {
    let dir = std::env::var("TGPU_SYNTHETIC_DIR").expect("TGPU_SYNTHETIC_DIR");
    let count: u64 =
        std::env::var("TGPU_STREAMED_EVENTS").map_or(100_000_000, |c| c.trim().parse().unwrap());
    let shape = support::streamed::Streamed {
        parts: count.div_ceil(132 * 4 * 200) as u32,
        warps: 4,
        events: 200,
        alike: false,
    };
    shape.write(&Path::new(&dir).join(format!("streamed-{count}.tgpu")));
    let bomb = support::streamed::Streamed {
        parts: 3,
        warps: 16,
        events: 4_000,
        alike: true,
    };
    bomb.write_with(
        &Path::new(&dir).join("parts-bomb.tgpu"),
        Compression::best(),
    );
}
