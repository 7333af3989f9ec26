//! The collector's bringing back of a pass's finished jobs: their regions
//! copied back in one go (with each replayed graph's counter, checked against
//! the host's count), zeroed on the device and given back, then decoded and
//! held for their checkpoint. Streamed launches, read in place, end here too.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::Worker;
use crate::clock::HostClock;
use crate::cuda::device::Region;
use crate::cuda::device::{replay_taken, Kind, Place};
use crate::cuda::error::ProfilerError;
use crate::cuda::job::{decode_all, Job, ReplayCount, Taken, Work};
use crate::format::BufferHeader;

impl Worker {
    /// Copies the finished jobs' regions back in one go, zeroes them and gives
    /// them back, then decodes each launch and holds it for its checkpoint.
    pub(super) fn bring_back(&mut self, done: Vec<(Job, Result<(), ProfilerError>)>) {
        let complete_ns = HostClock::Boottime.now_ns();
        // Streamed launches were read in place: nothing to copy or zero on the device.
        let (streams, mut done): (Vec<_>, Vec<_>) = done
            .into_iter()
            .partition(|(j, _)| matches!(j.work, Work::Streamed { .. }));
        for (job, outcome) in streams {
            self.end_stream(job, outcome, complete_ns);
        }
        let mut places: Vec<&Place> = done
            .iter()
            .filter(|(_, o)| o.is_ok())
            .map(|(j, _)| j.work.place())
            .collect();
        // Each replayed graph's counter, once, to check the replays' numbers.
        let mut counters: Vec<&Arc<ReplayCount>> = Vec::new();
        for (j, o) in &done {
            if let (Work::Replay { count, .. }, Ok(())) = (&j.work, o) {
                if !counters.iter().any(|c| Arc::ptr_eq(c, count)) {
                    counters.push(count);
                }
            }
        }
        places.extend(counters.iter().map(|c| &c.counter));
        drop(counters);
        let fetched = match places.is_empty() {
            true => Ok(()),
            false => self.backend.fetch(&places),
        };
        drop(places);
        let in_step = match fetched.is_ok() {
            true => self.check_replay_counts(&done),
            false => vec![false; done.len()],
        };
        // A replay's region is the replay's only if its prologue took it;
        // otherwise it belongs to no one, or already to a later replay. Once
        // its graph is out of step, the numbers say nothing: skipped.
        let taken: Vec<bool> = done
            .iter()
            .enumerate()
            .map(|(i, (j, o))| match &j.work {
                Work::Launch { .. } | Work::Streamed { .. } => o.is_ok() && fetched.is_ok(),
                Work::Replay { replay, place, .. } => {
                    o.is_ok()
                        && fetched.is_ok()
                        && in_step[i]
                        && replay_taken(place.memory.mirror(&place.region), *replay)
                }
            })
            .collect();
        let recycle: Vec<&Place> = done
            .iter()
            .zip(&taken)
            .filter(|((j, _), t)| **t || matches!(j.work, Work::Launch { .. }))
            .map(|((j, _), _)| j.work.place())
            .collect();
        let arena: Vec<Region> = recycle
            .iter()
            .filter(|p| p.memory.kind == Kind::Arena)
            .map(|p| p.region)
            .collect();
        let recycled = match recycle.is_empty() {
            true => Ok(()),
            false => self.backend.recycle(&recycle),
        };
        drop(recycle);
        // Every replay's region is armed again or never will be: none is in flight now.
        for (j, _) in &mut done {
            if let Work::Replay { in_flight, .. } = &mut j.work {
                in_flight.end();
            }
        }
        match recycled {
            Ok(()) => self.arena.free(arena),
            // Not known to be zero: those regions stay out of use (the arena
            // shrinks, and launches are skipped rather than corrupted).
            Err(e) => self.shared.push_error(e),
        }
        let fetch_failed = fetched.is_err();
        let mut kept = Vec::with_capacity(done.len());
        if let Err(e) = fetched {
            self.shared.push_error(e);
        }
        self.release(done.iter().map(|(j, _)| j.mark));
        for ((job, outcome), taken) in done.into_iter().zip(taken) {
            let n = job.work.launches();
            match outcome {
                Err(e) => self.shared.finish(n, |st| {
                    st.stats.failed += n;
                    st.errors.push(e);
                }),
                Ok(()) if fetch_failed => self.shared.finish(n, |st| st.stats.failed += n),
                Ok(()) if !taken => {
                    // A replay whose prologue found its region in use.
                    self.shared.skipped.fetch_add(n, Ordering::AcqRel);
                    self.shared.finish(n, |_| {});
                }
                Ok(()) => kept.push(job),
            }
        }
        let launches = Taken::of(&kept, complete_ns);
        let inputs: Vec<(BufferHeader, &[u8])> =
            launches.iter().map(|t| (t.header, t.bytes)).collect();
        let decoded = decode_all(&self.registry, &inputs, self.decoders);
        for (t, d) in launches.into_iter().zip(decoded) {
            self.hold(t.launch, d, t.dispatch, t.span);
        }
    }

    /// Compares each finished replay's number with its graph's counts (the
    /// device's just fetched), in order: whether each job is in step (true
    /// for those that are not replays). A graph's first disagreement is an
    /// error for the next flush.
    fn check_replay_counts(&self, done: &[(Job, Result<(), ProfilerError>)]) -> Vec<bool> {
        let check = |(job, outcome): &(Job, Result<(), ProfilerError>)| match (&job.work, outcome) {
            (Work::Replay { replay, count, .. }, Ok(())) => match count.check(*replay) {
                Ok(()) => true,
                Err(first) => {
                    if let Some(o) = first {
                        self.shared.push_error(o.error(&job.launch.kernel));
                    }
                    false
                }
            },
            _ => true,
        };
        done.iter().map(check).collect()
    }
}
