//! `cflow-tui inspect`: a report of a model file (header, geometry, delays, per-layer regions,
//! per-stream bytes per token, expert table, quant types, metadata keys), as JSON or text.

use crate::engine::critical::{
    critical_path_both, fixed_point_accounting, fixed_point_line, payload_stream_bytes,
};
use crate::engine::stream_bytes;
use crate::format::quant_mix::{self, layer_matrices};
use crate::format::CflowFile;
use serde_json::{json, Value};

use crate::util::MIB;

pub fn report(f: &CflowFile) -> Value {
    let c = &f.cfg;
    let h = f.header;
    let version = { h.version };
    let stored = stream_bytes(f);
    let payload = payload_stream_bytes(f);
    let layers: Vec<Value> = f
        .layers
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let ex = l.experts.first();
            json!({
                "layer": i,
                "offset": l.offset,
                "bytes": l.len,
                // Each matrix's own type (a Q4_K_M file mixes them within a layer).
                "quant": layer_matrices(l)
                    .into_iter()
                    .map(|(name, q)| (name.to_string(), Value::from(q.name())))
                    .collect::<serde_json::Map<String, Value>>(),
                "stream_mib": {
                    "attention": payload.get(i).map_or(0.0, |s| s.attn as f64 / MIB),
                    "dense": payload.get(i).map_or(0.0, |s| s.dense as f64 / MIB),
                    "experts_topk": payload.get(i).map_or(0.0, |s| s.experts as f64 / MIB),
                },
                "stream_mib_with_scales": {
                    "attention": stored.get(i).map_or(0.0, |s| s.attn as f64 / MIB),
                    "dense": stored.get(i).map_or(0.0, |s| s.dense as f64 / MIB),
                    "experts_topk": stored.get(i).map_or(0.0, |s| s.experts as f64 / MIB),
                },
                "experts": l.experts.len(),
                "expert_region_bytes": ex.map(|e| e.len),
            })
        })
        .collect();
    let sum = |v: &[crate::telemetry::StreamBytes]| {
        let a: u64 = v.iter().map(|s| s.attn).sum();
        let d: u64 = v.iter().map(|s| s.dense).sum();
        let e: u64 = v.iter().map(|s| s.experts).sum();
        (a, d, e)
    };
    let (pa, pd, pe) = sum(&payload);
    let (sa, sd, se) = sum(&stored);
    let lm = f.lm_head();
    let meta = serde_json::to_value(&c.meta).unwrap_or(Value::Null);
    let meta_keys: Vec<String> = meta
        .as_object()
        .map(|o| {
            o.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, _)| k.clone())
                .collect()
        })
        .unwrap_or_default();
    json!({
        "file": f.path.display().to_string(),
        "file_bytes": f.bytes().len(),
        "format": {"magic": "CFLOW", "version": version, "hash": crate::format::file_hash(f)},
        "name": c.meta.name,
        "arch": c.meta.arch,
        "synthetic": c.meta.synthetic,
        "geometry": {
            "layers": c.n_layers, "effective_layers": c.effective_layers(), "d_model": c.d_model,
            "heads": c.n_heads, "kv_heads": c.n_kv_heads, "head_dim": c.head_dim, "d_ff": c.d_ff,
            "experts": c.n_experts, "top_k": c.top_k, "expert_ffn": c.expert_ffn, "vocab": c.vocab,
            "max_ctx": c.max_ctx,
        },
        "semantics": {
            "combine_style": c.combine_style.name(), "dense_delay": c.dense_delay, "expert_delay": c.expert_delay,
            "rms_eps": c.rms_eps, "rope_theta": c.rope_theta, "rope_style": c.meta.rope_style,
            "feature_flags": c.feature_flags, "tied_embeddings": c.tied_embeddings(),
            "embed_scale": c.embed_scale(), "v_norm": c.v_norm(), "final_logit_softcap": c.final_logit_softcap,
        },
        "quant_mix": quant_mix_report(f),
        "attention": attention_report(c),
        "moe": moe_report(f),
        "mib_per_token": {
            "attention": pa as f64 / MIB, "dense": pd as f64 / MIB, "experts_topk": pe as f64 / MIB,
            "experts_all": if c.top_k > 0 { (pe * c.n_experts as u64 / c.top_k as u64) as f64 / MIB } else { 0.0 },
            "lm_head": lm.payload_bytes() / MIB,
            "total": (pa + pd + pe) as f64 / MIB + lm.payload_bytes() / MIB,
        },
        "mib_per_token_with_scales": {
            "attention": sa as f64 / MIB, "dense": sd as f64 / MIB, "experts_topk": se as f64 / MIB,
            "experts_all": crate::engine::streams::all_expert_bytes(f) as f64 / MIB,
            "lm_head": lm.bytes() as f64 / MIB,
            "total": (sa + sd + se + lm.bytes() as u64) as f64 / MIB,
        },
        "critical_path_mib": critical_path_both(f),
        "fixed_point_accounting": fixed_point_accounting(f),
        "layers": layers,
        "vocab": {"embedding_quant": f.vocab.embedding.quant.name(), "lm_head_quant": lm.quant.name(),
            "tied": c.tied_embeddings(), "region_bytes": f.vocab.len},
        "metadata_keys": meta_keys,
        "has_tokenizer": c.meta.tokenizer_json.is_some() || c.meta.tokenizer_loaded,
        "has_chat_template": c.meta.chat_template.is_some(),
    })
}

