//! `compare`: everything said about two traces of the same requests, as
//! one [`Report`] that is written as JSON (stable schema), Markdown and
//! HTML.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use blis_traces::{Slo, Status, Trace, TraceRecord};
use serde::Serialize;

use crate::bootstrap::{Paired as BootPaired, bootstrap_many};
use crate::goodput::{DeadlineCliff, client_timeout_us, deadline_cliff};
use crate::metrics::{MetricReport, QUANTILES, report};
use crate::pairs::{Matching, Paired, Series, pair, warmup_below};
use crate::saturation::Saturation;
use crate::stats::{grade, mape, pearson, percentile, sorted};
use crate::timeseries::{Aligned, HitRates, TimeSeriesReport};

/// Version of the JSON schema.
pub const SCHEMA_VERSION: u32 = 1;

/// Settings of a comparison.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CompareOptions {
    /// Leading requests left out (default: the real header's
    /// `warm_up_requests`).
    pub warmup: Option<u64>,
    /// Round trip added to simulated TTFT and E2E, ms (default: the real
    /// header's `network.measured_rtt_ms`, else 0).
    pub rtt_ms: Option<f64>,
    /// SLOs for goodput and attainment.
    pub slo: Option<Slo>,
    /// Bootstrap resamples.
    pub resamples: usize,
    /// Bootstrap seed.
    pub seed: u64,
    /// Threads for the bootstrap (the result does not depend on it).
    pub threads: usize,
    /// What the real side is ([`SideInfo::label`]).
    pub real_label: Option<String>,
}

impl CompareOptions {
    /// Bootstrap resamples by default (`--resamples`).
    pub const DEFAULT_RESAMPLES: usize = 1000;
    /// The bootstrap's seed by default (`--seed`).
    pub const DEFAULT_SEED: u64 = 42;
}

impl Default for CompareOptions {
    fn default() -> Self {
        Self {
            warmup: None,
            rtt_ms: None,
            slo: None,
            resamples: Self::DEFAULT_RESAMPLES,
            seed: Self::DEFAULT_SEED,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            real_label: None,
        }
    }
}

/// What a side is.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SideInfo {
    /// Where it was read from.
    pub path: String,
    /// `real`, `generated` or `replayed`.
    pub mode: String,
    /// Rows.
    pub requests: u64,
    /// What this side is, when the caller said (`--real-label`): e.g.
    /// that the "real" side is a mock server whose timing is the
    /// simulator's, so agreement is a plumbing check, not accuracy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
}

/// Settings as applied.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Applied {
    /// Warm-up requests left out.
    pub warmup: u64,
    /// Round trip added to the simulated side, ms.
    pub rtt_ms: f64,
    /// Bootstrap resamples.
    pub resamples: usize,
    /// Bootstrap seed.
    pub seed: u64,
}

/// Throughput of one side over its window (first send to last response
/// of the paired requests).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Rates {
    /// Window, seconds.
    pub duration_s: f64,
    /// Completed requests per second.
    pub requests_per_s: f64,
    /// Output tokens per second.
    pub output_tokens_per_s: f64,
}

/// Throughput of both sides.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Throughput {
    /// Real.
    pub real: Rates,
    /// Simulated.
    pub sim: Rates,
    /// Relative error of requests/s.
    pub requests_per_s_error: f64,
    /// Relative error of output tokens/s.
    pub output_tokens_per_s_error: f64,
}

/// A group's (SLO class or client) agreement on TTFT and E2E.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GroupReport {
    /// Pairs.
    pub n: u64,
    /// Per metric (`ttft`, `e2e`): real/sim p50 and p99, MAPE, r, grade.
    pub metrics: BTreeMap<&'static str, GroupMetric>,
}

/// One metric of a group.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GroupMetric {
    /// Pairs.
    pub n: u64,
    /// Real median, ms.
    pub real_p50: f64,
    /// Simulated median, ms.
    pub sim_p50: f64,
    /// Real p99, ms.
    pub real_p99: f64,
    /// Simulated p99, ms.
    pub sim_p99: f64,
    /// MAPE, %.
    pub mape: f64,
    /// Pearson's r.
    pub pearson_r: f64,
    /// Grade.
    pub grade: &'static str,
}

