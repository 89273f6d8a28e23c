//! `blis-loadgen run`: send a planned workload to a server on its exact
//! schedule and record everything.
//!
//! ```text
//! plan ──▶ units (single requests, or the rounds of one session)
//!   open loop:   dispatcher task ── sleep until start + arrival ──▶ spawn unit task
//!   closed loop: N worker tasks, each taking the next unit when its last ends
//! unit task ──▶ [max-in-flight permit] ──▶ HTTP request ──▶ Capture ──▶ recorder thread ──▶ PREFIX.csv, .itl.csv
//! scraper task ── every interval ──▶ /metrics ──▶ recorder ──▶ PREFIX.metrics.csv
//! ```
//!
//! The schedule is absolute: each send waits until `run_start + arrival`
//! (with a timerfd precise to tens of µs, unlike tokio's millisecond timer;
//! see [`crate::timer`]), never a sum of sleeps, so delays never
//! accumulate; how late each send was (the send lag) is recorded and
//! judged. Later rounds of a session wait for the previous round's response
//! plus the think time.

use crate::{CommandError, Result};
use blis_traces::step::{StepContext, StepError};
use std::collections::{BTreeMap, VecDeque};
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use blis_traces::spec::ContextGrowth;
use blis_traces::{
    ExtraColumn, GenerateOptions, LoadGeneratorInfo, Mode, NetworkInfo, ServerConfig, Status,
    TraceHeader, TraceRecord, TraceWriter, WorkloadSpec,
};
use tokio::sync::{Semaphore, watch};

use crate::clock::RunClock;
use crate::http::{Api, ServerType};
use crate::http::{Capture, Endpoint, ErrorKind, Failure, Message, Prompt};
use crate::options::{RunOptions, Shard};
use crate::plan::{GeneratedWorkload, PlanError, Workload, plan_workload};
use crate::record::{Msg, Recorded};
use crate::report::{Slo, Summary, SummaryInputs, Tally, process_cpu_time_s};
use crate::timer::PreciseTimer;
use crate::{exit_code, probe, prompt, scrape};

/// Live counters for the progress line.
#[derive(Debug, Default)]
struct Progress {
    sent: AtomicU64,
    done: AtomicU64,
    not_ok: AtomicU64,
    in_flight: AtomicU64,
}

/// What every request task shares.
#[derive(Debug)]
struct Shared {
    ep: Endpoint,
    clock: RunClock,
    run_start_us: i64,
    tokens_per_word: f64,
    no_stream: bool,
    timeout: Duration,
    tx: Sender<Msg>,
    sem: Option<Arc<Semaphore>>,
    /// No new sends (signal, duration, writer failure).
    stopping: watch::Sender<bool>,
    /// Abort requests in flight.
    cancel: watch::Sender<bool>,
    progress: Progress,
    growth: BTreeMap<String, ContextGrowth>,
    xid_prefix: String,
    record_failed: Arc<AtomicBool>,
    /// `--max-behind-s`, as a duration (`None`: never stop).
    max_behind: Option<Duration>,
    /// How far behind (µs) the client was when it stopped sending for it;
    /// 0 when it did not.
    stopped_behind_us: AtomicU64,
    /// `--max-send-lag-ms`: behind its schedule by more than this, the
    /// open-loop dispatcher holds the units it has started (see
    /// [`BehindCap`]).
    behind_after: Duration,
}

impl Shared {
    /// Whether `rec` is sent as a stream.
    fn streams(&self, rec: &TraceRecord) -> bool {
        rec.request.streaming && !self.no_stream
    }

    fn stopping(&self) -> bool {
        *self.stopping.borrow() || self.record_failed.load(Ordering::Relaxed)
    }

    fn instant(&self, rel_us: i64) -> Instant {
        self.clock.instant(self.run_start_us + rel_us)
    }

    fn emit(&self, rec: TraceRecord, times: Vec<i64>, tokens: Vec<u32>) {
        self.progress.done.fetch_add(1, Ordering::Relaxed);
        if rec.outcome.status != Some(Status::Ok) {
            self.progress.not_ok.fetch_add(1, Ordering::Relaxed);
        }
        // The recorder only goes away when the run is over.
        let _ = self.tx.send(Msg::Done(Box::new(rec), times, tokens));
    }

    /// Records `rec` as never sent.
    fn not_sent(&self, mut rec: TraceRecord, why: &str) {
        rec.outcome.status = Some(Status::Cancelled);
        rec.outcome.error_message = Failure {
            kind: ErrorKind::NotSent,
            detail: why.to_string(),
        }
        .message();
        self.emit(rec, Vec::new(), Vec::new());
    }
}

/// A request ready to send: its prompt and the JSON body.
#[derive(Debug)]
struct Ready {
    prompt: Prompt,
    body: Vec<u8>,
}

impl Ready {
    fn new(sh: &Shared, rec: &TraceRecord, prompt: Prompt) -> Self {
        let body = sh
            .ep
            .body(&prompt, rec.request.output_tokens, sh.streams(rec));
        Self { prompt, body }
    }

    /// A first round (or single request): prefix and own text.
    fn first(sh: &Shared, rec: &TraceRecord) -> Self {
        Self::new(sh, rec, first_prompt(sh.ep.api(), rec, sh.tokens_per_word))
    }
}

/// The conversation so far of a session whose context accumulates.
#[derive(Debug, Clone)]
struct History {
    prompt: Prompt,
    answer: String,
    planned_in: u32,
    planned_out: u32,
}

/// A unit of the schedule: one request, or a session's rounds in order.
type Unit = Vec<TraceRecord>;

/// A plan's units in order of their first send, held or generated.
type Units = Box<dyn Iterator<Item = Unit> + Send>;

/// Groups planned rows into units ordered by their first send.
fn units(records: Vec<TraceRecord>) -> Vec<Unit> {
    let mut sessions: BTreeMap<Arc<str>, Unit> = BTreeMap::new();
    let mut out: Vec<Unit> = Vec::new();
    for r in records {
        if r.request.session_id.is_empty() {
            out.push(vec![r]);
        } else {
            sessions
                .entry(r.request.session_id.clone())
                .or_default()
                .push(r);
        }
    }
    for (_, mut s) in sessions {
        s.sort_by_key(|r| (r.request.round_index, r.request.request_id));
        out.push(s);
    }
    out.sort_by_key(|u| (u[0].request.arrival_time_us, u[0].request.request_id));
    out
}

/// The prompt of a request: its prefix group's shared text and its own.
fn first_prompt(api: Api, r: &TraceRecord, tpw: f64) -> Prompt {
    let req = &r.request;
    let prefix = prompt::prefix_text(req, tpw);
    let own = req.input_tokens.saturating_sub(if prefix.is_empty() {
        0
    } else {
        req.prefix_length
    });
    let body = prompt::body_text(req, own, tpw);
    match api {
        Api::Completions => Prompt::Text(format!("{prefix}{body}")),
        Api::Chat => {
            let mut m = Vec::new();
            if !prefix.is_empty() {
                m.push(Message {
                    role: "system",
                    content: prefix.trim_start().to_string(),
                });
            }
            m.push(Message {
                role: "user",
                content: body.trim_start().to_string(),
            });
            Prompt::Chat(m)
        }
    }
}

/// The prompt of a later round that carries the conversation: the previous
/// prompt, the real previous answer, and a new question of the planned
/// growth.
fn next_prompt(h: &History, r: &TraceRecord, tpw: f64) -> Prompt {
    let question_tokens = r
        .request
        .input_tokens
        .saturating_sub(h.planned_in.saturating_add(h.planned_out));
    let q = prompt::body_text(&r.request, question_tokens.max(1), tpw);
    match &h.prompt {
        Prompt::Text(t) => Prompt::Text(format!("{t}{}\n{q}", h.answer)),
        Prompt::Chat(m) => {
            let mut m = m.clone();
            m.push(Message {
                role: "assistant",
                content: h.answer.clone(),
            });
            m.push(Message {
                role: "user",
                content: q.trim_start().to_string(),
            });
            Prompt::Chat(m)
        }
    }
}

