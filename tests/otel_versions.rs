//! An application on tracing-opentelemetry 0.32 / opentelemetry 0.31, one
//! release behind the crate's 0.34 / 0.33: two copies of the crates in the
//! graph, whose spans joined mode cannot read. The OTLP layer exports the
//! host spans itself, counts them (`OtlpStats::foreign_otel`) and says so in
//! one warning per process; with the crate's own release, it joins and
//! counts nothing. One test, in a process of its own: the warning is the
//! process's.
#![cfg(feature = "otlp")]

mod otlp_receiver;
mod support;

use std::sync::Arc;

use opentelemetry_0_31::trace::TracerProvider as _;
use otlp_receiver::{Receiver, Transport};
use parking_lot::Mutex;
use tracing::Dispatch;
use tracing_gpu::deliver;
use tracing_gpu::otlp::{Detail, OtlpGuard, OtlpLayer, Protocol};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::Layer;

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

fn otlp(rx: &Receiver) -> (OtlpLayer, OtlpGuard) {
    OtlpLayer::builder()
        .protocol(Protocol::HttpProtobuf)
        .endpoint(rx.endpoint())
        .detail(Detail::Kernel)
        .shutdown_timeout(otlp_receiver::PATIENCE)
        .build()
        .unwrap()
}

/// The application's `fmt` layer, for warnings, writing to `lines`.
fn warnings<S>(lines: &Lines) -> impl Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    let lines = lines.clone();
    tracing_subscriber::fmt::layer()
        .with_writer(move || lines.clone())
        .with_filter(LevelFilter::WARN)
}

/// Two launches, each in a request span, through `dispatch`; then the
/// guard's flush.
fn run(dispatch: &Dispatch, guard: &OtlpGuard) {
    tracing::dispatcher::with_default(dispatch, || {
        for id in 1..=2 {
            let _request = tracing::info_span!("request").entered();
            let launch = tracing::info_span!("launch", gpu.launch_id = id as i64);
            let _entered = launch.enter();
            let mut batch = support::batch(id);
            Arc::get_mut(&mut batch).unwrap().launch.parent = launch.id();
            deliver::deliver(dispatch, batch);
        }
    });
    guard.flush().unwrap();
}

#[test]
fn an_older_tracing_opentelemetry_is_told_once_and_counted() {
    let rx = Receiver::start(Transport::Http);
    let old = opentelemetry_sdk_0_31::trace::SdkTracerProvider::builder().build();
    let lines = Lines::default();
    for round in 0..2 {
        let (layer, guard) = otlp(&rx);
        let dispatch = Dispatch::new(
            tracing_subscriber::registry()
                .with(tracing_opentelemetry_0_32::layer().with_tracer(old.tracer("app")))
                .with(layer)
                .with(warnings(&lines))
                .with(LevelFilter::INFO),
        );
        run(&dispatch, &guard);
        // request and launch, twice, each exported by the old layer too.
        assert_eq!(guard.stats().foreign_otel, 4, "{:?}", guard.stats());
        assert_eq!(guard.stats().unjoined, 0);
        let lines = lines.0.lock();
        assert_eq!(lines.len(), 1, "one warning per process: {lines:?}");
        assert!(
            lines[0].contains("not the release the OTLP layer joins (tracing-opentelemetry 0.34"),
            "round {round}: {lines:?}"
        );
    }

    // The crate's own release joins: nothing counted, nothing said.
    let quiet = Lines::default();
    let app = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
    let (layer, guard) = otlp(&rx);
    let dispatch = Dispatch::new(
        tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer({
                use opentelemetry::trace::TracerProvider as _;
                app.tracer("app")
            }))
            .with(layer)
            .with(warnings(&quiet))
            .with(LevelFilter::INFO),
    );
    run(&dispatch, &guard);
    assert_eq!(guard.stats().foreign_otel, 0);
    assert!(quiet.0.lock().is_empty());
}
