//! The `trained-physics` latency model: a step's time is a non-negative
//! combination of physics terms of the batch, with one set of coefficients
//! for every model, GPU and tensor-parallel degree.
//!
//! # The formula
//!
//! For a step with prefill chunks `(c_j computed before, n_j new tokens)`,
//! `D` decoding requests whose contexts sum to `C` tokens, on a model with
//! `L` layers, hidden size `d`, `H` query heads of width `d_h`, vocabulary
//! `V`, at tensor-parallel degree `t` on a GPU with peak FLOP rate `F`,
//! memory bandwidth `B` and interconnect bandwidth `N`:
//!
//! ```text
//! step_us = Σ_k β_k · x_k                    (every β_k ≥ 0)
//!
//! x_step              = 1
//! x_layer             = L                       per-layer kernel launches
//! x_allreduce         = 2·L if t > 1 else 0     all-reduces (their latency)
//! x_request           = D + #prefill chunks     per-request work
//! x_weight            = W(tokens) / (t·B)       weights read once per step
//! x_kv                = (Σc_j + C + tokens)·K / (t·B)   KV read and written
//! x_prefill_compute   = [Σ_j 2·P·n_j + 2·d·V] / (t·F)   prefill GEMMs, logits
//! x_decode_compute    = D·(2·P + 2·d·V) / (t·F)          decode GEMMs, logits
//! x_attention_compute = a·(C + D) / (t·F)      decode attention
//! x_prefill_attention = a·Σ_j (n_j·c_j + n_j(n_j+1)/2) / (t·F)   prompts' causal attention
//! x_expert_compute    = M·R(tokens)·2·P_1 / (t·F)   routed experts' GEMMs
//! x_allreduce_bytes   = 2·L·tokens·d·2 bytes·2(t−1)/t / N
//! x_moe_layer         = MoE layers              routing, permutation
//! x_expert_decode     = D·2·P_e / (t·F)         MoE decode beyond the kernels
//! ```
//!
//! Decode and prefill attention have their own coefficients: a decoding
//! request's attention reads its whole KV cache for one query (memory
//! bound, fitted per query head, ~46× its FLOPs at peak), while a prompt's
//! queries run as matrix products near the compute peak. The prefill
//! coefficient is fixed at 2.2, not fitted (prompts of the training runs
//! are too short to inform it): Hopper's fused causal attention (cuDNN,
//! FlashAttention-3 class, as vLLM uses on H100) ran at 400–630 TFLOP/s
//! for 2,048–8,192-token prompts and 256–334 at 1,024 on an H100
//! (`docs/trained-physics.md`); with one coefficient for both, an
//! 8,192-token prompt of Llama-3.1-8B was predicted at 0.98 s.
//!
//! All terms except the counts are in µs at the hardware's peak; the KV
//! term's coefficient is fixed at 1 by the fit (KV bytes read at peak
//! bandwidth), the attention kernel's excess being per query head (the
//! attention term), which is what carries across head layouts
//! (`docs/trained-physics.md`). FLOPs are counted at the 16-bit peak, an
//! 8-bit GEMM (FP8 weights and activations) for its share of the 8-bit
//! peak; weight bytes per part at its own precision (a compressed-tensors
//! checkpoint may keep attention in 16 bits). `P` is the
//! parameters a token multiplies outside the routed experts (attention, the
//! dense MLPs, shared experts, the router), `P_e` those of the `k` routed
//! experts a token goes through, `P_1` those of one routed expert, `M` the
//! MoE layers, and `R` the rows vLLM's fused-MoE kernel computes in one
//! MoE layer: the step's `tokens·k` expert assignments sorted by expert,
//! each expert's rows padded to the kernel's `BLOCK_SIZE_M` (`b`, the power
//! of two in [16, 128] at or above the rows per expert, as vLLM's tuned
//! configurations choose), `R = max(E_t·b, tokens·k + E_t·b/2)` with `E_t`
//! the experts touched (below). The expert term's coefficient is fixed at
//! 1, not fitted: on an H100, vLLM's fused-MoE Triton kernel with a tuned
//! configuration took the touched experts' weights at peak bandwidth (the
//! weight term) plus these padded FLOPs at peak, within −14%…+5% from 16 to
//! 2,048 tokens, for Mixtral-8x7B at TP2 and Qwen3-30B-A3B at TP1
//! (`docs/trained-physics.md`). The MoE runs decode slower than those
//! kernels explain; `x_expert_decode`, the routed-expert FLOPs of the
//! decoding tokens, carries that fitted excess, so that it does not
//! reach prefill (where a coefficient fitted on the same runs charged a
//! 2,048-token Mixtral step 2.0× the measured kernels). `a` the
//! attention FLOPs per token of context (`4·H·d_h·L`; for MLA vLLM's
//! absorbed form, [`ModelArch::attention_flops_per_context_token`]), `K`
//! the KV bytes per token (GQA and MLA aware), and `W` the weight bytes:
//! every dense weight plus, for MoE layers, the experts the step's tokens
//! are expected to touch, `E·(1 − (1 − k/E)^tokens)`.
//!
//! Sources: the basis follows BLIS's trained-physics model
//! (`sim/latency/trained_physics_model.go`, and its blog post "How BLIS
//! learns latency"): roofline terms corrected by learned factors, plus
//! per-layer, per-request and per-step overheads; it differs in splitting
//! the tensor-parallel all-reduce into its latency (a count) and its bytes
//! over the interconnect, in counting KV traffic of prefill context reads,
//! and in charging MoE routing per MoE layer of any MoE model. The FLOP and
//! byte counts are the roofline literature's (Williams et al., "Roofline",
//! CACM 2009; Kaplan et al.'s 2·params FLOPs per token; the attention
//! FLOPs of FlashAttention, Dao et al. 2022). The step structure (one
//! forward pass over every scheduled token) is vLLM V1's
//! (`vllm/v1/core/sched/scheduler.py`).
//!
//! The per-request overheads around the engine are `queue_us` (arrival to
//! the scheduler: HTTP, tokenisation and the hop to the engine core),
//! `queue_per_input_token_us` and `output_hop_us` (a produced token to the
//! client: detokenisation and the stream write, the same for every token).
//!
//! [`BlisPhysics`] is BLIS's own formula with its published global
//! coefficients, kept as a reference.

