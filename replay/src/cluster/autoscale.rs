//! Autoscaling of a cluster (`../shared/design/macro-plan.md`
//! D.6, D.7 "AutoScale Policy Observables", D.8 "Scale oscillation";
//! Kubernetes HPA's loop): every `interval_s` a policy reads aggregate
//! signals of the ready replicas and decides to add or remove replicas.
//!
//! Model and conventions:
//! - The cluster has `max_replicas` slots (the GPU quota); the first
//!   `num_instances` (clamped to `min..=max`) are ready at time 0.
//! - **Scale-up** takes the lowest free slot: it is *starting* for
//!   `provisioning_delay_s + model_load_s + warmup_s`, then *ready*, and
//!   the router sends it requests only from then on (the readiness event
//!   comes before arrivals at the same µs). It starts cold: empty KV cache,
//!   and the router's view of its prefix cache forgotten.
//! - **Scale-down** first cancels a replica still starting (the newest);
//!   otherwise the ready replica with the fewest requests in flight (the
//!   highest index on ties) stops taking new requests and drains by
//!   [`DrainPolicy`]. It frees its slot when it holds no request.
//! - **Utilisation** of a replica: the larger of its KV-cache usage and its
//!   running batch over `max_num_seqs` (either one full means new requests
//!   queue). **Queue depth**: requests routed to it and not running.
//! - **Cost**: a slot is billed from its scale-up decision (or time 0)
//!   until it is free again, or the end of the run: replica-seconds, and
//!   GPU-hours = replica-seconds × GPUs per replica (the tensor-parallel
//!   degree) / 3600.
//! - **Oscillation** (D.8): a scale action in the opposite direction of the
//!   previous one within `cooldown_s` of it.
//! - **With a P/D split** the decode pool is autoscaled (llm-d scales its
//!   pools apart; decode holds the batch that grows with load): its
//!   `max_replicas` slots follow the `prefill_instances`, which stay fixed
//!   and are billed for the whole run; utilisation and queue depth are of
//!   the ready decode replicas (queue: hand-offs routed there and not
//!   running), and the decode router skips replicas not ready. Drains wait
//!   (their requests hold transferred KV blocks).

use blis_traces::shown::Num;
use std::collections::VecDeque;

use rhai::{Dynamic, Map};
use serde::{Deserialize, Serialize};

use crate::cluster::code::{CallError, Program};
use crate::cluster::error::PolicyError;
use crate::cluster::rules::{Env, Rules, SignalSet, TreeNode};

/// The autoscaler of a policy bundle (`autoscale:`; `--autoscaler`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AutoscaleConfig {
    /// `--autoscaler`: the policy template.
    pub policy: ScalerKind,
    /// `--autoscaler-min`: never fewer replicas (ready or starting).
    pub min_replicas: u32,
    /// `--autoscaler-max`: never more replicas holding a GPU (ready,
    /// starting or draining).
    pub max_replicas: u32,
    /// `--autoscaler-interval-s`: seconds between evaluations (HPA's sync
    /// period, 15 s).
    pub interval_s: f64,
    /// `--scale-up-threshold`: `threshold` adds a replica when the mean
    /// utilisation reaches this (0..1).
    pub scale_up_threshold: f64,
    /// `--scale-up-queue-depth`: `threshold` also adds one when this many
    /// requests queue per ready replica on average (vLLM's
    /// `num_requests_waiting`, what HPA setups for vLLM scale on).
    pub scale_up_queue_depth: f64,
    /// `--scale-down-threshold`: `threshold` removes one when the mean
    /// utilisation is at most this.
    pub scale_down_threshold: f64,
    /// `--target-utilization`: what `target-utilization` sizes for.
    pub target_utilization: f64,
    /// `--autoscaler-cooldown-s`: no scale-down within this long of the
    /// last scale action; also the oscillation window.
    pub cooldown_s: f64,
    /// `--provisioning-delay-s`: from the decision to a node with the
    /// server started.
    pub provisioning_delay_s: f64,
    /// `--model-load-s`: loading the weights.
    pub model_load_s: f64,
    /// `--warmup-s`: warm-up (compilation, CUDA graphs) before it is ready.
    pub warmup_s: f64,
    /// `--drain-policy`: what a replica removed does with its requests.
    pub drain: DrainPolicy,
    /// `policy: decision-tree`: the tree ([`crate::cluster::rules`]; leaves
    /// `scale: n`) over [`SIGNALS`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tree: Option<TreeNode>,
    /// `policy: code`: Rhai source defining `fn scale(cluster)`, which
    /// returns the replicas to add (> 0) or remove (< 0), or 0.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// `policy: code`: operations one call may run.
    pub max_operations: u64,
}

