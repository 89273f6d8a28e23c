//! The cluster: one instance is the single-instance path byte for byte,
//! runs are deterministic, the design's behaviour examples hold, and
//! invariants hold across random policy bundles (proptest).

use std::sync::Arc;

use assert_cmd::Command;
use blis_replay::cluster::Control;
use blis_replay::cluster::admission::AdmissionPolicy;
use blis_replay::cluster::disaggregation::PdConfig;
use blis_replay::cluster::policy::PolicyBundle;
use blis_replay::cluster::priority::PriorityPolicy;
use blis_replay::cluster::routing::{RoutingPolicy, Scorer};
use blis_replay::output::{Collector, Summary};
use blis_replay::sim::SimOptions;
use blis_replay::{EngineConfig, Instance, SchedulerPolicy, replay_cluster};
use blis_traces::{Mode, Request, Status, TraceHeader, TraceRecord};
use proptest::prelude::*;

use crate::common::{inputs, req, simple_model, slo, with_prefix};

fn bin() -> Command {
    Command::cargo_bin("blis-replay").expect("binary built")
}

const SPEC: &str = "
aggregate_rate: 40
num_requests: 1500
seed: 11
clients:
  - id: chat
    tenant_id: a
    slo_class: critical
    rate_fraction: 0.6
    streaming: true
    prefix_group: sys-chat
    prefix_length: 600
    arrival: {process: gamma, cv: 2.0}
    input_distribution: {type: lognormal, params: {mu: 6.5, sigma: 0.6, max: 4000}}
    output_distribution: {type: exponential, params: {mean: 120}}
  - id: agent
    tenant_id: b
    slo_class: batch
    rate_fraction: 0.4
    streaming: true
    prefix_group: sys-agent
    prefix_length: 1500
    input_distribution: {type: gaussian, params: {mean: 2500, std_dev: 600, min: 1600, max: 5000}}
    output_distribution: {type: exponential, params: {mean: 200}}
";

fn outputs(prefix: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    [
        "yaml",
        "csv",
        "itl.csv",
        "steps.csv",
        "metrics.csv",
        "summary.json",
    ]
    .iter()
    .map(|e| {
        let p = prefix.with_extension(e);
        (
            e.to_string(),
            std::fs::read(&p).unwrap_or_else(|_| panic!("{}", p.display())),
        )
    })
    .collect()
}

/// Replays the spec into `dir/name/out` (the header names its data files,
/// so runs to compare share the prefix's file name).
fn replay_cli(dir: &std::path::Path, name: &str, extra: &[&str]) -> Vec<(String, Vec<u8>)> {
    let spec = dir.join("w.yaml");
    std::fs::write(&spec, SPEC).unwrap();
    std::fs::create_dir_all(dir.join(name)).unwrap();
    let out = dir.join(name).join("out");
    let mut args = vec![
        "run",
        "--workload-spec",
        spec.to_str().unwrap(),
        "--model",
        "meta-llama/Llama-3.1-8B-Instruct",
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    bin().args(&args).assert().success();
    outputs(&out)
}

/// Acceptance 1: `--num-instances 1`, whatever the routing, is the
/// single-instance engine byte for byte.
#[test]
fn one_instance_is_the_single_instance_path_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let single = replay_cli(dir.path(), "single", &[]);
    for (name, extra) in [
        ("rr", vec!["--num-instances", "1"]),
        (
            "weighted",
            vec![
                "--num-instances",
                "1",
                "--routing",
                "weighted",
                "--routing-scorers",
                "prefix-affinity:3,queue-depth:2,kv-utilization:2,precise-prefix-cache:1",
                "--snapshot-refresh-interval-us",
                "50000",
            ],
        ),
    ] {
        let cluster = replay_cli(dir.path(), name, &extra);
        for ((ext, a), (_, b)) in single.iter().zip(&cluster) {
            assert!(a == b, "{name}: the .{ext} files differ");
        }
    }
}

/// Acceptance 1: the same seed gives byte-identical cluster runs
/// (`replay/benches/cluster-determinism.sh` repeats it 100 times).
#[test]
fn cluster_runs_are_byte_identical() {
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "--num-instances",
        "4",
        "--routing-scorers",
        "prefix-affinity:3,queue-depth:2,kv-utilization:2,no-hit-lru:1",
        "--snapshot-refresh-interval-us",
        "20000",
        "--admission",
        "token-bucket",
        "--token-bucket-capacity",
        "200000",
        "--token-bucket-refill-rate",
        "100000",
        "--fitness-weights",
        "throughput:0.5,p99_ttft:0.5",
    ];
    let first = replay_cli(dir.path(), "a", &args);
    for i in 0..2 {
        let again = replay_cli(dir.path(), &format!("b{i}"), &args);
        for ((ext, a), (_, b)) in first.iter().zip(&again) {
            assert!(a == b, "run {i}: the .{ext} files differ");
        }
    }
    let s: serde_json::Value = serde_json::from_slice(&first[5].1).unwrap();
    assert_eq!(s["cluster"]["num_instances"], 4);
    assert_eq!(s["cluster"]["instances"].as_array().unwrap().len(), 4);
    assert!(s["fitness"]["score"].as_f64().unwrap() > 0.0);
    assert!(s["jain_fairness"].as_f64().unwrap() > 0.0);
}

/// Issue 16: runs with the advanced deployments (an autoscaler, a P/D
/// split, each over a CPU KV tier) are byte-identical on reruns.
#[test]
fn advanced_deployment_runs_are_byte_identical() {
    let dir = tempfile::tempdir().unwrap();
    let tier = ["--total-kv-blocks", "600", "--kv-cpu-blocks", "4000"];
    let autoscaled = [
        "--autoscaler",
        "target-utilization",
        "--autoscaler-max",
        "4",
        "--autoscaler-interval-s",
        "1",
        "--provisioning-delay-s",
        "2",
        "--warmup-s",
        "1",
        "--autoscaler-cooldown-s",
        "3",
        "--drain-policy",
        "redirect",
        "--target-utilization",
        "0.3",
    ];
    let pd = [
        "--architecture",
        "pd",
        "--prefill-instances",
        "2",
        "--decode-instances",
        "2",
        "--decode-routing",
        "weighted",
    ];
    // All three: a P/D split whose decode pool is autoscaled, over a CPU tier.
    let pd_auto: Vec<&str> = pd
        .iter()
        .chain(&autoscaled[..autoscaled.len() - 4])
        .chain(&["--target-utilization", "0.3"])
        .copied()
        .collect();
    for (name, extra) in [
        ("auto", &autoscaled[..]),
        ("pd", &pd[..]),
        ("pd-auto", &pd_auto[..]),
    ] {
        let args: Vec<&str> = extra.iter().chain(&tier).copied().collect();
        let first = replay_cli(dir.path(), &format!("{name}-a"), &args);
        let again = replay_cli(dir.path(), &format!("{name}-b"), &args);
        for ((ext, a), (_, b)) in first.iter().zip(&again) {
            assert!(a == b, "{name}: the .{ext} files differ");
        }
        let s: serde_json::Value = serde_json::from_slice(&first[5].1).unwrap();
        assert!(s["kv"]["cpu_tier"].is_object(), "{name}");
        if name.starts_with("pd") {
            assert!(s["cluster"]["pd"].is_object(), "{name}");
        }
        if name.ends_with("auto") {
            assert!(s["cluster"]["autoscale"].is_object(), "{name}");
        }
    }
}

struct Run {
    summary: Summary,
    records: Vec<TraceRecord>,
    control: Control,
    insts: Vec<Instance>,
}

fn cluster(bundle: &PolicyBundle, cfg: EngineConfig, reqs: Vec<Request>) -> Run {
    cluster_with(bundle, cfg, reqs, true, 1)
}

/// [`cluster`] with metrics sampled every `sample_us` (`None`: none).
fn cluster_sampled(
    bundle: &PolicyBundle,
    cfg: EngineConfig,
    reqs: Vec<Request>,
    sample_us: Option<i64>,
) -> Run {
    cluster_opts(bundle, cfg, reqs, true, 1, sample_us, false)
}

/// [`cluster`], keeping private blocks out of the hash indexes or not, and
/// replaying the requests `replays` times in a row on the same instances
/// (each replay 10^10 µs after the last; the records of all, the summary of
/// the last).
fn cluster_with(
    bundle: &PolicyBundle,
    cfg: EngineConfig,
    reqs: Vec<Request>,
    private_blocks: bool,
    replays: u32,
) -> Run {
    cluster_opts(
        bundle,
        cfg,
        reqs,
        private_blocks,
        replays,
        Some(10_000),
        false,
    )
}

fn cluster_opts(
    bundle: &PolicyBundle,
    cfg: EngineConfig,
    reqs: Vec<Request>,
    private_blocks: bool,
    replays: u32,
    sample_us: Option<i64>,
    ids_unique: bool,
) -> Run {
    let mut cfg = cfg;
    if let Some(s) = bundle.scheduler {
        cfg.scheduler = s;
    }
    let mut insts: Vec<Instance> = (0..bundle.instance_count())
        .map(|_| Instance::new(cfg.clone(), simple_model()))
        .collect();
    let mut control = Control::new(bundle, insts.len());
    control.allow_private_blocks(private_blocks);
    control.set_ids_unique(ids_unique);
    let mut records = Vec::new();
    let mut summary = None;
    for round in 0..replays {
        let mut reqs = reqs.clone();
        for r in &mut reqs {
            r.arrival_time_us += i64::from(round) * 10_000_000_000;
        }
        let inputs = inputs(reqs);
        let mut sink = Collector::in_memory(0);
        let opts = SimOptions {
            sample_interval_us: sample_us,
            horizon_us: None,
        };
        replay_cluster(&mut insts, &mut control, inputs, &opts, &mut sink);
        for i in &insts {
            i.check().expect("instance invariants at the end");
        }
        let snaps: Vec<_> = insts.iter().map(Instance::snapshot).collect();
        let (s, recs) = sink
            .finish(
                &TraceHeader::new(Mode::Replayed),
                &blis_replay::sim::merged(&snaps),
                "test",
            )
            .unwrap();
        let mut recs = recs.unwrap();
        recs.sort_by_key(|r| r.request.request_id);
        records.extend(recs);
        summary = Some(s);
    }
    let summary = summary.expect("one replay at least");
    Run {
        summary,
        records,
        control,
        insts,
    }
}

fn bundle(n: u32, routing: RoutingPolicy) -> PolicyBundle {
    PolicyBundle {
        num_instances: n,
        routing,
        ..PolicyBundle::default()
    }
}

