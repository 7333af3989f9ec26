//! The per-batch gate: which sinks the subscriber's filters let a batch
//! through to. The gate is a callsite, the event [`GATE_EVENT`] (target
//! [`DEVICE_TARGET`], level `INFO`), and a sink gets the batch if the filters,
//! global and per layer, let that event through to it.
//!
//! Most filters decide once per callsite (`EnvFilter` without span or field
//! directives, `Targets`, `LevelFilter`): `tracing` then caches its interest
//! in the callsite, and an interest of *always* means every layer of every
//! subscriber gets the event. If the subscriber finds every sink of the
//! process ([`every_sink_in`]), those are the sinks the event would reach,
//! and nothing is emitted: a `fmt` layer at `info` prints nothing per launch.
//! Otherwise (a filter that decides per event, a per-layer filter that keeps
//! the device target from some layer, a sink this subscriber cannot find, or
//! another subscriber in the process) the event is emitted, and each sink it
//! reaches marks its slot, through any layer that forwards events
//! (`tracing_subscriber::reload` included), with no downcast.

use std::cell::Cell;

use tracing::callsite::DefaultCallsite;
use tracing::field::Value;
use tracing::Dispatch;

use super::slots::{every_sink_in, Reached};
use crate::batch::{Batch, DEVICE_TARGET};

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

/// The gate's one callsite (registered at first use).
fn callsite() -> &'static DefaultCallsite {
    tracing::callsite!(
        name: GATE_EVENT,
        kind: tracing::metadata::Kind::EVENT,
        target: DEVICE_TARGET,
        level: tracing::Level::INFO,
        fields: gpu.launch_id, gpu.kernel, gpu.device
    )
}

/// The slots of the sinks in `dispatch` (the thread's default) that `batch`
/// may go to. Decides as `tracing::event!` would for the gate event, and
/// emits that event only where the callsite's cached interest cannot tell.
/// A batch delivered from within the gate (by a layer's `on_event`) has its
/// own set.
pub(super) fn pass(dispatch: &Dispatch, batch: &Batch) -> Reached {
    if !tracing::level_enabled!(tracing::Level::INFO) {
        return Reached::EMPTY;
    }
    let callsite = callsite();
    let interest = callsite.interest();
    if interest.is_never() {
        return Reached::EMPTY;
    }
    if interest.is_always() {
        if let Some(every) = every_sink_in(dispatch) {
            return every;
        }
    }
    let meta = tracing::callsite::Callsite::metadata(callsite);
    if !interest.is_always() && !dispatch.enabled(meta) {
        return Reached::EMPTY;
    }
    let launch = &batch.launch;
    let fields = meta.fields();
    let field = |name| fields.field(name).expect("a field of the gate's callsite");
    let (id, kernel, device) = (
        field("gpu.launch_id"),
        field("gpu.kernel"),
        field("gpu.device"),
    );
    let (launch_id, name, ordinal) = (
        launch.launch_id as i64,
        &*launch.kernel,
        i64::from(batch.device.ordinal),
    );
    let values = [
        (&id, Some(&launch_id as &dyn Value)),
        (&kernel, Some(&name as &dyn Value)),
        (&device, Some(&ordinal as &dyn Value)),
    ];
    let outer = OPEN.replace(Reached::EMPTY);
    tracing::Event::child_of(launch.parent.clone(), meta, &fields.value_set(&values));
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
