//! What a snapshot holds: every warp of a running launch, read at once, each
//! not started, done, or running (its open ranges and what it closed last).

/// What one warp was doing when its cell was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum State {
    /// Its head is not written: the warp has not started (or does not watch).
    NotStarted,
    /// It has flushed, at `at_ns` (device ns).
    Done { at_ns: u64 },
    /// It is running: its open ranges, outermost first, and what it closed last.
    Running {
        open: Vec<Open>,
        last: Option<Last>,
        /// When it stamped its latest entry (device ns), if any.
        last_entry_ns: Option<u64>,
        /// When its recorder was made (device ns).
        started_ns: u64,
    },
}

/// An open range: its event and since when (device ns).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Open {
    pub(crate) id: u16,
    pub(crate) since_ns: u64,
}

/// The warp's latest closed range (or instant), with the payload that closed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Last {
    pub(crate) id: u16,
    pub(crate) payload: Option<u32>,
}

/// One warp of a snapshot: its slot (block × warps per block + warp), its SM as
/// its head last said, its state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Warp {
    pub(crate) slot: u32,
    pub(crate) sm: u32,
    pub(crate) state: State,
}

impl Warp {
    /// Since when it has been doing what it does now (device ns): its innermost open
    /// range's start, else its last entry's time, else its start; `None` if not running.
    pub(crate) fn since_ns(&self) -> Option<u64> {
        match &self.state {
            State::Running {
                open,
                last_entry_ns,
                started_ns,
                ..
            } => Some(
                open.last()
                    .map(|o| o.since_ns)
                    .or(*last_entry_ns)
                    .unwrap_or(*started_ns),
            ),
            _ => None,
        }
    }
}

/// Every warp of a running launch, read at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Snapshot {
    pub(crate) launch_id: u64,
    pub(crate) kernel: String,
    pub(crate) grid: [u32; 3],
    pub(crate) warps_per_block: u32,
    /// The device time just after the cells were read (ns): durations are measured to it.
    pub(crate) now_ns: u64,
    /// How long the launch had been running, on the host's clock (ns).
    pub(crate) running_ns: u64,
    /// Which snapshot of the launch this is (0 the first, at the deadline).
    pub(crate) index: u32,
    pub(crate) warps: Vec<Warp>,
}
