//! `blis-replay run`: load a workload, resolve the server, replay, write the
//! predicted trace and the summary.

use crate::commands::{CommandError, Result};
use blis_traces::step::StepContext;
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::api::{ClusterRun, Workload, WorkloadOptions, WorkloadSource, replay_header, replay_on};
use blis_traces::ItlForm;

use crate::cluster::DecisionRecord;
use crate::commands::cli::{LatencyChoice, RunArgs};
use crate::engine::instance::TokenTiming;
use crate::output::{Collector, SinkThread, Summary};
use crate::setup::{Resolved, ServerArgs, resolve};
use crate::sim::SimOptions;

/// Loads the workload named by `args` (`--trace`, `--import` or
/// `--workload-spec`, cut by `--seed`, `--horizon-s`, `--num-requests`,
/// `--client-timeout-s`).
///
/// # Errors
/// Unreadable or invalid input, or none given.
pub fn load_workload(args: &RunArgs) -> Result<Workload> {
    let source = if let Some(p) = &args.trace {
        WorkloadSource::Trace(p.clone())
    } else if let Some(src) = &args.import {
        WorkloadSource::Import(src.clone())
    } else if let Some(p) = &args.workload_spec {
        WorkloadSource::Spec(p.clone())
    } else {
        return Err(CommandError::Usage(
            "give one of --trace, --workload-spec or --import".into(),
        ));
    };
    if args.aggregate_rate.is_some() && args.workload_spec.is_none() {
        return Err(CommandError::Usage(
            "--aggregate-rate sets a workload spec's rate: give it with --workload-spec (a trace or import keeps its recorded times)".into(),
        ));
    }
    let opts = WorkloadOptions {
        seed: args.seed,
        horizon_s: args.horizon_s,
        num_requests: args.num_requests,
        client_timeout_s: args.client_timeout_s,
        aggregate_rate: args.aggregate_rate,
    };
    Ok(crate::api::load_workload(&source, &opts)?)
}

/// The server settings named by `args`, with the CPU KV tier of `bundle`.
pub fn server_args(args: &RunArgs, bundle: &crate::cluster::PolicyBundle) -> ServerArgs {
    let mut s = ServerArgs {
        model: args.model.clone(),
        latency: args.latency_model.map(LatencyChoice::kind),
        coefficients: args.coefficients.clone(),
        coefficient_rows: None,
        model_config: args.model_config.clone(),
        hardware: args.hardware.clone(),
        hardware_config: args.hardware_config.clone(),
        tp: args.tp,
        gpu_memory_utilization: args.gpu_memory_utilization,
        scheduler: args.scheduler,
        prefix_caching: !args.no_prefix_caching,
        fast_forward: !args.no_fast_forward,
        kv_tier: bundle.kv.clone(),
        ..ServerArgs::default()
    };
    args.engine.apply(&mut s);
    s
}

/// A P/D split needs the bytes of a KV block: from the model's config or
/// the bundle.
///
/// # Errors
/// Neither gives them.
pub fn check_pd(bundle: &crate::cluster::PolicyBundle, resolved: &Resolved) -> Result<()> {
    match &bundle.pd {
        Some(pd) if pd.block_bytes.is_none() && resolved.kv_bytes_per_token.is_none() => {
            Err(CommandError::Usage(
                "--architecture pd: the size of the KV blocks to transfer needs the model's config (--model-config, or a model with a bundled config) or pd.block_bytes in the policy bundle".into(),
            ))
        }
        _ => Ok(()),
    }
}

