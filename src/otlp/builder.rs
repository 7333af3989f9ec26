//! [`OtlpLayerBuilder`]: configuration, from code and from the standard `OTEL_*`
//! variables; `build` starts the exporter.

use std::sync::atomic::{AtomicBool, AtomicU8};
use std::sync::mpsc::sync_channel;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry::InstrumentationScope;
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider};
use opentelemetry_sdk::Resource;
use parking_lot::{Condvar, Mutex, ReentrantMutex};

use super::client::OtlpHttpClient;
use super::conversion::worker;
use super::error::OtlpError;
use super::export::CountingExporter;
use super::export::CountingProcessor;
use super::export::IoRuntime;
use super::guard::OtlpGuard;
use super::layer::Inner;
use super::layer::OtlpLayer;
use super::layer::Progress;
use super::layer::MODE_UNKNOWN;
use super::settings::{Detail, HostSpans, PhaseGroup, Protocol};
use super::state::ExportState;
use super::streamed::PresetIds;
use crate::deliver::SinkHandle;

impl OtlpLayer {
    /// A builder with the defaults: [`Detail::Phase`], the protocol and endpoint
    /// from the `OTEL_EXPORTER_OTLP_*` variables.
    pub fn builder() -> OtlpLayerBuilder {
        OtlpLayerBuilder::default()
    }
}

/// Configures an [`OtlpLayer`]; from [`OtlpLayer::builder`].
#[must_use = "a builder does nothing until `build` is called"]
#[derive(Debug, Clone)]
pub struct OtlpLayerBuilder {
    service_name: Option<String>,
    detail: Detail,
    phase_group: PhaseGroup,
    protocol: Option<Protocol>,
    endpoint: Option<String>,
    timeout: Option<Duration>,
    max_queue_size: Option<usize>,
    scheduled_delay: Option<Duration>,
    batch_queue: usize,
    shutdown_timeout: Duration,
    host_spans: HostSpans,
}

impl Default for OtlpLayerBuilder {
    fn default() -> Self {
        OtlpLayerBuilder {
            service_name: None,
            detail: Detail::default(),
            phase_group: PhaseGroup::default(),
            protocol: None,
            endpoint: None,
            timeout: None,
            max_queue_size: None,
            scheduled_delay: None,
            batch_queue: 64,
            shutdown_timeout: Duration::from_secs(5),
            host_spans: HostSpans::default(),
        }
    }
}

// The `OTEL_*` variables. opentelemetry-otlp and opentelemetry_sdk 0.33 read
// most of them themselves, and this builder leaves those to them: the endpoint
// (`OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT`, when none is given in code), the
// headers, `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES` (`Resource`),
// `OTEL_BSP_SCHEDULE_DELAY` and the other batch settings
// (`BatchConfigBuilder::default`). Three it reads here, because the layer needs
// their values and the crates read them without saying what they found
// (`Protocol::from_env`, `resolve_timeout` and `BatchConfig`'s fields are
// private): the protocol, which picks the exporter's type before it is built;
// the timeout, which is also this crate's own deadline for an export
// (`CountingExporter`); and the queue size, which the layer's counters and the
// conversion thread's patience are sized by. Their names and defaults are the
// crates'; unlike the crates, a value that does not parse is an error
// (`OtlpError::Config`), not silently the default.
use opentelemetry_otlp::{
    OTEL_EXPORTER_OTLP_PROTOCOL, OTEL_EXPORTER_OTLP_TIMEOUT, OTEL_EXPORTER_OTLP_TIMEOUT_DEFAULT,
    OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, OTEL_EXPORTER_OTLP_TRACES_TIMEOUT,
};
use opentelemetry_sdk::trace::{
    OTEL_BSP_MAX_EXPORT_BATCH_SIZE_DEFAULT, OTEL_BSP_MAX_QUEUE_SIZE,
    OTEL_BSP_MAX_QUEUE_SIZE_DEFAULT,
};

