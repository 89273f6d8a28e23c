//! `blis-replay run`: load a workload, resolve the server, replay, write the
//! predicted trace and the summary.

use std::io::Write;
use std::time::Instant;

use anyhow::{Context, bail};
use blis_traces::{
    ExtraColumn, GenerateOptions, Generator, Mode, Trace, TraceHeader, TraceRecord, WorkloadSpec,
};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::cli::{Command, LatencyChoice, Opts, RunArgs};
use crate::cluster::{ClusterSummary, Control, DecisionRecord};
use crate::instance::{Instance, Snapshot};
use crate::output::{Collector, Summary};
use crate::policy::PolicyBundle;
use crate::setup::{Resolved, ServerArgs, resolve};
use crate::sim::{Input, SimOptions, merged, replay, replay_cluster};

/// Runs the command in `opts`, printing its summary to `out`.
///
/// # Errors
/// Bad input or settings, with the file, line or flag to fix.
pub fn run(opts: Opts, out: &mut dyn Write) -> anyhow::Result<()> {
    match opts.command {
        Command::Run(args) => run_replay(&args, out),
        Command::Evaluate(args) => crate::evaluate::evaluate(&args, out),
    }
}

/// Where the requests of a replay come from.
pub struct Workload {
    /// Header of the input trace (a fresh one for specs).
    pub header: TraceHeader,
    /// Requests in entry order.
    pub inputs: Box<dyn Iterator<Item = Input>>,
    /// Extra columns of the input records.
    pub extras: Vec<ExtraColumn>,
    /// Number of requests when known.
    pub len: Option<u64>,
}

impl std::fmt::Debug for Workload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workload").field("len", &self.len).finish()
    }
}

/// The inputs of a whole trace, in entry order (send time relative to the
/// run start when recorded, else intended arrival; ties by request id),
/// each cancelled at its planned deadline or after the client's timeout
/// recorded in the header.
pub fn trace_inputs(header: &TraceHeader, records: Vec<TraceRecord>) -> Vec<Input> {
    let run_start = header.run_start_unix_us.unwrap_or(0);
    let timeout = client_timeout_us(header);
    let mut inputs: Vec<Input> = records
        .into_iter()
        .map(|r| Input::from_record(r, run_start).with_client_timeout(timeout))
        .collect();
    inputs.sort_by_key(|i| (i.entry_us, i.rec.request.request_id));
    inputs
}

/// The client's timeout per request recorded in `header`, µs.
pub fn client_timeout_us(header: &TraceHeader) -> Option<i64> {
    header
        .load_generator
        .as_ref()
        .and_then(|l| l.timeout_s)
        .filter(|t| *t > 0.0 && t.is_finite())
        .map(|t| (t * 1e6).round() as i64)
}

/// Loads the workload named by `args`.
///
/// # Errors
/// Unreadable or invalid input.
pub fn load_workload(args: &RunArgs) -> anyhow::Result<Workload> {
    let opts = GenerateOptions {
        seed: args.seed,
        horizon_us: args.horizon_s.map(|s| (s * 1e6).round() as u64),
        num_requests: args.num_requests,
    };
    if let Some(t) = args.client_timeout_s
        && !(t > 0.0 && t.is_finite())
    {
        bail!("--client-timeout-s must be a positive number of seconds, got {t}");
    }
    let timeout_flag = args.client_timeout_s.map(|t| (t * 1e6).round() as i64);
    let from_trace = |mut trace: Trace| -> Workload {
        if let Some(t) = args.client_timeout_s {
            trace
                .header
                .load_generator
                .get_or_insert_with(Default::default)
                .timeout_s = Some(t);
        }
        let mut records = trace.records;
        if let Some(n) = args.num_requests {
            records.sort_by_key(|r| r.request.request_id);
            records.truncate(n as usize);
        }
        let extras = ExtraColumn::needed_for(&records);
        let inputs = trace_inputs(&trace.header, records);
        let len = inputs.len() as u64;
        Workload {
            header: trace.header,
            inputs: Box::new(inputs.into_iter()),
            extras,
            len: Some(len),
        }
    };
    if let Some(p) = &args.trace {
        let trace = Trace::read(p).with_context(|| format!("reading the trace {}", p.display()))?;
        return Ok(from_trace(trace));
    }
    if let Some(src) = &args.import {
        let trace = blis_traces::import(src, args.seed.unwrap_or(42))
            .with_context(|| format!("importing {src}"))?;
        return Ok(from_trace(trace));
    }
    if let Some(p) = &args.workload_spec {
        let spec = WorkloadSpec::from_file(p)?;
        let mut header = TraceHeader::new(Mode::Generated);
        header.workload_seed = Some(opts.seed.unwrap_or_else(|| spec.seed_or_default()));
        header.workload_spec = Some(p.display().to_string());
        let generator = Generator::new(&spec, &opts)?;
        // A generator error (an unreadable data file mid-way) ends the
        // stream; it was checked when the generator was built.
        let inputs = generator.map_while(Result::ok).map(move |r| {
            Input::from_record(TraceRecord::planned(r), 0).with_client_timeout(timeout_flag)
        });
        return Ok(Workload {
            header,
            inputs: Box::new(inputs),
            extras: vec![ExtraColumn::ThinkTimeUs],
            len: opts.num_requests,
        });
    }
    bail!("give one of --trace, --workload-spec or --import")
}

