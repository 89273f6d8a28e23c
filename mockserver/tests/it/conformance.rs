//! Request and response shapes as vLLM's OpenAI server has them.

use blis_traces::prom;
use clap::Parser;
use serde_json::{Value, json};

use crate::common::{MODEL, client, server, stream};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_completions_end_with_usage_and_done() {
    let (s, url) = server(&["--time-scale", "50"]).await;
    let r = stream(&url, "/v1/completions", json!({
        "model": MODEL, "prompt": "The quick brown fox jumps over the lazy dog", "max_tokens": 5,
        "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true},
    })).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.events.last().map(String::as_str), Some("[DONE]"));
    let chunks = r.json();
    assert_eq!(chunks.len(), 6, "5 token chunks and a usage chunk");
    for c in &chunks[..5] {
        assert_eq!(c["object"], "text_completion");
        assert_eq!(c["choices"][0]["text"].as_str().unwrap().len(), 4);
    }
    assert_eq!(chunks[3]["choices"][0]["finish_reason"], Value::Null);
    assert_eq!(chunks[4]["choices"][0]["finish_reason"], "length");
    let u = &chunks[5]["usage"];
    assert_eq!(chunks[5]["choices"], json!([]));
    // 43 bytes = 11 tokens of 4 bytes.
    assert_eq!(
        (
            u["prompt_tokens"].as_u64(),
            u["completion_tokens"].as_u64(),
            u["total_tokens"].as_u64()
        ),
        (Some(11), Some(5), Some(16))
    );
    assert_eq!(u["prompt_tokens_details"]["cached_tokens"], 0);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_chat_has_role_deltas_and_continuous_usage() {
    let (s, url) = server(&["--time-scale", "50"]).await;
    let r = stream(&url, "/v1/chat/completions", json!({
        "model": MODEL, "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}],
        "max_tokens": 4, "min_tokens": 4, "stream": true,
        "stream_options": {"include_usage": true, "continuous_usage_stats": true},
    })).await;
    let chunks = r.json();
    assert_eq!(chunks.len(), 6, "role, 4 tokens, usage");
    // As vLLM: the role alone first (empty content), then the tokens.
    assert_eq!(chunks[0]["object"], "chat.completion.chunk");
    assert_eq!(
        chunks[0]["choices"][0]["delta"],
        json!({"role": "assistant", "content": ""})
    );
    assert_eq!(chunks[0]["usage"]["completion_tokens"], 0);
    for (i, c) in chunks[1..5].iter().enumerate() {
        assert!(c["choices"][0]["delta"].get("role").is_none());
        assert_eq!(
            c["choices"][0]["delta"]["content"].as_str().unwrap().len(),
            4
        );
        assert_eq!(c["usage"]["completion_tokens"].as_u64(), Some(i as u64 + 1));
    }
    assert_eq!(chunks[5]["usage"]["completion_tokens"], 4);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_details_no_model_unknown_paths_and_methods() {
    let (s, url) = server(&["--time-scale", "50"]).await;
    let c = client();
    // vLLM serves its model to a request that names none.
    let r = c
        .post(format!("{url}/v1/completions"))
        .json(&json!({"prompt": "abcdefgh", "max_tokens": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["model"], MODEL);
    // A model it does not serve is a 404 in OpenAI's error shape.
    let r = c
        .post(format!("{url}/v1/completions"))
        .json(&json!({"model": "other", "prompt": "abcdefgh", "max_tokens": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["message"], "The model `other` does not exist.");
    // vLLM has no GET /v1/models/{id}: FastAPI's 404 with a JSON body.
    let r = c
        .get(format!("{url}/v1/models/{MODEL}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"detail": "Not Found"})
    );
    let r = c.get(format!("{url}/v1/completions")).send().await.unwrap();
    assert_eq!(r.status(), 405);
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"detail": "Method Not Allowed"})
    );
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_streaming_both_endpoints() {
    let (s, url) = server(&["--time-scale", "50", "--output-dist", "constant:3"]).await;
    let c = client();
    let v: Value = c
        .post(format!("{url}/v1/completions"))
        .json(&json!({"model": MODEL, "prompt": "abcdefgh", "max_tokens": 10}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    // Not forced: the output length is drawn (here constant 3) and stops.
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["choices"][0]["text"], " 001 002 003");
    assert_eq!(v["usage"]["completion_tokens"], 3);
    assert_eq!(v["usage"]["prompt_tokens"], 2);
    let v: Value = c.post(format!("{url}/v1/chat/completions")).json(&json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}))
        .send().await.unwrap().json().await.unwrap();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    let models: Value = c
        .get(format!("{url}/v1/models"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], MODEL);
    let tok: Value = c
        .post(format!("{url}/tokenize"))
        .json(&json!({"model": MODEL, "prompt": "abcdefghi"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(tok["count"], 3);
    assert_eq!(tok["tokens"].as_array().unwrap().len(), 3);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_prefixes_are_cache_hits() {
    let (s, url) = server(&["--time-scale", "50"]).await;
    let system = "x".repeat(4 * 16 * 8); // 8 blocks of 16 tokens
    let ask = |q: &str| json!({"model": MODEL, "prompt": format!("{system}{q}"), "max_tokens": 2});
    let c = client();
    c.post(format!("{url}/v1/completions"))
        .json(&ask("first?"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let v: Value = c
        .post(format!("{url}/v1/completions"))
        .json(&ask("second!"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 128);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_clear_and_auth_is_enforced() {
    let (s, url) = server(&["--api-key", "sekret"]).await;
    let c = client();
    let post = |body: String, key: Option<&str>| {
        let mut r = c
            .post(format!("{url}/v1/completions"))
            .header("content-type", "application/json")
            .body(body);
        if let Some(k) = key {
            r = r.bearer_auth(k);
        }
        r.send()
    };
    let r = post(json!({"model": MODEL, "prompt": "x"}).to_string(), None)
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = post(
        json!({"model": MODEL, "prompt": "x"}).to_string(),
        Some("wrong"),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 401);
    for (body, words) in [
        (
            json!({"model": MODEL}).to_string(),
            "field `prompt` is required",
        ),
        (
            json!({"model": MODEL, "prompt": "x", "max_tokens": -1}).to_string(),
            "max_tokens must be at least 1",
        ),
        ("{not json".to_string(), "invalid JSON body"),
    ] {
        let r = post(body, Some("sekret")).await.unwrap();
        assert_eq!(r.status(), 400);
        let v: Value = r.json().await.unwrap();
        assert!(v["message"].as_str().unwrap().contains(words), "{v}");
        assert_eq!(v["object"], "error");
    }
    let r = post(
        json!({"model": "other", "prompt": "x"}).to_string(),
        Some("sekret"),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 404);
    // A long prompt (3 MB, past a web framework's 2 MiB default) is read
    // and judged as vLLM judges it: against the context length.
    let prompt = "a ".repeat(3 << 19);
    let r = post(
        json!({"model": MODEL, "prompt": prompt, "max_tokens": 1}).to_string(),
        Some("sekret"),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("maximum context length"),
        "{v}"
    );
    // A body past what any prompt of the context could take is an
    // OpenAI-style 413. (The client sends one byte past the limit and
    // stops, so the server has read all it sent when it answers and
    // closes: a socket closed with unread bytes would reset the answer.)
    let addr = url.trim_start_matches("http://").to_string();
    let raw = tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut c = std::net::TcpStream::connect(addr).unwrap();
        c.set_read_timeout(Some(std::time::Duration::from_secs(60)))
            .unwrap();
        let limit = 16usize << 20;
        write!(
            c,
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sekret\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            limit + 1000
        )
        .unwrap();
        c.write_all(&vec![b' '; limit + 1]).unwrap();
        let mut out = Vec::new();
        let _ = c.read_to_end(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    })
    .await
    .unwrap();
    assert!(raw.starts_with("HTTP/1.1 413"), "{raw}");
    assert!(raw.contains(r#""object":"error""#), "{raw}");
    assert!(raw.contains("over this server's 16 MiB"), "{raw}");
    // /health and /metrics need no key.
    assert_eq!(
        c.get(format!("{url}/health"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_waits_for_startup_and_metrics_parse() {
    let (s, url) = server(&["--startup-delay-ms", "300", "--time-scale", "50"]).await;
    let c = client();
    assert_eq!(
        c.get(format!("{url}/health"))
            .send()
            .await
            .unwrap()
            .status(),
        503
    );
    tokio::time::sleep(std::time::Duration::from_millis(350)).await;
    assert_eq!(
        c.get(format!("{url}/health"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    c.post(format!("{url}/v1/completions"))
        .json(&json!({"model": MODEL, "prompt": "hello", "max_tokens": 3}))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    // The response's tokens are handed over a little ahead of the
    // simulated step that produces them (the mock's lead), and the engine's
    // counters reach /metrics when that step ends: scrape until they have
    // (on a busy machine, some milliseconds later).
    let mut samples = Vec::new();
    for _ in 0..200 {
        let body = c
            .get(format!("{url}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        samples = prom::parse(&body).unwrap();
        let generated = samples
            .iter()
            .find(|s| s.name == "vllm:generation_tokens_total")
            .map(|s| s.value);
        if generated == Some(3.0) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let find = |name: &str| {
        samples
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("{name} missing"))
    };
    for name in [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:num_preemptions_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
    ] {
        assert_eq!(find(name).label("model_name"), Some(MODEL));
    }
    assert_eq!(find("vllm:time_to_first_token_seconds_count").value, 1.0);
    assert_eq!(find("vllm:generation_tokens_total").value, 3.0);
    assert!(
        samples
            .iter()
            .any(|s| s.name == "vllm:e2e_request_latency_seconds_bucket"
                && s.label("le") == Some("+Inf"))
    );
    assert!(
        samples
            .iter()
            .any(|s| s.name == "vllm:request_queue_time_seconds_sum")
    );
    assert!(
        samples
            .iter()
            .any(|s| s.name == "vllm:inter_token_latency_seconds_count" && s.value == 2.0)
    );
    s.shutdown().await;
    let (s, url) = server(&["--metrics-style", "sglang"]).await;
    let body = c
        .get(format!("{url}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let samples = prom::parse(&body).unwrap();
    assert!(samples.iter().any(|s| s.name == "sglang:num_running_reqs"));
    s.shutdown().await;
}

/// The binary binds loopback by default and says so on stderr; its first
/// stdout line is the address.
#[test]
fn the_binary_binds_loopback_by_default_and_says_so() {
    use std::io::{BufRead, BufReader};
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_blis-mockserver"))
        .args(["--port", "0"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let mut note = String::new();
    BufReader::new(child.stderr.take().unwrap())
        .read_line(&mut note)
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(line.starts_with("listening on http://127.0.0.1:"), "{line}");
    assert!(note.contains("loopback only"), "{note}");
}

/// A time scale whose clock would overflow (or never show a token) is a
/// settings error naming the flag, not an engine that panics on the first
/// request.
#[tokio::test]
async fn a_time_scale_out_of_range_is_refused_at_start() {
    for bad in ["1e300", "1e-300", "0", "-1", "NaN", "inf"] {
        let opts = blis_mockserver::Opts::parse_from([
            "blis-mockserver",
            "--port",
            "0",
            "--time-scale",
            bad,
        ]);
        let err = match blis_mockserver::start(&opts.config()).await {
            Ok(_) => panic!("--time-scale {bad} was accepted"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains("--time-scale must be between"), "{bad}: {err}");
    }
    for good in ["0.000001", "1000000"] {
        let opts = blis_mockserver::Opts::parse_from([
            "blis-mockserver",
            "--port",
            "0",
            "--time-scale",
            good,
        ]);
        assert!(
            blis_mockserver::start(&opts.config()).await.is_ok(),
            "{good}"
        );
    }
}