fn accumulates(sh: &Shared, r: &TraceRecord, prev: &TraceRecord) -> bool {
    match sh.growth.get(&*r.request.client_id) {
        Some(g) => *g == ContextGrowth::Accumulate,
        None => {
            r.request.input_tokens
                >= prev
                    .request
                    .input_tokens
                    .saturating_add(prev.request.output_tokens)
        }
    }
}

/// Sleeps until `at` unless the run stops first; returns false if it did.
async fn wait_until(sh: &Shared, at: Instant) -> bool {
    let mut stop = sh.stopping.subscribe();
    if sh.stopping() {
        return false;
    }
    if at <= Instant::now() {
        return true;
    }
    let timer = PreciseTimer::new();
    tokio::select! {
        () = timer.sleep_until(at) => !sh.stopping(),
        _ = stop.wait_for(|s| *s) => false,
    }
}

/// Runs one unit. `closed_loop_start` is the intended send of the first
/// round in closed-loop mode (when its worker took it).
async fn run_unit(
    sh: Arc<Shared>,
    unit: Unit,
    closed_loop_start: Option<i64>,
    mut first: Option<Ready>,
) {
    let mut prev: Option<(TraceRecord, i64)> = None; // (row, response end, rel µs)
    let mut history: Option<History> = None;
    let mut rounds = unit.into_iter();
    while let Some(mut rec) = rounds.next() {
        let intended = match &prev {
            None => closed_loop_start.unwrap_or(rec.request.arrival_time_us),
            Some((_, end)) => {
                let after = end + rec.request.think_time_us.unwrap_or(0).max(0);
                if closed_loop_start.is_some() {
                    after
                } else {
                    after.max(rec.request.arrival_time_us)
                }
            }
        };
        if prev.is_some() && !wait_until(&sh, sh.instant(intended)).await {
            sh.not_sent(rec, "the run stopped before this round");
            for r in rounds {
                sh.not_sent(r, "the run stopped before this round");
            }
            return;
        }
        let keep_text = rounds.len() > 0;
        let ready = match (first.take(), &history, &prev) {
            (Some(r), _, _) => r,
            (None, Some(h), Some((p, _))) if accumulates(&sh, &rec, p) => {
                Ready::new(&sh, &rec, next_prompt(h, &rec, sh.tokens_per_word))
            }
            _ => Ready::first(&sh, &rec),
        };
        rec.request.arrival_time_us = intended;
        let Ready { prompt: p, body } = ready;
        let (rec, cap, ok) = send_one(&sh, rec, intended, body, keep_text).await;
        if !ok {
            let why = if rec.outcome.status == Some(Status::Cancelled) {
                "the run stopped before this round"
            } else {
                "an earlier round of the session failed"
            };
            let rest: Vec<TraceRecord> = rounds.collect();
            emit_done(&sh, rec, cap);
            for r in rest {
                sh.not_sent(r, why);
            }
            return;
        }
        let end = cap.last_us.unwrap_or(sh.run_start_us) - sh.run_start_us;
        history = Some(History {
            prompt: p,
            answer: cap.text.clone(),
            planned_in: rec.request.input_tokens,
            planned_out: rec.request.output_tokens,
        });
        // Keep the planned lengths for the growth of the next round.
        let planned = rec.clone();
        emit_done(&sh, rec, cap);
        prev = Some((planned, end));
    }
}

/// Sends one request, returning its row (outcome filled in, output tokens
/// as the server counted them), its capture and whether it succeeded.
async fn send_one(
    sh: &Shared,
    mut rec: TraceRecord,
    intended_rel_us: i64,
    body: Vec<u8>,
    keep_text: bool,
) -> (TraceRecord, Capture, bool) {
    let mut cap = Capture::new(keep_text);
    let mut stop = sh.stopping.subscribe();
    let _permit = match &sh.sem {
        Some(sem) => tokio::select! {
            p = sem.clone().acquire_owned() => p.ok(),
            _ = stop.wait_for(|s| *s) => None,
        },
        None => None,
    };
    if sh.stopping() {
        rec.outcome.status = Some(Status::Cancelled);
        rec.outcome.error_message = Failure {
            kind: ErrorKind::NotSent,
            detail: "the run stopped before this request".into(),
        }
        .message();
        return (rec, cap, false);
    }
    let stream = sh.streams(&rec);
    rec.request.streaming = stream;
    let xid = format!("{}-{}", sh.xid_prefix, rec.request.request_id);
    let timeout = match rec.request.deadline_us {
        Some(d) if d > intended_rel_us => sh
            .timeout
            .min(Duration::from_micros((d - intended_rel_us) as u64)),
        _ => sh.timeout,
    };
    sh.progress.sent.fetch_add(1, Ordering::Relaxed);
    sh.progress.in_flight.fetch_add(1, Ordering::Relaxed);
    let mut cancel = sh.cancel.subscribe();
    let res = tokio::select! {
        r = tokio::time::timeout(timeout, sh.ep.send(body, stream, &xid, &sh.clock, &mut cap)) => match r {
            Ok(r) => r,
            Err(_) => Err(Failure { kind: ErrorKind::Timeout, detail: String::new() }),
        },
        _ = cancel.wait_for(|c| *c) => Err(Failure { kind: ErrorKind::Cancelled, detail: String::new() }),
    };
    sh.progress.in_flight.fetch_sub(1, Ordering::Relaxed);
    let ok = record_outcome(sh, &mut rec, &cap, res, stream, xid, timeout);
    (rec, cap, ok)
}

/// Fills `rec`'s outcome from what was captured of its exchange and how it
/// ended (`res`); returns whether it succeeded. A failure's message says
/// how far the exchange got.
fn record_outcome(
    sh: &Shared,
    rec: &mut TraceRecord,
    cap: &Capture,
    res: std::result::Result<(), Failure>,
    stream: bool,
    xid: String,
    timeout: Duration,
) -> bool {
    let o = &mut rec.outcome;
    o.send_time_us = cap.send_us;
    o.first_chunk_time_us = cap.first_us;
    o.last_chunk_time_us = cap.last_us;
    o.num_chunks = if stream {
        cap.chunk_times.len() as u32
    } else {
        u32::from(cap.first_us.is_some())
    };
    o.http_status = cap.http_status;
    o.server_input_tokens = cap.prompt_tokens;
    o.cached_tokens = cap.cached_tokens;
    o.finish_reason.clone_from(&cap.finish_reason);
    o.x_request_id = Some(xid);
    match res {
        Ok(()) => {
            o.status = Some(Status::Ok);
            if let Some(n) = cap.output_tokens() {
                rec.request.output_tokens = n;
            }
            if cap.completion_tokens.is_none() {
                o.error_message =
                    "warning: no usage in the response; output tokens counted from content chunks"
                        .into();
            }
            true
        }
        Err(mut f) => {
            let got = format!(
                "after {:.1} ms, {} chunks received",
                cap.send_us
                    .map_or(0.0, |s| (sh.clock.now_us() - s) as f64 / 1e3),
                cap.chunk_times.len()
            );
            o.status = Some(match f.kind {
                ErrorKind::Timeout => {
                    f.detail = format!(
                        "no complete response within {:.1} s ({got})",
                        timeout.as_secs_f64()
                    );
                    Status::Timeout
                }
                ErrorKind::Cancelled => {
                    f.detail = format!("the run was interrupted ({got})");
                    Status::Cancelled
                }
                _ => Status::Error,
            });
            if o.last_chunk_time_us.is_none() && f.kind != ErrorKind::Connect {
                o.last_chunk_time_us = Some(sh.clock.now_us());
            }
            o.error_message = f.message();
            false
        }
    }
}

