//! A [`Sink`] on a thread of its own, so that turning a replay's events into
//! its outputs (the ITL runs and gap counts, the per-request rows, the
//! summary's distributions, the metrics time series) runs on a second core
//! beside the simulation.
//!
//! The simulation hands each event over in the order it makes it; the
//! thread gives them to the inner sink in that same order, so the inner
//! sink sees exactly the calls it would have seen on the simulation's
//! thread and writes the same bytes. Nothing flows back to the simulation
//! while it runs (what a driver asks a sink, [`Sink::wants_tokens`] and
//! [`Sink::slo`], is read once when the thread starts), so the simulation
//! stays single-threaded and deterministic. A step report's tokens are
//! taken whole ([`Sink::take_report`]): the vector of its spans moves to
//! the thread and an emptied one comes back, so handing over a report
//! costs a copy of its step end times, not of its spans. Events go in
//! batches through a bounded channel (at most [`BATCHES_IN_FLIGHT`]
//! batches of about [`BATCH_EVENTS`] events wait), so memory stays bounded
//! when the outputs are slower than the simulation.

use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;

use blis_traces::{Status, TraceRecord};

use crate::engine::instance::{CohortNote, Finished, Snapshot, StepReport, TokenSpan, TokenTiming};
use crate::sim::{Done, NotServed, Sink};

/// Events per batch handed to the sink's thread. Each batch may wake a
/// parked thread; 256 rather than 64 made the 9,000-request ground-truth
/// replay 0.93× as long and left the 100K-request race unchanged
/// (interleaved pairs, 2-core machine, 2026-11-27).
pub const BATCH_EVENTS: usize = 256;
/// Batches that may wait for the sink's thread.
pub const BATCHES_IN_FLIGHT: usize = 4;

/// One sink call; slices and records live in the batch's arenas.
#[derive(Debug)]
enum Event {
    /// [`Sink::take_report`]: `spans[spans]`, with their step ends
    /// `ends[ends_from..]`, streaming flags `flags[flags_from..]` and
    /// steady decoders' notes `notes[notes_from..notes_to]`.
    Report {
        instance: u32,
        first_step: u64,
        timing: TokenTiming,
        ends_from: usize,
        ends_len: usize,
        spans: usize,
        flags_from: usize,
        notes_from: usize,
        notes_to: usize,
    },
    /// [`Sink::finished`] with the batch's next record.
    Finished {
        fin: Finished,
        entry_us: i64,
        status: Status,
    },
    /// [`Sink::not_served`] with the batch's next record.
    NotServed { entry_us: i64, why: NotServed },
    /// [`Sink::sample`] of `snaps[snap]`.
    Sample { t_us: i64, snap: usize },
    /// [`Sink::sample_pool`] of `snaps[snap]`.
    SamplePool {
        t_us: i64,
        pool: &'static str,
        snap: usize,
    },
    SampleReplicas {
        t_us: i64,
        replicas: (u32, u32, u32),
    },
    /// [`Sink::upcoming`] of `upcoming[from..from + len]`.
    Upcoming {
        instance: u32,
        from: usize,
        len: usize,
    },
}

#[derive(Debug, Default)]
struct Batch {
    events: Vec<Event>,
    records: Vec<TraceRecord>,
    ends: Vec<i64>,
    spans: Vec<Vec<TokenSpan>>,
    flags: Vec<bool>,
    notes: Vec<(u32, CohortNote)>,
    snaps: Vec<Snapshot>,
    upcoming: Vec<(u64, u32, i64)>,
    /// Emptied span vectors on their way back to the simulation.
    spare_spans: Vec<Vec<TokenSpan>>,
}

