//! A trace bundle on disk: `PREFIX.yaml` (header), `PREFIX.csv` (requests),
//! and optionally `PREFIX.itl.csv` (chunks) and `PREFIX.metrics.csv`
//! (scraped metrics).

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::companions::{
    ChunkRecord, ChunkWriter, MetricSample, MetricWriter, read_chunks_from, read_metrics_from,
};
use crate::csvio::{ExtraColumn, RecordReader, RecordWriter};
use crate::error::{Error, Result};
use crate::header::TraceHeader;
use crate::itl_steps::{
    ItlSteps, ItlTiming, StepsWriter, TokenRun, expand, read_runs_from, read_steps_from,
};
use crate::record::TraceRecord;

/// The files of one trace bundle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TracePaths {
    /// Header YAML.
    pub header: PathBuf,
    /// Request CSV.
    pub data: PathBuf,
    /// ITL companion.
    pub itl: PathBuf,
    /// Step table of an ITL companion in step form.
    pub steps: PathBuf,
    /// Metrics companion.
    pub metrics: PathBuf,
}

/// Reads an output prefix (`--out PREFIX`, written as `PREFIX.yaml`,
/// `PREFIX.csv`, ...): a path whose last part names the files. A folder
/// (`out/`, `.`, `..`, or nothing) is refused, since its files would be
/// hidden ones inside it (`out/.yaml`); a clap value parser.
///
/// # Errors
/// The message naming the prefix and a prefix that works.
pub fn output_prefix(s: &str) -> std::result::Result<PathBuf, String> {
    let p = PathBuf::from(s);
    let names_files = !s.ends_with(std::path::is_separator)
        && matches!(
            p.components().next_back(),
            Some(std::path::Component::Normal(_))
        );
    if names_files {
        return Ok(p);
    }
    let dir = match s.trim_end_matches(std::path::is_separator) {
        _ if s.is_empty() => ".",
        "" => "/",
        d => d,
    };
    Err(format!(
        "{s:?} is a folder, and an output prefix begins the names of the files written (PREFIX.csv, PREFIX.json, ...): give a name in it, e.g. {}",
        Path::new(dir).join("run").display()
    ))
}

impl TracePaths {
    /// The files written for `--out PREFIX`: `PREFIX.yaml`, `PREFIX.csv`,
    /// `PREFIX.itl.csv`, `PREFIX.metrics.csv`.
    pub fn from_prefix(prefix: impl AsRef<Path>) -> Self {
        let p = prefix.as_ref().as_os_str().to_string_lossy().into_owned();
        Self {
            header: PathBuf::from(format!("{p}.yaml")),
            data: PathBuf::from(format!("{p}.csv")),
            itl: PathBuf::from(format!("{p}.itl.csv")),
            steps: PathBuf::from(format!("{p}.steps.csv")),
            metrics: PathBuf::from(format!("{p}.metrics.csv")),
        }
    }

    /// The files of the bundle whose header is `header_path` (`X.yaml` or
    /// `X.yml`; a path without those extensions is taken as a prefix). Paths
    /// named in `header` (relative to the header's folder) win over the
    /// defaults.
    pub fn for_header(header_path: &Path, header: Option<&TraceHeader>) -> Self {
        let s = header_path.as_os_str().to_string_lossy();
        let prefix = s
            .strip_suffix(".yaml")
            .or_else(|| s.strip_suffix(".yml"))
            .unwrap_or(&s)
            .to_string();
        let mut paths = Self::from_prefix(&prefix);
        paths.header = header_path.to_path_buf();
        if !s.ends_with(".yaml") && !s.ends_with(".yml") {
            paths.header = PathBuf::from(format!("{prefix}.yaml"));
        }
        if let Some(h) = header {
            let dir = paths
                .header
                .parent()
                .map(Path::to_path_buf)
                .unwrap_or_default();
            // A header names its companions only as files beside it: a
            // path (absolute, `..`, a folder) is ignored for the derived
            // name, so that no header makes a tool read elsewhere.
            if let Some(d) = h.data_file.as_deref().and_then(plain_name) {
                paths.data = dir.join(d);
            }
            if let Some(d) = h.itl_file.as_deref().and_then(plain_name) {
                paths.itl = dir.join(d);
            }
            if let Some(d) = h.itl_steps.as_ref().and_then(|s| plain_name(&s.steps_file)) {
                paths.steps = dir.join(d);
            }
            if let Some(d) = h.metrics_file.as_deref().and_then(plain_name) {
                paths.metrics = dir.join(d);
            }
        }
        paths
    }
}

