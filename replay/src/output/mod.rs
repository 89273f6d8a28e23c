//! What a replay writes: [`collector`] turns the simulator's events into the
//! predicted trace (`PREFIX.yaml`/`.csv`, the ITL and metrics companions)
//! and the [`summary`]; [`fitness`] scores a summary for policy search;
//! [`sink_thread`] runs a sink on a second core beside the simulation;
//! `roster` keeps the steady decoders a collector is told of in compact form,
//! `delay_steps` the gap increments of a per-token output delay.

pub mod collector;
mod delay_steps;
pub mod fitness;
pub mod gap_counts;
mod roster;
pub mod sink_thread;
pub mod summary;

pub use collector::{Collector, RequestOutcome};
pub use sink_thread::SinkThread;
pub use summary::{Dist, Summary};
