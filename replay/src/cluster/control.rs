//! The cluster's control plane: admission, then routing on the signals the
//! router sees (`../shared/design/cluster-architecture.md`). The event loop
//! that drives the instances is [`crate::sim::replay_cluster`]; one
//! instance with the default policies is exactly the single-instance
//! replay.

use blis_traces::{TraceRecord, content};

use crate::cluster::admission::{Admission, ClusterSignals};
use crate::cluster::disaggregation::{PdConfig, PdCounters};
use crate::cluster::policy::PolicyBundle;
use crate::cluster::routing::{InstanceView, Router, RoutingPolicy, queue_depth_scores};
use crate::cluster::signals::RequestSignals;
use crate::engine::instance::{Instance, Signals};

/// Admission and routing state of a cluster run.
#[derive(Debug, Clone)]
pub struct Control {
    /// The admission policy's state.
    pub admission: Admission,
    /// The router's state.
    pub router: Router,
    refresh_us: i64,
    snaps: Vec<Signals>,
    in_flight: Vec<u32>,
    views: Vec<InstanceView>,
    hashes: Vec<u64>,
    /// Prompt block hashing with shared prefixes memoized.
    hasher: content::PrefixHashMemo,
    /// Whether the router keeps private blocks out of its hash indexes.
    private_blocks: bool,
    /// Whether a replay may turn `private_blocks` on.
    private_allowed: bool,
    /// Whether the caller promised unique request ids
    /// ([`Control::set_ids_unique`]).
    ids_unique: bool,
    /// Requests routed to each instance.
    pub routed: Vec<u64>,
    /// Decision records, when traced ([`Control::trace_decisions`]).
    pub decisions: Option<Vec<DecisionRecord>>,
    /// While decisions are traced: the tree leaves of each request, by id.
    paths: rustc_hash::FxHashMap<u64, RulePaths>,
    counterfactual_k: usize,
    /// Added to every admitted request's entry into its instance's queue:
    /// the admission and routing latencies, µs.
    pub pipeline_latency_us: i64,
    /// Flow control's thresholds (queue depth per instance, KV usage).
    pub flow: Option<(f64, f64)>,
    /// Each request's priority.
    pub priority: crate::cluster::priority::Prioritizer,
    /// A tree's or program's wait-queue order.
    pub scheduling: Option<crate::cluster::scheduling::Scheduler>,
    /// Prefill/decode disaggregation: this control routes over the prefill
    /// pool (instances `0..P`), this over the decode pool.
    pub pd: Option<Box<Pd>>,
    /// P/D: the routing step its decisions are of.
    pub stage: Option<&'static str>,
    /// Autoscaling: each slot's lifecycle, the policy and the cost (with
    /// a P/D split, of the decode pool's slots).
    pub autoscale: Option<Box<crate::cluster::autoscale::Autoscaler>>,
    /// Instances the router must skip, set by its owner (the decode pool
    /// of an autoscaled P/D split: its replicas not ready).
    unavailable: Vec<bool>,
}

/// Prefill/decode disaggregation ([`crate::cluster::disaggregation`]):
/// the decode side's control and the hand-offs' state, beside the prefill
/// pool's [`Control`].
#[derive(Debug, Clone)]
pub struct Pd {
    /// The split.
    pub cfg: PdConfig,
    /// Routing over the decode pool (indices relative to it).
    pub decode: Control,
    /// Bytes of one KV block.
    pub block_bytes: f64,
    /// What the hand-offs did.
    pub counters: PdCounters,
}

impl Pd {
    /// The decode side of `cfg` over `slots` decode instances (more than
    /// `cfg.decode_instances` when autoscaled) with blocks of
    /// `block_bytes`.
    pub fn new(cfg: &PdConfig, slots: u32, block_bytes: f64) -> Self {
        let decode_bundle = PolicyBundle {
            num_instances: slots,
            routing: cfg.decode_routing.clone(),
            ..PolicyBundle::default()
        };
        let mut decode = Control::new(&decode_bundle, slots as usize);
        decode.stage = Some("decode");
        Self {
            decode,
            cfg: cfg.clone(),
            block_bytes,
            counters: PdCounters::default(),
        }
    }

    /// The first decode instance's index in the cluster.
    pub fn first_decode(&self) -> usize {
        self.cfg.prefill_instances as usize
    }

