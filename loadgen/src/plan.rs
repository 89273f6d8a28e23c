//! Planning a workload: from a spec or an import to requests, and the
//! `generate` subcommand.

use crate::{CommandError, Result};
use blis_traces::step::StepContext;
use std::io::Write;

use blis_traces::{
    ExtraColumn, ExtraColumnTally, GenerateOptions, Generator, Mode, TraceHeader, TraceRecord,
    TraceWriter, WorkloadSpec, WorkloadSummary, WorkloadTally,
};

use crate::options::{PlanOptions, Synthetic, WorkloadSource};

/// Default seed when neither the spec nor the command line gives one.
pub const DEFAULT_SEED: u64 = 42;

/// Why a workload could not be planned.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// A flag's value (named in the message) is invalid or missing.
    #[error("{0}")]
    Flag(String),
    /// A trace or import could not be read.
    #[error("{what}")]
    Input {
        /// What was being read.
        what: String,
        /// Why it failed.
        source: blis_traces::Error,
    },
    /// A workload spec is unreadable or invalid, or generation failed.
    #[error(transparent)]
    Workload(#[from] blis_traces::Error),
}

/// A planned workload: generated from a spec (lazily, as often as
/// needed: the same spec, options and seed give the same requests), or
/// read from a trace or an import (held in memory, as read).
#[derive(Debug)]
pub enum Workload {
    /// From a workload spec or `--rate`.
    Generated(GeneratedWorkload),
    /// From a trace or an import: its requests as planned trace records.
    Loaded(Vec<TraceRecord>),
}

/// A workload generated from a spec ([`Generator`]).
#[derive(Debug, Clone)]
pub struct GeneratedWorkload {
    spec: Box<WorkloadSpec>,
    opts: GenerateOptions,
    /// `--rate inf`: every request arrives at the start (a burst, `vllm
    /// bench serve`'s default request rate).
    burst: bool,
}

impl GeneratedWorkload {
    /// Its planned requests in arrival order, generated as iterated.
    ///
    /// # Errors
    /// As [`Generator::new`]; each item as the generator's.
    pub fn records(
        &self,
    ) -> Result<impl Iterator<Item = Result<TraceRecord, blis_traces::Error>> + use<>, PlanError>
    {
        let burst = self.burst;
        Ok(Generator::new(&self.spec, &self.opts)?.map(move |r| {
            r.map(|mut q| {
                if burst {
                    q.arrival_time_us = 0;
                }
                TraceRecord::planned(q)
            })
        }))
    }
}

/// Plans the workload of `w`, with a header describing where it came from.
///
/// # Errors
/// Unreadable or invalid spec or import.
pub fn plan_workload(
    w: &WorkloadSource,
    synthetic: &Synthetic,
    opts: &GenerateOptions,
) -> Result<(TraceHeader, Workload), PlanError> {
    if opts.aggregate_rate.is_some() && w.workload_spec.is_none() {
        return Err(PlanError::Flag(
            "--aggregate-rate sets a workload spec's rate: give it with --workload-spec (a --rate workload takes its rate from --rate; a trace or import keeps its recorded times)".into(),
        ));
    }
    if let Some(rate) = w.rate {
        let (h, g) = synthetic_workload(rate, synthetic, opts)?;
        return Ok((h, Workload::Generated(g)));
    }
    if synthetic.given {
        return Err(PlanError::Flag(
            "--input-tokens, --output-tokens, --arrival and --burstiness shape a --rate workload; a workload spec, trace or import brings its own lengths and arrivals".into(),
        ));
    }
    if let Some(path) = &w.trace {
        let (h, r) = replanned_trace(path, opts)?;
        return Ok((h, Workload::Loaded(r)));
    }
    if let Some(path) = &w.workload_spec {
        let spec = WorkloadSpec::from_file(path)?;
        let seed = opts.seed.unwrap_or_else(|| spec.seed_or_default());
        // Checked here, so that a bad spec fails before anything else.
        Generator::new(&spec, opts)?;
        let mut header = TraceHeader::new(Mode::Generated);
        header.workload_seed = Some(seed);
        header.workload_spec = Some(path.display().to_string());
        let g = GeneratedWorkload {
            spec: Box::new(spec),
            opts: *opts,
            burst: false,
        };
        return Ok((header, Workload::Generated(g)));
    }
    if let Some(src) = &w.import {
        let seed = opts.seed.unwrap_or(DEFAULT_SEED);
        let mut trace = blis_traces::import(src, seed).map_err(|source| PlanError::Input {
            what: format!("importing {src}"),
            source,
        })?;
        if let Some(h) = opts.horizon_us {
            trace
                .records
                .retain(|r| r.request.arrival_time_us < h as i64);
        }
        if let Some(n) = opts.num_requests {
            trace.records.truncate(n as usize);
        }
        return Ok((trace.header, Workload::Loaded(trace.records)));
    }
    Err(PlanError::Flag(
        "give --workload-spec or --import".to_string(),
    ))
}

