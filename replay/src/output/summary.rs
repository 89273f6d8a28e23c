//! The summary of a replay (`PREFIX.summary.json`, schema version 1; all
//! latencies in ms): request counts, latency distributions, throughput,
//! cache and KV figures, per class, tenant and instance, and the fitness.

use serde::Serialize;

/// Latency statistics in milliseconds (`n` and the percentiles; no maximum).
pub type Dist = blis_traces::LatencyStats;

/// [`Dist`] of `us` (µs), in ms.
pub fn dist_of_us(us: Vec<f64>) -> Dist {
    Dist::of_us_in_ms(us).without_max()
}

/// [`Dist`] of a counted multiset of µs values, in ms; `sorted`: the
/// values ascending, each with its count.
pub fn dist_of_counts(sorted: &[(i64, u64)]) -> Dist {
    let v: Vec<(f64, u64)> = sorted.iter().map(|&(k, c)| (k as f64, c)).collect();
    Dist::of_counts(&v, 1000.0).without_max()
}

/// Request counts by outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RequestCounts {
    /// Requests in the input.
    pub total: u64,
    /// Completed with a full response.
    pub completed: u64,
    /// Cut short by their client (recorded timeout or deadline).
    pub cancelled: u64,
    /// Dropped as unservable.
    pub dropped: u64,
    /// Failed in the input trace (not sent to the server).
    pub input_errors: u64,
    /// Still in the system at the horizon.
    pub unfinished: u64,
    /// Rejected by the cluster's admission policy.
    pub rejected: u64,
    /// Cut off by an autoscaler's `immediate` drain (with or without
    /// tokens).
    #[serde(skip_serializing_if = "is_zero")]
    pub scaled_down: u64,
}

fn is_zero(x: &u64) -> bool {
    *x == 0
}

/// Throughput over the replay.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Throughput {
    /// From the first send to the last response, s.
    pub duration_s: f64,
    /// Completed requests per second.
    pub requests_per_s: f64,
    /// Input tokens of completed requests per second.
    pub input_tokens_per_s: f64,
    /// Output tokens per second.
    pub output_tokens_per_s: f64,
}

/// Prefix-cache figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct PrefixCache {
    /// Prompt tokens looked up at admission.
    pub query_tokens: u64,
    /// Prompt tokens found.
    pub hit_tokens: u64,
    /// hits / queries.
    pub hit_rate: f64,
}

/// KV-cache figures from the samples.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct KvFigures {
    /// Blocks in total.
    pub total_blocks: u64,
    /// Highest sampled usage (0..1).
    pub peak_usage: f64,
    /// Mean sampled usage (0..1).
    pub mean_usage: f64,
    /// The CPU tier's figures (tiered KV cache only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_tier: Option<CpuTierFigures>,
}

/// What a tiered KV cache's CPU tier did, summed over instances
/// (`../shared/design/core-engine.md`, "Tiered Cache").
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct CpuTierFigures {
    /// CPU blocks in total.
    pub total_blocks: u64,
    /// Blocks holding content at the end.
    pub used_blocks: u64,
    /// Blocks offloaded from GPU to CPU.
    pub offloads: u64,
    /// Blocks reloaded from CPU to GPU instead of recomputed.
    pub reloads: u64,
    /// Prompt tokens looked up in the CPU tier after a GPU miss (vLLM's
    /// `external_prefix_cache_queries`).
    pub query_tokens: u64,
    /// Prompt tokens found there (vLLM's `external_prefix_cache_hits`).
    pub hit_tokens: u64,
    /// hit_tokens / query_tokens.
    pub hit_rate: f64,
    /// Reloads within the thrashing window of their offload.
    pub thrashing: u64,
    /// thrashing / offloads (BLIS's `KVThrashingRate`).
    pub thrashing_rate: f64,
    /// Contents dropped from a full CPU tier.
    pub cpu_evictions: u64,
    /// Reload transfers (one per admission that reloaded blocks).
    pub transfers: u64,
    /// Transfer time added to steps, ms.
    pub transfer_ms: f64,
}

/// Scheduling anomalies, summed over instances.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Anomalies {
    /// Requests scheduled from a wait queue while one of a more urgent SLO
    /// class waited there still.
    pub priority_inversions: u64,
    /// Requests completing while one of a more urgent SLO class waited in
    /// the same queue (head-of-line blocking).
    pub hol_blocking_events: u64,
}