use std::collections::BTreeMap;

use crate::latency::arch::{Hardware, ModelArch};
use crate::latency::{BatchShape, LatencyModel};

/// Number of terms of the trained-physics basis.
pub const TERMS: usize = 14;

/// Names of the terms, in order (the keys of a coefficients row).
pub const TERM_NAMES: [&str; TERMS] = [
    "step",
    "layer",
    "allreduce",
    "request",
    "weight",
    "kv",
    "prefill_compute",
    "decode_compute",
    "attention_compute",
    "expert_compute",
    "allreduce_bytes",
    "moe_layer",
    "expert_decode",
    "prefill_attention",
];

/// What each term's coefficient means, with its unit.
pub const TERM_MEANINGS: [&str; TERMS] = [
    "fixed time per step (µs)",
    "time per layer per step (µs/layer)",
    "latency of one tensor-parallel all-reduce (µs)",
    "time per scheduled request per step (µs/request)",
    "correction of weight-read time at peak bandwidth (×)",
    "correction of KV-cache traffic time at peak bandwidth (×)",
    "correction of prefill GEMM time at peak FLOPs (× = 1/MFU)",
    "correction of decode GEMM time at peak FLOPs (× = 1/MFU)",
    "decode attention time per FLOP at peak (×, per query head)",
    "routed-expert GEMMs on vLLM's padded rows at peak FLOPs (×, fixed at 1)",
    "correction of all-reduce bytes over the interconnect (×)",
    "time per MoE layer per step (µs/layer)",
    "routed-expert decode cost beyond the kernels (× expert FLOPs at peak)",
    "prompts' causal attention FLOPs at peak (×, fixed at the measured kernel's 1/MFU)",
];

/// The physics terms of one model on one GPU at one TP degree: the
/// per-step basis `x_k` of the module docs.
#[derive(Debug, Clone, PartialEq)]
pub struct PhysicsBasis {
    layers: f64,
    tp: f64,
    hidden: f64,
    moe_layers: f64,
    /// FLOPs per token of the linear layers but the routed experts (2·P),
    /// at the 16-bit peak (8-bit GEMMs count for their share of it).
    linear_flops: f64,
    /// FLOPs per token of its routed experts in all MoE layers (2·P_e·M),
    /// the same way.
    expert_flops: f64,
    /// FLOPs of one padded row of one routed expert (2·P_1), the same way.
    expert_row_flops: f64,
    /// FLOPs of the logits of one sequence (2·d·V).
    logits_flops: f64,
    /// Attention FLOPs per token of context (4·H·d_h·L).
    attn_flops: f64,
    /// Weight bytes read every step (all but the routed experts).
    static_weight_bytes: f64,
    /// Bytes of one routed expert of one layer.
    expert_bytes: f64,
    experts: f64,
    experts_per_token: f64,
    kv_bytes_per_token: f64,
    /// FLOP/µs at peak.
    flops_per_us: f64,
    /// Bytes/µs at peak.
    bytes_per_us: f64,
    /// Interconnect bytes/µs.
    link_bytes_per_us: f64,
}

