//! The MoE GGUF architectures (qwen3moe, qwen2moe, olmoe, Mixtral as `llama` with experts) on
//! small generated files: import, what the engine then runs (routing, the shared expert, bytes
//! per token), `run --dump-routing`, `inspect`, the expert benches, and the typed errors of
//! corrupted files (expert count 0, used count > count, 3-D expert tensors whose expert
//! dimension disagrees, a shared-expert gate of the wrong shape, unsupported architectures).
//! Numerics against transformers and llama.cpp: `tests/moe_parity.rs`.

#[path = "common/tiny_gguf.rs"]
mod tiny_gguf;

use cflow::convert::import_gguf::{import_gguf, ImportError, QuantTarget};
use cflow::engine::{Engine, EngineOptions};
use cflow::format::CflowFile;
use cflow::kernels::Isa;
use cflow::model::RouterNorm;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use tiny_gguf::MoeSpec;

fn import(spec: &MoeSpec, dir: &Path) -> Result<PathBuf, ImportError> {
    let src = dir.join(format!("{}.gguf", spec.arch));
    spec.write(&src);
    let out = dir.join(format!("{}.cflow", spec.arch));
    import_gguf(&src, &out, QuantTarget::Keep, None, |_, _| {})?;
    Ok(out)
}

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_cflow-tui"))
}

