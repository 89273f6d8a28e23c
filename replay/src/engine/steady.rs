//! How an instance steps its steady decoders ([`super::cohort`]): takes
//! decoders into the cohort, forms a batch with it, finishes its steps,
//! preempts members from its tail when the KV cache runs out, and dissolves
//! it back into explicit requests when something it does not model comes
//! (a victim chosen by priority, an abort, P/D hand-offs).

use std::cmp::Reverse;

use super::cohort::{GroupEntry, Member};
use super::instance::{CohortJoin, CohortNote, Instance, Run, StepReport, TokenSpan};

impl Instance {
    /// Whether a cohort may be kept here now.
    pub(super) fn cohort_enabled(&self) -> bool {
        self.cohort.enabled && self.cfg.fast_forward
    }

    /// Dissolves the cohort for good on this instance (P/D hand-offs).
    pub(super) fn disable_cohort(&mut self) {
        self.dissolve_cohort();
        self.cohort.enabled = false;
    }

    /// Takes the running requests after the members that decode (the
    /// longest such run) into the cohort.
    pub(super) fn absorb_decoders(&mut self) {
        let bs = self.kv.block_size();
        if self.cohort.groups.len() != bs as usize {
            debug_assert!(self.cohort.members.is_empty());
            self.cohort.groups = vec![Vec::new(); bs as usize];
        }
        let j = self.cohort.j;
        while self.cohort.members.len() < self.running.len() {
            let slot = self.running[self.cohort.members.len()];
            let a = self.slots[slot as usize].as_ref().expect("live slot");
            if a.generated == 0 || a.num_computed + 1 != a.num_tokens() {
                break;
            }
            let p = (j + u64::from(self.kv.phase(a.num_computed))) % u64::from(bs);
            // Its blocks from now on are private and forgotten, and its
            // commits deferred (its committed blocks, within its table,
            // reach its private ones): counted, not handed out.
            let forget = self.takes_virtual(a) && a.hashed >= a.private_from;
            self.cohort.virtual_members += u32::from(forget);
            self.cohort.groups[p as usize].push(GroupEntry {
                slot,
                c0: a.num_computed,
                j0: j,
                forget,
                virt: 0,
            });
            self.cohort.ctx_base += i64::from(a.num_computed) - j as i64;
            self.cohort.completions.push(Reverse((
                j + u64::from(a.target - a.generated),
                a.join,
                slot,
            )));
            if self.cohort.compact.is_some() {
                self.cohort.log.push(CohortNote::Join(CohortJoin {
                    id: a.req.id,
                    tag: a.req.tag,
                    join: a.join,
                    target: a.target,
                    next_index: a.generated + 1,
                    previous_us: a.last_token_us,
                    streaming: false,
                }));
            }
            self.cohort.push(Member {
                slot,
                tag: a.req.tag,
                id: a.req.id,
                join: a.join,
                target: a.target,
                g0: a.generated,
                j0: j,
                last_us: a.last_token_us,
            });
        }
    }

    /// Writes a member's progress at the cohort's current step back to its
    /// request.
    fn settle(&mut self, m: &Member) {
        let d = (self.cohort.j - m.j0) as u32;
        let compact = self.cohort.compact;
        let last_end = self.cohort.last_end_us;
        let a = self.slots[m.slot as usize].as_mut().expect("live slot");
        a.num_computed += d;
        a.generated = m.g0 + d;
        a.last_token_us = match compact {
            // (Its latest token: at the members' last step.)
            Some(itl) if d > 0 => {
                Some(last_end + itl.extra_us(a.generated, a.generated >= a.target))
            }
            _ => m.last_us,
        };
    }

