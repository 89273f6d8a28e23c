//! Evolved-code routing (`../shared/design/policy-optimization-design.md`,
//! "Type 2: evolved code"): a routing function written in Rhai (an
//! embedded scripting language, <https://rhai.rs>), the kind of program an
//! LLM writes and an evolutionary search (OpenEvolve, GEPA) mutates.
//!
//! ```yaml
//! routing:
//!   policy: code
//!   source: |
//!     fn route(request, instances) {
//!       let best = 0;
//!       for i in 1..instances.len() {
//!         if instances[i].load < instances[best].load { best = i; }
//!       }
//!       best
//!     }
//! ```
//!
//! `route(request, instances)` is called once per decision. `request` is a
//! map: `input_tokens`, `prompt_blocks`, `slo_class`, `tenant`, `decision`
//! (0, 1, 2 ... in decision order). `instances` is an array of maps, one per
//! instance: `waiting`, `running`, `in_flight`, `load` (waiting + running +
//! in flight), `kv_usage` (0..1), `prefix_match` (share of the prompt's
//! blocks in the router's index of the instance, 0..1), `available`
//! (false: an autoscaled replica not ready). It returns the chosen
//! instance's index, or an array of one score per instance (the best
//! available one wins, ties to the lowest index).
//!
//! The program is hostile input: it is compiled when the bundle is read (a
//! syntax error names the line), and each call runs with a budget of
//! `max_operations` operations (default 100,000), bounded call depth,
//! string, array and map sizes (nested values count in full, `this`
//! included), no clock, no modules, no files and no network (the engine
//! has none). The operations do not count the work inside one operation
//! (copying a large nested array is one), so the host also stops a call
//! after [`MAX_CALL_MS`] of wall time, and a program whose calls average
//! more than [`SLOW_CALL_MS`] once they add up to [`SLOW_TOTAL_S`]. A call that exceeds a bound, throws,
//! returns something else than an index or scores, an index that is out of
//! range or unavailable, or a score that is not a number fails the
//! evaluation with that reason; the simulation then finishes without
//! calling it again (each later decision is least-loaded's) and the run
//! ends with the error. It never hangs or crashes the simulator.

use rhai::{AST, Dynamic, Engine, Map};

use crate::cluster::error::PolicyError;
use crate::cluster::signals::{InstanceView, RequestSignals};

/// The default budget of one call, Rhai operations.
pub const DEFAULT_MAX_OPERATIONS: u64 = 100_000;

/// [`DEFAULT_MAX_OPERATIONS`], the default of every policy's
/// `max_operations`.
pub fn default_max_operations() -> u64 {
    DEFAULT_MAX_OPERATIONS
}

/// A compiled program of one policy kind with its sandboxed engine and
/// its state: the map `this` refers to in the program, kept from one call
/// to the next (a bucket's level, a counter), bounded like any map.
pub struct Program {
    engine: Engine,
    ast: AST,
    calls: u64,
    kind: &'static str,
    function: &'static str,
    state: Dynamic,
    watchdog: Watchdog,
    /// Wall time spent in calls so far.
    spent: std::time::Duration,
    /// [`MAX_CALL_MS`], [`SLOW_CALL_MS`] and [`SLOW_TOTAL_S`] (in ms).
    limits: (u64, u64, u64),
}

impl std::fmt::Debug for Program {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Program")
            .field("kind", &self.kind)
            .field("calls", &self.calls)
            .finish()
    }
}

impl Clone for Program {
    fn clone(&self) -> Self {
        let watchdog = Watchdog::new();
        Self {
            engine: sandbox(self.engine.max_operations(), &watchdog),
            ast: self.ast.clone(),
            calls: self.calls,
            kind: self.kind,
            function: self.function,
            state: self.state.clone(),
            watchdog,
            spent: self.spent,
            limits: self.limits,
        }
    }
}

/// A compiled routing program.
#[derive(Debug, Clone)]
pub struct CodeRouter {
    program: Program,
}

/// The longest one call may run, ms of wall time: the budget of
/// operations does not count the work inside one operation (copying a
/// nested array is one operation however large it is), so a program can
/// stay within its operations and still take seconds; the host stops it.
/// Well-behaved calls take microseconds.
pub const MAX_CALL_MS: u64 = 1000;

/// A program whose calls average more than this, ms, once they add up to
/// [`SLOW_TOTAL_S`], fails: each call within [`MAX_CALL_MS`], the run
/// would still take hours.
pub const SLOW_CALL_MS: u64 = 10;

