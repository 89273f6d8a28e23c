//! A [`TraceWriter`] on a thread of its own, for producers that emit many
//! rows and must not wait on their formatting and writing (a replay's
//! trace, step table and time series).
//!
//! Rows are handed over in batches through a bounded channel (at most
//! [`BATCHES_IN_FLIGHT`] batches of [`BATCH_ROWS`] rows wait, so memory
//! stays bounded when the disk is slower than the producer) and written in
//! the order they were given: the files are byte for byte those of the
//! same calls on a [`TraceWriter`]. The producer's computation is not
//! touched by the thread, so a simulation stays single-threaded and
//! deterministic. A write error stops the writing; it is returned by
//! [`BackgroundWriter::finish`], which also rewrites the header.

use std::sync::Arc;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;

use crate::bundle::{TracePaths, TraceWriter};
use crate::companions::ChunkRecord;
use crate::error::{Error, Result};
use crate::header::TraceHeader;
use crate::itl_steps::TokenRun;
use crate::record::TraceRecord;

/// Rows per batch handed to the writing thread.
pub const BATCH_ROWS: usize = 512;
/// Batches that may wait for the writing thread.
pub const BATCHES_IN_FLIGHT: usize = 4;

/// One row for the writing thread; slices live in the batch's arenas.
#[derive(Debug)]
enum Row {
    /// The batch's next record.
    Record,
    Chunk(ChunkRecord),
    /// `ends[from..from + len]` of the batch.
    Steps {
        instance: u32,
        first_step: u64,
        from: usize,
        len: usize,
    },
    Run(TokenRun),
    /// `samples[from..from + len]` of the batch.
    Scrape {
        timestamp_us: i64,
        labels: Arc<str>,
        from: usize,
        len: usize,
    },
}

#[derive(Debug, Default)]
struct Batch {
    rows: Vec<Row>,
    records: Vec<TraceRecord>,
    ends: Vec<i64>,
    samples: Vec<(&'static str, f64)>,
}

impl Batch {
    fn clear(&mut self) {
        self.rows.clear();
        self.records.clear();
        self.ends.clear();
        self.samples.clear();
    }

    fn write_to(&self, w: &mut TraceWriter) -> Result<()> {
        let mut records = self.records.iter();
        for row in &self.rows {
            match row {
                Row::Record => {
                    if let Some(r) = records.next() {
                        w.write_record(r)?;
                    }
                }
                Row::Chunk(c) => w.write_chunk(c)?,
                Row::Steps {
                    instance,
                    first_step,
                    from,
                    len,
                } => w.write_steps(*instance, *first_step, &self.ends[*from..*from + *len])?,
                Row::Run(r) => w.write_run(r)?,
                Row::Scrape {
                    timestamp_us,
                    labels,
                    from,
                    len,
                } => w.write_metric_scrape(
                    *timestamp_us,
                    labels,
                    &self.samples[*from..*from + *len],
                )?,
            }
        }
        Ok(())
    }
}

/// The writing thread's result: the writer and the first error.
type Outcome = (TraceWriter, Option<Error>);

/// A [`TraceWriter`] written by a thread of its own (see the module
/// documentation). The methods queue rows and never fail; errors come
/// back from [`BackgroundWriter::finish`].
#[derive(Debug)]
pub struct BackgroundWriter {
    batch: Batch,
    paths: TracePaths,
    to_writer: Option<SyncSender<Batch>>,
    spare: Receiver<Batch>,
    thread: Option<JoinHandle<Outcome>>,
}

impl BackgroundWriter {
    /// Moves `writer` (created, header written) to a new thread.
    ///
    /// # Errors
    /// The thread cannot be started (named after the bundle's header).
    pub fn new(writer: TraceWriter) -> Result<Self> {
        let paths = writer.paths().clone();
        let (to_writer, from_producer) = sync_channel::<Batch>(BATCHES_IN_FLIGHT);
        let (return_spare, spare) = sync_channel::<Batch>(BATCHES_IN_FLIGHT + 2);
        let thread = std::thread::Builder::new()
            .name("trace-writer".into())
            .spawn(move || {
                let mut w = writer;
                let mut error = None;
                for mut batch in from_producer {
                    if error.is_none()
                        && let Err(e) = batch.write_to(&mut w)
                    {
                        error = Some(e);
                    }
                    batch.clear();
                    let _ = return_spare.try_send(batch);
                }
                (w, error)
            })
            .map_err(|e| Error::io(&paths.header, e))?;
        Ok(Self {
            batch: Batch::default(),
            paths,
            to_writer: Some(to_writer),
            spare,
            thread: Some(thread),
        })
    }

    /// The bundle's files.
    pub fn paths(&self) -> &TracePaths {
        &self.paths
    }

    fn push(&mut self, row: Row) {
        self.batch.rows.push(row);
        if self.batch.rows.len() >= BATCH_ROWS {
            self.hand_over();
        }
    }

    fn hand_over(&mut self) {
        if self.batch.rows.is_empty() {
            return;
        }
        let next = self.spare.try_recv().unwrap_or_default();
        let full = std::mem::replace(&mut self.batch, next);
        if let Some(tx) = &self.to_writer {
            // A closed channel means the thread is gone: `finish` says why.
            let _ = tx.send(full);
        }
    }

    /// Queues a request row ([`TraceWriter::write_record`]).
    pub fn write_record(&mut self, r: TraceRecord) {
        self.batch.records.push(r);
        self.push(Row::Record);
    }

    /// Queues a chunk row ([`TraceWriter::write_chunk`]).
    pub fn write_chunk(&mut self, c: ChunkRecord) {
        self.push(Row::Chunk(c));
    }