/// What an autoscaling tree or program sees ([`AutoscaleContext`]): the
/// mean utilisation and queue depth of the ready replicas, arrivals per
/// second since the last evaluation, the replicas ready or starting
/// (`current`), ready, starting and draining, `min_replicas`,
/// `max_replicas`, seconds since the last scale action (1e9 before the
/// first), and the share of completions meeting the run's SLO since the
/// last evaluation (−1 without an SLO or completions).
pub const SIGNALS: SignalSet = SignalSet {
    numeric: &[
        "utilization",
        "queue_depth",
        "request_rate",
        "current",
        "ready",
        "starting",
        "draining",
        "min",
        "max",
        "since_last_scale_s",
        "slo_attainment",
    ],
    text: &[],
};

/// The numbers of [`SIGNALS`] from a context.
fn signal_values(ctx: &AutoscaleContext<'_>) -> [f64; 11] {
    [
        ctx.avg_utilization,
        ctx.avg_queue_depth,
        ctx.request_rate,
        f64::from(ctx.current_replicas),
        f64::from(ctx.ready_replicas),
        f64::from(ctx.starting_replicas),
        f64::from(ctx.draining_replicas),
        f64::from(ctx.min_replicas),
        f64::from(ctx.max_replicas),
        ctx.since_last_scale_us.map_or(1e9, |t| t as f64 / 1e6),
        ctx.slo_attainment.unwrap_or(-1.0),
    ]
}

struct Values([f64; 11]);

impl Env for Values {
    fn num(&self, i: usize) -> f64 {
        self.0[i]
    }

    fn text(&self, _: usize) -> &str {
        ""
    }
}

fn compile_tree(tree: &TreeNode) -> Result<Rules<i64>, PolicyError> {
    Rules::compile(tree, "autoscale.tree", &SIGNALS, "scale", |n, _| {
        Ok(n.scale.expect("a scale leaf"))
    })
}

fn compile_code(source: &str, max_operations: u64) -> Result<Program, PolicyError> {
    Program::compile(
        source,
        max_operations,
        "autoscale",
        "autoscaling",
        "scale",
        &["cluster"],
    )
}

/// A scale answer of a tree or program as a decision.
fn decision_of(n: i64) -> ScaleDecision {
    let k = u32::try_from(n.unsigned_abs()).unwrap_or(u32::MAX);
    match n {
        0 => ScaleDecision::Hold,
        n if n > 0 => ScaleDecision::Up(k),
        _ => ScaleDecision::Down(k),
    }
}

impl Default for AutoscaleConfig {
    fn default() -> Self {
        Self {
            policy: ScalerKind::Threshold,
            min_replicas: 1,
            max_replicas: 4,
            interval_s: 15.0,
            scale_up_threshold: 0.8,
            scale_up_queue_depth: 8.0,
            scale_down_threshold: 0.3,
            target_utilization: 0.6,
            cooldown_s: 60.0,
            provisioning_delay_s: 30.0,
            model_load_s: 0.0,
            warmup_s: 60.0,
            drain: DrainPolicy::Wait,
            tree: None,
            source: None,
            max_operations: crate::cluster::code::DEFAULT_MAX_OPERATIONS,
        }
    }
}

/// The autoscaling policy templates (macro-plan F.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ScalerKind {
    /// One replica up when the mean utilisation reaches
    /// `scale_up_threshold` or the mean queue depth `scale_up_queue_depth`,
    /// and no replica is still starting; one down when the utilisation is
    /// at most `scale_down_threshold` and the cooldown has passed.
    Threshold,
    /// HPA's rule: `ceil(ready × utilisation / target)` replicas, outside a
    /// ±10% tolerance band; down only after the cooldown.
    TargetUtilization,
    /// The leaf of `tree` decides.
    DecisionTree,
    /// `source`'s `fn scale(cluster)` decides.
    Code,
}

impl ScalerKind {
    /// The template's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Threshold => "threshold",
            Self::TargetUtilization => "target-utilization",
            Self::DecisionTree => "decision-tree",
            Self::Code => "code",
        }
    }
}

/// What a replica being removed does with its requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DrainPolicy {
    /// No new requests; those it has finish.
    Wait,
    /// Those it has are cut off at once (their clients see an error;
    /// counted).
    Immediate,
    /// Those still waiting (nothing computed) are routed again to the other
    /// replicas (counted); those running finish.
    Redirect,
}

