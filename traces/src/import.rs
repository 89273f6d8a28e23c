//! Importers of public serving traces into trace records, named on command
//! lines as `--import KIND:PATH`:
//!
//! | KIND | PATH | becomes |
//! |---|---|---|
//! | `mooncake` | Mooncake JSONL (`timestamp` ms, `hash_ids` of 512-token blocks) | `generated` trace with prefix-block identities |
//! | `azure` | Azure LLM inference trace 2023 CSV (absolute datetimes) | `generated` trace, arrivals relative to the first row |
//! | `inference-perf` | an inference-perf profile or config (JSON or YAML: `load.stages`, `data.shared_prefix`) | `generated` trace (seeded) |
//! | `vllm-gt` | one run folder of `vllm-ground-truth/train` | `real` trace with measured TTFT/E2E and the server's settings |

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use serde::Deserialize;

use crate::bundle::Trace;
use crate::error::{Error, Location, Result, json_message, yaml_error};
use crate::generate::{GenerateOptions, generate};
use crate::header::{Hardware, Mode, ServerConfig, TraceHeader};
use crate::record::{HashIds, Outcome, Request, Status, TraceRecord};
use crate::spec::{InferencePerfSpec, WorkloadSpec};

/// The importable formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImportKind {
    /// Mooncake JSONL.
    Mooncake,
    /// Azure LLM inference trace 2023 CSV.
    Azure,
    /// inference-perf profile.
    InferencePerf,
    /// A vLLM ground-truth run folder.
    VllmGt,
}

impl ImportKind {
    /// The name used in `KIND:PATH`.
    pub fn name(self) -> &'static str {
        match self {
            ImportKind::Mooncake => "mooncake",
            ImportKind::Azure => "azure",
            ImportKind::InferencePerf => "inference-perf",
            ImportKind::VllmGt => "vllm-gt",
        }
    }
}

/// A parsed `KIND:PATH`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportSource {
    /// The format.
    pub kind: ImportKind,
    /// The file or folder.
    pub path: PathBuf,
}

impl fmt::Display for ImportSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.kind.name(), self.path.display())
    }
}

impl FromStr for ImportSource {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let (kind, path) = s.split_once(':').ok_or_else(|| {
            format!(
                "expected KIND:PATH (KIND: mooncake, azure, inference-perf, vllm-gt), got {s:?}"
            )
        })?;
        let kind = match kind {
            "mooncake" => ImportKind::Mooncake,
            "azure" => ImportKind::Azure,
            "inference-perf" | "inference_perf" => ImportKind::InferencePerf,
            "vllm-gt" | "vllm_gt" => ImportKind::VllmGt,
            other => {
                return Err(format!(
                    "unknown import kind {other:?} (mooncake, azure, inference-perf, vllm-gt)"
                ));
            }
        };
        if path.is_empty() {
            return Err("empty PATH in KIND:PATH".into());
        }
        Ok(Self {
            kind,
            path: PathBuf::from(path),
        })
    }
}

/// Imports `src` as a trace. `seed` drives the generated parts
/// (inference-perf arrival times and prompt order).
///
/// # Errors
/// Unreadable files; malformed content naming file:line and the field.
pub fn import(src: &ImportSource, seed: u64) -> Result<Trace> {
    let mut trace = match src.kind {
        ImportKind::Mooncake => mooncake(&src.path)?,
        ImportKind::Azure => azure(&src.path)?,
        ImportKind::InferencePerf => inference_perf(&src.path, seed)?,
        ImportKind::VllmGt => vllm_gt(&src.path)?,
    };
    trace.header.workload_spec = Some(src.to_string());
    Ok(trace)
}

#[derive(Deserialize)]
struct MooncakeRow {
    timestamp: i64,
    input_length: u32,
    output_length: u32,
    #[serde(default)]
    hash_ids: Vec<u64>,
}

/// The longest line of a Mooncake trace read, bytes (1 MiB; a request of
/// a million prompt tokens names 2,000 blocks in about 16 KB).
const MOONCAKE_MAX_LINE: u64 = 1 << 20;