/// Loads the workload of `w` as planned trace records and a header
/// describing where they came from.
///
/// # Errors
/// Unreadable or invalid spec or import.
pub fn load_workload(
    w: &WorkloadSource,
    synthetic: &Synthetic,
    opts: &GenerateOptions,
) -> Result<(TraceHeader, Vec<TraceRecord>), PlanError> {
    let (header, workload) = plan_workload(w, synthetic, opts)?;
    let records = match workload {
        Workload::Loaded(r) => r,
        Workload::Generated(g) => g.records()?.collect::<Result<Vec<_>, _>>()?,
    };
    Ok((header, records))
}

/// A stream at `rate` requests/s, Poisson or constant (`--arrival`), with
/// the token lengths of `--input-tokens` and `--output-tokens`.
///
/// # Errors
/// A rate that is not a positive number, no request count or duration,
/// an unreadable length distribution.
fn synthetic_workload(
    rate: f64,
    synthetic: &Synthetic,
    opts: &GenerateOptions,
) -> Result<(TraceHeader, GeneratedWorkload), PlanError> {
    let burst = rate == f64::INFINITY;
    if rate.is_nan() || rate <= 0.0 {
        return Err(PlanError::Flag(format!(
            "--rate must be a positive number of requests/s (or inf: every request at the start), got {}",
            blis_traces::shown::Num(rate)
        )));
    }
    if burst && (opts.num_requests.is_none() || opts.horizon_us.is_some()) {
        return Err(PlanError::Flag(
            "--rate inf sends every request at the start: give --num-requests, and no duration"
                .to_string(),
        ));
    }
    if opts.num_requests.is_none() && opts.horizon_us.is_none() {
        return Err(PlanError::Flag(
            "--rate needs --num-requests or a duration".to_string(),
        ));
    }
    let arrival = match synthetic.burstiness {
        None => format!("{{process: {}}}", synthetic.arrival.spec_name()),
        Some(_) if burst => {
            return Err(PlanError::Flag(
                "--burstiness shapes the gaps between requests: --rate inf has none".to_string(),
            ));
        }
        Some(f) if f.is_finite() && f > 0.0 => format!("{{process: gamma, shape: {f}}}"),
        Some(f) => {
            return Err(PlanError::Flag(format!(
                "--burstiness must be a positive number (1: Poisson), got {}",
                blis_traces::shown::Num(f)
            )));
        }
    };
    // (A burst's lengths are drawn as a stream's; its arrival times are
    // then all 0.)
    let spec_rate = if burst { 1.0 } else { rate };
    let yaml = format!(
        "aggregate_rate: {spec_rate}\nclients:\n  - id: synthetic\n    streaming: true\n    arrival: {arrival}\n    input_distribution: {}\n    output_distribution: {}\n",
        dist_yaml("--input-tokens", &synthetic.input_tokens)?,
        dist_yaml("--output-tokens", &synthetic.output_tokens)?
    );
    let spec = WorkloadSpec::from_yaml_str(&yaml)?;
    let seed = opts.seed.unwrap_or(DEFAULT_SEED);
    let opts = GenerateOptions {
        seed: Some(seed),
        ..*opts
    };
    Generator::new(&spec, &opts)?;
    let mut header = TraceHeader::new(Mode::Generated);
    header.workload_seed = Some(seed);
    header.workload_spec = Some(if burst {
        format!(
            "synthetic: all at once (--rate inf), input {}, output {}",
            synthetic.input_tokens, synthetic.output_tokens
        )
    } else {
        format!(
            "synthetic: {} {rate} req/s, input {}, output {}",
            synthetic.burstiness.map_or_else(
                || synthetic.arrival.spec_name().to_string(),
                |f| format!("gamma (burstiness {f})")
            ),
            synthetic.input_tokens,
            synthetic.output_tokens
        )
    });
    Ok((
        header,
        GeneratedWorkload {
            spec: Box::new(spec),
            opts,
            burst,
        },
    ))
}

