//! What a latency model sees of a batch step ([`BatchShape`]) and what it
//! predicts ([`LatencyModel`]): the interface between the engine and the
//! latency models.

/// One request's share of a batch step, as a latency model sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PrefillChunk {
    /// Tokens whose KV was already computed (or found in the prefix cache)
    /// before this step: the attention context the chunk reads.
    pub computed_before: u32,
    /// Tokens computed in this step (uncached prefill tokens).
    pub new_tokens: u32,
}

impl PrefillChunk {
    /// Query–key pairs of the chunk's causal attention
    /// ([`causal_pairs`]).
    pub fn attention_pairs(&self) -> f64 {
        causal_pairs(f64::from(self.new_tokens), f64::from(self.computed_before))
    }
}

/// Query–key pairs of the causal attention of `new` tokens computed after
/// `before` tokens of context: each new token attends to the context and
/// to the new tokens up to itself, `new·before + new(new+1)/2`.
pub fn causal_pairs(new: f64, before: f64) -> f64 {
    new * before + new * (new + 1.0) / 2.0
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
