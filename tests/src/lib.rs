//! # blis-tests
//!
//! End-to-end tests across the BLIS binaries (`tests/*.rs`): the README's
//! commands and documents (`docs.rs`) and coefficient recovery through the
//! mock server (`fit_recovery.rs`). The main job's loop and its tests live
//! in the `blis-loop` crate (`loop/`); `golden-outputs.sh` writes every
//! deterministic output of the README's examples for byte-for-byte checks
//! of a refactor.

pub mod fuzz;