impl AutoscaleConfig {
    /// Checks the values.
    ///
    /// # Errors
    /// The offending field and what it must be.
    pub fn validate(&self) -> Result<(), (String, &'static str, String)> {
        let bad = |f: &str, must, got: String| Err((format!("autoscale: {f}"), must, got));
        match (self.policy, &self.tree, &self.source) {
            (ScalerKind::DecisionTree, Some(_), None) | (ScalerKind::Code, None, Some(_)) => {}
            (ScalerKind::DecisionTree, _, _) => {
                return bad(
                    "tree",
                    "given (and source not) with policy decision-tree",
                    "missing or beside source".into(),
                );
            }
            (ScalerKind::Code, _, _) => {
                return bad(
                    "source",
                    "given (and tree not) with policy code",
                    "missing or beside tree".into(),
                );
            }
            (_, None, None) => {}
            (p, _, _) => {
                return bad(
                    "policy",
                    "decision-tree or code when a tree or source is given",
                    p.name().into(),
                );
            }
        }
        if self.min_replicas == 0 {
            return bad("min_replicas", "at least 1", "0".into());
        }
        if self.max_replicas < self.min_replicas || self.max_replicas > 4096 {
            return bad(
                "max_replicas",
                "at least min_replicas and at most 4096",
                self.max_replicas.to_string(),
            );
        }
        if !(self.interval_s.is_finite() && self.interval_s >= 1e-3 && self.interval_s <= 1e6) {
            return bad(
                "interval_s",
                "between 0.001 and 1e6 s",
                Num(self.interval_s).to_string(),
            );
        }
        for (f, v) in [
            ("scale_up_threshold", self.scale_up_threshold),
            ("scale_down_threshold", self.scale_down_threshold),
            ("target_utilization", self.target_utilization),
        ] {
            if !(v.is_finite() && v > 0.0 && v <= 1.0) || (f == "scale_down_threshold" && v >= 1.0)
            {
                return bad(f, "in (0, 1]", Num(v).to_string());
            }
        }
        if !(self.scale_up_queue_depth.is_finite() && self.scale_up_queue_depth > 0.0) {
            return bad(
                "scale_up_queue_depth",
                "a positive number",
                Num(self.scale_up_queue_depth).to_string(),
            );
        }
        if self.scale_down_threshold >= self.scale_up_threshold {
            return bad(
                "scale_down_threshold",
                "below scale_up_threshold",
                Num(self.scale_down_threshold).to_string(),
            );
        }
        for (f, v) in [
            ("cooldown_s", self.cooldown_s),
            ("provisioning_delay_s", self.provisioning_delay_s),
            ("model_load_s", self.model_load_s),
            ("warmup_s", self.warmup_s),
        ] {
            if !(v.is_finite() && (0.0..=1e7).contains(&v)) {
                return bad(f, "between 0 and 1e7 s", Num(v).to_string());
            }
        }
        Ok(())
    }

    /// Checks a tree or program (after [`AutoscaleConfig::validate`]).
    ///
    /// # Errors
    /// [`PolicyError::Tree`] naming the node or the source's line.
    pub fn validate_rules(&self) -> Result<(), PolicyError> {
        match (self.policy, &self.tree, &self.source) {
            (ScalerKind::DecisionTree, Some(t), _) => compile_tree(t).map(|_| ()),
            (ScalerKind::Code, _, Some(src)) => compile_code(src, self.max_operations).map(|_| ()),
            _ => Ok(()),
        }
    }

    /// From a scale-up decision to the replica taking requests, µs.
    pub fn startup_us(&self) -> i64 {
        s_to_us(self.provisioning_delay_s) + s_to_us(self.model_load_s) + s_to_us(self.warmup_s)
    }
}

fn s_to_us(s: f64) -> i64 {
    (s * 1e6).round() as i64
}

