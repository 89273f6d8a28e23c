//! The loop against a real inference server: llama.cpp's `llama-server`
//! with a tiny random-weight model on this CPU (`../shared/realserver`).
//! It observes 120 s of ServeGen's m-large clients at 0.6 req/s with
//! `blis-loadgen` (streaming, Prometheus scraping on), fits blackbox
//! coefficients on the first 70% of the trace with `blis-calibrate fit`,
//! replays the whole trace with `blis-replay` using them and the server's
//! settings (4 slots as `max_num_seqs`, its 2048-token batch as the token
//! budget, 8192 tokens per slot), and compares the held-out 30%.
//!
//! Thresholds come from measurement on the 2-vCPU machine (README, "How
//! accurate is it"): over three runs, held-out E2E MAPE 28.6–40.1% and TTFT
//! p50 error −39% to +31% (21 held-out requests, whose TTFT is either a
//! lone prefill of ~20 ms or one shared with decodes of ~45 ms, so their
//! median jumps between the two), against the server's own run-to-run
//! spread of 15–17.5% E2E MAPE between two runs of the same workload. The
//! assertions leave room for that: E2E MAPE ≤ 60%, |TTFT p50 error| ≤ 60%.
//!
//! Skipped, with a message, only when `llama-server` is not installed
//! (`bash ../shared/realserver/install.sh`; `.ci/run` installs it).

use std::path::{Path, PathBuf};
use std::process::Command;

use blis_tests::{LoopOpts, run_loop};
use clap::Parser;

const E2E_MAPE_MAX: f64 = 60.0;
const TTFT_P50_MAX: f64 = 0.60;

fn realserver() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/realserver")
}

fn venv() -> PathBuf {
    std::env::var_os("REALSERVER_VENV").map_or_else(
        || {
            let cache = std::env::var_os("XDG_CACHE_HOME").map_or_else(
                || PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache"),
                PathBuf::from,
            );
            cache.join("blis-realserver")
        },
        PathBuf::from,
    )
}

/// Stops the server when the test ends, however it ends.
struct Server {
    port: u16,
    state: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(realserver().join("stop.sh"))
            .arg(self.port.to_string())
            .env("REALSERVER_STATE", self.state.path())
            .status();
    }
}

fn start() -> (Server, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let state = tempfile::tempdir().unwrap();
    let out = Command::new("bash")
        .arg(realserver().join("start.sh"))
        .args([port.to_string(), "4".into()])
        .env("REALSERVER_STATE", state.path())
        .output()
        .expect("running start.sh");
    let server = Server { port, state };
    assert!(
        out.status.success(),
        "start.sh failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let url = String::from_utf8(out.stdout).unwrap().trim().to_string();
    (server, url)
}

#[test]
fn the_loop_predicts_a_real_llama_cpp_server() {
    if !venv().join("bin/llama-server").exists() {
        eprintln!(
            "skipped: llama-server is not installed in {} (run bash ../shared/realserver/install.sh; .ci/run does)",
            venv().display()
        );
        return;
    }
    let (_server, url) = start();
    let dir = tempfile::tempdir().unwrap();
    let spec = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/realserver-servegen.yaml");
    let o = LoopOpts::parse_from([
        "blis-loop",
        "--server-url",
        &url,
        "--server-type",
        "llamacpp",
        "--workload-spec",
        spec.to_str().unwrap(),
        "--out",
        dir.path().to_str().unwrap(),
        "--holdout-fraction",
        "0.3",
        "--replay-args",
        "--max-num-seqs 4 --max-num-batched-tokens 2048 --block-size 16 --total-kv-blocks 2048 --max-model-len 8192",
    ]);
    let r = run_loop(&o, &mut |l| eprintln!("{}", l.trim_end())).unwrap();
    eprintln!("{}", r.markdown);
    let m = &r.report_json["metrics"];
    let e2e_mape = m["e2e"]["mape"].as_f64().unwrap();
    let ttft_p50 = m["ttft"]["errors"]["p50"]["relative"].as_f64().unwrap();
    let n = m["e2e"]["n"].as_u64().unwrap();
    eprintln!(
        "held-out requests {n}: E2E MAPE {e2e_mape:.1}% (≤ {E2E_MAPE_MAX}%), TTFT p50 error {:+.1}% (≤ ±{:.0}%)",
        100.0 * ttft_p50,
        100.0 * TTFT_P50_MAX
    );
    // The whole workload was served, and only the held-out part compared.
    let real = blis_traces::Trace::read(&r.real).unwrap();
    assert!(
        real.records.len() >= 60,
        "{} requests observed",
        real.records.len()
    );
    assert!((15..=30).contains(&n), "{n} held-out requests compared");
    assert!(e2e_mape <= E2E_MAPE_MAX, "held-out E2E MAPE {e2e_mape}%");
    assert!(
        ttft_p50.abs() <= TTFT_P50_MAX,
        "held-out TTFT p50 error {ttft_p50}"
    );
    assert!(r.report.with_extension("html").exists());
}
