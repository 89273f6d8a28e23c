//! Goodput under overload: the deadline cliff.
//!
//! When requests arrive faster than a server finishes them, a server that
//! starts them in arrival order (vLLM's default FCFS scheduler) builds a
//! queue whose wait grows linearly with time, and a client that cancels
//! each request `T` after its send (inference-perf's and `blis-loadgen`'s
//! timeout) then decides which requests complete: a request completes
//! when its wait plus its decode fits in `T`, so every request sent before
//! a time `t*` completes and every one sent after it times out, queued or
//! half decoded. The completed requests are the earliest sent; their
//! count is the *cliff*
//!
//! ```text
//! μ  = B / D                      requests finished per second (B decoding at once, D each)
//! t* = (T − D) · μ / (λ − μ)      the send time whose wait reaches T − D (wait grows at (λ − μ) / μ)
//! N  = λ · min(t*, send window)   completed requests
//! ```
//!
//! with `λ` the send rate, `D` the mean time from a completed request's
//! first token to its last and `B` the mean number of completed requests
//! decoding at once while the queue stood. The count is steep in the
//! decode time: `d ln N / d ln D = −(D / (T − D) + λ / (λ − μ))`, the
//! *elasticity*, so a decode time off by 1% moves the count by that many
//! percent (2–4 on the real vLLM runs of `../shared/vllm-ground-truth`,
//! where the cliff gives every saturated run's count within 5% from its own
//! decode time and concurrency; `docs/how-accurate.md`).
//!
//! Read off either side of a comparison, so a simulator's count error can
//! be told apart into "it decodes at another speed" (the cliff moves by
//! the elasticity times that error) and "it completes other requests"
//! (`in_order` below 1: preemption or another queue order decides).

use blis_traces::{Status, Trace, TraceRecord};
use serde::Serialize;

/// A wait of at least this long before the first token means the queue
/// stands (the server is full), µs.
const QUEUED_US: f64 = 1e6;

/// The deadline cliff of one side. Times in seconds, rates per second.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeadlineCliff {
    /// λ: requests sent per second over the send window.
    pub rate_per_s: f64,
    /// T: the client's timeout, s.
    pub timeout_s: f64,
    /// D: mean time from first token to last of the completed requests, s.
    pub decode_s: f64,
    /// B: mean number of completed requests decoding at once from the
    /// first start after a wait of 1 s or more to the last start.
    pub concurrency: f64,
    /// μ = B / D, requests finished per second.
    pub service_per_s: f64,
    /// t*: seconds after the first send beyond which no request
    /// completes; `None` when there is none within the send window (the
    /// server keeps up, μ ≥ λ, or falls behind too slowly) or a decode
    /// alone outlasts the timeout.
    pub cliff_s: Option<f64>,
    /// λ · t*, at most every send ([`fluid_completed`]): the completed
    /// requests the cliff predicts.
    pub predicted_completed: f64,
    /// Requests completed (`ok`).
    pub completed: u64,
    /// Of the `completed` earliest sends, the share that completed: 1 when
    /// the completed requests are exactly the earliest sent (the cliff
    /// decides), lower when preemption or another queue order decides.
    pub in_order: f64,
    /// |d ln N / d ln D|: the percent a count moves per percent of decode
    /// time; `NaN` without a cliff.
    pub elasticity: f64,
}

/// t*, s: the send time after which a fluid first-come-first-served queue
/// completes no request, with sends at `rate` per second, `concurrency`
/// requests decoding at once for `decode_s` each and a client timeout of
/// `timeout_s`; `None` when the queue keeps up (μ = concurrency / decode ≥
/// rate). 0 when a decode alone outlasts the timeout.
pub fn cliff_s(rate: f64, concurrency: f64, decode_s: f64, timeout_s: f64) -> Option<f64> {
    let service = concurrency / decode_s;
    (rate > service).then(|| (timeout_s - decode_s).max(0.0) * service / (rate - service))
}

/// Requests of `requests` sent at `rate` per second that the fluid queue of
/// [`cliff_s`] completes: `rate · t*`, at most `requests`.
pub fn fluid_completed(
    requests: f64,
    rate: f64,
    concurrency: f64,
    decode_s: f64,
    timeout_s: f64,
) -> f64 {
    match cliff_s(rate, concurrency, decode_s, timeout_s) {
        Some(c) => (rate * c).min(requests),
        None => requests,
    }
}

/// The client's timeout of `records`, µs: the median of their deadlines
/// less their arrivals (a trace records `deadline_us` as arrival plus the
/// client's timeout); `None` when no request has one.
pub fn timeout_from_deadlines(records: &[TraceRecord]) -> Option<i64> {
    let mut t: Vec<i64> = records
        .iter()
        .filter_map(|r| {
            r.request
                .deadline_us
                .map(|d| d.saturating_sub(r.request.arrival_time_us))
        })
        .filter(|&t| t > 0)
        .collect();
    if t.is_empty() {
        return None;
    }
    t.sort_unstable();
    Some(t[t.len() / 2])
}

