//! The roofline latency model: a step is one forward pass over every token
//! scheduled in it; its time is the larger of compute time (FLOPs over peak
//! × MFU, prefill and decode at their own MFU) and memory time (weights read
//! once, KV cache read and written, over bandwidth), plus tensor-parallel
//! all-reduce time and a fixed per-step overhead.
//!
//! This follows the single-forward-pass, single-crossover roofline of
//! inference-sim (`sim/latency/roofline.go`, itself after llm-optimizer and
//! Sarathi-Serve's view of vLLM V1 steps), with these differences, all
//! physical: gated MLPs (SwiGLU) count three matrices; the logits GEMM is
//! counted per scheduled request; MoE layers read the weights of the experts
//! the step's tokens are expected to touch, N·(1 − (1 − k/N)^tokens); MLA
//! models cache `kv_lora_rank + qk_rope_head_dim` values per token and layer.
//! The MFU factors are inference-sim's fitted values from
//! `hardware_config.json`; `blis-calibrate fit` refits them.

use crate::latency::arch::{Hardware, ModelArch};
use crate::latency::{BatchShape, LatencyModel};

/// Roofline parameters that a fit may change.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RooflineParams {
    /// Prefill model-FLOPs utilisation.
    pub mfu_prefill: f64,
    /// Decode model-FLOPs utilisation.
    pub mfu_decode: f64,
    /// Fixed time added to every step, µs (scheduler, launch, sampling).
    pub overhead_us: f64,
    /// Latency of one tensor-parallel all-reduce, µs (two per layer).
    pub allreduce_latency_us: f64,
    /// α0, α1, α2 as in the blackbox model (queueing and per-output-token
    /// overheads).
    pub alpha: [f64; 3],
}

/// The roofline model of one model on one GPU type at a TP degree.
#[derive(Debug, Clone)]
pub struct Roofline {
    /// The model.
    pub arch: ModelArch,
    /// The GPU.
    pub hw: Hardware,
    /// Tensor-parallel degree.
    pub tp: u32,
    /// Tunable parameters.
    pub params: RooflineParams,
    // Precomputed per-token and per-step constants.
    linear_flops_per_token: f64,
    logits_flops: f64,
    attn_core_flops_per_ctx_token: f64,
    static_weight_bytes: f64,
    moe_layer_expert_bytes: f64,
    moe_layers: f64,
    peak_flops: f64,
}

impl Roofline {
    /// Builds the model with the hardware's MFU factors, no overheads.
    pub fn new(arch: ModelArch, hw: Hardware, tp: u32) -> Self {
        let params = RooflineParams {
            mfu_prefill: hw.mfu_prefill,
            mfu_decode: hw.mfu_decode,
            overhead_us: 0.0,
            allreduce_latency_us: 0.0,
            alpha: [0.0; 3],
        };
        Self::with_params(arch, hw, tp, params)
    }

    /// Builds the model with explicit parameters.
    pub fn with_params(arch: ModelArch, hw: Hardware, tp: u32, params: RooflineParams) -> Self {
        let a = &arch;
        let d = f64::from(a.hidden);
        let layers = f64::from(a.layers);
        let dense_layers = f64::from(a.dense_layers);
        let moe_layers = layers - dense_layers;
        let expert_params = a.expert_params();
        let active_moe_params = expert_params * f64::from(a.experts_per_token)
            + a.shared_expert_params()
            + d * f64::from(a.experts);
        let linear_params_per_token = a.attention_params_per_layer() * layers
            + a.dense_mlp_params() * dense_layers
            + active_moe_params * moe_layers;
        let peak = if a.mlp_fp8_compute {
            hw.peak_tflops(1.0)
        } else {
            hw.tflops_peak
        } * 1e12;
        Self {
            linear_flops_per_token: 2.0 * linear_params_per_token,
            logits_flops: 2.0 * d * f64::from(a.vocab),
            attn_core_flops_per_ctx_token: a.attention_flops_per_context_token(),
            static_weight_bytes: a.static_weight_bytes(),
            moe_layer_expert_bytes: expert_params * a.weight_bytes,
            moe_layers,
            peak_flops: peak,
            arch,
            hw,
            tp: tp.max(1),
            params,
        }
    }

