//! What can be wrong with a cluster policy: a policy bundle's values, a
//! policy or scorer name, a list of weighted scorers.

/// An invalid policy setting, naming the field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PolicyError {
    /// A value outside its range.
    #[error("{field} must be {must}, got {got}")]
    OutOfRange {
        /// The field (`admission token-bucket: capacity`).
        field: String,
        /// The rule (`a positive number`).
        must: &'static str,
        /// The value given.
        got: String,
    },
    /// A name that is not a known policy or scorer.
    #[error("unknown {kind} {name:?} ({known})")]
    Unknown {
        /// What was named (`scorer`, `priority policy`).
        kind: &'static str,
        /// The name given.
        name: String,
        /// The known names.
        known: &'static str,
    },
    /// An item of a `NAME:WEIGHT` list that is not one.
    #[error("scorer {item:?}: {problem}")]
    Malformed {
        /// The item.
        item: String,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// A decision tree's node that is not one, named by its path.
    #[error("{path}: {problem}")]
    Tree {
        /// The node (`routing.tree.else.when.signal`).
        path: String,
        /// What is wrong.
        problem: String,
    },
    /// Weighted routing whose weights are all zero.
    #[error("routing scorers: at least one weight must be positive")]
    NoPositiveWeight,
    /// A policy config file that cannot be read.
    #[error("reading the policy config {}: {error}", path.display())]
    Unreadable {
        /// The file.
        path: std::path::PathBuf,
        /// Why (the I/O error's message).
        error: String,
    },
    /// A policy config that is not YAML of a bundle (an unknown field, a
    /// wrong type): the parser's message on one line, naming the file, line,
    /// column and field.
    #[error("{message}")]
    NotABundle {
        /// The file.
        path: std::path::PathBuf,
        /// The located message.
        message: String,
    },
    /// An invalid value in a policy config file.
    #[error("{}: {problem}", path.display())]
    InFile {
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong.
        problem: Box<PolicyError>,
    },
}
