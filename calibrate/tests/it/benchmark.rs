use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::common::calibrate;

fn gt(run: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/vllm-ground-truth/train")
        .join(run)
}

/// A folder `name` in `dir` holding the ground-truth runs `runs`
/// (symbolic links).
fn folder(dir: &Path, name: &str, runs: &[&str]) -> PathBuf {
    let f = dir.join(name);
    std::fs::create_dir_all(&f).unwrap();
    for r in runs {
        std::os::unix::fs::symlink(gt(r), f.join(r)).unwrap();
    }
    f
}

/// The run named `name` in a benchmark's JSON.
fn run_of<'j>(j: &'j Value, name: &str) -> &'j Value {
    j["runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == name)
        .unwrap()
}

const SEVEN_B_CODEGEN: &str = "20260217-155451-llama-2-7b-tp1-codegen";
const SEVEN_B_REASONING: &str = "20260217-170634-llama-2-7b-tp1-reasoning";

/// Any folder laid out like vllm-ground-truth/train works: each run is
/// predicted by a trained-physics fit on the other runs (leave-one-run-out),
/// an unreadable folder is listed as skipped, and PREFIX.md and PREFIX.json
/// carry the documented shape with the latency model and the medians.
#[test]
fn benchmark_predicts_each_run_from_the_others_and_writes_the_table() {
    if !gt(SEVEN_B_CODEGEN).exists() {
        eprintln!("skipped: ../shared/vllm-ground-truth is not beside the checkout");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let runs = folder(dir.path(), "runs", &[SEVEN_B_CODEGEN, SEVEN_B_REASONING]);
    std::fs::create_dir_all(runs.join("not-a-run")).unwrap();
    let out = dir.path().join("acc");
    let printed = calibrate(&[
        "benchmark",
        runs.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--budget-evals",
        "12",
    ])
    .unwrap();
    let md = std::fs::read_to_string(out.with_extension("md")).unwrap();
    assert!(printed.contains(&md));
    assert!(
        md.contains("| meta-llama/Llama-2-7b-hf | codegen | 9000 / 9000 |"),
        "{md}"
    );
    assert!(md.contains("skipped not-a-run"), "{md}");
    let j: Value =
        serde_json::from_str(&std::fs::read_to_string(out.with_extension("json")).unwrap())
            .unwrap();
    assert_eq!(j["latency_model"], "trained-physics");
    for k in ["ttft_mean", "e2e_mean", "itl_mean", "e2e_mape"] {
        assert!(j["summary"][k].as_f64().unwrap() >= 0.0, "summary.{k}");
    }
    assert_eq!(j["summary"]["runs"], 2);
    assert!(md.contains("Median over 2 runs"), "{md}");
    let runs_j = j["runs"].as_array().unwrap();
    assert_eq!(runs_j.len(), 2);
    for r in runs_j {
        for k in ["name", "model", "workload"] {
            assert!(r[k].is_string(), "{k}");
        }
        for m in ["ttft", "e2e"] {
            for k in ["real_mean", "sim_mean", "real_p99", "sim_p99"] {
                assert!(r[m][k].as_f64().unwrap() > 0.0, "{m}.{k}");
            }
        }
        assert!(r["itl"]["real_mean"].as_f64().unwrap() > 0.0);
        assert!(r["e2e_mape"].as_f64().unwrap().is_finite());
        // Leave-one-out: fitted on the other run, never on itself.
        let fitted: Vec<&str> = r["fitted_on"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert_eq!(fitted.len(), 1);
        assert_ne!(fitted[0], r["name"].as_str().unwrap());
    }
    // Real times come from the run, in ms: the 7B codegen run's mean TTFT
    // is tens of ms, not µs or s.
    let codegen = runs_j.iter().find(|r| r["workload"] == "codegen").unwrap();
    let ttft = codegen["ttft"]["real_mean"].as_f64().unwrap();
    assert!((5.0..200.0).contains(&ttft), "{ttft}");
    // The reasoning run is saturated (mean TTFT above 10 s), codegen not.
    let reasoning = runs_j
        .iter()
        .find(|r| r["workload"] == "reasoning")
        .unwrap();
    assert_eq!(reasoning["saturated"][0], true);
    assert_eq!(codegen["saturated"][0], false);
    // The saturated run's counts are read as a deadline cliff on both
    // sides: the completed requests are the earliest sent, and the cliff
    // from each side's decode time and concurrency gives its count.
    assert!(codegen["cliff"].is_null());
    for side in 0..2 {
        let c = &reasoning["cliff"][side];
        let count = reasoning["completed"][side].as_f64().unwrap();
        let predicted = c["predicted_completed"].as_f64().unwrap();
        assert!((predicted / count - 1.0).abs() < 0.1, "side {side}: {c}");
        assert!(c["in_order"].as_f64().unwrap() > 0.99, "side {side}: {c}");
    }
    assert!(md.contains("the deadline cliff"), "{md}");
    // Each run's decode speed over the run, both sides: the 7B runs hold
    // theirs apart from what the load does (codegen doubles its rate
    // halfway, both sides slow alike), so neither drifts.
    assert!(md.contains("Decode speed over the run"), "{md}");
    for r in runs_j {
        let d = &r["decode_over_run"];
        assert_eq!(d["windows"].as_array().unwrap().len(), 6, "{d}");
        assert_eq!(d["drift"], false, "{d}");
    }
    assert!(
        md.contains("| meta-llama/Llama-2-7b-hf | reasoning | ") && md.contains("| no |"),
        "{md}"
    );

    // BLIS's published coefficients: nothing fitted, the same runs.
    let blis = dir.path().join("blis");
    calibrate(&[
        "benchmark",
        runs.to_str().unwrap(),
        "--latency-model",
        "blis-physics",
        "--out",
        blis.to_str().unwrap(),
    ])
    .unwrap();
    let j: Value =
        serde_json::from_str(&std::fs::read_to_string(blis.with_extension("json")).unwrap())
            .unwrap();
    assert_eq!(j["latency_model"], "blis-physics");
    assert_eq!(j["runs"].as_array().unwrap().len(), 2);
    assert!(j["runs"][0]["fitted_on"].as_array().unwrap().is_empty());
    assert!(j["runs"][0]["coefficients"].is_null());
}

/// `--fit-on` fits on another folder's runs; a model with none there is
/// skipped, and nothing predicted at all is an error.
#[test]
fn benchmark_fit_on_uses_the_other_folder() {
    if !gt(SEVEN_B_CODEGEN).exists() {
        eprintln!("skipped: ../shared/vllm-ground-truth is not beside the checkout");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let test = folder(dir.path(), "test", &[SEVEN_B_REASONING]);
    let train = folder(dir.path(), "train", &[SEVEN_B_CODEGEN]);
    let out = dir.path().join("acc");
    calibrate(&[
        "benchmark",
        test.to_str().unwrap(),
        "--fit-on",
        train.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--budget-evals",
        "12",
    ])
    .unwrap();
    let j: Value =
        serde_json::from_str(&std::fs::read_to_string(out.with_extension("json")).unwrap())
            .unwrap();
    assert_eq!(j["runs"][0]["name"], SEVEN_B_REASONING);
    assert_eq!(j["runs"][0]["fitted_on"][0], SEVEN_B_CODEGEN);
    // The empty train folder predicts nothing: an error naming the folder.
    let empty = dir.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let e = calibrate(&[
        "benchmark",
        test.to_str().unwrap(),
        "--fit-on",
        empty.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ])
    .unwrap_err();
    assert!(e.to_string().contains("could be predicted"), "{e}");
}

/// `--folds model`: each run is predicted by a fit on the runs of the
/// *other* models only (never its own model's other run), the timed-out
/// counts are in the table, and the fold kinds that make no sense are
/// refused with a one-line reason.
#[test]
fn benchmark_folds_by_model_fit_on_the_other_models_only() {
    if !gt(SEVEN_B_CODEGEN).exists() {
        eprintln!("skipped: ../shared/vllm-ground-truth is not beside the checkout");
        return;
    }
    const ROLEPLAY: &str = "20260218-155500-codellama-34b-tp2-roleplay";
    let dir = tempfile::tempdir().unwrap();
    let runs = folder(
        dir.path(),
        "runs",
        &[SEVEN_B_CODEGEN, SEVEN_B_REASONING, ROLEPLAY],
    );
    let out = dir.path().join("acc");
    let printed = calibrate(&[
        "benchmark",
        runs.to_str().unwrap(),
        "--folds",
        "model",
        "--out",
        out.to_str().unwrap(),
        "--budget-evals",
        "4",
    ])
    .unwrap();
    assert!(printed.contains("leave-one-model-out"), "{printed}");
    let j: Value =
        serde_json::from_str(&std::fs::read_to_string(out.with_extension("json")).unwrap())
            .unwrap();
    let fitted = |name: &str| -> Vec<String> {
        run_of(&j, name)["fitted_on"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect()
    };
    // Both 7B runs: fitted on the 34B run alone, not on each other.
    assert_eq!(fitted(SEVEN_B_CODEGEN), [ROLEPLAY]);
    assert_eq!(fitted(SEVEN_B_REASONING), [ROLEPLAY]);
    assert_eq!(fitted(ROLEPLAY), [SEVEN_B_CODEGEN, SEVEN_B_REASONING]);
    // The reasoning run's 4,068 client timeouts are counted, real side
    // from the run; none in codegen.
    let reasoning = run_of(&j, SEVEN_B_REASONING);
    assert_eq!(reasoning["timed_out"][0], 4068);
    assert_eq!(
        reasoning["timed_out"][1].as_u64().unwrap() + reasoning["completed"][1].as_u64().unwrap(),
        4800
    );
    assert!(
        j["summary"]["saturated_completed_max"].as_f64().unwrap() >= 0.0,
        "{}",
        j["summary"]
    );
    let md = std::fs::read_to_string(out.with_extension("md")).unwrap();
    assert!(md.contains("| 732 (saturated) / "), "{md}");
    assert!(md.contains("| 4068 / "), "{md}");

    // Blackbox is fitted per model and --fit-on fits once: both refused.
    for extra in [
        &["--latency-model", "blackbox"][..],
        &["--fit-on", runs.to_str().unwrap()][..],
    ] {
        let mut args = vec![
            "benchmark",
            runs.to_str().unwrap(),
            "--folds",
            "model",
            "--out",
            out.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let e = calibrate(&args).unwrap_err().to_string();
        assert!(e.contains("--folds model"), "{e}");
        assert!(!e.contains('\n'), "one line: {e}");
    }
}

/// A folder nothing can be predicted from is an error that says why for
/// each run skipped: a lone run has no other run to fit on, a lone model
/// no other model.
#[test]
fn benchmark_with_nothing_to_fit_on_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let f = folder(dir.path(), "one", &[SEVEN_B_CODEGEN]);
    let out = dir.path().join("b");
    let e = calibrate(&[
        "benchmark",
        f.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ])
    .unwrap_err()
    .to_string();
    assert!(
        e.ends_with(&format!(
            "(1 skipped: {SEVEN_B_CODEGEN}: no other run to fit on)"
        )),
        "{e}"
    );
    let f = folder(dir.path(), "two", &[SEVEN_B_CODEGEN, SEVEN_B_REASONING]);
    let e = calibrate(&[
        "benchmark",
        f.to_str().unwrap(),
        "--folds",
        "model",
        "--out",
        out.to_str().unwrap(),
    ])
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("(2 skipped: ")
            && e.contains("no run of another model than meta-llama/Llama-2-7b-hf to fit on"),
        "{e}"
    );
}
