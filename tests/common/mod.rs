//! Helpers shared by the fault-injection tests: the tiny synthetic model they run on.

use std::path::{Path, PathBuf};
use std::process::Command;

pub const BIN: &str = env!("CARGO_BIN_EXE_cflow-tui");

/// `gen` arguments of the tiny arch2_4_combined model (append `--ctx N` and `-o FILE`).
pub const TINY_GEN_ARGS: [&str; 19] = [
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
    "2048",
];

/// Generates the tiny model into `dir` with context `ctx` and returns its path.
pub fn tiny_model(dir: &Path, ctx: &str) -> PathBuf {
    let p = dir.join("tiny.cflow");
    let o = Command::new(BIN)
        .args(&TINY_GEN_ARGS[..17])
        .args(["--ctx", ctx, "-o"])
        .arg(&p)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    p
}
