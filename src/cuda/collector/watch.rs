//! The watchdog's step (issue #32): a running streamed launch past its deadline
//! gets a snapshot of its warps' watch cells, read in place in mapped memory
//! (no driver call), told as one ERROR event under its launch span, with the
//! snapshot itself beside it for the sinks that draw it (`deliver::watched`); again
//! every period if one is set.

use std::sync::Arc;

use super::Worker;
use crate::clock::HostClock;
use crate::cuda::device::Memory;
use crate::cuda::job::{Job, Work};
use crate::deliver::watched::{self, Watched};
use crate::watch::{Cells, Snapshot, Words, TARGET};

impl Words for Memory {
    fn word(&self, offset: usize) -> u64 {
        self.load_u64(offset)
    }
}

impl Worker {
    /// Takes the snapshot a running streamed launch is due, if any.
    pub(super) fn watch_running(&mut self, job: &mut Job) {
        let launch_ns = job.launch.host_launch_ns;
        let Work::Streamed {
            header,
            place,
            watch: Some((dog, taken)),
            ..
        } = &mut job.work
        else {
            return;
        };
        let now = HostClock::Boottime.now_ns();
        if dog.due_ns(launch_ns, *taken).is_none_or(|due| now < due) {
            return;
        }
        let Some(rings) = header.buffer_size() else {
            return;
        };
        let cells = Cells {
            at: place.region.offset + rings,
            slots: header.slot_count,
        };
        let warps = cells.read(&*place.memory);
        // Durations are measured to a time taken after the cells were read: taken before,
        // every warp of a kernel whose phases last a few µs had started its phase after it,
        // and showed "for 0 ns" (H100, `stream --modes watch`, session 23).
        let read_ns = HostClock::Boottime.now_ns();
        let snapshot = Snapshot {
            launch_id: job.launch.launch_id,
            kernel: job.launch.kernel.to_string(),
            grid: job.launch.grid,
            warps_per_block: header.warps_per_block,
            now_ns: self.device_now(read_ns),
            running_ns: now.saturating_sub(launch_ns),
            index: *taken,
            warps,
        };
        *taken += 1;
        self.shared.state.lock().stats.snapshots += 1;
        let text = snapshot.text(&self.registry);
        if let Some(a) = self.archive.as_mut() {
            a.snapshot(&snapshot, &text);
        }
        let running = snapshot
            .warps
            .iter()
            .filter(|w| w.since_ns().is_some())
            .count();
        let (id, index) = (snapshot.launch_id, snapshot.index);
        let parent = job.span.id();
        // The structured snapshot goes with its event, for the sinks that draw it.
        let watched = Arc::new(Watched {
            snapshot,
            text,
            device: self.device.clone(),
            clock: self.calibration.latest().map.clone(),
            registry: self.registry.clone(),
        });
        let (kernel, text) = (&watched.snapshot.kernel, &watched.text);
        tracing::dispatcher::with_default(&job.dispatch, || {
            watched::emit(watched.clone(), || {
                tracing::error!(
                    target: TARGET,
                    parent: parent,
                    { gpu.launch_id = id, gpu.kernel = %kernel, gpu.snapshot = index, gpu.warps_running = running },
                    "{}",
                    text
                );
            });
        });
    }

    /// The device time at host time `host_ns` (trace clock): the latest
    /// checkpoint's mapping, run backwards (its drift over a watchdog's seconds
    /// is far below what a snapshot tells).
    fn device_now(&self, host_ns: u64) -> u64 {
        let (device, host) = self.calibration.latest().map.anchor();
        (device as i128 + host_ns as i128 - host as i128).max(0) as u64
    }
}