/// Mooncake JSONL: one request per line, `timestamp` in ms from the trace
/// start, `hash_ids` naming 512-token prefix blocks.
///
/// # Errors
/// A line that is not a Mooncake object, naming file:line.
pub fn mooncake(path: &Path) -> Result<Trace> {
    use std::io::{BufRead, Read};
    // Read a line at a time (a trace of any length), each line at most
    // MOONCAKE_MAX_LINE bytes and the requests at most a run's plan.
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut reader = std::io::BufReader::new(file);
    let client: Arc<str> = Arc::from("mooncake");
    let mut records = Vec::new();
    let mut buf = String::new();
    for i in 0usize.. {
        buf.clear();
        let n = (&mut reader)
            .take(MOONCAKE_MAX_LINE + 1)
            .read_line(&mut buf)
            .map_err(|e| Error::io(path, e))?;
        if n == 0 {
            break;
        }
        if buf.len() as u64 > MOONCAKE_MAX_LINE {
            return Err(Error::invalid(
                Location::line(path, i as u64 + 1),
                format!(
                    "a line longer than {} KiB: not a Mooncake request",
                    MOONCAKE_MAX_LINE >> 10
                ),
            ));
        }
        let mut line = buf.strip_suffix('\n').unwrap_or(&buf);
        line = line.strip_suffix('\r').unwrap_or(line);
        if i == 0 {
            line = line.strip_prefix('\u{feff}').unwrap_or(line);
        }
        if line.trim().is_empty() {
            continue;
        }
        if records.len() as u64 >= crate::generate::MAX_PLANNED_REQUESTS {
            return Err(Error::invalid(
                Location::line(path, i as u64 + 1),
                format!(
                    "more than the {} requests a run may plan",
                    crate::generate::MAX_PLANNED_REQUESTS
                ),
            ));
        }
        let row: MooncakeRow = serde_json::from_str(line).map_err(|e| {
            Error::invalid(
                Location::at(path, i as u64 + 1, e.column() as u64),
                format!("not a Mooncake request: {}", json_message(&e)),
            )
        })?;
        let arrival_time_us = row
            .timestamp
            .checked_mul(1000)
            .filter(|t| t.unsigned_abs() <= crate::csvio::MAX_TIME_US as u64)
            .ok_or_else(|| {
                Error::invalid(
                    Location::at(path, i as u64 + 1, 1),
                    format!(
                        "timestamp: {} ms is beyond ±2^53 µs (285 years)",
                        row.timestamp
                    ),
                )
            })?;
        let request = Request {
            request_id: records.len() as u64,
            client_id: client.clone(),
            streaming: true,
            input_tokens: row.input_length,
            output_tokens: row.output_length,
            arrival_time_us,
            hash_ids: (!row.hash_ids.is_empty()).then(|| HashIds {
                block_tokens: 512,
                ids: row.hash_ids.into(),
            }),
            ..Request::default()
        };
        records.push(TraceRecord::planned(request));
    }
    sort_by_arrival(&mut records);
    Ok(Trace::new(TraceHeader::new(Mode::Generated), records))
}

/// Azure LLM inference trace (2023): `TIMESTAMP,ContextTokens,GeneratedTokens`
/// with absolute datetimes (7 fractional digits, no zone; read as UTC).
/// Arrivals are relative to the first row.
///
/// # Errors
/// A bad header, datetime or count, naming file:line:column.
pub fn azure(path: &Path) -> Result<Trace> {
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut rdr = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .from_reader(crate::csvio::LineTrack::new(file));
    let mut headers = csv::ByteRecord::new();
    if !rdr
        .read_byte_record(&mut headers)
        .map_err(|e| crate::csvio::csv_error(path, &e))?
    {
        return Err(Error::in_file(path, "empty file: no header row"));
    }
    let col = |name: &str| -> Result<usize> {
        headers
            .iter()
            .position(|h| {
                String::from_utf8_lossy(h)
                    .trim()
                    .trim_start_matches('\u{feff}')
                    == name
            })
            .ok_or_else(|| {
                Error::invalid(Location::line(path, 1), format!("{name}: column missing"))
            })
    };
    let (ts_i, in_i, out_i) = (
        col("TIMESTAMP")?,
        col("ContextTokens")?,
        col("GeneratedTokens")?,
    );
    let client: Arc<str> = Arc::from("azure");
    let mut records = Vec::new();
    let mut first: Option<i64> = None;
    let mut row = csv::ByteRecord::new();
    while rdr
        .read_byte_record(&mut row)
        .map_err(|e| crate::csvio::csv_error(path, &e))?
    {
        if row.len() == 1 && row.get(0).is_some_and(<[u8]>::is_empty) {
            continue;
        }
        let line = crate::csvio::record_line(&rdr, &row);
        let cell = |i: usize| {
            std::str::from_utf8(row.get(i).unwrap_or(b""))
                .unwrap_or("")
                .trim()
        };
        let raw = cell(ts_i);
        let dt: jiff::civil::DateTime = raw.parse().map_err(|e| {
            Error::invalid(
                Location::at(path, line, ts_i as u64 + 1),
                format!("TIMESTAMP: invalid datetime {raw:?}: {e}"),
            )
        })?;
        let us = dt
            .to_zoned(jiff::tz::TimeZone::UTC)
            .map_err(|e| Error::invalid(Location::line(path, line), format!("TIMESTAMP: {e}")))?
            .timestamp()
            .as_microsecond();
        let first_us = *first.get_or_insert(us);
        let count = |i: usize, name: &str| -> Result<u32> {
            cell(i).parse().map_err(|_| {
                Error::invalid(
                    Location::at(path, line, i as u64 + 1),
                    format!("{name}: invalid token count {:?}", cell(i)),
                )
            })
        };
        let request = Request {
            request_id: records.len() as u64,
            client_id: client.clone(),
            streaming: true,
            input_tokens: count(in_i, "ContextTokens")?,
            output_tokens: count(out_i, "GeneratedTokens")?,
            arrival_time_us: us - first_us,
            ..Request::default()
        };
        records.push(TraceRecord::planned(request));
    }
    sort_by_arrival(&mut records);
    Ok(Trace::new(TraceHeader::new(Mode::Generated), records))
}

