//! The part of a profiled launch common to direct and streamed launches: the
//! launch itself in its region, and handing the job to the collector.

use std::any::Any;
use std::sync::Arc;

use cudarc::driver::CudaStream;

use super::names::{kernel_name, thread_name};
use crate::batch::LaunchInfo;
use crate::clock::HostClock;
use crate::cuda::device::{Arena, Region};
use crate::cuda::device::{Mark, PER_THREAD};
use crate::cuda::error::ProfilerError;
use crate::cuda::job::{Job, Work};
use crate::cuda::profiler::Profiler;
use crate::format::{BufferHeader, KernelArg};

impl Profiler {
    /// A launch with its region of `arena` (`None`: the arena is full, the launch
    /// runs unrecorded and is counted as skipped), the argument `arg` makes of
    /// the region: the clock read, the launch, and the job `work` makes of the
    /// region handed over. Direct launches and streamed ones go through here.
    pub(super) fn launch_in<T, E, F>(
        &self,
        (stream, kernel, header, span): (&Arc<CudaStream>, &str, BufferHeader, tracing::Span),
        (arena, region): (&Arena, Option<Region>),
        arg: impl FnOnce(&Region) -> KernelArg,
        launch: F,
        work: impl FnOnce(Region) -> Work,
    ) -> Result<T, ProfilerError>
    where
        F: FnOnce(KernelArg) -> Result<T, E>,
        E: Into<ProfilerError>,
    {
        self.shared.count_launch(region.is_none());
        let arg = region.as_ref().map_or_else(KernelArg::default, arg);
        let entered = span.enter();
        let host_launch_ns = HostClock::Boottime.now_ns();
        let result = launch(arg);
        drop(entered);
        let Some(region) = region else {
            return result.map_err(Into::into);
        };
        let value = match result {
            Ok(v) => v,
            Err(e) => {
                // Nothing ran: the region is still zero.
                arena.free([region]);
                return Err(e.into());
            }
        };
        let info = LaunchInfo {
            launch_id: header.launch_id,
            kernel: kernel_name(kernel),
            host_launch_ns,
            host_complete_ns: 0,
            grid: header.grid,
            block: header.block,
            parent: span.id(),
            host_thread: thread_name(),
            part: None,
        };
        self.hand_over(stream, span, info, work(region));
        Ok(value)
    }

    /// Sends the job to the collector, which marks the end of what was just
    /// launched on `stream` with an event at its next look: one event for all
    /// the launches it finds unmarked on a stream, and none recorded by the
    /// launching thread (on the H200 an event recorded with each launch cost
    /// the launch call +0.3 to +0.5 µs at p50). The job holds the stream until
    /// then. The mark may come after more work on the stream, which only
    /// delays delivery. Two cases record the event here, after the launch: a
    /// graph replay, whose region must come back soon (a graph has a few, and
    /// a mark after every replay queued since held them so long that in a
    /// storm of replays 13 % were recorded instead of 44 %), and a per-thread
    /// default stream, whose handle means another stream on the collector's
    /// thread. If no event can be recorded, the launching thread waits for the
    /// stream itself and sends the job marked finished: the trace is kept if
    /// it can be, and the region comes back either way (the error is said at
    /// the next flush).
    pub(super) fn hand_over(
        &self,
        stream: &Arc<CudaStream>,
        span: tracing::Span,
        launch: LaunchInfo,
        work: Work,
    ) {
        let raw = stream.cu_stream();
        let by_collector = raw as u64 != PER_THREAD && !matches!(work, Work::Replay { .. });
        let event = match by_collector {
            true => None,
            false => match self.events.record(raw) {
                Ok(ev) => Some(ev),
                Err(e) => {
                    self.shared.push_error(e.into());
                    if let Err(e) = stream.synchronize() {
                        self.shared.push_error(e.into());
                    }
                    None
                }
            },
        };
        // The legacy stream (null) lives as long as the context.
        let keep = by_collector && !raw.is_null();
        self.collector.send(Job {
            launch,
            dispatch: tracing::dispatcher::get_default(|d| d.clone()),
            span,
            mark: Mark {
                stream: raw as u64,
                event,
                by_collector,
            },
            stream: keep.then(|| stream.clone() as Arc<dyn Any + Send + Sync>),
            work,
        });
    }
}
