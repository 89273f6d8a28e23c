use std::collections::BTreeMap;

use blis_traces::{Mode, Status, Trace, TraceRecord};
use serde_json::Value;

use crate::common::{MODEL, Mock, loadgen, s, serial, write};

const SPEC: &str = "
category: reasoning
seed: 7
aggregate_rate: 25
num_requests: 120
clients:
  - id: chat
    rate_fraction: 0.6
    streaming: true
    prefix_group: sys
    prefix_length: 64
    input_distribution: {type: gaussian, params: {mean: 200, std_dev: 60, min: 20, max: 600}}
    output_distribution: {type: empirical, pmf: {4: 0.3, 12: 0.4, 30: 0.3}}
    reasoning:
      reason_ratio_distribution: {type: empirical, pmf: {0.0: 1.0}}
  - id: agent
    rate_fraction: 0.4
    streaming: true
    input_distribution: {type: constant, params: {value: 120}}
    output_distribution: {type: constant, params: {value: 16}}
    reasoning:
      reason_ratio_distribution: {type: empirical, pmf: {0.0: 1.0}}
      multi_turn: {max_rounds: 3, think_time_us: 50000, context_growth: accumulate}
";

fn by_id(t: &Trace) -> BTreeMap<u64, &TraceRecord> {
    let mut m = BTreeMap::new();
    for r in &t.records {
        assert!(
            m.insert(r.request.request_id, r).is_none(),
            "request {} appears twice",
            r.request.request_id
        );
    }
    m
}

