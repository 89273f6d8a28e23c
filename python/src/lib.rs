//! The native part of the `blis` Python package (`blis._blis`): workloads
//! generated or read once and replayed many times in-process, with the
//! command line's settings and defaults (the arguments are parsed by the
//! same parser as `blis-replay run`), results as JSON text and trace-v2 CSV
//! bytes that the Python side turns into dicts and Arrow tables
//! (`python/blis/__init__.py`). A command layer, like a `main.rs`: the
//! libraries below know nothing of Python.
//!
//! Errors become `blis.BlisError` with the command line's one-line
//! message (the file, line or flag to fix). The GIL is released while a
//! workload is generated, read, replayed or compared, so Python threads
//! replay in parallel.

use std::path::{Path, PathBuf};

use blis_calibrate::compare::CompareOptions;
use blis_replay::api::{self, Workload as ReplayWorkload, WorkloadOptions, trace_inputs};
use blis_replay::sim::Input;
use blis_replay::{Command, Opts};
use blis_traces::{ExtraColumn, RecordWriter, Trace, TraceHeader, TraceRecord, WorkloadSpec};
use clap::Parser;
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

create_exception!(
    _blis,
    BlisError,
    PyException,
    "Bad input or settings: the message names the file, line, field or flag to fix."
);

/// The one-line message of an error and its causes (as the binaries print it).
fn error_line(e: &(dyn std::error::Error + 'static)) -> String {
    let mut line = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        cause = c.source();
    }
    line
}

fn py_err(e: impl std::error::Error + 'static) -> PyErr {
    BlisError::new_err(error_line(&e))
}

/// What pickling a [`Workload`] gives: the function that rebuilds it and
/// its state (header JSON, per-request timing JSON, records CSV).
type Reduced<'py> = (Bound<'py, PyAny>, (String, String, Bound<'py, PyBytes>));

/// A workload in memory: the requests of a generated spec or of a trace, in
/// entry order, replayable any number of times without generating or
/// reading it again.
#[pyclass(module = "blis._blis", frozen)]
struct Workload {
    header: TraceHeader,
    inputs: Vec<Input>,
    extras: Vec<ExtraColumn>,
}

#[pymethods]
impl Workload {
    fn __len__(&self) -> usize {
        self.inputs.len()
    }

    /// The header as JSON text (trace-v2 header fields).
    fn header_json(&self) -> PyResult<String> {
        serde_json::to_string(&self.header).map_err(py_err)
    }

    /// The requests as trace-v2 CSV bytes (the columns of a trace's CSV).
    fn records_csv<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let records: Vec<TraceRecord> = self.inputs.iter().map(|i| (*i.rec).clone()).collect();
        let bytes = py.detach(|| csv_bytes(&records, &self.extras))?;
        Ok(PyBytes::new(py, &bytes))
    }

    /// Pickling (Ray's object store, multiprocessing): the header, the
    /// records as CSV, and each request's entry, cancellation and
    /// closed-loop flag, rebuilt exactly by `_workload_from_state`.
    fn __reduce__<'py>(&self, py: Python<'py>) -> PyResult<Reduced<'py>> {
        if self
            .inputs
            .iter()
            .any(|i| i.priority.is_some() || i.segments.is_some())
        {
            return Err(BlisError::new_err(
                "this workload carries per-request priorities or content that pickling does not keep",
            ));
        }
        let timing: Vec<(i64, Option<i64>, bool)> = self
            .inputs
            .iter()
            .map(|i| (i.entry_us, i.cancel_at_us, i.closed_loop))
            .collect();
        let records: Vec<TraceRecord> = self.inputs.iter().map(|i| (*i.rec).clone()).collect();
        let mut extras = self.extras.clone();
        for e in ExtraColumn::needed_for(&records) {
            if !extras.contains(&e) {
                extras.push(e);
            }
        }
        let csv = py.detach(|| csv_bytes(&records, &extras))?;
        let state = (
            serde_json::to_string(&self.header).map_err(py_err)?,
            serde_json::to_string(&timing).map_err(py_err)?,
            PyBytes::new(py, &csv),
        );
        let rebuild = py.import("blis._blis")?.getattr("_workload_from_state")?;
        Ok((rebuild, state))
    }

    fn __repr__(&self) -> String {
        format!(
            "Workload({} requests, {})",
            self.inputs.len(),
            self.header.workload_spec.as_deref().map_or_else(
                || format!("{:?}", self.header.mode),
                |s| format!("spec {s}")
            )
        )
    }
}

