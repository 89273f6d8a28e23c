//! What the fit will need, checked before a real server is observed: a
//! plan with enough requests to fit, and the server's KV cache size, which
//! the loop learns from its `/metrics` (`vllm:cache_config_info`) when its
//! model has no known config, and when nothing gives it, asks for in its
//! own flags (`--replay-args`) before anything of the workload is sent.

use std::process::{Command, Output};

use clap::Parser;

/// `blis-loop` for `seconds` at 10 requests/s against blis-mockserver
/// serving a model no config is known by, whose metrics look like
/// `style`'s.
fn loop_against(style: &str, seconds: &str, out: &std::path::Path) -> Output {
    let config = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../replay/model-configs/llama-2-7b-hf/config.json"
    );
    let opts = blis_mockserver::Opts::try_parse_from([
        "blis-mockserver",
        "--port",
        "0",
        "--model",
        "my-private-model",
        "--model-config",
        config,
        "--hardware",
        "H100",
        "--metrics-style",
        style,
    ])
    .unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let server = rt.block_on(blis_mockserver::start(&opts.config())).unwrap();
    let url = format!("http://{}", server.addr);
    let done = Command::new(env!("CARGO_BIN_EXE_blis-loop"))
        .args(["--server-url", &url, "--duration-s", seconds])
        .args(["--aggregate-rate", "10", "--out", out.to_str().unwrap()])
        .output()
        .unwrap();
    rt.block_on(server.shutdown());
    done
}

/// SGLang's metric names (no `cache_config_info`) and an unknown model:
/// refused before the observation, naming the model and the flag.
#[test]
fn an_unknown_kv_cache_size_is_asked_for_before_observing() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("loop");
    let done = loop_against("sglang", "3", &out);
    let stderr = String::from_utf8_lossy(&done.stderr);
    assert!(!done.status.success(), "{stderr}");
    let last = stderr.lines().last().unwrap();
    assert!(
        last.starts_with("error: cannot tell the server's KV cache size")
            && last.contains(r#"--replay-args "--total-kv-blocks N"#)
            && last.contains("\"my-private-model\"")
            && last.ends_with("no request of the workload was sent"),
        "{stderr}"
    );
    assert!(!out.join("real.yaml").exists(), "nothing was observed");
    assert!(!out.join("real.csv").exists(), "nothing was observed");
}

/// vLLM's metrics give the size the model's name does not: the loop
/// observes (30 requests, enough to fit), fits and compares.
#[test]
fn a_kv_cache_size_from_the_servers_metrics_is_enough() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("loop");
    let done = loop_against("vllm", "3", &out);
    let stderr = String::from_utf8_lossy(&done.stderr);
    assert!(
        stderr.contains("fitting blackbox coefficients on the observed trace"),
        "{stderr}"
    );
    assert!(
        stderr.contains("KV cache 7460 blocks of 16 tokens"),
        "{stderr}"
    );
    let t = blis_traces::Trace::read(&out.join("real.yaml")).unwrap();
    assert_eq!(
        t.header.server.and_then(|s| s.total_kv_blocks),
        Some(7460),
        "the observed header carries the size the fit used"
    );
    assert!(out.join("report.html").exists(), "{stderr}");
}

/// A plan too small to fit (20 requests of which the fit would take 14)
/// is refused before the server is contacted (none listens here).
#[test]
fn a_plan_too_small_to_fit_is_refused_before_sending() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("loop");
    let done = Command::new(env!("CARGO_BIN_EXE_blis-loop"))
        .args(["--server-url", "http://127.0.0.1:9", "--model", "m"])
        .args(["--duration-s", "2", "--aggregate-rate", "10"])
        .args(["--out", out.to_str().unwrap()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&done.stderr);
    assert!(!done.status.success(), "{stderr}");
    let last = stderr.lines().last().unwrap();
    assert!(
        last.starts_with("error: the workload plans ")
            && last.contains("(--duration-s 2 at --aggregate-rate 10)")
            && last.contains("needs at least 20")
            && last.ends_with("nothing was sent"),
        "{stderr}"
    );
    assert!(!out.join("real.yaml").exists());
}
