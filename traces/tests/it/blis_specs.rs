//! Workload specs as BLIS writes them: the `inference_perf:` block with
//! `stages` and `shared_prefix` directly under it (BLIS's
//! `sim/workload/inference_perf.go`), and `enable_multi_turn_chat` with
//! BLIS's meaning (closed-loop sessions). inference-perf's own form
//! (`load.stages`, `data.shared_prefix`) reads as before; a field either
//! form accepts but this generator does not implement is an error naming it.

use std::collections::BTreeMap;

use blis_traces::{GenerateOptions, Request, WorkloadSpec, generate};

fn generated(yaml: &str) -> Vec<Request> {
    generate(
        &WorkloadSpec::from_yaml_str(yaml).unwrap(),
        &GenerateOptions::default(),
    )
    .unwrap()
}

fn error(yaml: &str) -> String {
    match WorkloadSpec::from_yaml_str(yaml) {
        Ok(s) => generate(&s, &GenerateOptions::default())
            .map(|r| format!("no error: {} requests", r.len()))
            .unwrap_or_else(|e| e.to_string()),
        Err(e) => e.to_string(),
    }
}

/// BLIS's form of the ground truth's codegen workload.
const BLIS_FORM: &str = "
version: \"2\"
seed: 42
inference_perf:
  stages:
    - {rate: 5, duration: 60}
    - {rate: 10, duration: 60}
  shared_prefix:
    num_unique_system_prompts: 11
    num_users_per_system_prompt: 4
    system_prompt_len: 100
    question_len: 466
    output_len: 247
    enable_multi_turn_chat: false
";

#[test]
fn blis_form_generates_the_same_requests_as_inference_perfs_own_form() {
    let own = "
seed: 42
inference_perf:
  load:
    type: constant
    stages:
      - {rate: 5, duration: 60}
      - {rate: 10, duration: 60}
  data:
    type: shared_prefix
    shared_prefix:
      num_groups: 11
      num_prompts_per_group: 4
      system_prompt_len: 100
      question_len: 466
      output_len: 247
";
    let a = generated(BLIS_FORM);
    assert_eq!(a, generated(own));
    // Exactly rate × duration per stage, each stage within its window.
    assert_eq!(a.len(), 300 + 600);
    assert_eq!(
        a.iter().filter(|r| r.arrival_time_us <= 60_000_000).count(),
        300
    );
    assert!(a.iter().all(|r| r.arrival_time_us <= 120_000_000));
    for r in &a {
        assert_eq!(
            (r.input_tokens, r.output_tokens, r.prefix_length),
            (566, 247, 100)
        );
        assert!(r.prefix_group.starts_with("ip-group-"));
        assert!(r.session_id.is_empty());
    }
    let groups: std::collections::BTreeSet<&str> = a.iter().map(|r| &*r.prefix_group).collect();
    assert_eq!(groups.len(), 11);
}

#[test]
fn multi_turn_chat_is_closed_loop_sessions_with_blis_meaning() {
    let yaml = BLIS_FORM.replace(
        "enable_multi_turn_chat: false",
        "enable_multi_turn_chat: true",
    );
    let reqs = generated(&yaml);
    // The same request count: each stage's rate × duration shared evenly
    // among its 44 sessions (300 → 36 sessions of 7 and 8 of 6; 600 → 28
    // of 14 and 16 of 13).
    assert_eq!(reqs.len(), 900);
    let mut sessions: BTreeMap<&str, Vec<&Request>> = BTreeMap::new();
    for r in &reqs {
        assert!(!r.session_id.is_empty(), "every request is in a session");
        sessions.entry(&r.session_id).or_default().push(r);
    }
    assert_eq!(sessions.len(), 88, "44 (prefix, user) sessions per stage");
    let mut rounds: Vec<usize> = sessions.values().map(Vec::len).collect();
    rounds.sort_unstable();
    assert_eq!(rounds.iter().sum::<usize>(), 900);
    assert_eq!((rounds[0], rounds[87]), (6, 14));
    for (id, rs) in &sessions {
        // Rounds in order, each after the previous by the think time of
        // sessions / rate: 44 / 5 = 8.8 s in stage 0, 4.4 s in stage 1;
        // fixed-length inputs (no context carried over).
        let think = if id.contains("-s0-") {
            8_800_000
        } else {
            4_400_000
        };
        for (k, r) in rs.iter().enumerate() {
            assert_eq!(r.round_index as usize, k, "{id}");
            assert_eq!(r.input_tokens, 566);
            assert_eq!(r.think_time_us, (k > 0).then_some(think), "{id} round {k}");
        }
        for w in rs.windows(2) {
            assert_eq!(w[1].arrival_time_us - w[0].arrival_time_us, think);
        }
    }
    // A session's prefix group is its system prompt's.
    let s = &sessions["inference-perf-s0-g3-u1"];
    assert!(s.iter().all(|r| &*r.prefix_group == "ip-group-3"));
}

#[test]
fn fields_a_form_accepts_but_the_generator_does_not_implement_are_errors_naming_them() {
    for (edit, field) in [
        (
            (
                "    enable_multi_turn_chat: false",
                "    enable_multi_turn_chat: false\n    question_distribution: {min: 10, max: 20}",
            ),
            "inference_perf.shared_prefix.question_distribution",
        ),
        (
            ("  stages:", "  num_workers: 4\n  stages:"),
            "inference_perf.num_workers",
        ),
        (
            (
                "    - {rate: 5, duration: 60}",
                "    - {rate: 5, duration: 60, concurrency_level: 8}",
            ),
            "inference_perf.stages[0].concurrency_level",
        ),
        (
            (
                "  stages:",
                "  load: {stages: [{rate: 1, duration: 1}]}\n  stages:",
            ),
            "inference_perf.stages",
        ),
    ] {
        let yaml = BLIS_FORM.replacen(edit.0, edit.1, 1);
        assert_ne!(yaml, BLIS_FORM, "{field}");
        let e = error(&yaml);
        assert!(e.contains(field), "{field}: {e}");
    }
    // inference-perf's own form: a data type that is not modelled, and a
    // request timeout that would change the plan.
    let own = "
inference_perf:
  load: {stages: [{rate: 1, duration: 10}], request_timeout: 30}
  data: {type: shared_prefix, shared_prefix: {num_groups: 2, num_prompts_per_group: 2}}
";
    assert!(
        error(own).contains("inference_perf.load.request_timeout"),
        "{}",
        error(own)
    );
    let random = own
        .replace(", request_timeout: 30", "")
        .replace("type: shared_prefix, ", "type: random, ");
    assert!(
        error(&random).contains("inference_perf.data.type"),
        "{}",
        error(&random)
    );
    // The client's own settings are accepted.
    let fine = own.replace(
        "request_timeout: 30",
        "num_workers: 224, request_timeout: null",
    );
    assert_eq!(generated(&fine).len(), 10);
}
