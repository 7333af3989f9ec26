//! OTLP export to a real receiver on loopback (gRPC and HTTP): span counts,
//! parentage, attributes, and device timestamps equal to the calibration's
//! mapping of the same events (the mapping the Perfetto trace uses, on the wall
//! clock instead of BOOTTIME).
#![cfg(feature = "otlp")]

mod otlp_receiver;
mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use opentelemetry::trace::TracerProvider as _;
use otlp_receiver::{Received, Receiver, Transport};
use tracing_gpu::batch::{Batch, BatchSink, LaunchInfo};
use tracing_gpu::clock::{Calibration, Checkpoint, ClockMap, HostClock, HostOffsets};
use tracing_gpu::format::{BufferBuilder, EventKind, Sampling};
use tracing_gpu::otlp::{Detail, HostSpans, OtlpGuard, OtlpLayer, PhaseGroup, Protocol};
use tracing_gpu::registry::EventRegistry;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::{reload, EnvFilter, Layer, Registry};

fn protocol(t: Transport) -> Protocol {
    match t {
        Transport::Grpc => Protocol::Grpc,
        Transport::Http => Protocol::HttpProtobuf,
    }
}

fn layer(rx: &Receiver, detail: Detail) -> (OtlpLayer, OtlpGuard) {
    OtlpLayer::builder()
        .service_name("otlp-test")
        .protocol(protocol(rx.transport))
        .endpoint(rx.endpoint())
        .detail(detail)
        .shutdown_timeout(otlp_receiver::PATIENCE)
        .build()
        .expect("build the OTLP layer")
}

fn wall_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

fn by_name<'a>(spans: &'a [Received], name: &str) -> Vec<&'a Received> {
    spans.iter().filter(|s| s.span.name == name).collect()
}

fn one<'a>(spans: &'a [Received], name: &str) -> &'a Received {
    let found = by_name(spans, name);
    assert_eq!(found.len(), 1, "exactly one span {name:?}");
    found[0]
}

fn is_child_of(child: &Received, parent: &Received) -> bool {
    child.span.trace_id == parent.span.trace_id && child.span.parent_span_id == parent.span.span_id
}

fn host_spans(transport: Transport) {
    let rx = Receiver::start(transport);
    let (layer, guard) = layer(&rx, Detail::Phase);
    let subscriber = tracing_subscriber::registry().with(layer);
    let before = wall_ns();
    tracing::subscriber::with_default(subscriber, || {
        let request = tracing::info_span!("request", user = "ada", attempt = 2u64);
        let _r = request.enter();
        for i in 0..2i64 {
            let step = tracing::info_span!("step", index = i, done = tracing::field::Empty);
            let _s = step.enter();
            step.record("done", true);
        }
    });
    let after = wall_ns();
    guard.flush().expect("flush");
    let spans = rx.wait_spans(3);
    assert_eq!(spans.len(), 3, "request and two steps, nothing else");

    let request = one(&spans, "request");
    let steps = by_name(&spans, "step");
    assert_eq!(steps.len(), 2);
    assert!(request.span.parent_span_id.is_empty(), "request is a root");
    for step in &steps {
        assert!(is_child_of(step, request), "step under request");
        assert_eq!(step.attr("done"), Some(&bool_value(true)));
    }
    let mut indices: Vec<_> = steps.iter().map(|s| s.int_attr("index").unwrap()).collect();
    indices.sort();
    assert_eq!(indices, [0, 1]);
    assert_eq!(request.str_attr("user"), Some("ada"));
    assert_eq!(request.int_attr("attempt"), Some(2));
    let thread = std::thread::current().name().unwrap().to_string();
    for s in &spans {
        assert!(before <= s.span.start_time_unix_nano, "{}", s.span.name);
        assert!(s.span.start_time_unix_nano <= s.span.end_time_unix_nano);
        assert!(s.span.end_time_unix_nano <= after);
        assert_eq!(s.str_attr("thread.name"), Some(thread.as_str()));
        assert_eq!(s.resource_str("service.name"), Some("otlp-test"));
        assert_eq!(s.scope, "tracing-gpu");
        assert!(s
            .str_attr("code.file.path")
            .unwrap()
            .ends_with("otlp_export.rs"));
    }
    // Children end before their parent.
    for step in &steps {
        assert!(step.span.end_time_unix_nano <= request.span.end_time_unix_nano);
    }
    let stats = guard.stats();
    assert_eq!(stats.spans_exported, 3);
    assert_eq!(stats.spans_dropped + stats.spans_failed, 0);
}

fn bool_value(b: bool) -> opentelemetry_proto::tonic::common::v1::any_value::Value {
    opentelemetry_proto::tonic::common::v1::any_value::Value::BoolValue(b)
}

#[test]
fn host_spans_over_grpc() {
    host_spans(Transport::Grpc);
}

#[test]
fn host_spans_over_http() {
    host_spans(Transport::Http);
}

// --------------------------------------------------------------------------
// Device batches.

const LOAD: u16 = 1;
const MMA: u16 = 2;
const TILE: u16 = 3;
const DEVICE_BASE: u64 = 5_000_000_000_000;

/// A launch of 2 blocks × 2 warps; each warp runs 3 k-tiles of load, mma and
/// an instant, at times that differ per warp.
fn buffer() -> Vec<u8> {
    sampled_buffer(Sampling::default())
}

