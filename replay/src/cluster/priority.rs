//! Priority policies: the number each request is ordered by in a
//! `priority-fcfs` (or `reverse-priority`) wait queue and in the flow-control
//! gateway queue. Lower is more urgent, as vLLM's `priority`.
//!
//! `slo-based` and `inverted-slo` follow BLIS's priority policies
//! (`../shared/design/core-engine.md`, "Priority Policies"): a score
//! `base + age_weight × age` (higher is more urgent), `base` from the
//! request's SLO class (the class scores of `../shared/design/macro-plan.md`'s policy
//! bundle). Because every waiting request ages at the same rate, the order
//! of `base_i + w·(t − arrival_i)` is the same at every time `t`: that of
//! `base_i − w·arrival_i`. So the priority is fixed at arrival and the wait
//! queue stays a heap, yet an old standard request overtakes a new
//! realtime one once it has waited `(realtime − standard) / age_weight`
//! seconds longer (no starvation).
//!
//! A priority can also be a decision tree ([`crate::cluster::rules`],
//! leaves `priority: {constant: c, input_tokens: w}`) or evolved code
//! ([`crate::cluster::code`], `fn priority(request)` returning a number),
//! over [`SIGNALS`]; lower is more urgent. The request's priority is
//! `1e6 × value + age_weight × arrival_us`, rounded: `age_weight` (per
//! second, default 0) ages waiting requests as `slo-based` does, so a
//! tree whose leaves are minus `slo-based`'s class scores, with its
//! `age_weight`, is that policy exactly.
//!
//! ```yaml
//! priority:
//!   policy: decision-tree
//!   age_weight: 10
//!   tree:
//!     when: {signal: slo_class, is: batch}
//!     then: {priority: {constant: 0}}
//!     else: {priority: {constant: -50, input_tokens: 0.001}}   # short prompts first
//! ```
//!
//! A program's `request` map has `input_tokens`, `slo_class`, `tenant` and
//! `arrival_us`; `this` is a map kept from call to call. A failed call
//! gives priority 0 and ends the run with the failure.

use blis_traces::shown::Num;
use rhai::Dynamic;
use serde::{Deserialize, Serialize};

use crate::cluster::code::{CallError, Program};
use crate::cluster::error::PolicyError;
use crate::cluster::rules::{Env, Linear, Rules, SignalSet, TreeNode};
use crate::cluster::signals::RequestSignals;
use crate::engine::queue_order::slo_priority;

/// A priority policy and its parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(tag = "policy", rename_all = "kebab-case", deny_unknown_fields)]
pub enum PriorityPolicy {
    /// The SLO class's vLLM priority ([`slo_priority`]: critical/realtime 0,
    /// standard 1, sheddable 2, batch 3, background 4); the default.
    #[default]
    SloClass,
    /// Every request the same (priority-fcfs becomes fcfs).
    Constant,
    /// Class score plus `age_weight` per second waited: older requests
    /// gain urgency, so none starves.
    SloBased(AgeScores),
    /// Class score minus `age_weight` per second waited (pathological: the
    /// oldest starve).
    InvertedSlo(AgeScores),
    /// A decision tree's leaf value ([`crate::cluster::rules`]).
    DecisionTree {
        /// The tree; leaves `priority: {constant, <signal>: weight}`.
        tree: Box<TreeNode>,
        /// Urgency gained per second waited (in leaf units; negative:
        /// lost, as `inverted-slo`).
        #[serde(default)]
        age_weight: f64,
    },
    /// A program's value ([`crate::cluster::code`]): `fn
    /// priority(request)` returns a number.
    Code {
        /// Rhai source defining `fn priority(request)`.
        source: String,
        /// Operations one call may run.
        #[serde(default = "crate::cluster::code::default_max_operations")]
        max_operations: u64,
        /// Urgency gained per second waited (in the program's units).
        #[serde(default)]
        age_weight: f64,
    },
}

/// What a priority tree or program sees: the request's prompt tokens;
/// its SLO class and tenant.
pub const SIGNALS: SignalSet = SignalSet {
    numeric: &["input_tokens"],
    text: &["slo_class", "tenant"],
};

struct Seen<'a>(&'a RequestSignals<'a>);

impl Env for Seen<'_> {
    fn num(&self, _: usize) -> f64 {
        f64::from(self.0.input_tokens)
    }

    fn text(&self, i: usize) -> &str {
        if i == 0 {
            self.0.slo_class
        } else {
            self.0.tenant
        }
    }
}

fn compile_tree(tree: &TreeNode) -> Result<Rules<Linear>, PolicyError> {
    Rules::compile(tree, "priority.tree", &SIGNALS, "priority", |n, path| {
        Linear::compile(
            n.priority.as_ref().expect("a priority leaf"),
            path,
            &SIGNALS,
        )
    })
}

