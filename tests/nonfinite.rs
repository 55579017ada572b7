//! Issue 44, class 3: NaN/Inf never computed silently. Non-finite block scales (every block
//! type), norm weights and degenerate RoPE bases are refused at import with the tensor/key named;
//! a `.cflow` that still carries one (written by hand, bypassing the importers) stops the forward
//! pass with an error naming the first layer and phase, in the engine, the session (an `Error`
//! event, which the TUI shows) and `run`.

#[path = "common/gguf_writer.rs"]
mod gguf_writer;
#[path = "common/tiny_llama_gguf.rs"]
mod tiny_llama_gguf;

use cflow::convert::generate::{gen_layer, gen_vocab, GenSpec};
use cflow::convert::gguf::GgufValue;
use cflow::convert::import_gguf::{import_gguf, QuantTarget};
use cflow::engine::finite::Phase;
use cflow::engine::session::Session;
use cflow::engine::{Engine, EngineOptions, ForwardError};
use cflow::format::{CflowFile, CflowWriter, LayerData, VocabData};
use cflow::quant::QuantType;
use cflow::rng::Rng;
use cflow::telemetry::Event;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use tiny_llama_gguf::{gguf, D, FF};

const BIN: &str = env!("CARGO_BIN_EXE_cflow-tui");

fn import(dir: &Path, bytes: Vec<u8>, q: QuantTarget) -> Result<PathBuf, String> {
    let src = dir.join("m.gguf");
    std::fs::write(&src, bytes).unwrap();
    let out = dir.join("m.cflow");
    let _ = std::fs::remove_file(&out);
    let r = import_gguf(&src, &out, q, None, |_, _| {}).map_err(|e| e.to_string());
    if r.is_err() {
        assert!(!out.exists(), "an output was left behind");
    }
    r.map(|_| out)
}

/// (GGML type id, block bytes, offsets of the f16 scale fields in a block).
const BLOCK_TYPES: [(QuantType, u32, &[usize]); 8] = [
    (QuantType::Q4_0, 2, &[0]),
    (QuantType::Q4_1, 3, &[0, 2]),
    (QuantType::Q5_0, 6, &[0]),
    (QuantType::Q5_1, 7, &[0, 2]),
    (QuantType::Q8_0, 8, &[0]),
    (QuantType::Q4_K, 12, &[0, 2]),
    (QuantType::Q5_K, 13, &[0, 2]),
    (QuantType::Q6_K, 14, &[208]),
];

/// A block scale that is NaN, +Inf or -Inf, in any block type and any of its scale fields, is
/// refused at import with the tensor, row and block named (before: imported, every logit NaN,
/// exit 0).
#[test]
fn non_finite_block_scales_are_refused_at_import_naming_tensor_and_block() {
    let dir = tempfile::tempdir().unwrap();
    for (q, id, offsets) in BLOCK_TYPES {
        let (bb, bl) = (q.block_bytes(), q.block_len());
        let nb = FF / bl;
        // All-zero blocks are valid (scale 0): a clean tensor imports.
        import(
            dir.path(),
            gguf(Some((id, vec![0; D * nb * bb])), &[], &|_, _| {}),
            QuantTarget::Keep,
        )
        .unwrap_or_else(|e| panic!("{q}: clean import failed: {e}"));
        for &off in offsets {
            for bad in [half::f16::NAN, half::f16::INFINITY, half::f16::NEG_INFINITY] {
                let (row, block) = (D - 3, nb - 1);
                let mut data = vec![0u8; D * nb * bb];
                let at = (row * nb + block) * bb + off;
                data[at..at + 2].copy_from_slice(&bad.to_le_bytes());
                for target in [QuantTarget::Keep, QuantTarget::To(QuantType::Q8_0)] {
                    let e = import(
                        dir.path(),
                        gguf(Some((id, data.clone())), &[], &|_, _| {}),
                        target,
                    )
                    .expect_err(&format!("{q} {bad} at offset {off} was imported"));
                    assert!(e.contains("blk.0.ffn_down.weight"), "{q}: {e}");
                    if target == QuantTarget::Keep {
                        assert!(e.contains(&format!("row {row}, block {block}")), "{q}: {e}");
                    }
                }
            }
        }
    }
}

/// Finite F32 weights whose block scale overflows f16 on re-quantization, NaN norm weights and
/// NaN F32 weights are refused too.
#[test]
fn nan_norms_nan_weights_and_overflowing_scales_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    for (tensor, target) in [
        ("blk.0.attn_norm.weight", QuantTarget::Keep),
        ("blk.0.ffn_norm.weight", QuantTarget::Keep),
        ("output_norm.weight", QuantTarget::Keep),
        ("blk.0.attn_q.weight", QuantTarget::Keep),
        ("blk.0.attn_q.weight", QuantTarget::To(QuantType::Q4_0)),
    ] {
        let bytes = gguf(None, &[], &|name, w| {
            if name == tensor {
                w[5] = f32::NAN;
            }
        });
        let e = import(dir.path(), bytes, target).expect_err(tensor);
        assert!(e.contains(tensor) && e.contains("NaN"), "{e}");
    }
    let bytes = gguf(None, &[], &|name, w| {
        if name == "blk.0.ffn_up.weight" {
            w[7] = 1e9;
        }
    });
    import(dir.path(), bytes.clone(), QuantTarget::Keep).unwrap();
    let e = import(dir.path(), bytes, QuantTarget::To(QuantType::Q8_0)).unwrap_err();
    assert!(
        e.contains("blk.0.ffn_up.weight") && e.contains("inf"),
        "{e}"
    );
}