/// A recorded trace replanned: its requests in arrival order, cut at the
/// horizon and count, with the server's prompt counts as their lengths
/// and no outcome.
///
/// # Errors
/// The trace cannot be read.
fn replanned_trace(
    path: &std::path::Path,
    opts: &GenerateOptions,
) -> Result<(TraceHeader, Vec<TraceRecord>), PlanError> {
    let trace = blis_traces::Trace::read(path).map_err(|source| PlanError::Input {
        what: format!("reading the trace {}", path.display()),
        source,
    })?;
    let mut records = trace.records;
    records.sort_by_key(|r| (r.request.arrival_time_us, r.request.request_id));
    if let Some(h) = opts.horizon_us {
        records.retain(|r| r.request.arrival_time_us < h as i64);
    }
    if let Some(n) = opts.num_requests {
        records.truncate(n as usize);
    }
    for r in &mut records {
        // Replanned: what the server reported becomes the plan.
        if let Some(n) = r.outcome.server_input_tokens {
            r.request.input_tokens = n;
        }
        r.outcome = Default::default();
    }
    let mut header = trace.header;
    header.mode = Mode::Generated;
    header.workload_spec = Some(path.display().to_string());
    Ok((header, records))
}

/// `blis-loadgen generate`: writes the planned trace and prints a summary.
///
/// # Errors
/// Bad input or unwritable output.
pub fn generate_command(args: &PlanOptions, out: &mut dyn Write) -> Result<()> {
    let opts = GenerateOptions {
        seed: args.seed,
        horizon_us: args.horizon_s.map(|s| (s * 1e6).round() as u64),
        num_requests: args.num_requests,
        aggregate_rate: args.aggregate_rate,
    };
    if let Some(h) = args.horizon_s
        && !(h > 0.0 && h.is_finite())
    {
        return Err(CommandError::Usage(format!(
            "--horizon-s must be a positive number of seconds, got {}",
            blis_traces::shown::Num(h)
        )));
    }
    let (mut header, workload) = plan_workload(&args.workload, &args.synthetic, &opts)?;
    if args.keep_measured && header.mode != Mode::Real {
        return Err(CommandError::Usage("--keep-measured keeps what a real run measured, but this workload has no measurements (give --import of a real run, e.g. vllm-gt:RUN_DIR)".into()));
    }
    let create = |header: &TraceHeader, extras: &[ExtraColumn]| {
        TraceWriter::create(&args.out, header, extras, None, false)
            .step(|| format!("creating the trace at {}", args.out.display()))
    };
    let (w, summary) = match workload {
        Workload::Loaded(mut records) => {
            // A generated trace is a plan: keep the requests, drop any
            // outcome (unless asked to keep what was measured).
            if header.mode == Mode::Real && !args.keep_measured {
                header.mode = Mode::Generated;
                for r in &mut records {
                    r.outcome = Default::default();
                }
            }
            let summary = WorkloadSummary::of(records.iter().map(|r| &r.request));
            let mut w = create(&header, &ExtraColumn::needed_for(&records))?;
            for r in &records {
                w.write_record(r)?;
            }
            (w, summary)
        }
        Workload::Generated(g) => {
            // Generated twice rather than held (a hundred million planned
            // requests would take tens of GB): once for the columns the
            // trace needs, once to write it. The same seed gives the same
            // requests both times.
            let mut extras = ExtraColumnTally::default();
            for r in g.records()? {
                extras.add(&r?);
            }
            let mut w = create(&header, &extras.columns())?;
            let mut tally = WorkloadTally::default();
            for r in g.records()? {
                let r = r?;
                tally.add(&r.request);
                w.write_record(&r)?;
            }
            (w, tally.summary())
        }
    };
    let paths = w.finish(&header)?;
    write!(out, "{}", summary.to_markdown())?;
    writeln!(
        out,
        "\nwrote {} and {}",
        paths.header.display(),
        paths.data.display()
    )?;
    Ok(())
}

