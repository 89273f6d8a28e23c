//! The tiered KV cache (GPU + CPU): hand-computed offload, reload and
//! transfer times with the round-number blackbox model (step = 1000 µs +
//! 10 µs per prefill token + 100 µs per decode token).

use blis_replay::EngineConfig;
use blis_replay::engine::kv_tier::{CpuTierConfig, OffloadPolicy};

use crate::common::{req, run, simple_model, ttft, with_prefix};

/// 40 GPU blocks of 16 tokens; a CPU tier of 100 blocks, offloading above
/// 30% GPU usage (12 blocks); a block moves in 100 µs (100 kB at 1 GB/s)
/// plus 50 µs per transfer.
fn tiered(window_us: i64, policy: OffloadPolicy) -> EngineConfig {
    EngineConfig {
        total_kv_blocks: 40,
        cpu_tier: Some(CpuTierConfig {
            policy,
            cpu_blocks: 100,
            offload_threshold: 0.3,
            transfer_bandwidth_gb_s: 1.0,
            transfer_base_latency_us: 50.0,
            block_bytes: 100_000.0,
            thrashing_window_us: window_us,
        }),
        ..EngineConfig::default()
    }
}

/// A (t = 0) and C (t = 20 ms) share a 160-token system prompt (10
/// blocks); B (t = 10 ms) shares nothing and decodes for long.
fn workload() -> Vec<blis_traces::Request> {
    vec![
        with_prefix(req(0, 0, 200, 2), "sys", 160),
        req(1, 10_000, 200, 100),
        with_prefix(req(2, 20_000, 200, 2), "sys", 160),
    ]
}

#[test]
fn eagerly_offloaded_prefix_blocks_are_reloaded_and_their_transfer_lands_in_the_admitting_step() {
    let (s, r) = run(
        tiered(1000, OffloadPolicy::Eager),
        simple_model(),
        workload(),
    );
    // A: prefill 1000 + 10·200, one decode step; its 13 blocks are freed
    // at 4100 µs, 12 of them full and cached (10 shared, 2 its own).
    assert_eq!(ttft(&r[0]), 3000);
    // B: 13 fresh blocks at 10 ms, its first token at 13 ms. There the
    // next batch is formed with 13 of 40 blocks in use (32.5% > 30%): A's
    // 12 cached free blocks move to the CPU tier.
    assert_eq!(ttft(&r[1]), 3000);
    // C arrives at 20 ms inside B's decode step 13 000 + 6·1100 .. 20 700.
    // The GPU misses its first block; the CPU tier holds all 10 shared
    // blocks (C's own are not shareable): 10 blocks reloaded, 160 tokens
    // cached, 40 prefilled. The step formed at 20 700 is B's decode and C's
    // prefill plus the transfer: 1000 + 10·40 + 100 + (50 + 10·100) = 2550.
    assert_eq!(r[2].outcome.cached_tokens, Some(160));
    assert_eq!(ttft(&r[2]), 20_700 + 2550 - 20_000);
    let t = s.kv.cpu_tier.expect("CPU tier figures");
    // C's 12 cached blocks move too once it completes (B still runs).
    assert_eq!((t.offloads, t.reloads, t.transfers), (24, 10, 1));
    assert_eq!(t.transfer_ms, 1.05);
    // Offloaded at 13 ms, reloaded at 20.7 ms: outside a 1 ms window.
    assert_eq!(t.thrashing, 0);
    // A, B and C each looked up their 200 tokens past the GPU's hits
    // (none) in the CPU tier; C found 160.
    assert_eq!((t.query_tokens, t.hit_tokens), (600, 160));
    // The GPU prefix cache counts its own hits only (C's hit was on CPU).
    assert_eq!(s.prefix_cache.hit_tokens, 0);
    // A's two own blocks and C's twelve are there at the end.
    assert_eq!(t.used_blocks, 14);

    // Within a 10 ms window every reload is thrashing.
    let (s, _) = run(
        tiered(10_000, OffloadPolicy::Eager),
        simple_model(),
        workload(),
    );
    assert_eq!(s.kv.cpu_tier.unwrap().thrashing, 10);
}

