//! Fault injection: SIGINT / SIGTERM while `cflow-tui run --record` is generating.
//!
//! `run` installs no handler: the default action ends the process, reported as "killed by
//! signal" (a shell shows exit status 128 + signo: 130 for SIGINT, 143 for SIGTERM). Nothing is
//! lost: the recorder writes and flushes one complete line per event, so the trace on disk
//! replays up to the last event before the signal (no `done` event; at most a cut last line,
//! which the replay reader tolerates).

mod common;

use cflow::telemetry::replay::Replay;
use cflow::telemetry::Event;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_cflow-tui");

fn tiny_model(dir: &Path) -> PathBuf {
    common::tiny_model(dir, "200000")
}

fn lines(p: &Path) -> usize {
    std::fs::read(p)
        .map(|b| b.iter().filter(|&&c| c == b'\n').count())
        .unwrap_or(0)
}

fn signal_during_record(sig: i32) {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let trace = dir.path().join("t.jsonl");
    let mut child = Command::new(BIN)
        .arg("run")
        .arg(&model)
        .args([
            "--token-ids",
            "1,2,3",
            "-n",
            "150000",
            "--ignore-eos",
            "--threads",
            "1",
        ])
        .arg("--record")
        .arg(&trace)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Wait until a few dozen events are on disk.
    let t0 = Instant::now();
    while lines(&trace) < 40 {
        assert!(t0.elapsed() < Duration::from_secs(30), "no progress");
        if let Some(st) = child.try_wait().unwrap() {
            panic!("run ended early: {st}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let rc = send_signal(child.id(), sig);
    assert_eq!(rc, 0);
    let st = child.wait().unwrap();
    if sig == libc::SIGINT {
        // `run` handles SIGINT: stops within one layer, finishes the trace, exits 130.
        assert_eq!(st.code(), Some(130), "{st}");
    } else {
        assert_eq!(st.signal(), Some(sig), "{st}");
    }
    let before = lines(&trace);
    let r = Replay::open(&trace).expect("trace readable after the signal");
    assert!(r.warnings.len() <= 1, "{:?}", r.warnings);
    assert!(
        r.events.len() + 1 >= before.min(40),
        "{} events",
        r.events.len()
    );
    assert!(r
        .events
        .iter()
        .any(|e| matches!(e.event, Event::Token { .. })));
}

/// Through `kill(1)`, so the test needs no `unsafe`.
fn send_signal(pid: u32, sig: i32) -> i32 {
    let st = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .unwrap();
    if st.success() {
        0
    } else {
        1
    }
}

#[test]
fn sigint_during_run_record_keeps_the_trace() {
    signal_during_record(libc::SIGINT);
}

#[test]
fn sigterm_during_run_record_keeps_the_trace() {
    signal_during_record(libc::SIGTERM);
}
