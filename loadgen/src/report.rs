//! The end-of-run summary: latency percentiles from the raw samples (linear
//! interpolation, numpy's default; past 16,384 samples of a figure, from a
//! histogram within 0.1%: [`crate::samples`]), measured both from the actual send and
//! from the intended send (corrected for coordinated omission), throughput,
//! goodput under SLOs, errors by kind, send lag, achieved vs requested
//! rate, and the verdict on whether the client kept up.
//!
//! Every count is computed from the trace rows themselves, so the summary
//! always agrees with the trace.

use std::collections::BTreeMap;
use std::fmt::Write as _;

pub use blis_traces::Slo;
use blis_traces::{Status, TraceRecord};
use serde::Serialize;

use crate::http::error_label;
use crate::samples::{CountedSamples, Samples};

/// Latency statistics, ms, with the count and the maximum.
pub type Stats = blis_traces::LatencyStats;

/// Request counts by outcome.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Counts {
    /// Requests in the plan (every one is a trace row).
    pub planned: u64,
    /// Requests actually sent.
    pub sent: u64,
    /// `ok`.
    pub ok: u64,
    /// `error`.
    pub error: u64,
    /// `timeout`.
    pub timeout: u64,
    /// `cancelled` (sent and cut short, or never sent).
    pub cancelled: u64,
    /// Leading requests left out of the latency statistics.
    pub warmup: u64,
}

/// Throughput over the measured window (first intended send past warm-up
/// to the last response end).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct Throughput {
    /// Window length, seconds.
    pub duration_s: f64,
    /// Completed (`ok`) requests per second.
    pub requests_per_s: f64,
    /// Prompt tokens per second (server counts where reported).
    pub input_tokens_per_s: f64,
    /// Output tokens per second.
    pub output_tokens_per_s: f64,
}

/// Goodput: requests that met every SLO.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Goodput {
    /// The SLOs.
    pub slo: Slo,
    /// Requests past warm-up that met them (failed requests never do).
    pub attained: u64,
    /// Of all requests past warm-up.
    pub attainment: f64,
    /// Attained requests per second.
    pub requests_per_s: f64,
}

/// How well the client kept to the schedule.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct Schedule {
    /// The schedule's send rate, requests/s (open loop only): its
    /// requests after the first over the span of their send times, which
    /// for a random arrival process differs from the nominal `--rate` by
    /// chance (the figure the achieved rate is held to).
    pub requested_rate: Option<f64>,
    /// Achieved send rate, requests/s.
    pub achieved_rate: Option<f64>,
    /// Send lag (actual minus intended send) median, ms.
    pub send_lag_p50_ms: Option<f64>,
    /// 99th-percentile send lag, ms.
    pub send_lag_p99_ms: Option<f64>,
    /// Largest send lag, ms.
    pub send_lag_max_ms: Option<f64>,
    /// The p99 send lag above which the run is client-bound, ms.
    pub max_send_lag_ms: f64,
    /// Whether the client, not the server, set the pace.
    pub client_bound: bool,
    /// Every request was due at the start (`--rate inf`): sent as fast as
    /// the client could (and `--max-in-flight` let it); the send lag says
    /// how long that took, and the run is not judged client-bound.
    pub burst: bool,
}

/// The client's own cost.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct ClientCost {
    /// CPU time of the whole loadgen process (user + system), seconds.
    pub cpu_time_s: Option<f64>,
    /// That over the requests sent, µs.
    pub cpu_us_per_request: Option<f64>,
}