#[test]
fn without_the_tier_the_prefix_stays_on_the_gpu_and_costs_no_transfer() {
    let cfg = EngineConfig {
        cpu_tier: None,
        ..tiered(1000, OffloadPolicy::Eager)
    };
    let (s, r) = run(cfg, simple_model(), workload());
    assert_eq!(r[2].outcome.cached_tokens, Some(160));
    assert_eq!(ttft(&r[2]), 20_700 + 1500 - 20_000);
    assert!(s.kv.cpu_tier.is_none());
    assert_eq!(s.prefix_cache.hit_tokens, 160);
}

#[test]
fn below_the_threshold_nothing_is_offloaded() {
    let mut cfg = tiered(1000, OffloadPolicy::Eager);
    cfg.cpu_tier.as_mut().unwrap().offload_threshold = 0.5;
    let (s, r) = run(cfg, simple_model(), workload());
    // B alone uses 32.5% of the GPU: A's blocks stay there for C.
    assert_eq!(ttft(&r[2]), 20_700 + 1500 - 20_000);
    let t = s.kv.cpu_tier.unwrap();
    // B and C together use 65%: then A's two own free blocks move.
    assert_eq!((t.offloads, t.reloads, t.transfers), (2, 0, 0));
}

/// On-evict: A (t = 0) leaves the 10-block system prompt cached; B (10 ms,
/// 200 tokens, long output) and D (15 ms, 400 tokens) fill the GPU, and
/// the blocks they take evict it while more than 12 blocks are in use, so
/// it moves to the CPU tier; C (30 ms) reloads it.
fn evicting_workload() -> Vec<blis_traces::Request> {
    vec![
        with_prefix(req(0, 0, 200, 2), "sys", 160),
        req(1, 10_000, 200, 100),
        with_prefix(req(2, 30_000, 200, 2), "sys", 160),
        req(3, 15_000, 400, 2),
    ]
}

#[test]
fn content_evicted_under_pressure_moves_to_the_cpu_tier_and_is_reloaded() {
    let (s, r) = run(
        tiered(1000, OffloadPolicy::OnEvict),
        simple_model(),
        evicting_workload(),
    );
    // A's blocks 0..12 are freed at 4.1 ms, its last block first: the free
    // queue is the 27 never used blocks, then A's 12, 11, .., 0. B takes
    // 13 empty blocks. D joins at 15.2 ms (B's steps: 13 ms, then 1.1 ms
    // each) and takes 25: 14 empty ones, then A's 12 (not full), 11 and 10
    // (A's own) and 9..2 (the system prompt's blocks 9..2), 10 of them
    // holding content, evicted with 38 blocks in use: offloaded. D's first
    // decode step (20.3 ms) takes block 1 (system block 1); B's block for
    // its position 208 (25.9 ms) takes block 0 (system block 0). So the
    // whole system prompt is on the CPU when C joins at 30.3 ms (B's steps
    // from 21.5 ms, when D completed): C reloads 10 blocks and prefills
    // 40 tokens beside B's decode: 1000 + 10·40 + 100 + (50 + 10·100).
    assert_eq!(ttft(&r[2]), 30_300 + 2550 - 30_000);
    assert_eq!(r[2].outcome.cached_tokens, Some(160));
    let t = s.kv.cpu_tier.expect("CPU tier figures");
    assert_eq!((t.reloads, t.transfers), (10, 1));
    // Without the tier the evicted prompt is lost: C prefills all 200.
    let cfg = EngineConfig {
        cpu_tier: None,
        ..tiered(1000, OffloadPolicy::OnEvict)
    };
    let (_, r) = run(cfg, simple_model(), evicting_workload());
    assert_eq!(ttft(&r[2]), 30_300 + 3100 - 30_000);
    assert_eq!(r[2].outcome.cached_tokens, Some(0));
}

#[test]
fn on_evict_leaves_the_gpu_prefix_cache_as_it_is() {
    // The eager case's workload: nothing is evicted, so nothing moves and
    // C hits the system prompt on the GPU, as without a tier.
    let (s, r) = run(
        tiered(1000, OffloadPolicy::OnEvict),
        simple_model(),
        workload(),
    );
    assert_eq!(ttft(&r[2]), 20_700 + 1500 - 20_000);
    assert_eq!(s.prefix_cache.hit_tokens, 160);
    let t = s.kv.cpu_tier.unwrap();
    assert_eq!((t.offloads, t.reloads), (0, 0));
}
