//! A capture exported to a real OpenTelemetry Collector (v0.161.0: OTLP
//! receiver, file exporter, built by scripts/backends.sh), read back from the
//! file it writes: the resource (`OTEL_SERVICE_NAME`,
//! `OTEL_RESOURCE_ATTRIBUTES`), span counts, kernel times to the nanosecond,
//! and every attribute against docs/otlp.md's table (names, types, which are
//! always there), at each level of detail, over gRPC and HTTP.
#![cfg(feature = "otlp")]

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::Value;
use support::backends::{self, attribute, Collector};
use support::cli::{run_cli_with_env, Limits};
use tracing_gpu::capture::Capture;
use tracing_gpu::clock::HostClock;

const GEMM: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/captures/h200-gemm.tgpu");
const DOC: &str = include_str!("../docs/otlp.md");

/// docs/otlp.md's attribute table: per kind of span, per attribute, its type
/// and whether it is always there.
fn documented() -> BTreeMap<String, BTreeMap<String, (String, bool)>> {
    let table = DOC
        .split("<!-- attributes: begin -->")
        .nth(1)
        .and_then(|t| t.split("<!-- attributes: end -->").next())
        .expect("docs/otlp.md has its attribute table");
    let mut kinds: BTreeMap<String, BTreeMap<String, (String, bool)>> = BTreeMap::new();
    for row in table.lines().filter(|l| l.starts_with("| ")).skip(1) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let (kind, names, types, when) = (cells[1], cells[2], cells[3], cells[4]);
        let types: Vec<&str> = types.split(", ").collect();
        let mut prefix = String::new();
        for (i, name) in names.split(", ").enumerate() {
            let Some(name) = name.strip_prefix('`').and_then(|n| n.strip_suffix('`')) else {
                continue; // "the span's own fields", "any of ...": not one name
            };
            // `gpu.phase.<name>.count`, `.total_ns`: the suffixes share the first's stem.
            let name = match name.strip_prefix('.') {
                Some(suffix) => format!("{prefix}.{suffix}"),
                None => {
                    prefix = name.rsplit_once('.').map_or("", |p| p.0).to_string();
                    name.to_string()
                }
            };
            let ty = types.get(i).unwrap_or(&types[0]).to_string();
            kinds
                .entry(kind.to_string())
                .or_default()
                .insert(name, (ty, when == "always"));
        }
    }
    kinds
}

/// The documented type of an OTLP/JSON value.
fn type_of(value: &Value) -> &'static str {
    let o = value.as_object().unwrap();
    if o.contains_key("intValue") {
        "int"
    } else if o.contains_key("stringValue") {
        "string"
    } else if o.contains_key("boolValue") {
        "bool"
    } else if o.contains_key("doubleValue") {
        "float"
    } else if let Some(a) = o.get("arrayValue") {
        match a["values"].as_array().and_then(|v| v.first()).map(type_of) {
            Some("int") => "int array",
            _ => "array",
        }
    } else {
        "?"
    }
}

/// Which row of the table a span is, by what it carries.
fn kind_of(span: &Value, by_id: &BTreeMap<String, &Value>) -> &'static str {
    let has = |k: &str| !attribute(&span["attributes"], k).is_null();
    let name = span["name"].as_str().unwrap();
    if has("hw.type") {
        "kernel"
    } else if has("gpu.phase.count") {
        "phase"
    } else if name.starts_with("block ") && has("gpu.block_idx") {
        "warp"
    } else if has("gpu.event_id") {
        let parent = span["parentSpanId"].as_str().unwrap_or("");
        assert!(
            by_id.contains_key(parent),
            "an event under its warp: {span}"
        );
        "event"
    } else {
        "host"
    }
}

