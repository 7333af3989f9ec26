//! A capture replayed: its calibrations refitted, its launches as batches.

use std::sync::Arc;

use super::{Capture, CaptureError};
use crate::batch::{Batch, DeviceInfo};
use crate::clock::{Calibration, Checkpoint, ClockMap, FitOptions, HostOffsets};

impl Capture {
    /// Fits each device's calibration rounds (raw samples → [`ClockMap::fit_with`],
    /// one [`Checkpoint`] per round, in order): ordinal → calibration. A device
    /// with no rounds has no entry.
    pub fn calibrations(&self) -> Result<Vec<(u32, Calibration)>, CaptureError> {
        let mut out = Vec::with_capacity(self.devices.len());
        for d in &self.devices {
            let device = d.info.ordinal;
            let mut cal: Option<Calibration> = None;
            for (round, c) in d.calibrations.iter().enumerate() {
                let clock_err = |source| CaptureError::Clock {
                    device,
                    round,
                    source,
                };
                let mut options = FitOptions::default();
                if c.timer_step_ns != 0 {
                    options.timer_step_ns = c.timer_step_ns;
                }
                let checkpoint = Checkpoint {
                    map: ClockMap::fit_with(&c.samples, &options).map_err(clock_err)?,
                    host_offsets: HostOffsets {
                        realtime_ns: c.realtime_offset_ns,
                        monotonic_ns: c.monotonic_offset_ns,
                        monotonic_raw_ns: c.monotonic_raw_offset_ns,
                        uncertainty_ns: c.offset_uncertainty_ns,
                    },
                };
                match &mut cal {
                    None => cal = Some(Calibration::new(checkpoint)),
                    Some(cal) => cal.push(checkpoint).map_err(clock_err)?,
                }
            }
            if let Some(cal) = cal {
                out.push((device, cal));
            }
        }
        Ok(out)
    }

    /// The replay: one [`Batch`] per launch, in launch order, ready for
    /// [`crate::deliver`] to the sinks. Each device's calibration is fitted once and
    /// shared by its batches; the registry is shared by all.
    pub fn batches(&self) -> Result<Vec<Arc<Batch>>, CaptureError> {
        let registry = Arc::new(self.registry.clone());
        let fitted = self.calibrations()?;
        let devices: Vec<(Arc<DeviceInfo>, Option<Arc<Calibration>>)> = self
            .devices
            .iter()
            .map(|d| {
                let cal = fitted
                    .iter()
                    .find(|(o, _)| *o == d.info.ordinal)
                    .map(|(_, c)| Arc::new(c.clone()));
                (Arc::new(d.info.clone()), cal)
            })
            .collect();
        self.launches
            .iter()
            .enumerate()
            .map(|(launch, l)| {
                let (device, cal) = devices.iter().find(|(d, _)| d.ordinal == l.device).ok_or(
                    CaptureError::UnknownDevice {
                        launch,
                        ordinal: l.device,
                    },
                )?;
                let calibration = cal.clone().ok_or(CaptureError::NoCalibration {
                    launch,
                    device: l.device,
                })?;
                Ok(Arc::new(Batch {
                    device: device.clone(),
                    launch: l.info(),
                    buffer: l.buffer.clone(),
                    calibration,
                    registry: registry.clone(),
                }))
            })
            .collect()
    }
}