/// [`buffer`], its header saying `sampling` (which must keep every warp).
fn sampled_buffer(sampling: Sampling) -> Vec<u8> {
    let mut b = BufferBuilder::new([2, 1, 1], [64, 1, 1], 16);
    b.launch_id(7).sampling(sampling);
    for block in 0..2u32 {
        for warp in 0..2u32 {
            let slot = b.warp(block, warp).unwrap();
            slot.sm(block * 3 + warp, block * 3 + warp);
            let mut t = DEVICE_BASE + u64::from(block) * 1_000 + u64::from(warp) * 333;
            for k in 0..3u32 {
                let load = 100 + u64::from(k) * 17 + u64::from(warp) * 5;
                let mma = 300 + u64::from(block) * 11 + u64::from(k) * 3;
                slot.range(LOAD, t, t + load, k);
                slot.range(MMA, t + load, t + load + mma, k);
                slot.instant(TILE, t + load + mma, k);
                t += load + mma + 10;
            }
        }
    }
    b.finish()
}

/// load and mma declare their payload (the k-tile); tile_done does not.
fn registry() -> EventRegistry {
    EventRegistry::from_pairs([(LOAD, "load"), (MMA, "mma"), (TILE, "tile_done")])
        .and_then(|r| r.with_payload(LOAD, "k_tile"))
        .and_then(|r| r.with_payload(MMA, "k_tile"))
        .unwrap()
}

/// A calibration that puts the device's epoch near now, with a drift, and the
/// real offset between the host's wall clock and BOOTTIME.
fn calibration() -> Calibration {
    Calibration::new(Checkpoint {
        map: ClockMap::exact(DEVICE_BASE, HostClock::Boottime.now_ns(), 3.5),
        host_offsets: HostOffsets::measure(),
    })
}

/// Runs one launch under a host span "launch" (calling `inside` in it) and
/// delivers its batch to the layer, as the profiler does; returns the batch.
fn launch_and_deliver(inside: impl FnOnce()) -> Arc<Batch> {
    deliver_in_launch(test_batch(), inside)
}

/// [`launch_and_deliver`] of `batch`.
fn deliver_in_launch(mut batch: Arc<Batch>, inside: impl FnOnce()) -> Arc<Batch> {
    // As `gpu_profile!` opens it: the launch id an `i64`, which
    // tracing-opentelemetry keeps as an integer (a `u64` it sends as a string).
    let launch = tracing::info_span!("launch", kernel = "gemm", gpu.launch_id = 7i64);
    let _entered = launch.enter();
    inside();
    Arc::get_mut(&mut batch).unwrap().launch.parent = launch.id();
    let dispatch = tracing::dispatcher::get_default(|d| d.clone());
    tracing_gpu::deliver::deliver(&dispatch, batch.clone());
    batch
}

fn wall(batch: &Batch, device_ns: u64) -> u64 {
    batch.calibration.to_host(HostClock::Realtime, device_ns)
}

fn percentile(sorted: &[u64], p: usize) -> i64 {
    sorted[(p * sorted.len()).div_ceil(100).max(1) - 1] as i64
}

struct Expect {
    first: u64,
    last: u64,
    durations: Vec<u64>,
}

/// Per (event id, key): extent and sorted durations, computed from the capture.
fn expected(batch: &Batch, key: impl Fn(u32, u32) -> u32) -> HashMap<(u16, u32), Expect> {
    let mut out: HashMap<(u16, u32), Expect> = HashMap::new();
    for slot in batch.buffer.view().slots() {
        for e in slot.events() {
            let x = out
                .entry((e.id, key(slot.header.block_linear, slot.header.warp)))
                .or_insert(Expect {
                    first: u64::MAX,
                    last: 0,
                    durations: vec![],
                });
            x.first = x.first.min(e.start_ns);
            x.last = x.last.max(e.end_ns);
            x.durations.push(e.end_ns - e.start_ns);
        }
    }
    for x in out.values_mut() {
        x.durations.sort();
    }
    out
}

fn check_summary(s: &Received, prefix: &str, x: &Expect) {
    let get = |k: &str| {
        s.int_attr(&format!("{prefix}.{k}"))
            .unwrap_or_else(|| panic!("{prefix}.{k}"))
    };
    assert_eq!(get("count"), x.durations.len() as i64);
    assert_eq!(get("total_ns"), x.durations.iter().sum::<u64>() as i64);
    assert_eq!(get("p50_ns"), percentile(&x.durations, 50));
    assert_eq!(get("p99_ns"), percentile(&x.durations, 99));
}

/// The kernel span: under the launch span, spanning the device extent, with
/// the GPU's attributes.
fn check_kernel<'a>(spans: &'a [Received], batch: &Batch) -> &'a Received {
    let launch = one(spans, "launch");
    let kernel = one(spans, "gemm on GPU 0");
    assert!(
        is_child_of(kernel, launch),
        "kernel span under the launch span"
    );
    let cap = batch.buffer.view();
    let first = cap.slots().map(|s| s.header.first_ts).min().unwrap();
    let last = cap.slots().map(|s| s.header.last_ts).max().unwrap();
    assert_eq!(kernel.span.start_time_unix_nano, wall(batch, first));
    assert_eq!(kernel.span.end_time_unix_nano, wall(batch, last));
    assert_eq!(kernel.str_attr("hw.type"), Some("gpu"));
    assert_eq!(
        kernel.str_attr("hw.id"),
        Some(support::h200().uuid.as_str())
    );
    assert_eq!(kernel.str_attr("hw.model"), Some("NVIDIA H200"));
    assert_eq!(kernel.str_attr("hw.driver_version"), Some("580.95.05"));
    assert_eq!(kernel.int_attr("gpu.sm_count"), Some(132));
    assert_eq!(kernel.int_attr("gpu.launch_id"), Some(7));
    assert_eq!(
        kernel.int_attr("gpu.events"),
        Some(cap.event_count() as i64)
    );
    assert_eq!(kernel.str_attr("thread.name"), Some("GPU 0"));
    assert_eq!(kernel.resource_str("service.name"), Some("otlp-test"));
    if !cap.header().is_sampled() {
        assert_eq!(kernel.str_attr("gpu.sampled"), None);
    }
    kernel
}