/// The client's timeout of `trace`, µs: the header's
/// `load_generator.timeout_s`, else [`timeout_from_deadlines`].
pub fn client_timeout_us(trace: &Trace) -> Option<i64> {
    blis_replay::api::client_timeout_us(&trace.header)
        .or_else(|| timeout_from_deadlines(&trace.records))
}

/// The deadline cliff of one side's `records` under a client timeout of
/// `timeout_us`; `None` when it cannot be read: no timeout, fewer than 2
/// sends or completed requests, no queue that stood at least one decode
/// time.
pub fn deadline_cliff(records: &[TraceRecord], timeout_us: Option<i64>) -> Option<DeadlineCliff> {
    let timeout_us = timeout_us.filter(|&t| t > 0)?;
    let mut sends: Vec<(i64, u64, bool)> = records
        .iter()
        .filter_map(|r| {
            let ok = r.outcome.status == Some(Status::Ok);
            r.outcome
                .send_time_us
                .map(|s| (s, r.request.request_id, ok))
        })
        .collect();
    if sends.len() < 2 {
        return None;
    }
    sends.sort_unstable();
    // Differences of two µs times in f64: a hostile trace's times may
    // span more than i64 holds.
    let span = |a: i64, b: i64| b as f64 - a as f64;
    let window_us = span(sends[0].0, sends[sends.len() - 1].0);
    if window_us <= 0.0 {
        return None;
    }
    let rate = (sends.len() - 1) as f64 / (window_us / 1e6);
    // (send, first token, last token) of the completed requests.
    let done: Vec<(i64, i64, i64)> = records
        .iter()
        .filter(|r| r.outcome.status == Some(Status::Ok))
        .filter_map(|r| {
            let o = &r.outcome;
            let (s, f, l) = (
                o.send_time_us?,
                o.first_chunk_time_us?,
                o.last_chunk_time_us?,
            );
            (s <= f && f <= l).then_some((s, f, l))
        })
        .collect();
    let completed = sends.iter().filter(|s| s.2).count();
    if done.len() < 2 {
        return None;
    }
    let decode_us = done.iter().map(|d| span(d.1, d.2)).sum::<f64>() / done.len() as f64;
    let from = done
        .iter()
        .filter(|d| span(d.0, d.1) >= QUEUED_US)
        .map(|d| d.1)
        .min()?;
    let to = done.iter().map(|d| d.1).max()?;
    if span(from, to) < decode_us {
        return None;
    }
    let busy: f64 = done
        .iter()
        .map(|d| span(d.1.max(from), d.2.min(to)).max(0.0))
        .sum();
    let concurrency = busy / span(from, to);
    let decode_s = decode_us / 1e6;
    let timeout_s = timeout_us as f64 / 1e6;
    let service = concurrency / decode_s;
    let window_s = window_us / 1e6;
    let cliff_s = cliff_s(rate, concurrency, decode_s, timeout_s).filter(|&c| c < window_s);
    let predicted = fluid_completed(sends.len() as f64, rate, concurrency, decode_s, timeout_s);
    let elasticity = match cliff_s {
        Some(_) => decode_s / (timeout_s - decode_s) + rate / (rate - service),
        None => f64::NAN,
    };
    let earliest_ok = sends[..completed].iter().filter(|s| s.2).count();
    Some(DeadlineCliff {
        rate_per_s: rate,
        timeout_s,
        decode_s,
        concurrency,
        service_per_s: service,
        cliff_s,
        predicted_completed: predicted,
        completed: completed as u64,
        in_order: if completed == 0 {
            f64::NAN
        } else {
            earliest_ok as f64 / completed as f64
        },
        elasticity,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use blis_traces::{Outcome, Request};

    /// An FCFS server with `b` slots, each request decoding for `d` µs
    /// ±10% (spread evenly over the requests), `n` requests sent every
    /// `gap` µs, a client timeout of `t` µs: the records it gives.
    fn fcfs(n: i64, gap: i64, b: usize, d: i64, t: i64) -> Vec<TraceRecord> {
        let mut free = vec![0i64; b];
        (0..n)
            .map(|i| {
                let send = i * gap;
                let k = (0..b).min_by_key(|&k| free[k]).unwrap();
                let start = free[k].max(send);
                let d = d / 10 * 9 + d / 5 * ((i * 7919) % 1000) / 1000;
                let (status, first, last) = if start >= send + t {
                    // Cancelled in the queue: the slot stays free.
                    (Status::Timeout, None, None)
                } else if start + d > send + t {
                    // Cancelled half decoded: the slot is held until then.
                    free[k] = send + t;
                    (Status::Timeout, Some(start), None)
                } else {
                    free[k] = start + d;
                    (Status::Ok, Some(start), Some(start + d))
                };
                TraceRecord {
                    request: Request {
                        request_id: i as u64,
                        arrival_time_us: send,
                        deadline_us: Some(send + t),
                        ..Request::default()
                    },
                    outcome: Outcome {
                        send_time_us: Some(send),
                        first_chunk_time_us: first,
                        last_chunk_time_us: last,
                        status: Some(status),
                        ..Outcome::default()
                    },
                    other: vec![],
                }
            })
            .collect()
    }

    #[test]
    fn an_overloaded_fcfs_server_completes_the_earliest_sends_up_to_the_cliff() {
        // 4 req/s for 1,200 s into 128 slots of 45 s (2.84 req/s), 300 s
        // timeout: t* = 255 · 2.84 / 1.16 = 625 s, about 2,500 complete.
        let recs = fcfs(4800, 250_000, 128, 45_000_000, 300_000_000);
        let t = timeout_from_deadlines(&recs);
        assert_eq!(t, Some(300_000_000));
        let c = deadline_cliff(&recs, t).unwrap();
        // Decodes of ±10% let a few late requests squeeze in.
        assert!(c.in_order > 0.99, "{c:?}");
        assert!((c.concurrency - 128.0).abs() < 1.0, "{c:?}");
        let err = c.predicted_completed / c.completed as f64 - 1.0;
        assert!(err.abs() < 0.05, "{c:?}");
        let cliff = c.cliff_s.unwrap();
        assert!((600.0..650.0).contains(&cliff), "{c:?}");
        // D / (T − D) + λ / (λ − μ) = 0.176 + 3.45.
        assert!((c.elasticity - 3.63).abs() < 0.1, "{c:?}");
    }

    #[test]
    fn the_elasticity_is_how_far_the_count_moves_with_the_decode_time() {
        let t = 300_000_000;
        let base = deadline_cliff(&fcfs(4800, 250_000, 128, 45_000_000, t), Some(t)).unwrap();
        let slower = deadline_cliff(&fcfs(4800, 250_000, 128, 45_450_000, t), Some(t)).unwrap();
        // 1% slower decodes: the count drops by about the elasticity in %.
        let moved = 100.0 * (1.0 - slower.completed as f64 / base.completed as f64);
        assert!(
            (moved - base.elasticity).abs() < 0.25 * base.elasticity,
            "moved {moved:.2}% against elasticity {:.2}",
            base.elasticity
        );
    }

    #[test]
    fn a_server_that_keeps_up_has_no_cliff() {
        // 2 req/s into 128 slots of 45 s (2.84 req/s): all complete.
        let recs = fcfs(2400, 500_000, 128, 45_000_000, 300_000_000);
        let c = deadline_cliff(&recs, Some(300_000_000));
        // No wait of a second or more: the queue never stood.
        assert_eq!(c, None);
        // Without a timeout there is no cliff either.
        let recs = fcfs(4800, 250_000, 128, 45_000_000, i64::MAX / 4);
        assert_eq!(deadline_cliff(&recs, None), None);
    }

    #[test]
    fn times_at_the_ends_of_the_clock_do_not_overflow() {
        let mut recs = fcfs(600, 250_000, 16, 45_000_000, 300_000_000);
        recs[0].outcome.send_time_us = Some(i64::MIN);
        recs[0].outcome.first_chunk_time_us = Some(i64::MIN);
        recs[0].outcome.last_chunk_time_us = Some(i64::MAX);
        recs[1].request.deadline_us = Some(i64::MAX);
        recs[1].request.arrival_time_us = i64::MIN;
        let c = deadline_cliff(&recs, timeout_from_deadlines(&recs));
        assert!(
            c.as_ref().is_none_or(|c| c.predicted_completed.is_finite()),
            "{c:?}"
        );
        let c = deadline_cliff(&recs, Some(i64::MAX));
        assert!(
            c.as_ref().is_none_or(|c| c.predicted_completed.is_finite()),
            "{c:?}"
        );
        assert_eq!(deadline_cliff(&[], Some(1)), None);
    }

    #[test]
    fn completions_out_of_send_order_show_in_in_order() {
        let mut recs = fcfs(4800, 250_000, 128, 45_000_000, 300_000_000);
        let c = deadline_cliff(&recs, Some(300_000_000)).unwrap();
        // Swap the outcomes of an early completed and a late timed-out
        // request: another order decided.
        let (a, b) = (10, 4000);
        let oa = recs[a].outcome.clone();
        let ob = recs[b].outcome.clone();
        recs[a].outcome = ob;
        recs[a].outcome.send_time_us = Some(recs[a].request.arrival_time_us);
        recs[b].outcome = oa;
        recs[b].outcome.send_time_us = Some(recs[b].request.arrival_time_us);
        let swapped = deadline_cliff(&recs, Some(300_000_000)).unwrap();
        assert_eq!(swapped.completed, c.completed);
        assert!(swapped.in_order < 1.0, "{swapped:?}");
    }
}
