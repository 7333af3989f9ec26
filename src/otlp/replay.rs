//! A recorded run's host spans and batches, shipped with their recorded times.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use opentelemetry::trace::{SpanBuilder, SpanKind, TraceContextExt, Tracer as _};
use opentelemetry::{Context as OtelContext, KeyValue};

use super::export::Patient;
use super::layer::Job;
use super::layer::OtlpLayer;
use crate::batch::{Batch, HostSpan};

impl OtlpLayer {
    /// Ships a recorded run (a capture file's, [`crate::capture::Capture`]) with
    /// its recorded times, without a subscriber: its host spans (BOOTTIME,
    /// moved to wall time by `realtime_offset_ns`, `CLOCK_REALTIME −
    /// CLOCK_BOOTTIME` as measured with the run's first calibration,
    /// [`crate::capture::Capture::realtime_offset_ns`]), and each of `batches`
    /// under the host span that wraps its launch (matched by launch id).
    ///
    /// Unlike the live path this waits for room in the queues instead of
    /// dropping (a replay is not an application's hot path), until
    /// [`OtlpGuard::give_up_at`](crate::otlp::OtlpGuard::give_up_at)'s deadline
    /// if one is set; it returns once everything is handed over (or dropped,
    /// after that deadline). Follow with [`OtlpGuard::flush`](crate::otlp::OtlpGuard::flush) and check
    /// [`OtlpGuard::stats`](crate::otlp::OtlpGuard::stats).
    pub fn replay(&self, spans: &[HostSpan], realtime_offset_ns: i64, batches: &[Arc<Batch>]) {
        let inner = &self.inner;
        let _patient = Patient::new();
        let wall = |boottime_ns: u64| {
            let ns = (i128::from(boottime_ns) + i128::from(realtime_offset_ns)).max(0);
            UNIX_EPOCH + Duration::from_nanos(ns as u64)
        };
        // Parents come before their children in a capture: build in order, end at the end.
        let mut contexts: Vec<OtelContext> = Vec::with_capacity(spans.len());
        let mut launches = HashMap::new();
        for span in spans {
            let parent = span
                .parent
                .and_then(|p| contexts.get(p as usize))
                .cloned()
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
            let otel = inner.tracer.build_with_context(
                SpanBuilder::from_name(span.name.clone())
                    .with_kind(SpanKind::Internal)
                    .with_start_time(wall(span.start_ns))
                    .with_attributes(attributes),
                &parent,
            );
            let cx = parent.with_span(otel);
            if let Some(launch_id) = span.launch_id {
                launches.insert(launch_id, cx.clone());
            }
            contexts.push(cx);
        }
        for batch in batches {
            let parent = launches
                .get(&batch.launch.launch_id)
                .cloned()
                .unwrap_or_default();
            if inner.shared.stopped.load(Ordering::Acquire) || inner.shared.given_up() {
                inner.shared.batches_dropped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            inner.progress.lock().submitted += 1;
            if inner.jobs.send(Job::Batch(batch.clone(), parent)).is_err() {
                inner.progress.lock().submitted -= 1;
                inner.shared.batches_dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
        for (cx, span) in contexts.iter().zip(spans) {
            cx.span().end_with_timestamp(wall(span.end_ns));
        }
    }
}
