//! Deterministic request generation from a [`WorkloadSpec`].
//!
//! Every client draws from its own ChaCha8 streams, one per purpose
//! (arrivals, input lengths, output lengths, ...), keyed by the client's id:
//! adding or removing a client leaves the other clients' draws unchanged.
//! Clients produce requests in arrival order; a k-way merge interleaves them
//! (ties: earlier client in the spec first) and assigns sequential ids.
//! Generation is lazy: [`Generator`] is an iterator, so a million requests
//! need no more memory than the clients' pending state.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::path::Path;
use std::sync::Arc;

use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};
use xxhash_rust::xxh3::xxh3_64;

use crate::arrival::{ArrivalSampler, shape_for_cv};
use crate::dist::{LengthSampler, RatioSampler};
use crate::error::{Error, Result};
use crate::record::Request;
use crate::servegen::{self, ServeGenClient, overlap};
use crate::spec::{
    ArrivalProcess, ArrivalSpec, ClientSpec, ContextGrowth, DistKind, DistParams, DistSpec, Finite,
    InferencePerfSpec, MultiTurnSpec, MultimodalSpec, ServeGenArrivalParams, ServeGenDataSpec,
    WorkloadSpec,
};

/// Overrides of a spec's stopping rules, seed and rate (the CLI's
/// `--seed`, `--horizon-s`, `--num-requests`, `--aggregate-rate`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GenerateOptions {
    /// Replaces the spec's seed.
    pub seed: Option<u64>,
    /// Replaces the spec's `horizon_us`.
    pub horizon_us: Option<u64>,
    /// Replaces the spec's `num_requests`.
    pub num_requests: Option<u64>,
    /// Replaces the spec's total rate, requests/s: `aggregate_rate` of a
    /// spec of clients (shared by their `rate_fraction`s), or
    /// `servegen_data.aggregate_rate` (the span's mean total rate; it
    /// replaces a `rate_scale`). An `inference_perf` spec's stages set
    /// their own rates and refuse it.
    pub aggregate_rate: Option<f64>,
}

/// A ChaCha8 stream for `purpose` of `client`, from `seed`: the seed keys the
/// generator, and a hash of (client, purpose) selects one of its 2^64
/// independent streams.
pub fn stream_rng(seed: u64, client: &str, purpose: &str) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut key = Vec::with_capacity(client.len() + purpose.len() + 1);
    key.extend_from_slice(client.as_bytes());
    key.push(0);
    key.extend_from_slice(purpose.as_bytes());
    rng.set_stream(xxh3_64(&key));
    rng
}

/// A source of requests in non-decreasing arrival order (`request_id` is
/// assigned by the merge).
trait ClientStream: Send {
    fn next_request(&mut self) -> Result<Option<Request>>;
}

/// Generates the requests of `spec`, all at once.
///
/// # Errors
/// A spec that cannot terminate (no horizon, request count or finite
/// windows), or data files that cannot be read.
pub fn generate(spec: &WorkloadSpec, opts: &GenerateOptions) -> Result<Vec<Request>> {
    Generator::new(spec, opts)?.collect()
}

/// Lazily generates the requests of a spec, in arrival order with
/// sequential ids.
pub struct Generator {
    clients: Vec<Box<dyn ClientStream>>,
    heads: Vec<Option<Request>>,
    heap: BinaryHeap<Reverse<(i64, usize)>>,
    next_id: u64,
    limit: Option<u64>,
    failed: bool,
    /// The spec's file, for errors.
    path: std::path::PathBuf,
}

impl std::fmt::Debug for Generator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generator")
            .field("clients", &self.clients.len())
            .field("next_id", &self.next_id)
            .field("limit", &self.limit)
            .finish()
    }
}

/// The file `spec` came from, for errors.
fn spec_path(spec: &WorkloadSpec) -> &Path {
    if spec.source.as_os_str().is_empty() {
        Path::new("<spec>")
    } else {
        &spec.source
    }
}

/// The most requests one ServeGen window generates (10^7; its arrivals
/// are drawn at once, 24 bytes each).
const MAX_WINDOW_REQUESTS: u64 = 10_000_000;

/// The most requests one generation may plan (10^8): more is refused
/// rather than generated for hours.
pub const MAX_PLANNED_REQUESTS: u64 = 100_000_000;

