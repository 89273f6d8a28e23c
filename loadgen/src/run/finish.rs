//! The end of a run: the recorder thread, the trace header, the trace written
//! whole (every completed request kept when interrupted), and the run's
//! summary.

use crate::{CommandError, Result};
use blis_traces::step::{StepContext, StepError};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use blis_traces::{ExtraColumn, Mode, NetworkInfo, TraceHeader, TraceWriter};

use crate::options::RunOptions;
use crate::record::Recorded;
use crate::report::{Slo, Summary, SummaryInputs, Tally, process_cpu_time_s};
use crate::scrape;

use super::{connect::Server, schedule::Plan, shared::Shared};

/// Phase 3: the trace's header (completed at the end) and its columns.
pub(super) fn trace_header(
    args: &RunOptions,
    plan: &Plan,
    server: &Server,
    run_start_us: i64,
) -> (TraceHeader, Vec<ExtraColumn>) {
    let mut header = TraceHeader::new(Mode::Real);
    header.created_at = Some(jiff::Timestamp::now().to_string());
    header.warm_up_requests = plan.warmup;
    header.workload_seed = plan.header.workload_seed;
    header.workload_spec = plan.header.workload_spec.clone();
    header.server = Some(server.config(args));
    header.network = Some(NetworkInfo {
        measured_rtt_ms: server.info.rtt_ms,
    });
    header.run_start_unix_us = Some(run_start_us);
    // The plan, so that a trace cut off can say what it lacks
    // (`blis-loadgen check`).
    header.planned_requests = Some(plan.facts.count);
    header.plan_hash = Some(plan.facts.plan_hash.clone());
    header.shard = args.shard.map(|s| {
        let (clock_offset_us, clock_source) = crate::clock::ntp_offset_us();
        blis_traces::ShardInfo {
            index: s.index,
            count: s.count,
            clock_offset_us,
            clock_source: Some(clock_source),
        }
    });
    header.planned_ids = plan.facts.planned_ids.clone();
    let mut extras = plan.facts.extras.clone();
    for e in [
        ExtraColumn::HttpStatus,
        ExtraColumn::CachedTokens,
        ExtraColumn::XRequestId,
    ] {
        if !extras.contains(&e) {
            extras.push(e);
        }
    }
    (header, extras)
}

