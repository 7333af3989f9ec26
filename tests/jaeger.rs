//! The shipped captures exported to a real Jaeger (v1.75.0, built by
//! scripts/backends.sh), read back through its HTTP query API as its UI reads
//! them (`/api/traces`, after its adjusters, clock-skew adjustment on): at each
//! `--detail` through `tracing-gpu convert --otlp` over gRPC and HTTP, and
//! through the library's `OtlpLayer::replay`. Checked: span counts, parents,
//! start and end times to the µs against the capture, attribute types, the
//! service name from `OTEL_SERVICE_NAME`, and no span `warnings`.
#![cfg(feature = "otlp")]

mod support;

use std::collections::HashMap;
use std::time::Duration;

use serde_json::Value;
use support::backends::{self, Jaeger};
use support::cli::{run_cli_with_env, Limits};
use tracing_gpu::batch::Batch;
use tracing_gpu::capture::Capture;
use tracing_gpu::clock::HostClock;
use tracing_gpu::otlp::{Detail, OtlpLayer, Protocol};

const GEMM: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/captures/h200-gemm.tgpu");
const QUICKSTART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/captures/h200-quickstart.tgpu");
/// How long Jaeger may take to store what it was sent.
const STORED: Duration = Duration::from_secs(30);

/// The spans a backend must show for a capture at a level of detail: per
/// span, its name, its parent's name, and its start and duration in µs
/// (Jaeger's unit) where the capture fixes them.
struct Expected {
    spans: Vec<Want>,
}

/// A span's name, its parent's name, its start and duration (µs; a duration
/// of -1: not checked, as a host span may outlast its record).
type Want = (String, Option<String>, Option<(i64, i64)>);

fn us(wall_ns: u64) -> i64 {
    (wall_ns / 1_000) as i64
}

fn device_wall(batch: &Batch, ns: u64) -> u64 {
    batch.calibration.to_host(HostClock::Realtime, ns)
}

/// What `capture` becomes at `detail`, from the capture alone.
fn expected(capture: &Capture, detail: Detail) -> Expected {
    let offset = capture.realtime_offset_ns();
    let mut spans = Vec::new();
    for s in &capture.host_spans {
        let parent = s
            .parent
            .map(|p| capture.host_spans[p as usize].name.clone());
        // Its start as recorded; its end may extend over what it wraps.
        let start = (i128::from(s.start_ns) + i128::from(offset)) as u64;
        spans.push((s.name.clone(), parent, Some((us(start), -1))));
    }
    for batch in capture.batches().unwrap() {
        let view = batch.buffer.view();
        let kernel = format!("{} on GPU {}", batch.launch.kernel, batch.device.ordinal);
        let launch_span = capture
            .host_spans
            .iter()
            .find(|s| s.launch_id == Some(batch.launch.launch_id))
            .map(|s| s.name.clone());
        let first = view.slots().map(|s| s.header.first_ts).min().unwrap();
        let last = view.slots().map(|s| s.header.last_ts).max().unwrap();
        let span = |from: u64, to: u64| {
            let (a, b) = (device_wall(&batch, from), device_wall(&batch, to));
            Some((us(a), ((b - a) / 1_000) as i64))
        };
        spans.push((kernel.clone(), launch_span, span(first, last)));
        let names = |id: u16| batch.registry.display_name(id).to_string();
        match detail {
            Detail::Kernel => {}
            Detail::Phase => {
                let mut groups: HashMap<(u16, u32), (u64, u64)> = HashMap::new();
                for slot in view.slots() {
                    for e in slot.events() {
                        let g = groups
                            .entry((e.id, slot.header.warp))
                            .or_insert((u64::MAX, 0));
                        *g = (g.0.min(e.start_ns), g.1.max(e.end_ns));
                    }
                }
                for ((id, warp), (from, to)) in groups {
                    let name = format!("{} (warp {warp})", names(id));
                    spans.push((name, Some(kernel.clone()), span(from, to)));
                }
            }
            _ => {
                for slot in view.slots() {
                    let h = &slot.header;
                    let warp = format!("block {} warp {}", h.block_linear, h.warp);
                    spans.push((
                        warp.clone(),
                        Some(kernel.clone()),
                        span(h.first_ts, h.last_ts),
                    ));
                    for e in slot.events() {
                        spans.push((names(e.id), Some(warp.clone()), span(e.start_ns, e.end_ns)));
                    }
                }
            }
        }
    }
    Expected { spans }
}

