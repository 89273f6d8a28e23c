//! The data-driven start of a step-table fit
//! ([`blis_replay::latency::step_table`]): a server's steps recovered from
//! the times of its streamed tokens, and their durations regressed on the
//! table's terms.
//!
//! An engine that streams one token per decoding request at the end of
//! every step (llama.cpp's `llama-server`, vLLM without multi-step) sends
//! the tokens of one step together: sorted by time, the tokens of all
//! requests fall into groups separated by the step time, with gaps inside
//! a group of the HTTP path's jitter only. A group is one step's end; its
//! tokens after a request's first are the step's decoding requests, its
//! first tokens the prefills it finished. The time from one group to the
//! next is a step's duration wherever the engine was busy in between: some
//! request of the group also sent a token in the group before (it kept
//! decoding), or each prefill of the group was sent before the group
//! before.
//!
//! ```text
//! duration_k ≈ decode_us[D_k] + prompt_token_us · P_k + prompt_pair_us · Q_k
//!              + context_token_us · C_k
//! ```
//!
//! with `D_k` the decoding requests, `P_k` the uncached prompt tokens of the
//! prefills finished in step k, `Q_k` their causal attention's query–key
//! pairs and `C_k` the context the decoding requests attend (each one's
//! prompt and tokens so far), fitted by non-negative least squares.
//! Entries no step measured are interpolated between their neighbours (or
//! continued from the last slope). The queueing delay is the median of
//! (TTFT − network round trip − predicted prefill step) over requests that
//! met an idle engine.

use std::collections::{BTreeMap, BTreeSet};

use blis_replay::latency::causal_pairs;
use blis_traces::{Status, Trace};

use crate::nnls::nnls;

/// One recovered step: its duration (µs) and terms.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Step {
    /// Requests decoding.
    pub decoding: usize,
    /// Uncached prompt tokens of the prefills it finished.
    pub prompt_tokens: f64,
    /// Context attended by the decoding requests.
    pub context_tokens: f64,
    /// Query–key pairs of the prefills' causal attention.
    pub prompt_pairs: f64,
    /// Duration, µs.
    pub duration_us: f64,
}

/// A token event: time (µs), request, position in its stream.
type Event = (i64, u64, u32);