/// See [`SLOW_CALL_MS`], s.
pub const SLOW_TOTAL_S: u64 = 10;

/// The watchdog of one engine: the deadline of the call in progress, ns
/// since `base`. (The program itself has no clock: this is the host's.)
#[derive(Debug, Clone)]
struct Watchdog {
    base: std::time::Instant,
    deadline_ns: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl Watchdog {
    fn new() -> Self {
        Self {
            base: std::time::Instant::now(),
            deadline_ns: std::sync::Arc::new(std::sync::atomic::AtomicU64::new(u64::MAX)),
        }
    }

    fn now_ns(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// A call starts now: it may run `limit_ms` from now.
    fn arm(&self, limit_ms: u64) {
        let d = self.now_ns().saturating_add(limit_ms * 1_000_000);
        self.deadline_ns
            .store(d, std::sync::atomic::Ordering::Relaxed);
    }

    fn expired(&self) -> bool {
        self.now_ns() > self.deadline_ns.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// What the watchdog's termination carries, to tell it from a bound.
const TIMED_OUT: &str = "blis: call past its time limit";

/// An engine with nothing outside the program: no printing, no clock
/// (`no_time`), no modules (`no_module`), and bounded work, sizes and
/// time (`watchdog`).
fn sandbox(max_operations: u64, watchdog: &Watchdog) -> Engine {
    let mut e = Engine::new();
    let w = watchdog.clone();
    e.on_progress(move |ops| (ops % 64 == 0 && w.expired()).then(|| Dynamic::from(TIMED_OUT)));
    e.set_max_operations(max_operations);
    e.set_max_call_levels(32);
    e.set_max_expr_depths(64, 32);
    e.set_max_string_size(16 * 1024);
    e.set_max_array_size(16 * 1024);
    e.set_max_map_size(1024);
    e.set_max_variables(1024);
    e.set_max_functions(256);
    e.on_print(|_| {});
    e.on_debug(|_, _, _| {});
    e
}

/// Why a call of a program failed.
#[derive(Debug, Clone, PartialEq)]
pub struct CallError {
    /// The policy kind (`routing`, `admission`, `priority`, `scheduling`,
    /// `autoscaling`).
    pub kind: &'static str,
    /// Which decision of that policy (0-based).
    pub decision: u64,
    /// What went wrong.
    pub problem: String,
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} code failed at decision {}: {}",
            self.kind, self.decision, self.problem
        )
    }
}

impl Program {
    /// Compiles `code` (at `field`, e.g. `admission`) for policy `kind`,
    /// which must define `function` with `params` parameters.
    ///
    /// # Errors
    /// [`PolicyError::Tree`] naming the field: a syntax error with its
    /// line, no such function, or a zero budget.
    pub fn compile(
        source: &str,
        max_operations: u64,
        field: &str,
        kind: &'static str,
        function: &'static str,
        params: &[&str],
    ) -> Result<Self, PolicyError> {
        let bad = |path: &str, problem: String| PolicyError::Tree {
            path: format!("{field}.{path}"),
            problem,
        };
        if max_operations == 0 {
            return Err(bad("max_operations", "must be at least 1".into()));
        }
        let watchdog = Watchdog::new();
        let engine = sandbox(max_operations, &watchdog);
        let ast = engine
            .compile(source)
            .map_err(|e| bad("source", e.to_string()))?;
        if !ast
            .iter_functions()
            .any(|f| f.name == function && f.params.len() == params.len())
        {
            return Err(bad(
                "source",
                format!("defines no fn {function}({})", params.join(", ")),
            ));
        }
        Ok(Self {
            engine,
            ast,
            calls: 0,
            kind,
            function,
            state: Dynamic::from_map(Map::new()),
            watchdog,
            spent: std::time::Duration::ZERO,
            limits: (MAX_CALL_MS, SLOW_CALL_MS, SLOW_TOTAL_S * 1000),
        })
    }