/// A router that hashes prompts hands each request's hash list to the
/// instance with room for the request's whole life (a hash per block,
/// prompt and output), so that the instance does not reallocate it; and
/// never with more room than the KV cache has blocks, even for an output
/// no cache could hold (such a request is refused by the instance).
#[test]
fn a_routed_hash_list_has_room_for_the_requests_life_and_no_more() {
    let weighted = RoutingPolicy::Weighted {
        scorers: [(Scorer::PrefixAffinity, 3.0), (Scorer::QueueDepth, 2.0)].into(),
    };
    let b = bundle(2, weighted);
    let cfg = EngineConfig {
        total_kv_blocks: 300,
        ..EngineConfig::default()
    };
    let bs = cfg.block_size as usize;
    let insts: Vec<Instance> = (0..2)
        .map(|_| Instance::new(cfg.clone(), simple_model()))
        .collect();
    let mut control = Control::new(&b, insts.len());
    let rec = TraceRecord::planned(with_prefix(req(0, 0, 1000, 200), "sys", 512));
    control.route(0, &rec, &insts);
    let hashes = control.take_hashes();
    assert_eq!(hashes.len(), 1000 / bs, "the prompt's full blocks");
    assert!(
        hashes.capacity() >= 1200usize.div_ceil(bs),
        "room for {} blocks, not the life's {}",
        hashes.capacity(),
        1200usize.div_ceil(bs)
    );
    let rec = TraceRecord::planned(req(1, 0, 1000, u32::MAX));
    control.route(0, &rec, &insts);
    let hashes = control.take_hashes();
    assert_eq!(hashes.len(), 1000 / bs);
    assert!(
        hashes.capacity() <= 301,
        "room for {} blocks in a cache of 300",
        hashes.capacity()
    );
}

/// Acceptance 2: a request whose prefix is cached on instance 0 only goes
/// to instance 0 under prefix-affinity, even when instance 0 is busier.
#[test]
fn prefix_affinity_sends_a_cached_prefix_to_its_instance() {
    let weighted = RoutingPolicy::Weighted {
        scorers: [(Scorer::PrefixAffinity, 3.0), (Scorer::QueueDepth, 2.0)].into(),
    };
    let reqs = vec![
        // 0: the prefix arrives first and lands on instance 0 (a tie).
        with_prefix(req(0, 0, 2048, 20), "sys", 2000),
        // Long unrelated work on both instances (least load first, ties to
        // instance 0): 1 → 1, 2 → 0, 3 → 0, 4 → 1.
        req(1, 1_000, 200, 2000),
        req(2, 100_000, 200, 2000),
        req(3, 101_000, 200, 2000),
        req(4, 102_000, 200, 2000),
        // 5: the prefix comes back while both instances are equally busy.
        with_prefix(req(5, 500_000, 2100, 20), "sys", 2000),
    ];
    let r = cluster(&bundle(2, weighted), EngineConfig::default(), reqs.clone());
    let cached = r.records[5].outcome.cached_tokens.unwrap();
    assert!(
        cached >= 1984,
        "request 5 found its prefix cached ({cached} tokens)"
    );
    assert_eq!(r.control.routed, vec![4, 2]);
    assert_eq!(r.insts[0].counters().prefix_hits, u64::from(cached));
    assert_eq!(r.insts[1].counters().prefix_hits, 0);
    // Round-robin sends request 5 to instance 1 (its turn), which has
    // never seen the prefix.
    let r = cluster(
        &bundle(2, RoutingPolicy::RoundRobin),
        EngineConfig::default(),
        reqs,
    );
    assert_eq!(r.records[5].outcome.cached_tokens, Some(0));
    assert_eq!(r.control.routed, vec![3, 3]);
}

/// Acceptance 2: under priority-fcfs a realtime request queued behind a
/// batch one is scheduled first.
#[test]
fn priority_fcfs_schedules_a_realtime_request_before_a_queued_batch_one() {
    let mut b = bundle(2, RoutingPolicy::RoundRobin);
    b.scheduler = Some(SchedulerPolicy::PriorityFcfs);
    let cfg = EngineConfig {
        max_num_seqs: 1,
        ..EngineConfig::default()
    };
    let reqs = vec![
        slo(req(0, 0, 100, 100), "batch"),       // instance 0, running
        slo(req(1, 0, 100, 100), "batch"),       // instance 1, running
        slo(req(2, 1_000, 100, 10), "batch"),    // instance 0, waits
        slo(req(3, 2_000, 100, 10), "batch"),    // instance 1, waits
        slo(req(4, 3_000, 100, 10), "critical"), // instance 0, waits behind 2
    ];
    let r = cluster(&b, cfg.clone(), reqs.clone());
    let first = |i: usize| r.records[i].outcome.first_chunk_time_us.unwrap();
    assert!(first(4) < first(2), "the realtime request went first");
    // No inversion; but the running batch request completes while the
    // critical one waits behind it: head-of-line blocking.
    assert_eq!(r.summary.anomalies.priority_inversions, 0);
    assert_eq!(r.summary.anomalies.hol_blocking_events, 1);
    // FCFS keeps the queue order: request 2 is scheduled while the
    // critical request 4 waits, an inversion.
    b.scheduler = Some(SchedulerPolicy::Fcfs);
    let r = cluster(&b, cfg, reqs);
    let first = |i: usize| r.records[i].outcome.first_chunk_time_us.unwrap();
    assert!(first(2) < first(4));
    assert_eq!(r.summary.anomalies.priority_inversions, 1);
    assert_eq!(r.summary.anomalies.hol_blocking_events, 2);
}

/// `slo-based` priority (BLIS: class score + age weight × age): a standard
/// request that has waited more than (100 − 50) / 10 = 5 s longer than a
/// realtime one goes first; one that has waited less does not; by SLO
/// class alone the realtime one always goes first.
#[test]
fn slo_based_priority_lets_a_long_waiting_request_overtake_a_new_realtime_one() {
    let mut b = bundle(1, RoutingPolicy::RoundRobin);
    b.scheduler = Some(SchedulerPolicy::PriorityFcfs);
    let cfg = EngineConfig {
        max_num_seqs: 1,
        ..EngineConfig::default()
    };
    // Request 0 holds the only seat for 6000 × 1.1 ms = 6.6 s.
    let standard_first = |b: &PolicyBundle, realtime_at: i64| {
        let reqs = vec![
            slo(req(0, 0, 10, 6000), "batch"),
            slo(req(1, 1_000, 10, 5), "standard"),
            slo(req(2, realtime_at, 10, 5), "realtime"),
        ];
        let r = cluster(b, cfg.clone(), reqs);
        let first = |i: usize| r.records[i].outcome.first_chunk_time_us.unwrap();
        first(1) < first(2)
    };
    assert!(!standard_first(&b, 5_500_000));
    b.priority = PriorityPolicy::from_name("slo-based").unwrap();
    assert!(standard_first(&b, 5_500_000), "waited 5.5 s longer");
    assert!(!standard_first(&b, 4_000_000), "waited 4 s longer");
}

/// Acceptance 2: a token bucket rejects exactly the requests that exceed
/// it; they appear in the output as errors naming the policy.
#[test]
fn token_bucket_rejects_exactly_the_requests_beyond_the_bucket() {
    let mut b = bundle(2, RoutingPolicy::LeastLoaded);
    b.admission = AdmissionPolicy::TokenBucket {
        capacity: 1000.0,
        refill_rate: 1000.0,
    };
    let reqs = vec![
        req(0, 0, 400, 5),
        req(1, 0, 400, 5),
        req(2, 0, 400, 5),       // 200 left: rejected
        req(3, 100_000, 300, 5), // 200 + 100 refilled = 300: admitted
        req(4, 100_000, 1, 5),   // empty: rejected
        req(5, 600_000, 500, 5), // 500 refilled: admitted
    ];
    let r = cluster(&b, EngineConfig::default(), reqs);
    let rejected: Vec<u64> = r
        .records
        .iter()
        .filter(|x| x.outcome.status == Some(Status::Error))
        .map(|x| x.request.request_id)
        .collect();
    assert_eq!(rejected, vec![2, 4]);
    assert!(r.records[2].outcome.error_message.contains("token-bucket"));
    assert_eq!(r.summary.requests.rejected, 2);
    assert_eq!(r.summary.requests.completed, 4);
    assert_eq!(r.control.routed.iter().sum::<u64>(), 4);
}

/// Acceptance 2: least-loaded spreads a burst evenly.
#[test]
fn least_loaded_spreads_a_burst_evenly() {
    let reqs: Vec<Request> = (0..40).map(|i| req(i, 0, 300, 50)).collect();
    let r = cluster(
        &bundle(4, RoutingPolicy::LeastLoaded),
        EngineConfig::default(),
        reqs.clone(),
    );
    assert_eq!(r.control.routed, vec![10, 10, 10, 10]);
    // always-busiest piles it onto one instance.
    let r = cluster(
        &bundle(4, RoutingPolicy::AlwaysBusiest),
        EngineConfig::default(),
        reqs,
    );
    assert_eq!(r.control.routed, vec![40, 0, 0, 0]);
}

fn any_routing() -> impl Strategy<Value = RoutingPolicy> {
    prop_oneof![
        Just(RoutingPolicy::RoundRobin),
        Just(RoutingPolicy::LeastLoaded),
        Just(RoutingPolicy::AlwaysBusiest),
        prop::collection::btree_map(
            prop_oneof![
                Just(Scorer::PrefixAffinity),
                Just(Scorer::PrecisePrefixCache),
                Just(Scorer::NoHitLru),
                Just(Scorer::QueueDepth),
                Just(Scorer::KvUtilization),
                Just(Scorer::LoadBalance),
            ],
            0.1f64..5.0,
            1..4
        )
        .prop_map(|scorers| RoutingPolicy::Weighted { scorers }),
        Just(RoutingPolicy::DecisionTree {
            tree: serde_saphyr::from_str(
                "when: {any: [{signal: kv_usage, above: 0.5}, {signal: slo_class, is: batch}]}\n\
                 then: {score: {load-balance: 1, kv-utilization: 1}}\n\
                 else: {score: {constant: 0.1, prefix-affinity: 2, queue-depth: 1}}\n"
            )
            .expect("a tree"),
        }),
        Just(RoutingPolicy::Code {
            source: "fn route(r, xs) { let s = []; for x in xs { s.push(x.prefix_match - 0.1 * x.load.to_float()); } s }".into(),
            max_operations: 100_000,
        }),
    ]
}