    /// Compute, memory and communication time of a step, seconds.
    pub fn components(&self, b: &BatchShape) -> (f64, f64, f64) {
        self.components_at(&self.fixed_parts(b), b.decode_context_sum as f64)
    }

    /// What a step's components do not owe to its decoding requests'
    /// context: what a run of decode steps shares.
    fn fixed_parts(&self, b: &BatchShape) -> FixedParts {
        let tp = f64::from(self.tp);
        let p = &self.params;
        // Prefill: linear layers per token, attention over each token's
        // causal context, logits for each scheduled request.
        let mut prefill_flops = 0.0;
        let mut kv_read_tokens = 0.0;
        for c in &b.prefill {
            let n = f64::from(c.new_tokens);
            let before = f64::from(c.computed_before);
            let ctx_sum = c.attention_pairs();
            prefill_flops += self.linear_flops_per_token * n
                + self.attn_core_flops_per_ctx_token * ctx_sum
                + self.logits_flops;
            kv_read_tokens += before;
        }
        let dn = f64::from(b.decode_count);
        let tokens = b.total_tokens() as f64;
        let a = &self.arch;
        let experts_touched = if a.experts > 0 && tokens > 0.0 {
            let n = f64::from(a.experts);
            let k = f64::from(a.experts_per_token);
            n * (1.0 - (1.0 - k / n).powf(tokens))
        } else {
            0.0
        };
        let weight_bytes = self.static_weight_bytes
            + self.moe_layer_expert_bytes * experts_touched * self.moe_layers;
        let act_bytes = tokens * f64::from(a.hidden) * f64::from(a.layers) * 2.0 * 2.0;
        let comm = if self.tp > 1 {
            let msg = tokens * f64::from(a.hidden) * 2.0;
            let per = 2.0 * (tp - 1.0) / tp * msg / (self.hw.interconnect_gbs * 1e9)
                + p.allreduce_latency_us * 1e-6;
            2.0 * f64::from(a.layers) * per
        } else {
            0.0
        };
        FixedParts {
            prefill_compute: prefill_flops / p.mfu_prefill.max(1e-6),
            decode_linear_flops: (self.linear_flops_per_token + self.logits_flops) * dn,
            decode_count: dn,
            prefill_kv_tokens: kv_read_tokens,
            tokens,
            weight_bytes,
            act_bytes,
            kv_bytes_per_token: a.kv_bytes_per_token(),
            comm,
        }
    }

    /// The components of a step of `f` whose decoding requests' contexts
    /// sum to `ctx` tokens.
    fn components_at(&self, f: &FixedParts, ctx: f64) -> (f64, f64, f64) {
        let tp = f64::from(self.tp);
        let decode_ctx = ctx + f.decode_count;
        let decode_flops = f.decode_linear_flops + self.attn_core_flops_per_ctx_token * decode_ctx;
        let kv_read_tokens = f.prefill_kv_tokens + ctx;
        let compute = (f.prefill_compute + decode_flops / self.params.mfu_decode.max(1e-6))
            / (self.peak_flops * tp);
        let kv_bytes = (kv_read_tokens + f.tokens) * f.kv_bytes_per_token;
        let memory = (f.weight_bytes + kv_bytes + f.act_bytes) / tp / (self.hw.bw_peak_tbs * 1e12);
        (compute, memory, f.comm)
    }

    /// The step time of the (non-empty) composition `b` prepared for any
    /// sum of its decoding requests' contexts: a run of decode steps, each
    /// a token longer per request, evaluated with
    /// [`Roofline::decode_step_us`].
    pub fn decode_steps(&self, b: &BatchShape) -> RooflineSteps {
        RooflineSteps(self.fixed_parts(b))
    }