impl PhysicsBasis {
    /// The basis of `arch` on `hw` at TP `tp`.
    pub fn new(arch: &ModelArch, hw: &Hardware, tp: u32) -> Self {
        let a = arch;
        let d = f64::from(a.hidden);
        let layers = f64::from(a.layers);
        let moe_layers = f64::from(a.moe_layers());
        let expert = a.expert_params();
        let routed = expert * f64::from(a.experts_per_token);
        // FLOPs are counted at the 16-bit peak; a part whose GEMMs run at
        // the 8-bit peak counts for its share of it.
        let peak = hw.tflops_peak;
        let at = |fp8: bool| {
            if fp8 && hw.tflops_fp8 > 0.0 {
                peak / hw.tflops_fp8
            } else {
                1.0
            }
        };
        let (attn_scale, mlp_scale) = (at(a.attn_fp8_compute), at(a.mlp_fp8_compute));
        // Every parameter a token multiplies but the routed experts' (the
        // LM head's are the logits, counted per sequence).
        let attn_params =
            a.attention_params_per_layer() * layers + d * f64::from(a.experts) * moe_layers;
        let mlp_params = a.dense_mlp_params() * f64::from(a.dense_layers)
            + a.shared_expert_params() * moe_layers;
        Self {
            layers,
            tp: f64::from(tp.max(1)),
            hidden: d,
            moe_layers: if a.experts > 0 { moe_layers } else { 0.0 },
            linear_flops: 2.0 * (attn_params * attn_scale + mlp_params * mlp_scale),
            expert_flops: if a.experts > 0 {
                2.0 * routed * moe_layers * mlp_scale
            } else {
                0.0
            },
            expert_row_flops: if a.experts > 0 {
                2.0 * expert * mlp_scale
            } else {
                0.0
            },
            logits_flops: 2.0 * d * f64::from(a.vocab),
            attn_flops: a.attention_flops_per_context_token(),
            static_weight_bytes: a.static_weight_bytes(),
            expert_bytes: expert * a.weight_bytes,
            experts: f64::from(a.experts),
            experts_per_token: f64::from(a.experts_per_token),
            kv_bytes_per_token: a.kv_bytes_per_token(),
            flops_per_us: peak * 1e6,
            bytes_per_us: hw.bw_peak_tbs * 1e6,
            link_bytes_per_us: hw.interconnect_gbs * 1e3,
        }
    }

    /// Rows of one MoE layer's grouped GEMM for a step of `tokens` tokens
    /// touching `touched` experts: each expert's assignments padded to the
    /// kernel's block of `b` rows (module docs).
    fn padded_expert_rows(&self, tokens: f64, touched: f64) -> f64 {
        if self.experts <= 0.0 || tokens <= 0.0 {
            return 0.0;
        }
        let assignments = tokens * self.experts_per_token;
        let per_expert = assignments / self.experts;
        let mut block: f64 = 16.0;
        while block < 128.0 && block < per_expert {
            block *= 2.0;
        }
        (touched * block).max(assignments + touched * block / 2.0)
    }

    /// The terms of a step into `x` (order of [`TERM_NAMES`]).
    pub fn terms(&self, b: &BatchShape, x: &mut [f64; TERMS]) {
        let fixed = self.fixed_terms(b);
        *x = fixed.x;
        let (kv, attention) = self.context_terms(&fixed, b.decode_context_sum as f64);
        x[KV] = kv;
        x[ATTENTION] = attention;
    }

    /// The terms of a step but the two that grow with the decoding
    /// requests' context (`x_kv`, `x_attention_compute`, left 0), and what
    /// those two need: what a run of decode steps shares.
    fn fixed_terms(&self, b: &BatchShape) -> FixedTerms {
        let t = self.tp;
        let mut prefill_flops = 0.0;
        let mut prefill_pairs = 0.0;
        let mut prefill_ctx = 0.0;
        for c in &b.prefill {
            let n = f64::from(c.new_tokens);
            let before = f64::from(c.computed_before);
            prefill_flops += self.linear_flops * n + self.logits_flops;
            prefill_pairs += c.attention_pairs();
            prefill_ctx += before;
        }
        let dn = f64::from(b.decode_count);
        let tokens = b.total_tokens() as f64;
        let touched = if self.experts > 0.0 && tokens > 0.0 {
            self.experts * (1.0 - (1.0 - self.experts_per_token / self.experts).powf(tokens))
        } else {
            0.0
        };
        let weight = self.static_weight_bytes + self.expert_bytes * touched * self.moe_layers;
        let tp_bytes_per_us = t * self.bytes_per_us;
        let tp_flops_per_us = t * self.flops_per_us;
        let mut x = [0.0; TERMS];
        x[0] = 1.0;
        x[1] = self.layers;
        x[2] = if t > 1.0 { 2.0 * self.layers } else { 0.0 };
        x[3] = dn + b.prefill.len() as f64;
        x[4] = weight / tp_bytes_per_us;
        x[6] = prefill_flops / tp_flops_per_us;
        x[7] = dn * (self.linear_flops + self.logits_flops) / tp_flops_per_us;
        x[13] = self.attn_flops * prefill_pairs / tp_flops_per_us;
        x[9] = self.moe_layers * self.padded_expert_rows(tokens, touched) * self.expert_row_flops
            / tp_flops_per_us;
        x[10] = if t > 1.0 {
            2.0 * self.layers * tokens * self.hidden * 2.0 * 2.0 * (t - 1.0)
                / t
                / self.link_bytes_per_us
        } else {
            0.0
        };
        x[11] = self.moe_layers;
        x[12] = dn * self.expert_flops / tp_flops_per_us;
        FixedTerms {
            x,
            prefill_ctx,
            tokens,
            decode_count: dn,
            tp_bytes_per_us,
            tp_flops_per_us,
        }
    }

