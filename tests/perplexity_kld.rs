//! `perplexity --save-logits / --kl-divergence / --logits` end to end on the tiny model: a model
//! compared with its own saved distributions has zero KLD and full top-1 agreement, the Q8 path
//! a small positive one; a reference file that does not fit the model, or is corrupt, is refused
//! with an error naming the file and the field, and leaves no `--save-logits` output; the JSON
//! matches assets/schema/perplexity.json.

mod common;

use cflow::ppl::kld::log_softmax;
use cflow::ppl::logits_file::{positions, LogitsHeader, LogitsWriter};
use common::{tiny_model, BIN};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const VOCAB: usize = 130;

/// A reference file over `n` tokens in chunks of `ctx` with arbitrary (deterministic) rows: it
/// fixes the tokens and chunking the model is evaluated on.
fn crafted_ref(dir: &Path, name: &str, vocab: usize, n: usize, ctx: usize) -> PathBuf {
    let path = dir.join(name);
    let tokens: Vec<u32> = (0..n as u32).map(|i| (i * 37 + 5) % vocab as u32).collect();
    let h = LogitsHeader {
        n_vocab: vocab,
        n_ctx: ctx,
        label: "crafted".into(),
        tokens: tokens.clone(),
    };
    let mut w = LogitsWriter::create(&path, &[], &h).unwrap();
    let mut lp = vec![0.0; vocab];
    for k in 0..positions(n, ctx) {
        let logits: Vec<f32> = (0..vocab)
            .map(|j| ((j * 7 + k) % 11) as f32 * 0.3)
            .collect();
        log_softmax(&logits, &mut lp);
        w.push(&lp, (k * 3) % vocab).unwrap();
    }
    w.finish().unwrap();
    path
}

fn ppl(args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("perplexity")
        .args(args)
        .output()
        .unwrap()
}

fn json_ok(args: &[&str]) -> serde_json::Value {
    let o = ppl(args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let schema: serde_json::Value =
        serde_json::from_str(include_str!("../assets/schema/perplexity.json")).unwrap();
    let val = jsonschema::validator_for(&schema).unwrap();
    let errs: Vec<String> = val.iter_errors(&v).map(|e| e.to_string()).collect();
    assert!(errs.is_empty(), "{errs:#?}\n{v:#}");
    v
}

#[test]
fn own_distributions_give_zero_kld_and_q8_a_small_one() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_model(dir.path(), "2048");
    let m = m.to_str().unwrap();
    let r = crafted_ref(dir.path(), "crafted.logits", VOCAB, 70, 32);
    let own = dir.path().join("own.logits");
    let (r, own_s) = (r.to_str().unwrap(), own.to_str().unwrap());
    // f32 against the crafted rows, saving its own.
    let first = json_ok(&[
        m,
        "--kl-divergence",
        r,
        "--act",
        "f32",
        "--threads",
        "1",
        "--save-logits",
        own_s,
        "--json",
    ]);
    assert_eq!(first["predictions"], 31 + 31 + 5);
    assert_eq!(first["act"], "f32");
    assert_eq!(first["reference"]["label"], "crafted");
    assert!(first["kl_divergence"]["kld"]["mean"].as_f64().unwrap() > 0.01);
    // Against its own saved distributions, on one thread, with `act` and any further flags.
    let against_own = |act: &str, more: &[&str]| {
        let head = [m, "--kl-divergence", own_s, "--act", act, "--threads", "1"];
        json_ok(&[&head[..], more, &["--json"]].concat())
    };
    // f32: zero up to the 16-bit rounding.
    let same = against_own("f32", &[]);
    let k = &same["kl_divergence"];
    assert!(k["kld"]["mean"].as_f64().unwrap().abs() < 1e-6, "{k}");
    assert!(k["kld_max"].as_f64().unwrap().abs() < 1e-5, "{k}");
    assert_eq!(k["top1_agreement"]["mean"], 1.0);
    assert!(k["delta_ppl"]["mean"].as_f64().unwrap().abs() < 1e-4, "{k}");
    assert!(same["label"].as_str().unwrap().contains("act=f32"));
    // The file compared with itself, no model: exactly zero.
    let files = json_ok(&["--kl-divergence", own_s, "--logits", own_s, "--json"]);
    assert_eq!(files["kl_divergence"]["kld"]["mean"], 0.0);
    assert_eq!(files["model"], serde_json::Value::Null);
    // The file holds each target's log-probability as f32: the same ppl to f32 rounding.
    let (pf, ps) = (
        files["ppl"].as_f64().unwrap(),
        same["ppl"].as_f64().unwrap(),
    );
    assert!((pf - ps).abs() < 1e-6 * ps, "{pf} vs {ps}");
    // The Q8 path differs a little.
    let q8 = against_own("q8", &[]);
    let kq = q8["kl_divergence"]["kld"]["mean"].as_f64().unwrap();
    assert!(q8["act"] == "q8" && kq > 1e-7 && kq < 0.1, "{q8}");
    assert_eq!(
        (&first["eval"], &files["eval"]),
        (&"step".into(), &"file".into())
    );
    // Each chunk as one batched prompt: the same positions, prefill's rounding only.
    let batch = against_own("f32", &["--batch"]);
    assert_eq!(batch["eval"], "batch");
    assert_eq!(batch["predictions"], first["predictions"]);
    assert!(batch["label"].as_str().unwrap().contains("eval=batch"));
    let kb = batch["kl_divergence"]["kld"]["mean"].as_f64().unwrap();
    assert!(kb.abs() < 1e-4, "{batch}");
    // `--batch` runs a model; read distributions have none to run.
    let o = ppl(&["--batch", "--logits", own_s, "--kl-divergence", own_s]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("--batch"), "{err}");
}

