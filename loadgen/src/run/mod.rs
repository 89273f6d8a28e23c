//! `blis-loadgen run`: send a planned workload to a server on its exact
//! schedule and record everything.
//!
//! ```text
//! plan ──▶ units (single requests, or the rounds of one session)
//!   open loop:   dispatcher task ── sleep until start + arrival ──▶ spawn unit task
//!   closed loop: N worker tasks, each taking the next unit when its last ends
//! unit task ──▶ [max-in-flight permit] ──▶ HTTP request ──▶ Capture ──▶ recorder thread ──▶ PREFIX.csv, .itl.csv
//! scraper task ── every interval ──▶ /metrics ──▶ recorder ──▶ PREFIX.metrics.csv
//! ```
//!
//! The schedule is absolute: each send waits until `run_start + arrival`
//! (with a timerfd precise to tens of µs, unlike tokio's millisecond timer;
//! see [`crate::timer`]), never a sum of sleeps, so delays never
//! accumulate; how late each send was (the send lag) is recorded and
//! judged. Later rounds of a session wait for the previous round's response
//! plus the think time.
//!
//! By concern: `schedule` (the plan and this shard's part), `connect`
//! (probing the server), `shared` (what every request task shares),
//! `send` (one unit: wait, build, send, record), `dispatch` (open and
//! closed loop), `signals`, `progress`, `finish` (the recorder, the
//! header, the trace written whole, the summary); this module validates
//! the options and runs the phases in order.

mod connect;
mod dispatch;
mod finish;
mod progress;
mod schedule;
mod send;
mod shared;
mod signals;

use crate::{CommandError, Result};
use blis_traces::step::StepContext;
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use blis_traces::LoadGeneratorInfo;
use tokio::sync::{Semaphore, watch};

use crate::clock::RunClock;
use crate::options::RunOptions;
use crate::report::{Slo, Summary};
use crate::{exit_code, probe, scrape};

use self::{
    connect::{connect, key_on_command_line},
    dispatch::{dispatch, end_dispatch, saturating_secs, wait_for_end},
    finish::{Recorder, RunEnd, finish_trace, start_recorder, summarize_run, unwrap_shared},
    progress::{progress_bar, spawn_progress},
    schedule::{plan, start_time_us},
    shared::{Progress, Shared},
    signals::Signals,
};

/// The most `--client-threads`: each is an OS thread of the async
/// runtime, whose start-up aborts the process when the OS refuses one
/// (beyond `ulimit -u`), and past a few per core they only add contention.
pub const MAX_CLIENT_THREADS: usize = 1024;

/// Validated numeric options.
fn check_args(args: &RunOptions) -> Result<Option<Slo>> {
    crate::http::check_scheme(&args.server_url).map_err(CommandError::Usage)?;
    if !(args.timeout_s > 0.0 && args.timeout_s.is_finite()) {
        return Err(CommandError::Usage(format!(
            "--timeout-s must be a positive number of seconds, got {}",
            blis_traces::shown::Num(args.timeout_s)
        )));
    }
    crate::options::check_wait_for_server(args.wait_for_server_s).map_err(CommandError::Usage)?;
    if !(args.grace_s >= 0.0 && args.grace_s.is_finite()) {
        return Err(CommandError::Usage(format!(
            "--grace-s must be a non-negative number of seconds, got {}",
            blis_traces::shown::Num(args.grace_s)
        )));
    }
    if !(args.max_behind_s >= 0.0 && args.max_behind_s.is_finite()) {
        return Err(CommandError::Usage(format!(
            "--max-behind-s must be a non-negative number of seconds (0: never stop), got {}",
            blis_traces::shown::Num(args.max_behind_s)
        )));
    }
    if args.client_threads > MAX_CLIENT_THREADS {
        return Err(CommandError::Usage(format!(
            "--client-threads {}: at most {MAX_CLIENT_THREADS} (0: one per CPU core)",
            args.client_threads
        )));
    }
    if !(args.max_send_lag_ms > 0.0 && args.max_send_lag_ms.is_finite()) {
        return Err(CommandError::Usage(format!(
            "--max-send-lag-ms must be positive, got {}",
            blis_traces::shown::Num(args.max_send_lag_ms)
        )));
    }
    if !(0.0..=1.0).contains(&args.max_error_rate) {
        return Err(CommandError::Usage(format!(
            "--max-error-rate must be a fraction in [0, 1], got {}",
            blis_traces::shown::Num(args.max_error_rate)
        )));
    }
    let max_s = blis_traces::csvio::MAX_TIME_US as f64 / 1e6;
    if let Some(d) = args.duration_s
        && !(d > 0.0 && d <= max_s)
    {
        return Err(CommandError::Usage(format!(
            "--duration-s must be a positive number of seconds up to 2^53 µs (285 years), got {}",
            blis_traces::shown::Num(d)
        )));
    }
    if args.concurrency == Some(0) {
        return Err(CommandError::Usage(
            "--concurrency must be at least 1".into(),
        ));
    }
    if args.max_in_flight == Some(0) {
        return Err(CommandError::Usage(
            "--max-in-flight must be at least 1".into(),
        ));
    }
    let scheme = crate::http::lower_scheme(&args.server_url);
    if !(scheme.starts_with("http://") || scheme.starts_with("https://")) {
        return Err(CommandError::Usage(format!(
            "--server-url must start with http:// or https://, got {:?}",
            crate::http::shown_url(&args.server_url)
        )));
    }
    args.slo
        .as_deref()
        .map(str::parse::<Slo>)
        .transpose()
        .map_err(CommandError::Usage)
}

