//! Pairing the requests of two traces by `request_id`, and the per-request
//! latencies (ms) that are compared: TTFT, E2E, TPOT and mean ITL.
//!
//! A pair is kept when both sides completed the request (`ok`) and it is
//! past the warm-up. Times are taken from each trace's own send time, so a
//! real trace's client-side lateness does not count against the
//! simulator. `rtt_ms` is added to the simulated TTFT and E2E (the
//! simulator has no network; a real client sees one round trip in both).

use std::collections::BTreeMap;

use blis_traces::{ChunkRecord, Outcome, Status, Trace, TraceRecord};
use serde::Serialize;

/// Request counts by status of one side.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct StatusCounts {
    /// Rows in the trace.
    pub total: u64,
    /// `ok`.
    pub ok: u64,
    /// `error`.
    pub error: u64,
    /// `timeout`.
    pub timeout: u64,
    /// `cancelled`.
    pub cancelled: u64,
    /// Without a status (a planned trace).
    pub unknown: u64,
    /// Warm-up rows (any status), left out.
    pub warmup: u64,
}

impl StatusCounts {
    fn of(records: &[TraceRecord], warmup_below: u64) -> Self {
        let mut c = Self {
            total: records.len() as u64,
            ..Self::default()
        };
        for r in records {
            if r.request.request_id < warmup_below {
                c.warmup += 1;
                continue;
            }
            match r.outcome.status {
                Some(Status::Ok) => c.ok += 1,
                Some(Status::Error) => c.error += 1,
                Some(Status::Timeout) => c.timeout += 1,
                Some(Status::Cancelled) => c.cancelled += 1,
                None => c.unknown += 1,
            }
        }
        c
    }
}

/// Requests whose token counts differ between the sides.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct TokenMismatches {
    /// Pairs whose input tokens (server-reported where known) differ.
    pub input: u64,
    /// Pairs whose output tokens differ.
    pub output: u64,
    /// Up to 10 example request ids.
    pub examples: Vec<u64>,
}

/// How the two traces' requests matched.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Matching {
    /// Real side by status.
    pub real: StatusCounts,
    /// Simulated side by status.
    pub sim: StatusCounts,
    /// Pairs compared (both `ok`, past warm-up).
    pub paired: u64,
    /// Request ids only in the real trace.
    pub only_real: u64,
    /// Request ids only in the simulated trace.
    pub only_sim: u64,
    /// Requests on both sides left out because a side did not complete them.
    pub not_ok_on_a_side: u64,
    /// Rows whose request id an earlier row of the same trace already has
    /// (real, sim): only the last row of an id is compared.
    pub duplicate_rows: (u64, u64),
    /// Completed rows whose times are out of order (real, sim): a first
    /// chunk before the send or after the last chunk, or a last chunk
    /// before the send. Their pairs are left out, as a recorder's fault.
    #[serde(skip_serializing_if = "is_zero_pair")]
    pub out_of_order: (u64, u64),
    /// Token mismatches among the pairs.
    pub token_mismatches: TokenMismatches,
}

fn is_zero_pair(x: &(u64, u64)) -> bool {
    *x == (0, 0)
}

/// Whether a completed row's times are possible: send ≤ first chunk ≤
/// last chunk (the first chunk when there is one). Rows out of order are a
/// recorder's fault, not a measurement: comparisons and fits leave them out.
pub(crate) fn times_in_order(o: &Outcome, send: i64, last: i64) -> bool {
    send <= last && o.first_chunk_time_us.is_none_or(|f| send <= f && f <= last)
}

/// One compared request.
#[derive(Debug, Clone, PartialEq)]
pub struct Pair {
    /// The request id.
    pub id: u64,
    /// Index of the real row.
    pub real: usize,
    /// Index of the simulated row.
    pub sim: usize,
}

/// Per-request values of one metric over a subset of the pairs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Series {
    /// Real values, ms.
    pub real: Vec<f64>,
    /// Simulated values, ms.
    pub sim: Vec<f64>,
    /// Index into [`Paired::pairs`] of each value, ascending.
    pub pair: Vec<u32>,
}

impl Series {
    fn push(&mut self, i: usize, r: f64, s: f64) {
        self.real.push(r);
        self.sim.push(s);
        self.pair.push(i as u32);
    }
}

/// The pairs of a comparison and their per-request metrics.
#[derive(Debug, Clone, Default)]
pub struct Paired {
    /// The pairs, by request id.
    pub pairs: Vec<Pair>,
    /// Time to first token (streamed requests on both sides).
    pub ttft: Series,
    /// End-to-end latency.
    pub e2e: Series,
    /// Time per output token after the first: (E2E − TTFT) / (output − 1).
    pub tpot: Series,
    /// Each request's mean inter-chunk gap (when both sides have ≥ 2
    /// chunks of it).
    pub itl: Series,
    /// Every inter-chunk gap of the paired requests, per side (ms).
    pub itl_gaps: (Vec<f64>, Vec<f64>),
    /// Matching counts.
    pub matching: Matching,
}

/// The warm-up threshold: the `n` smallest request ids of `records` are
/// warm-up, i.e. ids below the returned one.
pub fn warmup_below(records: &[TraceRecord], n: u64) -> u64 {
    if n == 0 {
        return 0;
    }
    let mut ids: Vec<u64> = records.iter().map(|r| r.request.request_id).collect();
    ids.sort_unstable();
    ids.get(n as usize).copied().unwrap_or(u64::MAX)
}

fn ms(us: i64) -> f64 {
    us as f64 / 1e3
}

