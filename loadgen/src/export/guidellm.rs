//! guidellm's report, `benchmarks.json` (`GenerativeBenchmarksReport`,
//! schema version 2, as guidellm 0.8 writes it): one benchmark of strategy
//! `trace` (requests sent on the trace's schedule) holding every measured
//! request as a `GenerativeRequestStats` and the metrics guidellm derives
//! from them, computed with guidellm's definitions ([`super::guidellm_stats`]).
//!
//! Per request: `request_start` is the send time, `first_token_iteration`
//! and `last_token_iteration` the first and last streamed chunk, one token
//! iteration per chunk, `targeted_start` the scheduled send time. Times are
//! Unix seconds. What a trace does not hold (prompt text, round-trip
//! timings, per-modality usage) is `null` or left at guidellm's default.
//! `guidellm export benchmarks.json` reads the file back (see
//! `loadgen/benches/peer-export-check.sh`).

use serde_json::{Value, json};

use super::guidellm_stats::{ByStatus, Distribution};
use super::{Outcome, Run, Sent, write_file};
use crate::Result;

/// A request's values as guidellm's `GenerativeRequestStats` derives them.
#[derive(Clone)]
struct Req {
    start: f64,
    end: f64,
    targeted: Option<f64>,
    first: Option<f64>,
    last: Option<f64>,
    iterations: u32,
    prompt: Option<f64>,
    output: Option<f64>,
}

impl Req {
    fn of(s: &Sent<'_>, run_start_us: Option<i64>) -> Self {
        let o = &s.rec.outcome;
        // One iteration per streamed chunk; the count is input, so never
        // more than the request's tokens (the iterations are spread over
        // its decode time one by one).
        let iterations = if s.first_token_us().is_some() {
            o.num_chunks.min(s.rec.request.output_tokens.max(1))
        } else {
            0
        };
        // guidellm: the usage count, else one token per iteration.
        let output = s
            .output_tokens()
            .map(f64::from)
            .or((iterations > 0).then_some(f64::from(iterations)));
        Req {
            start: Sent::s(s.send_us()),
            end: Sent::s(s.end_us()),
            targeted: run_start_us.map(|t0| Sent::s(t0 + s.rec.request.arrival_time_us)),
            first: s.first_token_us().map(Sent::s),
            last: s.last_token_us().map(Sent::s),
            iterations,
            prompt: Some(f64::from(s.rec.effective_input_tokens())),
            output,
        }
    }
    fn latency(&self) -> f64 {
        self.end - self.start
    }
    fn total(&self) -> Option<f64> {
        match (self.prompt, self.output) {
            (None, None) => None,
            (p, o) => Some(p.unwrap_or(0.0) + o.unwrap_or(0.0)),
        }
    }
    fn ttft_ms(&self) -> Option<f64> {
        self.first.map(|f| 1000.0 * (f - self.start))
    }
    fn tpot_ms(&self) -> Option<f64> {
        let last = self.last.unwrap_or(self.end);
        let out = self.output.filter(|o| *o > 0.0)?;
        Some(1000.0 * (last - self.start) / out)
    }
    fn itl_ms(&self) -> Option<f64> {
        let (f, l, o) = (self.first?, self.last?, self.output?);
        (o > 1.0).then(|| 1000.0 * (l - f) / (o - 1.0))
    }
    fn iter_tokens_per_iteration(&self) -> Option<f64> {
        let o = self.output?;
        (o > 1.0 && self.iterations > 1).then(|| (o - 1.0) / (f64::from(self.iterations) - 1.0))
    }
    fn output_tokens_per_iteration(&self) -> Option<f64> {
        let o = self.output?;
        (self.iterations >= 1).then(|| o / f64::from(self.iterations))
    }
    /// `output_tokens_timings`: the first token at its time, the rest
    /// spread evenly over the iterations (guidellm has no per-iteration
    /// counts either).
    fn iter_timings(&self) -> Vec<(f64, f64)> {
        let (Some(f), Some(l), Some(per)) =
            (self.first, self.last, self.iter_tokens_per_iteration())
        else {
            return Vec::new();
        };
        let n = self.iterations as usize;
        if n <= 1 {
            return Vec::new();
        }
        let step = (l - f) / (n - 1) as f64;
        (1..n)
            .map(|i| {
                let t = if i == n - 1 { l } else { f + step * i as f64 };
                (t, per)
            })
            .collect()
    }
    fn output_timings(&self) -> Vec<(f64, f64)> {
        match (self.first, self.last) {
            (Some(f), Some(_)) if self.iterations > 1 => {
                let one = if self.output.unwrap_or(0.0) != 0.0 {
                    1.0
                } else {
                    0.0
                };
                let mut v = vec![(f, one)];
                v.extend(self.iter_timings());
                v
            }
            _ => vec![(self.last.unwrap_or(self.end), self.output.unwrap_or(0.0))],
        }
    }
    fn prompt_timing(&self) -> (f64, f64) {
        (self.first.unwrap_or(self.end), self.prompt.unwrap_or(0.0))
    }
}

