//! One request to an OpenAI-compatible server, measured: the request body
//! for each server family, the send, and the response read by
//! [`crate::sse`] event by event with the arrival time of every SSE chunk,
//! the usage, the finish reason and, for a failure, what went wrong.
//!
//! A [`Capture`] is filled in place while the response arrives, so that a
//! request cut short (timeout, SIGINT) keeps everything received so far.

use std::time::Duration;

use reqwest::header::{AUTHORIZATION, CONTENT_ENCODING, CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use serde::Serialize;
use serde_json::Value;

use crate::clock::RunClock;
pub use crate::response::{Capture, ErrorKind, Failure, describe, error_label};
use crate::response::{error_body_text, error_text, one_line};

/// The API a run speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `/v1/completions`.
    Completions,
    /// `/v1/chat/completions`.
    Chat,
}

/// The server family (selects how output length is forced and the metric
/// names understood).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerType {
    /// vLLM: `max_tokens` with `ignore_eos` and `min_tokens`.
    Vllm,
    /// SGLang: `max_tokens` with `ignore_eos`.
    Sglang,
    /// llama.cpp's server: `max_tokens` with `ignore_eos`.
    Llamacpp,
    /// Any OpenAI-compatible server: `max_tokens` only.
    Openai,
}

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: &'static str,
    /// Its text.
    pub content: String,
}

/// A prompt: completion text or chat messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prompt {
    /// `/v1/completions` text.
    Text(String),
    /// `/v1/chat/completions` messages.
    Chat(Vec<Message>),
}

/// Where and how requests are sent.
#[derive(Debug, Clone)]
pub struct Endpoint {
    client: reqwest::Client,
    url: reqwest::Url,
    api: Api,
    server: ServerType,
    model: String,
    auth: Option<HeaderValue>,
}

/// An HTTP client tuned for measuring: no proxies (a proxy would be in
/// every measurement), no Nagle delay, pooled keep-alive connections.
///
/// # Errors
/// The TLS backend or resolver could not be set up.
pub fn client() -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder()
        .no_proxy()
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(10))
        .pool_idle_timeout(Duration::from_secs(60))
        .build()
}

/// The server's base URL for `server_url`: without a trailing `/`, and
/// without a trailing `/v1`, `/v1/completions` or `/v1/chat/completions`
/// (the OpenAI SDK's `base_url` ends in `/v1`, and people paste the
/// endpoint itself), since the requests go to `BASE/v1/...` and the
/// metrics to `BASE/metrics`. A path before them (a proxy's prefix) stays;
/// the scheme is put in lower case ([`lower_scheme`]).
pub fn base_url(server_url: &str) -> String {
    let lowered = lower_scheme(server_url);
    let mut base = lowered.trim_end_matches('/');
    for suffix in ["/v1/chat/completions", "/v1/completions", "/v1"] {
        if let Some(b) = base.strip_suffix(suffix) {
            base = b.trim_end_matches('/');
            break;
        }
    }
    base.to_string()
}

/// `url` as messages show it: a password in its user info
/// (`http://user:PASS@host/`, sent as HTTP basic auth) replaced by `***`,
/// so that errors, warnings and logs never carry it. Everything else is
/// kept as given.
pub fn shown_url(url: &str) -> String {
    let Some(start) = url.find("://").map(|i| i + 3) else {
        return url.to_string();
    };
    let end = url[start..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |i| start + i);
    let authority = &url[start..end];
    let Some(at) = authority.rfind('@') else {
        return url.to_string();
    };
    match authority[..at].find(':') {
        Some(colon) => format!("{}***{}", &url[..start + colon + 1], &url[start + at..]),
        None => url.to_string(),
    }
}

/// `server_url` with its scheme in lower case (`HTTP://h` is `http://h`:
/// schemes are case-insensitive, RFC 3986 §3.1); anything else as given.
pub fn lower_scheme(server_url: &str) -> String {
    match server_url.find("://") {
        Some(i) if server_url[..i].bytes().all(|b| b.is_ascii_alphabetic()) => {
            format!(
                "{}{}",
                server_url[..i].to_ascii_lowercase(),
                &server_url[i..]
            )
        }
        _ => server_url.to_string(),
    }
}