/// `blis-loadgen run`. Returns the process exit code: 0 valid, 3
/// client-bound with `--strict`, 4 interrupted, 5 failed.
///
/// # Errors
/// Bad options or workload, an unreachable server, unwritable output.
pub fn run_command(args: &RunOptions, out: &mut dyn Write) -> Result<i32> {
    let slo = check_args(args)?;
    // A response whose reading panics is said once, not per request.
    crate::guard::quiet_guarded_panics();
    if args.api_key.is_some() && key_on_command_line(std::env::args()) {
        blis_traces::diag!(
            "warning: --api-key on the command line is visible to other users of this machine (ps, /proc); set BLIS_API_KEY instead"
        );
    }
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    if args.client_threads > 0 {
        rt.worker_threads(args.client_threads);
    }
    let rt = rt
        .enable_all()
        .thread_name("blis-loadgen")
        .build()
        .step(|| "starting the async runtime")?;
    let base = crate::http::base_url(&args.server_url);
    let normalized;
    let args = if base == args.server_url.trim_end_matches('/') {
        args
    } else {
        blis_traces::diag!(
            "note: --server-url {} read as the server's base URL {shown}: requests go to {shown}{}, metrics to {}",
            crate::http::shown_url(&args.server_url),
            crate::http::api_path(args.api),
            crate::http::shown_url(
                &args
                    .metrics_url
                    .clone()
                    .unwrap_or_else(|| format!("{base}/metrics"))
            ),
            shown = crate::http::shown_url(&base),
        );
        normalized = RunOptions {
            server_url: base,
            ..args.clone()
        };
        &normalized
    };
    let summary = rt.block_on(run_async(args, slo))?;
    if args.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&summary)?)?;
    } else {
        write!(out, "{}", summary.to_markdown())?;
    }
    Ok(if summary.failed {
        exit_code::FAILED
    } else if summary.interrupted {
        exit_code::INTERRUPTED
    } else if summary.schedule.client_bound && args.strict {
        exit_code::CLIENT_BOUND
    } else {
        exit_code::OK
    })
}

/// How many requests `run` with `args` plans (warm-up included), without
/// sending any: the workload is planned as `run` plans it.
///
/// # Errors
/// A workload that cannot be planned, as [`run_command`] would meet it.
pub fn planned_requests(args: &RunOptions) -> Result<u64> {
    Ok(plan(args)?.facts.count)
}

