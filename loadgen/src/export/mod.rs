//! `blis-loadgen export`: a recorded trace in a peer's format, so that the
//! dashboards and scripts people already have read our runs.
//!
//! - `aiperf`: AIPerf's per-request `profile_export.jsonl` (`aiperf.rs`).
//! - `guidellm`: guidellm's `benchmarks.json` report (`guidellm.rs`).
//! - `inference-perf`: inference-perf's report folder
//!   (`summary_lifecycle_metrics.json`, `stage_0_lifecycle_metrics.json`,
//!   `per_request_lifecycle_metrics.json`; `inference_perf.rs`).
//!
//! Each is read back by the peer's own code in
//! `loadgen/benches/peer-export-check.sh`. Only sent requests are exported;
//! guidellm and inference-perf leave the warm-up out of their reports, as
//! those tools do, while AIPerf's records mark it as its `warmup` phase.

mod aiperf;
mod guidellm;
mod guidellm_stats;
mod inference_perf;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use blis_traces::step::StepContext;
use blis_traces::{Status, Trace, TraceRecord};

use crate::Result;

/// A peer's format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportFormat {
    /// AIPerf's `profile_export.jsonl` (per-request records); `out` a file.
    Aiperf,
    /// guidellm's `benchmarks.json` report (one benchmark); `out` a file.
    Guidellm,
    /// inference-perf's report files; `out` a folder.
    InferencePerf,
}

/// How a sent request ended, in the peers' three groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Completed with a response.
    Successful,
    /// Cut off by the run's end (cancelled after it was sent).
    Incomplete,
    /// Failed: an HTTP error, a broken stream or a timeout.
    Errored,
}

/// A sent request with what the peers need of it.
pub(crate) struct Sent<'a> {
    pub rec: &'a TraceRecord,
    pub warmup: bool,
    /// Sessions and lone requests numbered together, in send order.
    pub session_num: u64,
    /// Unix µs of its streamed chunks, in chunk order.
    pub chunks_us: Vec<i64>,
    /// Tokens each chunk carried, where the chunk file says.
    pub chunk_tokens: Vec<Option<u32>>,
    pub outcome: Outcome,
}

impl Sent<'_> {
    /// Unix seconds of a trace time in µs.
    pub fn s(us: i64) -> f64 {
        us as f64 / 1e6
    }
    pub fn send_us(&self) -> i64 {
        self.rec.outcome.send_time_us.unwrap_or_default()
    }
    /// When the response ended (the send time when none arrived).
    pub fn end_us(&self) -> i64 {
        self.rec
            .outcome
            .last_chunk_time_us
            .unwrap_or(self.send_us())
    }
    /// First streamed token's time, for a streamed request that got one.
    pub fn first_token_us(&self) -> Option<i64> {
        let o = &self.rec.outcome;
        (self.rec.request.streaming && o.num_chunks > 0)
            .then_some(o.first_chunk_time_us)
            .flatten()
    }
    pub fn last_token_us(&self) -> Option<i64> {
        let o = &self.rec.outcome;
        self.first_token_us().and(o.last_chunk_time_us)
    }
    /// Output tokens: the server's count for a completed request.
    pub fn output_tokens(&self) -> Option<u32> {
        (self.outcome == Outcome::Successful).then_some(self.rec.request.output_tokens)
    }
}

/// A recorded trace's sent requests in send order.
pub(crate) struct Run<'a> {
    pub trace: &'a Trace,
    pub sent: Vec<Sent<'a>>,
    /// Requests never sent (cut off by an interruption).
    pub unsent: u64,
}

impl<'a> Run<'a> {
    fn new(trace: &'a Trace) -> Self {
        let mut chunks: BTreeMap<u64, Vec<(u32, i64, Option<u32>)>> = BTreeMap::new();
        for c in trace.chunks.iter().flatten() {
            chunks
                .entry(c.request_id)
                .or_default()
                .push((c.chunk_index, c.timestamp_us, c.tokens));
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
        let mut sessions: BTreeMap<&str, u64> = BTreeMap::new();
        let (mut singles, mut unsent) = (0u64, 0u64);
        let mut sent = Vec::new();
        for r in records {
            if r.outcome.send_time_us.is_none() {
                unsent += 1;
                continue;
            }
            let next = sessions.len() as u64 + singles;
            let session_num = if r.request.session_id.is_empty() {
                singles += 1;
                next
            } else {
                *sessions.entry(&r.request.session_id).or_insert(next)
            };
            let mut cs = chunks.remove(&r.request.request_id).unwrap_or_default();
            cs.sort_unstable_by_key(|c| c.0);
            let outcome = match r.outcome.status {
                Some(Status::Ok) => Outcome::Successful,
                Some(Status::Cancelled) | None => Outcome::Incomplete,
                Some(Status::Error | Status::Timeout) => Outcome::Errored,
            };
            sent.push(Sent {
                rec: r,
                warmup: r.request.request_id < warmup_below,
                session_num,
                chunks_us: cs.iter().map(|c| c.1).collect(),
                chunk_tokens: cs.iter().map(|c| c.2).collect(),
                outcome,
            });
        }
        Run {
            trace,
            sent,
            unsent,
        }
    }

    /// The measured requests (the warm-up left out).
    pub fn measured(&self) -> impl Iterator<Item = &Sent<'a>> {
        self.sent.iter().filter(|s| !s.warmup)
    }

    /// The header's model, else the first request's.
    pub fn model(&self) -> String {
        self.trace
            .header
            .server
            .as_ref()
            .and_then(|s| s.model.clone())
            .or_else(|| self.sent.first().map(|s| s.rec.request.model.to_string()))
            .unwrap_or_default()
    }
}

/// Writes `bytes` to `path`, naming it on failure.
pub(crate) fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = std::fs::File::create(path).step(|| format!("creating {}", path.display()))?;
    f.write_all(bytes)
        .step(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// Writes the trace at `trace` in `format` to `out`; returns the line that
/// says what was written.
///
/// # Errors
/// An unreadable trace, an unwritable output.
pub fn export(trace: &Path, format: ExportFormat, out: &Path) -> Result<String> {
    let t = Trace::read(trace).step(|| format!("reading {}", trace.display()))?;
    let run = Run::new(&t);
    let what = match format {
        ExportFormat::Aiperf => aiperf::write(&run, out)?,
        ExportFormat::Guidellm => guidellm::write(&run, out)?,
        ExportFormat::InferencePerf => inference_perf::write(&run, out)?,
    };
    let unsent = if run.unsent > 0 {
        format!("; {} never sent, left out", run.unsent)
    } else {
        String::new()
    };
    Ok(format!("wrote {} ({what}{unsent})", out.display()))
}
