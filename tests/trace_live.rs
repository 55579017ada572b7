//! Record → replay on a live run of the real binary: `replay --summary --json` reproduces the
//! run's token ids, text and per-stream bytes exactly, and the fresh trace validates against the
//! shape the schema requires (header line + one JSON object per event).

use std::process::Command;

#[test]
fn live_record_replays_to_the_same_tokens_text_and_bytes() {
    let bin = env!("CARGO_BIN_EXE_cflow-tui");
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m.cflow");
    let trace = dir.path().join("t.jsonl");
    let ok = Command::new(bin)
        .args([
            "gen",
            "--arch",
            "arch2_4_combined",
            "--layers",
            "3",
            "--hidden",
            "128",
            "--heads",
            "4",
            "--ffn",
            "256",
        ])
        .args(["--experts", "4", "--expert-ffn", "64", "-o"])
        .arg(&model)
        .status()
        .unwrap()
        .success();
    assert!(ok);
    let out = Command::new(bin)
        .arg("run")
        .arg(&model)
        .args([
            "--prompt",
            "Once upon a time",
            "-n",
            "12",
            "--json",
            "--record",
        ])
        .arg(&trace)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let live: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("exactly one JSON object on stdout");
    let rep = Command::new(bin)
        .args(["replay", "--summary", "--json"])
        .arg(&trace)
        .output()
        .unwrap();
    assert!(
        rep.status.success(),
        "{}",
        String::from_utf8_lossy(&rep.stderr)
    );
    let sum: serde_json::Value = serde_json::from_slice(&rep.stdout).unwrap();
    assert_eq!(sum["tokens"], live["tokens"]);
    assert_eq!(sum["text"], live["text"]);
    // Per-stream bytes: the replay's per-token averages equal the live run's.
    for (a, b) in [
        ("attention", "attention"),
        ("dense", "dense"),
        ("experts", "experts"),
        ("lm_head", "lm_head"),
    ] {
        let x = sum["mib_per_token"][a].as_f64().unwrap();
        let y = live["mib_per_token"][b].as_f64().unwrap();
        assert!((x - y).abs() < 1e-9, "{a}: replay {x} vs live {y}");
    }
    // Every line parses; the first is the header.
    let text = std::fs::read_to_string(&trace).unwrap();
    let mut lines = text.lines();
    let h: serde_json::Value = serde_json::from_str(lines.next().unwrap()).unwrap();
    assert_eq!(h["format"], "cflow-trace");
    for l in lines {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        assert!(v["kind"].is_string() && v["t_ns"].is_u64());
    }
}
