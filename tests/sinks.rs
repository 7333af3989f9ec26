//! A `BatchSink` defined here, outside the crate, receives whole batches
//! beside `PerfettoLayer` and `OtlpLayer`, in every subscriber shape users
//! write, `reload` included; nothing names it to the crate.
#![cfg(feature = "otlp")]

mod otlp_receiver;
mod perfetto_check;
mod support;

use std::sync::Arc;

use otlp_receiver::{Receiver, Transport};
use parking_lot::Mutex;
use tracing::Dispatch;
use tracing_gpu::batch::{Batch, BatchSink};
use tracing_gpu::deliver::{self, SinkLayer};
use tracing_gpu::otlp::{Detail, OtlpLayer, Protocol};
use tracing_gpu::perfetto::PerfettoLayer;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::{reload, EnvFilter, Layer, Registry};

/// What a sink of ours saw: the launch ids of its batches, and its flushes.
#[derive(Default)]
struct Seen {
    launches: Vec<u64>,
    events: u64,
    flushes: usize,
}

/// A third party's sink: counts what it is given.
#[derive(Clone, Default)]
struct Counter(Arc<Mutex<Seen>>);

impl BatchSink for Counter {
    fn on_batch(&self, batch: &Arc<Batch>) {
        let mut seen = self.0.lock();
        seen.launches.push(batch.launch.launch_id);
        seen.events += batch.buffer.event_count();
    }
    fn flush(&self) {
        self.0.lock().flushes += 1;
    }
}

/// Delivers batches `ids` to `dispatch` as the profiler does, each under a
/// launch span, then flushes every sink.
fn deliver_all(dispatch: &Dispatch, ids: &[u64]) {
    tracing::dispatcher::with_default(dispatch, || {
        for &id in ids {
            let span = tracing::info_span!("launch", gpu.launch_id = id);
            let _entered = span.enter();
            let mut batch = support::batch(id);
            Arc::get_mut(&mut batch).unwrap().launch.parent = span.id();
            let d = tracing::dispatcher::get_default(|d| d.clone());
            deliver::deliver(&d, batch);
        }
    });
    deliver::flush(dispatch);
}

#[test]
fn an_outside_sink_gets_every_batch_beside_perfetto_and_otlp() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.perfetto-trace");
    let (perfetto, perfetto_guard) = PerfettoLayer::builder().file(&trace).build().unwrap();
    let rx = Receiver::start(Transport::Http);
    let (otlp, otlp_guard) = OtlpLayer::builder()
        .protocol(Protocol::HttpProtobuf)
        .endpoint(rx.endpoint())
        .detail(Detail::Kernel)
        .shutdown_timeout(otlp_receiver::PATIENCE)
        .build()
        .unwrap();
    let mine = Counter::default();
    let dispatch = Dispatch::new(
        tracing_subscriber::registry()
            .with(perfetto)
            .with(SinkLayer::new(mine.clone()).unwrap())
            .with(otlp),
    );
    deliver_all(&dispatch, &[11, 12, 13]);
    {
        let seen = mine.0.lock();
        assert_eq!(seen.launches, [11, 12, 13]);
        assert_eq!(seen.events, 3 * support::batch(0).buffer.event_count());
        assert_eq!(seen.flushes, 1);
    }
    drop(dispatch);

    // The two sinks of the crate got the same batches.
    let stats = perfetto_guard.finish().unwrap();
    assert_eq!(stats.kernels, 3);
    perfetto_check::check(&trace, &["--expect-kernels", "3", "--expect-flows", "3"]);
    otlp_guard.flush().unwrap();
    // Kernel detail: a launch span and a kernel span (named after the
    // kernel and its GPU) per batch.
    let spans = rx.wait_spans(6);
    let named = |n: &str| spans.iter().filter(|s| s.span.name == n).count();
    assert_eq!((named("launch"), named("k on GPU 0")), (3, 3), "{spans:#?}");
}