impl Generator {
    /// Prepares the clients of `spec`.
    ///
    /// # Errors
    /// As [`generate`].
    pub fn new(spec: &WorkloadSpec, opts: &GenerateOptions) -> Result<Self> {
        let overridden;
        let spec = match opts.aggregate_rate {
            None => spec,
            Some(r) => {
                overridden = with_aggregate_rate(spec, r)?;
                &overridden
            }
        };
        let seed = opts.seed.unwrap_or_else(|| spec.seed_or_default());
        let horizon = opts.horizon_us.or(spec.horizon_us).map(|h| h as i64);
        let limit = opts.num_requests.or(spec.num_requests);
        if let Some(h) = horizon
            && !(1..=crate::csvio::MAX_TIME_US).contains(&h)
        {
            let h = opts.horizon_us.or(spec.horizon_us).unwrap_or(0);
            let why = if h == 0 {
                "horizon: 0 µs: a horizon must be at least 1 µs".to_string()
            } else {
                format!("horizon: {h} µs is beyond 2^53 µs (285 years)")
            };
            return Err(Error::in_file(spec_path(spec), why));
        }
        if let Some(n) = limit
            && n > MAX_PLANNED_REQUESTS
        {
            return Err(Error::in_file(
                spec_path(spec),
                format!(
                    "num_requests: {n} is more than the {MAX_PLANNED_REQUESTS} requests a run may plan"
                ),
            ));
        }
        if limit.is_none()
            && let (Some(h), Some(rate)) = (horizon, spec.aggregate_rate)
        {
            let expected = rate.0 * (h as f64 / 1e6);
            if expected > MAX_PLANNED_REQUESTS as f64 {
                return Err(Error::in_file(
                    spec_path(spec),
                    format!(
                        "aggregate_rate {} req/s over a horizon of {} s plans about {expected:.3e} requests, more than the {MAX_PLANNED_REQUESTS} a run may plan: lower the rate or the horizon, or set num_requests (--num-requests)",
                        crate::shown::Num(rate.0),
                        crate::shown::Num(h as f64 / 1e6)
                    ),
                ));
            }
        }
        let mut clients: Vec<Box<dyn ClientStream>> = Vec::new();
        if let Some(sg) = &spec.servegen_data {
            clients.extend(servegen_clients(sg, &spec.base_dir, seed, horizon)?);
        } else if let Some(ip) = &spec.inference_perf {
            clients.push(Box::new(InferencePerfStream::new(ip, seed, horizon)));
        } else {
            let total: f64 = spec
                .clients
                .iter()
                .map(|c| c.rate_fraction.map_or(1.0, |f| f.0))
                .sum();
            let agg = spec.aggregate_rate.map_or(0.0, |r| r.0);
            for c in &spec.clients {
                let frac = c.rate_fraction.map_or(1.0, |f| f.0);
                let rate = if total > 0.0 { agg * frac / total } else { 0.0 };
                if frac == 0.0 {
                    continue;
                }
                let stream = SpecClient::new(c, rate, seed, horizon, &spec.base_dir)?;
                if stream.unbounded && limit.is_none() {
                    return Err(Error::in_file(
                        spec_path(spec),
                        format!(
                            "client {:?} never stops: set horizon_us or num_requests in the spec \
                             (or --horizon-s / --num-requests), or give it lifecycle windows",
                            c.id
                        ),
                    ));
                }
                clients.push(Box::new(stream));
            }
        }
        let n = clients.len();
        let mut g = Self {
            clients,
            heads: vec![None; n],
            heap: BinaryHeap::with_capacity(n),
            next_id: 0,
            limit,
            failed: false,
            path: spec_path(spec).to_path_buf(),
        };
        for i in 0..n {
            g.refill(i)?;
        }
        Ok(g)
    }

    fn refill(&mut self, i: usize) -> Result<()> {
        if let Some(r) = self.clients[i].next_request()? {
            self.heap.push(Reverse((r.arrival_time_us, i)));
            self.heads[i] = Some(r);
        }
        Ok(())
    }
}

impl Iterator for Generator {
    type Item = Result<Request>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.limit.is_some_and(|l| self.next_id >= l) {
            return None;
        }
        let Reverse((t, i)) = self.heap.pop()?;
        if t > crate::csvio::MAX_TIME_US {
            // Nothing arrives after 285 years (a rate so low, or a think
            // time so long, that times would overflow): the trace ends,
            // which is an error when it ends short of the count asked for.
            self.failed = true;
            return self.limit.map(|l| {
                Err(Error::in_file(
                    &self.path,
                    format!(
                        "num_requests: only {} of {l} requests arrive within 2^53 µs (285 years): the arrival rates (aggregate_rate, rate_fraction) or think times leave the rest beyond any time a trace can hold",
                        self.next_id
                    ),
                ))
            });
        }
        let mut r = self.heads[i].take().expect("heap entries have a head");
        r.request_id = self.next_id;
        self.next_id += 1;
        if let Err(e) = self.refill(i) {
            self.failed = true;
            return Some(Err(e));
        }
        Some(Ok(r))
    }
}

/// Labels shared by every request of a client.
#[derive(Debug, Clone)]
struct Labels {
    /// What every request of the client carries: its labels, and the
    /// other fields as `Request::default()` has them.
    request: Request,
    timeout_us: Option<u64>,
}

impl Labels {
    /// A request of this client at `arrival_us`. (A clone of the client's
    /// request: six atomic reference counts, where filling in the
    /// default's six empty labels cost sixteen, on counts the outputs'
    /// thread changes too as it drops records.)
    fn request(&self, arrival_us: i64) -> Request {
        Request {
            arrival_time_us: arrival_us,
            deadline_us: self.timeout_us.map(|t| arrival_us + t as i64),
            ..self.request.clone()
        }
    }
}

