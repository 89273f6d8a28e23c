//! One vLLM-style serving instance: continuous batching with chunked
//! prefill, a paged KV cache with prefix caching, and preemption by
//! recompute, stepping as vLLM V1's scheduler does
//! (`vllm/v1/core/sched/scheduler.py`):
//!
//! 1. running requests first, in order: each gets the tokens it still needs
//!    (1 when decoding; the rest of its prompt, capped by
//!    `long_prefill_token_threshold`, when prefilling), within the step's
//!    token budget (`max_num_batched_tokens`); if its KV blocks cannot be
//!    allocated, the last running request (FCFS) or the least urgent one
//!    (priority) is preempted: its blocks are freed, its progress reset,
//!    and it goes back to the front of the wait queue;
//! 2. then, unless a request was preempted in this step, waiting requests in
//!    the scheduler's order while fewer than `max_num_seqs` run and budget
//!    remains: prefix-cache hits are taken (at most all but the last prompt
//!    token), and the rest is prefilled, chunked to the budget; admission
//!    stops at the first request whose blocks cannot be allocated;
//! 3. when a request's computed tokens catch up with its tokens, it samples
//!    one token; it completes after its last output token.
//!
//! The instance is a state machine driven by its owner: [`Instance::enqueue`]
//! adds requests, [`Instance::step`] is called at [`Instance::next_time`]. It
//! never looks at a clock.
//!
//! **Fast-forward.** When a batch is decode-only and nothing can join it
//! (the wait queue is empty or `max_num_seqs` is reached), consecutive steps
//! have the same composition until a request completes, a KV allocation
//! could fail, or an outside event arrives. Such a run of steps is executed
//! as one event, applying every block allocation and hash registration in
//! the exact order single steps would, so results are byte-identical (tested
//! against [`EngineConfig::fast_forward`] off).

use blis_traces::content::{self, Segment};

use crate::engine::kv_cache::KvCache;
use crate::engine::kv_tier::{CpuTierConfig, TierCounters};
use crate::engine::queue_order::{QueueKey, SchedulerPolicy, WaitQueue};
use crate::latency::{BatchShape, LatencyModel, Model};

/// The most emptied lists of each kind an instance keeps for requests to
/// come ([`Instance::spare_segments`]): enough for the completions between
/// two arrivals, and a bound on what they hold when none is taken.
const SPARE_LISTS: usize = 16;

/// Keeps list `v`, emptied, in `spares` for a request to come, while there
/// are fewer than [`SPARE_LISTS`] and it holds room.
fn keep_spare<T>(spares: &mut Vec<Vec<T>>, mut v: Vec<T>) {
    if v.capacity() > 0 && spares.len() < SPARE_LISTS {
        v.clear();
        spares.push(v);
    }
}

/// Room for `n` entries in all in list `v`. An empty list too small for
/// them (a spare from a shorter request) is replaced by a new one rather
/// than grown: growing reallocates, and `realloc` copies the old room's
/// stale bytes.
fn reserve_total<T>(v: &mut Vec<T>, n: usize) {
    if v.is_empty() && v.capacity() < n {
        *v = Vec::with_capacity(n);
    } else {
        v.reserve_exact(n.saturating_sub(v.len()));
    }
}

/// Settings of one instance (vLLM's flag names).
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// `--max-num-seqs`: running requests at most.
    pub max_num_seqs: u32,
    /// `--max-num-batched-tokens`: tokens computed per step at most.
    pub max_num_batched_tokens: u32,
    /// `--long-prefill-token-threshold`: prefill tokens of one request per
    /// step at most (0: no limit beyond the budget).
    pub long_prefill_token_threshold: u32,
    /// `--block-size`: tokens per KV block.
    pub block_size: u32,
    /// GPU KV blocks.
    pub total_kv_blocks: u32,
    /// `--max-model-len`: prompt + output tokens at most (0: unlimited).
    pub max_model_len: u32,
    /// Wait-queue order.
    pub scheduler: SchedulerPolicy,
    /// Automatic prefix caching (vLLM V1 default: on).
    pub prefix_caching: bool,
    /// Chunked prefill (vLLM V1 default: on): a prompt may be computed over
    /// several steps, a chunk per step within the token budget. Off, a
    /// waiting request is admitted only when its whole uncached prompt fits
    /// in the step's remaining budget, and `long_prefill_token_threshold`
    /// does not apply.
    pub chunked_prefill: bool,
    /// Execute runs of identical decode steps as one event.
    pub fast_forward: bool,
    /// `--async-scheduling`: the scheduler forms step k+1 while step k
    /// runs, so a request that arrives while a step is in flight joins the
    /// step after the next one (vLLM V1's async scheduling). When nothing
    /// is running the request starts at once, as an idle engine core picks
    /// it up.
    pub async_scheduling: bool,
    /// A CPU tier under the GPU KV cache (`--kv-cpu-blocks`; None: GPU
    /// only). See [`crate::engine::kv_tier`].
    pub cpu_tier: Option<CpuTierConfig>,
}

impl EngineConfig {
    /// The longest context served, tokens: `max_model_len`, or
    /// [`MAX_CONTEXT`] without a limit (a prompt this long or longer is
    /// refused).
    pub fn context_limit(&self) -> u32 {
        match self.max_model_len {
            0 => MAX_CONTEXT,
            m => m.min(MAX_CONTEXT),
        }
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            max_num_seqs: 256,
            max_num_batched_tokens: 2048,
            long_prefill_token_threshold: 0,
            block_size: 16,
            total_kv_blocks: 29205,
            max_model_len: 0,
            scheduler: SchedulerPolicy::Fcfs,
            prefix_caching: true,
            chunked_prefill: true,
            fast_forward: true,
            async_scheduling: false,
            cpu_tier: None,
        }
    }
}

/// A request as the instance sees it. (`repr(C)`: its first 16 bytes,
/// read by every step of a batch, come first.)
#[derive(Debug, Clone, PartialEq)]
#[repr(C)]
pub struct SimRequest {
    /// Identifier (the trace's `request_id`).
    pub id: u64,
    /// Prompt tokens.
    pub input_tokens: u32,
    /// An opaque value of the owner's, echoed in [`TokenSpan`] and
    /// [`Finished`] (e.g. an index into its own table).
    pub tag: u32,
    /// Output tokens to generate.
    pub output_tokens: u32,
    /// Urgency of its SLO class ([`crate::engine::queue_order::slo_priority`], 0 the
    /// most urgent), for the anomaly counters whatever the priority policy.
    pub class: u8,
    /// Priority (lower = more urgent; [`crate::cluster::priority::PriorityPolicy`]).
    pub priority: i64,
    /// Token content of prompt and output, for prefix-cache hashing.
    pub segments: Vec<Segment>,
    /// The content hashes of its leading blocks when the owner already
    /// computed them (a prefix-aware router does); may be empty, the
    /// instance computes the rest.
    pub block_hashes: Vec<u64>,
}

/// Why a request was dropped on arrival.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DropReason {
    /// Its prompt and output need more KV blocks than the instance has.
    Unservable {
        /// Blocks needed.
        needed: u32,
        /// Blocks in total.
        total: u32,
    },
    /// Its prompt alone reaches `max_model_len`.
    TooLong {
        /// Prompt tokens.
        input: u32,
        /// The limit.
        max_model_len: u32,
    },
}

impl DropReason {
    /// What a user can change so that such a request is served.
    pub fn hint(&self) -> &'static str {
        match self {
            DropReason::Unservable { .. } => {
                "more KV blocks (--total-kv-blocks, or a GPU with more memory), or shorter requests"
            }
            DropReason::TooLong { .. } => "a larger --max-model-len, or shorter prompts",
        }
    }
}

impl std::fmt::Display for DropReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DropReason::Unservable { needed, total } => write!(
                f,
                "unservable: needs {needed} KV blocks, the instance has {total}"
            ),
            DropReason::TooLong {
                input,
                max_model_len,
            } => write!(
                f,
                "prompt of {input} tokens reaches max_model_len {max_model_len}"
            ),
        }
    }
}

/// The longest context the engine simulates, tokens (2^30, above any
/// model's): with `max_model_len` 0 (unlimited) a prompt this long is
/// refused and an output capped to the rest, as with a limit.
pub const MAX_CONTEXT: u32 = 1 << 30;