/// `name` when it is a plain file name (one normal path component), else
/// `None`.
fn plain_name(name: &str) -> Option<&str> {
    let mut parts = Path::new(name).components();
    match (parts.next(), parts.next()) {
        (Some(std::path::Component::Normal(_)), None) if !name.contains(['/', '\\']) => Some(name),
        _ => None,
    }
}

/// A whole trace in memory.
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    /// The header.
    pub header: TraceHeader,
    /// The requests, in file order.
    pub records: Vec<TraceRecord>,
    /// Streamed chunks, when the bundle has an ITL companion.
    pub chunks: Option<Vec<ChunkRecord>>,
    /// Scraped metrics, when the bundle has a metrics companion.
    pub metrics: Option<Vec<MetricSample>>,
    /// Base columns ([`crate::csvio::BASE_COLUMNS`]) that the request CSV
    /// read did not have: their values are unknown, not zero. Empty for a
    /// trace built in memory or imported.
    pub absent_columns: Vec<&'static str>,
}

impl Trace {
    /// A trace with no companions.
    pub fn new(header: TraceHeader, records: Vec<TraceRecord>) -> Self {
        Self {
            header,
            records,
            chunks: None,
            metrics: None,
            absent_columns: Vec::new(),
        }
    }

    /// Reads the bundle whose header is `header_path` (or whose prefix it
    /// is), with whichever companions exist.
    ///
    /// # Errors
    /// Any malformed file, named with line and column.
    ///
    /// A bundle whose writer did not finish (its header still says
    /// `incomplete: true`: killed mid-run) is read as far as it got: each
    /// file up to its last complete line, the partly written line after
    /// it dropped with a warning on stderr.
    pub fn read(header_path: &Path) -> Result<Self> {
        let guess = TracePaths::for_header(header_path, None);
        let header = TraceHeader::read(&guess.header)?;
        let paths = TracePaths::for_header(&guess.header, Some(&header));
        let cut = header.incomplete;
        if cut {
            crate::diag!(
                "warning: {}: the run that wrote this trace did not finish (killed, or still running): reading the rows it wrote",
                paths.header.display()
            );
        }
        let data = CompleteLines::open(&paths.data, cut)?;
        let (records, absent_columns) = if cut && data.is_empty() {
            // Killed before the header row reached the disk.
            (Vec::new(), Vec::new())
        } else {
            let mut reader = RecordReader::new(data, &paths.data)?;
            (reader.read_all()?, reader.absent_base_columns())
        };
        let chunks = if let Some(form) = &header.itl_steps {
            let runs = read_runs_from(CompleteLines::open(&paths.itl, cut)?, &paths.itl)?;
            let steps = read_steps_from(CompleteLines::open(&paths.steps, cut)?, &paths.steps)?;
            Some(expand(&steps, &runs, &form.timing, &paths.itl)?)
        } else if paths.itl.exists() {
            let f = CompleteLines::open(&paths.itl, cut)?;
            Some(if cut && f.is_empty() {
                Vec::new()
            } else {
                read_chunks_from(f, &paths.itl)?
            })
        } else {
            None
        };
        let metrics = if paths.metrics.exists() {
            let f = CompleteLines::open(&paths.metrics, cut)?;
            Some(if cut && f.is_empty() {
                Vec::new()
            } else {
                read_metrics_from(f, &paths.metrics)?
            })
        } else {
            None
        };
        Ok(Self {
            header,
            records,
            chunks,
            metrics,
            absent_columns,
        })
    }

