//! The bridge from decoded device captures to the `tracing` world: [`Batch`],
//! the [`BatchSink`] trait our layers implement, and [`deliver`].
//!
//! A profiled launch reaches the subscriber as one [`Batch`]: the decoded buffer,
//! the clock mapping, the launch as the host saw it, and the device. [`deliver`]
//! hands it over in two ways:
//!
//! - **In bulk, to our own layers.** [`deliver`] looks for each of our sinks in the
//!   dispatcher by downcast (`Dispatch::downcast_ref`, which sees through
//!   `Layered`, `Filtered`, `Option` and `Vec` layers) and gives each the whole
//!   batch at once: no per-event `tracing` dispatch. The sinks found this way are
//!   [`crate::perfetto::PerfettoLayer`] and, with feature `otlp`,
//!   `crate::otlp::OtlpLayer`.
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
//! | `gpu.payload.name` | str | what the payload is, if the event's type declares it ([`EventRegistry::with_payload`], `"k_tile"`); absent otherwise |
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
//! [`LaunchInfo::parent`] is the id of the host span that wraps the launch. Span
//! ids are reused once a span closes, so the profiler keeps that span open until
//! its batch has been delivered: during [`BatchSink::on_batch`] the id names the
//! launch span and nothing else. A sink that needs the parent must look it up
//! there, not later on a writer thread.

use std::borrow::Cow;
use std::sync::Arc;

use tracing::Dispatch;

use crate::clock::{Calibration, HostClock};
use crate::decode::{EventKind, OwnedCapture, Slot};
use crate::registry::{unknown_event_name, EventRegistry};

/// The target of the plain spans and events that device events become (see the
/// module docs for their fields).
pub const DEVICE_TARGET: &str = "tracing_gpu::device";

/// What is known of one GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceInfo {
    /// CUDA device ordinal.
    pub ordinal: u32,
    /// Marketing name, such as "NVIDIA H200".
    pub name: String,
    /// UUID, formatted `GPU-xxxxxxxx-xxxx-...` as nvidia-smi prints it.
    pub uuid: String,
    /// Number of SMs.
    pub sm_count: u32,
    /// Driver version, such as "580.159.04" (or the CUDA driver API version).
    pub driver_version: String,
    /// Compute capability (major, minor).
    pub compute_capability: (u32, u32),
}

/// One profiled launch, as the host saw it. Times are on the trace clock
/// ([`crate::clock::HostClock::Boottime`]), in ns.
#[derive(Debug, Clone, Default)]
pub struct LaunchInfo {
    /// The host's id for this launch (also in the buffer header). Unique in the
    /// process, across devices and profilers.
    pub launch_id: u64,
    /// The name given to `gpu_profile!` (usually the kernel's).
    pub kernel: String,
    /// Host time read just before the launch call.
    pub host_launch_ns: u64,
    /// Host time read just after completion was observed.
    pub host_complete_ns: u64,
    /// Grid dimensions in blocks.
    pub grid: [u32; 3],
    /// Block dimensions in threads.
    pub block: [u32; 3],
    /// The host span that wraps the launch, if any. It stays open until the
    /// batch has been delivered (see the module docs).
    pub parent: Option<tracing::span::Id>,
    /// Name of the host thread that launched.
    pub host_thread: String,
}

/// Everything a sink needs to draw one launch: the decoded capture, the clock
/// mapping, the launch and the device.
#[derive(Debug, Clone)]
pub struct Batch {
    /// The GPU.
    pub device: Arc<DeviceInfo>,
    /// The launch.
    pub launch: LaunchInfo,
    /// The decoded buffer.
    pub capture: Arc<OwnedCapture>,
    /// Device → host clock mapping for this device.
    pub calibration: Arc<Calibration>,
    /// Event names.
    pub registry: Arc<EventRegistry>,
}

impl Batch {
    /// A device time (`%globaltimer` ns) on the trace clock
    /// ([`HostClock::Boottime`], ns): the one mapping every output uses.
    #[inline]
    pub fn trace_ns(&self, device_ns: u64) -> u64 {
        self.calibration.to_host(HostClock::Boottime, device_ns)
    }
}

/// The synthetic thread a warp's events are drawn on:
/// `"GPU 0 / SM 12 / block 7 warp 3"` (`SM` is the warp's SM at its first event).
pub fn thread_name(device: u32, slot: &Slot<'_>) -> String {
    format!(
        "GPU {device} / SM {} / block {} warp {}",
        slot.header.sm_first, slot.header.block_linear, slot.header.warp
    )
}

