//! `benchmark`: how accurate is the simulator on real runs it was not
//! fitted on? Every run of a folder (see [`crate::runs`]) is predicted by
//! one latency model and compared with what was measured, each side over
//! its own completed requests (the statistics of [`RunStats`]):
//!
//! - `trained-physics` (the default): leave-one-run-out. Each run is
//!   predicted by a joint fit ([`crate::joint`]) on every *other* run of
//!   the folder, of every model; with `--fit-on DIR2`, by one joint fit on
//!   the runs of DIR2.
//! - `blackbox`: each run is predicted by coefficients fitted on the other
//!   runs of the *same* model (or of DIR2), as [`crate::fit`] does.
//! - `blis-physics`: BLIS's published global coefficients, nothing fitted.
//! - `roofline`: the analytical model, nothing fitted.
//!
//! Requests are replayed from the plan: a run's recorded failures never
//! enter a prediction, and requests past the client's timeout are
//! cancelled (see `blis_replay::run`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use blis_replay::latency::coefficients::{CoefficientRow, LatencyKind};
use blis_replay::latency::physics::BlisPhysics;
use blis_replay::latency::{Blackbox, Model};
use blis_replay::setup::ServerArgs;
use blis_traces::{Status, TraceRecord};
use serde::Serialize;

use crate::fit::{FitTrace, fit, server_args};
use crate::goodput::{DeadlineCliff, client_timeout_us, deadline_cliff};
use crate::joint::{JointOptions, JointRun, OVERLOADED_TTFT_MS, RunStats, describe, fit_joint};
use crate::runs::{RunDir, runs_in, workload_of};

/// Real and predicted mean and p99 of one latency, ms.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct MeanP99 {
    /// Real mean.
    pub real_mean: f64,
    /// Predicted mean.
    pub sim_mean: f64,
    /// Real p99.
    pub real_p99: f64,
    /// Predicted p99.
    pub sim_p99: f64,
}

/// Real and predicted mean ITL per generated token, ms.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct MeanOnly {
    /// Real mean.
    pub real_mean: f64,
    /// Predicted mean.
    pub sim_mean: f64,
}

/// One predicted run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunResult {
    /// The run's folder name.
    pub name: String,
    /// Model id.
    pub model: String,
    /// Workload (from the folder name).
    pub workload: String,
    /// Requests of the run.
    pub requests: u64,
    /// Completed (`ok`) requests, real / predicted.
    pub completed: [u64; 2],
    /// Requests that ran past the client's timeout, real / predicted.
    pub timed_out: [u64; 2],
    /// TTFT, each side over its own completed requests.
    pub ttft: MeanP99,
    /// E2E, each side over its own completed requests.
    pub e2e: MeanP99,
    /// ITL per generated token: (E2E − TTFT) / (output − 1), averaged over
    /// requests.
    pub itl: MeanOnly,
    /// Per-request E2E MAPE over the requests completed on both sides, %.
    pub e2e_mape: f64,
    /// Saturated (mean TTFT above 10 s), real / predicted.
    pub saturated: [bool; 2],
    /// The runs the coefficients were fitted on (empty: nothing fitted).
    pub fitted_on: Vec<String>,
    /// The coefficients used (none for roofline and blis-physics).
    pub coefficients: Option<CoefficientRow>,
    /// Of a run saturated in reality under a client timeout: the deadline
    /// cliff of each side, real / predicted ([`crate::goodput`]).
    pub cliff: Option<[Option<DeadlineCliff>; 2]>,
    /// Each side's decode time per token over the run
    /// ([`crate::decode_drift`]); `None` for a run too short to tell.
    pub decode_over_run: Option<crate::decode_drift::DecodeOverRun>,
}

/// Median absolute relative errors over the predicted runs, %.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Default)]
pub struct Summary {
    /// Runs predicted.
    pub runs: usize,
    /// Median |sim − real| / real of the mean TTFT.
    pub ttft_mean: f64,
    /// Of the p99 TTFT.
    pub ttft_p99: f64,
    /// Of the mean E2E.
    pub e2e_mean: f64,
    /// Of the p99 E2E.
    pub e2e_p99: f64,
    /// Of the mean ITL per token.
    pub itl_mean: f64,
    /// Median per-request E2E MAPE.
    pub e2e_mape: f64,
    /// Runs predicted saturated that are not, or the reverse.
    pub saturation_mismatches: usize,
    /// Of the runs saturated in reality: the largest |sim − real| / real
    /// of their completed-request counts, % (the capacity a user plans
    /// with; NaN when none is saturated).
    pub saturated_completed_max: f64,
}

