//! Resource limits: absurd `--threads`, `--readers`, `--max-ctx` (of `run` and of `gen`), `-n` are rejected with
//! a clear message (exit code 1, no panic, no output file); a model whose KV cache for its full
//! context does not fit in available memory is refused at open with the computed sizes; a prompt
//! longer than the context is covered in `fault_model_file.rs`.

mod common;

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
        // The tiny model's `gen` arguments with their `--max-ctx` value replaced.
        let mut v = common::TINY_GEN_ARGS[..common::TINY_GEN_ARGS.len() - 1].to_vec();
        v.extend([ctx, "-o", out]);
        v
    };
    fails_with(&gen("0"), "--max-ctx 0: must be between 1 and");
    fails_with(
        &gen("100000000"),
        "--max-ctx 100000000: must be between 1 and",
    );
    assert!(!std::path::Path::new(out).exists());
    fails_with(
        &["import", "/nonexistent.gguf", "-o", out, "--max-ctx", "0"],
        "--max-ctx 0: must be between",
    );
    // A valid model for the run checks.
    let o = Command::new(BIN).args(gen("64")).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let run = |extra: &[&'static str]| -> Vec<&str> {
        let mut v = vec!["run", out, "--token-ids", "1,2"];
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
    fails_with(
        &run(&["--readers", "0"]),
        "--readers 0: must be between 1 and 64",
    );
    fails_with(
        &run(&["--readers", "100000"]),
        "--readers 100000: must be between 1 and 64",
    );
    fails_with(
        &run(&["--max-ctx", "0"]),
        "--max-ctx 0: must be between 1 and 16777216",
    );
    fails_with(&run(&["-n", "99999999999"]), "too many tokens");
    fails_with(&run(&["--token-ids", "1,99999"]), "out of range");
    // A prompt longer than the 64-token context: the documented refusal, exit 1.
    let long: Vec<String> = (0..80).map(|i| (i % 100).to_string()).collect();
    let long = long.join(",");
    let o = Command::new(BIN)
        .args(["run", out, "--token-ids", &long])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("does not fit"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// `MemAvailable` of this machine in bytes.
fn mem_available() -> u64 {
    let s = std::fs::read_to_string("/proc/meminfo").unwrap();
    let kb: u64 = s
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb * 1024
}

#[test]
fn kv_cache_larger_than_memory_is_refused_at_open() {
    let dir = tempfile::tempdir().unwrap();
    // 4 layers, 4 kv heads of 256 dims, the largest context a file may declare: 512 GiB of
    // KV cache, in a 12 MiB file.
    let big = dir.path().join("big.cflow");
    let o = Command::new(BIN)
        .args([
            "gen",
            "--arch",
            "arch2_4_combined",
            "--layers",
            "4",
            "--hidden",
            "1024",
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
            "--max-ctx",
            "16777216",
            "-o",
        ])
        .arg(&big)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // The default f16 cache: 2 B per value.
    let need: u64 = 4 * 2 * 4 * 256 * 2 * (1 << 24);
    if mem_available() >= need {
        eprintln!("SKIP: this machine has at least 256 GiB available");
        return;
    }
    let big = big.to_str().unwrap();
    let sizes = "KV cache for ctx 16777216: 4 layers × 2 × 4 kv heads × 256 dims × 4 B × \
                 16777216 positions = 512.0 GiB > ";
    // The default f16 cache stores 2 B per value.
    let sizes16 = "KV cache for ctx 16777216: 4 layers × 2 × 4 kv heads × 256 dims × 2 B × \
                   16777216 positions = 256.0 GiB > ";
    fails_with(&["run", big, "--token-ids", "1,2"], sizes16);
    fails_with(
        &["run", big, "--token-ids", "1,2"],
        "GiB available memory (",
    );
    fails_with(
        &["run", big, "--token-ids", "1,2"],
        "it fits with --max-ctx ",
    );
    fails_with(&["run", big, "--token-ids", "1,2", "--kv", "f16"], sizes16);
    fails_with(&["run", big, "--token-ids", "1,2", "--kv-f16"], sizes16);
    fails_with(&["run", big, "--token-ids", "1,2", "--kv", "f32"], sizes);
    // A lower context opens it.
    let o = Command::new(BIN)
        .args([
            "run",
            big,
            "--token-ids",
            "1,2",
            "-n",
            "2",
            "--max-ctx",
            "4096",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // A normal model opens.
    let small = common::tiny_model(dir.path(), "2048");
    let o = Command::new(BIN)
        .arg("run")
        .arg(&small)
        .args(["--token-ids", "1,2", "-n", "2"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}
