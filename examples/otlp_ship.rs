//! Sends a capture file (by default the one shipped in `captures/`) to an OTLP
//! endpoint: its host spans and every launch's device spans, with their recorded
//! times. No GPU needed. See docs/otlp.md for Jaeger and Tempo.
//!
//! ```sh
//! cargo run --release --features otlp --example otlp_ship -- http://localhost:4318
//! cargo run --release --features otlp --example otlp_ship -- http://localhost:4317 \
//!     --protocol grpc --detail warp --capture my-run.tgpu --service my-service
//! ```
//!
//! Exit status: 0 when the endpoint accepted every span; 1 otherwise (with the
//! counts), 2 on a usage error.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use tracing_gpu::capture::CaptureReader;
use tracing_gpu::otlp::{Detail, OtlpLayer, Protocol};

const USAGE: &str = "usage: otlp_ship ENDPOINT [--protocol grpc|http/protobuf] \
[--detail kernel|phase|warp] [--capture FILE.tgpu] [--service NAME]";

struct Args {
    endpoint: String,
    protocol: Protocol,
    detail: Detail,
    capture: Option<PathBuf>,
    service: String,
}

fn parse_args() -> Result<Args, String> {
    let mut args = std::env::args().skip(1);
    let mut out = Args {
        endpoint: String::new(),
        protocol: Protocol::HttpProtobuf,
        detail: Detail::Phase,
        capture: None,
        service: "tracing-gpu-capture".into(),
    };
    while let Some(a) = args.next() {
        let mut value = || args.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--protocol" => {
                out.protocol = match value()?.as_str() {
                    "http" => Protocol::HttpProtobuf,
                    p => p.parse()?,
                }
            }
            "--detail" => {
                out.detail = match value()?.as_str() {
                    "kernel" => Detail::Kernel,
                    "phase" => Detail::Phase,
                    "warp" => Detail::Warp,
                    d => return Err(format!("unknown detail {d:?}")),
                }
            }
            "--capture" => out.capture = Some(value()?.into()),
            "--service" => out.service = value()?,
            "-h" | "--help" => return Err(String::new()),
            _ if a.starts_with('-') => return Err(format!("unknown option {a}")),
            _ if out.endpoint.is_empty() => out.endpoint = a,
            _ => return Err(format!("unexpected argument {a:?}")),
        }
    }
    if out.endpoint.is_empty() {
        return Err("missing ENDPOINT".into());
    }
    Ok(out)
}

/// The capture shipped with the repository: the first `captures/*.tgpu`.
fn shipped_capture() -> Result<PathBuf, String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("captures");
    let mut found: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map_err(|e| format!("{}: {e}; pass --capture FILE", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "tgpu"))
        .collect();
    found.sort();
    found.into_iter().next().ok_or(format!(
        "no .tgpu file in {}; pass --capture FILE",
        dir.display()
    ))
}

fn run(args: Args) -> Result<bool, String> {
    let path = match args.capture {
        Some(p) => p,
        None => shipped_capture()?,
    };
    let cannot_read = |e| format!("{}: {e}", path.display());
    // A launch at a time: a capture of any size.
    let mut reader = CaptureReader::open(&path).map_err(cannot_read)?;
    let launches = reader.launch_count();
    let batches = reader.batches().map_err(cannot_read)?;
    let head = batches.head();
    let (layer, guard) = OtlpLayer::builder()
        .service_name(args.service)
        .protocol(args.protocol)
        .endpoint(&args.endpoint)
        .detail(args.detail)
        .timeout(Duration::from_secs(10))
        .shutdown_timeout(Duration::from_secs(30))
        .build()
        .map_err(|e| e.to_string())?;
    let (mut events, mut unread) = (0, None);
    let batches = batches.map_while(|b| match b {
        Ok(b) => {
            events += b.buffer.event_count();
            Some(b)
        }
        Err(e) => {
            unread = Some(cannot_read(e));
            None
        }
    });
    layer.replay(head, batches);
    if let Some(e) = unread {
        return Err(e);
    }
    let flushed = guard.flush().and(guard.finish());
    let stats = match &flushed {
        Ok(stats) => *stats,
        Err(_) => layer.stats(),
    };
    println!(
        "{}: {} host spans, {} launches ({} device events) → {}: {} spans exported, \
         {} failed, {} dropped",
        path.display(),
        head.host_spans.len(),
        launches,
        events,
        args.endpoint,
        stats.spans_exported,
        stats.spans_failed,
        stats.spans_dropped + stats.batches_dropped,
    );
    if let Err(e) = flushed {
        eprintln!("otlp_ship: {e}");
    }
    Ok(stats.spans_exported > 0 && stats.spans_failed == 0 && stats.spans_dropped == 0)
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("otlp_ship: {e}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("otlp_ship: {e}");
            ExitCode::FAILURE
        }
    }
}