    /// Turns the cohort back into explicit requests: each member's progress
    /// written back, and a run in flight with the members in its batch (at
    /// its head, in running order, a token each), its phase groups as a
    /// decode run formed without a cohort has them.
    pub(super) fn dissolve_cohort(&mut self) {
        if self.cohort.members.is_empty() {
            return;
        }
        if self.cohort.compact.is_some() {
            self.cohort.log.push(CohortNote::LeaveAll);
        }
        let members = std::mem::take(&mut self.cohort.members);
        for &s in &members {
            let m = *self.cohort.record(s);
            self.settle(&m);
        }
        if self.cohort.virtual_members > 0 {
            let mut groups = std::mem::take(&mut self.cohort.groups);
            for e in groups.iter().flatten() {
                self.write_back(e);
            }
            for g in &mut groups {
                g.clear();
            }
            self.cohort.groups = groups;
            self.cohort.virtual_members = 0;
        }
        if let Some(mut run) = self.run.take() {
            if run.cohort > 0 {
                let mut scheduled = Vec::with_capacity(members.len() + run.scheduled.len());
                scheduled.extend(members.iter().map(|&s| (s, 1)));
                scheduled.extend_from_slice(&run.scheduled);
                run.scheduled = scheduled;
                run.cohort = 0;
                if run.scheduled.len() == members.len() {
                    // A decode-only run: its groups by phase relative to
                    // its start, as `step_shape` forms them.
                    self.clear_groups();
                    for &s in &members {
                        let a = self.act(s);
                        let phase = self.kv.phase(a.num_computed);
                        let g = &mut self.groups[phase as usize];
                        if g.is_empty() {
                            self.used_phases.push(phase);
                        }
                        g.push(s);
                    }
                }
            }
            self.run = Some(run);
        }
        for g in &mut self.cohort.groups {
            g.clear();
        }
        self.cohort.completions.clear();
        self.cohort.ctx_base = 0;
        self.cohort.j = 0;
        // (The members' vector goes back empty, for its capacity.)
        let mut members = members;
        members.clear();
        self.cohort.members = members;
    }

    /// Whether the request in `slot` still is the one that joined at
    /// `join` (a completion entry of a member, not of a slot reused).
    fn is_member(&self, slot: u32, join: u64) -> bool {
        self.slots
            .get(slot as usize)
            .and_then(Option::as_ref)
            .is_some_and(|a| a.join == join)
    }

    /// Forms the next batch with the cohort (running requests first: the
    /// members, then the others; then admissions, unless a request was
    /// preempted); `false`: the cohort was dissolved (it is empty, or a
    /// policy that chooses victims by priority must preempt), and the
    /// caller forms the batch without it.
    pub(super) fn form_cohort_batch(&mut self, now: i64, limit: i64) -> bool {
        self.absorb_decoders();
        let len = self.cohort.len();
        if len == 0 {
            return false;
        }
        let bs = self.kv.block_size();
        let cap = self.cfg.max_num_batched_tokens;
        if len > cap as usize {
            self.dissolve_cohort();
            return false;
        }
        let p = (self.cohort.j % u64::from(bs)) as usize;
        // The blocks this step takes, with no preemption: the members
        // whose last block is full, then the other running requests'
        // chunks, as `schedule_running` computes them.
        let mut need = self.cohort.groups[p].len() as u32;
        let mut b = cap - len as u32;
        for &slot in &self.running[len..] {
            if b == 0 {
                break;
            }
            let a = self.act(slot);
            let mut n = a.num_tokens() - a.num_computed;
            if self.cfg.long_prefill_token_threshold > 0 {
                n = n.min(self.cfg.long_prefill_token_threshold);
            }
            n = n.min(b);
            if n == 0 {
                continue;
            }
            need += self
                .kv
                .blocks_for(a.num_computed + n)
                .saturating_sub(a.table_len());
            b -= n;
        }
        let mut preempted = false;
        if need <= self.kv.free() {
            let mut group = std::mem::take(&mut self.cohort.groups[p]);
            self.take_group_blocks(&mut group);
            self.cohort.groups[p] = group;
        } else if self.victim_is_last() {
            // Requests are preempted from the back of the running order:
            // requests after the members, then members, each leaving the
            // cohort.
            preempted = self.take_member_blocks_preempting(p);
        } else {
            // (A policy that chooses victims by priority may preempt any
            // member: the cohort is dissolved first.)
            self.dissolve_cohort();
            return false;
        }
        let len = self.cohort.len();
        let mut budget = cap - len as u32;
        self.shape.clear();
        self.shape.decode_count = len as u32;
        self.shape.decode_context_sum = self.cohort.context_sum();
        let mut scheduled = std::mem::take(&mut self.spare_scheduled);
        scheduled.clear();
        preempted |= self.schedule_running_from(len, &mut scheduled, &mut budget);
        debug_assert_eq!(self.cohort.len(), len, "no member is preempted here");
        if len == 0 && scheduled.is_empty() {
            // Every member was preempted, the first by itself: like vLLM's
            // next engine iteration, schedule again with the freed blocks
            // (as `form_batch` does).
            self.spare_scheduled = scheduled;
            self.form_batch(now, limit);
            return true;
        }
        // (After a preemption nothing is admitted, and the step is not
        // fast-forwarded, as `form_batch` does.)
        if !preempted {
            self.admit_waiting(now, &mut scheduled, &mut budget);
        }
        let transfer = std::mem::take(&mut self.pending_transfer_us);
        let dt = blis_traces::itl_steps::round_to_i64(crate::latency::LatencyModel::step_time_us(
            &self.latency,
            &self.shape,
        ))
        .max(1);
        let mut ends = std::mem::take(&mut self.spare_ends);
        ends.clear();
        ends.push(now + dt + transfer);
        if self.shape.prefill.is_empty() && !scheduled.is_empty() {
            // A decode step with a request that is not a member (one
            // admitted with all but its last token cached): formed without
            // the cohort's shortcuts.
            self.dissolve_cohort_into(&mut scheduled);
            let (decode_only, min_left) = self.step_shape(&scheduled);
            debug_assert!(decode_only);
            if decode_only && !preempted {
                self.fast_forward(now + transfer, limit, dt, &scheduled, min_left, &mut ends);
            }
            self.run = Some(Run {
                scheduled,
                ends,
                cohort: 0,
            });
            return true;
        }
        if self.shape.prefill.is_empty() {
            // Decode-only: the members alone; fast-forwarded as
            // `fast_forward` does.
            if !preempted {
                self.cohort_fast_forward(now + transfer, limit, dt, &mut ends);
            }
        } else {
            self.counters.prompt_tokens += self.shape.prefill_tokens();
        }
        self.run = Some(Run {
            scheduled,
            ends,
            cohort: len as u32,
        });
        true
    }