/// SLO attainment and goodput of one side.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SloSide {
    /// Requests judged (past warm-up, on both sides).
    pub requests: u64,
    /// Requests that met every bound (failed ones never do).
    pub attained: u64,
    /// `attained / requests`.
    pub attainment: f64,
    /// Attained requests per second of the side's window.
    pub goodput_per_s: f64,
}

/// SLO attainment on both sides.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SloReport {
    /// The SLOs.
    pub slo: Slo,
    /// Real.
    pub real: SloSide,
    /// Simulated.
    pub sim: SloSide,
}

/// Everything a comparison says (the JSON report).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// Schema version.
    pub schema_version: u32,
    /// The real side.
    pub real: SideInfo,
    /// The simulated side.
    pub sim: SideInfo,
    /// Settings applied.
    pub settings: Applied,
    /// How the requests matched.
    pub matching: Matching,
    /// `ttft`, `e2e`, `itl`, `tpot`, where both sides have them.
    pub metrics: BTreeMap<&'static str, MetricReport>,
    /// Throughput.
    pub throughput: Option<Throughput>,
    /// Per SLO class and per client (when there are several).
    pub groups: BTreeMap<&'static str, BTreeMap<String, GroupReport>>,
    /// SLO attainment and goodput, with `--slo`.
    pub slo: Option<SloReport>,
    /// Server time series, when both sides have them.
    pub timeseries: Option<TimeSeriesReport>,
    /// Prefix-cache hit rates.
    pub prefix_cache_hit_rate: HitRates,
    /// Saturation verdicts.
    pub saturation: Saturation,
    /// When either side is saturated under a client timeout: each side's
    /// deadline cliff, real / sim ([`crate::goodput`]): what decides its
    /// completed count.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub goodput: Option<[Option<DeadlineCliff>; 2]>,
    /// Each side's decode time per token over the run, and whether the
    /// real one changed in a way the simulated one does not
    /// ([`crate::decode_drift`]); `None` for a run too short to tell.
    pub decode_over_run: Option<crate::decode_drift::DecodeOverRun>,
    /// What this comparison cannot tell.
    pub limitations: Vec<String>,
}

/// A report with the data its plots need.
#[derive(Debug, Clone)]
pub struct Comparison {
    /// The report.
    pub report: Report,
    /// Per metric: sorted real and simulated samples (CDF plots).
    pub samples: BTreeMap<&'static str, (Vec<f64>, Vec<f64>)>,
    /// Per metric: the per-request pairs (scatter plots).
    pub per_request: BTreeMap<&'static str, (Vec<f64>, Vec<f64>)>,
    /// Aligned time series.
    pub aligned: Vec<Aligned>,
}

fn rates(records: &[TraceRecord], pairs: &[usize]) -> Rates {
    let (mut lo, mut hi, mut tokens) = (i64::MAX, i64::MIN, 0u64);
    for &i in pairs {
        let r = &records[i];
        if let (Some(s), Some(e)) = (r.outcome.send_time_us, r.outcome.last_chunk_time_us) {
            lo = lo.min(s);
            hi = hi.max(e);
            tokens += u64::from(r.request.output_tokens);
        }
    }
    let d = if hi > lo { (hi - lo) as f64 / 1e6 } else { 0.0 };
    let per = |x: f64| if d > 0.0 { x / d } else { 0.0 };
    Rates {
        duration_s: d,
        requests_per_s: per(pairs.len() as f64),
        output_tokens_per_s: per(tokens as f64),
    }
}

fn group_metric(s: &Series, keep: &dyn Fn(u32) -> bool) -> Option<GroupMetric> {
    let (mut r, mut x) = (Vec::new(), Vec::new());
    for ((a, b), p) in s.real.iter().zip(&s.sim).zip(&s.pair) {
        if keep(*p) {
            r.push(*a);
            x.push(*b);
        }
    }
    if r.is_empty() {
        return None;
    }
    let (m, pr) = (mape(&r, &x), pearson(&r, &x));
    let (sr, sx) = (sorted(&r), sorted(&x));
    Some(GroupMetric {
        n: r.len() as u64,
        real_p50: percentile(&sr, 50.0),
        sim_p50: percentile(&sx, 50.0),
        real_p99: percentile(&sr, 99.0),
        sim_p99: percentile(&sx, 99.0),
        mape: m,
        pearson_r: pr,
        grade: grade(m, pr),
    })
}

