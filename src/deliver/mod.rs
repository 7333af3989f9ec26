//! Delivery: every [`Batch`] to every [`BatchSink`](crate::batch::BatchSink) in the subscriber whose
//! filters let it through, and plain `tracing` spans for the layers that are
//! not sinks.
//!
//! A profiled launch (or a replayed one) reaches the subscriber as one
//! [`Batch`]; a streamed launch as one per part, as they are drained, each
//! with its part's events only ([`LaunchInfo::part`](crate::batch::LaunchInfo::part)): each is
//! delivered as any batch is, its gate, its plain spans and their limit its
//! own. The profiler (or the replay) hands a batch over in two ways:
//!
//! - **In bulk, to every sink.** Delivery finds each [`BatchSink`](crate::batch::BatchSink) in the
//!   dispatcher and gives it the whole batch at once: no per-event `tracing`
//!   dispatch. Ours are [`crate::perfetto::PerfettoLayer`] and, with feature
//!   `otlp`, `crate::otlp::OtlpLayer`; a sink of your own is found the same way
//!   once it is in the subscriber as a [`SinkLayer`] (or, if it is a layer
//!   already, holds a [`SinkHandle`]). This module names no sink.
//! - **As plain spans, to any other layer**, if the subscriber enables target
//!   [`DEVICE_TARGET`](crate::batch::DEVICE_TARGET) at `TRACE`: every device event becomes one ordinary span,
//!   so that `fmt`, `tracing-opentelemetry`, or a layer of your own sees it
//!   (within [`FALLBACK_SPAN_BUDGET`], per 5 s for the whole process). This path costs one `tracing` span
//!   per event, several times the bulk path, and its spans are made on the
//!   delivering thread after the kernel has finished (see below).
//!
//! # Filters
//!
//! Device data obeys the subscriber's filters, global and per layer, at two
//! levels of target [`DEVICE_TARGET`](crate::batch::DEVICE_TARGET) (`"tracing_gpu::device"`):
//!
//! | level | what it lets through |
//! |---|---|
//! | `INFO` | whole batches to the sinks: a sink gets a batch if the filters let the gate event `"gpu.batch"` (parented to the launch span, with `gpu.launch_id`, `gpu.kernel`, `gpu.device`) through to it. The event is emitted only where the filters decide per event or per layer; see below |
//! | `TRACE` | also the plain spans, one per device event |
//!
//! So `RUST_LOG=warn` sends no device data anywhere; `info` (the usual setting)
//! sends whole batches to the sinks and no plain spans; a per-layer filter
//! that disables `tracing_gpu::device` keeps batches from that one sink;
//! `info,tracing_gpu::device=trace` adds the plain spans.
//!
//! Filters that decide once per callsite (`EnvFilter` without span or field
//! directives, `Targets`, `LevelFilter`, per layer or global) let `tracing`
//! cache the gate's interest. Where it is *always* and the subscriber holds
//! every sink of the process, every sink gets the batch and no event is
//! emitted: a `fmt` layer at `info` prints nothing per launch. Otherwise (a
//! per-layer filter that keeps the device target from some layer, a
//! `filter_fn`, a sink this subscriber cannot find, a second subscriber with
//! sinks) the gate event is emitted for each batch, and `fmt` prints it.
//!
//! An *unfiltered*
//! subscriber enables everything, plain spans included: give it a filter
//! (`EnvFilter::new("info")`, or `"trace,tracing_gpu::device=info"` to keep
//! your own `TRACE` spans).
//!
//! # The fields of a device span
//!
//! Every device event becomes a span named `"gpu.event"` with target
//! `"tracing_gpu::device"` and level `TRACE`, parented to the launch's host span
//! (the one `gpu_profile!` opens; a root span if there is none). The span is
//! created and closed on the profiler's collector thread, after the kernel has
//! finished: its own open and close times are *not* the device times (they are
//! milliseconds later, and as long as a span takes to make). The device times
//! are in the fields. Numbers are `i64`, so that every layer keeps them as
//! numbers:
//!
//! | field | type | meaning |
//! |---|---|---|
//! | `otel.name` | str | the event's name (so `tracing-opentelemetry` names the span after it) |
//! | `gpu.event` | str | the event's name from the registry (`"event 7"` for an unknown id) |
//! | `gpu.event_id` | i64 | the event type id the kernel wrote |
//! | `gpu.kind` | str | `"range"` or `"instant"` |
//! | `gpu.device` | i64 | CUDA device ordinal |
//! | `gpu.sm` | i64 | `%smid` of the warp at its first event |
//! | `gpu.block` | i64 | linear block index (`x + y·gx + z·gx·gy`) |
//! | `gpu.warp` | i64 | warp index within the block |
//! | `gpu.start_ns` | i64 | start on the host trace clock (`CLOCK_BOOTTIME`, ns) |
//! | `gpu.end_ns` | i64 | end on the host trace clock (equals `gpu.start_ns` for an instant) |
//! | `gpu.payload` | i64 | the user payload the kernel wrote (a k-tile index, a byte count) |
//! | `gpu.payload.name` | str | what the payload is, if the event's type declares it ([`EventRegistry::with_payload`](crate::registry::EventRegistry::with_payload), `"k_tile"`); absent otherwise |
//! | `gpu.kernel` | str | the launch's name, as given to `gpu_profile!` |
//! | `gpu.launch_id` | i64 | the launch id (unique in the process) |
//! | `gpu.thread` | str | the synthetic thread, `"GPU 0 / SM 12 / block 7 warp 3"` (not `thread.name`, which layers such as `tracing-opentelemetry` set to the real thread) |
//!
//! A warp that lost events (`Slot::events_lost`) adds one `TRACE` event (not a span) under the
//! same target, `"gpu.events_lost"`, with `gpu.device`, `gpu.sm`, `gpu.block`,
//! `gpu.warp`, `gpu.events_lost` (the count), `gpu.kernel`, `gpu.launch_id` and
//! `gpu.thread`. A batch that the budget ([`FALLBACK_SPAN_BUDGET`]) cut short
//! adds one `"gpu.fallback_truncated"` event with `gpu.events` and `gpu.emitted`.
//!
//! # The launch span
//!
//! [`LaunchInfo::parent`](crate::batch::LaunchInfo::parent) is the id of the host span that wraps the launch. Span
//! ids are reused once a span closes, so the profiler keeps that span open until
//! its batch has been delivered: during [`BatchSink::on_batch`](crate::batch::BatchSink::on_batch) the id names the
//! launch span and nothing else. A sink that needs the parent must look it up
//! there, not later on a writer thread.
//!
//! # How sinks are found
//!
//! `tracing` finds a layer in a subscriber by `downcast_raw`, and a stack of
//! layers answers with the *first* layer that claims a type. One marker type
//! for every sink would find one sink only. So each sink takes a slot of its
//! own when it is made, one of [`MAX_SINKS`], and answers for the marker type
//! of that slot alone (`Slot<N>`, a distinct type for each `N`); flushing
//! asks for the marker of every slot in use. This sees through `Layered`,
//! `Filtered`, `Option`, `Vec` and `Box<dyn Layer>`, which forward
//! `downcast_raw`. Delivery itself needs no downcast: each sink that sees
//! the batch's gate event hands itself over then, through any layer that
//! forwards events, `tracing_subscriber::reload` included, by marking its
//! slot (where the gate's interest decides alone, delivery takes the slots
//! found by downcast and behind `reload`); delivery returns those slots, so that a caller that flushes later
//! (the profiler) keeps them instead of looking again. Flushing asks by
//! downcast, and for a sink behind `reload` (which does not forward
//! `downcast_raw`) by what the sink learnt in `Layer::on_register_dispatch`
//! ([`SinkHandle::on_register_dispatch`]): the subscriber's
//! `tracing_subscriber::Registry`. The cost is a downcast per sink per batch,
//! or one event (the gate) per batch.
//!
//! # Where each part lives
//!
//! The gate (`gate.rs`), the slots and their markers (`slots.rs`), the sinks
//! behind `reload` (`reload.rs`), the handle a sink holds (`handle.rs`), the
//! plain spans (`spans.rs`), a watchdog's snapshot beside its event (`watched.rs`); the
//! delivery itself is here.