/// A consumer of whole batches: our own layers implement it, so device events
/// reach them in bulk, with no per-event `tracing` dispatch.
pub trait BatchSink: Send + Sync {
    /// Takes one batch. Must not block on I/O: hand the work to a writer thread.
    /// `batch.launch.parent` names the launch span only until this returns.
    fn on_batch(&self, batch: &Arc<Batch>);
    /// Waits until everything handed over so far is written.
    fn flush(&self);
}

/// Finds one of our sinks in a dispatcher.
type Finder = fn(&Dispatch) -> Option<&dyn BatchSink>;

fn find<T: BatchSink + 'static>(dispatch: &Dispatch) -> Option<&dyn BatchSink> {
    dispatch.downcast_ref::<T>().map(|t| t as &dyn BatchSink)
}

/// Our sinks, in delivery order. A new sink is one line here.
const SINKS: &[Finder] = &[
    find::<crate::perfetto::PerfettoLayer>,
    #[cfg(feature = "otlp")]
    find::<crate::otlp::OtlpLayer>,
];

/// Hands `batch` to every sink of ours in `dispatch`, then, if the subscriber
/// asks for them, emits the plain device spans (see the module docs).
///
/// The plain spans are emitted with `dispatch` as the thread's default
/// (`tracing::dispatcher::with_default`), which tracing-core cannot do from
/// inside a `tracing::dispatcher::get_default` closure (it panics there): clone
/// the dispatcher out first, `let d = get_default(|d| d.clone());`, then call
/// `deliver(&d, batch)`, as the profiler's collector does.
pub fn deliver(dispatch: &Dispatch, batch: Arc<Batch>) {
    deliver_to(dispatch, &batch, SINKS);
}

/// Flushes every sink of ours in `dispatch` ([`BatchSink::flush`]).
pub fn flush(dispatch: &Dispatch) {
    for sink in SINKS.iter().filter_map(|find| find(dispatch)) {
        sink.flush();
    }
}

/// A key that tells the sinks of two dispatchers apart: the address of the
/// first sink found, or `None` if there is none. Two clones of one `Dispatch`
/// give the same key.
pub fn sink_key(dispatch: &Dispatch) -> Option<usize> {
    SINKS
        .iter()
        .find_map(|find| find(dispatch))
        .map(|s| s as *const dyn BatchSink as *const () as usize)
}

