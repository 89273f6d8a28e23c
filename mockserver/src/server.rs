//! The HTTP server: routes, handlers, streaming.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use blis_replay::EngineConfig;
use rand::SeedableRng;
use rand::rngs::ChaCha8Rng;
use rand_distr::{Distribution, Exp, Uniform};
use serde_json::{Value, json};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

use crate::api::{self, Parsed};
use crate::engine::{EngineHandle, Event, Submission};
use crate::faults::{Fault, Faults};
use crate::metrics::Metrics;
use crate::tokenizer;

/// How long responses are when the request does not force `max_tokens`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum OutputDist {
    /// Always this many tokens.
    Constant(u32),
    /// Exponential with this mean.
    Exponential(f64),
    /// Uniform in [a, b].
    Uniform(u32, u32),
}

impl std::str::FromStr for OutputDist {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (kind, args) = s.split_once(':').unwrap_or((s, ""));
        let num = |v: &str| {
            v.trim()
                .parse::<f64>()
                .map_err(|_| format!("invalid number {v:?} in {s:?}"))
        };
        match kind {
            "constant" => Ok(Self::Constant(num(args)?.max(1.0) as u32)),
            "exponential" => {
                let m = num(args)?;
                if m > 0.0 {
                    Ok(Self::Exponential(m))
                } else {
                    Err("exponential mean must be positive".into())
                }
            }
            "uniform" => {
                let (a, b) = args.split_once(',').ok_or("uniform:A,B")?;
                let (a, b) = (num(a)? as u32, num(b)? as u32);
                if a >= 1 && b >= a {
                    Ok(Self::Uniform(a, b))
                } else {
                    Err("uniform:A,B needs 1 ≤ A ≤ B".into())
                }
            }
            _ => Err(format!(
                "unknown output distribution {s:?} (constant:N, exponential:MEAN, uniform:A,B)"
            )),
        }
    }
}

impl OutputDist {
    fn draw(&self, rng: &mut ChaCha8Rng) -> u32 {
        match *self {
            OutputDist::Constant(n) => n,
            OutputDist::Exponential(m) => {
                Exp::new(1.0 / m).map_or(1, |d| d.sample(rng).round().max(1.0) as u32)
            }
            OutputDist::Uniform(a, b) => Uniform::new_inclusive(a, b).map_or(a, |d| d.sample(rng)),
        }
    }
}

/// What the server did for one completed request, measured on the
/// server's monotonic clock from when its handler started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    /// The client's `x-request-id` header, when sent.
    pub x_request_id: Option<String>,
    /// From the request's arrival to handing the first token's chunk to the
    /// connection (streaming), or the whole body (non-streaming), µs.
    pub ttft_us: i64,
    /// From the request's arrival to its first token's simulated visible
    /// time, µs (streaming only): when the engine meant it to be seen. The
    /// rest of `ttft_us` is this server's lateness in handing it over.
    pub ttft_due_us: Option<i64>,
    /// From the request's arrival to handing the last chunk to the
    /// connection, µs.
    pub e2e_us: i64,
    /// Output tokens served.
    pub output_tokens: u32,
    /// Content chunks sent (one per token when streaming, 1 otherwise).
    pub chunks: u32,
    /// When the handler started, Unix µs (the wall clock: comparable with
    /// a client's times only in the same process or on one host).
    pub received_unix_us: i64,
}

/// Served timings of completed requests: kept in memory (tests,
/// `--record-served`) and/or written as JSON lines (`--served-log FILE`),
/// the server's truth against which a client's measurements are judged.
#[derive(Debug, Default)]
pub struct ServedLog {
    entries: Option<Mutex<Vec<Served>>>,
    file: Option<Mutex<std::io::BufWriter<std::fs::File>>>,
}

impl ServedLog {
    /// A log kept in memory (`keep`) and/or written to `file`.
    pub fn new(keep: bool, file: Option<std::fs::File>) -> Self {
        Self {
            entries: keep.then(|| Mutex::new(Vec::new())),
            file: file.map(|f| Mutex::new(std::io::BufWriter::new(f))),
        }
    }

