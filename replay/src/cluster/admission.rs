//! Admission policies: the first gate of the cluster pipeline
//! (`../shared/design/cluster-architecture.md`, "Admission Pipeline").
//! A rejected request never reaches routing; it is counted and written to
//! the predicted trace with `status: error` and the policy's name.
//!
//! Besides the templates, admission can be a decision tree
//! ([`crate::cluster::rules`], leaves `admit: true|false`) or evolved code
//! ([`crate::cluster::code`], `fn admit(request, cluster)` returning
//! `true` or `false`), both over [`SIGNALS`]:
//!
//! ```yaml
//! admission:
//!   policy: decision-tree
//!   tree:
//!     when: {all: [{signal: slo_class, is: batch}, {signal: waiting, above: 64}]}
//!     then: {admit: false}      # shed batch work while the queues are long
//!     else: {admit: true}
//! ```
//!
//! A program's `request` map has `input_tokens`, `slo_class`, `tenant`;
//! its `cluster` map has the numeric signals below plus `now_us`; `this`
//! is a map kept from call to call (a bucket's level). A failed call
//! admits the request and ends the run with the failure.

use crate::cluster::code::{CallError, Program};
use crate::cluster::error::PolicyError;
use crate::cluster::rules::{Env, Rules, SignalSet, TreeNode};
use crate::cluster::signals::RequestSignals;
use blis_traces::shown::Num;
use rhai::{Dynamic, Map};
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

/// An admission policy and its parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(tag = "policy", rename_all = "kebab-case", deny_unknown_fields)]
pub enum AdmissionPolicy {
    /// Accept every request (the default).
    #[default]
    AlwaysAdmit,
    /// Reject every request (pathological tests).
    RejectAll,
    /// A bucket of `capacity` tokens refilled at `refill_rate` tokens/s;
    /// each request consumes its input tokens and is rejected when the
    /// bucket holds fewer. The bucket starts full.
    TokenBucket {
        /// Bucket size, tokens.
        capacity: f64,
        /// Refill rate, tokens per second.
        refill_rate: f64,
    },
    /// At most `rate` requests/s with bursts of `burst` (a token bucket
    /// counting requests).
    RateLimit {
        /// Sustained rate, requests per second.
        rate: f64,
        /// Burst size, requests (default 1).
        #[serde(default = "one")]
        burst: f64,
    },
    /// At most `max_in_flight` admitted and unfinished requests per tenant
    /// (`quotas` per tenant id, else `default_max_in_flight`).
    TenantQuota {
        /// The limit of tenants not in `quotas`.
        default_max_in_flight: u32,
        /// Per-tenant limits.
        #[serde(default)]
        quotas: std::collections::BTreeMap<String, u32>,
    },
    /// A decision tree's leaf decides ([`crate::cluster::rules`]).
    DecisionTree {
        /// The tree; leaves `admit: true|false`.
        tree: Box<TreeNode>,
    },
    /// A program decides ([`crate::cluster::code`]): `fn admit(request,
    /// cluster)` returns `true` or `false`.
    Code {
        /// Rhai source defining `fn admit(request, cluster)`.
        source: String,
        /// Operations one call may run.
        #[serde(default = "crate::cluster::code::default_max_operations")]
        max_operations: u64,
    },
}

/// What an admission tree or program sees, numbers then texts: the
/// request's prompt tokens; over the instances taking requests, the sum of
/// their waiting and running requests and of the requests routed there and
/// not finished, their mean KV usage (0..1) and their number; the
/// admitted, unfinished requests of the request's tenant; the time since
/// the run's start, s.
pub const SIGNALS: SignalSet = SignalSet {
    numeric: &[
        "input_tokens",
        "waiting",
        "running",
        "in_flight",
        "kv_usage",
        "instances",
        "tenant_in_flight",
        "time_s",
    ],
    text: &["slo_class", "tenant"],
};

/// The cluster as admission sees it at one decision ([`SIGNALS`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ClusterSignals {
    /// Requests waiting, summed over instances.
    pub waiting: u32,
    /// Requests running, summed.
    pub running: u32,
    /// Requests routed and not finished, summed.
    pub in_flight: u32,
    /// Requests routed and not running, summed over instances (flow
    /// control's queue; not an admission signal).
    pub queued: u32,
    /// Mean KV usage, 0..1.
    pub kv_usage: f64,
    /// Instances taking requests.
    pub instances: u32,
}

struct Seen<'a> {
    req: &'a RequestSignals<'a>,
    cluster: &'a ClusterSignals,
    tenant_in_flight: u32,
    now_us: i64,
}

