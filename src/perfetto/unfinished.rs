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
