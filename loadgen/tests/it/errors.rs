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

/// A server that accepts connections and never answers: named as such
/// (not as unreachable), after waiting no longer than the run's own
/// `--timeout-s` (the probes waited a fixed 10 s each, then 5 s more).
#[test]
fn a_server_that_never_answers_is_named_within_the_run_timeout() {
    let _g = crate::common::serial();
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    std::thread::spawn(move || {
        let mut open = Vec::new();
        for c in l.incoming() {
            let Ok(c) = c else { return };
            open.push(c);
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let t = std::time::Instant::now();
    let out = loadgen()
        .args([
            "run",
            "--server-url",
            &url,
            "--model",
            "m",
            "--timeout-s",
            "2",
        ])
        .args(["--rate", "1", "--num-requests", "1", "--out"])
        .arg(dir.path().join("x"))
        .output()
        .unwrap();
    let waited = t.elapsed().as_secs_f64();
    assert_eq!(out.status.code(), Some(1));
    let e = one_line_error(&out);
    assert_eq!(
        e,
        format!(
            "error: the server at {url} accepted a connection but did not answer GET {url}/v1/models within 2.0 s: a wedged server, or one too loaded to answer (see --timeout-s)"
        )
    );
    // One wait of 2 s (the old probes took 15 s here).
    assert!(waited < 9.0, "{waited} s");
}

/// A server that answers with a redirect to a place that fails: the error
/// names where it was sent (the failure is not the first server's), and a
/// redirect loop is named as one.
#[test]
fn a_redirect_that_fails_names_where_it_went() {
    let _g = crate::common::serial();
    let redirecting = |to: Option<&'static str>| {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(mut c) = c else { return };
                use std::io::{Read, Write};
                let mut buf = [0u8; 4096];
                let _ = c.read(&mut buf);
                // No `to`: back to the same path (a loop).
                let loc = to.unwrap_or("/v1/models");
                let _ = write!(
                    c,
                    "HTTP/1.1 301 Moved\r\nLocation: {loc}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                );
            }
        });
        url
    };
    let dir = tempfile::tempdir().unwrap();
    for (to, words) in [
        (
            Some("http://127.0.0.1:9/v1/models"),
            "redirects to http://127.0.0.1:9/v1/models, which fails: ",
        ),
        (None, "/v1/models, which fails: error following redirect"),
    ] {
        let url = redirecting(to);
        let out = loadgen()
            .args(["run", "--server-url", &url, "--model", "m"])
            .args(["--rate", "1", "--num-requests", "1", "--out"])
            .arg(dir.path().join("x"))
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1));
        let e = one_line_error(&out);
        assert!(
            e.starts_with(&format!(
                "error: cannot reach the server at {url}: its {url}/v1/models redirects to "
            )),
            "{e}"
        );
        assert!(e.contains(words), "{e}");
    }
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
        ("--slo", "itl=3", "--slo: unknown key"),
        (
            "--output-tokens",
            "gaussian:5",
            "--output-tokens: gaussian:MEAN,STD",
        ),
        // A negative number is a value, not an unknown flag.
        (
            "--rate",
            "-5",
            "--rate must be a positive number of requests/s (or inf: every request at the start), got -5",
        ),
        ("--timeout-s", "-1", "--timeout-s must be a positive"),
        // Accepted and ignored before: a NaN never stops the sender.
        (
            "--max-behind-s",
            "NaN",
            "--max-behind-s must be a non-negative number of seconds",
        ),
        // Named the spec's horizon before.
        (
            "--duration-s",
            "1e300",
            "--duration-s must be a positive number of seconds up to 2^53 µs",
        ),
        // Aborted the process before: the OS refused the runtime's threads.
        (
            "--client-threads",
            "100000",
            "--client-threads 100000: at most 1024",
        ),
        // Aborted the process before (a 4.8 GB PMF), or took seconds to
        // fail on the spec's YAML budget.
        (
            "--input-tokens",
            "uniform:0,200000000",
            "--input-tokens: uniform:0,200000000 spans 200000001 values, more than the 100000 it may",
        ),
        // Named a spec line the user never wrote before.
        (
            "--input-tokens",
            "4294967296",
            "--input-tokens: 4294967296 is beyond any model's context: at most 1e9 tokens",
        ),
    ] {
        let out = loadgen()
            .args(["run", "--server-url", "http://127.0.0.1:9", "--model", "m"])
            .args(["--num-requests", "1", flag, value, "--out"])
            .arg(dir.path().join("x"))
            .args(if flag == "--rate" {
                vec![]
            } else {
                vec!["--rate", "1"]
            })
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{flag}");
        let e = one_line_error(&out);
        assert!(e.contains(needle), "{flag}: {e}");
    }
}

