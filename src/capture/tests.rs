//! The capture file's tests: round trips, old versions, every error.

use std::fs;
use std::io::{Cursor, Write};
use std::path::Path;

use flate2::write::ZlibEncoder;
use flate2::Compression;

use std::mem::size_of;

use super::*;
use crate::batch::Batch;
use crate::clock::ClockError;
use crate::decode::DecodeError;
use crate::format::BufferBuilder;

fn capture(launch_id: u64, grid: [u32; 3], block: [u32; 3]) -> Arc<OwnedBuffer> {
    let mut b = BufferBuilder::new(grid, block, 16);
    b.launch_id(launch_id);
    for warp in 0..b.header().warps_per_block {
        let w = b.warp(0, warp).unwrap();
        w.sm(3, 3);
        for k in 0..20u64 {
            let t = 1_000_000 + k * 100 + warp as u64;
            w.range((k % 3) as u16, t, t + 60, k as u32);
        }
    }
    Arc::new(OwnedBuffer::decode(b.finish(), None).unwrap())
}

fn sample() -> Capture {
    let dev = |ordinal| CaptureDevice {
        info: DeviceInfo {
            ordinal,
            name: "NVIDIA H200".into(),
            uuid: format!("GPU-0000000{ordinal}-aaaa-bbbb-cccc-dddddddddddd"),
            sm_count: 132,
            driver_version: "580.159.04".into(),
            compute_capability: (9, 0),
        },
        calibrations: vec![
            CalibrationRound {
                samples: (0..8)
                    .map(|i| Sample {
                        host_before: 5_000 + i * 1000,
                        device: 1_000_000 + i * 1000,
                        host_after: 5_700 + i * 1000,
                    })
                    .collect(),
                realtime_offset_ns: 1_764_000_000_000_000_000,
                monotonic_offset_ns: -12,
                monotonic_raw_offset_ns: -340,
                offset_uncertainty_ns: 20,
                timer_step_ns: 32,
            },
            CalibrationRound::default(),
        ],
    };
    let launch = |device, id, grid, block| CaptureLaunch {
        device,
        launch_id: id,
        kernel: "gemm_ws".into(),
        host_launch_ns: 4_000 + id,
        host_complete_ns: 90_000 + id,
        grid,
        block,
        host_thread: "main".into(),
        part: None,
        buffer: capture(id, grid, block),
    };
    Capture {
        metadata: vec![("tool".into(), "tracing-gpu 0.1.0".into())],
        devices: vec![dev(0), dev(1)],
        registry: {
            let mut r = EventRegistry::from_pairs([(0, "load"), (1, "mma")]).unwrap();
            r.register_with(2, "store", Some("gemm"), Some("epilogue store"))
                .unwrap();
            r.declare_payload(1, "k_tile").unwrap();
            r
        },
        launches: vec![
            launch(0, 1, [1, 1, 1], [128, 1, 1]),
            launch(1, 2, [2, 1, 1], [64, 1, 1]),
        ],
        host_spans: vec![
            HostSpan {
                name: "step".into(),
                target: "app".into(),
                thread_name: "main".into(),
                thread_id: 77,
                start_ns: 3_000,
                end_ns: 100_000,
                parent: None,
                launch_id: None,
                fields: vec![("batch".into(), "3".into())],
            },
            HostSpan {
                name: "gemm_ws".into(),
                target: "tracing_gpu".into(),
                thread_name: "main".into(),
                thread_id: 77,
                start_ns: 4_000,
                end_ns: 90_001,
                parent: Some(0),
                launch_id: Some(1),
                fields: vec![],
            },
        ],
    }
}

fn bytes_of(d: &Capture) -> Vec<u8> {
    let mut v = Vec::new();
    d.to_writer(&mut v).unwrap();
    v
}

/// A file around an arbitrary body, to reach the body parser with bad bodies.
fn wrap(body: &[u8]) -> Vec<u8> {
    let mut v = CAPTURE_MAGIC.to_vec();
    v.extend_from_slice(&CAPTURE_VERSION.to_le_bytes());
    v.extend_from_slice(&(body.len() as u64).to_le_bytes());
    let mut z = ZlibEncoder::new(v, Compression::default());
    z.write_all(body).unwrap();
    z.finish().unwrap()
}

/// What [`CaptureReader`] reads of `bytes`, gathered into one capture.
fn streamed(bytes: &[u8]) -> Result<Capture, CaptureError> {
    let mut reader = CaptureReader::new(Cursor::new(bytes))?;
    let mut c = reader.head().clone();
    c.launches = reader.launches()?.collect::<Result<_, _>>()?;
    Ok(c)
}

#[test]
fn round_trips_through_a_file() {
    let d = sample();
    d.validate().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.tgpu");
    d.write(&path).unwrap();
    assert_eq!(Capture::read(&path).unwrap(), d);
    // Overwrite in place; no temporary file is left behind.
    let mut d2 = d.clone();
    d2.launches.pop();
    d2.write(&path).unwrap();
    assert_eq!(Capture::read(&path).unwrap(), d2);
    let names: Vec<_> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["run.tgpu"]);
    // The launch info comes back without its span id.
    let info = d.launches[1].info();
    assert_eq!(
        (info.launch_id, info.grid, info.parent.is_none()),
        (2, [2, 1, 1], true)
    );
    assert_eq!(
        CaptureLaunch::new(1, &info, d.launches[1].buffer.clone()),
        d.launches[1]
    );
    assert_eq!(
        Capture::from_reader(&bytes_of(&Capture::default())[..]).unwrap(),
        Capture::default()
    );
}

#[test]
fn version_1_captures_still_read() {
    // The shipped capture is a version 1 file: its registry has no payload
    // names. It reads, and writes back (as the current version) unchanged.
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("captures/h200-quickstart.tgpu");
    let bytes = fs::read(&path).unwrap();
    assert_eq!(bytes[8..12], 1u32.to_le_bytes());
    let d = Capture::from_reader(&bytes[..]).unwrap();
    assert_eq!(d.registry.name(1), Some("load"));
    assert!(d.registry.iter().all(|(_, e)| e.payload.is_none()));
    let again = bytes_of(&d);
    assert_eq!(again[8..12], CAPTURE_VERSION.to_le_bytes());
    assert_eq!(Capture::from_reader(&again[..]).unwrap(), d);
}

