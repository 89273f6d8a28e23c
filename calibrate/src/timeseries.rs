//! Server time series of the two sides (the real run's scraped `/metrics`,
//! the simulator's own samples under vLLM's names) aligned by time since
//! each run's start: queue depth, running requests and KV cache usage, and
//! the prefix-cache hit rate over the run.

use std::collections::BTreeMap;

use blis_traces::{MetricSample, Trace};
use serde::Serialize;

use crate::stats::{mean, pearson};

/// The series compared: a label and the metric names that carry it
/// (vLLM V1, vLLM V0, SGLang).
pub const SERIES: [(&str, &[&str]); 3] = [
    (
        "queue_depth",
        &["vllm:num_requests_waiting", "sglang:num_queue_reqs"],
    ),
    (
        "running",
        &["vllm:num_requests_running", "sglang:num_running_reqs"],
    ),
    (
        "kv_usage",
        &[
            "vllm:kv_cache_usage_perc",
            "vllm:gpu_cache_usage_perc",
            "sglang:token_usage",
        ],
    ),
];

/// Agreement of one series.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Agreement {
    /// `queue_depth`, `running` or `kv_usage`.
    pub series: &'static str,
    /// Grid points compared.
    pub points: u64,
    /// Mean absolute difference.
    pub mae: f64,
    /// Pearson's r over the grid (NaN when a side is constant).
    pub pearson_r: f64,
    /// Real mean over the grid.
    pub real_mean: f64,
    /// Simulated mean over the grid.
    pub sim_mean: f64,
}

/// Prefix-cache hit rate of each side over the run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct HitRates {
    /// Real (from `vllm:prefix_cache_hits/queries` counters, else the
    /// requests' `cached_tokens`).
    pub real: Option<f64>,
    /// Simulated.
    pub sim: Option<f64>,
}

/// The time-series comparison.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TimeSeriesReport {
    /// Grid step, seconds (the real side's median scrape interval).
    pub interval_s: f64,
    /// Per series.
    pub series: Vec<Agreement>,
    /// Prefix-cache hit rates.
    pub prefix_cache_hit_rate: HitRates,
}

/// Aligned values of one series, for plots.
#[derive(Debug, Clone, PartialEq)]
pub struct Aligned {
    /// Series label.
    pub series: &'static str,
    /// Seconds since run start.
    pub t_s: Vec<f64>,
    /// Real values.
    pub real: Vec<f64>,
    /// Simulated values.
    pub sim: Vec<f64>,
}

/// One series of one side as a step function: (seconds since run start,
/// value), the label sets at one time summed (counts) or averaged (usage).
fn extract(
    samples: &[MetricSample],
    names: &[&str],
    run_start: i64,
    average: bool,
) -> Vec<(f64, f64)> {
    let Some(name) = names.iter().find(|n| samples.iter().any(|s| s.name == **n)) else {
        return Vec::new();
    };
    let mut at: BTreeMap<i64, (f64, u32)> = BTreeMap::new();
    for s in samples
        .iter()
        .filter(|s| s.name == *name && s.value.is_finite())
    {
        let e = at.entry(s.timestamp_us).or_default();
        e.0 += s.value;
        e.1 += 1;
    }
    at.into_iter()
        .map(|(t, (v, n))| {
            let v = if average { v / f64::from(n) } else { v };
            ((t - run_start) as f64 / 1e6, v)
        })
        .collect()
}

/// The value of a step function at `t` (the last sample at or before it).
fn value_at(f: &[(f64, f64)], t: f64) -> Option<f64> {
    let i = f.partition_point(|(x, _)| *x <= t);
    (i > 0).then(|| f[i - 1].1)
}

fn counter_delta(samples: &[MetricSample], name: &str) -> Option<f64> {
    let mut by_t: BTreeMap<i64, f64> = BTreeMap::new();
    for s in samples.iter().filter(|s| s.name == name) {
        *by_t.entry(s.timestamp_us).or_default() += s.value;
    }
    let first = by_t.values().next()?;
    let last = by_t.values().next_back()?;
    Some(last - first)
}

fn hit_rate(t: &Trace) -> Option<f64> {
    if let Some(m) = t.metrics.as_deref() {
        let hits = counter_delta(m, "vllm:prefix_cache_hits_total");
        let queries = counter_delta(m, "vllm:prefix_cache_queries_total");
        if let (Some(h), Some(q)) = (hits, queries)
            && q > 0.0
        {
            return Some(h / q);
        }
    }
    let (mut cached, mut input) = (0u64, 0u64);
    for r in &t.records {
        if let Some(c) = r.outcome.cached_tokens {
            cached += u64::from(c);
            input += u64::from(r.effective_input_tokens());
        }
    }
    (input > 0).then(|| cached as f64 / input as f64)
}

/// Compares the time series of the two traces, when both have metrics.
pub fn compare(real: &Trace, sim: &Trace) -> Option<(TimeSeriesReport, Vec<Aligned>)> {
    let hit = HitRates {
        real: hit_rate(real),
        sim: hit_rate(sim),
    };
    let (rm, sm) = (real.metrics.as_deref()?, sim.metrics.as_deref()?);
    let (r0, s0) = (
        real.header.run_start_unix_us.unwrap_or(0),
        sim.header.run_start_unix_us.unwrap_or(0),
    );
    let mut series = Vec::new();
    let mut aligned = Vec::new();
    let mut step = f64::NAN;
    for (label, names) in SERIES {
        let average = label == "kv_usage";
        let (fr, fs) = (
            extract(rm, names, r0, average),
            extract(sm, names, s0, average),
        );
        if fr.len() < 2 || fs.is_empty() {
            continue;
        }
        if step.is_nan() {
            let mut gaps: Vec<f64> = fr.windows(2).map(|w| w[1].0 - w[0].0).collect();
            gaps.sort_by(f64::total_cmp);
            step = crate::stats::percentile(&gaps, 50.0).max(0.01);
        }
        let (lo, hi) = (
            fr[0].0.max(fs[0].0),
            fr[fr.len() - 1].0.min(fs[fs.len() - 1].0),
        );
        let mut a = Aligned {
            series: label,
            t_s: Vec::new(),
            real: Vec::new(),
            sim: Vec::new(),
        };
        let mut t = lo;
        while t <= hi && a.t_s.len() < 100_000 {
            if let (Some(x), Some(y)) = (value_at(&fr, t), value_at(&fs, t)) {
                a.t_s.push(t);
                a.real.push(x);
                a.sim.push(y);
            }
            t += step;
        }
        if a.t_s.is_empty() {
            continue;
        }
        let mae = a
            .real
            .iter()
            .zip(&a.sim)
            .map(|(x, y)| (x - y).abs())
            .sum::<f64>()
            / a.t_s.len() as f64;
        series.push(Agreement {
            series: label,
            points: a.t_s.len() as u64,
            mae,
            pearson_r: pearson(&a.real, &a.sim),
            real_mean: mean(&a.real),
            sim_mean: mean(&a.sim),
        });
        aligned.push(a);
    }
    if series.is_empty() {
        return None;
    }
    Some((
        TimeSeriesReport {
            interval_s: step,
            series,
            prefix_cache_hit_rate: hit,
        },
        aligned,
    ))
}

/// The prefix-cache hit rates alone (when the time series cannot be
/// compared).
pub fn hit_rates(real: &Trace, sim: &Trace) -> HitRates {
    HitRates {
        real: hit_rate(real),
        sim: hit_rate(sim),
    }
}
