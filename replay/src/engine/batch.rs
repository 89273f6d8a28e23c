//! Batch formation, vLLM V1's scheduler step (`vllm/v1/core/sched/scheduler.py`;
//! `../shared/design/core-engine.md`, Batch Formation): continuous
//! batching, chunked prefill within the token budget, prefix-cache hits
//! at admission, and preemption by recompute when the KV cache is full.

use super::instance::{EngineConfig, Instance, Run};
use super::queue_order::SchedulerPolicy;
use blis_traces::itl_steps::round_to_i64;

use crate::latency::{DecodeSteps, LatencyModel, Model, PrefillChunk};

/// Adds decoding request `slot` to the group of `phase` in `groups`,
/// noting in `used` a phase that was empty.
#[inline]
fn group_push(groups: &mut [Vec<u32>], used: &mut Vec<u32>, phase: u32, slot: u32) {
    let g = &mut groups[phase as usize];
    if g.is_empty() {
        used.push(phase);
    }
    g.push(slot);
}

impl Instance {
    /// Removes `victim` from the running set and puts it back to wait.
    pub(super) fn preempt(&mut self, victim_pos: usize) -> u32 {
        let slot = self.running.remove(victim_pos);
        self.flush_private(slot);
        let a = self.slots[slot as usize].as_mut().expect("live slot");
        // Its private blocks become findable by hash: it will look them up
        // when it is scheduled again.
        for &b in a.blocks.iter().skip(a.private_from as usize) {
            self.kv.index_private(b);
        }
        let mut blocks = std::mem::take(&mut a.blocks);
        a.num_computed = 0;
        a.hashed = 0;
        a.preemptions += 1;
        let key = a.key;
        self.kv.release(&mut blocks);
        // (The emptied table, its room kept, for its next admission.)
        self.act_mut(slot).blocks = blocks;
        self.waiting.push_preempted(slot, key);
        self.count_waiting(slot, true);
        self.counters.preemptions += 1;
        slot
    }

    /// The running position of the request to preempt: the last one
    /// (FCFS, SJF, key-latest) or the least urgent, latest one (priority
    /// policies).
    fn victim(&self) -> usize {
        let mut best = self.running.len() - 1;
        if !self.victim_is_last() {
            for (i, &s) in self.running.iter().enumerate() {
                if self.act(s).key >= self.act(self.running[best]).key {
                    best = i;
                }
            }
        }
        best
    }

    /// Whether [`Instance::victim`] is always the last running request
    /// (the policy's order, not its priorities, chooses it).
    pub(super) fn victim_is_last(&self) -> bool {
        matches!(
            self.cfg.scheduler,
            SchedulerPolicy::Fcfs | SchedulerPolicy::Sjf | SchedulerPolicy::KeyLatest
        )
    }

