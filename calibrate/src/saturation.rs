//! Is the server saturated, i.e. does the work waiting to start grow
//! without bound? Judged on each side from the trace itself.
//!
//! A request *waits* from its send until its first token (or, when it
//! never got one, until the end of what is known of it: its timeout or
//! error). Requests being decoded are not waiting: a server that decodes
//! 40 long answers at once while new requests start within milliseconds is
//! busy, not saturated. The number waiting is taken at 20 instants across
//! the send window. A side is saturated when either
//! - that number rises steadily (Spearman ρ ≥ 0.8 against time), ends at
//!   least twice its median over the first half, and at 8 requests or
//!   more: the queue grows (vLLM's own signal of overload,
//!   `vllm:num_requests_waiting` growing, read from the client's side so
//!   it works for every server and for the simulator alike); or
//! - at least 5% of the requests that got an answer timed out before their
//!   first token while 8 or more waited: arrivals outpaced the server, and
//!   the client's timeout caps the queue (it then stops growing at about
//!   rate × timeout, so the trend alone misses it).
//!
//! A stable prediction of a saturated server (or the reverse) is a useless
//! prediction, so a disagreement is reported loudly.

use blis_traces::{Status, TraceRecord};
use serde::Serialize;

use crate::stats::{percentile, sorted, spearman};

/// Instants at which the waiting requests are counted.
const POINTS: i64 = 20;

/// One side's verdict.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SideVerdict {
    /// Whether the number of requests waiting to start grows without
    /// bound.
    pub saturated: bool,
    /// Requests sent and still waiting for their first token at the 20
    /// instants.
    pub waiting: Vec<u64>,
    /// Spearman ρ of `waiting` against time.
    pub trend_rho: f64,
    /// Requests that timed out before their first token.
    pub timed_out_waiting: u64,
    /// Requests that got an answer (`ok`, `error` or `timeout`).
    pub answered: u64,
    /// Why the side is saturated, when it is.
    pub reason: Option<String>,
}

/// Both sides' verdicts.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Saturation {
    /// Real side.
    pub real: SideVerdict,
    /// Simulated side.
    pub sim: SideVerdict,
    /// Whether they agree.
    pub agree: bool,
}

/// The interval `[send, start)` during which a request waited, µs; `None`
/// when it was never sent.
fn waiting_span(r: &TraceRecord) -> Option<(i64, i64)> {
    let o = &r.outcome;
    let s = o.send_time_us?;
    let e = o.first_chunk_time_us.or(o.last_chunk_time_us).unwrap_or(s);
    Some((s, e.max(s)))
}

/// The verdict of one side.
pub fn verdict(records: &[TraceRecord]) -> SideVerdict {
    let spans: Vec<(i64, i64)> = records.iter().filter_map(waiting_span).collect();
    let answered = records
        .iter()
        .filter(|r| {
            matches!(
                r.outcome.status,
                Some(Status::Ok | Status::Error | Status::Timeout)
            )
        })
        .count() as u64;
    let timed_out_waiting = records
        .iter()
        .filter(|r| {
            r.outcome.status == Some(Status::Timeout) && r.outcome.first_chunk_time_us.is_none()
        })
        .count() as u64;
    let none = SideVerdict {
        saturated: false,
        waiting: Vec::new(),
        trend_rho: f64::NAN,
        timed_out_waiting,
        answered,
        reason: None,
    };
    let (Some(lo), Some(hi)) = (
        spans.iter().map(|s| s.0).min(),
        spans.iter().map(|s| s.0).max(),
    ) else {
        return none;
    };
    if hi <= lo {
        return none;
    }
    let waiting: Vec<u64> = (1..=POINTS)
        .map(|k| {
            let t = lo + (hi - lo) * k / POINTS;
            spans.iter().filter(|(s, e)| *s <= t && t < *e).count() as u64
        })
        .collect();
    let w: Vec<f64> = waiting.iter().map(|&x| x as f64).collect();
    let idx: Vec<f64> = (0..w.len()).map(|i| i as f64).collect();
    let rho = spearman(&idx, &w);
    let first_half = sorted(&w[..w.len() / 2]);
    let med = percentile(&first_half, 50.0);
    let end = waiting[waiting.len() - 1];
    let peak = waiting.iter().copied().max().unwrap_or(0);
    let reason = if rho >= 0.8 && end as f64 >= 2.0 * med.max(1.0) && end >= 8 {
        Some(format!(
            "the requests waiting to start grew steadily to {end} (trend ρ {rho:.2})"
        ))
    } else if answered > 0 && timed_out_waiting * 20 >= answered && peak >= 8 {
        Some(format!(
            "{timed_out_waiting} of {answered} requests ({:.0}%) timed out before their first token, with up to {peak} waiting",
            100.0 * timed_out_waiting as f64 / answered as f64
        ))
    } else {
        None
    };
    SideVerdict {
        saturated: reason.is_some(),
        waiting,
        trend_rho: rho,
        timed_out_waiting,
        answered,
        reason,
    }
}

/// Both verdicts.
pub fn compare(real: &[TraceRecord], sim: &[TraceRecord]) -> Saturation {
    let (r, s) = (verdict(real), verdict(sim));
    Saturation {
        agree: r.saturated == s.saturated,
        real: r,
        sim: s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use blis_traces::{Outcome, Request, Status};

    fn rec(send: i64, first: i64, end: i64) -> TraceRecord {
        TraceRecord {
            request: Request::default(),
            outcome: Outcome {
                send_time_us: Some(send),
                first_chunk_time_us: Some(first),
                last_chunk_time_us: Some(end),
                status: Some(Status::Ok),
                ..Outcome::default()
            },
            other: vec![],
        }
    }

    #[test]
    fn a_growing_queue_is_saturated_and_a_steady_one_is_not() {
        // Arrivals every 10 ms; first token after 5 ms: stable.
        let stable: Vec<_> = (0..1000)
            .map(|i| rec(i * 10_000, i * 10_000 + 5_000, i * 10_000 + 6_000))
            .collect();
        assert!(!verdict(&stable).saturated);
        // Each waits for all before it: the queue grows.
        let growing: Vec<_> = (0..1000)
            .map(|i| {
                rec(
                    i * 10_000,
                    i * 10_000 + i * 5_000,
                    i * 10_000 + i * 5_000 + 1,
                )
            })
            .collect();
        let v = verdict(&growing);
        assert!(v.saturated, "{v:?}");
    }

    #[test]
    fn long_decodes_that_pile_up_are_not_saturation() {
        // First tokens after 40 ms, but each answer streams for 30 s of a
        // 60 s run: the requests in the system grow for half the run,
        // the requests waiting do not.
        let busy: Vec<_> = (0..360)
            .map(|i| {
                let s = i * 166_000;
                rec(s, s + 40_000, s + 30_000_000)
            })
            .collect();
        let v = verdict(&busy);
        assert!(!v.saturated, "{v:?}");
        assert!(v.waiting.iter().all(|&w| w <= 1), "{v:?}");
    }

    #[test]
    fn requests_that_time_out_before_a_token_wait_until_their_timeout() {
        // Every request times out after 300 s without a first token.
        let stuck: Vec<_> = (0..600)
            .map(|i| {
                let s = i * 1_000_000;
                let mut r = rec(s, 0, s + 300_000_000);
                r.outcome.first_chunk_time_us = None;
                r.outcome.status = Some(Status::Timeout);
                r
            })
            .collect();
        let v = verdict(&stuck);
        assert!(v.saturated, "{v:?}");
    }
}