/// Checks `spans` (with their resource) against the table.
fn check_attributes(spans: &[(Value, Value)], seen_kinds: &mut BTreeSet<&'static str>) {
    let doc = documented();
    let by_id: BTreeMap<String, &Value> = spans
        .iter()
        .map(|(_, s)| (s["spanId"].as_str().unwrap().to_string(), s))
        .collect();
    let check = |kind: &str, attrs: &Value, what: &str| {
        let rows = &doc[kind];
        for kv in attrs.as_array().unwrap() {
            let key = kv["key"].as_str().unwrap();
            let key = match key.strip_prefix("gpu.phase.") {
                // Kernel detail's summaries: gpu.phase.<name>.count ...
                Some(rest) if kind == "kernel" => {
                    format!("gpu.phase.<name>.{}", rest.rsplit_once('.').unwrap().1)
                }
                _ => key.to_string(),
            };
            match rows.get(&key) {
                Some((ty, _)) => assert_eq!(ty, type_of(&kv["value"]), "{kind} {what}: {key}"),
                // A host span's own fields, and OTEL_RESOURCE_ATTRIBUTES, are the user's.
                None => assert!(
                    matches!(kind, "host" | "resource"),
                    "{kind} {what}: {key} is not in docs/otlp.md's table"
                ),
            }
        }
        for (key, (_, always)) in rows {
            if *always {
                assert!(!attribute(attrs, key).is_null(), "{kind} {what}: no {key}");
            }
        }
    };
    for (resource, span) in spans {
        check("resource", resource, "resource");
        let kind = kind_of(span, &by_id);
        seen_kinds.insert(kind);
        check(kind, &span["attributes"], span["name"].as_str().unwrap());
    }
}

fn convert(
    collector: &Collector,
    capture: &str,
    grpc: bool,
    detail: &str,
    service: &str,
) -> String {
    let (endpoint, protocol) = match grpc {
        true => (format!("http://{}", collector.grpc), "grpc"),
        false => (format!("http://{}", collector.http), "http/protobuf"),
    };
    let args = [
        "convert",
        capture,
        "--otlp",
        &endpoint,
        "--otlp-protocol",
        protocol,
        "--detail",
        detail,
    ];
    let run = run_cli_with_env(
        &args,
        &[
            ("OTEL_SERVICE_NAME", Some(service)),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                Some("deployment.environment.name=collector-test,service.name=overridden"),
            ),
        ],
        Limits::wall(Duration::from_secs(120)),
    );
    assert_eq!(run.code, Some(0), "{service}: {}", run.stderr);
    run.stderr
}

/// The count the CLI printed: `otlp: N spans exported to URL`.
fn exported(stderr: &str) -> usize {
    stderr
        .split("otlp: ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count in {stderr}"))
}

#[test]
fn the_collector_receives_what_docs_otlp_md_says() {
    let Some(bin) = backends::binaries() else {
        return;
    };
    let collector = Collector::start(&bin);
    let capture = Capture::read(GEMM).unwrap();
    let batches = capture.batches().unwrap();
    let mut kinds = BTreeSet::new();
    for (grpc, detail) in [(true, "kernel"), (false, "phase"), (true, "phase")] {
        let service = format!("gemm-{detail}-{}", if grpc { "grpc" } else { "http" });
        let err = convert(&collector, GEMM, grpc, detail, &service);
        let spans = collector.spans(&service, exported(&err), Duration::from_secs(30));
        check_attributes(&spans, &mut kinds);
        let (resource, _) = &spans[0];
        // OTEL_SERVICE_NAME wins over a service.name in OTEL_RESOURCE_ATTRIBUTES.
        assert_eq!(
            attribute(resource, "service.name")["stringValue"],
            service.as_str()
        );
        assert_eq!(
            attribute(resource, "deployment.environment.name")["stringValue"],
            "collector-test"
        );
        // Kernel spans at the nanosecond: the calibration's mapping of the device times.
        for batch in &batches {
            let view = batch.buffer.view();
            let first = view.slots().map(|s| s.header.first_ts).min().unwrap();
            let last = view.slots().map(|s| s.header.last_ts).max().unwrap();
            let wall = |ns| {
                batch
                    .calibration
                    .to_host(HostClock::Realtime, ns)
                    .to_string()
            };
            let id = batch.launch.launch_id.to_string();
            let kernel = spans
                .iter()
                .map(|(_, s)| s)
                .find(|s| {
                    let a = &s["attributes"];
                    !attribute(a, "hw.type").is_null()
                        && attribute(a, "gpu.launch_id")["intValue"] == id.as_str()
                })
                .unwrap_or_else(|| panic!("{service}: no kernel span of launch {id}"));
            assert_eq!(kernel["startTimeUnixNano"], wall(first).as_str());
            assert_eq!(kernel["endTimeUnixNano"], wall(last).as_str());
        }
    }
    // Every event: a few blocks of the GEMM, from its first launch.
    let small = support::trimmed_capture(GEMM, 1, 1);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gemm-1-block.tgpu");
    small.write(&path).unwrap();
    let err = convert(
        &collector,
        path.to_str().unwrap(),
        false,
        "warp",
        "gemm-warp-http",
    );
    let spans = collector.spans("gemm-warp-http", exported(&err), Duration::from_secs(30));
    check_attributes(&spans, &mut kinds);
    assert_eq!(
        kinds.into_iter().collect::<Vec<_>>(),
        ["event", "host", "kernel", "phase", "warp"],
        "every kind of span checked"
    );
}

