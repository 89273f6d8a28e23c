//! Workload specs: YAML files describing clients, their arrival processes
//! and token-length distributions (the design's §3 "version 1" files, with
//! BLIS's v2 additions).
//!
//! Parsing is strict: unknown fields, NaN or infinite numbers, negative rates
//! or lengths and rate fractions that do not sum to a positive number are
//! rejected with the file, line and field path.
//!
//! ```
//! let spec = blis_traces::WorkloadSpec::from_yaml_str(r#"
//! version: "2"
//! seed: 7
//! aggregate_rate: 10
//! num_requests: 100
//! clients:
//!   - id: chat
//!     rate_fraction: 1
//!     arrival: {process: poisson}
//!     input_distribution: {type: constant, params: {value: 128}}
//!     output_distribution: {type: exponential, params: {mean: 64}}
//! "#).unwrap();
//! assert_eq!(spec.clients.len(), 1);
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::de::{self, Deserializer, Unexpected};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Location, Result, yaml_error};
use crate::locate::locate;

/// A finite `f64`; NaN and ±Inf are rejected while parsing, at their line.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Serialize, Default)]
#[serde(transparent)]
pub struct Finite(pub f64);

impl<'de> Deserialize<'de> for Finite {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let v = f64::deserialize(d)?;
        if v.is_finite() {
            Ok(Finite(v))
        } else {
            Err(de::Error::invalid_value(
                Unexpected::Float(v),
                &"a finite number",
            ))
        }
    }
}

impl From<f64> for Finite {
    fn from(v: f64) -> Self {
        Finite(v)
    }
}

/// Workload category (ServeGen's three families).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Category {
    /// Text in, text out.
    #[default]
    Language,
    /// Text plus image/audio/video tokens in.
    Multimodal,
    /// Reasoning models (long outputs with a reasoning share).
    Reasoning,
}

/// The top level of a workload spec.
#[derive(Debug, Clone, PartialEq, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct WorkloadSpec {
    /// Spec format: `"1"` (the design's) or `"2"` (BLIS's; v1 SLO class names
    /// are upgraded: `realtime` → `critical`, `interactive` → `standard`).
    #[serde(default, deserialize_with = "string_or_number")]
    pub version: Option<String>,
    /// Seed of every random stream of the generator.
    #[serde(default)]
    pub seed: Option<u64>,
    /// Workload family.
    #[serde(default)]
    pub category: Category,
    /// Total request rate (requests/s) shared by the clients by their
    /// `rate_fraction`s.
    #[serde(default)]
    pub aggregate_rate: Option<Finite>,
    /// Generation stops at this time (µs since the start).
    #[serde(default, alias = "horizon")]
    pub horizon_us: Option<u64>,
    /// Generation stops after this many requests.
    #[serde(default)]
    pub num_requests: Option<u64>,
    /// The traffic sources.
    #[serde(default)]
    pub clients: Vec<ClientSpec>,
    /// Clients built from ServeGen production data instead of `clients`.
    #[serde(default)]
    pub servegen_data: Option<ServeGenDataSpec>,
    /// Clients built from an inference-perf profile instead of `clients`.
    #[serde(default)]
    pub inference_perf: Option<InferencePerfSpec>,
    /// Folder of the spec file: relative data paths resolve against it.
    #[serde(skip)]
    pub base_dir: PathBuf,
    /// The spec file (`<spec>` for one held in memory), named in errors.
    #[serde(skip)]
    pub source: PathBuf,
}

fn string_or_number<'de, D: Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum V {
        S(String),
        I(i64),
        F(f64),
    }
    Ok(Option::<V>::deserialize(d)?.map(|v| match v {
        V::S(s) => s,
        V::I(i) => i.to_string(),
        V::F(f) => f.to_string(),
    }))
}

