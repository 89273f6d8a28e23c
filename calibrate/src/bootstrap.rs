//! Bootstrap confidence intervals for a paired comparison: 95% percentile
//! intervals of MAPE, Pearson's r and each percentile's error (sim − real),
//! from seeded resamples of the request pairs.
//!
//! Each resample is a **Poisson bootstrap**: every pair enters it an
//! independent Poisson(1) number of times — the large-sample form of drawing
//! n pairs with replacement (Hanley & MacGibbon 2006; Chamandy et al. 2012),
//! which lets a resample be one sequential pass over the pairs instead of n
//! random draws. A resample's percentiles come from its weighted sample with
//! numpy's linear interpolation. To avoid sorting per resample, the pairs are
//! sorted once; only the pairs whose rank lies in a band of ±8√n around
//! each percentile's position keep individual weights, the others are
//! summed by segment. A resample whose percentile falls outside its band
//! (about one in 10¹⁴) is recomputed exactly from its seed.
//!
//! Resample `k` draws its weights from a xoshiro256++ generator seeded by
//! ChaCha8 stream `k` of the seed, so results do not depend on how many
//! threads compute them. Resamples are computed 16 at a time over blocks of
//! 2048 pairs, so the pairs are read from memory once per 16 resamples.

use rand::rngs::ChaCha8Rng;
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

use crate::stats::percentile;

/// A 95% interval `[lo, hi]`.
pub type Interval = [f64; 2];

/// Bootstrap intervals of one paired metric.
#[derive(Debug, Clone, PartialEq)]
pub struct Cis {
    /// MAPE, percent.
    pub mape: Option<Interval>,
    /// Pearson's r.
    pub pearson_r: Option<Interval>,
    /// Per requested quantile `q` (percent): the signed error (sim − real)
    /// and the relative error ((sim − real) / real).
    pub percentile_error: Vec<(f64, Option<Interval>, Option<Interval>)>,
}

impl Cis {
    fn none(quantiles: &[f64]) -> Self {
        Self {
            mape: None,
            pearson_r: None,
            percentile_error: quantiles.iter().map(|q| (*q, None, None)).collect(),
        }
    }
}

/// One metric's pairs: `real[j]` and `sim[j]` belong to request pair
/// `pair[j]` (ascending) of the comparison's pairs. Metrics of the same
/// comparison share each resample's weights, as one resample of requests.
#[derive(Debug, Clone, Copy)]
pub struct Paired<'a> {
    /// Real values.
    pub real: &'a [f64],
    /// Simulated values.
    pub sim: &'a [f64],
    /// Index of each value's request pair, ascending.
    pub pair: &'a [u32],
}

const BLOCK: usize = 2048;
/// Resamples computed together (one SIMD-friendly lane each).
const L: usize = 8;
const MAX_Q: usize = 8;
const BAND: u32 = 0x8000_0000;

/// Poisson(1) sampling from a u32 by inverse CDF: a table on the top 8
/// bits decides all but the 12 buckets that hold a CDF threshold, which
/// compare against the thresholds.
#[derive(Debug)]
struct Poisson {
    thresholds: [u32; 12],
    table: [u8; 256],
}

impl Poisson {
    fn new() -> Self {
        let mut t = [0u32; 12];
        let mut p = (-1.0f64).exp();
        let mut cdf = 0.0;
        for (k, slot) in t.iter_mut().enumerate() {
            cdf += p;
            *slot = (cdf * 4_294_967_296.0).min(4_294_967_295.0) as u32;
            p /= (k + 1) as f64;
        }
        let exact = |u: u32| t.iter().filter(|th| u >= **th).count() as u8;
        let mut table = [0u8; 256];
        for (b, e) in table.iter_mut().enumerate() {
            let (lo, hi) = ((b as u32) << 24, ((b as u32) << 24) | 0x00FF_FFFF);
            let (a, z) = (exact(lo), exact(hi));
            *e = if a == z { a } else { 0xFF };
        }
        Self {
            thresholds: t,
            table,
        }
    }

