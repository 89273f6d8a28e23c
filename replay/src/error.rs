//! Errors of the replay library.

/// What can go wrong configuring or running a replay.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// A model's architecture cannot be found or used.
    #[error(transparent)]
    Arch(#[from] crate::latency::arch::ArchError),
    /// A GPU description cannot be found or used.
    #[error(transparent)]
    Hardware(#[from] crate::latency::arch::HardwareError),
    /// Coefficients cannot be read, or have no row for the model.
    #[error(transparent)]
    Coefficients(#[from] crate::latency::coefficients::CoefficientsError),
    /// Server settings cannot be resolved.
    #[error(transparent)]
    Settings(#[from] crate::setup::SettingsError),
    /// A cluster policy setting is invalid.
    #[error(transparent)]
    Policy(#[from] crate::cluster::PolicyError),
    /// Reading or writing a trace or workload failed.
    #[error(transparent)]
    Trace(#[from] blis_traces::Error),
    /// A workload (trace, import, spec) could not be read.
    #[error("{what}: {error}")]
    Input {
        /// What was being read (`reading the trace out/real.yaml`).
        what: String,
        /// Why it failed (in the message, not chained, so it prints once).
        error: Box<blis_traces::Error>,
    },
    /// An output file could not be written.
    #[error("{}: {error}", path.display())]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// The error (in the message, not chained, so it prints once).
        error: std::io::Error,
    },
}

/// Result with [`ReplayError`].
pub type Result<T, E = ReplayError> = std::result::Result<T, E>;
