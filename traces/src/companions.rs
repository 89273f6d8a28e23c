//! The two optional companions of a request CSV: per-chunk arrival times
//! (the ITL companion) and the server's scraped Prometheus samples (the
//! metrics companion, long format).

use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;

use csv::ByteRecord;

use crate::csvio::{
    Cells, LineTrack, RowSink, csv_error, format_f64, push_field_quoted, record_line,
};
use crate::error::{Error, Location, Result};

/// One streamed chunk (SSE event) of a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkRecord {
    /// The request it belongs to.
    pub request_id: u64,
    /// 0-based position in the response's stream.
    pub chunk_index: u32,
    /// Arrival time: absolute Unix µs in real traces, the same clock as the
    /// request CSV's chunk times otherwise.
    pub timestamp_us: i64,
    /// Tokens the chunk carried, when known (e.g. from
    /// `continuous_usage_stats`, or the simulator).
    pub tokens: Option<u32>,
}

/// One Prometheus sample scraped from the server during a run.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricSample {
    /// When the scrape completed, absolute Unix µs (real) or run-relative.
    pub timestamp_us: i64,
    /// Metric name as exposed, e.g. `vllm:num_requests_running` or
    /// `vllm:e2e_request_latency_seconds_bucket`.
    pub name: String,
    /// Label set in Prometheus text form without braces, e.g.
    /// `model_name="m",le="0.5"`; empty when none.
    pub labels: String,
    /// Sample value (may be NaN or ±Inf, written as Prometheus spells them).
    pub value: f64,
}

const ITL_COLUMNS: [&str; 4] = ["request_id", "chunk_index", "timestamp_us", "tokens"];
const METRIC_COLUMNS: [&str; 4] = ["timestamp_us", "name", "labels", "value"];

/// Streams [`ChunkRecord`]s to an ITL companion CSV.
#[derive(Debug)]
pub struct ChunkWriter<W: Write = File> {
    sink: RowSink<W>,
    with_tokens: bool,
}

impl ChunkWriter<File> {
    /// Creates `path`; `with_tokens` adds the optional `tokens` column.
    ///
    /// # Errors
    /// I/O errors naming the file.
    pub fn create(path: &Path, with_tokens: bool) -> Result<Self> {
        let f = File::create(path).map_err(|e| Error::io(path, e))?;
        Self::new(f, path, with_tokens)
    }
}

impl<W: Write> ChunkWriter<W> {
    /// Wraps `out`, named `path` in errors.
    ///
    /// # Errors
    /// I/O errors naming the file.
    pub fn new(out: W, path: &Path, with_tokens: bool) -> Result<Self> {
        let cols = if with_tokens {
            &ITL_COLUMNS[..]
        } else {
            &ITL_COLUMNS[..3]
        };
        Ok(Self {
            sink: RowSink::new(out, path, cols)?,
            with_tokens,
        })
    }

    /// Makes every write reach the file before it returns.
    pub fn flush_every_row(mut self, yes: bool) -> Self {
        self.sink.flush_every_row = yes;
        self
    }

    /// Appends one chunk.
    ///
    /// # Errors
    /// I/O errors naming the file.
    pub fn write(&mut self, c: &ChunkRecord) -> Result<()> {
        let mut b = itoa::Buffer::new();
        self.sink.push_plain(b.format(c.request_id).as_bytes());
        self.sink.push_plain(b.format(c.chunk_index).as_bytes());
        self.sink.push_plain(b.format(c.timestamp_us).as_bytes());
        if self.with_tokens {
            match c.tokens {
                Some(t) => self.sink.push_plain(b.format(t).as_bytes()),
                None => self.sink.push_plain(b""),
            }
        }
        self.sink.end_row()
    }

    /// Appends several chunks.
    ///
    /// # Errors
    /// I/O errors naming the file.
    pub fn write_all(&mut self, chunks: &[ChunkRecord]) -> Result<()> {
        for c in chunks {
            self.write(c)?;
        }
        Ok(())
    }

    /// Writes buffered rows to the file.
    ///
    /// # Errors
    /// I/O errors naming the file.
    pub fn flush(&mut self) -> Result<()> {
        self.sink.flush()
    }

    /// Flushes and returns the inner writer.
    ///
    /// # Errors
    /// I/O errors naming the file.
    pub fn finish(self) -> Result<W> {
        self.sink.finish()
    }
}

/// Streams [`MetricSample`]s to a metrics companion CSV.
#[derive(Debug)]
pub struct MetricWriter<W: Write = File> {
    sink: RowSink<W>,
    /// The last label set written and its CSV form (a scrape repeats it).
    labels: (String, Vec<u8>),
    /// Metric names written and their CSV forms (scrapes repeat them, in
    /// the same order: `name_hint` is where the next one likely is).
    names: Vec<(String, Vec<u8>)>,
    name_hint: usize,
}

/// Metric names whose CSV form [`MetricWriter`] remembers.
const NAME_CACHE: usize = 256;