/// The summary JSON of a replay (schema version 1; all latencies in ms).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    /// Schema version.
    pub version: u32,
    /// Latency model used.
    pub latency_model: String,
    /// Request counts.
    pub requests: RequestCounts,
    /// Time to first token (streaming requests).
    pub ttft_ms: Dist,
    /// End-to-end latency.
    pub e2e_ms: Dist,
    /// Inter-token latency: every gap between consecutive tokens.
    pub itl_ms: Dist,
    /// Time per output token: (E2E − TTFT) / (output − 1), per request.
    pub tpot_ms: Dist,
    /// Throughput.
    pub throughput: Throughput,
    /// Preemptions.
    pub preemptions: u64,
    /// Scheduling anomalies (BLIS's failure modes, `../shared/design/macro-plan.md` D.8).
    pub anomalies: Anomalies,
    /// Prefix cache.
    pub prefix_cache: PrefixCache,
    /// KV cache.
    pub kv: KvFigures,
    /// Steps executed, and those executed inside fast-forwarded runs.
    pub steps: u64,
    /// Steps inside fast-forwarded runs.
    pub fast_forwarded_steps: u64,
    /// Per SLO class (requests with a class): counts and latencies.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub slo_classes: std::collections::BTreeMap<String, ClassFigures>,
    /// Output tokens per second of each tenant (requests with a tenant id).
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub tenant_output_tokens_per_s: std::collections::BTreeMap<String, f64>,
    /// Jain's fairness index over the tenants' output throughput
    /// ((Σx)² / (n·Σx²): 1 when equal), with two tenants or more.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jain_fairness: Option<f64>,
    /// The cluster: instances, policies and per-instance figures (more than
    /// one instance, or an admission policy).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<crate::cluster::ClusterSummary>,
    /// The fitness, with `--fitness-weights`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fitness: Option<FitnessReport>,
    /// SLO attainment and goodput, with `--slo`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slo: Option<SloFigures>,
    /// Why the first request dropped as unservable was dropped (its
    /// trace row's `error_message`), when one was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_drop_reason: Option<String>,
    /// What would serve such a request (printed with the reason).
    #[serde(skip)]
    pub first_drop_hint: Option<&'static str>,
}

/// SLO attainment and goodput (DistServe's: requests meeting every bound
/// per second).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SloFigures {
    /// The bounds.
    pub slo: blis_traces::slo::Slo,
    /// Requests judged (all of the run's; one not completed misses).
    pub requests: u64,
    /// Completed requests within every bound (TTFT and TPOT for streamed
    /// ones, E2E).
    pub attained: u64,
    /// `attained / requests`.
    pub attainment: f64,
    /// Attained requests per second of the run.
    pub goodput_per_s: f64,
}

/// Jain's fairness index of `xs` ((Σx)² / (n·Σx²)), for two values or more.
pub fn jain(xs: impl Iterator<Item = f64> + Clone) -> Option<f64> {
    let n = xs.clone().count();
    let sum: f64 = xs.clone().sum();
    let sq: f64 = xs.map(|x| x * x).sum();
    (n >= 2 && sq > 0.0).then(|| sum * sum / (n as f64 * sq))
}

/// The figures of one SLO class.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClassFigures {
    /// Requests of the class.
    pub total: u64,
    /// Completed.
    pub completed: u64,
    /// Rejected by admission.
    pub rejected: u64,
    /// TTFT of its completed streaming requests.
    pub ttft_ms: Dist,
    /// E2E of its completed requests.
    pub e2e_ms: Dist,
}

/// A fitness and its parts, as reported.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct FitnessReport {
    /// The weighted sum of normalised metrics (higher is better).
    pub score: f64,
    /// Each metric: name, weight, raw value (ms, req/s or tok/s) and
    /// normalised score.
    pub metrics: Vec<FitnessPart>,
}

/// One metric of a fitness.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct FitnessPart {
    /// Its name (`p99_ttft`).
    pub name: String,
    /// Its weight.
    pub weight: f64,
    /// Its raw value.
    pub raw: f64,
    /// Its normalised score.
    pub normalised: f64,
}
