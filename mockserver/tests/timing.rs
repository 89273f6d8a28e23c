//! Timing fidelity (its own test binary, so that no other test competes
//! for the CPU while it measures): a fixed open-loop sequence sent to the
//! mock gets, at the client, the first-token and completion times that
//! `blis-replay` predicts for the same arrivals and settings (within 4 ms
//! or 2%, but for a tenth of scheduling outliers of the shared machine;
//! median within 4 ms), at a load where batching and queueing happen.
//!
//! The engine is discrete: a request that reaches the queue a few hundred
//! microseconds later can miss a step and wait one more (~7 ms here). So
//! the prediction takes the arrivals where the server took them, and the
//! sequence is chosen (from the prediction itself) to keep every request's
//! entry into the queue at least 3 ms from any step boundary; what is
//! tested is that the mock runs the engine's timeline without drift, not
//! how a discrete scheduler reacts to jitter.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use blis_replay::output::Collector;
use blis_replay::setup::{Resolved, ServerArgs, resolve};
use blis_replay::sim::{Done, Input, NotServed, SimOptions, Sink};
use blis_replay::{Instance, LatencyModel, replay};
use blis_traces::{Mode, Request, TraceHeader, TraceRecord};
use serde_json::json;

#[path = "it/common.rs"]
#[allow(
    dead_code,
    reason = "shared with the it test binary, which uses other parts"
)]
mod common;

use common::{MODEL, client, server, stream_with_id};

const SEQS: u32 = 6;
const BUDGET: u32 = 1024;

#[derive(Default)]
struct Boundaries(BTreeSet<i64>);

