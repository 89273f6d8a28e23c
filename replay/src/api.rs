//! The library's entry points, what `blis-replay`'s commands,
//! `blis-calibrate` and `blis-mockserver` call: load a workload
//! ([`load_workload`]), configure a server ([`crate::setup::resolve`]),
//! replay on one instance or a cluster ([`replay_on`]) or a whole trace in
//! memory ([`replay_records_in_memory`]), and name the result
//! ([`replay_header`]). Nothing here knows the command line.

use std::path::PathBuf;

use blis_traces::{
    ExtraColumn, GenerateOptions, Generator, ImportSource, Mode, Trace, TraceHeader, TraceRecord,
    WorkloadSpec,
};

use crate::cluster::{ClusterSummary, Control, DecisionRecord, PolicyBundle};
use crate::engine::instance::{Instance, Snapshot};
use crate::error::{ReplayError, Result};
use crate::output::Collector;
use crate::setup::Resolved;
use crate::sim::{Input, SimOptions, merged, replay_cluster, replay_once};

/// Where the requests of a replay come from.
pub struct Workload {
    /// Header of the input trace (a fresh one for specs).
    pub header: TraceHeader,
    /// Requests in entry order.
    pub inputs: Box<dyn Iterator<Item = Input>>,
    /// Extra columns of the input records.
    pub extras: Vec<ExtraColumn>,
    /// Number of requests when known.
    pub len: Option<u64>,
    /// Whether every request id differs (a generated workload; a trace
    /// checked when read): see [`replay_on`].
    pub ids_unique: bool,
    /// Set when a lazily generated workload ended early on an error; check
    /// it once the inputs are consumed ([`InputFailure::check`]).
    pub failure: InputFailure,
}

/// Where a workload generated as the replay reads it records the error
/// that ended it early (a data file unreadable mid-way, arrivals beyond
/// the 285 years a trace can hold): the replay then saw fewer requests
/// than the workload has, which its owner must report, not pass off as a
/// shorter run. Clones share the slot.
#[derive(Debug, Clone, Default)]
pub struct InputFailure(std::sync::Arc<std::sync::Mutex<Option<blis_traces::Error>>>);

impl InputFailure {
    fn set(&self, e: blis_traces::Error) {
        let mut slot = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        slot.get_or_insert(e);
    }

    /// The error that ended the workload early, if one did.
    ///
    /// # Errors
    /// [`ReplayError::Input`]: generating the workload failed after the
    /// requests already replayed.
    pub fn check(&self) -> Result<()> {
        let taken = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        match taken {
            None => Ok(()),
            Some(e) => Err(ReplayError::Input {
                what: "generating the workload as the replay read it".into(),
                error: Box::new(e),
            }),
        }
    }
}

impl std::fmt::Debug for Workload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workload").field("len", &self.len).finish()
    }
}

/// The inputs of a whole trace, in entry order (send time relative to the
/// run start when recorded, else intended arrival; ties by request id),
/// each cancelled at its planned deadline or after the client's timeout
/// recorded in the header.
pub fn trace_inputs(header: &TraceHeader, records: Vec<TraceRecord>) -> Vec<Input> {
    trace_input_stream(header, records).collect()
}

/// [`trace_inputs`], each made as the replay reads it: the records are
/// sorted in place (a trace already in entry order, as a recorded one
/// usually is, moves nothing) and none is copied into a second vector.
pub fn trace_input_stream(
    header: &TraceHeader,
    mut records: Vec<TraceRecord>,
) -> impl ExactSizeIterator<Item = Input> + use<> {
    let run_start = header.run_start_unix_us.unwrap_or(0);
    let timeout = client_timeout_us(header);
    records.sort_by_key(|r| (Input::entry_of(r, run_start), r.request.request_id));
    records
        .into_iter()
        .map(move |r| Input::from_record(r, run_start).with_client_timeout(timeout))
}

/// The client's timeout per request recorded in `header`, µs.
pub fn client_timeout_us(header: &TraceHeader) -> Option<i64> {
    header
        .load_generator
        .as_ref()
        .and_then(|l| l.timeout_s)
        .filter(|t| *t > 0.0 && t.is_finite())
        .map(|t| (t * 1e6).round() as i64)
}

/// What to replay: a trace, a public trace to import, or a workload spec to
/// generate (`--trace`, `--import`, `--workload-spec`).
#[derive(Debug, Clone)]
pub enum WorkloadSource {
    /// A trace v2 header (`H.yaml`, its CSV beside it).
    Trace(PathBuf),
    /// A public trace (`KIND:PATH`).
    Import(ImportSource),
    /// A workload spec YAML, generated on the fly.
    Spec(PathBuf),
}

/// How a workload is cut and seeded.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct WorkloadOptions {
    /// Seed of the generator or importer (default: the spec's, 42 for
    /// imports).
    pub seed: Option<u64>,
    /// Horizon of a generated workload, s.
    pub horizon_s: Option<f64>,
    /// At most this many requests (the lowest request ids of a trace).
    pub num_requests: Option<u64>,
    /// The client's timeout per request, s (overrides the trace header's).
    pub client_timeout_s: Option<f64>,
    /// A spec's total rate, requests/s
    /// ([`blis_traces::GenerateOptions::aggregate_rate`]).
    pub aggregate_rate: Option<f64>,
}

