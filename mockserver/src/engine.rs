//! The replay engine driven by the wall clock.
//!
//! One OS thread owns a [`blis_replay::Instance`] inside the simulator's
//! [`Session`] (the stepping API `blis-replay` itself runs) and advances it
//! in simulated time, waiting for the wall clock (scaled by `time_scale`) to
//! reach each event before handling it. Requests arriving over HTTP are
//! stamped with the simulated time of their arrival. Because each event is
//! processed at its own simulated time (never at the later wall time the
//! thread woke up at), wake-up jitter delays deliveries slightly but never
//! accumulates: the timeline is exactly the one `blis-replay` computes for
//! the same arrivals.
//!
//! Token and completion events are also *delivered* by this thread (held in
//! a queue until then), so an HTTP handler forwards each one the moment it
//! arrives: tokio's timer, with its millisecond granularity, is never on a
//! token's path. A step's tokens are known when its batch is formed
//! ([`Instance::upcoming_tokens`]), a step's time before they become
//! visible, and getting one from this thread to the client's socket takes a
//! few hundred µs on a busy machine (a wake-up of this thread, one of an
//! HTTP worker, a write), so each first token is handed over that long
//! *before* its visible time, ahead of the step's burst of later ones (see
//! [`Handoff`]). The lead is a running median of that hand-off latency as
//! handlers measure it ([`EngineHandle::record_handoff`]); the client then
//! sees each first token at its simulated time, not a wake-up or a burst
//! later.
//!
//! A request's arrival is the instant its HTTP handler started (carried in
//! [`Submission::received`]), not the later instant this thread read it, so
//! the channel hop does not delay it either, unless a step ended between
//! the two and was already formed without it.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use blis_replay::cluster::Control;
use blis_replay::engine::instance::{Finished, Snapshot, SpanTimes};
use blis_replay::sim::{Done, Input, NoInputs, NotServed, Session, SimOptions, Sink};
use blis_replay::{Instance, LatencyModel};
use blis_traces::{Request, Status, TraceRecord};
use rustc_hash::FxHashMap;
use tokio::sync::mpsc::UnboundedSender;

use crate::metrics::Metrics;

/// Simulated time from the wall clock: µs since start × `scale`.
#[derive(Debug)]
pub struct Clock {
    start: Instant,
    scale: f64,
}

impl Clock {
    /// A clock starting now; `scale` > 1 runs faster than real time.
    pub fn new(scale: f64) -> Self {
        Self {
            start: Instant::now(),
            scale: if scale > 0.0 { scale } else { 1.0 },
        }
    }

    /// Simulated µs now.
    pub fn now(&self) -> i64 {
        (self.start.elapsed().as_secs_f64() * 1e6 * self.scale) as i64
    }

    /// Simulated µs at wall instant `at` (0 before the start).
    pub fn at(&self, at: Instant) -> i64 {
        (at.saturating_duration_since(self.start).as_secs_f64() * 1e6 * self.scale) as i64
    }

    /// The wall instant of simulated time `t_us`, at most a century after
    /// the start (a `--time-scale` of 1e-300 puts every token there rather
    /// than past what an `Instant` holds).
    pub fn wall(&self, t_us: i64) -> Instant {
        const CENTURY: Duration = Duration::from_secs(100 * 365 * 86_400);
        let secs = (t_us.max(0) as f64) / 1e6 / self.scale;
        self.start + Duration::try_from_secs_f64(secs).map_or(CENTURY, |d| d.min(CENTURY))
    }

    /// The time scale.
    pub fn scale(&self) -> f64 {
        self.scale
    }
}

/// What the engine tells a request's HTTP handler.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Output token `index` (1-based) becomes visible at simulated
    /// `visible_us`.
    Token {
        /// 1-based output index.
        index: u32,
        /// Client-visible simulated time.
        visible_us: i64,
        /// Simulated time it was due to be handed over to its handler.
        handoff_us: i64,
    },
    /// The request completed.
    Finished(Finished),
    /// The engine cannot serve it (message for a 400 response).
    Rejected(String),
}

/// A request for the engine.
#[derive(Debug)]
pub struct Submission {
    /// Prompt tokens.
    pub input_tokens: u32,
    /// Output tokens to generate.
    pub output_tokens: u32,
    /// Priority (lower is more urgent).
    pub priority: i32,
    /// Content, for prefix caching.
    pub segments: Vec<blis_traces::content::Segment>,
    /// Where its events go.
    pub events: UnboundedSender<Event>,
    /// When its HTTP handler started: its arrival.
    pub received: Instant,
}

enum Cmd {
    Submit(u64, Submission),
    Abort(u64),
}

