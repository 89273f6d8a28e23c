//! Dispatching: open loop (each unit started at its send time; held back
//! while the client is too far behind its schedule) or closed loop (N
//! workers), and the end of sending.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::options::RunOptions;
use crate::timer::PreciseTimer;

use super::{
    send::{Ready, Unit, Units, run_unit, wait_until},
    shared::Shared,
    signals::Signals,
};

/// Phase 4: the senders, open loop (each request at its time) or closed
/// loop (`--concurrency` users); each holds `done` until it ends.
pub(super) fn dispatch(
    args: &RunOptions,
    sh: &Arc<Shared>,
    units: Units,
    done: &tokio::sync::mpsc::Sender<()>,
) -> Dispatcher {
    let Some(n) = args.concurrency else {
        return Dispatcher::Open(tokio::spawn(dispatch_open_loop(
            sh.clone(),
            units,
            done.clone(),
        )));
    };
    let queue = Arc::new(Mutex::new(units));
    let deadline = args
        .duration_s
        .map(|s| sh.run_start_us + (s * 1e6).round() as i64);
    for _ in 0..n {
        let (sh, queue, done) = (sh.clone(), queue.clone(), done.clone());
        tokio::spawn(async move {
            let start = sh.instant(0);
            if !wait_until(&sh, start).await {
                drop(sh);
                drop(done);
                return;
            }
            loop {
                let now = sh.clock.now_us();
                if sh.stopping() || deadline.is_some_and(|d| now >= d) {
                    break;
                }
                let unit = queue
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .next();
                let Some(unit) = unit else { break };
                run_unit(sh.clone(), unit, Some(now - sh.run_start_us), None).await;
            }
            drop(sh);
            drop(done);
        });
    }
    Dispatcher::Closed(queue)
}

/// Phase 5: waits for every sender to end, or for a signal: then no more
/// sends, up to `--grace-s` for the requests in flight (a second signal
/// cancels them at once). Returns whether the run was interrupted.
pub(super) async fn wait_for_end(
    args: &RunOptions,
    sh: &Shared,
    signals: &mut Signals,
    mut done: tokio::sync::mpsc::Receiver<()>,
    bar: &indicatif::ProgressBar,
) -> bool {
    let all_done = async { while done.recv().await.is_some() {} };
    tokio::pin!(all_done);
    tokio::select! {
        () = &mut all_done => false,
        () = signals.recv() => {
            sh.stopping.send_replace(true);
            let n = sh.progress.in_flight.load(Ordering::Relaxed);
            bar.suspend(|| blis_traces::diag!(
                "interrupted: no more sends; waiting up to {:.1} s for {n} requests in flight (signal again to cancel them now)",
                args.grace_s
            ));
            // `all_done` may finish inside the grace period; a finished
            // future must not be polled again.
            let finished = tokio::select! {
                () = &mut all_done => true,
                () = tokio::time::sleep(saturating_secs(args.grace_s)) => false,
                () = signals.recv() => false,
            };
            sh.cancel.send_replace(true);
            if !finished {
                all_done.await;
            }
            true
        }
    }
}

/// Waits for the dispatcher to end. Units of a closed loop never started
/// are part of the plan only if the run was cut short (they become
/// not-sent rows); a closed loop that ran its duration leaves them out.
pub(super) async fn end_dispatch(dispatcher: Dispatcher, sh: &Shared, interrupted: bool) {
    match dispatcher {
        Dispatcher::Open(t) => {
            let _ = t.await;
        }
        Dispatcher::Closed(queue) => {
            if interrupted {
                let mut queue = queue
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                for u in queue.by_ref() {
                    for r in u {
                        sh.not_sent(r, "the run was interrupted before this request");
                    }
                }
            }
        }
    }
}

pub(super) enum Dispatcher {
    Open(tokio::task::JoinHandle<()>),
    Closed(Arc<Mutex<Units>>),
}

/// How far ahead of its send time a request's body is built, so that a
/// burst of sends is not slowed by building prompts.
pub(super) const PREPARE_AHEAD: Duration = Duration::from_millis(20);

/// Bodies built ahead at most.
pub(super) const PREPARE_MAX: usize = 4096;

/// A number of seconds from the command line as a duration: one past
/// what a `Duration` holds (`--max-behind-s inf`) is forever, not a panic.
pub(super) fn saturating_secs(s: f64) -> Duration {
    Duration::try_from_secs_f64(s).unwrap_or(if s > 0.0 {
        Duration::MAX
    } else {
        Duration::ZERO
    })
}

