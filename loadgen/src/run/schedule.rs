//! The run's plan: the workload as units in send order (held or generated),
//! this shard's part, and the facts about it the header and the summary need
//! (count, warm-up, requested rate, plan hash).

use crate::{CommandError, Result};
use blis_traces::step::StepContext;
use std::collections::BTreeMap;

use blis_traces::spec::ContextGrowth;
use blis_traces::{ExtraColumn, GenerateOptions, TraceHeader, TraceRecord, WorkloadSpec};

use crate::options::{RunOptions, Shard};
use crate::plan::{GeneratedWorkload, PlanError, Workload, plan_workload};

use super::send::{Unit, Units, units};

/// The plan of a run: its requests in send order and what the header and
/// the summary need to know of it.
pub(super) struct Plan {
    pub(super) header: TraceHeader,
    /// Its units in order of their first send.
    pub(super) units: PlannedUnits,
    /// Facts of the whole plan, gathered before the run.
    pub(super) facts: PlanFacts,
    pub(super) growth: BTreeMap<String, ContextGrowth>,
    pub(super) warmup: u64,
}

/// The units of a plan: generated as the run goes (a generated workload
/// without sessions, so that memory does not grow with the run's length),
/// or all held (sessions, whose later rounds must be at hand when the
/// earlier ones end; traces and imports, read whole).
pub(super) enum PlannedUnits {
    Generated(GeneratedWorkload),
    Held(Vec<Unit>),
}

impl PlannedUnits {
    /// The units, in order; those of `shard` only with one.
    pub(super) fn into_iter(self, shard: Option<Shard>) -> Units {
        let all = self.all_units();
        match shard {
            None => all,
            Some(s) => Box::new(
                all.enumerate()
                    .filter(move |(k, _)| s.has(*k))
                    .map(|(_, u)| u),
            ),
        }
    }

    /// Every unit, in order.
    pub(super) fn all_units(self) -> Units {
        match self {
            Self::Held(u) => Box::new(u.into_iter()),
            Self::Generated(g) => match g.records() {
                Ok(it) => Box::new(it.map_while(|r| match r {
                    Ok(r) => Some(vec![r]),
                    Err(e) => {
                        // The same generation succeeded when the plan was
                        // scanned; only a data file changed since can fail.
                        blis_traces::diag!("error: generating the workload again: {e}");
                        None
                    }
                })),
                Err(e) => {
                    blis_traces::diag!("error: generating the workload again: {e}");
                    Box::new(std::iter::empty())
                }
            },
        }
    }
}

/// What a run needs to know of its whole plan before it starts, gathered
/// in one pass over the planned requests (in arrival order).
#[derive(Debug)]
pub(super) struct PlanFacts {
    /// Planned requests.
    pub(super) count: u64,
    /// Their ids as ranges ([`blis_traces::header::id_ranges`]).
    pub(super) planned_ids: Option<String>,
    /// The trace's extra columns.
    pub(super) extras: Vec<ExtraColumn>,
    /// Whether any request streams.
    pub(super) any_streaming: bool,
    /// Whether any request belongs to a session.
    pub(super) any_session: bool,
    /// Requests with ids below this are warm-up.
    pub(super) warmup_below: u64,
    /// The planned rate (open loop): requests over the arrival span.
    pub(super) requested_rate: Option<f64>,
    /// Open loop, every request due at the same time (`--rate inf`, or a
    /// trace of one instant): sent at once, as `vllm bench serve`'s
    /// default rate, bounded only by `--max-in-flight`.
    pub(super) burst: bool,
    /// The whole plan's fingerprint ([`TraceHeader::plan_hash`]).
    pub(super) plan_hash: String,
}

