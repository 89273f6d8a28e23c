//! `blis-loadgen merge`: the parts of a sharded run (`run --shard I/N`)
//! joined into one trace, as if one process had sent the whole plan.
//!
//! Each part's absolute times are re-based to true time by its machine's
//! measured clock offset (`shard.clock_offset_us`, 0 when unknown); each
//! row's intended send (`arrival_time_us`, relative to its part's start)
//! is re-based to the earliest part's start. Rows are joined by request
//! id (a repeated id is refused), sorted by intended send; streamed chunks
//! follow their rows; metric samples are kept per scrape source, labelled
//! `shard="I"`. Parts of different plans (`plan_hash`), of different part
//! counts, repeated or missing parts are refused.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use blis_traces::step::StepContext;
use blis_traces::{LoadGeneratorInfo, Trace, TraceRecord};

use crate::report::{SummaryInputs, summarize};
use crate::samples::CountedSamples;
use crate::{CommandError, Result};
use std::path::Path;

/// One part, read and checked.
struct Part {
    path: PathBuf,
    index: u32,
    count: u32,
    offset_us: i64,
    trace: Trace,
}

/// Reads `path` as a part of a sharded run.
fn read_part(path: &std::path::Path) -> Result<Part> {
    let trace = Trace::read(path).step(|| format!("reading the part {}", path.display()))?;
    let h = &trace.header;
    let Some(shard) = &h.shard else {
        return Err(CommandError::Usage(format!(
            "{}: not a part of a sharded run (its header has no `shard`; record parts with blis-loadgen run --shard I/N)",
            path.display()
        )));
    };
    if h.plan_hash.is_none() {
        return Err(CommandError::Usage(format!(
            "{}: its header has no plan_hash, so its plan cannot be matched with the other parts'",
            path.display()
        )));
    }
    if h.run_start_unix_us
        .is_none_or(|t| t.unsigned_abs() > 1 << 53)
    {
        return Err(CommandError::Usage(format!(
            "{}: its header has no run_start_unix_us within ±2^53 µs",
            path.display()
        )));
    }
    if shard.count == 0 || shard.index >= shard.count {
        return Err(CommandError::Usage(format!(
            "{}: shard {}/{} is not a part (0 <= index < count)",
            path.display(),
            shard.index,
            shard.count
        )));
    }
    // Times in a trace are within ±2^53 µs (the reader checks); an offset
    // of more than a day is a broken clock, not one to correct for.
    if let Some(o) = shard.clock_offset_us
        && o.unsigned_abs() > 86_400_000_000
    {
        return Err(CommandError::Usage(format!(
            "{}: shard.clock_offset_us {o} is more than a day: its clock cannot be re-based",
            path.display()
        )));
    }
    if h.incomplete {
        blis_traces::diag!(
            "warning: {} was cut off (its writer did not finish): merged as far as it got; blis-loadgen check on the merged trace lists what is missing",
            path.display()
        );
    }
    Ok(Part {
        path: path.to_path_buf(),
        index: shard.index,
        count: shard.count,
        offset_us: shard.clock_offset_us.unwrap_or(0),
        trace,
    })
}

/// Refuses parts that are not exactly the parts 0..N of one plan.
fn check_parts(parts: &[Part]) -> Result<()> {
    let first = &parts[0];
    let hash = first.trace.header.plan_hash.as_deref().unwrap_or_default();
    let mut seen: BTreeMap<u32, &PathBuf> = BTreeMap::new();
    for p in parts {
        let h = p.trace.header.plan_hash.as_deref().unwrap_or_default();
        if h != hash {
            return Err(CommandError::Usage(format!(
                "{} has plan {h} but {} has plan {hash}: parts of different plans (same workload, seed and flags give the same plan)",
                p.path.display(),
                first.path.display()
            )));
        }
        if p.count != first.count {
            return Err(CommandError::Usage(format!(
                "{} is part {}/{} but {} is part {}/{}: different part counts",
                p.path.display(),
                p.index,
                p.count,
                first.path.display(),
                first.index,
                first.count
            )));
        }
        if let Some(other) = seen.insert(p.index, &p.path) {
            return Err(CommandError::Usage(format!(
                "{} and {} are both part {}/{}",
                other.display(),
                p.path.display(),
                p.index,
                p.count
            )));
        }
    }
    let missing: Vec<String> = (0..first.count)
        .filter(|i| !seen.contains_key(i))
        .map(|i| format!("{i}/{}", first.count))
        .collect();
    if !missing.is_empty() {
        return Err(CommandError::Usage(format!(
            "parts {} are missing: give all {} parts",
            missing.join(", "),
            first.count
        )));
    }
    Ok(())
}