/// The server settings named by `args`.
pub fn server_args(args: &RunArgs) -> ServerArgs {
    let mut s = ServerArgs {
        model: args.model.clone(),
        latency: args.latency_model.map(LatencyChoice::kind),
        coefficients: args.coefficients.clone(),
        coefficient_rows: None,
        model_config: args.model_config.clone(),
        hardware: args.hardware.clone(),
        hardware_config: args.hardware_config.clone(),
        tp: args.tp,
        gpu_memory_utilization: Some(args.gpu_memory_utilization),
        scheduler: args.scheduler,
        prefix_caching: !args.no_prefix_caching,
        fast_forward: !args.no_fast_forward,
        ..ServerArgs::default()
    };
    args.engine.apply(&mut s);
    s
}

/// The header of a replayed trace: the input's identity, the resolved server.
pub fn replay_header(input: &TraceHeader, resolved: &Resolved) -> TraceHeader {
    let mut h = TraceHeader::new(Mode::Replayed);
    h.warm_up_requests = input.warm_up_requests;
    h.workload_seed = input.workload_seed;
    h.workload_spec = input.workload_spec.clone();
    h.run_start_unix_us = input.run_start_unix_us;
    h.network = input.network.clone();
    let (server, hardware) = resolved.header_sections();
    h.server = Some(server);
    h.hardware = Some(hardware);
    h
}

/// The instances of a cluster run: `bundle.num_instances` copies of the
/// resolved engine (the bundle's scheduler, if it names one).
fn instances(resolved: &Resolved, bundle: &PolicyBundle) -> Vec<Instance> {
    let mut engine = resolved.engine.clone();
    if let Some(s) = bundle.scheduler {
        engine.scheduler = s;
    }
    (0..bundle.num_instances)
        .map(|_| Instance::new(engine.clone(), resolved.latency.clone()))
        .collect()
}

/// Replays `inputs` on the cluster of `bundle` into `sink`; the
/// cluster-wide final snapshot and the cluster section (for a cluster).
pub(crate) fn replay_on<S: crate::sim::Sink>(
    resolved: &Resolved,
    bundle: &PolicyBundle,
    inputs: impl IntoIterator<Item = Input>,
    opts: &SimOptions,
    sink: &mut S,
    trace_k: Option<usize>,
) -> (
    Snapshot,
    Option<ClusterSummary>,
    Option<Vec<DecisionRecord>>,
) {
    let mut insts = instances(resolved, bundle);
    let mut control = Control::new(bundle, insts.len());
    if let Some(k) = trace_k {
        control.trace_decisions(k);
    }
    replay_cluster(&mut insts, &mut control, inputs, opts, sink);
    let snaps: Vec<Snapshot> = insts.iter().map(Instance::snapshot).collect();
    let last = merged(&snaps);
    let cluster = (!bundle.is_single()).then(|| ClusterSummary::of(bundle, &control, &insts));
    (last, cluster, control.decisions.take())
}

