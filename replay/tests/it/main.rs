//! Integration tests of `blis-replay`: one binary, one module per concern.

mod architectures; // docs/architectures.md is the table the code reads
mod autoscale; // autoscaling: scale-ups, readiness, drains, cost
mod behaviour; // known answers: timings, batching limits, caching, preemption, policies
mod bounded; // absurd but parseable inputs: refused, or served in bounded time
mod cli; // the binary: outputs, determinism, errors
mod cluster; // clusters: one instance = single path, determinism, policy behaviour, invariants
mod common; // helpers
mod fast_forward;
mod handoff; // an instance's side of prefill/decode disaggregation // runs of decode steps as one event give identical results
mod invariants; // conservation, causality, monotone clock, work conservation (proptest)
mod pd; // prefill/decode disaggregation through the cluster driver
mod sink_thread; // the outputs on a thread of their own get the same calls
mod stepping; // one stepping API: real-time owner and discrete-event run agree
mod tiered; // the tiered KV cache: offload, reload, transfer time
