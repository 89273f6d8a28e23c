//! Model architectures (Hugging Face `config.json`) and GPU descriptions
//! (`hardware_config.json`), the inputs of the roofline model.
//!
//! The configs of `replay/model-configs/` (copied from inference-sim, Apache-2.0)
//! are compiled into the binary; `--model-config DIR_OR_FILE` reads others.

use std::path::PathBuf;

use serde_json::Value;

/// A model's architecture (a Hugging Face `config.json`) that cannot be
/// found or used.
#[derive(Debug, thiserror::Error)]
pub enum ArchError {
    /// Neither a model name nor a config was given.
    #[error("the roofline model needs --model or --model-config")]
    NoModel,
    /// No bundled config matches the model name.
    #[error("no bundled config for model {model:?} (looked for {key:?}); give --model-config DIR_OR_FILE. Bundled: {}", known.join(", "))]
    NotBundled {
        /// The model as given.
        model: String,
        /// The folder name looked for.
        key: String,
        /// The bundled configs.
        known: Vec<String>,
    },
    /// The config file cannot be read.
    #[error("{}: {error}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why (in the message, not chained, so it prints once).
        error: std::io::Error,
    },
    /// The config is not JSON.
    #[error("{name}: invalid JSON: {error}")]
    Json {
        /// The config (its file or bundled name).
        name: String,
        /// The parser's error.
        error: serde_json::Error,
    },
    /// A required field is missing or not an integer.
    #[error("{name}: `{field}` missing or not an integer")]
    Missing {
        /// The config.
        name: String,
        /// The field.
        field: String,
    },
    /// Zero layers, hidden size or heads.
    #[error("{name}: zero layers, hidden size or heads")]
    Empty {
        /// The config.
        name: String,
    },
    /// A field that changes the architecture in a way the latency models
    /// do not understand.
    #[error(
        "{name}: `{field}`: {why}; the latency models would mispredict this model (see docs/architectures.md)"
    )]
    NotUnderstood {
        /// The config.
        name: String,
        /// The field.
        field: String,
        /// What is not understood.
        why: String,
    },
}

/// A GPU description (`hardware_config.json`) that cannot be found or used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum HardwareError {
    /// The file is not JSON (the parser's message).
    #[error("{file}: invalid JSON: {why}")]
    Json {
        /// The hardware file.
        file: String,
        /// The parser's message, with line and column.
        why: String,
    },
    /// The file is not a JSON object of GPUs.
    #[error("{file}: expected a JSON object of GPUs by name (as the bundled hardware_config.json)")]
    NotAnObject {
        /// The hardware file.
        file: String,
    },
    /// No GPU of that name.
    #[error("unknown hardware {name:?} (known: {})", known.join(", "))]
    Unknown {
        /// The name looked for.
        name: String,
        /// The GPUs described.
        known: Vec<String>,
    },
    /// A required figure is missing.
    #[error("hardware {hardware}: `{field}` missing")]
    Missing {
        /// The GPU.
        hardware: String,
        /// The field.
        field: String,
    },
}

/// The model configs bundled with the project: (folder name, config.json).
pub const BUNDLED_MODELS: &[(&str, &str)] = &[
    (
        "codellama-34b-instruct-hf",
        include_str!("../../model-configs/codellama-34b-instruct-hf/config.json"),
    ),
    (
        "deepseek-v2-lite",
        include_str!("../../model-configs/deepseek-v2-lite/config.json"),
    ),
    (
        "glm-5.2-fp8",
        include_str!("../../model-configs/glm-5.2-fp8/config.json"),
    ),
    (
        "llama-2-70b-hf",
        include_str!("../../model-configs/llama-2-70b-hf/config.json"),
    ),
    (
        "llama-2-7b-hf",
        include_str!("../../model-configs/llama-2-7b-hf/config.json"),
    ),
    (
        "llama-3.1-70b-instruct",
        include_str!("../../model-configs/llama-3.1-70b-instruct/config.json"),
    ),
    (
        "llama-3.1-8b-instruct",
        include_str!("../../model-configs/llama-3.1-8b-instruct/config.json"),
    ),
    (
        "llama-4-scout-17b-16e-instruct-fp8-dynamic",
        include_str!("../../model-configs/llama-4-scout-17b-16e-instruct-fp8-dynamic/config.json"),
    ),
    (
        "mistral-nemo-instruct-2407",
        include_str!("../../model-configs/mistral-nemo-instruct-2407/config.json"),
    ),
    (
        "mixtral-8x7b-v0.1",
        include_str!("../../model-configs/mixtral-8x7b-v0.1/config.json"),
    ),
    (
        "qwen2.5-7b-instruct",
        include_str!("../../model-configs/qwen2.5-7b-instruct/config.json"),
    ),
    (
        "qwen3-14b",
        include_str!("../../model-configs/qwen3-14b/config.json"),
    ),
    (
        "qwen3-30b-a3b",
        include_str!("../../model-configs/qwen3-30b-a3b/config.json"),
    ),
    (
        "yi-34b",
        include_str!("../../model-configs/yi-34b/config.json"),
    ),
];

