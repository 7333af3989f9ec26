//! [`OtlpGuard`]: the exporter's lifetime; its flush and finish, each within
//! `shutdown_timeout` or the give-up, exports in flight included.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::error::OtlpError;
use super::layer::{Inner, Job};
use super::state::OtlpStats;

/// Keeps the exporter alive; dropping it flushes and shuts it down, waiting at
/// most the builder's `shutdown_timeout`.
#[must_use = "dropping the guard shuts the exporter down now: hold it while the program records"]
pub struct OtlpGuard {
    pub(crate) inner: Arc<Inner>,
    pub(crate) done: bool,
}

impl fmt::Debug for OtlpGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OtlpGuard")
            .field("shutdown_timeout", &self.inner.shutdown_timeout)
            .field("stats", &self.inner.shared.stats())
            .finish()
    }
}

/// The most of a flush's or finish's time left for the export thread to
/// answer once the exports are cut off.
const GRACE: Duration = Duration::from_millis(250);

impl OtlpGuard {
    /// What happened to the spans so far.
    pub fn stats(&self) -> OtlpStats {
        self.inner.shared.stats()
    }

    /// Converts the batches handed over so far and exports every finished
    /// span, within `shutdown_timeout` (or the [`give_up_at`](Self::give_up_at)
    /// deadline, if sooner) in all: an export still in flight then is abandoned
    /// and its spans, and those not sent yet, count as failed.
    pub fn flush(&self) -> Result<(), OtlpError> {
        self.inner.flush_in_time("flush")
    }

    /// Flushes and shuts the exporter down within `shutdown_timeout` (or the
    /// [`give_up_at`](Self::give_up_at) deadline, if sooner), exports in
    /// flight included, and reports what happened to the spans. Spans that
    /// close later are not exported; batches handed over later are dropped and
    /// counted.
    pub fn finish(mut self) -> Result<OtlpStats, OtlpError> {
        self.shutdown_now()?;
        Ok(self.stats())
    }

    /// Gives up at `deadline` (at once if it has passed; an earlier deadline
    /// stands): from then on nothing more is sent. An export in flight is
    /// abandoned, spans not sent count as failed, [`OtlpLayer::replay`](super::OtlpLayer::replay) stops
    /// waiting for room in the queue, batches not yet converted are dropped,
    /// and [`flush`](Self::flush) and [`finish`](Self::finish) end at most a
    /// quarter of a second after it. For a one-shot export (a replay) that
    /// must end by a given time, whatever the collector does; may be called
    /// from any thread.
    pub fn give_up_at(&self, deadline: Instant) {
        self.inner.shared.give_up_at(deadline);
    }

    fn shutdown_now(&mut self) -> Result<(), OtlpError> {
        if std::mem::replace(&mut self.done, true) {
            return Ok(());
        }
        let inner = &self.inner;
        let (cut, deadline) = inner.limits();
        inner.shared.give_up_at(cut);
        let drained = inner.drain(deadline);
        inner.shared.stopped.store(true, Ordering::Release);
        {
            let _guard = inner.shared.room.lock();
            inner.shared.room_cv.notify_all();
        }
        // If the channel is full the thread sees `stopped` after its current job.
        let _ = inner.jobs.try_send(Job::Stop);
        let left = deadline.saturating_duration_since(Instant::now());
        let result = inner.provider.shutdown_with_timeout(left);
        inner.shared.log_pending();
        inner.log_unjoined();
        inner.log_foreign_otel();
        match (drained, result) {
            (true, Ok(())) => Ok(()),
            (false, _) => Err(OtlpError::Unfinished("finish")),
            (true, Err(source)) => Err(OtlpError::Sdk {
                what: "finish",
                source,
            }),
        }
    }
}

impl Drop for OtlpGuard {
    fn drop(&mut self) {
        // Bounded by `shutdown_timeout`; what did not make it is in the stats.
        let _ = self.shutdown_now();
    }
}

impl Inner {
    /// A flush's or finish's deadline, starting now: `shutdown_timeout`, or the
    /// give-up plus a grace, if sooner (but never less than the grace); and
    /// the cut-off for exports, a grace before it, which leaves the export
    /// thread time to answer.
    pub(crate) fn limits(&self) -> (Instant, Instant) {
        let now = Instant::now();
        let grace = (self.shutdown_timeout / 10).min(GRACE);
        let mut deadline = now + self.shutdown_timeout;
        if let Some(give_up) = self.shared.give_up() {
            deadline = deadline.min((give_up + grace).max(now + grace));
        }
        (deadline - grace, deadline)
    }

    /// [`OtlpGuard::flush`] and [`BatchSink::flush`](crate::batch::BatchSink::flush).
    pub(crate) fn flush_in_time(&self, what: &'static str) -> Result<(), OtlpError> {
        let (cut, deadline) = self.limits();
        let _cut = self.shared.flush_cut(cut);
        let drained = self.drain(deadline);
        self.shared.log_pending();
        self.log_unjoined();
        self.log_foreign_otel();
        if !drained {
            return Err(OtlpError::Unfinished(what));
        }
        // Returns when the export thread has exported (or given up on) every
        // span: by the cut-off, or after the SDK's own 5 s if sooner.
        self.provider
            .force_flush()
            .map_err(|source| OtlpError::Sdk { what, source })
    }

    /// Waits until every batch handed over so far is converted, or `deadline`.
    pub(crate) fn drain(&self, deadline: Instant) -> bool {
        let mut p = self.progress.lock();
        let target = p.submitted;
        while p.done < target && !p.exited {
            if self.progress_cv.wait_until(&mut p, deadline).timed_out() {
                return p.done >= target;
            }
        }
        true
    }
}