    /// The transfer time of `blocks` KV blocks, µs (rounded).
    pub fn transfer_us(&self, blocks: u32) -> i64 {
        let bytes_per_us = self.cfg.transfer_bandwidth_gb_s * 1e3;
        (self.cfg.transfer_latency_us + f64::from(blocks) * self.block_bytes / bytes_per_us).round()
            as i64
    }
}

/// What the router saw of one instance at a decision.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct SeenInstance {
    /// Waiting requests (snapshot).
    pub waiting: u32,
    /// Running requests (snapshot).
    pub running: u32,
    /// KV usage (snapshot).
    pub kv_usage: f64,
    /// Requests in flight (synchronous).
    pub in_flight: u32,
}

/// One candidate of a decision.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Candidate {
    /// Instance index.
    pub instance: usize,
    /// Its score.
    pub score: f64,
}

/// One admission and routing decision (`--trace-level decisions`).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DecisionRecord {
    /// The request.
    pub request_id: u64,
    /// When, µs since the run start.
    pub time_us: i64,
    /// Whether admission let it in.
    pub admitted: bool,
    /// The chosen instance.
    pub instance: Option<usize>,
    /// What the router saw of each instance.
    pub seen: Vec<SeenInstance>,
    /// Each instance's score: the weighted sum for `weighted`; for the
    /// other policies, the queue-depth score (least loaded 1), the yardstick
    /// their regret is measured with.
    pub scores: Vec<f64>,
    /// Best score − chosen score (≥ 0).
    pub regret: f64,
    /// The best `--counterfactual-k` candidates, best first.
    pub top_k: Vec<Candidate>,
    /// Its outcome: `ok`, `error`, `timeout` or `cancelled`.
    pub status: Option<String>,
    /// Its TTFT, ms (completed streaming requests).
    pub ttft_ms: Option<f64>,
    /// Its E2E, ms (completed requests).
    pub e2e_ms: Option<f64>,
    /// P/D: which routing step, `prefill` or `decode` (instances are the
    /// cluster's; `seen` and `scores` are of the step's pool).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stage: Option<&'static str>,
    /// Decision-tree routing: the leaf the chosen instance reached
    /// (`routing.tree.else.then`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tree_path: Option<String>,
    /// Decision-tree admission: the leaf the request reached.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admission_path: Option<String>,
    /// Decision-tree priority: the leaf the request reached.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority_path: Option<String>,
    /// Decision-tree scheduling: the leaf the request reached entering its
    /// instance.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scheduling_path: Option<String>,
}

/// The leaves a request reached in the admission, priority and scheduling
/// trees, kept while decisions are traced.
#[derive(Debug, Clone, Default)]
struct RulePaths {
    admission: Option<String>,
    priority: Option<String>,
    scheduling: Option<String>,
}

impl Control {
    /// The control plane of `bundle` over `n` instances (with a P/D split,
    /// routing over its prefill pool; its decode side's KV blocks are
    /// taken as 2 MiB until [`Control::set_kv_block_bytes`]).
    pub fn new(bundle: &PolicyBundle, n: usize) -> Self {
        let n = bundle
            .pd
            .as_ref()
            .map_or(n, |p| p.prefill_instances as usize);
        // With a P/D split the decode pool is autoscaled; its prefill pool
        // stays fixed.
        let decode_slots = |p: &PdConfig| {
            bundle
                .autoscale
                .as_ref()
                .map_or(p.decode_instances, |a| a.max_replicas)
        };
        let mut c = Self {
            autoscale: bundle.autoscale.as_ref().map(|cfg| {
                let a = match &bundle.pd {
                    Some(p) => crate::cluster::autoscale::Autoscaler::new(cfg, p.decode_instances)
                        .with_fixed_pool(p.prefill_instances as usize),
                    None => crate::cluster::autoscale::Autoscaler::new(cfg, bundle.num_instances),
                };
                Box::new(a)
            }),
            unavailable: Vec::new(),
            stage: bundle.pd.as_ref().map(|_| "prefill"),
            pd: bundle.pd.as_ref().map(|cfg| {
                Box::new(Pd::new(
                    cfg,
                    decode_slots(cfg),
                    cfg.block_bytes.unwrap_or(2_097_152.0),
                ))
            }),
            admission: Admission::new(bundle.admission.clone()),
            router: Router::new(
                bundle.routing.clone(),
                n,
                bundle.prefix_index_capacity as usize,
            ),
            refresh_us: bundle.snapshot_refresh_interval_us.max(0),
            priority: crate::cluster::priority::Prioritizer::new(bundle.priority.clone()),
            scheduling: bundle
                .scheduling
                .as_ref()
                .map(crate::cluster::scheduling::Scheduler::new),
            snaps: Vec::new(),
            in_flight: vec![0; n],
            views: vec![InstanceView::default(); n],
            hashes: Vec::new(),
            hasher: content::PrefixHashMemo::new(),
            private_blocks: false,
            private_allowed: true,
            ids_unique: false,
            routed: vec![0; n],
            decisions: None,
            paths: rustc_hash::FxHashMap::default(),
            counterfactual_k: 3,
            pipeline_latency_us: bundle.admission_latency_us.max(0)
                + bundle.routing_latency_us.max(0),
            flow: bundle
                .flow_control
                .map(|f| (f.queue_depth_threshold, f.kv_utilization_threshold)),
        };
        c.sync_decode_mask();
        c
    }

