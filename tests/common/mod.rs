//! Helpers shared by the integration tests: the tiny synthetic model the fault tests run on,
//! and the oracles (SmolLM2, tmux) with the rule for a missing one: a SKIP line on a
//! developer's machine, a failure under CI (`CI=true`) or when `CFLOW_REQUIRE_<NAME>=1`.
#![allow(dead_code)] // each test binary uses its own subset

pub mod gguf_writer;
pub mod tmux;

use std::path::{Path, PathBuf};
use std::process::Command;

pub const BIN: &str = env!("CARGO_BIN_EXE_cflow-tui");

/// `gen` arguments of the tiny arch2_4_combined model (append `--max-ctx N` and `-o FILE`).
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
    "--max-ctx",
    "2048",
];

/// Generates the tiny model into `dir` with context `ctx` and returns its path.
pub fn tiny_model(dir: &Path, ctx: &str) -> PathBuf {
    let p = dir.join("tiny.cflow");
    let o = Command::new(BIN)
        .args(&TINY_GEN_ARGS[..17])
        .args(["--max-ctx", ctx, "-o"])
        .arg(&p)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    p
}

/// True when a missing oracle `name` (e.g. "SMOLLM2", "TMUX") must fail the test: `CI=true`
/// or `CFLOW_REQUIRE_<name>=1`.
pub fn oracle_required(name: &str) -> bool {
    let on = |k: &str| std::env::var(k).is_ok_and(|v| matches!(v.as_str(), "1" | "true" | "yes"));
    on("CI") || on(&format!("CFLOW_REQUIRE_{name}"))
}

/// A missing oracle: panics when it is required ([`oracle_required`]), otherwise prints the
/// SKIP line and returns.
pub fn missing_oracle(name: &str, why: &str) {
    if oracle_required(name) {
        panic!("{why}, and it is required here (CI=true or CFLOW_REQUIRE_{name}=1)");
    }
    println!("SKIP: {why}");
}

/// The SmolLM2 GGUF (`$CFLOW_SMOLLM2` or the pull cache), or `None` after [`missing_oracle`].
pub fn smollm2_gguf() -> Option<PathBuf> {
    let p = cflow::convert::pull::smollm2_gguf();
    if p.is_none() {
        missing_oracle(
            "SMOLLM2",
            "SmolLM2 GGUF not found (set CFLOW_SMOLLM2 or run `cflow-tui pull smollm2`)",
        );
    }
    p
}

/// SmolLM2 re-quantized by llama.cpp's `llama-quantize --allow-requantize` to `kind` ("Q4_K_M",
/// "Q6_K"): `$CFLOW_SMOLLM2_<KIND>` or `/tmp/SmolLM2-135M-Instruct.<KIND>.gguf` (where
/// tests/reference/requantize_smollm2.sh writes it), or `None` after [`missing_oracle`].
pub fn smollm2_requantized_gguf(kind: &str) -> Option<PathBuf> {
    let var = format!("CFLOW_SMOLLM2_{kind}");
    let p = std::env::var_os(&var)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(format!("/tmp/SmolLM2-135M-Instruct.{kind}.gguf")));
    if p.is_file() {
        return Some(p);
    }
    missing_oracle(
        "SMOLLM2_KQUANT",
        &format!(
            "{} not found (set {var} or run tests/reference/requantize_smollm2.sh)",
            p.display()
        ),
    );
    None
}

/// The Gemma 3 270M GGUF (`$CFLOW_GEMMA3` or the pull cache), or `None` after
/// [`missing_oracle`].
pub fn gemma3_gguf() -> Option<PathBuf> {
    let p = cflow::convert::pull_gemma3::gemma3_gguf();
    if p.is_none() {
        missing_oracle(
            "GEMMA3",
            "Gemma 3 GGUF not found (set CFLOW_GEMMA3 or run `cflow-tui pull gemma3-270m --accept-license`)",
        );
    }
    p
}

/// True when tmux runs here; otherwise [`missing_oracle`] and false.
pub fn have_tmux() -> bool {
    let ok = Command::new("tmux")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        missing_oracle("TMUX", "tmux not installed (apt-get install -y tmux)");
    }
    ok
}

/// Leading greedy steps of a llama.cpp golden (`greedy`, `greedy_margin`) to compare: up to the
/// reference's first near-tie (margin < 0.05): past it either answer is right.
pub fn greedy_cmp_len(p: &serde_json::Value) -> usize {
    let n = p["greedy"].as_array().unwrap().len();
    p["greedy_margin"]
        .as_array()
        .unwrap()
        .iter()
        .position(|m| m.as_f64().unwrap() < 0.05)
        .unwrap_or(n)
        .min(n)
}