/// Loads the workload of `source`.
///
/// # Errors
/// [`ReplayError::Input`] when the trace, import or spec cannot be read or
/// is invalid; [`ReplayError::Settings`] for a client timeout that is not a
/// positive number of seconds.
pub fn load_workload(source: &WorkloadSource, o: &WorkloadOptions) -> Result<Workload> {
    check_timeout(o)?;
    horizon_us(o)?;
    let input = |what: String| {
        move |error| ReplayError::Input {
            what,
            error: Box::new(error),
        }
    };
    match source {
        WorkloadSource::Trace(p) => {
            let trace =
                Trace::read(p).map_err(input(format!("reading the trace {}", p.display())))?;
            Ok(trace_workload(trace, o))
        }
        WorkloadSource::Import(src) => {
            let trace = blis_traces::import(src, o.seed.unwrap_or(42))
                .map_err(input(format!("importing {src}")))?;
            Ok(trace_workload(trace, o))
        }
        WorkloadSource::Spec(p) => {
            let spec = WorkloadSpec::from_file(p)?;
            spec_workload(&spec, &p.display().to_string(), o)
        }
    }
}

/// A client timeout that is not a positive number of seconds.
fn check_timeout(o: &WorkloadOptions) -> Result<()> {
    match o.client_timeout_s {
        Some(t) if !(t > 0.0 && t.is_finite()) => {
            Err(crate::setup::SettingsError::ClientTimeout(t).into())
        }
        _ => Ok(()),
    }
}

/// `o.horizon_s` in whole µs (at least 1), checked: NaN, a negative or
/// zero horizon, or one that rounds to 0 µs is an error naming the flag
/// (an infinite one is left to the generator's 2^53 µs bound).
fn horizon_us(o: &WorkloadOptions) -> Result<Option<u64>> {
    match o.horizon_s {
        None => Ok(None),
        Some(s) if s > 0.0 && (s * 1e6).round() >= 1.0 => Ok(Some((s * 1e6).round() as u64)),
        Some(s) => Err(crate::setup::SettingsError::Horizon(s).into()),
    }
}

/// Whether the request ids `ids` are all different.
pub fn all_different(ids: impl Iterator<Item = u64>) -> bool {
    let mut ids: Vec<u64> = ids.collect();
    ids.sort_unstable();
    ids.windows(2).all(|w| w[0] != w[1])
}

/// The workload of a whole trace (read or imported), cut and timed out as
/// `o` says: its requests in entry order ([`trace_inputs`]).
pub fn trace_workload(mut trace: Trace, o: &WorkloadOptions) -> Workload {
    if let Some(t) = o.client_timeout_s {
        trace
            .header
            .load_generator
            .get_or_insert_with(Default::default)
            .timeout_s = Some(t);
    }
    let mut records = trace.records;
    // As a spec's horizon: the requests that arrive before it (an invalid
    // horizon, which load_workload refuses, cuts nothing).
    if let Ok(Some(h)) = horizon_us(o) {
        let h = i64::try_from(h).unwrap_or(i64::MAX);
        records.retain(|r| r.request.arrival_time_us < h);
    }
    if let Some(n) = o.num_requests {
        records.sort_by_key(|r| r.request.request_id);
        records.truncate(n as usize);
    }
    let extras = ExtraColumn::needed_for(&records);
    let ids_unique = all_different(records.iter().map(|r| r.request.request_id));
    let inputs = trace_input_stream(&trace.header, records);
    let len = inputs.len() as u64;
    Workload {
        header: trace.header,
        inputs: Box::new(inputs),
        extras,
        len: Some(len),
        ids_unique,
        failure: InputFailure::default(),
    }
}

/// The workload `spec` generates (named `label` in the header's
/// `workload_spec`), cut and seeded as `o` says; generated lazily as the
/// replay reads it.
///
/// # Errors
/// [`ReplayError::Settings`] for a bad client timeout; the generator's
/// errors (an unreadable data file, a bad distribution).
pub fn spec_workload(spec: &WorkloadSpec, label: &str, o: &WorkloadOptions) -> Result<Workload> {
    check_timeout(o)?;
    let opts = GenerateOptions {
        seed: o.seed,
        horizon_us: horizon_us(o)?,
        num_requests: o.num_requests,
        aggregate_rate: o.aggregate_rate,
    };
    let timeout_flag = o.client_timeout_s.map(|t| (t * 1e6).round() as i64);
    let mut header = TraceHeader::new(Mode::Generated);
    header.workload_seed = Some(opts.seed.unwrap_or_else(|| spec.seed_or_default()));
    header.workload_spec = Some(label.to_string());
    let generator = Generator::new(spec, &opts)?;
    // A generator error mid-way (an unreadable data file, arrivals past
    // 285 years) ends the stream and is kept for the owner to report.
    let failure = InputFailure::default();
    let keep = failure.clone();
    let inputs = generator
        .map_while(move |r| r.map_err(|e| keep.set(e)).ok())
        .map(move |r| {
            Input::from_record(TraceRecord::planned(r), 0).with_client_timeout(timeout_flag)
        });
    Ok(Workload {
        header,
        inputs: Box::new(inputs),
        extras: vec![ExtraColumn::ThinkTimeUs],
        len: opts.num_requests,
        // (The generator numbers its requests.)
        ids_unique: true,
        failure,
    })
}