fn device_spans(transport: Transport, detail: Detail) -> (Vec<Received>, Arc<Batch>) {
    let rx = Receiver::start(transport);
    let (layer, guard) = layer(&rx, detail);
    let subscriber = tracing_subscriber::registry().with(layer);
    let batch = tracing::subscriber::with_default(subscriber, || launch_and_deliver(|| {}));
    guard.flush().expect("flush");
    let events = batch.buffer.event_count() as usize;
    let warps = batch.buffer.view().slots().count();
    // launch + kernel, plus the level's own spans.
    let want = 2 + match detail {
        Detail::Kernel => 0,
        Detail::Phase => 3 * 2,
        Detail::Warp => warps + events,
        other => unreachable!("a level this test does not know: {other:?}"),
    };
    let spans = rx.wait_spans(want);
    assert_eq!(spans.len(), want, "span count at {detail:?}");
    assert_eq!(guard.stats().spans_exported, want as u64);
    (spans, batch)
}

#[test]
fn kernel_detail_over_http() {
    let (spans, batch) = device_spans(Transport::Http, Detail::Kernel);
    let kernel = check_kernel(&spans, &batch);
    let by_type = expected(&batch, |_, _| 0);
    for (id, name) in [(LOAD, "load"), (MMA, "mma"), (TILE, "tile_done")] {
        check_summary(kernel, &format!("gpu.phase.{name}"), &by_type[&(id, 0)]);
    }
}

#[test]
fn a_sampled_launch_says_so_on_its_kernel_span() {
    let rx = Receiver::start(Transport::Http);
    let (layer, guard) = layer(&rx, Detail::Kernel);
    let subscriber = tracing_subscriber::registry().with(layer);
    let batch = batch_of_bytes(sampled_buffer(Sampling::default().launches(4)));
    let batch = tracing::subscriber::with_default(subscriber, || deliver_in_launch(batch, || {}));
    guard.flush().expect("flush");
    let spans = rx.wait_spans(2);
    let kernel = check_kernel(&spans, &batch);
    assert_eq!(kernel.str_attr("gpu.sampled"), Some("1 launch in 4"));
}

#[test]
fn phase_detail_is_the_default_over_grpc() {
    let rx = Receiver::start(Transport::Grpc);
    let (layer, guard) = OtlpLayer::builder()
        .service_name("otlp-test")
        .protocol(Protocol::Grpc)
        .endpoint(rx.endpoint())
        .build()
        .unwrap();
    let subscriber = tracing_subscriber::registry().with(layer);
    let batch = tracing::subscriber::with_default(subscriber, || launch_and_deliver(|| {}));
    guard.flush().unwrap();
    let spans = rx.wait_spans(2 + 6);
    assert_eq!(spans.len(), 8);
    let kernel = check_kernel(&spans, &batch);
    let groups = expected(&batch, |_, warp| warp);
    for (id, name) in [(LOAD, "load"), (MMA, "mma"), (TILE, "tile_done")] {
        let phases: Vec<_> = spans
            .iter()
            .filter(|s| s.span.name.starts_with(&format!("{name} (warp ")))
            .collect();
        assert_eq!(phases.len(), 2, "one {name} span per warp role");
        for p in phases {
            assert!(is_child_of(p, kernel));
            let warp = p.int_attr("gpu.warp").unwrap() as u32;
            assert_eq!(p.span.name, format!("{name} (warp {warp})"));
            let x = &groups[&(id, warp)];
            assert_eq!(p.span.start_time_unix_nano, wall(&batch, x.first));
            assert_eq!(p.span.end_time_unix_nano, wall(&batch, x.last));
            assert_eq!(
                p.str_attr("thread.name"),
                Some(format!("GPU 0 / warp {warp}").as_str())
            );
            assert_eq!(p.str_attr("hw.id"), Some(support::h200().uuid.as_str()));
            check_summary(p, "gpu.phase", x);
        }
    }
}

#[test]
fn phase_detail_per_block_over_http() {
    let rx = Receiver::start(Transport::Http);
    let (layer, guard) = OtlpLayer::builder()
        .service_name("otlp-test")
        .protocol(Protocol::HttpProtobuf)
        .endpoint(rx.endpoint())
        .phase_group(PhaseGroup::Block)
        .build()
        .unwrap();
    let subscriber = tracing_subscriber::registry().with(layer);
    let batch = tracing::subscriber::with_default(subscriber, || launch_and_deliver(|| {}));
    guard.flush().unwrap();
    let spans = rx.wait_spans(8);
    assert_eq!(spans.len(), 8);
    let groups = expected(&batch, |block, _| block);
    let mma: Vec<_> = spans
        .iter()
        .filter(|s| s.span.name.starts_with("mma (block "))
        .collect();
    let blocks = groups.keys().filter(|(id, _)| *id == MMA).count();
    assert_eq!(mma.len(), blocks, "one mma span per block");
    for p in mma {
        let block = p.int_attr("gpu.block").unwrap() as u32;
        assert_eq!(p.span.name, format!("mma (block {block})"));
        let x = &groups[&(MMA, block)];
        assert_eq!(p.span.start_time_unix_nano, wall(&batch, x.first));
        assert_eq!(p.span.end_time_unix_nano, wall(&batch, x.last));
        check_summary(p, "gpu.phase", x);
    }
}

