//! Parity with llama.cpp on the same SmolLM2 Q4_1 GGUF (goldens made by
//! tests/reference/llamacpp_goldens.py): identical token ids, teacher-forced top-1 agreement,
//! max |Δlogit| over llama.cpp's top-10, and greedy continuations.
//!
//! The bars are set by llama.cpp's own numerical noise on this model, measured with the same
//! build and file: its run with flash attention off (`smollm2_llamacpp_fa_off.json`) agrees with
//! its default flash-attention run (`smollm2_llamacpp.json`, the goldens) on only 96.1 % of
//! top-1 predictions, with max |Δlogit| 1.46. We must be at least as close to the goldens as
//! llama.cpp is to itself; the exact float64 oracle below is the tighter check of correctness.
//! Needs the SmolLM2 GGUF (`$CFLOW_SMOLLM2` or `cflow-tui pull smollm2`); SKIPs otherwise.

mod common;

use cflow::convert::import_gguf::{import_gguf, QuantTarget};
use cflow::engine::kv::KvType;
use cflow::engine::sampler::argmax;
use cflow::engine::session::Session;
use cflow::engine::{Engine, EngineOptions};
use cflow::format::CflowFile;
use cflow::telemetry::SamplingParams;
use common::greedy_cmp_len;
use serde_json::Value;
use std::sync::Arc;

fn load(name: &str) -> Value {
    let p = format!(
        "{}/tests/reference/goldens/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn golden() -> Value {
    load("smollm2_llamacpp.json")
}

/// `[[id, logit], ...]` of one position.
fn top_list(v: &Value) -> Vec<(usize, f32)> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e[0].as_u64().unwrap() as usize,
                e[1].as_f64().unwrap() as f32,
            )
        })
        .collect()
}

