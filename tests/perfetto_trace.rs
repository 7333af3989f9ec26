//! Host spans and device batches through the real subscriber (registry +
//! `PerfettoLayer`), two GPUs (the second simulated), no GPU needed; every
//! trace is checked with Perfetto's own schema by `tests/check_perfetto.py`.

mod perfetto_check;
mod support;

use std::path::Path;
use std::sync::Arc;

use tracing::Dispatch;
use tracing_gpu::batch::{Batch, BatchSink, DeviceInfo, LaunchInfo};
use tracing_gpu::clock::{Calibration, HostClock};
use tracing_gpu::decode::OwnedBuffer;
use tracing_gpu::format::BufferBuilder;
use tracing_gpu::output::AtomicFile;
use tracing_gpu::perfetto::{PerfettoLayer, TraceWriter};
use tracing_gpu::registry::EventRegistry;

use support::{gemm_registry, EPILOGUE, LOAD, MAINLOOP, MMA};
use tracing_subscriber::prelude::*;

fn registry() -> Arc<EventRegistry> {
    gemm_registry(true)
}

/// The checker's payload expectations for [`registry`].
const PAYLOADS: [&str; 8] = [
    "--expect-payload",
    "load=k_tile",
    "--expect-payload",
    "mma=k_tile",
    "--expect-payload",
    "epilogue=",
    "--expect-payload",
    "mainloop=",
];

/// One launch on GPU `ordinal`: 4 blocks of 2 warps, device times from
/// `d0`, mapped so that `d0` lands at host time `h0`. Warps on SM 2 and SM 10
/// (so numeric order differs from text order); sequential, nested and
/// partially overlapping events; one slot overflows if `overflow`.
fn batch(
    ordinal: u32,
    launch_id: u64,
    d0: u64,
    h0: u64,
    overflow: bool,
    parent: Option<tracing::span::Id>,
) -> Arc<Batch> {
    let mut b = BufferBuilder::new([4, 1, 1], [64, 1, 1], 8);
    b.launch_id(launch_id);
    b.warp(0, 0)
        .unwrap()
        .sm(2, 2)
        .range(LOAD, d0, d0 + 100, 0)
        .range(MMA, d0 + 100, d0 + 300, 0)
        .range(LOAD, d0 + 300, d0 + 400, 1)
        .range(MMA, d0 + 400, d0 + 600, 1)
        .instant(EPILOGUE, d0 + 650, 0);
    // k-tiles inside a main loop, recorded in end order.
    b.warp(0, 1)
        .unwrap()
        .sm(2, 2)
        .range(LOAD, d0 + 10, d0 + 100, 0)
        .range(LOAD, d0 + 100, d0 + 200, 1)
        .range(MAINLOOP, d0 + 10, d0 + 200, 2);
    // Partial overlap: the second range needs a second lane.
    b.warp(1, 0)
        .unwrap()
        .sm(10, 10)
        .range(LOAD, d0, d0 + 300, 0)
        .range(MMA, d0 + 200, d0 + 500, 0);
    let w = b.warp(3, 1).unwrap().sm(10, 10);
    let n = if overflow { 10 } else { 8 };
    for i in 0..n {
        w.range(MMA, d0 + 50 * i, d0 + 50 * i + 40, i as u32);
    }
    let capture = OwnedBuffer::decode(b.finish(), None).unwrap();
    Arc::new(Batch {
        device: Arc::new(DeviceInfo {
            ordinal,
            name: if ordinal == 0 {
                "Test GPU".into()
            } else {
                "Simulated second GPU".into()
            },
            sm_count: 132,
            ..Default::default()
        }),
        launch: LaunchInfo {
            launch_id,
            kernel: "gemm".into(),
            host_launch_ns: h0.saturating_sub(5_000),
            host_complete_ns: h0 + 10_000,
            grid: [4, 1, 1],
            block: [64, 1, 1],
            parent,
            host_thread: "main".into(),
            part: None,
        },
        buffer: Arc::new(capture),
        calibration: Arc::new(Calibration::exact(d0, h0, 3.0)),
        registry: registry(),
    })
}