/// The end-of-run summary (`--json` prints it as is; schema version 1).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    /// Schema version of this JSON.
    pub schema_version: u32,
    /// Request counts.
    pub requests: Counts,
    /// Non-`ok` requests by kind (`http_429`, `dropped`, `timeout`, ...).
    pub errors: BTreeMap<String, u64>,
    /// `ok` requests whose response had no `usage`.
    pub missing_usage: u64,
    /// `ok` requests of a streaming run answered with the whole response
    /// at once (the server ignored `stream: true`): their TTFT is their E2E.
    pub unstreamed: u64,
    /// `ok` requests whose stream ended cleanly after its `finish_reason`
    /// but without `[DONE]`.
    pub ended_without_done: u64,
    /// `ok` requests whose stream finished (a `finish_reason`) without a
    /// token: no TTFT, 0 output tokens unless the usage said otherwise.
    pub finished_without_token: u64,
    /// `ok` requests of a `--no-stream` run the server streamed anyway.
    pub streamed_unasked: u64,
    /// `ok` requests whose usage counts more completion tokens than the
    /// `max_tokens` asked (reasoning tokens outside `max_tokens`, or a
    /// server that ignores it or miscounts).
    pub over_max_tokens: u64,
    /// Prompt tokens the server served from its prefix cache
    /// (`usage.prompt_tokens_details.cached_tokens`), of all prompt tokens.
    pub cached_prompt_share: Option<f64>,
    /// A warning when the very first requests already hit the prefix
    /// cache (the server held these prompts before the run).
    pub warm_cache_warning: Option<String>,
    /// Latencies, ms: `ttft`, `itl`, `tpot`, `e2e` from the actual send, and
    /// `ttft_from_intended`, `e2e_from_intended` from the intended send.
    pub latency_ms: BTreeMap<String, Stats>,
    /// Throughput.
    pub throughput: Throughput,
    /// Goodput, with `--slo`.
    pub goodput: Option<Goodput>,
    /// Schedule keeping.
    pub schedule: Schedule,
    /// Client CPU cost.
    pub client: ClientCost,
    /// The run was interrupted (SIGINT/SIGTERM).
    pub interrupted: bool,
    /// Share of the requests that got an answer (`ok`, `error`,
    /// `timeout`; warm-up included) that failed (`error` or `timeout`);
    /// `None` when no request got one.
    pub error_rate: Option<f64>,
    /// The error rate above which the run failed (`--max-error-rate`).
    pub max_error_rate: f64,
    /// Whether the run failed: its error rate is above `max_error_rate`,
    /// or every request that got an answer failed.
    pub failed: bool,
    /// `valid`, `failed: ...`, `interrupted: ...` or `client-bound: ...`,
    /// in that order of precedence.
    pub verdict: String,
    /// The figures (`ttft`, `itl`, `send_lag`, ...) whose percentiles came
    /// from a histogram (3 significant digits, within 0.1%) because the run
    /// had more than [`crate::samples::EXACT_SAMPLES`] of them; the others
    /// are exact. Count, mean and max are always exact.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub percentiles_from_histogram: Vec<String>,
    /// Set when the client fell this far behind its schedule (s) and
    /// stopped sending (`--max-behind-s`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped_behind_s: Option<f64>,
    /// How the server's `/metrics` scraping went; absent when scraping
    /// was off (`--no-metrics`, or no metrics page at the start).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics: Option<MetricsScrape>,
}

/// How a run's `/metrics` scraping went (the `metrics` section of the
/// summary).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct MetricsScrape {
    /// Scrapes attempted.
    pub scrapes: u64,
    /// Scrapes that failed: transport, HTTP status, or a page of which no
    /// line reads as a Prometheus sample.
    pub failed: u64,
    /// Samples written to the metrics companion.
    pub samples: u64,
    /// Lines of the pages that did not read as samples, skipped (the rest
    /// of each page kept).
    pub skipped_lines: u64,
    /// The first failure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_failure: Option<String>,
    /// The first skipped line (`line N: what`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_skipped_line: Option<String>,
}

/// Inputs of [`summarize`] besides the rows.
#[derive(Debug, Clone, Default)]
pub struct SummaryInputs {
    /// Requests with `request_id` below this are warm-up.
    pub warmup_below_id: u64,
    /// Unix µs of the schedule's origin.
    pub run_start_unix_us: i64,
    /// Planned rate (open loop).
    pub requested_rate: Option<f64>,
    /// Every request was due at the start (`--rate inf`): its send lag is
    /// how long the client took to start them, never client-bound.
    pub burst: bool,
    /// Client-bound threshold on the p99 send lag, ms.
    pub max_send_lag_ms: f64,
    /// Goodput SLOs.
    pub slo: Option<Slo>,
    /// Process CPU seconds.
    pub cpu_time_s: Option<f64>,
    /// Interrupted by a signal.
    pub interrupted: bool,
    /// The error rate above which the run failed, in [0, 1].
    pub max_error_rate: f64,
    /// How far behind its schedule (s) the client was when it stopped
    /// sending (`--max-behind-s`); `None` when it did not.
    pub stopped_behind_s: Option<f64>,
}

/// The intended send time of a row, Unix µs.
fn intended_us(r: &TraceRecord, run_start: i64) -> i64 {
    run_start + r.request.arrival_time_us
}

/// The error-kind key of a non-`ok` row.
pub fn error_kind(r: &TraceRecord) -> String {
    match r.outcome.status {
        Some(Status::Timeout) => "timeout".into(),
        _ => error_label(&r.outcome.error_message).to_string(),
    }
}

/// Summarises a run from its rows and the ITL samples (what [`Tally`]
/// does row by row during a run).
pub fn summarize(records: &[TraceRecord], itl_us: &CountedSamples, inp: &SummaryInputs) -> Summary {
    let mut t = Tally::new(inp);
    for r in records {
        t.add(r);
    }
    t.summary(itl_us, inp)
}

