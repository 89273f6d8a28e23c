//! The saturation verdict on real runs: the main job's trace is stable
//! (many long answers streaming at once, first tokens within tens of ms),
//! the vLLM ground-truth reasoning runs are saturated (first tokens after
//! minutes, most requests timing out), the codegen runs are stable.

use std::path::{Path, PathBuf};

use blis_calibrate::goodput::{client_timeout_us, deadline_cliff};
use blis_calibrate::saturation::verdict;
use blis_traces::{ImportSource, Trace, import};

fn fixture(name: &str) -> Trace {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/main-job")
        .join(name);
    Trace::read(&p).unwrap()
}

fn ground_truth_runs(kind: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/vllm-ground-truth/train");
    let mut runs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e} (../shared must be beside the checkout)",
                dir.display()
            )
        })
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().ends_with(kind))
        .collect();
    runs.sort();
    runs
}

fn gt(run: &Path) -> Trace {
    let src: ImportSource = format!("vllm-gt:{}", run.display()).parse().unwrap();
    import(&src, 42).unwrap()
}

#[test]
fn the_main_jobs_trace_is_stable_on_both_sides() {
    for side in ["real.yaml", "sim.yaml"] {
        let t = fixture(side);
        let v = verdict(&t.records);
        assert!(!v.saturated, "{side}: {v:?}");
        assert!(v.waiting.iter().all(|&w| w <= 4), "{side}: {v:?}");
    }
}

#[test]
fn the_ground_truth_reasoning_runs_are_saturated() {
    let runs = ground_truth_runs("-reasoning");
    assert_eq!(runs.len(), 3);
    for run in runs {
        let v = verdict(&gt(&run).records);
        assert!(v.saturated, "{}: {v:?}", run.display());
    }
}

#[test]
fn the_ground_truth_codegen_and_chat_runs_are_stable() {
    let mut runs = ground_truth_runs("-codegen");
    assert_eq!(runs.len(), 3);
    runs.extend(ground_truth_runs("-general"));
    runs.extend(ground_truth_runs("-roleplay"));
    for run in runs {
        let v = verdict(&gt(&run).records);
        assert!(!v.saturated, "{}: {v:?}", run.display());
    }
}

/// What decides a saturated run's completed count: the client's 300 s
/// timeout under vLLM's FCFS queue. In each real reasoning run the
/// completed requests are exactly the earliest sent, and the deadline
/// cliff from the run's own decode time and concurrency gives its count
/// within 10% (measured: −2.5%, −4.7%, −7.7%); a decode time off by 1%
/// moves the count by 1.5–5%. Preemption (the 7B run is KV-bound) sets how
/// many decode at once, not which requests complete.
#[test]
fn the_ground_truth_saturated_counts_follow_the_deadline_cliff() {
    let runs = ground_truth_runs("-reasoning");
    assert_eq!(runs.len(), 3);
    for run in runs {
        let t = gt(&run);
        let timeout = client_timeout_us(&t);
        assert_eq!(timeout, Some(300_000_000), "{}", run.display());
        let c = deadline_cliff(&t.records, timeout).unwrap();
        let err = c.predicted_completed / c.completed as f64 - 1.0;
        assert!(err.abs() < 0.1, "{}: {c:?}", run.display());
        assert_eq!(c.in_order, 1.0, "{}: {c:?}", run.display());
        assert!(
            (1.5..5.0).contains(&c.elasticity),
            "{}: {c:?}",
            run.display()
        );
    }
    // The stable runs keep up: no cliff.
    for run in ground_truth_runs("-codegen") {
        let t = gt(&run);
        let c = deadline_cliff(&t.records, client_timeout_us(&t));
        assert!(
            c.as_ref().is_none_or(|c| c.cliff_s.is_none()),
            "{}: {c:?}",
            run.display()
        );
    }
}

/// The real runs' decode speed over the run, against a stationary
/// reference (each completed request decoding at the run's median time per
/// token, the same requests and first tokens): Mixtral-8x7B's overloaded
/// run slows by a fifth at a constant batch of 128, which the report flags;
/// Llama-2-70B's slows by a tenth over its first minutes (just under the
/// threshold); Llama-2-7B's and CodeLlama-34B's hold within 3%.
#[test]
fn the_real_mixtral_overload_drifts_and_the_steady_runs_do_not() {
    use blis_calibrate::decode_drift::decode_over_run;
    let mut runs = ground_truth_runs("-reasoning");
    runs.extend(ground_truth_runs("-roleplay"));
    assert_eq!(runs.len(), 4);
    for run in runs {
        let t = gt(&run);
        let per_token = |r: &blis_traces::TraceRecord| {
            let o = &r.outcome;
            Some(
                (o.last_chunk_time_us? - o.first_chunk_time_us?) as f64
                    / f64::from(r.request.output_tokens.checked_sub(1).filter(|&n| n > 0)?),
            )
        };
        let mut all: Vec<f64> = t.records.iter().filter_map(per_token).collect();
        all.sort_by(f64::total_cmp);
        let median = all[all.len() / 2];
        let mut flat = t.records.clone();
        for r in &mut flat {
            if let Some(f) = r.outcome.first_chunk_time_us
                && r.outcome.last_chunk_time_us.is_some()
                && r.request.output_tokens >= 2
            {
                r.outcome.last_chunk_time_us =
                    Some(f + (median * f64::from(r.request.output_tokens - 1)) as i64);
            }
        }
        let d = decode_over_run(&t.records, &flat).unwrap();
        let name = run.file_name().unwrap().to_string_lossy().to_string();
        eprintln!("{name}: real {:+.3}, drift {}", d.real_change, d.drift);
        assert!(d.steady_load, "{name}: {d:?}");
        if name.contains("mixtral") {
            assert!(d.drift && d.real_change > 0.15, "{name}: {d:?}");
        } else if name.contains("70b") {
            assert!((0.05..0.15).contains(&d.real_change), "{name}: {d:?}");
        } else {
            assert!(!d.drift && d.real_change.abs() < 0.03, "{name}: {d:?}");
        }
    }
}
