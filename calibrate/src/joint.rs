//! The joint fit of the global `trained-physics` coefficients
//! ([`blis_replay::latency::physics`]) on every run of every model at once.
//!
//! What a user reads of a run, and what the fit is judged on, is each
//! run's mean and tail: mean and p99 of TTFT and E2E and the mean ITL per
//! output token, each side over its own completed requests. The loss is
//! the root mean square over runs of each run's weighted root mean square
//! of those relative errors, so a 9,000-request run and a 700-request run
//! count alike:
//!
//! ```text
//! e_r  = sqrt( Σ_m w_m · min(|sim_m − real_m| / real_m, 3)² / Σ_m w_m )
//!        m ∈ {TTFT mean (1), TTFT p99 (½), E2E mean (1), E2E p99 (½), ITL mean (1)}
//! loss = sqrt( Σ_r v_r · e_r² / Σ_r v_r ),   v_r = OVERLOADED_WEIGHT for an
//!        overloaded run (real mean TTFT above 10 s), else 1
//! ```
//!
//! Two stages:
//!
//! 1. **Decode intervals** (convex). Every completed request decoded for
//!    `E2E − TTFT` over `output − 1` steps; its mean step time is the mean
//!    of the physics terms of the batches it decoded with, times the
//!    coefficients. The batches are rebuilt from all requests' measured
//!    intervals (who was decoding, with how much context; whose prefill
//!    fell in the interval), wherever the rebuild is complete: before the
//!    first arrival of a request that failed (its state is unknown), for
//!    the requests whose first token came in the first three quarters of
//!    the run (`FIT_SPAN`: a run's last stretch carries the server's slow
//!    drifts). A non-negative least squares of the relative error, each run weighted
//!    alike, gives the coefficients (Lawson & Hanson 1974).
//! 2. **Replays** (derivative-free). Starting there, what decode intervals
//!    cannot see ([`STAGE2_TERMS`]: prefill compute; the queueing delay and
//!    the output hop) is refined by replaying every run in-process (its
//!    recorded server settings and client timeout) with a coordinate
//!    search on multiplicative grids and Nelder–Mead restarts (argmin),
//!    runs replayed in parallel threads.
//!
//! Every coefficient is non-negative, and those that correct a time at the
//! hardware's peak are at least 1 ([`FLOOR`]): nothing moves bytes faster
//! than peak bandwidth or multiplies faster than peak FLOPs. Each choice
//! here (the terms, the floors, the stage-2 terms, the weight of overloaded
//! runs, the step structure) was made by leave-one-run-out on the vLLM
//! ground truth (`blis-calibrate benchmark`); the README gives the numbers.
//!
//! Recorded failures never enter a prediction: a replay cancels requests
//! only at the client's timeout.

use std::cell::Cell;

use argmin::core::{CostFunction, Executor, State};
use argmin::solver::neldermead::NelderMead;
use blis_replay::api::replay_records_in_memory;
use blis_replay::latency::coefficients::{CoefficientRow, LatencyKind};
use blis_replay::latency::physics::{
    HostOverheads, PhysicsBasis, TERM_NAMES, TERMS, TrainedPhysics,
};
use blis_replay::latency::{BatchShape, Model, PrefillChunk};
use blis_replay::setup::{Resolved, ServerArgs, resolve};
use blis_traces::{Status, Trace, TraceRecord};
use serde::Serialize;

use crate::fit::FitError;
use crate::nnls::nnls;
use crate::stats::{mean, percentile, sorted};

/// Default weight of an overloaded run in the loss (leave-one-run-out on
/// the vLLM ground truth with 0.25, 0.5 and 1: see the README).
pub const OVERLOADED_WEIGHT: f64 = 0.5;

/// How a joint fit runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct JointOptions {
    /// Replays of every run allowed to stage 2.
    pub budget: u64,
    /// Runs replayed in parallel (the result is the same).
    pub threads: usize,
    /// Weight of an overloaded run (real mean TTFT above 10 s) in the loss,
    /// relative to 1 for the others.
    pub overloaded_weight: f64,
}

impl JointOptions {
    /// Checks the options.
    ///
    /// # Errors
    /// A weight of overloaded runs that is not a number ≥ 0.
    pub fn validate(&self) -> Result<(), FitError> {
        if self.overloaded_weight >= 0.0 && self.overloaded_weight.is_finite() {
            Ok(())
        } else {
            Err(FitError::Options(format!(
                "--overloaded-weight must be a number ≥ 0, got {}",
                blis_traces::shown::Num(self.overloaded_weight)
            )))
        }
    }
}

impl Default for JointOptions {
    fn default() -> Self {
        Self {
            budget: DEFAULT_BUDGET,
            threads: 1,
            overloaded_weight: OVERLOADED_WEIGHT,
        }
    }
}

/// The terms refined by replays in stage 2 (with the host overheads); the
/// others keep their decode-interval fit. Prefill compute is seen only in
/// TTFT, which stage 1 does not measure. Measured by leave-one-run-out on
/// the 8 ground-truth runs (budget 40–60, before the compute floors):
/// refining every free term gave median errors TTFT 6.0%, E2E 3.3%, ITL
/// 8.5% (stage 2 trades decode accuracy for TTFT, and doubling the ITL
/// weight did not stop it: ITL 8.8% on Llama-2-7B reasoning, −23% on
/// Mixtral reasoning); refining only these gave TTFT 6.9%, E2E 3.8%, ITL
/// 6.4%.
pub const STAGE2_TERMS: [&str; 1] = ["prefill_compute"];

/// Strength of the ridge that holds a stage-2 term near its starting value
/// in stage 1, per run: the weight of a run whose prefill work is 1% of its
/// decode steps (relative terms squared, 0.01²).
pub const STAGE2_RIDGE: f64 = 1e-4;

