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

use crate::cluster::Control;
use crate::engine::instance::{
    CohortNote, DropReason, Finished, Instance, SimRequest, Snapshot, SpanTimes, StepReport,
};
use crate::engine::queue_order::slo_priority;
use crate::latency::LatencyModel;

/// Receives the replay's results.
pub trait Sink {
    /// Whether [`Sink::tokens`] should be called.
    fn wants_tokens(&self) -> bool {
        false
    }
    /// Steps of instance `instance` whose tokens follow (in
    /// [`Sink::tokens`] calls), before those calls: the instance's index of
    /// the first and the end times, µs since the run start.
    fn steps(&mut self, _instance: u32, _first_step: u64, _ends: &[i64]) {}
    /// Tokens of one request (its id and tag in `times.span()`), produced in consecutive steps from
    /// `times.span().first_step` (an index into the last [`Sink::steps`]);
    /// `times.get(m)` is the client-visible time of output token
    /// `times.span().first_index + m`, µs since the run start. The span's
    /// `tag` is a small integer identifying the request while it is in
    /// flight (reused afterwards), for sinks that keep per-request state in
    /// a vector.
    ///
    /// `rec` is the request's record when [`Sink::wants_token_records`]
    /// (else `None`: the driver does not look it up); `streaming` whether
    /// the request streams (known either way).
    fn tokens(&mut self, _rec: Option<&TraceRecord>, _streaming: bool, _times: SpanTimes<'_>) {}
    /// Whether [`Sink::tokens`] needs the request's record (the span gives
    /// its id, tag and times).
    fn wants_token_records(&self) -> bool {
        true
    }
    /// A request completed.
    fn finished(&mut self, done: Done<'_>);
    /// A request was dropped (never served) or skipped (a failed request of
    /// the input trace, which the server did not process).
    fn not_served(&mut self, rec: TraceRecord, entry_us: i64, why: NotServed);
    /// A metrics sample of the instance at `t_us` since the run start.
    fn sample(&mut self, _t_us: i64, _snap: &Snapshot) {}
    /// P/D: a metrics sample of one pool (`prefill` or `decode`) at
    /// `t_us`, after the whole cluster's [`Sink::sample`].
    fn sample_pool(&mut self, _t_us: i64, _pool: &'static str, _snap: &Snapshot) {}
    /// Autoscaling: the replicas ready, starting and draining at `t_us`,
    /// after [`Sink::sample`].
    fn sample_replicas(&mut self, _t_us: i64, _replicas: (u32, u32, u32)) {}
    /// The SLO requests are judged against, if any (an autoscaler's
    /// observable).
    fn slo(&self) -> Option<blis_traces::slo::Slo> {
        None
    }
    /// Whether [`Sink::upcoming`] should be called.
    fn wants_upcoming(&self) -> bool {
        false
    }
    /// The tokens of the batch instance `instance` just formed, known
    /// before its step ends: `(request id, 1-based output index,
    /// client-visible µs)` in step and running order (see
    /// [`Instance::upcoming_tokens`]). A real-time owner hands them to
    /// their clients ahead of time.
    fn upcoming(&mut self, _instance: u32, _tokens: &[(u64, u32, i64)]) {}
    /// Whether the sink takes each step report's tokens whole
    /// ([`Sink::take_report`]) instead of through [`Sink::steps`] and
    /// [`Sink::tokens`]; only for a sink that wants no records with them.
    fn takes_reports(&self) -> bool {
        false
    }
    /// The tokens of one step report of `instance`, when
    /// [`Sink::takes_reports`]: what [`Sink::steps`] and [`Sink::tokens`]
    /// would be given (`streaming` is indexed by span tag), except that the
    /// sink may take `report.spans` (leaving any vector in its place). The
    /// report's other fields are the driver's.
    fn take_report(&mut self, _instance: u32, _report: &mut StepReport, _streaming: &[bool]) {}
    /// Whether the sink reads the steady decoders' tokens in compact form
    /// ([`Sink::cohort`]) from the reports it takes whole
    /// ([`Sink::takes_reports`]); the replay then gives its instances
    /// [`Instance::set_compact_cohort`].
    fn takes_cohort(&self) -> bool {
        false
    }
    /// A note of the steady decoders of `instance` (see [`CohortNote`]),
    /// given in report order between the [`Sink::tokens`] calls of the
    /// report (`report`: its step ends and timing; `report.spans` may be
    /// taken).
    fn cohort(&mut self, _instance: u32, _note: &CohortNote, _report: &StepReport) {}
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
    /// The replay was stopped early ([`stop_flag`], Ctrl-C) before it
    /// completed.
    Interrupted,
    /// The cluster's admission policy (named) rejected it.
    Rejected(&'static str),
    /// Its replica was scaled down with the `immediate` drain policy
    /// before its first token.
    ScaledDown,
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
    /// The record (boxed: an input moves through the driver's queues by
    /// pointer, not its 400 bytes).
    pub rec: Box<TraceRecord>,
    /// The client cancels it at this time (µs since the run start).
    pub cancel_at_us: Option<i64>,
    /// A later session round whose send waits for the previous round.
    pub closed_loop: bool,
    /// Its scheduling priority as given by its client (vLLM's `priority`,
    /// lower is more urgent; also its class), instead of the priority
    /// policy's for its SLO class.
    pub priority: Option<i32>,
    /// Its content (for prefix caching), instead of the one derived from
    /// its record.
    pub segments: Option<Vec<content::Segment>>,
}

impl Input {
    /// The input for `rec` of a trace whose run started at `run_start`:
    /// entry at the recorded send time when there is one, else at the
    /// intended arrival; the request's planned deadline (`deadline_us`)
    /// becomes its client's cancellation. What happened to the request in
    /// the recorded run (its status, when it ended) is never used: a
    /// prediction must not know it.
    pub fn from_record(rec: TraceRecord, run_start_us: i64) -> Self {
        let arrival = rec.request.arrival_time_us;
        let entry = Self::entry_of(&rec, run_start_us);
        let cancel = rec.request.deadline_us.map(|d| entry + (d - arrival));
        let closed_loop = rec.request.round_index > 0
            && rec.request.think_time_us.is_some()
            && rec.outcome.send_time_us.is_none()
            && !rec.request.session_id.is_empty();
        Self {
            entry_us: entry,
            rec: Box::new(rec),
            cancel_at_us: cancel,
            closed_loop,
            priority: None,
            segments: None,
        }
    }

    /// The entry time of `rec` of a trace whose run started at
    /// `run_start_us`: its recorded send time relative to the run start,
    /// else its intended arrival, µs.
    pub fn entry_of(rec: &TraceRecord, run_start_us: i64) -> i64 {
        rec.outcome
            .send_time_us
            .map_or(rec.request.arrival_time_us, |s| s - run_start_us)
    }

    /// With a client that gives up `timeout_us` after sending (a request
    /// with an earlier planned deadline keeps it).
    pub fn with_client_timeout(mut self, timeout_us: Option<i64>) -> Self {
        if let Some(t) = timeout_us {
            // (Saturating: a timeout of 1e300 s is no timeout, not an
            // overflow to a deadline before the send.)
            let at = self.entry_us.saturating_add(t);
            self.cancel_at_us = Some(self.cancel_at_us.map_or(at, |c| c.min(at)));
        }
        self
    }
}

const ARRIVAL: u8 = 0;
const ENQUEUE: u8 = 1;
/// A P/D transfer ends (before steps at the same time: the request can
/// join the batch formed then).
const TRANSFER: u8 = 2;
const CANCEL: u8 = 3;

mod autoscale;
mod id_set;
mod pd;
mod step_clock;

use step_clock::StepClock;

#[derive(Debug)]
struct Flight {
    rec: Box<TraceRecord>,
    /// The instance it was routed to.
    inst: u32,
    /// Tags are reused: events for a tag carry the generation they were
    /// meant for.
    generation: u32,
    entry_us: i64,
    cancelled: bool,
    enqueued: bool,
    /// The prompt's block hashes, when routing computed them.
    hashes: Vec<u64>,
    /// [`Input::priority`].
    priority: Option<i32>,
    /// [`Input::segments`].
    segments: Option<Vec<content::Segment>>,
    /// P/D: its hand-off from a prefill to a decode instance, once its
    /// prefill is done.
    handoff: Option<pd::Handoff>,
    /// The event of its client's cancellation, if it has one.
    cancel_seq: Option<u64>,
}

/// Replays `inputs` (sorted by `entry_us`) on `instance`, reporting to
/// `sink`. Returns the final snapshot.
pub fn replay<I, S>(instance: &mut Instance, inputs: I, opts: &SimOptions, sink: &mut S) -> Snapshot
where
    I: IntoIterator<Item = Input>,
    S: Sink,
{
    replay_once(instance, inputs, false, opts, sink)
}

/// [`replay`] on an instance that serves this replay only, whose inputs'
/// request ids are all different when `ids_unique`: it then forgets
/// private content ([`Control::set_ids_unique`]; the same outputs, faster).
pub fn replay_once<I, S>(
    instance: &mut Instance,
    inputs: I,
    ids_unique: bool,
    opts: &SimOptions,
    sink: &mut S,
) -> Snapshot
where
    I: IntoIterator<Item = Input>,
    S: Sink,
{
    let mut control = Control::single();
    control.set_ids_unique(ids_unique);
    replay_cluster(
        std::slice::from_mut(instance),
        &mut control,
        inputs,
        opts,
        sink,
    );
    instance.snapshot()
}

/// The instances' snapshots added up (one cluster-wide view).
pub fn merged(snaps: &[Snapshot]) -> Snapshot {
    let mut m = Snapshot::default();
    for s in snaps {
        m.waiting += s.waiting;
        m.running += s.running;
        m.kv_used += s.kv_used;
        m.kv_total += s.kv_total;
        m.kv_cpu_used += s.kv_cpu_used;
        m.kv_cpu_total += s.kv_cpu_total;
        m.counters += s.counters;
    }
    m
}

/// Replays `inputs` (sorted by `entry_us`) on a cluster of `instances`
/// sharing one clock: each request is admitted and routed by `control` on
/// arrival, then follows the single-instance lifecycle on its instance.
/// At equal times cluster events (refreshes of the routing signals,
/// arrivals, entries, cancellations) come before instance steps, and
/// instances step in index order. Metric samples are of the whole cluster
/// ([`merged`]). With one instance and [`Control::single`] this is
/// [`replay`]. It is a [`Session`] advanced to the end.
pub fn replay_cluster<I, S>(
    instances: &mut [Instance],
    control: &mut Control,
    inputs: I,
    opts: &SimOptions,
    sink: &mut S,
) where
    I: IntoIterator<Item = Input>,
    S: Sink,
{
    let mut inputs = inputs.into_iter().peekable();
    if let Some(a) = control.autoscale.as_deref_mut() {
        a.slo = sink.slo();
    }
    // The steady decoders' tokens in compact form for a sink that reads
    // them, or takes no tokens (its reports are dropped).
    let compact = !sink.wants_tokens() || (sink.takes_reports() && sink.takes_cohort());
    for inst in instances.iter_mut() {
        inst.set_compact_cohort(compact);
    }
    let mut session = Session::new(instances, control, opts);
    session.advance(i64::MAX, &mut inputs, sink);
    session.finish(inputs, sink);
}

/// Where a [`Session`] takes its inputs from, in entry order.
pub trait InputSource {
    /// The entry time of the next input.
    fn peek_entry(&mut self) -> Option<i64>;
    /// The next input.
    fn next_input(&mut self) -> Option<Input>;
}

impl<I: Iterator<Item = Input>> InputSource for std::iter::Peekable<I> {
    fn peek_entry(&mut self) -> Option<i64> {
        self.peek().map(|i| i.entry_us)
    }
    fn next_input(&mut self) -> Option<Input> {
        self.next()
    }
}

/// No inputs but those [`Session::submit`] hands over (a real-time owner).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoInputs;

impl InputSource for NoInputs {
    fn peek_entry(&mut self) -> Option<i64> {
        None
    }
    fn next_input(&mut self) -> Option<Input> {
        None
    }
}

/// What a session does next ([`Session::advance`]).
#[derive(Debug, Clone, Copy)]
struct Next {
    /// When, µs.
    at: i64,
    source: Source,
    /// The instance whose step it is ([`Source::Step`]).
    instance: usize,
}

/// Where the next event comes from; the order breaks ties at equal times
/// and classes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Source {
    Scale,
    Refresh,
    Input,
    Event,
    Step,
    Sample,
}

/// The simulator's one stepping API: a cluster on one clock, advanced to a
/// time. [`replay_cluster`] advances it to the end of its inputs; a
/// real-time owner (`blis-mockserver`) advances it to the wall clock's
/// time, [`Session::submit`]s requests as they arrive and
/// [`Session::abort`]s those whose client went away. Both run this code, so
/// they cannot drift apart.
pub struct Session<'a> {
    d: Driver<'a>,
    opts: SimOptions,
    refresh: Option<i64>,
    next_sample: Option<i64>,
    next_refresh: Option<i64>,
    last_t: i64,
    /// Past the horizon: nothing more happens.
    ended: bool,
    /// Ended by the stop flag ([`stop_flag`]), not the horizon.
    stopped: bool,
    /// When a request last left (completed, dropped, cancelled), µs.
    last_exit: i64,
    /// Periodic events (samples, refreshes, autoscaler evaluations) in a
    /// row with nothing in the system.
    idle_periods: u32,
    /// Samples and refreshes in a row with nothing to step
    /// ([`IDLE_PERIODS`]).
    frozen_periods: u32,
    /// Samples taken, and the factor of the sample interval
    /// ([`SAMPLES_PER_INTERVAL`]).
    samples: u64,
    sample_scale: i64,
}

/// The process-wide request to stop every replay at its next event
/// ([`stop_flag`]).
static STOP: std::sync::LazyLock<std::sync::Arc<std::sync::atomic::AtomicBool>> =
    std::sync::LazyLock::new(Default::default);

/// The flag that, once set, stops every replay of this process at its next
/// event, as a horizon reached then would: the requests in the system and
/// those not yet sent are reported unfinished, and the outputs are written
/// as usual. A command line's Ctrl-C sets it (`blis-replay run`, through
/// `signal_hook::flag::register`); a library caller that wants to cut one
/// replay of several sets its horizon instead. Nothing clears it but its
/// owner.
pub fn stop_flag() -> std::sync::Arc<std::sync::atomic::AtomicBool> {
    std::sync::Arc::clone(&STOP)
}

/// Idle periodic events kept before a quiet stretch is skipped: after this
/// many in a row with nothing in the system, samples, routing refreshes and
/// autoscaler evaluations resume on their grid just before the next input
/// (so that an input hours or years away costs no work; a refresh or an
/// evaluation of an idle cluster changes nothing, and a metrics series keeps
/// its first 1,000 idle samples of each quiet stretch). The same for
/// samples and refreshes while requests are in the system but no instance
/// has a step to take (a P/D transfer, a session's think time, a client's
/// cancellation to come): they resume just before the next event, the
/// state they read being the same until then.
pub const IDLE_PERIODS: u32 = 1000;

/// Samples of the time series taken at one interval before the interval
/// grows tenfold (at the default 100 ms: 2.8 hours of simulated time, then
/// one a second for the next 27.8 hours, one every 10 s for 11.6 days, and
/// so on), with a warning each time: a run that simulates months (a CPU
/// table's steps of hours, a latency model far from any deployment) writes
/// a series that grows with the log of its length, about 100 MB a tenfold,
/// where it wrote a gigabyte a simulated day.
pub const SAMPLES_PER_INTERVAL: u64 = 100_000;

/// `next`, moved on by whole `interval`s to the last grid time no later
/// than `until`.
fn skip_grid(next: i64, interval: i64, until: i64) -> i64 {
    if until > next && interval > 0 {
        next + (until - next) / interval * interval
    } else {
        next
    }
}

impl std::fmt::Debug for Session<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("last_t", &self.last_t)
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

impl<'a> Session<'a> {
    /// A session at time 0 over `instances` behind `control`.
    pub fn new(instances: &'a mut [Instance], control: &'a mut Control, opts: &SimOptions) -> Self {
        assert!(!instances.is_empty(), "a cluster needs an instance");
        let refresh = control.refresh_interval_us();
        let flow = control.flow;
        // Blocks private to their request stay out of the hash indexes
        // while request ids are unique (see `Instance::set_private_blocks`):
        // ids are checked from here on, so only on instances and a router
        // that hold nothing from before (a replay before may have used the
        // same ids).
        let private = control.private_blocks_allowed()
            && control.is_pristine()
            && instances.iter().all(Instance::is_pristine);
        control.set_private_blocks(private);
        let forget = private && control.ids_unique();
        for inst in instances.iter_mut() {
            inst.set_private_blocks(private);
            inst.set_forget_private(forget);
        }
        let d = Driver {
            clock: StepClock::new(instances.len()),
            insts: instances,
            control,
            events: BinaryHeap::new(),
            seq: 0,
            flights: Vec::new(),
            free: Vec::new(),
            deferred: Vec::new(),
            waiting_rounds: FxHashMap::default(),
            done_rounds: FxHashMap::default(),
            report: Some(Box::default()),
            upcoming: Vec::new(),
            next_generation: 0,
            cancels: FxHashMap::default(),
            stale_events: 0,
            snaps: Vec::new(),
            flow,
            gateway: BinaryHeap::new(),
            gateway_items: Vec::new(),
            ids: private.then(id_set::IdSet::default),
            by_id: FxHashMap::default(),
            transfers: FxHashMap::default(),
            transfer_queues: Vec::new(),
            stepping: (i64::MIN, 0),
            exits: 0,
            streaming: Vec::new(),
        };
        Self {
            d,
            opts: *opts,
            refresh,
            next_sample: opts.sample_interval_us.map(|_| 0i64),
            next_refresh: refresh.map(|_| 0i64),
            last_t: i64::MIN,
            ended: false,
            stopped: false,
            last_exit: 0,
            idle_periods: 0,
            frozen_periods: 0,
            samples: 0,
            sample_scale: 1,
        }
    }

    /// Indexes every block by its content hash, private ones included (a
    /// session that runs for ever, whose request ids it cannot keep to
    /// check they are unique).
    pub fn without_private_blocks(mut self) -> Self {
        self.d.share_private_blocks();
        self
    }

    /// The instances.
    pub fn instances(&self) -> &[Instance] {
        self.d.insts
    }

    /// The time of the session's next event (an entry, a cancellation, a
    /// step; not counting inputs not yet handed over), µs.
    pub fn next_time(&self) -> Option<i64> {
        let t_event = self.d.events.peek().map(|Reverse((t, ..))| *t);
        let t_step = self.d.insts.iter().filter_map(Instance::next_time).min();
        let t_scale = self.d.control.autoscale.as_ref().map(|a| a.next_time());
        [t_event, t_step, t_scale].into_iter().flatten().min()
    }

    /// Processes every event up to `until` (inclusive), taking inputs from
    /// `inputs` at their entry times, in the order of [`replay_cluster`].
    /// Returns `false` once past the horizon.
    pub fn advance<S: Sink>(
        &mut self,
        until: i64,
        inputs: &mut impl InputSource,
        sink: &mut S,
    ) -> bool {
        let horizon = self.opts.horizon_us.unwrap_or(i64::MAX);
        let stop = &**STOP;
        while !self.ended {
            if stop.load(std::sync::atomic::Ordering::Relaxed) {
                self.ended = true;
                self.stopped = true;
                break;
            }
            let Some(next) = self.next_event(inputs) else {
                break;
            };
            if next.at > until {
                break;
            }
            if next.at > horizon {
                self.ended = true;
                break;
            }
            debug_assert!(
                next.at >= self.last_t,
                "clock went back: {} < {} ({next:?})",
                next.at,
                self.last_t
            );
            self.last_t = next.at;
            self.handle(next, inputs, sink);
        }
        !self.ended
    }

    /// The next thing to happen: the earliest of a refresh of the routing
    /// signals, an input's arrival, a queued event, an instance's step and
    /// a metrics sample, in that order at equal times (a refresh at T
    /// before arrivals at T; input arrivals share class `ARRIVAL` with
    /// deferred ones and come first among them). `None` when nothing is
    /// left (samples and refreshes only continue while something is).
    #[inline]
    fn next_event(&mut self, inputs: &mut impl InputSource) -> Option<Next> {
        self.d.update_clock();
        let d = &self.d;
        let t_input = inputs.peek_entry();
        let t_event = d.events.peek().map(|Reverse((t, c, _, _))| (*t, *c));
        // The earliest instance step; the lowest index on ties.
        let step_at = d.clock.earliest();
        let t_step = step_at.map(|(t, _)| t);
        let busy = t_input.is_some() || d.events.len() > d.stale_events || t_step.is_some();
        let t_sample = self.next_sample.filter(|_| busy);
        let t_refresh = self.next_refresh.filter(|_| busy);
        let t_scale = d
            .control
            .autoscale
            .as_ref()
            .map(|a| a.next_time())
            .filter(|_| busy);
        let mut best: Option<(i64, u8, Source)> = None;
        let mut consider = |t: Option<i64>, class: u8, src: Source| {
            if let Some(t) = t
                && best.is_none_or(|b| (t, class, src) < b)
            {
                best = Some((t, class, src));
            }
        };
        consider(t_scale, ARRIVAL, Source::Scale);
        consider(t_refresh, ARRIVAL, Source::Refresh);
        consider(t_input, ARRIVAL, Source::Input);
        if let Some((t, c)) = t_event {
            consider(Some(t), c, Source::Event);
        }
        consider(t_step, 3, Source::Step);
        consider(t_sample, 4, Source::Sample);
        best.map(|(at, _, source)| Next {
            at,
            source,
            instance: step_at.map_or(0, |(_, i)| i),
        })
    }

    /// Processes `next`.
    #[inline]
    fn handle<S: Sink>(&mut self, next: Next, inputs: &mut impl InputSource, sink: &mut S) {
        let exits = self.d.exits;
        self.handle_event(next, inputs, sink);
        if self.d.exits != exits {
            self.last_exit = next.at;
        }
    }

    #[inline]
    fn handle_event<S: Sink>(&mut self, next: Next, inputs: &mut impl InputSource, sink: &mut S) {
        // A periodic event: after IDLE_PERIODS of them in a row with
        // nothing in the system, the next comes just before the next input.
        let mut skip_to = None;
        if matches!(
            next.source,
            Source::Sample | Source::Refresh | Source::Scale
        ) {
            if self.d.idle() {
                self.idle_periods = self.idle_periods.saturating_add(1);
            } else {
                self.idle_periods = 0;
            }
            if self.idle_periods >= IDLE_PERIODS {
                skip_to = inputs.peek_entry();
            } else if !matches!(next.source, Source::Scale) {
                // (An autoscaler's evaluation may act on requests in the
                // system: it keeps its grid.)
                if self.d.frozen() {
                    self.frozen_periods = self.frozen_periods.saturating_add(1);
                } else {
                    self.frozen_periods = 0;
                }
                if self.frozen_periods >= IDLE_PERIODS {
                    let event = self.d.events.peek().map(|Reverse((t, ..))| *t);
                    skip_to = match (inputs.peek_entry(), event) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                }
            }
        }
        let (now, d) = (next.at, &mut self.d);
        match next.source {
            Source::Scale => {
                d.autoscale_at(now, sink);
                if let (Some(t), Some(a)) = (skip_to, d.control.autoscale.as_deref_mut()) {
                    a.skip_idle_until(t);
                }
            }
            Source::Refresh => {
                let pool = d.control.pool(d.insts.len());
                d.control.refresh(now, &d.insts[pool]);
                let iv = self.refresh.unwrap_or(i64::MAX / 4);
                self.next_refresh = Some(skip_to.map_or(now + iv, |t| skip_grid(now + iv, iv, t)));
            }
            Source::Input => {
                let input = inputs.next_input().expect("peeked");
                d.arrive(now, input, sink);
            }
            Source::Event => {
                let Reverse((_, class, seq, tag)) = d.events.pop().expect("peeked");
                match class {
                    ARRIVAL => d.deferred_arrival(now, tag, sink),
                    ENQUEUE => d.enqueue(now, tag, sink),
                    TRANSFER => d.transfer_done(now, seq, sink),
                    _ => match d.cancels.remove(&seq) {
                        Some((tag, generation)) => d.cancel(now, tag, generation, sink),
                        // Its request ended before.
                        None => d.stale_events -= 1,
                    },
                }
            }
            Source::Step => {
                // A run of identical decode steps may extend past
                // arrivals, entries, samples and refreshes: an entry or
                // a cancellation splits it at its time
                // ([`Instance::split_at`]); samples and routing read
                // the state a run has reached ([`Instance::snapshot_at`]).
                let limit = self.opts.horizon_us.map_or(i64::MAX, |t| t - 1);
                d.stepping = (now, next.instance);
                d.step(now, limit, next.instance, sink);
            }
            Source::Sample => {
                // (A tiered instance's run is brought to the sample's
                // time, as `snapshot_at(now + 1)` would read it.)
                for i in 0..d.insts.len() {
                    if d.insts[i].sample_splits_run(now + 1) {
                        d.sync(i, now + 1, sink);
                    }
                }
                d.snaps.clear();
                // After the steps that end at `now`; of the replicas
                // serving, when autoscaled.
                let scaled = d.control.autoscale.as_deref();
                d.snaps.extend(
                    d.insts
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| scaled.is_none_or(|a| a.serving(*i)))
                        .map(|(_, inst)| inst.snapshot_at(now + 1)),
                );
                sink.sample(now, &merged(&d.snaps));
                if let Some(a) = scaled {
                    sink.sample_replicas(now, a.replicas());
                }
                if let Some(pd) = &d.control.pd {
                    let (p, dec) = d.snaps.split_at(pd.first_decode());
                    sink.sample_pool(now, "prefill", &merged(p));
                    sink.sample_pool(now, "decode", &merged(dec));
                }
                self.samples += 1;
                let grows = self.samples.is_multiple_of(SAMPLES_PER_INTERVAL);
                if grows {
                    self.sample_scale = self.sample_scale.saturating_mul(10);
                }
                let iv = self.opts.sample_interval_us.map_or(i64::MAX / 4, |iv| {
                    iv.saturating_mul(self.sample_scale).min(i64::MAX / 4)
                });
                if grows {
                    blis_traces::diag!(
                        "warning: {} samples of the time series: from {:.1} s of simulated time on, one every {} ms",
                        self.samples,
                        now as f64 / 1e6,
                        iv / 1000
                    );
                }
                self.next_sample = Some(skip_to.map_or(now + iv, |t| skip_grid(now + iv, iv, t)));
            }
        }
        if self
            .d
            .control
            .autoscale
            .as_ref()
            .is_some_and(|a| a.drain_pending)
        {
            self.d.release_drained(now);
        }
    }

    /// Hands over a request that arrived at `now` (a real-time owner's
    /// arrival; no earlier than the last event processed), after
    /// [`Session::advance`] to `now`. Its id must be new.
    pub fn submit<S: Sink>(&mut self, now: i64, mut input: Input, sink: &mut S) {
        let now = now.max(self.last_t);
        self.last_t = now;
        input.entry_us = input.entry_us.min(now);
        let id = input.rec.request.request_id;
        let tag = self.d.arrive(now, input, sink);
        if let Some((tag, generation)) = tag
            && self.d.flights[tag as usize].is_some()
        {
            self.d.by_id.insert(id, (tag, generation));
        }
    }

    /// Cancels request `id` at `now` (its client went away), as a client
    /// timeout does: it leaves the queue or the batch and frees its blocks.
    pub fn abort<S: Sink>(&mut self, now: i64, id: u64, sink: &mut S) {
        let Some((tag, generation)) = self.d.by_id.remove(&id) else {
            return;
        };
        let now = now.max(self.last_t);
        self.last_t = now;
        self.d.cancel(now, tag, generation, sink);
    }

    /// Ends the session: whatever has not finished (in flight, waiting for
    /// a previous round, not yet arrived) is reported unfinished.
    pub fn finish<S: Sink>(self, mut inputs: impl InputSource, sink: &mut S) {
        let mut d = self.d;
        if let Some(a) = d.control.autoscale.as_deref_mut() {
            // Billed to the last request's exit; to the horizon when some
            // are still in the system there.
            let busy = d.flights.iter().any(Option::is_some);
            a.finish(if busy { self.last_t } else { self.last_exit }.max(0));
        }
        if d.ids.take().is_some() {
            d.control.pause_private_blocks();
            d.clock.touch_all();
            for inst in d.insts.iter_mut() {
                inst.pause_private_blocks();
            }
        }
        // Whatever is left at the horizon (or the stop) did not finish.
        let why = if self.stopped {
            NotServed::Interrupted
        } else {
            NotServed::Unfinished
        };
        for f in d.flights.into_iter().flatten() {
            sink.not_served(*f.rec, f.entry_us, why.clone());
        }
        while let Some(input) = inputs.next_input() {
            sink.not_served(*input.rec, input.entry_us, why.clone());
        }
        for (_, inputs) in d.waiting_rounds {
            sink.not_served(*inputs.rec, inputs.entry_us, why.clone());
        }
        for input in d.deferred.into_iter().flatten() {
            sink.not_served(*input.rec, input.entry_us, why.clone());
        }
        for input in d.gateway_items.into_iter().flatten() {
            sink.not_served(*input.rec, input.entry_us, why.clone());
        }
    }
}

type SessionKey = (SharedStr, u32);

/// The account of request `id` (tag `tag`, sent at `entry_us`) cut short at
/// `now` after the tokens `aborted` reports (a client timeout, an
/// `immediate` drain).
fn cut_short(
    id: u64,
    tag: u32,
    aborted: &crate::engine::instance::Aborted,
    entry_us: i64,
    now: i64,
) -> Finished {
    Finished {
        id,
        tag,
        first_token_us: aborted.first_token_us.unwrap_or(now),
        last_token_us: aborted.last_token_us.unwrap_or(now),
        scheduled_us: entry_us,
        output_tokens: aborted.generated,
        cached_tokens: 0,
        preemptions: 0,
        capped: false,
    }
}

struct Driver<'a> {
    /// The instances; changed only through [`Driver::inst_mut`] (or with
    /// [`StepClock::touch_all`]), so that the step clock sees every change.
    insts: &'a mut [Instance],
    clock: StepClock,
    control: &'a mut Control,
    snaps: Vec<Snapshot>,
    /// Flow control's saturation thresholds (queue depth, KV usage).
    flow: Option<(f64, f64)>,
    /// The gateway queue: (priority, arrival order, index into items).
    gateway: BinaryHeap<Reverse<(i64, u64, usize)>>,
    gateway_items: Vec<Option<Input>>,
    events: BinaryHeap<Reverse<(i64, u8, u64, u32)>>,
    seq: u64,
    flights: Vec<Option<Flight>>,
    free: Vec<u32>,
    deferred: Vec<Option<Input>>,
    waiting_rounds: FxHashMap<SessionKey, Input>,
    done_rounds: FxHashMap<SessionKey, i64>,
    /// The step reports' buffers, reused (boxed: taken out and put back
    /// around every step, which then moves a pointer; `None` while taken).
    report: Option<Box<StepReport>>,
    /// Scratch for [`Sink::upcoming`].
    upcoming: Vec<(u64, u32, i64)>,
    next_generation: u32,
    cancels: FxHashMap<u64, (u32, u32)>,
    /// Queued events that will do nothing (the cancellations of requests
    /// that ended): they keep no periodic event going.
    stale_events: usize,
    /// The request ids admitted so far, while blocks private to their
    /// request stay out of the hash indexes (which needs unique ids).
    ids: Option<id_set::IdSet>,
    /// Request id to tag and generation of the requests handed over by
    /// [`Session::submit`] and still in flight (for [`Session::abort`]).
    by_id: FxHashMap<u64, (u32, u32)>,
    /// P/D: transfers in flight by event sequence number (tag,
    /// generation), and each decode instance's requests waiting for room.
    transfers: FxHashMap<u64, (u32, u32)>,
    transfer_queues: Vec<std::collections::VecDeque<u32>>,
    /// Requests that have left (counted for the session's `last_exit`).
    exits: u64,
    /// Whether the flight of each tag streams (read per token span, kept
    /// apart from the flights so that the read stays in cache).
    streaming: Vec<bool>,
    /// The step being handled (its end time and instance): an event it
    /// causes at that time comes after the steps of lower-index instances
    /// ending then, as in single-step order.
    stepping: (i64, usize),
}

