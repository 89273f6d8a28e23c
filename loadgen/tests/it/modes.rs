use blis_traces::{Status, Trace, TraceRecord};
use serde_json::Value;

use crate::common::{MODEL, Mock, loadgen, s, serial};

/// The largest number of requests in flight at once (send to last byte).
fn max_overlap(rows: &[TraceRecord]) -> usize {
    let mut ev: Vec<(i64, i32)> = Vec::new();
    for r in rows {
        ev.push((r.outcome.send_time_us.unwrap(), 1));
        ev.push((r.outcome.last_chunk_time_us.unwrap(), -1));
    }
    ev.sort_unstable();
    let (mut cur, mut max) = (0i32, 0i32);
    for (_, d) in ev {
        cur += d;
        max = max.max(cur);
    }
    max as usize
}

fn run(mock: &Mock, extra: &[&str]) -> (Trace, Value) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t");
    let mut args = vec![
        "run",
        "--server-url",
        &mock.url,
        "--model",
        MODEL,
        "--scrape-interval-ms",
        "0",
        "--json",
        "--out",
        s(&out),
    ];
    if extra.contains(&"--rate") {
        args.extend(["--input-tokens", "64", "--output-tokens", "10"]);
    }
    args.extend_from_slice(extra);
    let (code, stdout) = loadgen(&args).unwrap();
    assert_eq!(code, 0, "{stdout}");
    (
        Trace::read(&out.with_extension("yaml")).unwrap(),
        serde_json::from_str(&stdout).unwrap(),
    )
}

#[test]
fn closed_loop_users_send_when_their_last_response_ends() {
    let _g = serial();
    let mock = Mock::start(&[]);
    let (t, summary) = run(
        &mock,
        &["--rate", "1", "--num-requests", "40", "--concurrency", "4"],
    );
    assert_eq!(t.records.len(), 40);
    assert!(
        t.records
            .iter()
            .all(|r| r.outcome.status == Some(Status::Ok))
    );
    assert_eq!(max_overlap(&t.records), 4, "exactly N users in flight");
    // Arrival times are ignored: 40 requests at "1 req/s" take far less
    // than 40 s, and the closed loop has no planned rate.
    let start = t.header.run_start_unix_us.unwrap();
    let last = t
        .records
        .iter()
        .map(|r| r.outcome.last_chunk_time_us.unwrap())
        .max()
        .unwrap();
    assert!(last - start < 5_000_000);
    assert!(summary["schedule"]["requested_rate"].is_null());
    assert_eq!(summary["verdict"], "valid");
}

#[test]
fn max_in_flight_caps_concurrency_and_shows_as_send_lag() {
    let _g = serial();
    let mock = Mock::start(&[]);
    let (t, summary) = run(
        &mock,
        &[
            "--rate",
            "200",
            "--num-requests",
            "60",
            "--max-in-flight",
            "2",
            "--max-send-lag-ms",
            "5",
        ],
    );
    assert_eq!(t.records.len(), 60);
    assert!(max_overlap(&t.records) <= 2);
    // 200 req/s of ~80 ms requests through 2 slots cannot keep up: the
    // waits are send lag, and the verdict says the client set the pace.
    assert!(summary["schedule"]["send_lag_p99_ms"].as_f64().unwrap() > 100.0);
    assert_eq!(summary["schedule"]["client_bound"], true);
}

/// `--rate inf` (`vllm bench serve`'s default): every request due at the
/// start, all sent (never held or stopped for being behind), capped by
/// `--max-in-flight`; the send lag is the wait for a slot, and the run is
/// not client-bound for it.
#[test]
fn rate_inf_sends_every_request_at_once_up_to_max_in_flight() {
    let _g = serial();
    let mock = Mock::start(&[]);
    let (t, summary) = run(
        &mock,
        &[
            "--rate",
            "inf",
            "--num-requests",
            "60",
            "--max-in-flight",
            "3",
            "--max-behind-s",
            "0.05",
        ],
    );
    assert_eq!(t.records.len(), 60);
    assert!(
        t.records
            .iter()
            .all(|r| r.request.arrival_time_us == 0 && r.outcome.status == Some(Status::Ok)),
        "every request planned at 0 and answered"
    );
    assert_eq!(max_overlap(&t.records), 3, "the cap binds, and only it");
    assert!(summary["schedule"]["send_lag_p99_ms"].as_f64().unwrap() > 100.0);
    assert_eq!(summary["schedule"]["burst"], true);
    assert_eq!(summary["schedule"]["client_bound"], false);
    assert!(summary["schedule"]["requested_rate"].is_null());
    assert_eq!(summary["verdict"], "valid");
    assert_eq!(
        t.header.workload_spec.as_deref(),
        Some("synthetic: all at once (--rate inf), input 64, output 10")
    );
}

#[test]
fn rate_inf_needs_a_count_and_no_duration() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x");
    for extra in [
        &["--horizon-s", "5"][..],
        &["--horizon-s", "5", "--num-requests", "9"],
        &[],
    ] {
        let mut args = vec!["generate", "--rate", "inf", "--out", s(&out)];
        args.extend_from_slice(extra);
        let e = format!("{:#}", loadgen(&args).unwrap_err());
        assert!(
            e.contains("--rate inf sends every request at the start: give --num-requests"),
            "{e}"
        );
    }
}

