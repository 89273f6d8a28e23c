//! The live progress line (sent, rate, in flight, failed, TTFT, send lag).

use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::shared::Shared;

/// A progress bar kept up to date every 250 ms until aborted: requests
/// done of planned, sent, in flight, failed, the send rate, and TTFT
/// p50/p99 and send-lag p99 so far (the recorder's live histograms).
pub(super) fn spawn_progress(
    sh: &Arc<Shared>,
    bar: &indicatif::ProgressBar,
    live: Arc<crate::record::Live>,
) -> tokio::task::JoinHandle<()> {
    let (sh, bar) = (sh.clone(), bar.clone());
    tokio::spawn(async move {
        let mut t = tokio::time::interval(Duration::from_millis(250));
        loop {
            t.tick().await;
            let p = &sh.progress;
            let elapsed = (sh.clock.now_us() - sh.run_start_us).max(1) as f64 / 1e6;
            let sent = p.sent.load(Ordering::Relaxed);
            bar.set_position(p.done.load(Ordering::Relaxed));
            bar.set_message(progress_message(
                sent,
                p.in_flight.load(Ordering::Relaxed),
                p.not_ok.load(Ordering::Relaxed),
                sent as f64 / elapsed,
                &live,
            ));
        }
    })
}

/// The progress line's message.
pub(super) fn progress_message(
    sent: u64,
    in_flight: u64,
    not_ok: u64,
    rate: f64,
    live: &crate::record::Live,
) -> String {
    use crate::record::Live;
    let ms = |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{x:.1}"));
    format!(
        "sent {sent} ({rate:.1} req/s), in flight {in_flight}, failed {not_ok} | TTFT p50 {} p99 {} ms | send lag p99 {} ms",
        ms(Live::ms(&live.ttft_p50_us)),
        ms(Live::ms(&live.ttft_p99_us)),
        ms(Live::ms(&live.lag_p99_us)),
    )
}

pub(super) fn progress_bar(total: u64) -> indicatif::ProgressBar {
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(total);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{elapsed_precise} [{bar:30}] {pos}/{len} done, {msg}",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}
