//! Latency coefficients files: YAML rows keyed by model, GPU and tensor
//! parallelism, read by `blis-replay` and `blis-mockserver` and written by
//! `blis-calibrate fit`.
//!
//! ```yaml
//! version: 1
//! rows:
//!   - model: meta-llama/Llama-3.1-8B-Instruct
//!     gpu: H100
//!     tensor_parallel: 1
//!     latency_model: blackbox
//!     alpha: [10326.27, 0, 0]          # µs, µs/input token, µs/output token
//!     beta: [6472.008, 19.79721, 304.4021]  # µs, µs/prefill token, µs/decode token
//!     total_kv_blocks: 29205
//!     source: BLIS defaults
//! ```
//!
//! Roofline rows carry `mfu_prefill`, `mfu_decode`, `overhead_us`,
//! `allreduce_latency_us` and `alpha` instead of `beta`.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// A coefficients file that cannot be used, or a model it has no row for.
#[derive(Debug, thiserror::Error)]
pub enum CoefficientsError {
    /// The file cannot be read or written.
    #[error("{}: {error}", path.display())]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// Why (in the message, not chained, so it prints once).
        error: std::io::Error,
    },
    /// Not YAML of the expected shape.
    #[error("{name}: {message}")]
    Yaml {
        /// The file (or bundled name).
        name: String,
        /// The parser's message, without its snippet.
        message: String,
    },
    /// A coefficient is NaN or infinite.
    #[error("{name}: rows[{row}]: non-finite coefficient")]
    NonFinite {
        /// The file.
        name: String,
        /// The row's index.
        row: usize,
    },
    /// A blackbox row without its `beta`.
    #[error("{name}: rows[{row}]: a blackbox row needs `beta`")]
    NoBeta {
        /// The file.
        name: String,
        /// The row's index.
        row: usize,
    },
    /// A trained-physics term the model does not have.
    #[error("{name}: rows[{row}].terms: unknown term {term:?} (known: {})", crate::latency::physics::TERM_NAMES.join(", "))]
    UnknownTerm {
        /// The file.
        name: String,
        /// The row's index.
        row: usize,
        /// The term.
        term: String,
    },
    /// A trained-physics row fitted before prefill attention and the
    /// routed-expert GEMMs got terms of their own (its `attention_compute`
    /// and `expert_compute` mean something else now).
    #[error(
        "{name}: rows[{row}].terms: no prefill_attention term: the row was fitted with an earlier set of trained-physics terms, whose attention_compute also charged prompts and whose expert_compute was a fitted factor; fit it again (blis-calibrate fit --latency-model trained-physics)"
    )]
    EarlierTermSet {
        /// The file.
        name: String,
        /// The row's index.
        row: usize,
    },
    /// A negative trained-physics term.
    #[error(
        "{name}: rows[{row}].terms.{term}: must be ≥ 0, got {}",
        blis_traces::shown::Num(*value)
    )]
    Negative {
        /// The file.
        name: String,
        /// The row's index.
        row: usize,
        /// The term.
        term: String,
        /// Its value.
        value: f64,
    },
    /// No blackbox row for the model, GPU and TP.
    #[error(
        "no blackbox coefficients for model {model:?} on {gpu} TP{tp}; give --coefficients with such a row, or use --latency-model roofline"
    )]
    NoBlackboxRow {
        /// The model.
        model: String,
        /// The GPU.
        gpu: String,
        /// Tensor parallelism.
        tp: u32,
    },
    /// No trained-physics row for the GPU.
    #[error(
        "no trained-physics coefficients for {gpu} (a row with model \"*\" and gpu {gpu} or \"*\"): give --coefficients with one (blis-calibrate fit --runs DIR writes it)"
    )]
    NoPhysicsRow {
        /// The GPU.
        gpu: String,
    },
    /// No step-table row for the model, GPU and TP.
    #[error(
        "no step-table coefficients for model {model:?} on {gpu} TP{tp}; fit them from a trace of the server (blis-calibrate fit --latency-model step-table) and give --coefficients"
    )]
    NoStepTableRow {
        /// The model.
        model: String,
        /// The GPU (or CPU).
        gpu: String,
        /// Tensor parallelism.
        tp: u32,
    },
    /// A step-table row that cannot be used.
    #[error("coefficients row {row}: {why}")]
    BadStepTable {
        /// The row's index.
        row: usize,
        /// Why.
        why: String,
    },
    /// The file could not be serialized.
    #[error("serializing coefficients: {0}")]
    Serialize(String),
}
use crate::latency::arch::model_key;

/// The coefficients file shipped with the project.
pub const BUNDLED_COEFFICIENTS: &str = include_str!("../../coefficients.yaml");

