//! BLIS's blackbox latency model: a linear regression per model, GPU and
//! TP degree (`../shared/design/core-engine.md`, Latency Models).

use super::shape::{BatchShape, LatencyModel};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::latency::shape::PrefillChunk;

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
