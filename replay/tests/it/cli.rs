//! The `blis-replay` binary as a user runs it.

use assert_cmd::Command;
use blis_traces::{Mode, Status, Trace};

use crate::common::shared;

fn replay() -> Command {
    Command::cargo_bin("blis-replay").expect("binary built")
}

/// `blis-replay run` of the design's two-client workload cut to `n`
/// requests, for `model` (more flags and `--out` to add).
/// The summary (`OUT.summary.json`) of a replay written to `out`.
fn summary_of(out: &std::path::Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(out.with_extension("summary.json")).unwrap())
        .unwrap()
}

fn two_clients(n: u32, model: &str) -> Command {
    let mut c = replay();
    c.args(["run", "--workload-spec"])
        .arg(shared().join("examples/two-client-workload.yaml"))
        .args(["--num-requests", &n.to_string(), "--model", model]);
    c
}

#[test]
fn a_spec_replays_to_a_readable_trace_summary_and_time_series() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("pred");
    let assert = replay()
        .args(["run", "--workload-spec"])
        .arg(shared().join("examples/two-client-workload.yaml"))
        .args([
            "--num-requests",
            "300",
            "--model",
            "meta-llama/Llama-3.1-8B-Instruct",
            "--out",
        ])
        .arg(&out)
        .assert()
        .success();
    let stdout = String::from_utf8(assert.get_output().stdout.clone()).unwrap();
    // Llama-3.1-8B's config is bundled: trained-physics by default, and the
    // run says why.
    assert!(stdout.contains("trained-physics latency model"), "{stdout}");
    assert!(
        stdout.contains("latency model trained-physics (default: the model's config is known"),
        "{stdout}"
    );
    assert!(stdout.contains("| TTFT |"), "{stdout}");
    let t = Trace::read(&out.with_extension("yaml")).unwrap();
    assert_eq!(t.header.mode, Mode::Replayed);
    assert_eq!(t.records.len(), 300);
    assert!(
        t.records
            .iter()
            .all(|r| r.outcome.status == Some(Status::Ok))
    );
    let chunks = t.chunks.unwrap();
    let streamed: u64 = t
        .records
        .iter()
        .filter(|r| r.request.streaming)
        .map(|r| u64::from(r.outcome.num_chunks))
        .sum();
    assert_eq!(chunks.len() as u64, streamed);
    let metrics = t.metrics.unwrap();
    assert!(
        metrics
            .iter()
            .any(|m| m.name == "vllm:num_requests_running")
    );
    assert!(metrics.iter().any(|m| m.name == "vllm:kv_cache_usage_perc"));
    let summary = summary_of(&out);
    assert_eq!(summary["requests"]["completed"], 300);
    assert!(summary["ttft_ms"]["p99"].as_f64().unwrap() > 0.0);
}

#[test]
fn a_prefix_with_a_dot_keeps_every_output_beside_the_trace() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run-0.9");
    replay()
        .args(["run", "--workload-spec"])
        .arg(shared().join("examples/two-client-workload.yaml"))
        .args([
            "--num-requests",
            "20",
            "--model",
            "meta-llama/Llama-3.1-8B-Instruct",
            "--trace-level",
            "decisions",
            "--out",
        ])
        .arg(&out)
        .assert()
        .success();
    for ext in ["yaml", "csv", "summary.json", "decisions.jsonl"] {
        let p = dir.path().join(format!("run-0.9.{ext}"));
        assert!(p.exists(), "{} missing", p.display());
    }
    assert!(!dir.path().join("run-0.summary.json").exists());
    // A folder as the prefix would hide the outputs in it (`out/.yaml`):
    // refused before anything runs, with a prefix that works.
    let folder = format!("{}/", dir.path().display());
    let out = replay()
        .args(["run", "--workload-spec"])
        .arg(shared().join("examples/two-client-workload.yaml"))
        .args([
            "--model",
            "meta-llama/Llama-3.1-8B-Instruct",
            "--out",
            &folder,
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("is a folder") && err.contains(&format!("{folder}run")),
        "{err}"
    );
    assert!(!dir.path().join(".yaml").exists());
}

#[test]
fn the_same_inputs_give_byte_identical_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let run = |name: &str| {
        std::fs::create_dir_all(dir.path().join(name)).unwrap();
        let out = dir.path().join(name).join("pred");
        replay()
            .args(["run", "--workload-spec"])
            .arg(shared().join("examples/two-client-workload.yaml"))
            .args([
                "--num-requests",
                "200",
                "--latency-model",
                "roofline",
                "--model",
                "qwen2.5-7b-instruct",
                "--out",
            ])
            .arg(&out)
            .assert()
            .success();
        [
            "yaml",
            "csv",
            "itl.csv",
            "steps.csv",
            "metrics.csv",
            "summary.json",
        ]
        .map(|ext| std::fs::read(out.with_extension(ext)).unwrap())
    };
    let (a, b) = (run("a"), run("b"));
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert!(x == y, "output file {i} differs between two runs");
    }
}

#[test]
fn a_ground_truth_run_replays_with_its_recorded_server_settings() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("gt");
    let src = format!(
        "vllm-gt:{}",
        shared()
            .join("vllm-ground-truth/train/20260218-155500-codellama-34b-tp2-roleplay")
            .display()
    );
    replay()
        .args([
            "run",
            "--import",
            &src,
            "--num-requests",
            "400",
            "--no-itl",
            "--out",
        ])
        .arg(&out)
        .assert()
        .success();
    let t = Trace::read(&out.with_extension("yaml")).unwrap();
    let s = t.header.server.unwrap();
    assert_eq!(
        (
            s.max_num_seqs,
            s.max_num_batched_tokens,
            s.total_kv_blocks,
            s.tensor_parallel
        ),
        (Some(128), Some(2048), Some(26602), Some(2))
    );
    // Predicted send times are the recorded ones (same run start).
    let real = blis_traces::import(&src.parse().unwrap(), 42).unwrap();
    let sends: std::collections::BTreeMap<u64, i64> = real
        .records
        .iter()
        .map(|r| (r.request.request_id, r.outcome.send_time_us.unwrap()))
        .collect();
    for r in &t.records {
        assert_eq!(Some(sends[&r.request.request_id]), r.outcome.send_time_us);
    }
}

#[test]
fn errors_are_one_line_and_exit_nonzero() {
    let dir = tempfile::tempdir().unwrap();
    let a = replay()
        .args(["run", "--workload-spec"])
        .arg(shared().join("examples/two-client-workload.yaml"))
        .args([
            "--num-requests",
            "10",
            "--model",
            "gpt-9",
            "--latency-model",
            "roofline",
            "--out",
        ])
        .arg(dir.path().join("x"))
        .assert()
        .code(1);
    let err = String::from_utf8_lossy(&a.get_output().stderr).into_owned();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("no bundled config for model \"gpt-9\""),
        "{err}"
    );
    let a = replay()
        .args(["run", "--trace"])
        .arg(dir.path().join("missing.yaml"))
        .args(["--out"])
        .arg(dir.path().join("x"))
        .assert()
        .code(1);
    let err = String::from_utf8_lossy(&a.get_output().stderr).into_owned();
    assert!(err.contains("missing.yaml"), "{err}");
    replay()
        .args([
            "run",
            "--out",
            "x",
            "--trace",
            "a",
            "--import",
            "mooncake:b",
        ])
        .assert()
        .code(2);
}

