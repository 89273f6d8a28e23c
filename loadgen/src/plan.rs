//! Planning a workload: from a spec or an import to requests, and the
//! `generate` subcommand.

use std::io::Write;

use anyhow::{Context, bail};
use blis_traces::{
    ExtraColumn, GenerateOptions, Generator, Mode, TraceHeader, TraceRecord, TraceWriter,
    WorkloadSpec, WorkloadSummary,
};

use crate::cli::{GenerateArgs, WorkloadArgs};

/// Default seed when neither the spec nor the command line gives one.
pub const DEFAULT_SEED: u64 = 42;

/// Loads the workload of `w` as planned trace records and a header
/// describing where they came from.
///
/// # Errors
/// Unreadable or invalid spec or import.
pub fn load_workload(
    w: &WorkloadArgs,
    opts: &GenerateOptions,
) -> anyhow::Result<(TraceHeader, Vec<TraceRecord>)> {
    if let Some(path) = &w.workload_spec {
        let spec = WorkloadSpec::from_file(path)?;
        let seed = opts.seed.unwrap_or_else(|| spec.seed_or_default());
        let records = Generator::new(&spec, opts)?
            .map(|r| r.map(TraceRecord::planned))
            .collect::<Result<Vec<_>, _>>()?;
        let mut header = TraceHeader::new(Mode::Generated);
        header.workload_seed = Some(seed);
        header.workload_spec = Some(path.display().to_string());
        return Ok((header, records));
    }
    if let Some(src) = &w.import {
        let seed = opts.seed.unwrap_or(DEFAULT_SEED);
        let mut trace =
            blis_traces::import(src, seed).with_context(|| format!("importing {src}"))?;
        if let Some(h) = opts.horizon_us {
            trace
                .records
                .retain(|r| r.request.arrival_time_us < h as i64);
        }
        if let Some(n) = opts.num_requests {
            trace.records.truncate(n as usize);
        }
        return Ok((trace.header, trace.records));
    }
    bail!("give --workload-spec or --import")
}

/// `blis-loadgen generate`: writes the planned trace and prints a summary.
///
/// # Errors
/// Bad input or unwritable output.
pub fn generate_command(args: &GenerateArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let opts = GenerateOptions {
        seed: args.seed,
        horizon_us: args.horizon_s.map(|s| (s * 1e6).round() as u64),
        num_requests: args.num_requests,
    };
    if let Some(h) = args.horizon_s
        && !(h > 0.0 && h.is_finite())
    {
        bail!("--horizon-s must be a positive number of seconds, got {h}");
    }
    let (mut header, mut records) = load_workload(&args.workload, &opts)?;
    // A generated trace is a plan: keep the requests, drop any outcome.
    if header.mode == Mode::Real {
        header.mode = Mode::Generated;
        for r in &mut records {
            r.outcome = Default::default();
        }
    }
    let summary = WorkloadSummary::of(records.iter().map(|r| &r.request));
    let extras = ExtraColumn::needed_for(&records);
    let mut w = TraceWriter::create(&args.out, &header, &extras, None, false)
        .with_context(|| format!("creating the trace at {}", args.out.display()))?;
    for r in &records {
        w.write_record(r)?;
    }
    let paths = w.finish(&header)?;
    write!(out, "{}", summary.to_markdown())?;
    writeln!(
        out,
        "\nwrote {} and {}",
        paths.header.display(),
        paths.data.display()
    )?;
    Ok(())
}
