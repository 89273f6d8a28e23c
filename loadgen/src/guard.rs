//! Reading a response under guard. A panic while one response is read (a
//! defect of this client, or of a library it uses, met on a response it
//! did not expect) becomes that request's error instead of ending the run
//! and losing the requests it completed; and with [`quiet_guarded_panics`]
//! installed, such a panic is said once per process in one line, not as
//! Rust's multi-line panic message per request (a server that answers
//! every request the same way would otherwise bury the run's output).

use std::cell::Cell;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Once;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::FutureExt;

thread_local! {
    /// Whether this thread is polling a guarded future now.
    static GUARDED: Cell<bool> = const { Cell::new(false) };
}

/// Panics caught by [`guarded`] in this process.
static CAUGHT: AtomicU64 = AtomicU64::new(0);

/// How many panics [`guarded`] caught in this process so far.
pub fn caught() -> u64 {
    CAUGHT.load(Ordering::Relaxed)
}

/// Sets [`GUARDED`] for its life (restoring what it was, also when a panic
/// unwinds through it).
struct On(bool);

impl On {
    fn set() -> Self {
        Self(GUARDED.with(|g| g.replace(true)))
    }
}

impl Drop for On {
    fn drop(&mut self) {
        GUARDED.with(|g| g.set(self.0));
    }
}

/// Runs `fut`; a panic while it is polled is returned as its message
/// (one line, at most 200 characters) instead of unwinding further.
///
/// # Errors
/// The panic's message.
pub async fn guarded<F: Future>(fut: F) -> Result<F::Output, String> {
    let mut fut = std::pin::pin!(fut);
    let polled = std::future::poll_fn(|cx| {
        let _on = On::set();
        fut.as_mut().poll(cx)
    });
    AssertUnwindSafe(polled).catch_unwind().await.map_err(|p| {
        CAUGHT.fetch_add(1, Ordering::Relaxed);
        message(p.as_ref())
    })
}

/// A panic's message (a `&str` or `String` payload), on one line of at
/// most 200 characters.
fn message(payload: &(dyn std::any::Any + Send)) -> String {
    let what = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    crate::response::one_line(&what, 200)
}

/// Installs (once) a panic hook under which a panic inside [`guarded`] is
/// said in one line to stderr, the first time only (`warning: ...`, with
/// where it happened); every other panic goes to the hook there was
/// before. `blis-loadgen run` (and `blis-loop`, which runs it) installs
/// it.
pub fn quiet_guarded_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let before = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !GUARDED.with(Cell::get) {
                return before(info);
            }
            static SAID: Once = Once::new();
            SAID.call_once(|| {
                let at = info
                    .location()
                    .map(|l| format!(", at {}:{}", l.file(), l.line()))
                    .unwrap_or_default();
                blis_traces::diag!(
                    "warning: blis-loadgen failed reading a response ({}{at}); a defect of blis-loadgen: such a request is recorded as `malformed` with this message and the run goes on; please report it with the server's response",
                    message(info.payload())
                );
            });
        }));
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panic_while_polled_is_an_error_and_the_flag_is_reset() {
        quiet_guarded_panics();
        let before = caught();
        let r: Result<i32, String> = guarded(async {
            tokio::task::yield_now().await;
            panic!("bad byte at 3")
        })
        .await;
        assert_eq!(r, Err("bad byte at 3".to_string()));
        assert_eq!(caught(), before + 1);
        assert!(!GUARDED.with(Cell::get), "the flag is reset after a panic");
        assert_eq!(guarded(async { 7 }).await, Ok(7));
        assert!(!GUARDED.with(Cell::get));
    }
}
