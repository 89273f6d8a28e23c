//! Latency models: how long a batch step takes, and the non-GPU overheads
//! around it. One trait ([`LatencyModel`], in [`shape`]), four models:
//! `blackbox` (trained α/β regression per model, [`blackbox`]), `roofline`
//! (analytical, from the model's architecture and the GPU, [`roofline`]),
//! `trained-physics` (physics terms with global coefficients, [`physics`])
//! and `blis-physics` (BLIS's formula with its published coefficients, a
//! reference). [`arch`] reads model architectures and GPUs;
//! [`coefficients`] the coefficients file.

pub mod arch;
pub mod blackbox;
pub mod coefficients;
pub mod hf_config;
pub mod physics;
pub mod roofline;
pub mod shape;
pub mod step_table;

pub use blackbox::Blackbox;
pub use shape::{BatchShape, LatencyModel, PrefillChunk, causal_pairs};

use physics::{BlisPhysics, TrainedPhysics};
use roofline::Roofline;

/// The latency models, as one value.
#[derive(Debug, Clone)]
pub enum Model {
    /// Trained α/β regression.
    Blackbox(Blackbox),
    /// Analytical roofline.
    Roofline(Box<Roofline>),
    /// Physics terms with global coefficients.
    TrainedPhysics(Box<TrainedPhysics>),
    /// BLIS's trained-physics formula with its published coefficients.
    BlisPhysics(Box<BlisPhysics>),
    /// One server's measured step-time table.
    StepTable(Box<step_table::StepTable>),
}

impl Model {
    fn inner(&self) -> &dyn LatencyModel {
        match self {
            Model::Blackbox(m) => m,
            Model::Roofline(m) => m.as_ref(),
            Model::TrainedPhysics(m) => m.as_ref(),
            Model::BlisPhysics(m) => m.as_ref(),
            Model::StepTable(m) => m.as_ref(),
        }
    }
}

impl LatencyModel for Model {
    fn step_time_us(&self, b: &BatchShape) -> f64 {
        self.inner().step_time_us(b)
    }
    fn queueing_delay_us(&self, input_tokens: u32) -> f64 {
        self.inner().queueing_delay_us(input_tokens)
    }
    fn output_token_overhead_us(&self) -> f64 {
        self.inner().output_token_overhead_us()
    }
    fn output_hop_us(&self) -> f64 {
        self.inner().output_hop_us()
    }
    fn completion_overhead_us(&self) -> f64 {
        self.inner().completion_overhead_us()
    }
    fn name(&self) -> &'static str {
        self.inner().name()
    }
}
