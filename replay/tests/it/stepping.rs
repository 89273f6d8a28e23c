//! One stepping API: the real-time owner (`blis-mockserver`) advances a
//! [`Session`] to the wall clock's time and hands requests over as they
//! arrive; the discrete-event replay advances the same code to the end. Fed
//! the same scenario, they give the same token times, completions and
//! cancellations.

use blis_replay::cluster::Control;
use blis_replay::engine::instance::SpanTimes;
use blis_replay::sim::{Done, Input, NoInputs, NotServed, Session, SimOptions, Sink, replay};
use blis_replay::{EngineConfig, Instance};
use blis_traces::{Status, TraceRecord};

use crate::common::{req, simple_model, with_prefix};

/// Every token (request, 1-based index, visible µs), every completion and
/// every cancellation, in the order reported.
#[derive(Default, Debug, PartialEq)]
struct Seen {
    tokens: Vec<(u64, u32, i64)>,
    finished: Vec<(u64, Status, i64, i64, u32)>,
    not_served: Vec<u64>,
    upcoming: Vec<(u64, u32, i64)>,
}

impl Sink for Seen {
    fn wants_tokens(&self) -> bool {
        true
    }
    fn tokens(&mut self, rec: Option<&TraceRecord>, _streaming: bool, times: SpanTimes<'_>) {
        let span = times.span();
        let id = rec.expect("records asked for").request.request_id;
        assert_eq!(id, span.id);
        for (m, t) in times.iter().enumerate() {
            self.tokens.push((id, span.first_index + m as u32, t));
        }
    }
    fn finished(&mut self, d: Done<'_>) {
        self.finished.push((
            d.fin.id,
            d.status,
            d.fin.first_token_us,
            d.fin.last_token_us,
            d.fin.output_tokens,
        ));
    }
    fn not_served(&mut self, rec: TraceRecord, _: i64, _: NotServed) {
        self.not_served.push(rec.request.request_id);
    }
    fn wants_upcoming(&self) -> bool {
        true
    }
    fn upcoming(&mut self, _: u32, tokens: &[(u64, u32, i64)]) {
        self.upcoming.extend_from_slice(tokens);
    }
}

/// 150 requests over 3 s, a shared prefix on some, a KV cache small enough
/// to preempt, and every 7th request's client gone 40 ms after sending.
fn scenario() -> Vec<Input> {
    (0..150u64)
        .map(|i| {
            let at = (i as i64) * 20_000 + ((i * 7919) % 13_000) as i64;
            let mut r = req(
                i,
                at,
                64 + ((i * 397) % 900) as u32,
                4 + ((i * 13) % 90) as u32,
            );
            if i % 3 == 0 {
                r = with_prefix(r, "system", 256);
            }
            let mut input = Input::from_record(TraceRecord::planned(r), 0);
            if i % 7 == 3 {
                input.cancel_at_us = Some(at + 40_000);
            }
            input
        })
        .collect()
}

fn config() -> EngineConfig {
    EngineConfig {
        max_num_seqs: 16,
        max_num_batched_tokens: 512,
        total_kv_blocks: 160,
        fast_forward: false,
        ..EngineConfig::default()
    }
}

#[test]
fn the_real_time_stepping_api_gives_the_discrete_event_run_token_for_token() {
    let opts = SimOptions {
        sample_interval_us: None,
        horizon_us: None,
    };
    // The discrete-event run, with fast-forward (runs of decode steps as
    // one event) as `blis-replay` runs it.
    let mut inst = Instance::new(
        EngineConfig {
            fast_forward: true,
            ..config()
        },
        simple_model(),
    );
    let mut batch = Seen::default();
    replay(&mut inst, scenario(), &opts, &mut batch);

    // The real-time owner's way: a wall clock that moves in uneven steps,
    // requests handed over when they arrive, clients that go away aborted.
    let mut insts = [Instance::new(config(), simple_model())];
    let mut control = Control::single();
    let mut session = Session::new(&mut insts, &mut control, &opts);
    let mut live = Seen::default();
    let mut arrivals = scenario();
    let mut aborts: Vec<(i64, u64)> = arrivals
        .iter_mut()
        .filter_map(|i| i.cancel_at_us.take().map(|c| (c, i.rec.request.request_id)))
        .collect();
    aborts.sort_unstable();
    let (mut a, mut c) = (0, 0);
    let mut clock = 0i64;
    while a < arrivals.len() || c < aborts.len() || session.next_time().is_some() {
        clock += 997 + (clock % 5_003); // uneven wake-ups
        // Hand over what happened by now, each at its own time.
        loop {
            let next_arrival = arrivals.get(a).map(|i| i.entry_us);
            let next_abort = aborts.get(c).map(|x| x.0);
            let t = match (next_arrival, next_abort) {
                (Some(x), Some(y)) => x.min(y),
                (x, y) => match x.or(y) {
                    Some(t) => t,
                    None => break,
                },
            };
            if t > clock {
                break;
            }
            // Events before `t` first, as the discrete run orders them.
            session.advance(t - 1, &mut NoInputs, &mut live);
            if next_arrival == Some(t) {
                session.submit(t, arrivals[a].clone(), &mut live);
                a += 1;
            } else {
                session.abort(t, aborts[c].1, &mut live);
                c += 1;
            }
        }
        session.advance(clock, &mut NoInputs, &mut live);
    }
    session.finish(NoInputs, &mut live);

    assert!(batch.tokens.len() > 3_000, "{}", batch.tokens.len());
    let timeouts = batch
        .finished
        .iter()
        .filter(|f| f.1 == Status::Timeout)
        .count();
    assert!(timeouts > 0, "aborted mid-answer");
    assert!(inst.counters().preemptions > 0, "preemption exercised");
    let mut want = batch.tokens.clone();
    let mut got = live.tokens.clone();
    want.sort_unstable();
    got.sort_unstable();
    assert_eq!(got, want, "token times");
    let key = |v: &mut Vec<(u64, Status, i64, i64, u32)>| v.sort_unstable_by_key(|f| f.0);
    key(&mut batch.finished);
    key(&mut live.finished);
    assert_eq!(live.finished, batch.finished);
    batch.not_served.sort_unstable();
    live.not_served.sort_unstable();
    assert_eq!(live.not_served, batch.not_served);
    // Tokens handed over ahead (at batch formation) are the tokens
    // reported, less those of requests aborted meanwhile.
    let mut up = live.upcoming.clone();
    up.sort_unstable();
    up.dedup();
    assert!(got.iter().all(|t| up.binary_search(t).is_ok()));
}