    fn push(&self, s: Served) {
        if let Some(f) = &self.file {
            use std::io::Write;
            let line = format!(
                "{{\"x_request_id\":{},\"received_unix_us\":{},\"first_token_unix_us\":{},\"last_token_unix_us\":{},\"output_tokens\":{},\"chunks\":{}}}\n",
                s.x_request_id
                    .as_deref()
                    .map_or("null".to_string(), |x| format!("{x:?}")),
                s.received_unix_us,
                s.received_unix_us + s.ttft_us,
                s.received_unix_us + s.e2e_us,
                s.output_tokens,
                s.chunks
            );
            // A full disk loses log lines, never the serving.
            let _ = f
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .write_all(line.as_bytes());
        }
        if let Some(v) = &self.entries {
            v.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(s);
        }
    }

    /// Writes what is buffered to the file.
    pub fn flush(&self) {
        if let Some(f) = &self.file {
            use std::io::Write;
            let _ = f
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .flush();
        }
    }

    /// Everything kept so far, in completion order (empty when not kept).
    pub fn entries(&self) -> Vec<Served> {
        self.entries.as_ref().map_or_else(Vec::new, |v| {
            v.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone()
        })
    }
}

/// What the HTTP layer needs to serve.
#[derive(Debug)]
pub struct AppState {
    /// Served model name.
    pub model: String,
    /// Required bearer token.
    pub api_key: Option<String>,
    /// When `/health` turns 200.
    pub ready_at: Instant,
    /// The engine.
    pub engine: EngineHandle,
    /// The engine's settings.
    pub engine_cfg: EngineConfig,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Faults.
    pub faults: Faults,
    /// Output lengths.
    pub output: OutputDist,
    /// Served timings, when recorded.
    pub served: Option<Arc<ServedLog>>,
    /// Requests waiting at most (0: no bound): beyond, 503.
    pub max_queued: u64,
    /// Requests accepted and not ended (running or waiting).
    in_flight: Arc<AtomicU64>,
    rng: Mutex<ChaCha8Rng>,
    counter: AtomicU64,
    /// Scripted mode: the canned completions answered in turn.
    pub script: Option<Script>,
}

/// Canned completions answered in turn (`--script`), whatever the prompt:
/// the LLM of an offline evolutionary search.
#[derive(Debug)]
pub struct Script {
    completions: Vec<String>,
    next: AtomicU64,
}

impl Script {
    /// Reads `path`: JSON lines, each a string or `{"content": "..."}`.
    ///
    /// # Errors
    /// The file, and the line that is neither, or an empty file.
    pub fn read(path: &std::path::Path) -> Result<Self, String> {
        let text = blis_traces::text::read_text(path)
            .map_err(|e| format!("--script {}: {e}", path.display()))?;
        let mut completions = Vec::new();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let v: Value = serde_json::from_str(line)
                .map_err(|e| format!("{}:{}: {e}", path.display(), i + 1))?;
            let c = match &v {
                Value::String(s) => s.clone(),
                Value::Object(o) => match o.get("content") {
                    Some(Value::String(s)) => s.clone(),
                    _ => {
                        return Err(format!(
                            "{}:{}: an object needs a \"content\" string",
                            path.display(),
                            i + 1
                        ));
                    }
                },
                _ => {
                    return Err(format!(
                        "{}:{}: expected a string or {{\"content\": ...}}",
                        path.display(),
                        i + 1
                    ));
                }
            };
            completions.push(c);
        }
        if completions.is_empty() {
            return Err(format!("--script {}: no completions", path.display()));
        }
        Ok(Self {
            completions,
            next: AtomicU64::new(0),
        })
    }

    /// The next completion (after the last, the first again).
    pub fn next(&self) -> &str {
        let i = self.next.fetch_add(1, Ordering::Relaxed) as usize;
        &self.completions[i % self.completions.len()]
    }
}

impl AppState {
    /// Builds the state.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        model: String,
        api_key: Option<String>,
        startup_delay: Duration,
        engine: EngineHandle,
        engine_cfg: EngineConfig,
        metrics: Arc<Metrics>,
        faults: Faults,
        output: OutputDist,
        seed: u64,
    ) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        rng.set_stream(0x0075_7470_7574);
        Self {
            model,
            api_key,
            ready_at: Instant::now() + startup_delay,
            engine,
            engine_cfg,
            metrics,
            faults,
            output,
            served: None,
            max_queued: 0,
            in_flight: Arc::new(AtomicU64::new(0)),
            rng: Mutex::new(rng),
            counter: AtomicU64::new(0),
            script: None,
        }
    }

    fn ready(&self) -> bool {
        Instant::now() >= self.ready_at
    }

    fn authorized(&self, headers: &HeaderMap) -> bool {
        match &self.api_key {
            None => true,
            Some(k) => headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .is_some_and(|t| t == k),
        }
    }
}

