//! Prefill/decode disaggregation on the instance side (DistServe, OSDI
//! 2024; vLLM's disaggregated prefill; `../shared/design/macro-plan.md`
//! D.4): a prefill instance computes a request's prompt and first token and
//! keeps its KV blocks until their transfer completes
//! ([`Instance::enqueue_prefill`], [`Instance::release_held`]); a decode
//! instance takes the transferred request straight into its running batch
//! with its prompt already in KV ([`Instance::admit_transferred`]). Blocks
//! have one owner at a time: the owner of the hand-off frees the prefill
//! side's blocks when the decode side has them.

use super::instance::{Active, DropReason, Instance, SimRequest};
use blis_traces::content;

/// Why a decode instance cannot take a transferred request now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandoffError {
    /// It can never serve it (too long for its KV cache or context).
    Dropped(DropReason),
    /// Not now: its running batch is at `max_num_seqs`, or its free KV
    /// blocks cannot hold the prompt. The request waits for room.
    NoRoom,
}

impl Instance {
    /// Prefill side: adds `req` to the wait queue at `now` to compute its
    /// prompt and first token only; when it completes (reported as usual,
    /// with one output token) its KV blocks stay allocated until
    /// [`Instance::release_held`].
    ///
    /// # Errors
    /// The reason it was dropped.
    pub fn enqueue_prefill(&mut self, now: i64, mut req: SimRequest) -> Result<(), DropReason> {
        self.disable_cohort();
        req.output_tokens = 1;
        let tag = req.tag;
        self.enqueue(now, req)?;
        let slot = self.index[&tag];
        self.act_mut(slot).hold_kv = true;
        Ok(())
    }

    /// Prefill side: frees the KV blocks held after its prefill for the
    /// request of tag `tag` ([`SimRequest::tag`]: unique among the requests
    /// in flight, unlike ids), at `now` (its transfer completed, or it was
    /// cancelled); `false` when none are held. Requests waiting for those
    /// blocks are scheduled again.
    pub fn release_held(&mut self, now: i64, tag: u32) -> bool {
        self.disable_cohort();
        let Some(mut blocks) = self.held.remove(&tag) else {
            return false;
        };
        self.kv.release(&mut blocks);
        if self.run.is_none() && self.kick.is_none() && self.in_system() > 0 {
            self.kick = Some(now);
        }
        true
    }

    /// Prefill side: KV blocks held for transfers.
    pub fn held_blocks(&self) -> usize {
        self.held.values().map(Vec::len).sum()
    }

    /// Decode side: takes request `req`, whose prompt was prefilled
    /// elsewhere and whose first token was visible at `first_token_us`
    /// (`cached_tokens` of its prompt were prefix-cache hits there), into
    /// the running batch at `now` with its prompt in KV: the blocks this
    /// instance's prefix cache holds are taken from it, the rest arrive in
    /// fresh blocks and join the cache. It decodes from its second token
    /// on. The owner calls it between steps (after
    /// [`Instance::split_at`]).
    ///
    /// # Errors
    /// [`HandoffError::Dropped`] when this instance can never serve it,
    /// [`HandoffError::NoRoom`] when it cannot now.
    pub fn admit_transferred(
        &mut self,
        now: i64,
        req: SimRequest,
        first_token_us: i64,
        cached_tokens: u32,
    ) -> Result<(), HandoffError> {
        self.disable_cohort();
        let (target, capped) = self.servable(&req).map_err(HandoffError::Dropped)?;
        debug_assert!(target > 1, "a one-token request completes at its prefill");
        let input = req.input_tokens;
        if self.running.len() as u32 >= self.cfg.max_num_seqs {
            return Err(HandoffError::NoRoom);
        }
        let mut req = req;
        let full = self.kv.full_blocks(input);
        let mut hashes = std::mem::take(&mut req.block_hashes);
        if self.kv.prefix_caching() && (hashes.len() as u32) < full {
            content::block_hashes_of(&req.segments, self.kv.block_size(), &mut hashes);
        }
        hashes.truncate(full as usize);
        // The prompt's blocks this instance's prefix cache holds are not
        // transferred (vLLM's connectors load only what is not cached).
        let mut hits = std::mem::take(&mut self.hits);
        self.kv.match_prefix(&hashes, &mut hits);
        let need = self.kv.blocks_for(input) - hits.len() as u32;
        if !self.kv.can_allocate(&hits, need) {
            self.hits = hits;
            return Err(HandoffError::NoRoom);
        }
        let mut blocks = Vec::with_capacity(self.life_blocks(input, target));
        self.kv.allocate_checked(&mut blocks, &hits, need);
        let hit_blocks = hits.len() as u32;
        self.hits = hits;
        if !self.private_blocks {
            self.share_private();
        }
        let private_from = if self.private_blocks {
            content::private_from(req.id, &req.segments)
                .map_or(u32::MAX, |at| at / self.kv.block_size())
        } else {
            u32::MAX
        };
        self.private_live |= private_from != u32::MAX;
        let key = self
            .cfg
            .scheduler
            .key(req.priority, req.input_tokens, self.seq);
        self.seq += 1;
        let tag = req.tag;
        let a = Active {
            req,
            key,
            target,
            capped,
            num_computed: input,
            generated: 1,
            blocks,
            hashed: hit_blocks,
            private_pending: u32::MAX,
            hashes,
            scheduled_us: Some(now),
            first_token_us: Some(first_token_us),
            last_token_us: Some(first_token_us),
            cached_tokens: Some(cached_tokens),
            preemptions: 0,
            join: self.joins,
            private_from,
            eligible_after: i64::MIN,
            hold_kv: false,
            virt: 0,
        };
        self.joins += 1;
        let slot = self.new_slot(a);
        let full = self.kv.full_blocks(input);
        self.commit_hashes_upto(slot, full);
        self.running.push(slot);
        self.index.insert(tag, slot);
        self.counters.enqueued += 1;
        if self.run.is_none() && self.kick.is_none() {
            self.kick = Some(now);
        }
        Ok(())
    }
}
