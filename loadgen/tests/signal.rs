//! SIGINT to a real `blis-loadgen` child process (its own test binary:
//! the tests run one at a time for about 20 s and must not compete with
//! other tests). Three outcomes of the grace period:
//! - it expires: sending stops, requests in flight get `--grace-s`, every
//!   completed request is in the CSV, the rest are `cancelled`;
//! - every request in flight finishes inside it (this once panicked with
//!   "async fn resumed after completion");
//! - a second signal cancels the requests in flight at once.
//!
//! In each the bundle reads back cleanly with a completed header, the
//! summary is printed and the exit code says "interrupted".

#[allow(dead_code, reason = "shared with the it test binary")]
#[path = "it/common.rs"]
mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use blis_traces::{Status, Trace};
use common::{MODEL, Mock, s, serial};

/// Starts `blis-loadgen run` against `url` with `args`, sends SIGINT at
/// each of `signals_at` (from the start), and returns its output and how
/// long it took to exit after the first signal.
fn interrupted_run(
    url: &str,
    args: &[&str],
    prefix: &Path,
    signals_at: &[Duration],
) -> (Output, Duration) {
    let child = Command::new(assert_cmd::cargo::cargo_bin!("blis-loadgen"))
        .args(["run", "--server-url", url, "--model", MODEL])
        .args(args)
        .args(["--scrape-interval-ms", "500", "--out", s(prefix)])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let mut first = None;
    for at in signals_at {
        if let Some(left) = at.checked_sub(start.elapsed()) {
            std::thread::sleep(left);
        }
        let killed = Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
        first.get_or_insert_with(Instant::now);
    }
    let out = child.wait_with_output().unwrap();
    (out, first.unwrap().elapsed())
}

/// What every interrupted run promises: exit code 4, the message and the
/// verdict, and a bundle that reads back with every planned request once
/// and a completed header.
fn check_interrupted(out: &Output, prefix: &Path, n: u64) -> Trace {
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(stderr.contains("interrupted: no more sends"), "{stderr}");
    assert!(stdout.contains("verdict: interrupted"), "{stdout}");
    assert!(
        stdout.starts_with("requests: ") && stdout.contains("send lag (ms)"),
        "the summary is printed: {stdout}"
    );
    let t = Trace::read(&prefix.with_extension("yaml")).expect("the bundle reads back");
    assert!(
        t.header.load_generator.is_some(),
        "the header was completed"
    );
    let mut ids: Vec<u64> = t.records.iter().map(|r| r.request.request_id).collect();
    ids.sort_unstable();
    assert_eq!(
        ids,
        (0..n).collect::<Vec<u64>>(),
        "every planned request, once"
    );
    t
}

#[cfg(unix)]
#[test]
fn sigint_halfway_keeps_every_completed_request() {
    let _serial = serial();
    let mock = Mock::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("interrupted");
    let n = 400u64;
    let (out, took) = interrupted_run(
        &mock.url,
        &[
            "--rate",
            "20",
            "--num-requests",
            &n.to_string(),
            "--input-tokens",
            "200",
            "--output-tokens",
            "60",
            "--grace-s",
            "0.3",
        ],
        &prefix,
        &[Duration::from_secs(10)],
    );
    assert!(took < Duration::from_secs(5), "stopped promptly");
    let t = check_interrupted(&out, &prefix, n);

    let served: BTreeMap<String, u32> = mock
        .served()
        .into_iter()
        .map(|s| (s.x_request_id.unwrap(), s.output_tokens))
        .collect();
    let (mut ok, mut cut, mut unsent) = (0, 0, 0);
    let chunks = t.chunks.as_deref().unwrap();
    for r in &t.records {
        let o = &r.outcome;
        let xid = o.x_request_id.as_deref();
        match o.status {
            Some(Status::Ok) => {
                ok += 1;
                assert_eq!(served.get(xid.unwrap()), Some(&r.request.output_tokens));
                let n = chunks
                    .iter()
                    .filter(|c| c.request_id == r.request.request_id)
                    .count();
                assert_eq!(
                    n as u32, r.request.output_tokens,
                    "all chunks of a completed request"
                );
            }
            Some(Status::Cancelled) if o.send_time_us.is_some() => {
                cut += 1;
                assert!(
                    o.error_message
                        .starts_with("cancelled: the run was interrupted")
                );
                assert!(o.num_chunks < r.request.output_tokens);
            }
            Some(Status::Cancelled) => {
                unsent += 1;
                assert!(
                    o.error_message.starts_with("not_sent: "),
                    "{}",
                    o.error_message
                );
                assert!(
                    r.request.arrival_time_us >= 9_000_000,
                    "only the later half is unsent"
                );
            }
            other => panic!("unexpected status {other:?}: {}", o.error_message),
        }
    }
    // Everything the server completed is recorded as completed.
    let ok_xids: Vec<&str> = t
        .records
        .iter()
        .filter(|r| r.outcome.status == Some(Status::Ok))
        .filter_map(|r| r.outcome.x_request_id.as_deref())
        .collect();
    assert_eq!(
        ok_xids.len(),
        served.len(),
        "served {} vs ok {}",
        served.len(),
        ok
    );
    eprintln!("{ok} ok, {cut} cut short, {unsent} never sent");
    assert!(
        ok >= 120 && cut >= 1 && unsent >= 150,
        "{ok} {cut} {unsent}"
    );
}