impl Batch {
    /// Makes the calls of the batch's events on `sink`, in order, and
    /// empties it (keeping its span vectors, emptied, in `spare_spans`).
    fn replay_into<S: Sink>(&mut self, sink: &mut S, report: &mut StepReport) {
        let mut records = self.records.drain(..);
        for event in self.events.drain(..) {
            match event {
                Event::Report {
                    instance,
                    first_step,
                    timing,
                    ends_from,
                    ends_len,
                    spans,
                    flags_from,
                    notes_from,
                    notes_to,
                } => {
                    if report.timing() != timing {
                        report.set_timing(timing);
                    }
                    report.first_step = first_step;
                    report.step_ends.clear();
                    report
                        .step_ends
                        .extend_from_slice(&self.ends[ends_from..ends_from + ends_len]);
                    std::mem::swap(&mut report.spans, &mut self.spans[spans]);
                    if !report.step_ends.is_empty() {
                        sink.steps(instance, first_step, &report.step_ends);
                    }
                    let flags = &self.flags[flags_from..flags_from + report.spans.len()];
                    let mut notes = self.notes[notes_from..notes_to].iter().peekable();
                    for (i, (span, &streaming)) in report.spans.iter().zip(flags).enumerate() {
                        while let Some((_, note)) = notes.next_if(|(at, _)| *at as usize <= i) {
                            sink.cohort(instance, note, report);
                        }
                        sink.tokens(None, streaming, report.span_times(span));
                    }
                    for (_, note) in notes {
                        sink.cohort(instance, note, report);
                    }
                    std::mem::swap(&mut report.spans, &mut self.spans[spans]);
                }
                Event::Finished {
                    fin,
                    entry_us,
                    status,
                } => {
                    let rec = records.next().expect("a record per completion");
                    sink.finished(Done {
                        rec,
                        entry_us,
                        fin: &fin,
                        status,
                    });
                }
                Event::NotServed { entry_us, why } => {
                    let rec = records.next().expect("a record per request not served");
                    sink.not_served(rec, entry_us, why);
                }
                Event::Sample { t_us, snap } => sink.sample(t_us, &self.snaps[snap]),
                Event::SamplePool { t_us, pool, snap } => {
                    sink.sample_pool(t_us, pool, &self.snaps[snap]);
                }
                Event::SampleReplicas { t_us, replicas } => sink.sample_replicas(t_us, replicas),
                Event::Upcoming {
                    instance,
                    from,
                    len,
                } => sink.upcoming(instance, &self.upcoming[from..from + len]),
            }
        }
        drop(records);
        self.spare_spans.extend(self.spans.drain(..).map(|mut v| {
            v.clear();
            v
        }));
        self.ends.clear();
        self.flags.clear();
        self.notes.clear();
        self.snaps.clear();
        self.upcoming.clear();
    }
}

/// A sink whose calls run on a thread of its own (see the module
/// documentation); [`SinkThread::into_inner`] waits for them and returns
/// the inner sink. The inner sink's [`Sink::tokens`] is given no record
/// (a sink that wants them, [`Sink::wants_token_records`], belongs on the
/// simulation's thread).
#[derive(Debug)]
pub struct SinkThread<S: Sink + Send + 'static> {
    batch: Batch,
    to_sink: Option<SyncSender<Batch>>,
    spare: Receiver<Batch>,
    spare_spans: Vec<Vec<TokenSpan>>,
    thread: Option<JoinHandle<S>>,
    wants_tokens: bool,
    wants_upcoming: bool,
    takes_cohort: bool,
    slo: Option<blis_traces::slo::Slo>,
}

impl<S: Sink + Send + 'static> SinkThread<S> {
    /// Moves `sink` to a new thread.
    ///
    /// # Errors
    /// The thread cannot be started.
    pub fn new(sink: S) -> std::io::Result<Self> {
        let wants_tokens = sink.wants_tokens();
        let wants_upcoming = sink.wants_upcoming();
        let takes_cohort = sink.takes_cohort();
        let slo = sink.slo();
        let (to_sink, from_driver) = sync_channel::<Batch>(BATCHES_IN_FLIGHT);
        let (return_spare, spare) = sync_channel::<Batch>(BATCHES_IN_FLIGHT + 2);
        let thread = std::thread::Builder::new()
            .name("replay-outputs".into())
            .spawn(move || {
                let mut sink = sink;
                let mut report = StepReport::default();
                for mut batch in from_driver {
                    batch.replay_into(&mut sink, &mut report);
                    let _ = return_spare.try_send(batch);
                }
                sink
            })?;
        Ok(Self {
            batch: Batch::default(),
            to_sink: Some(to_sink),
            spare,
            spare_spans: Vec::new(),
            thread: Some(thread),
            wants_tokens,
            wants_upcoming,
            takes_cohort,
            slo,
        })
    }

    /// Waits until the inner sink has taken every call and returns it.
    ///
    /// # Panics
    /// If the inner sink panicked (with its panic).
    pub fn into_inner(mut self) -> S {
        self.hand_over();
        self.to_sink = None;
        let thread = self.thread.take().expect("the sink's thread");
        match thread.join() {
            Ok(sink) => sink,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }

    fn push(&mut self, event: Event) {
        self.batch.events.push(event);
        if self.batch.events.len() >= BATCH_EVENTS {
            self.hand_over();
        }
    }

    fn hand_over(&mut self) {
        if self.batch.events.is_empty() {
            return;
        }
        let mut next = self.spare.try_recv().unwrap_or_default();
        self.spare_spans.append(&mut next.spare_spans);
        let full = std::mem::replace(&mut self.batch, next);
        if let Some(tx) = &self.to_sink {
            // A closed channel means the thread is gone (it panicked):
            // `into_inner` passes the panic on.
            let _ = tx.send(full);
        }
    }
}

