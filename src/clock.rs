//! Device clock → host clock: calibration samples in, a mapping with offset,
//! drift and an error bound out. Pure math: no CUDA, no tracing.
//!
//! The **trace clock** is [`HostClock::Boottime`]: Perfetto host spans, launch
//! times and the device mapping all use it (Perfetto's default clock, builtin id 6).

/// A host clock that outputs can stamp with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HostClock {
    /// `CLOCK_REALTIME`: wall time, for OTLP. Can be stepped.
    Realtime,
    /// `CLOCK_MONOTONIC`: slewed by NTP, stops in suspend.
    Monotonic,
    /// `CLOCK_MONOTONIC_RAW`: the raw oscillator, never slewed.
    MonotonicRaw,
    /// `CLOCK_BOOTTIME`: monotonic, counts suspend; the trace clock.
    Boottime,
}

impl HostClock {
    /// Every host clock, in a fixed order.
    pub const ALL: [HostClock; 4] = [
        HostClock::Realtime,
        HostClock::Monotonic,
        HostClock::MonotonicRaw,
        HostClock::Boottime,
    ];

    fn clock_id(self) -> libc::clockid_t {
        match self {
            HostClock::Realtime => libc::CLOCK_REALTIME,
            HostClock::Monotonic => libc::CLOCK_MONOTONIC,
            HostClock::MonotonicRaw => libc::CLOCK_MONOTONIC_RAW,
            HostClock::Boottime => libc::CLOCK_BOOTTIME,
        }
    }

    /// The clock's current reading in nanoseconds.
    #[inline]
    pub fn now_ns(self) -> u64 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid timespec; the clock ids above exist on Linux.
        unsafe { libc::clock_gettime(self.clock_id(), &mut ts) };
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    }
}

/// One calibration sample: the host clock read just before and just after the
/// device read its timer. The device time lies in `[host_before, host_after]`
/// on the host's timeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sample {
    /// Host clock before the device read (ns).
    pub host_before: u64,
    /// Device `%globaltimer` (ns).
    pub device: u64,
    /// Host clock after the device read (ns).
    pub host_after: u64,
}

/// Device → host mappings for one device over time (being written).
#[derive(Debug, Clone, Default)]
pub struct Calibration {}
