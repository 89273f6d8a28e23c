//! # blis-loop
//!
//! The whole observe → replay → calibrate loop as one function
//! ([`run_loop`], the `blis-loop` binary), and the end-to-end tests that
//! drive it against `blis-mockserver` and a real llama.cpp server.
//!
//! ```text
//! workload spec ─▶ blis-loadgen run ─▶ server (blis-mockserver, or --server-url) ─▶ DIR/real.yaml
//!                                      (real server: blis-calibrate fit ─▶ DIR/coefficients.yaml)
//! DIR/real.yaml ─▶ blis-replay run ─▶ DIR/sim.yaml
//! DIR/real.yaml + DIR/sim.yaml ─▶ blis-calibrate compare --html ─▶ DIR/report.{md,json,html}
//! ```
#![warn(missing_docs)]

use std::path::{Path, PathBuf};

use blis_replay::setup::SettingsError;
use blis_traces::step::StepContext;

use clap::Parser;

/// Why the loop stopped, and its result: the one error of every BLIS
/// binary ([`blis_traces::command`]), naming the step that failed.
pub use blis_traces::command::{CommandError, Result};
use blis_traces::exit_code;

/// `blis-loop`'s options, as every binary calls them.
pub use LoopOpts as Opts;

/// Runs the loop with progress on stderr, then prints the report's
/// Markdown and the HTML report's path to `out`; returns the process exit
/// code.
///
/// # Errors
/// Any step's failure, naming the step; an interrupted or failed
/// observation ends with its own exit code ([`CommandError::Ended`]).
pub fn run(opts: Opts, out: &mut dyn std::io::Write) -> Result<i32> {
    let r = run_loop(&opts, &mut |l| blis_traces::diag!("{}", l.trim_end()))?;
    write!(out, "{}", r.markdown)?;
    writeln!(
        out,
        "\nHTML report: {}",
        r.report.with_extension("html").display()
    )?;
    Ok(exit_code::OK)
}

/// The main job's workload and the ServeGen data it reads, built into the
/// binary: (path under `examples/`, contents).
const EMBEDDED_WORKLOAD: &[(&str, &str)] = &[
    (
        "loop-servegen.yaml",
        include_str!("../../examples/loop-servegen.yaml"),
    ),
    (
        "data/servegen/LICENSE-ServeGen",
        include_str!("../../examples/data/servegen/LICENSE-ServeGen"),
    ),
    (
        "data/servegen/README.md",
        include_str!("../../examples/data/servegen/README.md"),
    ),
    (
        "data/servegen/language/m-large/chunk-0-dataset.json",
        include_str!("../../examples/data/servegen/language/m-large/chunk-0-dataset.json"),
    ),
    (
        "data/servegen/language/m-large/chunk-0-trace.csv",
        include_str!("../../examples/data/servegen/language/m-large/chunk-0-trace.csv"),
    ),
    (
        "data/servegen/language/m-large/chunk-116-dataset.json",
        include_str!("../../examples/data/servegen/language/m-large/chunk-116-dataset.json"),
    ),
    (
        "data/servegen/language/m-large/chunk-116-trace.csv",
        include_str!("../../examples/data/servegen/language/m-large/chunk-116-trace.csv"),
    ),
    (
        "data/servegen/language/m-large/chunk-143-dataset.json",
        include_str!("../../examples/data/servegen/language/m-large/chunk-143-dataset.json"),
    ),
    (
        "data/servegen/language/m-large/chunk-143-trace.csv",
        include_str!("../../examples/data/servegen/language/m-large/chunk-143-trace.csv"),
    ),
    (
        "data/servegen/language/m-large/chunk-20-dataset.json",
        include_str!("../../examples/data/servegen/language/m-large/chunk-20-dataset.json"),
    ),
    (
        "data/servegen/language/m-large/chunk-20-trace.csv",
        include_str!("../../examples/data/servegen/language/m-large/chunk-20-trace.csv"),
    ),
    (
        "data/servegen/language/m-large/chunk-34-dataset.json",
        include_str!("../../examples/data/servegen/language/m-large/chunk-34-dataset.json"),
    ),
    (
        "data/servegen/language/m-large/chunk-34-trace.csv",
        include_str!("../../examples/data/servegen/language/m-large/chunk-34-trace.csv"),
    ),
    (
        "data/servegen/language/m-large/chunk-61-dataset.json",
        include_str!("../../examples/data/servegen/language/m-large/chunk-61-dataset.json"),
    ),
    (
        "data/servegen/language/m-large/chunk-61-trace.csv",
        include_str!("../../examples/data/servegen/language/m-large/chunk-61-trace.csv"),
    ),
];

