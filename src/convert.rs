//! The `convert` command: a capture read once, a launch at a time
//! ([`CaptureReader`]), each batch handed to every output asked for (a
//! Perfetto trace, OTLP spans) before the next is read, so that memory does
//! not grow with the capture.

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tracing_gpu::batch::Batch;
use tracing_gpu::capture::{Capture, CaptureReader, HOST_SPANS_NOTE};
use tracing_gpu::output::AtomicFile;
use tracing_gpu::perfetto::{TraceWriter, WriteStats};

use crate::{capture_failure, progress, Exit, Failure, OtlpDetail};

/// `--otlp` and the flags that go with it.
#[cfg_attr(not(feature = "otlp"), allow(dead_code))]
pub(crate) struct OtlpTarget<'a> {
    pub(crate) endpoint: &'a str,
    pub(crate) protocol: &'a str,
    /// The most the collector may take to answer one export.
    pub(crate) timeout: Duration,
    /// The most the whole export may take.
    pub(crate) deadline: Duration,
    pub(crate) detail: OtlpDetail,
}

/// `convert CAPTURE [-o TRACE] [--otlp URL ...]`.
pub(crate) fn convert(
    capture: &Path,
    out: Option<&Path>,
    otlp: Option<OtlpTarget<'_>>,
) -> Result<(), Failure> {
    let failure = |e| capture_failure(capture, e);
    let mut reader = CaptureReader::open(capture).map_err(failure)?;
    let count = reader.launch_count();
    let batches = reader.batches().map_err(failure)?;
    let head = batches.head();
    note_missing_host_spans(capture, head);
    // A bad endpoint or protocol is refused before a file is begun.
    let export = otlp.map(Export::start).transpose()?;
    let mut trace = out.map(|out| Trace::begin(head, out)).transpose()?;
    let bar = progress(
        count,
        match out {
            Some(_) => "converting",
            None => "exporting",
        },
    );
    // Each batch goes into the trace, then to the export. The first failure
    // (a launch that does not decode, a write that fails) ends the stream.
    let mut failed = None;
    let feed = batches.map_while(|batch| {
        let written = batch.map_err(failure).and_then(|batch| match &mut trace {
            Some(trace) => trace.add(&batch).map(|()| batch),
            None => Ok(batch),
        });
        bar.inc(1);
        written.map_err(|e| failed = Some(e)).ok()
    });
    match &export {
        Some(export) => export.replay(head, feed),
        None => feed.for_each(drop),
    }
    bar.finish_and_clear();
    if let Some(failure) = failed {
        if let Some(export) = export {
            export.abandon();
        }
        return Err(failure); // The trace, unfinished, is removed.
    }
    if let Some(trace) = trace {
        let (out, stats) = trace.finish()?;
        eprintln!(
            "trace: {} ({} launches, {} device events, {} host spans, {} bytes); open it at https://ui.perfetto.dev",
            out.display(),
            stats.kernels,
            stats.device_events,
            stats.host_slices,
            stats.bytes
        );
    }
    match export {
        Some(export) => export.finish(),
        None => Ok(()),
    }
}

/// Without host spans a replay has no launch spans (nor, in Perfetto, arrows),
/// and a capture recorded without the recorder's layer holds only the launch
/// spans: says so, and why, if the capture says.
fn note_missing_host_spans(path: &Path, head: &Capture) {
    if let Some((_, why)) = head.metadata.iter().find(|(k, _)| k == HOST_SPANS_NOTE) {
        let what = match head.host_spans.is_empty() {
            true => "has no host spans",
            false => "has some host spans only",
        };
        eprintln!("note: {} {what} ({why})", path.display());
    }
}

/// Writes a whole capture's host spans and batches into a Perfetto trace at
/// `out`, as a live run draws them: complete or absent.
pub(crate) fn write_perfetto(
    recorded: &Capture,
    batches: &[Arc<Batch>],
    out: &Path,
) -> Result<WriteStats, Failure> {
    let mut trace = Trace::begin(recorded, out)?;
    for batch in batches {
        trace.add(batch)?;
    }
    trace.finish().map(|(_, stats)| stats)
}

