//! Reading a Hugging Face `config.json` into a [`ModelArch`], field by
//! field with the meaning the Hugging Face `transformers` configuration
//! classes give it (`LlamaConfig`, `MixtralConfig`, `Qwen2Config`,
//! `Qwen3MoeConfig`, `DeepseekV2Config`, `Llama4TextConfig`, …) and vLLM's
//! reading of quantization configs.
//!
//! - **Layers and MoE layers.** `num_hidden_layers` layers; with routed
//!   experts (`num_local_experts`, `n_routed_experts` or `num_experts`,
//!   more than one), layer `i` (0-based) is an MoE layer when:
//!   `moe_layers` lists it (Llama-4); else `(i + 1) % interleave_moe_layer_step
//!   == 0` (Llama-4: `moe_layers = range(step − 1, L, step)`, so step 1 makes
//!   every layer MoE); else `i >= first_k_dense_replace && i %
//!   moe_layer_freq == 0` (DeepSeek, GLM); else `i ∉ mlp_only_layers && (i + 1)
//!   % decoder_sparse_step == 0` (Qwen-MoE); else every layer (Mixtral).
//! - **MLP sizes.** Dense layers use `intermediate_size` (Llama-4:
//!   `intermediate_size_mlp`); a routed expert `moe_intermediate_size`
//!   (Llama-4: `intermediate_size`). Shared experts: `n_shared_experts` of
//!   `moe_intermediate_size` (DeepSeek, GLM), one of
//!   `shared_expert_intermediate_size` (Qwen2-MoE), one of
//!   `intermediate_size` in every Llama-4 MoE layer (`Llama4TextMoe`).
//! - **Attention.** `num_key_value_heads` (default: the query heads),
//!   `head_dim` (default `hidden_size / num_attention_heads`); MLA when
//!   `kv_lora_rank` > 0 (`q_lora_rank` null: queries projected directly;
//!   `qk_nope_head_dim`, `qk_rope_head_dim`, `v_head_dim`; the cache holds
//!   `kv_lora_rank + qk_rope_head_dim` per token and layer).
//! - **Windows.** `sliding_window` on every layer (Mistral), unless
//!   `use_sliding_window` is false (Qwen2/3); with it true, the layers from
//!   `max_window_layers` on (Qwen2); `layer_types` when given; Llama-4's
//!   `attention_chunk_size` on the layers that use RoPE (`no_rope_layers`,
//!   by default all but every fourth). Sparse attention: `index_topk` with
//!   `index_n_heads × index_head_dim` (GLM-5, DeepSeek-V3.2).
//! - **Precision.** `torch_dtype`/`dtype` (2 bytes for 16-bit, 4 for
//!   float32). `quantization_config`: `fp8` (every linear layer 8-bit,
//!   with 8-bit activations, but those in `modules_to_not_convert`/
//!   `ignored_layers`; the LM head stays unquantized, as vLLM's
//!   `Fp8LinearMethod`); `compressed-tensors` (`config_groups[*].weights.
//!   num_bits`, 8-bit activations when `input_activations` are 8-bit, the
//!   `ignore` list keeping attention, routers or the LM head in 16 bits,
//!   `kv_cache_scheme` an 8-bit KV cache); `awq`/`gptq` (`bits`-bit weights,
//!   16-bit compute).
//! - `num_nextn_predict_layers` (multi-token prediction) and a
//!   `vision_config` are recorded, not run: the simulator serves text and
//!   does not model speculative decoding.
//!
//! **An architecture field this module does not understand is an error
//! naming it**, never a silent default: every key is either read, known to
//! leave the step time unchanged ([`IGNORED`]), or, when its name looks
//! architectural ([`ARCHITECTURAL_WORDS`]), refused.

use serde_json::{Map, Value};

use std::path::{Path, PathBuf};

use crate::latency::arch::{
    ArchError, AttentionWindow, BUNDLED_MODELS, Mla, ModelArch, SparseAttention, model_key,
};

/// Keys read by [`parse`] besides its size fields ([`SIZES`]).
pub const READ: &[&str] = &[
    "first_k_dense_replace",
    "moe_layer_freq",
    "interleave_moe_layer_step",
    "moe_layers",
    "decoder_sparse_step",
    "mlp_only_layers",
    "sliding_window",
    "use_sliding_window",
    "max_window_layers",
    "layer_types",
    "attention_chunk_size",
    "no_rope_layers",
    "no_rope_layer_interval",
    "tie_word_embeddings",
    "torch_dtype",
    "dtype",
    "hidden_act",
    "quantization_config",
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
    "rope_scaling",
    "text_config",
    "vision_config",
    "model_type",
    "architectures",
];

/// Keys known to leave a step's time unchanged: token ids, initialisation,
/// normalisation epsilons, dropout, biases, RoPE base and scaling (the
/// context length is read from the scaling), routing details that do not
/// change which weights are read (top-k groups, scoring, normalisation),
/// multimodal token ids.
pub const IGNORED: &[&str] = &[
    "_name_or_path",
    "_attn_implementation_autoset",
    "attention_bias",
    "attention_dropout",
    "attn_scale",
    "attn_temperature_tuning",
    "auto_map",
    "aux_loss_alpha",
    "boi_token_index",
    "bos_token_id",
    "eoi_token_index",
    "eos_token_id",
    "floor_scale",
    "for_llm_compressor",
    "image_token_index",
    "initializer_range",
    "layer_norm_eps",
    "layer_norm_epsilon",
    "mlp_bias",
    "n_group",
    "norm_topk_prob",
    "output_router_logits",
    "pad_token_id",
    "partial_rotary_factor",
    "pretraining_tp",
    "rms_norm_eps",
    "rope_parameters",
    "rope_theta",
    "routed_scaling_factor",
    "router_aux_loss_coef",
    "router_jitter_noise",
    "scoring_func",
    "seq_aux",
    "topk_group",
    "topk_method",
    "transformers_version",
    "use_cache",
    "use_qk_norm",
];

/// Parts of a key's name that mark it as architectural: an unknown key
/// containing one is refused.
pub const ARCHITECTURAL_WORDS: &[&str] = &[
    "layer",
    "expert",
    "moe",
    "head",
    "window",
    "attention",
    "attn",
    "hidden",
    "intermediate",
    "lora",
    "rank",
    "_dim",
    "kv",
    "vocab",
    "sparse",
    "shared",
    "dense",
    "nextn",
    "mtp",
    "topk",
    "chunk",
    "quant",
    "mlp",
    "ffn",
    "embed",
    "num_",
];

fn not_understood(name: &str, field: &str, why: &str) -> ArchError {
    ArchError::NotUnderstood {
        name: name.to_string(),
        field: field.to_string(),
        why: why.to_string(),
    }
}

