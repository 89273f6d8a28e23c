//! `blis-loadgen generate` as a user runs it: files, summary, exit codes.

use std::path::PathBuf;

use assert_cmd::Command;
use blis_traces::{Mode, Trace};

fn shared() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared")
}

fn loadgen() -> Command {
    Command::cargo_bin("blis-loadgen").expect("binary built")
}

#[test]
fn generate_writes_a_planned_trace_and_prints_a_summary() {
    let _g = crate::common::serial();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("plan");
    let assert = loadgen()
        .args(["generate", "--workload-spec"])
        .arg(shared().join("examples/two-client-workload.yaml"))
        .args(["--num-requests", "500", "--out"])
        .arg(&out)
        .assert()
        .success();
    let stdout = String::from_utf8(assert.get_output().stdout.clone()).unwrap();
    assert!(stdout.starts_with("500 requests over "), "{stdout}");
    assert!(
        stdout.contains("| high-volume-batch |") && stdout.contains("| realtime-chat |"),
        "{stdout}"
    );
    let t = Trace::read(&out.with_extension("yaml")).unwrap();
    assert_eq!(t.header.mode, Mode::Generated);
    assert_eq!(t.header.workload_seed, Some(42));
    assert_eq!(t.records.len(), 500);
    // Same command, same bytes.
    let again = dir.path().join("again");
    loadgen()
        .args(["generate", "--workload-spec"])
        .arg(shared().join("examples/two-client-workload.yaml"))
        .args(["--num-requests", "500", "--out"])
        .arg(&again)
        .assert()
        .success();
    assert_eq!(
        std::fs::read(out.with_extension("csv")).unwrap(),
        std::fs::read(again.with_extension("csv")).unwrap()
    );
}

#[test]
fn generate_imports_and_truncates() {
    let _g = crate::common::serial();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("az");
    let src = format!(
        "azure:{}",
        shared()
            .join("traces-samples/azure2023/AzureLLMInferenceTrace_conv.sample.csv")
            .display()
    );
    loadgen()
        .args(["generate", "--import", &src, "--horizon-s", "10", "--out"])
        .arg(&out)
        .assert()
        .success();
    let t = Trace::read(&out.with_extension("yaml")).unwrap();
    assert!(
        !t.records.is_empty()
            && t.records
                .iter()
                .all(|r| r.request.arrival_time_us < 10_000_000)
    );
    assert_eq!(t.header.workload_spec.as_deref(), Some(src.as_str()));
}

#[test]
fn a_real_import_becomes_a_plan_without_outcomes() {
    let _g = crate::common::serial();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("gt");
    let src = format!(
        "vllm-gt:{}",
        shared()
            .join("vllm-ground-truth/train/20260218-155500-codellama-34b-tp2-roleplay")
            .display()
    );
    loadgen()
        .args([
            "generate",
            "--import",
            &src,
            "--num-requests",
            "20",
            "--out",
        ])
        .arg(&out)
        .assert()
        .success();
    let t = Trace::read(&out.with_extension("yaml")).unwrap();
    assert_eq!(t.header.mode, Mode::Generated);
    assert_eq!(t.records.len(), 20);
    assert!(
        t.records
            .iter()
            .all(|r| r.outcome.status.is_none() && r.outcome.send_time_us.is_none())
    );
    // The server settings of the run stay in the header.
    assert_eq!(t.header.server.unwrap().total_kv_blocks, Some(26602));
}

