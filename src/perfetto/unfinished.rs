//! Launches still running: the latest watchdog snapshot of each
//! ([`crate::deliver::watched`]), kept until its last part arrives (then it is
//! dropped: the streamed ranges tell the rest, whole) or the trace ends (then
//! the launch's kernel slice and the ranges each warp had open at the snapshot
//! are written as slices that do not end: where each warp was stuck).

use std::collections::HashMap;
use std::sync::Arc;

use super::parts::MAX_ARRIVING;
use crate::deliver::watched::Watched;

/// The latest snapshot of each launch still running, at most [`MAX_ARRIVING`]
/// (past that, the one updated longest ago is forgotten).
#[derive(Debug, Default)]
pub(crate) struct Unfinished {
    by_launch: HashMap<u64, (Arc<Watched>, u64)>,
    taken: u64,
}

impl Unfinished {
    /// Keeps `w` as its launch's latest snapshot.
    pub(crate) fn keep(&mut self, w: Arc<Watched>) {
        self.taken += 1;
        let id = w.snapshot.launch_id;
        if !self.by_launch.contains_key(&id) && self.by_launch.len() >= MAX_ARRIVING {
            let stalest = self.by_launch.iter().min_by_key(|(_, (_, t))| *t);
            if let Some(&old) = stalest.map(|(id, _)| id) {
                self.by_launch.remove(&old);
            }
        }
        self.by_launch.insert(id, (w, self.taken));
    }

    /// Launch `launch_id` has finished: its snapshot is of no more use.
    pub(crate) fn finished(&mut self, launch_id: u64) {
        // Every batch asks: nearly always there is no snapshot to drop.
        if !self.by_launch.is_empty() {
            self.by_launch.remove(&launch_id);
        }
    }

    /// The launches still running, by launch id, with their latest snapshots.
    pub(crate) fn take(&mut self) -> Vec<Arc<Watched>> {
        let mut all: Vec<Arc<Watched>> = self.by_launch.drain().map(|(_, (w, _))| w).collect();
        all.sort_by_key(|w| w.snapshot.launch_id);
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::DeviceInfo;
    use crate::clock::ClockMap;
    use crate::perfetto::TraceWriter;
    use crate::registry::EventRegistry;
    use crate::watch::tests::{Board, WarpSim};
    use crate::watch::{Cells, Snapshot};

    /// Launch `launch_id`'s snapshot `index`: 2 blocks of 2 warps, 3 of them in
    /// `mma > load` since 1,100 and 1,200 + their slot, the last never started.
    fn watched(launch_id: u64, index: u32) -> Arc<Watched> {
        let mut b = Board::new(4);
        let mut st = b.store();
        for slot in 0..3 {
            let mut w = WarpSim::start(0, slot, 7 + slot / 2, 1_000, &mut st);
            w.begin(2, 1_100, &mut st);
            w.begin(1, 1_200 + u64::from(slot), &mut st);
        }
        drop(st);
        let registry = Arc::new(EventRegistry::from_pairs([(1, "load"), (2, "mma")]).unwrap());
        let snapshot = Snapshot {
            launch_id,
            kernel: "hung".into(),
            grid: [2, 1, 1],
            warps_per_block: 2,
            now_ns: 5_000 + u64::from(index),
            running_ns: 4_500,
            index,
            warps: Cells { at: 0, slots: 4 }.read(&b.0[..]),
        };
        Arc::new(Watched {
            text: snapshot.text(&registry),
            snapshot,
            device: Arc::new(DeviceInfo::default()),
            clock: ClockMap::exact(0, 1_000_000, 0.0),
            registry,
        })
    }

    #[test]
    fn a_launch_hung_before_its_first_part_leaves_its_warps_open() {
        let mut w = TraceWriter::new(Vec::new()).unwrap();
        w.write_snapshot(watched(9, 0)).unwrap();
        w.write_snapshot(watched(9, 1)).unwrap();
        // Only the latest is left for the end.
        let left = w.write_unfinished().unwrap();
        assert_eq!(
            left.iter()
                .map(|x| (x.snapshot.launch_id, x.snapshot.index))
                .collect::<Vec<_>>(),
            [(9, 1)]
        );
        for x in &left {
            w.write_open(x).unwrap();
        }
        let (bytes, stats) = w.finish().unwrap();
        assert_eq!(stats.kernels, 1);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hung.perfetto-trace");
        std::fs::write(&path, bytes).unwrap();
        let out = dir.path().join("slices.json");
        let args = ["--allow-open-slices", "--slices-out", out.to_str().unwrap()];
        let Some(s) = crate::test_support::perfetto_check::check(&path, &args) else {
            return;
        };
        assert_eq!(
            (
                s["open_device_slices"],
                s["open_kernel_slices"],
                s["other_slices"]
            ),
            (6, 1, 2),
            "{s:?}"
        );
        let text = std::fs::read_to_string(&out).unwrap();
        // Warp 0 of block 1 (slot 2), on SM 8: its two ranges, from their since times
        // (device + 1 ms), never ended, on its first lane.
        for (name, at) in [("mma", 1_001_100), ("load", 1_001_202)] {
            let line = format!("[\"GPU 0/SMs/SM 8/block 1 warp 0\", \"{name}\", {at}, null, {{}}]");
            assert!(text.contains(&line), "no {line} in:\n{text}");
        }
        // The kernel, from its launch (the latest snapshot's now - running), never ended.
        assert!(text.contains("\"hung\", 1000501, null"), "{text}");
        // The instants: at the snapshots' times, on the GPU's watchdog track.
        assert!(
            text.contains("[\"GPU 0/watchdog\", \"watchdog snapshot 2 of hung\", 1005001, 1005001"),
            "{text}"
        );
    }

    #[test]
    fn launches_kept_are_bounded_and_dropped_when_they_finish() {
        let mut u = Unfinished::default();
        for id in 0..(MAX_ARRIVING as u64 + 5) {
            u.keep(watched(id, 0));
        }
        u.finished(MAX_ARRIVING as u64 + 4);
        let left = u.take();
        assert_eq!(left.len(), MAX_ARRIVING - 1);
        // The oldest went first.
        assert_eq!(left[0].snapshot.launch_id, 5);
        assert!(u.take().is_empty());
    }
}
