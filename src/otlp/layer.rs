//! [`OtlpLayer`]: host spans as OpenTelemetry spans, batches handed to the conversion thread, and [`OtlpGuard`].

use std::any::TypeId;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use opentelemetry::trace::{SpanBuilder, SpanKind, TraceContextExt, Tracer as _};
use opentelemetry::{Context as OtelContext, KeyValue};
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use parking_lot::{Condvar, Mutex, ReentrantMutex};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Dispatch, Subscriber};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::registry::{LookupSpan, SpanRef};

use super::settings::Detail;
use super::settings::HostSpans;
use super::settings::PhaseGroup;
use super::state::ExportState;
use super::state::OtlpStats;
use crate::batch::{Batch, BatchSink, DEVICE_TARGET};
use crate::deliver::SinkHandle;

// --------------------------------------------------------------------------
// The layer.

pub(crate) const MODE_UNKNOWN: u8 = 0;
pub(crate) const MODE_STANDALONE: u8 = 1;
pub(crate) const MODE_JOINED: u8 = 2;

/// Looks a span up in the subscriber the layer was added to (monomorphized in
/// [`Layer::on_layer`], where that subscriber's type is known).
pub(crate) type Lookup = fn(&Inner, &Dispatch, &Id) -> Option<OtelContext>;

pub(crate) struct Inner {
    pub(crate) tracer: SdkTracer,
    pub(crate) provider: SdkTracerProvider,
    pub(crate) shared: Arc<ExportState>,
    pub(crate) detail: Detail,
    pub(crate) phase_group: PhaseGroup,
    pub(crate) host_spans: HostSpans,
    /// [`HostSpans::Auto`]'s finding: `MODE_*`.
    pub(crate) mode: AtomicU8,
    /// Serializes the creation of a host span's OpenTelemetry span, so that two
    /// threads never create two for one span (reentrant: creating a span may
    /// emit tracing events).
    pub(crate) materialize: ReentrantMutex<()>,
    pub(crate) lookup: OnceLock<Lookup>,
    /// A `tracing_opentelemetry` layer sits below this one, by the name of
    /// its type ([`Layer::on_layer`]): of any release, ours or another.
    pub(crate) otel_below: AtomicBool,
    /// The slot of the layer's [`SinkHandle`]: how a dispatcher is checked to
    /// be ours ([`Inner::learn_dispatch`]).
    pub(crate) slot: OnceLock<usize>,
    pub(crate) jobs: SyncSender<Job>,
    pub(crate) progress: Mutex<Progress>,
    pub(crate) progress_cv: Condvar,
    /// Bounds flushes and the shutdown.
    pub(crate) shutdown_timeout: Duration,
}

#[derive(Default)]
pub(crate) struct Progress {
    pub(crate) submitted: u64,
    pub(crate) done: u64,
    /// Bytes of the decoded buffers submitted and not yet done.
    pub(crate) bytes: u64,
    pub(crate) exited: bool,
}

pub(crate) enum Job {
    Batch(Arc<Batch>, OtelContext),
    Stop,
}

/// The `tracing` layer and [`BatchSink`] that ships spans over OTLP. See the
/// [module docs](super). Built by [`OtlpLayer::builder`].
pub struct OtlpLayer {
    pub(crate) inner: Arc<Inner>,
    pub(crate) sink: SinkHandle,
}

impl fmt::Debug for OtlpLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OtlpLayer")
            .field("detail", &self.inner.detail)
            .field("phase_group", &self.inner.phase_group)
            .field("host_spans", &self.inner.host_spans)
            .field("stats", &self.inner.shared.stats())
            .finish()
    }
}

impl OtlpLayer {
    /// What happened to the spans so far.
    pub fn stats(&self) -> OtlpStats {
        self.inner.shared.stats()
    }
}

impl Inner {
    /// The subscriber the layer sits in, if known yet.
    fn dispatch(&self) -> Option<Dispatch> {
        self.shared.dispatch.get()?.upgrade()
    }