/// The benchmark's result.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BenchmarkReport {
    /// The latency model (`trained-physics`, `blackbox`, `blis-physics`,
    /// `roofline`).
    pub latency_model: String,
    /// How the coefficients were obtained.
    pub protocol: String,
    /// The medians over the runs.
    pub summary: Summary,
    /// One entry per predicted run.
    pub runs: Vec<RunResult>,
    /// Runs that could not be predicted, with the reason.
    pub skipped: Vec<(String, String)>,
}

/// What a trained-physics fit of the benchmark leaves out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Folds {
    /// Leave-one-run-out: each run predicted by a fit on every other run.
    #[default]
    Run,
    /// Leave-one-model-out: each run predicted by a fit on the runs of
    /// every other model.
    Model,
}

/// What to benchmark.
#[derive(Debug, Clone)]
pub struct BenchmarkOptions {
    /// The latency model.
    pub latency: LatencyKind,
    /// The trained-physics fits; its budget is also each blackbox fit's
    /// (replays of each run).
    pub joint: JointOptions,
    /// vLLM's `--async-scheduling` for the replays (None: trained-physics
    /// on, as it is fitted; the others the trace header's, else off).
    pub async_scheduling: Option<bool>,
    /// What a trained-physics fit leaves out (without `fit_on`).
    pub folds: Folds,
}

/// The server arguments a run is replayed with.
fn args_for(run: &RunDir, o: &BenchmarkOptions) -> ServerArgs {
    let mut a = server_args(None, None, o.latency, None, &run.trace.header);
    a.async_scheduling = o.async_scheduling.or(match o.latency {
        LatencyKind::TrainedPhysics => Some(true),
        _ => None,
    });
    a
}

/// Runs the benchmark on the runs of `dir`, fitting on `fit_on` (default:
/// leave-one-run-out within `dir`). `progress` receives one line per step.
///
/// # Errors
/// An unreadable folder.
pub fn benchmark(
    dir: &Path,
    fit_on: Option<&Path>,
    o: &BenchmarkOptions,
    progress: &mut dyn FnMut(&str),
) -> std::io::Result<BenchmarkReport> {
    let mut skipped = Vec::new();
    let targets = prepare(runs_in(dir, &mut skipped)?, o, &mut skipped);
    let pool = match fit_on {
        Some(d) => prepare(runs_in(d, &mut skipped)?, o, &mut skipped),
        None => Vec::new(),
    };
    let pool: &[(RunDir, JointRun)] = if fit_on.is_some() { &pool } else { &targets };
    let protocol = protocol(o.latency, fit_on.is_some(), o.folds);
    let mut fits = Fits {
        pool,
        fit_on: fit_on.is_some(),
        o,
        physics: BTreeMap::new(),
        blackbox: BTreeMap::new(),
    };
    let mut results = Vec::new();
    for (run, jr) in &targets {
        let predictor = match o.latency {
            LatencyKind::Roofline => Ok((jr.server().latency.clone(), Vec::new(), None)),
            LatencyKind::BlisPhysics => match &jr.server().latency {
                Model::Roofline(r) => Ok((
                    Model::BlisPhysics(Box::new(BlisPhysics::published(&r.arch, &r.hw, r.tp))),
                    Vec::new(),
                    None,
                )),
                _ => Err("no model architecture".to_string()),
            },
            LatencyKind::TrainedPhysics => fits.physics(run, jr, progress),
            LatencyKind::Blackbox => fits.blackbox(run, &mut skipped, progress),
            LatencyKind::StepTable => Err(
                "step-table is fitted per server from its own streamed tokens; benchmark blackbox or trained-physics".into(),
            ),
        };
        let (model, fitted_on, row) = match predictor {
            Ok(p) => p,
            Err(why) => {
                skipped.push((run.name.clone(), why));
                continue;
            }
        };
        progress(&format!("predicting {}", run.name));
        let sim_records = jr.replay(model);
        let sim = RunStats::of(&sim_records);
        results.push(result_of(run, jr, &sim, &sim_records, fitted_on, row));
    }
    let summary = summarise(&results);
    Ok(BenchmarkReport {
        latency_model: o.latency.name().to_string(),
        protocol,
        summary,
        runs: results,
        skipped,
    })
}