fn compile_code(source: &str, max_operations: u64) -> Result<Program, PolicyError> {
    Program::compile(
        source,
        max_operations,
        "priority",
        "priority",
        "priority",
        &["request"],
    )
}

fn check_age_weight(age_weight: f64) -> Result<(), PolicyError> {
    if age_weight.is_finite() {
        Ok(())
    } else {
        Err(PolicyError::OutOfRange {
            field: "priority: age_weight".into(),
            must: "a finite number (negative: the oldest lose urgency, as inverted-slo)",
            got: Num(age_weight).to_string(),
        })
    }
}

/// A priority policy, compiled, with its program's state: what the
/// cluster asks for each request's priority.
#[derive(Debug, Clone)]
pub struct Prioritizer {
    policy: PriorityPolicy,
    tree: Option<Rules<Linear>>,
    code: Option<Program>,
    failure: Option<CallError>,
    last_leaf: Option<usize>,
}

impl Prioritizer {
    /// The tree's leaf of the last request (`priority.tree.else`).
    pub fn last_path(&self) -> Option<&str> {
        Some(self.tree.as_ref()?.leaf_path(self.last_leaf?))
    }

    /// The runtime of `policy`.
    ///
    /// # Panics
    /// A tree or program that does not compile: bundles are checked when
    /// read ([`PriorityPolicy::validate`]).
    pub fn new(policy: PriorityPolicy) -> Self {
        let (tree, code) = match &policy {
            PriorityPolicy::DecisionTree { tree, .. } => (
                Some(compile_tree(tree).expect("a checked priority tree")),
                None,
            ),
            PriorityPolicy::Code {
                source,
                max_operations,
                ..
            } => (
                None,
                Some(compile_code(source, *max_operations).expect("a checked program")),
            ),
            _ => (None, None),
        };
        Self {
            policy,
            tree,
            code,
            failure: None,
            last_leaf: None,
        }
    }

    /// The policy.
    pub fn policy(&self) -> &PriorityPolicy {
        &self.policy
    }

    /// A program's first failed call, if any.
    pub fn failure(&self) -> Option<&CallError> {
        self.failure.as_ref()
    }

    /// The priority (lower is more urgent) of `req` arriving at
    /// `arrival_us`.
    pub fn priority(&mut self, req: &RequestSignals<'_>, arrival_us: i64) -> i64 {
        let (value, age_weight) = match &self.policy {
            PriorityPolicy::DecisionTree { age_weight, .. } => {
                let t = self.tree.as_ref().expect("a compiled tree");
                let leaf = t.leaf_of(&Seen(req));
                self.last_leaf = Some(leaf);
                (t.leaf(leaf).value(&Seen(req)), *age_weight)
            }
            PriorityPolicy::Code { age_weight, .. } => {
                let v = match (&mut self.code, &self.failure) {
                    (Some(p), None) => match call(p, req, arrival_us) {
                        Ok(v) => v,
                        Err(e) => {
                            self.failure = Some(e);
                            0.0
                        }
                    },
                    _ => 0.0,
                };
                (v, *age_weight)
            }
            other => return other.priority(req.slo_class, arrival_us),
        };
        (age_weight * arrival_us as f64 + value * 1e6)
            .round()
            .clamp(-9e18, 9e18) as i64
    }
}

/// One call of a priority program.
fn call(p: &mut Program, req: &RequestSignals<'_>, arrival_us: i64) -> Result<f64, CallError> {
    let mut r = crate::cluster::code::request_map(req);
    r.insert("arrival_us".into(), Dynamic::from_int(arrival_us));
    let (out, decision) = p.call((Dynamic::from_map(r),))?;
    p.number(decision, "the priority", &out)
}

/// The scores of [`PriorityPolicy::SloBased`] (higher is more urgent).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgeScores {
    /// Score of `critical` and `realtime` requests (default 100).
    pub realtime_score: f64,
    /// Score of `standard`, `interactive` and unclassified requests
    /// (default 50).
    pub default_score: f64,
    /// Score of `sheddable`, `batch` and `background` requests (default 10).
    pub batch_score: f64,
    /// Score gained per second of age (default 10: a standard request
    /// overtakes a realtime one that arrived 5 s after it).
    pub age_weight: f64,
}

impl Default for AgeScores {
    fn default() -> Self {
        Self {
            realtime_score: 100.0,
            default_score: 50.0,
            batch_score: 10.0,
            age_weight: 10.0,
        }
    }
}

impl AgeScores {
    fn base(&self, slo_class: &str) -> f64 {
        match slo_priority(slo_class) {
            0 => self.realtime_score,
            1 => self.default_score,
            _ => self.batch_score,
        }
    }

