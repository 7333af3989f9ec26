//! Every command ends within 10 s of CPU time and 512 MB of peak memory on any
//! capture of at most 2 MB, whatever its body inflates to (up to about 2 GB):
//! the bombs below, each a valid or a hostile file of what the format allows,
//! go through `convert -o`, `convert --otlp` (to a port where no collector
//! listens), `report` and `report --svg`. A valid one converts; a hostile one
//! is refused with exit 4 and one line.
//!
//! As in tests/report_bounds.rs, the bounds are on the child's own CPU time
//! and peak RSS (`wait4`), runs go one at a time, and a run still going after
//! [`WALL_LIMIT`] is killed and fails.
#![cfg(feature = "cli")]

use std::ffi::OsString;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use flate2::Compression;
use tracing_gpu::format::wire::SLOT_HEADER_SIZE;
use tracing_gpu::format::BufferBuilder;

mod support;
use support::cli::{run_cli, Limits};
use support::streamed::{launch_span, BodyWriter, Launch, Streamed};

const CPU_LIMIT_S: f64 = 10.0;
const RSS_LIMIT_KB: libc::c_long = 512 * 1024;
const FILE_LIMIT: u64 = 2 << 20;
const WALL_LIMIT: Duration = Duration::from_secs(60);
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Runs every command on `capture`: each within the bounds, with exit 0
/// (`valid`) or exit 4 and one line naming `refusal`.
fn every_command(capture: &Path, refusal: Option<&str>) {
    let size = std::fs::metadata(capture).unwrap().len();
    assert!(size <= FILE_LIMIT, "{}: {size} bytes", capture.display());
    let dir = capture.parent().unwrap();
    let p = |p: &Path| p.as_os_str().to_owned();
    let out = dir.join("out.perfetto-trace");
    let svg = dir.join("out.svg");
    let commands: [Vec<OsString>; 4] = [
        vec!["convert".into(), p(capture), "-o".into(), p(&out)],
        vec![
            "convert".into(),
            p(capture),
            "--otlp".into(),
            "http://127.0.0.1:9".into(),
            "--otlp-timeout".into(),
            "2".into(),
        ],
        vec!["report".into(), p(capture)],
        vec!["report".into(), p(capture), "--svg".into(), p(&svg)],
    ];
    for args in commands {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let r = run_cli(&args, Limits::wall(WALL_LIMIT));
        let what = format!("{args:?}: {:?}, {}", r.code, r.stderr);
        assert!(!r.timed_out, "{what}: still running after {WALL_LIMIT:?}");
        assert!(r.cpu_s <= CPU_LIMIT_S, "{what}: {:.1} s of CPU", r.cpu_s);
        assert!(
            r.peak_rss_kb <= RSS_LIMIT_KB,
            "{what}: {} MB",
            r.peak_rss_kb / 1024
        );
        let otlp = args.get(2).is_some_and(|a| a == "--otlp");
        match refusal {
            Some(needle) => {
                assert_eq!(r.code, Some(4), "{what}");
                assert_eq!(r.stderr.lines().count(), 1, "{what}");
                assert!(r.stderr.contains(needle), "{needle:?} in {what}");
            }
            // No collector: the export fails, after the capture was read.
            None if otlp => assert_eq!(r.code, Some(7), "{what}"),
            None => assert_eq!(r.code, Some(0), "{what}"),
        }
    }
}

#[test]
fn a_gigabyte_of_declared_empty_slots_costs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("empty-slots.tgpu");
    write_empty_slots(&path);
    every_command(&path, None);
}

/// One launch whose buffer declares 2¹⁸ slots of 256 records (1.1 GB), of which the
/// first 4 are flushed: it once took 1.1 GB in every command.
fn write_empty_slots(path: &Path) {
    let (grid, block) = ([1, 1, 1], [128, 1, 1]);
    let mut b = BufferBuilder::new(grid, block, 256);
    b.launch_id(1).slot_count(4);
    for warp in 0..4 {
        b.warp(0, warp)
            .unwrap()
            .sm(0, 0)
            .range(0, 1_000_000_000, 1_000_000_900, 0);
    }
    let mut flushed = b.finish();
    let slots: u32 = 1 << 18;
    flushed[16..20].copy_from_slice(&slots.to_le_bytes()); // slot_count
    let stride = (SLOT_HEADER_SIZE + 256 * 16) as u64;
    let len = 64 + u64::from(slots) * stride;
    let span = launch_span(999_000_000, 1_001_000_000);
    let mut w = BodyWriter::create(path, &[span], 1, Compression::best());
    w.launch(&Launch::new(grid, block), len);
    w.put(&flushed);
    w.fill(0, len - flushed.len() as u64);
    w.finish();
}

#[test]
fn names_of_200_mb_are_refused_before_they_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kernel-name.tgpu");
    write_long_name(&path);
    every_command(&path, Some("a kernel name of 209715200 bytes"));
}