#[test]
fn warp_detail_over_grpc() {
    let (spans, batch) = device_spans(Transport::Grpc, Detail::Warp);
    let kernel = check_kernel(&spans, &batch);
    let by_id: HashMap<&[u8], &Received> = spans.iter().map(|s| (&s.span.span_id[..], s)).collect();
    let names = registry();
    let mut seen = 0;
    for slot in batch.buffer.view().slots() {
        let h = slot.header;
        let thread = format!(
            "GPU 0 / SM {} / block {} warp {}",
            h.sm_first, h.block_linear, h.warp
        );
        let warp = one(&spans, &format!("block {} warp {}", h.block_linear, h.warp));
        assert!(is_child_of(warp, kernel));
        assert_eq!(warp.span.start_time_unix_nano, wall(&batch, h.first_ts));
        assert_eq!(warp.span.end_time_unix_nano, wall(&batch, h.last_ts));
        assert_eq!(warp.str_attr("thread.name"), Some(thread.as_str()));
        assert_eq!(warp.int_attr("gpu.sm"), Some(i64::from(h.sm_first)));
        // Its events: same times as the calibration maps them, in order.
        let mut children: Vec<&Received> = spans.iter().filter(|s| is_child_of(s, warp)).collect();
        children.sort_by_key(|s| (s.span.end_time_unix_nano, s.span.start_time_unix_nano));
        let events: Vec<_> = slot.events().collect();
        assert_eq!(children.len(), events.len());
        for (s, e) in children.iter().zip(&events) {
            assert_eq!(s.span.name, names.name(e.id).unwrap());
            assert_eq!(s.span.start_time_unix_nano, wall(&batch, e.start_ns));
            assert_eq!(s.span.end_time_unix_nano, wall(&batch, e.end_ns));
            assert_eq!(s.int_attr("gpu.payload"), Some(i64::from(e.payload)));
            assert_eq!(
                s.str_attr("gpu.payload.name"),
                (e.id != TILE).then_some("k_tile")
            );
            assert_eq!(s.str_attr("thread.name"), Some(thread.as_str()));
            assert_eq!(
                s.str_attr("gpu.kind"),
                (e.kind == EventKind::Instant).then_some("instant")
            );
            assert!(by_id.contains_key(&s.span.parent_span_id[..]));
            seen += 1;
        }
    }
    assert_eq!(seen, batch.buffer.event_count() as usize);
}

// --------------------------------------------------------------------------
// A streamed launch: delivered in parts, one kernel span.

/// A span as the comparison sees it: name, times, attributes (sorted).
fn shape(s: &Received) -> String {
    let mut attrs: Vec<String> = s
        .span
        .attributes
        .iter()
        .filter(|a| a.key != "gpu.parts")
        .map(|a| format!("{a:?}"))
        .collect();
    attrs.sort();
    format!(
        "{} {} {} {attrs:?}",
        s.span.name, s.span.start_time_unix_nano, s.span.end_time_unix_nano
    )
}

/// The spans of `batch` delivered whole, and of the same launch delivered
/// in three parts (under one launch span, as the profiler keeps it open);
/// `early` checks what the receiver has after the first part.
fn whole_and_parts(
    detail: Detail,
    early: impl Fn(&[Received]),
) -> (Vec<Received>, Vec<Received>, Arc<Batch>) {
    let (whole, batch) = device_spans(Transport::Http, detail);
    let parts = support::in_parts(&batch, &[DEVICE_BASE + 700, DEVICE_BASE + 1_400]);
    assert!(parts.iter().all(|p| p.buffer.event_count() > 0));
    let rx = Receiver::start(Transport::Http);
    let (layer, guard) = layer(&rx, detail);
    let subscriber = tracing_subscriber::registry().with(layer);
    tracing::subscriber::with_default(subscriber, || {
        // As `gpu_profile!` opens it: the launch id an `i64`, which
        // tracing-opentelemetry keeps as an integer (a `u64` it sends as a string).
        let launch = tracing::info_span!("launch", kernel = "gemm", gpu.launch_id = 7i64);
        let dispatch = tracing::dispatcher::get_default(|d| d.clone());
        for (i, part) in parts.iter().enumerate() {
            let mut part = (**part).clone();
            part.launch.parent = launch.id();
            tracing_gpu::deliver::deliver(&dispatch, Arc::new(part));
            if i == 0 {
                guard.flush().expect("flush");
                early(&rx.spans());
            }
        }
    });
    guard.flush().expect("flush");
    let spans = rx.wait_for("the kernel span", |s| {
        s.iter().any(|s| s.span.name == "gemm on GPU 0")
    });
    (whole, spans, batch)
}

#[test]
fn a_launch_in_three_parts_has_one_kernel_span_with_the_whole_launchs_attributes() {
    let (whole, parts, batch) = whole_and_parts(Detail::Kernel, |early| {
        assert!(early.is_empty(), "nothing to export before the last part");
    });
    let kernel = check_kernel(&parts, &batch);
    assert_eq!(kernel.int_attr("gpu.parts"), Some(3));
    assert_eq!(shape(kernel), shape(one(&whole, "gemm on GPU 0")));
}