/// A run's per-request figures, gathered in one pass over its rows as
/// they complete, so that a run keeps no rows in memory: what it keeps
/// per figure (send lag, TTFT and E2E from the actual and the intended
/// send, TPOT) is at most [`crate::samples::EXACT_SAMPLES`] exact samples,
/// then a histogram; everything else is counters.
#[derive(Debug)]
pub struct Tally {
    /// Requests with `request_id` below this are warm-up.
    warmup_below_id: u64,
    /// Unix µs of the schedule's origin.
    run_start_unix_us: i64,
    slo: Option<Slo>,
    counts: Counts,
    errors: BTreeMap<String, u64>,
    missing_usage: u64,
    unstreamed: u64,
    ended_without_done: u64,
    finished_without_token: u64,
    streamed_unasked: u64,
    over_max_tokens: u64,
    /// Send lag of every sent request, ms.
    lags: Samples,
    /// Requests sent, and the first and last send time, µs.
    sends: u64,
    first_send: i64,
    last_send: i64,
    ttft: Samples,
    ttft_i: Samples,
    e2e: Samples,
    e2e_i: Samples,
    tpot: Samples,
    /// The measured window past warm-up: first intended send to last
    /// chunk, µs.
    start: i64,
    end: i64,
    in_tok: u64,
    out_tok: u64,
    past_warmup: u64,
    /// Requests past warm-up that met every SLO.
    attained: u64,
    /// `ok` requests past warm-up.
    ok_past: u64,
    /// Prompt tokens found in the server's prefix cache, and prompt tokens,
    /// of the requests whose server reported both.
    cached_tokens: u64,
    prompt_tokens: u64,
    /// The first five sent requests: (send µs, id, most of a fresh prompt
    /// already cached), kept sorted.
    first_sent: Vec<(i64, u64, bool)>,
}

impl Tally {
    /// An empty tally for a run with `inp`'s warm-up, origin and SLOs.
    pub fn new(inp: &SummaryInputs) -> Self {
        Self {
            warmup_below_id: inp.warmup_below_id,
            run_start_unix_us: inp.run_start_unix_us,
            slo: inp.slo,
            counts: Counts::default(),
            errors: BTreeMap::new(),
            missing_usage: 0,
            unstreamed: 0,
            ended_without_done: 0,
            finished_without_token: 0,
            streamed_unasked: 0,
            over_max_tokens: 0,
            lags: Samples::default(),
            sends: 0,
            first_send: i64::MAX,
            last_send: i64::MIN,
            ttft: Samples::default(),
            ttft_i: Samples::default(),
            e2e: Samples::default(),
            e2e_i: Samples::default(),
            tpot: Samples::default(),
            start: i64::MAX,
            end: i64::MIN,
            in_tok: 0,
            out_tok: 0,
            past_warmup: 0,
            attained: 0,
            ok_past: 0,
            cached_tokens: 0,
            prompt_tokens: 0,
            first_sent: Vec::new(),
        }
    }

    /// Counts `r`; its latencies when it is past warm-up and ok.
    pub fn add(&mut self, r: &TraceRecord) {
        let o = &r.outcome;
        let intended = intended_us(r, self.run_start_unix_us);
        self.counts.planned += 1;
        if let (Some(c), Some(p)) = (o.cached_tokens, o.server_input_tokens) {
            self.cached_tokens += u64::from(c);
            self.prompt_tokens += u64::from(p);
        }
        if let Some(s) = o.send_time_us {
            self.counts.sent += 1;
            self.lags.push(ms(s - intended));
            self.sends += 1;
            self.first_send = self.first_send.min(s);
            self.last_send = self.last_send.max(s);
            self.note_first_sent(r, s);
        }
        match o.status {
            Some(Status::Ok) => self.counts.ok += 1,
            Some(Status::Error) => self.counts.error += 1,
            Some(Status::Timeout) => self.counts.timeout += 1,
            Some(Status::Cancelled) | None => self.counts.cancelled += 1,
        }
        if o.status != Some(Status::Ok) {
            *self.errors.entry(error_kind(r)).or_default() += 1;
        } else if o.error_message.starts_with("warning:") {
            if o.error_message.contains("no usage in the response") {
                self.missing_usage += 1;
            }
            use crate::response::{
                ENDED_WITHOUT_DONE, FINISHED_WITHOUT_TOKEN, OVER_MAX_TOKENS, STREAMED_UNASKED,
                UNSTREAMED,
            };
            let m = &o.error_message;
            self.unstreamed += u64::from(m.contains(UNSTREAMED));
            self.ended_without_done += u64::from(m.contains(ENDED_WITHOUT_DONE));
            self.finished_without_token += u64::from(m.contains(FINISHED_WITHOUT_TOKEN));
            self.streamed_unasked += u64::from(m.contains(STREAMED_UNASKED));
            self.over_max_tokens += u64::from(m.contains(OVER_MAX_TOKENS));
        }
        if r.request.request_id < self.warmup_below_id {
            self.counts.warmup += 1;
            return;
        }
        self.past_warmup += 1;
        if o.send_time_us.is_some() || o.status == Some(Status::Ok) {
            self.start = self.start.min(intended);
        }
        if o.status != Some(Status::Ok) {
            return;
        }
        let (Some(send), Some(last)) = (o.send_time_us, o.last_chunk_time_us) else {
            return;
        };
        self.ok_past += 1;
        self.end = self.end.max(last);
        self.in_tok += u64::from(r.effective_input_tokens());
        self.out_tok += u64::from(r.request.output_tokens);
        if self.add_latencies(r, intended, send, last) {
            self.attained += 1;
        }
    }

