//! Samplers for token lengths and ratios built from [`DistSpec`]s, and the
//! empirical PMF (inverse-CDF sampling, as ServeGen's `np.searchsorted`).

use std::path::Path;
use std::sync::Arc;

use rand::RngExt;
use rand_distr::{Distribution, Exp, LogNormal, Normal, Pareto};

use crate::error::{Error, Result};
use crate::spec::{DistKind, DistSpec};

/// A discrete distribution over values (token counts or ratios), sampled by
/// inverting its CDF with a binary search.
#[derive(Debug, Clone, PartialEq)]
pub struct Empirical {
    values: Vec<f64>,
    cdf: Vec<f64>,
}

impl Empirical {
    /// Builds from `(value, probability)` pairs in any order; zero-probability
    /// values are dropped, duplicates merged, probabilities normalised.
    ///
    /// # Errors
    /// No positive probability, or a negative or non-finite entry.
    pub fn from_pairs(mut pairs: Vec<(f64, f64)>) -> std::result::Result<Self, String> {
        if pairs
            .iter()
            .any(|(v, p)| !v.is_finite() || !p.is_finite() || *p < 0.0)
        {
            return Err("PMF has a negative or non-finite entry".into());
        }
        pairs.retain(|(_, p)| *p > 0.0);
        pairs.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut values: Vec<f64> = Vec::with_capacity(pairs.len());
        let mut probs: Vec<f64> = Vec::with_capacity(pairs.len());
        for (v, p) in pairs {
            if values.last() == Some(&v) {
                *probs.last_mut().expect("same length") += p;
            } else {
                values.push(v);
                probs.push(p);
            }
        }
        let total: f64 = probs.iter().sum();
        if values.is_empty() || total <= 0.0 {
            return Err("PMF has no value with positive probability".into());
        }
        let mut acc = 0.0;
        let mut cdf: Vec<f64> = probs
            .iter()
            .map(|p| {
                acc += p;
                acc / total
            })
            .collect();
        *cdf.last_mut().expect("non-empty") = 1.0;
        Ok(Self { values, cdf })
    }

    /// The value at uniform quantile `u` in [0, 1): the smallest value whose
    /// CDF is ≥ u.
    pub fn quantile(&self, u: f64) -> f64 {
        let i = self.cdf.partition_point(|&c| c < u);
        self.values[i.min(self.values.len() - 1)]
    }

    /// P(X ≤ x).
    pub fn cdf(&self, x: f64) -> f64 {
        let i = self.values.partition_point(|&v| v <= x);
        if i == 0 { 0.0 } else { self.cdf[i - 1] }
    }

    /// The support, ascending.
    pub fn values(&self) -> &[f64] {
        &self.values
    }

    /// Mean of the distribution.
    pub fn mean(&self) -> f64 {
        let mut prev = 0.0;
        self.values
            .iter()
            .zip(&self.cdf)
            .map(|(v, c)| {
                let p = c - prev;
                prev = *c;
                v * p
            })
            .sum()
    }
}

/// Parses a Python dict literal of numbers, `{224: 0.0003, 225: 1e-05}`,
/// as ServeGen's dataset files hold them (no `eval`).
///
/// # Errors
/// Anything that is not `{number: number, ...}`.
pub fn parse_pmf_literal(s: &str) -> std::result::Result<Vec<(f64, f64)>, String> {
    let t = s.trim();
    let inner = t
        .strip_prefix('{')
        .and_then(|r| r.strip_suffix('}'))
        .ok_or_else(|| "expected a dict literal {value: probability, ...}".to_string())?;
    let mut out = Vec::new();
    for (i, item) in inner.split(',').enumerate() {
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        let (k, v) = item
            .split_once(':')
            .ok_or_else(|| format!("entry {i} ({item:?}) is not `value: probability`"))?;
        let key: f64 = k
            .trim()
            .parse()
            .map_err(|_| format!("entry {i}: value {:?} is not a number", k.trim()))?;
        let p: f64 = v
            .trim()
            .parse()
            .map_err(|_| format!("entry {i}: probability {:?} is not a number", v.trim()))?;
        out.push((key, p));
    }
    Ok(out)
}