/// Replays of every run allowed to stage 2 by default (about a minute for
/// the 8 ground-truth runs on 2 cores).
pub const DEFAULT_BUDGET: u64 = 40;

/// A run is overloaded when its mean TTFT exceeds this, ms.
pub const OVERLOADED_TTFT_MS: f64 = 10_000.0;

/// Relative errors are capped here in the loss.
const ERROR_CAP: f64 = 3.0;

/// A run's mean and tail latencies over its completed requests, ms.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Default)]
pub struct RunStats {
    /// Requests.
    pub requests: u64,
    /// Completed (`ok`) requests.
    pub completed: u64,
    /// TTFT mean.
    pub ttft_mean: f64,
    /// TTFT p99.
    pub ttft_p99: f64,
    /// E2E mean.
    pub e2e_mean: f64,
    /// E2E p99.
    pub e2e_p99: f64,
    /// Mean ITL per output token: (E2E − TTFT) / (output − 1).
    pub itl_mean: f64,
}

impl RunStats {
    /// Of the completed streamed requests of `records` (times relative to
    /// each request's send).
    pub fn of(records: &[TraceRecord]) -> Self {
        let (mut t, mut e, mut i) = (Vec::new(), Vec::new(), Vec::new());
        for m in records.iter().filter_map(crate::fit::measured) {
            let Some(ttft) = m.ttft else { continue };
            t.push(ttft);
            e.push(m.e2e);
            i.extend(m.tpot);
        }
        let (ts, es) = (sorted(&t), sorted(&e));
        Self {
            requests: records.len() as u64,
            completed: e.len() as u64,
            ttft_mean: mean(&t),
            ttft_p99: percentile(&ts, 99.0),
            e2e_mean: mean(&e),
            e2e_p99: percentile(&es, 99.0),
            itl_mean: mean(&i),
        }
    }

    /// Whether the run is overloaded (mean TTFT above 10 s).
    pub fn overloaded(&self) -> bool {
        self.ttft_mean > OVERLOADED_TTFT_MS
    }

    /// (value, weight) of the metrics of the loss.
    fn metrics(&self) -> [(f64, f64); 5] {
        [
            (self.ttft_mean, 1.0),
            (self.ttft_p99, 0.5),
            (self.e2e_mean, 1.0),
            (self.e2e_p99, 0.5),
            (self.itl_mean, 1.0),
        ]
    }
}

/// The loss term `e_r²` of one run (see the module docs).
pub fn run_error_sq(real: &RunStats, sim: &RunStats) -> f64 {
    if sim.completed == 0 {
        return ERROR_CAP * ERROR_CAP;
    }
    let (mut num, mut den) = (0.0, 0.0);
    for ((r, w), (s, _)) in real.metrics().into_iter().zip(sim.metrics()) {
        if !(r > 0.0 && r.is_finite()) {
            continue;
        }
        let e = if s.is_finite() {
            ((s - r).abs() / r).min(ERROR_CAP)
        } else {
            ERROR_CAP
        };
        num += w * e * e;
        den += w;
    }
    if den > 0.0 { num / den } else { 0.0 }
}

/// The global coefficients: the physics terms' β and the host overheads.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PhysicsCoefficients {
    /// β in [`blis_replay::latency::physics::TERM_NAMES`] order.
    pub beta: [f64; TERMS],
    /// Queueing delay (µs), per input token (µs), output hop (µs).
    pub host: [f64; 3],
}

impl PhysicsCoefficients {
    /// The model of `basis` with these coefficients.
    pub fn model(&self, basis: &PhysicsBasis) -> Model {
        Model::TrainedPhysics(Box::new(TrainedPhysics {
            basis: basis.clone(),
            beta: self.beta.map(|b| b.max(0.0)),
            host: HostOverheads {
                queue_us: self.host[0].max(0.0),
                queue_per_input_token_us: self.host[1].max(0.0),
                output_hop_us: self.host[2].max(0.0),
            },
        }))
    }

    /// The global coefficients row (`model: "*"`): for every model on `gpu` (`*`: any),
    /// fitted with the step structure `async_scheduling`.
    pub fn row(&self, gpu: &str, async_scheduling: bool, source: String) -> CoefficientRow {
        let named = blis_replay::latency::physics::TERM_NAMES
            .iter()
            .zip(self.beta)
            .filter(|(_, b)| *b > 0.0)
            .map(|(n, b)| ((*n).to_string(), b))
            .collect();
        CoefficientRow {
            model: "*".into(),
            gpu: gpu.into(),
            tensor_parallel: 0,
            latency_model: LatencyKind::TrainedPhysics,
            alpha: self.host,
            beta: None,
            mfu_prefill: None,
            mfu_decode: None,
            overhead_us: None,
            allreduce_latency_us: None,
            terms: Some(named),
            async_scheduling: Some(async_scheduling),
            total_kv_blocks: None,
            source: Some(source),
        }
    }

    /// The coefficients of a trained-physics row.
    pub fn from_row(row: &CoefficientRow) -> Self {
        let mut beta = [0.0; TERMS];
        if let Some(t) = &row.terms {
            for (i, n) in blis_replay::latency::physics::TERM_NAMES.iter().enumerate() {
                beta[i] = t.get(*n).copied().unwrap_or(0.0);
            }
        }
        Self {
            beta,
            host: row.alpha,
        }
    }
}

/// Lower bounds of the coefficients: a step reads every weight and the
/// KV it attends to at least once, so it cannot take less than those bytes
/// over the peak bandwidth (the roofline's memory floor); the all-reduce
/// bytes cross the interconnect at its bandwidth; and no GEMM runs above
/// the peak FLOP rate (MFU ≤ 1), so the compute corrections are at least 1.
/// A term that is not fitted ([`FREE`]) stays at this value: for the
/// routed-expert GEMMs (1) and the prompts' causal attention (2.2) it is
/// the kernels' measured cost on an H100 (`docs/trained-physics.md`).
pub const FLOOR: [f64; TERMS] = [
    0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 2.2,
];