fn emit_done(sh: &Shared, rec: TraceRecord, cap: Capture) {
    if rec.request.streaming {
        sh.emit(rec, cap.chunk_times, cap.chunk_tokens);
    } else {
        sh.emit(rec, Vec::new(), Vec::new());
    }
}

/// Waits for SIGINT or SIGTERM.
struct Signals {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> std::io::Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Ok(Self {
                term: signal(SignalKind::terminate())?,
                int: signal(SignalKind::interrupt())?,
            })
        }
        #[cfg(not(unix))]
        Ok(Self {})
    }

    async fn recv(&mut self) {
        #[cfg(unix)]
        tokio::select! {
            _ = self.term.recv() => {},
            _ = self.int.recv() => {},
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Validated numeric options.
fn check_args(args: &RunOptions) -> Result<Option<Slo>> {
    if !(args.timeout_s > 0.0 && args.timeout_s.is_finite()) {
        return Err(CommandError::Usage(format!(
            "--timeout-s must be a positive number of seconds, got {}",
            args.timeout_s
        )));
    }
    if !(args.grace_s >= 0.0 && args.grace_s.is_finite()) {
        return Err(CommandError::Usage(format!(
            "--grace-s must be a non-negative number of seconds, got {}",
            args.grace_s
        )));
    }
    if !(args.max_send_lag_ms > 0.0 && args.max_send_lag_ms.is_finite()) {
        return Err(CommandError::Usage(format!(
            "--max-send-lag-ms must be positive, got {}",
            args.max_send_lag_ms
        )));
    }
    if !(0.0..=1.0).contains(&args.max_error_rate) {
        return Err(CommandError::Usage(format!(
            "--max-error-rate must be a fraction in [0, 1], got {}",
            args.max_error_rate
        )));
    }
    if let Some(d) = args.duration_s
        && !(d > 0.0 && d.is_finite())
    {
        return Err(CommandError::Usage(format!(
            "--duration-s must be a positive number of seconds, got {d}"
        )));
    }
    if args.concurrency == Some(0) {
        return Err(CommandError::Usage(
            "--concurrency must be at least 1".into(),
        ));
    }
    if args.max_in_flight == Some(0) {
        return Err(CommandError::Usage(
            "--max-in-flight must be at least 1".into(),
        ));
    }
    if !(args.server_url.starts_with("http://") || args.server_url.starts_with("https://")) {
        return Err(CommandError::Usage(format!(
            "--server-url must start with http:// or https://, got {:?}",
            args.server_url
        )));
    }
    args.slo
        .as_deref()
        .map(str::parse::<Slo>)
        .transpose()
        .map_err(CommandError::Usage)
}

/// `blis-loadgen run`. Returns the process exit code: 0 valid, 3
/// client-bound with `--strict`, 4 interrupted, 5 failed.
///
/// # Errors
/// Bad options or workload, an unreachable server, unwritable output.
pub fn run_command(args: &RunOptions, out: &mut dyn Write) -> Result<i32> {
    let slo = check_args(args)?;
    if args.api_key.is_some() && key_on_command_line(std::env::args()) {
        blis_traces::diag!(
            "warning: --api-key on the command line is visible to other users of this machine (ps, /proc); set BLIS_API_KEY instead"
        );
    }
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    if args.client_threads > 0 {
        rt.worker_threads(args.client_threads);
    }
    let rt = rt
        .enable_all()
        .thread_name("blis-loadgen")
        .build()
        .step(|| "starting the async runtime")?;
    let summary = rt.block_on(run_async(args, slo))?;
    if args.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&summary)?)?;
    } else {
        write!(out, "{}", summary.to_markdown())?;
    }
    Ok(if summary.failed {
        exit_code::FAILED
    } else if summary.interrupted {
        exit_code::INTERRUPTED
    } else if summary.schedule.client_bound && args.strict {
        exit_code::CLIENT_BOUND
    } else {
        exit_code::OK
    })
}

/// The plan of a run: its requests in send order and what the header and
/// the summary need to know of it.
struct Plan {
    header: TraceHeader,
    /// Its units in order of their first send.
    units: PlannedUnits,
    /// Facts of the whole plan, gathered before the run.
    facts: PlanFacts,
    growth: BTreeMap<String, ContextGrowth>,
    warmup: u64,
}

/// The units of a plan: generated as the run goes (a generated workload
/// without sessions, so that memory does not grow with the run's length),
/// or all held (sessions, whose later rounds must be at hand when the
/// earlier ones end; traces and imports, read whole).
enum PlannedUnits {
    Generated(GeneratedWorkload),
    Held(Vec<Unit>),
}

impl PlannedUnits {
    /// The units, in order; those of `shard` only with one.
    fn into_iter(self, shard: Option<Shard>) -> Units {
        let all = self.all_units();
        match shard {
            None => all,
            Some(s) => Box::new(
                all.enumerate()
                    .filter(move |(k, _)| s.has(*k))
                    .map(|(_, u)| u),
            ),
        }
    }

    /// Every unit, in order.
    fn all_units(self) -> Units {
        match self {
            Self::Held(u) => Box::new(u.into_iter()),
            Self::Generated(g) => match g.records() {
                Ok(it) => Box::new(it.map_while(|r| match r {
                    Ok(r) => Some(vec![r]),
                    Err(e) => {
                        // The same generation succeeded when the plan was
                        // scanned; only a data file changed since can fail.
                        blis_traces::diag!("error: generating the workload again: {e}");
                        None
                    }
                })),
                Err(e) => {
                    blis_traces::diag!("error: generating the workload again: {e}");
                    Box::new(std::iter::empty())
                }
            },
        }
    }
}

/// What a run needs to know of its whole plan before it starts, gathered
/// in one pass over the planned requests (in arrival order).
#[derive(Debug)]
struct PlanFacts {
    /// Planned requests.
    count: u64,
    /// Their ids as ranges ([`blis_traces::header::id_ranges`]).
    planned_ids: Option<String>,
    /// The trace's extra columns.
    extras: Vec<ExtraColumn>,
    /// Whether any request streams.
    any_streaming: bool,
    /// Whether any request belongs to a session.
    any_session: bool,
    /// Requests with ids below this are warm-up.
    warmup_below: u64,
    /// The planned rate (open loop): requests over the arrival span.
    requested_rate: Option<f64>,
    /// The whole plan's fingerprint ([`TraceHeader::plan_hash`]).
    plan_hash: String,
}