/// The header of a replayed trace: the input's identity, the resolved server.
pub fn replay_header(input: &TraceHeader, resolved: &Resolved) -> TraceHeader {
    let mut h = TraceHeader::new(Mode::Replayed);
    h.warm_up_requests = input.warm_up_requests;
    h.workload_seed = input.workload_seed;
    h.workload_spec = input.workload_spec.clone();
    h.run_start_unix_us = input.run_start_unix_us;
    h.network = input.network.clone();
    let (server, hardware) = resolved.header_sections();
    h.server = Some(server);
    h.hardware = Some(hardware);
    h
}

/// The instances of a cluster run: `bundle.num_instances` copies of the
/// resolved engine (the bundle's scheduler, if it names one).
fn instances(resolved: &Resolved, bundle: &PolicyBundle) -> Vec<Instance> {
    let mut engine = resolved.engine.clone();
    if let Some(s) = bundle.scheduler {
        engine.scheduler = s;
    }
    if let Some(s) = &bundle.scheduling {
        // The tree's or program's key is the request's priority.
        engine.scheduler = s.engine_scheduler();
    }
    (0..bundle.instance_count())
        .map(|_| Instance::new(engine.clone(), resolved.latency.clone()))
        .collect()
}

/// Replays `inputs` on the cluster of `bundle` into `sink`; the
/// cluster-wide final snapshot and the cluster section (for a cluster).
///
/// With `trace_k`, every routing decision is recorded with the best
/// `trace_k` candidates (`--trace-level decisions`). `ids_unique`: the
/// inputs' request ids are all different ([`Workload::ids_unique`]), which
/// lets the instances, used once, forget private content
/// ([`Control::set_ids_unique`]; the same outputs, faster).
pub fn replay_on<S: crate::sim::Sink>(
    resolved: &Resolved,
    bundle: &PolicyBundle,
    inputs: impl IntoIterator<Item = Input>,
    ids_unique: bool,
    opts: &SimOptions,
    sink: &mut S,
    trace_k: Option<usize>,
) -> ClusterRun {
    let mut insts = instances(resolved, bundle);
    let mut control = Control::new(bundle, insts.len());
    control.set_ids_unique(ids_unique);
    if let Some(b) = resolved.kv_bytes_per_token {
        control.set_kv_block_bytes(b * f64::from(resolved.engine.block_size));
    }
    if let Some(k) = trace_k {
        control.trace_decisions(k);
    }
    if let Some(a) = control.autoscale.as_deref_mut() {
        a.gpus_per_replica = resolved.tp.max(1);
    }
    replay_cluster(&mut insts, &mut control, inputs, opts, sink);
    let snaps: Vec<Snapshot> = insts.iter().map(Instance::snapshot).collect();
    let last = merged(&snaps);
    let cluster = (!bundle.is_single()).then(|| ClusterSummary::of(bundle, &control, &insts));
    ClusterRun {
        last,
        cluster,
        failure: control.policy_failure().cloned(),
        decisions: control.take_decisions(),
    }
}

/// The end of a cluster replay ([`replay_on`]).
#[derive(Debug)]
pub struct ClusterRun {
    /// The cluster-wide final snapshot (instances merged).
    pub last: Snapshot,
    /// The cluster section of the summary (more than one instance, or any
    /// gateway policy).
    pub cluster: Option<ClusterSummary>,
    /// The routing decisions, when traced.
    pub decisions: Option<Vec<DecisionRecord>>,
    /// A code policy's failed call: the run is not a valid evaluation of
    /// that policy ([`crate::cluster::code`]).
    pub failure: Option<crate::cluster::code::CallError>,
}

/// Replays a whole trace in memory with `resolved` settings and returns the
/// predicted records, in completion order (for `blis-calibrate`'s fits and
/// accuracy benchmarks): the records a full collector keeps, without the
/// per-token work of a summary's ITL figures ([`Collector::records_only`]).
pub fn replay_records_in_memory(
    header: &TraceHeader,
    records: Vec<TraceRecord>,
    resolved: &Resolved,
) -> Vec<TraceRecord> {
    let ids_unique = all_different(records.iter().map(|r| r.request.request_id));
    let inputs = trace_input_stream(header, records);
    let mut inst = Instance::new(resolved.engine.clone(), resolved.latency.clone());
    let mut sink = Collector::records_only(header.run_start_unix_us.unwrap_or(0));
    let opts = SimOptions {
        sample_interval_us: None,
        horizon_us: None,
    };
    let last = replay_once(&mut inst, inputs, ids_unique, &opts, &mut sink);
    let (_, kept) = sink
        .finish(header, &last, resolved.latency_name())
        .expect("an in-memory collector writes no files");
    kept.unwrap_or_default()
}
