//! What the command line prints, under hostile conditions: a closed stdout or stderr (`cmd |
//! head -1`, `cmd | true`) ends every subcommand quietly (no panic text, an exit code, never a
//! signal); strings from a model file or a trace never reach the terminal as raw control
//! characters; `bench overlap` leaves the rest of the machine's page cache alone unless
//! `--drop-caches` is given.

mod common;

use common::{tiny_model, BIN};
use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// How the reader end of the pipe behaves.
#[derive(Clone, Copy, Debug)]
enum Reader {
    /// `| true`: closed before the program writes anything.
    ClosedAtOnce,
    /// `| head -c 1`: one byte read, then closed.
    OneByte,
}

/// Runs `args` with stdout (and, with `both`, stderr too) going into a pipe that the reader
/// closes early; returns (exit code, stderr text).
fn run_with_closed_pipe(args: &[&str], env: &[(&str, &Path)], reader: Reader) -> (i32, String) {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let mut out = child.stdout.take().unwrap();
    if let Reader::OneByte = reader {
        let mut b = [0u8; 1];
        let _ = out.read(&mut b);
    }
    drop(out);
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let st = child.wait().unwrap();
    assert!(
        st.signal().is_none(),
        "{args:?} ({reader:?}) died by signal {:?}; stderr:\n{err}",
        st.signal()
    );
    (st.code().unwrap(), err)
}

fn assert_quiet(args: &[&str], env: &[(&str, &Path)]) {
    for reader in [Reader::ClosedAtOnce, Reader::OneByte] {
        let (code, err) = run_with_closed_pipe(args, env, reader);
        assert!(
            !err.contains("panicked") && !err.contains("Broken pipe"),
            "{args:?} ({reader:?}) printed panic/EPIPE text:\n{err}"
        );
        assert_eq!(
            code, 0,
            "{args:?} ({reader:?}): exit {code}; stderr:\n{err}"
        );
    }
}

fn write_text(dir: &Path) -> PathBuf {
    let p = dir.join("text.txt");
    std::fs::write(&p, "Once upon a time there was a tiny model. ".repeat(40)).unwrap();
    p
}

#[test]
fn a_closed_stdout_ends_every_subcommand_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let env = [("CFLOW_CACHE", cache.as_path())];
    let m = tiny_model(dir.path(), "2048");
    let m = m.to_str().unwrap();
    let text = write_text(dir.path());
    let text = text.to_str().unwrap();
    let trace = dir.path().join("t.trace.jsonl");
    let o = Command::new(BIN)
        .args(["run", m, "--tokens", "1,2,3", "-n", "8", "--record"])
        .arg(&trace)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let trace = trace.to_str().unwrap();

    assert_quiet(&["run", m, "--tokens", "1,2,3", "-n", "2000"], &env);
    assert_quiet(&["run", m, "--tokens", "1,2,3", "-n", "4", "--json"], &env);
    assert_quiet(&["inspect", m], &env);
    assert_quiet(&["inspect", m, "--json"], &env);
    assert_quiet(&["replay", trace, "--summary"], &env);
    assert_quiet(&["replay", trace, "--summary", "--json"], &env);
    assert_quiet(
        &[
            "bench",
            "decode",
            m,
            "--threads",
            "1",
            "--tokens",
            "2",
            "--repeat",
            "1",
        ],
        &env,
    );
    // The headless demo (no terminal) and perplexity, both on the demo model (it has a
    // tokenizer; generated into the scratch cache on first use).
    assert_quiet(&["--no-tui"], &env);
    let demo = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "cflow"))
        .expect("the headless demo generated the demo model into the cache");
    let demo = demo.to_str().unwrap();
    assert_quiet(&["perplexity", demo, "--file", text, "--ctx", "32"], &env);
    // Generated text (the demo has a tokenizer, so tokens are written as they come): the
    // closed pipe stops the generation.
    assert_quiet(&["run", demo, "--prompt", "Once", "-n", "3000"], &env);
}

#[test]
fn a_closed_stdout_ends_pull_quietly() {
    // `pull smollm2` with the model already in the cache only prints its path.
    if common::smollm2_gguf().is_none() || cflow::convert::pull::smollm2_cflow().is_none() {
        common::missing_oracle("SMOLLM2", "SmolLM2 not pulled into the cache");
        return;
    }
    assert_quiet(&["pull", "smollm2"], &[]);
}

#[test]
fn a_closed_stderr_does_not_panic_either() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_model(dir.path(), "2048");
    let mut child = Command::new(BIN)
        .args(["run", m.to_str().unwrap(), "--tokens", "1,2", "-n", "4"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stderr.take());
    let st = child.wait().unwrap();
    assert!(st.signal().is_none(), "died by signal {:?}", st.signal());
    assert_eq!(st.code(), Some(0));
}

