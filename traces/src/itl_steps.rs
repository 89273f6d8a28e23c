//! The ITL companion in step form: what a simulator writes instead of one
//! row per streamed token.
//!
//! A simulated token becomes visible at the end of the engine step that
//! produced it, plus fixed output overheads ([`ItlTiming`]). So per-token
//! times are stored as two small tables, and expanded (to BLIS's one row
//! per chunk, [`ChunkRecord`]) only when a reader asks:
//!
//! - `PREFIX.steps.csv`: the instances' step end times, one row per batch
//!   of steps reported together (`instance,first_step,first_end_us,gaps_us`;
//!   `gaps_us` holds the gaps between the following ends, space-separated,
//!   `g*n` for `n` equal gaps), in the order they were reported;
//! - `PREFIX.itl.csv`: one row per run of a request's tokens in consecutive
//!   steps of one instance (`request_id,instance,join,first_index,
//!   first_step,count,output_tokens`). `join` orders the requests of an
//!   instance's batch (vLLM's running order: when each joined it).
//!
//! The header names both files and the timing (`itl_steps`). Token `i`
//! (1-based) of a run that starts at step `s` is produced by step
//! `s + i − first_index` and visible at that step's end plus
//! [`ItlTiming::extra_us`]. [`expand`] lists the chunks in the order the
//! simulator reported them, so the expansion equals the row form byte for
//! byte. The 51 million tokens of 100,000 chat requests (`examples/chat-512.yaml`,
//! 16 instances) take 16 MB in this form against 1,026 MB as rows.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::companions::{ChunkRecord, read_rows};
use crate::csvio::RowSink;
use crate::error::{Error, Result};

/// Columns of the step table.
pub const STEP_COLUMNS: [&str; 4] = ["instance", "first_step", "first_end_us", "gaps_us"];
/// Columns of the ITL companion in step form.
pub const RUN_COLUMNS: [&str; 7] = [
    "request_id",
    "instance",
    "join",
    "first_index",
    "first_step",
    "count",
    "output_tokens",
];

/// When a token produced at the end of a step becomes visible to the
/// client (the latency model's output overheads; `replay`'s
/// `TokenTiming`): `hop_us` on every token, `per_token_us` times the
/// token's 1-based index (BLIS's α2, accumulating), `completion_us` on a
/// request's last token. The sum is rounded to whole µs.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct ItlTiming {
    /// Delay of every token, µs.
    pub hop_us: f64,
    /// Accumulating overhead per output token, µs.
    pub per_token_us: f64,
    /// Delay of a request's last token, µs.
    pub completion_us: f64,
}

impl ItlTiming {
    /// The delay after its step's end of output token `index` (1-based);
    /// `last`: the request's last token. µs.
    pub fn extra_us(&self, index: u32, last: bool) -> i64 {
        let mut extra = self.hop_us + self.per_token_us * f64::from(index);
        if last {
            extra += self.completion_us;
        }
        if extra == 0.0 { 0 } else { round_to_i64(extra) }
    }
}

/// `x.round() as i64` (half away from zero) without the libm call that
/// `f64::round` compiles to on baseline x86-64: a truncating conversion and
/// the exact fractional part. Equal for every `x` (beyond 2^52 every float
/// is an integer already; NaN gives 0 and infinities saturate, as the cast
/// does).
#[inline]
pub fn round_to_i64(x: f64) -> i64 {
    if x.is_nan() || x.abs() >= 4.0e15 {
        return x as i64;
    }
    let t = x as i64;
    let d = x - t as f64;
    if d >= 0.5 {
        t + 1
    } else if d <= -0.5 {
        t - 1
    } else {
        t
    }
}

/// The header's account of an ITL companion in step form.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ItlSteps {
    /// The step table, relative to the header's folder.
    pub steps_file: String,
    /// The output overheads.
    #[serde(flatten)]
    pub timing: ItlTiming,
}