/// The largest request body the server reads, in bytes: room for a prompt
/// of `max_model_len` tokens however it is written (text of up to 32 bytes
/// a token, JSON escapes included, or token ids), at least 16 MiB and at
/// most 1 GiB. vLLM reads any body; a web framework's default (axum's
/// 2 MiB) would refuse long-context prompts vLLM serves.
pub fn body_limit(max_model_len: u32) -> usize {
    (u64::from(max_model_len) * 32).clamp(16 << 20, 1 << 30) as usize
}

/// A body that could not be read (over [`body_limit`], or cut off), as an
/// OpenAI-style error.
fn unread_body(r: BytesRejection, limit: usize) -> Response {
    let status = r.status();
    let msg = if status == StatusCode::PAYLOAD_TOO_LARGE {
        format!(
            "the request body is over this server's {} MiB (sized for a prompt of its max_model_len tokens)",
            limit >> 20
        )
    } else {
        format!("reading the request body: {}", r.body_text())
    };
    err(status, "BadRequestError", &msg)
}

/// The router.
pub fn router(state: Arc<AppState>) -> Router {
    let limit = body_limit(state.engine_cfg.max_model_len);
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/models", get(models))
        .route("/tokenize", post(tokenize))
        .route("/health", get(health))
        .route("/version", get(version))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}

/// An unknown path, answered as vLLM's FastAPI server does.
async fn not_found() -> Response {
    json_response(StatusCode::NOT_FOUND, &json!({ "detail": "Not Found" }))
}

/// A known path with the wrong method, answered as FastAPI does.
async fn method_not_allowed() -> Response {
    json_response(
        StatusCode::METHOD_NOT_ALLOWED,
        &json!({ "detail": "Method Not Allowed" }),
    )
}

fn json_response(code: StatusCode, v: &Value) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        v.to_string(),
    )
        .into_response()
}

fn err(code: StatusCode, kind: &str, msg: &str) -> Response {
    json_response(code, &api::error(code.as_u16(), kind, msg))
}

async fn health(State(st): State<Arc<AppState>>) -> Response {
    if st.ready() {
        StatusCode::OK.into_response()
    } else {
        StatusCode::SERVICE_UNAVAILABLE.into_response()
    }
}

/// `GET /version`, as vLLM answers it; the mock names itself, so that no
/// one mistakes its trace for a vLLM release's.
async fn version() -> Response {
    axum::Json(serde_json::json!({
        "version": concat!("blis-mockserver ", env!("CARGO_PKG_VERSION"))
    }))
    .into_response()
}

async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        st.metrics.render(),
    )
        .into_response()
}

async fn models(State(st): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if !st.authorized(&headers) {
        return err(
            StatusCode::UNAUTHORIZED,
            "Unauthorized",
            "invalid or missing API key",
        );
    }
    let m = st.engine_cfg.max_model_len;
    json_response(
        StatusCode::OK,
        &json!({
            "object": "list",
            "data": [{
                "id": st.model, "object": "model", "created": unix_s(), "owned_by": "vllm",
                "root": st.model, "parent": null, "max_model_len": if m > 0 { json!(m) } else { json!(null) },
            }],
        }),
    )
}

async fn tokenize(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let body = match body {
        Ok(b) => b,
        Err(r) => return unread_body(r, body_limit(st.engine_cfg.max_model_len)),
    };
    if !st.authorized(&headers) {
        return err(
            StatusCode::UNAUTHORIZED,
            "Unauthorized",
            "invalid or missing API key",
        );
    }
    let v: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return err(
                StatusCode::BAD_REQUEST,
                "BadRequestError",
                &format!("invalid JSON body: {e}"),
            );
        }
    };
    let chat = v.get("messages").is_some();
    let mut with_model = v.clone();
    if with_model.get("model").is_none() {
        with_model["model"] = json!(st.model);
    }
    let p = match api::parse(with_model.to_string().as_bytes(), chat) {
        Ok(p) => p,
        Err(m) => return err(StatusCode::BAD_REQUEST, "BadRequestError", &m),
    };
    json_response(
        StatusCode::OK,
        &json!({ "count": p.prompt_tokens, "max_model_len": st.engine_cfg.max_model_len, "tokens": tokenizer::ids(&p.text) }),
    )
}

