//! The one fixed-point line every mapping uses, so every caller gets the same rounding.

/// A device → BOOTTIME line, `y = y0 + t + round(t · slope)` with
/// `t = x − x0`: every mapping of this module is one (a [`ClockMap`]'s, or a
/// [`Calibration`] segment's), so that every caller gets the same rounding.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Line {
    pub(super) x0: u64,
    pub(super) y0: u64,
    pub(super) slope: Slope,
}

/// The slope of a [`Line`] minus 1: the drift.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Slope {
    /// In units of 2⁻⁶⁴, |slope| < 1/4: every real clock. `t · slope` is then
    /// one integer multiply, exact for any `t` (|t| < 2⁶⁴, the product < 2¹²⁶)
    /// and the slope itself is within 2⁻⁶⁵ of the exact one, so the result is
    /// within 1 ns of the exactly rounded line even 2⁶⁴ ns from its origin.
    Fixed(i64),
    /// A slope no clock has (a checkpoint pair or a declared drift ≥ 25 %):
    /// evaluated in floating point; nothing depends on its precision.
    Float(f64),
}

impl Slope {
    /// A drift given as a ratio (host ns per device ns, minus 1).
    pub(super) fn of_drift(drift: f64) -> Slope {
        if drift.abs() < 0.25 {
            Slope::Fixed((drift * TWO_64).round() as i64)
        } else if drift.is_finite() {
            Slope::Float(drift)
        } else {
            Slope::Fixed(0)
        }
    }
}

/// 2⁶⁴, the scale of [`Slope::Fixed`].
pub(super) const TWO_64: f64 = 18_446_744_073_709_551_616.0;

impl Line {
    pub(super) fn new(x0: u64, y0: u64, slope: Slope) -> Line {
        Line { x0, y0, slope }
    }

    /// The line through `(xa, ya)` and `(xb, yb)`, xa < xb, with its slope
    /// from the exact ratio `((yb − ya) − (xb − xa)) / (xb − xa)`.
    pub(super) fn through(xa: u64, ya: u64, xb: u64, yb: u64) -> Line {
        let dx = xb as i128 - xa as i128;
        let excess = (yb as i128 - ya as i128) - dx;
        let slope = if excess.abs() < dx / 4 {
            // |excess| < 2⁶², so the shift cannot overflow, and the quotient is < 2⁶².
            Slope::Fixed(div_round(excess << 64, dx) as i64)
        } else {
            Slope::Float(excess as f64 / dx as f64)
        };
        Line::new(xa, ya, slope)
    }

    /// The line at `x`, rounded to the nearest ns (halves up).
    #[inline]
    pub(super) fn at(&self, x: u64) -> i128 {
        let t = x as i128 - self.x0 as i128;
        let corr = match self.slope {
            Slope::Fixed(k) => (t * k as i128 + (1 << 63)) >> 64,
            Slope::Float(k) => (t as f64 * k).round() as i128,
        };
        self.y0 as i128 + t + corr
    }
}

/// `n / d` rounded to nearest (d > 0).
pub(super) fn div_round(n: i128, d: i128) -> i128 {
    if n >= 0 {
        (n + d / 2) / d
    } else {
        -((-n + d / 2) / d)
    }
}
