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
        .args(["run", m, "--token-ids", "1,2,3", "-n", "8", "--record"])
        .arg(&trace)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let trace = trace.to_str().unwrap();

    assert_quiet(&["run", m, "--token-ids", "1,2,3", "-n", "2000"], &env);
    assert_quiet(
        &["run", m, "--token-ids", "1,2,3", "-n", "4", "--json"],
        &env,
    );
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
    assert_quiet(&["perplexity", demo, "--file", text, "--chunk", "32"], &env);
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
        .args(["run", m.to_str().unwrap(), "--token-ids", "1,2", "-n", "4"])
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
            "--token-ids",
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

fn run_bin(args: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// Issue 16 item 12: a directory and a missing file given as the model are refused in one line
/// saying what to do, by the TUI's default command and by `run`. (A GGUF opens through its
/// import in the cache since issue 43: tests/gguf_open.rs.)
#[test]
fn a_model_path_that_is_not_a_model_gives_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let sub = dir.path().join("SmolLM2-dir");
    std::fs::create_dir(&sub).unwrap();
    let missing = dir.path().join("missing.cflow");
    let cases = [(&sub, "is a directory"), (&missing, "no such file")];
    for (p, want) in cases {
        let p = p.to_str().unwrap();
        for args in [
            vec![p, "--no-tui"],
            vec!["run", p, "--token-ids", "1"],
            vec!["inspect", p],
        ] {
            let o = run_bin(&args);
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
            assert_eq!(
                err.trim_end().lines().count(),
                1,
                "{args:?}: not one line:\n{err}"
            );
            assert!(err.contains(want) && err.contains(p), "{args:?}: {err}");
            assert!(!err.contains("os error"), "{args:?}: {err}");
        }
    }
}

/// Issue 16 item 12: a `.vflow` is self-contained, so it opens wherever a model is expected.
#[test]
fn a_vflow_opens_like_a_cflow() {
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("tok.cflow");
    let o = Command::new(BIN)
        .args(&common::TINY_GEN_ARGS[..15])
        .args(["--vocab", "50257", "-o"])
        .arg(&m)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v = dir.path().join("other-name.vflow");
    let o = run_bin(&["convert", m.to_str().unwrap(), "-o", v.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v = v.to_str().unwrap();
    for args in [
        vec![v, "--no-tui", "--threads", "1"],
        vec![
            "run",
            v,
            "--token-ids",
            "1,2",
            "-n",
            "2",
            "--json",
            "--threads",
            "1",
        ],
        vec!["inspect", v],
    ] {
        let o = run_bin(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{args:?}: {err}");
        assert!(!o.stdout.is_empty(), "{args:?}: nothing on stdout; {err}");
    }
}

/// Issue 16 item 12: an error whose message already carries the OS error does not print it a
/// second time as its cause.
#[test]
fn the_os_error_is_printed_once() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing");
    let m = missing.to_str().unwrap();
    let out = dir.path().join("out.json");
    for args in [
        vec!["convert", m],
        vec!["replay", m, "--summary"],
        vec!["export", m, "--chrome", out.to_str().unwrap()],
    ] {
        let o = run_bin(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert_eq!(err.matches("(os error 2)").count(), 1, "{args:?}: {err}");
    }
}

/// The flag lines of a `-h` text: (flag spec, description). clap puts the description after
/// two or more spaces, or (when a column is too wide) alone on the next, deeper-indented line.
fn flag_lines(help: &str) -> Vec<(String, String)> {
    let lines: Vec<&str> = help.lines().collect();
    let indent = |l: &str| l.len() - l.trim_start().len();
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let s = l.trim_start();
        if !(s.starts_with('-') || s.starts_with('[') || s.starts_with('<')) || indent(l) == 0 {
            continue;
        }
        let what = match s.find("  ") {
            Some(at) => s[at..].trim().to_string(),
            None => match lines.get(i + 1) {
                Some(n) if indent(n) > indent(l) && !n.trim_start().starts_with('-') => {
                    n.trim().to_string()
                }
                _ => String::new(),
            },
        };
        let flag = s.split("  ").next().unwrap_or(s).to_string();
        out.push((flag, what));
    }
    out
}

/// Issue 16 item 12: each command's `--help` lists only the flags it uses (the engine flags only
/// where the engine runs, under their own heading), describes every flag and shows an example.
#[test]
fn each_help_lists_its_own_flags_described_with_an_example() {
    let engine: &[&[&str]] = &[
        &[],
        &["run"],
        &["chat"],
        &["perplexity"],
        &["bench", "decode"],
        &["bench", "overlap"],
        &["bench", "prefetch"],
    ];
    let other: &[&[&str]] = &[
        &["gen"],
        &["inspect"],
        &["import"],
        &["pull"],
        &["replay"],
        &["export"],
        &["convert"],
        &["bench", "layout"],
    ];
    for (cmd, runs_engine) in engine
        .iter()
        .map(|c| (c, true))
        .chain(other.iter().map(|c| (c, false)))
    {
        let o = run_bin(&[cmd.to_vec(), vec!["-h"]].concat());
        assert!(o.status.success(), "{cmd:?}");
        let help = String::from_utf8_lossy(&o.stdout);
        assert!(help.contains("Example"), "{cmd:?}: no example:\n{help}");
        assert_eq!(
            help.contains("--expert-tier"),
            runs_engine,
            "{cmd:?}: engine flags listed or missing:\n{help}"
        );
        if runs_engine {
            let at = help
                .find("\nEngine:\n")
                .unwrap_or_else(|| panic!("{cmd:?}:\n{help}"));
            assert!(help[at..].contains("--expert-tier"), "{cmd:?}:\n{help}");
            assert!(!help[..at].contains("--kv-f16"), "{cmd:?}:\n{help}");
        }
        for (flag, what) in flag_lines(&help) {
            assert!(
                !what.is_empty() && !what.starts_with("[default"),
                "{cmd:?}: {flag} has no description:\n{help}"
            );
        }
    }
}

/// Issue 16 item 12: `bench overlap` shows its progress on stderr when that is a terminal (run
/// under `script`, which gives it a pseudo-terminal), and nothing of it through a pipe.
#[test]
fn bench_overlap_shows_progress_on_a_terminal_only() {
    if Command::new("script").arg("--version").output().is_err() {
        return common::missing_oracle("SCRIPT", "util-linux `script` is not installed");
    }
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_model(dir.path(), "2048");
    let args = format!(
        "{BIN} bench overlap {} --threads 1 --tokens 4 --repeat 2 --readers 1",
        m.display()
    );
    let o = Command::new("script")
        .args(["-qec", &args, "/dev/null"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let tty = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{tty}");
    assert!(
        tty.contains("bench overlap: 1 threads"),
        "no progress on a terminal:\n{tty}"
    );
    let o = run_bin(&[
        "bench",
        "overlap",
        m.to_str().unwrap(),
        "--threads",
        "1",
        "--tokens",
        "4",
        "--repeat",
        "2",
        "--readers",
        "1",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        !err.contains("bench overlap:"),
        "progress through a pipe:\n{err}"
    );
}