/// The other files in `path`'s folder: the output's temporary file while it
/// is being written.
fn others(path: &Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p != path)
        .collect()
}

#[test]
fn host_and_device_trace_through_the_real_subscriber_passes_the_schema_check() {
    // One encoder (the writer thread encodes), and several.
    host_and_device(None, 1);
    host_and_device(None, 3);
}

#[test]
fn a_compressed_trace_passes_the_same_check() {
    host_and_device(Some(6), 1);
    host_and_device(Some(6), 2);
}

fn host_and_device(compress: Option<u32>, encoders: usize) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("host-device.perfetto-trace");
    let mut builder = PerfettoLayer::builder()
        .file(&path)
        .process_name("perfetto-test")
        .encoder_threads(encoders);
    if let Some(level) = compress {
        builder = builder.compress(level);
    }
    let (layer, guard) = builder.build().unwrap();
    let dispatch = Dispatch::new(tracing_subscriber::registry().with(layer));
    let sink = || {
        dispatch
            .downcast_ref::<PerfettoLayer>()
            .expect("the layer is found by downcast")
    };

    let mut batches = Vec::new();
    let mut host_slices = 0u64;
    tracing::dispatcher::with_default(&dispatch, || {
        let main = tracing::info_span!("main", run = "test", answer = 42u64).entered();
        host_slices += 1;
        for (launch_id, ordinal) in [(1u64, 0u32), (2, 1), (3, 0), (4, 1)] {
            // The launch span, as gpu_profile! opens it: it carries the launch id.
            let span =
                tracing::info_span!("launch", gpu.launch_id = launch_id, gpu.kernel = "gemm");
            let h0 = span.in_scope(|| {
                tracing::info_span!("cuLaunchKernel").in_scope(|| HostClock::Boottime.now_ns())
            });
            host_slices += 2;
            // Device times: each GPU its own timer origin; the kernel starts
            // 20 µs after the launch on the host clock.
            let d0 = 5_000_000_000 * u64::from(ordinal + 1) + launch_id * 1_000_000;
            let b = batch(ordinal, launch_id, d0, h0 + 20_000, ordinal == 0, span.id());
            sink().on_batch(&b);
            batches.push(b);
            drop(span);
        }
        tracing::info!(done = true, "all launches queued");
        host_slices += 1;
        let worker = {
            let d = dispatch.clone();
            std::thread::Builder::new()
                .name("worker".into())
                .spawn(move || {
                    tracing::dispatcher::with_default(&d, || {
                        tracing::info_span!("worker").in_scope(|| {
                            tracing::debug_span!("inner", n = -3i64).in_scope(|| {});
                        });
                    })
                })
                .unwrap()
        };
        worker.join().unwrap();
        host_slices += 2;
        // Spans of the device target are the fallback for other layers:
        // this layer must not draw them again.
        tracing::trace_span!(target: "tracing_gpu::device", "gpu.event").in_scope(|| {});
        sink().flush();
        assert!(!path.exists(), "the trace appears only when finished");
        assert_eq!(others(&path).len(), 1, "one temporary file");
        drop(main);
    });
    let stats = guard.finish().unwrap();
    assert!(path.exists());
    assert!(others(&path).is_empty(), "no temporary file is left");

    let device_events: u64 = batches.iter().map(|b| b.buffer.event_count()).sum();
    let lost: u64 = batches.iter().map(|b| b.buffer.events_lost()).sum();
    assert_eq!(lost, 4, "two launches on GPU 0 lose 2 events each");
    assert_eq!(stats.device_events, device_events);
    assert_eq!(stats.kernels, 4);
    assert_eq!(stats.flows, 4);
    assert_eq!(stats.host_slices, host_slices);
    assert_eq!(stats.bytes, std::fs::metadata(&path).unwrap().len());

    let total = (device_events + 4 + host_slices).to_string();
    let (device, host) = (device_events.to_string(), host_slices.to_string());
    let mut args = vec![
        "--expect-slices",
        &total,
        "--expect-device-slices",
        &device,
        "--expect-kernels",
        "4",
        "--expect-host-slices",
        &host,
        "--expect-gpus",
        "2",
        "--expect-flows",
        "4",
        "--expect-events-lost",
        "4",
        // Each overflowing warp (one per overflowing batch) is marked where it lost them.
        "--expect-lost-marks",
        "2",
    ];
    args.extend(PAYLOADS);
    if let Ok(keep) = std::env::var("TGPU_KEEP_TRACE") {
        std::fs::copy(&path, keep).unwrap();
    }
    let Some(s) = perfetto_check::check(&path, &args) else {
        return;
    };
    // Exactly the slices of types that declare a payload carry one.
    let with_payload: u64 = batches
        .iter()
        .flat_map(|b| {
            let ids: Vec<u16> = b
                .buffer
                .view()
                .slots()
                .flat_map(|slot| slot.events().map(|e| e.id).collect::<Vec<_>>())
                .collect();
            ids
        })
        .filter(|&id| id == LOAD || id == MMA)
        .count() as u64;
    assert_eq!(s["device_payloads"], with_payload);
    // 2 SMs per GPU; 4 warps per launch, one of which needs a second lane.
    assert_eq!(s["sms"], 4);
    assert_eq!(s["warp_tracks"], 8);
    assert_eq!(s["lanes"], 10);
    assert_eq!(s["compressed"] > 0, compress.is_some(), "{s:?}");
}