fn run_ok(cmd: &mut Command) -> String {
    let o = cmd.output().unwrap();
    assert!(
        o.status.success(),
        "{:?} failed:\n{}\n{}",
        cmd,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

#[test]
fn each_moe_architecture_imports_and_routes_top_k() {
    let dir = tempfile::tempdir().unwrap();
    for arch in ["qwen3moe", "qwen2moe", "olmoe", "llama"] {
        let spec = MoeSpec::new(arch);
        let out = import(&spec, dir.path()).unwrap_or_else(|e| panic!("{arch}: {e}"));
        let f = Arc::new(CflowFile::open(&out).unwrap());
        let c = &f.cfg;
        assert_eq!((c.n_experts, c.top_k, c.expert_ffn), (4, 2, 64), "{arch}");
        assert_eq!(c.meta.arch, arch);
        let renorm = matches!(arch, "qwen3moe" | "llama");
        assert_eq!(
            c.meta.router_norm,
            if renorm {
                RouterNorm::SoftmaxTopk
            } else {
                RouterNorm::SoftmaxAll
            },
            "{arch}"
        );
        assert_eq!(c.qk_norm(), matches!(arch, "qwen3moe" | "olmoe"), "{arch}");
        assert_eq!(c.qk_norm_per_head(), arch == "qwen3moe", "{arch}");
        assert_eq!(c.qkv_bias(), arch == "qwen2moe", "{arch}");
        // The shared expert is the dense FFN of the MoE layer, with its sigmoid gate.
        let shared = arch == "qwen2moe";
        assert_eq!(c.d_ff, if shared { 128 } else { 0 }, "{arch}");
        for l in &f.layers {
            assert_eq!(l.shared_gate.is_some(), shared, "{arch}");
            assert_eq!(l.experts.len(), 4);
        }
        let mut e = Engine::new(
            f.clone(),
            EngineOptions {
                threads: 1,
                isa: Isa::detect(),
                ..Default::default()
            },
        );
        for (i, t) in [5u32, 17, 42, 9].into_iter().enumerate() {
            let logits = e.step(t, true).unwrap().unwrap();
            assert!(logits.iter().all(|v| v.is_finite()), "{arch} pos {i}");
            for (l, st) in e.stats().layers.iter().enumerate() {
                assert_eq!(st.routing.len(), 2, "{arch} layer {l}");
                assert_ne!(st.routing[0].0, st.routing[1].0);
                assert!(st.routing.iter().all(|r| (r.0 as usize) < 4));
                let sum: f32 = st.routing.iter().map(|r| r.1).sum();
                if renorm {
                    assert!((sum - 1.0).abs() < 1e-5, "{arch}: weights sum {sum}");
                } else {
                    assert!(sum < 1.0 && sum > 0.0, "{arch}: weights sum {sum}");
                }
                assert!(st.routing[0].1 >= st.routing[1].1, "best first");
            }
        }
    }
}

/// The shared expert's gate changes the output: the same file with the gate's weights zeroed
/// (σ(0) = ½) and with the shared expert off would give other logits; here: the engine's
/// `dense` output is scaled by exactly σ(w · x̂).
#[test]
fn shared_expert_gate_scales_the_shared_ffn() {
    use cflow::engine::layer::shared_gate_scale;
    let g = vec![0.5f32; 4];
    let x = vec![1.0f32, -1.0, 2.0, 0.0];
    let z: f32 = 0.5 * (1.0 - 1.0 + 2.0);
    assert!((shared_gate_scale(&g, &x) - 1.0 / (1.0 + (-z).exp())).abs() < 1e-7);
    assert!((shared_gate_scale(&[0.0; 4], &x) - 0.5).abs() < 1e-7);
}

#[test]
fn run_json_bytes_are_dense_plus_attention_plus_k_over_e_of_experts() {
    let dir = tempfile::tempdir().unwrap();
    for arch in ["qwen3moe", "qwen2moe"] {
        let out = import(&MoeSpec::new(arch), dir.path()).unwrap();
        let s = run_ok(bin().args(["run"]).arg(&out).args([
            "--token-ids",
            "5,6,7",
            "-n",
            "6",
            "--json",
            "--threads",
            "1",
        ]));
        let v: serde_json::Value = serde_json::from_str(s.trim()).unwrap();
        let m = &v["mib_per_token"];
        let f = |k: &str| m[k].as_f64().unwrap();
        let (experts, all) = (f("experts"), f("experts_all"));
        assert!(all > 0.0);
        assert!(
            (experts - all * 2.0 / 4.0).abs() < 1e-9,
            "{arch}: experts {experts} vs all {all}"
        );
        let total = f("attention") + f("dense") + f("experts") + f("lm_head");
        assert!((total - f("total")).abs() < 1e-9);
        if arch == "qwen2moe" {
            assert!(f("dense") > 0.0, "the shared expert is read every token");
        }
        // inspect shows the same split.
        let s = run_ok(bin().arg("inspect").arg(&out).arg("--json"));
        let r: serde_json::Value = serde_json::from_str(&s).unwrap();
        let moe = &r["moe"];
        assert_eq!(moe["experts"], 4);
        assert_eq!(moe["top_k"], 2);
        assert_eq!(moe["shared_expert"], arch == "qwen2moe");
        let im = |k: &str| r["mib_per_token_with_scales"][k].as_f64().unwrap();
        assert!((im("experts_all") - all).abs() < 1e-9);
        assert!((im("experts_topk") - experts).abs() < 1e-9);
        assert!((im("dense") - f("dense")).abs() < 1e-9);
        let ip = |k: &str| r["mib_per_token"][k].as_f64().unwrap();
        assert!((ip("experts_topk") * 2.0 - ip("experts_all")).abs() < 1e-9);
        let text = run_ok(bin().arg("inspect").arg(&out));
        assert!(text.contains("4 experts, top-2"), "{text}");
        assert!(text.contains("selected experts"), "{text}");
    }
}

#[test]
fn dump_routing_writes_every_position() {
    let dir = tempfile::tempdir().unwrap();
    let out = import(&MoeSpec::new("olmoe"), dir.path()).unwrap();
    let dump = dir.path().join("routing.jsonl");
    let o = bin()
        .args(["run"])
        .arg(&out)
        .args([
            "--token-ids",
            "5,6,7",
            "-n",
            "4",
            "--threads",
            "1",
            "--ignore-eos",
        ])
        .arg("--dump-routing")
        .arg(&dump)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&dump)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // 3 prompt positions, then the 4 generated tokens (the last one is fed back too).
    assert_eq!(lines.len(), 7);
    for (i, l) in lines.iter().enumerate() {
        assert_eq!(l["pos"], i);
        let layers = l["layers"].as_array().unwrap();
        assert_eq!(layers.len(), 2);
        for (li, x) in layers.iter().enumerate() {
            assert_eq!(x["layer"], li);
            assert_eq!(x["experts"].as_array().unwrap().len(), 2);
            assert_eq!(x["weights"].as_array().unwrap().len(), 2);
        }
    }
    assert_eq!(lines[0]["token"], 5);
    // A dense model has nothing to dump: a clear error, no file.
    let dense = dir.path().join("dense.gguf");
    tiny_gguf::write(&dense, 1, 64, 1);
    let dense_out = dir.path().join("dense.cflow");
    import_gguf(&dense, &dense_out, QuantTarget::Keep, None, |_, _| {}).unwrap();
    let nd = dir.path().join("none.jsonl");
    let o = bin()
        .args(["run"])
        .arg(&dense_out)
        .args(["--token-ids", "5", "-n", "1", "--dump-routing"])
        .arg(&nd)
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("has no experts"));
    assert!(!nd.exists());
}

#[test]
fn expert_benches_run_on_an_imported_moe() {
    let dir = tempfile::tempdir().unwrap();
    let out = import(&MoeSpec::new("qwen3moe"), dir.path()).unwrap();
    for b in ["overlap", "prefetch"] {
        let s = run_ok(bin().args(["bench", b]).arg(&out).args([
            "--tokens",
            "4",
            "--repeat",
            "1",
            "--json",
            "--threads",
            "1",
        ]));
        let v: serde_json::Value =
            serde_json::from_str(s.trim()).unwrap_or_else(|e| panic!("bench {b}: {e}: {s}"));
        assert!(v.is_object(), "bench {b}: {s}");
    }
}

fn import_err(spec: &MoeSpec) -> (ImportError, bool) {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("bad.gguf");
    spec.write(&src);
    let out = dir.path().join("bad.cflow");
    let e = import_gguf(&src, &out, QuantTarget::Keep, None, |_, _| {}).unwrap_err();
    (e, out.exists())
}

