//! Integration tests of `blis-traces`: one binary, one module per concern.

mod blis_compat; // BLIS's files read as they are; written back in BLIS's column order
mod blis_specs; // BLIS's inference_perf form and its multi-turn chat; unimplemented fields refused
mod common; // paths to the shared data
mod cut_off; // a killed writer's bundle: partial last lines dropped, check
mod errors; // malformed input: one line naming file:line and the field, no panic
mod generation; // spec semantics: clients, sessions, windows, multimodal, determinism
mod golden; // the design's example spec generates the same bytes on every run and build
mod importers; // each importer against independently computed counts and totals
mod roundtrip; // write then read gives equal values (proptest)
mod servegen; // ServeGen m-large: shares, CVs and length distributions