impl PlanFacts {
    /// The facts of a plan given as `(unit, request)` in send order, for
    /// the part `shard` of it (all of it without one); the ids of the
    /// `warmup` smallest of the whole plan are warm-up.
    fn gather<R: std::borrow::Borrow<TraceRecord>>(
        items: impl Iterator<Item = Result<(usize, R), blis_traces::Error>>,
        warmup: u64,
        closed_loop: bool,
        shard: Option<Shard>,
    ) -> Result<Self> {
        let mut ids: Vec<(u64, u64)> = Vec::new();
        let mut unsorted_ids: Vec<u64> = Vec::new();
        let mut count = 0u64;
        let (mut any_streaming, mut any_session) = (false, false);
        let (mut first, mut last) = (i64::MAX, i64::MIN);
        // One row showing each extra column, in order of appearance.
        let mut shown: Vec<ExtraColumn> = Vec::new();
        let mut showing: Vec<TraceRecord> = Vec::new();
        // The warmup + 1 smallest ids (a max-heap).
        let mut smallest: std::collections::BinaryHeap<u64> = std::collections::BinaryHeap::new();
        let mut hash = xxhash_rust::xxh3::Xxh3::new();
        let mut all = 0u64;
        for item in items {
            let (unit, r) = item
                .map_err(PlanError::Workload)
                .step(|| "planning the workload")?;
            let r: &TraceRecord = r.borrow();
            let id = r.request.request_id;
            all += 1;
            any_session |= !r.request.session_id.is_empty();
            hash_request(&mut hash, r);
            if warmup > 0 {
                if (smallest.len() as u64) <= warmup {
                    smallest.push(id);
                } else if smallest.peek().is_some_and(|&m| id < m) {
                    smallest.pop();
                    smallest.push(id);
                }
            }
            if shard.is_some_and(|s| !s.has(unit)) {
                continue;
            }
            count += 1;
            any_streaming |= r.request.streaming;
            first = first.min(r.request.arrival_time_us);
            last = last.max(r.request.arrival_time_us);
            match ids.last_mut() {
                Some(l) if id == l.1.wrapping_add(1) => l.1 = id,
                Some(l) if id <= l.1 => unsorted_ids.push(id),
                _ => ids.push((id, id)),
            }
            let new: Vec<ExtraColumn> = ExtraColumn::needed_for([r])
                .into_iter()
                .filter(|e| !shown.contains(e))
                .collect();
            if !new.is_empty() {
                shown.extend(new);
                showing.push(r.clone());
            }
        }
        if all == 0 {
            return Err(CommandError::Usage("the workload has no requests".into()));
        }
        if count == 0 {
            return Err(CommandError::Usage(format!(
                "--shard {}/{}: the workload's {all} requests leave this part none (fewer units than parts)",
                shard.map_or(0, |s| s.index),
                shard.map_or(1, |s| s.count)
            )));
        }
        hash.update(&all.to_le_bytes());
        let planned_ids = if unsorted_ids.is_empty() {
            blis_traces::header::format_id_ranges(&ids)
        } else {
            let mut all: Vec<u64> = ids.iter().flat_map(|&(a, b)| a..=b).collect();
            all.extend(unsorted_ids);
            all.sort_unstable();
            all.dedup();
            blis_traces::header::id_ranges(&all)
        };
        let warmup_below = if warmup == 0 {
            0
        } else if smallest.len() as u64 > warmup {
            smallest.peek().copied().unwrap_or(u64::MAX)
        } else {
            u64::MAX
        };
        let requested_rate = if closed_loop || count < 2 {
            None
        } else {
            let span = last - first;
            (span > 0).then(|| (count - 1) as f64 / (span as f64 / 1e6))
        };
        Ok(Self {
            count,
            planned_ids,
            extras: ExtraColumn::needed_for(&showing),
            any_streaming,
            any_session,
            warmup_below,
            requested_rate,
            plan_hash: format!("{:016x}", hash.digest()),
        })
    }
}

/// Feeds what defines a planned request to the plan's hash.
fn hash_request(h: &mut xxhash_rust::xxh3::Xxh3, r: &TraceRecord) {
    let q = &r.request;
    for x in [
        q.request_id,
        q.arrival_time_us as u64,
        u64::from(q.input_tokens),
        u64::from(q.output_tokens),
        u64::from(q.round_index),
        u64::from(q.prefix_length),
        u64::from(q.streaming),
        q.think_time_us.map_or(u64::MAX, |t| t as u64),
    ] {
        h.update(&x.to_le_bytes());
    }
    for t in [&*q.session_id, &*q.client_id, &*q.prefix_group] {
        h.update(&(t.len() as u64).to_le_bytes());
        h.update(t.as_bytes());
    }
}

/// The requests of held units as `(unit, request)`, for [`PlanFacts::gather`].
fn indexed(
    units: &[Unit],
) -> impl Iterator<Item = Result<(usize, &TraceRecord), blis_traces::Error>> + '_ {
    units
        .iter()
        .enumerate()
        .flat_map(|(k, u)| u.iter().map(move |r| Ok((k, r))))
}

/// Phase 1: the workload, planned and sorted by send time.
fn plan(args: &RunOptions) -> Result<Plan> {
    let closed_loop = args.concurrency.is_some();
    let opts = GenerateOptions {
        seed: args.seed,
        horizon_us: if closed_loop {
            None
        } else {
            args.duration_s.map(|s| (s * 1e6).round() as u64)
        },
        num_requests: args.num_requests,
        aggregate_rate: args.aggregate_rate,
    };
    let (header, workload) =
        plan_workload(&args.workload, &args.synthetic, &opts).step(|| "planning the workload")?;
    let warmup = if args.warmup_requests > 0 {
        args.warmup_requests
    } else {
        header.warm_up_requests
    };
    let shard = args.shard;
    let (facts, units) = match workload {
        Workload::Loaded(mut records) => {
            for r in &mut records {
                r.outcome = Default::default();
                r.other.clear();
            }
            records.sort_by_key(|r| (r.request.arrival_time_us, r.request.request_id));
            let units = units(records);
            let facts = PlanFacts::gather(indexed(&units), warmup, closed_loop, shard)?;
            (facts, PlannedUnits::Held(units))
        }
        Workload::Generated(g) => {
            let it = g.records().step(|| "planning the workload")?;
            let facts = PlanFacts::gather(
                it.enumerate().map(|(k, r)| r.map(|r| (k, r))),
                warmup,
                closed_loop,
                shard,
            )?;
            if facts.any_session {
                let records = g
                    .records()
                    .step(|| "planning the workload")?
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(PlanError::Workload)
                    .step(|| "planning the workload")?;
                let units = units(records);
                let facts = PlanFacts::gather(indexed(&units), warmup, closed_loop, shard)?;
                (facts, PlannedUnits::Held(units))
            } else {
                (facts, PlannedUnits::Generated(g))
            }
        }
    };
    let growth: BTreeMap<String, ContextGrowth> = match &args.workload.workload_spec {
        Some(p) => WorkloadSpec::from_file(p)?
            .clients
            .iter()
            .filter_map(|c| {
                let m = c.reasoning.as_ref()?.multi_turn?;
                Some((c.id.clone(), m.context_growth))
            })
            .collect(),
        None => BTreeMap::new(),
    };
    Ok(Plan {
        header,
        units,
        facts,
        growth,
        warmup,
    })
}

/// The schedule's origin, Unix µs: `start_at` (Unix s), which must lie
/// ahead within a day, or 0.2 s after `now_us`.
fn start_time_us(start_at: Option<f64>, now_us: i64) -> Result<i64> {
    let Some(t) = start_at else {
        return Ok(now_us + 200_000);
    };
    let us = t * 1e6;
    let ahead_s = (us - now_us as f64) / 1e6;
    if !ahead_s.is_finite() || ahead_s > 86_400.0 {
        return Err(CommandError::Usage(format!(
            "--start-at {t}: more than a day ahead (a Unix time in seconds, e.g. $(( $(date +%s) + 10 )))"
        )));
    }
    if ahead_s < 0.05 {
        return Err(CommandError::Usage(format!(
            "--start-at {t}: {:.3} s in the past by this machine's clock (start the shards earlier, or check their clocks)",
            -ahead_s
        )));
    }
    Ok(us.round() as i64)
}

/// What the probes found out about the server.
struct Server {
    client: reqwest::Client,
    info: probe::ServerInfo,
    ep: Endpoint,
    tokens_per_word: f64,
    metrics_url: String,
    scrape_on: bool,
    /// KV cache settings from its metrics.
    cache: Option<probe::CacheConfig>,
    /// Its version (`GET /version`).
    version: Option<String>,
    /// llama.cpp's slots and context (`GET /props`).
    props: Option<probe::LlamaCppProps>,
}

