//! Routing policies: which instance receives an admitted request
//! (`../shared/design/cluster-architecture.md`, "Routing Pipeline").
//!
//! Effective load is `waiting + running + in-flight` (the design's
//! QueueDepth + BatchSize + InFlightRequests, as llm-d and Envoy count it);
//! in-flight counts and the router's prefix index are synchronous, the
//! other signals come from snapshots refreshed at the configured interval.
//! Every tie goes to the lowest instance index.

pub use crate::cluster::prefix_index::PrefixIndex;
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use crate::cluster::code::{CallError, CodeRouter};
use crate::cluster::error::PolicyError;
pub use crate::cluster::signals::{InstanceView, RequestSignals, Scorer};
use crate::cluster::tree::{Seen, Tree, TreeNode};

/// Parses `prefix-affinity:3,queue-depth:2` into scorers and weights.
///
/// # Errors
/// A malformed item, an unknown scorer, or a weight that is not a finite
/// non-negative number; all weights zero.
pub fn parse_scorers(s: &str) -> Result<Vec<(Scorer, f64)>, PolicyError> {
    let mut out = Vec::new();
    for item in s.split(',').map(str::trim).filter(|x| !x.is_empty()) {
        let malformed = |problem| PolicyError::Malformed {
            item: item.to_string(),
            problem,
        };
        let (name, w) = item
            .split_once(':')
            .ok_or_else(|| malformed("expected NAME:WEIGHT"))?;
        let w: f64 = w
            .trim()
            .parse()
            .map_err(|_| malformed("the weight is not a number"))?;
        if !w.is_finite() || w < 0.0 {
            return Err(malformed("the weight must be finite and ≥ 0"));
        }
        out.push((Scorer::parse(name.trim())?, w));
    }
    if out.iter().all(|(_, w)| *w == 0.0) {
        return Err(PolicyError::NoPositiveWeight);
    }
    Ok(out)
}

/// The design's default weights (llm-d parity).
pub fn default_scorers() -> Vec<(Scorer, f64)> {
    vec![
        (Scorer::PrefixAffinity, 3.0),
        (Scorer::QueueDepth, 2.0),
        (Scorer::KvUtilization, 2.0),
    ]
}

/// A routing policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(tag = "policy", rename_all = "kebab-case", deny_unknown_fields)]
pub enum RoutingPolicy {
    /// Instances in turn.
    #[default]
    RoundRobin,
    /// The instance with the least effective load.
    LeastLoaded,
    /// The instance with the most effective load (pathological tests).
    AlwaysBusiest,
    /// The argmax of weighted scorer sums (weights normalised to sum 1).
    Weighted {
        /// Scorers and weights (default prefix-affinity:3, queue-depth:2,
        /// kv-utilization:2).
        #[serde(default = "default_scorer_map")]
        scorers: std::collections::BTreeMap<Scorer, f64>,
    },
    /// The argmax of the scores a decision tree gives each instance
    /// ([`crate::cluster::tree`]).
    DecisionTree {
        /// The tree.
        tree: Box<TreeNode>,
    },
    /// A program's choice ([`crate::cluster::code`]: evolved code in a
    /// sandbox).
    Code {
        /// Rhai source defining `fn route(request, instances)`.
        source: String,
        /// Operations one call may run.
        #[serde(default = "crate::cluster::code::default_max_operations")]
        max_operations: u64,
    },
}

fn default_scorer_map() -> std::collections::BTreeMap<Scorer, f64> {
    default_scorers().into_iter().collect()
}

