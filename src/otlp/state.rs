//! [`ExportState`]: what the layer, the conversion thread and the SDK's export
//! thread share: the bounded span queue and its admission, the counts
//! ([`OtlpStats`]), the one warning of an outage, and the deadlines (a
//! flush's cut, the give-up) every export keeps.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use tracing::dispatcher::WeakDispatch;

use super::error::ExportFailure;

/// When exports must end, besides each export's own timeout.
#[derive(Default)]
pub(crate) struct Cut {
    /// For good: [`super::OtlpGuard::give_up_at`] or the shutdown.
    give_up: Option<Instant>,
    /// For the flushes in progress.
    flushes: Vec<Instant>,
}

/// What the HTTP client saw of the export in progress. The SDK runs one export
/// at a time, on its own thread, so one record serves.
#[derive(Default)]
pub(crate) struct Attempt {
    /// Response headers arrived (for the request in progress).
    pub(crate) replied: bool,
    /// How the last request of this export failed.
    pub(crate) failure: Option<ExportFailure>,
    /// Spans the collector said it rejected (an OTLP `partial_success`), and why.
    pub(crate) rejected: Option<(u64, String)>,
}

/// A flush's deadline on the exports, lifted when the flush returns.
pub(crate) struct FlushCut<'a> {
    shared: &'a ExportState,
    at: Instant,
}

impl Drop for FlushCut<'_> {
    fn drop(&mut self) {
        let mut cut = self.shared.cut.lock();
        if let Some(i) = cut.flushes.iter().position(|&t| t == self.at) {
            cut.flushes.swap_remove(i);
        }
    }
}

/// State shared by the layer, the conversion thread and the SDK's export thread.
pub(crate) struct ExportState {
    pub(crate) max_queue: u64,
    /// Spans handed to the SDK and not yet taken by an export.
    pub(crate) in_queue: AtomicU64,
    pub(crate) room: Mutex<()>,
    pub(crate) room_cv: Condvar,
    pub(crate) exported: AtomicU64,
    pub(crate) rejected: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) dropped: AtomicU64,
    pub(crate) batches_dropped: AtomicU64,
    pub(crate) export_errors: AtomicU64,
    pub(crate) queue_peak: AtomicU64,
    /// Set by the first failure (which warns); cleared when export recovers.
    pub(crate) degraded: AtomicBool,
    /// `dropped` at the last successful export.
    pub(crate) dropped_at_export: AtomicU64,
    /// The subscriber this layer sits in: warnings go there, from any thread.
    pub(crate) dispatch: OnceLock<WeakDispatch>,
    /// [`OtlpStats::unjoined`](super::OtlpStats::unjoined), and whether it was warned about.
    pub(crate) unjoined: AtomicU64,
    pub(crate) unjoined_warned: AtomicBool,
    /// [`OtlpStats::foreign_otel`](super::OtlpStats::foreign_otel).
    pub(crate) foreign_otel: AtomicU64,
    /// Set when the guard shuts down: conversion stops waiting for room.
    pub(crate) stopped: AtomicBool,
    /// The warning of [`ExportState::warn_once`], until a thread of ours logs it.
    pub(crate) pending_warning: Mutex<Option<String>>,
    pub(crate) cut: Mutex<Cut>,
    pub(crate) attempt: Mutex<Attempt>,
    pub(crate) last_failure: Mutex<Option<ExportFailure>>,
}

/// The target of the exporter's own (rare) events, whatever file emits them:
/// what users filter on.
pub(crate) const LOG_TARGET: &str = "tracing_gpu::otlp";