/// Units started at least, however few were running when the client fell
/// behind (a floor for a run that was nearly idle).
pub(super) const BEHIND_CAP_MIN: u64 = 256;

/// Graceful degradation of an open loop the client cannot keep up with.
///
/// Once the dispatcher is more than `--max-send-lag-ms` behind its
/// schedule, starting more units only adds tasks and connections that the
/// saturated client cannot serve: memory grows with the rate and the
/// requests already started are answered later still. So the number of
/// units started and not finished is held at what it was when the client
/// fell behind (with a quarter more, and at least [`BEHIND_CAP_MIN`]): a
/// new one starts when one ends, on the connections already pooled. The
/// lag of the held sends is recorded as usual, and `--max-behind-s` stops
/// the run. Back on schedule, the hold is lifted.
#[derive(Debug, Default)]
pub(super) struct BehindCap {
    /// Units started and not finished.
    pub(super) live: Arc<AtomicU64>,
    /// The hold, while behind.
    pub(super) cap: Option<u64>,
}

impl BehindCap {
    /// Waits, while the client is behind `due` by more than `after`, until
    /// fewer units than the hold are live. Returns early when `stopping`
    /// says so or the client falls `max_behind` behind.
    pub(super) async fn admit(
        &mut self,
        due: Instant,
        after: Duration,
        max_behind: Option<Duration>,
        stopping: impl Fn() -> bool,
    ) {
        loop {
            let behind = Instant::now().saturating_duration_since(due);
            if behind <= after {
                self.cap = None;
                return;
            }
            let live = self.live.load(Ordering::Relaxed);
            let cap = *self
                .cap
                .get_or_insert_with(|| (live + live / 4).max(BEHIND_CAP_MIN));
            if live < cap || stopping() || max_behind.is_some_and(|m| behind > m) {
                return;
            }
            // Behind already: a millisecond more is recorded as lag.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

/// The open-loop schedule: for each unit in order, build its first body
/// ahead of time, sleep (precisely, see [`PreciseTimer`]) until its send
/// time and start it. Stopping records every unit not yet started as not
/// sent. A client that falls behind holds what it has started
/// ([`BehindCap`]).
pub(super) async fn dispatch_open_loop(
    sh: Arc<Shared>,
    units: Units,
    done: tokio::sync::mpsc::Sender<()>,
) {
    let timer = PreciseTimer::new();
    let mut stop = sh.stopping.subscribe();
    let mut pending = units.peekable();
    let mut ready: VecDeque<(Unit, Ready)> = VecDeque::new();
    let mut hold = BehindCap::default();
    loop {
        let horizon = Instant::now() + PREPARE_AHEAD;
        while ready.len() < PREPARE_MAX
            && let Some(u) = pending.peek()
            && (ready.is_empty() || sh.instant(u[0].request.arrival_time_us) <= horizon)
        {
            let Some(u) = pending.next() else { break };
            let r = Ready::first(&sh, &u[0]);
            ready.push_back((u, r));
        }
        let Some((unit, first)) = ready.pop_front() else {
            break;
        };
        let due = sh.instant(unit[0].request.arrival_time_us);
        if Instant::now() < due {
            tokio::select! {
                () = timer.sleep_until(due) => {}
                _ = stop.wait_for(|s| *s) => {}
            }
        }
        hold.admit(due, sh.behind_after, sh.max_behind, || sh.stopping())
            .await;
        let behind = Instant::now().saturating_duration_since(due);
        let too_far = sh.max_behind.is_some_and(|m| behind > m);
        if sh.stopping() || too_far {
            let why = if too_far {
                // Rounded up: a client stopped for being past the cap by
                // less than a microsecond reports more than the cap.
                let us = behind.as_nanos().div_ceil(1000).max(1);
                sh.stopped_behind_us
                    .store(u64::try_from(us).unwrap_or(u64::MAX), Ordering::Relaxed);
                format!(
                    "the client fell {:.2} s behind its schedule and stopped sending (--max-behind-s)",
                    behind.as_secs_f64()
                )
            } else {
                "the run was interrupted before this request".to_string()
            };
            let rest = std::iter::once(unit)
                .chain(ready.drain(..).map(|(u, _)| u))
                .chain(pending.by_ref());
            for u in rest {
                for r in u {
                    sh.not_sent(r, &why);
                }
            }
            break;
        }
        let (sh, done, live) = (sh.clone(), done.clone(), hold.live.clone());
        live.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            run_unit(sh, unit, None, Some(first)).await;
            live.fetch_sub(1, Ordering::Relaxed);
            drop(done);
        });
    }
}
