//! Load benchmark of the mock server (server and client in one process on
//! this machine, so they share its cores).
//!
//! `cargo run --release -p blis-mockserver --example load [STREAMS] [SECONDS]`
//!
//! 1. Opens STREAMS (default 5000) concurrent streaming requests and keeps
//!    them all open (every one has received its first token before any is
//!    allowed to finish), then reads them to the end; reports errors.
//! 2. Sends short non-streaming requests (1 output token) from 256
//!    concurrent clients for SECONDS (default 10) and reports requests/s and
//!    errors.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use blis_mockserver::{Opts, start};
use clap::Parser;
use futures::StreamExt;
use serde_json::json;

const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let streams: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(5000);
    let secs: u64 = std::env::args()
        .nth(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    // Room for every stream in one batch. A 5000-request decode step takes
    // 1.5 s (β2 = 0.3 ms per token), so 5-token answers keep every stream
    // open for several seconds while the others connect.
    let server = start(
        &Opts::parse_from([
            "blis-mockserver",
            "--port",
            "0",
            "--max-num-seqs",
            "100000",
            "--max-num-batched-tokens",
            "1000000",
            "--total-kv-blocks",
            "10000000",
        ])
        .config(),
    )
    .await?;
    let url = format!("http://{}", server.addr);
    let client = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(300)
        .build()?;

    // Phase 1: concurrent open streams.
    let first = Arc::new(AtomicU64::new(0));
    let open = Arc::new(AtomicU64::new(0));
    let peak_open = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..streams)
        .map(|i| {
            let (c, url, first) = (client.clone(), url.clone(), first.clone());
            let (open, peak_open) = (open.clone(), peak_open.clone());
            tokio::spawn(async move {
                let now_open = open.fetch_add(1, Ordering::Relaxed) + 1;
                peak_open.fetch_max(now_open, Ordering::Relaxed);
                let r = async {
                let resp = c
                    .post(format!("{url}/v1/completions"))
                    .json(&json!({"model": MODEL, "prompt": format!("stream {i} please"), "max_tokens": 5,
                                  "ignore_eos": true, "stream": true}))
                    .send()
                    .await
                    .map_err(|e| e.to_string())?;
                if resp.status() != 200 {
                    return Err(format!("status {}", resp.status()));
                }
                let mut body = resp.bytes_stream();
                let mut got_first = false;
                let mut bytes = 0usize;
                while let Some(chunk) = body.next().await {
                    let chunk = chunk.map_err(|e| e.to_string())?;
                    bytes += chunk.len();
                    if !got_first {
                        got_first = true;
                        first.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Ok::<usize, String>(bytes)
                }
                .await;
                open.fetch_sub(1, Ordering::Relaxed);
                r
            })
        })
        .collect();
    // Wait until every stream has its first token.
    let mut max_open = 0u64;
    loop {
        let f = first.load(Ordering::Relaxed);
        let snap = server.engine.snapshot();
        max_open = max_open.max(u64::from(snap.running));
        if f as usize >= streams || started.elapsed() > Duration::from_secs(120) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let all_first = started.elapsed();
    let mut errors = 0;
    for t in tasks {
        if !matches!(t.await, Ok(Ok(_))) {
            errors += 1;
        }
    }
    println!(
        "phase 1: {streams} streams; peak open at once {}; all had a first token after {:.2} s; \
         peak running in the engine {max_open}; all done after {:.2} s; errors {errors}",
        peak_open.load(Ordering::Relaxed),
        all_first.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    server.shutdown().await;

    // Phase 2 measures the server, not the simulated GPU: 1000× time scale.
    let server = start(
        &Opts::parse_from([
            "blis-mockserver",
            "--port",
            "0",
            "--max-num-seqs",
            "1024",
            "--time-scale",
            "1000",
        ])
        .config(),
    )
    .await?;
    let url = format!("http://{}", server.addr);

    // Phase 2: short requests as fast as possible.
    let done = Arc::new(AtomicU64::new(0));
    let errs = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(secs);
    let t0 = Instant::now();
    let workers: Vec<_> = (0..256)
        .map(|w| {
            let (c, url, done, errs) = (client.clone(), url.clone(), done.clone(), errs.clone());
            tokio::spawn(async move {
                let mut i = 0u64;
                while Instant::now() < deadline {
                    let r = c
                        .post(format!("{url}/v1/completions"))
                        .json(&json!({"model": MODEL, "prompt": format!("short {w} {i}"), "max_tokens": 1}))
                        .send()
                        .await;
                    let ok = match r {
                        Ok(r) => r.status() == 200 && r.bytes().await.is_ok(),
                        Err(_) => false,
                    };
                    if ok {
                        done.fetch_add(1, Ordering::Relaxed);
                    } else {
                        errs.fetch_add(1, Ordering::Relaxed);
                    }
                    i += 1;
                }
            })
        })
        .collect();
    for w in workers {
        w.await?;
    }
    let el = t0.elapsed().as_secs_f64();
    let n = done.load(Ordering::Relaxed);
    println!(
        "phase 2: {n} short requests in {el:.1} s = {:.0} req/s; errors {}",
        n as f64 / el,
        errs.load(Ordering::Relaxed)
    );
    server.shutdown().await;
    Ok(())
}
