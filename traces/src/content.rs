//! Token content without tokens: the identity of a request's input, from
//! which a simulator derives KV-block hashes for prefix caching.
//!
//! A request's input is a sequence of *segments*, each a run of tokens drawn
//! from a keyed pseudo-random stream: the shared prefix of its prefix group
//! (key = hash of the group name), then its own body (key = its
//! `content_key`, else its session, else its request id). All rounds of a
//! session share one body stream, so round N's input is a prefix of round
//! N+1's, as with a real chat history. Mooncake-style `hash_ids` replace the
//! segments by one segment per identified block.
//!
//! Tokens are never materialised: a KV block's hash is computed from its
//! parent's hash and the (key, offset, length) pieces of the segments it
//! covers, which identify its tokens exactly. Equal token content therefore
//! gives equal chained hashes, as vLLM's prefix cache hashes blocks (each
//! block's hash includes its parent's).

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

use crate::record::Request;

/// One run of tokens from a keyed stream, starting at `offset` in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// Stream identity.
    pub key: u64,
    /// First token's position in the stream.
    pub offset: u32,
    /// Number of tokens.
    pub len: u32,
}

/// Salts a request's own key for the output of a request whose input is
/// given by Mooncake hash ids (its output continues no input stream).
const OUTPUT_SALT: u64 = 0x4f55_5450_5554;

/// The key of a prefix group's shared stream.
pub fn prefix_key(group: &str) -> u64 {
    xxh3_64_with_seed(group.as_bytes(), 0x5052_4546_4958)
}

/// The key of a session's shared body stream.
pub fn session_key(session: &str) -> u64 {
    xxh3_64_with_seed(session.as_bytes(), 0x0053_4553_5349_4f4e)
}

/// The key of a single request's body stream.
pub fn request_key(request_id: u64) -> u64 {
    xxh3_64_with_seed(&request_id.to_le_bytes(), 0x0052_4551_5545_5354)
}

/// The segments of `r`'s input (`input_tokens` long in total, or
/// `input_len` when given, e.g. the server-reported count).
pub fn segments(r: &Request, input_len: u32, out: &mut Vec<Segment>) {
    out.clear();
    if let Some(h) = &r.hash_ids {
        let bt = h.block_tokens.max(1);
        let mut left = input_len;
        for id in h.ids.iter() {
            if left == 0 {
                break;
            }
            let len = left.min(bt);
            out.push(Segment {
                key: xxh3_64_with_seed(&id.to_le_bytes(), 0x4841_5348),
                offset: 0,
                len,
            });
            left -= len;
        }
        if left > 0 {
            out.push(Segment {
                key: request_key(r.request_id),
                offset: 0,
                len: left,
            });
        }
        return;
    }
    let prefix = if r.prefix_group.is_empty() {
        0
    } else {
        r.prefix_length.min(input_len)
    };
    if prefix > 0 {
        out.push(Segment {
            key: prefix_key(&r.prefix_group),
            offset: 0,
            len: prefix,
        });
    }
    let body = input_len - prefix;
    if body > 0 {
        let key = r.content_key.unwrap_or_else(|| {
            if r.session_id.is_empty() {
                request_key(r.request_id)
            } else {
                session_key(&r.session_id)
            }
        });
        out.push(Segment {
            key,
            offset: 0,
            len: body,
        });
    }
}

/// Chained hashes of the full `block_size`-token blocks of `r`'s input of
/// `input_len` tokens, appended to `out` (cleared first). A partial last
/// block has no hash (it cannot be shared).
pub fn block_hashes(r: &Request, input_len: u32, block_size: u32, out: &mut Vec<u64>) {
    let mut segs = Vec::with_capacity(2);
    segments(r, input_len, &mut segs);
    block_hashes_of(&segs, block_size, out);
}

/// The first token of `segs` (segments of request `r` with id
/// `request_id`, from [`segments`] or [`sequence_segments`]) drawn from a
/// stream that only `r` reads: its own
/// body when it has no session and no content key, or the output of a
/// Mooncake hash-id request. Chained hashes make every KV block from
/// `at / block_size` on private to `r`: no other request (with another
/// request id) can hold the same content. `None`: all of `r`'s content is
/// shareable.
pub fn private_from(request_id: u64, segs: &[Segment]) -> Option<u32> {
    let own = request_key(request_id);
    let mut at = 0u32;
    for s in segs {
        if s.key == own || s.key == own ^ OUTPUT_SALT {
            return Some(at);
        }
        // (Past 2^32 tokens no block can start: a request's sequence is
        // capped by the context length long before.)
        at = at.saturating_add(s.len);
    }
    None
}