/// Rebuilds a pickled [`Workload`] (see `Workload.__reduce__`).
#[pyfunction]
fn _workload_from_state(
    py: Python<'_>,
    header: String,
    timing: String,
    csv: Vec<u8>,
) -> PyResult<Workload> {
    py.detach(|| {
        let header: TraceHeader = serde_json::from_str(&header).map_err(py_err)?;
        let timing: Vec<(i64, Option<i64>, bool)> =
            serde_json::from_str(&timing).map_err(py_err)?;
        let mut reader = blis_traces::RecordReader::new(&csv[..], Path::new("<pickled workload>"))
            .map_err(py_err)?;
        let extras = reader.extra_columns();
        let records = reader.read_all().map_err(py_err)?;
        if records.len() != timing.len() {
            return Err(BlisError::new_err(
                "a pickled workload whose parts disagree",
            ));
        }
        let inputs = records
            .into_iter()
            .zip(timing)
            .map(|(rec, (entry_us, cancel_at_us, closed_loop))| Input {
                entry_us,
                rec: Box::new(rec),
                cancel_at_us,
                closed_loop,
                priority: None,
                segments: None,
            })
            .collect();
        Ok(Workload {
            header,
            inputs,
            extras,
        })
    })
}

/// A trace in memory: its header and every record with its outcome (a
/// measured run, or a replay's prediction).
#[pyclass(module = "blis._blis", frozen)]
struct TraceData {
    trace: Trace,
    label: String,
}

#[pymethods]
impl TraceData {
    fn __len__(&self) -> usize {
        self.trace.records.len()
    }

    /// The header as JSON text.
    fn header_json(&self) -> PyResult<String> {
        serde_json::to_string(&self.trace.header).map_err(py_err)
    }

    /// The records as trace-v2 CSV bytes.
    fn records_csv<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let bytes = py.detach(|| {
            let mut extras = ExtraColumn::needed_for(&self.trace.records);
            if !extras.contains(&ExtraColumn::CachedTokens) {
                extras.push(ExtraColumn::CachedTokens);
            }
            csv_bytes(&self.trace.records, &extras)
        })?;
        Ok(PyBytes::new(py, &bytes))
    }

    /// Where it came from (a path, or `replay`).
    #[getter]
    fn label(&self) -> &str {
        &self.label
    }

    /// Its requests as a workload to replay: entry at the recorded send
    /// time, each cancelled after the client's recorded timeout (what
    /// `blis-replay run --trace` replays).
    fn workload(&self) -> Workload {
        let records = self.trace.records.clone();
        Workload {
            inputs: trace_inputs(&self.trace.header, records),
            extras: ExtraColumn::needed_for(&self.trace.records),
            header: self.trace.header.clone(),
        }
    }

    /// Writes it as a trace-v2 bundle at `prefix` (`PREFIX.yaml`,
    /// `PREFIX.csv`); returns the header's path.
    fn write(&self, py: Python<'_>, prefix: PathBuf) -> PyResult<String> {
        let paths = py.detach(|| self.trace.write(&prefix)).map_err(py_err)?;
        Ok(paths.header.display().to_string())
    }
}

fn csv_bytes(records: &[TraceRecord], extras: &[ExtraColumn]) -> PyResult<Vec<u8>> {
    let mut w = RecordWriter::new(Vec::new(), Path::new("<memory>"), extras).map_err(py_err)?;
    for r in records {
        w.write(r).map_err(py_err)?;
    }
    w.finish().map_err(py_err)
}

/// How a workload is cut and seeded (the `run` flags of the same names).
fn workload_options(
    seed: Option<u64>,
    num_requests: Option<u64>,
    horizon_s: Option<f64>,
    aggregate_rate: Option<f64>,
) -> WorkloadOptions {
    WorkloadOptions {
        seed,
        horizon_s,
        num_requests,
        client_timeout_s: None,
        aggregate_rate,
    }
}