    /// Forms the next batch at `now` (vLLM V1's scheduler): running
    /// requests first, in running order, each its next chunk within the
    /// token budget (`max_num_batched_tokens`, `long_prefill_token_threshold`),
    /// preempting from the back when KV blocks run out; then waiting
    /// requests in queue order within `max_num_seqs`, each with its prefix
    /// cache hit and a chunk of its prompt (chunked prefill). The batch
    /// runs until its step ends, or decode-only steps are fast-forwarded up
    /// to `limit`.
    pub(super) fn form_batch(&mut self, now: i64, limit: i64) {
        if self.kv.tiered() {
            self.kv.set_clock(now);
            self.kv.maybe_offload(now);
            // Eager offload: a run whose usage crosses the offload
            // threshold ends at the step that crosses it, whose end
            // offloads, as single steps do.
            self.offload_cap = self
                .kv
                .offload_cap()
                .filter(|&cap| self.kv.used() <= cap)
                .unwrap_or(u32::MAX);
        }
        if self.cohort_enabled() && self.form_cohort_batch(now, limit) {
            return;
        }
        let mut budget = self.cfg.max_num_batched_tokens;
        let mut scheduled = std::mem::take(&mut self.spare_scheduled);
        scheduled.clear();
        if let Some(min_left) = self.form_decode_batch(&mut scheduled) {
            let dt = round_to_i64(self.latency.step_time_us(&self.shape)).max(1);
            let mut ends = std::mem::take(&mut self.spare_ends);
            ends.clear();
            ends.push(now + dt);
            self.fast_forward(now, limit, dt, &scheduled, min_left, &mut ends);
            self.run = Some(Run {
                scheduled,
                ends,
                cohort: 0,
            });
            return;
        }
        // The step's shape is summed as requests are scheduled (one pass
        // over the batch, not two); a preemption, which takes a scheduled
        // request back, has it recomputed by `step_shape`.
        self.shape.clear();
        let preempted = self.schedule_running(&mut scheduled, &mut budget);
        if !preempted {
            self.admit_waiting(now, &mut scheduled, &mut budget);
        }
        if scheduled.is_empty() {
            self.spare_scheduled = scheduled;
            if preempted {
                // The request being scheduled preempted itself (a priority
                // policy chose it as the victim): like vLLM's next engine
                // iteration, schedule again with the freed blocks. Each
                // round preempts a request, so this ends.
                return self.form_batch(now, limit);
            }
            // Nothing waits or runs. (With work in the system one request
            // is always schedulable: the unservable check guarantees that
            // any request fits on its own; unless blocks held for P/D
            // transfers take the room, and their release schedules again.)
            debug_assert!(
                self.in_system() == 0 || !self.held.is_empty(),
                "work waits but nothing was scheduled"
            );
            if self.in_system() > 0 && self.held.is_empty() {
                self.kick = Some(now + 1);
            }
            return;
        }
        let (decode_only, min_left) = if preempted || self.shape.prefill.is_empty() {
            self.step_shape(&scheduled)
        } else {
            // A step with a prefill is never fast-forwarded: its phase
            // groups and fewest tokens left are not needed.
            self.counters.prompt_tokens += self.shape.prefill_tokens();
            (false, u32::MAX)
        };
        let dt = round_to_i64(self.latency.step_time_us(&self.shape)).max(1);
        // A tiered cache's reloads are charged to the step that needs them
        // (also when it looks like a decode step: a preempted request whose
        // context but its last token was reloaded).
        let transfer = std::mem::take(&mut self.pending_transfer_us);
        let mut ends = std::mem::take(&mut self.spare_ends);
        ends.clear();
        ends.push(now + dt + transfer);
        if decode_only && !preempted {
            self.fast_forward(now + transfer, limit, dt, &scheduled, min_left, &mut ends);
        }
        self.run = Some(Run {
            scheduled,
            ends,
            cohort: 0,
        });
    }

    /// Steps 1 to 3 in one pass for the most common batch: every running
    /// request decodes its next token, nothing waiting can join (none
    /// waits, or `max_num_seqs` is reached), the token budget holds them
    /// all and the free KV blocks hold their new blocks. Then the batch,
    /// its blocks, its shape and its phase groups are exactly what
    /// [`Instance::schedule_running`], [`Instance::admit_waiting`] and
    /// [`Instance::step_shape`] give, and the fewest tokens a request has
    /// left is returned; otherwise nothing is changed and `None` returned.
    fn form_decode_batch(&mut self, scheduled: &mut Vec<(u32, u32)>) -> Option<u32> {
        let n = self.running.len();
        if n == 0
            || n > self.cfg.max_num_batched_tokens as usize
            || !(self.waiting.is_empty()
                || n >= self.cfg.max_num_seqs as usize
                || n == self.cfg.max_num_batched_tokens as usize)
        {
            return None;
        }
        self.clear_groups();
        self.shape.clear();
        self.block_needs.clear();
        let mut min_left = u32::MAX;
        let mut need = 0u32;
        for &slot in &self.running {
            let a = self.slots[slot as usize].as_ref().expect("live slot");
            if a.generated == 0 || a.num_computed + 1 != a.num_tokens() {
                scheduled.clear();
                return None;
            }
            let more = self
                .kv
                .blocks_for(a.num_computed + 1)
                .saturating_sub(a.table_len());
            if more > 0 {
                need += more;
                self.block_needs.push((slot, more));
            }
            self.shape.decode_count += 1;
            self.shape.decode_context_sum += u64::from(a.num_computed);
            min_left = min_left.min(a.target - a.generated);
            let phase = self.kv.phase(a.num_computed);
            group_push(&mut self.groups, &mut self.used_phases, phase, slot);
            scheduled.push((slot, 1));
        }
        if need > self.kv.free() {
            scheduled.clear();
            return None;
        }
        for &(slot, more) in &self.block_needs {
            let a = self.slots[slot as usize].as_mut().expect("live slot");
            let ok = self.kv.allocate(&mut a.blocks, &[], more);
            debug_assert!(ok, "the free blocks were counted");
        }
        Some(min_left)
    }