/// The bundled `hardware_config.json`.
pub const BUNDLED_HARDWARE: &str = include_str!("../../model-configs/hardware_config.json");

/// A transformer's architecture as the latency models see it, read from a
/// Hugging Face `config.json` by [`crate::latency::hf_config`] (each
/// field's Hugging Face meaning is documented there and in
/// `docs/architectures.md`).
#[derive(Debug, Clone, PartialEq)]
pub struct ModelArch {
    /// Folder or file it came from (for reports).
    pub name: String,
    /// Decoder layers (`num_hidden_layers`; multi-token-prediction layers
    /// not included).
    pub layers: u32,
    /// Hidden size d.
    pub hidden: u32,
    /// Attention (query) heads.
    pub heads: u32,
    /// Key/value heads (GQA; the query heads for MLA, whose cache is the
    /// latent instead).
    pub kv_heads: u32,
    /// Per-head dimension of standard attention.
    pub head_dim: u32,
    /// Intermediate size of a dense layer's MLP (Llama-4:
    /// `intermediate_size_mlp`).
    pub intermediate: u32,
    /// Vocabulary size.
    pub vocab: u32,
    /// Routed experts of an MoE layer (0 for dense models).
    pub experts: u32,
    /// Experts each token is routed to.
    pub experts_per_token: u32,
    /// Shared (always active) experts of an MoE layer.
    pub shared_experts: u32,
    /// Intermediate size of one routed expert.
    pub expert_intermediate: u32,
    /// Intermediate size of one shared expert.
    pub shared_expert_intermediate: u32,
    /// Layers whose MLP is dense: `layers` minus the MoE layers.
    pub dense_layers: u32,
    /// Multi-head latent attention (DeepSeek-V2/V3, GLM-5), if used.
    pub mla: Option<Mla>,
    /// Multi-head latent attention: compressed KV width per token and layer
    /// (`kv_lora_rank + qk_rope_head_dim`); 0 for standard attention.
    pub mla_kv_width: u32,
    /// Bytes per weight of the MLPs and experts (2 for BF16/FP16, 1 for
    /// FP8 or INT8, 0.5 for 4-bit).
    pub weight_bytes: f64,
    /// Bytes per weight of the attention projections (and routers).
    pub attn_weight_bytes: f64,
    /// Bytes per weight of the LM head.
    pub lm_head_bytes: f64,
    /// Whether the MLP/expert GEMMs run at the FP8 (8-bit) peak: 8-bit
    /// weights with 8-bit activations.
    pub mlp_fp8_compute: bool,
    /// Whether the attention projections run at the FP8 peak.
    pub attn_fp8_compute: bool,
    /// Bytes per KV-cache element (2: FP16/BF16 KV; 1 for an 8-bit
    /// `kv_cache_scheme`).
    pub kv_bytes: f64,
    /// Whether the MLP is gated (SwiGLU: three matrices) rather than two.
    pub gated_mlp: bool,
    /// Whether the LM head shares the input embedding (`tie_word_embeddings`).
    pub tied_embeddings: bool,
    /// Attention limited to a window of recent tokens on some layers
    /// (sliding window, or Llama-4's chunked attention).
    pub window: Option<AttentionWindow>,
    /// Sparse attention: each query attends to at most this many selected
    /// tokens (GLM-5 / DeepSeek-V3.2's `index_topk`), with a lightning
    /// indexer of `index_n_heads × index_head_dim` over the whole context.
    pub sparse_topk: Option<SparseAttention>,
    /// Multi-token-prediction layers (`num_nextn_predict_layers`): weights
    /// that run only with speculative decoding, which the simulator does
    /// not model; not counted in the step.
    pub mtp_layers: u32,
    /// The context length vLLM derives from the config (its default
    /// `max_model_len`), tokens; `None` when the config gives none.
    pub max_context: Option<u32>,
}

