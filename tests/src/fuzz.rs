//! Fuzzing harness (issue 17 item 5): every parser the project owns, fed
//! arbitrary bytes. A target must return (an error is fine) without
//! panicking, in bounded time and memory. The same functions serve the
//! coverage-guided campaign (`fuzz/`, cargo-fuzz on nightly) and the
//! stable, fixed-seed mutation test CI runs (`tests/tests/fuzz.rs`), whose
//! seed corpora are under `fuzz/corpus/TARGET/`.

use std::cell::RefCell;
use std::path::{Path, PathBuf};

/// The fuzz targets, by name.
pub const TARGETS: [&str; 11] = [
    "sse",
    "prometheus",
    "trace_csv",
    "trace_header",
    "companions",
    "workload_spec",
    "mooncake",
    "azure",
    "inference_perf",
    "vllm_gt",
    "servegen",
];

/// Separates the files of a composite input (`companions`, `vllm_gt`,
/// `servegen`).
pub const FILE_SEPARATOR: &[u8] = b"\n--- next file ---\n";

/// Runs target `name` on `data`.
///
/// # Panics
/// On an unknown target name; otherwise only if the parser under test
/// panics (the failure fuzzing looks for).
pub fn run(name: &str, data: &[u8]) {
    match name {
        "sse" => sse(data),
        "prometheus" => prometheus(data),
        "trace_csv" => trace_csv(data),
        "trace_header" => trace_header(data),
        "companions" => companions(data),
        "workload_spec" => workload_spec(data),
        "mooncake" => mooncake(data),
        "azure" => azure(data),
        "inference_perf" => inference_perf(data),
        "vllm_gt" => vllm_gt(data),
        "servegen" => servegen(data),
        other => panic!("unknown fuzz target {other}"),
    }
}

thread_local! {
    static DIR: RefCell<Option<tempfile::TempDir>> = const { RefCell::new(None) };
}

/// A scratch folder of this thread, emptied of `names` first.
fn scratch(names: &[&str]) -> PathBuf {
    DIR.with(|d| {
        let mut d = d.borrow_mut();
        let dir = d.get_or_insert_with(|| tempfile::tempdir().expect("a temp folder"));
        for n in names {
            let _ = std::fs::remove_file(dir.path().join(n));
        }
        dir.path().to_path_buf()
    })
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).expect("scratch write");
    p
}

/// The parts of a composite input.
fn parts(data: &[u8], n: usize) -> Vec<&[u8]> {
    let mut out = Vec::with_capacity(n);
    let mut rest = data;
    while out.len() + 1 < n {
        match rest
            .windows(FILE_SEPARATOR.len())
            .position(|w| w == FILE_SEPARATOR)
        {
            Some(i) => {
                out.push(&rest[..i]);
                rest = &rest[i + FILE_SEPARATOR.len()..];
            }
            None => break,
        }
    }
    out.push(rest);
    out.resize(n, b"");
    out
}

/// An SSE stream as the loadgen reads it, split into network pieces at
/// positions taken from its first byte.
fn sse(data: &[u8]) {
    let step = usize::from(data.first().copied().unwrap_or(7)).max(1);
    let pieces: Vec<&[u8]> = data.chunks(step).collect();
    let mut cap = blis_loadgen::http::Capture::default();
    cap.keep_text = true;
    let _ = blis_loadgen::sse::parse_sse(&pieces, &mut cap);
}

/// The Prometheus text format (vLLM's `/metrics`).
fn prometheus(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let strict = blis_traces::prom::parse(&text);
    let page = blis_traces::prom::parse_lenient(&text);
    // The lenient parse agrees with the strict one where that succeeds.
    if let Ok(samples) = strict {
        assert_eq!(page.skipped, 0);
        assert_eq!(page.samples.len(), samples.len());
    }
    // Labels read come back the same through the companion's text form.
    for s in &page.samples {
        let labels = blis_traces::prom::parse_labels(&s.labels_text());
        assert_eq!(labels.as_ref(), Ok(&s.labels));
    }
}