/// Steps of one instance reported together, with their end times (µs, the
/// clock of the trace's chunk times).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StepBatch {
    /// The instance (0-based).
    pub instance: u32,
    /// Its index of the first step (0-based, counting every step).
    pub first_step: u64,
    /// End time of each step.
    pub ends: Vec<i64>,
}

/// A request's tokens produced in consecutive steps of one instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenRun {
    /// The request.
    pub request_id: u64,
    /// The instance.
    pub instance: u32,
    /// When it joined the instance's running batch (orders a batch).
    pub join: u64,
    /// Output index (1-based) of the first token.
    pub first_index: u32,
    /// The step that produced it.
    pub first_step: u64,
    /// Tokens, one per step.
    pub count: u32,
    /// The request's output length (its token of this index is its last).
    pub output_tokens: u32,
}

impl TokenRun {
    /// Whether `next` continues this run (same instance and batch entry,
    /// the next step and the next token).
    pub fn continues_with(&self, next: &TokenRun) -> bool {
        next.instance == self.instance
            && next.join == self.join
            && next.first_step == self.first_step + u64::from(self.count)
            && next.first_index == self.first_index + self.count
    }
}

/// Writes the two tables of the step form.
#[derive(Debug)]
pub struct StepsWriter {
    steps: RowSink<File>,
    runs: RowSink<File>,
    text: String,
}

impl StepsWriter {
    /// Creates the step table at `steps_path` and the token runs at
    /// `runs_path`.
    ///
    /// # Errors
    /// I/O errors naming the file.
    pub fn create(steps_path: &Path, runs_path: &Path) -> Result<Self> {
        let open = |p: &Path| File::create(p).map_err(|e| Error::io(p, e));
        Ok(Self {
            steps: RowSink::new(open(steps_path)?, steps_path, &STEP_COLUMNS)?,
            runs: RowSink::new(open(runs_path)?, runs_path, &RUN_COLUMNS)?,
            text: String::new(),
        })
    }

    /// Appends a batch of steps (`ends` not empty).
    ///
    /// # Errors
    /// I/O errors naming the file.
    pub fn write_steps(&mut self, instance: u32, first_step: u64, ends: &[i64]) -> Result<()> {
        let mut b = itoa::Buffer::new();
        self.steps.push_plain(b.format(instance).as_bytes());
        self.steps.push_plain(b.format(first_step).as_bytes());
        self.steps.push_plain(b.format(ends[0]).as_bytes());
        self.text.clear();
        let mut i = 1;
        while i < ends.len() {
            let g = ends[i] - ends[i - 1];
            let mut n = 1;
            while i + n < ends.len() && ends[i + n] - ends[i + n - 1] == g {
                n += 1;
            }
            if !self.text.is_empty() {
                self.text.push(' ');
            }
            self.text.push_str(b.format(g));
            if n > 1 {
                self.text.push('*');
                self.text.push_str(b.format(n));
            }
            i += n;
        }
        self.steps.push_plain(self.text.as_bytes());
        self.steps.end_row()
    }

    /// Appends a run of tokens.
    ///
    /// # Errors
    /// I/O errors naming the file.
    pub fn write_run(&mut self, r: &TokenRun) -> Result<()> {
        let mut b = itoa::Buffer::new();
        for v in [
            r.request_id,
            u64::from(r.instance),
            r.join,
            u64::from(r.first_index),
            r.first_step,
            u64::from(r.count),
            u64::from(r.output_tokens),
        ] {
            self.runs.push_plain(b.format(v).as_bytes());
        }
        self.runs.end_row()
    }

    /// Writes buffered rows to the files.
    ///
    /// # Errors
    /// I/O errors naming the file.
    pub fn flush(&mut self) -> Result<()> {
        self.steps.flush()?;
        self.runs.flush()
    }
}

