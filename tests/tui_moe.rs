//! End-to-end in tmux: an imported MoE GGUF (the committed tiny trained `qwen3moe_k`, Q4_K_M by
//! llama.cpp's own converter and quantizer) opens in the TUI, the Expert routing pane shows its
//! real routing (4 experts, top-2, per-layer counts that change as more tokens are routed), and
//! the Streams pane's bytes per token are those of `run --json`: attention + dense + k/E of the
//! experts.
//! SKIPs when tmux is not installed (`.ci/run` installs it).

mod common;

use cflow::convert::import_gguf::{import_gguf, QuantTarget};
use common::tmux::Tmux;
use std::path::Path;

/// The Expert routing pane's lines (heatmap rows and title) from a screen capture.
fn routing_rows(s: &str) -> Vec<String> {
    s.lines()
        .filter_map(|l| {
            let i = l
                .find("Expert routing")
                .or_else(|| l.find("L0 ").or(l.find("L1 ")))?;
            Some(l[i..].chars().take(40).collect())
        })
        .collect()
}

#[test]
fn imported_moe_routing_pane_counts_change_in_tmux() {
    if !common::have_tmux() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/reference/moe_tiny/qwen3moe_k/model-q4_k_m.gguf");
    let model = dir.path().join("qwen3moe.cflow");
    import_gguf(&src, &model, QuantTarget::Keep, None, |_, _| {}).unwrap();
    let cache = dir.path().join("cache");
    let cmd = format!(
        "CFLOW_CACHE={} {} {} --max-tokens 8; echo EXITED $?; sleep 60",
        cache.display(),
        common::BIN,
        model.display()
    );
    let t = Tmux::start("cflow-e2e-moe", &cmd, 160, 48);
    let s = t.wait(90, "the TUI on the imported MoE", |s| {
        s.contains("Expert routing") && s.contains("qwen3moe")
    });
    assert!(s.contains("waiting for routed tokens"), "{s}");
    t.wait(60, "the probe's end", |s| !s.contains("measuring…"));
    t.literal("abc");
    t.keys(&["Enter"]);
    let first = t.wait(60, "routed tokens", |s| {
        s.contains("E=4 k=2") && s.contains("this token: expert:weight")
    });
    let rows1 = routing_rows(&first);
    // Streams: "Σ attn A · dense D · exp E" (MiB/token, 2 decimals) as `run --json` measures.
    let sigma = first
        .lines()
        .find_map(|l| l.split('Σ').nth(1).map(str::to_owned))
        .unwrap_or_else(|| panic!("no Σ line in Streams:\n{first}"));
    let o = std::process::Command::new(common::BIN)
        .arg("run")
        .arg(&model)
        .args([
            "--token-ids",
            "5,6,7",
            "-n",
            "4",
            "--json",
            "--threads",
            "1",
        ])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let m = &v["mib_per_token"];
    let f = |k: &str| m[k].as_f64().unwrap();
    assert!((f("experts") - f("experts_all") / 2.0).abs() < 1e-9);
    let want = format!(
        " attn {:.2} · dense {:.2} · exp {:.2}",
        f("attention"),
        f("dense"),
        f("experts")
    );
    assert!(
        sigma.starts_with(&want),
        "Streams Σ{sigma} vs run --json{want}"
    );
    assert!(rows1.iter().any(|r| r.starts_with("L1")), "{first}");
    // A second turn routes more tokens: the per-layer counts (and the window) change.
    t.keys(&["Enter"]);
    t.literal("hello");
    t.keys(&["Enter"]);
    let second = t.wait(60, "the routing pane to change", |s| {
        routing_rows(s) != rows1 && s.contains("E=4 k=2")
    });
    assert!(second.contains("ℓ→ℓ+1 overlap"), "{second}");
    t.keys(&["Escape"]);
    t.keys(&["q"]);
    t.wait(30, "exit", |s| s.contains("EXITED 0"));
}