impl MetricWriter<File> {
    /// Creates `path`.
    ///
    /// # Errors
    /// I/O errors naming the file.
    pub fn create(path: &Path) -> Result<Self> {
        let f = File::create(path).map_err(|e| Error::io(path, e))?;
        Self::new(f, path)
    }
}

impl<W: Write> MetricWriter<W> {
    /// Wraps `out`, named `path` in errors.
    ///
    /// # Errors
    /// I/O errors naming the file.
    pub fn new(out: W, path: &Path) -> Result<Self> {
        Ok(Self {
            sink: RowSink::new(out, path, &METRIC_COLUMNS)?,
            labels: (String::new(), Vec::new()),
            names: Vec::new(),
            name_hint: 0,
        })
    }

    /// Appends `name` in CSV form, remembered from earlier rows.
    fn push_name(&mut self, name: &str) {
        let n = self.names.len();
        for k in 0..n {
            let i = (self.name_hint + k) % n;
            if self.names[i].0 == name {
                self.name_hint = i + 1;
                self.sink.push_encoded(&self.names[i].1);
                return;
            }
        }
        if n < NAME_CACHE {
            let mut encoded = Vec::with_capacity(name.len());
            push_field_quoted(&mut encoded, name.as_bytes(), false);
            self.sink.push_encoded(&encoded);
            self.names.push((name.to_string(), encoded));
            self.name_hint = n + 1;
        } else {
            self.sink.push_quoted(name.as_bytes());
        }
    }

    /// Makes every write reach the file before it returns.
    pub fn flush_every_row(mut self, yes: bool) -> Self {
        self.sink.flush_every_row = yes;
        self
    }

    /// Appends one sample.
    ///
    /// # Errors
    /// I/O errors naming the file.
    pub fn write(&mut self, m: &MetricSample) -> Result<()> {
        self.write_parts(m.timestamp_us, &m.name, &m.labels, m.value)
    }

    /// Appends one sample given by its parts (no allocation).
    ///
    /// # Errors
    /// I/O errors naming the file.
    pub fn write_parts(
        &mut self,
        timestamp_us: i64,
        name: &str,
        labels: &str,
        value: f64,
    ) -> Result<()> {
        self.write_scrape(timestamp_us, labels, &[(name, value)])
    }

    /// Appends the samples of one scrape: `(name, value)` pairs sharing
    /// a timestamp (µs) and a label set, one row each, in order. Equal to
    /// as many [`MetricWriter::write_parts`] calls, formatting the shared
    /// parts once.
    ///
    /// # Errors
    /// I/O errors naming the file.
    pub fn write_scrape(
        &mut self,
        timestamp_us: i64,
        labels: &str,
        samples: &[(&str, f64)],
    ) -> Result<()> {
        let mut ts = itoa::Buffer::new();
        let ts = ts.format(timestamp_us).as_bytes();
        if self.labels.1.is_empty() || self.labels.0 != labels {
            self.labels.0.clear();
            self.labels.0.push_str(labels);
            self.labels.1.clear();
            push_field_quoted(&mut self.labels.1, labels.as_bytes(), false);
        }
        let mut b = itoa::Buffer::new();
        for &(name, value) in samples {
            self.sink.push_plain(ts);
            self.push_name(name);
            self.sink.push_encoded(&self.labels.1);
            // Integral values (counters, gauges of requests) print as
            // integers, as the shortest round-trip form does.
            if value.fract() == 0.0 && value.abs() < 9.0e15 && value != 0.0 {
                self.sink.push_plain(b.format(value as i64).as_bytes());
            } else {
                self.sink
                    .push_plain(format_prometheus_value(value).as_bytes());
            }
            self.sink.end_row()?;
        }
        Ok(())
    }

    /// Writes buffered rows to the file.
    ///
    /// # Errors
    /// I/O errors naming the file.
    pub fn flush(&mut self) -> Result<()> {
        self.sink.flush()
    }

    /// Flushes and returns the inner writer.
    ///
    /// # Errors
    /// I/O errors naming the file.
    pub fn finish(self) -> Result<W> {
        self.sink.finish()
    }
}

/// Formats a sample value as Prometheus does (`NaN`, `+Inf`, `-Inf`).
pub fn format_prometheus_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v == f64::INFINITY {
        "+Inf".into()
    } else if v == f64::NEG_INFINITY {
        "-Inf".into()
    } else {
        format_f64(v)
    }
}

/// Parses a sample value as Prometheus spells it.
pub fn parse_prometheus_value(s: &str) -> Option<f64> {
    match s {
        "NaN" | "nan" => Some(f64::NAN),
        "+Inf" | "Inf" | "inf" | "+inf" => Some(f64::INFINITY),
        "-Inf" | "-inf" => Some(f64::NEG_INFINITY),
        other => other.parse().ok(),
    }
}

/// A CSV reader that knows its records' true lines.
pub(crate) type TrackedReader<R> = csv::Reader<LineTrack<R>>;

