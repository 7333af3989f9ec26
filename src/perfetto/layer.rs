//! [`PerfettoLayer`]: the `tracing` layer, its builder, the writer thread, and
//! the guard that finishes the file.
//!
//! Host side: each thread that emits spans owns a buffer (one writer
//! sequence) and encodes its own packets into it, under a lock nobody else
//! takes except the writer thread when it collects full chunks. A span costs a
//! clock read and two small packets; nothing crosses a channel per event.
//! Device side: [`BatchSink::on_batch`] queues the batch (an `Arc`) on a
//! bounded channel to the writer thread, which encodes it there, or, with
//! [`PerfettoLayerBuilder::encoder_threads`] above 1, writes its kernel slice
//! and hands its warps to the encoder threads (`encoders.rs`), then writes
//! what they encode.
//!
//! Memory is bounded: each thread keeps at most [`PerfettoLayerBuilder::queued_chunks`]
//! full chunks waiting for the writer (then it waits for the writer to catch
//! up), the batch queue holds at most [`PerfettoLayerBuilder::batch_queue`] batches,
//! and the encoders at most 4 groups of batches per encoder thread.

use std::any::TypeId;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

use super::encode::{Core, FlowOrigins, WriteStats};
use super::encoders::Encoders;
use super::fields::{with_fields, SpanArgs};
use super::host::{process, HostThread};
use super::tracks::Ids;
use super::writer::TraceWriter;
use super::PerfettoError;
use crate::batch::{Batch, BatchSink, DEVICE_TARGET};
use crate::clock::HostClock;
use crate::deliver::SinkHandle;
use crate::output::AtomicFile;

/// Builds a [`PerfettoLayer`] and its [`PerfettoGuard`].
pub struct PerfettoLayerBuilder {
    path: Option<PathBuf>,
    writer: Option<Box<dyn Write + Send>>,
    process_name: Option<String>,
    chunk_bytes: usize,
    queued_chunks: usize,
    batch_queue: usize,
    compress: Option<u32>,
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
            compress: None,
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
    /// [`BatchSink::on_batch`] waits (default 64).
    pub fn batch_queue(mut self, n: usize) -> Self {
        self.batch_queue = n.max(1);
        self
    }

