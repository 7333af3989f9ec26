//! What a launch hands the collector ([`Job`]: a direct launch or a graph
//! replay, and where its records are), and how the collector turns a pass's
//! finished jobs into decoded buffers ([`Taken`], [`decode_all`]).

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use tracing::Dispatch;

use crate::batch::LaunchInfo;
use crate::decode::OwnedBuffer;
use crate::format::{trimmed, BufferHeader};
use crate::registry::EventRegistry;

use super::device::Arena;
use super::device::{Mark, Place};
use super::drain::Drainers;
use super::error::ProfilerError;

/// One profiled launch, or one replay of a profiled graph, on its way to the sinks.
pub(crate) struct Job {
    /// The launch (its `host_complete_ns` is filled in by the collector). For
    /// a replay: the replay's, which each node's batch copies, with the node's
    /// kernel, shape and launch id (`launch_id` + the node's index).
    pub launch: LaunchInfo,
    /// The dispatcher that was current when the launch was made.
    pub dispatch: Dispatch,
    /// The launch span, kept open until delivery so that `launch.parent` stays valid.
    pub span: tracing::Span,
    /// Recorded after the launch on its stream.
    pub mark: Mark,
    /// The launch's stream while the collector has still to mark it: kept
    /// alive so that the collector may record on it (then let go, so that
    /// destroying it is not put off further). `None` when marked already, and
    /// for the legacy stream, which lives as long as the context.
    pub stream: Option<Arc<dyn Any + Send + Sync>>,
    /// Where its records are.
    pub work: Work,
}

/// Where a job's records are, and what they hold.
pub(crate) enum Work {
    /// A direct launch: its region of the arena, and the buffer header the
    /// host would have written before it (the device never reads it).
    Launch {
        /// The buffer header.
        header: BufferHeader,
        /// The region.
        place: Place,
    },
    /// A replay of a captured graph: the region of the graph's replay ring that
    /// the replay's prologue takes (if it was armed), holding one buffer per
    /// profiled kernel node.
    Replay {
        /// The replay's number, counted from 0 by the device and by the host alike.
        replay: u64,
        /// The region replay `replay` takes.
        place: Place,
        /// The graph's profiled kernel nodes, in capture order.
        nodes: Arc<[Node]>,
        /// The graph's replays as the host and the device count them.
        count: Arc<ReplayCount>,
        /// Ends when the collector has armed the region again (or drops the job).
        in_flight: InFlight,
    },
    /// A streamed launch: its rings, in the streaming arena, are read while it
    /// runs and delivered in parts (`drain/`).
    Streamed {
        /// The buffer header (its capacity is the rings' size).
        header: BufferHeader,
        /// The region, in mapped host memory.
        place: Place,
        /// The streaming arena, which the region goes back to.
        arena: Arc<Arena>,
        /// The threads that read the rings, started by the collector at its
        /// first look (not on the launching thread).
        drain: Option<Drainers>,
        /// Its watchdog, if any, and the snapshots it has taken.
        watch: Option<(Watchdog, u32)>,
    },
}

/// A streamed launch's watchdog (issue #32): once the launch has run `deadline`
/// without finishing, the collector takes a snapshot of every warp's watch cell
/// (a kernel built with `TGPU_WATCH=1`), and again every `every` if set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Watchdog {
    pub deadline: std::time::Duration,
    pub every: Option<std::time::Duration>,
}

impl Watchdog {
    /// The variables that set a profiler's watchdog when its builder does not:
    /// seconds, fractions allowed.
    pub(crate) const ENV: &str = "TGPU_WATCHDOG";
    pub(crate) const ENV_EVERY: &str = "TGPU_WATCHDOG_EVERY";

    /// The watchdog the environment asks for: [`Watchdog::ENV`] and
    /// [`Watchdog::ENV_EVERY`] read through `var`; an error names a bad value.
    pub(crate) fn from_env(
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Watchdog>, ProfilerError> {
        let seconds = |name: &str| -> Result<Option<std::time::Duration>, ProfilerError> {
            let Some(v) = var(name) else { return Ok(None) };
            v.trim()
                .parse::<f64>()
                .ok()
                .and_then(|s| std::time::Duration::try_from_secs_f64(s).ok())
                .filter(|d| !d.is_zero())
                .map(Some)
                .ok_or_else(|| {
                    ProfilerError::Invalid(format!("{name}={v:?}: expected seconds above zero"))
                })
        };
        let every = seconds(Self::ENV_EVERY)?;
        Ok(seconds(Self::ENV)?.map(|deadline| Watchdog { deadline, every }))
    }

    /// The host time (trace clock, ns) of snapshot `n` of a launch made at `launch_ns`;
    /// `None` once the last one is taken.
    pub(crate) fn due_ns(&self, launch_ns: u64, n: u32) -> Option<u64> {
        let first = launch_ns.saturating_add(self.deadline.as_nanos() as u64);
        match (n, self.every) {
            (0, _) => Some(first),
            (_, None) => None,
            (n, Some(e)) => Some(first.saturating_add(e.as_nanos() as u64 * n as u64)),
        }
    }
}

impl Work {
    /// Where the records are.
    pub(crate) fn place(&self) -> &Place {
        match self {
            Work::Launch { place, .. }
            | Work::Replay { place, .. }
            | Work::Streamed { place, .. } => place,
        }
    }

