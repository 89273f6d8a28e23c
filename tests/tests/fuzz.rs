//! Fixed-seed structure-aware fuzzing of every parser the project owns
//! (issue 17 item 5), on stable Rust: each target's seed files
//! (`fuzz/corpus/TARGET/`, cut from `../shared`'s samples) mutated the
//! ways broken input is broken — bit flips, truncations, deletions,
//! duplicated and spliced ranges, and numbers replaced by extreme ones —
//! and run through `blis_tests::fuzz::run`. No input may panic or take
//! more than 5 s. `FUZZ_CASES` inputs per target (default 300; the
//! campaign in docs/reliability.md runs 1,000,000), `FUZZ_SEED` to vary them.
//! The coverage-guided version of the same targets is `fuzz/` (nightly).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};

/// Values that break parsers: integer and float limits, signs, specials.
const EXTREMES: [&str; 16] = [
    "0",
    "-1",
    "4294967295",
    "4294967296",
    "18446744073709551615",
    "18446744073709551616",
    "9223372036854775807",
    "-9223372036854775808",
    "1e309",
    "-1e309",
    "NaN",
    "inf",
    "1e-320",
    "0.5",
    "99999999999999999999999999",
    "",
];

/// Bytes that delimit structure in the formats.
const DELIMS: [&[u8]; 14] = [
    b",",
    b"\n",
    b"\r\n",
    b"\"",
    b":",
    b"{",
    b"}",
    b"[",
    b"]",
    b"=",
    b" ",
    b"\t",
    b"#",
    b"\xff\xfe",
];

fn seeds(target: &str) -> Vec<Vec<u8>> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files.iter().map(|p| std::fs::read(p).unwrap()).collect()
}

/// The spans of ASCII digits (with a sign or a point) in `data`.
fn numbers(data: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < data.len() {
        if data[i].is_ascii_digit() {
            let start = i;
            while i < data.len() && (data[i].is_ascii_digit() || data[i] == b'.') {
                i += 1;
            }
            out.push((start, i));
        } else {
            i += 1;
        }
    }
    out
}

fn mutate(rng: &mut ChaCha8Rng, seeds: &[Vec<u8>]) -> Vec<u8> {
    let mut d = seeds[rng.random_range(0..seeds.len())].clone();
    for _ in 0..rng.random_range(1..=4) {
        let len = d.len();
        match rng.random_range(0..8) {
            0 if len > 0 => {
                let i = rng.random_range(0..len);
                d[i] ^= 1 << rng.random_range(0..8);
            }
            1 => {
                let i = rng.random_range(0..=len);
                d.truncate(i);
            }
            2 if len > 0 => {
                let a = rng.random_range(0..len);
                let b = (a + rng.random_range(1..=64)).min(len);
                d.drain(a..b);
            }
            3 if len > 0 => {
                let a = rng.random_range(0..len);
                let b = (a + rng.random_range(1..=256)).min(len);
                let piece = d[a..b].to_vec();
                let at = rng.random_range(0..=d.len());
                for _ in 0..rng.random_range(1..=3) {
                    d.splice(at..at, piece.iter().copied());
                }
            }
            4 => {
                let other = &seeds[rng.random_range(0..seeds.len())];
                let cut = rng.random_range(0..=d.len());
                let from = rng.random_range(0..=other.len());
                d.truncate(cut);
                d.extend_from_slice(&other[from..]);
            }
            5 | 6 => {
                let spans = numbers(&d);
                if !spans.is_empty() {
                    let (a, b) = spans[rng.random_range(0..spans.len())];
                    let x = EXTREMES[rng.random_range(0..EXTREMES.len())];
                    d.splice(a..b, x.bytes());
                }
            }
            _ => {
                let at = rng.random_range(0..=len);
                let x = DELIMS[rng.random_range(0..DELIMS.len())];
                d.splice(at..at, x.iter().copied());
            }
        }
    }
    d
}

fn campaign(target: &str) {
    let cases: u64 = std::env::var("FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let seed: u64 = std::env::var("FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(17);
    // FUZZ_REPRO=FILE: that input alone, to see its panic's backtrace.
    if let Ok(p) = std::env::var("FUZZ_REPRO") {
        if p.contains(&format!("fuzz-{target}-")) {
            blis_tests::fuzz::run(target, &std::fs::read(&p).unwrap());
        }
        return;
    }
    let seeds = seeds(target);
    // The seeds themselves, then mutants.
    for s in &seeds {
        blis_tests::fuzz::run(target, s);
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ target.len() as u64);
    let start = Instant::now();
    let mut slowest = Duration::ZERO;
    for i in 0..cases {
        let data = mutate(&mut rng, &seeds);
        let t0 = Instant::now();
        let res = catch_unwind(AssertUnwindSafe(|| blis_tests::fuzz::run(target, &data)));
        let took = t0.elapsed();
        slowest = slowest.max(took);
        if res.is_err() {
            let path = std::env::temp_dir().join(format!("fuzz-{target}-crash-{i}"));
            std::fs::write(&path, &data).unwrap();
            panic!("{target}: input {i} panicked (saved to {})", path.display());
        }
        assert!(
            took < Duration::from_secs(5),
            "{target}: input {i} took {took:?} (saved bytes: {:?})",
            String::from_utf8_lossy(&data[..data.len().min(300)])
        );
    }
    eprintln!(
        "fuzz {target}: {cases} inputs in {:.1} s, slowest {:?}, 0 panics",
        start.elapsed().as_secs_f64(),
        slowest
    );
}

macro_rules! targets {
    ($($name:ident),*) => {
        $(
            #[test]
            fn $name() {
                campaign(stringify!($name));
            }
        )*
        #[test]
        fn every_target_has_a_test() {
            let mut ours = vec![$(stringify!($name)),*];
            ours.sort_unstable();
            let mut all = blis_tests::fuzz::TARGETS.to_vec();
            all.sort_unstable();
            assert_eq!(ours, all);
        }
    };
}

targets!(
    sse,
    prometheus,
    trace_csv,
    trace_header,
    companions,
    workload_spec,
    mooncake,
    azure,
    inference_perf,
    vllm_gt,
    servegen
);
