//! Issue 19: GGUFs with Q5_0, Q5_1, Q4_K, Q5_K and Q6_K tensors. `import --quant keep` stores
//! their blocks byte for byte (every tile's bytes are checked against the GGUF's rows); the
//! imported model decodes like its dequantized (`--quant f32`) twin on every ISA and activation
//! path; a re-quantizing import warns; a retyped K-quant directory entry is refused on open;
//! `inspect` shows the mix of types and each matrix's own (issue 43 §3).

mod common;

use cflow::convert::gguf::{GgmlType, GgufFile, GgufValue};
use cflow::convert::import_gguf::{import_gguf, QuantTarget};
use cflow::engine::{Engine, EngineOptions};
use cflow::format::{CflowFile, TILE_COLS, TILE_ROWS};
use cflow::kernels::Isa;
use cflow::quant::{quantize_row, QuantType};
use common::gguf_writer::{f32_array, str_array, TestGguf, TestTensor};
use std::path::{Path, PathBuf};
use std::sync::Arc;

const D: u64 = 256;
const KVD: u64 = 128;
const FF: u64 = 512;
const VOCAB: u64 = 64;

/// (tensor, dims, type): every interleaved type appears, with more than one tile row and column.
fn layout() -> Vec<(&'static str, [u64; 2], QuantType)> {
    vec![
        ("token_embd.weight", [D, VOCAB], QuantType::Q6_K),
        ("blk.0.attn_q.weight", [D, D], QuantType::Q4_K),
        ("blk.0.attn_k.weight", [D, KVD], QuantType::Q5_K),
        ("blk.0.attn_v.weight", [D, KVD], QuantType::Q5_0),
        ("blk.0.attn_output.weight", [D, D], QuantType::Q5_1),
        ("blk.0.ffn_gate.weight", [D, FF], QuantType::Q4_K),
        ("blk.0.ffn_up.weight", [D, FF], QuantType::Q6_K),
        ("blk.0.ffn_down.weight", [FF, D], QuantType::Q5_K),
    ]
}

fn weights(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.2
        })
        .collect()
}

/// Blocks of `q` for a `rows × cols` matrix (GGUF row order).
fn blocks(q: QuantType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let w = weights(rows * cols, seed);
    let (mut sc, mut qs) = (Vec::new(), Vec::new());
    for r in w.chunks_exact(cols) {
        quantize_row(q, r, &mut sc, &mut qs);
    }
    assert!(sc.is_empty());
    qs
}

fn gguf() -> Vec<u8> {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    tokens.extend((3..VOCAB).map(|i| format!("▁t{i}")));
    let mut g = TestGguf::default()
        .kv("general.architecture", GgufValue::String("llama".into()))
        // llama.cpp's LLAMA_FTYPE_MOSTLY_Q4_K_M: the name it gives such a mix.
        .kv("general.file_type", GgufValue::U32(15))
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
        .kv(
            "tokenizer.ggml.scores",
            f32_array(&vec![0.0; VOCAB as usize]),
        );
    for (i, (name, dims, q)) in layout().into_iter().enumerate() {
        let data = blocks(q, dims[1] as usize, dims[0] as usize, 7 + i as u64);
        g = g.tensor(TestTensor::new(name, &dims, q as u32, data));
    }
    for name in [
        "blk.0.attn_norm.weight",
        "blk.0.ffn_norm.weight",
        "output_norm.weight",
    ] {
        let ones: Vec<u8> = (0..D).flat_map(|_| 1f32.to_le_bytes()).collect();
        g = g.tensor(TestTensor::new(name, &[D], 0, ones));
    }
    g.write().bytes
}

fn import(dir: &Path, q: QuantTarget, name: &str) -> PathBuf {
    let src = dir.join("k.gguf");
    std::fs::write(&src, gguf()).unwrap();
    let out = dir.join(name);
    import_gguf(&src, &out, q, None, |_, _| {}).unwrap();
    out
}

