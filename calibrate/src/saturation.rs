//! Is the server saturated, i.e. is its backlog growing without bound?
//! Judged on each side from the trace itself: the number of requests in
//! the system (sent, not yet answered) at 20 instants across the send
//! window. A side is saturated when that backlog rises steadily (Spearman
//! ρ ≥ 0.8 against time), ends at least twice its median over the first
//! half, and at 8 requests or more. A stable prediction of a saturated
//! server (or the reverse) is a useless prediction, so a disagreement is
//! reported loudly.

use blis_traces::TraceRecord;
use serde::Serialize;

use crate::stats::{percentile, sorted, spearman};

/// One side's verdict.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SideVerdict {
    /// Whether the backlog grows without bound.
    pub saturated: bool,
    /// Requests in the system at the 20 instants.
    pub backlog: Vec<u64>,
    /// Spearman ρ of backlog against time.
    pub trend_rho: f64,
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

/// The verdict of one side.
pub fn verdict(records: &[TraceRecord]) -> SideVerdict {
    let spans: Vec<(i64, i64)> = records
        .iter()
        .filter_map(|r| {
            let s = r.outcome.send_time_us?;
            let e = r.outcome.last_chunk_time_us.unwrap_or(s);
            Some((s, e.max(s)))
        })
        .collect();
    let none = SideVerdict {
        saturated: false,
        backlog: Vec::new(),
        trend_rho: f64::NAN,
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
    let points = 20;
    let backlog: Vec<u64> = (1..=points)
        .map(|k| {
            let t = lo + (hi - lo) * k / points;
            spans.iter().filter(|(s, e)| *s <= t && t < *e).count() as u64
        })
        .collect();
    let b: Vec<f64> = backlog.iter().map(|&x| x as f64).collect();
    let idx: Vec<f64> = (0..b.len()).map(|i| i as f64).collect();
    let rho = spearman(&idx, &b);
    let first_half = sorted(&b[..b.len() / 2]);
    let med = percentile(&first_half, 50.0);
    let end = b[b.len() - 1];
    SideVerdict {
        saturated: rho >= 0.8 && end >= 2.0 * med.max(1.0) && end >= 8.0,
        backlog,
        trend_rho: rho,
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

    fn rec(send: i64, end: i64) -> TraceRecord {
        TraceRecord {
            request: Request::default(),
            outcome: Outcome {
                send_time_us: Some(send),
                last_chunk_time_us: Some(end),
                status: Some(Status::Ok),
                ..Outcome::default()
            },
            other: vec![],
        }
    }

    #[test]
    fn a_growing_backlog_is_saturated_and_a_steady_one_is_not() {
        // Arrivals every 10 ms; service 5 ms: stable.
        let stable: Vec<_> = (0..1000)
            .map(|i| rec(i * 10_000, i * 10_000 + 5_000))
            .collect();
        assert!(!verdict(&stable).saturated);
        // Service time grows with the queue: each waits for all before it.
        let growing: Vec<_> = (0..1000)
            .map(|i| rec(i * 10_000, i * 10_000 + i * 5_000))
            .collect();
        let v = verdict(&growing);
        assert!(v.saturated, "{v:?}");
    }
}