/// Tokens one request produced during a step report, consecutive from
/// `first_index` (1-based output index), one per step starting at
/// `first_step` of [`StepReport::step_ends`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenSpan {
    /// Request id.
    pub id: u64,
    /// The request's [`SimRequest::tag`].
    pub tag: u32,
    /// Output index of the first token (1 = first token).
    pub first_index: u32,
    /// Index into `step_ends` of the step that produced the first token.
    pub first_step: u32,
    /// When the request (last) joined the running batch: the running order
    /// is the order of this number.
    pub join: u64,
    /// Tokens.
    pub count: u32,
    /// The request's output length: the token of this index is its last.
    pub target: u32,
    /// Client-visible time of the request's token before the span, µs
    /// (`None`: the span starts its output).
    pub previous_us: Option<i64>,
}

pub use super::cohort::{CohortJoin, CohortNote};

/// What a cancelled request had produced ([`Instance::abort`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Aborted {
    /// Output tokens produced.
    pub generated: u32,
    /// Client-visible time of its first token, µs, if any.
    pub first_token_us: Option<i64>,
    /// Client-visible time of its latest token, µs, if any.
    pub last_token_us: Option<i64>,
}

/// A request that completed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Finished {
    /// Request id.
    pub id: u64,
    /// The request's [`SimRequest::tag`].
    pub tag: u32,
    /// Client-visible time of the first token, µs.
    pub first_token_us: i64,
    /// Client-visible time of the last token, µs.
    pub last_token_us: i64,
    /// When it was first scheduled, µs.
    pub scheduled_us: i64,
    /// Output tokens produced.
    pub output_tokens: u32,
    /// Prompt tokens found in the prefix cache when first scheduled.
    pub cached_tokens: u32,
    /// Times it was preempted.
    pub preemptions: u32,
    /// Whether `max_model_len` cut its output short.
    pub capped: bool,
}

/// What a call to [`Instance::step`] produced.
#[derive(Debug, Clone)]
pub struct StepReport {
    /// End times of the steps completed by this call (several for a
    /// fast-forwarded run), µs.
    pub step_ends: Vec<i64>,
    /// Tokens produced, per request.
    pub spans: Vec<TokenSpan>,
    /// Requests that completed.
    pub finished: Vec<Finished>,
    /// The steady decoders' tokens in compact form, each note at a position
    /// in `spans` (empty unless [`Instance::set_compact_cohort`]).
    pub cohort: Vec<(u32, CohortNote)>,
    /// When a produced token becomes visible to the client
    /// ([`StepReport::set_timing`]).
    timing: TokenTiming,
    /// The delays of `timing` when they do not depend on the token's
    /// index: (any token but a request's last, its last), µs.
    constant_extras: Option<(i64, i64)>,
    /// Steps executed (including fast-forwarded ones).
    pub steps: u64,
    /// The instance's index of the first step in `step_ends` (counting
    /// every step since its start).
    pub first_step: u64,
}

impl Default for StepReport {
    /// An empty report whose timing is [`TokenTiming::default`] (no delay),
    /// with its constant delays derived as [`StepReport::set_timing`]
    /// derives them. (A derived `Default` left them unset: a sink fed
    /// reports of a model without output delays then never got its timing
    /// set, as it was already the default, and counted every inter-token
    /// gap one at a time instead of per step.)
    fn default() -> Self {
        let mut r = Self {
            step_ends: Vec::new(),
            spans: Vec::new(),
            finished: Vec::new(),
            cohort: Vec::new(),
            timing: TokenTiming::default(),
            constant_extras: None,
            steps: 0,
            first_step: 0,
        };
        r.set_timing(TokenTiming::default());
        r
    }
}

impl StepReport {
    /// Client-visible time of token `m` (0-based) of `span`: the end of the
    /// step that produced it plus the latency model's output overheads
    /// ([`TokenTiming`]).
    #[inline]
    pub fn token_time(&self, span: &TokenSpan, m: u32) -> i64 {
        let index = span.first_index + m;
        let end = self.step_ends[(span.first_step + m) as usize];
        match self.constant_extras {
            Some((plain, last)) => end + if index >= span.target { last } else { plain },
            None => self.timing.visible(end, index, index >= span.target),
        }
    }

    /// Sets when a produced token becomes visible to the client.
    pub fn set_timing(&mut self, timing: TokenTiming) {
        self.timing = timing;
        let itl = timing.itl();
        self.constant_extras =
            (timing.per_token_us == 0.0).then(|| (itl.extra_us(1, false), itl.extra_us(1, true)));
    }

    /// When its tokens become visible to the client
    /// ([`StepReport::set_timing`]).
    pub fn timing(&self) -> TokenTiming {
        self.timing
    }

    /// The client-visible times of `span`'s tokens, computed on demand.
    pub fn span_times<'a>(&'a self, span: &'a TokenSpan) -> SpanTimes<'a> {
        SpanTimes { report: self, span }
    }

    /// The delays of every token but a request's last and of its last,
    /// µs, when they do not depend on the token's index (no accumulating
    /// per-token overhead).
    pub fn constant_extras(&self) -> Option<(i64, i64)> {
        self.constant_extras
    }

    fn clear(&mut self) {
        self.step_ends.clear();
        self.spans.clear();
        self.cohort.clear();
        self.finished.clear();
        self.steps = 0;
    }
}

/// The client-visible times of one span's tokens (µs since the run start),
/// computed from the steps' ends on demand rather than materialised: token
/// `m` (0-based) is [`StepReport::token_time`]. Without a per-token
/// overhead ([`SpanTimes::step_gap_tokens`]) the gap between two
/// consecutive tokens other than a request's last is exactly the gap
/// between the ends of their steps, which lets a sink count inter-token
/// gaps per step instead of per token.
#[derive(Debug, Clone, Copy)]
pub struct SpanTimes<'a> {
    report: &'a StepReport,
    span: &'a TokenSpan,
}

impl<'a> SpanTimes<'a> {
    /// The client-visible time of the request's token before the span
    /// ([`TokenSpan::previous_us`]), µs: a sink counts the gap into the
    /// span without remembering every request's last token.
    pub fn previous(&self) -> Option<i64> {
        self.span.previous_us
    }

    /// Tokens in the span (at least one).
    pub fn len(&self) -> usize {
        self.span.count as usize
    }

    /// Whether the span has no token (never, for spans of a report).
    pub fn is_empty(&self) -> bool {
        self.span.count == 0
    }

    /// Client-visible time of token `m` (0-based), µs.
    pub fn get(&self, m: usize) -> i64 {
        self.report.token_time(self.span, m as u32)
    }

    /// Client-visible time of the span's last token, µs.
    pub fn last(&self) -> i64 {
        self.get(self.len() - 1)
    }

    /// The times in token order.
    pub fn iter(&self) -> impl Iterator<Item = i64> + 'a {
        let (report, span) = (self.report, self.span);
        (0..span.count).map(move |m| report.token_time(span, m))
    }

    /// The end times of the report's steps, µs since the run start (the
    /// span's token `m` was produced by step `span.first_step + m`).
    pub fn step_ends(&self) -> &'a [i64] {
        &self.report.step_ends
    }

    /// The span.
    pub fn span(&self) -> &'a TokenSpan {
        self.span
    }

    /// How many leading tokens of the span are late after their step's end
    /// by the same delay, so that each one's gap to the token before it in
    /// the span is the gap between their steps' ends: all of them, or all
    /// but a request's last token when that carries a completion overhead;
    /// `None` when the latency model adds an accumulating per-token
    /// overhead.
    pub fn step_gap_tokens(&self) -> Option<usize> {
        let (plain, last) = self.report.constant_extras?;
        let span = self.span;
        let ends_request = span.first_index + span.count > span.target;
        Some(self.len() - usize::from(ends_request && last != plain))
    }
}

/// When a token produced at the end of a step becomes visible to the
/// client: the latency model's per-token hop, its accumulating per-token
/// overhead (BLIS's α2: token `m` is `m` times it late) and, on a request's
/// last token, its completion overhead.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct TokenTiming {
    /// Accumulating overhead per output token, µs.
    pub per_token_us: f64,
    /// Delay of every token, µs.
    pub hop_us: f64,
    /// Delay of a request's last token, µs.
    pub completion_us: f64,
}

impl TokenTiming {
    /// The timing of `model`.
    pub fn of(model: &impl LatencyModel) -> Self {
        Self {
            per_token_us: model.output_token_overhead_us(),
            hop_us: model.output_hop_us(),
            completion_us: model.completion_overhead_us(),
        }
    }