/// A capture that keeps a watchdog's snapshot of a launch that never finished (issue #32):
/// exported, its launch span says so as the live layer does (`gpu.unfinished`, and the
/// snapshot's text told from the warps as `gpu.watchdog`), and no other span does.
#[test]
fn a_launch_the_watchdog_saw_running_is_marked_unfinished() {
    let Some(bin) = backends::binaries() else {
        return;
    };
    let collector = Collector::start(&bin);
    // Launch 1 finished; launch 2 (its launch span below) was still running at the snapshot.
    let mut capture = support::synthetic_capture(1, 1, 3);
    capture.host_spans.push(tracing_gpu::batch::HostSpan {
        name: "launch".into(),
        target: "collector_test".into(),
        thread_name: "main".into(),
        thread_id: 1,
        start_ns: 1_003_000_000,
        end_ns: 1_003_000_000,
        parent: None,
        launch_id: Some(2),
        fields: vec![],
    });
    let warps = "tgpu-watch 1
launch 2 snapshot 0 grid 1 1 1 warps_per_block 2 now_ns 1005000000 running_ns 2000000 warps 2
kernel stuck
r 3 -2000000 -1500000 1:7 0@-1500000
r 3 -2000000 -1500000 1:7 0@-1500000
";
    capture
        .metadata
        .push(("watchdog 2.0".into(), "the text as logged".into()));
    capture
        .metadata
        .push(("watchdog-warps 2.0".into(), warps.into()));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("stuck.tgpu");
    capture.write(&path).unwrap();
    let err = convert(&collector, path.to_str().unwrap(), false, "kernel", "stuck");
    let spans = collector.spans("stuck", exported(&err), Duration::from_secs(30));
    let mut kinds = BTreeSet::new();
    check_attributes(&spans, &mut kinds);
    let marked: Vec<&Value> = spans
        .iter()
        .map(|(_, s)| s)
        .filter(|s| !attribute(&s["attributes"], "gpu.unfinished").is_null())
        .collect();
    assert_eq!(marked.len(), 1, "{spans:?}");
    let a = &marked[0]["attributes"];
    assert_eq!(attribute(a, "gpu.unfinished")["boolValue"], true);
    // Launch 2's span: this capture's spans carry no fields, so its start tells it.
    let start = 1_003_000_000i128 + i128::from(capture.realtime_offset_ns());
    assert_eq!(marked[0]["startTimeUnixNano"], start.to_string().as_str());
    let text = attribute(a, "gpu.watchdog")["stringValue"]
        .as_str()
        .unwrap();
    // Told from the warps, not the text the run logged.
    assert_eq!(
        text.trim_end(),
        "launch 2 (stuck, grid 1x1x1, 2 warps per block) still running after 2 ms:\n  \
         2 warps in load for 2 ms, after mma (payload 7)"
    );
}
