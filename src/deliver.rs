//! Delivery: every [`Batch`] to every [`BatchSink`] in the subscriber, and
//! plain `tracing` spans for the layers that are not sinks.
//!
//! A profiled launch (or a replayed one) reaches the subscriber as one
//! [`Batch`]. [`deliver`] hands it over in two ways:
//!
//! - **In bulk, to every sink.** [`deliver`] finds each [`BatchSink`] in the
//!   dispatcher and gives it the whole batch at once: no per-event `tracing`
//!   dispatch. Ours are [`crate::perfetto::PerfettoLayer`] and, with feature
//!   `otlp`, `crate::otlp::OtlpLayer`; a sink of your own is found the same way
//!   once it is in the subscriber as a [`SinkLayer`] (or, if it is a layer
//!   already, answers `downcast_raw` through a [`SinkHandle`]). This module
//!   names no sink.
//! - **As plain spans, to any other layer.** If the subscriber enables the target
//!   [`DEVICE_TARGET`] (`"tracing_gpu::device"`) at `TRACE`, every device event
//!   also becomes one ordinary span, so that `fmt`, `tracing-opentelemetry`, or a
//!   layer of your own sees it. This path costs one `tracing` span per event
//!   (several times the bulk path). A filter at `DEBUG` or above leaves it off;
//!   `EnvFilter::new("info,tracing_gpu::device=trace")` turns it on. An
//!   *unfiltered* subscriber enables everything at `TRACE`, this path included:
//!   when only our layers read device events, filter it out,
//!   `EnvFilter::new("trace,tracing_gpu::device=off")`.
//!
//! # The fields of a device span
//!
//! Every device event becomes a span named `"gpu.event"` with target
//! `"tracing_gpu::device"` and level `TRACE`, parented to the launch's host span
//! (the one `gpu_profile!` opens; a root span if there is none). The span is
//! created and closed on the profiler's collector thread, after the kernel has
//! finished: its own open and close times are *not* the device times. Those are
//! in the fields:
//!
//! | field | type | meaning |
//! |---|---|---|
//! | `otel.name` | str | the event's name (so `tracing-opentelemetry` names the span after it) |
//! | `gpu.event` | str | the event's name from the registry (`"event 7"` for an unknown id) |
//! | `gpu.event_id` | u64 | the event type id the kernel wrote |
//! | `gpu.kind` | str | `"range"` or `"instant"` |
//! | `gpu.device` | u64 | CUDA device ordinal |
//! | `gpu.sm` | u64 | `%smid` of the warp at its first event |
//! | `gpu.block` | u64 | linear block index (`x + y·gx + z·gx·gy`) |
//! | `gpu.warp` | u64 | warp index within the block |
//! | `gpu.start_ns` | u64 | start on the host trace clock (`CLOCK_BOOTTIME`, ns) |
//! | `gpu.end_ns` | u64 | end on the host trace clock (equals `gpu.start_ns` for an instant) |
//! | `gpu.payload` | u64 | the user payload the kernel wrote (a k-tile index, a byte count) |
//! | `gpu.payload.name` | str | what the payload is, if the event's type declares it ([`EventRegistry::with_payload`](crate::registry::EventRegistry::with_payload), `"k_tile"`); absent otherwise |
//! | `gpu.kernel` | str | the launch's name, as given to `gpu_profile!` |
//! | `gpu.launch_id` | u64 | the launch id (unique in the process) |
//! | `thread.name` | str | the synthetic thread, `"GPU 0 / SM 12 / block 7 warp 3"` |
//!
//! A warp whose slot overflowed adds one `TRACE` event (not a span) under the
//! same target, `"gpu.dropped"`, with `gpu.device`, `gpu.sm`, `gpu.block`,
//! `gpu.warp`, `gpu.dropped` (the count) and `thread.name`.
//!
//! # The launch span
//!
//! [`LaunchInfo::parent`](crate::batch::LaunchInfo::parent) is the id of the host span that wraps the launch. Span
//! ids are reused once a span closes, so the profiler keeps that span open until
//! its batch has been delivered: during [`BatchSink::on_batch`] the id names the
//! launch span and nothing else. A sink that needs the parent must look it up
//! there, not later on a writer thread.
//!
//! # How sinks are found
//!
//! `tracing` finds a layer in a subscriber by `downcast_raw`, and a stack of
//! layers answers with the *first* layer that claims a type. One marker type
//! for every sink would find one sink only. So each sink takes a slot of its
//! own when it is made, one of [`MAX_SINKS`], and answers for the marker type
//! of that slot alone (`Slot<N>`, a distinct type for each `N`); [`deliver`]
//! asks for the marker of every slot in use. This sees through `Layered`,
//! `Filtered`, `Option`, `Vec` and `Box<dyn Layer>`, which forward
//! `downcast_raw`; `tracing_subscriber::reload` does not, so a sink behind it is
//! not found. The cost is one downcast per live sink and batch.