/// A Perfetto trace of a capture being written, a batch at a time, with the
/// watchdog's snapshots it keeps, as a live run draws them: complete once
/// finished, absent if dropped before.
struct Trace<'a> {
    out: &'a Path,
    head: &'a Capture,
    writer: TraceWriter<AtomicFile>,
}

impl<'a> Trace<'a> {
    /// Begins the trace at `out` with `head`'s host spans: the launch spans
    /// start the flows the kernels end.
    fn begin(head: &'a Capture, out: &'a Path) -> Result<Trace<'a>, Failure> {
        let file = AtomicFile::create(out).map_err(|e| cannot_write(out, &e))?;
        let mut writer = TraceWriter::new(file).map_err(|e| cannot_write(out, &e))?;
        writer
            .write_host_spans(head.process_name(), &head.host_spans)
            .map_err(|e| cannot_write(out, &e))?;
        Ok(Trace { out, head, writer })
    }

    fn add(&mut self, batch: &Batch) -> Result<(), Failure> {
        self.writer
            .write_captured_batch(self.head, batch)
            .map_err(|e| cannot_write(self.out, &e))
    }

    /// Ends the trace with the launches still running at their latest snapshot.
    fn finish(mut self) -> Result<(&'a Path, WriteStats), Failure> {
        let out = self.out;
        self.writer
            .write_captured_end(self.head)
            .map_err(|e| cannot_write(out, &e))?;
        let (file, stats) = self.writer.finish().map_err(|e| cannot_write(out, &e))?;
        file.commit().map_err(|e| cannot_write(out, &e))?;
        Ok((out, stats))
    }
}

fn cannot_write(out: &Path, e: &dyn fmt::Display) -> Failure {
    Failure::new(Exit::Output, format!("cannot write {}: {e}", out.display()))
}

/// The OTLP export of a capture: each export answered within `--otlp-timeout`
/// (a collector that does not answer fails the run then), the whole within
/// `--otlp-deadline`, whatever the collector does.
#[cfg(feature = "otlp")]
struct Export<'a> {
    endpoint: &'a str,
    timeout: Duration,
    deadline: Duration,
    layer: tracing_gpu::otlp::OtlpLayer,
    guard: tracing_gpu::otlp::OtlpGuard,
}

