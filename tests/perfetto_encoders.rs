//! `PerfettoLayerBuilder::encoder_threads`: a trace encoded by several
//! threads holds exactly the slices of the trace one thread encodes (same
//! tracks, names, timestamps, arguments, counter values), passes Perfetto's
//! schema check, and a flush still returns only after every batch handed in
//! before it is in the file.

mod perfetto_check;
mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tracing_gpu::batch::{Batch, BatchSink, DeviceInfo, LaunchInfo};
use tracing_gpu::clock::{Calibration, HostClock};
use tracing_gpu::decode::OwnedBuffer;
use tracing_gpu::format::BufferBuilder;
use tracing_gpu::perfetto::{PerfettoLayer, WriteStats};
use tracing_gpu::registry::EventRegistry;

use support::{gemm_registry, EPILOGUE, LOAD, MAINLOOP, MMA};

/// Records a slot holds: a warp given more drops the rest.
const CAPACITY: u32 = 96;

fn registry() -> Arc<EventRegistry> {
    gemm_registry(false)
}

/// Launch `k` on GPU `ordinal`: 1-7 blocks of 1-4 warps on even SMs (as the
/// block scheduler fills them; the same SMs for six launches), each warp with few (own sequence), many
/// (short sequence) or too many (dropped) events: k-tiles inside a main
/// loop (recorded in end order), then an instant. Every third launch starts
/// before the previous one of its GPU ends (its warps need second lanes).
fn launch(ordinal: u32, k: u64, h0: u64) -> Arc<Batch> {
    let (blocks, warps) = (1 + (k % 7) as u32, 1 + (k % 4) as u32);
    let mut b = BufferBuilder::new([blocks, 1, 1], [32 * warps, 1, 1], CAPACITY);
    b.launch_id(k);
    // A GPU's launches are 40 µs apart and last up to 37 µs; every third
    // starts 30 µs early.
    let base = 1_000_000_000 * u64::from(ordinal + 1);
    let d0 = base + 100_000 + k * 20_000 - if k.is_multiple_of(3) { 30_000 } else { 0 };
    for block in 0..blocks {
        for warp in 0..warps {
            let sm = (2 * block + 8 * (k as u32 / 6 % 2)) % 24;
            let w = b.warp(block, warp).unwrap().sm(sm, sm);
            let tiles = [2u32, 70, 110][((k as u32) + block + warp) as usize % 3];
            let mut t = d0 + u64::from(block * 4 + warp) * 64;
            let start = t;
            for i in 0..tiles {
                w.range(if i % 2 == 0 { LOAD } else { MMA }, t, t + 300, i);
                t += 332;
            }
            w.range(MAINLOOP, start, t, 0);
            w.instant(EPILOGUE, t + 10, 0);
        }
    }
    Arc::new(Batch {
        device: Arc::new(DeviceInfo {
            ordinal,
            name: format!("GPU {ordinal}"),
            sm_count: 24,
            ..Default::default()
        }),
        launch: LaunchInfo {
            launch_id: k,
            kernel: format!("kernel_{}", k % 5).into(),
            grid: [blocks, 1, 1],
            block: [32 * warps, 1, 1],
            ..Default::default()
        },
        buffer: Arc::new(OwnedBuffer::decode(b.finish(), None).unwrap()),
        calibration: Arc::new(Calibration::exact(base, h0, 2.5)),
        registry: registry(),
    })
}

/// 80 launches, alternating between two GPUs.
fn launches() -> Vec<Arc<Batch>> {
    let h0 = HostClock::Boottime.now_ns();
    (0..80).map(|k| launch((k % 2) as u32, k, h0)).collect()
}

