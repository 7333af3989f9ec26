//! The collector's side of streamed launches: starting a launch's drain
//! threads, holding the parts they send, and ending the launch when it
//! completes (`drain/` reads the rings).

use tracing::Dispatch;

use super::Worker;
use crate::batch::{LaunchInfo, Part};
use crate::cuda::drain::{DrainConfig, DrainThreads, Drained, Drainers, SlotError};
use crate::cuda::error::ProfilerError;
use crate::cuda::job::{Job, Work};
use crate::decode::OwnedBuffer;
use crate::format::PackedWriter;

impl Worker {
    /// Starts a running streamed launch's drain threads at the first look,
    /// and holds the parts they have sent since. Returns whether any came.
    pub(super) fn drain_running(&mut self, job: &mut Job) -> bool {
        let (before_ns, config) = (self.stream_floor(), self.drain);
        let Work::Streamed {
            header,
            place,
            drain,
            ..
        } = &mut job.work
        else {
            return false;
        };
        if drain.is_none() {
            let started = Drainers::start(
                *header,
                place.memory.clone(),
                place.region,
                self.registry.clone(),
                before_ns,
                config,
            );
            match started {
                Ok(d) => *drain = Some(d),
                Err(e) => {
                    // Read at completion instead, by this thread (end_stream).
                    self.shared.push_error(e);
                    return false;
                }
            }
        }
        let got = drain.as_ref().map(Drainers::take).unwrap_or_default();
        if let Some(d) = drain {
            self.count_pauses(d);
        }
        let any = !got.is_empty();
        self.drained((&job.launch, &job.dispatch, &job.span), got);
        any
    }

    /// Holds what a launch's drain threads sent: its parts before the last,
    /// and slot errors.
    fn drained(&mut self, job: (&LaunchInfo, &Dispatch, &tracing::Span), got: Vec<Drained>) {
        let (info, dispatch, span) = job;
        for d in got {
            match d {
                Drained::Errors(errors) => self.slot_errors(info.launch_id, errors),
                Drained::Part {
                    buffer,
                    index,
                    cut_ns,
                } => {
                    let mut launch = info.clone();
                    launch.host_complete_ns = cut_ns;
                    launch.part = Some(Part { index, last: false });
                    self.hold(launch, Ok(*buffer), dispatch, span);
                }
            }
        }
    }

    /// A streamed launch has completed: its drain threads read their rings a
    /// last time (the flushed counts, the events left) and end, an empty last
    /// part finishes the launch, and its region is zeroed here and given back.
    pub(super) fn end_stream(
        &mut self,
        job: Job,
        outcome: Result<(), ProfilerError>,
        complete_ns: u64,
    ) {
        self.release(std::iter::once(job.mark));
        let before_ns = self.stream_floor();
        let Job {
            launch,
            dispatch,
            span,
            work,
            ..
        } = job;
        let Work::Streamed {
            header,
            place,
            arena,
            drain,
            ..
        } = work
        else {
            unreachable!("only streamed launches come here")
        };
        let job = (&launch, &dispatch, &span);
        let drain = match drain {
            Some(d) => Some(d),
            // Never looked at while it ran: read it all now.
            None => Drainers::start(
                header,
                place.memory.clone(),
                place.region,
                self.registry.clone(),
                before_ns,
                DrainConfig {
                    threads: DrainThreads::exactly(1),
                    ..self.drain
                },
            )
            .ok(),
        };
        match (outcome, drain) {
            (Ok(()), Some(mut drain)) => {
                let (got, last) = drain.finish();
                self.count_pauses(&drain);
                self.drained(job, got);
                let mut info = launch.clone();
                info.host_complete_ns = complete_ns;
                info.part = Some(Part {
                    index: last,
                    last: true,
                });
                let empty = OwnedBuffer::decode(PackedWriter::new(&header).finish(), None).map_err(
                    |source| ProfilerError::Decode {
                        launch_id: info.launch_id,
                        source,
                    },
                );
                self.hold(info, empty, &dispatch, &span);
            }
            (outcome, drain) => {
                if let Some(mut d) = drain {
                    let (got, _) = d.finish();
                    self.count_pauses(&d);
                    self.drained(job, got);
                }
                let e = outcome.err().unwrap_or(ProfilerError::Invalid(
                    "the streamed launch's drain threads could not start".into(),
                ));
                self.shared.finish(1, |st| {
                    st.stats.failed += 1;
                    st.errors.push(e);
                });
            }
        }
        // The kernel has finished: nothing writes the region any more.
        place.memory.zero(place.region.offset, place.region.len);
        arena.free([place.region]);
    }

    /// A device time before any stamp of a launch made now: the latest
    /// checkpoint's, less an hour (a checkpoint may be taken after the launch).
    fn stream_floor(&self) -> u64 {
        self.latest_anchor().saturating_sub(3_600_000_000_000)
    }

    /// Counts the times a launch's drain threads stopped for its backlog, and
    /// keeps the longest they went without reading.
    fn count_pauses(&self, drain: &Drainers) {
        let (stalls, gap) = drain.pauses();
        let mut st = self.shared.state.lock();
        st.stats.stream_stalls += stalls;
        st.stats.stream_longest_gap = st.stats.stream_longest_gap.max(gap);
    }

    /// Keeps a streamed launch's slot errors for the next flush.
    fn slot_errors(&mut self, launch_id: u64, errors: Vec<SlotError>) {
        if errors.is_empty() {
            return;
        }
        let mut st = self.shared.state.lock();
        for e in errors {
            st.errors.push(ProfilerError::Stream {
                launch_id,
                slot: e.slot,
                source: e.error,
            });
        }
    }
}