/// A password in `--server-url` (`http://user:PASS@host`, sent as HTTP
/// basic auth) is shown as `***` in every message, and a scheme in
/// capitals is read as it is meant.
#[test]
fn a_password_in_the_server_url_is_never_shown() {
    let _g = crate::common::serial();
    let dir = tempfile::tempdir().unwrap();
    let secret = "hunter2-0815";
    // Unreachable: the error names the server without the password.
    // One request to `url` asking for `model`, written at DIR/`out`.
    let run = |url: String, model: &str, out: &str| {
        loadgen()
            .args(["run", "--server-url", &url, "--model", model])
            .args(["--rate", "1", "--num-requests", "1", "--out"])
            .arg(dir.path().join(out))
            .output()
            .unwrap()
    };
    let out = run(format!("http://ops:{secret}@127.0.0.1:9/v1"), "m", "x");
    assert_eq!(out.status.code(), Some(1));
    let e = one_line_error(&out);
    assert!(
        e.contains("cannot reach the server at http://ops:***@127.0.0.1:9"),
        "{e}"
    );
    let all = format!("{}{}", s8(&out.stdout), s8(&out.stderr));
    assert!(!all.contains(secret), "{all}");
    // A server that refuses the credentials: the same.
    let mock = Mock::start(&["--api-key", "sk-other"]);
    let port = mock.url.rsplit(':').next().unwrap().to_string();
    let out = run(format!("http://ops:{secret}@127.0.0.1:{port}"), MODEL, "y");
    assert_eq!(out.status.code(), Some(1));
    let e = one_line_error(&out);
    assert!(e.contains("refused the API key"), "{e}");
    let all = format!("{}{}", s8(&out.stdout), s8(&out.stderr));
    assert!(!all.contains(secret), "{all}");
    // An open server, reached through `HTTP://` with the credentials: the
    // run completes, and nothing it prints or writes holds the password.
    let open = Mock::start(&[]);
    let port = open.url.rsplit(':').next().unwrap().to_string();
    let prefix = dir.path().join("z");
    let out = loadgen()
        .args(["run", "--server-url"])
        .arg(format!("HTTP://ops:{secret}@127.0.0.1:{port}/v1"))
        .args(["--model", MODEL, "--rate", "20", "--num-requests", "3"])
        .args(["--output-tokens", "2", "--out", s(&prefix)])
        .output()
        .unwrap();
    let all = format!("{}{}", s8(&out.stdout), s8(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{all}");
    assert!(all.contains("http://ops:***@127.0.0.1"), "{all}");
    assert!(!all.contains(secret), "{all}");
    let t = Trace::read(&prefix.with_extension("yaml")).unwrap();
    assert_eq!(t.records.len(), 3);
    assert!(
        t.records
            .iter()
            .all(|r| r.outcome.status == Some(Status::Ok))
    );
    for f in std::fs::read_dir(dir.path()).unwrap() {
        let text = std::fs::read(f.unwrap().path()).unwrap();
        assert!(!s8(&text).contains(secret));
    }
}

fn s8(b: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(b)
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

/// A server that is not OpenAI-compatible, answering like
/// `python3 -m http.server`: GET gets a 404 page, POST a 501 page (HTML).
fn start_static_file_server() -> String {
    crate::common::start_http_server(false).0
}

#[test]
fn a_server_that_is_not_openai_compatible_fails_the_run() {
    let _g = crate::common::serial();
    let url = start_static_file_server();
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("static");
    let out = loadgen()
        .args(["run", "--server-url", &url, "--model", "m"])
        .args(["--rate", "20", "--num-requests", "20", "--out", s(&prefix)])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("verdict: failed: all 20 requests that got an answer failed (http_501 20)"),
        "{stdout}"
    );
    assert!(stdout.contains("is it OpenAI-compatible?"), "{stdout}");
    assert!(
        stderr.contains("warning: a one-token test request") && stderr.contains("http_501"),
        "warned before the run: {stderr}"
    );
    // The trace is complete, and holds a short line of the error page's
    // text, not the page.
    let t = Trace::read(&prefix.with_extension("yaml")).unwrap();
    assert_eq!(t.records.len(), 20);
    assert!(t.header.load_generator.is_some());
    for r in &t.records {
        let m = &r.outcome.error_message;
        assert_eq!(r.outcome.status, Some(Status::Error));
        assert!(
            m.starts_with("http_501: HTTP 501 Not Implemented: Error response Error code: 501 Message: Unsupported method ('POST')."),
            "{m}"
        );
        assert!(!m.contains('<') && m.chars().count() < 260, "{m}");
    }
}

/// `blis-loadgen run` of 3 requests at 20 req/s against `url`, without
/// scraping, with `--timeout-s timeout_s`, writing at `prefix`.
fn three_requests(url: &str, prefix: &std::path::Path, timeout_s: &str) -> std::process::Output {
    loadgen()
        .args(["run", "--server-url", url, "--model", "m"])
        .args([
            "--rate",
            "20",
            "--num-requests",
            "3",
            "--timeout-s",
            timeout_s,
        ])
        .args(["--scrape-interval-ms", "0", "--out", s(prefix)])
        .output()
        .unwrap()
}

/// Three requests to a hand-written server answering `reply`, written at
/// `dir/name`: the command's output and the trace.
fn three_requests_to(
    reply: crate::common::PostReply,
    dir: &std::path::Path,
    name: &str,
) -> (std::process::Output, Trace) {
    let (url, _posts) = crate::common::start_server_replying(reply);
    let prefix = dir.join(name);
    let out = three_requests(&url, &prefix, "5");
    let t = Trace::read(&prefix.with_extension("yaml")).unwrap();
    (out, t)
}

/// Three requests to a server answering each with the event stream `body`,
/// written at `dir/name`: the exit code, standard output and the trace.
fn three_streams(
    dir: &std::path::Path,
    name: &str,
    body: &'static str,
) -> (Option<i32>, String, Trace) {
    let reply = crate::common::PostReply::Ok("text/event-stream", body);
    let (out, t) = three_requests_to(reply, dir, name);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    (out.status.code(), stdout, t)
}

/// A server that takes requests and never answers: the probes before the
/// run wait no longer than the run's own `--timeout-s` (they used to wait
/// 10 s per `/tokenize` form and 60 s for the calibration request, over a
/// minute before the first send), and every request of the run is a
/// timeout row.
#[test]
fn a_server_that_never_answers_costs_the_probes_no_more_than_the_timeout() {
    let _g = crate::common::serial();
    let (url, _posts) = crate::common::start_http_server(true);
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("silent");
    let out = three_requests(&url, &prefix, "1");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("failed (timeout: no answer in 1.0 s)"),
        "the calibration request waited the run's timeout: {stderr}"
    );
    assert!(stdout.contains("not ok by kind: timeout 3"), "{stdout}");
    let t = Trace::read(&prefix.with_extension("yaml")).unwrap();
    assert_eq!(t.records.len(), 3);
    assert!(
        t.records
            .iter()
            .all(|r| r.outcome.status == Some(Status::Timeout))
    );
}

/// A server that ignores `stream: true` and answers with the whole
/// completion: each request is `ok`, with one chunk at the end, its
/// server's usage, and a warning on the row and in the summary; a proxy's
/// `200 OK` HTML page instead of a stream is a `malformed` error quoting
/// the page's text; a stream labelled `text/plain` is read as a stream; a
/// compressed body no one asked for is named.
#[test]
fn a_whole_json_answer_to_a_stream_is_kept_and_an_html_page_is_named() {
    let _g = crate::common::serial();
    let dir = tempfile::tempdir().unwrap();
    let run = |reply, name: &str| three_requests_to(reply, dir.path(), name);
    let (out, t) = run(
        crate::common::PostReply::Ok(
            "application/json",
            r#"{"id":"x","object":"text_completion","choices":[{"index":0,"text":" a b c","finish_reason":"length"}],"usage":{"prompt_tokens":9,"completion_tokens":3,"total_tokens":12}}"#,
        ),
        "whole",
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(
        stdout.contains("warning: 3 ok responses came whole, not streamed"),
        "{stdout}"
    );
    for r in &t.records {
        let o = &r.outcome;
        assert_eq!(o.status, Some(Status::Ok));
        assert_eq!(o.num_chunks, 1);
        assert_eq!(r.request.output_tokens, 3);
        assert_eq!(o.server_input_tokens, Some(9));
        assert!(
            o.error_message
                .starts_with("warning: the server ignored stream: true"),
            "{}",
            o.error_message
        );
    }
    // Every request a `malformed` row with `message`, the run failed.
    let all_malformed = |reply, name: &str, message: &str| {
        let (out, t) = run(reply, name);
        assert_eq!(out.status.code(), Some(5));
        for r in &t.records {
            assert_eq!(r.outcome.status, Some(Status::Error));
            assert_eq!(r.outcome.error_message, message);
        }
    };
    all_malformed(
        crate::common::PostReply::Ok(
            "text/html; charset=utf-8",
            "<html><body><h1>502 Bad Gateway</h1><p>upstream is restarting</p></body></html>",
        ),
        "page",
        "malformed: HTTP 200 OK with text/html; charset=utf-8, not an event stream: 502 Bad Gateway upstream is restarting",
    );
    // An event stream a proxy labels text/plain is read as a stream.
    let (out, t) = run(
        crate::common::PostReply::Ok(
            "text/plain",
            "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choices\":[{\"text\":\"b\"}]}\n\ndata: [DONE]\n\n",
        ),
        "plain",
    );
    assert_eq!(out.status.code(), Some(0));
    for r in &t.records {
        assert_eq!(r.outcome.status, Some(Status::Ok));
        assert_eq!(r.outcome.num_chunks, 2);
    }
    // A compressed body nobody asked for (a proxy's gzip) is named as
    // such, not as bytes that are not an event stream.
    all_malformed(
        crate::common::PostReply::Ok(
            "text/event-stream\r\nContent-Encoding: gzip",
            "\u{1f}\u{8b}\u{8}\u{0}",
        ),
        "gzip",
        "malformed: HTTP 200 OK with Content-Encoding: gzip, which was not asked for",
    );
}

/// `[DONE]` ends a response, as OpenAI's clients read it: a server (or a
/// proxy) that keeps the stream open after it has answered in full, and
/// the request is `ok` at once, not a timeout.
#[test]
fn a_stream_held_open_after_done_is_complete_at_done() {
    let _g = crate::common::serial();
    let (url, _posts) = crate::common::start_server_replying(
        crate::common::PostReply::StreamThenHang(
            "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choices\":[{\"text\":\"b\"}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n",
        ),
    );
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("held");
    let out = three_requests(&url, &prefix, "3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    let t = Trace::read(&prefix.with_extension("yaml")).unwrap();
    for r in &t.records {
        // Complete at [DONE], not a timeout after 3 s.
        let o = &r.outcome;
        assert_eq!(o.status, Some(Status::Ok), "{}", o.error_message);
        assert_eq!((o.num_chunks, r.request.output_tokens), (2, 2));
    }
}

/// A stream that ends cleanly without `[DONE]` (some OpenAI-compatible
/// servers and proxies never send it) is complete when its last chunk
/// carried a `finish_reason`, as `vllm bench serve` reads it: `ok`, with a
/// warning on the row and in the summary. Without a `finish_reason` it was
/// cut off: a `dropped` error that keeps the chunks received.
#[test]
fn a_stream_without_done_is_complete_only_after_its_finish_reason() {
    let _g = crate::common::serial();
    let dir = tempfile::tempdir().unwrap();
    let (code, stdout, t) = three_streams(
        dir.path(),
        "finished",
        "data: {\"choices\":[{\"text\":\"a\",\"finish_reason\":null}]}\n\ndata: {\"choices\":[{\"text\":\"b\",\"finish_reason\":\"length\"}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":2}}\n\n",
    );
    assert_eq!(code, Some(0), "{stdout}");
    assert!(
        stdout.contains("warning: 3 ok responses ended without [DONE] (after their finish_reason)"),
        "{stdout}"
    );
    for r in &t.records {
        let o = &r.outcome;
        assert_eq!(o.status, Some(Status::Ok), "{}", o.error_message);
        assert_eq!((o.num_chunks, r.request.output_tokens), (2, 2));
        assert_eq!(o.finish_reason, "length");
        assert_eq!(
            o.error_message,
            "warning: the stream ended without [DONE] (after finish_reason)"
        );
    }
    let (code, _, t) = three_streams(
        dir.path(),
        "cut",
        "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choices\":[{\"text\":\"b\"}]}\n\n",
    );
    assert_eq!(code, Some(5));
    for r in &t.records {
        let o = &r.outcome;
        assert_eq!(o.status, Some(Status::Error));
        assert_eq!(o.num_chunks, 2, "the chunks received are kept");
        assert!(
            o.error_message.starts_with(
                "dropped: stream ended without [DONE] or a finish_reason after 2 chunks"
            ),
            "{}",
            o.error_message
        );
    }
}

/// A response whose usage counts more completion tokens than the
/// `max_tokens` asked (a reasoning API counting its reasoning outside
/// `max_tokens`, or a server that ignores or miscounts it) stays `ok` with
/// the server's count, and says so on the row and in the summary (it was
/// silent: a server claiming 10^6 tokens for 5 chunks showed 26 million
/// output tokens/s). A 200 body that is no event stream at all (JSON lines)
/// is `malformed`, quoting its start; it was `dropped` ("stream ended
/// without [DONE]"), as if the connection had been cut.
#[test]
fn usage_past_max_tokens_is_named_and_a_body_without_events_is_malformed() {
    let _g = crate::common::serial();
    let dir = tempfile::tempdir().unwrap();
    let (code, stdout, t) = three_streams(
        dir.path(),
        "over",
        "data: {\"choices\":[{\"text\":\"a\",\"finish_reason\":null}]}\n\ndata: {\"choices\":[{\"text\":\"b\",\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":1000000}}\n\ndata: [DONE]\n\n",
    );
    assert_eq!(code, Some(0), "{stdout}");
    assert!(
        stdout.contains(
            "warning: 3 ok responses counted more completion tokens in their usage than the max_tokens asked"
        ),
        "{stdout}"
    );
    for r in &t.records {
        let o = &r.outcome;
        assert_eq!(o.status, Some(Status::Ok), "{}", o.error_message);
        assert_eq!(r.request.output_tokens, 1_000_000, "the server's count");
        assert!(
            o.error_message.starts_with(
                "warning: the usage counts more completion tokens than max_tokens (1000000 against "
            ),
            "{}",
            o.error_message
        );
    }
    let reply = crate::common::PostReply::Ok(
        "application/x-ndjson",
        "{\"choices\":[{\"text\":\"a\",\"finish_reason\":null}]}\n{\"choices\":[{\"text\":\"b\",\"finish_reason\":\"length\"}]}\n",
    );
    let (out, t) = three_requests_to(reply, dir.path(), "ndjson");
    assert_eq!(out.status.code(), Some(5));
    for r in &t.records {
        let o = &r.outcome;
        assert_eq!(o.status, Some(Status::Error));
        assert!(
            o.error_message.starts_with(
                "malformed: the response is not an event stream (no SSE event; it starts \"{\\\"choices"
            ),
            "{}",
            o.error_message
        );
    }
}

