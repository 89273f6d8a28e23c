//! Inter-arrival samplers: Poisson, constant, Gamma and Weibull, each
//! parameterised by a rate and a coefficient of variation (CV).
//!
//! Gamma: shape 1/CV², scale CV²/rate. Weibull: shape k solved from
//! Γ(1+2/k)/Γ(1+1/k)² = 1 + CV², scale (1/rate)/Γ(1+1/k). Both as in the
//! seed design (`../shared/design/workload-observe-calibrate.md` §4) and ServeGen
//! (arXiv:2505.09999, Finding 1: Gamma fits M-large, Weibull M-mid).

use rand_distr::{Distribution, Exp, Gamma, Weibull};
use statrs::function::gamma::{gamma, ln_gamma};

use crate::spec::ArrivalProcess;

/// Draws inter-arrival times in microseconds.
#[derive(Debug, Clone)]
pub enum ArrivalSampler {
    /// Exponential gaps.
    Poisson(Exp<f64>),
    /// Fixed gaps.
    Constant(f64),
    /// Gamma gaps.
    Gamma(Gamma<f64>),
    /// Weibull gaps.
    Weibull(Weibull<f64>),
}

/// The Weibull shape k whose coefficient of variation is `cv`.
///
/// Solved by bisection on ln k of lnΓ(1+2/k) − 2·lnΓ(1+1/k) = ln(1+CV²),
/// which decreases monotonically in k. Valid for CV in about [0.01, 20].
pub fn weibull_shape_from_cv(cv: f64) -> f64 {
    let target = (1.0 + cv * cv).ln();
    let g = |k: f64| ln_gamma(1.0 + 2.0 / k) - 2.0 * ln_gamma(1.0 + 1.0 / k) - target;
    let (mut lo, mut hi) = (0.02f64.ln(), 2000f64.ln());
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if g(mid.exp()) > 0.0 {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    (0.5 * (lo + hi)).exp()
}

/// The coefficient of variation of a Weibull with shape `k`.
pub fn weibull_cv(k: f64) -> f64 {
    let g1 = ln_gamma(1.0 + 1.0 / k);
    let g2 = ln_gamma(1.0 + 2.0 / k);
    ((g2 - 2.0 * g1).exp() - 1.0).max(0.0).sqrt()
}

/// The shape of `process` whose CV is `cv` (Gamma 1/CV², Weibull solved);
/// `None` for Poisson and constant.
pub fn shape_for_cv(process: ArrivalProcess, cv: f64) -> Option<f64> {
    match process {
        ArrivalProcess::Gamma => Some(1.0 / (cv * cv)),
        ArrivalProcess::Weibull => Some(weibull_shape_from_cv(cv)),
        _ => None,
    }
}

impl ArrivalSampler {
    /// A sampler with mean gap 1/`rate_per_s` and the given shape
    /// (`shape` from [`shape_for_cv`] or explicit; ignored for Poisson and
    /// constant). `None` when the rate is not positive.
    pub fn new(process: ArrivalProcess, rate_per_s: f64, shape: Option<f64>) -> Option<Self> {
        if rate_per_s.is_nan() || rate_per_s <= 0.0 || !rate_per_s.is_finite() {
            return None;
        }
        let mean_us = 1e6 / rate_per_s;
        Some(match process {
            ArrivalProcess::Poisson => ArrivalSampler::Poisson(Exp::new(1.0 / mean_us).ok()?),
            ArrivalProcess::Constant => ArrivalSampler::Constant(mean_us),
            ArrivalProcess::Gamma => {
                let a = shape.unwrap_or(1.0);
                ArrivalSampler::Gamma(Gamma::new(a, mean_us / a).ok()?)
            }
            ArrivalProcess::Weibull => {
                let k = shape.unwrap_or(1.0);
                ArrivalSampler::Weibull(Weibull::new(mean_us / gamma(1.0 + 1.0 / k), k).ok()?)
            }
        })
    }

    /// A sampler with an explicit shape and scale (µs), whatever rate they
    /// imply.
    pub fn with_scale(process: ArrivalProcess, shape: f64, scale_us: f64) -> Option<Self> {
        Some(match process {
            ArrivalProcess::Gamma => ArrivalSampler::Gamma(Gamma::new(shape, scale_us).ok()?),
            ArrivalProcess::Weibull => ArrivalSampler::Weibull(Weibull::new(scale_us, shape).ok()?),
            ArrivalProcess::Poisson => ArrivalSampler::Poisson(Exp::new(1.0 / scale_us).ok()?),
            ArrivalProcess::Constant => ArrivalSampler::Constant(scale_us),
        })
    }

    /// One gap, µs.
    pub fn sample<R: rand::Rng + ?Sized>(&self, rng: &mut R) -> f64 {
        match self {
            ArrivalSampler::Poisson(d) => d.sample(rng),
            ArrivalSampler::Constant(v) => *v,
            ArrivalSampler::Gamma(d) => d.sample(rng),
            ArrivalSampler::Weibull(d) => d.sample(rng),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weibull_shape_round_trips_cv() {
        for cv in [0.2, 0.5, 1.0, 1.5, 2.0, 4.0, 8.6, 15.0] {
            let k = weibull_shape_from_cv(cv);
            assert!((weibull_cv(k) - cv).abs() / cv < 1e-9, "cv {cv} k {k}");
        }
        // CV 1 is the exponential distribution.
        assert!((weibull_shape_from_cv(1.0) - 1.0).abs() < 1e-9);
    }
}