/// Checks the traces Jaeger shows for `service` against `want`.
fn check(jaeger: &Jaeger, service: &str, want: &Expected) {
    let traces = jaeger.traces(service, want.spans.len(), STORED);
    let services = jaeger.get("/api/services");
    assert!(
        services["data"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s == service),
        "{service} not in {services}"
    );
    let mut got = Vec::new();
    for trace in &traces {
        let spans = trace["spans"].as_array().unwrap();
        let by_id: HashMap<&str, &Value> = spans
            .iter()
            .map(|s| (s["spanID"].as_str().unwrap(), s))
            .collect();
        for (_, p) in trace["processes"].as_object().unwrap() {
            assert_eq!(p["serviceName"], service, "{p}");
        }
        for s in spans {
            let name = s["operationName"].as_str().unwrap();
            let warnings = &s["warnings"];
            assert!(
                warnings.is_null() || warnings.as_array().is_some_and(Vec::is_empty),
                "Jaeger warns about {name}: {warnings}"
            );
            let parent = s["references"].as_array().and_then(|refs| {
                let r = refs.first()?;
                assert_eq!(r["refType"], "CHILD_OF", "{name}: {r}");
                Some(&by_id[r["spanID"].as_str().unwrap()])
            });
            // Whatever its type in the capture, an integer arrives as one.
            for tag in s["tags"].as_array().unwrap() {
                let key = tag["key"].as_str().unwrap();
                if matches!(
                    key,
                    "gpu.launch_id" | "gpu.events" | "thread.id" | "gpu.device"
                ) {
                    assert_eq!(tag["type"], "int64", "{name}: {tag}");
                }
            }
            if let Some(parent) = parent {
                // Jaeger's adjuster leaves a child alone that lies within its
                // parent, or lasts longer and starts no earlier (to the ns;
                // here in µs, start and duration each rounded down).
                let (ps, pd) = (
                    parent["startTime"].as_i64().unwrap(),
                    parent["duration"].as_i64().unwrap(),
                );
                let (cs, cd) = (
                    s["startTime"].as_i64().unwrap(),
                    s["duration"].as_i64().unwrap(),
                );
                assert!(
                    cs >= ps && (cs + cd <= ps + pd + 1 || cd > pd),
                    "{name} [{cs}, +{cd}] sticks out of its parent {} [{ps}, +{pd}]",
                    parent["operationName"]
                );
                if name.ends_with(" on GPU 0") {
                    let id = |span: &Value| {
                        span["tags"]
                            .as_array()
                            .unwrap()
                            .iter()
                            .find(|t| t["key"] == "gpu.launch_id")
                            .map(|t| t["value"].clone())
                    };
                    assert_eq!(id(parent), id(s), "a kernel under its launch span");
                }
            }
            let parent = parent.map(|p| p["operationName"].as_str().unwrap().to_string());
            got.push((
                name.to_string(),
                parent,
                s["startTime"].as_i64().unwrap(),
                s["duration"].as_i64().unwrap(),
            ));
        }
    }
    let mut want: Vec<_> = want.spans.clone();
    for (name, parent, times) in want.drain(..) {
        let found = got.iter().position(|(n, p, start, duration)| {
            *n == name
                && *p == parent
                && times.is_none_or(|(s, d)| *start == s && (d < 0 || *duration == d))
        });
        let Some(i) = found else {
            panic!("{service}: no span {name:?} under {parent:?} at {times:?} in {got:?}");
        };
        got.swap_remove(i);
    }
    assert!(got.is_empty(), "{service}: unexpected spans {got:?}");
}

/// `tracing-gpu convert CAPTURE --otlp` to Jaeger, named `service`.
fn convert(jaeger: &Jaeger, capture: &str, grpc: bool, detail: &str, service: &str) {
    let (endpoint, protocol) = match grpc {
        true => (format!("http://{}", jaeger.grpc), "grpc"),
        false => (format!("http://{}", jaeger.http), "http/protobuf"),
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
                Some("deployment.environment.name=jaeger-test"),
            ),
        ],
        Limits::wall(Duration::from_secs(120)),
    );
    assert_eq!(run.code, Some(0), "{service}: {}", run.stderr);
}

fn convert_at_each_detail(grpc: bool) {
    let Some(bin) = backends::binaries() else {
        return;
    };
    let jaeger = Jaeger::start(&bin);
    let transport = if grpc { "grpc" } else { "http" };
    let gemm = Capture::read(GEMM).unwrap();
    let quickstart = Capture::read(QUICKSTART).unwrap();
    for (capture, path, detail, level) in [
        (&gemm, GEMM, Detail::Kernel, "kernel"),
        (&gemm, GEMM, Detail::Phase, "phase"),
        (&quickstart, QUICKSTART, Detail::Phase, "phase"),
    ] {
        let name = std::path::Path::new(path)
            .file_stem()
            .unwrap()
            .to_str()
            .unwrap();
        let service = format!("{name}-{level}-{transport}");
        convert(&jaeger, path, grpc, level, &service);
        check(&jaeger, &service, &expected(capture, detail));
    }
    // Every event: a few blocks of the GEMM.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gemm-2-blocks.tgpu");
    let small = support::trimmed_capture(GEMM, 2, usize::MAX);
    small.write(&path).unwrap();
    let service = format!("gemm-warp-{transport}");
    convert(&jaeger, path.to_str().unwrap(), grpc, "warp", &service);
    check(&jaeger, &service, &expected(&small, Detail::Warp));
}

#[test]
fn convert_over_grpc_reads_right_in_jaeger() {
    convert_at_each_detail(true);
}

