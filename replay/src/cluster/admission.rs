//! Admission policies: the first gate of the cluster pipeline
//! (`../shared/design/cluster-architecture.md`, "Admission Pipeline").
//! A rejected request never reaches routing; it is counted and written to
//! the predicted trace with `status: error` and the policy's name.

use crate::cluster::error::PolicyError;
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
        }
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
                    got: v.to_string(),
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
    /// Requests rejected so far.
    pub rejected: u64,
}

impl Admission {
    /// A fresh state (a full bucket).
    pub fn new(policy: AdmissionPolicy) -> Self {
        let level = match &policy {
            AdmissionPolicy::TokenBucket { capacity, .. } => *capacity,
            AdmissionPolicy::RateLimit { burst, .. } => *burst,
            _ => 0.0,
        };
        Self {
            policy,
            level,
            last_us: 0,
            tenants: FxHashMap::default(),
            rejected: 0,
        }
    }

    /// The policy.
    pub fn policy(&self) -> &AdmissionPolicy {
        &self.policy
    }

    /// Decides on a request arriving at `now_us` with `input_tokens` from
    /// `tenant`; `true` admits it.
    pub fn admit(&mut self, now_us: i64, input_tokens: u32, tenant: &str) -> bool {
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
        };
        if !ok {
            self.rejected += 1;
        }
        ok
    }

    /// An admitted request of `tenant` left the system (tenant quotas).
    pub fn left(&mut self, tenant: &str) {
        if let AdmissionPolicy::TenantQuota { .. } = self.policy
            && let Some(n) = self.tenants.get_mut(tenant)
        {
            *n = n.saturating_sub(1);
        }
    }
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