    #[inline]
    fn draw(&self, u: u32) -> u8 {
        let w = self.table[(u >> 24) as usize];
        if w != 0xFF {
            return w;
        }
        self.thresholds.iter().filter(|th| u >= **th).count() as u8
    }

    /// The next `n` weights of `rng` (two per u64), written by `put(i, w)`.
    #[inline]
    fn fill(&self, rng: &mut Xoshiro256PlusPlus, n: usize, mut put: impl FnMut(usize, u8)) {
        let mut i = 0;
        while i < n {
            let u = rng.next_u64();
            put(i, self.draw(u as u32));
            if i + 1 < n {
                put(i + 1, self.draw((u >> 32) as u32));
            }
            i += 2;
        }
    }
}

fn generator(seed: u64, k: u64) -> Xoshiro256PlusPlus {
    let mut c = ChaCha8Rng::seed_from_u64(seed);
    c.set_stream(k);
    Xoshiro256PlusPlus::seed_from_u64(c.next_u64())
}

/// Where each percentile's band lies in the sorted order of one side.
#[derive(Debug, Clone)]
struct Bands {
    /// Merged bands `[lo, hi]` of ranks, in order.
    ranges: Vec<(usize, usize)>,
    /// First slot of each band.
    base: Vec<usize>,
    /// Sorted values.
    values: Vec<f64>,
}

impl Bands {
    /// The bands of `v`, and each value's code: its gap index, or
    /// `BAND | slot`.
    fn new(v: &[f64], quantiles: &[f64]) -> (Self, Vec<u32>) {
        let n = v.len();
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&a, &b| v[a].total_cmp(&v[b]));
        let values: Vec<f64> = order.iter().map(|&i| v[i]).collect();
        let m = (8.0 * (n as f64).sqrt()).ceil() as usize + 16;
        let mut ranges: Vec<(usize, usize)> = quantiles
            .iter()
            .map(|q| {
                let pos = ((n - 1) as f64 * (q / 100.0).clamp(0.0, 1.0)) as usize;
                (pos.saturating_sub(m), (pos + m + 1).min(n - 1))
            })
            .collect();
        ranges.sort_unstable();
        let mut merged: Vec<(usize, usize)> = Vec::new();
        for r in ranges {
            match merged.last_mut() {
                Some(last) if r.0 <= last.1 + 1 => last.1 = last.1.max(r.1),
                _ => merged.push(r),
            }
        }
        let mut base = Vec::with_capacity(merged.len());
        let mut next_slot = 0usize;
        for &(lo, hi) in &merged {
            base.push(next_slot);
            next_slot += hi - lo + 1;
        }
        let mut code = vec![0u32; n];
        let mut b = 0usize;
        for (rank, &i) in order.iter().enumerate() {
            while b < merged.len() && rank > merged[b].1 {
                b += 1;
            }
            code[i] = if b < merged.len() && rank >= merged[b].0 {
                BAND | (base[b] + rank - merged[b].0) as u32
            } else {
                b as u32
            };
        }
        (
            Self {
                ranges: merged,
                base,
                values,
            },
            code,
        )
    }

    fn gaps(&self) -> usize {
        self.ranges.len() + 1
    }

    fn slots(&self) -> usize {
        self.ranges.iter().map(|r| r.1 - r.0 + 1).sum()
    }

    /// The values at 0-based positions `k` and `k + 1` of the weighted
    /// sample (one walk), or `None` when either is not inside a band.
    fn at2(
        &self,
        k: f64,
        gap: impl Fn(usize) -> f64,
        band: impl Fn(usize) -> u8,
    ) -> Option<(f64, f64)> {
        let mut cum = 0.0;
        let mut first: Option<f64> = None;
        for (b, &(lo, hi)) in self.ranges.iter().enumerate() {
            cum += gap(b);
            let want = if first.is_some() { k + 1.0 } else { k };
            if want < cum {
                return None;
            }
            for rank in lo..=hi {
                cum += f64::from(band(self.base[b] + rank - lo));
                if first.is_none() && k < cum {
                    first = Some(self.values[rank]);
                }
                if let Some(f) = first
                    && k + 1.0 < cum
                {
                    return Some((f, self.values[rank]));
                }
            }
        }
        None
    }

    /// numpy's linear-interpolation percentile `q` of the weighted sample
    /// of total weight `w`.
    fn percentile(
        &self,
        q: f64,
        w: f64,
        gap: impl Fn(usize) -> f64,
        band: impl Fn(usize) -> u8,
    ) -> Option<f64> {
        let pos = (w - 1.0) * (q / 100.0).clamp(0.0, 1.0);
        let k = pos.floor();
        let frac = pos - k;
        if frac == 0.0 && k + 1.0 >= w {
            // The last element: no successor to walk to.
            return self.at2(k - 1.0, gap, band).map(|(_, v)| v);
        }
        let (lo, hi) = self.at2(k, gap, band)?;
        if frac == 0.0 {
            return Some(lo);
        }
        Some(lo + frac * (hi - lo))
    }
}