fn deliver_to(dispatch: &Dispatch, batch: &Arc<Batch>, sinks: &[Finder]) {
    for sink in sinks.iter().filter_map(|find| find(dispatch)) {
        sink.on_batch(batch);
    }
    if tracing::level_enabled!(tracing::Level::TRACE) {
        tracing::dispatcher::with_default(dispatch, || emit_spans(batch));
    }
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
    let capture = batch.capture.view();
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
pub(crate) mod tests {
    use super::*;
    use crate::decode::CaptureBuilder;
    use parking_lot::Mutex;
    use std::collections::BTreeMap;
    use tracing::field::{Field, Visit};
    use tracing::span;
    use tracing_subscriber::layer::{Context, SubscriberExt};
    use tracing_subscriber::registry::LookupSpan;
    use tracing_subscriber::{EnvFilter, Layer};

    /// A calibration with a known offset: device ns + `offset` = host ns.
    pub(crate) fn calibration(offset: u64) -> Calibration {
        Calibration::exact(1_000_000, 1_000_000 + offset, 0.0)
    }

    /// A batch of two warps on `device`, 3 + 1 events, one warp with drops.
    pub(crate) fn batch(device: u32, launch_id: u64, parent: Option<span::Id>) -> Arc<Batch> {
        let mut b = CaptureBuilder::new([2, 1, 1], [64, 1, 1], 4);
        b.launch_id(launch_id);
        b.warp(0, 1)
            .unwrap()
            .sm(12, 12)
            .range(1, 2_000_000, 2_000_500, 7)
            .range(2, 2_000_600, 2_001_000, 8)
            .instant(3, 2_001_100, 9);
        b.warp(1, 0)
            .unwrap()
            .sm(3, 3)
            .range(1, 2_000_100, 2_000_200, 0)
            .range(1, 2_000_300, 2_000_400, 1)
            .range(1, 2_000_500, 2_000_600, 2)
            .range(1, 2_000_700, 2_000_800, 3)
            .range(1, 2_000_900, 2_000_950, 4);
        let capture = OwnedCapture::decode(b.finish(), None).unwrap();
        let registry = EventRegistry::from_pairs([(1, "load"), (2, "mma"), (3, "epilogue")])
            .unwrap()
            .with_payload(1, "k_tile")
            .unwrap();
        Arc::new(Batch {
            device: Arc::new(DeviceInfo {
                ordinal: device,
                name: "Sim".into(),
                ..Default::default()
            }),
            launch: LaunchInfo {
                launch_id,
                kernel: "sim".into(),
                grid: [2, 1, 1],
                block: [64, 1, 1],
                parent,
                ..Default::default()
            },
            capture: Arc::new(capture),
            calibration: Arc::new(calibration(1_000)),
            registry: Arc::new(registry),
        })
    }

    /// Records what reaches a layer: device spans (fields), their parents, events.
    #[derive(Default)]
    pub(crate) struct Seen {
        pub spans: Vec<BTreeMap<String, String>>,
        pub parents: Vec<Option<String>>,
        pub events: Vec<BTreeMap<String, String>>,
        pub batches: Vec<u64>,
        pub flushes: usize,
    }

    struct Fields<'a>(&'a mut BTreeMap<String, String>);
    impl Visit for Fields<'_> {
        fn record_debug(&mut self, f: &Field, v: &dyn std::fmt::Debug) {
            self.0.insert(f.name().into(), format!("{v:?}"));
        }
        fn record_str(&mut self, f: &Field, v: &str) {
            self.0.insert(f.name().into(), v.into());
        }
        fn record_u64(&mut self, f: &Field, v: u64) {
            self.0.insert(f.name().into(), v.to_string());
        }
    }

    #[derive(Clone, Default)]
    pub(crate) struct Recorder(pub Arc<Mutex<Seen>>);

    impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Recorder {
        fn on_new_span(&self, attrs: &span::Attributes<'_>, id: &span::Id, ctx: Context<'_, S>) {
            if attrs.metadata().target() != DEVICE_TARGET {
                return;
            }
            let mut m = BTreeMap::new();
            attrs.record(&mut Fields(&mut m));
            let parent = ctx.span(id).unwrap().parent().map(|p| p.name().to_string());
            let mut seen = self.0.lock();
            seen.spans.push(m);
            seen.parents.push(parent);
        }
        fn on_event(&self, ev: &tracing::Event<'_>, _ctx: Context<'_, S>) {
            if ev.metadata().target() == DEVICE_TARGET {
                let mut m = BTreeMap::new();
                ev.record(&mut Fields(&mut m));
                self.0.lock().events.push(m);
            }
        }
    }

    /// A bulk sink, found by downcast like ours.
    #[derive(Clone, Default)]
    pub(crate) struct TestSink(pub Arc<Mutex<Seen>>);

    impl BatchSink for TestSink {
        fn on_batch(&self, batch: &Arc<Batch>) {
            self.0.lock().batches.push(batch.launch.launch_id);
        }
        fn flush(&self) {
            self.0.lock().flushes += 1;
        }
    }

    impl<S: tracing::Subscriber> Layer<S> for TestSink {}

    const TEST_SINKS: &[Finder] = &[find::<TestSink>];

    #[test]
    fn plain_spans_carry_the_documented_fields() {
        let rec = Recorder::default();
        let sink = TestSink::default();
        let sub = tracing_subscriber::registry()
            .with(EnvFilter::new("tracing_gpu::device=trace,info"))
            .with(rec.clone())
            .with(sink.clone());
        let dispatch = Dispatch::new(sub);
        let launch_span =
            tracing::dispatcher::with_default(&dispatch, || tracing::info_span!("gemm"));
        let b = batch(0, 42, launch_span.id());
        deliver_to(&dispatch, &b, TEST_SINKS);
        drop(launch_span);

        assert_eq!(sink.0.lock().batches, [42]);
        let seen = rec.0.lock();
        assert_eq!(seen.spans.len() as u64, b.capture.event_count());
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
            .with(sink.clone());
        let dispatch = Dispatch::new(sub);
        deliver_to(&dispatch, &batch(0, 1, None), TEST_SINKS);
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
        deliver_to(&dispatch, &batch(0, 1, None), TEST_SINKS);
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
        deliver_to(&dispatch, &batch(1, 5, None), TEST_SINKS);
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
            .with(Some(sink.clone()).with_filter(tracing_subscriber::filter::LevelFilter::INFO));
        let dispatch = Dispatch::new(sub);
        for id in [3, 4] {
            deliver_to(&dispatch, &batch(0, id, None), TEST_SINKS);
        }
        assert_eq!(sink.0.lock().batches, [3, 4]);
        for s in TEST_SINKS.iter().filter_map(|f| f(&dispatch)) {
            s.flush();
        }
        assert_eq!(sink.0.lock().flushes, 1);
        // A dispatcher without our layers: nothing found, nothing breaks.
        let plain = Dispatch::new(tracing_subscriber::registry());
        deliver_to(&plain, &batch(0, 9, None), TEST_SINKS);
        assert_eq!(sink_key(&plain), None);
    }
}
