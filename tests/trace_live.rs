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

/// Issue 43: a live run on 2 threads records each pool thread's busy time per token
/// (`stats.pool_threads`), and `export --chrome` turns it into one named track per pool thread
/// next to the engine thread's.
#[test]
fn live_trace_exports_one_track_per_pool_thread() {
    let bin = env!("CARGO_BIN_EXE_cflow-tui");
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m.cflow");
    let trace = dir.path().join("t.jsonl");
    let chrome = dir.path().join("t.json");
    let ok = Command::new(bin)
        .args(["gen", "--arch", "arch2_4_combined", "--layers", "2"])
        .args(["--hidden", "128", "--heads", "4", "--ffn", "256"])
        .args(["--experts", "4", "--expert-ffn", "64", "-o"])
        .arg(&model)
        .status()
        .unwrap()
        .success();
    assert!(ok);
    let out = Command::new(bin)
        .arg("run")
        .arg(&model)
        .args(["--prompt", "Once", "-n", "4", "--threads", "2"])
        .args(["--schedule", "sequential", "--record"])
        .arg(&trace)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&trace).unwrap();
    let mut n_stats = 0;
    for l in text.lines().skip(1) {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        if v["kind"] == "stats" {
            n_stats += 1;
            let p = v["pool_threads"].as_array().expect("pool_threads recorded");
            assert_eq!(p.len(), 2, "{v}");
            let tasks: u64 = p.iter().map(|t| t["tasks"].as_u64().unwrap()).sum();
            assert!(tasks > 0, "{v}");
            assert!(p[0]["busy_ns"].as_u64().unwrap() <= v["ns_total"].as_u64().unwrap());
        }
    }
    assert!(n_stats >= 3, "{n_stats} stats events for -n 4");
    let out = Command::new(bin)
        .arg("export")
        .arg(&trace)
        .arg("--chrome")
        .arg(&chrome)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&chrome).unwrap()).unwrap();
    let evs = doc["traceEvents"].as_array().unwrap();
    let names: Vec<&str> = evs
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "thread_name")
        .map(|e| e["args"]["name"].as_str().unwrap())
        .collect();
    for want in ["engine thread", "pool thread 0 (engine)", "pool thread 1"] {
        assert!(names.contains(&want), "{names:?}");
    }
    let pool_spans = evs
        .iter()
        .filter(|e| e["ph"] == "X" && e["name"] == "pool tasks")
        .count();
    assert!(
        pool_spans >= n_stats,
        "{pool_spans} pool spans for {n_stats} tokens"
    );
}
