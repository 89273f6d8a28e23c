//! OpenAI-compatible request parsing and response shapes, as vLLM's OpenAI
//! server returns them (`vllm/entrypoints/openai/protocol.py`).

use serde::Deserialize;
use serde_json::{Value, json};

use crate::tokenizer;

/// `stream_options`.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a final chunk with `usage`.
    #[serde(default)]
    pub include_usage: Option<bool>,
    /// Send `usage` on every chunk (vLLM extension).
    #[serde(default)]
    pub continuous_usage_stats: Option<bool>,
}

/// The fields of `/v1/completions` and `/v1/chat/completions` the mock uses;
/// others (temperature, top_p, ...) are accepted and ignored.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct RawRequest {
    /// Served model name.
    #[serde(default)]
    pub model: Option<String>,
    /// Completions: a string, a one-element list of strings, or token ids.
    #[serde(default)]
    pub prompt: Option<Value>,
    /// Chat: the conversation.
    #[serde(default)]
    pub messages: Option<Vec<Message>>,
    /// Output token limit.
    #[serde(default)]
    pub max_tokens: Option<i64>,
    /// Chat: newer name of `max_tokens`.
    #[serde(default)]
    pub max_completion_tokens: Option<i64>,
    /// vLLM: minimum output tokens.
    #[serde(default)]
    pub min_tokens: Option<i64>,
    /// vLLM: keep generating past end-of-sequence.
    #[serde(default)]
    pub ignore_eos: Option<bool>,
    /// Stream the response (SSE).
    #[serde(default)]
    pub stream: Option<bool>,
    /// Streaming options.
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    /// Choices per prompt (only 1 supported).
    #[serde(default)]
    pub n: Option<u32>,
    /// vLLM: request priority (lower is more urgent).
    #[serde(default)]
    pub priority: Option<i32>,
}

/// A chat message.
#[derive(Debug, Clone, Deserialize)]
pub struct Message {
    /// `system`, `user`, `assistant`, ...
    pub role: String,
    /// Text, or a list of content parts.
    #[serde(default)]
    pub content: Option<Value>,
}

/// A request the mock can serve.
#[derive(Debug, Clone, PartialEq)]
pub struct Parsed {
    /// Chat (true) or completions.
    pub chat: bool,
    /// Model named.
    pub model: String,
    /// Prompt text (chat: rendered with the template).
    pub text: String,
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// `max_tokens` if given.
    pub max_tokens: Option<u32>,
    /// `min_tokens`.
    pub min_tokens: u32,
    /// `ignore_eos`.
    pub ignore_eos: bool,
    /// Streamed.
    pub stream: bool,
    /// Final usage chunk.
    pub include_usage: bool,
    /// Usage on every chunk.
    pub continuous_usage: bool,
    /// Priority.
    pub priority: i32,
}

fn part_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

/// Parses a request body.
///
/// # Errors
/// A message for a 400 response: invalid JSON, a missing `prompt` or
/// `messages`, a negative or zero `max_tokens`, `n` ≠ 1. A missing `model`
/// is not an error (vLLM uses its served model): `model` is then empty.
pub fn parse(body: &[u8], chat: bool) -> Result<Parsed, String> {
    let raw: RawRequest =
        serde_json::from_slice(body).map_err(|e| format!("invalid JSON body: {e}"))?;
    // vLLM serves its model to requests that name none.
    let model = raw.model.clone().unwrap_or_default();
    if raw.n.is_some_and(|n| n != 1) {
        return Err("only n = 1 is supported".into());
    }
    let text = if chat {
        let msgs = raw
            .messages
            .as_ref()
            .ok_or_else(|| "field `messages` is required".to_string())?;
        if msgs.is_empty() {
            return Err("`messages` must not be empty".into());
        }
        tokenizer::render_chat(msgs.iter().map(|m| {
            (
                m.role.as_str(),
                m.content.as_ref().map(part_text).unwrap_or_default(),
            )
        }))
    } else {
        match raw.prompt.as_ref() {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => {
                a[0].as_str().unwrap_or("").to_string()
            }
            Some(Value::Array(a)) if !a.is_empty() && a.iter().all(Value::is_u64) => {
                // Token ids: 4 bytes each, so the count is exact.
                a.iter()
                    .map(|v| {
                        let b = (v.as_u64().unwrap_or(0) as u32).to_le_bytes();
                        b.iter()
                            .map(|x| char::from(b'a' + x % 26))
                            .collect::<String>()
                    })
                    .collect()
            }
            Some(_) => {
                return Err(
                    "`prompt` must be a string, a one-string list or a list of token ids".into(),
                );
            }
            None => return Err("field `prompt` is required".into()),
        }
    };
    if text.is_empty() {
        return Err("the prompt is empty".into());
    }
    let max = raw.max_completion_tokens.or(raw.max_tokens);
    if let Some(m) = max
        && m < 1
    {
        return Err(format!("max_tokens must be at least 1, got {m}"));
    }
    if let Some(m) = raw.min_tokens
        && m < 0
    {
        return Err(format!("min_tokens must be non-negative, got {m}"));
    }
    // vLLM's SamplingParams refuses the same.
    if let (Some(lo), Some(hi)) = (raw.min_tokens, max)
        && lo > hi
    {
        return Err(format!(
            "min_tokens must be less than or equal to max_tokens={hi}, got {lo}"
        ));
    }
    let so = raw.stream_options.unwrap_or_default();
    let stream = raw.stream.unwrap_or(false);
    if raw.stream_options.is_some() && !stream {
        return Err("stream_options can only be set when stream is true".into());
    }
    Ok(Parsed {
        chat,
        model,
        prompt_tokens: tokenizer::count(&text),
        text,
        max_tokens: max.map(|m| m.min(i64::from(u32::MAX)) as u32),
        min_tokens: raw.min_tokens.unwrap_or(0).min(i64::from(u32::MAX)) as u32,
        ignore_eos: raw.ignore_eos.unwrap_or(false),
        stream,
        include_usage: so.include_usage.unwrap_or(false),
        continuous_usage: so.continuous_usage_stats.unwrap_or(false),
        priority: raw.priority.unwrap_or(0),
    })
}