    /// An ok request's E2E, TTFT and TPOT (from its send and from its
    /// intended send); whether it met every SLO of `inp` (false without
    /// SLOs). A request not streamed is judged by E2E alone.
    fn add_latencies(&mut self, r: &TraceRecord, intended: i64, send: i64, last: i64) -> bool {
        self.e2e.push(ms(last - send));
        self.e2e_i.push(ms(last - intended));
        let mut met = self.slo.is_some();
        let slo = self.slo.unwrap_or_default();
        if let Some(b) = slo.e2e_ms {
            met &= ms(last - intended) <= b;
        }
        if r.request.streaming
            && let Some(first) = r.outcome.first_chunk_time_us
        {
            self.ttft.push(ms(first - send));
            self.ttft_i.push(ms(first - intended));
            if let Some(b) = slo.ttft_ms {
                met &= ms(first - intended) <= b;
            }
            let n = r.request.output_tokens;
            if n > 1 {
                let t = ms(last - first) / f64::from(n - 1);
                self.tpot.push(t);
                if let Some(b) = slo.tpot_ms {
                    met &= t <= b;
                }
            }
        }
        met
    }

    /// Keeps `r` (sent at `send`) among the first five sent.
    fn note_first_sent(&mut self, r: &TraceRecord, send: i64) {
        const KEEP: usize = 5;
        let key = (send, r.request.request_id);
        if self.first_sent.len() == KEEP
            && self.first_sent.last().is_some_and(|l| (l.0, l.1) <= key)
        {
            return;
        }
        let o = &r.outcome;
        let warm = r.request.prefix_group.is_empty()
            && r.request.session_id.is_empty()
            && matches!((o.cached_tokens, o.server_input_tokens), (Some(c), Some(p)) if p > 0 && 2 * c >= p);
        let at = self.first_sent.partition_point(|e| (e.0, e.1) < key);
        self.first_sent
            .insert(at, (send, r.request.request_id, warm));
        self.first_sent.truncate(KEEP);
    }

    /// The run's summary: the tallied rows, the ITL samples (µs → count)
    /// and the rest of `inp`.
    pub fn summary(mut self, itl_us: &CountedSamples, inp: &SummaryInputs) -> Summary {
        let (cached_prompt_share, warm_cache_warning) = self.prefix_cache_figures();
        let mut latency = BTreeMap::new();
        let mut from_histogram: Vec<String> = Vec::new();
        if !self.lags.is_exact() {
            from_histogram.push("send_lag".into());
        }
        if !itl_us.is_exact() {
            from_histogram.push("itl".into());
        }
        for (k, v) in [
            ("ttft", std::mem::take(&mut self.ttft)),
            ("ttft_from_intended", std::mem::take(&mut self.ttft_i)),
            ("tpot", std::mem::take(&mut self.tpot)),
            ("e2e", std::mem::take(&mut self.e2e)),
            ("e2e_from_intended", std::mem::take(&mut self.e2e_i)),
        ] {
            if !v.is_exact() {
                from_histogram.push(k.into());
            }
            if let Some(s) = v.stats() {
                latency.insert(k.to_string(), s);
            }
        }
        if let Some(s) = itl_us.stats() {
            latency.insert("itl".to_string(), s);
        }
        from_histogram.sort();
        let (throughput, goodput) = self.throughput();
        let schedule = self.schedule(inp);
        let client = ClientCost {
            cpu_time_s: inp.cpu_time_s,
            cpu_us_per_request: inp
                .cpu_time_s
                .filter(|_| self.counts.sent > 0)
                .map(|s| s * 1e6 / self.counts.sent as f64),
        };
        let (error_rate, failed, verdict) = verdict(
            &self.counts,
            &self.errors,
            inp,
            schedule
                .client_bound
                .then(|| schedule.send_lag_p99_ms.unwrap_or(0.0)),
        );
        Summary {
            schema_version: 1,
            requests: self.counts,
            errors: self.errors,
            missing_usage: self.missing_usage,
            unstreamed: self.unstreamed,
            ended_without_done: self.ended_without_done,
            finished_without_token: self.finished_without_token,
            streamed_unasked: self.streamed_unasked,
            over_max_tokens: self.over_max_tokens,
            cached_prompt_share,
            warm_cache_warning,
            latency_ms: latency,
            throughput,
            goodput,
            schedule,
            client,
            interrupted: inp.interrupted,
            error_rate,
            max_error_rate: inp.max_error_rate,
            failed,
            verdict,
            percentiles_from_histogram: from_histogram,
            stopped_behind_s: inp.stopped_behind_s,
            metrics: None,
        }
    }