/// The file's weight types: `file_type` (the GGUF's name for its mix, when the import
/// recorded it, else null), `matrices` (how many matrices of each type, the most common
/// first) and `label` (one type's name, or `Q4_K_M mix: Q5_0 ×81 · …`).
fn quant_mix_report(f: &CflowFile) -> Value {
    let ft = quant_mix::file_type(f);
    let mix: Vec<(String, u64)> = quant_mix::mix(f)
        .into_iter()
        .map(|(q, n)| (q.name().to_string(), n as u64))
        .collect();
    json!({
        "file_type": ft,
        "matrices": mix.iter().map(|(q, n)| json!({"quant": q, "count": n})).collect::<Vec<_>>(),
        "label": quant_mix::label(ft.as_deref(), &mix),
    })
}

/// The MoE geometry (null for a dense model): experts, top-k, expert FFN width, the shared
/// expert (the dense FFN of a layer with routed experts, always run: Qwen2-MoE's, sigmoid-gated,
/// or `moefy`'s) and the router's weighting.
fn moe_report(f: &CflowFile) -> Value {
    let c = &f.cfg;
    if !c.has_experts() {
        return Value::Null;
    }
    let shared = f
        .layers
        .iter()
        .any(|l| !l.experts.is_empty() && l.gate.is_some());
    let gated = f.layers.iter().any(|l| l.shared_gate.is_some());
    json!({
        "experts": c.n_experts,
        "top_k": c.top_k,
        "expert_ffn": c.expert_ffn,
        "shared_expert": shared,
        "shared_expert_ffn": if shared { c.d_ff } else { 0 },
        "shared_expert_gated": gated,
        "router": c.meta.router_norm,
    })
}

/// The text lines of [`moe_report`], with the bytes per token as read (with scales).
fn moe_line(m: &Value, b: &Value) -> Option<String> {
    if m.is_null() {
        return None;
    }
    let f = |v: &Value| v.as_f64().unwrap_or(0.0);
    let shared = if m["shared_expert"].as_bool() == Some(true) {
        format!(
            " · shared expert FFN {} ({}always run)",
            m["shared_expert_ffn"],
            if m["shared_expert_gated"].as_bool() == Some(true) {
                "sigmoid-gated, "
            } else {
                ""
            }
        )
    } else {
        " · no shared expert".into()
    };
    Some(format!(
        "MoE       {} experts, top-{} · expert FFN {}{} · router {}
                   MiB/token (with scales): attention {:.3} · dense {:.3} · selected experts {:.3} of {:.3} for all experts ({}/{})",
        m["experts"],
        m["top_k"],
        m["expert_ffn"],
        shared,
        m["router"].as_str().unwrap_or(""),
        f(&b["attention"]),
        f(&b["dense"]),
        f(&b["experts_topk"]),
        f(&b["experts_all"]),
        m["top_k"],
        m["experts"],
    ))
}

