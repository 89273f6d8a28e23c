//! Decision trees for every policy kind (`../shared/design/policy-optimization-design.md`,
//! "Type 3: Decision Trees": interpretable symbolic rules): the node and
//! predicate syntax of a policy bundle, strictly compiled against the
//! signals a kind of policy sees, with leaves of that kind.
//!
//! A node is a branch (`when`, `then`, `else`) or a leaf. A predicate is
//! `{signal, above | below | at_least | at_most: number}`, or
//! `{signal, is: text}` for the text signals, or `all: [..]`, `any: [..]`,
//! `not: {..}`. The leaf of each kind:
//!
//! | policy | leaf | meaning |
//! |---|---|---|
//! | routing | `score: {constant: c, <scorer>: w, ..}` | the instance's score ([`crate::cluster::tree`]) |
//! | admission | `admit: true` or `admit: false` | admit or reject the request |
//! | priority | `priority: {constant: c, <signal>: w, ..}` | the request's priority, lower is more urgent |
//! | scheduling | `key: {constant: c, <signal>: w, ..}` | the wait-queue key, lower goes first |
//! | autoscaling | `scale: n` | add `n` replicas (`n` > 0), remove `-n` (`n` < 0), or hold (0) |
//!
//! A linear leaf (`priority`, `key`) is its constant plus each named
//! numeric signal times its weight. Parsing is strict: an unknown field,
//! signal or term, a missing part, another kind's leaf, or a number that
//! is not finite is an error naming the node's path
//! (`admission.tree.else.when.signal`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::cluster::error::PolicyError;

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
    /// A routing leaf: `constant` and scorer weights.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score: Option<BTreeMap<String, f64>>,
    /// An admission leaf: admit or reject.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admit: Option<bool>,
    /// A priority leaf: `constant` and signal weights (lower is more
    /// urgent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<BTreeMap<String, f64>>,
    /// A scheduling leaf: `constant` and signal weights (lower goes first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<BTreeMap<String, f64>>,
    /// An autoscaling leaf: replicas to add (> 0) or remove (< 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale: Option<i64>,
}

impl TreeNode {
    /// The leaf fields this node sets.
    fn leaf_fields(&self) -> Vec<&'static str> {
        [
            ("score", self.score.is_some()),
            ("admit", self.admit.is_some()),
            ("priority", self.priority.is_some()),
            ("key", self.key.is_some()),
            ("scale", self.scale.is_some()),
        ]
        .iter()
        .filter(|(_, set)| *set)
        .map(|(k, _)| *k)
        .collect()
    }
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

/// The signals a kind of policy can test: numbers and texts, by name; a
/// compiled predicate refers to them by their index here.
#[derive(Debug, Clone, Copy)]
pub struct SignalSet {
    /// The numeric signals' names.
    pub numeric: &'static [&'static str],
    /// The text signals' names.
    pub text: &'static [&'static str],
}

impl SignalSet {
    fn known(&self) -> String {
        format!(
            "{}; text: {}",
            self.numeric.join(", "),
            self.text.join(", ")
        )
    }
}

/// The values of a [`SignalSet`]'s signals at one decision.
pub trait Env {
    /// Numeric signal `i` of the set.
    fn num(&self, i: usize) -> f64;
    /// Text signal `i` of the set.
    fn text(&self, i: usize) -> &str;
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Cmp {
    Above,
    Below,
    AtLeast,
    AtMost,
}

#[derive(Debug, Clone, PartialEq)]
enum Cond {
    Num(usize, Cmp, f64),
    Text(usize, String),
    All(Vec<Cond>),
    Any(Vec<Cond>),
    Not(Box<Cond>),
}

#[derive(Debug, Clone, PartialEq)]
enum Node {
    Branch(Cond, Box<Node>, Box<Node>),
    /// Index into [`Rules::leaves`].
    Leaf(usize),
}

/// A checked decision tree whose leaves are `L`, ready to evaluate.
#[derive(Debug, Clone, PartialEq)]
pub struct Rules<L> {
    root: Node,
    leaves: Vec<(String, L)>,
    /// Per numeric signal, whether a predicate tests it.
    tested: Vec<bool>,
}

/// An error at `path`.
pub fn bad(path: &str, problem: String) -> PolicyError {
    PolicyError::Tree {
        path: path.to_string(),
        problem,
    }
}

/// `v` when finite, else an error at `path`.
///
/// # Errors
/// [`PolicyError::Tree`] when `v` is NaN or infinite.
pub fn finite(path: &str, v: f64) -> Result<f64, PolicyError> {
    if v.is_finite() {
        Ok(v)
    } else {
        Err(bad(path, format!("{v} is not a finite number")))
    }
}

impl<L> Rules<L> {
    /// Checks `node` (at `path`, e.g. `admission.tree`) against `signals`
    /// and compiles it; `leaf_field` names the kind's leaf (`admit`), and
    /// `leaf` compiles a leaf node (at its path) into an `L`.
    ///
    /// # Errors
    /// [`PolicyError::Tree`] naming the node's path and what is wrong.
    pub fn compile(
        node: &TreeNode,
        path: &str,
        signals: &SignalSet,
        leaf_field: &'static str,
        mut leaf: impl FnMut(&TreeNode, &str) -> Result<L, PolicyError>,
    ) -> Result<Self, PolicyError> {
        let mut c = Compiler {
            signals,
            leaf_field,
            leaves: Vec::new(),
            tested: vec![false; signals.numeric.len()],
            leaf: &mut leaf,
        };
        let root = c.node(node, path, 0)?;
        Ok(Self {
            root,
            leaves: c.leaves,
            tested: c.tested,
        })
    }

