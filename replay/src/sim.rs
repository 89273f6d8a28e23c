//! The discrete-event replay of a request stream on one instance.
//!
//! Events are keyed `(time_us, class, seq)`: at equal times arrivals come
//! first, then entries into the wait queue, then client cancellations, then
//! the instance's step, then metric samples; equal keys pop in insertion
//! order (`seq`). The clock never decreases.
//!
//! A request arrives at its entry time (the trace's send time relative to
//! the run start when known, else its intended arrival), enters the wait
//! queue after the latency model's queueing delay, and leaves when it
//! completes, is dropped (unservable), or is cancelled by its client (a
//! recorded client timeout, or its deadline). A later round of a session
//! whose send time is unknown arrives its think time after the previous
//! round's response, no earlier than planned.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use blis_traces::content;
use blis_traces::{SharedStr, Status, TraceRecord};
use rustc_hash::FxHashMap;

use crate::instance::{
    DropReason, Finished, Instance, SimRequest, Snapshot, StepReport, TokenSpan,
};
use crate::latency::LatencyModel;
use crate::scheduler::slo_priority;

/// Receives the replay's results.
pub trait Sink {
    /// Whether [`Sink::tokens`] should be called.
    fn wants_tokens(&self) -> bool {
        false
    }
    /// Tokens of one request; `times[m]` is the client-visible time of
    /// output token `first_index + m`, µs since the run start. `tag` is a
    /// small integer identifying the request while it is in flight (reused
    /// afterwards), for sinks that keep per-request state in a vector.
    fn tokens(&mut self, _tag: u32, _rec: &TraceRecord, _first_index: u32, _times: &[i64]) {}
    /// A request completed.
    fn finished(&mut self, done: Done<'_>);
    /// A request was dropped (never served) or skipped (a failed request of
    /// the input trace, which the server did not process).
    fn not_served(&mut self, rec: TraceRecord, entry_us: i64, why: NotServed);
    /// A metrics sample of the instance at `t_us` since the run start.
    fn sample(&mut self, _t_us: i64, _snap: &Snapshot) {}
}

/// A request that left the instance with a response (complete, or cut
/// short by its client).
#[derive(Debug)]
pub struct Done<'a> {
    /// The input record.
    pub rec: TraceRecord,
    /// When it was sent, µs since the run start.
    pub entry_us: i64,
    /// The instance's account of it.
    pub fin: &'a Finished,
    /// `Ok` when complete, `Timeout` when its client cancelled it.
    pub status: Status,
}

/// Why a request got no response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotServed {
    /// The instance could never serve it.
    Dropped(DropReason),
    /// The input trace records it as failed before reaching the server.
    InputError,
    /// Its client cancelled it before it was scheduled.
    CancelledWaiting,
    /// The replay stopped (horizon) before it completed.
    Unfinished,
}

/// Options of a replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimOptions {
    /// Sample the instance every this many µs (`None`: no samples).
    pub sample_interval_us: Option<i64>,
    /// Stop at this time (µs since the run start); requests still in the
    /// system are reported unfinished.
    pub horizon_us: Option<i64>,
}

impl Default for SimOptions {
    fn default() -> Self {
        Self {
            sample_interval_us: Some(100_000),
            horizon_us: None,
        }
    }
}

/// A request of the input stream with its entry time.
#[derive(Debug, Clone, PartialEq)]
pub struct Input {
    /// Entry time, µs since the run start.
    pub entry_us: i64,
    /// The record.
    pub rec: TraceRecord,
    /// The client cancels it at this time (µs since the run start).
    pub cancel_at_us: Option<i64>,
    /// A later session round whose send waits for the previous round.
    pub closed_loop: bool,
}

