//! Delivery: every [`Batch`] to every [`BatchSink`] in the subscriber whose
//! filters let it through, and plain `tracing` spans for the layers that are
//! not sinks.
//!
//! A profiled launch (or a replayed one) reaches the subscriber as one
//! [`Batch`]; a streamed launch as one per part, as they are drained, each
//! with its part's events only ([`LaunchInfo::part`](crate::batch::LaunchInfo::part)): each is
//! delivered as any batch is, its gate, its plain spans and their limit its
//! own. [`deliver`] hands a batch over in two ways:
//!
//! - **In bulk, to every sink.** [`deliver`] finds each [`BatchSink`] in the
//!   dispatcher and gives it the whole batch at once: no per-event `tracing`
//!   dispatch. Ours are [`crate::perfetto::PerfettoLayer`] and, with feature
//!   `otlp`, `crate::otlp::OtlpLayer`; a sink of your own is found the same way
//!   once it is in the subscriber as a [`SinkLayer`] (or, if it is a layer
//!   already, holds a [`SinkHandle`]). This module names no sink.
//! - **As plain spans, to any other layer**, if the subscriber enables target
//!   [`DEVICE_TARGET`] at `TRACE`: every device event becomes one ordinary span,
//!   so that `fmt`, `tracing-opentelemetry`, or a layer of your own sees it (at
//!   most [`FALLBACK_SPAN_LIMIT`] per batch). This path costs one `tracing` span
//!   per event, several times the bulk path, and its spans are made on the
//!   delivering thread after the kernel has finished (see below).
//!
//! # Filters
//!
//! Device data obeys the subscriber's filters, global and per layer, at two
//! levels of target [`DEVICE_TARGET`] (`"tracing_gpu::device"`):
//!
//! | level | what it lets through |
//! |---|---|
//! | `INFO` | whole batches to the sinks: each batch first emits one event, [`GATE_EVENT`] (`"gpu.batch"`, parented to the launch span, with `gpu.launch_id`, `gpu.kernel`, `gpu.device`), and a sink gets the batch only if that event reached it |
//! | `TRACE` | also the plain spans, one per device event |
//!
//! So `RUST_LOG=warn` sends no device data anywhere; `info` (the usual setting)
//! sends whole batches to the sinks and no plain spans; a per-layer filter
//! that disables `tracing_gpu::device` keeps batches from that one sink;
//! `info,tracing_gpu::device=trace` adds the plain spans. An *unfiltered*
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
//! A warp whose slot overflowed adds one `TRACE` event (not a span) under the
//! same target, `"gpu.dropped"`, with `gpu.device`, `gpu.sm`, `gpu.block`,
//! `gpu.warp`, `gpu.dropped` (the count), `gpu.kernel`, `gpu.launch_id` and
//! `gpu.thread`. A batch with more events than [`FALLBACK_SPAN_LIMIT`] adds
//! one `"gpu.fallback_truncated"` event with `gpu.events` and `gpu.emitted`.
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
//! `downcast_raw`. [`deliver`] itself needs no downcast: each sink that sees
//! the batch's gate event hands itself over then, through any layer that
//! forwards events, `tracing_subscriber::reload` included. [`flush`] asks by
//! downcast, and for a sink behind `reload` (which does not forward
//! `downcast_raw`) by what the sink learnt in `Layer::on_register_dispatch`
//! ([`SinkHandle::on_register_dispatch`]): the subscriber's
//! `tracing_subscriber::Registry`. The cost is one event (the gate) per batch.

use std::any::TypeId;
use std::borrow::Cow;
use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use tracing::{Dispatch, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

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
        HIDDEN.lock().retain(|h| h.slot != self.0);
        IN_USE[self.0 / 64].fetch_and(!(1 << (self.0 % 64)), Ordering::AcqRel);
    }
}

/// A sink that its subscriber cannot find by downcast (it sits behind
/// `tracing_subscriber::reload`), and the subscriber it was registered with,
/// named by the address of that subscriber's `Registry`.
struct Hidden {
    slot: usize,
    registry: usize,
    sink: Weak<dyn BatchSink>,
}

/// Every [`Hidden`] sink; at most one entry per slot and subscriber.
static HIDDEN: Mutex<Vec<Hidden>> = Mutex::new(Vec::new());