#[test]
fn duration_warmup_and_slo_goodput() {
    let _g = serial();
    let mock = Mock::start(&[]);
    let (t, summary) = run(
        &mock,
        &[
            "--rate",
            "40",
            "--duration-s",
            "1",
            "--warmup-requests",
            "5",
            "--slo",
            "ttft_ms=10000,e2e_ms=0.001",
        ],
    );
    let n = t.records.len();
    assert!((20..=60).contains(&n), "{n} requests in 1 s at 40 req/s");
    assert!(
        t.records
            .iter()
            .all(|r| r.request.arrival_time_us < 1_000_000)
    );
    assert_eq!(t.header.warm_up_requests, 5);
    let req = &summary["requests"];
    assert_eq!(req["warmup"], 5);
    assert_eq!(
        summary["latency_ms"]["e2e"]["n"].as_u64().unwrap() as usize,
        n - 5
    );
    // An impossible E2E bound: nothing attains the SLO.
    let g = &summary["goodput"];
    assert_eq!(
        (g["attained"].as_u64(), g["attainment"].as_f64()),
        (Some(0), Some(0.0))
    );
}

#[test]
fn a_recorded_trace_is_sent_again_with_the_server_counts_as_plan() {
    let _g = serial();
    let mock = Mock::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let first = dir.path().join("first");
    let (code, _) = loadgen(&[
        "run",
        "--server-url",
        &mock.url,
        "--model",
        MODEL,
        "--rate",
        "50",
        "--num-requests",
        "15",
        "--input-tokens",
        "uniform:50,300",
        "--output-tokens",
        "5",
        "--scrape-interval-ms",
        "0",
        "--out",
        s(&first),
    ])
    .unwrap();
    assert_eq!(code, 0);
    let a = Trace::read(&first.with_extension("yaml")).unwrap();
    let (b, _) = run(&mock, &["--trace", s(&first.with_extension("yaml"))]);
    let key = |t: &Trace| {
        let mut v: Vec<(u64, i64)> = t
            .records
            .iter()
            .map(|r| (r.request.request_id, r.request.arrival_time_us))
            .collect();
        v.sort_unstable();
        v
    };
    assert_eq!(key(&a), key(&b), "same requests on the same schedule");
    for r in &b.records {
        let orig = a
            .records
            .iter()
            .find(|o| o.request.request_id == r.request.request_id)
            .unwrap();
        assert_eq!(
            Some(r.request.input_tokens),
            orig.outcome.server_input_tokens
        );
        assert_eq!(r.outcome.status, Some(Status::Ok));
    }
}

/// A rate the client cannot send (a million requests a second): it stops
/// once it is `--max-behind-s` behind, records the rest as not sent, and
/// says client-bound at once instead of taking several times the run.
#[test]
fn a_client_that_falls_behind_stops_and_says_client_bound() {
    let _g = serial();
    let mock = Mock::start(&["--time-scale", "1000"]);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("behind");
    let (code, stdout) = loadgen(&[
        "run",
        "--server-url",
        &mock.url,
        "--model",
        MODEL,
        "--rate",
        "1000000",
        "--num-requests",
        "50000",
        "--input-tokens",
        "8",
        "--output-tokens",
        "2",
        "--max-behind-s",
        "0.05",
        "--scrape-interval-ms",
        "0",
        "--strict",
        "--json",
        "--out",
        s(&out),
    ])
    .unwrap();
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(code, 3, "client-bound with --strict: {}", v["verdict"]);
    let verdict = v["verdict"].as_str().unwrap();
    assert!(
        verdict.starts_with("client-bound: the client fell"),
        "{verdict}"
    );
    assert!(v["stopped_behind_s"].as_f64().unwrap() > 0.05);
    let sent = v["requests"]["sent"].as_u64().unwrap();
    assert!(sent < 50_000, "stopped early: {sent} sent");
    assert_eq!(v["errors"]["not_sent"].as_u64(), Some(50_000 - sent));
    let t = blis_traces::Trace::read(&out.with_extension("yaml")).unwrap();
    assert_eq!(t.records.len(), 50_000, "every planned request is a row");
}

/// A client behind its schedule (a million requests a second, and a
/// `--max-send-lag-ms` of 1 µs so that every send but the first counts as
/// late) starts a request only when one ends: at most 256 in flight
/// instead of the whole plan at once, and every request still sent and
/// answered when `--max-behind-s 0` never stops it.
#[test]
fn a_client_behind_its_schedule_holds_what_it_has_in_flight() {
    let _g = serial();
    let mock = Mock::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("held");
    let (code, stdout) = loadgen(&[
        "run",
        "--server-url",
        &mock.url,
        "--model",
        MODEL,
        "--rate",
        "1000000",
        "--num-requests",
        "600",
        "--input-tokens",
        "8",
        "--output-tokens",
        "40",
        "--max-send-lag-ms",
        "0.001",
        "--max-behind-s",
        "0",
        "--scrape-interval-ms",
        "0",
        "--json",
        "--out",
        s(&out),
    ])
    .unwrap();
    assert_eq!(code, 0, "{stdout}");
    let v: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["schedule"]["client_bound"], true);
    let t = Trace::read(&out.with_extension("yaml")).unwrap();
    assert_eq!(t.records.len(), 600);
    assert!(
        t.records
            .iter()
            .all(|r| r.outcome.status == Some(Status::Ok))
    );
    let overlap = max_overlap(&t.records);
    assert!(overlap <= 256, "held at 256 in flight, saw {overlap}");
}
