//! guidellm's distribution summaries, computed as guidellm 0.8 computes
//! them (`guidellm.schemas.base.statistics`): a weighted sample turned into
//! a probability mass function, percentiles read off its cumulative sum
//! (`searchsorted(cdf, p, side="left")`), rates from event times weighted
//! by each event's local interval, concurrency from start/end intervals.
//! Confidence intervals are left out (`null`, which guidellm allows).

use serde::Serialize;

/// guidellm's `PERCENTILE_PROBABILITIES`, in its key order.
const PERCENTILES: [(&str, f64); 11] = [
    ("p001", 0.001),
    ("p01", 0.01),
    ("p05", 0.05),
    ("p10", 0.1),
    ("p25", 0.25),
    ("p50", 0.5),
    ("p75", 0.75),
    ("p90", 0.9),
    ("p95", 0.95),
    ("p99", 0.99),
    ("p999", 0.999),
];

/// Events closer than this (seconds) count as one (guidellm's default).
pub const MERGE_THRESHOLD_S: f64 = 1e-4;
const EPSILON: f64 = 1e-6;

/// guidellm's `DistributionSummary`.
#[derive(Debug, Clone, Serialize)]
pub struct Distribution {
    pub mean: f64,
    pub median: f64,
    pub mode: f64,
    pub variance: f64,
    pub std_dev: f64,
    pub min: f64,
    pub max: f64,
    pub count: u64,
    pub total_sum: f64,
    pub percentiles: serde_json::Map<String, serde_json::Value>,
    pub pdf: Option<()>,
    pub mean_ci: Option<()>,
    pub percentile_cis: Option<()>,
}

impl Distribution {
    fn empty(count: u64) -> Self {
        Distribution {
            mean: 0.0,
            median: 0.0,
            mode: 0.0,
            variance: 0.0,
            std_dev: 0.0,
            min: 0.0,
            max: 0.0,
            count,
            total_sum: 0.0,
            percentiles: PERCENTILES
                .iter()
                .map(|(k, _)| ((*k).to_string(), 0.0.into()))
                .collect(),
            pdf: None,
            mean_ci: None,
            percentile_cis: None,
        }
    }

    /// `DistributionSummary.from_values`: `(value, weight)` pairs; `count`
    /// defaults to the rounded sum of the weights.
    pub fn from_weighted(values: &[(f64, f64)], count: Option<u64>) -> Self {
        if values.is_empty() {
            return Self::empty(count.unwrap_or(0));
        }
        let count = count.unwrap_or_else(|| values.iter().map(|v| v.1).sum::<f64>().round() as u64);
        let mut sorted = values.to_vec();
        sorted.sort_by(|a, b| a.0.total_cmp(&b.0));
        // Equal values merged (weights summed), zero weights dropped.
        let mut pmf: Vec<(f64, f64)> = Vec::with_capacity(sorted.len());
        for (v, w) in sorted {
            match pmf.last_mut() {
                Some(last) if last.0 == v => last.1 += w,
                _ => pmf.push((v, w)),
            }
        }
        pmf.retain(|p| p.1 > 0.0);
        let mut total: f64 = pmf.iter().map(|p| p.1).sum();
        if total <= EPSILON {
            for p in &mut pmf {
                p.1 = 1.0;
            }
            total = pmf.len() as f64;
        }
        if pmf.is_empty() {
            return Self::empty(count);
        }
        for p in &mut pmf {
            p.1 /= total;
        }
        let mut cdf = Vec::with_capacity(pmf.len());
        let mut acc = 0.0;
        for p in &pmf {
            acc += p.1;
            cdf.push(acc);
        }
        let at = |q: f64| {
            let i = cdf.partition_point(|c| *c < q).min(pmf.len() - 1);
            pmf[i].0
        };
        let percentiles: serde_json::Map<String, serde_json::Value> = PERCENTILES
            .iter()
            .map(|(k, q)| ((*k).to_string(), at(*q).into()))
            .collect();
        let mean: f64 = pmf.iter().map(|p| p.0 * p.1).sum();
        let mut mode = pmf[0];
        for p in &pmf {
            if p.1 > mode.1 {
                mode = *p;
            }
        }
        let variance: f64 = pmf.iter().map(|p| (p.0 - mean).powi(2) * p.1).sum();
        Distribution {
            mean,
            median: at(0.5),
            mode: mode.0,
            variance,
            std_dev: variance.sqrt(),
            min: pmf[0].0,
            max: pmf[pmf.len() - 1].0,
            count,
            total_sum: mean * count as f64,
            percentiles,
            pdf: None,
            mean_ci: None,
            percentile_cis: None,
        }
    }

    /// `DistributionSummary.from_values` of unweighted values.
    pub fn from_values(values: &[f64]) -> Self {
        let w: Vec<(f64, f64)> = values.iter().map(|v| (*v, 1.0)).collect();
        Self::from_weighted(&w, None)
    }