    /// `x_kv` and `x_attention_compute` of a step of `fixed` whose decoding
    /// requests' contexts sum to `ctx` tokens.
    fn context_terms(&self, fixed: &FixedTerms, ctx: f64) -> (f64, f64) {
        let f = fixed;
        (
            (f.prefill_ctx + ctx + f.tokens) * self.kv_bytes_per_token / f.tp_bytes_per_us,
            self.attn_flops * (ctx + f.decode_count) / f.tp_flops_per_us,
        )
    }
}

/// Index of `x_kv` in [`TERM_NAMES`].
const KV: usize = 5;
/// Index of `x_attention_compute` in [`TERM_NAMES`].
const ATTENTION: usize = 8;

/// A step's terms but those that grow with the decode context
/// ([`PhysicsBasis::fixed_terms`]).
#[derive(Debug, Clone, Copy)]
struct FixedTerms {
    x: [f64; TERMS],
    prefill_ctx: f64,
    tokens: f64,
    decode_count: f64,
    tp_bytes_per_us: f64,
    tp_flops_per_us: f64,
}

/// The step time of one batch composition as its decoding requests'
/// context sum grows ([`TrainedPhysics::decode_steps`]): every term but
/// the two that grow computed once, each step adding those two in their
/// place of the sum. The same arithmetic, in the same order, as
/// [`TrainedPhysics`]'s `step_time_us`, so the same bits.
#[derive(Debug, Clone, Copy)]
pub struct PhysicsSteps {
    fixed: FixedTerms,
    /// The coefficient-weighted terms (those that grow: 0).
    products: [f64; TERMS],
    /// The running sum of `products` before `x_kv`'s.
    head: f64,
}

/// The weighted sum of a step's terms, in [`TERM_NAMES`] order, from the
/// initial value of a float sum.
fn sum_from(start: f64, products: &[f64]) -> f64 {
    products.iter().fold(start, |a, p| a + p)
}

/// The per-request overheads around the engine, µs.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct HostOverheads {
    /// Arrival to the scheduler, per request.
    pub queue_us: f64,
    /// Arrival to the scheduler, per input token (tokenisation).
    pub queue_per_input_token_us: f64,
    /// A produced token to the client (every token alike).
    pub output_hop_us: f64,
}

/// The trained-physics model of one model on one GPU at one TP degree.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainedPhysics {
    /// The terms.
    pub basis: PhysicsBasis,
    /// The coefficients β_k, in [`TERM_NAMES`] order.
    pub beta: [f64; TERMS],
    /// Overheads around the engine.
    pub host: HostOverheads,
}

impl TrainedPhysics {
    /// The model with named coefficients (missing names are 0).
    pub fn from_named(
        basis: PhysicsBasis,
        named: &BTreeMap<String, f64>,
        host: HostOverheads,
    ) -> Self {
        let mut beta = [0.0; TERMS];
        for (i, n) in TERM_NAMES.iter().enumerate() {
            beta[i] = named.get(*n).copied().unwrap_or(0.0).max(0.0);
        }
        Self { basis, beta, host }
    }

    /// The coefficients by name.
    pub fn named(&self) -> BTreeMap<String, f64> {
        TERM_NAMES
            .iter()
            .zip(self.beta)
            .map(|(n, b)| ((*n).to_string(), b))
            .collect()
    }
}

