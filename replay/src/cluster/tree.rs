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

use serde::{Deserialize, Serialize};

use crate::cluster::error::PolicyError;
use crate::cluster::signals::{InstanceView, RequestSignals, Scorer};

/// A node of a decision tree as written in a policy bundle.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct TreeNode {
    /// A branch's predicate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<Predicate>,
    /// A branch's node when the predicate holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub then: Option<Box<TreeNode>>,
    /// A branch's node when it does not.
    #[serde(default, rename = "else", skip_serializing_if = "Option::is_none")]
    pub otherwise: Option<Box<TreeNode>>,
    /// A leaf's score: `constant` and scorer weights.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score: Option<BTreeMap<String, f64>>,
}

/// A predicate as written in a policy bundle.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Predicate {
    /// The signal compared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
    /// Holds when the signal is greater.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub above: Option<f64>,
    /// Holds when the signal is smaller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub below: Option<f64>,
    /// Holds when the signal is greater or equal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_least: Option<f64>,
    /// Holds when the signal is smaller or equal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_most: Option<f64>,
    /// Holds when a text signal equals it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is: Option<String>,
    /// Holds when every one does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub all: Option<Vec<Predicate>>,
    /// Holds when one does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub any: Option<Vec<Predicate>>,
    /// Holds when it does not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not: Option<Box<Predicate>>,
}

/// A number the tree can test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Signal {
    Waiting,
    Running,
    InFlight,
    Load,
    KvUsage,
    PrefixMatch,
    InputTokens,
    PromptBlocks,
}

const NUMERIC: [(&str, Signal); 8] = [
    ("waiting", Signal::Waiting),
    ("running", Signal::Running),
    ("in_flight", Signal::InFlight),
    ("load", Signal::Load),
    ("kv_usage", Signal::KvUsage),
    ("prefix_match", Signal::PrefixMatch),
    ("input_tokens", Signal::InputTokens),
    ("prompt_blocks", Signal::PromptBlocks),
];

/// A text the tree can test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Text {
    SloClass,
    Tenant,
}

const TEXT: [(&str, Text); 2] = [("slo_class", Text::SloClass), ("tenant", Text::Tenant)];

const SIGNALS: &str = "waiting, running, in_flight, load, kv_usage, prefix_match, input_tokens, prompt_blocks; text: slo_class, tenant";

#[derive(Debug, Clone, Copy, PartialEq)]
enum Cmp {
    Above,
    Below,
    AtLeast,
    AtMost,
}

#[derive(Debug, Clone, PartialEq)]
enum Cond {
    Num(Signal, Cmp, f64),
    Text(Text, String),
    All(Vec<Cond>),
    Any(Vec<Cond>),
    Not(Box<Cond>),
}

#[derive(Debug, Clone, PartialEq)]
enum Node {
    Branch(Cond, Box<Node>, Box<Node>),
    /// Index into [`Tree::leaves`].
    Leaf(usize),
}

/// A leaf: its path, constant, and (scorer index, normalised weight).
#[derive(Debug, Clone, PartialEq)]
struct Leaf {
    path: String,
    constant: f64,
    weights: Vec<(usize, f64)>,
}

/// A checked decision tree, ready to evaluate.
#[derive(Debug, Clone, PartialEq)]
pub struct Tree {
    root: Node,
    leaves: Vec<Leaf>,
    /// The scorers its leaves use, in first-use order.
    scorers: Vec<Scorer>,
    uses_prefix_match: bool,
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

fn bad(path: &str, problem: String) -> PolicyError {
    PolicyError::Tree {
        path: path.to_string(),
        problem,
    }
}

fn finite(path: &str, v: f64) -> Result<f64, PolicyError> {
    if v.is_finite() {
        Ok(v)
    } else {
        Err(bad(path, format!("{v} is not a finite number")))
    }
}

impl Tree {
    /// Checks `node` (at `path`, e.g. `routing.tree`) and compiles it.
    ///
    /// # Errors
    /// [`PolicyError::Tree`] naming the node's path and what is wrong.
    pub fn compile(node: &TreeNode, path: &str) -> Result<Self, PolicyError> {
        let mut t = Self {
            root: Node::Leaf(0),
            leaves: Vec::new(),
            scorers: Vec::new(),
            uses_prefix_match: false,
        };
        t.root = t.node(node, path, 0)?;
        Ok(t)
    }

