use blis_calibrate::compare::{CompareOptions, compare};
use serde_json::Value;

use crate::common::{MODEL, calibrate, replayed, spec};

/// Acceptance 1: a trace compared with itself has no error at all.
#[test]
fn a_trace_compared_with_itself_is_perfect() {
    let dir = tempfile::tempdir().unwrap();
    let w = spec(dir.path(), 8.0, 400);
    let (_, t) = replayed(dir.path(), "a", &w, &[]);
    let c = compare(
        &t,
        "a",
        &t,
        "a",
        &CompareOptions {
            resamples: 200,
            ..CompareOptions::default()
        },
    );
    let r = &c.report;
    assert_eq!(r.matching.paired, 400);
    for name in ["ttft", "e2e", "tpot", "itl"] {
        let m = r
            .metrics
            .get(name)
            .unwrap_or_else(|| panic!("{name} compared"));
        assert_eq!(m.real, m.sim, "{name}");
        for (k, e) in &m.errors {
            assert_eq!(e.signed_ms, 0.0, "{name} {k}");
            assert_eq!(e.relative, 0.0, "{name} {k}");
        }
        assert_eq!((m.mape, m.mpe, m.pearson_r), (0.0, 0.0, 1.0), "{name}");
        assert_eq!((m.ks_d, m.ks_p, m.wasserstein), (0.0, 1.0, 0.0), "{name}");
        assert_eq!(m.grade, "excellent", "{name}");
        assert!(m.qq.iter().all(|p| p[0] == p[1]));
    }
    let e2e = &r.metrics["e2e"];
    assert_eq!(e2e.mape_ci95, Some([0.0, 0.0]));
    assert_eq!(e2e.pearson_r_ci95, Some([1.0, 1.0]));
    let ts = r.timeseries.as_ref().expect("both sides have time series");
    for a in &ts.series {
        assert_eq!(a.mae, 0.0, "{}", a.series);
    }
    assert!(r.saturation.agree);
    assert_eq!(r.groups["slo_class"].len(), 2);
}

/// A trace with a request id on two rows (merged from overlapping shards)
/// is compared on the last row of each id, and the report says how many
/// rows repeated an id on each side.
#[test]
fn rows_repeating_a_request_id_are_counted_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let w = spec(dir.path(), 8.0, 50);
    let (_, t) = replayed(dir.path(), "a", &w, &[]);
    let mut doubled = t.clone();
    doubled.records.push(t.records[3].clone());
    doubled.records.push(t.records[7].clone());
    let c = compare(
        &doubled,
        "real",
        &t,
        "sim",
        &CompareOptions {
            resamples: 50,
            ..CompareOptions::default()
        },
    );
    assert_eq!(c.report.matching.duplicate_rows, (2, 0));
    assert_eq!(c.report.matching.paired, 50);
    let md = c.report.to_markdown();
    assert!(
        md.contains("warning: rows repeating a request id: real 2, sim 0"),
        "{md}"
    );
    let html = blis_calibrate::html::render(&c).unwrap();
    assert!(html.contains("Rows repeating a request id: real 2, sim 0;"));
}

/// A completed row whose first chunk comes before its send or after its
/// last chunk (a recorder's clock at fault) is not compared: its TTFT
/// would be negative. The report counts such rows per side.
#[test]
fn rows_with_times_out_of_order_are_left_out_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let w = spec(dir.path(), 8.0, 50);
    let (_, t) = replayed(dir.path(), "a", &w, &[]);
    let mut bad = t.clone();
    let o = &mut bad.records[3].outcome;
    o.first_chunk_time_us = Some(o.send_time_us.unwrap() - 1_000);
    let o = &mut bad.records[9].outcome;
    o.last_chunk_time_us = Some(o.first_chunk_time_us.unwrap() - 1);
    let c = compare(
        &bad,
        "real",
        &t,
        "sim",
        &CompareOptions {
            resamples: 50,
            ..CompareOptions::default()
        },
    );
    let m = &c.report.matching;
    assert_eq!((m.out_of_order, m.paired), ((2, 0), 48));
    assert_eq!(c.report.metrics["ttft"].n, 48);
    let md = c.report.to_markdown();
    assert!(
        md.contains("warning: completed rows with times out of order (a first chunk before the send or after the last chunk): real 2, sim 0"),
        "{md}"
    );
    let html = blis_calibrate::html::render(&c).unwrap();
    assert!(
        html.contains("Completed rows with times out of order (a first chunk before the send or after the last chunk): real 2, sim 0;"),
        "the HTML report says it too"
    );
    let ok = compare(&t, "real", &t, "sim", &CompareOptions::default());
    let html = blis_calibrate::html::render(&ok).unwrap();
    assert!(!html.contains("out of order") && !html.contains("repeating a request id"));
}