impl TrainedPhysics {
    /// The step time of the (non-empty) composition `b` prepared for any
    /// sum of its decoding requests' contexts: a run of decode steps, each
    /// a token longer per request, evaluated with
    /// [`TrainedPhysics::decode_step_us`].
    pub fn decode_steps(&self, b: &BatchShape) -> PhysicsSteps {
        let fixed = self.basis.fixed_terms(b);
        let mut products = [0.0; TERMS];
        for (k, p) in products.iter_mut().enumerate() {
            *p = fixed.x[k] * self.beta[k];
        }
        // (A float sum starts from the empty sum, as `Iterator::sum` does.)
        let zero: f64 = std::iter::empty::<f64>().sum();
        PhysicsSteps {
            fixed,
            products,
            head: sum_from(zero, &products[..KV]),
        }
    }

    /// The step time, µs (≥ 1), of `steps`' composition when its decoding
    /// requests' contexts sum to `ctx` tokens: bit for bit the
    /// `step_time_us` of that batch.
    pub fn decode_step_us(&self, steps: &PhysicsSteps, ctx: u64) -> f64 {
        let (kv, attention) = self.basis.context_terms(&steps.fixed, ctx as f64);
        let p = &steps.products;
        let mut t = steps.head + kv * self.beta[KV];
        t = sum_from(t, &p[KV + 1..ATTENTION]);
        t += attention * self.beta[ATTENTION];
        t = sum_from(t, &p[ATTENTION + 1..]);
        t.max(1.0)
    }
}

impl LatencyModel for TrainedPhysics {
    fn step_time_us(&self, b: &BatchShape) -> f64 {
        if b.is_empty() {
            return 1.0;
        }
        self.decode_step_us(&self.decode_steps(b), b.decode_context_sum)
    }

    fn queueing_delay_us(&self, input_tokens: u32) -> f64 {
        (self.host.queue_us + self.host.queue_per_input_token_us * f64::from(input_tokens)).max(0.0)
    }

    fn output_token_overhead_us(&self) -> f64 {
        0.0
    }

    fn output_hop_us(&self) -> f64 {
        self.host.output_hop_us.max(0.0)
    }

    fn name(&self) -> &'static str {
        "trained-physics"
    }
}

/// BLIS's published global trained-physics coefficients (its
/// `defaults.yaml`, `trained_physics_coefficients`): β₁ₐ, β₂ₐ, β₃ … β₈,
/// β₁ᵦ, β₂ᵦ.
pub const BLIS_BETA: [f64; 10] = [
    0.152128,
    0.0,
    1.36252915,
    0.752037,
    32.09546717,
    4.41684444,
    126.024825,
    481.8613888,
    0.0,
    1.94710771,
];

/// BLIS's published α: queueing (µs), post-decode fixed overhead (µs), per
/// output token (µs).
pub const BLIS_ALPHA: [f64; 3] = [15563.199579, 777.3455, 45.907545];

/// BLIS's trained-physics formula (`sim/latency/trained_physics_model.go`,
/// 10-β form), our implementation, as the reference row of the accuracy
/// table:
///
/// ```text
/// step = β₁ₐ·T_pf_compute + β₁ᵦ·T_pf_kv + β₂ₐ·T_dc_compute + β₂ᵦ·T_dc_kv
///      + β₃·T_weight + β₄·T_tp + β₅·L + β₆·B + β₇ + β₈·(interleaved MoE layers)
/// ```
///
/// with BLIS's bases: projection, attention and MLP FLOPs over peak;
/// KV bytes (2 bytes per element) over HBM bandwidth (prefill writes, decode
/// reads and writes); all weights (every expert of an MoE layer) over HBM
/// bandwidth; all-reduce bytes (2 per layer, ring) over HBM bandwidth; `B`
/// the requests in the batch. α₀ delays entry into the queue, α₁ is added
/// once to the last token, α₂ to every token (each inter-token gap).
#[derive(Debug, Clone, PartialEq)]
pub struct BlisPhysics {
    layers: f64,
    moe_layers_interleaved: f64,
    proj_flops_per_token: f64,
    mlp_flops_per_token: f64,
    attn_head_factor: f64,
    kv_elems_per_token: f64,
    weight_bytes: f64,
    allreduce_bytes_per_token: f64,
    flops_per_us: f64,
    bytes_per_us: f64,
    /// β in [`BLIS_BETA`] order.
    pub beta: [f64; 10],
    /// α in [`BLIS_ALPHA`] order.
    pub alpha: [f64; 3],
}

