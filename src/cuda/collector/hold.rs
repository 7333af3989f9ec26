//! Holding decoded launches for a clock checkpoint later than their last
//! event, so that their device times are interpolated between two
//! checkpoints rather than extrapolated past one; taking the checkpoint.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::Dispatch;

use super::{Held, Worker};
use crate::batch::LaunchInfo;
use crate::cuda::error::ProfilerError;
use crate::decode::OwnedBuffer;

/// Decoded launches held for their checkpoint may hold this many bytes before
/// a checkpoint is taken early: holding must not grow without bound when the
/// launches come fast and large.
const HOLD_LIMIT_BYTES: usize = 256 << 20;

impl Worker {
    /// How long the oldest held launch may still wait for a checkpoint.
    pub(super) fn until_due(&self) -> Duration {
        match (&self.recalibrate, self.held.front()) {
            (Some((_, period)), Some(h)) => period.saturating_sub(h.since.elapsed()),
            // Nothing is held: sleep until a message comes.
            _ => Duration::from_secs(3600),
        }
    }

    /// Delivers the held launches that a checkpoint brackets. Takes a new
    /// checkpoint first if the oldest has waited its period, if too much is
    /// held, or if `drain`; then everything held goes.
    pub(super) fn deliver_held(&mut self, drain: bool) {
        let Some(front) = self.held.front() else {
            return;
        };
        let due = match &self.recalibrate {
            Some((_, period)) => {
                drain || front.since.elapsed() >= *period || self.held_bytes > HOLD_LIMIT_BYTES
            }
            None => true,
        };
        if due && self.latest_anchor() <= self.held_newest {
            self.take_checkpoint();
        }
        let anchor = self.latest_anchor();
        while let Some(h) = self.held.front() {
            // Once due, nothing better will come (no recalibration, or it failed).
            if !(due || h.last_device_ns < anchor) {
                break;
            }
            let h = self.held.pop_front().expect("front exists");
            self.deliver(h);
        }
    }

    pub(super) fn latest_anchor(&self) -> u64 {
        self.calibration.latest().map.anchor().0
    }

    fn take_checkpoint(&mut self) {
        let Some((recal, _)) = self.recalibrate.as_mut() else {
            return;
        };
        if self.recalibration_paused {
            return;
        }
        let result = recal.round(self.streaming).and_then(|round| {
            self.calibration
                .push(round.checkpoint.clone())
                .map_err(|e| ProfilerError::Calibration(e.into()))?;
            if let Some(a) = self.archive.as_mut() {
                a.calibration(&self.device, &round);
            }
            Ok(())
        });
        let mut st = self.shared.state.lock();
        match result {
            Ok(()) => {
                st.calibration = Arc::new(self.calibration.clone());
                st.stats.calibrations += 1;
            }
            Err(_) if self.streaming => {
                st.stats.calibrations_missed += 1;
                self.recalibration_paused = true;
            }
            Err(e) => st.errors.push(e),
        }
    }

    /// Holds a decoded launch for its checkpoint (or counts it as failed).
    pub(super) fn hold(
        &mut self,
        launch: LaunchInfo,
        capture: Result<OwnedBuffer, ProfilerError>,
        dispatch: &Dispatch,
        span: &tracing::Span,
    ) {
        let capture = match capture {
            Ok(c) => c,
            Err(e) => {
                // A part before the last does not finish its launch.
                let n = u64::from(launch.part.is_none_or(|p| p.last));
                return self.shared.finish(n, |st| {
                    st.stats.failed += n;
                    st.errors.push(e);
                });
            }
        };
        let view = capture.view();
        let first_device_ns = view.slots().map(|s| s.header.first_ts).min().unwrap_or(0);
        let last_device_ns = view.slots().map(|s| s.header.last_ts).max().unwrap_or(0);
        self.held_bytes += capture.bytes().len();
        self.held_newest = self.held_newest.max(last_device_ns);
        self.held.push_back(Held {
            launch,
            capture,
            dispatch: dispatch.clone(),
            span: span.clone(),
            first_device_ns,
            last_device_ns,
            since: Instant::now(),
        });
    }
}
