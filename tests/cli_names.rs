//! One name across commands, and llama.cpp's habits accepted (issue 43 §4): `-m FILE` is the
//! MODEL argument, `-t` the threads, `-p` the prompt, `-n` / `--max-tokens` the token budget
//! everywhere (`-n -1`: until the context is full), `-c` the context (`--max-ctx`). `--tokens`
//! is a count wherever it exists (token ids are `--token-ids`); `--max-ctx` is the context
//! window of every command (`gen` and `import` too), and `perplexity --chunk` the chunk length;
//! the LM head is `lm_head` in every JSON key and trace field, `mib_per_token` the MiB per
//! token everywhere.

mod common;

use common::{tiny_model, BIN};
use std::process::Command;

fn json(args: &[&str]) -> serde_json::Value {
    let o = Command::new(BIN)
        .args(args)
        .env("CFLOW_CACHE", cache())
        .output()
        .unwrap();
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
        "--token-ids",
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
        "run",
        "-m",
        m,
        "--token-ids",
        "1,2",
        "-n",
        "5",
        "-c",
        "64",
        "-t",
        "1",
        "--json",
    ]);
    assert_eq!(ours["tokens"], llama["tokens"]);
    assert_eq!(llama["threads"], 1);
    assert_eq!(llama["generated_tokens"], 5);
    // The old spelling still works.
    let old = json(&[
        "run",
        m,
        "--token-ids",
        "1,2",
        "--n",
        "5",
        "-t",
        "1",
        "--json",
    ]);
    assert_eq!(old["tokens"], ours["tokens"]);
    // `-n -1`: no budget; the context (`-c 16`) ends it.
    let all = json(&[
        "run",
        "-m",
        m,
        "--token-ids",
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
        .args(["run", m, "-m", m, "--token-ids", "1"])
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
            .args(["--token-ids", "1,2", "-n", "2"])
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

/// A cache directory private to this test binary (no test writes the user's cache).
fn cache() -> std::path::PathBuf {
    static DIR: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().unwrap())
        .path()
        .to_path_buf()
}

fn fails(args: &[&str]) -> String {
    let o = Command::new(BIN)
        .args(args)
        .env("CFLOW_CACHE", cache())
        .output()
        .unwrap();
    assert!(!o.status.success(), "{args:?} should fail");
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `--tokens` was token ids in `run` and a count in `bench`: ids are `--token-ids` now, and
/// `run --tokens` is refused rather than read with another meaning.
#[test]
fn token_ids_are_token_ids_and_tokens_is_a_count() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_model(dir.path(), "2048");
    let m = m.to_str().unwrap();
    let run = json(&[
        "run",
        m,
        "--token-ids",
        "5,6,7",
        "-n",
        "2",
        "-t",
        "1",
        "--json",
    ]);
    assert_eq!(run["prompt_tokens"], 3, "{run}");
    let err = fails(&["run", m, "--tokens", "5,6,7", "-n", "2"]);
    assert!(err.contains("--tokens"), "{err}");
    // In `bench decode` it is the count generated per repeat; `-n` is llama-bench's spelling,
    // `-p` its prompt length, `-r` its repetitions, `-m` its model.
    let long = json(&[
        "bench",
        "decode",
        m,
        "--tokens",
        "3",
        "--prompt-len",
        "4",
        "--repeat",
        "1",
        "-t",
        "1",
        "--json",
    ]);
    let short = json(&[
        "bench", "decode", "-m", m, "-n", "3", "-p", "4", "-r", "1", "-t", "1", "--json",
    ]);
    for b in [&long, &short] {
        assert_eq!(b["tokens_per_repeat"], 3, "{b}");
        assert_eq!(b["prompt_tokens"], 4, "{b}");
    }
}

/// One name for the context window: `gen` and `import` took `--ctx`; now `--max-ctx` (`-c`)
/// as every other command.
#[test]
fn max_ctx_is_the_context_window_of_gen_and_import_too() {
    let dir = tempfile::tempdir().unwrap();
    let gen = |flag: &str, out: &str| {
        let p = dir.path().join(out);
        let mut a: Vec<&str> = common::TINY_GEN_ARGS[..17].to_vec();
        a.extend([flag, "96", "-o", p.to_str().unwrap()]);
        let o = Command::new(BIN).args(&a).output().unwrap();
        (o, p)
    };
    for flag in ["--max-ctx", "-c"] {
        let (o, p) = gen(flag, "g.cflow");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let ins = json(&["inspect", p.to_str().unwrap(), "--json"]);
        assert_eq!(ins["geometry"]["max_ctx"], 96, "{flag}");
    }
    let (o, _) = gen("--ctx", "old.cflow");
    assert!(!o.status.success());
    let err = fails(&[
        "import",
        "/nonexistent.gguf",
        "-o",
        "/nonexistent.cflow",
        "--ctx",
        "8",
    ]);
    assert!(err.contains("--ctx"), "{err}");
    let err = fails(&[
        "import",
        "/nonexistent.gguf",
        "-o",
        "/nonexistent.cflow",
        "-c",
        "0",
    ]);
    assert!(err.contains("--max-ctx 0: must be between"), "{err}");
}

/// `perplexity --ctx` was the chunk length while `-c` / `--max-ctx` capped the context. Now
/// `--chunk` is the chunk length and, without it, `-c N` makes chunks of N, as llama-perplexity's
/// `-c` does; `-m` and `-f` are llama-perplexity's spellings of MODEL and --file.
#[test]
fn perplexity_chunk_is_its_own_name_and_c_is_the_context_as_in_llama_perplexity() {
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("tok.cflow");
    let o = Command::new(BIN)
        .args(&common::TINY_GEN_ARGS[..15])
        .args(["--vocab", "50257", "-o"])
        .arg(&m)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let m = m.to_str().unwrap();
    let text = dir.path().join("t.txt");
    std::fs::write(
        &text,
        "the quick brown fox jumps over the lazy dog. ".repeat(8),
    )
    .unwrap();
    let text = text.to_str().unwrap();
    let ppl = |extra: &[&str]| {
        let mut a = vec!["perplexity", "-t", "1", "--json"];
        a.extend_from_slice(extra);
        json(&a)
    };
    let c = ppl(&["-m", m, "-f", text, "-c", "16"]);
    assert_eq!(c["chunk"], 16, "{c}");
    let chunk = ppl(&[m, "--file", text, "--chunk", "8"]);
    assert_eq!(chunk["chunk"], 8, "{chunk}");
    assert!(chunk.get("ctx").is_none(), "{chunk}");
    let both = ppl(&[m, "--file", text, "--chunk", "8", "--max-ctx", "32"]);
    assert_eq!(both["chunk"], 8, "{both}");
    let err = fails(&["perplexity", m, "--file", text, "--ctx", "8"]);
    assert!(err.contains("--ctx"), "{err}");
    let o = Command::new(BIN)
        .args(["perplexity", "--help"])
        .output()
        .unwrap();
    let h = String::from_utf8_lossy(&o.stdout);
    assert!(
        h.contains("--chunk") && h.contains("llama-perplexity"),
        "{h}"
    );
}

/// The MiB per token is `mib_per_token` in every output (inspect said `per_token_mib`), and its
/// LM-head stream `lm_head` (run and the replay summary said `vocab`); the printouts say
/// `lm head`.
#[test]
fn mib_per_token_and_lm_head_are_one_name_everywhere() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_model(dir.path(), "2048");
    let m = m.to_str().unwrap();
    let trace = dir.path().join("t.trace.jsonl");
    let tr = trace.to_str().unwrap();
    let run = json(&[
        "run",
        m,
        "--token-ids",
        "1,2",
        "-n",
        "3",
        "-t",
        "1",
        "--json",
        "--record",
        tr,
    ]);
    let rep = json(&["replay", tr, "--summary", "--json"]);
    let ins = json(&["inspect", m, "--json"]);
    for (what, v) in [
        ("run", &run["mib_per_token"]),
        ("replay", &rep["mib_per_token"]),
        ("inspect", &ins["mib_per_token"]),
        ("inspect with scales", &ins["mib_per_token_with_scales"]),
    ] {
        assert!(v["lm_head"].as_f64().unwrap() > 0.0, "{what}: {v}");
        assert!(v.get("vocab").is_none(), "{what}: {v}");
    }
    assert!(ins.get("per_token_mib").is_none());
    assert!(ins.get("per_token_mib_with_scales").is_none());
    // The trace names the field as the JSON outputs do.
    let text = std::fs::read_to_string(&trace).unwrap();
    assert!(text.contains("\"lm_head_bytes\":") && !text.contains("vocab_bytes"));
    // The printouts.
    let o = Command::new(BIN)
        .args(["run", m, "--token-ids", "1,2", "-n", "3", "-t", "1"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("lm head") && !err.contains("vocab "), "{err}");
    let o = Command::new(BIN).args(["inspect", m]).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("· lm head "), "{out}");
    let o = Command::new(BIN)
        .args(["replay", tr, "--summary"])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("· lm head "), "{out}");
}

