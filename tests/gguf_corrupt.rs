//! Corrupted-GGUF cases: every one must produce the matching typed `GgufError`, never a panic.
//! Also opens the real SmolLM2 GGUF when `CFLOW_SMOLLM2` points at it.

mod common;

use cflow::convert::gguf::{GgmlType, GgufError, GgufFile, GgufValue};
use common::gguf_writer::{str_array, TestGguf, TestTensor};

fn base() -> TestGguf {
    TestGguf::default()
        .kv("general.architecture", GgufValue::String("llama".into()))
        .kv("llama.block_count", GgufValue::U32(1))
        .kv("tokenizer.ggml.tokens", str_array(&["a", "b", "c"]))
        .tensor(TestTensor::new("norm", &[8], 0, vec![0u8; 32]))
        .tensor(TestTensor::new("w", &[32, 2], 3, vec![1u8; 40]))
}

fn parse(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
    GgufFile::parse(bytes, "corrupt.gguf")
}

fn patch_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

#[test]
fn valid_base_parses() {
    let f = parse(base().write().bytes).unwrap();
    assert_eq!(f.tensors().len(), 2);
    let w = f.tensor("w").unwrap();
    assert_eq!(w.ggml_type, GgmlType::Q4_1);
    assert_eq!(w.data.len(), 40);
}

#[test]
fn truncated_at_several_points() {
    let w = base().write();
    let b = &w.bytes;
    let points = [
        0,
        3,                         // inside magic
        6,                         // inside version
        12,                        // inside tensor count
        w.kv_pos[0] + 4,           // inside first key length
        w.kv_pos[2] + 20,          // inside the tokens array
        w.tensor_info_pos[1] + 10, // inside the second tensor name
        w.data_start + 5,          // inside tensor data
        b.len() - 1,               // last byte missing
    ];
    for &p in &points {
        match parse(b[..p].to_vec()) {
            Err(GgufError::Truncated { .. })
            | Err(GgufError::StringPastEof { .. })
            | Err(GgufError::AbsurdCount { .. })
            | Err(GgufError::TensorPastEof { .. }) => {}
            other => panic!("truncation at {p}: unexpected {other:?}"),
        }
    }
    // Specific kinds at specific points.
    assert!(matches!(
        parse(b[..6].to_vec()),
        Err(GgufError::Truncated { .. })
    ));
    assert!(matches!(
        parse(b[..w.data_start + 5].to_vec()),
        Err(GgufError::TensorPastEof { .. })
    ));
}

#[test]
fn bad_magic() {
    let mut b = base().write().bytes;
    b[0..4].copy_from_slice(b"GGML");
    let e = parse(b).unwrap_err();
    assert!(matches!(e, GgufError::BadMagic { .. }), "{e}");
    assert!(e.to_string().contains("corrupt.gguf"));
}

#[test]
fn bad_version() {
    for v in [0u32, 1, 4, 0x0300_0000] {
        let mut g = base();
        g.version = v;
        let e = parse(g.write().bytes).unwrap_err();
        match e {
            GgufError::UnsupportedVersion { version, .. } => assert_eq!(version, v),
            other => panic!("{other:?}"),
        }
    }
    let mut g = base();
    g.version = 0x0300_0000;
    assert!(parse(g.write().bytes)
        .unwrap_err()
        .to_string()
        .contains("big-endian"));
    let mut g = base();
    g.version = 2;
    assert!(parse(g.write().bytes).is_ok());
}

