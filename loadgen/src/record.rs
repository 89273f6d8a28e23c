//! The recorder: one thread that owns the trace files. Finished requests
//! (with their chunk times) and metric scrapes arrive over a channel and
//! are written every few milliseconds and flushed, so a killed run loses at
//! most the last few milliseconds of rows and an interrupted one nothing.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::thread::JoinHandle;
use std::time::Duration;

use blis_traces::{ChunkRecord, MetricSample, Status, TraceRecord, TraceWriter};

use crate::report::Tally;
use crate::samples::CountedSamples;

/// A message to the recorder.
#[derive(Debug)]
pub enum Msg {
    /// A request that ended (any status), with the Unix-µs arrival times of
    /// its content chunks and, when known, their token counts.
    Done(Box<TraceRecord>, Vec<i64>, Vec<u32>),
    /// One scrape's samples.
    Metrics(Vec<MetricSample>),
}

/// What the recorder hands back when the channel closes.
#[derive(Debug)]
pub struct Recorded {
    /// The open bundle, for the final header.
    pub writer: TraceWriter,
    /// Every request row written, tallied for the summary (the rows
    /// themselves are not kept: a run's memory does not grow with them).
    pub tally: Tally,
    /// Inter-token latencies (µs) of `ok` streamed requests past warm-up,
    /// as value → count.
    pub itl_us: CountedSamples,
    /// Metric samples written.
    pub metric_rows: u64,
    /// The first write error; rows after it were not written.
    pub error: Option<blis_traces::Error>,
}

/// Starts the recorder thread. `failed` is raised on a write error so that
/// the run stops sending.
pub fn spawn(
    writer: TraceWriter,
    tally: Tally,
    warmup: u64,
    rx: Receiver<Msg>,
    failed: Arc<AtomicBool>,
) -> std::io::Result<JoinHandle<Recorded>> {
    std::thread::Builder::new()
        .name("blis-recorder".into())
        .spawn(move || record(writer, tally, warmup, &rx, &failed))
}

/// How often the recorder wakes to write what has arrived: a sender never
/// wakes it (a wake-up per request costs more CPU than the request), and a
/// killed run loses at most this much.
const PERIOD: Duration = Duration::from_millis(10);

fn record(
    writer: TraceWriter,
    tally: Tally,
    warmup: u64,
    rx: &Receiver<Msg>,
    failed: &AtomicBool,
) -> Recorded {
    let mut out = Recorded {
        writer,
        tally,
        itl_us: CountedSamples::default(),
        metric_rows: 0,
        error: None,
    };
    loop {
        let mut closed = false;
        let mut wrote = false;
        loop {
            match rx.try_recv() {
                Ok(msg) => {
                    wrote = true;
                    if let Err(e) = write(&mut out, warmup, msg)
                        && out.error.is_none()
                    {
                        out.error = Some(e);
                        failed.store(true, Ordering::SeqCst);
                    }
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    closed = true;
                    break;
                }
            }
        }
        if wrote
            && out.error.is_none()
            && let Err(e) = out.writer.flush()
        {
            out.error = Some(e);
            failed.store(true, Ordering::SeqCst);
        }
        if closed {
            return out;
        }
        std::thread::sleep(PERIOD);
    }
}

fn write(out: &mut Recorded, warmup: u64, msg: Msg) -> blis_traces::Result<()> {
    match msg {
        Msg::Done(rec, times, tokens) => {
            let id = rec.request.request_id;
            if rec.outcome.status == Some(Status::Ok) && rec.request.streaming && id >= warmup {
                for w in times.windows(2) {
                    out.itl_us.push(w[1] - w[0]);
                }
            }
            let res = if out.error.is_none() {
                out.writer.write_record(&rec).and_then(|()| {
                    for (i, &t) in times.iter().enumerate() {
                        out.writer.write_chunk(&ChunkRecord {
                            request_id: id,
                            chunk_index: i as u32,
                            timestamp_us: t,
                            tokens: tokens.get(i).copied(),
                        })?;
                    }
                    Ok(())
                })
            } else {
                Ok(())
            };
            out.tally.add(&rec);
            res
        }
        Msg::Metrics(samples) => {
            if out.error.is_some() {
                return Ok(());
            }
            for m in &samples {
                out.writer.write_metric(m)?;
            }
            out.metric_rows += samples.len() as u64;
            Ok(())
        }
    }
}