    /// Writes the bundle at `--out PREFIX`. Companions are written when
    /// present. The header records the files' names.
    ///
    /// # Errors
    /// I/O errors naming the file.
    pub fn write(&self, prefix: &Path) -> Result<TracePaths> {
        let paths = TracePaths::from_prefix(prefix);
        let extras = ExtraColumn::needed_for(&self.records);
        let with_tokens = self
            .chunks
            .as_ref()
            .is_some_and(|c| c.iter().any(|c| c.tokens.is_some()));
        let mut w = TraceWriter::create(
            prefix,
            &self.header,
            &extras,
            self.chunks.is_some().then_some(with_tokens),
            self.metrics.is_some(),
        )?;
        for r in &self.records {
            w.write_record(r)?;
        }
        if let Some(chunks) = &self.chunks {
            for c in chunks {
                w.write_chunk(c)?;
            }
        }
        if let Some(metrics) = &self.metrics {
            for m in metrics {
                w.write_metric(m)?;
            }
        }
        w.finish(&self.header)?;
        Ok(paths)
    }
}

/// A file read whole, or (`cut`: its writer was killed) up to its last
/// newline, dropping a partly written last line with a warning.
struct CompleteLines {
    inner: std::io::Take<File>,
    len: u64,
}

impl CompleteLines {
    fn open(path: &Path, cut: bool) -> Result<Self> {
        let mut f = File::open(path).map_err(|e| Error::io(path, e))?;
        let total = f.metadata().map_err(|e| Error::io(path, e))?.len();
        let len = if cut {
            let keep = complete_len(&mut f, total).map_err(|e| Error::io(path, e))?;
            if keep < total {
                crate::diag!(
                    "warning: {}: dropped its partly written last line ({} bytes after the last complete one)",
                    path.display(),
                    total - keep
                );
            }
            keep
        } else {
            total
        };
        Ok(Self {
            inner: std::io::Read::take(f, len),
            len,
        })
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl std::io::Read for CompleteLines {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.inner.read(buf)
    }
}

/// Bytes of `f` (of `total`) up to and including its last newline; the
/// file is left at its start.
fn complete_len(f: &mut File, total: u64) -> std::io::Result<u64> {
    use std::io::{Read, Seek, SeekFrom};
    let mut end = total;
    let mut buf = vec![0u8; 64 * 1024];
    let keep = loop {
        if end == 0 {
            break 0;
        }
        let start = end.saturating_sub(buf.len() as u64);
        let n = (end - start) as usize;
        f.seek(SeekFrom::Start(start))?;
        f.read_exact(&mut buf[..n])?;
        if let Some(i) = buf[..n].iter().rposition(|&b| b == b'\n') {
            break start + i as u64 + 1;
        }
        end = start;
    };
    f.seek(SeekFrom::Start(0))?;
    Ok(keep)
}

/// Writes a bundle incrementally: the header first, rows as they come, and
/// the completed header at the end (replaced atomically).
#[derive(Debug)]
pub struct TraceWriter {
    paths: TracePaths,
    records: RecordWriter,
    chunks: Option<ChunkWriter>,
    steps: Option<(StepsWriter, ItlTiming)>,
    metrics: Option<MetricWriter>,
}

/// The form of a bundle's ITL companion.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ItlForm {
    /// None.
    None,
    /// One row per chunk (BLIS's form); `with_tokens` adds the `tokens`
    /// column.
    Rows {
        /// Whether to write the `tokens` column.
        with_tokens: bool,
    },
    /// The step form of a simulator ([`crate::itl_steps`]), with its
    /// output overheads.
    Steps(ItlTiming),
}

