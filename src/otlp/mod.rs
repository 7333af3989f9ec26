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
//! - [`Detail::Phase`]: the kernel span (named `<kernel> on GPU <n>`) and,
//!   under it, one span per event type and warp role (named `<event> (warp <w>)`) (warp index within the block; or per block, see
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
//! `gpu.kernel`, `gpu.launch_id`, `gpu.grid_dim`, `gpu.block_dim`, `gpu.events`, `gpu.events_lost`,
//! `gpu.clock.bound_ns` (the calibration's error bound), and `gpu.sampled` (what
//! a sampled launch recorded: its counts cover the sampled warps). Every device span has
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

mod builder;
mod client;
mod conversion;
mod error;
mod export;
mod group;
mod guard;
mod layer;
mod replay;
mod settings;
mod state;
mod streamed;

pub use builder::OtlpLayerBuilder;
pub use error::{ExportFailure, OtlpError};
pub use guard::OtlpGuard;
pub use layer::OtlpLayer;
pub use settings::{Detail, HostSpans, PhaseGroup, Protocol};
pub use state::OtlpStats;
