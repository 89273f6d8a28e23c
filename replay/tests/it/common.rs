use std::path::PathBuf;
use std::sync::Arc;

use blis_replay::engine::instance::{Snapshot, SpanTimes};
use blis_replay::output::{Collector, Summary};
use blis_replay::sim::{Done, Input, NotServed, SimOptions, Sink};
use blis_replay::{Blackbox, EngineConfig, Instance, Model, replay};
use blis_traces::{Mode, Request, TraceHeader, TraceRecord};

pub fn shared() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared")
}

/// Blackbox with round numbers: step = 1000 + 10·prefill + 100·decode µs.
pub fn simple_model() -> Model {
    Model::Blackbox(Blackbox {
        alpha: [0.0; 3],
        beta: [1000.0, 10.0, 100.0],
    })
}

pub fn req(id: u64, at_us: i64, input: u32, output: u32) -> Request {
    Request {
        request_id: id,
        input_tokens: input,
        output_tokens: output,
        streaming: true,
        arrival_time_us: at_us,
        ..Request::default()
    }
}

/// Request `id` (arriving at 0, `input` prompt and `output` output tokens)
/// with its content segments, as an instance takes it.
pub fn sim_request(id: u64, input: u32, output: u32) -> blis_replay::SimRequest {
    let r = req(id, 0, input, output);
    let mut segments = Vec::new();
    blis_traces::content::sequence_segments(&r, input, output, &mut segments);
    blis_replay::SimRequest {
        id,
        input_tokens: input,
        output_tokens: output,
        priority: 0,
        class: 0,
        segments,
        block_hashes: Vec::new(),
        tag: id as u32,
    }
}

pub fn with_prefix(mut r: Request, group: &str, len: u32) -> Request {
    r.prefix_group = Arc::from(group);
    r.prefix_length = len;
    r
}

/// Replays `reqs` and returns the summary and the predicted records sorted
/// by request id.
pub fn run(cfg: EngineConfig, model: Model, reqs: Vec<Request>) -> (Summary, Vec<TraceRecord>) {
    run_opts(
        cfg,
        model,
        reqs,
        SimOptions {
            sample_interval_us: None,
            horizon_us: None,
        },
    )
}

pub fn run_opts(
    cfg: EngineConfig,
    model: Model,
    reqs: Vec<Request>,
    opts: SimOptions,
) -> (Summary, Vec<TraceRecord>) {
    let (s, recs, _) = run_sampled(cfg, model, reqs, opts);
    (s, recs)
}

/// [`run_opts`], also returning every metrics sample the replay took
/// (time, snapshot), the fast-forward diagnostic count zeroed.
pub fn run_sampled(
    cfg: EngineConfig,
    model: Model,
    reqs: Vec<Request>,
    opts: SimOptions,
) -> (Summary, Vec<TraceRecord>, Vec<(i64, Snapshot)>) {
    let mut inst = Instance::new(cfg, model);
    let inputs = inputs(reqs);
    let mut sink = Sampled {
        inner: Collector::in_memory(0),
        samples: Vec::new(),
    };
    let last = replay(&mut inst, inputs, &opts, &mut sink);
    inst.check().expect("invariants at the end");
    let (s, recs) = sink
        .inner
        .finish(&TraceHeader::new(Mode::Replayed), &last, "test")
        .expect("finish");
    let mut recs = recs.expect("kept");
    recs.sort_by_key(|r| r.request.request_id);
    (s, recs, sink.samples)
}

/// A collector that also keeps the samples it is given.
struct Sampled {
    inner: Collector,
    samples: Vec<(i64, Snapshot)>,
}

impl Sink for Sampled {
    fn wants_tokens(&self) -> bool {
        self.inner.wants_tokens()
    }
    fn steps(&mut self, instance: u32, first_step: u64, ends: &[i64]) {
        self.inner.steps(instance, first_step, ends)
    }
    fn tokens(&mut self, rec: Option<&TraceRecord>, streaming: bool, times: SpanTimes<'_>) {
        self.inner.tokens(rec, streaming, times)
    }
    fn wants_token_records(&self) -> bool {
        self.inner.wants_token_records()
    }
    fn finished(&mut self, done: Done<'_>) {
        self.inner.finished(done)
    }
    fn not_served(&mut self, rec: TraceRecord, entry_us: i64, why: NotServed) {
        self.inner.not_served(rec, entry_us, why)
    }
    fn sample(&mut self, t_us: i64, snap: &Snapshot) {
        let mut s = *snap;
        s.counters.fast_forwarded_steps = 0;
        self.samples.push((t_us, s));
        self.inner.sample(t_us, snap)
    }
    fn slo(&self) -> Option<blis_traces::slo::Slo> {
        self.inner.slo()
    }
}

/// The planned requests as simulator inputs, in arrival order.
pub fn inputs(reqs: Vec<Request>) -> Vec<Input> {
    let mut inputs: Vec<Input> = reqs
        .into_iter()
        .map(|r| Input::from_record(TraceRecord::planned(r), 0))
        .collect();
    inputs.sort_by_key(|i| (i.entry_us, i.rec.request.request_id));
    inputs
}

/// `r` with SLO class `class`.
pub fn slo(mut r: Request, class: &str) -> Request {
    r.slo_class = Arc::from(class);
    r
}

pub fn ttft(r: &TraceRecord) -> i64 {
    r.ttft_us().expect("ttft")
}

pub fn e2e(r: &TraceRecord) -> i64 {
    r.e2e_us().expect("e2e")
}

/// Proptest cases: `default`, or `PROPTEST_CASES` from the environment for
/// a longer campaign (e.g. `PROPTEST_CASES=1000`; `with_cases` alone
/// would ignore it).
pub fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
