//! inference-perf's report files (as inference-perf 0.7 writes them, in
//! seconds): `per_request_lifecycle_metrics.json` (one entry per measured
//! request: `start_time`, `end_time`, `info` with the token counts and the
//! streamed token times, `computed_metrics`, `error`), and the run summary
//! `summary_lifecycle_metrics.json` with its one stage
//! `stage_0_lifecycle_metrics.json` (`load_summary`, `successes`,
//! `failures`), computed with inference-perf's formulas
//! (`reportgen.base.summarize_requests`: percentiles by linear
//! interpolation, TPOT `(last − first token) / (tokens − 1)`, ITL over every
//! gap between streamed tokens, NTPOT latency / tokens).
//!
//! A chunk carrying several tokens gives each of them its arrival time, as
//! inference-perf does. Without the per-chunk file there are no token times,
//! so TTFT, TPOT and ITL are left out. Errors are labelled by their kind
//! (`http_500`, `timeout`, …) rather than by inference-perf's message
//! patterns. inference-perf's own report validators read the folder back
//! (see `loadgen/benches/peer-export-check.sh`).

use serde_json::{Value, json};

use super::{Outcome, Run, Sent, write_file};
use crate::Result;

/// inference-perf's default percentiles.
const PERCENTILES: [f64; 11] = [
    0.1, 1.0, 5.0, 10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 99.0, 99.9,
];