/// The size fields [`parse`] reads, each with the largest value it
/// accepts: 65,536 layers (the largest models have about a hundred), 2^24
/// for a width, a head, expert or vocabulary count (the largest
/// vocabularies are about 2^18). Beyond them a config describes no model,
/// and its sizes would only overflow the step's arithmetic or loop over
/// billions of layers.
pub const SIZES: &[(&str, u64)] = &[
    ("num_hidden_layers", 1 << 16),
    ("num_nextn_predict_layers", 1 << 16),
    ("hidden_size", 1 << 24),
    ("intermediate_size", 1 << 24),
    ("intermediate_size_mlp", 1 << 24),
    ("moe_intermediate_size", 1 << 24),
    ("shared_expert_intermediate_size", 1 << 24),
    ("vocab_size", 1 << 24),
    ("head_dim", 1 << 24),
    ("num_attention_heads", 1 << 24),
    ("num_key_value_heads", 1 << 24),
    ("num_local_experts", 1 << 24),
    ("n_routed_experts", 1 << 24),
    ("num_experts", 1 << 24),
    ("num_experts_per_tok", 1 << 24),
    ("n_shared_experts", 1 << 24),
    ("kv_lora_rank", 1 << 24),
    ("q_lora_rank", 1 << 24),
    ("qk_rope_head_dim", 1 << 24),
    ("qk_nope_head_dim", 1 << 24),
    ("qk_head_dim", 1 << 24),
    ("v_head_dim", 1 << 24),
    ("index_topk", 1 << 24),
    ("index_head_dim", 1 << 24),
    ("index_n_heads", 1 << 24),
];

/// Refuses a key of `obj` that is neither read nor ignored and looks/// Refuses a key of `obj` that is neither read nor ignored and looks
/// architectural (`prefix` names the object, e.g. `text_config.`).
fn check_keys(name: &str, prefix: &str, obj: &Map<String, Value>) -> Result<(), ArchError> {
    for (k, v) in obj {
        if let Some(&(_, max)) = SIZES.iter().find(|(s, _)| s == k) {
            if v.as_u64().is_some_and(|n| n > max) {
                return Err(not_understood(
                    name,
                    &format!("{prefix}{k}"),
                    &format!("{v} is beyond any model (at most {max} is read)"),
                ));
            }
            continue;
        }
        if READ.contains(&k.as_str()) || IGNORED.contains(&k.as_str()) {
            continue;
        }
        let lower = k.to_lowercase();
        if ARCHITECTURAL_WORDS.iter().any(|w| lower.contains(w)) {
            return Err(not_understood(
                name,
                &format!("{prefix}{k}"),
                "an architecture field the latency models do not read",
            ));
        }
    }
    Ok(())
}

/// The context length vLLM derives from a Hugging Face config (vLLM's
/// `_get_and_verify_max_len`, `vllm/config.py`): the smallest of the
/// length keys present, times the RoPE scaling factor unless the scaling
/// type keeps the length (`su`, `longrope`, `llama3`, `dynamic`); a `yarn`
/// scaling multiplies its `original_max_position_embeddings`.
fn derived_max_len(c: &Value) -> Option<u32> {
    const KEYS: [&str; 8] = [
        "max_position_embeddings",
        "n_positions",
        "max_seq_len",
        "seq_length",
        "model_max_length",
        "max_sequence_length",
        "max_seq_length",
        "seq_len",
    ];
    let mut len = KEYS
        .iter()
        .filter_map(|k| c.get(*k).and_then(Value::as_f64))
        .filter(|v| v.is_finite() && *v >= 1.0)
        .fold(None::<f64>, |m, v| Some(m.map_or(v, |m| m.min(v))))?;
    if let Some(rs) = c.get("rope_scaling").filter(|v| v.is_object()) {
        let kind = rs
            .get("rope_type")
            .or_else(|| rs.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("");
        let factor = rs.get("factor").and_then(Value::as_f64).unwrap_or(1.0);
        if !matches!(kind, "su" | "longrope" | "llama3" | "dynamic")
            && factor.is_finite()
            && factor >= 1.0
        {
            if kind == "yarn"
                && let Some(o) = rs
                    .get("original_max_position_embeddings")
                    .and_then(Value::as_f64)
            {
                len = o;
            }
            len *= factor;
        }
    }
    Some(len.min(f64::from(u32::MAX)) as u32)
}

/// Precision of the parts of a model, from its dtype and quantization.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Precision {
    mlp_bytes: f64,
    attn_bytes: f64,
    lm_head_bytes: f64,
    mlp_fp8: bool,
    attn_fp8: bool,
    kv_bytes: f64,
}

fn dtype_bytes(name: &str, c: &Value, root: &Value) -> Result<f64, ArchError> {
    let dt = c
        .get("torch_dtype")
        .or_else(|| c.get("dtype"))
        .or_else(|| root.get("torch_dtype"))
        .or_else(|| root.get("dtype"))
        .filter(|v| !v.is_null());
    match dt.map(|v| v.as_str().unwrap_or("")) {
        None | Some("bfloat16" | "float16" | "half" | "bf16" | "fp16") => Ok(2.0),
        Some("float32" | "float" | "fp32") => Ok(4.0),
        Some(other) => Err(not_understood(
            name,
            "torch_dtype",
            &format!("dtype {other:?} is not float32, float16 or bfloat16"),
        )),
    }
}

/// Whether a module list (compressed-tensors `ignore`, fp8
/// `modules_to_not_convert`) names attention projections, the LM head, or
/// MLP/expert weights.
fn ignored_parts(list: &[Value]) -> (bool, bool, bool) {
    let (mut attn, mut head, mut mlp) = (false, false, false);
    for v in list {
        let s = v.as_str().unwrap_or("").to_lowercase();
        if s.contains("self_attn") || s.contains(".attn") || s.contains("attention") {
            attn = true;
        } else if s.contains("lm_head") {
            head = true;
        } else if s.contains("mlp")
            || s.contains("expert")
            || (s.contains("feed_forward") && !s.contains("router"))
        {
            mlp = true;
        }
    }
    (attn, head, mlp)
}

