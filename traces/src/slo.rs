//! Latency SLOs for goodput and SLO attainment, shared by the tools that
//! report them (`blis-loadgen run --slo`, `blis-calibrate compare --slo`).

use serde::Serialize;

/// SLO bounds. A request attains its SLO when it completed and every given
/// bound holds; failed requests never attain it (DistServe's goodput,
/// Zhong et al., OSDI 2024).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct Slo {
    /// Time to first token bound, ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttft_ms: Option<f64>,
    /// Time per output token bound, ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tpot_ms: Option<f64>,
    /// End-to-end latency bound, ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub e2e_ms: Option<f64>,
}

impl Slo {
    /// Whether a completed request with these latencies (ms) attains the
    /// SLO. An unknown TTFT or TPOT (a non-streamed response) is judged by
    /// the bounds that can be checked.
    pub fn attained(&self, ttft_ms: Option<f64>, tpot_ms: Option<f64>, e2e_ms: f64) -> bool {
        let ok = |bound: Option<f64>, v: Option<f64>| match (bound, v) {
            (Some(b), Some(v)) => v <= b,
            _ => true,
        };
        ok(self.ttft_ms, ttft_ms) && ok(self.tpot_ms, tpot_ms) && ok(self.e2e_ms, Some(e2e_ms))
    }
}

impl std::str::FromStr for Slo {
    type Err = String;

    /// `ttft_ms=500,tpot_ms=50,e2e_ms=10000` (any subset, at least one).
    /// vLLM's `--goodput` spelling reads too: `ttft:500,tpot:50,e2el:10000`
    /// (`KEY:MS`, keys without `_ms`; `e2el` is vLLM's name for E2E).
    fn from_str(s: &str) -> Result<Self, String> {
        let mut slo = Slo::default();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let Some((k, v)) = part.split_once('=').or_else(|| part.split_once(':')) else {
                return Err(format!("--slo: expected KEY=MS, got {part:?}"));
            };
            let k = k.trim();
            let field = match k {
                "ttft_ms" | "ttft" => &mut slo.ttft_ms,
                "tpot_ms" | "tpot" => &mut slo.tpot_ms,
                "e2e_ms" | "e2e" | "e2el" => &mut slo.e2e_ms,
                other => {
                    return Err(format!(
                        "--slo: unknown key {other:?} (ttft_ms, tpot_ms, e2e_ms)"
                    ));
                }
            };
            let v: f64 = v
                .trim()
                .parse()
                .map_err(|_| format!("--slo: {k}: invalid number {v:?}"))?;
            if !(v > 0.0 && v.is_finite()) {
                return Err(format!(
                    "--slo: {k} must be a positive number of ms, got {}",
                    crate::shown::Num(v)
                ));
            }
            if field.replace(v).is_some() {
                return Err(format!(
                    "--slo: {k} given twice (one bound per key: ttft_ms, tpot_ms, e2e_ms)"
                ));
            }
        }
        if slo == Slo::default() {
            return Err("--slo: give at least one of ttft_ms, tpot_ms, e2e_ms".into());
        }
        Ok(slo)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parsing_and_attainment() {
        // vLLM's --goodput spelling is the same SLO.
        let v: Slo = "ttft:100,e2el:1000".parse().unwrap();
        assert_eq!(v, "ttft_ms=100,e2e_ms=1000".parse().unwrap());
        assert_eq!(
            "ttft:100,ttft_ms=200".parse::<Slo>().unwrap_err(),
            "--slo: ttft_ms given twice (one bound per key: ttft_ms, tpot_ms, e2e_ms)"
        );
        assert_eq!(
            "tpot=nan".parse::<Slo>().unwrap_err(),
            "--slo: tpot must be a positive number of ms, got NaN"
        );
        assert!(
            "itl:5"
                .parse::<Slo>()
                .unwrap_err()
                .contains("unknown key \"itl\"")
        );
        let s: Slo = "ttft_ms=100, e2e_ms=1000".parse().unwrap();
        assert!(s.attained(Some(100.0), None, 1000.0));
        assert!(!s.attained(Some(100.5), None, 10.0));
        assert!(
            s.attained(None, None, 999.0),
            "unknown TTFT is not held against it"
        );
        assert!("ttft=3s".parse::<Slo>().is_err());
        assert!("ttft_ms=NaN".parse::<Slo>().is_err());
        assert!("".parse::<Slo>().is_err());
    }
}