#[cfg(unix)]
#[test]
fn requests_that_finish_inside_the_grace_period_end_the_run_cleanly() {
    let _serial = serial();
    let mock = Mock::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("graceful");
    // 20 req/s of ~0.35 s requests: about 7 in flight at the signal, all
    // done well inside the 20 s grace.
    let n = 200u64;
    let (out, took) = interrupted_run(
        &mock.url,
        &[
            "--rate",
            "20",
            "--num-requests",
            &n.to_string(),
            "--output-tokens",
            "50",
            "--grace-s",
            "20",
        ],
        &prefix,
        &[Duration::from_secs(3)],
    );
    assert!(
        took < Duration::from_secs(15),
        "the run ends when its requests do, not at the end of the grace ({took:?})"
    );
    let t = check_interrupted(&out, &prefix, n);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("waiting up to 20.0 s"), "{stderr}");
    let served = mock.served().len();
    let (mut ok, mut unsent) = (0, 0);
    for r in &t.records {
        let o = &r.outcome;
        match o.status {
            Some(Status::Ok) => ok += 1,
            Some(Status::Cancelled) if o.send_time_us.is_none() => {
                assert!(
                    o.error_message.starts_with("not_sent: "),
                    "{}",
                    o.error_message
                );
                unsent += 1;
            }
            other => panic!(
                "request {}: {other:?} {}: every request sent finishes inside the grace",
                r.request.request_id, o.error_message
            ),
        }
    }
    assert_eq!(ok, served, "every request the server served is ok");
    assert!(ok >= 20 && unsent >= 100, "{ok} ok, {unsent} never sent");
}

#[cfg(unix)]
#[test]
fn a_second_signal_cancels_the_requests_in_flight() {
    let _serial = serial();
    let mock = Mock::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("twice");
    // 2,000-token outputs take ~15 s: every request sent is still in
    // flight at the second signal, a second after the first.
    let n = 40u64;
    let (out, took) = interrupted_run(
        &mock.url,
        &[
            "--rate",
            "4",
            "--num-requests",
            &n.to_string(),
            "--output-tokens",
            "2000",
            "--grace-s",
            "120",
        ],
        &prefix,
        &[Duration::from_secs(2), Duration::from_secs(3)],
    );
    assert!(
        took < Duration::from_secs(30),
        "the second signal ends the grace period ({took:?})"
    );
    let t = check_interrupted(&out, &prefix, n);
    let (mut cut, mut unsent) = (0, 0);
    for r in &t.records {
        let o = &r.outcome;
        match o.status {
            Some(Status::Cancelled) if o.send_time_us.is_some() => {
                assert!(
                    o.error_message
                        .starts_with("cancelled: the run was interrupted"),
                    "{}",
                    o.error_message
                );
                assert!(o.num_chunks < r.request.output_tokens);
                cut += 1;
            }
            Some(Status::Cancelled) => unsent += 1,
            other => panic!(
                "request {}: {other:?} {}",
                r.request.request_id, o.error_message
            ),
        }
    }
    assert!(
        cut >= 3 && unsent >= 25,
        "{cut} cut short, {unsent} never sent"
    );
}

