//! The steady decoders of an instance: the running requests at the head of
//! the running order that decode a token every step, kept implicit.
//!
//! A decoding request's step is always the same (one token, a new KV block
//! every `block_size` tokens), so the cohort keeps what changes as one
//! step counter `j`: a member that joined at cohort step `j0` with `c0`
//! tokens in KV and `g0` produced has `c0 + (j - j0)` and `g0 + (j - j0)` at
//! step `j`. Its [`Active`](super::instance::Active) record keeps `c0`,
//! `g0` and its last token's time from the moment it joined until it
//! leaves (completion, or the cohort is dissolved), when they are written
//! back (`engine::steady`, which steps them). A step then costs, for the
//! cohort, a token span per member from a compact record (what the
//! outputs need), the KV blocks of the members whose last block is full
//! (one in `block_size`, grouped by phase) and sums kept up to date for
//! the step's shape; the requests that change (prompts, newcomers,
//! completions) are stepped one by one as before.
//!
//! Every result is byte-identical to stepping each request
//! (`--no-fast-forward` disables the cohort too): the members precede
//! every other running request in the running order (they are its head;
//! a request joins at the tail), so allocations, hash commits, token spans
//! and completions happen in the order single steps give them. Anything
//! the cohort does not model (a preemption, an abort, a split run, P/D
//! hand-offs, a CPU tier) first dissolves it back into explicit requests.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// A member's record: what its token spans need, in running order.
#[derive(Debug, Clone, Copy)]
pub(super) struct Member {
    pub(super) slot: u32,
    pub(super) tag: u32,
    pub(super) id: u64,
    pub(super) join: u64,
    pub(super) target: u32,
    /// Output tokens when it joined the cohort.
    pub(super) g0: u32,
    /// Cohort step when it joined.
    pub(super) j0: u64,
    /// Client-visible time of its latest token.
    pub(super) last_us: Option<i64>,
}

/// A member in its phase group: with `c0` tokens in KV at cohort step `j0`.
#[derive(Debug, Clone, Copy)]
pub(super) struct GroupEntry {
    pub(super) slot: u32,
    pub(super) c0: u32,
    pub(super) j0: u64,
}

/// The steady decoders ([module docs](self)).
#[derive(Debug, Default)]
pub(super) struct Cohort {
    /// Cohort steps done.
    pub(super) j: u64,
    /// Members in running order: `running[..members.len()]`.
    pub(super) members: Vec<Member>,
    /// Per phase `p` (`block_size` groups), in running order: the members
    /// whose KV is a whole number of blocks when `j % block_size == p`
    /// (they need a new block to step, and filled one at the step before).
    pub(super) groups: Vec<Vec<GroupEntry>>,
    /// Σ (c0 − j0) over the members: their KV tokens sum to this plus
    /// `j` per member.
    pub(super) ctx_base: i64,
    /// (cohort step at which it completes, join, slot), soonest first.
    pub(super) completions: BinaryHeap<Reverse<(u64, u64, u32)>>,
    /// Whether the instance may keep a cohort (fast-forward on, no CPU
    /// tier, no P/D hand-offs).
    pub(super) enabled: bool,
}

impl Cohort {
    pub(super) fn len(&self) -> usize {
        self.members.len()
    }

    /// The members' KV tokens at the current step.
    pub(super) fn context_sum(&self) -> u64 {
        (self.ctx_base + self.j as i64 * self.members.len() as i64) as u64
    }

    /// Steps until the first member completes (at least 1).
    pub(super) fn min_left(&mut self, is_member: impl Fn(u32, u64) -> bool) -> u32 {
        while let Some(&Reverse((at, join, slot))) = self.completions.peek() {
            if is_member(slot, join) {
                return u32::try_from(at - self.j).unwrap_or(u32::MAX);
            }
            self.completions.pop();
        }
        u32::MAX
    }
}