    /// Client-visible time of output token `index` (1-based) produced by a
    /// step ending at `step_end`; `last`: it is the request's last token.
    pub fn visible(&self, step_end: i64, index: u32, last: bool) -> i64 {
        step_end + self.itl().extra_us(index, last)
    }

    /// The same timing as the trace format writes it.
    pub fn itl(&self) -> blis_traces::itl_steps::ItlTiming {
        blis_traces::itl_steps::ItlTiming {
            hop_us: self.hop_us,
            per_token_us: self.per_token_us,
            completion_us: self.completion_us,
        }
    }
}

/// Counters of an instance since its start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Requests accepted into the wait queue.
    pub enqueued: u64,
    /// Requests completed.
    pub completed: u64,
    /// Requests dropped on arrival.
    pub dropped: u64,
    /// Preemptions.
    pub preemptions: u64,
    /// Prompt tokens looked up in the prefix cache at admission.
    pub prefix_queries: u64,
    /// Prompt tokens found there.
    pub prefix_hits: u64,
    /// Prompt tokens processed (all prefill, including recomputation).
    pub prompt_tokens: u64,
    /// Output tokens produced.
    pub generation_tokens: u64,
    /// Steps executed.
    pub steps: u64,
    /// Steps that were part of a fast-forwarded run (beyond its first).
    pub fast_forwarded_steps: u64,
    /// Requests cancelled by their client (timeouts).
    pub aborted: u64,
    /// Priority inversions: a request scheduled from the wait queue while
    /// one of a more urgent SLO class waits there still (BLIS's
    /// `PriorityInversionCount`, `../shared/design/macro-plan.md` D.8).
    pub priority_inversions: u64,
    /// Head-of-line blocking events: a request completing while one of a
    /// more urgent SLO class waits in the same queue (BLIS's
    /// `HOLBlockingEvents`).
    pub hol_blocking_events: u64,
    /// Tiered KV cache: prompt tokens looked up in the CPU tier after the
    /// GPU prefix cache missed them (vLLM's
    /// `external_prefix_cache_queries`, counted at first admission).
    pub external_queries: u64,
    /// Tiered KV cache: prompt tokens found there and reloaded (vLLM's
    /// `external_prefix_cache_hits`).
    pub external_hits: u64,
    /// Tiered KV cache: offloads, reloads, thrashing, transfers.
    pub tier: TierCounters,
}

impl Counters {
    /// Share of the prompt tokens looked up in the prefix cache that were
    /// found there (0 before any lookup).
    pub fn prefix_hit_rate(&self) -> f64 {
        if self.prefix_queries > 0 {
            self.prefix_hits as f64 / self.prefix_queries as f64
        } else {
            0.0
        }
    }
}

impl std::ops::AddAssign for Counters {
    fn add_assign(&mut self, o: Self) {
        self.enqueued += o.enqueued;
        self.completed += o.completed;
        self.dropped += o.dropped;
        self.preemptions += o.preemptions;
        self.prefix_queries += o.prefix_queries;
        self.prefix_hits += o.prefix_hits;
        self.prompt_tokens += o.prompt_tokens;
        self.generation_tokens += o.generation_tokens;
        self.steps += o.steps;
        self.fast_forwarded_steps += o.fast_forwarded_steps;
        self.aborted += o.aborted;
        self.priority_inversions += o.priority_inversions;
        self.hol_blocking_events += o.hol_blocking_events;
        self.external_queries += o.external_queries;
        self.external_hits += o.external_hits;
        self.tier += o.tier;
    }
}

/// What a router reads of an instance ([`Instance::signals_at`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Signals {
    /// Requests waiting.
    pub waiting: u32,
    /// Requests running.
    pub running: u32,
    /// KV blocks in use.
    pub kv_used: u32,
    /// KV blocks in total.
    pub kv_total: u32,
}

impl Signals {
    /// Fraction of KV blocks in use (as [`Snapshot::kv_usage`]).
    pub fn kv_usage(&self) -> f64 {
        if self.kv_total == 0 {
            0.0
        } else {
            f64::from(self.kv_used) / f64::from(self.kv_total)
        }
    }
}

/// A point-in-time view of an instance (what `/metrics` would show).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Snapshot {
    /// Requests waiting.
    pub waiting: u32,
    /// Requests running.
    pub running: u32,
    /// KV blocks in use (a cluster's sum may pass 2^32).
    pub kv_used: u64,
    /// KV blocks in total.
    pub kv_total: u64,
    /// CPU-tier KV blocks holding content (0 without a CPU tier).
    pub kv_cpu_used: u64,
    /// CPU-tier KV blocks in total (0 without a CPU tier).
    pub kv_cpu_total: u64,
    /// Counters.
    pub counters: Counters,
}

impl Snapshot {
    /// Fraction of KV blocks in use.
    pub fn kv_usage(&self) -> f64 {
        if self.kv_total == 0 {
            0.0
        } else {
            self.kv_used as f64 / self.kv_total as f64
        }
    }
}

/// A request in the instance. `repr(C)` keeps what every step of a batch
/// reads and writes (its block table, progress, batch order and the
/// request's id, prompt length and tag) in its first 64 bytes, one cache
/// line: a step visits every running request, and a batch's requests do
/// not stay in the first-level cache between steps. (The tag of the slot's
/// `Option` is not among them: rustc keeps it in the largest niche, an
/// `Option<i64>` tag further on.)
#[derive(Debug)]
#[repr(C, align(64))]
pub(super) struct Active {
    pub(super) blocks: Vec<u32>,
    pub(super) num_computed: u32,
    pub(super) generated: u32,
    /// Output tokens it will produce (capped by max_model_len).
    pub(super) target: u32,
    /// Leading blocks committed to the prefix cache (or hit there).
    pub(super) hashed: u32,
    /// When it last joined the running batch ([`TokenSpan::join`]).
    pub(super) join: u64,
    pub(super) req: SimRequest,
    pub(super) key: QueueKey,
    pub(super) capped: bool,
    /// The first of its full private blocks whose commit to the KV cache
    /// is deferred (`[private_pending, hashed)`, see
    /// [`Instance::flush_private`]); `u32::MAX`: none.
    pub(super) private_pending: u32,
    /// Content hashes of its leading blocks, computed once each (content
    /// never changes, so they survive preemption).
    pub(super) hashes: Vec<u64>,
    pub(super) scheduled_us: Option<i64>,
    pub(super) first_token_us: Option<i64>,
    /// Client-visible time of its latest token.
    pub(super) last_token_us: Option<i64>,
    pub(super) cached_tokens: Option<u32>,
    pub(super) preemptions: u32,
    /// Its first block of private content (see
    /// [`Instance::set_private_blocks`]); `u32::MAX`: none or not tracked.
    pub(super) private_from: u32,
    /// Async scheduling: the end of the step in flight when it arrived; it
    /// may join batches formed after that time only.
    pub(super) eligible_after: i64,
    /// P/D prefill side: its blocks stay allocated when it completes
    /// ([`Instance::enqueue_prefill`]).
    pub(super) hold_kv: bool,
    /// Private blocks it holds after `blocks`, without ids
    /// ([`KvCache::take_virtual`]), taken while it was a steady decoder
    /// that will forget them ([`Instance::takes_virtual`]): its block
    /// table is `blocks` and these.
    pub(super) virt: u32,
}

impl Active {
    pub(super) fn num_tokens(&self) -> u32 {
        self.req.input_tokens + self.generated
    }

    /// Blocks it holds: its table's ids and those held without ids.
    #[inline]
    pub(super) fn table_len(&self) -> u32 {
        self.blocks.len() as u32 + self.virt
    }

    /// The content hash of block `j` (chained: each includes its parent's),
    /// computing the missing ones up to it.
    pub(super) fn hash(&mut self, block_size: u32, j: u32) -> u64 {
        if self.hashes.len() as u32 <= j {
            content::extend_block_hashes(&self.req.segments, block_size, j + 1, &mut self.hashes);
        }
        self.hashes[j as usize]
    }

    /// The content hashes of its first `n` blocks, computing the missing
    /// ones.
    pub(super) fn hashes_upto(&mut self, block_size: u32, n: u32) -> &[u64] {
        if let Some(last) = n.checked_sub(1) {
            self.hash(block_size, last);
        }
        &self.hashes[..n as usize]
    }
}

