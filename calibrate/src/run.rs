//! The commands, as the binary runs them.

use blis_traces::step::StepContext;
use std::io::Write;
use std::path::Path;

use blis_replay::latency::coefficients::{CoefficientsFile, LatencyKind};
use blis_traces::{Slo, Trace};

use crate::cli::{BenchmarkArgs, Command, CompareArgs, FitArgs, Opts};
use crate::compare::{CompareOptions, compare};
use crate::fit::{FitTrace, fit, server_args, write_row};

/// Process exit codes (the table every BLIS binary shares).
pub use blis_traces::exit_code;

/// Why a command failed, and its result: the one error of every BLIS
/// binary ([`blis_traces::command`]).
pub use blis_traces::command::{CommandError, Result};

blis_traces::command_errors!(crate::fit::FitError, crate::html::HtmlError,);

/// Runs the command in `opts`, writing its human-readable output to `out`.
///
/// # Errors
/// Any failure, with a chain of context naming the file or field.
pub fn run(opts: Opts, out: &mut dyn Write) -> Result<i32> {
    match opts.command {
        Command::Compare(a) => compare_command(&a, out),
        Command::Fit(a) => fit_command(&a, out),
        Command::Benchmark(a) => benchmark_command(&a, out),
    }
    .map(|()| exit_code::OK)
}

/// A trace from a header YAML, or from a public trace given as
/// `KIND:PATH` (e.g. `vllm-gt:RUN_DIR`, a real run with measured times).
fn read(path: &Path) -> Result<Trace> {
    let s = path.to_string_lossy();
    if !path.exists()
        && let Ok(src) = s.parse::<blis_traces::ImportSource>()
    {
        return Ok(blis_traces::import(&src, 42).step(|| format!("importing {s}"))?);
    }
    Ok(Trace::read(path).step(|| format!("reading the trace {}", path.display()))?)
}

/// [`read`], and an error naming the request CSV and the column when the
/// trace lacks a column a comparison needs.
fn read_outcomes(path: &Path) -> Result<Trace> {
    let t = read(path)?;
    if let Some(col) = crate::compare::missing_required_column(&t) {
        let paths = blis_traces::bundle::TracePaths::for_header(path, Some(&t.header));
        return Err(CommandError::Usage(format!(
            "{}:1: {col}: required column missing from the header row (comparing and fitting need {})",
            paths.data.display(),
            crate::compare::REQUIRED_COLUMNS.join(", ")
        )));
    }
    Ok(t)
}

fn write_file(path: &Path, text: &str) -> Result<()> {
    if let Some(d) = path.parent()
        && !d.as_os_str().is_empty()
    {
        std::fs::create_dir_all(d).step(|| format!("creating {}", d.display()))?;
    }
    Ok(blis_traces::bundle::write_atomic(path, text.as_bytes())
        .step(|| format!("writing {}", path.display()))?)
}

fn with_ext(prefix: &Path, ext: &str) -> std::path::PathBuf {
    let mut s = prefix.as_os_str().to_owned();
    s.push(".");
    s.push(ext);
    s.into()
}

/// What [`compare_files`] wrote.
#[derive(Debug, Clone)]
pub struct Compared {
    /// The report as Markdown (as in `PREFIX.md`).
    pub markdown: String,
    /// The report as JSON (as in `PREFIX.json`).
    pub json: serde_json::Value,
    /// The files written: `PREFIX.json`, `PREFIX.md`, and `PREFIX.html`
    /// when asked for.
    pub written: Vec<std::path::PathBuf>,
}

