//! The loop against a real inference server: llama.cpp's `llama-server`
//! with a tiny random-weight model on this CPU (`../shared/realserver`).
//! It observes 120 s of ServeGen's m-large clients at 0.6 req/s with
//! `blis-loadgen --server-type llamacpp` (streaming, Prometheus scraping
//! on; the server's 4 slots and 8192 tokens per slot read from its
//! `/props`), fits the llama.cpp engine profile's step table on the first
//! 70% of the trace with `blis-calibrate fit --latency-model step-table`,
//! replays the whole trace with `blis-replay --server-type llamacpp`, and
//! compares the held-out 30%. No engine setting is given by hand.
//!
//! E2E is judged on the held-out requests' distribution: the Wasserstein
//! distance between the real and predicted E2Es at most 30% of the real
//! mean. Per-request MAPE is printed, not asserted: on the 2-vCPU machines
//! of 2026-11-30 the server ran near saturation (real TTFT p50 1.5 s, not
//! the 45 ms of earlier machines), where which short request waits for a
//! slot is a toss-up and dominates a 21-request MAPE (four runs: 8.7%,
//! 24.6%, 4.6% beside two busy processes, and once 67%, its bootstrap
//! interval 14-161%, two 0.2 s requests predicted at 1.1 s), while the
//! distance stayed 3.8%, 11.7%, 3.0% and 11.1% of the mean. Earlier machines, unsaturated (docs/how-accurate.md): MAPE
//! 8-23% over 23 runs, against the server's own run-to-run spread of up to
//! 42% on the same held-out requests. A model off by a third in step time
//! moves the whole distribution and fails.
//!
//! TTFT is judged on its distribution, not on the real median: the 21
//! held-out TTFTs are bimodal (a lone prefill of 20–50 ms, or a wait for a
//! slot of 250–400 ms), so the real p50 jumps between the modes from run to
//! run (45, 33, 50, 54 and once 218 ms; the p50 error was −39% to +31% and
//! that once −73%). The predicted median must lie within the real
//! interquartile range widened by 1.5× on each side (measured: real p25
//! 36–41 ms, p75 261–376 ms; predicted p50 53–91 ms).
//!
//! Skipped, with a message, only when `llama-server` is not installed
//! (`bash ../shared/realserver/install.sh`; `.ci/run` installs it).

use std::path::{Path, PathBuf};
use std::process::Command;

use blis_loop::{LoopOpts, run_loop};
use clap::Parser;

/// The most Wasserstein distance between the real and predicted held-out
/// E2Es, as a fraction of the real mean.
const E2E_W1_MAX: f64 = 0.30;
/// How far outside the real TTFT interquartile range the predicted median
/// may lie, as a factor.
const TTFT_IQR_SLACK: f64 = 1.5;

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
#[ignore = "needs llama.cpp's server: bash ../shared/realserver/install.sh, then cargo test --workspace -- --include-ignored (.ci/run does both)"]
fn the_loop_predicts_a_real_llama_cpp_server() {
    assert!(
        venv().join("bin/llama-server").exists(),
        "llama-server is not installed in {} (run bash ../shared/realserver/install.sh)",
        venv().display()
    );
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
    ]);
    let r = run_loop(&o, &mut |l| eprintln!("{}", l.trim_end())).unwrap();
    eprintln!("{}", r.markdown);
    let m = &r.report_json["metrics"];
    let e2e_mape = m["e2e"]["mape"].as_f64().unwrap();
    let e2e_w1 =
        m["e2e"]["wasserstein"].as_f64().unwrap() / m["e2e"]["real"]["mean"].as_f64().unwrap();
    let sim_ttft_p50 = m["ttft"]["sim"]["p50"].as_f64().unwrap();
    // The QQ pairs are 100 evenly spaced quantiles of the compared
    // (held-out) requests, real first.
    let qq = m["ttft"]["qq"].as_array().unwrap();
    let real_q = |i: usize| qq[i][0].as_f64().unwrap();
    let (lo, hi) = (real_q(24) / TTFT_IQR_SLACK, real_q(74) * TTFT_IQR_SLACK);
    let n = m["e2e"]["n"].as_u64().unwrap();
    eprintln!(
        "held-out requests {n}: E2E Wasserstein distance {:.1}% of the real mean (≤ {:.0}%), E2E MAPE {e2e_mape:.1}%, predicted TTFT p50 {sim_ttft_p50:.1} ms (real p25–p75 widened: {lo:.1}–{hi:.1} ms)",
        e2e_w1 * 100.0,
        E2E_W1_MAX * 100.0
    );
    // The whole workload was served, and only the held-out part compared;
    // the server's slots and context came from its /props.
    let real = blis_traces::Trace::read(&r.real).unwrap();
    let s = real.header.server.as_ref().unwrap();
    assert_eq!((s.max_num_seqs, s.max_model_len), (Some(4), Some(8192)));
    let coeffs = std::fs::read_to_string(r.real.with_file_name("coefficients.yaml")).unwrap();
    assert!(coeffs.contains("latency_model: step-table"), "{coeffs}");
    assert!(
        real.records.len() >= 60,
        "{} requests observed",
        real.records.len()
    );
    assert!((15..=30).contains(&n), "{n} held-out requests compared");
    assert!(
        e2e_w1 <= E2E_W1_MAX,
        "held-out E2E Wasserstein distance {:.1}% of the real mean (E2E MAPE {e2e_mape:.1}%)",
        e2e_w1 * 100.0
    );
    assert_eq!(qq.len(), 100);
    assert!(
        (lo..=hi).contains(&sim_ttft_p50),
        "predicted TTFT p50 {sim_ttft_p50} ms outside the real held-out interquartile range widened {TTFT_IQR_SLACK}× ({lo}–{hi} ms)"
    );
    assert!(r.report.with_extension("html").exists());
}
