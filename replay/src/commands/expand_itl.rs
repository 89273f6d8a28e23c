//! `blis-replay expand-itl`: the ITL companion of a replayed trace in
//! BLIS's form, one row per token, from the step form
//! ([`blis_traces::itl_steps`]).

use crate::commands::{CommandError, Result};
use blis_traces::step::StepContext;
use std::io::Write;

use blis_traces::companions::ChunkWriter;
use blis_traces::itl_steps::{expand, read_runs, read_steps};
use blis_traces::{TraceHeader, TracePaths};

use crate::commands::cli::ExpandItlArgs;

/// Reads the step form named by `--trace`'s header and writes its rows to
/// `--out`.
///
/// # Errors
/// A header without an ITL companion in step form, or an unreadable or
/// malformed companion, naming the file.
pub fn expand_itl(args: &ExpandItlArgs, out: &mut dyn Write) -> Result<()> {
    let header = TraceHeader::read(&args.trace)?;
    let Some(form) = &header.itl_steps else {
        return Err(CommandError::Usage(format!(
            "{}: its ITL companion is not in step form (no itl_steps in the header); it is already one row per token",
            args.trace.display()
        )));
    };
    let paths = TracePaths::for_header(&args.trace, Some(&header));
    let runs = read_runs(&paths.itl)?;
    let steps = read_steps(&paths.steps)?;
    let chunks = expand(&steps, &runs, &form.timing, &paths.itl)?;
    let mut w = ChunkWriter::create(&args.out, false)?;
    w.write_all(&chunks)?;
    w.finish()
        .step(|| format!("writing {}", args.out.display()))?;
    writeln!(out, "wrote {} rows to {}", chunks.len(), args.out.display())?;
    Ok(())
}
