//! A tiny 1-layer llama GGUF (F32 tensors, SentencePiece vocabulary) for tests that corrupt
//! one part of it. Include with `#[path = "common/tiny_llama_gguf.rs"]` next to `gguf_writer`.
#![allow(dead_code)]

use super::gguf_writer::{f32_array, str_array, TestGguf, TestTensor};
use cflow::convert::gguf::GgufValue;
use cflow::rng::Rng;

pub const D: usize = 64;
pub const FF: usize = 256;
pub const V: usize = 64;

pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn small(n: usize, seed: u64) -> Vec<f32> {
    Rng::new(seed).fill(n, 0.05)
}

/// A 1-layer llama GGUF (F32 tensors) with `ffn_down` replaced by `down` (type id, bytes) and
/// extra metadata `kvs`; `edit` may change any F32 tensor by name.
pub fn gguf(
    down: Option<(u32, Vec<u8>)>,
    kvs: &[(&str, GgufValue)],
    edit: &dyn Fn(&str, &mut Vec<f32>),
) -> Vec<u8> {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    tokens.extend((3..V).map(|i| format!("▁t{i}")));
    let mut g = TestGguf::default()
        .kv("general.architecture", GgufValue::String("llama".into()))
        .kv("llama.block_count", GgufValue::U32(1))
        .kv("llama.embedding_length", GgufValue::U32(D as u32))
        .kv("llama.feed_forward_length", GgufValue::U32(FF as u32))
        .kv("llama.attention.head_count", GgufValue::U32(4))
        .kv("llama.attention.head_count_kv", GgufValue::U32(2))
        .kv(
            "llama.attention.layer_norm_rms_epsilon",
            GgufValue::F32(1e-5),
        )
        .kv("llama.context_length", GgufValue::U32(256))
        .kv("tokenizer.ggml.model", GgufValue::String("llama".into()))
        .kv("tokenizer.ggml.tokens", str_array(&tokens))
        .kv("tokenizer.ggml.scores", f32_array(&vec![0.0; V]));
    for (k, v) in kvs {
        // A later key replaces the default one.
        g.kvs.retain(|(kk, _)| kk != k);
        g = g.kv(k, v.clone());
    }
    let (d, ff, v, kv) = (D as u64, FF as u64, V as u64, D as u64 / 2);
    let shapes: [(&str, Vec<u64>); 11] = [
        ("token_embd.weight", vec![d, v]),
        ("blk.0.attn_q.weight", vec![d, d]),
        ("blk.0.attn_k.weight", vec![d, kv]),
        ("blk.0.attn_v.weight", vec![d, kv]),
        ("blk.0.attn_output.weight", vec![d, d]),
        ("blk.0.attn_norm.weight", vec![d]),
        ("blk.0.ffn_norm.weight", vec![d]),
        ("blk.0.ffn_gate.weight", vec![d, ff]),
        ("blk.0.ffn_up.weight", vec![d, ff]),
        ("blk.0.ffn_down.weight", vec![ff, d]),
        ("output_norm.weight", vec![d]),
    ];
    for (i, (name, dims)) in shapes.into_iter().enumerate() {
        let n = dims.iter().product::<u64>() as usize;
        let t = match (&down, name) {
            (Some((ty, bytes)), "blk.0.ffn_down.weight") => {
                TestTensor::new(name, &dims, *ty, bytes.clone())
            }
            _ => {
                let mut w = if name.ends_with("norm.weight") {
                    vec![1.0; n]
                } else {
                    small(n, i as u64 + 1)
                };
                edit(name, &mut w);
                TestTensor::new(name, &dims, 0, f32_bytes(&w))
            }
        };
        g = g.tensor(t);
    }
    g.write().bytes
}
