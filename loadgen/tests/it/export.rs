//! `blis-loadgen export`: a recorded run in AIPerf's, guidellm's and
//! inference-perf's formats, field by field against the trace. (The peers'
//! own code reads them back: `loadgen/benches/peer-export-check.sh`.)

use std::collections::BTreeMap;

use blis_traces::{Status, Trace};
use serde_json::Value;

use crate::common::{MODEL, Mock, loadgen, s, serial};

/// A recorded run against the mock with 10% HTTP 500s: 120 requests, the
/// first 10 a warm-up.
fn recorded_run(dir: &std::path::Path) -> std::path::PathBuf {
    let _g = serial();
    let mock = Mock::start(&[
        "--time-scale",
        "100",
        "--fault-500-rate",
        "0.1",
        "--seed",
        "4",
    ]);
    let out = dir.join("run");
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
    out
}

/// `blis-loadgen export TRACE --format FORMAT --out DEST`, which must
/// succeed; returns what it said.
fn export(trace: &std::path::Path, format: &str, dest: &std::path::Path) -> String {
    let (code, said) =
        loadgen(&["export", s(trace), "--format", format, "--out", s(dest)]).unwrap();
    assert_eq!(code, 0, "{said}");
    said
}

fn by_x_request_id(t: &Trace) -> BTreeMap<String, &blis_traces::TraceRecord> {
    t.records
        .iter()
        .map(|r| (r.outcome.x_request_id.clone().unwrap(), r))
        .collect()
}