/// Multimodal samplers: text, and per modality (count, tokens per item).
#[derive(Debug, Clone)]
struct ModalSamplers {
    text: Option<LengthSampler>,
    image: Option<(LengthSampler, LengthSampler)>,
    audio: Option<(LengthSampler, LengthSampler)>,
    video: Option<(LengthSampler, LengthSampler)>,
}

/// Input composition of one request (before the shared prefix).
#[derive(Debug, Clone, Copy, Default)]
struct Inputs {
    text: u32,
    image: u32,
    audio: u32,
    video: u32,
}

impl Inputs {
    fn total(&self) -> u32 {
        self.text
            .saturating_add(self.image)
            .saturating_add(self.audio)
            .saturating_add(self.video)
    }
}

fn sample_items(pair: &Option<(LengthSampler, LengthSampler)>, rng: &mut ChaCha8Rng) -> u32 {
    match pair {
        None => 0,
        Some((count, each)) => {
            let n = count.sample(rng);
            (0..n).fold(0u32, |acc, _| acc.saturating_add(each.sample(rng)))
        }
    }
}

/// A follow-up round of a session waiting for its turn.
#[derive(Debug)]
struct FollowUp {
    request: Request,
    rounds_left: u32,
    seq: u64,
}

/// A client of a spec's `clients` list.
struct SpecClient {
    labels: Labels,
    arrival: Option<ArrivalSampler>,
    windows: Vec<(f64, f64)>,
    window: usize,
    t: f64,
    rng_arrival: ChaCha8Rng,
    rng_input: ChaCha8Rng,
    rng_output: ChaCha8Rng,
    rng_modal: ChaCha8Rng,
    rng_reason: ChaCha8Rng,
    input: LengthSampler,
    output: LengthSampler,
    modal: Option<ModalSamplers>,
    reason: Option<RatioSampler>,
    multi_turn: Option<MultiTurnSpec>,
    sessions: u64,
    follow_ups: BinaryHeap<Reverse<(i64, u64)>>,
    pending: Vec<FollowUp>,
    follow_seq: u64,
    next_fresh: Option<i64>,
    unbounded: bool,
}

/// The arrival sampler of a client at `rate` requests/s, or from the
/// process's own shape and scale when the rate is 0; `None` when neither
/// defines one (the client sends only follow-ups).
fn arrival_sampler(a: &ArrivalSpec, rate: f64) -> Option<ArrivalSampler> {
    if rate > 0.0 {
        let shape = a
            .shape
            .map(|s| s.0)
            .or_else(|| shape_for_cv(a.process, a.cv.map_or(1.0, |v| v.0)));
        ArrivalSampler::new(a.process, rate, shape)
    } else {
        match (a.shape, a.scale) {
            (Some(s), Some(sc)) => ArrivalSampler::with_scale(a.process, s.0, sc.0),
            _ => None,
        }
    }
}

/// A client's active windows (µs, sorted, cut at the horizon) and whether
/// it sends forever (an endless window and no horizon).
fn active_windows(c: &ClientSpec, horizon: Option<i64>) -> (Vec<(f64, f64)>, bool) {
    let mut windows: Vec<(f64, f64)> = match &c.lifecycle {
        Some(lc) => lc
            .windows
            .iter()
            .map(|w| (w.start_us as f64, w.end_us as f64))
            .collect(),
        None => vec![(0.0, f64::INFINITY)],
    };
    windows.sort_by(|x, y| x.0.total_cmp(&y.0));
    let unbounded = horizon.is_none() && windows.iter().any(|w| w.1.is_infinite());
    if let Some(h) = horizon {
        for w in &mut windows {
            w.1 = w.1.min(h as f64);
        }
        windows.retain(|w| w.0 < w.1);
    }
    (windows, unbounded)
}

impl ModalSamplers {
    /// The samplers of a client's multimodal composition (an item count of
    /// 1 where only the tokens per item are given).
    fn new(m: &MultimodalSpec, base: &Path) -> Result<Self> {
        let pair = |count: &Option<DistSpec>,
                    each: &Option<DistSpec>|
         -> Result<Option<(LengthSampler, LengthSampler)>> {
            Ok(match (count, each) {
                (Some(n), Some(t)) => Some((
                    LengthSampler::new(n, base, 0)?,
                    LengthSampler::new(t, base, 0)?,
                )),
                (None, Some(t)) => Some((
                    LengthSampler::new(&constant(1.0), base, 0)?,
                    LengthSampler::new(t, base, 0)?,
                )),
                _ => None,
            })
        };
        Ok(Self {
            text: m
                .text_distribution
                .as_ref()
                .map(|d| LengthSampler::new(d, base, 0))
                .transpose()?,
            image: pair(&m.image_count_distribution, &m.image_distribution)?,
            audio: pair(&m.audio_count_distribution, &m.audio_distribution)?,
            video: pair(&m.video_count_distribution, &m.video_distribution)?,
        })
    }
}