use std::any::TypeId;
use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tracing::{Dispatch, Subscriber};
use tracing_subscriber::layer::Layer;

use crate::batch::{thread_name, Batch, BatchSink, DEVICE_TARGET};
use crate::format::EventKind;
use crate::registry::unknown_event_name;

/// How many sinks may be alive at once in a process (in all subscribers
/// together). [`SinkHandle::new`] fails past it.
pub const MAX_SINKS: usize = 128;

/// The marker a sink in slot `N` answers for: a distinct `TypeId` per slot.
/// A pointer to a sink's `Arc<dyn BatchSink>` is handed out as one of these.
#[repr(transparent)]
struct Slot<const N: usize>(Arc<dyn BatchSink>);

/// Finds the sink in slot `N` of a dispatcher, if it is there.
fn probe<const N: usize>(dispatch: &Dispatch) -> Option<&Arc<dyn BatchSink>> {
    dispatch.downcast_ref::<Slot<N>>().map(|s| &s.0)
}

/// The `TypeId` of slot `N`'s marker.
fn marker<const N: usize>() -> TypeId {
    TypeId::of::<Slot<N>>()
}

type Probe = fn(&Dispatch) -> Option<&Arc<dyn BatchSink>>;

/// One `(marker, probe)` pair per slot: a const generic cannot be picked at
/// run time, so every slot's pair is instantiated here.
macro_rules! slots {
    ($($n:literal)*) => {
        const MARKERS: [fn() -> TypeId; MAX_SINKS] = [$(marker::<$n>),*];
        const PROBES: [Probe; MAX_SINKS] = [$(probe::<$n>),*];
    };
}
slots!(
    0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31
    32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63
    64 65 66 67 68 69 70 71 72 73 74 75 76 77 78 79 80 81 82 83 84 85 86 87 88 89 90 91 92 93 94 95
    96 97 98 99 100 101 102 103 104 105 106 107 108 109 110 111 112 113 114 115 116 117 118 119 120 121 122 123 124 125 126 127
);

/// The slots in use, one bit each.
static IN_USE: [AtomicU64; MAX_SINKS / 64] = [AtomicU64::new(0), AtomicU64::new(0)];

/// A slot, given back when the last clone of its sink's handle is dropped.
#[derive(Debug)]
struct Taken(usize);

impl Taken {
    fn take() -> Option<Taken> {
        for (w, word) in IN_USE.iter().enumerate() {
            let mut bits = word.load(Ordering::Relaxed);
            while bits != u64::MAX {
                let free = bits.trailing_ones() as usize;
                match word.compare_exchange_weak(
                    bits,
                    bits | 1 << free,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => return Some(Taken(w * 64 + free)),
                    Err(now) => bits = now,
                }
            }
        }
        None
    }
}

impl Drop for Taken {
    fn drop(&mut self) {
        IN_USE[self.0 / 64].fetch_and(!(1 << (self.0 % 64)), Ordering::AcqRel);
    }
}

/// Every slot in use.
fn slots_in_use() -> impl Iterator<Item = usize> {
    IN_USE.iter().enumerate().flat_map(|(w, word)| {
        let mut bits = word.load(Ordering::Acquire);
        std::iter::from_fn(move || {
            (bits != 0).then(|| {
                let b = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                w * 64 + b
            })
        })
    })
}

/// More than [`MAX_SINKS`] sinks at once.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("more than {MAX_SINKS} batch sinks are alive at once")]
#[non_exhaustive]
pub struct TooManySinks;