#[test]
fn convert_over_http_reads_right_in_jaeger() {
    convert_at_each_detail(false);
}

/// The live layers' CPU path: `OtlpLayer::replay` in this process.
#[test]
fn the_layers_replay_reads_right_in_jaeger() {
    let Some(bin) = backends::binaries() else {
        return;
    };
    let jaeger = Jaeger::start(&bin);
    let capture = Capture::read(GEMM).unwrap();
    for (protocol, addr, service) in [
        (Protocol::Grpc, jaeger.grpc, "layer-grpc"),
        (Protocol::HttpProtobuf, jaeger.http, "layer-http"),
    ] {
        let (layer, guard) = OtlpLayer::builder()
            .service_name(service)
            .protocol(protocol)
            .endpoint(format!("http://{addr}"))
            .detail(Detail::Phase)
            .build()
            .unwrap();
        layer.replay(&capture, capture.batches().unwrap());
        let stats = guard.finish().unwrap();
        assert_eq!(
            (
                stats.spans_failed,
                stats.spans_dropped,
                stats.spans_rejected
            ),
            (0, 0, 0),
            "{stats:?}"
        );
        check(&jaeger, service, &expected(&capture, Detail::Phase));
    }
}

/// The rows of Jaeger's trace view for `trace` (one trace of `/api/traces`), as
/// its UI lays them out: depth first from the root, a span's children by start
/// time (then by name, where they start in the same µs, as the UI leaves them
/// in no set order); each row its depth, its start from the trace's start and
/// its duration (µs), and its name.
fn rows(trace: &Value) -> Vec<(usize, i64, i64, String)> {
    let spans = trace["spans"].as_array().unwrap();
    let parent = |s: &Value| {
        s["references"]
            .as_array()
            .and_then(|r| r.first())
            .map(|r| r["spanID"].as_str().unwrap().to_string())
    };
    let mut children: HashMap<Option<String>, Vec<&Value>> = HashMap::new();
    for s in spans {
        children.entry(parent(s)).or_default().push(s);
    }
    for list in children.values_mut() {
        list.sort_by_key(|s| {
            (
                s["startTime"].as_i64().unwrap(),
                s["operationName"].as_str().unwrap().to_string(),
            )
        });
    }
    let roots = &children[&None];
    assert_eq!(roots.len(), 1, "one root");
    let t0 = roots[0]["startTime"].as_i64().unwrap();
    let mut rows = Vec::new();
    let mut stack = vec![(0, roots[0])];
    while let Some((depth, s)) = stack.pop() {
        rows.push((
            depth,
            s["startTime"].as_i64().unwrap() - t0,
            s["duration"].as_i64().unwrap(),
            s["operationName"].as_str().unwrap().to_string(),
        ));
        let id = Some(s["spanID"].as_str().unwrap().to_string());
        for c in children.get(&id).into_iter().flatten().rev() {
            stack.push((depth + 1, c));
        }
    }
    rows
}

/// The rows docs/otlp.md shows ("How a GEMM trace reads in Jaeger"), from
/// its text block: start and duration (µs), then the name indented two spaces
/// per level.
fn documented_rows() -> Vec<(usize, i64, i64, String)> {
    let doc = include_str!("../docs/otlp.md");
    let Some(block) = doc
        .split("<!-- jaeger-rows: checked by tests/jaeger.rs -->\n```text\n")
        .nth(1)
    else {
        return Vec::new();
    };
    block
        .split("\n```")
        .next()
        .unwrap()
        .lines()
        .skip(1) // the heading
        .map(|line| {
            let mut words = line.split_whitespace();
            let start = words.next().unwrap().parse().unwrap();
            let duration = words.next().unwrap().parse().unwrap();
            let name_at = line.find(char::is_alphabetic).unwrap();
            let depth = (name_at - 25) / 2;
            (depth, start, duration, line[name_at..].to_string())
        })
        .collect()
}

/// How docs/otlp.md says the GEMM capture reads in Jaeger's trace view, row by
/// row, is how the real Jaeger's query API gives it.
#[test]
fn the_gemm_trace_reads_in_jaeger_as_docs_otlp_md_shows() {
    let Some(bin) = backends::binaries() else {
        return;
    };
    let jaeger = Jaeger::start(&bin);
    let gemm = Capture::read(GEMM).unwrap();
    convert(&jaeger, GEMM, false, "phase", "gemm-rows");
    let n = expected(&gemm, Detail::Phase).spans.len();
    let traces = jaeger.traces("gemm-rows", n, STORED);
    assert_eq!(traces.len(), 1, "one trace");
    let got = rows(&traces[0]);
    let shown: Vec<String> = got
        .iter()
        .map(|(depth, start, duration, name)| {
            format!(
                "{start:>10} {duration:>10}    {}{name}",
                "  ".repeat(*depth)
            )
        })
        .collect();
    assert_eq!(
        documented_rows(),
        got,
        "docs/otlp.md's rows; Jaeger's:\n  start µs   lasts µs    span\n{}",
        shown.join("\n")
    );
}
