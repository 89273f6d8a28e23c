//! Write then read a trace bundle (all columns and both companions) and get
//! equal values back, for arbitrary rows.

use std::sync::Arc;

use blis_traces::{
    ChunkRecord, HashIds, MetricSample, Mode, Outcome, Request, Status, Trace, TraceHeader,
    TraceRecord,
};
use proptest::prelude::*;

use crate::common::tempdir;

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        "[a-z0-9_-]{1,12}",
        // Commas, quotes, newlines, spaces at the ends, non-ASCII.
        "[ a-zA-Z,\"\n\r;é中]{0,16}",
    ]
}

fn shared() -> impl Strategy<Value = Arc<str>> {
    text().prop_map(|s| Arc::from(s.as_str()))
}

fn nonzero_i64() -> impl Strategy<Value = Option<i64>> {
    prop_oneof![
        Just(None),
        // (Times are within ±2^53 µs: the reader refuses more.)
        (1i64..=blis_traces::csvio::MAX_TIME_US).prop_map(Some),
        (-blis_traces::csvio::MAX_TIME_US..=-1i64).prop_map(Some)
    ]
}

prop_compose! {
    fn request()(
        request_id in any::<u64>(),
        labels in (shared(), shared(), shared(), shared(), shared(), shared()),
        round_index in any::<u32>(),
        prefix_length in any::<u32>(),
        streaming in any::<bool>(),
        tokens in (any::<u32>(), any::<u32>(), any::<u32>(), any::<u32>(), any::<u32>(), any::<u32>()),
        reason_ratio in prop_oneof![Just(0.0), Just(1.0), 0.0f64..=1.0],
        deadline_us in nonzero_i64(),
        arrival_time_us in -blis_traces::csvio::MAX_TIME_US..=blis_traces::csvio::MAX_TIME_US,
        think_time_us in proptest::option::of(-blis_traces::csvio::MAX_TIME_US..=blis_traces::csvio::MAX_TIME_US),
        content_key in proptest::option::of(any::<u64>()),
        hash_ids in proptest::option::of((1u32..4096, proptest::collection::vec(any::<u64>(), 1..8))),
    ) -> Request {
        Request {
            request_id,
            client_id: labels.0,
            tenant_id: labels.1,
            slo_class: labels.2,
            session_id: labels.3,
            round_index,
            prefix_group: labels.4,
            prefix_length,
            streaming,
            input_tokens: tokens.0,
            output_tokens: tokens.1,
            text_tokens: tokens.2,
            image_tokens: tokens.3,
            audio_tokens: tokens.4,
            video_tokens: tokens.5,
            reason_ratio,
            model: labels.5,
            deadline_us,
            arrival_time_us,
            think_time_us,
            content_key,
            hash_ids: hash_ids.map(|(block_tokens, ids)| HashIds { block_tokens, ids: ids.into() }),
        }
    }
}

prop_compose! {
    fn outcome()(
        server_input_tokens in proptest::option::of(1u32..),
        times in (nonzero_i64(), nonzero_i64(), nonzero_i64()),
        num_chunks in any::<u32>(),
        status in proptest::option::of(prop_oneof![Just(Status::Ok), Just(Status::Error), Just(Status::Timeout), Just(Status::Cancelled)]),
        error_message in text(),
        finish_reason in text(),
        http_status in proptest::option::of(any::<u16>()),
        cached_tokens in proptest::option::of(any::<u32>()),
        x_request_id in proptest::option::of("[a-f0-9-]{1,36}"),
    ) -> Outcome {
        Outcome {
            server_input_tokens,
            send_time_us: times.0,
            first_chunk_time_us: times.1,
            last_chunk_time_us: times.2,
            num_chunks,
            status,
            error_message,
            finish_reason,
            http_status,
            cached_tokens,
            x_request_id,
        }
    }
}

fn record(extra_names: Vec<String>) -> impl Strategy<Value = TraceRecord> {
    let n = extra_names.len();
    (request(), outcome(), proptest::collection::vec(text(), n)).prop_map(
        move |(request, outcome, vals)| TraceRecord {
            request,
            outcome,
            other: extra_names.iter().cloned().zip(vals).collect(),
        },
    )
}

