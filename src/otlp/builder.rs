//! [`OtlpLayerBuilder`]: configuration, from code and from the standard `OTEL_*` variables.

use std::sync::atomic::AtomicU8;
use std::sync::mpsc::sync_channel;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry::InstrumentationScope;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider};
use opentelemetry_sdk::Resource;
use parking_lot::{Condvar, Mutex, ReentrantMutex};

use super::device::worker;
use super::export::CountingExporter;
use super::export::CountingProcessor;
use super::export::IoRuntime;
use super::export::Shared;
use super::layer::Inner;
use super::layer::OtlpGuard;
use super::layer::OtlpLayer;
use super::layer::Progress;
use super::layer::MODE_UNKNOWN;
use super::Detail;
use super::HostSpans;
use super::OtlpError;
use super::PhaseGroup;
use super::Protocol;
use crate::deliver::SinkHandle;

impl OtlpLayer {
    /// A builder with the defaults: [`Detail::Phase`], the protocol and endpoint
    /// from the `OTEL_EXPORTER_OTLP_*` variables.
    pub fn builder() -> OtlpLayerBuilder {
        OtlpLayerBuilder::default()
    }
}

/// Configures an [`OtlpLayer`]; from [`OtlpLayer::builder`].
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

pub(crate) const OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: &str = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL";
pub(crate) const OTEL_EXPORTER_OTLP_PROTOCOL: &str = "OTEL_EXPORTER_OTLP_PROTOCOL";
pub(crate) const OTEL_BSP_MAX_QUEUE_SIZE: &str = "OTEL_BSP_MAX_QUEUE_SIZE";
pub(crate) const DEFAULT_MAX_QUEUE_SIZE: usize = 2048;
pub(crate) const DEFAULT_MAX_EXPORT_BATCH_SIZE: usize = 512;

impl OtlpLayerBuilder {
    /// `service.name` of the resource. Default: `OTEL_SERVICE_NAME`, else the
    /// SDK's `unknown_service`.
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

    /// How long one export may take, retries included. Default:
    /// `OTEL_EXPORTER_OTLP_TIMEOUT`, else 10 s. It bounds the export thread, never
    /// the application.
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

    /// The most that dropping the [`OtlpGuard`] waits (default 5 s).
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
        let shared = Arc::new(Shared::new(max_queue));

        let mut runtime = IoRuntime(None);
        let exporter = match protocol {
            Protocol::Grpc => {
                // tonic's channel lives on a tokio runtime: a private one, so that
                // the application needs none and its own is never blocked.
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .thread_name("tracing-gpu-otlp-io")
                    .enable_all()
                    .build()
                    .map_err(|source| OtlpError::Start {
                        what: "gRPC runtime",
                        source,
                    })?;
                let exporter = {
                    let _enter = rt.enter();
                    let mut b = opentelemetry_otlp::SpanExporter::builder().with_tonic();
                    if let Some(e) = &self.endpoint {
                        b = b.with_endpoint(e.clone());
                    }
                    if let Some(t) = self.timeout {
                        b = b.with_timeout(t);
                    }
                    b.build()
                };
                runtime.0 = Some(rt);
                exporter?
            }
            Protocol::HttpProtobuf => {
                let mut b = opentelemetry_otlp::SpanExporter::builder()
                    .with_http()
                    .with_protocol(opentelemetry_otlp::Protocol::HttpBinary);
                if let Some(e) = &self.endpoint {
                    b = b.with_endpoint(http_traces_url(e)?);
                }
                if let Some(t) = self.timeout {
                    b = b.with_timeout(t);
                }
                b.build()?
            }
        };

        let mut batch_config = BatchConfigBuilder::default()
            .with_max_queue_size(max_queue)
            .with_max_export_batch_size(DEFAULT_MAX_EXPORT_BATCH_SIZE.min(max_queue));
        if let Some(d) = self.scheduled_delay {
            batch_config = batch_config.with_scheduled_delay(d);
        }
        let processor = CountingProcessor {
            inner: BatchSpanProcessor::new(
                CountingExporter {
                    inner: exporter,
                    shared: shared.clone(),
                },
                batch_config.build(),
            ),
            shared: shared.clone(),
        };
        let mut resource = Resource::builder();
        if let Some(name) = self.service_name {
            resource = resource.with_service_name(name);
        }
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
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
            jobs: tx,
            progress: Mutex::new(Progress::default()),
            progress_cv: Condvar::new(),
            runtime: Mutex::new(runtime),
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

pub(crate) fn queue_size_from_env() -> Result<usize, OtlpError> {
    match env_value(OTEL_BSP_MAX_QUEUE_SIZE)? {
        None => Ok(DEFAULT_MAX_QUEUE_SIZE),
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

/// The traces URL for an HTTP endpoint given as a base URL (see
/// [`OtlpLayerBuilder::endpoint`]).
pub(crate) fn http_traces_url(endpoint: &str) -> Result<String, OtlpError> {
    let bad = |reason: &str| OtlpError::Config {
        setting: "endpoint".into(),
        reason: format!("{endpoint:?}: {reason}"),
    };
    let (scheme, rest) = endpoint
        .split_once("://")
        .ok_or_else(|| bad("expected a URL such as http://localhost:4318"))?;
    if scheme != "http" && scheme != "https" {
        return Err(bad("the scheme must be http"));
    }
    let path = rest.find('/').map_or("", |i| &rest[i..]);
    if rest.is_empty() || rest.starts_with('/') {
        return Err(bad("no host"));
    }
    Ok(match path {
        "" => format!("{endpoint}/v1/traces"),
        "/" => format!("{endpoint}v1/traces"),
        _ => endpoint.to_string(),
    })
}