/// The per-layer attention kinds: `pattern` has one letter per layer (`L` sliding window, `G`
/// full attention), with each layer's window and RoPE base, and the Q/K-norm, post-norm and
/// logit-scale semantics.
fn attention_report(c: &crate::model::ModelConfig) -> Value {
    let n = c.n_layers;
    json!({
        "pattern": c.layer_pattern(),
        "sliding_window": (0..n).map(|i| c.sliding_window_for(i)).collect::<Vec<_>>(),
        "rope_theta": (0..n).map(|i| c.rope_theta_for(i)).collect::<Vec<_>>(),
        "qk_norm": match (c.qk_norm(), c.qk_norm_per_head()) {
            (false, _) => "none",
            (true, false) => "whole projection",
            (true, true) => "per head",
        },
        "post_norms": c.post_norms(),
        "logit_scale": c.attn_scale(),
        "softcap": c.meta.attn_logit_softcap,
    })
}

/// One line for the attention pattern when layers differ (windows, per-layer RoPE bases) or the
/// model has Q/K norms or post-norms; `None` for a uniform plain model.
fn attention_line(a: &Value) -> Option<String> {
    let pat = a["pattern"].as_str().unwrap_or("");
    let nums = |k: &str| -> Vec<f64> {
        a[k].as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_f64())
            .collect()
    };
    let (win, theta) = (nums("sliding_window"), nums("rope_theta"));
    let mixed = pat.contains('L') || theta.windows(2).any(|w| w[0] != w[1]);
    let qk = a["qk_norm"].as_str().unwrap_or("none");
    let post = a["post_norms"].as_bool() == Some(true);
    if !mixed && qk == "none" && !post {
        return None;
    }
    let kind = |letter: char| -> Option<String> {
        let i = pat.chars().position(|ch| ch == letter)?;
        let w = win.get(i).copied().unwrap_or(0.0);
        let t = theta.get(i).copied().unwrap_or(0.0);
        Some(if letter == 'L' {
            format!("L = sliding window {w}, θ={t}")
        } else {
            format!("G = full attention, θ={t}")
        })
    };
    let kinds: Vec<String> = ['L', 'G'].into_iter().filter_map(kind).collect();
    Some(format!(
        "attention {pat} ({}) · Q/K norm {qk}{} · logit scale {:.5}",
        kinds.join("; "),
        if post { " · post-norms" } else { "" },
        a["logit_scale"].as_f64().unwrap_or(0.0)
    ))
}

/// The critical path in its three accountings, labelled (the text form of `critical_path_mib`).
pub fn critical_path_line(c: &Value) -> String {
    let f = |v: &Value| v.as_f64().unwrap_or(0.0);
    let part = |k: &str| {
        format!(
            "{:.2} → {:.2} ({:.2}×)",
            f(&c[k]["naive"]),
            f(&c[k]["delayed"]),
            f(&c[k]["ratio"])
        )
    };
    let mut s = format!(
        "critical path (eq. 4.23), MiB/token: payload, every layer's weights (the paper's convention) {}",
        part("payload")
    );
    if c["payload_read"].is_object() {
        s.push_str(&format!(
            "\n  as read (zero-input dense FFNs of ℓ < δd skipped): payload {} · with scales {}",
            part("payload_read"),
            part("with_scales")
        ));
    } else {
        s.push_str(&format!(" · with scales {}", part("with_scales")));
    }
    s
}

