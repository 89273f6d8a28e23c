//! The `step-table` latency model: one server's own measured step time for
//! each number of requests decoding in the step, plus a cost per prompt
//! token computed, per query–key pair of the prompts' causal attention, and
//! per token of context a decoding request attends.
//!
//! ```text
//! step_us = decode_us[D] + prompt_token_us · (prefill tokens)
//!         + prompt_pair_us · Σ (n·c + n(n+1)/2) + context_token_us · (decode context)
//! ```
//!
//! with `D` the requests decoding in the step (past the table's end, its
//! last slope continues), each prefill chunk of `n` tokens after `c`
//! computed, and the decode context the decoding requests' tokens so far.
//! The two attention costs are separate because they differ by an order of
//! magnitude: a decoding request reads its whole KV cache for one query,
//! while a prompt's queries are batched into matrix products (charged at
//! the decode rate, a 725-token prompt on llama.cpp's CPU server was
//! predicted 2× its measured TTFT). A row without `prompt_pair` charges
//! the pairs at `context_token`, as rows written before it did. The host overheads are those of
//! trained-physics: a queueing delay per request (and per input token) and
//! an output hop per token, neither blocking the engine.
//!
//! It exists for engines whose step time is not linear in the batch, which
//! a per-token slope cannot follow: llama.cpp's `llama-server` on a CPU
//! (a batch of 1, 2, 3, 4 decoding slots took 1.7, 3.2, 4.0, 4.1 ms per
//! step on this project's 2-core machine: ggml switches to batched matrix
//! kernels as the batch grows). `blis-calibrate fit --latency-model
//! step-table` fits it from a trace of that server: the steps are
//! recovered from the streamed tokens' times (each step sends one token
//! per decoding request; tokens sent together end one step), and their
//! durations regressed on these terms.

use std::collections::BTreeMap;

use crate::latency::{BatchShape, LatencyModel, PrefillChunk};

/// A server's measured step-time table.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StepTable {
    /// Step time with `i` requests decoding (index 0: prefill only), µs.
    pub decode_us: Vec<f64>,
    /// Per prompt token computed in the step, µs.
    pub prompt_token_us: f64,
    /// Per token of context attended by the step's decoding requests, µs.
    pub context_token_us: f64,
    /// Per query–key pair of the step's prefill chunks' causal attention,
    /// µs.
    pub prompt_pair_us: f64,
    /// Queueing delay (µs), per input token (µs), output hop (µs).
    pub alpha: [f64; 3],
}

/// Name of the table entry for `i` decoding requests in a coefficients row.
pub fn decode_key(i: usize) -> String {
    format!("decode_{i}")
}

impl StepTable {
    /// The model of a coefficients row's `terms` (`decode_0`, `decode_1`,
    /// …, `prompt_token`, `context_token`, `prompt_pair`) and `alpha`; a
    /// row without `prompt_pair` charges the pairs at `context_token`.
    ///
    /// # Errors
    /// No `decode_0`, a gap in the table, or a value that is not a finite
    /// number ≥ 0 (the key named).
    pub fn from_terms(terms: &BTreeMap<String, f64>, alpha: [f64; 3]) -> Result<Self, String> {
        let mut decode_us = Vec::new();
        while let Some(v) = terms.get(&decode_key(decode_us.len())) {
            decode_us.push(*v);
        }
        if decode_us.is_empty() {
            return Err("a step-table row needs terms decode_0, decode_1, …".into());
        }
        for k in terms.keys() {
            let known = k == "prompt_token"
                || k == "context_token"
                || k == "prompt_pair"
                || (k.starts_with("decode_") && (0..decode_us.len()).any(|i| *k == decode_key(i)));
            if !known {
                return Err(format!(
                    "step-table term `{k}` is not decode_0…decode_{} (without gaps), prompt_token, context_token or prompt_pair",
                    decode_us.len() - 1
                ));
            }
        }
        let alphas = ["alpha[0]", "alpha[1]", "alpha[2]"].map(String::from);
        for (k, v) in terms.iter().chain(alphas.iter().zip(&alpha)) {
            if !(v.is_finite() && *v >= 0.0) {
                return Err(format!(
                    "step-table `{k}` must be a number ≥ 0, got {}",
                    blis_traces::shown::Num(*v)
                ));
            }
        }
        let context_token_us = terms.get("context_token").copied().unwrap_or(0.0);
        Ok(Self {
            decode_us,
            prompt_token_us: terms.get("prompt_token").copied().unwrap_or(0.0),
            context_token_us,
            prompt_pair_us: terms
                .get("prompt_pair")
                .copied()
                .unwrap_or(context_token_us),
            alpha,
        })
    }

