//! One fitness score from a replay's metrics, for policy search
//! (`../shared/design/cluster-architecture.md`, "Fitness Evaluation"):
//! latencies map to `1 / (1 + value_ms)` (1 ms is the reference: lower is
//! better), throughputs to `value / (value + reference)` (100 requests/s,
//! 10,000 tokens/s), cost to `1 / (1 + replica-hours)`; the weighted sum
//! is the fitness (higher is better).
//! The normalisation compresses differences, so the raw metrics are always
//! reported beside it.

use crate::output::summary::{Dist, FitnessPart, FitnessReport, Summary};

/// The fitness `blis-replay evaluate` reports when no `--fitness-weights`
/// are given: throughput half, tail TTFT 30%, mean E2E 20% (the design's
/// example weighting of goodput against responsiveness).
pub const DEFAULT_WEIGHTS: &str = "throughput:0.5,p99_ttft:0.3,mean_e2e:0.2";

/// A malformed `--fitness-weights` list.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FitnessError {
    /// A name that is not a metric.
    #[error(
        "unknown fitness metric {0:?} (throughput, tokens_per_s, replica_seconds, or STAT_LATENCY with STAT in mean|p50|p90|p95|p99 and LATENCY in ttft|e2e|itl|tpot, e.g. p99_ttft)"
    )]
    UnknownMetric(String),
    /// An item that is not `METRIC:WEIGHT` with a finite weight.
    #[error("fitness weight {item:?}: {problem}")]
    Malformed {
        /// The item.
        item: String,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// No metric at all.
    #[error("no metric given")]
    Empty,
}

/// A metric the fitness can weigh.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FitnessMetric {
    /// Completed requests per second.
    Throughput,
    /// Output tokens per second.
    TokensPerS,
    /// The deployment's cost: replica-seconds (an autoscaler's billed
    /// ones; else instances × the run's duration). Lower is better.
    ReplicaSeconds,
    /// A latency statistic: (`ttft`|`e2e`|`itl`|`tpot`, `mean`|`p50`|`p90`|`p95`|`p99`).
    Latency(&'static str, &'static str),
}

const LATENCIES: [&str; 4] = ["ttft", "e2e", "itl", "tpot"];
const STATS: [&str; 5] = ["mean", "p50", "p90", "p95", "p99"];

impl FitnessMetric {
    /// Parses `throughput`, `tokens_per_s` or `STAT_LATENCY` (e.g.
    /// `p99_ttft`, `mean_e2e`).
    ///
    /// # Errors
    /// An unknown name, with the known forms.
    pub fn parse(s: &str) -> Result<Self, FitnessError> {
        match s {
            "throughput" => return Ok(Self::Throughput),
            "tokens_per_s" => return Ok(Self::TokensPerS),
            "replica_seconds" => return Ok(Self::ReplicaSeconds),
            _ => {}
        }
        if let Some((stat, lat)) = s.split_once('_')
            && let Some(stat) = STATS.iter().find(|x| **x == stat)
            && let Some(lat) = LATENCIES.iter().find(|x| **x == lat)
        {
            return Ok(Self::Latency(lat, stat));
        }
        Err(FitnessError::UnknownMetric(s.to_string()))
    }

    /// The raw value in `s` (latencies in ms).
    pub fn raw(self, s: &Summary) -> f64 {
        match self {
            Self::Throughput => s.throughput.requests_per_s,
            Self::TokensPerS => s.throughput.output_tokens_per_s,
            Self::ReplicaSeconds => match s.cluster.as_ref() {
                Some(c) => c.autoscale.as_ref().map_or_else(
                    || c.num_instances as f64 * s.throughput.duration_s,
                    |a| a.replica_seconds,
                ),
                None => s.throughput.duration_s,
            },
            Self::Latency(lat, stat) => {
                let d: &Dist = match lat {
                    "ttft" => &s.ttft_ms,
                    "e2e" => &s.e2e_ms,
                    "itl" => &s.itl_ms,
                    _ => &s.tpot_ms,
                };
                match stat {
                    "mean" => d.mean,
                    "p50" => d.p50,
                    "p90" => d.p90,
                    "p95" => d.p95,
                    _ => d.p99,
                }
            }
        }
    }