impl OtlpLayerBuilder {
    /// `service.name` of the resource. Default: `OTEL_SERVICE_NAME`, else a
    /// `service.name` in `OTEL_RESOURCE_ATTRIBUTES`, else the SDK's `unknown_service`.
    pub fn service_name(mut self, name: impl Into<String>) -> Self {
        self.service_name = Some(name.into());
        self
    }

    /// Level of detail of the device spans (default [`Detail::Phase`]).
    pub fn detail(mut self, detail: Detail) -> Self {
        self.detail = detail;
        self
    }

    /// What a [`Detail::Phase`] span groups by (default [`PhaseGroup::WarpRole`]).
    pub fn phase_group(mut self, group: PhaseGroup) -> Self {
        self.phase_group = group;
        self
    }

    /// The transport. Default: `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`, else
    /// `OTEL_EXPORTER_OTLP_PROTOCOL`, else [`Protocol::HttpProtobuf`].
    pub fn protocol(mut self, protocol: Protocol) -> Self {
        self.protocol = Some(protocol);
        self
    }

    /// The collector's address, such as `http://localhost:4317` (gRPC) or
    /// `http://localhost:4318` (HTTP). For HTTP, a URL without a path gets
    /// `/v1/traces` appended, as `OTEL_EXPORTER_OTLP_ENDPOINT` does; a URL with a
    /// path is used as it is. Default: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, else
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`, else localhost on the protocol's port.
    /// Plain-text `http://` only: this build has no TLS.
    pub fn endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.endpoint = Some(endpoint.into());
        self
    }

    /// How long one export may take, retries included: the request is abandoned
    /// then and its spans count as failed. Default:
    /// `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT`, else `OTEL_EXPORTER_OTLP_TIMEOUT`
    /// (milliseconds), else 10 s. It bounds the export thread, never the
    /// application.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// How many finished spans may wait for export; beyond it spans are dropped
    /// and counted. Default: `OTEL_BSP_MAX_QUEUE_SIZE`, else 2048.
    pub fn max_queue_size(mut self, spans: usize) -> Self {
        self.max_queue_size = Some(spans.max(1));
        self
    }

    /// How long spans may wait before a (partial) export batch goes out.
    /// Default: `OTEL_BSP_SCHEDULE_DELAY`, else 5 s.
    pub fn scheduled_delay(mut self, delay: Duration) -> Self {
        self.scheduled_delay = Some(delay);
        self
    }

    /// How many device batches may wait for conversion into spans (default 64).
    pub fn batch_queue(mut self, batches: usize) -> Self {
        self.batch_queue = batches.max(1);
        self
    }

    /// The most that [`OtlpGuard::flush`], [`OtlpGuard::finish`] and dropping
    /// the guard wait, exports in flight included (default 5 s).
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = timeout;
        self
    }

    /// Who exports host spans (default [`HostSpans::Auto`]).
    pub fn host_spans(mut self, host_spans: HostSpans) -> Self {
        self.host_spans = host_spans;
        self
    }

    /// Starts the exporter. Add the layer to the subscriber; keep the guard
    /// until the end (dropping it flushes and shuts down, within
    /// `shutdown_timeout`). Nothing is sent until spans close: a collector that is
    /// not up yet is not an error.
    pub fn build(self) -> Result<(OtlpLayer, OtlpGuard), OtlpError> {
        let protocol = match self.protocol {
            Some(p) => p,
            None => protocol_from_env()?,
        };
        let max_queue = match self.max_queue_size {
            Some(n) => n,
            None => queue_size_from_env()?,
        };
        let timeout = match self.timeout {
            Some(t) => t,
            None => timeout_from_env()?,
        };
        if let Some(e) = &self.endpoint {
            check_endpoint(e)?;
        }
        let shared = Arc::new(ExportState::new(max_queue));

        // The clients' connections and the exports' timers live on a tokio
        // runtime: a private one, so that the application needs none and its
        // own is never blocked.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("tracing-gpu-otlp-io")
            .enable_all()
            .build()
            .map_err(|source| OtlpError::Start {
                what: "I/O runtime",
                source,
            })?;
        let io = runtime.handle().clone();
        let runtime = IoRuntime(Some(runtime));
        let exporter = match protocol {
            Protocol::Grpc => {
                // tonic's channel spawns its connection task as it is built.
                let _enter = io.enter();
                let mut b = opentelemetry_otlp::SpanExporter::builder()
                    .with_tonic()
                    .with_timeout(timeout);
                if let Some(e) = &self.endpoint {
                    b = b.with_endpoint(e.clone());
                }
                b.build()?
            }
            Protocol::HttpProtobuf => {
                let client = OtlpHttpClient::new(shared.clone()).map_err(|e| OtlpError::Start {
                    what: "HTTP client",
                    source: std::io::Error::other(e),
                })?;
                let mut b = opentelemetry_otlp::SpanExporter::builder()
                    .with_http()
                    .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                    .with_http_client(client)
                    .with_timeout(timeout);
                if let Some(e) = &self.endpoint {
                    b = b.with_endpoint(http_traces_url(e)?);
                }
                b.build()?
            }
        };

        let mut batch_config = BatchConfigBuilder::default()
            .with_max_queue_size(max_queue)
            // An export starts once the conversion thread waits for room (a full
            // batch is due), not at the next scheduled export.
            .with_max_export_batch_size(
                OTEL_BSP_MAX_EXPORT_BATCH_SIZE_DEFAULT.min(shared.patient_limit() as usize),
            );
        if let Some(d) = self.scheduled_delay {
            batch_config = batch_config.with_scheduled_delay(d);
        }
        let processor = CountingProcessor {
            inner: BatchSpanProcessor::new(
                CountingExporter {
                    inner: exporter,
                    shared: shared.clone(),
                    timeout,
                    io,
                    _runtime: runtime,
                },
                batch_config.build(),
            ),
            shared: shared.clone(),
        };
        let mut resource = Resource::builder();
        // The SDK's detectors read OTEL_SERVICE_NAME, then let a service.name in
        // OTEL_RESOURCE_ATTRIBUTES override it; the specification has it the other way
        // round, so the variable is applied last.
        let from_env = std::env::var("OTEL_SERVICE_NAME")
            .ok()
            .filter(|n| !n.is_empty());
        if let Some(name) = self.service_name.or(from_env) {
            resource = resource.with_service_name(name);
        }
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            // A streamed launch's kernel span gets the id its parts named.
            .with_id_generator(PresetIds::default())
            .with_resource(resource.build())
            .build();
        let tracer = provider.tracer_with_scope(
            InstrumentationScope::builder("tracing-gpu")
                .with_version(env!("CARGO_PKG_VERSION"))
                .build(),
        );

        let (tx, rx) = sync_channel(self.batch_queue);
        let inner = Arc::new(Inner {
            tracer,
            provider,
            shared,
            detail: self.detail,
            phase_group: self.phase_group,
            host_spans: self.host_spans,
            mode: AtomicU8::new(MODE_UNKNOWN),
            materialize: ReentrantMutex::new(()),
            lookup: OnceLock::new(),
            otel_below: AtomicBool::new(false),
            slot: OnceLock::new(),
            jobs: tx,
            progress: Mutex::new(Progress::default()),
            progress_cv: Condvar::new(),
            shutdown_timeout: self.shutdown_timeout,
        });
        let worker_inner = inner.clone();
        let spawned = std::thread::Builder::new()
            .name("tracing-gpu-otlp".into())
            .spawn(move || worker(worker_inner, rx));
        if let Err(source) = spawned {
            // Nothing was queued yet: shut the provider down without waiting.
            let _ = inner.provider.shutdown_with_timeout(Duration::ZERO);
            return Err(OtlpError::Start {
                what: "conversion thread",
                source,
            });
        }
        let guard = OtlpGuard {
            inner: inner.clone(),
            done: false,
        };
        let sink = SinkHandle::new(inner.clone())?;
        let _ = inner.slot.set(sink.slot());
        Ok((OtlpLayer { inner, sink }, guard))
    }
}

