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
//! A sink that reads them ([`CohortNote`]) is told the members' tokens in
//! compact form: who joined and left, and the steps every member took,
//! not a token span per member per step; its outputs (the step-form ITL
//! runs, the gap counts) then cost it O(1) a step too.
//!
//! Every result is byte-identical to stepping each request
//! (`--no-fast-forward` disables the cohort too): the members precede
//! every other running request in the running order (they are its head;
//! a request joins at the tail), so allocations, hash commits, token spans
//! and completions happen in the order single steps give them. When the
//! KV cache runs out, the requests preempted from the back of the running
//! order (vLLM's victims under FCFS and SJF) are taken from behind the
//! members, then from the members' tail, each leaving the cohort, in the
//! order single steps preempt them. Anything else the cohort does not
//! model (a victim chosen by priority, an abort, a split run, P/D
//! hand-offs) first dissolves it back into explicit requests. With a CPU
//! tier, a member's new block is taken at the end of the step before, the
//! time an eviction's offload is stamped with, as single steps take it.
//!
//! A member whose new blocks hold content private to it, which it will
//! forget when it leaves (a request never preempted, while request ids
//! are unique: `KvCache::release_forgetting`), is not touched at its block
//! boundaries at all: its group entry counts the blocks it takes, which
//! leave the free queue as one count for the group
//! (`KvCache::take_virtual`, the same evictions and offloads as one at a
//! time) and are held without ids, and its deferred hash commits are
//! derived when it leaves. Nothing reads the ids of such blocks; a request
//! that turns out to need them (preempted, or its private content shared)
//! is given them first (`Instance::flush_private`), and only which ids
//! differs, which no output depends on.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// The steady decoders' tokens in compact form
/// (`Instance::set_compact_cohort`): who is a member, and the steps in
/// which every member produced a token, instead of a `TokenSpan` per
/// member per step. A note sits in `StepReport::cohort` at a position in
/// `StepReport::spans` (before the span of that index): the order a sink
/// that expanded the notes into spans would see them in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CohortNote {
    /// A request became a member (at the tail of the members).
    Join(CohortJoin),
    /// Every member produced `count` tokens, one per step from
    /// `first_step` of `StepReport::step_ends`; `completing` of them
    /// produced their last token at the last of these steps (and leave
    /// next, with a [`CohortNote::Leave`] each).
    Steps {
        /// Index into `StepReport::step_ends` of the first step.
        first_step: u32,
        /// Steps (a token per member each).
        count: u32,
        /// Members whose last token is at the last step.
        completing: u32,
    },
    /// The member of this tag left (it completed, or was preempted); its
    /// tokens so far are in the notes' steps.
    Leave {
        /// The member's [`crate::SimRequest::tag`].
        tag: u32,
    },
    /// Every member left (the steady decoders were turned back into
    /// requests stepped one by one); their later tokens come as spans.
    LeaveAll,
}

/// A request that became a steady decoder ([`CohortNote::Join`]): what its
/// token spans would carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CohortJoin {
    /// Request id.
    pub id: u64,
    /// The request's [`crate::SimRequest::tag`].
    pub tag: u32,
    /// When the request (last) joined the running batch.
    pub join: u64,
    /// The request's output length.
    pub target: u32,
    /// Output index of its next token (its first as a member).
    pub next_index: u32,
    /// Client-visible time of its latest token, µs.
    pub previous_us: Option<i64>,
    /// Whether it streams (filled in by the driver's sink, which knows;
    /// the instance leaves it `false`).
    pub streaming: bool,
}

/// A member's record: what its token spans need (kept by slot,
/// `Cohort::records`).
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
    /// Client-visible time of its latest token (in compact form, of its
    /// latest token before it joined: its tokens as a member are at the
    /// members' steps, `Cohort::last_end_us`).
    pub(super) last_us: Option<i64>,
}

/// A member in its phase group: with `c0` tokens in KV at cohort step `j0`.
#[derive(Debug, Clone, Copy)]
pub(super) struct GroupEntry {
    pub(super) slot: u32,
    pub(super) c0: u32,
    pub(super) j0: u64,
    /// Its new blocks are private, will be forgotten and need no ids: it
    /// counts them here, and its hash commits (deferred) are derived when
    /// it leaves, without touching its request at each block.
    pub(super) forget: bool,
    /// Blocks it took without ids as a member (`forget`), not yet
    /// written back to its request.
    pub(super) virt: u32,
}

/// The steady decoders ([module docs](self)).
#[derive(Debug, Default)]
pub(super) struct Cohort {
    /// Cohort steps done.
    pub(super) j: u64,
    /// Members' slots in running order: `running[..members.len()]`. A
    /// member that leaves shifts 4-byte slots, not records.
    pub(super) members: Vec<u32>,
    /// Each member's record, by slot (the record of a slot that is not a
    /// member is stale).
    pub(super) records: Vec<Member>,
    /// Per phase `p` (`block_size` groups), in running order: the members
    /// whose KV is a whole number of blocks when `j % block_size == p`
    /// (they need a new block to step, and filled one at the step before).
    pub(super) groups: Vec<Vec<GroupEntry>>,
    /// Σ (c0 − j0) over the members: their KV tokens sum to this plus
    /// `j` per member.
    pub(super) ctx_base: i64,
    /// (cohort step at which it completes, join, slot), soonest first.
    pub(super) completions: BinaryHeap<Reverse<(u64, u64, u32)>>,
    /// Whether the instance may keep a cohort (fast-forward on, no P/D
    /// hand-offs).
    pub(super) enabled: bool,
    /// The members' tokens go to the report in compact form
    /// ([`CohortNote`]): when their tokens become visible then.
    pub(super) compact: Option<blis_traces::itl_steps::ItlTiming>,
    /// Compact form: the notes made outside a report (joins, a
    /// dissolution), for the next one.
    pub(super) log: Vec<CohortNote>,
    /// Compact form: the end of the last step the members stepped, µs.
    pub(super) last_end_us: i64,
    /// Members whose group entry is `forget`.
    pub(super) virtual_members: u32,
    /// Room for the (join, slot) of a phase group's members (preemptions
    /// among members).
    pub(super) scratch: Vec<(u64, u32)>,
}

impl Cohort {
    pub(super) fn len(&self) -> usize {
        self.members.len()
    }

    /// Adds `m` at the tail of the members.
    pub(super) fn push(&mut self, m: Member) {
        let s = m.slot as usize;
        if self.records.len() <= s {
            self.records.resize(s + 1, m);
        }
        self.records[s] = m;
        self.members.push(m.slot);
    }

    /// The record of member `slot`.
    pub(super) fn record(&self, slot: u32) -> &Member {
        &self.records[slot as usize]
    }

    /// Blocks the members took without ids, not yet written back to
    /// their requests.
    pub(super) fn virtual_pending(&self) -> u32 {
        if self.virtual_members == 0 {
            return 0;
        }
        self.groups.iter().flatten().map(|e| e.virt).sum()
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