    /// How many launches the job stands for.
    pub(crate) fn launches(&self) -> u64 {
        match self {
            Work::Launch { .. } | Work::Streamed { .. } => 1,
            Work::Replay { nodes, .. } => nodes.len() as u64,
        }
    }
}

/// A profiled kernel node of a captured graph.
#[derive(Debug, Clone)]
pub(crate) struct Node {
    /// The kernel's name in the trace.
    pub kernel: Arc<str>,
    /// Its buffer header (the launch id is set per replay).
    pub header: BufferHeader,
    /// Its buffer's offset in a replay region.
    pub offset: usize,
    /// Its buffer's size.
    pub len: usize,
}

impl Node {
    /// Where the device finds the node's buffer in a replay region: 64 bytes
    /// before slot 0, as every `tgpu::Trace::base` (docs/format.md), which is
    /// past the header's first 64 bytes in a sampled buffer.
    pub(crate) fn device_offset(&self) -> usize {
        self.offset + self.header.size() - crate::format::BUFFER_HEADER_SIZE
    }
}

/// How many replays of an adopted graph the host has made and the device has
/// run: the device's count is the graph state's first word, which every
/// replay's prologue raises by one, and which the collector fetches with each
/// replay's region. While every replay goes through `Profiler::launch_graph`,
/// the device's count after replay `r` has finished is at least `r + 1` and
/// at most the host's. A replay made another way (`cuGraphLaunch` on the
/// executable graph, another instantiation of it) raises the device's count
/// alone, and an executable graph updated in place to other kernel nodes
/// stops raising it: from then on the replays' regions no longer match their
/// numbers (they would all be skipped), so the graph is out of step, an error.
pub(crate) struct ReplayCount {
    /// The state's first word, fetched with the replays' regions.
    pub counter: Place,
    /// Replays made by `launch_graph`, the next replay's number: raised
    /// before `cuGraphLaunch` (and lowered again if it fails), so that the
    /// device's count never exceeds it.
    launched: AtomicU64,
    /// Replays the collector is done with: brought back and their region
    /// armed again, or dropped ([`InFlight`]).
    ended: AtomicU64,
    /// Where the counts first disagreed.
    out_of_step: OnceLock<OutOfStep>,
}

/// Where a graph's replay counts disagreed: after replay `replay` finished,
/// the device counted `device` replays, the host `launched`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OutOfStep {
    pub replay: u64,
    pub device: u64,
    pub launched: u64,
}

impl OutOfStep {
    /// The error for graph `graph`.
    pub(crate) fn error(self, graph: &str) -> ProfilerError {
        ProfilerError::GraphOutOfStep {
            graph: graph.to_owned(),
            replay: self.replay,
            device: self.device,
            launched: self.launched,
        }
    }
}

impl ReplayCount {
    pub(crate) fn new(counter: Place) -> ReplayCount {
        ReplayCount {
            counter,
            launched: AtomicU64::new(0),
            ended: AtomicU64::new(0),
            out_of_step: OnceLock::new(),
        }
    }

    /// Replays made so far: the next one's number.
    pub(crate) fn launched(&self) -> u64 {
        self.launched.load(Ordering::Acquire)
    }

    /// `launch_graph` is about to make replay `n - 1` (or, with `n` one less,
    /// has failed to).
    pub(crate) fn set_launched(&self, n: u64) {
        self.launched.store(n, Ordering::Release);
    }

    /// Replays launched that the collector is not yet done with. While they are
    /// as many as the ring has regions, the next replay's region cannot be
    /// armed: its prologue would find it in use and record nothing.
    pub(crate) fn in_flight(&self) -> u64 {
        // `ended` first: read after `launched`, a replay ending in between could
        // make it the larger.
        let ended = self.ended.load(Ordering::Acquire);
        self.launched().saturating_sub(ended)
    }

    /// Where the counts disagreed, if they have.
    pub(crate) fn out_of_step(&self) -> Option<OutOfStep> {
        self.out_of_step.get().copied()
    }