    fn validate(&self) -> Result<(), PolicyError> {
        for (name, v) in [
            ("realtime_score", self.realtime_score),
            ("default_score", self.default_score),
            ("batch_score", self.batch_score),
            ("age_weight", self.age_weight),
        ] {
            if !v.is_finite() {
                return Err(PolicyError::OutOfRange {
                    field: format!("priority: {name}"),
                    must: "a finite number",
                    got: Num(v).to_string(),
                });
            }
        }
        if self.age_weight < 0.0 {
            return Err(PolicyError::OutOfRange {
                field: "priority: age_weight".into(),
                must: "≥ 0",
                got: Num(self.age_weight).to_string(),
            });
        }
        Ok(())
    }
}

impl PriorityPolicy {
    /// The policy's name, as in flags and the bundle.
    pub fn name(&self) -> &'static str {
        match self {
            Self::SloClass => "slo-class",
            Self::Constant => "constant",
            Self::SloBased(_) => "slo-based",
            Self::InvertedSlo(_) => "inverted-slo",
            Self::DecisionTree { .. } => "decision-tree",
            Self::Code { .. } => "code",
        }
    }

    /// A policy by name with default parameters.
    ///
    /// # Errors
    /// An unknown name (the known ones listed).
    pub fn from_name(name: &str) -> Result<Self, PolicyError> {
        match name {
            "slo-class" => Ok(Self::SloClass),
            "constant" => Ok(Self::Constant),
            "slo-based" => Ok(Self::SloBased(AgeScores::default())),
            "inverted-slo" => Ok(Self::InvertedSlo(AgeScores::default())),
            other => Err(PolicyError::Unknown {
                kind: "priority policy",
                name: other.to_string(),
                known: "slo-class, constant, slo-based, inverted-slo",
            }),
        }
    }

    /// A template's priority (lower is more urgent) of a request of
    /// `slo_class` arriving at `arrival_us`. For the age-weighted policies
    /// it is `−score` in millionths, less the common `age_weight × now`
    /// term. (Trees and programs need the whole request: [`Prioritizer`]
    /// asks them, never this.)
    fn priority(&self, slo_class: &str, arrival_us: i64) -> i64 {
        match self {
            Self::DecisionTree { .. } | Self::Code { .. } => 0,
            Self::SloClass => i64::from(slo_priority(slo_class)),
            Self::Constant => 0,
            Self::SloBased(s) => {
                (s.age_weight * arrival_us as f64 - s.base(slo_class) * 1e6).round() as i64
            }
            Self::InvertedSlo(s) => {
                (-s.age_weight * arrival_us as f64 - s.base(slo_class) * 1e6).round() as i64
            }
        }
    }

    /// Checks the parameters.
    ///
    /// # Errors
    /// The offending field, named.
    pub fn validate(&self) -> Result<(), PolicyError> {
        match self {
            Self::SloBased(s) | Self::InvertedSlo(s) => s.validate(),
            Self::DecisionTree { tree, age_weight } => {
                check_age_weight(*age_weight)?;
                compile_tree(tree).map(|_| ())
            }
            Self::Code {
                source,
                max_operations,
                age_weight,
            } => {
                check_age_weight(*age_weight)?;
                compile_code(source, *max_operations).map(|_| ())
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The score at time `t` of BLIS's formula, for comparison.
    fn score(s: &AgeScores, class: &str, arrival_us: i64, t_us: i64) -> f64 {
        s.base(class) + s.age_weight * (t_us - arrival_us) as f64 / 1e6
    }

    #[test]
    fn slo_based_orders_as_the_age_weighted_score_at_any_time() {
        let s = AgeScores::default();
        let p = PriorityPolicy::SloBased(s);
        let reqs = [
            ("batch", 0),
            ("standard", 1_000_000),
            ("realtime", 5_500_000),
            ("standard", 6_000_000),
            ("realtime", 9_000_000),
        ];
        for t in [9_000_000, 20_000_000, 100_000_000] {
            for a in &reqs {
                for b in &reqs {
                    let by_score = score(&s, a.0, a.1, t) > score(&s, b.0, b.1, t);
                    let by_priority = p.priority(a.0, a.1) < p.priority(b.0, b.1);
                    assert_eq!(by_score, by_priority, "{a:?} vs {b:?} at {t}");
                }
            }
        }
        // A standard request overtakes a realtime one arriving 5 s later,
        // not one arriving 4.5 s later.
        assert!(p.priority("standard", 1_000_000) < p.priority("realtime", 6_500_000));
        assert!(p.priority("standard", 1_000_000) > p.priority("realtime", 5_500_000));
        let inv = PriorityPolicy::InvertedSlo(s);
        assert!(inv.priority("standard", 9_000_000) < inv.priority("standard", 1_000_000));
    }

    #[test]
    fn names_and_bad_parameters() {
        for n in ["slo-class", "constant", "slo-based", "inverted-slo"] {
            assert_eq!(PriorityPolicy::from_name(n).unwrap().name(), n);
        }
        assert!(PriorityPolicy::from_name("deadline").is_err());
        let bad = PriorityPolicy::SloBased(AgeScores {
            age_weight: f64::NAN,
            ..AgeScores::default()
        });
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("age_weight")
        );
    }
}
