//! [`OtlpLayer::replay`]: a recorded run's host spans and batches, shipped with
//! their recorded times, a batch at a time; a launch the watchdog saw still
//! running marked on its launch span, as live.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry::trace::{
    Span as _, SpanBuilder, SpanContext, SpanKind, TraceContextExt, TraceFlags, TraceState,
    Tracer as _,
};
use opentelemetry::{Context as OtelContext, KeyValue, Value};
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator};

use super::conversion::launch_end;
use super::layer::{Inner, Job, OtlpLayer, Progress};
use super::state::Patient;
use super::streamed::PresetIds;
use crate::batch::{Batch, HostSpan};
use crate::capture::Capture;

/// Batches a replay hands the conversion thread before it waits for one to
/// be converted: one being converted and one ready, while the caller reads
/// the next. A replay holds a few launches, whatever their number.
const IN_FLIGHT: u64 = 2;
/// And their decoded buffers' bytes: past this, one batch at a time (a part of
/// a streamed launch may decode to hundreds of MB from a capture of a few).
const IN_FLIGHT_BYTES: u64 = 64 << 20;

impl OtlpLayer {
    /// Ships a recorded run (a capture file's: [`crate::capture::CaptureReader`]
    /// or [`crate::capture::Capture`]) with its recorded times, without a
    /// subscriber: each of `batches` under the host span that wraps its launch
    /// (matched by launch id), and `head`'s host spans (BOOTTIME, moved to
    /// wall time by [`Capture::realtime_offset_ns`], `CLOCK_REALTIME −
    /// CLOCK_BOOTTIME` as measured with the run's first calibration). A launch
    /// span whose launch the watchdog saw still running
    /// ([`Capture::snapshots`]) gets `gpu.unfinished = true` and the latest
    /// snapshot's text as `gpu.watchdog`, as the live layer marks it.
    ///
    /// `batches` is taken a batch at a time, as the caller reads them (a
    /// capture of any size: [`crate::capture::CaptureReader::batches`]); the
    /// replay holds at most two of them besides the one the iterator is
    /// making. A host span is exported once the launches under it are over (or
    /// at the end): it lasts until its last descendant ends, and a launch span
    /// until its launch is over, as they would live (a capture records a span's
    /// first enter and last exit, not its close). What is kept of a span is
    /// its ids and its end.
    ///
    /// Unlike the live path this waits for room in the queues instead of
    /// dropping (a replay is not an application's hot path), until
    /// [`OtlpGuard::give_up_at`](crate::otlp::OtlpGuard::give_up_at)'s deadline
    /// if one is set; past it, the batches still to come are taken and counted
    /// as dropped ([`OtlpStats::batches_dropped`](crate::otlp::OtlpStats::batches_dropped)),
    /// so the iterator always runs to its end. It returns once everything is
    /// handed over. Follow with [`OtlpGuard::flush`](crate::otlp::OtlpGuard::flush)
    /// and check [`OtlpGuard::stats`](crate::otlp::OtlpGuard::stats).
    pub fn replay(&self, head: &Capture, batches: impl IntoIterator<Item = Arc<Batch>>) {
        let inner = &*self.inner;
        let _patient = Patient::new();
        // The latest snapshot of each launch the watchdog saw running.
        let mut unfinished: HashMap<u64, (u32, String)> = HashMap::new();
        for (launch, n, text) in head.snapshots() {
            if unfinished.get(&launch).is_none_or(|(m, _)| *m <= n) {
                unfinished.insert(launch, (n, text.into_owned()));
            }
        }
        let mut host = HostReplay::new(
            inner,
            &head.host_spans,
            head.realtime_offset_ns(),
            unfinished
                .into_iter()
                .map(|(launch, (_, text))| (launch, text))
                .collect(),
        );
        let mut batches = batches.into_iter();
        // The next batch is read (decoded) only once what is in flight is small.
        while let Some(batch) = {
            drop(inner.wait_for(|p| p.bytes < IN_FLIGHT_BYTES));
            batches.next()
        } {
            let parent = host.launch(&batch);
            inner.hand_over(batch, parent);
        }
        host.finish();
    }
}

