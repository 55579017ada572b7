//! Runs the release binary under an address-space limit (`ulimit -v`, through `sh`): an
//! allocation past the limit fails, which a Rust program turns into an abort (SIGABRT), so a
//! parser whose memory is out of proportion shows up as a signal instead of a slow machine.
#![allow(dead_code)]

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Command;

/// (exit code, signal, stderr) of `cflow-tui args…` limited to `kib` KiB of address space.
pub fn run_limited(
    kib: u64,
    args: &[&dyn AsRef<std::ffi::OsStr>],
) -> (Option<i32>, Option<i32>, String) {
    let o = Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -v {kib} || exit 99; exec \"$@\""))
        .arg("sh")
        .arg(env!("CARGO_BIN_EXE_cflow-tui"))
        .args(args.iter().map(|a| a.as_ref()))
        .output()
        .unwrap();
    assert_ne!(o.status.code(), Some(99), "ulimit -v failed");
    (
        o.status.code(),
        o.status.signal(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// The address space (KiB) the binary needs to print its version: the fixed cost (mappings of
/// the executable and libraries, thread stacks) a limit must add to a per-input budget.
pub fn baseline_kib() -> u64 {
    let _ = Path::new("");
    let mut lo = 16 * 1024u64;
    let mut hi = 4 * 1024 * 1024u64;
    while hi - lo > 8 * 1024 {
        let mid = (lo + hi) / 2;
        let (code, _, _) = run_limited(mid, &[&"--version"]);
        if code == Some(0) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    hi
}
