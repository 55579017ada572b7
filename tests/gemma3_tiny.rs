//! The gemma3 architecture against outside oracles, before any real Gemma file is needed: a tiny
//! trained HF `transformers` Gemma3ForCausalLM exported as a `gemma3` GGUF (Q8_0 matrices, F32
//! norms holding 1 + w, llama.cpp's default local/global pattern, sliding window 4 over 24
//! positions, RoPE 1e6/1e4, q_dim ≠ d), made by `tests/reference/gemma3_tiny.py` and committed
//! with its goldens under `tests/reference/gemma3_tiny/`. Our GGUF import + engine with f32
//! activations must give the HF float32 logits within 2e-3 and the float64 forward of the same
//! dequantized weights (`tests/reference/gemma3_f64_reference.py`, llama.cpp's graph) within
//! 1e-3 at every position, token by token and through the batched prefill.

use cflow::convert::import_gguf::{import_gguf, QuantTarget};
use cflow::engine::{Engine, EngineOptions, Layout};
use cflow::format::CflowFile;
use cflow::kernels::Isa;
use cflow::model::FfnAct;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/reference/gemma3_tiny")
}

struct Golden {
    ids: Vec<u32>,
    hf: Vec<Vec<f32>>,
    f64: Vec<Vec<f64>>,
}

fn golden() -> Golden {
    let v: Value =
        serde_json::from_str(&std::fs::read_to_string(dir().join("goldens.json")).unwrap())
            .unwrap();
    let rows = |v: &Value| -> Vec<Vec<f64>> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|r| {
                r.as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_f64().unwrap())
                    .collect()
            })
            .collect()
    };
    Golden {
        ids: v["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect(),
        hf: rows(&v["hf_logits"])
            .into_iter()
            .map(|r| r.into_iter().map(|x| x as f32).collect())
            .collect(),
        f64: rows(&v["f64_logits"]),
    }
}

fn import(out: &Path) -> Arc<CflowFile> {
    let p = out.join("tiny-gemma3.cflow");
    import_gguf(
        &dir().join("model.gguf"),
        &p,
        QuantTarget::Keep,
        None,
        |_, _| {},
    )
    .unwrap();
    Arc::new(CflowFile::open(&p).unwrap())
}

fn engine(f: &Arc<CflowFile>, int_act: bool, batch_prefill: bool) -> Engine {
    Engine::new(
        f.clone(),
        EngineOptions {
            threads: 1,
            isa: Isa::detect(),
            int_act,
            layout: Layout::Cflow,
            timings: false,
            batch_prefill,
            ..Default::default()
        },
    )
}

/// Logits after each prefix of `ids`, token by token.
fn stepwise(f: &Arc<CflowFile>, ids: &[u32], int_act: bool) -> Vec<Vec<f32>> {
    let mut e = engine(f, int_act, false);
    ids.iter()
        .map(|&t| e.step(t, true).unwrap().unwrap().to_vec())
        .collect()
}

fn max_abs<T: Copy + Into<f64>>(a: &[Vec<f32>], b: &[Vec<T>]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .flat_map(|(x, y)| {
            assert_eq!(x.len(), y.len());
            x.iter().zip(y).map(|(&p, &q)| (p as f64 - q.into()).abs())
        })
        .fold(0.0, f64::max)
}

#[test]
fn import_reads_the_gemma3_semantics() {
    let d = tempfile::tempdir().unwrap();
    let f = import(d.path());
    let c = &f.cfg;
    assert_eq!(c.meta.arch, "gemma3");
    assert_eq!(
        (c.n_layers, c.d_model, c.head_dim, c.q_dim()),
        (7, 64, 32, 128)
    );
    assert_eq!(c.layer_pattern(), "LLLLLGL");
    assert_eq!(c.meta.sliding_window, vec![4, 4, 4, 4, 4, 0, 4]);
    assert_eq!(
        c.meta.rope_theta_per_layer,
        vec![1e4, 1e4, 1e4, 1e4, 1e4, 1e6, 1e4]
    );
    assert!(c.qk_norm() && c.qk_norm_per_head() && c.post_norms() && c.embed_scale());
    assert!(c.tied_embeddings());
    assert_eq!(c.meta.ffn_act, FfnAct::Geglu);
    assert_eq!(c.final_logit_softcap, 0.0);
    assert_eq!(c.attn_scale(), 1.0 / 32f32.sqrt());
    assert_eq!(f.layers[0].q_norm.as_ref().map(|v| v.len()), Some(32));
}

#[test]
fn f32_logits_match_transformers_and_the_f64_forward() {
    let d = tempfile::tempdir().unwrap();
    let f = import(d.path());
    let g = golden();
    let ours = stepwise(&f, &g.ids, false);
    let hf = max_abs(&ours, &g.hf);
    let f64e = max_abs(&ours, &g.f64);
    println!("gemma3 tiny, --act f32: max |Δlogit| vs HF f32 {hf:.2e}, vs f64 {f64e:.2e}");
    assert!(hf <= 2e-3, "vs transformers: {hf}");
    assert!(f64e <= 1e-3, "vs the f64 forward: {f64e}");
    // The same through the batched prefill: the logits after the whole prompt.
    let mut e = engine(&f, false, true);
    assert!(e.can_batch_prefill());
    e.prefill(&g.ids).unwrap();
    let last = e.logits().to_vec();
    let err = max_abs(&[last], &g.f64[g.ids.len() - 1..]);
    assert!(err <= 1e-3, "batched prefill vs f64: {err}");
}

/// Q8 activations (our default numerics): the argmax at every position equals the golden's
/// (the trained model's margins are wide, see synthetic_corpus.py).
#[test]
fn int8_activations_keep_every_top1() {
    let d = tempfile::tempdir().unwrap();
    let f = import(d.path());
    let g = golden();
    let ours = stepwise(&f, &g.ids, true);
    for (i, (a, b)) in ours.iter().zip(&g.hf).enumerate() {
        let (x, y) = (
            cflow::engine::sampler::argmax(a),
            cflow::engine::sampler::argmax(b),
        );
        assert_eq!(x, y, "position {i}");
    }
}

/// `inspect` shows the layer pattern with each kind's window and RoPE base (text and JSON).
#[test]
fn inspect_shows_the_layer_pattern() {
    let d = tempfile::tempdir().unwrap();
    let f = import(d.path());
    let bin = env!("CARGO_BIN_EXE_cflow-tui");
    let o = std::process::Command::new(bin)
        .arg("inspect")
        .arg(&f.path)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains(
            "attention LLLLLGL (L = sliding window 4, θ=10000; G = full attention, θ=1000000) \
             · Q/K norm per head · post-norms"
        ),
        "{text}"
    );
    let o = std::process::Command::new(bin)
        .args(["inspect", "--json"])
        .arg(&f.path)
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["attention"]["pattern"], "LLLLLGL");
    assert_eq!(v["attention"]["sliding_window"][5], 0);
    assert_eq!(v["attention"]["rope_theta"][0], 10000.0);
}