/// Generates the workload of a spec given as a path (`text` None) or as
/// YAML/JSON text whose relative data paths resolve against `base_dir`.
#[pyfunction]
#[pyo3(signature = (spec, text=None, base_dir=None, seed=None, num_requests=None, horizon_s=None, aggregate_rate=None))]
#[allow(clippy::too_many_arguments)]
fn generate(
    py: Python<'_>,
    spec: PathBuf,
    text: Option<String>,
    base_dir: Option<PathBuf>,
    seed: Option<u64>,
    num_requests: Option<u64>,
    horizon_s: Option<f64>,
    aggregate_rate: Option<f64>,
) -> PyResult<Workload> {
    let o = workload_options(seed, num_requests, horizon_s, aggregate_rate);
    py.detach(|| {
        let parsed = match &text {
            None => WorkloadSpec::from_file(&spec),
            Some(t) => WorkloadSpec::parse(
                &spec,
                t,
                base_dir.clone().unwrap_or_else(|| PathBuf::from(".")),
            ),
        }
        .map_err(py_err)?;
        let w = api::spec_workload(&parsed, &spec.display().to_string(), &o).map_err(py_err)?;
        let inputs = w.inputs.collect();
        w.failure.check().map_err(py_err)?;
        Ok(Workload {
            header: w.header,
            extras: w.extras,
            inputs,
        })
    })
}

/// Reads a trace-v2 bundle (its header `H.yaml`, or a prefix).
#[pyfunction]
fn read_trace(py: Python<'_>, path: PathBuf) -> PyResult<TraceData> {
    py.detach(|| {
        let header = if path.extension().is_some_and(|e| e == "yaml") {
            path.clone()
        } else {
            blis_traces::TracePaths::from_prefix(&path).header
        };
        let trace = Trace::read(&header).map_err(|e| {
            BlisError::new_err(format!(
                "reading the trace {}: {}",
                header.display(),
                error_line(&e)
            ))
        })?;
        Ok(TraceData {
            trace,
            label: header.display().to_string(),
        })
    })
}

/// Imports a public trace (`KIND:PATH`: mooncake, azure, inference-perf,
/// vllm-gt) with its recorded outcomes (where the source has them); at
/// most `num_requests` of it (the lowest request ids).
#[pyfunction]
#[pyo3(signature = (source, seed=None, num_requests=None))]
fn import_trace(
    py: Python<'_>,
    source: String,
    seed: Option<u64>,
    num_requests: Option<u64>,
) -> PyResult<TraceData> {
    let src: blis_traces::ImportSource = source
        .parse()
        .map_err(|e: String| BlisError::new_err(format!("import source {source:?}: {e}")))?;
    py.detach(|| {
        let mut trace = blis_traces::import(&src, seed.unwrap_or(42))
            .map_err(|e| BlisError::new_err(format!("importing {src}: {}", error_line(&e))))?;
        if let Some(n) = num_requests {
            trace.records.sort_by_key(|r| r.request.request_id);
            trace.records.truncate(n as usize);
        }
        Ok(TraceData {
            trace,
            label: source.clone(),
        })
    })
}

/// A command-line parse error as one line (clap's first line, without its
/// usage and help hints).
fn clap_error(e: clap::Error) -> PyErr {
    let text = e.render().to_string();
    let line = text
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("bad settings")
        .trim_start_matches("error: ")
        .to_string();
    BlisError::new_err(line)
}

/// A [`Workload`]'s parts (copied out while the GIL is held) as the replay
/// library's workload.
fn replayable(
    (header, inputs, extras): (TraceHeader, Vec<Input>, Vec<ExtraColumn>),
) -> ReplayWorkload {
    ReplayWorkload {
        header,
        len: Some(inputs.len() as u64),
        ids_unique: blis_replay::api::all_different(
            inputs.iter().map(|i| i.rec.request.request_id),
        ),
        inputs: Box::new(inputs.into_iter()),
        extras,
        failure: Default::default(),
    }
}