/// An inference-perf profile or config: only `load`, `data` and `api` are
/// read; other top-level keys (`server`, `tokenizer`, `report`, …) are the
/// client's own settings.
#[derive(Deserialize)]
struct InferencePerfFile {
    #[serde(default)]
    load: Option<crate::spec::InferencePerfLoad>,
    #[serde(default)]
    data: crate::spec::InferencePerfData,
    #[serde(default)]
    api: Option<crate::spec::InferencePerfApi>,
}

/// Expands an inference-perf profile (JSON or YAML) with `seed`.
///
/// # Errors
/// Malformed files, naming file:line.
pub fn inference_perf(path: &Path, seed: u64) -> Result<Trace> {
    let text = crate::text::read_text(path).map_err(|e| Error::io(path, e))?;
    let file: InferencePerfFile =
        serde_saphyr::from_str(&text).map_err(|e| yaml_error(path, &text, &e))?;
    let spec = WorkloadSpec {
        seed: Some(seed),
        inference_perf: Some(InferencePerfSpec {
            load: file.load,
            data: file.data,
            api: file.api,
            ..InferencePerfSpec::default()
        }),
        ..WorkloadSpec::default()
    };
    spec.validate().map_err(|(f, m)| {
        crate::spec::spec_error(path, &text, &f.replace("inference_perf.", ""), &m)
    })?;
    let records = generate(&spec, &GenerateOptions::default())?
        .into_iter()
        .map(TraceRecord::planned)
        .collect();
    let mut header = TraceHeader::new(Mode::Generated);
    header.workload_seed = Some(seed);
    Ok(Trace::new(header, records))
}

#[derive(Deserialize)]
struct GtExpConfig {
    model: String,
    #[serde(default, alias = "tensor_parallel_size")]
    tensor_parallelism: Option<u32>,
    #[serde(default)]
    max_model_len: Option<u64>,
    #[serde(default)]
    max_num_batched_tokens: Option<u32>,
    #[serde(default)]
    max_num_seqs: Option<u32>,
    // vLLM's flags, when a run records them (none of the bundled runs
    // does): they then reach the header as the server's settings.
    #[serde(default)]
    gpu_memory_utilization: Option<f64>,
    #[serde(default)]
    block_size: Option<u32>,
    #[serde(default)]
    enable_prefix_caching: Option<bool>,
    #[serde(default)]
    enable_chunked_prefill: Option<bool>,
    #[serde(default)]
    async_scheduling: Option<bool>,
}

#[derive(Deserialize)]
struct GtReplay {
    #[serde(default)]
    experiment: String,
    #[serde(default)]
    model_id: String,
    #[serde(default)]
    profile: String,
    config: GtConfig,
    /// The model's shape (absent from older files).
    #[serde(default)]
    model_config: Option<GtModelConfig>,
    requests: Vec<GtRequest>,
}

/// `model_config` of a ground-truth replay file, in its own field names.
#[derive(Deserialize)]
struct GtModelConfig {
    num_layers: u32,
    hidden_dim: u32,
    num_heads: u32,
    num_kv_heads: u32,
    intermediate_dim: u32,
    #[serde(default)]
    num_local_experts: u32,
    #[serde(default)]
    num_experts_per_tok: u32,
    vocab_size: u32,
    /// Any other field (kept by name: the shape is not to be used).
    #[serde(flatten)]
    other: std::collections::BTreeMap<String, serde_json::Value>,
}

impl GtModelConfig {
    /// In Hugging Face names.
    fn shape(&self) -> crate::header::ModelShape {
        crate::header::ModelShape {
            num_hidden_layers: self.num_layers,
            hidden_size: self.hidden_dim,
            num_attention_heads: self.num_heads,
            num_key_value_heads: self.num_kv_heads,
            intermediate_size: self.intermediate_dim,
            vocab_size: self.vocab_size,
            num_local_experts: self.num_local_experts,
            num_experts_per_tok: self.num_experts_per_tok,
            not_understood: self.other.keys().cloned().collect(),
        }
    }
}

#[derive(Deserialize)]
struct GtConfig {
    #[serde(default)]
    kv_blocks_total_gpu: Option<u64>,
    #[serde(default)]
    block_size: Option<u32>,
}

