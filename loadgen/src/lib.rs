//! # blis-loadgen
//!
//! The *observe* tool of BLIS. `blis-loadgen run` sends a workload (a spec,
//! an imported trace, a trace's requests, or a synthetic rate) to an
//! OpenAI-compatible server (vLLM, SGLang, llama.cpp, `blis-mockserver`) on
//! its exact schedule, records every request and streamed chunk, scrapes
//! the server's Prometheus `/metrics`, writes a trace-v2 bundle (`mode:
//! real`) and prints a summary that says whether the client kept up.
//! `blis-loadgen generate` writes the planned trace (`mode: generated`)
//! without sending anything.
//!
//! ```no_run
//! use clap::Parser;
//! let opts = blis_loadgen::Opts::parse_from([
//!     "blis-loadgen", "generate", "--workload-spec", "w.yaml", "--out", "out/plan",
//! ]);
//! let code = blis_loadgen::run(opts, &mut std::io::stdout())?;
//! # Ok::<(), blis_loadgen::CommandError>(())
//! ```
#![warn(missing_docs)]

pub mod check;
pub mod cli;
pub mod clock;
pub mod export;
pub mod guard;
pub mod http;
pub mod merge;
pub mod options;
pub mod plan;
pub mod probe;
pub mod prompt;
pub mod record;
pub mod report;
pub mod response;
pub mod run;
pub mod samples;
pub mod scrape;
pub mod sse;
pub mod timer;

pub use cli::{Command, GenerateArgs, Opts, RunArgs, WorkloadArgs};

use std::io::Write;

/// Process exit codes (the table every BLIS binary shares).
pub use blis_traces::exit_code;

/// Why a command failed, and its result: the one error of every BLIS
/// binary ([`blis_traces::command`]).
pub use blis_traces::command::{CommandError, Result};

blis_traces::command_errors!(probe::ProbeError, plan::PlanError);

/// Runs the command in `opts`, writing its human-readable output to `out`,
/// and returns the process exit code ([`exit_code`]).
///
/// # Errors
/// Any failure, with a chain of context naming the file or field.
pub fn run(opts: Opts, out: &mut dyn Write) -> Result<i32> {
    match opts.command {
        Command::Generate(args) => {
            plan::generate_command(&(*args).into(), out).map(|()| exit_code::OK)
        }
        Command::Run(args) => run::run_command(&(*args).into(), out),
        Command::Check(args) => check::check_command(&args.trace, args.json, out),
        Command::Merge(args) => merge::merge_command(&args.parts, &args.out, out),
        Command::Export(args) => {
            let said = export::export(&args.trace, args.format.into(), &args.out)?;
            writeln!(out, "{said}")?;
            Ok(exit_code::OK)
        }
    }
}
