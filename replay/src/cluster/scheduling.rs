//! Scheduling as a decision tree or evolved code: the order of each
//! instance's wait queue, beyond the named orders (`scheduler: fcfs |
//! priority-fcfs | sjf`). When a request enters an instance, the tree's
//! leaf (`key: {constant: c, <signal>: w, ..}`, [`crate::cluster::rules`])
//! or the program's `fn key(request, instance)` gives it a key; the
//! instance admits waiting requests lowest key first (then in arrival
//! order), and preempts the highest key first, as vLLM's priority
//! scheduling does with its one number, or with `preempt: latest` the
//! latest request to join the batch, as vLLM's FCFS scheduling does (a
//! constant key is then `fcfs` exactly, `key: {input_tokens: 1}` `sjf`).
//! The key is kept to a thousandth.
//!
//! ```yaml
//! scheduling:
//!   policy: decision-tree
//!   tree:
//!     when: {signal: waiting, above: 32}          # a long queue: shortest prompt first
//!     then: {key: {input_tokens: 1}}
//!     else: {key: {priority: 1}}                  # else by the priority policy
//! ```
//!
//! A program's `request` map has `input_tokens`, `slo_class`, `tenant` and
//! `priority`; its `instance` map `waiting`, `running` and `kv_usage`;
//! `this` is a map kept from call to call. A failed call gives key 0 and
//! ends the run with the failure. A P/D split's decode instances take
//! requests straight into their batch: the key orders only wait queues.

use rhai::{Dynamic, Map};
use serde::{Deserialize, Serialize};

use crate::cluster::code::{CallError, Program};
use crate::cluster::error::PolicyError;
use crate::cluster::rules::{Env, Linear, Rules, SignalSet, TreeNode};
use crate::cluster::signals::RequestSignals;
use crate::engine::instance::Signals;
use crate::engine::queue_order::SchedulerPolicy;

/// A scheduling policy as written in a policy bundle (`scheduling:`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "policy", rename_all = "kebab-case", deny_unknown_fields)]
pub enum SchedulingPolicy {
    /// A decision tree's leaf gives the key.
    DecisionTree {
        /// The tree; leaves `key: {constant, <signal>: weight}`.
        tree: Box<TreeNode>,
        /// Which running request a full KV cache preempts.
        #[serde(default)]
        preempt: Preempt,
    },
    /// A program gives the key: `fn key(request, instance)` returns a
    /// number.
    Code {
        /// Rhai source defining `fn key(request, instance)`.
        source: String,
        /// Operations one call may run.
        #[serde(default = "crate::cluster::code::default_max_operations")]
        max_operations: u64,
        /// Which running request a full KV cache preempts.
        #[serde(default)]
        preempt: Preempt,
    },
}

/// Which running request a full KV cache preempts under a scheduling tree
/// or program.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Preempt {
    /// The highest key (the latest of those on ties), as vLLM's priority
    /// scheduling preempts the least urgent.
    #[default]
    HighestKey,
    /// The latest to join the batch, as vLLM's FCFS scheduling does.
    Latest,
}

/// What a scheduling tree or program sees, numbers then texts: the
/// request's prompt tokens and its priority (the priority policy's
/// number, lower is more urgent); the instance's waiting and running
/// requests and its KV usage (0..1) when the request enters it; the
/// request's SLO class and tenant.
pub const SIGNALS: SignalSet = SignalSet {
    numeric: &["input_tokens", "priority", "waiting", "running", "kv_usage"],
    text: &["slo_class", "tenant"],
};

struct Seen<'a> {
    req: &'a RequestSignals<'a>,
    priority: i64,
    inst: &'a Signals,
}

impl Env for Seen<'_> {
    fn num(&self, i: usize) -> f64 {
        match i {
            0 => f64::from(self.req.input_tokens),
            1 => self.priority as f64,
            2 => f64::from(self.inst.waiting),
            3 => f64::from(self.inst.running),
            _ => self.inst.kv_usage(),
        }
    }

    fn text(&self, i: usize) -> &str {
        if i == 0 {
            self.req.slo_class
        } else {
            self.req.tenant
        }
    }
}

