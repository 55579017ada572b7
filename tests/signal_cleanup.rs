//! Issue 44, class 6: every catchable terminating signal (here SIGQUIT, SIGUSR1, SIGUSR2,
//! SIGALRM, SIGVTALRM) during a long write (`gen` of the ~66 MB demo model) removes the hidden
//! temporary file before the process dies of the signal. Before, only SIGINT, SIGTERM, SIGHUP
//! and SIGXFSZ did; the others left `.big.cflow.XXXXXX.tmp` behind.

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_cflow-tui");

fn listing(d: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn signal_during_gen(sig: i32) {
    let d = tempfile::tempdir().unwrap();
    // `exec` keeps the pid; no core file for SIGQUIT.
    let mut child = Command::new("sh")
        .arg("-c")
        .arg("ulimit -c 0; exec \"$@\"")
        .arg("sh")
        .arg(BIN)
        .args(["gen", "--arch", "arch2_4_combined", "-o", "big.cflow"])
        .current_dir(d.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while listing(d.path()).is_empty() {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no temporary file appeared"
        );
        if let Some(st) = child.try_wait().unwrap() {
            panic!("gen ended early: {st}");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    std::thread::sleep(Duration::from_millis(200));
    assert!(Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(child.id().to_string())
        .status()
        .unwrap()
        .success());
    let st = child.wait().unwrap();
    if st.success() {
        eprintln!("note: gen finished before signal {sig} arrived");
        assert_eq!(listing(d.path()), vec!["big.cflow"]);
        return;
    }
    assert_eq!(st.signal(), Some(sig), "{st}");
    assert_eq!(
        listing(d.path()),
        Vec::<String>::new(),
        "signal {sig}: temporary file left behind"
    );
}

#[test]
fn terminating_signals_during_a_write_leave_no_temporary_file() {
    for sig in [
        libc::SIGQUIT,
        libc::SIGUSR1,
        libc::SIGUSR2,
        libc::SIGALRM,
        libc::SIGVTALRM,
    ] {
        signal_during_gen(sig);
    }
}
