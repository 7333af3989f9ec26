//! The conversion thread: device batches in, spans out, at the layer's level of detail.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry::trace::{Span as _, SpanBuilder, SpanKind, TraceContextExt, Tracer as _};
use opentelemetry::{Array, Context as OtelContext, KeyValue, StringValue, Value};

use super::group::Group;
use super::layer::Inner;
use super::layer::Job;
use super::settings::Detail;
use super::settings::PhaseGroup;
use super::state::Patient;
use super::streamed::{KernelSum, PresetIds, StreamedKernels};
use crate::batch::{thread_name, Batch, DeviceInfo, Part};
use crate::clock::HostClock;
use crate::format::EventKind;
use crate::format::NO_CLUSTER;

// --------------------------------------------------------------------------
// The conversion thread: batches in, spans out.

pub(crate) fn worker(inner: Arc<Inner>, jobs: Receiver<Job>) {
    let _patient = Patient::new();
    let mut streams = StreamedKernels::default();
    while let Ok(Job::Batch(batch, parent)) = jobs.recv() {
        if inner.shared.stopped.load(Ordering::Acquire) {
            // Shut down with the queue full (so `Job::Stop` may not be in it):
            // count what is left and leave.
            let left = 1 + jobs
                .try_iter()
                .filter(|j| matches!(j, Job::Batch(..)))
                .count();
            inner
                .shared
                .batches_dropped
                .fetch_add(left as u64, Ordering::Relaxed);
            break;
        }
        if inner.shared.given_up() {
            // Its spans could not be sent: not converted, counted.
            inner.shared.batches_dropped.fetch_add(1, Ordering::Relaxed);
        } else {
            emit_batch(&inner, &mut streams, &batch, &parent);
        }
        inner.shared.log_pending();
        inner.log_foreign_otel();
        let mut p = inner.progress.lock();
        p.done += 1;
        p.bytes -= super::layer::batch_bytes(&batch);
        drop(p);
        inner.progress_cv.notify_all();
    }
    inner.progress.lock().exited = true;
    inner.progress_cv.notify_all();
}

/// Event names and declared payload names by id, each looked up once per batch.
pub(crate) struct Names<'a> {
    pub(crate) batch: &'a Batch,
    pub(crate) cache: HashMap<u16, (Arc<str>, Option<Arc<str>>)>,
}

impl Names<'_> {
    fn entry(&mut self, id: u16) -> &(Arc<str>, Option<Arc<str>>) {
        let registry = &self.batch.registry;
        self.cache
            .entry(id)
            .or_insert_with(|| match registry.info(id) {
                Some(info) => (info.name.clone(), info.payload.clone()),
                None => (Arc::from(registry.display_name(id).as_ref()), None),
            })
    }

    fn get(&mut self, id: u16) -> Arc<str> {
        self.entry(id).0.clone()
    }

    /// The payload's declared name ([`crate::registry::EventRegistry::with_payload`]).
    fn payload(&mut self, id: u16) -> Option<Arc<str>> {
        self.entry(id).1.clone()
    }
}

pub(crate) fn device_attributes(dev: &DeviceInfo) -> Vec<KeyValue> {
    vec![
        KeyValue::new("hw.type", "gpu"),
        KeyValue::new("hw.id", dev.uuid.clone()),
        KeyValue::new("hw.name", format!("GPU {}", dev.ordinal)),
        KeyValue::new("hw.model", dev.name.clone()),
        KeyValue::new("hw.vendor", "NVIDIA"),
        KeyValue::new("hw.driver_version", dev.driver_version.clone()),
        KeyValue::new("gpu.device", i64::from(dev.ordinal)),
        KeyValue::new("gpu.sm_count", i64::from(dev.sm_count)),
        KeyValue::new(
            "gpu.compute_capability",
            format!("{}.{}", dev.compute_capability.0, dev.compute_capability.1),
        ),
    ]
}

pub(crate) fn dims(d: [u32; 3]) -> Value {
    Value::Array(Array::I64(d.iter().map(|&x| i64::from(x)).collect()))
}

pub(crate) fn string(s: &Arc<str>) -> StringValue {
    StringValue::from(s.clone())
}

