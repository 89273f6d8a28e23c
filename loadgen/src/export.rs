//! `blis-loadgen export`: a recorded trace in a peer's format, so that the
//! dashboards and scripts people already have read our runs.
//!
//! `aiperf`: AIPerf's per-request records, `profile_export.jsonl` (one JSON
//! object per sent request: `metadata`, `metrics` with units, `error`), as
//! its `aiperf.common.models.MetricRecordInfo` reads them (checked with
//! AIPerf 0.13.0's own model: `loadgen/benches/aiperf-export-check.sh`).
//! Requests never sent (cut off by an interruption) have no record there,
//! as in AIPerf.

use std::collections::BTreeMap;
use std::io::Write;

use blis_traces::step::StepContext;
use blis_traces::{Status, Trace, TraceRecord};
use serde::Serialize;

use crate::{Result, cli};

/// AIPerf's `MetricValue`.
#[derive(Serialize)]
struct Metric {
    value: serde_json::Value,
    unit: &'static str,
}

/// AIPerf's `MetricRecordMetadata` (the fields we know).
#[derive(Serialize)]
struct Metadata {
    session_num: u64,
    x_request_id: String,
    x_correlation_id: String,
    conversation_id: String,
    turn_index: u32,
    request_start_ns: i64,
    request_ack_ns: Option<i64>,
    request_end_ns: i64,
    worker_id: &'static str,
    record_processor_id: &'static str,
    benchmark_phase: &'static str,
    was_cancelled: bool,
    cancellation_time_ns: Option<i64>,
}

/// AIPerf's `ErrorDetails`.
#[derive(Serialize)]
struct ErrorDetails {
    code: Option<u16>,
    #[serde(rename = "type")]
    kind: String,
    message: String,
}

/// AIPerf's `MetricRecordInfo`.
#[derive(Serialize)]
struct Record {
    metadata: Metadata,
    metrics: BTreeMap<&'static str, Metric>,
    error: Option<ErrorDetails>,
}

fn metric(value: impl Into<serde_json::Value>, unit: &'static str) -> Metric {
    Metric {
        value: value.into(),
        unit,
    }
}

/// The AIPerf record of a sent request; `None` for one never sent.
/// `chunks_us`: the Unix µs of its streamed chunks, in order.
fn aiperf_record(
    r: &TraceRecord,
    session_num: u64,
    warmup: bool,
    chunks_us: &[i64],
) -> Option<Record> {
    let o = &r.outcome;
    let q = &r.request;
    let send = o.send_time_us?;
    let end = o.last_chunk_time_us.unwrap_or(send);
    let ns = |us: i64| us.saturating_mul(1000);
    let id = q.request_id.to_string();
    let correlation = if q.session_id.is_empty() {
        id.clone()
    } else {
        q.session_id.to_string()
    };
    let cancelled = o.status == Some(Status::Cancelled);
    let metadata = Metadata {
        session_num,
        x_request_id: o.x_request_id.clone().unwrap_or_else(|| id.clone()),
        x_correlation_id: correlation.clone(),
        conversation_id: correlation,
        turn_index: q.round_index,
        request_start_ns: ns(send),
        request_ack_ns: None,
        request_end_ns: ns(end),
        worker_id: "blis-loadgen",
        record_processor_id: "blis-loadgen",
        benchmark_phase: if warmup { "warmup" } else { "profiling" },
        was_cancelled: cancelled,
        cancellation_time_ns: cancelled.then(|| ns(end)),
    };
    let isl = r.effective_input_tokens();
    let mut metrics = BTreeMap::new();
    if o.status != Some(Status::Ok) {
        metrics.insert("error_isl", metric(isl, "tokens"));
        let kind = crate::report::error_kind(r);
        return Some(Record {
            metadata,
            metrics,
            error: Some(ErrorDetails {
                code: o.http_status,
                kind,
                message: o.error_message.clone(),
            }),
        });
    }
    let ms = |us: i64| us as f64 / 1e3;
    let osl = q.output_tokens;
    metrics.insert("input_sequence_length", metric(isl, "tokens"));
    metrics.insert("output_sequence_length", metric(osl, "tokens"));
    metrics.insert("output_token_count", metric(osl, "tokens"));
    metrics.insert("request_latency", metric(ms(end - send), "ms"));
    if q.streaming
        && let Some(first) = o.first_chunk_time_us
    {
        metrics.insert("time_to_first_token", metric(ms(first - send), "ms"));
        if osl > 1 {
            let itl = ms(end - first) / f64::from(osl - 1);
            metrics.insert("inter_token_latency", metric(itl, "ms"));
            if itl > 0.0 {
                metrics.insert(
                    "output_token_throughput_per_user",
                    metric(1e3 / itl, "tokens/sec/user"),
                );
            }
        }
        if chunks_us.len() >= 2 {
            let icl: Vec<f64> = chunks_us.windows(2).map(|w| ms(w[1] - w[0])).collect();
            metrics.insert("inter_chunk_latency", metric(icl, "ms"));
            metrics.insert(
                "time_to_second_token",
                metric(ms(chunks_us[1] - chunks_us[0]), "ms"),
            );
        }
    }
    Some(Record {
        metadata,
        metrics,
        error: None,
    })
}