    /// Requests tallied.
    pub fn rows(&self) -> u64 {
        self.counts.planned
    }

    /// The share of the prompt tokens the server found in its prefix cache
    /// (when it reports them), and a warning when most of the first five
    /// requests' prompts were already cached (a warm cache from an earlier
    /// run).
    fn prefix_cache_figures(&self) -> (Option<f64>, Option<String>) {
        let cached_prompt_share =
            (self.prompt_tokens > 0).then(|| self.cached_tokens as f64 / self.prompt_tokens as f64);
        let warm = self.first_sent.iter().filter(|e| e.2).count();
        let warm_cache_warning = (warm >= 2).then(|| {
            format!(
                "{warm} of the first 5 requests found most of their prompt in the server's prefix cache: it held these prompts before the run (an earlier run with the same --seed?); restart the server or change --seed for a cold-cache run"
            )
        });
        (cached_prompt_share, warm_cache_warning)
    }

    /// Throughput over the measured window, and goodput when SLOs are set.
    fn throughput(&self) -> (Throughput, Option<Goodput>) {
        let duration_s = if self.end > self.start {
            (self.end - self.start) as f64 / 1e6
        } else {
            0.0
        };
        let per_s = |x: u64| {
            if duration_s > 0.0 {
                x as f64 / duration_s
            } else {
                0.0
            }
        };
        let throughput = Throughput {
            duration_s,
            requests_per_s: per_s(self.ok_past),
            input_tokens_per_s: per_s(self.in_tok),
            output_tokens_per_s: per_s(self.out_tok),
        };
        let goodput = self.slo.map(|slo| Goodput {
            slo,
            attained: self.attained,
            attainment: if self.past_warmup > 0 {
                self.attained as f64 / self.past_warmup as f64
            } else {
                0.0
            },
            requests_per_s: per_s(self.attained),
        });
        (throughput, goodput)
    }

    /// How well the client kept to its schedule: the achieved rate and the
    /// send lag's percentiles; client-bound when its p99 exceeds
    /// `max_send_lag_ms`.
    fn schedule(&mut self, inp: &SummaryInputs) -> Schedule {
        let (n, first, last) = (self.sends, self.first_send, self.last_send);
        let achieved_rate =
            (n >= 2 && last > first).then(|| (n - 1) as f64 / ((last - first) as f64 / 1e6));
        let lag = std::mem::take(&mut self.lags).stats();
        let p99 = lag.as_ref().map(|s| s.p99);
        Schedule {
            requested_rate: inp.requested_rate,
            achieved_rate,
            send_lag_p50_ms: lag.as_ref().map(|s| s.p50),
            send_lag_p99_ms: p99,
            send_lag_max_ms: lag.and_then(|s| s.max),
            max_send_lag_ms: inp.max_send_lag_ms,
            client_bound: !inp.burst
                && (p99.is_some_and(|p| p > inp.max_send_lag_ms) || inp.stopped_behind_s.is_some()),
            burst: inp.burst,
        }
    }
}

/// µs to ms.
fn ms(us: i64) -> f64 {
    us as f64 / 1e3
}

/// The error rate, whether the run failed, and the verdict: `failed` (more
/// failures than `--max-error-rate`, or all), `interrupted`, `client-bound`
/// (`client_bound_p99`: the p99 send lag when over the limit), or `valid`.
fn verdict(
    counts: &Counts,
    errors: &BTreeMap<String, u64>,
    inp: &SummaryInputs,
    client_bound_p99: Option<f64>,
) -> (Option<f64>, bool, String) {
    let answered = counts.ok + counts.error + counts.timeout;
    let failures = counts.error + counts.timeout;
    let error_rate = (answered > 0).then(|| failures as f64 / answered as f64);
    let failed = answered > 0
        && (failures == answered || failures as f64 > inp.max_error_rate * answered as f64);
    let verdict = if failed {
        failed_verdict(errors, failures, answered, inp.max_error_rate)
    } else if inp.interrupted {
        format!(
            "interrupted: {} of {} requests completed; the rest are recorded as cancelled",
            counts.ok + counts.error + counts.timeout,
            counts.planned
        )
    } else if let Some(behind_s) = inp.stopped_behind_s {
        format!(
            "client-bound: the client fell {behind_s:.2} s behind its schedule and stopped sending after {} of {} requests (--max-behind-s); it cannot send this rate from here (more cores, --shard over more machines, or a lower rate)",
            counts.sent, counts.planned
        )
    } else if let Some(p99) = client_bound_p99 {
        format!(
            "client-bound: p99 send lag {p99:.2} ms > {:.2} ms; the client, not the server, limited this run, so its latencies understate the load",
            inp.max_send_lag_ms
        )
    } else {
        "valid".to_string()
    };
    (error_rate, failed, verdict)
}

