//! Sharded load generation: four `blis-loadgen run --shard I/4` processes
//! started together (`--start-at`) against one mock, merged, send exactly
//! the one-process plan: the same ids once each, first rounds at their
//! planned times, sessions never split.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use blis_traces::{Status, Trace};

use crate::common::{MODEL, Mock, loadgen, s, serial, write};

const SPEC: &str = r#"
version: "1"
seed: 5
aggregate_rate: 120.0
num_requests: 240
clients:
  - id: chat
    rate_fraction: 0.5
    streaming: true
    arrival: {process: poisson}
    input_distribution: {type: constant, params: {value: 64}}
    output_distribution: {type: constant, params: {value: 8}}
    reasoning:
      reason_ratio_distribution: {type: empirical, pmf: {0.0: 1.0}}
      multi_turn: {max_rounds: 3, think_time_us: 50000, context_growth: accumulate}
  - id: batch
    rate_fraction: 0.5
    streaming: true
    arrival: {process: gamma, cv: 2.0}
    input_distribution: {type: constant, params: {value: 32}}
    output_distribution: {type: constant, params: {value: 4}}
"#;

fn unix_now_s() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

#[test]
fn four_shards_merged_send_exactly_the_one_process_plan() {
    let _serial = serial();
    let mock = Mock::start(&["--time-scale", "100"]);
    let dir = tempfile::tempdir().unwrap();
    let spec = write(dir.path(), "w.yaml", SPEC);
    let plan = dir.path().join("plan");
    let (code, _) = loadgen(&["generate", "--workload-spec", s(&spec), "--out", s(&plan)]).unwrap();
    assert_eq!(code, 0);
    let planned = Trace::read(&plan.with_extension("yaml")).unwrap().records;
    assert_eq!(planned.len(), 240);

    // Four processes, one start.
    let start_at = format!("{:.3}", unix_now_s() + 6.0);
    let parts: Vec<_> = (0..4)
        .map(|i| dir.path().join(format!("part-{i}")))
        .collect();
    let children: Vec<_> = (0..4)
        .map(|i| {
            Command::new(env!("CARGO_BIN_EXE_blis-loadgen"))
                .args(["run", "--server-url", &mock.url, "--model", MODEL])
                .args(["--workload-spec", s(&spec), "--scrape-interval-ms", "200"])
                .args(["--shard", &format!("{i}/4"), "--start-at", &start_at])
                .args(["--client-threads", "1", "--out", s(&parts[i])])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect::<Vec<_>>();
    for (i, c) in children.iter().enumerate() {
        assert_eq!(
            c.status.code(),
            Some(0),
            "part {i}: {}",
            String::from_utf8_lossy(&c.stderr)
        );
    }

    // Each part: its share, its sessions whole, one plan.
    let mut session_part: BTreeMap<String, usize> = BTreeMap::new();
    let mut hashes = BTreeSet::new();
    let mut sizes = Vec::new();
    for (i, p) in parts.iter().enumerate() {
        let t = Trace::read(&p.with_extension("yaml")).unwrap();
        let sh = t.header.shard.clone().expect("a part says which");
        assert_eq!((sh.index, sh.count), (i as u32, 4));
        assert!(sh.clock_source.is_some());
        hashes.insert(t.header.plan_hash.clone().unwrap());
        assert_eq!(t.header.planned_requests, Some(t.records.len() as u64));
        sizes.push(t.records.len());
        for r in &t.records {
            let sid = r.request.session_id.to_string();
            if !sid.is_empty() {
                let first = *session_part.entry(sid.clone()).or_insert(i);
                assert_eq!(first, i, "session {sid} split between parts");
            }
        }
    }
    assert_eq!(hashes.len(), 1, "one plan");
    assert!(
        sizes.iter().all(|&n| n >= 30),
        "parts of similar size: {sizes:?}"
    );

    // Merged: every planned id once, first rounds at their planned times.
    let merged = dir.path().join("merged");
    let mut args: Vec<&str> = vec!["merge"];
    args.extend(parts.iter().map(|p| s(p)));
    args.extend(["--out", s(&merged)]);
    let (code, out) = loadgen(&args).unwrap();
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("merged 4 parts"), "{out}");
    let m = Trace::read(&merged.with_extension("yaml")).unwrap();
    assert!(m.header.shard.is_none());
    assert_eq!(m.header.planned_requests, Some(240));
    assert_eq!(m.header.planned_ids.as_deref(), Some("0-239"));
    let ids: Vec<u64> = {
        let mut v: Vec<u64> = m.records.iter().map(|r| r.request.request_id).collect();
        v.sort_unstable();
        v
    };
    assert_eq!(ids, (0..240).collect::<Vec<u64>>(), "every request once");
    let by_id: BTreeMap<u64, &blis_traces::TraceRecord> =
        planned.iter().map(|r| (r.request.request_id, r)).collect();
    let start = m.header.run_start_unix_us.unwrap();
    let mut lags = Vec::new();
    for r in &m.records {
        let p = by_id[&r.request.request_id];
        assert_eq!(r.outcome.status, Some(Status::Ok), "{:?}", r.outcome);
        if r.request.round_index == 0 {
            assert_eq!(r.request.arrival_time_us, p.request.arrival_time_us);
        } else {
            assert!(r.request.arrival_time_us >= p.request.arrival_time_us);
        }
        let lag = r.outcome.send_time_us.unwrap() - (start + r.request.arrival_time_us);
        assert!(lag >= -1_000, "sent {lag} µs early");
        lags.push(lag);
    }
    lags.sort_unstable();
    // Same machine, one clock: the parts agree to their send lag.
    assert!(
        lags[lags.len() / 2] < 50_000,
        "median send lag {} µs",
        lags[lags.len() / 2]
    );
    let chunks = m.chunks.as_ref().expect("per-chunk times");
    assert_eq!(
        chunks.len() as u64,
        m.records
            .iter()
            .map(|r| u64::from(r.request.output_tokens))
            .sum::<u64>()
    );
    let metrics = m.metrics.as_ref().expect("metrics");
    for i in 0..4 {
        let label = format!("shard=\"{i}\"");
        assert!(metrics.iter().any(|x| x.labels.starts_with(&label)));
    }
    let (code, _) = loadgen(&["check", s(&merged)]).unwrap();
    assert_eq!(code, 0, "the merged trace is complete");

    // Refused: a missing part, a part of another plan.
    let err = loadgen(&[
        "merge",
        s(&parts[0]),
        s(&parts[1]),
        s(&parts[2]),
        "--out",
        s(&merged),
    ])
    .unwrap_err()
    .to_string();
    assert!(err.contains("parts 3/4 are missing"), "{err}");
    let other = dir.path().join("other-0");
    let later = format!("{:.3}", unix_now_s() + 1.0);
    let (code, _) = loadgen(&[
        "run",
        "--server-url",
        &mock.url,
        "--model",
        MODEL,
        "--workload-spec",
        s(&spec),
        "--seed",
        "6",
        "--num-requests",
        "8",
        "--shard",
        "1/4",
        "--start-at",
        &later,
        "--out",
        s(&other),
    ])
    .unwrap();
    assert_eq!(code, 0);
    let err = loadgen(&[
        "merge",
        s(&parts[0]),
        s(&other),
        s(&parts[2]),
        s(&parts[3]),
        "--out",
        s(&merged),
    ])
    .unwrap_err()
    .to_string();
    assert!(err.contains("parts of different plans"), "{err}");
}

#[test]
fn shard_and_start_flags_are_checked() {
    for bad in ["4/4", "1/0", "a/b", "3"] {
        let err = loadgen(&[
            "run",
            "--server-url",
            "http://127.0.0.1:9",
            "--model",
            "m",
            "--rate",
            "1",
            "--num-requests",
            "4",
            "--shard",
            bad,
            "--out",
            "unused",
        ])
        .unwrap_err()
        .to_string();
        assert!(err.contains("--shard wants I/N"), "{bad}: {err}");
    }
}

/// `examples/kubernetes/`: the ConfigMap's workload plans, and the shard
/// and merge commands of the Jobs, with the values Kubernetes gives them,
/// are commands `blis-loadgen` accepts. (CI validates the manifests
/// against the Kubernetes schemas with kubernetes-validate.)
#[test]
fn the_kubernetes_example_plans_and_its_commands_parse() {
    use clap::Parser;
    #[derive(serde::Deserialize)]
    struct ConfigMap {
        data: BTreeMap<String, String>,
    }
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/kubernetes");
    let cm: ConfigMap =
        serde_saphyr::from_str(&std::fs::read_to_string(format!("{dir}/configmap.yaml")).unwrap())
            .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let spec = write(tmp.path(), "workload.yaml", &cm.data["workload.yaml"]);
    let plan = tmp.path().join("plan");
    let (code, out) = loadgen(&[
        "generate",
        "--workload-spec",
        s(&spec),
        "--num-requests",
        "1000",
        "--out",
        s(&plan),
    ])
    .unwrap();
    assert_eq!(code, 0, "{out}");
    let job = std::fs::read_to_string(format!("{dir}/job.yaml")).unwrap();
    let command = job
        .split("- >-")
        .nth(1)
        .and_then(|rest| rest.split("env:").next())
        .unwrap();
    let shards: u32 = cm.data["shards"].parse().unwrap();
    assert!(job.contains(&format!("completions: {shards}")));
    assert!(job.contains(&format!("parallelism: {shards}")));
    for index in 0..shards {
        let cmd = command
            .replace("$SERVER_URL", &cm.data["server_url"])
            .replace("$MODEL", &cm.data["model"])
            .replace("$JOB_COMPLETION_INDEX", &index.to_string())
            .replace("$SHARDS", &cm.data["shards"])
            .replace("$START_AT", &cm.data["start_at"])
            .replace('"', "");
        let argv: Vec<&str> = cmd.split_whitespace().skip(1).collect();
        assert_eq!(argv[0], "blis-loadgen", "{cmd}");
        let opts = blis_loadgen::Opts::try_parse_from(&argv).unwrap();
        let blis_loadgen::cli::Command::Run(run) = opts.command else {
            panic!("a run: {cmd}")
        };
        assert_eq!(run.shard.map(|s| (s.index, s.count)), Some((index, shards)));
    }
    let merge = std::fs::read_to_string(format!("{dir}/merge-job.yaml")).unwrap();
    let line = merge
        .lines()
        .find(|l| l.contains("blis-loadgen merge"))
        .unwrap();
    let argv: Vec<&str> = line
        .trim()
        .trim_start_matches("- exec ")
        .split_whitespace()
        .collect();
    assert!(blis_loadgen::Opts::try_parse_from(&argv).is_ok(), "{line}");
}

/// Hostile part headers are refused with one line, never an overflow: a
/// part index out of range, a clock offset of centuries, a start at the
/// end of time.
#[test]
fn merge_refuses_hostile_part_headers() {
    let dir = tempfile::tempdir().unwrap();
    let good = |name: &str, shard: &str, start: &str| {
        let h = format!(
            "trace_version: 3\ntime_unit: microseconds\nmode: real\nrun_start_unix_us: {start}\nplan_hash: \"00ff\"\nshard: {shard}\ndata_file: {name}.csv\n"
        );
        write(dir.path(), &format!("{name}.yaml"), &h);
        write(
            dir.path(),
            &format!("{name}.csv"),
            "request_id,client_id,tenant_id,slo_class,session_id,round_index,prefix_group,streaming,input_tokens,output_tokens,text_tokens,image_tokens,audio_tokens,video_tokens,reason_ratio,model,deadline_us,server_input_tokens,arrival_time_us,send_time_us,first_chunk_time_us,last_chunk_time_us,num_chunks,status,error_message,finish_reason\n",
        );
        dir.path().join(format!("{name}.yaml"))
    };
    let ok1 = good("a", "{index: 1, count: 2}", "1700000000000000");
    for (shard, start, want) in [
        ("{index: 0, count: 0}", "1700000000000000", "is not a part"),
        ("{index: 3, count: 2}", "1700000000000000", "is not a part"),
        (
            "{index: 0, count: 2, clock_offset_us: 9223372036854775807}",
            "1700000000000000",
            "more than a day",
        ),
        (
            "{index: 0, count: 2}",
            "-9223372036854775808",
            "within ±2^53",
        ),
    ] {
        let bad = good("b", shard, start);
        let err = loadgen(&["merge", s(&bad), s(&ok1), "--out", s(&dir.path().join("m"))])
            .unwrap_err()
            .to_string();
        assert!(err.contains(want), "{shard} {start}: {err}");
    }
}
