//! Sinks behind `tracing_subscriber::reload`, which does not forward
//! `downcast_raw`: each is remembered, for [`super::flush`], with the
//! subscriber it was registered with, named by the address of that
//! subscriber's `Registry` (no two live subscribers share one).

use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use tracing::Dispatch;

use crate::batch::BatchSink;

/// A sink that its subscriber cannot find by downcast, and that subscriber.
struct Hidden {
    slot: usize,
    registry: usize,
    sink: Weak<dyn BatchSink>,
}

/// Every [`Hidden`] sink; at most one entry per slot and subscriber.
static HIDDEN: Mutex<Vec<Hidden>> = Mutex::new(Vec::new());

/// The address of `dispatch`'s `Registry`, which names the subscriber.
fn registry_of(dispatch: &Dispatch) -> Option<usize> {
    dispatch
        .downcast_ref::<tracing_subscriber::Registry>()
        .map(|r| r as *const tracing_subscriber::Registry as usize)
}

/// Remembers that `dispatch` holds `sink`, in `slot`, where no downcast finds it.
pub(super) fn remember(dispatch: &Dispatch, slot: usize, sink: &Arc<dyn BatchSink>) {
    let Some(registry) = registry_of(dispatch) else {
        return;
    };
    let mut hidden = HIDDEN.lock();
    if !hidden
        .iter()
        .any(|h| h.slot == slot && h.registry == registry)
    {
        hidden.push(Hidden {
            slot,
            registry,
            sink: Arc::downgrade(sink),
        });
    }
}

/// Forgets every sink remembered in `slot` (its last handle is gone).
pub(super) fn forget(slot: usize) {
    HIDDEN.lock().retain(|h| h.slot != slot);
}

/// The sinks remembered for `dispatch`, but those in the
/// slots `skip` names (found by downcast already).
pub(super) fn hidden_in(
    dispatch: &Dispatch,
    skip: impl Fn(usize) -> bool,
) -> Vec<Arc<dyn BatchSink>> {
    let Some(registry) = registry_of(dispatch) else {
        return Vec::new();
    };
    HIDDEN
        .lock()
        .iter()
        .filter(|h| h.registry == registry && !skip(h.slot))
        .filter_map(|h| h.sink.upgrade())
        .collect()
}

/// Calls `f` with the slot of every live sink remembered for `dispatch`.
pub(super) fn hidden_slots_in(dispatch: &Dispatch, mut f: impl FnMut(usize)) {
    let Some(registry) = registry_of(dispatch) else {
        return;
    };
    for h in HIDDEN.lock().iter() {
        if h.registry == registry && h.sink.strong_count() > 0 {
            f(h.slot);
        }
    }
}
