//! `blis-replay compare`: several runs side by side (policies, cluster
//! sizes, latency models), one row per figure, the best of each row
//! marked. It reads the runs' `PREFIX.summary.json`, so it compares any
//! runs of `blis-replay run`, whatever produced them; or it runs policy
//! bundles (`--policies`) on one workload itself.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::commands::cli::{CompareArgs, RunArgs};
use crate::commands::{CommandError, Result};

/// Which way a row is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Better {
    Lower,
    Higher,
}

/// One row of the table: its label, how to read it from a summary, which
/// way is better, and the decimals shown.
struct Row {
    label: &'static str,
    read: fn(&Value) -> Option<f64>,
    better: Better,
    decimals: usize,
}

fn at(v: &Value, path: &[&str]) -> Option<f64> {
    path.iter().try_fold(v, |v, k| v.get(k))?.as_f64()
}

/// Requests routed to the busiest instance over the mean (1: even).
fn busiest_over_mean(v: &Value) -> Option<f64> {
    let routed: Vec<f64> = v
        .get("cluster")?
        .get("instances")?
        .as_array()?
        .iter()
        .filter_map(|i| i.get("routed")?.as_f64())
        .collect();
    let mean = routed.iter().sum::<f64>() / routed.len().max(1) as f64;
    (routed.len() > 1 && mean > 0.0).then(|| routed.iter().copied().fold(0.0, f64::max) / mean)
}

/// Replica-seconds: an autoscaler's billed ones, else instances × the
/// run's duration.
fn replica_seconds(v: &Value) -> Option<f64> {
    if let Some(rs) = at(v, &["cluster", "autoscale", "replica_seconds"]) {
        return Some(rs);
    }
    let n = at(v, &["cluster", "num_instances"]).unwrap_or(1.0);
    Some(n * at(v, &["throughput", "duration_s"])?)
}

const ROWS: &[Row] = &[
    Row {
        label: "completed requests",
        read: |v| at(v, &["requests", "completed"]),
        better: Better::Higher,
        decimals: 0,
    },
    Row {
        label: "TTFT p50 (ms)",
        read: |v| at(v, &["ttft_ms", "p50"]),
        better: Better::Lower,
        decimals: 2,
    },
    Row {
        label: "TTFT p99 (ms)",
        read: |v| at(v, &["ttft_ms", "p99"]),
        better: Better::Lower,
        decimals: 2,
    },
    Row {
        label: "E2E p50 (ms)",
        read: |v| at(v, &["e2e_ms", "p50"]),
        better: Better::Lower,
        decimals: 1,
    },
    Row {
        label: "E2E p99 (ms)",
        read: |v| at(v, &["e2e_ms", "p99"]),
        better: Better::Lower,
        decimals: 1,
    },
    Row {
        label: "ITL p50 (ms)",
        read: |v| at(v, &["itl_ms", "p50"]),
        better: Better::Lower,
        decimals: 2,
    },
    Row {
        label: "throughput (req/s)",
        read: |v| at(v, &["throughput", "requests_per_s"]),
        better: Better::Higher,
        decimals: 2,
    },
    Row {
        label: "output tokens/s",
        read: |v| at(v, &["throughput", "output_tokens_per_s"]),
        better: Better::Higher,
        decimals: 1,
    },
    Row {
        label: "SLO attainment (%)",
        read: |v| at(v, &["slo", "attainment"]).map(|x| 100.0 * x),
        better: Better::Higher,
        decimals: 1,
    },
    Row {
        label: "goodput (req/s)",
        read: |v| at(v, &["slo", "goodput_per_s"]),
        better: Better::Higher,
        decimals: 2,
    },
    Row {
        label: "prefix-cache hit rate (%)",
        read: |v| at(v, &["prefix_cache", "hit_rate"]).map(|x| 100.0 * x),
        better: Better::Higher,
        decimals: 1,
    },
    Row {
        label: "preemptions",
        read: |v| at(v, &["preemptions"]),
        better: Better::Lower,
        decimals: 0,
    },
    Row {
        label: "busiest instance / mean (routed)",
        read: busiest_over_mean,
        better: Better::Lower,
        decimals: 2,
    },
    Row {
        label: "cost (replica-seconds)",
        read: replica_seconds,
        better: Better::Lower,
        decimals: 0,
    },
];

/// What a figure the table reads may be.
#[derive(Debug, Clone, Copy)]
enum Kind {
    /// A whole number of things (requests, preemptions, instances).
    Count,
    /// A latency, a rate or a duration: finite and not negative.
    Amount,
    /// A fraction in [0, 1] (a hit rate, an attainment).
    Fraction,
}

