//! Decode speed over the run: whether the real server's time per output
//! token changed over the run in a way the simulation does not follow.
//!
//! A simulator's step model is stationary: the same batch takes the same
//! time at minute one and at minute twenty. A real server need not be. On
//! the real vLLM runs of `../shared/vllm-ground-truth`, Mixtral-8x7B's
//! overloaded run decodes a constant batch of 128 at about 30 ms per token
//! in its first minutes and 41 ms seven minutes later, while its codegen
//! runs hold steady (`docs/trained-physics.md`); a prediction fitted to the
//! run's average is then too slow early and too fast late, and the error
//! of a long run is no longer one number. This check tells a user that
//! case apart from a model that is simply off.
//!
//! Each side's completed requests with two output tokens or more are placed
//! by their first token's time since that side's first send, in
//! [`WINDOWS`] equal windows of the real side's span of first tokens; per
//! window, the median of the requests' decode time per token,
//! `(last chunk − first chunk) / (output tokens − 1)` (the TPOT of the
//! comparison). A side's *change* is its last window's median over its
//! first's, less one, counting only windows with at least
//! [`MIN_REQUESTS`] requests on both sides. The run *drifts* when the two
//! changes differ by [`DRIFT`] or more (ten percentage points). The
//! simulation follows the batch (a load that grows, a queue that fills):
//! where its own decode time held within [`STEADY`] the load was steady,
//! and a change of the real side comes from outside the step model; where
//! it moved too, the simulated batch, preemption or step time evolved, and
//! the difference may be the simulation's as well (on the real Llama-2-7B
//! overload run, KV-bound, the simulated time per token of the last
//! requests rises by half where the server's holds).

use blis_traces::{Status, TraceRecord};
use serde::Serialize;

/// The most the simulated decode time may change over the run for its
/// load to count as steady (a fraction).
pub const STEADY: f64 = 0.05;

/// Windows over the run.
pub const WINDOWS: usize = 6;

/// Requests a window needs on each side to count.
pub const MIN_REQUESTS: usize = 20;

/// The least difference of the two sides' changes called a drift (a
/// fraction: 0.10 is ten percentage points).
pub const DRIFT: f64 = 0.10;

/// One window of the run. Times in seconds since each side's first send,
/// decode times in ms per token.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Window {
    /// Its start, s.
    pub from_s: f64,
    /// Its end, s.
    pub to_s: f64,
    /// Median real decode time per token of the requests whose first token
    /// came in it, ms; `None` without [`MIN_REQUESTS`] of them.
    pub real_ms: Option<f64>,
    /// The same, simulated.
    pub sim_ms: Option<f64>,
    /// Real requests in it.
    pub real_requests: u64,
    /// Simulated requests in it.
    pub sim_requests: u64,
}

/// The decode speed of both sides over the run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DecodeOverRun {
    /// The windows, in time order.
    pub windows: Vec<Window>,
    /// Real: last counted window's median over the first's, less one.
    pub real_change: f64,
    /// Simulated: the same windows.
    pub sim_change: f64,
    /// |real change − simulated change| ≥ [`DRIFT`].
    pub drift: bool,
    /// |simulated change| < [`STEADY`]: the simulated speed held, so a real
    /// change is not the batch's.
    pub steady_load: bool,
}

/// The first and the last of `windows` with [`MIN_REQUESTS`] on both
/// sides (those with medians); `None` when fewer than two have them.
fn counted_ends(windows: &[Window]) -> Option<(&Window, &Window)> {
    let mut counted = windows.iter().filter(|w| w.real_ms.is_some());
    let first = counted.next()?;
    let last = counted.next_back()?;
    Some((first, last))
}

impl DecodeOverRun {
    /// The windows the changes compare: the first and the last counted.
    pub fn ends(&self) -> (&Window, &Window) {
        counted_ends(&self.windows).expect("a verdict has two counted windows")
    }
}

/// (first token since the first send µs, decode ms per token) of the
/// completed requests of `records` with two output tokens or more.
fn decodes(records: &[TraceRecord]) -> Vec<(f64, f64)> {
    let Some(start) = records.iter().filter_map(|r| r.outcome.send_time_us).min() else {
        return Vec::new();
    };
    records
        .iter()
        .filter(|r| r.outcome.status == Some(Status::Ok) && r.request.output_tokens >= 2)
        .filter_map(|r| {
            let (f, l) = (
                r.outcome.first_chunk_time_us?,
                r.outcome.last_chunk_time_us?,
            );
            // Differences in f64: a hostile trace's times may span more
            // than i64 holds.
            let per_token = (l as f64 - f as f64) / 1e3 / f64::from(r.request.output_tokens - 1);
            (l >= f && per_token.is_finite()).then_some((f as f64 - start as f64, per_token))
        })
        .collect()
}

