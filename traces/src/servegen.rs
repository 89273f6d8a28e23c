//! ServeGen production data (Xiang et al., arXiv:2505.09999): per-client
//! arrival windows (`chunk-<id>-trace.csv`) and token-length PMFs
//! (`chunk-<id>-dataset.json`), as in `../shared/servegen/README.md`.
//!
//! Each chunk is one client. A trace window (600 s) takes its PMFs from the
//! latest non-empty dataset window (6 h) starting at or before it, else the
//! earliest non-empty one after it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use crate::dist::{Empirical, parse_pmf_literal};
use crate::error::{Error, Location, Result};
use crate::spec::{ArrivalProcess, Category};

/// The highest rate a ServeGen client's window may record, requests/s
/// (10^4: production clients are below 10^3).
pub const MAX_WINDOW_RATE: f64 = 1e4;

/// One 600-second arrival window of a client.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceWindow {
    /// Window start, seconds into the data.
    pub start_s: f64,
    /// Window length, seconds.
    pub duration_s: f64,
    /// Mean arrival rate, requests/s (0 when inactive; at most
    /// [`MAX_WINDOW_RATE`]).
    pub rate: f64,
    /// Coefficient of variation of inter-arrival times.
    pub cv: f64,
    /// Fitted family; `None` for an inactive window.
    pub family: Option<ArrivalProcess>,
    /// Fitted shape (Gamma a, Weibull c).
    pub shape: f64,
    /// Fitted scale, seconds.
    pub scale_s: f64,
}

impl TraceWindow {
    /// Whether requests arrive in this window.
    pub fn is_active(&self) -> bool {
        self.family.is_some() && self.rate > 0.0
    }
}

/// One dataset window: PMFs per field, parsed on first use.
#[derive(Debug)]
pub struct DatasetWindow {
    /// Window start, seconds into the data.
    pub start_s: f64,
    raw: BTreeMap<String, String>,
    parsed: BTreeMap<String, OnceLock<std::result::Result<Arc<Empirical>, String>>>,
    path: PathBuf,
}

impl DatasetWindow {
    /// Whether the window holds any PMF.
    pub fn is_empty(&self) -> bool {
        self.raw.is_empty()
    }

    /// Field names present (`input_tokens`, `output_tokens`, ...).
    pub fn fields(&self) -> impl Iterator<Item = &str> {
        self.raw.keys().map(String::as_str)
    }

    /// The PMF of `field`.
    ///
    /// # Errors
    /// A malformed or empty PMF literal, naming the file and window.
    pub fn pmf(&self, field: &str) -> Result<Option<Arc<Empirical>>> {
        let (Some(raw), Some(cell)) = (self.raw.get(field), self.parsed.get(field)) else {
            return Ok(None);
        };
        let r = cell.get_or_init(|| {
            parse_pmf_literal(raw)
                .and_then(Empirical::from_pairs)
                .map(Arc::new)
        });
        r.clone().map(Some).map_err(|m| {
            Error::in_file(&self.path, format!("window {}: {field}: {m}", self.start_s))
        })
    }
}

/// One ServeGen client (a chunk).
#[derive(Debug)]
pub struct ServeGenClient {
    /// The chunk number.
    pub chunk_id: u32,
    /// Arrival windows in time order.
    pub windows: Vec<TraceWindow>,
    /// Dataset windows in time order.
    pub datasets: Vec<DatasetWindow>,
}

impl ServeGenClient {
    /// The client id used in traces: `chunk-<id>`.
    pub fn client_id(&self) -> String {
        format!("chunk-{}", self.chunk_id)
    }

    /// The workload family, from the dataset's fields.
    pub fn category(&self) -> Category {
        let has = |f: &str| self.datasets.iter().any(|d| d.raw.contains_key(f));
        if has("image_count") || has("text_tokens") {
            Category::Multimodal
        } else if has("reason_ratio") {
            Category::Reasoning
        } else {
            Category::Language
        }
    }

    /// The dataset window whose PMFs apply at `t_s`.
    pub fn dataset_at(&self, t_s: f64) -> Option<&DatasetWindow> {
        self.datasets
            .iter()
            .rev()
            .find(|d| d.start_s <= t_s && !d.is_empty())
            .or_else(|| self.datasets.iter().find(|d| !d.is_empty()))
    }

    /// Expected requests in `[start_s, end_s)` at the recorded rates.
    pub fn expected_requests(&self, start_s: f64, end_s: f64) -> f64 {
        self.windows
            .iter()
            .filter(|w| w.is_active())
            .map(|w| w.rate * overlap(w.start_s, w.start_s + w.duration_s, start_s, end_s))
            .sum()
    }

    /// End of the last window, seconds.
    pub fn end_s(&self) -> f64 {
        self.windows
            .last()
            .map_or(0.0, |w| w.start_s + w.duration_s)
    }
}

/// Length of the overlap of `[a0, a1)` and `[b0, b1)`.
pub fn overlap(a0: f64, a1: f64, b0: f64, b1: f64) -> f64 {
    (a1.min(b1) - a0.max(b0)).max(0.0)
}