/// A 200 MiB kernel name (under the old 256 MiB limit): report once took 1.2 GB and
/// printed 209 MB.
fn write_long_name(path: &Path) {
    let name = 200u32 << 20;
    let mut w = BodyWriter::create(path, &[], 1, Compression::best());
    let mut rec = 0u32.to_le_bytes().to_vec(); // device
    rec.extend_from_slice(&1u64.to_le_bytes());
    rec.extend_from_slice(&name.to_le_bytes());
    w.put(&rec);
    w.fill(b'k', u64::from(name));
    w.put(&[0; 8 + 8 + 24 + 4 + 1 + 8]); // the rest of the launch, no buffer
    w.finish();
}

#[test]
fn three_large_parts_are_read_one_at_a_time() {
    // 3 packed parts × 2,112 slots × 500 records, all alike: 3.2 M events, 76
    // MB of body in a file of 100 KB (the debug build's CPU time bounds the
    // size here; the release build takes 4,000 records a slot, 25 M events,
    // within the bounds, where holding the launch whole until its last part
    // took 1.36 GB).
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("parts.tgpu");
    write_parts(&path, 500);
    every_command(&path, None);
}

/// 3 packed parts × 2,112 slots × `events` records, all alike.
fn write_parts(path: &Path, events: u32) {
    Streamed {
        parts: 3,
        warps: 16,
        events,
        alike: true,
    }
    .write_with(path, Compression::best());
}

#[test]
fn many_streamed_launches_left_open_are_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("open.tgpu");
    write_open_launches(&path);
    every_command(&path, None);
}

/// 50,000 streamed launches of one part each, none the last (their run ended first):
/// what a command follows of them at once is bounded.
fn write_open_launches(path: &Path) {
    let (grid, block) = ([1, 1, 1], [32, 1, 1]);
    let n = 50_000u32;
    let mut w = BodyWriter::create(path, &[], n, Compression::best());
    for id in 1..=u64::from(n) {
        let mut b = BufferBuilder::new(grid, block, 1);
        b.launch_id(id);
        let t = 1_000_000_000 + id * 10;
        b.warp(0, 0).unwrap().sm(0, 0).range(0, t, t + 5, 0);
        let buffer = b.finish();
        let launch = Launch {
            launch_id: id,
            part: Some((0, false)),
            ..Launch::new(grid, block)
        };
        w.launch(&launch, buffer.len() as u64);
        w.put(&buffer);
    }
    w.finish();
}

#[test]
fn snapshots_of_the_most_warps_a_reader_takes_are_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("snapshots.tgpu");
    write_snapshots(&path, SNAPSHOTS);
    every_command(&path, None);
    // One more is past what a reader takes: refused at once.
    write_snapshots(&path, SNAPSHOTS + 1);
    every_command(&path, Some("more warps than a reader takes"));
}

/// The watchdog snapshots a capture may keep: 2 of 2¹⁸ warps each (docs/capture.md).
const SNAPSHOTS: u32 = 2;

/// `n` snapshots of a launch that never finished, each 2¹⁸ running warps on one SM in
/// one phase (5 MB of lines a snapshot), beside a small launch.
fn write_snapshots(path: &Path, n: u32) {
    let warps = 1 << 18;
    let mut capture = support::synthetic_capture(1, 1, 1);
    for i in 0..n {
        let mut value = format!(
            "tgpu-watch 1\nlaunch 2 snapshot {i} grid {warps} 1 1 warps_per_block 1 now_ns 1000000000 running_ns 1000000000 warps {warps}\nkernel k\n"
        );
        value.push_str(&"r 0 -9 -9 0:1 0@-9\n".repeat(warps));
        capture
            .metadata
            .push((format!("watchdog 2.{i}"), "text".into()));
        capture
            .metadata
            .push((format!("watchdog-warps 2.{i}"), value));
    }
    let mut file = std::fs::File::create(path).unwrap();
    capture.to_writer(&mut file).unwrap();
}

/// The bombs above as seeds for the fuzz targets `capture` and `pipeline` (fuzz/README.md),
/// written into `$TGPU_FUZZ_SEEDS`; the parts at the release build's size.
#[test]
#[ignore = "writes fuzz seeds: TGPU_FUZZ_SEEDS=DIR"]
fn write_fuzz_seeds() {
    let dir =
        std::path::PathBuf::from(std::env::var_os("TGPU_FUZZ_SEEDS").expect("TGPU_FUZZ_SEEDS"));
    std::fs::create_dir_all(&dir).unwrap();
    write_empty_slots(&dir.join("empty-slots.tgpu"));
    write_long_name(&dir.join("kernel-name.tgpu"));
    write_parts(&dir.join("parts.tgpu"), 4000);
    write_open_launches(&dir.join("open.tgpu"));
    write_snapshots(&dir.join("snapshots.tgpu"), SNAPSHOTS);
    for f in std::fs::read_dir(&dir).unwrap() {
        let len = f.unwrap().metadata().unwrap().len();
        assert!(len <= FILE_LIMIT, "a seed of {len} bytes");
    }
}