/// Compares two traces in memory (`real_label` and `sim_label` name them
/// in the report): the report `compare` writes, with the data its plots
/// need.
///
/// # Errors
/// [`CommandError::Usage`] when a side lacks a column comparing needs, or
/// when no request completed on both sides past the warm-up.
pub fn compare_traces(
    real: &Trace,
    real_label: &str,
    sim: &Trace,
    sim_label: &str,
    o: &CompareOptions,
) -> Result<crate::compare::Comparison> {
    for (t, label) in [(real, real_label), (sim, sim_label)] {
        if let Some(col) = crate::compare::missing_required_column(t) {
            return Err(CommandError::Usage(format!(
                "{label}: {col}: required column missing (comparing and fitting need {})",
                crate::compare::REQUIRED_COLUMNS.join(", ")
            )));
        }
    }
    let c = compare(real, real_label, sim, sim_label, o);
    if c.report.matching.paired == 0 {
        let m = &c.report.matching;
        let disorder = if m.out_of_order == (0, 0) {
            String::new()
        } else {
            format!(
                "; rows with times out of order, not compared: real {}, sim {}",
                m.out_of_order.0, m.out_of_order.1
            )
        };
        let warmup = c.report.settings.warmup;
        // Every row left out as warm-up: the warm-up, not the run, is why.
        let hint = if m.real.total > 0 && m.real.warmup == m.real.total {
            format!(
                "; every real row is within the warm-up of {warmup} requests (--warmup, by default the real header's): give a smaller --warmup"
            )
        } else {
            String::new()
        };
        return Err(CommandError::Usage(format!(
            "nothing to compare: no request is completed (ok) on both sides past the warm-up (real: {} rows, {} ok past the warm-up; sim: {} rows, {} ok past it; {} request ids in common; {} real rows in the warm-up{hint}{disorder})",
            m.real.total,
            m.real.ok,
            m.sim.total,
            m.sim.ok,
            m.real.total.saturating_sub(m.only_real),
            m.real.warmup
        )));
    }
    Ok(c)
}

/// Compares the trace at `real` with the one at `sim` (headers or
/// prefixes) and writes the report at the prefix `out` (`.json`, `.md`,
/// and `.html` when `html`): the library call behind `blis-calibrate
/// compare`.
///
/// # Errors
/// Unreadable traces, a required column missing, nothing to compare (no
/// request completed on both sides past the warm-up), unwritable output.
pub fn compare_files(
    real: &Path,
    sim: &Path,
    out: &Path,
    o: &CompareOptions,
    html: bool,
) -> Result<Compared> {
    let real_t = read_outcomes(real)?;
    let sim_t = read_outcomes(sim)?;
    let c = compare_traces(
        &real_t,
        &real.display().to_string(),
        &sim_t,
        &sim.display().to_string(),
        o,
    )?;
    let markdown = c.report.to_markdown();
    let text = serde_json::to_string_pretty(&c.report)?;
    write_file(&with_ext(out, "json"), &text)?;
    let json = serde_json::from_str(&text)?;
    write_file(&with_ext(out, "md"), &markdown)?;
    let mut written = vec![with_ext(out, "json"), with_ext(out, "md")];
    if html {
        let page = crate::html::render(&c)?;
        let p = with_ext(out, "html");
        write_file(&p, &page)?;
        written.push(p);
    }
    Ok(Compared {
        markdown,
        json,
        written,
    })
}

/// The most bootstrap resamples `compare` takes: the 95% intervals settle
/// long before (the default is 1,000), and each resample keeps about 150
/// bytes per metric (100 billion aborted the process on allocation).
pub const MAX_RESAMPLES: usize = 100_000;