/// How the runs are predicted, in words, for the report.
fn protocol(latency: LatencyKind, fit_on: bool, folds: Folds) -> String {
    match (latency, fit_on) {
        (LatencyKind::TrainedPhysics, false) if folds == Folds::Model => {
            "leave-one-model-out: each run predicted by one joint fit on the runs of every other model of the folder"
        }
        (LatencyKind::TrainedPhysics, false) => {
            "leave-one-run-out: each run predicted by one joint fit on every other run of the folder (all models)"
        }
        (LatencyKind::TrainedPhysics, true) => {
            "one joint fit on every run of the --fit-on folder (all models)"
        }
        (LatencyKind::Blackbox, false) => {
            "each run predicted by coefficients fitted on the other runs of its model"
        }
        (LatencyKind::Blackbox, true) => {
            "each run predicted by coefficients fitted on the --fit-on runs of its model"
        }
        (LatencyKind::BlisPhysics, _) => "BLIS's published global coefficients, nothing fitted",
        (LatencyKind::Roofline, _) => "analytical roofline, nothing fitted",
        (LatencyKind::StepTable, _) => "step-table (not benchmarked)",
    }
    .to_string()
}

/// What a run is predicted with: the model, the runs fitted on, the row.
type Predictor = (Model, Vec<String>, Option<CoefficientRow>);

/// The fits of a benchmark, each made once per set of runs fitted on.
struct Fits<'a> {
    /// The runs to fit on.
    pool: &'a [(RunDir, JointRun)],
    /// Whether they come from `--fit-on` (else: the other runs of the folder).
    fit_on: bool,
    o: &'a BenchmarkOptions,
    physics: BTreeMap<Vec<String>, CoefficientRow>,
    blackbox: BTreeMap<Vec<String>, CoefficientRow>,
}

impl Fits<'_> {
    /// Trained-physics for `run`: one joint fit on every pooled run but
    /// `run` (all models). Err: why the run is skipped.
    fn physics(
        &mut self,
        run: &RunDir,
        jr: &JointRun,
        progress: &mut dyn FnMut(&str),
    ) -> Result<Predictor, String> {
        let by_model = !self.fit_on && self.o.folds == Folds::Model;
        let train: Vec<&JointRun> = self
            .pool
            .iter()
            .filter(|(r, _)| {
                if by_model {
                    r.model != run.model
                } else {
                    r.path != run.path
                }
            })
            .map(|(_, j)| j)
            .collect();
        if train.is_empty() {
            return Err(if by_model {
                format!("no run of another model than {} to fit on", run.model)
            } else {
                "no other run to fit on".into()
            });
        }
        let key: Vec<String> = train.iter().map(|r| r.name.clone()).collect();
        let row = match self.physics.get(&key) {
            Some(r) => r.clone(),
            None => {
                progress(&format!(
                    "fitting trained-physics on {} runs (all but {})",
                    train.len(),
                    if self.fit_on {
                        "none"
                    } else if by_model {
                        &run.model
                    } else {
                        &run.name
                    }
                ));
                let f = fit_joint(&train, &self.o.joint, &mut |l| progress(&format!("  {l}")))
                    .map_err(|e| format!("fit failed: {e}"))?;
                progress(&format!("  fitted: {}", describe(&f.fitted)));
                let row = f.fitted.row(
                    "*",
                    jr.server().engine.async_scheduling,
                    format!("joint fit on {}", key.join(", ")),
                );
                self.physics.insert(key.clone(), row.clone());
                row
            }
        };
        let c = crate::joint::PhysicsCoefficients::from_row(&row);
        Ok((c.model(jr.basis()), key, Some(row)))
    }

    /// Blackbox for `run`: coefficients fitted on the pooled runs of its
    /// model but `run`; a pooled run that cannot be fitted goes to
    /// `skipped`. Err: why the run is skipped.
    fn blackbox(
        &mut self,
        run: &RunDir,
        skipped: &mut Vec<(String, String)>,
        progress: &mut dyn FnMut(&str),
    ) -> Result<Predictor, String> {
        let train: Vec<&RunDir> = self
            .pool
            .iter()
            .map(|(r, _)| r)
            .filter(|r| r.model == run.model && r.path != run.path)
            .collect();
        if train.is_empty() {
            return Err(format!("no other run of {} to fit on", run.model));
        }
        let key: Vec<String> = train.iter().map(|r| r.name.clone()).collect();
        let row = match self.blackbox.get(&key) {
            Some(r) => r.clone(),
            None => {
                progress(&format!(
                    "fitting blackbox {} on {}",
                    run.model,
                    key.join(", ")
                ));
                let mut fts = Vec::new();
                for r in &train {
                    match FitTrace::new(&r.name, r.trace.clone(), &args_for(r, self.o), 0.0) {
                        Ok(t) => fts.push(t),
                        Err(e) => skipped.push((r.name.clone(), e.to_string())),
                    }
                }
                let row = fit(&fts, self.o.joint.budget)
                    .map_err(|e| format!("fit failed: {e}"))?
                    .row;
                self.blackbox.insert(key.clone(), row.clone());
                row
            }
        };
        let model = Model::Blackbox(Blackbox {
            alpha: row.alpha,
            beta: row.beta.unwrap_or_default(),
        });
        Ok((model, key, Some(row)))
    }
}