impl SchedulingPolicy {
    /// The policy's name.
    pub fn name(&self) -> &'static str {
        match self {
            Self::DecisionTree { .. } => "decision-tree",
            Self::Code { .. } => "code",
        }
    }

    /// The engine's wait-queue order that runs it: keys as priorities,
    /// with its preemption rule.
    pub fn engine_scheduler(&self) -> SchedulerPolicy {
        let (Self::DecisionTree { preempt, .. } | Self::Code { preempt, .. }) = self;
        match preempt {
            Preempt::HighestKey => SchedulerPolicy::PriorityFcfs,
            Preempt::Latest => SchedulerPolicy::KeyLatest,
        }
    }

    /// Checks the tree or program.
    ///
    /// # Errors
    /// [`PolicyError::Tree`] naming the node or the source's line.
    pub fn validate(&self) -> Result<(), PolicyError> {
        Scheduler::compile(self).map(|_| ())
    }
}

/// A scheduling policy, compiled, with its program's state.
#[derive(Debug, Clone)]
pub struct Scheduler {
    tree: Option<Rules<Linear>>,
    code: Option<Program>,
    failure: Option<CallError>,
    last_leaf: Option<usize>,
}

impl Scheduler {
    fn compile(policy: &SchedulingPolicy) -> Result<Self, PolicyError> {
        Ok(match policy {
            SchedulingPolicy::DecisionTree { tree, .. } => Self {
                tree: Some(Rules::compile(
                    tree,
                    "scheduling.tree",
                    &SIGNALS,
                    "key",
                    |n, path| Linear::compile(n.key.as_ref().expect("a key leaf"), path, &SIGNALS),
                )?),
                code: None,
                failure: None,
                last_leaf: None,
            },
            SchedulingPolicy::Code {
                source,
                max_operations,
                ..
            } => Self {
                tree: None,
                code: Some(Program::compile(
                    source,
                    *max_operations,
                    "scheduling",
                    "scheduling",
                    "key",
                    &["request", "instance"],
                )?),
                failure: None,
                last_leaf: None,
            },
        })
    }

    /// The runtime of `policy`.
    ///
    /// # Panics
    /// A tree or program that does not compile: bundles are checked when
    /// read ([`SchedulingPolicy::validate`]).
    pub fn new(policy: &SchedulingPolicy) -> Self {
        Self::compile(policy).expect("a checked scheduling policy")
    }

    /// A program's first failed call, if any.
    pub fn failure(&self) -> Option<&CallError> {
        self.failure.as_ref()
    }

    /// The tree's leaf of the last request (`scheduling.tree.then`).
    pub fn last_path(&self) -> Option<&str> {
        Some(self.tree.as_ref()?.leaf_path(self.last_leaf?))
    }

    /// The wait-queue key (lower goes first) of `req`, whose priority is
    /// `priority`, entering an instance that shows `inst`: the value in
    /// thousandths.
    pub fn key(&mut self, req: &RequestSignals<'_>, priority: i64, inst: &Signals) -> i64 {
        let seen = Seen {
            req,
            priority,
            inst,
        };
        let v = if let Some(t) = &self.tree {
            let leaf = t.leaf_of(&seen);
            self.last_leaf = Some(leaf);
            t.leaf(leaf).value(&seen)
        } else {
            match (&mut self.code, &self.failure) {
                (Some(p), None) => match call(p, &seen) {
                    Ok(v) => v,
                    Err(e) => {
                        self.failure = Some(e);
                        0.0
                    }
                },
                _ => 0.0,
            }
        };
        (v * 1000.0).round().clamp(-9e18, 9e18) as i64
    }
}

/// One call of a scheduling program.
fn call(p: &mut Program, seen: &Seen<'_>) -> Result<f64, CallError> {
    let mut r = crate::cluster::code::request_map(seen.req);
    r.insert("priority".into(), Dynamic::from_int(seen.priority));
    let mut i = Map::new();
    i.insert(
        "waiting".into(),
        Dynamic::from_int(i64::from(seen.inst.waiting)),
    );
    i.insert(
        "running".into(),
        Dynamic::from_int(i64::from(seen.inst.running)),
    );
    i.insert("kv_usage".into(), Dynamic::from_float(seen.inst.kv_usage()));
    let (out, decision) = p.call((Dynamic::from_map(r), Dynamic::from_map(i)))?;
    p.number(decision, "the key", &out)
}