impl Env for Seen<'_> {
    fn num(&self, i: usize) -> f64 {
        match i {
            0 => f64::from(self.req.input_tokens),
            1 => f64::from(self.cluster.waiting),
            2 => f64::from(self.cluster.running),
            3 => f64::from(self.cluster.in_flight),
            4 => self.cluster.kv_usage,
            5 => f64::from(self.cluster.instances),
            6 => f64::from(self.tenant_in_flight),
            _ => self.now_us as f64 / 1e6,
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

fn compile_tree(tree: &TreeNode) -> Result<Rules<bool>, PolicyError> {
    Rules::compile(tree, "admission.tree", &SIGNALS, "admit", |n, _| {
        Ok(n.admit.expect("an admit leaf"))
    })
}

fn compile_code(source: &str, max_operations: u64) -> Result<Program, PolicyError> {
    Program::compile(
        source,
        max_operations,
        "admission",
        "admission",
        "admit",
        &["request", "cluster"],
    )
}

fn one() -> f64 {
    1.0
}

impl AdmissionPolicy {
    /// The policy's name, as in flags and the bundle.
    pub fn name(&self) -> &'static str {
        match self {
            Self::AlwaysAdmit => "always-admit",
            Self::RejectAll => "reject-all",
            Self::TokenBucket { .. } => "token-bucket",
            Self::RateLimit { .. } => "rate-limit",
            Self::TenantQuota { .. } => "tenant-quota",
            Self::DecisionTree { .. } => "decision-tree",
            Self::Code { .. } => "code",
        }
    }

    /// Whether its decisions read the cluster ([`ClusterSignals`]).
    pub fn reads_cluster(&self) -> bool {
        matches!(self, Self::DecisionTree { .. } | Self::Code { .. })
    }

    /// Checks the parameters: finite and positive where they must be.
    ///
    /// # Errors
    /// The offending parameter, named.
    pub fn validate(&self) -> Result<(), PolicyError> {
        let pos = |name: &str, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(PolicyError::OutOfRange {
                    field: format!("admission {}: {name}", self.name()),
                    must: "a positive number",
                    got: Num(v).to_string(),
                })
            }
        };
        match self {
            Self::TokenBucket {
                capacity,
                refill_rate,
            } => {
                pos("capacity", *capacity)?;
                pos("refill_rate", *refill_rate)
            }
            Self::RateLimit { rate, burst } => {
                pos("rate", *rate)?;
                pos("burst", *burst)
            }
            Self::DecisionTree { tree } => compile_tree(tree).map(|_| ()),
            Self::Code {
                source,
                max_operations,
            } => compile_code(source, *max_operations).map(|_| ()),
            _ => Ok(()),
        }
    }
}

/// The running state of an admission policy.
#[derive(Debug, Clone)]
pub struct Admission {
    policy: AdmissionPolicy,
    level: f64,
    last_us: i64,
    tenants: FxHashMap<String, u32>,
    tree: Option<Rules<bool>>,
    code: Option<Program>,
    /// A program's first failed call: later requests are admitted, and
    /// the run ends with it.
    failure: Option<CallError>,
    /// The tree's leaf of the last decision.
    last_leaf: Option<usize>,
    /// Requests rejected so far.
    pub rejected: u64,
}

impl Admission {
    /// A fresh state (a full bucket).
    ///
    /// # Panics
    /// A tree or program that does not compile: bundles are checked when
    /// read ([`AdmissionPolicy::validate`]).
    pub fn new(policy: AdmissionPolicy) -> Self {
        let level = match &policy {
            AdmissionPolicy::TokenBucket { capacity, .. } => *capacity,
            AdmissionPolicy::RateLimit { burst, .. } => *burst,
            _ => 0.0,
        };
        let tree = match &policy {
            AdmissionPolicy::DecisionTree { tree } => {
                Some(compile_tree(tree).expect("a checked admission tree"))
            }
            _ => None,
        };
        let code = match &policy {
            AdmissionPolicy::Code {
                source,
                max_operations,
            } => Some(compile_code(source, *max_operations).expect("a checked program")),
            _ => None,
        };
        Self {
            policy,
            level,
            last_us: 0,
            tenants: FxHashMap::default(),
            tree,
            code,
            failure: None,
            last_leaf: None,
            rejected: 0,
        }
    }

    /// A program's first failed call, if any.
    pub fn failure(&self) -> Option<&CallError> {
        self.failure.as_ref()
    }

    /// The tree's leaf of the last decision (`admission.tree.else`).
    pub fn last_path(&self) -> Option<&str> {
        Some(self.tree.as_ref()?.leaf_path(self.last_leaf?))
    }

    /// Decides on a request arriving at `now_us`, with what the cluster
    /// looks like then (read only by trees and programs); `true` admits
    /// it.
    pub fn decide(
        &mut self,
        now_us: i64,
        req: &RequestSignals<'_>,
        cluster: &ClusterSignals,
    ) -> bool {
        if !self.policy.reads_cluster() {
            return self.admit(now_us, req.input_tokens, req.tenant);
        }
        let tenant_in_flight = self.tenants.get(req.tenant).copied().unwrap_or(0);
        let ok = if let Some(t) = &self.tree {
            let leaf = t.leaf_of(&Seen {
                req,
                cluster,
                tenant_in_flight,
                now_us,
            });
            self.last_leaf = Some(leaf);
            *t.leaf(leaf)
        } else {
            match (&mut self.code, &self.failure) {
                (Some(p), None) => match call(p, now_us, req, cluster, tenant_in_flight) {
                    Ok(ok) => ok,
                    Err(e) => {
                        self.failure = Some(e);
                        true
                    }
                },
                _ => true,
            }
        };
        if ok {
            *self.tenants.entry(req.tenant.to_string()).or_insert(0) += 1;
        } else {
            self.rejected += 1;
        }
        ok
    }

