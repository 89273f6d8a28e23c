//! Prompts of a target token count, from deterministic text.
//!
//! Text is a stream of common English words chosen by a hash of (stream
//! key, position), so the same key always gives the same words: requests of
//! a prefix group share their prefix text exactly (and hit the server's
//! prefix cache), and every other request's text is its own. How many
//! tokens a word makes on the server is measured once before the run
//! ([`measure_tokens_per_word`]); a prompt of `n` tokens then has
//! `n / tokens_per_word` words. The server's reported `prompt_tokens` is
//! recorded as the truth (`server_input_tokens`).

use blis_traces::Request;
use blis_traces::content::{prefix_key, request_key, session_key};
use serde_json::{Value, json};
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Common short English words.
const WORDS: [&str; 128] = [
    "the", "of", "and", "to", "in", "is", "you", "that", "it", "he", "was", "for", "on", "are",
    "as", "with", "his", "they", "at", "be", "this", "have", "from", "or", "one", "had", "by",
    "word", "but", "not", "what", "all", "were", "we", "when", "your", "can", "said", "there",
    "use", "an", "each", "which", "she", "do", "how", "their", "if", "will", "up", "other",
    "about", "out", "many", "then", "them", "these", "so", "some", "her", "would", "make", "like",
    "him", "into", "time", "has", "look", "two", "more", "write", "go", "see", "number", "no",
    "way", "could", "people", "my", "than", "first", "water", "been", "call", "who", "oil", "its",
    "now", "find", "long", "down", "day", "did", "get", "come", "made", "may", "part", "over",
    "new", "sound", "take", "only", "little", "work", "know", "place", "year", "live", "me",
    "back", "give", "most", "very", "after", "thing", "our", "just", "name", "good", "sentence",
    "man", "think", "say", "great", "where", "help", "through",
];

/// `n` words of stream `key` starting at word `start`, each preceded by a
/// space.
pub fn words(key: u64, start: usize, n: usize) -> String {
    let mut s = String::with_capacity(n * 5);
    for i in start..start + n {
        let h = xxh3_64_with_seed(&(i as u64).to_le_bytes(), key);
        s.push(' ');
        s.push_str(WORDS[(h % WORDS.len() as u64) as usize]);
    }
    s
}

/// Words for `tokens` tokens.
pub fn words_for(tokens: u32, tokens_per_word: f64) -> usize {
    if tokens == 0 {
        0
    } else {
        ((f64::from(tokens) / tokens_per_word.max(0.05)).round() as usize).max(1)
    }
}

/// The key of a request's own text.
pub fn body_key(r: &Request) -> u64 {
    r.content_key.unwrap_or_else(|| {
        if r.session_id.is_empty() {
            request_key(r.request_id)
        } else {
            session_key(&r.session_id) ^ u64::from(r.round_index).wrapping_mul(0x9E37_79B9)
        }
    })
}

/// The shared prefix text of `r` (empty without a prefix group).
pub fn prefix_text(r: &Request, tokens_per_word: f64) -> String {
    if r.prefix_group.is_empty() || r.prefix_length == 0 {
        return String::new();
    }
    words(
        prefix_key(&r.prefix_group),
        0,
        words_for(r.prefix_length, tokens_per_word),
    )
}

/// The request's own text of `tokens` tokens.
pub fn body_text(r: &Request, tokens: u32, tokens_per_word: f64) -> String {
    words(body_key(r), 0, words_for(tokens, tokens_per_word))
}

/// How many tokens the server makes of a word of this text, from
/// `/tokenize` (vLLM's `{"count"}` or llama.cpp's `{"tokens"}`) given the
/// body it answered.
pub fn tokens_from_tokenize_response(v: &Value) -> Option<u64> {
    v.get("count").and_then(Value::as_u64).or_else(|| {
        v.get("tokens")
            .and_then(Value::as_array)
            .map(|a| a.len() as u64)
    })
}

/// The sample text used to measure tokens per word, and its word count.
pub fn sample_text() -> (String, usize) {
    let n = 400;
    (words(0x005A_4D50_4C45, 0, n), n)
}

/// The `/tokenize` bodies to try, in order (vLLM style, llama.cpp style).
pub fn tokenize_bodies(model: &str, text: &str) -> [Value; 2] {
    [
        json!({"model": model, "prompt": text, "add_special_tokens": false}),
        json!({"content": text, "add_special": false}),
    ]
}

/// Measured tokens per word from a tokenize count over the sample.
pub fn measure_tokens_per_word(tokens: u64, words: usize) -> f64 {
    (tokens as f64 / words.max(1) as f64).max(0.05)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn texts_are_deterministic_and_prefixes_shared() {
        assert_eq!(words(7, 0, 10), words(7, 0, 10));
        assert_ne!(words(7, 0, 10), words(8, 0, 10));
        let a = Request {
            request_id: 1,
            prefix_group: Arc::from("g"),
            prefix_length: 50,
            ..Request::default()
        };
        let b = Request {
            request_id: 2,
            ..a.clone()
        };
        assert_eq!(prefix_text(&a, 1.3), prefix_text(&b, 1.3));
        assert_ne!(body_text(&a, 20, 1.3), body_text(&b, 20, 1.3));
        assert_eq!(words_for(130, 1.3), 100);
    }

    #[test]
    fn tokenize_answers_of_both_shapes_are_read() {
        assert_eq!(
            tokens_from_tokenize_response(&json!({"count": 12})),
            Some(12)
        );
        assert_eq!(
            tokens_from_tokenize_response(&json!({"tokens": [1, 2, 3]})),
            Some(3)
        );
        assert_eq!(tokens_from_tokenize_response(&json!({})), None);
    }
}