    fn node(&mut self, n: &TreeNode, path: &str, depth: usize) -> Result<Node, PolicyError> {
        if depth > 64 {
            return Err(bad(path, "deeper than 64 levels".into()));
        }
        match (&n.when, &n.then, &n.otherwise, &n.score) {
            (None, None, None, Some(score)) => self.leaf(score, path),
            (Some(w), Some(t), Some(e), None) => {
                let cond = self.cond(w, &format!("{path}.when"), 0)?;
                let then = self.node(t, &format!("{path}.then"), depth + 1)?;
                let otherwise = self.node(e, &format!("{path}.else"), depth + 1)?;
                Ok(Node::Branch(cond, Box::new(then), Box::new(otherwise)))
            }
            (_, _, _, Some(_)) => Err(bad(
                path,
                "a node is a leaf (score) or a branch (when, then, else), not both".into(),
            )),
            _ => {
                let missing: Vec<&str> = [
                    ("when", n.when.is_none()),
                    ("then", n.then.is_none()),
                    ("else", n.otherwise.is_none()),
                ]
                .iter()
                .filter(|(_, m)| *m)
                .map(|(k, _)| *k)
                .collect();
                Err(bad(
                    path,
                    format!(
                        "a branch needs when, then and else ({} missing), or a leaf a score",
                        missing.join(", ")
                    ),
                ))
            }
        }
    }

