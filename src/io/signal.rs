//! SIGINT handling for the REPLs: Ctrl-C stops the current reply instead of killing the process;
//! and a query of a signal's current disposition.

use signal_hook::iterator::Signals;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set once SIGINT is handled by [`on_sigint`]: the temporary-file watcher of `output` then
/// lets SIGINT pass instead of ending the process (signal-hook runs every handler registered for
/// a signal, in any order).
static SIGINT_TAKEN: AtomicBool = AtomicBool::new(false);

/// Runs `f` (on a watcher thread, `signal-hook`'s iterator) every time the process receives
/// SIGINT, instead of the default termination. If the handler cannot be installed, says so on
/// stderr and leaves Ctrl-C ending the process.
pub fn on_sigint(f: impl Fn() + Send + 'static) {
    let mut signals = match Signals::new([libc::SIGINT]) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("warning: cannot handle Ctrl-C ({e}); it will end the process");
            return;
        }
    };
    SIGINT_TAKEN.store(true, Ordering::SeqCst);
    let spawned = std::thread::Builder::new()
        .name("cflow-sigint".into())
        .spawn(move || {
            for _ in signals.forever() {
                f();
            }
        });
    if let Err(e) = spawned {
        eprintln!("warning: cannot watch for Ctrl-C ({e})");
    }
}

/// Whether [`on_sigint`] handles SIGINT in this process.
pub fn sigint_taken() -> bool {
    SIGINT_TAKEN.load(Ordering::SeqCst)
}

/// Whether `sig` currently has its default disposition (not ignored, no handler installed).
pub fn has_default_action(sig: libc::c_int) -> bool {
    // SAFETY: a zeroed `sigaction` is a valid out-parameter; with a null `act`, sigaction only
    // reads the current disposition into `old`.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_DFL
    }
}

/// Whether `sig` is ignored (`SIG_IGN`, e.g. inherited from `nohup` or a parent).
pub fn is_ignored(sig: libc::c_int) -> bool {
    // SAFETY: as in `has_default_action`: sigaction only reads the disposition into `old`.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN
    }
}
