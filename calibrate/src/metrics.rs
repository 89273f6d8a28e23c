//! The report of one latency metric: both distributions, their errors with
//! bootstrap intervals, per-request agreement, distribution tests, QQ pairs
//! and a grade.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::bootstrap::{Cis, Interval};
use crate::pairs::Series;
use crate::stats::{
    grade, ks_2samp_sorted, mape, mpe, pearson, qq_sorted, sorted, spearman, wasserstein_sorted,
};

/// The percentiles reported (and bootstrapped).
pub const QUANTILES: [f64; 4] = [50.0, 90.0, 95.0, 99.0];

/// Mean and percentiles of one side, ms (no count or maximum: the
/// report gives the pairs' count once).
pub type Dist = blis_traces::LatencyStats;

/// [`Dist`] of sorted values.
pub fn dist_of_sorted(v: &[f64]) -> Dist {
    Dist::of_sorted(v).without_count().without_max()
}

/// The error of one statistic: sim − real.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct StatError {
    /// sim − real, ms.
    pub signed_ms: f64,
    /// (sim − real) / real.
    pub relative: f64,
    /// 95% bootstrap interval of `signed_ms`.
    pub ci95_signed_ms: Option<Interval>,
    /// 95% bootstrap interval of `relative`.
    pub ci95_relative: Option<Interval>,
}

/// Sample sizes of the distributions compared.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Samples {
    /// Real samples.
    pub real: u64,
    /// Simulated samples.
    pub sim: u64,
}

/// One metric compared.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MetricReport {
    /// Request pairs with this metric on both sides.
    pub n: u64,
    /// Values in each distribution (= `n` except for ITL, whose
    /// distributions are of every inter-chunk gap).
    pub samples: Samples,
    /// Real distribution.
    pub real: Dist,
    /// Simulated distribution.
    pub sim: Dist,
    /// Errors of `mean`, `p50`, `p90`, `p95`, `p99`.
    pub errors: BTreeMap<String, StatError>,
    /// Mean absolute percentage error per request, %.
    pub mape: f64,
    /// 95% bootstrap interval of `mape`.
    pub mape_ci95: Option<Interval>,
    /// Mean signed percentage error per request, % (positive: the
    /// simulator is slower than reality).
    pub mpe: f64,
    /// Pearson's r of the per-request values.
    pub pearson_r: f64,
    /// 95% bootstrap interval of `pearson_r`.
    pub pearson_r_ci95: Option<Interval>,
    /// Spearman's ρ of the per-request values.
    pub spearman_rho: f64,
    /// Two-sample Kolmogorov–Smirnov statistic of the distributions.
    pub ks_d: f64,
    /// Its two-sided p-value.
    pub ks_p: f64,
    /// Whether `ks_p` is exact (else asymptotic).
    pub ks_exact: bool,
    /// Wasserstein-1 distance of the distributions, ms.
    pub wasserstein: f64,
    /// `excellent`, `good`, `fair` or `poor` (from MAPE and r).
    pub grade: &'static str,
    /// 100 QQ pairs `[real, sim]` at quantiles (k + 0.5)%.
    pub qq: Vec<[f64; 2]>,
}

/// The report of a metric from its per-request `series`, the
/// distributions to compare (`dists`, sorted; the series' own values when
/// `None`) and its bootstrap intervals.
pub fn report(
    series: &Series,
    dists: Option<(Vec<f64>, Vec<f64>)>,
    cis: &Cis,
) -> Option<MetricReport> {
    if series.real.is_empty() {
        return None;
    }
    let per_request = dists.is_none();
    let (r, s) = dists.unwrap_or_else(|| (sorted(&series.real), sorted(&series.sim)));
    if r.is_empty() || s.is_empty() {
        return None;
    }
    let (dr, ds) = (dist_of_sorted(&r), dist_of_sorted(&s));
    let mut errors = BTreeMap::new();
    for k in ["mean", "p50", "p90", "p95", "p99"] {
        let (a, b) = (dr.get(k), ds.get(k));
        let ci = cis
            .percentile_error
            .iter()
            .find(|(q, _, _)| format!("p{q:.0}") == k)
            .filter(|_| per_request);
        errors.insert(
            k.to_string(),
            StatError {
                signed_ms: b - a,
                relative: if a != 0.0 { (b - a) / a } else { f64::NAN },
                ci95_signed_ms: ci.and_then(|c| c.1),
                ci95_relative: ci.and_then(|c| c.2),
            },
        );
    }
    let ks = ks_2samp_sorted(&r, &s);
    let m = mape(&series.real, &series.sim);
    let pr = pearson(&series.real, &series.sim);
    Some(MetricReport {
        n: series.real.len() as u64,
        samples: Samples {
            real: r.len() as u64,
            sim: s.len() as u64,
        },
        real: dr,
        sim: ds,
        errors,
        mape: m,
        mape_ci95: cis.mape,
        mpe: mpe(&series.real, &series.sim),
        pearson_r: pr,
        pearson_r_ci95: cis.pearson_r,
        spearman_rho: spearman(&series.real, &series.sim),
        ks_d: ks.d,
        ks_p: ks.p,
        ks_exact: ks.exact,
        wasserstein: wasserstein_sorted(&r, &s),
        grade: grade(m, pr),
        qq: qq_sorted(&r, &s, 100),
    })
}