/// Whether the process's arguments carry an API key (`--api-key K` or
/// `--api-key=K`), where `ps` shows it.
fn key_on_command_line(args: impl Iterator<Item = String>) -> bool {
    args.into_iter()
        .any(|a| a == "--api-key" || a.starts_with("--api-key="))
}

/// Phase 2: the server, checked and measured (tokens per word, its KV
/// cache from its metrics).
async fn connect(args: &RunOptions) -> Result<Server> {
    let base = args.server_url.trim_end_matches('/').to_string();
    let client = crate::http::client().step(|| "building the HTTP client")?;
    let info = probe::check_server(
        &client,
        &base,
        &args.model,
        args.api_key.as_deref(),
        Duration::from_secs(60),
    )
    .await?;
    let ep = Endpoint::new(
        client.clone(),
        &base,
        args.api,
        args.server_type,
        &args.model,
        args.api_key.as_deref(),
    )
    .map_err(CommandError::Usage)?;
    let tpw =
        probe::tokens_per_word(&client, &base, &args.model, args.api_key.as_deref(), &ep).await;
    if let Some(f) = &tpw.calibration_failure {
        // A refusal every request would get: stop before sending any.
        let path = ep.path();
        if f.starts_with("http_401") || f.starts_with("http_403") {
            return Err(CommandError::Usage(format!(
                "{base}{path} refused a test request ({f}): the server wants an API key (--api-key, or BLIS_API_KEY); nothing was sent"
            )));
        }
        if f.starts_with("http_404") || f.starts_with("http_405") {
            return Err(CommandError::Usage(format!(
                "{base}{path} answered a test request with {f}: not an OpenAI-compatible server, or not its base URL (or --api completions|chat is the other one); nothing was sent"
            )));
        }
        blis_traces::diag!(
            "warning: a one-token test request to {base} failed ({f}); the run's requests will likely fail the same way"
        );
    }
    let metrics_url = args
        .metrics_url
        .clone()
        .unwrap_or_else(|| format!("{base}/metrics"));
    let mut scrape_on = args.scrape_interval_ms > 0;
    let mut cache = None;
    if scrape_on {
        match scrape::scrape_once(
            &client,
            &metrics_url,
            args.api_key.as_deref(),
            Duration::from_secs(5),
        )
        .await
        {
            Ok(s) => cache = probe::cache_config(&s),
            Err(e) => {
                blis_traces::diag!("warning: no metrics at {metrics_url} ({e}); scraping is off");
                scrape_on = false;
            }
        }
    }
    let props = if args.server_type == ServerType::Llamacpp {
        probe::llamacpp_props(&client, &base, args.api_key.as_deref()).await
    } else {
        None
    };
    let version = match probe::server_version(&client, &base, args.api_key.as_deref()).await {
        Some(v) => Some(v),
        None => props.as_ref().and_then(|p| p.build.clone()),
    };
    blis_traces::diag!(
        "server {base}: model {}{}, round trip {}, {:.3} tokens per word ({}){}",
        args.model,
        version
            .as_deref()
            .map_or(String::new(), |v| format!(", version {v}")),
        info.rtt_ms
            .map_or("unknown".into(), |r| format!("{r:.2} ms")),
        tpw.value,
        tpw.source,
        cache.map_or(String::new(), |c| format!(
            ", KV cache {} blocks of {} tokens",
            c.num_gpu_blocks, c.block_size
        ))
    );
    Ok(Server {
        client,
        info,
        ep,
        tokens_per_word: tpw.value,
        metrics_url,
        scrape_on,
        cache,
        version,
        props,
    })
}

