//! Fault injection: each fault is a rate (drawn per request from a seeded
//! stream) or forced for one request by a header (`X-Return-Error: 503`,
//! `X-Fault: drop|stall|malformed|missing-usage`). At most one fault hits a
//! request; every injected fault is counted in `blis_mock_faults_total{kind}`.

use std::sync::Mutex;

use axum::http::HeaderMap;
use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};

/// Configured fault rates (each a probability per request).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct FaultConfig {
    /// HTTP 500 before any output.
    pub http_500: f64,
    /// HTTP 503 before any output.
    pub http_503: f64,
    /// HTTP 429 with `Retry-After`.
    pub http_429: f64,
    /// `Retry-After` of a 429, seconds.
    pub retry_after_s: u32,
    /// Connection dropped half-way through the response.
    pub drop: f64,
    /// A stall of `stall_ms` half-way through the response.
    pub stall: f64,
    /// Stall length, ms.
    pub stall_ms: u64,
    /// A chunk (or the body) of malformed JSON.
    pub malformed: f64,
    /// The response without `usage`.
    pub missing_usage: f64,
}

impl FaultConfig {
    /// Checks the rates are probabilities summing to at most 1.
    ///
    /// # Errors
    /// A rate outside [0, 1] or a sum above 1.
    pub fn validate(&self) -> Result<(), String> {
        let rates = [
            ("--fault-500-rate", self.http_500),
            ("--fault-503-rate", self.http_503),
            ("--fault-429-rate", self.http_429),
            ("--fault-drop-rate", self.drop),
            ("--fault-stall-rate", self.stall),
            ("--fault-malformed-rate", self.malformed),
            ("--fault-missing-usage-rate", self.missing_usage),
        ];
        for (name, r) in rates {
            if !(0.0..=1.0).contains(&r) {
                return Err(format!(
                    "{name} must be within [0, 1], got {}",
                    blis_traces::shown::Num(r)
                ));
            }
        }
        let sum: f64 = rates.iter().map(|(_, r)| r).sum();
        if sum > 1.0 + 1e-9 {
            return Err(format!("fault rates sum to {sum}, more than 1"));
        }
        Ok(())
    }
}

/// The fault chosen for a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Answer with this HTTP status and no body from the engine.
    Http(u16),
    /// Drop the connection mid-response.
    Drop,
    /// Stall mid-response.
    Stall,
    /// Send malformed JSON.
    Malformed,
    /// Omit `usage`.
    MissingUsage,
}

impl Fault {
    /// The `kind` label of the fault counter.
    pub fn kind(self) -> &'static str {
        match self {
            Fault::Http(500) => "http_500",
            Fault::Http(503) => "http_503",
            Fault::Http(429) => "http_429",
            Fault::Http(_) => "forced",
            Fault::Drop => "drop",
            Fault::Stall => "stall",
            Fault::Malformed => "malformed",
            Fault::MissingUsage => "missing_usage",
        }
    }
}

/// Draws faults.
#[derive(Debug)]
pub struct Faults {
    cfg: FaultConfig,
    rng: Mutex<ChaCha8Rng>,
}

impl Faults {
    /// Faults at `cfg`'s rates from a stream seeded with `seed`.
    pub fn new(cfg: FaultConfig, seed: u64) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        rng.set_stream(0xFA17);
        Self {
            cfg,
            rng: Mutex::new(rng),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &FaultConfig {
        &self.cfg
    }

    /// The fault for a request with `headers`, if any.
    pub fn decide(&self, headers: &HeaderMap) -> Option<Fault> {
        if let Some(code) = headers
            .get("x-return-error")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u16>().ok())
            .filter(|c| (400..600).contains(c))
        {
            return Some(Fault::Http(code));
        }
        if let Some(f) = headers.get("x-fault").and_then(|v| v.to_str().ok()) {
            match f.trim() {
                "drop" => return Some(Fault::Drop),
                "stall" => return Some(Fault::Stall),
                "malformed" => return Some(Fault::Malformed),
                "missing-usage" | "missing_usage" => return Some(Fault::MissingUsage),
                _ => {}
            }
        }
        let c = &self.cfg;
        let any =
            c.http_500 + c.http_503 + c.http_429 + c.drop + c.stall + c.malformed + c.missing_usage;
        if any <= 0.0 {
            return None;
        }
        let u: f64 = self
            .rng
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .random();
        let mut acc = 0.0;
        for (rate, fault) in [
            (c.http_500, Fault::Http(500)),
            (c.http_503, Fault::Http(503)),
            (c.http_429, Fault::Http(429)),
            (c.drop, Fault::Drop),
            (c.stall, Fault::Stall),
            (c.malformed, Fault::Malformed),
            (c.missing_usage, Fault::MissingUsage),
        ] {
            acc += rate;
            if u < acc {
                return Some(fault);
            }
        }
        None
    }
}
