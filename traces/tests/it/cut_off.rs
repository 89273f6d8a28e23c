//! A bundle whose writer was killed (issue 17 item 2): its header still
//! says `incomplete: true`, and each file may end in a partly written
//! line. Reading it keeps every complete row, drops the partial line (a
//! warning, not an error), and `check` says what is missing.

use std::io::Write;

use blis_traces::{
    ChunkRecord, Mode, Request, Status, Trace, TraceHeader, TraceRecord, TraceWriter,
};

use crate::common::tempdir;

fn done(id: u64) -> TraceRecord {
    let mut r = TraceRecord::planned(Request {
        request_id: id,
        input_tokens: 10,
        output_tokens: 3,
        streaming: true,
        arrival_time_us: id as i64 * 1000,
        ..Request::default()
    });
    r.outcome.status = Some(Status::Ok);
    r.outcome.send_time_us = Some(id as i64 * 1000 + 5);
    r.outcome.first_chunk_time_us = Some(id as i64 * 1000 + 50);
    r.outcome.last_chunk_time_us = Some(id as i64 * 1000 + 90);
    r.outcome.num_chunks = 2;
    r
}

/// Writes rows 0..n of a 10-request plan and flushes, as a run killed
/// after them leaves it (no `finish`), then appends `tail` to each file.
fn killed_bundle(prefix: &std::path::Path, n: u64, tail: &str) -> TraceHeader {
    let mut header = TraceHeader::new(Mode::Real);
    header.planned_requests = Some(10);
    header.planned_ids = Some("0-9".into());
    let mut w = TraceWriter::create(prefix, &header, &[], Some(false), false).unwrap();
    for id in 0..n {
        w.write_record(&done(id)).unwrap();
        for (i, t) in [50, 90].into_iter().enumerate() {
            w.write_chunk(&ChunkRecord {
                request_id: id,
                chunk_index: i as u32,
                timestamp_us: id as i64 * 1000 + t,
                tokens: None,
            })
            .unwrap();
        }
    }
    w.flush().unwrap();
    std::mem::forget(w); // killed: nothing more reaches the disk
    for ext in ["csv", "itl.csv"] {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(prefix.with_extension(ext))
            .unwrap();
        f.write_all(tail.as_bytes()).unwrap();
    }
    header
}

#[test]
fn a_killed_run_reads_back_without_its_partial_last_line() {
    let dir = tempdir();
    let prefix = dir.path().join("run");
    // A row cut inside a number: it would parse, with a wrong value.
    killed_bundle(&prefix, 4, "4,1795578801653");
    let yaml = std::fs::read_to_string(prefix.with_extension("yaml")).unwrap();
    assert!(yaml.contains("incomplete: true"), "{yaml}");
    let t = Trace::read(&prefix.with_extension("yaml")).expect("a killed run reads back");
    assert_eq!(t.records.len(), 4);
    assert_eq!(t.records[3], done(3));
    assert_eq!(t.chunks.as_ref().unwrap().len(), 8);
    assert!(t.header.incomplete);
    let r = blis_traces::check::check(&prefix).unwrap();
    assert!(!r.finished);
    assert_eq!((r.planned, r.rows), (Some(10), 4));
    assert_eq!(r.missing, Some(vec![(4, 9)]));
    assert_eq!(r.missing_count, Some(6));
    assert!(!r.is_complete());
}

#[test]
fn a_run_killed_before_its_first_flush_reads_as_empty() {
    let dir = tempdir();
    let prefix = dir.path().join("run");
    killed_bundle(&prefix, 0, "");
    // Nothing but the header row might be there: truncate to nothing.
    std::fs::write(prefix.with_extension("csv"), b"request_id,client").unwrap();
    std::fs::write(prefix.with_extension("itl.csv"), b"").unwrap();
    let t = Trace::read(&prefix.with_extension("yaml")).expect("reads as empty");
    assert!(t.records.is_empty());
    let r = blis_traces::check::check(&prefix).unwrap();
    assert_eq!(r.missing_count, Some(10));
}

#[test]
fn a_finished_trace_keeps_failing_on_a_broken_last_line() {
    let dir = tempdir();
    let prefix = dir.path().join("run");
    let header = TraceHeader::new(Mode::Real);
    let mut w = TraceWriter::create(&prefix, &header, &[], None, false).unwrap();
    w.write_record(&done(0)).unwrap();
    w.finish(&header).unwrap();
    let yaml = std::fs::read_to_string(prefix.with_extension("yaml")).unwrap();
    assert!(!yaml.contains("incomplete"), "{yaml}");
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(prefix.with_extension("csv"))
        .unwrap();
    f.write_all(b"1,x,").unwrap();
    let e = Trace::read(&prefix.with_extension("yaml"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("run.csv:3"), "{e}");
    assert!(blis_traces::check::check(&prefix).is_err());
}
