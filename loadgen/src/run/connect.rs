//! The server: probed before the run (models, `/metrics`, the round trip),
//! with its family and settings for the trace header.

use crate::{CommandError, Result};
use blis_traces::ServerConfig;
use blis_traces::step::StepContext;
use std::time::Duration;

use crate::http::Endpoint;
use crate::http::ServerType;
use crate::options::RunOptions;
use crate::{probe, scrape};

/// What the probes found out about the server.
pub(super) struct Server {
    pub(super) client: reqwest::Client,
    pub(super) info: probe::ServerInfo,
    pub(super) ep: Endpoint,
    pub(super) tokens_per_word: f64,
    pub(super) metrics_url: String,
    pub(super) scrape_on: bool,
    /// KV cache settings from its metrics.
    pub(super) cache: Option<probe::CacheConfig>,
    /// Its version (`GET /version`).
    pub(super) version: Option<String>,
    /// llama.cpp's slots and context (`GET /props`).
    pub(super) props: Option<probe::LlamaCppProps>,
}

impl Server {
    /// The server's section of the trace header: its family, model and
    /// the settings the probes found (KV cache from `/metrics`, context
    /// length from the model list, llama.cpp's slots from `/props`).
    pub(super) fn config(&self, args: &RunOptions) -> ServerConfig {
        ServerConfig {
            server_type: Some(server_type_name(args.server_type).to_string()),
            model: Some(args.model.clone()),
            block_size: self.cache.and_then(|c| u32::try_from(c.block_size).ok()),
            total_kv_blocks: self.cache.map(|c| c.num_gpu_blocks),
            enable_prefix_caching: self.cache.and_then(|c| c.enable_prefix_caching),
            version: self.version.clone(),
            max_model_len: self
                .info
                .max_model_len
                .or_else(|| self.props.as_ref().and_then(|p| p.n_ctx)),
            max_num_seqs: self.props.as_ref().map(|p| p.slots),
            ..ServerConfig::default()
        }
    }
}

/// Whether the process's arguments carry an API key (`--api-key K` or
/// `--api-key=K`), where `ps` shows it.
pub(super) fn key_on_command_line(args: impl Iterator<Item = String>) -> bool {
    args.into_iter()
        .any(|a| a == "--api-key" || a.starts_with("--api-key="))
}

/// Phase 2: the server, checked and measured (tokens per word, its KV
/// cache from its metrics).
pub(super) async fn connect(args: &RunOptions) -> Result<Server> {
    let base = args.server_url.trim_end_matches('/').to_string();
    // What messages show (no password).
    let shown = crate::http::shown_url(&base);
    let client = crate::http::client().step(|| "building the HTTP client")?;
    let wait = probe::probe_wait(super::dispatch::saturating_secs(args.timeout_s));
    let info = probe::check_server(
        &client,
        &base,
        &args.model,
        args.api_key.as_deref(),
        Duration::from_secs(60),
        Duration::from_secs_f64(args.wait_for_server_s),
        wait,
    )
    .await?;
    let ep = Endpoint::new(
        client.clone(),
        &base,
        args.api,
        args.server_type,
        &args.model,
        args.api_key.as_deref(),
    )
    .map_err(CommandError::Usage)?;
    let tpw = probe::tokens_per_word(
        &client,
        &base,
        &args.model,
        args.api_key.as_deref(),
        &ep,
        super::dispatch::saturating_secs(args.timeout_s),
    )
    .await;
    if let Some(f) = &tpw.calibration_failure {
        // A refusal every request would get: stop before sending any.
        let path = ep.path();
        if f.starts_with("http_401") || f.starts_with("http_403") {
            return Err(CommandError::Usage(format!(
                "{shown}{path} refused a test request ({f}): the server wants an API key (--api-key, or BLIS_API_KEY); nothing was sent"
            )));
        }
        if f.starts_with("http_404") || f.starts_with("http_405") {
            return Err(CommandError::Usage(format!(
                "{shown}{path} answered a test request with {f}: not an OpenAI-compatible server, or not its base URL (or --api completions|chat is the other one); nothing was sent"
            )));
        }
        blis_traces::diag!(
            "warning: a one-token test request to {shown} failed ({f}); the run's requests will likely fail the same way"
        );
    }
    let metrics_url = args
        .metrics_url
        .clone()
        .unwrap_or_else(|| format!("{base}/metrics"));
    let shown_metrics = crate::http::shown_url(&metrics_url);
    let mut scrape_on = args.scrape_interval_ms > 0;
    let mut cache = None;
    if scrape_on {
        match scrape::scrape_once(
            &client,
            &metrics_url,
            args.api_key.as_deref(),
            Duration::from_secs(5),
        )
        .await
        {
            Ok(page) => {
                if let Some(first) = &page.first_skipped {
                    blis_traces::diag!(
                        "warning: {} line(s) of {shown_metrics} cannot be read as metrics and are skipped (first: {first}); the other {} samples of the page are kept",
                        page.skipped,
                        page.samples.len()
                    );
                }
                cache = probe::cache_config(&page.samples);
            }
            Err(e) => {
                blis_traces::diag!("warning: no metrics at {shown_metrics} ({e}); scraping is off");
                scrape_on = false;
            }
        }
    }
    // (Informational: not asked of a server whose model list stalled after
    // its head, which would stall these the same way.)
    let props = if args.server_type == ServerType::Llamacpp && !info.stalls_bodies {
        probe::llamacpp_props(&client, &base, args.api_key.as_deref(), wait).await
    } else {
        None
    };
    let version = if info.stalls_bodies {
        None
    } else {
        match probe::server_version(&client, &base, args.api_key.as_deref(), wait).await {
            Some(v) => Some(v),
            None => props.as_ref().and_then(|p| p.build.clone()),
        }
    };
    blis_traces::diag!(
        "server {shown}: model {}{}, round trip {}, {:.3} tokens per word ({}){}",
        args.model,
        version
            .as_deref()
            .map_or(String::new(), |v| format!(", version {v}")),
        info.rtt_ms
            .map_or("unknown".into(), |r| format!("{r:.2} ms")),
        tpw.value,
        tpw.source,
        cache.map_or(String::new(), |c| format!(
            ", KV cache {} blocks of {} tokens",
            c.num_gpu_blocks, c.block_size
        ))
    );
    Ok(Server {
        client,
        info,
        ep,
        tokens_per_word: tpw.value,
        metrics_url,
        scrape_on,
        cache,
        version,
        props,
    })
}

fn server_type_name(t: ServerType) -> &'static str {
    match t {
        ServerType::Vllm => "vllm",
        ServerType::Sglang => "sglang",
        ServerType::Llamacpp => "llamacpp",
        ServerType::Openai => "openai",
    }
}