/// A server whose streams begin with a UTF-8 byte order mark, or use
/// bare-CR line ends (both SSE): every request is `ok` with all its tokens
/// and `[DONE]`; the mark ended the command (a panic in the SSE reader),
/// and the bare CRs lost `[DONE]`.
#[test]
fn streams_with_a_byte_order_mark_or_bare_cr_line_ends_are_read() {
    let _g = crate::common::serial();
    let dir = tempfile::tempdir().unwrap();
    let two = "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choices\":[{\"text\":\"b\",\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n";
    let bom: &'static str = Box::leak(format!("\u{feff}{two}").into_boxed_str());
    let cr: &'static str = Box::leak(two.replace('\n', "\r").into_boxed_str());
    for (name, body) in [("bom", bom), ("cr", cr)] {
        let (code, stdout, t) = three_streams(dir.path(), name, body);
        assert_eq!(code, Some(0), "{name}: {stdout}");
        for r in &t.records {
            let o = &r.outcome;
            assert_eq!(o.status, Some(Status::Ok), "{name}: {}", o.error_message);
            assert_eq!((o.num_chunks, r.request.output_tokens), (2, 2), "{name}");
            assert!(o.error_message.is_empty(), "{name}: {}", o.error_message);
        }
    }
}

/// A stream that reaches `[DONE]` without a token or a `finish_reason`
/// (only empty `choices`) generated nothing and says nothing: a
/// `malformed` error, not an `ok` row claiming the planned output with no
/// first token (as `vllm bench serve` fails it). One that finishes at once
/// (its first token the end of sequence: an empty text with its
/// `finish_reason`) is complete: `ok`, no TTFT, the usage's output
/// tokens or else 0, with a warning on the row and in the summary.
#[test]
fn a_stream_without_a_token_is_an_error_unless_it_finished() {
    let _g = crate::common::serial();
    let dir = tempfile::tempdir().unwrap();
    let (code, _, t) = three_streams(
        dir.path(),
        "empty",
        "data: {\"choices\":[]}\n\ndata: {\"choices\":[]}\n\ndata: [DONE]\n\n",
    );
    assert_eq!(code, Some(5));
    for r in &t.records {
        let o = &r.outcome;
        assert_eq!(o.status, Some(Status::Error));
        assert_eq!(
            o.error_message,
            "malformed: the stream ended at [DONE] without a token or a finish_reason"
        );
        assert_eq!(o.first_chunk_time_us, None);
    }
    let (code, stdout, t) = three_streams(
        dir.path(),
        "eos",
        "data: {\"choices\":[{\"text\":\"\",\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n",
    );
    assert_eq!(code, Some(0), "{stdout}");
    assert!(
        stdout.contains("warning: 3 ok responses finished without a token"),
        "{stdout}"
    );
    for r in &t.records {
        let o = &r.outcome;
        assert_eq!(o.status, Some(Status::Ok), "{}", o.error_message);
        assert_eq!((o.num_chunks, r.request.output_tokens), (0, 0));
        assert_eq!(o.first_chunk_time_us, None);
        assert_eq!(o.finish_reason, "stop");
        assert!(
            o.error_message
                .starts_with("warning: the stream finished without a token"),
            "{}",
            o.error_message
        );
    }
}