/// Reads a PMF file: a JSON object `{value: probability}`, a JSON array
/// whose index is the value (BLIS's PDF arrays), or a Python dict literal.
///
/// # Errors
/// I/O errors, or content that is none of those.
pub fn read_pmf_file(path: &Path) -> Result<Vec<(f64, f64)>> {
    // (A PMF of every token count up to a million is a few MB.)
    let text = crate::text::read_text_limited(path, 64 << 20).map_err(|e| Error::io(path, e))?;
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) {
        match v {
            serde_json::Value::Object(map) => {
                let mut out = Vec::with_capacity(map.len());
                for (k, v) in map {
                    let key: f64 = k.trim().parse().map_err(|_| {
                        Error::in_file(path, format!("PMF value {k:?} is not a number"))
                    })?;
                    let p = v.as_f64().ok_or_else(|| {
                        Error::in_file(path, format!("probability of {k} is not a number"))
                    })?;
                    out.push((key, p));
                }
                return Ok(out);
            }
            serde_json::Value::Array(arr) => {
                let mut out = Vec::with_capacity(arr.len());
                for (i, v) in arr.iter().enumerate() {
                    let p = v.as_f64().ok_or_else(|| {
                        Error::in_file(path, format!("entry {i} of the PDF array is not a number"))
                    })?;
                    out.push((i as f64, p));
                }
                return Ok(out);
            }
            serde_json::Value::String(s) => {
                return parse_pmf_literal(&s).map_err(|m| Error::in_file(path, m));
            }
            _ => {}
        }
    }
    parse_pmf_literal(&text).map_err(|m| Error::in_file(path, m))
}

/// A sampler of non-negative reals built from a [`DistSpec`], with its clamps.
#[derive(Debug, Clone)]
pub enum Sampler {
    /// Normal.
    Gaussian(Normal<f64>),
    /// Exponential.
    Exponential(Exp<f64>),
    /// Log-normal.
    Lognormal(LogNormal<f64>),
    /// Pareto with probability `weight`, else log-normal.
    ParetoLognormal {
        /// Pareto component.
        pareto: Pareto<f64>,
        /// Log-normal component.
        lognormal: LogNormal<f64>,
        /// Probability of the Pareto component.
        weight: f64,
    },
    /// A constant.
    Constant(f64),
    /// An empirical PMF.
    Empirical(Arc<Empirical>),
}

impl Sampler {
    /// Builds the sampler of `spec` (already validated); `base_dir` resolves
    /// a relative `file`.
    ///
    /// # Errors
    /// An unreadable or malformed PMF file, or parameters the distribution
    /// constructors reject.
    pub fn from_spec(spec: &DistSpec, base_dir: &Path) -> Result<Self> {
        let q = &spec.params;
        let f = |v: Option<crate::spec::Finite>| v.map(|x| x.0).unwrap_or(0.0);
        let bad =
            |what: &str| Error::in_file(Path::new("<spec>"), format!("invalid {what} parameters"));
        Ok(match spec.kind {
            DistKind::Gaussian => Sampler::Gaussian(
                Normal::new(f(q.mean), f(q.std_dev)).map_err(|_| bad("gaussian"))?,
            ),
            DistKind::Exponential => {
                Sampler::Exponential(Exp::new(1.0 / f(q.mean)).map_err(|_| bad("exponential"))?)
            }
            DistKind::Lognormal => Sampler::Lognormal(
                LogNormal::new(f(q.mu), f(q.sigma)).map_err(|_| bad("lognormal"))?,
            ),
            DistKind::ParetoLognormal => Sampler::ParetoLognormal {
                pareto: Pareto::new(f(q.xm), f(q.alpha)).map_err(|_| bad("pareto"))?,
                lognormal: LogNormal::new(f(q.mu), f(q.sigma)).map_err(|_| bad("lognormal"))?,
                weight: f(q.mix_weight),
            },
            DistKind::Constant => Sampler::Constant(f(q.value)),
            DistKind::Empirical => {
                let pairs = match (&spec.pmf, &spec.file) {
                    (Some(pmf), _) => pmf
                        .iter()
                        .map(|(k, v)| (k.trim().parse::<f64>().unwrap_or(f64::NAN), v.0))
                        .collect(),
                    (None, Some(file)) => {
                        let path = if file.is_absolute() {
                            file.clone()
                        } else {
                            base_dir.join(file)
                        };
                        read_pmf_file(&path)?
                    }
                    (None, None) => return Err(bad("empirical")),
                };
                let path = spec
                    .file
                    .as_ref()
                    .map(|f| base_dir.join(f))
                    .unwrap_or_else(|| "<spec>".into());
                Sampler::Empirical(Arc::new(
                    Empirical::from_pairs(pairs).map_err(|m| Error::in_file(&path, m))?,
                ))
            }
        })
    }