#[test]
fn version_2_captures_still_read() {
    // The shipped GEMM capture is a version 2 file: its launches have no part.
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("captures/h200-gemm.tgpu");
    let bytes = fs::read(&path).unwrap();
    assert_eq!(bytes[8..12], 2u32.to_le_bytes());
    let d = Capture::from_reader(&bytes[..]).unwrap();
    assert_eq!(d.launches.len(), 2);
    assert!(d.launches.iter().all(|l| l.part.is_none()));
    assert_eq!(streamed(&bytes).unwrap(), d);
    let again = bytes_of(&d);
    assert_eq!(again[8..12], CAPTURE_VERSION.to_le_bytes());
    assert_eq!(Capture::from_reader(&again[..]).unwrap(), d);
}

/// [`sample`] with launch 1 streamed in three parts, launch 2 (whole) between
/// its second and third: the order a recorder takes them in when two
/// launches run at once.
fn sample_with_parts() -> Capture {
    let mut d = sample();
    for dev in &mut d.devices {
        dev.calibrations.truncate(1); // The second round cannot be fitted.
    }
    let whole = d.launches.remove(0);
    let other = d.launches.remove(0);
    let part = |index, last| CaptureLaunch {
        part: Some(crate::batch::Part { index, last }),
        host_complete_ns: whole.host_complete_ns - 10 + u64::from(index),
        ..whole.clone()
    };
    d.launches = vec![part(0, false), part(1, false), other, part(2, true)];
    d
}

#[test]
fn a_streamed_launch_is_held_as_its_parts_in_order() {
    let d = sample_with_parts();
    d.validate().unwrap();
    let bytes = bytes_of(&d);
    let back = Capture::from_reader(&bytes[..]).unwrap();
    assert_eq!(back, d);
    assert_eq!(streamed(&bytes).unwrap(), d);
    // Replayed as the same parts, in the same order.
    let parts = |batches: Vec<Arc<Batch>>| -> Vec<_> {
        batches
            .iter()
            .map(|b| (b.launch.launch_id, b.launch.part, b.launch.host_complete_ns))
            .collect()
    };
    let want: Vec<_> = d
        .launches
        .iter()
        .map(|l| (l.launch_id, l.part, l.host_complete_ns))
        .collect();
    assert_eq!(parts(back.batches().unwrap()), want);
    let mut reader = CaptureReader::new(Cursor::new(&bytes)).unwrap();
    let batches = reader.batches().unwrap().collect::<Result<_, _>>().unwrap();
    assert_eq!(parts(batches), want);
}

#[test]
fn parts_in_packed_buffers_round_trip() {
    // What the live drain delivers a part in: a packed buffer (docs/format.md).
    use crate::format::PackedWriter;
    let mut d = sample_with_parts();
    for l in d.launches.iter_mut().filter(|l| l.part.is_some()) {
        let view = l.buffer.view();
        let mut w = PackedWriter::new(view.header());
        for slot in view.slots() {
            w.slot(&slot.header, &slot.events().collect::<Vec<_>>());
        }
        l.buffer = Arc::new(OwnedBuffer::decode(w.finish(), None).unwrap());
    }
    let bytes = bytes_of(&d);
    let back = Capture::from_reader(&bytes[..]).unwrap();
    assert_eq!(back, d);
    assert_eq!(streamed(&bytes).unwrap(), d);
    let packed = back.launches[0].buffer.header().flags;
    assert_eq!(packed, crate::format::BUFFER_FLAG_PACKED);
    assert_eq!(back.batches().unwrap().len(), 4);
}

#[test]
fn parts_out_of_order_are_refused_by_both_readers() {
    use crate::batch::Part;
    let part = |index, last| Some(Part { index, last });
    // What each spoils, and whether the error is a duplicate (else bad parts).
    let cases: [(&str, usize, Option<Part>, bool); 4] = [
        ("a gap", 1, part(2, false), false),
        ("a part after the last", 1, part(1, true), false),
        ("a part and a whole launch", 0, None, true),
        ("a part twice", 1, part(0, false), false),
    ];
    for (what, at, spoilt, duplicate) in cases {
        let is = |e: &CaptureError| match duplicate {
            true => matches!(e, CaptureError::DuplicateLaunch { launch_id: 1 }),
            false => matches!(e, CaptureError::BadParts { launch_id: 1, .. }),
        };
        let mut d = sample_with_parts();
        d.launches[at].part = spoilt;
        let e = d.validate().unwrap_err();
        assert!(is(&e), "{what}: {e}");
        let bytes = bytes_of(&d);
        let e = Capture::from_reader(&bytes[..]).unwrap_err();
        assert!(is(&e), "{what}: {e}");
        let e = streamed(&bytes).unwrap_err();
        assert!(is(&e), "{what}: {e}");
    }
    // The run ended while the launch streamed: its last part is missing.
    let mut d = sample_with_parts();
    d.launches.pop();
    assert_eq!(Capture::from_reader(&bytes_of(&d)[..]).unwrap(), d);
}

#[test]
fn failed_write_leaves_the_old_file() {
    let dir = tempfile::tempdir().unwrap();
    let e = sample()
        .write(dir.path().join("missing/run.tgpu"))
        .unwrap_err();
    assert!(matches!(e, CaptureError::File { .. }), "{e}");
    // A directory in the way of the rename: the write fails, nothing is left.
    let target = dir.path().join("busy");
    fs::create_dir(&target).unwrap();
    fs::write(target.join("x"), b"x").unwrap();
    assert!(sample().write(&target).is_err());
    let names: Vec<_> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["busy"]);
}