/// Parses `blis-replay run` flags (`--num-instances 4 ...`) with the
/// command line's own parser.
fn run_args(flags: Vec<String>) -> PyResult<blis_replay::RunArgs> {
    let argv = ["blis-replay".to_string(), "run".to_string()]
        .into_iter()
        .chain(flags);
    match Opts::try_parse_from(argv).map_err(clap_error)?.command {
        Command::Run(args) => Ok(args),
        _ => Err(BlisError::new_err("internal: not a run")),
    }
}

/// Replays `workload` (or, when None, the input its flags name:
/// `--workload-spec`, `--trace`, `--import`) with `blis-replay run`'s
/// flags; returns the summary as JSON text and the predicted trace.
#[pyfunction]
#[pyo3(signature = (workload, flags))]
fn replay(
    py: Python<'_>,
    workload: Option<PyRef<'_, Workload>>,
    flags: Vec<String>,
) -> PyResult<(String, TraceData)> {
    let args = run_args(flags)?;
    let given = workload
        .as_ref()
        .map(|w| (w.header.clone(), w.inputs.clone(), w.extras.clone()));
    if given.is_some()
        && (args.trace.is_some() || args.workload_spec.is_some() || args.import.is_some())
    {
        return Err(BlisError::new_err(
            "give the workload either as an object or as workload_spec/trace/import, not both",
        ));
    }
    for (set, flag) in [
        (args.num_requests.is_some(), "num_requests"),
        (args.horizon_s.is_some(), "horizon_s"),
        (args.seed.is_some(), "seed"),
        (args.aggregate_rate.is_some(), "aggregate_rate"),
    ] {
        if set && given.is_some() {
            return Err(BlisError::new_err(format!(
                "{flag} shapes a workload when it is generated or read: give it to blis.generate (or blis.read_trace), not to replay with a workload object"
            )));
        }
    }
    py.detach(move || {
        let w = match given {
            Some(parts) => replayable(parts),
            None => blis_replay::commands::run::load_workload(&args).map_err(py_err)?,
        };
        let (summary, records, header) =
            blis_replay::commands::run::replay_workload(&args, w).map_err(py_err)?;
        let json = serde_json::to_string(&summary).map_err(py_err)?;
        Ok((
            json,
            TraceData {
                trace: Trace::new(header, records),
                label: "replay".into(),
            },
        ))
    })
}

/// Parses `blis-replay evaluate` flags with the command line's parser.
fn evaluate_args(flags: Vec<String>) -> PyResult<blis_replay::commands::cli::EvaluateArgs> {
    let argv = ["blis-replay".to_string(), "evaluate".to_string()]
        .into_iter()
        .chain(flags);
    match Opts::try_parse_from(argv).map_err(clap_error)?.command {
        Command::Evaluate(args) => Ok(args),
        _ => Err(BlisError::new_err("internal: not an evaluation")),
    }
}

/// Evaluates a policy bundle (`--policy-config` among `flags`) as
/// `blis-replay evaluate` does, on `workloads` generated once (one per
/// seed, their own seeds) or, when empty, on the workload its flags name
/// for each of `--seeds`; returns the evaluation as JSON text.
#[pyfunction]
#[pyo3(signature = (workloads, flags))]
fn evaluate(
    py: Python<'_>,
    workloads: Vec<PyRef<'_, Workload>>,
    flags: Vec<String>,
) -> PyResult<String> {
    let mut args = evaluate_args(flags)?;
    let given: Vec<(TraceHeader, Vec<Input>, Vec<ExtraColumn>)> = workloads
        .iter()
        .map(|w| (w.header.clone(), w.inputs.clone(), w.extras.clone()))
        .collect();
    if !given.is_empty() {
        args.seeds = given
            .iter()
            .map(|(h, _, _)| h.workload_seed.unwrap_or(0))
            .collect();
    }
    py.detach(move || {
        let mut next = given.into_iter();
        let e = if next.len() == 0 {
            blis_replay::commands::evaluate::evaluation(
                &args,
                blis_replay::commands::run::load_workload,
            )
        } else {
            blis_replay::commands::evaluate::evaluation(&args, |_| {
                Ok(replayable(next.next().expect("one workload per seed")))
            })
        }
        .map_err(py_err)?;
        serde_json::to_string(&e).map_err(py_err)
    })
}