/// The steps of `trace` that ended before its first request outside
/// `fit_ids` was sent (so that nothing held out informs the fit), and the
/// TTFT samples (µs, less the round trip) of requests that met an idle
/// engine, with their uncached prompt tokens.
pub fn recover_steps(
    trace: &Trace,
    fit_ids: &BTreeSet<u64>,
    rtt_ms: f64,
) -> (Vec<Step>, Vec<(f64, f64)>) {
    let Some(chunks) = &trace.chunks else {
        return (Vec::new(), Vec::new());
    };
    let mut info: BTreeMap<u64, (i64, i64, f64, f64)> = BTreeMap::new();
    let mut cutoff = i64::MAX;
    for r in &trace.records {
        let o = &r.outcome;
        let id = r.request.request_id;
        if !fit_ids.contains(&id) {
            if let Some(s) = o.send_time_us {
                cutoff = cutoff.min(s);
            }
            continue;
        }
        let (Some(s), Some(l)) = (o.send_time_us, o.last_chunk_time_us) else {
            continue;
        };
        if o.status != Some(Status::Ok) {
            continue;
        }
        let input = f64::from(r.effective_input_tokens());
        let cached = f64::from(o.cached_tokens.unwrap_or(0))
            .min(input - 1.0)
            .max(0.0);
        info.insert(id, (s, l, input, input - cached));
    }
    // A chunk of several tokens (a server that streams every few steps)
    // hides its steps: such requests show no step boundaries.
    for c in chunks.iter().filter(|c| several_tokens(c)) {
        info.remove(&c.request_id);
    }
    let mut events: Vec<Event> = chunks
        .iter()
        .filter(|c| info.contains_key(&c.request_id) && c.timestamp_us < cutoff)
        .map(|c| (c.timestamp_us, c.request_id, c.chunk_index))
        .collect();
    events.sort_unstable();
    if events.len() < 20 {
        return (Vec::new(), Vec::new());
    }
    // A request's own inter-token gaps are at least a step: half of their
    // 1st percentile separates steps from the jitter within one (tens to
    // hundreds of µs on the HTTP path).
    let mut own: Vec<i64> = Vec::new();
    let mut last_of: BTreeMap<u64, i64> = BTreeMap::new();
    for &(t, id, _) in &events {
        if let Some(p) = last_of.insert(id, t) {
            own.push(t - p);
        }
    }
    own.sort_unstable();
    let eps = own.get(own.len() / 100).map_or(300, |m| (m / 2).max(100));
    let mut groups: Vec<Vec<Event>> = Vec::new();
    for e in events {
        match groups.last_mut() {
            Some(g) if e.0 - g.last().expect("non-empty").0 <= eps => g.push(e),
            _ => groups.push(vec![e]),
        }
    }
    let typical = own.get(own.len() / 2).copied().unwrap_or(0);
    let groups = merge_split_steps(groups, typical, &last_of);
    let mut steps = Vec::new();
    let mut idle_ttft = Vec::new();
    for k in 1..groups.len() {
        let (prev, g) = (&groups[k - 1], &groups[k]);
        // A step ends at its group's first token: the one the HTTP path
        // delayed least.
        let (t_prev, t) = (prev[0].0, g[0].0);
        let prev_ids: BTreeSet<u64> = prev.iter().map(|e| e.1).collect();
        let kept_decoding = g.iter().any(|e| e.2 > 0 && prev_ids.contains(&e.1));
        let prefills_waited = g
            .iter()
            .filter(|e| e.2 == 0)
            .all(|e| info.get(&e.1).is_some_and(|i| i.0 < t_prev));
        let busy = if g.iter().any(|e| e.2 == 0) {
            prefills_waited && (kept_decoding || g.iter().all(|e| e.2 == 0))
        } else {
            kept_decoding
        };
        if !busy {
            // A prefill that met an idle engine: its TTFT is the queueing
            // delay, one prefill step and the hop.
            if g.iter().all(|e| e.2 == 0)
                && let [e] = g.as_slice()
                && let Some(i) = info.get(&e.1)
                && i.0 >= t_prev
            {
                idle_ttft.push(((e.0 - i.0) as f64 - rtt_ms * 1e3, i.3));
            }
            continue;
        }
        let mut s = Step {
            decoding: 0,
            prompt_tokens: 0.0,
            context_tokens: 0.0,
            prompt_pairs: 0.0,
            duration_us: (t - t_prev) as f64,
        };
        for e in g {
            let Some(i) = info.get(&e.1) else { continue };
            if e.2 == 0 {
                let (n, before) = (i.3, i.2 - i.3);
                s.prompt_tokens += n;
                s.prompt_pairs += causal_pairs(n, before);
            } else {
                s.decoding += 1;
                s.context_tokens += i.2 + f64::from(e.2);
            }
        }
        steps.push(s);
    }
    (steps, idle_ttft)
}

/// Whether chunk `c` carries several tokens (its steps are hidden).
fn several_tokens(c: &blis_traces::ChunkRecord) -> bool {
    c.tokens.is_some_and(|n| n > 1)
}

/// Why no steps could be recovered from `traces`, for the fit's error: a
/// missing per-chunk companion or too few steps, or chunks that carry
/// several tokens each (the server streams every few steps, as vLLM's
/// `--stream-interval` above 1 does), which hide where steps end.
pub fn no_steps_reason<'a>(traces: impl Iterator<Item = &'a Trace>) -> String {
    let most = traces
        .filter_map(|t| t.chunks.as_ref())
        .flatten()
        .filter(|c| several_tokens(c))
        .filter_map(|c| c.tokens)
        .max();
    if let Some(most) = most {
        format!(
            "a step-table fit recovers the server's steps from its streamed tokens, one token per chunk: this trace's chunks carry up to {most} tokens each (the server streams every few steps, e.g. vLLM's --stream-interval), so its steps cannot be told apart; fit --latency-model blackbox instead"
        )
    } else {
        "a step-table fit recovers the server's steps from its streamed tokens: the trace needs its per-chunk companion (PREFIX.itl.csv) and at least 20 steps".into()
    }
}