    /// The policy.
    pub fn policy(&self) -> &AdmissionPolicy {
        &self.policy
    }

    /// A template's decision on a request arriving at `now_us` with
    /// `input_tokens` from `tenant`; `true` admits it. ([`Admission::decide`]
    /// asks trees and programs, never this.)
    fn admit(&mut self, now_us: i64, input_tokens: u32, tenant: &str) -> bool {
        let dt_s = (now_us - self.last_us).max(0) as f64 / 1e6;
        self.last_us = self.last_us.max(now_us);
        let ok = match &self.policy {
            AdmissionPolicy::AlwaysAdmit => true,
            AdmissionPolicy::RejectAll => false,
            AdmissionPolicy::TokenBucket {
                capacity,
                refill_rate,
            } => {
                self.level = (self.level + refill_rate * dt_s).min(*capacity);
                let cost = f64::from(input_tokens);
                if self.level >= cost {
                    self.level -= cost;
                    true
                } else {
                    false
                }
            }
            AdmissionPolicy::RateLimit { rate, burst } => {
                self.level = (self.level + rate * dt_s).min(*burst);
                if self.level >= 1.0 {
                    self.level -= 1.0;
                    true
                } else {
                    false
                }
            }
            AdmissionPolicy::TenantQuota {
                default_max_in_flight,
                quotas,
            } => {
                let max = quotas
                    .get(tenant)
                    .copied()
                    .unwrap_or(*default_max_in_flight);
                let n = self.tenants.entry(tenant.to_string()).or_insert(0);
                if *n < max {
                    *n += 1;
                    true
                } else {
                    false
                }
            }
            // (Decided in `decide`.)
            AdmissionPolicy::DecisionTree { .. } | AdmissionPolicy::Code { .. } => true,
        };
        if !ok {
            self.rejected += 1;
        }
        ok
    }

    /// An admitted request of `tenant` left the system (tenant quotas,
    /// trees and programs).
    pub fn left(&mut self, tenant: &str) {
        if let AdmissionPolicy::TenantQuota { .. }
        | AdmissionPolicy::DecisionTree { .. }
        | AdmissionPolicy::Code { .. } = self.policy
            && let Some(n) = self.tenants.get_mut(tenant)
        {
            *n = n.saturating_sub(1);
        }
    }
}

/// One call of an admission program.
fn call(
    p: &mut Program,
    now_us: i64,
    req: &RequestSignals<'_>,
    cluster: &ClusterSignals,
    tenant_in_flight: u32,
) -> Result<bool, CallError> {
    let r = crate::cluster::code::request_map(req);
    let mut c = Map::new();
    let int = |v: u32| Dynamic::from_int(i64::from(v));
    c.insert("waiting".into(), int(cluster.waiting));
    c.insert("running".into(), int(cluster.running));
    c.insert("in_flight".into(), int(cluster.in_flight));
    c.insert("kv_usage".into(), Dynamic::from_float(cluster.kv_usage));
    c.insert("instances".into(), int(cluster.instances));
    c.insert("tenant_in_flight".into(), int(tenant_in_flight));
    c.insert("time_s".into(), Dynamic::from_float(now_us as f64 / 1e6));
    c.insert("now_us".into(), Dynamic::from_int(now_us));
    let (out, decision) = p.call((Dynamic::from_map(r), Dynamic::from_map(c)))?;
    out.as_bool().map_err(|t| {
        p.fail(
            decision,
            format!("returned a {t}, not true (admit) or false (reject)"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_bucket_admits_exactly_what_the_bucket_holds() {
        let mut a = Admission::new(AdmissionPolicy::TokenBucket {
            capacity: 1000.0,
            refill_rate: 100.0,
        });
        // A full bucket: 600 then 400 fit, the next 1 does not.
        assert!(a.admit(0, 600, ""));
        assert!(a.admit(0, 400, ""));
        assert!(!a.admit(0, 1, ""));
        // One second refills 100 tokens.
        assert!(!a.admit(1_000_000, 101, ""));
        assert!(a.admit(1_000_000, 100, ""));
        assert_eq!(a.rejected, 2);
    }

    #[test]
    fn tenant_quota_counts_requests_in_flight() {
        let mut a = Admission::new(AdmissionPolicy::TenantQuota {
            default_max_in_flight: 1,
            quotas: [("big".to_string(), 2)].into(),
        });
        assert!(a.admit(0, 10, "small"));
        assert!(!a.admit(0, 10, "small"));
        a.left("small");
        assert!(a.admit(0, 10, "small"));
        assert!(a.admit(0, 10, "big"));
        assert!(a.admit(0, 10, "big"));
        assert!(!a.admit(0, 10, "big"));
    }
}