/// One resample's statistics of one metric.
#[derive(Debug, Clone, Copy)]
struct Replicate {
    mape: f64,
    r: f64,
    /// (real, sim) percentiles per quantile.
    pct: [(f64, f64); MAX_Q],
}

/// One metric prepared once for every resample.
#[derive(Debug)]
struct Prepared<'a> {
    m: Paired<'a>,
    /// Centred values (numerically stable weighted moments).
    x: Vec<f64>,
    y: Vec<f64>,
    /// |sim − real| / real (0 where real ≤ 0) and 1/0 for defined/not.
    ape: Vec<f64>,
    ape_ok: Vec<f64>,
    code_r: Vec<u32>,
    code_s: Vec<u32>,
    real_bands: Bands,
    sim_bands: Bands,
    identical: bool,
    /// Offset of the first value of each block of pairs.
    block_start: Vec<usize>,
}

impl<'a> Prepared<'a> {
    fn new(m: Paired<'a>, n_pairs: usize, quantiles: &[f64]) -> Self {
        let (mr, ms) = (crate::stats::mean(m.real), crate::stats::mean(m.sim));
        let (real_bands, code_r) = Bands::new(m.real, quantiles);
        let (sim_bands, code_s) = Bands::new(m.sim, quantiles);
        let ok: Vec<bool> = m.real.iter().map(|r| *r > 0.0).collect();
        let block_start = (0..=n_pairs.div_ceil(BLOCK))
            .map(|b| m.pair.partition_point(|&p| (p as usize) < b * BLOCK))
            .collect();
        Self {
            x: m.real.iter().map(|v| v - mr).collect(),
            y: m.sim.iter().map(|v| v - ms).collect(),
            ape: m
                .real
                .iter()
                .zip(m.sim)
                .map(|(r, s)| if *r > 0.0 { ((s - r) / r).abs() } else { 0.0 })
                .collect(),
            ape_ok: ok.iter().map(|&b| f64::from(u8::from(b))).collect(),
            code_r,
            code_s,
            real_bands,
            sim_bands,
            identical: m.real == m.sim,
            block_start,
            m,
        }
    }
}

/// The running sums of `L` resamples of one metric, lane `l` for resample
/// `k0 + l`.
#[derive(Debug, Clone)]
struct Lanes {
    /// Σw, Σwx, Σwy, Σwx², Σwy², Σwxy, Σw·ape, Σw (ape defined).
    s: [[f64; L]; 8],
    gap_r: Vec<[f64; L]>,
    gap_s: Vec<[f64; L]>,
    band_r: Vec<[u8; L]>,
    band_s: Vec<[u8; L]>,
}

impl Lanes {
    fn new(p: &Prepared) -> Self {
        Self {
            s: [[0.0; L]; 8],
            gap_r: vec![[0.0; L]; p.real_bands.gaps()],
            gap_s: vec![[0.0; L]; p.sim_bands.gaps()],
            band_r: vec![[0; L]; p.real_bands.slots()],
            band_s: vec![[0; L]; p.sim_bands.slots()],
        }
    }