#[test]
fn a_launch_in_three_parts_exports_each_part_as_it_comes_under_one_kernel_span() {
    let (whole, parts, batch) = whole_and_parts(Detail::Warp, |early| {
        // The first part's spans are out before the launch ends, their
        // kernel span (not exported yet) named as their parent.
        assert!(!early.is_empty());
        assert!(early.iter().all(|s| s.span.name != "gemm on GPU 0"));
        let warps: Vec<_> = early
            .iter()
            .filter(|s| s.span.name.starts_with("block"))
            .collect();
        assert!(!warps.is_empty());
        let kernel = &warps[0].span.parent_span_id;
        assert!(warps.iter().all(|w| &w.span.parent_span_id == kernel));
    });
    let kernel = check_kernel(&parts, &batch);
    assert_eq!(shape(kernel), shape(one(&whole, "gemm on GPU 0")));
    // Every event span of the whole launch, once, under a warp span of its
    // warp (one per part the warp is in) under the one kernel span.
    let by_id: HashMap<&[u8], &Received> = parts.iter().map(|s| (&s.span.span_id[..], s)).collect();
    let events = |spans: &[Received]| -> Vec<String> {
        let mut v: Vec<String> = spans
            .iter()
            .filter(|s| s.int_attr("gpu.event_id").is_some())
            .map(shape)
            .collect();
        v.sort();
        v
    };
    assert_eq!(events(&parts), events(&whole));
    for s in parts
        .iter()
        .filter(|s| s.int_attr("gpu.event_id").is_some())
    {
        let warp = by_id[&s.span.parent_span_id[..]];
        assert!(warp.span.name.starts_with("block"), "{}", warp.span.name);
        assert_eq!(warp.str_attr("thread.name"), s.str_attr("thread.name"));
        assert!(warp.int_attr("gpu.part").is_some());
        assert!(is_child_of(warp, kernel));
    }
    let warp_spans = parts.iter().filter(|s| s.span.name.starts_with("block"));
    assert!(warp_spans.count() > batch.buffer.view().slots().count());
}

// --------------------------------------------------------------------------
// Joined mode: the application already ships its spans with tracing-opentelemetry.

/// The application's own provider, shipping over HTTP to `rx`.
fn app_provider(rx: &Receiver) -> opentelemetry_sdk::trace::SdkTracerProvider {
    assert_eq!(rx.transport, Transport::Http);
    use opentelemetry_otlp::WithExportConfig;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(format!("{}/v1/traces", rx.endpoint()))
        .build()
        .unwrap();
    opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_simple_exporter(exporter)
        .build()
}

fn check_joined(rx: &Receiver, guard: OtlpGuard, app: opentelemetry_sdk::trace::SdkTracerProvider) {
    guard.flush().unwrap();
    let guard_unjoined = guard.stats().unjoined;
    app.force_flush().unwrap();
    // launch + prepare from the application; kernel + 6 phases from us.
    let spans = rx.wait_spans(2 + 1 + 6);
    assert_eq!(spans.len(), 9, "no host span exported twice");
    let launch = one(&spans, "launch");
    let prepare = one(&spans, "prepare");
    assert_eq!(
        launch.scope, "app",
        "the application's layer exported the launch span"
    );
    assert_eq!(prepare.scope, "app");
    assert!(is_child_of(prepare, launch));
    let kernel = one(&spans, "gemm on GPU 0");
    assert!(
        is_child_of(kernel, launch),
        "the kernel span joins the application's trace, under its launch span"
    );
    // The join key, one type on both sides of the join.
    assert_eq!(
        launch.int_attr("gpu.launch_id"),
        Some(7),
        "{:?}",
        launch.attr("gpu.launch_id")
    );
    assert_eq!(kernel.int_attr("gpu.launch_id"), Some(7));
    assert_eq!(spans.iter().filter(|s| s.scope == "tracing-gpu").count(), 7);
    assert!(
        spans
            .iter()
            .all(|s| s.span.trace_id == launch.span.trace_id),
        "one trace for the request"
    );
    assert_eq!(guard_unjoined, 0, "the layer found its subscriber");
    app.shutdown().unwrap();
}

fn prepare() {
    tracing::info_span!("prepare").in_scope(|| {});
}

#[test]
fn joins_the_application_trace_with_the_opentelemetry_layer_below() {
    let rx = Receiver::start(Transport::Http);
    let app = app_provider(&rx);
    let (layer, guard) = layer(&rx, Detail::Phase);
    // At INFO, as applications run: the per-event fallback spans
    // (TRACE) stay off, or tracing-opentelemetry would export them too.
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(app.tracer("app")))
        .with(layer)
        .with(LevelFilter::INFO);
    tracing::subscriber::with_default(subscriber, || launch_and_deliver(prepare));
    check_joined(&rx, guard, app);
}

#[test]
fn joins_the_application_trace_with_the_opentelemetry_layer_above() {
    let rx = Receiver::start(Transport::Http);
    let app = app_provider(&rx);
    let (layer, guard) = layer(&rx, Detail::Phase);
    let subscriber = tracing_subscriber::registry()
        .with(layer)
        .with(tracing_opentelemetry::layer().with_tracer(app.tracer("app")))
        .with(LevelFilter::INFO);
    tracing::subscriber::with_default(subscriber, || launch_and_deliver(prepare));
    check_joined(&rx, guard, app);
}

/// The application's `tracing-opentelemetry` layer, boxed, for the bottom of
/// a registry.
type AppLayer = Box<dyn Layer<Registry> + Send + Sync>;

/// Joined mode with the OTLP layer in shape `make` (the application's layer
/// below it): one trace, device spans under the launch span, no host span
/// twice (`check_joined`).
fn joined_in<S>(make: impl FnOnce(AppLayer, OtlpLayer) -> S)
where
    S: tracing::Subscriber + Send + Sync + 'static,
{
    let rx = Receiver::start(Transport::Http);
    let app = app_provider(&rx);
    let (layer, guard) = layer(&rx, Detail::Phase);
    let otel = tracing_opentelemetry::layer()
        .with_tracer(app.tracer("app"))
        .boxed();
    let subscriber = make(otel, layer);
    tracing::subscriber::with_default(subscriber, || launch_and_deliver(prepare));
    check_joined(&rx, guard, app);
}