#[derive(Deserialize)]
struct GtRequest {
    index: u64,
    arrival_time_us: i64,
    input_tokens: u32,
    output_tokens: u32,
    #[serde(default)]
    has_error: bool,
}

#[derive(Deserialize)]
struct GtTruth {
    index: u64,
    #[serde(default)]
    has_error: bool,
    e2e_s: f64,
    #[serde(default)]
    ttft_s: Option<f64>,
}

/// The settings of a run's client, each from the first of
/// `results/config.yaml` (what inference-perf actually ran) and
/// `profile.yaml` that has it: the shared-prefix data settings, and the
/// timeout per request in seconds, inference-perf's `load.request_timeout`;
/// when it is null or absent, the 300 s total timeout of the aiohttp client
/// session inference-perf sends with (aiohttp's `ClientTimeout` default;
/// the failed requests of the ground truth end after 300.0–301.0 s).
///
/// Each file is parsed once, for what is still wanted (a part of a file
/// that is not wanted is not checked).
///
/// # Errors
/// A file read that is not valid YAML, or whose wanted part is invalid.
fn gt_client_settings(dir: &Path) -> Result<(Option<crate::spec::InferencePerfSharedPrefix>, f64)> {
    use serde::de::{DeserializeOwned, IgnoredAny};
    #[derive(Deserialize)]
    struct Load {
        #[serde(default)]
        request_timeout: Option<f64>,
    }
    #[derive(Deserialize)]
    #[serde(bound = "D: DeserializeOwned, L: DeserializeOwned")]
    struct F<D, L> {
        #[serde(default)]
        data: Option<D>,
        #[serde(default)]
        load: Option<L>,
    }
    fn parse<D: DeserializeOwned, L: DeserializeOwned>(p: &Path, text: &str) -> Result<F<D, L>> {
        serde_saphyr::from_str(text).map_err(|e| yaml_error(p, text, &e))
    }
    let shared = |d: Option<crate::spec::InferencePerfData>| d.and_then(|d| d.shared_prefix);
    let timeout = |l: Option<Load>| l.and_then(|l| l.request_timeout).filter(|t| *t > 0.0);
    let (mut shared_prefix, mut timeout_s) = (None, None);
    for name in ["results/config.yaml", "profile.yaml"] {
        let p = dir.join(name);
        let Ok(text) = crate::text::read_text(&p) else {
            continue;
        };
        match (shared_prefix.is_none(), timeout_s.is_none()) {
            (true, true) => {
                let f: F<_, _> = parse(&p, &text)?;
                shared_prefix = shared(f.data);
                timeout_s = timeout(f.load);
            }
            (true, false) => shared_prefix = shared(parse::<_, IgnoredAny>(&p, &text)?.data),
            (false, true) => timeout_s = timeout(parse::<IgnoredAny, _>(&p, &text)?.load),
            (false, false) => break,
        }
    }
    Ok((shared_prefix, timeout_s.unwrap_or(300.0)))
}

/// Unix µs of an experiment name's leading `YYYYMMDD-HHMMSS` (read as UTC).
fn experiment_start_us(name: &str) -> Option<i64> {
    let stamp = name.get(..15)?;
    let dt = jiff::civil::DateTime::strptime("%Y%m%d-%H%M%S", stamp).ok()?;
    Some(
        dt.to_zoned(jiff::tz::TimeZone::UTC)
            .ok()?
            .timestamp()
            .as_microsecond(),
    )
}

