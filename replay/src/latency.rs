//! Latency models: how long a batch step takes, and the non-GPU overheads
//! around it. One trait, four models: `blackbox` (trained α/β regression
//! per model), `roofline` (analytical, from the model's architecture and
//! the GPU), `trained-physics` (physics terms with global coefficients,
//! [`crate::physics`]) and `blis-physics` (BLIS's formula with its published
//! coefficients, a reference).

use crate::physics::{BlisPhysics, TrainedPhysics};
use crate::roofline::Roofline;

/// One request's share of a batch step, as a latency model sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PrefillChunk {
    /// Tokens whose KV was already computed (or found in the prefix cache)
    /// before this step: the attention context the chunk reads.
    pub computed_before: u32,
    /// Tokens computed in this step (uncached prefill tokens).
    pub new_tokens: u32,
}

/// The composition of one batch step.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BatchShape {
    /// Prefill chunks (new prompts, continuing chunked prefills, and
    /// recomputation after preemption).
    pub prefill: Vec<PrefillChunk>,
    /// Decode requests (one new token each).
    pub decode_count: u32,
    /// Sum of the decode requests' context lengths (tokens in KV).
    pub decode_context_sum: u64,
}

impl BatchShape {
    /// Uncached prefill tokens in the step.
    pub fn prefill_tokens(&self) -> u64 {
        self.prefill.iter().map(|p| u64::from(p.new_tokens)).sum()
    }

    /// Total tokens computed in the step.
    pub fn total_tokens(&self) -> u64 {
        self.prefill_tokens() + u64::from(self.decode_count)
    }

    /// Whether nothing is scheduled.
    pub fn is_empty(&self) -> bool {
        self.prefill.is_empty() && self.decode_count == 0
    }

    /// Clears for reuse.
    pub fn clear(&mut self) {
        self.prefill.clear();
        self.decode_count = 0;
        self.decode_context_sum = 0;
    }
}

/// Predicts step times and overheads, in microseconds.
///
/// Semantics follow BLIS (`../shared/design/core-engine.md`, Latency Models):
/// - a step's duration blocks the next step;
/// - the queueing delay (α0 + α1·input_tokens) delays a request's entry
///   into the wait queue but blocks nothing else;
/// - the output-token overhead (α2) is added per output token to what the
///   client sees (each inter-token gap includes it) and blocks nothing.
pub trait LatencyModel: Send + Sync + std::fmt::Debug {
    /// Duration of a step with this composition, µs (≥ 1).
    fn step_time_us(&self, batch: &BatchShape) -> f64;
    /// Delay from arrival to entering the wait queue, µs.
    fn queueing_delay_us(&self, input_tokens: u32) -> f64;
    /// Client-visible overhead per output token, µs, accumulating: token
    /// `m` (1-based) is visible `m` times this after its step (BLIS's α2).
    fn output_token_overhead_us(&self) -> f64;
    /// Client-visible delay of every token after its step, µs, not
    /// accumulating (detokenisation and the stream write).
    fn output_hop_us(&self) -> f64 {
        0.0
    }
    /// Delay added once to a request's last token, µs (BLIS's post-decode
    /// overhead).
    fn completion_overhead_us(&self) -> f64 {
        0.0
    }
    /// Short name for reports.
    fn name(&self) -> &'static str;
}

/// BLIS's blackbox model: step = β0 + β1·(uncached prefill tokens) +
/// β2·(decode tokens); queueing = α0 + α1·input tokens; α2 per output token.
#[derive(Debug, Clone, PartialEq)]
pub struct Blackbox {
    /// α0, α1, α2 (µs, µs/token, µs/token).
    pub alpha: [f64; 3],
    /// β0, β1, β2 (µs, µs/token, µs/token).
    pub beta: [f64; 3],
}

impl LatencyModel for Blackbox {
    fn step_time_us(&self, b: &BatchShape) -> f64 {
        let t = self.beta[0]
            + self.beta[1] * b.prefill_tokens() as f64
            + self.beta[2] * f64::from(b.decode_count);
        t.max(1.0)
    }

    fn queueing_delay_us(&self, input_tokens: u32) -> f64 {
        (self.alpha[0] + self.alpha[1] * f64::from(input_tokens)).max(0.0)
    }

    fn output_token_overhead_us(&self) -> f64 {
        self.alpha[2].max(0.0)
    }

    fn name(&self) -> &'static str {
        "blackbox"
    }
}

/// The latency models, as one value.
#[derive(Debug, Clone)]
pub enum Model {
    /// Trained α/β regression.
    Blackbox(Blackbox),
    /// Analytical roofline.
    Roofline(Box<Roofline>),
    /// Physics terms with global coefficients.
    TrainedPhysics(Box<TrainedPhysics>),
    /// BLIS's trained-physics formula with its published coefficients.
    BlisPhysics(Box<BlisPhysics>),
}

impl Model {
    fn inner(&self) -> &dyn LatencyModel {
        match self {
            Model::Blackbox(m) => m,
            Model::Roofline(m) => m.as_ref(),
            Model::TrainedPhysics(m) => m.as_ref(),
            Model::BlisPhysics(m) => m.as_ref(),
        }
    }
}

impl LatencyModel for Model {
    fn step_time_us(&self, b: &BatchShape) -> f64 {
        self.inner().step_time_us(b)
    }
    fn queueing_delay_us(&self, input_tokens: u32) -> f64 {
        self.inner().queueing_delay_us(input_tokens)
    }
    fn output_token_overhead_us(&self) -> f64 {
        self.inner().output_token_overhead_us()
    }
    fn output_hop_us(&self) -> f64 {
        self.inner().output_hop_us()
    }
    fn completion_overhead_us(&self) -> f64 {
        self.inner().completion_overhead_us()
    }
    fn name(&self) -> &'static str {
        self.inner().name()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blackbox_is_the_linear_formula() {
        let m = Blackbox {
            alpha: [10326.27, 0.5, 3.0],
            beta: [6472.008, 19.79721, 304.4021],
        };
        let b = BatchShape {
            prefill: vec![PrefillChunk {
                computed_before: 0,
                new_tokens: 100,
            }],
            decode_count: 10,
            decode_context_sum: 5000,
        };
        let want = 6472.008 + 19.79721 * 100.0 + 304.4021 * 10.0;
        assert!((m.step_time_us(&b) - want).abs() < 1e-9);
        assert!((m.queueing_delay_us(200) - 10426.27).abs() < 1e-9);
        assert_eq!(m.output_token_overhead_us(), 3.0);
    }
}
