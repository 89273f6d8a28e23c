//! `blis-calibrate fit` recovers the coefficients a server really has: a
//! trace observed from `blis-mockserver` running known blackbox α/β is fitted
//! from a different starting point (the bundled row), and every coefficient
//! the data constrains lands within 5%. (Its own test binary: it observes
//! the mock in real time for about 15 s.)
//!
//! The mock runs at `--time-scale 2`, i.e. twice real time: its wall-clock
//! latencies are those of a server with every coefficient halved, so the
//! fit is expected at truth / 2.

use blis_calibrate::fit::{FitTrace, fit, server_args};
use blis_replay::latency::coefficients::{CoefficientRow, CoefficientsFile, LatencyKind};
use blis_traces::Trace;
use clap::Parser;

const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";
const ALPHA: [f64; 3] = [40000.0, 0.0, 0.0];
const BETA: [f64; 3] = [3000.0, 8.0, 150.0];
const SCALE: f64 = 2.0;

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
    let r = fit(&[ft], 3000).unwrap();
    let truth = [ALPHA[0], ALPHA[1], ALPHA[2], BETA[0], BETA[1], BETA[2]];
    eprintln!("loss {:?} in {} replays", r.loss, r.evaluations);
    for ((n, s), (f, t)) in r.names.iter().zip(&r.start).zip(r.fitted.iter().zip(truth)) {
        eprintln!(
            "{n}: start {s:.3}, fitted × {SCALE} = {:.3}, truth {t}",
            f * SCALE
        );
    }
    // α0, β0, β1, β2 are constrained by TTFT, E2E and the inter-token gaps
    // of varied batches. α1 (per input token before queueing) and α2 (per
    // output token after the step) are confounded with β1 and β0: they add
    // to the same TTFT and per-token times and differ only in what they do
    // to other requests' queueing, which these data barely see; the truth
    // has them at 0 and the fit keeps them small.
    for i in [0usize, 3, 4, 5] {
        let got = r.fitted[i] * SCALE;
        let rel = (got - truth[i]).abs() / truth[i];
        assert!(
            rel <= 0.05,
            "{}: fitted {got:.3} vs truth {} ({:.1}% off)",
            r.names[i],
            truth[i],
            100.0 * rel
        );
    }
    assert!(r.fitted[1] * SCALE < 0.1 * BETA[1], "alpha1 stays small");
    assert!(r.fitted[2] * SCALE < 0.1 * BETA[2], "alpha2 stays small");
}
