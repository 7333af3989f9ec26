//! What a trace writer has written: [`WriteStats`].

/// What a [`super::TraceWriter`] has written so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteStats {
    /// Bytes handed to the output.
    pub bytes: u64,
    /// Device events written (each a slice: range or instant).
    pub device_events: u64,
    /// Kernel slices written (one per launch: a launch delivered in parts
    /// gets one, at its last part).
    pub kernels: u64,
    /// Device events lost: made by the warps, not in the batches (shown on the
    /// "events lost" counter tracks; `decode::Slot::events_lost`).
    pub events_lost: u64,
    /// Host slices written (spans entered, events), by a layer.
    pub host_slices: u64,
    /// Flow arrows from a host launch span to its kernel.
    pub flows: u64,
}
