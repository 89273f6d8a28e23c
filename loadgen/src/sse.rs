//! SSE parsing: a response of an OpenAI-compatible server read event by
//! event (`text/event-stream`, one JSON chunk per `data:` line, `[DONE]` at
//! the end), or as one JSON body when not streamed, into a [`Capture`]:
//! each content chunk's arrival time, the text, the usage (prompt,
//! completion and cached tokens; running usage per chunk when the server
//! reports it), the finish reason, and what went wrong.

use eventsource_stream::{EventStreamError, Eventsource};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::Value;

use crate::clock::RunClock;
use crate::response::{Capture, ErrorKind, Failure, describe, error_text, one_line};

#[derive(Deserialize)]
struct Usage {
    #[serde(default, deserialize_with = "count")]
    prompt_tokens: Option<u32>,
    #[serde(default, deserialize_with = "count")]
    completion_tokens: Option<u32>,
    #[serde(default)]
    prompt_tokens_details: Option<Details>,
}

#[derive(Deserialize)]
struct Details {
    #[serde(default, deserialize_with = "count")]
    cached_tokens: Option<u32>,
}

/// A usage count: a JSON integer from 0 to `u32::MAX`, or a number with
/// no fractional part in that range (`10.0`: some servers write their
/// counts as floats, and Python clients such as `vllm bench serve` read
/// them as numbers); `null` is no count. Anything else (negative,
/// fractional, past `u32`, a string) makes the chunk malformed.
fn count<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    use serde::de::Error;
    let Some(n) = Option::<serde_json::Number>::deserialize(d)? else {
        return Ok(None);
    };
    let v = match n.as_u64() {
        Some(u) => u32::try_from(u).ok(),
        None => n
            .as_f64()
            .filter(|f| f.fract() == 0.0 && (0.0..=f64::from(u32::MAX)).contains(f))
            .map(|f| f as u32),
    };
    v.map(Some).ok_or_else(|| {
        D::Error::custom(format!(
            "a token count must be a whole number from 0 to 2^32 - 1, not {n}"
        ))
    })
}

#[derive(Deserialize, Default)]
struct Delta {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    reasoning_content: Option<String>,
    #[serde(default)]
    reasoning: Option<String>,
}

#[derive(Deserialize)]
struct Choice {
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    delta: Option<Delta>,
    #[serde(default)]
    message: Option<Delta>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Vec<Choice>,
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(default)]
    error: Option<Value>,
}

impl Choice {
    fn content(&self) -> Option<&str> {
        let d = self.delta.as_ref().or(self.message.as_ref());
        [
            self.text.as_deref(),
            d.and_then(|d| d.content.as_deref()),
            d.and_then(|d| d.reasoning_content.as_deref()),
            d.and_then(|d| d.reasoning.as_deref()),
        ]
        .into_iter()
        .flatten()
        .find(|s| !s.is_empty())
    }
}

fn apply_usage(cap: &mut Capture, u: &Usage) {
    if let Some(p) = u.prompt_tokens {
        cap.prompt_tokens = Some(p);
    }
    if let Some(c) = u.completion_tokens {
        cap.completion_tokens = Some(c);
    }
    if let Some(c) = u
        .prompt_tokens_details
        .as_ref()
        .and_then(|d| d.cached_tokens)
    {
        cap.cached_tokens = Some(c);
    }
}

/// Reads a streamed response (`text/event-stream`): every SSE event's
/// JSON chunk, timed on arrival; the stream must end with `[DONE]`.
pub async fn read_stream(
    resp: reqwest::Response,
    clock: &RunClock,
    cap: &mut Capture,
) -> Result<(), Failure> {
    read_events(resp.bytes_stream(), || clock.now_us(), cap).await
}

/// Parses a whole SSE body arriving in `pieces` (as the network splits
/// it), every chunk at time 0: what [`read_stream`] makes of it. For
/// tests and the fuzzing harness.
///
/// # Errors
/// As [`read_stream`].
pub fn parse_sse(pieces: &[&[u8]], cap: &mut Capture) -> Result<(), Failure> {
    let stream = futures::stream::iter(
        pieces
            .iter()
            .map(|p| Ok::<Vec<u8>, std::io::Error>(p.to_vec())),
    );
    futures::executor::block_on(read_events(stream, || 0, cap))
}

