//! `blis-replay evaluate`: one cluster policy bundle on one workload over
//! several seeds, as one JSON object — the fitness, the raw metrics and a
//! short text for LLM reflection. This is the contract a policy-search
//! loop (an OpenEvolve evaluator, a GEPA adapter) calls
//! (`../shared/design/policy-optimization-design.md`); each call is
//! single-threaded and deterministic, so a search runs many in parallel.

use crate::commands::{CommandError, Result};
use std::fmt::Write as _;
use std::io::Write;

use serde::Serialize;

use crate::cluster::ClusterSummary;
use crate::cluster::policy::PolicyBundle;
use crate::cluster::routing::RoutingPolicy;
use crate::commands::cli::EvaluateArgs;
use crate::output::{Dist, Summary};

/// Mean, p50 and p99 of a latency, ms.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Default)]
pub struct Lat {
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
}

impl Lat {
    fn of(d: &Dist) -> Self {
        Self {
            mean: d.mean,
            p50: d.p50,
            p99: d.p99,
        }
    }
}

/// The metrics of one seed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SeedMetrics {
    /// The workload seed.
    pub seed: u64,
    /// The fitness, with `--fitness-weights`.
    pub fitness: Option<f64>,
    /// TTFT, ms.
    pub ttft_ms: Lat,
    /// E2E, ms.
    pub e2e_ms: Lat,
    /// ITL, ms.
    pub itl_ms: Lat,
    /// Completed requests per second.
    pub throughput_rps: f64,
    /// Output tokens per second.
    pub output_tokens_per_s: f64,
    /// Requests in the workload.
    pub requests: u64,
    /// Rejected by admission.
    pub rejected: u64,
    /// Dropped as unservable.
    pub dropped: u64,
    /// Preemptions, all instances.
    pub preemptions: u64,
    /// Priority inversions and head-of-line blocking events.
    pub anomalies: crate::output::summary::Anomalies,
    /// Prefix-cache hit rate, all instances.
    pub prefix_cache_hit_rate: f64,
    /// The busiest instance's requests over the mean per instance (1: even).
    pub routing_imbalance: f64,
    /// Requests routed to each instance.
    pub routed: Vec<u64>,
    /// Jain's fairness over tenants' output throughput.
    pub jain_fairness: Option<f64>,
    /// The CPU KV tier's figures (with a `kv:` section or `--kv-cpu-blocks`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_tier: Option<crate::output::summary::CpuTierFigures>,
    /// The autoscaler's cost and actions (with an `autoscale:` section or
    /// `--autoscaler`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub autoscale: Option<AutoscaleFigures>,
}

/// An autoscaled seed's cost and scaling.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct AutoscaleFigures {
    /// Replica-seconds billed.
    pub replica_seconds: f64,
    /// GPU-hours billed.
    pub gpu_hours: f64,
    /// Replicas added.
    pub scale_ups: u64,
    /// Replicas removed.
    pub scale_downs: u64,
    /// Scale oscillations.
    pub oscillations: u64,
    /// Most replicas ready at once.
    pub peak_ready: u32,
}

/// What `evaluate` prints.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Evaluation {
    /// Schema version.
    pub version: u32,
    /// The bundle evaluated (after flags).
    pub policy: PolicyBundle,
    /// Mean fitness over the seeds (higher is better).
    pub fitness: Option<f64>,
    /// The weights of the fitness: `--fitness-weights`, else
    /// [`crate::output::fitness::DEFAULT_WEIGHTS`].
    pub fitness_weights: String,
    /// Per seed.
    pub seeds: Vec<SeedMetrics>,
    /// A short text: what happened and the main issues.
    pub summary: String,
}

fn seed_metrics(seed: u64, s: &Summary, c: Option<&ClusterSummary>) -> SeedMetrics {
    SeedMetrics {
        seed,
        fitness: s.fitness.as_ref().map(|f| f.score),
        ttft_ms: Lat::of(&s.ttft_ms),
        e2e_ms: Lat::of(&s.e2e_ms),
        itl_ms: Lat::of(&s.itl_ms),
        throughput_rps: s.throughput.requests_per_s,
        output_tokens_per_s: s.throughput.output_tokens_per_s,
        requests: s.requests.total,
        rejected: s.requests.rejected,
        dropped: s.requests.dropped,
        preemptions: s.preemptions,
        anomalies: s.anomalies,
        prefix_cache_hit_rate: s.prefix_cache.hit_rate,
        routing_imbalance: c.map_or(1.0, |c| c.routing_imbalance),
        routed: c.map_or_else(
            || vec![s.requests.total - s.requests.rejected],
            |c| c.instances.iter().map(|i| i.routed).collect(),
        ),
        jain_fairness: s.jain_fairness,
        cpu_tier: s.kv.cpu_tier,
        autoscale: c
            .and_then(|c| c.autoscale.as_ref())
            .map(|a| AutoscaleFigures {
                replica_seconds: a.replica_seconds,
                gpu_hours: a.gpu_hours,
                scale_ups: a.counters.scale_ups,
                scale_downs: a.counters.scale_downs,
                oscillations: a.counters.oscillations,
                peak_ready: a.counters.peak_ready,
            }),
    }
}

