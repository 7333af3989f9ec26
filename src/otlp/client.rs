//! The http/protobuf exporter's HTTP client: reqwest, polled on the I/O runtime
//! ([`super::export::CountingExporter`] bounds each export), which notes what
//! went wrong for the stats and refuses a reply that is not an OTLP response.
//!
//! `opentelemetry-otlp` counts any 2xx as exported, whatever its body (it
//! decodes the body only to log a partial success, and ignores a body that does
//! not decode), and reports every transport error as "network error". Its
//! `with_http_client` is the one place that sees the reply and the error.

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;

use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse;
use prost::Message;

use super::error::ExportFailure;
use super::state::ExportState;

/// An `ExportTraceServiceResponse` is a few bytes (a count and an error
/// message): a longer reply is not one, and is not read further.
const MAX_REPLY: usize = 64 * 1024;

pub(crate) struct OtlpHttpClient {
    client: reqwest::Client,
    shared: Arc<ExportState>,
}

impl fmt::Debug for OtlpHttpClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("OtlpHttpClient")
    }
}

/// A reply that is not an OTLP response.
#[derive(Debug, thiserror::Error)]
#[error("the reply is not an OTLP ExportTraceServiceResponse: {0}")]
struct Malformed(&'static str);

impl OtlpHttpClient {
    pub(crate) fn new(shared: Arc<ExportState>) -> Result<OtlpHttpClient, reqwest::Error> {
        // No timeout here: the exporter wrapper bounds every export, retries included.
        let client = reqwest::Client::builder().build()?;
        Ok(OtlpHttpClient { client, shared })
    }

    fn fail(&self, why: ExportFailure, error: impl Into<HttpError>) -> HttpError {
        self.shared.attempt.lock().failure = Some(why);
        error.into()
    }
}

/// What a reqwest error says happened; `replied`: the headers had arrived.
fn failure_of(error: &reqwest::Error, replied: bool) -> ExportFailure {
    if error.is_connect() {
        let refused = std::iter::successors(Some(error as &dyn StdError), |e| (*e).source())
            .filter_map(|e| e.downcast_ref::<std::io::Error>())
            .any(|e| e.kind() == std::io::ErrorKind::ConnectionRefused);
        if refused {
            ExportFailure::ConnectionRefused
        } else {
            ExportFailure::CannotConnect
        }
    } else if replied || error.is_body() || error.is_decode() {
        ExportFailure::SlowReply
    } else if error.is_timeout() {
        ExportFailure::NoReply
    } else {
        ExportFailure::ConnectionClosed
    }
}

#[async_trait::async_trait]
impl HttpClient for OtlpHttpClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        self.shared.attempt.lock().replied = false;
        let request = reqwest::Request::try_from(request)?;
        let mut response = match self.client.execute(request).await {
            Ok(r) => r,
            Err(e) => return Err(self.fail(failure_of(&e, false), e)),
        };
        self.shared.attempt.lock().replied = true;
        let status = response.status();
        let mut reply = Response::builder().status(status);
        if let Some(headers) = reply.headers_mut() {
            // The exporter reads `Retry-After` from a refusal.
            *headers = std::mem::take(response.headers_mut());
        }
        if !status.is_success() {
            // A refusal's body only goes to logs, which are compiled out: not read.
            self.shared.attempt.lock().failure = Some(ExportFailure::HttpStatus(status.as_u16()));
            return Ok(reply.body(Bytes::new())?);
        }
        let mut body = Vec::new();
        loop {
            match response.chunk().await {
                Ok(Some(chunk)) if body.len() + chunk.len() > MAX_REPLY => {
                    return Err(self.fail(ExportFailure::MalformedReply, Malformed("too long")));
                }
                Ok(Some(chunk)) => body.extend_from_slice(&chunk),
                Ok(None) => break,
                Err(e) => return Err(self.fail(failure_of(&e, true), e)),
            }
        }
        // An empty body is an empty message: accepted.
        let Ok(answer) = ExportTraceServiceResponse::decode(body.as_slice()) else {
            return Err(self.fail(ExportFailure::MalformedReply, Malformed("cannot decode")));
        };
        if let Some(partial) = answer.partial_success {
            if partial.rejected_spans > 0 {
                self.shared.attempt.lock().rejected =
                    Some((partial.rejected_spans as u64, partial.error_message));
            }
        }
        Ok(reply.body(Bytes::from(body))?)
    }
}