    /// The members' blocks for this step (those of phase group `p`) when
    /// fewer blocks are free than the running requests' chunks need, taken
    /// as [`Instance::schedule_running`] takes them, under a policy whose
    /// victim is the last running request: the members in running order,
    /// each taking a block while one is free; when none is, the last
    /// running request is preempted (one after the members, or a member,
    /// which first leaves the cohort). A member that is itself the victim
    /// ends the step's scheduling (every request after it was preempted
    /// before it). Which member takes which block does not matter (no
    /// output depends on block ids), only the sequence of takes and
    /// preemptions. Returns whether a request was preempted.
    fn take_member_blocks_preempting(&mut self, p: usize) -> bool {
        debug_assert!(self.victim_is_last());
        // The members that need a block, in running order: the order they
        // joined the batch in.
        let mut needers = std::mem::take(&mut self.cohort.scratch);
        needers.clear();
        needers.extend(
            self.cohort.groups[p]
                .iter()
                .map(|e| (self.act(e.slot).join, e.slot)),
        );
        needers.sort_unstable();
        let mut preempted = false;
        // The first member preempted (members go from the back): it and
        // every member after it are preempted.
        let mut first_gone = u64::MAX;
        'members: for &(join, slot) in &needers {
            if join >= first_gone {
                break;
            }
            loop {
                if self.kv.free() > 0 {
                    let mut group = std::mem::take(&mut self.cohort.groups[p]);
                    let e = group
                        .iter()
                        .position(|e| e.slot == slot)
                        .expect("a member that needs a block is in the step's group");
                    self.take_group_blocks(&mut group[e..=e]);
                    self.cohort.groups[p] = group;
                    break;
                }
                let v = self.running.len() - 1;
                let victim = self.running[v];
                if v < self.cohort.len() {
                    first_gone = self.act(victim).join;
                    self.leave_cohort_preempted(victim);
                }
                self.preempt(v);
                preempted = true;
                if victim == slot {
                    break 'members;
                }
            }
        }
        self.cohort.scratch = needers;
        preempted
    }

    /// Member `slot` (the last member) leaves the cohort to be preempted:
    /// its progress written back, its completion forgotten.
    fn leave_cohort_preempted(&mut self, slot: u32) {
        self.leave_cohort(slot);
        self.cohort
            .completions
            .retain(|&Reverse((_, _, s))| s != slot);
    }

    /// Dissolves the cohort while a batch is being formed: the members go
    /// to the head of `scheduled`, a token each.
    fn dissolve_cohort_into(&mut self, scheduled: &mut Vec<(u32, u32)>) {
        let members: Vec<(u32, u32)> = self.cohort.members.iter().map(|&s| (s, 1)).collect();
        self.dissolve_cohort();
        scheduled.splice(0..0, members);
    }

    /// [`Instance::fast_forward`] for a decode-only batch of the members:
    /// up to the first completion, a step's new blocks (the group of its
    /// phase) free, no later than `limit`.
    fn cohort_fast_forward(&mut self, now: i64, limit: i64, dt: i64, ends: &mut Vec<i64>) {
        let can_grow =
            self.waiting.is_empty() || self.running.len() as u32 >= self.cfg.max_num_seqs;
        // (Tiered, eager: a step whose blocks took the usage over the
        // offload threshold ends the run, whose next batch offloads, as
        // `fast_forward` does.)
        let below_offload = self.kv.used() <= self.offload_cap;
        if !(can_grow && below_offload && self.running.len() == self.cohort.len()) {
            return;
        }
        let bs = self.kv.block_size() as usize;
        let j = self.cohort.j;
        // Per phase relative to the run's start (as `fast_forward` keeps
        // them, for `run_progress_at`): after the run's step `k` the group
        // of `(j + k) % bs` takes new blocks.
        let mut per_phase = std::mem::take(&mut self.run_phase);
        per_phase.clear();
        per_phase.resize(bs, 0);
        self.run_phases_used.clear();
        for (q, x) in per_phase.iter_mut().enumerate() {
            *x = self.cohort.groups[(j as usize + q) % bs].len() as u32;
            if *x > 0 {
                self.run_phases_used.push(q as u32);
            }
        }
        let slots = &self.slots;
        let max_k = self.cohort.min_left(|slot, join| {
            slots
                .get(slot as usize)
                .and_then(Option::as_ref)
                .is_some_and(|a| a.join == join)
        });
        let b = self.cohort.len() as u64;
        self.plan_decode_steps(&per_phase, max_k, b, now, limit, dt, ends);
        self.run_phase = per_phase;
    }

    /// The members' part of finishing `k` steps of a run (the first at
    /// report step `base_step`): a hash commit for each block filled, the
    /// blocks of the next step when the run goes on (`continues`) or has
    /// more steps, a span of `k` tokens per member, and the members that
    /// completed, settled and out of the cohort, appended to `done` in
    /// running order.
    pub(super) fn finish_cohort_steps(
        &mut self,
        k: u32,
        report: &mut StepReport,
        base_step: u32,
        continues: bool,
        done: &mut Vec<u32>,
    ) {
        let bs = u64::from(self.kv.block_size());
        let j = self.cohort.j;
        for i in 1..=u64::from(k) {
            let p = ((j + i) % bs) as usize;
            let mut group = std::mem::take(&mut self.cohort.groups[p]);
            for e in &group {
                if e.forget {
                    // (Deferred: derived when it leaves, `write_back`.)
                    continue;
                }
                let c = e.c0 + (j + i - e.j0) as u32;
                let filled = self.kv.full_blocks(c);
                self.commit_hashes_upto(e.slot, filled);
            }
            if i < u64::from(k) || continues {
                // (Blocks for step i + 1 are taken when step i ends.)
                if self.kv.tiered() && !group.is_empty() {
                    self.kv
                        .set_clock(report.step_ends[(base_step + i as u32 - 1) as usize]);
                }
                self.take_group_blocks(&mut group);
            }
            self.cohort.groups[p] = group;
        }
        if self.cohort.compact.is_none() {
            let super::cohort::Cohort {
                members, records, ..
            } = &mut self.cohort;
            for &s in members.iter() {
                let m = &mut records[s as usize];
                let span = TokenSpan {
                    id: m.id,
                    tag: m.tag,
                    first_index: m.g0 + (j - m.j0) as u32 + 1,
                    first_step: base_step,
                    join: m.join,
                    count: k,
                    target: m.target,
                    previous_us: m.last_us,
                };
                m.last_us = Some(report.token_time(&span, k - 1));
                report.spans.push(span);
            }
        }
        self.counters.generation_tokens += u64::from(k) * self.cohort.len() as u64;
        self.cohort.j = j + u64::from(k);
        let now_j = self.cohort.j;
        // Completions: members whose output is done, in running order.
        let first = done.len();
        while let Some(&Reverse((at, join, slot))) = self.cohort.completions.peek() {
            if at > now_j {
                break;
            }
            self.cohort.completions.pop();
            if self.is_member(slot, join) {
                debug_assert_eq!(at, now_j, "a member completed inside a run");
                done.push(slot);
            }
        }
        if self.cohort.compact.is_some() {
            self.cohort.last_end_us = report.step_ends[(base_step + k - 1) as usize];
            let at = report.spans.len() as u32;
            report.cohort.push((
                at,
                CohortNote::Steps {
                    first_step: base_step,
                    count: k,
                    completing: (done.len() - first) as u32,
                },
            ));
        }
        if done.len() > first {
            done[first..].sort_by_key(|&s| self.act(s).join);
            for &slot in &done[first..] {
                self.leave_cohort(slot);
            }
        }
        self.drain_cohort_log(report);
    }

    /// Compact form: moves the notes made since the last report into
    /// `report`, at its current position.
    pub(super) fn drain_cohort_log(&mut self, report: &mut StepReport) {
        if self.cohort.log.is_empty() {
            return;
        }
        let at = report.spans.len() as u32;
        report
            .cohort
            .extend(self.cohort.log.drain(..).map(|note| (at, note)));
    }

    /// Gives member `slot` a new KV block (free blocks were counted for it
    /// when its step was planned).
    fn take_new_block(&mut self, slot: u32) {
        let a = self.slots[slot as usize].as_mut().expect("live slot");
        let ok = self.kv.allocate_one(&mut a.blocks);
        debug_assert!(ok, "the free blocks were counted");
    }

    /// Removes member `slot` from the cohort, its progress written back.
    fn leave_cohort(&mut self, slot: u32) {
        let Some(pos) = self.cohort.members.iter().position(|&s| s == slot) else {
            return;
        };
        self.cohort.members.remove(pos);
        let m = *self.cohort.record(slot);
        self.settle(&m);
        if self.cohort.compact.is_some() {
            self.cohort.log.push(CohortNote::Leave { tag: m.tag });
        }
        // Its group: the phase its KV has now (settled), from this step.
        let bs = u64::from(self.kv.block_size());
        let c = self.act(slot).num_computed;
        let p = ((self.cohort.j + u64::from(self.kv.phase(c))) % bs) as usize;
        let g = &mut self.cohort.groups[p];
        let i = g
            .iter()
            .position(|e| e.slot == slot)
            .expect("a member is in its phase group");
        let e = g.remove(i);
        self.cohort.ctx_base -= i64::from(e.c0) - e.j0 as i64;
        if e.forget {
            self.cohort.virtual_members -= 1;
            self.write_back(&e);
        }
    }

    /// A new block for each member of a phase group, in its order: those
    /// that will forget them counted without ids (one
    /// [`crate::engine::kv_cache::KvCache::take_virtual`] for them all:
    /// the same blocks leave the free queue, with the same evictions and
    /// offloads, as one at a time), the others handed out.
    fn take_group_blocks(&mut self, group: &mut [GroupEntry]) {
        let mut counted = 0;
        for e in group.iter_mut() {
            if e.forget {
                e.virt += 1;
                counted += 1;
            } else {
                self.take_new_block(e.slot);
            }
        }
        if counted > 0 {
            self.kv.take_virtual(counted);
        }
    }

    /// Writes a `forget` member's blocks without ids and its deferred
    /// commits back to its request (settled: its KV tokens are current):
    /// what committing each filled block and taking each block one at a
    /// time would have left.
    fn write_back(&mut self, e: &GroupEntry) {
        if !e.forget {
            return;
        }
        let a = self.slots[e.slot as usize].as_mut().expect("live slot");
        a.virt += e.virt;
        let upto = self.kv.full_blocks(a.num_computed).min(a.table_len());
        if upto > a.hashed {
            a.private_pending = a.private_pending.min(a.hashed);
            a.hashed = upto;
        }
    }
}
