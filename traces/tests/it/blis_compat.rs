//! The trace written by BLIS (Go) reads as it is, and written back by us it
//! has BLIS's 27 columns in BLIS's order (BLIS's reader is positional).

use blis_traces::{BASE_COLUMNS, Mode, RecordReader, Status, Trace};

use crate::common::{shared, tempdir};

#[test]
fn blis_trace_reads_as_it_is() {
    let t = Trace::read(&shared().join("traces-samples/blis/blis-run-1k.yaml")).unwrap();
    assert_eq!(t.header.trace_version, 3);
    assert_eq!(t.header.mode, Mode::Generated);
    assert_eq!(t.header.workload_seed, Some(42));
    assert_eq!(t.records.len(), 1000);
    let first = &t.records[0];
    assert_eq!(&*first.request.client_id, "distribution");
    assert_eq!(first.request.input_tokens, 185);
    assert_eq!(first.request.output_tokens, 1208);
    assert_eq!(first.request.arrival_time_us, 45454);
    assert_eq!(first.request.deadline_us, Some(300_045_454));
    assert_eq!(first.outcome.status, Some(Status::Ok));
    assert_eq!(first.ttft_us(), Some(67_773 - 45_454));
    assert_eq!(t.records[999].request.arrival_time_us, 45_454_000);
    // Totals and means computed independently (Python csv module).
    let input: u64 = t
        .records
        .iter()
        .map(|r| u64::from(r.request.input_tokens))
        .sum();
    let output: u64 = t
        .records
        .iter()
        .map(|r| u64::from(r.request.output_tokens))
        .sum();
    assert_eq!((input, output), (520_811, 515_599));
    let e2e_mean_ms = t
        .records
        .iter()
        .map(|r| r.e2e_us().unwrap() as f64)
        .sum::<f64>()
        / 1000.0
        / 1000.0;
    let ttft_mean_ms = t
        .records
        .iter()
        .map(|r| r.ttft_us().unwrap() as f64)
        .sum::<f64>()
        / 1000.0
        / 1000.0;
    assert!((e2e_mean_ms - 5270.515).abs() < 1e-3, "{e2e_mean_ms}");
    // BLIS's own summary of that run: TTFT mean 31.43 ms.
    assert!((ttft_mean_ms - 31.43).abs() < 0.01, "{ttft_mean_ms}");
}

#[test]
fn written_back_it_reads_in_blis_column_order() {
    let src = shared().join("traces-samples/blis/blis-run-1k.yaml");
    let t = Trace::read(&src).unwrap();
    let dir = tempdir();
    let paths = t.write(&dir.path().join("back")).unwrap();
    let text = std::fs::read_to_string(&paths.data).unwrap();
    let header_row: Vec<&str> = text.lines().next().unwrap().split(',').collect();
    assert_eq!(header_row, BASE_COLUMNS);
    // Same rows, byte for byte, as BLIS wrote them.
    let original =
        std::fs::read_to_string(shared().join("traces-samples/blis/blis-run-1k.csv")).unwrap();
    assert_eq!(text, original);
    let back = RecordReader::open(&paths.data).unwrap().read_all().unwrap();
    assert_eq!(back, t.records);
}

#[test]
fn blis_optional_columns_are_written_where_blis_expects_them() {
    // BLIS puts vllm_priority right after slo_class and slo_target_us right
    // after deadline_us; anywhere else its positional parser would shift.
    let dir = tempdir();
    let csv = dir.path().join("p.csv");
    let mut cols: Vec<String> = BASE_COLUMNS.iter().map(|s| s.to_string()).collect();
    cols.push("vllm_priority".into());
    cols.push("slo_target_us".into());
    let mut row: Vec<&str> = vec!["0"; 27];
    row[8] = "true";
    row[24] = "ok";
    for i in [1, 2, 3, 4, 6, 16, 25, 26] {
        row[i] = "";
    }
    let body = format!("{}\n{},2,5000\n", cols.join(","), row.join(","));
    std::fs::write(&csv, body).unwrap();
    std::fs::write(
        dir.path().join("p.yaml"),
        "trace_version: 3\ntime_unit: microseconds\nmode: real\n",
    )
    .unwrap();
    let t = Trace::read(&dir.path().join("p.yaml")).unwrap();
    let out = t.write(&dir.path().join("q")).unwrap();
    let header_row = std::fs::read_to_string(out.data)
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .to_string();
    let names: Vec<&str> = header_row.split(',').collect();
    assert_eq!(names[3], "slo_class");
    assert_eq!(names[4], "vllm_priority");
    assert_eq!(names[18], "deadline_us");
    assert_eq!(names[19], "slo_target_us");
    assert_eq!(names.len(), 29);
}