/// An out-of-range server setting or horizon is a one-line error that
/// names the setting and says why, not a symptom further down (a block
/// size of 0 was reported as "total_kv_blocks must be positive", a NaN or
/// negative horizon as "0 µs is beyond 2^53 µs"), and a GPU memory
/// fraction above 1 is refused as vLLM refuses it, not turned into a KV
/// cache larger than the GPU.
#[test]
fn bad_settings_are_named_in_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&[&str], &str); 8] = [
        (&["--block-size", "0"], "block_size must be positive"),
        (
            &["--block-size", "4294967295"],
            "block_size 4294967295 is above",
        ),
        (
            &["--gpu-memory-utilization", "2"],
            "gpu_memory_utilization 2: must be a fraction of GPU memory in (0, 1]",
        ),
        (
            &["--gpu-memory-utilization", "NaN"],
            "gpu_memory_utilization NaN",
        ),
        (
            &["--gpu-memory-utilization", "0.01"],
            "total_kv_blocks: 0: qwen/qwen2.5-7b-instruct's weights and vLLM's start-up profile of 2048 batched tokens leave no room for a KV block in 0.01 of 1 H100's memory",
        ),
        (
            &["--total-kv-blocks", "0"],
            "total_kv_blocks: 0 (--total-kv-blocks)",
        ),
        (
            &["--horizon-s", "NaN"],
            "--horizon-s must be a positive number of seconds, got NaN",
        ),
        (
            &["--horizon-s", "-1"],
            "--horizon-s must be a positive number of seconds, got -1",
        ),
    ];
    for (flags, want) in cases {
        let a = two_clients(10, "qwen/qwen2.5-7b-instruct")
            .args(["--hardware", "H100", "--latency-model", "roofline"])
            .args(flags)
            .arg("--out")
            .arg(dir.path().join("x"))
            .assert()
            .code(1);
        let err = String::from_utf8_lossy(&a.get_output().stderr).into_owned();
        assert_eq!(err.lines().count(), 1, "{flags:?}: {err}");
        assert!(err.contains(want), "{flags:?}: {err}");
    }
}