/// [`block_hashes`] with a memo of shared-prefix blocks: the hashes of
/// the blocks that lie wholly in a prefix group's shared stream depend only
/// on the stream and the block size, so a router that hashes every request
/// of a group computes them once. Gives exactly [`block_hashes`]'s output.
/// Memory: 8 bytes per distinct shared-prefix block seen.
#[derive(Debug, Default, Clone)]
pub struct PrefixHashMemo {
    memo: std::collections::HashMap<(u64, u32), Vec<u64>>,
    segs: Vec<Segment>,
}

impl PrefixHashMemo {
    /// An empty memo.
    pub fn new() -> Self {
        Self::default()
    }

    /// [`block_hashes`] of `r`; returns the index of its first private
    /// block (see [`private_from`]; `out.len()` when none is).
    pub fn block_hashes(
        &mut self,
        r: &Request,
        input_len: u32,
        block_size: u32,
        out: &mut Vec<u64>,
    ) -> usize {
        let mut segs = std::mem::take(&mut self.segs);
        segments(r, input_len, &mut segs);
        let bs = block_size.max(1);
        let private = private_from(r.request_id, &segs).map(|at| (at / bs) as usize);
        let shared = r.hash_ids.is_none()
            && !r.prefix_group.is_empty()
            && segs
                .first()
                .is_some_and(|s| s.offset == 0 && s.len == r.prefix_length.min(input_len));
        if !shared {
            block_hashes_of(&segs, block_size, out);
            self.segs = segs;
            return private.unwrap_or(out.len()).min(out.len());
        }
        let first = segs[0];
        let within = (first.len / bs) as usize;
        let known = self.memo.entry((first.key, bs)).or_default();
        let mut parent = known.last().copied().unwrap_or(ROOT_HASH);
        while known.len() < within {
            // Blocks wholly in the stream: only the stream's own tokens.
            let one = [Segment {
                key: first.key,
                offset: 0,
                len: (known.len() as u32 + 1) * bs,
            }];
            parent = block_hash(&one, bs, known.len() as u32, parent);
            known.push(parent);
        }
        out.clear();
        let total: u64 = segs.iter().map(|s| u64::from(s.len)).sum();
        let full = (total / u64::from(bs)) as u32;
        out.reserve(full as usize);
        out.extend_from_slice(&known[..within]);
        extend_block_hashes(&segs, bs, full, out);
        self.segs = segs;
        private.unwrap_or(out.len()).min(out.len())
    }
}

/// The segments of `r`'s whole token sequence: its `input_len` input
/// tokens followed by `output_len` output tokens. Output tokens continue the
/// request's body stream, so a session's next round (whose input holds this
/// round's answer) finds this round's output blocks in the prefix cache.
pub fn sequence_segments(r: &Request, input_len: u32, output_len: u32, out: &mut Vec<Segment>) {
    segments(r, input_len, out);
    if output_len == 0 {
        return;
    }
    let body_key = if r.hash_ids.is_some() {
        None
    } else {
        Some(r.content_key.unwrap_or_else(|| {
            if r.session_id.is_empty() {
                request_key(r.request_id)
            } else {
                session_key(&r.session_id)
            }
        }))
    };
    match (out.last_mut(), body_key) {
        (Some(last), Some(k)) if last.key == k => last.len = last.len.saturating_add(output_len),
        (_, Some(k)) => out.push(Segment {
            key: k,
            offset: 0,
            len: output_len,
        }),
        (_, None) => out.push(Segment {
            key: request_key(r.request_id) ^ OUTPUT_SALT,
            offset: 0,
            len: output_len,
        }),
    }
}

/// The parent hash of block 0.
pub const ROOT_HASH: u64 = 0x9E37_79B9_7F4A_7C15;