impl SpecClient {
    fn new(
        c: &ClientSpec,
        rate: f64,
        seed: u64,
        horizon: Option<i64>,
        base: &Path,
    ) -> Result<Self> {
        let id = c.id.as_str();
        let arrival = arrival_sampler(&c.arrival, rate);
        let (windows, unbounded) = active_windows(c, horizon);
        let prefix_length = if c.prefix_group.is_empty() {
            0
        } else {
            c.prefix_length.unwrap_or(50)
        };
        let modal = c
            .multimodal
            .as_ref()
            .map(|m| ModalSamplers::new(m, base))
            .transpose()?;
        let reason = c
            .reasoning
            .as_ref()
            .and_then(|r| r.reason_ratio_distribution.as_ref())
            .map(|d| RatioSampler::new(d, base))
            .transpose()?;
        let multi_turn = c.reasoning.as_ref().and_then(|r| r.multi_turn);
        let start = windows.first().map_or(0.0, |w| w.0);
        Ok(Self {
            labels: Labels {
                request: Request {
                    client_id: Arc::from(id),
                    tenant_id: Arc::from(c.tenant_id.as_str()),
                    slo_class: Arc::from(c.slo_class.as_str()),
                    model: Arc::from(c.model.as_str()),
                    prefix_group: Arc::from(c.prefix_group.as_str()),
                    prefix_length,
                    streaming: c.streaming,
                    ..Request::default()
                },
                timeout_us: c.timeout_us,
            },
            arrival,
            windows,
            window: 0,
            t: start,
            rng_arrival: stream_rng(seed, id, "arrival"),
            rng_input: stream_rng(seed, id, "input"),
            rng_output: stream_rng(seed, id, "output"),
            rng_modal: stream_rng(seed, id, "multimodal"),
            rng_reason: stream_rng(seed, id, "reasoning"),
            input: LengthSampler::new(&c.input_distribution, base, 1)?,
            output: LengthSampler::new(&c.output_distribution, base, 1)?,
            modal,
            reason,
            multi_turn,
            sessions: 0,
            follow_ups: BinaryHeap::new(),
            pending: Vec::new(),
            follow_seq: 0,
            next_fresh: None,
            unbounded,
        })
    }

    /// Advances to the next fresh arrival (µs), or `None` when done.
    fn fresh(&mut self) -> Option<i64> {
        if self.next_fresh.is_none() {
            let sampler = self.arrival.as_ref()?;
            while let Some(&(start, end)) = self.windows.get(self.window) {
                if self.t < start {
                    self.t = start;
                }
                let gap = sampler.sample(&mut self.rng_arrival);
                self.t += gap;
                // (A gap past any representable time, in an endless window:
                // an arrival at the end of time, which the generator reports
                // when it leaves a count short.)
                if self.t < end || (self.t.is_nan() || self.t.is_infinite()) && end.is_infinite() {
                    self.next_fresh = Some(if self.t.is_finite() {
                        self.t as i64
                    } else {
                        i64::MAX
                    });
                    break;
                }
                self.window += 1;
                self.t = self.windows.get(self.window).map_or(self.t, |w| w.0);
            }
        }
        self.next_fresh
    }

    fn sample_inputs(&mut self) -> Inputs {
        match &self.modal {
            None => Inputs {
                text: self.input.sample(&mut self.rng_input),
                ..Inputs::default()
            },
            Some(m) => Inputs {
                text: match &m.text {
                    Some(t) => t.sample(&mut self.rng_input),
                    None => self.input.sample(&mut self.rng_input),
                },
                image: sample_items(&m.image, &mut self.rng_modal),
                audio: sample_items(&m.audio, &mut self.rng_modal),
                video: sample_items(&m.video, &mut self.rng_modal),
            },
        }
    }

    fn fresh_request(&mut self, arrival: i64) -> Request {
        let inputs = self.sample_inputs();
        let mut r = self.labels.request(arrival);
        let p = self.labels.request.prefix_length;
        r.input_tokens = inputs.total().saturating_add(p);
        if self.modal.is_some() {
            r.text_tokens = inputs.text.saturating_add(p);
            r.image_tokens = inputs.image;
            r.audio_tokens = inputs.audio;
            r.video_tokens = inputs.video;
        }
        r.output_tokens = self.output.sample(&mut self.rng_output);
        if let Some(rs) = &self.reason {
            r.reason_ratio = rs.sample(&mut self.rng_reason);
        }
        if let Some(mt) = self.multi_turn {
            r.session_id = Arc::from(format!(
                "{}-s{}",
                self.labels.request.client_id, self.sessions
            ));
            self.sessions += 1;
            if mt.max_rounds > 1 {
                self.schedule_follow_up(&r, mt, mt.max_rounds - 1);
            }
        }
        r
    }

