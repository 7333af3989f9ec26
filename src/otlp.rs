//! OpenTelemetry export over OTLP (feature `otlp`): host spans and device phases
//! as OpenTelemetry spans, with their true start and end times, shipped to
//! Jaeger, Grafana Tempo or any OpenTelemetry collector over gRPC or
//! http/protobuf. `docs/otlp.md` shows the commands.
//!
//! [`OtlpLayer`] is two things at once:
//! - a `tracing-subscriber` [`Layer`]: each host span becomes an OpenTelemetry
//!   span stamped with wall time (`CLOCK_REALTIME`) when it opens and closes;
//! - a [`BatchSink`]: each device [`Batch`] becomes spans with explicit times
//!   ([`SpanBuilder::with_start_time`], [`opentelemetry::trace::Span::end_with_timestamp`]),
//!   mapped from `%globaltimer` by [`crate::clock::Calibration::to_host`] on
//!   [`HostClock::Realtime`], under the host span that launched the kernel.
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
//! span is entered or gets a child, it asks whether `tracing-opentelemetry`
//! knows that span. Until then (a root span closed without ever being entered)
//! it cannot tell, and exports the span itself; [`HostSpans::Skip`] or
//! [`HostSpans::Export`] fix the mode explicitly.
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
//! `opentelemetry-otlp` over gRPC (tonic, on a private one-thread tokio runtime)
//! or http/protobuf (a blocking client on the SDK's export thread), configured by
//! the standard `OTEL_EXPORTER_OTLP_*` variables unless the builder says
//! otherwise, and by `OTEL_BSP_*` for batching. An endpoint that is down or slow
//! never blocks the application:
//! - closing a host span and [`BatchSink::on_batch`] never wait: they hand the
//!   span or batch to a bounded queue, and drop (and count) when it is full;
//! - at most `max_queue_size` finished spans wait for export (plus one export
//!   batch in flight), and at most `batch_queue` device batches wait for
//!   conversion: memory stays bounded whatever the endpoint does;
//! - [`BatchSink::flush`] and [`OtlpGuard::flush`] wait at most
//!   `shutdown_timeout` for the conversion, plus at most 5 s (the SDK's fixed
//!   flush timeout) for the export; dropping the [`OtlpGuard`] waits at most
//!   `shutdown_timeout` (default 5 s) in all;
//! - the first failure (an export error, or a span dropped because the queue is
//!   full) logs one `tracing` warning under target `tracing_gpu::otlp`; later
//!   failures are only counted ([`OtlpStats`]) until an export succeeds with no
//!   drop since the previous one, which logs one `info` line. The SDK's own
//!   internal logs are compiled out;
//! - the exporter reconnects by itself: spans sent after the endpoint comes back
//!   arrive.
//!
//! A capture file ([`Dump`]) is shipped with [`OtlpLayer::replay`], host spans
//! and device spans with their recorded times (`examples/otlp_ship.rs`).
//!
//! Spans of the exporter's own crates (`hyper`, `h2`, `tonic`, `tower`,
//! `reqwest`, `opentelemetry*`) are never exported: exporting them would feed
//! the exporter its own traffic. Nor are the bridge's per-event fallback spans
//! (target `tracing_gpu::device`): this layer takes whole batches instead.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use opentelemetry::trace::{
    Span as _, SpanBuilder, SpanKind, TraceContextExt, Tracer as _, TracerProvider as _,
};
use opentelemetry::{
    Array, Context as OtelContext, InstrumentationScope, KeyValue, StringValue, Value,
};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, SdkTracer, SdkTracerProvider, SpanData, SpanExporter,
    SpanProcessor,
};
use opentelemetry_sdk::Resource;
use parking_lot::{Condvar, Mutex, ReentrantMutex};
use tracing::dispatcher::WeakDispatch;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Dispatch, Subscriber};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::registry::{LookupSpan, SpanRef};

use crate::bridge::{thread_name, Batch, BatchSink, DeviceInfo, DEVICE_TARGET};
use crate::clock::{HostClock, HostOffsets};
use crate::decode::EventKind;
use crate::dump::Dump;
use crate::format::NO_CLUSTER;

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

/// Why [`OtlpLayerBuilder::build`] or [`OtlpGuard::shutdown`] failed.
#[derive(Debug, thiserror::Error)]
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
    /// A thread or the gRPC runtime could not be started.
    #[error("cannot start the OTLP {what}: {source}")]
    Start {
        /// Which thread or runtime.
        what: &'static str,
        /// The system's error.
        source: std::io::Error,
    },
    /// Shutting down did not finish within its bound; spans may be lost.
    #[error("OTLP shutdown: {0}")]
    Shutdown(String),
}

/// Counters of what happened to the spans, for [`OtlpGuard::stats`] and
/// [`OtlpLayer::stats`]. Failures are counted here rather than logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OtlpStats {
    /// Spans the endpoint accepted.
    pub spans_exported: u64,
    /// Spans whose export failed (endpoint down, slow past the timeout, or refusing).
    pub spans_failed: u64,
    /// Spans dropped before export: the queue was full.
    pub spans_dropped: u64,
    /// Device batches dropped: the batch queue was full, or the layer was shut down.
    pub batches_dropped: u64,
    /// Export calls that failed.
    pub export_errors: u64,
    /// The most spans that ever waited for export at once (at most `max_queue_size`).
    pub queue_peak: u64,
    /// The queue's bound, `max_queue_size`.
    pub queue_capacity: u64,
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

const OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: &str = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL";
const OTEL_EXPORTER_OTLP_PROTOCOL: &str = "OTEL_EXPORTER_OTLP_PROTOCOL";
const OTEL_BSP_MAX_QUEUE_SIZE: &str = "OTEL_BSP_MAX_QUEUE_SIZE";
const DEFAULT_MAX_QUEUE_SIZE: usize = 2048;
const DEFAULT_MAX_EXPORT_BATCH_SIZE: usize = 512;

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
        Ok((OtlpLayer { inner }, guard))
    }
}

fn protocol_from_env() -> Result<Protocol, OtlpError> {
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

fn queue_size_from_env() -> Result<usize, OtlpError> {
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

fn env_value(var: &str) -> Result<Option<String>, OtlpError> {
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
fn http_traces_url(endpoint: &str) -> Result<String, OtlpError> {
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

/// A tokio runtime that is shut down without blocking: dropping a runtime
/// inside another runtime's async context would panic.
struct IoRuntime(Option<tokio::runtime::Runtime>);

impl Drop for IoRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

// --------------------------------------------------------------------------
// Counting, the bounded queue and the one warning.

/// State shared by the layer, the conversion thread and the SDK's export thread.
struct Shared {
    max_queue: u64,
    /// Spans handed to the SDK and not yet taken by an export.
    in_queue: AtomicU64,
    room: Mutex<()>,
    room_cv: Condvar,
    exported: AtomicU64,
    failed: AtomicU64,
    dropped: AtomicU64,
    batches_dropped: AtomicU64,
    export_errors: AtomicU64,
    queue_peak: AtomicU64,
    /// Set by the first failure (which warns); cleared when export recovers.
    degraded: AtomicBool,
    /// `dropped` at the last successful export.
    dropped_at_export: AtomicU64,
    /// The subscriber this layer sits in: warnings go there, from any thread.
    dispatch: OnceLock<WeakDispatch>,
    /// Set when the guard shuts down: conversion stops waiting for room.
    stopped: AtomicBool,
    /// The warning of [`Shared::warn_once`], until a thread of ours logs it.
    pending_warning: Mutex<Option<String>>,
}

thread_local! {
    /// Set on the conversion thread: there, a full queue means waiting for room
    /// (it is our thread), not dropping.
    static PATIENT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl Shared {
    fn new(max_queue: usize) -> Shared {
        Shared {
            max_queue: max_queue as u64,
            in_queue: AtomicU64::new(0),
            room: Mutex::new(()),
            room_cv: Condvar::new(),
            exported: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            batches_dropped: AtomicU64::new(0),
            export_errors: AtomicU64::new(0),
            queue_peak: AtomicU64::new(0),
            degraded: AtomicBool::new(false),
            dropped_at_export: AtomicU64::new(0),
            dispatch: OnceLock::new(),
            stopped: AtomicBool::new(false),
            pending_warning: Mutex::new(None),
        }
    }

    /// Room left for host spans while device spans wait: an eighth of the queue.
    fn patient_limit(&self) -> u64 {
        self.max_queue - (self.max_queue / 8).max(1).min(self.max_queue - 1)
    }

    /// Takes one place in the queue, or counts a drop. Never blocks, except on
    /// the conversion thread, which waits for room (and gives up at shutdown).
    fn admit(&self) -> bool {
        if PATIENT.with(|p| p.get()) {
            let limit = self.patient_limit();
            let mut guard = self.room.lock();
            while self.in_queue.load(Ordering::Acquire) >= limit {
                if self.stopped.load(Ordering::Acquire) {
                    drop(guard);
                    return self.refuse("the OTLP layer was shut down with spans still to convert");
                }
                // Exports and the shutdown notify under `room`: no lost wake-up.
                self.room_cv.wait(&mut guard);
            }
        }
        let before = self.in_queue.fetch_add(1, Ordering::AcqRel);
        if before >= self.max_queue {
            self.in_queue.fetch_sub(1, Ordering::AcqRel);
            return self.refuse("the OTLP export queue is full");
        }
        self.queue_peak.fetch_max(before + 1, Ordering::Relaxed);
        true
    }

    fn refuse(&self, why: &str) -> bool {
        self.dropped.fetch_add(1, Ordering::Relaxed);
        self.warn_once(why);
        false
    }

    fn leave_queue(&self, n: u64) {
        self.in_queue.fetch_sub(n, Ordering::AcqRel);
        let _guard = self.room.lock();
        self.room_cv.notify_all();
    }

    fn exported(&self, n: u64) {
        self.exported.fetch_add(n, Ordering::Relaxed);
        self.log_pending();
        // Recovered: an export went through and nothing was dropped since the
        // previous one (under steady load the queue need never be empty).
        let dropped = self.dropped.load(Ordering::Relaxed);
        let before = self.dropped_at_export.swap(dropped, Ordering::AcqRel);
        if dropped == before && self.degraded.swap(false, Ordering::AcqRel) {
            let failed = self.failed.load(Ordering::Relaxed);
            self.emit(|| {
                tracing::info!(
                    spans_failed = failed,
                    spans_dropped = dropped,
                    "OTLP export recovered"
                )
            });
        }
    }

    fn failed(&self, n: u64, error: &OTelSdkError) {
        self.failed.fetch_add(n, Ordering::Relaxed);
        self.export_errors.fetch_add(1, Ordering::Relaxed);
        self.warn_once(&format!("OTLP export failed: {error}"));
        self.log_pending();
    }

    /// The one warning of an outage. It is only noted here and logged by
    /// [`Shared::log_pending`] on a thread of ours: when a span closes in the
    /// application, we are inside a `tracing` callback, where `tracing` drops
    /// nested events.
    fn warn_once(&self, what: &str) {
        if !self.degraded.swap(true, Ordering::AcqRel) {
            *self.pending_warning.lock() = Some(what.to_string());
        }
    }

    /// Logs the warning noted by [`Shared::warn_once`], if any.
    fn log_pending(&self) {
        let Some(what) = self.pending_warning.lock().take() else {
            return;
        };
        let max_queue = self.max_queue;
        self.emit(|| {
            tracing::warn!(
                max_queue,
                "{what}; up to {max_queue} spans wait and later ones are dropped; \
                 further failures are counted (OtlpGuard::stats), not logged, \
                 until export recovers"
            )
        });
    }

    fn emit(&self, event: impl FnOnce()) {
        match self.dispatch.get().and_then(WeakDispatch::upgrade) {
            Some(d) => tracing::dispatcher::with_default(&d, event),
            None => event(),
        }
    }

    fn stats(&self) -> OtlpStats {
        OtlpStats {
            spans_exported: self.exported.load(Ordering::Relaxed),
            spans_failed: self.failed.load(Ordering::Relaxed),
            spans_dropped: self.dropped.load(Ordering::Relaxed),
            batches_dropped: self.batches_dropped.load(Ordering::Relaxed),
            export_errors: self.export_errors.load(Ordering::Relaxed),
            queue_peak: self.queue_peak.load(Ordering::Relaxed),
            queue_capacity: self.max_queue,
        }
    }
}

/// The SDK's batch processor behind our admission: we count every span and
/// drop before the SDK's channel could fill.
#[derive(Debug)]
struct CountingProcessor {
    inner: BatchSpanProcessor,
    shared: Arc<Shared>,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("stats", &self.stats())
            .finish()
    }
}

impl SpanProcessor for CountingProcessor {
    fn on_start(&self, span: &mut opentelemetry_sdk::trace::Span, cx: &OtelContext) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        if self.shared.admit() {
            self.inner.on_end(span);
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// The OTLP exporter behind our counters: a failed export is counted and warned
/// about once, and reported to the SDK as done, so the SDK logs nothing.
#[derive(Debug)]
struct CountingExporter<E> {
    inner: E,
    shared: Arc<Shared>,
}

impl<E: SpanExporter> SpanExporter for CountingExporter<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let n = batch.len() as u64;
        self.shared.leave_queue(n);
        self.shared.log_pending();
        match self.inner.export(batch).await {
            Ok(()) => self.shared.exported(n),
            Err(e) => self.shared.failed(n, &e),
        }
        Ok(())
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

// --------------------------------------------------------------------------
// The layer.

const MODE_UNKNOWN: u8 = 0;
const MODE_STANDALONE: u8 = 1;
const MODE_JOINED: u8 = 2;

/// Looks a span up in the subscriber the layer was added to (monomorphized in
/// [`Layer::on_layer`], where that subscriber's type is known).
type Lookup = fn(&Inner, &Dispatch, &Id) -> Option<OtelContext>;

struct Inner {
    tracer: SdkTracer,
    provider: SdkTracerProvider,
    shared: Arc<Shared>,
    detail: Detail,
    phase_group: PhaseGroup,
    host_spans: HostSpans,
    /// [`HostSpans::Auto`]'s finding: `MODE_*`.
    mode: AtomicU8,
    /// Serializes the creation of a host span's OpenTelemetry span, so that two
    /// threads never create two for one span (reentrant: creating a span may
    /// emit tracing events).
    materialize: ReentrantMutex<()>,
    lookup: OnceLock<Lookup>,
    jobs: SyncSender<Job>,
    progress: Mutex<Progress>,
    progress_cv: Condvar,
    runtime: Mutex<IoRuntime>,
    /// Bounds flushes and the shutdown.
    shutdown_timeout: Duration,
}

#[derive(Default)]
struct Progress {
    submitted: u64,
    done: u64,
    exited: bool,
}

enum Job {
    Batch(Arc<Batch>, OtelContext),
    Stop,
}

/// The `tracing` layer and [`BatchSink`] that ships spans over OTLP. See the
/// [module docs](self). Built by [`OtlpLayer::builder`].
pub struct OtlpLayer {
    inner: Arc<Inner>,
}

impl fmt::Debug for OtlpLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OtlpLayer")
            .field("detail", &self.inner.detail)
            .field("phase_group", &self.inner.phase_group)
            .field("host_spans", &self.inner.host_spans)
            .field("stats", &self.inner.shared.stats())
            .finish()
    }
}

impl OtlpLayer {
    /// A builder with the defaults: [`Detail::Phase`], the protocol and endpoint
    /// from the `OTEL_EXPORTER_OTLP_*` variables.
    pub fn builder() -> OtlpLayerBuilder {
        OtlpLayerBuilder::default()
    }

    /// What happened to the spans so far.
    pub fn stats(&self) -> OtlpStats {
        self.inner.shared.stats()
    }

    /// Ships a recorded run (a capture file, [`Dump`]) with its recorded times,
    /// without a subscriber: the dump's host spans (BOOTTIME, moved to wall time
    /// by the offset measured with the first calibration), and each of `batches`
    /// under the host span that wraps its launch (matched by launch id).
    ///
    /// Unlike the live path this waits for room in the queues instead of
    /// dropping (a replay is not an application's hot path); it returns once
    /// everything is handed over. Follow with [`OtlpGuard::flush`] and check
    /// [`OtlpGuard::stats`].
    pub fn replay(&self, dump: &Dump, batches: &[Arc<Batch>]) {
        let inner = &self.inner;
        let _patient = Patient::new();
        let realtime_offset = dump
            .devices
            .iter()
            .find_map(|d| d.calibrations.first())
            .map_or_else(
                || HostOffsets::measure().of(HostClock::Realtime),
                |c| c.realtime_offset_ns,
            );
        let wall = |boottime_ns: u64| {
            let ns = (i128::from(boottime_ns) + i128::from(realtime_offset)).max(0);
            UNIX_EPOCH + Duration::from_nanos(ns as u64)
        };
        // Parents come before their children in a dump: build in order, end at the end.
        let mut contexts: Vec<OtelContext> = Vec::with_capacity(dump.host_spans.len());
        let mut launches = HashMap::new();
        for span in &dump.host_spans {
            let parent = span
                .parent
                .and_then(|p| contexts.get(p as usize))
                .cloned()
                .unwrap_or_default();
            let mut attributes = vec![
                KeyValue::new("thread.name", span.thread_name.clone()),
                KeyValue::new("thread.id", span.thread_id as i64),
            ];
            attributes.extend(
                span.fields
                    .iter()
                    .map(|(k, v)| KeyValue::new(k.clone(), v.clone())),
            );
            let otel = inner.tracer.build_with_context(
                SpanBuilder::from_name(span.name.clone())
                    .with_kind(SpanKind::Internal)
                    .with_start_time(wall(span.start_ns))
                    .with_attributes(attributes),
                &parent,
            );
            let cx = parent.with_span(otel);
            if let Some(launch_id) = span.launch_id {
                launches.insert(launch_id, cx.clone());
            }
            contexts.push(cx);
        }
        for batch in batches {
            let parent = launches
                .get(&batch.launch.launch_id)
                .cloned()
                .unwrap_or_default();
            if inner.shared.stopped.load(Ordering::Acquire) {
                inner.shared.batches_dropped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            inner.progress.lock().submitted += 1;
            if inner.jobs.send(Job::Batch(batch.clone(), parent)).is_err() {
                inner.progress.lock().submitted -= 1;
                inner.shared.batches_dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
        for (cx, span) in contexts.iter().zip(&dump.host_spans) {
            cx.span().end_with_timestamp(wall(span.end_ns));
        }
    }
}

/// Makes the current thread wait for room in the span queue (as the conversion
/// thread does) for as long as it lives.
struct Patient(bool);

impl Patient {
    fn new() -> Patient {
        Patient(PATIENT.with(|p| p.replace(true)))
    }
}

impl Drop for Patient {
    fn drop(&mut self) {
        PATIENT.with(|p| p.set(self.0));
    }
}

/// Keeps the exporter alive; dropping it flushes and shuts it down, waiting at
/// most the builder's `shutdown_timeout`.
pub struct OtlpGuard {
    inner: Arc<Inner>,
    done: bool,
}

impl fmt::Debug for OtlpGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OtlpGuard")
            .field("shutdown_timeout", &self.inner.shutdown_timeout)
            .field("stats", &self.inner.shared.stats())
            .finish()
    }
}

impl OtlpGuard {
    /// What happened to the spans so far.
    pub fn stats(&self) -> OtlpStats {
        self.inner.shared.stats()
    }

    /// Converts the batches handed over so far and exports every finished span;
    /// waits at most `shutdown_timeout` for the conversion and 5 s for the export.
    pub fn flush(&self) -> Result<(), OtlpError> {
        let deadline = Instant::now() + self.inner.shutdown_timeout;
        let drained = self.inner.drain(deadline);
        self.inner.shared.log_pending();
        if !drained {
            return Err(OtlpError::Shutdown(
                "device batches still converting at the flush timeout".into(),
            ));
        }
        self.inner
            .provider
            .force_flush()
            .map_err(|e| OtlpError::Shutdown(e.to_string()))
    }

    /// Flushes and shuts down within `shutdown_timeout`. Spans that close later
    /// are not exported; batches handed over later are dropped and counted.
    pub fn shutdown(mut self) -> Result<(), OtlpError> {
        self.shutdown_now()
    }

    fn shutdown_now(&mut self) -> Result<(), OtlpError> {
        if std::mem::replace(&mut self.done, true) {
            return Ok(());
        }
        let inner = &self.inner;
        let deadline = Instant::now() + inner.shutdown_timeout;
        let drained = inner.drain(deadline);
        inner.shared.stopped.store(true, Ordering::Release);
        {
            let _guard = inner.shared.room.lock();
            inner.shared.room_cv.notify_all();
        }
        // If the channel is full the thread sees `stopped` after its current job.
        let _ = inner.jobs.try_send(Job::Stop);
        let left = deadline.saturating_duration_since(Instant::now());
        let result = inner.provider.shutdown_with_timeout(left);
        inner.shared.log_pending();
        // The exporter is done with the runtime, or has given up on it.
        drop(std::mem::replace(
            &mut *inner.runtime.lock(),
            IoRuntime(None),
        ));
        match (drained, result) {
            (true, Ok(())) => Ok(()),
            (false, _) => Err(OtlpError::Shutdown(
                "device batches still converting at the shutdown timeout".into(),
            )),
            (true, Err(e)) => Err(OtlpError::Shutdown(e.to_string())),
        }
    }
}

impl Drop for OtlpGuard {
    fn drop(&mut self) {
        // Bounded by `shutdown_timeout`; what did not make it is in the stats.
        let _ = self.shutdown_now();
    }
}

impl Inner {
    fn exports_host_spans(&self) -> bool {
        match self.host_spans {
            HostSpans::Export => true,
            HostSpans::Skip => false,
            HostSpans::Auto => self.mode.load(Ordering::Acquire) != MODE_JOINED,
        }
    }

    /// The context `tracing-opentelemetry` holds for span `id`, if a
    /// `tracing_opentelemetry` layer is in the subscriber and knows the span.
    /// `reliable`: every layer has seen the span's creation, so an answer of
    /// "none" means there is no such layer.
    fn joined_context(&self, id: &Id, reliable: bool) -> Option<OtelContext> {
        if self.host_spans == HostSpans::Export
            || self.mode.load(Ordering::Acquire) == MODE_STANDALONE
        {
            return None;
        }
        let dispatch = self.shared.dispatch.get()?.upgrade()?;
        let cx = tracing_opentelemetry::get_otel_context(id, &dispatch)
            .filter(|cx| cx.span().span_context().is_valid());
        if cx.is_some() {
            self.mode.store(MODE_JOINED, Ordering::Release);
        } else if reliable {
            let _ = self.mode.compare_exchange(
                MODE_UNKNOWN,
                MODE_STANDALONE,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
        cx
    }

    /// The OpenTelemetry context of host span `span`, creating our
    /// OpenTelemetry span for it if we export it. `None` for spans we ignore.
    fn materialize<S>(&self, span: &SpanRef<'_, S>, reliable: bool) -> Option<OtelContext>
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        let _serial = self.materialize.lock();
        let (start, parent) = {
            let ext = span.extensions();
            let host = ext.get::<HostSpan>()?;
            if let Some(cx) = &host.cx {
                return Some(cx.clone());
            }
            (host.start, host.parent.clone())
        };
        let (cx, owned) = if let Some(cx) = self.joined_context(&span.id(), reliable) {
            (cx, false)
        } else if self.exports_host_spans() {
            let parent = parent.unwrap_or_default();
            let builder = SpanBuilder::from_name(span.name())
                .with_kind(SpanKind::Internal)
                .with_start_time(start);
            let otel = self.tracer.build_with_context(builder, &parent);
            (parent.with_span(otel), true)
        } else {
            // Not exported by anyone we know of: its children hang under its parent.
            return parent;
        };
        let mut ext = span.extensions_mut();
        let host = ext.get_mut::<HostSpan>()?;
        host.cx = Some(cx.clone());
        host.owned = owned;
        Some(cx)
    }

    /// The parent context for a batch's spans: the launch span's. The profiler
    /// keeps that span open until [`BatchSink::on_batch`] returns (see
    /// [`crate::bridge`]), so its id is looked up now, on the caller's thread.
    fn launch_context(&self, batch: &Batch) -> OtelContext {
        let (Some(id), Some(lookup), Some(dispatch)) = (
            &batch.launch.parent,
            self.lookup.get(),
            self.shared.dispatch.get().and_then(WeakDispatch::upgrade),
        ) else {
            return OtelContext::new();
        };
        lookup(self, &dispatch, id).unwrap_or_default()
    }

    /// Waits until every batch handed over so far is converted, or `deadline`.
    fn drain(&self, deadline: Instant) -> bool {
        let mut p = self.progress.lock();
        let target = p.submitted;
        while p.done < target && !p.exited {
            if self.progress_cv.wait_until(&mut p, deadline).timed_out() {
                return p.done >= target;
            }
        }
        true
    }
}

fn lookup_launch<S>(inner: &Inner, dispatch: &Dispatch, id: &Id) -> Option<OtelContext>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    let span = dispatch.downcast_ref::<S>()?.span(id)?;
    inner.materialize(&span, true)
}

/// What the layer keeps in each host span's extensions.
struct HostSpan {
    start: SystemTime,
    attributes: Vec<KeyValue>,
    /// The parent's context, taken when the span opened (the parent may close first).
    parent: Option<OtelContext>,
    /// Set once materialized: our span's context, or `tracing-opentelemetry`'s.
    cx: Option<OtelContext>,
    /// Whether `cx` holds a span we created and must end.
    owned: bool,
}

impl HostSpan {
    fn set(&mut self, kv: KeyValue) {
        match self.attributes.iter_mut().find(|a| a.key == kv.key) {
            Some(old) => *old = kv,
            None => self.attributes.push(kv),
        }
    }
}

impl Visit for HostSpan {
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.set(KeyValue::new(field.name(), value));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.set(KeyValue::new(field.name(), value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.set(match i64::try_from(value) {
            Ok(v) => KeyValue::new(field.name(), v),
            Err(_) => KeyValue::new(field.name(), value.to_string()),
        });
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.set(KeyValue::new(field.name(), value));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.set(KeyValue::new(field.name(), value.to_string()));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.set(KeyValue::new(field.name(), format!("{value:?}")));
    }
}

/// Crates whose spans are never exported: the exporter's own, whose spans
/// would feed it its own traffic, and the bridge's per-event fallback.
fn ignored_target(target: &str) -> bool {
    let krate = target.split("::").next().unwrap_or(target);
    matches!(
        krate,
        "h2" | "hyper"
            | "hyper_util"
            | "tonic"
            | "tower"
            | "tower_http"
            | "reqwest"
            | "opentelemetry"
            | "opentelemetry_sdk"
            | "opentelemetry_otlp"
            | "opentelemetry_http"
    ) || target == DEVICE_TARGET
}

fn wall_now() -> SystemTime {
    SystemTime::now()
}

impl<S> Layer<S> for OtlpLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_register_dispatch(&self, dispatch: &Dispatch) {
        let _ = self.inner.shared.dispatch.set(dispatch.downgrade());
    }

    fn on_layer(&mut self, _subscriber: &mut S) {
        let _ = self.inner.lookup.set(lookup_launch::<S>);
    }

    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let meta = attrs.metadata();
        if ignored_target(meta.target()) {
            return;
        }
        let Some(span) = ctx.span(id) else { return };
        // Every layer has seen the parent's creation by now: a reliable time to
        // ask for (or create) its context.
        let parent = span.parent().and_then(|p| self.inner.materialize(&p, true));
        let mut host = HostSpan {
            start: wall_now(),
            attributes: Vec::with_capacity(meta.fields().len() + 3),
            parent,
            cx: None,
            owned: false,
        };
        if let Some(name) = std::thread::current().name() {
            host.attributes
                .push(KeyValue::new("thread.name", name.to_string()));
        }
        if let Some(file) = meta.file() {
            host.attributes.push(KeyValue::new("code.file.path", file));
        }
        if let Some(line) = meta.line() {
            host.attributes
                .push(KeyValue::new("code.line.number", i64::from(line)));
        }
        attrs.record(&mut host);
        span.extensions_mut().insert(host);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            if let Some(host) = span.extensions_mut().get_mut::<HostSpan>() {
                values.record(host);
            }
        }
    }

    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        // Entered: every layer has seen the span, so this is where Auto decides.
        if self.inner.host_spans != HostSpans::Auto
            || self.inner.mode.load(Ordering::Acquire) != MODE_UNKNOWN
        {
            return;
        }
        if let Some(span) = ctx.span(id) {
            self.inner.materialize(&span, true);
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        if span.extensions().get::<HostSpan>().is_none() {
            return;
        }
        if self.inner.exports_host_spans() {
            // Not reliable: a tracing-opentelemetry layer below us may have
            // closed the span already.
            self.inner.materialize(&span, false);
        }
        let Some(host) = span.extensions_mut().remove::<HostSpan>() else {
            return;
        };
        if let (true, Some(cx)) = (host.owned, &host.cx) {
            let otel = cx.span();
            otel.set_attributes(host.attributes);
            otel.end_with_timestamp(wall_now());
        }
    }
}

impl BatchSink for OtlpLayer {
    /// Finds the launch span's context, then hands the batch to the conversion
    /// thread; never blocks: a full batch queue drops the batch (counted).
    fn on_batch(&self, batch: &Arc<Batch>) {
        let inner = &self.inner;
        if inner.shared.stopped.load(Ordering::Acquire) {
            inner.shared.batches_dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let parent = inner.launch_context(batch);
        let mut p = inner.progress.lock();
        match inner.jobs.try_send(Job::Batch(batch.clone(), parent)) {
            Ok(()) => p.submitted += 1,
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                drop(p);
                inner.shared.batches_dropped.fetch_add(1, Ordering::Relaxed);
                inner
                    .shared
                    .warn_once("the OTLP device batch queue is full");
            }
        }
    }

    /// Converts what was handed over and exports it; bounded as
    /// [`OtlpGuard::flush`] is (the builder's `shutdown_timeout`, plus 5 s).
    fn flush(&self) {
        let inner = &self.inner;
        inner.drain(Instant::now() + inner.shutdown_timeout);
        let _ = inner.provider.force_flush();
    }
}

// --------------------------------------------------------------------------
// The conversion thread: batches in, spans out.

fn worker(inner: Arc<Inner>, jobs: Receiver<Job>) {
    let _patient = Patient::new();
    while let Ok(Job::Batch(batch, parent)) = jobs.recv() {
        if inner.shared.stopped.load(Ordering::Acquire) {
            // Shut down with the queue full (so `Job::Stop` may not be in it):
            // count what is left and leave.
            let left = 1 + jobs
                .try_iter()
                .filter(|j| matches!(j, Job::Batch(..)))
                .count();
            inner
                .shared
                .batches_dropped
                .fetch_add(left as u64, Ordering::Relaxed);
            break;
        }
        emit_batch(&inner, &batch, &parent);
        inner.shared.log_pending();
        inner.progress.lock().done += 1;
        inner.progress_cv.notify_all();
    }
    inner.progress.lock().exited = true;
    inner.progress_cv.notify_all();
}

/// Durations of one group of events, and its extent (device ns).
struct Group {
    first_start: u64,
    last_end: u64,
    total: u64,
    durations: Vec<u64>,
}

impl Group {
    fn new() -> Group {
        Group {
            first_start: u64::MAX,
            last_end: 0,
            total: 0,
            durations: Vec::new(),
        }
    }

    fn add(&mut self, start: u64, end: u64) {
        self.first_start = self.first_start.min(start);
        self.last_end = self.last_end.max(end);
        self.total += end - start;
        self.durations.push(end - start);
    }

    /// count, total, p50 and p99 (nearest rank), under `prefix`.
    fn summary(&mut self, prefix: &str, out: &mut Vec<KeyValue>) {
        self.durations.sort_unstable();
        let n = self.durations.len() as u64;
        let rank = |p: f64| crate::report::nearest_rank(&self.durations, p) as i64;
        out.push(KeyValue::new(format!("{prefix}.count"), n as i64));
        out.push(KeyValue::new(
            format!("{prefix}.total_ns"),
            self.total as i64,
        ));
        out.push(KeyValue::new(format!("{prefix}.p50_ns"), rank(50.0)));
        out.push(KeyValue::new(format!("{prefix}.p99_ns"), rank(99.0)));
    }
}

/// Event names and declared payload names by id, each looked up once per batch.
struct Names<'a> {
    batch: &'a Batch,
    cache: HashMap<u16, (Arc<str>, Option<Arc<str>>)>,
}

impl Names<'_> {
    fn entry(&mut self, id: u16) -> &(Arc<str>, Option<Arc<str>>) {
        let registry = &self.batch.registry;
        self.cache
            .entry(id)
            .or_insert_with(|| match registry.info(id) {
                Some(info) => (info.name.clone(), info.payload.clone()),
                None => (Arc::from(registry.display_name(id).as_ref()), None),
            })
    }

    fn get(&mut self, id: u16) -> Arc<str> {
        self.entry(id).0.clone()
    }

    /// The payload's declared name ([`crate::registry::EventRegistry::with_payload`]).
    fn payload(&mut self, id: u16) -> Option<Arc<str>> {
        self.entry(id).1.clone()
    }
}

fn device_attributes(dev: &DeviceInfo) -> Vec<KeyValue> {
    vec![
        KeyValue::new("hw.type", "gpu"),
        KeyValue::new("hw.id", dev.uuid.clone()),
        KeyValue::new("hw.name", format!("GPU {}", dev.ordinal)),
        KeyValue::new("hw.model", dev.name.clone()),
        KeyValue::new("hw.vendor", "NVIDIA"),
        KeyValue::new("hw.driver_version", dev.driver_version.clone()),
        KeyValue::new("gpu.device", i64::from(dev.ordinal)),
        KeyValue::new("gpu.sm_count", i64::from(dev.sm_count)),
        KeyValue::new(
            "gpu.compute_capability",
            format!("{}.{}", dev.compute_capability.0, dev.compute_capability.1),
        ),
    ]
}

fn dims(d: [u32; 3]) -> Value {
    Value::Array(Array::I64(d.iter().map(|&x| i64::from(x)).collect()))
}

fn string(s: &Arc<str>) -> StringValue {
    StringValue::from(s.clone())
}

/// Turns one batch into spans under `parent`, at the layer's level of detail.
fn emit_batch(inner: &Inner, batch: &Batch, parent: &OtelContext) {
    let capture = batch.capture.view();
    let calibration = &batch.calibration;
    let wall = |device_ns: u64| {
        UNIX_EPOCH + Duration::from_nanos(calibration.to_host(HostClock::Realtime, device_ns))
    };
    let dev = &batch.device;
    let launch = &batch.launch;
    let mut names = Names {
        batch,
        cache: HashMap::new(),
    };

    // The kernel's extent on the device: first timer read to last flush.
    let (mut first, mut last) = (u64::MAX, 0u64);
    let mut sms = std::collections::HashSet::new();
    for slot in capture.slots() {
        first = first.min(slot.header.first_ts);
        last = last.max(slot.header.last_ts);
        sms.insert(slot.header.sm_first);
    }
    let (start, end) = if first <= last {
        (wall(first), wall(last))
    } else {
        // Nothing flushed: the host's view of the launch, moved to wall time.
        let offset = calibration.latest().host_offsets.of(HostClock::Realtime);
        let host = |ns: u64| {
            let t = (i128::from(ns) + i128::from(offset)).max(0) as u64;
            UNIX_EPOCH + Duration::from_nanos(t)
        };
        (host(launch.host_launch_ns), host(launch.host_complete_ns))
    };
    let gpu: Arc<str> = Arc::from(format!("GPU {}", dev.ordinal));
    let hw_id = StringValue::from(dev.uuid.clone());

    let mut attributes = device_attributes(dev);
    attributes.extend([
        KeyValue::new("thread.name", string(&gpu)),
        KeyValue::new("gpu.launch_id", launch.launch_id as i64),
        KeyValue::new("gpu.grid", dims(launch.grid)),
        KeyValue::new("gpu.block", dims(launch.block)),
        KeyValue::new("gpu.events", capture.event_count() as i64),
        KeyValue::new("gpu.dropped", capture.drop_count() as i64),
        KeyValue::new("gpu.warps", capture.flushed_slot_count() as i64),
        KeyValue::new("gpu.sms", sms.len() as i64),
        KeyValue::new(
            "gpu.clock.bound_ns",
            calibration.bound_ns_on(HostClock::Realtime, if first <= last { first } else { 0 })
                as i64,
        ),
    ]);
    if !launch.host_thread.is_empty() {
        attributes.push(KeyValue::new("gpu.host_thread", launch.host_thread.clone()));
    }
    if inner.detail == Detail::Kernel {
        let mut by_type: BTreeMap<u16, Group> = BTreeMap::new();
        for slot in capture.slots() {
            for e in slot.events() {
                by_type
                    .entry(e.id)
                    .or_insert_with(Group::new)
                    .add(e.start_ns, e.end_ns);
            }
        }
        for (id, mut group) in by_type {
            group.summary(&format!("gpu.phase.{}", names.get(id)), &mut attributes);
        }
    }
    let kernel = inner.tracer.build_with_context(
        SpanBuilder::from_name(launch.kernel.clone())
            .with_kind(SpanKind::Internal)
            .with_start_time(start)
            .with_attributes(attributes),
        parent,
    );
    let kernel_cx = parent.with_span(kernel);

    match inner.detail {
        Detail::Kernel => {}
        Detail::Phase => {
            let mut groups: BTreeMap<(u16, u32), Group> = BTreeMap::new();
            for slot in capture.slots() {
                let role = match inner.phase_group {
                    PhaseGroup::WarpRole => slot.header.warp,
                    PhaseGroup::Block => slot.header.block_linear,
                };
                for e in slot.events() {
                    groups
                        .entry((e.id, role))
                        .or_insert_with(Group::new)
                        .add(e.start_ns, e.end_ns);
                }
            }
            for ((id, role), mut group) in groups {
                let (role_key, thread) = match inner.phase_group {
                    PhaseGroup::WarpRole => ("gpu.warp", format!("{gpu} / warp {role}")),
                    PhaseGroup::Block => ("gpu.block", format!("{gpu} / block {role}")),
                };
                let mut attributes = vec![
                    KeyValue::new("hw.id", hw_id.clone()),
                    KeyValue::new("thread.name", thread),
                    KeyValue::new("gpu.event.id", i64::from(id)),
                    KeyValue::new(role_key, i64::from(role)),
                ];
                group.summary("gpu.phase", &mut attributes);
                let span = inner.tracer.build_with_context(
                    SpanBuilder::from_name(names.get(id).to_string())
                        .with_kind(SpanKind::Internal)
                        .with_start_time(wall(group.first_start))
                        .with_attributes(attributes),
                    &kernel_cx,
                );
                let mut span = span;
                span.end_with_timestamp(wall(group.last_end));
            }
        }
        Detail::Warp => {
            for slot in capture.slots() {
                let h = &slot.header;
                let thread: Arc<str> = Arc::from(thread_name(dev.ordinal, &slot));
                let mut attributes = vec![
                    KeyValue::new("hw.id", hw_id.clone()),
                    KeyValue::new("thread.name", string(&thread)),
                    KeyValue::new("gpu.sm", i64::from(h.sm_first)),
                    KeyValue::new("gpu.block", i64::from(h.block_linear)),
                    KeyValue::new("gpu.block.index", dims(h.block)),
                    KeyValue::new("gpu.warp", i64::from(h.warp)),
                    KeyValue::new("gpu.events", i64::from(slot.event_count())),
                    KeyValue::new("gpu.dropped", i64::from(slot.drop_count())),
                ];
                if h.cluster_rank != NO_CLUSTER {
                    attributes.push(KeyValue::new("gpu.cluster_rank", i64::from(h.cluster_rank)));
                }
                if slot.migrated() {
                    attributes.push(KeyValue::new("gpu.sm_last", i64::from(h.sm_last)));
                }
                if slot.open_at_flush() {
                    attributes.push(KeyValue::new("gpu.open_at_flush", true));
                }
                let warp = inner.tracer.build_with_context(
                    SpanBuilder::from_name(format!("block {} warp {}", h.block_linear, h.warp))
                        .with_kind(SpanKind::Internal)
                        .with_start_time(wall(h.first_ts))
                        .with_attributes(attributes),
                    &kernel_cx,
                );
                let warp_cx = kernel_cx.with_span(warp);
                for e in slot.events() {
                    let mut attributes = vec![
                        KeyValue::new("hw.id", hw_id.clone()),
                        KeyValue::new("thread.name", string(&thread)),
                        KeyValue::new("gpu.event.id", i64::from(e.id)),
                        KeyValue::new("gpu.payload", i64::from(e.payload)),
                    ];
                    if let Some(p) = names.payload(e.id) {
                        attributes.push(KeyValue::new("gpu.payload.name", string(&p)));
                    }
                    if e.kind == EventKind::Instant {
                        attributes.push(KeyValue::new("gpu.event.kind", "instant"));
                    }
                    let mut span = inner.tracer.build_with_context(
                        SpanBuilder::from_name(names.get(e.id).to_string())
                            .with_kind(SpanKind::Internal)
                            .with_start_time(wall(e.start_ns))
                            .with_attributes(attributes),
                        &warp_cx,
                    );
                    span.end_with_timestamp(wall(e.end_ns));
                }
                warp_cx.span().end_with_timestamp(wall(h.last_ts));
            }
        }
    }
    kernel_cx.span().end_with_timestamp(end);
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
        for bad in ["localhost:4318", "ftp://h", "http://", "http:///x"] {
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
}