fn groups(real: &Trace, p: &Paired) -> BTreeMap<&'static str, BTreeMap<String, GroupReport>> {
    let mut out = BTreeMap::new();
    for (kind, key) in [
        (
            "slo_class",
            (|r: &TraceRecord| r.request.slo_class.to_string()) as fn(&TraceRecord) -> String,
        ),
        ("client", |r: &TraceRecord| r.request.client_id.to_string()),
    ] {
        let labels: Vec<String> = p.pairs.iter().map(|q| key(&real.records[q.real])).collect();
        let mut distinct: Vec<&String> = labels.iter().collect();
        distinct.sort();
        distinct.dedup();
        if distinct.len() < 2 {
            continue;
        }
        let mut m = BTreeMap::new();
        for label in distinct {
            let keep = |i: u32| &labels[i as usize] == label;
            let mut metrics = BTreeMap::new();
            if let Some(g) = group_metric(&p.ttft, &keep) {
                metrics.insert("ttft", g);
            }
            if let Some(g) = group_metric(&p.e2e, &keep) {
                metrics.insert("e2e", g);
            }
            let n = labels.iter().filter(|l| *l == label).count() as u64;
            m.insert(
                if label.is_empty() {
                    "(none)".to_string()
                } else {
                    label.clone()
                },
                GroupReport { n, metrics },
            );
        }
        out.insert(kind, m);
    }
    out
}

/// SLO attainment of one side over the requests past warm-up present on
/// both sides; failed requests count against it.
fn slo_side(t: &Trace, ids: &[u64], slo: &Slo, rtt_ms: f64) -> SloSide {
    let by_id: BTreeMap<u64, &TraceRecord> = t
        .records
        .iter()
        .map(|r| (r.request.request_id, r))
        .collect();
    let (mut attained, mut n, mut lo, mut hi) = (0u64, 0u64, i64::MAX, i64::MIN);
    for id in ids {
        let Some(r) = by_id.get(id) else { continue };
        n += 1;
        let o = &r.outcome;
        if let Some(s) = o.send_time_us {
            lo = lo.min(s);
        }
        if let Some(e) = o.last_chunk_time_us {
            hi = hi.max(e);
        }
        if o.status != Some(Status::Ok) {
            continue;
        }
        let (Some(s), Some(e)) = (o.send_time_us, o.last_chunk_time_us) else {
            continue;
        };
        let e2e = (e - s) as f64 / 1e3 + rtt_ms;
        let ttft = o
            .first_chunk_time_us
            .filter(|_| r.request.streaming)
            .map(|f| (f - s) as f64 / 1e3 + rtt_ms);
        let tpot = match (o.first_chunk_time_us, r.request.output_tokens) {
            (Some(f), n) if n > 1 && r.request.streaming => {
                Some((e - f) as f64 / 1e3 / f64::from(n - 1))
            }
            _ => None,
        };
        if slo.attained(ttft, tpot, e2e) {
            attained += 1;
        }
    }
    let d = if hi > lo { (hi - lo) as f64 / 1e6 } else { 0.0 };
    SloSide {
        requests: n,
        attained,
        attainment: if n > 0 {
            attained as f64 / n as f64
        } else {
            f64::NAN
        },
        goodput_per_s: if d > 0.0 { attained as f64 / d } else { 0.0 },
    }
}