    fn schedule_follow_up(&mut self, prev: &Request, mt: MultiTurnSpec, rounds_left: u32) {
        let arrival = prev.arrival_time_us + mt.think_time_us as i64;
        let question = self.sample_inputs();
        let mut r = self.labels.request(arrival);
        r.session_id = prev.session_id.clone();
        r.round_index = prev.round_index + 1;
        r.think_time_us = Some(mt.think_time_us as i64);
        r.input_tokens = match mt.context_growth {
            ContextGrowth::Accumulate => prev
                .input_tokens
                .saturating_add(prev.output_tokens)
                .saturating_add(question.total()),
            ContextGrowth::Fixed => question
                .total()
                .saturating_add(self.labels.request.prefix_length),
        };
        if self.modal.is_some() {
            r.text_tokens = match mt.context_growth {
                ContextGrowth::Accumulate => prev
                    .text_tokens
                    .saturating_add(prev.output_tokens)
                    .saturating_add(question.text),
                ContextGrowth::Fixed => question
                    .text
                    .saturating_add(self.labels.request.prefix_length),
            };
            let carry = mt.context_growth == ContextGrowth::Accumulate;
            r.image_tokens = question.image + if carry { prev.image_tokens } else { 0 };
            r.audio_tokens = question.audio + if carry { prev.audio_tokens } else { 0 };
            r.video_tokens = question.video + if carry { prev.video_tokens } else { 0 };
        }
        r.output_tokens = self.output.sample(&mut self.rng_output);
        if let Some(rs) = &self.reason {
            r.reason_ratio = rs.sample(&mut self.rng_reason);
        }
        let seq = self.follow_seq;
        self.follow_seq += 1;
        self.follow_ups.push(Reverse((arrival, seq)));
        self.pending.push(FollowUp {
            request: r,
            rounds_left: rounds_left - 1,
            seq,
        });
    }

    fn horizon_end(&self) -> f64 {
        self.windows.last().map_or(f64::INFINITY, |w| w.1)
    }
}

impl ClientStream for SpecClient {
    fn next_request(&mut self) -> Result<Option<Request>> {
        let fresh = self.fresh();
        let follow = self.follow_ups.peek().map(|Reverse((t, _))| *t);
        let take_follow = match (fresh, follow) {
            (_, None) => false,
            (None, Some(_)) => true,
            (Some(f), Some(u)) => u < f,
        };
        if take_follow {
            let Reverse((_, seq)) = self.follow_ups.pop().expect("peeked");
            let idx = self
                .pending
                .iter()
                .position(|p| p.seq == seq)
                .expect("pending follow-up");
            let fu = self.pending.swap_remove(idx);
            // Rounds beyond the generation horizon are not generated.
            if (fu.request.arrival_time_us as f64) >= self.horizon_end()
                && self.horizon_end().is_finite()
            {
                return self.next_request();
            }
            if fu.rounds_left > 0
                && let Some(mt) = self.multi_turn
            {
                self.schedule_follow_up(&fu.request, mt, fu.rounds_left);
            }
            return Ok(Some(fu.request));
        }
        match fresh {
            Some(t) => {
                self.next_fresh = None;
                Ok(Some(self.fresh_request(t)))
            }
            None => Ok(None),
        }
    }
}

fn constant(v: f64) -> DistSpec {
    DistSpec {
        kind: DistKind::Constant,
        params: DistParams {
            value: Some(Finite(v)),
            ..DistParams::default()
        },
        pmf: None,
        file: None,
    }
}

/// Rounds `x` to an integer without bias: floor, plus one with probability
/// equal to the fraction.
fn stochastic_round(x: f64, rng: &mut ChaCha8Rng) -> u64 {
    let f = x.floor();
    let frac = x - f;
    f as u64 + u64::from(frac > 0.0 && rng.random::<f64>() < frac)
}

/// `spec` with its total rate replaced by `rate` requests/s
/// ([`GenerateOptions::aggregate_rate`]).
fn with_aggregate_rate(spec: &WorkloadSpec, rate: f64) -> Result<WorkloadSpec> {
    if !(rate.is_finite() && rate > 0.0) {
        return Err(Error::in_file(
            spec_path(spec),
            format!(
                "--aggregate-rate: {} is not a positive number of requests/s",
                crate::shown::Num(rate)
            ),
        ));
    }
    let mut s = spec.clone();
    if let Some(sg) = &mut s.servegen_data {
        sg.aggregate_rate = Some(crate::spec::Finite(rate));
        sg.rate_scale = None;
    } else if s.inference_perf.is_some() {
        return Err(Error::in_file(
            spec_path(spec),
            "--aggregate-rate: an inference_perf spec sets the rate of each of its stages; edit them",
        ));
    } else {
        s.aggregate_rate = Some(crate::spec::Finite(rate));
    }
    Ok(s)
}

/// `path` with `.` and `name/..` components folded away, without touching
/// the file system (the folder may not exist), for error messages a user
/// can read.
fn lexically_normal(path: &Path) -> std::path::PathBuf {
    use std::path::Component;
    let mut out = std::path::PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if matches!(out.components().next_back(), Some(Component::Normal(_))) {
                    out.pop();
                } else if !matches!(
                    out.components().next_back(),
                    Some(Component::RootDir | Component::Prefix(_))
                ) {
                    out.push("..");
                }
            }
            other => out.push(other),
        }
    }
    out
}

