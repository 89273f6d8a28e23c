//! Resolving an instance's settings and latency model from command-line
//! flags, a trace header and the bundled data: flags win over the header,
//! which wins over defaults.

use std::path::PathBuf;

use blis_traces::{Hardware as HeaderHardware, ServerConfig, TraceHeader};

use crate::engine::instance::EngineConfig;
use crate::engine::kv_tier::{CpuTierConfig, CpuTierSettings};
use crate::engine::queue_order::SchedulerPolicy;
use crate::error::{ReplayError, Result};
use crate::latency::arch::{Hardware, ModelArch};
use crate::latency::coefficients::{CoefficientsError, CoefficientsFile, LatencyKind};
use crate::latency::hf_config::find_model;
use crate::latency::physics::{BlisPhysics, HostOverheads, PhysicsBasis, TrainedPhysics};
use crate::latency::roofline::{Roofline, RooflineParams};
use crate::latency::{Blackbox, Model};

/// The largest `block_size` accepted, tokens. vLLM's attention backends
/// take 1 to 128; for hybrid attention/Mamba models it raises the
/// attention block size to match the Mamba state's page (a few thousand
/// tokens). Each instance keeps a list per block position.
pub const MAX_BLOCK_SIZE: u32 = 65_536;

pub use crate::error::SettingsError;

/// Everything that can be set about a simulated server.
#[derive(Debug, Clone, Default)]
pub struct ServerArgs {
    /// Model id.
    pub model: Option<String>,
    /// The serving engine whose behaviour to simulate: `vllm` (default),
    /// `sglang`, `openai`, or `llamacpp` (llama.cpp's slots; see
    /// [`is_llamacpp`]); None: the trace header's.
    pub server_type: Option<String>,
    /// Latency model (None: blackbox if a coefficients row exists, else
    /// roofline).
    pub latency: Option<LatencyKind>,
    /// Coefficients file (None: bundled).
    pub coefficients: Option<PathBuf>,
    /// Coefficient rows given directly (take precedence over
    /// `coefficients`), e.g. by a fitter trying candidates.
    pub coefficient_rows: Option<CoefficientsFile>,
    /// Model config.json or folder; read whenever given (an unreadable
    /// or invalid one is an error even under a latency model that needs
    /// no architecture).
    pub model_config: Option<PathBuf>,
    /// GPU name.
    pub hardware: Option<String>,
    /// hardware_config.json.
    pub hardware_config: Option<PathBuf>,
    /// Tensor parallelism.
    pub tp: Option<u32>,
    /// `--max-num-seqs`.
    pub max_num_seqs: Option<u32>,
    /// `--max-num-batched-tokens`.
    pub max_num_batched_tokens: Option<u32>,
    /// `--block-size`.
    pub block_size: Option<u32>,
    /// KV blocks.
    pub total_kv_blocks: Option<u32>,
    /// `--long-prefill-token-threshold`.
    pub long_prefill_token_threshold: Option<u32>,
    /// `--max-model-len`.
    pub max_model_len: Option<u32>,
    /// `--gpu-memory-utilization`, for the KV estimate.
    pub gpu_memory_utilization: Option<f64>,
    /// Scheduler.
    pub scheduler: SchedulerPolicy,
    /// Prefix caching.
    pub prefix_caching: bool,
    /// Fast-forward.
    pub fast_forward: bool,
    /// vLLM's `--async-scheduling` (None: the trace header's, else the
    /// default of the vLLM version it names, else the coefficients row's,
    /// else off).
    pub async_scheduling: Option<bool>,
    /// vLLM's `--enable-chunked-prefill` (None: the trace header's, else
    /// on, as vLLM V1).
    pub chunked_prefill: Option<bool>,
    /// A CPU tier under the GPU KV cache (None: GPU only).
    pub kv_tier: Option<CpuTierSettings>,
}

/// The CPU tier of `args` for blocks of `block_size` tokens of `arch`.
///
/// # Errors
/// A setting out of range, or no block size in bytes (neither given nor a
/// model config).
fn cpu_tier_config(
    args: &CpuTierSettings,
    arch: Option<&ModelArch>,
    block_size: u32,
    prov: &mut Vec<String>,
) -> Result<CpuTierConfig> {
    let block_bytes = match (args.block_bytes, arch) {
        (Some(b), _) => b,
        (None, Some(a)) => a.kv_bytes_per_token() * f64::from(block_size),
        (None, None) => {
            return Err(SettingsError::KvTier(
                "the size of a KV block in bytes needs the model's config: give --model-config or --kv-block-bytes".into(),
            )
            .into());
        }
    };
    let cfg = CpuTierConfig {
        policy: args.offload_policy,
        cpu_blocks: args.cpu_blocks,
        offload_threshold: args.offload_threshold,
        transfer_bandwidth_gb_s: args.transfer_bandwidth_gb_s,
        transfer_base_latency_us: args.transfer_base_latency_us,
        block_bytes,
        thrashing_window_us: args.thrashing_window_us,
    };
    cfg.validate().map_err(SettingsError::KvTier)?;
    prov.push(format!(
        "kv cpu tier: {} blocks of {} bytes, offload above {} GPU usage, {} GB/s + {} µs per transfer",
        cfg.cpu_blocks,
        cfg.block_bytes,
        cfg.offload_threshold,
        cfg.transfer_bandwidth_gb_s,
        cfg.transfer_base_latency_us
    ));
    Ok(cfg)
}

/// The resolved server: settings, latency model, and how they were found.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// Instance settings.
    pub engine: EngineConfig,
    /// Latency model.
    pub latency: Model,
    /// Model id (may be empty).
    pub model: String,
    /// GPU name.
    pub gpu: String,
    /// Tensor parallelism.
    pub tp: u32,
    /// Where each setting came from, e.g. `total_kv_blocks=7462 (trace header)`.
    pub provenance: Vec<String>,
    /// KV-cache bytes per token of the model (all layers), when its config
    /// is known (for KV transfers between instances).
    pub kv_bytes_per_token: Option<f64>,
}

impl Resolved {
    /// Name of the latency model.
    pub fn latency_name(&self) -> &'static str {
        use crate::latency::LatencyModel;
        self.latency.name()
    }

    /// The header `server`/`hardware` sections describing this server.
    pub fn header_sections(&self) -> (ServerConfig, HeaderHardware) {
        let e = &self.engine;
        (
            ServerConfig {
                server_type: Some("blis-replay".into()),
                model: (!self.model.is_empty()).then(|| self.model.clone()),
                tensor_parallel: Some(self.tp),
                max_num_seqs: Some(e.max_num_seqs),
                max_num_batched_tokens: Some(e.max_num_batched_tokens),
                block_size: Some(e.block_size),
                gpu_memory_utilization: None,
                max_model_len: (e.max_model_len > 0).then_some(u64::from(e.max_model_len)),
                total_kv_blocks: Some(u64::from(e.total_kv_blocks)),
                async_scheduling: e.async_scheduling.then_some(true),
                enable_prefix_caching: Some(e.prefix_caching),
                enable_chunked_prefill: Some(e.chunked_prefill),
                ..ServerConfig::default()
            },
            HeaderHardware {
                gpu: Some(self.gpu.clone()),
                gpu_count: Some(self.tp),
            },
        )
    }
}

/// GiB of a GPU's memory that CUDA keeps from PyTorch (the driver's
/// reserve): an H100 80GB, 80 GiB in the hardware table, shows PyTorch
/// 79.18 GiB (vLLM v0.11.0's start-up log, "Free memory on device").
pub const DRIVER_RESERVE_GIB: f64 = 0.82;

