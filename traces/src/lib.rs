//! # blis-traces
//!
//! The language every BLIS tool speaks: the **trace-v2** format (compatible
//! with BLIS's files), **workload specs**, **importers** of public traces and
//! **deterministic generation** of requests, including from ServeGen
//! production data (Xiang et al., arXiv:2505.09999).
//!
//! Units: every time is an integer number of microseconds unless its name
//! says otherwise; token counts are integers; rates are per second.
//!
//! ## Data flow
//!
//! ```text
//! WorkloadSpec (YAML) ──generate──▶ Request* ──▶ TraceRecord* ──write──▶ PREFIX.yaml + PREFIX.csv
//! --import KIND:PATH ──import──▶ Trace ─────────────────────────────────▶ (+ .itl.csv, .metrics.csv)
//! PREFIX.yaml ──Trace::read──▶ Trace { header, records, chunks, metrics }
//! ```
//!
//! ## Example: generate, write and read back
//!
//! ```
//! use blis_traces::{GenerateOptions, Mode, Trace, TraceHeader, TraceRecord, WorkloadSpec, generate};
//!
//! let spec = WorkloadSpec::from_yaml_str(r#"
//! aggregate_rate: 20
//! num_requests: 50
//! seed: 1
//! clients:
//!   - id: chat
//!     streaming: true
//!     input_distribution: {type: gaussian, params: {mean: 200, std_dev: 50}}
//!     output_distribution: {type: exponential, params: {mean: 100}}
//! "#)?;
//! let requests = generate(&spec, &GenerateOptions::default())?;
//! assert_eq!(requests.len(), 50);
//!
//! let dir = std::env::temp_dir().join(format!("blis-doc-{}", std::process::id()));
//! let trace = Trace::new(
//!     TraceHeader::new(Mode::Generated),
//!     requests.into_iter().map(TraceRecord::planned).collect(),
//! );
//! let paths = trace.write(&dir.join("demo"))?;
//! let back = Trace::read(&paths.header)?;
//! assert_eq!(back.records, trace.records);
//! # std::fs::remove_dir_all(&dir).ok();
//! # Ok::<(), blis_traces::Error>(())
//! ```
#![warn(missing_docs)]

pub mod arrival;
pub mod background;
pub mod bundle;
pub mod check;
pub mod command;
pub mod companions;
pub mod content;
pub mod csvio;
pub mod dist;
pub mod error;
pub mod exit_code;
pub mod generate;
pub mod header;
pub mod import;
pub mod itl_steps;
mod locate;
pub mod prom;
pub mod record;
pub mod servegen;
pub mod shown;
pub mod slo;
pub mod spec;
pub mod stdio;
pub mod step;
pub mod summary;
pub mod text;
mod validate;

pub use bundle::{ItlForm, Trace, TracePaths, TraceWriter};
pub use companions::{ChunkRecord, MetricSample};
pub use csvio::{BASE_COLUMNS, ExtraColumn, ExtraColumnTally, RecordReader, RecordWriter};
pub use error::{Error, Location, Result};
pub use generate::{GenerateOptions, Generator, generate};
pub use header::{
    Hardware, LoadGeneratorInfo, Mode, ModelShape, NetworkInfo, ServerConfig, ShardInfo,
    TraceHeader,
};
pub use import::{ImportKind, ImportSource, import};
pub use record::{HashIds, Outcome, Request, SharedStr, Status, TraceRecord};
pub use slo::Slo;
pub use spec::WorkloadSpec;
pub use summary::{LatencyStats, WorkloadSummary, WorkloadTally, percentile, percentile_of_counts};
pub use validate::MAX_TOKENS;