/// Acceptance 1: every request of a spec once, one chunk per token, TTFT
/// and E2E as the mock served them (never earlier, median within 1 ms,
/// three in four within 2 ms), usage, sessions in order with the real
/// answers, metrics at the scrape interval.
#[test]
fn a_spec_is_observed_exactly_as_the_mock_served_it() {
    let _g = serial();
    let mock = Mock::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let spec = write(dir.path(), "w.yaml", SPEC);
    let out = dir.path().join("real");
    let plan = dir.path().join("plan");
    let (code, _) = loadgen(&["generate", "--workload-spec", s(&spec), "--out", s(&plan)]).unwrap();
    assert_eq!(code, 0);
    let planned = Trace::read(&plan.with_extension("yaml")).unwrap();
    let (code, stdout) = loadgen(&[
        "run",
        "--server-url",
        &mock.url,
        "--model",
        MODEL,
        "--api",
        "chat",
        "--workload-spec",
        s(&spec),
        "--scrape-interval-ms",
        "100",
        "--json",
        "--out",
        s(&out),
    ])
    .unwrap();
    assert_eq!(code, 0, "{stdout}");
    let summary: Value = serde_json::from_str(&stdout).unwrap();
    // The verdict follows the measured lag (a loaded machine may make the
    // client late; then the run must say so).
    let p99 = summary["schedule"]["send_lag_p99_ms"].as_f64().unwrap();
    let verdict = summary["verdict"].as_str().unwrap();
    assert_eq!(verdict == "valid", p99 <= 10.0, "{verdict}");

    let t = Trace::read(&out.with_extension("yaml")).unwrap();
    assert_eq!(t.header.mode, Mode::Real);
    let run_start = t.header.run_start_unix_us.expect("run start recorded");
    let lg = t.header.load_generator.as_ref().unwrap();
    assert_eq!(lg.client_bound, Some(p99 > 10.0));
    assert!((lg.send_lag_p99_ms.unwrap() - p99).abs() < 1e-9);
    let server = t.header.server.as_ref().unwrap();
    assert_eq!(
        (server.block_size, server.total_kv_blocks),
        (Some(16), Some(29205))
    );

    // Every planned request exactly once, with its plan.
    let rows = by_id(&t);
    let plan_rows = by_id(&planned);
    assert_eq!(
        rows.keys().collect::<Vec<_>>(),
        plan_rows.keys().collect::<Vec<_>>()
    );
    assert_eq!(summary["requests"]["ok"], rows.len() as u64);

    // One chunk per token; usage recorded; chunk rows match.
    let mut chunks: BTreeMap<u64, Vec<i64>> = BTreeMap::new();
    for c in t.chunks.as_deref().unwrap() {
        assert_eq!(c.tokens, Some(1), "one token per chunk");
        chunks.entry(c.request_id).or_default().push(c.timestamp_us);
    }
    let mut cached = 0;
    for (id, r) in &rows {
        let o = &r.outcome;
        assert_eq!(o.status, Some(Status::Ok), "{id}: {}", o.error_message);
        assert_eq!(
            r.request.output_tokens, plan_rows[id].request.output_tokens,
            "{id}"
        );
        assert_eq!(o.num_chunks, r.request.output_tokens, "{id}");
        assert_eq!(chunks[id].len() as u32, r.request.output_tokens, "{id}");
        assert_eq!(chunks[id][0], o.first_chunk_time_us.unwrap());
        assert!(o.server_input_tokens.unwrap() > 0);
        assert_eq!(o.finish_reason, "length");
        assert_eq!(o.http_status, Some(200));
        cached += o.cached_tokens.unwrap();
    }
    assert!(
        cached > 0,
        "the shared prefix is served from the prefix cache"
    );

    // TTFT and E2E as the mock served them: never earlier, and late by
    // no more than the delivery through this machine's scheduler. A
    // client that timed a chunk after buffering, parsing or writing it
    // would be late by a token's time or more at every request, which the
    // medians catch; the tail is the machine's (two other busy processes
    // on two cores delay a wake-up by a scheduler slice, 3-6 ms, for a
    // few percent of the chunks and past 10 ms now and then).
    let served: BTreeMap<String, _> = mock
        .served()
        .into_iter()
        .map(|s| (s.x_request_id.clone().unwrap(), s))
        .collect();
    assert_eq!(served.len(), rows.len());
    let (mut ttft_diffs, mut e2e_diffs) = (Vec::new(), Vec::new());
    for r in rows.values() {
        let sv = &served[r.outcome.x_request_id.as_ref().unwrap()];
        let (ttft, e2e) = (r.ttft_us().unwrap(), r.e2e_us().unwrap());
        for (ours, theirs, diffs) in [
            (ttft, sv.ttft_us, &mut ttft_diffs),
            (e2e, sv.e2e_us, &mut e2e_diffs),
        ] {
            assert!(
                ours >= theirs,
                "{}: the client cannot see a chunk before it is sent (loadgen {ours} µs vs mock {theirs} µs)",
                r.request.request_id
            );
            diffs.push((ours - theirs) as f64 / 1e3);
        }
        assert_eq!(sv.output_tokens, r.request.output_tokens);
    }
    for (name, diffs) in [("TTFT", &mut ttft_diffs), ("E2E", &mut e2e_diffs)] {
        diffs.sort_by(f64::total_cmp);
        let over = diffs.iter().filter(|&&d| d > 2.0).count();
        let (median, p90) = (
            blis_traces::percentile(diffs, 50.0),
            blis_traces::percentile(diffs, 90.0),
        );
        eprintln!(
            "loadgen minus mock, {name} (ms): median {median:.3}, p90 {p90:.3}, p99 {:.3}, max {:.3}; {over} of {} over 2 ms",
            blis_traces::percentile(diffs, 99.0),
            diffs[diffs.len() - 1],
            diffs.len()
        );
        // Bounds from the measured spread on this 2-core machine
        // (2026-11-30): with two busy-looping processes beside it, 15
        // runs, medians 0.29-0.46 ms and 1-10 of 120 over 2 ms (35 of 35
        // runs passed); with four, 8 runs, medians 0.41-0.66 ms and 6-24
        // of 120.
        assert!(median <= 1.0, "{name}: median difference {median:.3} ms");
        assert!(
            over * 4 <= diffs.len(),
            "{name}: {over} of {} differences over 2 ms",
            diffs.len()
        );
    }

    // Sessions: each round after the previous response plus the think
    // time, its input carrying the previous round's input and answer.
    let mut sessions: BTreeMap<&str, Vec<&TraceRecord>> = BTreeMap::new();
    for r in rows.values().filter(|r| !r.request.session_id.is_empty()) {
        sessions.entry(&r.request.session_id).or_default().push(r);
    }
    assert!(sessions.len() >= 5);
    for rounds in sessions.values_mut() {
        rounds.sort_by_key(|r| r.request.round_index);
        for w in rounds.windows(2) {
            let (a, b) = (&w[0].outcome, &w[1].outcome);
            assert!(b.send_time_us.unwrap() >= a.last_chunk_time_us.unwrap() + 50_000);
            assert_eq!(
                w[1].request.arrival_time_us,
                a.last_chunk_time_us.unwrap() - run_start + 50_000,
                "the intended send of a later round is the response end plus think time"
            );
            assert!(
                b.server_input_tokens.unwrap()
                    > a.server_input_tokens.unwrap() + w[0].request.output_tokens,
                "round {} carries the conversation",
                w[1].request.round_index
            );
        }
    }

    // Metrics at the scrape interval.
    let mut times: Vec<i64> = t
        .metrics
        .as_deref()
        .unwrap()
        .iter()
        .filter(|m| m.name == "vllm:num_requests_running")
        .map(|m| m.timestamp_us)
        .collect();
    times.sort_unstable();
    let span = (times[times.len() - 1] - times[0]) as f64 / 1e3;
    assert!(times.len() >= 20, "{} scrapes", times.len());
    let mean_gap = span / (times.len() - 1) as f64;
    assert!(
        (90.0..=130.0).contains(&mean_gap),
        "mean scrape gap {mean_gap} ms"
    );
    assert!(
        t.metrics
            .as_deref()
            .unwrap()
            .iter()
            .any(|m| m.name == "vllm:num_requests_running" && m.value > 0.0)
    );
    // The summary says how the scraping went: every sample written counted,
    // no failure, no line skipped.
    let m = &summary["metrics"];
    assert_eq!(
        m["samples"].as_u64(),
        Some(t.metrics.as_deref().unwrap().len() as u64),
        "{m}"
    );
    assert!(m["scrapes"].as_u64().unwrap() >= times.len() as u64, "{m}");
    assert_eq!(
        (m["failed"].as_u64(), m["skipped_lines"].as_u64()),
        (Some(0), Some(0))
    );
    assert!(m.get("first_failure").is_none(), "{m}");
}

