//! What a routing decision sees: of each instance ([`InstanceView`]), of
//! the request ([`RequestSignals`]), and the scorers that turn them into
//! scores ([`Scorer`]); shared by every routing policy (templates,
//! decision trees, evolved code).

use serde::{Deserialize, Serialize};

use crate::cluster::error::PolicyError;

/// A scorer of the `weighted` policy; each gives every instance a score in
/// [0, 1] (higher is better).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scorer {
    /// Share of the request's prompt blocks (chained hashes, so a matching
    /// prefix) in the router's per-instance LRU index of the blocks it
    /// routed there; the index learns after each decision.
    PrefixAffinity,
    /// Prompt blocks found in the instance's actual KV cache, min-max
    /// normalised across instances.
    PrecisePrefixCache,
    /// Cold requests (no instance's index has their first block) go to the
    /// instance least recently given a cold request (1 for the least
    /// recent, 0 for the most); warm requests score 0.5 everywhere.
    NoHitLru,
    /// Effective load, min-max normalised (least loaded 1, most 0).
    QueueDepth,
    /// 1 − KV-cache usage.
    KvUtilization,
    /// 1 / (1 + effective load).
    LoadBalance,
}

impl Scorer {
    /// The scorer's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::PrefixAffinity => "prefix-affinity",
            Self::PrecisePrefixCache => "precise-prefix-cache",
            Self::NoHitLru => "no-hit-lru",
            Self::QueueDepth => "queue-depth",
            Self::KvUtilization => "kv-utilization",
            Self::LoadBalance => "load-balance",
        }
    }

    /// Parses a scorer name.
    ///
    /// # Errors
    /// An unknown name, with the known ones.
    pub fn parse(s: &str) -> Result<Self, PolicyError> {
        Ok(match s {
            "prefix-affinity" => Self::PrefixAffinity,
            "precise-prefix-cache" => Self::PrecisePrefixCache,
            "no-hit-lru" => Self::NoHitLru,
            "queue-depth" => Self::QueueDepth,
            "kv-utilization" => Self::KvUtilization,
            "load-balance" => Self::LoadBalance,
            _ => {
                return Err(PolicyError::Unknown {
                    kind: "scorer",
                    name: s.to_string(),
                    known: "prefix-affinity, precise-prefix-cache, no-hit-lru, queue-depth, kv-utilization, load-balance",
                });
            }
        })
    }
}

/// What the router sees of one instance.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct InstanceView {
    /// Requests in its wait queue (snapshot).
    pub waiting: u32,
    /// Requests in its running batch (snapshot).
    pub running: u32,
    /// KV-cache usage, 0..1 (snapshot).
    pub kv_usage: f64,
    /// Requests routed there and not finished (synchronous).
    pub in_flight: u32,
    /// Leading prompt blocks of the request in its KV cache (only for
    /// `precise-prefix-cache`).
    pub cached_blocks: u32,
    /// Not a candidate (an autoscaled replica not ready): never chosen,
    /// left out of every normalisation.
    pub unavailable: bool,
}

impl InstanceView {
    /// Effective load: waiting + running + in flight.
    pub fn load(&self) -> f64 {
        f64::from(self.waiting + self.running + self.in_flight)
    }
}

/// What a decision knows of the request (the tree's request signals).
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestSignals<'a> {
    /// Prompt tokens.
    pub input_tokens: u32,
    /// Its SLO class.
    pub slo_class: &'a str,
    /// Its tenant.
    pub tenant: &'a str,
}
