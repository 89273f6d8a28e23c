//! What a recorded trace holds against what its run planned: the reader's
//! report behind `blis-loadgen check PREFIX`, for a run that was killed or
//! interrupted (see [`crate::TraceHeader::incomplete`]).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::bundle::Trace;
use crate::error::Result;
use crate::header::parse_id_ranges;

/// A trace checked against its plan.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CheckReport {
    /// Whether its writer finished (the header is complete).
    pub finished: bool,
    /// Requests planned (`planned_requests`), when the header says.
    pub planned: Option<u64>,
    /// Request rows read.
    pub rows: u64,
    /// Rows by status (`ok`, `error`, `timeout`, `cancelled`; `planned`
    /// for a row with none).
    pub by_status: BTreeMap<String, u64>,
    /// Planned requests with no row, when the plan's ids are known
    /// (`planned_ids`): as inclusive id ranges.
    pub missing: Option<Vec<(u64, u64)>>,
    /// How many planned requests have no row (known ids, or the count
    /// planned minus the distinct ids read).
    pub missing_count: Option<u64>,
    /// Ids with more than one row.
    pub duplicate_ids: u64,
    /// Rows whose id the plan does not have (known ids only).
    pub unplanned_ids: u64,
    /// Chunk rows of requests with no request row (written after it, by a
    /// run killed between the two).
    pub orphan_chunks: u64,
}

impl CheckReport {
    /// Whether nothing is missing: finished, every planned request has a
    /// row, no id twice.
    pub fn is_complete(&self) -> bool {
        self.finished
            && self.missing_count.unwrap_or(0) == 0
            && self.duplicate_ids == 0
            && self.unplanned_ids == 0
    }
}

/// Reads the bundle of `header_path` (as [`Trace::read`]: a cut-off one up
/// to its last complete line) and compares its rows with its plan.
///
/// # Errors
/// As [`Trace::read`]; a malformed `planned_ids`.
pub fn check(header_path: &Path) -> Result<CheckReport> {
    let trace = Trace::read(header_path)?;
    let h = &trace.header;
    let mut by_status = BTreeMap::new();
    let mut seen = BTreeSet::new();
    let mut duplicate_ids = 0;
    for r in &trace.records {
        let status = r
            .outcome
            .status
            .map_or_else(|| "planned".to_string(), |s| s.to_string());
        *by_status.entry(status).or_insert(0) += 1;
        if !seen.insert(r.request.request_id) {
            duplicate_ids += 1;
        }
    }
    let ranges = match &h.planned_ids {
        Some(s) => Some(parse_id_ranges(s).ok_or_else(|| {
            crate::Error::in_file(
                header_path,
                format!("planned_ids: malformed id ranges {s:?} (expected e.g. 0-2999,4000)"),
            )
        })?),
        None => None,
    };
    let (missing, missing_count, unplanned_ids) = match &ranges {
        Some(ranges) => {
            let mut missing = Vec::new();
            let mut count = 0u64;
            for &(a, b) in ranges {
                // The ids of [a, b] not seen, as ranges.
                let mut next = a;
                for &id in seen.range(a..=b) {
                    if id > next {
                        missing.push((next, id - 1));
                        count += id - next;
                    }
                    next = id + 1;
                }
                if next <= b {
                    missing.push((next, b));
                    count += b - next + 1;
                }
            }
            let planned = |id: u64| ranges.iter().any(|&(a, b)| (a..=b).contains(&id));
            let unplanned = seen.iter().filter(|&&id| !planned(id)).count() as u64;
            (Some(missing), Some(count), unplanned)
        }
        None => (
            None,
            h.planned_requests
                .map(|p| p.saturating_sub(seen.len() as u64)),
            0,
        ),
    };
    let orphan_chunks = trace.chunks.as_ref().map_or(0, |c| {
        c.iter().filter(|c| !seen.contains(&c.request_id)).count() as u64
    });
    Ok(CheckReport {
        finished: !h.incomplete,
        planned: h.planned_requests,
        rows: trace.records.len() as u64,
        by_status,
        missing,
        missing_count,
        duplicate_ids,
        unplanned_ids,
        orphan_chunks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::header::id_ranges;

    #[test]
    fn id_ranges_round_trip() {
        let ids = [0, 1, 2, 5, 7, 8, 9];
        let s = id_ranges(&ids).unwrap();
        assert_eq!(s, "0-2,5,7-9");
        assert_eq!(parse_id_ranges(&s).unwrap(), vec![(0, 2), (5, 5), (7, 9)]);
        assert!(parse_id_ranges("3-1").is_none());
        assert!(parse_id_ranges("a").is_none());
        let sparse: Vec<u64> = (0..200).map(|i| i * 2).collect();
        assert!(id_ranges(&sparse).is_none());
    }
}