fn precision(name: &str, c: &Value, root: &Value) -> Result<Precision, ArchError> {
    let base = dtype_bytes(name, c, root)?;
    let mut p = Precision {
        mlp_bytes: base,
        attn_bytes: base,
        lm_head_bytes: base,
        mlp_fp8: false,
        attn_fp8: false,
        kv_bytes: base.min(2.0),
    };
    let Some(q) = root
        .get("quantization_config")
        .or_else(|| c.get("quantization_config"))
        .filter(|v| !v.is_null())
    else {
        return Ok(p);
    };
    let method = q
        .get("quant_method")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_lowercase();
    match method.as_str() {
        "fp8" => {
            let list: Vec<Value> = q
                .get("modules_to_not_convert")
                .or_else(|| q.get("ignored_layers"))
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let (attn, _, mlp) = ignored_parts(&list);
            if mlp {
                return Err(not_understood(
                    name,
                    "quantization_config.modules_to_not_convert",
                    "MLP or expert weights left unquantized",
                ));
            }
            p.mlp_bytes = 1.0;
            p.mlp_fp8 = true;
            if !attn {
                p.attn_bytes = 1.0;
                p.attn_fp8 = true;
            }
        }
        "compressed-tensors" => {
            let groups = q
                .get("config_groups")
                .and_then(Value::as_object)
                .filter(|g| !g.is_empty())
                .ok_or_else(|| {
                    not_understood(
                        name,
                        "quantization_config.config_groups",
                        "compressed-tensors without config groups",
                    )
                })?;
            let mut bits: Option<u64> = None;
            let mut act8 = true;
            for g in groups.values() {
                let b = g
                    .pointer("/weights/num_bits")
                    .and_then(Value::as_u64)
                    .ok_or_else(|| {
                        not_understood(
                            name,
                            "quantization_config.config_groups.*.weights.num_bits",
                            "missing or not an integer",
                        )
                    })?;
                if bits.is_some_and(|x| x != b) {
                    return Err(not_understood(
                        name,
                        "quantization_config.config_groups",
                        "groups with different weight bits",
                    ));
                }
                bits = Some(b);
                let a = g.get("input_activations").filter(|v| !v.is_null());
                act8 &= a
                    .and_then(|a| a.get("num_bits"))
                    .and_then(Value::as_u64)
                    .is_some_and(|n| n <= 8);
            }
            let bits = bits.unwrap_or(16);
            if !matches!(bits, 4 | 8) {
                return Err(not_understood(
                    name,
                    "quantization_config.config_groups.*.weights.num_bits",
                    &format!("{bits}-bit weights"),
                ));
            }
            let list: Vec<Value> = q
                .get("ignore")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            // Only the language model's modules count (a vision tower's are
            // not run for text).
            let text: Vec<Value> = list
                .into_iter()
                .filter(|v| !v.as_str().unwrap_or("").starts_with("vision"))
                .collect();
            let (attn, _, mlp) = ignored_parts(&text);
            if mlp {
                return Err(not_understood(
                    name,
                    "quantization_config.ignore",
                    "MLP or expert weights left unquantized",
                ));
            }
            let bytes = bits as f64 / 8.0;
            let fp8 = bits == 8 && act8;
            p.mlp_bytes = bytes;
            p.mlp_fp8 = fp8;
            if !attn {
                p.attn_bytes = bytes;
                p.attn_fp8 = fp8;
            }
            if let Some(kv) = q.get("kv_cache_scheme").filter(|v| !v.is_null()) {
                match kv.get("num_bits").and_then(Value::as_u64) {
                    Some(8) => p.kv_bytes = 1.0,
                    other => {
                        return Err(not_understood(
                            name,
                            "quantization_config.kv_cache_scheme",
                            &format!("{other:?}-bit KV cache"),
                        ));
                    }
                }
            }
        }
        "awq" | "gptq" => {
            let bits = q
                .get("bits")
                .or_else(|| q.get("w_bit"))
                .and_then(Value::as_u64)
                .unwrap_or(4);
            if !matches!(bits, 4 | 8) {
                return Err(not_understood(
                    name,
                    "quantization_config.bits",
                    &format!("{bits}-bit weights"),
                ));
            }
            p.mlp_bytes = bits as f64 / 8.0;
            p.attn_bytes = p.mlp_bytes;
        }
        other => {
            return Err(not_understood(
                name,
                "quantization_config.quant_method",
                &format!("{other:?} (known: fp8, compressed-tensors, awq, gptq)"),
            ));
        }
    }
    Ok(p)
}

/// Reads a list of layer indices (`moe_layers`, `mlp_only_layers`).
fn index_list(name: &str, c: &Value, key: &str) -> Result<Option<Vec<u64>>, ArchError> {
    match c.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| {
                v.as_u64()
                    .ok_or_else(|| not_understood(name, key, "not a list of layer indices"))
            })
            .collect::<Result<Vec<u64>, _>>()
            .map(Some),
        Some(_) => Err(not_understood(name, key, "not a list of layer indices")),
    }
}

