//! # blis-mockserver
//!
//! An OpenAI-compatible server (`/v1/completions`, `/v1/chat/completions`,
//! `/v1/models`, `/tokenize`, `/health`, `/metrics`) whose timing is the
//! `blis-replay` engine driven by the wall clock: it batches, queues,
//! caches prefixes and preempts as the engine predicts, so the whole
//! observe → replay → calibrate loop can run without a GPU, and a correct
//! loop must reproduce its timing almost exactly.
//!
//! ## Where it matches vLLM, and where it does not
//!
//! It answers as vLLM's OpenAI server does (`vllm/entrypoints/openai`):
//! the same JSON shapes and error objects, a request without `model` is
//! served by the served model and one naming another model is a 404
//! (`The model `X` does not exist.`), a streamed chat completion opens
//! with a chunk holding only the role (`{"role": "assistant", "content":
//! ""}`) sent with the first token, `stream_options.include_usage` and
//! `continuous_usage_stats` behave as in vLLM, `max_tokens` + `ignore_eos`
//! or `min_tokens` force the output length, `priority` orders the queue,
//! and an unknown path or method gets FastAPI's `{"detail": "Not Found"}`
//! (404) or `{"detail": "Method Not Allowed"}` (405); like vLLM it has no
//! `GET /v1/models/{id}`. What differs:
//!
//! - **No tokenizer.** A prompt is 4 bytes per token (a token-id prompt is
//!   exact); `/tokenize` counts the same way. The chat template is a
//!   plain `<|role|>` one, not the model's.
//! - **No model.** Output text is synthetic (` 001 002 …`, one token per
//!   chunk; vLLM may put several tokens in a chunk under load), and where
//!   the length is not forced it is drawn from `--output-dist` instead of
//!   ending at an end-of-sequence token. Sampling options (`temperature`,
//!   `top_p`, `stop`, `logprobs`, tools, `response_format`, ...) are
//!   accepted and ignored; `n` other than 1 is rejected.
//! - **Timing** is the simulator's (blackbox or roofline latency model) on
//!   the wall clock: no GPU noise, no CUDA graphs or warm-up; the HTTP path
//!   adds its own ~0.5 ms.
//! - **Usage** always carries `prompt_tokens_details.cached_tokens` (vLLM
//!   only with `--enable-prompt-tokens-details`).
//! - **Endpoints**: completions, chat completions, `/v1/models`,
//!   `/tokenize`, `/health`, `/metrics`; none of `/v1/embeddings`,
//!   `/v1/responses`, `/detokenize`, `/pooling`, `/version`, LoRA loading.
//! - **Metrics** are a subset of vLLM's names (running, waiting, KV usage,
//!   prefix-cache queries and hits, preemptions, prompt and generation
//!   tokens, request successes, TTFT, ITL, queue-time and E2E histograms) plus
//!   `blis_mock_faults_total`.
//!
//! ```no_run
//! # async fn demo() -> Result<(), blis_mockserver::StartError> {
//! use clap::Parser;
//! let opts = blis_mockserver::Opts::parse_from(["blis-mockserver", "--port", "0"]);
//! let server = blis_mockserver::start(&opts.config()).await?;
//! println!("listening on http://{}", server.addr);
//! server.shutdown().await;
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

pub mod api;
pub mod cli;
pub mod engine;
pub mod faults;
pub mod metrics;
pub mod server;
pub mod tokenizer;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use blis_replay::setup::{ServerArgs, resolve};

pub use cli::Opts;

blis_traces::command_errors!(StartError);

/// Runs `blis-mockserver`: serves until SIGINT/SIGTERM, after printing
/// `listening on http://ADDR` to `out`; returns the process exit code.
///
/// # Errors
/// The runtime or the server could not start (a bad setting, a port in
/// use).
pub fn run(opts: Opts, out: &mut dyn std::io::Write) -> blis_traces::command::Result<i32> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| blis_traces::step::StepError::new("starting the runtime", e))?;
    rt.block_on(async {
        let server = start(&opts.config()).await?;
        writeln!(out, "listening on http://{}", server.addr)?;
        out.flush()?;
        if server.addr.ip().is_loopback() {
            blis_traces::diag!(
                "loopback only: other machines cannot reach it (--host 0.0.0.0 to serve them)"
            );
        }
        server.run_until_signal().await;
        Ok(blis_traces::exit_code::OK)
    })
}

use crate::engine::{Clock, EngineHandle};
use crate::faults::{FaultConfig, Faults};
use crate::metrics::Metrics;
use crate::server::AppState;

/// A running server.
#[derive(Debug)]
pub struct RunningServer {
    /// The bound address.
    pub addr: SocketAddr,
    /// Its metrics.
    pub metrics: Arc<Metrics>,
    /// Its engine.
    pub engine: EngineHandle,
    /// Served timings (with `--record-served`).
    pub served: Option<Arc<server::ServedLog>>,
    /// The engine's settings (what a replay of its traffic must use).
    pub engine_cfg: blis_replay::EngineConfig,
    shutdown: tokio::sync::oneshot::Sender<()>,
    join: tokio::task::JoinHandle<()>,
}