/// The terms whose coefficients are fitted; the others stay at their floor.
/// Chosen by leave-one-model-out cross-validation (each model's runs
/// predicted by a fit on the other models'; `docs/trained-physics.md`),
/// checked by leave-one-run-out. The KV term is fixed at its floor (KV
/// bytes read at peak bandwidth): free, it cannot be told from the
/// query-head attention term on grouped-query models alone, and the fit
/// without the multi-head Llama-2-7B predicted it 68% too slow (median ITL
/// error of the held-out models 8.3% with it free, 5.6% fixed). Also
/// measured and left out: a per-step constant and a per-request term
/// (fitted to 0), an all-reduce latency count (collinear with the
/// per-layer term on TP runs; the TP1 model −24%), the decode GEMMs
/// (fitted to 0). Prefill compute is regressed here with a ridge and
/// refined on TTFT by the replays. The routed-expert GEMMs are fixed at
/// their measured kernel cost (padded rows at peak FLOPs,
/// `replay/src/latency/physics.rs`); what the MoE runs' decode steps take
/// beyond it is the free decode-only expert term, so that it cannot
/// reach prefill.
pub const FREE: [bool; TERMS] = [
    false, true, false, false, true, false, true, false, true, false, false, false, true, false,
];

/// Physically plausible starting coefficients (weights read at ~90% of
/// peak bandwidth, compute at ~50% of peak, tens of µs per layer, request
/// and all-reduce), used before the first stage and where it lacks data.
pub const PRIOR: PhysicsCoefficients = PhysicsCoefficients {
    beta: [
        0.0, 60.0, 0.0, 0.0, 1.0, 1.0, 2.0, 0.0, 40.0, 1.0, 1.0, 0.0, 5.0, 2.2,
    ],
    host: [3000.0, 0.0, 1000.0],
};

/// One run prepared for replays.
#[derive(Debug, Clone)]
pub struct JointRun {
    /// Its name.
    pub name: String,
    /// Model id.
    pub model: String,
    trace: Trace,
    base: Resolved,
    basis: PhysicsBasis,
    /// The measured statistics.
    pub real: RunStats,
}

impl JointRun {
    /// Prepares `trace` (named `name`): its server from the header (and
    /// `args`, e.g. `--async-scheduling`).
    ///
    /// # Errors
    /// The server cannot be resolved (no model architecture), or too few
    /// completed requests.
    pub fn new(name: &str, trace: Trace, args: &ServerArgs) -> Result<Self, FitError> {
        let mut args = args.clone();
        args.latency = Some(LatencyKind::Roofline);
        let base = resolve(&args, Some(&trace.header)).map_err(|error| FitError::Setup {
            trace: name.to_string(),
            error,
        })?;
        let Model::Roofline(r) = &base.latency else {
            return Err(FitError::Options(format!(
                "{name}: no model architecture to compute physics terms"
            )));
        };
        let basis = PhysicsBasis::new(&r.arch, &r.hw, r.tp);
        let real = RunStats::of(&trace.records);
        if real.completed < crate::fit::MIN_FIT_REQUESTS as u64 {
            let completed = trace
                .records
                .iter()
                .filter(|r| crate::fit::measured(r).is_some())
                .count() as u64;
            if completed < crate::fit::MIN_FIT_REQUESTS as u64 {
                return Err(FitError::TooFew(name.to_string()));
            }
            return Err(FitError::TooFewStreamed {
                trace: name.to_string(),
                streamed: real.completed,
                completed,
            });
        }
        Ok(Self {
            name: name.to_string(),
            model: base.model.clone(),
            trace,
            base,
            basis,
            real,
        })
    }

    /// Replays the run with `model`; the predicted records.
    pub fn replay(&self, model: Model) -> Vec<TraceRecord> {
        let mut resolved = self.base.clone();
        resolved.latency = model;
        replay_records_in_memory(&self.trace.header, self.trace.records.clone(), &resolved)
    }

    /// The predicted statistics with coefficients `c`.
    pub fn predict(&self, c: &PhysicsCoefficients) -> RunStats {
        RunStats::of(&self.replay(c.model(&self.basis)))
    }

    /// The predicted statistics with `model` (e.g. another latency model).
    pub fn predict_with(&self, model: Model) -> RunStats {
        RunStats::of(&self.replay(model))
    }

    /// The trace.
    pub fn trace(&self) -> &Trace {
        &self.trace
    }

    /// The physics terms of the run's model and hardware.
    pub fn basis(&self) -> &PhysicsBasis {
        &self.basis
    }

    /// The resolved server (engine settings; its latency model is the
    /// roofline, the source of the architecture).
    pub fn server(&self) -> &Resolved {
        &self.base
    }
}

/// The first `fraction` of `trace`'s requests by arrival (ties by id): a
/// run that ends early, for fitting on its start and judging the rest.
pub fn first_part(mut trace: Trace, fraction: f64) -> Trace {
    let mut order: Vec<(i64, u64)> = trace
        .records
        .iter()
        .map(|r| (r.request.arrival_time_us, r.request.request_id))
        .collect();
    order.sort_unstable();
    let keep = ((order.len() as f64) * fraction.clamp(0.0, 1.0)).round() as usize;
    let kept: std::collections::BTreeSet<u64> = order[..keep].iter().map(|x| x.1).collect();
    trace
        .records
        .retain(|r| kept.contains(&r.request.request_id));
    trace
}

/// Predicts every run with `c`, `threads` at a time; results in run order.
pub fn predict_all(runs: &[&JointRun], c: &PhysicsCoefficients, threads: usize) -> Vec<RunStats> {
    parallel_map(runs, threads, |r| r.predict(c))
}

