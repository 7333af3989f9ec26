//! How finding sinks fails: every slot is taken.

use super::slots::MAX_SINKS;

/// More than [`MAX_SINKS`] sinks at once.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("more than {MAX_SINKS} batch sinks are alive at once")]
#[non_exhaustive]
pub struct TooManySinks;