/// The batch in flight.
#[derive(Debug, Default)]
pub(super) struct Run {
    /// (slot, tokens) scheduled in the first step, in running order.
    pub(super) scheduled: Vec<(u32, u32)>,
    /// End times of the run's steps; more than one only for a decode-only
    /// fast-forwarded run.
    pub(super) ends: Vec<i64>,
    /// Members of the cohort in the batch (`running[..cohort]`, a token
    /// each step), ahead of `scheduled` in the running order.
    pub(super) cohort: u32,
}

/// One serving instance.
#[derive(Debug)]
pub struct Instance {
    pub(super) cfg: EngineConfig,
    pub(super) latency: Model,
    pub(super) kv: KvCache,
    pub(super) slots: Vec<Option<Active>>,
    pub(super) free_slots: Vec<u32>,
    pub(super) waiting: WaitQueue,
    pub(super) running: Vec<u32>,
    pub(super) run: Option<Run>,
    pub(super) kick: Option<i64>,
    pub(super) seq: u64,
    /// Requests that have joined the running batch so far.
    pub(super) joins: u64,
    pub(super) counters: Counters,
    pub(super) shape: BatchShape,
    pub(super) hits: Vec<u32>,
    /// The decoding requests of the batch in flight by phase
    /// (`(bs - num_computed % bs) % bs` when it was formed), in running
    /// order: after step `j` of a decode-only run, those of phase `j % bs`
    /// fill a block. Set when a batch is formed.
    pub(super) groups: Vec<Vec<u32>>,
    pub(super) index: rustc_hash::FxHashMap<u32, u32>,
    pub(super) spare_scheduled: Vec<(u32, u32)>,
    pub(super) spare_ends: Vec<i64>,
    /// Per phase (`(bs - num_computed % bs) % bs`), the requests of the
    /// fast-forwarded run in flight: after its step `j`, those of phase
    /// `j % bs` fill a block and take a new one. Valid while the run has
    /// more than one step.
    pub(super) run_phase: Vec<u32>,
    /// The phases with a request in `groups` (the others are empty).
    pub(super) used_phases: Vec<u32>,
    /// The phases set in `run_phase` (the others are 0).
    pub(super) run_phases_used: Vec<u32>,
    /// Scratch: the requests completing in a run, in running order.
    pub(super) spare_done: Vec<u32>,
    /// The emptied block tables, hash lists and segment lists of completed
    /// requests, for the requests to come (at most [`SPARE_LISTS`] each):
    /// a request's three allocations and three frees were 3% of a
    /// replay's instructions.
    pub(super) spare_tables: Vec<Vec<u32>>,
    pub(super) spare_hashes: Vec<Vec<u64>>,
    pub(super) spare_segments: Vec<Vec<Segment>>,
    /// Scratch of a decode batch being formed: the requests that take new
    /// KV blocks, with how many, in running order.
    pub(super) block_needs: Vec<(u32, u32)>,
    /// Waiting requests per SLO class (`class`, capped at 7).
    pub(super) waiting_classes: [u32; 8],
    /// Whether private content stays out of the KV hash index.
    pub(super) private_blocks: bool,
    /// Whether a request's private content is forgotten when it releases
    /// its blocks ([`Instance::set_forget_private`]).
    pub(super) forget_private: bool,
    /// Whether a request in the system may have a private part.
    pub(super) private_live: bool,
    /// Tiered KV cache: the transfer time of the blocks reloaded for the
    /// batch being formed, µs, added to its step.
    pub(super) pending_transfer_us: i64,
    /// Tiered: the most KV blocks in use before the next offload, for the
    /// batch being formed (`u32::MAX`: no offload can come).
    pub(super) offload_cap: u32,
    /// P/D prefill side: the blocks of completed prefills, by request tag,
    /// until their transfer completes ([`Instance::release_held`]).
    pub(super) held: std::collections::BTreeMap<u32, Vec<u32>>,
    /// The CPU tier's counters of earlier KV caches of this slot
    /// ([`Instance::restart_cold`]).
    pub(super) tier_before: crate::engine::kv_tier::TierCounters,
    /// The steady decoders at the head of the running order
    /// ([`crate::engine::cohort`]).
    pub(super) cohort: crate::engine::cohort::Cohort,
}

impl Instance {
    /// A new idle instance.
    pub fn new(cfg: EngineConfig, latency: Model) -> Self {
        let mut kv = KvCache::new(cfg.total_kv_blocks, cfg.block_size, cfg.prefix_caching);
        if let Some(t) = &cfg.cpu_tier {
            kv = kv.with_cpu_tier(t.clone());
        }
        Self {
            waiting: WaitQueue::new(cfg.scheduler),
            cfg,
            latency,
            kv,
            slots: Vec::new(),
            free_slots: Vec::new(),
            running: Vec::new(),
            run: None,
            kick: None,
            seq: 0,
            joins: 0,
            counters: Counters::default(),
            shape: BatchShape::default(),
            hits: Vec::new(),
            groups: Vec::new(),
            index: rustc_hash::FxHashMap::default(),
            spare_scheduled: Vec::new(),
            spare_ends: Vec::new(),
            run_phase: Vec::new(),
            used_phases: Vec::new(),
            run_phases_used: Vec::new(),
            spare_done: Vec::new(),
            spare_tables: Vec::new(),
            spare_hashes: Vec::new(),
            spare_segments: Vec::new(),
            block_needs: Vec::new(),
            waiting_classes: [0; 8],
            private_blocks: false,
            forget_private: false,
            private_live: false,
            pending_transfer_us: 0,
            offload_cap: u32::MAX,
            held: std::collections::BTreeMap::new(),
            tier_before: crate::engine::kv_tier::TierCounters::default(),
            cohort: crate::engine::cohort::Cohort {
                enabled: true,
                ..Default::default()
            },
        }
    }

    /// A new replica in this slot (autoscaling): its KV cache, and its CPU
    /// tier, start empty; counters carry on. Does nothing while it holds a
    /// request.
    pub fn restart_cold(&mut self) {
        if self.in_system() > 0 || !self.held.is_empty() {
            return;
        }
        if let Some(t) = self.kv.cpu_tier() {
            self.tier_before += t.counters();
        }
        let mut kv = KvCache::new(
            self.cfg.total_kv_blocks,
            self.cfg.block_size,
            self.cfg.prefix_caching,
        );
        if let Some(t) = &self.cfg.cpu_tier {
            kv = kv.with_cpu_tier(t.clone());
        }
        self.kv = kv;
        self.private_live = false;
    }

    /// Whether the request of flight `tag` waits here with nothing
    /// computed (never in a batch): it can go elsewhere at no loss.
    pub fn waits_untouched(&self, tag: u32) -> bool {
        let Some(&slot) = self.index.get(&tag) else {
            return false;
        };
        if self.running.contains(&slot)
            || self
                .run
                .as_ref()
                .is_some_and(|r| r.scheduled.iter().any(|(s, _)| *s == slot))
        {
            return false;
        }
        self.slots[slot as usize]
            .as_ref()
            .is_some_and(|a| a.num_computed == 0 && a.generated == 0 && a.preemptions == 0)
    }

    /// The settings.
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// The latency model.
    pub fn latency(&self) -> &Model {
        &self.latency
    }

    /// The KV cache (read-only, e.g. for cache-aware routing).
    pub fn kv(&self) -> &KvCache {
        &self.kv
    }

    /// Whether blocks of content private to their request (its own body,
    /// see `blis_traces::content::private_from`) are kept out of the KV
    /// cache's hash index ([`KvCache::commit_private`]). This is exact only
    /// while request ids are unique, which the caller guarantees: the
    /// replay driver turns it on for a replay, and off when an id repeats.
    /// Off by default. Turning it on first indexes private blocks left by
    /// an earlier replay (whose ids the new one may repeat); turning it off
    /// indexes every private block at once, and requests in the system
    /// index the rest of their blocks as they commit them.
    pub fn set_private_blocks(&mut self, on: bool) {
        self.share_private();
        self.private_blocks = on;
        self.forget_private &= on;
    }

    /// Whether the private content of a request that completes or is
    /// aborted, never preempted, is forgotten: its blocks are freed
    /// without committing their hashes ([`KvCache::release_forgetting`]:
    /// the same counts and cache, faster), so that content can never be
    /// indexed afterwards. Exact only while private blocks are on
    /// ([`Instance::set_private_blocks`]) and no request with the id of
    /// one served here will ever come (here or after another replay): the
    /// replay driver turns it on when the caller says the ids of its
    /// inputs are unique and the instances will not be replayed on again
    /// ([`crate::cluster::Control::set_ids_unique`]). Off by default; off
    /// whenever private blocks are turned off.
    pub fn set_forget_private(&mut self, on: bool) {
        self.forget_private = on && self.private_blocks;
    }