#[test]
fn a_run_exports_as_aiperf_records() {
    let dir = tempfile::tempdir().unwrap();
    let out = recorded_run(dir.path());
    let jsonl = dir.path().join("profile_export.jsonl");
    let said = export(&out, "aiperf", &jsonl);
    assert!(said.contains("120 requests"), "{said}");
    let t = Trace::read(&out.with_extension("yaml")).unwrap();
    let rows = by_x_request_id(&t);
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

#[test]
fn a_run_exports_as_a_guidellm_report_without_its_warm_up() {
    let dir = tempfile::tempdir().unwrap();
    let out = recorded_run(dir.path());
    let file = dir.path().join("benchmarks.json");
    let said = export(&out, "guidellm", &file);
    assert!(
        said.contains("110 requests") && said.contains("10 warm-up left out"),
        "{said}"
    );
    let t = Trace::read(&out.with_extension("yaml")).unwrap();
    let rows = by_x_request_id(&t);
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(v["metadata"]["version"], 2);
    let b = &v["benchmarks"][0];
    assert_eq!(b["config"]["strategy"]["type_"], "trace");
    let ok = b["requests"]["successful"].as_array().unwrap();
    let errored = b["requests"]["errored"].as_array().unwrap();
    assert_eq!(ok.len() + errored.len(), 110);
    assert_eq!(b["metrics"]["request_totals"]["total"], 110);
    assert!(!errored.is_empty());
    let mut ttfts = Vec::new();
    for q in ok {
        let r = rows[q["request_id"].as_str().unwrap()];
        assert!(r.request.request_id >= 10, "no warm-up request");
        assert_eq!(r.outcome.status, Some(Status::Ok));
        let timings = &q["info"]["timings"];
        let send = r.outcome.send_time_us.unwrap() as f64 / 1e6;
        assert!((timings["request_start"].as_f64().unwrap() - send).abs() < 1e-6);
        let ttft_ms = q["time_to_first_token_ms"].as_f64().unwrap();
        assert!((ttft_ms - r.ttft_us().unwrap() as f64 / 1e3).abs() < 1e-3);
        assert_eq!(q["output_metrics"]["text_tokens"], 5);
        assert_eq!(timings["token_iterations"], 5, "one iteration per chunk");
        ttfts.push(ttft_ms);
    }
    for q in errored {
        assert_eq!(q["info"]["status"], "errored");
        assert!(q["info"]["error"].as_str().is_some_and(|e| !e.is_empty()));
    }
    // The summary is guidellm's: the median is the smallest value whose
    // cumulative share reaches one half.
    ttfts.sort_by(f64::total_cmp);
    let median = ttfts[ttfts.len().div_ceil(2) - 1];
    let m = b["metrics"]["time_to_first_token_ms"]["successful"]["median"]
        .as_f64()
        .unwrap();
    assert!((m - median).abs() < 1e-9, "{m} vs {median}");
    assert_eq!(
        b["metrics"]["time_to_first_token_ms"]["successful"]["count"],
        ok.len()
    );
    // The trace's chunk count is input: a row claiming 2^32 - 1 chunks
    // gives a bounded report (iterations capped at the request's tokens).
    let csv_path = out.with_extension("csv");
    let text = std::fs::read_to_string(&csv_path).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let header: Vec<&str> = lines[0].split(',').collect();
    let col = header.iter().position(|c| *c == "num_chunks").unwrap();
    let status = header.iter().position(|c| *c == "status").unwrap();
    // The first measured request that completed.
    let row = (1..lines.len())
        .find(|&i| {
            let f: Vec<&str> = lines[i].split(',').collect();
            f[0].parse::<u64>().is_ok_and(|id| id >= 10) && f[status] == "ok"
        })
        .expect("a completed measured request");
    let mut f: Vec<String> = lines[row].split(',').map(str::to_string).collect();
    f[col] = "4294967295".into();
    lines[row] = f.join(",");
    std::fs::write(&csv_path, lines.join("\n") + "\n").unwrap();
    export(&out, "guidellm", &file);
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    for q in v["benchmarks"][0]["requests"]["successful"]
        .as_array()
        .unwrap()
    {
        assert!(q["info"]["timings"]["token_iterations"].as_u64().unwrap() <= 5);
    }
}

#[test]
fn a_run_exports_as_inference_perf_reports() {
    let dir = tempfile::tempdir().unwrap();
    let out = recorded_run(dir.path());
    let folder = dir.path().join("ip");
    export(&out, "inference-perf", &folder);
    let read = |f: &str| -> Value {
        serde_json::from_str(&std::fs::read_to_string(folder.join(f)).unwrap()).unwrap()
    };
    let per_request = read("per_request_lifecycle_metrics.json");
    let per_request = per_request.as_array().unwrap();
    assert_eq!(per_request.len(), 110, "the warm-up left out");
    let summary = read("summary_lifecycle_metrics.json");
    let stage = read("stage_0_lifecycle_metrics.json");
    assert_eq!(summary["load_summary"]["count"], 110);
    let ok = per_request.iter().filter(|e| e["error"].is_null()).count();
    assert_eq!(summary["successes"]["count"], ok);
    assert_eq!(summary["failures"]["count"], 110 - ok);
    // The stage's rate: the schedule's, as the trace header records it.
    let t = Trace::read(&out.with_extension("yaml")).unwrap();
    let rate = t.header.load_generator.unwrap().requested_rate.unwrap();
    let said_rate = stage["load_summary"]["requested_rate"].as_f64().unwrap();
    assert!(
        (said_rate - rate).abs() < 1e-9 * rate,
        "{said_rate} vs {rate}"
    );
    for e in per_request {
        let times = e["info"]["response_metrics"]["output_token_times"]
            .as_array()
            .unwrap();
        if e["error"].is_null() {
            assert_eq!(times.len(), 5, "one time per streamed token");
            let m = &e["computed_metrics"];
            let ttft = times[0].as_f64().unwrap() - e["start_time"].as_f64().unwrap();
            assert!((m["time_to_first_token"].as_f64().unwrap() - ttft).abs() < 1e-12);
            assert_eq!(m["inter_token_latencies"].as_array().unwrap().len(), 4);
        } else {
            assert!(e.get("computed_metrics").is_none());
            assert_eq!(e["error"]["error_type"], "http_500");
        }
    }
    // Percentile keys as inference-perf writes them.
    let ttft = &summary["successes"]["latency"]["time_to_first_token"];
    for k in ["mean", "min", "max", "median", "p0.1", "p99", "p99.9"] {
        assert!(ttft[k].is_f64(), "{k}: {ttft}");
    }
    // A chunk file is input: a chunk claiming 4,294,967,295 tokens gives a
    // bounded export, not billions of token times.
    let itl = out.with_extension("itl.csv");
    let text = std::fs::read_to_string(&itl).unwrap();
    // The first chunk of the first measured request that streamed.
    let target = text
        .lines()
        .skip(1)
        .map(|l| l.split(',').collect::<Vec<_>>())
        .find(|f| f[0].parse::<u64>().unwrap() >= 10 && f[1] == "0")
        .map(|f| f[0].to_string())
        .unwrap();
    let hostile: Vec<String> = text
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            if f[0] == target && f[1] == "0" {
                format!("{},{},{},4294967295", f[0], f[1], f[2])
            } else {
                l.to_string()
            }
        })
        .collect();
    std::fs::write(&itl, hostile.join("\n") + "\n").unwrap();
    export(&out, "inference-perf", &folder);
    let per_request = read("per_request_lifecycle_metrics.json");
    for e in per_request.as_array().unwrap() {
        let n = e["info"]["response_metrics"]["output_token_times"]
            .as_array()
            .unwrap()
            .len();
        assert!(n <= 2 * 5, "{n} token times for a 5-token request");
    }
}