#[test]
fn corrupted_moe_ggufs_give_typed_errors() {
    // expert_count 0 on an always-MoE architecture.
    let (e, wrote) = import_err(&MoeSpec {
        bad_expert_count: Some(0),
        ..MoeSpec::new("qwen3moe")
    });
    assert!(!wrote);
    match &e {
        ImportError::BadKey { key, .. } => assert_eq!(key, "qwen3moe.expert_count", "{e}"),
        other => panic!("{other}"),
    }
    // More experts used than exist.
    let (e, wrote) = import_err(&MoeSpec {
        used: 5,
        ..MoeSpec::new("olmoe")
    });
    assert!(!wrote);
    match &e {
        ImportError::BadKey { key, why, .. } => {
            assert_eq!(key, "olmoe.expert_used_count", "{e}");
            assert!(why.contains("[1, 4]"), "{e}");
        }
        other => panic!("{other}"),
    }
    // 3-D expert tensors whose expert dimension is not expert_count.
    let (e, wrote) = import_err(&MoeSpec {
        bad_exps_dim: Some(3),
        ..MoeSpec::new("qwen3moe")
    });
    assert!(!wrote);
    match &e {
        ImportError::Shape { tensor, why, .. } => {
            assert!(tensor.contains("_exps"), "{e}");
            assert!(why.contains("expected [64, 64, 4]"), "{e}");
        }
        other => panic!("{other}"),
    }
    // The shared expert's gate of the wrong length.
    let (e, wrote) = import_err(&MoeSpec {
        bad_shexp_gate_len: Some(32),
        ..MoeSpec::new("qwen2moe")
    });
    assert!(!wrote);
    match &e {
        ImportError::Shape { tensor, .. } => {
            assert!(tensor.ends_with("ffn_gate_inp_shexp.weight"), "{e}")
        }
        other => panic!("{other}"),
    }
}

#[test]
fn unsupported_architectures_are_named_with_the_supported_list() {
    let dir = tempfile::tempdir().unwrap();
    for arch in ["deepseek2", "gpt-oss"] {
        // A file whose architecture we do not run: refused before anything else is read.
        let b = MoeSpec::new(arch).bytes();
        let src = dir.path().join(format!("{arch}.gguf"));
        std::fs::write(&src, b).unwrap();
        let out = dir.path().join(format!("{arch}.cflow"));
        let e = import_gguf(&src, &out, QuantTarget::Keep, None, |_, _| {}).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, ImportError::Arch { .. }), "{msg}");
        assert!(msg.contains(arch) && msg.contains("qwen3moe") && msg.contains("olmoe"));
        assert!(msg.contains(&src.display().to_string()), "{msg}");
        assert!(!out.exists());
    }
    // A dense architecture with experts in its metadata.
    let (e, _) = import_err(&MoeSpec::new("qwen3"));
    assert!(
        matches!(&e, ImportError::BadKey { key, .. } if key == "qwen3.expert_count"),
        "{e}"
    );
}

/// The `gguf_parse` fuzz seeds of the MoE architectures (fuzz/corpus/gguf_parse/seed_moe_*):
/// one valid small file per architecture and each corruption above. They must equal what this
/// test generates (so they cannot drift from the importer's cases); `CFLOW_WRITE_SEEDS=1`
/// rewrites them.
#[test]
fn moe_fuzz_seeds_are_current() {
    let small = |arch| MoeSpec {
        d: 32,
        layers: 1,
        expert_ffn: 32,
        ..MoeSpec::new(arch)
    };
    let seeds: Vec<(&str, MoeSpec)> = vec![
        ("qwen3moe", small("qwen3moe")),
        ("qwen2moe", small("qwen2moe")),
        ("olmoe", small("olmoe")),
        ("mixtral", small("llama")),
        (
            "expert_count_0",
            MoeSpec {
                bad_expert_count: Some(0),
                ..small("qwen3moe")
            },
        ),
        (
            "used_gt_count",
            MoeSpec {
                used: 5,
                ..small("olmoe")
            },
        ),
        (
            "exps_dim",
            MoeSpec {
                bad_exps_dim: Some(3),
                ..small("qwen3moe")
            },
        ),
        (
            "shexp_gate",
            MoeSpec {
                bad_shexp_gate_len: Some(16),
                ..small("qwen2moe")
            },
        ),
    ];
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/gguf_parse");
    let write = std::env::var_os("CFLOW_WRITE_SEEDS").is_some();
    let tmp = tempfile::tempdir().unwrap();
    for (name, spec) in seeds {
        let p = dir.join(format!("seed_moe_{name}"));
        let bytes = spec.bytes();
        if write {
            std::fs::write(&p, &bytes).unwrap();
        }
        assert_eq!(
            std::fs::read(&p).unwrap_or_default(),
            bytes,
            "{p:?} is stale: rerun with CFLOW_WRITE_SEEDS=1"
        );
        // Valid seeds import; corrupted ones are refused with a typed error.
        let src = tmp.path().join(format!("{name}.gguf"));
        std::fs::write(&src, &bytes).unwrap();
        let r = import_gguf(
            &src,
            &tmp.path().join(format!("{name}.cflow")),
            QuantTarget::Keep,
            None,
            |_, _| {},
        );
        let valid = !name.contains('_');
        assert_eq!(r.is_ok(), valid, "{name}: {r:?}");
    }
}