/// The verdict of a run whose requests mostly failed, with a hint when
/// the failures say the server is not what the run took it for.
fn failed_verdict(
    errors: &BTreeMap<String, u64>,
    failures: u64,
    answered: u64,
    max_error_rate: f64,
) -> String {
    let mut kinds: Vec<(&String, &u64)> = errors
        .iter()
        .filter(|(k, _)| !k.starts_with("cancelled") && !k.starts_with("not_sent"))
        .collect();
    kinds.sort_by(|a, b| b.1.cmp(a.1).then_with(|| a.0.cmp(b.0)));
    let list: Vec<String> = kinds
        .iter()
        .take(3)
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    let mut v = if failures == answered {
        format!(
            "failed: all {answered} requests that got an answer failed ({})",
            list.join(", ")
        )
    } else {
        format!(
            "failed: {failures} of {answered} requests failed ({:.1}% > --max-error-rate {:.1}%; {})",
            100.0 * failures as f64 / answered as f64,
            100.0 * max_error_rate,
            list.join(", ")
        )
    };
    let hint = match kinds.first().map(|(k, _)| k.as_str()) {
        Some("http_404" | "http_405" | "http_501") => {
            "; the server does not serve this API path: is it OpenAI-compatible? (check --server-url and --api)"
        }
        Some("http_401" | "http_403") => {
            "; the server refused the requests: give --api-key or BLIS_API_KEY"
        }
        Some("http_400" | "http_422") => {
            "; the server rejected the request body: check --model, --api and --server-type (sampling options such as ignore_eos)"
        }
        Some("connect") => "; the server could not be reached during the run",
        Some("timeout") => "; the server did not answer within --timeout-s",
        _ => "",
    };
    v.push_str(hint);
    v.push_str("; the latencies describe only the requests that succeeded");
    v
}

impl Summary {
    /// The summary as Markdown (what `run` prints).
    pub fn to_markdown(&self) -> String {
        let mut o = String::new();
        let c = &self.requests;
        let _ = writeln!(
            o,
            "requests: {} planned, {} sent, {} ok, {} error, {} timeout, {} cancelled ({} warm-up excluded)\n",
            c.planned, c.sent, c.ok, c.error, c.timeout, c.cancelled, c.warmup
        );
        self.md_latency(&mut o);
        self.md_outcomes(&mut o);
        self.md_schedule(&mut o);
        if let Some(m) = &self.metrics {
            let _ = writeln!(
                o,
                "metrics: {} samples from {} scrapes, {} failed, {} unreadable lines skipped",
                m.samples, m.scrapes, m.failed, m.skipped_lines
            );
        }
        let _ = writeln!(o, "verdict: {}", self.verdict);
        o
    }

    /// Markdown: the latency table (TTFT, ITL, TPOT, E2E, from the actual
    /// and the intended send).
    fn md_latency(&self, o: &mut String) {
        if !self.latency_ms.is_empty() {
            let _ = writeln!(
                o,
                "| latency (ms) | n | mean | p50 | p90 | p95 | p99 | max |"
            );
            let _ = writeln!(o, "|---|---:|---:|---:|---:|---:|---:|---:|");
            for k in [
                "ttft",
                "ttft_from_intended",
                "itl",
                "tpot",
                "e2e",
                "e2e_from_intended",
            ] {
                if let Some(s) = self.latency_ms.get(k) {
                    let _ = writeln!(
                        o,
                        "| {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
                        k.replace('_', " ")
                            .to_uppercase()
                            .replace("FROM INTENDED", "from intended send"),
                        s.n.unwrap_or(0),
                        s.mean,
                        s.p50,
                        s.p90,
                        s.p95,
                        s.p99,
                        s.max.unwrap_or(f64::NAN)
                    );
                }
            }
            if !self.percentiles_from_histogram.is_empty() {
                let _ = writeln!(
                    o,
                    "\npercentiles of {} from a histogram (3 significant digits, within 0.1%; more than {} samples); exact ones from the trace: blis-calibrate",
                    self.percentiles_from_histogram.join(", "),
                    crate::samples::EXACT_SAMPLES
                );
            }
            o.push('\n');
        }
    }