impl PlanFacts {
    /// The facts of a plan given as `(unit, request)` in send order, for
    /// the part `shard` of it (all of it without one); the ids of the
    /// `warmup` smallest of the whole plan are warm-up.
    pub(super) fn gather<R: std::borrow::Borrow<TraceRecord>>(
        items: impl Iterator<Item = Result<(usize, R), blis_traces::Error>>,
        warmup: u64,
        closed_loop: bool,
        shard: Option<Shard>,
    ) -> Result<Self> {
        let mut ids: Vec<(u64, u64)> = Vec::new();
        let mut unsorted_ids: Vec<u64> = Vec::new();
        let mut count = 0u64;
        let (mut any_streaming, mut any_session) = (false, false);
        let (mut first, mut last) = (i64::MAX, i64::MIN);
        // One row showing each extra column, in order of appearance.
        let mut shown: Vec<ExtraColumn> = Vec::new();
        let mut showing: Vec<TraceRecord> = Vec::new();
        // The warmup + 1 smallest ids (a max-heap).
        let mut smallest: std::collections::BinaryHeap<u64> = std::collections::BinaryHeap::new();
        let mut hash = xxhash_rust::xxh3::Xxh3::new();
        let mut all = 0u64;
        for item in items {
            let (unit, r) = item
                .map_err(PlanError::Workload)
                .step(|| "planning the workload")?;
            let r: &TraceRecord = r.borrow();
            let id = r.request.request_id;
            all += 1;
            any_session |= !r.request.session_id.is_empty();
            hash_request(&mut hash, r);
            if warmup > 0 {
                if (smallest.len() as u64) <= warmup {
                    smallest.push(id);
                } else if smallest.peek().is_some_and(|&m| id < m) {
                    smallest.pop();
                    smallest.push(id);
                }
            }
            if shard.is_some_and(|s| !s.has(unit)) {
                continue;
            }
            count += 1;
            any_streaming |= r.request.streaming;
            first = first.min(r.request.arrival_time_us);
            last = last.max(r.request.arrival_time_us);
            match ids.last_mut() {
                Some(l) if id == l.1.wrapping_add(1) => l.1 = id,
                Some(l) if id <= l.1 => unsorted_ids.push(id),
                _ => ids.push((id, id)),
            }
            let new: Vec<ExtraColumn> = ExtraColumn::needed_for([r])
                .into_iter()
                .filter(|e| !shown.contains(e))
                .collect();
            if !new.is_empty() {
                shown.extend(new);
                showing.push(r.clone());
            }
        }
        if all == 0 {
            return Err(CommandError::Usage("the workload has no requests".into()));
        }
        if count == 0 {
            return Err(CommandError::Usage(format!(
                "--shard {}/{}: the workload's {all} requests leave this part none (fewer units than parts)",
                shard.map_or(0, |s| s.index),
                shard.map_or(1, |s| s.count)
            )));
        }
        hash.update(&all.to_le_bytes());
        let planned_ids = if unsorted_ids.is_empty() {
            blis_traces::header::format_id_ranges(&ids)
        } else {
            let mut all: Vec<u64> = ids.iter().flat_map(|&(a, b)| a..=b).collect();
            all.extend(unsorted_ids);
            all.sort_unstable();
            all.dedup();
            blis_traces::header::id_ranges(&all)
        };
        let warmup_below = if warmup == 0 {
            0
        } else if smallest.len() as u64 > warmup {
            smallest.peek().copied().unwrap_or(u64::MAX)
        } else {
            u64::MAX
        };
        let requested_rate = if closed_loop || count < 2 {
            None
        } else {
            let span = last - first;
            (span > 0).then(|| (count - 1) as f64 / (span as f64 / 1e6))
        };
        let burst = !closed_loop && count >= 2 && last == first;
        Ok(Self {
            count,
            planned_ids,
            extras: ExtraColumn::needed_for(&showing),
            any_streaming,
            any_session,
            warmup_below,
            requested_rate,
            burst,
            plan_hash: format!("{:016x}", hash.digest()),
        })
    }
}

/// Feeds what defines a planned request to the plan's hash.
pub(super) fn hash_request(h: &mut xxhash_rust::xxh3::Xxh3, r: &TraceRecord) {
    let q = &r.request;
    for x in [
        q.request_id,
        q.arrival_time_us as u64,
        u64::from(q.input_tokens),
        u64::from(q.output_tokens),
        u64::from(q.round_index),
        u64::from(q.prefix_length),
        u64::from(q.streaming),
        q.think_time_us.map_or(u64::MAX, |t| t as u64),
    ] {
        h.update(&x.to_le_bytes());
    }
    for t in [&*q.session_id, &*q.client_id, &*q.prefix_group] {
        h.update(&(t.len() as u64).to_le_bytes());
        h.update(t.as_bytes());
    }
}