/// Instances a step table may name (0 to 65535).
pub const MAX_INSTANCES: u32 = 1 << 16;
/// Steps a step table may hold per file, and the highest step index: 2^27
/// (134 million; a 100,000-request replay on 16 instances takes about 10^6).
pub const MAX_STEPS: u64 = 1 << 27;
/// Chunks an ITL companion in step form may expand to: 2^28.
pub const MAX_CHUNKS: u64 = 1 << 28;

/// Reads a step table.
///
/// # Errors
/// I/O errors; malformed cells naming file:line:column and the field.
pub fn read_steps(path: &Path) -> Result<Vec<StepBatch>> {
    let f = File::open(path).map_err(|e| Error::io(path, e))?;
    read_steps_from(f, path)
}

/// Reads a step table from `input`, named `path` in errors.
///
/// # Errors
/// As [`read_steps`].
pub fn read_steps_from<R: Read>(input: R, path: &Path) -> Result<Vec<StepBatch>> {
    let mut total = 0u64;
    read_rows(input, path, &STEP_COLUMNS, |cx, idx| {
        let need = |i: usize| -> Result<i64> {
            cx.int_by_name::<i64>(idx[i], STEP_COLUMNS[i])?
                .ok_or_else(|| cx.err_named(idx[i], STEP_COLUMNS[i], "missing value"))
        };
        let instance = u32::try_from(need(0)?)
            .ok()
            .filter(|i| *i < MAX_INSTANCES)
            .ok_or_else(|| cx.err_named(idx[0], "instance", "out of range (0 to 65535)"))?;
        let first_step = u64::try_from(need(1)?)
            .ok()
            .filter(|s| *s < MAX_STEPS)
            .ok_or_else(|| cx.err_named(idx[1], "first_step", "out of range (0 to 2^27)"))?;
        let mut ends = vec![need(2)?];
        for part in cx.text(idx[3]).split_whitespace() {
            let bad = || cx.err_named(idx[3], "gaps_us", &format!("invalid gap {part:?}"));
            let (g, n) = match part.split_once('*') {
                Some((g, n)) => (g, n.parse::<usize>().map_err(|_| bad())?),
                None => (part, 1),
            };
            let g = g.parse::<i64>().map_err(|_| bad())?;
            total += n as u64;
            if g < 0
                || n == 0
                || total > MAX_STEPS
                || first_step + ends.len() as u64 + n as u64 > MAX_STEPS
            {
                return Err(bad());
            }
            for _ in 0..n {
                let last = *ends.last().expect("one end at least");
                ends.push(last.checked_add(g).ok_or_else(bad)?);
            }
        }
        Ok(StepBatch {
            instance,
            first_step,
            ends,
        })
    })
}

/// Reads the token runs of an ITL companion in step form.
///
/// # Errors
/// I/O errors; malformed cells naming file:line:column and the field.
pub fn read_runs(path: &Path) -> Result<Vec<TokenRun>> {
    let f = File::open(path).map_err(|e| Error::io(path, e))?;
    read_runs_from(f, path)
}

/// Reads token runs from `input`, named `path` in errors.
///
/// # Errors
/// As [`read_runs`].
pub fn read_runs_from<R: Read>(input: R, path: &Path) -> Result<Vec<TokenRun>> {
    read_rows(input, path, &RUN_COLUMNS, |cx, idx| {
        let need = |i: usize| -> Result<u64> {
            cx.int_by_name::<u64>(idx[i], RUN_COLUMNS[i])?
                .ok_or_else(|| cx.err_named(idx[i], RUN_COLUMNS[i], "missing value"))
        };
        let small = |i: usize| -> Result<u32> {
            u32::try_from(need(i)?)
                .map_err(|_| cx.err_named(idx[i], RUN_COLUMNS[i], "out of range"))
        };
        let r = TokenRun {
            request_id: need(0)?,
            instance: small(1)?,
            join: need(2)?,
            first_index: small(3)?,
            first_step: need(4)?,
            count: small(5)?,
            output_tokens: small(6)?,
        };
        if r.first_index == 0 || r.count == 0 {
            return Err(cx.err_named(idx[5], "count", "first_index and count must be ≥ 1"));
        }
        if r.instance >= MAX_INSTANCES
            || r.first_step >= MAX_STEPS
            || u64::from(r.count) > MAX_STEPS
            || r.first_index.checked_add(r.count).is_none()
        {
            return Err(cx.err_named(
                idx[4],
                "first_step",
                "out of range (instances below 65536, steps below 2^27)",
            ));
        }
        Ok(r)
    })
}