/// The workload of the main job: one minute of ServeGen's m-large language
/// clients (arXiv:2505.09999), `examples/loop-servegen.yaml` of the
/// checkout the binary was built in; where that checkout is gone (a binary
/// copied or installed elsewhere), the copy built into the binary, written
/// with its data under `out/default-workload/`.
///
/// # Errors
/// The copy cannot be written.
pub fn default_spec(out: &Path) -> Result<PathBuf> {
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/loop-servegen.yaml");
    if built.is_file() {
        return Ok(built);
    }
    write_embedded_workload(&out.join("default-workload"))
}

/// Writes the workload built into the binary (the spec and its data) under
/// `dir`; returns the spec's path.
fn write_embedded_workload(dir: &Path) -> Result<PathBuf> {
    for (name, text) in EMBEDDED_WORKLOAD {
        let path = dir.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).step(|| format!("creating {}", parent.display()))?;
        }
        std::fs::write(&path, text).step(|| format!("writing {}", path.display()))?;
    }
    Ok(dir.join("loop-servegen.yaml"))
}

/// `blis-loop` options.
#[derive(Parser, Debug, Clone)]
#[command(name = "blis-loop", version, about = "Observe a server under a ServeGen workload, replay the trace with the simulator, and report how far the prediction is from reality", long_about = None)]
pub struct LoopOpts {
    /// A real OpenAI-compatible server (default: start blis-mockserver).
    #[arg(long, env = "BLIS_SERVER_URL")]
    pub server_url: Option<String>,
    /// Model to request (default: the server's first model).
    #[arg(long)]
    pub model: Option<String>,
    /// Server family (`--server-type` of blis-loadgen).
    #[arg(long, value_enum, default_value = "vllm")]
    pub server_type: blis_loadgen::cli::ServerTypeArg,
    /// Workload spec (default: examples/loop-servegen.yaml).
    #[arg(long, value_name = "W.yaml")]
    pub workload_spec: Option<PathBuf>,
    /// Output folder.
    #[arg(long, default_value = "out/loop")]
    pub out: PathBuf,
    /// The workload's total rate, requests/s (replaces the spec's
    /// `aggregate_rate`; the main job's default is 6).
    #[arg(allow_negative_numbers = true, long, value_name = "R")]
    pub aggregate_rate: Option<f64>,
    /// Stop sending after this many seconds of the workload.
    #[arg(allow_negative_numbers = true, long)]
    pub duration_s: Option<f64>,
    /// Wait up to this many seconds for a server not listening yet (as
    /// `blis-loadgen run --wait-for-server-s`; 0: a refused connection is
    /// an error at once).
    #[arg(
        allow_negative_numbers = true,
        long,
        default_value_t = 0.0,
        value_name = "S"
    )]
    pub wait_for_server_s: f64,
    /// Extra `blis-replay run` flags for a real server's settings, e.g.
    /// "--max-num-seqs 4 --max-num-batched-tokens 2048 --total-kv-blocks 2048".
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    pub replay_args: String,
    /// Fraction of the trace (its end) held out of the coefficient fit
    /// (real servers only); the report compares only those requests
    /// (0: fit and compare everything).
    #[arg(allow_negative_numbers = true, long, default_value_t = 0.3)]
    pub holdout_fraction: f64,
    /// The latency model fitted to a real server: step-table (this
    /// server's own step time per number of decoding requests, from its
    /// streamed tokens; the default for --server-type llamacpp), blackbox
    /// (α/β of this server; the default otherwise) or trained-physics
    /// (physics terms of the model's config.json and the hardware in
    /// --replay-args, e.g. "--model-config C.json --hardware-config H.json
    /// --hardware CPU").
    #[arg(long, value_enum)]
    pub latency_model: Option<blis_replay::commands::cli::LatencyChoice>,
}