/// The summary fields the table reads, by their JSON path.
const FIGURES: &[(&[&str], Kind)] = &[
    (&["requests", "completed"], Kind::Count),
    (&["ttft_ms", "p50"], Kind::Amount),
    (&["ttft_ms", "p99"], Kind::Amount),
    (&["e2e_ms", "p50"], Kind::Amount),
    (&["e2e_ms", "p99"], Kind::Amount),
    (&["itl_ms", "p50"], Kind::Amount),
    (&["throughput", "requests_per_s"], Kind::Amount),
    (&["throughput", "output_tokens_per_s"], Kind::Amount),
    (&["throughput", "duration_s"], Kind::Amount),
    (&["slo", "attainment"], Kind::Fraction),
    (&["slo", "goodput_per_s"], Kind::Amount),
    (&["prefix_cache", "hit_rate"], Kind::Fraction),
    (&["preemptions"], Kind::Count),
    (&["cluster", "num_instances"], Kind::Count),
    (&["cluster", "autoscale", "replica_seconds"], Kind::Amount),
];

/// The largest figure taken (2^53, where an `f64` still counts by ones):
/// past it a summary was not written by a run.
const MAX_FIGURE: f64 = 9_007_199_254_740_992.0;

/// Checks one figure of a summary: absent or `null` is "no such figure";
/// anything else must be a number of its kind.
fn check_figure(name: &str, v: Option<&Value>, kind: Kind) -> std::result::Result<(), String> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(());
    };
    let Some(x) = v.as_f64() else {
        // (Shown cut short: the value may be a whole document.)
        let mut shown = v.to_string();
        if shown.len() > 40 {
            let cut = (0..=40).rev().find(|&i| shown.is_char_boundary(i));
            shown.truncate(cut.unwrap_or(0));
            shown.push('…');
        }
        return Err(format!(
            "{name} is {shown}, not a number (a corrupt or edited summary?)"
        ));
    };
    let ok = match kind {
        Kind::Count => (0.0..=MAX_FIGURE).contains(&x) && x.fract() == 0.0,
        Kind::Amount => (0.0..=MAX_FIGURE).contains(&x),
        Kind::Fraction => (0.0..=1.0).contains(&x),
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{name} is {x:e}, which no run has: {} (a corrupt or edited summary?)",
            match kind {
                Kind::Count => "a count is a whole number from 0 to 2^53",
                Kind::Amount => "a latency, rate or duration is from 0 to 2^53",
                Kind::Fraction => "a fraction is from 0 to 1",
            }
        ))
    }
}

/// Checks every figure the table reads from a summary read from a file,
/// so that a corrupt or hand-edited one is named rather than ranked (a
/// negative latency would be marked the best of its row).
fn check_figures(v: &Value) -> std::result::Result<(), String> {
    for (path, kind) in FIGURES {
        let mut at = Some(v);
        for k in *path {
            at = at.and_then(|o| o.get(k));
        }
        check_figure(&path.join("."), at, *kind)?;
    }
    if let Some(instances) = v.get("cluster").and_then(|c| c.get("instances")) {
        let Some(list) = instances.as_array() else {
            return Err(format!("cluster.instances is {instances}, not a list"));
        };
        for (i, inst) in list.iter().enumerate() {
            check_figure(
                &format!("cluster.instances[{i}].routed"),
                inst.get("routed"),
                Kind::Count,
            )?;
        }
    }
    Ok(())
}

fn summary_path(run: &Path) -> PathBuf {
    if run.extension().is_some_and(|e| e == "json") {
        run.to_path_buf()
    } else {
        let mut p = run.as_os_str().to_owned();
        p.push(".summary.json");
        PathBuf::from(p)
    }
}

fn default_name(run: &Path) -> String {
    let name = run
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    name.strip_suffix(".summary.json")
        .unwrap_or(&name)
        .to_string()
}

