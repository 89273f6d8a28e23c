//! Integration tests of `blis-mockserver`, served in-process on port 0.

#[allow(
    dead_code,
    reason = "shared with the timing test binary, which uses other parts"
)]
mod common; // starting servers, small clients
mod conformance; // OpenAI/vLLM shapes, usage, errors, auth, /metrics
mod faults; // injected faults at configured rates, server stays up
mod overload; // a bounded queue, 503s past it, health and metrics answered, 413
