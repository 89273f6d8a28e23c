//! The one error every BLIS command ends with, shared by all binaries (as
//! nextest keeps one error and exit-code table for its commands): a
//! one-line message naming the flag, file, server or step, the causes in
//! its error chain, and the process exit code it ends with
//! ([`crate::exit_code`]).

use crate::exit_code;
use crate::step::StepError;

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// A flag, or a combination of flags, that cannot be used.
    #[error("{0}")]
    Usage(String),
    /// A step that failed (`creating the trace at out/real`), with its cause.
    #[error(transparent)]
    Step(#[from] StepError),
    /// A trace or one of its companions could not be read or written.
    #[error(transparent)]
    Trace(#[from] crate::Error),
    /// A JSON output could not be written or read.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// The output stream or a file failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// A library of the workspace refused an input or a setting (the
    /// simulator, a fit, the server probe), with its own message.
    #[error(transparent)]
    Library(Box<dyn std::error::Error + Send + Sync + 'static>),
    /// The command ended early with its own exit code (interrupted, a run
    /// that failed) and says what was kept.
    #[error("{message}")]
    Ended {
        /// The exit code ([`exit_code::INTERRUPTED`], [`exit_code::FAILED`]).
        code: i32,
        /// What happened and what was kept.
        message: String,
    },
    /// A bug: the command's own tasks did not end as they must.
    #[error("internal error: {0}")]
    Internal(String),
}

impl CommandError {
    /// A library's error, kept whole (its message and causes).
    pub fn library(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        CommandError::Library(Box::new(e))
    }

    /// The exit code the binary ends with: the early end's own, else
    /// [`exit_code::ERROR`].
    pub fn exit_code(&self) -> i32 {
        match self {
            CommandError::Ended { code, .. } => *code,
            _ => exit_code::ERROR,
        }
    }
}

/// A command's result.
pub type Result<T, E = CommandError> = std::result::Result<T, E>;

/// `impl From<$error> for CommandError` (as [`CommandError::library`]) for
/// each of a crate's library errors, so that `?` carries them.
#[macro_export]
macro_rules! command_errors {
    ($($error:ty),* $(,)?) => {$(
        impl From<$error> for $crate::command::CommandError {
            fn from(e: $error) -> Self {
                $crate::command::CommandError::library(e)
            }
        }
    )*};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_early_end_keeps_its_code_and_everything_else_is_an_error() {
        let e = CommandError::Ended {
            code: exit_code::INTERRUPTED,
            message: "interrupted".into(),
        };
        assert_eq!(e.exit_code(), exit_code::INTERRUPTED);
        let e = CommandError::library(std::io::Error::other("refused"));
        assert_eq!(e.exit_code(), exit_code::ERROR);
        assert_eq!(exit_code::chain(&e), "refused");
    }
}
