//! What `run` and `chat` say at the edges of a generation (issue 43 §3): a generation that ran
//! out of context says so (not "max tokens"); a context smaller than the system prompt says
//! exactly that; no rate is printed from zero or one token; and `chat` on a model with no chat
//! template (a base model) says so and runs in completion mode unless `--template` is given.
//! Driven through the real binary on tiny generated models (and on Gemma 3 270M when pulled).

mod common;

use cflow::convert::generate::{generate, GenSpec};
use common::{tiny_model, BIN};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const TEMPLATE: &str = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}";

/// A tiny model with the GPT-2 tokenizer, with or without a chat template.
fn model(dir: &Path, template: Option<&str>) -> PathBuf {
    let mut s = GenSpec::new("arch2_4_combined");
    s.layers = Some(2);
    s.hidden = Some(64);
    s.heads = Some(4);
    s.ffn = Some(128);
    s.experts = Some(4);
    s.expert_ffn = Some(64);
    s.ctx = Some(4096);
    s.tokenizer_json = cflow::chat::bundled_gpt2_tokenizer().map(String::from);
    s.chat_template = template.map(String::from);
    let p = dir.join(if template.is_some() {
        "chat.cflow"
    } else {
        "base.cflow"
    });
    generate(&s, &p, |_, _| {}).unwrap();
    p
}

/// Runs the binary with `input` on stdin; returns (success, stdout, stderr).
fn run(args: &[&str], input: &[u8]) -> (bool, String, String) {
    let mut child = Command::new(BIN)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let data = input.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&data);
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn run_with_max_ctx_1_prints_no_rate_from_one_token() {
    // `run --max-ctx 1` printed `decode 18348.3 tok/s` from one token.
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_model(dir.path(), "2048");
    let m = m.to_str().unwrap();
    let args = ["run", m, "--token-ids", "1", "--max-ctx", "1", "-n", "5"];
    let (ok, _, err) = run(&args, b"");
    assert!(ok, "{err}");
    assert!(
        err.contains("decode no rate: 1 token (a rate needs ≥ 2)"),
        "{err}"
    );
    assert!(err.contains("prefill no rate: 1 token"), "{err}");
    assert!(!err.contains(" tok/s"), "a rate from one token:\n{err}");
    assert!(
        err.contains("stopped: the context is full (1 position;"),
        "{err}"
    );
    let (ok, out, err) = run(&[&args[..], &["--json"]].concat(), b"");
    assert!(ok, "{err}");
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(j["decode_tok_s"].is_null(), "{j}");
    assert!(j["prefill_tok_s"].is_null(), "{j}");
    assert!(j["ms_per_token"].is_null(), "{j}");
    assert_eq!(j["stop_reason"], "context_full", "{j}");
}

#[test]
fn a_generation_that_ran_out_of_context_says_context_full_not_max_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_model(dir.path(), "2048");
    let m = m.to_str().unwrap();
    let json = |ctx: &str, n: &str| {
        let args = [
            "run",
            m,
            "--token-ids",
            "1,2,3",
            "--max-ctx",
            ctx,
            "-n",
            n,
            "--json",
        ];
        let (ok, out, err) = run(&args, b"");
        assert!(ok, "{err}");
        serde_json::from_str::<serde_json::Value>(&out).unwrap()
    };
    let full = json("8", "50");
    assert_eq!(full["stop_reason"], "context_full", "{full}");
    // Every token generated is in the context: 3 prompt + 5 generated = 8 positions.
    assert_eq!(full["generated_tokens"], 5, "{full}");
    let budget = json("100", "5");
    assert_eq!(budget["stop_reason"], "length", "{budget}");
    assert!(budget["decode_tok_s"].as_f64().is_some_and(|r| r > 0.0));

    // `chat` caps each reply at the room left (as the TUI's engine thread does): the reply
    // that used the last position ends as "context full".
    let m = model(dir.path(), Some(TEMPLATE));
    let m = m.to_str().unwrap();
    let (ok, _, err) = run(
        &["chat", m, "--max-ctx", "24", "-n", "100"],
        b"hello\n/quit\n",
    );
    assert!(ok, "{err}");
    assert!(
        err.contains("(the context is full: /reset clears it)"),
        "{err}"
    );
}

#[test]
fn a_context_smaller_than_the_system_prompt_says_exactly_that() {
    let dir = tempfile::tempdir().unwrap();
    let m = model(dir.path(), Some(TEMPLATE));
    let m = m.to_str().unwrap();
    let system = "You are a careful assistant. Answer every question in one short line.";
    for cmd in [
        &["chat", m, "--max-ctx", "8", "--system", system][..],
        &["run", m, "--chat", "--prompt", "hi", "--max-ctx", "8"][..],
    ] {
        let input: &[u8] = if cmd[0] == "chat" {
            b"hi\n/quit\n"
        } else {
            b""
        };
        let (_, _, err) = run(cmd, input);
        let what = if cmd[0] == "chat" {
            "the system prompt alone (with the chat template's framing) is"
        } else {
            // `run --chat` has no --system: the template's own framing is what does not fit.
            "the chat template's framing alone"
        };
        assert!(
            err.contains(what) && err.contains("no room for a message and a reply"),
            "{cmd:?}:\n{err}"
        );
    }
}

#[test]
fn chat_on_a_model_without_a_template_says_so_and_completes() {
    // `chat` on a base model silently used ChatML (and looped).
    let dir = tempfile::tempdir().unwrap();
    let m = model(dir.path(), None);
    let m = m.to_str().unwrap();
    let (ok, _, err) = run(&["chat", m, "-n", "3"], b"Once upon a time\n/quit\n");
    assert!(ok, "{err}");
    assert!(err.contains("has no chat template (a base model)"), "{err}");
    assert!(err.contains("completion mode"), "{err}");
    assert!(err.contains("--template chatml"), "{err}");
    assert!(err.contains("[3 tokens"), "a reply was generated:\n{err}");
    // --template chats with the template given.
    let (ok, _, err) = run(
        &["chat", m, "-n", "3", "--template", "chatml"],
        b"hello\n/quit\n",
    );
    assert!(ok, "{err}");
    assert!(err.contains("chatting with"), "{err}");
    assert!(err.contains("(template: --template chatml)"), "{err}");
    assert!(!err.contains("completion mode"), "{err}");

    // The real base model the issue found it on.
    let Some(g) = cflow::convert::pull_gemma3::gemma3_cflow() else {
        common::missing_oracle(
            "GEMMA3",
            "Gemma 3 .cflow not found (`cflow-tui pull gemma3-270m --accept-license`)",
        );
        return;
    };
    let g = g.to_str().unwrap();
    let (ok, _, err) = run(
        &["chat", g, "-n", "4"],
        b"The capital of France is\n/quit\n",
    );
    assert!(ok, "{err}");
    assert!(err.contains("has no chat template (a base model)"), "{err}");
    assert!(err.contains("[4 tokens"), "{err}");
}
