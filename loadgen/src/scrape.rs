//! Scraping the server's Prometheus `/metrics` during a run, in its own
//! task, at a fixed interval; every kept sample is stamped with the time
//! the scrape completed (Unix µs) and goes to the metrics companion.
//!
//! Kept: the serving engine's own metrics, i.e. names in a `ns:` namespace
//! (`vllm:`, `sglang:`, `llamacpp:`) and the mock's `blis_` ones; process,
//! Python and HTTP-framework metrics are dropped.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use blis_traces::MetricSample;
use blis_traces::prom;
use reqwest::header::AUTHORIZATION;
use tokio::sync::watch;

use crate::clock::RunClock;
use crate::http::{bearer, describe};

/// Whether a metric belongs to the serving engine.
pub fn keep(name: &str) -> bool {
    name.contains(':') || name.starts_with("blis_")
}

/// Scrape counters, for the end-of-run summary.
#[derive(Debug, Default)]
pub struct ScrapeStats {
    /// Scrapes attempted.
    pub attempts: AtomicU64,
    /// Scrapes that failed (transport, HTTP status or parse error).
    pub failures: AtomicU64,
    /// Samples kept.
    pub samples: AtomicU64,
    /// Lines of the pages that could not be read as samples, skipped (the
    /// rest of each page kept).
    pub skipped_lines: AtomicU64,
    /// The first failure's description and the first skipped line: set
    /// once, by the scrape that met it first.
    first_error: std::sync::OnceLock<String>,
    first_skipped: std::sync::OnceLock<String>,
}

impl ScrapeStats {
    /// The first failure's description.
    pub fn first_error(&self) -> Option<String> {
        self.first_error.get().cloned()
    }

    /// The first skipped line (`line N: what`).
    pub fn first_skipped(&self) -> Option<String> {
        self.first_skipped.get().cloned()
    }

    /// The summary's `metrics` section, with `samples` written to the
    /// metrics companion.
    pub fn summary(&self, samples: u64) -> crate::report::MetricsScrape {
        crate::report::MetricsScrape {
            scrapes: self.attempts.load(Ordering::Relaxed),
            failed: self.failures.load(Ordering::Relaxed),
            samples,
            skipped_lines: self.skipped_lines.load(Ordering::Relaxed),
            first_failure: self.first_error(),
            first_skipped_line: self.first_skipped(),
        }
    }

    fn fail(&self, msg: String) {
        self.failures.fetch_add(1, Ordering::Relaxed);
        let _ = self.first_error.set(msg);
    }

    fn skipped(&self, page: &prom::Exposition) {
        self.skipped_lines
            .fetch_add(page.skipped as u64, Ordering::Relaxed);
        if let Some(first) = &page.first_skipped {
            let _ = self.first_skipped.get_or_init(|| first.clone());
        }
    }
}

/// Fetches and parses one scrape. A line that cannot be read is skipped
/// and counted, the rest of the page kept; a page of which no line reads
/// as a sample, though some were tried, is a failed scrape.
///
/// # Errors
/// A one-line description of what failed.
pub async fn scrape_once(
    client: &reqwest::Client,
    url: &str,
    api_key: Option<&str>,
    timeout: Duration,
) -> Result<prom::Exposition, String> {
    let mut r = client.get(url).timeout(timeout);
    if let Some(v) = api_key.and_then(bearer) {
        r = r.header(AUTHORIZATION, v);
    }
    let resp = r.send().await.map_err(|e| describe(&e))?;
    if !resp.status().is_success() {
        return Err(format!("HTTP {}", resp.status()));
    }
    let mut resp = resp;
    let mut body = Vec::new();
    while let Some(piece) = resp.chunk().await.map_err(|e| describe(&e))? {
        if body.len() + piece.len() > MAX_METRICS_BYTES {
            return Err(format!(
                "a metrics page over {} MiB",
                MAX_METRICS_BYTES >> 20
            ));
        }
        body.extend_from_slice(&piece);
    }
    let page = prom::parse_lenient(&String::from_utf8_lossy(&body));
    match &page.first_skipped {
        Some(first) if page.samples.is_empty() => Err(format!(
            "not a Prometheus metrics page: no line reads as a sample ({first})"
        )),
        _ => Ok(page),
    }
}

/// The largest `/metrics` page read, bytes (16 MiB): vLLM's is tens to
/// hundreds of KB; a larger one is a broken endpoint, not read into
/// memory every scrape.
pub const MAX_METRICS_BYTES: usize = 16 << 20;

/// What the scraper task needs.
#[derive(Debug)]
pub struct ScrapeConfig {
    /// HTTP client.
    pub client: reqwest::Client,
    /// The `/metrics` URL.
    pub url: String,
    /// API key, sent as a bearer token.
    pub api_key: Option<String>,
    /// Time between scrape starts.
    pub interval: Duration,
    /// The run's clock.
    pub clock: RunClock,
    /// Where samples go.
    pub out: std::sync::mpsc::Sender<crate::record::Msg>,
    /// Counters.
    pub stats: Arc<ScrapeStats>,
    /// Turns true when the run ends.
    pub stop: watch::Receiver<bool>,
}

/// Scrapes every `interval` until `stop` turns true, sending each
/// scrape's kept samples and `up 1` to `out`. A failed scrape is counted
/// and recorded as `up 0`.
pub async fn run(cfg: ScrapeConfig) {
    let ScrapeConfig {
        client,
        url,
        api_key,
        interval,
        clock,
        out,
        stats,
        mut stop,
    } = cfg;
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        stats.attempts.fetch_add(1, Ordering::Relaxed);
        match scrape_once(
            &client,
            &url,
            api_key.as_deref(),
            interval.max(Duration::from_secs(2)),
        )
        .await
        {
            Ok(page) => {
                stats.skipped(&page);
                let t = clock.now_us();
                let mut kept: Vec<MetricSample> = page
                    .samples
                    .into_iter()
                    .filter(|s| keep(&s.name))
                    .map(|s| MetricSample {
                        timestamp_us: t,
                        labels: s.labels_text(),
                        name: s.name,
                        value: s.value,
                    })
                    .collect();
                kept.push(up(t, 1.0));
                stats
                    .samples
                    .fetch_add(kept.len() as u64, Ordering::Relaxed);
                if out.send(crate::record::Msg::Metrics(kept)).is_err() {
                    return;
                }
            }
            Err(e) => {
                stats.fail(e);
                // The gap is recorded (Prometheus's `up` 0), the run goes on.
                let down = vec![up(clock.now_us(), 0.0)];
                if out.send(crate::record::Msg::Metrics(down)).is_err() {
                    return;
                }
            }
        }
    }
}

/// Prometheus's synthetic `up` of one scrape at `t`: 1 when it succeeded,
/// 0 when the server did not answer it (down, restarting, not serving
/// `/metrics`), so that the metrics companion shows the gap.
fn up(t: i64, value: f64) -> MetricSample {
    MetricSample {
        timestamp_us: t,
        name: "up".into(),
        labels: String::new(),
        value,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_metrics_are_kept_and_process_metrics_dropped() {
        assert!(keep("vllm:num_requests_running"));
        assert!(keep("sglang:num_queue_reqs"));
        assert!(keep("llamacpp:requests_processing"));
        assert!(keep("blis_mock_faults_total"));
        assert!(!keep("python_gc_objects_collected_total"));
        assert!(!keep("process_cpu_seconds_total"));
    }
}