/// Compares `real` (read from `real_path`) with `sim`.
pub fn compare(
    real: &Trace,
    real_path: &str,
    sim: &Trace,
    sim_path: &str,
    o: &CompareOptions,
) -> Comparison {
    let warmup = o.warmup.unwrap_or(real.header.warm_up_requests);
    let rtt = o
        .rtt_ms
        .or(real.header.network.as_ref().and_then(|n| n.measured_rtt_ms))
        .unwrap_or(0.0);
    let p = pair(real, sim, warmup, rtt);
    let (metrics, samples, per_request) = metric_reports(&p, o);
    let throughput = throughput(real, sim, &p);
    let slo = slo_report(real, sim, warmup, rtt, o);
    let ts = crate::timeseries::compare(real, sim);
    let hit = ts
        .as_ref()
        .map(|t| t.0.prefix_cache_hit_rate)
        .unwrap_or_else(|| crate::timeseries::hit_rates(real, sim));
    let saturation = crate::saturation::compare(&real.records, &sim.records);
    let goodput = (saturation.real.saturated || saturation.sim.saturated)
        .then(|| {
            let t = client_timeout_us(real).or_else(|| client_timeout_us(sim));
            [
                deadline_cliff(&real.records, t),
                deadline_cliff(&sim.records, t),
            ]
        })
        .filter(|c| c.iter().any(Option::is_some));
    let decode_over_run = crate::decode_drift::decode_over_run(&real.records, &sim.records);
    let limitations = limitations(real, sim, &p, &metrics, ts.is_some(), rtt);
    let (timeseries, aligned) = match ts {
        Some((t, a)) => (Some(t), a),
        None => (None, Vec::new()),
    };
    let report = Report {
        schema_version: SCHEMA_VERSION,
        real: SideInfo {
            path: real_path.to_string(),
            mode: format!("{:?}", real.header.mode).to_lowercase(),
            requests: real.records.len() as u64,
            label: o.real_label.clone(),
        },
        sim: SideInfo {
            path: sim_path.to_string(),
            mode: format!("{:?}", sim.header.mode).to_lowercase(),
            requests: sim.records.len() as u64,
            label: None,
        },
        settings: Applied {
            warmup,
            rtt_ms: rtt,
            resamples: o.resamples,
            seed: o.seed,
        },
        groups: groups(real, &p),
        matching: p.matching.clone(),
        metrics,
        throughput,
        slo,
        timeseries,
        prefix_cache_hit_rate: hit,
        saturation,
        goodput,
        decode_over_run,
        limitations,
    };
    Comparison {
        report,
        samples,
        per_request,
        aligned,
    }
}

/// Per-request samples of the two sides, by metric.
type Samples = BTreeMap<&'static str, (Vec<f64>, Vec<f64>)>;