/// Shifts every absolute time of `r` by `-offset` and its intended send
/// by `shift`.
fn rebase(r: &mut TraceRecord, offset: i64, shift: i64) {
    r.request.arrival_time_us += shift;
    let o = &mut r.outcome;
    for t in [
        &mut o.send_time_us,
        &mut o.first_chunk_time_us,
        &mut o.last_chunk_time_us,
    ]
    .into_iter()
    .flatten()
    {
        *t -= offset;
    }
}

/// `blis-loadgen merge`: merges the traces of a sharded run's `parts`
/// (their header YAMLs or prefixes), writes the merged trace at the prefix
/// `merged` and prints what it holds.
///
/// # Errors
/// An unreadable part, parts that are not the parts of one plan, a request
/// id in two parts, an unwritable output.
pub fn merge_command(parts: &[PathBuf], merged: &Path, out: &mut dyn Write) -> Result<i32> {
    let mut parts = parts
        .iter()
        .map(|p| read_part(p))
        .collect::<Result<Vec<Part>>>()?;
    check_parts(&parts)?;
    parts.sort_by_key(|p| p.index);
    // Every part's start in true time; the merged run starts at the first.
    let starts: Vec<i64> = parts
        .iter()
        .map(|p| p.trace.header.run_start_unix_us.unwrap_or(0) - p.offset_us)
        .collect();
    let start = starts.iter().copied().min().unwrap_or(0);
    let mut header = parts[0].trace.header.clone();
    header.shard = None;
    header.incomplete = false;
    header.run_start_unix_us = Some(start);
    header.planned_requests = Some(
        parts
            .iter()
            .map(|p| p.trace.header.planned_requests.unwrap_or(0))
            .sum(),
    );
    let mut records: Vec<TraceRecord> = Vec::new();
    let mut chunks = Vec::new();
    let mut metrics = Vec::new();
    let (mut any_chunks, mut any_metrics) = (false, false);
    let mut owner: BTreeMap<u64, u32> = BTreeMap::new();
    for (p, &part_start) in parts.iter_mut().zip(&starts) {
        let shift = part_start - start;
        for mut r in std::mem::take(&mut p.trace.records) {
            if let Some(other) = owner.insert(r.request.request_id, p.index) {
                return Err(CommandError::Usage(format!(
                    "request id {} is in part {other} and in part {} ({}): not parts of one plan",
                    r.request.request_id,
                    p.index,
                    p.path.display()
                )));
            }
            rebase(&mut r, p.offset_us, shift);
            records.push(r);
        }
        if let Some(c) = p.trace.chunks.take() {
            any_chunks = true;
            chunks.extend(c.into_iter().map(|mut c| {
                c.timestamp_us -= p.offset_us;
                c
            }));
        }
        if let Some(m) = p.trace.metrics.take() {
            any_metrics = true;
            let label = format!("shard=\"{}\"", p.index);
            metrics.extend(m.into_iter().map(|mut m| {
                m.timestamp_us -= p.offset_us;
                m.labels = if m.labels.is_empty() {
                    label.clone()
                } else {
                    format!("{label},{}", m.labels)
                };
                m
            }));
        }
    }
    records.sort_by_key(|r| (r.request.arrival_time_us, r.request.request_id));
    let order: BTreeMap<u64, usize> = records
        .iter()
        .enumerate()
        .map(|(i, r)| (r.request.request_id, i))
        .collect();
    chunks.sort_by_key(|c| (order.get(&c.request_id).copied(), c.chunk_index));
    metrics.sort_by_key(|m| m.timestamp_us);
    let ids: Vec<u64> = owner.keys().copied().collect();
    header.planned_ids = merged_planned_ids(&parts).or_else(|| {
        (header.planned_requests == Some(ids.len() as u64))
            .then(|| blis_traces::header::id_ranges(&ids))
            .flatten()
    });
    header.load_generator = merged_load_generator(&parts, &records, start);
    let trace = Trace {
        header,
        records,
        chunks: any_chunks.then_some(chunks),
        metrics: any_metrics.then_some(metrics),
        absent_columns: Vec::new(),
    };
    let paths = trace
        .write(merged)
        .step(|| format!("writing the merged trace at {}", merged.display()))?;
    writeln!(
        out,
        "merged {} parts of plan {} into {}: {} requests{}{}",
        parts.len(),
        trace.header.plan_hash.as_deref().unwrap_or_default(),
        paths.header.display(),
        trace.records.len(),
        if any_chunks { ", per-chunk times" } else { "" },
        if any_metrics {
            ", metrics per part (label shard)"
        } else {
            ""
        }
    )?;
    let offsets: Vec<String> = parts
        .iter()
        .map(|p| {
            let s = p.trace.header.shard.as_ref();
            match s.and_then(|s| s.clock_offset_us) {
                Some(o) => format!("{}: {o} µs", p.index),
                None => format!(
                    "{}: unknown ({})",
                    p.index,
                    s.and_then(|s| s.clock_source.clone()).unwrap_or_default()
                ),
            }
        })
        .collect();
    writeln!(out, "clock offsets: {}", offsets.join("; "))?;
    Ok(crate::exit_code::OK)
}