/// A coefficients file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct CoefficientsFile {
    /// Format version (1).
    #[serde(default = "one")]
    pub version: u32,
    /// The rows.
    #[serde(default)]
    pub rows: Vec<CoefficientRow>,
}

fn one() -> u32 {
    1
}

/// Which latency model a row parameterises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum LatencyKind {
    /// α/β regression.
    #[default]
    Blackbox,
    /// Analytical roofline.
    Roofline,
    /// Physics terms with global coefficients ([`crate::latency::physics`]).
    TrainedPhysics,
    /// BLIS's trained-physics formula with its published coefficients.
    BlisPhysics,
    /// One server's measured step time per number of decoding requests
    /// ([`crate::latency::step_table`]).
    StepTable,
}

impl LatencyKind {
    /// The name used in files and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            LatencyKind::Blackbox => "blackbox",
            LatencyKind::Roofline => "roofline",
            LatencyKind::TrainedPhysics => "trained-physics",
            LatencyKind::BlisPhysics => "blis-physics",
            LatencyKind::StepTable => "step-table",
        }
    }
}

/// One model × GPU × TP row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CoefficientRow {
    /// Model id (matched case-insensitively on its last path segment).
    pub model: String,
    /// GPU name.
    pub gpu: String,
    /// Tensor-parallel degree.
    #[serde(default = "one")]
    pub tensor_parallel: u32,
    /// Latency model.
    #[serde(default)]
    pub latency_model: LatencyKind,
    /// α0 (µs), α1 (µs per input token), α2 (µs per output token).
    #[serde(default)]
    pub alpha: [f64; 3],
    /// β0 (µs), β1 (µs per uncached prefill token), β2 (µs per decode token).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub beta: Option<[f64; 3]>,
    /// Roofline: prefill MFU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mfu_prefill: Option<f64>,
    /// Roofline: decode MFU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mfu_decode: Option<f64>,
    /// Roofline: fixed per-step overhead, µs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overhead_us: Option<f64>,
    /// Roofline: per all-reduce latency, µs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allreduce_latency_us: Option<f64>,
    /// Trained-physics: the coefficient of each physics term, by name
    /// ([`crate::latency::physics::TERM_NAMES`]; missing terms are 0). Its `alpha`
    /// is then the queueing delay (µs), the queueing delay per input token
    /// (µs) and the output hop (µs per token, not accumulating).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terms: Option<std::collections::BTreeMap<String, f64>>,
    /// Trained-physics: the step structure the row was fitted with (vLLM's
    /// `--async-scheduling`: a request arriving during a step joins the
    /// step after the next). Used where neither the command line nor the
    /// trace header says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub async_scheduling: Option<bool>,
    /// GPU KV blocks of the deployment the row was measured on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_kv_blocks: Option<u64>,
    /// Where the numbers come from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

impl CoefficientsFile {
    /// Parses YAML text; `name` labels errors.
    ///
    /// # Errors
    /// Malformed YAML or non-finite numbers.
    pub fn parse(name: &str, text: &str) -> Result<Self, CoefficientsError> {
        let f: CoefficientsFile =
            serde_saphyr::from_str(text).map_err(|e| CoefficientsError::Yaml {
                name: name.to_string(),
                message: e.without_snippet().to_string(),
            })?;
        for (i, r) in f.rows.iter().enumerate() {
            let extra = [
                r.mfu_prefill,
                r.mfu_decode,
                r.overhead_us,
                r.allreduce_latency_us,
            ];
            let nums = r
                .alpha
                .iter()
                .chain(r.beta.iter().flatten())
                .chain(extra.iter().flatten())
                .chain(r.terms.iter().flat_map(|t| t.values()));
            for v in nums {
                if !v.is_finite() {
                    return Err(CoefficientsError::NonFinite {
                        name: name.to_string(),
                        row: i,
                    });
                }
            }
            if r.latency_model == LatencyKind::Blackbox && r.beta.is_none() {
                return Err(CoefficientsError::NoBeta {
                    name: name.to_string(),
                    row: i,
                });
            }
            if let Some(t) = &r.terms {
                if r.latency_model == LatencyKind::StepTable {
                    crate::latency::step_table::StepTable::from_terms(t, r.alpha).map_err(
                        |why| CoefficientsError::BadStepTable {
                            row: i,
                            why: format!("{name}: {why}"),
                        },
                    )?;
                    continue;
                }
                if r.latency_model == LatencyKind::TrainedPhysics
                    && !t.contains_key("prefill_attention")
                {
                    return Err(CoefficientsError::EarlierTermSet {
                        name: name.to_string(),
                        row: i,
                    });
                }
                for (k, v) in t {
                    if !crate::latency::physics::TERM_NAMES.contains(&k.as_str()) {
                        return Err(CoefficientsError::UnknownTerm {
                            name: name.to_string(),
                            row: i,
                            term: k.clone(),
                        });
                    }
                    if *v < 0.0 {
                        return Err(CoefficientsError::Negative {
                            name: name.to_string(),
                            row: i,
                            term: k.clone(),
                            value: *v,
                        });
                    }
                }
            }
        }
        Ok(f)
    }