    /// Adds the metric's values in pair block `b` (block weights `wt`,
    /// one row of `L` lanes per pair of the block).
    fn add_block(&mut self, p: &Prepared, b: usize, wt: &[[u8; L]]) {
        let (from, to) = (p.block_start[b], p.block_start[b + 1]);
        accumulate(
            &mut self.s,
            Block {
                x: &p.x[from..to],
                y: &p.y[from..to],
                ape: &p.ape[from..to],
                ape_ok: &p.ape_ok[from..to],
                code_r: &p.code_r[from..to],
                code_s: &p.code_s[from..to],
                pair: &p.m.pair[from..to],
                base: b * BLOCK,
                wt,
            },
            &mut self.gap_r,
            &mut self.gap_s,
            &mut self.band_r,
            &mut self.band_s,
        );
    }

    fn finish(
        &self,
        p: &Prepared,
        l: usize,
        quantiles: &[f64],
        seed: u64,
        k: u64,
        n_pairs: usize,
    ) -> Replicate {
        let s: [f64; 8] = std::array::from_fn(|i| self.s[i][l]);
        let (mape, r) = mape_r(p.identical, &s);
        let total = s[0];
        let mut pct = [(f64::NAN, f64::NAN); MAX_Q];
        if total > 0.0 {
            for (j, q) in quantiles.iter().enumerate() {
                let a =
                    p.real_bands
                        .percentile(*q, total, |g| self.gap_r[g][l], |i| self.band_r[i][l]);
                let b =
                    p.sim_bands
                        .percentile(*q, total, |g| self.gap_s[g][l], |i| self.band_s[i][l]);
                match (a, b) {
                    (Some(a), Some(b)) => pct[j] = (a, b),
                    _ => return exact_replicate(p, quantiles, seed, k, n_pairs),
                }
            }
        }
        Replicate { mape, r, pct }
    }
}

/// One metric's values in one block of pairs, with the block's weights.
#[derive(Debug, Clone, Copy)]
struct Block<'a> {
    x: &'a [f64],
    y: &'a [f64],
    ape: &'a [f64],
    ape_ok: &'a [f64],
    code_r: &'a [u32],
    code_s: &'a [u32],
    pair: &'a [u32],
    base: usize,
    wt: &'a [[u8; L]],
}

/// The inner loop, compiled for AVX-512 and AVX2 too and chosen at run time
/// (no FMA: every version rounds the same way, so results do not depend on
/// the CPU).
#[multiversion::multiversion(targets("x86_64+avx512f+avx512bw", "x86_64+avx2"))]
fn accumulate(
    s_out: &mut [[f64; L]; 8],
    blk: Block,
    gap_r: &mut [[f64; L]],
    gap_s: &mut [[f64; L]],
    band_r: &mut [[u8; L]],
    band_s: &mut [[u8; L]],
) {
    let mut s = *s_out;
    for j in 0..blk.x.len() {
        let row = &blk.wt[blk.pair[j] as usize - blk.base];
        let mut wf = [0.0f64; L];
        for l in 0..L {
            wf[l] = f64::from(row[l]);
        }
        let (x, y, a, ok) = (blk.x[j], blk.y[j], blk.ape[j], blk.ape_ok[j]);
        for l in 0..L {
            let (wx, wy) = (wf[l] * x, wf[l] * y);
            s[0][l] += wf[l];
            s[1][l] += wx;
            s[2][l] += wy;
            s[3][l] += wx * x;
            s[4][l] += wy * y;
            s[5][l] += wx * y;
            s[6][l] += wf[l] * a;
            s[7][l] += wf[l] * ok;
        }
        let (c1, c2) = (blk.code_r[j], blk.code_s[j]);
        if c1 & BAND == 0 {
            let g = &mut gap_r[c1 as usize];
            for l in 0..L {
                g[l] += wf[l];
            }
        } else {
            band_r[(c1 & !BAND) as usize] = *row;
        }
        if c2 & BAND == 0 {
            let g = &mut gap_s[c2 as usize];
            for l in 0..L {
                g[l] += wf[l];
            }
        } else {
            band_s[(c2 & !BAND) as usize] = *row;
        }
    }
    *s_out = s;
}

