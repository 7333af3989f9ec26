//! The folder's errors: why the layer could not be built, flushed or
//! finished ([`OtlpError`]), and why an export failed ([`ExportFailure`]).

/// Why [`OtlpLayerBuilder::build`](super::OtlpLayerBuilder::build), [`OtlpGuard::flush`](super::OtlpGuard::flush) or
/// [`OtlpGuard::finish`](super::OtlpGuard::finish) failed.
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
/// in [`OtlpStats::last_failure`](super::OtlpStats::last_failure). Its `Display` is a short phrase, such as
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
    /// [`OtlpGuard::give_up_at`](super::OtlpGuard::give_up_at)) passed before the spans could be sent.
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