    /// Writes the trace zlib-compressed at `level` (0-9) in ~1 MiB pieces
    /// (`compressed_packets`, which Perfetto inflates on load): several times
    /// smaller, at the cost of the writer thread's CPU time. Off by default.
    pub fn compress(mut self, level: u32) -> Self {
        self.compress = Some(level);
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
        let mut core = Core::new(ids.clone(), flow_origins.clone());
        let pid = std::process::id() as i32;
        let process_name = self.process_name.unwrap_or_else(exe_name);
        core.enc.packet(&process(&ids, pid, process_name));
        let mut writer = TraceWriter::with_core(out, core)?;
        if let Some(level) = self.compress {
            writer = writer.compress(level);
        }
        let (tx, rx) = mpsc::sync_channel(self.batch_queue);
        static NEXT_LAYER: AtomicUsize = AtomicUsize::new(1);
        let shared = Arc::new(Shared {
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
            let wake = shared.tx.clone();
            let wake = move || {
                // A full queue wakes the writer anyway.
                let _ = wake.try_send(Msg::Wake);
            };
            let e = Encoders::start(self.encoder_threads, &shared.ids, wake);
            Some(e.map_err(PerfettoError::Thread)?)
        } else {
            None
        };
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("tracing-gpu perfetto writer".into())
            .spawn(move || run_writer(&s, rx, writer, encoders))
            .map_err(PerfettoError::Thread)?;
        Ok((
            PerfettoLayer {
                sink: SinkHandle::new(shared.clone())?,
                shared: shared.clone(),
            },
            PerfettoGuard {
                shared,
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
            .field("compress", &self.compress)
            .field("encoder_threads", &self.encoder_threads)
            .finish()
    }
}

/// Where the writer thread writes.
enum Output {
    File(AtomicFile),
    Stream(Box<dyn Write + Send>),
}

impl Output {
    /// Makes the output final: renames the file into place.
    fn commit(self) -> Result<(), PerfettoError> {
        match self {
            Output::File(f) => Ok(f.commit().map(drop)?),
            Output::Stream(mut w) => Ok(w.flush()?),
        }
    }
}

impl Write for Output {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Output::File(f) => f.write(buf),
            Output::Stream(w) => w.write(buf),
        }
    }
    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        match self {
            Output::File(f) => f.write_all(buf),
            Output::Stream(w) => w.write_all(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Output::File(f) => f.flush(),
            Output::Stream(w) => w.flush(),
        }
    }
}

fn exe_name() -> String {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "process".into())
}

/// A `tracing-subscriber` layer that writes a Perfetto trace: host spans on
/// their threads' tracks, device batches on GPU / SM / warp tracks.
///
/// ```no_run
/// use tracing_subscriber::prelude::*;
/// let (layer, guard) = tracing_gpu::perfetto::PerfettoLayer::builder()
///     .file("run.perfetto-trace")
///     .build()?;
/// tracing_subscriber::registry().with(layer).init();
/// tracing::info_span!("work").in_scope(|| { /* ... */ });
/// guard.finish()?; // run.perfetto-trace now exists, complete
/// # Ok::<(), tracing_gpu::perfetto::PerfettoError>(())
/// ```
///
/// Spans become slices from each enter to the matching exit, with their
/// fields as arguments; events become instants named by their message.
#[derive(Debug)]
pub struct PerfettoLayer {
    shared: Arc<Shared>,
    sink: SinkHandle,
}

impl PerfettoLayer {
    /// Starts building a layer.
    pub fn builder() -> PerfettoLayerBuilder {
        PerfettoLayerBuilder::default()
    }
}

/// Finishes the trace by [`PerfettoGuard::finish`], which reports errors, or
/// when dropped: writes what is buffered, ends slices still open at the
/// finish time, and renames the file into place. After that the layer
/// records nothing more. Dropped without `finish` before anything was
/// recorded (a program that failed early), it writes no file at all.
#[derive(Debug)]
pub struct PerfettoGuard {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<Result<WriteStats, PerfettoError>>>,
}

impl PerfettoGuard {
    /// Waits until everything recorded so far is in the (temporary) file.
    pub fn flush(&self) {
        self.shared.flush();
    }

    /// Finishes the file, even an empty one, and reports what was written.
    pub fn finish(mut self) -> Result<WriteStats, PerfettoError> {
        self.finish_inner(true)
    }

    fn finish_inner(&mut self, keep_empty: bool) -> Result<WriteStats, PerfettoError> {
        let Some(thread) = self.thread.take() else {
            return Ok(WriteStats::default());
        };
        self.shared.closed.store(true, Ordering::SeqCst);
        // If the writer is gone, the send fails and the join reports why.
        let _ = self.shared.tx.send(Msg::Finish(keep_empty));
        thread.join().map_err(|_| PerfettoError::WriterPanicked)?
    }
}

impl Drop for PerfettoGuard {
    fn drop(&mut self) {
        // A library does not print: finish() is the way to see errors.
        let _ = self.finish_inner(false);
    }
}

enum Msg {
    Batch(Arc<Batch>),
    /// A thread has a full chunk waiting.
    Wake,
    /// Collect everything, write it, flush, then answer.
    Flush(SyncSender<()>),
    /// Write what is left and end; `true`: write the file even if nothing was
    /// recorded.
    Finish(bool),
}

#[derive(Debug)]
struct Shared {
    /// Tells this layer's thread buffers apart from other layers' (the
    /// address of a dropped layer could be reused).
    id: usize,
    closed: AtomicBool,
    tx: SyncSender<Msg>,
    threads: Mutex<Vec<Arc<ThreadSlot>>>,
    ids: Arc<Ids>,
    flow_origins: Arc<FlowOrigins>,
    pid: i32,
    chunk_bytes: usize,
    queued_chunks: usize,
}

impl std::fmt::Debug for Msg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Msg::Batch(_) => "Batch",
            Msg::Wake => "Wake",
            Msg::Flush(_) => "Flush",
            Msg::Finish(_) => "Finish",
        })
    }
}

