//! Bounded work for absurd but parseable inputs (issue 17 item 6): each is
//! refused with a one-line error naming the field, or runs in bounded time
//! as vLLM would serve it. Each case once hung (for hours, or for ever).

use std::path::Path;
use std::process::Command;

const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";

fn replay() -> Command {
    Command::new(assert_cmd::cargo::cargo_bin!("blis-replay"))
}

/// A trace of `rows` (`input,output,arrival[,deadline]`) in `dir`.
fn trace(dir: &Path, rows: &[&str]) -> std::path::PathBuf {
    let mut csv =
        String::from("request_id,input_tokens,output_tokens,arrival_time_us,deadline_us\n");
    for (i, r) in rows.iter().enumerate() {
        let mut cells: Vec<&str> = r.split(',').collect();
        cells.resize(4, "");
        csv.push_str(&format!("{i},{}\n", cells.join(",")));
    }
    std::fs::write(dir.join("t.csv"), csv).unwrap();
    let h = dir.join("t.yaml");
    std::fs::write(&h, "trace_version: 3\nmode: generated\ndata_file: t.csv\n").unwrap();
    h
}

/// Runs `blis-replay run ARGS --out DIR/o` with a 60 s guard (a hang
/// fails the test instead of stalling CI); its exit code and stderr.
fn run(dir: &Path, args: &[&str]) -> (i32, String) {
    let mut child = replay()
        .args(["run", "--model", MODEL])
        .args(args)
        .arg("--out")
        .arg(dir.join("o"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            use std::io::Read;
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            return (status.code().unwrap_or(-1), err);
        }
        if start.elapsed() > std::time::Duration::from_secs(60) {
            child.kill().unwrap();
            panic!("blis-replay {args:?} did not finish in 60 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

fn rows(dir: &Path) -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(dir.join("o.csv")).unwrap();
    text.lines()
        .skip(1)
        .map(|l| l.split(',').map(str::to_string).collect())
        .collect()
}

#[test]
fn token_counts_at_the_integer_limit_are_refused_or_capped_by_max_model_len() {
    let dir = tempfile::tempdir().unwrap();
    // A prompt of u32::MAX tokens; an output of u32::MAX (once a wrapped
    // sum that simulated 4·10^9 tokens block by block).
    let h = trace(
        dir.path(),
        &["4294967295,10,0", "100,4294967295,1000", "100,20,2000"],
    );
    let (code, err) = run(dir.path(), &["--trace", h.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let yaml = std::fs::read_to_string(dir.path().join("o.yaml")).unwrap();
    assert!(
        yaml.contains("max_model_len: 131072"),
        "the model config's context length: {yaml}"
    );
    let r = rows(dir.path());
    let text = r[0].join(",");
    assert!(
        text.contains("error") && text.contains("reaches max_model_len 131072"),
        "{text}"
    );
    let text = r[1].join(",");
    assert!(
        text.contains(",ok,"),
        "capped at the context and served: {text}"
    );
    assert!(r[2].join(",").contains(",ok,"));
}

#[test]
fn a_deadline_far_away_does_not_keep_the_time_series_going() {
    let dir = tempfile::tempdir().unwrap();
    let h = trace(dir.path(), &["100,20,0,9007199254740992"]);
    let (code, err) = run(dir.path(), &["--trace", h.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    // Samples every 100 ms stop with the request (about 0.2 s), not at its
    // deadline 285 years later.
    let samples = std::fs::read_to_string(dir.path().join("o.metrics.csv")).unwrap();
    let last: i64 = samples
        .lines()
        .last()
        .and_then(|l| l.split(',').next())
        .and_then(|t| t.parse().ok())
        .unwrap();
    assert!(last < 1_000_000, "the last sample is at {last} µs");
}

#[test]
fn an_arrival_years_away_skips_the_idle_stretch() {
    let dir = tempfile::tempdir().unwrap();
    // 100 years apart: sampled every 100 ms, 3·10^10 idle samples.
    let h = trace(dir.path(), &["100,20,0", "100,20,3155760000000000"]);
    let (code, err) = run(dir.path(), &["--trace", h.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        rows(dir.path())
            .iter()
            .filter(|r| r.join(",").contains(",ok,"))
            .count(),
        2
    );
    let samples = std::fs::read_to_string(dir.path().join("o.metrics.csv")).unwrap();
    let n = samples.lines().count();
    assert!(
        n < 50_000,
        "{n} sample rows: the idle stretch keeps 1,000 samples"
    );
}

#[test]
fn absurd_times_rates_and_lengths_are_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let h = trace(dir.path(), &["100,20,9223372036854775000"]);
    let (code, err) = run(dir.path(), &["--trace", h.to_str().unwrap()]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("t.csv:2:") && err.contains("arrival_time_us") && err.contains("2^53"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    let spec = |name: &str, rate: &str, output: &str| {
        let p = dir.path().join(name);
        std::fs::write(
            &p,
            format!(
                "aggregate_rate: {rate}\nclients:\n  - id: a\n    arrival: {{process: poisson}}\n    input_distribution: {{type: constant, params: {{value: 100}}}}\n    output_distribution: {output}\n"
            ),
        )
        .unwrap();
        p
    };
    let cases = [
        (
            spec("rate.yaml", "1e12", "{type: constant, params: {value: 10}}"),
            vec!["--horizon-s", "3600"],
            "rate.yaml: aggregate_rate",
        ),
        (
            spec(
                "mean.yaml",
                "10",
                "{type: exponential, params: {mean: 1e300}}",
            ),
            vec!["--num-requests", "10"],
            "mean.yaml:6:",
        ),
        (
            spec("count.yaml", "10", "{type: constant, params: {value: 10}}"),
            vec!["--num-requests", "1000000000000"],
            "num_requests",
        ),
        (
            spec(
                "horizon.yaml",
                "10",
                "{type: constant, params: {value: 10}}",
            ),
            vec!["--horizon-s", "1e300"],
            "horizon",
        ),
    ];
    for (spec, extra, needle) in cases {
        let mut args = vec!["--workload-spec", spec.to_str().unwrap()];
        args.extend(extra);
        let (code, err) = run(dir.path(), &args);
        assert_eq!(code, 1, "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
}

#[test]
fn kv_caches_of_billions_of_blocks_cost_what_they_hold() {
    let dir = tempfile::tempdir().unwrap();
    // 16 instances of 4·10^9 GPU and 4·10^9 CPU KV blocks each: the CPU
    // tier once allocated its slots up front (96 GB an instance: the run
    // aborted), and the cluster's totals wrapped at 2^32.
    let h = trace(dir.path(), &["3000,20,0", "3000,20,1000", "100,20,2000"]);
    let n = "4000000000";
    let (code, err) = run(
        dir.path(),
        &[
            "--trace",
            h.to_str().unwrap(),
            "--num-instances",
            "16",
            "--total-kv-blocks",
            n,
            "--kv-cpu-blocks",
            n,
        ],
    );
    assert_eq!(code, 0, "{err}");
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("o.summary.json")).unwrap()).unwrap();
    assert_eq!(
        summary["kv"]["total_blocks"], 64_000_000_000u64,
        "{summary}"
    );
    assert_eq!(
        summary["kv"]["cpu_tier"]["total_blocks"], 64_000_000_000u64,
        "{summary}"
    );
    assert!(
        rows(dir.path())
            .iter()
            .all(|r| r.join(",").contains(",ok,"))
    );
}

#[test]
fn a_transfer_years_long_skips_the_quiet_stretch() {
    let dir = tempfile::tempdir().unwrap();
    // A P/D hand-off of 285 years: requests are in the system but no
    // instance has a step to take. Samples every 100 ms once ran through
    // all of it (9·10^10 of them).
    let h = trace(dir.path(), &["100,20,0", "100,20,1000"]);
    let (code, err) = run(
        dir.path(),
        &[
            "--trace",
            h.to_str().unwrap(),
            "--architecture",
            "pd",
            "--prefill-instances",
            "1",
            "--decode-instances",
            "1",
            "--pd-transfer-latency-us",
            "9007199254740000",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        rows(dir.path())
            .iter()
            .all(|r| r.join(",").contains(",ok,"))
    );
    let samples = std::fs::read_to_string(dir.path().join("o.metrics.csv")).unwrap();
    assert!(
        samples.lines().count() < 100_000,
        "{} metric rows",
        samples.lines().count()
    );
}

#[test]
fn a_session_round_asking_for_u32_max_tokens_is_served_capped() {
    let dir = tempfile::tempdir().unwrap();
    // A chat round (a shared system prompt, then the session's own tokens)
    // asking for 2^32 − 1 output tokens: its sequence's length once
    // overflowed a 32-bit sum while its private blocks were located (a
    // debug build panicked).
    let csv = "request_id,session_id,round_index,prefix_group,prefix_length,\
               input_tokens,output_tokens,arrival_time_us\n\
               0,s0,0,sys,1024,1595,4294967295,0\n\
               1,s1,0,sys,1024,2120,20,1000\n";
    std::fs::write(dir.path().join("t.csv"), csv).unwrap();
    let h = dir.path().join("t.yaml");
    std::fs::write(&h, "trace_version: 3\nmode: generated\ndata_file: t.csv\n").unwrap();
    let (code, err) = run(dir.path(), &["--trace", h.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let r = rows(dir.path());
    assert!(r.iter().all(|r| r.join(",").contains(",ok,")), "{r:?}");
}

#[test]
fn a_prompt_past_the_context_is_not_hashed_whole_for_routing() {
    let dir = tempfile::tempdir().unwrap();
    // Prompts of 2^32 − 1 tokens routed by prefix affinity: the router once
    // hashed all 268 million blocks of each (2 GB and seconds a request)
    // before the instance refused it.
    let h = trace(
        dir.path(),
        &[
            "4294967295,10,0",
            "4294967295,10,1000",
            "4294967295,10,2000",
            "4294967295,10,3000",
            "4294967295,10,4000",
            "4294967295,10,5000",
            "4294967295,10,6000",
            "4294967295,10,7000",
            "100,20,8000",
        ],
    );
    let (code, err) = run(
        dir.path(),
        &[
            "--trace",
            h.to_str().unwrap(),
            "--num-instances",
            "4",
            "--routing-scorers",
            "prefix-affinity:3,queue-depth:2",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let r = rows(dir.path());
    for row in &r[..8] {
        let text = row.join(",");
        assert!(text.contains("reaches max_model_len"), "{text}");
    }
    assert!(r[8].join(",").contains(",ok,"));
}

/// Sample times, and nothing else.
#[derive(Default)]
struct SampleTimes(Vec<i64>);

impl blis_replay::sim::Sink for SampleTimes {
    fn finished(&mut self, _: blis_replay::sim::Done<'_>) {}
    fn not_served(&mut self, _: blis_traces::TraceRecord, _: i64, _: blis_replay::sim::NotServed) {}
    fn sample(&mut self, t_us: i64, _: &blis_replay::engine::instance::Snapshot) {
        self.0.push(t_us);
    }
}

/// A run whose steps take hours (a CPU table, or a latency model far from
/// any deployment) kept sampling every 100 ms through all of them: one
/// request on a model of 2.8-hour steps simulated 58 hours and wrote 2.1
/// million samples (a gigabyte of time series; 29 years of such steps, 4.6
/// GB). After 100,000 samples at an interval it grows tenfold: the first
/// 2.8 hours keep the 100 ms grid, the rest is sampled once a second, then
/// every 10 s.
#[test]
fn a_run_of_hour_long_steps_samples_ever_less_often() {
    use blis_replay::sim::{SAMPLES_PER_INTERVAL, SimOptions, replay};
    let model = blis_replay::Model::Blackbox(blis_replay::Blackbox {
        alpha: [0.0; 3],
        beta: [1e10, 0.0, 0.0],
    });
    let mut inst = blis_replay::Instance::new(blis_replay::EngineConfig::default(), model);
    let inputs = crate::common::inputs(vec![crate::common::req(0, 0, 100, 20)]);
    let mut sink = SampleTimes::default();
    let opts = SimOptions {
        sample_interval_us: Some(100_000),
        horizon_us: None,
    };
    replay(&mut inst, inputs, &opts, &mut sink);
    let t = &sink.0;
    let n = SAMPLES_PER_INTERVAL as usize;
    let gaps = |from: usize, to: usize| -> Vec<i64> {
        let mut g: Vec<i64> = t[from..to].windows(2).map(|w| w[1] - w[0]).collect();
        g.sort_unstable();
        g.dedup();
        g
    };
    // 21 steps of 10^10 µs: 58.3 hours.
    assert!(
        t.len() > 2 * n && t.len() < 2 * n + 12_000,
        "{} samples",
        t.len()
    );
    assert_eq!(gaps(0, n), vec![100_000]);
    assert_eq!(gaps(n, 2 * n), vec![1_000_000]);
    assert_eq!(gaps(2 * n, t.len()), vec![10_000_000]);
}