    /// Empties the phase groups (one per block position) for a new batch:
    /// those used, so that a large `block_size` costs nothing per step.
    pub(super) fn clear_groups(&mut self) {
        let bs = self.kv.block_size() as usize;
        if self.groups.len() != bs {
            self.groups.resize_with(bs, Vec::new);
        }
        for &p in &self.used_phases {
            self.groups[p as usize].clear();
        }
        self.used_phases.clear();
    }

    /// Step 1: the running requests, in running order, each its next chunk
    /// (a decode token, or the rest of its prompt within
    /// `long_prefill_token_threshold`) within the token budget; a request
    /// whose KV blocks cannot be allocated preempts from the back (vLLM's
    /// victim: the last running, or the least urgent under a priority
    /// policy) until it fits or is itself the victim. Returns whether a
    /// request was preempted.
    fn schedule_running(&mut self, scheduled: &mut Vec<(u32, u32)>, budget: &mut u32) -> bool {
        self.schedule_running_from(0, scheduled, budget)
    }

    /// [`Instance::schedule_running`] of the running requests from position
    /// `start` on (those before it are scheduled otherwise: the cohort).
    pub(super) fn schedule_running_from(
        &mut self,
        start: usize,
        scheduled: &mut Vec<(u32, u32)>,
        budget: &mut u32,
    ) -> bool {
        let mut preempted = false;
        let mut i = start;
        while i < self.running.len() && *budget > 0 {
            let slot = self.running[i];
            let a = self.act(slot);
            let mut n = a.num_tokens() - a.num_computed;
            if self.cfg.long_prefill_token_threshold > 0 {
                n = n.min(self.cfg.long_prefill_token_threshold);
            }
            n = n.min(*budget);
            if n == 0 {
                i += 1;
                continue;
            }
            let mut scheduled_it = false;
            loop {
                let a = self.act(slot);
                let need = self
                    .kv
                    .blocks_for(a.num_computed + n)
                    .saturating_sub(a.table_len());
                if need == 0 {
                    scheduled_it = true;
                    break;
                }
                let mut blocks = std::mem::take(&mut self.act_mut(slot).blocks);
                let ok = self.kv.allocate(&mut blocks, &[], need);
                self.act_mut(slot).blocks = blocks;
                if ok {
                    scheduled_it = true;
                    break;
                }
                let v = self.victim();
                let victim_slot = self.running[v];
                // A victim already scheduled in this step gives its budget back.
                if let Some(pos) = scheduled.iter().position(|(s, _)| *s == victim_slot) {
                    *budget += scheduled[pos].1;
                    scheduled.remove(pos);
                }
                if v < i {
                    i -= 1;
                }
                self.preempt(v);
                preempted = true;
                if victim_slot == slot {
                    break;
                }
            }
            if !scheduled_it {
                break;
            }
            self.add_to_shape(slot, n);
            scheduled.push((slot, n));
            *budget -= n;
            i += 1;
        }
        preempted
    }

    /// Adds request `slot`'s chunk of `n` tokens to the shape of the step
    /// being formed, as [`Instance::step_shape`] would.
    #[inline]
    fn add_to_shape(&mut self, slot: u32, n: u32) {
        let a = self.slots[slot as usize].as_ref().expect("live slot");
        if a.generated > 0 && n == 1 && a.num_computed + 1 == a.num_tokens() {
            self.shape.decode_count += 1;
            self.shape.decode_context_sum += u64::from(a.num_computed);
        } else {
            self.shape.prefill.push(PrefillChunk {
                computed_before: a.num_computed,
                new_tokens: n,
            });
        }
    }

