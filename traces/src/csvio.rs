//! The request CSV: BLIS's 27 base columns in BLIS's order, then optional
//! extra columns located by name.
//!
//! Reading is by column name, so files with columns in another order, with
//! BLIS's optional `vllm_priority`/`slo_target_us`, or with unknown columns
//! all read; unknown columns are kept in [`TraceRecord::other`]. Writing puts
//! the base columns first in BLIS's order (BLIS's own reader is positional)
//! and the extras after them.
//!
//! Conventions shared with BLIS: an unknown time or `server_input_tokens` is
//! written as `0` (empty cells read as unknown too), `deadline_us` 0 means no
//! deadline, booleans are `true`/`false`.

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use csv::ByteRecord;

use crate::error::{Error, Location, Result};
use crate::record::{HashIds, SharedStr, Status, TraceRecord, empty_str};

/// The 27 base columns of a trace-v2 request CSV, in BLIS's order.
pub const BASE_COLUMNS: [&str; 27] = [
    "request_id",
    "client_id",
    "tenant_id",
    "slo_class",
    "session_id",
    "round_index",
    "prefix_group",
    "prefix_length",
    "streaming",
    "input_tokens",
    "output_tokens",
    "text_tokens",
    "image_tokens",
    "audio_tokens",
    "video_tokens",
    "reason_ratio",
    "model",
    "deadline_us",
    "server_input_tokens",
    "arrival_time_us",
    "send_time_us",
    "first_chunk_time_us",
    "last_chunk_time_us",
    "num_chunks",
    "status",
    "error_message",
    "finish_reason",
];

/// Optional columns this crate understands, written after the base columns.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ExtraColumn {
    /// `think_time_us`: think time before a later session round.
    ThinkTimeUs,
    /// `content_key`: explicit token-content identity.
    ContentKey,
    /// `hash_ids`: `;`-separated prefix-block ids (Mooncake).
    HashIds,
    /// `hash_block_tokens`: tokens per `hash_ids` block.
    HashBlockTokens,
    /// `http_status`: HTTP status code of the response.
    HttpStatus,
    /// `cached_tokens`: prompt tokens served from the prefix cache.
    CachedTokens,
    /// `x_request_id`: the request id header sent.
    XRequestId,
    /// Any other column, carried through from [`TraceRecord::other`].
    Other(String),
}

impl ExtraColumn {
    /// The column's name in the CSV header.
    pub fn name(&self) -> &str {
        match self {
            ExtraColumn::ThinkTimeUs => "think_time_us",
            ExtraColumn::ContentKey => "content_key",
            ExtraColumn::HashIds => "hash_ids",
            ExtraColumn::HashBlockTokens => "hash_block_tokens",
            ExtraColumn::HttpStatus => "http_status",
            ExtraColumn::CachedTokens => "cached_tokens",
            ExtraColumn::XRequestId => "x_request_id",
            ExtraColumn::Other(name) => name,
        }
    }

    fn from_name(name: &str) -> ExtraColumn {
        match name {
            "think_time_us" => ExtraColumn::ThinkTimeUs,
            "content_key" => ExtraColumn::ContentKey,
            "hash_ids" => ExtraColumn::HashIds,
            "hash_block_tokens" => ExtraColumn::HashBlockTokens,
            "http_status" => ExtraColumn::HttpStatus,
            "cached_tokens" => ExtraColumn::CachedTokens,
            "x_request_id" => ExtraColumn::XRequestId,
            other => ExtraColumn::Other(other.to_string()),
        }
    }

    /// The extra columns needed to write `records` without loss, in a
    /// canonical order (known columns first, then unknown ones by first
    /// appearance).
    pub fn needed_for<'a>(records: impl IntoIterator<Item = &'a TraceRecord>) -> Vec<ExtraColumn> {
        let mut t = ExtraColumnTally::default();
        for r in records {
            t.add(r);
        }
        t.columns()
    }
}

/// [`ExtraColumn::needed_for`] one record at a time, for records that are
/// generated rather than held.
#[derive(Debug, Clone, Default)]
pub struct ExtraColumnTally {
    known: [bool; 7],
    other: Vec<String>,
}