#[test]
fn llamacpp_noise_floor_is_recorded() {
    // llama.cpp's flash-attention-off run vs its flash-attention-on goldens, from the committed
    // files alone: top-1 from each file's best entry, |Δlogit| over the ids both top-10s share.
    let on = golden();
    let off = load("smollm2_llamacpp_fa_off.json");
    assert_eq!(on["model_sha256"], off["model_sha256"]);
    assert_eq!(off["flash_attn"], "off");
    let (mut agree, mut total, mut max_dl) = (0usize, 0usize, 0f32);
    let (mut greedy_same, mut greedy_total) = (0, 0);
    for (a, b) in on["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .zip(off["prompts"].as_array().unwrap())
    {
        assert_eq!(a["ids"], b["ids"]);
        for (ta, tb) in a["top"]
            .as_array()
            .unwrap()
            .iter()
            .zip(b["top"].as_array().unwrap())
        {
            let (ta, tb) = (top_list(ta), top_list(tb));
            total += 1;
            agree += (ta[0].0 == tb[0].0) as usize;
            for (id, l) in &ta {
                if let Some((_, lb)) = tb.iter().find(|(i, _)| i == id) {
                    max_dl = max_dl.max((l - lb).abs());
                }
            }
        }
        let n = greedy_cmp_len(a);
        let (ga, gb) = (ids(&a["greedy"]), ids(&b["greedy"]));
        greedy_total += 1;
        greedy_same += (gb.len() >= n && ga[..n] == gb[..n]) as usize;
    }
    let rec = &off["agreement_with"];
    eprintln!(
        "llama.cpp flash-attn off vs on (its own goldens): top-1 {agree}/{total} = {:.2}%, \
         max |Δlogit| over shared top-10 ids {max_dl:.4} (full logits: {}), greedy identical \
         {greedy_same}/{greedy_total}",
        100.0 * agree as f64 / total as f64,
        rec["max_abs_dlogit_over_their_topk"]
    );
    assert_eq!(rec["top1_agree"].as_u64().unwrap() as usize, agree);
    assert_eq!(rec["positions"].as_u64().unwrap() as usize, total);
    // The floor is real noise, not a broken file: well below 100 %, well above chance.
    assert!(agree < total && agree * 10 > total * 9, "{agree}/{total}");
}

/// SmolLM2 imported (without re-quantizing) into a temporary `.cflow` and opened; `None` with a
/// SKIP line when the GGUF is not available.
fn smollm2() -> Option<Arc<CflowFile>> {
    let gguf = common::smollm2_gguf()?;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("smollm2.cflow");
    import_gguf(&gguf, &path, QuantTarget::Keep, Some(1024), |_, _| {}).unwrap();
    // The mapping stays valid after the temporary directory is removed (Linux keeps the inode).
    Some(Arc::new(CflowFile::open(&path).unwrap()))
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn smollm2_matches_llamacpp() {
    let Some(file) = smollm2() else {
        return;
    };
    parity(
        file,
        "smollm2_llamacpp.json",
        "smollm2_llamacpp_fa_off.json",
    );
}

/// SmolLM2 re-quantized by llama.cpp to `kind` (issue 19: K-quants and Q5_0, see
/// tests/reference/requantize_smollm2.sh), imported with `--quant keep`; `None` with a SKIP line
/// (a failure under CI) when the file is absent.
fn smollm2_requantized(kind: &str) -> Option<Arc<CflowFile>> {
    let gguf = common::smollm2_requantized_gguf(kind)?;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.cflow");
    import_gguf(&gguf, &path, QuantTarget::Keep, Some(1024), |_, _| {}).unwrap();
    Some(Arc::new(CflowFile::open(&path).unwrap()))
}

/// Issue 19 acceptance: the same parity for a Q4_K_M SmolLM2 (Q5_0, Q4_K, Q6_K and Q8_0 tensors:
/// llama.cpp gives the 576-wide matrices the Q5_0 fallback) as for the Q4_1 one.
#[test]
#[ignore = "open (issue 19): top-1 95.2% over 745 positions vs llama.cpp's own flash-attn off/on floor 96.1%; run with --ignored"]
fn smollm2_q4_k_m_matches_llamacpp() {
    let Some(file) = smollm2_requantized("Q4_K_M") else {
        return;
    };
    parity(
        file,
        "smollm2_q4_k_m_llamacpp.json",
        "smollm2_q4_k_m_llamacpp_fa_off.json",
    );
}

/// And for a Q6_K SmolLM2 (Q6_K and its Q8_0 fallback).
#[test]
fn smollm2_q6_k_matches_llamacpp() {
    let Some(file) = smollm2_requantized("Q6_K") else {
        return;
    };
    parity(
        file,
        "smollm2_q6_k_llamacpp.json",
        "smollm2_q6_k_llamacpp_fa_off.json",
    );
}

/// Token ids, teacher-forced top-1 and max |Δlogit|, and greedy continuations of `file` against
/// the goldens `golden_name`, with llama.cpp's own flash-attention off-vs-on agreement
/// (`floor_name`) as the bar.
fn parity(file: Arc<CflowFile>, golden_name: &str, floor_name: &str) {
    let g = load(golden_name);
    let file_sha = g["model_sha256"].as_str().unwrap_or("?");
    eprintln!("{golden_name}: model sha256 {file_sha}");
    let opts = EngineOptions {
        // The exact f32-activation path (see `smollm2_matches_exact_f64_forward`); set
        // CFLOW_PARITY_Q8=1 to compare the default Q8-activation fast path instead.
        int_act: std::env::var_os("CFLOW_PARITY_Q8").is_some(),
        kv: if std::env::var_os("CFLOW_PARITY_KV_F16").is_some() {
            KvType::F16
        } else {
            KvType::F32
        },
        ..Default::default()
    };
    let mut sess = Session::new(Engine::new(file, opts), SamplingParams::default()).unwrap();
    let (mut agree, mut total) = (0usize, 0usize);
    let mut max_dl_all = 0f32;
    let mut greedy_same = 0;
    let mut greedy_total = 0;
    eprintln!(
        "{:<14} {:>5} {:>9} {:>10} {:>8}  greedy",
        "prompt", "toks", "top-1", "max|Δlog|", "Δlse"
    );
    for p in g["prompts"].as_array().unwrap() {
        let name = p["name"].as_str().unwrap();
        let text = p["text"].as_str().unwrap();
        let want = ids(&p["ids"]);
        let tok = sess.tok.as_ref().unwrap();
        let got = tok.encode(text, false).unwrap();
        assert_eq!(got, want, "{name}: token ids differ from llama.cpp");
        assert_eq!(
            tok.decode(&got, false).unwrap(),
            text,
            "{name}: decode(encode(s)) != s"
        );
        // Teacher-forced logits at every position.
        sess.reset();
        let tops = p["top"].as_array().unwrap();
        let lses = p["logsumexp"].as_array().unwrap();
        let (mut a, mut max_dl, mut max_dlse) = (0usize, 0f32, 0f32);
        for (i, &id) in want.iter().enumerate() {
            let logits = sess.engine.step(id, true).unwrap().unwrap().to_vec();
            let top = top_list(&tops[i]);
            if argmax(&logits) == top[0].0 {
                a += 1;
            }
            for (tid, l) in &top {
                max_dl = max_dl.max((logits[*tid] - l).abs());
            }
            let lse = cflow::engine::ops::logsumexp(&logits);
            max_dlse = max_dlse.max((lse - lses[i].as_f64().unwrap() as f32).abs());
            sess.context.push(id);
        }
        agree += a;
        total += want.len();
        max_dl_all = max_dl_all.max(max_dl);
        // Greedy continuation, compared up to the first near-tie of llama.cpp's own choice.
        let gref = ids(&p["greedy"]);
        let cmp_len = greedy_cmp_len(p);
        sess.reset();
        let out = sess.generate(&want, gref.len(), true, &mut |_| {});
        let same = out.tokens.len() >= cmp_len && out.tokens[..cmp_len] == gref[..cmp_len];
        let first_div = out.tokens.iter().zip(&gref).position(|(a, b)| a != b);
        greedy_total += 1;
        greedy_same += same as usize;
        eprintln!(
            "{name:<14} {:>5} {:>8.1}% {max_dl:>10.4} {max_dlse:>8.4}  {} (compared {cmp_len}/{}; first divergence {:?})",
            want.len(),
            100.0 * a as f64 / want.len() as f64,
            if same { "identical" } else { "DIFFERS" },
            gref.len(),
            first_div
        );
    }
    let rate = agree as f64 / total as f64;
    eprintln!("overall top-1 {:.2}% over {total} positions; max |Δlogit| {max_dl_all:.4}; greedy identical {greedy_same}/{greedy_total}", 100.0 * rate);
    // llama.cpp itself deviates from the exact (float64) forward of the same weights by up to
    // ~1 logit (Q8 activations, f16 KV cache, f16 flash-attention accumulator): see
    // `smollm2_matches_exact_f64_forward` below, where our engine agrees with the exact forward
    // to 1e-4. The bar here is llama.cpp's own flash-attention off-vs-on agreement (the noise
    // floor, recorded in the fa_off goldens' header): we must be no further from the goldens.
    let floor_file = load(floor_name);
    assert_eq!(floor_file["model_sha256"], g["model_sha256"]);
    let floor = &floor_file["agreement_with"];
    let floor_rate = floor["top1_rate"].as_f64().unwrap();
    let floor_dl = floor["max_abs_dlogit_over_their_topk"].as_f64().unwrap() as f32;
    eprintln!(
        "noise floor (llama.cpp flash-attn off vs on): top-1 {:.2}%, max |Δlogit| {floor_dl:.4}",
        100.0 * floor_rate
    );
    let q8 = std::env::var_os("CFLOW_PARITY_Q8").is_some();
    let slack = if q8 { 0.02 } else { 0.005 };
    assert!(
        rate >= floor_rate - slack,
        "top-1 agreement {rate} below llama.cpp's own off-vs-on {floor_rate} - {slack}"
    );
    if !q8 {
        assert!(
            greedy_same + 2 >= greedy_total,
            "greedy identical only {greedy_same}/{greedy_total}"
        );
    }
    let dl_bar = if q8 { 1.8 * floor_dl } else { 1.25 * floor_dl };
    assert!(
        max_dl_all <= dl_bar,
        "max |Δlogit| {max_dl_all} > {dl_bar} (llama.cpp off-vs-on: {floor_dl})"
    );
}

/// Against the exact float64 forward (tests/reference/f64_reference.py): the f32-activation path
/// must match to 0.01 logit with identical top-1; the Q8-activation fast path is bounded loosely.
#[test]
fn smollm2_matches_exact_f64_forward() {
    let Some(file) = smollm2() else {
        return;
    };
    let g = load("smollm2_f64.json");
    // Q8 activations (like llama.cpp's Q8_1 path) cost up to ~2.5 logits on this model; the
    // scalar integer reference shows the same magnitude, so it is quantization noise, not a kernel bug.
    for (int_act, bound) in [(false, 0.01f32), (true, 3.0)] {
        let mut e = Engine::new(
            file.clone(),
            EngineOptions {
                int_act,
                // The exact path keeps the KV cache in f32; the Q8 path runs the default cache.
                kv: if int_act {
                    EngineOptions::default().kv
                } else {
                    KvType::F32
                },
                ..Default::default()
            },
        );
        let (mut agree, mut total, mut max_dl) = (0, 0, 0f32);
        for pr in g["prompts"].as_array().unwrap() {
            e.reset();
            for (i, &id) in ids(&pr["ids"]).iter().enumerate() {
                let logits = e.step(id, true).unwrap().unwrap();
                let top = pr["top"][i].as_array().unwrap();
                if argmax(logits) as u64 == top[0][0].as_u64().unwrap() {
                    agree += 1;
                }
                total += 1;
                for t in top {
                    let dl = (logits[t[0].as_u64().unwrap() as usize]
                        - t[1].as_f64().unwrap() as f32)
                        .abs();
                    max_dl = max_dl.max(dl);
                }
            }
        }
        eprintln!(
            "exact f64 oracle, {} activations: top-1 {agree}/{total}, max |Δlogit| {max_dl:.4}",
            if int_act { "Q8" } else { "f32" }
        );
        assert!(
            max_dl < bound,
            "int_act={int_act}: max |Δlogit| {max_dl} >= {bound}"
        );
        if !int_act {
            assert_eq!(agree, total);
        }
    }
}
