//! `benchmark`: how accurate is the simulator on real vLLM runs? For each
//! run in a folder of runs (laid out like `vllm-ground-truth/train`: one
//! folder per run, read by the `vllm-gt` importer), blackbox coefficients
//! are fitted on the *other* runs of the same model (leave-one-out), or on
//! the runs of another folder (`--fit-on`), and the run is predicted with
//! them; the roofline model (nothing fitted) is the baseline.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use blis_replay::coefficients::{CoefficientRow, LatencyKind};
use blis_traces::{ImportKind, ImportSource, import};
use serde::Serialize;

use crate::fit::{FitTrace, PartErrors, fit, server_args};

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
    /// Requests compared (completed on both sides).
    pub n: u64,
    /// TTFT.
    pub ttft: MeanP99,
    /// E2E.
    pub e2e: MeanP99,
    /// Derived ITL: (E2E − TTFT) / (output − 1).
    pub itl: MeanOnly,
    /// Per-request E2E MAPE, %.
    pub e2e_mape: f64,
    /// The runs the coefficients were fitted on.
    pub fitted_on: Vec<String>,
    /// The fitted coefficients.
    pub coefficients: CoefficientRow,
    /// Per-request E2E MAPE of the roofline baseline, %.
    pub roofline_e2e_mape: Option<f64>,
}

/// The benchmark's result.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BenchmarkReport {
    /// One entry per predicted run.
    pub runs: Vec<RunResult>,
    /// Runs that could not be predicted, with the reason.
    pub skipped: Vec<(String, String)>,
}

/// A run folder and its imported trace.
struct Run {
    name: String,
    path: PathBuf,
    model: String,
    trace: blis_traces::Trace,
}

fn runs_in(dir: &Path, skipped: &mut Vec<(String, String)>) -> std::io::Result<Vec<Run>> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    let mut out = Vec::new();
    for path in dirs {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let src = ImportSource {
            kind: ImportKind::VllmGt,
            path: path.clone(),
        };
        match import(&src, 42) {
            Ok(trace) => {
                let model = trace
                    .header
                    .server
                    .as_ref()
                    .and_then(|s| s.model.clone())
                    .unwrap_or_default();
                out.push(Run {
                    name,
                    path,
                    model,
                    trace,
                });
            }
            Err(e) => skipped.push((name, format!("not a readable run: {e}"))),
        }
    }
    Ok(out)
}

/// The workload of a run folder named like `DATE-TIME-MODEL-tpN-WORKLOAD`.
pub fn workload_of(name: &str) -> String {
    match name.rfind("-tp") {
        Some(i) => name[i + 3..]
            .split_once('-')
            .map_or(name.to_string(), |(_, w)| w.to_string()),
        None => name.rsplit('-').next().unwrap_or(name).to_string(),
    }
}

fn mean_p99(e: &PartErrors, f: impl Fn(&PartErrors) -> ([f64; 2], [f64; 2])) -> MeanP99 {
    let (m, p) = f(e);
    MeanP99 {
        real_mean: m[0],
        sim_mean: m[1],
        real_p99: p[0],
        sim_p99: p[1],
    }
}

