//! The cluster's control policies as one bundle: admission, routing, the
//! signals' freshness and the instance count (`--policy-config P.yaml`,
//! strictly parsed; flags override its fields).
//!
//! ```yaml
//! num_instances: 4
//! admission: {policy: token-bucket, capacity: 200000, refill_rate: 100000}
//! routing:
//!   policy: weighted
//!   scorers: {prefix-affinity: 3, queue-depth: 2, kv-utilization: 2}
//! snapshot_refresh_interval_us: 0     # 0: signals read at routing time
//! prefix_index_capacity: 10000        # blocks per instance in the router's index
//! scheduler: priority-fcfs            # each instance's wait-queue order
//! priority: {policy: slo-based, age_weight: 10}   # what it orders by
//! admission_latency_us: 0             # delays each request's entry
//! routing_latency_us: 0
//! flow_control: {queue_depth_threshold: 4, kv_utilization_threshold: 0.9}
//! kv: {cpu_blocks: 20000, offload_threshold: 0.9, transfer_bandwidth_gb_s: 32}
//! autoscale: {policy: threshold, min_replicas: 2, max_replicas: 8, warmup_s: 60}
//! ```

use blis_traces::shown::Num;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::cluster::admission::AdmissionPolicy;
use crate::cluster::autoscale::AutoscaleConfig;
use crate::cluster::disaggregation::PdConfig;
use crate::cluster::error::PolicyError;
use crate::cluster::priority::PriorityPolicy;
use crate::cluster::routing::RoutingPolicy;
use crate::cluster::scheduling::SchedulingPolicy;
use crate::engine::kv_tier::CpuTierSettings;

/// The most instances a cluster may have (each takes about 10 KB before
/// any request: 100,000 take 1 GB).
pub const MAX_INSTANCES: u32 = 100_000;
use crate::engine::queue_order::SchedulerPolicy;
use crate::error::Result;

/// A policy bundle.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyBundle {
    /// Instances in the cluster (default 1).
    pub num_instances: u32,
    /// Admission policy (default always-admit).
    pub admission: AdmissionPolicy,
    /// Routing policy (default round-robin).
    pub routing: RoutingPolicy,
    /// How often queue depth, batch size and KV usage are re-read from the
    /// instances, µs (0: at every routing decision), as a Prometheus scrape
    /// interval would make them stale.
    pub snapshot_refresh_interval_us: i64,
    /// Blocks per instance in the router's prefix index (default 10,000).
    pub prefix_index_capacity: u32,
    /// Each instance's wait-queue order (default: the `--scheduler` flag).
    pub scheduler: Option<SchedulerPolicy>,
    /// Each request's priority for `priority-fcfs` and the gateway queue
    /// (default: its SLO class's).
    pub priority: PriorityPolicy,
    /// Each wait queue's order as a decision tree or program
    /// ([`crate::cluster::scheduling`]); instead of `scheduler`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scheduling: Option<SchedulingPolicy>,
    /// Time the admission decision takes, µs (delays the request's entry).
    pub admission_latency_us: i64,
    /// Time the routing decision takes, µs (delays the request's entry).
    pub routing_latency_us: i64,
    /// A gateway queue in front of the router (`--flow-control`).
    pub flow_control: Option<FlowControl>,
    /// A CPU tier under each instance's GPU KV cache (`--kv-cpu-blocks`
    /// and friends; see [`crate::engine::kv_tier`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv: Option<CpuTierSettings>,
    /// Prefill/decode disaggregation (`--architecture pd`; see
    /// [`crate::cluster::disaggregation`]): the cluster is its prefill and
    /// decode pools, `num_instances` is ignored.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pd: Option<PdConfig>,
    /// Autoscaling (`autoscale:`; `--autoscaler`): `num_instances` is the
    /// initial replica count.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub autoscale: Option<AutoscaleConfig>,
}