fn status(o: Outcome) -> &'static str {
    match o {
        Outcome::Successful => "completed",
        Outcome::Incomplete => "cancelled",
        Outcome::Errored => "errored",
    }
}

fn request_json(s: &Sent<'_>, r: &Req) -> Value {
    let q = &s.rec.request;
    let o = &s.rec.outcome;
    let id = o
        .x_request_id
        .clone()
        .unwrap_or_else(|| q.request_id.to_string());
    let conversation = if q.session_id.is_empty() {
        id.clone()
    } else {
        q.session_id.to_string()
    };
    let error = (s.outcome != Outcome::Successful).then(|| {
        if o.error_message.is_empty() {
            s.rec
                .outcome
                .status
                .map_or("cancelled", |st| st.as_str())
                .to_string()
        } else {
            o.error_message.clone()
        }
    });
    let usage = |tokens: Option<f64>| {
        json!({
            "text_tokens": tokens.map(|t| t as u64),
            "total_tokens": tokens.map(|t| t as u64),
        })
    };
    let mut input = usage(r.prompt);
    input["cached_tokens"] = json!(o.cached_tokens);
    json!({
        "type_": "generative_request_stats",
        "request_id": id,
        "response_id": null,
        "request_args": null,
        "output": null,
        "info": {
            "request_id": id,
            "conversation_id": conversation,
            "turn_index": q.round_index,
            "status": status(s.outcome),
            "scheduler_start_time": r.start,
            "timings": {
                "targeted_start": r.targeted,
                "request_start": r.start,
                "resolve_start": r.start,
                "first_request_iteration": r.first,
                "first_token_iteration": r.first,
                "first_output_token_iteration": r.first,
                "last_token_iteration": r.last,
                "last_request_iteration": r.last,
                "request_iterations": r.iterations,
                "token_iterations": r.iterations,
                "request_end": r.end,
                "resolve_end": r.end,
            },
            "error": error,
            "started_at": r.start,
            "completed_at": r.end,
        },
        "input_metrics": input,
        "output_metrics": usage(r.output),
        "request_start_time": r.start,
        "request_end_time": r.end,
        "request_latency": r.latency(),
        "request_dispatch_delay": r.targeted.map(|t| r.start - t),
        "prompt_tokens": r.prompt,
        "output_tokens": r.output,
        "total_tokens": r.total(),
        "time_to_first_token_ms": r.ttft_ms(),
        "time_per_output_token_ms": r.tpot_ms(),
        "inter_token_latency_ms": r.itl_ms(),
        "time_to_first_output_token_ms": r.ttft_ms(),
        "iter_tokens_per_iteration": r.iter_tokens_per_iteration(),
        "output_tokens_per_iteration": r.output_tokens_per_iteration(),
    })
}

/// `from_values_function`: `f`'s values per group (`None` dropped).
fn values(groups: [&[Req]; 3], f: impl Fn(&Req) -> Vec<(f64, f64)>) -> ByStatus {
    ByStatus::of(groups, |g| {
        let v: Vec<(f64, f64)> = g.iter().flat_map(&f).collect();
        Distribution::from_weighted(&v, None)
    })
}

fn one(v: f64) -> Vec<(f64, f64)> {
    vec![(v, 1.0)]
}