/// Joins the groups that are one step's tokens split by the HTTP path's
/// jitter. On a busy host a server's response threads wait for a core, so
/// the tokens of one step can reach the client milliseconds apart, past
/// the grouping gap (seen on llama.cpp with 4 slots on 2 cores: a 12 ms
/// step's tokens arriving as 8 + 4 ms). Every running request sends one
/// token per step, so a group none of whose requests is in the group
/// before it, coming within a typical step (`typical_us`, the median of
/// the requests' own inter-token gaps), is the rest of that step's tokens
/// when it cannot be the next step: it has a decoding token (that request
/// would have skipped a step), or the group before has a request that
/// sends again later (the next step would carry its token). `last_us`:
/// each request's last token time.
fn merge_split_steps(
    groups: Vec<Vec<Event>>,
    typical_us: i64,
    last_us: &BTreeMap<u64, i64>,
) -> Vec<Vec<Event>> {
    let mut merged: Vec<Vec<Event>> = Vec::with_capacity(groups.len());
    // The requests of the last merged group.
    let mut ids: BTreeSet<u64> = BTreeSet::new();
    for g in groups {
        if let Some(s) = merged.last_mut() {
            let gap = g[0].0 - s.last().expect("non-empty").0;
            let disjoint = g.iter().all(|e| !ids.contains(&e.1));
            let not_next = g.iter().any(|e| e.2 > 0)
                || s.iter()
                    .any(|x| last_us.get(&x.1).is_some_and(|&l| l > x.0));
            if disjoint && not_next && gap < typical_us {
                ids.extend(g.iter().map(|e| e.1));
                s.extend(g);
                continue;
            }
        }
        ids.clear();
        ids.extend(g.iter().map(|e| e.1));
        merged.push(g);
    }
    merged
}

/// The starting parameters of a step-table fit with entries for 0 to
/// `slots` decoding requests, in the fit's order (α0, α1, α2, decode_0 …
/// decode_slots, prompt_token, context_token, prompt_pair); `None` when the traces have
/// no streamed tokens to recover steps from.
pub fn step_start<'a>(
    traces: impl Iterator<Item = (&'a Trace, &'a BTreeSet<u64>, f64)>,
    slots: usize,
) -> Option<Vec<f64>> {
    let mut steps = Vec::new();
    let mut idle = Vec::new();
    for (t, ids, rtt) in traces {
        let (s, i) = recover_steps(t, ids, rtt);
        steps.extend(s);
        idle.extend(i);
    }
    if steps.len() < 20 {
        return None;
    }
    let n = slots + 1;
    let cols = n + 3;
    let mut g = vec![vec![0.0; cols]; cols];
    let mut c = vec![0.0; cols];
    let mut seen = vec![false; n];
    for s in &steps {
        let d = s.decoding.min(slots);
        seen[d] = true;
        let mut x = vec![0.0; cols];
        x[d] = 1.0;
        x[n] = s.prompt_tokens;
        x[n + 1] = s.context_tokens;
        x[n + 2] = s.prompt_pairs;
        // Absolute errors: the table must give the mean step time, which
        // is what adds up along a request (relative errors would pull it
        // toward the many short steps of a skewed distribution).
        let y = s.duration_us;
        for i in 0..cols {
            if x[i] == 0.0 {
                continue;
            }
            c[i] += x[i] * y;
            for j in 0..cols {
                g[i][j] += x[i] * x[j];
            }
        }
    }
    let beta = nnls(&g, &c);
    let mut table: Vec<Option<f64>> = (0..n).map(|i| seen[i].then_some(beta[i])).collect();
    fill_gaps(&mut table);
    let decode: Vec<f64> = table.into_iter().map(|v| v.unwrap_or(0.0)).collect();
    let (prompt, context, pair) = (beta[n], beta[n + 1], beta[n + 2]);
    let mut host: Vec<f64> = idle
        .iter()
        .map(|(ttft, p)| ttft - decode[0] - prompt * p - pair * p * (p + 1.0) / 2.0)
        .collect();
    host.sort_by(f64::total_cmp);
    let alpha0 = host.get(host.len() / 2).copied().unwrap_or(0.0).max(0.0);
    let mut theta = vec![alpha0, 0.0, 0.0];
    theta.extend(decode);
    theta.extend([prompt, context, pair]);
    Some(theta)
}