/// The longest SSE line read, bytes (1 MiB). A chunk of an OpenAI-style
/// stream is a few hundred bytes (a token, or a usage block); a line
/// longer than this is a broken or hostile server, and reading on would
/// hold it all in memory (and rescan it as each piece arrives). 16 times
/// aiohttp's default line limit (64 KiB), which `vllm bench serve` reads
/// its streams with.
pub const MAX_SSE_LINE: usize = 1 << 20;

/// The largest whole (non-streamed) response body read, bytes (64 MiB):
/// ten times the text of the longest generation a 1M-token context holds.
pub const MAX_BODY: usize = 64 << 20;

/// The UTF-8 byte order mark, which an event stream may begin with (the
/// SSE format, WHATWG HTML "Parsing an event stream": `stream = [ bom ]
/// *event`).
const BOM: &[u8] = b"\xEF\xBB\xBF";

/// A piece of a response body: as it came, or (the body's first bytes)
/// remade without its byte order mark.
enum Piece<B> {
    Whole(B),
    Owned(Vec<u8>),
}

impl<B: AsRef<[u8]>> AsRef<[u8]> for Piece<B> {
    fn as_ref(&self) -> &[u8] {
        match self {
            Piece::Whole(b) => b.as_ref(),
            Piece::Owned(v) => v,
        }
    }
}

/// The body's pieces without a leading byte order mark, however the
/// network splits it. The SSE reader (eventsource-stream 0.2.3) skips one
/// itself, but cuts it at byte 1 of its 3 and panics; a server that sends
/// one would end the run. Bytes that may begin a mark are held until it is
/// whole or is not one.
fn without_bom<S, B, E>(stream: S) -> impl futures::Stream<Item = Result<Piece<B>, E>>
where
    S: futures::Stream<Item = Result<B, E>>,
    B: AsRef<[u8]>,
{
    // `Some(held)` until the body's first bytes are past a mark's length.
    stream.scan(Some(Vec::new()), |start: &mut Option<Vec<u8>>, piece| {
        let out = match (piece, start.as_mut()) {
            (Ok(b), None) => Ok(Piece::Whole(b)),
            (Ok(b), Some(held)) => {
                if held.is_empty() && b.as_ref().len() >= BOM.len() && !b.as_ref().starts_with(BOM)
                {
                    *start = None;
                    Ok(Piece::Whole(b))
                } else {
                    held.extend_from_slice(b.as_ref());
                    let n = held.len().min(BOM.len());
                    if held.len() < BOM.len() && held[..n] == BOM[..n] {
                        // Perhaps a mark split by the network: wait.
                        Ok(Piece::Owned(Vec::new()))
                    } else {
                        let mut first = start.take().unwrap_or_default();
                        if first.starts_with(BOM) {
                            first.drain(..BOM.len());
                        }
                        Ok(Piece::Owned(first))
                    }
                }
            }
            (Err(e), _) => Err(e),
        };
        futures::future::ready(Some(out))
    })
}

/// The body's pieces, and a `\n` after them when the body ended with a
/// `\r`. A CR alone ends a line in the SSE format, but the reader waits
/// to see whether an LF follows it (a CRLF is one line end), and at the
/// end of the body it never learns: a stream of bare-CR lines lost its
/// last event (`data: [DONE]\r\r`). The LF adds no line end, since after
/// a CR it is part of the same one; it only settles it.
fn with_a_final_cr_resolved<S, B, E>(stream: S) -> impl futures::Stream<Item = Result<Piece<B>, E>>
where
    S: futures::Stream<Item = Result<Piece<B>, E>>,
    B: AsRef<[u8]>,
{
    let last_cr = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = last_cr.clone();
    let body = stream.inspect(move |piece| {
        if let Ok(p) = piece
            && let Some(&last) = p.as_ref().last()
        {
            seen.store(last == b'\r', std::sync::atomic::Ordering::Relaxed);
        }
    });
    let end = futures::stream::once(async move {
        last_cr
            .load(std::sync::atomic::Ordering::Relaxed)
            .then(|| Ok(Piece::Owned(b"\n".to_vec())))
    })
    .filter_map(futures::future::ready);
    body.chain(end)
}