async fn completions(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    read_then_generate(st, headers, body, false).await
}

async fn chat(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    read_then_generate(st, headers, body, true).await
}

/// A generation request whose body was read, or the error of one that
/// could not be.
async fn read_then_generate(
    st: Arc<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
    chat: bool,
) -> Response {
    match body {
        Ok(b) => generate(st, headers, b, chat).await,
        Err(r) => unread_body(r, body_limit(st.engine_cfg.max_model_len)),
    }
}

fn unix_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Aborts the engine request when the response is dropped before the end
/// (client disconnected), as vLLM aborts requests of closed connections.
struct AbortGuard {
    engine: EngineHandle,
    id: u64,
    done: bool,
    /// The server's count of requests in flight, less this one at the end.
    in_flight: Arc<AtomicU64>,
}

impl Drop for AbortGuard {
    fn drop(&mut self) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        if !self.done {
            self.engine.abort(self.id);
        }
    }
}

async fn generate(st: Arc<AppState>, headers: HeaderMap, body: Bytes, chat: bool) -> Response {
    let received = Instant::now();
    let (p, fault) = match accept(&st, &headers, &body, chat) {
        Ok(x) => x,
        Err(r) => return r.into_response(),
    };
    let (out, finish) = match output_length(&st, &p, chat) {
        Ok(x) => x,
        Err(r) => return r.into_response(),
    };
    // A bounded queue: beyond `max_queued` waiting requests, 503 (the
    // running ones as of the engine's latest state).
    let in_flight = st.in_flight.fetch_add(1, Ordering::Relaxed);
    if st.max_queued > 0 && in_flight >= st.metrics.running() + st.max_queued {
        st.in_flight.fetch_sub(1, Ordering::Relaxed);
        let mut r = Refusal::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailableError",
            &format!(
                "server overloaded: {} requests waiting (--max-queued-requests)",
                st.max_queued
            ),
        );
        r.retry_after_s = Some(1);
        return r.into_response();
    }
    let bs = st.engine_cfg.block_size.max(1);
    let n = st.counter.fetch_add(1, Ordering::Relaxed);
    let key = xxhash_rust::xxh3::xxh3_64(&n.to_le_bytes()) ^ 0x6d6f_636b;
    let (tx, rx) = unbounded_channel();
    let id = st.engine.submit(Submission {
        input_tokens: p.prompt_tokens,
        output_tokens: out,
        priority: p.priority,
        segments: tokenizer::segments(&p.text, bs, key, out),
        events: tx,
        received,
    });
    let guard = AbortGuard {
        engine: st.engine.clone(),
        id,
        done: false,
        in_flight: st.in_flight.clone(),
    };
    let resp_id = format!("{}-{n:x}", if chat { "chatcmpl" } else { "cmpl" });
    let x_request_id = st.served.as_ref().and_then(|_| {
        headers
            .get("x-request-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    });
    let ctx = Ctx {
        received,
        first_sent: None,
        first_due: None,
        x_request_id,
        st: st.clone(),
        p,
        id: resp_id,
        created: unix_s(),
        out,
        finish,
        fault,
        guard,
        rx,
    };
    if ctx.p.stream {
        stream_response(ctx)
    } else {
        whole_response(ctx).await
    }
}

/// A request refused before it reaches the engine: the OpenAI-style error
/// response vLLM's front end sends.
struct Refusal {
    status: StatusCode,
    kind: &'static str,
    message: String,
    /// A `Retry-After` header, s.
    retry_after_s: Option<u32>,
}

impl Refusal {
    fn new(status: StatusCode, kind: &'static str, message: &str) -> Self {
        Self {
            status,
            kind,
            message: message.to_string(),
            retry_after_s: None,
        }
    }

    fn into_response(self) -> Response {
        let mut r = err(self.status, self.kind, &self.message);
        if let Some(secs) = self.retry_after_s {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        r
    }
}

/// Checks a request as vLLM's front end does before it reaches the
/// engine: the API key, readiness, the body, the model; then an injected
/// HTTP fault, if one is drawn. Returns the parsed request and its fault,
/// or the error response.
fn accept(
    st: &AppState,
    headers: &HeaderMap,
    body: &Bytes,
    chat: bool,
) -> Result<(Parsed, Option<Fault>), Refusal> {
    if !st.authorized(headers) {
        return Err(Refusal::new(
            StatusCode::UNAUTHORIZED,
            "Unauthorized",
            "invalid or missing API key",
        ));
    }
    if !st.ready() {
        return Err(Refusal::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailableError",
            "the server is starting",
        ));
    }
    let mut p = api::parse(body, chat)
        .map_err(|m| Refusal::new(StatusCode::BAD_REQUEST, "BadRequestError", &m))?;
    if p.model.is_empty() {
        p.model.clone_from(&st.model);
    } else if p.model != st.model {
        return Err(Refusal::new(
            StatusCode::NOT_FOUND,
            "NotFoundError",
            &format!("The model `{}` does not exist.", p.model),
        ));
    }
    let fault = st.faults.decide(headers);
    if let Some(f) = fault {
        st.metrics.fault(f.kind());
    }
    if let Some(Fault::Http(code)) = fault {
        let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut r = Refusal::new(status, "InjectedFault", &format!("injected HTTP {code}"));
        if code == 429 {
            r.retry_after_s = Some(st.faults.config().retry_after_s.max(1));
        }
        return Err(r);
    }
    Ok((p, fault))
}

/// The request's output length and finish reason: `max_tokens` (vLLM's
/// default: the rest of the context for chat, 16 for completions) unless
/// the output distribution draws fewer; refused as vLLM refuses a request
/// beyond the context length, and when it could never fit the KV cache.
fn output_length(st: &AppState, p: &Parsed, chat: bool) -> Result<(u32, &'static str), Refusal> {
    let cfg = &st.engine_cfg;
    let default_max = if chat {
        if cfg.max_model_len > 0 {
            cfg.max_model_len.saturating_sub(p.prompt_tokens).max(1)
        } else {
            4096
        }
    } else {
        16
    };
    let max_tokens = p.max_tokens.unwrap_or(default_max);
    let requested = u64::from(p.prompt_tokens) + u64::from(max_tokens);
    if cfg.max_model_len > 0 && requested > u64::from(cfg.max_model_len) {
        return Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            "BadRequestError",
            &format!(
                "This model's maximum context length is {} tokens. However, you requested {} tokens ({} in the messages, {} in the completion).",
                cfg.max_model_len, requested, p.prompt_tokens, max_tokens
            ),
        ));
    }
    let out = if p.ignore_eos || p.min_tokens >= max_tokens {
        max_tokens
    } else {
        let drawn = st.output.draw(
            &mut st
                .rng
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        drawn.clamp(p.min_tokens.max(1), max_tokens)
    };
    let bs = cfg.block_size.max(1);
    if (p.prompt_tokens + out - 1).div_ceil(bs) > cfg.total_kv_blocks {
        return Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            "BadRequestError",
            &format!(
                "prompt and output need more than the {} KV blocks of this server",
                cfg.total_kv_blocks
            ),
        ));
    }
    let finish = if out >= max_tokens { "length" } else { "stop" };
    Ok((out, finish))
}

