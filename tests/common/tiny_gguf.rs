//! Small importable GGUFs for tests of `import` and `pull` that must not need a download: a
//! llama (`layers` layers of width `d`, byte-level BPE tokenizer, f32 tensors) and, with
//! [`MoeSpec`], the MoE architectures with one corruption each on request. Included with
//! `#[path = "common/tiny_gguf.rs"] mod tiny_gguf;`.

#![allow(dead_code)] // each test binary uses its own subset

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
    let mut rng = cflow::rng::Rng::new(seed as u64);
    let data: Vec<u8> = (0..n)
        .flat_map(|_| {
            (rng.below(2001) as f32 / 1000.0 - 1.0)
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
    let mut g = bytes_with(seed, d, layers, "llama");
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

/// The architecture's keys (`arch`.*, `layers` blocks of width `d`), the tokenizer, the
/// embedding; the caller adds the layers' tensors and `output_norm.weight`.
fn bytes_with(seed: u32, d: u64, layers: u32, arch: &str) -> TestGguf {
    let mut toks: Vec<String> = vec![
        "<|endoftext|>".into(),
        "<|im_start|>".into(),
        "<|im_end|>".into(),
    ];
    toks.extend((0..=255u8).map(|b| byte_char(b).to_string()));
    let vocab = toks.len() as u64;
    let mut types = vec![3, 3, 3];
    types.extend(std::iter::repeat_n(1, toks.len() - 3));
    let k = |s: &str| format!("{arch}.{s}");
    let g = TestGguf::default()
        .kv("general.architecture", GgufValue::String(arch.into()))
        .kv("general.name", GgufValue::String(format!("tiny-{arch}")))
        .kv(&k("block_count"), GgufValue::U32(layers))
        .kv(&k("embedding_length"), GgufValue::U32(d as u32))
        .kv(&k("feed_forward_length"), GgufValue::U32(d as u32))
        .kv(&k("attention.head_count"), GgufValue::U32(2))
        .kv(&k("attention.head_count_kv"), GgufValue::U32(2))
        .kv(&k("attention.layer_norm_rms_epsilon"), GgufValue::F32(1e-5))
        .kv(&k("context_length"), GgufValue::U32(256))
        .kv("tokenizer.ggml.model", GgufValue::String("gpt2".into()))
        .kv("tokenizer.ggml.pre", GgufValue::String("smollm".into()))
        .kv("tokenizer.ggml.tokens", str_array(&toks))
        .kv("tokenizer.ggml.token_type", i32_array(&types))
        .kv("tokenizer.ggml.merges", str_array::<&str>(&[]))
        .kv("tokenizer.ggml.bos_token_id", GgufValue::U32(1))
        .kv("tokenizer.ggml.eos_token_id", GgufValue::U32(2));
    g.tensor(f32_tensor("token_embd.weight", &[d, vocab], seed))
}

/// Writes the GGUF to `path` (see [`bytes`]); the smallest is `write(path, seed, 64, 1)`.
pub fn write(path: &Path, seed: u32, d: u64, layers: u32) {
    std::fs::write(path, bytes(seed, d, layers)).unwrap();
}

/// A small MoE GGUF of one of the MoE architectures (f32 tensors, the BPE vocabulary of
/// [`bytes`]): 2 heads of `d/2`, `n_expert` experts of width `expert_ffn` in 3-D `ffn_*_exps`
/// tensors, per-architecture extras (Q/K norms, QKV bias, the shared expert). The `bad_*`
/// fields corrupt one thing each, for the typed-error tests and fuzz seeds.
#[derive(Clone, Debug)]
pub struct MoeSpec {
    /// `qwen3moe`, `qwen2moe`, `olmoe` or `llama` (Mixtral).
    pub arch: &'static str,
    pub d: u64,
    pub layers: u32,
    pub n_expert: u32,
    pub used: u32,
    pub expert_ffn: u64,
    pub seed: u32,
    /// Written as the third dimension of the 3-D expert tensors instead of `n_expert`.
    pub bad_exps_dim: Option<u64>,
    /// Length of `ffn_gate_inp_shexp` instead of `d` (qwen2moe).
    pub bad_shexp_gate_len: Option<u64>,
    /// Written as `expert_count` instead of `n_expert` (the tensors keep `n_expert`).
    pub bad_expert_count: Option<u32>,
}

impl MoeSpec {
    pub fn new(arch: &'static str) -> MoeSpec {
        MoeSpec {
            arch,
            d: 64,
            layers: 2,
            n_expert: 4,
            used: 2,
            expert_ffn: 64,
            seed: 1,
            bad_exps_dim: None,
            bad_shexp_gate_len: None,
            bad_expert_count: None,
        }
    }

    /// The GGUF's bytes.
    pub fn bytes(&self) -> Vec<u8> {
        let (a, d, e) = (self.arch, self.d, self.n_expert as u64);
        let hd = d / 2;
        let k = |s: &str| format!("{a}.{s}");
        let base = bytes_with(self.seed, d, self.layers, a);
        let mut g = base
            .kv(
                &k("expert_count"),
                GgufValue::U32(self.bad_expert_count.unwrap_or(self.n_expert)),
            )
            .kv(&k("expert_used_count"), GgufValue::U32(self.used))
            .kv(
                &k("expert_feed_forward_length"),
                GgufValue::U32(self.expert_ffn as u32),
            );
        let shared_ffn = 2 * d;
        if a == "qwen2moe" {
            g = g.kv(
                &k("expert_shared_feed_forward_length"),
                GgufValue::U32(shared_ffn as u32),
            );
        }
        let mut seed = self.seed * 1000;
        let mut t = |name: String, dims: &[u64]| {
            seed += 1;
            f32_tensor(&name, dims, seed)
        };
        let ne = self.bad_exps_dim.unwrap_or(e);
        let mut tensors = Vec::new();
        for l in 0..self.layers {
            let p = |s: &str| format!("blk.{l}.{s}");
            for n in ["attn_q", "attn_k", "attn_v", "attn_output"] {
                tensors.push(t(p(&format!("{n}.weight")), &[d, d]));
            }
            tensors.push(t(p("ffn_gate_inp.weight"), &[d, e]));
            tensors.push(t(p("ffn_gate_exps.weight"), &[d, self.expert_ffn, ne]));
            tensors.push(t(p("ffn_up_exps.weight"), &[d, self.expert_ffn, ne]));
            tensors.push(t(p("ffn_down_exps.weight"), &[self.expert_ffn, d, ne]));
            tensors.push(ones(&p("attn_norm.weight"), d));
            tensors.push(ones(&p("ffn_norm.weight"), d));
            match a {
                "qwen3moe" => {
                    tensors.push(ones(&p("attn_q_norm.weight"), hd));
                    tensors.push(ones(&p("attn_k_norm.weight"), hd));
                }
                "olmoe" => {
                    tensors.push(ones(&p("attn_q_norm.weight"), d));
                    tensors.push(ones(&p("attn_k_norm.weight"), d));
                }
                "qwen2moe" => {
                    for n in ["attn_q", "attn_k", "attn_v"] {
                        tensors.push(t(p(&format!("{n}.bias")), &[d]));
                    }
                    tensors.push(t(p("ffn_gate_shexp.weight"), &[d, shared_ffn]));
                    tensors.push(t(p("ffn_up_shexp.weight"), &[d, shared_ffn]));
                    tensors.push(t(p("ffn_down_shexp.weight"), &[shared_ffn, d]));
                    let gl = self.bad_shexp_gate_len.unwrap_or(d);
                    tensors.push(t(p("ffn_gate_inp_shexp.weight"), &[gl]));
                }
                _ => {}
            }
        }
        for x in tensors {
            g = g.tensor(x);
        }
        g = g.tensor(ones("output_norm.weight", d));
        g.write().bytes
    }

    pub fn write(&self, path: &Path) {
        std::fs::write(path, self.bytes()).unwrap();
    }
}
