//! What can go wrong fitting clocks.

/// Errors of clock fitting and calibration bookkeeping.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ClockError {
    /// Too few usable samples to fit a line.
    #[error("not enough calibration samples: {got} usable, {needed} needed")]
    NotEnoughSamples {
        /// Usable two-sided samples (0 < host_before ≤ host_after < u64::MAX).
        got: usize,
        /// The minimum.
        needed: usize,
    },
    /// Every sample has the same device time: the drift cannot be fitted.
    #[error("the calibration samples span no device time")]
    NoDeviceSpan,
    /// More samples disagree with the fit than agree with it.
    #[error("calibration samples are inconsistent: {rejected} of {total} rejected as outliers")]
    TooManyOutliers {
        /// Samples rejected.
        rejected: usize,
        /// Samples given.
        total: usize,
    },
    /// A fit option is out of range.
    #[error("invalid clock fit option: {0}")]
    InvalidOptions(&'static str),
    /// No line satisfies the samples: some are wrong, by less than the
    /// gross-outlier tolerance (see [`FitOptions::tolerated_outliers`](crate::clock::FitOptions::tolerated_outliers)).
    #[error("no clock line satisfies all calibration samples (a subtly wrong sample? see FitOptions::tolerated_outliers)")]
    Inconsistent,
    /// [`ClockMapParts`](crate::clock::ClockMapParts) that do not describe a map.
    #[error("invalid clock map: {0}")]
    InvalidParts(&'static str),
    /// A checkpoint that does not come after the last one (device and host time
    /// must both advance).
    #[error("checkpoint at device {next} ns does not follow the last one at device {last} ns")]
    NotLater {
        /// Anchor device time of the last checkpoint.
        last: u64,
        /// Anchor device time of the rejected one.
        next: u64,
    },
}
