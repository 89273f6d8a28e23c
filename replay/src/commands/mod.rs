//! The `blis-replay` commands: [`cli`] (clap flags, shared with
//! `blis-calibrate` and `blis-mockserver`), [`run`], [`evaluate`] and [`expand_itl`]. Only
//! this layer knows the command line; it calls the library through
//! [`crate::api`] and [`crate::setup`].

pub mod cli;
pub mod evaluate;
pub mod expand_itl;
pub mod run;

pub use cli::{Command, Opts, RunArgs};

/// Runs the command in `opts`, printing its summary to `out`.
///
/// # Errors
/// Bad input or settings, with the file, line or flag to fix.
pub fn execute(opts: Opts, out: &mut dyn std::io::Write) -> anyhow::Result<()> {
    match opts.command {
        Command::Run(args) => run::run_replay(&args, out),
        Command::Evaluate(args) => evaluate::evaluate(&args, out),
        Command::ExpandItl(args) => expand_itl::expand_itl(&args, out),
    }
}
