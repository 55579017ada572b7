//! `.cflow` writer ⇄ reader: round trips for every quant type and matrix kind, byte-exact
//! re-writing, determinism of `gen`, the 18,448-byte Q4_0 tile, and the Q/K norm entries.

use cflow::convert::generate::{generate, GenSpec};
use cflow::format::vflow::{convert, is_twin_of, VflowFile};
use cflow::format::CflowFile;
use cflow::format::{CflowWriter, FormatError, GlobalHeader, LayerData};
use cflow::model::{ModelConfig, FLAG_QK_NORM};
use cflow::quant::QuantType;
use std::path::Path;

fn tiny(arch: &str, q: QuantType) -> GenSpec {
    let mut s = GenSpec::new(arch);
    s.layers = Some(3);
    s.hidden = Some(160); // 160 = 256 boundary tile of 160 cols
    s.heads = Some(4);
    s.kv_heads = Some(2);
    s.ffn = Some(288); // two column tiles in down (256 + 32)
    s.experts = Some(4);
    s.top_k = Some(2);
    s.expert_ffn = Some(96);
    s.vocab = Some(300); // 3 stripes: 128 + 128 + 44 rows
    s.quant = q;
    s.seed = 42;
    if q.block_len() == 256 {
        // K-quants: whole 256-weight super-blocks in every row (two column tiles in down).
        s.hidden = Some(256);
        s.ffn = Some(512);
        s.expert_ffn = Some(256);
    }
    s
}

fn rewrite(f: &CflowFile, out: &Path) {
    let mut w = CflowWriter::create(out, &f.cfg).unwrap();
    for i in 0..f.cfg.n_layers {
        w.write_layer(&f.layer_data(i)).unwrap();
    }
    w.finish(&f.vocab_data(), &f.cfg.meta).unwrap();
}

#[test]
fn roundtrip_every_quant_and_kind_byte_exact() {
    let dir = tempfile::tempdir().unwrap();
    for q in QuantType::ALL {
        for arch in ["arch2_4_combined", "llama", "mixtral"] {
            let a = dir.path().join(format!("{arch}-{q}.cflow"));
            let mut spec = tiny(arch, q);
            spec.tied = arch == "llama";
            let cfg = generate(&spec, &a, |_, _| {}).unwrap();
            let f = CflowFile::open(&a).unwrap();
            assert_eq!(f.cfg, cfg);
            // Re-generate the layer data with the same seed and compare matrix by matrix.
            let mut rng = cflow::rng::Rng::new(spec.seed);
            for i in 0..cfg.n_layers {
                let want = cflow::convert::generate::gen_layer(&mut rng, &cfg, q);
                assert_eq!(f.layer_data(i), want, "{arch} {q} layer {i}");
            }
            let want_v = cflow::convert::generate::gen_vocab(&mut rng, &cfg, q);
            assert_eq!(f.vocab_data(), want_v);
            let b = dir.path().join(format!("{arch}-{q}-b.cflow"));
            rewrite(&f, &b);
            assert_eq!(
                std::fs::read(&a).unwrap(),
                std::fs::read(&b).unwrap(),
                "{arch} {q}"
            );
        }
    }
}

#[test]
fn gen_is_deterministic() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b, c) = (
        dir.path().join("a"),
        dir.path().join("b"),
        dir.path().join("c"),
    );
    let spec = tiny("arch2_4_combined", QuantType::Q4_0);
    generate(&spec, &a, |_, _| {}).unwrap();
    generate(&spec, &b, |_, _| {}).unwrap();
    let mut other = spec.clone();
    other.seed = 43;
    generate(&other, &c, |_, _| {}).unwrap();
    let (ba, bb, bc) = (
        std::fs::read(a).unwrap(),
        std::fs::read(b).unwrap(),
        std::fs::read(c).unwrap(),
    );
    assert_eq!(ba, bb);
    assert_ne!(ba, bc);
}

#[test]
fn full_q4_0_tiles_are_18448_bytes_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.cflow");
    let mut spec = tiny("llama", QuantType::Q4_0);
    spec.hidden = Some(512);
    spec.heads = Some(8);
    spec.kv_heads = Some(8);
    spec.ffn = Some(2048);
    generate(&spec, &p, |_, _| {}).unwrap();
    let f = CflowFile::open(&p).unwrap();
    let q = &f.layers[0].q;
    assert_eq!(q.tile_offset(0, 1) - q.tile_offset(0, 0), 18_448);
    assert_eq!(q.stripe_bytes(0), 2 * 18_448);
    let t = f.tile(q, 1, 1);
    assert_eq!(
        (t.rows, t.cols, t.scales.len(), t.qs.len()),
        (128, 256, 2048, 16384)
    );
    assert_eq!({ t.header.row_offset }, 128);
    assert_eq!({ t.header.col_offset }, 256);
}