fn describe(b: &PolicyBundle) -> String {
    let routing = match &b.routing {
        RoutingPolicy::Weighted { scorers } => {
            let sum: f64 = scorers.values().sum();
            let parts: Vec<String> = scorers
                .iter()
                .map(|(s, w)| format!("{} {:.2}", s.name(), w / sum))
                .collect();
            format!("weighted routing ({})", parts.join(", "))
        }
        r => format!("{} routing", r.name()),
    };
    let tier = match &b.kv {
        Some(k) if k.cpu_blocks > 0 => format!(
            ", a CPU KV tier of {} blocks offloading above {:.0}% GPU usage",
            k.cpu_blocks,
            100.0 * k.offload_threshold
        ),
        _ => String::new(),
    };
    let prefill =
        b.pd.as_ref()
            .map(|p| format!("{} prefill + ", p.prefill_instances));
    let instances = match &b.autoscale {
        Some(a) => format!(
            "{}{}-{} {}instances autoscaled ({}, ready {:.0} s after a scale-up, {} drain)",
            prefill.as_deref().unwrap_or(""),
            a.min_replicas,
            a.max_replicas,
            if prefill.is_some() { "decode " } else { "" },
            a.policy.name(),
            a.startup_us() as f64 / 1e6,
            match a.drain {
                crate::cluster::autoscale::DrainPolicy::Wait => "wait",
                crate::cluster::autoscale::DrainPolicy::Immediate => "immediate",
                crate::cluster::autoscale::DrainPolicy::Redirect => "redirect",
            }
        ),
        None => match &b.pd {
            Some(p) => format!(
                "{} prefill + {} decode instances",
                p.prefill_instances, p.decode_instances
            ),
            None => format!("{} instance(s)", b.num_instances),
        },
    };
    format!(
        "{routing} over {instances}, admission {}{tier}",
        b.admission.name()
    )
}

/// The text for reflection: the outcome, then the issues worth fixing.
fn reflect(b: &PolicyBundle, seeds: &[SeedMetrics]) -> String {
    let mut o = String::new();
    let n = seeds.len() as f64;
    let mean = |f: &dyn Fn(&SeedMetrics) -> f64| seeds.iter().map(f).sum::<f64>() / n;
    let _ = write!(
        o,
        "{}: over {} seed(s), TTFT p50 {:.1} ms, p99 {:.1} ms; E2E p99 {:.0} ms; {:.2} req/s; prefix-cache hit rate {:.1}%; routing imbalance {:.2} (the busiest instance's requests over the mean).",
        describe(b),
        seeds.len(),
        mean(&|s| s.ttft_ms.p50),
        mean(&|s| s.ttft_ms.p99),
        mean(&|s| s.e2e_ms.p99),
        mean(&|s| s.throughput_rps),
        100.0 * mean(&|s| s.prefix_cache_hit_rate),
        mean(&|s| s.routing_imbalance),
    );
    let mut issues = Vec::new();
    let imbalance = mean(&|s| s.routing_imbalance);
    // (Autoscaled: replicas up for part of the run take fewer requests.)
    if imbalance > 1.5 && b.autoscale.is_none() {
        let r = &seeds[0].routed;
        let (lo, hi) = (
            r.iter().enumerate().min_by_key(|x| x.1),
            r.iter().enumerate().max_by_key(|x| x.1),
        );
        if let (Some(lo), Some(hi)) = (lo, hi) {
            issues.push(format!(
                "uneven load: instance {} got {} requests, instance {} only {} (seed {})",
                hi.0, hi.1, lo.0, lo.1, seeds[0].seed
            ));
        }
    }
    let tail = mean(&|s| s.ttft_ms.p99 / s.ttft_ms.p50.max(1e-9));
    if tail > 10.0 {
        issues.push(format!(
            "long TTFT tail: p99 is {tail:.0}× p50 (requests queue behind busy instances)"
        ));
        if let Some(a) = &b.autoscale {
            issues.push(format!(
                "replicas are ready {:.0} s after a scale-up: what queues meanwhile stays on the busy ones (a gateway queue, --flow-control, lets new replicas take it)",
                a.startup_us() as f64 / 1e6
            ));
        }
    }
    let hit = mean(&|s| s.prefix_cache_hit_rate);
    if hit < 0.2 {
        issues.push(format!(
            "low prefix reuse: {:.1}% of prompt tokens hit the cache (requests sharing a prefix are spread across instances, or the workload shares little)",
            100.0 * hit
        ));
    }
    let pre = mean(&|s| s.preemptions as f64);
    if pre > 0.0 {
        issues.push(format!(
            "KV pressure: {pre:.0} preemptions per run (recomputed prefills)"
        ));
    }
    let inv = mean(&|s| s.anomalies.priority_inversions as f64);
    let hol = mean(&|s| s.anomalies.hol_blocking_events as f64);
    if inv > 0.0 || hol > 0.0 {
        issues.push(format!(
            "priority: {inv:.0} inversions and {hol:.0} head-of-line blocking events per run (a more urgent SLO class waited behind a less urgent one; priority-fcfs or flow control orders them)"
        ));
    }
    let rej = mean(&|s| s.rejected as f64 / (s.requests.max(1)) as f64);
    if rej > 0.01 {
        issues.push(format!("admission rejects {:.1}% of requests", 100.0 * rej));
    }
    if issues.is_empty() {
        o.push_str(" No main issue found.");
    } else {
        o.push_str(" Main issues: ");
        o.push_str(&issues.join("; "));
        o.push('.');
    }
    o
}

