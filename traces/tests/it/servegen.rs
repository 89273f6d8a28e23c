//! ServeGen m-large, one hour of windows: per-client shares, inter-arrival
//! CVs and input-length distributions reproduce the recorded data.

use blis_traces::servegen::{self, ServeGenClient};
use blis_traces::{GenerateOptions, Request, WorkloadSpec, generate};

use crate::common::shared;

const HOUR: f64 = 3600.0;

fn m_large() -> std::path::PathBuf {
    shared().join("servegen/data/language/m-large")
}

fn spec(extra: &str) -> WorkloadSpec {
    WorkloadSpec::from_yaml_str(&format!(
        "seed: 11\nservegen_data:\n  path: {}\n  span_start_s: 0\n  span_end_s: {HOUR}\n{extra}",
        m_large().display()
    ))
    .unwrap()
}

#[test]
fn client_shares_match_the_recorded_shares_within_2_percent() {
    let reqs = generate(&spec(""), &GenerateOptions::default()).unwrap();
    let clients = servegen::load(&m_large(), None).unwrap();
    let expected: f64 = clients.iter().map(|c| c.expected_requests(0.0, HOUR)).sum();
    assert!(
        (reqs.len() as f64 / expected - 1.0).abs() < 0.001,
        "{} vs {expected}",
        reqs.len()
    );
    for c in &clients {
        let want = c.expected_requests(0.0, HOUR) / expected;
        let got = reqs
            .iter()
            .filter(|r| *r.client_id == *c.client_id())
            .count() as f64
            / reqs.len() as f64;
        assert!(
            (got - want).abs() <= 0.02 * want.max(1e-9) + 1e-9,
            "{}: share {got} vs recorded {want}",
            c.client_id()
        );
    }
}

/// Count-weighted mean over the client's active windows of the generated
/// and the recorded inter-arrival CV.
fn window_cvs(c: &ServeGenClient, reqs: &[Request]) -> (f64, f64) {
    let (mut w, mut got, mut rec) = (0.0, 0.0, 0.0);
    for win in c
        .windows
        .iter()
        .filter(|w| w.is_active() && w.start_s < HOUR)
    {
        let s = (win.start_s * 1e6) as i64;
        let e = ((win.start_s + win.duration_s) * 1e6) as i64;
        let t: Vec<f64> = reqs
            .iter()
            .filter(|r| r.arrival_time_us >= s && r.arrival_time_us < e)
            .map(|r| r.arrival_time_us as f64)
            .collect();
        let g: Vec<f64> = t.windows(2).map(|p| p[1] - p[0]).collect();
        let m = g.iter().sum::<f64>() / g.len() as f64;
        let sd = (g.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (g.len() - 1) as f64).sqrt();
        w += t.len() as f64;
        got += t.len() as f64 * sd / m;
        rec += t.len() as f64 * win.cv;
    }
    (got / w, rec / w)
}

#[test]
fn per_client_inter_arrival_cv_within_10_percent_of_recorded() {
    // The sample CV of heavy-tailed gaps (chunk-0 records CV 8.6: Gamma
    // shape 0.0135) converges slowly, so each client is generated alone at
    // a rate scale that gives it ~300k arrivals in the hour; the CV of the
    // process does not depend on the rate scale (only the count does).
    let clients = servegen::load(&m_large(), None).unwrap();
    for c in clients
        .iter()
        .filter(|c| c.expected_requests(0.0, HOUR) > 0.0)
    {
        let scale = 300_000.0 / c.expected_requests(0.0, HOUR);
        let s = spec(&format!(
            "  chunks: [{}]\n  rate_scale: {scale}\n",
            c.chunk_id
        ));
        let reqs = generate(&s, &GenerateOptions::default()).unwrap();
        let (got, rec) = window_cvs(c, &reqs);
        assert!(
            (got / rec - 1.0).abs() < 0.10,
            "{}: generated CV {got:.3} vs recorded {rec:.3}",
            c.client_id()
        );
    }
}

#[test]
fn input_lengths_in_one_window_match_the_pmf_ks_below_0_01() {
    // chunk-61, the first 6-hour dataset window, at a rate scale giving
    // ≥ 100k requests.
    let s = WorkloadSpec::from_yaml_str(&format!(
        "seed: 5\nservegen_data:\n  path: {}\n  chunks: [61]\n  span_start_s: 0\n  span_end_s: 600\n  rate_scale: 12\n",
        m_large().display()
    ))
    .unwrap();
    let reqs = generate(&s, &GenerateOptions::default()).unwrap();
    assert!(reqs.len() >= 100_000, "{}", reqs.len());
    let clients = servegen::load(&m_large(), Some(&[61])).unwrap();
    let pmf = clients[0]
        .dataset_at(0.0)
        .unwrap()
        .pmf("input_tokens")
        .unwrap()
        .unwrap();
    let mut xs: Vec<f64> = reqs.iter().map(|r| f64::from(r.input_tokens)).collect();
    xs.sort_by(f64::total_cmp);
    let n = xs.len() as f64;
    // One-sample KS for a discrete law: sup over support points of |Fn - F|.
    let mut d: f64 = 0.0;
    for &v in pmf.values() {
        let fn_v = xs.partition_point(|&x| x <= v) as f64 / n;
        d = d.max((fn_v - pmf.cdf(v)).abs());
    }
    assert!(d < 0.01, "KS D = {d}");
}