    fn leaf(&mut self, score: &BTreeMap<String, f64>, path: &str) -> Result<Node, PolicyError> {
        let path = format!("{path}.score");
        if score.is_empty() {
            return Err(bad(
                &path,
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
            let k = match self.scorers.iter().position(|s| *s == scorer) {
                Some(k) => k,
                None => {
                    self.scorers.push(scorer);
                    self.scorers.len() - 1
                }
            };
            weights.push((k, w));
        }
        let sum: f64 = weights.iter().map(|(_, w)| w).sum();
        if !weights.is_empty() && sum == 0.0 {
            return Err(bad(&path, "scorer weights all zero".into()));
        }
        for (_, w) in &mut weights {
            *w /= sum;
        }
        self.leaves.push(Leaf {
            path: path.trim_end_matches(".score").to_string(),
            constant,
            weights,
        });
        Ok(Node::Leaf(self.leaves.len() - 1))
    }

    fn cond(&mut self, p: &Predicate, path: &str, depth: usize) -> Result<Cond, PolicyError> {
        if depth > 64 {
            return Err(bad(path, "deeper than 64 levels".into()));
        }
        let comparators = [
            (Cmp::Above, p.above),
            (Cmp::Below, p.below),
            (Cmp::AtLeast, p.at_least),
            (Cmp::AtMost, p.at_most),
        ];
        let numbers: Vec<(Cmp, f64)> = comparators
            .iter()
            .filter_map(|(c, v)| v.map(|v| (*c, v)))
            .collect();
        let forms = usize::from(p.signal.is_some())
            + usize::from(p.all.is_some())
            + usize::from(p.any.is_some())
            + usize::from(p.not.is_some());
        if forms != 1 {
            return Err(bad(
                path,
                "a predicate is one of {signal, above|below|at_least|at_most|is}, all, any, not"
                    .into(),
            ));
        }
        if p.signal.is_none() && (!numbers.is_empty() || p.is.is_some()) {
            return Err(bad(path, "a comparison needs its signal".into()));
        }
        if let Some(name) = &p.signal {
            let at = format!("{path}.signal");
            if let Some((_, s)) = NUMERIC.iter().find(|(n, _)| n == name) {
                if p.is.is_some() {
                    return Err(bad(
                        path,
                        format!(
                            "{name} is a number: compare it with above, below, at_least or at_most"
                        ),
                    ));
                }
                let [(cmp, v)] = numbers[..] else {
                    return Err(bad(
                        path,
                        format!("{name}: give exactly one of above, below, at_least, at_most"),
                    ));
                };
                let field = match cmp {
                    Cmp::Above => "above",
                    Cmp::Below => "below",
                    Cmp::AtLeast => "at_least",
                    Cmp::AtMost => "at_most",
                };
                let v = finite(&format!("{path}.{field}"), v)?;
                self.uses_prefix_match |= *s == Signal::PrefixMatch;
                return Ok(Cond::Num(*s, cmp, v));
            }
            if let Some((_, t)) = TEXT.iter().find(|(n, _)| n == name) {
                let (Some(is), true) = (&p.is, numbers.is_empty()) else {
                    return Err(bad(path, format!("{name} is text: compare it with is")));
                };
                return Ok(Cond::Text(*t, is.clone()));
            }
            return Err(bad(&at, format!("unknown signal {name:?} ({SIGNALS})")));
        }
        let list = |ps: &Vec<Predicate>, key: &str, this: &mut Self| {
            if ps.is_empty() {
                return Err(bad(&format!("{path}.{key}"), "an empty list".into()));
            }
            ps.iter()
                .enumerate()
                .map(|(i, q)| this.cond(q, &format!("{path}.{key}[{i}]"), depth + 1))
                .collect::<Result<Vec<_>, _>>()
        };
        if let Some(ps) = &p.all {
            return Ok(Cond::All(list(ps, "all", self)?));
        }
        if let Some(ps) = &p.any {
            return Ok(Cond::Any(list(ps, "any", self)?));
        }
        let q = p.not.as_deref().expect("one form");
        Ok(Cond::Not(Box::new(self.cond(
            q,
            &format!("{path}.not"),
            depth + 1,
        )?)))
    }

    /// The scorers its leaves use (each computed once per decision).
    pub fn scorers(&self) -> &[Scorer] {
        &self.scorers
    }

    /// Whether a predicate tests `prefix_match`.
    pub fn uses_prefix_match(&self) -> bool {
        self.uses_prefix_match
    }

    /// Leaves, in the order of [`Tree::leaf_path`]'s indices.
    pub fn leaf_count(&self) -> usize {
        self.leaves.len()
    }

    /// The path of leaf `i` (`routing.tree.else.then`).
    pub fn leaf_path(&self, i: usize) -> &str {
        &self.leaves[i].path
    }

    /// The leaf instance `seen` reaches for request `req`.
    pub fn leaf_of(&self, seen: &Seen<'_>, req: &RequestSignals<'_>) -> usize {
        let mut n = &self.root;
        loop {
            match n {
                Node::Leaf(i) => return *i,
                Node::Branch(c, t, e) => n = if holds(c, seen, req) { t } else { e },
            }
        }
    }

    /// The score of leaf `leaf` for an instance whose scorers gave
    /// `part(k)` (scorer `k` of [`Tree::scorers`], in [0, 1]).
    pub fn score(&self, leaf: usize, part: impl Fn(usize) -> f64) -> f64 {
        let l = &self.leaves[leaf];
        l.constant
            + l.weights
                .iter()
                .map(|&(k, w)| w * part(k).clamp(0.0, 1.0))
                .sum::<f64>()
    }
}

fn holds(c: &Cond, seen: &Seen<'_>, req: &RequestSignals<'_>) -> bool {
    match c {
        Cond::Num(s, cmp, v) => {
            let x = match s {
                Signal::Waiting => f64::from(seen.view.waiting),
                Signal::Running => f64::from(seen.view.running),
                Signal::InFlight => f64::from(seen.view.in_flight),
                Signal::Load => seen.view.load(),
                Signal::KvUsage => seen.view.kv_usage,
                Signal::PrefixMatch => seen.prefix_match,
                Signal::InputTokens => f64::from(req.input_tokens),
                Signal::PromptBlocks => seen.prompt_blocks as f64,
            };
            match cmp {
                Cmp::Above => x > *v,
                Cmp::Below => x < *v,
                Cmp::AtLeast => x >= *v,
                Cmp::AtMost => x <= *v,
            }
        }
        Cond::Text(t, want) => match t {
            Text::SloClass => req.slo_class == want,
            Text::Tenant => req.tenant == want,
        },
        Cond::All(cs) => cs.iter().all(|c| holds(c, seen, req)),
        Cond::Any(cs) => cs.iter().any(|c| holds(c, seen, req)),
        Cond::Not(c) => !holds(c, seen, req),
    }
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
