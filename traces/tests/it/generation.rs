//! What a spec promises about the generated requests.

use blis_traces::{GenerateOptions, Request, WorkloadSpec, generate};

fn generated(yaml: &str) -> Vec<Request> {
    generate(
        &WorkloadSpec::from_yaml_str(yaml).unwrap(),
        &GenerateOptions::default(),
    )
    .unwrap()
}

fn cv(xs: &[f64]) -> f64 {
    let m = xs.iter().sum::<f64>() / xs.len() as f64;
    let v = xs.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (xs.len() - 1) as f64;
    v.sqrt() / m
}

fn gaps(reqs: &[&Request]) -> Vec<f64> {
    reqs.windows(2)
        .map(|w| (w[1].arrival_time_us - w[0].arrival_time_us) as f64)
        .collect()
}

const TWO: &str = "
seed: 3
aggregate_rate: 100
horizon_us: 200000000
clients:
  - id: a
    rate_fraction: 1
    arrival: {process: gamma, cv: 2.5}
    input_distribution: {type: lognormal, params: {mu: 5, sigma: 1}}
    output_distribution: {type: exponential, params: {mean: 100}}
  - id: b
    rate_fraction: 3
    arrival: {process: weibull, cv: 0.5}
    input_distribution: {type: gaussian, params: {mean: 300, std_dev: 30, min: 200, max: 400}}
    output_distribution: {type: constant, params: {value: 7}}
";

#[test]
fn arrivals_are_sorted_with_sequential_ids_and_rates_follow_fractions() {
    let reqs = generated(TWO);
    assert!(
        reqs.windows(2)
            .all(|w| w[0].arrival_time_us <= w[1].arrival_time_us)
    );
    assert!(
        reqs.iter()
            .enumerate()
            .all(|(i, r)| r.request_id == i as u64)
    );
    assert!(reqs.iter().all(|r| r.arrival_time_us < 200_000_000));
    let a: Vec<&Request> = reqs.iter().filter(|r| &*r.client_id == "a").collect();
    let b: Vec<&Request> = reqs.iter().filter(|r| &*r.client_id == "b").collect();
    // 25 and 75 req/s over 200 s.
    assert!((a.len() as f64 / 5000.0 - 1.0).abs() < 0.1, "{}", a.len());
    assert!((b.len() as f64 / 15000.0 - 1.0).abs() < 0.03, "{}", b.len());
    assert!(
        (cv(&gaps(&a)) / 2.5 - 1.0).abs() < 0.1,
        "gamma cv {}",
        cv(&gaps(&a))
    );
    assert!(
        (cv(&gaps(&b)) / 0.5 - 1.0).abs() < 0.05,
        "weibull cv {}",
        cv(&gaps(&b))
    );
    assert!(
        b.iter()
            .all(|r| (200..=400).contains(&r.input_tokens) && r.output_tokens == 7)
    );
    assert!(
        a.iter()
            .all(|r| r.input_tokens >= 1 && r.output_tokens >= 1)
    );
}

#[test]
fn adding_a_client_leaves_the_others_requests_unchanged() {
    // Client c joins with the extra rate, so a's and b's rates are unchanged.
    let three = TWO.replace("aggregate_rate: 100", "aggregate_rate: 125")
        + "  - id: c\n    rate_fraction: 1\n    input_distribution: {type: constant, params: {value: 1}}\n    output_distribution: {type: constant, params: {value: 1}}\n";
    let strip = |reqs: Vec<Request>| -> Vec<Request> {
        reqs.into_iter()
            .filter(|r| &*r.client_id != "c")
            .map(|mut r| {
                r.request_id = 0;
                r
            })
            .collect()
    };
    let with_c = generated(&three);
    assert!(with_c.iter().any(|r| &*r.client_id == "c"));
    assert_eq!(strip(generated(TWO)), strip(with_c));
}

#[test]
fn constant_arrivals_lifecycle_windows_and_timeouts() {
    let reqs = generated(
        "
aggregate_rate: 10
clients:
  - id: w
    timeout_us: 5000000
    arrival: {process: constant}
    lifecycle:
      windows: [{start_us: 1000000, end_us: 2000000}, {start_us: 5000000, end_us: 5500000}]
    input_distribution: {type: constant, params: {value: 10}}
    output_distribution: {type: constant, params: {value: 10}}
",
    );
    let t: Vec<i64> = reqs.iter().map(|r| r.arrival_time_us).collect();
    assert_eq!(
        t,
        vec![
            1_100_000, 1_200_000, 1_300_000, 1_400_000, 1_500_000, 1_600_000, 1_700_000, 1_800_000,
            1_900_000, 5_100_000, 5_200_000, 5_300_000, 5_400_000
        ]
    );
    assert!(
        reqs.iter()
            .all(|r| r.deadline_us == Some(r.arrival_time_us + 5_000_000))
    );
}