    /// P/D: the bytes of one KV block of the model served, unless the
    /// split gives its own.
    pub fn set_kv_block_bytes(&mut self, bytes: f64) {
        if let Some(pd) = &mut self.pd
            && pd.cfg.block_bytes.is_none()
        {
            pd.block_bytes = bytes;
        }
    }

    /// The instances this control routes to: the prefill pool of a P/D
    /// split, else all.
    pub fn pool(&self, n: usize) -> std::ops::Range<usize> {
        0..self.pd.as_ref().map_or(n, |p| p.first_decode())
    }

    /// Whether a replay may keep blocks private to their request out of
    /// the hash indexes of the router and the KV caches (on by default).
    /// The outputs are the same either way; off is slower, and is there
    /// to show that.
    pub fn allow_private_blocks(&mut self, on: bool) {
        self.private_allowed = on;
    }

    /// Whether a replay may keep private blocks out of the hash indexes.
    pub fn private_blocks_allowed(&self) -> bool {
        self.private_allowed
    }

    /// The caller's promise that no two requests of the next replay share
    /// a request id (a generated workload; a trace checked beforehand) and
    /// that its instances are not replayed on again: the instances then
    /// forget a request's private content when it leaves
    /// ([`crate::engine::Instance::set_forget_private`]), which gives the
    /// same outputs faster. Off by default. A repeated id despite the
    /// promise still works as without it, except that content already
    /// forgotten is not found again.
    pub fn set_ids_unique(&mut self, on: bool) {
        self.ids_unique = on;
    }

    /// Whether the caller promised unique request ids.
    pub fn ids_unique(&self) -> bool {
        self.ids_unique
    }

    /// Whether the router's prefix indexes keep blocks private to their
    /// request out of their hash indexes (see
    /// [`crate::cluster::routing::Router::route_private`]): exact only while request
    /// ids are unique, which the replay driver guarantees (it turns this
    /// on for a replay, and off when an id repeats). Either way, private
    /// blocks already held are indexed first.
    pub fn set_private_blocks(&mut self, on: bool) {
        self.router.index_all_private();
        self.private_blocks = on;
    }

    /// Whether no request was ever routed (the router's prefix indexes
    /// hold nothing).
    pub fn is_pristine(&self) -> bool {
        self.routed.iter().all(|&n| n == 0)
    }

    /// Ends a replay's private blocks without indexing them yet: that
    /// happens before the next decision or when a replay turns them on.
    pub fn pause_private_blocks(&mut self) {
        self.private_blocks = false;
    }

    /// Records every decision with the `k` best candidates.
    pub fn trace_decisions(&mut self, k: usize) {
        self.decisions = Some(Vec::new());
        self.counterfactual_k = k.max(1);
        if let Some(pd) = &mut self.pd {
            pd.decode.trace_decisions(k);
        }
    }

