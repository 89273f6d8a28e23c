//! Reality check: replay each run of the vLLM ground truth with the roofline
//! model and the run's recorded server settings, and compare with what was
//! measured.
//!
//! `cargo run --release -p blis-replay --example ground_truth [DIR]`
//! (DIR defaults to `../shared/vllm-ground-truth/train`).
//!
//! Per run: TTFT mean and p99, E2E mean and p99 (successful requests), the
//! mean per-token decode interval (E2E − TTFT)/(output − 1) (the "derived
//! ITL"; the measured SSE-level ITL counts ~2 messages per token), and the
//! per-request E2E MAPE. Times in ms.

use std::path::PathBuf;

use blis_replay::SchedulerPolicy;
use blis_replay::api::replay_records_in_memory;
use blis_replay::setup::{ServerArgs, resolve};
use blis_traces::{Status, TraceRecord, percentile};

fn stats(recs: &[&TraceRecord]) -> (f64, f64, f64, f64, f64) {
    let mut ttft: Vec<f64> = recs
        .iter()
        .filter_map(|r| r.ttft_us())
        .map(|v| v as f64 / 1e3)
        .collect();
    let mut e2e: Vec<f64> = recs
        .iter()
        .filter_map(|r| r.e2e_us())
        .map(|v| v as f64 / 1e3)
        .collect();
    let itl: Vec<f64> = recs
        .iter()
        .filter(|r| r.request.output_tokens > 1)
        .filter_map(|r| {
            Some((r.e2e_us()? - r.ttft_us()?) as f64 / 1e3 / f64::from(r.request.output_tokens - 1))
        })
        .collect();
    ttft.sort_by(f64::total_cmp);
    e2e.sort_by(f64::total_cmp);
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    (
        mean(&ttft),
        percentile(&ttft, 99.0),
        mean(&e2e),
        percentile(&e2e, 99.0),
        mean(&itl),
    )
}

fn main() -> anyhow::Result<()> {
    let dir = std::env::args()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/vllm-ground-truth/train")
        });
    let mut runs: Vec<PathBuf> = std::fs::read_dir(&dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    runs.sort();
    println!(
        "| run | TTFT mean real/sim | TTFT p99 real/sim | E2E mean real/sim | E2E p99 real/sim | ITL/token real/sim | E2E MAPE | timeouts real/sim |"
    );
    println!("|---|---|---|---|---|---|---:|---|");
    for run in runs {
        let name = run.file_name().unwrap().to_string_lossy().into_owned();
        let src: blis_traces::ImportSource = format!("vllm-gt:{}", run.display())
            .parse()
            .map_err(anyhow::Error::msg)?;
        let trace = blis_traces::import(&src, 42)?;
        let args = ServerArgs {
            latency: Some(blis_replay::latency::coefficients::LatencyKind::Roofline),
            scheduler: SchedulerPolicy::Fcfs,
            prefix_caching: true,
            fast_forward: true,
            ..ServerArgs::default()
        };
        let resolved = resolve(&args, Some(&trace.header))?;
        let pred = replay_records_in_memory(&trace.header, trace.records.clone(), &resolved);
        let real_ok: Vec<&TraceRecord> = trace
            .records
            .iter()
            .filter(|r| r.outcome.status == Some(Status::Ok))
            .collect();
        let sim_ok: Vec<&TraceRecord> = pred
            .iter()
            .filter(|r| r.outcome.status == Some(Status::Ok))
            .collect();
        let (rt, rt99, re, re99, ri) = stats(&real_ok);
        let (st, st99, se, se99, si) = stats(&sim_ok);
        let sim_by_id: std::collections::HashMap<u64, &TraceRecord> =
            pred.iter().map(|r| (r.request.request_id, r)).collect();
        let mut ape = Vec::new();
        for r in &real_ok {
            if let (Some(real), Some(sim)) = (
                r.e2e_us(),
                sim_by_id
                    .get(&r.request.request_id)
                    .and_then(|s| s.e2e_us()),
            ) {
                ape.push(((sim - real) as f64).abs() / real as f64);
            }
        }
        let mape = 100.0 * ape.iter().sum::<f64>() / ape.len().max(1) as f64;
        let timeouts = |v: &[TraceRecord]| {
            v.iter()
                .filter(|r| r.outcome.status == Some(Status::Timeout))
                .count()
        };
        println!(
            "| {name} | {rt:.1} / {st:.1} | {rt99:.1} / {st99:.1} | {re:.0} / {se:.0} | {re99:.0} / {se99:.0} | {ri:.2} / {si:.2} | {mape:.1}% | {} / {} |",
            timeouts(&trace.records),
            timeouts(&pred)
        );
    }
    Ok(())
}