impl ExtraColumnTally {
    /// Notes the columns `r` needs.
    pub fn add(&mut self, r: &TraceRecord) {
        let known = &mut self.known;
        known[0] |= r.request.think_time_us.is_some();
        known[1] |= r.request.content_key.is_some();
        known[2] |= r.request.hash_ids.is_some();
        known[3] |= r.request.hash_ids.is_some();
        known[4] |= r.outcome.http_status.is_some();
        known[5] |= r.outcome.cached_tokens.is_some();
        known[6] |= r.outcome.x_request_id.is_some();
        for (name, _) in &r.other {
            if !self.other.iter().any(|o| o == name) {
                self.other.push(name.clone());
            }
        }
    }

    /// The columns needed by the records added, in the canonical order.
    pub fn columns(self) -> Vec<ExtraColumn> {
        let all = [
            ExtraColumn::ThinkTimeUs,
            ExtraColumn::ContentKey,
            ExtraColumn::HashIds,
            ExtraColumn::HashBlockTokens,
            ExtraColumn::HttpStatus,
            ExtraColumn::CachedTokens,
            ExtraColumn::XRequestId,
        ];
        let mut cols: Vec<ExtraColumn> = all
            .into_iter()
            .zip(self.known)
            .filter_map(|(c, k)| k.then_some(c))
            .collect();
        cols.extend(self.other.into_iter().map(ExtraColumn::Other));
        cols
    }
}

/// BLIS's positional reader expects these optional columns at fixed places:
/// `vllm_priority` right after `slo_class`, `slo_target_us` right after
/// `deadline_us`. Written anywhere else they would shift its parse.
const BLIS_POSITIONAL: [(&str, &str); 2] = [
    ("vllm_priority", "slo_class"),
    ("slo_target_us", "deadline_us"),
];

#[derive(Debug, Clone)]
enum Col {
    Base(usize),
    Extra(ExtraColumn),
}

fn layout(extras: &[ExtraColumn]) -> Vec<Col> {
    let mut cols = Vec::with_capacity(BASE_COLUMNS.len() + extras.len());
    let positional = |name: &str| {
        extras
            .iter()
            .find(|e| matches!(e, ExtraColumn::Other(n) if n == name))
            .cloned()
    };
    for (i, name) in BASE_COLUMNS.iter().enumerate() {
        cols.push(Col::Base(i));
        for (opt, after) in BLIS_POSITIONAL {
            if *name == after
                && let Some(e) = positional(opt)
            {
                cols.push(Col::Extra(e));
            }
        }
    }
    for e in extras {
        let is_positional =
            matches!(e, ExtraColumn::Other(n) if BLIS_POSITIONAL.iter().any(|(p, _)| p == n));
        if !is_positional {
            cols.push(Col::Extra(e.clone()));
        }
    }
    cols
}

const FLUSH_BYTES: usize = 64 * 1024;

/// A CSV writer that only ever hands whole rows to the file.
#[derive(Debug)]
pub(crate) struct RowSink<W: Write> {
    out: Option<W>,
    path: PathBuf,
    buf: Vec<u8>,
    pub(crate) row: ByteRecord,
    pub(crate) flush_every_row: bool,
    plain_fields: usize,
}

impl<W: Write> RowSink<W> {
    pub(crate) fn new(out: W, path: &Path, header: &[&str]) -> Result<Self> {
        let mut s = Self {
            out: Some(out),
            path: path.to_path_buf(),
            buf: Vec::with_capacity(FLUSH_BYTES + 1024),
            row: ByteRecord::new(),
            flush_every_row: false,
            plain_fields: 0,
        };
        for h in header {
            s.row.push_field(h.as_bytes());
        }
        encode_row(&mut s.buf, &s.row);
        s.row.clear();
        s.flush()?;
        Ok(s)
    }

    /// Appends a field that needs no quoting (digits, names without
    /// commas, quotes or line breaks) straight to the buffer; a row of such
    /// fields ends with [`RowSink::end_row`].
    pub(crate) fn push_plain(&mut self, field: &[u8]) {
        debug_assert!(
            !field
                .iter()
                .any(|&b| matches!(b, b',' | b'"' | b'\n' | b'\r'))
        );
        if self.plain_fields > 0 {
            self.buf.push(b',');
        }
        self.buf.extend_from_slice(field);
        self.plain_fields += 1;
    }

    /// Appends an integer field (digits and a sign need no quoting).
    pub(crate) fn push_int<T: itoa::Integer>(&mut self, v: T) {
        self.push_plain(itoa::Buffer::new().format(v).as_bytes());
    }