/// Fills the entries no step measured: between two measured ones linearly,
/// past the last with its slope, before the first with the first's value
/// less the first measured slope (at least 0).
fn fill_gaps(t: &mut [Option<f64>]) {
    let known: Vec<usize> = (0..t.len()).filter(|&i| t[i].is_some()).collect();
    let Some(&first) = known.first() else {
        return;
    };
    let at = |t: &[Option<f64>], i: usize| t[i].expect("known");
    let slope_first = known
        .get(1)
        .map_or(0.0, |&j| (at(t, j) - at(t, first)) / (j - first) as f64);
    for i in 0..first {
        t[i] = Some((at(t, first) - slope_first * (first - i) as f64).max(0.0));
    }
    for w in known.windows(2) {
        let (a, b) = (w[0], w[1]);
        for i in a + 1..b {
            let f = (i - a) as f64 / (b - a) as f64;
            t[i] = Some(at(t, a) + f * (at(t, b) - at(t, a)));
        }
    }
    let last = *known.last().expect("non-empty");
    let slope_last = if known.len() >= 2 {
        let p = known[known.len() - 2];
        ((at(t, last) - at(t, p)) / (last - p) as f64).max(0.0)
    } else {
        0.0
    };
    for i in last + 1..t.len() {
        t[i] = Some(at(t, last) + slope_last * (i - last) as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use blis_traces::{ChunkRecord, Mode, Outcome, Request, TraceHeader, TraceRecord};

    #[test]
    fn gaps_are_filled_between_and_beyond_the_measured_entries() {
        let mut t = vec![None, Some(2.0), None, Some(4.0), None];
        fill_gaps(&mut t);
        assert_eq!(
            t,
            vec![Some(1.0), Some(2.0), Some(3.0), Some(4.0), Some(5.0)]
        );
    }

    /// A synthetic server with steps of 1000 + 700·D µs (D decoding
    /// requests, at most 4), 2 µs per prompt token, 0.01 µs per query–key
    /// pair of a prompt's causal attention and 0.2 µs per token of context
    /// a decoding request attends: four requests
    /// overlapping, each step's tokens reaching the client `late(k, j,
    /// step)` µs after step k's end (j: the token's place in the step,
    /// step: its duration).
    fn synthetic_server(late: impl Fn(usize, usize, i64) -> i64) -> Trace {
        let table = TABLE;
        // Requests: (send µs, prompt tokens, output tokens).
        let reqs = [
            (0i64, 100u32, 40u32),
            (500, 200, 60),
            (30_000, 50, 50),
            (31_000, 300, 80),
        ];
        // Event-driven engine: a step runs every running request.
        let mut records = Vec::new();
        let mut chunks = Vec::new();
        let mut state: Vec<(usize, u32)> = Vec::new(); // (request, tokens sent)
        let mut waiting: Vec<usize> = Vec::new();
        let mut t = 0i64;
        let mut next = 0;
        let mut done = 0;
        let mut k = 0;
        let mut last = vec![0i64; reqs.len()];
        while done < reqs.len() {
            while next < reqs.len() && reqs[next].0 <= t {
                waiting.push(next);
                next += 1;
            }
            if state.is_empty() && waiting.is_empty() {
                t = reqs[next].0;
                continue;
            }
            let d = state.len();
            let p: u32 = waiting.iter().map(|&i| reqs[i].1).sum();
            let pairs: f64 = waiting
                .iter()
                .map(|&i| {
                    let n = f64::from(reqs[i].1);
                    n * (n + 1.0) / 2.0
                })
                .sum();
            let context: u32 = state.iter().map(|&(i, n)| reqs[i].1 + n).sum();
            let step = (table[d] + 2.0 * f64::from(p) + PAIR * pairs + CONTEXT * f64::from(context))
                as i64;
            t += step;
            let mut j = 0;
            for (i, n) in state.iter_mut() {
                chunks.push((t + late(k, j, step), *i, *n));
                j += 1;
                *n += 1;
            }
            for &i in &waiting {
                chunks.push((t + late(k, j, step), i, 0));
                j += 1;
                state.push((i, 1));
            }
            k += 1;
            waiting.clear();
            state.retain(|&(i, n)| {
                if n >= reqs[i].2 {
                    done += 1;
                    false
                } else {
                    true
                }
            });
        }
        for c in &chunks {
            last[c.1] = last[c.1].max(c.0);
        }
        for (i, (s, input, output)) in reqs.iter().enumerate() {
            let mut r = TraceRecord::planned(Request {
                request_id: i as u64,
                input_tokens: *input,
                output_tokens: *output,
                streaming: true,
                ..Request::default()
            });
            r.outcome = Outcome {
                send_time_us: Some(*s),
                first_chunk_time_us: chunks.iter().find(|c| c.1 == i).map(|c| c.0),
                last_chunk_time_us: Some(last[i]),
                status: Some(Status::Ok),
                ..Outcome::default()
            };
            records.push(r);
        }
        chunks.sort_unstable();
        let mut trace = Trace::new(TraceHeader::new(Mode::Real), records);
        trace.chunks = Some(
            chunks
                .iter()
                .map(|&(t, i, n)| ChunkRecord {
                    request_id: i as u64,
                    chunk_index: n,
                    timestamp_us: t,
                    tokens: None,
                })
                .collect(),
        );
        trace
    }

    const TABLE: [f64; 5] = [1000.0, 1700.0, 2400.0, 3100.0, 3800.0];
    const PAIR: f64 = 0.01;
    const CONTEXT: f64 = 0.2;

    /// The table, the prompt cost and the two attention costs fitted from
    /// `trace` match the server's: a prompt's pairs and a decoding
    /// request's context are told apart, though they differ 20×.
    fn assert_table_back(trace: &Trace) {
        let ids: BTreeSet<u64> = (0..4).collect();
        let theta = step_start(std::iter::once((trace, &ids, 0.0)), 4).unwrap();
        for (d, want) in TABLE.iter().enumerate().skip(1) {
            let got = theta[3 + d];
            assert!(
                (got - want).abs() < 0.02 * want,
                "decode_{d}: {got} vs {want}"
            );
        }
        assert!((theta[8] - 2.0).abs() < 0.2, "prompt token {}", theta[8]);
        assert!(
            (theta[9] - CONTEXT).abs() < 0.2 * CONTEXT,
            "context token {}",
            theta[9]
        );
        assert!(
            (theta[10] - PAIR).abs() < 0.2 * PAIR,
            "prompt pair {}",
            theta[10]
        );
    }

    #[test]
    fn steps_recovered_from_token_times_give_the_table_back() {
        assert_table_back(&synthetic_server(|_, _, _| 0));
    }

    /// The same server on a busy host: in every other step, the tokens
    /// after the first reach the client 40% of a step late, far past the
    /// gap that separates steps from jitter; each step is still one step.
    #[test]
    fn a_step_whose_tokens_arrive_split_is_still_one_step() {
        assert_table_back(&synthetic_server(|k, j, step| {
            if k % 2 == 1 && j > 0 { step * 2 / 5 } else { 0 }
        }));
    }

    /// A server that sends two tokens per chunk shows no steps, and the
    /// fit says why.
    #[test]
    fn chunks_of_several_tokens_show_no_steps_and_say_so() {
        let mut trace = synthetic_server(|_, _, _| 0);
        assert!(no_steps_reason(std::iter::once(&trace)).contains("per-chunk companion"));
        for c in trace.chunks.as_mut().unwrap() {
            c.tokens = Some(2);
        }
        let ids: BTreeSet<u64> = (0..4).collect();
        assert!(step_start(std::iter::once((&trace, &ids, 0.0)), 4).is_none());
        let why = no_steps_reason(std::iter::once(&trace));
        assert!(why.contains("carry up to 2 tokens each"), "{why}");
    }
}