pub(crate) fn open_csv<R: Read>(
    input: R,
    path: &Path,
    required: &[&str],
) -> Result<(TrackedReader<R>, Vec<Option<usize>>)> {
    let mut rdr = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .from_reader(LineTrack::new(input));
    let mut header = ByteRecord::new();
    if !rdr
        .read_byte_record(&mut header)
        .map_err(|e| csv_error(path, &e))?
    {
        return Err(Error::in_file(path, "empty file: no header row"));
    }
    let names: Vec<String> = header
        .iter()
        .map(|b| {
            String::from_utf8_lossy(b)
                .trim()
                .trim_start_matches('\u{feff}')
                .to_string()
        })
        .collect();
    let mut idx = Vec::new();
    for (i, want) in required.iter().enumerate() {
        let pos = names.iter().position(|n| n == want);
        // The last listed column of the ITL companion (`tokens`) is optional.
        if pos.is_none() && !(required == ITL_COLUMNS && i == 3) {
            return Err(Error::invalid(
                Location::line(path, 1),
                format!("{want}: required column missing from the header row"),
            ));
        }
        idx.push(pos);
    }
    Ok((rdr, idx))
}

/// Reads every data row of a CSV with the `required` columns (by name, in
/// any order), handing each to `row` with its cells and the columns'
/// positions; empty lines are skipped.
///
/// # Errors
/// I/O errors, a missing column, or `row`'s error.
pub(crate) fn read_rows<R: Read, T>(
    input: R,
    path: &Path,
    required: &[&str],
    mut row: impl FnMut(&Cells<'_>, &[Option<usize>]) -> Result<T>,
) -> Result<Vec<T>> {
    let (mut rdr, idx) = open_csv(input, path, required)?;
    let mut record = ByteRecord::new();
    let mut out = Vec::new();
    while rdr
        .read_byte_record(&mut record)
        .map_err(|e| csv_error(path, &e))?
    {
        if record.len() == 1 && record.get(0).is_some_and(<[u8]>::is_empty) {
            continue;
        }
        let line = record_line(&rdr, &record);
        let cx = Cells {
            row: &record,
            path,
            line,
        };
        out.push(row(&cx, &idx)?);
    }
    Ok(out)
}

/// Reads an ITL companion CSV.
///
/// # Errors
/// I/O errors; malformed cells naming file:line:column and the field.
pub fn read_chunks(path: &Path) -> Result<Vec<ChunkRecord>> {
    let f = File::open(path).map_err(|e| Error::io(path, e))?;
    read_chunks_from(f, path)
}

/// Reads an ITL companion from `input`, named `path` in errors.
///
/// # Errors
/// As [`read_chunks`].
pub fn read_chunks_from<R: Read>(input: R, path: &Path) -> Result<Vec<ChunkRecord>> {
    read_rows(input, path, &ITL_COLUMNS, |cx, idx| {
        let missing =
            |i: usize, name: &str| cx.err_named(idx[i], name, "missing value (truncated row?)");
        let request_id = cx
            .int_by_name::<u64>(idx[0], "request_id")?
            .ok_or_else(|| missing(0, "request_id"))?;
        let chunk_index = cx
            .int_by_name::<u32>(idx[1], "chunk_index")?
            .ok_or_else(|| missing(1, "chunk_index"))?;
        let timestamp_us = cx
            .int_by_name::<i64>(idx[2], "timestamp_us")?
            .ok_or_else(|| missing(2, "timestamp_us"))?;
        Ok(ChunkRecord {
            request_id,
            chunk_index,
            timestamp_us,
            tokens: cx.int_by_name::<u32>(idx[3], "tokens")?,
        })
    })
}

/// Reads a metrics companion CSV.
///
/// # Errors
/// I/O errors; malformed cells naming file:line:column and the field.
pub fn read_metrics(path: &Path) -> Result<Vec<MetricSample>> {
    let f = File::open(path).map_err(|e| Error::io(path, e))?;
    read_metrics_from(f, path)
}

/// Reads a metrics companion from `input`, named `path` in errors.
///
/// # Errors
/// As [`read_metrics`].
pub fn read_metrics_from<R: Read>(input: R, path: &Path) -> Result<Vec<MetricSample>> {
    read_rows(input, path, &METRIC_COLUMNS, |cx, idx| {
        let timestamp_us = cx
            .int_by_name::<i64>(idx[0], "timestamp_us")?
            .ok_or_else(|| {
                cx.err_named(idx[0], "timestamp_us", "missing value (truncated row?)")
            })?;
        let name = cx.text(idx[1]).to_string();
        if name.is_empty() {
            return Err(cx.err_named(idx[1], "name", "missing metric name"));
        }
        let raw = cx.text(idx[3]).trim();
        let value = parse_prometheus_value(raw)
            .ok_or_else(|| cx.err_named(idx[3], "value", &format!("invalid number {raw:?}")))?;
        Ok(MetricSample {
            timestamp_us,
            name,
            labels: cx.text(idx[2]).to_string(),
            value,
        })
    })
}