/// A trace written before the rename (`cflow-trace` 1.0, `vocab_bytes` in the header's model
/// and in every `stats` event) still replays, to the same summary.
#[test]
fn an_old_trace_with_vocab_bytes_still_replays() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_model(dir.path(), "2048");
    let m = m.to_str().unwrap();
    let new = dir.path().join("new.jsonl");
    json(
        &[
            "run",
            m,
            "--token-ids",
            "1,2",
            "-n",
            "3",
            "-t",
            "1",
            "--json",
            "--record",
        ]
        .into_iter()
        .chain([new.to_str().unwrap()])
        .collect::<Vec<_>>(),
    );
    let text = std::fs::read_to_string(&new).unwrap();
    assert!(text.starts_with("{\"format\":\"cflow-trace\",\"version\":\"2.0\""));
    let old_text = text
        .replacen("\"version\":\"2.0\"", "\"version\":\"1.0\"", 1)
        .replace("\"lm_head_bytes\":", "\"vocab_bytes\":");
    let old = dir.path().join("old.jsonl");
    std::fs::write(&old, &old_text).unwrap();
    // One line of each kind, through the library.
    let r = cflow::telemetry::replay::Replay::open(&old).unwrap();
    assert!(r.header.model.lm_head_bytes > 0);
    let stats = r
        .events
        .iter()
        .find_map(|e| match &e.event {
            cflow::telemetry::Event::Stats(s) => Some(s.lm_head_bytes),
            _ => None,
        })
        .expect("a stats event");
    assert_eq!(stats, r.header.model.lm_head_bytes);
    let a = json(&["replay", new.to_str().unwrap(), "--summary", "--json"]);
    let b = json(&["replay", old.to_str().unwrap(), "--summary", "--json"]);
    assert_eq!(a["mib_per_token"], b["mib_per_token"]);
    assert_eq!(a["tokens"], b["tokens"]);
}

/// `-p` is the prompt of `run`, as llama.cpp's (`bench decode -p` is llama-bench's prompt
/// length: `token_ids_are_token_ids_and_tokens_is_a_count`).
#[test]
fn p_is_the_prompt_of_run() {
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("tok.cflow");
    let o = Command::new(BIN)
        .args(&common::TINY_GEN_ARGS[..15])
        .args(["--vocab", "50257", "-o"])
        .arg(&m)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let m = m.to_str().unwrap();
    let long = json(&[
        "run",
        m,
        "--prompt",
        "Once upon",
        "-n",
        "3",
        "-t",
        "1",
        "--json",
    ]);
    let short = json(&[
        "run",
        "-m",
        m,
        "-p",
        "Once upon",
        "-n",
        "3",
        "-t",
        "1",
        "--json",
    ]);
    assert!(long["prompt_tokens"].as_u64().unwrap() >= 2, "{long}");
    assert_eq!(long["prompt_tokens"], short["prompt_tokens"]);
    assert_eq!(long["tokens"], short["tokens"]);
}