fn any_admission() -> impl Strategy<Value = AdmissionPolicy> {
    prop_oneof![
        Just(AdmissionPolicy::AlwaysAdmit),
        Just(AdmissionPolicy::RejectAll),
        (500.0f64..20_000.0, 1_000.0f64..100_000.0).prop_map(|(capacity, refill_rate)| {
            AdmissionPolicy::TokenBucket {
                capacity,
                refill_rate,
            }
        }),
        (1.0f64..200.0, 1.0f64..10.0)
            .prop_map(|(rate, burst)| AdmissionPolicy::RateLimit { rate, burst }),
        (1u32..6).prop_map(|m| AdmissionPolicy::TenantQuota {
            default_max_in_flight: m,
            quotas: Default::default(),
        }),
    ]
}

prop_compose! {
    fn any_bundle()(
        n in 1u32..6,
        routing in any_routing(),
        admission in any_admission(),
        refresh in prop_oneof![Just(0i64), 1_000i64..200_000],
        flow in prop::option::of((0.5f64..6.0, 0.3f64..1.0)),
        latency in prop_oneof![Just(0i64), 0i64..20_000],
        priority in prop::sample::select(vec!["slo-class", "constant", "slo-based", "inverted-slo"]),
        scheduler in prop::sample::select(vec![SchedulerPolicy::Fcfs, SchedulerPolicy::PriorityFcfs]),
        pd in prop::option::of((1u32..3, 1u32..3, any_routing(), 0.0f64..500.0)),
        scale in prop::option::of(any_autoscale()),
    ) -> PolicyBundle {
        let pd = pd.map(|(p, d, decode_routing, latency)| PdConfig {
            prefill_instances: p,
            decode_instances: d,
            decode_routing,
            transfer_latency_us: latency,
            transfer_bandwidth_gb_s: 10.0,
            block_bytes: Some(131_072.0),
        });
        PolicyBundle {
            // (A P/D split's decode pool drains by waiting.)
            autoscale: scale.map(|mut a| {
                if pd.is_some() {
                    a.drain = blis_replay::cluster::autoscale::DrainPolicy::Wait;
                }
                a
            }),
            pd,
            num_instances: n,
            routing,
            admission,
            snapshot_refresh_interval_us: refresh,
            flow_control: flow.map(|(q, kv)| blis_replay::cluster::policy::FlowControl {
                queue_depth_threshold: q,
                kv_utilization_threshold: kv,
            }),
            routing_latency_us: latency,
            priority: PriorityPolicy::from_name(priority).unwrap(),
            scheduler: Some(scheduler),
            ..PolicyBundle::default()
        }
    }
}

/// An autoscaler of either template and any drain policy, scaling within
/// the requests' 2 s (evaluations every 50-400 ms, replicas ready 0-300 ms
/// after a scale-up).
fn any_autoscale() -> impl Strategy<Value = blis_replay::cluster::autoscale::AutoscaleConfig> {
    use blis_replay::cluster::autoscale::{AutoscaleConfig, DrainPolicy, ScalerKind};
    (
        any::<bool>(),
        1u32..3,
        0u32..4,
        0.05f64..0.4,
        (0.0f64..0.3, 0.0f64..0.3, 0.05f64..0.3, 0.35f64..1.0),
        0.0f64..1.0,
        prop::sample::select(vec![
            DrainPolicy::Wait,
            DrainPolicy::Immediate,
            DrainPolicy::Redirect,
        ]),
        0.5f64..10.0,
    )
        .prop_map(
            |(target, min, extra, interval, (prov, warm, down, up), cooldown, drain, queue)| {
                AutoscaleConfig {
                    policy: if target {
                        ScalerKind::TargetUtilization
                    } else {
                        ScalerKind::Threshold
                    },
                    min_replicas: min,
                    max_replicas: min + extra,
                    interval_s: interval,
                    scale_up_threshold: up,
                    scale_up_queue_depth: queue,
                    scale_down_threshold: down.min(up * 0.9),
                    target_utilization: up,
                    cooldown_s: cooldown,
                    provisioning_delay_s: prov,
                    model_load_s: 0.0,
                    warmup_s: warm,
                    drain,
                    ..AutoscaleConfig::default()
                }
            },
        )
}

/// No CPU KV tier (half the cases), or one of any size, threshold and
/// offload policy.
fn any_tier() -> impl Strategy<Value = Option<blis_replay::engine::kv_tier::CpuTierConfig>> {
    prop_oneof![
        Just(None),
        (20u32..2000, 0.0f64..1.0, 0i64..100_000, any::<bool>()).prop_map(
            |(cpu_blocks, th, window, eager)| {
                use blis_replay::engine::kv_tier::OffloadPolicy;
                Some(blis_replay::engine::kv_tier::CpuTierConfig {
                    policy: if eager {
                        OffloadPolicy::Eager
                    } else {
                        OffloadPolicy::OnEvict
                    },
                    cpu_blocks,
                    offload_threshold: th,
                    transfer_bandwidth_gb_s: 16.0,
                    transfer_base_latency_us: 25.0,
                    block_bytes: 524_288.0,
                    thrashing_window_us: window,
                })
            }
        ),
    ]
}

prop_compose! {
    fn any_requests()(spec in prop::collection::vec((0i64..2_000_000, 1u32..3000, 1u32..300, 0u8..4, 0u8..3, prop::option::weighted(0.25, 1_000i64..400_000)), 1..120)) -> Vec<Request> {
        spec.into_iter().enumerate().map(|(i, (at, input, output, group, tenant, timeout))| {
            let mut r = req(i as u64, at, input, output);
            // A quarter of the clients give up (timeout-heavy cases).
            r.deadline_us = timeout.map(|t| at + t);
            r.slo_class = Arc::from(["standard", "realtime", "batch"][usize::from(tenant)]);
            r.tenant_id = Arc::from(format!("t{tenant}").as_str());
            if group > 0 {
                r = with_prefix(r, &format!("g{group}"), input.min(800));
            }
            r
        }).collect()
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(crate::common::cases(64)))]

    /// Acceptance 3: request conservation (rejected included), KV
    /// conservation per instance (checked at the end by each instance),
    /// causality; the clock's monotonicity is asserted inside the loop.
    #[test]
    fn cluster_invariants_hold_for_any_bundle(b in any_bundle(), reqs in any_requests(), small_kv in any::<bool>(), tier in any_tier()) {
        let cfg = EngineConfig {
            max_num_seqs: 8,
            total_kv_blocks: if small_kv { 300 } else { 5000 },
            max_num_batched_tokens: 1024,
            cpu_tier: tier,
            ..EngineConfig::default()
        };
        let n = reqs.len() as u64;
        let r = cluster(&b, cfg.clone(), reqs.clone());
        // Determinism: a rerun gives the same records and summary.
        let again = cluster(&b, cfg, reqs);
        prop_assert_eq!(format!("{:?}", &again.records), format!("{:?}", &r.records));
        prop_assert_eq!(format!("{:?}", &again.summary), format!("{:?}", &r.summary));
        let c = &r.summary.requests;
        prop_assert_eq!(c.total, n);
        prop_assert_eq!(c.completed + c.rejected + c.dropped + c.cancelled + c.unfinished + c.input_errors + c.scaled_down, n);
        let scaled = r.control.autoscale.as_deref();
        let redirected = scaled.map_or(0, |a| a.counters.redirected);
        prop_assert_eq!(r.control.routed.iter().sum::<u64>(), n - c.rejected + redirected);
        prop_assert_eq!(r.control.admission.rejected, c.rejected);
        if let Some(a) = scaled {
            use blis_replay::cluster::autoscale::Lifecycle;
            // Instances added and drained: the requests cut off are the
            // scaled-down ones; no replica is left draining with nothing
            // to finish; the ready never exceed the slots; the cost is at
            // most every slot for the whole run.
            prop_assert_eq!(a.counters.drain_cut, c.scaled_down);
            let (ready, starting, draining) = a.replicas();
            prop_assert_eq!(draining, 0);
            prop_assert!(ready + starting >= a.config().min_replicas);
            prop_assert!(a.counters.peak_ready <= a.config().max_replicas);
            // (The last request leaves by its last token or its deadline.)
            let end = r.records.iter().filter_map(|x| x.outcome.last_chunk_time_us.or(x.outcome.send_time_us).max(x.request.deadline_us)).max().unwrap_or(0);
            prop_assert!(a.replica_seconds() >= 0.0);
            let slots = f64::from(a.config().max_replicas + a.fixed_replicas());
            prop_assert!(a.replica_seconds() <= slots * (end as f64 / 1e6 + a.config().interval_s) + 1e-9);
            for (i, inst) in r.insts.iter().enumerate() {
                if a.state(i) == Lifecycle::Off {
                    prop_assert_eq!(inst.in_system(), 0);
                }
            }
            let mut last = i64::MIN;
            for e in &a.events {
                prop_assert!(e.time_us >= last);
                last = e.time_us;
            }
        }
        for (i, inst) in r.insts.iter().enumerate() {
            // P/D: the decode pool's router routed the decode instances'.
            let (control, j) = r.control.routing_of(i);
            // Every request routed here entered its queue or was dropped,
            // but those whose client gave up on the way (before the
            // routing latency passed, or while a P/D transfer ran).
            let taken = inst.counters().enqueued + inst.counters().dropped;
            prop_assert!(taken <= control.routed[j]);
            if c.cancelled == 0 && scaled.is_none() {
                prop_assert_eq!(taken, control.routed[j]);
            }
            prop_assert_eq!(control.in_flight(j), 0);
            prop_assert_eq!(inst.in_system(), 0);
            prop_assert_eq!(inst.held_blocks(), 0);
        }
        for x in &r.records {
            if x.outcome.status == Some(Status::Ok) {
                let (s, f, l) = (x.outcome.send_time_us.unwrap(), x.outcome.first_chunk_time_us.unwrap(), x.outcome.last_chunk_time_us.unwrap());
                prop_assert!(s >= x.request.arrival_time_us && s <= f && f <= l);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(crate::common::cases(48)))]

    /// Routing reads each instance as single steps would have left it,
    /// also in the middle of a fast-forwarded run, and metric samples
    /// change nothing: the results are the same with fast-forward on or
    /// off and with or without samples (the samples too, but for the count
    /// of fast-forwarded steps).
    #[test]
    fn cluster_results_depend_neither_on_fast_forward_nor_on_sampling(
        b in any_bundle(), reqs in any_requests(), small_kv in any::<bool>(), tier in any_tier(),
    ) {
        let cfg = EngineConfig {
            max_num_seqs: 8,
            total_kv_blocks: if small_kv { 300 } else { 5000 },
            max_num_batched_tokens: 1024,
            cpu_tier: tier,
            ..EngineConfig::default()
        };
        let off = EngineConfig { fast_forward: false, ..cfg.clone() };
        let strip = |mut s: blis_replay::output::Summary| {
            s.fast_forwarded_steps = 0;
            serde_json::to_string(&s).unwrap()
        };
        let on_sampled = cluster_sampled(&b, cfg.clone(), reqs.clone(), Some(7_000));
        let off_sampled = cluster_sampled(&b, off, reqs.clone(), Some(7_000));
        let on_unsampled = cluster_sampled(&b, cfg, reqs, None);
        prop_assert_eq!(&on_sampled.records, &off_sampled.records);
        prop_assert_eq!(&on_sampled.records, &on_unsampled.records);
        prop_assert_eq!(strip(on_sampled.summary), strip(off_sampled.summary));
    }
}

