//! Which launches have finished: a pass over the pending jobs marks the
//! unmarked ones (one event per stream), asks each stream for its finished
//! prefix with a few queries, reads the running streamed launches, and hands
//! the finished jobs to the bring-back; it asks the driver only when it is
//! time to look ([`Worker::time_to_look`]).

use std::collections::VecDeque;
use std::time::Instant;

use super::Worker;
use crate::cuda::device::{Mark, StreamMark, PER_THREAD};
use crate::cuda::error::ProfilerError;
use crate::cuda::job::{Job, Work};

impl Worker {
    /// The longest run of jobs one pass looks at, so that a pass stays short
    /// (and held launches get their checkpoint) whatever is queued.
    const PASS_LIMIT: usize = 4096;

    /// One pass over the pending jobs (see the module docs); `now`: bring back
    /// whatever has finished (a flush or stop waits). Returns whether any was
    /// brought back (or a running stream read).
    pub(super) fn pass(&mut self, pending: &mut VecDeque<Job>, now: bool) -> bool {
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
            .any(|(j, o)| o.is_none() && matches!(j.work, Work::Streamed { .. }));
        self.recalibration_paused &= self.streaming;
        let mut read = false;
        for (job, o) in pending.iter_mut().zip(outcome.iter().chain(unknown)) {
            if o.is_none() && matches!(job.work, Work::Streamed { .. }) {
                read |= self.drain_running(job);
                self.watch_running(job);
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
    /// they are made once every [`BRING_BACK_EVERY`](super::BRING_BACK_EVERY) for hundreds of launches,
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
                Work::Streamed { .. } => {}
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
}
