//! The design's two-client example spec generates the same requests on every
//! run and every build: the CSV bytes are pinned by a hash. If this fails,
//! a sample stream changed; that breaks reproducibility of every published
//! workload, so change the hash only on purpose and say so in the changelog.

use blis_traces::{
    ExtraColumn, GenerateOptions, RecordWriter, TraceRecord, WorkloadSpec, generate,
};

use crate::common::shared;

fn csv_bytes(n: u64, seed: Option<u64>) -> Vec<u8> {
    let spec =
        WorkloadSpec::from_file(&shared().join("examples/two-client-workload.yaml")).unwrap();
    let opts = GenerateOptions {
        seed,
        num_requests: Some(n),
        ..GenerateOptions::default()
    };
    let records: Vec<TraceRecord> = generate(&spec, &opts)
        .unwrap()
        .into_iter()
        .map(TraceRecord::planned)
        .collect();
    let mut w = RecordWriter::new(
        Vec::new(),
        std::path::Path::new("<mem>"),
        &ExtraColumn::needed_for(&records),
    )
    .unwrap();
    for r in &records {
        w.write(r).unwrap();
    }
    w.finish().unwrap()
}

const GOLDEN_10K: u64 = 0x8505_17ad_7f27_d756;

#[test]
fn two_client_example_is_byte_identical_across_runs_and_builds() {
    let a = csv_bytes(10_000, None);
    let b = csv_bytes(10_000, None);
    assert_eq!(a, b, "two runs in one process differ");
    let hash = xxhash_rust::xxh3::xxh3_64(&a);
    assert_eq!(
        hash, GOLDEN_10K,
        "generated workload changed: hash {hash:#018x}"
    );
}

#[test]
fn seed_changes_the_workload_and_prefixes_are_shared() {
    assert_ne!(csv_bytes(100, Some(1)), csv_bytes(100, Some(2)));
    let spec =
        WorkloadSpec::from_file(&shared().join("examples/two-client-workload.yaml")).unwrap();
    let reqs = generate(
        &spec,
        &GenerateOptions {
            num_requests: Some(2000),
            ..Default::default()
        },
    )
    .unwrap();
    let batch: Vec<_> = reqs
        .iter()
        .filter(|r| &*r.client_id == "high-volume-batch")
        .collect();
    assert!(
        batch
            .iter()
            .all(|r| &*r.prefix_group == "shared-system-prompt"
                && r.prefix_length == 50
                && r.input_tokens >= 50)
    );
    assert!(
        batch
            .iter()
            .all(|r| &*r.slo_class == "batch" && !r.streaming)
    );
    let chat: Vec<_> = reqs
        .iter()
        .filter(|r| &*r.client_id == "realtime-chat")
        .collect();
    // v1 "realtime" is BLIS v2's "critical".
    assert!(
        chat.iter()
            .all(|r| &*r.slo_class == "critical" && r.streaming && r.prefix_length == 0)
    );
    assert!(chat.iter().all(|r| (10..=2048).contains(&r.input_tokens)));
    let share = batch.len() as f64 / reqs.len() as f64;
    assert!((share - 0.7).abs() < 0.05, "batch share {share}");
}
