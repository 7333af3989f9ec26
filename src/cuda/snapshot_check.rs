//! A watchdog's snapshot as a device test holds it: taken from its event, checked
//! against the batches the launch delivered afterwards ([`crate::watch::disagreements`]).
//! Not public API: `tests/gpu_live.rs` reaches it through `cuda::__private`.

use std::sync::Arc;

use crate::batch::Batch;
use crate::deliver::watched::{self, Watched};
use crate::format::Event;

/// A watchdog's snapshot, whole.
#[derive(Debug, Clone)]
pub struct WatchdogSnapshot(Arc<Watched>);

impl WatchdogSnapshot {
    /// The snapshot that `event` tells, in a layer's `on_event` (a watchdog's event).
    pub fn of(event: &tracing::Event<'_>) -> Option<WatchdogSnapshot> {
        watched::current(event).map(WatchdogSnapshot)
    }

    /// Its launch.
    pub fn launch_id(&self) -> u64 {
        self.0.snapshot.launch_id
    }

    /// Which snapshot of its launch it is (0 the first).
    pub fn index(&self) -> u32 {
        self.0.snapshot.index
    }

    /// Its text, as the event told it.
    pub fn text(&self) -> &str {
        &self.0.text
    }

    /// What in it disagrees with the events of its launch in `batches` (every part,
    /// delivered after it), one line each: none if it agrees.
    pub fn disagreements(&self, batches: &[Arc<Batch>]) -> Vec<String> {
        let launch = self.launch_id();
        crate::watch::disagreements(&self.0.snapshot, |block, warp| {
            let mut out: Vec<Event> = Vec::new();
            for b in batches.iter().filter(|b| b.launch.launch_id == launch) {
                for s in b.buffer.view().slots() {
                    if s.header.block_linear == block && s.header.warp == warp {
                        out.extend(s.events());
                    }
                }
            }
            out
        })
    }
}