    /// One raw (unclamped, unrounded) draw.
    pub fn draw<R: rand::Rng + ?Sized>(&self, rng: &mut R) -> f64 {
        match self {
            Sampler::Gaussian(d) => d.sample(rng),
            Sampler::Exponential(d) => d.sample(rng),
            Sampler::Lognormal(d) => d.sample(rng),
            Sampler::ParetoLognormal {
                pareto,
                lognormal,
                weight,
            } => {
                if rng.random::<f64>() < *weight {
                    pareto.sample(rng)
                } else {
                    lognormal.sample(rng)
                }
            }
            Sampler::Constant(v) => *v,
            Sampler::Empirical(e) => e.quantile(rng.random::<f64>()),
        }
    }
}

/// Draws integer lengths: a [`Sampler`] rounded to the nearest integer and
/// clamped to `[min, max]`.
#[derive(Debug, Clone)]
pub struct LengthSampler {
    sampler: Sampler,
    min: f64,
    max: f64,
}

impl LengthSampler {
    /// A sampler of `spec` whose values are at least `default_min` unless the
    /// spec sets `params.min`.
    ///
    /// # Errors
    /// As [`Sampler::from_spec`].
    pub fn new(spec: &DistSpec, base_dir: &Path, default_min: u32) -> Result<Self> {
        let max = spec.params.max.map_or(f64::from(u32::MAX), |m| m.0);
        // A `max` below the default minimum wins (the spec's own `min` was
        // checked against it).
        let min = spec
            .params
            .min
            .map_or(f64::from(default_min), |m| m.0)
            .min(max);
        Ok(Self {
            sampler: Sampler::from_spec(spec, base_dir)?,
            min,
            max,
        })
    }

    /// A sampler of an empirical PMF with the given minimum.
    pub fn empirical(e: Arc<Empirical>, min: u32) -> Self {
        Self {
            sampler: Sampler::Empirical(e),
            min: f64::from(min),
            max: f64::from(u32::MAX),
        }
    }

    /// One length.
    pub fn sample<R: rand::Rng + ?Sized>(&self, rng: &mut R) -> u32 {
        let v = self.sampler.draw(rng).round();
        let v = if v.is_nan() {
            self.min
        } else {
            v.clamp(self.min, self.max)
        };
        v as u32
    }
}

/// Draws ratios in `[0, 1]` (clamped to the spec's `min`/`max` too).
#[derive(Debug, Clone)]
pub struct RatioSampler {
    sampler: Sampler,
    min: f64,
    max: f64,
}