    /// Learns the subscriber the layer sits in where
    /// [`Layer::on_register_dispatch`] did not tell it: `Option<OtlpLayer>` and
    /// `Vec<…>` do not forward that call (tracing-subscriber 0.3), though they
    /// forward `downcast_raw`. The thread's default dispatcher is taken if it
    /// holds this layer's sink. Inside a `tracing` call that is still
    /// choosing its dispatcher (a span being created under a scoped default)
    /// the default reads as "none", so this is tried again at every span
    /// entered or closed, and at every batch.
    fn learn_dispatch(&self) {
        if self.shared.dispatch.get().is_some() {
            return;
        }
        let Some(&slot) = self.slot.get() else { return };
        let current = tracing::dispatcher::get_default(Dispatch::clone);
        if crate::deliver::holds(&current, slot, self as *const Inner as *const ()) {
            let _ = self.shared.dispatch.set(current.downgrade());
        }
    }

    /// Counts a host span exported, or a batch converted, before the layer
    /// found its subscriber: it may duplicate the span of a
    /// `tracing-opentelemetry` layer, or hang the device spans under no launch
    /// span. Warned about at the next flush ([`Inner::log_unjoined`]).
    fn unjoined(&self) {
        self.shared.unjoined.fetch_add(1, Ordering::Relaxed);
    }

    /// Warns once if [`Inner::unjoined`] counted anything.
    pub(crate) fn log_unjoined(&self) {
        let n = self.shared.unjoined.load(Ordering::Relaxed);
        if n == 0 || self.shared.unjoined_warned.swap(true, Ordering::AcqRel) {
            return;
        }
        self.shared.emit(|| {
            tracing::warn!(
                target: super::state::LOG_TARGET,
                unjoined = n,
                "the OTLP layer did not find its subscriber for {n} host spans or launches: \
                 they may duplicate tracing-opentelemetry's spans, and device spans may not \
                 hang under their launch span (OtlpStats::unjoined). tracing-subscriber \
                 passes neither on_register_dispatch nor downcast_raw through `reload` \
                 around an `Option` or `Vec`, or an `Option` or `Vec` around `reload`: \
                 put the OtlpLayer in the reload handle unwrapped, or choose \
                 HostSpans::Export or Skip (docs/subscriber.md)"
            )
        });
    }

    /// Warns once per process if host spans were exported beside a
    /// `tracing-opentelemetry` of another release ([`OtlpStats::foreign_otel`]).
    pub(crate) fn log_foreign_otel(&self) {
        static WARNED: AtomicBool = AtomicBool::new(false);
        let n = self.shared.foreign_otel.load(Ordering::Relaxed);
        if n == 0 || WARNED.swap(true, Ordering::AcqRel) {
            return;
        }
        self.shared.emit(|| {
            tracing::warn!(
                target: super::state::LOG_TARGET,
                foreign_otel = n,
                "a tracing-opentelemetry layer is in the subscriber, but not the release \
                 the OTLP layer joins (tracing-opentelemetry {JOINS_TRACING_OPENTELEMETRY} \
                 with opentelemetry {JOINS_OPENTELEMETRY}): it cannot read that layer's \
                 spans, so it exports the host spans too, in a trace of their own \
                 ({n} so far, OtlpStats::foreign_otel). Use those releases to join, or \
                 choose HostSpans::Skip (docs/subscriber.md)"
            )
        });
    }

    fn exports_host_spans(&self) -> bool {
        match self.host_spans {
            HostSpans::Export => true,
            HostSpans::Skip => false,
            HostSpans::Auto => self.mode.load(Ordering::Acquire) != MODE_JOINED,
        }
    }