impl Shared {
    fn flush(&self) {
        if self.closed.load(Ordering::Acquire) {
            return;
        }
        let (ack, done) = mpsc::sync_channel(1);
        if self.tx.send(Msg::Flush(ack)).is_ok() {
            let _ = done.recv();
        }
    }

    /// Runs `f` on the calling thread's buffer (created on first use), then
    /// hands a full chunk to the writer. Returns `None` once the trace is finished.
    fn with_thread<R>(&self, f: impl FnOnce(&mut ThreadBuf) -> R) -> Option<R> {
        if self.closed.load(Ordering::Relaxed) {
            return None;
        }
        let slot = LOCAL
            .try_with(|l| {
                let mut l = l.borrow_mut();
                if let Some((_, s)) = l.iter().find(|(id, _)| *id == self.id) {
                    return s.clone();
                }
                // Forget the buffers of finished layers before adding one.
                l.retain(|(_, s)| !s.buf.lock().closed);
                let s = Arc::new(ThreadSlot::new(self));
                self.threads.lock().push(s.clone());
                l.push((self.id, s.clone()));
                s
            })
            .ok()?;
        let mut b = slot.buf.lock();
        if b.closed {
            return None;
        }
        let r = f(&mut b);
        if b.host.enc.len() >= self.chunk_bytes {
            // A chunk the writer gave back: its pages are already mapped, so the
            // spans that fill it take no page faults and no allocation.
            let next = b
                .spare
                .pop()
                .unwrap_or_else(|| Vec::with_capacity(self.chunk_bytes + 256));
            let chunk = std::mem::replace(&mut b.host.enc.buf, next);
            b.full.push_back(chunk);
            if let Err(TrySendError::Disconnected(_)) = self.tx.try_send(Msg::Wake) {
                b.closed = true;
            }
            // A full queue means the writer is behind: wait for it rather
            // than grow without bound or drop half a slice.
            while b.full.len() > self.queued_chunks && !b.closed {
                slot.drained.wait(&mut b);
            }
        }
        Some(r)
    }
}

thread_local! {
    static LOCAL: RefCell<Vec<(usize, Arc<ThreadSlot>)>> = const { RefCell::new(Vec::new()) };
}

#[derive(Debug)]
struct ThreadSlot {
    buf: Mutex<ThreadBuf>,
    drained: Condvar,
}

impl ThreadSlot {
    fn new(shared: &Shared) -> ThreadSlot {
        let tid = rustix::thread::gettid().as_raw_nonzero().get();
        let name = std::thread::current()
            .name()
            .map(str::to_owned)
            .unwrap_or_else(|| format!("thread {tid}"));
        ThreadSlot {
            buf: Mutex::new(ThreadBuf {
                host: HostThread::new(&shared.ids, shared.pid, tid, name, shared.chunk_bytes + 256),
                full: VecDeque::new(),
                spare: Vec::new(),
                closed: false,
            }),
            drained: Condvar::new(),
        }
    }
}

/// One thread's track and its pending bytes.
#[derive(Debug)]
struct ThreadBuf {
    /// The track; its names are keyed by callsite (`&'static Metadata` address).
    host: HostThread,
    full: VecDeque<Vec<u8>>,
    /// Written chunks given back, emptied, for the thread's next ones (at most
    /// `queued_chunks`: no more memory than the full queue held).
    spare: Vec<Vec<u8>>,
    closed: bool,
}

/// The key a callsite's name is interned under: callsites are unique statics.
fn callsite(meta: &'static Metadata<'static>) -> usize {
    meta as *const Metadata<'static> as usize
}

