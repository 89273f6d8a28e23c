//! A run's latency samples in bounded memory, for its summary: exact
//! (sorted samples, numpy's linear percentile) up to [`EXACT_SAMPLES`] per
//! figure, then an HDR histogram (Gil Tene's HdrHistogram, the
//! `hdrhistogram` crate) with 3 significant digits: percentiles within
//! 0.1% of the exact ones, the count, mean and max still exact. The
//! trace keeps every sample; `blis-calibrate` gives exact figures of any
//! length of run from it.

use std::collections::BTreeMap;

use blis_traces::LatencyStats as Stats;
use hdrhistogram::Histogram;

/// Samples of a figure kept exactly; past this, the figure's percentiles
/// come from a histogram (2^14, so that the exact samples of the six
/// per-request figures take at most 768 KiB).
pub const EXACT_SAMPLES: usize = 16_384;

/// Distinct inter-token latencies (µs) counted exactly before a histogram
/// takes over.
pub const EXACT_DISTINCT_ITL: usize = 16_384;

/// Significant digits of the histograms (relative error at most 10^-3).
const SIGFIG: u8 = 3;

/// An empty auto-resizing histogram of µs.
fn histogram() -> Histogram<u64> {
    // 3 significant digits is within the crate's range (0..=5).
    Histogram::new(SIGFIG).unwrap_or_else(|_| unreachable!("3 significant digits are valid"))
}

/// The most µs a histogram grows to hold (2^53, the traces' time limit):
/// it stays within about 350 KB.
const MAX_US: u64 = 1 << 53;

/// A value in ms as the histogram's whole µs (negative ones as 0).
fn us_of_ms(ms: f64) -> u64 {
    let us = (ms * 1e3).round();
    if us > 0.0 { us as u64 } else { 0 }
}

/// Records `count` samples of `us` µs, growing the histogram as needed
/// (up to [`MAX_US`]).
fn record(h: &mut Histogram<u64>, us: u64, count: u64) {
    let us = us.min(MAX_US);
    if h.record_n(us, count).is_err() {
        h.saturating_record_n(us, count);
    }
}

/// The [`Stats`] of a histogram of µs, reported in ms, with the exact
/// count, sum and max.
fn stats_of_histogram(h: &Histogram<u64>, n: u64, sum_ms: f64, max_ms: f64) -> Stats {
    let counts: Vec<(f64, u64)> = h
        .iter_recorded()
        .map(|v| {
            (
                h.median_equivalent(v.value_iterated_to()) as f64,
                v.count_at_value(),
            )
        })
        .collect();
    let s = Stats::of_counts(&counts, 1e3);
    Stats {
        n: Some(n),
        mean: sum_ms / n as f64,
        max: Some(max_ms),
        // A percentile from bucket midpoints never passes the true max.
        p50: s.p50.min(max_ms),
        p90: s.p90.min(max_ms),
        p95: s.p95.min(max_ms),
        p99: s.p99.min(max_ms),
    }
}

/// The samples of one per-request figure (ms): exact while there are at
/// most [`EXACT_SAMPLES`], then in a histogram.
#[derive(Debug, Clone, Default)]
pub struct Samples {
    exact: Vec<f64>,
    hist: Option<Histogram<u64>>,
    n: u64,
    sum: f64,
    max: f64,
}

impl Samples {
    /// Adds a sample, ms.
    pub fn push(&mut self, ms: f64) {
        self.n += 1;
        self.sum += ms;
        self.max = if self.n == 1 { ms } else { self.max.max(ms) };
        if self.hist.is_none() && self.exact.len() == EXACT_SAMPLES {
            let mut h = histogram();
            for &v in &self.exact {
                record(&mut h, us_of_ms(v), 1);
            }
            self.exact = Vec::new();
            self.hist = Some(h);
        }
        match &mut self.hist {
            Some(h) => record(h, us_of_ms(ms), 1),
            None => self.exact.push(ms),
        }
    }

    /// Whether every percentile is exact (no histogram yet).
    pub fn is_exact(&self) -> bool {
        self.hist.is_none()
    }

    /// Its [`Stats`]; `None` without samples.
    pub fn stats(mut self) -> Option<Stats> {
        if self.n == 0 {
            return None;
        }
        Some(match &self.hist {
            None => {
                self.exact.sort_by(f64::total_cmp);
                Stats::of_sorted(&self.exact)
            }
            Some(h) => stats_of_histogram(h, self.n, self.sum, self.max),
        })
    }
}