    /// Markdown: throughput, goodput, failures by kind, usage and prefix
    /// cache notes.
    fn md_outcomes(&self, o: &mut String) {
        let t = &self.throughput;
        let _ = writeln!(
            o,
            "throughput: {:.2} req/s, {:.1} input tok/s, {:.1} output tok/s over {:.2} s",
            t.requests_per_s, t.input_tokens_per_s, t.output_tokens_per_s, t.duration_s
        );
        if let Some(g) = &self.goodput {
            let _ = writeln!(
                o,
                "goodput: {:.2} req/s; SLO attainment {:.1}% ({} of the requests past warm-up)",
                g.requests_per_s,
                g.attainment * 100.0,
                g.attained
            );
        }
        if !self.errors.is_empty() {
            let list: Vec<String> = self
                .errors
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect();
            let _ = writeln!(o, "not ok by kind: {}", list.join(", "));
        }
        for (n, what) in [
            (
                self.missing_usage,
                "had no usage (output tokens counted from chunks)",
            ),
            (
                self.unstreamed,
                "came whole, not streamed (the server ignored stream: true): their TTFT is their E2E; --no-stream says so up front",
            ),
            (
                self.ended_without_done,
                "ended without [DONE] (after their finish_reason): the server or a proxy does not send it",
            ),
            (
                self.streamed_unasked,
                "were streamed although stream: false was asked (read as streams; TTFT is the first chunk's)",
            ),
            (
                self.finished_without_token,
                "finished without a token (no content before their finish_reason): no TTFT; output tokens from the usage, else 0",
            ),
            (
                self.over_max_tokens,
                "counted more completion tokens in their usage than the max_tokens asked (reasoning tokens outside max_tokens, or a server that ignores or miscounts it): output tokens and throughput are the server's counts",
            ),
        ] {
            if n > 0 {
                let _ = writeln!(o, "warning: {n} ok responses {what}");
            }
        }
        if let Some(c) = self.cached_prompt_share {
            let _ = writeln!(
                o,
                "prefix cache: {:.1}% of prompt tokens served from it",
                100.0 * c
            );
        }
        if let Some(w) = &self.warm_cache_warning {
            let _ = writeln!(o, "warning: {w}");
        }
    }

    /// Markdown: how well the client kept to its schedule, and its CPU.
    fn md_schedule(&self, o: &mut String) {
        let s = &self.schedule;
        let f = |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{x:.3}"));
        let _ = writeln!(
            o,
            "send lag (ms): p50 {}, p99 {}, max {}",
            f(s.send_lag_p50_ms),
            f(s.send_lag_p99_ms),
            f(s.send_lag_max_ms)
        );
        let _ = writeln!(
            o,
            "rate (req/s): scheduled {}, achieved {}",
            if s.burst {
                "all at once (--rate inf)".to_string()
            } else {
                s.requested_rate
                    .map_or("- (closed loop)".to_string(), |r| format!("{r:.2}"))
            },
            f(s.achieved_rate)
        );
        if let Some(us) = self.client.cpu_us_per_request {
            let _ = writeln!(
                o,
                "client CPU: {:.2} s, {:.1} µs per request",
                self.client.cpu_time_s.unwrap_or(0.0),
                us
            );
        }
    }
}