    /// The step time, µs (≥ 1), of `steps`' composition when its decoding
    /// requests' contexts sum to `ctx` tokens: bit for bit the
    /// `step_time_us` of that batch.
    pub fn decode_step_us(&self, steps: &RooflineSteps, ctx: u64) -> f64 {
        let (compute, memory, comm) = self.components_at(&steps.0, ctx as f64);
        ((compute.max(memory) + comm) * 1e6 + self.params.overhead_us).max(1.0)
    }
}

/// A step's parts that do not grow with its decode context
/// ([`Roofline::fixed_parts`]).
#[derive(Debug, Clone, Copy)]
struct FixedParts {
    /// Prefill FLOPs over the prefill MFU.
    prefill_compute: f64,
    decode_linear_flops: f64,
    decode_count: f64,
    prefill_kv_tokens: f64,
    tokens: f64,
    weight_bytes: f64,
    act_bytes: f64,
    kv_bytes_per_token: f64,
    /// Seconds.
    comm: f64,
}

/// The step time of one batch composition as its decoding requests'
/// context sum grows ([`Roofline::decode_steps`]): the same arithmetic, in
/// the same order, as `step_time_us`, the parts that do not grow computed
/// once.
#[derive(Debug, Clone, Copy)]
pub struct RooflineSteps(FixedParts);

impl LatencyModel for Roofline {
    fn step_time_us(&self, b: &BatchShape) -> f64 {
        if b.is_empty() {
            return 1.0;
        }
        self.decode_step_us(&self.decode_steps(b), b.decode_context_sum)
    }

    fn queueing_delay_us(&self, input_tokens: u32) -> f64 {
        let a = &self.params.alpha;
        (a[0] + a[1] * f64::from(input_tokens)).max(0.0)
    }

    fn output_token_overhead_us(&self) -> f64 {
        self.params.alpha[2].max(0.0)
    }

    fn name(&self) -> &'static str {
        "roofline"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::latency::PrefillChunk;
    use crate::latency::hf_config::find_model;

    fn llama7b() -> Roofline {
        Roofline::new(
            find_model(Some("llama-2-7b-hf"), None).unwrap(),
            Hardware::bundled("H100").unwrap(),
            1,
        )
    }

    #[test]
    fn small_decode_batches_are_memory_bound_at_weights_over_bandwidth() {
        let r = llama7b();
        let b = BatchShape {
            prefill: vec![],
            decode_count: 1,
            decode_context_sum: 100,
        };
        let (compute, memory, _) = r.components(&b);
        assert!(memory > compute);
        // ~6.7e9 params × 2 bytes / 3.35e12 B/s ≈ 4.0 ms.
        let t = r.step_time_us(&b);
        assert!((3800.0..4300.0).contains(&t), "{t}");
    }

    #[test]
    fn long_prefills_are_compute_bound_and_grow_superlinearly() {
        let r = llama7b();
        let p = |n| BatchShape {
            prefill: vec![PrefillChunk {
                computed_before: 0,
                new_tokens: n,
            }],
            decode_count: 0,
            decode_context_sum: 0,
        };
        let (c, m, _) = r.components(&p(2048));
        assert!(c > m);
        let t1 = r.step_time_us(&p(1024));
        let t2 = r.step_time_us(&p(2048));
        assert!(t2 > 2.0 * t1 * 0.99, "{t1} {t2}");
        // 2 × 6.7e9 × 2048 FLOPs / (989.5e12 × 0.45) ≈ 62 ms plus attention.
        assert!((60_000.0..75_000.0).contains(&t2), "{t2}");
    }

    #[test]
    fn tensor_parallelism_divides_work_and_adds_communication() {
        let arch = find_model(Some("llama-2-70b-hf"), None).unwrap();
        let hw = Hardware::bundled("H100").unwrap();
        let b = BatchShape {
            prefill: vec![],
            decode_count: 32,
            decode_context_sum: 32 * 800,
        };
        let t1 = Roofline::new(arch.clone(), hw.clone(), 1).step_time_us(&b);
        let t4 = Roofline::new(arch, hw, 4).step_time_us(&b);
        assert!(t4 < t1 / 3.0 && t4 > t1 / 4.0, "{t1} {t4}");
    }
}
