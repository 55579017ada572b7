//! Trace replay: line parser, replay state machine, summary and Chrome-trace export.
#![no_main]

use cflow::telemetry::chrome::export_chrome;
use cflow::telemetry::replay::{summary, Replay};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // A small line cap as well, so the "line too long" path is reachable by short inputs.
    let mut small = data;
    let _ = Replay::from_reader_capped(&mut small, "fuzz-capped.jsonl", 256);
    let Ok(r) = Replay::from_reader(data, "fuzz.jsonl") else {
        return;
    };
    let s = summary(&r);
    let _ = s.to_string();
    let _ = serde_json::to_string(&s);
    let mut out = Vec::new();
    let _ = export_chrome(&r, &mut out);
});