    /// The decisions recorded (both routing steps of a P/D split, in time
    /// order, the decode step's instances as the cluster's).
    pub fn take_decisions(&mut self) -> Option<Vec<DecisionRecord>> {
        let mut all = self.decisions.take()?;
        for r in &mut all {
            if let Some(p) = self.paths.get(&r.request_id) {
                r.admission_path.clone_from(&p.admission);
                r.priority_path.clone_from(&p.priority);
                r.scheduling_path.clone_from(&p.scheduling);
            }
        }
        if let Some(pd) = &mut self.pd {
            let base = pd.first_decode();
            for mut r in pd.decode.decisions.take().unwrap_or_default() {
                r.instance = r.instance.map(|i| i + base);
                for c in &mut r.top_k {
                    c.instance += base;
                }
                all.push(r);
            }
            all.sort_by_key(|r| r.time_us);
        }
        Some(all)
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

    /// Re-reads the instance-reported signals at `now` (a periodic
    /// refresh, or every decision): each instance as it is just before
    /// `now` ([`Instance::snapshot_at`]).
    pub fn refresh(&mut self, now: i64, insts: &[Instance]) {
        self.snaps.clear();
        self.snaps.extend(insts.iter().map(|i| i.signals_at(now)));
    }

    /// Whether routing reads the instances' KV-cache hash indexes
    /// (a precise prefix-cache scorer): the owner then brings every
    /// instance up to date ([`Instance::split_at`]) before a decision.
    pub fn reads_kv_index(&self) -> bool {
        self.in_flight.len() > 1 && self.router.needs_cache_query()
    }

    /// The cluster's saturation for flow control (≥ 1: no room): the mean
    /// over instances of requests routed there and not running, over
    /// `queue_threshold`, or the mean KV usage over `kv_threshold`,
    /// whichever is larger; read live.
    pub fn saturation(
        &self,
        now: i64,
        insts: &[Instance],
        queue_threshold: f64,
        kv_threshold: f64,
    ) -> f64 {
        let c = self.cluster_signals(now, insts);
        let n = f64::from(c.instances);
        (f64::from(c.queued) / n / queue_threshold).max(c.kv_usage / kv_threshold)
    }

    /// The admission decision alone, with the instances as they are at
    /// `now` (read only by a tree or program): `true` admits `rec`.
    pub fn admit(&mut self, now: i64, rec: &TraceRecord, insts: &[Instance]) -> bool {
        let cluster = if self.admission.policy().reads_cluster() {
            self.cluster_signals(now, insts)
        } else {
            ClusterSignals::default()
        };
        let req = request_signals(rec);
        if !self.admission.decide(now, &req, &cluster) {
            if let Some(d) = &mut self.decisions {
                d.push(DecisionRecord {
                    request_id: rec.request.request_id,
                    time_us: now,
                    admitted: false,
                    instance: None,
                    seen: Vec::new(),
                    scores: Vec::new(),
                    regret: 0.0,
                    top_k: Vec::new(),
                    status: None,
                    ttft_ms: None,
                    e2e_ms: None,
                    stage: self.stage,
                    tree_path: None,
                    admission_path: self.admission.last_path().map(str::to_string),
                    priority_path: None,
                    scheduling_path: None,
                });
            }
            return false;
        }
        if self.decisions.is_some()
            && let Some(p) = self.admission.last_path()
        {
            self.paths
                .entry(rec.request.request_id)
                .or_default()
                .admission = Some(p.to_string());
        }
        true
    }

    /// The priority (lower is more urgent) of `rec` arriving at
    /// `arrival_us`, by the bundle's priority policy.
    pub fn priority_of(&mut self, rec: &TraceRecord, arrival_us: i64) -> i64 {
        let req = request_signals(rec);
        let p = self.priority.priority(&req, arrival_us);
        if self.decisions.is_some()
            && let Some(path) = self.priority.last_path()
        {
            self.paths
                .entry(rec.request.request_id)
                .or_default()
                .priority = Some(path.to_string());
        }
        p
    }

    /// The wait-queue key of `rec`, of priority `priority`, entering an
    /// instance that shows `inst`: a scheduling tree's or program's, else
    /// the priority.
    pub fn queue_key(&mut self, rec: &TraceRecord, priority: i64, inst: &Signals) -> i64 {
        let Some(s) = &mut self.scheduling else {
            return priority;
        };
        let req = request_signals(rec);
        let key = s.key(&req, priority, inst);
        if self.decisions.is_some()
            && let Some(path) = s.last_path()
        {
            self.paths
                .entry(rec.request.request_id)
                .or_default()
                .scheduling = Some(path.to_string());
        }
        key
    }

    /// The instances taking requests as admission and flow control see
    /// them at `now`.
    pub fn cluster_signals(&self, now: i64, insts: &[Instance]) -> ClusterSignals {
        let mut c = ClusterSignals::default();
        for (i, inst) in insts.iter().enumerate().take(self.in_flight.len()) {
            if !self.routable(i) {
                continue;
            }
            let s = inst.signals_at(now);
            c.waiting += s.waiting;
            c.running += s.running;
            c.in_flight += self.in_flight[i];
            c.queued += self.in_flight[i].saturating_sub(s.running);
            c.kv_usage += s.kv_usage();
            c.instances += 1;
        }
        if c.instances > 0 {
            c.kv_usage /= f64::from(c.instances);
        }
        c
    }

    /// Routes an admitted `rec` at `now`: the chosen instance.
    pub fn route(&mut self, now: i64, rec: &TraceRecord, insts: &[Instance]) -> usize {
        let input = rec.effective_input_tokens();
        let chosen = if insts.len() == 1 {
            if self.decisions.is_some() {
                self.views[0].in_flight = self.in_flight[0];
                let s = insts[0].signals_at(now);
                self.views[0].waiting = s.waiting;
                self.views[0].running = s.running;
                self.views[0].kv_usage = s.kv_usage();
                self.record(rec, now, 0, &[1.0]);
            }
            0
        } else if let Some(c) = self
            .decisions
            .is_none()
            .then_some(())
            .filter(|()| self.autoscale.is_none() && !self.unavailable.iter().any(|&u| u))
            .and_then(|()| self.router.round_robin(insts.len()))
        {
            // Round-robin reads no instance: no signals to refresh, no
            // views to build (a cluster's routing stays O(1) per request).
            if !self.private_blocks {
                self.router.index_all_private();
            }
            self.hashes.clear();
            c
        } else {
            if self.refresh_us == 0 || self.snaps.len() != insts.len() {
                self.refresh(now, insts);
            }
            if !self.private_blocks {
                // Private blocks of an ended replay: shared from now on.
                self.router.index_all_private();
            }
            self.hashes.clear();
            let mut private_from = 0;
            if self.router.needs_hashes() {
                let cfg = insts[0].config();
                // (A prompt at the context limit or past it is refused by
                // the instance: its blocks past the limit are never hashed.)
                let hashed = input.max(1).min(cfg.context_limit());
                // The list goes to the instance with the request, which
                // keeps one hash per block of its whole life: room for them
                // all now, or the instance reallocated and copied every list.
                self.hashes
                    .reserve_exact(insts[0].life_blocks(input, rec.request.output_tokens));
                private_from = self.hasher.block_hashes(
                    &rec.request,
                    hashed,
                    cfg.block_size,
                    &mut self.hashes,
                );
            }
            if !self.private_blocks {
                private_from = self.hashes.len();
            }
            let query = self.router.needs_cache_query();
            let scaled = self.autoscale.as_deref();
            let mask = &self.unavailable;
            for (i, v) in self.views.iter_mut().enumerate() {
                let s = &self.snaps[i];
                *v = InstanceView {
                    unavailable: scaled.is_some_and(|a| !a.routable(i))
                        || mask.get(i).copied().unwrap_or(false),
                    waiting: s.waiting,
                    running: s.running,
                    kv_usage: s.kv_usage(),
                    in_flight: self.in_flight[i],
                    // (No cache holds another request's private blocks.)
                    cached_blocks: if query {
                        insts[i].kv().matched(&self.hashes[..private_from]) as u32
                    } else {
                        0
                    },
                };
            }
            let req = request_signals(rec);
            let c = self
                .router
                .route_request(&self.views, &self.hashes, private_from, &req);
            if self.decisions.is_some() {
                let scores = if matches!(
                    self.router.policy(),
                    RoutingPolicy::Weighted { .. } | RoutingPolicy::DecisionTree { .. }
                ) {
                    self.router.scores().to_vec()
                } else {
                    let mut s = Vec::with_capacity(self.views.len());
                    queue_depth_scores(&self.views, &mut s);
                    s
                };
                self.record(rec, now, c, &scores);
            }
            c
        };
        self.in_flight[chosen] += 1;
        self.routed[chosen] += 1;
        chosen
    }

    /// A code policy's first failed call (the prefill or only pool's
    /// router, then a P/D split's decode router): the run's result is that
    /// error.
    pub fn policy_failure(&self) -> Option<&crate::cluster::code::CallError> {
        self.admission
            .failure()
            .or_else(|| self.priority.failure())
            .or_else(|| self.scheduling.as_ref().and_then(|s| s.failure()))
            .or_else(|| self.router.failure())
            .or_else(|| self.autoscale.as_deref().and_then(|a| a.failure()))
            .or_else(|| self.pd.as_ref().and_then(|p| p.decode.policy_failure()))
    }

    /// The prompt's block hashes the last [`Control::route`] computed
    /// (empty when its router needs none), handed over so the instance
    /// does not hash the prompt again.
    pub fn take_hashes(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.hashes)
    }