    /// Calls the program once with `args`, `this` bound to its state: the
    /// value it returned and the decision's number, or why the call failed.
    ///
    /// # Errors
    /// [`CallError`]: a bound exceeded, an error thrown, the engine
    /// panicking.
    pub fn call(&mut self, args: impl rhai::FuncArgs) -> Result<(Dynamic, u64), CallError> {
        let decision = self.calls;
        self.calls += 1;
        let mut scope = rhai::Scope::new();
        let (engine, ast, function) = (&self.engine, &self.ast, self.function);
        let state = &mut self.state;
        let started = std::time::Instant::now();
        let (max_call_ms, slow_call_ms, slow_total_ms) = self.limits;
        self.watchdog.arm(max_call_ms);
        let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let options = rhai::CallFnOptions::new().bind_this_ptr(state);
            engine.call_fn_with_options::<Dynamic>(options, &mut scope, ast, function, args)
        }));
        self.spent += started.elapsed();
        let out = out
            .map_err(|_| self.fail(decision, "the script engine panicked".into()))?
            .map_err(|e| {
                self.fail(
                    decision,
                    describe(&e, self.engine.max_operations(), max_call_ms),
                )
            })?;
        if self.spent.as_millis() >= u128::from(slow_total_ms)
            && self.spent.as_millis() > u128::from(slow_call_ms) * u128::from(self.calls)
        {
            return Err(self.fail(
                decision,
                format!(
                    "its calls average {:.0} ms of wall time, more than {slow_call_ms} ms (over {} calls): too slow to finish a run",
                    self.spent.as_secs_f64() * 1e3 / self.calls as f64,
                    self.calls
                ),
            ));
        }
        Ok((out, decision))
    }

    /// A failure of decision `decision`.
    pub fn fail(&self, decision: u64, problem: String) -> CallError {
        CallError {
            kind: self.kind,
            decision,
            problem,
        }
    }

    /// A number the program returned (an integer or a float), finite.
    ///
    /// # Errors
    /// Anything else, described.
    pub fn number(&self, decision: u64, what: &str, v: &Dynamic) -> Result<f64, CallError> {
        let x = v
            .as_float()
            .or_else(|_| v.as_int().map(|i| i as f64))
            .map_err(|t| self.fail(decision, format!("{what} is a {t}, not a number")))?;
        if x.is_finite() {
            Ok(x)
        } else {
            Err(self.fail(decision, format!("{what} is {x}")))
        }
    }
}

impl CodeRouter {
    /// Compiles `source` with a budget of `max_operations` per call (at
    /// `field`, e.g. `routing`).
    ///
    /// # Errors
    /// [`PolicyError::Tree`] naming the field: a syntax error with its
    /// line, no `route` function of two parameters, or a zero budget.
    pub fn compile(source: &str, max_operations: u64, field: &str) -> Result<Self, PolicyError> {
        Ok(Self {
            program: Program::compile(
                source,
                max_operations,
                field,
                "routing",
                "route",
                &["request", "instances"],
            )?,
        })
    }

    /// Calls the program for one decision: the chosen instance, or why the
    /// call failed. `prefix_match[i]` is instance `i`'s share of the
    /// prompt's blocks in the router's index.
    ///
    /// # Errors
    /// [`CallError`]: a bound exceeded, an error thrown, or a result that
    /// is not an available instance's index or one number per instance.
    pub fn choose(
        &mut self,
        views: &[InstanceView],
        prefix_match: &[f64],
        prompt_blocks: usize,
        req: &RequestSignals<'_>,
    ) -> Result<usize, CallError> {
        let decision = self.program.calls;
        let mut r = request_map(req);
        r.insert(
            "prompt_blocks".into(),
            Dynamic::from_int(prompt_blocks as i64),
        );
        r.insert("decision".into(), Dynamic::from_int(decision as i64));
        let insts: rhai::Array = views
            .iter()
            .zip(prefix_match)
            .map(|(v, &m)| {
                let mut x = Map::new();
                x.insert("waiting".into(), Dynamic::from_int(i64::from(v.waiting)));
                x.insert("running".into(), Dynamic::from_int(i64::from(v.running)));
                x.insert(
                    "in_flight".into(),
                    Dynamic::from_int(i64::from(v.in_flight)),
                );
                x.insert("load".into(), Dynamic::from_int(v.load() as i64));
                x.insert("kv_usage".into(), Dynamic::from_float(v.kv_usage));
                x.insert("prefix_match".into(), Dynamic::from_float(m));
                x.insert("available".into(), Dynamic::from_bool(!v.unavailable));
                Dynamic::from_map(x)
            })
            .collect();
        let (out, decision) = self.program.call((Dynamic::from_map(r), insts))?;
        let p = &self.program;
        let fail = |problem: String| p.fail(decision, problem);
        let n = views.len();
        let chosen = if let Ok(i) = out.as_int() {
            usize::try_from(i)
                .ok()
                .filter(|&i| i < n)
                .ok_or_else(|| fail(format!("returned instance {i}, not in 0..{n}")))?
        } else if out.is_array() {
            let scores = out.into_array().expect("an array");
            if scores.len() != n {
                return Err(fail(format!(
                    "returned {} scores for {n} instances",
                    scores.len()
                )));
            }
            let mut best: Option<(usize, f64)> = None;
            for (i, s) in scores.iter().enumerate() {
                let x = p.number(decision, &format!("score {i}"), s)?;
                if !views[i].unavailable && best.is_none_or(|(_, b)| x > b) {
                    best = Some((i, x));
                }
            }
            best.ok_or_else(|| fail("no instance is available".into()))?
                .0
        } else {
            return Err(fail(format!(
                "returned a {}, not an instance index or an array of scores",
                out.type_name()
            )));
        };
        if views[chosen].unavailable {
            return Err(fail(format!(
                "chose instance {chosen}, which is not available"
            )));
        }
        Ok(chosen)
    }
}

