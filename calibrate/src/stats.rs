//! The statistics of a comparison, each written out so that its numbers
//! can be checked: percentiles (numpy's default linear interpolation),
//! Pearson's r, Spearman's ρ (average ranks for ties), the two-sample
//! Kolmogorov–Smirnov test, the Wasserstein-1 distance, QQ pairs, and the
//! per-request error measures (MAPE, MPE).
//!
//! The KS test is our own: statrs' hangs at D = 0. Its p-value is exact
//! (the lattice-path distribution of Hodges 1957, as `scipy.stats.ks_2samp`
//! computes with `method='exact'`) for equal sample sizes of any size and for
//! unequal sizes up to 10⁸ lattice cells, and otherwise the asymptotic
//! Kolmogorov distribution with Stephens' (1970) small-sample correction.
//! Checked against scipy in `tests/fixtures/ks_scipy.json`.

/// `percentile` of the traces crate, re-exported: linear interpolation
/// between closest ranks (type 7) on sorted data, `q` in `[0, 100]`.
pub use blis_traces::percentile;

/// Arithmetic mean; NaN for an empty slice.
pub fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.iter().sum::<f64>() / v.len() as f64
}

/// Sorts a copy, NaNs last.
pub fn sorted(v: &[f64]) -> Vec<f64> {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s
}

/// Pearson's correlation coefficient of paired samples; NaN when either
/// side is constant or there are fewer than 2 pairs. Two identical
/// samples give exactly 1.
pub fn pearson(x: &[f64], y: &[f64]) -> f64 {
    let n = x.len().min(y.len());
    if n < 2 {
        return f64::NAN;
    }
    let (mx, my) = (mean(&x[..n]), mean(&y[..n]));
    let (mut sxy, mut sxx, mut syy) = (0.0, 0.0, 0.0);
    for i in 0..n {
        let (dx, dy) = (x[i] - mx, y[i] - my);
        sxy += dx * dy;
        sxx += dx * dx;
        syy += dy * dy;
    }
    if sxx == 0.0 || syy == 0.0 {
        return f64::NAN;
    }
    if x[..n] == y[..n] {
        return 1.0;
    }
    (sxy / (sxx.sqrt() * syy.sqrt())).clamp(-1.0, 1.0)
}

/// Ranks 1..=n with ties given their average rank.
pub fn ranks(v: &[f64]) -> Vec<f64> {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by(|&a, &b| v[a].total_cmp(&v[b]));
    let mut r = vec![0.0; v.len()];
    let mut i = 0;
    while i < idx.len() {
        let mut j = i;
        while j + 1 < idx.len() && v[idx[j + 1]] == v[idx[i]] {
            j += 1;
        }
        let avg = (i + j) as f64 / 2.0 + 1.0;
        for &k in &idx[i..=j] {
            r[k] = avg;
        }
        i = j + 1;
    }
    r
}

/// Spearman's rank correlation ρ (Pearson's r of the average ranks).
pub fn spearman(x: &[f64], y: &[f64]) -> f64 {
    let n = x.len().min(y.len());
    pearson(&ranks(&x[..n]), &ranks(&y[..n]))
}

/// Mean absolute percentage error of `sim` against `real`, in percent,
/// over pairs with `real > 0`.
pub fn mape(real: &[f64], sim: &[f64]) -> f64 {
    let (mut s, mut n) = (0.0, 0usize);
    for (r, x) in real.iter().zip(sim) {
        if *r > 0.0 {
            s += ((x - r) / r).abs();
            n += 1;
        }
    }
    if n == 0 {
        f64::NAN
    } else {
        100.0 * s / n as f64
    }
}

/// Mean signed percentage error of `sim` against `real`, in percent
/// (positive: the simulator predicts slower than reality).
pub fn mpe(real: &[f64], sim: &[f64]) -> f64 {
    let (mut s, mut n) = (0.0, 0usize);
    for (r, x) in real.iter().zip(sim) {
        if *r > 0.0 {
            s += (x - r) / r;
            n += 1;
        }
    }
    if n == 0 {
        f64::NAN
    } else {
        100.0 * s / n as f64
    }
}