/// The address of `dispatch`'s `Registry`, which names the subscriber (no
/// two live subscribers share one).
fn registry_of(dispatch: &Dispatch) -> Option<usize> {
    dispatch
        .downcast_ref::<tracing_subscriber::Registry>()
        .map(|r| r as *const tracing_subscriber::Registry as usize)
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
/// forwards its `on_event`, `on_register_dispatch` and `downcast_raw` to it. Clones share
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
///     // The three calls a sink needs, forwarded to the handle.
///     fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
///         self.handle.on_event(event);
///     }
///     fn on_register_dispatch(&self, dispatch: &tracing::Dispatch) {
///         self.handle.on_register_dispatch(dispatch);
///     }
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

    /// `Layer::on_event` for a layer that holds this handle: notes that the
    /// subscriber's filters let the current batch through to this sink (see
    /// [the module docs](self#filters)), and hands the sink to [`deliver`]. A
    /// layer of your own that holds a handle calls it from its `on_event`, or
    /// it gets no batches.
    pub fn on_event(&self, event: &tracing::Event<'_>) {
        if !is_gate(event.metadata()) {
            return;
        }
        let (word, bit) = (self.slot.0 / 64, 1 << (self.slot.0 % 64));
        let mut bits = OPEN.get();
        if bits[word] & bit != 0 {
            return; // the same sink twice in one subscriber: one batch
        }
        bits[word] |= bit;
        OPEN.set(bits);
        GATED.with(|gated| {
            if let Ok(mut gated) = gated.try_borrow_mut() {
                if let Some(gated) = gated.as_mut() {
                    gated.push(self.sink.clone());
                }
            }
        });
    }

    /// `Layer::on_register_dispatch` for a layer that holds this handle. A sink
    /// that `dispatch` cannot find by downcast (behind
    /// `tracing_subscriber::reload`) is remembered here for [`flush`]; batches
    /// reach it either way.
    pub fn on_register_dispatch(&self, dispatch: &Dispatch) {
        if self.is_in(dispatch) {
            return;
        }
        let Some(registry) = registry_of(dispatch) else {
            return;
        };
        let mut hidden = HIDDEN.lock();
        if !hidden
            .iter()
            .any(|h| h.slot == self.slot.0 && h.registry == registry)
        {
            hidden.push(Hidden {
                slot: self.slot.0,
                registry,
                sink: Arc::downgrade(&self.sink),
            });
        }
    }

    /// Whether `dispatch` holds this sink and finds it by downcast.
    pub(crate) fn is_in(&self, dispatch: &Dispatch) -> bool {
        holds(dispatch, self.slot.0, Arc::as_ptr(&self.sink) as *const ())
    }

    /// The slot this sink takes.
    #[cfg(feature = "otlp")]
    pub(crate) fn slot(&self) -> usize {
        self.slot.0
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
    fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        self.handle.on_event(event);
    }

    fn on_register_dispatch(&self, dispatch: &Dispatch) {
        self.handle.on_register_dispatch(dispatch);
    }

    unsafe fn downcast_raw(&self, id: TypeId) -> Option<*const ()> {
        // Safety: forwarded from our own `downcast_raw`.
        unsafe { self.handle.downcast_raw(self, id) }
    }
}

/// Whether `dispatch` finds, by downcast, the sink in `slot` at address `sink`.
pub(crate) fn holds(dispatch: &Dispatch, slot: usize, sink: *const ()) -> bool {
    PROBES[slot](dispatch).is_some_and(|s| Arc::as_ptr(s) as *const () == sink)
}

/// Calls `f` with every sink in `dispatch` and its slot: those found by
/// downcast, in slot order, then those behind `reload` ([`Hidden`]).
pub(crate) fn for_each_sink(dispatch: &Dispatch, mut f: impl FnMut(usize, &Arc<dyn BatchSink>)) {
    let mut found = [0u64; MAX_SINKS / 64];
    for slot in slots_in_use() {
        if let Some(sink) = PROBES[slot](dispatch) {
            found[slot / 64] |= 1 << (slot % 64);
            f(slot, sink);
        }
    }
    let Some(registry) = registry_of(dispatch) else {
        return;
    };
    let hidden: Vec<_> = HIDDEN
        .lock()
        .iter()
        .filter(|h| h.registry == registry && found[h.slot / 64] & (1 << (h.slot % 64)) == 0)
        .filter_map(|h| Some((h.slot, h.sink.upgrade()?)))
        .collect();
    for (slot, sink) in hidden {
        f(slot, &sink);
    }
}

