use std::path::{Path, PathBuf};

use blis_traces::Trace;
use clap::Parser;

pub const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";

pub fn spec(dir: &Path, rate: f64, n: u64) -> PathBuf {
    let p = dir.join(format!("w{rate}.yaml"));
    std::fs::write(
        &p,
        format!(
            "
aggregate_rate: {rate}
num_requests: {n}
seed: 3
clients:
  - id: chat
    slo_class: interactive
    rate_fraction: 0.7
    streaming: true
    prefix_group: sys
    prefix_length: 100
    input_distribution: {{type: gaussian, params: {{mean: 600, std_dev: 200, min: 50, max: 2000}}}}
    output_distribution: {{type: exponential, params: {{mean: 60}}}}
  - id: batch
    slo_class: batch
    rate_fraction: 0.3
    streaming: true
    input_distribution: {{type: gaussian, params: {{mean: 1500, std_dev: 300, min: 100, max: 3000}}}}
    output_distribution: {{type: exponential, params: {{mean: 150}}}}
"
        ),
    )
    .unwrap();
    p
}

/// A replayed bundle (with ITL and metrics companions) of the spec.
pub fn replayed(dir: &Path, name: &str, spec: &Path, extra: &[&str]) -> (PathBuf, Trace) {
    let out = dir.join(name);
    let mut args = vec![
        "blis-replay",
        "run",
        "--workload-spec",
        spec.to_str().unwrap(),
        "--model",
        MODEL,
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    blis_replay::commands::execute(blis_replay::Opts::parse_from(args), &mut Vec::new()).unwrap();
    let h = out.with_extension("yaml");
    let t = Trace::read(&h).unwrap();
    (h, t)
}

pub fn calibrate(args: &[&str]) -> anyhow::Result<String> {
    let mut argv = vec!["blis-calibrate"];
    argv.extend_from_slice(args);
    let mut out = Vec::new();
    blis_calibrate::run(blis_calibrate::Opts::try_parse_from(argv)?, &mut out)?;
    Ok(String::from_utf8(out)?)
}
