//! SIGBUS recovery for memory-mapped files. When another process truncates a file we have
//! mapped (or a page of it cannot be read), the kernel answers the next access to a vanished
//! page with SIGBUS, whose default action kills the process. [`watch`] registers a mapping in a
//! fixed lock-free table; the handler (installed with `sigaction(SA_SIGINFO)` on first use:
//! `signal-hook` refuses SIGBUS) looks the fault address up in that table and, when it lies in a
//! registered mapping, maps anonymous zero pages over the rest of the mapping (`MAP_FIXED`, from
//! the faulting page to its end), marks the mapping *changed* and returns: the faulting load is
//! re-executed and reads zeros. The owner polls [`Watch::changed`] and throws away whatever was
//! computed from the mapping (the engine fails the token: "model file changed while it was
//! mapped: reopen it"). A fault anywhere else goes to the handler that was installed before ours
//! (Rust's stack-overflow handler) or gets the default action, exactly as without this module.
//!
//! Everything the handler touches is async-signal-safe: atomics in a static array, `mmap`,
//! `sigaction` and `raise`. A registration is removed before its mapping is unmapped (the owner
//! drops its [`Watch`] first), so the handler never maps over an address range that was reused.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Once, OnceLock};

/// Mappings that can be watched at the same time (more are mapped unprotected).
const SLOTS: usize = 256;
const FREE: u8 = 0;
const BUSY: u8 = 1;
const LIVE: u8 = 2;

struct Slot {
    state: AtomicU8,
    /// Page-aligned start of the mapping.
    start: AtomicUsize,
    /// Length rounded up to whole pages.
    len: AtomicUsize,
    changed: AtomicBool,
    faults: AtomicUsize,
}

impl Slot {
    const fn new() -> Slot {
        Slot {
            state: AtomicU8::new(FREE),
            start: AtomicUsize::new(0),
            len: AtomicUsize::new(0),
            changed: AtomicBool::new(false),
            faults: AtomicUsize::new(0),
        }
    }
}

static TABLE: [Slot; SLOTS] = [const { Slot::new() }; SLOTS];
static PAGE: AtomicUsize = AtomicUsize::new(4096);
/// The SIGBUS action that was installed before ours (None until installed).
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// A registered mapping; dropping it removes the registration (drop it before unmapping).
#[derive(Debug)]
pub struct Watch {
    slot: Option<usize>,
}

impl Watch {
    /// A watch that protects nothing (empty mappings, or the table is full).
    pub fn none() -> Watch {
        Watch { slot: None }
    }

    /// True once a SIGBUS inside the mapping was absorbed (its tail now reads as zeros).
    pub fn changed(&self) -> bool {
        self.slot
            .is_some_and(|i| TABLE[i].changed.load(Ordering::Acquire))
    }

    /// SIGBUS faults absorbed in this mapping so far.
    pub fn faults(&self) -> usize {
        self.slot
            .map_or(0, |i| TABLE[i].faults.load(Ordering::Acquire))
    }

    /// True when faults in the mapping are caught (false: the table was full or the handler could
    /// not be installed; a fault then kills the process as it would without this module).
    pub fn is_protected(&self) -> bool {
        self.slot.is_some() && INSTALLED.load(Ordering::Acquire)
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if let Some(i) = self.slot.take() {
            let s = &TABLE[i];
            s.state.store(BUSY, Ordering::Release);
            s.start.store(0, Ordering::Relaxed);
            s.len.store(0, Ordering::Relaxed);
            s.state.store(FREE, Ordering::Release);
        }
    }
}

