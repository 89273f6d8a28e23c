//! The mock's tokenizer: one documented, deterministic rule instead of a
//! real vocabulary.
//!
//! **A token is 4 bytes of the UTF-8 text** (the last one may be shorter):
//! a prompt of `n` bytes has `ceil(n / 4)` tokens, about what BPE
//! tokenizers give for English. Token ids are those 4 bytes read as a
//! little-endian `u32`. Identical text prefixes therefore give identical
//! leading tokens, and identical leading KV blocks: each block of
//! `block_size` tokens is a content segment keyed by the hash of its bytes,
//! so prefix caching works end to end.
//!
//! Chat requests are rendered with a fixed template before tokenizing:
//! `<|role|>\n{content}\n` per message, then `<|assistant|>\n`.

use blis_traces::content::Segment;
use xxhash_rust::xxh3::xxh3_64;

/// Bytes per token.
pub const BYTES_PER_TOKEN: usize = 4;

/// Tokens in `text`.
pub fn count(text: &str) -> u32 {
    text.len().div_ceil(BYTES_PER_TOKEN) as u32
}

/// Token ids of `text`.
pub fn ids(text: &str) -> Vec<u32> {
    text.as_bytes()
        .chunks(BYTES_PER_TOKEN)
        .map(|c| {
            let mut b = [0u8; 4];
            b[..c.len()].copy_from_slice(c);
            u32::from_le_bytes(b)
        })
        .collect()
}

/// Content segments of `text` for a KV cache with `block_size`-token
/// blocks, followed by `output_tokens` tokens unique to `request_key`.
pub fn segments(text: &str, block_size: u32, request_key: u64, output_tokens: u32) -> Vec<Segment> {
    let block_bytes = BYTES_PER_TOKEN * block_size.max(1) as usize;
    let mut out: Vec<Segment> = text
        .as_bytes()
        .chunks(block_bytes)
        .map(|c| Segment {
            key: xxh3_64(c),
            offset: 0,
            len: c.len().div_ceil(BYTES_PER_TOKEN) as u32,
        })
        .collect();
    if output_tokens > 0 {
        out.push(Segment {
            key: request_key,
            offset: 0,
            len: output_tokens,
        });
    }
    out
}

/// The text of output token `index` (1-based) of a response: always
/// exactly 4 bytes, so the response re-tokenizes to its token count.
pub fn output_token(index: u32) -> String {
    format!(" {:03}", index % 1000)
}

/// The fixed chat template.
pub fn render_chat<'a>(messages: impl IntoIterator<Item = (&'a str, String)>) -> String {
    let mut s = String::new();
    for (role, content) in messages {
        s.push_str("<|");
        s.push_str(role);
        s.push_str("|>\n");
        s.push_str(&content);
        s.push('\n');
    }
    s.push_str("<|assistant|>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use blis_traces::content::block_hashes_of;

    #[test]
    fn counts_four_bytes_per_token() {
        assert_eq!(count(""), 0);
        assert_eq!(count("abcd"), 1);
        assert_eq!(count("abcde"), 2);
        assert_eq!(
            ids("abcdXY"),
            vec![
                u32::from_le_bytes(*b"abcd"),
                u32::from_le_bytes([b'X', b'Y', 0, 0])
            ]
        );
        assert_eq!(output_token(7).len(), 4);
        assert_eq!(output_token(1234), " 234");
    }

    #[test]
    fn shared_text_prefixes_share_kv_blocks() {
        let prefix = "s".repeat(64 * 3 + 10);
        let a = format!("{prefix}first question{}", "a".repeat(100));
        let b = format!("{prefix}another one{}", "b".repeat(100));
        let (mut ha, mut hb) = (Vec::new(), Vec::new());
        block_hashes_of(&segments(&a, 16, 1, 0), 16, &mut ha);
        block_hashes_of(&segments(&b, 16, 2, 0), 16, &mut hb);
        assert_eq!(ha[..3], hb[..3]);
        assert_ne!(ha[3], hb[3]);
    }
}
