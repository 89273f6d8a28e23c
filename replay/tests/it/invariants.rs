//! Invariants of the engine at every step, over random configurations and
//! workloads: request conservation (injected = completed + dropped +
//! queued + running), KV conservation (used + free = total), a monotone
//! clock, causality (arrival ≤ schedule ≤ first token ≤ completion) and work
//! conservation (a step is pending whenever work waits); the tokens a run
//! announces when it is formed are exactly the ones it produces. With a
//! CPU KV tier: CPU used + free = total, and no content in both tiers.

use std::collections::VecDeque;

use blis_replay::engine::instance::StepReport;
use blis_replay::engine::kv_tier::{CpuTierConfig, OffloadPolicy};
use blis_replay::{EngineConfig, Instance, SchedulerPolicy, SimRequest};
use blis_traces::content;
use proptest::prelude::*;

use crate::common::{req, simple_model, with_prefix};

fn sim_request(r: &blis_traces::Request) -> SimRequest {
    let mut segments = Vec::new();
    content::sequence_segments(r, r.input_tokens, r.output_tokens, &mut segments);
    SimRequest {
        id: r.request_id,
        input_tokens: r.input_tokens,
        output_tokens: r.output_tokens,
        priority: (r.request_id % 3) as i64,
        class: (r.request_id % 3) as u8,
        segments,
        block_hashes: Vec::new(),
        tag: r.request_id as u32,
    }
}

fn check_run(cfg: EngineConfig, mut reqs: Vec<blis_traces::Request>) -> Result<(), TestCaseError> {
    reqs.sort_by_key(|r| (r.arrival_time_us, r.request_id));
    let arrivals: Vec<i64> = {
        let mut a = vec![0; reqs.len()];
        for r in &reqs {
            a[r.request_id as usize] = r.arrival_time_us;
        }
        a
    };
    let mut pending: VecDeque<_> = reqs.iter().collect();
    let mut inst = Instance::new(cfg, simple_model());
    let mut report = StepReport::default();
    let (mut now, mut injected, mut dropped, mut completed) = (i64::MIN, 0u64, 0u64, 0u64);
    let (mut announced, mut produced) = (Vec::new(), Vec::new());
    loop {
        let t_arr = pending.front().map(|r| r.arrival_time_us);
        let t_step = inst.next_time();
        let (t, arrival) = match (t_arr, t_step) {
            (None, None) => break,
            (Some(a), None) => (a, true),
            (None, Some(s)) => (s, false),
            (Some(a), Some(s)) => {
                if a <= s {
                    (a, true)
                } else {
                    (s, false)
                }
            }
        };
        prop_assert!(t >= now, "clock went back from {now} to {t}");
        now = t;
        if arrival {
            let r = pending.pop_front().unwrap();
            injected += 1;
            if inst.enqueue(now, sim_request(r)).is_err() {
                dropped += 1;
            }
        } else {
            let limit = pending
                .front()
                .map_or(i64::MAX, |r| r.arrival_time_us - 1)
                .max(now);
            inst.step(now, limit, &mut report);
            produced.clear();
            for span in &report.spans {
                for m in 0..span.count {
                    produced.push((span.id, span.first_index + m, report.token_time(span, m)));
                }
            }
            produced.sort_unstable();
            announced.sort_unstable();
            prop_assert_eq!(&announced, &produced, "announced vs produced tokens");
            announced.clear();
            inst.upcoming_tokens(&mut announced);
            for f in &report.finished {
                let arr = arrivals[f.id as usize];
                prop_assert!(
                    arr <= f.scheduled_us,
                    "arrival {arr} > scheduled {}",
                    f.scheduled_us
                );
                prop_assert!(
                    f.scheduled_us < f.first_token_us,
                    "scheduled {} >= first {}",
                    f.scheduled_us,
                    f.first_token_us
                );
                prop_assert!(f.first_token_us <= f.last_token_us);
                completed += 1;
            }
            for w in report.step_ends.windows(2) {
                prop_assert!(w[0] < w[1]);
            }
        }
        if let Err(e) = inst.check() {
            return Err(TestCaseError::fail(e));
        }
        prop_assert_eq!(injected, completed + dropped + inst.in_system() as u64);
        let snap = inst.snapshot();
        prop_assert_eq!(snap.kv_used + u64::from(inst.kv().free()), snap.kv_total);
        if let Some(cpu) = inst.kv().cpu_tier() {
            prop_assert_eq!(cpu.used() + cpu.free(), cpu.total());
            prop_assert_eq!(snap.kv_cpu_used, u64::from(cpu.used()));
        }
        if inst.in_system() > 0 {
            prop_assert!(
                inst.next_time().is_some(),
                "work waits but no step is pending"
            );
        }
    }
    prop_assert_eq!(injected, reqs.len() as u64);
    prop_assert_eq!(completed + dropped, injected);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(crate::common::cases(48)))]

    #[test]
    fn invariants_hold_at_every_step(
        reqs in proptest::collection::vec((0i64..3_000_000, 1u32..2000, 1u32..400, any::<bool>()), 1..120),
        blocks in 8u32..600,
        block_size in prop_oneof![Just(1u32), Just(16), Just(32)],
        seqs in 1u32..40,
        budget in 1u32..4096,
        threshold in prop_oneof![Just(0u32), 1u32..512],
        sched in 0u8..4,
        prefix_caching in any::<bool>(),
        chunked_prefill in any::<bool>(),
        fast_forward in any::<bool>(),
        async_scheduling in any::<bool>(),
        tier in proptest::option::of((1u32..300, 0.0f64..1.0, 0i64..5000, any::<bool>())),
    ) {
        let reqs: Vec<_> = reqs.into_iter().enumerate().map(|(i, (t, inp, out, shared))| {
            let r = req(i as u64, t, inp, out);
            if shared { with_prefix(r, "g", 40) } else { r }
        }).collect();
        let scheduler = [SchedulerPolicy::Fcfs, SchedulerPolicy::PriorityFcfs, SchedulerPolicy::Sjf, SchedulerPolicy::ReversePriority][sched as usize];
        let cfg = EngineConfig {
            max_num_seqs: seqs,
            max_num_batched_tokens: budget,
            long_prefill_token_threshold: threshold,
            block_size,
            total_kv_blocks: blocks,
            max_model_len: 0,
            scheduler,
            prefix_caching,
            chunked_prefill,
            fast_forward,
            async_scheduling,
            cpu_tier: tier.map(|(cpu_blocks, offload_threshold, window, eager)| CpuTierConfig {
                policy: if eager { OffloadPolicy::Eager } else { OffloadPolicy::OnEvict },
                cpu_blocks,
                offload_threshold,
                transfer_bandwidth_gb_s: 8.0,
                transfer_base_latency_us: 20.0,
                block_bytes: 65_536.0,
                thrashing_window_us: window,
            }),
        };
        check_run(cfg, reqs)?;
    }
}