/// The host spans of a replay. Each is exported once its extent is known:
/// as a live span, it lasts until its last descendant ends (tracing's
/// registry closes a span after its children), and a launch span until its
/// launch is over (the profiler holds it until the launch is delivered). A
/// capture records a span from its first enter to its last exit, so a span
/// replayed with only that would end before the kernel it launched, and a
/// span still open when the capture was written would have no duration: a
/// backend that compares children with their parents (Jaeger's clock-skew
/// adjustment) would move or flag them. Ids are chosen first, so that
/// device spans can name a launch span exported later.
struct HostReplay<'a> {
    inner: &'a Inner,
    spans: &'a [HostSpan],
    realtime_offset_ns: i64,
    ids: Vec<SpanContext>,
    /// Each span's end so far: its own, its descendants', their launches'.
    ends: Vec<SystemTime>,
    /// Launches under each span (its own included) whose last batch has not come.
    pending: Vec<u32>,
    exported: Vec<bool>,
    /// Launch id → the index of the span that wraps it, until its last batch.
    launches: HashMap<u64, usize>,
    /// Launch id → the text of its latest snapshot.
    unfinished: HashMap<u64, String>,
}

impl<'a> HostReplay<'a> {
    fn new(
        inner: &'a Inner,
        spans: &'a [HostSpan],
        realtime_offset_ns: i64,
        unfinished: HashMap<u64, String>,
    ) -> HostReplay<'a> {
        let random = RandomIdGenerator::default();
        let parent = |i: usize| spans[i].parent.map(|p| p as usize).filter(|&p| p < i);
        let mut ids: Vec<SpanContext> = Vec::with_capacity(spans.len());
        for i in 0..spans.len() {
            let trace = match parent(i) {
                Some(p) => ids[p].trace_id(),
                None => random.new_trace_id(),
            };
            let id = random.new_span_id();
            ids.push(SpanContext::new(
                trace,
                id,
                TraceFlags::SAMPLED,
                true,
                TraceState::NONE,
            ));
        }
        let wall = |ns: u64| to_wall(ns, realtime_offset_ns);
        let mut ends: Vec<SystemTime> = spans
            .iter()
            .map(|s| wall(s.end_ns.max(s.start_ns)))
            .collect();
        let mut pending = vec![0u32; spans.len()];
        let mut launches = HashMap::new();
        for (i, s) in spans.iter().enumerate() {
            if let Some(id) = s.launch_id {
                if launches.insert(id, i).is_none() {
                    pending[i] += 1;
                }
            }
        }
        // Children come after their parents: one backward pass sums the subtrees.
        for i in (0..spans.len()).rev() {
            if let Some(p) = parent(i) {
                ends[p] = ends[p].max(ends[i]);
                pending[p] += pending[i];
            }
        }
        let mut replay = HostReplay {
            inner,
            spans,
            realtime_offset_ns,
            ids,
            ends,
            exported: vec![false; spans.len()],
            pending,
            launches,
            unfinished,
        };
        for i in 0..spans.len() {
            if replay.pending[i] == 0 {
                replay.export(i);
            }
        }
        replay
    }

    fn parent(&self, i: usize) -> Option<usize> {
        self.spans[i].parent.map(|p| p as usize).filter(|&p| p < i)
    }

    /// The context `batch` hangs under: its launch span's (none without
    /// one). The launch span and its ancestors last until the batch's launch
    /// is over; at the launch's last batch, those with no launch left to
    /// come under them are exported.
    fn launch(&mut self, batch: &Batch) -> OtelContext {
        let Some(&index) = self.launches.get(&batch.launch.launch_id) else {
            return OtelContext::new();
        };
        let over = launch_end(batch);
        let last = batch.launch.part.is_none_or(|p| p.last);
        if last {
            self.launches.remove(&batch.launch.launch_id);
        }
        let mut at = Some(index);
        while let Some(i) = at {
            self.ends[i] = self.ends[i].max(over);
            if last {
                self.pending[i] -= 1;
                if self.pending[i] == 0 {
                    self.export(i);
                }
            }
            at = self.parent(i);
        }
        OtelContext::new().with_remote_span_context(self.ids[index].clone())
    }

    /// Exports span `i` with the ids chosen for it.
    fn export(&mut self, i: usize) {
        if std::mem::replace(&mut self.exported[i], true) {
            return;
        }
        let span = &self.spans[i];
        let parent = self
            .parent(i)
            .map(|p| OtelContext::new().with_remote_span_context(self.ids[p].clone()))
            .unwrap_or_default();
        let mut attributes = vec![
            KeyValue::new("thread.name", span.thread_name.clone()),
            KeyValue::new("thread.id", span.thread_id as i64),
        ];
        attributes.extend(
            span.fields
                .iter()
                .map(|(k, v)| KeyValue::new(k.clone(), typed(v))),
        );
        if let Some(text) = span.launch_id.and_then(|id| self.unfinished.get(&id)) {
            attributes.push(KeyValue::new("gpu.unfinished", true));
            attributes.push(KeyValue::new("gpu.watchdog", text.clone()));
        }
        let ids = &self.ids[i];
        let builder = SpanBuilder::from_name(span.name.clone())
            .with_kind(SpanKind::Internal)
            .with_start_time(to_wall(span.start_ns, self.realtime_offset_ns))
            .with_attributes(attributes);
        let mut otel = PresetIds::build(ids.trace_id(), ids.span_id(), || {
            self.inner.tracer.build_with_context(builder, &parent)
        });
        otel.end_with_timestamp(self.ends[i]);
    }

    /// Exports the spans still waiting for a launch that never came.
    fn finish(mut self) {
        for i in 0..self.spans.len() {
            self.export(i);
        }
    }
}

