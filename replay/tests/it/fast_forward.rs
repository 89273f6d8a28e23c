//! Executing runs of identical decode steps as one event must not change a
//! single byte of the results.

use blis_replay::engine::kv_tier::{CpuTierConfig, OffloadPolicy};
use blis_replay::latency::roofline::Roofline;
use blis_replay::sim::SimOptions;
use blis_replay::{EngineConfig, Model, SchedulerPolicy};
use proptest::prelude::*;

use crate::common::{req, run_sampled, sim_request, simple_model, with_prefix};

fn both(cfg: EngineConfig, model: Model, reqs: Vec<blis_traces::Request>, sample: Option<i64>) {
    let opts = SimOptions {
        sample_interval_us: sample,
        horizon_us: None,
    };
    let on = EngineConfig {
        fast_forward: true,
        ..cfg.clone()
    };
    let off = EngineConfig {
        fast_forward: false,
        ..cfg
    };
    let (s1, r1, m1) = run_sampled(on, model.clone(), reqs.clone(), opts);
    let (s2, r2, m2) = run_sampled(off, model, reqs, opts);
    assert_eq!(r1, r2);
    // Every sample (the time series) too.
    assert_eq!(m1, m2);
    assert_eq!(s1.steps, s2.steps);
    assert_eq!(s2.fast_forwarded_steps, 0);
    let strip = |mut s: blis_replay::output::Summary| {
        s.fast_forwarded_steps = 0;
        serde_json::to_string(&s).unwrap()
    };
    assert_eq!(strip(s1), strip(s2));
}

fn roofline() -> Model {
    let arch = blis_replay::latency::hf_config::find_model(Some("llama-2-7b-hf"), None).unwrap();
    let hw = blis_replay::latency::arch::Hardware::bundled("H100").unwrap();
    Model::Roofline(Box::new(Roofline::new(arch, hw, 1)))
}

#[test]
fn fast_forward_is_exact_on_a_busy_mixed_workload() {
    let reqs: Vec<_> = (0..300)
        .map(|i| {
            let r = req(
                i,
                (i as i64) * 7_000,
                50 + (i as u32 * 37) % 900,
                20 + (i as u32 * 53) % 400,
            );
            if i % 3 == 0 {
                with_prefix(r, "sys", 64)
            } else {
                r
            }
        })
        .collect();
    let cfg = EngineConfig {
        total_kv_blocks: 600,
        max_num_seqs: 32,
        ..EngineConfig::default()
    };
    both(cfg.clone(), simple_model(), reqs.clone(), None);
    both(cfg.clone(), simple_model(), reqs.clone(), Some(50_000));
    both(cfg.clone(), roofline(), reqs.clone(), Some(100_000));
    // With a CPU tier that offloads whenever half the GPU is in use.
    for policy in [OffloadPolicy::OnEvict, OffloadPolicy::Eager] {
        let tiered = EngineConfig {
            cpu_tier: Some(CpuTierConfig {
                policy,
                cpu_blocks: 300,
                offload_threshold: 0.5,
                transfer_bandwidth_gb_s: 4.0,
                transfer_base_latency_us: 30.0,
                block_bytes: 131_072.0,
                thrashing_window_us: 50_000,
            }),
            ..cfg.clone()
        };
        both(tiered.clone(), simple_model(), reqs.clone(), Some(50_000));
        both(tiered, roofline(), reqs.clone(), None);
    }
}

proptest! {
    // (1,000 cases, about 1.5 s: a run of that many found a divergence,
    // with an eager CPU tier, that the 24 cases run before had missed.)
    #![proptest_config(ProptestConfig::with_cases(crate::common::cases(1000)))]

    #[test]
    fn fast_forward_is_exact_for_random_workloads(
        reqs in proptest::collection::vec((0i64..2_000_000, 1u32..1500, 1u32..300, 0u8..3), 1..80),
        blocks in 40u32..400,
        seqs in 1u32..24,
        budget in 64u32..4096,
        sched in 0u8..3,
        tier in proptest::option::of((1u32..400, 0.0f64..1.0, any::<bool>())),
        // Mostly vLLM's 16; odd sizes, and one larger than any request
        // (each request then fills at most one block).
        block_size in prop_oneof![6 => Just(16u32), 3 => 1u32..70, 1 => Just(4096u32)],
        // A client timeout on every request (cancellations in every
        // state, steady decoders among them), and a step time that grows
        // with the batch's context.
        timeout in proptest::option::of(20_000i64..1_500_000),
        physical in any::<bool>(),
    ) {
        let reqs: Vec<_> = reqs.into_iter().enumerate().map(|(i, (t, inp, out, g))| {
            let mut r = req(i as u64, t, inp, out);
            r.deadline_us = timeout.map(|d| t + d);
            if g == 0 { with_prefix(r, "g", 48) } else { r }
        }).collect();
        let scheduler = [SchedulerPolicy::Fcfs, SchedulerPolicy::Sjf, SchedulerPolicy::PriorityFcfs][sched as usize];
        let cpu_tier = tier.map(|(cpu_blocks, offload_threshold, eager)| CpuTierConfig {
            policy: if eager { OffloadPolicy::Eager } else { OffloadPolicy::OnEvict },
            cpu_blocks,
            offload_threshold,
            transfer_bandwidth_gb_s: 4.0,
            transfer_base_latency_us: 30.0,
            block_bytes: 131_072.0,
            thrashing_window_us: 50_000,
        });
        // The same KV capacity in tokens whatever the block size.
        let total_kv_blocks = (blocks * 16).div_ceil(block_size).max(1);
        let cfg = EngineConfig { total_kv_blocks, block_size, max_num_seqs: seqs, max_num_batched_tokens: budget, scheduler, cpu_tier, ..EngineConfig::default() };
        let model = if physical { roofline() } else { simple_model() };
        both(cfg, model, reqs, Some(20_000));
    }
}