    /// Whether no request was ever enqueued here (its caches hold nothing).
    pub fn is_pristine(&self) -> bool {
        self.counters.enqueued == 0
    }

    /// Ends a replay's private blocks without indexing them yet: that
    /// happens before the next request is enqueued or the next replay
    /// turns them on, whichever comes first (a replay's end costs
    /// nothing when the instance is not used again).
    pub fn pause_private_blocks(&mut self) {
        self.private_blocks = false;
        self.forget_private = false;
    }

    /// Indexes every private block; requests in the system commit the rest
    /// of their blocks to the index (also those that have committed no
    /// private block yet).
    pub(super) fn share_private(&mut self) {
        if self.cohort.virtual_members > 0 {
            // (Steady decoders' blocks held without ids are written back
            // to them first.)
            self.dissolve_cohort();
        }
        for slot in 0..self.slots.len() as u32 {
            if self.slots[slot as usize].is_some() {
                self.flush_private(slot);
            }
        }
        self.kv.index_all_private();
        if std::mem::take(&mut self.private_live) {
            for a in self.slots.iter_mut().flatten() {
                a.private_from = u32::MAX;
            }
        }
    }

    /// Counters since start.
    pub fn counters(&self) -> Counters {
        let mut c = self.counters;
        if let Some(t) = self.kv.cpu_tier() {
            c.tier = t.counters();
            c.tier += self.tier_before;
        }
        c
    }

