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

use crate::error::ReplayError;

/// Why a command failed, and its result: the one error of every BLIS
/// binary ([`blis_traces::command`]).
pub use blis_traces::command::{CommandError, Result};

blis_traces::command_errors!(ReplayError);

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