/// `blis-replay compare`: the table of the runs' figures.
///
/// # Errors
/// An unreadable or malformed summary (named), or names that do not match
/// the runs.
pub fn compare(args: &CompareArgs, out: &mut dyn std::io::Write) -> Result<()> {
    let count = args.runs.len() + args.policies.len();
    if !args.runs.is_empty() && !args.policies.is_empty() {
        return Err(CommandError::Usage(
            "give runs to compare or --policies to run, not both".into(),
        ));
    }
    if count < 2 {
        return Err(CommandError::Usage(
            "give two runs or more (their PREFIX or PREFIX.summary.json), or --policies A.yaml,B.yaml with a workload".into(),
        ));
    }
    if !args.names.is_empty() && args.names.len() != count {
        return Err(CommandError::Usage(format!(
            "--names: {} names for {count} runs",
            args.names.len(),
        )));
    }
    if !args.policies.is_empty() {
        let mut summaries = Vec::new();
        for p in &args.policies {
            summaries.push(run_policy(&args.run, p)?);
        }
        let names: Vec<String> = if args.names.is_empty() {
            args.policies
                .iter()
                .map(|p| {
                    p.file_stem()
                        .map_or_else(String::new, |s| s.to_string_lossy().into_owned())
                })
                .collect()
        } else {
            args.names.clone()
        };
        return render(&names, &summaries, args.run.json, out);
    }
    let mut summaries = Vec::new();
    for run in &args.runs {
        let path = summary_path(run);
        let text = blis_traces::text::read_text(&path).map_err(|e| {
            CommandError::Usage(format!(
                "{}: {e} (give a run's PREFIX.summary.json or its PREFIX)",
                path.display()
            ))
        })?;
        let v: Value = serde_json::from_str(&text).map_err(|e| {
            CommandError::Usage(format!("{}: not a run summary: {e}", path.display()))
        })?;
        if !v.get("requests").is_some_and(Value::is_object)
            || !v.get("throughput").is_some_and(Value::is_object)
        {
            return Err(CommandError::Usage(format!(
                "{}: not a blis-replay run summary (no requests or throughput)",
                path.display()
            )));
        }
        check_figures(&v).map_err(|e| CommandError::Usage(format!("{}: {e}", path.display())))?;
        summaries.push(v);
    }
    let names: Vec<String> = if args.names.is_empty() {
        args.runs.iter().map(|r| default_name(r)).collect()
    } else {
        args.names.clone()
    };
    render(&names, &summaries, args.run.json, out)
}

/// Replays the workload of `run` under the policy bundle `policy`, in
/// memory; its summary as JSON.
fn run_policy(run: &RunArgs, policy: &Path) -> Result<Value> {
    let mut run = run.clone();
    run.cluster.policy_config = Some(policy.to_path_buf());
    let bundle = run.cluster.bundle()?;
    let sample = (run.sample_interval_ms > 0).then(|| run.sample_interval_ms as i64 * 1000);
    let workload = crate::commands::run::load_workload(&run)?;
    let summary = crate::commands::run::replay_in_memory(&run, &bundle, sample, workload)?;
    Ok(serde_json::to_value(&summary)?)
}

/// Prints the table of `summaries` under `names` (Markdown, or JSON).
fn render(
    names: &[String],
    summaries: &[Value],
    json: bool,
    out: &mut dyn std::io::Write,
) -> Result<()> {
    // Rows that some run has, with each run's value and the best ones.
    let mut table = Vec::new();
    for row in ROWS {
        let values: Vec<Option<f64>> = summaries.iter().map(|s| (row.read)(s)).collect();
        let present: Vec<f64> = values.iter().flatten().copied().collect();
        if present.is_empty() {
            continue;
        }
        let best = match row.better {
            Better::Lower => present.iter().copied().fold(f64::INFINITY, f64::min),
            Better::Higher => present.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        };
        let all_equal = present.iter().all(|&x| x == best);
        table.push((row, values, best, all_equal));
    }
    if json {
        let rows: Vec<Value> = table
            .iter()
            .map(|(row, values, best, all_equal)| {
                serde_json::json!({
                    "figure": row.label,
                    "better": if row.better == Better::Lower { "lower" } else { "higher" },
                    "values": names.iter().zip(values).map(|(n, v)| (n.clone(), serde_json::json!(v))).collect::<serde_json::Map<_, _>>(),
                    "best": if *all_equal { Vec::new() } else {
                        names.iter().zip(values).filter(|(_, v)| **v == Some(*best)).map(|(n, _)| n.clone()).collect::<Vec<_>>()
                    },
                })
            })
            .collect();
        writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "runs": names, "rows": rows }))?
        )?;
        return Ok(());
    }
    let mut o = String::new();
    let _ = write!(o, "| |");
    for n in names {
        let _ = write!(o, " {n} |");
    }
    let _ = write!(o, "\n|---|");
    for _ in names {
        let _ = write!(o, "---:|");
    }
    o.push('\n');
    for (row, values, best, all_equal) in &table {
        let _ = write!(
            o,
            "| {} ({}) |",
            row.label,
            if row.better == Better::Lower {
                "lower is better"
            } else {
                "higher is better"
            }
        );
        for v in values {
            match v {
                Some(x) if !all_equal && *x == *best => {
                    let _ = write!(o, " **{x:.prec$}** ★ |", prec = row.decimals);
                }
                Some(x) => {
                    let _ = write!(o, " {x:.prec$} |", prec = row.decimals);
                }
                None => o.push_str(" — |"),
            }
        }
        o.push('\n');
    }
    let _ = writeln!(
        o,
        "\n★ the best of the row (none when all are equal); — the run has no such figure."
    );
    write!(out, "{o}")?;
    Ok(())
}
