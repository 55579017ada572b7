//! Fault injection: disk full while recording, generating (the `.cflow` writer used by `gen`,
//! `import` and conversion) and importing.
//!
//! In-process cases use a writer that fails with ENOSPC after N bytes, and `/dev/full`.
//! End-to-end cases run the binary against a 64 KiB tmpfs (we are root in CI); when mounting is
//! not permitted they fall back to `ulimit -f` with SIGXFSZ ignored (writes then fail with
//! EFBIG), and SKIP if neither works.

mod common;

use cflow::telemetry::recorder::{Recorder, SessionClock, TraceHeader};
use cflow::telemetry::replay::Replay;
use cflow::telemetry::{EngineConfigInfo, Event, ModelSummary};
use std::cell::RefCell;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::rc::Rc;

const BIN: &str = env!("CARGO_BIN_EXE_cflow-tui");

/// Accepts `room` bytes, then fails like a full disk (a short write first, as the kernel does).
struct FullAfter {
    buf: Rc<RefCell<Vec<u8>>>,
    room: usize,
}

impl Write for FullAfter {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        let mut buf = self.buf.borrow_mut();
        let left = self.room - buf.len();
        if left == 0 {
            return Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
        }
        let n = b.len().min(left);
        buf.extend_from_slice(&b[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn header() -> TraceHeader {
    let config = EngineConfigInfo {
        threads: 1,
        isa: "scalar".into(),
        prefetch: false,
        weights: "mmap".into(),
        repacked: false,
        readers: 1,
        fetch: cflow::engine::FetchMode::Staged,
        expert_tier: cflow::engine::ExpertTier::Mmap,
        layout: cflow::engine::Layout::Cflow,
        layouts_available: vec![cflow::engine::Layout::Cflow],
        notes: vec![],
    };
    TraceHeader::new(ModelSummary::default(), config, None)
}

#[test]
fn recorder_keeps_every_complete_line_before_enospc() {
    let clock = SessionClock::start();
    // Find the header size, then give room for the header plus a few events and a half line.
    let mut probe = Recorder::from_writer(Vec::new(), "probe", header()).unwrap();
    probe
        .record(&clock.stamp(Event::Notice {
            message: "x".repeat(100),
        }))
        .unwrap();
    let w = probe.finish().unwrap();
    let head = w.iter().position(|&b| b == b'\n').unwrap() + 1;
    let line = w.len() - head;
    for room in [head + 3 * line + line / 2, head + 5 * line, head + 1] {
        let disk = Rc::new(RefCell::new(Vec::new()));
        let sink = FullAfter {
            buf: disk.clone(),
            room,
        };
        let mut rec = Recorder::from_writer(sink, "full", header()).unwrap();
        let mut ok = 0u64;
        let mut failed = None;
        for _ in 0..20 {
            match rec.record(&clock.stamp(Event::Notice {
                message: "x".repeat(100),
            })) {
                Ok(()) => ok += 1,
                Err(e) => {
                    failed = Some(e.to_string());
                    break;
                }
            }
        }
        let msg = failed.expect("the disk filled up");
        assert!(msg.contains("No space left"), "{msg}");
        // What reached the "disk": every event `record` acknowledged, as complete lines (the
        // drop-time flush of the failed recorder may add part of the failed line).
        drop(rec);
        let bytes = disk.borrow().clone();
        let r = Replay::from_reader(&bytes[..], "full").expect("replayable");
        assert_eq!(r.events.len() as u64, ok, "room {room}");
        assert!(bytes.len() <= room);
    }
}

#[test]
fn recorder_on_dev_full_is_a_clear_error() {
    if !Path::new("/dev/full").exists() {
        eprintln!("SKIP: no /dev/full");
        return;
    }
    let e = match Recorder::create("/dev/full", header()) {
        Ok(_) => panic!("header write to /dev/full succeeded"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains("/dev/full") && e.contains("No space left"),
        "{e}"
    );
}

/// A directory where writes beyond ~64 KiB fail.
enum Limited {
    Tmpfs(tempfile::TempDir),
    Ulimit(tempfile::TempDir),
}

impl Limited {
    fn new() -> Option<Limited> {
        let d = tempfile::tempdir().ok()?;
        // CFLOW_FAULT_NO_MOUNT=1 forces the ulimit fallback (to test it as root).
        let try_mount = std::env::var_os("CFLOW_FAULT_NO_MOUNT").is_none();
        let mounted = try_mount
            && Command::new("mount")
                .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
                .arg(d.path())
                .stderr(std::process::Stdio::null())
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
        if mounted {
            return Some(Limited::Tmpfs(d));
        }
        let ulimit_ok = Command::new("sh")
            .args(["-c", "trap '' XFSZ; ulimit -f 128"])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        ulimit_ok.then_some(Limited::Ulimit(d))
    }

    fn dir(&self) -> &Path {
        match self {
            Limited::Tmpfs(d) | Limited::Ulimit(d) => d.path(),
        }
    }

    fn run(&self, args: &[&str]) -> Output {
        match self {
            Limited::Tmpfs(_) => Command::new(BIN).args(args).output().unwrap(),
            Limited::Ulimit(_) => Command::new("sh")
                .arg("-c")
                .arg("trap '' XFSZ; ulimit -f 128; exec \"$0\" \"$@\"")
                .arg(BIN)
                .args(args)
                .output()
                .unwrap(),
        }
    }

    fn files(&self) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(self.dir())
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        v.sort();
        v
    }
}

impl Drop for Limited {
    fn drop(&mut self) {
        if let Limited::Tmpfs(d) = self {
            let _ = Command::new("umount").arg(d.path()).status();
        }
    }
}

fn tiny_model(dir: &Path) -> PathBuf {
    common::tiny_model(dir, "2048")
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn gen_on_a_full_disk_fails_clearly_and_leaves_nothing() {
    let Some(lim) = Limited::new() else {
        eprintln!("SKIP: cannot mount a tmpfs or set ulimit -f");
        return;
    };
    let out = lim.dir().join("big.cflow");
    // ~1.3 MiB: does not fit in 64 KiB.
    let o = lim.run(&[
        "gen",
        "--arch",
        "arch2_4_combined",
        "--layers",
        "4",
        "--hidden",
        "256",
        "--heads",
        "4",
        "--ffn",
        "512",
        "--experts",
        "4",
        "--expert-ffn",
        "256",
        "--vocab",
        "512",
        "-o",
        s(&out),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("No space left") || err.contains("too large"),
        "unclear error: {err}"
    );
    assert!(
        err.contains(s(&out)),
        "the error does not name the output: {err}"
    );
    assert_eq!(lim.files(), Vec::<PathBuf>::new(), "partial output left");
}

#[test]
fn import_on_a_full_disk_fails_clearly_and_leaves_nothing() {
    let Some(gguf) = common::smollm2_gguf() else {
        return;
    };
    let Some(lim) = Limited::new() else {
        eprintln!("SKIP: cannot mount a tmpfs or set ulimit -f");
        return;
    };
    let out = lim.dir().join("smol.cflow");
    let o = lim.run(&["import", s(&gguf), "-o", s(&out)]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("No space left") || err.contains("too large"),
        "unclear error: {err}"
    );
    assert!(
        err.contains(s(&out)),
        "the error does not name the output: {err}"
    );
    assert_eq!(lim.files(), Vec::<PathBuf>::new(), "partial output left");
}

#[test]
fn run_record_on_a_full_disk_keeps_the_lines_written() {
    let Some(lim) = Limited::new() else {
        eprintln!("SKIP: cannot mount a tmpfs or set ulimit -f");
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let model = tiny_model(work.path());
    let trace = lim.dir().join("t.jsonl");
    let o = lim.run(&[
        "run",
        s(&model),
        "--token-ids",
        "1,2,3",
        "-n",
        "400",
        "--ignore-eos",
        "--threads",
        "1",
        "--record",
        s(&trace),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    // The recording stops with an error and the run fails (issue 44: it exited 0).
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("recording stopped") && err.contains("--record"),
        "{err}"
    );
    assert!(
        err.contains("No space left") || err.contains("too large"),
        "{err}"
    );
    let r = Replay::open(&trace).expect("the partial trace replays");
    assert!(r.events.len() > 3, "{} events", r.events.len());
    // At most the last line is cut.
    assert!(r.warnings.len() <= 1, "{:?}", r.warnings);
}

/// Issue 44: `run --record` over an existing trace on a full disk exited 0 and left a
/// truncated trace in place of the old one. Now it fails and the old trace is put back.
#[test]
fn run_record_on_a_full_disk_keeps_the_old_trace() {
    let Some(lim) = Limited::new() else {
        eprintln!("SKIP: cannot mount a tmpfs or set ulimit -f");
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let model = tiny_model(work.path());
    let trace = lim.dir().join("t.jsonl");
    let old: Vec<u8> = b"{\"old\": true}\n".repeat(1000);
    std::fs::write(&trace, &old).unwrap();
    let o = lim.run(&[
        "run",
        s(&model),
        "--token-ids",
        "1,2,3",
        "-n",
        "400",
        "--ignore-eos",
        "--threads",
        "1",
        "--record",
        s(&trace),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("put back"), "{err}");
    assert_eq!(
        std::fs::read(&trace).unwrap(),
        old,
        "the old trace was replaced"
    );
    assert_eq!(
        lim.files(),
        vec![trace.clone()],
        "a backup or temporary file was left"
    );
}

/// `--dump-logits` on a full disk said only "No space left on device (os error 28)" and left
/// a partial file.
#[test]
fn dump_logits_on_a_full_disk_names_the_file_and_leaves_nothing() {
    let Some(lim) = Limited::new() else {
        eprintln!("SKIP: cannot mount a tmpfs or set ulimit -f");
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let model = tiny_model(work.path());
    let out = lim.dir().join("logits.jsonl");
    // ~300 bytes per position: 600 positions do not fit in 64 KiB.
    let tokens: Vec<String> = (0..600).map(|i| (i % 120 + 1).to_string()).collect();
    let o = lim.run(&[
        "run",
        s(&model),
        "--threads",
        "1",
        "--token-ids",
        &tokens.join(","),
        "--dump-logits",
        s(&out),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        (err.contains("No space left") || err.contains("too large")) && err.contains(s(&out)),
        "the error does not name {}: {err}",
        out.display()
    );
    assert_eq!(lim.files(), Vec::<PathBuf>::new(), "partial output left");
}

#[test]
fn export_on_a_full_disk_names_the_file_and_leaves_nothing() {
    let Some(lim) = Limited::new() else {
        eprintln!("SKIP: cannot mount a tmpfs or set ulimit -f");
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let model = tiny_model(work.path());
    let trace = work.path().join("t.jsonl");
    let o = Command::new(BIN)
        .args([
            "run",
            s(&model),
            "--token-ids",
            "1,2,3",
            "-n",
            "300",
            "--ignore-eos",
        ])
        .args(["--threads", "1", "--record", s(&trace)])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = lim.dir().join("chrome.json");
    let o = lim.run(&["export", s(&trace), "--chrome", s(&out)]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        (err.contains("No space left") || err.contains("too large")) && err.contains(s(&out)),
        "the error does not name {}: {err}",
        out.display()
    );
    assert_eq!(lim.files(), Vec::<PathBuf>::new(), "partial output left");
}