fn metrics(groups: [&[Req]; 3], start: f64, end: f64) -> Value {
    let rate = |f: &dyn Fn(&Req) -> Vec<(f64, f64)>| {
        ByStatus::of(groups, |g| {
            let v: Vec<(f64, f64)> = g.iter().flat_map(f).collect();
            Distribution::rate(&v, start, end)
        })
    };
    // First-token metrics: the requests whose first token is in the window.
    let with_first: Vec<Vec<Req>> = groups
        .iter()
        .map(|g| g.iter().filter(|r| r.first.is_some()).cloned().collect())
        .collect();
    let first_groups = [&with_first[0][..], &with_first[1][..], &with_first[2][..]];
    let ttft = values(first_groups, |r| one(r.ttft_ms().unwrap_or(0.0)));
    let n = |g: &[Req]| g.len();
    json!({
        "request_totals": {
            "successful": n(groups[0]),
            "incomplete": n(groups[1]),
            "errored": n(groups[2]),
            "total": n(groups[0]) + n(groups[1]) + n(groups[2]),
        },
        "requests_per_second": rate(&|r| one(r.end)),
        "request_concurrency": ByStatus::of(groups, |g| {
            let v: Vec<(f64, f64)> = g.iter().map(|r| (r.start, r.end)).collect();
            Distribution::concurrency(&v, start, end)
        }),
        "request_latency": values(groups, |r| one(r.latency())),
        "request_dispatch_delay": values(groups, |r| {
            r.targeted.map(|t| (r.start - t, 1.0)).into_iter().collect()
        }),
        "request_streaming_iterations_count": values(groups, |r| one(f64::from(r.iterations))),
        "prompt_token_count": values(groups, |r| one(r.prompt.unwrap_or(0.0))),
        "output_token_count": values(groups, |r| one(r.output.unwrap_or(0.0))),
        "total_token_count": values(groups, |r| one(r.total().unwrap_or(0.0))),
        "time_to_first_token_ms": ttft,
        "time_to_first_output_token_ms": ttft,
        "time_per_output_token_ms": values(groups, |r| {
            vec![(r.tpot_ms().unwrap_or(0.0), r.output.unwrap_or(0.0))]
        }),
        "inter_token_latency_ms": values(groups, |r| {
            vec![(r.itl_ms().unwrap_or(0.0), r.output.unwrap_or(1.0) - 1.0)]
        }),
        "time_to_last_round_trip_ms": values(groups, |_| one(0.0)),
        "avg_round_trip_time_ms": values(groups, |_| one(0.0)),
        "prompt_tokens_per_second": rate(&|r| vec![r.prompt_timing()]),
        "output_tokens_per_second": rate(&|r| r.output_timings()),
        "tokens_per_second": rate(&|r| {
            let mut v = vec![r.prompt_timing()];
            v.extend(r.output_timings());
            v
        }),
        "output_tokens_per_iteration": values(groups, |r| {
            r.output_timings().into_iter().map(|t| (t.1, 1.0)).collect()
        }),
        "iter_tokens_per_iteration": values(groups, |r| {
            r.iter_timings().into_iter().map(|t| (t.1, 1.0)).collect()
        }),
        "text": {"tokens": null, "words": null, "characters": null},
        "image": {"tokens": null, "images": null, "pixels": null, "bytes": null},
        "video": {"tokens": null, "frames": null, "seconds": null, "bytes": null},
        "audio": {"tokens": null, "samples": null, "seconds": null, "bytes": null},
        "tool_call": {"tokens": null, "mixed_tokens": null, "count": null},
        "turns": null,
        "slo_attainment": null,
        "slo_determined_requests": 0,
        "request_goodput": null,
    })
}