/// Per metric (TTFT, E2E, TPOT, ITL) with pairs: its report with bootstrap
/// intervals, its sorted samples (ITL: every gap) and its per-request pairs.
fn metric_reports(
    p: &Paired,
    o: &CompareOptions,
) -> (BTreeMap<&'static str, MetricReport>, Samples, Samples) {
    let series: [(&'static str, &Series); 4] = [
        ("ttft", &p.ttft),
        ("e2e", &p.e2e),
        ("tpot", &p.tpot),
        ("itl", &p.itl),
    ];
    let boot: Vec<BootPaired> = series
        .iter()
        .map(|(_, s)| BootPaired {
            real: &s.real,
            sim: &s.sim,
            pair: &s.pair,
        })
        .collect();
    let cis = bootstrap_many(
        p.pairs.len(),
        &boot,
        &QUANTILES,
        o.resamples,
        o.seed,
        o.threads,
    );
    let mut metrics = BTreeMap::new();
    let mut samples = BTreeMap::new();
    let mut per_request = BTreeMap::new();
    for ((name, s), ci) in series.iter().zip(&cis) {
        let dists = (*name == "itl").then(|| (sorted(&p.itl_gaps.0), sorted(&p.itl_gaps.1)));
        if let Some(m) = report(s, dists.clone(), ci) {
            metrics.insert(*name, m);
            samples.insert(
                *name,
                dists.unwrap_or_else(|| (sorted(&s.real), sorted(&s.sim))),
            );
            per_request.insert(*name, (s.real.clone(), s.sim.clone()));
        }
    }
    (metrics, samples, per_request)
}

/// Both sides' throughput over the paired requests, with the relative
/// errors (none without pairs).
fn throughput(real: &Trace, sim: &Trace, p: &Paired) -> Option<Throughput> {
    (!p.pairs.is_empty()).then(|| {
        let rr = rates(
            &real.records,
            &p.pairs.iter().map(|q| q.real).collect::<Vec<_>>(),
        );
        let rs = rates(
            &sim.records,
            &p.pairs.iter().map(|q| q.sim).collect::<Vec<_>>(),
        );
        let rel = |a: f64, b: f64| if a > 0.0 { (b - a) / a } else { f64::NAN };
        Throughput {
            requests_per_s_error: rel(rr.requests_per_s, rs.requests_per_s),
            output_tokens_per_s_error: rel(rr.output_tokens_per_s, rs.output_tokens_per_s),
            real: rr,
            sim: rs,
        }
    })
}

/// SLO attainment and goodput of both sides on the requests past warm-up
/// that both have (the simulated side's TTFT with the round trip added).
fn slo_report(
    real: &Trace,
    sim: &Trace,
    warmup: u64,
    rtt: f64,
    o: &CompareOptions,
) -> Option<SloReport> {
    let below = warmup_below(&real.records, warmup);
    let sim_ids: std::collections::BTreeSet<u64> =
        sim.records.iter().map(|r| r.request.request_id).collect();
    let judged: Vec<u64> = real
        .records
        .iter()
        .map(|r| r.request.request_id)
        .filter(|id| *id >= below && sim_ids.contains(id))
        .collect();
    o.slo.map(|s| SloReport {
        slo: s,
        real: slo_side(real, &judged, &s, 0.0),
        sim: slo_side(sim, &judged, &s, rtt),
    })
}

fn limitations(
    real: &Trace,
    sim: &Trace,
    p: &Paired,
    metrics: &BTreeMap<&'static str, MetricReport>,
    timeseries: bool,
    rtt: f64,
) -> Vec<String> {
    let mut l = vec![
        "Requests are paired by request_id; only requests completed (`ok`) on both sides past warm-up are compared.".to_string(),
        "Bootstrap intervals are from Poisson resamples of the request pairs; they describe sampling noise of this run, not run-to-run variation of the server (compare two real runs for that floor).".to_string(),
        "Percentile errors are sim − real of each side's own percentile, not of matched requests.".to_string(),
    ];
    if rtt > 0.0 {
        l.push(format!(
            "{rtt:.3} ms of network round trip was added to every simulated TTFT and E2E."
        ));
    }
    if let Some(m) = metrics.get("itl") {
        l.push(format!(
            "ITL compares inter-chunk gaps ({} real, {} simulated); a server that sends several tokens per chunk, or extra chunks (e.g. a role or usage chunk), shifts it. Its MAPE and r are of each request's mean gap.",
            m.samples.real, m.samples.sim
        ));
    } else if real.chunks.is_none() || sim.chunks.is_none() {
        l.push("ITL is not compared: a side has no per-chunk (ITL) companion.".into());
    }
    if p.matching.token_mismatches.input + p.matching.token_mismatches.output > 0 {
        l.push(format!(
            "{} pairs have different input and {} different output token counts between the sides; their latencies are not comparable one to one.",
            p.matching.token_mismatches.input, p.matching.token_mismatches.output
        ));
    }
    if !timeseries {
        l.push("Server time series are not compared: a side has no metrics companion (or no queue/running/KV series).".into());
    }
    for (side, t) in [("real", real), ("simulated", sim)] {
        if !t.absent_columns.is_empty() {
            l.push(format!(
                "The {side} trace has no column {}: {}.",
                t.absent_columns.join(", "),
                absent_column_effects(&t.absent_columns)
            ));
        }
    }
    if sim.header.mode == blis_traces::Mode::Real && real.header.mode == blis_traces::Mode::Real {
        l.push(
            "Both sides are real runs: the errors measure the server's run-to-run variation."
                .into(),
        );
    }
    l
}

/// What a comparison loses without each optional column.
fn absent_column_effects(absent: &[&str]) -> String {
    let mut e = Vec::new();
    for (col, effect) in [
        (
            "server_input_tokens",
            "input-token mismatches are judged on the planned counts",
        ),
        ("slo_class", "no per-SLO-class rows"),
        ("client_id", "no per-client rows"),
        ("tenant_id", "no per-tenant rows"),
        (
            "output_tokens",
            "TPOT and token mismatches use 0 output tokens",
        ),
        ("num_chunks", "chunk counts are unknown"),
    ] {
        if absent.contains(&col) {
            e.push(effect);
        }
    }
    if e.is_empty() {
        "their values are unknown and not used".to_string()
    } else {
        format!("their values are unknown ({})", e.join("; "))
    }
}

/// Columns a trace must have to be compared (or fitted to): without them
/// a metric would silently vanish.
pub const REQUIRED_COLUMNS: [&str; 5] = [
    "status",
    "streaming",
    "send_time_us",
    "first_chunk_time_us",
    "last_chunk_time_us",
];

/// The first of [`REQUIRED_COLUMNS`] that `trace` read without.
pub fn missing_required_column(trace: &Trace) -> Option<&'static str> {
    REQUIRED_COLUMNS
        .into_iter()
        .find(|c| trace.absent_columns.contains(c))
}