impl RatioSampler {
    /// A ratio sampler of `spec`.
    ///
    /// # Errors
    /// As [`Sampler::from_spec`].
    pub fn new(spec: &DistSpec, base_dir: &Path) -> Result<Self> {
        Ok(Self {
            sampler: Sampler::from_spec(spec, base_dir)?,
            min: spec.params.min.map_or(0.0, |m| m.0).max(0.0),
            max: spec.params.max.map_or(1.0, |m| m.0).min(1.0),
        })
    }

    /// A ratio sampler of an empirical PMF.
    pub fn empirical(e: Arc<Empirical>) -> Self {
        Self {
            sampler: Sampler::Empirical(e),
            min: 0.0,
            max: 1.0,
        }
    }

    /// One ratio.
    pub fn sample<R: rand::Rng + ?Sized>(&self, rng: &mut R) -> f64 {
        let v = self.sampler.draw(rng);
        if v.is_nan() {
            self.min
        } else {
            v.clamp(self.min, self.max)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pmf_literal_parses_scientific_and_float_keys() {
        let p = parse_pmf_literal("{1: 0.5, 2: 2.5e-01, 0.25: 0.25}").unwrap();
        assert_eq!(p, vec![(1.0, 0.5), (2.0, 0.25), (0.25, 0.25)]);
        assert_eq!(parse_pmf_literal("{}").unwrap(), vec![]);
        assert!(parse_pmf_literal("[1, 2]").is_err());
        assert!(parse_pmf_literal("{1: x}").is_err());
    }

    #[test]
    fn empirical_inverts_the_cdf_like_searchsorted_left() {
        let e = Empirical::from_pairs(vec![(10.0, 0.25), (20.0, 0.5), (30.0, 0.25)]).unwrap();
        assert_eq!(e.quantile(0.0), 10.0);
        assert_eq!(e.quantile(0.25), 10.0);
        assert_eq!(e.quantile(0.2500001), 20.0);
        assert_eq!(e.quantile(0.75), 20.0);
        assert_eq!(e.quantile(0.99), 30.0);
        assert_eq!(e.cdf(19.0), 0.25);
        assert_eq!(e.cdf(30.0), 1.0);
        assert!((e.mean() - 20.0).abs() < 1e-12);
    }

    /// A spec's length is a whole number of tokens: a draw is rounded to
    /// the nearest, then clamped to `min` (default 1 for prompts and
    /// outputs) and `max` (docs/workload-specs.md).
    #[test]
    fn a_length_is_rounded_to_a_whole_token_then_clamped() {
        use crate::spec::{DistKind, DistParams, Finite};
        let constant = |v: f64, min: Option<f64>, max: Option<f64>| DistSpec {
            kind: DistKind::Constant,
            params: DistParams {
                value: Some(Finite(v)),
                min: min.map(Finite),
                max: max.map(Finite),
                ..DistParams::default()
            },
            pmf: None,
            file: None,
        };
        let mut rng = <rand::rngs::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(1);
        let draw = |spec: DistSpec, rng: &mut rand::rngs::ChaCha8Rng| {
            LengthSampler::new(&spec, Path::new("."), 1)
                .unwrap()
                .sample(rng)
        };
        assert_eq!(draw(constant(0.5, None, None), &mut rng), 1);
        assert_eq!(draw(constant(0.0, None, None), &mut rng), 1);
        assert_eq!(draw(constant(256.7, None, None), &mut rng), 257);
        assert_eq!(draw(constant(256.4, None, None), &mut rng), 256);
        assert_eq!(draw(constant(0.0, Some(0.0), None), &mut rng), 0);
        assert_eq!(draw(constant(900.0, None, Some(512.0)), &mut rng), 512);
    }

    #[test]
    fn empirical_rejects_empty_and_merges_duplicates() {
        assert!(Empirical::from_pairs(vec![(1.0, 0.0)]).is_err());
        let e = Empirical::from_pairs(vec![(1.0, 1.0), (1.0, 1.0), (2.0, 2.0)]).unwrap();
        assert_eq!(e.values(), &[1.0, 2.0]);
        assert_eq!(e.cdf(1.0), 0.5);
    }
}
