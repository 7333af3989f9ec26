//! The export plumbing: our counting span processor and exporter in front of the
//! SDK's, the deadlines every export keeps, and the I/O runtime.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context as TaskContext, Poll};
use std::time::{Duration, Instant};

use super::ExportFailure;
use super::OtlpStats;
use super::GRPC_CODES;
use opentelemetry::Context as OtelContext;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{BatchSpanProcessor, SpanData, SpanExporter, SpanProcessor};
use opentelemetry_sdk::Resource;
use parking_lot::{Condvar, Mutex};
use tracing::dispatcher::WeakDispatch;

/// A tokio runtime that is shut down without blocking: dropping a runtime
/// inside another runtime's async context would panic.
#[derive(Debug)]
pub(crate) struct IoRuntime(pub(crate) Option<tokio::runtime::Runtime>);

impl Drop for IoRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

// --------------------------------------------------------------------------
// Counting, the bounded queue and the one warning.

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
}

/// A flush's deadline on the exports, lifted when the flush returns.
pub(crate) struct FlushCut<'a> {
    shared: &'a Shared,
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
pub(crate) struct Shared {
    pub(crate) max_queue: u64,
    /// Spans handed to the SDK and not yet taken by an export.
    pub(crate) in_queue: AtomicU64,
    pub(crate) room: Mutex<()>,
    pub(crate) room_cv: Condvar,
    pub(crate) exported: AtomicU64,
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
    /// Set when the guard shuts down: conversion stops waiting for room.
    pub(crate) stopped: AtomicBool,
    /// The warning of [`Shared::warn_once`], until a thread of ours logs it.
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

impl Shared {
    pub(crate) fn new(max_queue: usize) -> Shared {
        Shared {
            max_queue: max_queue as u64,
            in_queue: AtomicU64::new(0),
            room: Mutex::new(()),
            room_cv: Condvar::new(),
            exported: AtomicU64::new(0),
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
    /// [`Shared::log_pending`] on a thread of ours: when a span closes in the
    /// application, we are inside a `tracing` callback, where `tracing` drops
    /// nested events.
    pub(crate) fn warn_once(&self, what: &str) {
        if !self.degraded.swap(true, Ordering::AcqRel) {
            *self.pending_warning.lock() = Some(what.to_string());
        }
    }

    /// Logs the warning noted by [`Shared::warn_once`], if any.
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
            spans_failed: self.failed.load(Ordering::Relaxed),
            spans_dropped: self.dropped.load(Ordering::Relaxed),
            batches_dropped: self.batches_dropped.load(Ordering::Relaxed),
            export_errors: self.export_errors.load(Ordering::Relaxed),
            last_failure: *self.last_failure.lock(),
            queue_peak: self.queue_peak.load(Ordering::Relaxed),
            queue_capacity: self.max_queue,
            unjoined: self.unjoined.load(Ordering::Relaxed),
        }
    }
}

/// The SDK's batch processor behind our admission: we count every span and
/// drop before the SDK's channel could fill.
#[derive(Debug)]
pub(crate) struct CountingProcessor {
    pub(crate) inner: BatchSpanProcessor,
    pub(crate) shared: Arc<Shared>,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("stats", &self.stats())
            .finish()
    }
}

impl SpanProcessor for CountingProcessor {
    fn on_start(&self, span: &mut opentelemetry_sdk::trace::Span, cx: &OtelContext) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        if self.shared.admit() {
            self.inner.on_end(span);
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// The OTLP exporter behind our counters and deadlines: each export ends by its
/// deadline ([`Shared::export_deadline`]), its failure is counted with its kind
/// and warned about once, and it is reported to the SDK as done, so the SDK
/// logs nothing. The SDK's batch processor cannot abort an export (it blocks
/// its thread on it): stopping here is what bounds its flush and shutdown.
#[derive(Debug)]
pub(crate) struct CountingExporter<E> {
    pub(crate) inner: E,
    pub(crate) shared: Arc<Shared>,
    /// The exporter's `timeout`: the most one export may take, retries included.
    pub(crate) timeout: Duration,
    pub(crate) io: tokio::runtime::Handle,
    /// Declared last: dropped after `inner`, whose connections live on it.
    pub(crate) _runtime: IoRuntime,
}

impl<E: SpanExporter> SpanExporter for CountingExporter<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let n = batch.len() as u64;
        self.shared.leave_queue(n);
        self.shared.log_pending();
        let Some(deadline) = self.shared.export_deadline(self.timeout) else {
            self.shared.out_of_time(n);
            return Ok(());
        };
        *self.shared.attempt.lock() = Attempt::default();
        let export = self.inner.export(batch);
        // The timer is made on the first poll, in the runtime's context.
        let outcome = InRuntime {
            io: self.io.clone(),
            future: Box::pin(async move { tokio::time::timeout_at(deadline.into(), export).await }),
        }
        .await;
        let attempt = std::mem::take(&mut *self.shared.attempt.lock());
        match outcome {
            Ok(Ok(())) => self.shared.exported(n),
            Ok(Err(e)) => self
                .shared
                .failed(n, attempt.failure.unwrap_or_else(|| classify(&e))),
            Err(_elapsed) => self.shared.failed(
                n,
                attempt.failure.unwrap_or(if attempt.replied {
                    ExportFailure::SlowReply
                } else {
                    ExportFailure::NoReply
                }),
            ),
        }
        Ok(())
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// Polls a future inside the I/O runtime's context. The SDK polls exports on
/// its own thread (`futures_executor::block_on`): there, our timer and the
/// clients' sockets need the runtime, and the exporter's retries then sleep
/// on tokio's timer (which our timeout can cut) rather than blocking the thread.
struct InRuntime<F> {
    io: tokio::runtime::Handle,
    future: Pin<Box<F>>,
}

impl<F: Future> Future for InRuntime<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<F::Output> {
        let this = &mut *self;
        let _entered = this.io.enter();
        this.future.as_mut().poll(cx)
    }
}

/// The kind of a failed export the HTTP client did not see: a gRPC export,
/// known only by the exporter's message: "... gRPC code: Unknown: transport
/// error: ..." (then the error's source chain) when tonic could not get a
/// status from the server, "... gRPC code: Unavailable" for one the server sent.
pub(crate) fn classify(error: &OTelSdkError) -> ExportFailure {
    let text = error.to_string();
    let has = |what: &str| text.contains(what);
    if has("onnection refused") {
        return ExportFailure::ConnectionRefused;
    }
    if has("transport error") || has("Timeout expired") {
        return if has("Timeout expired") {
            // tonic's own timeout (ours, the same, usually fires first).
            ExportFailure::NoReply
        } else if has("http2 error") || has("protocol error") || has("frame") {
            // Something answered, not in HTTP/2.
            ExportFailure::MalformedReply
        } else if has("connect") || has("dns error") {
            ExportFailure::CannotConnect
        } else if has("closed") || has("reset") || has("broken pipe") {
            ExportFailure::ConnectionClosed
        } else {
            ExportFailure::Other
        };
    }
    let code = text
        .split("gRPC code: ")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_alphanumeric()).next())
        .and_then(|name| GRPC_CODES.iter().position(|&c| c == name));
    match code {
        Some(code) => ExportFailure::GrpcStatus(code as i32),
        None => ExportFailure::Other,
    }
}