/// Writes the decision trace, each decision with its request's outcome,
/// and the autoscaler's actions (`"kind": "scale"`; before the decisions
/// at the same µs) to `path` (JSON lines, in time order).
fn write_decisions(
    path: &std::path::Path,
    mut decisions: Vec<DecisionRecord>,
    scale: &[crate::cluster::autoscale::ScaleEvent],
    outcomes: Option<&rustc_hash::FxHashMap<u64, crate::output::RequestOutcome>>,
) -> Result<()> {
    use std::io::BufWriter;
    let f = std::fs::File::create(path).step(|| format!("creating {}", path.display()))?;
    let mut w = BufWriter::new(f);
    let mut scale = scale.iter().peekable();
    for d in &mut decisions {
        while let Some(e) = scale.next_if(|e| e.time_us <= d.time_us) {
            serde_json::to_writer(&mut w, e)?;
            w.write_all(b"\n")?;
        }
        if let Some(o) = outcomes.and_then(|m| m.get(&d.request_id)) {
            d.status = Some(o.status.to_string());
            d.ttft_ms = o.ttft_us.map(|t| t as f64 / 1e3);
            d.e2e_ms = o.e2e_us.map(|t| t as f64 / 1e3);
        }
        serde_json::to_writer(&mut w, d)?;
        w.write_all(b"\n")?;
    }
    for e in scale {
        serde_json::to_writer(&mut w, e)?;
        w.write_all(b"\n")?;
    }
    w.flush().step(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// The weights of `--fitness-weights`.
///
/// # Errors
/// A malformed list.
pub fn fitness_weights(
    args: &RunArgs,
) -> Result<Option<Vec<(String, crate::output::fitness::FitnessMetric, f64)>>> {
    args.cluster
        .fitness_weights
        .as_deref()
        .map(crate::output::fitness::parse_weights)
        .transpose()
        .map_err(|e| CommandError::Usage(format!("--fitness-weights: {e}")))
}

/// The form of the ITL companion: none (`--no-itl`), rows (`--itl-rows`),
/// else the step form with the latency model's output overheads.
fn itl_form(args: &RunArgs, resolved: &Resolved) -> ItlForm {
    if args.no_itl {
        ItlForm::None
    } else if args.itl_rows {
        ItlForm::Rows { with_tokens: false }
    } else {
        ItlForm::Steps(TokenTiming::of(&resolved.latency).itl())
    }
}

/// Replays the workload of `run` on the cluster of `bundle` in memory (no
/// files), sampling the time series every `sample_us` and judging `run`'s
/// SLO when it has one; the run's summary with its cluster section. What
/// `evaluate` does per seed and `compare --policies` per bundle.
///
/// # Errors
/// Bad input or settings.
pub(crate) fn replay_in_memory(
    run: &RunArgs,
    bundle: &crate::cluster::PolicyBundle,
    sample_us: Option<i64>,
    workload: Workload,
) -> Result<crate::output::summary::Summary> {
    Ok(simulate(run, bundle, sample_us, workload, false)?.0)
}

/// The replay behind [`replay_in_memory`] (`keep` false: statistics only)
/// and [`replay_workload`] (`keep`: the predicted records and the header
/// `run` writes): the summary with its cluster section, the records, the
/// header.
fn simulate(
    run: &RunArgs,
    bundle: &crate::cluster::PolicyBundle,
    sample_us: Option<i64>,
    workload: Workload,
    keep: bool,
) -> Result<(
    Summary,
    Vec<blis_traces::TraceRecord>,
    blis_traces::TraceHeader,
)> {
    let resolved = resolve(&server_args(run, bundle), Some(&workload.header))
        .step(|| "configuring the server")?;
    check_pd(bundle, &resolved)?;
    let (header, mut sink) = if keep {
        let h = replay_header(&workload.header, &resolved);
        let sink = Collector::in_memory(h.run_start_unix_us.unwrap_or(0));
        (h, sink)
    } else {
        (
            blis_traces::TraceHeader::new(blis_traces::Mode::Replayed),
            Collector::stats_only(),
        )
    };
    if let Some(slo) = run.slo {
        sink.judge_slo(slo);
    }
    let input_failure = workload.failure.clone();
    let mut threaded = SinkThread::new(sink).step(|| "starting the output thread")?;
    let ClusterRun {
        last,
        cluster,
        failure,
        ..
    } = replay_on(
        &resolved,
        bundle,
        workload.inputs,
        workload.ids_unique,
        &SimOptions {
            sample_interval_us: sample_us,
            horizon_us: None,
        },
        &mut threaded,
        None,
    );
    let sink = threaded.into_inner();
    input_failure.check()?;
    policy_failed(failure)?;
    let (mut summary, kept) = sink.finish(&header, &last, resolved.latency_name())?;
    summary.cluster = cluster;
    Ok((summary, kept.unwrap_or_default(), header))
}

/// A code policy whose call failed makes the run a failed evaluation: the
/// error names the decision and why.
fn policy_failed(failure: Option<crate::cluster::code::CallError>) -> Result<()> {
    match failure {
        Some(e) => Err(CommandError::Usage(e.to_string())),
        None => Ok(()),
    }
}

/// What `run` computes for `args` on `workload`, in memory: no files, no
/// progress bar, the same settings and defaults (`args` comes from the same
/// parser as the command line). Returns the summary (with its cluster
/// section, and its fitness when `args` gives weights) and the predicted
/// records in completion order, with the header `run` would write.
/// The simulation is single-threaded and deterministic; what the Python
/// package's `replay` runs.
///
/// # Errors
/// Bad settings or a policy bundle that cannot be read.
pub fn replay_workload(
    args: &RunArgs,
    workload: Workload,
) -> Result<(
    Summary,
    Vec<blis_traces::TraceRecord>,
    blis_traces::TraceHeader,
)> {
    let bundle = args.cluster.bundle()?;
    let weights = fitness_weights(args)?;
    let sample = (args.sample_interval_ms > 0).then(|| args.sample_interval_ms as i64 * 1000);
    let (mut summary, records, header) = simulate(args, &bundle, sample, workload, true)?;
    summary.fitness = weights.map(|w| crate::output::fitness::report(&summary, &w));
    Ok((summary, records, header))
}

/// `blis-replay run`: replays, writes the outputs at `--out`, prints the summary.
///
/// # Errors
/// Bad input or settings, with the file, line or flag to fix.
pub fn run_replay(args: &RunArgs, out: &mut dyn Write) -> Result<()> {
    let Some(prefix) = &args.out else {
        return Err(CommandError::Usage(
            "--out PREFIX is required: where to write the predicted trace".into(),
        ));
    };
    let bundle = args.cluster.bundle()?;
    let weights = fitness_weights(args)?;
    let workload = load_workload(args)?;
    let resolved = resolve(&server_args(args, &bundle), Some(&workload.header))
        .step(|| "configuring the server")?;
    check_pd(&bundle, &resolved)?;
    let header = replay_header(&workload.header, &resolved);
    let sample = (args.sample_interval_ms > 0).then(|| args.sample_interval_ms as i64 * 1000);
    let mut sink = Collector::to_files(
        prefix,
        &header,
        &workload.extras,
        itl_form(args, &resolved),
        sample.is_some(),
    )
    .step(|| format!("creating the outputs at {}", prefix.display()))?;
    let bar = progress(workload.len);
    let input_failure = workload.failure.clone();
    let ids_unique = workload.ids_unique;
    // (The bar moves every 64 requests: an update per request, a lock
    // and a clock read, was 1% of the 10K x 4 race's instructions.)
    let mut read = 0u64;
    let inputs = workload.inputs.inspect(|_| {
        read += 1;
        if read.is_multiple_of(64) {
            bar.set_position(read);
        }
    });
    let started = Instant::now();
    let trace_k =
        (args.cluster.trace_level == "decisions").then_some(args.cluster.counterfactual_k);
    if trace_k.is_some() {
        sink.track_outcomes();
    }
    if let Some(slo) = args.slo {
        sink.judge_slo(slo);
    }
    // Ctrl-C (or SIGTERM) stops the replay at its next event; the outputs
    // are then written as usual, the rest of the requests unfinished.
    let stop = stop_on_signals().step(|| "setting up Ctrl-C")?;
    stop.store(false, Ordering::Relaxed);
    // The outputs are made on a second core beside the simulation.
    let mut threaded = SinkThread::new(sink).step(|| "starting the output thread")?;
    let ClusterRun {
        last,
        cluster,
        decisions,
        failure,
    } = replay_on(
        &resolved,
        &bundle,
        inputs,
        ids_unique,
        &SimOptions {
            sample_interval_us: sample,
            horizon_us: None,
        },
        &mut threaded,
        trace_k,
    );
    let interrupted = stop.load(Ordering::Relaxed);
    let sink = threaded.into_inner();
    bar.finish_and_clear();
    input_failure.check()?;
    policy_failed(failure)?;
    if let Some(d) = decisions {
        let scale = cluster
            .as_ref()
            .and_then(|c| c.autoscale.as_ref())
            .map_or(&[][..], |a| &a.events[..]);
        write_decisions(
            &beside(prefix, "decisions.jsonl"),
            d,
            scale,
            sink.outcomes(),
        )?;
    }
    let elapsed = started.elapsed();
    bar.finish_and_clear();
    let (mut summary, _) = sink.finish(&header, &last, resolved.latency_name())?;
    summary.cluster = cluster;
    summary.fitness = weights.map(|w| crate::output::fitness::report(&summary, &w));
    let summary_path = beside(prefix, "summary.json");
    let mut json = serde_json::to_string_pretty(&summary)?;
    json.push('\n');
    std::fs::write(&summary_path, json).step(|| format!("writing {}", summary_path.display()))?;
    if args.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&summary)?)?;
    } else {
        write!(out, "{}", render_summary(&summary, &resolved))?;
        if let Some(note) =
            latency_disagreement(&server_args(args, &bundle), &workload.header, &resolved)
        {
            writeln!(out, "\n{note}")?;
        }
        writeln!(
            out,
            "\nwrote {}.{{yaml,csv{}{}}} and {}",
            prefix.display(),
            match itl_form(args, &resolved) {
                ItlForm::None => "",
                ItlForm::Rows { .. } => ",itl.csv",
                ItlForm::Steps(_) => ",itl.csv,steps.csv",
            },
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
    if interrupted {
        return Err(CommandError::Ended {
            code: blis_traces::exit_code::INTERRUPTED,
            message: format!(
                "interrupted: the replay stopped early; {} of {} requests completed, and {} are recorded as unfinished in {}.csv (the summary covers the replay up to the stop)",
                summary.requests.completed,
                summary.requests.total,
                summary.requests.unfinished,
                prefix.display()
            ),
        });
    }
    Ok(())
}

/// The replays' stop flag ([`crate::sim::stop_flag`]), set from now on by
/// SIGINT and SIGTERM; a second signal once it is set ends the process at
/// once (exit code 130 or 143). Registered once per process (a handler
/// cannot be removed without leaving the signal ignored).
///
/// # Errors
/// The OS refused a handler.
fn stop_on_signals() -> std::io::Result<Arc<AtomicBool>> {
    static REGISTERED: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    let stop = crate::sim::stop_flag();
    REGISTERED
        .get_or_init(|| {
            use signal_hook::consts::{SIGINT, SIGTERM};
            for (signal, code) in [(SIGINT, 130), (SIGTERM, 143)] {
                // The shutdown first: it sees the flag as the earlier
                // signal left it.
                signal_hook::flag::register_conditional_shutdown(signal, code, Arc::clone(&stop))
                    .and_then(|_| signal_hook::flag::register(signal, Arc::clone(&stop)))
                    .map_err(|e| e.to_string())?;
            }
            Ok(())
        })
        .clone()
        .map_err(std::io::Error::other)?;
    Ok(stop)
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

/// The cluster lines of a summary: instances, admission and routing
/// policies, requests routed to each instance, and a warning when an
/// instance got none or more than twice the mean (with the likely cause
/// when the router has no load-spreading scorer).
fn render_cluster(c: &crate::cluster::control::ClusterSummary) -> String {
    use crate::cluster::routing::{RoutingPolicy, Scorer};
    use std::fmt::Write as _;
    let mut o = String::new();
    let routed: Vec<u64> = c.instances.iter().map(|i| i.routed).collect();
    let total: u64 = routed.iter().sum();
    // The mean over the instances that could take requests.
    let serving = c.instances.iter().filter(|i| !i.never_ready).count();
    let mean = total as f64 / serving.max(1) as f64;
    let shown = if routed.len() <= 16 {
        format!("{routed:?}")
    } else {
        let (lo, hi) = (
            routed.iter().min().copied().unwrap_or(0),
            routed.iter().max().copied().unwrap_or(0),
        );
        format!("{lo}–{hi} per instance")
    };
    let mut ordering = String::new();
    if c.priority != crate::cluster::priority::PriorityPolicy::default() {
        let _ = write!(ordering, " · priority {}", c.priority.name());
    }
    if let Some(s) = &c.scheduling {
        let _ = write!(ordering, " · scheduling {}", s.name());
    }
    let _ = writeln!(
        o,
        "cluster: {} instances · admission {} · routing {}{ordering} · requests routed {shown}{}",
        c.num_instances,
        c.admission.name(),
        c.routing.describe(),
        if c.rejected > 0 {
            format!(" · {} rejected by admission", c.rejected)
        } else {
            String::new()
        }
    );
    if total == 0 {
        return o;
    }
    // (An autoscaled slot never started could get nothing.)
    let idle: Vec<usize> = c
        .instances
        .iter()
        .filter(|i| i.routed == 0 && !i.never_ready)
        .map(|i| i.index)
        .collect();
    let spreads = match &c.routing {
        RoutingPolicy::Weighted { scorers } => scorers.iter().any(|(s, w)| {
            *w > 0.0
                && matches!(
                    s,
                    Scorer::QueueDepth
                        | Scorer::KvUtilization
                        | Scorer::LoadBalance
                        | Scorer::NoHitLru
                )
        }),
        _ => true,
    };
    let hint = if spreads {
        String::new()
    } else {
        " (the routing has no scorer that spreads load: prefix-affinity alone keeps sending requests where their prefix went first; add queue-depth or kv-utilization, e.g. --routing-scorers prefix-affinity:3,queue-depth:2)".to_string()
    };
    if !idle.is_empty() {
        let _ = writeln!(
            o,
            "warning: {} of {} instances got no request (instance{} {}){hint}",
            idle.len(),
            c.num_instances,
            if idle.len() == 1 { "" } else { "s" },
            idle.iter()
                .take(8)
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(", ")
                + if idle.len() > 8 { ", …" } else { "" }
        );
    } else if let Some((i, &max)) = routed.iter().enumerate().max_by_key(|(_, r)| **r)
        && max as f64 > 2.0 * mean
    {
        let _ = writeln!(
            o,
            "warning: instance {i} got {:.1}× the mean number of requests{hint}",
            max as f64 / mean
        );
    }
    o
}

/// When the two fitted latency models this setup could use (trained-physics
/// and a blackbox row) disagree by more than 25% on one decode step (32
/// requests with 1,000 tokens of context each): each one's step, which one
/// ran, and which is validated. `None` when they agree or only one applies.
/// (The roofline, a bound by design, is not among them.)
fn latency_disagreement(
    args: &ServerArgs,
    header: &blis_traces::TraceHeader,
    resolved: &Resolved,
) -> Option<String> {
    use crate::latency::coefficients::LatencyKind;
    use crate::latency::{BatchShape, LatencyModel};
    let shape = BatchShape {
        prefill: Vec::new(),
        decode_count: 32,
        decode_context_sum: 32_000,
    };
    let mut steps = Vec::new();
    for (kind, name) in [
        (LatencyKind::TrainedPhysics, "trained-physics"),
        (LatencyKind::Blackbox, "blackbox"),
    ] {
        let a = ServerArgs {
            latency: Some(kind),
            ..args.clone()
        };
        if let Ok(r) = resolve(&a, Some(header)) {
            steps.push((name, r.latency.step_time_us(&shape) / 1e3));
        }
    }
    let lo = steps.iter().map(|s| s.1).fold(f64::INFINITY, f64::min);
    let hi = steps.iter().map(|s| s.1).fold(0.0, f64::max);
    if steps.len() < 2 || hi <= 1.25 * lo {
        return None;
    }
    Some(format!(
        "note: the latency models disagree by {:.0}% on this setup (one decode step of 32 requests with 1,000 tokens of context: {}); this run used {}. trained-physics is the one validated on real vLLM runs of models it was not fitted on (docs/trained-physics.md); a blackbox row fitted on your own server's trace (blis-calibrate fit) is validated for that server.",
        100.0 * (hi / lo - 1.0),
        steps
            .iter()
            .map(|(n, ms)| format!("{n} {ms:.2} ms"))
            .collect::<Vec<_>>()
            .join(", "),
        resolved.latency_name()
    ))
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
        "max_num_seqs {} · max_num_batched_tokens {} · block_size {} · total_kv_blocks {} · scheduler {} · prefix caching {} · chunked prefill {} · async scheduling {}\n",
        e.max_num_seqs,
        e.max_num_batched_tokens,
        e.block_size,
        e.total_kv_blocks,
        e.scheduler,
        if e.prefix_caching { "on" } else { "off" },
        if e.chunked_prefill { "on" } else { "off" },
        if e.async_scheduling { "on" } else { "off" }
    );
    // What was not given by a flag or the trace header: defaults, the
    // version's defaults, assumptions and approximations.
    let inferred: Vec<&String> = r
        .provenance
        .iter()
        .filter(|p| !p.ends_with("(flag)") && !p.ends_with("(trace header)"))
        .collect();
    if !inferred.is_empty() {
        let _ = writeln!(o, "not given by a flag or the trace header:");
        for p in inferred {
            let _ = writeln!(o, "- {p}");
        }
        let _ = writeln!(o);
    }
    let c = &s.requests;
    let _ = writeln!(
        o,
        "requests: {} total, {} completed, {} cancelled (client timeout), {} dropped (unservable), {} input errors, {} unfinished\n",
        c.total, c.completed, c.cancelled, c.dropped, c.input_errors, c.unfinished
    );
    if let Some(why) = &s.first_drop_reason {
        let _ = writeln!(
            o,
            "warning: {} of {} requests were dropped as unservable; the first: {why} (it needs {})\n",
            c.dropped,
            c.total,
            s.first_drop_hint.unwrap_or("a larger engine")
        );
    }
    let _ = writeln!(o, "| metric (ms) | n | mean | p50 | p90 | p95 | p99 |");
    let _ = writeln!(o, "|---|---:|---:|---:|---:|---:|---:|");
    for (name, d) in [
        ("TTFT", &s.ttft_ms),
        ("ITL", &s.itl_ms),
        ("TPOT", &s.tpot_ms),
        ("E2E", &s.e2e_ms),
    ] {
        let v = |x: f64| {
            if x.is_finite() {
                format!("{x:.2}")
            } else {
                "—".to_string()
            }
        };
        let _ = writeln!(
            o,
            "| {name} | {} | {} | {} | {} | {} | {} |",
            d.n.unwrap_or(0),
            v(d.mean),
            v(d.p50),
            v(d.p90),
            v(d.p95),
            v(d.p99)
        );
    }
    let t = &s.throughput;
    if let Some(g) = &s.slo {
        let _ = writeln!(
            o,
            "\nSLO attainment: {:.1}% ({} of {} requests) · goodput {:.2} req/s",
            100.0 * g.attainment,
            g.attained,
            g.requests,
            g.goodput_per_s
        );
    }
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
    if let Some(c) = s.cluster.as_ref().filter(|c| c.num_instances > 1) {
        o.push_str(&render_cluster(c));
    }
    if let Some(pd) = s.cluster.as_ref().and_then(|c| c.pd.as_ref()) {
        let _ = writeln!(
            o,
            "P/D: {} prefill + {} decode instances · {} transfers of {:.2} ms on average ({} KV blocks) · {} waited for room · prefill end to decode admission {:.2} ms on average",
            pd.prefill_instances,
            pd.decode_instances,
            pd.counters.transfers,
            pd.mean_transfer_ms,
            pd.counters.blocks,
            pd.counters.transfer_waits,
            pd.mean_handoff_ms
        );
    }
    if let Some(a) = s.cluster.as_ref().and_then(|c| c.autoscale.as_ref()) {
        let c = &a.counters;
        let _ = writeln!(
            o,
            "autoscaler ({}, {}–{} {}replicas, ready {:.0} s after a scale-up): {} up · {} down · peak {} ready · {} oscillations · {:.0} replica-seconds = {:.3} GPU-hours{}",
            a.policy,
            a.min_replicas,
            a.max_replicas,
            if a.fixed_replicas > 0 { "decode " } else { "" },
            a.startup_s,
            c.scale_ups,
            c.scale_downs,
            c.peak_ready,
            c.oscillations,
            a.replica_seconds,
            a.gpu_hours,
            match (c.drain_cut, c.redirected) {
                (0, 0) => String::new(),
                (cut, r) => format!(" · drains cut off {cut} and redirected {r} requests"),
            }
        );
    }
    if let Some(t) = &s.kv.cpu_tier {
        let _ = writeln!(
            o,
            "CPU KV tier: {} blocks · {} offloaded · {} reloaded ({:.1}% of the prompt tokens the GPU missed) · {} thrashing · {} CPU evictions · {:.1} ms of transfers in {} reloads",
            t.total_blocks,
            t.offloads,
            t.reloads,
            100.0 * t.hit_rate,
            t.thrashing,
            t.cpu_evictions,
            t.transfer_ms,
            t.transfers
        );
    }
    o
}

/// `PREFIX.ext` for an output prefix (a dot in the prefix stays:
/// `out/run-0.9` gives `out/run-0.9.summary.json`, beside `out/run-0.9.csv`).
fn beside(prefix: &std::path::Path, ext: &str) -> std::path::PathBuf {
    let mut s = prefix.as_os_str().to_owned();
    s.push(".");
    s.push(ext);
    s.into()
}
