//! Autoscaling through the cluster driver, hand-computed with the
//! round-number blackbox model (step = 1000 µs + 10 µs per prefill token +
//! 100 µs per decode token): when a replica is added, when it takes its
//! first request, what a drain does, what it costs.

use blis_replay::cluster::autoscale::{AutoscaleConfig, DrainPolicy, ScalerKind};
use blis_replay::cluster::policy::PolicyBundle;
use blis_replay::cluster::routing::RoutingPolicy;
use blis_replay::cluster::{Control, DecisionRecord};
use blis_replay::output::{Collector, Summary};
use blis_replay::sim::{SimOptions, merged};
use blis_replay::{EngineConfig, Instance, replay_cluster};
use blis_traces::{Mode, Request, Status, TraceHeader, TraceRecord};

use crate::common::{inputs, req, simple_model, ttft};

struct Run {
    summary: Summary,
    records: Vec<TraceRecord>,
    decisions: Vec<DecisionRecord>,
    control: Control,
}

fn run(bundle: &PolicyBundle, cfg: EngineConfig, reqs: Vec<Request>) -> Run {
    let mut insts: Vec<Instance> = (0..bundle.instance_count())
        .map(|_| Instance::new(cfg.clone(), simple_model()))
        .collect();
    let mut control = Control::new(bundle, insts.len());
    control.trace_decisions(1);
    let mut sink = Collector::in_memory(0);
    let opts = SimOptions {
        sample_interval_us: None,
        horizon_us: None,
    };
    replay_cluster(&mut insts, &mut control, inputs(reqs), &opts, &mut sink);
    for i in &insts {
        i.check().expect("instance invariants");
    }
    let snaps: Vec<_> = insts.iter().map(Instance::snapshot).collect();
    let (summary, recs) = sink
        .finish(&TraceHeader::new(Mode::Replayed), &merged(&snaps), "test")
        .unwrap();
    let mut records = recs.unwrap();
    records.sort_by_key(|r| r.request.request_id);
    let decisions = control.take_decisions().unwrap();
    Run {
        summary,
        records,
        decisions,
        control,
    }
}

fn bundle(initial: u32, cfg: AutoscaleConfig, routing: RoutingPolicy) -> PolicyBundle {
    PolicyBundle {
        num_instances: initial,
        routing,
        autoscale: Some(cfg),
        ..PolicyBundle::default()
    }
}

/// `threshold` on utilisation alone from 1 up to `max` replicas, evaluated
/// every second, ready 2 + 0.5 + 1.5 s after a scale-up, no scale-down
/// within 100 s.
fn step_scaler(max: u32) -> AutoscaleConfig {
    AutoscaleConfig {
        policy: ScalerKind::Threshold,
        min_replicas: 1,
        max_replicas: max,
        interval_s: 1.0,
        scale_up_queue_depth: 1e9,
        cooldown_s: 100.0,
        provisioning_delay_s: 2.0,
        model_load_s: 0.5,
        warmup_s: 1.5,
        ..AutoscaleConfig::default()
    }
}

/// A step load: 800 req/s of 2 ms requests for 3 s (one replica serves
/// 500/s), then 100 req/s on multiples of 10 ms until 8 s.
fn step_load() -> Vec<Request> {
    let mut reqs = Vec::new();
    let mut t = 0;
    while t < 3_000_000 {
        reqs.push(req(reqs.len() as u64, t, 100, 1));
        t += 1250;
    }
    while t < 8_000_000 {
        reqs.push(req(reqs.len() as u64, t, 100, 1));
        t += 10_000;
    }
    reqs
}

#[test]
fn a_step_load_adds_one_replica_that_takes_its_first_request_when_ready() {
    let cfg = step_scaler(4);
    // One running request fills a replica (utilisation 1).
    let engine = EngineConfig {
        max_num_seqs: 1,
        total_kv_blocks: 1000,
        ..EngineConfig::default()
    };
    let r = run(
        &bundle(1, cfg, RoutingPolicy::LeastLoaded),
        engine,
        step_load(),
    );
    let a = r.control.autoscale.as_deref().unwrap();
    // The tick at 1 s sees replica 0 busy: one scale-up; the ticks at
    // 2-4 s hold while it starts; from 5 s the two are never both busy at
    // a tick.
    assert_eq!(a.counters.scale_ups, 1, "{:?}", a.events);
    assert_eq!(a.counters.scale_downs, 0);
    let actions: Vec<(i64, &str, usize)> = a
        .events
        .iter()
        .map(|e| (e.time_us, e.action, e.instance))
        .collect();
    assert_eq!(actions, [(1_000_000, "up", 1), (5_000_000, "ready", 1)]);
    // Ready at 1 s + 2 + 0.5 + 1.5 s = 5 s, and the request arriving at
    // exactly 5 s is its first: no request went there before.
    let first = r
        .decisions
        .iter()
        .find(|d| d.instance == Some(1))
        .expect("routed to the new replica");
    assert_eq!(first.time_us, 5_000_000);
    let id = first.request_id;
    assert_eq!(r.records[id as usize].request.arrival_time_us, 5_000_000);
    // Idle and cold: its TTFT is one prefill step, 1000 + 10·100 µs.
    assert_eq!(ttft(&r.records[id as usize]), 2000);
    // Replica 0 from 0, replica 1 from its decision at 1 s, both to the
    // last completion (the request at 7.99 s, 2 ms later).
    let end = 7_990_000 + 2000;
    let expected = (end + (end - 1_000_000)) as f64 / 1e6;
    assert!(
        (a.replica_seconds() - expected).abs() < 1e-9,
        "{} vs {expected}",
        a.replica_seconds()
    );
    assert_eq!(r.summary.requests.completed, step_load().len() as u64);
}