    /// The row's `terms`.
    pub fn terms(&self) -> BTreeMap<String, f64> {
        let mut t: BTreeMap<String, f64> = self
            .decode_us
            .iter()
            .enumerate()
            .map(|(i, v)| (decode_key(i), *v))
            .collect();
        t.insert("prompt_token".into(), self.prompt_token_us);
        t.insert("context_token".into(), self.context_token_us);
        t.insert("prompt_pair".into(), self.prompt_pair_us);
        t
    }

    /// The step time with `d` requests decoding and nothing else, µs: the
    /// table's entry, or past its end its last slope continued.
    pub fn decode_part(&self, d: u32) -> f64 {
        let n = self.decode_us.len();
        let d = d as usize;
        if d < n {
            return self.decode_us[d];
        }
        let last = self.decode_us[n - 1];
        let slope = if n >= 2 {
            (last - self.decode_us[n - 2]).max(0.0)
        } else {
            0.0
        };
        last + slope * (d - (n - 1)) as f64
    }
}

impl LatencyModel for StepTable {
    fn step_time_us(&self, b: &BatchShape) -> f64 {
        if b.is_empty() || self.decode_us.is_empty() {
            return 1.0;
        }
        let pairs: f64 = b.prefill.iter().map(PrefillChunk::attention_pairs).sum();
        let t = self.decode_part(b.decode_count)
            + self.prompt_token_us * b.prefill_tokens() as f64
            + self.prompt_pair_us * pairs
            + self.context_token_us * b.decode_context_sum as f64;
        t.max(1.0)
    }

    fn queueing_delay_us(&self, input_tokens: u32) -> f64 {
        (self.alpha[0] + self.alpha[1] * f64::from(input_tokens)).max(0.0)
    }

    fn output_token_overhead_us(&self) -> f64 {
        0.0
    }

    fn output_hop_us(&self) -> f64 {
        self.alpha[2].max(0.0)
    }

    fn name(&self) -> &'static str {
        "step-table"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::latency::PrefillChunk;

    fn table() -> StepTable {
        StepTable {
            decode_us: vec![500.0, 1700.0, 3200.0, 4000.0, 4100.0],
            prompt_token_us: 0.4,
            context_token_us: 0.001,
            prompt_pair_us: 0.0002,
            alpha: [100.0, 0.0, 50.0],
        }
    }

    #[test]
    fn a_step_is_its_table_entry_plus_prompt_and_context_costs() {
        let t = table();
        let b = BatchShape {
            prefill: vec![],
            decode_count: 3,
            decode_context_sum: 3000,
        };
        assert!((t.step_time_us(&b) - (4000.0 + 3.0)).abs() < 1e-9);
        // 100 prompt tokens after 20 cached: 100 × 0.4 µs, their causal
        // attention's 20·100 + 100·101/2 pairs at the pair rate, and the
        // decoding request's 500 tokens of context at the context rate.
        let b = BatchShape {
            prefill: vec![PrefillChunk {
                computed_before: 20,
                new_tokens: 100,
            }],
            decode_count: 1,
            decode_context_sum: 500,
        };
        let pairs = 2000.0 + 5050.0;
        assert!(
            (t.step_time_us(&b) - (1700.0 + 40.0 + 0.0002 * pairs + 0.001 * 500.0)).abs() < 1e-9
        );
        // Past the table: its last slope (100 µs per request) continues.
        assert_eq!(t.decode_part(6), 4300.0);
        assert_eq!(t.step_time_us(&BatchShape::default()), 1.0);
    }

    #[test]
    fn rows_round_trip_and_bad_rows_name_the_term() {
        let t = table();
        let back = StepTable::from_terms(&t.terms(), t.alpha).unwrap();
        assert_eq!(back, t);
        let mut terms = t.terms();
        terms.remove("decode_2");
        let e = StepTable::from_terms(&terms, t.alpha).unwrap_err();
        assert!(e.contains("decode_3"), "{e}");
        let mut terms = t.terms();
        terms.insert("decode_1".into(), f64::NAN);
        assert!(
            StepTable::from_terms(&terms, t.alpha)
                .unwrap_err()
                .contains("decode_1")
        );
        assert!(
            StepTable::from_terms(&BTreeMap::new(), [0.0; 3])
                .unwrap_err()
                .contains("decode_0")
        );
        // A row written before the pair rate existed charges the pairs at
        // the context rate, as it was fitted.
        let mut terms = t.terms();
        terms.remove("prompt_pair");
        let old = StepTable::from_terms(&terms, t.alpha).unwrap();
        assert_eq!(old.prompt_pair_us, t.context_token_us);
    }
}