/// A handle to the engine thread (cheap to clone).
#[derive(Debug, Clone)]
pub struct EngineHandle {
    tx: Sender<CmdBox>,
    next_id: Arc<AtomicU64>,
    clock: Arc<Clock>,
    snapshot: Arc<Mutex<Snapshot>>,
    handoff: Arc<Handoff>,
}

/// `Cmd` is private; this keeps the channel type nameable in the handle.
pub struct CmdBox(Cmd);

impl std::fmt::Debug for CmdBox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Cmd")
    }
}

impl EngineHandle {
    /// Starts the engine thread.
    pub fn start(instance: Instance, clock: Arc<Clock>, metrics: Arc<Metrics>) -> Self {
        let (tx, rx) = std::sync::mpsc::channel::<CmdBox>();
        let snapshot = Arc::new(Mutex::new(instance.snapshot()));
        let snap = snapshot.clone();
        let c = clock.clone();
        let handoff = Arc::new(Handoff::default());
        let h = handoff.clone();
        std::thread::Builder::new()
            .name("blis-engine".into())
            .spawn(move || {
                // Timer slack of 1 µs (default 50 µs): sleeps end on time.
                let _ = nix::sys::prctl::set_timerslack(1_000);
                run(instance, rx, c, snap, metrics, &h)
            })
            .expect("spawning the engine thread");
        Self {
            tx,
            next_id: Arc::new(AtomicU64::new(0)),
            clock,
            snapshot,
            handoff,
        }
    }

    /// Reports that a first token due to be handed over at simulated
    /// `handoff_us` is being written to its client now (see [`Handoff`]).
    pub fn record_handoff(&self, handoff_us: i64) {
        let late = (self.clock.now() - handoff_us).max(0) as f64 / self.clock.scale();
        self.handoff.record(late as u64);
    }

    /// The current hand-off lead, wall µs.
    pub fn handoff_lead_us(&self) -> u64 {
        self.handoff.lead_us()
    }

    /// Submits a request; returns its id.
    pub fn submit(&self, s: Submission) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let _ = self.tx.send(CmdBox(Cmd::Submit(id, s)));
        id
    }

    /// Cancels a request whose client went away.
    pub fn abort(&self, id: u64) {
        let _ = self.tx.send(CmdBox(Cmd::Abort(id)));
    }

    /// The engine's clock.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// The latest snapshot of the instance.
    pub fn snapshot(&self) -> Snapshot {
        *self.snapshot.lock().expect("snapshot lock")
    }
}

/// The measured hand-off latency of first tokens: from the time the engine
/// thread was due to hand one over to its HTTP handler writing it (so the
/// engine thread's own late wake-ups count), wall µs, as the median of the
/// latest [`Handoff::WINDOW`] samples (a median ignores the rare long stall
/// that would drag a mean). First tokens are handed over this long before
/// they become visible, so ahead of the step's burst of later tokens, and
/// TTFT is on time. Later tokens are handed over when they become visible:
/// every one is late by about the same wake-up, which leaves ITL unchanged
/// and keeps the lead's variation out of it.
#[derive(Debug, Default)]
pub struct Handoff {
    window: Mutex<std::collections::VecDeque<u32>>,
    median_us: AtomicU64,
}

impl Handoff {
    /// Samples in the running median.
    pub const WINDOW: usize = 63;
    /// Largest lead, µs: a slower hand-off is a stalled machine, not latency
    /// to hide.
    pub const MAX_US: u64 = 2_000;

    fn record(&self, latency_us: u64) {
        let x = latency_us.min(Self::MAX_US) as u32;
        let mut w = self
            .window
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if w.len() == Self::WINDOW {
            w.pop_front();
        }
        w.push_back(x);
        let mut v = [0u32; Self::WINDOW];
        let n = w.len();
        for (d, s) in v.iter_mut().zip(w.iter()) {
            *d = *s;
        }
        let (_, m, _) = v[..n].select_nth_unstable(n / 2);
        self.median_us.store(u64::from(*m), Ordering::Relaxed);
    }

    /// The current lead, wall µs.
    pub fn lead_us(&self) -> u64 {
        self.median_us.load(Ordering::Relaxed)
    }
}

/// Events held until they are handed over, in (hand-off time, first tokens
/// before other events, seq) order.
#[derive(Default)]
struct Outbox {
    heap: BinaryHeap<Reverse<(i64, u8, u64)>>,
    items: FxHashMap<u64, (UnboundedSender<Event>, Event)>,
    seq: u64,
}