/// Flow control: admitted requests wait in a priority-ordered gateway
/// queue (SLO class, then arrival) and are routed, with the signals of that
/// moment (late binding), only while the cluster is not saturated:
/// saturation = max(mean over instances of requests routed there and not
/// running / `queue_depth_threshold`, mean KV usage /
/// `kv_utilization_threshold`) < 1. It is evaluated on every arrival and
/// after every step (completions free room).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FlowControl {
    /// Queued requests per instance at saturation.
    pub queue_depth_threshold: f64,
    /// Mean KV usage (0..1) at saturation.
    pub kv_utilization_threshold: f64,
}

impl Default for FlowControl {
    fn default() -> Self {
        Self {
            queue_depth_threshold: 4.0,
            kv_utilization_threshold: 0.9,
        }
    }
}

impl Default for PolicyBundle {
    fn default() -> Self {
        Self {
            num_instances: 1,
            admission: AdmissionPolicy::default(),
            routing: RoutingPolicy::default(),
            snapshot_refresh_interval_us: 0,
            prefix_index_capacity: 10_000,
            scheduler: None,
            scheduling: None,
            priority: PriorityPolicy::default(),
            admission_latency_us: 0,
            routing_latency_us: 0,
            flow_control: None,
            kv: None,
            pd: None,
            autoscale: None,
        }
    }
}

impl PolicyBundle {
    /// Reads and checks a bundle.
    ///
    /// # Errors
    /// An unreadable file, malformed YAML or an unknown field (with its
    /// line), or an invalid value.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = blis_traces::text::read_text(path).map_err(|e| PolicyError::Unreadable {
            path: path.to_path_buf(),
            error: e.to_string(),
        })?;
        let b: Self = serde_saphyr::from_str(&text).map_err(|e| PolicyError::NotABundle {
            path: path.to_path_buf(),
            message: blis_traces::error::yaml_error(path, &text, &e).to_string(),
        })?;
        b.validate().map_err(|e| PolicyError::InFile {
            path: path.to_path_buf(),
            problem: Box::new(e),
        })?;
        Ok(b)
    }

    /// Checks the values.
    ///
    /// # Errors
    /// The offending field, named.
    pub fn validate(&self) -> std::result::Result<(), PolicyError> {
        let range = |field: &str, must, got: String| {
            Err(PolicyError::OutOfRange {
                field: field.to_string(),
                must,
                got,
            })
        };
        if self.num_instances == 0 {
            return range("num_instances", "at least 1", "0".into());
        }
        if self.num_instances > MAX_INSTANCES {
            return range(
                "num_instances",
                "at most 100,000 (each instance takes about 10 KB before any request)",
                self.num_instances.to_string(),
            );
        }
        if let Some(pd) = &self.pd
            && let Err((field, must, got)) = pd.validate()
        {
            return range(&field, must, got);
        }
        if let Some(a) = &self.autoscale {
            if let Err((field, must, got)) = a.validate() {
                return range(&field, must, got);
            }
            a.validate_rules()?;
            if self.pd.is_some() && a.drain != crate::cluster::autoscale::DrainPolicy::Wait {
                return range(
                    "autoscale: drain",
                    "wait with P/D (--architecture pd: the decode pool's requests hold transferred KV blocks; cutting or re-routing them is not modelled)",
                    format!("{:?}", a.drain).to_lowercase(),
                );
            }
        }
        if let Some(f) = &self.flow_control {
            for (name, v) in [
                (
                    "flow_control: queue_depth_threshold",
                    f.queue_depth_threshold,
                ),
                (
                    "flow_control: kv_utilization_threshold",
                    f.kv_utilization_threshold,
                ),
            ] {
                if !(v.is_finite() && v > 0.0) {
                    return range(name, "a positive number", Num(v).to_string());
                }
            }
        }
        for (name, v) in [
            ("admission_latency_us", self.admission_latency_us),
            ("routing_latency_us", self.routing_latency_us),
            (
                "snapshot_refresh_interval_us",
                self.snapshot_refresh_interval_us,
            ),
        ] {
            // (Past 2^53 µs, 285 years, a time overflows the clock it is
            // added to.)
            if !(0..=blis_traces::csvio::MAX_TIME_US).contains(&v) {
                return range(name, "≥ 0 and at most 2^53 µs (285 years)", v.to_string());
            }
        }
        if self.prefix_index_capacity == 0 {
            return range("prefix_index_capacity", "at least 1", "0".into());
        }
        if let RoutingPolicy::Weighted { scorers } = &self.routing {
            if let Some((s, w)) = scorers.iter().find(|(_, w)| !w.is_finite() || **w < 0.0) {
                return range(
                    &format!("routing scorers: the weight of {}", s.name()),
                    "finite and ≥ 0",
                    Num(*w).to_string(),
                );
            }
            if scorers.values().all(|w| *w == 0.0) {
                return Err(PolicyError::NoPositiveWeight);
            }
        }
        self.routing.validate("routing")?;
        if let Some(pd) = &self.pd {
            pd.decode_routing.validate("pd.decode_routing")?;
        }
        self.priority.validate()?;
        if let Some(s) = &self.scheduling {
            if let Some(other) = self
                .scheduler
                .filter(|o| *o != SchedulerPolicy::PriorityFcfs)
            {
                return range(
                    "scheduler",
                    "left out (or priority-fcfs) when scheduling gives the order",
                    other.to_string(),
                );
            }
            s.validate()?;
        }
        self.admission.validate()
    }
}

