//! The plain-span fallback never crowds the application's own spans out of a
//! default `BatchSpanProcessor` (OpenTelemetry's SDK, exporting over HTTP to
//! a real OTLP receiver on loopback): with `info,tracing_gpu::device=trace`
//! and four big launches, every span of the application arrives, and each
//! launch the budget cut short says so once. One test, in a process of its
//! own: the budget is the process's.
#![cfg(feature = "otlp")]

mod otlp_receiver;
mod support;

use std::sync::Arc;

use opentelemetry::trace::TracerProvider as _;
use otlp_receiver::{Receiver, Transport};
use tracing_gpu::batch::{Batch, LaunchInfo};
use tracing_gpu::clock::{Calibration, HostClock};
use tracing_gpu::deliver::{self, FALLBACK_SPAN_BUDGET};
use tracing_gpu::format::BufferBuilder;
use tracing_gpu::registry::EventRegistry;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::EnvFilter;

const LAUNCHES: u64 = 4;
const APP_WORK: usize = 300;

/// A launch of 40 warps of 128 ranges: 5,120 events, ten budgets.
fn big(launch_id: u64) -> Arc<Batch> {
    let base = 1_000_000;
    let mut b = BufferBuilder::new([10, 1, 1], [128, 1, 1], 128);
    b.launch_id(launch_id);
    for block in 0..10 {
        for warp in 0..4 {
            let slot = b.warp(block, warp).unwrap();
            for i in 0..128u64 {
                slot.range(1, base + i * 10, base + i * 10 + 5, 0);
            }
        }
    }
    let now = HostClock::Boottime.now_ns();
    support::batch_of(
        b.finish(),
        EventRegistry::from_pairs([(1, "mma")]).unwrap(),
        Calibration::exact(base, now, 0.0),
        LaunchInfo {
            launch_id,
            kernel: "big".into(),
            host_launch_ns: now,
            host_complete_ns: now + 20_000,
            grid: [10, 1, 1],
            block: [128, 1, 1],
            ..LaunchInfo::default()
        },
    )
}

#[test]
fn the_applications_spans_all_arrive_beside_the_plain_spans() {
    let rx = Receiver::start(Transport::Http);
    use opentelemetry_otlp::WithExportConfig;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(format!("{}/v1/traces", rx.endpoint()))
        .build()
        .unwrap();
    // The SDK's defaults: a queue of 2,048, batches of 512, every 5 s.
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(EnvFilter::new("info,tracing_gpu::device=trace"))
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("app")));
    let dispatch = tracing::Dispatch::new(subscriber);
    let events = big(0).buffer.event_count();
    tracing::dispatcher::with_default(&dispatch, || {
        let _request = tracing::info_span!("request").entered();
        for id in 1..=LAUNCHES {
            let launch = tracing::info_span!("launch", gpu.launch_id = id as i64);
            let _entered = launch.enter();
            let mut batch = big(id);
            Arc::get_mut(&mut batch).unwrap().launch.parent = launch.id();
            for _ in 0..APP_WORK / 2 {
                tracing::info_span!("app_work").in_scope(|| {});
            }
            deliver::deliver(&dispatch, batch);
            for _ in 0..APP_WORK / 2 {
                tracing::info_span!("app_work").in_scope(|| {});
            }
        }
    });
    // Exported, and answered by the receiver, when this returns.
    provider.force_flush().unwrap();
    let spans = rx.spans();
    let named = |n: &str| spans.iter().filter(|s| s.span.name == n).count();
    assert_eq!(
        (named("request"), named("launch"), named("app_work")),
        (1, LAUNCHES as usize, LAUNCHES as usize * APP_WORK),
        "the application's spans, every one"
    );
    // The budget, and what the test's seconds refilled.
    let plain = named("mma");
    assert!(
        (FALLBACK_SPAN_BUDGET..2 * FALLBACK_SPAN_BUDGET).contains(&plain),
        "{plain} plain spans"
    );
    // Each launch says once what the budget left out, as an event of its span.
    for launch in spans.iter().filter(|s| s.span.name == "launch") {
        let cut: Vec<_> = launch
            .span
            .events
            .iter()
            .filter(|e| e.name == "gpu.fallback_truncated")
            .collect();
        assert_eq!(cut.len(), 1, "{:?}", launch.span.events);
        let emitted = otlp_receiver::attr(&cut[0].attributes, "gpu.emitted");
        let total = otlp_receiver::attr(&cut[0].attributes, "gpu.events");
        assert!(emitted.is_some() && total.is_some(), "{cut:?}");
    }
    assert!(events > 4 * FALLBACK_SPAN_BUDGET as u64);
    provider.shutdown().unwrap();
}