impl<S: Sink + Send + 'static> Drop for SinkThread<S> {
    fn drop(&mut self) {
        self.to_sink = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl<S: Sink + Send + 'static> Sink for SinkThread<S> {
    fn wants_tokens(&self) -> bool {
        self.wants_tokens
    }

    fn wants_token_records(&self) -> bool {
        false
    }

    fn takes_reports(&self) -> bool {
        true
    }

    fn takes_cohort(&self) -> bool {
        self.takes_cohort
    }

    fn take_report(&mut self, instance: u32, report: &mut StepReport, streaming: &[bool]) {
        let ends_from = self.batch.ends.len();
        self.batch.ends.extend_from_slice(&report.step_ends);
        let flags_from = self.batch.flags.len();
        self.batch
            .flags
            .extend(report.spans.iter().map(|s| streaming[s.tag as usize]));
        let notes_from = self.batch.notes.len();
        self.batch
            .notes
            .extend(report.cohort.iter().map(|&(at, note)| match note {
                CohortNote::Join(mut j) => {
                    j.streaming = streaming[j.tag as usize];
                    (at, CohortNote::Join(j))
                }
                other => (at, other),
            }));
        // A fresh vector is sized for a report like this one: grown from
        // empty, each of the (up to a few thousand) vectors in flight was
        // reallocated about log2(batch) times before the first came back.
        let fresh = self
            .spare_spans
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(report.spans.len()));
        self.batch
            .spans
            .push(std::mem::replace(&mut report.spans, fresh));
        self.push(Event::Report {
            instance,
            first_step: report.first_step,
            timing: report.timing(),
            ends_from,
            ends_len: report.step_ends.len(),
            spans: self.batch.spans.len() - 1,
            flags_from,
            notes_from,
            notes_to: self.batch.notes.len(),
        });
    }

    fn finished(&mut self, done: Done<'_>) {
        self.batch.records.push(done.rec);
        self.push(Event::Finished {
            fin: *done.fin,
            entry_us: done.entry_us,
            status: done.status,
        });
    }

    fn not_served(&mut self, rec: TraceRecord, entry_us: i64, why: NotServed) {
        self.batch.records.push(rec);
        self.push(Event::NotServed { entry_us, why });
    }

    fn sample(&mut self, t_us: i64, snap: &Snapshot) {
        self.batch.snaps.push(*snap);
        let snap = self.batch.snaps.len() - 1;
        self.push(Event::Sample { t_us, snap });
    }

    fn sample_pool(&mut self, t_us: i64, pool: &'static str, snap: &Snapshot) {
        self.batch.snaps.push(*snap);
        let snap = self.batch.snaps.len() - 1;
        self.push(Event::SamplePool { t_us, pool, snap });
    }

    fn sample_replicas(&mut self, t_us: i64, replicas: (u32, u32, u32)) {
        self.push(Event::SampleReplicas { t_us, replicas });
    }

    fn slo(&self) -> Option<blis_traces::slo::Slo> {
        self.slo
    }

    fn wants_upcoming(&self) -> bool {
        self.wants_upcoming
    }

    fn upcoming(&mut self, instance: u32, tokens: &[(u64, u32, i64)]) {
        let from = self.batch.upcoming.len();
        self.batch.upcoming.extend_from_slice(tokens);
        self.push(Event::Upcoming {
            instance,
            from,
            len: tokens.len(),
        });
    }
}
