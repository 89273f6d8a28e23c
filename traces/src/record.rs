//! One request of a workload ([`Request`]) and what happened to it
//! ([`Outcome`]); together a row of the trace CSV ([`TraceRecord`]).

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

/// A cheaply clonable immutable string, used for the per-client labels that
/// repeat on every request (client, tenant, SLO class, model, prefix group).
pub type SharedStr = Arc<str>;

/// The empty [`SharedStr`]: one shared allocation, so that a default
/// record's six empty labels cost six reference counts, not six
/// allocations.
pub fn empty_str() -> SharedStr {
    static EMPTY: std::sync::LazyLock<SharedStr> = std::sync::LazyLock::new(|| Arc::from(""));
    EMPTY.clone()
}

/// One request as planned by a workload: who sends it, when, and how many
/// tokens go in and come out. Times are microseconds relative to the run
/// start.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// Sequential id, 0-based, in order of arrival.
    pub request_id: u64,
    /// The client (traffic source) that sends it.
    pub client_id: SharedStr,
    /// Tenant, for fairness and quota accounting; may be empty.
    pub tenant_id: SharedStr,
    /// SLO class (`critical`, `standard`, `batch`, ...); may be empty.
    pub slo_class: SharedStr,
    /// Multi-turn session; empty for single-turn requests.
    pub session_id: SharedStr,
    /// 0-based round within the session.
    pub round_index: u32,
    /// Requests with the same non-empty prefix group share their first
    /// `prefix_length` input tokens.
    pub prefix_group: SharedStr,
    /// Tokens of the shared prefix (counted in `input_tokens`).
    pub prefix_length: u32,
    /// Whether the response is streamed (SSE); TTFT and ITL need it.
    pub streaming: bool,
    /// Input (prompt) tokens, all modalities and the prefix included.
    pub input_tokens: u32,
    /// Output tokens: planned for generated traces, the server's
    /// `usage.completion_tokens` for real ones.
    pub output_tokens: u32,
    /// Text part of the input (multimodal workloads; 0 otherwise).
    pub text_tokens: u32,
    /// Image tokens of the input, all images together.
    pub image_tokens: u32,
    /// Audio tokens of the input.
    pub audio_tokens: u32,
    /// Video tokens of the input.
    pub video_tokens: u32,
    /// Fraction of the output that is reasoning tokens, in `[0, 1]`.
    pub reason_ratio: f64,
    /// Model name the request targets; empty means the server's default.
    pub model: SharedStr,
    /// Deadline in µs on the same clock as `arrival_time_us` (BLIS: arrival
    /// plus the client's timeout); `None` is no deadline (written as 0).
    pub deadline_us: Option<i64>,
    /// Intended send time, µs since the run start.
    pub arrival_time_us: i64,
    /// For a later round of a session: the think time after the previous
    /// round's response; the round is sent no earlier than that response plus
    /// this, and `arrival_time_us` is then a lower bound.
    pub think_time_us: Option<i64>,
    /// Identity of the request's own (non-prefix) token content. Requests
    /// with equal keys and lengths have identical tokens. `None` derives it
    /// from the session (all rounds of a session share one growing content)
    /// or the request id; see [`crate::content`].
    pub content_key: Option<u64>,
    /// Prefix-block identities as given by a trace such as Mooncake: block
    /// `i` covers input tokens `[i*hash_block_tokens, (i+1)*hash_block_tokens)`.
    pub hash_ids: Option<HashIds>,
}

/// Block identities of a request's input given by a trace (Mooncake's
/// `hash_ids`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HashIds {
    /// Tokens per identified block (Mooncake: 512).
    pub block_tokens: u32,
    /// One id per block, in order; equal ids mean equal token content.
    pub ids: Arc<[u64]>,
}

