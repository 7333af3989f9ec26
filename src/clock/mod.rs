//! Device clock → host clock: calibration samples in, a mapping with offset,
//! drift and an error bound out. Pure math: no CUDA, no tracing.
//!
//! The **trace clock** is [`HostClock::Boottime`]: Perfetto host spans, launch
//! times and the device mapping all use it (Perfetto's default clock, builtin id 6).
//!
//! # The pieces
//!
//! - [`Sample`]: one ping-pong, the host clock read before and after the device
//!   read its timer.
//! - [`ClockMap::fit`]: many samples taken close together (a *burst*) become one
//!   linear map `host = anchor_host + (device − anchor_device) · (1 + drift)`, with
//!   a rigorous error bound at every device time ([`ClockMap::bound_at`]).
//! - [`Calibration`]: the maps of one device over a whole run. Each recalibration
//!   adds a [`Checkpoint`] (a map plus the measured offsets between the host clocks,
//!   [`HostOffsets`]); device times between two checkpoints are interpolated
//!   between them, so long runs stay correct while the drift wanders.
//!   [`Calibration::to_host`] answers on any [`HostClock`].
//!
//! # Where the bound comes from
//!
//! A sample says that the device read its timer at some instant between
//! `host_before` and `host_after`. The device value is a *reading* of a counter
//! that steps every `q` ns (32 ns for `%globaltimer` on Hopper), so the true
//! device instant lies in `[device, device + q)`. Let `f(d)` be the host time at
//! which the device counter reads `d`. Then every sample gives
//!
//! ```text
//!     host_before − q ≤ f(device) ≤ host_after
//! ```
//!
//! whatever the split of the round trip into forward and return delay: no
//! symmetry is assumed. If `f` is linear over the burst (constant drift), the
//! true line satisfies every sample. At any device time `d`, `f(d)` therefore
//! lies between the lowest and the highest of the lines that satisfy the
//! samples (the *band*); the reported map is the line through the middle of the
//! band at both ends of the burst, and its bound is its distance to the farther
//! band edge, plus `q/2` for the reading of the event being mapped. With many
//! samples the band's width is about the *smallest* forward delay plus the
//! *smallest* return delay seen, not the round trip of any one sample. Outside
//! the burst the band widens with the uncertainty of the drift.
//!
//! A wrong sample (an outlier) would narrow the band around the wrong place.
//! Gross ones are dropped against a robust first fit. Against subtle ones the
//! band can be made of the lines that violate at most `r` samples on each side,
//! `r = tolerated_outliers` ([`FitOptions`], 0 by default): the bound then
//! holds as long as no more than `r` samples per side are wrong, at the cost of
//! the gap between the smallest and the (r+1)-th smallest delay. With `r = 0`,
//! samples that no line satisfies are an error rather than a wrong bound. See
//! [`ClockMap::fit_with`].

mod band;
mod calibration;
mod error;
mod fit;
mod host;
mod line;

pub use calibration::{Calibration, Checkpoint, DriftSegment, Mapper};
pub use error::ClockError;
pub use fit::{ClockMap, ClockMapParts, FitOptions, FitStats, Sample, GLOBALTIMER_STEP_NS};
pub use host::{HostClock, HostOffsets};

#[cfg(test)]
mod tests;