    fn record(&mut self, rec: &TraceRecord, now: i64, chosen: usize, scores: &[f64]) {
        let mut order: Vec<usize> = (0..scores.len()).collect();
        order.sort_by(|a, b| scores[*b].total_cmp(&scores[*a]).then(a.cmp(b)));
        let best = scores[order[0]];
        let r = DecisionRecord {
            request_id: rec.request.request_id,
            time_us: now,
            admitted: true,
            instance: Some(chosen),
            seen: self
                .views
                .iter()
                .map(|v| SeenInstance {
                    waiting: v.waiting,
                    running: v.running,
                    kv_usage: v.kv_usage,
                    in_flight: v.in_flight,
                })
                .collect(),
            scores: scores.to_vec(),
            regret: (best - scores[chosen]).max(0.0),
            top_k: order
                .iter()
                .take(self.counterfactual_k)
                .map(|&i| Candidate {
                    instance: i,
                    score: scores[i],
                })
                .collect(),
            status: None,
            ttft_ms: None,
            e2e_ms: None,
            stage: self.stage,
            tree_path: self.router.tree_path(chosen).map(str::to_string),
            admission_path: None,
            priority_path: None,
            scheduling_path: None,
        };
        if let Some(d) = &mut self.decisions {
            d.push(r);
        }
    }