/// The runs that can be replayed, each with its prepared replay.
fn prepare(
    runs: Vec<RunDir>,
    o: &BenchmarkOptions,
    skipped: &mut Vec<(String, String)>,
) -> Vec<(RunDir, JointRun)> {
    let mut out = Vec::new();
    for r in runs {
        match JointRun::new(&r.name, r.trace.clone(), &args_for(&r, o)) {
            Ok(j) => out.push((r, j)),
            Err(e) => skipped.push((r.name.clone(), e.to_string())),
        }
    }
    out
}

fn result_of(
    run: &RunDir,
    jr: &JointRun,
    sim: &RunStats,
    sim_records: &[TraceRecord],
    fitted_on: Vec<String>,
    coefficients: Option<CoefficientRow>,
) -> RunResult {
    let real = &jr.real;
    let cliff = real.overloaded().then(|| {
        let t = client_timeout_us(jr.trace());
        [
            deadline_cliff(&jr.trace().records, t),
            deadline_cliff(sim_records, t),
        ]
    });
    RunResult {
        name: run.name.clone(),
        model: run.model.clone(),
        workload: workload_of(&run.name),
        requests: real.requests,
        completed: [real.completed, sim.completed],
        timed_out: [timeouts(&jr.trace().records), timeouts(sim_records)],
        ttft: MeanP99 {
            real_mean: real.ttft_mean,
            sim_mean: sim.ttft_mean,
            real_p99: real.ttft_p99,
            sim_p99: sim.ttft_p99,
        },
        e2e: MeanP99 {
            real_mean: real.e2e_mean,
            sim_mean: sim.e2e_mean,
            real_p99: real.e2e_p99,
            sim_p99: sim.e2e_p99,
        },
        itl: MeanOnly {
            real_mean: real.itl_mean,
            sim_mean: sim.itl_mean,
        },
        e2e_mape: e2e_mape(&jr.trace().records, sim_records),
        saturated: [real.overloaded(), sim.overloaded()],
        fitted_on,
        coefficients,
        cliff,
        decode_over_run: crate::decode_drift::decode_over_run(&jr.trace().records, sim_records),
    }
}

/// Requests whose status is `timeout` (the client gave up on them).
fn timeouts(records: &[TraceRecord]) -> u64 {
    records
        .iter()
        .filter(|r| r.outcome.status == Some(Status::Timeout))
        .count() as u64
}

/// Per-request E2E MAPE (%) over the requests completed on both sides.
fn e2e_mape(real: &[TraceRecord], sim: &[TraceRecord]) -> f64 {
    let e2e = |r: &TraceRecord| {
        (r.outcome.status == Some(Status::Ok)).then_some((r.request.request_id, r.e2e_us()? as f64))
    };
    let sim: BTreeMap<u64, f64> = sim.iter().filter_map(e2e).collect();
    let (mut sum, mut n) = (0.0, 0u64);
    for (id, r) in real.iter().filter_map(e2e) {
        if let Some(s) = sim.get(&id)
            && r > 0.0
        {
            sum += (s - r).abs() / r;
            n += 1;
        }
    }
    if n == 0 {
        f64::NAN
    } else {
        100.0 * sum / n as f64
    }
}