/// `--keep-measured` converts a real run to trace v2 keeping what it
/// measured: the written trace reads back with the same records as the
/// import (times, statuses, lengths), as `mode: real`; a workload without
/// measurements is refused.
#[test]
fn keep_measured_converts_a_real_run_with_its_times() {
    let _g = crate::common::serial();
    let run =
        shared().join("vllm-ground-truth/train/20260218-135247-mixtral-8x7b-v0-1-tp2-reasoning");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("gt");
    let src = format!("vllm-gt:{}", run.display());
    loadgen()
        .args(["generate", "--import", &src, "--keep-measured", "--out"])
        .arg(&out)
        .assert()
        .success();
    let t = Trace::read(&out.with_extension("yaml")).unwrap();
    assert_eq!(t.header.mode, Mode::Real);
    let imported = blis_traces::import(&src.parse().unwrap(), 42).unwrap();
    assert_eq!(t.records.len(), imported.records.len());
    let mut timeouts = 0;
    for (a, b) in t.records.iter().zip(&imported.records) {
        assert_eq!(a.request, b.request);
        assert_eq!(a.outcome.send_time_us, b.outcome.send_time_us);
        assert_eq!(a.outcome.first_chunk_time_us, b.outcome.first_chunk_time_us);
        assert_eq!(a.outcome.last_chunk_time_us, b.outcome.last_chunk_time_us);
        assert_eq!(a.outcome.status, b.outcome.status);
        timeouts += usize::from(a.outcome.status == Some(blis_traces::Status::Timeout));
    }
    assert!(timeouts > 1000, "the run's failures are kept: {timeouts}");
    // Nothing measured, nothing to keep.
    let assert = loadgen()
        .args([
            "generate",
            "--rate",
            "5",
            "--num-requests",
            "3",
            "--keep-measured",
            "--out",
        ])
        .arg(dir.path().join("x"))
        .assert()
        .failure()
        .code(1);
    let err = String::from_utf8(assert.get_output().stderr.clone()).unwrap();
    assert!(
        err.contains("--keep-measured") && err.contains("vllm-gt"),
        "{err}"
    );
}

#[test]
fn bad_spec_fails_with_one_line_naming_file_line_and_field() {
    let _g = crate::common::serial();
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("bad.yaml");
    std::fs::write(&spec, "aggregate_rate: 10\nnum_requests: 5\nclients:\n  - id: a\n    rate_fraction: .nan\n    input_distribution: {type: constant, params: {value: 1}}\n    output_distribution: {type: constant, params: {value: 1}}\n").unwrap();
    let assert = loadgen()
        .args(["generate", "--workload-spec"])
        .arg(&spec)
        .args(["--out"])
        .arg(dir.path().join("x"))
        .assert()
        .code(1);
    let stderr = String::from_utf8(assert.get_output().stderr.clone()).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with(&format!("error: {}:5:", spec.display())),
        "{stderr}"
    );
    assert!(stderr.contains("rate_fraction"), "{stderr}");
}

#[test]
fn usage_errors_exit_2() {
    let _g = crate::common::serial();
    loadgen().args(["generate", "--out", "x"]).assert().code(2);
    let assert = loadgen()
        .args(["generate", "--import", "bogus:x", "--out", "x"])
        .assert()
        .code(2);
    let stderr = String::from_utf8_lossy(&assert.get_output().stderr).into_owned();
    assert!(stderr.contains("unknown import kind"), "{stderr}");
}

#[test]
fn a_constant_rate_spaces_every_request_one_gap_apart() {
    let _g = crate::common::serial();
    let dir = tempfile::tempdir().unwrap();
    let plan = |arrival: &str, name: &str| {
        let out = dir.path().join(name);
        loadgen()
            .args(["generate", "--rate", "200", "--num-requests", "50"])
            .args(["--arrival", arrival, "--input-tokens", "16", "--out"])
            .arg(&out)
            .assert()
            .success();
        let t = Trace::read(&out.with_extension("yaml")).unwrap();
        let gaps: Vec<i64> = t
            .records
            .windows(2)
            .map(|w| w[1].request.arrival_time_us - w[0].request.arrival_time_us)
            .collect();
        (t.header.workload_spec.unwrap_or_default(), gaps)
    };
    let (what, gaps) = plan("constant", "c");
    assert!(what.starts_with("synthetic: constant 200 req/s"), "{what}");
    assert_eq!(gaps.len(), 49);
    assert!(gaps.iter().all(|&g| g == 5_000), "{gaps:?}");
    // The default stays Poisson: gaps vary.
    let (what, gaps) = plan("poisson", "p");
    assert!(what.starts_with("synthetic: poisson"), "{what}");
    assert!(gaps.iter().any(|&g| g != 5_000), "{gaps:?}");
}

