//! The `chat` REPL keeps the conversation when one message cannot be sent (issue 14 item 16):
//! an input line that is not UTF-8, a chat-template exception (`raise_exception`) and a
//! template limit (a prompt over the 1 MiB output cap) each print why, and the next message is
//! answered with the earlier turns still in the context. Driven through the real binary with
//! stdin bytes, on a tiny generated model with the GPT-2 tokenizer and a chat template.

use cflow::convert::generate::{generate, GenSpec};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_cflow-tui");

const TEMPLATE: &str = "{% for m in messages %}{% if 'boom' in m.content %}{{ raise_exception('the word boom is not allowed') }}{% endif %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}";

fn model(dir: &Path) -> PathBuf {
    let mut s = GenSpec::new("arch2_4_combined");
    s.layers = Some(2);
    s.hidden = Some(64);
    s.heads = Some(4);
    s.ffn = Some(128);
    s.experts = Some(4);
    s.expert_ffn = Some(64);
    s.ctx = Some(4096);
    s.tokenizer_json = cflow::chat::bundled_gpt2_tokenizer().map(String::from);
    s.chat_template = Some(TEMPLATE.to_string());
    let p = dir.join("chat.cflow");
    generate(&s, &p, |_, _| {}).unwrap();
    p
}

/// Run `chat` on `input`; returns (success, stderr).
fn chat(model: &Path, input: &[u8]) -> (bool, String) {
    let mut child = Command::new(BIN)
        .args(["chat", "-n", "2"])
        .arg(model)
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
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The context position `/stats` printed last (`context N/M`).
fn last_context(stderr: &str) -> usize {
    let at = stderr.rfind("context ").expect("no /stats output");
    let rest = &stderr[at + "context ".len()..];
    rest.split('/').next().unwrap().trim().parse().unwrap()
}

#[test]
fn bad_lines_and_template_errors_keep_the_conversation() {
    let tmp = tempfile::tempdir().unwrap();
    let m = model(tmp.path());

    // Reference: only the last message, in a fresh conversation.
    let (ok, fresh) = chat(&m, b"again\n/stats\n/quit\n");
    assert!(ok, "{fresh}");
    let fresh_pos = last_context(&fresh);

    let mut input = Vec::new();
    input.extend_from_slice(b"hello there\n/stats\n");
    input.extend_from_slice(b"bad \xff\xfe bytes\n");
    input.extend_from_slice(b"this says boom\n");
    input.extend_from_slice(&vec![b'x'; (1 << 20) + 10]);
    input.extend_from_slice(b"\n");
    input.extend_from_slice(b"again\n/stats\n/quit\n");
    let (ok, err) = chat(&m, &input);
    assert!(ok, "chat exited with an error:\n{err}");
    assert!(err.contains("not valid UTF-8"), "{err}");
    assert!(err.contains("the word boom is not allowed"), "{err}");
    assert!(
        err.contains("exceeded a limit") || err.contains("output exceeds"),
        "{err}"
    );
    assert_eq!(err.matches("the conversation is kept").count(), 3, "{err}");
    // The reply to "again" was generated with "hello there" and its reply still in context.
    let first = {
        let at = err.find("context ").unwrap();
        err[at + 8..]
            .split('/')
            .next()
            .unwrap()
            .trim()
            .parse::<usize>()
            .unwrap()
    };
    let pos = last_context(&err);
    assert!(first > 0 && pos > first, "first {first}, last {pos}");
    assert!(
        pos > fresh_pos,
        "context {pos} is not longer than a fresh conversation's {fresh_pos}: turns were lost"
    );
}
