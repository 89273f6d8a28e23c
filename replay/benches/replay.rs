//! Replay speed.
//!
//! `cargo bench -p blis-replay --bench replay`
//!
//! - `gt_llama2_7b_codegen`: the 9000-request vLLM ground-truth run
//!   (~1200 s of real time) with the roofline model (target ≤ 60 ms);
//! - `servegen_100k` / `servegen_1m`: ServeGen m-large language clients on one
//!   instance with blackbox coefficients (targets ≤ 1 s and ≤ 10 s);
//! - `cluster_100k_16_weighted`: 100K requests of
//!   `examples/policy_search/shared-prefixes.yaml` over 16 instances with
//!   weighted routing (prefix-affinity:3, queue-depth:2, kv-utilization:2;
//!   target ≤ 1 s);
//! - `step_time/*`: one step's time from each latency model (Qwen2.5-7B on
//!   an H100), for a decode-only batch of 128 requests and for a mixed
//!   batch (the same plus two prefill chunks): the cost of the model
//!   itself, apart from what its step times do to the batches.

use std::path::PathBuf;

use blis_replay::api::trace_inputs;
use blis_replay::cluster::Control;
use blis_replay::cluster::policy::PolicyBundle;
use blis_replay::cluster::routing::{RoutingPolicy, default_scorers};
use blis_replay::output::Collector;
use blis_replay::setup::{ServerArgs, resolve};
use blis_replay::sim::{Input, SimOptions};
use blis_replay::{Instance, LatencyModel, SchedulerPolicy, replay, replay_cluster};
use blis_traces::{GenerateOptions, Generator, TraceRecord, WorkloadSpec};
use criterion::{BatchSize, Criterion, criterion_group, criterion_main};

fn shared() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared")
}

fn server(model: Option<&str>, kv: Option<u32>) -> ServerArgs {
    ServerArgs {
        model: model.map(String::from),
        total_kv_blocks: kv,
        scheduler: SchedulerPolicy::Fcfs,
        prefix_caching: true,
        fast_forward: true,
        ..ServerArgs::default()
    }
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("replay");
    g.sample_size(10);

    let src = format!(
        "vllm-gt:{}",
        shared()
            .join("vllm-ground-truth/train/20260217-155451-llama-2-7b-tp1-codegen")
            .display()
    );
    let trace = blis_traces::import(&src.parse().expect("source"), 42).expect("import");
    let resolved = resolve(&server(None, None), Some(&trace.header)).expect("server");
    let inputs = trace_inputs(&trace.header, trace.records.clone());
    g.bench_function("gt_llama2_7b_codegen_9000", |b| {
        b.iter_batched(
            || inputs.clone(),
            |inputs| {
                let mut inst = Instance::new(resolved.engine.clone(), resolved.latency.clone());
                let mut sink = Collector::stats_only();
                let opts = SimOptions {
                    sample_interval_us: None,
                    horizon_us: None,
                };
                replay(&mut inst, inputs, &opts, &mut sink)
                    .counters
                    .completed
            },
            BatchSize::LargeInput,
        )
    });

    let spec = WorkloadSpec::from_yaml_str(&format!(
        "servegen_data:\n  path: {}\n  span_start_s: 0\n  span_end_s: 1209600\n  aggregate_rate: 2\n",
        shared().join("servegen/data/language/m-large").display()
    ))
    .expect("spec");
    let resolved = resolve(
        &server(Some("meta-llama/Llama-3.1-8B-Instruct"), None),
        None,
    )
    .expect("server");
    for (name, n) in [("servegen_100k", 100_000u64), ("servegen_1m", 1_000_000)] {
        let reqs: Vec<Input> = Generator::new(
            &spec,
            &GenerateOptions {
                num_requests: Some(n),
                ..Default::default()
            },
        )
        .expect("generator")
        .map(|r| Input::from_record(TraceRecord::planned(r.expect("request")), 0))
        .collect();
        g.bench_function(name, |b| {
            b.iter_batched(
                || reqs.clone(),
                |reqs| {
                    let mut inst = Instance::new(resolved.engine.clone(), resolved.latency.clone());
                    let mut sink = Collector::stats_only();
                    let opts = SimOptions {
                        sample_interval_us: None,
                        horizon_us: None,
                    };
                    replay(&mut inst, reqs, &opts, &mut sink).counters.completed
                },
                BatchSize::LargeInput,
            )
        });
    }

    let spec = WorkloadSpec::from_file(
        &PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../examples/policy_search/shared-prefixes.yaml"),
    )
    .expect("spec");
    let reqs: Vec<Input> = Generator::new(
        &spec,
        &GenerateOptions {
            horizon_us: Some(2_600_000_000),
            num_requests: Some(100_000),
            ..Default::default()
        },
    )
    .expect("generator")
    .map(|r| Input::from_record(TraceRecord::planned(r.expect("request")), 0))
    .collect();
    let bundle = PolicyBundle {
        num_instances: 16,
        routing: RoutingPolicy::Weighted {
            scorers: default_scorers().into_iter().collect(),
        },
        ..PolicyBundle::default()
    };
    g.bench_function("cluster_100k_16_weighted", |b| {
        b.iter_batched(
            || reqs.clone(),
            |reqs| {
                let mut insts: Vec<Instance> = (0..16)
                    .map(|_| Instance::new(resolved.engine.clone(), resolved.latency.clone()))
                    .collect();
                let mut control = Control::new(&bundle, insts.len());
                let mut sink = Collector::stats_only();
                let opts = SimOptions {
                    sample_interval_us: None,
                    horizon_us: None,
                };
                replay_cluster(&mut insts, &mut control, reqs, &opts, &mut sink);
                insts.iter().map(|i| i.counters().completed).sum::<u64>()
            },
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

fn step_time(c: &mut Criterion) {
    use blis_replay::latency::coefficients::LatencyKind;
    use blis_replay::latency::{BatchShape, PrefillChunk};
    let mut g = c.benchmark_group("step_time");
    let decode = BatchShape {
        prefill: Vec::new(),
        decode_count: 128,
        decode_context_sum: 128 * 1000,
    };
    let mixed = BatchShape {
        prefill: vec![
            PrefillChunk {
                computed_before: 0,
                new_tokens: 512,
            },
            PrefillChunk {
                computed_before: 1024,
                new_tokens: 256,
            },
        ],
        ..decode.clone()
    };
    for (name, kind) in [
        ("blackbox", LatencyKind::Blackbox),
        ("roofline", LatencyKind::Roofline),
        ("trained-physics", LatencyKind::TrainedPhysics),
        ("blis-physics", LatencyKind::BlisPhysics),
    ] {
        let args = ServerArgs {
            model: Some("qwen/qwen2.5-7b-instruct".into()),
            hardware: Some("H100".into()),
            latency: Some(kind),
            ..server(None, None)
        };
        let Ok(resolved) = resolve(&args, None) else {
            continue; // (no bundled row of this kind for the model)
        };
        let m = resolved.latency;
        for (shape_name, shape) in [("decode128", &decode), ("mixed", &mixed)] {
            g.bench_function(format!("{name}/{shape_name}"), |b| {
                b.iter(|| m.step_time_us(std::hint::black_box(shape)))
            });
        }
    }
    g.finish();
}

criterion_group!(benches, bench, step_time);
criterion_main!(benches);