/// A RoPE base must be finite and > 1 (before: 1e-45 imported and gave NaN logits).
#[test]
fn rope_base_must_be_finite_and_above_one() {
    let dir = tempfile::tempdir().unwrap();
    for theta in [1e-45, 0.5, 1.0, f32::NAN, f32::INFINITY, -10.0] {
        let bytes = gguf(
            None,
            &[("llama.rope.freq_base", GgufValue::F32(theta))],
            &|_, _| {},
        );
        let e = import(dir.path(), bytes, QuantTarget::Keep).expect_err(&theta.to_string());
        assert!(
            e.contains("llama.rope.freq_base") && e.contains("> 1"),
            "{e}"
        );
    }
    let bytes = gguf(
        None,
        &[("llama.rope.freq_base", GgufValue::F32(1.5))],
        &|_, _| {},
    );
    import(dir.path(), bytes, QuantTarget::Keep).unwrap();
}

type Poison = dyn Fn(&mut [LayerData], &mut VocabData);

/// A model with a poisoned weight written by hand (the importers refuse it).
fn poisoned(dir: &Path, arch: &str, poison: &Poison) -> PathBuf {
    let mut spec = GenSpec::new(arch);
    spec.layers = Some(3);
    spec.hidden = Some(64);
    spec.heads = Some(4);
    spec.kv_heads = Some(2);
    spec.ffn = Some(128);
    spec.vocab = Some(130);
    spec.ctx = Some(64);
    let cfg = spec.config().unwrap();
    let mut rng = Rng::new(7);
    let mut layers: Vec<LayerData> = (0..cfg.n_layers)
        .map(|_| gen_layer(&mut rng, &cfg, QuantType::Q8_0))
        .collect();
    let mut vocab = gen_vocab(&mut rng, &cfg, QuantType::Q8_0);
    poison(&mut layers, &mut vocab);
    let out = dir.join(format!("poison-{}.cflow", fastrand::u64(..)));
    let mut w = CflowWriter::create(&out, &cfg).unwrap();
    for l in &layers {
        w.write_layer(l).unwrap();
    }
    w.finish(&vocab, &cfg.meta).unwrap();
    out
}

fn first_error(path: &Path, batch_prefill: bool) -> cflow::engine::finite::NonFinite {
    let f = Arc::new(CflowFile::open(path).unwrap());
    let mut e = Engine::new(
        f,
        EngineOptions {
            threads: 1,
            batch_prefill,
            ..Default::default()
        },
    );
    match e.prefill(&[1, 2, 3, 4]) {
        Err(ForwardError::NonFinite(nf)) => nf,
        other => panic!("expected a non-finite error, got {other:?}"),
    }
}

/// At run time the first non-finite value stops the token with the layer and phase named, on
/// the token-by-token and the batched prefill paths.
#[test]
fn run_time_guard_names_the_first_layer_and_phase() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, &Poison, Option<usize>, Phase); 4] = [
        (
            "attn_norm[1]",
            &|l, _| l[1].attn_norm[3] = f32::NAN,
            Some(1),
            Phase::Attention,
        ),
        (
            "ffn_norm[2]",
            &|l, _| l[2].ffn_norm.as_mut().unwrap()[0] = f32::INFINITY,
            Some(2),
            Phase::FeedForward,
        ),
        (
            "final_norm",
            &|_, v| v.final_norm[9] = f32::NAN,
            None,
            Phase::Logits,
        ),
        (
            "embedding scale",
            // Row 2 (token 2), block 0: f16 0x7fff is a NaN.
            &|_, v| v.embedding.scales[8..10].copy_from_slice(&[0xff, 0x7f]),
            None,
            Phase::Embedding,
        ),
    ];
    for (what, poison, layer, phase) in cases {
        let p = poisoned(dir.path(), "llama", poison);
        for batch in [false, true] {
            let nf = first_error(&p, batch);
            assert_eq!(
                (nf.layer, nf.phase),
                (layer, phase),
                "{what} (batch {batch}): {nf}"
            );
        }
    }
}

/// The session ends the generation with an `Error` event (shown by the TUI) and `run` exits
/// non-zero with the layer named (before: exit 0 with NaN logits).
#[test]
fn session_emits_an_error_event_and_run_fails() {
    let dir = tempfile::tempdir().unwrap();
    let p = poisoned(dir.path(), "llama", &|l, _| l[1].attn_norm[0] = f32::NAN);
    let f = Arc::new(CflowFile::open(&p).unwrap());
    let engine = Engine::new(
        f,
        EngineOptions {
            threads: 1,
            ..Default::default()
        },
    );
    let mut s = Session::new(engine, Default::default()).unwrap();
    let mut events = Vec::new();
    let out = s.generate(&[1, 2, 3], 4, false, &mut |e| events.push(e));
    let err = out.error.expect("an error");
    assert!(err.contains("layer 1, attention"), "{err}");
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Event::Error { message, .. } if message.contains("layer 1"))),
        "{events:?}"
    );
    let o = Command::new(BIN)
        .arg("run")
        .arg(&p)
        .args(["--token-ids", "1,2,3", "-n", "4"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{stderr}");
    assert!(stderr.contains("layer 1, attention"), "{stderr}");
}
