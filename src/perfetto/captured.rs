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
    use crate::clock::Checkpoint;

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