/// `blis-calibrate compare`.
///
/// # Errors
/// Unreadable traces, bad options, unwritable output.
pub fn compare_command(a: &CompareArgs, out: &mut dyn Write) -> Result<()> {
    if let Some(r) = a.rtt_ms
        && !(r >= 0.0 && r.is_finite())
    {
        return Err(CommandError::Usage(format!(
            "--rtt-ms must be a non-negative number, got {}",
            blis_traces::shown::Num(r)
        )));
    }
    if a.resamples == 1 || a.resamples > MAX_RESAMPLES {
        return Err(CommandError::Usage(format!(
            "--resamples must be 0 (no intervals) or 2 to {MAX_RESAMPLES}, got {}",
            a.resamples
        )));
    }
    let slo = a
        .slo
        .as_deref()
        .map(str::parse::<Slo>)
        .transpose()
        .map_err(CommandError::Usage)?;
    let mut o = CompareOptions {
        warmup: a.warmup,
        rtt_ms: a.rtt_ms,
        slo,
        resamples: a.resamples,
        seed: a.seed,
        real_label: a.real_label.clone(),
        ..CompareOptions::default()
    };
    if a.threads > 0 {
        o.threads = a.threads;
    }
    let compared = compare_files(&a.real, &a.sim, &a.out, &o, a.html)?;
    write!(out, "{}", compared.markdown)?;
    let written = compared.written;
    writeln!(
        out,
        "\nwrote {}",
        written
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )?;
    Ok(())
}

/// `blis-calibrate fit`.
///
/// # Errors
/// Unreadable traces, bad options, a server that cannot be configured.
pub fn fit_command(a: &FitArgs, out: &mut dyn Write) -> Result<()> {
    if let Some(h) = a.holdout_fraction
        && !(0.0..1.0).contains(&h)
    {
        return Err(CommandError::Usage(format!(
            "--holdout-fraction must be in [0, 1), got {}",
            blis_traces::shown::Num(h)
        )));
    }
    if a.budget_evals == Some(0) {
        return Err(CommandError::Usage(
            "--budget-evals must be at least 1".into(),
        ));
    }
    // Checked whatever is fitted: a bad value is an error even where the
    // fit does not use it.
    a.joint.options(1)?;
    let kind = fit_kind(a);
    match kind {
        LatencyKind::TrainedPhysics => return joint_fit_command(a, out),
        LatencyKind::BlisPhysics => {
            return Err(CommandError::Usage("blis-physics has BLIS's published coefficients and nothing to fit; fit trained-physics (--latency-model trained-physics)".into()));
        }
        LatencyKind::Blackbox | LatencyKind::Roofline | LatencyKind::StepTable => {}
    }
    if a.runs.is_some() {
        return Err(CommandError::Usage(format!(
            "--runs fits trained-physics (one global row across models); give --trace for {} fits",
            kind.name()
        )));
    }
    let traces = fit_traces(a, kind)?;
    let r = fit(&traces, a.budget_evals.unwrap_or(400))?;
    write_row(&a.out, &r.row).step(|| format!("writing {}", a.out.display()))?;
    if a.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&r)?)?;
        return Ok(());
    }
    print_fit(&r, &a.out, out)
}

/// The latency model `fit` fits: `--latency-model`'s, else
/// trained-physics for `--runs`, else blackbox.
fn fit_kind(a: &FitArgs) -> LatencyKind {
    match a.latency_model {
        Some(c) => c.kind(),
        None if a.runs.is_some() => LatencyKind::TrainedPhysics,
        None => LatencyKind::Blackbox,
    }
}

/// The starting coefficients of a `kind` fit of `--trace`: `--coefficients`
/// (a trained-physics fit starts from its own global row).
fn fit_start(
    a: &FitArgs,
    kind: LatencyKind,
) -> std::result::Result<Option<CoefficientsFile>, blis_replay::ReplayError> {
    if kind == LatencyKind::TrainedPhysics {
        return Ok(None);
    }
    Ok(a.coefficients
        .as_deref()
        .map(CoefficientsFile::read)
        .transpose()?)
}