    /// Step 2: waiting requests in queue order while the budget and
    /// `max_num_seqs` allow, each with its prefix-cache hit (whole blocks,
    /// never its last token) and a chunk of the rest of its prompt (chunked
    /// prefill). Under async scheduling only those that were waiting when
    /// the previous step was formed, unless the engine is idle. The first
    /// that does not fit in the KV cache stops the admission (FCFS: no
    /// skipping ahead).
    pub(super) fn admit_waiting(
        &mut self,
        now: i64,
        scheduled: &mut Vec<(u32, u32)>,
        budget: &mut u32,
    ) {
        let bs = self.kv.block_size();
        let idle = self.running.is_empty();
        while *budget > 0 && (self.running.len() as u32) < self.cfg.max_num_seqs {
            let Some(slot) = self.waiting.peek() else {
                break;
            };
            let a = self.slots[slot as usize].as_mut().expect("live slot");
            if !idle && a.eligible_after >= now {
                break;
            }
            let num_tokens = a.num_tokens();
            // Prefix-cache hits: full blocks, at most all but the last token.
            let mut max_hit_blocks = (num_tokens - 1) / bs;
            if a.preemptions == 0 {
                // Private content is nowhere in the cache yet.
                max_hit_blocks = max_hit_blocks.min(a.private_from);
            }
            // However many blocks hit, the first chunk after them takes
            // at least the blocks of the chunk after all of them (a hit
            // on the CPU tier takes a fresh block too): a request for
            // which the free blocks are fewer does not fit, and is not
            // looked up (under overload a blocked head of the queue is
            // tried at every step). Debug builds go on, to check below
            // that it fails.
            let least = first_chunk(&self.cfg, num_tokens - max_hit_blocks * bs, *budget);
            let hopeless = self.kv.blocks_for(least) > self.kv.free();
            if hopeless && !cfg!(debug_assertions) {
                break;
            }
            // (Without prefix caching no block hits, and none is hashed.)
            let looked_up = if self.kv.prefix_caching() {
                max_hit_blocks
            } else {
                0
            };
            self.kv
                .match_prefix(a.hashes_upto(bs, looked_up), &mut self.hits);
            // A tiered cache: the blocks after the GPU's hits that the CPU
            // tier holds are reloaded instead of recomputed.
            let gpu_hits = self.hits.len() as u32;
            // (Counted once: the checks below take the same GPU hits.)
            let free_hits = self.kv.free_hits(&self.hits);
            let mut doomed = false;
            if self.kv.tiered() {
                // Reloads cannot make a request fit that does not fit
                // without them: each takes a fresh block and saves at most
                // one block of the chunk. So a request that does not fit
                // on its GPU hits alone is not looked up on the CPU (a
                // head of the queue blocked step after step, under
                // overload, would be looked up at every step). (Without
                // chunked prefill, one that fits in the KV cache may still
                // not fit in the budget: that is checked below.)
                let n = first_chunk(&self.cfg, num_tokens - gpu_hits * bs, *budget);
                doomed = !self.kv.can_allocate_after(free_hits, self.kv.blocks_for(n));
                // (Debug builds go on, to check below that it fails.)
                if doomed && !cfg!(debug_assertions) {
                    break;
                }
            }
            let mut reloads = 0;
            while self.kv.tiered()
                && gpu_hits + reloads < max_hit_blocks
                && self.kv.cpu_holds_pinned(a.hash(bs, gpu_hits + reloads))
            {
                reloads += 1;
            }
            let a = self.slots[slot as usize].as_ref().expect("live slot");
            let hit_tokens = (gpu_hits + reloads) * bs;
            let left = num_tokens - hit_tokens;
            if !self.cfg.chunked_prefill {
                // Without chunked prefill the whole uncached prompt runs in
                // one step: the request waits for a step with room for it.
                // (A prompt beyond the whole budget, which vLLM's settings
                // check refuses, is chunked rather than never run.)
                let never_fits = left > self.cfg.max_num_batched_tokens;
                if left > *budget && !(never_fits && scheduled.is_empty()) {
                    if reloads > 0 {
                        self.kv.unpin_all();
                    }
                    break;
                }
            }
            let n = first_chunk(&self.cfg, left, *budget);
            let need = self.kv.blocks_for(hit_tokens + n) - gpu_hits;
            // (Checked before the request's block table is made: a blocked
            // head of the queue is tried again at every step.)
            let ok = self.kv.can_allocate_after(free_hits, need);
            if !ok {
                if reloads > 0 {
                    self.kv.unpin_all();
                }
                break;
            }
            debug_assert!(!doomed, "a request that did not fit on its GPU hits fits");
            debug_assert!(!hopeless, "a request whose last chunk had no room fits");
            let hits = std::mem::take(&mut self.hits);
            let lifetime = self.life_blocks(a.req.input_tokens, a.target);
            // (Its table, empty while it waits, was reserved for its whole
            // life when it was enqueued, and kept when it was preempted.)
            let a = self.slots[slot as usize].as_mut().expect("live slot");
            let mut blocks = std::mem::take(&mut a.blocks);
            debug_assert!(blocks.is_empty(), "a waiting request holds no blocks");
            blocks.reserve_exact(lifetime);
            self.kv.allocate_checked(&mut blocks, &hits, need);
            self.hits = hits;
            self.waiting.pop();
            let class = a.req.class;
            self.count_waiting(slot, false);
            if self.more_urgent_waiting(class) {
                self.counters.priority_inversions += 1;
            }
            self.running.push(slot);
            let nh = self.hits.len() as u32;
            let a = self.slots[slot as usize].as_mut().expect("live slot");
            a.join = self.joins;
            self.joins += 1;
            a.blocks = blocks;
            a.num_computed = hit_tokens;
            a.hashed = nh;
            let first_admission = a.scheduled_us.is_none();
            if first_admission {
                a.scheduled_us = Some(now);
                a.cached_tokens = Some(hit_tokens);
                let input = a.req.input_tokens;
                self.counters.prefix_queries += u64::from(input);
                self.counters.prefix_hits += u64::from((nh * bs).min(input));
            }
            if self.kv.tiered() {
                // At every admission: a preempted request queries again.
                let gpu_tokens = nh * bs;
                self.counters.external_queries +=
                    u64::from(a.num_tokens().saturating_sub(gpu_tokens));
                self.counters.external_hits += u64::from(reloads * bs);
            }
            if reloads > 0 {
                self.reload_blocks(slot, nh, reloads, now);
                self.kv.unpin_all();
            }
            self.add_to_shape(slot, n);
            scheduled.push((slot, n));
            *budget -= n;
        }
    }