#[test]
fn multimodal_and_reasoning_data_generate_their_fields() {
    let mm = WorkloadSpec::from_yaml_str(&format!(
        "category: multimodal\nservegen_data:\n  path: {}\n  span_start_s: 36000\n  span_end_s: 36600\n",
        shared().join("servegen/data/multimodal/mm-image").display()
    ))
    .unwrap();
    let reqs = generate(&mm, &GenerateOptions::default()).unwrap();
    assert!(reqs.len() > 100, "{}", reqs.len());
    assert!(reqs.iter().all(
        |r| r.input_tokens == r.text_tokens + r.image_tokens + r.audio_tokens + r.video_tokens
    ));
    assert!(reqs.iter().any(|r| r.image_tokens > 0));
    let rs = WorkloadSpec::from_yaml_str(&format!(
        "category: reasoning\nservegen_data:\n  path: {}\n  span_start_s: 36000\n  span_end_s: 36600\n",
        shared().join("servegen/data/reason/deepseek-r1").display()
    ))
    .unwrap();
    let reqs = generate(&rs, &GenerateOptions::default()).unwrap();
    assert!(reqs.len() > 100, "{}", reqs.len());
    assert!(reqs.iter().all(|r| (0.0..=1.0).contains(&r.reason_ratio)));
    let mean = reqs.iter().map(|r| r.reason_ratio).sum::<f64>() / reqs.len() as f64;
    assert!(mean > 0.05, "reasoning share {mean}");
}

/// The excerpt shipped in `examples/data/servegen` (the first window of the
/// six m-large clients) generates the same requests as the full data for a
/// span within that window, so a clone without `../shared` runs the main
/// job's workload unchanged.
#[test]
fn the_shipped_excerpt_generates_what_the_full_data_does_in_its_window() {
    let excerpt = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/data/servegen/language/m-large");
    let with = |dir: &std::path::Path| {
        let spec = WorkloadSpec::from_yaml_str(&format!(
            "seed: 42\nservegen_data:\n  path: {}\n  span_start_s: 0\n  span_end_s: 600\n  aggregate_rate: 6\n",
            dir.display()
        ))
        .unwrap();
        generate(&spec, &GenerateOptions::default()).unwrap()
    };
    let (full, cut) = (with(&m_large()), with(&excerpt));
    assert!(full.len() > 3000, "{} requests", full.len());
    assert_eq!(full, cut);
}

/// A missing data folder names the field and the folder as the user would
/// write it (no `a/../b`), and a span past the data's end is refused rather
/// than silently cut short.
#[test]
fn a_missing_folder_and_a_span_past_the_data_are_clear_errors() {
    let dir = crate::common::tempdir();
    let spec_path = dir.path().join("w.yaml");
    std::fs::write(
        &spec_path,
        "servegen_data:\n  path: ../nowhere/../missing/m-large\n  span_end_s: 60\n",
    )
    .unwrap();
    let spec = WorkloadSpec::from_file(&spec_path).unwrap();
    let err = generate(&spec, &GenerateOptions::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("servegen_data.path"), "{err}");
    assert!(err.contains("no such folder"), "{err}");
    let folder = dir.path().parent().unwrap().join("missing/m-large");
    assert!(
        err.starts_with(&format!("{}: ", folder.display())),
        "not normalised: {err}"
    );

    let excerpt = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/data/servegen/language/m-large");
    let spec = WorkloadSpec::from_yaml_str(&format!(
        "servegen_data:\n  path: {}\n  span_end_s: 1800\n",
        excerpt.display()
    ))
    .unwrap();
    let err = generate(&spec, &GenerateOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("span_end_s is 1800 s but the data ends at 600 s"),
        "{err}"
    );
}

/// `--aggregate-rate` changes a spec's total rate without editing it: a
/// ServeGen spec's (its `rate_scale` too) and a spec of clients'; an
/// inference_perf spec, whose stages set their rates, refuses it.
#[test]
fn the_aggregate_rate_option_replaces_the_spec_s_rate() {
    let excerpt = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/data/servegen/language/m-large");
    let count = |yaml: &str, rate: Option<f64>| {
        let spec = WorkloadSpec::from_yaml_str(yaml).unwrap();
        let opts = GenerateOptions {
            aggregate_rate: rate,
            ..GenerateOptions::default()
        };
        generate(&spec, &opts).map(|r| r.len())
    };
    let servegen = format!(
        "seed: 42\nservegen_data:\n  path: {}\n  span_end_s: 300\n  rate_scale: 0.001\n",
        excerpt.display()
    );
    let n = count(&servegen, Some(8.0)).unwrap() as f64;
    assert!(
        (n / (8.0 * 300.0) - 1.0).abs() < 0.05,
        "{n} requests at 8 req/s"
    );
    let clients = "seed: 1\naggregate_rate: 2\nhorizon_us: 100000000\nclients:\n  - id: a\n    arrival: {process: poisson}\n    input_distribution: {type: constant, params: {value: 10}}\n    output_distribution: {type: constant, params: {value: 10}}\n";
    let (base, fast) = (
        count(clients, None).unwrap() as f64,
        count(clients, Some(20.0)).unwrap() as f64,
    );
    assert!((fast / base / 10.0 - 1.0).abs() < 0.1, "{base} -> {fast}");
    let ip = "inference_perf:\n  stages:\n    - {rate: 2, duration: 10}\n  shared_prefix:\n    num_unique_system_prompts: 1\n    num_users_per_system_prompt: 1\n    system_prompt_len: 10\n    question_len: 10\n    output_len: 10\n";
    let err = count(ip, Some(5.0)).unwrap_err().to_string();
    assert!(
        err.contains("--aggregate-rate: an inference_perf spec"),
        "{err}"
    );
    let err = count(clients, Some(f64::NAN)).unwrap_err().to_string();
    assert!(err.contains("not a positive number"), "{err}");
}