/// `blis-replay evaluate`.
///
/// # Errors
/// Bad input or settings.
pub fn evaluate(args: &EvaluateArgs, out: &mut dyn Write) -> Result<()> {
    let e = evaluation(args, crate::commands::run::load_workload)?;
    writeln!(out, "{}", serde_json::to_string_pretty(&e)?)?;
    Ok(())
}

/// What `evaluate` computes: the bundle of `args` replayed on the workload
/// of each of its seeds, `workload_of` giving the workload of the run
/// settings with that seed (`--seed` set): loaded as the command loads it,
/// or one a caller generated once and keeps (the Python package).
///
/// # Errors
/// Bad input or settings.
pub fn evaluation(
    args: &EvaluateArgs,
    mut workload_of: impl FnMut(&crate::commands::RunArgs) -> Result<crate::api::Workload>,
) -> Result<Evaluation> {
    let bundle = args.run.cluster.bundle()?;
    // A search compares candidates by one number: evaluate always has one
    // (the documented default weights unless --fitness-weights).
    let weights_text = args
        .run
        .cluster
        .fitness_weights
        .clone()
        .unwrap_or_else(|| crate::output::fitness::DEFAULT_WEIGHTS.to_string());
    let weights = match crate::commands::run::fitness_weights(&args.run)? {
        Some(w) => Some(w),
        None => Some(
            crate::output::fitness::parse_weights(crate::output::fitness::DEFAULT_WEIGHTS)
                .expect("the default weights parse"),
        ),
    };
    if args.seeds.is_empty() {
        return Err(CommandError::Usage(
            "--seeds: give at least one seed".into(),
        ));
    }
    let mut seeds = Vec::new();
    for &seed in &args.seeds {
        let mut run = args.run.clone();
        run.seed = Some(seed);
        // (The fitness weighs latencies and throughput; no SLO is judged.)
        run.slo = None;
        let workload = workload_of(&run)?;
        let mut summary =
            crate::commands::run::replay_in_memory(&run, &bundle, Some(100_000), workload)?;
        summary.fitness = weights
            .as_ref()
            .map(|w| crate::output::fitness::report(&summary, w));
        seeds.push(seed_metrics(seed, &summary, summary.cluster.as_ref()));
    }
    let fitness = weights
        .as_ref()
        .map(|_| seeds.iter().filter_map(|s| s.fitness).sum::<f64>() / seeds.len() as f64);
    let summary = reflect(&bundle, &seeds);
    let e = Evaluation {
        version: 1,
        policy: bundle,
        fitness,
        fitness_weights: weights_text,
        seeds,
        summary,
    };
    Ok(e)
}
