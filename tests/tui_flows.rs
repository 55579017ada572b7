//! TUI flows driven by the real engine: the events a run records, applied to `App` the way the
//! live UI applies them. A refused prompt (context full) must end the turn, so the next prompt
//! is accepted, and the context gauge must stay within the context.

mod common;

use cflow::telemetry::replay::Replay;
use cflow::telemetry::{Event, StopReason};
use cflow::tui::app::{App, Msg};
use common::{tiny_model, BIN};
use std::process::Command;

#[test]
fn a_prompt_refused_for_context_ends_the_turn_and_keeps_the_gauge_in_range() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_model(dir.path(), "2048");
    let trace = dir.path().join("t.trace.jsonl");
    let ids: Vec<String> = (1..=20).map(|i| i.to_string()).collect();
    let out = Command::new(BIN)
        .arg("run")
        .arg(&m)
        .args([
            "--max-ctx",
            "8",
            "--tokens",
            &ids.join(","),
            "-n",
            "4",
            "--record",
        ])
        .arg(&trace)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a 20-token prompt fit in 8 positions?"
    );
    assert!(err.contains("does not fit"), "{err}");
    let r = Replay::open(&trace).unwrap();
    let kinds: Vec<&Event> = r.events.iter().map(|s| &s.event).collect();
    let done = kinds
        .iter()
        .rev()
        .find_map(|e| match e {
            Event::Done { reason, pos, .. } => Some((*reason, *pos)),
            _ => None,
        })
        .expect("a refused prompt still ends with Done");
    assert_eq!(done, (StopReason::ContextFull, Some(0)));

    let mut app = App::default();
    for s in r.events.iter().cloned() {
        app.apply(Msg::Stamped(s));
    }
    assert!(!app.generating, "the refused prompt left the UI generating");
    let v = app.view();
    let max = v.model.as_ref().expect("session header").max_ctx;
    assert!(v.ctx_used <= max, "ctx {}/{max}", v.ctx_used);
    assert_eq!(v.ctx_used, 0);
}