struct Ctx {
    received: Instant,
    first_sent: Option<Instant>,
    /// When the first token was due (its simulated visible time).
    first_due: Option<Instant>,
    x_request_id: Option<String>,
    st: Arc<AppState>,
    p: Parsed,
    id: String,
    created: u64,
    out: u32,
    finish: &'static str,
    fault: Option<Fault>,
    guard: AbortGuard,
    rx: UnboundedReceiver<Event>,
}

impl Ctx {
    /// Waits until the wall time of simulated `visible_us` when an event
    /// came more than a tokio timer tick (1 ms) beyond the engine's
    /// hand-off lead early; the lead itself is not waited for (it is the
    /// expected delay of getting here, see `engine`).
    async fn wait_visible(&self, visible_us: i64) {
        let e = &self.st.engine;
        let at = e.clock().wall(visible_us);
        let slack = Duration::from_micros(1_000 + e.handoff_lead_us());
        if at > Instant::now() + slack {
            tokio::time::sleep_until(at.into()).await;
        }
    }

    fn stall_ms(&self) -> u64 {
        self.st.faults.config().stall_ms
    }

    /// Records the served timings of a completed response.
    fn log_served(&mut self, output_tokens: u32, chunks: u32) {
        if let Some(log) = &self.st.served {
            let now = Instant::now();
            let us = |t: Instant| t.duration_since(self.received).as_micros() as i64;
            let unix_now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_micros() as i64);
            log.push(Served {
                received_unix_us: unix_now - us(now),
                x_request_id: self.x_request_id.take(),
                ttft_us: us(self.first_sent.unwrap_or(now)),
                ttft_due_us: self.first_due.map(|t| {
                    t.checked_duration_since(self.received)
                        .map_or(0, |d| d.as_micros() as i64)
                }),
                e2e_us: us(now),
                output_tokens,
                chunks,
            });
        }
    }
}