/// `f` over `items`, on up to `threads` threads, results in order. Items
/// are dealt to threads largest first (by request count) for balance.
fn parallel_map<T, F>(runs: &[&JointRun], threads: usize, f: F) -> Vec<T>
where
    T: Send + Default + Clone,
    F: Fn(&JointRun) -> T + Sync,
{
    let threads = threads.max(1).min(runs.len().max(1));
    if threads == 1 {
        return runs.iter().map(|r| f(r)).collect();
    }
    let mut order: Vec<usize> = (0..runs.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(runs[i].trace.records.len()));
    let mut buckets: Vec<(u64, Vec<usize>)> = vec![(0, Vec::new()); threads];
    for i in order {
        let b = buckets
            .iter_mut()
            .min_by_key(|b| b.0)
            .expect("at least one thread");
        b.0 += runs[i].trace.records.len() as u64;
        b.1.push(i);
    }
    let mut out = vec![T::default(); runs.len()];
    std::thread::scope(|s| {
        let handles: Vec<_> = buckets
            .iter()
            .map(|(_, idx)| {
                let f = &f;
                s.spawn(move || idx.iter().map(|&i| (i, f(runs[i]))).collect::<Vec<_>>())
            })
            .collect();
        for h in handles {
            for (i, v) in h.join().expect("a replay thread panicked") {
                out[i] = v;
            }
        }
    });
    out
}

/// The loss of predictions `sim` of `runs` (module docs).
pub fn loss(runs: &[&JointRun], sim: &[RunStats], overloaded_weight: f64) -> f64 {
    let (mut num, mut den) = (0.0, 0.0);
    for (r, s) in runs.iter().zip(sim) {
        let v = if r.real.overloaded() {
            overloaded_weight
        } else {
            1.0
        };
        num += v * run_error_sq(&r.real, s);
        den += v;
    }
    if den > 0.0 { (num / den).sqrt() } else { 0.0 }
}

// ---------------------------------------------------------------- stage 1

/// One completed request of a run, times in µs since the run start.
#[derive(Debug, Clone, Copy)]
struct Interval {
    first: f64,
    last: f64,
    input: f64,
    output: f64,
    /// Prompt tokens found in the prefix cache (from a replay).
    cached: f64,
}

/// The share of a run's span whose requests' decode intervals are
/// regressed: those whose first token came in its first three quarters. A
/// long run's last stretch carries slow changes of the server that no
/// stationary step model has: the real Mixtral-8x7B reasoning run decodes
/// 22% slower in its last sixth than in its first at the same full batch
/// of 128, Llama-2-70B's 10% (`blis_calibrate::decode_drift`, the
/// benchmark's last table), and the MoE decode term fitted to those slow
/// steps made Mixtral's other run 15% too slow. Chosen among 1/3, 1/2, 3/4
/// and the whole span by both cross-validations (docs/trained-physics.md):
/// leave-one-model-out unchanged (RMS of the per-run mean errors 9.34%
/// against 9.33%), leave-one-run-out 9.10% against 9.50% with its ITL
/// median 4.0% against 5.8%.
const FIT_SPAN: f64 = 0.75;

/// The rows of the decode-interval regression of one run: per request,
/// the mean physics terms of its decode steps, and its mean step time.
fn decode_rows(run: &JointRun, cached: &[(u64, u32)]) -> Vec<([f64; TERMS], f64)> {
    let (iv, t_fail) = decode_intervals(run, cached);
    if iv.len() < 30 {
        return Vec::new();
    }
    let lo = iv.iter().map(|x| x.1.first).fold(f64::INFINITY, f64::min);
    let hi = iv
        .iter()
        .map(|x| x.1.last)
        .fold(f64::NEG_INFINITY, f64::max)
        .min(t_fail);
    if hi <= lo {
        return Vec::new();
    }
    // (A trace whose decode intervals span more than the grid's cells at
    // 5 ms, 83 minutes, gets longer cells: one request recorded as lasting
    // centuries asked for 14 TB.)
    let dt = GRID_CELL_US.max((hi - lo) / MAX_GRID_CELLS);
    let grid = Grid {
        lo,
        dt,
        n: ((hi - lo) / dt).ceil() as usize + 2,
    };
    let e = &run.base.engine;
    let capacity = f64::from(e.total_kv_blocks) * f64::from(e.block_size);
    let (cum, over) = decode_terms_on_grid(&iv, &grid, &run.basis, capacity);
    let (pf, pf_cum) = prefill_terms(&iv, &run.basis);
    let mut rows = Vec::new();
    // The first requests meet an engine still warming up.
    let cut = lo + (hi - lo) * FIT_SPAN;
    for (_, v) in iv.iter().skip(20) {
        if v.last >= hi || v.first > cut {
            continue;
        }
        let (ka, kb) = (grid.cell(v.first), grid.cell(v.last));
        // Where the rebuilt batch holds more tokens than the KV cache, some
        // of those requests were preempted, not decoding: the rebuild is
        // not the batch that ran.
        if kb <= ka + 1 || over[kb] > over[ka] {
            continue;
        }
        let span = (kb - ka) as f64 * grid.dt;
        let steps = v.output - 1.0;
        let pa = pf.partition_point(|p| *p <= v.first);
        let pb = pf.partition_point(|p| *p <= v.last);
        let mut row = [0.0; TERMS];
        for j in 0..TERMS {
            row[j] = (cum[kb][j] - cum[ka][j]) / span + (pf_cum[pb][j] - pf_cum[pa][j]) / steps;
        }
        rows.push((row, (v.last - v.first) / steps));
    }
    rows
}