impl Default for Request {
    fn default() -> Self {
        Self {
            request_id: 0,
            client_id: empty_str(),
            tenant_id: empty_str(),
            slo_class: empty_str(),
            session_id: empty_str(),
            round_index: 0,
            prefix_group: empty_str(),
            prefix_length: 0,
            streaming: false,
            input_tokens: 0,
            output_tokens: 0,
            text_tokens: 0,
            image_tokens: 0,
            audio_tokens: 0,
            video_tokens: 0,
            reason_ratio: 0.0,
            model: empty_str(),
            deadline_us: None,
            arrival_time_us: 0,
            think_time_us: None,
            content_key: None,
            hash_ids: None,
        }
    }
}

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Status {
    /// Completed with a response.
    Ok,
    /// The server or the connection failed (HTTP error, dropped stream, bad JSON).
    Error,
    /// The client's timeout expired.
    Timeout,
    /// The run stopped (e.g. SIGINT) before the request completed or was sent.
    Cancelled,
}

impl Status {
    /// The CSV spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Error => "error",
            Status::Timeout => "timeout",
            Status::Cancelled => "cancelled",
        }
    }

    /// All statuses, in report order.
    pub const ALL: [Status; 4] = [
        Status::Ok,
        Status::Error,
        Status::Timeout,
        Status::Cancelled,
    ];
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Status {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "ok" => Ok(Status::Ok),
            "error" => Ok(Status::Error),
            "timeout" => Ok(Status::Timeout),
            "cancelled" | "canceled" => Ok(Status::Cancelled),
            other => Err(format!(
                "unknown status {other:?} (expected ok, error, timeout or cancelled)"
            )),
        }
    }
}

/// What happened to a request when it was sent (real mode) or simulated
/// (replayed mode). All `*_time_us` are absolute Unix microseconds in real
/// traces; subtract the header's `run_start_unix_us` for run-relative times.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Outcome {
    /// Prompt tokens the server reported (`usage.prompt_tokens`); the truth
    /// for replay. Written as 0 when unknown (BLIS's convention).
    pub server_input_tokens: Option<u32>,
    /// When the request was actually sent.
    pub send_time_us: Option<i64>,
    /// When the first response chunk (first SSE event, or the whole
    /// non-streaming body) arrived.
    pub first_chunk_time_us: Option<i64>,
    /// When the last byte of the response arrived.
    pub last_chunk_time_us: Option<i64>,
    /// SSE events with content received.
    pub num_chunks: u32,
    /// How the request ended; `None` for planned (not yet run) requests.
    pub status: Option<Status>,
    /// Error text for non-`ok` requests (never contains credentials).
    pub error_message: String,
    /// The server's `finish_reason` (`stop`, `length`, ...).
    pub finish_reason: String,
    /// HTTP status code, when a response arrived (extra column `http_status`).
    pub http_status: Option<u16>,
    /// Prompt tokens served from the prefix cache
    /// (`usage.prompt_tokens_details.cached_tokens`, extra column).
    pub cached_tokens: Option<u32>,
    /// The `x-request-id` sent with the request (extra column).
    pub x_request_id: Option<String>,
}

/// One row of a trace-v2 request CSV.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TraceRecord {
    /// The planned request.
    pub request: Request,
    /// What happened to it.
    pub outcome: Outcome,
    /// Extra columns this crate does not know, as `(name, value)` in file
    /// order; kept so that reading and writing back loses nothing.
    pub other: Vec<(String, String)>,
}

impl TraceRecord {
    /// A record for a planned request with no outcome yet.
    pub fn planned(request: Request) -> Self {
        Self {
            request,
            outcome: Outcome::default(),
            other: Vec::new(),
        }
    }

    /// Time to first token in µs (`first_chunk - send`), when both are known.
    pub fn ttft_us(&self) -> Option<i64> {
        Some(self.outcome.first_chunk_time_us? - self.outcome.send_time_us?)
    }

    /// End-to-end latency in µs (`last_chunk - send`), when both are known.
    pub fn e2e_us(&self) -> Option<i64> {
        Some(self.outcome.last_chunk_time_us? - self.outcome.send_time_us?)
    }

    /// Input tokens the server saw: `server_input_tokens` when reported,
    /// else the planned `input_tokens`.
    pub fn effective_input_tokens(&self) -> u32 {
        self.outcome
            .server_input_tokens
            .unwrap_or(self.request.input_tokens)
    }
}