fn mape_r(identical: bool, s: &[f64; 8]) -> (f64, f64) {
    let [sw, sx, sy, sxx, syy, sxy, sa, swa] = *s;
    let mape = if swa > 0.0 {
        100.0 * sa / swa
    } else {
        f64::NAN
    };
    let r = if identical && sw > 0.0 {
        1.0
    } else {
        let cov = sw * sxy - sx * sy;
        let vx = sw * sxx - sx * sx;
        let vy = sw * syy - sy * sy;
        if vx > 0.0 && vy > 0.0 {
            (cov / (vx.sqrt() * vy.sqrt())).clamp(-1.0, 1.0)
        } else {
            f64::NAN
        }
    };
    (mape, r)
}

/// The weights of resample `k` for every pair, in the order the fast path
/// draws them (block by block).
fn all_weights(seed: u64, k: u64, n_pairs: usize) -> Vec<u8> {
    let pois = Poisson::new();
    let mut rng = generator(seed, k);
    let mut w = vec![0u8; n_pairs];
    for start in (0..n_pairs).step_by(BLOCK) {
        let end = (start + BLOCK).min(n_pairs);
        let chunk = &mut w[start..end];
        pois.fill(&mut rng, end - start, |i, v| chunk[i] = v);
    }
    w
}

/// Resample `k` of one metric computed exactly, by expanding its weighted
/// sample.
fn exact_replicate(
    p: &Prepared,
    quantiles: &[f64],
    seed: u64,
    k: u64,
    n_pairs: usize,
) -> Replicate {
    let w = all_weights(seed, k, n_pairs);
    let mut s = [0.0f64; 8];
    let mut er = Vec::new();
    let mut es = Vec::new();
    for j in 0..p.m.real.len() {
        let wi = w[p.m.pair[j] as usize];
        let wf = f64::from(wi);
        let (x, y) = (p.x[j], p.y[j]);
        s[0] += wf;
        s[1] += wf * x;
        s[2] += wf * y;
        s[3] += wf * x * x;
        s[4] += wf * y * y;
        s[5] += wf * x * y;
        s[6] += wf * p.ape[j];
        s[7] += wf * p.ape_ok[j];
        er.extend(std::iter::repeat_n(p.m.real[j], usize::from(wi)));
        es.extend(std::iter::repeat_n(p.m.sim[j], usize::from(wi)));
    }
    er.sort_by(f64::total_cmp);
    es.sort_by(f64::total_cmp);
    let (mape, r) = mape_r(p.identical, &s);
    let mut pct = [(f64::NAN, f64::NAN); MAX_Q];
    if !er.is_empty() {
        for (slot, q) in pct.iter_mut().zip(quantiles) {
            *slot = (percentile(&er, *q), percentile(&es, *q));
        }
    }
    Replicate { mape, r, pct }
}

/// Resamples `ks` of every metric, `L` at a time over blocks of pairs.
fn replicates(
    ps: &[Prepared],
    n_pairs: usize,
    quantiles: &[f64],
    seed: u64,
    ks: std::ops::Range<u64>,
) -> Vec<Vec<Replicate>> {
    let pois = Poisson::new();
    let mut out: Vec<Vec<Replicate>> = ps.iter().map(|_| Vec::new()).collect();
    let mut wt = vec![[0u8; L]; BLOCK];
    let mut k0 = ks.start;
    while k0 < ks.end {
        let lanes = ((ks.end - k0) as usize).min(L);
        let mut rngs: Vec<Xoshiro256PlusPlus> =
            (0..lanes).map(|l| generator(seed, k0 + l as u64)).collect();
        let mut acc: Vec<Lanes> = ps.iter().map(Lanes::new).collect();
        for (b, start) in (0..n_pairs).step_by(BLOCK).enumerate() {
            let len = (start + BLOCK).min(n_pairs) - start;
            for (l, rng) in rngs.iter_mut().enumerate() {
                pois.fill(rng, len, |i, v| wt[i][l] = v);
            }
            for (a, p) in acc.iter_mut().zip(ps) {
                a.add_block(p, b, &wt[..len]);
            }
        }
        for ((a, p), o) in acc.iter().zip(ps).zip(&mut out) {
            for l in 0..lanes {
                o.push(a.finish(p, l, quantiles, seed, k0 + l as u64, n_pairs));
            }
        }
        k0 += lanes as u64;
    }
    out
}