/// `usage` of a response.
pub fn usage(prompt: u32, completion: u32, cached: Option<u32>) -> Value {
    let mut u = json!({
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
    });
    if let Some(c) = cached {
        u["prompt_tokens_details"] = json!({ "cached_tokens": c });
    }
    u
}

/// The first chunk of a streamed chat completion: the role with empty
/// content, sent with the first token, as vLLM's `serving_chat` does
/// (`DeltaMessage(role=role, content="")`), with zero completion tokens
/// under `continuous_usage_stats`.
pub fn role_chunk(p: &Parsed, id: &str, created: u64) -> Value {
    let mut v = json!({
        "id": id, "object": "chat.completion.chunk", "created": created, "model": p.model,
        "choices": [{ "index": 0, "delta": { "role": "assistant", "content": "" }, "logprobs": null, "finish_reason": null }],
    });
    if p.continuous_usage {
        v["usage"] = usage(p.prompt_tokens, 0, None);
    }
    v
}

/// One streamed chunk carrying `text` (and `finish_reason` on the last).
pub fn chunk(p: &Parsed, id: &str, created: u64, text: &str, finish: Option<&str>) -> Value {
    if p.chat {
        let delta = json!({ "content": text });
        json!({
            "id": id, "object": "chat.completion.chunk", "created": created, "model": p.model,
            "choices": [{ "index": 0, "delta": delta, "logprobs": null, "finish_reason": finish, "stop_reason": null }],
        })
    } else {
        json!({
            "id": id, "object": "text_completion", "created": created, "model": p.model,
            "choices": [{ "index": 0, "text": text, "logprobs": null, "finish_reason": finish, "stop_reason": null }],
        })
    }
}

/// The final usage-only chunk of a stream.
pub fn usage_chunk(p: &Parsed, id: &str, created: u64, usage: Value) -> Value {
    json!({
        "id": id,
        "object": if p.chat { "chat.completion.chunk" } else { "text_completion" },
        "created": created, "model": p.model, "choices": [], "usage": usage,
    })
}

/// A whole (non-streamed) response.
pub fn full(
    p: &Parsed,
    id: &str,
    created: u64,
    text: &str,
    finish: &str,
    usage: Option<Value>,
) -> Value {
    let mut v = if p.chat {
        json!({
            "id": id, "object": "chat.completion", "created": created, "model": p.model,
            "choices": [{
                "index": 0,
                "message": { "role": "assistant", "content": text, "tool_calls": [] },
                "logprobs": null, "finish_reason": finish, "stop_reason": null,
            }],
        })
    } else {
        json!({
            "id": id, "object": "text_completion", "created": created, "model": p.model,
            "choices": [{ "index": 0, "text": text, "logprobs": null, "finish_reason": finish, "stop_reason": null }],
        })
    };
    if let Some(u) = usage {
        v["usage"] = u;
    }
    v
}

/// vLLM's error body.
pub fn error(code: u16, kind: &str, message: &str) -> Value {
    json!({ "object": "error", "message": message, "type": kind, "param": null, "code": code })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rejects_clearly() {
        let p = parse(br#"{"model":"m","prompt":"abcdefgh","max_tokens":5,"stream":true,"stream_options":{"include_usage":true}}"#, false).unwrap();
        assert_eq!(
            (p.prompt_tokens, p.max_tokens, p.include_usage),
            (2, Some(5), true)
        );
        let c = parse(
            br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
            true,
        )
        .unwrap();
        assert_eq!(c.text, "<|user|>\nhi\n<|assistant|>\n");
        assert!(
            parse(b"{not json", false)
                .unwrap_err()
                .starts_with("invalid JSON body")
        );
        // No model: the server's (filled in by the handler), as vLLM.
        assert_eq!(parse(br#"{"prompt":"x"}"#, false).unwrap().model, "");
        assert!(
            parse(br#"{"model":"m","prompt":"x","max_tokens":-3}"#, false)
                .unwrap_err()
                .contains("at least 1")
        );
        // min_tokens above max_tokens: refused, as vLLM refuses it (it
        // was served with max_tokens tokens).
        assert_eq!(
            parse(
                br#"{"model":"m","prompt":"x","max_tokens":2,"min_tokens":5}"#,
                false
            )
            .unwrap_err(),
            "min_tokens must be less than or equal to max_tokens=2, got 5"
        );
        assert!(
            parse(
                br#"{"model":"m","prompt":"x","max_tokens":5,"min_tokens":5}"#,
                false
            )
            .is_ok()
        );
        assert_eq!(
            parse(br#"{"model":"m"}"#, true).unwrap_err(),
            "field `messages` is required"
        );
    }
}
