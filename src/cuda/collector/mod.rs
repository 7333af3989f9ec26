//! The collector thread: finds which profiled launches have finished, brings
//! their records back in bulk, decodes them, and delivers each [`Batch`]
//! through the dispatcher that was current at launch time.
//!
//! It knows nothing of CUDA: a launch reaches it as a [`Job`] (a place in trace
//! memory and a [`Mark`] after it on its stream), and the device is a
//! [`Device`] (`device/port.rs`): CUDA's in `device/cuda.rs`, host memory in the tests,
//! which is how a device (or a second one) is simulated without a GPU.
//!
//! One pass, every few milliseconds unless the arena fills or a flush waits
//! ([`Worker::time_to_look`]): find each stream's finished launches (a
//! stream's launches finish in order: its oldest mark is asked, then its
//! newest, then the finished prefix's end by bisection; streams finish in any
//! order); copy every finished launch back at once, one copy per run of
//! neighbouring regions; zero them on the device and give them back to the
//! arena; then decode. The driver calls of a pass grow with the log of the
//! launches it finds, and passes that ask are few, so the collector keeps up
//! with storms of short launches and disturbs the launching threads as little
//! as it can (its calls meet their launch calls inside the driver). Running
//! streamed launches are read at every pass (their parts, read in place, need
//! no driver call).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::Dispatch;

use crate::batch::{DeviceInfo, LaunchInfo};
use crate::clock::Calibration;
use crate::cuda::device::{Arena, Device};
use crate::cuda::drain::DrainConfig;
use crate::cuda::error::ProfilerError;
use crate::cuda::job::Job;
use crate::cuda::ledger::Ledger;
use crate::decode::OwnedBuffer;
use crate::registry::EventRegistry;

mod bring_back;
mod deliver;
mod drains;
mod hold;
mod pass;
mod ports;
#[cfg(test)]
mod tests;
mod watch;

pub(crate) use ports::{Archive, Recalibrate, Recalibration, Round};

// Not boxed: the channel stores messages in blocks of 31, so a send allocates
// nothing per launch (a box would be allocated on the launching thread and freed
// on this one).
#[allow(clippy::large_enum_variant)]
enum Msg {
    Job(Job),
    /// Deliver everything held (a flush is waiting).
    Flush,
    Stop,
}

/// The sending side, held by the profiler. Dropping it waits for the
/// outstanding jobs and ends the thread.
pub(crate) struct Collector {
    tx: mpsc::Sender<Msg>,
    shared: Arc<Ledger>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// What the collector thread owns.
pub(crate) struct CollectorConfig {
    pub device: Arc<DeviceInfo>,
    pub registry: Arc<EventRegistry>,
    /// Recalibration, and the longest a decoded launch may wait for the
    /// checkpoint after it; `None` maps everything with the first calibration.
    pub recalibrate: Option<Recalibration>,
    pub archive: Option<Box<dyn Archive>>,
    /// The device's trace memory operations.
    pub backend: Box<dyn Device>,
    /// The arena the launches' regions come from, given back here.
    pub arena: Arc<Arena>,
    /// Threads a pass decodes on when it brings back many launches.
    pub decoders: usize,
    /// How a running streamed launch's rings are drained.
    pub drain: DrainConfig,
    /// How long finished launches may wait to be brought back in bulk
    /// ([`BRING_BACK_EVERY`]).
    pub bring_back_every: Duration,
    /// Called on the collector thread before anything else (binds the CUDA context).
    pub on_start: Option<Box<dyn FnOnce() + Send>>,
}

impl Collector {
    /// Starts the collector thread.
    pub(crate) fn spawn(
        config: CollectorConfig,
        shared: Arc<Ledger>,
    ) -> Result<Collector, ProfilerError> {
        let (tx, rx) = mpsc::channel();
        let worker = Worker {
            rx,
            calibration: Calibration::clone(&shared.calibration()),
            shared: shared.clone(),
            device: config.device.clone(),
            registry: config.registry,
            recalibrate: config.recalibrate,
            archive: config.archive,
            backend: config.backend,
            arena: config.arena,
            streams: Vec::new(),
            by_stream: Vec::new(),
            decoders: config.decoders.max(1),
            drain: config.drain,
            bring_back_every: config.bring_back_every,
            held: VecDeque::new(),
            held_bytes: 0,
            held_newest: 0,
            streaming: false,
            last_look: Instant::now(),
            recalibration_paused: false,
            shared_marks: HashMap::new(),
        };
        let on_start = config.on_start;
        let thread = std::thread::Builder::new()
            .name(format!(
                "tracing-gpu collector GPU {}",
                config.device.ordinal
            ))
            .spawn(move || {
                if let Some(f) = on_start {
                    f();
                }
                worker.run()
            })
            .map_err(ProfilerError::Thread)?;
        Ok(Collector {
            tx,
            shared,
            thread: Some(thread),
        })
    }

    /// Hands a job over. Never blocks.
    pub(crate) fn send(&self, job: Job) {
        let n = job.work.launches();
        self.shared.sent.fetch_add(n, Ordering::AcqRel);
        if let Err(mpsc::SendError(msg)) = self.tx.send(Msg::Job(job)) {
            // The thread is gone (a sink panicked): count the job as failed so
            // that flush does not wait for it forever.
            drop(msg);
            self.shared.finish(n, |st| {
                st.stats.failed += n;
                st.errors.push(ProfilerError::CollectorGone);
            });
        }
    }