    /// Appends integers joined by `sep` as one field (digits, signs and
    /// the separator need no quoting; empty for none).
    pub(crate) fn push_joined_ints<T: itoa::Integer + Copy>(&mut self, vs: &[T], sep: u8) {
        if self.plain_fields > 0 {
            self.buf.push(b',');
        }
        let mut b = itoa::Buffer::new();
        for (i, v) in vs.iter().enumerate() {
            if i > 0 {
                self.buf.push(sep);
            }
            self.buf.extend_from_slice(b.format(*v).as_bytes());
        }
        self.plain_fields += 1;
    }

    /// Appends a field already in CSV form (quoted where it needs it).
    pub(crate) fn push_encoded(&mut self, field: &[u8]) {
        if self.plain_fields > 0 {
            self.buf.push(b',');
        }
        self.buf.extend_from_slice(field);
        self.plain_fields += 1;
    }

    /// Appends a field in RFC 4180 form (quoted when needed) straight to
    /// the buffer.
    pub(crate) fn push_quoted(&mut self, field: &[u8]) {
        if self.plain_fields > 0 {
            self.buf.push(b',');
        }
        push_field_quoted(&mut self.buf, field, false);
        self.plain_fields += 1;
    }

    /// Ends the row of the fields pushed since the last one.
    pub(crate) fn end_row(&mut self) -> Result<()> {
        self.buf.push(b'\n');
        self.plain_fields = 0;
        if self.flush_every_row || self.buf.len() >= FLUSH_BYTES {
            self.flush()?;
        }
        Ok(())
    }

    pub(crate) fn flush(&mut self) -> Result<()> {
        let Some(out) = self.out.as_mut() else {
            return Ok(());
        };
        if !self.buf.is_empty() {
            out.write_all(&self.buf)
                .map_err(|e| Error::io(&self.path, e))?;
            self.buf.clear();
        }
        out.flush().map_err(|e| Error::io(&self.path, e))
    }

    pub(crate) fn finish(mut self) -> Result<W> {
        self.flush()?;
        Ok(self.out.take().expect("writer present until finish"))
    }
}

impl<W: Write> Drop for RowSink<W> {
    fn drop(&mut self) {
        let _ = self.flush();
    }
}

/// Streams trace records to a CSV.
///
/// Rows are serialized into a buffer that is written to the file only at row
/// boundaries, so a process killed at any time leaves whole rows. With
/// [`RecordWriter::flush_every_row`] each row reaches the file as soon as it
/// is written (what a live load generator wants).
#[derive(Debug)]
pub struct RecordWriter<W: Write = File> {
    sink: RowSink<W>,
    columns: Vec<Col>,
    rows: u64,
}

impl RecordWriter<File> {
    /// Creates (truncates) `path` and writes the column header.
    ///
    /// # Errors
    /// I/O errors naming the file.
    pub fn create(path: &Path, extras: &[ExtraColumn]) -> Result<Self> {
        let file = File::create(path).map_err(|e| Error::io(path, e))?;
        Self::new(file, path, extras)
    }
}

impl<W: Write> RecordWriter<W> {
    /// Wraps `out` (named `path` in errors) and writes the column header.
    ///
    /// # Errors
    /// I/O errors naming the file.
    pub fn new(out: W, path: &Path, extras: &[ExtraColumn]) -> Result<Self> {
        let columns = layout(extras);
        let names: Vec<&str> = columns
            .iter()
            .map(|c| match c {
                Col::Base(i) => BASE_COLUMNS[*i],
                Col::Extra(e) => e.name(),
            })
            .collect();
        Ok(Self {
            sink: RowSink::new(out, path, &names)?,
            columns,
            rows: 0,
        })
    }

    /// Makes every [`RecordWriter::write`] reach the file before it returns.
    pub fn flush_every_row(mut self, yes: bool) -> Self {
        self.sink.flush_every_row = yes;
        self
    }

