//! The exit codes of every BLIS binary, one table (as nextest keeps one
//! `NextestExitCode`), and how a binary ends on a command's result.
//!
//! | code | meaning |
//! |---|---|
//! | 0 | done |
//! | 1 | an error: bad input or settings, I/O, an unreachable server, a step that failed (named) |
//! | 2 | bad usage (clap's own code) |
//! | 3 | `blis-loadgen run --strict`: the client could not keep to the schedule |
//! | 4 | interrupted by SIGINT/SIGTERM while observing (every completed request kept) |
//! | 5 | `blis-loadgen run` failed: more requests failed than `--max-error-rate` allows |
//! | 6 | `blis-loadgen check`: the trace is incomplete |

/// Success.
pub const OK: i32 = 0;
/// A runtime error (bad input or settings, I/O, an unreachable server).
pub const ERROR: i32 = 1;
/// Bad command-line usage (clap's own code).
pub const USAGE: i32 = 2;
/// `run --strict` and the client could not keep to the schedule.
pub const CLIENT_BOUND: i32 = 3;
/// Interrupted by SIGINT/SIGTERM (the trace so far is complete).
pub const INTERRUPTED: i32 = 4;
/// `run` failed: more of its requests failed than `--max-error-rate`
/// allows, or all of them did (the trace is complete).
pub const FAILED: i32 = 5;
/// `check`: the trace is incomplete (its run was cut off, or planned
/// requests have no row).
pub const INCOMPLETE: i32 = 6;

/// An error and its causes on one line, `: `-separated (what a user reads
/// after `error: `).
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cause = c.source();
    }
    s
}

/// Ends a binary on its command's result: `Ok(code)` exits with `code`;
/// `Err(e)` prints `error: ` and [`chain`] on one line to stderr and
/// exits with `code_of(&e)`.
pub fn finish<E: std::error::Error + 'static>(
    result: Result<i32, E>,
    code_of: impl FnOnce(&E) -> i32,
) -> ! {
    let code = match result {
        Ok(code) => code,
        Err(e) => {
            crate::diag!("error: {}", chain(&e));
            code_of(&e)
        }
    };
    std::process::exit(code)
}

/// The longest line of a usage error printed, characters: the argument
/// parser quotes a refused value whole, and a value of 100,000 characters
/// (a file's content pasted, a runaway script) made a 100,000-character
/// line.
pub const MAX_USAGE_LINE: usize = 300;

/// A usage error's text as printed: each line cut at [`MAX_USAGE_LINE`]
/// characters, with how many were left out.
pub fn usage_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len().min(4096));
    for line in text.split_inclusive('\n') {
        let (body, end) = match line.strip_suffix('\n') {
            Some(b) => (b, "\n"),
            None => (line, ""),
        };
        let n = body.chars().count();
        if n > MAX_USAGE_LINE {
            out.extend(body.chars().take(MAX_USAGE_LINE));
            out.push_str(&format!("… ({} more characters)", n - MAX_USAGE_LINE));
        } else {
            out.push_str(body);
        }
        out.push_str(end);
    }
    out
}

/// Ends a binary on a usage error of its argument parser (`text`, as the
/// parser renders it), printed to stderr by [`usage_text`] (dropped when
/// stderr is a closed pipe, as [`crate::diag!`]), with `code`.
pub fn usage_error(text: &str, code: i32) -> ! {
    crate::diag!("{}", usage_text(text).trim_end_matches('\n'));
    std::process::exit(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A refused value of 100,000 characters is not printed whole; short
    /// lines are kept as they are.
    #[test]
    fn a_usage_error_quoting_a_huge_value_stays_short() {
        let huge = "9".repeat(100_000);
        let text = format!(
            "error: invalid value '{huge}' for '--num-requests <N>'\n\nFor more information, try '--help'.\n"
        );
        let out = usage_text(&text);
        let first = out.lines().next().unwrap();
        assert!(first.len() < 400, "{}", first.len());
        assert!(first.ends_with("more characters)"), "{first}");
        assert!(
            out.ends_with("\n\nFor more information, try '--help'.\n"),
            "{out}"
        );
        assert_eq!(usage_text("error: x\n"), "error: x\n");
    }

    #[derive(Debug, thiserror::Error)]
    #[error("reading x.yaml")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn a_chain_is_one_line_of_causes() {
        let e = Outer(std::io::Error::other("no such file"));
        assert_eq!(chain(&e), "reading x.yaml: no such file");
    }
}