/// A spec is generated twice rather than held (a first pass finds the
/// columns the plan needs, a second writes it): a spec with sessions still
/// gets its think-time column, and the plan holds exactly the requests the
/// generator gives in memory.
#[test]
fn a_generated_plan_is_the_generators_requests_with_their_columns() {
    let _g = crate::common::serial();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("sessions");
    let spec = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/chat-sessions.yaml");
    loadgen()
        .args(["generate", "--workload-spec"])
        .arg(&spec)
        .args(["--num-requests", "300", "--out"])
        .arg(&out)
        .assert()
        .success();
    let csv = std::fs::read_to_string(out.with_extension("csv")).unwrap();
    assert!(
        csv.lines().next().unwrap().contains("think_time_us"),
        "{}",
        csv.lines().next().unwrap()
    );
    // The same requests and columns as one pass over them in memory.
    let w = blis_traces::WorkloadSpec::from_file(&spec).unwrap();
    let opts = blis_traces::GenerateOptions {
        num_requests: Some(300),
        ..Default::default()
    };
    let records: Vec<blis_traces::TraceRecord> = blis_traces::generate(&w, &opts)
        .unwrap()
        .into_iter()
        .map(blis_traces::TraceRecord::planned)
        .collect();
    assert!(records.iter().any(|r| r.request.think_time_us.is_some()));
    let t = Trace::read(&out.with_extension("yaml")).unwrap();
    let held = dir.path().join("held");
    let mut wr = blis_traces::TraceWriter::create(
        &held,
        &t.header,
        &blis_traces::ExtraColumn::needed_for(&records),
        None,
        false,
    )
    .unwrap();
    for r in &records {
        wr.write_record(r).unwrap();
    }
    wr.finish(&t.header).unwrap();
    assert_eq!(
        csv,
        std::fs::read_to_string(held.with_extension("csv")).unwrap()
    );
}

/// `--burstiness F` (`vllm bench serve`'s): Gamma gaps of shape F at the
/// same rate, so their coefficient of variation is 1/√F.
#[test]
fn burstiness_shapes_the_gaps_and_keeps_the_rate() {
    let dir = tempfile::tempdir().unwrap();
    for (f, cv) in [("0.25", 2.0), ("1", 1.0), ("4", 0.5)] {
        let out = dir.path().join(format!("b{}", f.replace('.', "_")));
        loadgen()
            .args(["generate", "--rate", "100", "--num-requests", "5000"])
            .args(["--burstiness", f, "--out"])
            .arg(&out)
            .assert()
            .success();
        let t = Trace::read(&out.with_extension("yaml")).unwrap();
        let a: Vec<f64> = t
            .records
            .iter()
            .map(|r| r.request.arrival_time_us as f64)
            .collect();
        let gaps: Vec<f64> = a.windows(2).map(|w| w[1] - w[0]).collect();
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        let sd = (gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64).sqrt();
        assert!(
            (1e6 / mean - 100.0).abs() < 5.0,
            "burstiness {f}: rate {}",
            1e6 / mean
        );
        assert!(
            (sd / mean - cv).abs() < 0.15 * cv,
            "burstiness {f}: CV {}",
            sd / mean
        );
        assert!(
            t.header
                .workload_spec
                .as_deref()
                .is_some_and(|w| w.contains(&format!("gamma (burstiness {f})"))),
            "{:?}",
            t.header.workload_spec
        );
    }
    // Not a positive number, or with a process of its own: refused.
    for bad in [
        &["--burstiness", "0"][..],
        &["--burstiness", "2", "--arrival", "constant"],
    ] {
        let o = loadgen()
            .args(["generate", "--rate", "100", "--num-requests", "5", "--out"])
            .arg(dir.path().join("x"))
            .args(bad)
            .output()
            .unwrap();
        assert!(!o.status.success());
        assert!(String::from_utf8_lossy(&o.stderr).contains("--burstiness"));
    }
}

/// The flags that shape a `--rate` workload are refused with any other
/// workload (they were silently ignored: a user's `--input-tokens 2000`
/// beside a workload spec did nothing).
#[test]
fn synthetic_flags_without_rate_are_refused_not_ignored() {
    let dir = tempfile::tempdir().unwrap();
    for flag in [
        &["--input-tokens", "2000"][..],
        &["--output-tokens", "5"],
        &["--arrival", "constant"],
        &["--burstiness", "0.5"],
    ] {
        let o = loadgen()
            .args(["generate", "--workload-spec"])
            .arg(shared().join("examples/two-client-workload.yaml"))
            .args(["--num-requests", "5", "--out"])
            .arg(dir.path().join("x"))
            .args(flag)
            .output()
            .unwrap();
        assert!(!o.status.success(), "{flag:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("shape a --rate workload"), "{flag:?}: {err}");
    }
}