/// One traffic source.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientSpec {
    /// Identifier (also the key of the client's random streams).
    #[serde(default)]
    pub id: String,
    /// Tenant, for fairness and quotas.
    #[serde(default)]
    pub tenant_id: String,
    /// SLO class: `critical`, `standard`, `sheddable`, `batch`, `background`
    /// (v1 names `realtime`, `interactive` accepted), or empty.
    #[serde(default)]
    pub slo_class: String,
    /// Model the requests target; empty for the server's default.
    #[serde(default)]
    pub model: String,
    /// Relative share of `aggregate_rate`; 0 disables the client.
    #[serde(default)]
    pub rate_fraction: Option<Finite>,
    /// Inter-arrival process (default Poisson).
    #[serde(default)]
    pub arrival: ArrivalSpec,
    /// Input (prompt) length in tokens, excluding the shared prefix.
    pub input_distribution: DistSpec,
    /// Output length in tokens.
    pub output_distribution: DistSpec,
    /// Clients with the same non-empty group share a prefix.
    #[serde(default)]
    pub prefix_group: String,
    /// Tokens of the shared prefix, prepended to every input (default 50
    /// when `prefix_group` is set, as in BLIS).
    #[serde(default)]
    pub prefix_length: Option<u32>,
    /// Whether responses are streamed.
    #[serde(default)]
    pub streaming: bool,
    /// Client-side network.
    #[serde(default)]
    pub network: Option<NetworkSpec>,
    /// Activity windows; none means active throughout.
    #[serde(default)]
    pub lifecycle: Option<LifecycleSpec>,
    /// Per-modality input lengths (category `multimodal`).
    #[serde(default)]
    pub multimodal: Option<MultimodalSpec>,
    /// Reasoning ratio and multi-turn sessions (category `reasoning`).
    #[serde(default)]
    pub reasoning: Option<ReasoningSpec>,
    /// Per-request timeout in µs; sets each request's `deadline_us`.
    #[serde(default, alias = "timeout")]
    pub timeout_us: Option<u64>,
}

/// The arrival process of a client.
#[derive(Debug, Clone, PartialEq, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ArrivalSpec {
    /// Process family.
    #[serde(default)]
    pub process: ArrivalProcess,
    /// Coefficient of variation of inter-arrival times (gamma, weibull).
    #[serde(default)]
    pub cv: Option<Finite>,
    /// Explicit shape (Gamma α or Weibull k), overriding `cv`.
    #[serde(default)]
    pub shape: Option<Finite>,
    /// Explicit scale in µs (Gamma θ or Weibull λ); used only when the
    /// client has no rate (otherwise the scale follows from the rate).
    #[serde(default)]
    pub scale: Option<Finite>,
}

/// Inter-arrival families.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ArrivalProcess {
    /// Exponential gaps (CV 1).
    #[default]
    Poisson,
    /// Fixed gaps of 1/rate.
    Constant,
    /// Gamma gaps with shape 1/CV² and scale CV²/rate (ServeGen: M-large).
    Gamma,
    /// Weibull gaps with shape k solved from CV and scale mean/Γ(1+1/k)
    /// (ServeGen: M-mid).
    Weibull,
}

/// A length (or ratio) distribution.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DistSpec {
    /// Family.
    #[serde(rename = "type")]
    pub kind: DistKind,
    /// Parameters of the family, plus optional `min`/`max` clamps.
    #[serde(default)]
    pub params: DistParams,
    /// Empirical PMF inline: `{value: probability}` (probabilities are
    /// normalised).
    #[serde(default)]
    pub pmf: Option<BTreeMap<String, Finite>>,
    /// Empirical PMF from a file: a JSON object `{value: probability}`, a
    /// JSON array whose index is the value (BLIS), or a Python dict literal
    /// (ServeGen). Relative to the spec's folder.
    #[serde(default)]
    pub file: Option<PathBuf>,
}

/// Distribution families.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DistKind {
    /// Normal(mean, std_dev), clamped to [min, max].
    Gaussian,
    /// Exponential with the given mean (ServeGen's output shape).
    Exponential,
    /// exp(Normal(mu, sigma)).
    Lognormal,
    /// With probability `mix_weight` Pareto(xm, alpha), else
    /// LogNormal(mu, sigma) (ServeGen's input shape).
    ParetoLognormal,
    /// Always `value`.
    Constant,
    /// Inverse-CDF sampling of a PMF (`pmf` or `file`).
    Empirical,
}