/// Writes the decision trace, each decision with its request's outcome,
/// to `path` (JSON lines).
fn write_decisions(
    path: &std::path::Path,
    mut decisions: Vec<DecisionRecord>,
    outcomes: Option<&rustc_hash::FxHashMap<u64, crate::output::RequestOutcome>>,
) -> anyhow::Result<()> {
    use std::io::BufWriter;
    let f = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut w = BufWriter::new(f);
    for d in &mut decisions {
        if let Some(o) = outcomes.and_then(|m| m.get(&d.request_id)) {
            d.status = Some(o.status.to_string());
            d.ttft_ms = o.ttft_us.map(|t| t as f64 / 1e3);
            d.e2e_ms = o.e2e_us.map(|t| t as f64 / 1e3);
        }
        serde_json::to_writer(&mut w, d)?;
        w.write_all(b"\n")?;
    }
    w.flush()
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

pub(crate) fn fitness_weights(
    args: &RunArgs,
) -> anyhow::Result<Option<Vec<(String, crate::fitness::FitnessMetric, f64)>>> {
    args.cluster
        .fitness_weights
        .as_deref()
        .map(crate::fitness::parse_weights)
        .transpose()
        .map_err(|e| anyhow::anyhow!("--fitness-weights: {e}"))
}

fn run_replay(args: &RunArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let Some(prefix) = &args.out else {
        bail!("--out PREFIX is required: where to write the predicted trace");
    };
    let bundle = PolicyBundle::from_args(&args.cluster)?;
    let weights = fitness_weights(args)?;
    let workload = load_workload(args)?;
    let resolved =
        resolve(&server_args(args), Some(&workload.header)).context("configuring the server")?;
    let header = replay_header(&workload.header, &resolved);
    let sample = (args.sample_interval_ms > 0).then(|| args.sample_interval_ms as i64 * 1000);
    let mut sink = Collector::to_files(
        prefix,
        &header,
        &workload.extras,
        !args.no_itl,
        sample.is_some(),
    )
    .with_context(|| format!("creating the outputs at {}", prefix.display()))?;
    let bar = progress(workload.len);
    let inputs = workload.inputs.inspect(|_| bar.inc(1));
    let started = Instant::now();
    let trace_k =
        (args.cluster.trace_level == "decisions").then_some(args.cluster.counterfactual_k);
    if trace_k.is_some() {
        sink.track_outcomes();
    }
    let (last, cluster, decisions) = replay_on(
        &resolved,
        &bundle,
        inputs,
        &SimOptions {
            sample_interval_us: sample,
            horizon_us: None,
        },
        &mut sink,
        trace_k,
    );
    if let Some(d) = decisions {
        write_decisions(
            &prefix.with_extension("decisions.jsonl"),
            d,
            sink.outcomes(),
        )?;
    }
    let elapsed = started.elapsed();
    bar.finish_and_clear();
    let (mut summary, _) = sink.finish(&header, &last, resolved.latency_name())?;
    summary.cluster = cluster;
    summary.fitness = weights.map(|w| crate::fitness::report(&summary, &w));
    let summary_path = prefix.with_extension("summary.json");
    let mut json = serde_json::to_string_pretty(&summary)?;
    json.push('\n');
    std::fs::write(&summary_path, json)
        .with_context(|| format!("writing {}", summary_path.display()))?;
    if args.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&summary)?)?;
    } else {
        write!(out, "{}", render_summary(&summary, &resolved))?;
        writeln!(
            out,
            "\nwrote {}.{{yaml,csv{}{}}} and {}",
            prefix.display(),
            if args.no_itl { "" } else { ",itl.csv" },
            if sample.is_some() { ",metrics.csv" } else { "" },
            summary_path.display()
        )?;
    }
    blis_traces::diag!(
        "replayed {} requests ({} steps) in {:.1} ms of wall time",
        summary.requests.total,
        summary.steps,
        elapsed.as_secs_f64() * 1e3
    );
    Ok(())
}