/// The events of an SSE byte stream into `cap`, each timed by `now`.
///
/// A stream that ends cleanly (no transport error) without `[DONE]` is
/// complete when a chunk carried its `finish_reason` (as `vllm bench
/// serve` and guidellm read it; some OpenAI-compatible servers and
/// proxies never send `[DONE]`), with a warning on the row; without one,
/// it was cut off.
async fn read_events<S, B, E>(
    stream: S,
    now: impl Fn() -> i64,
    cap: &mut Capture,
) -> Result<(), Failure>
where
    S: futures::Stream<Item = Result<B, E>> + Unpin,
    B: AsRef<[u8]>,
    E: std::error::Error + 'static,
{
    let stream = with_a_final_cr_resolved(without_bom(stream));
    // The bytes since the last line break; past MAX_SSE_LINE the stream
    // is cut here and the response is malformed.
    let too_long = std::sync::atomic::AtomicBool::new(false);
    // The body's first bytes, to tell a body that is not an event stream
    // at all (JSON lines, plain text) from a stream cut off.
    let head = std::sync::Mutex::new(Vec::new());
    let stream = stream.scan(0usize, |run, piece| {
        if let Ok(b) = &piece {
            let b = b.as_ref();
            if let Ok(mut h) = head.lock()
                && h.len() < HEAD_BYTES
            {
                let room = HEAD_BYTES - h.len();
                h.extend_from_slice(&b[..b.len().min(room)]);
            }
            *run = match b.iter().rposition(|&c| c == b'\n' || c == b'\r') {
                Some(i) => b.len() - i - 1,
                None => *run + b.len(),
            };
            if *run > MAX_SSE_LINE {
                too_long.store(true, std::sync::atomic::Ordering::Relaxed);
                return futures::future::ready(None);
            }
        }
        futures::future::ready(Some(piece))
    });
    let stream = std::pin::pin!(stream);
    let mut events = stream.eventsource();
    let mut done = false;
    let mut any_event = false;
    while let Some(ev) = events.next().await {
        let now = now();
        let ev = match ev {
            Ok(ev) => {
                any_event = true;
                ev
            }
            Err(EventStreamError::Transport(e)) => {
                cap.last_us = Some(now);
                return Err(Failure::new(
                    ErrorKind::Dropped,
                    format!(
                        "connection failed after {} chunks: {}",
                        cap.chunk_times.len(),
                        describe(&e)
                    ),
                ));
            }
            Err(e) => {
                cap.last_us = Some(now);
                return Err(Failure::new(
                    ErrorKind::Malformed,
                    format!("bad SSE: {}", one_line(&e.to_string(), 200)),
                ));
            }
        };
        cap.last_us = Some(now);
        let data = ev.data.trim();
        if data == "[DONE]" {
            // The end of the response, as OpenAI's clients read it: a
            // server that keeps the connection open after it (a proxy
            // that does not end the body) has answered in full.
            done = true;
            break;
        }
        if data.is_empty() {
            continue;
        }
        take_chunk(data, now, cap)?;
    }
    if !cap.running_chunks {
        cap.chunk_tokens.clear();
    }
    if too_long.load(std::sync::atomic::Ordering::Relaxed) {
        cap.last_us = Some(now());
        return Err(Failure::new(
            ErrorKind::Malformed,
            format!(
                "an SSE line longer than {} MiB (after {} chunks): not an OpenAI-style stream",
                MAX_SSE_LINE >> 20,
                cap.chunk_times.len()
            ),
        ));
    }
    ended_by_the_server(cap)?;
    let no_token = cap.chunk_times.is_empty();
    if no_token && cap.finish_reason.is_empty() && done {
        // `[DONE]` with neither a token nor a finish_reason before it:
        // nothing was generated and nothing says why (`vllm bench serve`
        // fails such a request: "Never received a valid chunk to calculate
        // TTFT").
        return Err(Failure::new(
            ErrorKind::Malformed,
            "the stream ended at [DONE] without a token or a finish_reason".to_string(),
        ));
    }
    if no_token && !cap.finish_reason.is_empty() {
        // A generation that finished at once (its first token was the end
        // of sequence): complete, with no token.
        cap.streamed_no_token = true;
        cap.warning = Some(crate::response::FINISHED_WITHOUT_TOKEN.into());
    }
    if !done {
        if !cap.finish_reason.is_empty() {
            let w = crate::response::ENDED_WITHOUT_DONE;
            cap.warning = Some(match cap.warning.take() {
                Some(first) => format!("{first}; {w}"),
                None => w.into(),
            });
            return Ok(());
        }
        let head = head.lock().map(|h| h.clone()).unwrap_or_default();
        if !any_event && let Some(line) = not_sse(&head) {
            return Err(Failure::new(
                ErrorKind::Malformed,
                format!("the response is not an event stream (no SSE event; it starts {line:?})"),
            ));
        }
        return Err(Failure::new(
            ErrorKind::Dropped,
            format!(
                "stream ended without [DONE] or a finish_reason after {} chunks",
                cap.chunk_times.len()
            ),
        ));
    }
    Ok(())
}