/// Inter-token latencies (µs) as value → count: exact while there are at
/// most [`EXACT_DISTINCT_ITL`] distinct values, then in a histogram.
#[derive(Debug, Clone, Default)]
pub struct CountedSamples {
    exact: BTreeMap<i64, u64>,
    hist: Option<Histogram<u64>>,
    n: u64,
    sum_us: i128,
    max_us: i64,
}

impl CountedSamples {
    /// Adds a sample, µs.
    pub fn push(&mut self, us: i64) {
        self.n += 1;
        self.sum_us += i128::from(us);
        self.max_us = if self.n == 1 { us } else { self.max_us.max(us) };
        if let Some(h) = &mut self.hist {
            record(h, us.max(0) as u64, 1);
            return;
        }
        *self.exact.entry(us).or_default() += 1;
        if self.exact.len() > EXACT_DISTINCT_ITL {
            let mut h = histogram();
            for (&v, &c) in &self.exact {
                record(&mut h, v.max(0) as u64, c);
            }
            self.exact = BTreeMap::new();
            self.hist = Some(h);
        }
    }

    /// Whether every percentile is exact (no histogram yet).
    pub fn is_exact(&self) -> bool {
        self.hist.is_none()
    }

    /// Its [`Stats`] in ms; `None` without samples.
    pub fn stats(&self) -> Option<Stats> {
        if self.n == 0 {
            return None;
        }
        Some(match &self.hist {
            None => {
                let sorted: Vec<(f64, u64)> = self
                    .exact
                    .iter()
                    .map(|(&k, &c)| (k as f64 / 1e3, c))
                    .collect();
                Stats::of_counts(&sorted, 1.0)
            }
            Some(h) => stats_of_histogram(
                h,
                self.n,
                self.sum_us as f64 / 1e3,
                self.max_us as f64 / 1e3,
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exact_stats(mut v: Vec<f64>) -> Stats {
        v.sort_by(f64::total_cmp);
        Stats::of_sorted(&v)
    }

    /// Below the bound the figures are exactly those of the sorted
    /// samples; past it the percentiles are within 0.1% (and the count,
    /// mean and max still exact), whatever the shape.
    #[test]
    fn percentiles_are_exact_then_within_a_thousandth() {
        let mut x: u64 = 7;
        let mut next = || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 11) as f64 / (1u64 << 53) as f64
        };
        for n in [1usize, 10, EXACT_SAMPLES, EXACT_SAMPLES + 1, 200_000] {
            // Log-uniform between 0.1 ms and 100 s, in whole µs.
            let v: Vec<f64> = (0..n)
                .map(|_| (10f64.powf(2.0 + 6.0 * next())).round() / 1e3)
                .collect();
            let mut s = Samples::default();
            for &x in &v {
                s.push(x);
            }
            assert_eq!(s.is_exact(), n <= EXACT_SAMPLES, "n = {n}");
            let got = s.stats().unwrap();
            let want = exact_stats(v);
            assert_eq!(got.n, want.n);
            assert_eq!(got.max, want.max);
            assert!((got.mean - want.mean).abs() <= 1e-9 * want.mean);
            for (g, w) in [
                (got.p50, want.p50),
                (got.p90, want.p90),
                (got.p95, want.p95),
                (got.p99, want.p99),
            ] {
                if n <= EXACT_SAMPLES {
                    assert_eq!(g, w, "n = {n}");
                } else {
                    assert!((g - w).abs() <= 1e-3 * w, "n = {n}: {g} vs {w}");
                }
            }
        }
        assert!(Samples::default().stats().is_none());
    }

    #[test]
    fn counted_samples_are_exact_then_within_a_thousandth() {
        let mut c = CountedSamples::default();
        let mut all = Vec::new();
        for i in 0..(EXACT_DISTINCT_ITL as i64 * 3) {
            let us = 1_000 + (i * 7919) % 90_000;
            c.push(us);
            all.push(us as f64 / 1e3);
            if i == 100 {
                assert!(c.is_exact());
                let w = exact_stats(all.clone());
                assert_eq!(c.stats().unwrap().p99, w.p99);
            }
        }
        assert!(!c.is_exact());
        let (g, w) = (c.stats().unwrap(), exact_stats(all));
        assert_eq!((g.n, g.max), (w.n, w.max));
        for (g, w) in [(g.p50, w.p50), (g.p99, w.p99)] {
            assert!((g - w).abs() <= 1e-3 * w, "{g} vs {w}");
        }
    }
}