/// The checker's summary of `trace`, with its slices written to `slices`
/// (`None`: the checker is not available here).
fn check(trace: &Path, slices: &Path, device_events: u64, kernels: u64) -> Option<()> {
    let s = perfetto_check::check(
        trace,
        &[
            "--expect-device-slices",
            &device_events.to_string(),
            "--expect-kernels",
            &kernels.to_string(),
            "--expect-gpus",
            "2",
            "--expect-payload",
            "load=k_tile",
            "--expect-payload",
            "mma=",
            "--slices-out",
            slices.to_str().unwrap(),
        ],
    )?;
    assert!(s["lanes"] > s["warp_tracks"], "overlapping launches: {s:?}");
    assert!(s["lost_marks"] > 0, "{s:?}");
    Some(())
}

/// Writes `batches` through a layer with `threads` encoders, flushing after
/// the first half; checks the flushed prefix of the file on the way.
fn write(dir: &Path, threads: usize, batches: &[Arc<Batch>]) -> (PathBuf, WriteStats) {
    let path = dir.join(format!("{threads}.perfetto-trace"));
    let (layer, guard) = PerfettoLayer::builder()
        .file(&path)
        .process_name("encoders")
        .encoder_threads(threads)
        .build()
        .unwrap();
    let half = batches.len() / 2;
    for b in &batches[..half] {
        layer.on_batch(b);
    }
    layer.flush();
    // The flush wrote every batch handed in before it: the temporary file is
    // a whole trace of them.
    let tmp_prefix = format!(".{threads}.perfetto-trace.");
    let tmp = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            name.starts_with(&tmp_prefix) && name.ends_with(".tmp")
        })
        .expect("the temporary file (src/output.rs names it)");
    let prefix = dir.join(format!("{threads}-prefix.perfetto-trace"));
    std::fs::copy(&tmp, &prefix).unwrap();
    let events: u64 = batches[..half].iter().map(|b| b.buffer.event_count()).sum();
    check(&prefix, &dir.join("prefix-slices"), events, half as u64);
    for b in &batches[half..] {
        layer.on_batch(b);
    }
    let stats = guard.finish().unwrap();
    assert_eq!(stats.bytes, std::fs::metadata(&path).unwrap().len());
    (path, stats)
}

#[test]
fn several_encoders_write_the_same_slices_as_one() {
    let dir = tempfile::tempdir().unwrap();
    let batches = launches();
    let events: u64 = batches.iter().map(|b| b.buffer.event_count()).sum();
    let lost: u64 = batches.iter().map(|b| b.buffer.events_lost()).sum();
    assert!(lost > 0);
    let (one_path, one) = write(dir.path(), 1, &batches);
    assert_eq!(one.device_events, events);
    assert_eq!(one.kernels, batches.len() as u64);
    assert_eq!(one.events_lost, lost);
    let one_slices = dir.path().join("1.slices");
    check(&one_path, &one_slices, events, one.kernels);
    for threads in [2, 3, 4] {
        let (path, stats) = write(dir.path(), threads, &batches);
        assert_eq!(
            WriteStats { bytes: 0, ..stats },
            WriteStats { bytes: 0, ..one },
            "{threads} encoders"
        );
        let slices = dir.path().join(format!("{threads}.slices"));
        if check(&path, &slices, events, one.kernels).is_none() {
            continue;
        }
        let (a, b) = (
            std::fs::read_to_string(&one_slices).unwrap(),
            std::fs::read_to_string(&slices).unwrap(),
        );
        // Every device event, drop mark, kernel slice and counter value.
        assert!(a.lines().count() as u64 > events + one.kernels);
        if a != b {
            let diff = a.lines().zip(b.lines()).find(|(x, y)| x != y);
            panic!("{threads} encoders wrote other slices than one: first difference {diff:?}");
        }
    }
}

/// A file on a slow disk: each write waits `per_write` first.
struct SlowFile(std::fs::File, std::time::Duration);

impl std::io::Write for SlowFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        std::thread::sleep(self.1);
        self.0.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// `compress_when_behind`: while the output lags behind the encoders, they