fn rel(real: f64, sim: f64) -> f64 {
    if real > 0.0 {
        100.0 * (sim - real).abs() / real
    } else {
        f64::NAN
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.retain(|x| x.is_finite());
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The medians over `runs`.
pub fn summarise(runs: &[RunResult]) -> Summary {
    let m = |f: &dyn Fn(&RunResult) -> f64| median(runs.iter().map(f).collect());
    Summary {
        runs: runs.len(),
        ttft_mean: m(&|r| rel(r.ttft.real_mean, r.ttft.sim_mean)),
        ttft_p99: m(&|r| rel(r.ttft.real_p99, r.ttft.sim_p99)),
        e2e_mean: m(&|r| rel(r.e2e.real_mean, r.e2e.sim_mean)),
        e2e_p99: m(&|r| rel(r.e2e.real_p99, r.e2e.sim_p99)),
        itl_mean: m(&|r| rel(r.itl.real_mean, r.itl.sim_mean)),
        e2e_mape: m(&|r| r.e2e_mape),
        saturation_mismatches: runs
            .iter()
            .filter(|r| r.saturated[0] != r.saturated[1])
            .count(),
        saturated_completed_max: runs
            .iter()
            .filter(|r| r.saturated[0])
            .map(|r| rel(r.completed[0] as f64, r.completed[1] as f64))
            .fold(f64::NAN, f64::max),
    }
}

fn pct(real: f64, sim: f64) -> String {
    if real > 0.0 {
        format!("{:+.1}%", 100.0 * (sim - real) / real)
    } else {
        "-".into()
    }
}

impl BenchmarkReport {
    /// The table as Markdown.
    pub fn to_markdown(&self) -> String {
        let mut o = String::new();
        let _ = writeln!(
            o,
            "Latency model **{}**: {}.\n",
            self.latency_model, self.protocol
        );
        let _ = writeln!(
            o,
            "| model | workload | ok real / sim | timed out real / sim | TTFT mean real / sim | TTFT p99 real / sim | E2E mean real / sim | E2E p99 real / sim | ITL mean real / sim | E2E MAPE |"
        );
        let _ = writeln!(o, "|---|---|---:|---:|---|---|---|---|---|---:|");
        // "real / sim (relative error)" with `d` decimals.
        let cell =
            |real: f64, sim: f64, d: usize| format!("{real:.d$} / {sim:.d$} ({})", pct(real, sim));
        for r in &self.runs {
            let sat = |s: bool| if s { " (saturated)" } else { "" };
            let _ = writeln!(
                o,
                "| {} | {} | {}{} / {}{} | {} / {} | {} | {} | {} | {} | {} | {:.1}% |",
                r.model,
                r.workload,
                r.completed[0],
                sat(r.saturated[0]),
                r.completed[1],
                sat(r.saturated[1]),
                r.timed_out[0],
                r.timed_out[1],
                cell(r.ttft.real_mean, r.ttft.sim_mean, 1),
                cell(r.ttft.real_p99, r.ttft.sim_p99, 1),
                cell(r.e2e.real_mean, r.e2e.sim_mean, 0),
                cell(r.e2e.real_p99, r.e2e.sim_p99, 0),
                cell(r.itl.real_mean, r.itl.sim_mean, 2),
                r.e2e_mape,
            );
        }
        let s = &self.summary;
        let _ = writeln!(
            o,
            "\nMedian over {} runs of |sim − real| / real: TTFT mean {:.1}%, TTFT p99 {:.1}%, E2E mean {:.1}%, E2E p99 {:.1}%, ITL mean {:.1}%; median E2E MAPE {:.1}%; saturation verdicts that differ: {}.",
            s.runs,
            s.ttft_mean,
            s.ttft_p99,
            s.e2e_mean,
            s.e2e_p99,
            s.itl_mean,
            s.e2e_mape,
            s.saturation_mismatches
        );
        if s.saturated_completed_max.is_finite() {
            let _ = writeln!(
                o,
                "Completed requests of the runs saturated in reality: largest |sim − real| / real {:.1}%.",
                s.saturated_completed_max
            );
        }
        self.md_cliffs(&mut o);
        self.md_decode_over_run(&mut o);
        let _ = writeln!(
            o,
            "\nTimes in ms, each side over its own completed requests (ITL per generated token, (E2E − TTFT) / (output − 1)); saturated: mean TTFT above {:.0} s; E2E MAPE per request over requests completed on both sides.",
            OVERLOADED_TTFT_MS / 1e3
        );
        for (name, why) in &self.skipped {
            let _ = writeln!(o, "- skipped {name}: {why}");
        }
        o
    }

    /// Markdown: each run's decode time per token in the first and last
    /// windows of the run, real and predicted ([`crate::decode_drift`]).
    fn md_decode_over_run(&self, o: &mut String) {
        let rows: Vec<(&RunResult, &crate::decode_drift::DecodeOverRun)> = self
            .runs
            .iter()
            .filter_map(|r| Some((r, r.decode_over_run.as_ref()?)))
            .collect();
        if rows.is_empty() {
            return;
        }
        let _ = writeln!(
            o,
            "\nDecode speed over the run: the median time per output token (ms) of the requests whose first token came in the first and in the last of six equal windows of the run. The simulation is stationary (the same batch, the same step time): a real change it does not share where its own speed held comes from outside its step model; where the simulated speed moved, its batch or preemption evolved otherwise than the server's:\n"
        );
        let _ = writeln!(
            o,
            "| model | workload | real first → last | sim first → last | change real / sim | drift |"
        );
        let _ = writeln!(o, "|---|---|---|---|---|---|");
        for (r, d) in rows {
            let (first, last) = d.ends();
            let ms = |x: Option<f64>| x.map_or("-".into(), |v| format!("{v:.2}"));
            let _ = writeln!(
                o,
                "| {} | {} | {} → {} | {} → {} | {:+.1}% / {:+.1}% | {} |",
                r.model,
                r.workload,
                ms(first.real_ms),
                ms(last.real_ms),
                ms(first.sim_ms),
                ms(last.sim_ms),
                100.0 * d.real_change,
                100.0 * d.sim_change,
                match (d.drift, d.steady_load) {
                    (false, _) => "no",
                    (true, true) => "yes, the simulated speed held",
                    (true, false) => "yes, the simulated speed moved",
                }
            );
        }
    }

    /// Markdown: the deadline cliff of each run saturated in reality
    /// ([`crate::goodput`]), when any.
    fn md_cliffs(&self, o: &mut String) {
        let rows: Vec<(&RunResult, &DeadlineCliff, Option<&DeadlineCliff>)> = self
            .runs
            .iter()
            .filter_map(|r| {
                let [real, sim] = r.cliff.as_ref()?;
                Some((r, real.as_ref()?, sim.as_ref()))
            })
            .collect();
        if rows.is_empty() {
            return;
        }
        let _ = writeln!(
            o,
            "\nUnder overload the client's timeout decides the counts (the deadline cliff): a server that starts requests in send order completes the earliest sends, up to the one whose wait plus decode reaches the timeout. The cliff's count from each side's own decode time (first token to last) and requests decoding at once, against the count; and how far a count moves per 1% of decode time:\n"
        );
        let _ = writeln!(
            o,
            "| model | workload | decode s real / sim | decoding at once real / sim | cliff's count real / sim | ok real / sim | ok among the earliest sends real / sim | count moves per 1% decode time |"
        );
        let _ = writeln!(o, "|---|---|---|---|---|---|---|---:|");
        let f = |x: Option<f64>, d: usize| match x {
            Some(v) if v.is_finite() => format!("{v:.d$}"),
            _ => "-".into(),
        };
        for (r, real, sim) in rows {
            // A side that did not saturate has no cliff: one dash.
            let sim_cliff = sim.map_or("-".into(), |c| {
                format!(
                    "{} ({})",
                    f(Some(c.predicted_completed), 0),
                    pct(c.completed as f64, c.predicted_completed)
                )
            });
            let sim_in_order = sim.map_or("-".into(), |c| {
                format!("{}%", f(Some(100.0 * c.in_order), 1))
            });
            let _ = writeln!(
                o,
                "| {} | {} | {} / {} | {} / {} | {} ({}) / {} | {} / {} | {}% / {} | {}% |",
                r.model,
                r.workload,
                f(Some(real.decode_s), 1),
                f(sim.map(|c| c.decode_s), 1),
                f(Some(real.concurrency), 1),
                f(sim.map(|c| c.concurrency), 1),
                f(Some(real.predicted_completed), 0),
                pct(real.completed as f64, real.predicted_completed),
                sim_cliff,
                r.completed[0],
                r.completed[1],
                f(Some(100.0 * real.in_order), 1),
                sim_in_order,
                f(Some(real.elasticity), 1),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_ignore_missing_values() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, f64::NAN, 2.0, 3.0]), 2.5);
        assert!(median(vec![]).is_nan());
    }
}