/// The server a `kind` fit replays a trace with header `header` on: the
/// header's settings overridden by the flags, from the coefficients
/// `start`.
fn fit_server_args(
    a: &FitArgs,
    kind: LatencyKind,
    start: Option<CoefficientsFile>,
    header: &blis_traces::TraceHeader,
) -> blis_replay::setup::ServerArgs {
    let mut args = server_args(a.model.clone(), a.hardware.clone(), kind, start, header);
    if kind == LatencyKind::TrainedPhysics {
        // The step structure measured in vLLM's TTFT (a request joins the
        // step after the one in flight), unless the trace or flag says.
        args.async_scheduling = Some(
            header
                .server
                .as_ref()
                .and_then(|s| s.async_scheduling)
                .unwrap_or(true),
        );
    }
    args.model_config = a.model_config.clone();
    args.hardware_config = a.hardware_config.clone();
    a.engine.apply(&mut args);
    args
}

/// The server settings `fit` would resolve for a trace with header
/// `header` (a run not yet made: its header as the probes would write it),
/// checked before the trace exists, so that a caller about to observe a
/// server learns now what the fit would refuse then (e.g.
/// [`blis_replay::setup::SettingsError::UnknownKvSize`]).
///
/// # Errors
/// The settings' error, as [`fit_command`] would meet it; an unreadable
/// `--coefficients`.
pub fn check_fit_settings(
    a: &FitArgs,
    header: &blis_traces::TraceHeader,
) -> std::result::Result<(), blis_replay::ReplayError> {
    let kind = fit_kind(a);
    let args = fit_server_args(a, kind, fit_start(a, kind)?, header);
    blis_replay::setup::resolve(&args, Some(header)).map(|_| ())
}

/// The traces of `--trace`, each with the server it ran on (its header,
/// overridden by the flags) and its held-out part, for a `kind` fit.
fn fit_traces(a: &FitArgs, kind: LatencyKind) -> Result<Vec<FitTrace>> {
    let start = fit_start(a, kind)?;
    let mut traces = Vec::new();
    for p in &a.traces {
        let t = read_outcomes(p)?;
        let args = fit_server_args(a, kind, start.clone(), &t.header);
        traces.push(FitTrace::new(
            &p.display().to_string(),
            t,
            &args,
            a.holdout_fraction.unwrap_or(0.3),
        )?);
    }
    Ok(traces)
}

/// The fit's result as the command prints it: the parameters before and
/// after, and each trace's errors on its fitted and held-out parts.
/// A mean in ms to one decimal, or `—` when there is none (no streamed
/// request: no TTFT).
fn ms_or_dash(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.1}")
    } else {
        "—".to_string()
    }
}

fn print_fit(r: &crate::fit::FitResult, path: &Path, out: &mut dyn Write) -> Result<()> {
    writeln!(
        out,
        "fitted {} coefficients of {} on {} trace(s): loss {:.4} -> {:.4} in {} replays\n",
        r.latency_model,
        r.row.model,
        r.traces.len(),
        r.loss[0],
        r.loss[1],
        r.evaluations
    )?;
    writeln!(
        out,
        "| parameter | what (unit) | start | fitted |\n|---|---|---:|---:|"
    )?;
    for ((n, s), f) in r.names.iter().zip(&r.start).zip(&r.fitted) {
        writeln!(
            out,
            "| {n} | {} | {s:.6} | {f:.6} |",
            crate::fit::parameter_meaning(n)
        )?;
    }
    writeln!(
        out,
        "\n| trace | part | n | TTFT mean real/sim | E2E mean real/sim | E2E p99 real/sim | E2E MAPE before → after |\n|---|---|---:|---|---|---|---|"
    )?;
    for t in &r.traces {
        let parts = [
            ("fit", Some(&t.fit_before), Some(&t.fit_after)),
            (
                "holdout",
                t.holdout_before.as_ref(),
                t.holdout_after.as_ref(),
            ),
        ];
        for (part, b, a) in parts {
            let (Some(b), Some(a)) = (b, a) else { continue };
            writeln!(
                out,
                "| {} | {part} | {} | {} / {} | {:.1} / {:.1} | {:.1} / {:.1} | {:.1}% → {:.1}% |",
                t.trace,
                a.n,
                ms_or_dash(a.ttft_mean[0]),
                ms_or_dash(a.ttft_mean[1]),
                a.e2e_mean[0],
                a.e2e_mean[1],
                a.e2e_p99[0],
                a.e2e_p99[1],
                b.e2e_mape,
                a.e2e_mape
            )?;
        }
    }
    writeln!(out, "\nwrote {}", path.display())?;
    Ok(())
}