impl TraceWriter {
    /// Creates the bundle at `prefix`. `chunks`: `None` for no ITL
    /// companion, `Some(with_tokens)` for one; `metrics`: whether to write a
    /// metrics companion.
    ///
    /// # Errors
    /// I/O errors naming the file.
    pub fn create(
        prefix: &Path,
        header: &TraceHeader,
        extras: &[ExtraColumn],
        chunks: Option<bool>,
        metrics: bool,
    ) -> Result<Self> {
        let itl = match chunks {
            Some(with_tokens) => ItlForm::Rows { with_tokens },
            None => ItlForm::None,
        };
        Self::create_with(prefix, header, extras, itl, metrics)
    }

    /// As [`TraceWriter::create`], with the ITL companion in any form.
    ///
    /// # Errors
    /// I/O errors naming the file.
    pub fn create_with(
        prefix: &Path,
        header: &TraceHeader,
        extras: &[ExtraColumn],
        itl: ItlForm,
        metrics: bool,
    ) -> Result<Self> {
        let paths = TracePaths::from_prefix(prefix);
        if let Some(dir) = paths.header.parent()
            && !dir.as_os_str().is_empty()
        {
            std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        }
        let records = RecordWriter::create(&paths.data, extras)?;
        let (chunks, steps) = match itl {
            ItlForm::Rows { with_tokens } => {
                remove_stale(&paths.steps)?;
                (Some(ChunkWriter::create(&paths.itl, with_tokens)?), None)
            }
            ItlForm::Steps(timing) => (
                None,
                Some((StepsWriter::create(&paths.steps, &paths.itl)?, timing)),
            ),
            ItlForm::None => {
                remove_stale(&paths.itl)?;
                remove_stale(&paths.steps)?;
                (None, None)
            }
        };
        let metrics = if metrics {
            Some(MetricWriter::create(&paths.metrics)?)
        } else {
            remove_stale(&paths.metrics)?;
            None
        };
        let w = Self {
            paths,
            records,
            chunks,
            steps,
            metrics,
        };
        // Until `finish`, the header says the trace is being written.
        let mut first = header.clone();
        first.incomplete = true;
        w.write_header(&first)?;
        Ok(w)
    }

    /// Makes every row reach its file as soon as it is written (for live
    /// recording, so that a killed process loses nothing it recorded).
    pub fn flush_every_row(mut self, yes: bool) -> Self {
        self.records = self.records.flush_every_row(yes);
        self.chunks = self.chunks.map(|c| c.flush_every_row(yes));
        self.metrics = self.metrics.map(|m| m.flush_every_row(yes));
        self
    }

    /// The bundle's files.
    pub fn paths(&self) -> &TracePaths {
        &self.paths
    }

    fn write_header(&self, header: &TraceHeader) -> Result<()> {
        let mut h = header.clone();
        let file_name = |p: &Path| p.file_name().map(|n| n.to_string_lossy().into_owned());
        h.data_file = file_name(&self.paths.data);
        h.itl_file = if self.chunks.is_some() || self.steps.is_some() {
            file_name(&self.paths.itl)
        } else {
            None
        };
        h.itl_steps = self.steps.as_ref().map(|(_, timing)| ItlSteps {
            steps_file: file_name(&self.paths.steps).unwrap_or_default(),
            timing: *timing,
        });
        h.metrics_file = self
            .metrics
            .as_ref()
            .and_then(|_| file_name(&self.paths.metrics));
        write_atomic(&self.paths.header, h.to_yaml().as_bytes())
    }

    /// Appends a request row.
    ///
    /// # Errors
    /// I/O errors naming the file.
    pub fn write_record(&mut self, r: &TraceRecord) -> Result<()> {
        self.records.write(r)
    }

    /// Appends a chunk row (ignored when the bundle has no ITL companion).
    ///
    /// # Errors
    /// I/O errors naming the file.
    pub fn write_chunk(&mut self, c: &ChunkRecord) -> Result<()> {
        match &mut self.chunks {
            Some(w) => w.write(c),
            None => Ok(()),
        }
    }

