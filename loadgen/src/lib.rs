//! # blis-loadgen
//!
//! The *observe* tool of BLIS. Today it plans workloads: `blis-loadgen
//! generate` turns a workload spec or an imported trace into a trace-v2
//! bundle (`mode: generated`) and prints a one-screen summary. Sending the
//! workload to a server comes with the `run` subcommand.
//!
//! ```no_run
//! use clap::Parser;
//! let opts = blis_loadgen::Opts::parse_from([
//!     "blis-loadgen", "generate", "--workload-spec", "w.yaml", "--out", "out/plan",
//! ]);
//! blis_loadgen::run(opts, &mut std::io::stdout())?;
//! # Ok::<(), anyhow::Error>(())
//! ```
#![warn(missing_docs)]

pub mod cli;
pub mod plan;

pub use cli::{Command, GenerateArgs, Opts, WorkloadArgs};

use std::io::Write;

/// Process exit codes of `blis-loadgen`.
pub mod exit_code {
    /// Success.
    pub const OK: i32 = 0;
    /// A runtime error (bad input file, I/O, unreachable server).
    pub const ERROR: i32 = 1;
    /// Bad command-line usage (clap's own code).
    pub const USAGE: i32 = 2;
}

/// Runs the command in `opts`, writing its human-readable output to `out`.
///
/// # Errors
/// Any failure, with a chain of context naming the file or field.
pub fn run(opts: Opts, out: &mut dyn Write) -> anyhow::Result<()> {
    match opts.command {
        Command::Generate(args) => plan::generate_command(&args, out),
    }
}
