//! Issue 44, class 4: a FIFO given as any input is refused at once, never waited on (a plain
//! `open(2)` of a FIFO blocks until a writer appears). Covers `replay`, `export`, `perplexity
//! --kl-divergence` / `--logits`, model paths, transcripts, the cached machine profile and files
//! hashed for the cache.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_cflow-tui");

fn mkfifo(dir: &Path, name: &str) -> PathBuf {
    let p = dir.join(name);
    assert!(Command::new("mkfifo").arg(&p).status().unwrap().success());
    p
}

/// Runs `cflow-tui args` with a 20 s deadline; returns (exit code, stderr).
fn run(args: &[&dyn AsRef<std::ffi::OsStr>]) -> (Option<i32>, String) {
    let mut c = Command::new(BIN)
        .args(args.iter().map(|a| a.as_ref()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while c.try_wait().unwrap().is_none() {
        if t.elapsed() > Duration::from_secs(20) {
            c.kill().unwrap();
            c.wait().unwrap();
            panic!(
                "{:?}: still blocked after 20 s",
                args.iter().map(|a| a.as_ref()).collect::<Vec<_>>()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let o = c.wait_with_output().unwrap();
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Runs `f` on another thread with a 20 s deadline.
fn in_time<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(f()).unwrap());
    rx.recv_timeout(Duration::from_secs(20))
        .unwrap_or_else(|_| panic!("{what}: blocked on a FIFO"))
}

/// A tiny llama with the reference llama tokenizer (so `perplexity --file` runs).
fn model_with_tokenizer(dir: &Path) -> PathBuf {
    let tj = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/reference/hf/llama/tokenizer.json"),
    )
    .unwrap();
    let v: serde_json::Value = serde_json::from_str(&tj).unwrap();
    let mut spec = cflow::convert::generate::GenSpec::new("llama");
    spec.layers = Some(1);
    spec.hidden = Some(64);
    spec.heads = Some(4);
    spec.kv_heads = Some(2);
    spec.ffn = Some(128);
    spec.ctx = Some(256);
    spec.vocab = Some(v["model"]["vocab"].as_object().unwrap().len().div_ceil(32) * 32);
    spec.tokenizer_json = Some(tj);
    let p = dir.join("tok.cflow");
    cflow::convert::generate::generate(&spec, &p, |_, _| {}).unwrap();
    p
}

#[test]
fn every_cli_input_refuses_a_fifo_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = mkfifo(dir.path(), "in.fifo");
    let model = model_with_tokenizer(dir.path());
    let text = dir.path().join("t.txt");
    std::fs::write(
        &text,
        "one two three four five six seven eight nine ten ".repeat(8),
    )
    .unwrap();
    let reference = dir.path().join("ref.logits");
    let (code, err) = run(&[
        &"perplexity",
        &model,
        &"--file",
        &text,
        &"--max-ctx",
        &"32",
        &"--save-logits",
        &reference,
    ]);
    assert_eq!(code, Some(0), "{err}");
    let out = dir.path().join("out.json");
    let cases: Vec<Vec<&dyn AsRef<std::ffi::OsStr>>> = vec![
        vec![&"replay", &fifo, &"--summary"],
        vec![&"export", &fifo, &"--chrome", &out],
        vec![&"perplexity", &model, &"--kl-divergence", &fifo],
        vec![
            &"perplexity",
            &"--kl-divergence",
            &reference,
            &"--logits",
            &fifo,
        ],
        vec![&"perplexity", &model, &"--file", &fifo],
        vec![&"run", &fifo, &"--token-ids", &"1,2", &"-n", &"1"],
        vec![&"inspect", &fifo],
    ];
    for args in cases {
        let (code, err) = run(&args);
        assert_eq!(code, Some(1), "{err}");
        assert!(
            err.contains("FIFO") || err.contains("not a regular file"),
            "{err}"
        );
    }
}

#[test]
fn transcripts_profiles_and_hashed_files_refuse_a_fifo() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = mkfifo(dir.path(), "x.fifo");
    let f = fifo.clone();
    let e = in_time("transcript", move || {
        cflow::chat::transcript::Transcript::load(&f).map(|_| ())
    })
    .unwrap_err()
    .to_string();
    assert!(e.contains("FIFO"), "{e}");
    let f = fifo.clone();
    let bw = in_time("machine profile", move || {
        cflow::telemetry::machine::MachineProfile::detect("scalar").cached_bandwidth(&f)
    });
    assert!(bw.is_none());
    let f = fifo.clone();
    let e = in_time("sha256", move || cflow::cache::sha256_file(&f))
        .unwrap_err()
        .to_string();
    assert!(e.contains("FIFO"), "{e}");
}