/// Phase 3: the trace's header (completed at the end) and its columns.
fn trace_header(
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
    header.server = Some(ServerConfig {
        server_type: Some(server_type_name(args.server_type).to_string()),
        model: Some(args.model.clone()),
        block_size: server.cache.and_then(|c| u32::try_from(c.block_size).ok()),
        total_kv_blocks: server.cache.map(|c| c.num_gpu_blocks),
        enable_prefix_caching: server.cache.and_then(|c| c.enable_prefix_caching),
        version: server.version.clone(),
        max_model_len: server
            .info
            .max_model_len
            .or_else(|| server.props.as_ref().and_then(|p| p.n_ctx)),
        max_num_seqs: server.props.as_ref().map(|p| p.slots),
        ..ServerConfig::default()
    });
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

/// A progress bar kept up to date every 250 ms until aborted: requests
/// done of planned, sent, in flight, failed, the send rate, and TTFT
/// p50/p99 and send-lag p99 so far (the recorder's live histograms).
fn spawn_progress(
    sh: &Arc<Shared>,
    bar: &indicatif::ProgressBar,
    live: Arc<crate::record::Live>,
) -> tokio::task::JoinHandle<()> {
    let (sh, bar) = (sh.clone(), bar.clone());
    tokio::spawn(async move {
        let mut t = tokio::time::interval(Duration::from_millis(250));
        loop {
            t.tick().await;
            let p = &sh.progress;
            let elapsed = (sh.clock.now_us() - sh.run_start_us).max(1) as f64 / 1e6;
            let sent = p.sent.load(Ordering::Relaxed);
            bar.set_position(p.done.load(Ordering::Relaxed));
            bar.set_message(progress_message(
                sent,
                p.in_flight.load(Ordering::Relaxed),
                p.not_ok.load(Ordering::Relaxed),
                sent as f64 / elapsed,
                &live,
            ));
        }
    })
}

/// The progress line's message.
fn progress_message(
    sent: u64,
    in_flight: u64,
    not_ok: u64,
    rate: f64,
    live: &crate::record::Live,
) -> String {
    use crate::record::Live;
    let ms = |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{x:.1}"));
    format!(
        "sent {sent} ({rate:.1} req/s), in flight {in_flight}, failed {not_ok} | TTFT p50 {} p99 {} ms | send lag p99 {} ms",
        ms(Live::ms(&live.ttft_p50_us)),
        ms(Live::ms(&live.ttft_p99_us)),
        ms(Live::ms(&live.lag_p99_us)),
    )
}

/// Phase 4: the senders, open loop (each request at its time) or closed
/// loop (`--concurrency` users); each holds `done` until it ends.
fn dispatch(
    args: &RunOptions,
    sh: &Arc<Shared>,
    units: Units,
    done: &tokio::sync::mpsc::Sender<()>,
) -> Dispatcher {
    let Some(n) = args.concurrency else {
        return Dispatcher::Open(tokio::spawn(dispatch_open_loop(
            sh.clone(),
            units,
            done.clone(),
        )));
    };
    let queue = Arc::new(Mutex::new(units));
    let deadline = args
        .duration_s
        .map(|s| sh.run_start_us + (s * 1e6).round() as i64);
    for _ in 0..n {
        let (sh, queue, done) = (sh.clone(), queue.clone(), done.clone());
        tokio::spawn(async move {
            let start = sh.instant(0);
            if !wait_until(&sh, start).await {
                drop(sh);
                drop(done);
                return;
            }
            loop {
                let now = sh.clock.now_us();
                if sh.stopping() || deadline.is_some_and(|d| now >= d) {
                    break;
                }
                let unit = queue
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .next();
                let Some(unit) = unit else { break };
                run_unit(sh.clone(), unit, Some(now - sh.run_start_us), None).await;
            }
            drop(sh);
            drop(done);
        });
    }
    Dispatcher::Closed(queue)
}

/// Phase 5: waits for every sender to end, or for a signal: then no more
/// sends, up to `--grace-s` for the requests in flight (a second signal
/// cancels them at once). Returns whether the run was interrupted.
async fn wait_for_end(
    args: &RunOptions,
    sh: &Shared,
    signals: &mut Signals,
    mut done: tokio::sync::mpsc::Receiver<()>,
    bar: &indicatif::ProgressBar,
) -> bool {
    let all_done = async { while done.recv().await.is_some() {} };
    tokio::pin!(all_done);
    tokio::select! {
        () = &mut all_done => false,
        () = signals.recv() => {
            sh.stopping.send_replace(true);
            let n = sh.progress.in_flight.load(Ordering::Relaxed);
            bar.suspend(|| blis_traces::diag!(
                "interrupted: no more sends; waiting up to {:.1} s for {n} requests in flight (signal again to cancel them now)",
                args.grace_s
            ));
            // `all_done` may finish inside the grace period; a finished
            // future must not be polled again.
            let finished = tokio::select! {
                () = &mut all_done => true,
                () = tokio::time::sleep(saturating_secs(args.grace_s)) => false,
                () = signals.recv() => false,
            };
            sh.cancel.send_replace(true);
            if !finished {
                all_done.await;
            }
            true
        }
    }
}

/// The shared state once every task that held it has ended.
async fn unwrap_shared(mut sh: Arc<Shared>) -> Result<Shared> {
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

async fn run_async(args: &RunOptions, slo: Option<Slo>) -> Result<Summary> {
    let mut signals = Signals::new().step(|| "installing signal handlers")?;
    let plan = plan(args)?;
    let server = connect(args).await?;

    let warm = probe::connections_to_warm(
        plan.facts.requested_rate,
        args.concurrency,
        args.max_in_flight,
    );
    let base = args.server_url.trim_end_matches('/');
    let opened = probe::warm_connections(&server.client, base, args.api_key.as_deref(), warm).await;
    if opened < warm {
        blis_traces::diag!(
            "warning: {opened} of {warm} connections opened before the run; the first sends may wait for the rest"
        );
    }

    // The trace, recorded by its own thread.
    let clock = RunClock::new();
    // A short lead so that the first sends are not late from set-up, or
    // the agreed start of the shards.
    let run_start_us = start_time_us(args.start_at, clock.now_us())?;
    let any_stream = !args.no_stream && plan.facts.any_streaming;
    let scrape_on = server.scrape_on;
    let Recorder {
        mut header,
        tx,
        thread: recorder,
        failed: record_failed,
        live,
    } = start_recorder(args, &plan, &server, run_start_us, any_stream, slo)?;
    let (stopping, _) = watch::channel(false);
    let (cancel, _) = watch::channel(false);
    let total = plan.facts.count;
    let sh = Arc::new(Shared {
        ep: server.ep,
        clock,
        run_start_us,
        tokens_per_word: server.tokens_per_word,
        no_stream: args.no_stream,
        timeout: saturating_secs(args.timeout_s),
        tx: tx.clone(),
        sem: args.max_in_flight.map(|n| Arc::new(Semaphore::new(n))),
        stopping,
        cancel,
        progress: Progress::default(),
        growth: plan.growth,
        xid_prefix: format!("blis-{:x}", run_start_us),
        record_failed: record_failed.clone(),
        max_behind: (args.max_behind_s > 0.0).then(|| saturating_secs(args.max_behind_s)),
        stopped_behind_us: AtomicU64::new(0),
        behind_after: saturating_secs(args.max_send_lag_ms / 1e3),
    });

    // The scraper and the progress bar, beside the senders.
    let scrape_stats = Arc::new(scrape::ScrapeStats::default());
    let (scrape_stop, scrape_stop_rx) = watch::channel(false);
    let scraper = scrape_on.then(|| {
        tokio::spawn(scrape::run(scrape::ScrapeConfig {
            client: server.client.clone(),
            url: server.metrics_url.clone(),
            api_key: args.api_key.clone(),
            interval: Duration::from_millis(args.scrape_interval_ms),
            clock,
            out: tx.clone(),
            stats: scrape_stats.clone(),
            stop: scrape_stop_rx,
        }))
    });
    drop(tx);
    let bar = progress_bar(total);
    let ticker = spawn_progress(&sh, &bar, live);
    let (done_tx, done_rx) = tokio::sync::mpsc::channel::<()>(1);
    let (warmup_below, requested_rate) = (plan.facts.warmup_below, plan.facts.requested_rate);
    let dispatcher = dispatch(args, &sh, plan.units.into_iter(args.shard), &done_tx);
    drop(done_tx);
    let interrupted = wait_for_end(args, &sh, &mut signals, done_rx, &bar).await;

    // Everything stops; the recorder hands back what it wrote.
    ticker.abort();
    let _ = ticker.await;
    scrape_stop.send_replace(true);
    if let Some(s) = scraper {
        let _ = s.await;
    }
    end_dispatch(dispatcher, &sh, interrupted).await;
    bar.finish_and_clear();
    // Every task has ended; the last references go as they unwind.
    let sh = unwrap_shared(sh).await?;
    drop(sh.tx);
    let mut recorded = recorder
        .join()
        .map_err(|_| CommandError::Internal("the recorder thread panicked".into()))?;
    let rows = recorded.tally.rows();
    let stopped_behind_us = sh.stopped_behind_us.load(Ordering::Relaxed);
    let summary = summarize_run(
        &mut recorded,
        RunEnd {
            warmup_below,
            requested_rate,
            slo,
            interrupted,
            run_start_us,
            stopped_behind_s: (stopped_behind_us > 0).then(|| stopped_behind_us as f64 / 1e6),
        },
        args,
    );
    header.load_generator = Some(LoadGeneratorInfo {
        requested_rate: summary.schedule.requested_rate,
        achieved_rate: summary.schedule.achieved_rate,
        send_lag_p50_ms: summary.schedule.send_lag_p50_ms,
        send_lag_p99_ms: summary.schedule.send_lag_p99_ms,
        client_bound: Some(summary.schedule.client_bound),
        timeout_s: Some(args.timeout_s),
    });
    finish_trace(
        recorded,
        rows,
        &header,
        &scrape_stats,
        any_stream,
        scrape_on,
    )?;
    Ok(summary)
}

/// How a run went, for its summary.
struct RunEnd {
    /// Requests with ids below this are warm-up.
    warmup_below: u64,
    /// The plan's rate.
    requested_rate: Option<f64>,
    slo: Option<Slo>,
    interrupted: bool,
    run_start_us: i64,
    /// How far behind the client stopped sending, s.
    stopped_behind_s: Option<f64>,
}

/// The run's summary from what was recorded.
fn summarize_run(recorded: &mut Recorded, end: RunEnd, args: &RunOptions) -> Summary {
    let inp = summary_inputs(end.warmup_below, end.run_start_us, end.slo);
    let tally = std::mem::replace(&mut recorded.tally, Tally::new(&inp));
    tally.summary(
        &recorded.itl_us,
        &SummaryInputs {
            requested_rate: end.requested_rate,
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
fn summary_inputs(warmup_below: u64, run_start_us: i64, slo: Option<Slo>) -> SummaryInputs {
    SummaryInputs {
        warmup_below_id: warmup_below,
        run_start_unix_us: run_start_us,
        slo,
        ..SummaryInputs::default()
    }
}

/// The trace being recorded ([`start_recorder`]).
struct Recorder {
    /// The trace's header.
    header: TraceHeader,
    /// Where the rows go.
    tx: std::sync::mpsc::Sender<crate::record::Msg>,
    /// The thread writing them, which hands back what it wrote.
    thread: std::thread::JoinHandle<Recorded>,
    /// Set when a write failed.
    failed: Arc<AtomicBool>,
    /// The figures so far, for the progress line.
    live: Arc<crate::record::Live>,
}

/// The trace's header and its recorder thread, writing the files at
/// `args.out`.
fn start_recorder(
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

/// Waits for the dispatcher to end. Units of a closed loop never started
/// are part of the plan only if the run was cut short (they become
/// not-sent rows); a closed loop that ran its duration leaves them out.
async fn end_dispatch(dispatcher: Dispatcher, sh: &Shared, interrupted: bool) {
    match dispatcher {
        Dispatcher::Open(t) => {
            let _ = t.await;
        }
        Dispatcher::Closed(queue) => {
            if interrupted {
                let mut queue = queue
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                for u in queue.by_ref() {
                    for r in u {
                        sh.not_sent(r, "the run was interrupted before this request");
                    }
                }
            }
        }
    }
}

/// Phase 6: the trace's files completed with the final header, and what was
/// written reported.
fn finish_trace(
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

enum Dispatcher {
    Open(tokio::task::JoinHandle<()>),
    Closed(Arc<Mutex<Units>>),
}

/// How far ahead of its send time a request's body is built, so that a
/// burst of sends is not slowed by building prompts.
const PREPARE_AHEAD: Duration = Duration::from_millis(20);
/// Bodies built ahead at most.
const PREPARE_MAX: usize = 4096;

/// A number of seconds from the command line as a duration: one past
/// what a `Duration` holds (`--max-behind-s inf`) is forever, not a panic.
fn saturating_secs(s: f64) -> Duration {
    Duration::try_from_secs_f64(s).unwrap_or(if s > 0.0 {
        Duration::MAX
    } else {
        Duration::ZERO
    })
}

/// Units started at least, however few were running when the client fell
/// behind (a floor for a run that was nearly idle).
const BEHIND_CAP_MIN: u64 = 256;

/// Graceful degradation of an open loop the client cannot keep up with.
///
/// Once the dispatcher is more than `--max-send-lag-ms` behind its
/// schedule, starting more units only adds tasks and connections that the
/// saturated client cannot serve: memory grows with the rate and the
/// requests already started are answered later still. So the number of
/// units started and not finished is held at what it was when the client
/// fell behind (with a quarter more, and at least [`BEHIND_CAP_MIN`]): a
/// new one starts when one ends, on the connections already pooled. The
/// lag of the held sends is recorded as usual, and `--max-behind-s` stops
/// the run. Back on schedule, the hold is lifted.
#[derive(Debug, Default)]
struct BehindCap {
    /// Units started and not finished.
    live: Arc<AtomicU64>,
    /// The hold, while behind.
    cap: Option<u64>,
}

impl BehindCap {
    /// Waits, while the client is behind `due` by more than `after`, until
    /// fewer units than the hold are live. Returns early when `stopping`
    /// says so or the client falls `max_behind` behind.
    async fn admit(
        &mut self,
        due: Instant,
        after: Duration,
        max_behind: Option<Duration>,
        stopping: impl Fn() -> bool,
    ) {
        loop {
            let behind = Instant::now().saturating_duration_since(due);
            if behind <= after {
                self.cap = None;
                return;
            }
            let live = self.live.load(Ordering::Relaxed);
            let cap = *self
                .cap
                .get_or_insert_with(|| (live + live / 4).max(BEHIND_CAP_MIN));
            if live < cap || stopping() || max_behind.is_some_and(|m| behind > m) {
                return;
            }
            // Behind already: a millisecond more is recorded as lag.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

/// The open-loop schedule: for each unit in order, build its first body
/// ahead of time, sleep (precisely, see [`PreciseTimer`]) until its send
/// time and start it. Stopping records every unit not yet started as not
/// sent. A client that falls behind holds what it has started
/// ([`BehindCap`]).
async fn dispatch_open_loop(sh: Arc<Shared>, units: Units, done: tokio::sync::mpsc::Sender<()>) {
    let timer = PreciseTimer::new();
    let mut stop = sh.stopping.subscribe();
    let mut pending = units.peekable();
    let mut ready: VecDeque<(Unit, Ready)> = VecDeque::new();
    let mut hold = BehindCap::default();
    loop {
        let horizon = Instant::now() + PREPARE_AHEAD;
        while ready.len() < PREPARE_MAX
            && let Some(u) = pending.peek()
            && (ready.is_empty() || sh.instant(u[0].request.arrival_time_us) <= horizon)
        {
            let Some(u) = pending.next() else { break };
            let r = Ready::first(&sh, &u[0]);
            ready.push_back((u, r));
        }
        let Some((unit, first)) = ready.pop_front() else {
            break;
        };
        let due = sh.instant(unit[0].request.arrival_time_us);
        if Instant::now() < due {
            tokio::select! {
                () = timer.sleep_until(due) => {}
                _ = stop.wait_for(|s| *s) => {}
            }
        }
        hold.admit(due, sh.behind_after, sh.max_behind, || sh.stopping())
            .await;
        let behind = Instant::now().saturating_duration_since(due);
        let too_far = sh.max_behind.is_some_and(|m| behind > m);
        if sh.stopping() || too_far {
            let why = if too_far {
                sh.stopped_behind_us
                    .store(behind.as_micros().max(1) as u64, Ordering::Relaxed);
                format!(
                    "the client fell {:.2} s behind its schedule and stopped sending (--max-behind-s)",
                    behind.as_secs_f64()
                )
            } else {
                "the run was interrupted before this request".to_string()
            };
            let rest = std::iter::once(unit)
                .chain(ready.drain(..).map(|(u, _)| u))
                .chain(pending.by_ref());
            for u in rest {
                for r in u {
                    sh.not_sent(r, &why);
                }
            }
            break;
        }
        let (sh, done, live) = (sh.clone(), done.clone(), hold.live.clone());
        live.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            run_unit(sh, unit, None, Some(first)).await;
            live.fetch_sub(1, Ordering::Relaxed);
            drop(done);
        });
    }
}

fn server_type_name(t: ServerType) -> &'static str {
    match t {
        ServerType::Vllm => "vllm",
        ServerType::Sglang => "sglang",
        ServerType::Llamacpp => "llamacpp",
        ServerType::Openai => "openai",
    }
}

fn progress_bar(total: u64) -> indicatif::ProgressBar {
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(total);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{elapsed_precise} [{bar:30}] {pos}/{len} done, {msg}",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_progress_line_says_sent_rate_in_flight_failed_ttft_and_lag() {
        let live = crate::record::Live::new(0);
        assert_eq!(
            progress_message(0, 0, 0, 0.0, &live),
            "sent 0 (0.0 req/s), in flight 0, failed 0 | TTFT p50 - p99 - ms | send lag p99 - ms",
            "no figure before the first request"
        );
        live.ttft_p50_us.store(33_500, Ordering::Relaxed);
        live.ttft_p99_us.store(47_730, Ordering::Relaxed);
        live.lag_p99_us.store(3_300, Ordering::Relaxed);
        assert_eq!(
            progress_message(178, 18, 2, 20.24, &live),
            "sent 178 (20.2 req/s), in flight 18, failed 2 | TTFT p50 33.5 p99 47.7 ms | send lag p99 3.3 ms"
        );
    }

    #[test]
    fn seconds_past_what_a_duration_holds_are_forever_not_a_panic() {
        assert_eq!(saturating_secs(f64::INFINITY), Duration::MAX);
        assert_eq!(saturating_secs(1e300), Duration::MAX);
        assert_eq!(saturating_secs(1.5), Duration::from_millis(1_500));
        assert_eq!(saturating_secs(0.0), Duration::ZERO);
    }

    #[tokio::test]
    async fn a_client_behind_its_schedule_starts_a_unit_only_when_one_ends() {
        let after = Duration::from_millis(10);
        let never = Duration::from_secs(60);
        let mut hold = BehindCap::default();
        // On schedule (due ahead): no hold, however many are live.
        hold.live.store(5_000, Ordering::Relaxed);
        let ahead = Instant::now() + never;
        hold.admit(ahead, after, None, || false).await;
        assert_eq!(hold.cap, None);
        // 50 ms behind with 1,000 live: held at 1,250.
        hold.live.store(1_000, Ordering::Relaxed);
        let due = Instant::now() - Duration::from_millis(50);
        hold.admit(due, after, None, || false).await;
        assert_eq!(hold.cap, Some(1_250));
        hold.live.store(1_250, Ordering::Relaxed);
        let live = hold.live.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(30)).await;
            live.fetch_sub(1, Ordering::Relaxed);
        });
        let t = Instant::now();
        hold.admit(due, after, None, || false).await;
        assert!(
            t.elapsed() >= Duration::from_millis(30),
            "waited for a unit to end"
        );
        // The hold stays while behind.
        assert_eq!(hold.cap, Some(1_250));
        // Stopping, or too far behind, never waits (nothing would end).
        hold.live.store(10_000, Ordering::Relaxed);
        tokio::time::timeout(never, hold.admit(due, after, None, || true))
            .await
            .expect("stopping does not wait");
        let too_far = Some(Duration::from_millis(40));
        tokio::time::timeout(never, hold.admit(due, after, too_far, || false))
            .await
            .expect("past --max-behind-s does not wait");
        // A nearly idle client is held at the floor; on schedule, lifted.
        let mut idle = BehindCap::default();
        idle.admit(due, after, None, || false).await;
        assert_eq!(idle.cap, Some(BEHIND_CAP_MIN));
        idle.admit(ahead, after, None, || false).await;
        assert_eq!(idle.cap, None);
    }

    #[test]
    fn a_key_given_on_the_command_line_is_noticed() {
        let args = |v: &[&str]| {
            v.iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
                .into_iter()
        };
        assert!(key_on_command_line(args(&[
            "blis-loadgen",
            "run",
            "--api-key",
            "k"
        ])));
        assert!(key_on_command_line(args(&[
            "blis-loadgen",
            "run",
            "--api-key=k"
        ])));
        assert!(!key_on_command_line(args(&[
            "blis-loadgen",
            "run",
            "--model",
            "m"
        ])));
    }
    use blis_traces::Request;

    fn rec(id: u64, arrival: i64, session: &str, round: u32) -> TraceRecord {
        TraceRecord::planned(Request {
            request_id: id,
            arrival_time_us: arrival,
            session_id: Arc::from(session),
            round_index: round,
            input_tokens: 100,
            output_tokens: 10,
            ..Request::default()
        })
    }

    #[test]
    fn sessions_become_one_unit_in_round_order() {
        let u = units(vec![
            rec(0, 0, "a", 0),
            rec(1, 5, "", 0),
            rec(3, 20, "a", 2),
            rec(2, 10, "a", 1),
        ]);
        assert_eq!(u.len(), 2);
        let ids: Vec<u64> = u[0].iter().map(|r| r.request.request_id).collect();
        assert_eq!(ids, [0, 2, 3]);
        assert_eq!(u[1][0].request.request_id, 1);
    }

    fn run_args(workload: &[&str]) -> RunOptions {
        use clap::Parser;
        let mut v = vec![
            "blis-loadgen",
            "run",
            "--server-url",
            "http://127.0.0.1:1",
            "--model",
            "m",
            "--out",
            "unused",
        ];
        v.extend(workload);
        match crate::cli::Opts::parse_from(v).command {
            crate::cli::Command::Run(a) => (*a).into(),
            _ => unreachable!("a run"),
        }
    }

    /// A generated workload without sessions is generated as the run goes
    /// (its memory does not grow with its length), in the same order and
    /// with the same facts as when held; one with sessions is held.
    #[test]
    fn a_generated_plan_is_streamed_unless_it_has_sessions() {
        let p = plan(&run_args(&["--rate", "100", "--num-requests", "5000"])).unwrap();
        assert!(matches!(p.units, PlannedUnits::Generated(_)));
        assert_eq!(p.facts.count, 5000);
        assert_eq!(p.facts.planned_ids.as_deref(), Some("0-4999"));
        let streamed: Vec<TraceRecord> = p.units.into_iter(None).flatten().collect();
        let (_, held) = crate::plan::load_workload(
            &run_args(&["--rate", "100", "--num-requests", "5000"]).workload,
            &run_args(&["--rate", "100", "--num-requests", "5000"]).synthetic,
            &GenerateOptions {
                num_requests: Some(5000),
                ..GenerateOptions::default()
            },
        )
        .unwrap();
        assert_eq!(streamed, held);
        let spec = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../examples/chat-sessions.yaml"
        );
        let p = plan(&run_args(&[
            "--workload-spec",
            spec,
            "--num-requests",
            "200",
        ]))
        .unwrap();
        assert!(matches!(p.units, PlannedUnits::Held(_)));
        assert_eq!(p.facts.count, 200);
    }

    fn facts(r: &[TraceRecord], warmup: u64) -> PlanFacts {
        PlanFacts::gather(r.iter().enumerate().map(Ok), warmup, false, None).unwrap()
    }

    #[test]
    fn warmup_is_the_smallest_ids() {
        let r = vec![rec(5, 0, "", 0), rec(7, 1, "", 0), rec(6, 2, "", 0)];
        assert_eq!(facts(&r, 2).warmup_below, 7);
        assert_eq!(facts(&r, 0).warmup_below, 0);
        assert_eq!(facts(&r, 3).warmup_below, u64::MAX);
        assert_eq!(facts(&r, 9).warmup_below, u64::MAX);
    }

    /// The facts gathered in one pass equal those of the whole plan at
    /// once: ids as ranges, extra columns in canonical order, the rate.
    #[test]
    fn plan_facts_in_one_pass_equal_those_of_the_whole_plan() {
        let mut r: Vec<TraceRecord> = (0..200u64)
            .map(|i| rec(i * 7 % 211, i as i64 * 1000, "", 0))
            .collect();
        r[3].request.think_time_us = Some(5);
        r[150].request.content_key = Some(3);
        r[9].other.push(("z".into(), "1".into()));
        let f = facts(&r, 0);
        let mut ids: Vec<u64> = r.iter().map(|x| x.request.request_id).collect();
        ids.sort_unstable();
        assert_eq!(f.planned_ids, blis_traces::header::id_ranges(&ids));
        assert_eq!(f.extras, ExtraColumn::needed_for(&r));
        assert_eq!(f.count, 200);
        assert_eq!(f.requested_rate, Some(199.0 / 0.199));
        let seq: Vec<TraceRecord> = (10..20).map(|i| rec(i, i as i64, "", 0)).collect();
        assert_eq!(facts(&seq, 0).planned_ids.as_deref(), Some("10-19"));
    }

    #[test]
    fn accumulated_prompts_carry_the_answer() {
        let h = History {
            prompt: Prompt::Chat(vec![Message {
                role: "user",
                content: "q1".into(),
            }]),
            answer: "a1".into(),
            planned_in: 100,
            planned_out: 10,
        };
        let mut r = rec(1, 0, "s", 1);
        r.request.input_tokens = 150;
        let Prompt::Chat(m) = next_prompt(&h, &r, 1.0) else {
            panic!("chat expected")
        };
        assert_eq!(m.len(), 3);
        assert_eq!(m[1].content, "a1");
        assert_eq!(m[2].content.split(' ').count(), 40);
    }
}
