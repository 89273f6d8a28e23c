use assert_cmd::Command;
use blis_traces::{Status, Trace};

use crate::common::{MODEL, Mock, s};

fn loadgen() -> Command {
    Command::cargo_bin("blis-loadgen").expect("binary built")
}

fn one_line_error(out: &std::process::Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error: ")).collect();
    assert_eq!(lines.len(), 1, "one error line expected: {err}");
    assert!(!err.contains("panicked"), "{err}");
    lines[0].to_string()
}

#[test]
fn an_unreachable_server_is_a_one_line_error() {
    let _g = crate::common::serial();
    let dir = tempfile::tempdir().unwrap();
    let out = loadgen()
        .args(["run", "--server-url", "http://127.0.0.1:9", "--model", "m"])
        .args(["--rate", "1", "--num-requests", "1", "--out"])
        .arg(dir.path().join("x"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let e = one_line_error(&out);
    assert!(
        e.contains("cannot reach the server at http://127.0.0.1:9"),
        "{e}"
    );
}

#[test]
fn a_model_the_server_does_not_serve_is_named() {
    let _g = crate::common::serial();
    let mock = Mock::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let out = loadgen()
        .args(["run", "--server-url", &mock.url, "--model", "no-such-model"])
        .args(["--rate", "1", "--num-requests", "1", "--out"])
        .arg(dir.path().join("x"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let e = one_line_error(&out);
    assert!(
        e.contains("does not serve the model \"no-such-model\""),
        "{e}"
    );
    assert!(e.contains(MODEL), "{e}");
}

#[test]
fn bad_options_are_rejected_before_anything_is_sent() {
    let _g = crate::common::serial();
    let dir = tempfile::tempdir().unwrap();
    for (flag, value, needle) in [
        ("--timeout-s", "0", "--timeout-s must be a positive"),
        ("--slo", "ttft=3", "--slo: unknown key"),
        (
            "--output-tokens",
            "gaussian:5",
            "--output-tokens: gaussian:MEAN,STD",
        ),
    ] {
        let out = loadgen()
            .args(["run", "--server-url", "http://127.0.0.1:9", "--model", "m"])
            .args(["--rate", "1", "--num-requests", "1", flag, value, "--out"])
            .arg(dir.path().join("x"))
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{flag}");
        let e = one_line_error(&out);
        assert!(e.contains(needle), "{flag}: {e}");
    }
}

#[test]
fn the_api_key_never_appears_in_output_or_trace() {
    let _g = crate::common::serial();
    let key = "sk-very-secret-4711";
    let mock = Mock::start(&["--api-key", key]);
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("keyed");
    // A wrong key is refused, and the error does not echo it.
    let out = loadgen()
        .args(["run", "--server-url", &mock.url, "--model", MODEL])
        .args(["--rate", "5", "--num-requests", "3", "--out", s(&prefix)])
        .env("BLIS_API_KEY", "sk-wrong-0815")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let e = one_line_error(&out);
    assert!(
        e.contains("refused the API key") && !e.contains("sk-wrong-0815"),
        "{e}"
    );
    // The right key from the environment works and is written nowhere.
    let out = loadgen()
        .args(["run", "--server-url", &mock.url, "--model", MODEL])
        .args([
            "--rate",
            "20",
            "--num-requests",
            "10",
            "--output-tokens",
            "3",
        ])
        .args(["--scrape-interval-ms", "50", "--out", s(&prefix)])
        .env("BLIS_API_KEY", key)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let t = Trace::read(&prefix.with_extension("yaml")).unwrap();
    assert!(
        t.records
            .iter()
            .all(|r| r.outcome.status == Some(Status::Ok))
    );
    assert!(
        !t.metrics.unwrap_or_default().is_empty(),
        "/metrics scraped with the key"
    );
    let mut everything = String::from_utf8_lossy(&out.stdout).into_owned();
    everything.push_str(&String::from_utf8_lossy(&out.stderr));
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        everything.push_str(&std::fs::read_to_string(entry.unwrap().path()).unwrap());
    }
    assert!(!everything.contains(key));
    assert!(!everything.contains("very-secret"));
}