impl BlisPhysics {
    /// The formula of `arch` on `hw` at TP `tp` with BLIS's published
    /// coefficients.
    pub fn published(arch: &ModelArch, hw: &Hardware, tp: u32) -> Self {
        let a = arch;
        let t = f64::from(tp.max(1));
        let d = f64::from(a.hidden);
        let dh = f64::from(a.head_dim);
        let dkv = f64::from(a.kv_heads) * dh;
        let layers = f64::from(a.layers);
        let moe = a.experts > 0;
        let moe_layers = if moe {
            layers - f64::from(a.dense_layers)
        } else {
            0.0
        };
        let dense_layers = layers - moe_layers;
        let k = f64::from(a.experts_per_token.max(1));
        let ffn_moe = f64::from(a.expert_intermediate);
        let ffn_dense = f64::from(a.intermediate);
        // Per token, summed over layers, already divided by TP.
        let proj = layers * 2.0 * d * (2.0 * d + 2.0 * dkv) / t;
        let mlp = (moe_layers * k * 6.0 * d * ffn_moe + dense_layers * 6.0 * d * ffn_dense) / t;
        let bpp = a.weight_bytes;
        let attn_w = layers * d * (2.0 * d + 2.0 * dkv) * bpp / t;
        let ffn_w = (moe_layers * f64::from(a.experts) * 3.0 * d * ffn_moe
            + dense_layers * 3.0 * d * ffn_dense)
            * bpp
            / t;
        let units = 2.0 * dense_layers + moe_layers;
        let peak = hw.peak_tflops(bpp);
        Self {
            layers,
            moe_layers_interleaved: if moe && a.dense_layers > 0 {
                moe_layers
            } else {
                0.0
            },
            proj_flops_per_token: proj,
            mlp_flops_per_token: mlp,
            attn_head_factor: 4.0 * f64::from(a.heads) / t * dh * layers,
            kv_elems_per_token: layers * 2.0 * dkv / t,
            weight_bytes: attn_w + ffn_w,
            allreduce_bytes_per_token: if tp > 1 {
                units * d * 2.0 * 2.0 * (t - 1.0) / t
            } else {
                0.0
            },
            flops_per_us: peak * 1e6,
            bytes_per_us: hw.bw_peak_tbs * 1e6,
            beta: BLIS_BETA,
            alpha: BLIS_ALPHA,
        }
    }
}

impl LatencyModel for BlisPhysics {
    fn step_time_us(&self, b: &BatchShape) -> f64 {
        if b.is_empty() {
            return 1.0;
        }
        let pf: f64 = b.prefill_tokens() as f64;
        let mut pf_attn = 0.0;
        for c in &b.prefill {
            let ti = f64::from(c.new_tokens);
            let si = f64::from(c.computed_before + c.new_tokens);
            pf_attn += ti * (si + ti / 2.0);
        }
        let dn = f64::from(b.decode_count);
        let ctx = b.decode_context_sum as f64;
        let pf_compute = if pf > 0.0 {
            (pf * (self.proj_flops_per_token + self.mlp_flops_per_token)
                + self.attn_head_factor * pf_attn)
                / self.flops_per_us
        } else {
            0.0
        };
        let pf_kv = self.kv_elems_per_token * pf * 2.0 / self.bytes_per_us;
        let dc_compute = if dn > 0.0 {
            (dn * (self.proj_flops_per_token + self.mlp_flops_per_token)
                + self.attn_head_factor * ctx)
                / self.flops_per_us
        } else {
            0.0
        };
        let dc_kv = self.kv_elems_per_token * 2.0 * (ctx + dn) / self.bytes_per_us;
        let weight = self.weight_bytes / self.bytes_per_us;
        let tokens = pf + dn;
        let tp = self.allreduce_bytes_per_token * tokens / self.bytes_per_us;
        let batch = dn + b.prefill.len() as f64;
        let be = &self.beta;
        let t = be[0] * pf_compute
            + be[8] * pf_kv
            + be[1] * dc_compute
            + be[9] * dc_kv
            + be[2] * weight
            + be[3] * tp
            + be[4] * self.layers
            + be[5] * batch
            + be[6]
            + be[7] * self.moe_layers_interleaved;
        t.max(1.0)
    }

    fn queueing_delay_us(&self, _input_tokens: u32) -> f64 {
        self.alpha[0].max(0.0)
    }

    fn output_token_overhead_us(&self) -> f64 {
        self.alpha[2].max(0.0)
    }

    fn completion_overhead_us(&self) -> f64 {
        self.alpha[1].max(0.0)
    }

    fn name(&self) -> &'static str {
        "blis-physics"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::latency::PrefillChunk;
    use crate::latency::hf_config::find_model;

    /// H100 of the bundled table: 989.5 TFLOP/s, 3.35 TB/s, NVLink 450
    /// GB/s, in FLOP/µs and bytes/µs.
    const F: f64 = 989.5e6;
    const B: f64 = 3.35e6;
    const N: f64 = 450e3;

    /// One chunk of 50 new tokens after 100 computed, and 3 decoding
    /// requests with 1,000 tokens of context between them: 53 tokens.
    fn batch() -> BatchShape {
        BatchShape {
            prefill: vec![PrefillChunk {
                computed_before: 100,
                new_tokens: 50,
            }],
            decode_count: 3,
            decode_context_sum: 1000,
        }
    }

