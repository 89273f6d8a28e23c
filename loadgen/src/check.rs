//! `blis-loadgen check`: what a recorded trace holds against what its run
//! planned ([`blis_traces::check`]), printed for a person or as JSON.

use std::io::Write;

use crate::{Result, exit_code};
use std::path::Path;

/// `blis-loadgen check`: the trace against its plan; exit code 0 when
/// complete, [`exit_code::INCOMPLETE`] otherwise.
///
/// # Errors
/// The trace cannot be read.
pub fn check_command(trace: &Path, json: bool, out: &mut dyn Write) -> Result<i32> {
    let r = blis_traces::check::check(trace)?;
    if json {
        serde_json::to_writer_pretty(&mut *out, &r)?;
        writeln!(out)?;
    } else {
        let state = if r.finished {
            "finished"
        } else {
            "cut off: its writer did not finish (killed, or still running)"
        };
        writeln!(out, "trace {}: {state}", trace.display())?;
        let statuses: Vec<String> = r
            .by_status
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        let planned = r.planned.map_or_else(
            || "plan unknown".to_string(),
            |p| format!("planned {p} requests"),
        );
        writeln!(out, "{planned}; {} rows ({})", r.rows, statuses.join(", "))?;
        match (&r.missing, r.missing_count) {
            (Some(m), Some(n)) if n > 0 => {
                let shown: Vec<String> = m
                    .iter()
                    .take(20)
                    .map(|&(a, b)| {
                        if a == b {
                            a.to_string()
                        } else {
                            format!("{a}-{b}")
                        }
                    })
                    .collect();
                let more = if m.len() > 20 { ", …" } else { "" };
                writeln!(
                    out,
                    "missing {n} planned requests: ids {}{more}",
                    shown.join(",")
                )?;
            }
            (None, Some(n)) if n > 0 => writeln!(
                out,
                "missing {n} planned requests (their ids are not in the header)"
            )?,
            _ => {}
        }
        if r.duplicate_ids > 0 {
            writeln!(out, "{} ids have more than one row", r.duplicate_ids)?;
        }
        if r.unplanned_ids > 0 {
            writeln!(
                out,
                "{} rows have ids the plan does not have",
                r.unplanned_ids
            )?;
        }
        if r.orphan_chunks > 0 {
            writeln!(
                out,
                "{} chunk rows belong to requests with no row (written after it before the kill)",
                r.orphan_chunks
            )?;
        }
        writeln!(
            out,
            "{}",
            if r.is_complete() {
                "complete"
            } else {
                "incomplete"
            }
        )?;
    }
    Ok(if r.is_complete() {
        exit_code::OK
    } else {
        exit_code::INCOMPLETE
    })
}