/// Bytes of vLLM's profiling peak ("torch peak memory increase") per
/// batched token and vocabulary entry: the profile run takes
/// `max_num_batched_tokens` tokens to the logits, held in FP32 and more.
/// From vLLM v0.11.0's logs on H100 at its default 8,192 batched tokens
/// (Qwen3-0.6B 5.56 GiB, Qwen3-32B 5.64, Llama-3.1-8B 4.76,
/// Llama-3.3-70B-FP8 at TP 2 4.84, gpt-oss-20b 7.38): 4.80–4.95 bytes,
/// whatever the model's size, TP or MoE layers.
pub const PROFILE_BYTES_PER_TOKEN_AND_VOCAB: f64 = 4.86;

/// GiB per GPU outside PyTorch's allocator once the model ran (cuBLAS
/// workspaces; NCCL and custom all-reduce buffers at TP > 1): 0.13 at TP 1,
/// 0.55 at TP 2 (vLLM v0.11.0, "non-torch forward increase memory").
pub fn non_torch_gib(tp: u32) -> f64 {
    if tp > 1 { 0.55 } else { 0.13 }
}

/// KV blocks vLLM V1 allocates on `tp` GPUs of `hw` at `util`, as its
/// start-up profile sizes them (`gpu_worker.determine_available_memory`):
/// per GPU, its memory less the driver's reserve ([`DRIVER_RESERVE_GIB`])
/// times `util`, less the weights' share, the profile run's peak
/// ([`PROFILE_BYTES_PER_TOKEN_AND_VOCAB`] × `max_num_batched_tokens` ×
/// vocabulary) and the memory outside PyTorch ([`non_torch_gib`]), divided
/// by a block's bytes on one GPU (KV heads split by TP, replicated when
/// fewer than `tp`; an MLA latent on every GPU). Checked against the block
/// counts vLLM logged for the four models of the ground-truth runs (within
/// 0.3%) and the KV sizes of vLLM v0.11.0's logs (within 2%).
pub fn estimate_kv_blocks(
    arch: &ModelArch,
    hw: &Hardware,
    tp: u32,
    util: f64,
    block_size: u32,
    max_num_batched_tokens: u32,
) -> u32 {
    const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
    let a = arch;
    let tp = tp.max(1);
    let visible = (hw.memory_gib - DRIVER_RESERVE_GIB).max(0.0) * GIB;
    let profile =
        PROFILE_BYTES_PER_TOKEN_AND_VOCAB * f64::from(max_num_batched_tokens) * f64::from(a.vocab);
    let free = visible * util
        - a.resident_weight_bytes() / f64::from(tp)
        - profile
        - non_torch_gib(tp) * GIB;
    let per_block = a.kv_bytes_per_token_per_gpu(tp) * f64::from(block_size);
    if free <= 0.0 || per_block <= 0.0 {
        0
    } else {
        (free / per_block).min(f64::from(u32::MAX)) as u32
    }
}

/// [`pick`] for a count kept in 32 bits: a value beyond `u32::MAX` (a
/// hostile or mistyped header) saturates instead of wrapping.
fn pick_u32(
    prov: &mut Vec<String>,
    name: &str,
    flag: Option<u32>,
    hdr: Option<u64>,
    default: u32,
) -> u32 {
    pick(
        prov,
        name,
        flag.map(u64::from),
        hdr,
        Some(u64::from(default)),
    )
    .map_or(default, |v| u32::try_from(v).unwrap_or(u32::MAX))
}

/// [`pick_u32`] whose default names where it comes from (`default.1`) in
/// the run's settings.
fn pick_u32_from(
    prov: &mut Vec<String>,
    name: &str,
    flag: Option<u32>,
    hdr: Option<u64>,
    default: (u32, &str),
) -> u32 {
    match (flag, hdr) {
        (None, None) => {
            prov.push(format!("{name}={} ({})", default.0, default.1));
            default.0
        }
        _ => pick_u32(prov, name, flag, hdr, default.0),
    }
}

fn pick(
    prov: &mut Vec<String>,
    name: &str,
    flag: Option<u64>,
    hdr: Option<u64>,
    default: Option<u64>,
) -> Option<u64> {
    let (v, from) = match (flag, hdr, default) {
        (Some(v), _, _) => (Some(v), "flag"),
        (None, Some(v), _) => (Some(v), "trace header"),
        (None, None, Some(v)) => (Some(v), "default"),
        _ => (None, ""),
    };
    if let Some(v) = v {
        prov.push(format!("{name}={v} ({from})"));
    }
    v
}

/// Whether a server type names llama.cpp (`llamacpp`, `llama.cpp`,
/// `llama-cpp`, case-insensitive).
pub fn is_llamacpp(server_type: Option<&str>) -> bool {
    server_type.is_some_and(|t| {
        matches!(
            t.to_ascii_lowercase().as_str(),
            "llamacpp" | "llama.cpp" | "llama-cpp" | "llama_cpp"
        )
    })
}

/// The models of the bundled blackbox coefficients, sorted, once each.
fn bundled_coefficient_models() -> Vec<String> {
    let mut m: Vec<String> = CoefficientsFile::bundled()
        .rows
        .into_iter()
        .map(|r| r.model)
        .collect();
    m.sort();
    m.dedup();
    m
}

/// Resolves the server from `args` and the trace header (if any).
///
/// # Errors
/// Whether `tp` GPUs can split the model's attention as vLLM splits it
/// (`vllm/config/model.py`, `verify_with_parallel_config`: the query heads
/// must divide by `tp`; `get_num_kv_heads`: KV heads divide by `tp`, or
/// are replicated when fewer than `tp`, which then must be a multiple of
/// them).
fn check_tensor_parallel(a: &ModelArch, tp: u32) -> Result<()> {
    let why = if a.heads > 0 && !a.heads.is_multiple_of(tp) {
        Some(format!(
            "the model's {} attention heads do not divide by it (vLLM refuses this split at start-up)",
            a.heads
        ))
    } else if a.kv_heads > 0
        && ((a.kv_heads >= tp && !a.kv_heads.is_multiple_of(tp))
            || (a.kv_heads < tp && !tp.is_multiple_of(a.kv_heads)))
    {
        Some(format!(
            "the model's {} KV heads neither divide by it nor replicate evenly across it (vLLM refuses this split at start-up)",
            a.kv_heads
        ))
    } else {
        None
    };
    match why {
        Some(why) => Err(SettingsError::TensorParallel { tp, why }.into()),
        None => Ok(()),
    }
}

/// The architecture of `model` (`config` when given, else its bundled
/// config); a model with neither falls back on the shape its run recorded
/// (the header's `model_shape`, when the header's model is this one), and
/// says so in `prov`.
fn architecture(
    model: &str,
    config: Option<&std::path::Path>,
    hs: Option<&ServerConfig>,
    prov: &mut Vec<String>,
) -> std::result::Result<ModelArch, crate::latency::arch::ArchError> {
    let found = find_model((!model.is_empty()).then_some(model), config);
    let recorded = hs
        .filter(|s| s.model.as_deref() == Some(model))
        .and_then(|s| s.model_shape.as_ref());
    let (Err(crate::latency::arch::ArchError::NotBundled { .. }), Some(shape)) = (&found, recorded)
    else {
        return found;
    };
    let a = crate::latency::hf_config::from_shape(shape, hs.and_then(|s| s.max_model_len))?;
    let experts = if shape.num_local_experts > 1 {
        format!(
            ", {} experts, top {}",
            shape.num_local_experts, shape.num_experts_per_tok
        )
    } else {
        String::new()
    };
    prov.push(format!(
        "architecture of {model} from the shape its run recorded (no config.json of it is bundled or given; --model-config gives one): {} layers, hidden {}, {} query / {} KV heads, MLP {}{experts}; assumed: {}",
        shape.num_hidden_layers,
        shape.hidden_size,
        shape.num_attention_heads,
        shape.num_key_value_heads,
        shape.intermediate_size,
        crate::latency::hf_config::SHAPE_ASSUMPTIONS
    ));
    Ok(a)
}