/// The decode intervals of a run's completed requests with at least two
/// output tokens, by send time (µs since the run start), and the first
/// send of a failed request (the engine's state is unknown from then on;
/// infinite when none failed).
fn decode_intervals(run: &JointRun, cached: &[(u64, u32)]) -> (Vec<(f64, Interval)>, f64) {
    let run_start = run.trace.header.run_start_unix_us.unwrap_or(0);
    let cached_of = |id: u64| {
        cached
            .binary_search_by_key(&id, |x| x.0)
            .map_or(0.0, |i| f64::from(cached[i].1))
    };
    let t_fail = run
        .trace
        .records
        .iter()
        .filter(|r| r.outcome.status != Some(Status::Ok))
        .map(|r| {
            r.outcome
                .send_time_us
                .map_or(r.request.arrival_time_us as f64, |s| (s - run_start) as f64)
        })
        .fold(f64::INFINITY, f64::min);
    let mut iv: Vec<(f64, Interval)> = Vec::new();
    for r in &run.trace.records {
        let o = &r.outcome;
        if o.status != Some(Status::Ok) {
            continue;
        }
        let (Some(s), Some(f), Some(l)) =
            (o.send_time_us, o.first_chunk_time_us, o.last_chunk_time_us)
        else {
            continue;
        };
        if r.request.output_tokens < 2 || l <= f {
            continue;
        }
        iv.push((
            (s - run_start) as f64,
            Interval {
                first: (f - run_start) as f64,
                last: (l - run_start) as f64,
                input: f64::from(r.effective_input_tokens()),
                output: f64::from(r.request.output_tokens),
                cached: cached_of(r.request.request_id),
            },
        ));
    }
    iv.sort_by(|a, b| a.0.total_cmp(&b.0));
    (iv, t_fail)
}

/// The cell of the decode-batch grid, µs: shorter than a vLLM decode step
/// of a loaded server (tens of ms), long enough to keep the grid small.
const GRID_CELL_US: f64 = 5_000.0;

/// The most cells of the decode-batch grid (its running sums of the
/// physics terms take 120 bytes a cell: 120 MB); a run longer than
/// 1,000,000 cells of [`GRID_CELL_US`] gets longer cells.
const MAX_GRID_CELLS: f64 = 1_000_000.0;

/// A time grid of `n` cells of `dt` µs from `lo`.
struct Grid {
    lo: f64,
    dt: f64,
    n: usize,
}

impl Grid {
    fn cell(&self, t: f64) -> usize {
        (((t - self.lo) / self.dt).floor().max(0.0) as usize).min(self.n)
    }
}

/// The decode batch on `grid`: D(t) and C(t) = A(t) + t·B(t), from
/// difference arrays of each interval's count, context offset and rate;
/// returns the cumulative integral of its physics terms (µs·term) at each
/// cell boundary, and the cumulative count of cells whose batch holds more
/// than `capacity` KV tokens (0: unknown).
fn decode_terms_on_grid(
    iv: &[(f64, Interval)],
    grid: &Grid,
    basis: &PhysicsBasis,
    capacity: f64,
) -> (Vec<[f64; TERMS]>, Vec<u32>) {
    let n = grid.n;
    let (mut dd, mut da, mut db) = (vec![0.0; n + 1], vec![0.0; n + 1], vec![0.0; n + 1]);
    for (_, v) in iv {
        let itl = (v.last - v.first) / (v.output - 1.0);
        let (a, b) = (grid.cell(v.first), grid.cell(v.last));
        dd[a] += 1.0;
        dd[b] -= 1.0;
        da[a] += v.input - v.first / itl;
        da[b] -= v.input - v.first / itl;
        db[a] += 1.0 / itl;
        db[b] -= 1.0 / itl;
    }
    let mut cum = vec![[0.0; TERMS]; n + 1];
    let mut over = vec![0u32; n + 1];
    let (mut d, mut a, mut b) = (0.0f64, 0.0f64, 0.0f64);
    let mut shape = BatchShape::default();
    let mut x = [0.0; TERMS];
    for k in 0..n {
        d += dd[k];
        a += da[k];
        b += db[k];
        let t = grid.lo + (k as f64 + 0.5) * grid.dt;
        shape.clear();
        shape.decode_count = d.round().max(0.0) as u32;
        shape.decode_context_sum = (a + t * b).max(0.0).round() as u64;
        let held = shape.decode_context_sum as f64 + f64::from(shape.decode_count);
        over[k + 1] = over[k] + u32::from(capacity > 0.0 && held > capacity);
        if shape.decode_count > 0 {
            basis.terms(&shape, &mut x);
        } else {
            x = [0.0; TERMS];
        }
        let mut next = cum[k];
        for j in 0..TERMS {
            next[j] += x[j] * grid.dt;
        }
        cum[k + 1] = next;
    }
    (cum, over)
}

/// Prefill events at their first token, in time order, and the
/// cumulative sums of the terms each adds to a step that runs anyway.
fn prefill_terms(iv: &[(f64, Interval)], basis: &PhysicsBasis) -> (Vec<f64>, Vec<[f64; TERMS]>) {
    let mut shape = BatchShape::default();
    let mut x = [0.0; TERMS];
    let mut pf: Vec<(f64, [f64; TERMS])> = Vec::with_capacity(iv.len());
    for (_, v) in iv {
        shape.clear();
        let before = v.cached.min(v.input - 1.0).max(0.0);
        shape.prefill.push(PrefillChunk {
            computed_before: before as u32,
            new_tokens: (v.input - before).max(1.0) as u32,
        });
        basis.terms(&shape, &mut x);
        let mut y = [0.0; TERMS];
        // Only what a prefill adds to a step that runs anyway: its
        // request, KV, GEMMs, expert rows, all-reduce bytes and attention
        // (decode attention, term 8, is 0 for a prefill).
        for j in [3usize, 5, 6, 9, 10, 13] {
            y[j] = x[j];
        }
        pf.push((v.first, y));
    }
    pf.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut pf_cum = vec![[0.0; TERMS]; pf.len() + 1];
    for (k, (_, y)) in pf.iter().enumerate() {
        let mut next = pf_cum[k];
        for j in 0..TERMS {
            next[j] += y[j];
        }
        pf_cum[k + 1] = next;
    }
    (pf.into_iter().map(|p| p.0).collect(), pf_cum)
}

