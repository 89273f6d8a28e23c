//! End-to-end tests across the BLIS binaries.