mod error;
mod gate;
mod handle;
mod reload;
mod slots;
mod spans;
pub(crate) mod watched;

use std::sync::Arc;

use tracing::Dispatch;

use crate::batch::Batch;

pub use error::TooManySinks;
pub use handle::{SinkHandle, SinkLayer};
#[cfg(feature = "otlp")]
pub(crate) use slots::holds;
#[doc(hidden)]
pub use slots::Reached;
pub use slots::MAX_SINKS;
pub use spans::FALLBACK_SPAN_BUDGET;

/// Hands `batch` to every sink in `dispatch` that the subscriber's filters let
/// it reach (see [the module docs](self#filters)), then, if the subscriber asks
/// for them, emits the plain device spans. Returns the sinks it reached, so
/// that a caller that flushes them later need not look for them again.
///
/// The gate event and the plain spans are emitted with `dispatch` as the
/// thread's default (`tracing::dispatcher::with_default`), which tracing-core
/// cannot do from inside a `tracing::dispatcher::get_default` closure (it
/// panics there): clone the dispatcher out first, `let d = get_default(|d|
/// d.clone());`, then call `deliver(&d, batch)`, as the profiler's collector does.
///
/// Not API: the profiler and the replay call it, and the tests and benchmarks
/// that drive delivery; a sink needs only to be in the subscriber.
#[doc(hidden)]
pub fn deliver(dispatch: &Dispatch, batch: Arc<Batch>) -> Reached {
    tracing::dispatcher::with_default(dispatch, || {
        let reached = gate::pass(dispatch, &batch);
        for sink in reached.sinks() {
            sink.on_batch(&batch);
        }
        if tracing::level_enabled!(tracing::Level::TRACE) {
            spans::emit_spans(&batch);
        }
        reached
    })
}

/// Flushes every sink in `dispatch` ([`BatchSink::flush`](crate::batch::BatchSink::flush)).
/// Not API, as `deliver` is not.
#[doc(hidden)]
pub fn flush(dispatch: &Dispatch) {
    slots::for_each_sink(dispatch, |sink| sink.flush());
}

#[cfg(test)]
mod tests;