#[cfg(feature = "otlp")]
impl<'a> Export<'a> {
    /// Starts the exporter; its deadline starts now.
    fn start(target: OtlpTarget<'a>) -> Result<Export<'a>, Failure> {
        use std::time::Instant;
        use tracing_gpu::otlp::{Detail, OtlpError, OtlpLayer, Protocol};
        let endpoint = target.endpoint;
        let protocol: Protocol = target
            .protocol
            .parse()
            .map_err(|e: String| Failure::new(Exit::Usage, e))?;
        let deadline = Instant::now() + target.deadline;
        let mut builder = OtlpLayer::builder();
        // As in any OpenTelemetry SDK, the user's OTEL_SERVICE_NAME, or a service.name
        // in OTEL_RESOURCE_ATTRIBUTES, names the service (the layer's resource reads
        // both); the CLI names itself only where they say nothing.
        let env = |key| std::env::var(key).unwrap_or_default();
        let named = !env("OTEL_SERVICE_NAME").is_empty()
            || env("OTEL_RESOURCE_ATTRIBUTES")
                .split(',')
                .any(|kv| kv.trim_start().starts_with("service.name="));
        if !named {
            builder = builder.service_name("tracing-gpu");
        }
        let (layer, guard) = builder
            .endpoint(endpoint)
            .protocol(protocol)
            .detail(match target.detail {
                OtlpDetail::Kernel => Detail::Kernel,
                OtlpDetail::Phase => Detail::Phase,
                OtlpDetail::Warp => Detail::Warp,
            })
            .timeout(target.timeout)
            .shutdown_timeout(target.deadline)
            .build()
            .map_err(|e| match e {
                // A malformed endpoint is bad usage; an unreachable one fails later.
                OtlpError::Config { .. } => Failure::new(Exit::Usage, e.to_string()),
                e => failed(endpoint, e.to_string()),
            })?;
        guard.give_up_at(deadline);
        Ok(Export {
            endpoint,
            timeout: target.timeout,
            deadline: target.deadline,
            layer,
            guard,
        })
    }

    /// Replays `head`'s host spans and `batches` as they come. The replay
    /// waits for room in the export queue while the collector answers.
    fn replay(&self, head: &Capture, batches: impl Iterator<Item = Arc<Batch>>) {
        self.watched(|| self.layer.replay(head, batches));
    }

    /// Runs `work` while a watcher gives up at the first failed export (the
    /// run fails in any case, and the rest would only wait on the same
    /// collector), so that a collector that is down, silent or refusing ends
    /// the run at its first failure (within `--otlp-timeout`), not at the
    /// deadline; the batches still to come are then only counted.
    fn watched<T>(&self, work: impl FnOnce() -> T) -> T {
        use std::sync::atomic::{AtomicBool, Ordering};
        let done = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                while !done.load(Ordering::Acquire) {
                    if self.guard.stats().export_errors > 0 {
                        self.guard.give_up_at(std::time::Instant::now());
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            });
            let out = work();
            done.store(true, Ordering::Release);
            out
        })
    }

    /// Stops at once: the capture failed, which is what the run reports.
    fn abandon(self) {
        self.guard.give_up_at(std::time::Instant::now());
    }

    /// Sends what is left, within the deadline, and says how it went: which
    /// budget ran out, if one did.
    fn finish(self) -> Result<(), Failure> {
        use tracing_gpu::otlp::ExportFailure;
        // Flushed while watched, so that a collector that stops answering now
        // ends the run at once too; the shutdown then has little left to do.
        let flushed = self.watched(|| self.guard.flush());
        let finished = self.guard.finish().and(flushed);
        let stats = self.layer.stats();
        let lost = stats.spans_failed + stats.spans_dropped + stats.spans_rejected;
        if lost == 0 && stats.batches_dropped == 0 && finished.is_ok() {
            eprintln!(
                "otlp: {} spans exported to {}",
                stats.spans_exported, self.endpoint
            );
            return Ok(());
        }
        let secs = |d: Duration| d.as_secs_f64();
        let why = match (stats.last_failure, &finished) {
            (Some(ExportFailure::NoReply | ExportFailure::SlowReply), _) => format!(
                "{} (--otlp-timeout {} s)",
                stats.last_failure.unwrap_or(ExportFailure::NoReply),
                secs(self.timeout)
            ),
            (Some(why), _) if why != ExportFailure::OutOfTime => why.to_string(),
            (_, Err(e)) => e.to_string(),
            (None, Ok(())) if stats.spans_failed + stats.spans_dropped == 0 => {
                "the collector rejected spans (partial success)".to_string()
            }
            _ => format!(
                "out of time (--otlp-deadline {} s: the whole export's budget)",
                secs(self.deadline)
            ),
        };
        let mut counts = format!(
            "{} of {} spans exported",
            stats.spans_exported,
            stats.spans_exported + lost
        );
        if stats.spans_rejected > 0 {
            counts += &format!(", {} rejected by the collector", stats.spans_rejected);
        }
        if stats.batches_dropped > 0 {
            counts += &format!(", {} launches not converted", stats.batches_dropped);
        }
        Err(failed(self.endpoint, format!("{why} ({counts})")))
    }
}

#[cfg(feature = "otlp")]
fn failed(endpoint: &str, e: String) -> Failure {
    Failure::new(Exit::Export, format!("OTLP export to {endpoint}: {e}"))
}

/// No export in this build: [`Export::start`] says so.
#[cfg(not(feature = "otlp"))]
enum Export {}

#[cfg(not(feature = "otlp"))]
impl Export {
    fn start(target: OtlpTarget<'_>) -> Result<Export, Failure> {
        Err(Failure::new(
            Exit::Export,
            format!("cannot export to {}: this build has no OTLP support (build with --features otlp, or full)", target.endpoint),
        ))
    }

    fn replay(&self, _: &Capture, _: impl Iterator<Item = Arc<Batch>>) {
        match *self {}
    }

    fn abandon(self) {
        match self {}
    }

    fn finish(self) -> Result<(), Failure> {
        match self {}
    }
}