/// deflate what they hand back; the trace, partly compressed, holds every
/// slice.
#[test]
fn encoders_deflate_what_a_slow_output_cannot_take() {
    let dir = tempfile::tempdir().unwrap();
    // Some 18 pieces of output (1 MiB each, `FLUSH_AT`), each written in 30 ms
    // or more: the writer is behind from its second write on, when the encoders
    // can be at most 8 pieces ahead (4 queued, one each filling, 2 written), so
    // that they deflate some of the rest however fast they are. (With 400
    // launches, 6 pieces, fast encoders had made them all before the writer was
    // known to be behind: none deflated.)
    let h0 = HostClock::Boottime.now_ns();
    let count = 1200;
    let batches: Vec<_> = (0..count).map(|k| launch((k % 2) as u32, k, h0)).collect();
    let events: u64 = batches.iter().map(|b| b.buffer.event_count()).sum();
    let path = dir.path().join("behind.perfetto-trace");
    let slow = SlowFile(
        std::fs::File::create(&path).unwrap(),
        std::time::Duration::from_millis(30),
    );
    let (layer, guard) = PerfettoLayer::builder()
        .writer(slow)
        .encoder_threads(2)
        .compress_when_behind(1)
        .build()
        .unwrap();
    for b in &batches {
        layer.on_batch(b);
    }
    drop(layer);
    let stats = guard.finish().unwrap();
    assert_eq!(stats.device_events, events);
    let Some(s) = perfetto_check::check(
        &path,
        &[
            "--expect-device-slices",
            &events.to_string(),
            "--expect-kernels",
            &count.to_string(),
        ],
    ) else {
        return;
    };
    assert!(s["compressed"] > 0, "{s:?}");
}

/// A `Write` that blocks while `closed` (a disk that stalls).
struct Gate(Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>);

impl std::io::Write for Gate {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let (closed, open) = &*self.0;
        let _g = open.wait_while(closed.lock().unwrap(), |c| *c).unwrap();
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// While the output stalls, the layer holds a bounded number of batches
/// (the queue, the groups out with the encoders, the group being gathered):
/// `on_batch` waits rather than queue more. Once the output moves, every
/// batch is written.
#[test]
fn a_stalled_output_holds_back_the_batches_not_memory() {
    let gate = Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
    let (layer, guard) = PerfettoLayer::builder()
        .writer(Gate(gate.clone()))
        .batch_queue(4)
        .encoder_threads(2)
        .build()
        .unwrap();
    *gate.0.lock().unwrap() = true;
    let mut b = BufferBuilder::new([1, 1, 1], [32, 1, 1], 8);
    b.warp(0, 0)
        .unwrap()
        .sm(0, 0)
        .range(LOAD, 100, 200, 1)
        .range(MMA, 300, 400, 2);
    let one = launch(0, 1, 0);
    let buffer = Arc::new(OwnedBuffer::decode(b.finish(), None).unwrap());
    let batches: Vec<Arc<Batch>> = (0..5_000u64)
        .map(|i| {
            Arc::new(Batch {
                buffer: buffer.clone(),
                // 10 µs apart on the host: one lane.
                calibration: Arc::new(Calibration::exact(0, 1_000_000_000 + i * 10_000, 0.0)),
                ..(*one).clone()
            })
        })
        .collect();
    let handed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let feeder = {
        let (handed, batches) = (handed.clone(), batches.clone());
        std::thread::spawn(move || {
            for b in &batches {
                layer.on_batch(b);
                handed.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            layer
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(500));
    let held = handed.load(std::sync::atomic::Ordering::SeqCst);
    // 4 queued, 4 × 2 groups of at most 64 out, one group gathered, one in
    // the writer's hands.
    assert!(
        held > 0 && held <= 4 + 8 * 64 + 64 + 1,
        "{held} batches handed in"
    );
    *gate.0.lock().unwrap() = false;
    gate.1.notify_all();
    let layer = feeder.join().unwrap();
    drop(layer);
    let stats = guard.finish().unwrap();
    assert_eq!(stats.kernels, 5_000);
    assert_eq!(stats.device_events, 2 * 5_000);
}