#[test]
fn header_errors() {
    let good = bytes_of(&sample());
    let read = |b: &[u8]| Capture::from_reader(b).unwrap_err();
    assert!(matches!(
        read(b"PK\x03\x04 not ours"),
        CaptureError::BadMagic { .. }
    ));
    assert!(matches!(read(b"TGPU"), CaptureError::Truncated { .. }));
    assert!(matches!(read(&good[..15]), CaptureError::Truncated { .. }));
    for bad in [0, CAPTURE_VERSION + 1] {
        let mut v = good.clone();
        v[8..12].copy_from_slice(&bad.to_le_bytes());
        assert!(matches!(
            read(&v),
            CaptureError::UnsupportedVersion { found } if found == bad
        ));
    }
    let e = read(&good[..good.len() - 10]);
    assert!(
        matches!(
            e,
            CaptureError::Truncated { .. } | CaptureError::CorruptStream(_)
        ),
        "{e}"
    );
    let mut v = good.clone();
    let mid = v.len() / 2;
    v[mid] ^= 0x55;
    let e = read(&v);
    assert!(
        matches!(
            e,
            CaptureError::CorruptStream(_)
                | CaptureError::Truncated { .. }
                | CaptureError::Corrupt { .. }
        ),
        "{e}"
    );
    let mut v = good.clone();
    v.push(0);
    assert!(matches!(
        read(&v),
        CaptureError::Corrupt {
            what: "bytes after the compressed body",
            ..
        }
    ));
    let mut v = good.clone();
    v[12] += 1; // body length one more than the body
    assert!(matches!(read(&v), CaptureError::Truncated { .. }));
    let mut v = good;
    v[12] -= 1;
    assert!(matches!(
        read(&v),
        CaptureError::Corrupt {
            what: "body longer than its declared length",
            ..
        }
    ));
}

#[test]
fn body_errors() {
    let d = sample();
    let body = d.encode_body().unwrap();
    let read = |b: &[u8]| Capture::from_reader(&wrap(b)[..]).unwrap_err();
    // A broken trace buffer names its launch: break the second buffer's version.
    let second = body
        .windows(4)
        .enumerate()
        .filter(|(_, w)| w == b"TGPU")
        .nth(1)
        .unwrap()
        .0;
    let mut b = body.clone();
    b[second + 4] = 9;
    match read(&b) {
        CaptureError::Decode { launch: 1, source } => {
            assert_eq!(source, DecodeError::UnsupportedVersion { found: 9 })
        }
        e => panic!("{e}"),
    }
    let mut b = body.clone();
    b.push(0);
    assert!(matches!(
        read(&b),
        CaptureError::Corrupt {
            what: "bytes after the last section",
            ..
        }
    ));
    assert!(matches!(
        read(&body[..body.len() - 1]),
        CaptureError::Truncated { .. }
    ));
    // metadata count 0xFFFFFFFF: refused before allocating.
    let mut b = body.clone();
    b[..4].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(read(&b), CaptureError::Corrupt { offset: 0, .. }));
    // Bad UTF-8 in the first metadata key ("tool", after two u32s).
    let mut b = body.clone();
    b[8] = 0xFF;
    assert!(matches!(
        read(&b),
        CaptureError::Corrupt {
            offset: 8,
            what: "string is not UTF-8"
        }
    ));
}

#[test]
fn consistency_errors() {
    let check = |d: Capture, want: fn(&CaptureError) -> bool| {
        let e = d.validate().unwrap_err();
        assert!(want(&e), "{e}");
        let e = Capture::from_reader(&bytes_of(&d)[..]).unwrap_err();
        assert!(want(&e), "{e}");
    };
    let mut d = sample();
    d.devices[1].info.ordinal = 0;
    check(d, |e| {
        matches!(e, CaptureError::DuplicateDevice { ordinal: 0 })
    });
    let mut d = sample();
    d.launches[1].device = 5;
    check(d, |e| {
        matches!(
            e,
            CaptureError::UnknownDevice {
                launch: 1,
                ordinal: 5
            }
        )
    });
    let mut d = sample();
    d.launches[0].launch_id = 9;
    check(d, |e| {
        matches!(
            e,
            CaptureError::LaunchMismatch {
                launch: 0,
                field: "launch_id"
            }
        )
    });
    let mut d = sample();
    d.launches[1].grid = [1, 2, 1];
    check(d, |e| {
        matches!(
            e,
            CaptureError::LaunchMismatch {
                launch: 1,
                field: "grid"
            }
        )
    });
    let mut d = sample();
    d.launches[1].launch_id = 1;
    d.launches[1].buffer = capture(1, [2, 1, 1], [64, 1, 1]);
    check(d.clone(), |e| {
        matches!(e, CaptureError::DuplicateLaunch { launch_id: 1 })
    });
    let e = streamed(&bytes_of(&d)).unwrap_err();
    assert!(
        matches!(e, CaptureError::DuplicateLaunch { launch_id: 1 }),
        "{e}"
    );
    let mut d = sample();
    d.host_spans[0].parent = Some(1);
    check(d, |e| matches!(e, CaptureError::BadSpan { span: 0, .. }));
    let mut d = sample();
    d.host_spans[1].end_ns = 3_999;
    check(d, |e| {
        matches!(
            e,
            CaptureError::BadSpan {
                span: 1,
                what: "ends before it starts"
            }
        )
    });
}

#[test]
fn batches_replay_every_launch() {
    let d = sample();
    // Round 1 of each device has no samples: it cannot fit.
    let e = d.batches().unwrap_err();
    assert!(
        matches!(
            e,
            CaptureError::Clock {
                device: 0,
                round: 1,
                source: ClockError::NotEnoughSamples { .. }
            }
        ),
        "{e}"
    );
    let mut d = sample();
    for dev in &mut d.devices {
        dev.calibrations.truncate(1);
    }
    let batches = d.batches().unwrap();
    assert_eq!(batches.len(), 2);
    for (b, l) in batches.iter().zip(&d.launches) {
        assert_eq!(b.device.ordinal, l.device);
        assert_eq!(b.launch.launch_id, l.launch_id);
        assert!(Arc::ptr_eq(&b.buffer, &l.buffer));
        assert!(Arc::ptr_eq(&b.registry, &batches[0].registry));
        assert_eq!(b.registry.name(1), Some("mma"));
        // Samples map device 1_000_000 + i·1000 to host 5_000 + i·1000 (+350 mid round trip).
        let host = b
            .calibration
            .to_host(crate::clock::HostClock::Boottime, 1_003_000);
        assert!(host.abs_diff(8_350) <= 400, "{host}");
    }
    d.devices[1].calibrations.clear();
    assert!(matches!(
        d.batches().unwrap_err(),
        CaptureError::NoCalibration {
            launch: 1,
            device: 1
        }
    ));
}