impl<S> Layer<S> for PerfettoLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    unsafe fn downcast_raw(&self, id: TypeId) -> Option<*const ()> {
        // Safety: forwarded from our own `downcast_raw`.
        unsafe { self.sink.downcast_raw(self, id) }
    }

    fn on_register_dispatch(&self, dispatch: &tracing::Dispatch) {
        self.sink.on_register_dispatch(dispatch);
    }

    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        if attrs.metadata().target() == DEVICE_TARGET
            || attrs.values().is_empty()
            || self.shared.closed.load(Ordering::Relaxed)
        {
            return;
        }
        let args = with_fields(false, |f| {
            attrs.record(f);
            SpanArgs {
                args: f.args.buf.as_slice().into(),
                launch: f.launch,
            }
        });
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(args);
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        if span.metadata().target() == DEVICE_TARGET {
            return;
        }
        // Appended straight from the scratch fields, with no copy of its own.
        with_fields(false, |f| {
            values.record(f);
            let mut ext = span.extensions_mut();
            match ext.get_mut::<SpanArgs>() {
                Some(a) => {
                    a.args.extend_from_slice(&f.args.buf);
                    a.launch = a.launch.or(f.launch);
                }
                None => ext.insert(SpanArgs {
                    args: f.args.buf.as_slice().into(),
                    launch: f.launch,
                }),
            }
        });
    }

    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        if self.shared.closed.load(Ordering::Relaxed) {
            return;
        }
        let Some(span) = ctx.span(id) else { return };
        let meta = span.metadata();
        if meta.target() == DEVICE_TARGET {
            return;
        }
        let ts = HostClock::Boottime.now_ns();
        // One lock of the span's extensions (a launch span is entered once per
        // launch): the launch flow starts at the span's first slice only.
        let mut ext = span.extensions_mut();
        let (args, launch) = match ext.get_mut::<SpanArgs>() {
            Some(a) => (&a.args[..], a.launch.take()),
            None => (&[][..], None),
        };
        self.shared.with_thread(|b| {
            let flow = launch.map(|l| self.shared.flow_origins.start(l));
            b.host.begin(ts, callsite(meta), meta.name(), args, flow);
        });
    }

    fn on_exit(&self, id: &Id, ctx: Context<'_, S>) {
        if self.shared.closed.load(Ordering::Relaxed) {
            return;
        }
        let Some(meta) = ctx.metadata(id) else { return };
        if meta.target() == DEVICE_TARGET {
            return;
        }
        let ts = HostClock::Boottime.now_ns();
        self.shared.with_thread(|b| b.host.end(ts));
    }

    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let meta = event.metadata();
        if meta.target() == DEVICE_TARGET {
            // The batch's gate (deliver.rs): our filters let it through.
            self.sink.on_event(event);
            return;
        }
        if self.shared.closed.load(Ordering::Relaxed) {
            return;
        }
        let ts = HostClock::Boottime.now_ns();
        with_fields(true, |f| {
            event.record(f);
            self.shared.with_thread(|b| {
                b.host
                    .instant(ts, callsite(meta), meta.name(), &f.message, &f.args.buf)
            });
        });
    }
}

impl BatchSink for Shared {
    fn on_batch(&self, batch: &Arc<Batch>) {
        if !self.closed.load(Ordering::Acquire) {
            let _ = self.tx.send(Msg::Batch(batch.clone()));
        }
    }

    fn flush(&self) {
        Shared::flush(self);
    }
}

impl BatchSink for PerfettoLayer {
    fn on_batch(&self, batch: &Arc<Batch>) {
        self.shared.on_batch(batch);
    }

    fn flush(&self) {
        self.shared.flush();
    }
}

/// Marks every thread buffer closed when the writer stops, however it stops,
/// so that no thread waits for it forever.
struct CloseOnExit<'a>(&'a Shared);

impl Drop for CloseOnExit<'_> {
    fn drop(&mut self) {
        self.0.closed.store(true, Ordering::SeqCst);
        for slot in self.0.threads.lock().iter() {
            slot.buf.lock().closed = true;
            slot.drained.notify_all();
        }
    }
}

