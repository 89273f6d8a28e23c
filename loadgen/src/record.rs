//! The recorder: one thread that owns the trace files. Finished requests
//! (with their chunk times) and metric scrapes arrive over a channel and
//! are written every few milliseconds and flushed, so a killed run loses at
//! most the last few milliseconds of rows and an interrupted one nothing.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
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

/// Figures of the run so far for the progress line, refreshed by the
/// recorder about four times a second from HDR histograms (3 significant
/// digits) of the requests recorded: TTFT of `ok` streamed requests and
/// send lag, µs; [`Live::NONE`] until there is one.
#[derive(Debug)]
pub struct Live {
    /// Unix µs of the schedule's origin (intended sends are relative to it).
    pub run_start_us: i64,
    /// TTFT p50 so far, µs.
    pub ttft_p50_us: AtomicI64,
    /// TTFT p99 so far, µs.
    pub ttft_p99_us: AtomicI64,
    /// Send lag p99 so far, µs.
    pub lag_p99_us: AtomicI64,
    /// Request rows taken from the channel so far (written or, after a
    /// write error, dropped).
    pub rows: std::sync::atomic::AtomicU64,
}

impl Live {
    /// No figure yet.
    pub const NONE: i64 = i64::MIN;

    /// Nothing recorded yet, for a run starting at `run_start_us`.
    pub fn new(run_start_us: i64) -> Self {
        Self {
            run_start_us,
            ttft_p50_us: AtomicI64::new(Self::NONE),
            ttft_p99_us: AtomicI64::new(Self::NONE),
            lag_p99_us: AtomicI64::new(Self::NONE),
            rows: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// A figure in ms, `None` before the first.
    pub fn ms(v: &AtomicI64) -> Option<f64> {
        let us = v.load(Ordering::Relaxed);
        (us != Self::NONE).then(|| us as f64 / 1e3)
    }
}

/// The recorder's histograms behind [`Live`].
struct LiveHistograms {
    ttft: hdrhistogram::Histogram<u64>,
    lag: hdrhistogram::Histogram<u64>,
    published: std::time::Instant,
}

impl LiveHistograms {
    fn new() -> Option<Self> {
        Some(Self {
            ttft: hdrhistogram::Histogram::new(3).ok()?,
            lag: hdrhistogram::Histogram::new(3).ok()?,
            published: std::time::Instant::now(),
        })
    }

    fn add(&mut self, rec: &TraceRecord, run_start_us: i64) {
        let o = &rec.outcome;
        let cap = |us: i64| us.clamp(0, 1 << 40) as u64;
        if let Some(send) = o.send_time_us {
            let _ = self
                .lag
                .record(cap(send - run_start_us - rec.request.arrival_time_us));
            if o.status == Some(Status::Ok)
                && rec.request.streaming
                && let Some(first) = o.first_chunk_time_us
            {
                let _ = self.ttft.record(cap(first - send));
            }
        }
    }

    /// Publishes the figures at most four times a second.
    fn publish(&mut self, live: &Live) {
        if self.published.elapsed() < Duration::from_millis(250) {
            return;
        }
        self.published = std::time::Instant::now();
        let q = |h: &hdrhistogram::Histogram<u64>, q: f64| {
            if h.is_empty() {
                Live::NONE
            } else {
                h.value_at_quantile(q) as i64
            }
        };
        live.ttft_p50_us
            .store(q(&self.ttft, 0.5), Ordering::Relaxed);
        live.ttft_p99_us
            .store(q(&self.ttft, 0.99), Ordering::Relaxed);
        live.lag_p99_us.store(q(&self.lag, 0.99), Ordering::Relaxed);
    }
}

/// Starts the recorder thread. `failed` is raised on a write error so that
/// the run stops sending.
pub fn spawn(
    writer: TraceWriter,
    tally: Tally,
    warmup: u64,
    rx: Receiver<Msg>,
    failed: Arc<AtomicBool>,
    live: Arc<Live>,
) -> std::io::Result<JoinHandle<Recorded>> {
    std::thread::Builder::new()
        .name("blis-recorder".into())
        .spawn(move || record(writer, tally, warmup, &rx, &failed, &live))
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
    live: &Live,
) -> Recorded {
    let mut hist = LiveHistograms::new();
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
                    if let Msg::Done(rec, ..) = &msg {
                        live.rows.fetch_add(1, Ordering::Relaxed);
                        if let Some(h) = &mut hist {
                            h.add(rec, live.run_start_us);
                        }
                    }
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
        if let Some(h) = &mut hist {
            h.publish(live);
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

#[cfg(test)]
mod tests {
    use super::*;
    use blis_traces::Request;

    /// The progress line's figures: TTFT of `ok` streamed requests and
    /// send lag, from what was recorded, within the histograms' 0.1%.
    #[test]
    fn live_figures_follow_the_recorded_requests() {
        let live = Live::new(1_000_000);
        let mut h = LiveHistograms::new().unwrap();
        for i in 0..100i64 {
            let mut r = TraceRecord::planned(Request {
                request_id: i as u64,
                arrival_time_us: i * 1000,
                streaming: true,
                ..Request::default()
            });
            let send = 1_000_000 + i * 1000 + 200;
            r.outcome.send_time_us = Some(send);
            r.outcome.first_chunk_time_us = Some(send + 10_000 + i * 100);
            r.outcome.status = Some(Status::Ok);
            h.add(&r, live.run_start_us);
        }
        assert_eq!(
            Live::ms(&live.ttft_p50_us),
            None,
            "nothing before a publish"
        );
        h.published = std::time::Instant::now() - Duration::from_secs(1);
        h.publish(&live);
        let p50 = Live::ms(&live.ttft_p50_us).unwrap();
        let p99 = Live::ms(&live.ttft_p99_us).unwrap();
        assert!((p50 - 14.9).abs() <= 0.02, "{p50}");
        assert!((p99 - 19.8).abs() <= 0.03, "{p99}");
        assert!((Live::ms(&live.lag_p99_us).unwrap() - 0.2).abs() < 1e-9);
    }
}