    /// Rows written so far.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Appends one record.
    ///
    /// # Errors
    /// I/O errors naming the file.
    pub fn write(&mut self, rec: &TraceRecord) -> Result<()> {
        let r = &rec.request;
        let o = &rec.outcome;
        // Fields go straight into the buffer: integers as they are (digits
        // and a sign never need quotes), text quoted where RFC 4180 needs
        // it.
        let f = &mut self.sink;
        for col in &self.columns {
            match col {
                Col::Base(i) => match *i {
                    0 => f.push_int(r.request_id),
                    1 => f.push_quoted(r.client_id.as_bytes()),
                    2 => f.push_quoted(r.tenant_id.as_bytes()),
                    3 => f.push_quoted(r.slo_class.as_bytes()),
                    4 => f.push_quoted(r.session_id.as_bytes()),
                    5 => f.push_int(r.round_index),
                    6 => f.push_quoted(r.prefix_group.as_bytes()),
                    7 => f.push_int(r.prefix_length),
                    8 => f.push_plain(if r.streaming { b"true" } else { b"false" }),
                    9 => f.push_int(r.input_tokens),
                    10 => f.push_int(r.output_tokens),
                    11 => f.push_int(r.text_tokens),
                    12 => f.push_int(r.image_tokens),
                    13 => f.push_int(r.audio_tokens),
                    14 => f.push_int(r.video_tokens),
                    15 => f.push_plain(format_f64(r.reason_ratio).as_bytes()),
                    16 => f.push_quoted(r.model.as_bytes()),
                    17 => f.push_int(r.deadline_us.unwrap_or(0)),
                    18 => f.push_int(o.server_input_tokens.unwrap_or(0)),
                    19 => f.push_int(r.arrival_time_us),
                    20 => f.push_int(o.send_time_us.unwrap_or(0)),
                    21 => f.push_int(o.first_chunk_time_us.unwrap_or(0)),
                    22 => f.push_int(o.last_chunk_time_us.unwrap_or(0)),
                    23 => f.push_int(o.num_chunks),
                    24 => f.push_plain(o.status.map(Status::as_str).unwrap_or("").as_bytes()),
                    25 => f.push_quoted(o.error_message.as_bytes()),
                    _ => f.push_quoted(o.finish_reason.as_bytes()),
                },
                Col::Extra(e) => match e {
                    ExtraColumn::ThinkTimeUs => push_opt(f, r.think_time_us),
                    ExtraColumn::ContentKey => push_opt(f, r.content_key),
                    ExtraColumn::HashIds => {
                        let ids: &[u64] = r.hash_ids.as_ref().map_or(&[], |h| &h.ids);
                        f.push_joined_ints(ids, b';');
                    }
                    ExtraColumn::HashBlockTokens => {
                        push_opt(f, r.hash_ids.as_ref().map(|h| h.block_tokens))
                    }
                    ExtraColumn::HttpStatus => push_opt(f, o.http_status),
                    ExtraColumn::CachedTokens => push_opt(f, o.cached_tokens),
                    ExtraColumn::XRequestId => {
                        f.push_quoted(o.x_request_id.as_deref().unwrap_or("").as_bytes())
                    }
                    ExtraColumn::Other(name) => {
                        let v = rec
                            .other
                            .iter()
                            .find(|(n, _)| n == name)
                            .map(|(_, v)| v.as_str())
                            .unwrap_or("");
                        f.push_quoted(v.as_bytes());
                    }
                },
            }
        }
        f.end_row()?;
        self.rows += 1;
        Ok(())
    }

    /// Writes buffered whole rows to the file and flushes it.
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

/// An integer field of `f`, empty for `None`.
fn push_opt<W: Write, T: itoa::Integer>(f: &mut RowSink<W>, v: Option<T>) {
    match v {
        Some(v) => f.push_int(v),
        None => f.push_plain(b""),
    }
}

/// Shortest round-trip decimal for a float; never exponent notation
/// (as Go's `strconv.FormatFloat(v, 'f', -1, 64)`, which BLIS uses).
pub(crate) fn format_f64(v: f64) -> String {
    if v == 0.0 {
        return "0".to_string();
    }
    format!("{v}")
}

/// Appends one CSV row (RFC 4180 quoting where needed, `\n` terminated).
pub(crate) fn encode_row(buf: &mut Vec<u8>, row: &ByteRecord) {
    for (i, field) in row.iter().enumerate() {
        if i > 0 {
            buf.push(b',');
        }
        push_field_quoted(buf, field, row.len() == 1);
    }
    buf.push(b'\n');
}

/// Appends one field, quoted when RFC 4180 needs it (a comma, quote or line
/// break, leading or trailing space; an empty field when it is the row's
/// only one).
pub(crate) fn push_field_quoted(buf: &mut Vec<u8>, field: &[u8], only_field: bool) {
    let needs_quotes = field.is_empty() && only_field
        // Every special byte is at most b',' (0x2C): one comparison for
        // the letters and digits that make up nearly every field.
        || field
            .iter()
            .any(|&b| b <= b',' && matches!(b, b',' | b'"' | b'\n' | b'\r'))
        || field.first() == Some(&b' ')
        || field.last() == Some(&b' ');
    if needs_quotes {
        buf.push(b'"');
        for &b in field {
            if b == b'"' {
                buf.push(b'"');
            }
            buf.push(b);
        }
        buf.push(b'"');
    } else {
        buf.extend_from_slice(field);
    }
}

/// The largest time (and duration) a trace may hold, µs: 2^53 (285
/// years; Unix µs today are about 1.8·10^15). Larger ones are refused, so
/// that adding delays to them never overflows.
pub const MAX_TIME_US: i64 = 1 << 53;

/// A reader that remembers where its newlines are, so that a record's byte
/// offset gives its true 1-based line (the csv crate miscounts lines in
/// CRLF files).
#[derive(Debug)]
pub(crate) struct LineTrack<R> {
    inner: R,
    offset: u64,
    newlines: std::cell::RefCell<std::collections::VecDeque<u64>>,
    base_line: std::cell::Cell<u64>,
}

impl<R: Read> LineTrack<R> {
    pub(crate) fn new(inner: R) -> Self {
        Self {
            inner,
            offset: 0,
            newlines: Default::default(),
            base_line: std::cell::Cell::new(1),
        }
    }

