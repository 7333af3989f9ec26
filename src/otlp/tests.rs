//! The OTLP module's unit tests.

use std::sync::atomic::Ordering;

use opentelemetry::Value;

use super::builder::*;
use super::export::*;
use super::group::*;
use super::layer::*;
use super::*;

#[test]
fn http_endpoints_get_the_traces_path_like_the_standard_variable() {
    let url = |e: &str| http_traces_url(e).unwrap();
    assert_eq!(
        url("http://localhost:4318"),
        "http://localhost:4318/v1/traces"
    );
    assert_eq!(
        url("http://localhost:4318/"),
        "http://localhost:4318/v1/traces"
    );
    assert_eq!(url("http://h:1/custom/path"), "http://h:1/custom/path");
    assert_eq!(url("http://h:1/v1/traces"), "http://h:1/v1/traces");
    for bad in [
        "localhost:4318",
        "ftp://h",
        "http://",
        "http:///x",
        "http://h:99999",
        "https://h",
        "http://a b",
    ] {
        assert!(
            matches!(http_traces_url(bad), Err(OtlpError::Config { .. })),
            "{bad}"
        );
    }
}

#[test]
fn protocols_parse_as_the_standard_variable_spells_them() {
    assert_eq!("grpc".parse(), Ok(Protocol::Grpc));
    assert_eq!(" http/protobuf".parse(), Ok(Protocol::HttpProtobuf));
    assert!("http/json"
        .parse::<Protocol>()
        .unwrap_err()
        .contains("not supported"));
    assert!("udp".parse::<Protocol>().is_err());
}

#[test]
fn the_exporters_own_crates_are_not_exported() {
    for t in [
        "h2::proto",
        "hyper_util::client",
        "tonic",
        "opentelemetry_sdk",
        "reqwest::blocking",
    ] {
        assert!(ignored_target(t), "{t}");
    }
    for t in [
        "app",
        "hyperion::x",
        "tracing_gpu::cuda",
        "tracing_gpu::devices_x",
    ] {
        assert!(!ignored_target(t), "{t}");
    }
    assert!(ignored_target("tracing_gpu::device"));
}

#[test]
fn summaries_use_nearest_rank_percentiles() {
    let mut g = Group::new();
    for d in 1..=100u64 {
        g.add(1_000 - d, 1_000);
    }
    let mut kv = Vec::new();
    g.summary("x", &mut kv);
    let get = |k: &str| {
        kv.iter()
            .find(|a| a.key.as_str() == k)
            .unwrap()
            .value
            .clone()
    };
    assert_eq!(get("x.count"), Value::I64(100));
    assert_eq!(get("x.total_ns"), Value::I64(5050));
    assert_eq!(get("x.p50_ns"), Value::I64(50));
    assert_eq!(get("x.p99_ns"), Value::I64(99));
    assert_eq!((g.first_start, g.last_end), (900, 1_000));

    let mut one = Group::new();
    one.add(5, 12);
    let mut kv = Vec::new();
    one.summary("y", &mut kv);
    let values: Vec<_> = kv.iter().map(|a| a.value.clone()).collect();
    assert_eq!(values, [1, 7, 7, 7].map(Value::I64));
}

#[test]
fn the_queue_admits_up_to_its_bound_and_counts_the_rest() {
    let shared = Shared::new(4);
    let admitted = (0..10).filter(|_| shared.admit()).count();
    assert_eq!(admitted, 4);
    let s = shared.stats();
    assert_eq!((s.spans_dropped, s.queue_peak, s.queue_capacity), (6, 4, 4));
    // One warning noted for the whole episode.
    assert!(shared.pending_warning.lock().is_some());
    shared.pending_warning.lock().take();
    shared.admit();
    assert!(shared.pending_warning.lock().is_none());
    // Two exports in a row with no drop between them end the episode.
    shared.leave_queue(4);
    shared.exported(4);
    assert!(
        shared.degraded.load(Ordering::Acquire),
        "drops since the last export"
    );
    shared.exported(0);
    assert!(!shared.degraded.load(Ordering::Acquire));
    assert!(shared.admit());
}

#[test]
fn exports_end_by_the_earliest_deadline() {
    use std::time::{Duration, Instant};
    let shared = Shared::new(8);
    let timeout = Duration::from_secs(10);
    let own = shared.export_deadline(timeout).unwrap();
    assert!(own > Instant::now() + Duration::from_secs(9));
    // A flush cuts exports at its deadline until it returns.
    let soon = Instant::now() + Duration::from_secs(1);
    {
        let _cut = shared.flush_cut(soon);
        assert_eq!(shared.export_deadline(timeout), Some(soon));
        assert!(!shared.given_up());
    }
    assert!(shared.export_deadline(timeout).unwrap() > soon);
    // A give-up stands; an earlier one wins; past it, no export starts.
    shared.give_up_at(soon + Duration::from_secs(1));
    shared.give_up_at(soon);
    shared.give_up_at(soon + Duration::from_secs(5));
    assert_eq!(shared.give_up(), Some(soon));
    shared.give_up_at(Instant::now());
    assert!(shared.given_up());
    assert_eq!(shared.export_deadline(timeout), None);
    // The conversion thread no longer waits for room: it drops, at once.
    let _patient = Patient::new();
    let limit = shared.patient_limit();
    assert!((0..limit).all(|_| shared.admit()));
    let t = Instant::now();
    assert!(!shared.admit());
    assert!(t.elapsed() < Duration::from_secs(1));
    assert_eq!(shared.stats().spans_dropped, 1);
}

#[test]
fn spans_out_of_time_fail_without_hiding_the_cause() {
    let shared = Shared::new(8);
    shared.out_of_time(2);
    let s = shared.stats();
    assert_eq!(
        (s.spans_failed, s.export_errors, s.last_failure),
        (2, 0, Some(ExportFailure::OutOfTime))
    );
    shared.failed(3, ExportFailure::HttpStatus(503));
    shared.out_of_time(4);
    let s = shared.stats();
    assert_eq!(
        (s.spans_failed, s.export_errors, s.last_failure),
        (9, 1, Some(ExportFailure::HttpStatus(503)))
    );
}

#[test]
fn grpc_failures_are_told_apart_by_the_exporters_message() {
    use opentelemetry_sdk::error::OTelSdkError;
    let kind = |text: &str| {
        classify(&OTelSdkError::InternalFailure(format!(
            "TonicTracesClient export failed with gRPC code: {text}"
        )))
    };
    assert_eq!(
        kind("Unavailable: transport error: tcp connect error: Connection refused (os error 111)"),
        ExportFailure::ConnectionRefused
    );
    assert_eq!(
        kind("Unknown: transport error: http2 error: connection error detected: frame with invalid size"),
        ExportFailure::MalformedReply
    );
    assert_eq!(
        kind("Unavailable: transport error: dns error: failed to lookup address"),
        ExportFailure::CannotConnect
    );
    assert_eq!(kind("Cancelled: Timeout expired"), ExportFailure::NoReply);
    // A status the server sent.
    assert_eq!(kind("PermissionDenied"), ExportFailure::GrpcStatus(7));
    assert_eq!(kind("Unavailable"), ExportFailure::GrpcStatus(14));
    assert_eq!(
        classify(&OTelSdkError::InternalFailure("something else".into())),
        ExportFailure::Other
    );
}