/// `blis-calibrate fit` of the global trained-physics coefficients on
/// every run of `--runs` and every `--trace`, jointly.
///
/// # Errors
/// Unreadable runs, a run that cannot be replayed, an unwritable output.
fn joint_fit_command(a: &FitArgs, out: &mut dyn Write) -> Result<()> {
    let o = a
        .joint
        .options(a.budget_evals.unwrap_or(crate::joint::DEFAULT_BUDGET))?;
    let runs = joint_runs(a)?;
    let refs: Vec<&crate::joint::JointRun> = runs.iter().collect();
    let gpus: std::collections::BTreeSet<String> =
        runs.iter().map(|r| r.server().gpu.clone()).collect();
    let gpu = if gpus.len() == 1 {
        gpus.into_iter().next().unwrap_or_default()
    } else {
        "*".to_string()
    };
    let asyncs: std::collections::BTreeSet<bool> = runs
        .iter()
        .map(|r| r.server().engine.async_scheduling)
        .collect();
    let started = std::time::Instant::now();
    let f = crate::joint::fit_joint(&refs, &o, &mut |l| blis_traces::diag!("{l}"))?;
    let row = f.fitted.row(
        &gpu,
        asyncs.contains(&true),
        format!(
            "blis-calibrate fit (trained-physics, joint) on {} runs: {}",
            f.runs.len(),
            f.runs.join(", ")
        ),
    );
    write_row(&a.out, &row).step(|| format!("writing {}", a.out.display()))?;
    if a.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&f)?)?;
        return Ok(());
    }
    print_joint_fit(out, &f, started, &a.out)
}

/// The runs of `--runs` and the traces of `--trace`, each with the
/// server it was measured on (trace header, then flags), cut to their
/// first part when `--holdout-fraction` holds out the rest.
///
/// # Errors
/// Unreadable runs or traces, none at all, a run that cannot be replayed.
fn joint_runs(a: &FitArgs) -> Result<Vec<crate::joint::JointRun>> {
    let mut named: Vec<(String, Trace)> = Vec::new();
    if let Some(dir) = &a.runs {
        let mut skipped = Vec::new();
        let runs = crate::runs::runs_in(dir, &mut skipped)
            .step(|| format!("reading the runs in {}", dir.display()))?;
        if let Some((name, why)) = skipped.first() {
            return Err(CommandError::Usage(format!(
                "{}: {name}: {why}",
                dir.display()
            )));
        }
        named.extend(runs.into_iter().map(|r| (r.name, r.trace)));
    }
    for p in &a.traces {
        named.push((p.display().to_string(), read_outcomes(p)?));
    }
    if named.is_empty() {
        return Err(CommandError::Usage(format!(
            "no runs to fit on: --runs {} holds no run folder or trace header",
            a.runs.as_deref().unwrap_or(Path::new("")).display()
        )));
    }
    let mut runs = Vec::new();
    for (name, t) in named {
        let args = fit_server_args(a, LatencyKind::TrainedPhysics, None, &t.header);
        let holdout = a.holdout_fraction.unwrap_or(0.0);
        let t = if holdout > 0.0 {
            crate::joint::first_part(t, 1.0 - holdout)
        } else {
            t
        };
        runs.push(crate::joint::JointRun::new(&name, t, &args)?);
    }
    Ok(runs)
}

