//! Each importer reads its sample; counts, first/last timestamps and token
//! totals match values computed independently with Python (json / csv /
//! datetime modules) from the same files.

use blis_traces::{ImportSource, Mode, Status, import};

use crate::common::shared;

fn totals(t: &blis_traces::Trace) -> (usize, i64, i64, u64, u64) {
    let r = &t.records;
    (
        r.len(),
        r.first().unwrap().request.arrival_time_us,
        r.last().unwrap().request.arrival_time_us,
        r.iter().map(|r| u64::from(r.request.input_tokens)).sum(),
        r.iter().map(|r| u64::from(r.request.output_tokens)).sum(),
    )
}

fn src(kind: &str, rel: &str) -> ImportSource {
    format!("{kind}:{}", shared().join(rel).display())
        .parse()
        .unwrap()
}

#[test]
fn mooncake_conversation_and_synthetic() {
    let t = import(
        &src(
            "mooncake",
            "traces-samples/mooncake/conversation_trace.sample.jsonl",
        ),
        1,
    )
    .unwrap();
    assert_eq!(totals(&t), (300, 0, 102_000_000, 4_269_971, 113_079));
    let blocks: usize = t
        .records
        .iter()
        .map(|r| r.request.hash_ids.as_ref().unwrap().ids.len())
        .sum();
    assert_eq!(blocks, 8490);
    assert!(
        t.records
            .iter()
            .all(|r| r.request.hash_ids.as_ref().unwrap().block_tokens == 512)
    );
    let t = import(
        &src(
            "mooncake",
            "traces-samples/mooncake/synthetic_trace.sample.jsonl",
        ),
        1,
    )
    .unwrap();
    assert_eq!(totals(&t), (300, 0, 86_790_000, 3_853_165, 57_331));
}

/// A Mooncake trace is read a line at a time: CRLF ends, a byte-order
/// mark and blank lines read as before; a line past 1 MiB (an endless
/// stream such as `/dev/zero`) is a one-line error naming it, not a
/// process that grows until it is killed.
#[test]
fn mooncake_lines_are_read_one_at_a_time_up_to_a_limit() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.jsonl");
    let row = |t: u64| {
        format!(
            r#"{{"timestamp": {t}, "input_length": 10, "output_length": 2, "hash_ids": [1, 2]}}"#
        )
    };
    std::fs::write(
        &p,
        format!("\u{feff}{}\r\n\n{}\r\n{}", row(0), row(5), row(7)),
    )
    .unwrap();
    let m = |p: &std::path::Path| import(&format!("mooncake:{}", p.display()).parse().unwrap(), 1);
    let t = m(&p).unwrap();
    assert_eq!(totals(&t), (3, 0, 7_000, 30, 6));
    std::fs::write(&p, format!("{}\n{}\n", row(0), "x".repeat(2 << 20))).unwrap();
    let e = m(&p).unwrap_err().to_string();
    assert!(
        e.contains("m.jsonl:2: a line longer than 1024 KiB: not a Mooncake request"),
        "{e}"
    );
    let e = m(std::path::Path::new("/dev/zero"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("/dev/zero:1: a line longer than"), "{e}");
    // A malformed line is named by its own line and column, not by
    // serde_json's position inside that one line ("line 1").
    std::fs::write(
        &p,
        format!(
            "{}\n{}\n",
            row(0),
            r#"{"timestamp": 5, "input_length": -1}"#
        ),
    )
    .unwrap();
    let e = m(&p).unwrap_err().to_string();
    assert!(e.contains("m.jsonl:2:"), "{e}");
    assert!(
        e.contains("not a Mooncake request: invalid value: integer `-1`"),
        "{e}"
    );
    assert!(!e.contains("at line 1"), "{e}");
}

#[test]
fn azure_code_and_conv() {
    let t = import(
        &src(
            "azure",
            "traces-samples/azure2023/AzureLLMInferenceTrace_code.sample.csv",
        ),
        1,
    )
    .unwrap();
    assert_eq!(totals(&t), (300, 0, 216_838_239, 627_529, 7_126));
    assert_eq!(t.header.mode, Mode::Generated);
    let t = import(
        &src(
            "azure",
            "traces-samples/azure2023/AzureLLMInferenceTrace_conv.sample.csv",
        ),
        1,
    )
    .unwrap();
    assert_eq!(totals(&t), (300, 0, 84_029_102, 270_000, 76_870));
}