/// What makes a [`BatchSink`] findable: a layer that is a sink holds one and
/// forwards its `downcast_raw` to [`SinkHandle::downcast_raw`]. Clones share
/// the slot; it is freed when the last one is dropped.
///
/// ```
/// use std::any::TypeId;
/// use std::sync::Arc;
/// use tracing_gpu::batch::{Batch, BatchSink};
/// use tracing_gpu::deliver::SinkHandle;
///
/// struct Counter(std::sync::atomic::AtomicU64);
/// impl BatchSink for Counter {
///     fn on_batch(&self, _: &Arc<Batch>) {
///         self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
///     }
///     fn flush(&self) {}
/// }
///
/// /// A layer that also takes batches.
/// struct MyLayer {
///     counter: Arc<Counter>,
///     handle: SinkHandle,
/// }
/// impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for MyLayer {
///     unsafe fn downcast_raw(&self, id: TypeId) -> Option<*const ()> {
///         // Safety: forwarded as `Layer::downcast_raw` requires.
///         unsafe { self.handle.downcast_raw(self, id) }
///     }
/// }
///
/// let counter = Arc::new(Counter(Default::default()));
/// let layer = MyLayer { handle: SinkHandle::new(counter.clone())?, counter };
/// # Ok::<(), tracing_gpu::deliver::TooManySinks>(())
/// ```
#[derive(Clone)]
pub struct SinkHandle {
    sink: Arc<dyn BatchSink>,
    slot: Arc<Taken>,
}

impl std::fmt::Debug for SinkHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SinkHandle")
            .field("slot", &self.slot.0)
            .finish_non_exhaustive()
    }
}

impl SinkHandle {
    /// Takes a slot for `sink`; fails if [`MAX_SINKS`] are taken.
    pub fn new(sink: Arc<dyn BatchSink>) -> Result<SinkHandle, TooManySinks> {
        let slot = Taken::take().ok_or(TooManySinks)?;
        Ok(SinkHandle {
            sink,
            slot: Arc::new(slot),
        })
    }

    /// `Layer::downcast_raw(id)` for `layer`, a layer that holds this handle
    /// and forwards its own `downcast_raw` here: `layer` itself for its own
    /// type, the sink for its slot's marker, else `None`.
    ///
    /// # Safety
    ///
    /// As for `Layer::downcast_raw`: the pointers are valid while `layer` and
    /// `self` are, and the sink's is read only by this module, as the marker
    /// type `id` names.
    pub unsafe fn downcast_raw<L: 'static>(&self, layer: &L, id: TypeId) -> Option<*const ()> {
        if id == TypeId::of::<L>() {
            Some(layer as *const L as *const ())
        } else if id == MARKERS[self.slot.0]() {
            Some(&self.sink as *const Arc<dyn BatchSink> as *const ())
        } else {
            None
        }
    }
}

/// A [`BatchSink`] as a layer: add it to the subscriber and [`deliver`] hands
/// it every batch. It sees nothing else of the subscriber.
///
/// ```
/// use std::sync::Arc;
/// use tracing_gpu::batch::{Batch, BatchSink};
/// use tracing_gpu::deliver::SinkLayer;
/// use tracing_subscriber::layer::SubscriberExt;
///
/// struct Launches;
/// impl BatchSink for Launches {
///     fn on_batch(&self, batch: &Arc<Batch>) {
///         println!("{}: {} events", batch.launch.kernel, batch.buffer.event_count());
///     }
///     fn flush(&self) {}
/// }
///
/// let subscriber = tracing_subscriber::registry().with(SinkLayer::new(Launches)?);
/// # Ok::<(), tracing_gpu::deliver::TooManySinks>(())
/// ```
#[derive(Debug)]
pub struct SinkLayer<T> {
    sink: Arc<T>,
    handle: SinkHandle,
}

/// A clone is the same sink, in the same slot.
impl<T> Clone for SinkLayer<T> {
    fn clone(&self) -> Self {
        SinkLayer {
            sink: self.sink.clone(),
            handle: self.handle.clone(),
        }
    }
}

impl<T: BatchSink + 'static> SinkLayer<T> {
    /// Wraps `sink`; fails if [`MAX_SINKS`] are taken.
    pub fn new(sink: T) -> Result<SinkLayer<T>, TooManySinks> {
        let sink = Arc::new(sink);
        let handle = SinkHandle::new(sink.clone())?;
        Ok(SinkLayer { sink, handle })
    }

    /// The sink.
    pub fn sink(&self) -> &Arc<T> {
        &self.sink
    }
}

impl<S: Subscriber, T: BatchSink + 'static> Layer<S> for SinkLayer<T> {
    unsafe fn downcast_raw(&self, id: TypeId) -> Option<*const ()> {
        // Safety: forwarded from our own `downcast_raw`.
        unsafe { self.handle.downcast_raw(self, id) }
    }
}

/// Calls `f` with every sink in `dispatch`, in slot order.
pub(crate) fn for_each_sink(dispatch: &Dispatch, mut f: impl FnMut(&Arc<dyn BatchSink>)) {
    for slot in slots_in_use() {
        if let Some(sink) = PROBES[slot](dispatch) {
            f(sink);
        }
    }
}

