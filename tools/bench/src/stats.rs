//! Medians of timings.

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
}
