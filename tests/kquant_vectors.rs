//! `quant::dequantize_row` of Q5_0, Q5_1, Q4_K, Q5_K and Q6_K against an independent decoder:
//! gguf-py's `gguf.quants.dequantize` (the numpy port of ggml's `dequantize_row_*`) on random
//! blocks, stored in tests/fixtures/kquant_vectors.json by tests/reference/kquant_vectors.py.
//! This pins the byte layouts (6-bit scale/min packing, nibble and high-bit order) to ggml's.

use cflow::quant::{dequantize_row, QuantType};

#[test]
fn dequantize_matches_gguf_py_on_random_blocks() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/kquant_vectors.json"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let types = v["types"].as_object().unwrap();
    assert_eq!(types.len(), 5);
    for (name, t) in types {
        let q = QuantType::parse(name).unwrap();
        let hex = t["blocks_hex"].as_str().unwrap();
        let blocks: Vec<u8> = (0..hex.len() / 2)
            .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
            .collect();
        let want: Vec<f32> = t["weights_f32_bits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| f32::from_bits(b.as_u64().unwrap() as u32))
            .collect();
        assert_eq!(
            blocks.len() / q.block_bytes() * q.block_len(),
            want.len(),
            "{name}"
        );
        let mut got = vec![0f32; want.len()];
        dequantize_row(q, &[], &blocks, &mut got);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            // Same formula; allow one rounding of difference in how numpy groups the products.
            let tol = 2.0 * f32::EPSILON * w.abs().max(1e-30);
            assert!(
                (g - w).abs() <= tol,
                "{name} weight {i}: ours {g}, gguf-py {w}"
            );
        }
    }
}
