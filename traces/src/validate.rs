//! The rules of a workload spec that serde cannot check: which sources
//! are given, positive rates and spans, client ids, and every client's
//! arrival process and length distributions. Each returns the field path
//! and the problem; [`crate::spec::WorkloadSpec::parse`] turns them into an error
//! naming the file and line.

use crate::shown::Num;
use crate::spec::{
    ArrivalProcess, ArrivalSpec, ClientSpec, DistKind, DistSpec, Finite, LifecycleSpec,
    MultimodalSpec, NetworkSpec, ReasoningSpec, SLO_CLASSES, WorkloadSpec, upgrade_slo_class,
};

/// A field path and what is wrong with it.
type Check = std::result::Result<(), (String, String)>;

impl WorkloadSpec {
    /// Checks every rule that serde cannot; returns the field path and the
    /// problem.
    pub fn validate(&self) -> std::result::Result<(), (String, String)> {
        let e = |f: &str, m: String| Err((f.to_string(), m));
        if let Some(v) = &self.version
            && !matches!(v.as_str(), "1" | "2")
        {
            return e(
                "version",
                format!("unsupported version {v:?} (expected \"1\" or \"2\")"),
            );
        }
        self.validate_sources()?;
        self.validate_clients()?;
        if let Some(sg) = &self.servegen_data {
            validate_servegen(sg)?;
        }
        if let Some(ip) = &self.inference_perf {
            validate_inference_perf(ip)?;
        }
        Ok(())
    }

    /// Exactly one source of requests (clients, ServeGen data or an
    /// inference-perf config); a positive aggregate rate and horizon.
    fn validate_sources(&self) -> Check {
        let e = |f: &str, m: String| Err((f.to_string(), m));
        let sources = [
            (!self.clients.is_empty(), "clients"),
            (self.servegen_data.is_some(), "servegen_data"),
            (self.inference_perf.is_some(), "inference_perf"),
        ];
        let given: Vec<&str> = sources
            .iter()
            .filter(|(g, _)| *g)
            .map(|(_, n)| *n)
            .collect();
        if given.is_empty() {
            return e(
                "clients",
                "at least one client, servegen_data or inference_perf is required".into(),
            );
        }
        if given.len() > 1 {
            return e(
                given[1],
                format!(
                    "{} are mutually exclusive; give exactly one",
                    given.join(" and ")
                ),
            );
        }
        if let Some(r) = self.aggregate_rate
            && r.0 < 0.0
        {
            return e(
                "aggregate_rate",
                format!("must be a positive rate in requests/s, got {}", Num(r.0)),
            );
        }
        if self.horizon_us == Some(0) {
            return e("horizon_us", "must be positive".into());
        }
        Ok(())
    }

    /// Each client, rate fractions that sum to a positive number, a rate
    /// for them, unique ids.
    fn validate_clients(&self) -> Check {
        let e = |f: &str, m: String| Err((f.to_string(), m));
        if self.clients.is_empty() {
            return Ok(());
        }
        let mut sum = 0.0;
        for (i, c) in self.clients.iter().enumerate() {
            validate_client(c, &format!("clients[{i}]"))?;
            sum += c.rate_fraction.map_or(1.0, |f| f.0);
        }
        if !(sum > 0.0 && sum.is_finite()) {
            return e(
                "clients[0].rate_fraction",
                format!(
                    "rate fractions must sum to a positive, finite number, got {}",
                    Num(sum)
                ),
            );
        }
        match self.aggregate_rate {
            Some(r) if r.0 > 0.0 => {}
            _ => {
                let explicit = self.clients.iter().all(|c| {
                    c.arrival.shape.is_some() && c.arrival.scale.is_some()
                        || c.rate_fraction.is_some_and(|f| f.0 == 0.0)
                });
                if !explicit {
                    return e(
                        "aggregate_rate",
                        match self.aggregate_rate {
                            Some(r) => format!(
                                "must be a positive rate in requests/s (0 only when every client sets its own arrival shape and scale), got {}",
                                Num(r.0)
                            ),
                            None => {
                                "a positive aggregate_rate (requests/s) is required for clients"
                                    .into()
                            }
                        },
                    );
                }
            }
        }
        let mut ids: Vec<&str> = self.clients.iter().map(|c| c.id.as_str()).collect();
        ids.sort_unstable();
        if let Some(w) = ids.windows(2).find(|w| w[0] == w[1]) {
            let idx = self.clients.iter().rposition(|c| c.id == w[0]).unwrap_or(0);
            return e(
                &format!("clients[{idx}].id"),
                format!("duplicate client id {:?}", w[0]),
            );
        }
        Ok(())
    }
}