/// For every K-quant and Q5 tensor, the bytes in our tiles equal the GGUF's blocks: each tile's
/// quant bytes are the GGUF rows' slices for its columns, its scale region is empty and its
/// header records the type.
#[test]
fn kquant_and_q5_tiles_hold_the_gguf_blocks_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let out = import(dir.path(), QuantTarget::Keep, "k.cflow");
    let g = GgufFile::open(dir.path().join("k.gguf")).unwrap();
    let f = CflowFile::open(&out).unwrap();
    let l = &f.layers[0];
    let mats = [
        &f.vocab.embedding,
        &l.q,
        &l.k,
        &l.v,
        &l.o,
        l.gate.as_ref().unwrap(),
        l.up.as_ref().unwrap(),
        l.down.as_ref().unwrap(),
    ];
    let mut checked = 0;
    for ((name, dims, q), m) in layout().into_iter().zip(mats) {
        let t = g.tensor(name).unwrap();
        assert_eq!(t.ggml_type, GgmlType::from_id(q as u32).unwrap());
        assert_eq!(m.quant, q, "{name}");
        let (rows, cols) = (dims[1] as usize, dims[0] as usize);
        let rb = q.matrix_bytes(1, cols);
        assert_eq!(t.data.len(), rows * rb);
        for s in 0..m.n_stripes() {
            for c in 0..m.n_col_tiles() {
                let tile = f.tile(m, s, c);
                assert_eq!({ tile.header.quant_group }, q as u16, "{name}");
                assert!(tile.scales.is_empty(), "{name}");
                let (c0, tr) = (c * TILE_COLS, tile.rows);
                let (o, w) = (q.matrix_bytes(1, c0), q.matrix_bytes(1, tile.cols));
                for r in 0..tr {
                    let gr = s * TILE_ROWS + r;
                    assert_eq!(
                        &tile.qs[r * w..(r + 1) * w],
                        &t.data[gr * rb + o..gr * rb + o + w],
                        "{name} stripe {s} tile {c} row {r}"
                    );
                    checked += w;
                }
            }
        }
        // And reassembled row-major, the whole tensor.
        assert_eq!(f.matrix_data(m).qs, t.data, "{name}");
    }
    let total: usize = layout()
        .iter()
        .map(|(_, d, q)| q.matrix_bytes(d[1] as usize, d[0] as usize))
        .sum();
    assert_eq!(checked, total);
}

fn logits(f: &Arc<CflowFile>, isa: Isa, int_act: bool) -> Vec<f32> {
    let mut e = Engine::new(
        f.clone(),
        EngineOptions {
            threads: 1,
            isa,
            int_act,
            force_int: int_act,
            ..Default::default()
        },
    );
    let mut last = Vec::new();
    for t in [1u32, 5, 9, 3, 40] {
        last = e.step(t, true).unwrap().unwrap().to_vec();
    }
    last
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// The kept-blocks model decodes like its dequantized twin (`--quant f32`: the same weights as
/// exact f32): with f32 activations to float rounding on every ISA, with the Q8_0/Q8_K
/// activations within the activation-rounding error.
#[test]
fn kept_blocks_decode_like_the_dequantized_twin() {
    let dir = tempfile::tempdir().unwrap();
    let keep =
        Arc::new(CflowFile::open(&import(dir.path(), QuantTarget::Keep, "k.cflow")).unwrap());
    let f32m = Arc::new(
        CflowFile::open(&import(
            dir.path(),
            QuantTarget::To(QuantType::F32),
            "f.cflow",
        ))
        .unwrap(),
    );
    let want = logits(&f32m, Isa::Scalar, false);
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    assert!(scale > 0.0);
    for isa in [Isa::Scalar, Isa::Avx2, Isa::Avx512] {
        let got = logits(&keep, isa, false);
        let d = max_abs_diff(&got, &want);
        assert!(
            d <= 1e-4 * scale,
            "{isa:?} f32 act: max |Δ| {d} (scale {scale})"
        );
        let got = logits(&keep, isa, true);
        let d = max_abs_diff(&got, &want);
        assert!(
            d <= 3e-2 * scale,
            "{isa:?} q8 act: max |Δ| {d} (scale {scale})"
        );
    }
    // The integer paths agree across ISAs to float rounding.
    let a = logits(&keep, Isa::Scalar, true);
    let b = logits(&keep, Isa::detect(), true);
    assert!(max_abs_diff(&a, &b) <= 1e-4 * scale);
}

/// `--quant q8_0` warns that re-quantizing loses precision; `keep` does not.
#[test]
fn requantizing_import_warns() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("k.gguf");
    std::fs::write(&src, gguf()).unwrap();
    let run = |q: &str, out: &str| {
        let o = std::process::Command::new(common::BIN)
            .args(["import"])
            .arg(&src)
            .arg("-o")
            .arg(dir.path().join(out))
            .args(["--quant", q])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stderr).to_string()
    };
    let e = run("q8_0", "q8.cflow");
    assert!(e.contains("loses precision"), "{e}");
    let e = run("keep", "keep.cflow");
    assert!(!e.contains("loses precision"), "{e}");
}