/// Decision traces: one line per request with what the router saw, every
/// candidate's score, the regret against the best and the outcome;
/// weighted routing picks its best candidate (no regret), round-robin
/// ignores load (regret against the least loaded).
#[test]
fn decision_traces_record_scores_regret_and_outcomes() {
    let dir = tempfile::tempdir().unwrap();
    for (name, routing, k) in [("rr", "round-robin", "2"), ("w", "weighted", "3")] {
        replay_cli(
            dir.path(),
            name,
            &[
                "--num-requests",
                "300",
                "--num-instances",
                "3",
                "--routing",
                routing,
                "--trace-level",
                "decisions",
                "--counterfactual-k",
                k,
            ],
        );
        let text =
            std::fs::read_to_string(dir.path().join(name).join("out.decisions.jsonl")).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 300, "{name}");
        let mut regret = 0.0;
        for d in &lines {
            assert_eq!(d["seen"].as_array().unwrap().len(), 3);
            assert_eq!(d["scores"].as_array().unwrap().len(), 3);
            assert_eq!(
                d["top_k"].as_array().unwrap().len(),
                k.parse::<usize>().unwrap()
            );
            assert_eq!(d["status"], "ok");
            assert!(d["e2e_ms"].as_f64().unwrap() > 0.0);
            let r = d["regret"].as_f64().unwrap();
            assert!(r >= 0.0);
            regret += r;
        }
        if routing == "weighted" {
            assert_eq!(regret, 0.0, "weighted routing takes its best candidate");
        } else {
            assert!(regret > 0.0, "round-robin ignores load");
        }
        let s: serde_json::Value = serde_json::from_slice(
            &std::fs::read(dir.path().join(name).join("out.summary.json")).unwrap(),
        )
        .unwrap();
        // Per SLO class figures add up.
        let classes = s["slo_classes"].as_object().unwrap();
        assert_eq!(classes.len(), 2);
        let total: u64 = classes.values().map(|c| c["total"].as_u64().unwrap()).sum();
        assert_eq!(total, 300);
    }
}

/// `--admission-latency-us` and `--routing-latency-us` delay each
/// request's entry, so an idle server's TTFT grows by exactly their sum.
#[test]
fn admission_and_routing_latencies_delay_entry() {
    let reqs = vec![req(0, 0, 500, 10), req(1, 1_000_000, 500, 10)];
    let mut b = bundle(2, RoutingPolicy::RoundRobin);
    let base = cluster(&b, EngineConfig::default(), reqs.clone());
    b.admission_latency_us = 5_000;
    b.routing_latency_us = 3_000;
    let late = cluster(&b, EngineConfig::default(), reqs);
    for i in 0..2 {
        let t = |r: &Run| r.records[i].ttft_us().unwrap();
        assert_eq!(t(&late) - t(&base), 8_000);
    }
}

/// Flow control: a burst waits in the gateway queue while the cluster is
/// saturated, and a realtime request that arrives behind it is routed
/// before the waiting batch requests (late binding, priority order), where
/// without flow control it queues behind them at its instance.
#[test]
fn flow_control_routes_urgent_requests_first_when_room_frees() {
    let cfg = EngineConfig {
        max_num_seqs: 1,
        ..EngineConfig::default()
    };
    let mut reqs: Vec<Request> = (0..8)
        .map(|i| {
            let mut r = req(i, 0, 200, 50);
            r.slo_class = Arc::from("batch");
            r
        })
        .collect();
    let mut urgent = req(8, 1_000, 200, 50);
    urgent.slo_class = Arc::from("critical");
    reqs.push(urgent);
    let plain = cluster(
        &bundle(2, RoutingPolicy::RoundRobin),
        cfg.clone(),
        reqs.clone(),
    );
    let mut b = bundle(2, RoutingPolicy::RoundRobin);
    b.flow_control = Some(blis_replay::cluster::policy::FlowControl {
        queue_depth_threshold: 1.0,
        kv_utilization_threshold: 0.9,
    });
    let flow = cluster(&b, cfg, reqs);
    assert_eq!(flow.summary.requests.completed, 9);
    let ttft = |r: &Run| r.records[8].ttft_us().unwrap();
    assert!(
        ttft(&flow) < ttft(&plain),
        "urgent TTFT with flow control {} µs, without {} µs",
        ttft(&flow),
        ttft(&plain)
    );
    // The batch requests still all ran, in arrival order per class.
    let first = |i: usize| flow.records[i].outcome.first_chunk_time_us.unwrap();
    assert!(first(8) < first(7));
}

/// A repeated request id arriving while the first request with that id
/// runs but has committed nothing private yet (its prompt is all shared
/// prefix; its output will fill the block the second one's body reaches):
/// the first must commit the rest of its blocks to the index, or both
/// would hold the same content. Found by the property test below.
#[test]
fn a_repeated_id_shares_the_first_requests_later_blocks() {
    let reqs = vec![
        with_prefix(req(6, 0, 600, 9), "g1", 600),
        with_prefix(req(6, 6734, 1024, 17), "g1", 600),
        req(1002, 20821, 1, 1),
    ];
    let b = bundle(1, RoutingPolicy::RoundRobin);
    let cfg = EngineConfig {
        max_num_seqs: 8,
        total_kv_blocks: 3000,
        max_num_batched_tokens: 1024,
        ..EngineConfig::default()
    };
    let fast = cluster_with(&b, cfg.clone(), reqs.clone(), true, 1);
    let plain = cluster_with(&b, cfg, reqs, false, 1);
    // (Before the fix, indexing the first's later private block panicked:
    // its content was held twice.)
    assert_eq!(
        format!("{:?}", fast.records),
        format!("{:?}", plain.records)
    );
    assert_eq!(fast.insts[0].counters(), plain.insts[0].counters());
    assert_eq!(
        fast.insts[0].kv().evictions(),
        plain.insts[0].kv().evictions()
    );
}

/// The engine of the private-content tests: 8 sequences, a 1,024-token
/// budget, a small cache when `small_kv` (preemptions), the CPU tier `tier`.
fn content_engine(
    small_kv: bool,
    tier: Option<blis_replay::engine::kv_tier::CpuTierConfig>,
) -> EngineConfig {
    EngineConfig {
        max_num_seqs: 8,
        total_kv_blocks: if small_kv { 300 } else { 3000 },
        max_num_batched_tokens: 1024,
        cpu_tier: tier,
        ..EngineConfig::default()
    }
}

/// Two replays of the same requests gave the same records, summary, and
/// per instance the same counters, evictions, KV use and snapshot.
fn same_replays(a: &Run, b: &Run) -> Result<(), TestCaseError> {
    prop_assert_eq!(format!("{:?}", a.records), format!("{:?}", b.records));
    prop_assert_eq!(
        serde_json::to_string(&a.summary).unwrap(),
        serde_json::to_string(&b.summary).unwrap()
    );
    for (x, y) in a.insts.iter().zip(&b.insts) {
        prop_assert_eq!(x.counters(), y.counters());
        prop_assert_eq!(x.kv().evictions(), y.kv().evictions());
        prop_assert_eq!(x.kv().used(), y.kv().used());
        prop_assert_eq!(x.snapshot(), y.snapshot());
    }
    Ok(())
}

prop_compose! {
    /// Requests mixing every kind of content: shared prefixes, bodies of
    /// their own, sessions (a round's input holds the last one's output),
    /// explicit content keys, Mooncake hash ids, and repeated request ids
    /// (whose bodies are then the same content).
    fn mixed_content_requests()(spec in prop::collection::vec(
        (0i64..1_500_000, 1u32..2500, 1u32..300, 0u8..4, 0u8..6, 0u64..400),
        1..100,
    )) -> Vec<Request> {
        let mut rounds = std::collections::BTreeMap::new();
        spec.into_iter().enumerate().map(|(i, (at, input, output, group, kind, id))| {
            // A repeated id now and then.
            let id = if kind == 5 { id % 8 } else { 1000 + i as u64 };
            let mut r = req(id, at, input, output);
            if group > 0 {
                r = with_prefix(r, &format!("g{group}"), input.min(600));
            }
            match kind {
                1 => {
                    let round = rounds.entry(group).or_insert(0u32);
                    r.session_id = Arc::from(format!("s{group}").as_str());
                    r.round_index = *round;
                    *round += 1;
                }
                2 => r.content_key = Some(u64::from(group)),
                3 => {
                    r.hash_ids = Some(blis_traces::HashIds {
                        block_tokens: 16,
                        ids: Arc::from((0..input.div_ceil(32)).map(|j| u64::from(group) * 100 + u64::from(j)).collect::<Vec<u64>>()),
                    });
                }
                _ => {}
            }
            r
        }).collect()
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(crate::common::cases(128)))]

    /// Keeping blocks private to their request out of the hash indexes (a
    /// speed-up) changes nothing: every record, the summary and every
    /// instance's counters and evictions are the same as with every block
    /// indexed, under preemption (a small cache), repeated request ids,
    /// sessions, content keys and hash ids, for any bundle, and when the
    /// instances replay the same requests (the same ids) again.
    #[test]
    fn private_blocks_change_no_output(b in any_bundle(), reqs in mixed_content_requests(), small_kv in any::<bool>(), replays in 1u32..3, tier in any_tier()) {
        let cfg = content_engine(small_kv, tier);
        // (An autoscaler evaluates every interval of the 10^4 s between
        // replays in a row: one replay with it.)
        let replays = if b.autoscale.is_some() { 1 } else { replays };
        let fast = cluster_with(&b, cfg.clone(), reqs.clone(), true, replays);
        let plain = cluster_with(&b, cfg, reqs, false, replays);
        same_replays(&fast, &plain)?;
    }

    /// Forgetting private content when its request leaves (request ids
    /// promised unique, instances used once) changes nothing either, under
    /// preemption, aborts (client timeouts), sessions, content keys and
    /// hash ids, for any bundle (P/D included), with or without a CPU
    /// tier (eager or on-evict: forgotten content is offloaded as such).
    #[test]
    fn forgetting_private_content_changes_no_output(b in any_bundle(), reqs in mixed_content_requests(), small_kv in any::<bool>(), tier in any_tier(), timeout in prop::option::of(20_000i64..400_000)) {
        let cfg = content_engine(small_kv, tier);
        // Unique ids (the promise), and client timeouts now and then.
        let mut reqs = reqs;
        for (i, r) in reqs.iter_mut().enumerate() {
            r.request_id = 5000 + i as u64;
            if i % 3 == 0 {
                r.deadline_us = timeout.map(|t| r.arrival_time_us + t);
            }
        }
        let forget = cluster_opts(&b, cfg.clone(), reqs.clone(), true, 1, Some(10_000), true);
        let plain = cluster_opts(&b, cfg, reqs, false, 1, Some(10_000), false);
        same_replays(&forget, &plain)?;
    }
}