/// Missing or invalid descriptions, saying which flag would fix it.
pub fn resolve(args: &ServerArgs, header: Option<&TraceHeader>) -> Result<Resolved> {
    let hs = header.and_then(|h| h.server.as_ref());
    let hh = header.and_then(|h| h.hardware.as_ref());
    let mut prov = Vec::new();
    let model = args
        .model
        .clone()
        .or_else(|| hs.and_then(|s| s.model.clone()))
        .unwrap_or_default();
    let tp = pick_u32(
        &mut prov,
        "tensor_parallel",
        args.tp,
        hs.and_then(|s| s.tensor_parallel).map(u64::from),
        1,
    );
    if tp == 0 {
        return Err(SettingsError::TensorParallel {
            tp,
            why: "must be at least 1 (--tp, the number of GPUs one instance spans)".into(),
        }
        .into());
    }
    let gpu = args
        .hardware
        .clone()
        .or_else(|| hh.and_then(|h| h.gpu.clone()))
        .unwrap_or_else(|| "H100".to_string());
    if model.is_empty() && args.model_config.is_none() {
        return Err(SettingsError::NoModel {
            bundled_architectures: crate::latency::arch::BUNDLED_MODELS.len(),
            bundled_coefficients: bundled_coefficient_models(),
        }
        .into());
    }
    let coefs = match (&args.coefficient_rows, &args.coefficients) {
        (Some(rows), _) => rows.clone(),
        (None, Some(p)) => CoefficientsFile::read(p)?,
        (None, None) => CoefficientsFile::bundled(),
    };
    // The architecture, when a model or config names one (read once).
    let found = (args.model_config.is_some() || !model.is_empty())
        .then(|| architecture(&model, args.model_config.as_deref(), hs, &mut prov));
    let bundled = args.coefficient_rows.is_none() && args.coefficients.is_none();
    let llamacpp = is_llamacpp(
        args.server_type
            .as_deref()
            .or(hs.and_then(|s| s.server_type.as_deref())),
    );
    if llamacpp {
        prov.push(
            "engine profile llamacpp: parallel slots (max_num_seqs), prompts computed in n_batch chunks, no async scheduling, each slot's context its own KV".into(),
        );
    }
    let kind = args.latency.unwrap_or_else(|| {
        let arch_known = matches!(found, Some(Ok(_)));
        let k = if llamacpp
            && coefs
                .find(&model, &gpu, tp, LatencyKind::StepTable)
                .is_some()
        {
            LatencyKind::StepTable
        } else {
            default_latency_kind(&coefs, &model, &gpu, tp, arch_known, bundled)
        };
        prov.push(format!(
            "latency model {} ({})",
            k.name(),
            default_latency_reason(k, bundled, arch_known)
        ));
        k
    });
    let hardware_text = match &args.hardware_config {
        Some(p) => blis_traces::text::read_text(p).map_err(|e| ReplayError::Io {
            path: p.clone(),
            error: e,
        })?,
        None => crate::latency::arch::BUNDLED_HARDWARE.to_string(),
    };
    let needs_arch = !matches!(kind, LatencyKind::Blackbox | LatencyKind::StepTable);
    let arch = match found {
        Some(Ok(a)) => Some(a),
        // A config the user named is read whatever the model (a typo in
        // its path is an error, not a silently unused flag).
        Some(Err(e)) if needs_arch || args.model_config.is_some() => return Err(e.into()),
        Some(Err(_)) => None,
        // No model and no config: the error that says to give one.
        None if needs_arch => Some(find_model(None, None)?),
        None => None,
    };
    if let Some(a) = arch.as_ref().filter(|_| needs_arch) {
        prov.extend(crate::latency::hf_config::approximations(a));
    }
    if let Some(a) = &arch {
        check_tensor_parallel(a, tp)?;
    }
    let hardware_file = args.hardware_config.as_ref().map_or_else(
        || "hardware_config.json (bundled)".to_string(),
        |p| p.display().to_string(),
    );
    let hw = Hardware::from_json(&hardware_file, &hardware_text, &gpu);
    // The GPU, for the latency models that need it.
    let hardware = || hw.clone().map_err(ReplayError::from);
    let (latency, row_async) = latency_model(
        kind,
        &coefs,
        &model,
        &gpu,
        tp,
        arch.as_ref(),
        &hardware,
        &mut prov,
    )?;
    let engine = engine_config(
        args,
        llamacpp,
        hs,
        &coefs,
        (&model, &gpu, tp, kind),
        arch.as_ref(),
        hw.as_ref().ok(),
        row_async,
        &mut prov,
    )?;
    check_step_times(&latency, &engine)?;
    Ok(Resolved {
        engine,
        latency,
        model,
        gpu,
        tp,
        provenance: prov,
        kv_bytes_per_token: arch.as_ref().map(ModelArch::kv_bytes_per_token),
    })
}

/// The longest step a replay accepts, µs: a year (365.25 days). A longer
/// step comes from a config, hardware table or coefficients outside any
/// deployment (a `config.json` with billions of layers gave steps of
/// 10^17 s, and the replay's clock wrapped to negative latencies). Slow
/// but real hardware stays within it: a 2,048-token prompt chunk of a 70B
/// model on this project's 2-core CPU table is about 3 hours.
pub const MAX_STEP_US: f64 = 365.25 * 86_400.0 * 1e6;

/// Refuses a latency model whose step, for the largest batches `e` can
/// form (every sequence decoding with the KV cache full, or a whole
/// prefill chunk), is longer than [`MAX_STEP_US`] or not a number; and one
/// whose delays around the steps are (the queueing of the longest prompt,
/// a token's output overhead, the output hop, the completion): blackbox
/// coefficients with α0 = 10^308 µs sent every request to the engine at
/// the end of time, and the replay's clock wrapped.
fn check_step_times(latency: &Model, e: &EngineConfig) -> Result<()> {
    use crate::latency::shape::BatchShape;
    use crate::latency::{LatencyModel, PrefillChunk};
    let kv_tokens = u64::from(e.total_kv_blocks) * u64::from(e.block_size);
    let context = match e.max_model_len {
        0 => kv_tokens,
        n => (u64::from(e.max_num_seqs) * u64::from(n)).min(kv_tokens),
    };
    let decode = BatchShape {
        prefill: Vec::new(),
        decode_count: e.max_num_seqs.max(1),
        decode_context_sum: context,
    };
    let prefill = BatchShape {
        prefill: vec![PrefillChunk {
            computed_before: 0,
            new_tokens: e.max_num_batched_tokens.max(1),
        }],
        decode_count: 0,
        decode_context_sum: 0,
    };
    for (batch, b) in [
        (
            "max_num_seqs requests decoding with the KV cache full",
            decode,
        ),
        ("a prefill chunk of max_num_batched_tokens tokens", prefill),
    ] {
        let t = latency.step_time_us(&b);
        if !(t.is_finite() && t <= MAX_STEP_US) {
            return Err(SettingsError::StepTime {
                latency: latency.name(),
                batch,
                seconds: t / 1e6,
            }
            .into());
        }
    }
    for (what, t) in [
        (
            "the queueing delay of the longest prompt",
            latency.queueing_delay_us(e.context_limit()),
        ),
        (
            "one output token's overhead",
            latency.output_token_overhead_us(),
        ),
        ("the output hop", latency.output_hop_us()),
        ("the completion", latency.completion_overhead_us()),
    ] {
        if !(t.is_finite() && t <= MAX_STEP_US) {
            return Err(SettingsError::Delay {
                latency: latency.name(),
                what,
                seconds: t / 1e6,
            }
            .into());
        }
    }
    Ok(())
}