pub(crate) fn protocol_from_env() -> Result<Protocol, OtlpError> {
    for var in [
        OTEL_EXPORTER_OTLP_TRACES_PROTOCOL,
        OTEL_EXPORTER_OTLP_PROTOCOL,
    ] {
        if let Some(value) = env_value(var)? {
            return value.parse().map_err(|reason| OtlpError::Config {
                setting: var.into(),
                reason,
            });
        }
    }
    Ok(Protocol::HttpProtobuf)
}

pub(crate) fn timeout_from_env() -> Result<Duration, OtlpError> {
    for var in [
        OTEL_EXPORTER_OTLP_TRACES_TIMEOUT,
        OTEL_EXPORTER_OTLP_TIMEOUT,
    ] {
        if let Some(v) = env_value(var)? {
            return match v.trim().parse::<u64>() {
                Ok(ms) => Ok(Duration::from_millis(ms)),
                Err(_) => Err(OtlpError::Config {
                    setting: var.into(),
                    reason: format!("{v:?} is not a number of milliseconds"),
                }),
            };
        }
    }
    Ok(OTEL_EXPORTER_OTLP_TIMEOUT_DEFAULT)
}

pub(crate) fn queue_size_from_env() -> Result<usize, OtlpError> {
    match env_value(OTEL_BSP_MAX_QUEUE_SIZE)? {
        None => Ok(OTEL_BSP_MAX_QUEUE_SIZE_DEFAULT),
        Some(v) => match v.trim().parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(OtlpError::Config {
                setting: OTEL_BSP_MAX_QUEUE_SIZE.into(),
                reason: format!("{v:?} is not a positive integer"),
            }),
        },
    }
}