    /// Whether a predicate tests numeric signal `i`.
    pub fn tests(&self, i: usize) -> bool {
        self.tested[i]
    }

    /// Leaves, in the order of [`Rules::leaf`]'s indices.
    pub fn leaf_count(&self) -> usize {
        self.leaves.len()
    }

    /// The path of leaf `i` (`admission.tree.else.then`).
    pub fn leaf_path(&self, i: usize) -> &str {
        &self.leaves[i].0
    }

    /// Leaf `i`.
    pub fn leaf(&self, i: usize) -> &L {
        &self.leaves[i].1
    }

    /// The index of the leaf `env` reaches.
    pub fn leaf_of(&self, env: &impl Env) -> usize {
        let mut n = &self.root;
        loop {
            match n {
                Node::Leaf(i) => return *i,
                Node::Branch(c, t, e) => n = if holds(c, env) { t } else { e },
            }
        }
    }
}

type LeafFn<'a, L> = dyn FnMut(&TreeNode, &str) -> Result<L, PolicyError> + 'a;

struct Compiler<'a, L> {
    signals: &'a SignalSet,
    leaf_field: &'static str,
    leaves: Vec<(String, L)>,
    tested: Vec<bool>,
    leaf: &'a mut LeafFn<'a, L>,
}

impl<L> Compiler<'_, L> {
    fn node(&mut self, n: &TreeNode, path: &str, depth: usize) -> Result<Node, PolicyError> {
        if depth > 64 {
            return Err(bad(path, "deeper than 64 levels".into()));
        }
        let fields = n.leaf_fields();
        let field = self.leaf_field;
        if let Some(other) = fields.iter().find(|f| **f != field) {
            return Err(bad(
                &format!("{path}.{other}"),
                format!("not a leaf of this policy (its leaves are {field})"),
            ));
        }
        match (&n.when, &n.then, &n.otherwise, fields.is_empty()) {
            (None, None, None, false) => {
                let l = (self.leaf)(n, &format!("{path}.{field}"))?;
                self.leaves.push((path.to_string(), l));
                Ok(Node::Leaf(self.leaves.len() - 1))
            }
            (Some(w), Some(t), Some(e), true) => {
                let cond = self.cond(w, &format!("{path}.when"), 0)?;
                let then = self.node(t, &format!("{path}.then"), depth + 1)?;
                let otherwise = self.node(e, &format!("{path}.else"), depth + 1)?;
                Ok(Node::Branch(cond, Box::new(then), Box::new(otherwise)))
            }
            (_, _, _, false) => Err(bad(
                path,
                format!("a node is a leaf ({field}) or a branch (when, then, else), not both"),
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
                        "a branch needs when, then and else ({} missing), or a leaf a {field}",
                        missing.join(", ")
                    ),
                ))
            }
        }
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
            if let Some(s) = self.signals.numeric.iter().position(|n| n == name) {
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
                self.tested[s] = true;
                return Ok(Cond::Num(s, cmp, v));
            }
            if let Some(t) = self.signals.text.iter().position(|n| n == name) {
                let (Some(is), true) = (&p.is, numbers.is_empty()) else {
                    return Err(bad(path, format!("{name} is text: compare it with is")));
                };
                return Ok(Cond::Text(t, is.clone()));
            }
            return Err(bad(
                &at,
                format!("unknown signal {name:?} ({})", self.signals.known()),
            ));
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
}