    /// Tiered KV cache: fills the request's blocks `[from, from + count)`
    /// (fresh blocks just allocated) with their content from the CPU tier,
    /// and charges the transfer to the batch being formed.
    fn reload_blocks(&mut self, slot: u32, from: u32, count: u32, now: i64) {
        let bs = self.kv.block_size();
        let a = self.slots[slot as usize].as_mut().expect("live slot");
        for j in from..from + count {
            let h = a.hash(bs, j);
            let parent = j.checked_sub(1).map(|p| a.blocks[p as usize]);
            self.kv.reload(a.blocks[j as usize], h, parent, now);
        }
        a.hashed = from + count;
        self.pending_transfer_us += self.kv.charge_transfer(count);
    }

    /// Step 3: the batch's shape for the latency model; whether it is
    /// decode-only, and the fewest tokens a decoding request has left.
    pub(super) fn step_shape(&mut self, scheduled: &[(u32, u32)]) -> (bool, u32) {
        self.shape.clear();
        self.clear_groups();
        let mut decode_only = true;
        let mut min_left = u32::MAX;
        for &(slot, n) in scheduled {
            let a = self.slots[slot as usize].as_ref().expect("live slot");
            let is_decode = a.generated > 0 && n == 1 && a.num_computed + 1 == a.num_tokens();
            if is_decode {
                self.shape.decode_count += 1;
                self.shape.decode_context_sum += u64::from(a.num_computed);
                min_left = min_left.min(a.target - a.generated);
                // Its phase: after step j of a decode-only run, the
                // requests of phase j % bs fill a block.
                let phase = self.kv.phase(a.num_computed);
                group_push(&mut self.groups, &mut self.used_phases, phase, slot);
            } else {
                decode_only = false;
                self.shape.prefill.push(PrefillChunk {
                    computed_before: a.num_computed,
                    new_tokens: n,
                });
                self.counters.prompt_tokens += u64::from(n);
            }
        }
        (decode_only, min_left)
    }