/// A request of a found case (tenant `t0`, class `standard`, prefix group
/// `g` of `pl` tokens unless `g` is empty).
fn pr(id: u64, at: i64, i: u32, o: u32, g: &str, pl: u32) -> Request {
    let mut r = req(id, at, i, o);
    r.tenant_id = Arc::from("t0");
    r.slo_class = Arc::from("standard");
    if !g.is_empty() {
        r = with_prefix(r, g, pl);
    }
    r
}

/// A found case: a P/D hand-off counted the prompt blocks its decode
/// instance held as of the start of that instance's fast-forwarded run,
/// not as of the hand-off (one block more to move with fast-forward off).
#[test]
fn a_hand_off_sees_its_decode_instance_as_of_the_hand_off() {
    let reqs = vec![
        pr(0, 1239371, 1, 2, "", 0),
        pr(1, 953416, 624, 2, "g1", 624),
        pr(2, 0, 496, 2, "g3", 496),
        pr(3, 1062761, 1, 2, "", 0),
        pr(4, 901797, 1582, 4, "", 0),
        pr(5, 811434, 250, 280, "g2", 250),
        pr(6, 2657, 1, 2, "", 0),
        pr(7, 1296177, 999, 2, "g3", 800),
        pr(8, 1200684, 800, 2, "g3", 800),
        pr(9, 1239338, 51, 49, "", 0),
        pr(10, 1200670, 744, 84, "g1", 744),
        pr(11, 953416, 1150, 68, "", 0),
        pr(12, 811434, 1, 2, "", 0),
    ];
    let b = PolicyBundle {
        num_instances: 3,
        admission: AdmissionPolicy::TokenBucket {
            capacity: 1925.4556618923866,
            refill_rate: 66453.96373395232,
        },
        routing: RoutingPolicy::RoundRobin,
        scheduler: Some(SchedulerPolicy::Fcfs),
        pd: Some(PdConfig {
            prefill_instances: 1,
            decode_instances: 2,
            decode_routing: RoutingPolicy::Weighted {
                scorers: [(blis_replay::cluster::routing::Scorer::NoHitLru, 0.1)].into(),
            },
            transfer_latency_us: 0.0,
            transfer_bandwidth_gb_s: 10.0,
            block_bytes: Some(131072.0),
        }),
        ..PolicyBundle::default()
    };
    let cfg = EngineConfig {
        max_num_seqs: 8,
        total_kv_blocks: 300,
        max_num_batched_tokens: 1024,
        ..EngineConfig::default()
    };
    let off = EngineConfig {
        fast_forward: false,
        ..cfg.clone()
    };
    let a = cluster_sampled(&b, cfg.clone(), reqs.clone(), Some(7_000));
    let c = cluster_sampled(&b, off, reqs.clone(), Some(7_000));
    let d = cluster_sampled(&b, cfg, reqs, None);
    assert_eq!(a.records, c.records);
    assert_eq!(a.records, d.records);
}

/// A found case: flow control routed a gateway request at the end of a
/// step of instance 1 while instance 0's fast-forwarded run had a step
/// ending at that very µs; the request joined instance 0's next batch,
/// which single steps had formed just before (instance 0 steps first).
#[test]
fn an_event_caused_by_a_step_sees_lower_instances_past_their_step_then() {
    let reqs = vec![
        pr(0, 47147, 16, 1, "", 0),
        pr(1, 1054722, 16, 1, "g1", 16),
        pr(2, 48308, 16, 1, "g3", 16),
        pr(3, 440860, 1025, 271, "", 0),
        pr(4, 114703, 16, 23, "g1", 16),
        pr(5, 926140, 359, 44, "g1", 359),
        pr(6, 593053, 1, 1, "", 0),
        pr(7, 308577, 610, 26, "g1", 610),
        pr(8, 366267, 2777, 242, "g2", 800),
        pr(9, 366267, 1861, 64, "g3", 800),
        pr(10, 366267, 16, 1, "g1", 16),
        pr(11, 366267, 1, 1, "", 0),
        pr(12, 366267, 1, 1, "", 0),
        pr(13, 328427, 423, 141, "g1", 423),
        pr(14, 366267, 1, 1, "", 0),
        pr(15, 47137, 2941, 191, "", 0),
        pr(16, 114703, 326, 225, "g2", 326),
        pr(17, 114703, 2793, 227, "g2", 800),
        pr(18, 315808, 2014, 209, "g3", 800),
        pr(19, 48309, 336, 215, "g3", 336),
        pr(20, 366267, 1, 1, "", 0),
    ];
    let b = PolicyBundle {
        num_instances: 2,
        admission: AdmissionPolicy::TokenBucket {
            capacity: 14947.055105588472,
            refill_rate: 12145.938950724161,
        },
        routing: RoutingPolicy::Weighted {
            scorers: [
                (
                    blis_replay::cluster::routing::Scorer::PrefixAffinity,
                    4.3033798462873945,
                ),
                (blis_replay::cluster::routing::Scorer::LoadBalance, 0.1),
            ]
            .into(),
        },
        scheduler: Some(SchedulerPolicy::Fcfs),
        priority: PriorityPolicy::from_name("constant").unwrap(),
        flow_control: Some(blis_replay::cluster::policy::FlowControl {
            queue_depth_threshold: 0.885909772702035,
            kv_utilization_threshold: 0.3406293459913331,
        }),
        ..PolicyBundle::default()
    };
    let cfg = EngineConfig {
        max_num_seqs: 8,
        total_kv_blocks: 300,
        max_num_batched_tokens: 1024,
        ..EngineConfig::default()
    };
    let off = EngineConfig {
        fast_forward: false,
        ..cfg.clone()
    };
    let a = cluster_sampled(&b, cfg.clone(), reqs.clone(), Some(7_000));
    let c = cluster_sampled(&b, off, reqs.clone(), Some(7_000));
    let d = cluster_sampled(&b, cfg, reqs, None);
    assert_eq!(a.records, c.records);
    assert_eq!(a.records, d.records);
}

/// A found case: with flow control, a request cancelled before it entered
/// its instance's queue freed room that single steps used at the next
/// step's end, and a fast-forwarded run only at its own end.
#[test]
fn room_freed_by_a_cancellation_is_used_at_once() {
    type Spec = (
        (u64, i64, u32, u32),
        (&'static str, &'static str, &'static str, u32),
        Option<i64>,
    );
    let spec: Vec<Spec> = vec![
        ((0, 402407, 1, 1), ("t0", "standard", "", 0), Some(403961)),
        ((1, 1088588, 1001, 220), ("t0", "standard", "g2", 800), None),
        ((2, 597930, 92, 198), ("t1", "realtime", "g2", 92), None),
        ((3, 391165, 2822, 263), ("t1", "realtime", "g2", 800), None),
        (
            (4, 684729, 1676, 190),
            ("t1", "realtime", "g3", 800),
            Some(1036914),
        ),
        ((5, 494302, 2461, 96), ("t1", "realtime", "", 0), None),
        ((6, 422563, 501, 148), ("t1", "realtime", "g3", 501), None),
        ((7, 416528, 2869, 172), ("t1", "realtime", "g3", 800), None),
        ((8, 743458, 4, 220), ("t2", "batch", "", 0), None),
        (
            (9, 1265553, 458, 159),
            ("t0", "standard", "", 0),
            Some(1287793),
        ),
        ((10, 481480, 530, 155), ("t0", "standard", "", 0), None),
    ];
    let reqs: Vec<Request> = spec
        .into_iter()
        .map(|((id, at, i, o), (t, c, g, pl), dl)| {
            let mut r = req(id, at, i, o);
            r.tenant_id = Arc::from(t);
            r.slo_class = Arc::from(c);
            if !g.is_empty() {
                r = with_prefix(r, g, pl);
            }
            r.deadline_us = dl;
            r
        })
        .collect();
    let b = PolicyBundle {
        num_instances: 1,
        admission: AdmissionPolicy::TokenBucket {
            capacity: 17321.0011728097,
            refill_rate: 28996.745297276328,
        },
        routing: RoutingPolicy::RoundRobin,
        scheduler: Some(SchedulerPolicy::Fcfs),
        routing_latency_us: 1,
        flow_control: Some(blis_replay::cluster::policy::FlowControl {
            queue_depth_threshold: 0.5,
            kv_utilization_threshold: 0.3,
        }),
        ..PolicyBundle::default()
    };
    let cfg = EngineConfig {
        max_num_seqs: 8,
        total_kv_blocks: 300,
        max_num_batched_tokens: 1024,
        ..EngineConfig::default()
    };
    let off = EngineConfig {
        fast_forward: false,
        ..cfg.clone()
    };
    let a = cluster_sampled(&b, cfg.clone(), reqs.clone(), Some(7_000));
    let c = cluster_sampled(&b, off, reqs.clone(), Some(7_000));
    let d = cluster_sampled(&b, cfg, reqs, None);
    assert_eq!(a.records, c.records);
    assert_eq!(a.records, d.records);
}

/// A decision tree with one leaf is its leaf's weighted template: the same
/// decisions, byte for byte (only the policy's name differs).
#[test]
fn a_one_leaf_decision_tree_routes_as_its_weighted_template() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("tree.yaml");
    std::fs::write(
        &bundle,
        "num_instances: 4\nrouting:\n  policy: decision-tree\n  tree: {score: {prefix-affinity: 3, queue-depth: 2}}\n",
    )
    .unwrap();
    let common = ["--num-requests", "600"];
    let tree = replay_cli(
        dir.path(),
        "tree",
        &[&common[..], &["--policy-config", bundle.to_str().unwrap()]].concat(),
    );
    let weighted = replay_cli(
        dir.path(),
        "weighted",
        &[
            &common[..],
            &[
                "--num-instances",
                "4",
                "--routing",
                "weighted",
                "--routing-scorers",
                "prefix-affinity:3,queue-depth:2",
            ],
        ]
        .concat(),
    );
    for ((ext, a), (_, b)) in tree.iter().zip(&weighted) {
        if ext == "summary.json" {
            let mut a: serde_json::Value = serde_json::from_slice(a).unwrap();
            let mut b: serde_json::Value = serde_json::from_slice(b).unwrap();
            assert_eq!(a["cluster"]["routing"]["policy"], "decision-tree");
            assert_eq!(b["cluster"]["routing"]["policy"], "weighted");
            a["cluster"]["routing"] = serde_json::Value::Null;
            b["cluster"]["routing"] = serde_json::Value::Null;
            assert_eq!(a, b);
        } else {
            assert!(a == b, "{ext} differs");
        }
    }
}