fn interval(mut v: Vec<f64>) -> Option<Interval> {
    v.retain(|x| x.is_finite());
    if v.len() < 2 {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some([percentile(&v, 2.5), percentile(&v, 97.5)])
}

/// 95% bootstrap intervals, for each metric, from `resamples` Poisson
/// resamples of the `n_pairs` request pairs (one set of weights per
/// resample shared by every metric), seeded by `seed`: MAPE, Pearson's r
/// and the error of each of up to 8 `quantiles` (percent). Uses up to
/// `threads` threads; the result does not depend on it.
///
/// # Panics
/// If a metric's slices differ in length, its pair indices are not
/// ascending and below `n_pairs`, or more than 8 quantiles are given.
pub fn bootstrap_many(
    n_pairs: usize,
    metrics: &[Paired],
    quantiles: &[f64],
    resamples: usize,
    seed: u64,
    threads: usize,
) -> Vec<Cis> {
    assert!(quantiles.len() <= MAX_Q, "at most 8 quantiles");
    for m in metrics {
        assert!(m.real.len() == m.sim.len() && m.real.len() == m.pair.len());
        assert!(m.pair.windows(2).all(|w| w[0] < w[1]));
        assert!(m.pair.last().is_none_or(|&p| (p as usize) < n_pairs));
    }
    let usable: Vec<bool> = metrics.iter().map(|m| m.real.len() >= 2).collect();
    if resamples < 2 || !usable.iter().any(|u| *u) {
        return metrics.iter().map(|_| Cis::none(quantiles)).collect();
    }
    let ps: Vec<Prepared> = metrics
        .iter()
        .zip(&usable)
        .filter(|(_, u)| **u)
        .map(|(m, _)| Prepared::new(*m, n_pairs, quantiles))
        .collect();
    let threads = threads.clamp(1, resamples.div_ceil(L));
    // Whole lane batches per thread, so the split does not change them.
    let per = resamples.div_ceil(L).div_ceil(threads) * L;
    let mut reps: Vec<Vec<Replicate>> = ps.iter().map(|_| Vec::with_capacity(resamples)).collect();
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let ps = &ps;
                let ks = (t * per).min(resamples) as u64..((t + 1) * per).min(resamples) as u64;
                scope.spawn(move || replicates(ps, n_pairs, quantiles, seed, ks))
            })
            .collect();
        for h in handles {
            let part = h.join().expect("a bootstrap thread panicked");
            for (r, p) in reps.iter_mut().zip(part) {
                r.extend(p);
            }
        }
    });
    let mut done = reps.into_iter();
    usable
        .iter()
        .map(|u| {
            if !u {
                return Cis::none(quantiles);
            }
            let reps = done.next().expect("one result per usable metric");
            Cis {
                mape: interval(reps.iter().map(|r| r.mape).collect()),
                pearson_r: interval(reps.iter().map(|r| r.r).collect()),
                percentile_error: quantiles
                    .iter()
                    .enumerate()
                    .map(|(j, q)| {
                        let signed = reps.iter().map(|r| r.pct[j].1 - r.pct[j].0).collect();
                        let rel = reps
                            .iter()
                            .map(|r| (r.pct[j].1 - r.pct[j].0) / r.pct[j].0)
                            .collect();
                        (*q, interval(signed), interval(rel))
                    })
                    .collect(),
            }
        })
        .collect()
}

