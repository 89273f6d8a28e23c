//! What a request got back: what was received of a response as it arrived
//! ([`Capture`]), and why a request failed ([`Failure`], [`ErrorKind`]),
//! with error texts reduced to one line.

use serde_json::Value;

/// Why a request did not complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The server answered with a non-2xx HTTP status.
    Http(u16),
    /// No connection could be made (refused, unreachable, DNS, TLS).
    Connect,
    /// The server closed the connection before the response ended (before
    /// its head, or mid-stream).
    Dropped,
    /// A chunk or body was not the JSON (or SSE) expected.
    Malformed,
    /// The server reported an error inside a 200 stream.
    ServerError,
    /// The client's timeout expired.
    Timeout,
    /// The run stopped while the request was in flight.
    Cancelled,
    /// The run stopped before the request was sent.
    NotSent,
}

impl ErrorKind {
    /// The stable label that starts the trace's `error_message`
    /// (`http_429`, `dropped`, ...), used to count errors by kind.
    pub fn label(self) -> String {
        match self {
            ErrorKind::Http(code) => format!("http_{code}"),
            ErrorKind::Connect => "connect".into(),
            ErrorKind::Dropped => "dropped".into(),
            ErrorKind::Malformed => "malformed".into(),
            ErrorKind::ServerError => "server_error".into(),
            ErrorKind::Timeout => "timeout".into(),
            ErrorKind::Cancelled => "cancelled".into(),
            ErrorKind::NotSent => "not_sent".into(),
        }
    }
}

/// The kind label of a trace row's `error_message` (the text before the
/// first `:`), or `other`.
pub fn error_label(message: &str) -> &str {
    match message.split_once(':') {
        Some((k, _)) if !k.is_empty() && !k.contains(' ') => k,
        _ => "other",
    }
}

/// A failed request: its kind and a one-line description.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// What went wrong.
    pub kind: ErrorKind,
    /// Details (never credentials).
    pub detail: String,
}

impl Failure {
    pub(crate) fn new(kind: ErrorKind, detail: impl Into<String>) -> Self {
        Self {
            kind,
            detail: detail.into(),
        }
    }

    /// The trace's `error_message`: `LABEL: detail`.
    pub fn message(&self) -> String {
        format!("{}: {}", self.kind.label(), self.detail)
    }
}

/// The row warning of a stream asked for and a whole JSON body sent.
pub const UNSTREAMED: &str = "the server ignored stream: true and sent the whole response at once (application/json): TTFT is the time to the whole response; --no-stream says so up front";

/// The row warning of a whole response asked for and a stream sent.
pub const STREAMED_UNASKED: &str =
    "the server streamed the response although stream: false was asked (text/event-stream)";

/// The row warning of a stream that ended cleanly after its
/// `finish_reason` but without `[DONE]`.
pub const ENDED_WITHOUT_DONE: &str = "the stream ended without [DONE] (after finish_reason)";

/// The start of the row warning of a response whose usage counts more
/// completion tokens than the `max_tokens` asked: a reasoning API that
/// counts its reasoning outside `max_tokens` (DeepSeek's), or a server that
/// ignores `max_tokens` or miscounts. The row keeps the server's count.
pub const OVER_MAX_TOKENS: &str = "the usage counts more completion tokens than max_tokens";

/// The row warning of a stream that finished (a `finish_reason`) without
/// one chunk of content: no token, so no TTFT.
pub const FINISHED_WITHOUT_TOKEN: &str =
    "the stream finished without a token (no content before its finish_reason)";