/// What an autoscaling policy sees (macro-plan D.7): the deployment and
/// aggregate signals of its ready replicas, never a request or an
/// instance's internals.
#[derive(Debug, Clone, Copy)]
pub struct AutoscaleContext<'a> {
    /// Now, µs since the run start.
    pub now_us: i64,
    /// Replicas ready or starting (what scaling changes).
    pub current_replicas: u32,
    /// Of which ready.
    pub ready_replicas: u32,
    /// Of which starting.
    pub starting_replicas: u32,
    /// Replicas draining (still holding a GPU).
    pub draining_replicas: u32,
    /// `min_replicas`.
    pub min_replicas: u32,
    /// `max_replicas`.
    pub max_replicas: u32,
    /// Mean over ready replicas of requests routed there and not running.
    pub avg_queue_depth: f64,
    /// Mean over ready replicas of their utilisation (0..1, see the module).
    pub avg_utilization: f64,
    /// Requests that arrived per second since the last evaluation.
    pub request_rate: f64,
    /// Share of the requests completed since the last evaluation that met
    /// the run's SLO (`--slo`; `None` without one or without completions).
    pub slo_attainment: Option<f64>,
    /// Since the last scale action, µs (`None`: none yet).
    pub since_last_scale_us: Option<i64>,
    /// The last evaluations' load samples, oldest first (at most 16).
    pub history: &'a VecDeque<LoadSample>,
}

/// One evaluation's aggregate load.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LoadSample {
    /// When, µs.
    pub time_us: i64,
    /// Mean utilisation of the ready replicas.
    pub utilization: f64,
    /// Mean queue depth of the ready replicas.
    pub queue_depth: f64,
    /// Arrivals per second since the previous evaluation.
    pub request_rate: f64,
}

/// A policy's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScaleDecision {
    /// Keep the replicas.
    Hold,
    /// Add this many.
    Up(u32),
    /// Remove this many.
    Down(u32),
}

/// An autoscaling policy: reads the context, decides (macro-plan G.1
/// `AutoScalePolicy`). The autoscaler clamps the answer to `min..=max`
/// and to the free slots.
pub trait AutoscalePolicy {
    /// The decision at `ctx.now_us`.
    fn evaluate(&mut self, ctx: &AutoscaleContext<'_>) -> ScaleDecision;
}

/// The built-in templates with their parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct Template {
    kind: ScalerKind,
    up: f64,
    up_queue: f64,
    down: f64,
    target: f64,
    cooldown_us: i64,
}

impl Template {
    /// The template of `cfg`.
    pub fn of(cfg: &AutoscaleConfig) -> Self {
        Self {
            kind: cfg.policy,
            up: cfg.scale_up_threshold,
            up_queue: cfg.scale_up_queue_depth,
            down: cfg.scale_down_threshold,
            target: cfg.target_utilization,
            cooldown_us: s_to_us(cfg.cooldown_s),
        }
    }
}

/// The policy an autoscaler asks: a template, a tree or a program.
#[derive(Debug, Clone)]
enum Scaler {
    Template(Template),
    /// A tree and the leaf of its last decision.
    Tree(Rules<i64>, usize),
    Code {
        program: Box<Program>,
        failure: Option<CallError>,
    },
}

impl Scaler {
    fn of(cfg: &AutoscaleConfig) -> Self {
        match (cfg.policy, &cfg.tree, &cfg.source) {
            (ScalerKind::DecisionTree, Some(t), _) => {
                Self::Tree(compile_tree(t).expect("a checked autoscaling tree"), 0)
            }
            (ScalerKind::Code, _, Some(src)) => Self::Code {
                program: Box::new(
                    compile_code(src, cfg.max_operations).expect("a checked program"),
                ),
                failure: None,
            },
            _ => Self::Template(Template::of(cfg)),
        }
    }
}

impl Scaler {
    /// A tree's leaf of its last decision.
    fn last_path(&self) -> Option<&str> {
        match self {
            Self::Tree(rules, last) => Some(rules.leaf_path(*last)),
            _ => None,
        }
    }
}

impl AutoscalePolicy for Scaler {
    fn evaluate(&mut self, ctx: &AutoscaleContext<'_>) -> ScaleDecision {
        match self {
            Self::Template(t) => t.evaluate(ctx),
            Self::Tree(rules, last) => {
                let v = Values(signal_values(ctx));
                *last = rules.leaf_of(&v);
                decision_of(*rules.leaf(*last))
            }
            Self::Code { program, failure } => {
                if failure.is_some() {
                    return ScaleDecision::Hold;
                }
                match call(program, ctx) {
                    Ok(n) => decision_of(n),
                    Err(e) => {
                        *failure = Some(e);
                        ScaleDecision::Hold
                    }
                }
            }
        }
    }
}

/// One call of an autoscaling program.
fn call(p: &mut Program, ctx: &AutoscaleContext<'_>) -> Result<i64, CallError> {
    let mut c = Map::new();
    for (name, v) in SIGNALS.numeric.iter().zip(signal_values(ctx)) {
        c.insert((*name).into(), Dynamic::from_float(v));
    }
    c.insert("now_us".into(), Dynamic::from_int(ctx.now_us));
    let (out, decision) = p.call((Dynamic::from_map(c),))?;
    out.as_int().map_err(|t| {
        p.fail(
            decision,
            format!("returned a {t}, not an integer (replicas to add, or to remove if negative)"),
        )
    })
}