/// The most values `uniform:A,B` spans: it is written as an empirical PMF
/// of one entry per value, and a workload spec may hold 250,000 YAML nodes
/// (two an entry). vLLM's random dataset, the common use, spans at most
/// twice its mean length.
pub const MAX_UNIFORM_VALUES: u64 = 100_000;

/// The YAML of a length distribution given on the command line: `N`,
/// `gaussian:MEAN,STD`, `exponential:MEAN` or `uniform:A,B` (at most
/// [`MAX_UNIFORM_VALUES`] values); each number at most
/// [`blis_traces::MAX_TOKENS`].
///
/// # Errors
/// Anything else, naming the flag.
pub fn dist_yaml(flag: &str, s: &str) -> Result<String, PlanError> {
    let num = |v: &str| -> Result<f64, PlanError> {
        let x: f64 = v
            .trim()
            .parse()
            .map_err(|_| PlanError::Flag(format!("{flag}: invalid number {v:?} in {s:?}")))?;
        if !(x.is_finite() && x >= 0.0) {
            return Err(PlanError::Flag(format!(
                "{flag}: {x} must be a finite non-negative number"
            )));
        }
        if x > blis_traces::MAX_TOKENS {
            return Err(PlanError::Flag(format!(
                "{flag}: {x} is beyond any model's context: at most 1e9 tokens"
            )));
        }
        Ok(x)
    };
    let (kind, args) = s.split_once(':').unwrap_or(("constant", s));
    Ok(match kind {
        "constant" => format!("{{type: constant, params: {{value: {}}}}}", num(args)?),
        "exponential" => format!("{{type: exponential, params: {{mean: {}}}}}", num(args)?),
        "gaussian" => {
            let (m, sd) = args
                .split_once(',')
                .ok_or_else(|| PlanError::Flag(format!("{flag}: gaussian:MEAN,STD")))?;
            format!(
                "{{type: gaussian, params: {{mean: {}, std_dev: {}}}}}",
                num(m)?,
                num(sd)?
            )
        }
        "uniform" => {
            let (a, b) = args
                .split_once(',')
                .ok_or_else(|| PlanError::Flag(format!("{flag}: uniform:A,B")))?;
            let (a, b) = (num(a)?.round() as u64, num(b)?.round() as u64);
            if b < a {
                return Err(PlanError::Flag(format!("{flag}: uniform:A,B needs A ≤ B")));
            }
            if b - a >= MAX_UNIFORM_VALUES {
                return Err(PlanError::Flag(format!(
                    "{flag}: uniform:{a},{b} spans {} values, more than the {MAX_UNIFORM_VALUES} it may (a workload spec's empirical distribution can read a longer PMF from a file)",
                    b - a + 1
                )));
            }
            let p = 1.0 / (b - a + 1) as f64;
            let pmf: Vec<String> = (a..=b).map(|v| format!("{v}: {p}")).collect();
            format!("{{type: empirical, pmf: {{{}}}}}", pmf.join(", "))
        }
        _ => {
            return Err(PlanError::Flag(format!(
                "{flag}: unknown form {s:?} (N, gaussian:MEAN,STD, exponential:MEAN, uniform:A,B)"
            )));
        }
    })
}
