//! OpenTelemetry export over OTLP (feature `otlp`): host spans and device phases
//! as OpenTelemetry spans, with their true start and end times, shipped to
//! Jaeger, Grafana Tempo or any OpenTelemetry collector over gRPC or
//! http/protobuf. `docs/otlp.md` shows the commands.
//!
//! [`OtlpLayer`] is two things at once:
//! - a `tracing-subscriber` [`Layer`](tracing_subscriber::Layer): each host span becomes an OpenTelemetry
//!   span stamped with wall time (`CLOCK_REALTIME`) when it opens and closes;
//! - a [`BatchSink`](crate::batch::BatchSink): each device [`Batch`](crate::batch::Batch) becomes spans with explicit times
//!   ([`opentelemetry::trace::SpanBuilder::with_start_time`], [`opentelemetry::trace::Span::end_with_timestamp`]),
//!   mapped from `%globaltimer` by [`crate::clock::Calibration::to_host`] on
//!   [`HostClock::Realtime`](crate::clock::HostClock::Realtime), under the host span that launched the kernel.
//!
//! # Two modes
//!
//! - **Standalone** (no `tracing-opentelemetry` in the subscriber): this layer
//!   exports the host spans itself, and the device spans hang under them.
//! - **Joined** (the application already has a `tracing_opentelemetry` layer):
//!   that layer owns the host spans and exports them through the application's
//!   own provider; this layer exports only the device spans, parented to the
//!   launch span's OpenTelemetry context, which it reads with
//!   [`tracing_opentelemetry::get_otel_context`]. The device spans thus join the
//!   application's trace (same trace id, the launch span as parent) and no host
//!   span is exported twice. Point both exporters at the same collector.
//!
//! [`HostSpans::Auto`] (the default) picks the mode by itself: the first time a
//! span is entered or closes, it asks whether `tracing-opentelemetry`
//! knows that span; [`HostSpans::Skip`] or [`HostSpans::Export`] fix the mode
//! explicitly.
//!
//! Asking needs the subscriber the layer sits in. It works in every shape users
//! wrap a layer in: plain, `Option<OtlpLayer>`, `Vec<Box<dyn Layer>>`,
//! `Box<dyn Layer>`, a per-layer filter, `tracing_subscriber::reload`
//! (tests/otlp_export.rs, against a real receiver). tracing-subscriber 0.3
//! does not pass `Layer::on_register_dispatch` through `Option` and `Vec`, so
//! there the layer takes the thread's default dispatcher once it is sure that
//! dispatcher holds it. `Option` or `Vec` *inside* `reload` hides the
//! subscriber entirely: the layer then counts what it could not join
//! ([`OtlpStats::unjoined`]) and warns once at the next flush, rather than
//! duplicating host spans in silence.
//!
//! # Levels of detail ([`Detail`])
//!
//! Per-warp detail swamps a tracing backend, so the default is [`Detail::Phase`]:
//! - [`Detail::Kernel`]: one span per launch, with summary attributes per event
//!   type (`gpu.phase.<name>.count`, `.total_ns`, `.p50_ns`, `.p99_ns`);
//! - [`Detail::Phase`]: the kernel span and, under it, one span per event type
//!   and warp role (warp index within the block; or per block, see
//!   [`PhaseGroup`]) covering that group's first start to last end, with
//!   `gpu.phase.count`, `gpu.phase.total_ns`, `gpu.phase.p50_ns`, `gpu.phase.p99_ns`;
//! - [`Detail::Warp`]: the kernel span, one span per (block, warp) and one per
//!   event (instants are spans of zero length).
//!
//! # Attributes
//!
//! The resource carries `service.name` (from [`OtlpLayerBuilder::service_name`],
//! else `OTEL_SERVICE_NAME`, else the SDK's default) and `OTEL_RESOURCE_ATTRIBUTES`.
//! A process may drive several GPUs, so the GPU is described on the kernel span,
//! with OpenTelemetry's hardware conventions where they exist: `hw.type = "gpu"`,
//! `hw.id` (the UUID), `hw.name`, `hw.model`, `hw.vendor`, `hw.driver_version`;
//! and `gpu.sm_count`, `gpu.compute_capability`, `gpu.device` (the ordinal),
//! `gpu.launch_id`, `gpu.grid`, `gpu.block`, `gpu.events`, `gpu.dropped`,
//! `gpu.clock.bound_ns` (the calibration's error bound). Every device span has
//! `hw.id` and `thread.name`, the synthetic thread it belongs to
//! (`GPU 0 / SM 12 / block 7 warp 3`); host spans have the real `thread.name`
//! and `code.file.path` / `code.line.number`.
//!
//! # Transport and bounds
//!
//! `opentelemetry-otlp` over gRPC (tonic) or http/protobuf (our reqwest client,
//! which also checks that a reply is an OTLP response), both on a private
//! one-thread tokio runtime, configured by the standard `OTEL_EXPORTER_OTLP_*`
//! variables unless the builder says otherwise, and by `OTEL_BSP_*` for
//! batching. An endpoint that is down, slow or hostile never blocks the
//! application:
//! - closing a host span and [`BatchSink::on_batch`](crate::batch::BatchSink::on_batch) never wait: they hand the
//!   span or batch to a bounded queue, and drop (and count) when it is full;
//! - at most `max_queue_size` finished spans wait for export (plus one export
//!   batch in flight), and at most `batch_queue` device batches wait for
//!   conversion: memory stays bounded whatever the endpoint does;
//! - one export, retries included, ends within the builder's `timeout`: the
//!   SDK cannot abort an export, so ours stops waiting for it there (dropping
//!   the request) and counts its spans as failed;
//! - [`BatchSink::flush`](crate::batch::BatchSink::flush), [`OtlpGuard::flush`] and [`OtlpGuard::finish`] (also
//!   when the guard is dropped) end within `shutdown_timeout` (default 5 s),
//!   exports in flight included: spans they could not send by then count as
//!   failed. [`OtlpGuard::give_up_at`] sets a deadline for everything;
//! - every failed export is counted, with the kind of the last failure
//!   ([`OtlpStats::last_failure`], [`ExportFailure`]: connection refused, no
//!   reply, a reply too slow or incomplete, a rejecting status, a malformed
//!   reply). The first failure (or a span dropped because the queue is full)
//!   logs one `tracing` warning under target `tracing_gpu::otlp`; later ones
//!   are only counted until an export succeeds with no drop since the previous
//!   one, which logs one `info` line. The SDK's own internal logs are compiled
//!   out;
//! - the exporter reconnects by itself: spans sent after the endpoint comes back
//!   arrive.
//!
//! A capture file ([`Capture`](crate::capture::Capture)) is shipped with [`OtlpLayer::replay`], host spans
//! and device spans with their recorded times (`examples/otlp_ship.rs`).
//!
//! Spans of the exporter's own crates (`hyper`, `h2`, `tonic`, `tower`,
//! `reqwest`, `opentelemetry*`) are never exported: exporting them would feed
//! the exporter its own traffic. Nor are the per-event fallback spans
//! (target `tracing_gpu::device`): this layer takes whole batches instead.

