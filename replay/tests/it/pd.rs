//! Prefill/decode disaggregation through the cluster driver: hand-computed
//! hand-offs with the round-number blackbox model (step = 1000 µs + 10 µs
//! per prefill token + 100 µs per decode token) and transfers of 100 µs +
//! 100 µs per KV block (100 kB blocks at 1 GB/s).

use blis_replay::cluster::Control;
use blis_replay::cluster::disaggregation::PdConfig;
use blis_replay::cluster::policy::PolicyBundle;
use blis_replay::cluster::routing::RoutingPolicy;
use blis_replay::output::{Collector, Summary};
use blis_replay::sim::{SimOptions, merged};
use blis_replay::{EngineConfig, Instance, replay_cluster};
use blis_traces::{Mode, Request, Status, TraceHeader, TraceRecord};

use crate::common::{e2e, inputs, req, simple_model, ttft};

fn split(p: u32, d: u32) -> PolicyBundle {
    PolicyBundle {
        num_instances: p + d,
        pd: Some(PdConfig {
            prefill_instances: p,
            decode_instances: d,
            decode_routing: RoutingPolicy::LeastLoaded,
            transfer_latency_us: 100.0,
            transfer_bandwidth_gb_s: 1.0,
            block_bytes: Some(100_000.0),
        }),
        ..PolicyBundle::default()
    }
}

/// Replays `reqs` (optionally cancelled `timeout_us` after their send) on
/// the split of `bundle`; the summary, the records by id and the instances.
fn run(
    bundle: &PolicyBundle,
    cfg: EngineConfig,
    reqs: Vec<Request>,
    timeout_us: Option<i64>,
) -> (Summary, Vec<TraceRecord>, Vec<Instance>, Control) {
    let mut insts: Vec<Instance> = (0..bundle.instance_count())
        .map(|_| Instance::new(cfg.clone(), simple_model()))
        .collect();
    let mut control = Control::new(bundle, insts.len());
    let inputs: Vec<_> = inputs(reqs)
        .into_iter()
        .map(|i| i.with_client_timeout(timeout_us))
        .collect();
    let mut sink = Collector::in_memory(0);
    // TTFT within 2 ms and TPOT within 1.3 ms: what the first test's
    // request just makes.
    sink.judge_slo("ttft_ms=2,tpot_ms=1.3".parse().unwrap());
    let opts = SimOptions {
        sample_interval_us: None,
        horizon_us: None,
    };
    replay_cluster(&mut insts, &mut control, inputs, &opts, &mut sink);
    for i in &insts {
        i.check().expect("instance invariants");
    }
    let snaps: Vec<_> = insts.iter().map(Instance::snapshot).collect();
    let (s, recs) = sink
        .finish(&TraceHeader::new(Mode::Replayed), &merged(&snaps), "test")
        .unwrap();
    let mut recs = recs.unwrap();
    recs.sort_by_key(|r| r.request.request_id);
    (s, recs, insts, control)
}

fn cfg() -> EngineConfig {
    EngineConfig {
        total_kv_blocks: 1000,
        ..EngineConfig::default()
    }
}

#[test]
fn a_request_is_prefilled_moved_and_decoded_elsewhere() {
    let (s, r, insts, control) = run(&split(1, 1), cfg(), vec![req(0, 0, 100, 5)], None);
    // Prefill: 1000 + 10·100 = 2000 µs; its first token is the TTFT.
    assert_eq!(ttft(&r[0]), 2000);
    // 7 blocks move in 100 + 7·100 = 800 µs: the decode instance takes it
    // at 2800 and decodes tokens 2..5 in steps of 1000 + 100.
    assert_eq!(e2e(&r[0]), 2800 + 4 * 1100);
    assert_eq!(r[0].outcome.num_chunks, 5);
    // The second token's gap holds the transfer: gaps 1.9, 1.1, 1.1, 1.1 ms.
    let itl = &s.itl_ms;
    assert_eq!(itl.n, Some(4));
    assert!((itl.mean - 1.3).abs() < 1e-9, "{itl:?}");
    // Each pool did its part; no blocks are left anywhere.
    let (p, d) = (insts[0].counters(), insts[1].counters());
    assert_eq!((p.generation_tokens, d.generation_tokens), (1, 4));
    assert_eq!((p.completed, d.completed), (1, 1));
    assert!(
        insts
            .iter()
            .all(|i| i.kv().used() == 0 && i.held_blocks() == 0)
    );
    let pd = control.pd.as_ref().unwrap();
    assert_eq!((pd.counters.transfers, pd.counters.blocks), (1, 7));
    assert_eq!(pd.counters.transfer_us, 800);
    assert_eq!(pd.counters.handoff_us, 800);
    assert_eq!(pd.decode.routed, vec![1]);
    // Its TPOT, (7200 - 2000) / 4 = 1.3 ms, and TTFT meet the SLO.
    let slo = s.slo.unwrap();
    assert_eq!((slo.requests, slo.attained), (1, 1));
}

#[test]
fn a_one_token_request_completes_on_its_prefill_instance() {
    let (_, r, insts, control) = run(&split(1, 1), cfg(), vec![req(0, 0, 100, 1)], None);
    assert_eq!((ttft(&r[0]), e2e(&r[0])), (2000, 2000));
    assert_eq!(insts[1].counters().enqueued, 0);
    assert_eq!(control.pd.unwrap().counters.transfers, 0);
}

#[test]
fn a_full_decode_instance_makes_the_transfer_wait_and_the_prefill_side_keep_the_blocks() {
    let one_seq = EngineConfig {
        max_num_seqs: 1,
        ..cfg()
    };
    // max_num_seqs 1 on both sides. Prefill: request 0 at 0..2000,
    // request 1 at 2000..4000. Request 0's blocks arrive at 2800 and it
    // decodes until 2800 + 4·1100 = 7200; request 1's arrive at 4800, find
    // the slot taken and wait, the prefill instance keeping them, until the
    // step that ends request 0 (7200).
    let (s, r, insts, control) = run(
        &split(1, 1),
        one_seq,
        vec![req(0, 0, 100, 5), req(1, 0, 100, 5)],
        None,
    );
    assert_eq!((ttft(&r[0]), ttft(&r[1])), (2000, 4000));
    assert_eq!(e2e(&r[0]), 7200);
    assert_eq!(e2e(&r[1]), 7200 + 4 * 1100);
    let pd = control.pd.as_ref().unwrap();
    assert_eq!(pd.counters.transfer_waits, 1);
    // Request 1's TTFT (4 ms) misses the 2 ms bound.
    let slo = s.slo.unwrap();
    assert_eq!((slo.requests, slo.attained), (2, 1));
    assert_eq!(pd.counters.handoff_us, 800 + (7200 - 4000));
    assert!(
        insts
            .iter()
            .all(|i| i.kv().used() == 0 && i.held_blocks() == 0)
    );
}

#[test]
fn a_client_that_gives_up_during_the_transfer_gets_its_first_token_only() {
    // Cancelled at 2500: after the first token (2000), before the blocks
    // arrive (2800).
    let (s, r, insts, _) = run(&split(1, 1), cfg(), vec![req(0, 0, 100, 5)], Some(2500));
    assert_eq!(r[0].outcome.status, Some(Status::Timeout));
    assert_eq!(r[0].outcome.num_chunks, 1);
    assert_eq!(s.requests.cancelled, 1);
    assert!(
        insts
            .iter()
            .all(|i| i.kv().used() == 0 && i.held_blocks() == 0)
    );
    assert_eq!(insts[1].counters().enqueued, 0);
}