    /// Queues a batch of steps ([`TraceWriter::write_steps`]), their end
    /// times given as `ends` plus `offset` (µs).
    pub fn write_steps(&mut self, instance: u32, first_step: u64, ends: &[i64], offset: i64) {
        let from = self.batch.ends.len();
        self.batch.ends.extend(ends.iter().map(|e| e + offset));
        self.push(Row::Steps {
            instance,
            first_step,
            from,
            len: ends.len(),
        });
    }

    /// Queues a run of tokens ([`TraceWriter::write_run`]).
    pub fn write_run(&mut self, r: TokenRun) {
        self.push(Row::Run(r));
    }

    /// Queues one scrape's samples ([`TraceWriter::write_metric_scrape`]).
    pub fn write_metric_scrape(
        &mut self,
        timestamp_us: i64,
        labels: &Arc<str>,
        samples: &[(&'static str, f64)],
    ) {
        let from = self.batch.samples.len();
        self.batch.samples.extend_from_slice(samples);
        self.push(Row::Scrape {
            timestamp_us,
            labels: Arc::clone(labels),
            from,
            len: samples.len(),
        });
    }

    /// Writes what is queued, stops the thread, rewrites the header
    /// ([`TraceWriter::finish`]).
    ///
    /// # Errors
    /// The first write that failed, or the header's.
    pub fn finish(mut self, header: &TraceHeader) -> Result<TracePaths> {
        self.hand_over();
        drop(self.to_writer.take());
        let thread = self.thread.take().expect("the thread is joined once");
        let (w, error) = thread.join().map_err(|_| {
            Error::io(
                &self.paths.header,
                std::io::Error::other("the trace-writing thread panicked"),
            )
        })?;
        if let Some(e) = error {
            return Err(e);
        }
        w.finish(header)
    }
}

impl Drop for BackgroundWriter {
    fn drop(&mut self) {
        // Dropped without `finish` (an error elsewhere): let the thread
        // write what it has and end.
        drop(self.to_writer.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bundle::ItlForm;
    use crate::itl_steps::ItlTiming;
    use crate::record::Request;

    fn rows(n: u64) -> Vec<TraceRecord> {
        (0..n)
            .map(|i| TraceRecord {
                request: Request {
                    request_id: i,
                    input_tokens: 10 + i as u32,
                    output_tokens: 3,
                    arrival_time_us: i as i64 * 7,
                    ..Request::default()
                },
                ..TraceRecord::default()
            })
            .collect()
    }

    /// The same calls give the same files, byte for byte, through the
    /// thread as directly, across batch boundaries.
    #[test]
    fn background_files_equal_direct_files() {
        let dir = tempfile::tempdir().unwrap();
        let header = TraceHeader::new(crate::header::Mode::Replayed);
        let form = ItlForm::Steps(ItlTiming::default());
        let labels: Arc<str> = Arc::from("model_name=\"m\"");
        let n = 3 * BATCH_ROWS as u64 + 17;
        let mut direct =
            TraceWriter::create_with(&dir.path().join("a"), &header, &[], form, true).unwrap();
        let mut back = BackgroundWriter::new(
            TraceWriter::create_with(&dir.path().join("b"), &header, &[], form, true).unwrap(),
        )
        .unwrap();
        for (i, r) in rows(n).into_iter().enumerate() {
            let i = i as i64;
            let ends = [i * 10, i * 10 + 4, i * 10 + 8];
            direct
                .write_steps(0, i as u64 * 3, &ends.map(|e| e + 1000))
                .unwrap();
            back.write_steps(0, i as u64 * 3, &ends, 1000);
            let samples = [("vllm:num_requests_running", i as f64), ("x", 0.5)];
            direct.write_metric_scrape(i, &labels, &samples).unwrap();
            back.write_metric_scrape(i, &labels, &samples);
            direct.write_record(&r).unwrap();
            back.write_record(r);
        }
        let a = direct.finish(&header).unwrap();
        let b = back.finish(&header).unwrap();
        for (x, y) in [
            (&a.data, &b.data),
            (&a.steps, &b.steps),
            (&a.metrics, &b.metrics),
        ] {
            assert_eq!(std::fs::read(x).unwrap(), std::fs::read(y).unwrap());
        }
    }

    /// A write that fails on the thread (the file's reader is gone) is
    /// returned by `finish`, naming the file, and the producer never
    /// blocks on it.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_failed_write_is_returned_by_finish() {
        use std::io::Read;
        let dir = tempfile::tempdir().unwrap();
        let prefix = dir.path().join("gone");
        let data = prefix.with_extension("csv");
        let made = std::process::Command::new("mkfifo").arg(&data).status();
        if !made.is_ok_and(|s| s.success()) {
            return; // no mkfifo here
        }
        let reader = {
            let data = data.clone();
            std::thread::spawn(move || {
                let mut f = std::fs::File::open(&data).unwrap();
                let mut b = [0u8; 16];
                let _ = f.read(&mut b).unwrap();
            })
        };
        let header = TraceHeader::new(crate::header::Mode::Replayed);
        let w = TraceWriter::create_with(&prefix, &header, &[], ItlForm::None, false).unwrap();
        reader.join().unwrap();
        let mut back = BackgroundWriter::new(w).unwrap();
        for r in rows(50 * BATCH_ROWS as u64) {
            back.write_record(r);
        }
        let e = back.finish(&header).unwrap_err().to_string();
        assert!(e.contains("gone.csv"), "{e}");
    }
}
