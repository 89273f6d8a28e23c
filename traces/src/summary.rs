//! A one-screen summary of a workload: request count, span, rate, and token
//! percentiles per client.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::record::Request;

/// Linear-interpolation percentile of sorted data (numpy's default, "type
/// 7"): `q` in [0, 100]. NaN for empty input.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    match sorted.len() {
        0 => f64::NAN,
        1 => sorted[0],
        n => {
            let h = (n - 1) as f64 * (q / 100.0).clamp(0.0, 1.0);
            let lo = h.floor() as usize;
            let hi = (lo + 1).min(n - 1);
            sorted[lo] + (h - lo as f64) * (sorted[hi] - sorted[lo])
        }
    }
}

/// [`percentile`] of the multiset given as ascending `(value, count)`
/// pairs, without expanding it. NaN when empty.
pub fn percentile_of_counts(sorted: &[(f64, u64)], q: f64) -> f64 {
    let n: u64 = sorted.iter().map(|(_, c)| c).sum();
    if n == 0 {
        return f64::NAN;
    }
    let h = (n - 1) as f64 * (q / 100.0).clamp(0.0, 1.0);
    let lo = h.floor() as u64;
    let frac = h - lo as f64;
    let at = |rank: u64| -> f64 {
        let mut seen = 0u64;
        for (v, c) in sorted {
            seen += c;
            if rank < seen {
                return *v;
            }
        }
        sorted.last().map_or(f64::NAN, |(v, _)| *v)
    };
    let a = at(lo);
    if frac == 0.0 {
        a
    } else {
        a + frac * (at((lo + 1).min(n - 1)) - a)
    }
}

/// Token-count statistics of a group of requests.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenStats {
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Maximum.
    pub max: f64,
}

impl TokenStats {
    fn of(mut v: Vec<f64>) -> Self {
        v.sort_by(f64::total_cmp);
        let mean = if v.is_empty() {
            f64::NAN
        } else {
            v.iter().sum::<f64>() / v.len() as f64
        };
        Self {
            mean,
            p50: percentile(&v, 50.0),
            p90: percentile(&v, 90.0),
            p99: percentile(&v, 99.0),
            max: v.last().copied().unwrap_or(f64::NAN),
        }
    }
}

/// Per-client part of a [`WorkloadSummary`].
#[derive(Debug, Clone, PartialEq)]
pub struct ClientSummary {
    /// Client id.
    pub client_id: String,
    /// Requests.
    pub requests: u64,
    /// Input tokens.
    pub input: TokenStats,
    /// Output tokens.
    pub output: TokenStats,
}

/// Summary of a set of requests.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadSummary {
    /// Requests.
    pub requests: u64,
    /// First arrival, µs.
    pub first_arrival_us: i64,
    /// Last arrival, µs.
    pub last_arrival_us: i64,
    /// Input tokens, all requests.
    pub input_tokens_total: u64,
    /// Output tokens, all requests.
    pub output_tokens_total: u64,
    /// Per client, by client id.
    pub clients: Vec<ClientSummary>,
}

impl WorkloadSummary {
    /// Summarises `requests`.
    pub fn of<'a>(requests: impl IntoIterator<Item = &'a Request>) -> Self {
        let mut per: BTreeMap<&str, (Vec<f64>, Vec<f64>)> = BTreeMap::new();
        let mut s = Self {
            requests: 0,
            first_arrival_us: i64::MAX,
            last_arrival_us: i64::MIN,
            input_tokens_total: 0,
            output_tokens_total: 0,
            clients: Vec::new(),
        };
        for r in requests {
            s.requests += 1;
            s.first_arrival_us = s.first_arrival_us.min(r.arrival_time_us);
            s.last_arrival_us = s.last_arrival_us.max(r.arrival_time_us);
            s.input_tokens_total += u64::from(r.input_tokens);
            s.output_tokens_total += u64::from(r.output_tokens);
            let e = per.entry(&r.client_id).or_default();
            e.0.push(f64::from(r.input_tokens));
            e.1.push(f64::from(r.output_tokens));
        }
        if s.requests == 0 {
            s.first_arrival_us = 0;
            s.last_arrival_us = 0;
        }
        s.clients = per
            .into_iter()
            .map(|(id, (i, o))| ClientSummary {
                client_id: id.to_string(),
                requests: i.len() as u64,
                input: TokenStats::of(i),
                output: TokenStats::of(o),
            })
            .collect();
        s
    }

    /// Span from first to last arrival, seconds.
    pub fn duration_s(&self) -> f64 {
        (self.last_arrival_us - self.first_arrival_us) as f64 / 1e6
    }

    /// Mean arrival rate over the span, requests/s.
    pub fn rate(&self) -> f64 {
        let d = self.duration_s();
        if d > 0.0 {
            (self.requests.saturating_sub(1)) as f64 / d
        } else {
            0.0
        }
    }

    /// Markdown rendering (fits one screen for up to ~20 clients).
    pub fn to_markdown(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{} requests over {:.1} s ({:.2} req/s); input tokens {}, output tokens {}\n",
            self.requests,
            self.duration_s(),
            self.rate(),
            self.input_tokens_total,
            self.output_tokens_total
        );
        let _ = writeln!(
            out,
            "| client | requests | share | input p50 | input p90 | input p99 | output p50 | output p90 | output p99 |"
        );
        let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|---:|");
        for c in &self.clients {
            let _ = writeln!(
                out,
                "| {} | {} | {:.1}% | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} |",
                if c.client_id.is_empty() {
                    "(none)"
                } else {
                    &c.client_id
                },
                c.requests,
                100.0 * c.requests as f64 / self.requests.max(1) as f64,
                c.input.p50,
                c.input.p90,
                c.input.p99,
                c.output.p50,
                c.output.p90,
                c.output.p99
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_matches_numpy_linear() {
        let v = [1.0, 2.0, 3.0, 4.0];
        // numpy.percentile([1,2,3,4], [0, 25, 50, 90, 100]) = 1, 1.75, 2.5, 3.7, 4
        assert_eq!(percentile(&v, 0.0), 1.0);
        assert!((percentile(&v, 25.0) - 1.75).abs() < 1e-12);
        assert!((percentile(&v, 50.0) - 2.5).abs() < 1e-12);
        assert!((percentile(&v, 90.0) - 3.7).abs() < 1e-12);
        assert_eq!(percentile(&v, 100.0), 4.0);
        assert!(percentile(&[], 50.0).is_nan());
    }

    #[test]
    fn counted_percentiles_equal_expanded_ones() {
        let counts = [(1.0, 3u64), (2.0, 1), (5.0, 4)];
        let expanded: Vec<f64> = counts
            .iter()
            .flat_map(|(v, c)| std::iter::repeat_n(*v, *c as usize))
            .collect();
        for q in [0.0, 10.0, 25.0, 50.0, 62.5, 90.0, 99.0, 100.0] {
            assert_eq!(
                percentile_of_counts(&counts, q),
                percentile(&expanded, q),
                "q {q}"
            );
        }
        assert!(percentile_of_counts(&[], 50.0).is_nan());
    }
}