fn holds(c: &Cond, env: &impl Env) -> bool {
    match c {
        Cond::Num(s, cmp, v) => {
            let x = env.num(*s);
            match cmp {
                Cmp::Above => x > *v,
                Cmp::Below => x < *v,
                Cmp::AtLeast => x >= *v,
                Cmp::AtMost => x <= *v,
            }
        }
        Cond::Text(t, want) => env.text(*t) == want,
        Cond::All(cs) => cs.iter().all(|c| holds(c, env)),
        Cond::Any(cs) => cs.iter().any(|c| holds(c, env)),
        Cond::Not(c) => !holds(c, env),
    }
}

/// A linear leaf: a constant plus numeric signals times weights.
#[derive(Debug, Clone, PartialEq)]
pub struct Linear {
    constant: f64,
    terms: Vec<(usize, f64)>,
}

impl Linear {
    /// Compiles `map` (at `path`): `constant` and weights of numeric
    /// signals of `signals`.
    ///
    /// # Errors
    /// An empty map, an unknown term or a number that is not finite, at
    /// its path.
    pub fn compile(
        map: &BTreeMap<String, f64>,
        path: &str,
        signals: &SignalSet,
    ) -> Result<Self, PolicyError> {
        if map.is_empty() {
            return Err(bad(
                path,
                "empty: give a constant and/or signal weights".into(),
            ));
        }
        let mut l = Self {
            constant: 0.0,
            terms: Vec::new(),
        };
        for (name, &w) in map {
            let at = format!("{path}.{name}");
            let w = finite(&at, w)?;
            if name == "constant" {
                l.constant = w;
            } else if let Some(i) = signals.numeric.iter().position(|n| n == name) {
                l.terms.push((i, w));
            } else {
                return Err(bad(
                    &at,
                    format!(
                        "unknown term {name:?} (constant, {})",
                        signals.numeric.join(", ")
                    ),
                ));
            }
        }
        Ok(l)
    }

    /// Its value in `env`.
    pub fn value(&self, env: &impl Env) -> f64 {
        self.constant + self.terms.iter().map(|&(i, w)| w * env.num(i)).sum::<f64>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SET: SignalSet = SignalSet {
        numeric: &["waiting", "input_tokens"],
        text: &["slo_class"],
    };

    struct E(f64, f64, &'static str);
    impl Env for E {
        fn num(&self, i: usize) -> f64 {
            [self.0, self.1][i]
        }
        fn text(&self, _: usize) -> &str {
            self.2
        }
    }

    fn admission(yaml: &str) -> Result<Rules<bool>, PolicyError> {
        let node: TreeNode = serde_saphyr::from_str(yaml).expect("YAML of a node");
        Rules::compile(&node, "admission.tree", &SET, "admit", |n, _| {
            Ok(n.admit.expect("an admit leaf"))
        })
    }

    #[test]
    fn a_tree_of_another_kind_reaches_its_leaves() {
        let t = admission(
            "when: {any: [{signal: waiting, above: 10}, {signal: slo_class, is: batch}]}\n\
             then: {admit: false}\nelse: {admit: true}\n",
        )
        .unwrap();
        assert!(t.tests(0) && !t.tests(1));
        let at = |e: E| *t.leaf(t.leaf_of(&e));
        assert!(at(E(3.0, 1.0, "interactive")));
        assert!(!at(E(11.0, 1.0, "interactive")));
        assert!(!at(E(0.0, 1.0, "batch")));
        assert_eq!(t.leaf_path(0), "admission.tree.then");
    }

    #[test]
    fn another_kinds_leaf_and_bad_linear_terms_are_named() {
        let e = admission("score: {constant: 1}").unwrap_err().to_string();
        assert!(
            e.contains("admission.tree.score: not a leaf of this policy (its leaves are admit)"),
            "{e}"
        );
        let e =
            admission("when: {signal: queue, above: 1}\nthen: {admit: true}\nelse: {admit: false}")
                .unwrap_err()
                .to_string();
        assert!(
            e.contains("admission.tree.when.signal: unknown signal \"queue\" (waiting, input_tokens; text: slo_class)"),
            "{e}"
        );
        let mut m = BTreeMap::new();
        m.insert("outputs".to_string(), 1.0);
        let e = Linear::compile(&m, "priority.tree.priority", &SET)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("priority.tree.priority.outputs: unknown term"),
            "{e}"
        );
        m.clear();
        m.insert("input_tokens".to_string(), f64::INFINITY);
        assert!(Linear::compile(&m, "p", &SET).is_err());
        m.insert("input_tokens".to_string(), 0.5);
        m.insert("constant".to_string(), 2.0);
        let l = Linear::compile(&m, "p", &SET).unwrap();
        assert_eq!(l.value(&E(0.0, 10.0, "")), 7.0);
    }
}