/// Ctrl-C stops a replay at its next event and still writes every output:
/// each planned request is in the trace once, those completed before the
/// stop as `ok` and the rest cancelled as interrupted, the summary counts
/// them unfinished, and the exit code says "interrupted". (The process
/// used to die at once, its buffered rows lost and its header left
/// incomplete.)
#[test]
fn ctrl_c_stops_a_replay_and_keeps_every_request() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("o");
    // (The whole replay takes about 3 s in a debug build on 2 cores; the
    // signal comes about 0.1 s in.)
    let n = 400_000;
    let child = std::process::Command::new(assert_cmd::cargo::cargo_bin!("blis-replay"))
        .args(["run", "--workload-spec"])
        .arg(shared().join("bench/race-1k-x1.yaml"))
        .args([
            "--num-requests",
            &n.to_string(),
            "--model",
            "qwen/qwen2.5-7b-instruct",
            "--hardware",
            "H100",
            "--latency-model",
            "roofline",
            "--out",
        ])
        .arg(&prefix)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Signalled once the first completed requests reach the trace.
    let csv = prefix.with_extension("csv");
    let started = std::time::Instant::now();
    while std::fs::metadata(&csv).map_or(0, |m| m.len()) < 4096 {
        assert!(started.elapsed().as_secs() < 120, "no rows after 120 s");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let killed = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(
        stderr.contains("error: interrupted: the replay stopped early; "),
        "{stderr}"
    );
    let t = Trace::read(&prefix.with_extension("yaml")).expect("the trace reads back");
    assert_eq!(t.records.len(), n);
    let ok = t
        .records
        .iter()
        .filter(|r| r.outcome.status == Some(Status::Ok))
        .count();
    let stopped = t
        .records
        .iter()
        .filter(|r| r.outcome.error_message == "replay interrupted before it finished")
        .count();
    assert!(
        ok > 0 && stopped > 0 && ok + stopped == n,
        "{ok} ok, {stopped} stopped"
    );
    let summary: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(prefix.with_extension("summary.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(summary["requests"]["unfinished"], stopped);
}

/// Times past 2^53 µs are refused by name: a sample interval of 2^64 - 1
/// ms overflowed to a negative one and the replay never ended, and an
/// admission latency of 2^63 - 1 µs overflowed the clock it was added to.
#[test]
fn times_past_2_pow_53_us_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let run = |flags: &[&str]| {
        two_clients(10, "meta-llama/Llama-3.1-8B-Instruct")
            .args(flags)
            .arg("--out")
            .arg(dir.path().join("x"))
            .timeout(std::time::Duration::from_secs(60))
            .assert()
    };
    let max = "9223372036854775807";
    for (flags, want) in [
        (
            vec!["--admission-latency-us", max],
            "admission_latency_us must be ≥ 0 and at most 2^53 µs (285 years), got 9223372036854775807",
        ),
        (
            vec![
                "--num-instances",
                "2",
                "--snapshot-refresh-interval-us",
                max,
            ],
            "snapshot_refresh_interval_us must be ≥ 0 and at most 2^53 µs",
        ),
        (
            vec!["--kv-cpu-blocks", "100", "--kv-thrashing-window-us", max],
            "--kv-thrashing-window-us must be from 0 to 2^53 µs",
        ),
    ] {
        let a = run(&flags).code(1);
        let err = String::from_utf8_lossy(&a.get_output().stderr).into_owned();
        assert_eq!(err.lines().count(), 1, "{flags:?}: {err}");
        assert!(err.contains(want), "{flags:?}: {err}");
    }
    let a = run(&["--sample-interval-ms", "18446744073709551615"]).code(2);
    let err = String::from_utf8_lossy(&a.get_output().stderr).into_owned();
    assert!(err.contains("--sample-interval-ms"), "{err}");
}

/// A client timeout too long to matter is no timeout: 1e300 s overflowed
/// each request's deadline to before its send, and cancelled 195 of 200.
#[test]
fn an_enormous_client_timeout_cancels_nothing() {
    let dir = tempfile::tempdir().unwrap();
    for t in ["300", "1e300"] {
        let out = dir.path().join(format!("t{t}"));
        two_clients(200, "meta-llama/Llama-3.1-8B-Instruct")
            .args(["--client-timeout-s", t, "--out"])
            .arg(&out)
            .assert()
            .success();
        let summary = summary_of(&out);
        assert_eq!(
            summary["requests"]["completed"], 200,
            "--client-timeout-s {t}"
        );
    }
}

/// A trace header's `gpu_memory_utilization` sizes the KV cache when the
/// header gives no `total_kv_blocks` (the flag's default of 0.9 used to
/// hide it); the flag still wins.
#[test]
fn the_headers_gpu_memory_fraction_sizes_the_kv_cache() {
    let dir = tempfile::tempdir().unwrap();
    let first = dir.path().join("first");
    two_clients(20, "qwen/qwen2.5-7b-instruct")
        .args(["--hardware", "H100", "--latency-model", "roofline", "--out"])
        .arg(&first)
        .assert()
        .success();
    // The same trace, its header saying 0.5 of the GPU and no KV size.
    let header = std::fs::read_to_string(first.with_extension("yaml")).unwrap();
    let header: String = header
        .lines()
        .filter(|l| !l.trim_start().starts_with("total_kv_blocks:"))
        .map(|l| {
            if l == "server:" {
                "server:\n  gpu_memory_utilization: 0.5\n".to_string()
            } else {
                format!("{l}\n")
            }
        })
        .collect();
    assert!(header.contains("gpu_memory_utilization: 0.5"), "{header}");
    std::fs::write(first.with_extension("yaml"), header).unwrap();
    let blocks = |flags: &[&str]| {
        let out = dir.path().join("again");
        replay()
            .args(["run", "--trace"])
            .arg(first.with_extension("yaml"))
            .args(["--latency-model", "roofline"])
            .args(flags)
            .arg("--out")
            .arg(&out)
            .assert()
            .success();
        let summary = summary_of(&out);
        summary["kv"]["total_blocks"].as_u64().unwrap()
    };
    let recorded = blocks(&[]);
    let flagged = blocks(&["--gpu-memory-utilization", "0.9"]);
    assert!(recorded < flagged / 2, "{recorded} vs {flagged}");
}

/// `--horizon-s` cuts a trace as it cuts a spec: only the requests that
/// arrive before it are replayed (it was accepted and ignored for a trace).
#[test]
fn a_horizon_cuts_a_trace_at_its_arrivals() {
    let dir = tempfile::tempdir().unwrap();
    let first = dir.path().join("first");
    two_clients(200, "meta-llama/Llama-3.1-8B-Instruct")
        .arg("--out")
        .arg(&first)
        .assert()
        .success();
    let t = Trace::read(&first.with_extension("yaml")).unwrap();
    let mut arrivals: Vec<i64> = t
        .records
        .iter()
        .map(|r| r.request.arrival_time_us)
        .collect();
    arrivals.sort_unstable();
    let horizon_us = arrivals[100];
    let before = arrivals.iter().filter(|&&a| a < horizon_us).count();
    assert!((50..200).contains(&before), "{before}");
    let cut = dir.path().join("cut");
    replay()
        .args(["run", "--trace"])
        .arg(first.with_extension("yaml"))
        .args(["--horizon-s", &format!("{}", horizon_us as f64 / 1e6)])
        .arg("--out")
        .arg(&cut)
        .assert()
        .success();
    let c = Trace::read(&cut.with_extension("yaml")).unwrap();
    assert_eq!(c.records.len(), before);
    assert!(
        c.records
            .iter()
            .all(|r| r.request.arrival_time_us < horizon_us)
    );
}

/// Files saved by Windows editors start with a UTF-8 byte-order mark: a
/// model's `config.json`, a GPU table and a Mooncake trace read the same
/// with it as without (JSON's parser refused them at line 1 column 1),
/// and a GPU table that is not JSON is an error naming its file.
#[test]
fn files_with_a_byte_order_mark_read_as_without() {
    let dir = tempfile::tempdir().unwrap();
    let bom = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, format!("\u{feff}{text}")).unwrap();
        p
    };
    let config = bom(
        "config.json",
        &std::fs::read_to_string(shared().join("model-configs/llama-2-7b-hf/config.json")).unwrap(),
    );
    let gpus = bom(
        "gpus.json",
        &std::fs::read_to_string(shared().join("model-configs/hardware_config.json")).unwrap(),
    );
    let trace = bom(
        "trace.jsonl",
        "{\"timestamp\": 0, \"input_length\": 40, \"output_length\": 3, \"hash_ids\": [0]}\n\
         {\"timestamp\": 5, \"input_length\": 40, \"output_length\": 3, \"hash_ids\": [0]}\n",
    );
    let out = dir.path().join("o");
    let run = |gpus: &std::path::Path| {
        replay()
            .args(["run", "--import"])
            .arg(format!("mooncake:{}", trace.display()))
            .arg("--model-config")
            .arg(&config)
            .arg("--hardware-config")
            .arg(gpus)
            .args(["--hardware", "H100", "--latency-model", "roofline", "--out"])
            .arg(&out)
            .assert()
    };
    run(&gpus).success();
    let t = Trace::read(&out.with_extension("yaml")).unwrap();
    assert_eq!(t.records.len(), 2);
    assert!(
        t.records
            .iter()
            .all(|r| r.outcome.status == Some(Status::Ok))
    );

    let not_json = dir.path().join("gpus.txt");
    std::fs::write(&not_json, "H100: fast\n").unwrap();
    let a = run(&not_json).code(1);
    let err = String::from_utf8_lossy(&a.get_output().stderr).into_owned();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("gpus.txt: invalid JSON: expected value at line 1 column 1"),
        "{err}"
    );
}

/// A run whose engine cannot serve its requests says why and what would
/// serve them, and its latency table shows dashes where nothing was
/// measured (it printed NaN).
#[test]
fn dropped_requests_are_explained_and_empty_latencies_are_dashes() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("o");
    for (flag, value, why, hint) in [
        (
            "--total-kv-blocks",
            "1",
            "the first: unservable: needs ",
            "more KV blocks (--total-kv-blocks",
        ),
        (
            "--max-model-len",
            "16",
            "reaches max_model_len 16",
            "a larger --max-model-len",
        ),
    ] {
        let a = replay()
            .args(["run", "--workload-spec"])
            .arg(shared().join("examples/two-client-workload.yaml"))
            .args([
                "--num-requests",
                "5",
                "--model",
                "meta-llama/Llama-3.1-8B-Instruct",
                "--latency-model",
                "roofline",
                flag,
                value,
                "--out",
            ])
            .arg(&out)
            .assert()
            .success();
        let stdout = String::from_utf8_lossy(&a.get_output().stdout).into_owned();
        assert!(
            stdout.contains("warning: 5 of 5 requests were dropped as unservable;"),
            "{stdout}"
        );
        assert!(stdout.contains(why) && stdout.contains(hint), "{stdout}");
        assert!(stdout.contains("| E2E | 0 | — | — |"), "{stdout}");
        assert!(!stdout.contains("NaN"), "{stdout}");
        let summary = summary_of(&out);
        assert!(
            summary["first_drop_reason"]
                .as_str()
                .unwrap()
                .contains(why.trim_start_matches("the first: ")),
            "{summary}"
        );
    }
}