    /// `DistributionSummary.rate_distribution_from_timings`: `(time_s,
    /// occurrences)` events within `[start, end]`; each event's rate is its
    /// occurrences over the half-way points to its neighbours.
    pub fn rate(events: &[(f64, f64)], start: f64, end: f64) -> Self {
        let mut t: Vec<(f64, f64)> = vec![(start, 0.0)];
        t.extend(
            events
                .iter()
                .copied()
                .filter(|e| e.0 >= start && e.0 <= end),
        );
        t.push((end, 0.0));
        t.sort_by(|a, b| a.0.total_cmp(&b.0));
        let t = merge(t);
        if t.len() <= 1 {
            return Self::from_weighted(&[], Some(t.len() as u64));
        }
        let n = t.len();
        let mid: Vec<f64> = t.windows(2).map(|w| (w[1].0 + w[0].0) / 2.0).collect();
        let mut dur = vec![0.0; n];
        dur[0] = mid[0] - t[0].0;
        for i in 1..n - 1 {
            dur[i] = mid[i] - mid[i - 1];
        }
        dur[n - 1] = (t[n - 1].0 - mid[n - 2]).max(EPSILON);
        let count = t.iter().map(|e| e.1).sum::<f64>().round() as u64;
        let rates: Vec<(f64, f64)> = t.iter().zip(&dur).map(|(e, d)| (e.1 / d, *d)).collect();
        Self::from_weighted(&rates, Some(count))
    }

    /// `DistributionSummary.concurrency_distribution_from_timings`:
    /// `(start_s, end_s)` intervals; the time-weighted number in flight
    /// within `[start, end]`.
    pub fn concurrency(intervals: &[(f64, f64)], start: f64, end: f64) -> Self {
        let kept: Vec<(f64, f64)> = intervals
            .iter()
            .copied()
            .filter(|i| i.1 >= start && i.0 <= end)
            .collect();
        let count = kept.len() as u64;
        let mut t: Vec<(f64, f64)> = kept.iter().map(|i| (i.0, 1.0)).collect();
        t.extend(kept.iter().map(|i| (i.1, -1.0)));
        t.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut t = merge(t);
        if !t.is_empty() {
            let before = t.partition_point(|e| e.0 < start);
            let prior: f64 = t[..before].iter().map(|e| e.1).sum();
            t.drain(..before);
            t.insert(0, (start, prior));
            let upto = t.partition_point(|e| e.0 <= end);
            t.truncate(upto);
            t.push((end, 0.0));
        }
        let mut level = 0.0;
        let conc: Vec<f64> = t
            .iter()
            .map(|e| {
                level += e.1;
                level.max(0.0)
            })
            .collect();
        if conc.len() <= 1 {
            let v: Vec<(f64, f64)> = if count == 0 {
                Vec::new()
            } else {
                vec![(conc[0], 1.0)]
            };
            return Self::from_weighted(&v, None);
        }
        let values: Vec<(f64, f64)> = t
            .windows(2)
            .zip(&conc)
            .map(|(w, c)| (*c, (w[1].0 - w[0].0).max(0.0)))
            .collect();
        if values.iter().any(|v| v.1 > 0.0) {
            Self::from_weighted(&values, Some(count))
        } else {
            Self::from_weighted(&[], Some(count))
        }
    }
}

/// Sorted `(time, weight)` events with equal times summed, then each group
/// of times within [`MERGE_THRESHOLD_S`] of its first kept as that first
/// time with the group's summed weight.
fn merge(sorted: Vec<(f64, f64)>) -> Vec<(f64, f64)> {
    let mut unique: Vec<(f64, f64)> = Vec::with_capacity(sorted.len());
    for e in sorted {
        match unique.last_mut() {
            Some(last) if last.0 == e.0 => last.1 += e.1,
            _ => unique.push(e),
        }
    }
    let mut out: Vec<(f64, f64)> = Vec::with_capacity(unique.len());
    let mut group_start = f64::NEG_INFINITY;
    for e in unique {
        match out.last_mut() {
            Some(last) if e.0 <= group_start + MERGE_THRESHOLD_S => last.1 += e.1,
            _ => {
                group_start = e.0;
                out.push(e);
            }
        }
    }
    out
}

/// guidellm's `StatusDistributionSummary`: one distribution per outcome and
/// one over all of them.
#[derive(Debug, Clone, Serialize)]
pub struct ByStatus {
    pub successful: Distribution,
    pub errored: Distribution,
    pub incomplete: Distribution,
    pub total: Distribution,
}

impl ByStatus {
    /// Applies `f` to the successful, incomplete and errored groups and to
    /// their concatenation (guidellm's order).
    pub fn of<T>(groups: [&[T]; 3], f: impl Fn(&[T]) -> Distribution) -> Self
    where
        T: Clone,
    {
        let all: Vec<T> = groups.iter().flat_map(|g| g.iter().cloned()).collect();
        ByStatus {
            successful: f(groups[0]),
            incomplete: f(groups[1]),
            errored: f(groups[2]),
            total: f(&all),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_read_off_the_cumulative_mass_as_guidellm_does() {
        let d = Distribution::from_values(&[1.0, 2.0, 3.0, 4.0]);
        assert_eq!(d.median, 2.0); // cdf 0.5 at the second value: searchsorted left
        assert_eq!(d.percentiles["p99"], 4.0);
        assert_eq!(d.mean, 2.5);
        assert_eq!(d.count, 4);
        assert_eq!(d.total_sum, 10.0);
    }

    #[test]
    fn concurrency_is_weighted_by_time() {
        // One request over [0, 1], a second over [0.5, 1]: 1 for half the
        // window, 2 for the other half.
        let d = Distribution::concurrency(&[(0.0, 1.0), (0.5, 1.0)], 0.0, 1.0);
        assert!((d.mean - 1.5).abs() < 1e-12, "{}", d.mean);
        assert_eq!(d.count, 2);
    }

    #[test]
    fn an_empty_group_gives_zeros() {
        let d = Distribution::rate(&[], 0.0, 1.0);
        assert_eq!(d.count, 0);
        assert_eq!(d.mean, 0.0);
    }
}
