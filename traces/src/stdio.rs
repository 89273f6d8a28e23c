//! Output of the command-line tools that survives a closed pipe.
//!
//! `blis-replay run ... | head -4` closes the tools' stdout (and, with
//! `2>&1`, their stderr) while they still write. Rust ignores SIGPIPE, so
//! each later write fails with `BrokenPipe`, and `println!`/`eprintln!`
//! panic on it. A closed pipe is a normal end for a command-line tool: what
//! it was doing (a trace being written, a run in flight) finishes, and the
//! lines nobody reads are dropped. So the tools write their results through
//! [`PipeSafe`] and their diagnostics with [`diag!`](crate::diag).

use std::io::{self, Write};

/// A writer that, once its reader has gone (`BrokenPipe`), accepts and
/// drops everything written to it. Every other error is returned.
#[derive(Debug)]
pub struct PipeSafe<W> {
    inner: W,
    closed: bool,
}

impl<W: Write> PipeSafe<W> {
    /// Wraps `inner`.
    pub fn new(inner: W) -> Self {
        Self {
            inner,
            closed: false,
        }
    }

    /// Whether the reader went away.
    pub fn closed(&self) -> bool {
        self.closed
    }
}

impl<W: Write> Write for PipeSafe<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.closed {
            return Ok(buf.len());
        }
        match self.inner.write(buf) {
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {
                self.closed = true;
                Ok(buf.len())
            }
            r => r,
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.closed {
            return Ok(());
        }
        match self.inner.flush() {
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {
                self.closed = true;
                Ok(())
            }
            r => r,
        }
    }
}

/// Writes one line to stderr, dropping it when stderr cannot be written
/// (a closed pipe); the line of [`diag!`](crate::diag). The line is
/// formatted first and written at once (stderr is unbuffered): runs
/// sharing a terminal or a log file do not split each other's lines.
pub fn stderr_line(args: std::fmt::Arguments<'_>) {
    let mut line = args.to_string();
    line.push('\n');
    let _ = io::stderr().lock().write_all(line.as_bytes());
}

/// `eprintln!` that never panics: a diagnostic line to stderr, dropped
/// when stderr is a closed pipe.
#[macro_export]
macro_rules! diag {
    ($($arg:tt)*) => {
        $crate::stdio::stderr_line(format_args!($($arg)*))
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Closed;

    impl Write for Closed {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::ErrorKind::BrokenPipe.into())
        }
        fn flush(&mut self) -> io::Result<()> {
            Err(io::ErrorKind::BrokenPipe.into())
        }
    }

    struct Full;

    impl Write for Full {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::Error::other("disk full"))
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_closed_pipe_is_a_normal_end_and_other_errors_are_not() {
        let mut w = PipeSafe::new(Closed);
        assert!(writeln!(w, "a line nobody reads").is_ok());
        assert!(w.flush().is_ok());
        assert!(w.closed());
        let mut w = PipeSafe::new(Full);
        assert!(writeln!(w, "x").is_err());
        assert!(!w.closed());
        let mut w = PipeSafe::new(Vec::new());
        write!(w, "kept").unwrap();
        assert_eq!(w.inner, b"kept");
    }
}