/// Two replicas, each with a long prompt prefilling (2000 tokens in chunks
/// of 512) and a short request waiting behind it when the tick at 1 s
/// finds them at 1/8 utilisation and removes one: replica 1 (tied on
/// requests in flight, the higher index).
fn drain_case(drain: DrainPolicy) -> Run {
    let cfg = AutoscaleConfig {
        policy: ScalerKind::Threshold,
        min_replicas: 1,
        max_replicas: 2,
        interval_s: 1.0,
        cooldown_s: 0.0,
        drain,
        ..AutoscaleConfig::default()
    };
    let engine = EngineConfig {
        max_num_seqs: 8,
        max_num_batched_tokens: 512,
        total_kv_blocks: 1000,
        ..EngineConfig::default()
    };
    let reqs = vec![
        req(0, 990_000, 2000, 3),
        req(1, 990_000, 2000, 3),
        req(2, 990_001, 10, 2),
        req(3, 990_001, 10, 2),
    ];
    run(&bundle(2, cfg, RoutingPolicy::RoundRobin), engine, reqs)
}

#[test]
fn a_drained_replica_finishes_cuts_off_or_redirects_its_requests() {
    // wait: everything completes where it was sent; the replica frees its
    // GPU when its last request completes.
    let r = drain_case(DrainPolicy::Wait);
    let a = r.control.autoscale.as_deref().unwrap();
    assert_eq!(a.counters.scale_downs, 1);
    let down = &a.events[0];
    assert_eq!(
        (down.time_us, down.action, down.instance),
        (1_000_000, "down", 1)
    );
    assert_eq!(r.summary.requests.completed, 4);
    let released = a.events.iter().find(|e| e.action == "released").unwrap();
    let last_on_1 = [1usize, 3]
        .iter()
        .map(|&i| r.records[i].outcome.last_chunk_time_us.unwrap())
        .max()
        .unwrap();
    assert_eq!(released.time_us, last_on_1);

    // immediate: both of replica 1's requests end at 1 s with an error.
    let r = drain_case(DrainPolicy::Immediate);
    let a = r.control.autoscale.as_deref().unwrap();
    assert_eq!(a.counters.drain_cut, 2);
    assert_eq!(r.summary.requests.completed, 2);
    assert_eq!(r.summary.requests.scaled_down, 2);
    for i in [1, 3] {
        assert_eq!(r.records[i].outcome.status, Some(Status::Error));
    }
    let released = a.events.iter().find(|e| e.action == "released").unwrap();
    assert_eq!(released.time_us, 1_000_000);

    // redirect: the waiting request (3) goes to replica 0 at 1 s; the
    // prefilling one (1) finishes on replica 1.
    let r = drain_case(DrainPolicy::Redirect);
    let a = r.control.autoscale.as_deref().unwrap();
    assert_eq!(a.counters.redirected, 1);
    assert_eq!(r.summary.requests.completed, 4);
    let routes: Vec<(i64, Option<usize>)> = r
        .decisions
        .iter()
        .filter(|d| d.request_id == 3)
        .map(|d| (d.time_us, d.instance))
        .collect();
    assert_eq!(routes, [(990_001, Some(1)), (1_000_000, Some(0))]);
    assert!(r.records[3].outcome.last_chunk_time_us.unwrap() > 1_000_000);
}