    /// The context `tracing-opentelemetry` holds for span `id`, if a
    /// `tracing_opentelemetry` layer is in the subscriber and knows the span.
    /// `reliable`: every layer has seen the span's creation, so an answer of
    /// "none" means there is no such layer.
    fn joined_context(&self, id: &Id, reliable: bool) -> Option<OtelContext> {
        if self.host_spans == HostSpans::Export
            || self.mode.load(Ordering::Acquire) == MODE_STANDALONE
        {
            return None;
        }
        let dispatch = self.dispatch()?;
        let cx = tracing_opentelemetry::get_otel_context(id, &dispatch)
            .filter(|cx| cx.span().span_context().is_valid());
        if cx.is_some() {
            self.mode.store(MODE_JOINED, Ordering::Release);
        } else if reliable {
            let _ = self.mode.compare_exchange(
                MODE_UNKNOWN,
                MODE_STANDALONE,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
        cx
    }

    /// The OpenTelemetry context of host span `span`, creating our
    /// OpenTelemetry span for it if we export it. `None` for spans we ignore.
    fn materialize<S>(&self, span: &SpanRef<'_, S>, reliable: bool) -> Option<OtelContext>
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        let _serial = self.materialize.lock();
        let start = {
            let ext = span.extensions();
            let host = ext.get::<HostSpan>()?;
            if let Some(cx) = &host.cx {
                return Some(cx.clone());
            }
            host.start
        };
        // The registry keeps a span's parent until its last child closes, so
        // the parent is still there, and asked for only now: by then the
        // layer may have learnt its subscriber (see `learn_dispatch`).
        let parent = span.parent().and_then(|p| self.materialize(&p, true));
        let (cx, owned) = if let Some(cx) = self.joined_context(&span.id(), reliable) {
            (cx, false)
        } else if self.exports_host_spans() {
            if self.host_spans == HostSpans::Auto && self.shared.dispatch.get().is_none() {
                self.unjoined();
            }
            // A tracing-opentelemetry layer below, and no span of it joined:
            // another release, whose host spans we cannot read.
            if self.host_spans == HostSpans::Auto
                && self.otel_below.load(Ordering::Relaxed)
                && self.mode.load(Ordering::Acquire) == MODE_STANDALONE
            {
                self.shared.foreign_otel.fetch_add(1, Ordering::Relaxed);
            }
            let parent = parent.unwrap_or_default();
            let builder = SpanBuilder::from_name(span.name())
                .with_kind(SpanKind::Internal)
                .with_start_time(start);
            let otel = self.tracer.build_with_context(builder, &parent);
            (parent.with_span(otel), true)
        } else {
            // Not exported by anyone we know of: its children hang under its parent.
            return parent;
        };
        let mut ext = span.extensions_mut();
        let host = ext.get_mut::<HostSpan>()?;
        host.cx = Some(cx.clone());
        host.owned = owned;
        Some(cx)
    }

    /// The parent context for a batch's spans: the launch span's. The profiler
    /// keeps that span open until [`BatchSink::on_batch`] returns (see
    /// [`crate::deliver`]), so its id is looked up now, on the caller's thread.
    fn launch_context(&self, batch: &Batch) -> OtelContext {
        let Some(id) = &batch.launch.parent else {
            return OtelContext::new();
        };
        self.learn_dispatch();
        let (Some(lookup), Some(dispatch)) = (self.lookup.get(), self.dispatch()) else {
            self.unjoined();
            return OtelContext::new();
        };
        lookup(self, &dispatch, id).unwrap_or_default()
    }
}

pub(crate) fn lookup_launch<S>(inner: &Inner, dispatch: &Dispatch, id: &Id) -> Option<OtelContext>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    let span = dispatch.downcast_ref::<S>()?.span(id)?;
    inner.materialize(&span, true)
}

/// What the layer keeps in each host span's extensions.
pub(crate) struct HostSpan {
    pub(crate) start: SystemTime,
    pub(crate) attributes: Vec<KeyValue>,
    /// Set once materialized: our span's context, or `tracing-opentelemetry`'s.
    pub(crate) cx: Option<OtelContext>,
    /// Whether `cx` holds a span we created and must end.
    pub(crate) owned: bool,
}

impl HostSpan {
    fn set(&mut self, kv: KeyValue) {
        match self.attributes.iter_mut().find(|a| a.key == kv.key) {
            Some(old) => *old = kv,
            None => self.attributes.push(kv),
        }
    }
}

impl Visit for HostSpan {
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.set(KeyValue::new(field.name(), value));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.set(KeyValue::new(field.name(), value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.set(match i64::try_from(value) {
            Ok(v) => KeyValue::new(field.name(), v),
            Err(_) => KeyValue::new(field.name(), value.to_string()),
        });
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.set(KeyValue::new(field.name(), value));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.set(KeyValue::new(field.name(), value.to_string()));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.set(KeyValue::new(field.name(), format!("{value:?}")));
    }
}

/// The releases joined mode reads host spans from: the `tracing-opentelemetry`
/// and `opentelemetry` this crate is built with (Cargo.toml).
pub(crate) const JOINS_TRACING_OPENTELEMETRY: &str = "0.34";
pub(crate) const JOINS_OPENTELEMETRY: &str = "0.33";

/// A watchdog's snapshot of a launch still running (issue #32) marks its launch span,
/// the event's parent: `gpu.unfinished = true` and the snapshot's text as
/// `gpu.watchdog`, the latest one if several came.
fn mark_unfinished<S>(event: &tracing::Event<'_>, ctx: &Context<'_, S>)
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    struct Message(Option<String>);
    impl Visit for Message {
        fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
            if field.name() == "message" {
                self.0 = Some(format!("{value:?}"));
            }
        }
    }
    let Some(span) = event.parent().and_then(|id| ctx.span(id)) else {
        return;
    };
    let mut message = Message(None);
    event.record(&mut message);
    let mut extensions = span.extensions_mut();
    if let Some(host) = extensions.get_mut::<HostSpan>() {
        host.set(KeyValue::new("gpu.unfinished", true));
        host.set(KeyValue::new("gpu.watchdog", message.0.unwrap_or_default()));
    }
}