    /// Step 4: a decode-only batch that nothing can join runs as one event
    /// of up to `min_left` identical steps (each its own time), stopping
    /// before a step that would need more free KV blocks than there are, or
    /// end after `limit` (the next event outside the instance). Results are
    /// byte-identical to stepping one at a time (`--no-fast-forward`).
    pub(super) fn fast_forward(
        &mut self,
        now: i64,
        limit: i64,
        dt: i64,
        scheduled: &[(u32, u32)],
        min_left: u32,
        ends: &mut Vec<i64>,
    ) {
        let all_running_scheduled = scheduled.len() == self.running.len();
        let can_grow =
            self.waiting.is_empty() || self.running.len() as u32 >= self.cfg.max_num_seqs;
        let below_offload = self.kv.used() <= self.offload_cap;
        if self.cfg.fast_forward && all_running_scheduled && can_grow && below_offload {
            let max_k = min_left;
            // Requests needing a new block at step j+1 of the run are those
            // whose KV position crosses a block boundary: (c0 + j) % bs == 0,
            // i.e. j ≡ phase (mod bs) with phase = (bs - c0 % bs) % bs.
            let mut per_phase = std::mem::take(&mut self.run_phase);
            let bs = self.groups.len();
            if per_phase.len() == bs {
                for &p in &self.run_phases_used {
                    per_phase[p as usize] = 0;
                }
            } else {
                per_phase.clear();
                per_phase.resize(bs, 0);
            }
            self.run_phases_used.clone_from(&self.used_phases);
            for &p in &self.used_phases {
                per_phase[p as usize] = self.groups[p as usize].len() as u32;
            }
            self.plan_decode_steps(
                &per_phase,
                max_k,
                scheduled.len() as u64,
                now,
                limit,
                dt,
                ends,
            );
            self.run_phase = per_phase;
        }
    }

    /// The steps after the first of a decode-only run of `b` requests
    /// whose first step ends at `now + dt`: appended to `ends` while fewer
    /// than `max_k` (its first completion), the KV blocks of the next step
    /// (`per_phase[k % block_size]` after step `k`) are free, no step ends
    /// after `limit`, and the KV use stays within the offload cap. Each
    /// step's time from the shape, its decode context grown by a token a
    /// request (a blackbox model's is constant).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn plan_decode_steps(
        &mut self,
        per_phase: &[u32],
        max_k: u32,
        b: u64,
        now: i64,
        limit: i64,
        dt: i64,
        ends: &mut Vec<i64>,
    ) {
        let mut free = self.kv.free();
        let mut ctx = self.shape.decode_context_sum;
        let mut end = now + dt;
        let mut k = 1u32;
        let constant = matches!(self.latency, Model::Blackbox(_));
        let steps = if constant || k >= max_k {
            DecodeSteps::Whole
        } else {
            self.latency.decode_steps(&self.shape)
        };
        while k < max_k {
            let need = per_phase[self.kv.in_block(k) as usize];
            if need > free {
                break;
            }
            let d = if constant {
                dt
            } else {
                ctx += b;
                round_to_i64(self.latency.decode_step_us(&steps, &mut self.shape, ctx)).max(1)
            };
            if end + d > limit {
                break;
            }
            free -= need;
            end += d;
            ends.push(end);
            k += 1;
            if self.kv.total() - free > self.offload_cap {
                break;
            }
        }
    }
}

/// The tokens of a waiting request's first step when `left` of its prompt
/// are not cached and `budget` are left in the step: the long prefill
/// threshold under chunked prefill, then the budget. (Without chunked
/// prefill the caller has checked that the rest fits the budget, or that it
/// never can and the step is otherwise empty.)
fn first_chunk(cfg: &EngineConfig, left: u32, budget: u32) -> u32 {
    let mut n = left;
    if cfg.chunked_prefill && cfg.long_prefill_token_threshold > 0 {
        n = n.min(cfg.long_prefill_token_threshold);
    }
    n.min(budget)
}