    /// The 1-based line of a record starting at byte `offset` (the csv crate
    /// reports a CRLF record as starting at the `\n` before it, hence `<=`);
    /// offsets must be asked in
    /// non-decreasing order.
    pub(crate) fn line_at(&self, offset: u64) -> u64 {
        let mut q = self.newlines.borrow_mut();
        while q.front().is_some_and(|&nl| nl <= offset) {
            q.pop_front();
            self.base_line.set(self.base_line.get() + 1);
        }
        self.base_line.get()
    }
}

impl<R: Read> Read for LineTrack<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        let mut q = self.newlines.borrow_mut();
        for (i, b) in buf[..n].iter().enumerate() {
            if *b == b'\n' {
                q.push_back(self.offset + i as u64);
            }
        }
        self.offset += n as u64;
        Ok(n)
    }
}

/// The true line of the record just read by `rdr`.
pub(crate) fn record_line<R: Read>(rdr: &csv::Reader<LineTrack<R>>, row: &ByteRecord) -> u64 {
    row.position()
        .map_or(0, |p| rdr.get_ref().line_at(p.byte()))
}

/// Column positions of a request CSV, resolved by name from its header.
#[derive(Debug, Clone)]
struct ColumnMap {
    base: [Option<usize>; 27],
    extra: Vec<(usize, ExtraColumn)>,
    width: usize,
}

impl ColumnMap {
    fn from_header(path: &Path, header: &ByteRecord) -> Result<Self> {
        let mut base = [None; 27];
        let mut extra = Vec::new();
        for (idx, raw) in header.iter().enumerate() {
            let name = std::str::from_utf8(raw)
                .map_err(|_| {
                    Error::invalid(
                        Location::at(path, 1, idx as u64 + 1),
                        "column name is not UTF-8",
                    )
                })?
                .trim()
                .trim_start_matches('\u{feff}');
            if let Some(pos) = BASE_COLUMNS.iter().position(|c| *c == name) {
                if base[pos].is_some() {
                    return Err(Error::invalid(
                        Location::at(path, 1, idx as u64 + 1),
                        format!("{name}: duplicate column"),
                    ));
                }
                base[pos] = Some(idx);
            } else {
                extra.push((idx, ExtraColumn::from_name(name)));
            }
        }
        for required in [
            "request_id",
            "input_tokens",
            "output_tokens",
            "arrival_time_us",
        ] {
            let pos = BASE_COLUMNS
                .iter()
                .position(|c| *c == required)
                .unwrap_or(0);
            if base[pos].is_none() {
                return Err(Error::invalid(
                    Location::line(path, 1),
                    format!("{required}: required column missing from the header row"),
                ));
            }
        }
        Ok(Self {
            base,
            extra,
            width: header.len(),
        })
    }

    /// The extra columns, in file order.
    fn extras(&self) -> Vec<ExtraColumn> {
        self.extra.iter().map(|(_, e)| e.clone()).collect()
    }
}

/// Interns repeated label strings so that a million rows share a handful of
/// allocations.
#[derive(Debug, Default)]
struct Interner {
    recent: Vec<SharedStr>,
}