/// The chunks of `runs`, timed by `steps` and `timing`, in step order and,
/// within a step, the running order (`join`): the row form, byte for byte.
///
/// # Errors
/// A run that names a step the step table does not have.
pub fn expand(
    steps: &[StepBatch],
    runs: &[TokenRun],
    timing: &ItlTiming,
    path: &Path,
) -> Result<Vec<ChunkRecord>> {
    let instances = steps
        .iter()
        .map(|s| s.instance as usize + 1)
        .chain(runs.iter().map(|r| r.instance as usize + 1))
        .max()
        .unwrap_or(0);
    // Each instance's step end times, by step index (the table's gaps
    // count: at most 2^27 steps in all).
    let mut sizes = vec![0u64; instances];
    for s in steps {
        let e = &mut sizes[s.instance as usize];
        *e = (*e).max(s.first_step + s.ends.len() as u64);
    }
    if sizes.iter().sum::<u64>() > MAX_STEPS {
        return Err(Error::in_file(
            path,
            "its step indices span more than 2^27 steps".to_string(),
        ));
    }
    let mut ends: Vec<Vec<i64>> = vec![Vec::new(); instances];
    for s in steps {
        let e = &mut ends[s.instance as usize];
        let at = s.first_step as usize;
        if e.len() < at + s.ends.len() {
            e.resize(at + s.ends.len(), i64::MIN);
        }
        e[at..at + s.ends.len()].copy_from_slice(&s.ends);
    }
    // Each instance's runs by first step.
    let mut by_inst: Vec<Vec<usize>> = vec![Vec::new(); instances];
    for (i, r) in runs.iter().enumerate() {
        let last = r.first_step + u64::from(r.count) - 1;
        let known = ends[r.instance as usize]
            .get(last as usize)
            .is_some_and(|&e| e != i64::MIN);
        if !known {
            return Err(Error::in_file(
                path,
                format!(
                    "request {} names step {last} of instance {}, which the step table does not have",
                    r.request_id, r.instance
                ),
            ));
        }
        by_inst[r.instance as usize].push(i);
    }
    for v in &mut by_inst {
        v.sort_by_key(|&i| (runs[i].first_step, runs[i].join));
    }
    let mut next = vec![0usize; instances];
    let mut active: Vec<std::collections::BTreeMap<u64, usize>> =
        vec![std::collections::BTreeMap::new(); instances];
    let total: u64 = runs.iter().map(|r| u64::from(r.count)).sum();
    if total > MAX_CHUNKS {
        return Err(Error::in_file(
            path,
            format!("its runs expand to {total} chunks, more than 2^28"),
        ));
    }
    let mut out = Vec::with_capacity(total.min(1 << 20) as usize);
    for s in steps {
        let inst = s.instance as usize;
        let (s0, s1) = (s.first_step, s.first_step + s.ends.len() as u64);
        let a = &mut active[inst];
        let order = &by_inst[inst];
        while next[inst] < order.len() && runs[order[next[inst]]].first_step < s1 {
            let i = order[next[inst]];
            a.insert(runs[i].join, i);
            next[inst] += 1;
        }
        a.retain(|_, &mut i| runs[i].first_step + u64::from(runs[i].count) > s0);
        for step in s0..s1 {
            for &i in a.values() {
                let r = &runs[i];
                if step < r.first_step || step >= r.first_step + u64::from(r.count) {
                    continue;
                }
                let index = r.first_index + (step - r.first_step) as u32;
                out.push(ChunkRecord {
                    request_id: r.request_id,
                    chunk_index: index - 1,
                    timestamp_us: ends[inst][step as usize]
                        + timing.extra_us(index, index >= r.output_tokens),
                    tokens: None,
                });
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_matches_f64_round() {
        let mut x = -1.0e6f64;
        let mut n = 0u64;
        while x < 1.0e6 {
            for y in [
                x,
                x + 0.5,
                x - 0.5,
                x + 0.49999999999999994,
                x + 0.5000000000000001,
            ] {
                assert_eq!(round_to_i64(y), y.round() as i64, "{y}");
            }
            x += 0.37;
            n += 1;
        }
        assert!(n > 1_000_000);
        for y in [
            0.0,
            -0.0,
            0.5,
            -0.5,
            1.5,
            2.5,
            4.5e15,
            -4.5e15,
            1e300,
            -1e300,
            f64::NAN,
            f64::INFINITY,
            0.49999999999999994,
        ] {
            assert_eq!(round_to_i64(y), y.round() as i64, "{y}");
        }
    }

    #[test]
    fn gaps_round_trip_with_runs_of_equal_gaps() {
        let dir = tempfile::tempdir().unwrap();
        let (sp, rp) = (dir.path().join("s.csv"), dir.path().join("r.csv"));
        let mut w = StepsWriter::create(&sp, &rp).unwrap();
        w.write_steps(0, 0, &[100]).unwrap();
        w.write_steps(1, 0, &[50, 60, 70, 80, 95, 110, 112])
            .unwrap();
        w.flush().unwrap();
        drop(w);
        let text = std::fs::read_to_string(&sp).unwrap();
        assert!(text.contains("1,0,50,10*3 15*2 2\n"), "{text}");
        let back = read_steps(&sp).unwrap();
        assert_eq!(back[1].ends, vec![50, 60, 70, 80, 95, 110, 112]);
        assert_eq!(back[0].ends, vec![100]);
    }

    #[test]
    fn expansion_orders_by_report_then_step_then_join() {
        // Instance 0: step 0 (request 7 prefill), then steps 1-3 reported
        // together (a fast-forwarded run: 7 and 9 decode, 9 joined later).
        let steps = vec![
            StepBatch {
                instance: 0,
                first_step: 0,
                ends: vec![1000],
            },
            StepBatch {
                instance: 0,
                first_step: 1,
                ends: vec![1100, 1200, 1300],
            },
        ];
        let runs = vec![
            TokenRun {
                request_id: 9,
                instance: 0,
                join: 1,
                first_index: 1,
                first_step: 1,
                count: 3,
                output_tokens: 3,
            },
            TokenRun {
                request_id: 7,
                instance: 0,
                join: 0,
                first_index: 1,
                first_step: 0,
                count: 4,
                output_tokens: 10,
            },
        ];
        let t = ItlTiming {
            hop_us: 0.0,
            per_token_us: 1.0,
            completion_us: 5.0,
        };
        let c = expand(&steps, &runs, &t, Path::new("x")).unwrap();
        let got: Vec<(u64, u32, i64)> = c
            .iter()
            .map(|c| (c.request_id, c.chunk_index, c.timestamp_us))
            .collect();
        assert_eq!(
            got,
            vec![
                (7, 0, 1001),
                (7, 1, 1102),
                (9, 0, 1101),
                (7, 2, 1203),
                (9, 1, 1202),
                (7, 3, 1304),
                (9, 2, 1308),
            ]
        );
        let mut bad = runs.clone();
        bad[0].count = 9;
        let e = expand(&steps, &bad, &t, Path::new("x.itl.csv"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("x.itl.csv") && e.contains("request 9"), "{e}");
    }
}