/// The first bytes of a streamed body kept to say what it was.
const HEAD_BYTES: usize = 256;

/// The first line of a body's `head` when the body is not an event stream:
/// its first non-blank line is neither an SSE comment (`:`) nor a field
/// (`data`, `event`, `id`, `retry`); at most 80 characters. `None` for an
/// SSE-looking or empty body (a stream cut off before its first event).
fn not_sse(head: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(head);
    let line = text.lines().map(str::trim).find(|l| !l.is_empty())?;
    let field = line.split(':').next().unwrap_or("");
    if line.starts_with(':') || matches!(field, "data" | "event" | "id" | "retry") {
        return None;
    }
    Some(line.chars().take(80).collect())
}

/// A response the server ended with `finish_reason` `abort` or `error`
/// (vLLM's for a request it aborted or that failed in the engine) did not
/// complete: a `server_error` that keeps what arrived.
///
/// # Errors
/// That failure.
fn ended_by_the_server(cap: &Capture) -> Result<(), Failure> {
    if matches!(cap.finish_reason.as_str(), "abort" | "error") {
        return Err(Failure::new(
            ErrorKind::ServerError,
            format!(
                "the server ended the response with finish_reason {} after {} chunks",
                cap.finish_reason,
                cap.chunk_times.len()
            ),
        ));
    }
    Ok(())
}

/// Takes one SSE event's JSON chunk arriving at `now` (µs): its content
/// (a chunk's time counts only when it carries content), finish reason
/// and usage.
///
/// # Errors
/// A chunk that is not JSON, or a server error in the stream.
fn take_chunk(data: &str, now: i64, cap: &mut Capture) -> Result<(), Failure> {
    let chunk: Chunk = serde_json::from_str(data).map_err(|e| {
        Failure::new(
            ErrorKind::Malformed,
            format!(
                "chunk {}: {e}: {}",
                cap.chunk_times.len(),
                one_line(data, 120)
            ),
        )
    })?;
    if let Some(e) = &chunk.error {
        return Err(Failure::new(ErrorKind::ServerError, error_text(e)));
    }
    let mut content = false;
    for c in &chunk.choices {
        if let Some(t) = c.content() {
            content = true;
            if cap.keep_text {
                cap.text.push_str(t);
            }
        }
        if let Some(f) = &c.finish_reason {
            cap.finish_reason.clone_from(f);
        }
    }
    if let Some(u) = &chunk.usage {
        apply_usage(cap, u);
        if content && let Some(c) = u.completion_tokens {
            cap.chunk_tokens
                .push(c.saturating_sub(cap.running_completion));
            cap.running_completion = c;
            cap.running_chunks = true;
        }
    }
    if content {
        if cap.max_chunks.is_some_and(|m| cap.chunk_times.len() >= m) {
            return Err(Failure::new(
                ErrorKind::Malformed,
                format!(
                    "the server streamed more than {} content chunks (8 per token of max_tokens, and 64): it ignores max_tokens; the rest was not read",
                    cap.chunk_times.len()
                ),
            ));
        }
        if cap.first_us.is_none() {
            cap.first_us = Some(now);
        }
        cap.chunk_times.push(now);
    }
    Ok(())
}