/// One run folder of the vLLM ground truth (`exp-config.yaml`,
/// `replay_data/<exp>.json`, `replay_data/<exp>_ground_truth.json`) as a
/// `real` trace.
///
/// Output length is the requested `output_len` (every request generated
/// exactly that many tokens: `ignore_eos`), the client's re-tokenized count
/// is kept as the extra column `client_output_tokens`. Prompt content
/// follows the client's shared-prefix data: `num_groups × num_prompts_per_group`
/// distinct prompts (each starting with its group's `system_prompt_len`-token
/// system prompt) sent in a repeating cycle; as the prompt of each request
/// is not recorded, request i carries prompt i mod N (`content_key`,
/// `prefix_group`), which reproduces the cycle's reuse of the prefix cache
/// but not the exact order within a cycle. Every request's
/// `deadline_us` is its arrival plus the client's timeout (300 s unless the
/// run set `request_timeout`), so that a prediction times requests out as
/// the client did. Failed requests (client timeouts) have status `timeout`;
/// their prompt length, not recorded, is the plan's (the median length of
/// the same prompt of the cycle). Send times are `run_start_unix_us` (the
/// experiment name's timestamp, read as UTC) plus `arrival_time_us`. The
/// replay file's `model_config` becomes the header's
/// `server.model_shape` (Hugging Face names), which a simulator without
/// the model's `config.json` can read; vLLM flags `exp-config.yaml`
/// records (`gpu_memory_utilization`, `block_size`,
/// `enable_prefix_caching`, `enable_chunked_prefill`, `async_scheduling`;
/// `tensor_parallel_size` for `tensor_parallelism`) become the header's
/// server settings.
///
/// # Errors
/// Missing or malformed files, naming them.
pub fn vllm_gt(dir: &Path) -> Result<Trace> {
    let GtFiles {
        exp,
        replay,
        truth,
        shared_prefix,
        timeout_s,
    } = gt_files(dir)?;
    let run = gt_run(dir, &exp, &replay, shared_prefix, timeout_s);
    let mut by_index: Vec<Option<&GtTruth>> = vec![None; replay.requests.len()];
    for t in &truth {
        if let Some(slot) = by_index.get_mut(t.index as usize) {
            *slot = Some(t);
        }
    }
    let record = |r: &GtRequest| {
        let mut record = run.request_record(r);
        record.outcome = run.outcome(r, by_index.get(r.index as usize).copied().flatten());
        record
    };
    let mut records: Vec<TraceRecord> = replay.requests.iter().map(record).collect();
    sort_by_arrival(&mut records);
    let mut header = gt_header(&exp, &replay);
    header.run_start_unix_us = Some(run.run_start);
    Ok(Trace::new(header, records))
}

/// What every record of a ground-truth run shares: from its replay file
/// and its client's settings (`shared_prefix`, and the timeout per request
/// in seconds: [`gt_client_settings`]).
fn gt_run(
    dir: &Path,
    exp: &GtExpConfig,
    replay: &GtReplay,
    shared_prefix: Option<crate::spec::InferencePerfSharedPrefix>,
    timeout_s: f64,
) -> GtRun {
    // inference-perf sent `groups × prompts` distinct prompts in a repeating
    // cycle; which prompt a request carried is not recorded, so request i is
    // given prompt i mod N (the same reuse distance as the real cycle).
    let prompts = shared_prefix.as_ref().map(|s| {
        let groups = s.num_groups.unwrap_or(10).max(1);
        let per = s.num_prompts_per_group.unwrap_or(10).max(1);
        // (A product past u32 is a cycle longer than any run.)
        (groups.saturating_mul(per), per, s.system_prompt_len)
    });
    let cycle = prompts.map_or(1, |(n, _, _)| u64::from(n.max(1)));
    let exp_name = if replay.experiment.is_empty() {
        dir.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    } else {
        replay.experiment.clone()
    };
    // (Request ids are 0-based and dense: the prompts they reach.)
    let cached = |n: u32| {
        n.min(GT_CACHED_PROMPTS)
            .min(u32::try_from(replay.requests.len()).unwrap_or(u32::MAX))
    };
    GtRun {
        run_start: experiment_start_us(&exp_name).unwrap_or(0),
        client: Arc::from(if replay.profile.is_empty() {
            "vllm-gt"
        } else {
            replay.profile.as_str()
        }),
        model: Arc::from(if replay.model_id.is_empty() {
            exp.model.as_str()
        } else {
            replay.model_id.as_str()
        }),
        timeout_us: (timeout_s * 1e6).round() as i64,
        output_len: shared_prefix
            .as_ref()
            .map(|s| s.output_len)
            .filter(|n| *n > 0),
        prompts,
        planned: PlannedInputs::new(&replay.requests, cycle),
        keys: prompts.map_or_else(Vec::new, |(n, _, _)| {
            (0..cached(n))
                .map(|p| gt_content_key(&exp_name, p))
                .collect()
        }),
        groups: prompts.map_or_else(Vec::new, |(n, per, _)| {
            (0..cached(n).div_ceil(per)).map(gt_group).collect()
        }),
        exp_name,
    }
}

/// A ground-truth run's files, read and checked.
struct GtFiles {
    exp: GtExpConfig,
    replay: GtReplay,
    truth: Vec<GtTruth>,
    /// The client's shared-prefix settings ([`gt_client_settings`]).
    shared_prefix: Option<crate::spec::InferencePerfSharedPrefix>,
    /// The client's timeout per request, seconds ([`gt_client_settings`]).
    timeout_s: f64,
}