/// Stage 1: the decode-interval regression over `runs` (each weighted
/// alike), starting from the prefix-cache hits of a replay with `start`.
/// Terms no run informs (the routed-expert term without an MoE run)
/// stay at their physical floor: nothing held out leaks in through a prior.
pub fn stage1(
    runs: &[&JointRun],
    start: &PhysicsCoefficients,
    threads: usize,
) -> PhysicsCoefficients {
    let cached: Vec<Vec<(u64, u32)>> = parallel_map(runs, threads, |r| {
        let mut c: Vec<(u64, u32)> = r
            .replay(start.model(&r.basis))
            .iter()
            .map(|x| (x.request.request_id, x.outcome.cached_tokens.unwrap_or(0)))
            .collect();
        c.sort_unstable();
        c
    });
    let fixed = FLOOR;
    let mut g = vec![vec![0.0; TERMS]; TERMS];
    let mut c = [0.0; TERMS];
    let mut used = 0;
    for (r, cached) in runs.iter().zip(&cached) {
        let rows = decode_rows(r, cached);
        if rows.is_empty() {
            continue;
        }
        used += 1;
        let w = 1.0 / rows.len() as f64;
        for (x, y) in &rows {
            // What the floors already explain is taken off the target; the
            // rest is regressed on β − floor ≥ 0, relative to the target.
            let base: f64 = x.iter().zip(&fixed).map(|(x, f)| x * f).sum();
            let rest = (y - base) / y;
            for i in 0..TERMS {
                let xi = x[i] / y;
                c[i] += w * xi * rest;
                for j in 0..TERMS {
                    g[i][j] += w * xi * x[j] / y;
                }
            }
        }
    }
    if used == 0 {
        return *start;
    }
    // The stage-2 terms (prefill compute) enter with a ridge toward
    // `start`'s value: prefill chunks inside decode intervals inform them
    // only where prompts are not cached; a run whose prefills are a
    // percent of its steps outweighs the ridge.
    let ridge = STAGE2_RIDGE * f64::from(used);
    for i in 0..TERMS {
        if FREE[i] && STAGE2_TERMS.contains(&TERM_NAMES[i]) && g[i][i] > 0.0 {
            g[i][i] += ridge;
            c[i] += ridge * (start.beta[i] - FLOOR[i]).max(0.0);
        }
    }
    // The free terms that some row varies; the others (e.g. the expert
    // term without an MoE run) and the fixed ones stay at their floor.
    let cols: Vec<usize> = (0..TERMS).filter(|&i| FREE[i] && g[i][i] > 0.0).collect();
    let gs: Vec<Vec<f64>> = cols
        .iter()
        .map(|&i| cols.iter().map(|&j| g[i][j]).collect())
        .collect();
    let cs: Vec<f64> = cols.iter().map(|&i| c[i]).collect();
    let beta = nnls(&gs, &cs);
    let mut out = *start;
    for i in 0..TERMS {
        out.beta[i] = if STAGE2_TERMS.contains(&TERM_NAMES[i]) {
            start.beta[i].max(FLOOR[i])
        } else {
            FLOOR[i]
        };
    }
    for (k, &i) in cols.iter().enumerate() {
        out.beta[i] = FLOOR[i] + beta[k];
    }
    out
}

// ---------------------------------------------------------------- stage 2

/// The result of a joint fit.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JointFit {
    /// The runs fitted on.
    pub runs: Vec<String>,
    /// The coefficients after stage 1.
    pub stage1: PhysicsCoefficients,
    /// The fitted coefficients.
    pub fitted: PhysicsCoefficients,
    /// Loss after stage 1 and at the end.
    pub loss: [f64; 2],
    /// Replays of the whole set of runs in stage 2.
    pub evaluations: u64,
    /// Per run: real and predicted statistics with the fitted coefficients.
    pub per_run: Vec<(String, RunStats, RunStats)>,
}

struct Stage2<'a> {
    runs: &'a [&'a JointRun],
    /// The fitted terms: `u[k]` scales `FREE` term `terms[k]`; the last two
    /// are the queueing delay and the output hop.
    terms: Vec<usize>,
    /// Coefficients of the terms not fitted here.
    base: [f64; TERMS],
    scale: Vec<f64>,
    threads: usize,
    overloaded_weight: f64,
    evals: Cell<u64>,
}

impl Stage2<'_> {
    fn coefficients(&self, u: &[f64]) -> PhysicsCoefficients {
        let t: Vec<f64> = u
            .iter()
            .zip(&self.scale)
            .map(|(u, s)| u.abs() * s)
            .collect();
        let mut beta = self.base;
        for (k, &i) in self.terms.iter().enumerate() {
            beta[i] = FLOOR[i] + t[k];
        }
        let n = self.terms.len();
        PhysicsCoefficients {
            beta,
            host: [t[n], 0.0, t[n + 1]],
        }
    }

    /// One replay of every run with `c` (counted): the optimiser's cost
    /// (a loss that is not finite counts as 1e9) and the predictions.
    fn evaluate(&self, c: &PhysicsCoefficients) -> (f64, Vec<RunStats>) {
        self.evals.set(self.evals.get() + 1);
        let sims = predict_all(self.runs, c, self.threads);
        let l = loss(self.runs, &sims, self.overloaded_weight);
        (if l.is_finite() { l } else { 1e9 }, sims)
    }
}

impl CostFunction for Stage2<'_> {
    type Param = Vec<f64>;
    type Output = f64;

    fn cost(&self, u: &Vec<f64>) -> Result<f64, argmin::core::Error> {
        Ok(self.evaluate(&self.coefficients(u)).0)
    }
}