/// The requests of held units as `(unit, request)`, for [`PlanFacts::gather`].
pub(super) fn indexed(
    units: &[Unit],
) -> impl Iterator<Item = Result<(usize, &TraceRecord), blis_traces::Error>> + '_ {
    units
        .iter()
        .enumerate()
        .flat_map(|(k, u)| u.iter().map(move |r| Ok((k, r))))
}

/// Phase 1: the workload, planned and sorted by send time.
pub(super) fn plan(args: &RunOptions) -> Result<Plan> {
    let closed_loop = args.concurrency.is_some();
    let opts = GenerateOptions {
        seed: args.seed,
        horizon_us: if closed_loop {
            None
        } else {
            args.duration_s.map(|s| (s * 1e6).round() as u64)
        },
        num_requests: args.num_requests,
        aggregate_rate: args.aggregate_rate,
    };
    let (header, workload) =
        plan_workload(&args.workload, &args.synthetic, &opts).step(|| "planning the workload")?;
    let warmup = if args.warmup_requests > 0 {
        args.warmup_requests
    } else {
        header.warm_up_requests
    };
    let shard = args.shard;
    let (facts, units) = match workload {
        Workload::Loaded(mut records) => {
            for r in &mut records {
                r.outcome = Default::default();
                r.other.clear();
            }
            records.sort_by_key(|r| (r.request.arrival_time_us, r.request.request_id));
            let units = units(records);
            let facts = PlanFacts::gather(indexed(&units), warmup, closed_loop, shard)?;
            (facts, PlannedUnits::Held(units))
        }
        Workload::Generated(g) => {
            let it = g.records().step(|| "planning the workload")?;
            let facts = PlanFacts::gather(
                it.enumerate().map(|(k, r)| r.map(|r| (k, r))),
                warmup,
                closed_loop,
                shard,
            )?;
            if facts.any_session {
                let records = g
                    .records()
                    .step(|| "planning the workload")?
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(PlanError::Workload)
                    .step(|| "planning the workload")?;
                let units = units(records);
                let facts = PlanFacts::gather(indexed(&units), warmup, closed_loop, shard)?;
                (facts, PlannedUnits::Held(units))
            } else {
                (facts, PlannedUnits::Generated(g))
            }
        }
    };
    let growth: BTreeMap<String, ContextGrowth> = match &args.workload.workload_spec {
        Some(p) => WorkloadSpec::from_file(p)?
            .clients
            .iter()
            .filter_map(|c| {
                let m = c.reasoning.as_ref()?.multi_turn?;
                Some((c.id.clone(), m.context_growth))
            })
            .collect(),
        None => BTreeMap::new(),
    };
    Ok(Plan {
        header,
        units,
        facts,
        growth,
        warmup,
    })
}

/// The schedule's origin, Unix µs: `start_at` (Unix s), which must lie
/// ahead within a day, or 0.2 s after `now_us`.
pub(super) fn start_time_us(start_at: Option<f64>, now_us: i64) -> Result<i64> {
    let Some(t) = start_at else {
        return Ok(now_us + 200_000);
    };
    let us = t * 1e6;
    let ahead_s = (us - now_us as f64) / 1e6;
    if !ahead_s.is_finite() || ahead_s > 86_400.0 {
        return Err(CommandError::Usage(format!(
            "--start-at {t}: more than a day ahead (a Unix time in seconds, e.g. $(( $(date +%s) + 10 )))"
        )));
    }
    if ahead_s < 0.05 {
        return Err(CommandError::Usage(format!(
            "--start-at {t}: {:.3} s in the past by this machine's clock (start the shards earlier, or check their clocks)",
            -ahead_s
        )));
    }
    Ok(us.round() as i64)
}