#[test]
fn overlapping_launches_get_lanes_and_still_nest() {
    let dir = tempfile::tempdir().unwrap();
    for encoders in [None, Some(1), Some(3)] {
        let path = dir
            .path()
            .join(format!("overlap-{encoders:?}.perfetto-trace"));
        overlapping(&path, None, encoders);
        let path = dir
            .path()
            .join(format!("overlap-z-{encoders:?}.perfetto-trace"));
        overlapping(&path, Some(1), encoders);
    }
}

/// Writes `batches` into `path` (zlib-compressed at `compress`), finishes
/// and commits the file; checks and returns the number of device events
/// written. `encoders`: through a `PerfettoLayer` with that many encoder
/// threads; `None`: with a `TraceWriter`.
fn write_all<'a>(
    path: &Path,
    compress: Option<u32>,
    encoders: Option<usize>,
    batches: impl IntoIterator<Item = &'a Arc<Batch>>,
) -> u64 {
    let batches: Vec<_> = batches.into_iter().collect();
    let events = batches.iter().map(|b| b.buffer.event_count()).sum();
    let stats = match encoders {
        None => {
            let mut w = TraceWriter::new(AtomicFile::create(path).unwrap()).unwrap();
            if let Some(level) = compress {
                w = w.compress(level);
            }
            for b in batches {
                w.write_batch(b).unwrap();
            }
            let (file, stats) = w.finish().unwrap();
            file.commit().unwrap();
            stats
        }
        Some(n) => {
            let mut builder = PerfettoLayer::builder().file(path).encoder_threads(n);
            if let Some(level) = compress {
                builder = builder.compress(level);
            }
            let (layer, guard) = builder.build().unwrap();
            for b in batches {
                layer.on_batch(b);
            }
            guard.finish().unwrap()
        }
    };
    assert_eq!(stats.device_events, events);
    events
}

fn overlapping(path: &Path, compress: Option<u32>, encoders: Option<usize>) {
    let h0 = HostClock::Boottime.now_ns();
    // Two launches of one GPU whose device times overlap (two streams), and
    // a third after both, which reuses the first lanes.
    let a = batch(0, 10, 1_000_000, h0, false, None);
    let b = batch(0, 11, 1_000_250, h0 + 250, false, None);
    let c = batch(0, 12, 9_000_000, h0 + 8_000_000, true, None);
    let events = write_all(path, compress, encoders, [&a, &b, &c]);
    let Some(s) = perfetto_check::check(
        path,
        &[
            "--expect-device-slices",
            &events.to_string(),
            "--expect-kernels",
            "3",
            "--expect-flows",
            "0",
            "--expect-events-lost",
            "2",
            "--expect-lost-marks",
            "1",
        ],
    ) else {
        return;
    };
    assert_eq!(s["warp_tracks"], 4);
    assert!(
        s["lanes"] > 4,
        "overlapping launches need more lanes: {s:?}"
    );
}