/// A ground-truth run's files: `exp-config.yaml`; in `replay_data/` the
/// replay (`<exp>.json`) and its measurements (`<exp>_ground_truth.json`);
/// the client's settings (`results/config.yaml`, else `profile.yaml`).
///
/// # Errors
/// The first of: `exp-config.yaml` unreadable or invalid; the replay or
/// the measurements file missing; the replay file unreadable, invalid or
/// with an arrival beyond ±2^53 µs; the client's settings invalid; the
/// measurements file unreadable or invalid; a measurement that is not
/// seconds within a year.
fn gt_files(dir: &Path) -> Result<GtFiles> {
    let exp_path = dir.join("exp-config.yaml");
    let exp_text = crate::text::read_text(&exp_path).map_err(|e| Error::io(&exp_path, e))?;
    let exp: GtExpConfig =
        serde_saphyr::from_str(&exp_text).map_err(|e| yaml_error(&exp_path, &exp_text, &e))?;
    let rd = dir.join("replay_data");
    let mut replay_path = None;
    let mut truth_path = None;
    for entry in std::fs::read_dir(&rd).map_err(|e| Error::io(&rd, e))? {
        let p = entry.map_err(|e| Error::io(&rd, e))?.path();
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if name.ends_with("_ground_truth.json") {
            truth_path = Some(p);
        } else if name.ends_with(".json") {
            replay_path = Some(p);
        }
    }
    let replay_path =
        replay_path.ok_or_else(|| Error::in_file(&rd, "no <exp>.json replay file"))?;
    let truth_path =
        truth_path.ok_or_else(|| Error::in_file(&rd, "no <exp>_ground_truth.json file"))?;
    let read_json =
        |p: &Path| -> Result<String> { crate::text::read_text(p).map_err(|e| Error::io(p, e)) };
    let json_err = |p: &Path, e: serde_json::Error| {
        Error::invalid(
            Location::at(p, e.line() as u64, e.column() as u64),
            format!("invalid JSON: {}", json_message(&e)),
        )
    };
    // Times the trace can hold (±2^53 µs, durations within a year).
    let max = crate::csvio::MAX_TIME_US;
    let check_replay = |replay: &GtReplay| match replay
        .requests
        .iter()
        .find(|r| r.arrival_time_us.unsigned_abs() > max as u64)
    {
        Some(r) => Err(Error::in_file(
            &replay_path,
            format!(
                "request {}: arrival_time_us {} is beyond ±2^53 µs",
                r.index, r.arrival_time_us
            ),
        )),
        None => Ok(()),
    };
    // The replay is parsed on this thread while the client's settings and
    // the measurements are read and parsed on a second one: none depends on
    // another.
    let (replay, settings, truth) = std::thread::scope(|scope| {
        let others = scope.spawn(|| {
            let settings = gt_client_settings(dir);
            let truth = read_json(&truth_path).and_then(|t| {
                serde_json::from_str::<Vec<GtTruth>>(&t).map_err(|e| json_err(&truth_path, e))
            });
            (settings, truth)
        });
        let replay = read_json(&replay_path)
            .and_then(|t| {
                serde_json::from_str::<GtReplay>(&t).map_err(|e| json_err(&replay_path, e))
            })
            .and_then(|replay| check_replay(&replay).map(|()| replay));
        let (settings, truth) = others
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p));
        (replay, settings, truth)
    });
    let (replay, (shared_prefix, timeout_s), truth) = (replay?, settings?, truth?);
    let year_s = 3.2e7;
    let ok = |s: f64| s.is_finite() && (0.0..=year_s).contains(&s);
    if let Some(t) = truth
        .iter()
        .find(|t| !ok(t.e2e_s) || t.ttft_s.is_some_and(|s| !ok(s)))
    {
        return Err(Error::in_file(
            &truth_path,
            format!(
                "request {}: e2e_s {} / ttft_s {:?} must be seconds within [0, 3.2e7]",
                t.index, t.e2e_s, t.ttft_s
            ),
        ));
    }
    Ok(GtFiles {
        exp,
        replay,
        truth,
        shared_prefix,
        timeout_s,
    })
}

/// The prompt length of a request whose length was not recorded (the
/// client reports 0 for failed requests): the median recorded length of the
/// requests carrying the same prompt of the cycle, else of all. Whether a
/// request failed is never used.
struct PlannedInputs {
    /// (prompt of the cycle, recorded length), sorted.
    recorded: Vec<(u64, u32)>,
    cycle: u64,
    median_input: u32,
}

impl PlannedInputs {
    fn new(requests: &[GtRequest], cycle: u64) -> Self {
        let mut recorded: Vec<(u64, u32)> = requests
            .iter()
            .filter(|r| r.input_tokens > 0)
            .map(|r| (r.index % cycle, r.input_tokens))
            .collect();
        recorded.sort_unstable();
        let mut all: Vec<u32> = recorded.iter().map(|x| x.1).collect();
        all.sort_unstable();
        let median_input = Self::median(&all).unwrap_or(1);
        Self {
            recorded,
            cycle,
            median_input,
        }
    }

    fn median(v: &[u32]) -> Option<u32> {
        v.get(v.len() / 2).copied()
    }

