//! What a replay writes: [`collector`] turns the simulator's events into the
//! predicted trace (`PREFIX.yaml`/`.csv`, the ITL and metrics companions)
//! and the [`summary`]; [`fitness`] scores a summary for policy search.

pub mod collector;
pub mod fitness;
pub mod gap_counts;
pub mod summary;

pub use collector::{Collector, RequestOutcome};
pub use summary::{Dist, Summary};