/// Whether this build can reach `server_url` as a base URL: an
/// `https://` server needs the `tls` feature (rustls), without which the
/// HTTP client would only say "scheme is not http"; and the request paths
/// (`/v1/...`, `/metrics`, `/tokenize`) are appended to it, so a query
/// string or fragment (`?api-version=...`) would end up inside them.
///
/// # Errors
/// The message to show, naming the URL and the build that reaches it.
pub fn check_scheme(server_url: &str) -> Result<(), String> {
    if let Some(at) = server_url.find(['?', '#']) {
        return Err(format!(
            "--server-url {}: a query string or fragment ({:?}) is not supported: the requests go to BASE/v1/..., the metrics to BASE/metrics; give the server's base URL (e.g. http://127.0.0.1:8000)",
            crate::response::one_line(&shown_url(server_url), 200),
            crate::response::one_line(&server_url[at..], 40)
        ));
    }
    let https = server_url
        .trim_start()
        .get(..8)
        .is_some_and(|s| s.eq_ignore_ascii_case("https://"));
    if https && !cfg!(feature = "tls") {
        return Err(format!(
            "--server-url {}: this build has no TLS; build with `cargo build --release --features blis-loadgen/tls` for https servers, or reach the server over http (e.g. `kubectl port-forward`)",
            shown_url(server_url)
        ));
    }
    Ok(())
}

/// The `Authorization` header value of an API key, marked sensitive so it
/// never appears in debug output.
pub fn bearer(key: &str) -> Option<HeaderValue> {
    let mut v = HeaderValue::from_str(&format!("Bearer {key}")).ok()?;
    v.set_sensitive(true);
    Some(v)
}

impl Endpoint {
    /// An endpoint at `base_url` (e.g. `http://127.0.0.1:8000`).
    pub fn new(
        client: reqwest::Client,
        base_url: &str,
        api: Api,
        server: ServerType,
        model: &str,
        api_key: Option<&str>,
    ) -> Result<Self, String> {
        let url = format!("{}{}", base_url.trim_end_matches('/'), api_path(api));
        let url =
            reqwest::Url::parse(&url).map_err(|e| format!("invalid server URL {url:?}: {e}"))?;
        Ok(Self {
            client,
            url,
            api,
            server,
            model: model.to_string(),
            auth: api_key.and_then(bearer),
        })
    }

    /// The API spoken.
    pub fn api(&self) -> Api {
        self.api
    }