/// What the loop produced.
#[derive(Debug, Clone)]
pub struct LoopResult {
    /// The observed trace.
    pub real: PathBuf,
    /// The replayed trace.
    pub sim: PathBuf,
    /// The report prefix (`.json`, `.md`, `.html`).
    pub report: PathBuf,
    /// The comparison.
    pub report_json: serde_json::Value,
    /// The report as Markdown.
    pub markdown: String,
    /// On the mock server: what it served, per request (its own times from
    /// receiving each request to handing its chunks to the connection),
    /// which separates the HTTP path's latency from the simulator's
    /// timing. Empty on a real server.
    pub served: Vec<blis_mockserver::server::Served>,
}

/// The first model `url` lists, waiting up to `wait` for a server that
/// refuses connections (not listening yet).
async fn first_model(url: &str, wait: std::time::Duration) -> Result<String> {
    let models = format!("{url}/v1/models");
    // What messages show (no password).
    let (url_shown, models_shown) = (
        blis_loadgen::http::shown_url(url),
        blis_loadgen::http::shown_url(&models),
    );
    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .map_err(CommandError::library)?;
    let deadline = std::time::Instant::now() + wait;
    let resp = loop {
        match client.get(&models).send().await {
            Err(e) if e.is_connect() && std::time::Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
            r => break r.step(|| format!("cannot reach the server at {url_shown}"))?,
        }
    };
    let v: serde_json::Value = resp
        .json()
        .await
        .step(|| format!("reading {models_shown}"))?;
    v["data"][0]["id"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| CommandError::Usage(format!("{models_shown} lists no model; give --model")))
}

/// What a loop derives from its observed trace in `--out`: an earlier
/// loop's are removed before observing, so that an interrupted or failed
/// run never leaves a new real trace beside an old prediction or report.
const DERIVED: [&str; 10] = [
    "coefficients.yaml",
    "sim.yaml",
    "sim.csv",
    "sim.itl.csv",
    "sim.metrics.csv",
    "sim.steps.csv",
    "sim.summary.json",
    "report.md",
    "report.json",
    "report.html",
];

