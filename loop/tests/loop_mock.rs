//! The main job's loop against `blis-mockserver` (the plumbing check): the
//! mock's timing is the replay engine in real time, so replaying its
//! observed trace with its own settings must reproduce it — a larger gap
//! than the HTTP path's own latency is a bug in measurement or replay.
//! (Its own test binary: it observes the mock for the main job's full
//! minute, 360 requests.)
//!
//! The mock hands each token to its HTTP stream ahead of its visible time
//! by the measured hand-off latency (see `blis_mockserver::engine`), so the
//! client sees first tokens on the engine's schedule; what remains between
//! real and replayed TTFT is the client's own HTTP path (its send, the
//! server's request parsing, its read of the chunk), a few hundred µs,
//! partly covered by the round trip the comparison adds.
//! Measured on a 2-vCPU VM: see the README's "How accurate is it".

use blis_loop::{LoopOpts, run_loop};
use clap::Parser;

#[test]
fn the_mock_loop_reproduces_e2e_and_ttft() {
    let dir = tempfile::tempdir().unwrap();
    let o = LoopOpts::parse_from(["blis-loop", "--out", dir.path().to_str().unwrap()]);
    let r = run_loop(&o, &mut |l| eprintln!("{}", l.trim_end())).unwrap();
    eprintln!("{}", r.markdown);
    // The mock is busy (~40 answers streaming at once) but not saturated:
    // first tokens come within tens of ms on both sides.
    let sat = &r.report_json["saturation"];
    assert_eq!(sat["real"]["saturated"], false, "{sat}");
    assert_eq!(sat["sim"]["saturated"], false, "{sat}");
    assert!(
        !r.markdown.contains("Both sides are saturated") && !r.markdown.contains("WARNING"),
        "the report opens without a saturation note"
    );
    let m = &r.report_json["metrics"];
    let stat = |metric: &str, side: &str, s: &str| m[metric][side][s].as_f64().unwrap();
    let rel = |metric: &str, s: &str| m[metric]["errors"][s]["relative"].as_f64().unwrap();
    let e2e_mape = m["e2e"]["mape"].as_f64().unwrap();
    let (e2e_p50, ttft_p50, ttft_mean) =
        (rel("e2e", "p50"), rel("ttft", "p50"), rel("ttft", "mean"));
    let ttft_p50_ms = stat("ttft", "sim", "p50") - stat("ttft", "real", "p50");
    eprintln!(
        "E2E MAPE {e2e_mape:.2}%, E2E p50 {:+.2}%, TTFT mean {:+.2}%, TTFT p50 {:+.2}% ({ttft_p50_ms:+.2} ms)",
        100.0 * e2e_p50,
        100.0 * ttft_mean,
        100.0 * ttft_p50
    );
    assert!(
        m["e2e"]["n"].as_u64().unwrap() >= 300,
        "enough requests compared"
    );
    assert!(e2e_mape <= 3.0, "E2E MAPE {e2e_mape}%");
    assert!(e2e_p50.abs() <= 0.03, "E2E p50 error {e2e_p50}");
    assert!(ttft_mean.abs() <= 0.03, "TTFT mean error {ttft_mean}");
    assert!(
        ttft_p50.abs() <= 0.03,
        "TTFT p50 error {ttft_p50} ({ttft_p50_ms} ms)"
    );
    // Per request: the real TTFT is the simulated one plus the client's HTTP
    // path (a few hundred µs); a gap beyond that is a timing bug.
    let real = blis_traces::Trace::read(&r.real).unwrap();
    let sim = blis_traces::Trace::read(&r.sim).unwrap();
    let ttft = |o: &blis_traces::Outcome| {
        o.first_chunk_time_us
            .zip(o.send_time_us)
            .map(|(f, s)| f - s)
    };
    let sim_by_id: std::collections::BTreeMap<_, _> = sim
        .records
        .iter()
        .map(|x| (x.request.request_id, &x.outcome))
        .collect();
    let mut gaps: Vec<i64> = real
        .records
        .iter()
        .filter_map(|x| Some(ttft(&x.outcome)? - ttft(sim_by_id.get(&x.request.request_id)?)?))
        .collect();
    gaps.sort_unstable();
    let median = gaps[gaps.len() / 2];
    eprintln!(
        "per-request real − sim TTFT: p10 {} µs, median {median} µs, p90 {} µs",
        gaps[gaps.len() / 10],
        gaps[9 * gaps.len() / 10]
    );
    assert!(
        (-500..=1_500).contains(&median),
        "median real − sim TTFT {median} µs"
    );
    assert!(r.report.with_extension("html").exists());
}
