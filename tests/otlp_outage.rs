//! An OTLP endpoint that is down, or up but never answering, does not block the
//! application beyond a stated bound: memory stays bounded (the queue's peak
//! never passes its capacity), one warning is logged, nothing panics, and spans
//! sent after the endpoint comes back arrive. Over gRPC and HTTP.
#![cfg(feature = "otlp")]

mod otlp_receiver;
mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use otlp_receiver::{BlackHole, Receiver, Transport, PATIENCE};
use tracing::{Event, Level, Subscriber};
use tracing_gpu::batch::Batch;
use tracing_gpu::otlp::{Detail, OtlpGuard, OtlpLayer, OtlpStats, Protocol};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

/// The most one span or one batch hand-over may take in the application. A
/// call that waited on a silent endpoint would take the export timeout, 3 s; a
/// normal one takes microseconds. Generous for a loaded 2-core machine.
const CALL_BOUND: Duration = Duration::from_secs(1);
const EXPORT_TIMEOUT: Duration = Duration::from_secs(3);
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(3);
const QUEUE: usize = 64;

/// Records every event at WARN or above.
#[derive(Clone, Default)]
struct Warnings(Arc<Mutex<Vec<String>>>);

impl<S: Subscriber> Layer<S> for Warnings {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        if *event.metadata().level() <= Level::WARN {
            self.0
                .lock()
                .unwrap()
                .push(format!("{} {:?}", event.metadata().target(), event));
        }
    }
}

fn build(transport: Transport, endpoint: String) -> (OtlpLayer, OtlpGuard) {
    OtlpLayer::builder()
        .protocol(match transport {
            Transport::Grpc => Protocol::Grpc,
            Transport::Http => Protocol::HttpProtobuf,
        })
        .endpoint(endpoint)
        .timeout(EXPORT_TIMEOUT)
        .max_queue_size(QUEUE)
        .scheduled_delay(Duration::from_millis(20))
        .batch_queue(4)
        .shutdown_timeout(SHUTDOWN_TIMEOUT)
        .detail(Detail::Warp)
        .build()
        .expect("build")
}

fn batch(launch_id: u64, parent: Option<tracing::span::Id>) -> Arc<Batch> {
    let mut batch = support::batch(launch_id);
    Arc::get_mut(&mut batch).unwrap().launch.parent = parent;
    batch
}

/// Opens and closes `spans` host spans and hands over `batches` device batches
/// (each under its launch span); fails at the first call that takes longer
/// than [`CALL_BOUND`]; returns the longest.
fn load(spans: usize, batches: u64) -> Duration {
    let mut worst = Duration::ZERO;
    let mut timed = |what: &str, call: &mut dyn FnMut()| {
        let t = Instant::now();
        call();
        let took = t.elapsed();
        assert!(
            took < CALL_BOUND,
            "{what} took {took:?}: the application waited"
        );
        worst = worst.max(took);
    };
    for i in 0..spans {
        timed("a host span", &mut || {
            tracing::info_span!("during-outage", i).in_scope(|| {})
        });
    }
    let dispatch = tracing::dispatcher::get_default(|d| d.clone());
    for id in 0..batches {
        let launch = tracing::info_span!("launch");
        let _e = launch.enter();
        let b = batch(id, launch.id());
        timed("a batch hand-over", &mut || {
            tracing_gpu::deliver::deliver(&dispatch, b.clone());
        });
    }
    worst
}

fn wait_stats(guard: &OtlpGuard, what: &str, done: impl Fn(&OtlpStats) -> bool) -> OtlpStats {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let s = guard.stats();
        if done(&s) {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {s:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn check_bounded(stats: &OtlpStats) {
    eprintln!("{stats:?}");
    assert_eq!(stats.queue_capacity, QUEUE as u64);
    assert!(
        stats.queue_peak <= QUEUE as u64,
        "memory bounded: {stats:?}"
    );
    assert!(stats.spans_dropped > 0, "a full queue drops: {stats:?}");
    assert!(
        stats.batches_dropped > 0,
        "a full batch queue drops: {stats:?}"
    );
}

fn check_one_warning(warnings: &Warnings) {
    let w = warnings.0.lock().unwrap();
    assert_eq!(w.len(), 1, "exactly one warning: {w:#?}");
    eprintln!("the warning: {}", w[0]);
    assert!(w[0].starts_with("tracing_gpu::otlp "), "{}", w[0]);
}

/// Shuts down within its bound.
fn check_shutdown(guard: OtlpGuard) {
    let t = Instant::now();
    drop(guard);
    let took = t.elapsed();
    eprintln!("shutdown took {took:?}");
    assert!(
        took < SHUTDOWN_TIMEOUT + Duration::from_secs(2),
        "shutdown took {took:?}"
    );
}

fn endpoint_down_then_back(transport: Transport) {
    let addr = otlp_receiver::free_addr();
    let (layer, guard) = build(transport, format!("http://{addr}"));
    let warnings = Warnings::default();
    let subscriber = tracing_subscriber::registry()
        .with(layer)
        .with(warnings.clone());
    let receiver = tracing::subscriber::with_default(subscriber, || {
        let worst = load(2_000, 12);
        eprintln!("longest call with the endpoint down: {worst:?}");
        assert!(
            worst < CALL_BOUND,
            "a call took {worst:?} with the endpoint down"
        );
        let stats = wait_stats(&guard, "a failed export", |s| s.export_errors > 0);
        check_bounded(&stats);

        // The endpoint comes back on the same port: later spans arrive.
        let receiver = Receiver::start_on(transport, addr);
        tracing::info_span!("after-recovery").in_scope(|| {});
        receiver.wait_for("the span sent after recovery", |spans| {
            spans.iter().any(|s| s.span.name == "after-recovery")
        });
        wait_stats(&guard, "the export to recover", |s| s.spans_exported > 0);
        receiver
    });
    check_one_warning(&warnings);
    check_shutdown(guard);
    drop(receiver);
}

#[test]
fn endpoint_down_then_back_over_grpc() {
    endpoint_down_then_back(Transport::Grpc);
}

#[test]
fn endpoint_down_then_back_over_http() {
    endpoint_down_then_back(Transport::Http);
}

fn endpoint_never_answers(transport: Transport) {
    let hole = BlackHole::start();
    let (layer, guard) = build(transport, hole.endpoint());
    let warnings = Warnings::default();
    let subscriber = tracing_subscriber::registry()
        .with(layer)
        .with(warnings.clone());
    tracing::subscriber::with_default(subscriber, || {
        let worst = load(2_000, 12);
        eprintln!("longest call with a silent endpoint: {worst:?}");
        assert!(
            worst < CALL_BOUND,
            "a call took {worst:?} with a silent endpoint"
        );
        // A flush waits at most `shutdown_timeout`, the export in flight included.
        let t = Instant::now();
        let _ = guard.flush();
        let took = t.elapsed();
        eprintln!("flush took {took:?}");
        assert!(
            took < SHUTDOWN_TIMEOUT + Duration::from_secs(2),
            "flush took {took:?}"
        );
        check_bounded(&guard.stats());
    });
    check_one_warning(&warnings);
    check_shutdown(guard);
}

#[test]
fn endpoint_never_answers_over_grpc() {
    endpoint_never_answers(Transport::Grpc);
}

#[test]
fn endpoint_never_answers_over_http() {
    endpoint_never_answers(Transport::Http);
}