    /// A routed request of `tenant` left instance `i` (completed, dropped
    /// or cancelled).
    pub fn left(&mut self, i: usize, tenant: &str) {
        self.in_flight[i] = self.in_flight[i].saturating_sub(1);
        self.admission.left(tenant);
    }

    /// P/D: a request routed to prefill instance `i` moved on to the
    /// decode pool (it stays in flight for admission).
    pub fn handed_off(&mut self, i: usize) {
        self.in_flight[i] = self.in_flight[i].saturating_sub(1);
    }

    /// Requests routed to instance `i` and not finished.
    pub fn in_flight(&self, i: usize) -> u32 {
        self.in_flight[i]
    }

    /// Whether the router may send instance `i` a request (always, but
    /// for an autoscaled slot that is not ready).
    #[inline]
    pub fn routable(&self, i: usize) -> bool {
        self.autoscale.as_ref().is_none_or(|a| a.routable(i))
            && !self.unavailable.get(i).copied().unwrap_or(false)
    }

    /// Requests routed to cluster instance `i` and not finished (of either
    /// pool of a P/D split).
    pub fn in_flight_at(&self, i: usize) -> u32 {
        let (c, j) = self.routing_of(i);
        c.in_flight[j]
    }

    /// The control that routes to cluster instance `i` (a P/D split's
    /// decode side for a decode instance) and `i`'s index there.
    pub fn routing_of(&self, i: usize) -> (&Control, usize) {
        match &self.pd {
            Some(pd) if i >= pd.first_decode() => (&pd.decode, i - pd.first_decode()),
            _ => (self, i),
        }
    }

    /// Autoscaled P/D: the decode pool's router skips the decode replicas
    /// that are not ready, as the autoscaler has them now.
    pub fn sync_decode_mask(&mut self) {
        let (Some(a), Some(pd)) = (self.autoscale.as_deref(), self.pd.as_deref_mut()) else {
            return;
        };
        let base = pd.first_decode();
        let n = pd.decode.in_flight.len();
        pd.decode.unavailable.clear();
        pd.decode
            .unavailable
            .extend((0..n).map(|i| !a.routable(base + i)));
    }