/// Hands `batch` to every sink in `dispatch`, then, if the subscriber asks for
/// them, emits the plain device spans (see the module docs).
///
/// The plain spans are emitted with `dispatch` as the thread's default
/// (`tracing::dispatcher::with_default`), which tracing-core cannot do from
/// inside a `tracing::dispatcher::get_default` closure (it panics there): clone
/// the dispatcher out first, `let d = get_default(|d| d.clone());`, then call
/// `deliver(&d, batch)`, as the profiler's collector does.
pub fn deliver(dispatch: &Dispatch, batch: Arc<Batch>) {
    for_each_sink(dispatch, |sink| sink.on_batch(&batch));
    if tracing::level_enabled!(tracing::Level::TRACE) {
        tracing::dispatcher::with_default(dispatch, || emit_spans(&batch));
    }
}

/// Flushes every sink in `dispatch` ([`BatchSink::flush`]).
pub fn flush(dispatch: &Dispatch) {
    for_each_sink(dispatch, |sink| sink.flush());
}

/// The fallback: one plain span per device event, under [`DEVICE_TARGET`].
/// Runs with `dispatch` as the default dispatcher.
fn emit_spans(batch: &Batch) {
    if !tracing::enabled!(target: DEVICE_TARGET, tracing::Level::TRACE) {
        return;
    }
    let device = batch.device.ordinal;
    let launch = &batch.launch;
    let parent = launch.parent.clone();
    let capture = batch.buffer.view();
    // All device spans share one callsite: once one is filtered out (by a filter
    // on span names or fields that the `enabled!` hint above could not see), so
    // is every other, and only the drop events remain to be sent.
    let mut spans_on = true;
    for slot in capture.slots() {
        let thread = thread_name(device, &slot);
        let h = &slot.header;
        for ev in slot.events() {
            if !spans_on {
                break;
            }
            let info = batch.registry.info(ev.id);
            let name = match info {
                Some(i) => Cow::Borrowed(&*i.name),
                None => Cow::Owned(unknown_event_name(ev.id)),
            };
            let span = tracing::span!(
                target: DEVICE_TARGET,
                parent: parent.clone(),
                tracing::Level::TRACE,
                "gpu.event",
                otel.name = &*name,
                gpu.event = &*name,
                gpu.event_id = ev.id as u64,
                gpu.kind = match ev.kind {
                    EventKind::Range => "range",
                    EventKind::Instant => "instant",
                },
                gpu.device = device as u64,
                gpu.sm = h.sm_first as u64,
                gpu.block = h.block_linear as u64,
                gpu.warp = h.warp as u64,
                gpu.start_ns = batch.trace_ns(ev.start_ns),
                gpu.end_ns = batch.trace_ns(ev.end_ns),
                gpu.payload = ev.payload as u64,
                gpu.payload.name = info.and_then(|i| i.payload.as_deref()),
                gpu.kernel = launch.kernel.as_str(),
                gpu.launch_id = launch.launch_id,
                thread.name = thread.as_str(),
            );
            if span.is_disabled() {
                spans_on = false;
                break;
            }
        }
        if h.drop_count > 0 {
            tracing::event!(
                target: DEVICE_TARGET,
                parent: parent.clone(),
                tracing::Level::TRACE,
                gpu.device = device as u64,
                gpu.sm = h.sm_first as u64,
                gpu.block = h.block_linear as u64,
                gpu.warp = h.warp as u64,
                gpu.dropped = h.drop_count as u64,
                thread.name = thread.as_str(),
                "gpu.dropped"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{batch, Recorder, TestSink};
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::EnvFilter;

    #[test]
    fn plain_spans_carry_the_documented_fields() {
        let rec = Recorder::default();
        let sink = TestSink::default();
        let sub = tracing_subscriber::registry()
            .with(EnvFilter::new("tracing_gpu::device=trace,info"))
            .with(rec.clone())
            .with(SinkLayer::new(sink.clone()).unwrap());
        let dispatch = Dispatch::new(sub);
        let launch_span =
            tracing::dispatcher::with_default(&dispatch, || tracing::info_span!("gemm"));
        let b = batch(0, 42, launch_span.id());
        deliver(&dispatch, b.clone());
        drop(launch_span);

        assert_eq!(sink.0.lock().batches, [42]);
        let seen = rec.0.lock();
        assert_eq!(seen.spans.len() as u64, b.buffer.event_count());
        assert_eq!(seen.spans.len(), 7);
        assert!(seen.parents.iter().all(|p| p.as_deref() == Some("gemm")));
        // The first slot in index order is block 0 warp 1 (index 1).
        let first = &seen.spans[0];
        assert_eq!(first["gpu.event"], "load");
        assert_eq!(first["otel.name"], "load");
        assert_eq!(first["gpu.event_id"], "1");
        assert_eq!(first["gpu.kind"], "range");
        assert_eq!(first["gpu.device"], "0");
        assert_eq!(first["gpu.sm"], "12");
        assert_eq!(first["gpu.block"], "0");
        assert_eq!(first["gpu.warp"], "1");
        assert_eq!(first["gpu.payload"], "7");
        assert_eq!(first["gpu.payload.name"], "k_tile");
        assert_eq!(first["gpu.kernel"], "sim");
        assert_eq!(first["gpu.launch_id"], "42");
        assert_eq!(first["thread.name"], "GPU 0 / SM 12 / block 0 warp 1");
        let (s, e): (u64, u64) = (
            first["gpu.start_ns"].parse().unwrap(),
            first["gpu.end_ns"].parse().unwrap(),
        );
        // The calibration maps device ns + 1000.
        assert_eq!((s, e), (2_001_000, 2_001_500));
        let inst = &seen.spans[2];
        assert_eq!(inst["gpu.kind"], "instant");
        assert_eq!(inst["gpu.start_ns"], inst["gpu.end_ns"]);
        assert_eq!(inst["gpu.event"], "epilogue");
        assert_eq!(inst["gpu.payload"], "9");
        assert!(
            !inst.contains_key("gpu.payload.name"),
            "epilogue declares no payload name"
        );
        // Block 1 warp 0 wrote 5 records into 4 places: one dropped.
        assert_eq!(seen.events.len(), 1);
        assert_eq!(seen.events[0]["gpu.dropped"], "1");
        assert_eq!(
            seen.events[0]["thread.name"],
            "GPU 0 / SM 3 / block 1 warp 0"
        );
    }

    #[test]
    fn no_plain_spans_unless_the_target_is_enabled() {
        let rec = Recorder::default();
        let sink = TestSink::default();
        let sub = tracing_subscriber::registry()
            .with(EnvFilter::new("trace,tracing_gpu::device=off"))
            .with(rec.clone())
            .with(SinkLayer::new(sink.clone()).unwrap());
        let dispatch = Dispatch::new(sub);
        deliver(&dispatch, batch(0, 1, None));
        assert_eq!(
            sink.0.lock().batches,
            [1],
            "the bulk path does not depend on the filter"
        );
        assert!(rec.0.lock().spans.is_empty());
        assert!(rec.0.lock().events.is_empty());
    }

    #[test]
    fn a_filter_on_the_span_name_turns_the_spans_off_not_the_drops() {
        let rec = Recorder::default();
        let sub = tracing_subscriber::registry().with(rec.clone().with_filter(
            tracing_subscriber::filter::filter_fn(|m| m.name() != "gpu.event"),
        ));
        let dispatch = Dispatch::new(sub);
        deliver(&dispatch, batch(0, 1, None));
        let seen = rec.0.lock();
        assert!(seen.spans.is_empty());
        // The drop count still comes through.
        assert_eq!(seen.events.len(), 1);
    }

    #[test]
    fn without_a_launch_span_device_spans_are_roots() {
        let rec = Recorder::default();
        let sub = tracing_subscriber::registry().with(rec.clone());
        let dispatch = Dispatch::new(sub);
        deliver(&dispatch, batch(1, 5, None));
        let seen = rec.0.lock();
        assert_eq!(seen.spans.len(), 7);
        assert!(seen.parents.iter().all(Option::is_none));
        assert!(seen.spans[0]["thread.name"].starts_with("GPU 1 / "));
    }

    #[test]
    fn sinks_are_found_through_layers_and_flushed() {
        let sink = TestSink::default();
        let sub = tracing_subscriber::registry()
            .with(tracing_subscriber::fmt::layer().with_writer(std::io::sink))
            .with(
                Some(SinkLayer::new(sink.clone()).unwrap())
                    .with_filter(tracing_subscriber::filter::LevelFilter::INFO),
            );
        let dispatch = Dispatch::new(sub);
        for id in [3, 4] {
            deliver(&dispatch, batch(0, id, None));
        }
        assert_eq!(sink.0.lock().batches, [3, 4]);
        flush(&dispatch);
        assert_eq!(sink.0.lock().flushes, 1);
        // A dispatcher without our layers: nothing found, nothing breaks.
        let plain = Dispatch::new(tracing_subscriber::registry());
        deliver(&plain, batch(0, 9, None));
        assert_eq!(sink.0.lock().batches, [3, 4]);
    }
}