/// A directory entry retyped from Q5_0 to Q4_K (same width, different block sizes) is refused on
/// open with a typed error naming the file, never a panic or a misread.
#[test]
fn retyped_kquant_directory_entry_is_refused_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let out = import(dir.path(), QuantTarget::Keep, "k.cflow");
    let mut bytes = std::fs::read(&out).unwrap();
    let mut n = 0;
    for i in 0..bytes.len().saturating_sub(32) {
        // DirEntry: kind u8, quant u8, group u8, reserved u8, rows u32, cols u32, ...
        let rows = u32::from_le_bytes(bytes[i + 4..i + 8].try_into().unwrap());
        let cols = u32::from_le_bytes(bytes[i + 8..i + 12].try_into().unwrap());
        if bytes[i + 1] == QuantType::Q5_0 as u8 && rows == KVD as u32 && cols == D as u32 {
            bytes[i + 1] = QuantType::Q4_K as u8;
            n += 1;
        }
    }
    assert!(n >= 1, "no Q5_0 directory entry found");
    let bad = dir.path().join("bad.cflow");
    std::fs::write(&bad, &bytes).unwrap();
    let e = CflowFile::open(&bad).unwrap_err().to_string();
    assert!(e.contains("bad.cflow"), "{e}");
}

/// Issue 43 §3: a file that mixes types was shown as its first matrix's type (`Q5_0`) in the
/// header and in `inspect`. The report names the mix, with the GGUF's file type, and each
/// matrix's type, in JSON and in text.
#[test]
fn inspect_shows_the_mix_of_types_and_each_matrix_type() {
    let dir = tempfile::tempdir().unwrap();
    let p = import(dir.path(), QuantTarget::Keep, "mix.cflow");
    let f = CflowFile::open(&p).unwrap();
    let r = cflow::inspect::report(&f);
    let mix = &r["quant_mix"];
    assert_eq!(mix["file_type"], "Q4_K_M", "{mix}");
    assert_eq!(
        mix["label"], "Q4_K_M mix: Q4_K ×2 · Q5_K ×2 · Q6_K ×2 · Q5_0 ×1 · Q5_1 ×1",
        "{mix}"
    );
    let q = &r["layers"][0]["quant"];
    for (m, t) in [
        ("q", "Q4_K"),
        ("k", "Q5_K"),
        ("v", "Q5_0"),
        ("o", "Q5_1"),
        ("gate", "Q4_K"),
        ("up", "Q6_K"),
        ("down", "Q5_K"),
    ] {
        assert_eq!(q[m], t, "{m}: {q}");
    }
    let text = cflow::inspect::render(&r);
    assert!(
        text.contains("weights   Q4_K_M mix: Q4_K ×2 · Q5_K ×2"),
        "{text}"
    );
    let row = text
        .lines()
        .skip_while(|l| !l.starts_with("per-layer matrix types"))
        .nth(2)
        .unwrap_or_default();
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        cells,
        ["0", "Q4_K", "Q5_K", "Q5_0", "Q5_1", "Q4_K", "Q6_K", "Q5_K"],
        "{text}"
    );
    // A re-quantized import is one type: no GGUF file type is claimed for it.
    let p = import(dir.path(), QuantTarget::To(QuantType::Q8_0), "q8.cflow");
    let r = cflow::inspect::report(&CflowFile::open(&p).unwrap());
    assert!(r["quant_mix"]["file_type"].is_null(), "{}", r["quant_mix"]);
}