impl Interner {
    fn get(&mut self, s: &str) -> SharedStr {
        if s.is_empty() {
            return empty_str();
        }
        if let Some(hit) = self.recent.iter().find(|x| &***x == s) {
            return hit.clone();
        }
        let a: SharedStr = Arc::from(s);
        if self.recent.len() >= 64 {
            self.recent.remove(0);
        }
        self.recent.push(a.clone());
        a
    }
}

/// Reads trace records from a request CSV, one at a time.
#[derive(Debug)]
pub struct RecordReader<R: Read = File> {
    inner: csv::Reader<LineTrack<R>>,
    path: PathBuf,
    map: ColumnMap,
    row: ByteRecord,
    interner: Interner,
}

impl RecordReader<File> {
    /// Opens a request CSV and reads its header row.
    ///
    /// # Errors
    /// I/O errors; a header without `request_id`, `input_tokens`,
    /// `output_tokens` or `arrival_time_us`.
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        Self::new(file, path)
    }
}

impl<R: Read> RecordReader<R> {
    /// Reads from `input`, naming it `path` in errors.
    ///
    /// # Errors
    /// As [`RecordReader::open`].
    pub fn new(input: R, path: &Path) -> Result<Self> {
        let mut inner = csv::ReaderBuilder::new()
            .has_headers(false)
            .flexible(true)
            .from_reader(LineTrack::new(input));
        let mut header = ByteRecord::new();
        let got = inner
            .read_byte_record(&mut header)
            .map_err(|e| csv_error(path, &e))?;
        if !got {
            return Err(Error::in_file(path, "empty file: no header row"));
        }
        let map = ColumnMap::from_header(path, &header)?;
        Ok(Self {
            inner,
            path: path.to_path_buf(),
            map,
            row: ByteRecord::new(),
            interner: Interner::default(),
        })
    }

    /// The extra (non-base) columns of the file, in file order.
    pub fn extra_columns(&self) -> Vec<ExtraColumn> {
        self.map.extras()
    }

    /// The base columns the file does not have, in [`BASE_COLUMNS`] order:
    /// their values read as unknown.
    pub fn absent_base_columns(&self) -> Vec<&'static str> {
        BASE_COLUMNS
            .iter()
            .zip(&self.map.base)
            .filter(|(_, pos)| pos.is_none())
            .map(|(name, _)| *name)
            .collect()
    }

    /// Reads the next record; `Ok(None)` at the end of the file.
    ///
    /// # Errors
    /// A row with the wrong number of fields (e.g. a truncated file) or a
    /// cell that does not parse, naming file:line:column and the field.
    pub fn next_record(&mut self) -> Result<Option<TraceRecord>> {
        let Some(line) = self.next_row()? else {
            return Ok(None);
        };
        let cx = Cells {
            row: &self.row,
            path: &self.path,
            line,
        };
        let mut rec = TraceRecord::default();
        let b = &self.map.base;
        let get = |i: usize| b[i];
        {
            let r = &mut rec.request;
            r.request_id = cx.int(get(0), 0)?.unwrap_or(0);
            r.client_id = cx.shared(get(1), 1, &mut self.interner)?;
            r.tenant_id = cx.shared(get(2), 2, &mut self.interner)?;
            r.slo_class = cx.shared(get(3), 3, &mut self.interner)?;
            r.session_id = cx.shared(get(4), 4, &mut self.interner)?;
            r.round_index = cx.int(get(5), 5)?.unwrap_or(0);
            r.prefix_group = cx.shared(get(6), 6, &mut self.interner)?;
            r.prefix_length = cx.int(get(7), 7)?.unwrap_or(0);
            r.streaming = cx.boolean(get(8), 8)?;
            r.input_tokens = cx.int(get(9), 9)?.unwrap_or(0);
            r.output_tokens = cx.int(get(10), 10)?.unwrap_or(0);
            r.text_tokens = cx.int(get(11), 11)?.unwrap_or(0);
            r.image_tokens = cx.int(get(12), 12)?.unwrap_or(0);
            r.audio_tokens = cx.int(get(13), 13)?.unwrap_or(0);
            r.video_tokens = cx.int(get(14), 14)?.unwrap_or(0);
            r.reason_ratio = cx.float(get(15), 15)?.unwrap_or(0.0);
            if !(0.0..=1.0).contains(&r.reason_ratio) {
                return Err(cx.err(get(15), 15, "must be within [0, 1]"));
            }
            r.model = cx.shared(get(16), 16, &mut self.interner)?;
            r.deadline_us = cx.time(get(17), BASE_COLUMNS[17])?.filter(|v| *v != 0);
            r.arrival_time_us = cx.time(get(19), BASE_COLUMNS[19])?.unwrap_or(0);
        }
        {
            let o = &mut rec.outcome;
            o.server_input_tokens = cx.int::<u32>(get(18), 18)?.filter(|v| *v != 0);
            o.send_time_us = cx.time(get(20), BASE_COLUMNS[20])?.filter(|v| *v != 0);
            o.first_chunk_time_us = cx.time(get(21), BASE_COLUMNS[21])?.filter(|v| *v != 0);
            o.last_chunk_time_us = cx.time(get(22), BASE_COLUMNS[22])?.filter(|v| *v != 0);
            o.num_chunks = cx.int(get(23), 23)?.unwrap_or(0);
            o.status = match cx.text(get(24)) {
                "" => None,
                s => Some(s.parse::<Status>().map_err(|m| cx.err(get(24), 24, &m))?),
            };
            o.error_message = cx.text(get(25)).to_string();
            o.finish_reason = cx.text(get(26)).to_string();
        }
        read_extras(&cx, &self.map.extra, &mut rec)?;
        Ok(Some(rec))
    }

    /// Reads the next non-blank row into `self.row`; its line, or `None`
    /// at the end of the file.
    ///
    /// # Errors
    /// A malformed row, or one whose field count differs from the
    /// header's (e.g. a truncated file).
    fn next_row(&mut self) -> Result<Option<u64>> {
        loop {
            let got = self
                .inner
                .read_byte_record(&mut self.row)
                .map_err(|e| csv_error(&self.path, &e))?;
            if !got {
                return Ok(None);
            }
            // Skip blank lines (a trailing CRLF artefact).
            if self.row.len() == 1 && self.row.get(0).is_some_and(|f| f.is_empty()) {
                continue;
            }
            break;
        }
        let line = record_line(&self.inner, &self.row);
        if self.row.len() != self.map.width {
            return Err(Error::invalid(
                Location::line(&self.path, line),
                format!(
                    "expected {} fields as in the header, found {} (truncated or malformed row)",
                    self.map.width,
                    self.row.len()
                ),
            ));
        }
        Ok(Some(line))
    }

    /// Reads every remaining record.
    ///
    /// # Errors
    /// As [`RecordReader::next_record`].
    pub fn read_all(&mut self) -> Result<Vec<TraceRecord>> {
        let mut out = Vec::new();
        while let Some(r) = self.next_record()? {
            out.push(r);
        }
        Ok(out)
    }
}

