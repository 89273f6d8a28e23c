//! Known answers of the engine with a round-number blackbox model:
//! step = 1000 µs + 10 µs per prefill token + 100 µs per decode token.

use std::sync::Arc;

use blis_replay::sim::SimOptions;
use blis_replay::{Blackbox, EngineConfig, Model, SchedulerPolicy};
use blis_traces::{Outcome, Status, TraceRecord};

use crate::common::{e2e, req, run, run_opts, simple_model, slo, ttft, with_prefix};

fn cfg() -> EngineConfig {
    EngineConfig {
        total_kv_blocks: 10_000,
        ..EngineConfig::default()
    }
}

#[test]
fn a_lone_request_takes_one_prefill_step_then_one_decode_step_per_token() {
    let (s, r) = run(cfg(), simple_model(), vec![req(0, 0, 100, 5)]);
    assert_eq!(ttft(&r[0]), 2000);
    assert_eq!(e2e(&r[0]), 2000 + 4 * 1100);
    assert_eq!(r[0].outcome.num_chunks, 5);
    assert_eq!(r[0].outcome.status, Some(Status::Ok));
    assert_eq!(s.requests.completed, 1);
    assert_eq!(s.itl_ms.n, Some(4));
    assert!((s.itl_ms.mean - 1.1).abs() < 1e-9);
}

#[test]
fn alpha_overheads_delay_entry_and_every_token() {
    let m = Model::Blackbox(Blackbox {
        alpha: [500.0, 2.0, 50.0],
        beta: [1000.0, 10.0, 100.0],
    });
    let (_, r) = run(cfg(), m, vec![req(0, 0, 100, 5)]);
    // Enters the queue at α0 + α1·100 = 700; first token at 700 + 2000 + α2.
    assert_eq!(ttft(&r[0]), 2750);
    // Each later token adds its step and α2 (BLIS's ITL = step + α2).
    assert_eq!(e2e(&r[0]), 700 + 2000 + 4 * 1100 + 5 * 50);
}

#[test]
fn long_prompts_are_chunked_by_the_token_budget_and_the_threshold() {
    let (_, r) = run(cfg(), simple_model(), vec![req(0, 0, 5000, 1)]);
    // 2048 + 2048 + 904 prefill tokens.
    assert_eq!(ttft(&r[0]), 2 * (1000 + 20480) + (1000 + 9040));
    let c = EngineConfig {
        long_prefill_token_threshold: 1000,
        ..cfg()
    };
    let (_, r) = run(c, simple_model(), vec![req(0, 0, 5000, 1)]);
    assert_eq!(ttft(&r[0]), 5 * (1000 + 10_000));
}

/// Chunked prefill off (`--enable-chunked-prefill false`): a prompt runs
/// whole in one step, so a second prompt that would only partly fit waits
/// for the next step instead of taking the rest of the budget.
#[test]
fn without_chunked_prefill_a_prompt_runs_whole_or_waits() {
    let reqs = || vec![req(0, 0, 3000, 2), req(1, 0, 3000, 2)];
    let budget = EngineConfig {
        max_num_batched_tokens: 4096,
        ..cfg()
    };
    // Chunked: step 1 = 3000 + 1096 tokens, step 2 = 1 decode + 1904.
    let (_, r) = run(budget.clone(), simple_model(), reqs());
    assert_eq!(ttft(&r[0]), 1000 + 40_960);
    assert_eq!(ttft(&r[1]), 1000 + 40_960 + 1000 + 19_040 + 100);
    // Whole prompts: step 1 = 3000, step 2 = 1 decode + 3000.
    let off = EngineConfig {
        chunked_prefill: false,
        ..budget
    };
    let (_, r) = run(off.clone(), simple_model(), reqs());
    assert_eq!(ttft(&r[0]), 1000 + 30_000);
    assert_eq!(ttft(&r[1]), 1000 + 30_000 + 1000 + 30_000 + 100);
    // The threshold applies to chunks only.
    let (_, r) = run(
        EngineConfig {
            long_prefill_token_threshold: 500,
            ..off
        },
        simple_model(),
        vec![req(0, 0, 3000, 1)],
    );
    assert_eq!(ttft(&r[0]), 1000 + 30_000);
}

#[test]
fn the_token_budget_is_shared_running_first() {
    let (_, r) = run(
        cfg(),
        simple_model(),
        vec![req(0, 0, 1500, 3), req(1, 0, 1500, 3)],
    );
    // Step 1: r0's 1500 tokens + 548 of r1's. Step 2: r0 decodes, r1 its 952.
    assert_eq!(ttft(&r[0]), 21_480);
    assert_eq!(ttft(&r[1]), 21_480 + 1000 + 9520 + 100);
}