/// [`block_hash`] of a block that lies within segment `s`, `within`
/// tokens into it, of `bs` tokens (one piece).
#[inline]
fn one_piece_hash(parent: u64, s: &Segment, within: u64, bs: u64) -> u64 {
    let mut piece = [0u8; 24];
    piece[..8].copy_from_slice(&parent.to_le_bytes());
    piece[8..16].copy_from_slice(&s.key.to_le_bytes());
    piece[16..20].copy_from_slice(&s.offset.wrapping_add(within as u32).to_le_bytes());
    piece[20..].copy_from_slice(&(bs as u32).to_le_bytes());
    xxh3_64(&piece)
}

/// Appends to `out`, which holds the chained hashes of the first
/// `out.len()` blocks of the token sequence `segs`, those of its blocks
/// up to block `upto` (exclusive): each [`block_hash`] of its index and
/// of the hash before it, bit for bit, found in one walk over the
/// segments rather than one per block. The blocks must lie within the
/// sequence.
pub fn extend_block_hashes(segs: &[Segment], block_size: u32, upto: u32, out: &mut Vec<u64>) {
    let Some(more) = upto.checked_sub(out.len() as u32).filter(|&m| m > 0) else {
        return;
    };
    out.reserve(more as usize);
    let bs = u64::from(block_size.max(1));
    let mut parent = out.last().copied().unwrap_or(ROOT_HASH);
    // The first segment that ends after the block's first token, and
    // where it starts (only moves forward).
    let mut k = 0;
    let mut seg_start = 0u64;
    for i in out.len() as u32..upto {
        let start = u64::from(i) * bs;
        while k < segs.len() && start >= seg_start + u64::from(segs[k].len) {
            seg_start += u64::from(segs[k].len);
            k += 1;
        }
        parent = match segs.get(k) {
            Some(s) if start + bs <= seg_start + u64::from(s.len) => {
                one_piece_hash(parent, s, start - seg_start, bs)
            }
            // (Across segments: the general form.)
            _ => block_hash(segs, block_size, i, parent),
        };
        out.push(parent);
    }
}

/// The chained hash of block `index` (of `block_size` tokens) of the token
/// sequence `segs`, given the hash of block `index - 1` (`parent`; use
/// [`ROOT_HASH`] for block 0). The block must lie within the sequence.
pub fn block_hash(segs: &[Segment], block_size: u32, index: u32, parent: u64) -> u64 {
    let bs = u64::from(block_size.max(1));
    let mut start = u64::from(index) * bs;
    // Fast path: the block lies within one segment (one piece).
    let mut seg_start = 0u64;
    for s in segs {
        let len = u64::from(s.len);
        if start < seg_start + len {
            if start + bs <= seg_start + len {
                return one_piece_hash(parent, s, start - seg_start, bs);
            }
            break;
        }
        seg_start += len;
    }
    let mut need = bs;
    let mut buf = [0u8; 8 + 16 * 8];
    buf[..8].copy_from_slice(&parent.to_le_bytes());
    let mut n = 8usize;
    let mut spill: Option<Vec<u8>> = None;
    let mut seg_start = 0u64;
    for s in segs {
        if need == 0 {
            break;
        }
        let len = u64::from(s.len);
        if start >= seg_start + len {
            seg_start += len;
            continue;
        }
        let within = start - seg_start;
        let take = (len - within).min(need);
        let mut piece = [0u8; 16];
        piece[..8].copy_from_slice(&s.key.to_le_bytes());
        // (A position in the stream, hashed: past 2^32 it wraps.)
        piece[8..12].copy_from_slice(&s.offset.wrapping_add(within as u32).to_le_bytes());
        piece[12..].copy_from_slice(&(take as u32).to_le_bytes());
        match &mut spill {
            Some(v) => v.extend_from_slice(&piece),
            None if n + 16 <= buf.len() => {
                buf[n..n + 16].copy_from_slice(&piece);
                n += 16;
            }
            None => {
                let mut v = buf[..n].to_vec();
                v.extend_from_slice(&piece);
                spill = Some(v);
            }
        }
        need -= take;
        start += take;
        seg_start += len;
    }
    match &spill {
        Some(v) => xxh3_64(v),
        None => xxh3_64(&buf[..n]),
    }
}