/// Multi-head latent attention's dimensions (DeepSeek-V2, arXiv:2405.04434).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mla {
    /// Rank of the query compression (0: queries projected directly).
    pub q_lora_rank: u32,
    /// Rank of the joint KV compression: the latent cached per token.
    pub kv_lora_rank: u32,
    /// Per-head query/key width without rotary embedding.
    pub qk_nope_head_dim: u32,
    /// Per-head query/key width with rotary embedding (one shared rotary
    /// key is cached per token).
    pub qk_rope_head_dim: u32,
    /// Per-head value width.
    pub v_head_dim: u32,
}

/// Attention over a window of recent tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionWindow {
    /// Window, tokens.
    pub tokens: u32,
    /// Layers that use it (the others attend to the whole context).
    pub layers: u32,
    /// Llama-4's chunked attention (the context restarts every `tokens`)
    /// rather than a sliding window.
    pub chunked: bool,
}

/// A sparse-attention indexer (DeepSeek-V3.2 / GLM-5 "DSA").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SparseAttention {
    /// Tokens each query attends to at most.
    pub topk: u32,
    /// Indexer heads.
    pub index_heads: u32,
    /// Indexer head width.
    pub index_head_dim: u32,
}

impl ModelArch {
    /// MoE layers.
    pub fn moe_layers(&self) -> u32 {
        self.layers - self.dense_layers
    }

    /// KV-cache bytes per token on each of `tp` GPUs (vLLM's split): the
    /// KV heads divided among them, each GPU holding at least one (heads
    /// fewer than `tp` are replicated); an MLA latent is held whole on
    /// every GPU.
    pub fn kv_bytes_per_token_per_gpu(&self, tp: u32) -> f64 {
        let tp = tp.max(1);
        let per_layer = if self.mla_kv_width > 0 {
            f64::from(self.mla_kv_width)
        } else {
            let heads = if self.kv_heads == 0 {
                0
            } else {
                self.kv_heads.div_ceil(tp)
            };
            2.0 * f64::from(heads) * f64::from(self.head_dim)
        };
        per_layer * f64::from(self.layers) * self.kv_bytes
    }

    /// KV-cache bytes per token (all layers).
    pub fn kv_bytes_per_token(&self) -> f64 {
        let per_layer = if self.mla_kv_width > 0 {
            f64::from(self.mla_kv_width)
        } else {
            2.0 * f64::from(self.kv_heads) * f64::from(self.head_dim)
        };
        per_layer * f64::from(self.layers) * self.kv_bytes
    }

    /// Parameters of one layer's attention (Q, K, V, O projections; for
    /// MLA the query and KV compressions and expansions; a sparse-attention
    /// indexer's projections).
    pub fn attention_params_per_layer(&self) -> f64 {
        let d = f64::from(self.hidden);
        let h = f64::from(self.heads);
        let mut p = match &self.mla {
            Some(m) => {
                let qk = f64::from(m.qk_nope_head_dim + m.qk_rope_head_dim);
                let q = if m.q_lora_rank > 0 {
                    let r = f64::from(m.q_lora_rank);
                    d * r + r * h * qk
                } else {
                    d * h * qk
                };
                let kv_a = d * f64::from(m.kv_lora_rank + m.qk_rope_head_dim);
                let kv_b =
                    f64::from(m.kv_lora_rank) * h * f64::from(m.qk_nope_head_dim + m.v_head_dim);
                let o = h * f64::from(m.v_head_dim) * d;
                q + kv_a + kv_b + o
            }
            None => {
                let q = h * f64::from(self.head_dim);
                let kv = f64::from(self.kv_heads) * f64::from(self.head_dim);
                d * q + 2.0 * d * kv + q * d
            }
        };
        if let Some(s) = &self.sparse_topk {
            // Indexer: queries from the query latent (or the hidden state),
            // one key, per-head weights.
            let q_in = self
                .mla
                .filter(|m| m.q_lora_rank > 0)
                .map_or(d, |m| f64::from(m.q_lora_rank));
            let (ih, idim) = (f64::from(s.index_heads), f64::from(s.index_head_dim));
            p += q_in * ih * idim + d * idim + d * ih;
        }
        p
    }