/// Runs the loop; `log` receives progress lines. Each tool is called as a
/// library: the mock server with its default configuration, the
/// observation with [`blis_loadgen::options::RunOptions`], the fit and the
/// replay with their typed settings (`--replay-args` parsed once by
/// blis-replay's own parser), the comparison with
/// [`blis_calibrate::run::compare_files`].
///
/// # Errors
/// Any step's failure, naming the step.
pub fn run_loop(o: &LoopOpts, log: &mut dyn FnMut(&str)) -> Result<LoopResult> {
    if let Some(u) = &o.server_url {
        blis_loadgen::http::check_scheme(u).map_err(CommandError::Usage)?;
    }
    blis_loadgen::options::check_wait_for_server(o.wait_for_server_s)
        .map_err(CommandError::Usage)?;
    if !(0.0..1.0).contains(&o.holdout_fraction) {
        return Err(CommandError::Usage(format!(
            "--holdout-fraction must be in [0, 1) (the share of the observed trace, at its end, kept out of the fit), got {}",
            blis_traces::shown::Num(o.holdout_fraction)
        )));
    }
    std::fs::create_dir_all(&o.out).step(|| format!("creating {}", o.out.display()))?;
    for name in DERIVED {
        let _ = std::fs::remove_file(o.out.join(name));
    }
    let settings = replay_settings(o)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut mock = None;
    let url = match &o.server_url {
        Some(u) => blis_loadgen::http::base_url(u),
        None => {
            // The mock's own defaults (its command line's), on any free port.
            let mut opts = blis_mockserver::Opts::try_parse_from(["blis-mockserver"])
                .map_err(CommandError::library)?;
            opts.port = 0;
            opts.record_served = true;
            let server = rt.block_on(blis_mockserver::start(&opts.config()))?;
            let url = format!("http://{}", server.addr);
            log(&format!(
                "started blis-mockserver at {url} (model {})",
                opts.model
            ));
            mock = Some(server);
            url
        }
    };
    let model = match &o.model {
        Some(m) => m.clone(),
        None => rt.block_on(first_model(
            &url,
            std::time::Duration::from_secs_f64(o.wait_for_server_s),
        ))?,
    };
    if mock.is_none() {
        check_enough_to_fit(o, &url, &model)?;
        if settings.engine.total_kv_blocks.is_none() {
            check_settings_before_observing(o, &settings, &url, &model, log)?;
        }
    }
    let real_h = observe(o, &url, &model, log)?;
    let sim = o.out.join("sim");
    let mut replay = settings.clone();
    replay.trace = Some(real_h.clone());
    replay.out = Some(sim.clone());
    match &mock {
        // The mock's own engine settings and coefficients: the plumbing check.
        Some(server) => {
            let e = &server.engine_cfg;
            let f = &mut replay.engine;
            f.max_num_seqs.get_or_insert(e.max_num_seqs);
            f.max_num_batched_tokens
                .get_or_insert(e.max_num_batched_tokens);
            f.block_size.get_or_insert(e.block_size);
            f.total_kv_blocks.get_or_insert(e.total_kv_blocks);
        }
        None => {
            let (coeffs, latency) = fit_coefficients(o, &settings, &real_h, &model, log)?;
            replay.coefficients = Some(coeffs);
            replay.latency_model = Some(latency);
            replay.model = Some(model.clone());
        }
    }
    log("replaying the observed trace (blis-replay run)");
    let mut out = Vec::new();
    replay_ended(
        blis_replay::commands::run::run_replay(&replay, &mut out),
        &real_h,
    )?;
    let on_mock = mock.is_some();
    let mut served = Vec::new();
    if let Some(server) = mock.take() {
        if let Some(log) = &server.served {
            served = log.entries();
        }
        rt.block_on(server.shutdown());
    }
    let sim = sim.with_extension("yaml");
    let (report, compared) = compare(o, &real_h, &sim, on_mock, log)?;
    Ok(LoopResult {
        real: real_h,
        sim,
        report,
        report_json: compared.json,
        markdown: compared.markdown,
        served,
    })
}

/// `--replay-args`, read by blis-replay's own parser as the flags of
/// `blis-replay run`: the server's settings for the fit and the replay.
fn replay_settings(o: &LoopOpts) -> Result<blis_replay::RunArgs> {
    let argv = ["blis-replay", "run"]
        .into_iter()
        .chain(o.replay_args.split_whitespace());
    let opts = blis_replay::Opts::try_parse_from(argv).map_err(|e| {
        // clap's own first line names the flag.
        let said = e.render().to_string();
        let first = said.lines().next().unwrap_or_default();
        CommandError::Usage(format!(
            "--replay-args {:?}: {}",
            o.replay_args,
            first.trim_start_matches("error: ")
        ))
    })?;
    match opts.command {
        blis_replay::Command::Run(a) => {
            // Refused now, not after the observation.
            a.engine.check().map_err(|e| {
                CommandError::Usage(format!("--replay-args {:?}: {e}", o.replay_args))
            })?;
            Ok(a)
        }
        _ => Err(CommandError::Internal(
            "--replay-args did not parse as blis-replay run".into(),
        )),
    }
}

/// The options of `blis-loadgen run` that observe the server at `url`
/// serving `model` under the loop's workload, and that workload's spec.
fn run_options(
    o: &LoopOpts,
    url: &str,
    model: &str,
) -> Result<(blis_loadgen::options::RunOptions, PathBuf)> {
    let spec = match &o.workload_spec {
        Some(spec) => spec.clone(),
        None => default_spec(&o.out)?,
    };
    let workload = blis_loadgen::options::WorkloadSource {
        workload_spec: Some(spec.clone()),
        ..Default::default()
    };
    let mut run = blis_loadgen::options::RunOptions::new(url, model, workload, o.out.join("real"));
    run.server_type = o.server_type.into();
    run.scrape_interval_ms = 500;
    run.aggregate_rate = o.aggregate_rate;
    run.duration_s = o.duration_s;
    run.wait_for_server_s = o.wait_for_server_s;
    Ok((run, spec))
}

