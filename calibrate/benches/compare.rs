//! `compare` speed: 1M request pairs (TTFT, E2E, TPOT) with 1000 bootstrap
//! resamples, in memory (issue target: ≤ 5 s on the 2-core machine).
//!
//!     cargo bench -p blis-calibrate --bench compare

use blis_calibrate::compare::{CompareOptions, compare};
use blis_traces::{Mode, Outcome, Request, Status, Trace, TraceHeader, TraceRecord};
use criterion::{Criterion, criterion_group, criterion_main};

/// A trace of `n` streamed requests whose latencies come from `f(i)`.
fn trace(n: u64, mode: Mode, f: impl Fn(u64) -> (i64, i64)) -> Trace {
    let records = (0..n)
        .map(|i| {
            let send = i as i64 * 1000;
            let (ttft, e2e) = f(i);
            TraceRecord {
                request: Request {
                    request_id: i,
                    streaming: true,
                    input_tokens: 100 + (i % 900) as u32,
                    output_tokens: 20 + (i % 200) as u32,
                    arrival_time_us: send,
                    ..Request::default()
                },
                outcome: Outcome {
                    send_time_us: Some(send),
                    first_chunk_time_us: Some(send + ttft),
                    last_chunk_time_us: Some(send + e2e),
                    status: Some(Status::Ok),
                    ..Outcome::default()
                },
                other: vec![],
            }
        })
        .collect();
    Trace::new(TraceHeader::new(mode), records)
}

fn bench(c: &mut Criterion) {
    let n = 1_000_000;
    let h = |i: u64, k: u64| (i.wrapping_mul(k) % 10_007) as i64;
    let real = trace(n, Mode::Real, |i| {
        (
            20_000 + h(i, 2_654_435_761) * 10,
            500_000 + h(i, 40_503) * 300,
        )
    });
    let sim = trace(n, Mode::Replayed, |i| {
        (
            18_000 + h(i, 2_654_435_761) * 11,
            480_000 + h(i, 40_503) * 320 + h(i, 7) * 20,
        )
    });
    let mut g = c.benchmark_group("compare");
    g.sample_size(10);
    g.bench_function("1M pairs, 1000 bootstrap resamples", |b| {
        b.iter(|| {
            let r = compare(&real, "real", &sim, "sim", &CompareOptions::default());
            assert_eq!(r.report.matching.paired, n);
            r
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