/// One ServeGen chunk as a client.
struct ServeGenStream {
    client: Arc<ServeGenClient>,
    labels: Labels,
    mode: ServeGenArrivalParams,
    scale: f64,
    span: (f64, f64),
    window: usize,
    queue: VecDeque<(i64, usize)>,
    rng_arrival: ChaCha8Rng,
    rng_input: ChaCha8Rng,
    rng_output: ChaCha8Rng,
    rng_modal: ChaCha8Rng,
    rng_reason: ChaCha8Rng,
    horizon: Option<i64>,
}

fn servegen_clients(
    sg: &ServeGenDataSpec,
    base: &Path,
    seed: u64,
    horizon: Option<i64>,
) -> Result<Vec<Box<dyn ClientStream>>> {
    let dir = lexically_normal(&if sg.path.is_absolute() {
        sg.path.clone()
    } else {
        base.join(&sg.path)
    });
    if !dir.is_dir() {
        return Err(Error::in_file(
            &dir,
            format!(
                "servegen_data.path {:?}: no such folder (a relative path is read from the spec's folder{}; ServeGen's data: https://github.com/alibaba/ServeGen, data/)",
                sg.path.display().to_string(),
                if base.as_os_str().is_empty() {
                    String::new()
                } else {
                    format!(", {}", lexically_normal(base).display())
                }
            ),
        ));
    }
    let clients = servegen::load(&dir, sg.chunks.as_deref())?;
    let start = sg.span_start_s.map_or(0.0, |v| v.0);
    let data_end = clients.iter().map(|c| c.end_s()).fold(0.0, f64::max);
    if let Some(want) = sg.span_end_s
        && want.0 > data_end
    {
        return Err(Error::in_file(
            &dir,
            format!(
                "servegen_data.span_end_s is {} s but the data ends at {data_end} s (its last window)",
                want.0
            ),
        ));
    }
    let mut end = sg.span_end_s.map_or(data_end, |v| v.0);
    if let Some(h) = horizon {
        end = end.min(start + h as f64 / 1e6);
    }
    if end <= start {
        return Err(Error::in_file(
            &dir,
            format!("empty span: {start} s to {end} s"),
        ));
    }
    let scale = match (sg.rate_scale, sg.aggregate_rate) {
        (Some(s), _) => s.0,
        (None, Some(target)) => {
            let expected: f64 = clients
                .iter()
                .map(|c| c.expected_requests(start, end))
                .sum();
            if expected <= 0.0 {
                return Err(Error::in_file(&dir, "no requests in the span to scale"));
            }
            target.0 / (expected / (end - start))
        }
        (None, None) => 1.0,
    };
    let streaming = sg.streaming.unwrap_or(true);
    Ok(clients
        .into_iter()
        .map(|c| {
            let id = c.client_id();
            let s: Box<dyn ClientStream> = Box::new(ServeGenStream {
                labels: Labels {
                    request: Request {
                        client_id: Arc::from(id.as_str()),
                        streaming,
                        ..Request::default()
                    },
                    timeout_us: None,
                },
                client: Arc::new(c),
                mode: sg.arrival_params,
                scale,
                span: (start, end),
                window: 0,
                queue: VecDeque::new(),
                rng_arrival: stream_rng(seed, &id, "arrival"),
                rng_input: stream_rng(seed, &id, "input"),
                rng_output: stream_rng(seed, &id, "output"),
                rng_modal: stream_rng(seed, &id, "multimodal"),
                rng_reason: stream_rng(seed, &id, "reasoning"),
                horizon,
            });
            s
        })
        .collect())
}

impl ServeGenStream {
    /// Fills the queue with the next active window's arrivals.
    ///
    /// Per window (ServeGen's `construct.py` method, made exact): the count
    /// is the recorded rate × scale × the window's overlap with the span
    /// (rounded without bias); n+1 gaps are drawn from the window's family
    /// and rescaled to sum to the overlap, and the first n partial sums are
    /// the arrivals. The rate is thus kept exactly and the shape (CV) of the
    /// gaps is the family's.
    fn fill(&mut self) {
        let (s0, s1) = self.span;
        while self.queue.is_empty() && self.window < self.client.windows.len() {
            let wi = self.window;
            self.window += 1;
            let w = &self.client.windows[wi];
            if !w.is_active() {
                continue;
            }
            let a = w.start_s.max(s0);
            let b = (w.start_s + w.duration_s).min(s1);
            let len = overlap(w.start_s, w.start_s + w.duration_s, s0, s1);
            if len <= 0.0 {
                continue;
            }
            // (At most the requests a run may plan: a scaled-up window
            // could ask for more.)
            let n = stochastic_round(w.rate * self.scale * len, &mut self.rng_arrival)
                .min(MAX_WINDOW_REQUESTS) as usize;
            if n == 0 {
                continue;
            }
            let family = w.family.unwrap_or(ArrivalProcess::Poisson);
            let shape = match self.mode {
                ServeGenArrivalParams::Moments => shape_for_cv(family, w.cv.max(1e-3)),
                ServeGenArrivalParams::Fitted => Some(w.shape).filter(|s| *s > 0.0),
            };
            let sampler = ArrivalSampler::new(family, 1.0, shape)
                .or_else(|| ArrivalSampler::new(ArrivalProcess::Poisson, 1.0, None))
                .expect("a unit-rate Poisson sampler always exists");
            let mut gaps: Vec<f64> = (0..=n)
                .map(|_| sampler.sample(&mut self.rng_arrival))
                .collect();
            let total: f64 = gaps.iter().sum();
            if total.is_nan() || total <= 0.0 || !total.is_finite() {
                gaps.iter_mut().for_each(|g| *g = 1.0);
            }
            let total: f64 = gaps.iter().sum();
            let k = (b - a) / total;
            let mut t = a;
            for g in gaps.iter().take(n) {
                t += g * k;
                let us = ((t - s0) * 1e6).floor() as i64;
                self.queue.push_back((us, wi));
            }
        }
    }
}