impl AutoscalePolicy for Template {
    fn evaluate(&mut self, ctx: &AutoscaleContext<'_>) -> ScaleDecision {
        let cooled = ctx
            .since_last_scale_us
            .is_none_or(|t| t >= self.cooldown_us);
        let util = ctx.avg_utilization;
        match self.kind {
            ScalerKind::Threshold => {
                let hot = util >= self.up || ctx.avg_queue_depth >= self.up_queue;
                if hot && ctx.starting_replicas == 0 {
                    ScaleDecision::Up(1)
                } else if util <= self.down && cooled {
                    ScaleDecision::Down(1)
                } else {
                    ScaleDecision::Hold
                }
            }
            ScalerKind::TargetUtilization => {
                let ratio = util / self.target;
                if (ratio - 1.0).abs() <= 0.1 {
                    return ScaleDecision::Hold;
                }
                let ready = f64::from(ctx.ready_replicas);
                let desired = (ready * ratio).ceil().clamp(1.0, 1e6) as u32;
                if desired > ctx.current_replicas {
                    ScaleDecision::Up(desired - ctx.current_replicas)
                } else if desired < ctx.current_replicas && cooled {
                    ScaleDecision::Down(ctx.current_replicas - desired)
                } else {
                    ScaleDecision::Hold
                }
            }
            // (Trees and programs are not templates: see `Scaler`.)
            ScalerKind::DecisionTree | ScalerKind::Code => ScaleDecision::Hold,
        }
    }
}

/// Where a slot is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifecycle {
    /// No replica (no GPU held).
    Off,
    /// Provisioning, loading or warming up; ready at this time, µs.
    Starting(i64),
    /// Taking requests.
    Ready,
    /// Removed: no new requests, finishing (or redirecting) what it has.
    Draining,
}

/// One scale action, in the summary and the decision trace.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScaleEvent {
    /// `"scale"`: tells these apart from routing decisions in the
    /// decision trace.
    pub kind: &'static str,
    /// When, µs since the run start.
    pub time_us: i64,
    /// `up` (a replica starts), `down` (a ready replica drains), `cancel`
    /// (a starting replica is stopped; a scale-down), `ready` (a started
    /// replica takes requests) or `released` (a drained replica frees its
    /// GPU).
    pub action: &'static str,
    /// The slot.
    pub instance: usize,
    /// Replicas ready or starting after it.
    pub replicas: u32,
    /// The evaluation's mean utilisation (decisions only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub utilization: Option<f64>,
    /// The evaluation's mean queue depth (decisions only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_depth: Option<f64>,
    /// A direction change within the cooldown (D.8).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub oscillation: bool,
    /// A decision tree's decision: the leaf it reached
    /// (`autoscale.tree.else.then`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tree_path: Option<String>,
}

/// What the autoscaler did (cumulative).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct AutoscaleCounters {
    /// Evaluations.
    pub evaluations: u64,
    /// Replicas added.
    pub scale_ups: u64,
    /// Replicas removed (drained or cancelled while starting).
    pub scale_downs: u64,
    /// Scale oscillations (D.8).
    pub oscillations: u64,
    /// Most replicas ready at once.
    pub peak_ready: u32,
    /// Requests cut off by `immediate` drains.
    pub drain_cut: u64,
    /// Requests routed again by `redirect` drains.
    pub redirected: u64,
}

/// The autoscaler's state in a run.
#[derive(Debug, Clone)]
pub struct Autoscaler {
    cfg: AutoscaleConfig,
    policy: Scaler,
    state: Vec<Lifecycle>,
    /// Per slot, whether it was ever ready.
    ever_ready: Vec<bool>,
    billed_since: Vec<Option<i64>>,
    billed_us: i128,
    interval_us: i64,
    next_tick: i64,
    last_scale: Option<(i64, bool)>,
    history: VecDeque<LoadSample>,
    arrivals: u64,
    slo_judged: u64,
    slo_met: u64,
    /// GPUs per replica (the tensor-parallel degree).
    pub gpus_per_replica: u32,
    /// The run's SLO (`--slo`), which completions are judged against.
    pub slo: Option<blis_traces::slo::Slo>,
    /// What it did.
    pub counters: AutoscaleCounters,
    /// Every scale action and lifecycle change, in time order.
    pub events: Vec<ScaleEvent>,
    /// Whether a slot may have finished draining (checked by the owner).
    pub drain_pending: bool,
    /// The cluster index of its first slot (P/D: the decode pool's first
    /// instance; the instances before it are a fixed pool, always ready).
    base: usize,
    /// Replicas of the fixed pool, billed from time 0 to the end.
    fixed: u32,
    fixed_since: i64,
}