#[test]
fn max_num_seqs_makes_the_third_request_wait() {
    let c = EngineConfig {
        max_num_seqs: 2,
        ..cfg()
    };
    let (_, r) = run(
        c,
        simple_model(),
        vec![req(0, 0, 10, 3), req(1, 0, 10, 3), req(2, 0, 10, 3)],
    );
    assert!(
        ttft(&r[2]) > e2e(&r[0]),
        "{} vs {}",
        ttft(&r[2]),
        e2e(&r[0])
    );
    assert_eq!(ttft(&r[0]), ttft(&r[1]));
}

#[test]
fn a_shared_prefix_is_found_in_the_cache() {
    let a = with_prefix(req(0, 0, 200, 2), "sys", 160);
    let b = with_prefix(req(1, 100_000, 200, 2), "sys", 160);
    let (s, r) = run(cfg(), simple_model(), vec![a.clone(), b.clone()]);
    assert_eq!(r[1].outcome.cached_tokens, Some(160));
    assert_eq!(ttft(&r[1]), 1000 + 10 * 40);
    assert!((s.prefix_cache.hit_rate - 160.0 / 400.0).abs() < 1e-12);
    let off = EngineConfig {
        prefix_caching: false,
        ..cfg()
    };
    let (_, r) = run(off, simple_model(), vec![a, b]);
    assert_eq!(ttft(&r[1]), 1000 + 10 * 200);
}

#[test]
fn a_full_prompt_hit_still_computes_its_last_token() {
    // Same group, prompt entirely in the prefix: at most all but the last
    // token come from the cache (vLLM recomputes the last block).
    let a = with_prefix(req(0, 0, 160, 1), "sys", 160);
    let b = with_prefix(req(1, 100_000, 160, 1), "sys", 160);
    let (_, r) = run(cfg(), simple_model(), vec![a, b]);
    assert_eq!(r[1].outcome.cached_tokens, Some(144));
    assert_eq!(ttft(&r[1]), 1000 + 10 * 16);
}

#[test]
fn kv_pressure_preempts_the_latest_request_which_recomputes() {
    let c = EngineConfig {
        total_kv_blocks: 20,
        ..cfg()
    };
    let (s, r) = run(
        c,
        simple_model(),
        vec![req(0, 0, 100, 200), req(1, 0, 100, 200)],
    );
    assert!(s.preemptions > 0);
    assert_eq!(s.requests.completed, 2);
    assert!(r.iter().all(|r| r.outcome.num_chunks == 200));
    // The earlier request keeps running; the later one waits and redoes work.
    assert!(e2e(&r[1]) > e2e(&r[0]));
    let (_, free) = run(
        cfg(),
        simple_model(),
        vec![req(0, 0, 100, 200), req(1, 0, 100, 200)],
    );
    assert!(e2e(&r[1]) > e2e(&free[1]));
}

#[test]
fn a_request_that_can_never_fit_is_dropped_and_counted() {
    let c = EngineConfig {
        total_kv_blocks: 20,
        ..cfg()
    };
    let (s, r) = run(
        c,
        simple_model(),
        vec![req(0, 0, 400, 10), req(1, 0, 10, 10)],
    );
    assert_eq!(s.requests.dropped, 1);
    assert_eq!(r[0].outcome.status, Some(Status::Error));
    assert!(
        r[0].outcome.error_message.starts_with("unservable"),
        "{}",
        r[0].outcome.error_message
    );
    assert_eq!(r[1].outcome.status, Some(Status::Ok));
}

#[test]
fn max_model_len_caps_the_output() {
    let c = EngineConfig {
        max_model_len: 150,
        ..cfg()
    };
    let (_, r) = run(
        c,
        simple_model(),
        vec![req(0, 0, 100, 200), req(1, 0, 150, 5)],
    );
    assert_eq!(r[0].outcome.num_chunks, 50);
    assert_eq!(r[0].request.output_tokens, 50);
    assert_eq!(r[1].outcome.status, Some(Status::Error));
}