/// Parses a Hugging Face `config.json` (multimodal configs use their
/// `text_config`).
///
/// # Errors
/// Invalid JSON; a missing or non-integer required field; a field that
/// changes the architecture in a way not understood (see the module docs),
/// each naming the field.
pub fn parse(name: &str, text: &str) -> Result<ModelArch, ArchError> {
    let root: Value = serde_json::from_str(text).map_err(|error| ArchError::Json {
        name: name.to_string(),
        error,
    })?;
    let text_cfg = root.get("text_config").filter(|v| v.is_object());
    let c = text_cfg.unwrap_or(&root);
    if let Some(o) = root.as_object() {
        check_keys(name, "", o)?;
    }
    if let Some(o) = text_cfg.and_then(Value::as_object) {
        check_keys(name, "text_config.", o)?;
    }
    let get = |k: &str| {
        c.get(k)
            .and_then(Value::as_u64)
            .map(|v| v.min(u64::from(u32::MAX)) as u32)
    };
    let need = |k: &str| {
        get(k).ok_or_else(|| ArchError::Missing {
            name: name.to_string(),
            field: k.to_string(),
        })
    };
    let layers = need("num_hidden_layers")?;
    let hidden = need("hidden_size")?;
    let heads = need("num_attention_heads")?;
    if heads == 0 || layers == 0 || hidden == 0 {
        return Err(ArchError::Empty {
            name: name.to_string(),
        });
    }
    let model_type = c.get("model_type").and_then(Value::as_str).unwrap_or("");
    let llama4 = model_type.starts_with("llama4") || c.get("interleave_moe_layer_step").is_some();
    let kv_heads = get("num_key_value_heads").unwrap_or(heads).max(1);
    let head_dim = get("head_dim").unwrap_or(hidden / heads);
    let intermediate_size = get("intermediate_size").unwrap_or_else(|| hidden.saturating_mul(4));
    let intermediate = if llama4 {
        get("intermediate_size_mlp").unwrap_or(intermediate_size)
    } else {
        intermediate_size
    };
    let experts = get("num_local_experts")
        .or_else(|| get("n_routed_experts"))
        .or_else(|| get("num_experts"))
        .unwrap_or(0);
    let experts = if experts > 1 { experts } else { 0 };
    let (experts_per_token, moe_layers) = if experts > 0 {
        let k = need("num_experts_per_tok")?.max(1);
        if k > experts {
            return Err(not_understood(
                name,
                "num_experts_per_tok",
                "more experts per token than experts",
            ));
        }
        let l = u64::from(layers);
        let listed = index_list(name, c, "moe_layers")?;
        let only = index_list(name, c, "mlp_only_layers")?.unwrap_or_default();
        let is_moe = |i: u64| -> bool {
            if let Some(list) = &listed {
                list.contains(&i)
            } else if let Some(step) = c
                .get("interleave_moe_layer_step")
                .and_then(Value::as_u64)
                .filter(|s| *s > 0)
            {
                (i + 1).is_multiple_of(step)
            } else if c.get("first_k_dense_replace").is_some() || c.get("moe_layer_freq").is_some()
            {
                let k = c
                    .get("first_k_dense_replace")
                    .and_then(Value::as_u64)
                    .unwrap_or(0);
                let f = c
                    .get("moe_layer_freq")
                    .and_then(Value::as_u64)
                    .unwrap_or(1)
                    .max(1);
                i >= k && i.is_multiple_of(f)
            } else {
                let s = c
                    .get("decoder_sparse_step")
                    .and_then(Value::as_u64)
                    .unwrap_or(1)
                    .max(1);
                !only.contains(&i) && (i + 1).is_multiple_of(s)
            }
        };
        (k, (0..l).filter(|&i| is_moe(i)).count() as u32)
    } else {
        (0, 0)
    };
    let expert_intermediate = if llama4 {
        intermediate_size
    } else {
        get("moe_intermediate_size").unwrap_or(intermediate_size)
    };
    let (shared_experts, shared_expert_intermediate) = if experts == 0 {
        (0, 0)
    } else if let Some(n) = get("n_shared_experts").filter(|n| *n > 0) {
        (n, expert_intermediate)
    } else if let Some(s) = get("shared_expert_intermediate_size").filter(|s| *s > 0) {
        (1, s)
    } else if llama4 {
        (1, intermediate_size)
    } else {
        (0, 0)
    };
    let mla = match get("kv_lora_rank") {
        Some(r) if r > 0 => {
            let m = Mla {
                q_lora_rank: get("q_lora_rank").unwrap_or(0),
                kv_lora_rank: r,
                qk_nope_head_dim: need("qk_nope_head_dim")?,
                qk_rope_head_dim: need("qk_rope_head_dim")?,
                v_head_dim: need("v_head_dim")?,
            };
            if let Some(q) = get("qk_head_dim")
                && q != m.qk_nope_head_dim + m.qk_rope_head_dim
            {
                return Err(not_understood(
                    name,
                    "qk_head_dim",
                    "not qk_nope_head_dim + qk_rope_head_dim",
                ));
            }
            Some(m)
        }
        _ => None,
    };
    let window = read_window(name, c, layers)?;
    let sparse_topk = match get("index_topk") {
        Some(k) if k > 0 => Some(SparseAttention {
            topk: k,
            index_heads: need("index_n_heads")?,
            index_head_dim: need("index_head_dim")?,
        }),
        _ => None,
    };
    let p = precision(name, c, &root)?;
    let act = c
        .get("hidden_act")
        .and_then(Value::as_str)
        .unwrap_or("silu");
    Ok(ModelArch {
        name: name.to_string(),
        layers,
        hidden,
        heads,
        kv_heads: if mla.is_some() { heads } else { kv_heads },
        head_dim,
        intermediate,
        vocab: get("vocab_size").unwrap_or(32000),
        experts,
        experts_per_token,
        shared_experts,
        expert_intermediate,
        shared_expert_intermediate,
        dense_layers: layers - moe_layers,
        mla_kv_width: mla.map_or(0, |m| m.kv_lora_rank + m.qk_rope_head_dim),
        mla,
        weight_bytes: p.mlp_bytes,
        attn_weight_bytes: p.attn_bytes,
        lm_head_bytes: p.lm_head_bytes,
        mlp_fp8_compute: p.mlp_fp8,
        attn_fp8_compute: p.attn_fp8,
        kv_bytes: p.kv_bytes,
        gated_mlp: matches!(
            act,
            "silu" | "swiglu" | "gelu_pytorch_tanh" | "geglu" | "gelu"
        ) || experts > 0,
        tied_embeddings: c
            .get("tie_word_embeddings")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        window,
        sparse_topk,
        mtp_layers: get("num_nextn_predict_layers").unwrap_or(0),
        max_context: derived_max_len(c),
    })
}

/// The attention window of the config (module docs), if any.
fn read_window(name: &str, c: &Value, layers: u32) -> Result<Option<AttentionWindow>, ArchError> {
    let get = |k: &str| c.get(k).and_then(Value::as_u64);
    if let Some(chunk) = get("attention_chunk_size").filter(|n| *n > 0) {
        // Llama-4: chunked attention on the layers that use RoPE.
        let rope_layers = match c.get("no_rope_layers").and_then(Value::as_array) {
            Some(a) if !a.is_empty() => {
                if a.len() != layers as usize {
                    return Err(not_understood(
                        name,
                        "no_rope_layers",
                        "not one flag per layer",
                    ));
                }
                a.iter().filter(|v| v.as_u64() == Some(1)).count() as u32
            }
            _ => {
                let every = get("no_rope_layer_interval").unwrap_or(4).max(1);
                (0..u64::from(layers))
                    .filter(|i| (i + 1) % every != 0)
                    .count() as u32
            }
        };
        return Ok(Some(AttentionWindow {
            tokens: chunk.min(u64::from(u32::MAX)) as u32,
            layers: rope_layers,
            chunked: true,
        }));
    }
    let Some(w) = get("sliding_window").filter(|n| *n > 0) else {
        if let Some(types) = c.get("layer_types").and_then(Value::as_array)
            && types
                .iter()
                .any(|t| t.as_str() == Some("sliding_attention"))
        {
            return Err(not_understood(
                name,
                "layer_types",
                "sliding-attention layers without a sliding_window",
            ));
        }
        return Ok(None);
    };
    let w = w.min(u64::from(u32::MAX)) as u32;
    if let Some(types) = c.get("layer_types").and_then(Value::as_array) {
        let n = types
            .iter()
            .filter(|t| t.as_str() == Some("sliding_attention"))
            .count() as u32;
        return Ok((n > 0).then_some(AttentionWindow {
            tokens: w,
            layers: n,
            chunked: false,
        }));
    }
    match c.get("use_sliding_window").and_then(Value::as_bool) {
        Some(false) => Ok(None),
        Some(true) => {
            let from = get("max_window_layers").unwrap_or(0).min(u64::from(layers)) as u32;
            Ok((layers > from).then_some(AttentionWindow {
                tokens: w,
                layers: layers - from,
                chunked: false,
            }))
        }
        None => Ok(Some(AttentionWindow {
            tokens: w,
            layers,
            chunked: false,
        })),
    }
}

