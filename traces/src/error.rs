//! The one error type of the crate: every failure names the file and, where it
//! has one, the line and column of the bad input.

use std::fmt;
use std::path::{Path, PathBuf};

/// Where in an input a problem was found: a file, optionally a 1-based line
/// and column (for CSV files the column is the 1-based field number).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    /// The file (or a pseudo-name such as `<spec>` for in-memory input).
    pub path: PathBuf,
    /// 1-based line, when known.
    pub line: Option<u64>,
    /// 1-based column (YAML) or field number (CSV), when known.
    pub column: Option<u64>,
}

impl Location {
    /// A whole-file location.
    pub fn file(path: impl AsRef<Path>) -> Self {
        Self {
            path: path.as_ref().to_path_buf(),
            line: None,
            column: None,
        }
    }

    /// A location at `line` (1-based) of `path`.
    pub fn line(path: impl AsRef<Path>, line: u64) -> Self {
        Self {
            path: path.as_ref().to_path_buf(),
            line: Some(line),
            column: None,
        }
    }

    /// A location at `line`:`column` (both 1-based) of `path`.
    pub fn at(path: impl AsRef<Path>, line: u64, column: u64) -> Self {
        Self {
            path: path.as_ref().to_path_buf(),
            line: Some(line),
            column: Some(column),
        }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.path.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
            if let Some(col) = self.column {
                write!(f, ":{col}")?;
            }
        }
        Ok(())
    }
}

/// Errors of reading, writing, validating, importing and generating workloads
/// and traces.
///
/// Every variant renders as one line that starts with the location, e.g.
/// `run.csv:12:10: input_tokens: invalid integer "12x"`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file could not be opened, read, created or written.
    #[error("{}: {error}", path.display())]
    Io {
        /// The file concerned.
        path: PathBuf,
        /// The operating-system error (in the message, not chained as a
        /// source, so that an error chain prints it once).
        error: std::io::Error,
    },
    /// The input is malformed or violates a rule of its format; `message`
    /// names the field.
    #[error("{location}: {message}")]
    Invalid {
        /// Where the problem is.
        location: Location,
        /// What is wrong, starting with the field name where there is one.
        message: String,
    },
}

impl Error {
    /// An I/O error on `path`.
    pub fn io(path: impl AsRef<Path>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.as_ref().to_path_buf(),
            error: source,
        }
    }

    /// A malformed-input error at `location`.
    pub fn invalid(location: Location, message: impl Into<String>) -> Self {
        Error::Invalid {
            location,
            message: message.into(),
        }
    }

    /// A malformed-input error about a whole file.
    pub fn in_file(path: impl AsRef<Path>, message: impl Into<String>) -> Self {
        Self::invalid(Location::file(path), message)
    }
}

/// Result with the crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Converts a serde-saphyr error into one line naming the file, line, column
/// and (when the offending line has a `key:`) the field; `text` is the YAML
/// that was parsed.
pub fn yaml_error(path: &Path, text: &str, err: &serde_saphyr::Error) -> Error {
    let rendered = err.without_snippet().to_string();
    // serde-saphyr renders "error: line L column C: message"; keep the message.
    let mut message = rendered.lines().next().unwrap_or("").trim().to_string();
    if let Some(rest) = message.strip_prefix("error: ") {
        message = rest.to_string();
    }
    if let Some(idx) = message.find(": ")
        && message.starts_with("line ")
    {
        message = message[idx + 2..].to_string();
    }
    if let Some(idx) = message.rfind(" at line ") {
        message.truncate(idx);
    }
    // serde-saphyr's hint names one of its own options; a user needs only
    // the fact (the key is named below).
    if let Some(idx) = message.find(", set DuplicateKeyPolicy") {
        message.truncate(idx);
    }
    if message.starts_with("duplicate mapping key") {
        message = "this key appears twice in its mapping".to_string();
    }
    match err.location() {
        Some(loc) if loc.line() > 0 => {
            let line = loc.line();
            let key = key_at(text, line as usize, loc.column() as usize)
                .or_else(|| key_on_line(text, line as usize));
            let message = match key {
                Some(k) if !message.contains(&format!("`{k}`")) => format!("{k}: {message}"),
                _ => message,
            };
            Error::invalid(Location::at(path, line, loc.column()), message)
        }
        _ => Error::in_file(path, message),
    }
}

/// A JSON error's message without serde_json's "at line L column C" (the
/// caller names the position itself, e.g. the line of a JSON Lines file,
/// where serde_json's own line is always 1).
pub fn json_message(err: &serde_json::Error) -> String {
    let mut message = err.to_string();
    if let Some(idx) = message.rfind(" at line ") {
        message.truncate(idx);
    }
    message
}

/// In a flow mapping (`{a: 1, b: .nan}`), the key whose value is at or
/// after 1-based `column` of `line`: the last `key:` written before it.
fn key_at(text: &str, line: usize, column: usize) -> Option<String> {
    let l = text.lines().nth(line.checked_sub(1)?)?;
    if !l.contains('{') {
        return None;
    }
    let upto: String = l.chars().take(column.saturating_sub(1)).collect();
    let mut best = None;
    for (i, _) in upto.match_indices(':') {
        let k = upto[..i]
            .rsplit(|c: char| c == '{' || c == ',' || c.is_whitespace())
            .next()
            .unwrap_or("")
            .trim_matches('"')
            .trim_matches('\'');
        if !k.is_empty() && !k.starts_with('#') {
            best = Some(k.to_string());
        }
    }
    best
}

/// The mapping key written on 1-based `line` of a block-style YAML text, if any.
pub(crate) fn key_on_line(text: &str, line: usize) -> Option<String> {
    let l = text.lines().nth(line.checked_sub(1)?)?;
    let l = l.trim_start().trim_start_matches("- ").trim_start();
    let (key, _) = l.split_once(':')?;
    let key = key.trim().trim_matches('"').trim_matches('\'');
    if key.is_empty() || key.contains(' ') || key.starts_with('#') || key.starts_with('{') {
        None
    } else {
        Some(key.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn location_renders_compactly() {
        assert_eq!(Location::file("a.csv").to_string(), "a.csv");
        assert_eq!(Location::line("a.csv", 3).to_string(), "a.csv:3");
        assert_eq!(Location::at("a.csv", 3, 7).to_string(), "a.csv:3:7");
    }

    #[test]
    fn key_on_line_finds_block_keys() {
        let text = "a: 1\nclients:\n  - id: x\n    rate_fraction: .nan\n";
        assert_eq!(key_on_line(text, 1).as_deref(), Some("a"));
        assert_eq!(key_on_line(text, 3).as_deref(), Some("id"));
        assert_eq!(key_on_line(text, 4).as_deref(), Some("rate_fraction"));
        assert_eq!(key_on_line(text, 9), None);
        let flow = "admission: {policy: token-bucket, capacity: .nan, refill_rate: 1}\n";
        assert_eq!(key_at(flow, 1, 45).as_deref(), Some("capacity"));
        assert_eq!(key_at(flow, 1, 13).as_deref(), Some("admission"));
        assert_eq!(key_at(text, 4, 20), None);
    }
}
