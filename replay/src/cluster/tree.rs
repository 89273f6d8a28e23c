//! Decision-tree routing (`../shared/design/policy-optimization-design.md`,
//! "Type 3: Decision Trees": interpretable symbolic rules): a tree of
//! predicates over what the router sees of an instance and of the request,
//! whose leaves score the instance; the request goes to the instance with
//! the best score (ties to the lowest index), as with `weighted`.
//!
//! ```yaml
//! routing:
//!   policy: decision-tree
//!   tree:
//!     when: {signal: prefix_match, at_least: 0.5}   # half the prompt's blocks were sent there
//!     then: {score: {constant: 1, queue-depth: 1}}   # stay, unless much busier
//!     else:
//!       when: {signal: kv_usage, above: 0.9}
//!       then: {score: {constant: -1}}               # nearly full: last resort
//!       else: {score: {queue-depth: 2, kv-utilization: 1}}
//! ```
//!
//! A node is a branch (`when`, `then`, `else`) or a leaf (`score`). A
//! predicate is `{signal, above | below | at_least | at_most: number}`, or
//! `{signal, is: text}` for the text signals, or `all: [..]`, `any: [..]`,
//! `not: {..}`. A leaf's score is its `constant` (default 0) plus the
//! weighted mean of its scorers (`weighted`'s scorers, each in [0, 1], the
//! weights normalised to sum 1). Parsing is strict: an unknown field,
//! signal or scorer, a missing part, or a number that is not finite is an
//! error naming the node's path (`routing.tree.else.when.signal`).

use std::collections::BTreeMap;

use crate::cluster::error::PolicyError;
use crate::cluster::rules::{Env, Rules, SignalSet, bad, finite};
pub use crate::cluster::rules::{Predicate, TreeNode};
use crate::cluster::signals::{InstanceView, RequestSignals, Scorer};

/// What a routing tree can test, numbers then texts (the indices its
/// environment's `Env::num` and `Env::text` take).
pub const SIGNALS: SignalSet = SignalSet {
    numeric: &[
        "waiting",
        "running",
        "in_flight",
        "load",
        "kv_usage",
        "prefix_match",
        "input_tokens",
        "prompt_blocks",
    ],
    text: &["slo_class", "tenant"],
};

/// The index of `prefix_match` in [`SIGNALS`].
const PREFIX_MATCH: usize = 5;

/// A leaf: its constant, and (scorer index, normalised weight).
#[derive(Debug, Clone, PartialEq)]
struct Leaf {
    constant: f64,
    weights: Vec<(usize, f64)>,
}

/// A checked routing tree, ready to evaluate.
#[derive(Debug, Clone, PartialEq)]
pub struct Tree {
    rules: Rules<Leaf>,
    /// The scorers its leaves use, in first-use order.
    scorers: Vec<Scorer>,
}

/// What the tree sees of one instance at a decision.
#[derive(Debug, Clone, Copy)]
pub struct Seen<'a> {
    /// The router's view.
    pub view: &'a InstanceView,
    /// Share of the prompt's blocks in the router's index of it, 0..1.
    pub prefix_match: f64,
    /// Blocks of the prompt.
    pub prompt_blocks: usize,
}

struct Both<'a, 'b>(&'a Seen<'a>, &'a RequestSignals<'b>);

impl Env for Both<'_, '_> {
    fn num(&self, i: usize) -> f64 {
        let (seen, req) = (self.0, self.1);
        match i {
            0 => f64::from(seen.view.waiting),
            1 => f64::from(seen.view.running),
            2 => f64::from(seen.view.in_flight),
            3 => seen.view.load(),
            4 => seen.view.kv_usage,
            5 => seen.prefix_match,
            6 => f64::from(req.input_tokens),
            _ => seen.prompt_blocks as f64,
        }
    }

    fn text(&self, i: usize) -> &str {
        if i == 0 {
            self.1.slo_class
        } else {
            self.1.tenant
        }
    }
}

impl Tree {
    /// Checks `node` (at `path`, e.g. `routing.tree`) and compiles it.
    ///
    /// # Errors
    /// [`PolicyError::Tree`] naming the node's path and what is wrong.
    pub fn compile(node: &TreeNode, path: &str) -> Result<Self, PolicyError> {
        let mut scorers: Vec<Scorer> = Vec::new();
        let rules = Rules::compile(node, path, &SIGNALS, "score", |n, path| {
            leaf(n.score.as_ref().expect("a score leaf"), path, &mut scorers)
        })?;
        Ok(Self { rules, scorers })
    }

    /// The scorers its leaves use (each computed once per decision).
    pub fn scorers(&self) -> &[Scorer] {
        &self.scorers
    }

    /// Whether a predicate tests `prefix_match`.
    pub fn uses_prefix_match(&self) -> bool {
        self.rules.tests(PREFIX_MATCH)
    }

    /// Leaves, in the order of [`Tree::leaf_path`]'s indices.
    pub fn leaf_count(&self) -> usize {
        self.rules.leaf_count()
    }

    /// The path of leaf `i` (`routing.tree.else.then`).
    pub fn leaf_path(&self, i: usize) -> &str {
        self.rules.leaf_path(i)
    }

    /// The leaf instance `seen` reaches for request `req`.
    pub fn leaf_of(&self, seen: &Seen<'_>, req: &RequestSignals<'_>) -> usize {
        self.rules.leaf_of(&Both(seen, req))
    }

    /// The score of leaf `leaf` for an instance whose scorers gave
    /// `part(k)` (scorer `k` of [`Tree::scorers`], in [0, 1]).
    pub fn score(&self, leaf: usize, part: impl Fn(usize) -> f64) -> f64 {
        let l = self.rules.leaf(leaf);
        l.constant
            + l.weights
                .iter()
                .map(|&(k, w)| w * part(k).clamp(0.0, 1.0))
                .sum::<f64>()
    }
}

