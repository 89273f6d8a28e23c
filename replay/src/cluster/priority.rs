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

use serde::{Deserialize, Serialize};

use crate::cluster::error::PolicyError;
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
                    got: v.to_string(),
                });
            }
        }
        if self.age_weight < 0.0 {
            return Err(PolicyError::OutOfRange {
                field: "priority: age_weight".into(),
                must: "≥ 0",
                got: self.age_weight.to_string(),
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

    /// The priority (lower is more urgent) of a request of `slo_class`
    /// arriving at `arrival_us`. For the age-weighted policies it is
    /// `−score` in millionths, less the common `age_weight × now` term.
    pub fn priority(&self, slo_class: &str, arrival_us: i64) -> i64 {
        match self {
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