/// A tree's rules decide per request and per instance, and the decision
/// trace names the leaf the chosen instance reached.
#[test]
fn a_decision_tree_routes_by_its_rules_and_traces_the_leaf() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("tree.yaml");
    // Batch requests (the agent client) go to the least loaded instance of
    // 0 and 1 only (2 and 3 score −1 for them); the others by prefix.
    std::fs::write(
        &bundle,
        "num_instances: 4
routing:
  policy: decision-tree
  tree:
    when: {signal: slo_class, is: batch}
    then:
      when: {signal: load, at_least: 1000000}
      then: {score: {constant: -2}}
      else: {score: {load-balance: 1}}
    else: {score: {prefix-affinity: 3, queue-depth: 2}}
",
    )
    .unwrap();
    replay_cli(
        dir.path(),
        "tree",
        &[
            "--num-requests",
            "400",
            "--policy-config",
            bundle.to_str().unwrap(),
            "--trace-level",
            "decisions",
        ],
    );
    let text =
        std::fs::read_to_string(dir.path().join("tree").join("out.decisions.jsonl")).unwrap();
    let mut paths = std::collections::BTreeMap::new();
    for l in text.lines() {
        let d: serde_json::Value = serde_json::from_str(l).unwrap();
        let p = d["tree_path"].as_str().expect("a leaf path").to_string();
        *paths.entry(p).or_insert(0) += 1;
        assert_eq!(d["regret"], 0.0, "the best score is chosen");
    }
    assert_eq!(paths.len(), 2, "{paths:?}");
    assert!(paths["routing.tree.then.else"] > 50, "{paths:?}");
    assert!(paths["routing.tree.else"] > 50, "{paths:?}");
}

/// A tree that is not one is refused with the file and the node's path.
#[test]
fn a_bad_decision_tree_names_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("bad.yaml");
    std::fs::write(
        &bundle,
        "num_instances: 2\nrouting:\n  policy: decision-tree\n  tree:\n    when: {signal: load, above: 3}\n    then: {score: {constant: 1}}\n    else:\n      when: {signal: queue, above: 1}\n      then: {score: {constant: 1}}\n      else: {score: {constant: 0}}\n",
    )
    .unwrap();
    let spec = dir.path().join("w.yaml");
    std::fs::write(&spec, SPEC).unwrap();
    let out = bin()
        .args([
            "run",
            "--workload-spec",
            spec.to_str().unwrap(),
            "--model",
            "meta-llama/Llama-3.1-8B-Instruct",
            "--policy-config",
            bundle.to_str().unwrap(),
            "--out",
            dir.path().join("o").to_str().unwrap(),
        ])
        .assert()
        .failure()
        .get_output()
        .clone();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.yaml")
            && err.contains("routing.tree.else.when.signal: unknown signal \"queue\""),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    let out = bin()
        .args([
            "run",
            "--routing",
            "decision-tree",
            "--workload-spec",
            spec.to_str().unwrap(),
            "--out",
            "x",
        ])
        .assert()
        .failure()
        .get_output()
        .clone();
    assert!(String::from_utf8_lossy(&out.stderr).contains("give the tree in a --policy-config"));
}

/// Programs equivalent to the built-in templates, run as evolved-code
/// policies: the same decisions, every output byte for byte (only the
/// policy's name differs in the summary).
#[test]
fn code_equivalent_to_each_template_routes_as_it_does() {
    const LEAST_LOADED: &str = "fn route(r, xs) {\n  let best = -1;\n  for i in 0..xs.len() {\n    if xs[i].available && (best < 0 || xs[i].load < xs[best].load) { best = i; }\n  }\n  best\n}\n";
    const ROUND_ROBIN: &str = "fn route(r, xs) { r.decision % xs.len() }\n";
    const ALWAYS_BUSIEST: &str =
        "fn route(r, xs) {\n  let s = [];\n  for x in xs { s.push(x.load.to_float()); }\n  s\n}\n";
    // weighted prefix-affinity:3, queue-depth:2 (weights normalised to
    // 0.6, 0.4; queue depth min-max normalised, least loaded 1).
    const WEIGHTED: &str = "fn route(r, xs) {\n  let lo = xs[0].load; let hi = xs[0].load;\n  for x in xs { if x.load < lo { lo = x.load; } if x.load > hi { hi = x.load; } }\n  let scores = [];\n  for x in xs {\n    let q = if hi > lo { 1.0 - (x.load - lo).to_float() / (hi - lo).to_float() } else { 1.0 };\n    let s = 0.0;\n    s += 0.6 * x.prefix_match;\n    s += 0.4 * q;\n    scores.push(s);\n  }\n  scores\n}\n";
    let dir = tempfile::tempdir().unwrap();
    for (name, program, flags) in [
        (
            "least-loaded",
            LEAST_LOADED,
            vec!["--routing", "least-loaded"],
        ),
        ("round-robin", ROUND_ROBIN, vec!["--routing", "round-robin"]),
        (
            "always-busiest",
            ALWAYS_BUSIEST,
            vec!["--routing", "always-busiest"],
        ),
        (
            "weighted",
            WEIGHTED,
            vec![
                "--routing",
                "weighted",
                "--routing-scorers",
                "prefix-affinity:3,queue-depth:2",
            ],
        ),
    ] {
        let bundle = dir.path().join(format!("{name}.yaml"));
        let text = format!(
            "num_instances: 4\nrouting:\n  policy: code\n  source: |\n{}",
            program
                .lines()
                .map(|l| format!("    {l}\n"))
                .collect::<String>()
        );
        std::fs::write(&bundle, text).unwrap();
        let code = replay_cli(
            dir.path(),
            &format!("{name}-code"),
            &[
                "--num-requests",
                "500",
                "--policy-config",
                bundle.to_str().unwrap(),
            ],
        );
        let builtin = replay_cli(
            dir.path(),
            &format!("{name}-builtin"),
            &[
                &["--num-requests", "500", "--num-instances", "4"][..],
                &flags,
            ]
            .concat(),
        );
        for ((ext, a), (_, b)) in code.iter().zip(&builtin) {
            if ext == "summary.json" {
                let mut a: serde_json::Value = serde_json::from_slice(a).unwrap();
                let mut b: serde_json::Value = serde_json::from_slice(b).unwrap();
                assert_eq!(a["cluster"]["routing"]["policy"], "code", "{name}");
                a["cluster"]["routing"] = serde_json::Value::Null;
                b["cluster"]["routing"] = serde_json::Value::Null;
                assert_eq!(a, b, "{name}");
            } else {
                assert!(a == b, "{name}: {ext} differs");
            }
        }
    }
}

/// A program that loops forever, or that answers nonsense mid-run, fails
/// the run with the decision and the reason, quickly (a per-call budget),
/// and the command exits with a usage error.
#[test]
fn a_failing_program_fails_the_run_with_its_reason() {
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("w.yaml");
    std::fs::write(&spec, SPEC).unwrap();
    for (name, program, expect) in [
        (
            "loop",
            "fn route(r, xs) { loop { } }",
            "decision 0: ran past its budget of 100000 operations",
        ),
        (
            "late",
            "fn route(r, xs) { if r.decision == 40 { xs.len() } else { 0 } }",
            "decision 40: returned instance 4, not in 0..4",
        ),
        (
            "nan",
            "fn route(r, xs) { [0.0 / 0.0, 1.0, 1.0, 1.0] }",
            "score 0 is NaN",
        ),
    ] {
        let bundle = dir.path().join(format!("{name}.yaml"));
        std::fs::write(
            &bundle,
            format!("num_instances: 4\nrouting:\n  policy: code\n  source: '{program}'\n"),
        )
        .unwrap();
        let out = bin()
            .args([
                "run",
                "--workload-spec",
                spec.to_str().unwrap(),
                "--num-requests",
                "300",
                "--model",
                "meta-llama/Llama-3.1-8B-Instruct",
                "--policy-config",
                bundle.to_str().unwrap(),
                "--out",
                dir.path().join(name).to_str().unwrap(),
            ])
            .assert()
            .code(1)
            .get_output()
            .clone();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("routing code failed at") && err.contains(expect),
            "{name}: {err}"
        );
    }
    // A syntax error is refused when the bundle is read, with its line.
    let bundle = dir.path().join("syntax.yaml");
    std::fs::write(
        &bundle,
        "num_instances: 2\nrouting:\n  policy: code\n  source: |\n    fn route(r, xs) {\n      let = 3;\n    }\n",
    )
    .unwrap();
    let out = bin()
        .args([
            "run",
            "--workload-spec",
            spec.to_str().unwrap(),
            "--policy-config",
            bundle.to_str().unwrap(),
            "--out",
            dir.path().join("s").to_str().unwrap(),
        ])
        .assert()
        .failure()
        .get_output()
        .clone();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("syntax.yaml") && err.contains("routing.source") && err.contains("line 2"),
        "{err}"
    );
}

/// Replays `bundle` (YAML text) on [`SPEC`]'s first `n` requests: the
/// outputs, with `rename` (the policy's name in the rejected rows and the
/// summary) replaced by `as_name`, and the summary's `cluster` section
/// left out.
fn bundle_outputs(
    dir: &std::path::Path,
    name: &str,
    n: usize,
    bundle: &str,
    rename: (&str, &str),
    extra: &[&str],
) -> Vec<(String, Vec<u8>)> {
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(&path, bundle).unwrap();
    let n = n.to_string();
    let args = [
        &[
            "--num-requests",
            &n,
            "--policy-config",
            path.to_str().unwrap(),
        ][..],
        extra,
    ]
    .concat();
    let outs = replay_cli(dir, name, &args);
    outs.into_iter()
        .map(|(ext, bytes)| {
            if ext == "summary.json" {
                let mut v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
                v["cluster"] = serde_json::Value::Null;
                (ext, serde_json::to_vec(&v).unwrap())
            } else {
                let text = String::from_utf8(bytes).unwrap();
                let from = format!("admission policy {}", rename.0);
                let to = format!("admission policy {}", rename.1);
                (ext, text.replace(&from, &to).into_bytes())
            }
        })
        .collect()
}