/// Turns one batch into spans under `parent`, at the layer's level of detail:
/// a launch delivered whole, its kernel span and the spans under it; a part
/// of a streamed launch, the spans under the launch's kernel span, which its
/// last part ends ([`StreamedKernels`]).
pub(crate) fn emit_batch(
    inner: &Inner,
    streams: &mut StreamedKernels,
    batch: &Batch,
    parent: &OtelContext,
) {
    let capture = batch.buffer.view();
    let calibration = &batch.calibration;
    let wall = |device_ns: u64| wall(batch, device_ns);
    let dev = &batch.device;
    let launch = &batch.launch;
    let mut names = Names {
        batch,
        cache: HashMap::new(),
    };

    // The kernel's extent on the device (first timer read to last flush),
    // its SMs, and for a part, its warps (a warp is in many parts).
    let (mut first, mut last) = (u64::MAX, 0u64);
    let mut sum = KernelSum {
        extent: None,
        bound_ns: None,
        events: capture.event_count(),
        events_lost: capture.events_lost(),
        warps: HashSet::new(),
        sms: HashSet::new(),
        by_type: BTreeMap::new(),
        parts: 1,
    };
    for slot in capture.slots() {
        first = first.min(slot.header.first_ts);
        last = last.max(slot.header.last_ts);
        sum.sms.insert(slot.header.sm_first);
        if launch.part.is_some() {
            sum.warps
                .insert((slot.header.block_linear, slot.header.warp));
        }
    }
    if first <= last {
        sum.extent = Some((wall(first), wall(last)));
        sum.bound_ns = Some(calibration.bound_ns_on(HostClock::Realtime, first) as i64);
    }
    if inner.detail == Detail::Kernel {
        for slot in capture.slots() {
            for e in slot.events() {
                sum.by_type
                    .entry(e.id)
                    .or_insert_with(Group::new)
                    .add(e.start_ns, e.end_ns);
            }
        }
    }
    let gpu: Arc<str> = Arc::from(format!("GPU {}", dev.ordinal));
    let hw_id = StringValue::from(dev.uuid.clone());

    let (kernel_cx, kernel) = match launch.part {
        None => {
            let warps = capture.flushed_slot_count() as u64;
            let (kernel, end) = kernel_span(inner, batch, parent, sum, warps, &mut names);
            (parent.with_span(kernel), Kernel::Whole(end))
        }
        Some(part) => {
            let cx = streams.part(launch.launch_id, parent);
            (cx, Kernel::Part(part, sum))
        }
    };
    // The part a span of a streamed launch comes from.
    let part = launch
        .part
        .map(|p| KeyValue::new("gpu.part", i64::from(p.index)));

    match inner.detail {
        Detail::Kernel => {}
        Detail::Phase => {
            let mut groups: BTreeMap<(u16, u32), Group> = BTreeMap::new();
            for slot in capture.slots() {
                let role = match inner.phase_group {
                    PhaseGroup::WarpRole => slot.header.warp,
                    PhaseGroup::Block => slot.header.block_linear,
                };
                for e in slot.events() {
                    groups
                        .entry((e.id, role))
                        .or_insert_with(Group::new)
                        .add(e.start_ns, e.end_ns);
                }
            }
            for ((id, role), mut group) in groups {
                // The group is in the name, so that a trace view's rows of one
                // event type tell their warps (or blocks) apart.
                let (role_key, role_name) = match inner.phase_group {
                    PhaseGroup::WarpRole => ("gpu.warp", "warp"),
                    PhaseGroup::Block => ("gpu.block", "block"),
                };
                let mut attributes = vec![
                    KeyValue::new("hw.id", hw_id.clone()),
                    KeyValue::new("thread.name", format!("{gpu} / {role_name} {role}")),
                    KeyValue::new("gpu.event_id", i64::from(id)),
                    KeyValue::new(role_key, i64::from(role)),
                ];
                attributes.extend(part.clone());
                group.summary("gpu.phase", &mut attributes);
                let span = inner.tracer.build_with_context(
                    SpanBuilder::from_name(format!("{} ({role_name} {role})", names.get(id)))
                        .with_kind(SpanKind::Internal)
                        .with_start_time(wall(group.first_start))
                        .with_attributes(attributes),
                    &kernel_cx,
                );
                let mut span = span;
                span.end_with_timestamp(wall(group.last_end));
            }
        }
        Detail::Warp => {
            for slot in capture.slots() {
                let h = &slot.header;
                // The warp's span covers its events (a backend compares a child
                // with its parent): a part's slot of a streamed launch has its
                // warp's first timer read, or its flush, only in one part.
                let (mut from, mut to) = (h.first_ts, h.last_ts);
                for e in slot.events() {
                    from = from.min(e.start_ns);
                    to = to.max(e.end_ns);
                }
                let thread: Arc<str> = Arc::from(thread_name(dev.ordinal, &slot));
                let mut attributes = vec![
                    KeyValue::new("hw.id", hw_id.clone()),
                    KeyValue::new("thread.name", string(&thread)),
                    KeyValue::new("gpu.sm", i64::from(h.sm_first)),
                    KeyValue::new("gpu.block", i64::from(h.block_linear)),
                    KeyValue::new("gpu.block_idx", dims(h.block)),
                    KeyValue::new("gpu.warp", i64::from(h.warp)),
                    KeyValue::new("gpu.events", i64::from(slot.event_count())),
                    KeyValue::new("gpu.events_lost", i64::from(slot.events_lost())),
                ];
                if h.cluster_rank != NO_CLUSTER {
                    attributes.push(KeyValue::new("gpu.cluster_rank", i64::from(h.cluster_rank)));
                }
                if slot.migrated() {
                    attributes.push(KeyValue::new("gpu.sm_last", i64::from(h.sm_last)));
                }
                if slot.open_at_flush() {
                    attributes.push(KeyValue::new("gpu.open_at_flush", true));
                }
                attributes.extend(part.clone());
                let warp = inner.tracer.build_with_context(
                    SpanBuilder::from_name(format!("block {} warp {}", h.block_linear, h.warp))
                        .with_kind(SpanKind::Internal)
                        .with_start_time(wall(from))
                        .with_attributes(attributes),
                    &kernel_cx,
                );
                let warp_cx = kernel_cx.with_span(warp);
                for e in slot.events() {
                    let mut attributes = vec![
                        KeyValue::new("hw.id", hw_id.clone()),
                        KeyValue::new("thread.name", string(&thread)),
                        KeyValue::new("gpu.event_id", i64::from(e.id)),
                        KeyValue::new("gpu.payload", i64::from(e.payload)),
                    ];
                    if let Some(p) = names.payload(e.id) {
                        attributes.push(KeyValue::new("gpu.payload.name", string(&p)));
                    }
                    if e.kind == EventKind::Instant {
                        attributes.push(KeyValue::new("gpu.kind", "instant"));
                    }
                    let mut span = inner.tracer.build_with_context(
                        SpanBuilder::from_name(names.get(e.id).to_string())
                            .with_kind(SpanKind::Internal)
                            .with_start_time(wall(e.start_ns))
                            .with_attributes(attributes),
                        &warp_cx,
                    );
                    span.end_with_timestamp(wall(e.end_ns));
                }
                warp_cx.span().end_with_timestamp(wall(to));
            }
        }
    }
    let (part, sum) = match kernel {
        Kernel::Whole(end) => return kernel_cx.span().end_with_timestamp(end),
        Kernel::Part(part, sum) => (part, sum),
    };
    let Some((parent, ids, sum)) = streams.add(launch.launch_id, sum, part.last) else {
        return; // More parts to come.
    };
    let warps = sum.warps.len() as u64;
    let (mut kernel, end) = PresetIds::build(ids.trace_id(), ids.span_id(), || {
        kernel_span(inner, batch, &parent, sum, warps, &mut names)
    });
    kernel.end_with_timestamp(end);
}