    fn get(&self, index: u64) -> u32 {
        let p = index % self.cycle;
        let lo = self.recorded.partition_point(|x| x.0 < p);
        let hi = self.recorded.partition_point(|x| x.0 <= p);
        let same: Vec<u32> = self.recorded[lo..hi].iter().map(|x| x.1).collect();
        Self::median(&same).unwrap_or(self.median_input)
    }
}

/// What every request of a ground-truth run shares.
struct GtRun {
    exp_name: String,
    run_start: i64,
    client: Arc<str>,
    model: Arc<str>,
    timeout_us: i64,
    output_len: Option<u32>,
    /// (prompts in the cycle, prompts per group, system prompt tokens).
    prompts: Option<(u32, u32, u32)>,
    planned: PlannedInputs,
    /// The content keys of the cycle's first prompts, by prompt (a cycle
    /// longer than this computes the rest per request).
    keys: Vec<u64>,
    /// The group names of those prompts' groups, by group.
    groups: Vec<Arc<str>>,
}

/// Prompts of a cycle whose content keys and group names are computed
/// once (a longer cycle computes the rest per request).
const GT_CACHED_PROMPTS: u32 = 4096;

impl GtRun {
    /// Request `r`'s record, its outcome left to [`GtRun::outcome`].
    fn request_record(&self, r: &GtRequest) -> TraceRecord {
        let input = if r.input_tokens == 0 {
            self.planned.get(r.index)
        } else {
            r.input_tokens
        };
        let output = self.output_len.unwrap_or(r.output_tokens).max(1);
        let mut request = Request {
            request_id: r.index,
            client_id: self.client.clone(),
            model: self.model.clone(),
            streaming: true,
            input_tokens: input,
            output_tokens: output,
            arrival_time_us: r.arrival_time_us,
            deadline_us: Some(r.arrival_time_us.saturating_add(self.timeout_us)),
            ..Request::default()
        };
        if let Some((n, per, system)) = self.prompts {
            let p = (r.index % u64::from(n)) as u32;
            request.content_key = Some(
                self.keys
                    .get(p as usize)
                    .copied()
                    .unwrap_or_else(|| gt_content_key(&self.exp_name, p)),
            );
            if system > 0 {
                let g = p / per;
                request.prefix_group = self
                    .groups
                    .get(g as usize)
                    .cloned()
                    .unwrap_or_else(|| gt_group(g));
                request.prefix_length = system.min(input);
            }
        }
        TraceRecord {
            request,
            outcome: Outcome::default(),
            other: vec![("client_output_tokens".into(), r.output_tokens.to_string())],
        }
    }

    /// Request `r`'s outcome from its measurements `t` (none: it failed).
    fn outcome(&self, r: &GtRequest, t: Option<&GtTruth>) -> Outcome {
        let failed = r.has_error || t.is_none_or(|t| t.has_error);
        gt_outcome(self.run_start + r.arrival_time_us, t, failed)
    }
}

/// The content key of prompt `p` of run `exp_name`'s cycle.
fn gt_content_key(exp_name: &str, p: u32) -> u64 {
    xxhash_rust::xxh3::xxh3_64(format!("{exp_name}/prompt/{p}").as_bytes())
}

/// The prefix group of the prompts of group `g`.
fn gt_group(g: u32) -> Arc<str> {
    Arc::from(format!("ip-group-{g}"))
}

/// A ground-truth request's outcome: sent at `send` (µs), timed by `t`.
fn gt_outcome(send: i64, t: Option<&GtTruth>, failed: bool) -> Outcome {
    let to_us = |s: f64| (s * 1e6).round() as i64;
    Outcome {
        send_time_us: Some(send),
        first_chunk_time_us: t
            .and_then(|t| t.ttft_s)
            .filter(|_| !failed)
            .map(|s| send + to_us(s)),
        last_chunk_time_us: t.map(|t| send + to_us(t.e2e_s)),
        status: Some(if failed { Status::Timeout } else { Status::Ok }),
        error_message: if failed {
            "client timeout".into()
        } else {
            String::new()
        },
        finish_reason: if failed {
            String::new()
        } else {
            "length".into()
        },
        ..Outcome::default()
    }
}

/// The header of a ground-truth run: vLLM on H100 with its recorded
/// settings.
fn gt_header(exp: &GtExpConfig, replay: &GtReplay) -> TraceHeader {
    let mut header = TraceHeader::new(Mode::Real);
    let tp = exp.tensor_parallelism.unwrap_or(1);
    header.server = Some(ServerConfig {
        server_type: Some("vllm".into()),
        model: Some(exp.model.clone()),
        tensor_parallel: Some(tp),
        max_num_seqs: exp.max_num_seqs,
        max_num_batched_tokens: exp.max_num_batched_tokens,
        block_size: replay.config.block_size.or(exp.block_size),
        gpu_memory_utilization: exp.gpu_memory_utilization,
        max_model_len: exp.max_model_len,
        total_kv_blocks: replay.config.kv_blocks_total_gpu,
        enable_prefix_caching: exp.enable_prefix_caching,
        enable_chunked_prefill: exp.enable_chunked_prefill,
        async_scheduling: exp.async_scheduling,
        model_shape: replay.model_config.as_ref().map(GtModelConfig::shape),
        // The runs record no vLLM version.
        ..ServerConfig::default()
    });
    header.hardware = Some(Hardware {
        gpu: Some("H100".into()),
        gpu_count: Some(tp),
    });
    header
}

