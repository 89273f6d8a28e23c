//! Prefill/decode disaggregation at the cluster level (DistServe, OSDI
//! 2024; Splitwise, ISCA 2024; `../shared/design/macro-plan.md` D.4): a
//! prefill pool computes each request's prompt and first token, its KV
//! blocks move to a decode instance chosen by a second routing step, which
//! decodes the rest.
//!
//! Conventions: TTFT is the prefill instance's first token (vLLM's
//! disaggregated prefill returns it from there); the transfer of a
//! request's prompt blocks starts when its prefill step ends and takes
//! `transfer_latency_us + blocks × block_bytes / bandwidth`; the decode
//! instance then needs room (a running slot under `max_num_seqs` and free
//! blocks for the prompt), else the request waits in its transfer queue
//! (counted) while the prefill instance keeps the blocks. Blocks have one
//! owner: the prefill side frees them when the decode side has them. A
//! one-token request completes on its prefill instance.

use blis_traces::shown::Num;
use serde::{Deserialize, Serialize};

use crate::cluster::routing::RoutingPolicy;

/// The P/D split of a policy bundle (`pd:`; `--architecture pd`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PdConfig {
    /// `--prefill-instances`: instances 0..P of the cluster.
    pub prefill_instances: u32,
    /// `--decode-instances`: instances P..P+D.
    pub decode_instances: u32,
    /// `--decode-routing`: how a decode instance is chosen (default
    /// least-loaded).
    pub decode_routing: RoutingPolicy,
    /// `--pd-transfer-latency-us`: fixed time of one transfer, µs.
    pub transfer_latency_us: f64,
    /// `--pd-transfer-bandwidth`: GB/s between a prefill and a decode
    /// instance (default 50: one 400 Gb/s NIC per GPU).
    pub transfer_bandwidth_gb_s: f64,
    /// Bytes of one KV block (None: from the model's config).
    pub block_bytes: Option<f64>,
}

impl Default for PdConfig {
    fn default() -> Self {
        Self {
            prefill_instances: 1,
            decode_instances: 1,
            decode_routing: RoutingPolicy::LeastLoaded,
            transfer_latency_us: 100.0,
            transfer_bandwidth_gb_s: 50.0,
            block_bytes: None,
        }
    }
}

impl PdConfig {
    /// Checks the values.
    ///
    /// # Errors
    /// The offending field and what it must be.
    pub fn validate(&self) -> Result<(), (String, &'static str, String)> {
        let bad = |f: &str, must, got: String| Err((format!("pd: {f}"), must, got));
        if self.prefill_instances == 0 {
            return bad("prefill_instances", "at least 1", "0".into());
        }
        if self.decode_instances == 0 {
            return bad("decode_instances", "at least 1", "0".into());
        }
        if !(self.transfer_latency_us >= 0.0
            && self.transfer_latency_us <= blis_traces::csvio::MAX_TIME_US as f64)
        {
            return bad(
                "transfer_latency_us",
                "≥ 0 and at most 2^53 µs (285 years)",
                Num(self.transfer_latency_us).to_string(),
            );
        }
        if !(self.transfer_bandwidth_gb_s.is_finite() && self.transfer_bandwidth_gb_s > 0.0) {
            return bad(
                "transfer_bandwidth_gb_s",
                "a positive number of GB/s",
                Num(self.transfer_bandwidth_gb_s).to_string(),
            );
        }
        if let Some(b) = self.block_bytes
            && !(b.is_finite() && b > 0.0)
        {
            return bad("block_bytes", "a positive number", Num(b).to_string());
        }
        Ok(())
    }
}

/// What the hand-offs did (cumulative).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct PdCounters {
    /// Requests handed from a prefill to a decode instance.
    pub transfers: u64,
    /// Transfers whose decode instance had no room when they arrived.
    pub transfer_waits: u64,
    /// Total time from prefill end to decode admission, µs.
    pub handoff_us: u64,
    /// Total transfer time, µs.
    pub transfer_us: u64,
    /// KV blocks moved.
    pub blocks: u64,
}