/// The median of `v` (sorted in place); `None` when empty.
fn median(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// The decode speed of `real` and `sim` over the run; `None` when fewer
/// than two windows have [`MIN_REQUESTS`] completed requests on both sides
/// (a short run, or one that completed little), or a side's first window
/// took no time per token (non-streamed answers).
pub fn decode_over_run(real: &[TraceRecord], sim: &[TraceRecord]) -> Option<DecodeOverRun> {
    let (r, s) = (decodes(real), decodes(sim));
    let lo = r.iter().map(|d| d.0).fold(f64::INFINITY, f64::min);
    let hi = r.iter().map(|d| d.0).fold(f64::NEG_INFINITY, f64::max);
    if r.is_empty() || hi <= lo {
        return None;
    }
    let width = (hi - lo) / WINDOWS as f64;
    let bin = |t: f64| ((t - lo) / width).floor().clamp(0.0, (WINDOWS - 1) as f64) as usize;
    let mut rb: Vec<Vec<f64>> = vec![Vec::new(); WINDOWS];
    let mut sb: Vec<Vec<f64>> = vec![Vec::new(); WINDOWS];
    for &(t, d) in &r {
        rb[bin(t)].push(d);
    }
    // The simulated side over the same windows; its requests past the
    // real side's span are left out.
    for &(t, d) in s.iter().filter(|d| d.0 >= lo && d.0 <= hi) {
        sb[bin(t)].push(d);
    }
    let windows: Vec<Window> = (0..WINDOWS)
        .map(|i| {
            let (rn, sn) = (rb[i].len(), sb[i].len());
            let counted = rn >= MIN_REQUESTS && sn >= MIN_REQUESTS;
            Window {
                from_s: (lo + width * i as f64) / 1e6,
                to_s: (lo + width * (i + 1) as f64) / 1e6,
                real_ms: if counted { median(&mut rb[i]) } else { None },
                sim_ms: if counted { median(&mut sb[i]) } else { None },
                real_requests: rn as u64,
                sim_requests: sn as u64,
            }
        })
        .collect();
    let (first, last) = counted_ends(&windows)?;
    let change = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if a > 0.0 => b / a - 1.0,
        _ => f64::NAN,
    };
    let real_change = change(first.real_ms, last.real_ms);
    let sim_change = change(first.sim_ms, last.sim_ms);
    if !(real_change.is_finite() && sim_change.is_finite()) {
        // A first window whose requests took no time per token (all their
        // chunks at once): no speed to compare against.
        return None;
    }
    let drift = (real_change - sim_change).abs() >= DRIFT;
    Some(DecodeOverRun {
        windows,
        real_change,
        sim_change,
        drift,
        steady_load: sim_change.abs() < STEADY,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use blis_traces::{Outcome, Request};

    /// `n` requests sent 1 s apart, each decoding 100 tokens at
    /// `per_token(i)` ms per token from a first token 0.5 s after its send.
    fn trace(n: usize, per_token: impl Fn(usize) -> f64) -> Vec<TraceRecord> {
        (0..n)
            .map(|i| {
                let send = i as i64 * 1_000_000;
                let first = send + 500_000;
                let last = first + (99.0 * per_token(i) * 1e3) as i64;
                TraceRecord {
                    request: Request {
                        request_id: i as u64,
                        output_tokens: 100,
                        streaming: true,
                        ..Request::default()
                    },
                    outcome: Outcome {
                        status: Some(Status::Ok),
                        send_time_us: Some(send),
                        first_chunk_time_us: Some(first),
                        last_chunk_time_us: Some(last),
                        ..Outcome::default()
                    },
                    other: Default::default(),
                }
            })
            .collect()
    }

    #[test]
    fn a_real_slowdown_the_simulation_lacks_is_a_drift() {
        // Real: 30 ms per token rising to 40 over the run; sim: 30 flat.
        let real = trace(600, |i| 30.0 + 10.0 * i as f64 / 599.0);
        let sim = trace(600, |_| 30.0);
        let d = decode_over_run(&real, &sim).unwrap();
        assert_eq!(d.windows.len(), WINDOWS);
        assert!(d.drift && d.steady_load);
        // First window's median 30.8 ms, last 39.2: +27%.
        assert!((d.real_change - 0.27).abs() < 0.01, "{}", d.real_change);
        assert!(d.sim_change.abs() < 1e-9);
        let w0 = &d.windows[0];
        assert_eq!((w0.real_requests, w0.sim_requests), (100, 100));
        assert!((w0.real_ms.unwrap() - 30.83).abs() < 0.01);
    }

    #[test]
    fn a_change_both_sides_share_is_no_drift() {
        // A load that grows: both sides slow down alike.
        let real = trace(600, |i| 20.0 + 20.0 * i as f64 / 599.0);
        let sim = trace(600, |i| 21.0 + 21.0 * i as f64 / 599.0);
        let d = decode_over_run(&real, &sim).unwrap();
        assert!(!d.drift && !d.steady_load, "{d:?}");
        assert!((d.real_change - d.sim_change).abs() < 0.01);
        // Steady on both sides.
        let d = decode_over_run(&trace(600, |_| 20.0), &trace(600, |_| 25.0)).unwrap();
        assert!(!d.drift && d.real_change.abs() < 1e-9);
    }

    #[test]
    fn too_few_requests_give_no_verdict() {
        // (real requests, sim requests, real ms per token): 6 windows of 10
        // requests (none has MIN_REQUESTS); no or one real request; whole
        // answers at once (first chunk = last: no speed).
        for (n_real, n_sim, ms) in [
            (60, 60, 20.0),
            (0, 600, 20.0),
            (1, 600, 20.0),
            (600, 600, 0.0),
        ] {
            let d = decode_over_run(&trace(n_real, |_| ms), &trace(n_sim, |_| 20.0));
            assert_eq!(d, None, "{n_real} / {n_sim} requests, {ms} ms");
        }
    }
}