#[test]
fn the_reader_streams_what_read_reads() {
    let mut d = sample();
    for dev in &mut d.devices {
        dev.calibrations.truncate(1);
    }
    let bytes = bytes_of(&d);
    let mut reader = CaptureReader::new(Cursor::new(&bytes)).unwrap();
    assert_eq!(reader.launch_count(), 2);
    let mut head = d.clone();
    head.launches.clear();
    assert_eq!(reader.head(), &head);
    // Each iteration reads the launches again.
    for _ in 0..2 {
        let launches: Vec<_> = reader.launches().unwrap().map(Result::unwrap).collect();
        assert_eq!(launches, d.launches);
    }
    let whole = d.batches().unwrap();
    let batches = reader.batches().unwrap();
    assert_eq!(batches.head(), &head);
    let streamed: Vec<_> = batches.map(Result::unwrap).collect();
    assert_eq!(streamed.len(), whole.len());
    for (s, w) in streamed.iter().zip(&whole) {
        assert_eq!(
            (&s.device, &s.launch.kernel, &s.buffer, &s.registry),
            (&w.device, &w.launch.kernel, &w.buffer, &w.registry)
        );
        let at = |b: &Batch| {
            b.calibration
                .to_host(crate::clock::HostClock::Boottime, 1_003_000)
        };
        assert_eq!(at(s), at(w));
    }
    assert!(Arc::ptr_eq(&streamed[0].registry, &streamed[1].registry));
    // A capture further into a stream is read from where the stream stands.
    let mut v = b"junk".to_vec();
    v.extend_from_slice(&bytes);
    let mut at4 = Cursor::new(v);
    at4.set_position(4);
    let mut reader = CaptureReader::new(at4).unwrap();
    assert_eq!(reader.launches().unwrap().count(), 2);
    // The shipped version 1 capture, both ways.
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("captures/h200-quickstart.tgpu");
    let whole = Capture::read(&path).unwrap();
    let mut reader = CaptureReader::open(&path).unwrap();
    let mut c = reader.head().clone();
    c.launches = reader.launches().unwrap().map(Result::unwrap).collect();
    assert_eq!(c, whole);
}

#[test]
fn the_reader_stops_at_a_bad_launch() {
    // A device without calibration: its launch is an error, and the last item.
    let mut d = sample();
    d.devices[0].calibrations.truncate(1);
    d.devices[1].calibrations.clear();
    let bytes = bytes_of(&d);
    let mut reader = CaptureReader::new(Cursor::new(&bytes)).unwrap();
    let got: Vec<_> = reader.batches().unwrap().collect();
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].as_ref().unwrap().launch.launch_id, 1);
    assert!(matches!(
        got[1],
        Err(CaptureError::NoCalibration {
            launch: 1,
            device: 1
        })
    ));
    // A trace buffer that does not decode: opening passes over it; reading the
    // launches meets it, and stops there.
    let mut body = sample().encode_body().unwrap();
    let second = body
        .windows(4)
        .enumerate()
        .filter(|(_, w)| w == b"TGPU")
        .nth(1)
        .unwrap()
        .0;
    body[second + 4] = 9;
    let mut reader = CaptureReader::new(Cursor::new(wrap(&body))).unwrap();
    let got: Vec<_> = reader.launches().unwrap().collect();
    assert_eq!(got.len(), 2);
    assert!(got[0].is_ok());
    assert!(
        matches!(got[1], Err(CaptureError::Decode { launch: 1, .. })),
        "{:?}",
        got[1]
    );
}

/// A body of metadata `pairs`, then no devices, events, launches or spans.
fn metadata_body(pairs: usize, key: &[u8], value: &[u8]) -> Vec<u8> {
    let mut body = (pairs as u32).to_le_bytes().to_vec();
    let mut pair = (key.len() as u32).to_le_bytes().to_vec();
    pair.extend_from_slice(key);
    pair.extend_from_slice(&(value.len() as u32).to_le_bytes());
    pair.extend_from_slice(value);
    body.extend_from_slice(&pair.repeat(pairs));
    body.extend_from_slice(&[0; 16]);
    body
}

#[test]
fn what_a_reader_keeps_is_bounded() {
    let over = |file: &[u8], at: usize| {
        for e in [
            Capture::from_reader(file).unwrap_err(),
            streamed(file).unwrap_err(),
        ] {
            assert!(
                matches!(e, CaptureError::OverLimit { offset, limit } if offset == at && limit == CAPTURE_MEMORY_LIMIT),
                "{e}"
            );
        }
    };
    let pair = size_of::<(String, String)>();
    // 6 M empty pairs: 48 MB of body in a file of 50 KB, 288 MB as pairs of
    // strings. Refused at their count, before any is read.
    let n = 6_000_000;
    assert!(n * pair > CAPTURE_MEMORY_LIMIT);
    let file = wrap(&metadata_body(n, b"", b""));
    assert!(file.len() < 100_000, "{}", file.len());
    over(&file, 0);
    // Fewer pairs fit, but leave no room for an 8 MB key: refused at the
    // key's length, before its bytes are read. Counts and strings add up.
    let n = CAPTURE_MEMORY_LIMIT / pair - 1000;
    let mut body = metadata_body(1, &vec![b'k'; 8 << 20], b"");
    body[..4].copy_from_slice(&(n as u32).to_le_bytes());
    body.resize(body.len() + n * 8, 0);
    over(&wrap(&body), 4);
    // The same key alone reads.
    let c = Capture::from_reader(&wrap(&metadata_body(1, &vec![b'k'; 8 << 20], b""))[..]).unwrap();
    assert_eq!(c.metadata[0].0.len(), 8 << 20);
}