prop_compose! {
    fn chunk()(request_id in any::<u64>(), chunk_index in any::<u32>(), timestamp_us in any::<i64>(), tokens in proptest::option::of(any::<u32>())) -> ChunkRecord {
        ChunkRecord { request_id, chunk_index, timestamp_us, tokens }
    }
}

prop_compose! {
    fn metric()(timestamp_us in any::<i64>(), name in "[a-z_:]{1,40}", labels in "[a-z_=\",.0-9]{0,40}", value in prop_oneof![any::<f64>().prop_filter("finite", |v| v.is_finite()), -1e9f64..1e9]) -> MetricSample {
        MetricSample { timestamp_us, name, labels, value }
    }
}

fn trace() -> impl Strategy<Value = Trace> {
    // Some traces carry unknown extra columns (e.g. BLIS's vllm_priority).
    let names = prop_oneof![
        Just(vec![]),
        Just(vec![
            "vllm_priority".to_string(),
            "slo_target_us".to_string(),
            "my_col".to_string()
        ]),
    ];
    names.prop_flat_map(|names| {
        (
            proptest::collection::vec(record(names), 0..20),
            proptest::option::of(proptest::collection::vec(chunk(), 0..20)),
            proptest::option::of(proptest::collection::vec(metric(), 0..20)),
            any::<bool>(),
        )
            .prop_map(|(records, chunks, metrics, real)| {
                let mut header = TraceHeader::new(if real { Mode::Real } else { Mode::Replayed });
                header.warm_up_requests = 3;
                header.run_start_unix_us = Some(1_700_000_000_000_000);
                Trace {
                    header,
                    records,
                    chunks,
                    metrics,
                    absent_columns: Vec::new(),
                }
            })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn bundle_round_trips(t in trace()) {
        let dir = tempdir();
        let paths = t.write(&dir.path().join("t")).unwrap();
        let back = Trace::read(&paths.header).unwrap();
        prop_assert_eq!(&back.records, &t.records);
        prop_assert_eq!(&back.chunks, &t.chunks);
        prop_assert_eq!(&back.metrics, &t.metrics);
        prop_assert_eq!(back.header.mode, t.header.mode);
        prop_assert_eq!(back.header.warm_up_requests, 3);
        prop_assert_eq!(back.header.run_start_unix_us, t.header.run_start_unix_us);
    }
}

#[test]
fn special_metric_values_round_trip() {
    let dir = tempdir();
    let mut t = Trace::new(TraceHeader::new(Mode::Real), vec![]);
    t.metrics = Some(
        [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 0.5]
            .into_iter()
            .map(|value| MetricSample {
                timestamp_us: 1,
                name: "vllm:x".into(),
                labels: "le=\"+Inf\"".into(),
                value,
            })
            .collect(),
    );
    let paths = t.write(&dir.path().join("m")).unwrap();
    let text = std::fs::read_to_string(&paths.metrics).unwrap();
    assert!(
        text.contains(",NaN\n") && text.contains(",+Inf\n") && text.contains(",-Inf\n"),
        "{text}"
    );
    let back = Trace::read(&paths.header).unwrap().metrics.unwrap();
    assert!(back[0].value.is_nan());
    assert_eq!(back[1].value, f64::INFINITY);
    assert_eq!(back[2].value, f64::NEG_INFINITY);
    assert_eq!(back[3].value, 0.5);
}

#[test]
fn writer_streams_whole_rows_so_a_killed_writer_leaves_a_readable_file() {
    use blis_traces::{ExtraColumn, TraceWriter};
    let dir = tempdir();
    let prefix = dir.path().join("live");
    let header = TraceHeader::new(Mode::Real);
    let mut w = TraceWriter::create(
        &prefix,
        &header,
        &[ExtraColumn::HttpStatus],
        Some(false),
        true,
    )
    .unwrap()
    .flush_every_row(true);
    for i in 0..5 {
        let mut r = TraceRecord::planned(Request {
            request_id: i,
            input_tokens: 10,
            ..Request::default()
        });
        r.outcome.status = Some(Status::Ok);
        w.write_record(&r).unwrap();
    }
    // Without finishing (as if the process were killed now), the files are
    // already complete up to the last row.
    let back = Trace::read(&w.paths().header).unwrap();
    assert_eq!(back.records.len(), 5);
    std::mem::forget(w);
}
