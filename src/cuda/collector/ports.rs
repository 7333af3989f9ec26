//! The collector's ports to the rest of the profiler, with nothing of CUDA:
//! the clock it recalibrates ([`Recalibrate`]) and where batches and
//! calibrations may also go ([`Archive`]: the capture file).

use std::time::Duration;

use crate::batch::{Batch, DeviceInfo};
use crate::clock::{Checkpoint, Sample};
use crate::cuda::error::ProfilerError;
use crate::watch::Snapshot;

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
    /// Takes a watchdog's snapshot, and its text as the run told it.
    fn snapshot(&mut self, snapshot: &Snapshot, text: &str);
    /// Writes everything out.
    fn finish(&mut self) -> Result<(), ProfilerError>;
}
