//! The per-batch gate: before a batch goes to the sinks, [`deliver`](super::deliver)
//! emits one event, [`GATE_EVENT`], and each sink that the subscriber's
//! filters let it reach marks its slot. So a batch obeys the filters, global
//! and per layer, and the sinks hand themselves over through any layer that
//! forwards events (`tracing_subscriber::reload` included), with no downcast.

use std::cell::Cell;

use super::slots::Reached;
use crate::batch::DEVICE_TARGET;

/// The name of the event that opens each batch's way to the sinks (target
/// [`DEVICE_TARGET`], level `INFO`): a sink gets the batch only if the
/// subscriber's filters let this event through to it.
pub(crate) const GATE_EVENT: &str = "gpu.batch";

pub(super) fn is_gate(meta: &tracing::Metadata<'_>) -> bool {
    meta.name() == GATE_EVENT && meta.target() == DEVICE_TARGET
}

thread_local! {
    /// The slots of the sinks that have seen the current batch's gate event.
    static OPEN: Cell<Reached> = const { Cell::new(Reached::EMPTY) };
}

/// Emits the gate event for a batch (`emit`, on this thread) and returns the
/// slots of the sinks it reached. A batch delivered from within the gate
/// (by a layer's `on_event`) has its own set.
pub(super) fn pass(emit: impl FnOnce()) -> Reached {
    let outer = OPEN.replace(Reached::EMPTY);
    emit();
    OPEN.replace(outer)
}

/// The gate event reached the sink in `slot`.
pub(super) fn reached(slot: usize) {
    let mut open = OPEN.get();
    // The same sink twice in one subscriber gets the batch once.
    if open.add(slot) {
        OPEN.set(open);
    }
}
