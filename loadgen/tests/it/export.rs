//! `blis-loadgen export --format aiperf`: a recorded run as AIPerf's
//! per-request `profile_export.jsonl`, field by field against the trace.
//! (AIPerf's own model reads it: `loadgen/benches/aiperf-export-check.sh`.)

use std::collections::BTreeMap;

use blis_traces::{Status, Trace};
use serde_json::Value;

use crate::common::{MODEL, Mock, loadgen, s, serial};

#[test]
fn a_run_exports_as_aiperf_records() {
    let _g = serial();
    let mock = Mock::start(&[
        "--time-scale",
        "100",
        "--fault-500-rate",
        "0.1",
        "--seed",
        "4",
    ]);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let (code, stdout) = loadgen(&[
        "run",
        "--server-url",
        &mock.url,
        "--model",
        MODEL,
        "--rate",
        "100",
        "--num-requests",
        "120",
        "--input-tokens",
        "50",
        "--output-tokens",
        "5",
        "--warmup-requests",
        "10",
        "--scrape-interval-ms",
        "0",
        "--out",
        s(&out),
    ])
    .unwrap();
    assert_eq!(code, 0, "{stdout}");
    let jsonl = dir.path().join("profile_export.jsonl");
    let (code, said) =
        loadgen(&["export", s(&out), "--format", "aiperf", "--out", s(&jsonl)]).unwrap();
    assert_eq!(code, 0);
    assert!(said.contains("120 requests"), "{said}");
    let t = Trace::read(&out.with_extension("yaml")).unwrap();
    let rows: BTreeMap<String, &blis_traces::TraceRecord> = t
        .records
        .iter()
        .map(|r| (r.outcome.x_request_id.clone().unwrap(), r))
        .collect();
    let text = std::fs::read_to_string(&jsonl).unwrap();
    let (mut ok, mut failed, mut warm) = (0, 0, 0);
    let mut sessions = std::collections::BTreeSet::new();
    for line in text.lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        let m = &v["metadata"];
        for k in [
            "session_num",
            "request_start_ns",
            "request_end_ns",
            "worker_id",
            "record_processor_id",
            "benchmark_phase",
        ] {
            assert!(!m[k].is_null(), "required metadata {k}: {line}");
        }
        assert!(sessions.insert(m["session_num"].as_u64().unwrap()));
        let r = rows[m["x_request_id"].as_str().unwrap()];
        assert_eq!(
            m["request_start_ns"].as_i64(),
            Some(r.outcome.send_time_us.unwrap() * 1000)
        );
        if m["benchmark_phase"] == "warmup" {
            warm += 1;
            assert!(r.request.request_id < 10);
        }
        let metric = |k: &str| v["metrics"][k]["value"].as_f64();
        if r.outcome.status == Some(Status::Ok) {
            ok += 1;
            assert!(v["error"].is_null());
            assert_eq!(v["metrics"]["time_to_first_token"]["unit"], "ms");
            let ttft = metric("time_to_first_token").unwrap();
            assert!((ttft - r.ttft_us().unwrap() as f64 / 1e3).abs() < 1e-9);
            let e2e = metric("request_latency").unwrap();
            assert!((e2e - r.e2e_us().unwrap() as f64 / 1e3).abs() < 1e-9);
            assert_eq!(metric("output_sequence_length"), Some(5.0));
            // The server's count of the prompt, as the trace's.
            assert_eq!(
                metric("input_sequence_length"),
                Some(f64::from(r.effective_input_tokens()))
            );
            let icl = v["metrics"]["inter_chunk_latency"]["value"]
                .as_array()
                .unwrap();
            assert_eq!(icl.len(), 4, "five chunks, four gaps");
        } else {
            failed += 1;
            assert_eq!(v["error"]["code"], 500);
            assert_eq!(v["error"]["type"], "http_500");
            assert_eq!(
                metric("error_isl"),
                Some(f64::from(r.effective_input_tokens()))
            );
        }
    }
    assert_eq!(ok + failed, 120);
    assert!(failed > 0 && warm == 10, "failed {failed}, warm-up {warm}");
}