/// kill -9 halfway (issue 17 item 2): the files on disk read back (a
/// partly written last line dropped with a warning), every request the
/// server finished more than a recorder period (10 ms) before the kill is
/// in them, and `blis-loadgen check` says what is missing. The margin
/// allowed is 250 ms: the client's own lag from the server's last chunk to
/// the recorder's queue on a busy 2-core machine (measured: at most 7 ms, also with a build running beside it).
#[cfg(unix)]
#[test]
fn kill_9_halfway_keeps_what_completed_before_it() {
    let _serial = serial();
    let mock = Mock::start(&["--time-scale", "4"]);
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("killed");
    let n = 3000u64;
    let mut child = Command::new(assert_cmd::cargo::cargo_bin!("blis-loadgen"))
        .args(["run", "--server-url", &mock.url, "--model", MODEL])
        .args(["--rate", "200", "--num-requests", &n.to_string()])
        .args(["--input-tokens", "100", "--output-tokens", "30"])
        .args(["--scrape-interval-ms", "200", "--out", s(&prefix)])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(4));
    let now_us = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_micros() as i64
    };
    let kill_us = now_us();
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();

    let t = Trace::read(&prefix.with_extension("yaml")).expect("a killed run reads back");
    assert!(
        t.header.incomplete,
        "the header says the run did not finish"
    );
    assert_eq!(t.header.planned_requests, Some(n));
    let rows: BTreeMap<String, &blis_traces::TraceRecord> = t
        .records
        .iter()
        .filter_map(|r| Some((r.outcome.x_request_id.clone()?, r)))
        .collect();
    assert!(rows.len() > 100, "it ran for a while: {} rows", rows.len());
    let chunks = t.chunks.as_deref().unwrap();
    let mut latest_missing: Option<i64> = None;
    for sv in mock.served() {
        let end = sv.received_unix_us + sv.e2e_us;
        let Some(r) = rows.get(sv.x_request_id.as_deref().unwrap()) else {
            latest_missing = latest_missing.max(Some(kill_us - end));
            continue;
        };
        assert_eq!(r.outcome.status, Some(Status::Ok));
        let got = chunks
            .iter()
            .filter(|c| c.request_id == r.request.request_id)
            .count();
        // (The last row's chunks may be cut by the kill.)
        if end < kill_us - 250_000 {
            assert_eq!(got as u32, sv.chunks, "its chunks are all there");
        }
    }
    // Served but not recorded: only in the last moments before the kill.
    eprintln!(
        "kill -9: {} rows; the earliest served request not recorded ended {:?} µs before the kill",
        rows.len(),
        latest_missing
    );
    if let Some(gap) = latest_missing {
        assert!(
            gap < 250_000,
            "a request served {gap} µs before the kill is not in the trace"
        );
    }
    let out = Command::new(assert_cmd::cargo::cargo_bin!("blis-loadgen"))
        .args(["check", s(&prefix)])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(6), "{stdout}");
    assert!(stdout.contains("cut off"), "{stdout}");
    assert!(
        stdout.contains(&format!(
            "missing {} planned requests",
            n - t.records.len() as u64
        )),
        "{stdout}"
    );
}

