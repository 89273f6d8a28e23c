//! The outputs made on a thread of their own (`SinkThread`): the inner
//! sink is given exactly the calls, in the same order and with the same
//! token times, as on the simulation's thread.

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