/// Observes the server at `url` serving `model` under the workload
/// (`blis-loadgen run`); returns the header of the trace it wrote.
fn observe(o: &LoopOpts, url: &str, model: &str, log: &mut dyn FnMut(&str)) -> Result<PathBuf> {
    let (run, spec) = run_options(o, url, model)?;
    let real = run.out.clone();
    log(&format!(
        "observing {} with {} (blis-loadgen run)",
        blis_loadgen::http::shown_url(url),
        spec.display()
    ));
    let mut out = Vec::new();
    let code = blis_loadgen::run::run_command(&run, &mut out)
        .step(|| "observing the server (blis-loadgen run)")?;
    log(&String::from_utf8_lossy(&out));
    let header = real.with_extension("yaml");
    match code {
        0 => Ok(header),
        exit_code::INTERRUPTED => Err(CommandError::Ended {
            code,
            message: format!(
                "interrupted while observing the server: the requests it completed are in {}, the rest recorded there as cancelled; nothing was replayed or compared",
                header.display()
            ),
        }),
        exit_code::FAILED => Err(CommandError::Ended {
            code,
            message: format!(
                "the observed run failed (its summary above gives the errors by kind; the trace is {}); nothing was replayed or compared",
                header.display()
            ),
        }),
        _ => Err(CommandError::Ended {
            code,
            message: format!(
                "observing the server ended with exit code {code}; nothing was replayed or compared"
            ),
        }),
    }
}

/// The replay step's result: an early end (Ctrl-C) keeps its exit code and
/// says what the loop kept; any other failure names the step.
fn replay_ended(r: Result<()>, real_h: &Path) -> Result<()> {
    match r {
        Err(CommandError::Ended { code, message }) => Err(CommandError::Ended {
            code,
            message: format!(
                "{message}; the observed trace is {}; nothing was compared",
                real_h.display()
            ),
        }),
        r => r
            .step(|| "replaying the trace (blis-replay run)")
            .map_err(Into::into),
    }
}

/// The latency model fitted to a real server: the flag's, else step-table
/// for llama.cpp (its CPU step time saturates with the batch), else
/// blackbox.
pub fn latency_choice(o: &LoopOpts) -> blis_replay::commands::cli::LatencyChoice {
    use blis_replay::commands::cli::LatencyChoice;
    o.latency_model.unwrap_or(
        if o.server_type == blis_loadgen::cli::ServerTypeArg::Llamacpp {
            LatencyChoice::StepTable
        } else {
            LatencyChoice::Blackbox
        },
    )
}

/// A real server: fits the latency model's coefficients on the observed
/// trace `real_h` (`blis-calibrate fit`, holding out the last requests)
/// with the server's `settings`; returns the coefficients file and the
/// latency model they are for.
fn fit_coefficients(
    o: &LoopOpts,
    settings: &blis_replay::RunArgs,
    real_h: &Path,
    model: &str,
    log: &mut dyn FnMut(&str),
) -> Result<(PathBuf, blis_replay::commands::cli::LatencyChoice)> {
    let fit = fit_args(o, settings, real_h, model);
    log(&format!(
        "fitting {} coefficients on the observed trace (blis-calibrate fit)",
        latency_choice(o).kind().name()
    ));
    let mut out = Vec::new();
    let fitted = blis_calibrate::run::fit_command(&fit, &mut out);
    if let Err(e) = &fitted
        && matches!(unresolved_setting(e), Some(SettingsError::UnknownKvSize))
    {
        // The fit's own words name its flag; here it goes through
        // --replay-args, and the observation need not be lost.
        return Err(CommandError::Usage(format!(
            "{}; the observed trace is kept at {}",
            unknown_kv_size(model),
            real_h.display()
        )));
    }
    fitted.step(|| "fitting coefficients (blis-calibrate fit)")?;
    log(&String::from_utf8_lossy(&out));
    Ok((fit.out, latency_choice(o)))
}