impl<R: Read> Iterator for RecordReader<R> {
    type Item = Result<TraceRecord>;
    fn next(&mut self) -> Option<Self::Item> {
        self.next_record().transpose()
    }
}

pub(crate) fn csv_error(path: &Path, e: &csv::Error) -> Error {
    match e.kind() {
        csv::ErrorKind::Io(io) => Error::io(path, io::Error::new(io.kind(), io.to_string())),
        csv::ErrorKind::Utf8 { pos, err } => Error::invalid(
            match pos {
                Some(p) => Location::at(path, p.line(), err.field() as u64 + 1),
                None => Location::file(path),
            },
            "invalid UTF-8",
        ),
        _ => match e.position() {
            Some(p) => Error::invalid(Location::line(path, p.line()), e.to_string()),
            None => Error::in_file(path, e.to_string()),
        },
    }
}

/// Reads a row's optional columns (`extra`: index and column) into `rec`.
///
/// # Errors
/// A cell that does not parse, naming its column.
fn read_extras(
    cx: &Cells<'_>,
    extra: &[(usize, ExtraColumn)],
    rec: &mut TraceRecord,
) -> Result<()> {
    let mut hash_ids: Option<Vec<u64>> = None;
    let mut hash_block: Option<u32> = None;
    for (idx, col) in extra {
        let idx = Some(*idx);
        match col {
            ExtraColumn::ThinkTimeUs => rec.request.think_time_us = cx.time(idx, col.name())?,
            ExtraColumn::ContentKey => rec.request.content_key = cx.int_named(idx, col)?,
            ExtraColumn::HashIds => {
                let text = cx.text(idx);
                if !text.is_empty() {
                    let mut ids = Vec::new();
                    for part in text.split(';') {
                        ids.push(part.trim().parse::<u64>().map_err(|_| {
                            cx.err_named(idx, col.name(), &format!("invalid block id {part:?}"))
                        })?);
                    }
                    hash_ids = Some(ids);
                }
            }
            ExtraColumn::HashBlockTokens => hash_block = cx.int_named(idx, col)?,
            ExtraColumn::HttpStatus => rec.outcome.http_status = cx.int_named(idx, col)?,
            ExtraColumn::CachedTokens => rec.outcome.cached_tokens = cx.int_named(idx, col)?,
            ExtraColumn::XRequestId => {
                let t = cx.text(idx);
                rec.outcome.x_request_id = (!t.is_empty()).then(|| t.to_string());
            }
            ExtraColumn::Other(name) => {
                rec.other.push((name.clone(), cx.text(idx).to_string()));
            }
        }
    }
    if let Some(ids) = hash_ids {
        rec.request.hash_ids = Some(HashIds {
            block_tokens: hash_block.unwrap_or(512),
            ids: ids.into(),
        });
    }
    Ok(())
}