/// The joint fit's report: losses, coefficients, and each run's real and
/// simulated figures.
fn print_joint_fit(
    out: &mut dyn Write,
    f: &crate::joint::JointFit,
    started: std::time::Instant,
    path: &Path,
) -> Result<()> {
    writeln!(
        out,
        "fitted global trained-physics coefficients on {} runs in {:.0} s: loss {:.4} (decode intervals) -> {:.4} in {} replays of every run\n",
        f.runs.len(),
        started.elapsed().as_secs_f64(),
        f.loss[0],
        f.loss[1],
        f.evaluations
    )?;
    writeln!(out, "{}", crate::joint::coefficients_table(&f.fitted))?;
    writeln!(
        out,
        "| run | ok real / sim | TTFT mean real / sim | TTFT p99 real / sim | E2E mean real / sim | E2E p99 real / sim | ITL mean real / sim |\n|---|---:|---|---|---|---|---|"
    )?;
    for (name, r, s) in &f.per_run {
        writeln!(
            out,
            "| {name} | {} / {} | {:.1} / {:.1} | {:.1} / {:.1} | {:.0} / {:.0} | {:.0} / {:.0} | {:.2} / {:.2} |",
            r.completed,
            s.completed,
            r.ttft_mean,
            s.ttft_mean,
            r.ttft_p99,
            s.ttft_p99,
            r.e2e_mean,
            s.e2e_mean,
            r.e2e_p99,
            s.e2e_p99,
            r.itl_mean,
            s.itl_mean
        )?;
    }
    writeln!(
        out,
        "\nTimes in ms, each side over its own completed requests (in-sample: these runs were fitted on).\nwrote {}",
        path.display()
    )?;
    Ok(())
}

/// `blis-calibrate benchmark`.
///
/// # Errors
/// An unreadable folder or unwritable output.
pub fn benchmark_command(a: &BenchmarkArgs, out: &mut dyn Write) -> Result<()> {
    if a.budget_evals == Some(0) {
        return Err(CommandError::Usage(
            "--budget-evals must be at least 1".into(),
        ));
    }
    let latency = a.latency_model.kind();
    let o = crate::benchmark::BenchmarkOptions {
        latency,
        joint: a.joint.options(a.budget_evals.unwrap_or(match latency {
            LatencyKind::TrainedPhysics => crate::joint::DEFAULT_BUDGET,
            _ => 300,
        }))?,
        async_scheduling: a.async_scheduling,
        folds: a.folds.into(),
    };
    if a.folds == crate::cli::FoldsArg::Model {
        if latency != LatencyKind::TrainedPhysics {
            return Err(CommandError::Usage(format!(
                "--folds model needs --latency-model trained-physics ({} is {})",
                latency.name(),
                if latency == LatencyKind::Blackbox {
                    "fitted per model, so it has nothing to predict a model it never saw"
                } else {
                    "not fitted"
                }
            )));
        }
        if a.fit_on.is_some() {
            return Err(CommandError::Usage(
                "--folds model and --fit-on exclude each other (--fit-on fits once on its folder)"
                    .into(),
            ));
        }
    }
    let r = crate::benchmark::benchmark(&a.dir, a.fit_on.as_deref(), &o, &mut |l| {
        blis_traces::diag!("{l}")
    })
    .step(|| format!("reading the runs in {}", a.dir.display()))?;
    if r.runs.is_empty() {
        let why: Vec<String> = r
            .skipped
            .iter()
            .take(3)
            .map(|(run, why)| format!("{run}: {why}"))
            .collect();
        return Err(CommandError::Usage(format!(
            "no run of {} could be predicted ({} skipped{}{})",
            a.dir.display(),
            r.skipped.len(),
            if why.is_empty() { "" } else { ": " },
            why.join("; ")
        )));
    }
    let md = r.to_markdown();
    write_file(&with_ext(&a.out, "md"), &md)?;
    write_file(
        &with_ext(&a.out, "json"),
        &serde_json::to_string_pretty(&r)?,
    )?;
    write!(out, "{md}")?;
    writeln!(
        out,
        "\nwrote {} and {}",
        with_ext(&a.out, "md").display(),
        with_ext(&a.out, "json").display()
    )?;
    Ok(())
}