/// The JSON schema pipelines rely on, and the files written.
#[test]
fn the_cli_writes_json_markdown_and_html() {
    let dir = tempfile::tempdir().unwrap();
    let w = spec(dir.path(), 8.0, 300);
    let (a, _) = replayed(dir.path(), "a", &w, &[]);
    let (b, _) = replayed(dir.path(), "b", &w, &["--max-num-batched-tokens", "512"]);
    let out = dir.path().join("report");
    let stdout = calibrate(&[
        "compare",
        "--real",
        a.to_str().unwrap(),
        "--sim",
        b.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--html",
        "--slo",
        "ttft_ms=500,tpot_ms=50",
        "--resamples",
        "200",
    ])
    .unwrap();
    assert!(stdout.starts_with("# Calibration report"), "{stdout}");
    let md = std::fs::read_to_string(out.with_extension("md")).unwrap();
    assert!(stdout.contains(&md));
    let j: Value =
        serde_json::from_str(&std::fs::read_to_string(out.with_extension("json")).unwrap())
            .unwrap();
    assert_eq!(j["schema_version"], 1);
    for m in ["ttft", "e2e", "itl", "tpot"] {
        let x = &j["metrics"][m];
        for side in ["real", "sim"] {
            for k in ["mean", "p50", "p90", "p95", "p99"] {
                assert!(x[side][k].is_f64(), "{m}.{side}.{k}");
            }
        }
        for k in ["mape", "mpe", "pearson_r", "ks_d", "ks_p", "wasserstein"] {
            assert!(x[k].is_f64(), "{m}.{k}");
        }
        assert!(x["grade"].is_string() && x["n"].is_u64());
    }
    assert!(j["slo"]["real"]["attainment"].is_f64());
    let html = std::fs::read_to_string(out.with_extension("html")).unwrap();
    assert!(html.contains("<svg") && html.matches("<svg").count() >= 12);
    assert!(html.contains("Calibration report"));
}

/// `saturated` (as the real side) compared with `stable`, without the
/// bootstrap.
fn saturated_against_stable(
    saturated: &blis_traces::Trace,
    stable: &blis_traces::Trace,
) -> blis_calibrate::compare::Comparison {
    compare(
        saturated,
        "sat",
        stable,
        "stable",
        &CompareOptions {
            resamples: 0,
            ..CompareOptions::default()
        },
    )
}

/// A stable simulation of a saturated server is flagged loudly.
#[test]
fn disagreeing_saturation_is_flagged() {
    let dir = tempfile::tempdir().unwrap();
    let w = spec(dir.path(), 12.0, 600);
    let (_, stable) = replayed(dir.path(), "stable", &w, &[]);
    let (_, saturated) = replayed(dir.path(), "sat", &w, &["--max-num-seqs", "2"]);
    let c = saturated_against_stable(&saturated, &stable);
    let s = &c.report.saturation;
    assert!(s.real.saturated && !s.sim.saturated, "{s:?}");
    assert!(!s.agree);
    assert!(
        c.report
            .to_markdown()
            .contains("WARNING: saturation disagrees")
    );
}

/// A saturated side under a client timeout reads as a deadline cliff: it
/// completes its earliest sends, about as many as its decode time and
/// concurrency give; a side that keeps up has no cliff.
#[test]
fn goodput_under_overload_is_read_as_a_deadline_cliff() {
    let dir = tempfile::tempdir().unwrap();
    // Fixed lengths, evenly spaced sends, a client that gives up after
    // 15 s: 16 requests of 400 tokens at once cannot keep up with 8/s.
    let w = dir.path().join("w.yaml");
    std::fs::write(
        &w,
        "aggregate_rate: 8\nnum_requests: 600\nseed: 3\nclients:\n  - id: c\n    rate_fraction: 1.0\n    streaming: true\n    timeout_us: 15000000\n    arrival: {process: constant}\n    input_distribution: {type: constant, params: {value: 200}}\n    output_distribution: {type: constant, params: {value: 400}}\n",
    )
    .unwrap();
    let (_, stable) = replayed(dir.path(), "stable", &w, &[]);
    let (_, saturated) = replayed(dir.path(), "sat", &w, &["--max-num-seqs", "16"]);
    let c = saturated_against_stable(&saturated, &stable);
    let g = c.report.goodput.as_ref().expect("a saturated side");
    let real = g[0].as_ref().unwrap();
    assert!(real.cliff_s.is_some(), "{real:?}");
    assert!(real.in_order > 0.99, "{real:?}");
    let err = real.predicted_completed / real.completed as f64 - 1.0;
    assert!(err.abs() < 0.1, "{real:?}");
    assert!(real.completed < 500, "{real:?}");
    assert!(g[1].as_ref().is_none_or(|c| c.cliff_s.is_none()), "{g:?}");
    let md = c.report.to_markdown();
    assert!(
        md.contains("deadline cliff): real completes its earliest sends up to"),
        "{md}"
    );
}

#[test]
fn a_missing_trace_is_a_one_line_error_naming_it() {
    let e = calibrate(&[
        "compare",
        "--real",
        "/nonexistent/a.yaml",
        "--sim",
        "/nonexistent/b.yaml",
        "--out",
        "/tmp/x",
    ])
    .unwrap_err();
    let msg = format!("{e:#}");
    assert!(msg.contains("/nonexistent/a.yaml"), "{msg}");
    assert!(!msg.contains('\n'), "{msg}");
}

