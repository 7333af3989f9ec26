//! The fallback: each device event as one plain `tracing` span, for layers
//! that are not sinks (see [the module docs](super#the-fields-of-a-device-span)).

use std::borrow::Cow;

use crate::batch::{thread_name, Batch, DEVICE_TARGET};
use crate::format::EventKind;
use crate::registry::unknown_event_name;

/// The most plain spans one batch becomes (see [the module docs](super#the-fields-of-a-device-span));
/// past it, one `gpu.fallback_truncated` event says how many were left out.
pub const FALLBACK_SPAN_LIMIT: usize = 4096;

/// The fallback: one plain span per device event, under [`DEVICE_TARGET`], at
/// most [`FALLBACK_SPAN_LIMIT`] per batch. Runs with the batch's dispatcher as
/// the default. Numbers are recorded as `i64` (their values fit), which every
/// layer, `tracing-opentelemetry` included, keeps as numbers.
pub(super) fn emit_spans(batch: &Batch) {
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
        if h.events_lost > 0 {
            tracing::event!(
                name: "gpu.events_lost",
                target: DEVICE_TARGET,
                parent: parent.clone(),
                tracing::Level::TRACE,
                gpu.device = device,
                gpu.sm = i64::from(h.sm_first),
                gpu.block = i64::from(h.block_linear),
                gpu.warp = i64::from(h.warp),
                gpu.events_lost = i64::from(h.events_lost),
                gpu.kernel = &*launch.kernel,
                gpu.launch_id = launch_id,
                gpu.thread = thread.as_str(),
                "gpu.events_lost"
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