/// `blis-calibrate fit`'s arguments for the observed trace `real_h` of
/// `model` on the server of `settings`: the loop's latency model, its
/// hold-out, coefficients written to OUT/coefficients.yaml.
fn fit_args(
    o: &LoopOpts,
    settings: &blis_replay::RunArgs,
    real_h: &Path,
    model: &str,
) -> blis_calibrate::cli::FitArgs {
    blis_calibrate::cli::FitArgs {
        traces: vec![real_h.to_path_buf()],
        runs: None,
        model: Some(model.to_string()),
        latency_model: Some(latency_choice(o)),
        out: o.out.join("coefficients.yaml"),
        holdout_fraction: Some(o.holdout_fraction),
        budget_evals: None,
        joint: blis_calibrate::cli::JointFitFlags {
            threads: 0,
            overloaded_weight: blis_calibrate::joint::OVERLOADED_WEIGHT,
        },
        hardware: settings.hardware.clone(),
        coefficients: settings.coefficients.clone(),
        model_config: settings.model_config.clone(),
        hardware_config: settings.hardware_config.clone(),
        json: false,
        engine: settings.engine,
    }
}

/// What to give when nothing tells the KV cache size of the server of
/// `model`.
fn unknown_kv_size(model: &str) -> String {
    format!(
        "cannot tell the server's KV cache size: its /metrics has no vllm:cache_config_info and model {model:?} has no known config; give the server's settings with --replay-args, e.g. --replay-args \"--total-kv-blocks N --block-size 16 --max-num-seqs S\" (or \"--model-config DIR\")"
    )
}

/// Before observing a real server, whether the plan holds enough
/// requests for the fit: its first `1 − --holdout-fraction` must hold
/// [`blis_calibrate::fit::MIN_FIT_REQUESTS`] (completed; errors and
/// timeouts can still leave it short, which the fit then says).
fn check_enough_to_fit(o: &LoopOpts, url: &str, model: &str) -> Result<()> {
    let (run, _) = run_options(o, url, model)?;
    let planned = blis_loadgen::run::planned_requests(&run)?;
    let fitted = ((planned as f64) * (1.0 - o.holdout_fraction)).round() as u64;
    let min = blis_calibrate::fit::MIN_FIT_REQUESTS as u64;
    if fitted >= min {
        return Ok(());
    }
    let with = match (o.duration_s, o.aggregate_rate) {
        (Some(d), Some(r)) => format!(
            " (--duration-s {} at --aggregate-rate {})",
            blis_traces::shown::Num(d),
            blis_traces::shown::Num(r)
        ),
        (Some(d), None) => format!(" (--duration-s {})", blis_traces::shown::Num(d)),
        (None, Some(r)) => format!(" (--aggregate-rate {})", blis_traces::shown::Num(r)),
        (None, None) => String::new(),
    };
    Err(CommandError::Usage(format!(
        "the workload plans {planned} requests{with}: the fit takes the first {fitted} (--holdout-fraction {} holds out the rest) and needs at least {min}; observe longer or faster (--duration-s, --aggregate-rate) or hold out less; nothing was sent",
        blis_traces::shown::Num(o.holdout_fraction)
    )))
}