#[test]
fn sessions_accumulate_context_and_follow_think_time() {
    let reqs = generated(
        "
category: reasoning
aggregate_rate: 2
horizon_us: 60000000
clients:
  - id: r
    prefix_group: sys
    prefix_length: 100
    input_distribution: {type: constant, params: {value: 40}}
    output_distribution: {type: constant, params: {value: 30}}
    reasoning:
      reason_ratio_distribution: {type: empirical, pmf: {0.0: 0.5, 0.9: 0.5}}
      multi_turn: {max_rounds: 3, think_time_us: 2000000, context_growth: accumulate}
",
    );
    let mut sessions: std::collections::BTreeMap<&str, Vec<&Request>> = Default::default();
    for r in &reqs {
        sessions.entry(&r.session_id).or_default().push(r);
    }
    let full: Vec<_> = sessions.values().filter(|s| s.len() == 3).collect();
    assert!(full.len() > 50, "{} complete sessions", full.len());
    for s in full {
        let inputs: Vec<u32> = s.iter().map(|r| r.input_tokens).collect();
        // 100 prefix + 40; + 30 answer + 40 question; again.
        assert_eq!(inputs, vec![140, 210, 280]);
        assert_eq!(
            s.iter().map(|r| r.round_index).collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
        assert_eq!(s[1].arrival_time_us - s[0].arrival_time_us, 2_000_000);
        assert_eq!(s[1].think_time_us, Some(2_000_000));
        assert_eq!(s[0].think_time_us, None);
        assert!(
            s.iter()
                .all(|r| r.reason_ratio == 0.0 || r.reason_ratio == 0.9)
        );
    }
    assert!(reqs.iter().all(|r| r.arrival_time_us < 60_000_000));
}

#[test]
fn multimodal_inputs_add_up() {
    let reqs = generated(
        "
category: multimodal
aggregate_rate: 50
num_requests: 500
clients:
  - id: m
    input_distribution: {type: constant, params: {value: 1}}
    output_distribution: {type: constant, params: {value: 5}}
    multimodal:
      text_distribution: {type: gaussian, params: {mean: 90, std_dev: 5}}
      image_distribution: {type: constant, params: {value: 1196}}
      image_count_distribution: {type: empirical, pmf: {0: 0.5, 2: 0.5}}
",
    );
    assert_eq!(reqs.len(), 500);
    for r in &reqs {
        assert_eq!(
            r.input_tokens,
            r.text_tokens + r.image_tokens + r.audio_tokens + r.video_tokens
        );
        assert!(
            r.image_tokens == 0 || r.image_tokens == 2 * 1196,
            "{}",
            r.image_tokens
        );
    }
    let with_images = reqs.iter().filter(|r| r.image_tokens > 0).count();
    assert!((200..300).contains(&with_images), "{with_images}");
}

#[test]
fn empirical_from_files_in_three_formats() {
    let dir = crate::common::tempdir();
    std::fs::write(dir.path().join("obj.json"), r#"{"10": 1, "20": 3}"#).unwrap();
    std::fs::write(dir.path().join("arr.json"), "[0, 0, 1]").unwrap();
    std::fs::write(dir.path().join("lit.txt"), "{5: 0.5, 6: 0.5}").unwrap();
    let spec = dir.path().join("s.yaml");
    std::fs::write(
        &spec,
        "
aggregate_rate: 100
num_requests: 400
clients:
  - id: x
    input_distribution: {type: empirical, file: obj.json}
    output_distribution: {type: empirical, file: arr.json}
  - id: y
    input_distribution: {type: empirical, file: lit.txt}
    output_distribution: {type: constant, params: {value: 1}}
",
    )
    .unwrap();
    let reqs = generate(
        &WorkloadSpec::from_file(&spec).unwrap(),
        &GenerateOptions::default(),
    )
    .unwrap();
    let x: Vec<_> = reqs.iter().filter(|r| &*r.client_id == "x").collect();
    assert!(
        x.iter()
            .all(|r| (r.input_tokens == 10 || r.input_tokens == 20) && r.output_tokens == 2)
    );
    let twenties = x.iter().filter(|r| r.input_tokens == 20).count() as f64 / x.len() as f64;
    assert!((twenties - 0.75).abs() < 0.08, "{twenties}");
    assert!(
        reqs.iter()
            .filter(|r| &*r.client_id == "y")
            .all(|r| r.input_tokens == 5 || r.input_tokens == 6)
    );
}

#[test]
fn options_override_the_spec() {
    let spec = WorkloadSpec::from_yaml_str(TWO).unwrap();
    let opts = GenerateOptions {
        seed: Some(9),
        horizon_us: Some(10_000_000),
        num_requests: Some(100),
        aggregate_rate: None,
    };
    let reqs = generate(&spec, &opts).unwrap();
    assert_eq!(reqs.len(), 100);
    let opts = GenerateOptions {
        seed: Some(9),
        horizon_us: Some(1_000_000),
        num_requests: None,
        aggregate_rate: None,
    };
    let reqs = generate(&spec, &opts).unwrap();
    assert!(reqs.iter().all(|r| r.arrival_time_us < 1_000_000) && reqs.len() > 50);
}