    fn terms(model: &str, tp: u32) -> [f64; TERMS] {
        let arch = find_model(Some(model), None).unwrap();
        let hw = Hardware::bundled("H100").unwrap();
        let mut x = [0.0; TERMS];
        PhysicsBasis::new(&arch, &hw, tp).terms(&batch(), &mut x);
        x
    }

    /// The terms by hand, from a model's parameters P (per token, outside
    /// routed experts), routed-expert parameters P_e, weight bytes W, KV
    /// bytes per token K, attention FLOPs per context token a, d, V, L,
    /// MoE layers, and the FLOPs of the fused-MoE kernel's padded rows
    /// (all MoE layers).
    #[allow(clippy::too_many_arguments)]
    fn by_hand(
        tp: f64,
        l: f64,
        d: f64,
        v: f64,
        p: f64,
        pe: f64,
        w: f64,
        k: f64,
        a: f64,
        moe_layers: f64,
        padded_row_flops: f64,
    ) -> [f64; TERMS] {
        let tokens = 53.0;
        let pairs = 50.0 * 100.0 + 50.0 * 51.0 / 2.0;
        [
            1.0,
            l,
            if tp > 1.0 { 2.0 * l } else { 0.0 },
            4.0,
            w / (tp * B),
            (100.0 + 1000.0 + tokens) * k / (tp * B),
            (2.0 * p * 50.0 + 2.0 * d * v) / (tp * F),
            3.0 * (2.0 * p + 2.0 * d * v) / (tp * F),
            a * (1000.0 + 3.0) / (tp * F),
            padded_row_flops / (tp * F),
            2.0 * l * tokens * d * 2.0 * 2.0 * (tp - 1.0) / tp / N,
            moe_layers,
            3.0 * 2.0 * pe / (tp * F),
            a * pairs / (tp * F),
        ]
    }

    fn assert_close(got: [f64; TERMS], want: [f64; TERMS], what: &str) {
        for i in 0..TERMS {
            let tol = 1e-9 * want[i].abs().max(1e-9);
            assert!(
                (got[i] - want[i]).abs() <= tol,
                "{what}: {} = {} by the code, {} by hand",
                TERM_NAMES[i],
                got[i],
                want[i]
            );
        }
    }

    #[test]
    fn dense_llama_2_7b_terms_match_the_hand_computation() {
        // d 4096, 32 layers, 32 heads = 32 KV heads of 128, MLP 11008
        // (gated), vocabulary 32000, FP16.
        let attn = 4.0 * 4096.0 * 4096.0;
        let mlp = 3.0 * 4096.0 * 11008.0;
        let p = 32.0 * (attn + mlp);
        let w = (p + 4096.0 * 32000.0) * 2.0;
        let k = 2.0 * 32.0 * 128.0 * 32.0 * 2.0;
        let a = 4.0 * 32.0 * 128.0 * 32.0;
        for tp in [1, 4] {
            let want = by_hand(
                f64::from(tp),
                32.0,
                4096.0,
                32000.0,
                p,
                0.0,
                w,
                k,
                a,
                0.0,
                0.0,
            );
            assert_close(terms("meta-llama/Llama-2-7b-hf", tp), want, "llama-2-7b");
        }
        // Spot values: 13.2 GB of weights read in 3.94 ms at TP 1.
        let x = terms("meta-llama/Llama-2-7b-hf", 1);
        assert!((x[4] - 13_214_154_752.0 / 3.35e6).abs() < 1e-6, "{}", x[4]);
    }

    #[test]
    fn gqa_llama_2_70b_terms_match_the_hand_computation() {
        // d 8192, 80 layers, 64 query heads and 8 KV heads of 128, MLP
        // 28672 (gated), vocabulary 32000, FP16.
        let attn = 2.0 * 8192.0 * 8192.0 + 2.0 * 8192.0 * 1024.0;
        let mlp = 3.0 * 8192.0 * 28672.0;
        let p = 80.0 * (attn + mlp);
        let w = (p + 8192.0 * 32000.0) * 2.0;
        let k = 2.0 * 8.0 * 128.0 * 80.0 * 2.0;
        let a = 4.0 * 64.0 * 128.0 * 80.0;
        for tp in [1, 4] {
            let want = by_hand(
                f64::from(tp),
                80.0,
                8192.0,
                32000.0,
                p,
                0.0,
                w,
                k,
                a,
                0.0,
                0.0,
            );
            assert_close(terms("meta-llama/Llama-2-70b-hf", tp), want, "llama-2-70b");
        }
    }