    /// Attention FLOPs per token of context attended, all layers: 4·H·d_h
    /// per layer for standard attention (QKᵀ and PV); for MLA the absorbed
    /// form vLLM decodes with, 2·H·(kv_lora_rank + qk_rope) + 2·H·kv_lora_rank.
    pub fn attention_flops_per_context_token(&self) -> f64 {
        let h = f64::from(self.heads);
        let per_layer = match &self.mla {
            Some(m) => {
                2.0 * h * f64::from(m.kv_lora_rank + m.qk_rope_head_dim)
                    + 2.0 * h * f64::from(m.kv_lora_rank)
            }
            None => 4.0 * h * f64::from(self.head_dim),
        };
        per_layer * f64::from(self.layers)
    }

    /// Matrices per MLP (3 for gated, 2 otherwise).
    pub fn mlp_matrices(&self) -> f64 {
        if self.gated_mlp { 3.0 } else { 2.0 }
    }

    /// Parameters of one dense layer's MLP.
    pub fn dense_mlp_params(&self) -> f64 {
        self.mlp_matrices() * f64::from(self.hidden) * f64::from(self.intermediate)
    }

    /// Parameters of one routed expert of an MoE layer.
    pub fn expert_params(&self) -> f64 {
        self.mlp_matrices() * f64::from(self.hidden) * f64::from(self.expert_intermediate)
    }

    /// Parameters of an MoE layer's shared experts together.
    pub fn shared_expert_params(&self) -> f64 {
        self.mlp_matrices()
            * f64::from(self.hidden)
            * f64::from(self.shared_expert_intermediate)
            * f64::from(self.shared_experts)
    }

    /// Parameters every step reads whatever its tokens: attention, dense
    /// MLPs, the shared experts and routers of MoE layers, and the LM head
    /// (everything but the routed experts).
    pub fn static_weight_params(&self) -> f64 {
        let d = f64::from(self.hidden);
        let moe_layers = f64::from(self.moe_layers());
        self.attention_params_per_layer() * f64::from(self.layers)
            + self.dense_mlp_params() * f64::from(self.dense_layers)
            + (self.shared_expert_params() + d * f64::from(self.experts)) * moe_layers
            + d * f64::from(self.vocab)
    }

    /// Bytes of [`Self::static_weight_params`], each part at its own
    /// precision (attention and routers, MLPs and shared experts, LM head).
    pub fn static_weight_bytes(&self) -> f64 {
        let d = f64::from(self.hidden);
        let moe_layers = f64::from(self.moe_layers());
        (self.attention_params_per_layer() * f64::from(self.layers)
            + d * f64::from(self.experts) * moe_layers)
            * self.attn_weight_bytes
            + (self.dense_mlp_params() * f64::from(self.dense_layers)
                + self.shared_expert_params() * moe_layers)
                * self.weight_bytes
            + d * f64::from(self.vocab) * self.lm_head_bytes
    }

    /// Bytes of every weight held in GPU memory (the embedding table too,
    /// unless tied to the LM head), for the KV-cache estimate.
    pub fn resident_weight_bytes(&self) -> f64 {
        let embed = if self.tied_embeddings {
            0.0
        } else {
            f64::from(self.hidden) * f64::from(self.vocab) * self.lm_head_bytes
        };
        self.static_weight_bytes()
            + self.expert_params()
                * f64::from(self.experts)
                * f64::from(self.moe_layers())
                * self.weight_bytes
            + embed
    }
}

