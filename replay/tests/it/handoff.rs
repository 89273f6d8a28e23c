//! An instance's side of prefill/decode disaggregation, with the
//! round-number blackbox model (step = 1000 µs + 10 µs per prefill token +
//! 100 µs per decode token).

use blis_replay::engine::handoff::HandoffError;
use blis_replay::engine::instance::{DropReason, StepReport};
use blis_replay::{EngineConfig, Instance};

use crate::common::{sim_request as sim, simple_model};

fn cfg(blocks: u32) -> EngineConfig {
    EngineConfig {
        total_kv_blocks: blocks,
        ..EngineConfig::default()
    }
}

/// A token: (request, index, time µs).
type Token = (u64, u32, i64);
/// A completion: (request, first token µs, last token µs, output tokens).
type Completion = (u64, i64, i64, u32);

/// Steps `inst` until it is idle; every token and every completion.
fn drain(inst: &mut Instance) -> (Vec<Token>, Vec<Completion>) {
    let mut report = StepReport::default();
    let (mut tokens, mut done) = (Vec::new(), Vec::new());
    while let Some(t) = inst.next_time() {
        inst.step(t, i64::MAX, &mut report);
        for s in &report.spans {
            assert!(s.previous_us.is_some() || s.first_index == 1);
            for m in 0..s.count {
                tokens.push((s.id, s.first_index + m, report.token_time(s, m)));
            }
        }
        for f in &report.finished {
            done.push((f.id, f.first_token_us, f.last_token_us, f.output_tokens));
        }
        inst.check().unwrap();
    }
    (tokens, done)
}

#[test]
fn a_prefill_instance_stops_at_the_first_token_and_holds_the_blocks() {
    let mut p = Instance::new(cfg(100), simple_model());
    p.enqueue_prefill(0, sim(7, 100, 5)).unwrap();
    let (tokens, done) = drain(&mut p);
    // One prefill step of 100 tokens: 1000 + 10·100.
    assert_eq!(tokens, vec![(7, 1, 2000)]);
    assert_eq!(done, vec![(7, 2000, 2000, 1)]);
    // Its 7 blocks (100 tokens) stay until the transfer completes.
    assert_eq!((p.kv().used(), p.held_blocks()), (7, 7));
    assert!(p.release_held(2000, 7)); // (its tag)
    assert_eq!((p.kv().used(), p.held_blocks()), (0, 0));
    assert!(!p.release_held(2000, 7));
}

#[test]
fn a_decode_instance_continues_from_the_second_token() {
    let mut d = Instance::new(cfg(100), simple_model());
    // First token at 2 ms on the prefill side; here from 5 ms.
    d.admit_transferred(5000, sim(7, 100, 5), 2000, 32).unwrap();
    assert_eq!(d.kv().used(), 7);
    let (tokens, done) = drain(&mut d);
    // Four decode steps of 1000 + 100.
    assert_eq!(
        tokens,
        vec![(7, 2, 6100), (7, 3, 7200), (7, 4, 8300), (7, 5, 9400)]
    );
    assert_eq!(done, vec![(7, 2000, 9400, 5)]);
    assert_eq!(d.kv().used(), 0);
    assert_eq!(d.counters().completed, 1);
}

#[test]
fn a_decode_instance_without_room_says_so() {
    let mut d = Instance::new(
        EngineConfig {
            max_num_seqs: 1,
            ..cfg(100)
        },
        simple_model(),
    );
    d.admit_transferred(0, sim(1, 100, 50), 0, 0).unwrap();
    assert_eq!(
        d.admit_transferred(0, sim(2, 100, 50), 0, 0),
        Err(HandoffError::NoRoom)
    );
    // 13 blocks: the second prompt's 7 do not fit beside the first's 7.
    let mut d = Instance::new(cfg(13), simple_model());
    d.admit_transferred(0, sim(1, 100, 10), 0, 0).unwrap();
    assert_eq!(
        d.admit_transferred(0, sim(2, 100, 10), 0, 0),
        Err(HandoffError::NoRoom)
    );
    // Never: 290 + 10 tokens need 19 blocks of 13.
    assert!(matches!(
        d.admit_transferred(0, sim(3, 290, 10), 0, 0),
        Err(HandoffError::Dropped(DropReason::Unservable { .. }))
    ));
}