fn fmt(x: f64) -> String {
    if x.is_nan() {
        "-".into()
    } else if x.abs() >= 100.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.3}")
    }
}

fn ci(c: Option<[f64; 2]>, scale: f64) -> String {
    let unit = if scale == 100.0 { "%" } else { "" };
    c.map_or(String::new(), |[a, b]| {
        format!(" [{}{unit}, {}{unit}]", fmt(a * scale), fmt(b * scale))
    })
}

impl Report {
    /// The report as Markdown.
    pub fn to_markdown(&self) -> String {
        let mut o = String::new();
        self.md_header(&mut o);
        self.md_metrics_table(&mut o);
        self.md_totals(&mut o);
        self.md_timeseries(&mut o);
        self.md_verdicts(&mut o);
        self.md_groups(&mut o);
        self.md_limitations(&mut o);
        o
    }

    /// Markdown: the title, the two inputs and the settings, and a saturation warning.
    fn md_header(&self, o: &mut String) {
        let _ = writeln!(o, "# Calibration report\n");
        let _ = writeln!(
            o,
            "real: `{}` ({}, {} requests) · sim: `{}` ({}, {} requests) · {} pairs compared, warm-up {}, RTT added {:.3} ms, {} bootstrap resamples\n",
            self.real.path,
            self.real.mode,
            self.real.requests,
            self.sim.path,
            self.sim.mode,
            self.sim.requests,
            self.matching.paired,
            self.settings.warmup,
            self.settings.rtt_ms,
            self.settings.resamples
        );
        if let Some(label) = &self.real.label {
            let _ = writeln!(o, "> **The real side is {label}.**\n");
        }
        let s = &self.saturation;
        if !s.agree {
            let _ = writeln!(
                o,
                "> **WARNING: saturation disagrees.** The real server is {} but the simulation is {}: the prediction does not describe this load.\n",
                if s.real.saturated {
                    "saturated (requests waiting to start grow)"
                } else {
                    "stable"
                },
                if s.sim.saturated {
                    "saturated"
                } else {
                    "stable"
                }
            );
        } else if s.real.saturated {
            let _ = writeln!(
                o,
                "> Both sides are saturated (the requests waiting to start grow without bound).\n"
            );
        }
        if let Some(d) = self.decode_over_run.as_ref().filter(|d| d.drift) {
            let _ = writeln!(
                o,
                "> **The real decode speed drifted over the run**: its time per output token changed by {:+.0}% from the first window of the run to the last, the simulated one by {:+.0}%. {} Errors averaged over this run hide errors that grow with it.\n",
                100.0 * d.real_change,
                100.0 * d.sim_change,
                if d.steady_load {
                    "The simulated speed held (within 5%), so the change comes from outside the step model (a server that slows under sustained load, thermal limits, other work on the GPU, a client falling behind its streams)."
                } else {
                    "The simulated speed moved too: its batch, preemption or step time evolved otherwise than the server's, or the server changed for reasons outside the model, or both."
                }
            );
        }
    }

