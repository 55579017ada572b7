//! One name across commands, and llama.cpp's habits accepted (issue 43 §4): `-m FILE` is the
//! MODEL argument, `-t` the threads, `-p` the prompt, `-n` / `--max-tokens` the token budget
//! everywhere (`-n -1`: until the context is full), `-c` the context (`--max-ctx`).

mod common;

use common::{tiny_model, BIN};
use std::process::Command;

fn json(args: &[&str]) -> serde_json::Value {
    let o = Command::new(BIN).args(args).output().unwrap();
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn llama_cpp_flags_are_accepted_with_the_same_meaning() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_model(dir.path(), "2048");
    let m = m.to_str().unwrap();
    let ours = json(&[
        "run",
        m,
        "--tokens",
        "1,2",
        "--max-tokens",
        "5",
        "--max-ctx",
        "64",
        "--threads",
        "1",
        "--json",
    ]);
    let llama = json(&[
        "run", "-m", m, "--tokens", "1,2", "-n", "5", "-c", "64", "-t", "1", "--json",
    ]);
    assert_eq!(ours["tokens"], llama["tokens"]);
    assert_eq!(llama["threads"], 1);
    assert_eq!(llama["generated_tokens"], 5);
    // The old spelling still works.
    let old = json(&["run", m, "--tokens", "1,2", "--n", "5", "-t", "1", "--json"]);
    assert_eq!(old["tokens"], ours["tokens"]);
    // `-n -1`: no budget; the context (`-c 16`) ends it.
    let all = json(&[
        "run",
        "-m",
        m,
        "--tokens",
        "1,2",
        "-n",
        "-1",
        "-c",
        "16",
        "-t",
        "1",
        "--json",
        "--ignore-eos",
    ]);
    assert_eq!(all["stop_reason"], "context_full", "{all}");
    assert_eq!(all["generated_tokens"], 14, "{all}");
    // -m and MODEL together are refused (one model).
    let o = Command::new(BIN)
        .args(["run", m, "-m", m, "--tokens", "1"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    // `chat -m` and a bad -n say what they take.
    let o = Command::new(BIN)
        .args(["chat", "-m", m, "-n", "-2"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("a token count, or -1 for no limit"), "{err}");
}

/// `run -h` teaches the engine flags in their own heading, one line each with an example, and
/// the critical-path lines of `run`'s summary appear on a delayed model and, on a model without
/// delays (where they say 1.00×), only with `--verbose`.
#[test]
fn run_help_is_short_and_critical_path_lines_need_verbose_on_an_undelayed_model() {
    let o = Command::new(BIN).args(["run", "-h"]).output().unwrap();
    let h = String::from_utf8_lossy(&o.stdout);
    assert!(h.lines().count() <= 70, "{h}");
    let engine: Vec<&str> = h
        .lines()
        .skip_while(|l| !l.starts_with("Engine:"))
        .skip(1)
        .take_while(|l| !l.is_empty())
        .collect();
    assert!(engine.len() >= 15, "{h}");
    for flag in [
        "--threads",
        "--expert-tier",
        "--expert-cache-mib",
        "--prefetch",
        "--max-ctx",
    ] {
        let line = engine.iter().find(|l| l.contains(flag)).unwrap();
        assert!(line.contains("e.g. `"), "no example: {line}");
        assert!(line.len() <= 200, "{line}");
    }
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("plain.cflow");
    let st = Command::new(BIN)
        .args([
            "gen", "--arch", "llama", "--layers", "2", "--hidden", "64", "--heads", "4",
        ])
        .args(["--ffn", "128", "--vocab", "130", "-o"])
        .arg(&plain)
        .output()
        .unwrap();
    assert!(
        st.status.success(),
        "{}",
        String::from_utf8_lossy(&st.stderr)
    );
    let summary = |m: &std::path::Path, extra: &[&str]| {
        let o = Command::new(BIN)
            .arg("run")
            .arg(m)
            .args(["--tokens", "1,2", "-n", "2"])
            .args(extra)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stderr).to_string()
    };
    assert!(!summary(&plain, &[]).contains("critical path"));
    assert!(summary(&plain, &["--verbose"]).contains("critical path"));
    let delayed = tiny_model(dir.path(), "64");
    assert!(summary(&delayed, &[]).contains("critical path"));
}