/// Q/K norm entries (`FLAG_QK_NORM`, OLMoE) and `clip_qkv`: written, read back, re-written
/// byte-exact and carried into a `.vflow` twin; the writer and the reader both insist that the
/// flag and the entries agree, and the reader rejects a negative clip.
#[test]
fn qk_norm_entries_round_trip_and_must_agree_with_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.cflow");
    generate(&tiny("mixtral", QuantType::Q8_0), &a, |_, _| {}).unwrap();
    let f = CflowFile::open(&a).unwrap();
    let mut cfg = f.cfg.clone();
    cfg.feature_flags |= FLAG_QK_NORM;
    cfg.meta.clip_qkv = 8.0;
    let plain: Vec<LayerData> = (0..cfg.n_layers).map(|i| f.layer_data(i)).collect();
    let mut layers = plain.clone();
    for (i, l) in layers.iter_mut().enumerate() {
        let i = i as f32;
        l.q_norm = Some((0..cfg.q_dim()).map(|j| 1.0 + i + j as f32 / 1e3).collect());
        l.k_norm = Some(
            (0..cfg.kv_dim())
                .map(|j| 2.0 - i - j as f32 / 1e3)
                .collect(),
        );
    }
    let write = |cfg: &ModelConfig, ls: &[LayerData], out: &Path| -> Result<(), FormatError> {
        let mut w = CflowWriter::create(out, cfg)?;
        for l in ls {
            w.write_layer(l)?;
        }
        w.finish(&f.vocab_data(), &cfg.meta)
    };
    let b = dir.path().join("b.cflow");
    write(&cfg, &layers, &b).unwrap();
    let g = CflowFile::open(&b).unwrap();
    assert_eq!(g.cfg, cfg);
    for (i, l) in layers.iter().enumerate() {
        assert_eq!(&g.layer_data(i), l, "layer {i}");
    }
    let c = dir.path().join("c.cflow");
    rewrite(&g, &c);
    assert_eq!(std::fs::read(&b).unwrap(), std::fs::read(&c).unwrap());
    // The .vflow twin carries the entries and the metadata.
    let v = dir.path().join("b.vflow");
    convert(&g, &v, 2).unwrap();
    let vf = VflowFile::open(&v).unwrap();
    assert!(is_twin_of(&vf, &g));
    let vf = vf.into_file();
    assert_eq!(vf.cfg, g.cfg);
    for (x, y) in vf.layers.iter().zip(&g.layers) {
        assert_eq!((&x.q_norm, &x.k_norm), (&y.q_norm, &y.k_norm));
        assert!(x.q_norm.is_some());
    }
    // Writer: entries without the flag, the flag without entries, a wrong length.
    let x = dir.path().join("x.cflow");
    let mut no_flag = cfg.clone();
    no_flag.feature_flags &= !FLAG_QK_NORM;
    assert!(write(&no_flag, &layers, &x).is_err());
    assert!(write(&cfg, &plain, &x).is_err());
    let mut short = layers.clone();
    short[1].k_norm.as_mut().unwrap().pop();
    let e = write(&cfg, &short, &x).unwrap_err().to_string();
    assert!(e.contains("k_norm"), "{e}");
    assert!(!x.exists());
    // Reader: the flag flipped in the header of either file is a typed mismatch.
    for (src, name) in [(&a, "flag-set.cflow"), (&b, "flag-clear.cflow")] {
        let mut bytes = std::fs::read(src).unwrap();
        let mut h = GlobalHeader::decode(&bytes).unwrap();
        h.feature_flags ^= FLAG_QK_NORM;
        bytes[..88].copy_from_slice(&h.encode());
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        let e = CflowFile::open(&p).unwrap_err();
        assert!(
            matches!(e, FormatError::Mismatch { .. }) && e.to_string().contains("Q/K norm"),
            "{name}: {e}"
        );
    }
    // A negative clip_qkv: the writer refuses it before creating the file (it refuses every
    // configuration the reader would reject) ...
    let mut neg = cfg.clone();
    neg.meta.clip_qkv = -1.0;
    let e = write(&neg, &layers, &x).unwrap_err().to_string();
    assert!(e.contains("clip_qkv"), "{e}");
    assert!(!x.exists());
    // ... and the reader rejects a file whose metadata was edited to say so.
    let mut pos = cfg.clone();
    pos.meta.clip_qkv = 1.5;
    write(&pos, &layers, &x).unwrap();
    let mut bytes = std::fs::read(&x).unwrap();
    let (from, to) = (b"\"clip_qkv\":1.5", b"\"clip_qkv\":-15");
    let at = bytes
        .windows(from.len())
        .position(|w| w == from)
        .expect("clip_qkv in the metadata");
    bytes[at..at + from.len()].copy_from_slice(to);
    let p = dir.path().join("neg-clip.cflow");
    std::fs::write(&p, bytes).unwrap();
    let e = CflowFile::open(&p).unwrap_err();
    assert!(
        matches!(e, FormatError::BadMetadata { .. }) && e.to_string().contains("clip_qkv"),
        "{e}"
    );
}
