//! Bad input gives one clear line naming file:line (and column) and the
//! field, never a panic.

use std::path::Path;

use blis_traces::{Trace, WorkloadSpec};

use crate::common::{shared, tempdir};

fn one_line(e: &blis_traces::Error) -> String {
    let s = e.to_string();
    assert!(!s.contains('\n'), "error spans several lines: {s:?}");
    s
}

fn write(dir: &Path, name: &str, body: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, body).unwrap();
    p
}

const SPEC: &str = "version: \"1\"
seed: 1
aggregate_rate: 10
num_requests: 10
clients:
  - id: a
    rate_fraction: 1
    arrival:
      process: gamma
      cv: 2
    input_distribution:
      type: gaussian
      params:
        mean: 100
        std_dev: 10
    output_distribution:
      type: exponential
      params:
        mean: 50
";

#[test]
fn malformed_specs_name_file_line_and_field() {
    let dir = tempdir();
    let cases = [
        // (replace, with, expected prefix, expected words)
        (
            "      cv: 2\n",
            "      cv: 2\n      cvv: 3\n",
            ":11:7: ",
            "unknown field `cvv`",
        ),
        (
            "      cv: 2\n",
            "      cv: .nan\n",
            ":10:",
            "cv: invalid value",
        ),
        (
            "      cv: 2\n",
            "      cv: -2\n",
            ":10:7: ",
            "clients[0].arrival.cv: must be positive",
        ),
        (
            "    rate_fraction: 1\n",
            "    rate_fraction: 0\n",
            ":7:5: ",
            "rate fractions must sum to a positive, finite number, got 0",
        ),
        (
            "aggregate_rate: 10\n",
            "aggregate_rate: -10\n",
            ":3:1: ",
            "aggregate_rate: must be a positive rate in requests/s, got -10",
        ),
        (
            "aggregate_rate: 10\n",
            "aggregate_rate: 0\n",
            ":3:1: ",
            "aggregate_rate: must be a positive rate in requests/s (0 only when every client sets its own arrival shape and scale), got 0",
        ),
        (
            "        std_dev: 10\n",
            "        std_dev: ten\n",
            ":15:18: ",
            "std_dev: invalid floating point",
        ),
        (
            "      process: gamma\n",
            "      process: gama\n",
            ":9:16: ",
            "unknown variant `gama`",
        ),
        (
            "        mean: 50\n",
            "        mean: -50\n",
            ":19:9: ",
            "clients[0].output_distribution.params.mean: must be positive",
        ),
        (
            "      type: gaussian\n",
            "      type: empirical\n",
            ":11:5: ",
            "empirical distribution requires `pmf` or `file`",
        ),
        // A CV whose shape 1/cv² underflows ran with no request at all.
        (
            "      cv: 2\n",
            "      cv: 1e300\n",
            ":10:7: ",
            "clients[0].arrival.cv: gamma cv must be at most 100, got 1e300",
        ),
        (
            "      cv: 2\n",
            "      shape: 1e-320\n",
            ":10:7: ",
            "clients[0].arrival.shape: gamma shape must be at least 0.0001, got 1e-320",
        ),
        (
            "      process: gamma\n      cv: 2\n",
            "      process: weibull\n      shape: 0.001\n",
            ":10:7: ",
            "clients[0].arrival.shape: weibull shape must be at least 0.01, got 0.001",
        ),
        // A key written twice: named, without the YAML library's advice
        // about its own options.
        (
            "    rate_fraction: 1\n",
            "    rate_fraction: 1\n    rate_fraction: 2\n",
            ":8:5: ",
            "rate_fraction: this key appears twice in its mapping",
        ),
    ];
    for (from, to, prefix, words) in cases {
        assert!(SPEC.contains(from), "{from}");
        let p = write(dir.path(), "bad.yaml", &SPEC.replace(from, to));
        let err = WorkloadSpec::from_file(&p).unwrap_err();
        let msg = one_line(&err);
        let expect = format!("{}{prefix}", p.display());
        assert!(
            msg.starts_with(&expect),
            "{msg:?} should start with {expect:?}"
        );
        assert!(msg.contains(words), "{msg:?} should contain {words:?}");
        assert!(!msg.contains("Options"), "{msg:?}");
    }
}