#[test]
fn max_error_rate_sets_how_many_failures_fail_the_run() {
    let _g = crate::common::serial();
    let mock = Mock::start(&["--fault-500-rate", "0.5", "--seed", "7"]);
    let dir = tempfile::tempdir().unwrap();
    let run = |max: &str| {
        loadgen()
            .args(["run", "--server-url", &mock.url, "--model", MODEL])
            .args([
                "--rate",
                "50",
                "--num-requests",
                "60",
                "--output-tokens",
                "4",
            ])
            .args([
                "--scrape-interval-ms",
                "0",
                "--max-error-rate",
                max,
                "--json",
            ])
            .arg("--out")
            .arg(dir.path().join(format!("faults-{max}")))
            .output()
            .unwrap()
    };
    // About half fail: above 10%, below 90%.
    let out = run("0.1");
    assert_eq!(out.status.code(), Some(5));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["failed"], true);
    let rate = v["error_rate"].as_f64().unwrap();
    assert!((0.2..0.8).contains(&rate), "{rate}");
    assert!(
        v["verdict"]
            .as_str()
            .unwrap()
            .contains("> --max-error-rate 10.0%"),
        "{v}"
    );
    let out = run("0.9");
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (v["failed"].as_bool(), v["verdict"].as_str()),
        (Some(false), Some("valid"))
    );
    // Out of range is a usage error before anything is sent.
    let out = run("1.5");
    assert_eq!(out.status.code(), Some(1));
    assert!(one_line_error(&out).contains("--max-error-rate must be a fraction in [0, 1]"));
}

