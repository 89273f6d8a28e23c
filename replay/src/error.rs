//! Errors of the replay library.

/// What can go wrong configuring or running a replay.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// A model's architecture cannot be found or used.
    #[error(transparent)]
    Arch(#[from] crate::latency::arch::ArchError),
    /// A GPU description cannot be found or used.
    #[error(transparent)]
    Hardware(#[from] crate::latency::arch::HardwareError),
    /// Coefficients cannot be read, or have no row for the model.
    #[error(transparent)]
    Coefficients(#[from] crate::latency::coefficients::CoefficientsError),
    /// Server settings cannot be resolved.
    #[error(transparent)]
    Settings(#[from] SettingsError),
    /// A cluster policy setting is invalid.
    #[error(transparent)]
    Policy(#[from] crate::cluster::PolicyError),
    /// Reading or writing a trace or workload failed.
    #[error(transparent)]
    Trace(#[from] blis_traces::Error),
    /// A workload (trace, import, spec) could not be read.
    #[error("{what}: {error}")]
    Input {
        /// What was being read (`reading the trace out/real.yaml`).
        what: String,
        /// Why it failed (in the message, not chained, so it prints once).
        error: Box<blis_traces::Error>,
    },
    /// An output file could not be written.
    #[error("{}: {error}", path.display())]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// The error (in the message, not chained, so it prints once).
        error: std::io::Error,
    },
}

/// Result with [`ReplayError`].
pub type Result<T, E = ReplayError> = std::result::Result<T, E>;

/// Server settings that cannot be resolved from the flags and the trace
/// header.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SettingsError {
    /// No model named anywhere.
    #[error("no model given: the simulator times each step from the model being served; give --model NAME (e.g. meta-llama/Llama-3.1-8B-Instruct; {bundled_architectures} have bundled architectures, and the bundled coefficients cover {}) or --model-config DIR_OR_config.json (a trace's header names its model itself)", bundled_coefficients.join(", "))]
    NoModel {
        /// How many model architectures are bundled.
        bundled_architectures: usize,
        /// The models the bundled coefficients cover.
        bundled_coefficients: Vec<String>,
    },
    /// Neither a flag, the header nor the model's config gives the KV cache
    /// size.
    #[error(
        "cannot tell the KV cache size: give --total-kv-blocks (or --model with a known config)"
    )]
    UnknownKvSize,
    /// `total_kv_blocks` is 0 (or beyond what a KV cache can index); the
    /// text says where the figure came from.
    #[error("total_kv_blocks: {0}")]
    NoKvBlocks(String),
    /// `gpu_memory_utilization` outside (0, 1] (vLLM refuses it at
    /// start-up).
    #[error(
        "gpu_memory_utilization {}: must be a fraction of GPU memory in (0, 1] (vLLM's --gpu-memory-utilization)",
        blis_traces::shown::Num(*.0)
    )]
    GpuMemoryUtilization(f64),
    /// `--horizon-s` is not a positive number of seconds.
    #[error("--horizon-s must be a positive number of seconds, got {}", blis_traces::shown::Num(*.0))]
    Horizon(f64),
    /// The latency model gives a step longer than
    /// [`crate::setup::MAX_STEP_US`] (or not a number) for a batch the
    /// engine can form: a model config, hardware config or coefficients
    /// far outside any deployment.
    #[error(
        "the {latency} latency model gives {seconds:.3e} s for one step of {batch} (a year at most): check the model's config.json (layers, sizes), the hardware config and the coefficients"
    )]
    StepTime {
        /// The latency model.
        latency: &'static str,
        /// The batch.
        batch: &'static str,
        /// Its step time, s.
        seconds: f64,
    },
    /// The latency model gives a delay around the steps (a request's
    /// queueing, a token's output overhead) longer than
    /// [`crate::setup::MAX_STEP_US`], or not a number: coefficients far
    /// outside any deployment.
    #[error(
        "the {latency} latency model gives {seconds:.3e} s for {what} (a year at most): check the coefficients (alpha)"
    )]
    Delay {
        /// The latency model.
        latency: &'static str,
        /// The delay.
        what: &'static str,
        /// Its length, s.
        seconds: f64,
    },
    /// A tensor-parallel degree the model cannot be split by (vLLM refuses
    /// it at start-up), or 0.
    #[error("tensor_parallel {tp}: {why}")]
    TensorParallel {
        /// The degree asked for.
        tp: u32,
        /// Why it cannot be used.
        why: String,
    },
    /// `max_num_seqs`, `max_num_batched_tokens` or `block_size` is 0.
    #[error("max_num_seqs, max_num_batched_tokens and block_size must be positive")]
    ZeroLimits,
    /// `block_size` above the largest accepted.
    #[error(
        "block_size {block_size} is above {max} tokens (vLLM's block sizes are 1 to 128 tokens; hybrid models' a few thousand)"
    )]
    BlockSizeTooLarge {
        /// The block size asked for.
        block_size: u32,
        /// The largest accepted.
        max: u32,
    },
    /// Chunked prefill off with a token budget below `max_model_len`: a
    /// long prompt could never be scheduled (vLLM refuses to start so).
    #[error(
        "with chunked prefill off, max_num_batched_tokens ({max_num_batched_tokens}) must be at least max_model_len ({max_model_len}; 0: unlimited): a longer prompt could never run, and vLLM refuses to start so"
    )]
    ChunkedPrefillBudget {
        /// The step's token budget.
        max_num_batched_tokens: u32,
        /// The longest request.
        max_model_len: u32,
    },
    /// `--client-timeout-s` is not a positive number of seconds.
    #[error(
        "--client-timeout-s must be a positive number of seconds, got {}",
        blis_traces::shown::Num(*.0)
    )]
    ClientTimeout(f64),
    /// A CPU-tier setting is out of range, or the KV block's size in bytes
    /// is unknown.
    #[error("tiered KV cache: {0}")]
    KvTier(String),
}
