//! The trace header: a small YAML file describing how a trace was produced
//! (BLIS's `trace_version` 2 and 3 files read as they are).

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Location, Result, yaml_error};

/// The header version this crate writes (BLIS writes 3 since its goodput SLO
/// targets; 2 is read too).
pub const WRITE_TRACE_VERSION: u32 = 3;

/// Header versions this crate reads.
pub const READ_TRACE_VERSIONS: [u32; 2] = [2, 3];

/// The time unit written in headers: every time column is in microseconds.
pub const TIME_UNIT: &str = "microseconds";

/// Which pipeline produced a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Observed against a real server (`blis-loadgen run`, or an import of
    /// measured runs).
    Real,
    /// A planned workload (`blis-loadgen generate`, importers of arrival
    /// traces); no measured times.
    #[default]
    Generated,
    /// Predicted by the simulator (`blis-replay`).
    Replayed,
}

/// Server settings the trace was taken with (vLLM's flag names).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct ServerConfig {
    /// `vllm`, `sglang`, `llama.cpp`, `openai`, `mock`, ...
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "type")]
    pub server_type: Option<String>,
    /// Served model name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Tensor-parallel degree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensor_parallel: Option<u32>,
    /// Maximum running sequences per step (`--max-num-seqs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_num_seqs: Option<u32>,
    /// Token budget per step (`--max-num-batched-tokens`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_num_batched_tokens: Option<u32>,
    /// Tokens per KV block (`--block-size`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_size: Option<u32>,
    /// Fraction of GPU memory for the engine (`--gpu-memory-utilization`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_memory_utilization: Option<f64>,
    /// Maximum prompt + output length (`--max-model-len`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_model_len: Option<u64>,
    /// GPU KV blocks available (from the server's log or `/metrics`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_kv_blocks: Option<u64>,
    /// vLLM's `--async-scheduling` (the next step is scheduled while one
    /// runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub async_scheduling: Option<bool>,
    /// The server's version as it reports it (vLLM's `GET /version`, e.g.
    /// `0.15.1`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// vLLM's `--enable-prefix-caching` (from `vllm:cache_config_info`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_prefix_caching: Option<bool>,
    /// vLLM's `--enable-chunked-prefill`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_chunked_prefill: Option<bool>,
    /// The model's shape as the run recorded it (the vLLM ground truth's
    /// `model_config`), for a simulator that has no `config.json` of the
    /// model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_shape: Option<ModelShape>,
}

/// A transformer's shape in Hugging Face `config.json` field names, as a
/// run may record it beside its measurements (the vLLM ground truth's
/// `replay_data/<exp>.json` → `model_config`). Enough for a latency model
/// of a Llama-style decoder (with Mixtral-style routed experts when
/// `num_local_experts` > 1); what it does not say (data types, tied
/// embeddings, sliding windows, shared experts) a reader must assume and
/// say so.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ModelShape {
    /// Decoder layers.
    pub num_hidden_layers: u32,
    /// Hidden (model) width.
    pub hidden_size: u32,
    /// Query heads.
    pub num_attention_heads: u32,
    /// Key/value heads (grouped-query attention; equal to the query heads
    /// for multi-head attention).
    pub num_key_value_heads: u32,
    /// Width of the MLP (of each routed expert in an MoE model).
    pub intermediate_size: u32,
    /// Vocabulary.
    pub vocab_size: u32,
    /// Routed experts per MoE layer (0: a dense model).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub num_local_experts: u32,
    /// Experts each token is routed to.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub num_experts_per_tok: u32,
    /// Fields the run recorded beside these that its importer does not
    /// understand (e.g. a head width or shared experts): a reader must not
    /// build the model from this shape while any is listed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_understood: Vec<String>,
}

fn is_zero(x: &u32) -> bool {
    *x == 0
}

/// Accelerators the server ran on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Hardware {
    /// GPU model, e.g. `H100`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<String>,
    /// Number of GPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_count: Option<u32>,
}