/// The OpenAI SDK's `base_url` ends in `/v1`, and people paste the
/// endpoint itself: both are read as the server's base URL, with a note,
/// so the requests and the metrics scrape reach the server (they used to
/// go to `/v1/v1/completions`, a 404 that stopped the run).
#[test]
fn a_v1_url_is_read_as_the_base_url() {
    let _g = crate::common::serial();
    let mock = Mock::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    for (i, url) in [
        format!("{}/v1", mock.url),
        format!("{}/v1/completions/", mock.url),
    ]
    .iter()
    .enumerate()
    {
        let prefix = dir.path().join(format!("v1-{i}"));
        let out = loadgen()
            .args(["run", "--server-url", url, "--model", MODEL])
            .args([
                "--rate",
                "20",
                "--num-requests",
                "3",
                "--output-tokens",
                "3",
            ])
            .args(["--scrape-interval-ms", "100", "--out", s(&prefix)])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{stderr}");
        assert!(
            stderr.contains(&format!(
                "note: --server-url {url} read as the server's base URL {}: requests go to {}/v1/completions, metrics to {}/metrics",
                mock.url, mock.url, mock.url
            )),
            "{stderr}"
        );
        let t = Trace::read(&prefix.with_extension("yaml")).unwrap();
        assert!(
            t.records
                .iter()
                .all(|r| r.outcome.status == Some(Status::Ok))
        );
        assert!(
            t.metrics.as_ref().is_some_and(|m| !m.is_empty()),
            "the metrics were scraped"
        );
    }
}