#[test]
fn whole_responses_and_completions_are_recorded() {
    let _g = serial();
    let mock = Mock::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("whole");
    let (code, stdout) = loadgen(&[
        "run",
        "--server-url",
        &mock.url,
        "--model",
        MODEL,
        "--rate",
        "40",
        "--num-requests",
        "20",
        "--input-tokens",
        "100",
        "--output-tokens",
        "8",
        "--no-stream",
        "--scrape-interval-ms",
        "0",
        "--out",
        s(&out),
    ])
    .unwrap();
    assert_eq!(code, 0, "{stdout}");
    assert!(stdout.contains("verdict: "), "{stdout}");
    let t = Trace::read(&out.with_extension("yaml")).unwrap();
    assert_eq!(t.records.len(), 20);
    assert!(t.chunks.is_none() && t.metrics.is_none());
    assert!(!stdout.contains("metrics: "), "scraping off: {stdout}");
    assert!(!out.with_extension("itl.csv").exists());
    for r in &t.records {
        assert_eq!(r.outcome.status, Some(Status::Ok));
        assert!(!r.request.streaming);
        assert_eq!((r.outcome.num_chunks, r.request.output_tokens), (1, 8));
        assert_eq!(
            r.outcome.server_input_tokens.map(|n| n.abs_diff(100) <= 10),
            Some(true)
        );
    }
}

/// `blis-mockserver --served-log`: the server's own record of when it
/// wrote each request's first and last token, one JSON line per request,
/// joined to the client's rows by `x-request-id` (the truth a client's
/// TTFT and E2E are judged by). The client sees each token after the
/// server wrote it, and soon after on one host.
#[test]
fn the_served_log_is_the_truth_the_client_is_measured_against() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("served.jsonl");
    let mock = Mock::start(&["--time-scale", "10", "--served-log", s(&log)]);
    let out = dir.path().join("run");
    let (code, _) = loadgen(&[
        "run",
        "--server-url",
        &mock.url,
        "--model",
        MODEL,
        "--rate",
        "40",
        "--num-requests",
        "60",
        "--input-tokens",
        "100",
        "--output-tokens",
        "10",
        "--scrape-interval-ms",
        "0",
        "--out",
        s(&out),
    ])
    .unwrap();
    assert_eq!(code, 0);
    drop(mock); // stops, writing the log out
    let t = Trace::read(&out.with_extension("yaml")).unwrap();
    let lines: Vec<Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // The run's 60 requests (its one-token test request has no x-request-id
    // of the run's form).
    let by_xid: std::collections::BTreeMap<&str, &Value> = lines
        .iter()
        .filter_map(|v| Some((v["x_request_id"].as_str()?, v)))
        .collect();
    let mut late = Vec::new();
    for r in &t.records {
        let v = by_xid[r.outcome.x_request_id.as_deref().unwrap()];
        assert_eq!(
            v["output_tokens"].as_u64(),
            Some(u64::from(r.request.output_tokens))
        );
        let first = v["first_token_unix_us"].as_i64().unwrap();
        let last = v["last_token_unix_us"].as_i64().unwrap();
        let seen_first = r.outcome.first_chunk_time_us.unwrap();
        let seen_last = r.outcome.last_chunk_time_us.unwrap();
        // One host, one wall clock: seen after written (1 ms of slack for
        // the two clocks' readings).
        assert!(seen_first >= first - 1_000, "{seen_first} < {first}");
        assert!(seen_last >= last - 1_000, "{seen_last} < {last}");
        late.push(seen_first - first);
    }
    late.sort_unstable();
    assert!(
        late[late.len() / 2] < 20_000,
        "median {} µs",
        late[late.len() / 2]
    );
}