    /// The normalised score of `raw` in [0, 1] (higher is better).
    pub fn normalised(self, raw: f64) -> f64 {
        match self {
            Self::Throughput => raw / (raw + 100.0),
            Self::TokensPerS => raw / (raw + 10_000.0),
            Self::ReplicaSeconds => 1.0 / (1.0 + raw.max(0.0) / 3600.0),
            Self::Latency(..) => 1.0 / (1.0 + raw.max(0.0)),
        }
    }
}

/// Parses `throughput:0.5,p99_ttft:0.3`.
///
/// # Errors
/// A malformed item, an unknown metric, or a weight that is not finite.
pub fn parse_weights(s: &str) -> Result<Vec<(String, FitnessMetric, f64)>, FitnessError> {
    let mut out = Vec::new();
    for item in s.split(',').map(str::trim).filter(|x| !x.is_empty()) {
        let malformed = |problem| FitnessError::Malformed {
            item: item.to_string(),
            problem,
        };
        let (name, w) = item
            .split_once(':')
            .ok_or_else(|| malformed("expected METRIC:WEIGHT"))?;
        let w: f64 = w
            .trim()
            .parse()
            .map_err(|_| malformed("the weight is not a number"))?;
        if !w.is_finite() {
            return Err(malformed("the weight must be finite"));
        }
        out.push((
            name.trim().to_string(),
            FitnessMetric::parse(name.trim())?,
            w,
        ));
    }
    if out.is_empty() {
        return Err(FitnessError::Empty);
    }
    Ok(out)
}

/// The fitness report of `s`.
pub fn report(s: &Summary, weights: &[(String, FitnessMetric, f64)]) -> FitnessReport {
    let (score, parts) = fitness(s, weights);
    FitnessReport {
        score,
        metrics: parts
            .into_iter()
            .zip(weights)
            .map(|((name, raw, normalised), (_, _, weight))| FitnessPart {
                name,
                weight: *weight,
                raw,
                normalised,
            })
            .collect(),
    }
}

/// The fitness of `s` and each metric's (name, raw, normalised) value.
pub fn fitness(
    s: &Summary,
    weights: &[(String, FitnessMetric, f64)],
) -> (f64, Vec<(String, f64, f64)>) {
    let mut total = 0.0;
    let mut parts = Vec::new();
    for (name, m, w) in weights {
        let raw = m.raw(s);
        let n = m.normalised(raw);
        total += w * n;
        parts.push((name.clone(), raw, n));
    }
    (total, parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_parse_and_normalise_as_the_design_says() {
        assert_eq!(
            FitnessMetric::parse("p99_ttft").unwrap(),
            FitnessMetric::Latency("ttft", "p99")
        );
        assert!(FitnessMetric::parse("p42_ttft").is_err());
        // 50 ms of TTFT: 1 / (1 + 50).
        let m = FitnessMetric::Latency("ttft", "p99");
        assert!((m.normalised(50.0) - 1.0 / 51.0).abs() < 1e-12);
        assert!((FitnessMetric::Throughput.normalised(100.0) - 0.5).abs() < 1e-12);
        let w = parse_weights("throughput:0.5, p99_ttft:0.3").unwrap();
        assert_eq!(w.len(), 2);
        assert!(parse_weights("throughput:x").is_err());
        // One replica for an hour: 1 / (1 + 1).
        let c = FitnessMetric::parse("replica_seconds").unwrap();
        assert!((c.normalised(3600.0) - 0.5).abs() < 1e-12);
        assert!(c.normalised(7200.0) < c.normalised(3600.0));
    }
}
