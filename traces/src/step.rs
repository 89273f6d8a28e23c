//! The failed step of a command, for the command layers of the tools
//! (`blis-replay`, `blis-loadgen`, `blis-calibrate`, `blis-loop`): what was
//! being done (`creating out/sim.csv`) with the error that stopped it as its
//! source, so that a binary prints `error: creating out/sim.csv: <cause>`
//! by walking the chain (as `anyhow`'s context would), while the libraries
//! keep typed errors.

/// A cause of any error type.
pub type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A step that failed: its description is the message, the error that
/// stopped it the source.
#[derive(Debug, thiserror::Error)]
#[error("{what}")]
pub struct StepError {
    /// What was being done, e.g. `reading the trace out/real.yaml`.
    pub what: String,
    /// Why it failed.
    #[source]
    pub source: Cause,
}

impl StepError {
    /// The step `what`, stopped by `source`.
    pub fn new(what: impl Into<String>, source: impl Into<Cause>) -> Self {
        Self {
            what: what.into(),
            source: source.into(),
        }
    }
}

/// Names the step of a fallible result (`.step(|| format!("writing {path}"))`).
pub trait StepContext<T> {
    /// The error, if any, as the failure of the step `what` returns.
    ///
    /// # Errors
    /// The result's error, wrapped in a [`StepError`].
    fn step<S: Into<String>>(self, what: impl FnOnce() -> S) -> Result<T, StepError>;
}

impl<T, E> StepContext<T> for Result<T, E>
where
    E: std::error::Error + Send + Sync + 'static,
{
    fn step<S: Into<String>>(self, what: impl FnOnce() -> S) -> Result<T, StepError> {
        self.map_err(|e| StepError::new(what(), e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_prints_its_description_then_its_causes() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        let e = Err::<(), _>(io).step(|| "reading x.yaml").unwrap_err();
        assert_eq!(e.to_string(), "reading x.yaml");
        assert_eq!(
            std::error::Error::source(&e).unwrap().to_string(),
            "no such file"
        );
    }
}