#[test]
fn vllm_ground_truth_run() {
    let run = "vllm-ground-truth/train/20260217-155451-llama-2-7b-tp1-codegen";
    let t = import(&src("vllm-gt", run), 1).unwrap();
    assert_eq!(t.header.mode, Mode::Real);
    let server = t.header.server.as_ref().unwrap();
    assert_eq!(server.max_num_seqs, Some(128));
    assert_eq!(server.max_num_batched_tokens, Some(2048));
    assert_eq!(server.block_size, Some(16));
    assert_eq!(server.total_kv_blocks, Some(7462));
    assert_eq!(server.max_model_len, Some(4096));
    // The model's shape as the run recorded it (`model_config`), in
    // Hugging Face names, for a simulator without its config.json.
    assert_eq!(
        server.model_shape,
        Some(blis_traces::ModelShape {
            num_hidden_layers: 32,
            hidden_size: 4096,
            num_attention_heads: 32,
            num_key_value_heads: 32,
            intermediate_size: 11008,
            vocab_size: 32000,
            num_local_experts: 0,
            num_experts_per_tok: 0,
            not_understood: Vec::new(),
        })
    );
    // It survives the header's YAML.
    let yaml = t.header.to_yaml();
    assert!(yaml.contains("num_key_value_heads: 32"), "{yaml}");
    let back = blis_traces::TraceHeader::from_yaml(std::path::Path::new("h.yaml"), &yaml).unwrap();
    assert_eq!(back.server.unwrap().model_shape, server.model_shape);
    let (n, first, last, input, output) = totals(&t);
    assert_eq!((n, first, last, input), (9000, 0, 1_203_964_878, 5_324_670));
    // Output is the requested output_len (247) for every request.
    assert_eq!(output, 9000 * 247);
    let ok: Vec<_> = t
        .records
        .iter()
        .filter(|r| r.outcome.status == Some(Status::Ok))
        .collect();
    assert_eq!(ok.len(), 9000);
    let mean = |f: &dyn Fn(&blis_traces::TraceRecord) -> i64| {
        ok.iter().map(|r| f(r) as f64).sum::<f64>() / ok.len() as f64 / 1000.0
    };
    let ttft = mean(&|r| r.ttft_us().unwrap());
    let e2e = mean(&|r| r.e2e_us().unwrap());
    // Python: mean ttft_s 27.982 ms, mean e2e_s 2080.740 ms.
    assert!((ttft - 27.982).abs() < 0.01, "{ttft}");
    assert!((e2e - 2080.740).abs() < 0.01, "{e2e}");
}

/// vLLM flags a run's `exp-config.yaml` records (vLLM's names; none of
/// the bundled runs has them) reach the header as the server's settings,
/// so a replay follows them instead of assuming vLLM's defaults.
#[test]
fn vllm_ground_truth_recorded_flags_reach_the_header() {
    let from = shared().join("vllm-ground-truth/train/20260217-155451-llama-2-7b-tp1-codegen");
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    std::fs::create_dir_all(run.join("replay_data")).unwrap();
    for entry in std::fs::read_dir(from.join("replay_data")).unwrap() {
        let p = entry.unwrap().path();
        std::fs::copy(&p, run.join("replay_data").join(p.file_name().unwrap())).unwrap();
    }
    std::fs::write(
        run.join("exp-config.yaml"),
        "model: meta-llama/Llama-2-7b-hf\ntensor_parallel_size: 2\nmax_model_len: 4096\n\
         max_num_batched_tokens: 8192\nmax_num_seqs: 64\ngpu_memory_utilization: 0.8\n\
         enable_prefix_caching: false\nenable_chunked_prefill: true\nasync_scheduling: false\n",
    )
    .unwrap();
    let t = import(&format!("vllm-gt:{}", run.display()).parse().unwrap(), 1).unwrap();
    let s = t.header.server.unwrap();
    assert_eq!(
        (s.tensor_parallel, s.max_num_seqs, s.max_num_batched_tokens),
        (Some(2), Some(64), Some(8192))
    );
    assert_eq!(s.gpu_memory_utilization, Some(0.8));
    assert_eq!(
        (
            s.enable_prefix_caching,
            s.enable_chunked_prefill,
            s.async_scheduling
        ),
        (Some(false), Some(true), Some(false))
    );
    assert_eq!(s.block_size, Some(16), "the replay file's block size");
}

#[test]
fn vllm_ground_truth_failed_requests_are_timeouts_with_median_prompt() {
    let run = "vllm-ground-truth/train/20260217-170634-llama-2-7b-tp1-reasoning";
    let t = import(&src("vllm-gt", run), 1).unwrap();
    let failed: Vec<_> = t
        .records
        .iter()
        .filter(|r| r.outcome.status == Some(Status::Timeout))
        .collect();
    assert_eq!(failed.len(), 4068);
    assert!(
        failed
            .iter()
            .all(|r| r.request.input_tokens > 1000 && r.outcome.first_chunk_time_us.is_none())
    );
    assert!(t.records.iter().all(|r| r.request.output_tokens == 1448));
}

#[test]
fn inference_perf_profile_expands_stages_and_shared_prefixes() {
    let run = "vllm-ground-truth/train/20260217-155451-llama-2-7b-tp1-codegen/results/config.yaml";
    let t = import(&src("inference-perf", run), 7).unwrap();
    // Constant load: exactly rate × duration per stage (5×600 + 10×600).
    assert_eq!(t.records.len(), 9000);
    // As inference-perf's timer, the last request of a stage lands on its end.
    let stage0 = t
        .records
        .iter()
        .filter(|r| r.request.arrival_time_us <= 600_000_000)
        .count();
    assert_eq!(stage0, 3000);
    assert!(t.records.last().unwrap().request.arrival_time_us <= 1_200_000_000);
    let r = &t.records[0].request;
    assert_eq!(
        (r.input_tokens, r.output_tokens, r.prefix_length),
        (566, 247, 100)
    );
    let groups: std::collections::BTreeSet<_> = t
        .records
        .iter()
        .map(|r| r.request.prefix_group.clone())
        .collect();
    assert_eq!(groups.len(), 10);
    let prompts: std::collections::BTreeSet<_> =
        t.records.iter().map(|r| r.request.content_key).collect();
    assert_eq!(prompts.len(), 100);
    // Seeded: the same seed gives the same trace, another seed another one.
    assert_eq!(
        import(&src("inference-perf", run), 7).unwrap().records,
        t.records
    );
    assert_ne!(
        import(&src("inference-perf", run), 8).unwrap().records,
        t.records
    );
}
