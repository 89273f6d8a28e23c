//! The `blis-replay` commands: [`cli`] (clap flags, shared with
//! `blis-calibrate` and `blis-mockserver`), [`run`], [`evaluate`], [`compare`] and [`expand_itl`]. Only
//! this layer knows the command line; it calls the library through
//! [`crate::api`] and [`crate::setup`].

pub mod cli;
pub mod compare;
pub mod evaluate;
pub mod expand_itl;
pub mod run;

pub use cli::{Command, Opts, RunArgs};

use blis_traces::step::StepError;

use crate::error::ReplayError;

/// Why a `blis-replay` command failed: a one-line message naming the flag,
/// file or step to fix; the causes follow in the error chain (the binary
/// prints them after it, `: `-separated).
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// A flag, or a combination of flags, that cannot be used.
    #[error("{0}")]
    Usage(String),
    /// A step that failed (`creating out/sim.csv`), with its cause.
    #[error(transparent)]
    Step(#[from] StepError),
    /// The replay library refused an input or a setting.
    #[error(transparent)]
    Replay(#[from] ReplayError),
    /// A trace or one of its companions could not be read or written.
    #[error(transparent)]
    Trace(#[from] blis_traces::Error),
    /// A JSON output could not be written.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// The output stream or a file failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Result of a command.
pub type Result<T, E = CommandError> = std::result::Result<T, E>;

/// Runs the command in `opts`, printing its summary to `out`.
///
/// # Errors
/// Bad input or settings, with the file, line or flag to fix.
pub fn execute(opts: Opts, out: &mut dyn std::io::Write) -> Result<()> {
    match opts.command {
        Command::Run(args) => run::run_replay(&args, out),
        Command::Evaluate(args) => evaluate::evaluate(&args, out),
        Command::Compare(args) => compare::compare(&args, out),
        Command::ExpandItl(args) => expand_itl::expand_itl(&args, out),
    }
}