/// What the latency models approximate of `a`, one line each (printed
/// with the settings' provenance): attention over a window or a sparse
/// selection is counted over the whole context (an upper bound beyond the
/// window), multi-token-prediction layers are not run.
pub fn approximations(a: &ModelArch) -> Vec<String> {
    let mut v = Vec::new();
    if let Some(w) = &a.window {
        v.push(format!(
            "{}: {} attention of {} tokens on {} layers counted over the whole context (exact up to {} tokens)",
            a.name,
            if w.chunked { "chunked" } else { "sliding-window" },
            w.tokens,
            w.layers,
            w.tokens
        ));
    }
    if let Some(s) = &a.sparse_topk {
        v.push(format!(
            "{}: sparse attention (top {}) counted as dense attention over the whole context, its indexer's own work not counted (exact up to {} tokens)",
            a.name, s.topk, s.topk
        ));
    }
    if a.mtp_layers > 0 {
        v.push(format!(
            "{}: {} multi-token-prediction layer(s) not run (no speculative decoding)",
            a.name, a.mtp_layers
        ));
    }
    v
}

/// Finds a model architecture: `config` (a folder with `config.json`, or the
/// file itself) when given, else the bundled config whose folder name
/// matches `model` (its last path segment, lower-cased; a trailing `-hf` or
/// `-instruct` is tolerated).
///
/// # Errors
/// An unreadable or malformed config; an unknown model (listing the bundled
/// ones).
pub fn find_model(model: Option<&str>, config: Option<&Path>) -> Result<ModelArch, ArchError> {
    if let Some(p) = config {
        let file: PathBuf = if p.is_dir() {
            p.join("config.json")
        } else {
            p.to_path_buf()
        };
        let text = blis_traces::text::read_text(&file).map_err(|error| ArchError::Read {
            path: file.clone(),
            error,
        })?;
        return parse(&file.display().to_string(), &text);
    }
    let model = model.ok_or(ArchError::NoModel)?;
    let key = model_key(model);
    let candidates = [
        key.clone(),
        format!("{key}-hf"),
        key.trim_end_matches("-hf").to_string(),
        format!("{key}-instruct"),
    ];
    for c in &candidates {
        if let Some((name, text)) = BUNDLED_MODELS.iter().find(|(n, _)| n == c) {
            return parse(name, text);
        }
    }
    Err(ArchError::NotBundled {
        model: model.to_string(),
        key,
        known: BUNDLED_MODELS.iter().map(|(n, _)| n.to_string()).collect(),
    })
}

/// The architecture of a model known only by the shape a run recorded
/// ([`blis_traces::ModelShape`], e.g. the vLLM ground truth's
/// `model_config`), read as the Hugging Face `config.json` of a Llama-style
/// decoder with those fields (`MixtralForCausalLM`'s routed experts when it
/// has more than one) would be, with `max_position_embeddings` from the
/// run's `max_model_len` when it gives one. What the shape does not say is
/// assumed as in those configs: 16-bit weights and KV cache, untied
/// embeddings, no sliding window, no shared experts
/// ([`SHAPE_ASSUMPTIONS`]).
///
/// # Errors
/// A shape the parser refuses (zero layers, hidden size or heads; more
/// experts per token than experts), as for a `config.json`; one recorded
/// with fields not understood ([`blis_traces::ModelShape::not_understood`]),
/// naming the first.
pub fn from_shape(
    shape: &blis_traces::ModelShape,
    max_model_len: Option<u64>,
) -> Result<ModelArch, ArchError> {
    const NAME: &str = "the run's recorded model_config";
    if let Some(field) = shape.not_understood.first() {
        return Err(not_understood(
            NAME,
            field,
            "recorded beside the shape and not understood, so the shape alone may misdescribe the model (give --model-config)",
        ));
    }
    let moe = shape.num_local_experts > 1;
    let mut c = serde_json::json!({
        "architectures": [if moe { "MixtralForCausalLM" } else { "LlamaForCausalLM" }],
        "model_type": if moe { "mixtral" } else { "llama" },
        "num_hidden_layers": shape.num_hidden_layers,
        "hidden_size": shape.hidden_size,
        "num_attention_heads": shape.num_attention_heads,
        "num_key_value_heads": shape.num_key_value_heads,
        "intermediate_size": shape.intermediate_size,
        "vocab_size": shape.vocab_size,
        "torch_dtype": "float16",
        "tie_word_embeddings": false,
    });
    if moe {
        c["num_local_experts"] = shape.num_local_experts.into();
        c["num_experts_per_tok"] = shape.num_experts_per_tok.into();
    }
    if let Some(n) = max_model_len.filter(|n| *n > 0) {
        c["max_position_embeddings"] = n.into();
    }
    parse(NAME, &c.to_string())
}

/// What [`from_shape`] assumes of a model it knows only by its shape.
pub const SHAPE_ASSUMPTIONS: &str =
    "16-bit weights and KV cache, untied embeddings, no sliding window, no shared experts";

/// The architecture table of `models` as Markdown (one row per model; the
/// columns of `docs/architectures.md`).
pub fn table(models: &[ModelArch]) -> String {
    let mut o = String::from(
        "| model | layers: dense + MoE | routed experts / per token / shared (size) | MLP size: dense / expert | attention | KV bytes per token | vocab | tied LM head | window | weight bytes: MLP / attention / LM head | KV bytes per element | not run |\n\
         |---|---|---|---|---|---:|---:|---|---|---|---:|---|\n",
    );
    for a in models {
        let experts = if a.experts == 0 {
            "–".to_string()
        } else if a.shared_experts > 0 {
            format!(
                "{} / {} / {} ({})",
                a.experts, a.experts_per_token, a.shared_experts, a.shared_expert_intermediate
            )
        } else {
            format!("{} / {} / 0", a.experts, a.experts_per_token)
        };
        let mlp = if a.experts == 0 {
            format!("{} / –", a.intermediate)
        } else if a.dense_layers == 0 {
            format!("– / {}", a.expert_intermediate)
        } else {
            format!("{} / {}", a.intermediate, a.expert_intermediate)
        };
        let attention = match &a.mla {
            Some(m) => format!(
                "MLA: {} heads, q rank {}, kv rank {}, qk {}+{}, v {}",
                a.heads,
                if m.q_lora_rank > 0 {
                    m.q_lora_rank.to_string()
                } else {
                    "–".into()
                },
                m.kv_lora_rank,
                m.qk_nope_head_dim,
                m.qk_rope_head_dim,
                m.v_head_dim
            ),
            None => format!(
                "{} heads, {} KV heads, head dim {}",
                a.heads, a.kv_heads, a.head_dim
            ),
        };
        let window = match (&a.window, &a.sparse_topk) {
            (Some(w), _) => format!(
                "{} {} on {} layers",
                if w.chunked { "chunked" } else { "sliding" },
                w.tokens,
                w.layers
            ),
            (None, Some(s)) => format!(
                "sparse: top {} (indexer {}×{})",
                s.topk, s.index_heads, s.index_head_dim
            ),
            (None, None) => "–".into(),
        };
        let fp8 = |b: f64, fp8: bool| {
            if fp8 {
                format!("{b} (FP8 GEMM)")
            } else {
                format!("{b}")
            }
        };
        let not_run = if a.mtp_layers > 0 {
            format!("{} MTP layer(s)", a.mtp_layers)
        } else {
            "–".into()
        };
        o.push_str(&format!(
            "| `{}` | {} + {} | {} | {} | {} | {} | {} | {} | {} | {} / {} / {} | {} | {} |\n",
            a.name,
            a.dense_layers,
            a.moe_layers(),
            experts,
            mlp,
            attention,
            a.kv_bytes_per_token(),
            a.vocab,
            if a.tied_embeddings { "yes" } else { "no" },
            window,
            fp8(a.weight_bytes, a.mlp_fp8_compute),
            fp8(a.attn_weight_bytes, a.attn_fp8_compute),
            a.lm_head_bytes,
            a.kv_bytes,
            not_run
        ));
    }
    o
}

