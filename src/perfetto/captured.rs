//! A capture's watchdog snapshots (issue #32), drawn as a live run draws them
//! ([`super::TraceWriter::write_captured_batch`], `write_captured_end`). A snapshot
//! note does not name its GPU, nor hold a clock map: each snapshot of a launch is
//! written just before the launch's first record, with that record's GPU and
//! calibration, so that the launch's last part drops it as it does live
//! (`unfinished.rs`); the snapshots of a launch that left no record (it never finished)
//! go at the end, on the capture's first calibrated GPU. Each is read from its note only
//! when written: what stays in memory is the notes' places and, as live, the latest
//! snapshot of each launch still running.

use std::collections::HashMap;
use std::sync::Arc;

use crate::batch::DeviceInfo;
use crate::capture::Capture;
use crate::clock::{Calibration, ClockMap};
use crate::deliver::watched::Watched;
use crate::registry::EventRegistry;

/// The snapshots of a capture not written yet: launch id → the notes of its
/// snapshots, in the order taken.
#[derive(Debug)]
pub(crate) struct Captured {
    pending: HashMap<u64, Vec<usize>>,
}

impl Captured {
    /// Every snapshot whose warps `capture` keeps, none written yet.
    pub(crate) fn new(capture: &Capture) -> Captured {
        let mut pending: HashMap<u64, Vec<usize>> = HashMap::new();
        for (note, launch) in capture.kept_snapshots() {
            pending.entry(launch).or_default().push(note);
        }
        Captured { pending }
    }

    /// The notes of launch `launch_id`'s snapshots, if not taken before.
    pub(crate) fn take(&mut self, launch_id: u64) -> Vec<usize> {
        // Every record asks: nearly always there is nothing to take.
        match self.pending.is_empty() {
            true => Vec::new(),
            false => self.pending.remove(&launch_id).unwrap_or_default(),
        }
    }

    /// The notes of the snapshots not taken, in the order taken (that of the notes).
    pub(crate) fn rest(&mut self) -> Vec<usize> {
        let mut notes: Vec<usize> = self.pending.drain().flat_map(|(_, n)| n).collect();
        notes.sort_unstable();
        notes
    }
}

/// Snapshot note `note` of `capture` as the collector hands it on: told from its warps,
/// drawn on `device`, its times mapped by the checkpoint of `calibration` that was the
/// latest when it was taken. `None` if the note does not read (a capture that reads
/// has none such).
pub(crate) fn watched(
    capture: &Capture,
    note: usize,
    device: Arc<DeviceInfo>,
    calibration: &Calibration,
    registry: Arc<EventRegistry>,
) -> Option<Arc<Watched>> {
    let snapshot = capture.kept_snapshot(note)?;
    let clock = latest_at(calibration, snapshot.now_ns);
    Some(Arc::new(Watched {
        text: snapshot.text(&registry),
        snapshot,
        device,
        clock,
        registry,
    }))
}

/// The map of the last checkpoint taken at or before device time `device_ns` (the
/// first, if all came after): the one the collector would have had then.
fn latest_at(calibration: &Calibration, device_ns: u64) -> ClockMap {
    let cps = calibration.checkpoints();
    let before = cps.partition_point(|c| c.map.anchor().0 <= device_ns);
    cps[before.saturating_sub(1)].map.clone()
}

