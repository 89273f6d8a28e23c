//! # blis-calibrate
//!
//! How far to trust the simulator. `compare` pairs the requests of two
//! traces (normally a real one from `blis-loadgen` and a prediction from
//! `blis-replay`; two real runs give the server's own noise floor) and
//! reports, per metric, both distributions, their errors with bootstrap
//! intervals, per-request agreement, distribution tests, a grade, the
//! server's time series and a saturation verdict, as JSON, Markdown and
//! HTML with plots. `fit` fits latency coefficients so the prediction gets
//! better.
//!
//! ```text
//! REAL.yaml ─┐                    ┌─▶ REPORT.json (schema v1)
//!            ├─ pairs ─ stats ────┼─▶ REPORT.md
//! SIM.yaml ──┘   bootstrap        └─▶ REPORT.html (SVG plots)
//! REAL.yaml ── fit: replay in-process, Nelder–Mead ──▶ COEFFS.yaml
//! ```
//!
//! ```
//! use blis_calibrate::stats::{ks_2samp, mape};
//! let real = [10.0, 20.0, 30.0];
//! let sim = [11.0, 19.0, 33.0];
//! assert!((mape(&real, &sim) - 25.0 / 3.0).abs() < 1e-9); // (10% + 5% + 10%) / 3
//! assert_eq!(ks_2samp(&real, &real).p, 1.0);
//! ```
#![warn(missing_docs)]

pub mod benchmark;
pub mod bootstrap;
pub mod cli;
pub mod compare;
pub mod decode_drift;
pub mod fit;
pub mod goodput;
pub mod html;
pub mod joint;
pub mod metrics;
pub mod nnls;
pub mod pairs;
pub mod run;
pub mod runs;
pub mod saturation;
pub mod stats;
pub mod step_fit;
pub mod timeseries;

pub use cli::{Command, Opts};
pub use run::{exit_code, run};