/// [`table`] of the bundled configs (`replay/model-configs/`).
pub fn bundled_table() -> String {
    let models: Vec<ModelArch> = BUNDLED_MODELS
        .iter()
        .map(|(n, t)| parse(n, t).expect("bundled configs parse"))
        .collect();
    table(&models)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(name: &str) -> ModelArch {
        find_model(Some(name), None).unwrap()
    }

    /// A model known only by the shape its run recorded reads as its
    /// config.json does: for the four models of the vLLM ground truth, the
    /// shapes of their `replay_data` files give the bundled configs'
    /// architectures field for field (but the name, and the context length,
    /// which the run's `max_model_len` gives instead).
    #[test]
    fn a_recorded_shape_reads_as_the_models_config() {
        let shape = |l, h, q, kv, i, e, k| blis_traces::ModelShape {
            num_hidden_layers: l,
            hidden_size: h,
            num_attention_heads: q,
            num_key_value_heads: kv,
            intermediate_size: i,
            vocab_size: 32000,
            num_local_experts: e,
            num_experts_per_tok: k,
            not_understood: Vec::new(),
        };
        for (model, s) in [
            (
                "meta-llama/Llama-2-7b-hf",
                shape(32, 4096, 32, 32, 11008, 0, 0),
            ),
            (
                "meta-llama/Llama-2-70b-hf",
                shape(80, 8192, 64, 8, 28672, 0, 0),
            ),
            (
                "mistralai/Mixtral-8x7B-v0.1",
                shape(32, 4096, 32, 8, 14336, 8, 2),
            ),
            (
                "codellama/CodeLlama-34b-Instruct-hf",
                shape(48, 8192, 64, 8, 22016, 0, 0),
            ),
        ] {
            let bundled = m(model);
            let mut a = from_shape(&s, Some(4096)).unwrap();
            assert_eq!(a.max_context, Some(4096), "{model}");
            a.name = bundled.name.clone();
            a.max_context = bundled.max_context;
            assert_eq!(a, bundled, "{model}");
        }
        // A shape the parser refuses is refused as a config would be.
        let e = from_shape(&shape(32, 4096, 32, 8, 14336, 8, 9), None).unwrap_err();
        assert!(e.to_string().contains("num_experts_per_tok"), "{e}");
        // A field recorded beside the shape that nothing reads is named,
        // never dropped.
        let mut s = shape(32, 4096, 32, 8, 14336, 0, 0);
        s.not_understood = vec!["head_dim".into()];
        let e = from_shape(&s, None).unwrap_err().to_string();
        assert!(e.contains("`head_dim`"), "{e}");
    }

    /// Any integer field of a bundled config set to an absurd size
    /// (4,000,000,000) is read without a panic (debug builds check
    /// overflow), and the derived sizes stay numbers: a hostile config is
    /// refused later by what it implies (a step beyond a year), not by a
    /// crash here.
    #[test]
    fn absurd_sizes_in_any_field_do_not_panic() {
        for (name, text) in BUNDLED_MODELS {
            let root: Value = serde_json::from_str(text).unwrap();
            let paths: Vec<(Option<&str>, String)> = root
                .as_object()
                .unwrap()
                .iter()
                .flat_map(|(k, v)| match v {
                    Value::Number(_) => vec![(None, k.clone())],
                    Value::Object(o) if k == "text_config" => o
                        .iter()
                        .filter(|(_, v)| v.is_number())
                        .map(|(k2, _)| (Some("text_config"), k2.clone()))
                        .collect(),
                    _ => vec![],
                })
                .collect();
            for (parent, key) in paths {
                let mut v = root.clone();
                let slot = match parent {
                    Some(p) => &mut v[p][&key],
                    None => &mut v[&key],
                };
                if !slot.is_u64() {
                    continue;
                }
                *slot = 4_000_000_000u64.into();
                let r = parse(name, &v.to_string());
                if SIZES.iter().any(|(s, _)| *s == key) {
                    let e = r
                        .as_ref()
                        .err()
                        .map(ToString::to_string)
                        .unwrap_or_default();
                    assert!(e.contains("is beyond any model"), "{name} {key}: {e}");
                }
                if let Ok(a) = r {
                    let w = a.resident_weight_bytes();
                    let kv = a.kv_bytes_per_token();
                    assert!(!w.is_nan() && !kv.is_nan(), "{name} {key}");
                }
            }
        }
    }

    /// (dense layers, MoE layers), (experts, per token, shared, shared
    /// size), (dense MLP, expert MLP), KV bytes per token, vocab.
    type Row = ((u32, u32), (u32, u32, u32, u32), (u32, u32), f64, u32);

    fn row(a: &ModelArch) -> Row {
        (
            (a.dense_layers, a.moe_layers()),
            (
                a.experts,
                a.experts_per_token,
                a.shared_experts,
                a.shared_expert_intermediate,
            ),
            (a.intermediate, a.expert_intermediate),
            a.kv_bytes_per_token(),
            a.vocab,
        )
    }

    /// Each bundled config, read as Hugging Face defines its fields; KV
    /// bytes per token = 2 (K, V) × KV heads × head dim × layers × bytes,
    /// or for MLA (kv_lora_rank + qk_rope_head_dim) × layers × bytes.
    #[test]
    fn every_bundled_architecture_is_read_as_hugging_face_means_it() {
        let dense = |l: u32, i: u32, kvh: f64, hd: f64, v: u32| -> Row {
            (
                (l, 0),
                (0, 0, 0, 0),
                (i, i),
                2.0 * kvh * hd * f64::from(l) * 2.0,
                v,
            )
        };
        // (config, layers, MLP size, KV heads, head dim, vocabulary).
        for (name, l, i, kvh, hd, v) in [
            ("codellama-34b-instruct-hf", 48, 22016, 8.0, 128.0, 32000),
            ("llama-2-70b-hf", 80, 28672, 8.0, 128.0, 32000),
            ("llama-2-7b-hf", 32, 11008, 32.0, 128.0, 32000),
            ("llama-3.1-70b-instruct", 80, 28672, 8.0, 128.0, 128256),
            ("llama-3.1-8b-instruct", 32, 14336, 8.0, 128.0, 128256),
            // head_dim 128 given, not hidden / heads = 160.
            ("mistral-nemo-instruct-2407", 40, 14336, 8.0, 128.0, 131072),
            // 3584 / 28 heads = 128.
            ("qwen2.5-7b-instruct", 28, 18944, 4.0, 128.0, 152064),
            ("qwen3-14b", 40, 17408, 8.0, 128.0, 151936),
            ("yi-34b", 60, 20480, 8.0, 128.0, 64000),
        ] {
            assert_eq!(row(&m(name)), dense(l, i, kvh, hd, v), "{name}");
        }
        // Mixtral: every layer MoE, 8 experts of 14336, 2 per token.
        assert_eq!(
            row(&m("mixtral-8x7b-v0.1")),
            ((0, 32), (8, 2, 0, 0), (14336, 14336), 131072.0, 32000)
        );
        // Qwen3-MoE: decoder_sparse_step 1 and no mlp_only_layers: every
        // layer MoE; 128 experts of moe_intermediate_size 768, 8 per token.
        assert_eq!(
            row(&m("qwen3-30b-a3b")),
            (
                (0, 48),
                (128, 8, 0, 0),
                (6144, 768),
                2.0 * 4.0 * 128.0 * 48.0 * 2.0,
                151936
            )
        );
        // DeepSeek-V2-Lite: first_k_dense_replace 1, moe_layer_freq 1 → 1
        // dense + 26 MoE; 2 shared experts of moe_intermediate_size; MLA
        // caches 512 + 64 per token and layer.
        assert_eq!(
            row(&m("deepseek-v2-lite")),
            (
                (1, 26),
                (64, 6, 2, 1408),
                (10944, 1408),
                576.0 * 27.0 * 2.0,
                102400
            )
        );
        // GLM-5.2: 3 dense + 75 MoE, 1 shared expert, MLA, 16-bit KV (no
        // kv_cache_scheme), one multi-token-prediction layer not run.
        let g = m("glm-5.2-fp8");
        assert_eq!(
            row(&g),
            (
                (3, 75),
                (256, 8, 1, 2048),
                (12288, 2048),
                576.0 * 78.0 * 2.0,
                154880
            )
        );
        assert_eq!(g.mtp_layers, 1);
        assert_eq!(
            g.sparse_topk,
            Some(SparseAttention {
                topk: 2048,
                index_heads: 32,
                index_head_dim: 128
            })
        );
        assert_eq!(
            g.mla,
            Some(Mla {
                q_lora_rank: 2048,
                kv_lora_rank: 512,
                qk_nope_head_dim: 192,
                qk_rope_head_dim: 64,
                v_head_dim: 256
            })
        );
        // quant_method fp8: every linear layer 8-bit with 8-bit GEMMs, the
        // LM head 16-bit.
        assert_eq!(
            (
                g.weight_bytes,
                g.attn_weight_bytes,
                g.lm_head_bytes,
                g.mlp_fp8_compute,
                g.attn_fp8_compute
            ),
            (1.0, 1.0, 2.0, true, true)
        );
        for name in ["llama-2-7b-hf", "qwen3-14b", "mixtral-8x7b-v0.1", "yi-34b"] {
            let a = m(name);
            assert_eq!(
                (
                    a.weight_bytes,
                    a.attn_weight_bytes,
                    a.lm_head_bytes,
                    a.kv_bytes,
                    a.tied_embeddings
                ),
                (2.0, 2.0, 2.0, 2.0, false),
                "{name}"
            );
        }
        // Qwen2.5 carries sliding_window 131072 with use_sliding_window
        // false: no window; Mistral-Nemo's is null.
        assert_eq!(m("qwen2.5-7b-instruct").window, None);
        assert_eq!(m("mistral-nemo-instruct-2407").window, None);
    }

    /// Llama-4 Scout: `interleave_moe_layer_step: 1` makes all 48 layers
    /// MoE (it was read as 24 dense + 24 MoE); each MoE layer has 16
    /// experts of `intermediate_size` 8192, 1 per token, and one shared
    /// expert of the same size; RoPE layers (all but every fourth) use
    /// 8192-token chunked attention; compressed-tensors FP8 weights and
    /// activations, but attention, routers and the LM head are in the
    /// `ignore` list (16-bit).
    #[test]
    fn llama_4_scout_is_every_layer_moe_with_a_shared_expert_and_16_bit_attention() {
        let s = m("llama-4-scout-17b-16e-instruct-fp8-dynamic");
        assert_eq!(
            row(&s),
            (
                (0, 48),
                (16, 1, 1, 8192),
                (16384, 8192),
                2.0 * 8.0 * 128.0 * 48.0 * 2.0,
                202048
            )
        );
        assert_eq!(
            s.window,
            Some(AttentionWindow {
                tokens: 8192,
                layers: 36,
                chunked: true
            })
        );
        assert_eq!(
            (
                s.weight_bytes,
                s.attn_weight_bytes,
                s.lm_head_bytes,
                s.mlp_fp8_compute,
                s.attn_fp8_compute
            ),
            (1.0, 2.0, 2.0, true, false)
        );
        // 109B parameters: 48 × (16 + 1) experts of 3 × 5120 × 8192, the
        // attention (40 + 2·8 + 40 heads of 128 by 5120), routers, and the
        // untied embedding and LM head.
        let experts = 48.0 * 17.0 * 3.0 * 5120.0 * 8192.0;
        let attn = 48.0 * (5120.0 * 128.0 * (40.0 + 16.0 + 40.0) + 5120.0 * 16.0);
        let vocab = 2.0 * 5120.0 * 202048.0;
        let bytes = experts * 1.0 + attn * 2.0 + vocab * 2.0;
        assert!(
            (s.resident_weight_bytes() - bytes).abs() < 1.0,
            "{} vs {bytes}",
            s.resident_weight_bytes()
        );
        assert!((100e9..115e9).contains(&(experts + attn + vocab)));
    }

    fn parse_with(extra: &str) -> Result<ModelArch, ArchError> {
        let text = format!(
            r#"{{"num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 4, "intermediate_size": 512{extra}}}"#
        );
        parse("test.json", &text)
    }

    #[test]
    fn an_architecture_field_not_understood_is_an_error_naming_it() {
        for (extra, field) in [
            (
                r#", "num_cross_attention_layers": 2"#,
                "num_cross_attention_layers",
            ),
            (r#", "linear_attention_heads": 8"#, "linear_attention_heads"),
            (
                r#", "quantization_config": {"quant_method": "bitsandbytes"}"#,
                "quant_method",
            ),
            (r#", "torch_dtype": "int4""#, "torch_dtype"),
            (
                r#", "kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32, "qk_head_dim": 40"#,
                "qk_head_dim",
            ),
            (
                r#", "quantization_config": {"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {"num_bits": 8}}}, "ignore": ["model.layers.0.mlp.down_proj"]}"#,
                "quantization_config.ignore",
            ),
            (r#", "layer_types": ["sliding_attention"]"#, "layer_types"),
            (
                r#", "num_local_experts": 4, "num_experts_per_tok": 8"#,
                "num_experts_per_tok",
            ),
        ] {
            let e = parse_with(extra).unwrap_err().to_string();
            assert!(e.starts_with("test.json: `"), "{e}");
            assert!(e.contains(field), "{extra}: {e}");
            assert!(!e.contains('\n'), "{e}");
        }
        // Keys known to leave the step unchanged, and unknown keys that do
        // not look architectural, are fine.
        let a =
            parse_with(r#", "rms_norm_eps": 1e-6, "rope_theta": 10000, "my_tokenizer_note": "x""#)
                .unwrap();
        assert_eq!((a.layers, a.kv_heads, a.head_dim), (4, 4, 64));
        // An MoE config without experts per token names the field.
        let e = parse_with(r#", "num_local_experts": 4"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("num_experts_per_tok"), "{e}");
    }

    #[test]
    fn windows_precision_and_moe_layer_schemes_follow_each_family() {
        // Mistral: sliding_window on every layer.
        let a = parse_with(r#", "sliding_window": 4096"#).unwrap();
        assert_eq!(
            a.window,
            Some(AttentionWindow {
                tokens: 4096,
                layers: 4,
                chunked: false
            })
        );
        // Qwen2: layers from max_window_layers on.
        let a = parse_with(
            r#", "sliding_window": 4096, "use_sliding_window": true, "max_window_layers": 3"#,
        )
        .unwrap();
        assert_eq!(a.window.map(|w| w.layers), Some(1));
        // layer_types.
        let a = parse_with(
            r#", "sliding_window": 512, "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]"#,
        )
        .unwrap();
        assert_eq!(a.window.map(|w| (w.tokens, w.layers)), Some((512, 2)));
        // DeepSeek: first_k_dense_replace and moe_layer_freq 2 → layers 2
        // (MoE), 3 (dense): 1 MoE of 4.
        let a = parse_with(
            r#", "n_routed_experts": 8, "num_experts_per_tok": 2, "first_k_dense_replace": 2, "moe_layer_freq": 2"#,
        )
        .unwrap();
        assert_eq!((a.dense_layers, a.moe_layers()), (3, 1));
        // Qwen-MoE: decoder_sparse_step 2 and mlp_only_layers [1]: layers
        // 1 and 3 are (i+1) % 2 == 0, layer 1 is MLP-only → 1 MoE layer.
        let a = parse_with(
            r#", "num_experts": 8, "num_experts_per_tok": 2, "decoder_sparse_step": 2, "mlp_only_layers": [1], "shared_expert_intermediate_size": 128"#,
        )
        .unwrap();
        assert_eq!((a.dense_layers, a.moe_layers()), (3, 1));
        assert_eq!((a.shared_experts, a.shared_expert_intermediate), (1, 128));
        // Llama-4 interleave step 2: layers 1 and 3.
        let a = parse_with(
            r#", "model_type": "llama4_text", "num_local_experts": 4, "num_experts_per_tok": 1, "interleave_moe_layer_step": 2, "intermediate_size_mlp": 1024"#,
        )
        .unwrap();
        assert_eq!(
            (
                a.dense_layers,
                a.moe_layers(),
                a.intermediate,
                a.expert_intermediate
            ),
            (2, 2, 1024, 512)
        );
        // Weight-only 4-bit: half a byte, 16-bit GEMMs; an 8-bit KV scheme.
        let a =
            parse_with(r#", "quantization_config": {"quant_method": "awq", "bits": 4}"#).unwrap();
        assert_eq!(
            (a.weight_bytes, a.attn_weight_bytes, a.mlp_fp8_compute),
            (0.5, 0.5, false)
        );
        let a = parse_with(
            r#", "quantization_config": {"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {"num_bits": 8}, "input_activations": {"num_bits": 8}}}, "kv_cache_scheme": {"num_bits": 8}}"#,
        )
        .unwrap();
        assert_eq!(
            (a.weight_bytes, a.mlp_fp8_compute, a.kv_bytes),
            (1.0, true, 1.0)
        );
        assert_eq!(a.kv_bytes_per_token(), 2.0 * 4.0 * 64.0 * 4.0);
        let a = parse_with(r#", "torch_dtype": "float32", "tie_word_embeddings": true"#).unwrap();
        assert_eq!(
            (a.weight_bytes, a.kv_bytes, a.tied_embeddings),
            (4.0, 2.0, true)
        );
    }

    #[test]
    fn every_bundled_config_parses() {
        for (name, text) in BUNDLED_MODELS {
            let a = parse(name, text).unwrap();
            assert!(a.kv_bytes_per_token() > 0.0, "{name}");
        }
    }

    #[test]
    fn architectures_are_read_as_documented() {
        let l = find_model(Some("meta-llama/Llama-2-7b-hf"), None).unwrap();
        assert_eq!(
            (l.layers, l.hidden, l.heads, l.kv_heads, l.head_dim),
            (32, 4096, 32, 32, 128)
        );
        // 2 (K,V) × 32 heads × 128 × 32 layers × 2 bytes = 512 KiB per token.
        assert_eq!(l.kv_bytes_per_token(), 524_288.0);
        let m = find_model(Some("mistralai/Mixtral-8x7B-v0.1"), None).unwrap();
        assert_eq!((m.experts, m.experts_per_token, m.dense_layers), (8, 2, 0));
        // interleave_moe_layer_step 1: every layer is MoE (HF
        // Llama4TextConfig: moe_layers = range(step - 1, 48, step)).
        let s = find_model(Some("llama-4-scout-17b-16e-instruct-fp8-dynamic"), None).unwrap();
        assert_eq!((s.experts, s.dense_layers, s.weight_bytes), (16, 0, 1.0));
        let d = find_model(Some("deepseek-v2-lite"), None).unwrap();
        assert_eq!(
            (d.mla_kv_width, d.dense_layers, d.shared_experts),
            (576, 1, 2)
        );
        assert!(
            find_model(Some("gpt-9"), None)
                .unwrap_err()
                .to_string()
                .contains("Bundled:")
        );
    }
}