/// Asserts that each of `equivalents` (its policy's name in the rejected
/// rows, a bundle) replayed as `name` gives `want` byte for byte.
fn assert_equivalent(
    dir: &std::path::Path,
    name: &str,
    n: usize,
    want: &[(String, Vec<u8>)],
    equivalents: &[(&str, String)],
    extra: &[&str],
) {
    for (i, (kind, bundle)) in equivalents.iter().enumerate() {
        let got = bundle_outputs(dir, &format!("{name}-{i}"), n, bundle, (kind, name), extra);
        for ((ext, a), (_, b)) in got.iter().zip(want) {
            assert!(a == b, "{name} as equivalent {i} ({kind}): {ext} differs");
        }
    }
}

fn indent(program: &str) -> String {
    program.lines().map(|l| format!("    {l}\n")).collect()
}

/// A decision tree and a program equivalent to a template of each policy
/// kind (admission, priority, scheduling, autoscaling) give that
/// template's outputs byte for byte (the policy's own name aside), and
/// each template changes the run (the equivalence is not vacuous).
#[test]
fn trees_and_programs_of_every_policy_kind_match_their_templates() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // Admission: tenant-quota, and a token bucket kept in the program's
    // state (`this`).
    const TOKEN_BUCKET: &str = "fn admit(r, c) {\n  if this.level == () { this.level = 20000.0; this.last = 0; }\n  let dt = c.now_us - this.last;\n  if dt < 0 { dt = 0; }\n  if c.now_us > this.last { this.last = c.now_us; }\n  let level = this.level + 30000.0 * (dt.to_float() / 1000000.0);\n  if level > 20000.0 { level = 20000.0; }\n  let cost = r.input_tokens.to_float();\n  if level >= cost { this.level = level - cost; true } else { this.level = level; false }\n}\n";
    let plain = bundle_outputs(d, "plain", 500, "num_instances: 4\n", ("", ""), &[]);
    for (template, equivalents) in [
        (
            "num_instances: 4\nadmission: {policy: tenant-quota, default_max_in_flight: 6}\n",
            vec![
                (
                    "decision-tree",
                    "num_instances: 4\nadmission:\n  policy: decision-tree\n  tree:\n    when: {signal: tenant_in_flight, at_least: 6}\n    then: {admit: false}\n    else: {admit: true}\n".to_string(),
                ),
                (
                    "code",
                    "num_instances: 4\nadmission:\n  policy: code\n  source: 'fn admit(r, c) { c.tenant_in_flight < 6 }'\n".to_string(),
                ),
            ],
        ),
        (
            "num_instances: 4\nadmission: {policy: token-bucket, capacity: 20000, refill_rate: 30000}\n",
            vec![(
                "code",
                format!(
                    "num_instances: 4\nadmission:\n  policy: code\n  source: |\n{}",
                    indent(TOKEN_BUCKET)
                ),
            )],
        ),
    ] {
        let name = if template.contains("tenant") {
            "tenant-quota"
        } else {
            "token-bucket"
        };
        let want = bundle_outputs(d, name, 500, template, ("", ""), &[]);
        assert!(want != plain, "{name} rejects nothing");
        assert_equivalent(d, name, 500, &want, &equivalents, &[]);
    }
    // Priority (slo-based, aged) and scheduling (priority-fcfs) on 2
    // instances, where requests queue.
    let fcfs = bundle_outputs(d, "fcfs", 600, "num_instances: 2\n", ("", ""), &[]);
    let slo_based = "num_instances: 2\nscheduler: priority-fcfs\npriority: {policy: slo-based, age_weight: 10}\n";
    let priority_tree = "num_instances: 2\nscheduler: priority-fcfs\npriority:\n  policy: decision-tree\n  age_weight: 10\n  tree:\n    when: {signal: slo_class, is: critical}\n    then: {priority: {constant: -100}}\n    else:\n      when: {signal: slo_class, is: batch}\n      then: {priority: {constant: -10}}\n      else: {priority: {constant: -50}}\n";
    let priority_code = "num_instances: 2\nscheduler: priority-fcfs\npriority:\n  policy: code\n  age_weight: 10\n  source: 'fn priority(r) { if r.slo_class == \"critical\" { -100 } else if r.slo_class == \"batch\" { -10 } else { -50 } }'\n";
    let by_priority = "num_instances: 2\nscheduler: priority-fcfs\n";
    let scheduling_tree =
        "num_instances: 2\nscheduling:\n  policy: decision-tree\n  tree: {key: {priority: 1}}\n";
    let scheduling_code =
        "num_instances: 2\nscheduling:\n  policy: code\n  source: 'fn key(r, i) { r.priority }'\n";
    for (name, template, equivalents) in [
        ("slo-based", slo_based, [priority_tree, priority_code]),
        (
            "priority-fcfs",
            by_priority,
            [scheduling_tree, scheduling_code],
        ),
    ] {
        let want = bundle_outputs(d, name, 600, template, ("", ""), &[]);
        assert!(want != fcfs, "{name} orders nothing");
        let equivalents = equivalents.map(|b| ("", b.to_string()));
        assert_equivalent(d, name, 600, &want, &equivalents, &[]);
    }
    // Autoscaling: the threshold template.
    let common = "num_instances: 1\nautoscale:\n  min_replicas: 1\n  max_replicas: 4\n  interval_s: 5\n  provisioning_delay_s: 2\n  warmup_s: 3\n  cooldown_s: 10\n";
    let threshold = format!("{common}  policy: threshold\n");
    let tree = format!(
        "{common}  policy: decision-tree\n  tree:\n    when:\n      all:\n        - any: [{{signal: utilization, at_least: 0.8}}, {{signal: queue_depth, at_least: 8}}]\n        - {{signal: starting, at_most: 0}}\n    then: {{scale: 1}}\n    else:\n      when: {{all: [{{signal: utilization, at_most: 0.3}}, {{signal: since_last_scale_s, at_least: 10}}]}}\n      then: {{scale: -1}}\n      else: {{scale: 0}}\n"
    );
    let code = format!(
        "{common}  policy: code\n  source: |\n    fn scale(c) {{\n      let hot = c.utilization >= 0.8 || c.queue_depth >= 8.0;\n      if hot && c.starting == 0.0 {{ return 1; }}\n      if c.utilization <= 0.3 && c.since_last_scale_s >= 10.0 {{ return -1; }}\n      0\n    }}\n"
    );
    let want = bundle_outputs(d, "threshold", 1500, &threshold, ("", ""), &[]);
    let fixed = bundle_outputs(d, "fixed", 1500, "num_instances: 1\n", ("", ""), &[]);
    assert!(want != fixed, "the autoscaler never scales");
    assert_equivalent(d, "threshold", 1500, &want, &[("", tree), ("", code)], &[]);
}

/// A program of each kind that fails mid-run fails the run with its kind,
/// the decision and the reason (exit 1); a tree of each kind with a bad
/// node is refused when the bundle is read, naming the node's path.
#[test]
fn failing_programs_and_bad_trees_of_every_kind_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("w.yaml");
    std::fs::write(&spec, SPEC).unwrap();
    let run = |name: &str, bundle: &str| {
        let path = dir.path().join(format!("{name}.yaml"));
        std::fs::write(&path, bundle).unwrap();
        let out = bin()
            .args([
                "run",
                "--workload-spec",
                spec.to_str().unwrap(),
                "--num-requests",
                "300",
                "--model",
                "meta-llama/Llama-3.1-8B-Instruct",
                "--policy-config",
                path.to_str().unwrap(),
                "--out",
                dir.path().join(name).to_str().unwrap(),
            ])
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    for (name, bundle, expect) in [
        (
            "admit-text",
            "num_instances: 2\nadmission: {policy: code, source: 'fn admit(r, c) { if r.input_tokens > 0 { \"yes\" } else { true } }'}\n",
            "admission code failed at decision 0: returned a string, not true (admit) or false (reject)",
        ),
        (
            "priority-nan",
            "num_instances: 2\npriority: {policy: code, source: 'fn priority(r) { 0.0 / 0.0 }'}\n",
            "priority code failed at decision 0: the priority is NaN",
        ),
        (
            "key-loop",
            "num_instances: 2\nscheduling: {policy: code, max_operations: 5000, source: 'fn key(r, i) { loop {} }'}\n",
            "scheduling code failed at decision 0: ran past its budget of 5000 operations",
        ),
        (
            "scale-late",
            "num_instances: 1\nautoscale: {policy: code, interval_s: 1, source: 'fn scale(c) { if c.now_us > 3000000 { throw \"confused\" } 0 }'}\n",
            "autoscaling code failed at decision 3",
        ),
    ] {
        let (code, err) = run(name, bundle);
        assert_eq!(code, Some(1), "{name}: {err}");
        assert!(err.contains(expect), "{name}: {err}");
    }
    for (name, bundle, expect) in [
        (
            "admission-leaf",
            "num_instances: 2\nadmission: {policy: decision-tree, tree: {when: {signal: waiting, above: 9}, then: {admit: false}, else: {score: {constant: 1}}}}\n",
            "admission.tree.else.score: not a leaf of this policy (its leaves are admit)",
        ),
        (
            "priority-term",
            "num_instances: 2\npriority: {policy: decision-tree, tree: {priority: {output_tokens: 1}}}\n",
            "priority.tree.priority.output_tokens: unknown term",
        ),
        (
            "scheduling-signal",
            "num_instances: 2\nscheduling: {policy: decision-tree, tree: {when: {signal: load, above: 1}, then: {key: {constant: 0}}, else: {key: {constant: 1}}}}\n",
            "scheduling.tree.when.signal: unknown signal \"load\"",
        ),
        (
            "scheduling-beside-sjf",
            "num_instances: 2\nscheduler: sjf\nscheduling: {policy: decision-tree, tree: {key: {constant: 0}}}\n",
            "scheduler must be left out (or priority-fcfs) when scheduling gives the order",
        ),
        (
            "autoscale-missing",
            "num_instances: 1\nautoscale: {policy: decision-tree, tree: {when: {signal: utilization, above: 0.8}, then: {scale: 1}}}\n",
            "autoscale.tree: a branch needs when, then and else (else missing)",
        ),
        (
            "admission-syntax",
            "num_instances: 2\nadmission:\n  policy: code\n  source: |\n    fn admit(r, c) {\n      let = 1;\n    }\n",
            "admission.source",
        ),
    ] {
        let (code, err) = run(name, bundle);
        assert_ne!(code, Some(0), "{name}");
        assert!(
            err.contains(&format!("{name}.yaml")) && err.contains(expect),
            "{name}: {err}"
        );
    }
}