/// Loads the chunks of a ServeGen folder (optionally only `only`), sorted
/// by chunk id.
///
/// # Errors
/// A missing folder, a chunk without both files, or malformed content,
/// naming the file and line.
pub fn load(dir: &Path, only: Option<&[u32]>) -> Result<Vec<ServeGenClient>> {
    let entries = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
    let mut ids = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(id) = name
            .strip_prefix("chunk-")
            .and_then(|r| r.strip_suffix("-trace.csv"))
            .and_then(|n| n.parse::<u32>().ok())
        {
            ids.push(id);
        }
    }
    ids.sort_unstable();
    if let Some(only) = only {
        for want in only {
            if !ids.contains(want) {
                return Err(Error::in_file(
                    dir,
                    format!("no chunk-{want}-trace.csv in this folder"),
                ));
            }
        }
        ids.retain(|i| only.contains(i));
    }
    if ids.is_empty() {
        return Err(Error::in_file(
            dir,
            "no chunk-*-trace.csv files (is this a ServeGen data folder?)",
        ));
    }
    ids.into_iter()
        .map(|id| {
            let trace = dir.join(format!("chunk-{id}-trace.csv"));
            let dataset = dir.join(format!("chunk-{id}-dataset.json"));
            Ok(ServeGenClient {
                chunk_id: id,
                windows: read_trace_windows(&trace)?,
                datasets: read_datasets(&dataset)?,
            })
        })
        .collect()
}

fn read_trace_windows(path: &Path) -> Result<Vec<TraceWindow>> {
    let text = crate::text::read_text(path).map_err(|e| Error::io(path, e))?;
    let mut rows: Vec<TraceWindow> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line_no = i as u64 + 1;
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let cols: Vec<&str> = line.split(',').map(str::trim).collect();
        if cols.len() < 6 {
            return Err(Error::invalid(
                Location::line(path, line_no),
                format!(
                    "expected 6 columns (start, rate, cv, pattern, shape, scale), found {}",
                    cols.len()
                ),
            ));
        }
        let num = |c: usize, name: &str| -> Result<f64> {
            let v: f64 = cols[c].parse().map_err(|_| {
                Error::invalid(
                    Location::at(path, line_no, c as u64 + 1),
                    format!("{name}: invalid number {:?}", cols[c]),
                )
            })?;
            if !v.is_finite() || v < 0.0 {
                return Err(Error::invalid(
                    Location::at(path, line_no, c as u64 + 1),
                    format!(
                        "{name}: must be a finite non-negative number, got {}",
                        crate::shown::Num(v)
                    ),
                ));
            }
            Ok(v)
        };
        let family = match cols[3] {
            "" => None,
            "Gamma" | "gamma" => Some(ArrivalProcess::Gamma),
            "Weibull" | "weibull" => Some(ArrivalProcess::Weibull),
            "Exponential" | "Poisson" => Some(ArrivalProcess::Poisson),
            other => {
                return Err(Error::invalid(
                    Location::at(path, line_no, 4),
                    format!("pattern: unknown arrival pattern {other:?} (Gamma, Weibull or empty)"),
                ));
            }
        };
        let rate = num(1, "rate")?;
        if rate > MAX_WINDOW_RATE {
            return Err(Error::invalid(
                Location::at(path, line_no, 2),
                format!(
                    "rate: {rate:e} req/s is more than {MAX_WINDOW_RATE:e} (one client of a trace)"
                ),
            ));
        }
        let start_s = num(0, "start")?;
        if start_s > 9.0e9 {
            return Err(Error::invalid(
                Location::at(path, line_no, 1),
                format!("start: {start_s:e} s is beyond 285 years"),
            ));
        }
        rows.push(TraceWindow {
            start_s,
            duration_s: 0.0,
            rate,
            cv: num(2, "cv")?,
            family,
            shape: num(4, "shape")?,
            scale_s: num(5, "scale")?,
        });
    }
    rows.sort_by(|a, b| a.start_s.total_cmp(&b.start_s));
    let default_len = rows
        .windows(2)
        .map(|w| w[1].start_s - w[0].start_s)
        .find(|d| *d > 0.0)
        .unwrap_or(600.0);
    for i in 0..rows.len() {
        rows[i].duration_s = rows
            .get(i + 1)
            .map_or(default_len, |n| n.start_s - rows[i].start_s);
    }
    Ok(rows)
}

fn read_datasets(path: &Path) -> Result<Vec<DatasetWindow>> {
    let text = crate::text::read_text(path).map_err(|e| Error::io(path, e))?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
        Error::invalid(
            Location::at(path, e.line() as u64, e.column() as u64),
            format!("invalid JSON: {}", crate::error::json_message(&e)),
        )
    })?;
    let obj = v
        .as_object()
        .ok_or_else(|| Error::in_file(path, "expected a JSON object keyed by window start"))?;
    let mut out = Vec::with_capacity(obj.len());
    for (key, val) in obj {
        let start_s: f64 = key
            .parse()
            .map_err(|_| Error::in_file(path, format!("window key {key:?} is not a number")))?;
        let mut raw = BTreeMap::new();
        match val {
            serde_json::Value::Object(fields) => {
                for (f, lit) in fields {
                    let s = lit.as_str().ok_or_else(|| {
                        Error::in_file(
                            path,
                            format!("window {key}: {f}: expected a string PMF literal"),
                        )
                    })?;
                    if s.trim() != "{}" {
                        raw.insert(f.clone(), s.to_string());
                    }
                }
            }
            serde_json::Value::String(s) if s.trim() == "{}" => {}
            _ => {
                return Err(Error::in_file(
                    path,
                    format!("window {key}: expected an object of PMF strings"),
                ));
            }
        }
        let parsed = raw.keys().map(|k| (k.clone(), OnceLock::new())).collect();
        out.push(DatasetWindow {
            start_s,
            raw,
            parsed,
            path: path.to_path_buf(),
        });
    }
    out.sort_by(|a, b| a.start_s.total_cmp(&b.start_s));
    Ok(out)
}
