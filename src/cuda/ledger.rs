//! The profiler's [`Ledger`]: what the launching threads and the collector share: the counters
//! ([`ProfilerStats`], the launching threads' as atomics), the errors kept for
//! the next flush, the sinks delivered to, and the calibration so far.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use crate::batch::BatchSink;
use crate::clock::Calibration;

use super::error::ProfilerError;

/// Counters, readable at any time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProfilerStats {
    /// Launches made through the profiler: direct launches, plus the profiled
    /// kernel nodes of each graph replay.
    pub launches: u64,
    /// Graph replays made through the profiler.
    pub replays: u64,
    /// Launches that ran without recording, because the arena (or the
    /// graph's replay ring) was full.
    pub skipped: u64,
    /// Launches that ran without recording because the sampling left them out
    /// (one in n, or its predicate): a null trace, as intended (not among
    /// `skipped`).
    pub unsampled: u64,
    /// Launches whose batch was delivered.
    pub delivered: u64,
    /// Launches whose buffer could not be brought back or decoded.
    pub failed: u64,
    /// Device events delivered.
    pub events: u64,
    /// Device events lost: ranges and instants the warps made that no batch
    /// holds, because a slot or a ring was full (counted per warp as
    /// `decode::Slot::events_lost`). Per warp, and so in all, `events +
    /// events_lost` is what the kernels made, for the launches delivered
    /// (a range still open when its warp flushed is no event).
    pub events_lost: u64,
    /// Parts of streamed launches delivered (the last part of each included).
    pub parts: u64,
    /// Times a streamed launch's drain thread stopped reading its rings
    /// because 1 GiB of parts waited for the collector (held back by a slow
    /// sink, or by plain spans for an unfiltered subscriber): the events the
    /// warps lost meanwhile are among `events_lost`.
    pub stream_stalls: u64,
    /// The longest a streamed launch's drain thread went between two reads of
    /// its rings (cutting a part, stopped for the backlog, or waiting for a
    /// core): where a warp's ring holds fewer of its events than it records in
    /// that time, it dropped some (counted in `events_lost`).
    pub stream_longest_gap: std::time::Duration,
    /// Watchdog snapshots taken of streamed launches still running past their
    /// deadline ([`ProfilerBuilder::watchdog`](crate::cuda::ProfilerBuilder::watchdog)).
    pub snapshots: u64,
    /// Clock checkpoints taken (the first calibration included).
    pub calibrations: u64,
    /// Recalibrations that failed while a streamed launch ran, after which
    /// none was tried until it completed: its parts (and launches held with
    /// them) were mapped with the checkpoints before, extrapolated.
    pub calibrations_missed: u64,
    /// Device memory held for traces: the arena and the graphs' replay rings
    /// (as much again is pinned host memory).
    pub memory_bytes: u64,
    /// Bytes of the arena in use now (launches not yet brought back).
    pub arena_in_use: u64,
}

/// State shared between the profiler (the application's threads) and the collector.
pub(crate) struct Ledger {
    pub(super) state: Mutex<LedgerState>,
    progress: Condvar,
    /// The launching threads' counters: atomics, so that a launch call takes no
    /// lock the collector takes (it takes `state` for every launch it finishes).
    launches: AtomicU64,
    pub(super) skipped: AtomicU64,
    unsampled: AtomicU64,
    replays: AtomicU64,
    /// Launches handed to the collector (a replay counts its nodes).
    pub(super) sent: AtomicU64,
}

pub(super) struct LedgerState {
    /// Everything but the launching threads' counters.
    pub(super) stats: ProfilerStats,
    /// Launches it has finished with (delivered, failed or skipped).
    pub(super) finished: u64,
    /// Errors since the last flush; the first is returned by `flush`.
    pub(super) errors: Vec<ProfilerError>,
    /// The sinks delivered to since the last flush, each once.
    pub(super) sinks: Vec<Arc<dyn BatchSink>>,
    pub(super) calibration: Arc<Calibration>,
}

impl Ledger {
    pub(crate) fn new(calibration: Calibration) -> Arc<Ledger> {
        let state = LedgerState {
            stats: ProfilerStats {
                calibrations: 1,
                ..Default::default()
            },
            finished: 0,
            errors: Vec::new(),
            sinks: Vec::new(),
            calibration: Arc::new(calibration),
        };
        Arc::new(Ledger {
            state: Mutex::new(state),
            progress: Condvar::new(),
            launches: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
            unsampled: AtomicU64::new(0),
            replays: AtomicU64::new(0),
            sent: AtomicU64::new(0),
        })
    }

    pub(crate) fn stats(&self) -> ProfilerStats {
        let st = self.state.lock().stats;
        ProfilerStats {
            launches: self.launches.load(Ordering::Acquire),
            skipped: self.skipped.load(Ordering::Acquire),
            unsampled: self.unsampled.load(Ordering::Acquire),
            replays: self.replays.load(Ordering::Acquire),
            ..st
        }
    }

    /// Every checkpoint so far.
    pub(crate) fn calibration(&self) -> Arc<Calibration> {
        self.state.lock().calibration.clone()
    }

    /// Counts a launch; `skipped` if it ran without a region.
    pub(crate) fn count_launch(&self, skipped: bool) {
        if skipped {
            self.skipped.fetch_add(1, Ordering::AcqRel);
        }
        self.launches.fetch_add(1, Ordering::AcqRel);
    }

    /// Counts a launch the sampling left out.
    pub(crate) fn count_unsampled(&self) {
        self.unsampled.fetch_add(1, Ordering::AcqRel);
        self.launches.fetch_add(1, Ordering::AcqRel);
    }

    /// Counts a graph replay of `nodes` profiled kernel nodes.
    pub(crate) fn count_replay(&self, nodes: u64) {
        self.replays.fetch_add(1, Ordering::AcqRel);
        self.launches.fetch_add(nodes, Ordering::AcqRel);
    }

    /// Counts a graph replay of `nodes` profiled kernel nodes made without the recorder:
    /// each a launch skipped.
    pub(crate) fn count_unrecorded_replay(&self, nodes: u64) {
        self.replays.fetch_add(1, Ordering::AcqRel);
        self.launches.fetch_add(nodes, Ordering::AcqRel);
        self.skipped.fetch_add(nodes, Ordering::AcqRel);
    }

    /// Keeps an error for the next flush.
    pub(crate) fn push_error(&self, e: ProfilerError) {
        self.state.lock().errors.push(e);
    }

    /// Counts `n` launches finished with (delivered, failed or skipped).
    pub(super) fn finish(&self, n: u64, f: impl FnOnce(&mut LedgerState)) {
        let mut st = self.state.lock();
        f(&mut st);
        st.finished += n;
        drop(st);
        self.progress.notify_all();
    }

    /// Waits until every job sent before the call is finished, then flushes the
    /// sinks of every dispatcher delivered to, and returns the first error since
    /// the last flush.
    pub(super) fn wait_and_flush(&self) -> Result<(), ProfilerError> {
        let (sinks, errors) = {
            let target = self.sent.load(Ordering::Acquire);
            let mut st = self.state.lock();
            while st.finished < target {
                self.progress.wait(&mut st);
            }
            (
                std::mem::take(&mut st.sinks),
                std::mem::take(&mut st.errors),
            )
        };
        for sink in &sinks {
            sink.flush();
        }
        match errors.into_iter().next() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}
