//! HF import limits (issue 14, items 9 and 12).
//! * Item 12, F16/F32 tiles of any width: a pipeline-native MoE whose experts are 48 wide
//!   imported at `--quant f32` and then `run` panicked ("tile cols 48 not a multiple of 32"). Now
//!   the F16/F32 kernels take any width (SIMD with tails, checked against scalar here end to end
//!   and tile by tile in `kernels::dot`), block types refuse such a width before writing, and a
//!   block-type file with such a width is refused by the reader with a typed error.
//! * Item 9: `config.json` numbers that size an allocation or index an array are refused before
//!   anything is written, naming the key or the field.

use cflow::convert::hf::import_hf;
use cflow::engine::{Engine, EngineOptions, Layout};
use cflow::format::{CflowFile, FormatError};
use cflow::kernels::Isa;
use cflow::quant::QuantType;
use serde_json::{json, Value};
use std::path::Path;
use std::sync::Arc;

/// Writes a safetensors file of F32 tensors (name, shape), filled with small pseudo-random values.
fn write_safetensors(p: &Path, tensors: &[(String, Vec<usize>)]) {
    let mut header = serde_json::Map::new();
    let mut data: Vec<u8> = Vec::new();
    let mut s: u64 = 0x2545_F491_4F6C_DD1D;
    for (name, shape) in tensors {
        let n: usize = shape.iter().product();
        let start = data.len();
        for _ in 0..n {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let v = ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.3;
            data.extend_from_slice(&v.to_le_bytes());
        }
        header.insert(
            name.clone(),
            json!({"dtype": "F32", "shape": shape, "data_offsets": [start, data.len()]}),
        );
    }
    let h = serde_json::to_vec(&Value::Object(header)).unwrap();
    let mut b = (h.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(&h);
    b.extend_from_slice(&data);
    std::fs::write(p, b).unwrap();
}

/// A 2-layer pipeline-native MoE (no dense FFN) with `f`-wide experts.
fn pipeline_native_moe(dir: &Path, f: usize) {
    pipeline_native_moe_with(dir, f, |_| {});
}

/// [`pipeline_native_moe`] with `config.json` edited by `edit` (the tensors follow the defaults).
fn pipeline_native_moe_with(dir: &Path, f: usize, edit: impl FnOnce(&mut Value)) {
    let (d, v, heads, kv, hd, e) = (64usize, 96usize, 4usize, 2usize, 16usize, 4usize);
    let mut config = json!({
        "architectures": ["PipelineNativeForCausalLM"],
        "combine_style": "sequential",
        "vocab_size": v, "hidden_size": d, "num_attention_heads": heads,
        "num_key_value_heads": kv, "head_dim": hd, "intermediate_size": 0,
        "num_experts": e, "num_experts_per_tok": 2, "moe_intermediate_size": f,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 64,
        "tie_word_embeddings": true, "hidden_act": "silu", "num_hidden_layers": 2
    });
    edit(&mut config);
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_vec(&config).unwrap(),
    )
    .unwrap();
    let mut t: Vec<(String, Vec<usize>)> = vec![
        ("model.embed_tokens.weight".into(), vec![v, d]),
        ("model.norm.weight".into(), vec![d]),
    ];
    for l in 0..2 {
        let p = |s: &str| format!("model.layers.{l}.{s}");
        t.push((p("input_layernorm.weight"), vec![d]));
        t.push((p("self_attn.q_proj.weight"), vec![heads * hd, d]));
        t.push((p("self_attn.k_proj.weight"), vec![kv * hd, d]));
        t.push((p("self_attn.v_proj.weight"), vec![kv * hd, d]));
        t.push((p("self_attn.o_proj.weight"), vec![d, heads * hd]));
        t.push((p("moe_norm.weight"), vec![d]));
        t.push((p("moe.router.weight"), vec![e, d]));
        for x in 0..e {
            t.push((p(&format!("moe.experts.{x}.gate_proj.weight")), vec![f, d]));
            t.push((p(&format!("moe.experts.{x}.up_proj.weight")), vec![f, d]));
            t.push((p(&format!("moe.experts.{x}.down_proj.weight")), vec![d, f]));
        }
    }
    write_safetensors(&dir.join("model.safetensors"), &t);
}

fn logits(f: &Arc<CflowFile>, isa: Isa, layout: Layout) -> Vec<f32> {
    let mut e = Engine::new(
        f.clone(),
        EngineOptions {
            threads: 2,
            isa,
            layout,
            ..Default::default()
        },
    );
    let mut last = Vec::new();
    for t in [1u32, 7, 40, 3, 90] {
        last = e.step(t, true).unwrap().unwrap().to_vec();
    }
    last
}

fn close(want: &[f32], got: &[f32], what: &str) {
    let norm = want.iter().map(|v| v * v).sum::<f32>().sqrt();
    for (a, b) in want.iter().zip(got) {
        assert!((a - b).abs() <= 1e-4 * norm + 1e-6, "{what}: {a} vs {b}");
    }
}