/// Fits the global coefficients on `runs` as `o` says (at most `o.budget`
/// replays of the whole set in stage 2). `progress` gets a line per stage
/// and round.
///
/// # Errors
/// No runs, a bad option, or an optimiser failure.
pub fn fit_joint(
    runs: &[&JointRun],
    o: &JointOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<JointFit, FitError> {
    o.validate()?;
    let (budget, threads) = (o.budget, o.threads);
    if runs.is_empty() {
        return Err(FitError::Options("no runs to fit on".into()));
    }
    let s1 = stage1(runs, &PRIOR, threads);
    progress(&format!("stage 1 (decode intervals): {}", describe(&s1)));
    let (mut fitted, loss1, mut evals) = stage2(runs, &s1, o, budget, progress)?;
    // Prefill chunks share steps with decodes: when the replays moved a
    // stage-2 term far from what stage 1 assumed, the decode intervals are
    // regressed again with it, and stage 2 refines from there.
    let moved = (0..TERMS).any(|i| {
        STAGE2_TERMS.contains(&TERM_NAMES[i])
            && (fitted.beta[i] - s1.beta[i]).abs() > 0.1 * s1.beta[i].max(1e-9)
    });
    if moved {
        let again = stage1(runs, &fitted, threads);
        progress(&format!(
            "stage 1 again, with the replays' prefill: {}",
            describe(&again)
        ));
        let (f, _, e) = stage2(runs, &again, o, budget.div_ceil(2), progress)?;
        fitted = f;
        evals += e;
    }
    let sims = predict_all(runs, &fitted, threads);
    Ok(JointFit {
        runs: runs.iter().map(|r| r.name.clone()).collect(),
        stage1: s1,
        fitted,
        loss: [loss1, loss(runs, &sims, o.overloaded_weight)],
        evaluations: evals,
        per_run: runs
            .iter()
            .zip(sims)
            .map(|(r, s)| (r.name.clone(), r.real, s))
            .collect(),
    })
}

/// Stage 2 from stage 1's `s1` with at most `budget` replays of every run:
/// the coefficients, the loss at `s1`, and the replays made.
fn stage2(
    runs: &[&JointRun],
    s1: &PhysicsCoefficients,
    o: &JointOptions,
    budget: u64,
    progress: &mut dyn FnMut(&str),
) -> Result<(PhysicsCoefficients, f64, u64), FitError> {
    let (problem, mut best_u) = Stage2::around(runs, s1, o);
    let n_terms = problem.terms.len();
    let mut best = problem.cost(&best_u).unwrap_or(f64::INFINITY);
    let loss1 = best;
    progress(&format!("stage 1 loss {loss1:.4}"));
    // The host overheads first (TTFT), then every parameter.
    let mut grid: &[f64] = &[0.0, 0.25, 0.5, 0.75, 1.25, 1.6, 2.5, 4.0];
    let mut step = 0.3;
    let mut round = 0;
    while problem.evals.get() < budget {
        round += 1;
        let round_start = best;
        let order: Vec<usize> = if round == 1 {
            vec![n_terms, n_terms + 1]
        } else {
            (0..best_u.len()).collect()
        };
        crate::fit::coordinate_sweep(
            order,
            grid,
            0.05,
            &|u| problem.cost(&u.to_vec()).unwrap_or(f64::INFINITY),
            &|| problem.evals.get() < budget,
            &mut best_u,
            &mut best,
        );
        progress(&format!(
            "round {round}: coordinate search, loss {best:.4} ({} replays of {} runs)",
            problem.evals.get(),
            runs.len()
        ));
        if round == 1 {
            continue;
        }
        if problem.evals.get() >= budget {
            break;
        }
        let left = budget - problem.evals.get();
        nelder_mead_round(&problem, step, left, &mut best_u, &mut best)?;
        progress(&format!(
            "round {round}: Nelder–Mead, loss {best:.4} ({} replays of {} runs)",
            problem.evals.get(),
            runs.len()
        ));
        if best >= round_start * (1.0 - 1e-3) {
            break;
        }
        step = (step * 0.6).max(0.05);
        grid = &[0.0, 0.6, 0.8, 0.9, 1.1, 1.25, 1.6];
    }
    host_shift(&problem, &mut best_u, &mut best, progress);
    Ok((problem.coefficients(&best_u), loss1, problem.evals.get()))
}

/// The queueing delay and the output hop add once to every TTFT and E2E,
/// so their sum is set by the mean TTFT: a closing Newton step moves the
/// queueing delay by the mean of (real − predicted) mean TTFT over the runs
/// that are not overloaded, while the loss improves (at most 3 steps; the
/// searches' grids are coarse in it).
fn host_shift(
    problem: &Stage2<'_>,
    best_u: &mut [f64],
    best: &mut f64,
    progress: &mut dyn FnMut(&str),
) {
    let n = problem.terms.len();
    // The predictions at the best point, then those of each step taken.
    let mut sims = predict_all(problem.runs, &problem.coefficients(best_u), problem.threads);
    for _ in 0..3 {
        let c = problem.coefficients(best_u);
        let d: Vec<f64> = problem
            .runs
            .iter()
            .zip(&sims)
            .filter(|(r, s)| !r.real.overloaded() && s.completed > 0 && s.ttft_mean.is_finite())
            .map(|(r, s)| (r.real.ttft_mean - s.ttft_mean) * 1e3)
            .collect();
        if d.is_empty() {
            return;
        }
        let shift = d.iter().sum::<f64>() / d.len() as f64;
        let queue = (c.host[0] + shift).max(0.0);
        if (queue - c.host[0]).abs() < 1.0 {
            return;
        }
        let mut u = best_u.to_vec();
        u[n] = queue / problem.scale[n];
        let (l, at_u) = problem.evaluate(&problem.coefficients(&u));
        if l >= *best {
            return;
        }
        sims = at_u;
        progress(&format!(
            "host shift: queueing delay {:.0} → {queue:.0} µs, loss {l:.4}",
            c.host[0]
        ));
        best_u.copy_from_slice(&u);
        *best = l;
    }
}

impl<'a> Stage2<'a> {
    /// Stage 2 around stage 1's fit `s1`: each stage-2 term's excess over
    /// its floor, and the two host overheads, scaled so that 1 is stage 1's
    /// value (a term stage 1 put at its floor starts at 0 with the prior's
    /// excess as its unit). Returns the problem and its starting point.
    fn around(
        runs: &'a [&'a JointRun],
        s1: &PhysicsCoefficients,
        o: &JointOptions,
    ) -> (Self, Vec<f64>) {
        let terms: Vec<usize> = (0..TERMS)
            .filter(|&i| STAGE2_TERMS.contains(&TERM_NAMES[i]))
            .collect();
        let excess: Vec<f64> = terms.iter().map(|&i| s1.beta[i] - FLOOR[i]).collect();
        let scale: Vec<f64> = excess
            .iter()
            .zip(&terms)
            .map(|(e, &i)| {
                if *e > 0.0 {
                    *e
                } else {
                    (PRIOR.beta[i] - FLOOR[i]).max(0.05)
                }
            })
            .chain([PRIOR.host[0], PRIOR.host[2]])
            .collect();
        let start: Vec<f64> = excess
            .iter()
            .map(|e| if *e > 0.0 { 1.0 } else { 0.0 })
            .chain([1.0, 1.0])
            .collect();
        let problem = Stage2 {
            runs,
            terms,
            base: s1.beta,
            scale,
            threads: o.threads,
            overloaded_weight: o.overloaded_weight,
            evals: Cell::new(0),
        };
        (problem, start)
    }
}