/// [`sample`] with launch 1's trace buffer replaced by `buffer` (the same
/// launch id, grid and block): the capture's file.
fn with_buffer(buffer: &[u8]) -> Vec<u8> {
    let d = sample();
    let mut body = d.encode_body().unwrap();
    let wire = d.launches[0].buffer.wire();
    let at = body
        .windows(wire.len())
        .position(|w| w == &wire[..])
        .unwrap();
    let mut new = body[..at - 8].to_vec();
    new.extend_from_slice(&(buffer.len() as u64).to_le_bytes());
    new.extend_from_slice(buffer);
    new.extend_from_slice(&body.split_off(at + wire.len()));
    wrap(&new)
}

#[test]
fn a_trace_buffer_costs_what_its_slots_hold() {
    // Launch 1 (grid 1, block 128: 4 warps) declares 4096 slots of 256 records:
    // 17 MB of slots, of which the first 4 are flushed. Read, it keeps the 4
    // slots' records, not the declared room (tests/capture_bounds.rs reads a
    // gigabyte of it from the CLI).
    let mut b = BufferBuilder::new([1, 1, 1], [128, 1, 1], 256);
    b.launch_id(1).slot_count(4096);
    for warp in 0..4 {
        b.warp(0, warp)
            .unwrap()
            .range(0, 1_000, 1_100 + u64::from(warp), 7);
    }
    let mut wire = b.finish();
    // The builder cuts nothing: bytes past the flushed slots are the empty ones.
    assert_eq!(wire.len(), 64 + 4096 * (64 + 256 * 16));
    let kept = |file: &[u8]| {
        let c = Capture::from_reader(file).unwrap();
        assert_eq!(c, streamed(file).unwrap());
        let buffer = c.launches[0].buffer.clone();
        assert_eq!(buffer.event_count(), 4);
        assert_eq!(buffer.view().slots().len(), 4);
        assert_eq!(&buffer.wire()[..], &wire[..], "written back as it was");
        buffer.bytes().len()
    };
    assert_eq!(kept(&with_buffer(&wire)), 64 + 4 * (64 + 16));
    // An empty slot with a byte in it is refused where the decoder refuses it.
    let at = 64 + 1000 * (64 + 256 * 16) + 64 + 5 * 16 + 3;
    wire[at] = 1;
    let want = OwnedBuffer::decode(wire.clone(), None).unwrap_err();
    assert_eq!(
        want,
        DecodeError::UnflushedSlotNotEmpty {
            slot: 1000,
            offset: 64 + 5 * 16
        }
    );
    for e in [
        Capture::from_reader(&with_buffer(&wire)[..]).unwrap_err(),
        streamed(&with_buffer(&wire)).unwrap_err(),
    ] {
        assert!(
            matches!(&e, CaptureError::Decode { launch: 0, source } if *source == want),
            "{e}"
        );
    }
}

#[test]
fn long_names_are_refused_before_they_are_read() {
    let long = "k".repeat(MAX_NAME_LEN + 1);
    let mut d = sample();
    d.launches[1].kernel = long.clone();
    let mut d2 = sample();
    d2.launches[0].host_thread = long.clone();
    let mut d3 = sample();
    d3.host_spans[1].thread_name = long.clone();
    let mut d4 = sample();
    d4.registry.register(9, &long).unwrap();
    for (d, what) in [
        (d, "kernel name"),
        (d2, "thread name"),
        (d3, "thread name"),
        (d4, "event name"),
    ] {
        let file = bytes_of(&d);
        for e in [
            Capture::from_reader(&file[..]).unwrap_err(),
            streamed(&file).unwrap_err(),
        ] {
            assert!(
                matches!(e, CaptureError::LongName { what: w, len, .. } if w == what && len as usize == long.len()),
                "{e}"
            );
            assert!(
                e.to_string().contains(&format!(
                    "a {what} of 4097 bytes (a name has at most 4096 bytes)"
                )),
                "{e}"
            );
        }
    }
    // At the bound, a name reads.
    let mut d = sample();
    d.launches[1].kernel = "k".repeat(MAX_NAME_LEN);
    assert_eq!(Capture::from_reader(&bytes_of(&d)[..]).unwrap(), d);
}

#[test]
fn launches_count_against_the_memory_limit() {
    // Two launches of packed buffers of 110 MB each: one at a time fits the
    // limit (the reader), both together (the whole capture) do not.
    use crate::format::PackedWriter;
    let mut d = sample_with_parts();
    let big = {
        let h = *d.launches[0].buffer.header();
        let mut w = PackedWriter::new(&h);
        let view = d.launches[0].buffer.view();
        let slot = view.slots().next().unwrap();
        let events: Vec<_> = (0..(110 << 20) / 24)
            .map(|_| slot.events().next().unwrap())
            .collect();
        let mut header = slot.header;
        header.record_count = events.len() as u32;
        w.slot(&header, &events);
        Arc::new(OwnedBuffer::decode(w.finish(), None).unwrap())
    };
    d.launches[0].buffer = big.clone();
    d.launches[1].buffer = big;
    let file = bytes_of(&d);
    assert!(file.len() < 2 << 20, "{}", file.len());
    assert!(matches!(
        Capture::from_reader(&file[..]).unwrap_err(),
        CaptureError::OverLimit { .. }
    ));
    let mut reader = CaptureReader::new(Cursor::new(&file)).unwrap();
    assert_eq!(reader.launches().unwrap().filter(Result::is_ok).count(), 4);
}

mod props {
    use super::*;
    use proptest::prelude::*;