pub fn render(r: &Value) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let g = &r["geometry"];
    let s = &r["semantics"];
    let f = |v: &Value| v.as_f64().unwrap_or(0.0);
    let _ = writeln!(
        o,
        "{}  ({} bytes, .cflow v{}, hash {})",
        r["file"].as_str().unwrap_or(""),
        r["file_bytes"],
        r["format"]["version"],
        r["format"]["hash"].as_str().unwrap_or("")
    );
    let _ = writeln!(
        o,
        "model     {} · arch {}{}",
        r["name"].as_str().unwrap_or(""),
        r["arch"].as_str().unwrap_or(""),
        if r["synthetic"].as_bool() == Some(true) {
            " · SYNTHETIC weights"
        } else {
            ""
        }
    );
    if let Some(label) = r["quant_mix"]["label"].as_str() {
        let _ = writeln!(o, "weights   {label} (matrices per type)");
    }
    let _ = writeln!(o, "geometry  L={} (effective {}) d={} heads={}/{} kv head_dim={} d_ff={} experts={} top-k={} expert_ffn={} vocab={} ctx={}",
        g["layers"], g["effective_layers"], g["d_model"], g["heads"], g["kv_heads"], g["head_dim"], g["d_ff"], g["experts"], g["top_k"], g["expert_ffn"], g["vocab"], g["max_ctx"]);
    let _ = writeln!(o, "semantics {} · δd={} δe={} · eps {} · rope θ={} {} · flags {:#x} (tied {}, embed-scale {}, v-norm {}) · final softcap {}",
        s["combine_style"].as_str().unwrap_or(""), s["dense_delay"], s["expert_delay"], s["rms_eps"], s["rope_theta"], s["rope_style"], s["feature_flags"].as_u64().unwrap_or(0), s["tied_embeddings"], s["embed_scale"], s["v_norm"], s["final_logit_softcap"]);
    if let Some(line) = attention_line(&r["attention"]) {
        let _ = writeln!(o, "{line}");
    }
    if let Some(line) = moe_line(&r["moe"], &r["mib_per_token_with_scales"]) {
        let _ = writeln!(o, "{line}");
    }
    let _ = writeln!(o, "\nper-layer streams, MiB/token as read (payload at the nominal bits/weight; with scales + tile headers in parentheses; a dense FFN whose input is zero, ℓ < δd, reads 0)");
    let _ = writeln!(
        o,
        "{:>5} {:>10}  {:>18} {:>18} {:>18}",
        "layer", "region MiB", "attention", "dense", "experts top-k"
    );
    for l in r["layers"].as_array().into_iter().flatten() {
        let _ = writeln!(
            o,
            "{:>5} {:>10.2}  {:>7.2} ({:>7.3})  {:>7.2} ({:>7.3})  {:>7.2} ({:>7.3})",
            l["layer"],
            f(&l["bytes"]) / MIB,
            f(&l["stream_mib"]["attention"]),
            f(&l["stream_mib_with_scales"]["attention"]),
            f(&l["stream_mib"]["dense"]),
            f(&l["stream_mib_with_scales"]["dense"]),
            f(&l["stream_mib"]["experts_topk"]),
            f(&l["stream_mib_with_scales"]["experts_topk"])
        );
    }
    matrix_types(&mut o, r);
    let p = &r["mib_per_token"];
    let w = &r["mib_per_token_with_scales"];
    let _ = writeln!(o, "\nper token: attention {:.2} · dense {:.2} · experts {:.2} · lm head {:.2} · total {:.2} MiB  (with scales: {:.2} MiB)",
        f(&p["attention"]), f(&p["dense"]), f(&p["experts_topk"]), f(&p["lm_head"]), f(&p["total"]), f(&w["total"]));
    let _ = writeln!(o, "{}", critical_path_line(&r["critical_path_mib"]));
    if !r["fixed_point_accounting"].is_null() {
        let _ = writeln!(o, "{}", fixed_point_line(&r["fixed_point_accounting"]));
    }
    let v = &r["vocab"];
    let _ = writeln!(
        o,
        "vocab: embedding {} · lm head {} · tied {}",
        v["embedding_quant"].as_str().unwrap_or(""),
        v["lm_head_quant"].as_str().unwrap_or(""),
        v["tied"]
    );
    let keys: Vec<&str> = r["metadata_keys"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|k| k.as_str())
        .collect();
    let _ = writeln!(o, "metadata: {}", keys.join(", "));
    o
}

/// The per-layer table of each matrix's type (`layers[].quant`), one column per matrix name.
fn matrix_types(o: &mut String, r: &Value) {
    use std::fmt::Write;
    let layers: Vec<&serde_json::Map<String, Value>> = r["layers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| l["quant"].as_object())
        .collect();
    // File order (`quant_mix::layer_matrices`), not the JSON object's.
    let names: Vec<&str> = [
        "q",
        "k",
        "v",
        "o",
        "gate",
        "up",
        "down",
        "expert_gate",
        "expert_up",
        "expert_down",
    ]
    .into_iter()
    .filter(|n| layers.iter().any(|q| q.contains_key(*n)))
    .collect();
    if names.is_empty() {
        return;
    }
    let _ = writeln!(o, "\nper-layer matrix types");
    let mut head = format!("{:>5}", "layer");
    for n in &names {
        let _ = write!(head, " {n:>w$}", w = n.len().max(5));
    }
    let _ = writeln!(o, "{head}");
    for (i, q) in layers.iter().enumerate() {
        let mut row = format!("{i:>5}");
        for n in &names {
            let t = q.get(*n).and_then(|v| v.as_str()).unwrap_or("—");
            let _ = write!(row, " {t:>w$}", w = n.len().max(5));
        }
        let _ = writeln!(o, "{row}");
    }
}
