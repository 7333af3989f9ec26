//! Output files from the `tracing-gpu` binary: complete or absent, whatever is
//! at or beside the destination, when two runs race, when the disk is full and
//! when the run is interrupted (src/output.rs, src/signals.rs).
#![cfg(all(feature = "cli", unix))]

mod support;

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread::sleep;
use std::time::{Duration, Instant};

use support::cli::{spawn_cli, Limits, Run, Running};
use tracing_gpu::capture::Capture;

/// The longest any one run may take before the test fails.
const LIMIT: Duration = Duration::from_secs(120);

fn shipped(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("captures")
        .join(name)
}

fn spawn(args: &[&str]) -> Running {
    spawn_cli(args, Limits::wall(LIMIT))
}

/// Waits for `child`, failing if it was killed at [`LIMIT`].
fn finish(child: Running) -> Run {
    let o = child.wait();
    assert!(!o.timed_out, "still running after {LIMIT:?}");
    o
}

fn run(args: &[&str]) -> Run {
    finish(spawn(args))
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The shipped quickstart capture cut to its first launch (52,800 events), for
/// runs that need a real capture but not a long one; written into `dir`.
fn one_launch(dir: &Path) -> PathBuf {
    let mut capture = Capture::read(shipped("h200-quickstart.tgpu")).unwrap();
    capture.launches.truncate(1);
    let path = dir.join("one-launch.tgpu");
    capture.write(&path).unwrap();
    path
}

/// Everything under `dir` (links not followed), as sorted relative paths.
fn tree(dir: &Path) -> Vec<PathBuf> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            out.push(entry.path().strip_prefix(root).unwrap().to_path_buf());
            if entry.file_type().unwrap().is_dir() {
                walk(root, &entry.path(), out);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// The temporary files in `dir`: `.NAME.XXXXXX.tmp`.
fn temporaries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.') && n.ends_with(".tmp"))
        .collect()
}

/// Exit 5 and one line on stderr that says which file and why.
fn assert_refused(o: &Run, path: &str, why: &str) {
    let err = &o.stderr;
    assert_eq!(o.code, Some(5), "{path}: {err}");
    assert_eq!(err.lines().count(), 1, "{path}: one line: {err}");
    assert!(
        err.starts_with(&format!("error: cannot write {path}: ")) && err.contains(why),
        "{path}: {err}"
    );
}

/// A trace past its first packet, the clock snapshot: the one part of a
/// conversion that differs from run to run (it records when the run wrote it).
fn past_clock_snapshot(trace: &[u8]) -> &[u8] {
    // Trace { repeated TracePacket packet = 1; }: tag 0x0a, varint length, bytes.
    assert_eq!(trace.first(), Some(&0x0a), "a trace starts with a packet");
    let (mut len, mut at) = (0usize, 1usize);
    for shift in (0..64).step_by(7) {
        let b = trace[at];
        at += 1;
        len |= usize::from(b & 0x7f) << shift;
        if b < 0x80 {
            break;
        }
    }
    // TracePacket.clock_snapshot is field 6: tag 0x32.
    assert_eq!(
        trace.get(at),
        Some(&0x32),
        "the first packet is the clock snapshot"
    );
    &trace[at + len..]
}

#[test]
fn links_and_files_beside_the_destination_are_left_alone() {
    let inputs = tempfile::tempdir().unwrap();
    let capture = one_launch(inputs.path());
    let dir = tempfile::tempdir().unwrap();
    let victim = dir.path().join("victim");
    std::fs::write(&victim, b"keep").unwrap();
    // Before AtomicFile the temporary file was always `<out>.tmp`, opened with
    // truncation: a link there was followed, a file there overwritten and
    // renamed away. Links at the current scheme's names must not be followed
    // either (`O_EXCL`: a name taken is skipped).
    let links = [
        "a.perfetto-trace.tmp",
        ".a.perfetto-trace.tmp",
        ".a.perfetto-trace.AAAAAA.tmp",
        ".b.perfetto-trace.zzzzzz.tmp",
    ];
    for name in links {
        std::os::unix::fs::symlink(&victim, dir.path().join(name)).unwrap();
    }
    let mine = dir.path().join("b.perfetto-trace.tmp");
    std::fs::write(&mine, b"mine").unwrap();
    let before = tree(dir.path());
    for out in ["a.perfetto-trace", "b.perfetto-trace"] {
        let path = dir.path().join(out);
        let o = run(&["convert", s(&capture), "-o", s(&path)]);
        assert_eq!(o.code, Some(0), "{}", o.stderr);
        let trace = std::fs::read(&path).unwrap();
        assert!(trace.len() > 1_000_000, "{out}: {} bytes", trace.len());
        past_clock_snapshot(&trace);
    }
    assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
    assert_eq!(std::fs::read(&mine).unwrap(), b"mine");
    for name in links {
        assert_eq!(std::fs::read_link(dir.path().join(name)).unwrap(), victim);
    }
    let mut expected = before;
    expected.extend(["a.perfetto-trace", "b.perfetto-trace"].map(PathBuf::from));
    expected.sort();
    assert_eq!(
        tree(dir.path()),
        expected,
        "nothing else created or removed"
    );
}

#[test]
fn outputs_that_are_not_files_are_refused_and_nothing_is_created() {
    let inputs = tempfile::tempdir().unwrap();
    let capture = one_launch(inputs.path());
    let dir = tempfile::tempdir().unwrap();
    let d = s(dir.path());
    std::fs::create_dir(dir.path().join("folder")).unwrap();
    std::fs::write(dir.path().join("folder/old"), b"old").unwrap();
    std::os::unix::fs::symlink(dir.path().join("folder"), dir.path().join("to-folder")).unwrap();
    let fifo = dir.path().join("fifo");
    let made = Command::new("mkfifo").arg(&fifo).status();
    assert!(made.is_ok_and(|s| s.success()), "mkfifo");
    let before = tree(dir.path());
    let cases = [
        (format!("{d}/folder"), "is a directory"),
        (format!("{d}/folder/"), "names a folder"),
        (format!("{d}/folder/."), "names a folder"),
        (format!("{d}/new/"), "names a folder"),
        (format!("{d}/to-folder"), "is a directory"),
        // Renamed over, it would become a regular file.
        (format!("{d}/fifo"), "not a regular file"),
    ];
    for (path, why) in &cases {
        let o = run(&["convert", s(&capture), "-o", path]);
        assert_refused(&o, path, why);
        let o = run(&["report", s(&capture), "--svg", path]);
        assert_refused(&o, path, why);
    }
    assert_eq!(tree(dir.path()), before, "nothing created anywhere");
    assert!(std::fs::symlink_metadata(&fifo)
        .unwrap()
        .file_type()
        .is_fifo());
}

#[test]
fn dev_null_is_refused_and_stays_a_device() {
    let inputs = tempfile::tempdir().unwrap();
    let capture = one_launch(inputs.path());
    let null = Path::new("/dev/null");
    let device = |p: &Path| {
        let m = std::fs::symlink_metadata(p).unwrap();
        assert!(
            m.file_type().is_char_device(),
            "{} is a device",
            p.display()
        );
        std::os::unix::fs::MetadataExt::rdev(&m)
    };
    let rdev = device(null);
    let o = run(&["convert", s(&capture), "-o", "/dev/null"]);
    // "not a regular file", not a permission error: refused before /dev is
    // touched, as root (who could replace /dev/null) or not.
    assert_refused(&o, "/dev/null", "not a regular file");
    assert_eq!(device(null), rdev);
    assert!(temporaries(Path::new("/dev")).is_empty());
}

/// Starts converting the shipped GEMM capture (14 MB of trace) to
/// `dir/gemm.perfetto-trace` and sends `signal` once its temporary file exists.
fn interrupt(dir: &Path, signal: i32) -> Run {
    let out = dir.join("gemm.perfetto-trace");
    let mut child = spawn(&["convert", s(&shipped("h200-gemm.tgpu")), "-o", s(&out)]);
    let deadline = Instant::now() + LIMIT;
    while temporaries(dir).is_empty() {
        if child.ended() {
            let o = child.wait();
            panic!(
                "the conversion ended (exit {:?}, signal {:?}) before its temporary file was seen: {}",
                o.code, o.signal, o.stderr
            );
        }
        assert!(
            Instant::now() < deadline,
            "no temporary file after {LIMIT:?}"
        );
        sleep(Duration::from_millis(1));
    }
    child.signal(signal);
    finish(child)
}

#[test]
fn sigint_and_sigterm_remove_the_temporary_file() {
    for (signal, name, code) in [
        (libc::SIGINT, "SIGINT", 130),
        (libc::SIGTERM, "SIGTERM", 143),
        (libc::SIGHUP, "SIGHUP", 129),
    ] {
        for earlier in [None, Some(&b"an earlier trace"[..])] {
            let dir = tempfile::tempdir().unwrap();
            let out = dir.path().join("gemm.perfetto-trace");
            if let Some(bytes) = earlier {
                std::fs::write(&out, bytes).unwrap();
            }
            let started = Instant::now();
            let o = interrupt(dir.path(), signal);
            let err = &o.stderr;
            assert_eq!(o.code, Some(code), "{name}: {err}");
            assert!(err.contains(&format!("interrupted by {name}")), "{err}");
            assert_eq!(temporaries(dir.path()), Vec::<String>::new(), "{name}");
            match earlier {
                None => assert!(!out.exists(), "{name}: no trace"),
                Some(bytes) => assert_eq!(std::fs::read(&out).unwrap(), bytes, "{name}"),
            }
            println!(
                "{name}, earlier file {}: exit {code} after {:?}",
                earlier.is_some(),
                started.elapsed()
            );
        }
    }
}

#[test]
fn sigkill_leaves_the_destination_as_it_was() {
    // SIGKILL cannot be caught: the temporary file stays, named so that it is
    // recognisable, and the destination is untouched.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("gemm.perfetto-trace");
    std::fs::write(&out, b"an earlier trace").unwrap();
    let o = interrupt(dir.path(), libc::SIGKILL);
    assert_eq!(o.signal, Some(libc::SIGKILL));
    assert_eq!(std::fs::read(&out).unwrap(), b"an earlier trace");
    let left = temporaries(dir.path());
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(
        left[0].starts_with(".gemm.perfetto-trace.")
            && left[0].len() == ".gemm.perfetto-trace.XXXXXX.tmp".len(),
        "{left:?}"
    );
}

#[test]
fn racing_writers_leave_one_whole_output() {
    let inputs = tempfile::tempdir().unwrap();
    let a = shipped("h200-quickstart.tgpu");
    // The same launches under another kernel name: a trace of about the same
    // size (5.4 MB) with different bytes.
    let mut other = Capture::read(&a).unwrap();
    for l in &mut other.launches {
        l.kernel = "quickstart_other".into();
    }
    let b = inputs.path().join("other.tgpu");
    other.write(&b).unwrap();
    let reference = |capture: &Path, name: &str| {
        let out = inputs.path().join(name);
        let o = run(&["convert", s(capture), "-o", s(&out)]);
        assert_eq!(o.code, Some(0), "{}", o.stderr);
        std::fs::read(&out).unwrap()
    };
    let (ref_a, ref_a2, ref_b) = (reference(&a, "a1"), reference(&a, "a2"), reference(&b, "b"));
    assert_eq!(
        past_clock_snapshot(&ref_a),
        past_clock_snapshot(&ref_a2),
        "a conversion is the same every time past its clock snapshot"
    );
    assert_ne!(past_clock_snapshot(&ref_a), past_clock_snapshot(&ref_b));

    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("same.perfetto-trace");
    let (mut a_won, mut b_won) = (0, 0);
    for round in 0..6 {
        let first = spawn(&["convert", s(&a), "-o", s(&out)]);
        let second = spawn(&["convert", s(&b), "-o", s(&out)]);
        for o in [finish(first), finish(second)] {
            assert_eq!(o.code, Some(0), "round {round}: {}", o.stderr);
        }
        let trace = std::fs::read(&out).unwrap();
        let body = past_clock_snapshot(&trace);
        if body == past_clock_snapshot(&ref_a) {
            a_won += 1;
        } else if body == past_clock_snapshot(&ref_b) {
            b_won += 1;
        } else {
            panic!("round {round}: {} bytes, neither whole output", trace.len());
        }
        assert_eq!(
            temporaries(dir.path()),
            Vec::<String>::new(),
            "round {round}"
        );
    }
    println!("racing writers: the first capture's trace won {a_won} rounds, the second's {b_won}");
}

/// A 64 KiB tmpfs mounted on a folder; unmounted when dropped, even if the test
/// fails.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path) -> Result<Tmpfs, String> {
        let o = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs", s(at)])
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !o.status.success() {
            return Err(format!(
                "mount -t tmpfs failed (root needed): {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ));
        }
        Ok(Tmpfs(at.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let done = Command::new("umount").arg(&self.0).status();
        if !done.is_ok_and(|s| s.success()) {
            // Busy (a child still running): detach it now, freed when unused.
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
}

#[test]
fn a_full_disk_leaves_no_partial_file() {
    let inputs = tempfile::tempdir().unwrap();
    let capture = one_launch(inputs.path());
    let root = tempfile::tempdir().unwrap();
    let disk = root.path().join("disk");
    std::fs::create_dir(&disk).unwrap();
    let _mounted = match Tmpfs::mount(&disk) {
        Ok(m) => m,
        Err(why) => {
            println!("skipped: {why}");
            return;
        }
    };
    std::fs::write(disk.join("old.perfetto-trace"), b"an earlier trace").unwrap();
    std::fs::write(disk.join("old.svg"), b"an earlier timeline").unwrap();
    let before = tree(&disk);
    // The trace (1.3 MB) and the timeline (2.4 MB) exceed 64 KiB.
    for name in ["new.perfetto-trace", "old.perfetto-trace"] {
        let path = disk.join(name);
        let o = run(&["convert", s(&capture), "-o", s(&path)]);
        assert_refused(&o, s(&path), "No space left on device");
    }
    for name in ["new.svg", "old.svg"] {
        let path = disk.join(name);
        let o = run(&["report", s(&capture), "--svg", s(&path)]);
        assert_refused(&o, s(&path), "No space left on device");
    }
    assert_eq!(tree(&disk), before, "no temporary file, no partial output");
    assert_eq!(
        std::fs::read(disk.join("old.perfetto-trace")).unwrap(),
        b"an earlier trace"
    );
    assert_eq!(
        std::fs::read(disk.join("old.svg")).unwrap(),
        b"an earlier timeline"
    );
}
