use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use blis_mockserver::RunningServer;
use blis_mockserver::server::Served;
use clap::Parser;

pub const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";

/// Tests that measure time run one at a time, so that no other test's
/// load skews what they measure.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `blis-mockserver` on port 0 in a runtime of its own, recording what it
/// served.
pub struct Mock {
    rt: tokio::runtime::Runtime,
    server: Option<RunningServer>,
    pub url: String,
}

impl Mock {
    pub fn start(extra: &[&str]) -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let mut args = vec!["blis-mockserver", "--record-served"];
        if !extra.contains(&"--port") {
            args.extend(["--port", "0"]);
        }
        args.extend_from_slice(extra);
        let opts = blis_mockserver::Opts::parse_from(args);
        let server = rt
            .block_on(blis_mockserver::start(&opts.config()))
            .expect("mock starts");
        let url = format!("http://{}", server.addr);
        Self {
            rt,
            server: Some(server),
            url,
        }
    }

    pub fn served(&self) -> Vec<Served> {
        self.server
            .as_ref()
            .and_then(|s| s.served.as_ref())
            .map(|l| l.entries())
            .unwrap_or_default()
    }

    pub fn faults(&self, kind: &str) -> u64 {
        self.server.as_ref().map_or(0, |s| s.metrics.faults(kind))
    }
}

#[allow(dead_code, reason = "used by the signal test binary only")]
impl Mock {
    /// The server dies at once, as a killed process does: its runtime is
    /// dropped with every task (connections and streams cut, the port
    /// closed) instead of shutting down gracefully.
    pub fn kill(mut self) {
        drop(self.server.take());
        let rt = std::mem::replace(
            &mut self.rt,
            tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap(),
        );
        rt.shutdown_background();
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.url.rsplit(':').next().unwrap().parse().unwrap()
    }
}

impl Drop for Mock {
    fn drop(&mut self) {
        if let Some(s) = self.server.take() {
            self.rt.block_on(s.shutdown());
        }
    }
}

/// Runs `blis-loadgen ARGS` in this process; returns its exit code and
/// stdout.
pub fn loadgen(args: &[&str]) -> anyhow::Result<(i32, String)> {
    let mut argv = vec!["blis-loadgen"];
    argv.extend_from_slice(args);
    let opts = blis_loadgen::Opts::try_parse_from(argv)?;
    let mut out = Vec::new();
    let code = blis_loadgen::run(opts, &mut out)?;
    Ok((code, String::from_utf8(out)?))
}

pub fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}
