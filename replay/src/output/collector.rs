//! What a replay writes: the predicted trace (`mode: replayed`, same request
//! ids, predicted chunk times, an ITL companion, the instance's time series
//! as a metrics companion with vLLM's metric names) and a summary.

use std::path::Path;
use std::sync::Arc;

use blis_traces::background::BackgroundWriter;
use blis_traces::itl_steps::TokenRun;
use blis_traces::{
    ChunkRecord, ExtraColumn, ItlForm, Outcome, Status, TraceHeader, TraceRecord, TraceWriter,
};
use rustc_hash::FxHashMap;

use super::delay_steps::DelaySteps;
use super::gap_counts::GapCounts;
use super::roster::Rosters;
use super::summary::{
    Anomalies, ClassFigures, CpuTierFigures, KvFigures, PrefixCache, RequestCounts, SloFigures,
    Summary, Throughput, dist_of_counts, dist_of_us, jain,
};
use crate::engine::instance::{CohortNote, Snapshot, SpanTimes, StepReport};
use crate::error::Result;
use crate::sim::{Done, NotServed, Sink};

#[derive(Debug, Default)]
struct ClassAcc {
    total: u64,
    completed: u64,
    rejected: u64,
    ttft: Vec<f64>,
    e2e: Vec<f64>,
}

/// What happened to one request (kept with [`Collector::track_outcomes`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RequestOutcome {
    /// Its status.
    pub status: Status,
    /// TTFT, µs (completed streaming requests).
    pub ttft_us: Option<i64>,
    /// E2E, µs (completed requests).
    pub e2e_us: Option<i64>,
}

