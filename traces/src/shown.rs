//! Numbers as the tools' messages show them.
//!
//! Rust's `{}` prints an `f64` in full positional notation: a flag given
//! as `1e300` came back in an error as a 301-digit number, and `1e-300`
//! as 300 zeros and a one. [`Num`] shows such a value in scientific
//! notation and every ordinary one exactly as `{}` does.

use std::fmt;

/// An `f64` for a message: `{}`'s shortest round-trip form when its
/// magnitude is from 10^-6 to below 10^15 (or 0), scientific notation
/// (`1e300`, `-2.5e-9`) otherwise; `NaN`, `inf` and `-inf` as such.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Num(pub f64);

impl fmt::Display for Num {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = self.0;
        let a = v.abs();
        if !v.is_finite() || v == 0.0 || (1e-6..1e15).contains(&a) {
            write!(f, "{v}")
        } else {
            write!(f, "{v:e}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Num;

    #[test]
    fn ordinary_values_read_as_before_and_extreme_ones_stay_short() {
        for (v, s) in [
            (0.0, "0"),
            (0.5, "0.5"),
            (-3.25, "-3.25"),
            (86_400.0, "86400"),
            (1e-6, "0.000001"),
            (123_456_789_012_345.0, "123456789012345"),
            (1e15, "1e15"),
            (1e300, "1e300"),
            (-1e300, "-1e300"),
            (1e-300, "1e-300"),
            (-2.5e-9, "-2.5e-9"),
            (f64::MAX, "1.7976931348623157e308"),
            (f64::NAN, "NaN"),
            (f64::INFINITY, "inf"),
            (f64::NEG_INFINITY, "-inf"),
        ] {
            assert_eq!(Num(v).to_string(), s, "{v:e}");
        }
    }
}
