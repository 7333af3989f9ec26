//! The collector thread: finds which profiled launches have finished, brings
//! their records back in bulk, decodes them, and delivers each [`Batch`]
//! through the dispatcher that was current at launch time.
//!
//! It knows nothing of CUDA: a launch reaches it as a [`Job`] (a place in trace
//! memory and a [`Mark`] after it on its stream), and the device is a
//! [`Device`] (`memory.rs`): CUDA's in `device.rs`, host memory in the tests,
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

use crate::batch::{Batch, DeviceInfo, LaunchInfo};
use crate::clock::{Calibration, Checkpoint, Sample};
use crate::decode::OwnedBuffer;
use crate::deliver;

use crate::registry::EventRegistry;

use super::error::ProfilerError;
use super::job::{Job, Work};
use super::memory::{Device, Mark, StreamMark, PER_THREAD};
use super::ring::Arena;
pub(crate) use super::shared::{ProfilerStats, Shared};
use super::stream::DrainConfig;

/// One calibration: the raw samples and the checkpoint fitted from them.
#[derive(Debug, Clone)]
pub(crate) struct Round {
    /// Host (BOOTTIME) before, device timer, host after.
    pub samples: Vec<Sample>,
    /// The map fitted from them, with the host clocks' offsets.
    pub checkpoint: Checkpoint,
}

/// Takes new clock checkpoints for the device.
pub(crate) trait Recalibrate: Send {
    /// Samples the device clock now and fits a checkpoint. `beside_stream`:
    /// a streamed launch runs, beside which the calibration's kernel may never
    /// start (on the H200 no kernel does, docs/performance.md), so give up
    /// soon rather than hold the collector for the usual timeout.
    fn round(&mut self, beside_stream: bool) -> Result<Round, ProfilerError>;
}

/// A recalibration, and the longest a decoded launch may wait for the checkpoint
/// after it.
pub(crate) type Recalibration = (Box<dyn Recalibrate>, Duration);

/// Where each delivered batch, and each calibration, may also go (the capture file).
pub(crate) trait Archive: Send {
    /// Takes one calibration round of the collector's device.
    fn calibration(&mut self, device: &DeviceInfo, round: &Round);
    /// Takes one batch.
    fn record(&mut self, batch: &Batch);
    /// Writes everything out.
    fn finish(&mut self) -> Result<(), ProfilerError>;
}

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
    shared: Arc<Shared>,
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
        shared: Arc<Shared>,
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