impl Input {
    /// The input for `rec` of a trace whose run started at `run_start`:
    /// entry at the recorded send time when there is one, else at the
    /// intended arrival; a recorded client timeout or a deadline becomes a
    /// cancellation.
    pub fn from_record(rec: TraceRecord, run_start_us: i64) -> Self {
        let arrival = rec.request.arrival_time_us;
        let entry = rec
            .outcome
            .send_time_us
            .map_or(arrival, |s| s - run_start_us);
        let cancel = if rec.outcome.status == Some(Status::Timeout) {
            rec.outcome
                .last_chunk_time_us
                .zip(rec.outcome.send_time_us)
                .map(|(l, s)| entry + (l - s))
        } else {
            None
        }
        .or_else(|| rec.request.deadline_us.map(|d| entry + (d - arrival)));
        let closed_loop = rec.request.round_index > 0
            && rec.request.think_time_us.is_some()
            && rec.outcome.send_time_us.is_none()
            && !rec.request.session_id.is_empty();
        Self {
            entry_us: entry,
            rec,
            cancel_at_us: cancel,
            closed_loop,
        }
    }
}

const ARRIVAL: u8 = 0;
const ENQUEUE: u8 = 1;
const CANCEL: u8 = 2;

#[derive(Debug)]
struct Flight {
    rec: TraceRecord,
    /// Tags are reused: events for a tag carry the generation they were
    /// meant for.
    generation: u32,
    entry_us: i64,
    last_token_us: Option<i64>,
    cancelled: bool,
    enqueued: bool,
}

/// Replays `inputs` (sorted by `entry_us`) on `instance`, reporting to
/// `sink`. Returns the final snapshot.
pub fn replay<I, S>(instance: &mut Instance, inputs: I, opts: &SimOptions, sink: &mut S) -> Snapshot
where
    I: IntoIterator<Item = Input>,
    S: Sink,
{
    let mut d = Driver {
        inst: instance,
        events: BinaryHeap::new(),
        seq: 0,
        flights: Vec::new(),
        free: Vec::new(),
        deferred: Vec::new(),
        waiting_rounds: FxHashMap::default(),
        done_rounds: FxHashMap::default(),
        report: StepReport::default(),
        times: Vec::new(),
        next_generation: 0,
        cancels: FxHashMap::default(),
    };
    let mut inputs = inputs.into_iter().peekable();
    let mut next_sample = opts.sample_interval_us.map(|_| 0i64);
    let horizon = opts.horizon_us.unwrap_or(i64::MAX);
    let mut last_t = i64::MIN;
    loop {
        let t_input = inputs.peek().map(|i| i.entry_us);
        let t_event = d.events.peek().map(|Reverse((t, c, _, _))| (*t, *c));
        let t_step = d.inst.next_time();
        let busy = t_input.is_some() || t_event.is_some() || t_step.is_some();
        let t_sample = next_sample.filter(|_| busy);
        // (time, class): input arrivals share class ARRIVAL with deferred
        // ones and come first among them.
        let mut best: Option<(i64, u8, u8)> = None;
        let mut consider = |t: Option<i64>, class: u8, src: u8| {
            if let Some(t) = t
                && best.is_none_or(|b| (t, class, src) < b)
            {
                best = Some((t, class, src));
            }
        };
        consider(t_input, ARRIVAL, 0);
        if let Some((t, c)) = t_event {
            consider(Some(t), c, 1);
        }
        consider(t_step, 3, 2);
        consider(t_sample, 4, 3);
        let Some((now, _, src)) = best else { break };
        if now > horizon {
            break;
        }
        debug_assert!(
            now >= last_t,
            "clock went back: {now} < {last_t} (source {src}, input {t_input:?}, event {t_event:?}, step {t_step:?})"
        );
        last_t = now;
        match src {
            0 => {
                let input = inputs.next().expect("peeked");
                d.arrive(now, input, sink);
            }
            1 => {
                let Reverse((_, class, seq, tag)) = d.events.pop().expect("peeked");
                match class {
                    ARRIVAL => d.deferred_arrival(now, tag, sink),
                    ENQUEUE => d.enqueue(now, tag, sink),
                    _ => {
                        let (tag, generation) = d.cancels.remove(&seq).unwrap_or((tag, u32::MAX));
                        d.cancel(now, tag, generation, sink);
                    }
                }
            }
            2 => {
                let limit = [
                    inputs.peek().map(|i| i.entry_us),
                    d.events.peek().map(|Reverse((t, ..))| *t),
                    next_sample,
                    opts.horizon_us,
                ]
                .into_iter()
                .flatten()
                .min()
                .map_or(i64::MAX, |t| t - 1);
                d.step(now, limit, sink);
            }
            _ => {
                sink.sample(now, &d.inst.snapshot());
                next_sample = Some(now + opts.sample_interval_us.unwrap_or(i64::MAX / 4));
            }
        }
    }
    // Whatever is left at the horizon did not finish.
    for f in d.flights.into_iter().flatten() {
        sink.not_served(f.rec, f.entry_us, NotServed::Unfinished);
    }
    for input in inputs {
        sink.not_served(input.rec, input.entry_us, NotServed::Unfinished);
    }
    for (_, inputs) in d.waiting_rounds {
        sink.not_served(inputs.rec, inputs.entry_us, NotServed::Unfinished);
    }
    for input in d.deferred.into_iter().flatten() {
        sink.not_served(input.rec, input.entry_us, NotServed::Unfinished);
    }
    d.inst.snapshot()
}

