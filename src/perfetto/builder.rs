//! [`PerfettoLayerBuilder`]: the layer's configuration, and `build`, which
//! opens the output and starts the writer thread (and the encoder threads).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;

use parking_lot::Mutex;

use super::error::PerfettoError;
use super::flows::FlowOrigins;
use super::guard::PerfettoGuard;
use super::host::process;
use super::layer::PerfettoLayer;
use super::output::Output;
use super::parallel::{Deflate, Encoders};
use super::proto::Enc;
use super::state::{LayerState, Msg};
use super::tracks::Ids;
use super::writer::TraceWriter;
use super::writer_thread::run_writer;
use crate::deliver::SinkHandle;
use crate::output::AtomicFile;

/// Builds a [`PerfettoLayer`] and its [`PerfettoGuard`].
#[must_use = "a builder does nothing until `build` is called"]
pub struct PerfettoLayerBuilder {
    path: Option<PathBuf>,
    writer: Option<Box<dyn Write + Send>>,
    process_name: Option<String>,
    chunk_bytes: usize,
    queued_chunks: usize,
    batch_queue: usize,
    deflate: Deflate,
    encoder_threads: usize,
}

impl Default for PerfettoLayerBuilder {
    fn default() -> Self {
        PerfettoLayerBuilder {
            path: None,
            writer: None,
            process_name: None,
            chunk_bytes: 64 << 10,
            queued_chunks: 16,
            batch_queue: 64,
            deflate: Deflate::Never,
            encoder_threads: std::thread::available_parallelism().map_or(1, |n| n.get().min(4)),
        }
    }
}

impl PerfettoLayerBuilder {
    /// The trace file to write (`.perfetto-trace` by convention). It appears
    /// only when the guard finishes; until then the data goes to `<file>.tmp`.
    pub fn file(mut self, path: impl AsRef<Path>) -> Self {
        self.path = Some(path.as_ref().to_path_buf());
        self
    }

    /// Streams the trace into `w` instead of a file (a pipe, a socket, a sink
    /// for benchmarks). There is no temporary file then: what was written
    /// before an error stays written.
    pub fn writer(mut self, w: impl Write + Send + 'static) -> Self {
        self.writer = Some(Box::new(w));
        self
    }

    /// The host process's name in the trace (default: the executable's name).
    pub fn process_name(mut self, name: impl Into<String>) -> Self {
        self.process_name = Some(name.into());
        self
    }

    /// Size of the chunks a thread hands to the writer (default 64 KiB).
    pub fn chunk_bytes(mut self, bytes: usize) -> Self {
        self.chunk_bytes = bytes.max(4096);
        self
    }

    /// Full chunks a thread may have waiting before it waits for the writer
    /// (default 16: with 64 KiB chunks, at most 1 MiB per thread).
    pub fn queued_chunks(mut self, n: usize) -> Self {
        self.queued_chunks = n.max(1);
        self
    }

    /// Device batches that may wait for the writer before
    /// [`BatchSink::on_batch`](crate::batch::BatchSink::on_batch) waits (default 64).
    pub fn batch_queue(mut self, n: usize) -> Self {
        self.batch_queue = n.max(1);
        self
    }

    /// Writes the trace zlib-compressed at `level` (0-9) in ~1 MiB pieces
    /// (`compressed_packets`, which Perfetto inflates on load): several times
    /// smaller (level 1: about 4.6 times, 5 bytes an event), at the cost of
    /// CPU time: each encoder thread deflates what it encodes (about 1.5 times
    /// what encoding costs), or the writer thread with one encoder. Off by
    /// default. For a streamed kernel at 100 M events/s or more: on an H100's
    /// 16-core host, `compress(1)` with 12 encoder threads and
    /// `ProfilerBuilder::stream_drain_threads(4)` (feature `cuda`)
    /// wrote every event of 101 M/s in two runs of three, where deflating
    /// only when behind did not (docs/performance.md, "Streamed launches").
    pub fn compress(mut self, level: u32) -> Self {
        self.deflate = Deflate::Always(level.min(9));
        self
    }

