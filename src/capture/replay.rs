//! A capture replayed: its calibrations refitted, its launches as batches.

use std::collections::HashMap;
use std::sync::Arc;

use super::{Capture, CaptureError, CaptureLaunch};
use crate::batch::{Batch, DeviceInfo};
use crate::clock::{Calibration, Checkpoint, ClockMap, FitOptions, HostOffsets};
use crate::registry::EventRegistry;

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
    /// [`CaptureReader::batches`](super::CaptureReader::batches) makes the same
    /// a launch at a time.
    pub fn batches(&self) -> Result<Vec<Arc<Batch>>, CaptureError> {
        let replay = Replay::new(self)?;
        self.launches
            .iter()
            .enumerate()
            .map(|(index, l)| replay.batch(index, l))
            .collect()
    }
}

/// What every batch of a capture shares: the registry, and each device with
/// its fitted calibration (none: the device has no round).
pub(super) struct Replay {
    registry: Arc<EventRegistry>,
    devices: HashMap<u32, (Arc<DeviceInfo>, Option<Arc<Calibration>>)>,
}

impl Replay {
    /// Fits the calibrations of `capture`'s devices (its launches are not read).
    pub(super) fn new(capture: &Capture) -> Result<Replay, CaptureError> {
        let mut fitted: HashMap<u32, Calibration> = capture.calibrations()?.into_iter().collect();
        let devices = capture
            .devices
            .iter()
            .map(|d| {
                let o = d.info.ordinal;
                (
                    o,
                    (Arc::new(d.info.clone()), fitted.remove(&o).map(Arc::new)),
                )
            })
            .collect();
        Ok(Replay {
            registry: Arc::new(capture.registry.clone()),
            devices,
        })
    }

    /// The batch of launch `index`.
    pub(super) fn batch(
        &self,
        index: usize,
        l: &CaptureLaunch,
    ) -> Result<Arc<Batch>, CaptureError> {
        let (device, cal) = self
            .devices
            .get(&l.device)
            .ok_or(CaptureError::UnknownDevice {
                launch: index,
                ordinal: l.device,
            })?;
        let calibration = cal.clone().ok_or(CaptureError::NoCalibration {
            launch: index,
            device: l.device,
        })?;
        Ok(Arc::new(Batch {
            device: device.clone(),
            launch: l.info(),
            buffer: l.buffer.clone(),
            calibration,
            registry: self.registry.clone(),
        }))
    }
}