impl ClientStream for ServeGenStream {
    fn next_request(&mut self) -> Result<Option<Request>> {
        self.fill();
        let Some((arrival, wi)) = self.queue.pop_front() else {
            return Ok(None);
        };
        if self.horizon.is_some_and(|h| arrival >= h) {
            self.queue.clear();
            self.window = self.client.windows.len();
            return Ok(None);
        }
        let t_s = self.client.windows[wi].start_s;
        let client = self.client.clone();
        let ds = client.dataset_at(t_s).ok_or_else(|| {
            Error::in_file(
                Path::new(&self.labels.request.client_id.to_string()),
                "no dataset window with PMFs",
            )
        })?;
        let mut r = self.labels.request(arrival);
        let pmf = |f: &str| ds.pmf(f);
        if let Some(out) = pmf("output_tokens")? {
            r.output_tokens = LengthSampler::empirical(out, 1).sample(&mut self.rng_output);
        }
        if let Some(text) = pmf("text_tokens")? {
            // Multimodal: text plus per-item tokens for each modality.
            r.text_tokens = LengthSampler::empirical(text, 0).sample(&mut self.rng_input);
            let items = |count: &str, each: &str, rng: &mut ChaCha8Rng| -> Result<u32> {
                let (Some(c), Some(e)) = (pmf(count)?, pmf(each)?) else {
                    return Ok(0);
                };
                let n = LengthSampler::empirical(c, 0).sample(rng);
                let each = LengthSampler::empirical(e, 0);
                Ok((0..n).fold(0u32, |acc, _| acc.saturating_add(each.sample(rng))))
            };
            r.image_tokens = items("image_count", "image_tokens", &mut self.rng_modal)?;
            r.audio_tokens = items("audio_count", "audio_tokens", &mut self.rng_modal)?;
            r.video_tokens = items("video_count", "video_tokens", &mut self.rng_modal)?;
            r.input_tokens =
                (r.text_tokens + r.image_tokens + r.audio_tokens + r.video_tokens).max(1);
        } else if let Some(input) = pmf("input_tokens")? {
            r.input_tokens = LengthSampler::empirical(input, 1).sample(&mut self.rng_input);
        }
        if let Some(ratio) = pmf("reason_ratio")? {
            r.reason_ratio = RatioSampler::empirical(ratio).sample(&mut self.rng_reason);
        }
        Ok(Some(r))
    }
}

/// An inference-perf profile as one client (`inference-perf`): stages of
/// constant (exactly rate × duration requests, exponential gaps rescaled to
/// the stage, as inference-perf's `ConstantLoadTimer`) or Poisson load, and
/// shared-prefix prompts (groups × prompts per group, shuffled once and sent
/// in a repeating cycle). With `enable_multi_turn_chat`, BLIS's meaning:
/// each (group, prompt) pair of each stage is one closed-loop session
/// starting at a Poisson arrival of rate `rate / sessions`, whose rounds
/// (the stage's `rate × duration` requests shared evenly, fixed-length
/// inputs) follow each response after `sessions / rate` seconds.
struct InferencePerfStream {
    labels: Labels,
    queue: VecDeque<i64>,
    prompts: Vec<(u32, u32)>,
    next_prompt: usize,
    system_len: u32,
    question_len: u32,
    output_len: u32,
    /// Multi-turn rounds, planned, in arrival order (instead of `queue`).
    rounds: VecDeque<Request>,
}