#[test]
fn priority_fcfs_serves_a_realtime_request_before_an_earlier_batch_one() {
    let reqs = vec![
        slo(req(0, 0, 10, 50), "batch"),
        slo(req(1, 1, 10, 5), "batch"),
        slo(req(2, 2, 10, 5), "critical"),
    ];
    let c = EngineConfig {
        max_num_seqs: 1,
        scheduler: SchedulerPolicy::PriorityFcfs,
        ..cfg()
    };
    let first = |r: &TraceRecord| r.outcome.first_chunk_time_us.unwrap();
    let last = |r: &TraceRecord| r.outcome.last_chunk_time_us.unwrap();
    let (_, r) = run(c, simple_model(), reqs.clone());
    assert!(
        last(&r[2]) < first(&r[1]),
        "critical done {} batch first {}",
        last(&r[2]),
        first(&r[1])
    );
    let fcfs = EngineConfig {
        max_num_seqs: 1,
        ..cfg()
    };
    let (_, r) = run(fcfs, simple_model(), reqs);
    assert!(last(&r[1]) < first(&r[2]));
}

#[test]
fn sjf_serves_the_shorter_prompt_first() {
    let reqs = vec![req(0, 0, 10, 20), req(1, 1, 1000, 5), req(2, 2, 100, 5)];
    let c = EngineConfig {
        max_num_seqs: 1,
        scheduler: SchedulerPolicy::Sjf,
        ..cfg()
    };
    let (_, r) = run(c, simple_model(), reqs);
    assert!(r[2].outcome.first_chunk_time_us < r[1].outcome.first_chunk_time_us);
}

#[test]
fn a_later_session_round_waits_for_the_previous_response_and_think_time() {
    let mut r0 = req(0, 0, 100, 10);
    r0.session_id = Arc::from("s1");
    let mut r1 = req(1, 1000, 150, 10);
    r1.session_id = Arc::from("s1");
    r1.round_index = 1;
    r1.think_time_us = Some(5000);
    let (_, r) = run(cfg(), simple_model(), vec![r0, r1]);
    let done0 = r[0].outcome.last_chunk_time_us.unwrap();
    assert_eq!(r[1].outcome.send_time_us, Some(done0 + 5000));
    // Round 1's prompt starts with round 0's prompt and answer: its first
    // blocks are cache hits.
    assert!(
        r[1].outcome.cached_tokens.unwrap() >= 96,
        "{:?}",
        r[1].outcome.cached_tokens
    );
}

/// The client's timeout cancels a request wherever it is; what happened to
/// the request in the recorded run is never an input.
#[test]
fn the_client_timeout_cancels_and_recorded_failures_are_ignored() {
    let mut rec = TraceRecord::planned(req(0, 0, 100, 1000));
    // Recorded as timed out at 20 ms: a prediction must not know it.
    rec.outcome = Outcome {
        send_time_us: Some(0),
        last_chunk_time_us: Some(20_000),
        status: Some(Status::Timeout),
        ..Outcome::default()
    };
    let input = blis_replay::sim::Input::from_record(rec.clone(), 0);
    assert_eq!(input.cancel_at_us, None);
    let mut flipped = rec;
    flipped.outcome.status = Some(Status::Ok);
    let other = blis_replay::sim::Input::from_record(flipped, 0);
    assert_eq!(
        (other.entry_us, other.cancel_at_us, other.closed_loop),
        (input.entry_us, input.cancel_at_us, input.closed_loop),
        "the status is not an input"
    );
    let input = input.with_client_timeout(Some(50_000));
    assert_eq!(input.cancel_at_us, Some(50_000));
    let mut inst = blis_replay::Instance::new(cfg(), simple_model());
    let mut sink = blis_replay::output::Collector::in_memory(0);
    let last = blis_replay::replay(
        &mut inst,
        vec![input],
        &SimOptions {
            sample_interval_us: None,
            horizon_us: None,
        },
        &mut sink,
    );
    inst.check().unwrap();
    assert_eq!(last.counters.aborted, 1);
    let (s, recs) = sink
        .finish(
            &blis_traces::TraceHeader::new(blis_traces::Mode::Replayed),
            &last,
            "t",
        )
        .unwrap();
    assert_eq!(s.requests.cancelled, 1);
    let r = &recs.unwrap()[0];
    assert_eq!(r.outcome.status, Some(Status::Timeout));
    // 2000 µs prefill, then 1100 µs per token until 50 ms.
    assert_eq!(r.outcome.num_chunks, 1 + (50_000 - 2000) / 1100);
    // Its last chunk is its latest token's.
    let n = i64::from(r.outcome.num_chunks);
    assert_eq!(r.outcome.last_chunk_time_us, Some(2000 + (n - 1) * 1100));
}

