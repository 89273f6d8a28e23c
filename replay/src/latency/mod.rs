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

/// The step time of one batch composition as its decoding requests'
/// context sum grows, prepared once for a run of decode steps
/// ([`Model::decode_steps`]).
#[derive(Debug, Clone, Copy)]
pub enum DecodeSteps {
    /// The trained-physics model's terms that do not grow.
    TrainedPhysics(physics::PhysicsSteps),
    /// The roofline's parts that do not grow.
    Roofline(roofline::RooflineSteps),
    /// Another model: each step evaluated whole.
    Whole,
}

impl Model {
    /// Prepares the step times of the (non-empty) composition `b` for any
    /// sum of its decoding requests' contexts.
    pub fn decode_steps(&self, b: &BatchShape) -> DecodeSteps {
        match self {
            Model::TrainedPhysics(m) => DecodeSteps::TrainedPhysics(m.decode_steps(b)),
            Model::Roofline(m) => DecodeSteps::Roofline(m.decode_steps(b)),
            _ => DecodeSteps::Whole,
        }
    }

    /// The step time, µs, of `b` (the composition `steps` was prepared
    /// for) when its decoding requests' contexts sum to `ctx` tokens
    /// (written into `b`): bit for bit its [`LatencyModel::step_time_us`].
    pub fn decode_step_us(&self, steps: &DecodeSteps, b: &mut BatchShape, ctx: u64) -> f64 {
        b.decode_context_sum = ctx;
        match (self, steps) {
            (Model::TrainedPhysics(m), DecodeSteps::TrainedPhysics(s)) => m.decode_step_us(s, ctx),
            (Model::Roofline(m), DecodeSteps::Roofline(s)) => m.decode_step_us(s, ctx),
            _ => self.step_time_us(b),
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

#[cfg(test)]
mod tests {
    use super::arch::Hardware;
    use super::hf_config::find_model;
    use super::physics::{HostOverheads, PhysicsBasis, TERM_NAMES};
    use super::*;
    use proptest::prelude::*;

    /// Dense at TP1, MoE at TP2: roofline and trained-physics (every
    /// coefficient positive, so that every term counts).
    fn models() -> Vec<Model> {
        let hw = Hardware::bundled("H100").unwrap();
        let mut out = Vec::new();
        for (name, tp) in [("llama-2-7b-hf", 1), ("mixtral-8x7b-v0.1", 2)] {
            let arch = find_model(Some(name), None).unwrap();
            out.push(Model::Roofline(Box::new(Roofline::new(
                arch.clone(),
                hw.clone(),
                tp,
            ))));
            let beta = TERM_NAMES
                .iter()
                .enumerate()
                .map(|(k, n)| ((*n).to_string(), 0.37 + k as f64 * 1.13))
                .collect();
            let basis = PhysicsBasis::new(&arch, &hw, tp);
            out.push(Model::TrainedPhysics(Box::new(TrainedPhysics::from_named(
                basis,
                &beta,
                HostOverheads::default(),
            ))));
        }
        out
    }

    proptest! {
        /// A decode run's step times, prepared once and evaluated as the
        /// context grows, are bit for bit the steps' own `step_time_us`;
        /// trained-physics' also the terms' weighted sum in their order.
        #[test]
        fn prepared_decode_steps_are_the_steps_own_times(
            chunks in proptest::collection::vec((0u32..5000, 1u32..2048), 0..3),
            decode_count in 1u32..300,
            ctx0 in 0u64..2_000_000,
            grow in proptest::collection::vec(0u64..5000, 1..20),
        ) {
            let mut b = BatchShape {
                prefill: chunks
                    .iter()
                    .map(|&(computed_before, new_tokens)| PrefillChunk { computed_before, new_tokens })
                    .collect(),
                decode_count,
                decode_context_sum: ctx0,
            };
            for m in models() {
                let steps = m.decode_steps(&b);
                let mut ctx = ctx0;
                for g in &grow {
                    ctx += g;
                    let prepared = m.decode_step_us(&steps, &mut b, ctx);
                    prop_assert_eq!(b.decode_context_sum, ctx);
                    let whole = m.step_time_us(&b);
                    prop_assert_eq!(prepared.to_bits(), whole.to_bits(), "{}", m.name());
                    if let Model::TrainedPhysics(p) = &m {
                        let mut x = [0.0; physics::TERMS];
                        p.basis.terms(&b, &mut x);
                        let sum: f64 = x.iter().zip(&p.beta).map(|(x, b)| x * b).sum();
                        prop_assert_eq!(prepared.to_bits(), sum.max(1.0).to_bits());
                    }
                }
            }
        }
    }
}
