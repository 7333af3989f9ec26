//! The fallback: each device event as one plain `tracing` span, for layers
//! that are not sinks (see [the module docs](super#the-fields-of-a-device-span)),
//! within a budget per unit of time that every batch of the process draws from.

use std::borrow::Cow;
use std::time::{Duration, Instant};

use crate::batch::{thread_name, Batch, DEVICE_TARGET};
use crate::format::EventKind;
use crate::registry::unknown_event_name;

/// The most plain spans the process makes per 5 seconds, all batches
/// together: a token bucket that holds this many and refills at this many
/// per 5 s (about 102 a second). Past it, a batch's events are left out, and
/// one `gpu.fallback_truncated` event per batch says how many (see
/// [the module docs](super#the-fields-of-a-device-span)).
///
/// Chosen from OpenTelemetry's default `BatchSpanProcessor` (a queue of
/// 2,048 spans, exported in batches of 512, at least every 5 s), which
/// `tracing-opentelemetry` feeds these spans to: a burst of 512 fills a
/// quarter of its queue at most and sets off one export, and 512 per 5 s is
/// what even the timer alone exports, so the application's own spans always
/// find room.
pub const FALLBACK_SPAN_BUDGET: usize = 512;

/// The time in which [`FALLBACK_SPAN_BUDGET`] spans are refilled.
const REFILL: Duration = Duration::from_secs(5);

/// A token bucket of plain spans.
struct Bucket {
    tokens: u64,
    /// When `tokens` was last refilled: time not yet turned into a token
    /// stays counted from here.
    since: Option<Instant>,
}

impl Bucket {
    const fn full() -> Bucket {
        Bucket {
            tokens: FALLBACK_SPAN_BUDGET as u64,
            since: None,
        }
    }

    /// Takes up to `want` tokens at `now`; returns how many.
    fn take(&mut self, want: u64, now: Instant) -> u64 {
        let since = *self.since.get_or_insert(now);
        let cap = FALLBACK_SPAN_BUDGET as u64;
        let per = REFILL.as_nanos() as u64 / cap;
        let elapsed = now.saturating_duration_since(since).as_nanos() as u64;
        let new = elapsed / per;
        if self.tokens + new >= cap {
            (self.tokens, self.since) = (cap, Some(now));
        } else {
            self.tokens += new;
            self.since = Some(since + Duration::from_nanos(new * per));
        }
        let got = want.min(self.tokens);
        self.tokens -= got;
        got
    }

    /// Gives back tokens taken and not used.
    fn give_back(&mut self, n: u64) {
        self.tokens = (self.tokens + n).min(FALLBACK_SPAN_BUDGET as u64);
    }
}

/// The budget every batch of the process draws from: the spans all go to
/// the application's one span processor.
#[cfg(not(test))]
fn with_bucket<R>(f: impl FnOnce(&mut Bucket) -> R) -> R {
    static BUCKET: parking_lot::Mutex<Bucket> = parking_lot::Mutex::new(Bucket::full());
    f(&mut BUCKET.lock())
}

/// Unit tests run in parallel in one process, each delivering on threads of
/// its own: there each thread has its own budget, so that one test's spans
/// do not take another's.
#[cfg(test)]
fn with_bucket<R>(f: impl FnOnce(&mut Bucket) -> R) -> R {
    thread_local! {
        static BUCKET: std::cell::RefCell<Bucket> = const { std::cell::RefCell::new(Bucket::full()) };
    }
    BUCKET.with(|b| f(&mut b.borrow_mut()))
}

/// The fallback: one plain span per device event, under [`DEVICE_TARGET`],
/// as many as [`FALLBACK_SPAN_BUDGET`] allows. Runs with the batch's
/// dispatcher as the default. Numbers are recorded as `i64` (their values
/// fit), which every layer, `tracing-opentelemetry` included, keeps as numbers.
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
    let events = batch.buffer.event_count();
    let allowed = with_bucket(|b| b.take(events, Instant::now()));
    let mut emitted = 0u64;
    for slot in buffer.slots() {
        let thread = thread_name(batch.device.ordinal, &slot);
        let h = &slot.header;
        for ev in slot.events() {
            if !spans_on || emitted == allowed {
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
    with_bucket(|b| b.give_back(allowed - emitted));
    if spans_on && emitted != events {
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

    #[test]
    fn the_budget_bursts_then_refills_at_its_rate() {
        let t0 = Instant::now();
        let mut b = Bucket::full();
        let cap = FALLBACK_SPAN_BUDGET as u64;
        assert_eq!(b.take(10_000, t0), cap, "a burst of the whole budget");
        assert_eq!(b.take(1, t0), 0);
        // A tenth of the period refills a tenth of the budget (rounded down).
        let tenth = t0 + REFILL / 10;
        assert_eq!(b.take(10_000, tenth), cap / 10);
        // Unused tokens come back; never more than the budget.
        b.give_back(7);
        assert_eq!(b.take(10_000, tenth), 7);
        b.give_back(10 * cap);
        assert_eq!(b.take(10_000, tenth), cap);
        // A long pause refills it once, not more.
        assert_eq!(b.take(10_000, t0 + 100 * REFILL), cap);
        // Over 20 periods, no more than 21 budgets in all.
        let mut got = 0;
        for ms in 0..100_000u64 {
            got += b.take(u64::MAX, t0 + 100 * REFILL + Duration::from_millis(ms));
        }
        assert!(got <= 21 * cap && got >= 19 * cap, "{got}");
    }
}