/// The union of the parts' planned ids, as ranges (merged as ranges,
/// never expanded); `None` when a part does not list them or they take
/// too many ranges.
fn merged_planned_ids(parts: &[Part]) -> Option<String> {
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    for p in parts {
        ranges.extend(blis_traces::header::parse_id_ranges(
            p.trace.header.planned_ids.as_deref()?,
        )?);
    }
    ranges.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::new();
    for (a, b) in ranges {
        match merged.last_mut() {
            Some(l) if a <= l.1.saturating_add(1) => l.1 = l.1.max(b),
            _ => merged.push((a, b)),
        }
    }
    blis_traces::header::format_id_ranges(&merged)
}

/// The merged run's schedule figures, from its rows (as one process's run
/// summary would give them); client-bound when any part was.
fn merged_load_generator(
    parts: &[Part],
    records: &[TraceRecord],
    start: i64,
) -> Option<LoadGeneratorInfo> {
    let first = parts[0].trace.header.load_generator.clone()?;
    let s = summarize(
        records,
        &CountedSamples::default(),
        &SummaryInputs {
            run_start_unix_us: start,
            max_send_lag_ms: f64::INFINITY,
            ..SummaryInputs::default()
        },
    );
    let (lo, hi) = records.iter().fold((i64::MAX, i64::MIN), |(lo, hi), r| {
        (
            lo.min(r.request.arrival_time_us),
            hi.max(r.request.arrival_time_us),
        )
    });
    let requested_rate = first.requested_rate.and_then(|_| {
        (records.len() >= 2 && hi > lo)
            .then(|| (records.len() - 1) as f64 / ((hi - lo) as f64 / 1e6))
    });
    Some(LoadGeneratorInfo {
        requested_rate,
        achieved_rate: s.schedule.achieved_rate,
        send_lag_p50_ms: s.schedule.send_lag_p50_ms,
        send_lag_p99_ms: s.schedule.send_lag_p99_ms,
        client_bound: Some(parts.iter().any(|p| {
            p.trace
                .header
                .load_generator
                .as_ref()
                .and_then(|l| l.client_bound)
                .unwrap_or(false)
        })),
        timeout_s: first.timeout_s,
    })
}