/// A GPU, as in `hardware_config.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct Hardware {
    /// Name (`H100`, `A100-SXM`, `L40S`, ...).
    pub name: String,
    /// Dense BF16/FP16 peak, TFLOP/s.
    pub tflops_peak: f64,
    /// FP8 peak, TFLOP/s (0 = none).
    pub tflops_fp8: f64,
    /// Memory bandwidth, TB/s.
    pub bw_peak_tbs: f64,
    /// Model-FLOPs utilisation of prefill.
    pub mfu_prefill: f64,
    /// Model-FLOPs utilisation of decode.
    pub mfu_decode: f64,
    /// Memory, GiB.
    pub memory_gib: f64,
    /// GPU-to-GPU bandwidth per direction for tensor-parallel all-reduce,
    /// GB/s (`NvlinkBwGBs`; defaults: H100 450, A100 300, otherwise 32).
    pub interconnect_gbs: f64,
}

impl Hardware {
    /// Reads `name` from the text of a `hardware_config.json`; `file`
    /// names it in errors.
    ///
    /// # Errors
    /// Text that is not a JSON object, an unknown name (listing the known
    /// ones) or missing fields.
    pub fn from_json(file: &str, text: &str, name: &str) -> Result<Self, HardwareError> {
        let root: Value = serde_json::from_str(text).map_err(|e| HardwareError::Json {
            file: file.to_string(),
            why: e.to_string(),
        })?;
        let obj = root.as_object().ok_or_else(|| HardwareError::NotAnObject {
            file: file.to_string(),
        })?;
        let (key, hw) = obj
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .ok_or_else(|| HardwareError::Unknown {
                name: name.to_string(),
                known: obj.keys().cloned().collect(),
            })?;
        let f = |k: &str| hw.get(k).and_then(Value::as_f64);
        let need = |k: &str| {
            f(k).ok_or_else(|| HardwareError::Missing {
                hardware: key.clone(),
                field: k.to_string(),
            })
        };
        let upper = key.to_uppercase();
        let default_link = if upper.starts_with("H100")
            || upper.starts_with("H200")
            || upper.starts_with("B200")
        {
            450.0
        } else if upper.starts_with("A100") {
            300.0
        } else {
            32.0
        };
        Ok(Self {
            name: key.clone(),
            tflops_peak: need("TFlopsPeak")?,
            tflops_fp8: f("TFlopsFP8").unwrap_or(0.0),
            bw_peak_tbs: need("BwPeakTBs")?,
            mfu_prefill: need("mfuPrefill")?,
            mfu_decode: need("mfuDecode")?,
            memory_gib: f("MemoryGiB").unwrap_or(80.0),
            interconnect_gbs: f("NvlinkBwGBs").unwrap_or(default_link),
        })
    }

    /// The peak FLOP rate (TFLOP/s) for weights of `weight_bytes` bytes:
    /// FP8 where the GPU has it and the weights are 8-bit, else BF16/FP16.
    pub fn peak_tflops(&self, weight_bytes: f64) -> f64 {
        if weight_bytes <= 1.0 && self.tflops_fp8 > 0.0 {
            self.tflops_fp8
        } else {
            self.tflops_peak
        }
    }

    /// A bundled GPU by name.
    ///
    /// # Errors
    /// An unknown name.
    pub fn bundled(name: &str) -> Result<Self, HardwareError> {
        Self::from_json("hardware_config.json (bundled)", BUNDLED_HARDWARE, name)
    }
}

/// The folder name a model id maps to: `meta-llama/Llama-2-7b-hf` →
/// `llama-2-7b-hf`.
pub fn model_key(model: &str) -> String {
    model
        .rsplit('/')
        .next()
        .unwrap_or(model)
        .trim()
        .to_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hardware_is_read_and_unknown_names_listed() {
        let h = Hardware::bundled("h100").unwrap();
        assert_eq!(
            (h.tflops_peak, h.bw_peak_tbs, h.mfu_prefill, h.mfu_decode),
            (989.5, 3.35, 0.45, 0.30)
        );
        assert!(
            Hardware::bundled("TPU")
                .unwrap_err()
                .to_string()
                .contains("known: ")
        );
    }
}
