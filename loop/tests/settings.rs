//! A real server whose KV cache size nothing gives (its /metrics has no
//! `vllm:cache_config_info`, its model no known config): `blis-loop` asks
//! for it in its own flags (`--replay-args`), names the model, and keeps
//! the observed trace.

use std::process::Command;

use clap::Parser;

#[test]
fn an_unknown_kv_cache_size_is_asked_for_through_replay_args() {
    let dir = tempfile::tempdir().unwrap();
    let config = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../replay/model-configs/llama-2-7b-hf/config.json"
    );
    // The mock under a name no config is known by, with SGLang's metric
    // names (which have no cache_config_info).
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
        "sglang",
    ])
    .unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let server = rt.block_on(blis_mockserver::start(&opts.config())).unwrap();
    let url = format!("http://{}", server.addr);
    let out = dir.path().join("loop");
    let done = Command::new(env!("CARGO_BIN_EXE_blis-loop"))
        .args(["--server-url", &url, "--duration-s", "1"])
        .args(["--aggregate-rate", "10", "--out", out.to_str().unwrap()])
        .output()
        .unwrap();
    rt.block_on(server.shutdown());
    let stderr = String::from_utf8_lossy(&done.stderr);
    assert!(!done.status.success(), "{stderr}");
    let last = stderr.lines().last().unwrap();
    assert!(
        last.starts_with("error: cannot tell the server's KV cache size")
            && last.contains(r#"--replay-args "--total-kv-blocks N"#)
            && last.contains("\"my-private-model\""),
        "{stderr}"
    );
    let real = out.join("real.yaml");
    assert!(
        last.ends_with(&format!("kept at {}", real.display())),
        "{stderr}"
    );
    let t = blis_traces::Trace::read(&real).unwrap();
    assert!(!t.records.is_empty(), "the observed requests are kept");
}