impl RunningServer {
    /// Stops accepting, finishes open responses, and returns.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(());
        let _ = self.join.await;
        if let Some(s) = &self.served {
            s.flush();
        }
    }

    /// Waits until the server stops (after a shutdown signal).
    pub async fn wait(self) {
        let _ = self.join.await;
        if let Some(s) = &self.served {
            s.flush();
        }
    }

    /// Stops on SIGINT or SIGTERM.
    pub async fn run_until_signal(self) {
        shutdown_signal().await;
        self.shutdown().await;
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(t) => t,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

/// Why the mock server could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A fault rate or the time scale is out of range.
    #[error("{0}")]
    Settings(String),
    /// The engine could not be configured (unknown model, coefficients).
    #[error("configuring the engine")]
    Engine(#[from] blis_replay::ReplayError),
    /// The address could not be bound.
    #[error("binding {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

/// What a mock server is: where it listens, what it serves, its engine
/// (the `blis-replay` settings; fast-forward is turned off, as tokens are
/// handed out ahead of time) and its faults. [`Opts::config`] builds it
/// from the command line.
#[derive(Debug, Clone)]
pub struct MockConfig {
    /// Address to listen on (port 0: any free port).
    pub addr: SocketAddr,
    /// The served model name.
    pub model: String,
    /// Bearer token required of clients, if any.
    pub api_key: Option<String>,
    /// 503 for this long after start.
    pub startup_delay: Duration,
    /// Requests waiting at most before 503s (0: no bound).
    pub max_queued_requests: u64,
    /// Simulated time per wall time (> 1: faster than real time).
    pub time_scale: f64,
    /// The `/metrics` names: vLLM's or SGLang's.
    pub metrics_style: metrics::MetricsStyle,
    /// Output lengths of requests that do not force one.
    pub output_dist: server::OutputDist,
    /// Seed of faults and output lengths.
    pub seed: u64,
    /// The engine.
    pub engine: ServerArgs,
    /// Injected faults.
    pub faults: FaultConfig,
    /// Keep a log of what was served (for tests).
    pub record_served: bool,
    /// Write what was served as JSON lines here (`--served-log`).
    pub served_log: Option<std::path::PathBuf>,
    /// Canned completions to answer with, in turn (`--script`).
    pub script: Option<std::path::PathBuf>,
}

/// Starts the server `cfg` describes on the current tokio runtime.
///
/// # Errors
/// Invalid settings (unknown model, fault rates, time scale) or an address
/// in use.
pub async fn start(cfg: &MockConfig) -> Result<RunningServer, StartError> {
    cfg.faults.validate().map_err(StartError::Settings)?;
    // Beyond a million times faster, a simulated clock read after a year
    // of serving no longer fits its µs; beyond a million times slower, no
    // token would be seen.
    if !(1e-6..=1e6).contains(&cfg.time_scale) {
        return Err(StartError::Settings(format!(
            "--time-scale must be between 0.000001 and 1000000, got {}",
            blis_traces::shown::Num(cfg.time_scale)
        )));
    }
    let args = ServerArgs {
        fast_forward: false,
        ..cfg.engine.clone()
    };
    let resolved = resolve(&args, None)?;
    let metrics = Arc::new(
        Metrics::new(&cfg.model, cfg.metrics_style).with_cache_config(
            resolved.engine.block_size,
            resolved.engine.total_kv_blocks,
            resolved.engine.prefix_caching,
        ),
    );
    let clock = Arc::new(Clock::new(cfg.time_scale));
    let instance = blis_replay::Instance::new(resolved.engine.clone(), resolved.latency.clone());
    let engine = EngineHandle::start(instance, clock, metrics.clone());
    let log_file = match &cfg.served_log {
        Some(p) => Some(
            std::fs::File::create(p)
                .map_err(|e| StartError::Settings(format!("--served-log {}: {e}", p.display())))?,
        ),
        None => None,
    };
    let served = (cfg.record_served || log_file.is_some())
        .then(|| Arc::new(server::ServedLog::new(cfg.record_served, log_file)));
    let mut state = AppState::new(
        cfg.model.clone(),
        cfg.api_key.clone(),
        cfg.startup_delay,
        engine.clone(),
        resolved.engine.clone(),
        metrics.clone(),
        Faults::new(cfg.faults, cfg.seed),
        cfg.output_dist,
        cfg.seed,
    );
    state.served = served.clone();
    state.max_queued = cfg.max_queued_requests;
    if let Some(p) = &cfg.script {
        state.script = Some(server::Script::read(p).map_err(StartError::Settings)?);
    }
    let state = Arc::new(state);
    let bind_addr = cfg.addr;
    let bind_error = |source| StartError::Bind {
        addr: bind_addr,
        source,
    };
    let listener = server::bind(bind_addr).await.map_err(bind_error)?;
    let addr = listener.local_addr().map_err(bind_error)?;
    // Streams are many small writes: send each at once (no Nagle delay).
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let app = server::router(state);
    let join = tokio::spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = rx.await;
            })
            .await;
    });
    Ok(RunningServer {
        addr,
        metrics,
        engine,
        served,
        engine_cfg: resolved.engine.clone(),
        shutdown: tx,
        join,
    })
}