/// ServeGen data: a span that is positive and ordered, one way to set the rate.
fn validate_servegen(sg: &crate::spec::ServeGenDataSpec) -> Check {
    let e = |f: &str, m: String| Err((f.to_string(), m));
    for (name, v, zero_ok) in [
        ("span_start_s", sg.span_start_s, true),
        ("span_end_s", sg.span_end_s, false),
        ("rate_scale", sg.rate_scale, false),
        ("aggregate_rate", sg.aggregate_rate, false),
    ] {
        if let Some(v) = v
            && (v.0 < 0.0 || (v.0 == 0.0 && !zero_ok))
        {
            return e(
                &format!("servegen_data.{name}"),
                if zero_ok {
                    format!("must be ≥ 0, got {}", Num(v.0))
                } else {
                    format!("must be positive, got {}", Num(v.0))
                },
            );
        }
    }
    if let (Some(s), Some(t)) = (sg.span_start_s, sg.span_end_s)
        && t.0 <= s.0
    {
        return e(
            "servegen_data.span_end_s",
            "must be after span_start_s".into(),
        );
    }
    if sg.rate_scale.is_some() && sg.aggregate_rate.is_some() {
        return e(
            "servegen_data.aggregate_rate",
            "rate_scale and aggregate_rate are mutually exclusive".into(),
        );
    }
    Ok(())
}

/// Keys of `other` that are not in `accepted` and not null (those in
/// `if_null`) are refused, naming `prefix.key`.
fn refuse_other(
    other: &crate::spec::OtherKeys,
    prefix: &str,
    accepted: &[&str],
    if_null: &[&str],
) -> Check {
    for (k, v) in other {
        if accepted.contains(&k.as_str()) || (if_null.contains(&k.as_str()) && v.is_null()) {
            continue;
        }
        let why = if if_null.contains(&k.as_str()) {
            format!("{k} = {v} is not implemented (only null is accepted)")
        } else {
            format!("unknown field {k:?}")
        };
        return Err((format!("{prefix}.{k}"), why));
    }
    Ok(())
}

