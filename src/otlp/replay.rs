//! [`OtlpLayer::replay`]: a recorded run's host spans and batches, shipped with
//! their recorded times, a batch at a time.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry::trace::{
    Span as _, SpanBuilder, SpanContext, SpanKind, TraceContextExt, Tracer as _,
};
use opentelemetry::{Context as OtelContext, KeyValue};

use super::layer::{Inner, Job, OtlpLayer};
use super::state::Patient;
use crate::batch::{Batch, HostSpan};

/// Batches a replay hands the conversion thread before it waits for one to
/// be converted: one being converted and one ready, while the caller reads
/// the next. A replay holds a few launches, whatever their number.
const IN_FLIGHT: u64 = 2;

impl OtlpLayer {
    /// Ships a recorded run (a capture file's: [`crate::capture::CaptureReader`]
    /// or [`crate::capture::Capture`]) with its recorded times, without a
    /// subscriber: each of `batches` under the host span that wraps its launch
    /// (matched by launch id), and the host spans `spans` (BOOTTIME, moved to
    /// wall time by `realtime_offset_ns`, `CLOCK_REALTIME − CLOCK_BOOTTIME` as
    /// measured with the run's first calibration,
    /// [`crate::capture::Capture::realtime_offset_ns`]).
    ///
    /// `batches` is taken a batch at a time, as the caller reads them (a
    /// capture of any size: [`crate::capture::CaptureReader::batches`]); the
    /// replay holds at most two of them besides the one the iterator is
    /// making. A host span is exported when a batch first needs it (or at the
    /// end), its start and end both known; what is kept of it is its ids.
    ///
    /// Unlike the live path this waits for room in the queues instead of
    /// dropping (a replay is not an application's hot path), until
    /// [`OtlpGuard::give_up_at`](crate::otlp::OtlpGuard::give_up_at)'s deadline
    /// if one is set; past it, the batches still to come are taken and counted
    /// as dropped ([`OtlpStats::batches_dropped`](crate::otlp::OtlpStats::batches_dropped)),
    /// so the iterator always runs to its end. It returns once everything is
    /// handed over. Follow with [`OtlpGuard::flush`](crate::otlp::OtlpGuard::flush)
    /// and check [`OtlpGuard::stats`](crate::otlp::OtlpGuard::stats).
    pub fn replay(
        &self,
        spans: &[HostSpan],
        realtime_offset_ns: i64,
        batches: impl IntoIterator<Item = Arc<Batch>>,
    ) {
        let inner = &*self.inner;
        let _patient = Patient::new();
        let mut host = HostReplay::new(inner, spans, realtime_offset_ns);
        for batch in batches {
            let parent = host.launch(batch.launch.launch_id);
            inner.hand_over(batch, parent);
        }
        host.finish();
    }
}

/// The host spans of a replay, exported in order as they are needed.
struct HostReplay<'a> {
    inner: &'a Inner,
    spans: &'a [HostSpan],
    realtime_offset_ns: i64,
    /// The ids of the spans exported so far: `spans[..made.len()]`.
    made: Vec<SpanContext>,
    /// Launch id → the index of the span that wraps it.
    launches: HashMap<u64, usize>,
}

impl<'a> HostReplay<'a> {
    fn new(inner: &'a Inner, spans: &'a [HostSpan], realtime_offset_ns: i64) -> HostReplay<'a> {
        let launches = spans
            .iter()
            .enumerate()
            .filter_map(|(i, s)| Some((s.launch_id?, i)))
            .collect();
        HostReplay {
            inner,
            spans,
            realtime_offset_ns,
            made: Vec::new(),
            launches,
        }
    }

    fn wall(&self, boottime_ns: u64) -> SystemTime {
        let ns = (i128::from(boottime_ns) + i128::from(self.realtime_offset_ns)).max(0);
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    }

    /// The context a batch of launch `launch_id` hangs under: its launch
    /// span's, exported first with the spans before it; none without one.
    fn launch(&mut self, launch_id: u64) -> OtelContext {
        let Some(&index) = self.launches.get(&launch_id) else {
            return OtelContext::new();
        };
        self.make_through(index);
        OtelContext::new().with_remote_span_context(self.made[index].clone())
    }

    /// Exports the spans up to `index`, in order: parents come before their
    /// children in a capture.
    fn make_through(&mut self, index: usize) {
        while self.made.len() <= index.min(self.spans.len().saturating_sub(1)) {
            let span = &self.spans[self.made.len()];
            let parent = span
                .parent
                .and_then(|p| self.made.get(p as usize))
                .map(|p| OtelContext::new().with_remote_span_context(p.clone()))
                .unwrap_or_default();
            let mut attributes = vec![
                KeyValue::new("thread.name", span.thread_name.clone()),
                KeyValue::new("thread.id", span.thread_id as i64),
            ];
            attributes.extend(
                span.fields
                    .iter()
                    .map(|(k, v)| KeyValue::new(k.clone(), v.clone())),
            );
            let mut otel = self.inner.tracer.build_with_context(
                SpanBuilder::from_name(span.name.clone())
                    .with_kind(SpanKind::Internal)
                    .with_start_time(self.wall(span.start_ns))
                    .with_attributes(attributes),
                &parent,
            );
            let ids = otel.span_context().clone();
            otel.end_with_timestamp(self.wall(span.end_ns));
            self.made.push(ids);
        }
    }

    /// Exports the spans no batch needed.
    fn finish(mut self) {
        if !self.spans.is_empty() {
            self.make_through(self.spans.len() - 1);
        }
    }
}

impl Inner {
    /// Hands a replayed batch to the conversion thread, once fewer than
    /// [`IN_FLIGHT`] wait there (until the give-up); dropped and counted
    /// after the give-up or the shutdown.
    fn hand_over(&self, batch: Arc<Batch>, parent: OtelContext) {
        let mut p = self.progress.lock();
        while p.submitted - p.done >= IN_FLIGHT && !p.exited && !self.gave_up() {
            // The conversion thread notifies at each batch done; a give-up
            // in the future is waited for.
            match self.shared.give_up() {
                Some(at) => {
                    self.progress_cv.wait_until(&mut p, at);
                }
                None => self.progress_cv.wait(&mut p),
            }
        }
        if self.gave_up() {
            drop(p);
            self.shared.batches_dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        p.submitted += 1;
        drop(p);
        if self.jobs.send(Job::Batch(batch, parent)).is_err() {
            self.progress.lock().submitted -= 1;
            self.shared.batches_dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn gave_up(&self) -> bool {
        self.shared.stopped.load(Ordering::Acquire) || self.shared.given_up()
    }
}