async fn whole_response(mut c: Ctx) -> Response {
    let mut tokens = 0u32;
    let fin = loop {
        match c.rx.recv().await {
            Some(Event::Token { index, .. }) => tokens = index,
            Some(Event::Finished(f)) => break f,
            Some(Event::Rejected(m)) => {
                c.guard.done = true;
                return err(StatusCode::BAD_REQUEST, "BadRequestError", &m);
            }
            None => {
                return err(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "InternalServerError",
                    "engine stopped",
                );
            }
        }
    };
    c.guard.done = true;
    c.wait_visible(fin.last_token_us).await;
    let text: String = match &c.st.script {
        Some(script) => script.next().to_string(),
        None => (1..=tokens.max(fin.output_tokens))
            .map(tokenizer::output_token)
            .collect(),
    };
    match c.fault {
        Some(Fault::Drop) => {
            let s = futures::stream::once(async {
                Err::<Bytes, _>(std::io::Error::other("injected connection drop"))
            });
            return Response::builder()
                .status(StatusCode::OK)
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from_stream(s))
                .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response());
        }
        Some(Fault::Stall) => tokio::time::sleep(Duration::from_millis(c.stall_ms())).await,
        Some(Fault::Malformed) => {
            return (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "application/json")],
                format!("{{\"id\": \"{}\", \"choices\": [", c.id),
            )
                .into_response();
        }
        _ => {}
    }
    c.st.metrics.success(c.finish);
    c.log_served(fin.output_tokens, 1);
    let usage = (c.fault != Some(Fault::MissingUsage)).then(|| {
        api::usage(
            c.p.prompt_tokens,
            fin.output_tokens,
            Some(fin.cached_tokens),
        )
    });
    json_response(
        StatusCode::OK,
        &api::full(&c.p, &c.id, c.created, &text, c.finish, usage),
    )
}

type SseItem = Result<SseEvent, std::io::Error>;

fn stream_response(c: Ctx) -> Response {
    let state = SseState {
        fault_at: c.out.div_ceil(2).max(1),
        c,
        phase: Phase::Tokens,
        faulted: false,
        pending: None,
    };
    Sse::new(futures::stream::unfold(state, SseState::next)).into_response()
}

/// Where a streaming response is: sending tokens, owing `[DONE]`, ended.
enum Phase {
    Tokens,
    Done,
    End,
}

/// A streaming response between two events.
struct SseState {
    c: Ctx,
    phase: Phase,
    /// The output index at which an injected stream fault strikes.
    fault_at: u32,
    /// Whether the fault was injected.
    faulted: bool,
    /// An event to send before the next.
    pending: Option<SseEvent>,
}

type SseStep = Option<(SseItem, SseState)>;

impl SseState {
    fn send(self, ev: SseEvent, phase: Phase) -> SseStep {
        Some((Ok(ev), SseState { phase, ..self }))
    }