/// An inference-perf config (either form): stages with rates and
/// durations, a known load type, shared-prefix data; no key that is not
/// implemented.
fn validate_inference_perf(ip: &crate::spec::InferencePerfSpec) -> Check {
    let e = |f: &str, m: String| Err((f.to_string(), m));
    refuse_other(&ip.other, "inference_perf", &[], &[])?;
    if ip.stages.is_some() && ip.load.is_some() {
        return e(
            "inference_perf.stages",
            "give the stages either as `stages` (BLIS's form) or as `load.stages`, not both".into(),
        );
    }
    if ip.shared_prefix.is_some() && ip.data.shared_prefix.is_some() {
        return e(
            "inference_perf.shared_prefix",
            "give it either as `shared_prefix` (BLIS's form) or as `data.shared_prefix`, not both"
                .into(),
        );
    }
    let stages_field = if ip.stages.is_some() {
        "inference_perf.stages"
    } else {
        "inference_perf.load.stages"
    };
    if let Some(l) = &ip.load {
        refuse_other(
            &l.other,
            "inference_perf.load",
            &[
                "interval",
                "num_workers",
                "worker_max_concurrency",
                "worker_max_tcp_connections",
                "circuit_breakers",
                "base_seed",
            ],
            &["request_timeout", "sweep", "trace"],
        )?;
    }
    refuse_other(
        &ip.data.other,
        "inference_perf.data",
        &[],
        &["path", "input_distribution", "output_distribution", "trace"],
    )?;
    if let Some(t) = &ip.data.data_type
        && t != "shared_prefix"
    {
        return e(
            "inference_perf.data.type",
            format!("{t:?} is not modelled (only shared_prefix)"),
        );
    }
    if let Some(a) = &ip.api {
        refuse_other(&a.other, "inference_perf.api", &["type", "headers"], &[])?;
    }
    let stages = ip.stages();
    if stages.is_empty() {
        return e(stages_field, "at least one stage is required".into());
    }
    let mut planned = 0.0;
    let mut span_s = 0.0;
    for (i, s) in stages.iter().enumerate() {
        let f = format!("{stages_field}[{i}]");
        refuse_other(&s.other, &f, &[], &["concurrency_level", "num_requests"])?;
        if s.rate.0 < 0.0 || s.duration.0 <= 0.0 {
            return e(&f, "rate must be ≥ 0 and duration > 0".into());
        }
        planned += s.rate.0 * s.duration.0;
        span_s += s.duration.0;
    }
    let max = crate::generate::MAX_PLANNED_REQUESTS;
    if planned > max as f64 {
        return e(
            stages_field,
            format!(
                "the stages plan about {planned:.3e} requests, more than the {max} a run may plan"
            ),
        );
    }
    if span_s * 1e6 > crate::csvio::MAX_TIME_US as f64 {
        return e(
            stages_field,
            format!("the stages last {span_s:e} s, beyond 2^53 µs (285 years)"),
        );
    }
    if let Some(sp) = ip.shared_prefix() {
        let f = if ip.shared_prefix.is_some() {
            "inference_perf.shared_prefix"
        } else {
            "inference_perf.data.shared_prefix"
        };
        refuse_other(
            &sp.other,
            f,
            &[],
            &["question_distribution", "output_distribution"],
        )?;
        for (name, v) in [
            ("num_groups", sp.num_groups),
            ("num_prompts_per_group", sp.num_prompts_per_group),
        ] {
            if v == Some(0) {
                return e(&format!("{f}.{name}"), "must be at least 1".into());
            }
        }
        let prompts = u64::from(sp.num_groups.unwrap_or(10))
            * u64::from(sp.num_prompts_per_group.unwrap_or(10));
        if prompts > 10_000_000 {
            return e(
                f,
                format!(
                    "num_groups × num_prompts_per_group is {prompts} distinct prompts, more than 10^7"
                ),
            );
        }
        for (name, v) in [
            ("system_prompt_len", sp.system_prompt_len),
            ("question_len", sp.question_len),
            ("output_len", sp.output_len),
        ] {
            if f64::from(v) > MAX_TOKENS {
                return e(
                    &format!("{f}.{name}"),
                    format!("{v} is beyond any model's context: at most 1e9 tokens"),
                );
            }
        }
        if sp.enable_multi_turn_chat {
            for (i, s) in stages.iter().enumerate() {
                if s.rate.0 > 0.0 && (s.rate.0 * s.duration.0) < 1.0 {
                    return e(
                        &format!("{stages_field}[{i}]"),
                        "rate × duration plans no request for the multi-turn sessions".into(),
                    );
                }
            }
        }
    }
    if let Some(t) = ip.load_type()
        && !matches!(t, "constant" | "poisson")
    {
        return e(
            "inference_perf.load.type",
            format!("unsupported load type {t:?} (constant or poisson)"),
        );
    }
    Ok(())
}

