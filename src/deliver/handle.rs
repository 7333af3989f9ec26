//! What makes a sink findable: [`SinkHandle`], which a layer that is a sink
//! holds and forwards three calls to, and [`SinkLayer`], a sink as a layer.

use std::any::TypeId;
use std::sync::Arc;

use tracing::{Dispatch, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

use super::error::TooManySinks;
use super::gate;
use super::reload;
use super::slots::{holds, Taken};
use crate::batch::BatchSink;

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
    /// Takes a slot for `sink`; fails if [`MAX_SINKS`](super::MAX_SINKS) are taken.
    pub fn new(sink: Arc<dyn BatchSink>) -> Result<SinkHandle, TooManySinks> {
        let slot = Taken::take(&sink).ok_or(TooManySinks)?;
        Ok(SinkHandle {
            sink,
            slot: Arc::new(slot),
        })
    }

    /// `Layer::on_event` for a layer that holds this handle: notes that the
    /// subscriber's filters let the current batch through to this sink (see
    /// [the module docs](super#filters)), so that delivery hands it the batch. A
    /// layer of your own that holds a handle calls it from its `on_event`, or
    /// it gets no batches.
    pub fn on_event(&self, event: &tracing::Event<'_>) {
        if gate::is_gate(event.metadata()) {
            gate::reached(self.slot.0);
        }
    }

    /// `Layer::on_register_dispatch` for a layer that holds this handle. A sink
    /// that `dispatch` cannot find by downcast (behind
    /// `tracing_subscriber::reload`) is remembered here for flushing; batches
    /// reach it either way.
    pub fn on_register_dispatch(&self, dispatch: &Dispatch) {
        if self.is_in(dispatch) {
            return;
        }
        reload::remember(dispatch, self.slot.0, &self.sink);
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
        } else if id == self.slot.marker() {
            Some(&self.sink as *const Arc<dyn BatchSink> as *const ())
        } else {
            None
        }
    }
}

/// A [`BatchSink`] as a layer: add it to the subscriber and delivery hands it
/// every batch. It sees nothing else of the subscriber.
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
#[must_use = "a SinkLayer receives batches only once added to the subscriber"]
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
    /// Wraps `sink`; fails if [`MAX_SINKS`](super::MAX_SINKS) are taken.
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
