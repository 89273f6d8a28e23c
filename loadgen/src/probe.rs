//! What is learned about the server before a run: that it answers and
//! serves the model, its context length and KV cache size where it says,
//! the round-trip time, and how many tokens its tokenizer makes of our
//! prompt text.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use reqwest::header::AUTHORIZATION;
use serde_json::Value;

use crate::http::Api;
use crate::http::{Endpoint, Prompt, bearer, describe};
use crate::prompt;

/// How many tokens a word of prompt text makes, and how that was learned.
#[derive(Debug, Clone, PartialEq)]
pub struct TokensPerWord {
    /// Tokens per word.
    pub value: f64,
    /// `tokenize`, `calibration request` or `assumed`.
    pub source: &'static str,
    /// Why the calibration request failed, when it was sent and did
    /// (`http_501: ...`): the run's requests are likely to fail the same
    /// way.
    pub calibration_failure: Option<String>,
}

/// What the server told us before the run.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ServerInfo {
    /// Models listed by `/v1/models` (empty when it has none).
    pub models: Vec<String>,
    /// `max_model_len` from `/v1/models` (vLLM).
    pub max_model_len: Option<u64>,
    /// Minimum HTTP round trip to `/v1/models`, ms.
    pub rtt_ms: Option<f64>,
    /// The model list's body stalled past its timeout after its headers:
    /// the server's answers may stall so (the connection warm-up is
    /// skipped).
    pub stalls_bodies: bool,
}

/// The most of a probe's JSON answer read (`/v1/models`, `/tokenize`,
/// `/props`, `/version`), bytes (8 MiB): a list of thousands of models is
/// under 1 MiB; a longer answer is a broken endpoint, not read into memory.
pub const MAX_PROBE_BODY: usize = 8 << 20;

/// Why a probe's answer could not be read.
#[derive(Debug)]
struct Unread {
    /// In words.
    why: String,
    /// Its body stalled past the request's timeout (a server that sends
    /// headers and then nothing).
    timed_out: bool,
}

/// `resp`'s body as JSON, read up to [`MAX_PROBE_BODY`].
async fn json_capped(resp: reqwest::Response) -> Result<Value, Unread> {
    let (body, more) = crate::http::read_capped(resp, MAX_PROBE_BODY)
        .await
        .map_err(|e| Unread {
            why: describe(&e),
            timed_out: e.is_timeout(),
        })?;
    let unread = |why| Unread {
        why,
        timed_out: false,
    };
    if more {
        return Err(unread(format!(
            "an answer over {} MiB",
            MAX_PROBE_BODY >> 20
        )));
    }
    serde_json::from_slice(&body).map_err(|e| unread(e.to_string()))
}

/// The longest a probe's GET waits for its answer: the run's own request
/// timeout, at most 10 s (a model list, a version or a health check that
/// takes longer comes from a server that is wedged, not busy).
pub fn probe_wait(timeout: Duration) -> Duration {
    timeout.min(Duration::from_secs(10))
}

/// A GET with the API key, waiting up to `wait` for its answer.
async fn get(
    client: &reqwest::Client,
    url: &str,
    api_key: Option<&str>,
    wait: Duration,
) -> reqwest::Result<reqwest::Response> {
    let mut r = client.get(url).timeout(wait);
    if let Some(v) = api_key.and_then(bearer) {
        r = r.header(AUTHORIZATION, v);
    }
    r.send().await
}

/// Where `url` redirects to (its `Location`, resolved against it) when it
/// answers a GET with a redirect: the diagnosis of an error met after
/// following one. `None` when it does not redirect or cannot be asked.
async fn redirect_target(url: &str, api_key: Option<&str>, wait: Duration) -> Option<String> {
    let client = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(Duration::from_secs(5))
        .build()
        .ok()?;
    let mut r = client.get(url).timeout(wait.min(Duration::from_secs(5)));
    if let Some(v) = api_key.and_then(bearer) {
        r = r.header(AUTHORIZATION, v);
    }
    let resp = r.send().await.ok()?;
    if !resp.status().is_redirection() {
        return None;
    }
    let to = resp
        .headers()
        .get(reqwest::header::LOCATION)?
        .to_str()
        .ok()?;
    Some(reqwest::Url::parse(url).ok()?.join(to).ok()?.to_string())
}