    /// Markdown: one row per metric: distributions, errors with their intervals, correlation, KS, W1 and the grade.
    fn md_metrics_table(&self, o: &mut String) {
        let _ = writeln!(
            o,
            "| metric | n | real mean | sim mean | real p50 | sim p50 | real p99 | sim p99 | p99 error [95% CI] | MAPE % [95% CI] | MPE % | r [95% CI] | KS D (p) | W1 ms | grade |"
        );
        let _ = writeln!(
            o,
            "|---|---:|---:|---:|---:|---:|---:|---:|---|---|---:|---|---|---:|---|"
        );
        for (name, m) in &self.metrics {
            let e99 = &m.errors["p99"];
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {:+.1}%{} | {}{} | {} | {}{} | {} ({}) | {} | **{}** |",
                name.to_uppercase(),
                m.n,
                fmt(m.real.mean),
                fmt(m.sim.mean),
                fmt(m.real.p50),
                fmt(m.sim.p50),
                fmt(m.real.p99),
                fmt(m.sim.p99),
                100.0 * e99.relative,
                ci(e99.ci95_relative, 100.0),
                fmt(m.mape),
                ci(m.mape_ci95, 1.0),
                fmt(m.mpe),
                fmt(m.pearson_r),
                ci(m.pearson_r_ci95, 1.0),
                fmt(m.ks_d),
                if m.ks_p < 1e-4 {
                    format!("{:.1e}", m.ks_p)
                } else {
                    format!("{:.4}", m.ks_p)
                },
                fmt(m.wasserstein),
                m.grade
            );
        }
        let _ = writeln!(
            o,
            "\nTimes in ms. Errors are sim − real; MPE > 0 means the simulator is slower than reality.\n"
        );
    }

    /// Markdown: throughput, SLO attainment and the prefix-cache hit rate of both sides.
    fn md_totals(&self, o: &mut String) {
        if let Some(t) = &self.throughput {
            let _ = writeln!(
                o,
                "throughput: real {:.2} req/s, {:.1} output tok/s · sim {:.2} req/s ({:+.1}%), {:.1} output tok/s ({:+.1}%)",
                t.real.requests_per_s,
                t.real.output_tokens_per_s,
                t.sim.requests_per_s,
                100.0 * t.requests_per_s_error,
                t.sim.output_tokens_per_s,
                100.0 * t.output_tokens_per_s_error
            );
        }
        if let Some(slo) = &self.slo {
            let _ = writeln!(
                o,
                "SLO attainment: real {:.1}% ({:.2} req/s goodput) · sim {:.1}% ({:.2} req/s)",
                100.0 * slo.real.attainment,
                slo.real.goodput_per_s,
                100.0 * slo.sim.attainment,
                slo.sim.goodput_per_s
            );
        }
        let h = &self.prefix_cache_hit_rate;
        if h.real.is_some() || h.sim.is_some() {
            let pct = |v: Option<f64>| v.map_or("-".into(), |x| format!("{:.1}%", 100.0 * x));
            let _ = writeln!(
                o,
                "prefix-cache hit rate: real {} · sim {}",
                pct(h.real),
                pct(h.sim)
            );
        }
    }

    /// Markdown: the server time series (the metrics companions) side by side.
    fn md_timeseries(&self, o: &mut String) {
        if let Some(ts) = &self.timeseries {
            let _ = writeln!(
                o,
                "\n| server series (every {:.2} s) | points | real mean | sim mean | MAE | r |",
                ts.interval_s
            );
            let _ = writeln!(o, "|---|---:|---:|---:|---:|---:|");
            for a in &ts.series {
                let _ = writeln!(
                    o,
                    "| {} | {} | {} | {} | {} | {} |",
                    a.series,
                    a.points,
                    fmt(a.real_mean),
                    fmt(a.sim_mean),
                    fmt(a.mae),
                    fmt(a.pearson_r)
                );
            }
        }
    }

    /// Markdown: each side's saturation verdict and the requests' outcomes.
    fn md_verdicts(&self, o: &mut String) {
        let s = &self.saturation;
        let side = |v: &crate::saturation::SideVerdict| match &v.reason {
            Some(r) => format!("saturated: {r}"),
            None => format!(
                "stable (requests waiting to start: at most {}, trend ρ {})",
                v.waiting.iter().copied().max().unwrap_or(0),
                fmt(v.trend_rho)
            ),
        };
        let _ = writeln!(
            o,
            "\nsaturation: real {}; sim {}",
            side(&s.real),
            side(&s.sim)
        );
        if let Some(g) = &self.goodput {
            let side = |c: &Option<DeadlineCliff>| match c {
                Some(c) if c.in_order < 0.9 => format!(
                    "not a deadline cliff: only {:.1}% of its {} completed requests are the earliest sent (the timeout cut long requests mid-decode, or another order chose)",
                    100.0 * c.in_order,
                    c.completed
                ),
                Some(c) => match c.cliff_s {
                    Some(t) => format!(
                        "completes its earliest sends up to {t:.0} s after the first ({:.1}% of its {} completed are the earliest sent): about {:.0} requests from {:.1} s of decode each, {:.1} at once, at {:.2} sent per s; 1% more decode time, {:.1}% fewer",
                        100.0 * c.in_order,
                        c.completed,
                        c.predicted_completed,
                        c.decode_s,
                        c.concurrency,
                        c.rate_per_s,
                        c.elasticity
                    ),
                    None => format!(
                        "no deadline cliff within the run ({:.1} s of decode each, {:.1} at once, {:.2} finished against {:.2} sent per s)",
                        c.decode_s, c.concurrency, c.service_per_s, c.rate_per_s
                    ),
                },
                None => "no queue under a client timeout to read".into(),
            };
            let _ = writeln!(
                o,
                "goodput under overload (the client's timeout, the deadline cliff): real {}; sim {}",
                side(&g[0]),
                side(&g[1])
            );
        }
        if let Some(d) = &self.decode_over_run {
            let ms = |w: &crate::decode_drift::Window| match (w.real_ms, w.sim_ms) {
                (Some(r), Some(s)) => format!("{r:.2}/{s:.2}"),
                _ => "-".into(),
            };
            let _ = writeln!(
                o,
                "decode time per token over the run, ms real/sim by window of first-token time ({:.0} s each): {}; change from the first to the last: real {:+.1}%, sim {:+.1}%{}",
                d.windows.first().map_or(0.0, |w| w.to_s - w.from_s),
                d.windows.iter().map(ms).collect::<Vec<_>>().join(", "),
                100.0 * d.real_change,
                100.0 * d.sim_change,
                if d.drift { " (drift)" } else { "" }
            );
        }
        let m = &self.matching;
        let _ = writeln!(
            o,
            "requests: real ok {} / error {} / timeout {} / cancelled {}; sim ok {} / error {} / timeout {} / cancelled {}; only in real {}, only in sim {}, not ok on a side {}",
            m.real.ok,
            m.real.error,
            m.real.timeout,
            m.real.cancelled,
            m.sim.ok,
            m.sim.error,
            m.sim.timeout,
            m.sim.cancelled,
            m.only_real,
            m.only_sim,
            m.not_ok_on_a_side
        );
        if m.duplicate_rows != (0, 0) {
            let _ = writeln!(
                o,
                "warning: rows repeating a request id: real {}, sim {}; only the last row of each id is compared (a trace merged from overlapping shards?)",
                m.duplicate_rows.0, m.duplicate_rows.1
            );
        }
        if m.out_of_order != (0, 0) {
            let _ = writeln!(
                o,
                "warning: completed rows with times out of order (a first chunk before the send or after the last chunk): real {}, sim {}; their requests are not compared (a recorder's clock or a merge at fault?)",
                m.out_of_order.0, m.out_of_order.1
            );
        }
    }

    /// Markdown: per tenant, SLO class or other grouping, TTFT and E2E.
    fn md_groups(&self, o: &mut String) {
        for (kind, groups) in &self.groups {
            let _ = writeln!(
                o,
                "\n| {kind} | n | TTFT p50 real/sim | TTFT MAPE | E2E p50 real/sim | E2E MAPE | grade (E2E) |"
            );
            let _ = writeln!(o, "|---|---:|---|---:|---|---:|---|");
            for (label, g) in groups {
                let t = g.metrics.get("ttft");
                let e = g.metrics.get("e2e");
                let _ = writeln!(
                    o,
                    "| {label} | {} | {} | {} | {} | {} | {} |",
                    g.n,
                    t.map_or("-".into(), |t| format!(
                        "{} / {}",
                        fmt(t.real_p50),
                        fmt(t.sim_p50)
                    )),
                    t.map_or("-".into(), |t| fmt(t.mape)),
                    e.map_or("-".into(), |e| format!(
                        "{} / {}",
                        fmt(e.real_p50),
                        fmt(e.sim_p50)
                    )),
                    e.map_or("-".into(), |e| fmt(e.mape)),
                    e.map_or("-", |e| e.grade)
                );
            }
        }
    }

    /// Markdown: the known limitations of this comparison.
    fn md_limitations(&self, o: &mut String) {
        let _ = writeln!(o, "\n## Known limitations\n");
        for l in &self.limitations {
            let _ = writeln!(o, "- {l}");
        }
    }
}