#[test]
fn absurd_tensor_count() {
    let mut g = base();
    g.tensor_count_override = Some(u64::MAX / 2);
    let e = parse(g.write().bytes).unwrap_err();
    match e {
        GgufError::AbsurdCount { field, count, .. } => {
            assert_eq!(field, "tensor count");
            assert_eq!(count, u64::MAX / 2);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn absurd_kv_count() {
    let mut g = base();
    g.kv_count_override = Some(1 << 40);
    assert!(matches!(
        parse(g.write().bytes),
        Err(GgufError::AbsurdCount { ref field, .. }) if field == "metadata KV count"
    ));
}

#[test]
fn absurd_array_length() {
    let w = base().write();
    let mut b = w.bytes;
    // tokens KV: key len (8) + key + type (4) + elem type (4) + count (8)
    let key_len = "tokenizer.ggml.tokens".len();
    let count_at = w.kv_pos[2] + 8 + key_len + 4 + 4;
    patch_u64(&mut b, count_at, u64::MAX);
    assert!(matches!(
        parse(b),
        Err(GgufError::AbsurdCount { ref field, .. }) if field.contains("tokenizer.ggml.tokens")
    ));
}

#[test]
fn string_length_past_eof() {
    let w = base().write();
    let mut b = w.bytes;
    // The architecture value string: key len + key + type, then its length.
    let at = w.kv_pos[0] + 8 + "general.architecture".len() + 4;
    patch_u64(&mut b, at, 1 << 33);
    let e = parse(b).unwrap_err();
    assert!(
        matches!(e, GgufError::StringPastEof { len, .. } if len == 1 << 33),
        "{e}"
    );
    // A key length past EOF.
    let w = base().write();
    let mut b = w.bytes;
    patch_u64(&mut b, w.kv_pos[1], u64::MAX);
    assert!(matches!(parse(b), Err(GgufError::StringPastEof { .. })));
}

#[test]
fn invalid_utf8_string() {
    let w = base().write();
    let mut b = w.bytes;
    let at = w.kv_pos[0] + 8 + "general.architecture".len() + 4 + 8;
    b[at] = 0xFF;
    assert!(matches!(parse(b), Err(GgufError::InvalidUtf8 { .. })));
}

#[test]
fn tensor_offset_past_eof() {
    let w = base().write();
    let mut b = w.bytes;
    patch_u64(&mut b, w.tensor_offset_pos[1], 1 << 20);
    match parse(b).unwrap_err() {
        GgufError::TensorPastEof { tensor, offset, .. } => {
            assert_eq!(tensor, "w");
            assert_eq!(offset, 1 << 20);
        }
        other => panic!("{other:?}"),
    }
    // offset + size overflows u64
    let w = base().write();
    let mut b = w.bytes;
    patch_u64(&mut b, w.tensor_offset_pos[1], u64::MAX - 31);
    assert!(matches!(parse(b), Err(GgufError::TensorPastEof { .. })));
}

#[test]
fn unknown_tensor_type_names_tensor_and_id() {
    for id in [4u32, 31, 99, u32::MAX] {
        let g = TestGguf::default().tensor(TestTensor::new(
            "blk.0.attn_q.weight",
            &[32],
            id,
            vec![0; 64],
        ));
        let e = parse(g.write().bytes).unwrap_err();
        let msg = e.to_string();
        match e {
            GgufError::UnknownTensorType {
                tensor, type_id, ..
            } => {
                assert_eq!(tensor, "blk.0.attn_q.weight");
                assert_eq!(type_id, id);
                assert!(msg.contains(&id.to_string()) && msg.contains("blk.0.attn_q.weight"));
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn unknown_value_type() {
    let w = base().write();
    let mut b = w.bytes;
    let at = w.kv_pos[1] + 8 + "llama.block_count".len();
    b[at..at + 4].copy_from_slice(&77u32.to_le_bytes());
    assert!(matches!(
        parse(b),
        Err(GgufError::UnknownValueType { type_id: 77, ref key, .. }) if key == "llama.block_count"
    ));
}

#[test]
fn dims_overflow() {
    let g = TestGguf::default().tensor(TestTensor::new(
        "big",
        &[1 << 32, 1 << 32, 16],
        0,
        vec![0; 4],
    ));
    assert!(matches!(
        parse(g.write().bytes),
        Err(GgufError::DimsOverflow { ref tensor, .. }) if tensor == "big"
    ));
    // Element count fits, byte count does not.
    let g = TestGguf::default().tensor(TestTensor::new("big2", &[1 << 31, 1 << 31], 0, vec![0; 4]));
    assert!(matches!(
        parse(g.write().bytes),
        Err(GgufError::DimsOverflow { .. }) | Err(GgufError::TensorPastEof { .. })
    ));
}

#[test]
fn zero_dim_and_bad_dim_count() {
    let g = TestGguf::default().tensor(TestTensor::new("z", &[4, 0], 0, vec![]));
    assert!(matches!(
        parse(g.write().bytes),
        Err(GgufError::ZeroDim { .. })
    ));
    let g = TestGguf::default().tensor(TestTensor::new("nd", &[], 0, vec![0; 4]));
    assert!(matches!(
        parse(g.write().bytes),
        Err(GgufError::BadDimCount { n_dims: 0, .. })
    ));
    let g = TestGguf::default().tensor(TestTensor::new("nd5", &[1, 1, 1, 1, 1], 0, vec![0; 4]));
    assert!(matches!(
        parse(g.write().bytes),
        Err(GgufError::BadDimCount { n_dims: 5, .. })
    ));
}

#[test]
fn row_not_multiple_of_block() {
    let g = TestGguf::default().tensor(TestTensor::new("q", &[33], 2, vec![0; 36]));
    assert!(matches!(
        parse(g.write().bytes),
        Err(GgufError::RowNotBlockMultiple {
            ne0: 33,
            block: 32,
            ..
        })
    ));
}

#[test]
fn misaligned_tensor_offset() {
    let mut g = base();
    g.tensors[1].offset_override = Some(33);
    assert!(matches!(
        parse(g.write().bytes),
        Err(GgufError::MisalignedTensor {
            offset: 33,
            alignment: 32,
            ..
        })
    ));
}

#[test]
fn overlapping_tensors() {
    let mut g = base();
    g.tensors[1].offset_override = Some(0);
    assert!(matches!(
        parse(g.write().bytes),
        Err(GgufError::OverlappingTensors { .. })
    ));
}

#[test]
fn bad_alignment_value() {
    for a in [0u32, 3, 48] {
        let g = base().kv("general.alignment", GgufValue::U32(a));
        assert!(matches!(
            parse(g.write().bytes),
            Err(GgufError::BadAlignment { .. })
        ));
    }
    let g = base().kv("general.alignment", GgufValue::String("32".into()));
    assert!(matches!(
        parse(g.write().bytes),
        Err(GgufError::WrongType { .. })
    ));
}

#[test]
fn duplicate_key_and_tensor() {
    let g = base().kv("llama.block_count", GgufValue::U32(2));
    assert!(matches!(
        parse(g.write().bytes),
        Err(GgufError::DuplicateKey { .. })
    ));
    let g = base().tensor(TestTensor::new("norm", &[8], 0, vec![0u8; 32]));
    assert!(matches!(
        parse(g.write().bytes),
        Err(GgufError::DuplicateTensor { .. })
    ));
}

#[test]
fn deeply_nested_arrays_rejected() {
    use cflow::convert::gguf::{GgufArray, GgufValueType};
    let mut v = GgufValue::U8(1);
    for _ in 0..10 {
        v = GgufValue::Array(GgufArray {
            elem_type: v.value_type(),
            values: vec![v],
        });
    }
    let g = TestGguf::default().kv("deep", v);
    assert!(matches!(
        parse(g.write().bytes),
        Err(GgufError::ArrayTooDeep { .. })
    ));
    let _ = GgufValueType::Array;
}

#[test]
fn random_byte_flips_never_panic() {
    // Deterministic fuzz over the header region (the crate's generator, fixed seed).
    let w = base().write();
    let mut rng = cflow::rng::Rng::new(0x9E37_79B9_7F4A_7C15);
    for _ in 0..3000 {
        let mut b = w.bytes.clone();
        for _ in 0..3 {
            let s = rng.next_u64();
            let i = (s as usize) % w.data_start;
            b[i] = (s >> 32) as u8;
        }
        let _ = parse(b);
    }
}

#[test]
fn real_smollm2_opens() {
    let Some(path) = common::smollm2_gguf() else {
        return;
    };
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(f.get_u32("llama.block_count").unwrap(), 30);
    assert_eq!(f.get_u32("llama.embedding_length").unwrap(), 576);
    let toks = f.get_str_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(toks.len(), 49152);
    let emb = f.tensor("token_embd.weight").unwrap();
    assert_eq!(emb.ggml_type, GgmlType::Q8_0);
    assert_eq!(emb.dims, &[576, 49152]);
    for (k, v) in f.metadata() {
        let s: String = format!("{v:?}").chars().take(120).collect();
        println!("{k}: {s}");
    }
    let mut types = std::collections::BTreeMap::new();
    for t in f.tensors() {
        *types.entry(t.ggml_type.name()).or_insert(0) += 1;
    }
    println!("tensor types: {types:?}; data_start {}", f.data_start());
}

/// K-quant tensors (issue 19): a row that is not a whole number of 256-weight super-blocks, a
/// tensor whose super-blocks run past the end of the file, and one whose declared size overlaps
/// the next tensor's blocks are typed errors naming the tensor.
#[test]
fn corrupted_kquant_tensors() {
    let k = |name: &str, ty: GgmlType, dims: &[u64], blocks: usize| {
        let n = blocks * ty.type_size() as usize;
        TestTensor::new(name, dims, ty.id(), vec![0x11u8; n])
    };
    // Q4_K row of 384 weights: 1.5 super-blocks.
    let g = base().tensor(k("q4k", GgmlType::Q4_K, &[384, 2], 3));
    match parse(g.write().bytes) {
        Err(GgufError::RowNotBlockMultiple {
            tensor,
            ggml_type,
            block,
            ..
        }) => {
            assert_eq!(
                (tensor.as_str(), ggml_type, block),
                ("q4k", GgmlType::Q4_K, 256)
            );
        }
        r => panic!("expected RowNotBlockMultiple, got {r:?}"),
    }
    for ty in [
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
    ] {
        // Truncated: 4 rows declared, the file holds 3 rows' blocks.
        let per_row = 512 / ty.block_size() as usize;
        let g = base().tensor(k("t", ty, &[512, 4], 3 * per_row));
        match parse(g.write().bytes) {
            Err(GgufError::TensorPastEof { tensor, size, .. }) => {
                assert_eq!(tensor, "t");
                assert_eq!(size, 4 * per_row as u64 * ty.type_size(), "{ty}");
            }
            r => panic!("{ty}: expected TensorPastEof, got {r:?}"),
        }
        // Overlap: the tensor's declared super-blocks run into the next tensor.
        let g = base().tensor(k("a", ty, &[512, 4], per_row)).tensor(k(
            "b",
            ty,
            &[512, 8],
            8 * per_row,
        ));
        match parse(g.write().bytes) {
            Err(GgufError::OverlappingTensors { first, second, .. }) => {
                assert_eq!((first.as_str(), second.as_str()), ("a", "b"), "{ty}");
            }
            r => panic!("{ty}: expected OverlappingTensors, got {r:?}"),
        }
    }
}