thread_local! {
    /// Set on the conversion thread: there, a full queue means waiting for room
    /// (it is our thread), not dropping.
    static PATIENT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Makes the current thread wait for room in the span queue (as the conversion
/// thread does) for as long as it lives.
pub(crate) struct Patient(pub(crate) bool);

impl Patient {
    pub(crate) fn new() -> Patient {
        Patient(PATIENT.with(|p| p.replace(true)))
    }
}

impl Drop for Patient {
    fn drop(&mut self) {
        PATIENT.with(|p| p.set(self.0));
    }
}

impl ExportState {
    pub(crate) fn new(max_queue: usize) -> ExportState {
        ExportState {
            max_queue: max_queue as u64,
            in_queue: AtomicU64::new(0),
            room: Mutex::new(()),
            room_cv: Condvar::new(),
            exported: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            batches_dropped: AtomicU64::new(0),
            export_errors: AtomicU64::new(0),
            queue_peak: AtomicU64::new(0),
            degraded: AtomicBool::new(false),
            dropped_at_export: AtomicU64::new(0),
            dispatch: OnceLock::new(),
            unjoined: AtomicU64::new(0),
            unjoined_warned: AtomicBool::new(false),
            foreign_otel: AtomicU64::new(0),
            stopped: AtomicBool::new(false),
            pending_warning: Mutex::new(None),
            cut: Mutex::new(Cut::default()),
            attempt: Mutex::new(Attempt::default()),
            last_failure: Mutex::new(None),
        }
    }

    /// From `at` on, nothing more is sent (an earlier give-up stands).
    pub(crate) fn give_up_at(&self, at: Instant) {
        {
            let mut cut = self.cut.lock();
            cut.give_up = Some(cut.give_up.map_or(at, |t| t.min(at)));
        }
        // Wakes the conversion thread if it waits for room: it now waits until `at`.
        let _guard = self.room.lock();
        self.room_cv.notify_all();
    }

    pub(crate) fn give_up(&self) -> Option<Instant> {
        self.cut.lock().give_up
    }

    pub(crate) fn given_up(&self) -> bool {
        self.give_up().is_some_and(|t| t <= Instant::now())
    }

    /// Exports end by `at` until the returned guard drops.
    pub(crate) fn flush_cut(&self, at: Instant) -> FlushCut<'_> {
        self.cut.lock().flushes.push(at);
        FlushCut { shared: self, at }
    }

    /// When an export starting now must end: its own `timeout`, or earlier if
    /// a flush or the give-up says so. `None`: too late to start.
    pub(crate) fn export_deadline(&self, timeout: Duration) -> Option<Instant> {
        let now = Instant::now();
        let cut = self.cut.lock();
        let deadline = cut
            .flushes
            .iter()
            .copied()
            .chain(cut.give_up)
            .fold(now + timeout, Instant::min);
        (deadline > now).then_some(deadline)
    }

    /// Room left for host spans while device spans wait: an eighth of the queue.
    pub(crate) fn patient_limit(&self) -> u64 {
        self.max_queue - (self.max_queue / 8).max(1).min(self.max_queue - 1)
    }

    /// Takes one place in the queue, or counts a drop. Never blocks, except on
    /// the conversion thread, which waits for room (and gives up at shutdown).
    pub(crate) fn admit(&self) -> bool {
        if PATIENT.with(|p| p.get()) {
            let limit = self.patient_limit();
            let mut guard = self.room.lock();
            while self.in_queue.load(Ordering::Acquire) >= limit {
                if self.stopped.load(Ordering::Acquire) || self.given_up() {
                    drop(guard);
                    return self.refuse("the OTLP layer gave up with spans still to convert");
                }
                // Exports, the give-up and the shutdown notify under `room`: no
                // lost wake-up; a give-up in the future is waited for.
                match self.give_up() {
                    Some(at) => {
                        self.room_cv.wait_until(&mut guard, at);
                    }
                    None => self.room_cv.wait(&mut guard),
                }
            }
        }
        let before = self.in_queue.fetch_add(1, Ordering::AcqRel);
        if before >= self.max_queue {
            self.in_queue.fetch_sub(1, Ordering::AcqRel);
            return self.refuse("the OTLP export queue is full");
        }
        self.queue_peak.fetch_max(before + 1, Ordering::Relaxed);
        true
    }

    fn refuse(&self, why: &str) -> bool {
        self.dropped.fetch_add(1, Ordering::Relaxed);
        self.warn_once(why);
        false
    }

    pub(crate) fn leave_queue(&self, n: u64) {
        self.in_queue.fetch_sub(n, Ordering::AcqRel);
        let _guard = self.room.lock();
        self.room_cv.notify_all();
    }

    pub(crate) fn exported(&self, n: u64) {
        self.exported.fetch_add(n, Ordering::Relaxed);
        self.log_pending();
        // Recovered: an export went through and nothing was dropped since the
        // previous one (under steady load the queue need never be empty).
        let dropped = self.dropped.load(Ordering::Relaxed);
        let before = self.dropped_at_export.swap(dropped, Ordering::AcqRel);
        if dropped == before && self.degraded.swap(false, Ordering::AcqRel) {
            let failed = self.failed.load(Ordering::Relaxed);
            self.emit(|| {
                tracing::info!(
                    target: LOG_TARGET,
                    spans_failed = failed,
                    spans_dropped = dropped,
                    "OTLP export recovered"
                )
            });
        }
    }

    /// Spans a collector answered it did not accept: an export that went
    /// through (it is not retried), with spans lost all the same.
    pub(crate) fn rejected(&self, n: u64, why: &str) {
        self.rejected.fetch_add(n, Ordering::Relaxed);
        let why = match why.trim() {
            "" => String::new(),
            why => format!(": {why}"),
        };
        self.warn_once(&format!("the OTLP collector rejected {n} spans{why}"));
        self.log_pending();
    }

    pub(crate) fn failed(&self, n: u64, why: ExportFailure) {
        self.failed.fetch_add(n, Ordering::Relaxed);
        self.export_errors.fetch_add(1, Ordering::Relaxed);
        *self.last_failure.lock() = Some(why);
        self.warn_once(&format!("OTLP export failed: {why}"));
        self.log_pending();
    }

    /// Spans not sent because the deadline passed: failed, but no export call
    /// failed, and an earlier failure stays the reason.
    pub(crate) fn out_of_time(&self, n: u64) {
        self.failed.fetch_add(n, Ordering::Relaxed);
        self.last_failure
            .lock()
            .get_or_insert(ExportFailure::OutOfTime);
        self.warn_once(&format!("OTLP export {}", ExportFailure::OutOfTime));
        self.log_pending();
    }

    /// The one warning of an outage. It is only noted here and logged by
    /// [`ExportState::log_pending`] on a thread of ours: when a span closes in the
    /// application, we are inside a `tracing` callback, where `tracing` drops
    /// nested events.
    pub(crate) fn warn_once(&self, what: &str) {
        if !self.degraded.swap(true, Ordering::AcqRel) {
            *self.pending_warning.lock() = Some(what.to_string());
        }
    }

    /// Logs the warning noted by [`ExportState::warn_once`], if any.
    pub(crate) fn log_pending(&self) {
        let Some(what) = self.pending_warning.lock().take() else {
            return;
        };
        let max_queue = self.max_queue;
        self.emit(|| {
            tracing::warn!(
                target: LOG_TARGET,
                max_queue,
                "{what}; up to {max_queue} spans wait and later ones are dropped; \
                 further failures are counted (OtlpGuard::stats), not logged, \
                 until export recovers"
            )
        });
    }

    pub(crate) fn emit(&self, event: impl FnOnce()) {
        match self.dispatch.get().and_then(WeakDispatch::upgrade) {
            Some(d) => tracing::dispatcher::with_default(&d, event),
            None => event(),
        }
    }

    pub(crate) fn stats(&self) -> OtlpStats {
        OtlpStats {
            spans_exported: self.exported.load(Ordering::Relaxed),
            spans_rejected: self.rejected.load(Ordering::Relaxed),
            spans_failed: self.failed.load(Ordering::Relaxed),
            spans_dropped: self.dropped.load(Ordering::Relaxed),
            batches_dropped: self.batches_dropped.load(Ordering::Relaxed),
            export_errors: self.export_errors.load(Ordering::Relaxed),
            last_failure: *self.last_failure.lock(),
            queue_peak: self.queue_peak.load(Ordering::Relaxed),
            queue_capacity: self.max_queue,
            unjoined: self.unjoined.load(Ordering::Relaxed),
            foreign_otel: self.foreign_otel.load(Ordering::Relaxed),
        }
    }
}

impl fmt::Debug for ExportState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExportState")
            .field("stats", &self.stats())
            .finish()
    }
}