#[test]
fn a_program_that_fails_early_leaves_no_trace_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("early.perfetto-trace");
    // Nothing recorded, the guard dropped (an error returned before `finish`).
    let (layer, guard) = PerfettoLayer::builder().file(&path).build().unwrap();
    drop((layer, guard));
    assert!(!path.exists() && others(&path).is_empty(), "no stub file");
    // Something recorded: dropping the guard still writes the file.
    let (layer, guard) = PerfettoLayer::builder().file(&path).build().unwrap();
    tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), || {
        tracing::info_span!("work").in_scope(|| {});
    });
    drop(guard);
    assert!(path.exists());
    // `finish` writes even an empty trace: it was asked for.
    let empty = dir.path().join("empty.perfetto-trace");
    let (_layer, guard) = PerfettoLayer::builder().file(&empty).build().unwrap();
    guard.finish().unwrap();
    assert!(empty.exists());
}

#[test]
fn a_trace_that_cannot_be_created_is_an_error_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("missing-dir").join("t.perfetto-trace");
    let err = PerfettoLayer::builder().file(&path).build().unwrap_err();
    assert!(err.to_string().contains("missing-dir"), "{err}");
    assert!(PerfettoLayer::builder().build().is_err(), "no file given");
    // An uncommitted AtomicFile removes its temporary file.
    let path = dir.path().join("abandoned.perfetto-trace");
    let f = AtomicFile::create(&path).unwrap();
    assert_eq!(others(&path).len(), 1, "one temporary file");
    drop(f);
    assert!(others(&path).is_empty() && !path.exists());
}

#[test]
fn the_checker_rejects_broken_traces() {
    // The checker is what makes the other tests able to fail: it must pass a
    // good trace and reject unmatched ends, open slices, misordered SMs,
    // missing interning, dangling flows, foreign clocks, misplaced slices.
    perfetto_check::self_test();
}

/// A launch of 20 blocks × 8 warps on 20 SMs, `per_warp` back-to-back ranges
/// each (payload: the index), device times from `d0` mapped to host `h0`.
fn busy(launch_id: u64, per_warp: u32, d0: u64, h0: u64) -> Arc<Batch> {
    let mut b = BufferBuilder::new([20, 1, 1], [256, 1, 1], per_warp);
    b.launch_id(launch_id);
    for block in 0..20 {
        for warp in 0..8 {
            let w = b.warp(block, warp).unwrap().sm(block, block);
            let mut t = d0 + u64::from(block * 8 + warp) * 64;
            for i in 0..per_warp {
                w.range(if i % 2 == 0 { LOAD } else { MMA }, t, t + 300, i);
                t += 332;
            }
        }
    }
    Arc::new(Batch {
        device: Arc::new(DeviceInfo {
            ordinal: 0,
            name: "Test GPU".into(),
            sm_count: 132,
            ..Default::default()
        }),
        launch: LaunchInfo {
            launch_id,
            kernel: "busy".into(),
            grid: [20, 1, 1],
            block: [256, 1, 1],
            ..Default::default()
        },
        buffer: Arc::new(OwnedBuffer::decode(b.finish(), None).unwrap()),
        calibration: Arc::new(Calibration::exact(d0, h0, -2.0)),
        registry: registry(),
    })
}