    /// Waits until every job sent so far has been delivered (taking a clock
    /// checkpoint for those still waiting for one), then flushes the sinks.
    pub(crate) fn flush(&self) -> Result<(), ProfilerError> {
        let _ = self.tx.send(Msg::Flush);
        self.shared.wait_and_flush()
    }

    /// Waits for the outstanding jobs, then ends the thread.
    pub(crate) fn stop(&mut self) -> Result<(), ProfilerError> {
        let _ = self.tx.send(Msg::Stop);
        let joined = match self.thread.take() {
            Some(t) => t.join().map_err(|_| ProfilerError::CollectorGone),
            None => Ok(()),
        };
        let flushed = self.shared.wait_and_flush();
        joined.and(flushed)
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        if self.thread.is_some() {
            let _ = self.stop();
        }
    }
}

/// How long finished launches may wait for the next bring-back
/// ([`Worker::time_to_look`]; `CollectorConfig::bring_back_every`).
pub(crate) const BRING_BACK_EVERY: Duration = Duration::from_millis(5);

/// A decoded launch waiting for a clock checkpoint later than its last event,
/// so that its device times are interpolated between two checkpoints rather
/// than extrapolated past the last one.
struct Held {
    launch: LaunchInfo,
    capture: OwnedBuffer,
    dispatch: Dispatch,
    span: tracing::Span,
    /// Device time span of its events (first and last timer reads of its warps).
    first_device_ns: u64,
    last_device_ns: u64,
    since: Instant,
}

impl Held {
    /// Whether delivering it finishes a launch: a whole launch, or a streamed
    /// launch's last part.
    fn finishes(&self) -> bool {
        self.launch.part.is_none_or(|p| p.last)
    }
}

struct Worker {
    rx: mpsc::Receiver<Msg>,
    shared: Arc<Ledger>,
    device: Arc<DeviceInfo>,
    registry: Arc<EventRegistry>,
    calibration: Calibration,
    recalibrate: Option<Recalibration>,
    archive: Option<Box<dyn Archive>>,
    backend: Box<dyn Device>,
    arena: Arc<Arena>,
    /// Scratch for a pass: the streams of its jobs, and each one's jobs (their
    /// places in the pending queue, in order).
    streams: Vec<u64>,
    by_stream: Vec<Vec<usize>>,
    /// Threads a pass decodes on (`decode_all`).
    decoders: usize,
    drain: DrainConfig,
    bring_back_every: Duration,
    held: VecDeque<Held>,
    held_bytes: usize,
    /// The latest `last_device_ns` among the launches held (or ever held: it
    /// only decides whether a checkpoint is needed, and a later one does no harm).
    held_newest: u64,
    /// A streamed launch is running.
    streaming: bool,
    /// When a pass last asked which launches had finished ([`Worker::time_to_look`]).
    last_look: Instant,
    /// A recalibration failed while a streamed launch ran (on the H200 no
    /// kernel starts beside a persistent one, and each try holds this thread
    /// for `Calibrator::TIMEOUT_BESIDE_STREAM`): none is tried again, and held
    /// launches go with the checkpoints so far, until no stream runs; the
    /// last part of a finished one waits for a new checkpoint as any launch.
    recalibration_paused: bool,
    /// The events the collector recorded ([`Worker::mark_unmarked`]), each
    /// with the number of pending launches it marks: it goes back to the pool
    /// when the last of them is brought back.
    shared_marks: HashMap<u64, usize>,
}

impl Worker {
    fn run(mut self) {
        let mut pending: VecDeque<Job> = VecDeque::new();
        let (mut flush, mut stopping) = (false, false);
        loop {
            // Take everything queued; sleep for a message only when idle.
            loop {
                let msg = if pending.is_empty() && !stopping && !flush {
                    match self.rx.recv_timeout(self.until_due()) {
                        Ok(m) => m,
                        Err(mpsc::RecvTimeoutError::Timeout) => break,
                        Err(mpsc::RecvTimeoutError::Disconnected) => Msg::Stop,
                    }
                } else {
                    match self.rx.try_recv() {
                        Ok(m) => m,
                        Err(mpsc::TryRecvError::Empty) => break,
                        Err(mpsc::TryRecvError::Disconnected) => Msg::Stop,
                    }
                };
                match msg {
                    Msg::Job(job) => pending.push_back(job),
                    Msg::Flush => flush = true,
                    Msg::Stop => stopping = true,
                }
            }
            if !pending.is_empty() && !self.pass(&mut pending, flush || stopping) {
                self.backend.idle();
            }
            // A flush or stop must see every job sent before it delivered.
            let drain = (flush || stopping) && pending.is_empty();
            self.deliver_held(drain);
            if drain {
                flush = false;
                if stopping {
                    break;
                }
            }
        }
        if let Some(a) = self.archive.as_mut() {
            if let Err(e) = a.finish() {
                self.shared.push_error(e);
            }
        }
    }
}