impl Driver<'_> {
    fn push(&mut self, t: i64, class: u8, tag: u32) {
        self.events.push(Reverse((t, class, self.seq, tag)));
        self.seq += 1;
    }

    /// A request arrives at `now`; its tag and generation when it started
    /// at once (not deferred, queued at the gateway or rejected).
    fn arrive<S: Sink>(&mut self, now: i64, input: Input, sink: &mut S) -> Option<(u32, u32)> {
        if input.closed_loop {
            let r = &input.rec.request;
            let prev = (r.session_id.clone(), r.round_index - 1);
            if let Some(done) = self.done_rounds.remove(&prev) {
                let think = r.think_time_us.unwrap_or(0);
                let at = now.max(done + think);
                if at > now {
                    self.defer(at, input);
                    return None;
                }
            } else {
                self.waiting_rounds.insert(prev, input);
                return None;
            }
        }
        self.admit(now, input, sink)
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
            let _ = self.admit(now, input, sink);
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

    /// Indexes every private block and stops keeping them out: from here
    /// on the caches are as if private blocks had never been kept out.
    fn share_private_blocks(&mut self) {
        if self.ids.take().is_some() {
            self.control.set_private_blocks(false);
            self.clock.touch_all();
            for inst in self.insts.iter_mut() {
                inst.set_private_blocks(false);
            }
        }
    }

    fn admit<S: Sink>(&mut self, now: i64, input: Input, sink: &mut S) -> Option<(u32, u32)> {
        if let Some(ids) = &mut self.ids
            && !ids.insert(input.rec.request.request_id)
        {
            // A repeated id: its "private" content is another request's.
            self.share_private_blocks();
        }
        if let Some(a) = self.control.autoscale.as_deref_mut() {
            a.arrived();
        }
        if !self.control.admit(now, &input.rec, self.insts) {
            let why = NotServed::Rejected(self.control.admission.policy().name());
            self.round_done(&input.rec, now);
            sink.not_served(*input.rec, input.entry_us, why);
            return None;
        }
        if self.flow.is_some() {
            let prio = self.control.priority_of(&input.rec, input.entry_us);
            let idx = self.gateway_items.len();
            let mut input = input;
            input.entry_us = now;
            self.gateway_items.push(Some(input));
            self.gateway.push(Reverse((prio, self.seq, idx)));
            self.seq += 1;
            self.dispatch(now, sink);
            return None;
        }
        let inst = self.route(now, &input.rec, sink);
        Some(self.start(now, now, inst, input))
    }

    /// Flow control: routes gateway requests, most urgent first, while the
    /// cluster has room.
    fn dispatch<S: Sink>(&mut self, now: i64, sink: &mut S) {
        let Some((q, kv)) = self.flow else { return };
        self.settle(now, sink);
        while let Some(&Reverse((_, _, idx))) = self.gateway.peek() {
            let pool = self.control.pool(self.insts.len());
            if self.control.saturation(now, &self.insts[pool], q, kv) >= 1.0 {
                break;
            }
            self.gateway.pop();
            let input = self.gateway_items[idx].take().expect("queued input");
            let inst = self.route(now, &input.rec, sink);

            let entry = input.entry_us;
            let _ = self.start(now, entry, inst, input);
        }
        if self.gateway.is_empty() {
            self.gateway_items.clear();
        }
    }

    /// During the step of instance `k` ending at `now`: the lower-index
    /// instances whose fast-forwarded run has a step ending now are split
    /// after it, so that what reads them sees them as single steps would
    /// have left them (their step at `now` came first).
    fn settle<S: Sink>(&mut self, now: i64, sink: &mut S) {
        if self.stepping.0 != now {
            return;
        }
        for j in 0..self.stepping.1 {
            if self.insts[j].has_step_ending_at(now) {
                self.sync(j, now, sink);
            }
        }
    }

    /// Routes `rec` at `now`. A router that reads the instances' KV-cache
    /// indexes sees them up to date: runs in flight are split at `now`.
    fn route<S: Sink>(&mut self, now: i64, rec: &TraceRecord, sink: &mut S) -> usize {
        self.settle(now, sink);
        let pool = self.control.pool(self.insts.len());
        if self.control.reads_kv_index() {
            for i in pool.clone() {
                self.sync(i, now, sink);
            }
        }
        self.control.route(now, rec, &self.insts[pool])
    }

    /// Starts the flight of `input`, routed to `inst` at `now` (it arrived
    /// at `entry`).
    fn start(&mut self, now: i64, entry: i64, inst: usize, input: Input) -> (u32, u32) {
        let delay = self.insts[inst]
            .latency()
            .queueing_delay_us(input.rec.effective_input_tokens())
            .round() as i64
            + self.control.pipeline_latency_us;
        let generation = self.next_generation;
        self.next_generation = self.next_generation.wrapping_add(1);
        let flight = Flight {
            rec: input.rec,
            inst: inst as u32,
            generation,
            entry_us: entry,
            cancelled: false,
            enqueued: false,
            hashes: self.control.take_hashes(),
            priority: input.priority,
            segments: input.segments,
            handoff: None,
            cancel_seq: None,
        };
        let streaming = flight.rec.request.streaming;
        let tag = match self.free.pop() {
            Some(t) => {
                self.flights[t as usize] = Some(flight);
                self.streaming[t as usize] = streaming;
                t
            }
            None => {
                self.flights.push(Some(flight));
                self.streaming.push(streaming);
                (self.flights.len() - 1) as u32
            }
        };
        self.push(now + delay, ENQUEUE, tag);
        if let Some(c) = input.cancel_at_us {
            self.cancels.insert(self.seq, (tag, generation));
            if let Some(f) = self.flights[tag as usize].as_mut() {
                f.cancel_seq = Some(self.seq);
            }
            self.push(c.max(now), CANCEL, tag);
        }
        (tag, generation)
    }

    /// Nothing in the system: no instance has a step to take, no event
    /// that does something is queued, no request waits at the gateway.
    /// Whether nothing changes before the next event or input: no
    /// instance has a step to take and no request waits at the gateway
    /// (requests may be in the system, waiting on events).
    fn frozen(&self) -> bool {
        self.gateway.is_empty()
            && if self.clock.is_current() {
                self.clock.earliest().is_none()
            } else {
                self.insts.iter().all(|i| i.next_time().is_none())
            }
    }

    fn idle(&self) -> bool {
        self.events.len() == self.stale_events && self.frozen()
    }

    /// Instance `i`, to change: its next step time is read again before
    /// the next event is chosen ([`StepClock`]).
    fn inst_mut(&mut self, i: usize) -> &mut Instance {
        self.clock.touch(i);
        &mut self.insts[i]
    }

    /// Brings the step clock up to date with the instances changed since.
    fn update_clock(&mut self) {
        let insts = &*self.insts;
        self.clock.update(|i| insts[i].next_time());
    }

    /// Ends a request's flight: its tag is free, its instance has one
    /// request fewer in flight.
    fn take_flight(&mut self, tag: u32) -> Flight {
        let f = self.flights[tag as usize].take().expect("live flight");
        self.free.push(tag);
        self.exits += 1;
        // Its cancellation, still queued, is now a no-op.
        if let Some(seq) = f.cancel_seq
            && self.cancels.remove(&seq).is_some()
        {
            self.stale_events += 1;
        }
        if !self.by_id.is_empty() {
            self.by_id.remove(&f.rec.request.request_id);
        }
        let tenant = f.rec.request.tenant_id.as_ref();
        match (&mut self.control.pd, &f.handoff) {
            (Some(pd), Some(_)) => {
                // Handed off: the prefill pool let it go then.
                let d = f.inst as usize - pd.first_decode();
                pd.decode.left(d, tenant);
                self.control.admission.left(tenant);
            }
            _ => self.control.left(f.inst as usize, tenant),
        }
        if self.control.autoscale.is_some() {
            self.mark_drain_check(f.inst as usize);
        }
        f
    }

    fn enqueue<S: Sink>(&mut self, now: i64, tag: u32, sink: &mut S) {
        let f = self.flights[tag as usize].as_mut().expect("live flight");
        if f.cancelled {
            let f = self.take_flight(tag);
            self.round_done(&f.rec, now);
            sink.not_served(*f.rec, f.entry_us, NotServed::CancelledWaiting);
            self.room_freed(now, sink);
            return;
        }
        let inst = f.inst as usize;
        if !self.accepts(inst) {
            self.refused(now, tag, sink);
            return;
        }
        let f = self.flights[tag as usize].as_mut().expect("live flight");
        f.enqueued = true;
        let prefill_only = self.control.pd.is_some() && f.rec.request.output_tokens.max(1) > 1;
        // A prefill instance's request keeps its content for the decode
        // instance, which rebuilds it from the same segments.
        let mut req = self.sim_request(tag, prefill_only);
        self.sync(inst, now, sink);
        if self.control.scheduling.is_some() {
            // The key sees the instance as the request enters it.
            let seen = self.insts[inst].signals_at(now);
            let rec = &self.flights[tag as usize]
                .as_ref()
                .expect("live flight")
                .rec;
            req.priority = self.control.queue_key(rec, req.priority, &seen);
        }
        let entered = if prefill_only {
            self.inst_mut(inst).enqueue_prefill(now, req)
        } else {
            self.inst_mut(inst).enqueue(now, req)
        };
        if let Err(why) = entered {
            let f = self.take_flight(tag);
            self.round_done(&f.rec, now);
            sink.not_served(*f.rec, f.entry_us, NotServed::Dropped(why));
            self.room_freed(now, sink);
        }
    }

    /// Flight `tag` as the engine's request: its lengths (at least one
    /// token each), its priority and class (the input's own, else the
    /// control plane's priority and its SLO class's), the prompt's block
    /// hashes routing computed (taken from the flight), and its content
    /// segments: the flight's (copied when `keep_segments`, else taken),
    /// or made from its record (and, when `keep_segments`, kept in the
    /// flight).
    #[inline]
    pub(super) fn sim_request(&mut self, tag: u32, keep_segments: bool) -> SimRequest {
        let f = self.flights[tag as usize].as_mut().expect("live flight");
        let r = &f.rec.request;
        let input = f.rec.effective_input_tokens().max(1);
        let output = r.output_tokens.max(1);
        let segments = match &mut f.segments {
            Some(s) if keep_segments => s.clone(),
            kept => kept.take().unwrap_or_else(|| {
                let mut segments = self.insts[f.inst as usize].spare_segments();
                content::sequence_segments(r, input, output, &mut segments);
                if keep_segments {
                    *kept = Some(segments.clone());
                }
                segments
            }),
        };
        let (priority, class) = match f.priority {
            Some(p) => (i64::from(p), p.clamp(0, 7) as u8),
            None => (
                self.control.priority_of(&f.rec, f.entry_us),
                slo_priority(&r.slo_class),
            ),
        };
        SimRequest {
            id: r.request_id,
            input_tokens: input,
            output_tokens: output,
            priority,
            class,
            block_hashes: std::mem::take(&mut f.hashes),
            segments,
            tag,
        }
    }

    /// A request left outside a step (cancelled, dropped): flow control
    /// routes what now fits, as it would at the next step's end (which a
    /// fast-forwarded run may not have for a while).
    pub(super) fn room_freed<S: Sink>(&mut self, now: i64, sink: &mut S) {
        if !self.gateway.is_empty() {
            self.dispatch(now, sink);
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
        if f.handoff.as_ref().is_some_and(|h| !h.admitted) {
            self.cancel_handoff(now, tag, sink);
            return;
        }
        let id = f.rec.request.request_id;
        let inst = f.inst as usize;
        self.sync(inst, now, sink);
        let Some(aborted) = self.inst_mut(inst).abort(tag) else {
            return;
        };
        let generated = aborted.generated;
        let f = self.take_flight(tag);
        self.round_done(&f.rec, now);
        if generated == 0 {
            sink.not_served(*f.rec, f.entry_us, NotServed::CancelledWaiting);
            self.room_freed(now, sink);
            return;
        }
        let fin = cut_short(id, tag, &aborted, f.entry_us, now);
        sink.finished(Done {
            rec: *f.rec,
            entry_us: f.entry_us,
            fin: &fin,
            status: Status::Timeout,
        });
        self.room_freed(now, sink);
    }

    /// Brings instance `inst` to time `now` before an event changes it:
    /// the steps of its run in flight that ended before `now` are finished
    /// and reported.
    fn sync<S: Sink>(&mut self, inst: usize, now: i64, sink: &mut S) {
        // (A fresh one when a step's delivery steps another instance, whose
        // report is then the one kept.)
        let mut report = self.report.take().unwrap_or_default();
        // A lower-index instance's step ending now came first: its next
        // step has started.
        let at = if self.stepping.0 == now && inst < self.stepping.1 {
            now + 1
        } else {
            now
        };
        if self.inst_mut(inst).split_at(at, &mut report) {
            self.deliver(inst, &mut report, sink);
        }
        self.report = Some(report);
    }

    fn step<S: Sink>(&mut self, now: i64, limit: i64, inst: usize, sink: &mut S) {
        // (A fresh one when a step's delivery steps another instance, whose
        // report is then the one kept.)
        let mut report = self.report.take().unwrap_or_default();
        self.inst_mut(inst).step(now, limit.max(now), &mut report);
        self.deliver(inst, &mut report, sink);
        self.report = Some(report);
        if self
            .transfer_queues
            .get(inst)
            .is_some_and(|q| !q.is_empty())
        {
            self.admit_waiting_transfers(now, inst, sink);
        }
        if sink.wants_upcoming() {
            let mut up = std::mem::take(&mut self.upcoming);
            up.clear();
            self.insts[inst].upcoming_tokens(&mut up);
            sink.upcoming(inst as u32, &up);
            self.upcoming = up;
        }
        if !self.gateway.is_empty() {
            self.dispatch(now, sink);
        }
    }

    /// Hands a step report's tokens and completions to `sink`.
    fn deliver<S: Sink>(&mut self, inst: usize, report: &mut StepReport, sink: &mut S) {
        let wants = sink.wants_tokens();
        if wants && sink.takes_reports() {
            sink.take_report(inst as u32, report, &self.streaming);
        } else if wants {
            if !report.step_ends.is_empty() {
                sink.steps(inst as u32, report.first_step, &report.step_ends);
            }
            let records = sink.wants_token_records();
            for span in &report.spans {
                let rec = if records {
                    let Some(f) = self.flights[span.tag as usize].as_ref() else {
                        continue;
                    };
                    Some(&*f.rec)
                } else {
                    debug_assert!(self.flights[span.tag as usize].is_some());
                    None
                };
                let streaming = self.streaming[span.tag as usize];
                sink.tokens(rec, streaming, report.span_times(span));
            }
        }
        for fin in &report.finished {
            if self.is_handoff(inst, fin) {
                let end = report
                    .step_ends
                    .last()
                    .copied()
                    .unwrap_or(fin.last_token_us);
                self.hand_off(end, inst, fin, sink);
                continue;
            }
            let f = self.take_flight(fin.tag);
            self.round_done(&f.rec, fin.last_token_us);
            if let Some(a) = self.control.autoscale.as_deref_mut() {
                a.completed_request(f.entry_us, f.rec.request.streaming, fin);
            }
            sink.finished(Done {
                rec: *f.rec,
                entry_us: f.entry_us,
                fin,
                status: Status::Ok,
            });
        }
    }
}
