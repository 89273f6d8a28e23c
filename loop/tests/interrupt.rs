//! Ctrl-C during the main job: `blis-loop` stops observing, keeps the
//! requests it completed, says so in one line and exits 4 (as an
//! interrupted `blis-loadgen run`), without replaying anything.

#![cfg(unix)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn ctrl_c_while_observing_keeps_the_trace_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("loop");
    // An earlier loop's prediction and report, and a file of the user's.
    std::fs::create_dir_all(&out).unwrap();
    for f in ["report.html", "sim.yaml", "notes.txt"] {
        std::fs::write(out.join(f), "earlier").unwrap();
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_blis-loop"))
        .args(["--out", out.to_str().unwrap(), "--duration-s", "60"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    // Wait until it observes, then let a few seconds of requests complete.
    let start = Instant::now();
    let mut lines = Vec::new();
    while !lines
        .iter()
        .any(|l: &String| l.contains("blis-loadgen run"))
    {
        let l = rx
            .recv_timeout(Duration::from_secs(60).saturating_sub(start.elapsed()))
            .expect("blis-loop starts observing within a minute");
        lines.push(l);
    }
    std::thread::sleep(Duration::from_secs(3));
    let pid = child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-INT", &pid])
            .status()
            .unwrap()
            .success()
    );
    // Its grace period for requests in flight is 5 s.
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "blis-loop stops after SIGINT");
        std::thread::sleep(Duration::from_millis(50));
    };
    lines.extend(rx.try_iter());
    while let Ok(l) = rx.recv_timeout(Duration::from_millis(500)) {
        lines.push(l);
    }
    let text = lines.join("\n");
    assert_eq!(status.code(), Some(4), "{text}");
    let last = lines.last().unwrap();
    assert!(
        last.starts_with("error: interrupted while observing the server"),
        "{text}"
    );
    assert!(last.contains("nothing was replayed"), "{text}");
    let t = blis_traces::Trace::read(&out.join("real.yaml")).unwrap();
    assert!(
        t.records
            .iter()
            .any(|r| r.outcome.status == Some(blis_traces::Status::Ok)),
        "the requests completed before the interruption are kept"
    );
    assert!(
        last.contains("the rest recorded there as cancelled"),
        "{text}"
    );
    assert!(
        t.records.iter().all(|r| r.outcome.status.is_some())
            && t.records
                .iter()
                .any(|r| r.outcome.status == Some(blis_traces::Status::Cancelled)),
        "every planned request has its row, those not completed cancelled"
    );
    assert!(
        !out.join("report.html").exists() && !out.join("sim.yaml").exists(),
        "nothing was replayed or compared, and no earlier report stays beside the new trace"
    );
    assert!(out.join("notes.txt").exists(), "other files are left alone");
}
