//! Medians and quantiles of timings, and the latency distribution of calls.

use std::time::Duration;

use hdrhistogram::Histogram;

/// The durations of many calls (launch calls in the storms), in a streaming histogram:
/// bounded memory whatever the count, 3 significant digits.
#[derive(Clone)]
pub struct Calls(Histogram<u64>);

impl Default for Calls {
    fn default() -> Self {
        // 1 ns to 1 hour; a longer call is counted as an hour.
        Calls(Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid bounds"))
    }
}

impl Calls {
    /// Counts a call that took `d`.
    pub fn record(&mut self, d: Duration) {
        self.0
            .saturating_record(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    }

    /// Adds the calls counted by `other` (another thread's).
    pub fn add(&mut self, other: &Calls) {
        // Same bounds on both sides: nothing is out of range.
        let _ = self.0.add(&other.0);
    }

    /// Calls counted.
    pub fn count(&self) -> u64 {
        self.0.len()
    }

    /// The quantile `q` (0.5: median) in µs; 0 if nothing was counted.
    pub fn us(&self, q: f64) -> f64 {
        self.0.value_at_quantile(q) as f64 / 1e3
    }

    /// The mean in µs; 0 if nothing was counted.
    pub fn mean_us(&self) -> f64 {
        self.0.mean() / 1e3
    }
}

/// The median of `v` (sorts it): the middle value, or the mean of the two middle ones;
/// NaN if `v` is empty.
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The upper median of `v` (sorts it): the value at `len / 2`; NaN if `v` is empty.
pub fn upper_median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The quantile `q` of `v` (sorts it), nearest rank: the value at `round((len - 1) × q)`;
/// NaN if `v` is empty.
pub fn quantile(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    let i = ((v.len().saturating_sub(1)) as f64 * q.clamp(0.0, 1.0)).round() as usize;
    v.get(i).copied().unwrap_or(f64::NAN)
}

/// `x` against `base`, in percent (+ slower).
pub fn percent(base: f64, x: f64) -> f64 {
    (x / base - 1.0) * 100.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(&mut []).is_nan());
        assert_eq!(upper_median(&mut [4.0, 1.0, 3.0, 2.0]), 3.0);
        assert_eq!(upper_median(&mut [2.0, 1.0, 3.0]), 2.0);
        assert!(upper_median(&mut []).is_nan());
    }

    #[test]
    fn quantiles_by_nearest_rank() {
        let mut v: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        assert_eq!(quantile(&mut v, 0.5), 51.0);
        assert_eq!(quantile(&mut v, 0.99), 99.0);
        assert_eq!(quantile(&mut v, 0.0), 1.0);
        assert_eq!(quantile(&mut v, 1.0), 100.0);
        assert!(quantile(&mut [], 0.5).is_nan());
    }

    #[test]
    fn call_quantiles_within_three_digits_and_merged() {
        let mut a = Calls::default();
        for us in 1..=1000u64 {
            a.record(Duration::from_micros(us));
        }
        let near = |got: f64, want: f64| (got - want).abs() <= want * 1e-3;
        assert!(near(a.us(0.5), 500.0), "{}", a.us(0.5));
        assert!(near(a.us(0.99), 990.0), "{}", a.us(0.99));
        assert!(near(a.mean_us(), 500.5), "{}", a.mean_us());
        let mut b = Calls::default();
        b.record(Duration::from_secs(7200)); // over the bound: counted, clamped
        b.add(&a);
        assert_eq!(b.count(), 1001);
        assert!(near(b.us(0.5), 501.0), "{}", b.us(0.5));
        assert!(b.us(1.0) >= 3.59e9, "{}", b.us(1.0));
        assert_eq!(Calls::default().us(0.5), 0.0);
    }
}