/// Before observing a real server, whether the fit will know its KV cache
/// size: from the flags and the model alone, else from the server's
/// settings as the observed trace's header will give them (the same
/// probes as `blis-loadgen run`), resolved as the fit will resolve them.
/// A size nothing gives is asked for now rather than after the whole
/// observation; any other settings error is left to the fit, whose
/// message says more in context (a header can only add settings, so a
/// size known without the probes is known with them).
fn check_settings_before_observing(
    o: &LoopOpts,
    settings: &blis_replay::RunArgs,
    url: &str,
    model: &str,
    log: &mut dyn FnMut(&str),
) -> Result<()> {
    let (run, _) = run_options(o, url, model)?;
    let fit = fit_args(o, settings, &run.out.with_extension("yaml"), model);
    let unknown_size = |header: &blis_traces::TraceHeader| {
        matches!(
            blis_calibrate::run::check_fit_settings(&fit, header),
            Err(blis_replay::ReplayError::Settings(
                SettingsError::UnknownKvSize
            ))
        )
    };
    let mut header = blis_traces::TraceHeader::new(blis_traces::Mode::Real);
    if !unknown_size(&header) {
        return Ok(());
    }
    log(&format!(
        "model {model:?} has no known config: asking the server for its KV cache settings (blis-loadgen's probes)"
    ));
    header.server = Some(
        blis_loadgen::run::probe_server(&run)
            .step(|| "probing the server (as blis-loadgen run does)")?,
    );
    if unknown_size(&header) {
        return Err(CommandError::Usage(format!(
            "{}; no request of the workload was sent",
            unknown_kv_size(model)
        )));
    }
    Ok(())
}

/// The server setting a failed fit could not resolve, found along the
/// chain of `e`'s causes (a library's error kept whole in
/// [`CommandError::Library`] included).
fn unresolved_setting(e: &CommandError) -> Option<&SettingsError> {
    let mut at: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(x) = at {
        if let Some(f) = x.downcast_ref::<blis_calibrate::fit::FitError>() {
            return f.settings();
        }
        // (A transparent wrapper's source is its content's source.)
        at = match x.downcast_ref::<CommandError>() {
            Some(CommandError::Library(inner)) => Some(inner.as_ref()),
            _ => x.source(),
        };
    }
    None
}