fn validate_client(c: &ClientSpec, p: &str) -> Check {
    let e = |f: String, m: String| Err((f, m));
    if let Some(f) = c.rate_fraction
        && f.0 < 0.0
    {
        return e(
            format!("{p}.rate_fraction"),
            format!("must be ≥ 0, got {}", Num(f.0)),
        );
    }
    if !c.slo_class.is_empty()
        && !SLO_CLASSES.contains(&c.slo_class.as_str())
        && upgrade_slo_class(&c.slo_class).is_none()
    {
        return e(
            format!("{p}.slo_class"),
            format!(
                "unknown slo_class {:?}; valid: {} (v1: realtime, interactive), or empty",
                c.slo_class,
                SLO_CLASSES.join(", ")
            ),
        );
    }
    validate_arrival(&c.arrival, p)?;
    validate_dist(
        &c.input_distribution,
        &format!("{p}.input_distribution"),
        false,
    )?;
    validate_dist(
        &c.output_distribution,
        &format!("{p}.output_distribution"),
        false,
    )?;
    if let Some(lc) = &c.lifecycle {
        validate_lifecycle(lc, p)?;
    }
    if let Some(mm) = &c.multimodal {
        validate_multimodal(mm, p)?;
    }
    if let Some(r) = &c.reasoning {
        validate_reasoning(r, p)?;
    }
    if let Some(n) = &c.network {
        validate_network(n, p)?;
    }
    Ok(())
}

/// A client's arrival process: positive CV, shape and scale; a Weibull CV
/// within the range its shape can be solved for.
fn validate_arrival(a: &ArrivalSpec, p: &str) -> Check {
    let e = |f: String, m: String| Err((f, m));
    for (name, v) in [("cv", a.cv), ("shape", a.shape), ("scale", a.scale)] {
        if let Some(v) = v
            && v.0 <= 0.0
        {
            return e(
                format!("{p}.arrival.{name}"),
                format!("must be positive, got {}", Num(v.0)),
            );
        }
    }
    if a.process == ArrivalProcess::Weibull
        && a.shape.is_none()
        && let Some(cv) = a.cv
        && !(0.01..=20.0).contains(&cv.0)
    {
        return e(
            format!("{p}.arrival.cv"),
            format!("weibull cv must be within [0.01, 20], got {}", Num(cv.0)),
        );
    }
    // A Gamma of shape 1/cv² below 1e-4 (cv above 100) sends its requests
    // as one burst or, once the shape underflows, none at all: a spec
    // that asked for that many requests is refused rather than run empty.
    if a.process == ArrivalProcess::Gamma
        && a.shape.is_none()
        && let Some(cv) = a.cv
        && cv.0 > MAX_GAMMA_CV
    {
        return e(
            format!("{p}.arrival.cv"),
            format!("gamma cv must be at most {MAX_GAMMA_CV}, got {}", Num(cv.0)),
        );
    }
    // An explicit shape, likewise: the Gamma's at least 1e-4, the
    // Weibull's at least 0.01 (its mean, scale·Γ(1 + 1/k), overflows below
    // about 0.006; ServeGen's fitted windows go down to 0.18).
    if let Some(k) = a.shape {
        let (name, least) = match a.process {
            ArrivalProcess::Gamma => ("gamma", 1.0 / (MAX_GAMMA_CV * MAX_GAMMA_CV)),
            ArrivalProcess::Weibull => ("weibull", 0.01),
            _ => ("", 0.0),
        };
        if k.0 < least {
            return e(
                format!("{p}.arrival.shape"),
                format!(
                    "{name} shape must be at least {}, got {}",
                    Num(least),
                    Num(k.0)
                ),
            );
        }
    }
    Ok(())
}

/// The largest Gamma arrival CV (shape 1e-4).
const MAX_GAMMA_CV: f64 = 100.0;

/// A client's on/off windows: at least one, each ending after it starts,
/// none overlapping.
fn validate_lifecycle(lc: &LifecycleSpec, p: &str) -> Check {
    let e = |f: String, m: String| Err((f, m));
    if lc.windows.is_empty() {
        return e(
            format!("{p}.lifecycle.windows"),
            "at least one window is required".into(),
        );
    }
    let mut ws = lc.windows.clone();
    ws.sort_by_key(|w| w.start_us);
    for (j, w) in lc.windows.iter().enumerate() {
        if w.end_us <= w.start_us {
            return e(
                format!("{p}.lifecycle.windows[{j}]"),
                format!(
                    "end_us ({}) must be after start_us ({})",
                    w.end_us, w.start_us
                ),
            );
        }
    }
    if ws.windows(2).any(|w| w[1].start_us < w[0].end_us) {
        return e(format!("{p}.lifecycle.windows"), "windows overlap".into());
    }

    Ok(())
}

