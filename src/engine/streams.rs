//! Bytes per token of each stream at each execution step, as the engine reads them (the Streams
//! pane, `inspect` and the critical path use this accounting). The dense FFN of a step whose
//! input is known to be zero (ℓ < δd, [`super::schedule::dense_input_is_zero`]) reads nothing.

use super::layer::{attn_bytes, dense_bytes};
use super::schedule::dense_input_is_zero;
use super::styles::steps;
use crate::format::CflowFile;
use crate::telemetry::StreamBytes;

/// Bytes per token of each stream per execution step (attention, dense, top-k experts).
pub fn stream_bytes(file: &CflowFile) -> Vec<StreamBytes> {
    let cfg = &file.cfg;
    steps(cfg)
        .map(|st| {
            let lv = &file.layers[st.block];
            let dense = if dense_input_is_zero(st.l, cfg.dense_delay) {
                0
            } else {
                dense_bytes(lv)
            };
            let experts = lv.experts.first().map_or(0, |e| {
                (e.gate.bytes() + e.up.bytes() + e.down.bytes()) * cfg.top_k
            }) as u64;
            StreamBytes {
                attn: attn_bytes(lv),
                dense,
                experts,
            }
        })
        .collect()
}

/// Bytes of every expert of every execution step (what a token would read if it ran all
/// experts; the selected top-k read `top_k / n_experts` of it, [`stream_bytes`]).
pub fn all_expert_bytes(file: &CflowFile) -> u64 {
    steps(&file.cfg)
        .map(|st| {
            file.layers[st.block]
                .experts
                .iter()
                .map(|e| (e.gate.bytes() + e.up.bytes() + e.down.bytes()) as u64)
                .sum::<u64>()
        })
        .sum()
}