/// The shared state once every task that held it has ended.
pub(super) async fn unwrap_shared(mut sh: Arc<Shared>) -> Result<Shared> {
    let mut waited = 0;
    loop {
        match Arc::try_unwrap(sh) {
            Ok(s) => return Ok(s),
            Err(_) if waited >= 5000 => {
                return Err(CommandError::Internal(
                    "request tasks outlived the run".into(),
                ));
            }
            Err(again) => {
                sh = again;
                waited += 1;
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    }
}

/// How a run went, for its summary.
pub(super) struct RunEnd {
    /// Requests with ids below this are warm-up.
    pub(super) warmup_below: u64,
    /// The plan's rate.
    pub(super) requested_rate: Option<f64>,
    /// Every request due at once ([`super::schedule::PlanFacts::burst`]).
    pub(super) burst: bool,
    pub(super) slo: Option<Slo>,
    pub(super) interrupted: bool,
    pub(super) run_start_us: i64,
    /// How far behind the client stopped sending, s.
    pub(super) stopped_behind_s: Option<f64>,
}

/// The run's summary from what was recorded.
pub(super) fn summarize_run(recorded: &mut Recorded, end: RunEnd, args: &RunOptions) -> Summary {
    let inp = summary_inputs(end.warmup_below, end.run_start_us, end.slo);
    let tally = std::mem::replace(&mut recorded.tally, Tally::new(&inp));
    tally.summary(
        &recorded.itl_us,
        &SummaryInputs {
            requested_rate: end.requested_rate,
            burst: end.burst,
            max_send_lag_ms: args.max_send_lag_ms,
            cpu_time_s: process_cpu_time_s(),
            interrupted: end.interrupted,
            max_error_rate: args.max_error_rate,
            stopped_behind_s: end.stopped_behind_s,
            ..inp
        },
    )
}

/// What the tally of a run's rows needs from the start.
pub(super) fn summary_inputs(
    warmup_below: u64,
    run_start_us: i64,
    slo: Option<Slo>,
) -> SummaryInputs {
    SummaryInputs {
        warmup_below_id: warmup_below,
        run_start_unix_us: run_start_us,
        slo,
        ..SummaryInputs::default()
    }
}

/// The trace being recorded ([`start_recorder`]).
pub(super) struct Recorder {
    /// The trace's header.
    pub(super) header: TraceHeader,
    /// Where the rows go.
    pub(super) tx: std::sync::mpsc::Sender<crate::record::Msg>,
    /// The thread writing them, which hands back what it wrote.
    pub(super) thread: std::thread::JoinHandle<Recorded>,
    /// Set when a write failed.
    pub(super) failed: Arc<AtomicBool>,
    /// The figures so far, for the progress line.
    pub(super) live: Arc<crate::record::Live>,
}

/// The trace's header and its recorder thread, writing the files at
/// `args.out`.
pub(super) fn start_recorder(
    args: &RunOptions,
    plan: &Plan,
    server: &Server,
    run_start_us: i64,
    any_stream: bool,
    slo: Option<Slo>,
) -> Result<Recorder> {
    let (header, extras) = trace_header(args, plan, server, run_start_us);
    let writer = TraceWriter::create(
        &args.out,
        &header,
        &extras,
        any_stream.then_some(server.ep.per_chunk_tokens()),
        server.scrape_on,
    )
    .step(|| format!("creating the trace at {}", args.out.display()))?;
    let (tx, rx) = std::sync::mpsc::channel();
    let record_failed = Arc::new(AtomicBool::new(false));
    let tally = Tally::new(&summary_inputs(plan.facts.warmup_below, run_start_us, slo));
    let live = Arc::new(crate::record::Live::new(run_start_us));
    let recorder = crate::record::spawn(
        writer,
        tally,
        plan.facts.warmup_below,
        rx,
        record_failed.clone(),
        live.clone(),
    )
    .step(|| "starting the recorder thread")?;
    Ok(Recorder {
        header,
        tx,
        thread: recorder,
        failed: record_failed,
        live,
    })
}

/// Phase 6: the trace's files completed with the final header, and what was
/// written reported.
pub(super) fn finish_trace(
    recorded: Recorded,
    rows: u64,
    header: &TraceHeader,
    scrape_stats: &scrape::ScrapeStats,
    any_stream: bool,
    scrape_on: bool,
) -> Result<()> {
    let Recorded {
        writer,
        metric_rows,
        error,
        ..
    } = recorded;
    if let Some(e) = error {
        return Err(
            StepError::new("writing the trace (rows after this error are missing)", e).into(),
        );
    }
    let paths = writer.finish(header)?;
    let attempts = scrape_stats.attempts.load(Ordering::Relaxed);
    let failures = scrape_stats.failures.load(Ordering::Relaxed);
    if failures > 0 {
        blis_traces::diag!(
            "warning: {failures} of {attempts} metric scrapes failed (first: {})",
            scrape_stats.first_error().unwrap_or_default()
        );
    }
    let skipped = scrape_stats.skipped_lines.load(Ordering::Relaxed);
    if skipped > 0 {
        blis_traces::diag!(
            "warning: {skipped} unreadable line(s) of the metrics pages were skipped over {attempts} scrapes (first: {}); the rest were kept",
            scrape_stats.first_skipped().unwrap_or_default()
        );
    }
    blis_traces::diag!(
        "wrote {} ({} requests{}{})",
        paths.header.display(),
        rows,
        if any_stream { ", per-chunk times" } else { "" },
        if scrape_on {
            format!(", {metric_rows} metric samples from {attempts} scrapes")
        } else {
            String::new()
        }
    );
    Ok(())
}