    /// The path requests go to (`/v1/completions`, `/v1/chat/completions`).
    pub fn path(&self) -> &'static str {
        api_path(self.api)
    }

    /// Whether chunks carry running usage (so per-chunk token counts are
    /// known): vLLM's `stream_options.continuous_usage_stats`.
    pub fn per_chunk_tokens(&self) -> bool {
        self.server == ServerType::Vllm
    }

    /// The JSON body of a request for `max_tokens` output tokens, forced to
    /// exactly that length where the server supports it: vLLM
    /// `ignore_eos` + `min_tokens`, SGLang and llama.cpp `ignore_eos`; plain
    /// OpenAI servers only get the cap. Streams ask for `usage` in the last
    /// chunk (`stream_options.include_usage`), and vLLM for running usage in
    /// every chunk (`continuous_usage_stats`), which gives tokens per chunk.
    pub fn body(&self, prompt: &Prompt, max_tokens: u32, stream: bool) -> Vec<u8> {
        #[derive(Serialize)]
        struct Msg<'a> {
            role: &'a str,
            content: &'a str,
        }
        #[derive(Serialize)]
        struct StreamOptions {
            include_usage: bool,
            #[serde(skip_serializing_if = "Option::is_none")]
            continuous_usage_stats: Option<bool>,
        }
        #[derive(Serialize)]
        struct Body<'a> {
            model: &'a str,
            #[serde(skip_serializing_if = "Option::is_none")]
            prompt: Option<&'a str>,
            #[serde(skip_serializing_if = "Option::is_none")]
            messages: Option<Vec<Msg<'a>>>,
            max_tokens: u32,
            stream: bool,
            #[serde(skip_serializing_if = "Option::is_none")]
            ignore_eos: Option<bool>,
            #[serde(skip_serializing_if = "Option::is_none")]
            min_tokens: Option<u32>,
            #[serde(skip_serializing_if = "Option::is_none")]
            stream_options: Option<StreamOptions>,
        }
        let max_tokens = max_tokens.max(1);
        let vllm = self.server == ServerType::Vllm;
        let (prompt, messages) = match prompt {
            Prompt::Text(t) => (Some(t.as_str()), None),
            Prompt::Chat(m) => (
                None,
                Some(
                    m.iter()
                        .map(|m| Msg {
                            role: m.role,
                            content: &m.content,
                        })
                        .collect(),
                ),
            ),
        };
        let body = Body {
            model: &self.model,
            prompt,
            messages,
            max_tokens,
            stream,
            ignore_eos: (self.server != ServerType::Openai).then_some(true),
            min_tokens: vllm.then_some(max_tokens),
            stream_options: stream.then_some(StreamOptions {
                include_usage: true,
                continuous_usage_stats: vllm.then_some(true),
            }),
        };
        serde_json::to_vec(&body).unwrap_or_default()
    }

    /// Sends `body` with `x-request-id: xid` and reads the response into
    /// `cap` (times from `clock`). Returns when the response is complete or
    /// has failed; a caller's timeout may drop this future at any await,
    /// and `cap` then holds what had arrived.
    ///
    /// A response the reading of it panics on (a defect of the client or
    /// of a library it reads with, met on a server's odd bytes) is a
    /// `malformed` failure of that request, not the end of the run: its
    /// row is kept like any other.
    ///
    /// # Errors
    /// The failure, classified ([`ErrorKind`]).
    pub async fn send(
        &self,
        body: Vec<u8>,
        stream: bool,
        xid: &str,
        clock: &RunClock,
        cap: &mut Capture,
    ) -> Result<(), Failure> {
        match crate::guard::guarded(self.exchange(body, stream, xid, clock, cap)).await {
            Ok(r) => r,
            Err(what) => Err(Failure::new(
                ErrorKind::Malformed,
                format!(
                    "the client failed reading this response (a defect of blis-loadgen; please report it with the response): {what}"
                ),
            )),
        }
    }

    /// [`Endpoint::send`], unguarded.
    async fn exchange(
        &self,
        body: Vec<u8>,
        stream: bool,
        xid: &str,
        clock: &RunClock,
        cap: &mut Capture,
    ) -> Result<(), Failure> {
        let mut req = self
            .client
            .post(self.url.clone())
            .header(CONTENT_TYPE, "application/json")
            .header("x-request-id", xid)
            .body(body);
        if let Some(a) = &self.auth {
            req = req.header(AUTHORIZATION, a.clone());
        }
        cap.send_us = Some(clock.now_us());
        // No connection is `connect`; a connection the server closed
        // before its response head (a crash, or a drop faster than the
        // head's flush) is `dropped`, as one closed mid-response.
        let resp = req.send().await.map_err(|e| {
            let kind = if e.is_connect() {
                ErrorKind::Connect
            } else {
                ErrorKind::Dropped
            };
            Failure::new(kind, describe(&e))
        })?;
        let status = resp.status();
        cap.http_status = Some(status.as_u16());
        if !status.is_success() {
            let retry = resp
                .headers()
                .get(RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .map(|v| format!(" (Retry-After: {v})"))
                .unwrap_or_default();
            let text = error_body(resp).await;
            cap.last_us = Some(clock.now_us());
            let detail = serde_json::from_str::<Value>(&text)
                .ok()
                .and_then(|v| v.get("error").map(error_text))
                .unwrap_or_else(|| error_body_text(&text));
            return Err(Failure::new(
                ErrorKind::Http(status.as_u16()),
                format!("HTTP {status}{retry}: {detail}"),
            ));
        }
        let content_type = resp
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_ascii_lowercase();
        // No encoding is asked for (no Accept-Encoding), so a compressed
        // body is a misbehaving server or proxy: say so, rather than fail
        // on its bytes as a malformed stream.
        if let Some(enc) = resp
            .headers()
            .get(CONTENT_ENCODING)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|e| !e.is_empty() && !e.eq_ignore_ascii_case("identity"))
        {
            let enc = one_line(enc, 40);
            cap.last_us = Some(clock.now_us());
            return Err(Failure::new(
                ErrorKind::Malformed,
                format!("HTTP {status} with Content-Encoding: {enc}, which was not asked for"),
            ));
        }
        if !stream {
            if content_type.starts_with("text/event-stream") {
                // A server (or gateway) that streams whatever was asked:
                // its events are the response, ended by `[DONE]`.
                crate::sse::read_stream(resp, clock, cap).await?;
                let w = crate::response::STREAMED_UNASKED;
                cap.warning = Some(match cap.warning.take() {
                    Some(earlier) => format!("{w}; {earlier}"),
                    None => w.into(),
                });
                return Ok(());
            }
            return crate::sse::read_whole(resp, clock, cap).await;
        }
        // A stream was asked for. Some servers ignore `stream: true` and
        // answer with the whole completion; a proxy may answer 200 with an
        // HTML page of its own.
        if content_type.starts_with("application/json") {
            crate::sse::read_whole(resp, clock, cap).await?;
            // One chunk, at the end, as a row of a `--no-stream` run.
            cap.chunk_times.extend(cap.last_us);
            cap.warning = Some(crate::response::UNSTREAMED.into());
            return Ok(());
        }
        // (Not text/plain: some proxies label a real event stream so.)
        if content_type.starts_with("text/html") {
            let text = error_body(resp).await;
            cap.last_us = Some(clock.now_us());
            return Err(Failure::new(
                ErrorKind::Malformed,
                format!(
                    "HTTP {status} with {content_type}, not an event stream: {}",
                    error_body_text(&text)
                ),
            ));
        }
        crate::sse::read_stream(resp, clock, cap).await
    }
}