#[test]
fn spec_without_stopping_rule_is_rejected() {
    let spec = WorkloadSpec::from_yaml_str(&SPEC.replace("num_requests: 10\n", "")).unwrap();
    let err = blis_traces::generate(&spec, &Default::default()).unwrap_err();
    assert!(
        one_line(&err).contains("set horizon_us or num_requests"),
        "{err}"
    );
}

fn trace_with_csv(dir: &Path, csv: &str) -> std::path::PathBuf {
    write(
        dir,
        "t.yaml",
        "trace_version: 3\ntime_unit: microseconds\nmode: real\n",
    );
    write(dir, "t.csv", csv);
    dir.join("t.yaml")
}

#[test]
fn bad_csv_cell_names_line_column_and_field() {
    let dir = tempdir();
    let good =
        std::fs::read_to_string(shared().join("traces-samples/blis/blis-run-1k.csv")).unwrap();
    let mut lines: Vec<String> = good.lines().take(5).map(String::from).collect();
    lines[3] = lines[3].replacen(",false,321,", ",false,32x,", 1);
    let h = trace_with_csv(dir.path(), &(lines.join("\n") + "\n"));
    let msg = one_line(&Trace::read(&h).unwrap_err());
    assert_eq!(
        msg,
        format!(
            "{}:4:10: input_tokens: invalid integer \"32x\"",
            dir.path().join("t.csv").display()
        )
    );
}

#[test]
fn negative_token_count_is_rejected() {
    let dir = tempdir();
    let good =
        std::fs::read_to_string(shared().join("traces-samples/blis/blis-run-1k.csv")).unwrap();
    let mut lines: Vec<String> = good.lines().take(3).map(String::from).collect();
    lines[2] = lines[2].replacen(",false,478,689,", ",false,478,-689,", 1);
    let h = trace_with_csv(dir.path(), &(lines.join("\n") + "\n"));
    let msg = one_line(&Trace::read(&h).unwrap_err());
    assert!(
        msg.ends_with(":3:11: output_tokens: invalid (negative or out of range) integer \"-689\""),
        "{msg}"
    );
}

#[test]
fn truncated_file_names_the_line() {
    let dir = tempdir();
    let good =
        std::fs::read_to_string(shared().join("traces-samples/blis/blis-run-1k.csv")).unwrap();
    // Cut the file in the middle of its 6th line.
    let cut = good.lines().take(5).map(|l| l.len() + 1).sum::<usize>() + 20;
    let h = trace_with_csv(dir.path(), &good[..cut]);
    let msg = one_line(&Trace::read(&h).unwrap_err());
    assert!(
        msg.contains("t.csv:6: expected 27 fields as in the header, found"),
        "{msg}"
    );
    assert!(msg.contains("truncated"), "{msg}");
}

#[test]
fn missing_required_column_and_bad_status_are_named() {
    let dir = tempdir();
    let h = trace_with_csv(dir.path(), "request_id,input_tokens\n0,5\n");
    assert!(
        one_line(&Trace::read(&h).unwrap_err())
            .ends_with("t.csv:1: output_tokens: required column missing from the header row")
    );
    let h = trace_with_csv(
        dir.path(),
        "request_id,input_tokens,output_tokens,arrival_time_us,status\n0,5,5,0,fine\n",
    );
    let msg = one_line(&Trace::read(&h).unwrap_err());
    assert!(
        msg.ends_with(
            "t.csv:2:5: status: unknown status \"fine\" (expected ok, error, timeout or cancelled)"
        ),
        "{msg}"
    );
}