type SessionKey = (SharedStr, u32);

struct Driver<'a> {
    inst: &'a mut Instance,
    events: BinaryHeap<Reverse<(i64, u8, u64, u32)>>,
    seq: u64,
    flights: Vec<Option<Flight>>,
    free: Vec<u32>,
    deferred: Vec<Option<Input>>,
    waiting_rounds: FxHashMap<SessionKey, Input>,
    done_rounds: FxHashMap<SessionKey, i64>,
    report: StepReport,
    times: Vec<i64>,
    next_generation: u32,
    cancels: FxHashMap<u64, (u32, u32)>,
}

impl Driver<'_> {
    fn push(&mut self, t: i64, class: u8, tag: u32) {
        self.events.push(Reverse((t, class, self.seq, tag)));
        self.seq += 1;
    }

    fn arrive<S: Sink>(&mut self, now: i64, input: Input, sink: &mut S) {
        if input.closed_loop {
            let r = &input.rec.request;
            let prev = (r.session_id.clone(), r.round_index - 1);
            if let Some(done) = self.done_rounds.remove(&prev) {
                let think = r.think_time_us.unwrap_or(0);
                let at = now.max(done + think);
                if at > now {
                    self.defer(at, input);
                    return;
                }
            } else {
                self.waiting_rounds.insert(prev, input);
                return;
            }
        }
        self.admit(now, input, sink);
    }

    fn defer(&mut self, at: i64, mut input: Input) {
        input.entry_us = at;
        input.closed_loop = false;
        let idx = self.deferred.len() as u32;
        self.deferred.push(Some(input));
        self.push(at, ARRIVAL, idx);
    }

    fn deferred_arrival<S: Sink>(&mut self, now: i64, idx: u32, sink: &mut S) {
        if let Some(input) = self.deferred[idx as usize].take() {
            self.admit(now, input, sink);
        }
        if self.deferred.iter().all(Option::is_none) {
            self.deferred.clear();
        }
    }

    /// A round of a session ended at `t` (response, drop or cancel): release
    /// the next round if it is waiting for it.
    fn round_done(&mut self, rec: &TraceRecord, t: i64) {
        let r = &rec.request;
        if r.session_id.is_empty() {
            return;
        }
        let key = (r.session_id.clone(), r.round_index);
        if let Some(next) = self.waiting_rounds.remove(&key) {
            let think = next.rec.request.think_time_us.unwrap_or(0);
            let at = next.entry_us.max(t + think);
            self.defer(at, next);
        } else {
            self.done_rounds.insert(key, t);
        }
    }

    fn admit<S: Sink>(&mut self, now: i64, input: Input, sink: &mut S) {
        if matches!(input.rec.outcome.status, Some(Status::Error)) {
            sink.not_served(input.rec, input.entry_us, NotServed::InputError);
            return;
        }
        let delay = self
            .inst
            .latency()
            .queueing_delay_us(input.rec.effective_input_tokens())
            .round() as i64;
        let generation = self.next_generation;
        self.next_generation = self.next_generation.wrapping_add(1);
        let flight = Flight {
            rec: input.rec,
            generation,
            entry_us: now,
            last_token_us: None,
            cancelled: false,
            enqueued: false,
        };
        let tag = match self.free.pop() {
            Some(t) => {
                self.flights[t as usize] = Some(flight);
                t
            }
            None => {
                self.flights.push(Some(flight));
                (self.flights.len() - 1) as u32
            }
        };
        self.push(now + delay, ENQUEUE, tag);
        if let Some(c) = input.cancel_at_us {
            self.cancels.insert(self.seq, (tag, generation));
            self.push(c.max(now), CANCEL, tag);
        }
    }

    fn take_flight(&mut self, tag: u32) -> Flight {
        let f = self.flights[tag as usize].take().expect("live flight");
        self.free.push(tag);
        f
    }

    fn enqueue<S: Sink>(&mut self, now: i64, tag: u32, sink: &mut S) {
        let f = self.flights[tag as usize].as_mut().expect("live flight");
        if f.cancelled {
            let f = self.take_flight(tag);
            self.round_done(&f.rec, now);
            sink.not_served(f.rec, f.entry_us, NotServed::CancelledWaiting);
            return;
        }
        f.enqueued = true;
        let r = &f.rec.request;
        let input = f.rec.effective_input_tokens().max(1);
        let output = r.output_tokens.max(1);
        let mut segments = Vec::with_capacity(3);
        content::sequence_segments(r, input, output, &mut segments);
        let req = SimRequest {
            id: r.request_id,
            input_tokens: input,
            output_tokens: output,
            priority: slo_priority(&r.slo_class),
            segments,
            tag,
        };
        if let Err(why) = self.inst.enqueue(now, req) {
            let f = self.take_flight(tag);
            self.round_done(&f.rec, now);
            sink.not_served(f.rec, f.entry_us, NotServed::Dropped(why));
        }
    }

    fn cancel<S: Sink>(&mut self, now: i64, tag: u32, generation: u32, sink: &mut S) {
        let Some(f) = self.flights[tag as usize].as_mut() else {
            return; // finished before its cancellation time
        };
        if f.generation != generation {
            return; // the tag now belongs to another request
        }
        if !f.enqueued {
            f.cancelled = true;
            return;
        }
        let id = f.rec.request.request_id;
        let Some((generated, first)) = self.inst.abort(id) else {
            return;
        };
        let f = self.take_flight(tag);
        self.round_done(&f.rec, now);
        if generated == 0 {
            sink.not_served(f.rec, f.entry_us, NotServed::CancelledWaiting);
            return;
        }
        let fin = Finished {
            id,
            tag,
            first_token_us: first.unwrap_or(now),
            last_token_us: f.last_token_us.unwrap_or(now),
            scheduled_us: f.entry_us,
            output_tokens: generated,
            cached_tokens: 0,
            preemptions: 0,
            capped: false,
        };
        sink.finished(Done {
            rec: f.rec,
            entry_us: f.entry_us,
            fin: &fin,
            status: Status::Timeout,
        });
    }

    fn step<S: Sink>(&mut self, now: i64, limit: i64, sink: &mut S) {
        let mut report = std::mem::take(&mut self.report);
        self.inst.step(now, limit.max(now), &mut report);
        let wants = sink.wants_tokens();
        for span in &report.spans {
            let span: TokenSpan = *span;
            let Some(f) = self.flights[span.tag as usize].as_mut() else {
                continue;
            };
            let last = report.token_time(&span, span.count - 1);
            f.last_token_us = Some(last);
            if wants {
                self.times.clear();
                self.times
                    .extend((0..span.count).map(|m| report.token_time(&span, m)));
                sink.tokens(span.tag, &f.rec, span.first_index, &self.times);
            }
        }
        for fin in &report.finished {
            let f = self.take_flight(fin.tag);
            self.round_done(&f.rec, fin.last_token_us);
            sink.finished(Done {
                rec: f.rec,
                entry_us: f.entry_us,
                fin,
                status: Status::Ok,
            });
        }
        self.report = report;
    }
}