/// Fits latency coefficients as `blis-calibrate fit` does, with its flags
/// (`--trace`, `--runs`, `--latency-model`, `--out` ...; `--json` is
/// added); returns the fit's report as JSON text and the coefficients file
/// it wrote.
#[pyfunction]
fn fit(py: Python<'_>, flags: Vec<String>) -> PyResult<(String, String)> {
    let argv = ["blis-calibrate".to_string(), "fit".to_string()]
        .into_iter()
        .chain(flags)
        .chain(["--json".to_string()]);
    let args = match blis_calibrate::Opts::try_parse_from(argv)
        .map_err(clap_error)?
        .command
    {
        blis_calibrate::Command::Fit(args) => args,
        _ => return Err(BlisError::new_err("internal: not a fit")),
    };
    py.detach(|| {
        let mut out = Vec::new();
        blis_calibrate::run::fit_command(&args, &mut out).map_err(py_err)?;
        let coefficients = std::fs::read_to_string(&args.out)
            .map_err(|e| BlisError::new_err(format!("reading {}: {e}", args.out.display())))?;
        Ok((String::from_utf8_lossy(&out).into_owned(), coefficients))
    })
}

/// Compares a real trace with a predicted one in memory: the report of
/// `blis-calibrate compare` as JSON text, and as Markdown.
#[pyfunction]
#[pyo3(signature = (real, sim, resamples=None, seed=None, warmup=None, rtt_ms=None, real_label=None))]
#[allow(clippy::too_many_arguments)]
fn compare(
    py: Python<'_>,
    real: PyRef<'_, TraceData>,
    sim: PyRef<'_, TraceData>,
    resamples: Option<usize>,
    seed: Option<u64>,
    warmup: Option<u64>,
    rtt_ms: Option<f64>,
    real_label: Option<String>,
) -> PyResult<(String, String)> {
    let mut o = CompareOptions {
        warmup,
        rtt_ms,
        real_label,
        ..CompareOptions::default()
    };
    if let Some(r) = resamples {
        o.resamples = r;
    }
    if let Some(s) = seed {
        o.seed = s;
    }
    let (real, sim) = (&*real, &*sim);
    py.detach(|| {
        let c = blis_calibrate::run::compare_traces(
            &real.trace,
            &real.label,
            &sim.trace,
            &sim.label,
            &o,
        )
        .map_err(py_err)?;
        let json = serde_json::to_string(&c.report).map_err(py_err)?;
        Ok((json, c.report.to_markdown()))
    })
}

/// The `blis-replay run` flags, for the Python docs and argument checks:
/// (flag, takes a value, help).
#[pyfunction]
fn run_flags() -> Vec<(String, bool, String)> {
    use clap::CommandFactory;
    let cmd = Opts::command();
    let run = cmd
        .get_subcommands()
        .find(|c| c.get_name() == "run")
        .expect("the run command");
    run.get_arguments()
        .filter_map(|a| {
            a.get_long().map(|l| {
                (
                    l.to_string(),
                    a.get_action().takes_values(),
                    a.get_help().map(ToString::to_string).unwrap_or_default(),
                )
            })
        })
        .collect()
}

#[pymodule]
fn _blis(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("BlisError", m.py().get_type::<BlisError>())?;
    m.add_class::<Workload>()?;
    m.add_class::<TraceData>()?;
    m.add_function(wrap_pyfunction!(generate, m)?)?;
    m.add_function(wrap_pyfunction!(read_trace, m)?)?;
    m.add_function(wrap_pyfunction!(import_trace, m)?)?;
    m.add_function(wrap_pyfunction!(replay, m)?)?;
    m.add_function(wrap_pyfunction!(compare, m)?)?;
    m.add_function(wrap_pyfunction!(evaluate, m)?)?;
    m.add_function(wrap_pyfunction!(fit, m)?)?;
    m.add_function(wrap_pyfunction!(run_flags, m)?)?;
    m.add_function(wrap_pyfunction!(_workload_from_state, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