/// The latency model when none is named: blackbox when the coefficients
/// have a row for the model, GPU and TP; else trained-physics when they
/// have one for the GPU and the model's architecture is known (`arch`);
/// else roofline.
fn default_latency_kind(
    coefs: &CoefficientsFile,
    model: &str,
    gpu: &str,
    tp: u32,
    arch: bool,
    bundled: bool,
) -> LatencyKind {
    let physics = arch
        && coefs
            .find(model, gpu, tp, LatencyKind::TrainedPhysics)
            .is_some();
    let blackbox = !model.is_empty() && coefs.find(model, gpu, tp, LatencyKind::Blackbox).is_some();
    if blackbox && !(bundled && physics) {
        LatencyKind::Blackbox
    } else if physics {
        LatencyKind::TrainedPhysics
    } else {
        LatencyKind::Roofline
    }
}

/// Why [`default_latency_kind`] chose `k`, for the run's settings.
fn default_latency_reason(k: LatencyKind, bundled: bool, arch: bool) -> &'static str {
    match (k, bundled) {
        (LatencyKind::Blackbox, false) => {
            "default: a blackbox row for this model, GPU and TP in your coefficients file"
        }
        (LatencyKind::Blackbox, true) => {
            "default: the bundled blackbox row; no model config for trained-physics"
        }
        (LatencyKind::TrainedPhysics, _) => {
            "default: the model's config is known and a trained-physics row covers the GPU (validated on real vLLM runs of models it was not fitted on; docs/trained-physics.md)"
        }
        _ if !arch => "default: no coefficients and no model config for the physics models",
        _ => "default: no coefficients row for this GPU",
    }
}

/// Step 2 of [`resolve`]: the latency model of `kind` for `model` on `gpu`
/// at TP `tp`, from its coefficients row (blackbox, trained-physics), its
/// parameters (roofline: the GPU's MFUs unless a row overrides them) or
/// BLIS's published coefficients; with the async-scheduling setting a
/// trained-physics row was fitted with.
#[allow(clippy::too_many_arguments)]
fn latency_model(
    kind: LatencyKind,
    coefs: &CoefficientsFile,
    model: &str,
    gpu: &str,
    tp: u32,
    arch: Option<&ModelArch>,
    hardware: &dyn Fn() -> Result<Hardware>,
    prov: &mut Vec<String>,
) -> Result<(Model, Option<bool>)> {
    // The step structure a trained-physics row was fitted with.
    let mut row_async = None;
    let latency = match kind {
        LatencyKind::Blackbox => {
            let row = coefs
                .find(model, gpu, tp, LatencyKind::Blackbox)
                .ok_or_else(|| CoefficientsError::NoBlackboxRow {
                    model: model.to_string(),
                    gpu: gpu.to_string(),
                    tp,
                })?;
            prov.push(format!(
                "blackbox alpha={:?} beta={:?} ({})",
                row.alpha,
                row.beta.unwrap_or_default(),
                row.source.as_deref().unwrap_or("coefficients file")
            ));
            Model::Blackbox(Blackbox {
                alpha: row.alpha,
                beta: row.beta.unwrap_or_default(),
            })
        }
        LatencyKind::Roofline => {
            let arch = arch.cloned().expect("checked above");
            roofline_model(coefs, model, gpu, tp, arch, hardware()?, prov)
        }
        LatencyKind::TrainedPhysics => {
            let arch = arch.cloned().expect("checked above");
            let (m, asynchronous) =
                trained_physics_model(coefs, model, gpu, tp, &arch, &hardware()?, prov)?;
            row_async = asynchronous;
            m
        }
        LatencyKind::BlisPhysics => {
            let arch = arch.cloned().expect("checked above");
            let hw = hardware()?;
            prov.push(format!(
                "blis-physics {} on {} TP{tp} (BLIS's published global coefficients)",
                arch.name, hw.name
            ));
            Model::BlisPhysics(Box::new(BlisPhysics::published(&arch, &hw, tp)))
        }
        LatencyKind::StepTable => {
            let row = coefs
                .find(model, gpu, tp, LatencyKind::StepTable)
                .ok_or_else(|| CoefficientsError::NoStepTableRow {
                    model: model.to_string(),
                    gpu: gpu.to_string(),
                    tp,
                })?;
            let index = coefs.rows.iter().position(|r| r == row).unwrap_or(0);
            let t = crate::latency::step_table::StepTable::from_terms(
                &row.terms.clone().unwrap_or_default(),
                row.alpha,
            )
            .map_err(|why| CoefficientsError::BadStepTable { row: index, why })?;
            prov.push(format!(
                "step-table of {} decoding-request counts ({})",
                t.decode_us.len(),
                row.source.as_deref().unwrap_or("coefficients file")
            ));
            row_async = row.async_scheduling;
            Model::StepTable(Box::new(t))
        }
    };
    Ok((latency, row_async))
}

/// The roofline model of `arch` on `hw` at TP `tp`: the GPU's MFUs unless a
/// coefficients row overrides them (with its overheads and α).
fn roofline_model(
    coefs: &CoefficientsFile,
    model: &str,
    gpu: &str,
    tp: u32,
    arch: ModelArch,
    hw: Hardware,
    prov: &mut Vec<String>,
) -> Model {
    let mut params = RooflineParams {
        mfu_prefill: hw.mfu_prefill,
        mfu_decode: hw.mfu_decode,
        overhead_us: 0.0,
        allreduce_latency_us: 0.0,
        alpha: [0.0; 3],
    };
    if let Some(row) = coefs.find(model, gpu, tp, LatencyKind::Roofline) {
        params.mfu_prefill = row.mfu_prefill.unwrap_or(params.mfu_prefill);
        params.mfu_decode = row.mfu_decode.unwrap_or(params.mfu_decode);
        params.overhead_us = row.overhead_us.unwrap_or(0.0);
        params.allreduce_latency_us = row.allreduce_latency_us.unwrap_or(0.0);
        params.alpha = row.alpha;
        prov.push(format!(
            "roofline parameters from {}",
            row.source.as_deref().unwrap_or("coefficients file")
        ));
    }
    prov.push(format!(
        "roofline {} on {} TP{tp}: mfu_prefill={} mfu_decode={} overhead_us={}",
        arch.name, hw.name, params.mfu_prefill, params.mfu_decode, params.overhead_us
    ));
    Model::Roofline(Box::new(Roofline::with_params(arch, hw, tp, params)))
}

/// The trained-physics model of `arch` on `hw` at TP `tp` from its
/// coefficients row, and the async-scheduling setting the row was fitted
/// with.
///
/// # Errors
/// No trained-physics row for the GPU.
fn trained_physics_model(
    coefs: &CoefficientsFile,
    model: &str,
    gpu: &str,
    tp: u32,
    arch: &ModelArch,
    hw: &Hardware,
    prov: &mut Vec<String>,
) -> Result<(Model, Option<bool>)> {
    let row = coefs
        .find(model, gpu, tp, LatencyKind::TrainedPhysics)
        .ok_or_else(|| CoefficientsError::NoPhysicsRow {
            gpu: gpu.to_string(),
        })?;
    let terms = row.terms.clone().unwrap_or_default();
    prov.push(format!(
        "trained-physics {} on {} TP{tp} ({})",
        arch.name,
        hw.name,
        row.source.as_deref().unwrap_or("coefficients file")
    ));
    let m = Model::TrainedPhysics(Box::new(TrainedPhysics::from_named(
        PhysicsBasis::new(arch, hw, tp),
        &terms,
        HostOverheads {
            queue_us: row.alpha[0],
            queue_per_input_token_us: row.alpha[1],
            output_hop_us: row.alpha[2],
        },
    )));
    Ok((m, row.async_scheduling))
}