/// Replaces every occurrence of `from` by `to` (same length) in the file.
fn patch_same_length(p: &Path, from: &[u8], to: &[u8]) -> usize {
    assert_eq!(from.len(), to.len());
    let mut b = std::fs::read(p).unwrap();
    let mut n = 0;
    let mut i = 0;
    while let Some(j) = b[i..].windows(from.len()).position(|w| w == from) {
        let at = i + j;
        b[at..at + to.len()].copy_from_slice(to);
        n += 1;
        i = at + to.len();
    }
    std::fs::write(p, b).unwrap();
    n
}

const RAW_CONTROLS: &[char] = &['\u{1b}', '\u{7}', '\u{9b}', '\u{9d}'];

fn assert_no_raw_controls(what: &str, s: &str) {
    assert!(
        !s.chars().any(|c| RAW_CONTROLS.contains(&c)),
        "{what} printed a raw control character:\n{s:?}"
    );
}

#[test]
fn model_and_trace_strings_reach_the_terminal_escaped() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_model(dir.path(), "2048");
    // The metadata's name/arch strings become ESC ] 2 ; (an OSC "set window title") through a
    // JSON escape of the same length, so every offset in the file stays valid.
    let n = patch_same_length(&m, b"\"arch2_4_combined\"", b"\"\\u001b]2;pwned!!\"");
    assert!(n > 0, "the metadata has no arch string to patch");
    let out = Command::new(BIN).arg("inspect").arg(&m).output().unwrap();
    let so = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(so.contains("pwned"), "patched name not shown:\n{so}");
    assert_no_raw_controls("inspect", &so);
    let out = Command::new(BIN)
        .args(["inspect", "--json"])
        .arg(&m)
        .output()
        .unwrap();
    let so = String::from_utf8_lossy(&out.stdout);
    assert_no_raw_controls("inspect --json", &so);
    let v: serde_json::Value = serde_json::from_str(&so).expect("still valid JSON");
    assert!(v.to_string().contains("pwned"));

    let trace = dir.path().join("t.trace.jsonl");
    let out = Command::new(BIN)
        .args([
            "run",
            m.to_str().unwrap(),
            "--tokens",
            "1,2",
            "-n",
            "3",
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
    assert_no_raw_controls("run (stderr report)", &String::from_utf8_lossy(&out.stderr));

    // The trace carries the name as "\u001b]2;pwned!!"; add BEL and CSI (C1) to it.
    let text = std::fs::read_to_string(&trace).unwrap();
    let patched = text.replace("pwned!!", "trace-title\\u0007\\u009b31m");
    assert_ne!(patched, text, "the trace does not carry the model name");
    std::fs::write(&trace, patched).unwrap();
    for json in [false, true] {
        let mut c = Command::new(BIN);
        c.args(["replay", "--summary"]).arg(&trace);
        if json {
            c.arg("--json");
        }
        let out = c.output().unwrap();
        let so = String::from_utf8_lossy(&out.stdout);
        let se = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{se}");
        assert!(
            so.contains("trace-title"),
            "patched trace name not shown:\n{so}"
        );
        assert_no_raw_controls("replay --summary", &so);
        assert_no_raw_controls("replay --summary (stderr)", &se);
        if json {
            serde_json::from_str::<serde_json::Value>(&so).expect("still valid JSON");
        }
    }
}

#[test]
fn bench_overlap_leaves_other_files_in_the_page_cache() {
    use cflow::io::page_cache::resident_fraction;
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_model(dir.path(), "2048");
    // A witness file of someone else's, read into the page cache.
    let w = dir.path().join("witness");
    std::fs::write(&w, vec![1u8; 8 << 20]).unwrap();
    let _ = std::fs::read(&w).unwrap();
    let before = resident_fraction(&w).unwrap();
    if before < 0.9 {
        println!("SKIP: page-cache residency is not observable on this file system ({before:.2})");
        return;
    }
    let out = Command::new(BIN)
        .args([
            "bench",
            "overlap",
            m.to_str().unwrap(),
            "--threads",
            "1",
            "--tokens",
            "1",
        ])
        .args(["--repeat", "1", "--readers", "1"])
        .output()
        .unwrap();
    let so = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{so}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        so.contains("posix_fadvise"),
        "cold-start method not reported:\n{so}"
    );
    let after = resident_fraction(&w).unwrap();
    assert!(
        after > 0.9,
        "bench overlap emptied other files' page cache ({before:.2} -> {after:.2})"
    );
    // --help documents the whole-machine option.
    let h = Command::new(BIN)
        .args(["bench", "overlap", "--help"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&h.stdout).contains("--drop-caches"));
}