    /// Checks the device's count, fetched after replay `replay` finished,
    /// against the host's, read now. `Err` if the graph is out of step: with
    /// the disagreement the first time one is seen.
    pub(crate) fn check(&self, replay: u64) -> Result<(), Option<OutOfStep>> {
        if self.out_of_step.get().is_some() {
            return Err(None);
        }
        let device = self.device();
        let launched = self.launched();
        if replay < device && device <= launched {
            return Ok(());
        }
        let seen = OutOfStep {
            replay,
            device,
            launched,
        };
        let mut first = false;
        self.out_of_step.get_or_init(|| {
            first = true;
            seen
        });
        Err(first.then_some(seen))
    }

    /// The device's count, as last fetched.
    fn device(&self) -> u64 {
        let word = self.counter.memory.mirror(&self.counter.region);
        u64::from_le_bytes(word[..8].try_into().expect("the counter's 8 bytes"))
    }
}

/// A replay the host has launched, until the collector has armed its region
/// again ([`InFlight::end`]) or dropped its job: counted in
/// [`ReplayCount::in_flight`] meanwhile.
pub(crate) struct InFlight(Option<Arc<ReplayCount>>);

impl InFlight {
    /// A replay of `count`'s graph just launched.
    pub(crate) fn new(count: &Arc<ReplayCount>) -> InFlight {
        InFlight(Some(count.clone()))
    }

    /// The collector is done with the replay; later calls do nothing.
    pub(crate) fn end(&mut self) {
        if let Some(count) = self.0.take() {
            count.ended.fetch_add(1, Ordering::AcqRel);
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.end();
    }
}

/// One launch of a finished job, ready to decode: its bytes in the mirror.
pub(crate) struct Taken<'a> {
    pub launch: LaunchInfo,
    pub header: BufferHeader,
    pub bytes: &'a [u8],
    pub dispatch: &'a Dispatch,
    pub span: &'a tracing::Span,
}

impl Taken<'_> {
    /// The launches of `jobs` (a replay's nodes each), completed at `complete_ns`.
    pub(crate) fn of(jobs: &[Job], complete_ns: u64) -> Vec<Taken<'_>> {
        let mut out = Vec::with_capacity(jobs.len());
        for job in jobs {
            let mut launch = job.launch.clone();
            launch.host_complete_ns = complete_ns;
            let (dispatch, span) = (&job.dispatch, &job.span);
            match &job.work {
                Work::Launch { header, place } => out.push(Taken {
                    launch,
                    header: *header,
                    bytes: place.memory.mirror(&place.region),
                    dispatch,
                    span,
                }),
                // The collector delivers those itself, in parts (Worker::end_stream).
                Work::Streamed { .. } => {}
                Work::Replay { place, nodes, .. } => {
                    let region = place.memory.mirror(&place.region);
                    for (i, node) in nodes.iter().enumerate() {
                        let mut header = node.header;
                        header.launch_id = launch.launch_id + i as u64;
                        let mut l = launch.clone();
                        l.launch_id = header.launch_id;
                        l.kernel.clone_from(&node.kernel);
                        l.grid = header.grid;
                        l.block = header.block;
                        out.push(Taken {
                            launch: l,
                            header,
                            bytes: &region[node.offset..node.offset + node.len],
                            dispatch,
                            span,
                        });
                    }
                }
            }
        }
        out
    }
}

/// Fewer launches than this in a pass are decoded on the collector thread alone.
const PARALLEL_FROM: usize = 8;

/// Decodes launches' bytes (each buffer header written here, the device never
/// writes it; the slots cut to the records written, `format::trimmed`), on up
/// to `workers` threads when there are many: decoding is most of the
/// collector's work per launch, and a storm of short launches brings back more
/// than one core decodes.
pub(crate) fn decode_all(
    registry: &EventRegistry,
    inputs: &[(BufferHeader, &[u8])],
    workers: usize,
) -> Vec<Result<OwnedBuffer, ProfilerError>> {
    let one = |(header, bytes): &(BufferHeader, &[u8])| {
        let launch_id = header.launch_id;
        if bytes.len() < header.size() {
            return Err(ProfilerError::Invalid(format!(
                "launch {launch_id}: {} bytes came back, less than a buffer header",
                bytes.len()
            )));
        }
        OwnedBuffer::decode(trimmed(bytes, header), Some(registry))
            .map_err(|source| ProfilerError::Decode { launch_id, source })
    };
    if workers <= 1 || inputs.len() < PARALLEL_FROM {
        return inputs.iter().map(one).collect();
    }
    let chunk = inputs.len().div_ceil(workers);
    std::thread::scope(|scope| {
        let parts: Vec<_> = inputs
            .chunks(chunk)
            .map(|c| scope.spawn(move || c.iter().map(one).collect::<Vec<_>>()))
            .collect();
        parts
            .into_iter()
            .flat_map(|p| p.join().expect("decoding does not panic"))
            .collect()
    })
}