#[test]
fn malformed_header_yaml_and_missing_files() {
    let dir = tempdir();
    let h = write(dir.path(), "h.yaml", "trace_version: [3\n");
    let msg = one_line(&Trace::read(&h).unwrap_err());
    assert!(msg.starts_with(&format!("{}:", h.display())), "{msg}");
    let err = Trace::read(&dir.path().join("nope.yaml")).unwrap_err();
    let msg = one_line(&err);
    assert!(
        msg.contains("nope.yaml") && msg.contains("No such file"),
        "{msg}"
    );
    // The OS error is in the message and not chained again, so a
    // binary's `{:#}` prints it once.
    assert!(std::error::Error::source(&err).is_none(), "{err:?}");
    // A header whose CSV is missing names the CSV.
    write(dir.path(), "lonely.yaml", "trace_version: 2\nmode: real\n");
    let msg = one_line(&Trace::read(&dir.path().join("lonely.yaml")).unwrap_err());
    assert!(msg.contains("lonely.csv"), "{msg}");
}

#[test]
fn malformed_import_lines_are_located() {
    let dir = tempdir();
    let p = write(
        dir.path(),
        "m.jsonl",
        "{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 1, \"hash_ids\": [0]}\n{\"timestamp\": 1, \"input_length\": \"x\"}\n",
    );
    let msg = one_line(&blis_traces::import::mooncake(&p).unwrap_err());
    assert!(msg.starts_with(&format!("{}:2:", p.display())), "{msg}");
    let p = write(
        dir.path(),
        "a.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:17:03.9799600,10,2\r\n2023-13-16 18:17:04.0,10,2",
    );
    let msg = one_line(&blis_traces::import::azure(&p).unwrap_err());
    assert!(
        msg.starts_with(&format!("{}:3:1: TIMESTAMP: invalid datetime", p.display())),
        "{msg}"
    );
}

/// A header cannot make a reader open a file outside its own folder: a
/// companion named by a path (absolute, `..`, a subfolder) is ignored for
/// the name derived from the header's.
#[test]
fn a_hostile_header_names_no_file_outside_its_folder() {
    let src = crate::common::shared().join("traces-samples/blis/blis-run-1k.yaml");
    let t = blis_traces::Trace::read(&src).unwrap();
    let dir = crate::common::tempdir();
    let inner = dir.path().join("inner");
    std::fs::create_dir(&inner).unwrap();
    let paths = t.write(&inner.join("t")).unwrap();
    // A file outside with a valid request CSV of one row.
    let outside = dir.path().join("outside.csv");
    let text = std::fs::read_to_string(&paths.data).unwrap();
    let two: Vec<&str> = text.lines().take(2).collect();
    std::fs::write(&outside, two.join("\n") + "\n").unwrap();
    let header = std::fs::read_to_string(&paths.header).unwrap();
    let absolute = outside.display().to_string();
    for name in ["../outside.csv", absolute.as_str(), "sub/t.csv"] {
        let hostile = format!(
            "{}data_file: '{name}'\n",
            header.replace("data_file:", "old_data_file_was:")
        );
        let hostile = hostile
            .lines()
            .filter(|l| !l.starts_with("old_data_file_was:"))
            .collect::<Vec<_>>()
            .join("\n")
            + "\n";
        std::fs::write(&paths.header, hostile).unwrap();
        let back = blis_traces::Trace::read(&paths.header).unwrap();
        assert_eq!(
            back.records.len(),
            1000,
            "{name}: read the derived t.csv, not the outside file"
        );
    }
}

/// Rate fractions that each parse but sum past f64 (two of 1e308) are an
/// error naming the field; the run planned its requests and sent none.
#[test]
fn rate_fractions_that_overflow_are_refused() {
    let two = SPEC.replace(
        "clients:\n  - id: a\n    rate_fraction: 1\n",
        "clients:\n  - id: b\n    rate_fraction: 1e308\n    input_distribution: {type: constant, params: {value: 10}}\n    output_distribution: {type: constant, params: {value: 10}}\n  - id: a\n    rate_fraction: 1e308\n",
    );
    assert_ne!(two, SPEC);
    let dir = tempdir();
    let p = write(dir.path(), "two.yaml", &two);
    let msg = one_line(&WorkloadSpec::from_file(&p).unwrap_err());
    assert!(
        msg.contains("clients[0].rate_fraction: rate fractions must sum to a positive, finite number, got inf"),
        "{msg}"
    );
}