/// The server's section of the trace header that `run` with `args` would
/// write, found by the same probes before anything is sent (its model
/// list, a one-token test request, `/metrics`, `/version`, llama.cpp's
/// `/props`): for a caller that checks the server's settings before a run.
///
/// # Errors
/// As [`run_command`] before its first send: an unreachable server, a
/// refused test request; Ctrl-C ends it with [`exit_code::INTERRUPTED`].
pub fn probe_server(args: &RunOptions) -> Result<blis_traces::ServerConfig> {
    // (The base URL, as `run_command` reads it.)
    let args = &RunOptions {
        server_url: crate::http::base_url(&args.server_url),
        ..args.clone()
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .step(|| "starting the async runtime")?;
    rt.block_on(async {
        let mut signals = Signals::new().step(|| "installing signal handlers")?;
        let shown = crate::http::shown_url(args.server_url.trim_end_matches('/'));
        tokio::select! {
            s = connect(args) => Ok(s?.config(args)),
            () = signals.recv() => Err(CommandError::Ended {
                code: exit_code::INTERRUPTED,
                message: format!("interrupted while probing {shown}, before the run: no request of the workload was sent"),
            }),
        }
    })
}

async fn run_async(args: &RunOptions, slo: Option<Slo>) -> Result<Summary> {
    let mut signals = Signals::new().step(|| "installing signal handlers")?;
    let plan = plan(args)?;
    let base = args.server_url.trim_end_matches('/');
    let shown = crate::http::shown_url(base);
    // The probes and the warm connections can wait on a server that does
    // not answer: a signal ends the command there, before any send.
    let interrupted = || CommandError::Ended {
        code: exit_code::INTERRUPTED,
        message: format!(
            "interrupted while probing {shown}, before the first send: nothing was sent and no trace was written"
        ),
    };
    let server = tokio::select! {
        s = connect(args) => s?,
        () = signals.recv() => return Err(interrupted()),
    };

    // A server whose model list stalled after its headers would stall
    // the warm-up's reads the same way, for nothing.
    let warm = if server.info.stalls_bodies {
        0
    } else {
        probe::connections_to_warm(
            if plan.facts.burst {
                // (All at once: as many as start together.)
                Some(f64::INFINITY)
            } else {
                plan.facts.requested_rate
            },
            args.concurrency,
            args.max_in_flight,
        )
    };
    let opened = tokio::select! {
        n = probe::warm_connections(
            &server.client,
            base,
            args.api_key.as_deref(),
            warm,
            probe::probe_wait(dispatch::saturating_secs(args.timeout_s)),
        ) => n,
        () = signals.recv() => return Err(interrupted()),
    };
    if opened < warm {
        blis_traces::diag!(
            "warning: {opened} of {warm} connections opened before the run; the first sends may wait for the rest"
        );
    }

    // The trace, recorded by its own thread.
    let clock = RunClock::new();
    // A short lead so that the first sends are not late from set-up, or
    // the agreed start of the shards.
    let run_start_us = start_time_us(args.start_at, clock.now_us())?;
    let any_stream = !args.no_stream && plan.facts.any_streaming;
    let scrape_on = server.scrape_on;
    let Recorder {
        mut header,
        tx,
        thread: recorder,
        failed: record_failed,
        live,
    } = start_recorder(args, &plan, &server, run_start_us, any_stream, slo)?;
    let (stopping, _) = watch::channel(false);
    let (cancel, _) = watch::channel(false);
    let total = plan.facts.count;
    let sh = Arc::new(Shared {
        ep: server.ep,
        clock,
        run_start_us,
        tokens_per_word: server.tokens_per_word,
        no_stream: args.no_stream,
        timeout: saturating_secs(args.timeout_s),
        tx: tx.clone(),
        live: live.clone(),
        sem: args.max_in_flight.map(|n| Arc::new(Semaphore::new(n))),
        stopping,
        cancel,
        progress: Progress::default(),
        growth: plan.growth,
        xid_prefix: format!("blis-{:x}", run_start_us),
        record_failed: record_failed.clone(),
        // (A burst is all due at once: sent as it can be, never held or
        // stopped for being behind.)
        max_behind: (args.max_behind_s > 0.0 && !plan.facts.burst)
            .then(|| saturating_secs(args.max_behind_s)),
        stopped_behind_us: AtomicU64::new(0),
        behind_after: if plan.facts.burst {
            Duration::MAX
        } else {
            saturating_secs(args.max_send_lag_ms / 1e3)
        },
    });

    // The scraper and the progress bar, beside the senders.
    let scrape_stats = Arc::new(scrape::ScrapeStats::default());
    let (scrape_stop, scrape_stop_rx) = watch::channel(false);
    let scraper = scrape_on.then(|| {
        tokio::spawn(scrape::run(scrape::ScrapeConfig {
            client: server.client.clone(),
            url: server.metrics_url.clone(),
            api_key: args.api_key.clone(),
            interval: Duration::from_millis(args.scrape_interval_ms),
            clock,
            out: tx.clone(),
            stats: scrape_stats.clone(),
            stop: scrape_stop_rx,
        }))
    });
    drop(tx);
    let bar = progress_bar(total);
    let ticker = spawn_progress(&sh, &bar, live);
    let (done_tx, done_rx) = tokio::sync::mpsc::channel::<()>(1);
    let (warmup_below, requested_rate, burst) = (
        plan.facts.warmup_below,
        plan.facts.requested_rate,
        plan.facts.burst,
    );
    let dispatcher = dispatch(args, &sh, plan.units.into_iter(args.shard), &done_tx);
    drop(done_tx);
    let interrupted = wait_for_end(args, &sh, &mut signals, done_rx, &bar).await;

    // Everything stops; the recorder hands back what it wrote.
    ticker.abort();
    let _ = ticker.await;
    scrape_stop.send_replace(true);
    if let Some(s) = scraper {
        let _ = s.await;
    }
    end_dispatch(dispatcher, &sh, interrupted).await;
    bar.finish_and_clear();
    // Every task has ended; the last references go as they unwind.
    let sh = unwrap_shared(sh).await?;
    drop(sh.tx);
    let mut recorded = recorder
        .join()
        .map_err(|_| CommandError::Internal("the recorder thread panicked".into()))?;
    let rows = recorded.tally.rows();
    let stopped_behind_us = sh.stopped_behind_us.load(Ordering::Relaxed);
    let mut summary = summarize_run(
        &mut recorded,
        RunEnd {
            warmup_below,
            requested_rate,
            burst,
            slo,
            interrupted,
            run_start_us,
            stopped_behind_s: (stopped_behind_us > 0).then(|| stopped_behind_us as f64 / 1e6),
        },
        args,
    );
    if scrape_on {
        summary.metrics = Some(scrape_stats.summary(recorded.metric_rows));
    }
    header.load_generator = Some(LoadGeneratorInfo {
        requested_rate: summary.schedule.requested_rate,
        achieved_rate: summary.schedule.achieved_rate,
        send_lag_p50_ms: summary.schedule.send_lag_p50_ms,
        send_lag_p99_ms: summary.schedule.send_lag_p99_ms,
        client_bound: Some(summary.schedule.client_bound),
        timeout_s: Some(args.timeout_s),
    });
    finish_trace(
        recorded,
        rows,
        &header,
        &scrape_stats,
        any_stream,
        scrape_on,
    )?;
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::dispatch::{BEHIND_CAP_MIN, BehindCap};
    use super::progress::progress_message;
    use super::schedule::{PlanFacts, PlannedUnits};
    use super::send::{History, next_prompt, units};
    use super::*;
    use crate::http::{Message, Prompt};
    use blis_traces::{ExtraColumn, GenerateOptions, TraceRecord};
    use std::time::Instant;

    #[test]
    fn the_progress_line_says_sent_rate_in_flight_failed_ttft_and_lag() {
        let live = crate::record::Live::new(0);
        assert_eq!(
            progress_message(0, 0, 0, 0.0, &live),
            "sent 0 (0.0 req/s), in flight 0, failed 0 | TTFT p50 - p99 - ms | send lag p99 - ms",
            "no figure before the first request"
        );
        live.ttft_p50_us.store(33_500, Ordering::Relaxed);
        live.ttft_p99_us.store(47_730, Ordering::Relaxed);
        live.lag_p99_us.store(3_300, Ordering::Relaxed);
        assert_eq!(
            progress_message(178, 18, 2, 20.24, &live),
            "sent 178 (20.2 req/s), in flight 18, failed 2 | TTFT p50 33.5 p99 47.7 ms | send lag p99 3.3 ms"
        );
    }

    #[test]
    fn seconds_past_what_a_duration_holds_are_forever_not_a_panic() {
        assert_eq!(saturating_secs(f64::INFINITY), Duration::MAX);
        assert_eq!(saturating_secs(1e300), Duration::MAX);
        assert_eq!(saturating_secs(1.5), Duration::from_millis(1_500));
        assert_eq!(saturating_secs(0.0), Duration::ZERO);
    }

    #[tokio::test]
    async fn a_client_behind_its_schedule_starts_a_unit_only_when_one_ends() {
        let after = Duration::from_millis(10);
        let never = Duration::from_secs(60);
        let mut hold = BehindCap::default();
        // On schedule (due ahead): no hold, however many are live.
        hold.live.store(5_000, Ordering::Relaxed);
        let ahead = Instant::now() + never;
        hold.admit(ahead, after, None, || false).await;
        assert_eq!(hold.cap, None);
        // 50 ms behind with 1,000 live: held at 1,250.
        hold.live.store(1_000, Ordering::Relaxed);
        let due = Instant::now() - Duration::from_millis(50);
        hold.admit(due, after, None, || false).await;
        assert_eq!(hold.cap, Some(1_250));
        hold.live.store(1_250, Ordering::Relaxed);
        let live = hold.live.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(30)).await;
            live.fetch_sub(1, Ordering::Relaxed);
        });
        let t = Instant::now();
        hold.admit(due, after, None, || false).await;
        assert!(
            t.elapsed() >= Duration::from_millis(30),
            "waited for a unit to end"
        );
        // The hold stays while behind.
        assert_eq!(hold.cap, Some(1_250));
        // Stopping, or too far behind, never waits (nothing would end).
        hold.live.store(10_000, Ordering::Relaxed);
        tokio::time::timeout(never, hold.admit(due, after, None, || true))
            .await
            .expect("stopping does not wait");
        let too_far = Some(Duration::from_millis(40));
        tokio::time::timeout(never, hold.admit(due, after, too_far, || false))
            .await
            .expect("past --max-behind-s does not wait");
        // A nearly idle client is held at the floor; on schedule, lifted.
        let mut idle = BehindCap::default();
        idle.admit(due, after, None, || false).await;
        assert_eq!(idle.cap, Some(BEHIND_CAP_MIN));
        idle.admit(ahead, after, None, || false).await;
        assert_eq!(idle.cap, None);
    }

    #[test]
    fn a_key_given_on_the_command_line_is_noticed() {
        let args = |v: &[&str]| {
            v.iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
                .into_iter()
        };
        assert!(key_on_command_line(args(&[
            "blis-loadgen",
            "run",
            "--api-key",
            "k"
        ])));
        assert!(key_on_command_line(args(&[
            "blis-loadgen",
            "run",
            "--api-key=k"
        ])));
        assert!(!key_on_command_line(args(&[
            "blis-loadgen",
            "run",
            "--model",
            "m"
        ])));
    }
    use blis_traces::Request;

    fn rec(id: u64, arrival: i64, session: &str, round: u32) -> TraceRecord {
        TraceRecord::planned(Request {
            request_id: id,
            arrival_time_us: arrival,
            session_id: Arc::from(session),
            round_index: round,
            input_tokens: 100,
            output_tokens: 10,
            ..Request::default()
        })
    }

    #[test]
    fn sessions_become_one_unit_in_round_order() {
        let u = units(vec![
            rec(0, 0, "a", 0),
            rec(1, 5, "", 0),
            rec(3, 20, "a", 2),
            rec(2, 10, "a", 1),
        ]);
        assert_eq!(u.len(), 2);
        let ids: Vec<u64> = u[0].iter().map(|r| r.request.request_id).collect();
        assert_eq!(ids, [0, 2, 3]);
        assert_eq!(u[1][0].request.request_id, 1);
    }

    fn run_args(workload: &[&str]) -> RunOptions {
        use clap::Parser;
        let mut v = vec![
            "blis-loadgen",
            "run",
            "--server-url",
            "http://127.0.0.1:1",
            "--model",
            "m",
            "--out",
            "unused",
        ];
        v.extend(workload);
        match crate::cli::Opts::parse_from(v).command {
            crate::cli::Command::Run(a) => (*a).into(),
            _ => unreachable!("a run"),
        }
    }

    /// A generated workload without sessions is generated as the run goes
    /// (its memory does not grow with its length), in the same order and
    /// with the same facts as when held; one with sessions is held.
    #[test]
    fn a_generated_plan_is_streamed_unless_it_has_sessions() {
        let p = plan(&run_args(&["--rate", "100", "--num-requests", "5000"])).unwrap();
        assert!(matches!(p.units, PlannedUnits::Generated(_)));
        assert_eq!(p.facts.count, 5000);
        assert_eq!(p.facts.planned_ids.as_deref(), Some("0-4999"));
        let streamed: Vec<TraceRecord> = p.units.into_iter(None).flatten().collect();
        let (_, held) = crate::plan::load_workload(
            &run_args(&["--rate", "100", "--num-requests", "5000"]).workload,
            &run_args(&["--rate", "100", "--num-requests", "5000"]).synthetic,
            &GenerateOptions {
                num_requests: Some(5000),
                ..GenerateOptions::default()
            },
        )
        .unwrap();
        assert_eq!(streamed, held);
        let spec = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../examples/chat-sessions.yaml"
        );
        let p = plan(&run_args(&[
            "--workload-spec",
            spec,
            "--num-requests",
            "200",
        ]))
        .unwrap();
        assert!(matches!(p.units, PlannedUnits::Held(_)));
        assert_eq!(p.facts.count, 200);
    }

    fn facts(r: &[TraceRecord], warmup: u64) -> PlanFacts {
        PlanFacts::gather(r.iter().enumerate().map(Ok), warmup, false, None).unwrap()
    }

    #[test]
    fn warmup_is_the_smallest_ids() {
        let r = vec![rec(5, 0, "", 0), rec(7, 1, "", 0), rec(6, 2, "", 0)];
        assert_eq!(facts(&r, 2).warmup_below, 7);
        assert_eq!(facts(&r, 0).warmup_below, 0);
        assert_eq!(facts(&r, 3).warmup_below, u64::MAX);
        assert_eq!(facts(&r, 9).warmup_below, u64::MAX);
    }

    /// The facts gathered in one pass equal those of the whole plan at
    /// once: ids as ranges, extra columns in canonical order, the rate.
    #[test]
    fn plan_facts_in_one_pass_equal_those_of_the_whole_plan() {
        let mut r: Vec<TraceRecord> = (0..200u64)
            .map(|i| rec(i * 7 % 211, i as i64 * 1000, "", 0))
            .collect();
        r[3].request.think_time_us = Some(5);
        r[150].request.content_key = Some(3);
        r[9].other.push(("z".into(), "1".into()));
        let f = facts(&r, 0);
        let mut ids: Vec<u64> = r.iter().map(|x| x.request.request_id).collect();
        ids.sort_unstable();
        assert_eq!(f.planned_ids, blis_traces::header::id_ranges(&ids));
        assert_eq!(f.extras, ExtraColumn::needed_for(&r));
        assert_eq!(f.count, 200);
        assert_eq!(f.requested_rate, Some(199.0 / 0.199));
        let seq: Vec<TraceRecord> = (10..20).map(|i| rec(i, i as i64, "", 0)).collect();
        assert_eq!(facts(&seq, 0).planned_ids.as_deref(), Some("10-19"));
    }

    #[test]
    fn accumulated_prompts_carry_the_answer() {
        let h = History {
            prompt: Prompt::Chat(vec![Message {
                role: "user",
                content: "q1".into(),
            }]),
            answer: "a1".into(),
            planned_in: 100,
            planned_out: 10,
        };
        let mut r = rec(1, 0, "s", 1);
        r.request.input_tokens = 150;
        let Prompt::Chat(m) = next_prompt(&h, &r, 1.0) else {
            panic!("chat expected")
        };
        assert_eq!(m.len(), 3);
        assert_eq!(m[1].content, "a1");
        assert_eq!(m[2].content.split(' ').count(), 40);
    }
}