/// What was received of one response. Times are Unix µs.
#[derive(Debug, Default, Clone)]
pub struct Capture {
    /// When the request was handed to the connection.
    pub send_us: Option<i64>,
    /// When the first content chunk (or the first byte of a whole body)
    /// arrived.
    pub first_us: Option<i64>,
    /// When the response ended (or the last byte before a failure).
    pub last_us: Option<i64>,
    /// Arrival time of every content chunk.
    pub chunk_times: Vec<i64>,
    /// Tokens of each content chunk, when the server reported running usage
    /// (vLLM's `continuous_usage_stats`); empty otherwise.
    pub chunk_tokens: Vec<u32>,
    /// HTTP status.
    pub http_status: Option<u16>,
    /// `usage.prompt_tokens`.
    pub prompt_tokens: Option<u32>,
    /// `usage.completion_tokens`.
    pub completion_tokens: Option<u32>,
    /// `usage.prompt_tokens_details.cached_tokens`.
    pub cached_tokens: Option<u32>,
    /// The last `finish_reason` seen.
    pub finish_reason: String,
    /// Keep the generated text (for the next round of a session).
    pub keep_text: bool,
    /// The generated text (with `keep_text`).
    pub text: String,
    /// Something the exchange did that the numbers of a successful row
    /// should be read with (a stream asked for and a whole body sent).
    pub warning: Option<String>,
    /// The most content chunks read before the response is given up as
    /// malformed ([`chunk_limit`] of the request's `max_tokens`); `None`:
    /// no limit.
    pub max_chunks: Option<usize>,
    pub(crate) running_completion: u32,
    pub(crate) running_chunks: bool,
    /// A stream that finished without a content chunk: its output is the
    /// server's count, else 0 (not the planned length).
    pub(crate) streamed_no_token: bool,
}

/// The most content chunks a stream for `max_tokens` tokens may carry:
/// eight per token and 64 more. A server streams a token in one chunk or a
/// few (the vLLM runs of `vllm-ground-truth` carried two per token; role,
/// finish and usage chunks carry no content); one that streams on past
/// this ignores `max_tokens`, and reading on would fill the disk with
/// chunk times until the timeout (a flooding server wrote 488 MB in 20 s).
pub fn chunk_limit(max_tokens: u32) -> usize {
    8 * max_tokens.max(1) as usize + 64
}

impl Capture {
    /// A capture that keeps the generated text when `keep_text`.
    pub fn new(keep_text: bool) -> Self {
        Self {
            keep_text,
            ..Self::default()
        }
    }

    /// Output tokens: the server's count, else the tokens carried by the
    /// content chunks (for a stream without usage).
    pub fn output_tokens(&self) -> Option<u32> {
        if self.streamed_no_token {
            return Some(self.completion_tokens.unwrap_or(0));
        }
        self.completion_tokens.or_else(|| {
            if self.chunk_tokens.len() == self.chunk_times.len() && !self.chunk_tokens.is_empty() {
                Some(self.chunk_tokens.iter().sum())
            } else if !self.chunk_times.is_empty() {
                Some(self.chunk_times.len() as u32)
            } else {
                None
            }
        })
    }
}

/// The text of an error object (`{"message": ...}`) or value.
pub(crate) fn error_text(v: &Value) -> String {
    let m = v
        .get("message")
        .and_then(Value::as_str)
        .map(str::to_string)
        .or_else(|| v.as_str().map(str::to_string))
        .unwrap_or_else(|| v.to_string());
    one_line(&m, 300)
}

/// The text of a non-JSON error body on one line, at most 200 characters:
/// an HTML page (a server that is not OpenAI-compatible, a proxy's error
/// page) is reduced to the text of its body.
pub(crate) fn error_body_text(body: &str) -> String {
    let t = body.trim_start();
    let html = t.starts_with('<')
        && t.get(..t.len().min(512))
            .is_some_and(|h| h.to_ascii_lowercase().contains("html"));
    if !html {
        return one_line(body, 200);
    }
    let lower = t.to_ascii_lowercase();
    let from = lower.find("<body").unwrap_or(0);
    let mut text = String::with_capacity(t.len().min(4096));
    let mut in_tag = false;
    for c in t[from..].chars() {
        match c {
            '<' => {
                in_tag = true;
                text.push(' ');
            }
            '>' => in_tag = false,
            c if !in_tag => text.push(c),
            _ => {}
        }
    }
    let words: Vec<&str> = text.split_whitespace().collect();
    one_line(&words.join(" "), 200)
}

pub(crate) fn one_line(s: &str, max: usize) -> String {
    let s: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let s = s.trim();
    if s.chars().count() > max {
        let mut t: String = s.chars().take(max).collect();
        t.push('…');
        t
    } else {
        s.to_string()
    }
}

/// A transport error and its causes on one line.
pub fn describe(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = String::new();
    let mut cur: Option<&dyn std::error::Error> = Some(e);
    while let Some(err) = cur {
        let t = err.to_string();
        if !s.contains(&t) {
            if !s.is_empty() {
                s.push_str(": ");
            }
            s.push_str(&t);
        }
        cur = err.source();
    }
    one_line(&s, 300)
}