/// Network between client and server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct NetworkInfo {
    /// Round-trip time measured before the run, milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured_rtt_ms: Option<f64>,
}

/// How well the load generator kept to its schedule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct LoadGeneratorInfo {
    /// Requested rate, requests per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_rate: Option<f64>,
    /// Achieved send rate, requests per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub achieved_rate: Option<f64>,
    /// Median send lag (actual minus intended send), milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send_lag_p50_ms: Option<f64>,
    /// 99th-percentile send lag, milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send_lag_p99_ms: Option<f64>,
    /// True when the client, not the server, limited the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_bound: Option<bool>,
    /// The client's timeout per request, seconds: a replay cancels every
    /// request this long after its send, as the client did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<f64>,
}

/// The header YAML of a trace-v2 bundle.
///
/// Unknown fields (from newer BLIS versions) are ignored when reading; the
/// writer emits only the fields below, omitting those that are unset.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceHeader {
    /// Format version: 2 or 3 when read, 3 when written.
    pub trace_version: u32,
    /// Unit of every time column; `microseconds`.
    #[serde(default = "default_time_unit")]
    pub time_unit: String,
    /// RFC 3339 time the trace was written (real runs only, so that
    /// generated and replayed traces stay byte-identical across runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<String>,
    /// Which pipeline produced the trace.
    #[serde(default)]
    pub mode: Mode,
    /// Leading requests (by `request_id`) to leave out of statistics.
    #[serde(default)]
    pub warm_up_requests: u64,
    /// Seed the workload was generated with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload_seed: Option<u64>,
    /// Where the workload came from: a spec path or `KIND:PATH` of an import.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload_spec: Option<String>,
    /// Server settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<ServerConfig>,
    /// Hardware.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hardware: Option<Hardware>,
    /// Network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkInfo>,
    /// Load-generator quality figures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_generator: Option<LoadGeneratorInfo>,
    /// Unix time (µs) of the run start; absolute times in the CSV minus this
    /// give run-relative times. Absent: the CSV's times are already relative.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_start_unix_us: Option<i64>,
    /// Request CSV, relative to the header's folder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_file: Option<String>,
    /// Per-chunk (ITL) companion, relative to the header's folder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub itl_file: Option<String>,
    /// Present when the ITL companion is in step form (a simulator's):
    /// the step table and the output overheads ([`crate::itl_steps`]).
    /// Absent: one row per chunk, as BLIS writes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub itl_steps: Option<crate::itl_steps::ItlSteps>,
    /// Metrics companion, relative to the header's folder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_file: Option<String>,
    /// Requests the run planned to send (a recorded run's plan): with
    /// `planned_ids`, what [`crate::check`] compares the rows with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub planned_requests: Option<u64>,
    /// The planned request ids as ranges (`0-2999`, `4,7-9`); absent when
    /// they take more than [`MAX_PLANNED_ID_RANGES`] ranges.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub planned_ids: Option<String>,
    /// `true` in the header a writer puts down first, replaced by the
    /// complete header when it finishes: a trace whose header still says
    /// so was cut off (its writer was killed), and its files may end in a
    /// partly written line, which readers drop with a warning.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub incomplete: bool,
    /// A fingerprint of the whole planned workload (xxh3-64 of every
    /// planned request's id, arrival, lengths, session and labels, in
    /// hex): the parts of one sharded run share it, and
    /// `blis-loadgen merge` refuses parts whose plans differ.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan_hash: Option<String>,
    /// Set on one part of a sharded run (`blis-loadgen run --shard i/N`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<ShardInfo>,
}

/// One part of a sharded run: which part, and its machine's clock.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct ShardInfo {
    /// The part, from 0.
    pub index: u32,
    /// Parts in all.
    pub count: u32,
    /// This machine's clock minus true (NTP) time when the run started, µs,
    /// as its time daemon measured it (`chronyc tracking`); absent when
    /// none could say. The merge subtracts it from the part's times.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock_offset_us: Option<i64>,
    /// Where `clock_offset_us` came from, or why it is absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock_source: Option<String>,
}