// tracing-subscriber 0.3 does not pass `on_register_dispatch` through `Option`
// and `Vec`: the layer learns its subscriber another way (`learn_dispatch`).
#[test]
fn joins_through_option() {
    joined_in(|otel, otlp| {
        tracing_subscriber::registry()
            .with(otel)
            .with(Some(otlp))
            .with(LevelFilter::INFO)
    });
}

#[test]
fn joins_through_vec_of_boxed_layers() {
    joined_in(|otel, otlp| {
        let layers: Vec<AppLayer> = vec![otel, otlp.boxed()];
        tracing_subscriber::registry()
            .with(layers)
            .with(LevelFilter::INFO)
    });
}

#[test]
fn joins_through_box_dyn_layer() {
    joined_in(|otel, otlp| {
        tracing_subscriber::registry()
            .with(otel)
            .with(otlp.boxed())
            .with(LevelFilter::INFO)
    });
}

#[test]
fn joins_through_a_per_layer_filter() {
    joined_in(|otel, otlp| {
        tracing_subscriber::registry()
            .with(otel)
            .with(otlp.with_filter(EnvFilter::new("info")))
            .with(LevelFilter::INFO)
    });
}

// `reload` does not pass `downcast_raw`: batches reach the layer through the
// gate event, and it learns its subscriber from `on_register_dispatch`.
#[test]
fn joins_through_reload() {
    joined_in(|otel, otlp| {
        let (otlp, _handle) = reload::Layer::new(otlp);
        tracing_subscriber::registry()
            .with(otel)
            .with(otlp)
            .with(LevelFilter::INFO)
    });
}

/// `Option` inside `reload` passes neither call: the layer cannot tell that
/// tracing-opentelemetry exports the host spans. It says so, in its stats and
/// in one warning at the flush, rather than duplicating in silence.
#[test]
fn option_inside_reload_fails_loudly() {
    fails_loudly_in(|otlp| reload::Layer::new(Some(otlp)).0.boxed());
}

/// `reload` inside `Option`: the same.
#[test]
fn reload_inside_option_fails_loudly() {
    fails_loudly_in(|otlp| Some(reload::Layer::new(otlp).0).boxed());
}

fn fails_loudly_in(shape: impl FnOnce(OtlpLayer) -> AppLayer) {
    let rx = Receiver::start(Transport::Http);
    let app = app_provider(&rx);
    let (layer, guard) = layer(&rx, Detail::Phase);
    let subscriber = tracing_subscriber::registry()
        .with(shape(layer))
        .with(tracing_opentelemetry::layer().with_tracer(app.tracer("app")))
        .with(LevelFilter::INFO);
    let warnings = Arc::new(parking_lot::Mutex::new(Vec::<String>::new()));
    let dispatch = tracing::Dispatch::new(subscriber);
    tracing::dispatcher::with_default(&dispatch, || launch_and_deliver(prepare));
    // The flush warns into the application's subscriber, here a recorder.
    let recorder = tracing_subscriber::fmt()
        .with_writer({
            let warnings = warnings.clone();
            move || Line(warnings.clone())
        })
        .with_max_level(tracing::Level::WARN)
        .finish();
    tracing::subscriber::with_default(recorder, || guard.flush().unwrap());
    let unjoined = guard.stats().unjoined;
    // The launch and prepare spans, and the batch (no launch span found).
    assert_eq!(unjoined, 3, "{:?}", guard.stats());
    let warnings = warnings.lock();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("did not find its subscriber for 3 host spans or launches"),
        "{warnings:?}"
    );
    drop(dispatch);
    app.shutdown().unwrap();
}

/// A writer that keeps each line `fmt` writes.
struct Line(Arc<parking_lot::Mutex<Vec<String>>>);

impl std::io::Write for Line {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .push(String::from_utf8_lossy(buf).into_owned());
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The plain fallback spans (`tracing_gpu::device=trace`) through the
/// application's tracing-opentelemetry layer, to the receiver: under the
/// launch span, in its trace, every key once, numbers as numbers.
#[test]
fn fallback_spans_through_tracing_opentelemetry_keep_numbers_and_unique_keys() {
    let rx = Receiver::start(Transport::Http);
    let app = app_provider(&rx);
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(app.tracer("app")))
        .with(EnvFilter::new("info,tracing_gpu::device=trace"));
    let batch = tracing::subscriber::with_default(subscriber, || launch_and_deliver(|| {}));
    app.force_flush().unwrap();
    let events = batch.buffer.event_count() as usize;
    let spans = rx.wait_spans(1 + events);
    assert_eq!(spans.len(), 1 + events, "the launch and one span per event");
    let launch = one(&spans, "launch");
    for s in spans.iter().filter(|s| s.span.name != "launch") {
        assert!(is_child_of(s, launch), "{}", s.span.name);
        let mut keys: Vec<&str> = s.span.attributes.iter().map(|a| a.key.as_str()).collect();
        keys.sort_unstable();
        let n = keys.len();
        keys.dedup();
        assert_eq!(keys.len(), n, "a key twice: {keys:?}");
        for key in [
            "gpu.sm",
            "gpu.block",
            "gpu.warp",
            "gpu.start_ns",
            "gpu.end_ns",
            "gpu.launch_id",
            "gpu.payload",
        ] {
            assert!(
                s.int_attr(key).is_some(),
                "{key} is not an integer: {:?}",
                s.attr(key)
            );
        }
        assert!(s.str_attr("gpu.thread").unwrap().starts_with("GPU 0 / SM "));
        assert!(s.int_attr("gpu.start_ns") <= s.int_attr("gpu.end_ns"));
    }
    app.shutdown().unwrap();
}