/// The name of the event that opens each batch's way to the sinks (target
/// [`DEVICE_TARGET`], level `INFO`): a sink gets the batch only if the
/// subscriber's filters let this event through to it.
pub const GATE_EVENT: &str = "gpu.batch";

fn is_gate(meta: &tracing::Metadata<'_>) -> bool {
    meta.name() == GATE_EVENT && meta.target() == DEVICE_TARGET
}

thread_local! {
    /// The slots of the sinks that have seen the current batch's gate event.
    static OPEN: Cell<[u64; MAX_SINKS / 64]> = const { Cell::new([0; MAX_SINKS / 64]) };
    /// Those sinks, in the order the gate reached them; `Some` only while
    /// [`deliver`] emits the gate.
    static GATED: RefCell<Option<Vec<Arc<dyn BatchSink>>>> = const { RefCell::new(None) };
}

/// The most plain spans one batch becomes (see [the module docs](self#the-fields-of-a-device-span));
/// past it, one `gpu.fallback_truncated` event says how many were left out.
pub const FALLBACK_SPAN_LIMIT: usize = 4096;

/// Hands `batch` to every sink in `dispatch` that the subscriber's filters let
/// it reach (see [the module docs](self#filters)), then, if the subscriber asks
/// for them, emits the plain device spans.
///
/// The gate event and the plain spans are emitted with `dispatch` as the
/// thread's default (`tracing::dispatcher::with_default`), which tracing-core
/// cannot do from inside a `tracing::dispatcher::get_default` closure (it
/// panics there): clone the dispatcher out first, `let d = get_default(|d|
/// d.clone());`, then call `deliver(&d, batch)`, as the profiler's collector does.
pub fn deliver(dispatch: &Dispatch, batch: Arc<Batch>) {
    tracing::dispatcher::with_default(dispatch, || {
        OPEN.set([0; MAX_SINKS / 64]);
        let outer = GATED.replace(Some(Vec::new()));
        let launch = &batch.launch;
        tracing::event!(
            name: GATE_EVENT,
            target: DEVICE_TARGET,
            parent: launch.parent.clone(),
            tracing::Level::INFO,
            gpu.launch_id = launch.launch_id as i64,
            gpu.kernel = &*launch.kernel,
            gpu.device = i64::from(batch.device.ordinal),
        );
        OPEN.take();
        let sinks = GATED.replace(outer).unwrap_or_default();
        for sink in &sinks {
            sink.on_batch(&batch);
        }
        if tracing::level_enabled!(tracing::Level::TRACE) {
            emit_spans(&batch);
        }
    });
}

/// Flushes every sink in `dispatch` ([`BatchSink::flush`]).
pub fn flush(dispatch: &Dispatch) {
    for_each_sink(dispatch, |_, sink| sink.flush());
}