/// Writes the run's measured requests as guidellm's `benchmarks.json`.
pub(super) fn write(run: &Run<'_>, out: &std::path::Path) -> Result<String> {
    let t0 = run.trace.header.run_start_unix_us;
    let measured: Vec<&Sent<'_>> = run.measured().collect();
    let mut groups: [Vec<Req>; 3] = Default::default();
    let mut rows: [Vec<Value>; 3] = Default::default();
    for s in &measured {
        let r = Req::of(s, t0);
        let k = match s.outcome {
            Outcome::Successful => 0,
            Outcome::Incomplete => 1,
            Outcome::Errored => 2,
        };
        rows[k].push(request_json(s, &r));
        groups[k].push(r);
    }
    let all = || groups.iter().flatten();
    let start = all().map(|r| r.start).fold(f64::INFINITY, f64::min);
    let end = all().map(|r| r.end).fold(f64::NEG_INFINITY, f64::max);
    let (start, end) = if start.is_finite() {
        (start, end)
    } else {
        (0.0, 0.0)
    };
    let g = [&groups[0][..], &groups[1][..], &groups[2][..]];
    let lg = run.trace.header.load_generator.as_ref();
    let rate = lg.and_then(|l| l.requested_rate);
    let model = run.model();
    let data_file = run.trace.header.data_file.clone().unwrap_or_default();
    let n = measured.len();
    let counts = [groups[0].len(), groups[1].len(), groups[2].len()];
    let strategy = json!({"type_": "trace", "time_scale": 1.0, "schedule_turn": "timestamp"});
    let delay = values(g, |r| one(r.targeted.map_or(0.0, |t| r.start - t)));
    let latency = values(g, |r| one(r.latency())).total.mean;
    let benchmark = json!({
        "type_": "generative_benchmark",
        "config": {
            "run_id": "blis-loadgen",
            "run_index": 0,
            "strategy": strategy,
            "constraints": {},
            "profile": {"kind": "replay", "requested_rate": rate},
            "requests": {"source": "blis-loadgen trace"},
            "backend": {"kind": "openai_http", "model": model},
            "environment": {"tool": "blis-loadgen"},
        },
        "scheduler_state": {
            "node_id": 0,
            "num_processes": 1,
            "start_time": start,
            "end_time": end,
            "start_requests_time": start,
            "end_requests_time": end,
            "created_requests": n,
            "queued_requests": 0,
            "pending_requests": 0,
            "processing_requests": 0,
            "processed_requests": n,
            "successful_requests": counts[0],
            "errored_requests": counts[2],
            "cancelled_requests": counts[1],
        },
        "scheduler_metrics": {
            "start_time": start,
            "request_start_time": start,
            "measure_start_time": start,
            "measure_end_time": end,
            "request_end_time": end,
            "end_time": end,
            "requests_made": {
                "successful": counts[0],
                "incomplete": counts[1],
                "errored": counts[2],
                "total": n,
            },
            "generation_delay": Distribution::from_values(&[]),
            "queued_time_avg": 0.0,
            "resolve_start_delay_avg": 0.0,
            "resolve_targeted_start_delay_avg": delay.total.mean,
            "request_start_delay_avg": 0.0,
            "request_targeted_start_delay_avg": delay.total.mean,
            "request_time_avg": latency,
            "resolve_end_delay_avg": 0.0,
            "resolve_time_avg": latency,
            "finalized_delay_avg": 0.0,
            "processed_delay_avg": 0.0,
            "strategy_type": "trace",
        },
        "metrics": metrics(g, start, end),
        "requests": {
            "successful": rows[0],
            "incomplete": rows[1],
            "errored": rows[2],
            "total": null,
        },
        "warnings": [],
        "start_time": start,
        "end_time": end,
        "duration": end - start,
        "warmup_duration": 0.0,
        "cooldown_duration": 0.0,
    });
    let report = json!({
        "metadata": {"version": 2, "guidellm_version": "0.8.1", "python_version": "", "platform": "blis-loadgen"},
        "config": {
            "metadata": {"labels": {"source": "blis-loadgen"}},
            // What guidellm's scenario needs: the requests came from the
            // trace's request table and were sent on its schedule.
            "spec": {
                "backend": {"kind": "openai_http", "target": "", "model": model},
                "profile": {"kind": "replay"},
                "data": [{"kind": "csv_file", "path": data_file}],
            },
        },
        "benchmarks": [benchmark],
        "conclusions": [],
    });
    write_file(out, &serde_json::to_vec(&report)?)?;
    Ok(format!(
        "guidellm benchmarks.json: {n} requests, {} completed, {} errored, {} incomplete{}",
        counts[0],
        counts[2],
        counts[1],
        if measured.len() < run.sent.len() {
            format!("; {} warm-up left out", run.sent.len() - measured.len())
        } else {
            String::new()
        }
    ))
}
