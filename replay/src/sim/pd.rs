//! The driver's part of prefill/decode disaggregation
//! ([`crate::cluster::disaggregation`]): a request whose prefill instance
//! produced its first token is handed to a decode instance chosen by the
//! decode pool's router; its prompt's KV blocks arrive there after the
//! transfer time, and it joins that instance's batch when there is room.

use blis_traces::{Status, content};

use super::{Done, Driver, NotServed, Sink, TRANSFER};
use crate::engine::handoff::HandoffError;
use crate::engine::instance::Finished;

/// A request between its prefill and its decode instance.
#[derive(Debug, Clone)]
pub(super) struct Handoff {
    /// Its prefill instance, which holds its blocks until it is admitted.
    pub(super) prefill: u32,
    /// When its first token was visible, µs.
    pub(super) first_token_us: i64,
    /// Prompt tokens its prefill found in the prefix cache.
    pub(super) cached_tokens: u32,
    /// When its prefill step ended (the transfer started), µs.
    pub(super) started_us: i64,
    /// Whether its decode instance took it.
    pub(super) admitted: bool,
}

impl Driver<'_> {
    /// Whether `fin`, reported by instance `inst`, is a prefill to hand
    /// off (P/D, a prefill instance, more than one output token).
    pub(super) fn is_handoff(&self, inst: usize, fin: &Finished) -> bool {
        let Some(pd) = &self.control.pd else {
            return false;
        };
        inst < pd.first_decode()
            && self.flights[fin.tag as usize]
                .as_ref()
                .is_some_and(|f| f.rec.request.output_tokens > 1 && f.handoff.is_none())
    }

    /// The prefill of `fin` on instance `p` ended at `now`: the decode
    /// pool's router picks its decode instance, and its blocks start
    /// moving there.
    pub(super) fn hand_off<S: Sink>(&mut self, now: i64, p: usize, fin: &Finished, sink: &mut S) {
        let tag = fin.tag;
        self.settle(now, sink);
        let base = self.control.pd.as_ref().expect("P/D").first_decode();
        let reads = self
            .control
            .pd
            .as_ref()
            .is_some_and(|pd| pd.decode.reads_kv_index());
        if reads {
            for i in base..self.insts.len() {
                self.sync(i, now, sink);
            }
        }
        let f = self.flights[tag as usize].as_mut().expect("live flight");
        let input = f.rec.effective_input_tokens().max(1);
        let pd = self.control.pd.as_mut().expect("P/D");
        let d = base + pd.decode.route(now, &f.rec, &self.insts[base..]);
        let _ = pd.decode.take_hashes();
        // What moves: the prompt's blocks the decode instance does not
        // hold, as it is at `now` (a run in flight split there).
        self.sync(d, now, sink);
        let f = self.flights[tag as usize].as_mut().expect("live flight");
        let pd = self.control.pd.as_mut().expect("P/D");
        let kv = self.insts[d].kv();
        let full = kv.full_blocks(input) as usize;
        let mut hashes = std::mem::take(&mut f.hashes);
        if kv.prefix_caching() && hashes.len() < full {
            let segments = f.segments.as_deref().unwrap_or_default();
            content::block_hashes_of(segments, kv.block_size(), &mut hashes);
        }
        hashes.truncate(full);
        let blocks = kv.blocks_for(input) - kv.matched(&hashes) as u32;
        f.hashes = hashes;
        let t = pd.transfer_us(blocks);
        pd.counters.transfers += 1;
        pd.counters.transfer_us += t as u64;
        pd.counters.blocks += u64::from(blocks);
        self.control.handed_off(p);
        f.inst = d as u32;
        f.handoff = Some(Handoff {
            prefill: p as u32,
            first_token_us: fin.first_token_us,
            cached_tokens: fin.cached_tokens,
            started_us: now,
            admitted: false,
        });
        let generation = f.generation;
        self.transfers.insert(self.seq, (tag, generation));
        self.push(now + t, TRANSFER, tag);
    }

    /// The transfer of event `seq` ended at `now`: its request joins its
    /// decode instance, or waits there for room.
    pub(super) fn transfer_done<S: Sink>(&mut self, now: i64, seq: u64, sink: &mut S) {
        let Some((tag, generation)) = self.transfers.remove(&seq) else {
            return;
        };
        let live = self.flights[tag as usize]
            .as_ref()
            .is_some_and(|f| f.generation == generation);
        if !live {
            return; // cancelled during the transfer
        }
        let d = self.flights[tag as usize].as_ref().expect("live").inst as usize;
        self.sync(d, now, sink);
        if !self.try_admit_transferred(now, tag, sink) {
            let base = self.control.pd.as_ref().expect("P/D").first_decode();
            if self.transfer_queues.len() < self.insts.len() {
                self.transfer_queues
                    .resize_with(self.insts.len(), Default::default);
            }
            self.transfer_queues[d].push_back(tag);
            debug_assert!(d >= base);
            self.control
                .pd
                .as_mut()
                .expect("P/D")
                .counters
                .transfer_waits += 1;
        }
    }

    /// After a step of decode instance `d` at `now`: the requests waiting
    /// for room there join it in arrival order while there is room.
    pub(super) fn admit_waiting_transfers<S: Sink>(&mut self, now: i64, d: usize, sink: &mut S) {
        // The batch it just formed may be a run of several steps planned
        // on its free blocks: only its first stays.
        self.sync(d, now, sink);
        while let Some(&tag) = self.transfer_queues[d].front() {
            if !self.try_admit_transferred(now, tag, sink) {
                break;
            }
            self.transfer_queues[d].pop_front();
        }
    }

    /// Admits request `tag` to its decode instance at `now` (or drops it
    /// when that instance can never serve it); `false` when there is no
    /// room now.
    fn try_admit_transferred<S: Sink>(&mut self, now: i64, tag: u32, sink: &mut S) -> bool {
        // The decode side's copy of the request: its content as its
        // prefill saw it.
        let req = self.sim_request(tag, true);
        let f = self.flights[tag as usize].as_mut().expect("live flight");
        let d = f.inst as usize;
        let h = f.handoff.clone().expect("handed off");
        self.clock.touch(d);
        match self.insts[d].admit_transferred(now, req, h.first_token_us, h.cached_tokens) {
            Ok(()) => {
                if let Some(h) = &mut f.handoff {
                    h.admitted = true;
                }
                let released = self.inst_mut(h.prefill as usize).release_held(now, tag);
                debug_assert!(released, "the prefill instance held the blocks");
                let pd = self.control.pd.as_mut().expect("P/D");
                pd.counters.handoff_us += (now - h.started_us) as u64;
                if !self.gateway.is_empty() {
                    // The prefill side's freed blocks may end its saturation.
                    self.dispatch(now, sink);
                }
                true
            }
            Err(HandoffError::NoRoom) => false,
            Err(HandoffError::Dropped(why)) => {
                self.inst_mut(h.prefill as usize).release_held(now, tag);
                let f = self.take_flight(tag);
                self.round_done(&f.rec, now);
                sink.not_served(*f.rec, f.entry_us, NotServed::Dropped(why));
                if !self.gateway.is_empty() {
                    self.dispatch(now, sink);
                }
                true
            }
        }
    }

    /// Request `tag`'s client gave up at `now` while its blocks were
    /// moving or waiting for room: the prefill instance frees them, and
    /// the response ends at its first token.
    pub(super) fn cancel_handoff<S: Sink>(&mut self, now: i64, tag: u32, sink: &mut S) {
        let f = self.flights[tag as usize].as_ref().expect("live flight");
        let h = f.handoff.clone().expect("handed off");
        let (id, d) = (f.rec.request.request_id, f.inst as usize);
        self.inst_mut(h.prefill as usize).release_held(now, tag);
        if let Some(q) = self.transfer_queues.get_mut(d) {
            q.retain(|&t| t != tag);
        }
        let f = self.take_flight(tag);
        self.round_done(&f.rec, now);
        let fin = Finished {
            id,
            tag,
            first_token_us: h.first_token_us,
            last_token_us: h.first_token_us,
            scheduled_us: f.entry_us,
            output_tokens: 1,
            cached_tokens: h.cached_tokens,
            preemptions: 0,
            capped: false,
        };
        sink.finished(Done {
            rec: *f.rec,
            entry_us: f.entry_us,
            fin: &fin,
            status: Status::Timeout,
        });
        if !self.gateway.is_empty() {
            self.dispatch(now, sink);
        }
    }
}