/// Step 3 of [`resolve`]: the engine's settings, each from the flags, else
/// the trace header, else the coefficients row or an estimate from the
/// model and GPU, else vLLM's default (recorded in `prov`).
#[allow(clippy::too_many_arguments)]
fn engine_config(
    args: &ServerArgs,
    llamacpp: bool,
    hs: Option<&ServerConfig>,
    coefs: &CoefficientsFile,
    (model, gpu, tp, kind): (&str, &str, u32, LatencyKind),
    arch: Option<&ModelArch>,
    hw: Option<&Hardware>,
    row_async: Option<bool>,
    prov: &mut Vec<String>,
) -> Result<EngineConfig> {
    let block_size = pick_u32(
        prov,
        "block_size",
        args.block_size,
        hs.and_then(|s| s.block_size).map(u64::from),
        16,
    );
    // (Checked before the KV estimate, which divides by it.)
    if block_size == 0 {
        return Err(SettingsError::ZeroLimits.into());
    }
    if block_size > MAX_BLOCK_SIZE {
        return Err(SettingsError::BlockSizeTooLarge {
            block_size,
            max: MAX_BLOCK_SIZE,
        }
        .into());
    }
    // (The KV estimate needs the token budget: resolved below, its
    // provenance kept in this place.)
    let kv_prov_at = prov.len();
    use crate::server_defaults::{resolve_bool, vllm_version};
    let version = vllm_version(hs);
    if let Some(v) = version.filter(|v| !v.v1_engine()) {
        prov.push(format!(
            "vLLM {v} ran the V0 engine (V1 is the default from v0.8.0); simulated with V1's scheduler"
        ));
    }
    let chunked_prefill = resolve_bool(
        prov,
        "enable_chunked_prefill",
        args.chunked_prefill,
        hs.and_then(|s| s.enable_chunked_prefill),
        version.map(|v| (v, true, "V1 chunks every prefill")),
        (true, "vLLM V1's default"),
    );
    let prefix_caching = resolve_bool(
        prov,
        "enable_prefix_caching",
        (!args.prefix_caching).then_some(false),
        hs.and_then(|s| s.enable_prefix_caching),
        version.map(|v| (v, v.v1_engine(), "on in V1")),
        (true, "vLLM V1's default"),
    );
    let async_scheduling = match (
        args.async_scheduling,
        hs.and_then(|s| s.async_scheduling),
        version,
        row_async,
    ) {
        (None, None, None, Some(r)) => {
            prov.push(format!(
                "async_scheduling={r} (the coefficients row, fitted so; the trace names no vLLM version)"
            ));
            r
        }
        _ => resolve_bool(
            prov,
            "async_scheduling",
            args.async_scheduling,
            hs.and_then(|s| s.async_scheduling),
            version.map(|v| {
                (
                    v,
                    v.async_scheduling_default(),
                    "on by default from v0.14.0",
                )
            }),
            if llamacpp {
                (false, "llama.cpp steps its slots synchronously")
            } else {
                (false, "no vLLM version recorded")
            },
        ),
    };
    let max_model_len = match pick(
        prov,
        "max_model_len",
        args.max_model_len.map(u64::from),
        hs.and_then(|s| s.max_model_len),
        None,
    ) {
        Some(v) => u32::try_from(v).unwrap_or(u32::MAX),
        None => match arch.and_then(|a| a.max_context) {
            Some(c) => {
                prov.push(format!("max_model_len={c} (model config)"));
                c
            }
            None => {
                prov.push("max_model_len=0 (unlimited: no model config)".into());
                0
            }
        },
    };
    // The named vLLM release's defaults on this GPU (`vllm serve`), else
    // V1's on a GPU under 70 GiB (vLLM's SchedulerConfig), assumed.
    let (seqs_default, tokens_default, default_from) = match (version, hw) {
        (Some(v), Some(h)) if !llamacpp => {
            let (s, t, why) = v.batch_defaults(&h.name, h.memory_gib);
            (s, t, format!("vLLM {v}'s default: {why}"))
        }
        _ => (256, 2048, "assumed: no vLLM version recorded".to_string()),
    };
    // vLLM without chunked prefill schedules whole prompts, so its token
    // budget defaults to at least max_model_len (SchedulerConfig).
    let budget_default = if chunked_prefill {
        tokens_default
    } else {
        max_model_len.max(tokens_default)
    };
    let max_num_seqs = pick_u32_from(
        prov,
        "max_num_seqs",
        args.max_num_seqs,
        hs.and_then(|s| s.max_num_seqs).map(u64::from),
        (seqs_default, &default_from),
    );
    let max_num_batched_tokens = pick_u32_from(
        prov,
        "max_num_batched_tokens",
        args.max_num_batched_tokens,
        hs.and_then(|s| s.max_num_batched_tokens).map(u64::from),
        (budget_default, &default_from),
    );
    let mut kv_prov = Vec::new();
    let total_kv_blocks = kv_blocks(
        args,
        llamacpp,
        hs,
        coefs,
        (model, gpu, tp, kind),
        arch,
        hw,
        (block_size, max_num_batched_tokens),
        &mut kv_prov,
    )?;
    prov.splice(kv_prov_at..kv_prov_at, kv_prov);
    let engine = EngineConfig {
        max_num_seqs,
        max_num_batched_tokens,
        long_prefill_token_threshold: args.long_prefill_token_threshold.unwrap_or(0),
        block_size,
        total_kv_blocks,
        // As vLLM: the flag, else the context length the model's config
        // gives (`max_position_embeddings` and RoPE scaling), else
        // unlimited (0).
        max_model_len,
        scheduler: args.scheduler,
        prefix_caching,
        chunked_prefill,
        fast_forward: args.fast_forward,
        async_scheduling,
        cpu_tier: args
            .kv_tier
            .as_ref()
            .filter(|t| t.cpu_blocks > 0)
            .map(|t| cpu_tier_config(t, arch, block_size, prov))
            .transpose()?,
    };
    if !engine.chunked_prefill
        && (engine.max_model_len == 0 || engine.max_num_batched_tokens < engine.max_model_len)
    {
        return Err(SettingsError::ChunkedPrefillBudget {
            max_num_batched_tokens: engine.max_num_batched_tokens,
            max_model_len: engine.max_model_len,
        }
        .into());
    }
    if engine.max_num_seqs == 0 || engine.max_num_batched_tokens == 0 || engine.block_size == 0 {
        return Err(SettingsError::ZeroLimits.into());
    }
    if engine.block_size > MAX_BLOCK_SIZE {
        return Err(SettingsError::BlockSizeTooLarge {
            block_size: engine.block_size,
            max: MAX_BLOCK_SIZE,
        }
        .into());
    }
    Ok(engine)
}

