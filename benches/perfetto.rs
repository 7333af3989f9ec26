//! Perfetto writer benchmarks (`cargo bench --bench perfetto`).
//!
//! - `device/decode+write`: decode (strict validation) of one capture of
//!   1,081,344 events (the seed's slice count: 132 blocks × 8 warps × 1024
//!   events) plus its Perfetto encoding, one core; events/s, and bytes per
//!   event printed. Twice: `no payload`, shaped like the seed's events (its
//!   records are 5 × int64 {type, start, end, ...} with no user data: the
//!   registry declares no payload, so slices carry no argument), and
//!   `k_tile payload` (both types declare their payload, the k-tile index,
//!   so every slice carries it).
//! - `device/decode`, `device/write`: the two halves.
//! - `encoders/gemm ×8`, `encoders/storm`: device batches through a
//!   `PerfettoLayer` (into a byte counter) with 1, 2 and 4 encoder threads
//!   (`PerfettoLayerBuilder::encoder_threads`); wall time from the first
//!   batch handed in to the finished trace, so events/s over all cores. `gemm
//!   ×8`: the capture above, 8 launches one after the other (8,650,752 events);
//!   `storm`: 4,096 launches of 4 blocks × 4 warps × 16 events (1,048,576
//!   events), the shape of a storm of short launches. The same figures, median
//!   of 5, are printed as `perfetto layer, ...` lines (also with 8 encoders),
//!   and again zlib-compressed at level 1 (`PerfettoLayerBuilder::compress`:
//!   each encoder deflates its own output).
//! - `host/span`: one plain span (enter + exit) through the generic `tracing`
//!   path into a `PerfettoLayer`; spans/s.
//! - The same 1,081,344 events written by tg4perfetto (the writer FlashInfer's
//!   profiler uses), in the same run, as a ratio: runs
//!   `scripts/bench_tg4perfetto.py` with `$TGPU_PYTHON` when that is set and
//!   has `tg4perfetto` (see `scripts/bench-tg4perfetto.sh`); says so and skips
//!   otherwise.

use std::io::{self, Write};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use tracing_gpu::batch::{Batch, DeviceInfo, LaunchInfo};
use tracing_gpu::clock::Calibration;
use tracing_gpu::decode::{Buffer, OwnedBuffer};
use tracing_gpu::format::BufferBuilder;
use tracing_gpu::perfetto::{PerfettoLayer, TraceWriter};
use tracing_gpu::registry::EventRegistry;
use tracing_subscriber::prelude::*;

const BLOCKS: u32 = 132;
const WARPS: u32 = 8;
const PER_WARP: u32 = 1024;
/// 132 × 8 × 1024: the seed's Perfetto slice count.
const EVENTS: u64 = BLOCKS as u64 * WARPS as u64 * PER_WARP as u64;

/// A GEMM-like capture: each warp alternates `load` and `mma` k-tile phases
/// (payload: the k-tile index) with small gaps, on a 32 ns timer grid (the
/// H200's `%globaltimer` step); blocks start at staggered times on 132 SMs.
fn capture() -> Vec<u8> {
    let mut b = BufferBuilder::new([BLOCKS, 1, 1], [32 * WARPS, 1, 1], PER_WARP);
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for block in 0..BLOCKS {
        for warp in 0..WARPS {
            let s = b.warp(block, warp).unwrap().sm(block, block);
            let mut t = 1_000_000_000u64 + u64::from(block) * 3_200 + u64::from(warp) * 96;
            for i in 0..PER_WARP {
                let id = 1 + (i % 2) as u16;
                let dur = 32 * (6 + next() % 20); // 192 to 800 ns
                let gap = 32 * (next() % 3); // 0 to 64 ns
                t += gap;
                s.range(id, t, t + dur, i / 2);
                t += dur;
            }
        }
    }
    b.finish()
}