impl Autoscaler {
    /// A program's first failed call, if any.
    pub fn failure(&self) -> Option<&CallError> {
        match &self.policy {
            Scaler::Code { failure, .. } => failure.as_ref(),
            _ => None,
        }
    }

    /// `cfg` over `cfg.max_replicas` slots with `initial` (clamped to
    /// `min..=max`) ready at time 0.
    pub fn new(cfg: &AutoscaleConfig, initial: u32) -> Self {
        let n = cfg.max_replicas as usize;
        let initial = initial.clamp(cfg.min_replicas, cfg.max_replicas) as usize;
        let state: Vec<Lifecycle> = (0..n)
            .map(|i| {
                if i < initial {
                    Lifecycle::Ready
                } else {
                    Lifecycle::Off
                }
            })
            .collect();
        Self {
            policy: Scaler::of(cfg),
            billed_since: (0..n).map(|i| (i < initial).then_some(0)).collect(),
            ever_ready: (0..n).map(|i| i < initial).collect(),
            state,
            billed_us: 0,
            interval_us: s_to_us(cfg.interval_s).max(1),
            next_tick: s_to_us(cfg.interval_s).max(1),
            last_scale: None,
            history: VecDeque::new(),
            arrivals: 0,
            slo_judged: 0,
            slo_met: 0,
            gpus_per_replica: 1,
            slo: None,
            counters: AutoscaleCounters {
                peak_ready: initial as u32,
                ..AutoscaleCounters::default()
            },
            events: Vec::new(),
            drain_pending: false,
            base: 0,
            fixed: 0,
            fixed_since: 0,
            cfg: cfg.clone(),
        }
    }

    /// The same over the cluster's instances `base..base + max_replicas`
    /// (a P/D split's decode pool): the `base` instances before them are
    /// a fixed pool, always ready and billed for the whole run.
    #[must_use]
    pub fn with_fixed_pool(mut self, base: usize) -> Self {
        self.base = base;
        self.fixed = base as u32;
        self
    }

    /// The cluster index of the first autoscaled slot.
    pub fn base(&self) -> usize {
        self.base
    }

    /// Replicas of the fixed pool (0 for a colocated cluster).
    pub fn fixed_replicas(&self) -> u32 {
        self.fixed
    }

    /// The slot of cluster instance `i`, if autoscaled.
    #[inline]
    fn slot(&self, i: usize) -> Option<usize> {
        i.checked_sub(self.base).filter(|&s| s < self.state.len())
    }

    /// The settings.
    pub fn config(&self) -> &AutoscaleConfig {
        &self.cfg
    }

    /// Cluster instance `i`'s state (an instance of the fixed pool is
    /// always ready).
    pub fn state(&self, i: usize) -> Lifecycle {
        self.slot(i).map_or(Lifecycle::Ready, |s| self.state[s])
    }

    /// Whether cluster instance `i` was ever ready (an instance of the
    /// fixed pool always was).
    pub fn ever_ready(&self, i: usize) -> bool {
        self.slot(i).is_none_or(|s| self.ever_ready[s])
    }

    /// Whether the router may send cluster instance `i` a request.
    #[inline]
    pub fn routable(&self, i: usize) -> bool {
        self.state(i) == Lifecycle::Ready
    }

    /// Whether cluster instance `i` is a replica that serves (ready or
    /// draining): the ones a metrics sample covers.
    pub fn serving(&self, i: usize) -> bool {
        matches!(self.state(i), Lifecycle::Ready | Lifecycle::Draining)
    }

    /// Replicas (ready, starting, draining).
    pub fn replicas(&self) -> (u32, u32, u32) {
        let mut c = (0, 0, 0);
        for s in &self.state {
            match s {
                Lifecycle::Ready => c.0 += 1,
                Lifecycle::Starting(_) => c.1 += 1,
                Lifecycle::Draining => c.2 += 1,
                Lifecycle::Off => {}
            }
        }
        c
    }