#[test]
fn busy_warps_share_short_sequence_ids_and_still_pass() {
    let dir = tempfile::tempdir().unwrap();
    let h0 = HostClock::Boottime.now_ns();
    // 160 warps of 80 events: more warps than short ids, so ids pass from
    // lane to lane. The second launch overlaps the first (second lanes); the
    // third has few events per warp (the lanes' own sequences); the fourth
    // is busy again (short ids, restarted on lanes that had their own).
    let batches = [
        busy(1, 80, 1_000_000, h0),
        busy(2, 80, 1_000_100, h0 + 100),
        busy(3, 4, 2_000_000, h0 + 1_000_000),
        busy(4, 80, 3_000_000, h0 + 2_000_000),
    ];
    for ((name, n), encoders) in [("two", 2), ("four", 4)]
        .into_iter()
        .flat_map(|c| [(c, None), (c, Some(3))])
    {
        let path = dir
            .path()
            .join(format!("{name}-{encoders:?}.perfetto-trace"));
        let events = write_all(&path, None, encoders, &batches[..n]);
        let Some(s) = perfetto_check::check(
            &path,
            &[
                "--expect-device-slices",
                &events.to_string(),
                "--expect-kernels",
                &n.to_string(),
            ],
        ) else {
            return;
        };
        assert_eq!(s["warp_tracks"], 160);
        assert!(
            s["lanes"] > 160,
            "the overlapping launch needs lanes: {s:?}"
        );
        if n == 2 {
            // 320 lanes wrote on at most 126 short ids (and the misc sequence).
            assert!(s["sequences"] <= 127, "{s:?}");
        } else {
            assert!(s["sequences"] > 127, "few events: the lanes' own ids {s:?}");
        }
    }
}

#[test]
fn a_launch_in_three_parts_draws_the_slices_of_the_whole_and_one_kernel_slice() {
    let dir = tempfile::tempdir().unwrap();
    let h0 = HostClock::Boottime.now_ns();
    let d0 = 1_000_000;
    let whole = batch(0, 20, d0, h0, true, None);
    // Warp (0, 1)'s main loop ends in the second part, one of its loads in the first.
    let parts = support::in_parts(&whole, &[d0 + 150, d0 + 350]);
    assert_eq!(parts.len(), 3);
    assert!(parts.iter().all(|p| p.buffer.event_count() > 0));
    for encoders in [None, Some(1), Some(3)] {
        let mut listed = Vec::new();
        for (name, batches) in [("whole", vec![&whole]), ("parts", parts.iter().collect())] {
            let path = dir
                .path()
                .join(format!("{name}-{encoders:?}.perfetto-trace"));
            let events = write_all(&path, None, encoders, batches);
            let slices = dir.path().join(format!("{name}-{encoders:?}.slices"));
            let checked = perfetto_check::check(
                &path,
                &[
                    "--expect-device-slices",
                    &events.to_string(),
                    "--expect-kernels",
                    "1",
                    "--expect-events-lost",
                    "2",
                    "--expect-lost-marks",
                    "1",
                    "--slices-out",
                    slices.to_str().unwrap(),
                ],
            );
            let Some(s) = checked else { return };
            assert_eq!(s["warp_tracks"], 4, "{name}: {s:?}");
            listed.push(perfetto_check::slices_by_warp(&slices));
        }
        // Every slice (the kernel's with its counts, the drop counter's values)
        // is the same, on the same warp's tracks.
        assert_eq!(listed[0], listed[1], "encoders {encoders:?}");
    }
}

#[test]
fn each_part_is_in_the_file_once_flushed_while_the_launch_runs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("streamed.perfetto-trace");
    let h0 = HostClock::Boottime.now_ns();
    let whole = batch(0, 21, 1_000_000, h0, false, None);
    let parts = support::in_parts(&whole, &[1_000_150, 1_000_350]);
    let (layer, guard) = PerfettoLayer::builder()
        .file(&path)
        .encoder_threads(2)
        .build()
        .unwrap();
    let written = || -> u64 {
        others(&path)
            .iter()
            .map(|p| std::fs::metadata(p).unwrap().len())
            .sum()
    };
    layer.flush();
    let mut size = written();
    for part in &parts {
        layer.on_batch(part);
        layer.flush();
        let now = written();
        assert!(now > size, "part {:?} was not written", part.launch.part);
        size = now;
    }
    let stats = guard.finish().unwrap();
    assert_eq!(stats.device_events, whole.buffer.event_count());
    assert_eq!(stats.kernels, 1);
}