    /// Autoscaling: the evaluation at `now` over the ready instances (their
    /// utilisation: the larger of KV usage and running over
    /// `max_num_seqs`; their queue: routed and not running, plus an equal
    /// share of the `gateway` requests held by flow control). Instances
    /// that start draining go into `drain`.
    pub fn autoscale_tick(
        &mut self,
        now: i64,
        insts: &[Instance],
        gateway: usize,
        drain: &mut Vec<usize>,
    ) {
        let Some(a) = self.autoscale.as_deref_mut() else {
            return;
        };
        // The autoscaled pool: the whole cluster, or a P/D split's decode
        // pool (whose queue the gateway's requests are not yet in).
        let (base, in_flight, gateway) = match &self.pd {
            Some(pd) => (pd.first_decode(), &pd.decode.in_flight, 0),
            None => (0, &self.in_flight, gateway),
        };
        let load = insts[base..]
            .iter()
            .enumerate()
            .filter(|(i, _)| a.routable(base + *i))
            .map(|(i, inst)| {
                let s = inst.signals_at(now);
                let seqs = f64::from(inst.config().max_num_seqs.max(1));
                let util = s.kv_usage().max(f64::from(s.running) / seqs).min(1.0);
                (util, f64::from(in_flight[i].saturating_sub(s.running)))
            });
        let mut load: Vec<(f64, f64)> = load.collect();
        let share = gateway as f64 / load.len().max(1) as f64;
        for l in &mut load {
            l.1 += share;
        }
        a.evaluate(now, load.into_iter(), in_flight, drain);
    }

    /// Autoscaling: cluster instance `i` is a new replica (cold): its
    /// pool's router forgets what it sent the previous one.
    pub fn forget(&mut self, i: usize) {
        match self.pd.as_deref_mut() {
            Some(pd) if i >= pd.first_decode() => {
                let base = pd.first_decode();
                pd.decode.router.forget(i - base);
            }
            _ => self.router.forget(i),
        }
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
    /// P/D: its pool, `prefill` or `decode`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool: Option<&'static str>,
    /// An autoscaled slot whose replica was never ready (never started,
    /// or cancelled while starting).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub never_ready: bool,
}

/// The P/D section of a cluster summary.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PdSummary {
    /// Prefill instances (the first ones).
    pub prefill_instances: u32,
    /// Decode instances.
    pub decode_instances: u32,
    /// The decode pool's routing policy.
    pub decode_routing: crate::cluster::routing::RoutingPolicy,
    /// What the hand-offs did.
    #[serde(flatten)]
    pub counters: PdCounters,
    /// Mean time from a prefill's end to its decode admission, ms.
    pub mean_handoff_ms: f64,
    /// Mean transfer time, ms.
    pub mean_transfer_ms: f64,
}

/// The cluster section of a replay summary.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ClusterSummary {
    /// Instances.
    pub num_instances: usize,
    /// The admission policy.
    pub admission: crate::cluster::admission::AdmissionPolicy,
    /// The routing policy.
    pub routing: crate::cluster::routing::RoutingPolicy,
    /// The priority policy (left out when it is the default, `slo-class`).
    #[serde(skip_serializing_if = "is_default_priority")]
    pub priority: crate::cluster::priority::PriorityPolicy,
    /// A scheduling tree or program, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scheduling: Option<crate::cluster::scheduling::SchedulingPolicy>,
    /// Refresh interval of the routing signals, µs (0: immediate).
    pub snapshot_refresh_interval_us: i64,
    /// Requests rejected by admission.
    pub rejected: u64,
    /// Each instance.
    pub instances: Vec<InstanceSummary>,
    /// Requests routed to the busiest instance over the mean per instance
    /// (1: even; N: one of N instances got every request). Always finite,
    /// so an instance that got nothing still gives a number.
    pub routing_imbalance: f64,
    /// Prefill/decode disaggregation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pd: Option<PdSummary>,
    /// Autoscaling.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub autoscale: Option<AutoscaleSummary>,
}