/// A spec whose arrivals run past what a trace can hold (2^53 µs) before
/// its `num_requests` is an error naming the spec and the count, with a
/// non-zero exit: a workload generated as the replay reads it never ends
/// early in silence (a rate of 1e-300 req/s used to replay 0 requests and
/// exit 0).
#[test]
fn a_workload_that_ends_short_of_its_count_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("slow.yaml");
    std::fs::write(
        &spec,
        "seed: 1\naggregate_rate: 1.0e-300\nnum_requests: 5\nclients:\n  - id: a\n    rate_fraction: 1.0\n    arrival: {process: poisson}\n    input_distribution: {type: constant, params: {value: 100}}\n    output_distribution: {type: constant, params: {value: 10}}\n",
    )
    .unwrap();
    let a = replay()
        .args(["run", "--workload-spec"])
        .arg(&spec)
        .args(["--model", "meta-llama/Llama-3.1-8B-Instruct", "--out"])
        .arg(dir.path().join("x"))
        .assert()
        .code(1);
    let err = String::from_utf8_lossy(&a.get_output().stderr).into_owned();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("slow.yaml: num_requests: only 0 of 5 requests arrive within 2^53 µs"),
        "{err}"
    );
}

/// `blis-replay run ... 2>&1 | head -4`: the reader goes away before the
/// summary is written. A closed pipe is a normal end: exit 0 (or the
/// run's own code), never a panic, and the trace is complete.
#[test]
fn a_closed_output_pipe_is_a_normal_end() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("pred");
    for (args, code) in [
        (vec!["--model", "meta-llama/Llama-3.1-8B-Instruct"], Some(0)),
        // No model: the error line is dropped, the exit code kept.
        (vec![], Some(1)),
    ] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let status = std::process::Command::new(assert_cmd::cargo::cargo_bin!("blis-replay"))
            .args(["run", "--workload-spec"])
            .arg(shared().join("examples/two-client-workload.yaml"))
            .args(["--num-requests", "200", "--out"])
            .arg(&out)
            .args(&args)
            .stdout(writer.try_clone().unwrap())
            .stderr(writer)
            .status()
            .unwrap();
        assert_eq!(status.code(), code, "{args:?}");
    }
    let t = Trace::read(&out.with_extension("yaml")).unwrap();
    assert_eq!(t.records.len(), 200);
}