    fn arb_dump() -> impl Strategy<Value = Capture> {
        let text = "[a-z\u{e9}\u{4e2d}]{0,6}";
        let span = (
            text,
            text,
            any::<u64>(),
            0u64..1000,
            0u64..1000,
            any::<Option<u64>>(),
            prop::collection::vec((text, text), 0..3),
        );
        (
            prop::collection::vec((text, text), 0..3),
            0usize..3,
            prop::collection::vec((any::<u64>(), any::<u64>(), any::<u64>()), 0..5),
            prop::collection::vec(
                (
                    any::<u16>(),
                    text,
                    prop::option::of(text),
                    prop::option::of(text),
                ),
                0..5,
            ),
            0usize..3,
            prop::collection::vec(span, 0..4),
        )
            .prop_map(|(metadata, ndev, samples, reg, nlaunch, spans)| {
                let samples: Vec<Sample> = samples
                    .into_iter()
                    .map(|(a, b, c)| Sample {
                        host_before: a,
                        device: b,
                        host_after: c,
                    })
                    .collect();
                let devices: Vec<CaptureDevice> = (0..ndev as u32)
                    .map(|o| CaptureDevice {
                        info: DeviceInfo {
                            ordinal: o * 3,
                            ..DeviceInfo::default()
                        },
                        calibrations: vec![CalibrationRound {
                            samples: samples.clone(),
                            ..Default::default()
                        }],
                    })
                    .collect();
                let mut registry = EventRegistry::new();
                for (id, name, cat, payload) in reg {
                    let _ = registry.register_with(id, &name, cat.as_deref(), None);
                    if let Some(p) = payload {
                        let _ = registry.declare_payload(id, &p);
                    }
                }
                let launches = if devices.is_empty() { 0 } else { nlaunch };
                let launches = (0..launches as u64)
                    .map(|i| CaptureLaunch {
                        device: 0,
                        launch_id: i,
                        kernel: format!("k{i}"),
                        host_launch_ns: i,
                        host_complete_ns: i + 1,
                        grid: [1, 1, 1],
                        block: [32 * (i as u32 + 1), 1, 1],
                        host_thread: String::new(),
                        part: None,
                        buffer: capture(i, [1, 1, 1], [32 * (i as u32 + 1), 1, 1]),
                    })
                    .collect();
                let host_spans = spans
                    .into_iter()
                    .enumerate()
                    .map(
                        |(i, (name, target, tid, start, len, launch_id, fields))| HostSpan {
                            name,
                            target,
                            thread_name: "t".into(),
                            thread_id: tid,
                            start_ns: start,
                            end_ns: start + len,
                            parent: i.checked_sub(1).map(|p| p as u32),
                            launch_id,
                            fields,
                        },
                    )
                    .collect();
                Capture {
                    metadata,
                    devices,
                    registry,
                    launches,
                    host_spans,
                }
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        #[test]
        fn dumps_round_trip(d in arb_dump()) {
            d.validate().unwrap();
            let bytes = bytes_of(&d);
            prop_assert_eq!(&streamed(&bytes).unwrap(), &d);
            prop_assert_eq!(Capture::from_reader(&bytes[..]).unwrap(), d);
        }

        #[test]
        fn mutated_dumps_never_panic(
            d in arb_dump(),
            body_edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
            file_edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..3),
            cut in prop::option::weighted(0.2, any::<prop::sample::Index>()),
        ) {
            // Edits of the body reach the parser; edits of the file, the inflater.
            let mut body = d.encode_body().unwrap();
            if !body.is_empty() {
                for (at, x) in &body_edits {
                    let i = at.index(body.len());
                    body[i] ^= x;
                }
            }
            same_both_ways(&wrap(&body))?;
            let mut file = bytes_of(&d);
            for (at, x) in &file_edits {
                let i = at.index(file.len());
                file[i] ^= x;
            }
            if let Some(c) = cut {
                file.truncate(c.index(file.len() + 1));
            }
            same_both_ways(&file)?;
        }
    }

    /// Launch 1's trace buffer of [`sample`] (grid 1, block 128), its four warps
    /// flushed as `v2` says (a v2 slot, a v1 slot, or none), in `extra` more
    /// slots than the grid has.
    fn launch_1_buffer(v2: &[Option<bool>], extra: u32) -> Vec<u8> {
        let mut b = BufferBuilder::new([1, 1, 1], [128, 1, 1], 4);
        b.launch_id(1).slot_count(4 + extra);
        for (warp, v2) in v2.iter().enumerate() {
            let t = 1_000 + warp as u64;
            match v2 {
                Some(true) => {
                    let w = b.warp_v2(0, warp as u32).unwrap();
                    w.begin(1, t).switch(2, t + 5).payload(9).end(2, t + 9);
                }
                Some(false) => {
                    b.warp(0, warp as u32).unwrap().range(0, t, t + 7, 3);
                }
                None => {}
            }
        }
        b.finish()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// A trace buffer read from a capture, slot by slot, is what the
        /// decoder makes of the same bytes: the same slots, or the same error.
        #[test]
        fn trace_buffers_read_as_they_decode(
            v2 in prop::collection::vec(prop::option::of(any::<bool>()), 4),
            extra in 0u32..3,
            edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..3),
            cut in prop::option::weighted(0.1, any::<prop::sample::Index>()),
        ) {
            let mut wire = launch_1_buffer(&v2, extra);
            for (at, x) in &edits {
                let i = at.index(wire.len());
                wire[i] ^= x;
            }
            if let Some(c) = cut {
                wire.truncate(c.index(wire.len() + 1));
            }
            let file = with_buffer(&wire);
            let read = Capture::from_reader(&file[..]);
            same_both_ways(&file)?;
            match (OwnedBuffer::decode(wire, None), read) {
                (Ok(want), Ok(c)) => prop_assert_eq!(&*c.launches[0].buffer, &want),
                (Err(want), Err(CaptureError::Decode { launch: 0, source })) => {
                    prop_assert_eq!(source, want)
                }
                // A header edit the decoder takes, which the launch then refuses.
                (Ok(_), Err(CaptureError::LaunchMismatch { launch: 0, .. })) => {}
                (want, got) => prop_assert!(false, "decoded: {:?}, read: {:?}", want.err(), got.err()),
            }
        }
    }

