//! A small importable llama GGUF (`layers` layers of width `d`, byte-level BPE tokenizer, f32
//! tensors), for
//! tests of `import` and `pull` that must not need SmolLM2 or the network. Included with
//! `#[path = "common/tiny_gguf.rs"] mod tiny_gguf;`.

// Also loaded by `mod common` in tests that include both (two copies of test-only code).
#[allow(clippy::duplicate_mod)]
#[path = "gguf_writer.rs"]
mod gguf_writer;

use cflow::convert::gguf::GgufValue;
use gguf_writer::{i32_array, str_array, TestGguf, TestTensor};
use std::path::Path;

/// GPT-2 byte-level alphabet character of a byte.
fn byte_char(b: u8) -> char {
    let printable = |x: u32| matches!(x, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF);
    if printable(b as u32) {
        return b as char;
    }
    let n = (0..b as u32).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + n).unwrap()
}

fn f32_tensor(name: &str, dims: &[u64], seed: u32) -> TestTensor {
    let n: u64 = dims.iter().product();
    let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    let data: Vec<u8> = (0..n)
        .flat_map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            ((x % 2001) as f32 / 1000.0 - 1.0)
                .mul_add(0.05, 0.0)
                .to_le_bytes()
        })
        .collect();
    TestTensor::new(name, dims, 0, data)
}

fn ones(name: &str, n: u64) -> TestTensor {
    TestTensor::new(
        name,
        &[n],
        0,
        (0..n).flat_map(|_| 1f32.to_le_bytes()).collect(),
    )
}

/// The GGUF's bytes; `seed` varies the weights. `d` must be a multiple of 64 (2 heads of a
/// width that is a multiple of 32).
fn bytes(seed: u32, d: u64, layers: u32) -> Vec<u8> {
    let mut toks: Vec<String> = vec![
        "<|endoftext|>".into(),
        "<|im_start|>".into(),
        "<|im_end|>".into(),
    ];
    toks.extend((0..=255u8).map(|b| byte_char(b).to_string()));
    let vocab = toks.len() as u64;
    let mut types = vec![3, 3, 3];
    types.extend(std::iter::repeat_n(1, toks.len() - 3));
    let mut g = TestGguf::default()
        .kv("general.architecture", GgufValue::String("llama".into()))
        .kv("general.name", GgufValue::String("tiny-llama".into()))
        .kv("llama.block_count", GgufValue::U32(layers))
        .kv("llama.embedding_length", GgufValue::U32(d as u32))
        .kv("llama.feed_forward_length", GgufValue::U32(d as u32))
        .kv("llama.attention.head_count", GgufValue::U32(2))
        .kv("llama.attention.head_count_kv", GgufValue::U32(2))
        .kv(
            "llama.attention.layer_norm_rms_epsilon",
            GgufValue::F32(1e-5),
        )
        .kv("llama.context_length", GgufValue::U32(256))
        .kv("tokenizer.ggml.model", GgufValue::String("gpt2".into()))
        .kv("tokenizer.ggml.pre", GgufValue::String("smollm".into()))
        .kv("tokenizer.ggml.tokens", str_array(&toks))
        .kv("tokenizer.ggml.token_type", i32_array(&types))
        .kv("tokenizer.ggml.merges", str_array::<&str>(&[]))
        .kv("tokenizer.ggml.bos_token_id", GgufValue::U32(1))
        .kv("tokenizer.ggml.eos_token_id", GgufValue::U32(2));
    g = g.tensor(f32_tensor("token_embd.weight", &[d, vocab], seed));
    for (i, name) in (0..layers)
        .flat_map(|l| {
            [
                "attn_q",
                "attn_k",
                "attn_v",
                "attn_output",
                "ffn_gate",
                "ffn_up",
                "ffn_down",
            ]
            .map(move |n| format!("blk.{l}.{n}.weight"))
        })
        .enumerate()
    {
        g = g.tensor(f32_tensor(&name, &[d, d], seed + 1 + i as u32));
    }
    for l in 0..layers {
        g = g
            .tensor(ones(&format!("blk.{l}.attn_norm.weight"), d))
            .tensor(ones(&format!("blk.{l}.ffn_norm.weight"), d));
    }
    g = g.tensor(ones("output_norm.weight", d));
    g.write().bytes
}

/// Writes the GGUF to `path` (see [`bytes`]); the smallest is `write(path, seed, 64, 1)`.
pub fn write(path: &Path, seed: u32, d: u64, layers: u32) {
    std::fs::write(path, bytes(seed, d, layers)).unwrap();
}