pub(crate) fn env_value(var: &str) -> Result<Option<String>, OtlpError> {
    match std::env::var(var) {
        Ok(v) if v.trim().is_empty() => Ok(None),
        Ok(v) => Ok(Some(v)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(OtlpError::Config {
            setting: var.into(),
            reason: "not valid UTF-8".into(),
        }),
    }
}

/// Checks an endpoint given to [`OtlpLayerBuilder::endpoint`]: a plain-text
/// `http://` URL with a host (and a valid port, if any).
pub(crate) fn check_endpoint(endpoint: &str) -> Result<(), OtlpError> {
    let bad = |reason: String| OtlpError::Config {
        setting: "endpoint".into(),
        reason: format!("{endpoint:?}: {reason}"),
    };
    let url = reqwest::Url::parse(endpoint.trim()).map_err(|e| {
        bad(format!(
            "not a URL ({e}); expected one such as http://localhost:4318"
        ))
    })?;
    match url.scheme() {
        "http" => {}
        "https" => return Err(bad(
            "this build has no TLS: use http://, through a local collector that forwards over TLS"
                .into(),
        )),
        other => return Err(bad(format!("the scheme must be http, not {other:?}"))),
    }
    // The URL standard reads `http:///x` as host `x`: not what was meant.
    let after_scheme = endpoint.trim().split_once("://").map_or("", |(_, r)| r);
    if url.host_str().is_none_or(str::is_empty) || after_scheme.starts_with('/') {
        return Err(bad("no host".into()));
    }
    Ok(())
}

/// The traces URL for an HTTP endpoint given as a base URL (see
/// [`OtlpLayerBuilder::endpoint`]).
pub(crate) fn http_traces_url(endpoint: &str) -> Result<String, OtlpError> {
    check_endpoint(endpoint)?;
    let endpoint = endpoint.trim();
    let rest = endpoint
        .split_once("://")
        .map_or(endpoint, |(_, rest)| rest);
    let path = rest.find('/').map_or("", |i| &rest[i..]);
    Ok(match path {
        "" => format!("{endpoint}/v1/traces"),
        "/" => format!("{endpoint}v1/traces"),
        _ => endpoint.to_string(),
    })
}

#[cfg(test)]
mod tests {
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
}
