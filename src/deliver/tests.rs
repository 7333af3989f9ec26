//! Delivery through real subscribers: the gate, the filters, the plain spans.

use super::*;
use crate::decode::OwnedBuffer;
use crate::format::BufferBuilder;
use crate::test_support::{batch, Recorder, TestSink};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer;

#[test]
fn plain_spans_carry_the_documented_fields() {
    let rec = Recorder::default();
    let sink = TestSink::default();
    let sub = tracing_subscriber::registry()
        .with(EnvFilter::new("tracing_gpu::device=trace,info"))
        .with(rec.clone())
        .with(SinkLayer::new(sink.clone()).unwrap());
    let dispatch = Dispatch::new(sub);
    let launch_span = tracing::dispatcher::with_default(&dispatch, || tracing::info_span!("gemm"));
    let b = batch(0, 42, launch_span.id());
    deliver(&dispatch, b.clone());
    drop(launch_span);

    assert_eq!(sink.0.lock().batches, [42]);
    let seen = rec.0.lock();
    assert_eq!(seen.spans.len() as u64, b.buffer.event_count());
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
    assert_eq!(first["gpu.thread"], "GPU 0 / SM 12 / block 0 warp 1");
    assert!(!first.contains_key("thread.name"));
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
    let drops: Vec<_> = seen
        .events
        .iter()
        .filter(|e| e["name"] == "gpu.events_lost")
        .collect();
    assert_eq!(drops.len(), 1);
    assert_eq!(drops[0]["gpu.events_lost"], "1");
    assert_eq!(drops[0]["gpu.launch_id"], "42");
    assert_eq!(drops[0]["gpu.kernel"], "sim");
    assert_eq!(drops[0]["gpu.thread"], "GPU 0 / SM 3 / block 1 warp 0");
}

#[test]
fn no_plain_spans_unless_the_target_is_enabled() {
    let rec = Recorder::default();
    let sink = TestSink::default();
    let sub = tracing_subscriber::registry()
        .with(EnvFilter::new("trace,tracing_gpu::device=info"))
        .with(rec.clone())
        .with(SinkLayer::new(sink.clone()).unwrap());
    let dispatch = Dispatch::new(sub);
    deliver(&dispatch, batch(0, 1, None));
    assert_eq!(
        sink.0.lock().batches,
        [1],
        "the bulk path does not depend on the filter"
    );
    assert!(rec.0.lock().spans.is_empty());
    let events = &rec.0.lock().events;
    assert!(
        events.iter().all(|e| e["name"] == gate::GATE_EVENT),
        "{events:?}"
    );
}

#[test]
fn a_filter_on_the_span_name_turns_the_spans_off_not_the_drops() {
    let rec = Recorder::default();
    let sub = tracing_subscriber::registry().with(rec.clone().with_filter(
        tracing_subscriber::filter::filter_fn(|m| m.name() != "gpu.event"),
    ));
    let dispatch = Dispatch::new(sub);
    deliver(&dispatch, batch(0, 1, None));
    let seen = rec.0.lock();
    assert!(seen.spans.is_empty());
    // The drop count still comes through.
    assert_eq!(
        seen.events
            .iter()
            .filter(|e| e["name"] == "gpu.events_lost")
            .count(),
        1
    );
}

#[test]
fn without_a_launch_span_device_spans_are_roots() {
    let rec = Recorder::default();
    let sub = tracing_subscriber::registry().with(rec.clone());
    let dispatch = Dispatch::new(sub);
    deliver(&dispatch, batch(1, 5, None));
    let seen = rec.0.lock();
    assert_eq!(seen.spans.len(), 7);
    assert!(seen.parents.iter().all(Option::is_none));
    assert!(seen.spans[0]["gpu.thread"].starts_with("GPU 1 / "));
}

#[test]
fn sinks_are_found_through_layers_and_flushed() {
    let sink = TestSink::default();
    let sub = tracing_subscriber::registry()
        .with(tracing_subscriber::fmt::layer().with_writer(std::io::sink))
        .with(
            Some(SinkLayer::new(sink.clone()).unwrap())
                .with_filter(tracing_subscriber::filter::LevelFilter::INFO),
        );
    let dispatch = Dispatch::new(sub);
    for id in [3, 4] {
        deliver(&dispatch, batch(0, id, None));
    }
    assert_eq!(sink.0.lock().batches, [3, 4]);
    flush(&dispatch);
    assert_eq!(sink.0.lock().flushes, 1);
    // A dispatcher without our layers: nothing found, nothing breaks.
    let plain = Dispatch::new(tracing_subscriber::registry());
    deliver(&plain, batch(0, 9, None));
    assert_eq!(sink.0.lock().batches, [3, 4]);
}