#[test]
fn float_experts_48_wide_import_and_run() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("pn");
    std::fs::create_dir(&src).unwrap();
    pipeline_native_moe(&src, 48);
    for q in [QuantType::F32, QuantType::F16] {
        let out = dir.path().join(format!("pn-{q}.cflow"));
        import_hf(&src, &out, q, None, |_, _| {}).unwrap();
        let f = Arc::new(CflowFile::open(&out).unwrap());
        assert_eq!(f.layers[0].experts[0].down.cols, 48);
        // Scalar reference vs this CPU's SIMD kernels, tiled and row-major.
        let want = logits(&f, Isa::Scalar, Layout::Cflow);
        assert!(want.iter().all(|v| v.is_finite()));
        close(
            &want,
            &logits(&f, Isa::detect(), Layout::Cflow),
            "simd tiled",
        );
        close(
            &want,
            &logits(&f, Isa::detect(), Layout::RowMajor),
            "simd rowmajor",
        );
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_cflow-tui"))
            .args(["run", "--token-ids", "1,2,3", "-n", "8"])
            .arg(&out)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{q}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    // A block type cannot hold 48-wide rows: refused before anything is written.
    let out = dir.path().join("pn-q4.cflow");
    let e = import_hf(&src, &out, QuantType::Q4_0, None, |_, _| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("multiple of 32"), "{e}");
    assert!(!out.exists());
}

/// A block-type file claiming 48 columns (an F32 file with its expert quant ids rewritten) is
/// refused at open with a typed error, never handed to the kernels.
#[test]
fn reader_refuses_a_block_type_of_width_48() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("pn");
    std::fs::create_dir(&src).unwrap();
    pipeline_native_moe(&src, 48);
    let out = dir.path().join("pn.cflow");
    import_hf(&src, &out, QuantType::F32, None, |_, _| {}).unwrap();
    let f = CflowFile::open(&out).unwrap();
    let mut b = std::fs::read(&out).unwrap();
    // Directory entries of layer 0: the ExpertDown (kind 10) descriptor's quant byte → Q8_0.
    let off = f.layers[0].offset as usize;
    let n = u32::from_le_bytes(b[off + 8..off + 12].try_into().unwrap()) as usize;
    let mut patched = 0;
    for i in 0..n {
        let at = off + 16 + i * 32;
        if b[at] == 10 {
            b[at + 1] = QuantType::Q8_0 as u8;
            patched += 1;
        }
    }
    assert_eq!(patched, 1);
    drop(f);
    let bad = dir.path().join("bad.cflow");
    std::fs::write(&bad, &b).unwrap();
    let e = CflowFile::open(&bad).unwrap_err();
    assert!(
        matches!(
            &e,
            FormatError::BadField {
                field: "dir.cols",
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("multiple of 32"), "{e}");
}

/// Item 9, HF side: each sizing/indexing number out of range is refused before the output is
/// created, with an error naming the key or the field (`fixed_point_iterations` = 2^32 + 1 was
/// silently truncated to 1; 4294967295 wrote a file whose `inspect` aborted).
#[test]
fn config_numbers_are_validated_before_writing() {
    let dir = tempfile::tempdir().unwrap();
    let fp = |n: u64| {
        move |c: &mut Value| {
            c["combine_style"] = json!("fixed_point");
            c["fixed_point_iterations"] = json!(n);
        }
    };
    type Edit = Box<dyn Fn(&mut Value)>;
    let cases: Vec<(&str, Edit)> = vec![
        ("fixed_point_iterations", Box::new(fp(4_294_967_295))),
        ("fixed_point_iterations", Box::new(fp(4_294_967_297))),
        ("fixed_point_iterations", Box::new(fp(3000))),
        (
            "num_hidden_layers",
            Box::new(|c| c["num_hidden_layers"] = json!(5000)),
        ),
        ("vocab", Box::new(|c| c["vocab_size"] = json!(1u64 << 30))),
        ("experts", Box::new(|c| c["num_experts"] = json!(300))),
        ("top-k", Box::new(|c| c["num_experts_per_tok"] = json!(9))),
        ("bos_id", Box::new(|c| c["bos_token_id"] = json!(96))),
        (
            "attn_logit_softcap",
            Box::new(|c| c["attn_logit_softcapping"] = json!(-1.0)),
        ),
    ];
    for (i, (what, edit)) in cases.iter().enumerate() {
        let src = dir.path().join(format!("pn{i}"));
        std::fs::create_dir(&src).unwrap();
        pipeline_native_moe_with(&src, 32, edit);
        let out = dir.path().join(format!("pn{i}.cflow"));
        let e = import_hf(&src, &out, QuantType::F32, None, |_, _| {})
            .map(|_| ())
            .expect_err(what)
            .to_string();
        assert!(e.contains(what), "{what}: {e}");
        assert!(!out.exists(), "{what}: an output was written");
    }
}