/// A multimodal client's per-modality distributions.
fn validate_multimodal(mm: &MultimodalSpec, p: &str) -> Check {
    for (name, d) in [
        ("text_distribution", &mm.text_distribution),
        ("image_distribution", &mm.image_distribution),
        ("image_count_distribution", &mm.image_count_distribution),
        ("audio_distribution", &mm.audio_distribution),
        ("audio_count_distribution", &mm.audio_count_distribution),
        ("video_distribution", &mm.video_distribution),
        ("video_count_distribution", &mm.video_count_distribution),
    ] {
        if let Some(d) = d {
            validate_dist(d, &format!("{p}.multimodal.{name}"), false)?;
        }
    }

    Ok(())
}

/// A reasoning client's reasoning share and multi-turn rounds.
fn validate_reasoning(r: &ReasoningSpec, p: &str) -> Check {
    let e = |f: String, m: String| Err((f, m));
    if let Some(d) = &r.reason_ratio_distribution {
        validate_dist(d, &format!("{p}.reasoning.reason_ratio_distribution"), true)?;
    }
    if let Some(mt) = &r.multi_turn
        && mt.max_rounds < 1
    {
        return e(
            format!("{p}.reasoning.multi_turn.max_rounds"),
            "must be ≥ 1".into(),
        );
    }

    Ok(())
}

/// A client's network: a non-negative RTT, a positive bandwidth.
fn validate_network(n: &NetworkSpec, p: &str) -> Check {
    let e = |f: String, m: String| Err((f, m));
    if n.rtt_ms.0 < 0.0 {
        return e(format!("{p}.network.rtt_ms"), "must be ≥ 0".into());
    }
    if let Some(b) = n.bandwidth_mbps
        && b.0 <= 0.0
    {
        return e(
            format!("{p}.network.bandwidth_mbps"),
            "must be positive".into(),
        );
    }

    Ok(())
}

/// Validates a distribution's parameters for its family.
fn validate_dist(d: &DistSpec, p: &str, ratio: bool) -> Check {
    let q = &d.params;
    let req = |name: &str, v: Option<Finite>| -> std::result::Result<f64, (String, String)> {
        v.map(|f| f.0).ok_or_else(|| {
            (
                format!("{p}.params"),
                format!("{:?} distribution requires `{name}`", d.kind).to_lowercase(),
            )
        })
    };
    let pos = |name: &str, v: f64| -> std::result::Result<(), (String, String)> {
        if v > 0.0 {
            Ok(())
        } else {
            Err((
                format!("{p}.params.{name}"),
                format!("must be positive, got {}", Num(v)),
            ))
        }
    };
    let nonneg = |name: &str, v: f64| -> std::result::Result<(), (String, String)> {
        if v >= 0.0 {
            Ok(())
        } else {
            Err((
                format!("{p}.params.{name}"),
                format!("must be ≥ 0, got {}", Num(v)),
            ))
        }
    };
    match d.kind {
        DistKind::Gaussian => {
            nonneg("mean", req("mean", q.mean)?)?;
            nonneg("std_dev", req("std_dev", q.std_dev)?)?;
        }
        DistKind::Exponential => pos("mean", req("mean", q.mean)?)?,
        DistKind::Lognormal => {
            req("mu", q.mu)?;
            nonneg("sigma", req("sigma", q.sigma)?)?;
        }
        DistKind::ParetoLognormal => {
            pos("alpha", req("alpha", q.alpha)?)?;
            pos("xm", req("xm", q.xm)?)?;
            req("mu", q.mu)?;
            nonneg("sigma", req("sigma", q.sigma)?)?;
            let w = req("mix_weight", q.mix_weight)?;
            if !(0.0..=1.0).contains(&w) {
                return Err((
                    format!("{p}.params.mix_weight"),
                    format!("must be within [0, 1], got {}", Num(w)),
                ));
            }
        }
        DistKind::Constant => nonneg("value", req("value", q.value)?)?,
        DistKind::Empirical => match (&d.pmf, &d.file) {
            (None, None) => {
                return Err((
                    p.to_string(),
                    "empirical distribution requires `pmf` or `file`".into(),
                ));
            }
            (Some(_), Some(_)) => {
                return Err((format!("{p}.file"), "give `pmf` or `file`, not both".into()));
            }
            (Some(pmf), None) => validate_pmf(pmf, p, ratio)?,
            (None, Some(_)) => {}
        },
    }
    if !ratio {
        validate_scale(d, p)?;
    }
    validate_bounds(q, p, ratio)
}