    /// The next evaluation or readiness, µs.
    pub fn next_time(&self) -> i64 {
        self.state
            .iter()
            .filter_map(|s| match s {
                Lifecycle::Starting(t) => Some(*t),
                _ => None,
            })
            .fold(self.next_tick, i64::min)
    }

    /// A request arrived (for the request rate).
    pub fn arrived(&mut self) {
        self.arrivals += 1;
    }

    /// A request sent at `entry_us` completed as `fin`: judged against
    /// the run's SLO, if any (for [`AutoscaleContext::slo_attainment`]).
    pub fn completed_request(
        &mut self,
        entry_us: i64,
        streaming: bool,
        fin: &crate::engine::instance::Finished,
    ) {
        let Some(slo) = &self.slo else { return };
        let ms = |us: i64| us as f64 / 1e3;
        let ttft = streaming.then(|| ms(fin.first_token_us - entry_us));
        let tpot = (streaming && fin.output_tokens > 1)
            .then(|| ms(fin.last_token_us - fin.first_token_us) / f64::from(fin.output_tokens - 1));
        self.slo_judged += 1;
        self.slo_met += u64::from(slo.attained(ttft, tpot, ms(fin.last_token_us - entry_us)));
    }

    /// Starting replicas whose time has come are ready: their cluster
    /// indices, in index order, into `out`.
    pub fn make_ready(&mut self, now: i64, out: &mut Vec<usize>) {
        for i in 0..self.state.len() {
            if let Lifecycle::Starting(t) = self.state[i]
                && t <= now
            {
                self.state[i] = Lifecycle::Ready;
                self.ever_ready[i] = true;
                out.push(self.base + i);
                let replicas = self.current();
                self.event(now, "ready", i, replicas, None, false);
            }
        }
        let ready = self.replicas().0;
        self.counters.peak_ready = self.counters.peak_ready.max(ready);
    }

    /// The cluster has been idle for many evaluations: the next comes on
    /// its grid at the last time no later than `t` (the next input), not
    /// every interval until then. Replicas still starting keep their time.
    pub fn skip_idle_until(&mut self, t: i64) {
        let iv = self.interval_us;
        if t > self.next_tick {
            self.next_tick += (t - self.next_tick) / iv * iv;
        }
    }

    /// Whether an evaluation is due at `now`.
    pub fn tick_due(&self, now: i64) -> bool {
        now >= self.next_tick
    }

    fn current(&self) -> u32 {
        let (r, s, _) = self.replicas();
        r + s
    }

    fn event(
        &mut self,
        now: i64,
        action: &'static str,
        i: usize,
        replicas: u32,
        load: Option<&LoadSample>,
        oscillation: bool,
    ) {
        self.events.push(ScaleEvent {
            kind: "scale",
            time_us: now,
            action,
            instance: self.base + i,
            replicas,
            utilization: load.map(|l| l.utilization),
            queue_depth: load.map(|l| l.queue_depth),
            oscillation,
            tree_path: load.and(self.policy.last_path()).map(str::to_string),
        });
    }