use std::str::FromStr;

mod builder;
mod client;
mod device;
mod export;
mod group;
mod layer;
mod replay;
mod streamed;
#[cfg(test)]
mod tests;

pub use builder::OtlpLayerBuilder;
pub use layer::{OtlpGuard, OtlpLayer};

/// How much of each launch becomes spans. See the [module docs](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Detail {
    /// One span per launch, with summary attributes.
    Kernel,
    /// One span per event type and warp role (or block), aggregated. The default.
    #[default]
    Phase,
    /// Every event, under one span per (block, warp).
    Warp,
}

/// What one [`Detail::Phase`] span aggregates over, besides the event type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum PhaseGroup {
    /// The warp index within the block, across all blocks: in a warp-specialized
    /// kernel, the warp's role (producer, consumer...). The default.
    #[default]
    WarpRole,
    /// The block.
    Block,
}

/// The OTLP transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// OTLP/gRPC (default port 4317).
    Grpc,
    /// OTLP over HTTP with protobuf bodies (default port 4318); the
    /// specification's default.
    HttpProtobuf,
}

impl FromStr for Protocol {
    type Err = String;

    /// Parses the values of `OTEL_EXPORTER_OTLP_PROTOCOL`: `grpc` or `http/protobuf`.
    fn from_str(s: &str) -> Result<Protocol, String> {
        match s.trim() {
            "grpc" => Ok(Protocol::Grpc),
            "http/protobuf" => Ok(Protocol::HttpProtobuf),
            "http/json" => Err("http/json is not supported; use grpc or http/protobuf".into()),
            other => Err(format!(
                "unknown OTLP protocol {other:?}; expected grpc or http/protobuf"
            )),
        }
    }
}

/// Who exports the host spans. See the [module docs](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum HostSpans {
    /// This layer exports them unless a `tracing_opentelemetry` layer in the
    /// same subscriber does. The default.
    #[default]
    Auto,
    /// This layer always exports them.
    Export,
    /// This layer never exports them (only device spans).
    Skip,
}