#[test]
fn filters_decide_which_sinks_get_batches() {
    // A global filter below INFO for the device target: no sink gets anything.
    let sink = TestSink::default();
    let dispatch = Dispatch::new(
        tracing_subscriber::registry()
            .with(EnvFilter::new("warn"))
            .with(SinkLayer::new(sink.clone()).unwrap()),
    );
    deliver(&dispatch, batch(0, 1, None));
    assert!(
        sink.0.lock().batches.is_empty(),
        "RUST_LOG=warn exports nothing"
    );

    // Per-layer filters: one sink switched off for device data, one on.
    let (off, on) = (TestSink::default(), TestSink::default());
    let dispatch = Dispatch::new(
        tracing_subscriber::registry()
            .with(
                SinkLayer::new(off.clone())
                    .unwrap()
                    .with_filter(EnvFilter::new("info,tracing_gpu::device=off")),
            )
            .with(
                SinkLayer::new(on.clone())
                    .unwrap()
                    .with_filter(EnvFilter::new("info")),
            ),
    );
    let reached = deliver(&dispatch, batch(0, 2, None));
    assert!(off.0.lock().batches.is_empty());
    assert_eq!(on.0.lock().batches, [2]);
    // What deliver returns is the sink it reached, and only that one.
    assert_eq!(reached.len(), 1);
    for sink in reached.sinks() {
        sink.flush();
    }
    assert_eq!((off.0.lock().flushes, on.0.lock().flushes), (0, 1));
}

#[test]
fn the_plain_spans_of_a_batch_are_bounded() {
    let rec = Recorder::default();
    let dispatch = Dispatch::new(tracing_subscriber::registry().with(rec.clone()));
    // More events than the budget: 40 warps of 128 records.
    let mut b = BufferBuilder::new([10, 1, 1], [128, 1, 1], 128);
    for block in 0..10 {
        for warp in 0..4 {
            let slot = b.warp(block, warp).unwrap();
            for i in 0..128u64 {
                slot.range(1, 1_000_000 + i * 10, 1_000_000 + i * 10 + 5, 0);
            }
        }
    }
    let mut big = (*batch(0, 3, None)).clone();
    big.buffer = Arc::new(OwnedBuffer::decode(b.finish(), None).unwrap());
    deliver(&dispatch, Arc::new(big));
    let seen = rec.0.lock();
    assert_eq!(seen.spans.len(), FALLBACK_SPAN_BUDGET);
    let cut: Vec<_> = seen
        .events
        .iter()
        .filter(|e| e["name"] == "gpu.fallback_truncated")
        .collect();
    assert_eq!(cut.len(), 1);
    assert_eq!(cut[0]["gpu.events"], "5120");
    assert_eq!(cut[0]["gpu.emitted"], FALLBACK_SPAN_BUDGET.to_string());
}

/// A streamed launch's parts are ordinary batches: each reaches the sinks
/// and makes its own plain spans (its events only, under the same launch
/// span and id), so the parts together make the launch's spans once.
#[test]
fn each_part_of_a_streamed_launch_is_delivered_as_a_batch() {
    let rec = Recorder::default();
    let sink = TestSink::default();
    let sub = tracing_subscriber::registry()
        .with(EnvFilter::new("tracing_gpu::device=trace,info"))
        .with(rec.clone())
        .with(SinkLayer::new(sink.clone()).unwrap());
    let dispatch = Dispatch::new(sub);
    let launch_span =
        tracing::dispatcher::with_default(&dispatch, || tracing::info_span!("persistent"));
    let whole = batch(0, 43, launch_span.id());
    // Warp (1, 0)'s five loads in two parts, warp (0, 1) in the last.
    let mut delivered = 0;
    for (index, ranges) in [(0u32, 0..2u64), (1, 2..5)] {
        let mut b = BufferBuilder::new([2, 1, 1], [64, 1, 1], 4);
        b.launch_id(43);
        let w = b.warp(1, 0).unwrap().sm(3, 3);
        for k in ranges {
            w.range(1, 2_000_100 + 200 * k, 2_000_200 + 200 * k, k as u32);
        }
        if index == 1 {
            b.warp(0, 1)
                .unwrap()
                .sm(12, 12)
                .range(1, 2_000_000, 2_000_500, 7);
        }
        let mut part = (*whole).clone();
        part.buffer = Arc::new(OwnedBuffer::decode(b.finish(), None).unwrap());
        part.launch.part = Some(crate::batch::Part {
            index,
            last: index == 1,
        });
        delivered += part.buffer.event_count();
        deliver(&dispatch, Arc::new(part));
    }
    drop(launch_span);
    assert_eq!(sink.0.lock().batches, [43, 43]);
    let seen = rec.0.lock();
    assert_eq!(seen.spans.len() as u64, delivered);
    assert!(seen.spans.iter().all(|s| s["gpu.launch_id"] == "43"));
    assert!(seen
        .parents
        .iter()
        .all(|p| p.as_deref() == Some("persistent")));
    let loads = seen.spans.iter().filter(|s| s["gpu.warp"] == "0");
    let payloads: Vec<_> = loads.map(|s| s["gpu.payload"].clone()).collect();
    assert_eq!(payloads, ["0", "1", "2", "3", "4"]);
}