impl Outbox {
    fn push(&mut self, at: i64, to: &UnboundedSender<Event>, ev: Event) {
        let k = self.seq;
        self.seq += 1;
        let class = u8::from(!matches!(ev, Event::Token { index: 1, .. }));
        self.heap.push(Reverse((at, class, k)));
        self.items.insert(k, (to.clone(), ev));
    }

    fn next_time(&self) -> Option<i64> {
        self.heap.peek().map(|Reverse((t, _, _))| *t)
    }

    /// Sends every event due by `now`.
    fn deliver(&mut self, now: i64) {
        while let Some(&Reverse((t, _, k))) = self.heap.peek() {
            if t > now {
                break;
            }
            self.heap.pop();
            if let Some((to, ev)) = self.items.remove(&k) {
                let _ = to.send(ev);
            }
        }
    }
}

/// How long before an event's time the engine thread stops sleeping and
/// polls: a sleeping thread wakes tens to hundreds of µs late, which would
/// show up in every TTFT.
const SPIN: Duration = Duration::from_micros(150);

/// A request in flight, as its HTTP handler and the metrics see it.
struct Flight {
    events: UnboundedSender<Event>,
    arrival: i64,
    enqueued: i64,
    last_token: Option<i64>,
    /// When its latest event is handed over (its events stay in order).
    last_handoff: i64,
}

/// What the simulator's session reports, turned into events for the HTTP
/// handlers (held in the outbox until their hand-off time) and metrics.
struct Handlers<'a> {
    flights: FxHashMap<u64, Flight>,
    outbox: Outbox,
    metrics: &'a Metrics,
    /// Simulated µs by which first tokens are handed over early.
    lead: i64,
}

impl Sink for Handlers<'_> {
    fn wants_tokens(&self) -> bool {
        true
    }

    fn wants_token_records(&self) -> bool {
        false
    }

    fn tokens(&mut self, _rec: Option<&TraceRecord>, _streaming: bool, times: SpanTimes<'_>) {
        // The tokens of a step that just ended were handed over when its
        // batch was formed ([`Sink::upcoming`]); here they feed the metrics.
        let Some(f) = self.flights.get_mut(&times.span().id) else {
            return;
        };
        for v in times.iter() {
            if let Some(p) = f.last_token {
                self.metrics.observe_itl(v - p);
            }
            f.last_token = Some(v);
        }
    }

    fn finished(&mut self, done: Done<'_>) {
        if done.status != Status::Ok {
            return; // aborted: its client is gone
        }
        let fin = done.fin;
        if let Some(f) = self.flights.remove(&fin.id) {
            self.metrics.finished(fin, f.arrival, f.enqueued);
            let at = f.last_handoff.max(fin.last_token_us);
            self.outbox.push(at, &f.events, Event::Finished(*fin));
        }
    }

    fn not_served(&mut self, rec: TraceRecord, _entry_us: i64, why: NotServed) {
        if let NotServed::Dropped(why) = why
            && let Some(f) = self.flights.remove(&rec.request.request_id)
        {
            let _ = f.events.send(Event::Rejected(why.to_string()));
        }
    }

    fn wants_upcoming(&self) -> bool {
        true
    }

    fn upcoming(&mut self, _instance: u32, tokens: &[(u64, u32, i64)]) {
        for &(id, index, v) in tokens {
            let Some(f) = self.flights.get_mut(&id) else {
                continue;
            };
            let early = if index == 1 { self.lead } else { 0 };
            f.last_handoff = f.last_handoff.max(v - early);
            let ev = Event::Token {
                index,
                visible_us: v,
                handoff_us: f.last_handoff,
            };
            self.outbox.push(f.last_handoff, &f.events, ev);
        }
    }
}