/// Layer shapes users write: each must hand every batch to the sink once,
/// and flush it once.
#[test]
fn sinks_are_found_in_every_shape() {
    type Boxed = Box<dyn Layer<Registry> + Send + Sync>;
    type Make = Box<dyn Fn(Counter) -> Dispatch>;
    let shapes: Vec<(&str, Make)> = vec![
        (
            "plain",
            Box::new(|c| Dispatch::new(Registry::default().with(SinkLayer::new(c).unwrap()))),
        ),
        (
            "Option",
            Box::new(|c| Dispatch::new(Registry::default().with(Some(SinkLayer::new(c).unwrap())))),
        ),
        (
            "Box<dyn Layer>",
            Box::new(|c| {
                let boxed: Boxed = Box::new(SinkLayer::new(c).unwrap());
                Dispatch::new(Registry::default().with(boxed))
            }),
        ),
        (
            "Vec<Box<dyn Layer>> (second of two)",
            Box::new(|c| {
                let other = Counter::default();
                let layers: Vec<Boxed> = vec![
                    Box::new(SinkLayer::new(other).unwrap()),
                    Box::new(SinkLayer::new(c).unwrap()),
                ];
                Dispatch::new(Registry::default().with(layers))
            }),
        ),
        (
            "Filtered",
            Box::new(|c| {
                Dispatch::new(
                    Registry::default()
                        .with(SinkLayer::new(c).unwrap().with_filter(LevelFilter::INFO)),
                )
            }),
        ),
        (
            // Does not forward `downcast_raw`; events and
            // `on_register_dispatch` are enough.
            "reload",
            Box::new(|c| {
                let (layer, _handle) = reload::Layer::new(SinkLayer::new(c).unwrap());
                Dispatch::new(Registry::default().with(layer))
            }),
        ),
    ];
    for (shape, make) in shapes {
        let mine = Counter::default();
        let dispatch = make(mine.clone());
        deliver_all(&dispatch, &[1, 2]);
        let seen = mine.0.lock();
        assert_eq!(seen.launches, [1, 2], "shape {shape}");
        assert_eq!(seen.flushes, 1, "shape {shape}");
    }
}

#[test]
fn several_sinks_of_one_type_each_get_every_batch() {
    let (a, b, c) = (Counter::default(), Counter::default(), Counter::default());
    let dispatch = Dispatch::new(
        tracing_subscriber::registry()
            .with(SinkLayer::new(a.clone()).unwrap())
            .with(SinkLayer::new(b.clone()).unwrap())
            .with(SinkLayer::new(c.clone()).unwrap()),
    );
    deliver_all(&dispatch, &[5]);
    for sink in [a, b, c] {
        assert_eq!(sink.0.lock().launches, [5]);
    }
    // A sink that is not in the subscriber gets nothing.
    let outside = Counter::default();
    let _kept = SinkLayer::new(outside.clone()).unwrap();
    deliver_all(&dispatch, &[6]);
    assert!(outside.0.lock().launches.is_empty());
}

/// Device data obeys filters in the crate's own sinks: a global `warn` (as
/// `RUST_LOG=warn`) sends nothing; `tracing_gpu::device=off` turns device data
/// off and leaves the host spans; a per-layer filter turns it off for one sink.
#[test]
fn the_crate_sinks_obey_global_and_per_layer_filters() {
    // (global filter, OTLP's own filter) → (Perfetto kernels, OTLP span names)
    let cases: [(&str, Option<&str>, u64, &[&str]); 4] = [
        ("warn", None, 0, &[]),
        (
            "info,tracing_gpu::device=off",
            None,
            0,
            &["launch", "launch"],
        ),
        (
            "info",
            Some("info,tracing_gpu::device=off"),
            2,
            &["launch", "launch"],
        ),
        (
            "info",
            Some("info"),
            2,
            &["k on GPU 0", "k on GPU 0", "launch", "launch"],
        ),
    ];
    for (global, own, kernels, names) in cases {
        let dir = tempfile::tempdir().unwrap();
        let trace = dir.path().join("t.perfetto-trace");
        let (perfetto, perfetto_guard) = PerfettoLayer::builder().file(&trace).build().unwrap();
        let rx = Receiver::start(Transport::Http);
        let (otlp, otlp_guard) = OtlpLayer::builder()
            .protocol(Protocol::HttpProtobuf)
            .endpoint(rx.endpoint())
            .detail(Detail::Kernel)
            .shutdown_timeout(otlp_receiver::PATIENCE)
            .build()
            .unwrap();
        let otlp = otlp.with_filter(EnvFilter::new(own.unwrap_or("trace")));
        let dispatch = Dispatch::new(
            tracing_subscriber::registry()
                .with(perfetto)
                .with(otlp)
                .with(EnvFilter::new(global)),
        );
        deliver_all(&dispatch, &[1, 2]);
        drop(dispatch);
        let case = format!("{global} / {own:?}");
        let stats = perfetto_guard.finish().unwrap();
        assert_eq!(stats.kernels, kernels, "{case}");
        otlp_guard.flush().unwrap();
        let mut got: Vec<String> = rx.spans().into_iter().map(|s| s.span.name).collect();
        got.sort();
        assert_eq!(got, names, "{case}");
    }
}