/// Chained hashes of the full blocks of explicit segments.
pub fn block_hashes_of(segs: &[Segment], block_size: u32, out: &mut Vec<u64>) {
    out.clear();
    let bs = block_size.max(1);
    let total: u64 = segs.iter().map(|s| u64::from(s.len)).sum();
    let full = (total / u64::from(bs)) as u32;
    extend_block_hashes(segs, bs, full, out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn req(id: u64, group: &str, prefix: u32, input: u32, session: &str) -> Request {
        Request {
            request_id: id,
            prefix_group: Arc::from(group),
            prefix_length: prefix,
            input_tokens: input,
            session_id: Arc::from(session),
            ..Request::default()
        }
    }

    #[test]
    fn private_content_starts_at_a_requests_own_body() {
        let mut segs = Vec::new();
        let r = req(1, "sys", 64, 200, "");
        segments(&r, 200, &mut segs);
        assert_eq!(private_from(r.request_id, &segs), Some(64));
        sequence_segments(&r, 200, 50, &mut segs);
        assert_eq!(private_from(r.request_id, &segs), Some(64));
        let r = req(2, "", 0, 100, "");
        segments(&r, 100, &mut segs);
        assert_eq!(private_from(r.request_id, &segs), Some(0));
        // A session's rounds and an explicit content key share their body.
        let r = req(3, "sys", 64, 200, "chat-1");
        sequence_segments(&r, 200, 50, &mut segs);
        assert_eq!(private_from(r.request_id, &segs), None);
        let r = Request {
            content_key: Some(7),
            ..req(4, "", 0, 100, "")
        };
        sequence_segments(&r, 100, 50, &mut segs);
        assert_eq!(private_from(r.request_id, &segs), None);
        // Mooncake hash ids: shared blocks, then the request's own tokens.
        let r = Request {
            hash_ids: Some(crate::record::HashIds {
                block_tokens: 16,
                ids: Arc::from(vec![5u64, 6]),
            }),
            ..req(5, "", 0, 40, "")
        };
        segments(&r, 40, &mut segs);
        assert_eq!(private_from(r.request_id, &segs), Some(32));
        segments(&r, 32, &mut segs);
        assert_eq!(private_from(r.request_id, &segs), None);
        sequence_segments(&r, 32, 10, &mut segs);
        assert_eq!(private_from(r.request_id, &segs), Some(32), "its output");
        // The memo reports the first private block.
        let mut memo = PrefixHashMemo::new();
        let mut out = Vec::new();
        assert_eq!(
            memo.block_hashes(&req(6, "sys", 64, 200, ""), 200, 16, &mut out),
            4
        );
        assert_eq!(
            memo.block_hashes(&req(7, "sys", 70, 200, ""), 200, 16, &mut out),
            4
        );
        assert_eq!(
            memo.block_hashes(&req(8, "sys", 64, 200, "s"), 200, 16, &mut out),
            12
        );
    }

    #[test]
    fn the_prefix_memo_gives_exactly_the_plain_hashes() {
        let mut memo = PrefixHashMemo::new();
        let (mut plain, mut memoized) = (Vec::new(), Vec::new());
        // Growing and shrinking prefixes, inputs shorter than the prefix,
        // unaligned prefixes, no group, sessions, two block sizes.
        let cases = [
            req(1, "sys", 64, 200, ""),
            req(2, "sys", 64, 40, ""),
            req(3, "sys", 1000, 1500, ""),
            req(4, "sys", 70, 300, "s1"),
            req(5, "other", 33, 33, ""),
            req(6, "", 0, 100, ""),
            req(7, "sys", 0, 100, ""),
            req(8, "sys", 64, 0, ""),
        ];
        for bs in [16, 7] {
            for r in cases.iter().chain(cases.iter().rev()) {
                block_hashes(r, r.input_tokens, bs, &mut plain);
                let private = memo.block_hashes(r, r.input_tokens, bs, &mut memoized);
                let mut segs = Vec::new();
                segments(r, r.input_tokens, &mut segs);
                let want =
                    private_from(r.request_id, &segs).map_or(plain.len(), |at| (at / bs) as usize);
                assert_eq!(private, want.min(plain.len()));
                assert_eq!(plain, memoized, "request {} block size {bs}", r.request_id);
            }
        }
    }

    /// Segments with lengths from 0 (empty) to many blocks, so that blocks
    /// lie within one segment, straddle several or end exactly at one's end.
    fn any_segments() -> impl proptest::strategy::Strategy<Value = Vec<Segment>> {
        use proptest::prelude::*;
        proptest::collection::vec((any::<u64>(), any::<u32>(), 0u32..300), 0..6).prop_map(|v| {
            v.into_iter()
                .map(|(key, offset, len)| Segment { key, offset, len })
                .collect()
        })
    }

    proptest::proptest! {
        /// Extending a chain from any length gives, bit for bit, the hashes
        /// of one `block_hash` call per block.
        #[test]
        fn extended_hashes_are_the_block_hashes_one_by_one(
            segs in any_segments(),
            block_size in proptest::prop_oneof![1u32..40, proptest::strategy::Just(16u32)],
            from in 0u32..40,
        ) {
            let total: u64 = segs.iter().map(|s| u64::from(s.len)).sum();
            let full = (total / u64::from(block_size)) as u32;
            let mut want = Vec::new();
            let mut parent = ROOT_HASH;
            for i in 0..full {
                parent = block_hash(&segs, block_size, i, parent);
                want.push(parent);
            }
            let mut got = want[..from.min(full) as usize].to_vec();
            extend_block_hashes(&segs, block_size, full, &mut got);
            proptest::prop_assert_eq!(&got, &want);
            // In steps of one block, as a decoding request extends them.
            let mut stepped = Vec::new();
            for upto in 0..=full {
                extend_block_hashes(&segs, block_size, upto, &mut stepped);
            }
            proptest::prop_assert_eq!(&stepped, &want);
        }
    }

    /// The chained hashes are a fixed function of the content (blocks 0,
    /// 1 and 3 each within a segment, block 2 across three): the values
    /// before a chain was extended in one walk, pinned.
    #[test]
    fn block_hashes_keep_their_values() {
        let segs = [
            Segment {
                key: 7,
                offset: 0,
                len: 40,
            },
            Segment {
                key: 9,
                offset: 5,
                len: 3,
            },
            Segment {
                key: 11,
                offset: 0,
                len: 30,
            },
        ];
        let mut out = Vec::new();
        block_hashes_of(&segs, 16, &mut out);
        assert_eq!(
            out,
            [
                8_367_491_836_803_869_734,
                1_340_967_435_333_623_256,
                9_514_479_370_489_331_701,
                9_597_631_009_249_604_993
            ]
        );
    }

    #[test]
    fn shared_prefix_blocks_match_and_bodies_differ() {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        block_hashes(&req(1, "sys", 64, 200, ""), 200, 16, &mut a);
        block_hashes(&req(2, "sys", 64, 300, ""), 300, 16, &mut b);
        assert_eq!(a.len(), 12);
        assert_eq!(b.len(), 18);
        assert_eq!(a[..4], b[..4]);
        assert_ne!(a[4], b[4]);
    }

    #[test]
    fn session_rounds_extend_each_other() {
        let (mut r0, mut r1) = (Vec::new(), Vec::new());
        block_hashes(&req(1, "g", 20, 100, "s1"), 100, 16, &mut r0);
        block_hashes(&req(9, "g", 20, 250, "s1"), 250, 16, &mut r1);
        assert_eq!(r0[..], r1[..r0.len()]);
    }

    #[test]
    fn a_rounds_output_blocks_are_the_next_rounds_input_blocks() {
        // Round 0: 20 prefix + 80 own tokens in, 60 out; round 1's input is
        // round 0's input and output plus a 50-token question.
        let r0 = req(1, "g", 20, 100, "s");
        let r1 = req(2, "g", 20, 210, "s");
        let (mut s0, mut h0, mut h1) = (Vec::new(), Vec::new(), Vec::new());
        sequence_segments(&r0, 100, 60, &mut s0);
        block_hashes_of(&s0, 16, &mut h0);
        block_hashes(&r1, 210, 16, &mut h1);
        assert_eq!(h0.len(), 10);
        assert_eq!(h0[..], h1[..10]);
    }

    #[test]
    fn hash_ids_share_leading_blocks() {
        use crate::record::HashIds;
        let mk = |id: u64, ids: &[u64], input: u32| Request {
            request_id: id,
            input_tokens: input,
            hash_ids: Some(HashIds {
                block_tokens: 512,
                ids: ids.into(),
            }),
            ..Request::default()
        };
        let (mut a, mut b) = (Vec::new(), Vec::new());
        block_hashes(&mk(1, &[0, 1, 2], 1300), 1300, 16, &mut a);
        block_hashes(&mk(2, &[0, 1, 7], 1400), 1400, 16, &mut b);
        assert_eq!(a[..64], b[..64]);
        assert_ne!(a[64], b[64]);
    }
}
