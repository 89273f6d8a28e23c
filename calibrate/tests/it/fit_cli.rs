//! `blis-calibrate fit` as a user runs it: the table of fitted parameters
//! says what each is and in which unit.

use crate::common::{MODEL, calibrate, replayed, spec};

/// `blis-calibrate fit --trace TRACE --model MODEL --budget-evals 4 --out
/// DIR/c.yaml` and `extra`: what it printed, or its error.
fn fit(dir: &std::path::Path, trace: &std::path::Path, extra: &[&str]) -> anyhow::Result<String> {
    let out = dir.join("c.yaml");
    let mut args = vec![
        "fit",
        "--trace",
        trace.to_str().unwrap(),
        "--model",
        MODEL,
        "--budget-evals",
        "4",
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    calibrate(&args)
}

#[test]
fn the_fit_table_names_each_parameter_and_its_unit() {
    let dir = tempfile::tempdir().unwrap();
    let w = spec(dir.path(), 8.0, 120);
    let (a, _) = replayed(dir.path(), "a", &w, &[]);
    let out = fit(dir.path(), &a, &[]).unwrap();
    assert!(
        out.contains("| parameter | what (unit) | start | fitted |"),
        "{out}"
    );
    for row in [
        "| alpha0 | queueing delay per request (µs) |",
        "| beta0 | step time, fixed part (µs/step) |",
        "| beta1 | step time per uncached prefill token (µs/token) |",
        "| beta2 | step time per decoding request (µs/request) |",
    ] {
        assert!(out.contains(row), "{row}: {out}");
    }
}

/// Requests sent without streaming have no TTFT: the fit's table says so
/// with a dash (it printed `NaN / NaN`), and a trained-physics fit, which
/// needs first-token times, says that the stream is what is missing (it
/// said "fewer than 20 completed requests" of a trace of 120 completed).
#[test]
fn a_trace_without_streaming_says_what_it_lacks() {
    let dir = tempfile::tempdir().unwrap();
    let w = spec(dir.path(), 8.0, 120);
    let text = std::fs::read_to_string(&w).unwrap();
    std::fs::write(&w, text.replace("streaming: true", "streaming: false")).unwrap();
    let (a, t) = replayed(dir.path(), "a", &w, &[]);
    assert!(t.records.iter().all(|r| !r.request.streaming));
    let out = fit(dir.path(), &a, &[]).unwrap();
    assert!(!out.contains("NaN"), "{out}");
    assert!(out.contains("| fit | 84 | — / — |"), "{out}");
    let err = fit(dir.path(), &a, &["--latency-model", "trained-physics"])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("0 completed streamed requests of 120 completed"),
        "{err}"
    );
}

/// An overloaded-run weight that is not a number ≥ 0 is refused whatever
/// is fitted (a blackbox fit, which does not weigh runs, took NaN and -1
/// and wrote coefficients).
#[test]
fn a_bad_overloaded_weight_is_refused_by_every_fit() {
    let dir = tempfile::tempdir().unwrap();
    let w = spec(dir.path(), 8.0, 30);
    let (a, _) = replayed(dir.path(), "a", &w, &[]);
    for weight in ["NaN", "-1"] {
        let e = fit(dir.path(), &a, &["--overloaded-weight", weight]).unwrap_err();
        let msg = format!("{e:#}");
        assert!(
            msg.contains(&format!(
                "--overloaded-weight must be a number ≥ 0, got {weight}"
            )),
            "{msg}"
        );
    }
    assert!(!dir.path().join("c.yaml").exists());
}

/// A `--model-config` that cannot be read is an error whatever is fitted:
/// a blackbox fit, which needs no architecture, ignored a mistyped path and
/// wrote coefficients as if the flag had been taken.
#[test]
fn an_unreadable_model_config_is_refused_by_a_blackbox_fit() {
    let dir = tempfile::tempdir().unwrap();
    let w = spec(dir.path(), 8.0, 30);
    let (a, _) = replayed(dir.path(), "a", &w, &[]);
    let missing = dir.path().join("no-such-model");
    let bad = dir.path().join("bad-config.json");
    std::fs::write(&bad, "{ not json").unwrap();
    for (path, says) in [(&missing, "No such file"), (&bad, "invalid JSON")] {
        let e = fit(dir.path(), &a, &["--model-config", path.to_str().unwrap()]).unwrap_err();
        let msg = format!("{e:#}");
        assert!(msg.contains(&path.display().to_string()), "{msg}");
        assert!(msg.contains(says), "{msg}");
    }
    assert!(!dir.path().join("c.yaml").exists());
}

/// A completed row whose last chunk comes before its first, or whose first
/// comes before its send (a recorder's clock at fault), is left out of a
/// blackbox fit's data-driven start as it is left out of the fit: the
/// count of requests decoding at a time went below zero over such a row
/// (a debug build panicked, "attempt to subtract with overflow"; a release
/// one made a start from a batch of 2^64, which its loss then ruled out).
/// Found by mutated traces.
#[test]
fn rows_with_times_out_of_order_are_left_out_of_the_fits_start() {
    let dir = tempfile::tempdir().unwrap();
    let w = spec(dir.path(), 8.0, 120);
    let (_, t) = replayed(dir.path(), "a", &w, &[]);
    let mut bad = t.clone();
    let o = &mut bad.records[10].outcome;
    o.last_chunk_time_us = Some(o.first_chunk_time_us.unwrap() - 1_000_000_000);
    let o = &mut bad.records[20].outcome;
    o.first_chunk_time_us = Some(o.send_time_us.unwrap() - 1_000);
    let prefix = dir.path().join("bad");
    bad.write(&prefix).unwrap();
    let out = fit(dir.path(), &prefix.with_extension("yaml"), &[]).unwrap();
    assert!(out.contains("| beta2 |") && !out.contains("NaN"), "{out}");
    // The other 118 rows are measured: 82 fitted, 36 held out.
    assert!(
        out.contains("| fit | 82 |") && out.contains("| holdout | 36 |"),
        "{out}"
    );
}

/// A trained-physics fit rebuilds the decode batch on a grid of 5 ms cells
/// over the run; one request recorded as finishing 285 years later
/// (2^53 − 1 µs, a time the trace format holds) asked for a grid of 14 TB
/// and aborted the process. A run longer than the grid's million cells
/// gets longer cells instead. Found by mutated traces.
#[test]
fn a_request_lasting_centuries_does_not_size_the_fits_grid() {
    let dir = tempfile::tempdir().unwrap();
    let w = spec(dir.path(), 8.0, 120);
    let (_, t) = replayed(dir.path(), "a", &w, &[]);
    let mut long = t.clone();
    long.records[60].outcome.last_chunk_time_us = Some((1 << 53) - 1);
    let prefix = dir.path().join("long");
    long.write(&prefix).unwrap();
    let out = fit(
        dir.path(),
        &prefix.with_extension("yaml"),
        &["--latency-model", "trained-physics"],
    )
    .unwrap();
    assert!(out.contains("wrote "), "{out}");
}
