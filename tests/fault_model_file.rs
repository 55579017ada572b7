//! Fault injection: the model file changes under an open engine.
//! * truncated between tokens → the session stops with a clear error before touching the missing
//!   pages (no SIGBUS), the outcome and the event stream say why;
//! * truncated *during* a token (headless `run`, and in-process under a running session) → the
//!   SIGBUS is absorbed (`format::sigbus`), the token fails with "model file … changed while it
//!   was mapped: reopen it", later tokens are refused, the process lives on;
//! * replaced by rename (the usual way tools rewrite files) → harmless, generation goes on.

use cflow::convert::generate::{generate, GenSpec};
use cflow::engine::session::Session;
use cflow::engine::{Engine, EngineOptions, Layout};
use cflow::format::CflowFile;
use cflow::kernels::Isa;
use cflow::telemetry::{Event, SamplingParams, StopReason};
use std::path::Path;
use std::sync::Arc;

fn tiny(path: &Path) {
    let mut s = GenSpec::new("arch2_4_combined");
    s.layers = Some(2);
    s.hidden = Some(64);
    s.heads = Some(4);
    s.ffn = Some(128);
    s.experts = Some(4);
    s.expert_ffn = Some(64);
    s.vocab = Some(130);
    generate(&s, path, |_, _| {}).expect("generate");
}

fn session(path: &Path) -> Session {
    session_of(CflowFile::open(path).expect("open"))
}

fn session_of(f: CflowFile) -> Session {
    let e = Engine::new(
        Arc::new(f),
        EngineOptions {
            threads: 1,
            isa: Isa::detect(),
            int_act: true,
            layout: Layout::Cflow,
            timings: false,
            ..Default::default()
        },
    );
    Session::new(e, SamplingParams::default()).expect("session")
}

#[test]
fn truncated_between_tokens_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.cflow");
    tiny(&path);
    let mut s = session(&path);
    truncate_at_second_boundary(&mut s, &path);
    let mut events = Vec::new();
    let out = s.generate(&[1, 2, 3], 8, false, &mut |e| events.push(e));
    assert_eq!(out.reason, Some(StopReason::Error), "{out:?}");
    let err = out.error.clone().unwrap_or_default();
    assert!(
        err.contains("changed while it was mapped: reopen it"),
        "{err}"
    );
    assert!(err.contains("4096"), "{err}");
    // Tokens generated before the truncation are kept.
    assert_eq!(out.tokens.len(), 2, "{out:?}");
    assert!(events
        .iter()
        .any(|e| matches!(e, Event::Error { message, .. } if message.contains("truncated"))));
    assert!(matches!(
        events.last(),
        Some(Event::Done {
            reason: StopReason::Error,
            ..
        })
    ));
    // The next request fails the same way (before any page is touched), not with a SIGBUS.
    let again = s.generate(&[4], 2, false, &mut |_| {});
    assert_eq!(again.reason, Some(StopReason::Error));
}

#[test]
fn replaced_by_rename_keeps_working() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.cflow");
    tiny(&path);
    let mut reference = session(&path);
    let want = reference.generate(&[1, 2, 3], 6, false, &mut |_| {}).tokens;

    let mut s = session(&path);
    let p = path.clone();
    let other = dir.path().join("other.cflow");
    std::fs::write(&other, b"not a model").unwrap();
    let mut done = false;
    s.boundary = Some(Box::new(move |_e: &mut Engine| {
        if !done {
            std::fs::rename(&other, &p).unwrap();
            done = true;
        }
        Vec::new()
    }));
    let out = s.generate(&[1, 2, 3], 6, false, &mut |_| {});
    assert_eq!(out.error, None);
    assert_eq!(out.tokens, want);
}

#[test]
fn prompt_longer_than_context_is_refused_with_a_message() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.cflow");
    tiny(&path);
    let mut s = session(&path);
    let max = s.engine.cfg().max_ctx;
    let prompt: Vec<u32> = (0..max as u32 + 5).map(|i| i % 130).collect();
    let mut events = Vec::new();
    let out = s.generate(&prompt, 4, false, &mut |e| events.push(e));
    assert_eq!(out.reason, Some(StopReason::ContextFull));
    let err = out.error.unwrap_or_default();
    assert!(err.contains("does not fit"), "{err}");
    assert!(events.iter().any(|e| matches!(e, Event::Error { .. })));
    // The session is still usable.
    let ok = s.generate(&[1, 2], 3, false, &mut |_| {});
    assert_eq!(ok.error, None);
    assert_eq!(ok.tokens.len(), 3);
}