/// Accumulates statistics (and optionally writes the predicted trace).
#[derive(Debug)]
pub struct Collector {
    /// Whether it takes the replay's tokens ([`Collector::records_only`]).
    tokens: bool,
    /// The files, written by a thread of their own.
    writer: Option<BackgroundWriter>,
    keep: Option<Vec<TraceRecord>>,
    itl_companion: bool,
    /// The ITL companion is in step form.
    itl_steps: bool,
    /// Instance and first step of the last [`Sink::steps`].
    step_batch: (u32, u64),
    /// Per tag, the run of tokens not yet written (step form).
    open_runs: Vec<Option<TokenRun>>,
    /// Row form: the token spans of the step report being delivered
    /// (request id, first chunk index, first step in the report, offset
    /// into `pending_times`, count), written step by step when the report
    /// ends.
    pending_spans: Vec<(u64, u32, usize, usize, usize)>,
    pending_times: Vec<i64>,
    /// The labels of the time series' samples.
    metric_labels: Arc<str>,
    run_start_us: i64,
    model_name: String,
    ttft: Vec<f64>,
    e2e: Vec<f64>,
    tpot: Vec<f64>,
    itl: GapCounts,
    /// The end times of the steps of the report being delivered, µs.
    report_ends: Vec<i64>,
    /// Inter-token gaps of the report being delivered counted per step: a
    /// difference array over `report_ends` whose prefix sum at step `k` is
    /// the number of tokens of step `k` whose gap to their request's
    /// previous token is `report_ends[k] - report_ends[k - 1]`.
    step_gaps: Vec<i64>,
    counts: RequestCounts,
    first_send: i64,
    last_done: i64,
    input_tokens: u64,
    output_tokens: u64,
    kv_peak: f64,
    kv_sum: f64,
    kv_n: u64,
    tenant_tokens: std::collections::BTreeMap<String, u64>,
    classes: std::collections::BTreeMap<String, ClassAcc>,
    outcomes: Option<FxHashMap<u64, RequestOutcome>>,
    /// `--slo` and the requests that attained it.
    slo: Option<(blis_traces::slo::Slo, u64)>,
    /// P/D: the time series' labels of each pool.
    pool_labels: Vec<(&'static str, Arc<str>)>,
    /// Why the first request dropped as unservable was, and what would
    /// serve it.
    first_drop: Option<(String, &'static str)>,
    /// The steady decoders told of in compact form ([`Sink::cohort`]).
    rosters: Rosters,
    /// The members leaving at once (a spare vector).
    leaving: Vec<(super::roster::Member, Option<(u32, u64)>)>,
    /// The gap increments of a per-token output delay.
    delay_steps: DelaySteps,
    /// Spare per-step counts of [`Collector::count_member_gaps`].
    member_ups: Vec<u32>,
    member_counts: Vec<i64>,
}

impl Collector {
    /// A collector that writes a trace bundle at `prefix` (header `header`),
    /// with the ITL companion in the form `itl` and the time series when
    /// `metrics`.
    ///
    /// # Errors
    /// The files cannot be created.
    pub fn to_files(
        prefix: &Path,
        header: &TraceHeader,
        extras: &[ExtraColumn],
        itl: ItlForm,
        metrics: bool,
    ) -> Result<Self> {
        let mut extras = extras.to_vec();
        if !extras.contains(&ExtraColumn::CachedTokens) {
            extras.push(ExtraColumn::CachedTokens);
        }
        let w = TraceWriter::create_with(prefix, header, &extras, itl, metrics)?;
        let mut c = Self::new(
            header.run_start_unix_us.unwrap_or(0),
            matches!(itl, ItlForm::Rows { .. }),
        );
        c.itl_steps = matches!(itl, ItlForm::Steps(_));
        c.model_name = header
            .server
            .as_ref()
            .and_then(|s| s.model.clone())
            .unwrap_or_default();
        c.metric_labels = Arc::from(format!("model_name=\"{}\"", c.model_name.replace('"', "'")));
        c.writer = Some(BackgroundWriter::new(w)?);
        Ok(c)
    }

    /// A collector that keeps the predicted records in memory.
    pub fn in_memory(run_start_us: i64) -> Self {
        let mut c = Self::new(run_start_us, false);
        c.keep = Some(Vec::new());
        c
    }

    /// A collector that keeps the predicted records in memory and takes no
    /// tokens: every record is what [`Collector::in_memory`] keeps (a
    /// record comes from its request's completion alone), but the
    /// summary's inter-token figures (ITL) stay empty. For callers that
    /// read only the records (fitting, benchmarks), which then skip the
    /// per-token work.
    pub fn records_only(run_start_us: i64) -> Self {
        let mut c = Self::in_memory(run_start_us);
        c.tokens = false;
        c
    }

    /// Judges every completed request against `slo` (the summary's `slo`).
    pub fn judge_slo(&mut self, slo: blis_traces::slo::Slo) {
        self.slo = Some((slo, 0));
    }

    /// Keeps every request's outcome (for decision traces).
    pub fn track_outcomes(&mut self) {
        self.outcomes = Some(FxHashMap::default());
    }

    /// The outcomes kept by [`Collector::track_outcomes`].
    pub fn outcomes(&self) -> Option<&FxHashMap<u64, RequestOutcome>> {
        self.outcomes.as_ref()
    }

    fn record_outcome(
        &mut self,
        rec: &TraceRecord,
        status: Status,
        ttft: Option<i64>,
        e2e: Option<i64>,
    ) {
        let class = &rec.request.slo_class;
        if !class.is_empty() {
            let c = self.classes.entry(class.to_string()).or_default();
            c.total += 1;
            match status {
                Status::Ok => {
                    c.completed += 1;
                    if let Some(t) = ttft {
                        c.ttft.push(t as f64);
                    }
                    if let Some(e) = e2e {
                        c.e2e.push(e as f64);
                    }
                }
                _ if rec
                    .outcome
                    .error_message
                    .starts_with("rejected by admission") =>
                {
                    c.rejected += 1;
                }
                _ => {}
            }
        }
        if let Some(o) = &mut self.outcomes {
            o.insert(
                rec.request.request_id,
                RequestOutcome {
                    status,
                    ttft_us: ttft,
                    e2e_us: e2e,
                },
            );
        }
    }

    /// A collector of statistics only.
    pub fn stats_only() -> Self {
        Self::new(0, false)
    }

    fn new(run_start_us: i64, itl: bool) -> Self {
        Self {
            tokens: true,
            writer: None,
            keep: None,
            itl_companion: itl,
            itl_steps: false,
            step_batch: (0, 0),
            open_runs: Vec::new(),
            pending_spans: Vec::new(),
            pending_times: Vec::new(),
            metric_labels: Arc::from(""),
            run_start_us,
            model_name: String::new(),
            ttft: Vec::new(),
            e2e: Vec::new(),
            tpot: Vec::new(),
            itl: GapCounts::default(),
            report_ends: Vec::new(),
            step_gaps: Vec::new(),
            tenant_tokens: std::collections::BTreeMap::new(),
            classes: std::collections::BTreeMap::new(),
            outcomes: None,
            slo: None,
            pool_labels: Vec::new(),
            first_drop: None,
            rosters: Rosters::default(),
            leaving: Vec::new(),
            delay_steps: DelaySteps::default(),
            member_ups: Vec::new(),
            member_counts: Vec::new(),
            counts: RequestCounts::default(),
            first_send: i64::MAX,
            last_done: i64::MIN,
            input_tokens: 0,
            output_tokens: 0,
            kv_peak: 0.0,
            kv_sum: 0.0,
            kv_n: 0,
        }
    }

    /// Counts `n` inter-token gaps of `gap` µs.
    #[inline]
    fn add_itl(&mut self, gap: i64, n: u64) {
        self.itl.add(gap, n);
    }

    /// Writes the open run of tokens of `tag` (step form).
    /// Row form: writes the chunks of the report's spans in step order,
    /// each step's in running order (the order single steps produce them,
    /// whatever runs of steps were fast-forwarded together).
    fn write_pending_rows(&mut self) {
        let Some(w) = &mut self.writer else { return };
        let steps = self
            .pending_spans
            .iter()
            .map(|s| s.2 + s.4)
            .max()
            .unwrap_or(0);
        for step in 0..steps {
            for &(id, first, from, at, count) in &self.pending_spans {
                if step >= from && step < from + count {
                    let m = step - from;
                    let c = ChunkRecord {
                        request_id: id,
                        chunk_index: first + m as u32,
                        timestamp_us: self.run_start_us + self.pending_times[at + m],
                        tokens: None,
                    };
                    w.write_chunk(c);
                }
            }
        }
        self.pending_spans.clear();
        self.pending_times.clear();
    }

    fn close_run(&mut self, tag: usize) {
        let Some(run) = self.open_runs.get_mut(tag).and_then(Option::take) else {
            return;
        };
        if let Some(w) = &mut self.writer {
            w.write_run(run);
        }
    }

    /// Counts the gaps of the report being delivered that were kept per
    /// step ([`Collector::step_gaps`]).
    fn flush_step_gaps(&mut self) {
        let steps = self.report_ends.len();
        let mut covered = 0i64;
        for k in 1..steps {
            covered += self.step_gaps[k];
            if covered > 0 {
                let gap = self.report_ends[k] - self.report_ends[k - 1];
                self.add_itl(gap, covered as u64);
            }
        }
        let used = (steps + 1).min(self.step_gaps.len());
        self.step_gaps[..used].fill(0);
        self.report_ends.clear();
    }

    /// Step form: extends the request's open run of tokens with `times`'
    /// span, or closes it and opens a new one.
    #[inline(never)]
    fn extend_token_run(&mut self, times: SpanTimes<'_>) {
        let span = times.span();
        let (instance, base) = self.step_batch;
        let run = TokenRun {
            request_id: span.id,
            instance,
            join: span.join,
            first_index: span.first_index,
            first_step: base + u64::from(span.first_step),
            count: times.len() as u32,
            output_tokens: span.target,
        };
        self.extend_run(span.tag as usize, run);
    }

    /// Step form: extends the open run of tokens of `t` with `run`, or
    /// closes it and opens `run`.
    fn extend_run(&mut self, t: usize, run: TokenRun) {
        if self.open_runs.len() <= t {
            self.open_runs.resize(t + 1, None);
        }
        match &mut self.open_runs[t] {
            Some(open) if open.continues_with(&run) => open.count += run.count,
            _ => {
                self.close_run(t);
                self.open_runs[t] = Some(run);
            }
        }
    }

    /// Row form: queues the span's chunks until the report's rows are
    /// written in step order.
    #[inline(never)]
    fn queue_token_rows(&mut self, times: SpanTimes<'_>) {
        let span = times.span();
        self.pending_spans.push((
            span.id,
            span.first_index - 1,
            span.first_step as usize,
            self.pending_times.len(),
            times.len(),
        ));
        self.pending_times.extend(times.iter());
    }

    /// Counts the inter-token gaps of one span: the first token's to the
    /// request's previous token, then the others'. Without a per-token
    /// overhead the inner gaps are the steps' gaps and are counted per
    /// step when the report ends (O(1) here), apart from a last token that
    /// carries a completion overhead.
    fn count_gaps(&mut self, times: SpanTimes<'_>) {
        let span = times.span();
        let n = times.len();
        if n == 0 {
            return;
        }
        if span.first_index > 1
            && let Some(previous) = times.previous()
        {
            self.add_itl(times.get(0) - previous, 1);
        }
        let per_step = times
            .step_gap_tokens()
            .filter(|_| self.report_ends.len() == times.step_ends().len());
        if let Some(inner_end) = per_step {
            if inner_end >= 2 {
                let first = span.first_step as usize;
                self.step_gaps[first + 1] += 1;
                self.step_gaps[first + inner_end] -= 1;
            }
            if inner_end < n && n >= 2 {
                self.add_itl(times.get(n - 1) - times.get(n - 2), 1);
            }
        } else {
            self.count_gaps_per_token(times);
        }
    }

    /// [`Collector::count_gaps`] of the tokens after the first when their
    /// delays differ (a per-token overhead): runs of equal gaps (a
    /// fast-forwarded run's decode steps) are counted at once.
    #[inline(never)]
    fn count_gaps_per_token(&mut self, times: SpanTimes<'_>) {
        let mut run_gap = i64::MIN;
        let mut run_len = 0u64;
        let mut prev = times.get(0);
        for t in times.iter().skip(1) {
            let g = t - prev;
            if g == run_gap {
                run_len += 1;
            } else {
                if run_len > 0 {
                    self.add_itl(run_gap, run_len);
                }
                run_gap = g;
                run_len = 1;
            }
            prev = t;
        }
        if run_len > 0 {
            self.add_itl(run_gap, run_len);
        }
    }

    /// A steady decoder leaves the roster: its tokens as a member join its
    /// token run (what a span per step would have made of them).
    fn settle(&mut self, tag: u32) {
        if let Some((m, tokens)) = self.rosters.leave(tag) {
            self.settle_member(&m, tokens);
        }
    }

    /// [`Collector::settle`] of a member taken out of the roster, with its
    /// tokens as a member (count, first step).
    fn settle_member(&mut self, m: &super::roster::Member, tokens: Option<(u32, u64)>) {
        let tag = m.join.tag;
        if let Some((count, first_step)) = tokens
            && m.join.streaming
            && self.itl_steps
        {
            let j = m.join;
            self.extend_run(
                tag as usize,
                TokenRun {
                    request_id: j.id,
                    instance: m.instance,
                    join: j.join,
                    first_index: j.next_index,
                    first_step,
                    count,
                    output_tokens: j.target,
                },
            );
        }
    }

    /// Counts the inter-token gaps of `count` steps of the members of
    /// `instance` from report step `first`, `completing` of them ending
    /// their output at the last: the gaps each span would have counted
    /// ([`Collector::count_gaps`]), by step rather than by member. A member
    /// that joined since the last steps has its first gap counted alone
    /// (its token before may be older than the step before); every other
    /// token's gap is its step's, plus, on a request's last token, the
    /// completion delay's excess.
    fn count_cohort_gaps(
        &mut self,
        instance: u32,
        report: &StepReport,
        first: usize,
        count: usize,
        completing: u64,
    ) {
        let itl = report.timing().itl();
        let ends = &report.step_ends;
        let r = self.rosters.roster(instance);
        let members = r.tags.len() as u64;
        debug_assert!(
            r.tags.len() == r.fresh.len() || r.next_step == r.report_first_step + first as u64,
            "a member's tokens are in consecutive steps"
        );
        let prev_end = r.prev_end;
        let first_step = r.report_first_step + first as u64;
        let fresh = std::mem::take(&mut r.fresh);
        let mut fresh_done = 0u64;
        for &tag in &fresh {
            let Some(m) = self.rosters.by_tag[tag as usize] else {
                continue;
            };
            let j = m.join;
            if self.itl_steps && j.streaming {
                // Its first token as a member ends an open run it does not
                // continue, as its span would have now.
                let next = TokenRun {
                    request_id: j.id,
                    instance,
                    join: j.join,
                    first_index: j.next_index,
                    first_step,
                    count: 1,
                    output_tokens: j.target,
                };
                if self
                    .open_runs
                    .get(tag as usize)
                    .and_then(Option::as_ref)
                    .is_some_and(|open| !open.continues_with(&next))
                {
                    self.close_run(tag as usize);
                }
            }
            let ends_output = j.next_index >= j.target;
            let t0 = ends[first] + itl.extra_us(j.next_index, ends_output);
            if j.next_index > 1
                && let Some(previous) = j.previous_us
            {
                self.add_itl(t0 - previous, 1);
            }
            if count == 1 && ends_output {
                fresh_done += 1;
            }
        }
        let n_fresh = fresh.len() as u64;
        let mut fresh = fresh;
        fresh.clear();
        self.rosters.roster(instance).fresh = fresh;
        let Some((plain, last)) = report.constant_extras() else {
            // A delay that grows with the token's index: each member's
            // gaps from its own indices.
            self.count_member_gaps(instance, ends, first, count, prev_end, &itl);
            let r = self.rosters.roster(instance);
            r.steps_done += count as u64;
            r.next_step = r.report_first_step + (first + count) as u64;
            return;
        };
        let excess = last - plain;
        // Tokens of step `s` whose gap is the step's (plus `extra`).
        let at_step = |c: &mut Self, s: usize, n: u64, extra: i64| {
            if n == 0 {
                return;
            }
            if s == 0 {
                let Some(prev) = prev_end else {
                    debug_assert!(false, "members without a step before");
                    return;
                };
                c.add_itl(ends[0] - prev + extra, n);
            } else if extra != 0 {
                c.add_itl(ends[s] - ends[s - 1] + extra, n);
            } else {
                c.step_gaps[s] += n as i64;
                c.step_gaps[s + 1] -= n as i64;
            }
        };
        let last_step = first + count - 1;
        if count == 1 {
            let n = members - n_fresh;
            let done = completing - fresh_done;
            at_step(self, first, n - done, 0);
            at_step(self, first, done, excess);
        } else {
            at_step(self, first, members - n_fresh, 0);
            if count > 2 {
                // Steps first + 1 ..= last_step − 1: every member.
                self.step_gaps[first + 1] += members as i64;
                self.step_gaps[last_step] -= members as i64;
            }
            at_step(self, last_step, members - completing, 0);
            at_step(self, last_step, completing, excess);
        }
        let r = self.rosters.roster(instance);
        r.steps_done += count as u64;
        r.next_step = r.report_first_step + (first + count) as u64;
    }

    /// Counts the gaps of the steady decoders of `instance` over the
    /// `count` steps of `ends` from `first` (the step before the first
    /// ends at `prev_end` when `first` is 0) under a delay that grows with
    /// a token's index: a token's gap is its step's plus its index's
    /// increment ([`DelaySteps`]), so each step's gaps are counted from how
    /// many members sit at indices of each increment; a member's last
    /// token (with the completion's delay) is counted on its own.
    fn count_member_gaps(
        &mut self,
        instance: u32,
        ends: &[i64],
        first: usize,
        count: usize,
        prev_end: Option<i64>,
        itl: &blis_traces::itl_steps::ItlTiming,
    ) {
        let step_gap = |q: usize| -> Option<i64> {
            let s = first + q;
            let before = if s == 0 { prev_end? } else { ends[s - 1] };
            Some(ends[s] - before)
        };
        // Per step: members at an index of the larger increment, and (a
        // difference array) members with a token there.
        let mut ups = std::mem::take(&mut self.member_ups);
        let mut with = std::mem::take(&mut self.member_counts);
        ups.clear();
        ups.resize(count, 0);
        with.clear();
        with.resize(count + 1, 0);
        let r = &self.rosters.of[instance as usize];
        // Each member's tokens in these steps: its first index, the steps
        // from which it has tokens (a new member's first gap is counted
        // apart) and before which they are not its last.
        let steps_done = r.steps_done;
        let members = r.spans.iter().map(|m| {
            let done = steps_done - m.s0;
            let base = m.next_index + done as u32;
            let q0 = usize::from(done == 0).min(count);
            let q_last = (m.target.saturating_sub(base) as usize).clamp(q0, count);
            (base, q0, q_last)
        });
        // (The table is made once, before its smaller increment is used,
        // up to the longest output of the instance's members so far: every
        // index a member's tokens reach in these steps.)
        let by_table = self.delay_steps.prepare(itl, r.max_target);
        if count == 1
            && by_table
            && let Some(g) = step_gap(0)
        {
            // One step (most notes): the general loop below for a single
            // token each, without its per-step arrays.
            let up = self.delay_steps.up();
            let (mut n_up, mut n) = (0u64, 0u64);
            for m in &r.spans {
                let done = steps_done - m.s0;
                if done == 0 {
                    // (Its first gap as a member is counted apart.)
                    continue;
                }
                let base = m.next_index + done as u32;
                if base < m.target {
                    n_up += u64::from(up[base as usize]);
                    n += 1;
                } else {
                    let extra = itl.extra_us(base, true) - itl.extra_us(base - 1, false);
                    self.itl.add(g + extra, 1);
                }
            }
            if n > 0 {
                let lo = self.delay_steps.lo();
                self.itl.add(g + lo, n - n_up);
                self.itl.add(g + lo + 1, n_up);
            }
            self.member_ups = ups;
            self.member_counts = with;
            return;
        }
        for (base, q0, q_last) in members {
            // Its tokens before its last by the table, when it serves.
            let by_token = if by_table && q_last > q0 {
                let up = &self.delay_steps.up()[(base as usize + q0)..(base as usize + q_last)];
                for (n, &u) in ups[q0..q_last].iter_mut().zip(up) {
                    *n += u32::from(u);
                }
                with[q0] += 1;
                with[q_last] -= 1;
                q_last
            } else {
                q0
            };
            // The others (its last with the completion's delay) one by one.
            for q in by_token..count {
                if let Some(g) = step_gap(q) {
                    let i = base + q as u32;
                    let extra = itl.extra_us(i, q >= q_last) - itl.extra_us(i - 1, false);
                    self.itl.add(g + extra, 1);
                }
            }
        }
        let lo = self.delay_steps.lo();
        let mut members = 0i64;
        for q in 0..count {
            members += with[q];
            if members == 0 {
                continue;
            }
            if let Some(g) = step_gap(q) {
                let up = i64::from(ups[q]);
                self.itl.add(g + lo, (members - up) as u64);
                self.itl.add(g + lo + 1, up as u64);
            } else {
                debug_assert!(false, "members without a step before");
            }
        }
        self.member_ups = ups;
        self.member_counts = with;
    }

    fn emit(&mut self, rec: TraceRecord) {
        match (&mut self.writer, &mut self.keep) {
            (Some(w), Some(k)) => {
                w.write_record(rec.clone());
                k.push(rec);
            }
            (Some(w), None) => w.write_record(rec),
            (None, Some(k)) => k.push(rec),
            (None, None) => {}
        }
    }

    /// Ends the replay: the summary, the kept records (if any), after
    /// finishing the files with `header`.
    ///
    /// # Errors
    /// A write that failed during the replay or now.
    pub fn finish(
        mut self,
        header: &TraceHeader,
        last: &Snapshot,
        latency_model: &str,
    ) -> Result<(Summary, Option<Vec<TraceRecord>>)> {
        for tag in 0..self.rosters.by_tag.len() {
            self.settle(tag as u32);
        }
        self.flush_step_gaps();
        self.write_pending_rows();
        for tag in 0..self.open_runs.len() {
            self.close_run(tag);
        }
        if let Some(w) = self.writer.take() {
            w.finish(header)?;
        }
        let duration_s = if self.last_done > self.first_send {
            (self.last_done - self.first_send) as f64 / 1e6
        } else {
            0.0
        };
        let per_s = |x: f64| {
            if duration_s > 0.0 {
                x / duration_s
            } else {
                0.0
            }
        };
        let c = last.counters;
        let summary = Summary {
            version: 1,
            latency_model: latency_model.to_string(),
            requests: self.counts,
            ttft_ms: dist_of_us(std::mem::take(&mut self.ttft)),
            e2e_ms: dist_of_us(std::mem::take(&mut self.e2e)),
            itl_ms: dist_of_counts(&self.itl.sorted()),
            tpot_ms: dist_of_us(std::mem::take(&mut self.tpot)),
            throughput: Throughput {
                duration_s,
                requests_per_s: per_s(self.counts.completed as f64),
                input_tokens_per_s: per_s(self.input_tokens as f64),
                output_tokens_per_s: per_s(self.output_tokens as f64),
            },
            preemptions: c.preemptions,
            anomalies: Anomalies {
                priority_inversions: c.priority_inversions,
                hol_blocking_events: c.hol_blocking_events,
            },
            prefix_cache: PrefixCache {
                query_tokens: c.prefix_queries,
                hit_tokens: c.prefix_hits,
                hit_rate: c.prefix_hit_rate(),
            },
            kv: KvFigures {
                total_blocks: last.kv_total,
                peak_usage: self.kv_peak,
                mean_usage: if self.kv_n > 0 {
                    self.kv_sum / self.kv_n as f64
                } else {
                    0.0
                },
                cpu_tier: (last.kv_cpu_total > 0).then(|| cpu_tier_figures(last)),
            },
            steps: c.steps,
            fast_forwarded_steps: c.fast_forwarded_steps,
            slo_classes: std::mem::take(&mut self.classes)
                .into_iter()
                .map(|(k, c)| {
                    (
                        k,
                        ClassFigures {
                            total: c.total,
                            completed: c.completed,
                            rejected: c.rejected,
                            ttft_ms: dist_of_us(c.ttft),
                            e2e_ms: dist_of_us(c.e2e),
                        },
                    )
                })
                .collect(),
            tenant_output_tokens_per_s: self
                .tenant_tokens
                .iter()
                .map(|(t, n)| (t.clone(), per_s(*n as f64)))
                .collect(),
            jain_fairness: jain(self.tenant_tokens.values().map(|n| *n as f64)),
            cluster: None,
            fitness: None,
            slo: self.slo.map(|(slo, attained)| {
                let requests = self.counts.total;
                SloFigures {
                    slo,
                    requests,
                    attained,
                    attainment: if requests > 0 {
                        attained as f64 / requests as f64
                    } else {
                        0.0
                    },
                    goodput_per_s: per_s(attained as f64),
                }
            }),
            first_drop_hint: self.first_drop.as_ref().map(|d| d.1),
            first_drop_reason: self.first_drop.map(|d| d.0),
        };
        Ok((summary, self.keep))
    }
}

impl Sink for Collector {
    fn wants_tokens(&self) -> bool {
        self.tokens
    }

    fn steps(&mut self, instance: u32, first_step: u64, ends: &[i64]) {
        if !self.pending_spans.is_empty() {
            self.write_pending_rows();
        }
        if self.takes_cohort() {
            let r = self.rosters.roster(instance);
            r.prev_end = r.last_end;
            r.last_end = ends.last().copied();
            r.report_first_step = first_step;
        }
        self.flush_step_gaps();
        self.report_ends.extend_from_slice(ends);
        if self.step_gaps.len() <= ends.len() {
            self.step_gaps.resize(ends.len() + 1, 0);
        }
        if !self.itl_steps {
            return;
        }
        self.step_batch = (instance, first_step);
        let Some(w) = &mut self.writer else { return };
        w.write_steps(instance, first_step, ends, self.run_start_us);
    }

    fn wants_token_records(&self) -> bool {
        // (Only whether it streams, which comes with the tokens.)
        false
    }

    fn takes_cohort(&self) -> bool {
        // (The per-token rows are written in step order from spans.)
        self.tokens && !(self.itl_companion && self.writer.is_some())
    }

    fn cohort(&mut self, instance: u32, note: &CohortNote, report: &StepReport) {
        match *note {
            CohortNote::Join(join) => {
                self.settle(join.tag);
                self.rosters.join(instance, join);
            }
            CohortNote::Steps {
                first_step,
                count,
                completing,
            } => self.count_cohort_gaps(
                instance,
                report,
                first_step as usize,
                count as usize,
                u64::from(completing),
            ),
            CohortNote::Leave { tag } => {
                if self
                    .rosters
                    .by_tag
                    .get(tag as usize)
                    .copied()
                    .flatten()
                    .map(|m| m.instance)
                    == Some(instance)
                {
                    self.settle(tag);
                }
            }
            CohortNote::LeaveAll => {
                let mut left = std::mem::take(&mut self.leaving);
                self.rosters.leave_all(instance, &mut left);
                for (m, tokens) in left.drain(..) {
                    self.settle_member(&m, tokens);
                }
                self.leaving = left;
            }
        }
    }

    fn tokens(&mut self, _rec: Option<&TraceRecord>, streaming: bool, times: SpanTimes<'_>) {
        let tag = times.span().tag;
        if self.rosters.contains(tag) {
            // (A former steady decoder whose leaving is not yet told.)
            self.settle(tag);
        }
        if self.itl_steps && streaming {
            self.extend_token_run(times);
        }
        self.count_gaps(times);
        if self.itl_companion && streaming && self.writer.is_some() {
            self.queue_token_rows(times);
        }
    }

    fn finished(&mut self, done: Done<'_>) {
        let Done {
            mut rec,
            entry_us,
            fin,
            status,
        } = done;
        self.settle(fin.tag);
        self.close_run(fin.tag as usize);
        let input = rec.effective_input_tokens().max(1);
        let streaming = rec.request.streaming;
        let first = if streaming {
            fin.first_token_us
        } else {
            fin.last_token_us
        };
        self.counts.total += 1;
        match status {
            Status::Ok => self.counts.completed += 1,
            Status::Error => self.counts.scaled_down += 1,
            _ => self.counts.cancelled += 1,
        }
        if status == Status::Ok
            && let Some((slo, attained)) = &mut self.slo
        {
            let ms = |us: i64| us as f64 / 1e3;
            let ttft = streaming.then(|| ms(fin.first_token_us - entry_us));
            let tpot = (streaming && fin.output_tokens > 1).then(|| {
                ms(fin.last_token_us - fin.first_token_us) / f64::from(fin.output_tokens - 1)
            });
            if slo.attained(ttft, tpot, ms(fin.last_token_us - entry_us)) {
                *attained += 1;
            }
        }
        if status == Status::Ok {
            if streaming {
                self.ttft.push((fin.first_token_us - entry_us) as f64);
            }
            self.e2e.push((fin.last_token_us - entry_us) as f64);
            if fin.output_tokens > 1 && streaming {
                self.tpot.push(
                    (fin.last_token_us - fin.first_token_us) as f64
                        / f64::from(fin.output_tokens - 1),
                );
            }
            self.input_tokens += u64::from(input);
        }
        self.output_tokens += u64::from(fin.output_tokens);
        if !rec.request.tenant_id.is_empty() {
            *self
                .tenant_tokens
                .entry(rec.request.tenant_id.to_string())
                .or_insert(0) += u64::from(fin.output_tokens);
        }
        self.first_send = self.first_send.min(entry_us);
        self.last_done = self.last_done.max(fin.last_token_us);
        let rs = self.run_start_us;
        rec.request.output_tokens = fin.output_tokens;
        rec.outcome = Outcome {
            server_input_tokens: Some(input),
            send_time_us: Some(rs + entry_us),
            first_chunk_time_us: Some(rs + first),
            last_chunk_time_us: Some(rs + fin.last_token_us),
            num_chunks: if streaming { fin.output_tokens } else { 1 },
            status: Some(status),
            error_message: if status == Status::Ok {
                String::new()
            } else {
                "client cancelled (timeout)".into()
            },
            finish_reason: if status == Status::Ok {
                "length".into()
            } else {
                "abort".into()
            },
            http_status: None,
            cached_tokens: Some(fin.cached_tokens),
            x_request_id: None,
        };
        let ok = status == Status::Ok;
        self.record_outcome(
            &rec,
            status,
            (ok && streaming).then_some(fin.first_token_us - entry_us),
            ok.then_some(fin.last_token_us - entry_us),
        );
        self.emit(rec);
    }

    fn not_served(&mut self, mut rec: TraceRecord, entry_us: i64, why: NotServed) {
        self.counts.total += 1;
        let (status, msg) = match &why {
            NotServed::Dropped(d) => {
                self.counts.dropped += 1;
                let why = d.to_string();
                if self.first_drop.is_none() {
                    self.first_drop = Some((why.clone(), d.hint()));
                }
                (Status::Error, why)
            }
            NotServed::InputError => {
                self.counts.input_errors += 1;
                (Status::Error, rec.outcome.error_message.clone())
            }
            NotServed::CancelledWaiting => {
                self.counts.cancelled += 1;
                (
                    Status::Timeout,
                    "client cancelled before the first token".to_string(),
                )
            }
            NotServed::Unfinished => {
                self.counts.unfinished += 1;
                (Status::Cancelled, "replay horizon reached".to_string())
            }
            NotServed::Interrupted => {
                self.counts.unfinished += 1;
                (
                    Status::Cancelled,
                    "replay interrupted before it finished".to_string(),
                )
            }
            NotServed::ScaledDown => {
                self.counts.scaled_down += 1;
                (
                    Status::Error,
                    "its replica was scaled down (drain policy immediate)".to_string(),
                )
            }
            NotServed::Rejected(policy) => {
                self.counts.rejected += 1;
                (
                    Status::Error,
                    format!("rejected by admission policy {policy}"),
                )
            }
        };
        rec.outcome = Outcome {
            send_time_us: Some(self.run_start_us + entry_us),
            status: Some(status),
            error_message: msg,
            ..Outcome::default()
        };
        self.record_outcome(&rec, status, None, None);
        self.emit(rec);
    }

    fn sample(&mut self, t_us: i64, snap: &Snapshot) {
        let u = snap.kv_usage();
        self.kv_peak = self.kv_peak.max(u);
        self.kv_sum += u;
        self.kv_n += 1;
        let labels = Arc::clone(&self.metric_labels);
        self.write_sample(t_us, &labels, snap);
    }

    fn slo(&self) -> Option<blis_traces::slo::Slo> {
        self.slo.map(|(s, _)| s)
    }

    fn sample_replicas(&mut self, t_us: i64, (ready, starting, draining): (u32, u32, u32)) {
        let Some(w) = &mut self.writer else { return };
        let t = self.run_start_us + t_us;
        let rows: [(&'static str, f64); 3] = [
            ("blis:replicas_ready", f64::from(ready)),
            ("blis:replicas_starting", f64::from(starting)),
            ("blis:replicas_draining", f64::from(draining)),
        ];
        w.write_metric_scrape(t, &self.metric_labels, &rows);
    }

    fn sample_pool(&mut self, t_us: i64, pool: &'static str, snap: &Snapshot) {
        let labels = match self.pool_labels.iter().find(|(p, _)| *p == pool) {
            Some((_, l)) => Arc::clone(l),
            None => {
                let sep = if self.metric_labels.is_empty() {
                    ""
                } else {
                    ","
                };
                let l: Arc<str> = Arc::from(format!("{}{sep}pool=\"{pool}\"", self.metric_labels));
                self.pool_labels.push((pool, Arc::clone(&l)));
                l
            }
        };
        self.write_sample(t_us, &labels, snap);
    }
}

impl Collector {
    /// Writes the time-series rows of `snap` at `t_us` with `labels`.
    fn write_sample(&mut self, t_us: i64, labels: &Arc<str>, snap: &Snapshot) {
        let u = snap.kv_usage();
        let Some(w) = &mut self.writer else { return };
        let t = self.run_start_us + t_us;
        let c = snap.counters;
        let rows: [(&'static str, f64); 10] = [
            ("vllm:num_requests_running", f64::from(snap.running)),
            ("vllm:num_requests_waiting", f64::from(snap.waiting)),
            ("vllm:kv_cache_usage_perc", u),
            ("vllm:prefix_cache_queries_total", c.prefix_queries as f64),
            ("vllm:prefix_cache_hits_total", c.prefix_hits as f64),
            ("vllm:num_preemptions_total", c.preemptions as f64),
            ("vllm:prompt_tokens_total", c.prompt_tokens as f64),
            ("vllm:generation_tokens_total", c.generation_tokens as f64),
            ("vllm:request_success_total", c.completed as f64),
            ("blis:num_steps_total", c.steps as f64),
        ];
        w.write_metric_scrape(t, labels, &rows);
        if snap.kv_cpu_total > 0 {
            let cpu = snap.kv_cpu_used as f64 / snap.kv_cpu_total as f64;
            let tier: [(&'static str, f64); 6] = [
                (
                    "vllm:external_prefix_cache_queries_total",
                    c.external_queries as f64,
                ),
                (
                    "vllm:external_prefix_cache_hits_total",
                    c.external_hits as f64,
                ),
                ("blis:kv_cpu_usage_perc", cpu),
                ("blis:kv_offloads_total", c.tier.offloads as f64),
                ("blis:kv_reloads_total", c.tier.reloads as f64),
                ("blis:kv_thrashing_total", c.tier.thrashing as f64),
            ];
            w.write_metric_scrape(t, labels, &tier);
        }
    }
}

/// The CPU tier's figures at the end of a replay.
fn cpu_tier_figures(last: &Snapshot) -> CpuTierFigures {
    let c = &last.counters;
    let ratio = |a: u64, b: u64| if b > 0 { a as f64 / b as f64 } else { 0.0 };
    CpuTierFigures {
        total_blocks: last.kv_cpu_total,
        used_blocks: last.kv_cpu_used,
        offloads: c.tier.offloads,
        reloads: c.tier.reloads,
        query_tokens: c.external_queries,
        hit_tokens: c.external_hits,
        hit_rate: ratio(c.external_hits, c.external_queries),
        thrashing: c.tier.thrashing,
        thrashing_rate: ratio(c.tier.thrashing, c.tier.offloads),
        cpu_evictions: c.tier.cpu_evictions,
        transfers: c.tier.transfers,
        transfer_ms: c.tier.transfer_us as f64 / 1e3,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::instance::{StepReport, TokenSpan, TokenTiming};
    use proptest::prelude::*;

    /// One request's tokens in one report: (request, first step, count).
    type Plan = Vec<Vec<(usize, u32, u32)>>;

    fn reports() -> impl Strategy<Value = (Vec<Vec<i64>>, Plan, Vec<u32>, TokenTiming)> {
        let timing = (
            prop_oneof![Just(0.0), Just(100.4)],
            prop_oneof![Just(0.0), Just(0.7)],
            prop_oneof![Just(0.0), Just(300.6)],
        )
            .prop_map(|(hop_us, per_token_us, completion_us)| TokenTiming {
                per_token_us,
                hop_us,
                completion_us,
            });
        let report = (
            proptest::collection::vec(prop_oneof![Just(10i64), Just(20), Just(35)], 1..6),
            proptest::collection::vec((0usize..5, 0u32..6, 1u32..6), 0..6),
        );
        (
            proptest::collection::vec(report, 1..12),
            proptest::collection::vec(1u32..20, 5),
            timing,
        )
            .prop_map(|(reports, targets, timing)| {
                let mut t = 0i64;
                let mut ends = Vec::new();
                let mut plan = Vec::new();
                for (gaps, spans) in reports {
                    let e: Vec<i64> = gaps
                        .iter()
                        .map(|g| {
                            t += g;
                            t
                        })
                        .collect();
                    let k = e.len() as u32;
                    let mut seen = [false; 5];
                    let mut p = Vec::new();
                    for (req, first, count) in spans {
                        if seen[req] {
                            continue;
                        }
                        seen[req] = true;
                        let first = first % k;
                        p.push((req, first, count.min(k - first)));
                    }
                    ends.push(e);
                    plan.push(p);
                }
                (ends, plan, targets, timing)
            })
    }

    proptest! {
        /// The inter-token gaps counted per step (no per-token overhead)
        /// or per token are exactly the gaps between each request's
        /// consecutive client-visible token times.
        #[test]
        fn itl_counts_equal_the_gaps_of_the_token_times(
            (ends, plan, targets, timing) in reports()
        ) {
            let mut c = Collector::stats_only();
            let rec = TraceRecord::default();
            let mut generated = [0u32; 5];
            let mut last = [None::<i64>; 5];
            let mut want: FxHashMap<i64, u64> = FxHashMap::default();
            for (e, spans) in ends.iter().zip(&plan) {
                let mut report = StepReport::default();
                report.step_ends = e.clone();
                report.set_timing(timing);
                for &(req, first_step, count) in spans {
                    let left = targets[req] - generated[req];
                    let count = count.min(left);
                    if count == 0 {
                        continue;
                    }
                    report.spans.push(TokenSpan {
                        id: req as u64,
                        tag: req as u32,
                        first_index: generated[req] + 1,
                        first_step,
                        join: 0,
                        count,
                        target: targets[req],
                        previous_us: None,
                    });
                    generated[req] += count;
                }
                c.steps(0, 0, &report.step_ends);
                for i in 0..report.spans.len() {
                    let tag = report.spans[i].tag as usize;
                    report.spans[i].previous_us = last[tag];
                    let span = &report.spans[i];
                    let times = report.span_times(span);
                    for m in 0..times.len() {
                        let t = times.get(m);
                        if let Some(p) = last[span.tag as usize] {
                            *want.entry(t - p).or_default() += 1;
                        }
                        last[span.tag as usize] = Some(t);
                    }
                    c.tokens(Some(&rec), rec.request.streaming, times);
                }
            }
            c.flush_step_gaps();
            want.retain(|_, n| *n > 0);
            let got = c.itl.sorted();
            let mut want: Vec<(i64, u64)> = want.into_iter().collect();
            want.sort();
            prop_assert_eq!(got, want);
        }
    }
}
