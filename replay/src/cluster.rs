//! The cluster's control plane: admission, then routing on the signals the
//! router sees (`../shared/design/cluster-architecture.md`). The event loop
//! that drives the instances is [`crate::sim::replay_cluster`]; one
//! instance with the default policies is exactly the single-instance
//! replay.

use blis_traces::{TraceRecord, content};

use crate::admission::Admission;
use crate::instance::{Instance, Snapshot};
use crate::policy::PolicyBundle;
use crate::routing::{Decision, InstanceView, Router};

/// Admission and routing state of a cluster run.
#[derive(Debug, Clone)]
pub struct Control {
    /// The admission policy's state.
    pub admission: Admission,
    /// The router's state.
    pub router: Router,
    refresh_us: i64,
    snaps: Vec<Snapshot>,
    in_flight: Vec<u32>,
    views: Vec<InstanceView>,
    hashes: Vec<u64>,
    /// Requests routed to each instance.
    pub routed: Vec<u64>,
    /// The last routing decision (for decision traces).
    pub last_decision: Option<Decision>,
}

impl Control {
    /// The control plane of `bundle` over `n` instances.
    pub fn new(bundle: &PolicyBundle, n: usize) -> Self {
        Self {
            admission: Admission::new(bundle.admission.clone()),
            router: Router::new(
                bundle.routing.clone(),
                n,
                bundle.prefix_index_capacity as usize,
            ),
            refresh_us: bundle.snapshot_refresh_interval_us.max(0),
            snaps: Vec::new(),
            in_flight: vec![0; n],
            views: vec![InstanceView::default(); n],
            hashes: Vec::new(),
            routed: vec![0; n],
            last_decision: None,
        }
    }

    /// One instance, every request admitted.
    pub fn single() -> Self {
        Self::new(&PolicyBundle::default(), 1)
    }

    /// The periodic refresh interval of the instance-reported signals
    /// (`None`: read at every decision).
    pub fn refresh_interval_us(&self) -> Option<i64> {
        // One instance: nothing to route, no signals to refresh.
        (self.refresh_us > 0 && self.in_flight.len() > 1).then_some(self.refresh_us)
    }

    /// Re-reads the instance-reported signals (a periodic refresh).
    pub fn refresh(&mut self, insts: &[Instance]) {
        self.snaps.clear();
        self.snaps.extend(insts.iter().map(Instance::snapshot));
    }

    /// Admits and routes `rec` arriving at `now`: the chosen instance, or
    /// `None` when admission rejects it.
    pub fn decide(&mut self, now: i64, rec: &TraceRecord, insts: &[Instance]) -> Option<usize> {
        let input = rec.effective_input_tokens();
        if !self
            .admission
            .admit(now, input, rec.request.tenant_id.as_ref())
        {
            return None;
        }
        let chosen = if insts.len() == 1 {
            0
        } else {
            if self.refresh_us == 0 || self.snaps.len() != insts.len() {
                self.refresh(insts);
            }
            self.hashes.clear();
            if self.router.needs_hashes() {
                let bs = insts[0].config().block_size;
                content::block_hashes(&rec.request, input.max(1), bs, &mut self.hashes);
            }
            let query = self.router.needs_cache_query();
            for (i, v) in self.views.iter_mut().enumerate() {
                let s = &self.snaps[i];
                *v = InstanceView {
                    waiting: s.waiting,
                    running: s.running,
                    kv_usage: s.kv_usage(),
                    in_flight: self.in_flight[i],
                    cached_blocks: if query {
                        let kv = insts[i].kv();
                        self.hashes
                            .iter()
                            .take_while(|h| kv.lookup(**h).is_some())
                            .count() as u32
                    } else {
                        0
                    },
                };
            }
            let d = self.router.route(&self.views, &self.hashes);
            let c = d.chosen;
            self.last_decision = Some(d);
            c
        };
        self.in_flight[chosen] += 1;
        self.routed[chosen] += 1;
        Some(chosen)
    }

    /// A routed request of `tenant` left instance `i` (completed, dropped
    /// or cancelled).
    pub fn left(&mut self, i: usize, tenant: &str) {
        self.in_flight[i] = self.in_flight[i].saturating_sub(1);
        self.admission.left(tenant);
    }

    /// Requests routed to instance `i` and not finished.
    pub fn in_flight(&self, i: usize) -> u32 {
        self.in_flight[i]
    }
}

/// One instance's share of a cluster run.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct InstanceSummary {
    /// Its index.
    pub index: usize,
    /// Requests routed to it.
    pub routed: u64,
    /// Requests it completed.
    pub completed: u64,
    /// Requests it dropped as unservable.
    pub dropped: u64,
    /// Its preemptions.
    pub preemptions: u64,
    /// Share of its prompt tokens found in its prefix cache.
    pub prefix_cache_hit_rate: f64,
    /// Output tokens it generated.
    pub generation_tokens: u64,
}

/// The cluster section of a replay summary.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ClusterSummary {
    /// Instances.
    pub num_instances: usize,
    /// The admission policy.
    pub admission: crate::admission::AdmissionPolicy,
    /// The routing policy.
    pub routing: crate::routing::RoutingPolicy,
    /// Refresh interval of the routing signals, µs (0: immediate).
    pub snapshot_refresh_interval_us: i64,
    /// Requests rejected by admission.
    pub rejected: u64,
    /// Each instance.
    pub instances: Vec<InstanceSummary>,
    /// Most routed over least routed instance (1: even).
    pub routing_imbalance: f64,
}

impl ClusterSummary {
    /// The summary of a finished run.
    pub fn of(bundle: &PolicyBundle, control: &Control, insts: &[Instance]) -> Self {
        let instances: Vec<InstanceSummary> = insts
            .iter()
            .enumerate()
            .map(|(i, inst)| {
                let c = inst.counters();
                InstanceSummary {
                    index: i,
                    routed: control.routed[i],
                    completed: c.completed,
                    dropped: c.dropped,
                    preemptions: c.preemptions,
                    prefix_cache_hit_rate: if c.prefix_queries > 0 {
                        c.prefix_hits as f64 / c.prefix_queries as f64
                    } else {
                        0.0
                    },
                    generation_tokens: c.generation_tokens,
                }
            })
            .collect();
        let max = instances.iter().map(|i| i.routed).max().unwrap_or(0);
        let min = instances.iter().map(|i| i.routed).min().unwrap_or(0);
        Self {
            num_instances: insts.len(),
            admission: bundle.admission.clone(),
            routing: bundle.routing.clone(),
            snapshot_refresh_interval_us: bundle.snapshot_refresh_interval_us,
            rejected: control.admission.rejected,
            instances,
            routing_imbalance: if min > 0 {
                max as f64 / min as f64
            } else if max > 0 {
                f64::INFINITY
            } else {
                1.0
            },
        }
    }
}
