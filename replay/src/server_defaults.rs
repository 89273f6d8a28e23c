//! The engine settings a trace's server ran with, where its header does not
//! record them: the defaults of the vLLM release it names.
//!
//! | setting | vLLM's default | since |
//! |---|---|---|
//! | chunked prefill | on | v0.8.0: the V1 engine, whose scheduler always chunks unless `--no-enable-chunked-prefill`, became the default |
//! | prefix caching | on | v0.8.0 (V1 turns automatic prefix caching on) |
//! | async scheduling | on | v0.14.0 (January 2026; vllm-project/vllm#27614 made `--async-scheduling` the default) |
//! | `max_num_seqs` | 1024 on a GPU of at least 70 GiB but an A100, else 256 | v0.8.0: V1 raised it from 256 to 1024 everywhere; v0.8.4 (vllm-project/vllm#16158, April 2025) put it back to 256 but on H100/H200 |
//! | `max_num_batched_tokens` (`vllm serve`, chunked prefill) | 8192 on a GPU of at least 70 GiB but an A100, else 2048 | v0.8.0 (V1; vllm-project/vllm#12369 gave H100/H200 8192, #17885 kept A100 at 2048) |
//!
//! The memory rule is vLLM's `get_batch_defaults` (`device_memory >= 70 GiB
//! and "a100" not in device_name`), applied to the simulated GPU's table
//! entry. A later release raises the token budget of such GPUs to 16384
//! (vllm-project/vllm#51726, merged 2026-08-10); which release first
//! carries it is not known here, so every V1 release is simulated with
//! 8192: give `--max-num-batched-tokens` (or record it in the trace header)
//! for a server that ran with 16384.
//!
//! Before v0.8.0 vLLM ran its V0 engine, which this simulator does not
//! model: such a run is simulated with V1's behaviour, and says so.
//! Each decision is recorded in the run's settings (`provenance`): from a
//! flag, from the trace header, from the named version's defaults, or
//! assumed when the header names no version.

/// A vLLM version, `major.minor.patch` (a `v` prefix and suffixes such as
/// `rc1`, `.dev12+g…` or `+cu128` are ignored).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct VllmVersion(pub u32, pub u32, pub u32);

impl VllmVersion {
    /// Parses `0.15.1`, `v0.11.0rc1`, `0.10.1.dev12+gabc`; `None` for
    /// anything else.
    pub fn parse(s: &str) -> Option<Self> {
        let s = s.trim().trim_start_matches('v');
        let mut parts = s.split('.');
        let num = |p: Option<&str>| -> Option<u32> {
            let p = p?;
            let digits: String = p.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        };
        let major = num(parts.next())?;
        let minor = num(parts.next())?;
        let patch = num(parts.next()).unwrap_or(0);
        Some(Self(major, minor, patch))
    }

    /// Whether this release runs the V1 engine by default (v0.8.0 on).
    pub fn v1_engine(self) -> bool {
        self >= Self(0, 8, 0)
    }

    /// `vllm serve`'s defaults in this release for `max_num_seqs` and, with
    /// chunked prefill, `max_num_batched_tokens`, on a GPU named `gpu` with
    /// `memory_gib` of memory (module docs); with the reason, for the
    /// run's settings. V0 releases (before v0.8.0) get 256 and 2048.
    pub fn batch_defaults(self, gpu: &str, memory_gib: f64) -> (u32, u32, String) {
        if !self.v1_engine() {
            return (256, 2048, "V0's defaults".into());
        }
        let large = memory_gib >= 70.0 && !gpu.to_ascii_lowercase().contains("a100");
        if large {
            (
                1024,
                8192,
                format!("on a GPU of at least 70 GiB but an A100 ({gpu}, {memory_gib} GiB)"),
            )
        } else if self < Self(0, 8, 4) {
            (1024, 2048, format!("V1 before v0.8.4, on {gpu}"))
        } else {
            (256, 2048, format!("on {gpu}, under 70 GiB or an A100"))
        }
    }

    /// vLLM's default for `--async-scheduling` in this release.
    pub fn async_scheduling_default(self) -> bool {
        self >= Self(0, 14, 0)
    }
}

impl std::fmt::Display for VllmVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.0, self.1, self.2)
    }
}

