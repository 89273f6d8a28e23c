//! A one-screen summary of a workload: request count, span, rate, and token
//! percentiles per client.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::record::Request;

/// Linear-interpolation percentile of sorted data (numpy's default, "type
/// 7"): `q` in [0, 100]. NaN for empty input.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    percentile_at(sorted.len(), q, |i| sorted[i])
}

/// [`percentile`] of `n` ascending values given by rank: `at(i)` is the
/// value of rank `i` (it is asked for the one or two ranks `q` reads).
fn percentile_at(n: usize, q: f64, at: impl Fn(usize) -> f64) -> f64 {
    match n {
        0 => f64::NAN,
        1 => at(0),
        n => {
            let h = (n - 1) as f64 * (q / 100.0).clamp(0.0, 1.0);
            let lo = h.floor() as usize;
            let hi = (lo + 1).min(n - 1);
            at(lo) + (h - lo as f64) * (at(hi) - at(lo))
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

/// Mean and percentiles of a latency (or any sample), in the unit its
/// constructor says: the one latency-summary type of every report
/// (`blis-replay`'s summary, `blis-loadgen`'s run summary, `blis-calibrate`'s
/// comparison). Percentiles are [`percentile`]'s (numpy's default). `n` and
/// `max` are written only where a report shows them.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct LatencyStats {
    /// Samples.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub n: Option<u64>,
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest sample.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max: Option<f64>,
}

/// The exact sum of `v` when every sample is a whole number (not −0) and
/// the sum of their magnitudes is at most 2^53, so that adding them in
/// any order, in `f64`, gives this sum exactly; `None` otherwise.
fn exact_integer_sum(v: &[f64]) -> Option<i128> {
    const LIMIT: u128 = 1 << 53;
    let mut sum = 0i128;
    let mut magnitude = 0u128;
    for &x in v {
        if x.fract() != 0.0
            || !x.is_finite()
            || x.abs() > LIMIT as f64
            || x.to_bits() == (-0.0f64).to_bits()
        {
            return None;
        }
        let i = x as i64;
        sum += i128::from(i);
        magnitude += u128::from(i.unsigned_abs());
        if magnitude > LIMIT {
            return None;
        }
    }
    Some(sum)
}

impl LatencyStats {
    /// Of ascending samples, in their unit (NaN figures when empty).
    pub fn of_sorted(v: &[f64]) -> Self {
        let mean = if v.is_empty() {
            f64::NAN
        } else {
            v.iter().sum::<f64>() / v.len() as f64
        };
        Self {
            n: Some(v.len() as u64),
            mean,
            p50: percentile(v, 50.0),
            p90: percentile(v, 90.0),
            p95: percentile(v, 95.0),
            p99: percentile(v, 99.0),
            max: v.last().copied(),
        }
    }

    /// Of samples in µs, reported in ms: [`LatencyStats::of_sorted`] of
    /// the sorted samples, each figure divided by 1000, bit for bit; found
    /// without sorting where the samples are whole numbers of µs (the
    /// simulator's latencies): the percentiles' order statistics by
    /// selection, O(n), and the mean from the exact integer sum, which is
    /// the sum in ascending order as long as every partial sum is a whole
    /// number below 2^53. Anything else (fractions, NaN, −0, larger sums)
    /// is sorted.
    pub fn of_us_in_ms(mut us: Vec<f64>) -> Self {
        if let Some(sum) = exact_integer_sum(&us) {
            return Self::of_integers_in_ms(us, sum);
        }
        // (Unstable is exact: under `total_cmp` equal means the same bits.)
        us.sort_unstable_by(f64::total_cmp);
        Self::of_sorted(&us).in_ms()
    }

    /// [`LatencyStats::of_us_in_ms`] of whole-number samples whose exact
    /// sum is `sum`: each percentile's two order statistics by selection
    /// under `total_cmp` (the values a sort puts at those ranks, bit for
    /// bit: `total_cmp` orders bit patterns, so equal samples are equal
    /// bits), ranks ascending, each selected within the samples above the
    /// last.
    fn of_integers_in_ms(mut us: Vec<f64>, sum: i128) -> Self {
        const QS: [f64; 4] = [50.0, 90.0, 95.0, 99.0];
        let n = us.len();
        if n == 0 {
            return Self::of_sorted(&[]).in_ms();
        }
        let max = us.iter().copied().max_by(f64::total_cmp);
        // The ranks the percentiles read, as `percentile_at` asks for them.
        let asked = std::cell::RefCell::new(Vec::with_capacity(12));
        for q in QS {
            percentile_at(n, q, |i| {
                asked.borrow_mut().push(i);
                0.0
            });
        }
        let mut ranks = asked.into_inner();
        ranks.sort_unstable();
        ranks.dedup();
        let mut at = [0.0f64; 8];
        let mut from = 0;
        for (slot, &r) in at.iter_mut().zip(&ranks) {
            let (_, v, _) = us[from..].select_nth_unstable_by(r - from, f64::total_cmp);
            *slot = *v;
            from = r + 1;
        }
        let value = |r: usize| at[ranks.binary_search(&r).expect("a rank selected")];
        let p = |q: f64| percentile_at(n, q, value) / 1000.0;
        Self {
            n: Some(n as u64),
            mean: sum as f64 / n as f64 / 1000.0,
            p50: p(QS[0]),
            p90: p(QS[1]),
            p95: p(QS[2]),
            p99: p(QS[3]),
            max: max.map(|m| m / 1000.0),
        }
    }

    /// Every figure divided by 1000 (µs to ms).
    fn in_ms(self) -> Self {
        Self {
            mean: self.mean / 1000.0,
            p50: self.p50 / 1000.0,
            p90: self.p90 / 1000.0,
            p95: self.p95 / 1000.0,
            p99: self.p99 / 1000.0,
            max: self.max.map(|m| m / 1000.0),
            ..self
        }
    }

    /// Of a multiset given as ascending `(value, count)` pairs, each figure
    /// divided by `divisor` (1000 for µs reported in ms; 1 for none), the
    /// arithmetic done in the unit of the values.
    pub fn of_counts(sorted: &[(f64, u64)], divisor: f64) -> Self {
        let n: u64 = sorted.iter().map(|(_, c)| c).sum();
        let sum: f64 = sorted.iter().map(|(x, c)| x * *c as f64).sum();
        let p = |q| percentile_of_counts(sorted, q) / divisor;
        Self {
            n: Some(n),
            mean: if n == 0 {
                f64::NAN
            } else {
                sum / n as f64 / divisor
            },
            p50: p(50.0),
            p90: p(90.0),
            p95: p(95.0),
            p99: p(99.0),
            max: sorted.last().map(|(v, _)| v / divisor),
        }
    }

    /// Without the sample count (a report that shows it elsewhere).
    pub fn without_count(self) -> Self {
        Self { n: None, ..self }
    }

    /// Without the largest sample.
    pub fn without_max(self) -> Self {
        Self { max: None, ..self }
    }

    /// The figure named `mean`, `p50`, `p90`, `p95` or `p99` (else p99).
    pub fn get(&self, name: &str) -> f64 {
        match name {
            "mean" => self.mean,
            "p50" => self.p50,
            "p90" => self.p90,
            "p95" => self.p95,
            _ => self.p99,
        }
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
        // (Unstable is exact: under `total_cmp` equal means the same bits.)
        v.sort_unstable_by(f64::total_cmp);
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

/// [`WorkloadSummary::of`] one request at a time, for requests that are
/// generated rather than held: 16 bytes per request (its two lengths).
#[derive(Debug, Clone, Default)]
pub struct WorkloadTally {
    requests: u64,
    arrivals: Option<(i64, i64)>,
    input_tokens_total: u64,
    output_tokens_total: u64,
    /// Per client: its requests' input and output lengths.
    per: BTreeMap<String, (Vec<f64>, Vec<f64>)>,
}

impl WorkloadTally {
    /// Counts `r`.
    pub fn add(&mut self, r: &Request) {
        self.requests += 1;
        let t = r.arrival_time_us;
        self.arrivals = Some(self.arrivals.map_or((t, t), |(a, b)| (a.min(t), b.max(t))));
        self.input_tokens_total += u64::from(r.input_tokens);
        self.output_tokens_total += u64::from(r.output_tokens);
        let id: &str = r.client_id.as_ref();
        let lengths = (f64::from(r.input_tokens), f64::from(r.output_tokens));
        match self.per.get_mut(id) {
            Some(e) => {
                e.0.push(lengths.0);
                e.1.push(lengths.1);
            }
            None => {
                self.per
                    .insert(id.to_string(), (vec![lengths.0], vec![lengths.1]));
            }
        }
    }

    /// The summary of the requests counted.
    pub fn summary(self) -> WorkloadSummary {
        let (first_arrival_us, last_arrival_us) = self.arrivals.unwrap_or((0, 0));
        WorkloadSummary {
            requests: self.requests,
            first_arrival_us,
            last_arrival_us,
            input_tokens_total: self.input_tokens_total,
            output_tokens_total: self.output_tokens_total,
            clients: self
                .per
                .into_iter()
                .map(|(id, (i, o))| ClientSummary {
                    client_id: id,
                    requests: i.len() as u64,
                    input: TokenStats::of(i),
                    output: TokenStats::of(o),
                })
                .collect(),
        }
    }
}

impl WorkloadSummary {
    /// Summarises `requests`.
    pub fn of<'a>(requests: impl IntoIterator<Item = &'a Request>) -> Self {
        let mut t = WorkloadTally::default();
        for r in requests {
            t.add(r);
        }
        t.summary()
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
        let when = if self.requests >= 2 && self.duration_s() == 0.0 {
            "all at once".to_string()
        } else {
            format!("over {:.1} s ({:.2} req/s)", self.duration_s(), self.rate())
        };
        let _ = writeln!(
            out,
            "{} requests {when}; input tokens {}, output tokens {}\n",
            self.requests, self.input_tokens_total, self.output_tokens_total
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

#[cfg(test)]
mod latency_stats_tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn one_type_serves_every_report_shape() {
        let v = [1.0, 2.0, 3.0, 4.0];
        let full = LatencyStats::of_sorted(&v);
        assert_eq!(full.n, Some(4));
        assert_eq!(full.mean, 2.5);
        assert_eq!(full.p50, 2.5);
        assert_eq!(full.max, Some(4.0));
        let json = |s: &LatencyStats| serde_json::to_string(s).unwrap();
        assert!(
            json(&full).starts_with("{\"n\":4,\"mean\":2.5,")
                && json(&full).ends_with(",\"max\":4.0}")
        );
        let bare = full.without_count().without_max();
        assert!(!json(&bare).contains("\"n\"") && !json(&bare).contains("max"));
        // µs samples reported in ms, from values or from counts: the same.
        let us = LatencyStats::of_us_in_ms(vec![4000.0, 1000.0, 3000.0, 2000.0]);
        let counted = LatencyStats::of_counts(
            &[(1000.0, 1), (2000.0, 1), (3000.0, 1), (4000.0, 1)],
            1000.0,
        );
        assert_eq!(us, counted);
        assert_eq!(us.p99, 3.97);
        let empty = LatencyStats::of_sorted(&[]);
        assert_eq!(empty.n, Some(0));
        assert!(empty.mean.is_nan() && empty.max.is_none());
    }

    /// The figures of a full sort, as `of_us_in_ms` made them before
    /// selection: the reference its fast path must equal bit for bit.
    fn sorted_in_ms(mut us: Vec<f64>) -> LatencyStats {
        us.sort_by(f64::total_cmp);
        let n = us.len();
        let mean = if n == 0 {
            f64::NAN
        } else {
            us.iter().sum::<f64>() / n as f64
        };
        let p = |q| percentile(&us, q) / 1000.0;
        LatencyStats {
            n: Some(n as u64),
            mean: mean / 1000.0,
            p50: p(50.0),
            p90: p(90.0),
            p95: p(95.0),
            p99: p(99.0),
            max: us.last().map(|m| m / 1000.0),
        }
    }

    fn bits(s: &LatencyStats) -> [u64; 7] {
        [
            s.n.unwrap_or(u64::MAX),
            s.mean.to_bits(),
            s.p50.to_bits(),
            s.p90.to_bits(),
            s.p95.to_bits(),
            s.p99.to_bits(),
            s.max.map_or(u64::MAX, f64::to_bits),
        ]
    }

    /// A sample: mostly whole µs (many repeats, latencies of a few ms to
    /// minutes), sometimes one that sends the whole set down the sorting
    /// path (a fraction, NaN, −0, a huge value).
    fn sample() -> impl Strategy<Value = f64> {
        prop_oneof![
            20 => (0u64..50).prop_map(|v| v as f64),
            20 => (0u64..200_000_000).prop_map(|v| v as f64),
            2 => (-1000i64..1000).prop_map(|v| v as f64),
            1 => 0.0f64..1e6,
            1 => Just(f64::NAN),
            1 => Just(-0.0),
            1 => Just(9.0e15),
            1 => Just(f64::INFINITY),
        ]
    }

    proptest! {
        /// Whole-number samples take the selection path, anything else the
        /// sort; either way every figure is the full sort's, bit for bit.
        #[test]
        fn selection_gives_the_sorts_figures(us in proptest::collection::vec(sample(), 0..400)) {
            let fast = LatencyStats::of_us_in_ms(us.clone());
            let reference = sorted_in_ms(us);
            prop_assert_eq!(bits(&fast), bits(&reference));
        }

        /// The same for sets of whole numbers only (the selection path),
        /// down to one sample and up to sums near 2^53.
        #[test]
        fn selection_of_whole_numbers(
            us in proptest::collection::vec(prop_oneof![
                (0u64..1000).prop_map(|v| v as f64),
                (0u64..(1 << 50)).prop_map(|v| v as f64),
            ], 0..64)
        ) {
            prop_assert_eq!(bits(&LatencyStats::of_us_in_ms(us.clone())), bits(&sorted_in_ms(us)));
        }
    }

    #[test]
    fn the_exact_sum_is_taken_only_where_any_order_gives_it() {
        assert_eq!(exact_integer_sum(&[]), Some(0));
        assert_eq!(exact_integer_sum(&[1.0, -3.0, 5.0]), Some(3));
        assert_eq!(exact_integer_sum(&[0.5]), None);
        assert_eq!(exact_integer_sum(&[-0.0]), None);
        assert_eq!(exact_integer_sum(&[f64::NAN]), None);
        assert_eq!(exact_integer_sum(&[4.0e15, 4.0e15, 4.0e15]), None);
        assert_eq!(
            exact_integer_sum(&[4.0e15, 4.0e15]),
            Some(8_000_000_000_000_000)
        );
    }
}
