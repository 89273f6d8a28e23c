//! Acceptance 3 (its own test binary: it runs for about 10 s and must not
//! compete with other tests): SIGINT halfway through a 20 s run. Sending
//! stops, requests in flight get the grace period, every completed request
//! is in the CSV, the rest are `cancelled`, the bundle reads back cleanly,
//! and the exit code says "interrupted".

#[allow(dead_code, reason = "shared with the it test binary")]
#[path = "it/common.rs"]
mod common;

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use blis_traces::{Status, Trace};
use common::{MODEL, Mock, s};

#[cfg(unix)]
#[test]
fn sigint_halfway_keeps_every_completed_request() {
    let mock = Mock::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("interrupted");
    let n = 400u64;
    let child = Command::new(assert_cmd::cargo::cargo_bin!("blis-loadgen"))
        .args(["run", "--server-url", &mock.url, "--model", MODEL])
        .args(["--rate", "20", "--num-requests", &n.to_string()])
        .args(["--input-tokens", "200", "--output-tokens", "60"])
        .args([
            "--grace-s",
            "0.3",
            "--scrape-interval-ms",
            "500",
            "--out",
            s(&prefix),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(10));
    let killed = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let t0 = Instant::now();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(t0.elapsed() < Duration::from_secs(5), "stopped promptly");
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(stderr.contains("interrupted: no more sends"), "{stderr}");
    assert!(stdout.contains("verdict: interrupted"), "{stdout}");

    let t = Trace::read(&prefix.with_extension("yaml")).expect("the bundle reads back");
    assert!(
        t.header.load_generator.is_some(),
        "the header was completed"
    );
    let mut ids: Vec<u64> = t.records.iter().map(|r| r.request.request_id).collect();
    ids.sort_unstable();
    assert_eq!(
        ids,
        (0..n).collect::<Vec<u64>>(),
        "every planned request, once"
    );

    let served: BTreeMap<String, u32> = mock
        .served()
        .into_iter()
        .map(|s| (s.x_request_id.unwrap(), s.output_tokens))
        .collect();
    let (mut ok, mut cut, mut unsent) = (0, 0, 0);
    let chunks = t.chunks.as_deref().unwrap();
    for r in &t.records {
        let o = &r.outcome;
        let xid = o.x_request_id.as_deref();
        match o.status {
            Some(Status::Ok) => {
                ok += 1;
                assert_eq!(served.get(xid.unwrap()), Some(&r.request.output_tokens));
                let n = chunks
                    .iter()
                    .filter(|c| c.request_id == r.request.request_id)
                    .count();
                assert_eq!(
                    n as u32, r.request.output_tokens,
                    "all chunks of a completed request"
                );
            }
            Some(Status::Cancelled) if o.send_time_us.is_some() => {
                cut += 1;
                assert!(
                    o.error_message
                        .starts_with("cancelled: the run was interrupted")
                );
                assert!(o.num_chunks < r.request.output_tokens);
            }
            Some(Status::Cancelled) => {
                unsent += 1;
                assert!(
                    o.error_message.starts_with("not_sent: "),
                    "{}",
                    o.error_message
                );
                assert!(
                    r.request.arrival_time_us >= 9_000_000,
                    "only the later half is unsent"
                );
            }
            other => panic!("unexpected status {other:?}: {}", o.error_message),
        }
    }
    // Everything the server completed is recorded as completed.
    let ok_xids: Vec<&str> = t
        .records
        .iter()
        .filter(|r| r.outcome.status == Some(Status::Ok))
        .filter_map(|r| r.outcome.x_request_id.as_deref())
        .collect();
    assert_eq!(
        ok_xids.len(),
        served.len(),
        "served {} vs ok {}",
        served.len(),
        ok
    );
    eprintln!("{ok} ok, {cut} cut short, {unsent} never sent");
    assert!(
        ok >= 120 && cut >= 1 && unsent >= 150,
        "{ok} {cut} {unsent}"
    );
}
