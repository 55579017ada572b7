//! Fault injection: the model file changes under an open engine.
//! * truncated between tokens → the session stops with a clear error before touching the missing
//!   pages (no SIGBUS), the outcome and the event stream say why;
//! * replaced by rename (the usual way tools rewrite files) → harmless, generation goes on.
//!
//! A truncation *during* a token remains a race (docs/RELIABILITY.md).

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
    let f = Arc::new(CflowFile::open(path).expect("open"));
    let e = Engine::new(
        f,
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
    let mut boundaries = 0;
    let p = path.clone();
    s.boundary = Some(Box::new(move |_e: &mut Engine| {
        boundaries += 1;
        if boundaries == 2 {
            // Another process shrinks the file under us.
            let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
            f.set_len(4096).unwrap();
        }
        Vec::new()
    }));
    let mut events = Vec::new();
    let out = s.generate(&[1, 2, 3], 8, false, &mut |e| events.push(e));
    assert_eq!(out.reason, Some(StopReason::Error), "{out:?}");
    let err = out.error.clone().unwrap_or_default();
    assert!(err.contains("changed while it was mapped: reopen it"), "{err}");
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
    let max = s.engine.cfg.max_ctx;
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