/// Why a server cannot be used for a run (each message one line naming its
/// URL).
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// No connection.
    #[error("cannot reach the server at {base}: {why}")]
    Unreachable {
        /// The server's base URL.
        base: String,
        /// The connection error.
        why: String,
    },
    /// HTTP 401/403.
    #[error(
        "the server at {base} refused the API key (HTTP {status}): give --api-key or BLIS_API_KEY"
    )]
    Unauthorized {
        /// The server's base URL.
        base: String,
        /// The HTTP status.
        status: u16,
    },
    /// Connected, but no answer to a GET within the probes' wait.
    #[error(
        "the server at {base} accepted a connection but did not answer GET {url} within {waited_s:.1} s: a wedged server, or one too loaded to answer (see --timeout-s)"
    )]
    Silent {
        /// The server's base URL.
        base: String,
        /// The URL asked.
        url: String,
        /// Seconds waited.
        waited_s: f64,
    },
    /// Still 503 after the wait.
    #[error("the server at {base} is not ready (HTTP 503 for {waited_s:.0} s)")]
    NotReady {
        /// The server's base URL.
        base: String,
        /// Seconds waited.
        waited_s: f64,
    },
    /// A model list that is not JSON.
    #[error("reading {url}: {why}")]
    Unreadable {
        /// The model list's URL.
        url: String,
        /// Why it could not be read.
        why: String,
    },
    /// The model is not among those served.
    #[error("the server at {base} does not serve the model {model:?}; it serves: {served}")]
    UnknownModel {
        /// The server's base URL.
        base: String,
        /// The model asked for.
        model: String,
        /// The models it serves.
        served: String,
    },
}