/// Typed access to the cells of one row, with errors naming the cell.
pub(crate) struct Cells<'a> {
    pub(crate) row: &'a ByteRecord,
    pub(crate) path: &'a Path,
    pub(crate) line: u64,
}

impl Cells<'_> {
    pub(crate) fn text(&self, idx: Option<usize>) -> &str {
        idx.and_then(|i| self.row.get(i))
            .and_then(|b| std::str::from_utf8(b).ok())
            .unwrap_or("")
    }

    fn err(&self, idx: Option<usize>, base: usize, what: &str) -> Error {
        self.err_named(idx, BASE_COLUMNS[base], what)
    }

    pub(crate) fn err_named(&self, idx: Option<usize>, name: &str, what: &str) -> Error {
        let col = idx.map(|i| i as u64 + 1).unwrap_or(0);
        Error::invalid(
            Location::at(self.path, self.line, col),
            format!("{name}: {what}"),
        )
    }

    fn int<T: std::str::FromStr>(&self, idx: Option<usize>, base: usize) -> Result<Option<T>> {
        self.int_by_name(idx, BASE_COLUMNS[base])
    }

    /// A time in µs within ±[`MAX_TIME_US`] (so that no sum of times and
    /// durations overflows).
    fn time(&self, idx: Option<usize>, name: &str) -> Result<Option<i64>> {
        let v = self.int_by_name::<i64>(idx, name)?;
        if let Some(t) = v
            && t.unsigned_abs() > MAX_TIME_US as u64
        {
            return Err(self.err_named(
                idx,
                name,
                &format!("{t} µs is beyond ±2^53 µs (285 years)"),
            ));
        }
        Ok(v)
    }

    fn int_named<T: std::str::FromStr>(
        &self,
        idx: Option<usize>,
        col: &ExtraColumn,
    ) -> Result<Option<T>> {
        self.int_by_name(idx, col.name())
    }

    pub(crate) fn int_by_name<T: std::str::FromStr>(
        &self,
        idx: Option<usize>,
        name: &str,
    ) -> Result<Option<T>> {
        let t = self.text(idx).trim();
        if t.is_empty() {
            return Ok(None);
        }
        t.parse::<T>().map(Some).map_err(|_| {
            let kind = if t.starts_with('-') {
                "invalid (negative or out of range) integer"
            } else {
                "invalid integer"
            };
            self.err_named(idx, name, &format!("{kind} {t:?}"))
        })
    }

    fn float(&self, idx: Option<usize>, base: usize) -> Result<Option<f64>> {
        let t = self.text(idx).trim();
        if t.is_empty() {
            return Ok(None);
        }
        match t.parse::<f64>() {
            Ok(v) if v.is_finite() => Ok(Some(v)),
            _ => Err(self.err(idx, base, &format!("invalid number {t:?}"))),
        }
    }

    fn boolean(&self, idx: Option<usize>, base: usize) -> Result<bool> {
        match self.text(idx).trim() {
            "" | "false" | "False" | "FALSE" | "0" => Ok(false),
            "true" | "True" | "TRUE" | "1" => Ok(true),
            other => Err(self.err(idx, base, &format!("invalid boolean {other:?}"))),
        }
    }

    fn shared(
        &self,
        idx: Option<usize>,
        base: usize,
        interner: &mut Interner,
    ) -> Result<SharedStr> {
        match idx.and_then(|i| self.row.get(i)) {
            None => Ok(empty_str()),
            Some(b) => match std::str::from_utf8(b) {
                Ok(s) => Ok(interner.get(s)),
                Err(_) => Err(self.err(idx, base, "invalid UTF-8")),
            },
        }
    }
}
