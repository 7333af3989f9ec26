//! At the recommended level (`info`), a `fmt` layer prints nothing per launch
//! while the sinks get every batch; per-layer filters still decide which sink
//! gets what. One test, in a process of its own: delivery asks the gate's
//! cached interest only where the subscriber holds every sink of the process.
#![cfg(feature = "otlp")]

mod otlp_receiver;
mod support;

use std::sync::Arc;

use otlp_receiver::{Receiver, Transport};
use parking_lot::Mutex;
use tracing::Dispatch;
use tracing_gpu::batch::{Batch, BatchSink};
use tracing_gpu::deliver::{self, SinkLayer};
use tracing_gpu::otlp::{Detail, OtlpLayer, Protocol};
use tracing_gpu::perfetto::PerfettoLayer;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::{EnvFilter, Layer};

const LAUNCHES: u64 = 50;

/// The launch ids a sink was given.
#[derive(Clone, Default)]
struct Counter(Arc<Mutex<Vec<u64>>>);

impl BatchSink for Counter {
    fn on_batch(&self, batch: &Arc<Batch>) {
        self.0.lock().push(batch.launch.launch_id);
    }
    fn flush(&self) {}
}

/// A `fmt` writer that keeps each line.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<String>>>);

impl std::io::Write for Lines {
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

impl Lines {
    fn layer<S>(&self) -> impl Layer<S>
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    {
        let lines = self.clone();
        tracing_subscriber::fmt::layer().with_writer(move || lines.clone())
    }
}

/// `LAUNCHES` launches, each under its launch span, delivered as the
/// profiler does.
fn launch_all(dispatch: &Dispatch) {
    tracing::dispatcher::with_default(dispatch, || {
        for id in 1..=LAUNCHES {
            let span = tracing::info_span!("launch", gpu.launch_id = id as i64);
            let _entered = span.enter();
            let mut batch = support::batch(id);
            Arc::get_mut(&mut batch).unwrap().launch.parent = span.id();
            deliver::deliver(dispatch, batch);
        }
    });
}

fn all() -> Vec<u64> {
    (1..=LAUNCHES).collect()
}

#[test]
fn fmt_at_info_prints_nothing_per_launch_and_filters_still_decide() {
    // The recommended stack: EnvFilter at info, fmt, Perfetto, OTLP, a sink of
    // the application's own.
    let dir = tempfile::tempdir().unwrap();
    let (perfetto, perfetto_guard) = PerfettoLayer::builder()
        .file(dir.path().join("t.perfetto-trace"))
        .build()
        .unwrap();
    let rx = Receiver::start(Transport::Http);
    let (otlp, otlp_guard) = OtlpLayer::builder()
        .protocol(Protocol::HttpProtobuf)
        .endpoint(rx.endpoint())
        .detail(Detail::Kernel)
        .shutdown_timeout(otlp_receiver::PATIENCE)
        .build()
        .unwrap();
    let (mine, lines) = (Counter::default(), Lines::default());
    let dispatch = Dispatch::new(
        tracing_subscriber::registry()
            .with(EnvFilter::new("info"))
            .with(lines.layer())
            .with(perfetto)
            .with(otlp)
            .with(SinkLayer::new(mine.clone()).unwrap()),
    );
    launch_all(&dispatch);
    drop(dispatch);
    assert_eq!(*mine.0.lock(), all());
    assert_eq!(perfetto_guard.finish().unwrap().kernels, LAUNCHES);
    // Finished, so that no handle of these sinks outlives their subscriber.
    assert_eq!(otlp_guard.finish().unwrap().spans_exported, 2 * LAUNCHES);
    assert_eq!(lines.0.lock().len(), 0, "fmt printed at info");

    // Per-layer filters only, every one letting the device target through at
    // info (docs/subscriber.md's tracing-chrome recipe): as quiet.
    let (mine, lines) = (Counter::default(), Lines::default());
    let dispatch = Dispatch::new(
        tracing_subscriber::registry()
            .with(lines.layer().with_filter(EnvFilter::new("info")))
            .with(
                SinkLayer::new(mine.clone())
                    .unwrap()
                    .with_filter(EnvFilter::new("info,tracing_gpu::device=trace")),
            ),
    );
    launch_all(&dispatch);
    drop(dispatch);
    assert_eq!(*mine.0.lock(), all());
    assert_eq!(lines.0.lock().len(), 0, "fmt printed at info");

    // A per-layer filter that keeps the device target from one sink: the
    // other still gets every batch, that one none. Here the filters decide
    // per layer, so delivery asks with the gate event, which fmt prints.
    let (off, on, lines) = (Counter::default(), Counter::default(), Lines::default());
    let dispatch = Dispatch::new(
        tracing_subscriber::registry()
            .with(EnvFilter::new("info"))
            .with(lines.layer())
            .with(
                SinkLayer::new(off.clone())
                    .unwrap()
                    .with_filter(EnvFilter::new("info,tracing_gpu::device=off")),
            )
            .with(SinkLayer::new(on.clone()).unwrap()),
    );
    launch_all(&dispatch);
    drop(dispatch);
    assert_eq!((off.0.lock().len(), on.0.lock().clone()), (0, all()));
    let lines = lines.0.lock();
    assert_eq!(lines.len() as u64, LAUNCHES);
    assert!(
        lines.iter().all(|l| l.contains("tracing_gpu::device")),
        "{lines:?}"
    );

    // A global filter below info: no sink gets anything, nothing is printed.
    let (mine, lines) = (Counter::default(), Lines::default());
    let dispatch = Dispatch::new(
        tracing_subscriber::registry()
            .with(EnvFilter::new("warn"))
            .with(lines.layer())
            .with(SinkLayer::new(mine.clone()).unwrap()),
    );
    launch_all(&dispatch);
    assert!(mine.0.lock().is_empty() && lines.0.lock().is_empty());
}