/// Reads a non-streamed response: one JSON body, timed by its first and
/// last bytes.
pub async fn read_whole(
    resp: reqwest::Response,
    clock: &RunClock,
    cap: &mut Capture,
) -> Result<(), Failure> {
    let mut body = Vec::new();
    let mut stream = resp.bytes_stream();
    while let Some(b) = stream.next().await {
        let now = clock.now_us();
        cap.last_us = Some(now);
        match b {
            Ok(b) => {
                if cap.first_us.is_none() {
                    cap.first_us = Some(now);
                }
                if body.len() + b.len() > MAX_BODY {
                    return Err(Failure::new(
                        ErrorKind::Malformed,
                        format!("a response body over {} MiB", MAX_BODY >> 20),
                    ));
                }
                body.extend_from_slice(&b);
            }
            Err(e) => {
                return Err(Failure::new(
                    ErrorKind::Dropped,
                    format!("connection failed mid-body: {}", describe(&e)),
                ));
            }
        }
    }
    let v: Chunk = serde_json::from_slice(&body).map_err(|e| {
        Failure::new(
            ErrorKind::Malformed,
            format!(
                "body: {e}: {}",
                one_line(&String::from_utf8_lossy(&body), 120)
            ),
        )
    })?;
    if let Some(e) = &v.error {
        return Err(Failure::new(ErrorKind::ServerError, error_text(e)));
    }
    for c in &v.choices {
        if let Some(t) = c.content()
            && cap.keep_text
        {
            cap.text.push_str(t);
        }
        if let Some(f) = &c.finish_reason {
            cap.finish_reason.clone_from(f);
        }
    }
    if let Some(u) = &v.usage {
        apply_usage(cap, u);
    }
    ended_by_the_server(cap)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(text: &str) -> String {
        format!("data: {{\"choices\":[{{\"text\":\"{text}\"}}]}}\n\n")
    }

    /// Usage counts written as whole floats (`10.0`) are read as counts;
    /// negative, fractional, past-`u32` and string counts make the chunk
    /// malformed.
    #[test]
    fn usage_counts_are_whole_numbers_written_either_way() {
        let with = |usage: &str| {
            format!(
                "data: {{\"choices\":[{{\"text\":\"a\",\"finish_reason\":\"stop\"}}],\"usage\":{usage}}}\n\ndata: [DONE]\n\n"
            )
        };
        let mut cap = Capture::default();
        let body = with(
            "{\"prompt_tokens\":12.0,\"completion_tokens\":1,\"prompt_tokens_details\":{\"cached_tokens\":4.0}}",
        );
        parse_sse(&[body.as_bytes()], &mut cap).unwrap();
        assert_eq!(
            (cap.prompt_tokens, cap.completion_tokens, cap.cached_tokens),
            (Some(12), Some(1), Some(4))
        );
        for bad in ["-1", "1.5", "4294967296", "\"10\"", "1e300"] {
            let body = with(&format!("{{\"completion_tokens\":{bad}}}"));
            let err = parse_sse(&[body.as_bytes()], &mut Capture::default()).unwrap_err();
            assert_eq!(err.kind, ErrorKind::Malformed, "{bad}: {}", err.detail);
        }
    }

    /// A body cut off before its first event is `dropped` whether it was
    /// empty or held only SSE comments and fields; one whose first line is
    /// no SSE at all (JSON lines, text) is `malformed`, quoting that line.
    #[test]
    fn a_body_without_events_is_malformed_only_when_it_is_not_sse() {
        for body in [
            "",
            "\n",
            ": keep-alive\n",
            "data: {\"choices\"",
            "event: x\nretry: 5\n",
        ] {
            let err = parse_sse(&[body.as_bytes()], &mut Capture::default()).unwrap_err();
            assert_eq!(err.kind, ErrorKind::Dropped, "{body:?}: {}", err.detail);
        }
        for (body, start) in [
            ("{\"choices\":[]}\n{\"choices\":[]}\n", "{\"choices\":[]}"),
            ("\n  Internal error\n", "Internal error"),
        ] {
            let err = parse_sse(&[body.as_bytes()], &mut Capture::default()).unwrap_err();
            assert_eq!(err.kind, ErrorKind::Malformed, "{body:?}");
            assert_eq!(
                err.detail,
                format!("the response is not an event stream (no SSE event; it starts {start:?})")
            );
        }
    }

    /// A line past [`MAX_SSE_LINE`] ends the read as malformed, however
    /// the network splits it, and whatever follows is not read; a long
    /// line below the limit is read.
    #[test]
    fn a_line_past_the_limit_is_malformed_and_one_below_is_read() {
        let first = chunk("a");
        let piece = vec![b'A'; 64 << 10];
        let mut pieces: Vec<&[u8]> = vec![first.as_bytes(), b"data: "];
        pieces.extend(std::iter::repeat_n(&piece[..], 17));
        pieces.push(b"\n\ndata: [DONE]\n\n");
        let mut cap = Capture::default();
        let err = parse_sse(&pieces, &mut cap).unwrap_err();
        assert_eq!(err.kind, ErrorKind::Malformed);
        assert_eq!(
            err.detail,
            "an SSE line longer than 1 MiB (after 1 chunks): not an OpenAI-style stream"
        );
        assert_eq!(cap.chunk_times.len(), 1, "the chunk before it is kept");

        let long = chunk(&"b".repeat(MAX_SSE_LINE - 100));
        let done = "data: [DONE]\n\n";
        let halves = long.as_bytes().split_at(long.len() / 2);
        let mut cap = Capture::new(true);
        parse_sse(&[halves.0, halves.1, done.as_bytes()], &mut cap).unwrap();
        assert_eq!(cap.chunk_times.len(), 1);
        assert_eq!(cap.text.len(), MAX_SSE_LINE - 100);
    }

    /// A response ended with `finish_reason` `abort` or `error` (vLLM's
    /// for an aborted or failed request) is a `server_error` keeping its
    /// chunks, `[DONE]` or not; `stop` and `length` complete it.
    #[test]
    fn an_aborted_response_is_a_server_error() {
        let body = |reason: &str| {
            format!(
                "{}data: {{\"choices\":[{{\"text\":\"b\",\"finish_reason\":\"{reason}\"}}]}}\n\ndata: [DONE]\n\n",
                chunk("a")
            )
        };
        for reason in ["abort", "error"] {
            let b = body(reason);
            let mut cap = Capture::default();
            let err = parse_sse(&[b.as_bytes()], &mut cap).unwrap_err();
            assert_eq!(err.kind, ErrorKind::ServerError);
            assert_eq!(
                err.detail,
                format!("the server ended the response with finish_reason {reason} after 2 chunks")
            );
            assert_eq!(cap.chunk_times.len(), 2);
        }
        for reason in ["stop", "length"] {
            let b = body(reason);
            let mut cap = Capture::default();
            parse_sse(&[b.as_bytes()], &mut cap).unwrap();
            assert_eq!(cap.finish_reason, reason);
        }
    }

    /// A stream that begins with a UTF-8 byte order mark is read as
    /// without one, wherever the network splits the mark (the SSE reader
    /// panicked on it); bytes that only begin like a mark are kept.
    #[test]
    fn a_leading_byte_order_mark_is_skipped_however_it_is_split() {
        let body = format!("\u{feff}{}{}data: [DONE]\n\n", chunk("a"), chunk("b"));
        let bytes = body.as_bytes();
        for cut in 0..=bytes.len().min(8) {
            for second in cut..=bytes.len().min(8) {
                let pieces = [&bytes[..cut], &bytes[cut..second], &bytes[second..]];
                let mut cap = Capture::new(true);
                parse_sse(&pieces, &mut cap)
                    .unwrap_or_else(|e| panic!("{cut}/{second}: {}", e.detail));
                assert_eq!(
                    (cap.chunk_times.len(), cap.text.as_str()),
                    (2, "ab"),
                    "{cut}/{second}"
                );
            }
        }
        // Only the mark's first bytes, then the end: no event.
        let err = parse_sse(&[b"\xEF\xBB"], &mut Capture::default()).unwrap_err();
        assert_eq!(err.kind, ErrorKind::Dropped, "{}", err.detail);
        // Not a mark: bytes that begin like one are kept (and are not UTF-8).
        let err = parse_sse(&[b"\xEF", b"Adata: x\n\n"], &mut Capture::default()).unwrap_err();
        assert_eq!(err.kind, ErrorKind::Malformed, "{}", err.detail);
    }

    /// Bare-CR line ends (a line end in the SSE format) are read to the
    /// last event, `[DONE]` included; an event the body cuts off before
    /// its blank line is still not dispatched.
    #[test]
    fn bare_cr_line_ends_are_read_to_the_last_event() {
        let body = format!("{}{}data: [DONE]\r\r", chunk("a"), chunk("b")).replace('\n', "\r");
        let mut cap = Capture::new(true);
        parse_sse(&[body.as_bytes()], &mut cap).unwrap();
        assert_eq!((cap.chunk_times.len(), cap.text.as_str()), (2, "ab"));
        assert!(cap.warning.is_none(), "[DONE] seen: {:?}", cap.warning);
        // Cut off after the event's line, before its blank line: not an
        // event, so the stream ended without a token or [DONE].
        let cut = chunk("a").replace('\n', "\r");
        let cut = &cut[..cut.len() - 1];
        let err = parse_sse(&[cut.as_bytes()], &mut Capture::default()).unwrap_err();
        assert_eq!(err.kind, ErrorKind::Dropped, "{}", err.detail);
    }

    /// Line breaks reset the count: a long stream of short lines is read
    /// however long it is in all.
    #[test]
    fn many_short_lines_are_no_long_line() {
        let body: String = (0..80_000).map(|_| chunk("token")).collect();
        assert!(body.len() > 2 * MAX_SSE_LINE);
        let body = body + "data: [DONE]\n\n";
        let pieces: Vec<&[u8]> = body.as_bytes().chunks(4096).collect();
        let mut cap = Capture::default();
        parse_sse(&pieces, &mut cap).unwrap();
        assert_eq!(cap.chunk_times.len(), 80_000);
    }
}