/// Decoded launches held for their checkpoint may hold this many bytes before
/// a checkpoint is taken early: holding must not grow without bound when the
/// launches come fast and large.
const HOLD_LIMIT_BYTES: usize = 256 << 20;

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
    shared: Arc<Shared>,
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

    /// The longest run of jobs one pass looks at, so that a pass stays short
    /// (and held launches get their checkpoint) whatever is queued.
    const PASS_LIMIT: usize = 4096;

    /// One pass over the pending jobs (see the module docs); `now`: bring back
    /// whatever has finished (a flush or stop waits). Returns whether any was
    /// brought back (or a running stream read).
    fn pass(&mut self, pending: &mut VecDeque<Job>, now: bool) -> bool {
        // Which have finished: per stream, in order, the finished ones first.
        let look = now || self.time_to_look(pending);
        let n = match look {
            true => pending.len().min(Self::PASS_LIMIT),
            false => 0,
        };
        let mut outcome: Vec<Option<Result<(), ProfilerError>>> = (0..n).map(|_| None).collect();
        self.mark_unmarked(pending, n, &mut outcome);
        self.streams.clear();
        self.by_stream.iter_mut().for_each(Vec::clear);
        for (i, job) in pending.iter().take(n).enumerate() {
            if outcome[i].is_some() || job.mark.unmarked() {
                continue;
            }
            let k = match self.streams.iter().position(|&s| s == job.mark.stream) {
                Some(k) => k,
                None => {
                    self.streams.push(job.mark.stream);
                    if self.by_stream.len() < self.streams.len() {
                        self.by_stream.push(Vec::new());
                    }
                    self.streams.len() - 1
                }
            };
            self.by_stream[k].push(i);
        }
        for k in 0..self.streams.len() {
            let jobs = std::mem::take(&mut self.by_stream[k]);
            self.finished_prefix(self.streams[k], &jobs, pending, &mut outcome);
            self.by_stream[k] = jobs;
        }
        if look {
            self.last_look = Instant::now();
        }
        // Streamed launches still running (not found finished in this pass: the
        // checkpoint for a finished one's last part is tried again).
        let unknown = std::iter::repeat(&None);
        self.streaming = pending
            .iter()
            .zip(outcome.iter().chain(unknown.clone()))
            .any(|(j, o)| o.is_none() && matches!(j.work, Work::Stream { .. }));
        self.recalibration_paused &= self.streaming;
        let mut read = false;
        for (job, o) in pending.iter_mut().zip(outcome.iter().chain(unknown)) {
            if o.is_none() && matches!(job.work, Work::Stream { .. }) {
                read |= self.drain_running(job);
            }
        }
        if outcome.iter().all(Option::is_none) {
            return read;
        }
        let mut done = Vec::new();
        let mut rest = VecDeque::with_capacity(pending.len());
        let mut outcome = outcome.into_iter();
        for job in pending.drain(..) {
            match outcome.next().flatten() {
                Some(o) => done.push((job, o)),
                None => rest.push_back(job),
            }
        }
        *pending = rest;
        self.bring_back(done);
        true
    }

    /// Whether a pass asks which launches have finished (and brings them
    /// back), or only reads the running streams. The queries, and a
    /// bring-back's driver calls (the copies, the zeroing, their waits), meet
    /// the launching threads' launch calls inside the driver, so in a storm
    /// they are made once every [`BRING_BACK_EVERY`] for hundreds of launches,
    /// not at every pass; holding for the clock checkpoint delays delivery
    /// far longer anyway. At once when a replay is pending (a graph has few
    /// replay regions), when the pending regions hold an eighth of the arena
    /// (launches must not be skipped for want of room the collector could
    /// give back), or when a pass cannot look at every pending job.
    fn time_to_look(&self, pending: &VecDeque<Job>) -> bool {
        if self.last_look.elapsed() >= self.bring_back_every || pending.len() > Self::PASS_LIMIT {
            return true;
        }
        let mut outstanding = 0;
        for job in pending {
            match &job.work {
                Work::Launch { place, .. } => outstanding += place.region.len,
                Work::Replay { .. } => return true,
                Work::Stream { .. } => {}
            }
        }
        outstanding >= self.arena.capacity() / 8
    }

    /// Marks the launches among the first `n` jobs that are not yet: one
    /// event per stream, recorded now on it, for all of them (their launching
    /// threads recorded none, which saves each launch call the dearest of its
    /// driver calls). Whatever was submitted to a stream before this call has
    /// been (the jobs were sent after their launches), so the event follows
    /// them; then the jobs let their streams go. While a stream captures a
    /// graph its jobs wait for a later look (they are not asked about until
    /// marked). If a stream can be neither marked nor waited for, they fail.
    fn mark_unmarked(
        &mut self,
        pending: &mut VecDeque<Job>,
        n: usize,
        outcome: &mut [Option<Result<(), ProfilerError>>],
    ) {
        self.streams.clear();
        for job in pending.iter().take(n) {
            if job.mark.unmarked() && !self.streams.contains(&job.mark.stream) {
                self.streams.push(job.mark.stream);
            }
        }
        for k in 0..self.streams.len() {
            let stream = self.streams[k];
            // The first job of the stream holds it alive through this call.
            let marked = self.backend.mark(stream);
            let mut count = 0;
            for (job, o) in pending.iter_mut().zip(outcome.iter_mut()) {
                if !job.mark.unmarked() || job.mark.stream != stream {
                    continue;
                }
                match &marked {
                    Ok(StreamMark::Event(event)) => job.mark.event = Some(*event),
                    // Finished, and no event to give back.
                    Ok(StreamMark::Waited) => job.mark.by_collector = false,
                    Ok(StreamMark::NotNow) => continue,
                    Err(e) => {
                        *o = Some(Err(ProfilerError::Invalid(format!(
                            "a stream could be neither marked nor waited for: {e}"
                        ))))
                    }
                }
                job.stream = None;
                count += 1;
            }
            if let Ok(StreamMark::Event(event)) = marked {
                self.shared_marks.insert(event, count);
            }
        }
    }

    /// Gives back the events of `marks` (of launches brought back); an event
    /// the collector recorded for several launches once the last is back.
    pub(super) fn release(&mut self, marks: impl Iterator<Item = Mark>) {
        let mut free = Vec::new();
        for mark in marks {
            let (Some(event), true) = (mark.event, mark.by_collector) else {
                free.push(mark);
                continue;
            };
            let left = self.shared_marks.entry(event).or_insert(1);
            *left -= 1;
            if *left == 0 {
                self.shared_marks.remove(&event);
                free.push(mark);
            }
        }
        self.backend.release(&free);
    }

    /// Finds which of one stream's jobs (`jobs`: their places in `pending`, in
    /// launch order) have finished. Launches on a stream finish in order, so
    /// they are a prefix: the oldest is asked first (unfinished: none is, one
    /// query), then the newest (finished: all are, two), then the prefix's end
    /// by bisection, so a pass asks the driver about log₂ of a stream's
    /// launches at most, not each: the collector's event queries contend with
    /// the launching threads' calls inside the driver (docs/performance.md).
    /// The per-thread default stream
    /// is one handle for many streams, which finish in any order: asked one by
    /// one, as is any stream where a query fails.
    fn finished_prefix(
        &mut self,
        stream: u64,
        jobs: &[usize],
        pending: &VecDeque<Job>,
        outcome: &mut [Option<Result<(), ProfilerError>>],
    ) {
        let one_by_one = |this: &mut Self, outcome: &mut [Option<Result<(), ProfilerError>>]| {
            for &i in jobs {
                match this.backend.finished(&pending[i].mark) {
                    Ok(true) => outcome[i] = Some(Ok(())),
                    Ok(false) => break,
                    // It cannot be waited for (a broken context): it fails.
                    Err(e) => outcome[i] = Some(Err(e)),
                }
            }
        };
        let Some(&newest) = jobs.last() else {
            return;
        };
        if stream == PER_THREAD {
            return one_by_one(self, outcome);
        }
        // The oldest first: while a stream's head runs (a busy GPU), one query.
        match self.backend.finished(&pending[jobs[0]].mark) {
            Ok(true) => {}
            Ok(false) => return,
            Err(_) => return one_by_one(self, outcome),
        }
        // `done` jobs known finished; the one at `hi` known not to be.
        let (mut done, mut hi) = (1, jobs.len() - 1);
        if hi > 0 {
            match self.backend.finished(&pending[newest].mark) {
                Ok(true) => done = jobs.len(),
                Ok(false) => {}
                Err(_) => return one_by_one(self, outcome),
            }
        }
        while done < hi {
            let mid = (done + hi) / 2;
            match self.backend.finished(&pending[jobs[mid]].mark) {
                Ok(true) => done = mid + 1,
                Ok(false) => hi = mid,
                Err(_) => return one_by_one(self, outcome),
            }
        }
        for &i in &jobs[..done] {
            outcome[i] = Some(Ok(()));
        }
    }

    /// How long the oldest held launch may still wait for a checkpoint.
    fn until_due(&self) -> Duration {
        match (&self.recalibrate, self.held.front()) {
            (Some((_, period)), Some(h)) => period.saturating_sub(h.since.elapsed()),
            // Nothing is held: sleep until a message comes.
            _ => Duration::from_secs(3600),
        }
    }

    /// Delivers the held launches that a checkpoint brackets. Takes a new
    /// checkpoint first if the oldest has waited its period, if too much is
    /// held, or if `drain`; then everything held goes.
    fn deliver_held(&mut self, drain: bool) {
        let Some(front) = self.held.front() else {
            return;
        };
        let due = match &self.recalibrate {
            Some((_, period)) => {
                drain || front.since.elapsed() >= *period || self.held_bytes > HOLD_LIMIT_BYTES
            }
            None => true,
        };
        if due && self.latest_anchor() <= self.held_newest {
            self.take_checkpoint();
        }
        let anchor = self.latest_anchor();
        while let Some(h) = self.held.front() {
            // Once due, nothing better will come (no recalibration, or it failed).
            if !(due || h.last_device_ns < anchor) {
                break;
            }
            let h = self.held.pop_front().expect("front exists");
            self.deliver(h);
        }
    }

    fn latest_anchor(&self) -> u64 {
        self.calibration.latest().map.anchor().0
    }

    fn take_checkpoint(&mut self) {
        let Some((recal, _)) = self.recalibrate.as_mut() else {
            return;
        };
        if self.recalibration_paused {
            return;
        }
        let result = recal.round(self.streaming).and_then(|round| {
            self.calibration
                .push(round.checkpoint.clone())
                .map_err(|e| ProfilerError::Calibration(e.into()))?;
            if let Some(a) = self.archive.as_mut() {
                a.calibration(&self.device, &round);
            }
            Ok(())
        });
        let mut st = self.shared.state.lock();
        match result {
            Ok(()) => {
                st.calibration = Arc::new(self.calibration.clone());
                st.stats.calibrations += 1;
            }
            Err(_) if self.streaming => {
                st.stats.calibrations_missed += 1;
                self.recalibration_paused = true;
            }
            Err(e) => st.errors.push(e),
        }
    }

    /// Holds a decoded launch for its checkpoint (or counts it as failed).
    fn hold(
        &mut self,
        launch: LaunchInfo,
        capture: Result<OwnedBuffer, ProfilerError>,
        dispatch: &Dispatch,
        span: &tracing::Span,
    ) {
        let capture = match capture {
            Ok(c) => c,
            Err(e) => {
                // A part before the last does not finish its launch.
                let n = u64::from(launch.part.is_none_or(|p| p.last));
                return self.shared.finish(n, |st| {
                    st.stats.failed += n;
                    st.errors.push(e);
                });
            }
        };
        let view = capture.view();
        let first_device_ns = view.slots().map(|s| s.header.first_ts).min().unwrap_or(0);
        let last_device_ns = view.slots().map(|s| s.header.last_ts).max().unwrap_or(0);
        self.held_bytes += capture.bytes().len();
        self.held_newest = self.held_newest.max(last_device_ns);
        self.held.push_back(Held {
            launch,
            capture,
            dispatch: dispatch.clone(),
            span: span.clone(),
            first_device_ns,
            last_device_ns,
            since: Instant::now(),
        });
    }

    fn deliver(&mut self, h: Held) {
        let n = u64::from(h.finishes());
        let part = u64::from(h.launch.part.is_some());
        let Held {
            launch,
            capture,
            dispatch,
            span,
            first_device_ns,
            last_device_ns,
            ..
        } = h;
        self.held_bytes -= capture.bytes().len();
        let (events, dropped) = (capture.event_count(), capture.drop_count());
        let batch = Arc::new(Batch {
            device: self.device.clone(),
            launch,
            buffer: Arc::new(capture),
            calibration: Arc::new(self.calibration.slice(first_device_ns, last_device_ns)),
            registry: self.registry.clone(),
        });
        if let Some(a) = self.archive.as_mut() {
            a.record(&batch);
        }
        let reached = deliver::deliver(&dispatch, batch);
        // Only now may the launch span close (and its id be reused).
        drop(span);
        self.shared.finish(n, |st| {
            st.stats.delivered += n;
            st.stats.parts += part;
            st.stats.events += events;
            st.stats.dropped_events += dropped;
            for sink in reached.sinks() {
                if !st.sinks.iter().any(|s| Arc::ptr_eq(s, &sink)) {
                    st.sinks.push(sink);
                }
            }
        });
    }
}

/// The Perfetto schema checker the integration tests use (`tests/check_perfetto.py`).
#[cfg(test)]
#[allow(dead_code)]
#[path = "../../tests/perfetto_check/mod.rs"]
mod perfetto_check;

// The collector's side of streamed launches (impl Worker).
#[path = "collector_bring_back.rs"]
mod bring_back;

#[path = "collector_streams.rs"]
mod streams;

#[cfg(test)]
#[path = "collector_tests.rs"]
mod tests;
