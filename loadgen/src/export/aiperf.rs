//! AIPerf's per-request records, `profile_export.jsonl` (one JSON object per
//! sent request: `metadata`, `metrics` with units, `error`), as its
//! `aiperf.common.models.MetricRecordInfo` reads them (checked with AIPerf
//! 0.13.0's own model: `loadgen/benches/peer-export-check.sh`). Requests
//! never sent (cut off by an interruption) have no record there, as in
//! AIPerf.

use std::collections::BTreeMap;
use std::io::Write;

use blis_traces::{Status, TraceRecord};
use serde::Serialize;

use super::{Run, write_file};
use crate::Result;

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
fn record(r: &TraceRecord, session_num: u64, warmup: bool, chunks_us: &[i64]) -> Option<Record> {
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

/// Writes the run's sent requests as `profile_export.jsonl` at `out`.
pub(super) fn write(run: &Run<'_>, out: &std::path::Path) -> Result<String> {
    let mut buf = Vec::new();
    for s in &run.sent {
        if let Some(rec) = record(s.rec, s.session_num, s.warmup, &s.chunks_us) {
            serde_json::to_writer(&mut buf, &rec)?;
            buf.write_all(b"\n")?;
        }
    }
    write_file(out, &buf)?;
    Ok(format!(
        "AIPerf profile_export.jsonl records: {} requests",
        run.sent.len()
    ))
}
