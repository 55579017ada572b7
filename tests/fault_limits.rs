//! Resource limits: absurd `--threads`, `-n`, `--ctx` are rejected with a clear message (exit
//! code 1, no panic, no output file); a prompt longer than the context is covered in
//! `fault_model_file.rs`.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_cflow-tui");

fn fails_with(args: &[&str], needle: &str) {
    let o = Command::new(BIN).args(args).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
    assert!(err.contains(needle), "{args:?}: {err}");
    assert!(!err.contains("panicked"), "{args:?}: {err}");
}

#[test]
fn absurd_values_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.cflow");
    let out = out.to_str().unwrap();
    let gen = |ctx: &'static str| -> Vec<&str> {
        vec![
            "gen",
            "--arch",
            "arch2_4_combined",
            "--layers",
            "2",
            "--hidden",
            "64",
            "--heads",
            "4",
            "--ffn",
            "128",
            "--experts",
            "4",
            "--expert-ffn",
            "64",
            "--vocab",
            "130",
            "--ctx",
            ctx,
            "-o",
            out,
        ]
    };
    fails_with(&gen("0"), "--ctx 0: must be between 1 and");
    fails_with(&gen("100000000"), "--ctx 100000000: must be between 1 and");
    assert!(!std::path::Path::new(out).exists());
    fails_with(
        &["import", "/nonexistent.gguf", "-o", out, "--ctx", "0"],
        "--ctx 0: must be between",
    );
    // A valid model for the run checks.
    let o = Command::new(BIN).args(gen("64")).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let run = |extra: &[&'static str]| -> Vec<&str> {
        let mut v = vec!["run", out, "--tokens", "1,2"];
        v.extend_from_slice(extra);
        v
    };
    fails_with(
        &run(&["--threads", "0"]),
        "--threads 0: must be between 1 and 256",
    );
    fails_with(
        &run(&["--threads", "100000"]),
        "--threads 100000: must be between 1 and 256",
    );
    fails_with(&run(&["-n", "99999999999"]), "too many tokens");
    fails_with(&run(&["--tokens", "1,99999"]), "out of range");
    // A prompt longer than the 64-token context: the documented refusal, exit 1.
    let long: Vec<String> = (0..80).map(|i| (i % 100).to_string()).collect();
    let long = long.join(",");
    let o = Command::new(BIN)
        .args(["run", out, "--tokens", &long])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("does not fit"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}