impl InferencePerfStream {
    fn new(ip: &InferencePerfSpec, seed: u64, horizon: Option<i64>) -> Self {
        let id = "inference-perf";
        let mut rng = stream_rng(seed, id, "arrival");
        let poisson = ip.load_type() == Some("poisson");
        let sp = ip.shared_prefix().cloned().unwrap_or_default();
        let groups = sp.num_groups.unwrap_or(10).max(1);
        let per = sp.num_prompts_per_group.unwrap_or(10).max(1);
        let labels = Labels {
            request: Request {
                client_id: Arc::from(id),
                prefix_length: sp.system_prompt_len,
                streaming: ip.api.as_ref().and_then(|a| a.streaming).unwrap_or(true),
                ..Request::default()
            },
            timeout_us: None,
        };
        let mut queue = VecDeque::new();
        let mut rounds = Vec::new();
        let mut stage_start = 0.0f64;
        for (si, s) in ip.stages().iter().enumerate() {
            let (rate, dur) = (s.rate.0, s.duration.0 * 1e6);
            if rate > 0.0 && sp.enable_multi_turn_chat {
                let sessions = u64::from(groups) * u64::from(per);
                let total = (rate * s.duration.0) as u64;
                let think_us = (sessions as f64 / rate * 1e6) as i64;
                let start =
                    ArrivalSampler::new(ArrivalProcess::Poisson, rate / sessions as f64, None)
                        .expect("positive rate");
                for k in 0..sessions {
                    let n = total / sessions + u64::from(k < total % sessions);
                    let t0 = stage_start + start.sample(&mut rng);
                    let (g, u) = ((k / u64::from(per)) as u32, (k % u64::from(per)) as u32);
                    let session: Arc<str> = Arc::from(format!("{id}-s{si}-g{g}-u{u}"));
                    for r in 0..n {
                        let mut q = labels.request(t0 as i64 + r as i64 * think_us);
                        if sp.system_prompt_len > 0 {
                            q.prefix_group = Arc::from(format!("ip-group-{g}"));
                        }
                        q.session_id = session.clone();
                        q.round_index = r as u32;
                        if r > 0 {
                            q.think_time_us = Some(think_us);
                        }
                        q.input_tokens = (sp.system_prompt_len + sp.question_len).max(1);
                        q.output_tokens = sp.output_len.max(1);
                        q.content_key = Some(xxh3_64(
                            format!("inference-perf/{g}/{u}/stage{si}/round{r}").as_bytes(),
                        ));
                        rounds.push(q);
                    }
                }
            } else if rate > 0.0 {
                let exp = ArrivalSampler::new(ArrivalProcess::Poisson, rate, None)
                    .expect("positive rate");
                if poisson {
                    let mut t = 0.0;
                    loop {
                        t += exp.sample(&mut rng);
                        if t >= dur {
                            break;
                        }
                        queue.push_back((stage_start + t) as i64);
                    }
                } else {
                    let n = (rate * s.duration.0) as usize;
                    let gaps: Vec<f64> = (0..n).map(|_| exp.sample(&mut rng)).collect();
                    let total: f64 = gaps.iter().sum();
                    let k = if total > 0.0 { dur / total } else { 0.0 };
                    let mut t = 0.0;
                    for g in gaps {
                        t += g * k;
                        queue.push_back((stage_start + t) as i64);
                    }
                }
            }
            stage_start += dur;
        }
        if let Some(h) = horizon {
            queue.retain(|t| *t < h);
            rounds.retain(|r| r.arrival_time_us < h);
        }
        // A stable sort keeps each session's rounds in order at equal times.
        rounds.sort_by_key(|r| r.arrival_time_us);
        let mut prompts: Vec<(u32, u32)> = (0..groups)
            .flat_map(|g| (0..per).map(move |q| (g, q)))
            .collect();
        let mut prng = stream_rng(seed, id, "prompts");
        for i in (1..prompts.len()).rev() {
            let j = prng.random_range(0..=i);
            prompts.swap(i, j);
        }
        Self {
            labels,
            queue,
            prompts,
            next_prompt: 0,
            system_len: sp.system_prompt_len,
            question_len: sp.question_len,
            output_len: sp.output_len,
            rounds: rounds.into(),
        }
    }
}

impl ClientStream for InferencePerfStream {
    fn next_request(&mut self) -> Result<Option<Request>> {
        if let Some(r) = self.rounds.pop_front() {
            return Ok(Some(r));
        }
        let Some(t) = self.queue.pop_front() else {
            return Ok(None);
        };
        let (g, q) = self.prompts[self.next_prompt % self.prompts.len()];
        self.next_prompt += 1;
        let mut r = self.labels.request(t);
        if self.system_len > 0 {
            r.prefix_group = Arc::from(format!("ip-group-{g}"));
        }
        r.input_tokens = (self.system_len + self.question_len).max(1);
        r.output_tokens = self.output_len.max(1);
        r.content_key = Some(xxh3_64(format!("inference-perf/{g}/{q}").as_bytes()));
        Ok(Some(r))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client's request carries its labels, its arrival and its
    /// deadline (arrival + timeout), and is a new request otherwise.
    #[test]
    fn a_clients_request_carries_its_labels_and_deadline() {
        let labels = Labels {
            request: Request {
                client_id: Arc::from("chat"),
                slo_class: Arc::from("critical"),
                prefix_length: 256,
                streaming: true,
                ..Request::default()
            },
            timeout_us: Some(5_000),
        };
        let r = labels.request(1_000);
        assert_eq!((&*r.client_id, &*r.slo_class), ("chat", "critical"));
        assert_eq!((r.prefix_length, r.streaming), (256, true));
        assert_eq!((r.arrival_time_us, r.deadline_us), (1_000, Some(6_000)));
        assert_eq!((r.request_id, r.input_tokens, &*r.session_id), (0, 0, ""));
    }
}