fn progress(len: Option<u64>) -> ProgressBar {
    let bar = match len {
        Some(n) => ProgressBar::new(n),
        None => ProgressBar::no_length(),
    };
    bar.set_draw_target(ProgressDrawTarget::stderr());
    if let Ok(style) =
        ProgressStyle::with_template("{spinner} replaying {pos}/{len} requests {wide_bar} {eta}")
    {
        bar.set_style(style);
    }
    bar
}

impl Resolved {
    /// Name of the latency model.
    pub fn latency_name(&self) -> &'static str {
        use crate::latency::LatencyModel;
        self.latency.name()
    }
}

/// A one-screen Markdown rendering of a summary.
pub fn render_summary(s: &Summary, r: &Resolved) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let e = &r.engine;
    let _ = writeln!(
        o,
        "## blis-replay: {} on {} TP{} ({} latency model)\n",
        if r.model.is_empty() {
            "(model unset)"
        } else {
            &r.model
        },
        r.gpu,
        r.tp,
        s.latency_model
    );
    let _ = writeln!(
        o,
        "max_num_seqs {} · max_num_batched_tokens {} · block_size {} · total_kv_blocks {} · scheduler {} · prefix caching {}\n",
        e.max_num_seqs,
        e.max_num_batched_tokens,
        e.block_size,
        e.total_kv_blocks,
        e.scheduler,
        if e.prefix_caching { "on" } else { "off" }
    );
    let c = &s.requests;
    let _ = writeln!(
        o,
        "requests: {} total, {} completed, {} cancelled (client timeout), {} dropped (unservable), {} input errors, {} unfinished\n",
        c.total, c.completed, c.cancelled, c.dropped, c.input_errors, c.unfinished
    );
    let _ = writeln!(o, "| metric (ms) | n | mean | p50 | p90 | p95 | p99 |");
    let _ = writeln!(o, "|---|---:|---:|---:|---:|---:|---:|");
    for (name, d) in [
        ("TTFT", &s.ttft_ms),
        ("ITL", &s.itl_ms),
        ("TPOT", &s.tpot_ms),
        ("E2E", &s.e2e_ms),
    ] {
        let _ = writeln!(
            o,
            "| {name} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
            d.n, d.mean, d.p50, d.p90, d.p95, d.p99
        );
    }
    let t = &s.throughput;
    let _ = writeln!(
        o,
        "\nthroughput: {:.2} req/s, {:.1} output tok/s, {:.1} input tok/s over {:.1} s",
        t.requests_per_s, t.output_tokens_per_s, t.input_tokens_per_s, t.duration_s
    );
    let _ = writeln!(
        o,
        "preemptions: {} · priority inversions: {} · head-of-line blocking: {} · prefix-cache hit rate: {:.1}% · KV usage: peak {:.1}%, mean {:.1}% · steps: {} ({} fast-forwarded)",
        s.preemptions,
        s.anomalies.priority_inversions,
        s.anomalies.hol_blocking_events,
        100.0 * s.prefix_cache.hit_rate,
        100.0 * s.kv.peak_usage,
        100.0 * s.kv.mean_usage,
        s.steps,
        s.fast_forwarded_steps
    );
    o
}

/// Replays a whole trace in memory with `resolved` settings and returns the
/// predicted records (for `blis-calibrate` and tests).
pub fn replay_trace_in_memory(
    header: &TraceHeader,
    records: Vec<TraceRecord>,
    resolved: &Resolved,
    sample_interval_us: Option<i64>,
) -> (Summary, Vec<TraceRecord>) {
    let inputs = trace_inputs(header, records);
    let mut inst = Instance::new(resolved.engine.clone(), resolved.latency.clone());
    let mut sink = Collector::in_memory(header.run_start_unix_us.unwrap_or(0));
    let last = replay(
        &mut inst,
        inputs,
        &SimOptions {
            sample_interval_us,
            horizon_us: None,
        },
        &mut sink,
    );
    let (summary, kept) = sink
        .finish(header, &last, resolved.latency_name())
        .expect("an in-memory collector writes no files");
    (summary, kept.unwrap_or_default())
}