/// The fallback: one plain span per device event, under [`DEVICE_TARGET`], at
/// most [`FALLBACK_SPAN_LIMIT`] per batch. Runs with the batch's dispatcher as
/// the default. Numbers are recorded as `i64` (their values fit), which every
/// layer, `tracing-opentelemetry` included, keeps as numbers.
fn emit_spans(batch: &Batch) {
    if !tracing::enabled!(target: DEVICE_TARGET, tracing::Level::TRACE) {
        return;
    }
    let device = i64::from(batch.device.ordinal);
    let launch = &batch.launch;
    let launch_id = launch.launch_id as i64;
    let parent = launch.parent.clone();
    let buffer = batch.buffer.view();
    // All device spans share one callsite: once one is filtered out (by a filter
    // on span names or fields that the `enabled!` hint above could not see), so
    // is every other, and only the drop events remain to be sent.
    let mut spans_on = true;
    let mut emitted = 0usize;
    for slot in buffer.slots() {
        let thread = thread_name(batch.device.ordinal, &slot);
        let h = &slot.header;
        for ev in slot.events() {
            if !spans_on || emitted == FALLBACK_SPAN_LIMIT {
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
                gpu.event_id = i64::from(ev.id),
                gpu.kind = match ev.kind {
                    EventKind::Range => "range",
                    EventKind::Instant => "instant",
                },
                gpu.device = device,
                gpu.sm = i64::from(h.sm_first),
                gpu.block = i64::from(h.block_linear),
                gpu.warp = i64::from(h.warp),
                gpu.start_ns = batch.trace_ns(ev.start_ns) as i64,
                gpu.end_ns = batch.trace_ns(ev.end_ns) as i64,
                gpu.payload = i64::from(ev.payload),
                gpu.payload.name = info.and_then(|i| i.payload.as_deref()),
                gpu.kernel = &*launch.kernel,
                gpu.launch_id = launch_id,
                gpu.thread = thread.as_str(),
            );
            if span.is_disabled() {
                spans_on = false;
                break;
            }
            emitted += 1;
        }
        if h.drop_count > 0 {
            tracing::event!(
                name: "gpu.dropped",
                target: DEVICE_TARGET,
                parent: parent.clone(),
                tracing::Level::TRACE,
                gpu.device = device,
                gpu.sm = i64::from(h.sm_first),
                gpu.block = i64::from(h.block_linear),
                gpu.warp = i64::from(h.warp),
                gpu.dropped = i64::from(h.drop_count),
                gpu.kernel = &*launch.kernel,
                gpu.launch_id = launch_id,
                gpu.thread = thread.as_str(),
                "gpu.dropped"
            );
        }
    }
    let events = batch.buffer.event_count();
    if spans_on && emitted as u64 != events {
        tracing::event!(
            name: "gpu.fallback_truncated",
            target: DEVICE_TARGET,
            parent: parent.clone(),
            tracing::Level::TRACE,
            gpu.kernel = &*launch.kernel,
            gpu.launch_id = launch_id,
            gpu.events = events as i64,
            gpu.emitted = emitted as i64,
            "gpu.fallback_truncated"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::OwnedBuffer;
    use crate::format::BufferBuilder;
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
        assert_eq!(first["gpu.thread"], "GPU 0 / SM 12 / block 0 warp 1");
        assert!(!first.contains_key("thread.name"));
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
        let drops: Vec<_> = seen
            .events
            .iter()
            .filter(|e| e["name"] == "gpu.dropped")
            .collect();
        assert_eq!(drops.len(), 1);
        assert_eq!(drops[0]["gpu.dropped"], "1");
        assert_eq!(drops[0]["gpu.launch_id"], "42");
        assert_eq!(drops[0]["gpu.kernel"], "sim");
        assert_eq!(drops[0]["gpu.thread"], "GPU 0 / SM 3 / block 1 warp 0");
    }

    #[test]
    fn no_plain_spans_unless_the_target_is_enabled() {
        let rec = Recorder::default();
        let sink = TestSink::default();
        let sub = tracing_subscriber::registry()
            .with(EnvFilter::new("trace,tracing_gpu::device=info"))
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
        let events = &rec.0.lock().events;
        assert!(events.iter().all(|e| e["name"] == GATE_EVENT), "{events:?}");
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
        assert_eq!(
            seen.events
                .iter()
                .filter(|e| e["name"] == "gpu.dropped")
                .count(),
            1
        );
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
        assert!(seen.spans[0]["gpu.thread"].starts_with("GPU 1 / "));
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

    #[test]
    fn filters_decide_which_sinks_get_batches() {
        // A global filter below INFO for the device target: no sink gets anything.
        let sink = TestSink::default();
        let dispatch = Dispatch::new(
            tracing_subscriber::registry()
                .with(EnvFilter::new("warn"))
                .with(SinkLayer::new(sink.clone()).unwrap()),
        );
        deliver(&dispatch, batch(0, 1, None));
        assert!(
            sink.0.lock().batches.is_empty(),
            "RUST_LOG=warn exports nothing"
        );

        // Per-layer filters: one sink switched off for device data, one on.
        let (off, on) = (TestSink::default(), TestSink::default());
        let dispatch = Dispatch::new(
            tracing_subscriber::registry()
                .with(
                    SinkLayer::new(off.clone())
                        .unwrap()
                        .with_filter(EnvFilter::new("info,tracing_gpu::device=off")),
                )
                .with(
                    SinkLayer::new(on.clone())
                        .unwrap()
                        .with_filter(EnvFilter::new("info")),
                ),
        );
        deliver(&dispatch, batch(0, 2, None));
        assert!(off.0.lock().batches.is_empty());
        assert_eq!(on.0.lock().batches, [2]);
    }

    #[test]
    fn the_plain_spans_of_a_batch_are_bounded() {
        let rec = Recorder::default();
        let dispatch = Dispatch::new(tracing_subscriber::registry().with(rec.clone()));
        // More events than the limit: 40 warps of 128 records.
        let mut b = BufferBuilder::new([10, 1, 1], [128, 1, 1], 128);
        for block in 0..10 {
            for warp in 0..4 {
                let slot = b.warp(block, warp).unwrap();
                for i in 0..128u64 {
                    slot.range(1, 1_000_000 + i * 10, 1_000_000 + i * 10 + 5, 0);
                }
            }
        }
        let mut big = (*batch(0, 3, None)).clone();
        big.buffer = Arc::new(OwnedBuffer::decode(b.finish(), None).unwrap());
        deliver(&dispatch, Arc::new(big));
        let seen = rec.0.lock();
        assert_eq!(seen.spans.len(), FALLBACK_SPAN_LIMIT);
        let cut: Vec<_> = seen
            .events
            .iter()
            .filter(|e| e["name"] == "gpu.fallback_truncated")
            .collect();
        assert_eq!(cut.len(), 1);
        assert_eq!(cut[0]["gpu.events"], "5120");
        assert_eq!(cut[0]["gpu.emitted"], FALLBACK_SPAN_LIMIT.to_string());
    }

    /// A streamed launch's parts are ordinary batches: each reaches the sinks
    /// and makes its own plain spans (its events only, under the same launch
    /// span and id), so the parts together make the launch's spans once.
    #[test]
    fn each_part_of_a_streamed_launch_is_delivered_as_a_batch() {
        let rec = Recorder::default();
        let sink = TestSink::default();
        let sub = tracing_subscriber::registry()
            .with(EnvFilter::new("tracing_gpu::device=trace,info"))
            .with(rec.clone())
            .with(SinkLayer::new(sink.clone()).unwrap());
        let dispatch = Dispatch::new(sub);
        let launch_span =
            tracing::dispatcher::with_default(&dispatch, || tracing::info_span!("persistent"));
        let whole = batch(0, 43, launch_span.id());
        // Warp (1, 0)'s five loads in two parts, warp (0, 1) in the last.
        let mut delivered = 0;
        for (index, ranges) in [(0u32, 0..2u64), (1, 2..5)] {
            let mut b = BufferBuilder::new([2, 1, 1], [64, 1, 1], 4);
            b.launch_id(43);
            let w = b.warp(1, 0).unwrap().sm(3, 3);
            for k in ranges {
                w.range(1, 2_000_100 + 200 * k, 2_000_200 + 200 * k, k as u32);
            }
            if index == 1 {
                b.warp(0, 1)
                    .unwrap()
                    .sm(12, 12)
                    .range(1, 2_000_000, 2_000_500, 7);
            }
            let mut part = (*whole).clone();
            part.buffer = Arc::new(OwnedBuffer::decode(b.finish(), None).unwrap());
            part.launch.part = Some(crate::batch::Part {
                index,
                last: index == 1,
            });
            delivered += part.buffer.event_count();
            deliver(&dispatch, Arc::new(part));
        }
        drop(launch_span);
        assert_eq!(sink.0.lock().batches, [43, 43]);
        let seen = rec.0.lock();
        assert_eq!(seen.spans.len() as u64, delivered);
        assert!(seen.spans.iter().all(|s| s["gpu.launch_id"] == "43"));
        assert!(seen
            .parents
            .iter()
            .all(|p| p.as_deref() == Some("persistent")));
        let loads = seen.spans.iter().filter(|s| s["gpu.warp"] == "0");
        let payloads: Vec<_> = loads.map(|s| s["gpu.payload"].clone()).collect();
        assert_eq!(payloads, ["0", "1", "2", "3", "4"]);
    }
}