    /// Never a panic, and the whole and the streaming reader accept the same
    /// files, with the same contents.
    fn same_both_ways(file: &[u8]) -> Result<(), TestCaseError> {
        match (Capture::from_reader(file), streamed(file)) {
            (Ok(a), Ok(b)) => prop_assert_eq!(a, b),
            (Err(_), Err(_)) => {}
            (a, b) => prop_assert!(false, "read: {:?}, streamed: {:?}", a.err(), b.err()),
        }
        Ok(())
    }
}

#[test]
fn a_source_is_spooled_whole_up_to_its_limit_and_refused_past_it() {
    let mut source = tempfile::tempfile().unwrap();
    source.write_all(b"0123456789").unwrap();
    for (limit, whole) in [(10, true), (9, false)] {
        let mut s = source.try_clone().unwrap();
        std::io::Seek::seek(&mut s, std::io::SeekFrom::Start(0)).unwrap();
        match reader::spool(s, limit) {
            Ok(mut spooled) => {
                assert!(whole, "limit {limit}: spooled past it");
                let mut bytes = Vec::new();
                std::io::Read::read_to_end(&mut spooled, &mut bytes).unwrap();
                assert_eq!(bytes, b"0123456789");
            }
            Err(e) => {
                assert!(!whole, "limit {limit}: {e}");
                assert!(e.to_string().contains("write it to a file"), "{e}");
            }
        }
    }
}

#[test]
fn a_sampled_launch_round_trips_and_says_what_it_sampled() {
    // Warps 1 and 3 of every other block from block 1: blocks 1 and 3 of 4.
    let sampling = crate::format::Sampling::default()
        .warps(0b1010)
        .blocks(2, 1)
        .launches(5);
    let mut b = BufferBuilder::new([4, 1, 1], [128, 1, 1], 16);
    b.launch_id(2).sampling(sampling);
    assert_eq!(b.header().slot_count, 4);
    for (block, warp) in [(1, 1), (3, 3)] {
        b.warp(block, warp)
            .unwrap()
            .range(1, 1_000_000, 1_000_500, block * 4 + warp);
    }
    let mut d = sample();
    d.launches[1].grid = [4, 1, 1];
    d.launches[1].block = [128, 1, 1];
    d.launches[1].buffer = Arc::new(OwnedBuffer::decode(b.finish(), None).unwrap());
    let bytes = bytes_of(&d);
    assert_eq!(bytes[8..12], 4u32.to_le_bytes());
    for c in [
        Capture::from_reader(&bytes[..]).unwrap(),
        streamed(&bytes).unwrap(),
    ] {
        assert_eq!(c, d);
        let buffer = c.launches[1].buffer.view();
        assert_eq!(buffer.header().sampling, sampling);
        let placed: Vec<_> = buffer
            .slots()
            .map(|s| (s.index, s.header.block_linear, s.header.warp))
            .collect();
        assert_eq!(placed, [(0, 1, 1), (3, 3, 3)]);
    }
}

/// The issue's pipeline (`watch::tests::pipeline`: 7 warps waiting, a producer stuck in
/// load, a block done, one never started), with a name to escape and a warp whose
/// stamp is after `now` (the host maps "now" from its latest checkpoint).
fn watched() -> crate::watch::Snapshot {
    use crate::watch::tests::{pipeline, snapshot};
    let mut s = snapshot(&pipeline(), 16, 4, 4_000_000_100);
    s.kernel = "pipeline<\\n>\nsecond line\r".into();
    if let crate::watch::State::Running { last_entry_ns, .. } = &mut s.warps[0].state {
        *last_entry_ns = Some(s.now_ns + 5);
    }
    s
}

#[test]
fn a_snapshot_round_trips_with_every_warp() {
    let registry = crate::watch::tests::registry();
    let first = watched();
    let mut second = watched();
    second.index = 1;
    second.now_ns += 1_000_000_000;
    second.running_ns += 1_000_000_000;
    let mut d = sample();
    d.registry = registry.clone();
    d.push_snapshot(KeptSnapshot::new(&first, "the text as logged"));
    d.push_snapshot(KeptSnapshot::new(&second, "the second text as logged"));
    // A capture from before the warps were kept: its text only.
    d.metadata
        .push((snapshot::text_key(9, 0), "an older snapshot".into()));
    d.validate().unwrap();
    for back in [
        Capture::from_reader(&bytes_of(&d)[..]).unwrap(),
        streamed(&bytes_of(&d)).unwrap(),
    ] {
        assert_eq!(back.metadata, d.metadata);
        let kept: Vec<_> = back
            .kept_snapshots()
            .map(|(note, id)| (id, back.kept_snapshot(note).unwrap()))
            .collect();
        assert_eq!(kept, [(7, first.clone()), (7, second.clone())]);
        // Told again from the warps: the live run's text, exactly.
        let told: Vec<_> = back
            .snapshots()
            .map(|(id, n, t)| (id, n, t.into_owned()))
            .collect();
        assert_eq!(
            told,
            [
                (7, 0, first.text(&registry)),
                (7, 1, second.text(&registry)),
                (9, 0, "an older snapshot".into())
            ]
        );
    }
    let (_, value) = snapshot::warps_note(&first);
    // Runs of warps not started are one line: 8 running, 4 done, 4 not started.
    assert_eq!(value.lines().count(), 3 + 8 + 4 + 1, "{value}");
    assert!(
        value.contains("\nkernel pipeline<\\\\n>\\nsecond line\\r\n"),
        "{value}"
    );
    assert!(value.ends_with("\n- 4\n"), "{value}");
}

/// A warps note changed by `edit`, read back: the error, by both readers and `validate`.
fn bad_note(edit: impl Fn(&mut Vec<(String, String)>)) -> CaptureError {
    let mut d = sample();
    d.push_snapshot(KeptSnapshot::new(&watched(), "text"));
    edit(&mut d.metadata);
    let e = d.validate().unwrap_err();
    let bytes = bytes_of(&d);
    let again = Capture::from_reader(&bytes[..]).unwrap_err();
    assert_eq!(again.to_string(), e.to_string());
    assert_eq!(streamed(&bytes).unwrap_err().to_string(), e.to_string());
    e
}