    /// Reads a file.
    ///
    /// # Errors
    /// I/O or parse errors naming the file.
    pub fn read(path: &Path) -> Result<Self, CoefficientsError> {
        let text = blis_traces::text::read_text(path).map_err(|e| CoefficientsError::Io {
            path: path.to_path_buf(),
            error: e,
        })?;
        Self::parse(&path.display().to_string(), &text)
    }

    /// The bundled file (parsed once per process: a setup may be resolved
    /// several times, and the parse costs more than a small replay).
    pub fn bundled() -> Self {
        static PARSED: std::sync::OnceLock<CoefficientsFile> = std::sync::OnceLock::new();
        PARSED
            .get_or_init(|| {
                Self::parse("coefficients.yaml (bundled)", BUNDLED_COEFFICIENTS)
                    .expect("the bundled coefficients file parses")
            })
            .clone()
    }

    /// The row for `model` on `gpu` at `tp` with the given latency model.
    pub fn find(
        &self,
        model: &str,
        gpu: &str,
        tp: u32,
        kind: LatencyKind,
    ) -> Option<&CoefficientRow> {
        let key = model_key(model);
        let exact = self.rows.iter().find(|r| {
            model_key(&r.model) == key
                && r.gpu.eq_ignore_ascii_case(gpu)
                && r.tensor_parallel == tp
                && r.latency_model == kind
        });
        // Trained-physics rows are global: `model: "*"` covers every model
        // and TP on its GPU (`gpu: "*"`: on any), the physics terms carry
        // what differs.
        exact.or_else(|| {
            (kind == LatencyKind::TrainedPhysics)
                .then(|| {
                    self.rows.iter().find(|r| {
                        r.latency_model == kind
                            && r.model == "*"
                            && (r.gpu == "*" || r.gpu.eq_ignore_ascii_case(gpu))
                    })
                })
                .flatten()
        })
    }

    /// Writes the file as YAML.
    ///
    /// # Errors
    /// I/O errors naming the file.
    pub fn write(&self, path: &Path) -> Result<(), CoefficientsError> {
        let text = serde_saphyr::to_string(self)
            .map_err(|e| CoefficientsError::Serialize(e.to_string()))?;
        std::fs::write(path, text).map_err(|e| CoefficientsError::Io {
            path: path.to_path_buf(),
            error: e,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundled_file_has_the_known_llama_row() {
        let f = CoefficientsFile::bundled();
        let r = f
            .find(
                "meta-llama/Llama-3.1-8B-Instruct",
                "h100",
                1,
                LatencyKind::Blackbox,
            )
            .unwrap();
        assert_eq!(r.alpha, [10326.27, 0.0, 0.0]);
        assert_eq!(r.beta, Some([6472.008, 19.79721, 304.4021]));
        assert_eq!(r.total_kv_blocks, Some(29205));
    }

    #[test]
    fn round_trips_and_rejects_bad_rows() {
        let f = CoefficientsFile::bundled();
        let dir = std::env::temp_dir().join(format!("blis-coef-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("c.yaml");
        f.write(&p).unwrap();
        assert_eq!(CoefficientsFile::read(&p).unwrap(), f);
        let bad = "rows:\n  - model: m\n    gpu: H100\n    alpha: [1, 2, 3]\n";
        assert!(
            CoefficientsFile::parse("x", bad)
                .unwrap_err()
                .to_string()
                .contains("needs `beta`")
        );
        std::fs::remove_dir_all(&dir).ok();
    }

    /// A trained-physics row fitted with the earlier term set (one
    /// attention coefficient for decode and prompts, a fitted expert
    /// factor) is refused by name rather than read with new meanings.
    #[test]
    fn a_trained_physics_row_of_the_earlier_term_set_is_refused() {
        let row = |terms: &str| {
            format!(
                "rows:\n  - model: \"*\"\n    gpu: H100\n    latency_model: trained-physics\n    alpha: [0, 0, 0]\n    terms: {{{terms}}}\n"
            )
        };
        let e = CoefficientsFile::parse(
            "old.yaml",
            &row("layer: 65, attention_compute: 46, expert_compute: 6.5"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("old.yaml: rows[0].terms: no prefill_attention"),
            "{e}"
        );
        assert!(e.contains("fit it again"), "{e}");
        CoefficientsFile::parse("new.yaml", &row("layer: 65, prefill_attention: 2.2")).unwrap();
    }
}