/// `examples/policy_search/every-kind.yaml` (a tree or program for each
/// policy kind) reads and runs, and its admission tree sheds work.
#[test]
fn the_every_kind_example_runs() {
    let dir = tempfile::tempdir().unwrap();
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let out = bin()
        .args([
            "run",
            "--workload-spec",
            examples
                .join("policy_search/shared-prefixes.yaml")
                .to_str()
                .unwrap(),
            "--num-requests",
            "3000",
            // 1.5× the spec's rate: its 40 req/s of 3,000 requests leave
            // four replicas below the autoscaler tree's thresholds.
            "--aggregate-rate",
            "60",
            "--model",
            "meta-llama/Llama-3.1-8B-Instruct",
            "--total-kv-blocks",
            "6000",
            "--policy-config",
            examples
                .join("policy_search/every-kind.yaml")
                .to_str()
                .unwrap(),
            "--trace-level",
            "decisions",
            "--out",
            dir.path().join("out").to_str().unwrap(),
        ])
        .assert()
        .success()
        .get_output()
        .clone();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("admission decision-tree")
            && text.contains("· priority code · scheduling decision-tree ·")
            && text.contains("autoscaler (decision-tree"),
        "{text}"
    );
    // The slots the autoscaler never started are not "idle instances".
    assert!(!text.contains("got no request"), "{text}");
    // Each decision records the leaves its request reached in every tree.
    let decisions = std::fs::read_to_string(dir.path().join("out.decisions.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = decisions
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let routed: Vec<&serde_json::Value> = lines.iter().filter(|d| d["admitted"] == true).collect();
    assert!(!routed.is_empty());
    for d in &routed {
        assert_eq!(d["admission_path"], "admission.tree.else", "{d}");
        let s = d["scheduling_path"].as_str().unwrap();
        assert!(
            s == "scheduling.tree.then" || s == "scheduling.tree.else",
            "{d}"
        );
        assert!(
            d.get("priority_path").is_none(),
            "a program has no path: {d}"
        );
    }
    assert!(
        lines
            .iter()
            .any(|d| d["scheduling_path"] == "scheduling.tree.else")
    );
    let scaled: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|d| d["kind"] == "scale" && d["action"] == "up")
        .collect();
    assert!(!scaled.is_empty(), "no scale-up");
    for e in scaled {
        assert_eq!(e["tree_path"], "autoscale.tree.then", "{e}");
    }
}

/// The rest of the templates, each with a tree or a program (or both)
/// that gives its outputs byte for byte, the policy's name aside:
/// always-admit, reject-all, rate-limit (its bucket in `this`),
/// slo-class, constant, inverted-slo, reverse-priority and the
/// target-utilization autoscaler (program only: its leaf is a formula), and
/// the `fcfs` and `sjf` wait queues (scheduling with `preempt: latest`).
#[test]
fn every_other_template_has_an_equivalent_tree_or_program() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    const RATE_LIMIT: &str = "fn admit(r, c) {\n  if this.level == () { this.level = 5.0; this.last = 0; }\n  let dt = c.now_us - this.last;\n  if dt < 0 { dt = 0; }\n  if c.now_us > this.last { this.last = c.now_us; }\n  let level = this.level + 20.0 * (dt.to_float() / 1000000.0);\n  if level > 5.0 { level = 5.0; }\n  if level >= 1.0 { this.level = level - 1.0; true } else { this.level = level; false }\n}\n";
    const TARGET: &str = "fn scale(c) {\n  let ratio = c.utilization / 0.6;\n  if (ratio - 1.0).abs() <= 0.1 { return 0; }\n  let desired = (c.ready * ratio).ceiling();\n  if desired < 1.0 { desired = 1.0; }\n  if desired > 1000000.0 { desired = 1000000.0; }\n  let desired = desired.to_int();\n  let current = c.current.to_int();\n  let cooled = c.since_last_scale_s >= 10.0;\n  if desired > current { desired - current } else if desired < current && cooled { desired - current } else { 0 }\n}\n";
    let classes = |scores: [&str; 3]| {
        format!(
            "    when: {{signal: slo_class, is: critical}}\n    then: {{priority: {{constant: {}}}}}\n    else:\n      when: {{signal: slo_class, is: batch}}\n      then: {{priority: {{constant: {}}}}}\n      else: {{priority: {{constant: {}}}}}\n",
            scores[0], scores[1], scores[2]
        )
    };
    let two = "num_instances: 2\nscheduler: priority-fcfs\n";
    let autoscale = "num_instances: 1\nautoscale:\n  min_replicas: 1\n  max_replicas: 4\n  interval_s: 5\n  provisioning_delay_s: 2\n  warmup_s: 3\n  cooldown_s: 10\n  target_utilization: 0.6\n";
    type Case<'a> = (&'a str, usize, String, Vec<(&'a str, String)>);
    let cases: Vec<Case> = vec![
        (
            "always-admit",
            500,
            "num_instances: 4\nadmission: {policy: always-admit}\n".into(),
            vec![
                ("decision-tree", "num_instances: 4\nadmission: {policy: decision-tree, tree: {admit: true}}\n".into()),
                ("code", "num_instances: 4\nadmission: {policy: code, source: 'fn admit(r, c) { true }'}\n".into()),
            ],
        ),
        (
            "reject-all",
            200,
            "num_instances: 4\nadmission: {policy: reject-all}\n".into(),
            vec![
                ("decision-tree", "num_instances: 4\nadmission: {policy: decision-tree, tree: {admit: false}}\n".into()),
                ("code", "num_instances: 4\nadmission: {policy: code, source: 'fn admit(r, c) { false }'}\n".into()),
            ],
        ),
        (
            "rate-limit",
            500,
            "num_instances: 4\nadmission: {policy: rate-limit, rate: 20, burst: 5}\n".into(),
            vec![(
                "code",
                format!("num_instances: 4\nadmission:\n  policy: code\n  source: |\n{}", indent(RATE_LIMIT)),
            )],
        ),
        (
            "slo-class",
            600,
            format!("{two}priority: {{policy: slo-class}}\n"),
            vec![
                ("", format!("{two}priority:\n  policy: decision-tree\n  tree:\n{}", classes(["0", "3", "1"]))),
                ("", format!("{two}priority: {{policy: code, source: 'fn priority(r) {{ if r.slo_class == \"critical\" {{ 0 }} else if r.slo_class == \"batch\" {{ 3 }} else {{ 1 }} }}'}}\n")),
            ],
        ),
        (
            "constant",
            600,
            format!("{two}priority: {{policy: constant}}\n"),
            vec![
                ("", format!("{two}priority: {{policy: decision-tree, tree: {{priority: {{constant: 0}}}}}}\n")),
                ("", format!("{two}priority: {{policy: code, source: 'fn priority(r) {{ 0 }}'}}\n")),
            ],
        ),
        (
            "inverted-slo",
            600,
            format!("{two}priority: {{policy: inverted-slo, age_weight: 10}}\n"),
            vec![
                ("", format!("{two}priority:\n  policy: decision-tree\n  age_weight: -10\n  tree:\n{}", classes(["-100", "-10", "-50"]))),
                ("", format!("{two}priority: {{policy: code, age_weight: -10, source: 'fn priority(r) {{ if r.slo_class == \"critical\" {{ -100 }} else if r.slo_class == \"batch\" {{ -10 }} else {{ -50 }} }}'}}\n")),
            ],
        ),
        (
            "reverse-priority",
            600,
            "num_instances: 2\nscheduler: reverse-priority\n".into(),
            vec![
                ("", "num_instances: 2\nscheduling: {policy: decision-tree, tree: {key: {priority: -1}}}\n".into()),
                ("", "num_instances: 2\nscheduling: {policy: code, source: 'fn key(r, i) { -r.priority }'}\n".into()),
            ],
        ),
        (
            "target-utilization",
            1500,
            format!("{autoscale}  policy: target-utilization\n"),
            vec![("", format!("{autoscale}  policy: code\n  source: |\n{}", indent(TARGET)))],
        ),
    ];
    for (name, n, template, equivalents) in cases {
        let want = bundle_outputs(d, name, n, &template, ("", ""), &[]);
        // Each template changes the run, but the two that behave as the
        // defaults do (always-admit; constant priorities order as fcfs).
        let baseline = match name {
            "always-admit" | "constant" => None,
            "reject-all" | "rate-limit" => Some("num_instances: 4\n"),
            "target-utilization" => Some("num_instances: 1\n"),
            _ => Some("num_instances: 2\n"),
        };
        if let Some(b) = baseline {
            let base = bundle_outputs(d, &format!("{name}-base"), n, b, ("", ""), &[]);
            assert!(want != base, "{name} changes nothing: the test is vacuous");
        }
        assert_equivalent(d, name, n, &want, &equivalents, &[]);
    }
    // fcfs and sjf with `preempt: latest`, on a KV cache small enough that
    // requests are preempted (with the default rule, highest key, sjf's
    // tree differs: the test would see it).
    let small = ["--total-kv-blocks", "1500"];
    let mut wants = Vec::new();
    for (name, template, key, program) in [
        ("fcfs", "num_instances: 2\n", "{constant: 0}", "0"),
        (
            "sjf",
            "num_instances: 2\nscheduler: sjf\n",
            "{input_tokens: 1}",
            "r.input_tokens",
        ),
    ] {
        let want = bundle_outputs(d, name, 600, template, ("", ""), &small);
        let tree = format!(
            "num_instances: 2\nscheduling: {{policy: decision-tree, preempt: latest, tree: {{key: {key}}}}}\n"
        );
        let code = format!(
            "num_instances: 2\nscheduling: {{policy: code, preempt: latest, source: 'fn key(r, i) {{ {program} }}'}}\n"
        );
        assert_equivalent(d, name, 600, &want, &[("", tree), ("", code)], &small);
        wants.push(want);
    }
    assert!(
        wants[0] != wants[1],
        "sjf orders as fcfs: the test is vacuous"
    );
    let highest_key = bundle_outputs(
        d,
        "sjf-highest-key",
        600,
        "num_instances: 2\nscheduling: {policy: decision-tree, tree: {key: {input_tokens: 1}}}\n",
        ("", ""),
        &small,
    );
    assert!(
        highest_key != wants[1],
        "no preemption: the rule is not tested"
    );
}