/// A model big enough that a token takes milliseconds (8 layers, d 1024: ~110 MB), so that a
/// truncation almost always lands inside a token.
fn big(dir: &Path) -> std::path::PathBuf {
    let p = dir.join("big.cflow");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_cflow-tui"))
        .args([
            "gen",
            "--arch",
            "llama",
            "--layers",
            "8",
            "--hidden",
            "1024",
            "--heads",
            "16",
            "--ffn",
            "4096",
            "--vocab",
            "32000",
            "--max-ctx",
            "4096",
            "-o",
        ])
        .arg(&p)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    p
}

fn truncate_to_half(p: &Path) {
    let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
    let n = f.metadata().unwrap().len();
    f.set_len(n / 2).unwrap();
}

/// `cflow-tui run MODEL -n 3000` with the model truncated to half at five moments: every run
/// exits with status 1 and the error, never by a signal (before: SIGBUS, exit 135).
#[test]
fn truncated_during_a_headless_run_exits_with_an_error_not_a_signal() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    let model = big(dir.path());
    let mut mid_token = 0;
    for (i, ms) in [150u64, 400, 800, 1300, 2000].into_iter().enumerate() {
        let p = dir.path().join(format!("t{i}.cflow"));
        std::fs::copy(&model, &p).unwrap();
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_cflow-tui"))
            // The mapping is what is under test: a resident copy would not notice.
            .args([
                "run",
                "--weights",
                "mmap",
                "--token-ids",
                "1,2,3",
                "-n",
                "3000",
            ])
            .arg(&p)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(ms));
        truncate_to_half(&p);
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.signal(),
            None,
            "killed by a signal at {ms} ms: {err}"
        );
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(
            err.contains(&format!(
                "model file {} changed while it was mapped: reopen it",
                p.display()
            )),
            "{err}"
        );
        // A run that finished its 3,000 tokens before the truncation would not test anything.
        assert!(!err.contains("3000 generated"), "{err}");
        mid_token += err.contains("pages vanished") as usize;
    }
    // Most truncations land inside a token (the SIGBUS path); the others are caught by the
    // check between tokens.
    assert!(mid_token >= 1, "no truncation landed inside a token");
    println!("{mid_token} of 5 truncations landed inside a token");
}

/// In-process, as under the TUI's engine thread: a truncation while `generate` runs fails that
/// generation with a non-fatal `Error` event, and every later request is refused the same way.
#[test]
fn truncated_during_a_token_in_process_is_a_non_fatal_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = big(dir.path());
    let mut s = session(&path);
    let p = path.clone();
    let cutter = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(300));
        truncate_to_half(&p);
    });
    let mut events = Vec::new();
    let out = s.generate(&[1, 2, 3], 3000, false, &mut |e| events.push(e));
    cutter.join().unwrap();
    assert_eq!(out.reason, Some(StopReason::Error), "{:?}", out.error);
    let err = out.error.clone().unwrap_or_default();
    assert!(
        err.contains("changed while it was mapped: reopen it"),
        "{err}"
    );
    assert!(out.tokens.len() < 3000);
    assert!(events.iter().any(
        |e| matches!(e, Event::Error { message, fatal: false } if message.contains("reopen it"))
    ));
    let again = s.generate(&[4], 2, false, &mut |_| {});
    assert_eq!(again.reason, Some(StopReason::Error));
    assert!(again.error.unwrap_or_default().contains("reopen it"));
    assert!(again.tokens.is_empty());
}

/// `--weights resident`, the default on dense models (`CflowFile::make_resident`): the engine reads a private copy, so the
/// file truncated between tokens changes nothing; the tokens equal those of the mapped file.
#[test]
fn a_resident_copy_survives_truncation_and_gives_the_same_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.cflow");
    tiny(&path);
    let mut mapped = session(&path);
    let want = mapped.generate(&[1, 2, 3], 8, false, &mut |_| {});
    assert_eq!(want.reason, Some(StopReason::Length), "{want:?}");

    let mut f = CflowFile::open(&path).expect("open");
    assert!(!f.is_resident());
    let bytes = f.bytes().to_vec();
    f.make_resident(false).expect("resident copy");
    assert!(f.is_resident());
    assert_eq!(f.bytes(), &bytes[..], "the copy holds the file's bytes");
    let mut s = session_of(f);
    truncate_at_second_boundary(&mut s, &path);
    let got = s.generate(&[1, 2, 3], 8, false, &mut |_| {});
    assert_eq!(got.reason, Some(StopReason::Length), "{got:?}");
    assert_eq!(got.tokens, want.tokens);
}

/// Another process shrinks the file to 4096 bytes at the session's second token boundary.
fn truncate_at_second_boundary(s: &mut Session, path: &Path) {
    let mut boundaries = 0;
    let p = path.to_path_buf();
    s.boundary = Some(Box::new(move |_e: &mut Engine| {
        boundaries += 1;
        if boundaries == 2 {
            let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
            f.set_len(4096).unwrap();
        }
        Vec::new()
    }));
}