/// Parameters of a [`DistSpec`]; which are required depends on the family.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct DistParams {
    /// Mean (gaussian, exponential).
    #[serde(default)]
    pub mean: Option<Finite>,
    /// Standard deviation (gaussian).
    #[serde(default)]
    pub std_dev: Option<Finite>,
    /// Lower clamp.
    #[serde(default)]
    pub min: Option<Finite>,
    /// Upper clamp.
    #[serde(default)]
    pub max: Option<Finite>,
    /// Log-space mean (lognormal, pareto_lognormal).
    #[serde(default)]
    pub mu: Option<Finite>,
    /// Log-space standard deviation.
    #[serde(default)]
    pub sigma: Option<Finite>,
    /// Pareto shape.
    #[serde(default)]
    pub alpha: Option<Finite>,
    /// Pareto scale (minimum).
    #[serde(default)]
    pub xm: Option<Finite>,
    /// Probability of the Pareto component.
    #[serde(default)]
    pub mix_weight: Option<Finite>,
    /// The constant's value.
    #[serde(default)]
    pub value: Option<Finite>,
}

/// Client network characteristics.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct NetworkSpec {
    /// Round-trip time, ms.
    #[serde(default)]
    pub rtt_ms: Finite,
    /// Bandwidth, Mbit/s (absent: unlimited).
    #[serde(default)]
    pub bandwidth_mbps: Option<Finite>,
}

/// Activity windows of a client.
#[derive(Debug, Clone, PartialEq, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct LifecycleSpec {
    /// Non-overlapping `[start_us, end_us)` windows.
    pub windows: Vec<ActiveWindow>,
}

/// One activity window, µs since the start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ActiveWindow {
    /// Start (inclusive).
    pub start_us: u64,
    /// End (exclusive).
    pub end_us: u64,
}

/// Per-modality input lengths.
#[derive(Debug, Clone, PartialEq, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct MultimodalSpec {
    /// Text tokens (replaces `input_distribution` for the text part).
    #[serde(default)]
    pub text_distribution: Option<DistSpec>,
    /// Tokens per image.
    #[serde(default)]
    pub image_distribution: Option<DistSpec>,
    /// Images per request.
    #[serde(default)]
    pub image_count_distribution: Option<DistSpec>,
    /// Tokens per audio segment.
    #[serde(default)]
    pub audio_distribution: Option<DistSpec>,
    /// Audio segments per request.
    #[serde(default)]
    pub audio_count_distribution: Option<DistSpec>,
    /// Tokens per video segment.
    #[serde(default)]
    pub video_distribution: Option<DistSpec>,
    /// Video segments per request.
    #[serde(default)]
    pub video_count_distribution: Option<DistSpec>,
}

/// Reasoning-model workload settings.
#[derive(Debug, Clone, PartialEq, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ReasoningSpec {
    /// Share of output tokens that are reasoning, in [0, 1].
    #[serde(default)]
    pub reason_ratio_distribution: Option<DistSpec>,
    /// Multi-turn sessions.
    #[serde(default)]
    pub multi_turn: Option<MultiTurnSpec>,
}

/// Multi-turn sessions: each arrival starts a session of `max_rounds`
/// rounds; round N+1 is sent `think_time_us` after round N's response.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MultiTurnSpec {
    /// Rounds per session (≥ 1).
    pub max_rounds: u32,
    /// Client think time between a response and the next round, µs.
    #[serde(default)]
    pub think_time_us: u64,
    /// How inputs grow across rounds.
    #[serde(default)]
    pub context_growth: ContextGrowth,
}

/// Input growth across rounds of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ContextGrowth {
    /// Round N+1's input = round N's input + its output + a new question
    /// (inference-perf's `LocalUserSession`).
    #[default]
    Accumulate,
    /// Every round has an independent input.
    Fixed,
}