/// The request as a program sees it: `input_tokens`, `slo_class`,
/// `tenant`.
pub fn request_map(req: &RequestSignals<'_>) -> Map {
    let mut r = Map::new();
    r.insert(
        "input_tokens".into(),
        Dynamic::from_int(i64::from(req.input_tokens)),
    );
    r.insert("slo_class".into(), Dynamic::from(req.slo_class.to_string()));
    r.insert("tenant".into(), Dynamic::from(req.tenant.to_string()));
    r
}

/// What went wrong in a call, on one line, the bounds named.
fn describe(e: &rhai::EvalAltResult, max_operations: u64, max_call_ms: u64) -> String {
    use rhai::EvalAltResult as E;
    match e {
        E::ErrorTooManyOperations(_) => format!(
            "ran past its budget of {max_operations} operations in one call (max_operations; an endless loop?)"
        ),
        E::ErrorDataTooLarge(what, _) => {
            format!(
                "{what} too large (strings and arrays are limited to 16,384, maps to 1,024 entries)"
            )
        }
        E::ErrorStackOverflow(_) => "calls nested deeper than 32".into(),
        E::ErrorTerminated(token, _)
            if token.clone().into_string().ok().as_deref() == Some(TIMED_OUT) =>
        {
            format!(
                "ran past its time limit of {max_call_ms} ms of wall time in one call (copying large data in a loop?)"
            )
        }
        other => one_line(&other.to_string()),
    }
}