/// Rewrites the request CSV of the bundle `header` without `column` (the
/// replayed CSVs here have no quoted fields).
fn drop_column(header: &std::path::Path, column: &str) -> std::path::PathBuf {
    let csv = header.with_extension("csv");
    let text = std::fs::read_to_string(&csv).unwrap();
    assert!(!text.contains('"'));
    let mut lines = text.lines();
    let head: Vec<&str> = lines.next().unwrap().split(',').collect();
    let at = head.iter().position(|c| *c == column).unwrap();
    let mut out = String::new();
    for line in std::iter::once(head.join(",")).chain(lines.map(str::to_string)) {
        let mut f: Vec<&str> = line.split(',').collect();
        f.remove(at);
        out.push_str(&f.join(","));
        out.push('\n');
    }
    std::fs::write(&csv, out).unwrap();
    csv
}

/// A trace without a column a comparison needs is an error naming the
/// file and the column, never a report with a metric missing.
#[test]
fn a_missing_required_column_is_an_error_naming_file_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let w = spec(dir.path(), 8.0, 60);
    for col in [
        "first_chunk_time_us",
        "status",
        "send_time_us",
        "last_chunk_time_us",
        "streaming",
    ] {
        let (a, _) = replayed(dir.path(), &format!("a-{col}"), &w, &[]);
        let (b, _) = replayed(dir.path(), &format!("b-{col}"), &w, &[]);
        let csv = drop_column(&a, col);
        let e = calibrate(&[
            "compare",
            "--real",
            a.to_str().unwrap(),
            "--sim",
            b.to_str().unwrap(),
            "--out",
            dir.path().join("r").to_str().unwrap(),
        ])
        .unwrap_err();
        let msg = format!("{e:#}");
        assert!(
            msg.contains(&format!(
                "{}:1: {col}: required column missing",
                csv.display()
            )),
            "{msg}"
        );
        assert!(!msg.contains('\n'), "{msg}");
        // Fitting needs the same columns.
        let e = calibrate(&[
            "fit",
            "--trace",
            a.to_str().unwrap(),
            "--model",
            MODEL,
            "--out",
            dir.path().join("c.yaml").to_str().unwrap(),
        ])
        .unwrap_err();
        assert!(format!("{e:#}").contains(&format!("{col}: required column missing")));
    }
}

/// Optional columns that are absent are named in the limitations.
#[test]
fn absent_optional_columns_are_listed_in_the_limitations() {
    let dir = tempfile::tempdir().unwrap();
    let w = spec(dir.path(), 8.0, 60);
    let (a, _) = replayed(dir.path(), "a", &w, &[]);
    let (b, _) = replayed(dir.path(), "b", &w, &[]);
    drop_column(&a, "slo_class");
    drop_column(&a, "server_input_tokens");
    let out = dir.path().join("r");
    let md = calibrate(&[
        "compare",
        "--real",
        a.to_str().unwrap(),
        "--sim",
        b.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--resamples",
        "0",
    ])
    .unwrap();
    assert!(
        md.contains("The real trace has no column slo_class, server_input_tokens: their values are unknown (input-token mismatches are judged on the planned counts; no per-SLO-class rows)."),
        "{md}"
    );
    assert!(md.contains("| TTFT |"), "{md}");
}

/// A comparison with no pair exits non-zero and says why.
#[test]
fn a_comparison_with_no_pairs_is_an_error_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let w = spec(dir.path(), 8.0, 30);
    let (a, _) = replayed(dir.path(), "a", &w, &[]);
    let (b, _) = replayed(dir.path(), "b", &w, &[]);
    let e = calibrate(&[
        "compare",
        "--real",
        a.to_str().unwrap(),
        "--sim",
        b.to_str().unwrap(),
        "--out",
        dir.path().join("r").to_str().unwrap(),
        "--warmup",
        "30",
    ])
    .unwrap_err();
    let msg = format!("{e:#}");
    assert!(
        msg.starts_with("nothing to compare: no request is completed (ok) on both sides past the warm-up (real: 30 rows, 0 ok past the warm-up; sim: 30 rows, 0 ok past it; 30 request ids in common; 30 real rows in the warm-up; every real row is within the warm-up of 30 requests (--warmup, by default the real header's): give a smaller --warmup)"),
        "{msg}"
    );
    assert!(!dir.path().join("r.md").exists());
}

/// A resample count past what fits in memory is a usage error naming the
/// bound (100 billion aborted the process on allocation).
#[test]
fn too_many_resamples_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let w = spec(dir.path(), 8.0, 30);
    let (a, _) = replayed(dir.path(), "a", &w, &[]);
    let e = calibrate(&[
        "compare",
        "--real",
        a.to_str().unwrap(),
        "--sim",
        a.to_str().unwrap(),
        "--out",
        dir.path().join("r").to_str().unwrap(),
        "--resamples",
        "100000000000",
    ])
    .unwrap_err();
    let msg = format!("{e:#}");
    assert!(
        msg.contains("--resamples must be 0 (no intervals) or 2 to 100000, got 100000000000"),
        "{msg}"
    );
}