/// An overloaded run under a client timeout: requests arrive far faster
/// than the engine serves them, each with a 3 s deadline. Every request
/// that could not finish by its deadline is cancelled there as `timeout`,
/// wherever it was (waiting, prefilling or decoding); every other one
/// completes in time; and the KV cache ends empty with its blocks
/// accounted for.
#[test]
fn an_overloaded_run_times_out_past_the_deadline_and_conserves_kv() {
    const DEADLINE: i64 = 3_000_000;
    let reqs: Vec<_> = (0..400)
        .map(|i| {
            // One every 5 ms, 200 output tokens: ~100 running at once would
            // be needed; max_num_seqs 16 and 600 KV blocks allow far fewer.
            let mut r = req(i, i as i64 * 5_000, 300 + (i as u32 % 7) * 100, 200);
            r.deadline_us = Some(r.arrival_time_us + DEADLINE);
            r
        })
        .collect();
    let config = EngineConfig {
        total_kv_blocks: 600,
        max_num_seqs: 16,
        ..EngineConfig::default()
    };
    let mut inst = blis_replay::Instance::new(config, simple_model());
    let mut sink = blis_replay::output::Collector::in_memory(0);
    let last = blis_replay::replay(
        &mut inst,
        crate::common::inputs(reqs),
        &SimOptions {
            sample_interval_us: None,
            horizon_us: None,
        },
        &mut sink,
    );
    inst.check().unwrap();
    assert_eq!(inst.kv().used(), 0, "every block freed");
    assert_eq!(inst.kv().free(), inst.kv().total());
    let (s, recs) = sink
        .finish(
            &blis_traces::TraceHeader::new(blis_traces::Mode::Replayed),
            &last,
            "t",
        )
        .unwrap();
    let recs = recs.unwrap();
    assert_eq!(recs.len(), 400);
    let (mut ok, mut timeout, mut in_flight) = (0, 0, 0);
    for r in &recs {
        let o = &r.outcome;
        let deadline = r.request.arrival_time_us + DEADLINE;
        let end = o.last_chunk_time_us.or(o.send_time_us).unwrap();
        assert!(
            end <= deadline,
            "request {} ends after its deadline",
            r.request.request_id
        );
        match o.status {
            Some(Status::Ok) => {
                ok += 1;
                assert_eq!(o.num_chunks, 200);
            }
            Some(Status::Timeout) => {
                timeout += 1;
                assert!(o.num_chunks < 200);
                if o.num_chunks > 0 {
                    in_flight += 1;
                }
            }
            other => panic!("request {}: {other:?}", r.request.request_id),
        }
    }
    assert!(ok > 0 && timeout > 200, "{ok} ok, {timeout} timed out");
    assert!(in_flight > 0, "some were cancelled while decoding");
    assert!(timeout - in_flight > 0, "some were cancelled while waiting");
    assert_eq!(s.requests.cancelled, timeout);
    assert_eq!(last.counters.aborted, timeout);
}

#[test]
fn a_cancellation_only_hits_its_own_request() {
    // Request slots are reused: the cancellation of a request that already
    // completed must not cancel the request now in its slot.
    let reqs: Vec<_> = (0..50)
        .map(|i| {
            // ~2 s each, one a second, deadlines long after completion.
            let mut r = req(i, i as i64 * 1_000_000, 50, 1500);
            r.deadline_us = Some(r.arrival_time_us + 30_000_000);
            r
        })
        .collect();
    let (s, r) = run(cfg(), simple_model(), reqs);
    assert_eq!(s.requests.completed, 50, "{:?}", s.requests);
    assert!(r.iter().all(|r| r.outcome.status == Some(Status::Ok)));
}

#[test]
fn non_streaming_responses_arrive_whole() {
    let mut r = req(0, 0, 100, 5);
    r.streaming = false;
    let (_, out) = run(cfg(), simple_model(), vec![r]);
    assert_eq!(
        out[0].outcome.first_chunk_time_us,
        out[0].outcome.last_chunk_time_us
    );
    assert_eq!(out[0].outcome.num_chunks, 1);
}

#[test]
fn the_horizon_leaves_unfinished_requests_marked() {
    let opts = SimOptions {
        sample_interval_us: None,
        horizon_us: Some(3000),
    };
    let (s, r) = run_opts(
        cfg(),
        simple_model(),
        vec![req(0, 0, 100, 5), req(1, 10_000, 10, 5)],
        opts,
    );
    assert_eq!(s.requests.unfinished, 2);
    assert!(
        r.iter()
            .all(|r| r.outcome.status == Some(Status::Cancelled))
    );
}