/// The autoscaling section of a cluster summary.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct AutoscaleSummary {
    /// The policy template.
    pub policy: &'static str,
    /// `min_replicas`.
    pub min_replicas: u32,
    /// `max_replicas` (the slots).
    pub max_replicas: u32,
    /// The drain policy.
    pub drain: crate::cluster::autoscale::DrainPolicy,
    /// From a scale-up decision to the replica taking requests, s.
    pub startup_s: f64,
    /// What it did.
    #[serde(flatten)]
    pub counters: crate::cluster::autoscale::AutoscaleCounters,
    /// P/D: the prefill pool's replicas, not autoscaled (the decode pool
    /// is); billed for the whole run.
    #[serde(skip_serializing_if = "is_zero")]
    pub fixed_replicas: u32,
    /// Replicas (GPU slots) billed × seconds, from time 0 to the end (a
    /// fixed pool's included).
    pub replica_seconds: f64,
    /// GPUs per replica (tensor parallel).
    pub gpus_per_replica: u32,
    /// Replica-seconds × GPUs per replica / 3600.
    pub gpu_hours: f64,
    /// Every scale action and lifecycle change, in time order.
    pub events: Vec<crate::cluster::autoscale::ScaleEvent>,
}

/// What a policy's tree or program knows of `rec`.
fn request_signals(rec: &TraceRecord) -> RequestSignals<'_> {
    RequestSignals {
        input_tokens: rec.effective_input_tokens(),
        slo_class: rec.request.slo_class.as_ref(),
        tenant: rec.request.tenant_id.as_ref(),
    }
}

fn is_default_priority(p: &crate::cluster::priority::PriorityPolicy) -> bool {
    *p == crate::cluster::priority::PriorityPolicy::default()
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl AutoscaleSummary {
    /// The section of a finished run's autoscaler.
    pub fn of(a: &crate::cluster::autoscale::Autoscaler) -> Self {
        let cfg = a.config();
        let rs = a.replica_seconds();
        Self {
            policy: cfg.policy.name(),
            min_replicas: cfg.min_replicas,
            max_replicas: cfg.max_replicas,
            drain: cfg.drain,
            startup_s: cfg.startup_us() as f64 / 1e6,
            counters: a.counters,
            fixed_replicas: a.fixed_replicas(),
            replica_seconds: rs,
            gpus_per_replica: a.gpus_per_replica,
            gpu_hours: rs * f64::from(a.gpus_per_replica) / 3600.0,
            events: a.events.clone(),
        }
    }
}

impl ClusterSummary {
    /// The summary of a finished run.
    pub fn of(bundle: &PolicyBundle, control: &Control, insts: &[Instance]) -> Self {
        let base = control.pool(insts.len()).end;
        let routed = |i: usize| {
            let (c, j) = control.routing_of(i);
            c.routed[j]
        };
        let instances: Vec<InstanceSummary> = insts
            .iter()
            .enumerate()
            .map(|(i, inst)| {
                let c = inst.counters();
                InstanceSummary {
                    index: i,
                    routed: routed(i),
                    pool: control
                        .pd
                        .as_ref()
                        .map(|_| if i < base { "prefill" } else { "decode" }),
                    completed: c.completed,
                    dropped: c.dropped,
                    preemptions: c.preemptions,
                    prefix_cache_hit_rate: c.prefix_hit_rate(),
                    generation_tokens: c.generation_tokens,
                    never_ready: control
                        .autoscale
                        .as_deref()
                        .is_some_and(|a| !a.ever_ready(i)),
                }
            })
            .collect();
        let max = instances.iter().map(|i| i.routed).max().unwrap_or(0);
        let total: u64 = instances.iter().map(|i| i.routed).sum();
        let routing_imbalance = if total > 0 {
            max as f64 * instances.len() as f64 / total as f64
        } else {
            1.0
        };
        Self {
            num_instances: insts.len(),
            admission: bundle.admission.clone(),
            routing: bundle.routing.clone(),
            priority: bundle.priority.clone(),
            scheduling: bundle.scheduling.clone(),
            snapshot_refresh_interval_us: bundle.snapshot_refresh_interval_us,
            rejected: control.admission.rejected,
            instances,
            routing_imbalance,
            autoscale: control.autoscale.as_deref().map(AutoscaleSummary::of),
            pd: control.pd.as_ref().map(|pd| {
                let c = pd.counters;
                let per = |x: u64| {
                    if c.transfers > 0 {
                        x as f64 / c.transfers as f64 / 1e3
                    } else {
                        0.0
                    }
                };
                PdSummary {
                    prefill_instances: pd.cfg.prefill_instances,
                    decode_instances: pd.cfg.decode_instances,
                    decode_routing: pd.cfg.decode_routing.clone(),
                    counters: c,
                    mean_handoff_ms: per(c.handoff_us),
                    mean_transfer_ms: per(c.transfer_us),
                }
            }),
        }
    }
}