fn leaf(
    score: &BTreeMap<String, f64>,
    path: &str,
    scorers: &mut Vec<Scorer>,
) -> Result<Leaf, PolicyError> {
    if score.is_empty() {
        return Err(bad(
            path,
            "empty: give a constant and/or scorer weights".into(),
        ));
    }
    let mut constant = 0.0;
    let mut weights = Vec::new();
    for (name, &w) in score {
        let at = format!("{path}.{name}");
        let w = finite(&at, w)?;
        if name == "constant" {
            constant = w;
            continue;
        }
        let scorer = Scorer::parse(name).map_err(|e| bad(&at, e.to_string()))?;
        if w < 0.0 {
            return Err(bad(&at, format!("a weight must be ≥ 0, got {w}")));
        }
        let k = match scorers.iter().position(|s| *s == scorer) {
            Some(k) => k,
            None => {
                scorers.push(scorer);
                scorers.len() - 1
            }
        };
        weights.push((k, w));
    }
    let sum: f64 = weights.iter().map(|(_, w)| w).sum();
    if !weights.is_empty() && sum == 0.0 {
        return Err(bad(path, "scorer weights all zero".into()));
    }
    for (_, w) in &mut weights {
        *w /= sum;
    }
    Ok(Leaf { constant, weights })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> Result<Tree, PolicyError> {
        let node: TreeNode = serde_saphyr::from_str(yaml).expect("YAML of a node");
        Tree::compile(&node, "routing.tree")
    }

    fn err(yaml: &str) -> String {
        parse(yaml).unwrap_err().to_string()
    }

    #[test]
    fn a_tree_routes_by_its_predicates_and_scores() {
        let t = parse(
            "when: {signal: prefix_match, at_least: 0.5}\n\
             then: {score: {constant: 1, queue-depth: 1}}\n\
             else:\n  when: {any: [{signal: kv_usage, above: 0.9}, {signal: slo_class, is: batch}]}\n  \
             then: {score: {constant: -1}}\n  else: {score: {queue-depth: 2, kv-utilization: 2}}\n",
        )
        .unwrap();
        assert_eq!(t.leaf_count(), 3);
        assert_eq!(t.scorers(), [Scorer::QueueDepth, Scorer::KvUtilization]);
        assert!(t.uses_prefix_match());
        let v = InstanceView {
            kv_usage: 0.5,
            ..Default::default()
        };
        let seen = |m| Seen {
            view: &v,
            prefix_match: m,
            prompt_blocks: 4,
        };
        let req = RequestSignals {
            input_tokens: 64,
            slo_class: "interactive",
            tenant: "a",
        };
        assert_eq!(
            t.leaf_path(t.leaf_of(&seen(0.75), &req)),
            "routing.tree.then"
        );
        assert_eq!(
            t.leaf_path(t.leaf_of(&seen(0.0), &req)),
            "routing.tree.else.else"
        );
        let batch = RequestSignals {
            slo_class: "batch",
            ..req
        };
        assert_eq!(
            t.leaf_path(t.leaf_of(&seen(0.0), &batch)),
            "routing.tree.else.then"
        );
        // Weights normalised per leaf; the constant added.
        assert_eq!(t.score(0, |_| 0.5), 1.5);
        assert_eq!(t.score(2, |k| if k == 0 { 1.0 } else { 0.0 }), 0.5);
        assert_eq!(t.score(1, |_| 1.0), -1.0);
    }

    #[test]
    fn parse_errors_name_the_node() {
        assert!(
            err("when: {signal: kv, above: 1}\nthen: {score: {constant: 1}}\nelse: {score: {constant: 0}}")
                .contains("routing.tree.when.signal: unknown signal \"kv\"")
        );
        assert!(
            err("when: {signal: load, above: 1}\nthen: {score: {constant: 1}}")
                .contains("routing.tree: a branch needs when, then and else (else missing)")
        );
        let e = err(
            "when: {signal: load, above: 1}\nthen: {score: {constant: 1}}\nelse: {score: {queue_depth: 1}}",
        );
        assert!(
            e.contains("routing.tree.else.score.queue_depth: unknown scorer"),
            "{e}"
        );
        assert!(
            err("when: {signal: load, above: 1, below: 3}\nthen: {score: {constant: 1}}\nelse: {score: {constant: 0}}")
                .contains("routing.tree.when: load: give exactly one of")
        );
        assert!(
            err("when: {signal: tenant, above: 1}\nthen: {score: {constant: 1}}\nelse: {score: {constant: 0}}")
                .contains("tenant is text")
        );
        assert!(
            err("when: {all: []}\nthen: {score: {constant: 1}}\nelse: {score: {constant: 0}}")
                .contains("routing.tree.when.all: an empty list")
        );
        assert!(
            err("when: {not: {signal: load, above: .nan}}\nthen: {score: {constant: 1}}\nelse: {score: {constant: 0}}")
                .contains("routing.tree.when.not.above: NaN is not a finite number")
        );
        assert!(err("score: {}").contains("routing.tree.score: empty"));
        assert!(
            err("score: {queue-depth: -1}")
                .contains("routing.tree.score.queue-depth: a weight must be ≥ 0")
        );
        assert!(err("score: {constant: 1}\nwhen: {signal: load, above: 1}").contains("not both"));
        // An unknown field is the YAML parser's error.
        assert!(serde_saphyr::from_str::<TreeNode>("score: {constant: 1}\nif: 2").is_err());
    }
}