/// The most ranges [`TraceHeader::planned_ids`] lists.
pub const MAX_PLANNED_ID_RANGES: usize = 64;

/// `ids` (sorted, no repeats) as ranges (`0-2999`, `4,7-9`), or `None`
/// when they take more than [`MAX_PLANNED_ID_RANGES`].
pub fn id_ranges(ids: &[u64]) -> Option<String> {
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    for &id in ids {
        match ranges.last_mut() {
            Some(l) if id == l.1.wrapping_add(1) => l.1 = id,
            _ => ranges.push((id, id)),
        }
    }
    format_id_ranges(&ranges)
}

/// Inclusive `ranges` (sorted, disjoint) as [`id_ranges`] writes them, or
/// `None` when there are more than [`MAX_PLANNED_ID_RANGES`].
pub fn format_id_ranges(ranges: &[(u64, u64)]) -> Option<String> {
    if ranges.len() > MAX_PLANNED_ID_RANGES {
        return None;
    }
    Some(
        ranges
            .iter()
            .map(|&(a, b)| {
                if a == b {
                    a.to_string()
                } else {
                    format!("{a}-{b}")
                }
            })
            .collect::<Vec<_>>()
            .join(","),
    )
}

/// The ids of a [`TraceHeader::planned_ids`] string, as inclusive ranges;
/// `None` when it is malformed (or a range is reversed).
pub fn parse_id_ranges(s: &str) -> Option<Vec<(u64, u64)>> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a.trim().parse().ok()?, b.trim().parse().ok()?),
            None => {
                let v = part.parse().ok()?;
                (v, v)
            }
        };
        if a > b {
            return None;
        }
        out.push((a, b));
    }
    Some(out)
}

fn default_time_unit() -> String {
    TIME_UNIT.to_string()
}

impl TraceHeader {
    /// A header for a new trace of `mode`, version 3, in microseconds.
    pub fn new(mode: Mode) -> Self {
        Self {
            trace_version: WRITE_TRACE_VERSION,
            time_unit: TIME_UNIT.to_string(),
            created_at: None,
            mode,
            warm_up_requests: 0,
            workload_seed: None,
            workload_spec: None,
            server: None,
            hardware: None,
            network: None,
            load_generator: None,
            run_start_unix_us: None,
            data_file: None,
            itl_file: None,
            itl_steps: None,
            metrics_file: None,
            planned_requests: None,
            planned_ids: None,
            incomplete: false,
            plan_hash: None,
            shard: None,
        }
    }

    /// Parses a header from YAML text; `path` names the source in errors.
    ///
    /// # Errors
    /// Malformed YAML, a `trace_version` other than 2 or 3, or a time unit
    /// other than microseconds.
    pub fn from_yaml(path: &Path, text: &str) -> Result<Self> {
        let header: TraceHeader =
            serde_saphyr::from_str(text).map_err(|e| yaml_error(path, text, &e))?;
        if !READ_TRACE_VERSIONS.contains(&header.trace_version) {
            return Err(Error::invalid(
                locate_key(path, text, "trace_version"),
                format!(
                    "trace_version: unsupported version {} (this build reads 2 and 3)",
                    header.trace_version
                ),
            ));
        }
        if !matches!(
            header.time_unit.as_str(),
            "microseconds" | "us" | "µs" | "usec"
        ) {
            return Err(Error::invalid(
                locate_key(path, text, "time_unit"),
                format!(
                    "time_unit: unsupported unit {:?} (expected microseconds)",
                    header.time_unit
                ),
            ));
        }
        Ok(header)
    }

    /// Reads a header file.
    ///
    /// # Errors
    /// See [`TraceHeader::from_yaml`]; I/O errors name the file.
    pub fn read(path: &Path) -> Result<Self> {
        let text = crate::text::read_text(path).map_err(|e| Error::io(path, e))?;
        Self::from_yaml(path, &text)
    }

