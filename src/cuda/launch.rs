//! The part of a profiled launch common to direct and streamed launches: the
//! launch itself in its region, and handing the job to the collector.

use cudarc::driver::CudaStream;

use super::error::ProfilerError;
use super::job::{Job, Work};
use super::memory::Mark;
use super::names::{kernel_name, thread_name};
use super::profiler::Profiler;
use super::ring::{Arena, Region};
use crate::batch::LaunchInfo;
use crate::clock::HostClock;
use crate::format::{BufferHeader, KernelArg};

impl Profiler {
    /// A launch with its region of `arena` (`None`: the arena is full, the launch
    /// runs unrecorded and is counted as skipped), the argument `arg` makes of
    /// the region: the clock read, the launch, and the job `work` makes of the
    /// region handed over. Direct launches and streamed ones go through here.
    pub(super) fn launch_in<T, E, F>(
        &self,
        (stream, kernel, header, span): (&CudaStream, &str, BufferHeader, tracing::Span),
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

    /// Marks the end of what was just launched on `stream` with an event and
    /// sends the job to the collector. If no event can be recorded, the
    /// launching thread waits for the stream itself and sends the job marked
    /// finished: the trace is kept if it can be, and the region comes back
    /// either way (the error is said at the next flush). On the legacy
    /// default stream it records nothing: the collector marks its launches,
    /// one event for many (on the H200 an event recorded there cost the
    /// launch call +0.5 µs at p50, against +0.2 µs on a stream of its own,
    /// where the collector cannot record: the stream may be gone by then).
    pub(super) fn hand_over(
        &self,
        stream: &CudaStream,
        span: tracing::Span,
        launch: LaunchInfo,
        work: Work,
    ) {
        let legacy = stream.cu_stream().is_null();
        let event = match legacy {
            true => None,
            false => match self.events.record(stream.cu_stream()) {
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
        self.collector.send(Job {
            launch,
            dispatch: tracing::dispatcher::get_default(|d| d.clone()),
            span,
            mark: Mark {
                stream: stream.cu_stream() as u64,
                event,
                by_collector: legacy,
            },
            work,
        });
    }
}