/// The kernel span of a batch: started (a launch delivered whole), ending
/// then; or not yet (a part of a streamed launch), the part's sum to add.
enum Kernel {
    Whole(SystemTime),
    Part(Part, KernelSum),
}

/// Starts the kernel span of `batch`'s launch under `parent`, from `sum` (of
/// the batch, or of every part of a streamed launch, the last being `batch`);
/// returns it and its end.
fn kernel_span(
    inner: &Inner,
    batch: &Batch,
    parent: &OtelContext,
    mut sum: KernelSum,
    warps: u64,
    names: &mut Names<'_>,
) -> (opentelemetry_sdk::trace::Span, SystemTime) {
    let (dev, launch, calibration) = (&batch.device, &batch.launch, &batch.calibration);
    // Nothing flushed: the host's view of the launch.
    let (start, end) = sum.extent.unwrap_or_else(|| host_window(batch));
    let bound_ns = sum
        .bound_ns
        .unwrap_or_else(|| calibration.bound_ns_on(HostClock::Realtime, 0) as i64);
    let mut attributes = device_attributes(dev);
    attributes.extend([
        KeyValue::new("thread.name", format!("GPU {}", dev.ordinal)),
        KeyValue::new("gpu.kernel", launch.kernel.to_string()),
        KeyValue::new("gpu.launch_id", launch.launch_id as i64),
        KeyValue::new("gpu.grid_dim", dims(launch.grid)),
        KeyValue::new("gpu.block_dim", dims(launch.block)),
        KeyValue::new("gpu.events", sum.events as i64),
        KeyValue::new("gpu.events_lost", sum.events_lost as i64),
        KeyValue::new("gpu.warps", warps as i64),
        KeyValue::new("gpu.sms", sum.sms.len() as i64),
        KeyValue::new("gpu.clock.bound_ns", bound_ns),
    ]);
    if launch.part.is_some() {
        attributes.push(KeyValue::new("gpu.parts", i64::from(sum.parts)));
    }
    // What the warps' figures cover: the sampled warps only.
    let h = batch.buffer.header();
    if h.is_sampled() {
        attributes.push(KeyValue::new(
            "gpu.sampled",
            h.sampling.describe(h.warps_per_block),
        ));
    }
    if !launch.host_thread.is_empty() {
        attributes.push(KeyValue::new("gpu.host_thread", launch.host_thread.clone()));
    }
    for (id, group) in &mut sum.by_type {
        group.summary(&format!("gpu.phase.{}", names.get(*id)), &mut attributes);
    }
    // Not the launch span's name (`gpu_profile!` names it after the kernel):
    // a trace view shows the host's call and the GPU's run as two rows.
    let kernel = inner.tracer.build_with_context(
        SpanBuilder::from_name(kernel_span_name(&launch.kernel, dev.ordinal))
            .with_kind(SpanKind::Internal)
            .with_start_time(start)
            .with_attributes(attributes),
        parent,
    );
    (kernel, end)
}