    /// A view of the state after the last call that changed it (a step
    /// report, [`Instance::split_at`], an arrival): the steps of a
    /// fast-forwarded run in flight count only once it ends or is split.
    /// Owners that read an instance between events use
    /// [`Instance::snapshot_at`].
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            waiting: self.waiting.len() as u32,
            running: self.running.len() as u32,
            kv_used: u64::from(self.kv.used()),
            kv_total: u64::from(self.kv.total()),
            kv_cpu_used: self.kv.cpu_tier().map_or(0, |t| u64::from(t.used())),
            kv_cpu_total: self.kv.cpu_tier().map_or(0, |t| u64::from(t.total())),
            counters: self.counters(),
        }
    }

    /// The state just before `t`, as single steps would have left it: the
    /// steps of a fast-forwarded run in flight that ended before `t` count
    /// (their tokens, and the KV blocks taken after them), without
    /// splitting the run. `t` is no earlier than the last event the
    /// instance saw; a reader that comes after the steps ending at `t` (a
    /// metrics sample) asks for `t + 1`.
    pub fn snapshot_at(&self, t: i64) -> Snapshot {
        let mut s = self.snapshot();
        if let Some((c, blocks, n)) = self.run_progress_at(t) {
            s.kv_used += u64::from(blocks);
            let c = c as u64;
            s.counters.steps += c;
            s.counters.fast_forwarded_steps += c - 1;
            s.counters.generation_tokens += c * n;
        }
        s
    }

    /// Whether a metrics sample just before `t` has to split the run in
    /// flight ([`Instance::split_at`]) rather than read it
    /// ([`Instance::snapshot_at`]): with a CPU KV tier, the steps done by
    /// then have moved content between the tiers (the contents evicted
    /// from the blocks they took go to the CPU tier, a content they
    /// computed again leaves it), which only finishing them tells.
    pub fn sample_splits_run(&self, t: i64) -> bool {
        self.kv.tiered() && self.run_progress_at(t).is_some()
    }

    /// What a router reads just before `t` ([`Instance::snapshot_at`]'s
    /// queue, batch and KV usage, without the counters): 16 bytes, read
    /// for every instance at every routing decision.
    pub fn signals_at(&self, t: i64) -> Signals {
        let extra = self.run_progress_at(t).map_or(0, |(_, blocks, _)| blocks);
        Signals {
            waiting: self.waiting.len() as u32,
            running: self.running.len() as u32,
            kv_used: self.kv.used() + extra,
            kv_total: self.kv.total(),
        }
    }

    /// Of a fast-forwarded run in flight, the steps done before `t` (not
    /// the last, which ends the run and which the owner steps), the KV
    /// blocks taken after them, and the requests in the batch; `None`
    /// when none is done.
    fn run_progress_at(&self, t: i64) -> Option<(usize, u32, u64)> {
        let run = self.run.as_ref()?;
        let k = run.ends.len();
        if k <= 1 {
            return None;
        }
        let c = run.ends.partition_point(|&e| e < t).min(k - 1);
        if c == 0 {
            return None;
        }
        let bs = self.kv.block_size() as usize;
        let n = run.scheduled.len() as u64 + u64::from(run.cohort);
        // Blocks taken after steps 1..=c: every request once per `bs`
        // steps, and the phases 1..=c % bs of the last partial cycle.
        let cycles = (c / bs) as u64 * n;
        let partial: u64 = self.run_phase[1..=c % bs]
            .iter()
            .map(|&x| u64::from(x))
            .sum();
        Some((c, (cycles + partial) as u32, n))
    }

    /// Whether the steady decoders' tokens go to the reports in compact
    /// form ([`CohortNote`]s in [`StepReport::cohort`]) rather than as a
    /// [`TokenSpan`] per member per step; for a sink that reads the notes
    /// (or takes no tokens). A change turns the steady decoders back into
    /// requests first. Off by default.
    pub fn set_compact_cohort(&mut self, on: bool) {
        let compact = on.then(|| TokenTiming::of(&self.latency).itl());
        if compact != self.cohort.compact {
            self.dissolve_cohort();
            self.cohort.compact = compact;
        }
    }

    /// Running requests kept as steady decoders (the cohort: the head of
    /// the running batch, each decoding a token a step, stepped without
    /// being visited; see `engine::cohort`). For tests and profiling: the
    /// results never depend on it.
    pub fn steady_decoders(&self) -> usize {
        self.cohort.len()
    }

    /// Whether the request of flight `tag` is waiting or running here.
    pub fn contains(&self, tag: u32) -> bool {
        self.index.contains_key(&tag)
    }

    /// Requests waiting plus running.
    pub fn in_system(&self) -> usize {
        self.waiting.len() + self.running.len()
    }

    /// When [`Instance::step`] must next be called: the end of the batch in
    /// flight, or, when idle with work, the time work arrived.
    pub fn next_time(&self) -> Option<i64> {
        match &self.run {
            Some(r) => r.ends.last().copied(),
            None => self.kick,
        }
    }

    /// Adds a request to the wait queue at `now`, or drops it when it can
    /// never be served.
    ///
    /// # Errors
    /// The reason it was dropped.
    pub fn enqueue(&mut self, now: i64, req: SimRequest) -> Result<(), DropReason> {
        let (target, capped) = match self.servable(&req) {
            Ok(t) => t,
            Err(why) => {
                self.counters.dropped += 1;
                return Err(why);
            }
        };
        let key = self
            .cfg
            .scheduler
            .key(req.priority, req.input_tokens, self.seq);
        self.seq += 1;
        let mut req = req;
        let mut hashes = std::mem::take(&mut req.block_hashes);
        if hashes.capacity() == 0
            && let Some(spare) = self.spare_hashes.pop()
        {
            hashes = spare;
        }
        // Its blocks and their hashes, reserved for its whole life: growing
        // them a block at a time reallocated and copied each about
        // log2(blocks) times per request.
        let lifetime = self.life_blocks(req.input_tokens, target);
        reserve_total(&mut hashes, lifetime);
        let mut blocks = self.spare_tables.pop().unwrap_or_default();
        reserve_total(&mut blocks, lifetime);
        #[cfg(debug_assertions)]
        if !hashes.is_empty() {
            let mut own = Vec::new();
            content::block_hashes_of(&req.segments, self.kv.block_size(), &mut own);
            debug_assert!(
                hashes.len() <= own.len() && hashes[..] == own[..hashes.len()],
                "given block hashes differ from the content's"
            );
        }
        if !self.private_blocks {
            // Private blocks of an ended replay: shared from now on.
            self.share_private();
        }
        let private_from = if self.private_blocks {
            content::private_from(req.id, &req.segments)
                .map_or(u32::MAX, |at| at / self.kv.block_size())
        } else {
            u32::MAX
        };
        self.private_live |= private_from != u32::MAX;
        let a = Active {
            req,
            key,
            target,
            capped,
            num_computed: 0,
            generated: 0,
            blocks,
            hashed: 0,
            private_pending: u32::MAX,
            hashes,
            scheduled_us: None,
            first_token_us: None,
            last_token_us: None,
            cached_tokens: None,
            preemptions: 0,
            join: 0,
            private_from,
            hold_kv: false,
            virt: 0,
            eligible_after: match &self.run {
                Some(run) if self.cfg.async_scheduling => {
                    run.ends.last().copied().unwrap_or(i64::MIN)
                }
                _ => i64::MIN,
            },
        };
        let slot = self.new_slot(a);
        self.waiting.push(slot, key);
        self.count_waiting(slot, true);
        self.index.insert(self.act(slot).req.tag, slot);
        self.counters.enqueued += 1;
        if self.run.is_none() && self.kick.is_none() {
            self.kick = Some(now);
        }
        Ok(())
    }

    /// The output length `req` gets and whether it was capped: vLLM
    /// refuses a prompt of `max_model_len` tokens or more and caps the
    /// output at the rest of the context; a request whose KV blocks
    /// (every token but the last sampled one) exceed the cache is never
    /// servable.
    pub(super) fn servable(&self, req: &SimRequest) -> Result<(u32, bool), DropReason> {
        let mut target = req.output_tokens.max(1);
        let mut capped = false;
        // Without a limit, no context is longer than this (token counts
        // near `u32::MAX` must not wrap).
        let m = self.cfg.context_limit();
        if req.input_tokens >= m {
            return Err(DropReason::TooLong {
                input: req.input_tokens,
                max_model_len: m,
            });
        }
        if u64::from(req.input_tokens) + u64::from(target) > u64::from(m) {
            target = m - req.input_tokens;
            capped = true;
        }
        let needed = self.kv.blocks_for(req.input_tokens + target - 1);
        if needed > self.kv.total() {
            return Err(DropReason::Unservable {
                needed,
                total: self.kv.total(),
            });
        }
        Ok((target, capped))
    }

    /// KV blocks of a request's whole life: a prompt of `input_tokens`
    /// and an output of `output_tokens` (at least one), capped at the
    /// context limit (vLLM's `max_model_len`) as admission caps it; at most one block
    /// more than the cache (a longer request is refused at
    /// [`Instance::enqueue`]). A request keeps one block-table entry and
    /// one block hash per block: the room reserved for both once, when it
    /// is routed and enqueued, so neither list grows a block at a time.
    pub fn life_blocks(&self, input_tokens: u32, output_tokens: u32) -> usize {
        let tokens = (u64::from(input_tokens) + u64::from(output_tokens.max(1)))
            .min(u64::from(self.cfg.context_limit()));
        // (`context_limit` is a u32: `tokens` fits.)
        self.kv
            .blocks_for(tokens as u32)
            .min(self.kv.total().saturating_add(1)) as usize
    }

    /// Stores `a` in a free slot (or a new one); its slot.
    pub(super) fn new_slot(&mut self, a: Active) -> u32 {
        match self.free_slots.pop() {
            Some(s) => {
                self.slots[s as usize] = Some(a);
                s
            }
            None => {
                self.slots.push(Some(a));
                (self.slots.len() - 1) as u32
            }
        }
    }

    /// Counts `slot` into (`enter`) or out of the wait queue's classes.
    pub(super) fn count_waiting(&mut self, slot: u32, enter: bool) {
        let n = &mut self.waiting_classes[usize::from(self.act(slot).req.class.min(7))];
        if enter {
            *n += 1;
        } else {
            *n -= 1;
        }
    }

    /// Whether a request of an SLO class more urgent than `class` waits.
    pub(super) fn more_urgent_waiting(&self, class: u8) -> bool {
        self.waiting_classes[..usize::from(class.min(7))]
            .iter()
            .any(|&n| n > 0)
    }

    pub(super) fn act(&self, slot: u32) -> &Active {
        self.slots[slot as usize].as_ref().expect("live slot")
    }

    pub(super) fn act_mut(&mut self, slot: u32) -> &mut Active {
        self.slots[slot as usize].as_mut().expect("live slot")
    }

    /// Finishes the batch in flight (if its end is `now`) and forms the next
    /// one. `limit` is the time of the next event outside the instance (an
    /// arrival, a metrics sample): a fast-forwarded run never extends past
    /// it. Use `now` to disable fast-forward for this call.
    pub fn step(&mut self, now: i64, limit: i64, report: &mut StepReport) {
        report.clear();
        report.set_timing(TokenTiming::of(&self.latency));
        if let Some(run) = self.run.take() {
            debug_assert_eq!(run.ends.last().copied(), Some(now));
            self.finish_run(&run, report);
            self.spare_scheduled = run.scheduled;
            self.spare_ends = run.ends;
        }
        self.kick = None;
        self.form_batch(now, limit);
    }

    /// The tokens the run in flight will produce, known when its batch is
    /// formed: `(request id, 1-based output index, client-visible time µs)`
    /// appended to `out` in step and running order. A real-time owner (the
    /// mock server) hands them to their clients ahead of time; the next
    /// [`Instance::step`] reports exactly these (less any request aborted
    /// meanwhile). Empty when idle.
    pub fn upcoming_tokens(&self, out: &mut Vec<(u64, u32, i64)>) {
        let Some(run) = &self.run else {
            return;
        };
        let timing = TokenTiming::of(&self.latency);
        if run.cohort > 0 {
            // The members a token each step, ahead of the others (a single
            // step's, below).
            let j = self.cohort.j;
            for (s, &end) in run.ends.iter().enumerate() {
                for &slot in &self.cohort.members {
                    let m = self.cohort.record(slot);
                    let index = m.g0 + (j - m.j0) as u32 + 1 + s as u32;
                    out.push((m.id, index, timing.visible(end, index, index >= m.target)));
                }
            }
            if run.scheduled.is_empty() {
                return;
            }
        }
        if run.ends.len() > 1 {
            // Decode-only fast-forwarded run: a token per request per step.
            for (j, &end) in run.ends.iter().enumerate() {
                for &(slot, _) in &run.scheduled {
                    let a = self.act(slot);
                    let index = a.generated + 1 + j as u32;
                    out.push((
                        a.req.id,
                        index,
                        timing.visible(end, index, index >= a.target),
                    ));
                }
            }
        } else {
            let end = run.ends[0];
            for &(slot, n) in &run.scheduled {
                let a = self.act(slot);
                if a.num_computed + n == a.num_tokens() {
                    let index = a.generated + 1;
                    out.push((
                        a.req.id,
                        index,
                        timing.visible(end, index, index >= a.target),
                    ));
                }
            }
        }
    }

    /// Whether a fast-forwarded run in flight has a step ending at `t`
    /// before its last.
    pub fn has_step_ending_at(&self, t: i64) -> bool {
        self.run.as_ref().is_some_and(|r| {
            r.ends.len() > 1 && r.ends[..r.ends.len() - 1].binary_search(&t).is_ok()
        })
    }

    /// Splits a fast-forwarded run in flight at `t`: the steps that ended
    /// before `t` are finished now (their tokens go to `report`, with their
    /// own times), and only the step in progress at `t` stays in flight, so
    /// that an event at `t` (a new request, a cancellation) acts between
    /// steps exactly as if the run had been planned to stop there. Returns
    /// whether anything was finished. Owners call it before an event that
    /// changes the instance at `t`, with `t` no later than the run's end.
    pub fn split_at(&mut self, t: i64, report: &mut StepReport) -> bool {
        report.clear();
        let Some(run) = &mut self.run else {
            return false;
        };
        let n = run.ends.len();
        if n <= 1 {
            return false;
        }
        let i = run.ends.partition_point(|&e| e < t);
        if i == 0 {
            // The first step is in progress: drop the planned ones after it.
            run.ends.truncate(1);
            return false;
        }
        let rest = run.ends[i.min(n - 1)];
        let mut run = self.run.take().expect("checked");
        run.ends.truncate(i.min(n - 1));
        report.set_timing(TokenTiming::of(&self.latency));
        self.finish_steps(&run, report, true);
        run.ends.clear();
        run.ends.push(rest);
        self.run = Some(run);
        true
    }

    /// Applies the effects of a completed run, in single-step order.
    pub(super) fn finish_run(&mut self, run: &Run, report: &mut StepReport) {
        self.finish_steps(run, report, false);
    }

    /// Applies the effects of the steps of `run`; `continues`: the batch
    /// goes on for another step (a split run), whose new blocks are
    /// allocated too.
    pub(super) fn finish_steps(&mut self, run: &Run, report: &mut StepReport, continues: bool) {
        let k = run.ends.len() as u32;
        let base_step = report.step_ends.len() as u32;
        let mut done = std::mem::take(&mut self.spare_done);
        if base_step == 0 {
            report.first_step = self.counters.steps;
        }
        report.step_ends.extend_from_slice(&run.ends);
        report.steps += u64::from(k);
        self.counters.steps += u64::from(k);
        self.counters.fast_forwarded_steps += u64::from(k - 1);
        self.drain_cohort_log(report);
        if run.cohort > 0 {
            // The members (ahead of the others in the running order), then
            // the others of a single step.
            self.finish_cohort_steps(k, report, base_step, continues, &mut done);
            debug_assert!(k == 1 || run.scheduled.is_empty());
            if !run.scheduled.is_empty() {
                self.finish_one_step(run, report, base_step, &mut done);
            }
        } else if k > 1 || continues {
            self.finish_decode_run(run, report, base_step, continues, &mut done);
        } else {
            self.finish_one_step(run, report, base_step, &mut done);
        }
        self.complete(run, report, &mut done);
        self.spare_done = done;
    }

    /// A decode-only run of `k` steps: block fills and allocations recur
    /// every `block_size` steps per request, so the requests are grouped by
    /// phase and each KV operation is applied in (step, running order); each
    /// request produced `k` tokens.
    fn finish_decode_run(
        &mut self,
        run: &Run,
        report: &mut StepReport,
        base_step: u32,
        continues: bool,
        done: &mut Vec<u32>,
    ) {
        let k = run.ends.len() as u32;
        // The run's requests by phase, as its batch was formed.
        let groups = std::mem::take(&mut self.groups);
        debug_assert_eq!(
            groups.iter().map(Vec::len).sum::<usize>(),
            run.scheduled.len(),
            "a decode-only run's requests are grouped by phase"
        );
        for j in 1..=k {
            let g = &groups[self.kv.in_block(j) as usize];
            for &slot in g {
                // The request's j-th token fills a block: register it.
                let filled = self.kv.full_blocks(self.act(slot).num_computed + j);
                self.commit_hashes_upto(slot, filled);
            }
            if j < k || continues {
                // (Blocks for step j + 1 are taken when step j ends.)
                if self.kv.tiered() {
                    self.kv.set_clock(run.ends[j as usize - 1]);
                }
                for &slot in g {
                    let a = self.slots[slot as usize].as_mut().expect("live slot");
                    let ok = self.kv.allocate_one(&mut a.blocks);
                    debug_assert!(ok, "fast-forward checked the free blocks");
                }
            }
        }
        self.groups = groups;
        for &(slot, _) in &run.scheduled {
            let a = self.act_mut(slot);
            a.num_computed += k;
            let first_index = a.generated + 1;
            a.generated += k;
            if a.generated >= a.target {
                done.push(slot);
            }
            let span = TokenSpan {
                id: a.req.id,
                tag: a.req.tag,
                first_index,
                first_step: base_step,
                join: a.join,
                count: k,
                target: a.target,
                previous_us: a.last_token_us,
            };
            a.last_token_us = Some(report.token_time(&span, k - 1));
            report.spans.push(span);
        }
        self.counters.generation_tokens += u64::from(k) * run.scheduled.len() as u64;
    }

    /// One step: each scheduled request computed its chunk; those caught up
    /// with their tokens produced one (the first, after a prefill).
    fn finish_one_step(
        &mut self,
        run: &Run,
        report: &mut StepReport,
        base_step: u32,
        done: &mut Vec<u32>,
    ) {
        let timing = report.timing;
        for &(slot, n) in &run.scheduled {
            let a = self.slots[slot as usize].as_mut().expect("live slot");
            a.num_computed += n;
            let caught_up = a.num_computed == a.num_tokens();
            let filled = self.kv.full_blocks(a.num_computed);
            if filled > a.hashed {
                self.commit_hashes_upto(slot, filled);
            }
            if caught_up {
                let end = *run.ends.last().expect("a run has a step");
                let a = self.act_mut(slot);
                a.generated += 1;
                if a.generated == 1 {
                    a.first_token_us = Some(timing.visible(end, 1, a.target <= 1));
                }
                if a.generated >= a.target {
                    done.push(slot);
                }
                let span = TokenSpan {
                    id: a.req.id,
                    tag: a.req.tag,
                    first_index: a.generated,
                    first_step: base_step,
                    join: a.join,
                    count: 1,
                    target: a.target,
                    previous_us: a.last_token_us,
                };
                a.last_token_us = Some(report.token_time(&span, 0));
                report.spans.push(span);
                self.counters.generation_tokens += 1;
            }
        }
    }

    /// The requests of `done` completed at the run's end: each leaves the
    /// batch (in running order: only a request that produced a token can
    /// complete, and the batch is in running order) and frees its blocks.
    fn complete(&mut self, run: &Run, report: &mut StepReport, done: &mut Vec<u32>) {
        let timing = report.timing;
        let end = *run.ends.last().expect("a run has a step");
        // Completions, in running order: only a request that produced a
        // token can complete, and the batch is in running order.
        for &slot in done.iter() {
            let a = self.act(slot);
            let class = a.req.class;
            if self.more_urgent_waiting(class) {
                self.counters.hol_blocking_events += 1;
            }
            let a = self.act_mut(slot);
            let fin = Finished {
                id: a.req.id,
                tag: a.req.tag,
                first_token_us: a.first_token_us.unwrap_or(end),
                last_token_us: timing.visible(end, a.generated, true),
                scheduled_us: a.scheduled_us.unwrap_or(end),
                output_tokens: a.generated,
                cached_tokens: a.cached_tokens.unwrap_or(0),
                preemptions: a.preemptions,
                capped: a.capped,
            };
            if !self.release_forgetting(slot) {
                self.flush_private(slot);
                let a = self.slots[slot as usize].as_mut().expect("live slot");
                if a.hold_kv {
                    let blocks = std::mem::take(&mut a.blocks);
                    self.held.insert(fin.tag, blocks);
                } else {
                    self.kv.release(&mut a.blocks);
                }
            }
            self.index.remove(&fin.tag);
            let a = self.slots[slot as usize].take().expect("live slot");
            self.recycle(a);
            self.free_slots.push(slot);
            self.counters.completed += 1;
            report.finished.push(fin);
        }
        if !done.is_empty() {
            // `done` is a subsequence of the running order: one merge pass,
            // without reading the requests that stay (a step's other
            // instances have evicted them from the CPU's caches).
            let mut k = 0;
            self.running.retain(|&s| {
                let gone = done.get(k) == Some(&s);
                k += usize::from(gone);
                !gone
            });
            if k != done.len() {
                // (Not in running order: the general way.)
                self.running.retain(|&s| self.slots[s as usize].is_some());
            }
        }
        debug_assert!(
            self.running
                .iter()
                .all(|&s| self.act(s).generated < self.act(s).target),
            "a request that produced no token completed"
        );
        done.clear();
    }

    /// Registers the hashes of the request's blocks `[hashed, upto)`.
    ///
    /// A private block of a request never preempted is only marked full
    /// here: its commit ([`KvCache::commit_private`]) waits until the
    /// request releases its blocks ([`Instance::flush_private`]). Nothing
    /// can look private content up meanwhile, and the block is touched
    /// then anyway, so a new block costs one cache miss instead of two.
    ///
    /// Inlined for the common case (nothing new, or private content
    /// deferred: a few instructions on a decode step's block boundary);
    /// the commits themselves are [`Instance::commit_new_hashes`].
    #[inline]
    pub(super) fn commit_hashes_upto(&mut self, slot: u32, upto: u32) {
        if !self.kv.prefix_caching() {
            return;
        }
        let a = self.slots[slot as usize].as_mut().expect("live slot");
        let upto = upto.min(a.table_len());
        if a.hashed >= upto {
            return;
        }
        if a.hashed >= a.private_from && a.preemptions == 0 {
            // Private content of a request never preempted: no block
            // holds it yet, and only this request could ever look it up.
            a.private_pending = a.private_pending.min(a.hashed);
            a.hashed = upto;
            return;
        }
        self.commit_new_hashes(slot, upto);
    }

    /// [`Instance::commit_hashes_upto`]'s commits of blocks `[hashed,
    /// upto)` (`upto` within the request's table), the first not deferred.
    #[inline(never)]
    fn commit_new_hashes(&mut self, slot: u32, upto: u32) {
        let bs = self.kv.block_size();
        let a = self.slots[slot as usize].as_mut().expect("live slot");
        while a.hashed < upto {
            if a.hashed >= a.private_from && a.preemptions == 0 {
                // (As above: the rest is private and deferred.)
                a.private_pending = a.private_pending.min(a.hashed);
                a.hashed = upto;
                break;
            }
            let ahead = a.hashed + crate::engine::kv_cache::PIPELINE as u32;
            if ahead < upto {
                self.kv.prefetch_commit(a.hash(bs, ahead));
            }
            let h = a.hash(bs, a.hashed);
            let parent = a.hashed.checked_sub(1).map(|p| a.blocks[p as usize]);
            self.kv.commit(a.blocks[a.hashed as usize], h, parent);
            a.hashed += 1;
        }
    }

    /// Frees the blocks of the request in `slot`, which is leaving for
    /// good, forgetting its private content
    /// ([`Instance::set_forget_private`]) when it may; `false` (nothing
    /// done) when it may not.
    fn release_forgetting(&mut self, slot: u32) -> bool {
        if !self.forget_private {
            return false;
        }
        let a = self.slots[slot as usize].as_mut().expect("live slot");
        if a.preemptions > 0 || a.private_from == u32::MAX || a.hold_kv {
            return false;
        }
        // Its deferred full blocks are its private ones, all of them
        // (see `commit_hashes_upto`).
        debug_assert!(a.private_pending == u32::MAX || a.private_pending == a.private_from);
        let hashed = match a.private_pending {
            u32::MAX => 0,
            p => a.hashed - p,
        };
        let virt = std::mem::take(&mut a.virt);
        self.kv
            .release_forgetting_virtual(&mut a.blocks, a.private_from as usize, hashed, virt);
        a.private_pending = u32::MAX;
        true
    }

    /// An empty list for the content segments of a request to come here
    /// ([`SimRequest::segments`]), from a completed request when there is
    /// one.
    pub(crate) fn spare_segments(&mut self) -> Vec<Segment> {
        self.spare_segments.pop().unwrap_or_default()
    }

    /// Keeps the block table, hash list and segment list of a completed
    /// request `a` (its blocks released) for a request to come.
    fn recycle(&mut self, a: Active) {
        debug_assert!(
            a.blocks.is_empty(),
            "a completed request's blocks were released"
        );
        keep_spare(&mut self.spare_segments, a.req.segments);
        keep_spare(&mut self.spare_tables, a.blocks);
        // (A request enqueued with its hashes, from a router that hashed
        // its prompt, takes none: the cap keeps them from piling up.)
        keep_spare(&mut self.spare_hashes, a.hashes);
    }

    /// Whether request `a`'s blocks from `private_from` on may be held
    /// without ids ([`KvCache::take_virtual`]): it will forget them when it
    /// leaves ([`Instance::release_forgetting`]'s terms), and nothing reads
    /// their ids before then. One that turns out to need them (preempted,
    /// or its private content shared) gets them first
    /// ([`Instance::flush_private`]).
    #[inline]
    pub(super) fn takes_virtual(&self, a: &Active) -> bool {
        self.forget_private
            && a.preemptions == 0
            && a.private_from != u32::MAX
            && !a.hold_kv
            && self.kv.prefix_caching()
    }

    /// Commits the request's deferred private blocks to the KV cache
    /// (before its blocks are released or its content is shared).
    pub(super) fn flush_private(&mut self, slot: u32) {
        let bs = self.kv.block_size();
        let a = self.slots[slot as usize].as_mut().expect("live slot");
        if a.virt > 0 {
            // Its blocks held without ids get them (the blocks they stand
            // for left the free queue when it took them).
            let v = std::mem::take(&mut a.virt);
            self.kv.materialise_virtual(&mut a.blocks, v);
        }
        let from = std::mem::replace(&mut a.private_pending, u32::MAX);
        for j in from..a.hashed {
            if let Some(&ahead) = a.blocks.get(j as usize + crate::engine::kv_cache::PIPELINE) {
                self.kv.prefetch_block(ahead);
            }
            let h = a.hash(bs, j);
            let parent = j.checked_sub(1).map(|p| a.blocks[p as usize]);
            self.kv.commit_private(a.blocks[j as usize], h, parent);
        }
    }

    /// Cancels the request of flight `tag` (a client timeout or disconnect;
    /// the owner's tags are unique among the requests in the system, which
    /// request ids of a trace need not be): it leaves the
    /// wait queue or the batch and frees its blocks, as vLLM aborts a request
    /// whose client went away. Returns what it had produced, or `None` when
    /// it is not in the system (already finished). Must not be called while
    /// its step is in flight unless `now` is that step's end; the owner
    /// calls it between steps.
    pub fn abort(&mut self, tag: u32) -> Option<Aborted> {
        if !self.index.contains_key(&tag) {
            return None;
        }
        self.dissolve_cohort();
        let slot = self.index.remove(&tag)?;
        if let Some(run) = &mut self.run
            && run.scheduled.iter().any(|(s, _)| *s == slot)
        {
            // In the batch in flight: it leaves the batch; the step's time
            // stays (the GPU did the work). Owners bound fast-forwarded runs
            // by the next abort, so a run in flight here is a single step.
            debug_assert_eq!(run.ends.len(), 1, "abort inside a fast-forwarded run");
            run.scheduled.retain(|(s, _)| *s != slot);
            run.ends.truncate(1);
        }
        let was_running = if let Some(pos) = self.running.iter().position(|&s| s == slot) {
            self.running.remove(pos);
            true
        } else {
            false
        };
        if !was_running {
            self.waiting.remove(slot);
            self.count_waiting(slot, false);
        }
        if !self.release_forgetting(slot) {
            self.flush_private(slot);
            let blocks = &mut self.act_mut(slot).blocks;
            let mut blocks = std::mem::take(blocks);
            self.kv.release(&mut blocks);
        }
        let a = self.slots[slot as usize].take().expect("live slot");
        self.free_slots.push(slot);
        self.counters.aborted += 1;
        Some(Aborted {
            generated: a.generated,
            first_token_us: a.first_token_us,
            last_token_us: a.last_token_us,
        })
    }

    /// Checks invariants (for tests): KV conservation and request accounting.
    pub fn check(&self) -> Result<(), String> {
        self.kv.check()?;
        let live = self.slots.iter().filter(|s| s.is_some()).count();
        if live != self.waiting.len() + self.running.len() {
            return Err(format!(
                "{live} live requests but {} waiting + {} running",
                self.waiting.len(),
                self.running.len()
            ));
        }
        let by_class: u32 = self.waiting_classes.iter().sum();
        if by_class as usize != self.waiting.len() {
            return Err(format!(
                "{by_class} waiting by class but {} in the queue",
                self.waiting.len()
            ));
        }
        // The running order is the order requests joined the batch in
        // (preemption takes the last; the steady decoders rely on it).
        if let Some(w) = self
            .running
            .windows(2)
            .find(|w| self.act(w[0]).join >= self.act(w[1]).join)
        {
            return Err(format!(
                "running request in slot {} joined before the one ahead of it (slot {})",
                w[1], w[0]
            ));
        }
        let c = self.counters;
        if c.enqueued != c.completed + c.aborted + live as u64 {
            return Err(format!(
                "enqueued {} != completed {} + aborted {} + in system {live}",
                c.enqueued, c.completed, c.aborted
            ));
        }
        let held: usize = self
            .running
            .iter()
            .map(|&s| self.act(s).table_len() as usize)
            .sum::<usize>()
            + self.cohort.virtual_pending() as usize
            + self.held_blocks();
        if held < self.kv.used() as usize {
            return Err(format!(
                "requests hold {held} blocks but {} are used",
                self.kv.used()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new report is in the state `set_timing` gives its (default)
    /// timing, so that a sink counts its spans' gaps per step: the output
    /// thread's report never has its timing set when the model adds no
    /// output delay.
    #[test]
    fn a_default_report_counts_gaps_per_step() {
        let mut set = StepReport::default();
        set.set_timing(TokenTiming::default());
        let d = StepReport::default();
        assert_eq!(d.constant_extras, set.constant_extras);
        let span = TokenSpan {
            id: 0,
            tag: 0,
            first_index: 1,
            first_step: 0,
            join: 0,
            count: 3,
            target: 10,
            previous_us: None,
        };
        assert_eq!(d.span_times(&span).step_gap_tokens(), Some(3));
    }
}