#[test]
fn a_malformed_snapshot_is_refused_with_its_line() {
    // The warps note is the metadata's last; its value's lines from 1.
    let note = sample().metadata.len() + 1;
    let value = |f: fn(&str) -> String| {
        move |m: &mut Vec<(String, String)>| {
            let v = &mut m.last_mut().unwrap().1;
            *v = f(v);
        }
    };
    type Edit = Box<dyn Fn(&mut Vec<(String, String)>)>;
    let cases: Vec<(Edit, usize, &str)> = vec![
        (
            Box::new(value(|v| v.replacen("tgpu-watch 1", "tgpu-watch 2", 1))),
            1,
            "not a snapshot of this format",
        ),
        (
            Box::new(value(|v| v.trim_end().to_string())),
            0,
            "does not end with a line break",
        ),
        (
            Box::new(value(|v| v.replacen(" warps 16", "", 1))),
            2,
            "the line ends too soon",
        ),
        (
            Box::new(value(|v| v.replacen(" warps 16", " warps 16 x", 1))),
            2,
            "more fields than the line takes",
        ),
        (
            Box::new(value(|v| v.replacen("grid 4", "grid +4", 1))),
            2,
            "not a number in range",
        ),
        (
            Box::new(value(|v| {
                v.replacen("warps_per_block 4", "warps_per_block 0", 1)
            })),
            2,
            "no warps per block",
        ),
        (
            Box::new(value(|v| v.replacen(" warps 16", " warps 17", 1))),
            0,
            "fewer warps than the launch line says",
        ),
        (
            Box::new(value(|v| v.replacen(" warps 16", " warps 15", 1))),
            16,
            "a run of warps not started out of range",
        ),
        (
            Box::new(value(|v| format!("{v}d 1 5\n"))),
            17,
            "more warps than the launch line says",
        ),
        (
            Box::new(value(|v| v.replacen(" warps 16", " warps 2000000", 1))),
            2,
            "more warps than a reader takes",
        ),
        (
            Box::new(value(|v| v.replacen("kernel ", "kernel x\\t", 1))),
            3,
            "not a kernel name",
        ),
        (
            Box::new(value(|v| v.replacen("\nr 0 ", "\nq 0 ", 1))),
            4,
            "not a warp",
        ),
        (
            Box::new(value(|v| v.replacen("\nr 0 ", "\nr 0  ", 1))),
            4,
            "not a time in range",
        ),
        (
            Box::new(value(|v| {
                v.replacen("\nr 0 -", "\nr 0 -99999999999999999999", 1)
            })),
            4,
            "not a time in range",
        ),
        (
            Box::new(value(|v| v.replacen(" 1:17", " 1:x", 1))),
            4,
            "not a closed event",
        ),
        (
            Box::new(value(|v| v.replacen(" 3@", " 3#", 1))),
            4,
            "not an open range",
        ),
        (
            Box::new(value(|v| {
                let line = v.lines().nth(3).unwrap();
                v.replacen(line, &format!("{line}{}", " 2@0".repeat(33)), 1)
            })),
            4,
            "more open ranges than a warp has",
        ),
        (
            Box::new(value(|v| v.replacen("\n- 4\n", "\n- 0\n- 4\n", 1))),
            16,
            "a run of warps not started out of range",
        ),
        (
            Box::new(|m: &mut Vec<(String, String)>| m.last_mut().unwrap().0 += "x"),
            0,
            "its key is not",
        ),
        (
            Box::new(|m: &mut Vec<(String, String)>| {
                let n = m.len();
                m.swap(n - 1, n - 2);
            }),
            0,
            "does not follow its snapshot's text note",
        ),
        (
            Box::new(|m: &mut Vec<(String, String)>| {
                let n = m.len();
                m[n - 2].0 = snapshot::text_key(8, 0);
                m[n - 1].0 = "watchdog-warps 8.0".into();
            }),
            2,
            "its launch or snapshot number is not its key's",
        ),
    ];
    for (edit, line, what) in cases {
        let e = bad_note(edit);
        let at = |n| match e {
            CaptureError::BadSnapshot {
                note,
                line: l,
                what: w,
            } => note == n && l == line && w.contains(what),
            _ => false,
        };
        // The note that does not follow its text is the one before the last.
        assert!(at(note) || at(note - 1), "{what:?}, line {line}: {e}");
    }
}

#[test]
fn the_warps_a_capture_keeps_are_bounded() {
    // Notes of the most warps a snapshot may hold, each a line: up to the capture's
    // bound they read, past it they are refused; a writer past it keeps the text only.
    let per = snapshot::MAX_SNAPSHOT_WARPS;
    let notes = snapshot::MAX_CAPTURE_SNAPSHOT_WARPS / per;
    let note = |i: usize| {
        let key = format!("watchdog-warps 5.{i}");
        let value = format!("tgpu-watch 1\nlaunch 5 snapshot {i} grid {per} 1 1 warps_per_block 1 now_ns 9 running_ns 9 warps {per}\nkernel k\n- {per}\n");
        [
            (snapshot::text_key(5, i as u32), "text".to_string()),
            (key, value),
        ]
    };
    let mut d = sample();
    d.metadata.extend((0..notes).flat_map(note));
    let back = Capture::from_reader(&bytes_of(&d)[..]).unwrap();
    assert_eq!(back.kept_snapshots().count(), notes);
    let before = d.metadata.len();
    d.push_snapshot(KeptSnapshot::new(&watched(), "kept as text"));
    assert_eq!(d.metadata.len(), before + 1, "the text only");
    d.validate().unwrap();
    d.metadata.extend(note(notes));
    let e = Capture::from_reader(&bytes_of(&d)[..]).unwrap_err();
    assert!(
        matches!(e, CaptureError::BadSnapshot { what, .. } if what.contains("more warps than a reader takes")),
        "{e}"
    );
}