/// Checks that the server answers and serves `model`, waiting up to
/// `wait` while it reports 503 (starting up) on `/v1/models` or `/health`,
/// and up to `wait_refused` while it refuses connections (not listening
/// yet), and measures the round trip; each GET waits up to `answer_wait`
/// for its answer ([`probe_wait`]).
///
/// # Errors
/// Unreachable server, rejected API key, or a model it does not serve; each
/// as one line naming the URL.
pub async fn check_server(
    client: &reqwest::Client,
    base: &str,
    model: &str,
    api_key: Option<&str>,
    wait: Duration,
    wait_refused: Duration,
    answer_wait: Duration,
) -> Result<ServerInfo, ProbeError> {
    let base = base.trim_end_matches('/');
    let url = format!("{base}/v1/models");
    // What messages show (no password).
    let (base_shown, url_shown) = (crate::http::shown_url(base), crate::http::shown_url(&url));
    let start = Instant::now();
    let deadline = start + wait.max(wait_refused);
    let refused_deadline = start + wait_refused;
    let mut said = false;
    let mut waiting = |why: &str| {
        if !said {
            said = true;
            blis_traces::diag!(
                "waiting for the server at {base_shown} ({why}), up to {:.0} s",
                if why.starts_with("HTTP 503") {
                    wait.max(wait_refused)
                } else {
                    wait_refused
                }
                .as_secs_f64()
            );
        }
    };
    let resp = loop {
        let r = match get(client, &url, api_key, answer_wait).await {
            Ok(r) => r,
            Err(e) if Instant::now() < refused_deadline => {
                waiting(&format!("not answering: {}", describe(&e)));
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
            Err(e) if e.is_timeout() && !e.is_connect() => {
                return Err(ProbeError::Silent {
                    base: base_shown,
                    url: url_shown,
                    waited_s: answer_wait.as_secs_f64(),
                });
            }
            Err(e) => {
                // Followed redirects fail under the first URL's name: say
                // where the server sent the request, lest a user look for
                // the fault in a server that answered.
                let why = match redirect_target(&url, api_key, answer_wait).await {
                    Some(to) => format!(
                        "its {url_shown} redirects to {}, which fails: {}",
                        crate::http::shown_url(&to),
                        describe(&e.without_url())
                    ),
                    None => describe(&e),
                };
                return Err(ProbeError::Unreachable {
                    base: base_shown.clone(),
                    why,
                });
            }
        };
        if r.status() == StatusCode::SERVICE_UNAVAILABLE && Instant::now() < deadline {
            waiting("HTTP 503 from /v1/models");
            tokio::time::sleep(Duration::from_millis(250)).await;
            continue;
        }
        break r;
    };
    // vLLM's /health answers 503 while its engine is not serving; a
    // server without one (404) or that does not answer it is not held up.
    let health = format!("{base}/health");
    while let Ok(r) = get(client, &health, api_key, answer_wait).await {
        if r.status() != StatusCode::SERVICE_UNAVAILABLE {
            break;
        }
        if Instant::now() >= deadline {
            return Err(ProbeError::NotReady {
                base: base_shown.clone(),
                waited_s: start.elapsed().as_secs_f64(),
            });
        }
        waiting("HTTP 503 from /health");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let status = resp.status();
    let mut info = ServerInfo::default();
    match status {
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
            return Err(ProbeError::Unauthorized {
                base: base_shown.clone(),
                status: status.as_u16(),
            });
        }
        StatusCode::SERVICE_UNAVAILABLE => {
            return Err(ProbeError::NotReady {
                base: base_shown.clone(),
                waited_s: start.elapsed().as_secs_f64(),
            });
        }
        s if s.is_success() => {
            // A gateway may answer any GET with a page of its own: a list
            // that is not JSON is no list (the requests tell).
            let v: Value = match json_capped(resp).await {
                Ok(v) => v,
                Err(e) => {
                    info.stalls_bodies = e.timed_out;
                    blis_traces::diag!(
                        "warning: {}; going on without the server's model list",
                        ProbeError::Unreadable {
                            url: url_shown.clone(),
                            why: e.why,
                        }
                    );
                    Value::Null
                }
            };
            for m in v["data"].as_array().into_iter().flatten() {
                if let Some(id) = m["id"].as_str() {
                    info.models.push(id.to_string());
                    if id == model {
                        info.max_model_len = m["max_model_len"].as_u64();
                    }
                }
            }
            if !info.models.is_empty() && !info.models.iter().any(|m| m == model) {
                return Err(ProbeError::UnknownModel {
                    base: base_shown.clone(),
                    model: model.to_string(),
                    served: info.models.join(", "),
                });
            }
        }
        // Some OpenAI-compatible servers have no model list: go on.
        _ => {}
    }
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let t = Instant::now();
        if get(client, &url, api_key, answer_wait).await.is_ok() {
            best = best.min(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    info.rtt_ms = best.is_finite().then_some(best);
    Ok(info)
}

/// Measures tokens per word of prompt text: `/tokenize` (vLLM, llama.cpp)
/// when the server has it, else the `usage.prompt_tokens` of one
/// calibration request; 1.3 (typical of English with BPE tokenizers) when
/// neither works. `timeout` is the run's own per-request timeout: neither
/// probe waits longer than it (nor than 10 s for `/tokenize` and 60 s for
/// the calibration request), so a server that never answers costs the
/// user no more than one of the run's requests would.
pub async fn tokens_per_word(
    client: &reqwest::Client,
    base: &str,
    model: &str,
    api_key: Option<&str>,
    ep: &Endpoint,
    timeout: Duration,
) -> TokensPerWord {
    let tokenize_wait = timeout.min(Duration::from_secs(10));
    let calibration_wait = timeout.min(Duration::from_secs(60));
    let (text, words) = prompt::sample_text();
    let url = format!("{}/tokenize", base.trim_end_matches('/'));
    for body in prompt::tokenize_bodies(model, &text) {
        let mut r = client.post(&url).json(&body).timeout(tokenize_wait);
        if let Some(v) = api_key.and_then(bearer) {
            r = r.header(AUTHORIZATION, v);
        }
        let v = match r.send().await {
            Ok(resp) if resp.status().is_success() => json_capped(resp).await,
            Ok(_) => continue,
            Err(e) => Err(Unread {
                why: String::new(),
                timed_out: e.is_timeout(),
            }),
        };
        match v {
            Ok(v) => {
                if let Some(n) = prompt::tokens_from_tokenize_response(&v).filter(|n| *n > 0) {
                    return TokensPerWord {
                        value: prompt::measure_tokens_per_word(n, words),
                        source: "tokenize",
                        calibration_failure: None,
                    };
                }
            }
            // A server that did not answer one form within the wait will
            // not answer the other: no second wait.
            Err(e) if e.timed_out => break,
            Err(_) => {}
        }
    }
    // One short request; its prompt_tokens include any chat template, which
    // is what a chat request of the run will pay too.
    let p = match ep.api() {
        Api::Completions => Prompt::Text(text),
        Api::Chat => Prompt::Chat(vec![crate::http::Message {
            role: "user",
            content: text,
        }]),
    };
    let body = ep.body(&p, 1, false);
    let clock = crate::clock::RunClock::new();
    let mut cap = crate::http::Capture::new(false);
    cap.max_chunks = Some(crate::response::chunk_limit(1));
    let sent = tokio::time::timeout(
        calibration_wait,
        ep.send(body, false, "blis-calibration", &clock, &mut cap),
    )
    .await;
    let calibration_failure = match sent {
        Ok(Ok(())) => {
            if let Some(n) = cap.prompt_tokens.filter(|n| *n > 0) {
                return TokensPerWord {
                    value: prompt::measure_tokens_per_word(u64::from(n), words),
                    source: "calibration request",
                    calibration_failure: None,
                };
            }
            None
        }
        Ok(Err(f)) => Some(f.message()),
        Err(_) => Some(format!(
            "timeout: no answer in {:.1} s",
            calibration_wait.as_secs_f64()
        )),
    };
    TokensPerWord {
        value: 1.3,
        source: "assumed",
        calibration_failure,
    }
}

/// The KV-cache settings a vLLM server exports (`vllm:cache_config_info`,
/// whose labels are its `CacheConfig`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheConfig {
    /// Tokens per KV block.
    pub block_size: u64,
    /// GPU KV blocks.
    pub num_gpu_blocks: u64,
    /// `--enable-prefix-caching` (label `enable_prefix_caching`, `True`/`False`).
    pub enable_prefix_caching: Option<bool>,
}

/// KV cache settings from a vLLM `/metrics` body
/// (`vllm:cache_config_info{block_size, num_gpu_blocks, enable_prefix_caching}`).
pub fn cache_config(samples: &[blis_traces::prom::Sample]) -> Option<CacheConfig> {
    let s = samples
        .iter()
        .find(|s| s.name == "vllm:cache_config_info")?;
    let block_size = s.label("block_size")?.parse().ok()?;
    let num_gpu_blocks = s.label("num_gpu_blocks")?.parse().ok()?;
    let enable_prefix_caching = match s.label("enable_prefix_caching") {
        Some(v) if v.eq_ignore_ascii_case("true") => Some(true),
        Some(v) if v.eq_ignore_ascii_case("false") => Some(false),
        _ => None,
    };
    Some(CacheConfig {
        block_size,
        num_gpu_blocks,
        enable_prefix_caching,
    })
}

/// What llama.cpp's `llama-server` says of itself (`GET /props`): its
/// parallel slots, each slot's context and its build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LlamaCppProps {
    /// `total_slots` (`-np`): requests served at once.
    pub slots: u32,
    /// `default_generation_settings.n_ctx`: tokens of context per slot.
    pub n_ctx: Option<u64>,
    /// `build_info` (e.g. `b6134-abc1234`).
    pub build: Option<String>,
}

/// llama.cpp's `GET /props`; `None` from any other server.
pub async fn llamacpp_props(
    client: &reqwest::Client,
    base: &str,
    api_key: Option<&str>,
    wait: Duration,
) -> Option<LlamaCppProps> {
    let r = get(client, &format!("{base}/props"), api_key, wait)
        .await
        .ok()?;
    if !r.status().is_success() {
        return None;
    }
    let v: Value = json_capped(r).await.ok()?;
    let slots = u32::try_from(v.get("total_slots")?.as_u64()?).ok()?;
    Some(LlamaCppProps {
        slots,
        n_ctx: v
            .pointer("/default_generation_settings/n_ctx")
            .and_then(Value::as_u64),
        build: v
            .get("build_info")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty() && s.len() <= 64)
            .map(str::to_string),
    })
}

