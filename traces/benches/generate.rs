//! Generating one million requests from a spec (target: < 2 s in release).
//!
//! `cargo bench -p blis-traces --bench generate`

use std::path::PathBuf;

use blis_traces::{GenerateOptions, Generator, WorkloadSpec};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

fn shared() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared")
}

fn count(spec: &WorkloadSpec, n: u64) -> u64 {
    let opts = GenerateOptions {
        num_requests: Some(n),
        ..GenerateOptions::default()
    };
    let mut tokens = 0u64;
    for r in Generator::new(spec, &opts).expect("spec") {
        tokens += u64::from(r.expect("request").input_tokens);
    }
    tokens
}

fn bench(c: &mut Criterion) {
    const N: u64 = 1_000_000;
    let mut g = c.benchmark_group("generate");
    g.sample_size(10);
    g.throughput(Throughput::Elements(N));
    let two =
        WorkloadSpec::from_file(&shared().join("examples/two-client-workload.yaml")).expect("spec");
    g.bench_function("two_client_example_1M", |b| b.iter(|| count(&two, N)));
    let sg = WorkloadSpec::from_yaml_str(&format!(
        "servegen_data:\n  path: {}\n  span_start_s: 0\n  span_end_s: 14400\n",
        shared().join("servegen/data/language/m-large").display()
    ))
    .expect("spec");
    g.bench_function("servegen_m_large_1M", |b| b.iter(|| count(&sg, N)));
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