/// The most tokens a length distribution may be centred at: far above any
/// model's context (vLLM refuses longer requests anyway), and low enough
/// that no parameter overflows the integer token counts.
pub const MAX_TOKENS: f64 = 1e9;

/// A length distribution's location and scale within [`MAX_TOKENS`]
/// (lognormal: `mu` ≤ ln 10^9, `sigma` ≤ 10), so that absurd parameters
/// are refused instead of drawing every length at the integer limit.
fn validate_scale(d: &DistSpec, p: &str) -> Check {
    let q = &d.params;
    let max_mu = MAX_TOKENS.ln();
    let checks: [(&str, Option<Finite>, f64, &str); 7] = [
        ("mean", q.mean, MAX_TOKENS, "1e9 tokens"),
        ("std_dev", q.std_dev, MAX_TOKENS, "1e9 tokens"),
        ("xm", q.xm, MAX_TOKENS, "1e9 tokens"),
        ("value", q.value, MAX_TOKENS, "1e9 tokens"),
        ("min", q.min, MAX_TOKENS, "1e9 tokens"),
        ("mu", q.mu, max_mu, "ln(1e9) = 20.72"),
        ("sigma", q.sigma, 10.0, "10"),
    ];
    for (name, v, limit, shown) in checks {
        if let Some(v) = v
            && v.0 > limit
        {
            return Err((
                format!("{p}.params.{name}"),
                format!("{:e} is beyond any model's context: at most {shown}", v.0),
            ));
        }
    }
    Ok(())
}

/// An empirical distribution's `pmf`: numeric non-negative values
/// (integers unless `ratio`), non-negative probabilities with a positive
/// sum.
fn validate_pmf(pmf: &std::collections::BTreeMap<String, Finite>, p: &str, ratio: bool) -> Check {
    let mut total = 0.0;
    for (k, v) in pmf {
        let key: f64 = k
            .trim()
            .parse()
            .map_err(|_| (format!("{p}.pmf"), format!("value {k:?} is not a number")))?;
        if !key.is_finite() || key < 0.0 || (!ratio && key.fract() != 0.0) {
            return Err((
                format!("{p}.pmf"),
                format!(
                    "value {k:?} must be a non-negative {}",
                    if ratio { "number" } else { "integer" }
                ),
            ));
        }
        if v.0 < 0.0 {
            return Err((
                format!("{p}.pmf"),
                format!("probability of {k} is negative"),
            ));
        }
        total += v.0;
    }
    if total <= 0.0 {
        return Err((
            format!("{p}.pmf"),
            "probabilities must sum to a positive number".into(),
        ));
    }
    Ok(())
}

/// A distribution's `min` and `max`: `min` ≥ 0, `max` ≥ `min`, and a
/// ratio's `max` ≤ 1.
fn validate_bounds(q: &crate::spec::DistParams, p: &str, ratio: bool) -> Check {
    if let Some(min) = q.min
        && min.0 < 0.0
    {
        return Err((
            format!("{p}.params.min"),
            format!("must be ≥ 0, got {}", Num(min.0)),
        ));
    }
    if let (Some(min), Some(max)) = (q.min, q.max)
        && max.0 < min.0
    {
        return Err((
            format!("{p}.params.max"),
            format!("max ({}) is below min ({})", Num(max.0), Num(min.0)),
        ));
    }
    if ratio
        && let Some(max) = q.max
        && max.0 > 1.0
    {
        return Err((
            format!("{p}.params.max"),
            "a ratio's max must be ≤ 1".into(),
        ));
    }
    Ok(())
}