/// Every token (request, index, time), completion (request, tokens, last
/// token's time) and step end of a run, whatever reports they came in.
#[derive(Default, PartialEq, Debug)]
struct Seen {
    tokens: Vec<(u64, u32, i64)>,
    finished: Vec<(u64, u32, i64)>,
    steps: Vec<i64>,
}

/// What one instance with `cfg` and fast-forward (the cohort) on or off
/// gives step by step for `arrivals` (time, request), its invariants
/// checked after every event: what it produced, and after each step its
/// steady decoders and how many requests that step's batch formation
/// preempted.
fn step_through(
    cfg: &EngineConfig,
    fast_forward: bool,
    arrivals: &[(i64, blis_replay::SimRequest)],
) -> (Seen, Vec<(usize, u64)>) {
    use blis_replay::Instance;
    use blis_replay::engine::instance::StepReport;
    let note = |seen: &mut Seen, r: &StepReport| {
        seen.steps.extend_from_slice(&r.step_ends);
        for span in &r.spans {
            for m in 0..span.count {
                seen.tokens
                    .push((span.id, span.first_index + m, r.token_time(span, m)));
            }
        }
        for f in &r.finished {
            seen.finished.push((f.id, f.output_tokens, f.last_token_us));
        }
    };
    let cfg = EngineConfig {
        fast_forward,
        ..cfg.clone()
    };
    let mut inst = Instance::new(cfg, roofline());
    let mut report = StepReport::default();
    let mut seen = Seen::default();
    let mut after_steps = Vec::new();
    let mut next = 0;
    loop {
        let arrival = arrivals.get(next).map(|(t, _)| *t);
        let t = match (inst.next_time(), arrival) {
            (None, None) => break,
            (Some(s), Some(a)) => s.min(a),
            (s, a) => s.or(a).unwrap(),
        };
        if arrival == Some(t) {
            if inst.split_at(t, &mut report) {
                note(&mut seen, &report);
            }
            while arrivals.get(next).is_some_and(|(a, _)| *a == t) {
                inst.enqueue(t, arrivals[next].1.clone()).unwrap();
                next += 1;
            }
        }
        if inst.next_time() == Some(t) {
            let before = inst.counters().preemptions;
            inst.step(t, i64::MAX, &mut report);
            note(&mut seen, &report);
            let preempted = inst.counters().preemptions - before;
            after_steps.push((inst.steady_decoders(), preempted));
        }
        inst.check().unwrap();
    }
    seen.tokens.sort_unstable();
    seen.finished.sort_unstable();
    (seen, after_steps)
}

/// A request arriving while a batch decodes joins it without the others
/// being stepped one by one: they stay steady decoders (the cohort)
/// through the mixed steps of its prompt, and every token, completion
/// and step is what stepping each request gives.
#[test]
fn decoders_stay_steady_through_a_newcomers_prompt() {
    // (time, request): eight at once, then one every 40 ms.
    let arrivals: Vec<(i64, _)> = (0..8)
        .map(|i| (0, sim_request(i, 200 + 30 * i as u32, 120 + 7 * i as u32)))
        .chain((8..14).map(|i| ((i as i64 - 7) * 40_000, sim_request(i, 900, 60))))
        .collect();
    let cfg = EngineConfig {
        total_kv_blocks: 2_000,
        ..EngineConfig::default()
    };
    let run = |fast_forward: bool| {
        let (seen, after) = step_through(&cfg, fast_forward, &arrivals);
        (seen, after.iter().map(|&(s, _)| s).max().unwrap_or(0))
    };
    let (with_cohort, steady) = run(true);
    let (reference, none) = run(false);
    assert_eq!(none, 0, "stepping one at a time keeps no cohort");
    assert!(steady >= 8, "the first eight decode as a cohort ({steady})");
    assert_eq!(with_cohort.finished.len(), 14);
    assert!(with_cohort.tokens.len() > 1_000);
    assert_eq!(with_cohort, reference);
}

/// When the KV cache runs out, vLLM preempts the last running request,
/// which under FCFS may be a steady decoder or a request behind them: the
/// other decoders stay steady through it (they are not stepped one by one
/// until the next batch takes them back), and every token, completion and
/// step is what stepping each request gives.
#[test]
fn decoders_stay_steady_through_preemptions() {
    // Twenty requests at once whose outputs outgrow the KV cache, and a
    // newcomer with a long prompt every 30 ms.
    let arrivals: Vec<(i64, _)> = (0..20)
        .map(|i| (0, sim_request(i, 100 + 13 * i as u32, 300 + 11 * i as u32)))
        .chain((20..30).map(|i| ((i as i64 - 19) * 30_000, sim_request(i, 700, 80))))
        .collect();
    for scheduler in [SchedulerPolicy::Fcfs, SchedulerPolicy::Sjf] {
        let cfg = EngineConfig {
            total_kv_blocks: 300,
            scheduler,
            ..EngineConfig::default()
        };
        let run = |fast_forward: bool| step_through(&cfg, fast_forward, &arrivals);
        let (with_cohort, after) = run(true);
        let (reference, _) = run(false);
        assert_eq!(with_cohort.finished.len(), 30);
        assert_eq!(with_cohort, reference, "{scheduler}");
        let preempting: Vec<usize> = (after.iter())
            .filter(|&&(_, preempted)| preempted > 0)
            .map(|&(steady, _)| steady)
            .collect();
        assert!(preempting.len() >= 10, "{scheduler}: {preempting:?}");
        assert!(
            preempting.iter().all(|&steady| steady > 0),
            "{scheduler}: the decoders stay steady through every preemption ({preempting:?})"
        );
    }
}