#[test]
fn skip_exports_only_device_spans() {
    let rx = Receiver::start(Transport::Http);
    let (layer, guard) = OtlpLayer::builder()
        .protocol(Protocol::HttpProtobuf)
        .endpoint(rx.endpoint())
        .host_spans(HostSpans::Skip)
        .detail(Detail::Kernel)
        .build()
        .unwrap();
    let subscriber = tracing_subscriber::registry().with(layer);
    tracing::subscriber::with_default(subscriber, || launch_and_deliver(prepare));
    guard.flush().unwrap();
    let spans = rx.wait_spans(1);
    assert_eq!(spans.len(), 1);
    assert_eq!(spans[0].span.name, "gemm on GPU 0");
    assert!(
        spans[0].span.parent_span_id.is_empty(),
        "no exported parent: a root"
    );
}

// --------------------------------------------------------------------------
// Replaying a capture file.

#[test]
fn replay_ships_recorded_host_spans_and_launches_with_their_times() {
    use tracing_gpu::batch::HostSpan;
    use tracing_gpu::capture::{CalibrationRound, Capture, CaptureDevice};
    let rx = Receiver::start(Transport::Grpc);
    let (layer, guard) = layer(&rx, Detail::Phase);
    let realtime_offset_ns = 1_700_000_000_000_000_000i64;
    let t0 = 40_000_000_000u64; // BOOTTIME of the recording
    let span = |name: &str, start: u64, end: u64, parent, launch_id| HostSpan {
        name: name.into(),
        target: "app".into(),
        thread_name: "main".into(),
        thread_id: 42,
        start_ns: t0 + start,
        end_ns: t0 + end,
        parent,
        launch_id,
        fields: vec![("step".into(), "3".into())],
    };
    let dump = Capture {
        devices: vec![CaptureDevice {
            info: support::h200(),
            calibrations: vec![CalibrationRound {
                realtime_offset_ns,
                ..CalibrationRound::default()
            }],
        }],
        registry: registry(),
        host_spans: vec![
            span("train_step", 0, 9_000, None, None),
            span("launch", 1_000, 8_000, Some(0), Some(7)),
        ],
        ..Capture::default()
    };
    let batch = test_batch();
    layer.replay(&dump, [batch.clone()]);
    guard.flush().unwrap();
    let spans = rx.wait_spans(2 + 1 + 6);
    assert_eq!(spans.len(), 9);
    let step = one(&spans, "train_step");
    let launch = one(&spans, "launch");
    assert!(is_child_of(launch, step));
    let wall = |ns: u64| (ns as i64 + realtime_offset_ns) as u64;
    assert_eq!(launch.span.start_time_unix_nano, wall(t0 + 1_000));
    // A field recorded as a number (the capture keeps it as text) goes out one.
    assert_eq!(launch.int_attr("step"), Some(3));
    assert_eq!(launch.str_attr("thread.name"), Some("main"));
    assert_eq!(launch.int_attr("thread.id"), Some(42));
    let kernel = check_kernel(&spans, &batch);
    // As live, the launch span lasts until its launch is over (the profiler
    // holds it until then), and its parent covers it.
    let complete = (batch.launch.host_complete_ns as i64
        + batch.calibration.latest().host_offsets.realtime_ns) as u64;
    let over = wall(t0 + 8_000)
        .max(kernel.span.end_time_unix_nano)
        .max(complete);
    assert_eq!(launch.span.end_time_unix_nano, over);
    assert_eq!(step.span.end_time_unix_nano, over.max(wall(t0 + 9_000)));
}

/// The test launch's batch, with no parent span yet.
fn test_batch() -> Arc<Batch> {
    batch_of_bytes(buffer())
}

/// The test launch's batch, holding `bytes`.
fn batch_of_bytes(bytes: Vec<u8>) -> Arc<Batch> {
    let now = HostClock::Boottime.now_ns();
    support::batch_of(
        bytes,
        registry(),
        calibration(),
        LaunchInfo {
            launch_id: 7,
            kernel: "gemm".into(),
            host_launch_ns: now,
            host_complete_ns: now + 50_000,
            grid: [2, 1, 1],
            block: [64, 1, 1],
            parent: None,
            host_thread: "main".into(),
            part: None,
        },
    )
}

// --------------------------------------------------------------------------
// Lifecycle.

#[test]
fn builds_and_shuts_down_inside_an_async_runtime() {
    // Dropping a tokio runtime inside another one's async context would panic;
    // the layer's own runtime (gRPC) and blocking client (HTTP) must not.
    let rx_grpc = Receiver::start(Transport::Grpc);
    let rx_http = Receiver::start(Transport::Http);
    let app = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    app.block_on(async {
        for rx in [&rx_grpc, &rx_http] {
            let (layer, guard) = layer(rx, Detail::Phase);
            let subscriber = tracing_subscriber::registry().with(layer);
            tracing::subscriber::with_default(subscriber, || {
                tracing::info_span!("in-async").in_scope(|| {});
            });
            drop(guard);
        }
    });
    for rx in [&rx_grpc, &rx_http] {
        let spans = rx.wait_spans(1);
        assert_eq!(spans[0].span.name, "in-async");
    }
}

#[test]
fn after_shutdown_spans_and_batches_are_dropped_without_panic() {
    let rx = Receiver::start(Transport::Http);
    let (layer, guard) = layer(&rx, Detail::Warp);
    let subscriber = tracing_subscriber::registry().with(layer);
    tracing::subscriber::with_default(subscriber, || {
        tracing::info_span!("before").in_scope(|| {});
        let stats = {
            let d = tracing::dispatcher::get_default(|d| d.clone());
            let layer = d.downcast_ref::<OtlpLayer>().unwrap();
            guard.finish().expect("finish");
            tracing::info_span!("after").in_scope(|| {});
            launch_and_deliver(|| {});
            layer.flush();
            layer.stats()
        };
        assert_eq!(stats.batches_dropped, 1);
        assert_eq!(stats.spans_exported, 1);
    });
    let spans = rx.wait_spans(1);
    assert_eq!(spans.len(), 1);
    assert_eq!(spans[0].span.name, "before");
}

