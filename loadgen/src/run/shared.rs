//! What every request task of a run shares: the endpoint, the clock, the
//! recorder channel, the stop and cancel signals, the live counters.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

use blis_traces::spec::ContextGrowth;
use blis_traces::{Status, TraceRecord};
use tokio::sync::{Semaphore, watch};

use crate::clock::RunClock;
use crate::http::{Endpoint, ErrorKind, Failure};
use crate::record::Msg;

/// Rows of requests never sent that may wait for the recorder at once
/// ([`Shared::not_sent`]).
const NOT_SENT_BACKLOG: u64 = 65_536;

/// Live counters for the progress line.
#[derive(Debug, Default)]
pub(super) struct Progress {
    pub(super) sent: AtomicU64,
    pub(super) done: AtomicU64,
    pub(super) not_ok: AtomicU64,
    pub(super) in_flight: AtomicU64,
}

/// What every request task shares.
#[derive(Debug)]
pub(super) struct Shared {
    pub(super) ep: Endpoint,
    pub(super) clock: RunClock,
    pub(super) run_start_us: i64,
    pub(super) tokens_per_word: f64,
    pub(super) no_stream: bool,
    pub(super) timeout: Duration,
    pub(super) tx: Sender<Msg>,
    /// The recorder's live figures (and how many rows it has taken).
    pub(super) live: Arc<crate::record::Live>,
    pub(super) sem: Option<Arc<Semaphore>>,
    /// No new sends (signal, duration, writer failure).
    pub(super) stopping: watch::Sender<bool>,
    /// Abort requests in flight.
    pub(super) cancel: watch::Sender<bool>,
    pub(super) progress: Progress,
    pub(super) growth: BTreeMap<String, ContextGrowth>,
    pub(super) xid_prefix: String,
    pub(super) record_failed: Arc<AtomicBool>,
    /// `--max-behind-s`, as a duration (`None`: never stop).
    pub(super) max_behind: Option<Duration>,
    /// How far behind (µs) the client was when it stopped sending for it;
    /// 0 when it did not.
    pub(super) stopped_behind_us: AtomicU64,
    /// `--max-send-lag-ms`: behind its schedule by more than this, the
    /// open-loop dispatcher holds the units it has started (see
    /// [`BehindCap`]).
    pub(super) behind_after: Duration,
}

impl Shared {
    /// Whether `rec` is sent as a stream.
    pub(super) fn streams(&self, rec: &TraceRecord) -> bool {
        rec.request.streaming && !self.no_stream
    }

    pub(super) fn stopping(&self) -> bool {
        *self.stopping.borrow() || self.record_failed.load(Ordering::Relaxed)
    }

    pub(super) fn instant(&self, rel_us: i64) -> Instant {
        self.clock.instant(self.run_start_us + rel_us)
    }

    /// Hands a finished request to the recorder; `false` when the
    /// recorder has gone (it goes when the run is over, or by a panic).
    pub(super) fn emit(&self, rec: TraceRecord, times: Vec<i64>, tokens: Vec<u32>) -> bool {
        self.progress.done.fetch_add(1, Ordering::Relaxed);
        if rec.outcome.status != Some(Status::Ok) {
            self.progress.not_ok.fetch_add(1, Ordering::Relaxed);
        }
        self.tx
            .send(Msg::Done(Box::new(rec), times, tokens))
            .is_ok()
    }

    /// Records `rec` as never sent. A run cut short records the rest of its
    /// plan this way at once, faster than rows are written: past
    /// [`NOT_SENT_BACKLOG`] rows waiting for the recorder, this waits for it
    /// (a plan of 50 million requests, stopped before its first send, once
    /// queued them all: 23 GB).
    pub(super) fn not_sent(&self, mut rec: TraceRecord, why: &str) {
        rec.outcome.status = Some(Status::Cancelled);
        rec.outcome.error_message = Failure {
            kind: ErrorKind::NotSent,
            detail: why.to_string(),
        }
        .message();
        if !self.emit(rec, Vec::new(), Vec::new()) {
            return;
        }
        // (The recorder takes every row until the run is over, after a
        // failed write too, so the backlog drains; a recorder that has
        // gone, which no wait would drain, returned above.)
        let backlog = || {
            let done = self.progress.done.load(Ordering::Relaxed);
            done.saturating_sub(self.live.rows.load(Ordering::Relaxed))
        };
        while backlog() > NOT_SENT_BACKLOG {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}
