//! Sending: a unit of the schedule (one request, or a session's rounds in
//! order) waits for its send time, builds its prompt and body, sends, and
//! hands what came back to the recorder.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use blis_traces::spec::ContextGrowth;
use blis_traces::{Status, TraceRecord};

use crate::http::Api;
use crate::http::{Capture, ErrorKind, Failure, Message, Prompt};
use crate::prompt;
use crate::timer::PreciseTimer;

use super::shared::Shared;

/// A request ready to send: its prompt and the JSON body.
#[derive(Debug)]
pub(super) struct Ready {
    pub(super) prompt: Prompt,
    pub(super) body: Vec<u8>,
}

impl Ready {
    pub(super) fn new(sh: &Shared, rec: &TraceRecord, prompt: Prompt) -> Self {
        let body = sh
            .ep
            .body(&prompt, rec.request.output_tokens, sh.streams(rec));
        Self { prompt, body }
    }

    /// A first round (or single request): prefix and own text.
    pub(super) fn first(sh: &Shared, rec: &TraceRecord) -> Self {
        Self::new(sh, rec, first_prompt(sh.ep.api(), rec, sh.tokens_per_word))
    }
}

/// The conversation so far of a session whose context accumulates.
#[derive(Debug, Clone)]
pub(super) struct History {
    pub(super) prompt: Prompt,
    pub(super) answer: String,
    pub(super) planned_in: u32,
    pub(super) planned_out: u32,
}

/// A unit of the schedule: one request, or a session's rounds in order.
pub(super) type Unit = Vec<TraceRecord>;

/// A plan's units in order of their first send, held or generated.
pub(super) type Units = Box<dyn Iterator<Item = Unit> + Send>;

/// Groups planned rows into units ordered by their first send.
pub(super) fn units(records: Vec<TraceRecord>) -> Vec<Unit> {
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
pub(super) fn first_prompt(api: Api, r: &TraceRecord, tpw: f64) -> Prompt {
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
pub(super) fn next_prompt(h: &History, r: &TraceRecord, tpw: f64) -> Prompt {
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

pub(super) fn accumulates(sh: &Shared, r: &TraceRecord, prev: &TraceRecord) -> bool {
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
pub(super) async fn wait_until(sh: &Shared, at: Instant) -> bool {
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
pub(super) async fn run_unit(
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
pub(super) async fn send_one(
    sh: &Shared,
    mut rec: TraceRecord,
    intended_rel_us: i64,
    body: Vec<u8>,
    keep_text: bool,
) -> (TraceRecord, Capture, bool) {
    let mut cap = Capture::new(keep_text);
    cap.max_chunks = Some(crate::response::chunk_limit(rec.request.output_tokens));
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
pub(super) fn record_outcome(
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
            // (The request asked for at least one token: `Endpoint::body`.)
            let asked = rec.request.output_tokens.max(1);
            let over = cap.completion_tokens.filter(|&n| n > asked).map(|n| {
                format!(
                    "{} ({n} against {asked}; the row keeps the server's count)",
                    crate::response::OVER_MAX_TOKENS
                )
            });
            if let Some(n) = cap.output_tokens() {
                rec.request.output_tokens = n;
            }
            let mut warnings: Vec<&str> = cap.warning.iter().map(String::as_str).collect();
            warnings.extend(over.as_deref());
            if cap.completion_tokens.is_none() {
                warnings
                    .push("no usage in the response; output tokens counted from content chunks");
            }
            if !warnings.is_empty() {
                o.error_message = format!("warning: {}", warnings.join("; "));
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

pub(super) fn emit_done(sh: &Shared, rec: TraceRecord, cap: Capture) {
    if rec.request.streaming {
        sh.emit(rec, cap.chunk_times, cap.chunk_tokens);
    } else {
        sh.emit(rec, Vec::new(), Vec::new());
    }
}