/// Runs the benchmark on the runs of `dir`, fitting on `fit_on` (default:
/// the other runs of `dir`) with `budget` replays per fit. `progress`
/// receives one line per step.
///
/// # Errors
/// An unreadable folder.
pub fn benchmark(
    dir: &Path,
    fit_on: Option<&Path>,
    budget: u64,
    progress: &mut dyn FnMut(&str),
) -> std::io::Result<BenchmarkReport> {
    let mut skipped = Vec::new();
    let targets = runs_in(dir, &mut skipped)?;
    let pool = match fit_on {
        Some(d) => runs_in(d, &mut skipped)?,
        None => Vec::new(),
    };
    let pool: &[Run] = if fit_on.is_some() { &pool } else { &targets };
    let mut fits: BTreeMap<Vec<String>, CoefficientRow> = BTreeMap::new();
    let mut results = Vec::new();
    for run in &targets {
        let train: Vec<&Run> = pool
            .iter()
            .filter(|r| r.model == run.model && r.path != run.path)
            .collect();
        if train.is_empty() {
            skipped.push((
                run.name.clone(),
                format!("no other run of {} to fit on", run.model),
            ));
            continue;
        }
        let key: Vec<String> = train.iter().map(|r| r.name.clone()).collect();
        let row = match fits.get(&key) {
            Some(r) => r.clone(),
            None => {
                progress(&format!("fitting {} on {}", run.model, key.join(", ")));
                let mut fts = Vec::new();
                for r in &train {
                    let args =
                        server_args(None, None, LatencyKind::Blackbox, None, &r.trace.header);
                    match FitTrace::new(&r.name, r.trace.clone(), &args, 0.0) {
                        Ok(t) => fts.push(t),
                        Err(e) => skipped.push((r.name.clone(), e.to_string())),
                    }
                }
                let row = match fit(&fts, budget) {
                    Ok(f) => f.row,
                    Err(e) => {
                        skipped.push((run.name.clone(), format!("fit failed: {e}")));
                        continue;
                    }
                };
                fits.insert(key.clone(), row.clone());
                row
            }
        };
        progress(&format!("predicting {}", run.name));
        let args = server_args(None, None, LatencyKind::Blackbox, None, &run.trace.header);
        let t = match FitTrace::new(&run.name, run.trace.clone(), &args, 0.0) {
            Ok(t) => t,
            Err(e) => {
                skipped.push((run.name.clone(), e.to_string()));
                continue;
            }
        };
        let e = t.evaluate(&t.model_of(&row));
        let roof_args = server_args(None, None, LatencyKind::Roofline, None, &run.trace.header);
        let roofline_e2e_mape = FitTrace::new(&run.name, run.trace.clone(), &roof_args, 0.0)
            .ok()
            .map(|rt| rt.evaluate(rt.base_model()).e2e_mape);
        results.push(RunResult {
            name: run.name.clone(),
            model: run.model.clone(),
            workload: workload_of(&run.name),
            n: e.n,
            ttft: mean_p99(&e, |e| (e.ttft_mean, e.ttft_p99)),
            e2e: mean_p99(&e, |e| (e.e2e_mean, e.e2e_p99)),
            itl: MeanOnly {
                real_mean: e.itl_mean[0],
                sim_mean: e.itl_mean[1],
            },
            e2e_mape: e.e2e_mape,
            fitted_on: key,
            coefficients: row,
            roofline_e2e_mape,
        });
    }
    Ok(BenchmarkReport {
        runs: results,
        skipped,
    })
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
            "| model | workload | n | TTFT mean real / sim | TTFT p99 real / sim | E2E mean real / sim | E2E p99 real / sim | ITL mean real / sim | E2E MAPE | roofline E2E MAPE |"
        );
        let _ = writeln!(o, "|---|---|---:|---|---|---|---|---|---:|---:|");
        // "real / sim (relative error)" with `d` decimals.
        let cell =
            |real: f64, sim: f64, d: usize| format!("{real:.d$} / {sim:.d$} ({})", pct(real, sim));
        for r in &self.runs {
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {:.1}% | {} |",
                r.model,
                r.workload,
                r.n,
                cell(r.ttft.real_mean, r.ttft.sim_mean, 1),
                cell(r.ttft.real_p99, r.ttft.sim_p99, 1),
                cell(r.e2e.real_mean, r.e2e.sim_mean, 0),
                cell(r.e2e.real_p99, r.e2e.sim_p99, 0),
                cell(r.itl.real_mean, r.itl.sim_mean, 2),
                r.e2e_mape,
                r.roofline_e2e_mape
                    .map_or("-".into(), |m| format!("{m:.1}%"))
            );
        }
        let _ = writeln!(
            o,
            "\nTimes in ms (ITL per generated token, derived as (E2E − TTFT) / (output − 1)); blackbox coefficients fitted on the model's other runs; MAPE per request over requests completed on both sides."
        );
        for (name, why) in &self.skipped {
            let _ = writeln!(o, "- skipped {name}: {why}");
        }
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workloads_come_from_folder_names() {
        assert_eq!(
            workload_of("20260217-155451-llama-2-7b-tp1-codegen"),
            "codegen"
        );
        assert_eq!(
            workload_of("20260218-150304-codellama-34b-tp2-general"),
            "general"
        );
        assert_eq!(workload_of("run-x-chat"), "chat");
    }
}