fn sort_by_arrival(records: &mut [TraceRecord]) {
    // Stable: equal timestamps keep file order.
    records.sort_by_key(|r| r.request.arrival_time_us);
    for (i, r) in records.iter_mut().enumerate() {
        r.request.request_id = i as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn import_source_parses_kinds() {
        let s: ImportSource = "vllm-gt:/a/b".parse().unwrap();
        assert_eq!(s.kind, ImportKind::VllmGt);
        assert_eq!(s.to_string(), "vllm-gt:/a/b");
        assert!("foo:/x".parse::<ImportSource>().is_err());
        assert!("nocolon".parse::<ImportSource>().is_err());
    }

    #[test]
    fn experiment_name_gives_run_start() {
        assert_eq!(
            experiment_start_us("20260217-155451-llama-2-7b-tp1-codegen"),
            Some(1_771_343_691_000_000)
        );
        assert_eq!(experiment_start_us("x"), None);
    }

    /// A ground-truth `model_config` becomes a shape in Hugging Face
    /// names; a field beside the known ones is kept by name, not dropped.
    #[test]
    fn a_recorded_model_config_keeps_what_it_does_not_know() {
        let c: GtModelConfig = serde_json::from_str(
            r#"{"num_layers": 40, "hidden_dim": 5120, "num_heads": 40, "num_kv_heads": 8,
                "intermediate_dim": 17408, "num_local_experts": 0, "num_experts_per_tok": 0,
                "vocab_size": 151936, "head_dim": 128}"#,
        )
        .unwrap();
        let s = c.shape();
        assert_eq!(
            (s.num_hidden_layers, s.hidden_size, s.num_key_value_heads),
            (40, 5120, 8)
        );
        assert_eq!(s.not_understood, vec!["head_dim".to_string()]);
    }

    /// The client's settings come from the first file that has each,
    /// `results/config.yaml` before `profile.yaml`; a file is read only
    /// for what is still wanted, and only that part of it is checked.
    #[test]
    fn a_runs_client_settings_come_from_the_first_file_that_has_them() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| {
            let p = dir.path().join(name);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        };
        let remove = |name: &str| std::fs::remove_file(dir.path().join(name)).unwrap();
        let settings =
            || gt_client_settings(dir.path()).map(|(s, t)| (s.map(|s| s.system_prompt_len), t));
        let shared = |len: u32| {
            format!(
                "data: {{type: shared_prefix, shared_prefix: {{num_groups: 2, num_prompts_per_group: 3, system_prompt_len: {len}, question_len: 10, output_len: 5}}}}\n"
            )
        };
        // Neither file: no shared prefix, aiohttp's 300 s.
        assert_eq!(settings().unwrap(), (None, 300.0));
        // The run's config has the prompts, not the timeout (null): the
        // profile's timeout, the config's prompts.
        write(
            "results/config.yaml",
            &format!("{}load: {{request_timeout: null}}\n", shared(100)),
        );
        write(
            "profile.yaml",
            &format!("{}load: {{request_timeout: 30}}\n", shared(7)),
        );
        assert_eq!(settings().unwrap(), (Some(100), 30.0));
        // Both in the config: the profile is not read (here not even YAML).
        write(
            "results/config.yaml",
            &format!("{}load: {{request_timeout: 12.5}}\n", shared(100)),
        );
        write("profile.yaml", "{ not: [yaml");
        assert_eq!(settings().unwrap(), (Some(100), 12.5));
        // The config has only the timeout: the profile is read for its
        // prompts alone, its `load` (here invalid) left unchecked.
        write("results/config.yaml", "load: {request_timeout: 12.5}\n");
        write(
            "profile.yaml",
            &format!("{}load: {{request_timeout: [1, 2]}}\n", shared(7)),
        );
        assert_eq!(settings().unwrap(), (Some(7), 12.5));
        // Only a profile, with both.
        remove("results/config.yaml");
        write(
            "profile.yaml",
            &format!("{}load: {{request_timeout: 60}}\n", shared(7)),
        );
        assert_eq!(settings().unwrap(), (Some(7), 60.0));
        // A wanted part that is invalid is an error naming the file.
        write("results/config.yaml", "load: {request_timeout: soon}\n");
        let e = settings().unwrap_err().to_string();
        assert!(e.contains("config.yaml"), "{e}");
    }
}