    /// Appends a batch of steps of `instance` (ignored unless the ITL
    /// companion is in step form).
    ///
    /// # Errors
    /// I/O errors naming the file.
    pub fn write_steps(&mut self, instance: u32, first_step: u64, ends: &[i64]) -> Result<()> {
        match &mut self.steps {
            Some((w, _)) => w.write_steps(instance, first_step, ends),
            None => Ok(()),
        }
    }

    /// Appends a run of tokens (ignored unless the ITL companion is in
    /// step form).
    ///
    /// # Errors
    /// I/O errors naming the file.
    pub fn write_run(&mut self, r: &TokenRun) -> Result<()> {
        match &mut self.steps {
            Some((w, _)) => w.write_run(r),
            None => Ok(()),
        }
    }

    /// Appends a metric sample (ignored without a metrics companion).
    ///
    /// # Errors
    /// I/O errors naming the file.
    pub fn write_metric(&mut self, m: &MetricSample) -> Result<()> {
        match &mut self.metrics {
            Some(w) => w.write(m),
            None => Ok(()),
        }
    }

    /// Appends the samples of one scrape sharing a timestamp (µs) and a
    /// label set (ignored without a metrics companion); see
    /// [`MetricWriter::write_scrape`].
    ///
    /// # Errors
    /// I/O errors naming the file.
    pub fn write_metric_scrape(
        &mut self,
        timestamp_us: i64,
        labels: &str,
        samples: &[(&str, f64)],
    ) -> Result<()> {
        match &mut self.metrics {
            Some(w) => w.write_scrape(timestamp_us, labels, samples),
            None => Ok(()),
        }
    }

    /// Flushes every file.
    ///
    /// # Errors
    /// I/O errors naming the file.
    pub fn flush(&mut self) -> Result<()> {
        self.records.flush()?;
        if let Some(c) = &mut self.chunks {
            c.flush()?;
        }
        if let Some((s, _)) = &mut self.steps {
            s.flush()?;
        }
        if let Some(m) = &mut self.metrics {
            m.flush()?;
        }
        Ok(())
    }

    /// Rewrites the header (e.g. with final load-generator figures) and
    /// flushes every file.
    ///
    /// # Errors
    /// I/O errors naming the file.
    pub fn finish(mut self, header: &TraceHeader) -> Result<TracePaths> {
        self.flush()?;
        let mut h = header.clone();
        h.incomplete = false;
        self.write_header(&h)?;
        Ok(self.paths.clone())
    }
}

fn remove_stale(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(path, e)),
    }
}

/// Writes `bytes` to a temporary file beside `path` and renames it over
/// `path`, so readers never see a half-written file.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp~");
    {
        let mut f = File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
        f.write_all(bytes).map_err(|e| Error::io(&tmp, e))?;
        f.flush().map_err(|e| Error::io(&tmp, e))?;
    }
    std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    /// A prefix names files; a folder (trailing `/`, `.`, `..`, empty) is
    /// refused, with a prefix inside it that works.
    #[test]
    fn an_output_prefix_names_files_not_a_folder() {
        for ok in ["run", "out/run", "/tmp/x/run-0.9", "./run"] {
            assert_eq!(super::output_prefix(ok), Ok(PathBuf::from(ok)), "{ok}");
        }
        for (bad, hint) in [
            ("out/", "out/run"),
            ("/tmp/", "/tmp/run"),
            (".", "./run"),
            ("..", "../run"),
            ("", "./run"),
            ("out/..", "out/../run"),
            ("/", "/run"),
        ] {
            let e = super::output_prefix(bad).unwrap_err();
            assert!(
                e.contains("is a folder") && e.ends_with(hint),
                "{bad:?}: {e}"
            );
        }
    }
}