#[test]
fn scaling_down_then_up_within_the_cooldown_is_an_oscillation() {
    // Idle at the tick at 1 s: down to 1 (no action yet to cool down
    // from). A burst from 1.5 s fills replica 0, and the tick at 2 s
    // scales up (the cooldown holds back scale-downs only): a reversal 1 s
    // after the last action, within the 5 s cooldown.
    let cfg = AutoscaleConfig {
        policy: ScalerKind::Threshold,
        min_replicas: 1,
        max_replicas: 2,
        interval_s: 1.0,
        cooldown_s: 5.0,
        provisioning_delay_s: 0.0,
        warmup_s: 0.0,
        ..AutoscaleConfig::default()
    };
    let engine = EngineConfig {
        max_num_seqs: 1,
        total_kv_blocks: 1000,
        ..EngineConfig::default()
    };
    let mut reqs = vec![req(0, 0, 10, 1)];
    let mut t = 1_500_000;
    while t < 2_500_000 {
        reqs.push(req(reqs.len() as u64, t, 100, 1));
        t += 1000;
    }
    let r = run(&bundle(2, cfg, RoutingPolicy::LeastLoaded), engine, reqs);
    let a = r.control.autoscale.as_deref().unwrap();
    let actions: Vec<(i64, &str, bool)> = a
        .events
        .iter()
        .map(|e| (e.time_us, e.action, e.oscillation))
        .collect();
    assert_eq!(
        &actions[..4],
        [
            (1_000_000, "down", false),
            (1_000_000, "released", false),
            (2_000_000, "up", true),
            (2_000_000, "ready", false)
        ]
    );
    assert_eq!(a.counters.oscillations, 1);
}

/// Issue 16, all three features together: a P/D split whose decode pool is
/// autoscaled. One prefill instance keeps up with a request every 1.25 ms
/// (10-token prompts: 1100 µs prefills) for 6 s; each needs 19 decode
/// steps of 1100 µs on a decode replica that runs one at a time, so the
/// single decode replica is full at the 1 s tick: one decode replica is
/// added (cluster instance 2), ready at 1 + 2 + 0.5 + 1.5 = 5 s. The
/// request arriving at exactly 5 s is prefilled by 5.0011 s, and is the
/// first the decode router sends there: moved in 500 µs, decoded alone.
#[test]
fn an_autoscaled_decode_pool_adds_a_replica_that_takes_its_first_handoff_when_ready() {
    use blis_replay::cluster::disaggregation::PdConfig;
    let cfg = step_scaler(2);
    let b = PolicyBundle {
        pd: Some(PdConfig {
            prefill_instances: 1,
            decode_instances: 1,
            decode_routing: RoutingPolicy::LeastLoaded,
            transfer_latency_us: 500.0,
            transfer_bandwidth_gb_s: 1e9,
            block_bytes: Some(131_072.0),
        }),
        autoscale: Some(cfg),
        ..PolicyBundle::default()
    };
    assert_eq!(b.instance_count(), 3);
    let engine = EngineConfig {
        max_num_seqs: 1,
        total_kv_blocks: 100_000,
        ..EngineConfig::default()
    };
    let mut reqs = Vec::new();
    let mut t = 0;
    while t < 6_000_000 {
        reqs.push(req(reqs.len() as u64, t, 10, 20));
        t += 1250;
    }
    let n = reqs.len() as u64;
    let r = run(&b, engine, reqs);
    assert_eq!(r.summary.requests.completed, n);
    let a = r.control.autoscale.as_deref().unwrap();
    let actions: Vec<(i64, &str, usize)> = a
        .events
        .iter()
        .map(|e| (e.time_us, e.action, e.instance))
        .collect();
    assert_eq!(actions, [(1_000_000, "up", 2), (5_000_000, "ready", 2)]);
    let first = r
        .decisions
        .iter()
        .find(|d| d.stage == Some("decode") && d.instance == Some(2))
        .expect("a hand-off to the new decode replica");
    assert_eq!(first.time_us, 5_001_100);
    let x = &r.records[first.request_id as usize];
    assert_eq!(x.request.arrival_time_us, 5_000_000);
    // TTFT: its prefill step; E2E: + the transfer + 19 decode steps.
    assert_eq!(ttft(x), 1100);
    assert_eq!(
        x.outcome.last_chunk_time_us.unwrap() - x.request.arrival_time_us,
        1100 + 500 + 19 * 1100
    );
    // Billing: the prefill replica and the first decode replica from 0,
    // the second from its decision at 1 s, all to the last exit.
    let end = r
        .records
        .iter()
        .filter_map(|x| x.outcome.last_chunk_time_us)
        .max()
        .unwrap();
    let expected = (3 * end - 1_000_000) as f64 / 1e6;
    assert!(
        (a.replica_seconds() - expected).abs() < 1e-6,
        "{} vs {expected}",
        a.replica_seconds()
    );
    assert_eq!(a.fixed_replicas(), 1);
}