/// A server (or gateway) that streams whatever was asked: the test
/// request before the run (`stream: false`) and a `--no-stream` run read
/// its events as the response, with a warning on each row; the test
/// request no longer warns that the run's requests will fail.
#[test]
fn a_server_that_always_streams_is_read_when_no_stream_was_asked() {
    let _g = crate::common::serial();
    let (url, _posts) = crate::common::start_server_replying(crate::common::PostReply::Ok(
        "text/event-stream",
        "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choices\":[{\"text\":\"b\",\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n",
    ));
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("always");
    let out = loadgen()
        .args(["run", "--server-url", &url, "--model", "m", "--no-stream"])
        .args(["--rate", "20", "--num-requests", "3", "--timeout-s", "5"])
        .args(["--scrape-interval-ms", "0", "--out", s(&prefix)])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("test request"), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("warning: 3 ok responses were streamed although stream: false was asked"),
        "{stdout}"
    );
    let t = Trace::read(&prefix.with_extension("yaml")).unwrap();
    for r in &t.records {
        let o = &r.outcome;
        assert_eq!(o.status, Some(Status::Ok), "{}", o.error_message);
        assert_eq!((o.num_chunks, r.request.output_tokens), (1, 2));
        assert_eq!(
            o.error_message,
            "warning: the server streamed the response although stream: false was asked (text/event-stream)"
        );
    }
}

