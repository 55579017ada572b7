//! Gemma 3's sliding-window layers keep only their window (`engine::kv`, `with_windows`): on the
//! real model, a 1,000-token prompt (past the 832-row ring of its 512-position windows, so rows
//! move to the front once during the prefill) and 24 decode steps give bit-identical logits to
//! the same engine keeping every position. Needs the Gemma 3 file (`pull gemma3-270m`); SKIP
//! otherwise (a failure under CI=true).

mod common;

use cflow::engine::{Engine, EngineOptions};
use cflow::format::CflowFile;
use std::sync::Arc;

fn logits(f: &Arc<CflowFile>, windows: bool, prompt: &[u32], steps: usize) -> Vec<Vec<u32>> {
    let mut e = Engine::new(
        f.clone(),
        EngineOptions {
            threads: 2,
            timings: false,
            ..Default::default()
        },
    );
    if !windows {
        e.kv_without_windows();
    }
    let mut out = Vec::new();
    let (head, tail) = prompt.split_at(prompt.len() - 1);
    e.prefill(head).expect("prefill");
    let mut last = e
        .step(tail[0], true)
        .expect("step")
        .expect("logits")
        .to_vec();
    for _ in 0..steps {
        out.push(last.iter().map(|x| x.to_bits()).collect());
        let next = (0..last.len())
            .max_by(|&a, &b| last[a].total_cmp(&last[b]))
            .expect("logits") as u32;
        last = e.step(next, true).expect("step").expect("logits").to_vec();
    }
    out
}

#[test]
fn gemma3_window_layers_give_the_full_cache_s_logits() {
    if common::gemma3_gguf().is_none() {
        return;
    }
    let Some(cflow) = cflow::convert::pull_gemma3::gemma3_cflow() else {
        common::missing_oracle(
            "GEMMA3",
            "the Gemma 3 .cflow is missing (cflow-tui pull gemma3-270m)",
        );
        return;
    };
    let f = Arc::new(CflowFile::open(&cflow).expect("open the Gemma 3 .cflow"));
    let prompt: Vec<u32> = (0..1000u32).map(|i| 1000 + (i * 7919) % 200_000).collect();
    let a = logits(&f, true, &prompt, 24);
    let b = logits(&f, false, &prompt, 24);
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert!(x == y, "step {i}: the logits differ");
    }
}