/// The engine's KV blocks: the flag, else the trace header, else (llama.cpp)
/// its slots' contexts, a coefficients row's logged count, or the estimate
/// from the model and GPU ([`estimate_kv_blocks`]), recorded in `prov`.
#[allow(clippy::too_many_arguments)]
fn kv_blocks(
    args: &ServerArgs,
    llamacpp: bool,
    hs: Option<&ServerConfig>,
    coefs: &CoefficientsFile,
    (model, gpu, tp, kind): (&str, &str, u32, LatencyKind),
    arch: Option<&ModelArch>,
    hw: Option<&Hardware>,
    (block_size, max_num_batched_tokens): (u32, u32),
    prov: &mut Vec<String>,
) -> Result<u32> {
    // A row's KV cache size is a measurement of the server (vLLM's log),
    // whichever latency model the row is for.
    let row_blocks = coefs
        .find(model, gpu, tp, kind)
        .and_then(|r| r.total_kv_blocks)
        .or_else(|| {
            coefs
                .find(model, gpu, tp, LatencyKind::Blackbox)
                .and_then(|r| r.total_kv_blocks)
        });
    let util = args
        .gpu_memory_utilization
        .or_else(|| hs.and_then(|s| s.gpu_memory_utilization))
        .unwrap_or(0.9);
    if !(util > 0.0 && util <= 1.0) {
        return Err(SettingsError::GpuMemoryUtilization(util).into());
    }
    let estimated = match (arch, hw) {
        (Some(a), Some(h)) => Some(u64::from(estimate_kv_blocks(
            a,
            h,
            tp,
            util,
            block_size,
            max_num_batched_tokens,
        ))),
        _ => None,
    };
    // llama.cpp: each slot holds its own context of max_model_len tokens.
    let slots_kv = if llamacpp {
        let slots = args
            .max_num_seqs
            .map(u64::from)
            .or(hs.and_then(|s| s.max_num_seqs).map(u64::from));
        let ctx = args
            .max_model_len
            .map(u64::from)
            .or(hs.and_then(|s| s.max_model_len));
        match (slots, ctx) {
            (Some(n), Some(c)) if n > 0 && c > 0 => Some(n * c.div_ceil(u64::from(block_size))),
            _ => None,
        }
    } else {
        None
    };
    let kv_default = slots_kv.or(row_blocks).or(estimated);
    let total_kv_blocks = pick(
        prov,
        "total_kv_blocks",
        args.total_kv_blocks.map(u64::from),
        hs.and_then(|s| s.total_kv_blocks),
        kv_default,
    )
    .ok_or(SettingsError::UnknownKvSize)?;
    if total_kv_blocks == 0 || total_kv_blocks > u64::from(u32::MAX) {
        let value = if total_kv_blocks == 0 {
            "0".to_string()
        } else {
            format!("{total_kv_blocks} is above {}", u32::MAX)
        };
        let why = if args.total_kv_blocks.is_some() {
            format!("{value} (--total-kv-blocks)")
        } else if hs.and_then(|s| s.total_kv_blocks).is_some() {
            format!("{value} (the trace header's server.total_kv_blocks)")
        } else if slots_kv.is_some() {
            format!("{value} (max_num_seqs slots of max_model_len tokens)")
        } else if row_blocks.is_some() {
            format!("{value} (the coefficients row's total_kv_blocks)")
        } else {
            // (With --model-config alone the model has no name: its config's.)
            let model = match (model, arch) {
                ("", Some(a)) => a.name.as_str(),
                (m, _) => m,
            };
            format!(
                "{value}: {model}'s weights and vLLM's start-up profile of \
                 {max_num_batched_tokens} batched tokens leave no room for a KV block in {util} of \
                 {tp} {gpu}'s memory (raise --gpu-memory-utilization or --tp, lower \
                 --max-num-batched-tokens, or give --total-kv-blocks)"
            )
        };
        return Err(SettingsError::NoKvBlocks(why).into());
    }
    Ok(total_kv_blocks as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use blis_traces::{Mode, TraceHeader};

    fn header(server: ServerConfig) -> TraceHeader {
        let mut h = TraceHeader::new(Mode::Real);
        h.server = Some(ServerConfig {
            server_type: Some("vllm".into()),
            model: Some("meta-llama/Llama-3.1-8B-Instruct".into()),
            ..server
        });
        h
    }

    /// vLLM's rules for splitting attention over `tp` GPUs: query heads
    /// divide by it; KV heads divide by it or, fewer than it, replicate
    /// evenly.
    #[test]
    fn a_tp_degree_must_split_the_heads_as_vllm_does() {
        let mut a = find_model(Some("meta-llama/Llama-3.1-8B-Instruct"), None).unwrap();
        assert_eq!((a.heads, a.kv_heads), (32, 8));
        for tp in [1, 2, 4, 8, 16, 32] {
            assert!(check_tensor_parallel(&a, tp).is_ok(), "{tp}");
        }
        let e = check_tensor_parallel(&a, 3).unwrap_err().to_string();
        assert!(
            e.contains("tensor_parallel 3: the model's 32 attention heads"),
            "{e}"
        );
        a.kv_heads = 6;
        let e = check_tensor_parallel(&a, 4).unwrap_err().to_string();
        assert!(e.contains("6 KV heads neither divide"), "{e}");
        a.kv_heads = 4;
        assert!(
            check_tensor_parallel(&a, 8).is_ok(),
            "4 KV heads replicate over 8 GPUs"
        );
        a.kv_heads = 3;
        assert!(check_tensor_parallel(&a, 8).is_err());
        let zero = resolve(
            &ServerArgs {
                model: Some("meta-llama/Llama-3.1-8B-Instruct".into()),
                tp: Some(0),
                ..args()
            },
            None,
        );
        assert!(zero.is_err_and(|e| {
            e.to_string()
                .contains("tensor_parallel 0: must be at least 1")
        }));
    }

    /// A `block_size` past [`MAX_BLOCK_SIZE`] is refused by name (it
    /// used to run for minutes: each step cleared a list per block
    /// position); the bound itself is accepted.
    #[test]
    fn a_block_size_past_the_bound_is_refused() {
        let with = |bs| {
            resolve(
                &ServerArgs {
                    model: Some("meta-llama/Llama-3.1-8B-Instruct".into()),
                    block_size: Some(bs),
                    ..args()
                },
                None,
            )
        };
        assert_eq!(
            with(MAX_BLOCK_SIZE + 1).unwrap_err().to_string(),
            "block_size 65537 is above 65536 tokens (vLLM's block sizes are 1 to 128 tokens; hybrid models' a few thousand)"
        );
        assert_eq!(
            with(MAX_BLOCK_SIZE).unwrap().engine.block_size,
            MAX_BLOCK_SIZE
        );
    }

    /// A model with no bundled config is read from the shape its run
    /// recorded (the vLLM ground truth's `model_config`), says so, and is
    /// then predicted by trained-physics as a bundled model would be; a
    /// config given with --model-config still wins, and without a
    /// recorded shape the model is an error naming the way out.
    #[test]
    fn a_model_without_a_config_is_read_from_its_recorded_shape() {
        let shape = blis_traces::ModelShape {
            num_hidden_layers: 40,
            hidden_size: 5120,
            num_attention_heads: 40,
            num_key_value_heads: 8,
            intermediate_size: 17408,
            vocab_size: 151936,
            ..Default::default()
        };
        let mut h = header(ServerConfig {
            max_model_len: Some(8192),
            model_shape: Some(shape),
            ..ServerConfig::default()
        });
        h.server.as_mut().unwrap().model = Some("acme/unreleased-14b".into());
        let default = || ServerArgs {
            latency: None,
            ..args()
        };
        let r = resolve(&default(), Some(&h)).unwrap();
        assert_eq!(r.latency_name(), "trained-physics");
        assert!(
            r.provenance.iter().any(|p| p.starts_with(
                "architecture of acme/unreleased-14b from the shape its run recorded"
            )),
            "{:?}",
            r.provenance
        );
        // The same model with its config given: the config, not the shape.
        let given = resolve(
            &ServerArgs {
                model_config: Some(
                    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                        .join("../../shared/model-configs/qwen3-14b/config.json"),
                ),
                ..default()
            },
            Some(&h),
        )
        .unwrap();
        assert!(
            !given
                .provenance
                .iter()
                .any(|p| p.contains("the shape its run recorded")),
            "{:?}",
            given.provenance
        );
        let mut bare = h.clone();
        bare.server.as_mut().unwrap().model_shape = None;
        let e = resolve(&default(), Some(&bare)).unwrap_err().to_string();
        assert!(e.contains("no bundled config for model"), "{e}");
        // Another unbundled model named by --model does not take the
        // recorded model's shape.
        let other = ServerArgs {
            model: Some("acme/another-70b".into()),
            ..default()
        };
        let e = resolve(&other, Some(&h)).unwrap_err().to_string();
        assert!(
            e.contains("no bundled config for model \"acme/another-70b\""),
            "{e}"
        );
    }

    /// Blackbox coefficients whose queueing delay or per-token output
    /// overhead leaves any deployment behind are refused by name: with
    /// α0 = 10^308 µs every request reached the engine at the end of time
    /// and the replay's clock wrapped (a debug build panicked on the
    /// addition; a release one printed ordinary-looking latencies). Found by
    /// mutated coefficients files.
    #[test]
    fn a_queueing_delay_or_token_overhead_beyond_a_year_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.yaml");
        let resolved = |alpha: &str| {
            std::fs::write(
                &file,
                format!(
                    "version: 1\nrows:\n  - model: meta-llama/Llama-3.1-8B-Instruct\n    gpu: H100\n    tensor_parallel: 1\n    latency_model: blackbox\n    alpha: {alpha}\n    beta: [6472.0, 19.8, 304.4]\n    total_kv_blocks: 29205\n"
                ),
            )
            .unwrap();
            resolve(
                &ServerArgs {
                    model: Some("meta-llama/Llama-3.1-8B-Instruct".into()),
                    latency: Some(LatencyKind::Blackbox),
                    coefficients: Some(file.clone()),
                    ..ServerArgs::default()
                },
                None,
            )
        };
        let e = resolved("[1e308, 0, 0]").unwrap_err().to_string();
        assert!(
            e.starts_with("the blackbox latency model gives 1.000e302 s for the queueing delay of the longest prompt (a year at most)"),
            "{e}"
        );
        let e = resolved("[0, 1e300, 0]").unwrap_err().to_string();
        assert!(
            e.contains("for the queueing delay of the longest prompt"),
            "{e}"
        );
        let e = resolved("[0, 0, 1e15]").unwrap_err().to_string();
        assert!(
            e.contains("1.000e9 s for one output token's overhead"),
            "{e}"
        );
        // BLIS's row, and a day's queueing, are served.
        assert!(resolved("[10326.27, 0, 0]").is_ok());
        assert!(resolved("[86400e6, 0, 0]").is_ok());
    }

    /// A config whose step times leave any deployment behind (billions of
    /// layers: its replay's clock wrapped to negative latencies) is
    /// refused by name; slow but real hardware is not (a 70B model's
    /// prompt chunk on this project's CPU table takes hours).
    #[test]
    fn a_step_beyond_a_year_is_refused_and_a_slow_cpu_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("config.json");
        let refused = |json: &str| {
            std::fs::write(&cfg, json).unwrap();
            resolve(
                &ServerArgs {
                    model_config: Some(cfg.clone()),
                    total_kv_blocks: Some(1000),
                    ..args()
                },
                None,
            )
            .unwrap_err()
            .to_string()
        };
        // Sizes beyond any model are refused as they are read...
        let e = refused(
            r#"{"num_hidden_layers": 4000000000, "hidden_size": 4096,
                "num_attention_heads": 32, "intermediate_size": 11008, "vocab_size": 32000}"#,
        );
        assert!(
            e.contains("`num_hidden_layers`: 4000000000 is beyond any model"),
            "{e}"
        );
        // ...and sizes within those bounds whose step takes years, by it.
        let e = refused(
            r#"{"num_hidden_layers": 65536, "hidden_size": 16777216,
                "num_attention_heads": 32, "intermediate_size": 16777216, "vocab_size": 32000}"#,
        );
        assert!(
            e.starts_with("the roofline latency model gives") && e.contains("(a year at most)"),
            "{e}"
        );
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let cpu = resolve(
            &ServerArgs {
                model: Some("meta-llama/Llama-3.1-70B-Instruct".into()),
                hardware: Some("CPU".into()),
                hardware_config: Some(root.join("examples/realserver/cpu-hardware.json")),
                total_kv_blocks: Some(10_000),
                ..args()
            },
            None,
        )
        .unwrap();
        let prompt = crate::latency::shape::BatchShape {
            prefill: vec![crate::latency::PrefillChunk {
                computed_before: 0,
                new_tokens: 2048,
            }],
            ..Default::default()
        };
        use crate::latency::LatencyModel;
        assert!(cpu.latency.step_time_us(&prompt) > 3.6e9);
    }

    /// The KV estimate takes the GPU memory fraction from the flag, else
    /// the trace header (the command line's default of 0.9 used to hide
    /// the header's), else 0.9; a fraction outside (0, 1] is refused, as
    /// vLLM refuses it, and a fraction too small for the weights says so.
    #[test]
    fn the_kv_estimate_follows_the_recorded_gpu_memory_fraction() {
        // (A model without a bundled row, whose measured KV size would win.)
        let model = |util: Option<f64>| ServerArgs {
            model: Some("qwen/qwen2.5-7b-instruct".into()),
            hardware: Some("H100".into()),
            gpu_memory_utilization: util,
            ..args()
        };
        let blocks =
            |a: &ServerArgs, h: Option<&TraceHeader>| resolve(a, h).unwrap().engine.total_kv_blocks;
        let default = blocks(&model(None), None);
        let h = header(ServerConfig {
            gpu_memory_utilization: Some(0.5),
            ..ServerConfig::default()
        });
        let recorded = blocks(&model(None), Some(&h));
        assert!(recorded < default / 2, "{recorded} vs {default}");
        assert_eq!(blocks(&model(Some(0.9)), Some(&h)), default);
        for bad in [0.0, 1.5, f64::NAN] {
            let e = resolve(&model(Some(bad)), None).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("gpu_memory_utilization {bad}: must be")),
                "{e}"
            );
        }
        let e = resolve(&model(Some(0.1)), None).unwrap_err().to_string();
        assert!(
            e.contains("weights and vLLM's start-up profile of 2048 batched tokens leave no room for a KV block"),
            "{e}"
        );
    }

    /// The KV estimate is vLLM's start-up profile: the block counts vLLM
    /// logged for the four models of the ground-truth runs (H100, 0.9 of
    /// the memory, 2,048 batched tokens; recorded in their
    /// `replay_data/*.json` as `kv_blocks_total_gpu`) within 0.3%, and the
    /// KV sizes of vLLM v0.11.0's logs on an H100 (0.9, its default of
    /// 8,192 batched tokens) within 2%, among them Qwen3-32B on one GPU,
    /// whose weights leave 4.45 GiB (the estimate as it was, 5% of what
    /// the weights left, gave 10.4 GiB: 2.3 times the concurrency).
    #[test]
    fn the_kv_estimate_is_vllms_profile() {
        let h100 = Hardware::bundled("H100").unwrap();
        let bundled = |folder: &str| {
            let (_, text) = crate::latency::arch::BUNDLED_MODELS
                .iter()
                .find(|(f, _)| *f == folder)
                .unwrap();
            crate::latency::hf_config::parse(folder, text).unwrap()
        };
        for (folder, tp, logged) in [
            ("llama-2-7b-hf", 1, 7_462u32),
            ("llama-2-70b-hf", 4, 31_356),
            ("mixtral-8x7b-v0.1", 2, 27_510),
            ("codellama-34b-instruct-hf", 2, 26_602),
        ] {
            let got = estimate_kv_blocks(&bundled(folder), &h100, tp, 0.9, 16, 2048);
            let err = f64::from(got) / f64::from(logged) - 1.0;
            assert!(err.abs() < 0.003, "{folder}: {got} blocks, vLLM {logged}");
        }
        // Llama-2-70B's 8 KV heads: split over 4 GPUs, one each on 16 (vLLM
        // replicates them when fewer than the GPUs).
        let l70 = bundled("llama-2-70b-hf");
        assert_eq!(
            l70.kv_bytes_per_token_per_gpu(4),
            l70.kv_bytes_per_token() / 4.0
        );
        assert_eq!(
            l70.kv_bytes_per_token_per_gpu(16),
            l70.kv_bytes_per_token() / 8.0
        );
        let qwen3_32b = crate::latency::hf_config::parse(
            "qwen3-32b",
            &crate::latency::arch::BUNDLED_MODELS
                .iter()
                .find(|(f, _)| *f == "qwen3-14b")
                .unwrap()
                .1
                .replace(
                    "\"intermediate_size\": 17408",
                    "\"intermediate_size\": 25600",
                )
                .replace("\"num_attention_heads\": 40", "\"num_attention_heads\": 64")
                .replace("\"num_hidden_layers\": 40", "\"num_hidden_layers\": 64"),
        )
        .unwrap();
        let gib = |a: &ModelArch, tp: u32| {
            let blocks = estimate_kv_blocks(a, &h100, tp, 0.9, 16, 8192);
            f64::from(blocks) * 16.0 * a.kv_bytes_per_token_per_gpu(tp) / (1u64 << 30) as f64
        };
        for (name, arch, tp, logged_gib) in [
            ("Llama-3.1-8B", bundled("llama-3.1-8b-instruct"), 1, 51.38),
            ("Qwen3-32B", qwen3_32b.clone(), 1, 4.45),
            ("Qwen3-32B", qwen3_32b, 2, 34.49),
        ] {
            let got = gib(&arch, tp);
            assert!(
                (got / logged_gib - 1.0).abs() < 0.02,
                "{name} TP {tp}: {got:.2} GiB per GPU, vLLM {logged_gib}"
            );
        }
    }

    fn args() -> ServerArgs {
        ServerArgs {
            latency: Some(LatencyKind::Roofline),
            prefix_caching: true,
            ..ServerArgs::default()
        }
    }

    fn said(r: &Resolved, what: &str) -> String {
        r.provenance
            .iter()
            .find(|p| p.starts_with(what))
            .cloned()
            .unwrap_or_else(|| panic!("no {what} in {:?}", r.provenance))
    }

    /// The vLLM version a trace header names decides async scheduling
    /// (on by default from v0.14.0); the header's own flags win over it, a
    /// flag over both; without a version the run says what it assumed.
    #[test]
    fn the_recorded_vllm_version_and_flags_decide_the_engine_defaults() {
        let v = |s: &str| ServerConfig {
            version: Some(s.into()),
            ..ServerConfig::default()
        };
        let r = resolve(&args(), Some(&header(v("0.15.1")))).unwrap();
        assert!(r.engine.async_scheduling);
        assert!(said(&r, "async_scheduling=").contains("vLLM 0.15.1's default"));
        assert!(r.engine.chunked_prefill && r.engine.prefix_caching);
        let r = resolve(&args(), Some(&header(v("v0.11.0")))).unwrap();
        assert!(!r.engine.async_scheduling);
        // The header's flags win over the version's defaults.
        let h = header(ServerConfig {
            version: Some("0.15.1".into()),
            async_scheduling: Some(false),
            enable_prefix_caching: Some(false),
            ..ServerConfig::default()
        });
        let r = resolve(&args(), Some(&h)).unwrap();
        assert!(!r.engine.async_scheduling && !r.engine.prefix_caching);
        assert_eq!(
            said(&r, "enable_prefix_caching="),
            "enable_prefix_caching=false (trace header)"
        );
        // A flag wins over the header.
        let mut a = args();
        a.async_scheduling = Some(true);
        assert!(resolve(&a, Some(&h)).unwrap().engine.async_scheduling);
        // Nothing recorded: assumed, and said so.
        let r = resolve(&args(), Some(&header(ServerConfig::default()))).unwrap();
        assert!(!r.engine.async_scheduling);
        assert!(said(&r, "async_scheduling=").contains("assumed"));
        assert!(said(&r, "enable_chunked_prefill=").contains("assumed"));
        // A version from before the V1 engine is named as such.
        let r = resolve(&args(), Some(&header(v("0.6.3")))).unwrap();
        assert!(r.provenance.iter().any(|p| p.contains("V0 engine")));
        // Another server's version is not read as vLLM's.
        let mut h = header(v("0.5.2"));
        h.server.as_mut().unwrap().server_type = Some("sglang".into());
        assert!(
            said(&resolve(&args(), Some(&h)).unwrap(), "async_scheduling=").contains("assumed")
        );
    }

    /// `max_num_seqs` and `max_num_batched_tokens` unrecorded: the named
    /// vLLM release's `vllm serve` defaults on the simulated GPU (V1 on an
    /// H100: 1024 and 8192; on an A100 of the same memory: 256 and 2048);
    /// recorded values win; without a version the run says it assumed
    /// 256 and 2048.
    #[test]
    fn the_recorded_vllm_version_and_gpu_decide_the_batch_defaults() {
        let v = |s: &str| ServerConfig {
            version: Some(s.into()),
            ..ServerConfig::default()
        };
        let batch = |r: &Resolved| (r.engine.max_num_seqs, r.engine.max_num_batched_tokens);
        let r = resolve(&args(), Some(&header(v("0.11.0")))).unwrap();
        assert_eq!(batch(&r), (1024, 8192));
        assert!(said(&r, "max_num_seqs=").contains("vLLM 0.11.0's default"));
        let mut a = args();
        a.hardware = Some("A100-SXM".into());
        let r = resolve(&a, Some(&header(v("0.11.0")))).unwrap();
        assert_eq!(batch(&r), (256, 2048));
        let r = resolve(&args(), Some(&header(v("0.6.3")))).unwrap();
        assert_eq!(batch(&r), (256, 2048));
        let h = header(ServerConfig {
            version: Some("0.11.0".into()),
            max_num_seqs: Some(128),
            ..ServerConfig::default()
        });
        let r = resolve(&args(), Some(&h)).unwrap();
        assert_eq!(batch(&r), (128, 8192));
        assert_eq!(said(&r, "max_num_seqs="), "max_num_seqs=128 (trace header)");
        let r = resolve(&args(), Some(&header(ServerConfig::default()))).unwrap();
        assert_eq!(batch(&r), (256, 2048));
        assert!(said(&r, "max_num_batched_tokens=").contains("assumed"));
    }

    /// Chunked prefill off: the token budget defaults to max_model_len, as
    /// vLLM's; a budget below it is refused (a long prompt could never run).
    #[test]
    fn chunked_prefill_off_needs_a_budget_of_max_model_len() {
        let h = header(ServerConfig {
            enable_chunked_prefill: Some(false),
            max_model_len: Some(8192),
            ..ServerConfig::default()
        });
        let r = resolve(&args(), Some(&h)).unwrap();
        assert!(!r.engine.chunked_prefill);
        assert_eq!(r.engine.max_num_batched_tokens, 8192);
        let mut a = args();
        a.max_num_batched_tokens = Some(2048);
        let e = resolve(&a, Some(&h)).unwrap_err().to_string();
        assert!(e.contains("max_num_batched_tokens (2048)"), "{e}");
    }
}
