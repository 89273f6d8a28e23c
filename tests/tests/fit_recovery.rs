//! `blis-calibrate fit` recovers the coefficients a server really has: a
//! trace observed from `blis-mockserver` running known blackbox α/β is fitted
//! from a different starting point (the bundled row). (Its own test binary:
//! it observes the mock in real time for about 15 s.)
//!
//! The mock runs at `--time-scale 2`, i.e. twice real time: its wall-clock
//! latencies are those of a server with every coefficient halved, so the
//! fit is expected at truth / 2.
//!
//! Two things are judged. Always: the fit explains the observation at least
//! as well as the truth does (its loss is no higher than the truth's), so an
//! optimiser stalled in a wrong valley fails. And, when the observation is
//! faithful to the truth, every coefficient the data constrain lands near
//! it: α0, β0 and β1 within 5%, β2 (a step's cost per decoding request,
//! 75 µs of wall time here, the weakest signal) within 8%. Faithful means
//! the truth replays the observed trace with a loss of at most
//! [`FAITHFUL_LOSS`]: a starved host delivers the mock's tokens late and the
//! loadgen reads them late, so its trace shows a slower server than the
//! coefficients say.
//!
//! Measured 2026-11-30 on a 2-core Xeon (300 requests each run): the loss
//! at the truth was 0.010–0.025 on an idle host and with one CPU-bound
//! process beside the test (21 runs), the fitted α0 within 3.0%, β0 and β1
//! within 1.1%, β2 within 3.9% (19 fits read coefficient by coefficient;
//! the other 2 runs passed the bounds below); 0.023–0.034 with two
//! processes alternating bursts of CPU and sleep (4 runs), β1 within 3.1%
//! and β2 within 4.5%; 0.058–0.067
//! with two CPU-bound processes (8 runs), E2E a median 3 ms longer than the
//! truth's, where the fit, rightly following the data, moved β1 and β2 by
//! 7–37%. In every run the fit's loss was at most 0.86 of the truth's.
//! Refitted once the fit spent what its first search leaves of the budget
//! on kicked searches (29 observations kept): every idle, one-process and
//! bursty fit the same but one (moved within 1.5%); five of the six
//! two-process ones reached a lower loss, the six's β1 and β2 then within
//! 15% and 23%.

use blis_calibrate::fit::{FitTrace, fit, server_args};
use blis_replay::latency::coefficients::{CoefficientRow, CoefficientsFile, LatencyKind};
use blis_traces::Trace;
use clap::Parser;

const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";
const ALPHA: [f64; 3] = [40000.0, 0.0, 0.0];
const BETA: [f64; 3] = [3000.0, 8.0, 150.0];
const SCALE: f64 = 2.0;
/// The largest loss of the truth on an observation still judged faithful
/// (see the module's documentation for the measured spread).
const FAITHFUL_LOSS: f64 = 0.03;

#[test]
fn fit_recovers_the_mocks_coefficients() {
    let dir = tempfile::tempdir().unwrap();
    let coeffs = dir.path().join("truth.yaml");
    CoefficientsFile {
        version: 1,
        rows: vec![CoefficientRow {
            model: MODEL.into(),
            gpu: "H100".into(),
            tensor_parallel: 1,
            latency_model: LatencyKind::Blackbox,
            alpha: ALPHA,
            beta: Some(BETA),
            mfu_prefill: None,
            mfu_decode: None,
            overhead_us: None,
            allreduce_latency_us: None,
            terms: None,
            async_scheduling: None,
            total_kv_blocks: None,
            source: Some("test truth".into()),
        }],
    }
    .write(&coeffs)
    .unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let opts = blis_mockserver::Opts::parse_from([
        "blis-mockserver",
        "--port",
        "0",
        "--model",
        MODEL,
        "--coefficients",
        coeffs.to_str().unwrap(),
        "--time-scale",
        &SCALE.to_string(),
    ]);
    let server = rt.block_on(blis_mockserver::start(&opts.config())).unwrap();
    let url = format!("http://{}", server.addr);
    let out = dir.path().join("observed");
    let lg = blis_loadgen::Opts::parse_from([
        "blis-loadgen",
        "run",
        "--server-url",
        &url,
        "--model",
        MODEL,
        "--rate",
        "20",
        "--num-requests",
        "300",
        "--input-tokens",
        "uniform:100,1500",
        "--output-tokens",
        "uniform:5,60",
        "--scrape-interval-ms",
        "0",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(blis_loadgen::run(lg, &mut Vec::new()).unwrap(), 0);
    rt.block_on(server.shutdown());

    let t = Trace::read(&out.with_extension("yaml")).unwrap();
    // Start from the bundled coefficients of this model (not the truth).
    let args = server_args(None, None, LatencyKind::Blackbox, None, &t.header);
    let ft = FitTrace::new("observed", t, &args, 0.0).unwrap();
    let r = fit(std::slice::from_ref(&ft), 3000).unwrap();
    let truth = [ALPHA[0], ALPHA[1], ALPHA[2], BETA[0], BETA[1], BETA[2]];
    let mut truth_row = r.row.clone();
    truth_row.alpha = ALPHA.map(|x| x / SCALE);
    truth_row.beta = Some(BETA.map(|x| x / SCALE));
    let truth_loss = ft.evaluate(&ft.model_of(&truth_row)).loss;
    let fitted_loss = ft.evaluate(&ft.model_of(&r.row)).loss;
    eprintln!(
        "loss {:?} in {} replays; the fitted row's {fitted_loss:.4}, the truth's {truth_loss:.4}",
        r.loss, r.evaluations
    );
    for ((n, s), (f, t)) in r.names.iter().zip(&r.start).zip(r.fitted.iter().zip(truth)) {
        eprintln!(
            "{n}: start {s:.3}, fitted × {SCALE} = {:.3}, truth {t}",
            f * SCALE
        );
    }
    assert!(
        fitted_loss <= truth_loss,
        "the fit ({fitted_loss:.4}) explains the observation worse than the truth ({truth_loss:.4}): the optimiser stalled"
    );
    if truth_loss > FAITHFUL_LOSS {
        eprintln!(
            "the observation is not faithful to the truth (its loss {truth_loss:.4} > {FAITHFUL_LOSS}: a busy host delayed the mock's tokens or their reading); the coefficients are not judged"
        );
        return;
    }
    // α0, β0, β1, β2 are constrained by TTFT, E2E and the inter-token gaps
    // of varied batches. α1 (per input token before queueing) and α2 (per
    // output token after the step) are confounded with β1 and β0: they add
    // to the same TTFT and per-token times and differ only in what they do
    // to other requests' queueing, which these data barely see; the truth
    // has them at 0 and the fit keeps them small.
    for (i, tolerance) in [(0usize, 0.05), (3, 0.05), (4, 0.05), (5, 0.08)] {
        let got = r.fitted[i] * SCALE;
        let rel = (got - truth[i]).abs() / truth[i];
        assert!(
            rel <= tolerance,
            "{}: fitted {got:.3} vs truth {} ({:.1}% off)",
            r.names[i],
            truth[i],
            100.0 * rel
        );
    }
    assert!(r.fitted[1] * SCALE < 0.1 * BETA[1], "alpha1 stays small");
    assert!(r.fitted[2] * SCALE < 0.1 * BETA[2], "alpha2 stays small");
}