/// The GPU a snapshot with no launch record is drawn on, with its calibration: the
/// capture's first GPU with one.
pub(crate) fn first_gpu(capture: &Capture) -> Option<(Arc<DeviceInfo>, Calibration)> {
    let (ordinal, calibration) = capture.calibrations().ok()?.into_iter().next()?;
    let device = capture.devices.iter().find(|d| d.info.ordinal == ordinal)?;
    Some((Arc::new(device.info.clone()), calibration))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::Part;
    use crate::capture::{CalibrationRound, CaptureDevice, CaptureLaunch, KeptSnapshot};
    use crate::clock::{Checkpoint, Sample};
    use crate::decode::OwnedBuffer;
    use crate::format::BufferBuilder;
    use crate::perfetto::TraceWriter;
    use crate::watch::tests::{pipeline, registry, snapshot};

    const S: u64 = 1_000_000_000;

    /// Two GPUs whose clocks agree with the host's; launch 7's snapshot (the
    /// pipeline: 8 warps, each in 2 ranges), and, with `part`, launch 7's first part
    /// on GPU 1 (one range of block 0's first warp).
    fn hung(part: Option<Part>) -> Capture {
        let device = |ordinal| CaptureDevice {
            info: DeviceInfo {
                ordinal,
                name: "H".into(),
                ..DeviceInfo::default()
            },
            calibrations: vec![CalibrationRound {
                samples: (0..8u64)
                    .map(|i| {
                        let t = S + i * 10_000;
                        Sample {
                            host_before: t,
                            device: t + 500,
                            host_after: t + 1_000,
                        }
                    })
                    .collect(),
                ..CalibrationRound::default()
            }],
        };
        let mut capture = Capture {
            devices: vec![device(0), device(1)],
            registry: registry(),
            ..Capture::default()
        };
        let s = snapshot(&pipeline(), 16, 4, 4 * S + 100);
        capture.push_snapshot(KeptSnapshot::new(&s, "as logged"));
        if let Some(part) = part {
            let (grid, block) = ([4, 1, 1], [128, 1, 1]);
            let mut b = BufferBuilder::new(grid, block, 16);
            b.launch_id(7);
            b.warp(0, 0).unwrap().sm(0, 0).range(3, S + 5, S + 6, 0);
            capture.launches.push(CaptureLaunch {
                device: 1,
                launch_id: 7,
                kernel: "pipeline".into(),
                host_launch_ns: S,
                host_complete_ns: 2 * S,
                grid,
                block,
                host_thread: "main".into(),
                part: Some(part),
                buffer: Arc::new(OwnedBuffer::decode(b.finish(), None).unwrap()),
            });
        }
        capture
    }

    /// `capture` converted: its stats, and its slices as the checker lists them
    /// (`None`: the checker cannot run here).
    fn convert(capture: &Capture) -> (crate::perfetto::WriteStats, Option<String>) {
        let mut w = TraceWriter::new(Vec::new()).unwrap();
        for b in capture.batches().unwrap() {
            w.write_captured_batch(capture, &b).unwrap();
        }
        w.write_captured_end(capture).unwrap();
        let (bytes, stats) = w.finish().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.perfetto-trace");
        std::fs::write(&path, bytes).unwrap();
        let out = dir.path().join("slices.json");
        let args = ["--allow-open-slices", "--slices-out", out.to_str().unwrap()];
        let Some(s) = crate::test_support::perfetto_check::check(&path, &args) else {
            return (stats, None);
        };
        let open = (s["open_kernel_slices"], s["open_device_slices"]);
        let finished = capture
            .launches
            .iter()
            .any(|l| l.part.is_some_and(|p| p.last));
        let want = match finished {
            true => (0, 0),
            false => (1, 16),
        };
        assert_eq!(open, want, "{s:?}");
        (stats, Some(std::fs::read_to_string(&out).unwrap()))
    }

    #[test]
    fn a_launch_whose_last_part_never_came_is_left_open_on_its_gpu() {
        let (stats, text) = convert(&hung(Some(Part {
            index: 0,
            last: false,
        })));
        assert_eq!(stats.kernels, 1);
        if let Some(text) = text {
            // Drawn on GPU 1, that of its record, from its warps' start.
            assert!(text.contains("[\"GPU 1: H/watchdog\", \"watchdog snapshot 1 of pipeline\", 4000000100, 4000000100"), "{text}");
            assert!(
                text.contains("[\"GPU 1: H/kernels\", \"pipeline\", 1000000000, null"),
                "{text}"
            );
            assert!(!text.contains("GPU 0"), "{text}");
        }
        // Its last part came: the instant only, nothing left open.
        let (stats, text) = convert(&hung(Some(Part {
            index: 0,
            last: true,
        })));
        assert_eq!(stats.kernels, 1);
        if let Some(text) = text {
            assert!(text.contains("\"GPU 1: H/watchdog\""), "{text}");
            assert!(!text.contains("null"), "{text}");
        }
        // No record at all: on the capture's first GPU.
        let (stats, text) = convert(&hung(None));
        assert_eq!(stats.kernels, 1);
        if let Some(text) = text {
            assert!(
                text.contains("[\"GPU 0: H/kernels\", \"pipeline\", 1000000000, null"),
                "{text}"
            );
            assert!(!text.contains("GPU 1"), "{text}");
        }
    }

    #[test]
    fn a_snapshot_maps_by_the_checkpoint_latest_when_taken() {
        let mut cal = Calibration::exact(1_000, 10_000, 0.0);
        cal.push(Checkpoint::now(ClockMap::exact(5_000, 14_100, 0.0)))
            .unwrap();
        // Before any checkpoint: the first; between: the earlier; after: the latest.
        assert_eq!(latest_at(&cal, 500).to_host(500), 9_500);
        assert_eq!(latest_at(&cal, 4_999).to_host(4_999), 13_999);
        assert_eq!(latest_at(&cal, 6_000).to_host(6_000), 15_100);
    }
}
