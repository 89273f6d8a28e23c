//! The engine: one vLLM-style instance. [`instance`] holds its requests and
//! steps it through time; [`batch`] forms each step's batch (running
//! requests first, chunked prefill within the token budget, preemption by
//! recompute when KV blocks run out); [`queue_order`] orders the wait queue
//! (`--scheduler`); [`kv_cache`] is the paged KV cache with prefix caching
//! (chained block hashes, LRU eviction of free blocks, reference counts);
//! [`kv_tier`] is its optional CPU tier (offload, reload, transfer time);
//! [`handoff`] is an instance's side of prefill/decode disaggregation;
//! `cohort` is the state of the steady decoders of the running batch,
//! kept implicit, and `steady` how an instance steps them.

pub mod batch;
mod cohort;
pub mod handoff;
pub(crate) mod hash_index;
pub mod instance;
pub mod kv_cache;
pub mod kv_tier;
pub mod queue_order;
mod steady;

pub use instance::{EngineConfig, Instance, SimRequest};
pub use queue_order::SchedulerPolicy;
