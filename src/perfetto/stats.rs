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
    /// Device records the slots had to drop (shown on the counter tracks).
    pub dropped: u64,
    /// Host slices written (spans entered, events), by a layer.
    pub host_slices: u64,
    /// Flow arrows from a host launch span to its kernel.
    pub flows: u64,
}