/// How ServeGen's recorded arrival parameters are used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ServeGenArrivalParams {
    /// The recorded family with its shape chosen to match the recorded CV
    /// (Gamma 1/CV², Weibull k from CV); the count follows the recorded rate.
    #[default]
    Moments,
    /// The recorded (MLE-fitted) shape, as upstream ServeGen samples it; its
    /// CV can differ from the recorded one.
    Fitted,
}

/// Clients from ServeGen production data (`chunk-*-trace.csv` and
/// `chunk-*-dataset.json`; one client per chunk).
#[derive(Debug, Clone, PartialEq, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ServeGenDataSpec {
    /// Folder holding the chunk files (relative to the spec's folder).
    pub path: PathBuf,
    /// Start of the span, seconds into the data (default 0).
    #[serde(default, alias = "span_start")]
    pub span_start_s: Option<Finite>,
    /// End of the span, seconds into the data (default: all of it).
    #[serde(default, alias = "span_end")]
    pub span_end_s: Option<Finite>,
    /// Multiplies every recorded rate.
    #[serde(default)]
    pub rate_scale: Option<Finite>,
    /// Scales rates so that the span's mean total rate is this (req/s).
    #[serde(default)]
    pub aggregate_rate: Option<Finite>,
    /// Use of the recorded arrival parameters.
    #[serde(default)]
    pub arrival_params: ServeGenArrivalParams,
    /// Only these chunk ids (e.g. `[61, 143]`); default all.
    #[serde(default)]
    pub chunks: Option<Vec<u32>>,
    /// Whether requests stream (default true).
    #[serde(default)]
    pub streaming: Option<bool>,
}

/// Keys of an inference-perf section that are not read, by value (JSON).
pub type OtherKeys = std::collections::BTreeMap<String, serde_json::Value>;

/// Clients from an inference-perf profile, in either of its two forms:
///
/// - inference-perf's own: `load: {type, stages}`, `data: {type,
///   shared_prefix}`, `api: {streaming}`;
/// - BLIS's (`inference_perf:` in a BLIS workload spec, `sim/workload/
///   inference_perf.go`): `stages` and `shared_prefix` directly under it.
///
/// Keys neither form defines, or that they define but this generator does
/// not implement (`question_distribution`, a non-null `request_timeout`, …),
/// are refused by [`WorkloadSpec::validate`], naming them.
#[derive(Debug, Clone, PartialEq, Deserialize, Default)]
pub struct InferencePerfSpec {
    /// Load shape (inference-perf's form).
    #[serde(default)]
    pub load: Option<InferencePerfLoad>,
    /// Data (prompt) shape (inference-perf's form).
    #[serde(default)]
    pub data: InferencePerfData,
    /// API settings (only `streaming` is used).
    #[serde(default)]
    pub api: Option<InferencePerfApi>,
    /// Stages (BLIS's form).
    #[serde(default)]
    pub stages: Option<Vec<InferencePerfStage>>,
    /// Shared-prefix prompts (BLIS's form).
    #[serde(default)]
    pub shared_prefix: Option<InferencePerfSharedPrefix>,
    /// Any other key (refused by validation).
    #[serde(flatten)]
    pub other: OtherKeys,
}

impl InferencePerfSpec {
    /// The stages, from either form (empty when neither gives any).
    pub fn stages(&self) -> &[InferencePerfStage] {
        match (&self.stages, &self.load) {
            (Some(s), _) => s,
            (None, Some(l)) => &l.stages,
            (None, None) => &[],
        }
    }

    /// The load type (`constant` unless inference-perf's form says
    /// `poisson`).
    pub fn load_type(&self) -> Option<&str> {
        self.load.as_ref().and_then(|l| l.load_type.as_deref())
    }

    /// The shared-prefix settings, from either form.
    pub fn shared_prefix(&self) -> Option<&InferencePerfSharedPrefix> {
        self.shared_prefix
            .as_ref()
            .or(self.data.shared_prefix.as_ref())
    }
}