/// Reads at most `max` bytes of `resp`'s body: the bytes read and whether
/// the body went on past them (the rest is not read). A hostile or broken
/// server's endless or huge body costs at most `max` bytes of memory.
///
/// # Errors
/// The connection failing mid-body.
pub async fn read_capped(
    mut resp: reqwest::Response,
    max: usize,
) -> reqwest::Result<(Vec<u8>, bool)> {
    let mut body = Vec::new();
    while let Some(piece) = resp.chunk().await? {
        let room = max - body.len();
        if piece.len() > room {
            body.extend_from_slice(&piece[..room]);
            return Ok((body, true));
        }
        body.extend_from_slice(&piece);
    }
    Ok((body, false))
}

/// The most of an error or HTML page read for its message, bytes (64 KiB).
pub const MAX_ERROR_BODY: usize = 64 << 10;

/// The text of an error response's body for its message: its first
/// [`MAX_ERROR_BODY`] bytes, lossily decoded; empty when the connection
/// failed.
async fn error_body(resp: reqwest::Response) -> String {
    match read_capped(resp, MAX_ERROR_BODY).await {
        Ok((b, _)) => String::from_utf8_lossy(&b).into_owned(),
        Err(_) => String::new(),
    }
}

/// The path of `api`'s requests.
pub(crate) fn api_path(api: Api) -> &'static str {
    match api {
        Api::Completions => "/v1/completions",
        Api::Chat => "/v1/chat/completions",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server URL with a query string or fragment is refused up front
    /// (its paths would be appended after the query), naming the part.
    #[test]
    fn a_server_url_with_a_query_is_refused() {
        assert!(check_scheme("http://127.0.0.1:8000/v1").is_ok());
        for (url, part) in [
            ("http://h:8000/v1?api-version=2024-02-01", "?api-version"),
            ("http://h:8000/#x", "#x"),
        ] {
            let e = check_scheme(url).unwrap_err();
            assert!(
                e.contains("a query string or fragment") && e.contains(part),
                "{e}"
            );
        }
    }

    #[test]
    fn a_password_in_a_url_is_never_shown() {
        for (given, shown) in [
            ("http://u:secret@h:8000/v1", "http://u:***@h:8000/v1"),
            ("http://u:s%40c@h:8000", "http://u:***@h:8000"),
            ("https://:tok@gw.example", "https://:***@gw.example"),
            ("http://u:p@ss@h/", "http://u:***@h/"),
            // No password, nothing hidden; an @ past the authority is not
            // user info.
            ("http://u@h:8000", "http://u@h:8000"),
            ("http://h:8000/a@b:c", "http://h:8000/a@b:c"),
            ("http://h:8000", "http://h:8000"),
            ("not a url", "not a url"),
        ] {
            assert_eq!(shown_url(given), shown, "{given}");
        }
        let e = check_scheme("http://u:secret@h/?x=1").unwrap_err();
        assert!(!e.contains("secret"), "{e}");
    }

    #[test]
    fn a_scheme_in_capitals_is_read_in_lower_case() {
        assert_eq!(base_url("HTTP://h:8000/v1"), "http://h:8000");
        assert_eq!(base_url("Https://H:8000"), "https://H:8000");
        assert_eq!(lower_scheme("h:8000"), "h:8000");
        assert_eq!(lower_scheme("x+y://h"), "x+y://h");
    }

    #[test]
    fn a_v1_or_endpoint_url_is_read_as_the_base() {
        for (given, base) in [
            ("http://h:8000", "http://h:8000"),
            ("http://h:8000/", "http://h:8000"),
            ("http://h:8000/v1", "http://h:8000"),
            ("http://h:8000/v1/", "http://h:8000"),
            ("http://h:8000/v1/completions", "http://h:8000"),
            ("http://h:8000/v1/chat/completions/", "http://h:8000"),
            (
                "https://gw.example/team/llm/v1",
                "https://gw.example/team/llm",
            ),
            ("http://h:8000/v10", "http://h:8000/v10"),
            ("http://h:8000/api/v1x", "http://h:8000/api/v1x"),
        ] {
            assert_eq!(base_url(given), base, "{given}");
        }
    }

    fn ep(server: ServerType, api: Api) -> Endpoint {
        Endpoint::new(
            client().unwrap(),
            "http://h:1/",
            api,
            server,
            "m",
            Some("k"),
        )
        .unwrap()
    }

    fn body(e: &Endpoint, p: &Prompt, max: u32, stream: bool) -> Value {
        serde_json::from_slice(&e.body(p, max, stream)).unwrap()
    }

    #[test]
    fn bodies_force_the_output_length_per_server_family() {
        let p = Prompt::Text("hi".into());
        let v = body(&ep(ServerType::Vllm, Api::Completions), &p, 7, true);
        assert_eq!(v["max_tokens"], 7);
        assert_eq!(v["ignore_eos"], true);
        assert_eq!(v["min_tokens"], 7);
        assert_eq!(v["stream_options"]["include_usage"], true);
        assert_eq!(v["stream_options"]["continuous_usage_stats"], true);
        let v = body(&ep(ServerType::Openai, Api::Completions), &p, 7, false);
        assert!(v.get("ignore_eos").is_none() && v.get("stream_options").is_none());
        let v = body(
            &ep(ServerType::Sglang, Api::Chat),
            &Prompt::Chat(vec![Message {
                role: "user",
                content: "q".into(),
            }]),
            0,
            true,
        );
        assert_eq!(v["max_tokens"], 1);
        assert_eq!(v["ignore_eos"], true);
        assert!(v.get("min_tokens").is_none());
        assert_eq!(v["messages"][0]["role"], "user");
        assert!(v["stream_options"].get("continuous_usage_stats").is_none());
    }

    #[test]
    fn error_labels_come_from_the_message_prefix() {
        let f = Failure::new(ErrorKind::Http(429), "HTTP 429 Too Many Requests");
        assert_eq!(f.message(), "http_429: HTTP 429 Too Many Requests");
        assert_eq!(error_label(&f.message()), "http_429");
        assert_eq!(error_label("free text without kind"), "other");
    }

    #[test]
    fn an_html_error_page_becomes_one_short_line_of_its_text() {
        let page = "<!DOCTYPE HTML>\n<html lang=\"en\">\n    <head>\n        <meta charset=\"utf-8\">\n        <title>Error response</title>\n    </head>\n    <body>\n        <h1>Error response</h1>\n        <p>Error code: 501</p>\n        <p>Message: Unsupported method ('POST').</p>\n        <p>Error code explanation: 501 - Server does not support this operation.</p>\n    </body>\n</html>\n";
        assert_eq!(
            error_body_text(page),
            "Error response Error code: 501 Message: Unsupported method ('POST'). Error code explanation: 501 - Server does not support this operation."
        );
        let long = format!("<html><body>{}</body></html>", "word ".repeat(500));
        let t = error_body_text(&long);
        assert!(t.chars().count() <= 201 && t.ends_with('…'), "{t}");
        assert_eq!(error_body_text("plain\ntext"), "plain text");
        assert_eq!(error_body_text(&"x".repeat(1000)).chars().count(), 201);
    }

    #[test]
    fn api_keys_are_marked_sensitive() {
        let v = bearer("secret").unwrap();
        assert!(v.is_sensitive());
        assert!(!format!("{:?}", ep(ServerType::Vllm, Api::Chat)).contains("secret"));
    }
}