/// `device_ns` of `batch`'s GPU on the wall clock (`CLOCK_REALTIME`), by its calibration.
pub(crate) fn wall(batch: &Batch, device_ns: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(batch.calibration.to_host(HostClock::Realtime, device_ns))
}

/// The host's view of a launch on the wall clock: its launch call and the
/// completion the collector saw.
fn host_window(batch: &Batch) -> (SystemTime, SystemTime) {
    let offset = batch
        .calibration
        .latest()
        .host_offsets
        .of(HostClock::Realtime);
    let host = |ns: u64| {
        let t = (i128::from(ns) + i128::from(offset)).max(0) as u64;
        UNIX_EPOCH + Duration::from_nanos(t)
    };
    (
        host(batch.launch.host_launch_ns),
        host(batch.launch.host_complete_ns),
    )
}

/// When `batch`'s part of its launch was over, as the host knows it: its
/// kernel span's end (the last flush), or the completion the collector saw
/// if later. A live launch span stays open until then (the profiler holds
/// it until the batch is delivered), and so does a replayed one.
pub(crate) fn launch_end(batch: &Batch) -> SystemTime {
    let flushed = batch.buffer.view().slots().map(|s| s.header.last_ts).max();
    let complete = host_window(batch).1;
    flushed.map_or(complete, |last| wall(batch, last).max(complete))
}

/// The name of a launch's kernel span: the kernel, on which GPU.
pub(crate) fn kernel_span_name(kernel: &str, ordinal: u32) -> String {
    format!("{kernel} on GPU {ordinal}")
}