/// The engine thread: the simulator's [`Session`] advanced to the wall
/// clock's time (the same code `blis-replay` runs, so the mock cannot drift
/// from it), requests handed over as they arrive, and events handed to
/// their handlers on time. Its only loop is the wait for the next event or
/// command.
fn run(
    instance: Instance,
    rx: Receiver<CmdBox>,
    clock: Arc<Clock>,
    snapshot: Arc<Mutex<Snapshot>>,
    metrics: Arc<Metrics>,
    handoff: &Handoff,
) {
    // Simulated µs by which events are handed over early.
    let lead = || (handoff.lead_us() as f64 * clock.scale()) as i64;
    let mut instances = [instance];
    let mut control = Control::single();
    let opts = SimOptions {
        sample_interval_us: None,
        horizon_us: None,
    };
    let mut session = Session::new(&mut instances, &mut control, &opts).without_private_blocks();
    let mut h = Handlers {
        flights: FxHashMap::default(),
        outbox: Outbox::default(),
        metrics: &metrics,
        lead: lead(),
    };
    let mut last = 0i64;
    loop {
        // Everything due by now, in simulated-time order (entries before
        // the step at equal times).
        let now = clock.now().max(last);
        h.lead = lead();
        session.advance(now, &mut NoInputs, &mut h);
        last = now;
        h.outbox.deliver(clock.now());
        // After every step that ended by now, also inside a run.
        let snap = session.instances()[0].snapshot_at(now + 1);
        *snapshot.lock().expect("snapshot lock") = snap;
        metrics.set_snapshot(snap);
        let next = [session.next_time(), h.outbox.next_time()]
            .into_iter()
            .flatten()
            .min();
        let msg = match next_command(&rx, &clock, next) {
            Wait::Command(m) => m,
            Wait::Due => continue,
            Wait::Closed => return,
        };
        // Events due before the command arrived happen first; a request
        // arrives when its handler started (no earlier than what was
        // processed already, no later than now).
        let stamp = match &msg.0 {
            Cmd::Submit(_, s) => clock.at(s.received).min(clock.now()).max(last),
            Cmd::Abort(_) => clock.now().max(last),
        };
        // An arrival comes before a step ending at the same instant (as in
        // `blis-replay`): advance to just before it.
        let upto = match &msg.0 {
            Cmd::Submit(..) => (stamp - 1).max(last),
            Cmd::Abort(_) => stamp,
        };
        h.lead = lead();
        session.advance(upto, &mut NoInputs, &mut h);
        last = upto;
        h.outbox.deliver(clock.now());
        match msg.0 {
            Cmd::Submit(id, s) => submit(&mut session, &mut h, id, s, stamp),
            Cmd::Abort(id) => {
                if h.flights.remove(&id).is_some() {
                    session.abort(stamp, id, &mut h);
                    metrics.aborted();
                }
            }
        }
    }
}

/// What the engine thread's wait ended with.
enum Wait {
    /// A command arrived.
    Command(CmdBox),
    /// The next event is due.
    Due,
    /// Every handle is gone: the thread ends.
    Closed,
}

/// Waits for a command until the simulated time `next` (if any) is due on
/// the wall clock: asleep until shortly before, then polling, so that the
/// event happens on time rather than a scheduler wake-up late.
fn next_command(rx: &Receiver<CmdBox>, clock: &Clock, next: Option<i64>) -> Wait {
    let Some(t) = next else {
        return rx.recv().map_or(Wait::Closed, Wait::Command);
    };
    let due = clock.wall(t);
    let wait = due.saturating_duration_since(Instant::now());
    if wait > SPIN {
        return match rx.recv_timeout(wait - SPIN) {
            Ok(m) => Wait::Command(m),
            Err(RecvTimeoutError::Timeout) => Wait::Due,
            Err(RecvTimeoutError::Disconnected) => Wait::Closed,
        };
    }
    loop {
        match rx.try_recv() {
            Ok(m) => return Wait::Command(m),
            Err(TryRecvError::Empty) if Instant::now() < due => std::thread::yield_now(),
            Err(TryRecvError::Empty) => return Wait::Due,
            Err(TryRecvError::Disconnected) => return Wait::Closed,
        }
    }
}

/// Hands request `id` to the simulator, arriving at simulated `stamp`.
fn submit(session: &mut Session<'_>, h: &mut Handlers<'_>, id: u64, s: Submission, stamp: i64) {
    let delay = session.instances()[0]
        .latency()
        .queueing_delay_us(s.input_tokens)
        .round() as i64;
    h.flights.insert(
        id,
        Flight {
            events: s.events,
            arrival: stamp,
            enqueued: stamp + delay,
            last_token: None,
            last_handoff: i64::MIN,
        },
    );
    let request = Request {
        request_id: id,
        input_tokens: s.input_tokens,
        output_tokens: s.output_tokens,
        streaming: true,
        arrival_time_us: stamp,
        ..Request::default()
    };
    let mut input = Input::from_record(TraceRecord::planned(request), 0);
    input.priority = Some(s.priority);
    input.segments = Some(s.segments);
    session.submit(stamp, input, h);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_time_scale_too_small_for_an_instant_waits_a_century_not_a_panic() {
        let c = Clock::new(1e-300);
        let century = Duration::from_secs(100 * 365 * 86_400);
        assert_eq!(c.wall(1_000_000) - c.start, century);
        assert_eq!(c.wall(0), c.start);
        let real = Clock::new(1.0);
        assert_eq!(
            real.wall(1_500_000) - real.start,
            Duration::from_millis(1_500)
        );
    }
}