/// inference-perf `load`.
#[derive(Debug, Clone, PartialEq, Deserialize, Default)]
pub struct InferencePerfLoad {
    /// `constant` (exactly rate × duration requests per stage, exponential
    /// gaps rescaled to the stage) or `poisson`.
    #[serde(default, rename = "type")]
    pub load_type: Option<String>,
    /// Stages run one after another.
    #[serde(default)]
    pub stages: Vec<InferencePerfStage>,
    /// Any other key: the client's own settings (`num_workers`,
    /// `interval`, …) are accepted, the rest refused by validation.
    #[serde(flatten)]
    pub other: OtherKeys,
}

/// One inference-perf load stage.
#[derive(Debug, Clone, PartialEq, Deserialize, Default)]
pub struct InferencePerfStage {
    /// Requests per second.
    pub rate: Finite,
    /// Seconds.
    pub duration: Finite,
    /// Any other key (`concurrency_level`, `num_requests`: refused unless
    /// null).
    #[serde(flatten)]
    pub other: OtherKeys,
}

/// inference-perf `data`.
#[derive(Debug, Clone, PartialEq, Deserialize, Default)]
pub struct InferencePerfData {
    /// `shared_prefix` (the only one modelled).
    #[serde(default, rename = "type")]
    pub data_type: Option<String>,
    /// Shared-prefix prompt shape.
    #[serde(default)]
    pub shared_prefix: Option<InferencePerfSharedPrefix>,
    /// Any other key (refused unless null).
    #[serde(flatten)]
    pub other: OtherKeys,
}

/// inference-perf `data.shared_prefix`, with its old and new key names.
#[derive(Debug, Clone, PartialEq, Deserialize, Default)]
pub struct InferencePerfSharedPrefix {
    /// Distinct prefixes.
    #[serde(default, alias = "num_unique_system_prompts")]
    pub num_groups: Option<u32>,
    /// Distinct questions per prefix.
    #[serde(default, alias = "num_users_per_system_prompt")]
    pub num_prompts_per_group: Option<u32>,
    /// Prefix tokens.
    #[serde(default)]
    pub system_prompt_len: u32,
    /// Question tokens.
    #[serde(default)]
    pub question_len: u32,
    /// `max_tokens` of each request.
    #[serde(default)]
    pub output_len: u32,
    /// Multi-turn chat, with BLIS's meaning: each (prefix, user) pair is one
    /// closed-loop session whose rounds (fixed-length inputs, no context
    /// carried over) follow each response after `groups × prompts / rate`
    /// seconds of think time, the stage's requests shared evenly among the
    /// sessions (`computeReasoningSpec` in BLIS's `inference_perf.go`).
    #[serde(default)]
    pub enable_multi_turn_chat: bool,
    /// Any other key (`question_distribution`, `output_distribution`:
    /// refused unless null).
    #[serde(flatten)]
    pub other: OtherKeys,
}

/// inference-perf `api`.
#[derive(Debug, Clone, PartialEq, Deserialize, Default)]
pub struct InferencePerfApi {
    /// Streamed responses.
    #[serde(default)]
    pub streaming: Option<bool>,
    /// Any other key (`type`, `headers`: accepted).
    #[serde(flatten)]
    pub other: OtherKeys,
}

/// SLO class names accepted (BLIS v2) and the v1 names mapped onto them.
pub const SLO_CLASSES: [&str; 5] = ["critical", "standard", "sheddable", "batch", "background"];

pub(crate) fn upgrade_slo_class(name: &str) -> Option<&'static str> {
    match name {
        "realtime" => Some("critical"),
        "interactive" => Some("standard"),
        _ => None,
    }
}

