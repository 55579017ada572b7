//! SIGINT handling for the REPLs: Ctrl-C stops the current reply instead of killing the process;
//! and a query of a signal's current disposition.

/// Runs `f` (on a watcher thread) every time the process receives SIGINT, instead of the
/// default termination. Uses a self-pipe-free flag polled every 20 ms.
pub fn on_sigint(f: impl Fn() + Send + 'static) {
    static FLAG: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    extern "C" fn handler(_: libc::c_int) {
        FLAG.store(true, std::sync::atomic::Ordering::SeqCst);
    }
    // SAFETY: installs an async-signal-safe handler that only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGINT, handler as *const () as libc::sighandler_t);
    }
    std::thread::spawn(move || loop {
        if FLAG.swap(false, std::sync::atomic::Ordering::SeqCst) {
            f();
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    });
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