/// CPU time (user + system) of this process so far, seconds (Linux).
pub fn process_cpu_time_s() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    // USER_HZ is 100 on every Linux architecture's user-space ABI.
    Some((utime + stime) / 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use blis_traces::{Outcome, Request};

    fn row(id: u64, arrival: i64, send: i64, first: i64, last: i64, out: u32) -> TraceRecord {
        TraceRecord {
            request: Request {
                request_id: id,
                arrival_time_us: arrival,
                streaming: true,
                output_tokens: out,
                input_tokens: 10,
                ..Request::default()
            },
            outcome: Outcome {
                send_time_us: Some(send),
                first_chunk_time_us: Some(first),
                last_chunk_time_us: Some(last),
                status: Some(Status::Ok),
                ..Outcome::default()
            },
            other: vec![],
        }
    }

    #[test]
    fn latencies_from_actual_and_intended_send() {
        let start = 1_000_000;
        let recs = vec![
            row(0, 0, start + 1000, start + 11_000, start + 31_000, 3),
            row(1, 10_000, start + 10_000, start + 30_000, start + 50_000, 3),
        ];
        let s = summarize(
            &recs,
            &CountedSamples::default(),
            &SummaryInputs {
                run_start_unix_us: start,
                max_send_lag_ms: 0.5,
                slo: Some("ttft_ms=15".parse().unwrap()),
                ..SummaryInputs::default()
            },
        );
        assert_eq!(s.latency_ms["ttft"].p50, 15.0);
        assert_eq!(s.latency_ms["ttft_from_intended"].max, Some(20.0));
        assert_eq!(s.latency_ms["tpot"].mean, 10.0);
        assert_eq!(s.schedule.send_lag_max_ms, Some(1.0));
        assert!(s.schedule.client_bound);
        let g = s.goodput.unwrap();
        assert_eq!((g.attained, g.attainment), (1, 0.5));
        assert!(s.verdict.starts_with("client-bound"));
    }

    #[test]
    fn a_prefix_cache_warm_before_the_run_is_reported() {
        let mut recs: Vec<TraceRecord> = (0..6)
            .map(|i| row(i, i as i64, i as i64, i as i64 + 5, i as i64 + 9, 3))
            .collect();
        for r in &mut recs {
            r.outcome.server_input_tokens = Some(100);
            r.outcome.cached_tokens = Some(96);
        }
        let summary = |recs: &[TraceRecord]| {
            summarize(
                recs,
                &CountedSamples::default(),
                &SummaryInputs {
                    max_send_lag_ms: 10.0,
                    ..SummaryInputs::default()
                },
            )
        };
        let s = summary(&recs);
        assert_eq!(s.cached_prompt_share, Some(0.96));
        assert!(s.warm_cache_warning.is_some());
        assert!(
            s.to_markdown()
                .contains("restart the server or change --seed")
        );
        for r in &mut recs {
            r.outcome.cached_tokens = Some(0);
        }
        assert!(summary(&recs).warm_cache_warning.is_none());
    }

    fn failed_row(id: u64, msg: &str) -> TraceRecord {
        let mut r = row(id, 0, 1, 0, 2, 3);
        r.outcome.status = Some(Status::Error);
        r.outcome.first_chunk_time_us = None;
        r.outcome.error_message = msg.to_string();
        r
    }

    fn summary_at(recs: &[TraceRecord], max_error_rate: f64, interrupted: bool) -> Summary {
        summarize(
            recs,
            &CountedSamples::default(),
            &SummaryInputs {
                max_send_lag_ms: 10.0,
                max_error_rate,
                interrupted,
                ..SummaryInputs::default()
            },
        )
    }

    #[test]
    fn a_run_whose_requests_all_failed_is_failed_not_valid() {
        let recs: Vec<TraceRecord> = (0..20)
            .map(|i| {
                failed_row(
                    i,
                    "http_501: HTTP 501 Not Implemented: Unsupported method ('POST')",
                )
            })
            .collect();
        let s = summary_at(&recs, 0.5, false);
        assert!(s.failed);
        assert_eq!(s.error_rate, Some(1.0));
        assert!(
            s.verdict
                .starts_with("failed: all 20 requests that got an answer failed (http_501 20)"),
            "{}",
            s.verdict
        );
        assert!(
            s.verdict.contains("is it OpenAI-compatible?"),
            "{}",
            s.verdict
        );
        // All failed fails the run even when any error rate is allowed.
        assert!(summary_at(&recs, 1.0, false).failed);
        // And it outranks an interruption.
        assert!(summary_at(&recs, 0.5, true).verdict.starts_with("failed: "));
    }

    #[test]
    fn the_error_rate_threshold_decides_between_valid_and_failed() {
        let mut recs: Vec<TraceRecord> = (0..10).map(|i| row(i, 0, 1, 2, 3, 3)).collect();
        for r in recs.iter_mut().take(4) {
            *r = failed_row(r.request.request_id, "http_503: HTTP 503");
        }
        let s = summary_at(&recs, 0.5, false);
        assert_eq!((s.failed, s.error_rate), (false, Some(0.4)));
        assert_eq!(s.verdict, "valid");
        let s = summary_at(&recs, 0.3, false);
        assert!(s.failed);
        assert!(
            s.verdict.starts_with(
                "failed: 4 of 10 requests failed (40.0% > --max-error-rate 30.0%; http_503 4)"
            ),
            "{}",
            s.verdict
        );
        // Requests cancelled by an interruption are not failures.
        for r in &mut recs {
            r.outcome.status = Some(Status::Cancelled);
            r.outcome.error_message = "cancelled: the run was interrupted".into();
        }
        let s = summary_at(&recs, 0.0, true);
        assert_eq!((s.failed, s.error_rate), (false, None));
        assert!(s.verdict.starts_with("interrupted: "));
    }

    #[test]
    fn cpu_time_is_readable_on_linux() {
        if cfg!(target_os = "linux") {
            assert!(process_cpu_time_s().is_some());
        }
    }
}