/// The server goes away and comes back (issue 17 item 3): the mock is
/// killed 2 s into a 6 s run and started again on the same port 1.5 s
/// later. The requests in flight then, and those sent while it is down,
/// are `error` rows of a connection kind (`dropped`, `connect`); those
/// sent after it is back succeed; the scraper records the gap (`up` 0)
/// and the run completes with every planned request.
#[cfg(unix)]
#[test]
fn the_server_killed_and_restarted_mid_run_costs_only_the_requests_of_the_gap() {
    let _serial = serial();
    let mock = Mock::start(&["--time-scale", "4"]);
    let port = mock.port().to_string();
    let url = mock.url.clone();
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("restart");
    let n = 600u64;
    let child = Command::new(assert_cmd::cargo::cargo_bin!("blis-loadgen"))
        .args(["run", "--server-url", &url, "--model", MODEL])
        .args(["--rate", "100", "--num-requests", &n.to_string()])
        .args(["--input-tokens", "100", "--output-tokens", "30"])
        .args(["--max-error-rate", "1", "--timeout-s", "10"])
        .args(["--scrape-interval-ms", "100", "--out", s(&prefix)])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    std::thread::sleep(Duration::from_secs(2));
    mock.kill();
    std::thread::sleep(Duration::from_millis(1500));
    let back = Mock::start(&["--time-scale", "4", "--port", &port]);
    let back_after = start.elapsed();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    drop(back);

    let t = Trace::read(&prefix.with_extension("yaml")).expect("the bundle reads back");
    assert!(!t.header.incomplete);
    assert_eq!(t.records.len() as u64, n, "every planned request is a row");
    let run_start = t.header.run_start_unix_us.unwrap();
    let (mut ok_after, mut failed) = (0, 0);
    for r in &t.records {
        let o = &r.outcome;
        let sent = o.send_time_us.map(|t| t - run_start);
        match o.status {
            Some(Status::Ok) => {
                if sent.is_some_and(|t| t > back_after.as_micros() as i64 + 500_000) {
                    ok_after += 1;
                }
            }
            Some(Status::Error) => {
                failed += 1;
                let kind = o.error_message.split(':').next().unwrap();
                assert!(
                    ["dropped", "connect"].contains(&kind),
                    "a connection error kind: {}",
                    o.error_message
                );
            }
            other => panic!("unexpected status {other:?}: {}", o.error_message),
        }
    }
    eprintln!(
        "restart: {failed} of {n} failed in the gap, {ok_after} ok after the restart, server back {back_after:?} into the run"
    );
    assert!(failed > 0, "the requests of the gap failed");
    assert!(
        ok_after > 100,
        "those sent after the restart succeed: {ok_after}"
    );
    // The scraper's record of the gap: `up` 0 while down, 1 before and after.
    let up: Vec<f64> = t
        .metrics
        .as_deref()
        .unwrap()
        .iter()
        .filter(|m| m.name == "up")
        .map(|m| m.value)
        .collect();
    let first_down = up.iter().position(|v| *v == 0.0).expect("a failed scrape");
    assert!(up[..first_down].iter().all(|v| *v == 1.0));
    assert_eq!(up.last(), Some(&1.0), "scraping resumed: {up:?}");
}

/// A signal while the probes wait on a server that takes requests and
/// never answers ends the command there (it used to be ignored until the
/// probes gave up, over a minute at the default timeout): exit code 4, a
/// line saying nothing was sent, and no trace.
#[test]
fn a_signal_while_probing_a_server_that_never_answers_ends_the_command() {
    let _g = serial();
    let (url, posted) = common::start_http_server(true);
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("probing");
    let child = Command::new(assert_cmd::cargo::cargo_bin!("blis-loadgen"))
        .args(["run", "--server-url", &url, "--model", MODEL])
        .args(["--rate", "5", "--num-requests", "3"])
        .args(["--scrape-interval-ms", "0", "--out", s(&prefix)])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The first POST is a probe (`/tokenize`): the handlers are installed.
    posted.recv_timeout(Duration::from_secs(60)).unwrap();
    let signalled = Instant::now();
    let killed = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(
        stderr.contains("interrupted while probing") && stderr.contains("nothing was sent"),
        "{stderr}"
    );
    // The probes alone would have waited 10 s per /tokenize form and 60 s
    // for the calibration request.
    assert!(
        signalled.elapsed() < Duration::from_secs(8),
        "{:?}",
        signalled.elapsed()
    );
    assert!(!prefix.with_extension("yaml").exists());
}