impl RoutingPolicy {
    /// The policy's name.
    pub fn name(&self) -> &'static str {
        match self {
            Self::RoundRobin => "round-robin",
            Self::LeastLoaded => "least-loaded",
            Self::AlwaysBusiest => "always-busiest",
            Self::Weighted { .. } => "weighted",
            Self::DecisionTree { .. } => "decision-tree",
            Self::Code { .. } => "code",
        }
    }

    /// A code policy's source and budget.
    fn code_source(&self) -> Option<(&str, u64)> {
        match self {
            Self::Code {
                source,
                max_operations,
            } => Some((source, *max_operations)),
            _ => None,
        }
    }

    /// Checks a decision tree (the others need nothing here); `field`
    /// names the policy's place (`routing`, `pd.decode_routing`).
    ///
    /// # Errors
    /// [`PolicyError::Tree`] naming the node.
    pub fn validate(&self, field: &str) -> Result<(), PolicyError> {
        if let Self::DecisionTree { tree } = self {
            Tree::compile(tree, &format!("{field}.tree"))?;
        }
        if let Some((source, ops)) = self.code_source() {
            CodeRouter::compile(source, ops, field)?;
        }
        Ok(())
    }

    /// The policy as the command line writes it: its name, and a weighted
    /// policy's scorers with their weights (`weighted
    /// (prefix-affinity:3, queue-depth:2)`).
    pub fn describe(&self) -> String {
        match self {
            Self::Weighted { scorers } => format!(
                "weighted ({})",
                scorers
                    .iter()
                    .map(|(s, w)| format!("{}:{w}", s.name()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Self::DecisionTree { tree } => match Tree::compile(tree, "routing.tree") {
                Ok(t) => format!("decision-tree ({} leaves)", t.leaf_count()),
                Err(_) => "decision-tree (invalid)".into(),
            },
            Self::Code { source, .. } => format!("code ({} lines)", source.lines().count()),
            other => other.name().to_string(),
        }
    }
}

/// How many probes [`Router`] keeps the matches of (all are forgotten when
/// one more comes).
const MATCHES_KEPT: usize = 256;

/// A version no prefix index reaches ([`PrefixIndex::version`]).
const NO_VERSION: u64 = u64::MAX;

/// Each instance's last match of one probe (a prompt's shared blocks):
/// (its index's version then, the leading blocks matched).
#[derive(Debug, Clone, Default)]
struct ProbeMatches {
    probe: Vec<u64>,
    at: Vec<(u64, usize)>,
}

/// The running state of a routing policy.
#[derive(Debug, Clone)]
pub struct Router {
    policy: RoutingPolicy,
    weights: Vec<(Scorer, f64)>,
    next_rr: usize,
    index: Vec<PrefixIndex>,
    cold_last: Vec<u64>,
    cold_tick: u64,
    scores: Vec<f64>,
    part: Vec<f64>,
    /// Per instance, the leading prompt blocks its prefix index holds (as
    /// of the current decision).
    matched: Vec<usize>,
    /// Each instance's last match of a probe, by the probe's first hash.
    matches: FxHashMap<u64, ProbeMatches>,
    /// A decision tree, compiled.
    tree: Option<Tree>,
    /// Per scorer of the tree, each instance's value (scorer-major).
    tree_parts: Vec<f64>,
    /// Per instance, the tree's leaf in the last decision.
    leaves: Vec<usize>,
    /// A code policy, compiled.
    code: Option<CodeRouter>,
    /// The code policy's first failed call: later decisions are
    /// least-loaded's, and the run ends with it.
    failure: Option<CallError>,
}

impl Router {
    /// A router over `n` instances; `index_capacity` blocks per instance in
    /// the prefix index.
    ///
    /// # Panics
    /// A decision tree that does not compile: bundles are checked when read
    /// ([`RoutingPolicy::validate`]).
    pub fn new(policy: RoutingPolicy, n: usize, index_capacity: usize) -> Self {
        let tree = match &policy {
            RoutingPolicy::DecisionTree { tree } => {
                Some(Tree::compile(tree, "routing.tree").expect("a checked decision tree"))
            }
            _ => None,
        };
        let code = policy.code_source().map(|(source, ops)| {
            CodeRouter::compile(source, ops, "routing").expect("a checked program")
        });
        let weights: Vec<(Scorer, f64)> = match &policy {
            RoutingPolicy::Weighted { scorers } => {
                let sum: f64 = scorers.values().sum();
                scorers
                    .iter()
                    .filter(|(_, w)| **w > 0.0)
                    .map(|(s, w)| (*s, w / sum))
                    .collect()
            }
            // (The scorers a tree uses, for what they need; its leaves
            // weigh them.)
            RoutingPolicy::DecisionTree { .. } => tree
                .as_ref()
                .map(|t| t.scorers().iter().map(|&s| (s, 0.0)).collect())
                .unwrap_or_default(),
            _ => Vec::new(),
        };
        Self {
            policy,
            weights,
            next_rr: 0,
            index: (0..n).map(|_| PrefixIndex::new(index_capacity)).collect(),
            cold_last: vec![0; n],
            cold_tick: 0,
            scores: vec![0.0; n],
            part: vec![0.0; n],
            matched: Vec::with_capacity(n),
            matches: FxHashMap::default(),
            tree,
            tree_parts: Vec::new(),
            leaves: Vec::new(),
            code,
            failure: None,
        }
    }

    /// A code policy's first failed call, if any.
    pub fn failure(&self) -> Option<&CallError> {
        self.failure.as_ref()
    }

    /// The path of the tree's leaf instance `i` reached in the last
    /// decision (decision-tree routing only).
    pub fn tree_path(&self, i: usize) -> Option<&str> {
        let t = self.tree.as_ref()?;
        self.leaves.get(i).map(|&l| t.leaf_path(l))
    }

    /// Instance `i` is a new replica: its prefix index and its
    /// cold-request history are forgotten.
    pub fn forget(&mut self, i: usize) {
        self.index[i].clear();
        self.cold_last[i] = 0;
    }

    /// The policy.
    pub fn policy(&self) -> &RoutingPolicy {
        &self.policy
    }

    /// Round-robin's choice among `n` instances none of which is masked,
    /// without reading them (the same choice as [`Router::route_private`]
    /// makes, without its scores); `None` for any other policy.
    pub fn round_robin(&mut self, n: usize) -> Option<usize> {
        if !matches!(self.policy, RoutingPolicy::RoundRobin) || n == 0 {
            return None;
        }
        let c = self.next_rr % n;
        self.next_rr = (c + 1) % n;
        Some(c)
    }

    /// Puts the private blocks of every prefix index into its hash index
    /// (see [`PrefixIndex::index_all_private`]).
    pub fn index_all_private(&mut self) {
        for ix in &mut self.index {
            ix.index_all_private();
        }
    }

    /// Whether decisions need the request's block hashes.
    pub fn needs_hashes(&self) -> bool {
        self.learns_prefixes()
            || self.weights.iter().any(|(s, _)| {
                matches!(
                    s,
                    Scorer::PrefixAffinity | Scorer::PrecisePrefixCache | Scorer::NoHitLru
                )
            })
    }

    /// Whether the router's prefix index learns where prompts went (the
    /// prefix-affinity scorer, or a tree testing `prefix_match`).
    fn learns_prefixes(&self) -> bool {
        self.weights
            .iter()
            .any(|(s, _)| *s == Scorer::PrefixAffinity)
            || self.tree.as_ref().is_some_and(Tree::uses_prefix_match)
            || self.code.is_some()
    }

    /// Whether decisions need each instance's cached prompt blocks.
    pub fn needs_cache_query(&self) -> bool {
        self.weights
            .iter()
            .any(|(s, _)| *s == Scorer::PrecisePrefixCache)
    }

    /// The router's prefix index of instance `i`.
    pub fn prefix_index(&self, i: usize) -> &PrefixIndex {
        &self.index[i]
    }

    /// Each instance's score in the last decision: the weighted sum, −load
    /// (least-loaded), load (always-busiest), or 1 for round-robin's choice
    /// and 0 elsewhere.
    pub fn scores(&self) -> &[f64] {
        &self.scores
    }

    /// Routes a request with prompt block hashes `hashes`, given what the
    /// router sees of each instance, and returns the chosen instance;
    /// updates the router's own state (round robin position, prefix index,
    /// cold-request LRU) and [`Router::scores`].
    ///
    /// # Panics
    /// If `views` is empty.
    pub fn route(&mut self, views: &[InstanceView], hashes: &[u64]) -> usize {
        self.route_private(views, hashes, hashes.len())
    }

    /// [`Router::route`] of a prompt whose blocks from `private_from` on
    /// are private to the request (see [`PrefixIndex::insert_private`]).
    pub fn route_private(
        &mut self,
        views: &[InstanceView],
        hashes: &[u64],
        private_from: usize,
    ) -> usize {
        self.route_request(views, hashes, private_from, &RequestSignals::default())
    }

    /// [`Router::route_private`] with what a decision tree may test of the
    /// request.
    pub fn route_request(
        &mut self,
        views: &[InstanceView],
        hashes: &[u64],
        private_from: usize,
        req: &RequestSignals<'_>,
    ) -> usize {
        let n = views.len();
        assert!(n > 0, "routing needs an instance");
        let masked = views.iter().any(|v| v.unavailable);
        self.scores.clear();
        self.scores.resize(n, 0.0);
        let chosen = match &self.policy {
            RoutingPolicy::RoundRobin => {
                let mut c = self.next_rr % n;
                if masked {
                    for _ in 0..n {
                        if !views[c].unavailable {
                            break;
                        }
                        c = (c + 1) % n;
                    }
                }
                self.next_rr = (c + 1) % n;
                self.scores[c] = 1.0;
                c
            }
            RoutingPolicy::LeastLoaded => {
                for (s, v) in self.scores.iter_mut().zip(views) {
                    *s = -v.load();
                }
                mask(&mut self.scores, views, masked);
                argmax(&self.scores)
            }
            RoutingPolicy::AlwaysBusiest => {
                for (s, v) in self.scores.iter_mut().zip(views) {
                    *s = v.load();
                }
                mask(&mut self.scores, views, masked);
                argmax(&self.scores)
            }
            RoutingPolicy::Code { .. } => {
                self.match_prefixes(views, hashes, private_from, masked, true);
                let total = hashes.len();
                self.part.clear();
                self.part.extend(self.matched.iter().map(|&m| {
                    if total == 0 {
                        0.0
                    } else {
                        m as f64 / total as f64
                    }
                }));
                let choice = match (&mut self.code, &self.failure) {
                    (Some(code), None) => code.choose(views, &self.part, total, req),
                    _ => Err(CallError {
                        kind: "routing",
                        decision: 0,
                        problem: String::new(),
                    }),
                };
                match choice {
                    Ok(c) => {
                        self.scores[c] = 1.0;
                        c
                    }
                    Err(e) => {
                        if self.failure.is_none() {
                            self.failure = Some(e);
                        }
                        // After a failure: least-loaded, to finish quickly.
                        for (s, v) in self.scores.iter_mut().zip(views) {
                            *s = -v.load();
                        }
                        mask(&mut self.scores, views, masked);
                        argmax(&self.scores)
                    }
                }
            }
            RoutingPolicy::DecisionTree { .. } => {
                self.match_prefixes(views, hashes, private_from, masked, true);
                let cold = self.cold(views, hashes);
                let tree = self.tree.take().expect("a compiled tree");
                self.tree_parts.clear();
                for &scorer in tree.scorers() {
                    self.score(scorer, views, hashes, cold);
                    self.tree_parts.extend_from_slice(&self.part);
                }
                self.leaves.clear();
                let total = hashes.len();
                for (i, v) in views.iter().enumerate() {
                    let seen = Seen {
                        view: v,
                        prefix_match: if total == 0 {
                            0.0
                        } else {
                            self.matched[i] as f64 / total as f64
                        },
                        prompt_blocks: total,
                    };
                    let leaf = tree.leaf_of(&seen, req);
                    self.leaves.push(leaf);
                    let parts = &self.tree_parts;
                    self.scores[i] = tree.score(leaf, |k| parts[k * n + i]);
                }
                self.tree = Some(tree);
                mask(&mut self.scores, views, masked);
                let c = argmax(&self.scores);
                if cold && self.weights.iter().any(|(s, _)| *s == Scorer::NoHitLru) {
                    self.cold_tick += 1;
                    self.cold_last[c] = self.cold_tick;
                }
                c
            }
            RoutingPolicy::Weighted { .. } => {
                // Each instance's matched prefix, once: in full for the
                // prefix-affinity scorer, else only whether block 0 is
                // known (all the cold test needs). No index holds a
                // private block, so the match stops before them.
                let affinity = self
                    .weights
                    .iter()
                    .any(|(s, _)| *s == Scorer::PrefixAffinity);
                self.match_prefixes(views, hashes, private_from, masked, affinity);
                let cold = self.cold(views, hashes);
                for k in 0..self.weights.len() {
                    let (scorer, w) = self.weights[k];
                    self.score(scorer, views, hashes, cold);
                    for (s, p) in self.scores.iter_mut().zip(&self.part) {
                        *s += w * p.clamp(0.0, 1.0);
                    }
                }
                mask(&mut self.scores, views, masked);
                let c = argmax(&self.scores);
                if cold && self.weights.iter().any(|(s, _)| *s == Scorer::NoHitLru) {
                    self.cold_tick += 1;
                    self.cold_last[c] = self.cold_tick;
                }
                c
            }
        };
        if self.learns_prefixes() {
            self.index[chosen].insert_private(hashes, private_from);
        }
        chosen
    }

    /// Each instance's matched prefix of `hashes` (the shared part before
    /// `private_from`) into `self.matched`: in full when `full`, else only
    /// whether block 0 is known.
    fn match_prefixes(
        &mut self,
        views: &[InstanceView],
        hashes: &[u64],
        private_from: usize,
        masked: bool,
        full: bool,
    ) {
        let shared = &hashes[..private_from.min(hashes.len())];
        let probe = if full {
            shared
        } else {
            &shared[..shared.len().min(1)]
        };
        self.matched.clear();
        let available = |i: usize| !masked || !views[i].unavailable;
        if probe.len() < 2 {
            // (One probe of the hash index each: nothing to keep.)
            self.matched.extend(
                self.index
                    .iter()
                    .enumerate()
                    .map(|(i, ix)| if available(i) { ix.matched(probe) } else { 0 }),
            );
            return;
        }
        // A prompt's shared blocks recur (a tenant's system prompt), and a
        // decision changes one instance's index: each instance's last
        // match of the same probe stands while its index is unchanged.
        if self.matches.len() >= MATCHES_KEPT && !self.matches.contains_key(&probe[0]) {
            self.matches.clear();
        }
        let kept = self.matches.entry(probe[0]).or_default();
        if kept.probe != probe {
            kept.probe.clear();
            kept.probe.extend_from_slice(probe);
            kept.at.clear();
        }
        kept.at.resize(self.index.len(), (NO_VERSION, 0));
        for (i, ix) in self.index.iter().enumerate() {
            if !available(i) {
                self.matched.push(0);
                continue;
            }
            let at = &mut kept.at[i];
            if at.0 != ix.version() {
                *at = (ix.version(), ix.matched(probe));
            }
            self.matched.push(at.1);
        }
    }

    /// A cold request: no available instance's index knows its first block.
    fn cold(&self, views: &[InstanceView], hashes: &[u64]) -> bool {
        hashes.is_empty()
            || self
                .matched
                .iter()
                .zip(views)
                .all(|(&m, v)| m == 0 || v.unavailable)
    }

    fn score(&mut self, scorer: Scorer, views: &[InstanceView], hashes: &[u64], cold: bool) {
        let part = &mut self.part;
        part.clear();
        match scorer {
            Scorer::PrefixAffinity => {
                let total = hashes.len();
                part.extend(self.matched.iter().map(|&m| {
                    if total == 0 {
                        0.0
                    } else {
                        m as f64 / total as f64
                    }
                }));
            }
            Scorer::PrecisePrefixCache => {
                min_max(part, views, |v| f64::from(v.cached_blocks), false);
            }
            Scorer::NoHitLru => {
                if cold {
                    // Rank by last cold use: least recent 1, most recent 0.
                    let mut order: Vec<usize> = (0..views.len())
                        .filter(|&i| !views[i].unavailable)
                        .collect();
                    let n = order.len();
                    order.sort_by_key(|&i| (self.cold_last[i], i));
                    part.resize(views.len(), 0.0);
                    for (rank, &i) in order.iter().enumerate() {
                        part[i] = if n > 1 {
                            1.0 - rank as f64 / (n - 1) as f64
                        } else {
                            1.0
                        };
                    }
                } else {
                    part.extend(views.iter().map(|_| 0.5));
                }
            }
            Scorer::QueueDepth => queue_depth_scores(views, part),
            Scorer::KvUtilization => part.extend(views.iter().map(|v| 1.0 - v.kv_usage)),
            Scorer::LoadBalance => part.extend(views.iter().map(|v| 1.0 / (1.0 + v.load()))),
        }
    }
}

/// The queue-depth scorer: effective load min-max normalised, the least
/// loaded instance 1 and the most loaded 0 (all 1 when equal), into `out`.
pub fn queue_depth_scores(views: &[InstanceView], out: &mut Vec<f64>) {
    min_max(out, views, InstanceView::load, true);
}

/// Min-max normalisation of `value` over the available `views` into `out`
/// (`invert`: the lowest value scores 1); all equal values score 1; an
/// unavailable view scores 0.
fn min_max(
    out: &mut Vec<f64>,
    views: &[InstanceView],
    value: impl Fn(&InstanceView) -> f64,
    invert: bool,
) {
    let (lo, hi) = views.iter().filter(|v| !v.unavailable).fold(
        (f64::INFINITY, f64::NEG_INFINITY),
        |(l, h), v| {
            let x = value(v);
            (l.min(x), h.max(x))
        },
    );
    for v in views {
        out.push(if v.unavailable {
            0.0
        } else if hi > lo {
            let x = (value(v) - lo) / (hi - lo);
            if invert { 1.0 - x } else { x }
        } else {
            1.0
        });
    }
}

/// Unavailable views can never be chosen: their scores become −∞.
#[inline]
fn mask(scores: &mut [f64], views: &[InstanceView], masked: bool) {
    if masked {
        for (s, v) in scores.iter_mut().zip(views) {
            if v.unavailable {
                *s = f64::NEG_INFINITY;
            }
        }
    }
}

/// The first index of the largest value.
fn argmax(v: &[f64]) -> usize {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idle(n: usize) -> Vec<InstanceView> {
        vec![InstanceView::default(); n]
    }

    #[test]
    fn scorers_parse_with_weights_and_reject_nonsense() {
        assert_eq!(
            parse_scorers("prefix-affinity:3, queue-depth:2").unwrap(),
            vec![(Scorer::PrefixAffinity, 3.0), (Scorer::QueueDepth, 2.0)]
        );
        assert!(
            parse_scorers("prefix:3")
                .unwrap_err()
                .to_string()
                .contains("unknown scorer")
        );
        assert!(parse_scorers("queue-depth:x").is_err());
        assert!(parse_scorers("queue-depth:NaN").is_err());
        assert!(parse_scorers("queue-depth:0").is_err());
    }

    #[test]
    fn round_robin_cycles_and_least_loaded_picks_the_lowest_index_on_ties() {
        let mut r = Router::new(RoutingPolicy::RoundRobin, 3, 100);
        let c: Vec<usize> = (0..5).map(|_| r.route(&idle(3), &[])).collect();
        assert_eq!(c, [0, 1, 2, 0, 1]);
        let mut r = Router::new(RoutingPolicy::LeastLoaded, 3, 100);
        let mut v = idle(3);
        assert_eq!(r.route(&v, &[]), 0);
        v[0].in_flight = 1;
        assert_eq!(r.route(&v, &[]), 1);
        v[1].running = 1;
        v[2].waiting = 2;
        assert_eq!(r.route(&v, &[]), 0);
    }

    #[test]
    fn prefix_affinity_follows_the_blocks_it_routed() {
        let policy = RoutingPolicy::Weighted {
            scorers: [(Scorer::PrefixAffinity, 3.0), (Scorer::QueueDepth, 2.0)].into(),
        };
        let mut r = Router::new(policy, 2, 100);
        let mut v = idle(2);
        // First request: no affinity anywhere, equal load: instance 0.
        assert_eq!(r.route(&v, &[1, 2, 3]), 0);
        v[0].in_flight = 1;
        // A request sharing the prefix goes to 0 despite its load ...
        assert_eq!(r.route(&v, &[1, 2, 3, 9]), 0);
        // ... and an unrelated one to the idle instance.
        assert_eq!(r.route(&v, &[7, 8]), 1);
    }

    proptest::proptest! {
        /// The matches a decision kept from an earlier one with the same
        /// probe are what the instances' indexes answer now: through
        /// decisions that change one index each, replicas forgotten,
        /// private blocks indexed, instances unavailable, probes that
        /// share a first block and differ after it, and more probes than
        /// are kept.
        #[test]
        fn kept_prefix_matches_are_the_indexes_answers(
            n in 1usize..6,
            capacity in 1usize..60,
            reqs in proptest::collection::vec(
                // (A few tenants, and now and then one of many: more
                // probes than are kept.)
                (proptest::prop_oneof![8 => 0u64..3, 1 => 3u64..400], 0usize..12, 0u64..3, 0usize..6, 0u8..12, 0u8..8),
                1..600,
            ),
        ) {
            let policy = RoutingPolicy::Weighted {
                scorers: [(Scorer::PrefixAffinity, 3.0), (Scorer::QueueDepth, 2.0)].into(),
            };
            let mut r = Router::new(policy, n, capacity);
            let mut views = idle(n);
            for (k, (tenant, prefix, variant, own, event, load)) in reqs.into_iter().enumerate() {
                // A tenant's prompt: its first block, `prefix` more (one of
                // a few variants after the first), then private blocks.
                let mut hashes = vec![tenant * 1000];
                hashes.extend((0..prefix as u64).map(|j| tenant * 1000 + variant * 100 + j + 1));
                let private_from = hashes.len();
                hashes.extend((0..own as u64).map(|j| 1_000_000 + k as u64 * 100 + j));
                for (i, v) in views.iter_mut().enumerate() {
                    // (Some instance is available.)
                    v.unavailable = i != k % n && (load >> i) & 1 == 1;
                    v.waiting = u32::from(load) + i as u32 % 3;
                }
                let shared = &hashes[..private_from];
                let expected: Vec<usize> = (0..n)
                    .map(|i| if views[i].unavailable { 0 } else { r.prefix_index(i).matched(shared) })
                    .collect();
                let chosen = r.route_private(&views, &hashes, private_from);
                proptest::prop_assert_eq!(&r.matched, &expected);
                match event {
                    // A replica that knew the prompt, not chosen (its kept
                    // match still stands), forgotten; the prompt again.
                    0 | 1 => {
                        let known = (0..n)
                            .filter(|&i| i != chosen)
                            .max_by_key(|&i| r.matched[i]);
                        if let Some(i) = known {
                            r.forget(i);
                        }
                        if event == 1 {
                            r.index_all_private();
                        }
                        let expected: Vec<usize> = (0..n)
                            .map(|i| if views[i].unavailable { 0 } else { r.prefix_index(i).matched(shared) })
                            .collect();
                        // (Private blocks of its own: a new request.)
                        let again: Vec<u64> = shared
                            .iter()
                            .copied()
                            .chain((0..own as u64).map(|j| 1_000_050 + k as u64 * 100 + j))
                            .collect();
                        r.route_private(&views, &again, private_from);
                        proptest::prop_assert_eq!(&r.matched, &expected);
                    }
                    2 => r.index_all_private(),
                    _ => {}
                }
            }
        }
    }
}