/// A trace's request CSV, every version's columns.
fn trace_csv(data: &[u8]) {
    if let Ok(mut r) = blis_traces::RecordReader::new(data, Path::new("fuzz.csv")) {
        while let Ok(Some(_)) = r.next_record() {}
    }
}

/// A trace header YAML.
fn trace_header(data: &[u8]) {
    let _ =
        blis_traces::TraceHeader::from_yaml(Path::new("fuzz.yaml"), &String::from_utf8_lossy(data));
}

/// The companions: ITL rows, metrics, and the step form (a step table and
/// token runs, expanded to rows).
fn companions(data: &[u8]) {
    let p = parts(data, 4);
    let path = Path::new("fuzz.csv");
    let _ = blis_traces::companions::read_chunks_from(p[0], path);
    let _ = blis_traces::companions::read_metrics_from(p[1], path);
    if let (Ok(steps), Ok(runs)) = (
        blis_traces::itl_steps::read_steps_from(p[2], path),
        blis_traces::itl_steps::read_runs_from(p[3], path),
    ) {
        let timing = blis_traces::itl_steps::ItlTiming::default();
        let _ = blis_traces::itl_steps::expand(&steps, &runs, &timing, path);
    }
}

/// A workload spec, parsed, and its first 200 requests generated.
fn workload_spec(data: &[u8]) {
    let Ok(spec) = blis_traces::WorkloadSpec::from_yaml_str(&String::from_utf8_lossy(data)) else {
        return;
    };
    let opts = blis_traces::GenerateOptions {
        seed: Some(1),
        num_requests: Some(200),
        horizon_us: None,
        aggregate_rate: None,
    };
    if let Ok(g) = blis_traces::Generator::new(&spec, &opts) {
        for r in g.take(200) {
            if r.is_err() {
                break;
            }
        }
    }
}

/// Mooncake JSONL.
fn mooncake(data: &[u8]) {
    let dir = scratch(&["t.jsonl"]);
    let _ = blis_traces::import::mooncake(&write(&dir, "t.jsonl", data));
}

/// Azure 2023 CSV.
fn azure(data: &[u8]) {
    let dir = scratch(&["t.csv"]);
    let _ = blis_traces::import::azure(&write(&dir, "t.csv", data));
}

/// An inference-perf profile (YAML).
fn inference_perf(data: &[u8]) {
    let dir = scratch(&["p.yaml"]);
    let _ = blis_traces::import::inference_perf(&write(&dir, "p.yaml", data), 1);
}

/// A vLLM ground-truth run folder: `exp-config.yaml`, the replay and
/// ground-truth JSON, `profile.yaml`.
fn vllm_gt(data: &[u8]) {
    let p = parts(data, 4);
    let dir = scratch(&[]);
    let run = dir.join("gt");
    let _ = std::fs::remove_dir_all(&run);
    std::fs::create_dir_all(run.join("replay_data")).expect("scratch folder");
    write(&run, "exp-config.yaml", p[0]);
    write(&run.join("replay_data"), "gt.json", p[1]);
    write(&run.join("replay_data"), "gt_ground_truth.json", p[2]);
    write(&run, "profile.yaml", p[3]);
    let _ = blis_traces::import::vllm_gt(&run);
}

/// A ServeGen client: `chunk-1-trace.csv` and `chunk-1-dataset.json`, and
/// 200 requests generated from it.
fn servegen(data: &[u8]) {
    let p = parts(data, 2);
    let dir = scratch(&[]);
    let sg = dir.join("sg");
    let _ = std::fs::remove_dir_all(&sg);
    std::fs::create_dir_all(&sg).expect("scratch folder");
    write(&sg, "chunk-1-trace.csv", p[0]);
    write(&sg, "chunk-1-dataset.json", p[1]);
    if blis_traces::servegen::load(&sg, None).is_err() {
        return;
    }
    let spec = format!(
        "servegen_data:\n  path: {}\n  span_start_s: 0\n  span_end_s: 3600\n",
        sg.display()
    );
    workload_spec(spec.as_bytes());
}