/// Result of a two-sample Kolmogorov–Smirnov test.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KsResult {
    /// sup |F₁ − F₂| over the pooled sample.
    pub d: f64,
    /// Two-sided p-value.
    pub p: f64,
    /// Whether `p` is exact (else asymptotic).
    pub exact: bool,
}

/// D of two sorted samples: the largest ECDF difference, evaluated after
/// all observations equal to each pooled value (ties handled as scipy's
/// `searchsorted(side='right')`).
pub fn ks_statistic(a: &[f64], b: &[f64]) -> f64 {
    let (n1, n2) = (a.len() as f64, b.len() as f64);
    let (mut i, mut j) = (0usize, 0usize);
    let mut d: f64 = 0.0;
    while i < a.len() || j < b.len() {
        let x = match (a.get(i), b.get(j)) {
            (Some(&x), Some(&y)) => x.min(y),
            (Some(&x), None) => x,
            (None, Some(&y)) => y,
            (None, None) => break,
        };
        while i < a.len() && a[i] <= x {
            i += 1;
        }
        while j < b.len() && b[j] <= x {
            j += 1;
        }
        d = d.max((i as f64 / n1 - j as f64 / n2).abs());
    }
    d
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// Lattice cells above which unequal sample sizes use the asymptotic
/// p-value.
const EXACT_CELLS: u64 = 100_000_000;

/// The two-sample Kolmogorov–Smirnov test (two-sided) of two samples (any
/// order; sorted here). Empty input gives D = 0, p = 1.
pub fn ks_2samp(a: &[f64], b: &[f64]) -> KsResult {
    let (a, b) = (sorted(a), sorted(b));
    ks_2samp_sorted(&a, &b)
}

/// [`ks_2samp`] of already sorted samples.
pub fn ks_2samp_sorted(a: &[f64], b: &[f64]) -> KsResult {
    if a.is_empty() || b.is_empty() {
        return KsResult {
            d: 0.0,
            p: 1.0,
            exact: true,
        };
    }
    let d = ks_statistic(a, b);
    let (n1, n2) = (a.len() as u64, b.len() as u64);
    let g = gcd(n1, n2);
    let lcm = (n1 / g) as f64 * n2 as f64;
    // D is a multiple of 1/lcm; recover the integer exactly.
    let h = (d * lcm).round() as u64;
    let d = h as f64 / lcm;
    if h == 0 {
        return KsResult {
            d: 0.0,
            p: 1.0,
            exact: true,
        };
    }
    if n1 == n2 {
        return KsResult {
            d,
            p: prob_outside_square(n1, h).clamp(0.0, 1.0),
            exact: true,
        };
    }
    if n1.saturating_mul(n2) <= EXACT_CELLS {
        let inside = prob_inside_band(n1, n2, g, h);
        return KsResult {
            d,
            p: (1.0 - inside).clamp(0.0, 1.0),
            exact: true,
        };
    }
    let en = (n1 as f64 * n2 as f64) / (n1 as f64 + n2 as f64);
    KsResult {
        d,
        p: kolmogorov_sf((en.sqrt() + 0.12 + 0.11 / en.sqrt()) * d),
        exact: false,
    }
}

/// P(D ≥ h/n) for two samples of size n: the share of lattice paths from
/// (0,0) to (n,n) that touch |x − y| ≥ h, by the alternating series
/// 2·Σ (−1)^(k−1) C(2n, n−kh)/C(2n, n), evaluated Horner-style (as scipy's
/// `_compute_prob_outside_square`).
fn prob_outside_square(n: u64, h: u64) -> f64 {
    let mut p = 0.0;
    let mut k = n / h;
    loop {
        let mut p1 = 1.0;
        for j in 0..h {
            let num = n as f64 - (k * h + j) as f64;
            p1 = num * p1 / (n + k * h + j + 1) as f64;
        }
        p = p1 * (1.0 - p);
        if k == 0 {
            break;
        }
        k -= 1;
    }
    2.0 * p
}

/// The share of lattice paths from (0,0) to (n1,n2) that stay strictly
/// inside |i·n2 − j·n1| < h·g, i.e. with every ECDF difference below D.
/// `Q(i,j) = (i·Q(i−1,j) + j·Q(i,j−1)) / (i+j)` is the count of such paths
/// to (i,j) over C(i+j, i), which keeps every value in [0, 1].
fn prob_inside_band(n1: u64, n2: u64, g: u64, h: u64) -> f64 {
    let limit = (h * g) as i128; // |i*n2 - j*n1| < limit
    let (n1i, n2i) = (n1 as i128, n2 as i128);
    // Column over j for the current i; band [lo, hi].
    let band = |i: i128| -> (i64, i64) {
        // j*n1 > i*n2 - limit  and  j*n1 < i*n2 + limit
        let lo_num = i * n2i - limit; // j > lo_num / n1
        let lo = if lo_num < 0 {
            0
        } else {
            (lo_num / n1i + 1) as i64
        };
        let hi_num = i * n2i + limit; // j < hi_num / n1
        let hi = ((hi_num - 1) / n1i).min(n2i) as i64;
        (lo, hi)
    };
    let (lo0, hi0) = band(0);
    let mut prev_lo = lo0;
    // Column i = 0: Q(0, j) = 1 while inside (only j steps).
    // Column i = 0: Q(0, j) = 1 along the band (only j steps).
    let mut prev: Vec<f64> = vec![1.0; (hi0 - lo0 + 1).max(0) as usize];
    for i in 1..=n1i {
        let (lo, hi) = band(i);
        if lo > hi {
            return 0.0;
        }
        let mut col = Vec::with_capacity((hi - lo + 1) as usize);
        let mut below = 0.0; // Q(i, j-1)
        for j in lo..=hi {
            let left = if j >= prev_lo && j < prev_lo + prev.len() as i64 {
                prev[(j - prev_lo) as usize]
            } else {
                0.0
            };
            let down = if j > lo { below } else { 0.0 };
            let q = if i as i64 + j == 0 {
                1.0
            } else {
                (i as f64 * left + j as f64 * down) / (i as f64 + j as f64)
            };
            col.push(q);
            below = q;
        }
        prev = col;
        prev_lo = lo;
    }
    let j = n2 as i64;
    if j >= prev_lo && j < prev_lo + prev.len() as i64 {
        prev[(j - prev_lo) as usize]
    } else {
        0.0
    }
}

/// The survival function of the Kolmogorov distribution,
/// Q(λ) = 2 Σ_{k≥1} (−1)^(k−1) e^(−2k²λ²).
pub fn kolmogorov_sf(lambda: f64) -> f64 {
    if lambda <= 0.0 {
        return 1.0;
    }
    if lambda < 0.2 {
        return 1.0;
    }
    let mut sum = 0.0;
    let mut sign = 1.0;
    for k in 1..=100 {
        let k = f64::from(k);
        let term = (-2.0 * k * k * lambda * lambda).exp();
        sum += sign * term;
        if term < 1e-17 {
            break;
        }
        sign = -sign;
    }
    (2.0 * sum).clamp(0.0, 1.0)
}

/// The Wasserstein-1 (earth mover's) distance between the empirical
/// distributions of two sorted samples: ∫ |F₁ − F₂| dx (as
/// `scipy.stats.wasserstein_distance`).
pub fn wasserstein_sorted(a: &[f64], b: &[f64]) -> f64 {
    if a.is_empty() || b.is_empty() {
        return f64::NAN;
    }
    let (n1, n2) = (a.len() as f64, b.len() as f64);
    let (mut i, mut j) = (0usize, 0usize);
    let mut w = 0.0;
    let mut x_prev: Option<f64> = None;
    loop {
        let x = match (a.get(i), b.get(j)) {
            (Some(&x), Some(&y)) => x.min(y),
            (Some(&x), None) => x,
            (None, Some(&y)) => y,
            (None, None) => break,
        };
        if let Some(xp) = x_prev {
            w += (i as f64 / n1 - j as f64 / n2).abs() * (x - xp);
        }
        while i < a.len() && a[i] <= x {
            i += 1;
        }
        while j < b.len() && b[j] <= x {
            j += 1;
        }
        x_prev = Some(x);
    }
    w
}

/// [`wasserstein_sorted`] of unsorted samples.
pub fn wasserstein(a: &[f64], b: &[f64]) -> f64 {
    wasserstein_sorted(&sorted(a), &sorted(b))
}

/// `n` QQ pairs of two sorted samples: the quantiles at
/// `(k + 0.5) / n`, k = 0..n.
pub fn qq_sorted(a: &[f64], b: &[f64], n: usize) -> Vec<[f64; 2]> {
    if a.is_empty() || b.is_empty() {
        return Vec::new();
    }
    (0..n)
        .map(|k| {
            let q = 100.0 * (k as f64 + 0.5) / n as f64;
            [percentile(a, q), percentile(b, q)]
        })
        .collect()
}

/// The quality grade of a metric's prediction from its per-request MAPE
/// (%) and Pearson r: excellent (< 10%, > 0.95), good (< 20%, > 0.85),
/// fair (< 35%, > 0.70), else poor.
pub fn grade(mape: f64, r: f64) -> &'static str {
    // A constant pair of sides (r undefined) is judged by MAPE alone.
    let r = if r.is_nan() && mape == 0.0 { 1.0 } else { r };
    if mape < 10.0 && r > 0.95 {
        "excellent"
    } else if mape < 20.0 && r > 0.85 {
        "good"
    } else if mape < 35.0 && r > 0.70 {
        "fair"
    } else {
        "poor"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ks_of_identical_samples_is_zero_with_p_one() {
        let a = [3.0, 1.0, 2.0, 2.0];
        let r = ks_2samp(&a, &a);
        assert_eq!((r.d, r.p), (0.0, 1.0));
    }

    #[test]
    fn ks_of_disjoint_samples_is_one() {
        let r = ks_2samp(&[1.0, 2.0, 3.0], &[4.0, 5.0, 6.0]);
        assert_eq!(r.d, 1.0);
        // 2 / C(6,3) = 0.1
        assert!((r.p - 0.1).abs() < 1e-12, "{}", r.p);
        let r = ks_2samp(&[1.0, 2.0], &[4.0, 5.0, 6.0]);
        // 2 / C(5,2) = 0.2
        assert!((r.p - 0.2).abs() < 1e-12, "{}", r.p);
    }

    #[test]
    fn ranks_average_ties() {
        assert_eq!(ranks(&[10.0, 20.0, 10.0, 30.0]), vec![1.5, 3.0, 1.5, 4.0]);
        assert!((spearman(&[1.0, 2.0, 3.0], &[10.0, 20.0, 30.0]) - 1.0).abs() < 1e-12);
    }

    #[test]
    fn wasserstein_by_hand() {
        // Shift by 1: distance 1.
        assert!((wasserstein(&[0.0, 1.0, 2.0], &[1.0, 2.0, 3.0]) - 1.0).abs() < 1e-12);
        assert_eq!(wasserstein(&[5.0, 5.0], &[5.0]), 0.0);
    }

    #[test]
    fn errors_and_grades() {
        let real = [100.0, 200.0];
        let sim = [110.0, 180.0];
        assert!((mape(&real, &sim) - 10.0).abs() < 1e-12);
        assert!((mpe(&real, &sim) - 0.0).abs() < 1e-12);
        assert_eq!(grade(5.0, 0.99), "excellent");
        assert_eq!(grade(15.0, 0.99), "good");
        assert_eq!(grade(15.0, 0.5), "poor");
        assert_eq!(grade(0.0, f64::NAN), "excellent");
    }
}