/// An engine's message on one line.
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn router(src: &str, ops: u64) -> Result<CodeRouter, PolicyError> {
        CodeRouter::compile(src, ops, "routing")
    }

    fn call(src: &str) -> Result<usize, CallError> {
        let views = [InstanceView::default(); 3];
        router(src, 10_000)
            .unwrap()
            .choose(&views, &[0.0; 3], 4, &RequestSignals::default())
    }

    /// State kept in `this` from call to call is bounded like any value:
    /// a program that piles data into it fails as soon as a call finds it
    /// past the limit, not by exhausting memory; small state carries over.
    #[test]
    fn state_across_calls_is_kept_and_bounded() {
        let views = [InstanceView::default(); 3];
        let mut r = router(
            "fn route(r, xs) { if this.n == () { this.n = 0; } this.n += 1; this.n % 3 }",
            10_000,
        )
        .unwrap();
        let picks: Vec<usize> = (0..4)
            .map(|_| {
                r.choose(&views, &[0.0; 3], 4, &RequestSignals::default())
                    .unwrap()
            })
            .collect();
        assert_eq!(picks, [1, 2, 0, 1]);
        let mut r = router(
            "fn route(r, xs) { let b = []; b.pad(10000, 1); if this.n == () { this.n = 0; } this.n += 1; this[\"k\" + this.n] = b; 0 }",
            100_000,
        )
        .unwrap();
        let mut call = || r.choose(&views, &[0.0; 3], 4, &RequestSignals::default());
        // (The state is checked as a call reads it: the call after the one
        // that crossed the limit fails.)
        assert_eq!(call().unwrap(), 0);
        assert_eq!(call().unwrap(), 0);
        let e = call().unwrap_err().to_string();
        assert!(
            e.contains("decision 2") && e.to_lowercase().contains("too large"),
            "{e}"
        );
    }

    /// Work the budget of operations does not count (copying a deeply
    /// nested array is one operation) is stopped by the wall-time
    /// watchdog: a call past its limit, or calls that average too long.
    #[test]
    fn a_program_too_slow_for_its_operations_is_stopped() {
        let views = [InstanceView::default(); 3];
        const NESTS: &str =
            "fn route(r, xs) { let a = []; for i in 0..N { a = [a]; } this.a = a; 0 }";
        let mut r = router(&NESTS.replace('N', "16000"), 100_000).unwrap();
        r.program.limits = (200, 10, 10_000);
        let t = std::time::Instant::now();
        let e = r
            .choose(&views, &[0.0; 3], 4, &RequestSignals::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("decision 0: ran past its time limit of 200 ms"),
            "{e}"
        );
        // (Without the watchdog this call runs for minutes.)
        assert!(t.elapsed().as_secs() < 60);
        let mut r = router(&NESTS.replace('N', "800"), 100_000).unwrap();
        r.program.limits = (60_000, 0, 1);
        let e = (0..10)
            .find_map(|_| {
                r.choose(&views, &[0.0; 3], 4, &RequestSignals::default())
                    .err()
            })
            .expect("a slow program fails")
            .to_string();
        assert!(e.contains("too slow to finish a run"), "{e}");
    }

    #[test]
    fn a_program_chooses_by_index_or_by_scores() {
        assert_eq!(call("fn route(r, xs) { 2 }").unwrap(), 2);
        assert_eq!(call("fn route(r, xs) { [0.1, 0.9, 0.9] }").unwrap(), 1);
        assert_eq!(call("fn route(r, xs) { [1, 3, 2] }").unwrap(), 1);
    }

    #[test]
    fn every_failure_is_a_clear_error_not_a_hang_or_a_crash() {
        // Syntax error, named with its line; no route function.
        let e = router("fn route(r, xs) {\n  let x = ;\n}", 100)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("routing.source:") && e.contains("line 2"),
            "{e}"
        );
        let e = router("fn other() { 1 }", 100).unwrap_err().to_string();
        assert!(e.contains("defines no fn route"), "{e}");
        // An endless loop stops at the budget.
        let e = call("fn route(r, xs) { loop { } }")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("decision 0: ran past its budget of 10000 operations"),
            "{e}"
        );
        // Unbounded allocation stops at the size limits.
        let e = call("fn route(r, xs) { let s = \"x\"; loop { s += s; } }")
            .unwrap_err()
            .to_string();
        assert!(
            e.to_lowercase().contains("too large") || e.contains("size"),
            "{e}"
        );
        let e = call("fn route(r, xs) { let a = []; loop { a += a; a.push(1); } }")
            .unwrap_err()
            .to_string();
        assert!(
            e.to_lowercase().contains("too large") || e.contains("size"),
            "{e}"
        );
        // Deep recursion stops at the call depth.
        let e = call("fn f(n) { f(n + 1) } fn route(r, xs) { f(0) }")
            .unwrap_err()
            .to_string();
        assert!(e.contains("decision 0: calls nested deeper than 32"), "{e}");
        // A thrown error, a bad index, a NaN score, the wrong result.
        assert!(
            call("fn route(r, xs) { throw \"no idea\" }")
                .unwrap_err()
                .to_string()
                .contains("no idea")
        );
        assert!(
            call("fn route(r, xs) { 7 }")
                .unwrap_err()
                .to_string()
                .contains("returned instance 7, not in 0..3")
        );
        assert!(
            call("fn route(r, xs) { -1 }")
                .unwrap_err()
                .to_string()
                .contains("not in 0..3")
        );
        assert!(
            call("fn route(r, xs) { [0.0, 0.0 / 0.0, 1.0] }")
                .unwrap_err()
                .to_string()
                .contains("score 1 is NaN")
        );
        assert!(
            call("fn route(r, xs) { [1.0] }")
                .unwrap_err()
                .to_string()
                .contains("1 scores for 3 instances")
        );
        assert!(
            call("fn route(r, xs) { \"zero\" }")
                .unwrap_err()
                .to_string()
                .contains("not an instance index")
        );
        assert!(
            call("fn route(r, xs) { xs[9].load }")
                .unwrap_err()
                .to_string()
                .contains("decision 0")
        );
        // No clock, no files, no modules.
        assert!(
            router("fn route(r, xs) { timestamp(); 0 }", 100).is_err()
                || call("fn route(r, xs) { timestamp(); 0 }").is_err()
        );
        assert!(router("import \"os\" as os; fn route(r, xs) { 0 }", 100).is_err());
    }
}