/// A server still starting: one that answers 503 on `/health` is waited
/// on (up to 60 s) before the first send, so no request meets the 503s;
/// one not listening yet is waited on with `--wait-for-server-s` (as
/// `vllm bench serve --ready-check-timeout-sec`), and without it, or past
/// it, is the one-line `cannot reach` error.
#[test]
fn a_server_still_starting_is_waited_for() {
    let _g = crate::common::serial();
    let dir = tempfile::tempdir().unwrap();
    let run = |url: &str, name: &str, extra: &[&str]| {
        loadgen()
            .args(["run", "--server-url", url, "--model", MODEL])
            .args([
                "--rate",
                "20",
                "--num-requests",
                "3",
                "--output-tokens",
                "3",
            ])
            .args(["--scrape-interval-ms", "0", "--out"])
            .arg(dir.path().join(name))
            .args(extra)
            .output()
            .unwrap()
    };
    let mock = Mock::start(&["--startup-delay-ms", "1500"]);
    let out = run(&mock.url, "loading", &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("(HTTP 503 from /health), up to 60 s"),
        "{stderr}"
    );
    let t = Trace::read(&dir.path().join("loading.yaml")).unwrap();
    assert!(
        t.records
            .iter()
            .all(|r| r.outcome.status == Some(Status::Ok))
    );

    // A port nobody listens on until a mock starts there 1 s later.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let late = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(1));
        Mock::start(&["--port", &port.to_string()])
    });
    let out = run(&url, "late", &["--wait-for-server-s", "30"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("waiting for the server at"), "{stderr}");
    drop(late.join().unwrap());

    let t0 = std::time::Instant::now();
    let out = run(&url, "gone", &["--wait-for-server-s", "1"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(t0.elapsed() >= std::time::Duration::from_secs(1));
    assert!(one_line_error(&out).starts_with(&format!("error: cannot reach the server at {url}")));
}

/// A gateway that answers every GET with a page of its own (no model list,
/// no `/tokenize`, no `/metrics`) but serves completions: the run goes on
/// with a warning naming the list's URL (it used to stop there).
#[test]
fn a_model_list_that_is_not_json_is_a_warning() {
    let _g = crate::common::serial();
    let (url, stderr) = all_ok_despite_the_model_list(crate::common::PostReply::OkWithPageGets(
        "text/event-stream",
        ONE_TOKEN_STREAM,
    ));
    assert!(
        stderr.contains(&format!(
            "warning: reading {url}/v1/models: expected value at line 1 column 1"
        )) && stderr.contains("going on without the server's model list"),
        "{stderr}"
    );
}

/// A stream of one token that finished, with its usage.
const ONE_TOKEN_STREAM: &str = "data: {\"choices\":[{\"text\":\"a\",\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n";

/// Three requests (30 s timeout) to a server answering `reply`, whose
/// model list is not read: the run succeeds with every request `ok`; the
/// server's URL and the standard error.
fn all_ok_despite_the_model_list(reply: crate::common::PostReply) -> (String, String) {
    let (url, _posts) = crate::common::start_server_replying(reply);
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("list");
    let out = three_requests(&url, &prefix, "30");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let t = Trace::read(&prefix.with_extension("yaml")).unwrap();
    assert!(
        t.records
            .iter()
            .all(|r| r.outcome.status == Some(Status::Ok))
    );
    (url, stderr)
}

/// A `/metrics` page past 16 MiB is a failed scrape with its reason, not
/// read into memory at every scrape; a normal page is read, and a page
/// with an unreadable line keeps its other lines.
#[test]
fn a_metrics_page_past_the_limit_is_a_failed_scrape_and_a_bad_line_is_skipped() {
    use std::io::{Read, Write};
    let serve = |body: Vec<u8>| {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/metrics", listener.local_addr().unwrap());
        std::thread::spawn(move || {
            if let Ok((mut c, _)) = listener.accept() {
                let mut buf = [0u8; 4096];
                let _ = c.read(&mut buf);
                let _ = write!(
                    c,
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
                    body.len()
                );
                let _ = c.write_all(&body);
            }
        });
        url
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = blis_loadgen::http::client().unwrap();
    let scrape = |url: String| {
        rt.block_on(blis_loadgen::scrape::scrape_once(
            &client,
            &url,
            None,
            std::time::Duration::from_secs(20),
        ))
    };
    let line = b"vllm:num_requests_running{model_name=\"m\"} 1\n";
    let huge: Vec<u8> = line
        .iter()
        .copied()
        .cycle()
        .take(blis_loadgen::scrape::MAX_METRICS_BYTES + line.len())
        .collect();
    assert_eq!(
        scrape(serve(huge)).unwrap_err(),
        "a metrics page over 16 MiB"
    );
    let ok = scrape(serve(line.to_vec())).unwrap();
    assert_eq!(ok.samples.len(), 1);
    assert_eq!(ok.samples[0].name, "vllm:num_requests_running");
    // One line no reader of the format takes (a gateway's own metric
    // written wrong) among vLLM's: the rest of the page is kept, the line
    // named; Prometheus's way (the whole scrape failed) lost every metric
    // of the run.
    let mixed = b"vllm:num_requests_running{model_name=\"m\"} 1\n\
        gateway_requests{route=/v1} 5\n\
        vllm:num_requests_waiting{model_name=\"m\"} 2 1520879607.789 # {trace_id=\"a\"} 1\n";
    let page = scrape(serve(mixed.to_vec())).unwrap();
    let names: Vec<&str> = page.samples.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        ["vllm:num_requests_running", "vllm:num_requests_waiting"]
    );
    assert_eq!(page.skipped, 1);
    assert_eq!(
        page.first_skipped.as_deref(),
        Some("line 2: expected a quoted value for label route")
    );
    // A page of which no line reads is not a metrics page.
    let err = scrape(serve(b"<html><body>login</body></html>\n".to_vec())).unwrap_err();
    assert!(
        err.starts_with("not a Prometheus metrics page: no line reads as a sample (line 1: "),
        "{err}"
    );
}

/// A whole run against a server whose `/metrics` page carries one line no
/// reader takes (a gateway's own metric written wrong) beside vLLM's: the
/// run keeps every readable sample, warns naming the line, and its summary
/// counts the scrapes, the samples and the lines skipped.
#[test]
fn a_run_keeps_the_readable_metrics_of_a_page_with_a_bad_line_and_says_so() {
    let (url, _posts) =
        crate::common::start_server_replying(crate::common::PostReply::OkWithMetricsGets(
            "text/event-stream",
            ONE_TOKEN_STREAM,
            "vllm:num_requests_running{model_name=\"m\"} 1\ngateway_requests{route=/v1} 5\n",
        ));
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("metrics");
    let out = loadgen()
        .args(["run", "--server-url", &url, "--model", "m"])
        .args(["--rate", "20", "--num-requests", "3", "--timeout-s", "5"])
        .args(["--scrape-interval-ms", "50", "--json", "--out", s(&prefix)])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let bad = "line 2: expected a quoted value for label route";
    assert!(stderr.contains(bad), "{stderr}");
    assert!(
        stderr.contains("unreadable line(s) of the metrics pages were skipped"),
        "{stderr}"
    );
    let t = Trace::read(&prefix.with_extension("yaml")).unwrap();
    let samples = t.metrics.as_deref().expect("a metrics companion");
    assert!(!samples.is_empty());
    // vLLM's line kept at every scrape, with the scrape's own `up`; the
    // bad line nowhere.
    assert!(
        samples
            .iter()
            .any(|m| m.name == "vllm:num_requests_running")
    );
    assert!(
        samples
            .iter()
            .all(|m| m.name == "vllm:num_requests_running" || m.name == "up"),
        "{:?}",
        samples.iter().map(|m| &m.name).collect::<Vec<_>>()
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let m = &v["metrics"];
    assert_eq!(m["samples"].as_u64(), Some(samples.len() as u64), "{m}");
    assert_eq!(m["failed"].as_u64(), Some(0), "{m}");
    assert!(m["scrapes"].as_u64().unwrap() >= 1, "{m}");
    assert!(m["skipped_lines"].as_u64().unwrap() >= 1, "{m}");
    assert_eq!(m["first_skipped_line"].as_str(), Some(bad), "{m}");
}

/// A broken server's endless bodies cost a bounded read, not memory nor
/// the timeout: a model list that never ends is a warning after 8 MiB
/// (the run goes on), and an HTTP 500 whose page never ends is recorded as
/// that error at once, its message from the page's start.
#[test]
fn endless_bodies_are_read_up_to_a_limit() {
    let _g = crate::common::serial();
    let (url, stderr) = all_ok_despite_the_model_list(crate::common::PostReply::OkWithEndlessGets(
        "text/event-stream",
        ONE_TOKEN_STREAM,
    ));
    assert!(
        stderr.contains(&format!(
            "warning: reading {url}/v1/models: an answer over 8 MiB; going on without the server's model list"
        )),
        "{stderr}"
    );
    let dir = tempfile::tempdir().unwrap();

    let (url, _posts) =
        crate::common::start_server_replying(crate::common::PostReply::EndlessError);
    let prefix = dir.path().join("e500");
    let t0 = std::time::Instant::now();
    let out = three_requests(&url, &prefix, "30");
    // The requests' 30 s timeout is never reached: each page is cut short.
    assert!(t0.elapsed() < std::time::Duration::from_secs(25), "{out:?}");
    let t = Trace::read(&prefix.with_extension("yaml")).unwrap();
    assert_eq!(t.records.len(), 3);
    for r in &t.records {
        assert_eq!(r.outcome.status, Some(Status::Error));
        assert_eq!(r.outcome.http_status, Some(500));
        assert!(
            r.outcome
                .error_message
                .starts_with("http_500: HTTP 500 Internal Server Error: out of memory"),
            "{}",
            r.outcome.error_message
        );
    }
}

/// A server that streams on past `max_tokens`: each request is read up to
/// eight chunks per token (and 64) and failed as malformed, long before its
/// timeout, instead of filling the disk with chunk times until then (a
/// flooding server wrote 488 MB in 20 s).
#[test]
fn a_server_that_streams_past_max_tokens_is_cut_off() {
    let _g = crate::common::serial();
    let (url, _posts) = crate::common::start_server_replying(crate::common::PostReply::Flood);
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("flood");
    let t0 = std::time::Instant::now();
    let out = loadgen()
        .args(["run", "--server-url", &url, "--model", "m"])
        .args([
            "--rate",
            "20",
            "--num-requests",
            "3",
            "--output-tokens",
            "10",
        ])
        .args([
            "--timeout-s",
            "60",
            "--scrape-interval-ms",
            "0",
            "--out",
            s(&prefix),
        ])
        .output()
        .unwrap();
    assert!(t0.elapsed() < std::time::Duration::from_secs(50), "{out:?}");
    let t = Trace::read(&prefix.with_extension("yaml")).unwrap();
    assert_eq!(t.records.len(), 3);
    for r in &t.records {
        assert_eq!(r.outcome.status, Some(Status::Error));
        assert_eq!(r.outcome.num_chunks, 8 * 10 + 64);
        assert!(
            r.outcome.error_message.contains("it ignores max_tokens"),
            "{}",
            r.outcome.error_message
        );
    }
}

/// A server that answers every request with its head and then nothing:
/// the probes wait for it once, not once each. The model list's read waits
/// its 10 s, `/tokenize` one form's wait, the test request the run's
/// timeout; the connection warm-up and the version probes, which would
/// stall the same way, are skipped (with `--timeout-s 2`: 38 s before the
/// run ended, 16 s now).
#[test]
fn a_server_whose_answers_stall_after_their_head_is_waited_for_once() {
    let _g = crate::common::serial();
    let (url, _posts) =
        crate::common::start_server_replying(crate::common::PostReply::HeadersThenStall);
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("stall");
    let t0 = std::time::Instant::now();
    let out = three_requests(&url, &prefix, "2");
    let took = t0.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{stderr}");
    assert!(
        took < std::time::Duration::from_secs(22),
        "{took:?}: {stderr}"
    );
    let t = Trace::read(&prefix.with_extension("yaml")).unwrap();
    assert_eq!(t.records.len(), 3);
    assert!(
        t.records
            .iter()
            .all(|r| r.outcome.status == Some(Status::Timeout))
    );
}
