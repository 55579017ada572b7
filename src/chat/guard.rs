//! Catching library panics at the tokenizer boundary.
//!
//! Owns [`guarded`]: runs a closure that calls into a third-party library known to panic on
//! hostile input (the `onig` crate behind `tokenizers` panics with `retry-limit-in-match over`
//! when a regex backtracks too much) and turns a panic into an `Err` with the panic message.
//! The panic message is kept off stderr (it would garble the TUI): a process-wide panic hook,
//! installed once, stays quiet while the current thread is inside `guarded`. Panic hooks
//! installed later (the TUI's) ask [`quiet`] first.

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Once;

thread_local! {
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

static HOOK: Once = Once::new();

/// Whether the current thread is inside [`guarded`] (a panic here is caught and reported as an
/// error, so panic hooks should not print it or treat it as fatal).
pub fn quiet() -> bool {
    DEPTH.with(|d| d.get() > 0)
}

fn install_hook() {
    HOOK.call_once(|| {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !quiet() {
                prev(info);
            }
        }));
    });
}

fn message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic with a non-string payload".to_string()
    }
}

/// Run `f`; a panic inside becomes `Err(panic message)`.
pub fn guarded<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    install_hook();
    struct Depth;
    impl Drop for Depth {
        fn drop(&mut self) {
            DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
        }
    }
    DEPTH.with(|d| d.set(d.get() + 1));
    let _depth = Depth;
    catch_unwind(AssertUnwindSafe(f)).map_err(|p| message(p.as_ref()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_an_error_and_the_thread_goes_on() {
        assert_eq!(guarded(|| 7), Ok(7));
        let e = guarded(|| -> u32 { panic!("retry-limit-in-match over") }).unwrap_err();
        assert_eq!(e, "retry-limit-in-match over");
        let e = guarded(|| -> u32 { panic!("{}", String::from("owned")) }).unwrap_err();
        assert_eq!(e, "owned");
        assert!(!quiet());
        assert_eq!(guarded(|| guarded(|| 1)), Ok(Ok(1)));
    }
}
