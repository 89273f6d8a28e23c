//! `blis-calibrate fit` as a user runs it: the table of fitted parameters
//! says what each is and in which unit.

use crate::common::{MODEL, calibrate, replayed, spec};

#[test]
fn the_fit_table_names_each_parameter_and_its_unit() {
    let dir = tempfile::tempdir().unwrap();
    let w = spec(dir.path(), 8.0, 120);
    let (a, _) = replayed(dir.path(), "a", &w, &[]);
    let out = calibrate(&[
        "fit",
        "--trace",
        a.to_str().unwrap(),
        "--model",
        MODEL,
        "--budget-evals",
        "4",
        "--out",
        dir.path().join("c.yaml").to_str().unwrap(),
    ])
    .unwrap();
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
    let coefs = dir.path().join("c.yaml");
    let out = calibrate(&[
        "fit",
        "--trace",
        a.to_str().unwrap(),
        "--model",
        MODEL,
        "--budget-evals",
        "4",
        "--out",
        coefs.to_str().unwrap(),
    ])
    .unwrap();
    assert!(!out.contains("NaN"), "{out}");
    assert!(out.contains("| fit | 84 | — / — |"), "{out}");
    let err = calibrate(&[
        "fit",
        "--trace",
        a.to_str().unwrap(),
        "--model",
        MODEL,
        "--latency-model",
        "trained-physics",
        "--budget-evals",
        "4",
        "--out",
        coefs.to_str().unwrap(),
    ])
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("0 completed streamed requests of 120 completed"),
        "{err}"
    );
}