#[test]
fn a_reference_that_does_not_fit_is_refused_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_model(dir.path(), "64");
    let m = m.to_str().unwrap();
    let out = dir.path().join("out.logits");
    let out_s = out.to_str().unwrap();
    let check = |r: &Path, want: &[&str]| {
        let o = ppl(&[
            m,
            "--kl-divergence",
            r.to_str().unwrap(),
            "--save-logits",
            out_s,
        ]);
        let e = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{e}");
        assert!(!e.contains("panicked"), "{e}");
        for w in want {
            assert!(e.contains(w), "missing {w:?} in: {e}");
        }
        assert!(!out.exists(), "--save-logits output left behind");
    };
    // Another vocabulary.
    let r = crafted_ref(dir.path(), "v131.logits", 131, 10, 4);
    check(&r, &["v131.logits", "n_vocab", "131", "130"]);
    // Chunks longer than the model's context.
    let r = crafted_ref(dir.path(), "long.logits", VOCAB, 200, 100);
    check(&r, &["chunks of 100", "context 64"]);
    // Truncated.
    let r = crafted_ref(dir.path(), "cut.logits", VOCAB, 10, 4);
    let b = std::fs::read(&r).unwrap();
    std::fs::write(&r, &b[..b.len() - 3]).unwrap();
    check(&r, &["cut.logits", "bytes"]);
    // Not a reference file at all (the model itself).
    check(Path::new(m), &["tiny.cflow", "not a reference-logits file"]);
    // --chunk that contradicts the reference.
    let r = crafted_ref(dir.path(), "c4.logits", VOCAB, 10, 4);
    let o = ppl(&[m, "--kl-divergence", r.to_str().unwrap(), "--chunk", "8"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("chunks of 4"));
    // --logits from a file with other tokens.
    let other = crafted_ref(dir.path(), "c5.logits", VOCAB, 11, 4);
    let o = ppl(&[
        "--kl-divergence",
        r.to_str().unwrap(),
        "--logits",
        other.to_str().unwrap(),
    ]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && e.contains("c5.logits") && e.contains("tokens"),
        "{e}"
    );
}

/// Issue 43: on a terminal (tmux) the progress is an indicatif bar; it printed
/// `[n] ppl so far …\u000d` lines, the carriage return shown escaped by the console layer.
#[test]
fn progress_on_a_terminal_is_a_bar_not_escaped_carriage_returns() {
    if !common::have_tmux() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_model(dir.path(), "2048");
    let r = crafted_ref(dir.path(), "crafted.logits", VOCAB, 70, 32);
    let cmd = format!(
        "{BIN} perplexity {} --kl-divergence {} --threads 1; echo EXITED $?; sleep 30",
        m.display(),
        r.display()
    );
    let t = common::tmux::Tmux::start("cflow-ppl-bar", &cmd, 120, 40);
    let s = t.wait(60, "the end", |s| s.contains("EXITED"));
    assert!(s.contains("EXITED 0"), "{s}");
    assert!(!s.contains("u000d") && !s.contains("ppl so far"), "{s}");
    assert!(s.to_lowercase().contains("perplexity"), "{s}");
}