    /// Deflates, at `level`, only what the output cannot take as fast as the
    /// encoders make it: an encoder thread deflates the piece it hands back
    /// while two or more wait for the writer (a disk slower than the
    /// encoders), and hands it back as it is otherwise. A trace that keeps up
    /// costs no deflating; one that does not is partly compressed, as much as
    /// the encoders' spare CPU time allows. Needs encoder threads
    /// ([`PerfettoLayerBuilder::encoder_threads`] ≥ 2); with one, the trace is
    /// written as it is. Replaces [`PerfettoLayerBuilder::compress`].
    pub fn compress_when_behind(mut self, level: u32) -> Self {
        self.deflate = Deflate::WhenBehind(level.min(9));
        self
    }

    /// Threads that encode device batches (default: the cores available, at
    /// most 4). With 1, the writer thread encodes every batch itself, as it
    /// writes; with more, it writes each batch's kernel slice and hands the
    /// batch's warps to the encoders (each warp always to the same one), and
    /// writes what they make: the same slices on the same tracks, encoded on
    /// several cores. Besides [`PerfettoLayerBuilder::batch_queue`], up to
    /// 4 × `n` groups of batches are then held while they are encoded (a
    /// group closes at 64 batches or 32 Ki events), and up to 6 output
    /// buffers of about 1 MiB per encoder.
    pub fn encoder_threads(mut self, n: usize) -> Self {
        self.encoder_threads = n.clamp(1, 64);
        self
    }

    /// Opens the output (a file appears at its path, whole, when the guard
    /// finishes), writes the trace's preamble, starts the writer thread.
    pub fn build(self) -> Result<(PerfettoLayer, PerfettoGuard), PerfettoError> {
        let out =
            match (self.writer, &self.path) {
                (Some(w), _) => Output::Stream(w),
                (None, Some(path)) => Output::File(AtomicFile::create(path).map_err(|source| {
                    PerfettoError::Create {
                        path: path.clone(),
                        source,
                    }
                })?),
                (None, None) => return Err(PerfettoError::NoFile),
            };
        let ids = Arc::new(Ids::new());
        let flow_origins = Arc::new(FlowOrigins::window());
        let mut writer = TraceWriter::start(out, ids.clone(), flow_origins.clone())?;
        let pid = std::process::id() as i32;
        let process_name = self.process_name.unwrap_or_else(exe_name);
        let mut packet = Enc::default();
        packet.packet(&process(&ids, pid, process_name));
        writer.write_raw(&packet.buf)?;
        if let Deflate::Always(level) = self.deflate {
            writer = writer.compress(level);
        }
        let (tx, rx) = mpsc::sync_channel(self.batch_queue);
        static NEXT_LAYER: AtomicUsize = AtomicUsize::new(1);
        let state = Arc::new(LayerState {
            id: NEXT_LAYER.fetch_add(1, Ordering::Relaxed),
            closed: AtomicBool::new(false),
            tx,
            threads: Mutex::new(Vec::new()),
            ids,
            flow_origins,
            pid,
            chunk_bytes: self.chunk_bytes,
            queued_chunks: self.queued_chunks,
        });
        let encoders = if self.encoder_threads > 1 {
            let wake = state.tx.clone();
            let wake = move || {
                // A full queue wakes the writer anyway.
                let _ = wake.try_send(Msg::Wake);
            };
            let e = Encoders::start(self.encoder_threads, &state.ids, self.deflate, wake);
            Some(e.map_err(PerfettoError::Thread)?)
        } else {
            None
        };
        let s = state.clone();
        let thread = std::thread::Builder::new()
            .name("tracing-gpu perfetto writer".into())
            .spawn(move || run_writer(&s, rx, writer, encoders))
            .map_err(PerfettoError::Thread)?;
        Ok((
            PerfettoLayer {
                sink: SinkHandle::new(state.clone())?,
                state: state.clone(),
            },
            PerfettoGuard {
                state,
                thread: Some(thread),
            },
        ))
    }
}

impl std::fmt::Debug for PerfettoLayerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PerfettoLayerBuilder")
            .field("path", &self.path)
            .field("writer", &self.writer.as_ref().map(|_| "dyn Write"))
            .field("process_name", &self.process_name)
            .field("chunk_bytes", &self.chunk_bytes)
            .field("queued_chunks", &self.queued_chunks)
            .field("batch_queue", &self.batch_queue)
            .field("deflate", &self.deflate)
            .field("encoder_threads", &self.encoder_threads)
            .finish()
    }
}

impl PerfettoLayer {
    /// Starts building a layer.
    pub fn builder() -> PerfettoLayerBuilder {
        PerfettoLayerBuilder::default()
    }
}

fn exe_name() -> String {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "process".into())
}