/// The two rows: the registry without payloads (the seed's shape), and with
/// the k-tile index declared as both types' payload.
fn variants() -> [(&'static str, Arc<EventRegistry>); 2] {
    let plain = EventRegistry::from_pairs([(1, "load"), (2, "mma")]).unwrap();
    let k_tile = plain
        .clone()
        .with_payload(1, "k_tile")
        .and_then(|r| r.with_payload(2, "k_tile"))
        .unwrap();
    [
        ("no payload", Arc::new(plain)),
        ("k_tile payload", Arc::new(k_tile)),
    ]
}

fn batch(bytes: &[u8], registry: &Arc<EventRegistry>) -> Batch {
    let capture = OwnedBuffer::decode(bytes.to_vec(), Some(registry)).unwrap();
    assert_eq!(capture.event_count(), EVENTS);
    Batch {
        device: Arc::new(DeviceInfo {
            ordinal: 0,
            name: "bench".into(),
            sm_count: BLOCKS,
            ..Default::default()
        }),
        launch: LaunchInfo {
            launch_id: 1,
            kernel: "gemm".into(),
            grid: [BLOCKS, 1, 1],
            block: [32 * WARPS, 1, 1],
            ..Default::default()
        },
        buffer: Arc::new(capture),
        calibration: Arc::new(Calibration::exact(1_000_000_000, 5_000_000_000_000, 4.0)),
        registry: registry.clone(),
    }
}

/// Counts bytes and throws them away.
#[derive(Default)]
struct Count(u64);

impl Write for Count {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0 += buf.len() as u64;
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Decode + write of the whole capture (zlib-compressed at `level` if
/// given); returns the trace's size.
fn decode_and_write(bytes: &[u8], registry: &EventRegistry, b: &Batch, level: Option<u32>) -> u64 {
    let cap = Buffer::decode(bytes, Some(registry)).unwrap();
    assert_eq!(cap.event_count(), EVENTS);
    let mut w = TraceWriter::new(Count::default()).unwrap();
    if let Some(l) = level {
        w = w.compress(l);
    }
    w.write_batch(b).unwrap();
    w.finish().unwrap().0 .0
}

fn device(c: &mut Criterion) {
    let bytes = capture();
    let variants = variants();
    let batches: Vec<Batch> = variants.iter().map(|(_, r)| batch(&bytes, r)).collect();
    for ((name, registry), b) in variants.iter().zip(&batches) {
        let size = decode_and_write(&bytes, registry, b, None);
        println!(
            "perfetto, {name}: {EVENTS} events → {size} bytes, {:.2} bytes/event",
            size as f64 / EVENTS as f64
        );
    }
    let mut g = c.benchmark_group("device");
    g.throughput(Throughput::Elements(EVENTS));
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(8));
    for ((name, registry), b) in variants.iter().zip(&batches) {
        g.bench_function(BenchmarkId::new("decode+write", name), |it| {
            it.iter(|| decode_and_write(&bytes, registry, b, None))
        });
        g.bench_function(BenchmarkId::new("write", name), |it| {
            it.iter(|| {
                let mut w = TraceWriter::new(Count::default()).unwrap();
                w.write_batch(b).unwrap();
                w.finish().unwrap().0 .0
            })
        });
    }
    let registry = &variants[0].1;
    g.bench_function(BenchmarkId::new("decode", EVENTS), |it| {
        it.iter(|| {
            Buffer::decode(&bytes, Some(registry))
                .unwrap()
                .event_count()
        })
    });
    g.finish();
    for ((name, registry), b) in variants.iter().zip(&batches) {
        let ours = cpu_seconds(&bytes, registry, b, None);
        println!(
            "tracing-gpu, {name}: {EVENTS} events decoded and written in {ours:.4} s of one \
             core's CPU time (median of 5): {:.1} M events/s",
            EVENTS as f64 / ours / 1e6
        );
        for level in [1, 6] {
            let z = cpu_seconds(&bytes, registry, b, Some(level));
            let size = decode_and_write(&bytes, registry, b, Some(level));
            println!(
                "tracing-gpu, {name}, zlib level {level}: {:.2} bytes/event, {z:.4} s CPU \
                 ({:.1} M events/s)",
                size as f64 / EVENTS as f64,
                EVENTS as f64 / z / 1e6
            );
        }
        let payload = registry.payload_name(1).is_some();
        compare_with_tg4perfetto(&bytes, ours, payload);
    }
}

/// This thread's CPU time, in seconds: on a shared machine, wall time also
/// counts the time other processes had the core.
fn thread_cpu_s() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec; the clock id exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Median CPU time of 5 decode + write runs.
fn cpu_seconds(bytes: &[u8], registry: &EventRegistry, b: &Batch, level: Option<u32>) -> f64 {
    let mut runs: Vec<f64> = (0..5)
        .map(|_| {
            let t = thread_cpu_s();
            decode_and_write(bytes, registry, b, level);
            thread_cpu_s() - t
        })
        .collect();
    runs.sort_by(f64::total_cmp);
    runs[2]
}

/// `n` launches of `bytes`' capture, 10 ms apart on the host clock.
fn launches(bytes: &[u8], registry: &Arc<EventRegistry>, n: u64) -> Vec<Arc<Batch>> {
    let one = batch(bytes, registry);
    (0..n)
        .map(|i| {
            Arc::new(Batch {
                launch: LaunchInfo {
                    launch_id: i + 1,
                    ..one.launch.clone()
                },
                calibration: Arc::new(Calibration::exact(
                    1_000_000_000,
                    5_000_000_000_000 + i * 10_000_000,
                    4.0,
                )),
                ..one.clone()
            })
        })
        .collect()
}

/// 4,096 launches of 4 blocks × 4 warps × 16 ranges (`load`/`mma`, 200 ns
/// each), 5 µs apart, on SMs spread as the block scheduler spreads them.
fn storm(registry: &Arc<EventRegistry>) -> Vec<Arc<Batch>> {
    (0..4096u64)
        .map(|i| {
            let mut b = BufferBuilder::new([4, 1, 1], [128, 1, 1], 16);
            let d0 = 1_000_000_000 + i * 5_000;
            for block in 0..4 {
                let sm = (2 * (i as u32 * 4 + block)) % 132;
                for warp in 0..4 {
                    let s = b.warp(block, warp).unwrap().sm(sm, sm);
                    for k in 0..16 {
                        let t = d0 + u64::from(warp) * 32 + k * 224;
                        s.range(1 + (k % 2) as u16, t, t + 200, k as u32);
                    }
                }
            }
            let capture = OwnedBuffer::decode(b.finish(), Some(registry)).unwrap();
            Arc::new(Batch {
                device: Arc::new(DeviceInfo {
                    ordinal: 0,
                    name: "bench".into(),
                    sm_count: BLOCKS,
                    ..Default::default()
                }),
                launch: LaunchInfo {
                    launch_id: i + 1,
                    kernel: "short".into(),
                    grid: [4, 1, 1],
                    block: [128, 1, 1],
                    ..Default::default()
                },
                buffer: Arc::new(capture),
                calibration: Arc::new(Calibration::exact(1_000_000_000, 5_000_000_000_000, 4.0)),
                registry: registry.clone(),
            })
        })
        .collect()
}

/// The batches through a layer with `threads` encoders into a byte counter
/// (zlib-compressed at `level` if given), to the finished trace; returns the
/// wall time and the trace's size.
fn through_layer(batches: &[Arc<Batch>], threads: usize, level: Option<u32>) -> (Duration, u64) {
    let t = Instant::now();
    let mut builder = PerfettoLayer::builder()
        .writer(Count::default())
        .encoder_threads(threads);
    if let Some(l) = level {
        builder = builder.compress(l);
    }
    let (layer, guard) = builder.build().unwrap();
    for b in batches {
        tracing_gpu::batch::BatchSink::on_batch(&layer, b);
    }
    let stats = guard.finish().unwrap();
    let events: u64 = batches.iter().map(|b| b.buffer.event_count()).sum();
    assert_eq!(stats.device_events, events);
    (t.elapsed(), stats.bytes)
}

fn encoders(c: &mut Criterion) {
    let bytes = capture();
    let registry = &variants()[0].1;
    let cases = [
        ("gemm ×8", launches(&bytes, registry, 8)),
        ("storm", storm(registry)),
    ];
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    for (name, batches) in &cases {
        let events: u64 = batches.iter().map(|b| b.buffer.event_count()).sum();
        // Compressed, each encoder deflates its own output: the writer
        // thread only writes.
        for (level, threads) in [None, Some(1)]
            .into_iter()
            .flat_map(|l| [1, 2, 4, 8].map(|t| (l, t)))
        {
            let mut runs: Vec<(Duration, u64)> = (0..5)
                .map(|_| through_layer(batches, threads, level))
                .collect();
            runs.sort();
            let (wall, bytes) = runs[2];
            let zlib = level.map_or(String::new(), |l| format!(", zlib {l}"));
            println!(
                "perfetto layer, {name}{zlib}, {threads} encoder(s), {cores} cores: {events} events in \
                 {:.4} s wall (median of 5): {:.1} M events/s, {:.2} bytes/event",
                wall.as_secs_f64(),
                events as f64 / wall.as_secs_f64() / 1e6,
                bytes as f64 / events as f64
            );
        }
    }
    let mut g = c.benchmark_group("encoders");
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(8));
    for (name, batches) in &cases {
        let events: u64 = batches.iter().map(|b| b.buffer.event_count()).sum();
        g.throughput(Throughput::Elements(events));
        for threads in [1, 2, 4] {
            g.bench_function(BenchmarkId::new(*name, threads), |it| {
                it.iter(|| through_layer(batches, threads, None))
            });
        }
    }
    g.finish();
}

fn host(c: &mut Criterion) {
    let (layer, guard) = PerfettoLayer::builder().writer(io::sink()).build().unwrap();
    let dispatch = tracing::Dispatch::new(tracing_subscriber::registry().with(layer));
    let mut g = c.benchmark_group("host");
    g.throughput(Throughput::Elements(1));
    tracing::dispatcher::with_default(&dispatch, || {
        g.bench_function("span", |it| {
            it.iter(|| tracing::info_span!("span").in_scope(|| {}))
        });
        g.bench_function("span with 2 fields", |it| {
            it.iter(|| tracing::info_span!("span", k = 3u64, who = "me").in_scope(|| {}))
        });
    });
    g.finish();
    let stats = guard.finish().unwrap();
    println!(
        "perfetto host: {} slices, {:.2} bytes/slice",
        stats.host_slices,
        stats.bytes as f64 / stats.host_slices.max(1) as f64
    );
}

/// tg4perfetto on the same events, with or without a payload argument per
/// event (as ours), timed by the script (CPU time of its process); `ours` is
/// our decode + write CPU time from the same run.
fn compare_with_tg4perfetto(bytes: &[u8], ours: f64, payload: bool) {
    let Ok(python) = std::env::var("TGPU_PYTHON") else {
        println!("tg4perfetto comparison skipped: TGPU_PYTHON is not set (scripts/bench-tg4perfetto.sh sets it)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("capture.tgpu");
    std::fs::write(&input, bytes).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/bench_tg4perfetto.py");
    let mut cmd = Command::new(&python);
    cmd.arg(&script)
        .arg(&input)
        .arg(dir.path().join("tg4perfetto.perfetto-trace"));
    if !payload {
        cmd.arg("--no-payload");
    }
    let out = cmd.output().unwrap();
    if !out.status.success() {
        println!(
            "tg4perfetto comparison skipped: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        return;
    }
    let report = String::from_utf8_lossy(&out.stdout);
    let field = |k: &str| -> f64 {
        report
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('='))
            .and_then(|v| v.parse().ok())
            .unwrap_or(f64::NAN)
    };
    let (tg_write, tg_bytes, tg_events) = (field("write_s"), field("bytes"), field("events"));
    println!(
        "tg4perfetto, {}: {tg_events} events written in {tg_write:.2} s of CPU time \
         ({:.0} events/s, {:.1} bytes/event); tracing-gpu decode + write is {:.0}× faster",
        if payload {
            "payload argument"
        } else {
            "no payload"
        },
        tg_events / tg_write,
        tg_bytes / tg_events,
        tg_write / ours
    );
}

criterion_group!(benches, device, encoders, host);
criterion_main!(benches);