    /// The evaluation at `now` over the ready replicas' `(utilisation,
    /// queue depth)`, with each slot's requests in flight (indexed by
    /// slot): asks the policy, clamps its answer and carries it out. The
    /// cluster indices of the instances that start draining go into
    /// `drain` (the owner applies the drain policy).
    pub fn evaluate(
        &mut self,
        now: i64,
        ready_load: impl Iterator<Item = (f64, f64)>,
        in_flight: &[u32],
        drain: &mut Vec<usize>,
    ) {
        self.counters.evaluations += 1;
        let (mut n, mut util, mut queue) = (0u32, 0.0, 0.0);
        for (u, q) in ready_load {
            n += 1;
            util += u;
            queue += q;
        }
        let n_f = f64::from(n.max(1));
        let elapsed = (now - (self.next_tick - self.interval_us)).max(1);
        let sample = LoadSample {
            time_us: now,
            utilization: util / n_f,
            queue_depth: queue / n_f,
            request_rate: self.arrivals as f64 * 1e6 / elapsed as f64,
        };
        self.arrivals = 0;
        self.next_tick = now + self.interval_us;
        if self.history.len() == 16 {
            self.history.pop_front();
        }
        self.history.push_back(sample);
        let (ready, starting, draining) = self.replicas();
        let slo = (self.slo_judged > 0).then(|| self.slo_met as f64 / self.slo_judged as f64);
        (self.slo_judged, self.slo_met) = (0, 0);
        let ctx = AutoscaleContext {
            now_us: now,
            current_replicas: ready + starting,
            ready_replicas: ready,
            starting_replicas: starting,
            draining_replicas: draining,
            min_replicas: self.cfg.min_replicas,
            max_replicas: self.cfg.max_replicas,
            avg_queue_depth: sample.queue_depth,
            avg_utilization: sample.utilization,
            request_rate: sample.request_rate,
            slo_attainment: slo,
            since_last_scale_us: self.last_scale.map(|(t, _)| now - t),
            history: &self.history,
        };
        let decision = self.policy.evaluate(&ctx);
        let current = ready + starting;
        match decision {
            ScaleDecision::Hold => {}
            ScaleDecision::Up(k) => {
                let free = self.state.iter().filter(|s| **s == Lifecycle::Off).count() as u32;
                let k = k
                    .min(self.cfg.max_replicas.saturating_sub(current))
                    .min(free);
                for _ in 0..k {
                    let i = self
                        .state
                        .iter()
                        .position(|s| *s == Lifecycle::Off)
                        .expect("a free slot");
                    self.state[i] = Lifecycle::Starting(now + self.cfg.startup_us());
                    self.billed_since[i] = Some(now);
                    self.counters.scale_ups += 1;
                    let osc = self.direction(now, true);
                    let replicas = self.current();
                    self.event(now, "up", i, replicas, Some(&sample), osc);
                }
            }
            ScaleDecision::Down(k) => {
                let k = k.min(current.saturating_sub(self.cfg.min_replicas));
                for _ in 0..k {
                    self.counters.scale_downs += 1;
                    let osc = self.direction(now, false);
                    // The newest starting replica first: nothing to drain.
                    let starting = (0..self.state.len())
                        .filter(|&i| matches!(self.state[i], Lifecycle::Starting(_)))
                        .max_by_key(|&i| (self.billed_since[i], i));
                    let (i, action) = match starting {
                        Some(i) => {
                            self.state[i] = Lifecycle::Off;
                            self.bill_until(i, now);
                            (i, "cancel")
                        }
                        None => {
                            let Some(i) = self.pick_drain(in_flight) else {
                                break;
                            };
                            self.state[i] = Lifecycle::Draining;
                            drain.push(self.base + i);
                            self.drain_pending = true;
                            (i, "down")
                        }
                    };
                    let replicas = self.current();
                    self.event(now, action, i, replicas, Some(&sample), osc);
                }
            }
        }
    }

    /// The ready slot to drain: the fewest requests in flight, the highest
    /// index on ties.
    fn pick_drain(&self, in_flight: &[u32]) -> Option<usize> {
        (0..self.state.len())
            .filter(|&i| self.state[i] == Lifecycle::Ready)
            .min_by_key(|&i| (in_flight.get(i).copied().unwrap_or(0), usize::MAX - i))
    }

    /// Records a scale action's direction (`up`); whether it reverses the
    /// previous one within the cooldown.
    fn direction(&mut self, now: i64, up: bool) -> bool {
        let osc = self
            .last_scale
            .is_some_and(|(t, d)| d != up && now - t < s_to_us(self.cfg.cooldown_s));
        if osc {
            self.counters.oscillations += 1;
        }
        self.last_scale = Some((now, up));
        osc
    }

    fn bill_until(&mut self, i: usize, now: i64) {
        if let Some(t) = self.billed_since[i].take() {
            self.billed_us += i128::from((now - t).max(0));
        }
    }

    /// Draining cluster instance `i` holds no request at `now`: its GPU
    /// is free.
    pub fn released(&mut self, i: usize, now: i64) {
        let Some(i) = self.slot(i) else { return };
        if self.state[i] == Lifecycle::Draining {
            self.state[i] = Lifecycle::Off;
            self.bill_until(i, now);
            let replicas = self.current();
            self.event(now, "released", i, replicas, None, false);
        }
    }

    /// The run ended at `now`: every slot still billed is billed to it
    /// (and on from it, should the session go on).
    pub fn finish(&mut self, now: i64) {
        self.billed_us += i128::from(self.fixed) * i128::from((now - self.fixed_since).max(0));
        self.fixed_since = now.max(self.fixed_since);
        for i in 0..self.state.len() {
            if self.billed_since[i].is_some() {
                self.bill_until(i, now);
                self.billed_since[i] = Some(now);
            }
        }
    }

    /// Replica-seconds billed so far (all of them after
    /// [`Autoscaler::finish`]).
    pub fn replica_seconds(&self) -> f64 {
        self.billed_us as f64 / 1e6
    }
}