/// Crates whose spans are never exported: the exporter's own, whose spans
/// would feed it its own traffic, and the per-event fallback.
pub(crate) fn ignored_target(target: &str) -> bool {
    let krate = target.split("::").next().unwrap_or(target);
    matches!(
        krate,
        "h2" | "hyper"
            | "hyper_util"
            | "tonic"
            | "tower"
            | "tower_http"
            | "reqwest"
            | "opentelemetry"
            | "opentelemetry_sdk"
            | "opentelemetry_otlp"
            | "opentelemetry_http"
    ) || target == DEVICE_TARGET
}

pub(crate) fn wall_now() -> SystemTime {
    SystemTime::now()
}

impl<S> Layer<S> for OtlpLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    unsafe fn downcast_raw(&self, id: TypeId) -> Option<*const ()> {
        // Safety: forwarded from our own `downcast_raw`.
        unsafe { self.sink.downcast_raw(self, id) }
    }

    fn on_event(&self, event: &tracing::Event<'_>, ctx: Context<'_, S>) {
        if event.metadata().target() == crate::watch::TARGET {
            mark_unfinished(event, &ctx);
        }
        // The batch's gate (deliver.rs): our filters let it through.
        self.sink.on_event(event);
    }

    fn on_register_dispatch(&self, dispatch: &Dispatch) {
        let _ = self.inner.shared.dispatch.set(dispatch.downgrade());
        self.sink.on_register_dispatch(dispatch);
    }

    fn on_layer(&mut self, _subscriber: &mut S) {
        let _ = self.inner.lookup.set(lookup_launch::<S>);
        // Two releases of tracing-opentelemetry (one the application's, one
        // ours) have types of the same name, and a layer of the other one is
        // found by no downcast of ours: its type's name is what tells that
        // one sits below.
        if std::any::type_name::<S>().contains("tracing_opentelemetry::") {
            self.inner.otel_below.store(true, Ordering::Relaxed);
        }
    }

    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let meta = attrs.metadata();
        if ignored_target(meta.target()) {
            return;
        }
        let Some(span) = ctx.span(id) else { return };
        self.inner.learn_dispatch();
        let mut host = HostSpan {
            start: wall_now(),
            attributes: Vec::with_capacity(meta.fields().len() + 3),
            cx: None,
            owned: false,
        };
        if let Some(name) = std::thread::current().name() {
            host.attributes
                .push(KeyValue::new("thread.name", name.to_string()));
        }
        if let Some(file) = meta.file() {
            host.attributes.push(KeyValue::new("code.file.path", file));
        }
        if let Some(line) = meta.line() {
            host.attributes
                .push(KeyValue::new("code.line.number", i64::from(line)));
        }
        attrs.record(&mut host);
        span.extensions_mut().insert(host);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            if let Some(host) = span.extensions_mut().get_mut::<HostSpan>() {
                values.record(host);
            }
        }
    }

    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        self.inner.learn_dispatch();
        // Entered: every layer has seen the span, so this is where Auto decides.
        if self.inner.host_spans != HostSpans::Auto
            || self.inner.mode.load(Ordering::Acquire) != MODE_UNKNOWN
        {
            return;
        }
        if let Some(span) = ctx.span(id) {
            self.inner.materialize(&span, true);
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        if span.extensions().get::<HostSpan>().is_none() {
            return;
        }
        self.inner.learn_dispatch();
        if self.inner.exports_host_spans() {
            // Not reliable: a tracing-opentelemetry layer below us may have
            // closed the span already.
            self.inner.materialize(&span, false);
        }
        let Some(host) = span.extensions_mut().remove::<HostSpan>() else {
            return;
        };
        if let (true, Some(cx)) = (host.owned, &host.cx) {
            let otel = cx.span();
            otel.set_attributes(host.attributes);
            otel.end_with_timestamp(wall_now());
        }
    }
}

