//! Integration tests of `blis-loadgen`: `generate` as a user runs it, and
//! `run` against `blis-mockserver` served in-process on port 0.

mod common; // an in-process mock, running loadgen, reading its output
mod errors; // unreachable server, wrong model, API keys never leak
mod export; // `export --format aiperf`: AIPerf's per-request records, field by field
mod faults; // injected faults: every request present with the right status
mod generate_cli; // `generate`: files, summary, exit codes
mod modes; // closed loop, max in flight, duration, warm-up, goodput
mod observe; // a spec observed exactly: rows, chunks, timing vs the mock, metrics
mod shard; // `--shard I/N` processes merged: the one-process plan exactly