/// One Nelder–Mead search on the parameters of `best_u` that are not 0,
/// from a simplex of relative size `step`, with at most about `left`
/// replays; keeps its result in `best_u`/`best` when it is better.
fn nelder_mead_round(
    problem: &Stage2<'_>,
    step: f64,
    left: u64,
    best_u: &mut [f64],
    best: &mut f64,
) -> Result<(), FitError> {
    let active: Vec<usize> = (0..best_u.len()).filter(|&i| best_u[i] != 0.0).collect();
    let base = best_u.to_vec();
    let mut simplex = vec![active.iter().map(|&i| base[i]).collect::<Vec<f64>>()];
    for k in 0..active.len() {
        let mut v = simplex[0].clone();
        v[k] *= 1.0 + step;
        simplex.push(v);
    }
    let sub = crate::fit::Restricted {
        inner: problem,
        base,
        free: active.clone(),
    };
    let solver = NelderMead::new(simplex)
        .with_sd_tolerance(1e-6)
        .map_err(|e| FitError::Optimiser(e.to_string()))?;
    let res = Executor::new(sub, solver)
        .configure(|s| s.max_iters(left / 2 + 1))
        .run()
        .map_err(|e| FitError::Optimiser(e.to_string()))?;
    if let Some(v) = res.state().get_best_param().cloned() {
        let cost = res.state().get_best_cost();
        if cost < *best {
            *best = cost;
            for (k, &i) in active.iter().enumerate() {
                best_u[i] = v[k];
            }
        }
    }
    Ok(())
}

/// The coefficients as a Markdown table (name, meaning, value).
pub fn coefficients_table(c: &PhysicsCoefficients) -> String {
    let mut o = String::from("| term | what (unit) | fitted |\n|---|---|---:|\n");
    for ((n, m), b) in blis_replay::latency::physics::TERM_NAMES
        .iter()
        .zip(blis_replay::latency::physics::TERM_MEANINGS)
        .zip(c.beta)
    {
        o.push_str(&format!("| {n} | {m} | {b:.4} |\n"));
    }
    for (n, m, v) in [
        (
            "alpha[0]",
            "queueing delay: arrival to the scheduler (µs)",
            c.host[0],
        ),
        ("alpha[1]", "queueing delay per input token (µs)", c.host[1]),
        (
            "alpha[2]",
            "output hop: a token to the client (µs)",
            c.host[2],
        ),
    ] {
        o.push_str(&format!("| {n} | {m} | {v:.1} |\n"));
    }
    o
}

/// The coefficients on one line.
pub fn describe(c: &PhysicsCoefficients) -> String {
    let mut parts: Vec<String> = blis_replay::latency::physics::TERM_NAMES
        .iter()
        .zip(c.beta)
        .filter(|(_, b)| *b > 0.0)
        .map(|(n, b)| format!("{n} {b:.4}"))
        .collect();
    parts.push(format!(
        "queue {:.0} µs, output hop {:.0} µs",
        c.host[0], c.host[2]
    ));
    parts.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_part_keeps_the_earliest_arrivals() {
        let mut t = Trace::new(
            blis_traces::TraceHeader::new(blis_traces::Mode::Replayed),
            Vec::new(),
        );
        for (id, at) in [(0u64, 50i64), (1, 10), (2, 40), (3, 20), (4, 30)] {
            t.records.push(TraceRecord::planned(blis_traces::Request {
                request_id: id,
                arrival_time_us: at,
                ..Default::default()
            }));
        }
        let ids: Vec<u64> = first_part(t.clone(), 0.6)
            .records
            .iter()
            .map(|r| r.request.request_id)
            .collect();
        assert_eq!(ids, [1, 3, 4], "arrivals 10, 20, 30 in file order");
        assert_eq!(first_part(t.clone(), 1.0).records.len(), 5);
        assert!(first_part(t, 0.0).records.is_empty());
    }
}