/// Registers the mapping `[ptr, ptr + len)` (as returned by `mmap`, page-aligned) and installs
/// the handler on first use.
pub fn watch(ptr: *const u8, len: usize) -> Watch {
    if len == 0 || ptr.is_null() {
        return Watch::none();
    }
    install();
    let page = PAGE.load(Ordering::Relaxed);
    let start = ptr as usize & !(page - 1);
    let end = (ptr as usize).saturating_add(len).div_ceil(page) * page;
    for (i, s) in TABLE.iter().enumerate() {
        if s.state
            .compare_exchange(FREE, BUSY, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            s.start.store(start, Ordering::Relaxed);
            s.len.store(end - start, Ordering::Relaxed);
            s.changed.store(false, Ordering::Relaxed);
            s.faults.store(0, Ordering::Relaxed);
            s.state.store(LIVE, Ordering::Release);
            return Watch { slot: Some(i) };
        }
    }
    Watch::none()
}

fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: sysconf has no memory-safety preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if page > 0 && (page as usize).is_power_of_two() {
            PAGE.store(page as usize, Ordering::Relaxed);
        }
        // SAFETY: both sigaction structs are fully initialised (zeroed, then the handler, flags
        // and an empty mask set); `on_sigbus` has the SA_SIGINFO signature and only performs
        // async-signal-safe operations.
        unsafe {
            let mut new: libc::sigaction = std::mem::zeroed();
            new.sa_sigaction = on_sigbus as *const () as libc::sighandler_t;
            new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut new.sa_mask);
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, &new, &mut old) == 0 {
                let _ = PREVIOUS.set(old);
                INSTALLED.store(true, Ordering::Release);
            }
        }
    });
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo_t to an SA_SIGINFO handler.
    let (addr, code) = unsafe { ((*info).si_addr() as usize, (*info).si_code) };
    // si_code > 0: raised by the kernel for a faulting access (not sent with kill/raise).
    if code > 0 {
        let page = PAGE.load(Ordering::Relaxed);
        for s in TABLE.iter() {
            if s.state.load(Ordering::Acquire) != LIVE {
                continue;
            }
            let start = s.start.load(Ordering::Relaxed);
            let len = s.len.load(Ordering::Relaxed);
            if addr < start || addr - start >= len {
                continue;
            }
            let from = addr & !(page - 1);
            // SAFETY: [from, start + len) lies inside a live registered mapping of this process
            // (its owner holds the registration until after it stops reading, and unregisters
            // before unmapping). Replacing those pages with private anonymous zero pages keeps
            // every pointer into the mapping valid; readers see zeros instead of faulting.
            let r = unsafe {
                libc::mmap(
                    from as *mut libc::c_void,
                    start + len - from,
                    libc::PROT_READ,
                    libc::MAP_FIXED | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if r != libc::MAP_FAILED {
                s.changed.store(true, Ordering::Release);
                s.faults.fetch_add(1, Ordering::AcqRel);
                return;
            }
            break;
        }
    }
    // SAFETY: forwards the handler's own arguments.
    unsafe { not_ours(sig, info, ctx) }
}

/// A SIGBUS we do not handle: the previous handler, else the default action.
///
/// # Safety
/// Called only from the signal handler with the arguments the kernel passed to it.
unsafe fn not_ours(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    if let Some(old) = PREVIOUS.get() {
        let h = old.sa_sigaction;
        if h != libc::SIG_DFL && h != libc::SIG_IGN {
            if old.sa_flags & libc::SA_SIGINFO != 0 {
                // SAFETY: an SA_SIGINFO handler has exactly this signature.
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    unsafe { std::mem::transmute(h) };
                f(sig, info, ctx);
            } else {
                // SAFETY: a plain handler takes the signal number.
                let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(h) };
                f(sig);
            }
            return;
        }
    }
    // SAFETY: a zeroed sigaction with SIG_DFL is valid; sigaction and raise are
    // async-signal-safe. Returning re-executes a faulting access, which now gets the default
    // action; a SIGBUS that was sent (si_code <= 0) is raised again (it is blocked until return).
    unsafe {
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        libc::sigemptyset(&mut dfl.sa_mask);
        libc::sigaction(libc::SIGBUS, &dfl, std::ptr::null_mut());
        if (*info).si_code <= 0 {
            libc::raise(sig);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn four_page_file() -> (tempfile::NamedTempFile, usize) {
        let page = {
            install();
            PAGE.load(Ordering::Relaxed)
        };
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&vec![7u8; 4 * page]).unwrap();
        f.flush().unwrap();
        (f, page)
    }

    #[test]
    fn a_fault_in_a_watched_mapping_reads_zeros_and_sets_the_flag() {
        let (f, page) = four_page_file();
        let map = crate::format::mmap::ModelMap::open(f.path()).unwrap();
        assert!(map.watch().is_protected());
        assert_eq!(map[3 * page], 7);
        assert!(!map.watch().changed());
        f.as_file().set_len(page as u64).unwrap();
        // Page 0 is still backed by the file; page 2 vanished.
        assert_eq!(map[10], 7);
        let v = std::hint::black_box(&map[..])[2 * page + 5];
        assert_eq!(v, 0);
        assert!(map.watch().changed());
        assert_eq!(map.watch().faults(), 1);
        // The rest of the mapping was replaced in one go: no further faults.
        assert_eq!(std::hint::black_box(&map[..])[4 * page - 1], 0);
        assert_eq!(map.watch().faults(), 1);
    }

    #[test]
    fn importer_inputs_are_watched_too() {
        let (f, page) = four_page_file();
        let m = crate::format::mmap::MappedInput::open(f.path()).unwrap();
        assert!(!m.changed());
        f.as_file().set_len(0).unwrap();
        assert_eq!(std::hint::black_box(m.bytes())[page + 1], 0);
        assert!(m.changed());
    }

    #[test]
    fn dropping_a_watch_frees_its_slot() {
        let buf = vec![0u8; 8192];
        let w = watch(buf.as_ptr(), buf.len());
        let i = w.slot.expect("a free slot");
        let start = TABLE[i].start.load(Ordering::Relaxed);
        assert_eq!(TABLE[i].state.load(Ordering::Acquire), LIVE);
        drop(w);
        // Another test may have reused the slot since, but never for this range.
        let s = &TABLE[i];
        assert!(
            s.state.load(Ordering::Acquire) != LIVE || s.start.load(Ordering::Relaxed) != start
        );
        assert!(!watch(std::ptr::null(), 10).is_protected());
        assert!(!watch(buf.as_ptr(), 0).is_protected());
    }

    /// A fault outside every watched mapping still kills the process with SIGBUS (checked in a
    /// child process: this test binary re-runs itself with `CFLOW_SIGBUS_CHILD` set).
    #[test]
    fn a_fault_elsewhere_keeps_the_default_action() {
        if std::env::var_os("CFLOW_SIGBUS_CHILD").is_some() {
            install();
            let page = PAGE.load(Ordering::Relaxed);
            // An unnamed file: this process dies by SIGBUS, so a named one would stay behind.
            let mut f = tempfile::tempfile().unwrap();
            f.write_all(&vec![7u8; 4 * page]).unwrap();
            // SAFETY: test-only raw map of a file we then truncate, to provoke a real SIGBUS
            // outside any registration.
            let m = unsafe { memmap2::Mmap::map(&f) }.unwrap();
            f.set_len(0).unwrap();
            let v = std::hint::black_box(&m[..])[2 * page];
            println!("survived {v}");
            std::process::exit(0);
        }
        let exe = std::env::current_exe().unwrap();
        let out = std::process::Command::new(exe)
            .args([
                "--exact",
                "format::sigbus::tests::a_fault_elsewhere_keeps_the_default_action",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("CFLOW_SIGBUS_CHILD", "1")
            .output()
            .unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            out.status.signal(),
            Some(libc::SIGBUS),
            "{:?} {}",
            out.status,
            String::from_utf8_lossy(&out.stdout)
        );
    }
}