impl PolicyBundle {
    /// Instances in the cluster: both pools of a P/D split (the decode
    /// pool's `max_replicas` slots when autoscaled), an autoscaler's
    /// `max_replicas` slots, else `num_instances`.
    pub fn instance_count(&self) -> u32 {
        match (&self.pd, &self.autoscale) {
            (Some(p), Some(a)) => p.prefill_instances + a.max_replicas,
            (Some(p), None) => p.prefill_instances + p.decode_instances,
            (None, Some(a)) => a.max_replicas,
            (None, None) => self.num_instances,
        }
    }

    /// Whether this is a plain single instance (no cluster section needed).
    pub fn is_single(&self) -> bool {
        self.pd.is_none()
            && self.autoscale.is_none()
            && self.num_instances == 1
            && self.admission == AdmissionPolicy::AlwaysAdmit
            && self.admission_latency_us == 0
            && self.routing_latency_us == 0
            && self.flow_control.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::routing::Scorer;

    #[test]
    fn a_bundle_parses_strictly() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("p.yaml");
        std::fs::write(
            &p,
            "num_instances: 4\nadmission: {policy: token-bucket, capacity: 1000, refill_rate: 10}\nrouting:\n  policy: weighted\n  scorers: {prefix-affinity: 3, queue-depth: 2}\n",
        )
        .unwrap();
        let b = PolicyBundle::from_file(&p).unwrap();
        assert_eq!(b.num_instances, 4);
        assert_eq!(
            b.routing,
            RoutingPolicy::Weighted {
                scorers: [(Scorer::PrefixAffinity, 3.0), (Scorer::QueueDepth, 2.0)].into()
            }
        );
        std::fs::write(
            &p,
            "num_instances: 4\nrouting: {policy: weighted, scorer: {}}\n",
        )
        .unwrap();
        let e = PolicyBundle::from_file(&p).unwrap_err().to_string();
        assert!(e.contains("p.yaml") && e.contains("scorer"), "{e}");
        std::fs::write(
            &p,
            "admission: {policy: token-bucket, capacity: .nan, refill_rate: 1}\n",
        )
        .unwrap();
        let e = PolicyBundle::from_file(&p).unwrap_err().to_string();
        assert!(e.contains("capacity"), "{e}");
        std::fs::write(&p, "num_instances: 0\n").unwrap();
        assert!(PolicyBundle::from_file(&p).is_err());
        // A cluster past the bound is refused before anything is
        // allocated (it used to abort allocating 10^8 instances).
        std::fs::write(&p, "num_instances: 100000000\n").unwrap();
        let e = PolicyBundle::from_file(&p).unwrap_err().to_string();
        assert!(
            e.contains("num_instances must be at most 100,000") && e.contains("got 100000000"),
            "{e}"
        );
        std::fs::write(&p, format!("num_instances: {MAX_INSTANCES}\n")).unwrap();
        assert!(PolicyBundle::from_file(&p).is_ok());
    }
}
