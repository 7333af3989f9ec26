//! [`PerfettoLayer`]: the `tracing` layer. Host spans and events are encoded
//! on the thread that makes them, into its own buffer (`state.rs`); device
//! batches go, whole, to the writer thread (`writer_thread.rs`).

use std::any::TypeId;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

use super::fields::{with_fields, SpanArgs};
use super::state::LayerState;
use crate::batch::{Batch, BatchSink, DEVICE_TARGET};
use crate::clock::HostClock;
use crate::deliver::{watched, SinkHandle};

/// A `tracing-subscriber` layer that writes a Perfetto trace: host spans on
/// their threads' tracks, device batches on GPU / SM / warp tracks.
///
/// ```no_run
/// use tracing_subscriber::prelude::*;
/// let (layer, guard) = tracing_gpu::perfetto::PerfettoLayer::builder()
///     .file("run.perfetto-trace")
///     .build()?;
/// tracing_subscriber::registry().with(layer).init();
/// tracing::info_span!("work").in_scope(|| { /* ... */ });
/// guard.finish()?; // run.perfetto-trace now exists, complete
/// # Ok::<(), tracing_gpu::perfetto::PerfettoError>(())
/// ```
///
/// Spans become slices from each enter to the matching exit, with their
/// fields as arguments; events become instants named by their message.
#[derive(Debug)]
pub struct PerfettoLayer {
    pub(super) state: Arc<LayerState>,
    pub(super) sink: SinkHandle,
}

/// The key a callsite's name is interned under: callsites are unique statics.
fn callsite(meta: &'static Metadata<'static>) -> usize {
    meta as *const Metadata<'static> as usize
}

impl<S> Layer<S> for PerfettoLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    unsafe fn downcast_raw(&self, id: TypeId) -> Option<*const ()> {
        // Safety: forwarded from our own `downcast_raw`.
        unsafe { self.sink.downcast_raw(self, id) }
    }

    fn on_register_dispatch(&self, dispatch: &tracing::Dispatch) {
        self.sink.on_register_dispatch(dispatch);
    }

    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        if attrs.metadata().target() == DEVICE_TARGET
            || attrs.values().is_empty()
            || self.state.closed.load(Ordering::Relaxed)
        {
            return;
        }
        let args = with_fields(false, |f| {
            attrs.record(f);
            SpanArgs {
                args: f.args.buf.as_slice().into(),
                launch: f.launch,
            }
        });
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(args);
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        if span.metadata().target() == DEVICE_TARGET {
            return;
        }
        // Appended straight from the scratch fields, with no copy of its own.
        with_fields(false, |f| {
            values.record(f);
            let mut ext = span.extensions_mut();
            match ext.get_mut::<SpanArgs>() {
                Some(a) => {
                    a.args.extend_from_slice(&f.args.buf);
                    a.launch = a.launch.or(f.launch);
                }
                None => ext.insert(SpanArgs {
                    args: f.args.buf.as_slice().into(),
                    launch: f.launch,
                }),
            }
        });
    }

    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        if self.state.closed.load(Ordering::Relaxed) {
            return;
        }
        let Some(span) = ctx.span(id) else { return };
        let meta = span.metadata();
        if meta.target() == DEVICE_TARGET {
            return;
        }
        let ts = HostClock::Boottime.now_ns();
        // One lock of the span's extensions (a launch span is entered once per
        // launch): the launch flow starts at the span's first slice only.
        let mut ext = span.extensions_mut();
        let (args, launch) = match ext.get_mut::<SpanArgs>() {
            Some(a) => (&a.args[..], a.launch.take()),
            None => (&[][..], None),
        };
        self.state.with_thread(|b| {
            let flow = launch.map(|l| self.state.flow_origins.start(l));
            b.host.begin(ts, callsite(meta), meta.name(), args, flow);
        });
    }

    fn on_exit(&self, id: &Id, ctx: Context<'_, S>) {
        if self.state.closed.load(Ordering::Relaxed) {
            return;
        }
        let Some(meta) = ctx.metadata(id) else { return };
        if meta.target() == DEVICE_TARGET {
            return;
        }
        let ts = HostClock::Boottime.now_ns();
        self.state.with_thread(|b| b.host.end(ts));
    }

    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let meta = event.metadata();
        if meta.target() == DEVICE_TARGET {
            // The batch's gate (deliver.rs): our filters let it through.
            self.sink.on_event(event);
            return;
        }
        if self.state.closed.load(Ordering::Relaxed) {
            return;
        }
        if let Some(watched) = watched::current(event) {
            // A watchdog's snapshot: drawn on its GPU's tracks, not the collector's.
            self.state.snapshot(watched);
            return;
        }
        let ts = HostClock::Boottime.now_ns();
        with_fields(true, |f| {
            event.record(f);
            self.state.with_thread(|b| {
                b.host
                    .instant(ts, callsite(meta), meta.name(), &f.message, &f.args.buf)
            });
        });
    }
}

impl BatchSink for PerfettoLayer {
    fn on_batch(&self, batch: &Arc<Batch>) {
        self.state.on_batch(batch);
    }

    fn flush(&self) {
        self.state.flush();
    }
}
