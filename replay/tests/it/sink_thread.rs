//! The outputs made on a thread of their own (`SinkThread`): the inner
//! sink is given exactly the calls, in the same order and with the same
//! token times, as on the simulation's thread. And a collector that takes
//! no tokens keeps the same records.

use blis_replay::cluster::Control;
use blis_replay::cluster::policy::PolicyBundle;
use blis_replay::cluster::routing::RoutingPolicy;
use blis_replay::engine::instance::{Snapshot, SpanTimes};
use blis_replay::output::SinkThread;
use blis_replay::sim::{Done, NotServed, SimOptions, Sink};
use blis_replay::{EngineConfig, Instance, replay_cluster};
use blis_traces::TraceRecord;
use proptest::prelude::*;

use crate::common::{cases, inputs, req, simple_model};

/// Writes down every call it is given.
#[derive(Debug, Default)]
struct Log(Vec<String>);

impl Sink for Log {
    fn wants_tokens(&self) -> bool {
        true
    }
    fn wants_token_records(&self) -> bool {
        false
    }
    fn steps(&mut self, instance: u32, first_step: u64, ends: &[i64]) {
        self.0
            .push(format!("steps {instance} {first_step} {ends:?}"));
    }
    fn tokens(&mut self, rec: Option<&TraceRecord>, streaming: bool, times: SpanTimes<'_>) {
        let t: Vec<i64> = times.iter().collect();
        self.0.push(format!(
            "tokens {} {streaming} {:?} {:?} {t:?}",
            rec.is_some(),
            times.span(),
            times.previous()
        ));
    }
    fn finished(&mut self, done: Done<'_>) {
        self.0.push(format!(
            "finished {} {} {:?} {:?}",
            done.rec.request.request_id, done.entry_us, done.fin, done.status
        ));
    }
    fn not_served(&mut self, rec: TraceRecord, entry_us: i64, why: NotServed) {
        self.0.push(format!(
            "not served {} {entry_us} {why:?}",
            rec.request.request_id
        ));
    }
    fn sample(&mut self, t_us: i64, snap: &Snapshot) {
        self.0.push(format!("sample {t_us} {snap:?}"));
    }
    fn sample_replicas(&mut self, t_us: i64, replicas: (u32, u32, u32)) {
        self.0.push(format!("replicas {t_us} {replicas:?}"));
    }
}

/// The calls a replay of `n` requests (ids from `seed`) on `instances`
/// instances makes on its sink, directly and through a [`SinkThread`].
fn both(seed: u64, n: u64, instances: u32, kv_blocks: u32) -> (Vec<String>, Vec<String>) {
    let reqs: Vec<_> = (0..n)
        .map(|i| {
            let h = (i + 1)
                .wrapping_mul(seed | 1)
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                >> 40;
            let mut r = req(
                i,
                i as i64 * (1_000 + (h % 9_000) as i64),
                16 + (h % 700) as u32,
                1 + (h % 120) as u32,
            );
            r.streaming = h % 5 != 0;
            if h % 7 == 0 {
                // A client that gives up: some cancelled waiting, some
                // while decoding.
                r.deadline_us = Some(r.arrival_time_us + 20_000 + (h % 400_000) as i64);
            }
            r
        })
        .collect();
    let cfg = EngineConfig {
        total_kv_blocks: kv_blocks,
        max_num_seqs: 12,
        max_num_batched_tokens: 256,
        ..EngineConfig::default()
    };
    let bundle = PolicyBundle {
        num_instances: instances,
        routing: RoutingPolicy::RoundRobin,
        ..PolicyBundle::default()
    };
    let opts = SimOptions {
        sample_interval_us: Some(37_000),
        horizon_us: None,
    };
    let mut logs = Vec::new();
    for threaded in [false, true] {
        let mut insts: Vec<Instance> = (0..instances)
            .map(|_| Instance::new(cfg.clone(), simple_model()))
            .collect();
        let mut control = Control::new(&bundle, insts.len());
        let reqs = inputs(reqs.clone());
        let log = if threaded {
            let mut sink = SinkThread::new(Log::default()).expect("a thread");
            replay_cluster(&mut insts, &mut control, reqs, &opts, &mut sink);
            sink.into_inner()
        } else {
            let mut sink = Log::default();
            replay_cluster(&mut insts, &mut control, reqs, &opts, &mut sink);
            sink
        };
        logs.push(log.0);
    }
    let threaded = logs.pop().expect("two runs");
    (logs.pop().expect("two runs"), threaded)
}

#[test]
fn a_sink_on_its_own_thread_gets_the_same_calls_in_the_same_order() {
    // Tight KV blocks: preemptions; deadlines: cancellations waiting and
    // decoding; three instances: reports interleave.
    let (direct, threaded) = both(7, 400, 3, 60);
    assert!(direct.iter().any(|c| c.starts_with("tokens")));
    assert!(direct.iter().any(|c| c.starts_with("not served")));
    assert!(direct.iter().any(|c| c.contains("Timeout")));
    assert!(direct.iter().any(|c| c.starts_with("sample")));
    assert!(
        direct.len() > 2 * blis_replay::output::sink_thread::BATCH_EVENTS,
        "more calls than one batch"
    );
    assert_eq!(direct.len(), threaded.len());
    for (i, (d, t)) in direct.iter().zip(&threaded).enumerate() {
        assert_eq!(d, t, "call {i}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases(16)))]
    #[test]
    fn threaded_calls_equal_direct_calls(
        seed in any::<u64>(),
        n in 1u64..120,
        instances in 1u32..4,
        kv_blocks in 48u32..400,
    ) {
        let (direct, threaded) = both(seed, n, instances, kv_blocks);
        prop_assert_eq!(direct, threaded);
    }
}

/// A collector that takes no tokens keeps the same records as one that
/// does (fitting and the accuracy benchmarks read only the records).
#[test]
fn a_records_only_collector_keeps_the_same_records() {
    use blis_replay::output::Collector;
    use blis_traces::{Mode, TraceHeader};
    let reqs: Vec<_> = (0..300u64)
        .map(|i| {
            let mut r = req(
                i,
                i as i64 * 4_000,
                30 + (i as u32 * 37) % 600,
                1 + (i as u32 * 53) % 90,
            );
            r.streaming = i % 4 != 0;
            if i % 9 == 0 {
                r.deadline_us = Some(r.arrival_time_us + 150_000);
            }
            r
        })
        .collect();
    let cfg = EngineConfig {
        total_kv_blocks: 80,
        max_num_seqs: 10,
        ..EngineConfig::default()
    };
    let opts = SimOptions {
        sample_interval_us: None,
        horizon_us: None,
    };
    let mut kept = Vec::new();
    for records_only in [false, true] {
        let mut inst = Instance::new(cfg.clone(), simple_model());
        let mut sink = if records_only {
            Collector::records_only(0)
        } else {
            Collector::in_memory(0)
        };
        assert_eq!(sink.wants_tokens(), !records_only);
        let last = blis_replay::replay(&mut inst, inputs(reqs.clone()), &opts, &mut sink);
        let (summary, recs) = sink
            .finish(&TraceHeader::new(Mode::Replayed), &last, "t")
            .unwrap();
        assert_eq!(
            summary.itl_ms.n.unwrap_or(0) > 0,
            !records_only,
            "ITL only with tokens"
        );
        kept.push(recs.unwrap());
    }
    assert_eq!(kept[0].len(), 300);
    assert!(
        kept[0]
            .iter()
            .any(|r| r.outcome.status == Some(blis_traces::Status::Timeout))
    );
    assert_eq!(kept[0], kept[1]);
}