/// The vLLM version a trace header's server section names, if it is a vLLM
/// server (type `vllm` or unrecorded) with a version that parses.
pub fn vllm_version(hs: Option<&blis_traces::ServerConfig>) -> Option<VllmVersion> {
    let hs = hs?;
    let vllm = hs
        .server_type
        .as_deref()
        .is_none_or(|t| t.eq_ignore_ascii_case("vllm"));
    if !vllm {
        return None;
    }
    VllmVersion::parse(hs.version.as_deref()?)
}

/// A boolean setting from the flag, else the trace header, else the
/// version's default, else `assumed`; the choice is pushed to `prov` with
/// its source.
pub fn resolve_bool(
    prov: &mut Vec<String>,
    name: &str,
    flag: Option<bool>,
    header: Option<bool>,
    version: Option<(VllmVersion, bool, &str)>,
    assumed: (bool, &str),
) -> bool {
    let (v, from) = match (flag, header, version) {
        (Some(v), _, _) => (v, "flag".to_string()),
        (None, Some(v), _) => (v, "trace header".to_string()),
        (None, None, Some((ver, v, why))) => (v, format!("vLLM {ver}'s default: {why}")),
        (None, None, None) => (assumed.0, format!("assumed: {}", assumed.1)),
    };
    prov.push(format!("{name}={v} ({from})"));
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_as_vllm_writes_them() {
        assert_eq!(VllmVersion::parse("0.15.1"), Some(VllmVersion(0, 15, 1)));
        assert_eq!(
            VllmVersion::parse("v0.11.0rc1"),
            Some(VllmVersion(0, 11, 0))
        );
        assert_eq!(
            VllmVersion::parse("0.10.1.dev12+gabc.cu128"),
            Some(VllmVersion(0, 10, 1))
        );
        assert_eq!(VllmVersion::parse("1.2"), Some(VllmVersion(1, 2, 0)));
        assert_eq!(VllmVersion::parse("blis-mockserver"), None);
        assert_eq!(VllmVersion::parse(""), None);
        assert!(!VllmVersion(0, 13, 9).async_scheduling_default());
        assert!(VllmVersion(0, 14, 0).async_scheduling_default());
        assert!(VllmVersion(1, 0, 0).async_scheduling_default());
        assert!(!VllmVersion(0, 7, 3).v1_engine());
        assert!(VllmVersion(0, 8, 0).v1_engine());
    }

    /// `vllm serve`'s batch defaults: V1 on an H100 (80 GiB) takes 1024
    /// requests and 8192 tokens a step; an A100 of the same memory keeps
    /// 2048 tokens and, from v0.8.4, 256 requests; V0 256 and 2048.
    #[test]
    fn batch_defaults_follow_the_release_and_the_gpu() {
        let v = |a, b, c| VllmVersion(a, b, c);
        assert_eq!(v(0, 11, 0).batch_defaults("H100", 80.0).0, 1024);
        assert_eq!(v(0, 11, 0).batch_defaults("H100", 80.0).1, 8192);
        assert_eq!(v(0, 8, 0).batch_defaults("H200", 141.0).1, 8192);
        let a100 = v(0, 11, 0).batch_defaults("A100-SXM", 80.0);
        assert_eq!((a100.0, a100.1), (256, 2048));
        let early = v(0, 8, 3).batch_defaults("A100-80", 80.0);
        assert_eq!((early.0, early.1), (1024, 2048));
        let l40s = v(0, 15, 1).batch_defaults("L40S", 48.0);
        assert_eq!((l40s.0, l40s.1), (256, 2048));
        let v0 = v(0, 7, 3).batch_defaults("H100", 80.0);
        assert_eq!((v0.0, v0.1), (256, 2048));
    }

    #[test]
    fn only_a_vllm_servers_version_counts() {
        let mut hs = blis_traces::ServerConfig {
            server_type: Some("sglang".into()),
            version: Some("0.5.2".into()),
            ..Default::default()
        };
        assert_eq!(vllm_version(Some(&hs)), None);
        hs.server_type = Some("vllm".into());
        assert_eq!(vllm_version(Some(&hs)), Some(VllmVersion(0, 5, 2)));
        hs.server_type = None;
        assert_eq!(vllm_version(Some(&hs)), Some(VllmVersion(0, 5, 2)));
    }
}
