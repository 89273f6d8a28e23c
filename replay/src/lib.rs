//! # blis-replay
//!
//! A deterministic discrete-event simulator of vLLM-style LLM serving
//! (`../shared/design/core-engine.md`): continuous batching with chunked
//! prefill, a paged KV cache with prefix caching and preemption by
//! recompute, FCFS/priority/SJF scheduling, and two latency models
//! (blackbox α/β and an analytical roofline). It predicts, for every request
//! of a trace or workload, when its first and later tokens arrive.
//!
//! ```text
//! Input* ──▶ sim::replay ──▶ Instance (scheduler, KV cache, latency model)
//!                 │                       │
//!                 └──── Sink ◀── tokens, completions, samples
//! ```
//!
//! The folders are the layers, each using only those below it:
//!
//! | layer | modules |
//! |---|---|
//! | commands (the command line) | [`commands`]: `cli`, `run`, `evaluate` |
//! | library entry points | [`api`] (workloads, replays), [`setup`] (flags-free server settings → engine) |
//! | outputs | [`output`]: `collector` (trace files), `summary`, `fitness` |
//! | discrete-event run | [`sim`] (one clock over instances and the gateway) |
//! | the cluster | [`cluster`]: `control`, `admission`, `routing` (policies, scorers), `priority`, `prefix_index`, `policy` (bundles) |
//! | the engine | [`engine`]: `instance`, `batch` (batch formation, chunked prefill, preemption), `queue_order`, `kv_cache` |
//! | latency models | [`latency`]: `shape` (the trait), `blackbox`, `roofline`, `physics`, `arch`, `coefficients` |
//!
//! ## Example
//!
//! ```
//! use blis_replay::{Blackbox, EngineConfig, Instance, Model, replay};
//! use blis_replay::output::Collector;
//! use blis_replay::sim::{Input, SimOptions};
//! use blis_traces::{Request, TraceRecord};
//!
//! let latency = Model::Blackbox(Blackbox { alpha: [0.0; 3], beta: [5000.0, 20.0, 300.0] });
//! let mut inst = Instance::new(EngineConfig::default(), latency);
//! let inputs = (0..10).map(|i| {
//!     let r = Request { request_id: i, input_tokens: 500, output_tokens: 100, streaming: true,
//!                       arrival_time_us: i as i64 * 1_000_000, ..Request::default() };
//!     Input::from_record(TraceRecord::planned(r), 0)
//! });
//! let mut sink = Collector::stats_only();
//! let last = replay(&mut inst, inputs, &SimOptions::default(), &mut sink);
//! let header = blis_traces::TraceHeader::new(blis_traces::Mode::Replayed);
//! let (summary, _) = sink.finish(&header, &last, "blackbox")?;
//! assert_eq!(summary.requests.completed, 10);
//! // Requests do not overlap: the first token comes β0 + β1·500 = 15 ms after
//! // arrival, then 99 decode steps of β0 + β2 = 5.3 ms each.
//! assert!((summary.ttft_ms.p50 - 15.0).abs() < 0.01);
//! assert!((summary.e2e_ms.p50 - (15.0 + 99.0 * 5.3)).abs() < 0.01);
//! # Ok::<(), blis_replay::ReplayError>(())
//! ```
#![warn(missing_docs)]

pub mod api;
pub mod cluster;
pub mod commands;
pub mod engine;
pub mod error;
pub mod latency;
pub mod output;
pub mod server_defaults;
pub mod setup;
pub mod sim;

pub use commands::{Command, Opts, RunArgs};
pub use engine::{EngineConfig, Instance, SchedulerPolicy, SimRequest};
pub use error::{ReplayError, Result};
pub use latency::{Blackbox, LatencyModel, Model};
pub use sim::{replay, replay_cluster};

/// Process exit codes (the table every BLIS binary shares).
pub use blis_traces::exit_code;

/// Runs the `blis-replay` command in `opts`, printing its summary to
/// `out`; returns the process exit code.
///
/// # Errors
/// Bad input or settings, with the file, line or flag to fix.
pub fn run(opts: Opts, out: &mut dyn std::io::Write) -> commands::Result<i32> {
    commands::execute(opts, out).map(|()| exit_code::OK)
}