/// A host time (`CLOCK_BOOTTIME`) on the wall clock.
fn to_wall(boottime_ns: u64, realtime_offset_ns: i64) -> SystemTime {
    let ns = (i128::from(boottime_ns) + i128::from(realtime_offset_ns)).max(0);
    UNIX_EPOCH + Duration::from_nanos(ns as u64)
}

/// A field as the capture keeps it (text) with the type it was recorded
/// with, where the text says: an integer, a boolean or a float written as
/// Rust writes them (`5`, `true`, `1.5`), else a string. `gpu.launch_id`
/// then goes out an integer, as on the kernel span.
pub(crate) fn typed(text: &str) -> Value {
    if let Ok(i) = text.parse::<i64>() {
        if i.to_string() == text {
            return Value::I64(i);
        }
    }
    match text {
        "true" => return Value::Bool(true),
        "false" => return Value::Bool(false),
        _ => {}
    }
    if let Ok(f) = text.parse::<f64>() {
        if f.is_finite() && format!("{f:?}") == text {
            return Value::F64(f);
        }
    }
    Value::String(text.to_string().into())
}

impl Inner {
    /// Hands a replayed batch to the conversion thread, once fewer than
    /// [`IN_FLIGHT`] wait there (until the give-up); dropped and counted
    /// after the give-up or the shutdown.
    fn hand_over(&self, batch: Arc<Batch>, parent: OtelContext) {
        let bytes = super::layer::batch_bytes(&batch);
        let mut p = self.wait_for(|p| {
            let waiting = p.submitted - p.done;
            waiting < IN_FLIGHT && (waiting == 0 || p.bytes + bytes <= IN_FLIGHT_BYTES)
        });
        if self.gave_up() {
            drop(p);
            self.shared.batches_dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        p.submitted += 1;
        p.bytes += bytes;
        drop(p);
        if self.jobs.send(Job::Batch(batch, parent)).is_err() {
            let mut p = self.progress.lock();
            p.submitted -= 1;
            p.bytes -= bytes;
            self.shared.batches_dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Waits until `room` holds of the batches in flight (or none is, or the conversion
    /// thread has exited, or the export has given up), and returns them locked.
    fn wait_for(&self, room: impl Fn(&Progress) -> bool) -> parking_lot::MutexGuard<'_, Progress> {
        let mut p = self.progress.lock();
        while !room(&p) && p.submitted > p.done && !p.exited && !self.gave_up() {
            // The conversion thread notifies at each batch done; a give-up
            // in the future is waited for.
            match self.shared.give_up() {
                Some(at) => {
                    self.progress_cv.wait_until(&mut p, at);
                }
                None => self.progress_cv.wait(&mut p),
            }
        }
        p
    }

    fn gave_up(&self) -> bool {
        self.shared.stopped.load(Ordering::Acquire) || self.shared.given_up()
    }
}