impl Sink for Boundaries {
    fn wants_tokens(&self) -> bool {
        true
    }
    fn tokens(
        &mut self,
        _: Option<&TraceRecord>,
        _: bool,
        times: blis_replay::engine::instance::SpanTimes<'_>,
    ) {
        self.0.extend(times.iter());
    }
    fn finished(&mut self, _: Done<'_>) {}
    fn not_served(&mut self, _: TraceRecord, _: i64, _: NotServed) {}
}

fn request(i: u64, arrival_us: i64) -> Request {
    Request {
        request_id: i,
        input_tokens: 100 + ((i * 397) % 1400) as u32,
        output_tokens: 8 + ((i * 13) % 33) as u32,
        streaming: true,
        arrival_time_us: arrival_us,
        ..Request::default()
    }
}

/// Inputs in entry order, as `replay` requires.
fn inputs(reqs: &[Request]) -> Vec<Input> {
    let mut v: Vec<Input> = reqs
        .iter()
        .map(|r| Input::from_record(TraceRecord::planned(r.clone()), 0))
        .collect();
    v.sort_by_key(|i| (i.entry_us, i.rec.request.request_id));
    v
}

/// Arrivals every 35 ms, each moved later by 1.5 ms steps until its queue
/// entry is ≥ 3 ms from every predicted step boundary.
fn plan(n: u64, r: &Resolved) -> Vec<Request> {
    let alpha0 = r.latency.queueing_delay_us(0).round() as i64;
    let mut reqs: Vec<Request> = (0..n)
        .map(|i| request(i, 100_000 + i as i64 * 35_000))
        .collect();
    for _ in 0..400 {
        let mut b = Boundaries::default();
        let mut inst = Instance::new(r.engine.clone(), r.latency.clone());
        replay(
            &mut inst,
            inputs(&reqs),
            &SimOptions {
                sample_interval_us: None,
                horizon_us: None,
            },
            &mut b,
        );
        let mut moved = false;
        for q in &mut reqs {
            let enq = q.arrival_time_us + alpha0;
            let near = b.0.range(enq - 3000..=enq + 3000).next().is_some();
            if near {
                q.arrival_time_us += 1500;
                moved = true;
                break;
            }
        }
        if !moved {
            return reqs;
        }
    }
    panic!("no sequence clear of step boundaries");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_timings_match_the_replay_prediction() {
    let resolved = resolve(
        &ServerArgs {
            model: Some(MODEL.into()),
            max_num_seqs: Some(SEQS),
            max_num_batched_tokens: Some(BUDGET),
            prefix_caching: true,
            fast_forward: true,
            ..ServerArgs::default()
        },
        None,
    )
    .unwrap();
    let n = 30u64;
    let reqs = plan(n, &resolved);
    let (s, url) = server(&[
        "--max-num-seqs",
        "6",
        "--max-num-batched-tokens",
        "1024",
        "--record-served",
    ])
    .await;
    // Warm a connection per concurrent request.
    let c = client();
    let warm: Vec<_> = (0..n)
        .map(|_| c.get(format!("{url}/health")).send())
        .collect();
    for w in futures::future::join_all(warm).await {
        w.unwrap();
    }
    let t0 = Instant::now();
    let t0_unix = unix_us();
    let mut tasks = Vec::new();
    for q in &reqs {
        let (url, c, q) = (url.clone(), c.clone(), q.clone());
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep_until((t0 + Duration::from_micros(q.arrival_time_us as u64)).into())
                .await;
            // A unique 4-digit start: no prefix-cache hits, as in the replay.
            let text = format!(
                "{:04}{}",
                q.request_id,
                "z".repeat(q.input_tokens as usize * 4 - 4)
            );
            let id = q.request_id.to_string();
            let r = stream_with_id(&c, &url, "/v1/completions", json!({
                "model": MODEL, "prompt": text, "max_tokens": q.output_tokens, "ignore_eos": true,
                "stream": true, "stream_options": {"include_usage": true},
            }), Some(&id)).await;
            (q, r)
        }));
    }
    let mut responses = Vec::new();
    for t in tasks {
        let (q, r) = t.await.unwrap();
        assert_eq!(r.status, 200);
        let usage = r.json().last().unwrap()["usage"].clone();
        assert_eq!(
            usage["prompt_tokens"].as_u64(),
            Some(u64::from(q.input_tokens))
        );
        assert_eq!(
            usage["completion_tokens"].as_u64(),
            Some(u64::from(q.output_tokens))
        );
        responses.push((q, r));
    }
    let served_log = s.served.clone().expect("--record-served");
    s.shutdown().await;
    // The prediction takes each request's arrival where the server took it
    // (its handler's start), not the client's send: getting there is the
    // machine's scheduling, not the engine's timeline, and a late arrival
    // moves the whole step grid of the busy period it starts.
    let received: std::collections::HashMap<String, i64> = served_log
        .entries()
        .into_iter()
        .map(|e| (e.x_request_id.unwrap(), e.received_unix_us - t0_unix))
        .collect();
    let mut records = Vec::new();
    let mut measured = Vec::new();
    for (mut q, r) in responses {
        q.arrival_time_us = received[&q.request_id.to_string()];
        let at = |i: Instant| (i - t0).as_micros() as i64 - q.arrival_time_us;
        // The last content chunk comes before the usage chunk and [DONE].
        measured.push((q.request_id, at(r.times[0]), at(r.times[r.times.len() - 3])));
        records.push(TraceRecord::planned(q));
    }
    let mut inst = Instance::new(resolved.engine.clone(), resolved.latency.clone());
    let mut sink = Collector::in_memory(0);
    let mut ins: Vec<Input> = records
        .into_iter()
        .map(|r| Input::from_record(r, 0))
        .collect();
    ins.sort_by_key(|i| (i.entry_us, i.rec.request.request_id));
    let last = replay(
        &mut inst,
        ins,
        &SimOptions {
            sample_interval_us: None,
            horizon_us: None,
        },
        &mut sink,
    );
    let (summary, pred) = sink
        .finish(&TraceHeader::new(Mode::Replayed), &last, "blackbox")
        .unwrap();
    let pred = pred.unwrap();
    assert_eq!(summary.requests.completed, n);
    assert!(
        summary.ttft_ms.p99 > summary.ttft_ms.p50 * 1.5,
        "the load should queue requests: {:?}",
        summary.ttft_ms
    );
    // Every request within 4 ms or 2%, but for at most 6 of the 60
    // measurements, none beyond 50 ms, and the median within 4 ms. What is
    // left of the difference is the delivery of a token through this
    // machine's scheduler (engine thread, HTTP worker, client task), which
    // a 2-vCPU machine shared with the client sometimes does late. On an
    // idle machine (2026-11-30, 5 runs) the medians were 0.2-0.3 ms, the
    // largest 1.5-2.2 ms; with two other busy processes (45 runs) the
    // medians were 1.2-2.6 ms, the largest 3.8-8.1 ms, and 0-3 of 60
    // outside. A timeline that drifts or misses steps (~7 ms each) shows
    // in many requests and in the median.
    let mut outside = Vec::new();
    let mut abs_diffs = Vec::new();
    for (i, first, last) in measured {
        let p = pred.iter().find(|r| r.request.request_id == i).unwrap();
        for (what, real, sim) in [
            ("TTFT", first, p.ttft_us().unwrap()),
            ("E2E", last, p.e2e_us().unwrap()),
        ] {
            let diff = real - sim;
            if std::env::var("BLIS_DEBUG_TIMING").is_ok() {
                eprintln!("request {i} {what}: client {real} µs, replay {sim} µs, diff {diff}");
            }
            abs_diffs.push(diff.abs());
            if (diff.abs() as f64) > (0.02 * sim as f64).max(4000.0) {
                outside.push(format!(
                    "request {i} {what}: client {real} µs, replay {sim} µs"
                ));
            }
            assert!(
                diff.abs() <= 50_000,
                "request {i} {what}: client {real} µs, replay {sim} µs"
            );
        }
    }
    abs_diffs.sort_unstable();
    let median = abs_diffs[abs_diffs.len() / 2];
    eprintln!(
        "|client − replay|: median {median} µs, largest {} µs; {} of {} outside 4 ms / 2%",
        abs_diffs[abs_diffs.len() - 1],
        outside.len(),
        abs_diffs.len()
    );
    assert!(outside.len() <= 6, "outside 4 ms / 2%: {outside:?}");
    assert!(median <= 4_000, "median |client − replay| {median} µs");
}

/// The wall clock, Unix µs (the server's served log is stamped with it).
fn unix_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64
}
