//! The device's clock on the profiler's side: the first calibration, taken
//! when the profiler is built, and the recalibration the collector runs
//! ([`Recalibrate`], on a [`Calibrator`] of its own).

use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::CudaContext;

use crate::cuda::calibrate::Calibrator;
use crate::cuda::collector::{Recalibrate, Recalibration, Round};
use crate::cuda::error::{CalibrateError, ProfilerError};

/// Periodic recalibration on the collector thread: a cheap round of
/// `periodic` ping-pongs ([`Calibrator::PERIODIC_ROUNDS`] by default).
struct DeviceClock {
    calibrator: Calibrator,
    periodic: usize,
}

impl DeviceClock {
    fn round(&mut self, rounds: usize) -> Result<Round, CalibrateError> {
        let samples = self.calibrator.sample(rounds)?;
        let checkpoint = self.calibrator.checkpoint(&samples)?;
        Ok(Round {
            samples,
            checkpoint,
        })
    }
}

impl Recalibrate for DeviceClock {
    fn round(&mut self, beside_stream: bool) -> Result<Round, ProfilerError> {
        self.calibrator.set_timeout(match beside_stream {
            true => Calibrator::TIMEOUT_BESIDE_STREAM,
            false => Calibrator::TIMEOUT,
        });
        Ok(DeviceClock::round(self, self.periodic)?)
    }
}

/// The first calibration (thorough: `rounds.0` ping-pongs), and the
/// recalibration (`rounds.1`) the collector runs every `period`.
pub(super) fn start_clock(
    ctx: &Arc<CudaContext>,
    period: Option<Duration>,
    rounds: (usize, usize),
    pollers: u32,
    lineinfo: bool,
) -> Result<(Round, Option<Recalibration>), ProfilerError> {
    let mut calibrator = Calibrator::with_lineinfo(ctx, lineinfo)?;
    calibrator.set_pollers(pollers)?;
    let mut clock = DeviceClock {
        calibrator,
        periodic: rounds.1,
    };
    let first = clock.round(rounds.0)?;
    let recalibrate = period.map(|p| (Box::new(clock) as Box<dyn Recalibrate>, p));
    Ok((first, recalibrate))
}