/// The server's version from `GET /version` (vLLM answers
/// `{"version": "0.15.1"}`); `None` when it has no such endpoint or the
/// answer is not that.
pub async fn server_version(
    client: &reqwest::Client,
    base: &str,
    api_key: Option<&str>,
    wait: Duration,
) -> Option<String> {
    let r = get(client, &format!("{base}/version"), api_key, wait)
        .await
        .ok()?;
    if !r.status().is_success() {
        return None;
    }
    let v: Value = json_capped(r).await.ok()?;
    let s = v.get("version")?.as_str()?.trim();
    (!s.is_empty() && s.len() <= 64).then(|| s.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_config_is_read_from_vllm_metrics() {
        let text = "# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"29205\"} 1.0\n";
        let s = blis_traces::prom::parse(text).unwrap();
        assert_eq!(
            cache_config(&s),
            Some(CacheConfig {
                block_size: 16,
                num_gpu_blocks: 29205,
                enable_prefix_caching: None
            })
        );
        assert_eq!(cache_config(&[]), None);
        let text = "vllm:cache_config_info{block_size=\"32\",cache_dtype=\"auto\",enable_prefix_caching=\"False\",num_gpu_blocks=\"7\"} 1.0\n";
        let s = blis_traces::prom::parse(text).unwrap();
        assert_eq!(
            cache_config(&s).and_then(|c| c.enable_prefix_caching),
            Some(false)
        );
    }
}

/// Opens up to `n` connections to the server before the run's clock
/// starts, so that the first second's sends do not wait for TCP set-up:
/// `n` concurrent GETs of `/v1/models`, whose connections stay in the
/// client's pool (idle for up to a minute). Returns how many succeeded;
/// failures only cost the warm-up.
pub async fn warm_connections(
    client: &reqwest::Client,
    base: &str,
    api_key: Option<&str>,
    n: usize,
    wait: Duration,
) -> usize {
    let url = format!("{base}/v1/models");
    let gets = (0..n).map(|_| async {
        match get(client, &url, api_key, wait).await {
            // Read to its end, so the connection returns to the pool; a
            // page past the probe limit is not worth its connection.
            Ok(r) => matches!(
                crate::http::read_capped(r, MAX_PROBE_BODY).await,
                Ok((_, false))
            ),
            Err(_) => false,
        }
    });
    futures::future::join_all(gets)
        .await
        .into_iter()
        .filter(|&ok| ok)
        .count()
}

/// Connections to open before a run ([`warm_connections`]): the requests
/// in flight that 20 ms of the planned rate start (at most 256), the
/// closed loop's users, or `--max-in-flight` when smaller.
pub fn connections_to_warm(
    rate: Option<f64>,
    concurrency: Option<usize>,
    max_in_flight: Option<usize>,
) -> usize {
    let n = match (concurrency, rate) {
        (Some(c), _) => c,
        (None, Some(r)) if r.is_finite() && r > 0.0 => (r * 0.02).ceil() as usize,
        _ => 1,
    };
    n.clamp(1, 256)
        .min(max_in_flight.unwrap_or(usize::MAX).max(1))
}

#[cfg(test)]
mod warm_tests {
    #[test]
    fn warm_connections_follow_the_load() {
        use super::connections_to_warm as c;
        assert_eq!(c(Some(10_000.0), None, None), 200);
        assert_eq!(c(Some(100_000.0), None, None), 256);
        assert_eq!(c(Some(5.0), None, None), 1);
        assert_eq!(c(None, Some(64), None), 64);
        assert_eq!(c(Some(10_000.0), None, Some(16)), 16);
        assert_eq!(c(None, None, None), 1);
    }
}