/// Compares the observed trace `real_h` with the replayed `sim`
/// (`blis-calibrate compare --html`), on the held-out requests when
/// coefficients were fitted; returns the report's path prefix and what it
/// holds.
fn compare(
    o: &LoopOpts,
    real_h: &Path,
    sim: &Path,
    on_mock: bool,
    log: &mut dyn FnMut(&str),
) -> Result<(PathBuf, blis_calibrate::run::Compared)> {
    let report = o.out.join("report");
    let mut opts = blis_calibrate::compare::CompareOptions::default();
    if on_mock {
        opts.real_label = Some("the bundled mock server (blis-mockserver), whose timing is this simulator run in real time: agreement here checks the plumbing of observe → replay → compare (HTTP, streaming, scheduling, the trace), not the simulator's accuracy against a real engine".into());
    }
    if !on_mock && o.holdout_fraction > 0.0 {
        // Judge the prediction on the requests the fit did not see: the
        // fit's split (by arrival, the first 1 − h fitted) is by request id
        // for open-loop workloads, so the fitted part is compare's warm-up.
        let n = blis_traces::Trace::read(real_h)
            .step(|| format!("reading {}", real_h.display()))?
            .records
            .len();
        let fitted = ((n as f64) * (1.0 - o.holdout_fraction)).round() as u64;
        log(&format!(
            "comparing the held-out requests (the last {} of {n}; blis-calibrate compare --warmup {fitted} --html)",
            n as u64 - fitted
        ));
        opts.warmup = Some(fitted);
    } else {
        log("comparing (blis-calibrate compare --html)");
    }
    let compared = blis_calibrate::run::compare_files(real_h, sim, &report, &opts, true)
        .step(|| "comparing (blis-calibrate compare)")?;
    Ok((report, compared))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The main job runs from a binary whose checkout is gone: the
    /// workload built into it, written out, is the checkout's, data and
    /// all (the same requests; a data file the spec gained but the binary
    /// lacks fails here).
    #[test]
    fn the_built_in_workload_generates_the_checkouts_requests() {
        use blis_traces::{GenerateOptions, WorkloadSpec, generate};
        let dir = tempfile::tempdir().unwrap();
        let copy = write_embedded_workload(dir.path()).unwrap();
        let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/loop-servegen.yaml");
        let requests = |p: &Path| {
            let spec = WorkloadSpec::from_file(p).unwrap();
            generate(&spec, &GenerateOptions::default()).unwrap()
        };
        let want = requests(&built);
        assert!(want.len() > 100);
        assert_eq!(requests(&copy), want);
        assert!(dir.path().join("data/servegen/LICENSE-ServeGen").is_file());
    }

    /// A held-out share outside [0, 1) is a usage error before anything
    /// is started or written (1.5 ran the whole loop and, against a real
    /// server, fitted on nothing).
    #[test]
    fn a_holdout_fraction_outside_zero_to_one_is_refused_up_front() {
        let dir = tempfile::tempdir().unwrap();
        for h in ["1.5", "1", "-0.1", "NaN"] {
            let out = dir.path().join("out");
            let o = LoopOpts::parse_from([
                "blis-loop",
                "--holdout-fraction",
                h,
                "--out",
                out.to_str().unwrap(),
            ]);
            let mut lines = Vec::new();
            let e = run_loop(&o, &mut |l| lines.push(l.to_string()))
                .err()
                .unwrap_or_else(|| panic!("--holdout-fraction {h} was accepted"));
            assert!(
                e.to_string()
                    .contains("--holdout-fraction must be in [0, 1)"),
                "{h}: {e}"
            );
            assert!(lines.is_empty() && !out.exists(), "{h}: {lines:?}");
        }
    }

    #[test]
    fn replay_args_are_read_by_blis_replays_parser_and_a_bad_flag_is_named() {
        let o = LoopOpts::parse_from(["blis-loop", "--replay-args", "--max-num-seqs 4"]);
        let s = replay_settings(&o).unwrap();
        assert_eq!(s.engine.max_num_seqs, Some(4));
        let o = LoopOpts::parse_from(["blis-loop", "--replay-args", "--bogus 3"]);
        let e = replay_settings(&o).unwrap_err().to_string();
        assert!(e.contains("--replay-args") && e.contains("--bogus"), "{e}");
    }

    /// Settings no server could have are refused before the observation
    /// (a minute of the main job's workload), not at the replay after it.
    #[test]
    fn replay_args_no_server_could_have_are_refused_up_front() {
        for (args, says) in [
            ("--max-num-seqs 0", "must be positive"),
            ("--max-num-batched-tokens 0", "must be positive"),
            ("--block-size 0", "must be positive"),
            ("--block-size 100000", "block_size 100000 is above 65536"),
            (
                "--total-kv-blocks 0",
                "total_kv_blocks: 0 (--total-kv-blocks)",
            ),
        ] {
            let o = LoopOpts::parse_from(["blis-loop", "--replay-args", args]);
            let e = replay_settings(&o).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("--replay-args {args:?}: ")) && e.contains(says),
                "{args}: {e}"
            );
        }
        let o = LoopOpts::parse_from([
            "blis-loop",
            "--replay-args",
            "--max-num-seqs 1 --block-size 65536",
        ]);
        assert!(replay_settings(&o).is_ok());
    }

    /// A replay stopped by Ctrl-C ends the loop with the replay's exit code
    /// (4, as `blis-replay run` alone), not as a failed step (1); a failure
    /// still names the step.
    #[test]
    fn an_interrupted_replay_keeps_its_exit_code() {
        let real = Path::new("out/loop/real.yaml");
        let e = replay_ended(
            Err(CommandError::Ended {
                code: exit_code::INTERRUPTED,
                message: "interrupted: the replay stopped early".into(),
            }),
            real,
        )
        .unwrap_err();
        assert_eq!(e.exit_code(), exit_code::INTERRUPTED);
        let m = e.to_string();
        assert!(
            m.starts_with("interrupted") && m.contains("out/loop/real.yaml"),
            "{m}"
        );
        let e = replay_ended(Err(CommandError::Usage("bad".into())), real).unwrap_err();
        assert_eq!(e.exit_code(), exit_code::ERROR);
        assert!(e.to_string().contains("replaying the trace"), "{e}");
        assert!(replay_ended(Ok(()), real).is_ok());
    }
}