/// Chunk times per request id, sorted by chunk index.
fn chunks_by_request(chunks: Option<&[ChunkRecord]>) -> BTreeMap<u64, Vec<i64>> {
    let mut m: BTreeMap<u64, Vec<(u32, i64)>> = BTreeMap::new();
    for c in chunks.unwrap_or_default() {
        m.entry(c.request_id)
            .or_default()
            .push((c.chunk_index, c.timestamp_us));
    }
    m.into_iter()
        .map(|(k, mut v)| {
            v.sort_unstable();
            (k, v.into_iter().map(|(_, t)| t).collect())
        })
        .collect()
}

/// One side of a pair: its record, send and last-chunk times (µs) and
/// chunk times.
struct Side<'a> {
    rec: &'a TraceRecord,
    send: i64,
    last: i64,
    chunks: Option<&'a [i64]>,
}

impl Paired {
    /// Pair `i`'s metrics: E2E; TTFT and TPOT when both sides streamed;
    /// the mean ITL when both have two chunks or more. The simulated side
    /// gets the network round trip `rtt_ms` added to its TTFT and E2E.
    fn add_metrics(&mut self, i: usize, real: &Side<'_>, sim: &Side<'_>, rtt_ms: f64) {
        let (a, b) = (real.rec, sim.rec);
        let e2e_r = ms(real.last - real.send);
        let e2e_s = ms(sim.last - sim.send) + rtt_ms;
        self.e2e.push(i, e2e_r, e2e_s);
        let firsts = (a.outcome.first_chunk_time_us, b.outcome.first_chunk_time_us);
        if a.request.streaming
            && b.request.streaming
            && let (Some(fa), Some(fb)) = firsts
        {
            let (t_r, t_s) = (ms(fa - real.send), ms(fb - sim.send) + rtt_ms);
            self.ttft.push(i, t_r, t_s);
            let n = a.request.output_tokens.min(b.request.output_tokens);
            if n > 1 {
                self.tpot.push(
                    i,
                    ms(real.last - fa) / f64::from(a.request.output_tokens - 1),
                    ms(sim.last - fb) / f64::from(b.request.output_tokens - 1),
                );
            }
        }
        if let (Some(ca), Some(cb)) = (real.chunks, sim.chunks)
            && ca.len() >= 2
            && cb.len() >= 2
        {
            let gaps = |c: &[i64], into: &mut Vec<f64>| {
                let start = into.len();
                into.extend(c.windows(2).map(|w| ms(w[1] - w[0])));
                crate::stats::mean(&into[start..])
            };
            let mr = gaps(ca, &mut self.itl_gaps.0);
            let msim = gaps(cb, &mut self.itl_gaps.1);
            self.itl.push(i, mr, msim);
        }
    }
}

/// Pairs `real` and `sim` and computes every per-request metric.
pub fn pair(real: &Trace, sim: &Trace, warmup: u64, rtt_ms: f64) -> Paired {
    let below = warmup_below(&real.records, warmup);
    let mut out = Paired {
        matching: Matching {
            real: StatusCounts::of(&real.records, below),
            sim: StatusCounts::of(&sim.records, below),
            ..Matching::default()
        },
        ..Paired::default()
    };
    let index = |t: &Trace| -> BTreeMap<u64, usize> {
        t.records
            .iter()
            .enumerate()
            .map(|(i, r)| (r.request.request_id, i))
            .collect()
    };
    let (ri, si) = (index(real), index(sim));
    let m = &mut out.matching;
    m.duplicate_rows = (
        (real.records.len() - ri.len()) as u64,
        (sim.records.len() - si.len()) as u64,
    );
    m.only_real = ri.keys().filter(|k| !si.contains_key(k)).count() as u64;
    m.only_sim = si.keys().filter(|k| !ri.contains_key(k)).count() as u64;
    let (rc, sc) = (
        chunks_by_request(real.chunks.as_deref()),
        chunks_by_request(sim.chunks.as_deref()),
    );
    for (&id, &r) in &ri {
        let Some(&s) = si.get(&id) else { continue };
        if id < below {
            continue;
        }
        let (a, b) = (&real.records[r], &sim.records[s]);
        if a.outcome.status != Some(Status::Ok) || b.outcome.status != Some(Status::Ok) {
            out.matching.not_ok_on_a_side += 1;
            continue;
        }
        let (Some(a_send), Some(a_last), Some(b_send), Some(b_last)) = (
            a.outcome.send_time_us,
            a.outcome.last_chunk_time_us,
            b.outcome.send_time_us,
            b.outcome.last_chunk_time_us,
        ) else {
            out.matching.not_ok_on_a_side += 1;
            continue;
        };
        let (a_ok, b_ok) = (
            times_in_order(&a.outcome, a_send, a_last),
            times_in_order(&b.outcome, b_send, b_last),
        );
        if !(a_ok && b_ok) {
            out.matching.out_of_order.0 += u64::from(!a_ok);
            out.matching.out_of_order.1 += u64::from(!b_ok);
            continue;
        }
        let tm = &mut out.matching.token_mismatches;
        let in_diff = a.effective_input_tokens() != b.effective_input_tokens();
        let out_diff = a.request.output_tokens != b.request.output_tokens;
        tm.input += u64::from(in_diff);
        tm.output += u64::from(out_diff);
        if (in_diff || out_diff) && tm.examples.len() < 10 {
            tm.examples.push(id);
        }
        let i = out.pairs.len();
        out.pairs.push(Pair {
            id,
            real: r,
            sim: s,
        });
        out.add_metrics(
            i,
            &Side {
                rec: a,
                send: a_send,
                last: a_last,
                chunks: rc.get(&id).map(Vec::as_slice),
            },
            &Side {
                rec: b,
                send: b_send,
                last: b_last,
                chunks: sc.get(&id).map(Vec::as_slice),
            },
            rtt_ms,
        );
    }
    out.matching.paired = out.pairs.len() as u64;
    out
}