/// `blis-loadgen export`: writes the trace at `args.trace` in
/// `args.format` to `args.out`.
///
/// # Errors
/// An unreadable trace, an unwritable output.
pub fn export_command(args: &cli::ExportArgs, out: &mut dyn Write) -> Result<i32> {
    let trace = Trace::read(&args.trace).step(|| format!("reading {}", args.trace.display()))?;
    let mut chunks: BTreeMap<u64, Vec<(u32, i64)>> = BTreeMap::new();
    for c in trace.chunks.iter().flatten() {
        chunks
            .entry(c.request_id)
            .or_default()
            .push((c.chunk_index, c.timestamp_us));
    }
    let mut records: Vec<&TraceRecord> = trace.records.iter().collect();
    records.sort_by_key(|r| (r.outcome.send_time_us, r.request.request_id));
    // The warm-up: the header's leading requests by id.
    let mut ids: Vec<u64> = trace.records.iter().map(|r| r.request.request_id).collect();
    ids.sort_unstable();
    let warmup_below = usize::try_from(trace.header.warm_up_requests)
        .ok()
        .and_then(|n| ids.get(n).copied())
        .unwrap_or(if trace.header.warm_up_requests > 0 {
            u64::MAX
        } else {
            0
        });
    let file =
        std::fs::File::create(&args.out).step(|| format!("creating {}", args.out.display()))?;
    let mut w = std::io::BufWriter::new(file);
    let mut sessions: BTreeMap<&str, u64> = BTreeMap::new();
    // Sessions and lone requests are numbered together, in send order.
    let (mut singles, mut unsent) = (0u64, 0u64);
    for r in records {
        let key = if r.request.session_id.is_empty() {
            None
        } else {
            Some(&*r.request.session_id)
        };
        let next = sessions.len() as u64 + singles;
        let session_num = match key {
            Some(k) => *sessions.entry(k).or_insert(next),
            None => next,
        };
        let mut times: Vec<(u32, i64)> = chunks.remove(&r.request.request_id).unwrap_or_default();
        times.sort_unstable();
        let times: Vec<i64> = times.into_iter().map(|(_, t)| t).collect();
        match aiperf_record(r, session_num, r.request.request_id < warmup_below, &times) {
            Some(rec) => {
                serde_json::to_writer(&mut w, &rec)?;
                w.write_all(b"\n")
                    .step(|| format!("writing {}", args.out.display()))?;
                if key.is_none() {
                    singles += 1;
                }
            }
            None => unsent += 1,
        }
    }
    w.flush()
        .step(|| format!("writing {}", args.out.display()))?;
    writeln!(
        out,
        "wrote {} (AIPerf profile_export.jsonl records: {} requests{})",
        args.out.display(),
        trace.records.len() as u64 - unsent,
        if unsent > 0 {
            format!("; {unsent} never sent, left out")
        } else {
            String::new()
        }
    )?;
    Ok(crate::exit_code::OK)
}