    /// Renders the header as YAML (only known, set fields).
    pub fn to_yaml(&self) -> String {
        let mut header = self.clone();
        header.trace_version = WRITE_TRACE_VERSION;
        header.time_unit = TIME_UNIT.to_string();
        serde_saphyr::to_string(&header).expect("a trace header always serializes")
    }

    /// Run-relative time of an absolute CSV time.
    pub fn relative_us(&self, absolute_us: i64) -> i64 {
        absolute_us - self.run_start_unix_us.unwrap_or(0)
    }
}

/// The location of `key:` at the start of a line in `text` (for errors
/// found after parsing).
pub(crate) fn locate_key(path: &Path, text: &str, key: &str) -> Location {
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if let Some(rest) = trimmed.strip_prefix(key)
            && rest.trim_start().starts_with(':')
        {
            return Location::at(path, i as u64 + 1, (line.len() - trimmed.len()) as u64 + 1);
        }
    }
    Location::file(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_blis_header_and_ignores_unknown_fields() {
        let text = "trace_version: 3\ntime_unit: microseconds\nmode: generated\nwarm_up_requests: 0\nworkload_seed: 42\ngoodput_slo_targets:\n  critical: {ttft_us: 1}\n";
        let h = TraceHeader::from_yaml(Path::new("h.yaml"), text).unwrap();
        assert_eq!(h.trace_version, 3);
        assert_eq!(h.mode, Mode::Generated);
        assert_eq!(h.workload_seed, Some(42));
    }

    #[test]
    fn rejects_unknown_version_with_location() {
        let text = "mode: real\ntrace_version: 9\n";
        let err = TraceHeader::from_yaml(Path::new("h.yaml"), text).unwrap_err();
        assert_eq!(
            err.to_string(),
            "h.yaml:2:1: trace_version: unsupported version 9 (this build reads 2 and 3)"
        );
    }

    #[test]
    fn yaml_round_trip_keeps_every_field() {
        let mut h = TraceHeader::new(Mode::Real);
        h.created_at = Some("2026-11-21T00:00:00Z".into());
        h.warm_up_requests = 5;
        h.workload_seed = Some(7);
        h.workload_spec = Some("w.yaml".into());
        h.server = Some(ServerConfig {
            server_type: Some("vllm".into()),
            model: Some("m".into()),
            tensor_parallel: Some(2),
            max_num_seqs: Some(128),
            max_num_batched_tokens: Some(2048),
            block_size: Some(16),
            gpu_memory_utilization: Some(0.9),
            max_model_len: Some(4096),
            total_kv_blocks: Some(7462),
            async_scheduling: None,
            version: Some("0.15.1".into()),
            enable_prefix_caching: Some(true),
            enable_chunked_prefill: Some(false),
            model_shape: Some(ModelShape {
                num_hidden_layers: 32,
                hidden_size: 4096,
                num_attention_heads: 32,
                num_key_value_heads: 8,
                intermediate_size: 14336,
                vocab_size: 32000,
                num_local_experts: 8,
                num_experts_per_tok: 2,
                not_understood: vec!["head_dim".into()],
            }),
        });
        h.hardware = Some(Hardware {
            gpu: Some("H100".into()),
            gpu_count: Some(2),
        });
        h.network = Some(NetworkInfo {
            measured_rtt_ms: Some(0.25),
        });
        h.load_generator = Some(LoadGeneratorInfo {
            requested_rate: Some(10.0),
            achieved_rate: Some(9.98),
            send_lag_p50_ms: Some(0.1),
            send_lag_p99_ms: Some(1.5),
            client_bound: Some(false),
            timeout_s: Some(300.0),
        });
        h.run_start_unix_us = Some(1_700_000_000_000_000);
        h.data_file = Some("x.csv".into());
        h.itl_file = Some("x.itl.csv".into());
        h.metrics_file = Some("x.metrics.csv".into());
        let yaml = h.to_yaml();
        let back = TraceHeader::from_yaml(Path::new("h.yaml"), &yaml).unwrap();
        assert_eq!(back, h);
    }
}