/// Counters of what happened to the spans, for [`OtlpGuard::stats`](super::OtlpGuard::stats) and
/// [`OtlpLayer::stats`](super::OtlpLayer::stats). Failures are counted here rather than logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OtlpStats {
    /// Spans the endpoint accepted.
    pub spans_exported: u64,
    /// Spans the endpoint received but rejected: it answered with an OTLP
    /// `partial_success` naming them (its message goes into the one warning).
    /// Not retried, as the specification says; not in `spans_exported`.
    pub spans_rejected: u64,
    /// Spans whose export failed (endpoint down, slow past the timeout,
    /// refusing, answering nonsense) or that ran out of time before being sent.
    /// Spans whose request was abandoned at the timeout are counted here,
    /// although the collector may have received them.
    pub spans_failed: u64,
    /// Spans dropped before export: the queue was full.
    pub spans_dropped: u64,
    /// Device batches dropped: the batch queue was full, or the layer was shut
    /// down or gave up before converting them.
    pub batches_dropped: u64,
    /// Export calls that failed.
    pub export_errors: u64,
    /// Why the last failed export failed.
    pub last_failure: Option<ExportFailure>,
    /// The most spans that ever waited for export at once (at most `max_queue_size`).
    pub queue_peak: u64,
    /// The queue's bound, `max_queue_size`.
    pub queue_capacity: u64,
    /// Host spans exported, and launches converted, before the layer found
    /// the subscriber it sits in (with [`HostSpans::Auto`](super::HostSpans::Auto)): host spans that
    /// `tracing-opentelemetry` may export too, device spans not under their
    /// launch span. Stays 0 in every shape tracing-subscriber lets the layer
    /// see its subscriber through (docs/subscriber.md); warned about once.
    pub unjoined: u64,
    /// Host spans exported beside a `tracing-opentelemetry` layer of another
    /// release than the one joined mode reads (0.34, with opentelemetry 0.33):
    /// that layer exports them too, in another trace. Warned about once per
    /// process (docs/subscriber.md, "Versions").
    pub foreign_otel: u64,
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;

    #[test]
    fn the_queue_admits_up_to_its_bound_and_counts_the_rest() {
        let shared = ExportState::new(4);
        let admitted = (0..10).filter(|_| shared.admit()).count();
        assert_eq!(admitted, 4);
        let s = shared.stats();
        assert_eq!((s.spans_dropped, s.queue_peak, s.queue_capacity), (6, 4, 4));
        // One warning noted for the whole episode.
        assert!(shared.pending_warning.lock().is_some());
        shared.pending_warning.lock().take();
        shared.admit();
        assert!(shared.pending_warning.lock().is_none());
        // Two exports in a row with no drop between them end the episode.
        shared.leave_queue(4);
        shared.exported(4);
        assert!(
            shared.degraded.load(Ordering::Acquire),
            "drops since the last export"
        );
        shared.exported(0);
        assert!(!shared.degraded.load(Ordering::Acquire));
        assert!(shared.admit());
    }

    #[test]
    fn exports_end_by_the_earliest_deadline() {
        use std::time::{Duration, Instant};
        let shared = ExportState::new(8);
        let timeout = Duration::from_secs(10);
        let own = shared.export_deadline(timeout).unwrap();
        assert!(own > Instant::now() + Duration::from_secs(9));
        // A flush cuts exports at its deadline until it returns.
        let soon = Instant::now() + Duration::from_secs(1);
        {
            let _cut = shared.flush_cut(soon);
            assert_eq!(shared.export_deadline(timeout), Some(soon));
            assert!(!shared.given_up());
        }
        assert!(shared.export_deadline(timeout).unwrap() > soon);
        // A give-up stands; an earlier one wins; past it, no export starts.
        shared.give_up_at(soon + Duration::from_secs(1));
        shared.give_up_at(soon);
        shared.give_up_at(soon + Duration::from_secs(5));
        assert_eq!(shared.give_up(), Some(soon));
        shared.give_up_at(Instant::now());
        assert!(shared.given_up());
        assert_eq!(shared.export_deadline(timeout), None);
        // The conversion thread no longer waits for room: it drops, at once.
        let _patient = Patient::new();
        let limit = shared.patient_limit();
        assert!((0..limit).all(|_| shared.admit()));
        let t = Instant::now();
        assert!(!shared.admit());
        assert!(t.elapsed() < Duration::from_secs(1));
        assert_eq!(shared.stats().spans_dropped, 1);
    }

    #[test]
    fn spans_out_of_time_fail_without_hiding_the_cause() {
        let shared = ExportState::new(8);
        shared.out_of_time(2);
        let s = shared.stats();
        assert_eq!(
            (s.spans_failed, s.export_errors, s.last_failure),
            (2, 0, Some(ExportFailure::OutOfTime))
        );
        shared.failed(3, ExportFailure::HttpStatus(503));
        shared.out_of_time(4);
        let s = shared.stats();
        assert_eq!(
            (s.spans_failed, s.export_errors, s.last_failure),
            (9, 1, Some(ExportFailure::HttpStatus(503)))
        );
    }
}