impl BatchSink for OtlpLayer {
    fn on_batch(&self, batch: &Arc<Batch>) {
        self.inner.on_batch(batch);
    }

    fn flush(&self) {
        BatchSink::flush(&*self.inner);
    }
}

impl BatchSink for Inner {
    /// Finds the launch span's context, then hands the batch to the conversion
    /// thread; never blocks: a full batch queue drops the batch (counted).
    fn on_batch(&self, batch: &Arc<Batch>) {
        let inner = self;
        if inner.shared.stopped.load(Ordering::Acquire) {
            inner.shared.batches_dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let parent = inner.launch_context(batch);
        let mut p = inner.progress.lock();
        match inner.jobs.try_send(Job::Batch(batch.clone(), parent)) {
            Ok(()) => {
                p.submitted += 1;
                p.bytes += batch_bytes(batch);
            }
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                drop(p);
                inner.shared.batches_dropped.fetch_add(1, Ordering::Relaxed);
                inner
                    .shared
                    .warn_once("the OTLP device batch queue is full");
            }
        }
    }

    /// Converts what was handed over and exports it; bounded as
    /// [`OtlpGuard::flush`] is (the builder's `shutdown_timeout`).
    fn flush(&self) {
        let _ = self.flush_in_time("flush");
    }
}

/// The bytes a batch holds in memory while it waits for the conversion thread: its
/// decoded buffer.
pub(crate) fn batch_bytes(batch: &Batch) -> u64 {
    batch.buffer.bytes().len() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exporters_own_crates_are_not_exported() {
        for t in [
            "h2::proto",
            "hyper_util::client",
            "tonic",
            "opentelemetry_sdk",
            "reqwest::blocking",
        ] {
            assert!(ignored_target(t), "{t}");
        }
        for t in [
            "app",
            "hyperion::x",
            "tracing_gpu::cuda",
            "tracing_gpu::devices_x",
        ] {
            assert!(!ignored_target(t), "{t}");
        }
        assert!(ignored_target("tracing_gpu::device"));
    }

    #[test]
    fn the_joined_releases_named_are_those_built_with() {
        let manifest = include_str!("../../Cargo.toml");
        for (krate, release) in [
            ("tracing-opentelemetry", JOINS_TRACING_OPENTELEMETRY),
            ("opentelemetry", JOINS_OPENTELEMETRY),
        ] {
            let line = format!("\n{krate} = {{ version = \"{release}\"");
            assert!(manifest.contains(&line), "{krate} {release}");
        }
    }
}