/// [`bootstrap_many`] of one metric whose values are all the pairs.
pub fn bootstrap(
    real: &[f64],
    sim: &[f64],
    quantiles: &[f64],
    resamples: usize,
    seed: u64,
    threads: usize,
) -> Cis {
    assert_eq!(real.len(), sim.len(), "paired samples");
    let pair: Vec<u32> = (0..real.len() as u32).collect();
    bootstrap_many(
        real.len(),
        &[Paired {
            real,
            sim,
            pair: &pair,
        }],
        quantiles,
        resamples,
        seed,
        threads,
    )
    .remove(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poisson_weights_have_mean_and_variance_one_and_the_table_is_exact() {
        let p = Poisson::new();
        for u in (0..=u32::MAX).step_by(65_537).chain([0, u32::MAX]) {
            let exact = p.thresholds.iter().filter(|t| u >= **t).count() as u8;
            assert_eq!(p.draw(u), exact, "{u}");
        }
        let w = all_weights(1, 0, 200_000);
        let n = w.len() as f64;
        let m = w.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
        let v = w.iter().map(|&x| (f64::from(x) - m).powi(2)).sum::<f64>() / n;
        assert!((m - 1.0).abs() < 0.01 && (v - 1.0).abs() < 0.02, "{m} {v}");
    }

    #[test]
    fn banded_percentiles_equal_the_exact_ones() {
        // Small n: bands cover everything; large n: bands are partial. The
        // metric covers every third pair.
        for n in [150usize, 60_000] {
            let pair: Vec<u32> = (0..n as u32).filter(|i| i % 3 == 1).collect();
            let real: Vec<f64> = pair
                .iter()
                .map(|&i| ((i as usize * 7919) % 1000) as f64 + 1.0)
                .collect();
            let sim: Vec<f64> = pair
                .iter()
                .map(|&i| ((i as usize * 104_729) % 997) as f64 * 1.1 + 2.0)
                .collect();
            let q = [50.0, 90.0, 99.0];
            let p = Prepared::new(
                Paired {
                    real: &real,
                    sim: &sim,
                    pair: &pair,
                },
                n,
                &q,
            );
            let fast = replicates(std::slice::from_ref(&p), n, &q, 9, 0..20);
            for (k, a) in fast[0].iter().enumerate() {
                let b = exact_replicate(&p, &q, 9, k as u64, n);
                assert_eq!(a.pct[..3], b.pct[..3], "n {n} resample {k}");
                assert!((a.mape - b.mape).abs() < 1e-9 && (a.r - b.r).abs() < 1e-9);
            }
        }
    }

    #[test]
    fn identical_sides_have_zero_width_error_intervals() {
        let v: Vec<f64> = (1..=500).map(f64::from).collect();
        let c = bootstrap(&v, &v, &[50.0, 99.0], 200, 3, 2);
        assert_eq!(c.mape, Some([0.0, 0.0]));
        assert_eq!(c.pearson_r, Some([1.0, 1.0]));
        for (_, s, r) in &c.percentile_error {
            assert_eq!(*s, Some([0.0, 0.0]));
            assert_eq!(*r, Some([0.0, 0.0]));
        }
    }

    #[test]
    fn mape_interval_matches_the_normal_approximation_by_hand() {
        // Half the requests exact, half 20% slow: APE is 0 or 0.2, so MAPE
        // is 10% with standard error 10%/√n; for n = 2000 the 95% interval
        // is 10 ± 1.96·0.2236 = [9.56, 10.44].
        let n = 2000;
        let real = vec![100.0; n];
        let sim: Vec<f64> = (0..n)
            .map(|i| if i % 2 == 0 { 100.0 } else { 120.0 })
            .collect();
        let c = bootstrap(&real, &sim, &[50.0], 1000, 11, 2);
        let [lo, hi] = c.mape.unwrap();
        assert!(
            (lo - 9.56).abs() < 0.08 && (hi - 10.44).abs() < 0.08,
            "{lo} {hi}"
        );
        // Deterministic and independent of the thread count.
        assert_eq!(c, bootstrap(&real, &sim, &[50.0], 1000, 11, 1));
        assert_eq!(c, bootstrap(&real, &sim, &[50.0], 1000, 11, 3));
    }
}