/// Why [`OtlpLayerBuilder::build`], [`OtlpGuard::flush`] or
/// [`OtlpGuard::finish`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OtlpError {
    /// A setting (from the builder or the environment) is not valid.
    #[error("invalid OTLP setting {setting}: {reason}")]
    Config {
        /// The builder method or environment variable.
        setting: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The OTLP exporter refused its configuration.
    #[error("cannot build the OTLP exporter: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
    /// A thread, the I/O runtime or the HTTP client could not be started.
    #[error("cannot start the OTLP {what}: {source}")]
    Start {
        /// Which thread or runtime.
        what: &'static str,
        /// The system's error.
        source: std::io::Error,
    },
    /// Device batches were still being converted when the flush or finish
    /// ran out of time; their spans may be lost.
    #[error("OTLP {0}: device batches still converting at the timeout")]
    Unfinished(&'static str),
    /// The OpenTelemetry SDK could not flush or shut down its exporter.
    #[error("OTLP {what}: {source}")]
    Sdk {
        /// `"flush"` or `"finish"`.
        what: &'static str,
        /// The SDK's error.
        source: opentelemetry_sdk::error::OTelSdkError,
    },
    /// The process has too many batch sinks alive.
    #[error(transparent)]
    Sink(#[from] crate::deliver::TooManySinks),
}

/// Why an export failed, as far as the exporter could tell: the last failure is
/// in [`OtlpStats::last_failure`]. Its `Display` is a short phrase, such as
/// "connection refused".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ExportFailure {
    /// Nothing listens there: the connection was refused.
    ConnectionRefused,
    /// The endpoint could not be reached otherwise (unknown host, no route).
    CannotConnect,
    /// The connection closed before any reply.
    ConnectionClosed,
    /// Connected, but no reply came within the timeout.
    NoReply,
    /// A reply began but did not complete within the timeout, or broke off.
    SlowReply,
    /// The collector refused the spans with this HTTP status.
    HttpStatus(u16),
    /// The collector refused the spans with this gRPC status code.
    GrpcStatus(i32),
    /// The reply is not an OTLP response: an HTTP success whose body does not
    /// decode as an `ExportTraceServiceResponse`, or a broken gRPC reply.
    MalformedReply,
    /// The deadline (the `shutdown_timeout` of a flush or finish, or
    /// [`OtlpGuard::give_up_at`]) passed before the spans could be sent.
    OutOfTime,
    /// Anything else.
    Other,
}

/// gRPC status codes by number, as the specification names them.
pub(crate) const GRPC_CODES: [&str; 17] = [
    "Ok",
    "Cancelled",
    "Unknown",
    "InvalidArgument",
    "DeadlineExceeded",
    "NotFound",
    "AlreadyExists",
    "PermissionDenied",
    "ResourceExhausted",
    "FailedPrecondition",
    "Aborted",
    "OutOfRange",
    "Unimplemented",
    "Internal",
    "Unavailable",
    "DataLoss",
    "Unauthenticated",
];

impl std::fmt::Display for ExportFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExportFailure::ConnectionRefused => f.write_str("connection refused"),
            ExportFailure::CannotConnect => f.write_str("cannot connect"),
            ExportFailure::ConnectionClosed => f.write_str("connection closed without a reply"),
            ExportFailure::NoReply => f.write_str("timed out waiting for a reply"),
            ExportFailure::SlowReply => f.write_str("reply too slow or incomplete"),
            ExportFailure::HttpStatus(status) => write!(f, "rejected with status {status}"),
            ExportFailure::GrpcStatus(code) => {
                let name = usize::try_from(*code)
                    .ok()
                    .and_then(|c| GRPC_CODES.get(c))
                    .unwrap_or(&"?");
                write!(f, "rejected with gRPC status {code} ({name})")
            }
            ExportFailure::MalformedReply => f.write_str("malformed reply"),
            ExportFailure::OutOfTime => f.write_str("out of time before sending"),
            ExportFailure::Other => f.write_str("export failed"),
        }
    }
}

/// Counters of what happened to the spans, for [`OtlpGuard::stats`] and
/// [`OtlpLayer::stats`]. Failures are counted here rather than logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OtlpStats {
    /// Spans the endpoint accepted.
    pub spans_exported: u64,
    /// Spans whose export failed (endpoint down, slow past the timeout,
    /// refusing, answering nonsense) or that ran out of time before being sent.
    /// Spans whose request was abandoned at the timeout are counted here,
    /// although the collector may have received them.
    pub spans_failed: u64,
    /// Spans dropped before export: the queue was full.
    pub spans_dropped: u64,
    /// Device batches dropped: the batch queue was full, or the layer was shut
    /// down or gave up before converting them.
    pub batches_dropped: u64,
    /// Export calls that failed.
    pub export_errors: u64,
    /// Why the last failed export failed.
    pub last_failure: Option<ExportFailure>,
    /// The most spans that ever waited for export at once (at most `max_queue_size`).
    pub queue_peak: u64,
    /// The queue's bound, `max_queue_size`.
    pub queue_capacity: u64,
    /// Host spans exported, and launches converted, before the layer found
    /// the subscriber it sits in (with [`HostSpans::Auto`]): host spans that
    /// `tracing-opentelemetry` may export too, device spans not under their
    /// launch span. Stays 0 in every shape tracing-subscriber lets the layer
    /// see its subscriber through (docs/subscriber.md); warned about once.
    pub unjoined: u64,
}