    /// The next event of the stream.
    async fn next(mut self) -> SseStep {
        if let Some(ev) = self.pending.take() {
            return Some((Ok(ev), self));
        }
        match self.phase {
            Phase::End => None,
            Phase::Done => self.send(SseEvent::default().data("[DONE]"), Phase::End),
            Phase::Tokens => match self.c.rx.recv().await {
                Some(Event::Token {
                    index,
                    visible_us,
                    handoff_us,
                }) => self.token(index, visible_us, handoff_us).await,
                Some(Event::Finished(fin)) => self.finished(&fin),
                Some(Event::Rejected(m)) => {
                    self.c.guard.done = true;
                    let v = json!({ "error": api::error(400, "BadRequestError", &m) });
                    self.send(SseEvent::default().data(v.to_string()), Phase::Done)
                }
                None => None,
            },
        }
    }

    /// Output token `index`, sent when it is visible (simulated
    /// `visible_us`), unless an injected fault takes its place.
    async fn token(mut self, index: u32, visible_us: i64, handoff_us: i64) -> SseStep {
        let c = &mut self.c;
        if index == 1 {
            c.st.engine.record_handoff(handoff_us);
            c.first_due = Some(c.st.engine.clock().wall(visible_us));
        }
        c.wait_visible(visible_us).await;
        if index == self.fault_at && !self.faulted {
            self.faulted = true;
            match self.c.fault {
                Some(Fault::Drop) => {
                    let e: SseItem = Err(std::io::Error::other("injected connection drop"));
                    return Some((
                        e,
                        SseState {
                            phase: Phase::End,
                            ..self
                        },
                    ));
                }
                Some(Fault::Stall) => {
                    tokio::time::sleep(Duration::from_millis(self.c.stall_ms())).await;
                }
                Some(Fault::Malformed) => {
                    let ev = SseEvent::default().data(format!(
                        "{{\"id\": \"{}\", \"choices\": [{{\"text\": ",
                        self.c.id
                    ));
                    return self.send(ev, Phase::Tokens);
                }
                _ => {}
            }
        }
        let c = &mut self.c;
        let last = index >= c.out;
        let mut v = api::chunk(
            &c.p,
            &c.id,
            c.created,
            &tokenizer::output_token(index),
            last.then_some(c.finish),
        );
        if c.p.continuous_usage && c.fault != Some(Fault::MissingUsage) {
            v["usage"] = api::usage(c.p.prompt_tokens, index, None);
        }
        if c.first_sent.is_none() {
            c.first_sent = Some(Instant::now());
        }
        let ev = SseEvent::default().data(v.to_string());
        if index == 1 && c.p.chat {
            // vLLM sends the role alone first, with the first token.
            let role = api::role_chunk(&c.p, &c.id, c.created);
            self.pending = Some(ev);
            return self.send(SseEvent::default().data(role.to_string()), Phase::Tokens);
        }
        self.send(ev, Phase::Tokens)
    }

    /// The end: the usage chunk if asked for, then `[DONE]`.
    fn finished(mut self, fin: &blis_replay::engine::instance::Finished) -> SseStep {
        let c = &mut self.c;
        c.guard.done = true;
        c.st.metrics.success(c.finish);
        c.log_served(fin.output_tokens, fin.output_tokens);
        if c.p.include_usage && c.fault != Some(Fault::MissingUsage) {
            let u = api::usage(
                c.p.prompt_tokens,
                fin.output_tokens,
                Some(fin.cached_tokens),
            );
            let v = api::usage_chunk(&c.p, &c.id, c.created, u);
            return self.send(SseEvent::default().data(v.to_string()), Phase::Done);
        }
        self.send(SseEvent::default().data("[DONE]"), Phase::End)
    }
}

/// Binds the server.
///
/// # Errors
/// The address cannot be bound.
pub async fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await
}

#[cfg(test)]
mod tests {
    use super::Script;

    #[test]
    fn a_script_answers_its_completions_in_turn_and_names_a_bad_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.jsonl");
        std::fs::write(&p, "\"one\"\n\n{\"content\": \"two\"}\n").unwrap();
        let s = Script::read(&p).unwrap();
        assert_eq!([s.next(), s.next(), s.next()], ["one", "two", "one"]);
        std::fs::write(&p, "\"one\"\n{\"text\": 2}\n").unwrap();
        let e = Script::read(&p).unwrap_err();
        assert!(
            e.ends_with("c.jsonl:2: an object needs a \"content\" string"),
            "{e}"
        );
        std::fs::write(&p, "\n").unwrap();
        assert!(Script::read(&p).unwrap_err().contains("no completions"));
    }
}
