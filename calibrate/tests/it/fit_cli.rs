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
