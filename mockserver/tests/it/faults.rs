//! Injected faults arrive at their configured rates and the server stays up.

use futures::StreamExt;
use serde_json::json;

use crate::common::{MODEL, client, server, stream};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rates_of_500s_and_drops_are_as_configured_over_10k_requests() {
    let (s, url) = server(&[
        "--fault-500-rate",
        "0.05",
        "--fault-drop-rate",
        "0.01",
        "--time-scale",
        "1000",
        "--max-num-seqs",
        "512",
    ])
    .await;
    // A fresh connection per request: a dropped connection is never reused.
    let c = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let n = 10_000usize;
    let results: Vec<(u16, bool)> = futures::stream::iter(0..n)
        .map(|i| {
            let c = c.clone();
            let url = url.clone();
            async move {
                let sent = c.post(format!("{url}/v1/completions"))
                    .json(&json!({"model": MODEL, "prompt": format!("request {i}"), "max_tokens": 4, "ignore_eos": true, "stream": true}))
                    .send().await;
                // A connection dropped before the response head is flushed
                // (at this time scale all tokens are ready at once) fails
                // the send itself.
                let Ok(resp) = sent else { return (0u16, true) };
                let status = resp.status().as_u16();
                let mut body = resp.bytes_stream();
                let mut broken = false;
                while let Some(chunk) = body.next().await {
                    if chunk.is_err() {
                        broken = true;
                        break;
                    }
                }
                (status, broken)
            }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    let e500 = results.iter().filter(|(s, _)| *s == 500).count() as f64;
    let drops = results
        .iter()
        .filter(|(s, b)| (*s == 200 || *s == 0) && *b)
        .count() as f64;
    // Binomial noise: 4 standard deviations.
    let check = |got: f64, p: f64| {
        let (mean, sd) = (n as f64 * p, (n as f64 * p * (1.0 - p)).sqrt());
        assert!(
            (got - mean).abs() <= 4.0 * sd,
            "got {got}, expected {mean} ± {}",
            4.0 * sd
        );
    };
    check(e500, 0.05);
    check(drops, 0.01);
    assert_eq!(s.metrics.faults("http_500") as f64, e500);
    assert_eq!(s.metrics.faults("drop") as f64, drops);
    // Still serving.
    let r = stream(
        &url,
        "/v1/completions",
        json!({"model": MODEL, "prompt": "after", "max_tokens": 2, "stream": true}),
    )
    .await;
    assert!(r.status == 200 || r.status == 500);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_request_headers_force_faults() {
    let (s, url) = server(&["--time-scale", "100", "--retry-after-s", "7"]).await;
    let c = client();
    let body = json!({"model": MODEL, "prompt": "hello there", "max_tokens": 6, "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true}});
    let r = c
        .post(format!("{url}/v1/completions"))
        .header("X-Return-Error", "503")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    let r = c
        .post(format!("{url}/v1/completions"))
        .header("X-Return-Error", "429")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["retry-after"], "7");
    let events = |fault: &'static str| {
        let c = c.clone();
        let url = url.clone();
        let body = body.clone();
        async move {
            let resp = c
                .post(format!("{url}/v1/completions"))
                .header("X-Fault", fault)
                .json(&body)
                .send()
                .await
                .unwrap();
            let text = resp.text().await;
            text.map_err(|e| e.to_string())
        }
    };
    assert!(events("drop").await.is_err());
    let malformed = events("malformed").await.unwrap();
    assert!(
        malformed
            .lines()
            .filter(|l| l.starts_with("data: "))
            .any(
                |l| serde_json::from_str::<serde_json::Value>(&l[6..]).is_err()
                    && !l.contains("[DONE]")
            )
    );
    let no_usage = events("missing-usage").await.unwrap();
    assert!(!no_usage.contains("\"usage\""));
    assert!(no_usage.contains("[DONE]"));
    let t0 = std::time::Instant::now();
    c.post(format!("{url}/v1/completions"))
        .header("X-Fault", "stall")
        .json(&body)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        t0.elapsed().as_millis() >= 2000,
        "stalled {} ms",
        t0.elapsed().as_millis()
    );
    assert_eq!(s.metrics.faults("stall"), 1);
    s.shutdown().await;
}