    #[test]
    fn moe_mixtral_terms_match_the_hand_computation() {
        // d 4096, 32 layers, 32 query heads and 8 KV heads of 128, 8
        // experts of 14336 (gated), 2 per token, vocabulary 32000, FP16.
        let attn = 2.0 * 4096.0 * 4096.0 + 2.0 * 4096.0 * 1024.0;
        let router = 4096.0 * 8.0;
        let expert = 3.0 * 4096.0 * 14336.0;
        let p = 32.0 * (attn + router);
        let pe = 32.0 * 2.0 * expert;
        // 53 tokens touch 8·(1 − (6/8)^53) of the 8 experts of a layer.
        let touched = 8.0 * (1.0 - 0.75f64.powi(53));
        let w = (p + 4096.0 * 32000.0 + 32.0 * touched * expert) * 2.0;
        let k = 2.0 * 8.0 * 128.0 * 32.0 * 2.0;
        let a = 4.0 * 32.0 * 128.0 * 32.0;
        // The fused-MoE kernel's rows: 106 assignments, 13.25 per expert,
        // padded to blocks of 16: max(8 touched × 16, 106 + 8 × 16 / 2).
        let rows = (touched * 16.0).max(106.0 + touched * 8.0);
        let padded = 32.0 * rows * 2.0 * expert;
        for tp in [1, 4] {
            let want = by_hand(
                f64::from(tp),
                32.0,
                4096.0,
                32000.0,
                p,
                pe,
                w,
                k,
                a,
                32.0,
                padded,
            );
            assert_close(
                terms("mistralai/Mixtral-8x7B-v0.1", tp),
                want,
                "mixtral-8x7b",
            );
        }
    }

    /// vLLM's fused-MoE Triton kernel (sorted, block-padded grouped GEMM,
    /// vLLM's tuned H100 configuration; both expert GEMMs, SiLU and the
    /// top-k sum) per MoE layer on one H100 80GB HBM3, bf16, uniform random
    /// routing, CUDA-graph replays (2026-11-27, `docs/trained-physics.md`):
    /// (tokens, µs). The expert terms at coefficient 1 (the touched
    /// experts' weights at peak bandwidth, the padded rows' FLOPs at peak)
    /// stay within 20% of each, from decode batches to long prefills.
    #[test]
    fn expert_terms_follow_the_measured_fused_moe_kernel() {
        let hw = Hardware::bundled("H100").unwrap();
        let cases = [
            (
                "mistralai/Mixtral-8x7B-v0.1",
                2,
                &[
                    (16, 488.8),
                    (64, 494.0),
                    (128, 506.4),
                    (256, 553.5),
                    (512, 685.8),
                    (1024, 835.5),
                    (2048, 1384.3),
                ][..],
            ),
            (
                "Qwen/Qwen3-30B-A3B",
                1,
                &[
                    (16, 270.6),
                    (64, 421.1),
                    (128, 433.7),
                    (512, 482.0),
                    (1024, 548.9),
                    (2048, 638.7),
                ][..],
            ),
        ];
        for (model, tp, measured) in cases {
            let arch = find_model(Some(model), None).unwrap();
            let basis = PhysicsBasis::new(&arch, &hw, tp);
            let layers = f64::from(arch.moe_layers());
            let (e, k) = (f64::from(arch.experts), f64::from(arch.experts_per_token));
            for &(tokens, us) in measured {
                let b = BatchShape {
                    prefill: vec![PrefillChunk {
                        computed_before: 0,
                        new_tokens: tokens,
                    }],
                    decode_count: 0,
                    decode_context_sum: 0,
                };
                let mut x = [0.0; TERMS];
                basis.terms(&b, &mut x);
                let touched = e * (1.0 - (1.0 - k / e).powf(f64::from(tokens)));
                let read = touched * arch.expert_params() * arch.weight_bytes
                    / (f64::from(tp) * hw.bw_peak_tbs * 1e6);
                let predicted = read + x[9] / layers;
                assert!(
                    (predicted / us - 1.0).abs() <= 0.2,
                    "{model} TP{tp}, {tokens} tokens: {predicted:.1} µs predicted, {us} measured"
                );
            }
        }
    }

    #[test]
    fn step_time_is_the_coefficients_times_the_terms() {
        let arch = find_model(Some("meta-llama/Llama-2-7b-hf"), None).unwrap();
        let hw = Hardware::bundled("H100").unwrap();
        let basis = PhysicsBasis::new(&arch, &hw, 1);
        let mut named = BTreeMap::new();
        named.insert("step".to_string(), 100.0);
        named.insert("weight".to_string(), 1.5);
        let m = TrainedPhysics::from_named(basis, &named, HostOverheads::default());
        let x = terms("meta-llama/Llama-2-7b-hf", 1);
        let want = 100.0 + 1.5 * x[4];
        assert!((m.step_time_us(&batch()) - want).abs() < 1e-9);
    }
}