/// Collects the threads' chunks (all of them if `all`, else only full
/// ones) and writes them. At the finish, also ends the slices still open.
fn collect(
    shared: &Shared,
    w: &mut TraceWriter<Output>,
    all: bool,
    finish: bool,
    failed: &mut Option<PerfettoError>,
) {
    let slots: Vec<Arc<ThreadSlot>> = shared.threads.lock().clone();
    let now = HostClock::Boottime.now_ns();
    for slot in &slots {
        let (chunks, rest, slices) = {
            let mut b = slot.buf.lock();
            if finish {
                while b.host.depth > 0 {
                    b.host.end(now);
                }
                b.closed = true;
            }
            let chunks = std::mem::take(&mut b.full);
            let rest = if all {
                std::mem::take(&mut b.host.enc.buf)
            } else {
                Vec::new()
            };
            (chunks, rest, std::mem::take(&mut b.host.slices))
        };
        slot.drained.notify_all();
        w.core().stats.host_slices += slices;
        for c in chunks.iter().chain(std::iter::once(&rest)) {
            if failed.is_none() && !c.is_empty() {
                if let Err(e) = w.write_raw(c) {
                    *failed = Some(e);
                }
            }
        }
        if !chunks.is_empty() {
            let mut b = slot.buf.lock();
            let room = shared.queued_chunks.saturating_sub(b.spare.len());
            b.spare.extend(chunks.into_iter().take(room).map(|mut c| {
                c.clear();
                c
            }));
        }
    }
    // Threads that are gone, and whose bytes are written, need no slot.
    shared
        .threads
        .lock()
        .retain(|s| Arc::strong_count(s) > 2 || !s.buf.lock().host.enc.is_empty());
}

fn run_writer(
    shared: &Shared,
    rx: Receiver<Msg>,
    mut w: TraceWriter<Output>,
    mut encoders: Option<Encoders>,
) -> Result<WriteStats, PerfettoError> {
    let _close = CloseOnExit(shared);
    let mut failed: Option<PerfettoError> = None;
    // Whether a trace with nothing in it is still written (see PerfettoGuard).
    let mut keep_empty = true;
    let handle = |msg: Msg,
                  w: &mut TraceWriter<Output>,
                  failed: &mut Option<PerfettoError>,
                  encoders: &mut Option<Encoders>| {
        let r = match msg {
            Msg::Batch(b) => {
                collect(shared, w, false, false, failed);
                match (&mut *encoders, failed.is_none()) {
                    (_, false) => {}
                    (Some(e), true) => e.submit(w, &b, failed),
                    (None, true) => {
                        if let Err(e) = w.write_batch(&b) {
                            *failed = Some(e);
                        }
                    }
                }
                None
            }
            Msg::Wake => {
                collect(shared, w, false, false, failed);
                None
            }
            Msg::Flush(ack) => {
                if let Some(e) = encoders {
                    e.wait_all(w, failed);
                }
                collect(shared, w, true, false, failed);
                if failed.is_none() {
                    if let Err(e) = w.flush() {
                        *failed = Some(e);
                    }
                }
                let _ = ack.send(());
                None
            }
            Msg::Finish(keep) => Some(keep),
        };
        // What the encoders finished meanwhile (they send a Wake for each).
        if let Some(e) = encoders {
            e.take_ready(w, failed);
        }
        r
    };
    loop {
        let msg = match rx.try_recv() {
            Ok(msg) => msg,
            Err(TryRecvError::Disconnected) => break,
            Err(TryRecvError::Empty) => {
                // Nothing waits: the encoders get the batches gathered so far.
                if let Some(e) = &mut encoders {
                    e.hand_out(&mut w, &mut failed);
                }
                match rx.recv() {
                    Ok(msg) => msg,
                    Err(_) => break,
                }
            }
        };
        if let Some(keep) = handle(msg, &mut w, &mut failed, &mut encoders) {
            keep_empty = keep;
            break;
        }
    }
    // Batches queued before the finish are still written.
    while let Ok(msg) = rx.try_recv() {
        handle(msg, &mut w, &mut failed, &mut encoders);
    }
    if let Some(mut e) = encoders.take() {
        e.wait_all(&mut w, &mut failed);
    }
    collect(shared, &mut w, true, true, &mut failed);
    if let Some(e) = failed {
        return Err(e); // The AtomicFile is dropped uncommitted: no file.
    }
    let (out, stats) = w.finish()?;
    if keep_empty || stats.host_slices > 0 || stats.kernels > 0 {
        out.commit()?;
    }
    Ok(stats)
}

#[cfg(test)]
#[path = "layer_tests.rs"]
mod tests;