// --------------------------------------------------------------------------
// The same launch in the Perfetto trace.

/// (SM, block, warp, event name, start ns, end ns).
type Slice = (u32, u32, u32, String, u64, u64);

/// The device slices of a Perfetto trace, read with Perfetto's own schema by
/// tests/otlp_perfetto_slices.py: (SM, block, warp, name, start, end), BOOTTIME ns.
/// `None` (after saying why) without a Python that has `perfetto`, unless
/// `TGPU_REQUIRE_TOOLS=1`.
fn perfetto_device_slices(trace: &std::path::Path) -> Option<Vec<Slice>> {
    let required = std::env::var("TGPU_REQUIRE_TOOLS").is_ok_and(|v| v == "1");
    let Ok(python) = std::env::var("TGPU_PYTHON") else {
        assert!(!required, "TGPU_REQUIRE_TOOLS=1 but TGPU_PYTHON is not set");
        println!("skipped: TGPU_PYTHON not set, the Perfetto comparison did not run");
        return None;
    };
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/otlp_perfetto_slices.py");
    let out = std::process::Command::new(&python)
        .arg(script)
        .arg(trace)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {python}: {e}"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.code() == Some(2) && !required {
        println!("skipped: the Perfetto reader cannot run here: {stderr}");
        return None;
    }
    assert!(
        out.status.success(),
        "otlp_perfetto_slices.py failed: {stderr}"
    );
    let slices = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            assert_eq!(f.len(), 6, "{l}");
            let n = |i: usize| f[i].parse::<u64>().unwrap();
            (
                n(0) as u32,
                n(1) as u32,
                n(2) as u32,
                f[3].to_string(),
                n(4),
                n(5),
            )
        })
        .collect();
    Some(slices)
}

#[test]
fn device_times_equal_the_perfetto_traces() {
    let batch = test_batch();
    let mut writer = tracing_gpu::perfetto::TraceWriter::new(Vec::new()).unwrap();
    writer.write_batch(&batch).unwrap();
    let (bytes, _) = writer.finish().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("launch.perfetto-trace");
    std::fs::write(&trace, bytes).unwrap();
    let Some(mut perfetto) = perfetto_device_slices(&trace) else {
        return;
    };

    let rx = Receiver::start(Transport::Http);
    let (layer, guard) = layer(&rx, Detail::Warp);
    layer.replay(&tracing_gpu::capture::Capture::default(), [batch.clone()]);
    guard.flush().unwrap();
    let events = batch.buffer.event_count() as usize;
    let spans = rx.wait_spans(1 + 4 + events);
    // Perfetto stamps BOOTTIME, OTLP the wall clock: one calibration, one offset.
    let offset = batch.calibration.latest().host_offsets.realtime_ns;
    let mut otlp: Vec<Slice> = spans
        .iter()
        .filter(|s| s.int_attr("gpu.event_id").is_some())
        .map(|s| {
            let (sm, block, warp) = warp_of_thread(s.str_attr("thread.name").unwrap());
            let boot = |t: u64| (t as i64 - offset) as u64;
            (
                sm,
                block,
                warp,
                s.span.name.clone(),
                boot(s.span.start_time_unix_nano),
                boot(s.span.end_time_unix_nano),
            )
        })
        .collect();
    assert_eq!(otlp.len(), events);
    perfetto.sort();
    otlp.sort();
    assert_eq!(
        perfetto.len(),
        events,
        "every event is a slice in the Perfetto trace"
    );
    assert_eq!(otlp, perfetto, "OTLP and Perfetto times of the same events");
}

/// "GPU 0 / SM 4 / block 1 warp 1" → (4, 1, 1).
fn warp_of_thread(name: &str) -> (u32, u32, u32) {
    let words: Vec<&str> = name.split([' ', '/']).filter(|w| !w.is_empty()).collect();
    match words[..] {
        ["GPU", _, "SM", sm, "block", block, "warp", warp] => (
            sm.parse().unwrap(),
            block.parse().unwrap(),
            warp.parse().unwrap(),
        ),
        _ => panic!("unexpected thread name {name:?}"),
    }
}

/// A watchdog's snapshot (issue #32: an ERROR event of target `tracing_gpu::watchdog`
/// under a launch span) marks the launch span unfinished, with the latest snapshot's text.
#[test]
fn a_watchdog_snapshot_marks_its_launch_span_unfinished() {
    let rx = Receiver::start(Transport::Http);
    let (layer, guard) = layer(&rx, Detail::Phase);
    let subscriber = tracing_subscriber::registry().with(layer);
    tracing::subscriber::with_default(subscriber, || {
        let launch = tracing::info_span!("gpu.launch", gpu.launch_id = 7u64);
        let other = tracing::info_span!("other");
        for text in ["first snapshot", "second snapshot"] {
            tracing::error!(target: "tracing_gpu::watchdog", parent: &launch, { gpu.snapshot = 0u64 }, "{}", text);
        }
        // An ERROR event of another target marks nothing.
        tracing::error!(parent: &other, "not a snapshot");
    });
    guard.flush().expect("flush");
    let spans = rx.wait_spans(2);
    let launch = one(&spans, "gpu.launch");
    assert_eq!(launch.attr("gpu.unfinished"), Some(&bool_value(true)));
    assert_eq!(launch.str_attr("gpu.watchdog"), Some("second snapshot"));
    let other = one(&spans, "other");
    assert_eq!(other.attr("gpu.unfinished"), None);
}