/// Errors say what is wrong in the user's terms, once.
#[test]
fn errors_name_what_is_missing_once() {
    let dir = tempfile::tempdir().unwrap();
    let out = replay()
        .args(["run", "--workload-spec"])
        .arg(shared().join("examples/two-client-workload.yaml"))
        .args(["--num-requests", "10", "--out"])
        .arg(dir.path().join("x"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with("error: configuring the server: no model given")
            && err.contains("give --model NAME")
            && !err.contains("roofline"),
        "{err}"
    );
    let out = replay()
        .args(["run", "--workload-spec", "/nonexistent/w.yaml", "--out"])
        .arg(dir.path().join("x"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.matches("No such file or directory").count(), 1, "{err}");
    assert!(err.contains("/nonexistent/w.yaml"), "{err}");
    let out = replay()
        .args(["run", "--trace", "/nonexistent/t.yaml", "--out"])
        .arg(dir.path().join("x"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with("error: reading the trace /nonexistent/t.yaml: "),
        "{err}"
    );
    assert_eq!(err.matches("No such file or directory").count(), 1, "{err}");
    // A negative number is a value, judged by its flag.
    let out = replay()
        .args(["run", "--workload-spec"])
        .arg(shared().join("examples/two-client-workload.yaml"))
        .args(["--max-num-seqs", "-1", "--out"])
        .arg(dir.path().join("x"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("invalid value '-1' for '--max-num-seqs"),
        "{err}"
    );
}

/// BLIS's flag names are accepted where ours differ (same meaning and
/// unit): the same cluster replay spelled either way writes the same files.
#[test]
fn blis_flag_names_are_aliases_of_ours() {
    let dir = tempfile::tempdir().unwrap();
    let spec = shared().join("examples/two-client-workload.yaml");
    let run = |out: &std::path::Path, flags: &[&str]| {
        replay()
            .args(["run", "--workload-spec"])
            .arg(&spec)
            .args([
                "--num-requests",
                "200",
                "--model",
                "meta-llama/Llama-3.1-8B-Instruct",
                "--num-instances",
                "2",
            ])
            .args(flags)
            .arg("--out")
            .arg(out)
            .assert()
            .success();
    };
    let ours = dir.path().join("ours");
    run(
        &ours,
        &[
            "--max-num-seqs",
            "8",
            "--max-num-batched-tokens",
            "512",
            "--block-size",
            "32",
            "--admission",
            "always-admit",
            "--routing",
            "least-loaded",
            "--admission-latency-us",
            "100",
            "--routing-latency-us",
            "50",
        ],
    );
    let blis = dir.path().join("blis");
    run(
        &blis,
        &[
            "--max-num-running-reqs",
            "8",
            "--max-num-scheduled-tokens",
            "512",
            "--block-size-in-tokens",
            "32",
            "--admission-policy",
            "always-admit",
            "--routing-policy",
            "least-loaded",
            "--admission-latency",
            "100",
            "--routing-latency",
            "50",
        ],
    );
    for ext in ["csv", "summary.json"] {
        assert_eq!(
            std::fs::read(ours.with_extension(ext)).unwrap(),
            std::fs::read(blis.with_extension(ext)).unwrap(),
            "{ext}"
        );
    }
    // And the flags took effect: without them the prediction differs.
    let plain = dir.path().join("plain");
    run(&plain, &[]);
    assert_ne!(
        std::fs::read(ours.with_extension("csv")).unwrap(),
        std::fs::read(plain.with_extension("csv")).unwrap()
    );
}

/// The ITL companion's step form (the default) holds exactly the rows of
/// BLIS's form (`--itl-rows`): `expand-itl` writes them byte for byte and
/// `Trace::read` expands it to the same chunks, on a cluster run with
/// preemption, fast-forwarded runs cut by arrivals, sessions, client
/// timeouts and a non-zero output overhead (trained-physics' hop).
#[test]
fn the_step_form_of_the_itl_companion_expands_to_the_rows_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let args = |out: &std::path::Path| {
        let mut v: Vec<std::ffi::OsString> = [
            "run",
            "--workload-spec",
            "../examples/reasoning-multiturn.yaml",
            "--num-requests",
            "600",
            "--model",
            "meta-llama/Llama-3.1-8B-Instruct",
            "--latency-model",
            "trained-physics",
            "--num-instances",
            "3",
            "--routing",
            "least-loaded",
            "--total-kv-blocks",
            "700",
            "--max-num-seqs",
            "24",
            "--client-timeout-s",
            "40",
            "--out",
        ]
        .iter()
        .map(Into::into)
        .collect();
        v.push(out.into());
        v
    };
    let steps = dir.path().join("steps");
    let rows = dir.path().join("rows");
    replay().args(args(&steps)).assert().success();
    replay()
        .args(args(&rows))
        .arg("--itl-rows")
        .assert()
        .success();
    let expanded = dir.path().join("expanded.itl.csv");
    replay()
        .args(["expand-itl", "--trace"])
        .arg(steps.with_extension("yaml"))
        .arg("--out")
        .arg(&expanded)
        .assert()
        .success();
    let want = std::fs::read(rows.with_extension("itl.csv")).unwrap();
    assert!(want.len() > 100_000, "a run with many tokens");
    assert!(
        std::fs::read(&expanded).unwrap() == want,
        "expanded rows differ from --itl-rows"
    );
    let compact = std::fs::metadata(steps.with_extension("itl.csv"))
        .unwrap()
        .len()
        + std::fs::metadata(steps.with_extension("steps.csv"))
            .unwrap()
            .len();
    assert!(
        compact * 4 < want.len() as u64,
        "{compact} vs {}",
        want.len()
    );
    for ext in ["csv", "metrics.csv", "summary.json"] {
        assert_eq!(
            std::fs::read(steps.with_extension(ext)).unwrap(),
            std::fs::read(rows.with_extension(ext)).unwrap(),
            "{ext}"
        );
    }
    let a = Trace::read(&steps.with_extension("yaml")).unwrap();
    let b = Trace::read(&rows.with_extension("yaml")).unwrap();
    assert!(a.header.itl_steps.is_some() && b.header.itl_steps.is_none());
    assert_eq!(a.chunks, b.chunks);
    let s: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(rows.with_extension("summary.json")).unwrap(),
    )
    .unwrap();
    assert!(
        s["preemptions"].as_u64().unwrap() > 0,
        "preemption exercised"
    );
}

/// On one instance the outputs are those of stepping one batch at a time:
/// the ITL rows come in step order (each step's in running order) whether
/// or not steps were fast-forwarded together, and neither the trace nor
/// the time series depends on fast-forward or on the sample interval (the
/// samples read a run in flight where it has got to).
#[test]
fn single_instance_outputs_do_not_depend_on_fast_forward_or_sampling() {
    let dir = tempfile::tempdir().unwrap();
    let run = |name: &str, extra: &[&str]| {
        std::fs::create_dir_all(dir.path().join(name)).unwrap();
        let out = dir.path().join(name).join("pred");
        replay()
            .args([
                "run",
                "--workload-spec",
                "../examples/chat-512.yaml",
                "--num-requests",
                "400",
                "--model",
                "meta-llama/Llama-3.1-8B-Instruct",
                "--latency-model",
                "trained-physics",
                "--itl-rows",
                "--out",
            ])
            .arg(&out)
            .args(extra)
            .assert()
            .success();
        out
    };
    let single = run("single", &["--no-fast-forward"]);
    let ff = run("ff", &[]);
    let ff_sparse = run("ff-sparse", &["--sample-interval-ms", "1000"]);
    let single_sparse = run(
        "single-sparse",
        &["--no-fast-forward", "--sample-interval-ms", "1000"],
    );
    let read = |p: &std::path::Path, ext: &str| std::fs::read(p.with_extension(ext)).unwrap();
    for ext in ["csv", "itl.csv", "metrics.csv"] {
        assert!(
            read(&single, ext) == read(&ff, ext),
            "{ext} differs with fast-forward"
        );
    }
    for ext in ["csv", "itl.csv"] {
        assert!(
            read(&ff, ext) == read(&ff_sparse, ext),
            "{ext} depends on the sample interval"
        );
    }
    assert!(
        read(&ff_sparse, "metrics.csv") == read(&single_sparse, "metrics.csv"),
        "sparse samples differ with fast-forward"
    );
}

#[test]
fn a_cpu_kv_tier_reports_its_offloads_and_reloads_and_reruns_identically() {
    let dir = tempfile::tempdir().unwrap();
    let run = |name: &str, extra: &[&str]| {
        std::fs::create_dir_all(dir.path().join(name)).unwrap();
        let out = dir.path().join(name).join("pred");
        let assert = replay()
            .args(["run", "--workload-spec"])
            .arg(shared().join("examples/two-client-workload.yaml"))
            .args([
                "--num-requests",
                "600",
                "--model",
                "meta-llama/Llama-3.1-8B-Instruct",
                "--total-kv-blocks",
                "400",
                "--kv-offload-threshold",
                "0.3",
                "--no-itl",
                "--out",
            ])
            .arg(&out)
            .args(extra)
            .assert()
            .success();
        let stdout = String::from_utf8(assert.get_output().stdout.clone()).unwrap();
        let files: Vec<Vec<u8>> = ["yaml", "csv", "metrics.csv", "summary.json"]
            .iter()
            .map(|e| std::fs::read(out.with_extension(e)).unwrap())
            .collect();
        (stdout, files)
    };
    let (stdout, a) = run("a", &["--kv-cpu-blocks", "5000"]);
    assert!(stdout.contains("CPU KV tier: 5000 blocks"), "{stdout}");
    let (_, b) = run("b", &["--kv-cpu-blocks", "5000"]);
    assert!(a == b, "a rerun with a CPU tier changed its outputs");
    // Stepped one at a time, the same records and time series: a sample
    // inside a run of decode steps sees the offloads of the blocks its
    // steps took by then.
    let (_, single) = run("single", &["--kv-cpu-blocks", "5000", "--no-fast-forward"]);
    assert!(a[1] == single[1], "records differ with fast-forward");
    assert!(
        a[2] == single[2],
        "the time series differs with fast-forward"
    );
    let summary: serde_json::Value = serde_json::from_slice(&a[3]).unwrap();
    let tier = &summary["kv"]["cpu_tier"];
    assert!(tier["offloads"].as_u64().unwrap() > 0, "{tier}");
    assert!(tier["reloads"].as_u64().unwrap() > 0, "{tier}");
    let metrics = String::from_utf8(a[2].clone()).unwrap();
    assert!(metrics.contains("vllm:external_prefix_cache_hits_total"));
    assert!(metrics.contains("blis:kv_offloads_total"));
    // Without the tier (and --kv-cpu-blocks 0), no tier figures.
    let (_, c) = run("c", &["--kv-cpu-blocks", "0"]);
    let summary: serde_json::Value = serde_json::from_slice(&c[3]).unwrap();
    assert!(summary["kv"].get("cpu_tier").is_none());
}

#[test]
fn bad_cpu_tier_settings_are_one_line_errors() {
    for (args, needle) in [
        (
            &["--kv-cpu-blocks", "100", "--kv-offload-threshold", "1.5"][..],
            "--kv-offload-threshold",
        ),
        (
            &["--kv-cpu-blocks", "100", "--kv-transfer-bandwidth", "0"][..],
            "--kv-transfer-bandwidth",
        ),
        (&["--kv-transfer-bandwidth", "10"][..], "--kv-cpu-blocks"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let assert = replay()
            .args(["run", "--workload-spec"])
            .arg(shared().join("examples/two-client-workload.yaml"))
            .args([
                "--num-requests",
                "10",
                "--model",
                "meta-llama/Llama-3.1-8B-Instruct",
            ])
            .args(args)
            .arg("--out")
            .arg(dir.path().join("x"))
            .assert()
            .failure();
        let stderr = String::from_utf8(assert.get_output().stderr.clone()).unwrap();
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    }
}

#[test]
fn a_pd_split_reports_its_pools_and_hand_offs() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("pd");
    let assert = replay()
        .args(["run", "--workload-spec"])
        .arg(shared().join("examples/two-client-workload.yaml"))
        .args([
            "--num-requests",
            "300",
            "--model",
            "meta-llama/Llama-3.1-8B-Instruct",
            "--architecture",
            "pd",
            "--prefill-instances",
            "2",
            "--decode-instances",
            "3",
            "--decode-routing",
            "round-robin",
            "--slo",
            "ttft_ms=100000,tpot_ms=100000",
            "--trace-level",
            "decisions",
            "--no-itl",
            "--out",
        ])
        .arg(&out)
        .assert()
        .success();
    let stdout = String::from_utf8(assert.get_output().stdout.clone()).unwrap();
    assert!(
        stdout.contains("P/D: 2 prefill + 3 decode instances"),
        "{stdout}"
    );
    let s = summary_of(&out);
    assert_eq!(s["requests"]["completed"], 300);
    // Generous SLOs: every request attains them.
    assert_eq!(s["slo"]["attained"], 300);
    assert!(s["slo"]["goodput_per_s"].as_f64().unwrap() > 0.0);
    assert!(stdout.contains("SLO attainment: 100.0%"), "{stdout}");
    let c = &s["cluster"];
    assert_eq!(c["num_instances"], 5);
    let pools: Vec<&str> = c["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["pool"].as_str().unwrap())
        .collect();
    assert_eq!(pools, ["prefill", "prefill", "decode", "decode", "decode"]);
    assert!(c["pd"]["transfers"].as_u64().unwrap() > 0);
    // Round-robin over the decode pool: 100 each of its multi-token requests.
    let routed: Vec<u64> = c["instances"].as_array().unwrap()[2..]
        .iter()
        .map(|i| i["routed"].as_u64().unwrap())
        .collect();
    assert!(
        routed.iter().max().unwrap() - routed.iter().min().unwrap() <= 1,
        "{routed:?}"
    );
    // Both routing steps are in the decision trace, in time order.
    let lines: Vec<serde_json::Value> =
        std::fs::read_to_string(out.with_extension("decisions.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
    let stage = |st: &str| lines.iter().filter(|l| l["stage"] == st).count() as u64;
    assert_eq!(stage("prefill"), 300);
    assert_eq!(stage("decode"), c["pd"]["transfers"].as_u64().unwrap());
    assert!(
        lines
            .iter()
            .filter(|l| l["stage"] == "decode")
            .all(|l| l["instance"].as_u64().unwrap() >= 2 && l["status"] == "ok")
    );
    assert!(
        lines
            .windows(2)
            .all(|w| w[0]["time_us"].as_i64() <= w[1]["time_us"].as_i64())
    );
    // Each pool has its own time series beside the cluster's.
    let metrics = std::fs::read_to_string(out.with_extension("metrics.csv")).unwrap();
    for pool in ["prefill", "decode"] {
        let label = format!("pool=\"\"{pool}\"\"\"");
        assert!(metrics.contains(&label), "{pool}");
    }
    // P/D settings without the split, and unknown names, are errors.
    for (args, needle) in [
        (&["--prefill-instances", "2"][..], "--architecture pd"),
        (
            &["--architecture", "pd", "--decode-routing", "nearest"][..],
            "--decode-routing",
        ),
        (
            &["--architecture", "pd", "--decode-instances", "0"][..],
            "decode_instances",
        ),
    ] {
        let assert = replay()
            .args(["run", "--workload-spec"])
            .arg(shared().join("examples/two-client-workload.yaml"))
            .args([
                "--num-requests",
                "10",
                "--model",
                "meta-llama/Llama-3.1-8B-Instruct",
            ])
            .args(args)
            .arg("--out")
            .arg(dir.path().join("x"))
            .assert()
            .failure();
        let stderr = String::from_utf8(assert.get_output().stderr.clone()).unwrap();
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
}

#[test]
fn an_autoscaled_run_reports_its_replicas_cost_and_scale_events() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("as");
    let assert = replay()
        .args(["run", "--workload-spec"])
        .arg(shared().join("examples/two-client-workload.yaml"))
        .args([
            "--num-requests",
            "2000",
            "--model",
            "meta-llama/Llama-3.1-8B-Instruct",
            "--autoscaler",
            "threshold",
            "--autoscaler-max",
            "4",
            "--autoscaler-interval-s",
            "2",
            "--provisioning-delay-s",
            "3",
            "--warmup-s",
            "2",
            "--autoscaler-cooldown-s",
            "10",
            "--trace-level",
            "decisions",
            "--sample-interval-ms",
            "1000",
            "--no-itl",
            "--out",
        ])
        .arg(&out)
        .assert()
        .success();
    let stdout = String::from_utf8(assert.get_output().stdout.clone()).unwrap();
    assert!(
        stdout.contains("autoscaler (threshold, 1–4 replicas, ready 5 s after a scale-up)"),
        "{stdout}"
    );
    let s = summary_of(&out);
    assert_eq!(s["requests"]["completed"], 2000);
    let a = &s["cluster"]["autoscale"];
    assert_eq!(s["cluster"]["num_instances"], 4);
    let ups = a["scale_ups"].as_u64().unwrap();
    assert!(ups >= 1, "{a}");
    assert!(a["replica_seconds"].as_f64().unwrap() > 0.0);
    let events = a["events"].as_array().unwrap();
    assert_eq!(
        events.iter().filter(|e| e["action"] == "up").count() as u64,
        ups
    );
    // Every replica added is ready its 5 s later.
    for e in events.iter().filter(|e| e["action"] == "up") {
        let i = &e["instance"];
        let t = e["time_us"].as_i64().unwrap();
        assert!(
            events.iter().any(|r| r["action"] == "ready"
                && &r["instance"] == i
                && r["time_us"].as_i64() == Some(t + 5_000_000)),
            "{e}"
        );
    }
    // The scale events are in the decision trace among the routing
    // decisions, in time order.
    let lines: Vec<serde_json::Value> =
        std::fs::read_to_string(out.with_extension("decisions.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
    assert_eq!(
        lines.iter().filter(|l| l["kind"] == "scale").count(),
        events.len()
    );
    assert!(
        lines
            .windows(2)
            .all(|w| w[0]["time_us"].as_i64() <= w[1]["time_us"].as_i64())
    );
    // No request is routed to a slot before it is ready.
    for l in lines
        .iter()
        .filter(|l| l["kind"].is_null() && l["instance"].as_u64() != Some(0))
    {
        let i = &l["instance"];
        let t = l["time_us"].as_i64().unwrap();
        assert!(
            events.iter().any(|r| r["action"] == "ready"
                && &r["instance"] == i
                && r["time_us"].as_i64().unwrap() <= t),
            "{l}"
        );
    }
    let metrics = std::fs::read_to_string(out.with_extension("metrics.csv")).unwrap();
    assert!(metrics.contains("blis:replicas_ready"));
    // Settings without an autoscaler, and nonsense, are errors.
    for (args, needle) in [
        (&["--autoscaler-max", "4"][..], "--autoscaler"),
        (
            &["--autoscaler", "threshold", "--autoscaler-min", "0"][..],
            "min_replicas",
        ),
        (
            &[
                "--autoscaler",
                "threshold",
                "--autoscaler-min",
                "5",
                "--autoscaler-max",
                "2",
            ][..],
            "max_replicas",
        ),
        (
            &["--autoscaler", "threshold", "--warmup-s", "NaN"][..],
            "warmup_s",
        ),
        (&["--autoscaler", "sometimes"][..], "--autoscaler"),
        (
            &[
                "--autoscaler",
                "threshold",
                "--architecture",
                "pd",
                "--drain-policy",
                "redirect",
            ][..],
            "autoscale: drain",
        ),
    ] {
        let assert = replay()
            .args(["run", "--workload-spec"])
            .arg(shared().join("examples/two-client-workload.yaml"))
            .args([
                "--num-requests",
                "10",
                "--model",
                "meta-llama/Llama-3.1-8B-Instruct",
            ])
            .args(args)
            .arg("--out")
            .arg(dir.path().join("x"))
            .assert()
            .failure();
        let stderr = String::from_utf8(assert.get_output().stderr.clone()).unwrap();
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
}

/// BLIS's `inference_perf:` form (stages and shared_prefix directly under
/// it) replays, with and without `enable_multi_turn_chat`; with it, each
/// session's rounds are closed-loop: sent the think time after the previous
/// round's last token.
#[test]
fn blis_inference_perf_specs_replay_in_both_forms() {
    let dir = tempfile::tempdir().unwrap();
    for multi_turn in [false, true] {
        let spec = dir.path().join(format!("ip-{multi_turn}.yaml"));
        std::fs::write(
            &spec,
            format!(
                "version: \"2\"\nseed: 7\ninference_perf:\n  stages:\n    - {{rate: 4, duration: 10}}\n  shared_prefix:\n    num_unique_system_prompts: 2\n    num_users_per_system_prompt: 2\n    system_prompt_len: 64\n    question_len: 32\n    output_len: 16\n    enable_multi_turn_chat: {multi_turn}\n"
            ),
        )
        .unwrap();
        let out = dir.path().join(format!("pred-{multi_turn}"));
        replay()
            .args(["run", "--workload-spec"])
            .arg(&spec)
            .args(["--model", "meta-llama/Llama-3.1-8B-Instruct", "--out"])
            .arg(&out)
            .assert()
            .success();
        let t = Trace::read(&out.with_extension("yaml")).unwrap();
        assert_eq!(t.records.len(), 40, "rate 4 × 10 s");
        assert!(
            t.records
                .iter()
                .all(|r| r.outcome.status == Some(Status::Ok))
        );
        let sessions: std::collections::BTreeSet<&str> =
            t.records.iter().map(|r| &*r.request.session_id).collect();
        if !multi_turn {
            assert_eq!(sessions.into_iter().collect::<Vec<_>>(), [""]);
            continue;
        }
        // 4 sessions of 10 rounds, think time 4 sessions / 4 req/s = 1 s.
        assert_eq!(sessions.len(), 4);
        for s in sessions {
            let mut rounds: Vec<_> = t
                .records
                .iter()
                .filter(|r| &*r.request.session_id == s)
                .collect();
            rounds.sort_by_key(|r| r.request.round_index);
            assert_eq!(rounds.len(), 10);
            for w in rounds.windows(2) {
                let done = w[0].outcome.last_chunk_time_us.unwrap();
                assert_eq!(
                    w[1].outcome.send_time_us,
                    Some(done + 1_000_000),
                    "{s} round {}",
                    w[1].request.round_index
                );
            }
        }
    }
}

/// A cluster run says what ran: instances, admission, routing with its
/// scorers and the requests routed to each instance; it warns when an
/// instance got nothing and says why when no scorer spreads load; a
/// scorer given as a policy is refused with how to use it.
#[test]
fn a_cluster_run_says_how_it_routed_and_warns_about_idle_instances() {
    let dir = tempfile::tempdir().unwrap();
    let spec =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/chat-service.yaml");
    let run = |extra: &[&str], out: &str| {
        replay()
            .args(["run", "--workload-spec"])
            .arg(&spec)
            .args([
                "--model",
                "meta-llama/Llama-3.1-8B-Instruct",
                "--num-requests",
                "160",
                "--num-instances",
                "4",
            ])
            .args(extra)
            .arg("--out")
            .arg(dir.path().join(out))
            .assert()
    };
    let only_affinity = run(
        &[
            "--routing",
            "weighted",
            "--routing-scorers",
            "prefix-affinity:1",
        ],
        "a",
    )
    .success();
    let text = String::from_utf8_lossy(&only_affinity.get_output().stdout).into_owned();
    assert!(
        text.contains(
            "cluster: 4 instances · admission always-admit · routing weighted (prefix-affinity:1) · requests routed [160, 0, 0, 0]"
        ),
        "{text}"
    );
    assert!(
        text.contains("warning: 3 of 4 instances got no request (instances 1, 2, 3)")
            && text.contains("no scorer that spreads load"),
        "{text}"
    );
    // The summary's imbalance is a number even when instances got nothing:
    // the busiest instance's requests over the mean (one of four took all).
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("a.summary.json")).unwrap())
            .unwrap();
    assert_eq!(summary["cluster"]["routing_imbalance"].as_f64(), Some(4.0));
    let spread = run(&["--routing", "weighted"], "b").success();
    let text = String::from_utf8_lossy(&spread.get_output().stdout).into_owned();
    assert!(
        text.contains("routing weighted (prefix-affinity:3, queue-depth:2, kv-utilization:2)"),
        "{text}"
    );
    assert!(!text.contains("warning:"), "{text}");
    let refused = run(&["--routing", "prefix-affinity"], "c").failure();
    let err = String::from_utf8_lossy(&refused.get_output().stderr).into_owned();
    assert!(
        err.contains("is a scorer of the weighted policy: --routing weighted --routing-scorers prefix-affinity:3"),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
}

/// `evaluate` always gives the one number a search compares candidates
/// by: without `--fitness-weights`, the documented default weights, named
/// in its output.
#[test]
fn evaluate_has_a_fitness_without_weights() {
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = replay()
        .arg("evaluate")
        .arg("--policy-config")
        .arg(root.join("examples/policy_search/round-robin.yaml"))
        .arg("--workload-spec")
        .arg(root.join("examples/policy_search/shared-prefixes.yaml"))
        .args([
            "--model",
            "meta-llama/Llama-3.1-8B-Instruct",
            "--seeds",
            "1,2",
            "--num-requests",
            "300",
        ])
        .assert()
        .success();
    let e: serde_json::Value = serde_json::from_slice(&out.get_output().stdout).unwrap();
    assert_eq!(
        e["fitness_weights"],
        blis_replay::output::fitness::DEFAULT_WEIGHTS
    );
    let f = e["fitness"].as_f64().expect("a fitness");
    assert!(f > 0.0 && f < 1.0, "{f}");
    for s in e["seeds"].as_array().unwrap() {
        assert!(s["fitness"].as_f64().is_some(), "{s}");
    }
}

/// `compare` puts runs side by side from their summaries, marks the best
/// of each row (none when all are equal), and names a file that is not a
/// run's summary.
#[test]
fn compare_marks_the_best_run_of_each_row() {
    let dir = tempfile::tempdir().unwrap();
    let spec = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/policy_search/shared-prefixes.yaml");
    for (name, scorers) in [
        ("spread", "prefix-affinity:3,queue-depth:2"),
        ("affinity", "prefix-affinity:1"),
    ] {
        replay()
            .args(["run", "--workload-spec"])
            .arg(&spec)
            .args([
                "--model",
                "meta-llama/Llama-3.1-8B-Instruct",
                "--num-requests",
                "600",
                "--num-instances",
                "4",
                "--routing",
                "weighted",
                "--routing-scorers",
                scorers,
                "--out",
            ])
            .arg(dir.path().join(name))
            .assert()
            .success();
    }
    let out = replay()
        .arg("compare")
        .arg(dir.path().join("spread"))
        .arg(dir.path().join("affinity.summary.json"))
        .assert()
        .success();
    let table = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
    assert!(table.starts_with("| | spread | affinity |"), "{table}");
    let row = |label: &str| {
        table
            .lines()
            .find(|l| l.starts_with(&format!("| {label} (")))
            .unwrap_or_else(|| panic!("no {label} row: {table}"))
            .to_string()
    };
    // Spreading load balances the instances; affinity alone does not.
    let balance = row("busiest instance / mean (routed)");
    let cells: Vec<&str> = balance.split('|').map(str::trim).collect();
    assert!(
        cells[2].ends_with('★') && !cells[3].contains('★'),
        "{balance}"
    );
    // Both complete every request: no mark.
    assert!(!row("completed requests").contains('★'));
    let json = replay()
        .arg("compare")
        .arg(dir.path().join("spread"))
        .arg(dir.path().join("affinity"))
        .args(["--names", "a,b", "--json"])
        .assert()
        .success();
    let v: serde_json::Value = serde_json::from_slice(&json.get_output().stdout).unwrap();
    assert_eq!(v["runs"], serde_json::json!(["a", "b"]));
    let err = replay()
        .arg("compare")
        .arg(dir.path().join("spread"))
        .arg(dir.path().join("spread.csv"))
        .assert()
        .failure();
    let msg = String::from_utf8_lossy(&err.get_output().stderr).into_owned();
    assert!(msg.contains("spread.csv.summary.json"), "{msg}");
    // A summary whose figures no run can have (corrupt, or edited by
    // hand) is named with the field, not ranked: a negative latency would
    // be the best of its row.
    let good: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("affinity.summary.json")).unwrap(),
    )
    .unwrap();
    for (path, value, says) in [
        (
            &["ttft_ms", "p99"][..],
            serde_json::json!(-1e308),
            "ttft_ms.p99 is -1e308",
        ),
        (
            &["requests", "completed"][..],
            serde_json::json!(2.5),
            "requests.completed is 2.5e0",
        ),
        (
            &["prefix_cache", "hit_rate"][..],
            serde_json::json!(1.5),
            "prefix_cache.hit_rate is 1.5e0",
        ),
        (
            &["throughput", "requests_per_s"][..],
            serde_json::json!("fast"),
            "throughput.requests_per_s is \"fast\", not a number",
        ),
    ] {
        let mut bad = good.clone();
        *bad.pointer_mut(&format!("/{}", path.join("/"))).unwrap() = value;
        let file = dir.path().join("bad.summary.json");
        std::fs::write(&file, bad.to_string()).unwrap();
        let err = replay()
            .arg("compare")
            .arg(dir.path().join("spread"))
            .arg(&file)
            .assert()
            .failure();
        let msg = String::from_utf8_lossy(&err.get_output().stderr).into_owned();
        assert!(
            msg.contains("bad.summary.json: ") && msg.contains(says),
            "{msg}"
        );
        assert_eq!(msg.trim().lines().count(), 1, "{msg}");
    }
    // Bundles run on one workload in memory, named by their files.
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let policies = format!(
        "{},{}",
        root.join("examples/policy_search/round-robin.yaml")
            .display(),
        root.join("examples/policy_search/prefix-affinity.yaml")
            .display()
    );
    let both = replay()
        .args(["compare", "--policies", &policies, "--workload-spec"])
        .arg(&spec)
        .args([
            "--model",
            "meta-llama/Llama-3.1-8B-Instruct",
            "--num-requests",
            "600",
        ])
        .assert()
        .success();
    let table = String::from_utf8_lossy(&both.get_output().stdout).into_owned();
    assert!(
        table.starts_with("| | round-robin | prefix-affinity |"),
        "{table}"
    );
    assert!(table.contains('★'), "{table}");
}

/// Where the bundled fitted latency models disagree by more than 25% on
/// the run's setup (Llama-3.1-8B on an H100: BLIS's blackbox row and
/// trained-physics), the run says so, with each one's step, the one used
/// and the one validated; where only one applies it says nothing.
#[test]
fn a_run_says_when_the_bundled_latency_models_disagree() {
    let dir = tempfile::tempdir().unwrap();
    let spec =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/chat-service.yaml");
    let run = |model: &str, out: &str| {
        let a = replay()
            .args(["run", "--workload-spec"])
            .arg(&spec)
            .args(["--model", model, "--num-requests", "50", "--out"])
            .arg(dir.path().join(out))
            .assert()
            .success();
        String::from_utf8_lossy(&a.get_output().stdout).into_owned()
    };
    let text = run("meta-llama/Llama-3.1-8B-Instruct", "a");
    let note = text
        .lines()
        .find(|l| l.starts_with("note: the latency models disagree by"))
        .unwrap_or_else(|| panic!("no note: {text}"));
    assert!(
        note.contains("trained-physics")
            && note.contains("blackbox")
            && note.contains("this run used trained-physics")
            && note.contains("validated"),
        "{note}"
    );
    let text = run("qwen/qwen2.5-7b-instruct", "b");
    assert!(!text.contains("latency models disagree"), "{text}");
}
