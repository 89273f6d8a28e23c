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

/// `n` requests drawn from `seed`: arrivals `gap` plus up to `spread` µs
/// apart, prompts of 16 to `16 + max_input` tokens, outputs of 1 to
/// `max_output`; one in five not streaming, one in seven with a client
/// that gives up (some cancelled waiting, some while decoding).
fn requests(
    seed: u64,
    n: u64,
    gap: i64,
    spread: u64,
    max_input: u64,
    max_output: u32,
) -> Vec<blis_traces::Request> {
    (0..n)
        .map(|i| {
            let h = (i + 1)
                .wrapping_mul(seed | 1)
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                >> 40;
            let mut r = req(
                i,
                i as i64 * (gap + (h % spread) as i64),
                16 + (h % max_input) as u32,
                1 + (h % u64::from(max_output)) as u32,
            );
            r.streaming = h % 5 != 0;
            if h % 7 == 0 {
                r.deadline_us = Some(r.arrival_time_us + 20_000 + (h % 400_000) as i64);
            }
            r
        })
        .collect()
}

/// The calls a replay of `n` requests (ids from `seed`) on `instances`
/// instances makes on its sink, directly and through a [`SinkThread`].
fn both(seed: u64, n: u64, instances: u32, kv_blocks: u32) -> (Vec<String>, Vec<String>) {
    let reqs = requests(seed, n, 1_000, 9_000, 700, 120);
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
    #![proptest_config(ProptestConfig::with_cases(cases(128)))]
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

/// Forwards every call to a collector, counting the steady decoders' notes
/// it is given in compact form.
struct Counted(blis_replay::output::Collector, u64);

impl Sink for Counted {
    fn wants_tokens(&self) -> bool {
        self.0.wants_tokens()
    }
    fn wants_token_records(&self) -> bool {
        self.0.wants_token_records()
    }
    fn steps(&mut self, instance: u32, first_step: u64, ends: &[i64]) {
        self.0.steps(instance, first_step, ends);
    }
    fn tokens(&mut self, rec: Option<&TraceRecord>, streaming: bool, times: SpanTimes<'_>) {
        self.0.tokens(rec, streaming, times);
    }
    fn finished(&mut self, done: Done<'_>) {
        self.0.finished(done);
    }
    fn not_served(&mut self, rec: TraceRecord, entry_us: i64, why: NotServed) {
        self.0.not_served(rec, entry_us, why);
    }
    fn sample(&mut self, t_us: i64, snap: &Snapshot) {
        self.0.sample(t_us, snap);
    }
    fn takes_cohort(&self) -> bool {
        self.0.takes_cohort()
    }
    fn cohort(
        &mut self,
        instance: u32,
        note: &blis_replay::engine::instance::CohortNote,
        report: &blis_replay::engine::instance::StepReport,
    ) {
        self.1 += 1;
        self.0.cohort(instance, note, report);
    }
}

/// Files by name, with the summary's JSON first.
type Files = Vec<(String, Vec<u8>)>;

/// Every file a collector writes (the trace, its step-form ITL companion,
/// the time series) and its summary, for a replay of `n` requests on
/// `instances` instances with `model`: made on the simulation's thread
/// (a token span per request per step), then on a thread of its own (the
/// steady decoders in compact notes), with the number of notes.
fn files_both_ways(
    seed: u64,
    n: u64,
    instances: u32,
    kv_blocks: u32,
    max_output: u32,
    model: &blis_replay::Model,
) -> (Files, Files, u64) {
    use blis_replay::output::Collector;
    use blis_traces::{ItlForm, Mode, TraceHeader};
    let reqs = requests(seed, n, 500, 6_000, 400, max_output);
    let cfg = EngineConfig {
        total_kv_blocks: kv_blocks,
        max_num_seqs: 24,
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
    let timing = blis_replay::engine::instance::TokenTiming::of(model).itl();
    let mut out = Vec::new();
    let mut notes = 0;
    for threaded in [false, true] {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let header = TraceHeader::new(Mode::Replayed);
        let prefix = dir.path().join("pred");
        let collector =
            Collector::to_files(&prefix, &header, &[], ItlForm::Steps(timing), true).unwrap();
        let mut insts: Vec<Instance> = (0..instances)
            .map(|_| Instance::new(cfg.clone(), model.clone()))
            .collect();
        let mut control = Control::new(&bundle, insts.len());
        let reqs = inputs(reqs.clone());
        let collector = if threaded {
            let mut sink = SinkThread::new(Counted(collector, 0)).expect("a thread");
            assert!(sink.takes_cohort());
            replay_cluster(&mut insts, &mut control, reqs, &opts, &mut sink);
            let c = sink.into_inner();
            notes = c.1;
            c.0
        } else {
            let mut sink = collector;
            replay_cluster(&mut insts, &mut control, reqs, &opts, &mut sink);
            sink
        };
        let snaps: Vec<Snapshot> = insts.iter().map(Instance::snapshot).collect();
        let last = blis_replay::sim::merged(&snaps);
        let (summary, _) = collector.finish(&header, &last, "m").unwrap();
        let mut files = vec![("summary".to_string(), serde_json::to_vec(&summary).unwrap())];
        let mut names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        names.sort();
        for p in names {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            files.push((name, std::fs::read(&p).unwrap()));
        }
        out.push(files);
    }
    let threaded = out.pop().expect("two runs");
    (out.pop().expect("two runs"), threaded, notes)
}

/// A model whose last token carries a completion delay, stepping as
/// BLIS's trained-physics formula does; with `per_token`, a delay that
/// grows with each token's index too (BLIS's α₂).
fn delayed_model_with(per_token: bool) -> blis_replay::Model {
    use blis_replay::latency::arch::Hardware;
    use blis_replay::latency::hf_config::find_model;
    use blis_replay::latency::physics::BlisPhysics;
    let arch = find_model(Some("meta-llama/Llama-3.1-8B-Instruct"), None).unwrap();
    let hw = Hardware::bundled("H100").unwrap();
    let mut m = BlisPhysics::published(&arch, &hw, 1);
    m.alpha = [0.0, 777.0, if per_token { 45.907_545 } else { 0.0 }];
    blis_replay::Model::BlisPhysics(Box::new(m))
}

fn delayed_model() -> blis_replay::Model {
    delayed_model_with(false)
}

fn assert_same_files(direct: &[(String, Vec<u8>)], threaded: &[(String, Vec<u8>)]) {
    assert_eq!(direct.len(), threaded.len());
    for ((a, x), (b, y)) in direct.iter().zip(threaded) {
        assert_eq!(a, b);
        assert!(
            x == y,
            "{a} differs:\n{}\n---\n{}",
            String::from_utf8_lossy(x),
            String::from_utf8_lossy(y)
        );
    }
}

#[test]
fn steady_decoders_told_in_compact_notes_write_the_same_files() {
    // Tight KV blocks (preemptions dissolve the steady decoders), client
    // deadlines (aborts), three instances, a completion delay.
    for model in [simple_model(), delayed_model(), delayed_model_with(true)] {
        let (direct, threaded, notes) = files_both_ways(11, 500, 3, 90, 90, &model);
        assert!(notes > 100, "the steady decoders came as notes ({notes})");
        let sizes: Vec<_> = direct.iter().map(|(n, b)| (n, b.len())).collect();
        let itl = direct.iter().find(|(n, _)| n == "pred.itl.csv").unwrap();
        assert!(itl.1.len() > 5_000, "token runs were written: {sizes:?}");
        assert_same_files(&direct, &threaded);
    }
    // Long outputs on a tight cache: a preempted member is admitted again
    // with all but its last token cached and steps straight into the
    // steady decoders (its first token as a member ends its token run).
    let (direct, threaded, _) =
        files_both_ways(4_203_664_176_394_230_614, 75, 1, 90, 600, &delayed_model());
    assert_same_files(&direct, &threaded);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases(128)))]
    #[test]
    fn compact_notes_and_spans_write_the_same_files(
        seed in any::<u64>(),
        n in 1u64..150,
        instances in 1u32..4,
        kv_blocks in 40u32..600,
        max_output in prop_oneof![Just(90u32), Just(600)],
        delayed in 0u8..3,
    ) {
        let model = match delayed {
            0 => simple_model(),
            1 => delayed_model(),
            _ => delayed_model_with(true),
        };
        let (direct, threaded, _) =
            files_both_ways(seed, n, instances, kv_blocks, max_output, &model);
        assert_same_files(&direct, &threaded);
    }
}