impl WorkloadSpec {
    /// Reads and validates a spec file.
    ///
    /// # Errors
    /// I/O errors; YAML or validation errors naming file:line and the field.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = crate::text::read_text(path).map_err(|e| Error::io(path, e))?;
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
        Self::parse(path, &text, base)
    }

    /// Parses and validates a spec held in memory (named `<spec>` in errors,
    /// relative paths against the current folder).
    ///
    /// # Errors
    /// YAML or validation errors naming line and field.
    pub fn from_yaml_str(text: &str) -> Result<Self> {
        Self::parse(Path::new("<spec>"), text, PathBuf::new())
    }

    /// Parses and validates `text`, naming it `path` in errors and resolving
    /// relative data paths against `base_dir`.
    ///
    /// # Errors
    /// YAML or validation errors naming file:line and the field.
    pub fn parse(path: &Path, text: &str, base_dir: PathBuf) -> Result<Self> {
        let mut spec: WorkloadSpec =
            serde_saphyr::from_str(text).map_err(|e| yaml_error(path, text, &e))?;
        spec.base_dir = base_dir;
        spec.source = path.to_path_buf();
        spec.validate()
            .map_err(|(field, msg)| spec_error(path, text, &field, &msg))?;
        spec.upgrade();
        Ok(spec)
    }

    /// Maps v1 SLO class names to v2 (as BLIS does) and fills defaults.
    fn upgrade(&mut self) {
        for c in &mut self.clients {
            if let Some(v2) = upgrade_slo_class(&c.slo_class) {
                c.slo_class = v2.to_string();
            }
        }
    }

    /// The seed, defaulting to 42 (BLIS's default).
    pub fn seed_or_default(&self) -> u64 {
        self.seed.unwrap_or(42)
    }
}

/// An error at `field` of the spec text, located by line when possible.
pub(crate) fn spec_error(path: &Path, text: &str, field: &str, msg: &str) -> Error {
    let loc = match locate(text, field) {
        Some((line, col)) => Location::at(path, line, col),
        None => Location::file(path),
    };
    Error::invalid(loc, format!("{field}: {msg}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        WorkloadSpec::from_yaml_str(text).unwrap_err().to_string()
    }

    const OK: &str = "version: \"1\"\naggregate_rate: 10\nnum_requests: 5\nclients:\n  - id: a\n    rate_fraction: 1\n    input_distribution:\n      type: constant\n      params: {value: 10}\n    output_distribution:\n      type: exponential\n      params:\n        mean: 5\n";

    #[test]
    fn accepts_a_minimal_spec() {
        let s = WorkloadSpec::from_yaml_str(OK).unwrap();
        assert_eq!(s.clients[0].id, "a");
    }

    #[test]
    fn unknown_field_names_line_and_field() {
        let text = OK.replace(
            "    rate_fraction: 1\n",
            "    rate_fraction: 1\n    rate_fractoin: 2\n",
        );
        let m = err(&text);
        assert!(m.starts_with("<spec>:7:5: "), "{m}");
        assert!(m.contains("unknown field `rate_fractoin`"), "{m}");
    }

    #[test]
    fn nan_is_rejected_at_its_line() {
        let text = OK.replace("rate_fraction: 1", "rate_fraction: .nan");
        let m = err(&text);
        assert!(m.starts_with("<spec>:6:"), "{m}");
        assert!(m.contains("rate_fraction") && m.contains("finite"), "{m}");
    }

    #[test]
    fn negative_rate_fraction_is_located() {
        let text = OK.replace("rate_fraction: 1", "rate_fraction: -1");
        assert_eq!(
            err(&text),
            "<spec>:6:5: clients[0].rate_fraction: must be ≥ 0, got -1"
        );
    }

    #[test]
    fn zero_fraction_sum_is_rejected() {
        let text = OK.replace("rate_fraction: 1", "rate_fraction: 0");
        assert!(err(&text).contains("must sum to a positive, finite number, got 0"));
    }

    #[test]
    fn missing_param_names_the_distribution() {
        let text = OK.replace("        mean: 5\n", "        std_dev: 5\n");
        let m = err(&text);
        assert!(m.starts_with("<spec>:12:"), "{m}");
        assert!(
            m.contains(
                "clients[0].output_distribution.params: exponential distribution requires `mean`"
            ),
            "{m}"
        );
    }

    #[test]
    fn v1_slo_classes_are_upgraded() {
        let text = OK.replace("  - id: a\n", "  - id: a\n    slo_class: realtime\n");
        let s = WorkloadSpec::from_yaml_str(&text).unwrap();
        assert_eq!(s.clients[0].slo_class, "critical");
    }
}