/// inference-perf's `summarize`: mean, min, max and the percentiles
/// (`numpy.percentile`, linear), `null` for no values.
fn summarize(values: &[f64]) -> Value {
    if values.is_empty() {
        return Value::Null;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let mut out = serde_json::Map::new();
    out.insert("mean".into(), json!(v.iter().sum::<f64>() / n as f64));
    out.insert("min".into(), json!(v[0]));
    out.insert("max".into(), json!(v[n - 1]));
    for p in PERCENTILES {
        let rank = p / 100.0 * (n - 1) as f64;
        let lo = rank.floor() as usize;
        let hi = rank.ceil() as usize;
        let x = v[lo] + (v[hi] - v[lo]) * (rank - lo as f64);
        let key = if p == 50.0 {
            "median".to_string()
        } else {
            format!("p{p}")
        };
        out.insert(key, json!(x));
    }
    Value::Object(out)
}

/// A request in inference-perf's terms.
struct Req {
    scheduled: f64,
    start: f64,
    end: f64,
    input: f64,
    output: f64,
    /// When each streamed chunk arrived, s.
    chunk_times: Vec<f64>,
    /// Each streamed token's time (its chunk's), s.
    token_times: Vec<f64>,
    error: Option<(String, String)>,
    /// The server's `usage` (prompt, completion, cached prompt tokens), when
    /// it reported one.
    usage: Option<(u32, u32, Option<u32>)>,
}

impl Req {
    fn of(s: &Sent<'_>, run_start_us: Option<i64>, have_chunks: bool) -> Self {
        let mut token_times = Vec::new();
        if have_chunks && s.rec.request.streaming {
            // Never more token times than the request's tokens (nor than
            // its chunks when it has no count): a chunk file's counts are
            // input, not trusted.
            let cap = s.chunks_us.len().max(s.rec.request.output_tokens as usize);
            for (t, k) in s.chunks_us.iter().zip(&s.chunk_tokens) {
                let room = cap.saturating_sub(token_times.len());
                let n = (k.unwrap_or(1).max(1) as usize).min(room.max(1));
                token_times.extend(std::iter::repeat_n(Sent::s(*t), n));
            }
        }
        let error = (s.outcome != Outcome::Successful).then(|| {
            let kind = crate::report::error_kind(s.rec);
            let msg = if s.rec.outcome.error_message.is_empty() {
                kind.clone()
            } else {
                s.rec.outcome.error_message.clone()
            };
            (kind, msg)
        });
        let send = Sent::s(s.send_us());
        Req {
            scheduled: run_start_us.map_or(send, |t0| Sent::s(t0 + s.rec.request.arrival_time_us)),
            start: send,
            end: Sent::s(s.end_us()),
            input: f64::from(s.rec.effective_input_tokens()),
            output: f64::from(s.output_tokens().unwrap_or(0)),
            chunk_times: if have_chunks && s.rec.request.streaming {
                s.chunks_us.iter().map(|t| Sent::s(*t)).collect()
            } else {
                Vec::new()
            },
            token_times,
            error,
            usage: s.rec.outcome.server_input_tokens.map(|p| {
                (
                    p,
                    s.output_tokens().unwrap_or(0),
                    s.rec.outcome.cached_tokens,
                )
            }),
        }
    }
    fn latency(&self) -> f64 {
        self.end - self.start
    }
    fn ntpot(&self) -> f64 {
        if self.output > 0.0 {
            self.latency() / self.output
        } else {
            0.0
        }
    }
    fn streamed(&self) -> bool {
        self.token_times.len() > 1
    }
    fn ttft(&self) -> Option<f64> {
        self.streamed().then(|| self.token_times[0] - self.start)
    }
    fn tpot(&self) -> Option<f64> {
        if !self.streamed() || self.output <= 1.0 {
            return None;
        }
        let t = &self.token_times;
        Some((t[t.len() - 1] - t[0]) / (self.output - 1.0))
    }
    fn deltas(&self) -> Vec<f64> {
        if !self.streamed() {
            return Vec::new();
        }
        self.token_times.windows(2).map(|w| w[1] - w[0]).collect()
    }
    fn itl(&self) -> Option<f64> {
        let d = self.deltas();
        (!d.is_empty()).then(|| d.iter().sum::<f64>() / d.len() as f64)
    }

    fn entry(&self) -> Value {
        let mut e = json!({
            "start_time": self.start,
            "end_time": self.end,
            "info": {
                "request_metrics": {"text": {"input_tokens": self.input as u64}, "image": null, "video": null, "audio": null},
                "response_metrics": {
                    "output_tokens": self.output as u64,
                    "server_usage": self.usage.map(|(p, c, cached)| {
                        let mut u = json!({"prompt_tokens": p, "completion_tokens": c});
                        if let Some(k) = cached {
                            u["prompt_tokens_details"] = json!({"cached_tokens": k});
                        }
                        u
                    }),
                    "chunk_times": self.chunk_times,
                    "output_token_times": self.token_times,
                },
                "extra_info": {},
                "lora_adapter": null,
                "graph_event_id": null,
                "labels": {},
                "input_tokens": self.input as u64,
            },
        });
        if self.error.is_none() {
            e["computed_metrics"] = json!({
                "request_latency": self.latency(),
                "normalized_time_per_output_token": self.ntpot(),
                "time_to_first_token": self.ttft(),
                "time_per_output_token": self.tpot(),
                "inter_token_latency": self.itl(),
                "inter_token_latencies": self.deltas(),
                "input_tokens": self.input as u64,
                "output_tokens": self.output as u64,
                "ttft_slo_sec": null,
                "tpot_slo_sec": null,
            });
        }
        e["error"] = match &self.error {
            Some((t, m)) => json!({"error_type": t, "error_msg": m}),
            None => Value::Null,
        };
        e
    }
}

/// Prompt tokens served from the prefix cache, by the servers' `usage`.
fn cached(reqs: &[&Req]) -> f64 {
    reqs.iter()
        .filter_map(|r| r.usage.and_then(|u| u.2))
        .map(f64::from)
        .sum()
}

fn tokens(reqs: &[&Req], f: impl Fn(&Req) -> f64, cached: Option<f64>) -> Value {
    let v: Vec<f64> = reqs.iter().map(|r| f(r)).collect();
    let total: f64 = v.iter().sum();
    let mut out = match cached {
        Some(c) => json!({"total": total, "cached": c, "uncached": (total - c).max(0.0)}),
        None => json!({"total": total}),
    };
    if let Value::Object(d) = summarize(&v) {
        out.as_object_mut().expect("an object").extend(d);
    }
    out
}

/// inference-perf's `summarize_requests` (`stage_rate`: the stage's
/// requested rate, for a per-stage report).
fn summary(reqs: &[Req], stage_rate: Option<f64>) -> Value {
    let ok: Vec<&Req> = reqs.iter().filter(|r| r.error.is_none()).collect();
    let failed: Vec<&Req> = reqs.iter().filter(|r| r.error.is_some()).collect();
    let min_start = reqs.iter().map(|r| r.start).fold(f64::INFINITY, f64::min);
    let max_start = reqs
        .iter()
        .map(|r| r.start)
        .fold(f64::NEG_INFINITY, f64::max);
    let max_end = reqs.iter().map(|r| r.end).fold(f64::NEG_INFINITY, f64::max);
    let total_time = max_end - min_start;
    let delays: Vec<f64> = reqs.iter().map(|r| r.start - r.scheduled).collect();
    let mut load = json!({"count": reqs.len(), "schedule_delay": summarize(&delays)});
    if let Some(rate) = stage_rate {
        let send = max_start - min_start;
        load["send_duration"] = json!(send);
        load["requested_rate"] = json!(rate);
        load["achieved_rate"] = json!(if send > 0.0 {
            reqs.len() as f64 / send
        } else {
            0.0
        });
    }
    let per_s = |x: f64| {
        if total_time > 0.0 {
            x / total_time
        } else {
            0.0
        }
    };
    let input: f64 = ok.iter().map(|r| r.input).sum();
    let output: f64 = ok.iter().map(|r| r.output).sum();
    let collect =
        |f: &dyn Fn(&Req) -> Option<f64>| -> Vec<f64> { ok.iter().filter_map(|r| f(r)).collect() };
    let deltas: Vec<f64> = ok.iter().flat_map(|r| r.deltas()).collect();
    let zeros = summarize(&vec![0.0; ok.len()]);
    // Requests whose counts are not the server's own.
    let fallback = ok.iter().filter(|r| r.usage.is_none()).count();
    let mut labels: std::collections::BTreeMap<&str, (u64, Vec<&str>)> = Default::default();
    for r in &failed {
        if let Some((t, m)) = &r.error {
            let e = labels.entry(t).or_default();
            e.0 += 1;
            if !e.1.contains(&m.as_str()) && e.1.len() < 100 {
                e.1.push(m);
            }
        }
    }
    let mut by_label: Vec<(&str, (u64, Vec<&str>))> = labels.into_iter().collect();
    by_label.sort_by_key(|(_, (n, _))| std::cmp::Reverse(*n));
    let by_label: serde_json::Map<String, Value> = by_label
        .into_iter()
        .map(|(l, (n, msgs))| {
            let msgs: Vec<Value> = msgs.iter().map(|m| json!({"message": m})).collect();
            (l.to_string(), json!({"count": n, "messages": msgs}))
        })
        .collect();
    json!({
        "benchmark_time_seconds": total_time,
        "load_summary": load,
        "successes": {
            "count": ok.len(),
            "latency": {
                "request_latency": summarize(&collect(&|r| Some(r.latency()))),
                "normalized_time_per_output_token": summarize(&collect(&|r| Some(r.ntpot()))),
                "time_per_output_token": summarize(&collect(&Req::tpot)),
                "time_to_first_token": summarize(&collect(&Req::ttft)),
                "inter_token_latency": summarize(&deltas),
            },
            "throughput": {
                "input_tokens_per_sec": per_s(input),
                "output_tokens_per_sec": per_s(output),
                "total_tokens_per_sec": per_s(input + output),
                "requests_per_sec": per_s(ok.len() as f64),
                "images_per_sec": 0.0,
                "videos_per_sec": 0.0,
                "audios_per_sec": 0.0,
            },
            "request_size_bytes": null,
            "image": {"count": zeros, "pixels": null, "bytes": null, "aspect_ratio": null},
            "video": {"count": zeros, "frames": null, "pixels": null, "bytes": null, "aspect_ratio": null},
            "audio": {"count": zeros, "seconds": null, "bytes": null},
            "prompt_tokens": tokens(&ok, |r| r.input, Some(cached(&ok))),
            "output_len": summarize(&collect(&|r| Some(r.output))),
            "output_tokens": tokens(&ok, |r| r.output, None),
            "token_count_mismatches": 0,
            "client_fallback_requests": {"prompt": fallback, "output": fallback},
        },
        "failures": {
            "count": failed.len(),
            "request_latency": summarize(&failed.iter().map(|r| r.latency()).collect::<Vec<_>>()),
            "prompt_tokens": tokens(&failed, |r| r.input, Some(cached(&failed))),
            "by_label": by_label,
        },
    })
}

/// Writes the run's measured requests as inference-perf's report files in
/// the folder `out` (created if missing).
pub(super) fn write(run: &Run<'_>, out: &std::path::Path) -> Result<String> {
    use blis_traces::step::StepContext;
    std::fs::create_dir_all(out).step(|| format!("creating {}", out.display()))?;
    let have_chunks = run.trace.chunks.is_some();
    let t0 = run.trace.header.run_start_unix_us;
    let reqs: Vec<Req> = run
        .measured()
        .map(|s| Req::of(s, t0, have_chunks))
        .collect();
    let per_request: Vec<Value> = reqs.iter().map(Req::entry).collect();
    write_file(
        &out.join("per_request_lifecycle_metrics.json"),
        &serde_json::to_vec_pretty(&per_request)?,
    )?;
    if !reqs.is_empty() {
        let rate = run
            .trace
            .header
            .load_generator
            .as_ref()
            .and_then(|l| l.requested_rate.or(l.achieved_rate))
            .unwrap_or(0.0);
        write_file(
            &out.join("summary_lifecycle_metrics.json"),
            &serde_json::to_vec_pretty(&summary(&reqs, None))?,
        )?;
        write_file(
            &out.join("stage_0_lifecycle_metrics.json"),
            &serde_json::to_vec_pretty(&summary(&reqs, Some(rate)))?,
        )?;
    }
    let failed = reqs.iter().filter(|r| r.error.is_some()).count();
    let left = run.sent.len() - reqs.len();
    Ok(format!(
        "inference-perf reports: {} requests, {failed} failed{}{}",
        reqs.len(),
        if left > 0 {
            format!("; {left} warm-up left out")
        } else {
            String::new()
        },
        if have_chunks {
            ""
        } else {
            "; no per-chunk times in the trace, so no TTFT, TPOT or ITL"
        }
    ))
}
