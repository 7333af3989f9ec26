//! The export: our counting span processor and exporter in front of the SDK's,
//! each export ended by its deadline ([`ExportState::export_deadline`]), and
//! the I/O runtime they run on.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use opentelemetry::Context as OtelContext;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{BatchSpanProcessor, SpanData, SpanExporter, SpanProcessor};
use opentelemetry_sdk::Resource;

use super::error::{ExportFailure, GRPC_CODES};
use super::state::{Attempt, ExportState};

/// A tokio runtime that is shut down without blocking: dropping a runtime
/// inside another runtime's async context would panic.
#[derive(Debug)]
pub(crate) struct IoRuntime(pub(crate) Option<tokio::runtime::Runtime>);

impl Drop for IoRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// The SDK's batch processor behind our admission: we count every span and
/// drop before the SDK's channel could fill.
#[derive(Debug)]
pub(crate) struct CountingProcessor {
    pub(crate) inner: BatchSpanProcessor,
    pub(crate) shared: Arc<ExportState>,
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

/// The OTLP exporter behind our counters and deadlines: each export ends by its
/// deadline ([`ExportState::export_deadline`]), its failure is counted with its kind
/// and warned about once, and it is reported to the SDK as done, so the SDK
/// logs nothing. The SDK's batch processor cannot abort an export (it blocks
/// its thread on it): stopping here is what bounds its flush and shutdown.
#[derive(Debug)]
pub(crate) struct CountingExporter<E> {
    pub(crate) inner: E,
    pub(crate) shared: Arc<ExportState>,
    /// The exporter's `timeout`: the most one export may take, retries included.
    pub(crate) timeout: Duration,
    pub(crate) io: tokio::runtime::Handle,
    /// Declared last: dropped after `inner`, whose connections live on it.
    pub(crate) _runtime: IoRuntime,
}

impl<E: SpanExporter> SpanExporter for CountingExporter<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let n = batch.len() as u64;
        self.shared.leave_queue(n);
        self.shared.log_pending();
        let Some(deadline) = self.shared.export_deadline(self.timeout) else {
            self.shared.out_of_time(n);
            return Ok(());
        };
        *self.shared.attempt.lock() = Attempt::default();
        let export = self.inner.export(batch);
        // The timer is made on the first poll, in the runtime's context.
        let outcome = InRuntime {
            io: self.io.clone(),
            future: Box::pin(async move { tokio::time::timeout_at(deadline.into(), export).await }),
        }
        .await;
        let attempt = std::mem::take(&mut *self.shared.attempt.lock());
        match outcome {
            Ok(Ok(())) => {
                let (rejected, why) = attempt.rejected.unwrap_or_default();
                let rejected = rejected.min(n);
                if rejected > 0 {
                    self.shared.rejected(rejected, &why);
                }
                self.shared.exported(n - rejected)
            }
            Ok(Err(e)) => self
                .shared
                .failed(n, attempt.failure.unwrap_or_else(|| classify(&e))),
            Err(_elapsed) => self.shared.failed(
                n,
                attempt.failure.unwrap_or(if attempt.replied {
                    ExportFailure::SlowReply
                } else {
                    ExportFailure::NoReply
                }),
            ),
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

/// Polls a future inside the I/O runtime's context. The SDK polls exports on
/// its own thread (`futures_executor::block_on`): there, our timer and the
/// clients' sockets need the runtime, and the exporter's retries then sleep
/// on tokio's timer (which our timeout can cut) rather than blocking the thread.
struct InRuntime<F> {
    io: tokio::runtime::Handle,
    future: Pin<Box<F>>,
}

impl<F: Future> Future for InRuntime<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<F::Output> {
        let this = &mut *self;
        let _entered = this.io.enter();
        this.future.as_mut().poll(cx)
    }
}

/// The kind of a failed export the HTTP client did not see: a gRPC export,
/// known only by the exporter's message: "... gRPC code: Unknown: transport
/// error: ..." (then the error's source chain) when tonic could not get a
/// status from the server, "... gRPC code: Unavailable" for one the server sent.
pub(crate) fn classify(error: &OTelSdkError) -> ExportFailure {
    let text = error.to_string();
    let has = |what: &str| text.contains(what);
    if has("onnection refused") {
        return ExportFailure::ConnectionRefused;
    }
    if has("transport error") || has("Timeout expired") {
        return if has("Timeout expired") {
            // tonic's own timeout (ours, the same, usually fires first).
            ExportFailure::NoReply
        } else if has("http2 error") || has("protocol error") || has("frame") {
            // Something answered, not in HTTP/2.
            ExportFailure::MalformedReply
        } else if has("connect") || has("dns error") {
            ExportFailure::CannotConnect
        } else if has("closed") || has("reset") || has("broken pipe") {
            ExportFailure::ConnectionClosed
        } else {
            ExportFailure::Other
        };
    }
    let code = text
        .split("gRPC code: ")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_alphanumeric()).next())
        .and_then(|name| GRPC_CODES.iter().position(|&c| c == name));
    match code {
        Some(code) => ExportFailure::GrpcStatus(code as i32),
        None => ExportFailure::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
