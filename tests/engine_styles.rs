//! Every combine style against an independent reference: a plain f32, layer-major (all positions
//! of a layer before the next layer, no KV cache object) implementation of docs/SEMANTICS.md,
//! written separately from the engine. Final hidden state within 1e-4 relative; identical argmax
//! over 16 greedy tokens. Also: conditional expert loading by counters, and determinism across
//! thread counts.

use cflow::convert::generate::{generate, GenSpec};
use cflow::engine::{Engine, EngineOptions, Layout};
use cflow::format::{CflowFile, CflowWriter};
use cflow::kernels::Isa;
use cflow::model::{CombineStyle, ModelConfig, FLAG_QK_NORM};
use cflow::quant::QuantType;
use std::path::Path;
use std::sync::Arc;

struct RefLayer {
    attn_norm: Vec<f32>,
    ffn_norm: Vec<f32>,
    moe_norm: Vec<f32>,
    wq: Vec<f32>,
    wk: Vec<f32>,
    wv: Vec<f32>,
    wo: Vec<f32>,
    /// Whole-projection Q/K RMSNorm weights (FLAG_QK_NORM).
    qk_norm: Option<(Vec<f32>, Vec<f32>)>,
    gate: Option<(Vec<f32>, Vec<f32>, Vec<f32>)>,
    router: Vec<f32>,
    experts: Vec<(Vec<f32>, Vec<f32>, Vec<f32>)>,
}

/// A routing waiting for injection: (physical layer, saved activation, selection).
type Routed = (usize, Vec<f32>, Vec<(usize, f32)>);

fn mv(w: &[f32], x: &[f32]) -> Vec<f32> {
    let n = x.len();
    w.chunks_exact(n)
        .map(|r| {
            r.iter()
                .zip(x)
                .map(|(a, b)| *a as f64 * *b as f64)
                .sum::<f64>() as f32
        })
        .collect()
}

fn norm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let ms = x.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / x.len() as f64;
    let r = 1.0 / (ms + eps as f64).sqrt();
    x.iter()
        .zip(w)
        .map(|(v, w)| (*v as f64 * r) as f32 * w)
        .collect()
}

fn ffn(g: &[f32], u: &[f32], d: &[f32], x: &[f32]) -> Vec<f32> {
    let a = mv(g, x);
    let b = mv(u, x);
    let h: Vec<f32> = a
        .iter()
        .zip(&b)
        .map(|(a, b)| a / (1.0 + (-a).exp()) * b)
        .collect();
    mv(d, &h)
}

fn add(a: &[f32], b: &[f32], k: f32) -> Vec<f32> {
    a.iter().zip(b).map(|(x, y)| x + k * y).collect()
}

fn rope_half(v: &mut [f32], pos: usize, theta: f32) {
    let hd = v.len();
    for i in 0..hd / 2 {
        let f = pos as f64 * (theta as f64).powf(-(2.0 * i as f64) / hd as f64);
        let (s, c) = (f.sin() as f32, f.cos() as f32);
        let (a, b) = (v[i], v[i + hd / 2]);
        v[i] = a * c - b * s;
        v[i + hd / 2] = a * s + b * c;
    }
}

/// Runs the reference over `toks`; returns per-position final hidden states and logits.
fn reference(f: &CflowFile, toks: &[u32]) -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
    let c: &ModelConfig = &f.cfg;
    let d = c.d_model;
    let layers: Vec<RefLayer> = (0..c.n_layers)
        .map(|i| {
            let l = f.layer_data(i);
            RefLayer {
                attn_norm: l.attn_norm.clone(),
                ffn_norm: l.ffn_norm.clone().unwrap_or(vec![1.0; d]),
                moe_norm: l.moe_norm.clone().unwrap_or(vec![1.0; d]),
                wq: l.q.dequantize(),
                wk: l.k.dequantize(),
                wv: l.v.dequantize(),
                wo: l.o.dequantize(),
                qk_norm: l.q_norm.clone().zip(l.k_norm.clone()),
                gate: l.gate.as_ref().map(|g| {
                    (
                        g.dequantize(),
                        l.up.as_ref().unwrap().dequantize(),
                        l.down.as_ref().unwrap().dequantize(),
                    )
                }),
                router: l.router.clone().unwrap_or_default(),
                experts: l
                    .experts
                    .iter()
                    .map(|e| (e.gate.dequantize(), e.up.dequantize(), e.down.dequantize()))
                    .collect(),
            }
        })
        .collect();
    let voc = f.vocab_data();
    let emb = voc.embedding.dequantize();
    let head = voc
        .lm_head
        .as_ref()
        .map(|m| m.dequantize())
        .unwrap_or_else(|| emb.clone());
    let n = toks.len();
    let le = c.effective_layers();
    let iters = if c.combine_style == CombineStyle::FixedPoint {
        c.meta.fixed_point_iterations as usize
    } else {
        1
    };
    let (dd, de) = (c.dense_delay, c.expert_delay);
    let style = c.combine_style;
    let both = c.d_ff > 0 && c.n_experts > 0;
    let s = if style == CombineStyle::ParallelSqrt2 && both {
        std::f32::consts::FRAC_1_SQRT_2
    } else {
        1.0
    };
    // Per-position state.
    let mut x: Vec<Vec<f32>> = toks
        .iter()
        .map(|&t| emb[t as usize * d..(t as usize + 1) * d].to_vec())
        .collect();
    let mut fs = x.clone(); // FFN stream (DecoupledStreams)
    let mut base = x.clone();
    let mut reg = vec![vec![0.0f32; d]; n];
    let mut hist: Vec<Vec<Vec<f32>>> = vec![Vec::new(); n]; // residual entering each layer
    let mut queue: Vec<Vec<Routed>> = vec![Vec::new(); n * le];
    let hd = c.head_dim;
    let group = c.n_heads / c.n_kv_heads;
    for l in 0..le {
        let ly = &layers[l / iters];
        let mut ks: Vec<Vec<f32>> = Vec::new();
        let mut vs: Vec<Vec<f32>> = Vec::new();
        for t in 0..n {
            let decoupled = style == CombineStyle::DecoupledStreams;
            hist[t].push(if decoupled {
                fs[t].clone()
            } else {
                x[t].clone()
            });
            // attention
            let xn = norm(&x[t], &ly.attn_norm, c.rms_eps);
            let mut q = mv(&ly.wq, &xn);
            let mut k = mv(&ly.wk, &xn);
            let mut v = mv(&ly.wv, &xn);
            if let Some((qn, kn)) = &ly.qk_norm {
                q = norm(&q, qn, c.rms_eps);
                k = norm(&k, kn, c.rms_eps);
            }
            let clip = c.meta.clip_qkv;
            if clip > 0.0 {
                for x in q.iter_mut().chain(k.iter_mut()).chain(v.iter_mut()) {
                    *x = x.max(-clip).min(clip);
                }
            }
            for h in q.chunks_mut(hd) {
                rope_half(h, t, c.rope_theta);
            }
            for h in k.chunks_mut(hd) {
                rope_half(h, t, c.rope_theta);
            }
            ks.push(k);
            vs.push(v);
            let mut att = vec![0.0f32; c.n_heads * hd];
            for h in 0..c.n_heads {
                let kh = h / group;
                let qh = &q[h * hd..(h + 1) * hd];
                let sc: Vec<f64> = (0..=t)
                    .map(|u| {
                        qh.iter()
                            .zip(&ks[u][kh * hd..(kh + 1) * hd])
                            .map(|(a, b)| (*a as f64) * (*b as f64))
                            .sum::<f64>()
                            / (hd as f64).sqrt()
                    })
                    .collect();
                let m = sc.iter().cloned().fold(f64::MIN, f64::max);
                let e: Vec<f64> = sc.iter().map(|v| (v - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for u in 0..=t {
                    for j in 0..hd {
                        att[h * hd + j] += (e[u] / z) as f32 * vs[u][kh * hd + j];
                    }
                }
            }
            let ao = mv(&ly.wo, &att);
            let a = add(&x[t], &ao, 1.0);
            let dense_in: Vec<f32> = if dd > 0 {
                if l >= dd {
                    hist[t][l - dd].clone()
                } else {
                    vec![0.0; d]
                }
            } else {
                match style {
                    CombineStyle::DelayedSum => x[t].clone(),
                    CombineStyle::DecoupledStreams => fs[t].clone(),
                    _ => a.clone(),
                }
            };
            let fo = match &ly.gate {
                Some((g, u, dn)) => ffn(g, u, dn, &norm(&dense_in, &ly.ffn_norm, c.rms_eps)),
                None => vec![0.0; d],
            };
            if !ly.experts.is_empty() {
                let src = match style {
                    CombineStyle::AsyncExperts => &x[t],
                    CombineStyle::DecoupledStreams => &fs[t],
                    _ => &a,
                };
                let u = norm(src, &ly.moe_norm, c.rms_eps);
                let lg = mv(&ly.router, &u);
                let mut idx: Vec<usize> = (0..lg.len()).collect();
                idx.sort_by(|&i, &j| lg[j].partial_cmp(&lg[i]).unwrap().then(i.cmp(&j)));
                idx.truncate(c.top_k);
                let m = lg[idx[0]];
                let z: f32 = idx.iter().map(|&i| (lg[i] - m).exp()).sum();
                let sel: Vec<(usize, f32)> =
                    idx.iter().map(|&i| (i, (lg[i] - m).exp() / z)).collect();
                let target = (l + de).min(le - 1);
                queue[t * le + target].push((l / iters, u, sel));
            }
            match style {
                CombineStyle::DecoupledStreams => {
                    x[t] = add(&x[t], &ao, 1.0);
                    fs[t] = add(&fs[t], &fo, 1.0);
                }
                CombineStyle::PipelineRegisters => {
                    x[t] = add(&a, &reg[t], 1.0);
                    reg[t] = fo.clone();
                }
                _ => x[t] = add(&a, &fo, s),
            }
            for (p, u, sel) in std::mem::take(&mut queue[t * le + l]) {
                let mut acc = vec![0.0f32; d];
                for (e, w) in sel {
                    let (g, up, dn) = &layers[p].experts[e];
                    acc = add(&acc, &ffn(g, up, dn, &u), w);
                }
                match style {
                    CombineStyle::DecoupledStreams => fs[t] = add(&fs[t], &acc, s),
                    CombineStyle::PipelineRegisters => reg[t] = add(&reg[t], &acc, s),
                    _ => x[t] = add(&x[t], &acc, s),
                }
            }
            if decoupled && ((l + 1) % c.meta.merge_interval as usize == 0 || l + 1 == le) {
                let m: Vec<f32> = (0..d).map(|i| x[t][i] + fs[t][i] - base[t][i]).collect();
                x[t] = m.clone();
                fs[t] = m.clone();
                base[t] = m;
            }
        }
    }
    if style == CombineStyle::PipelineRegisters {
        for t in 0..n {
            x[t] = add(&x[t], &reg[t], 1.0);
        }
    }
    let logits = x
        .iter()
        .map(|h| mv(&head, &norm(h, &voc.final_norm, c.rms_eps)))
        .collect();
    (x, logits)
}

fn tiny(arch: &str, dir: &std::path::Path) -> Arc<CflowFile> {
    let mut s = GenSpec::new(arch);
    s.layers = Some(if arch == "arch5" { 2 } else { 5 });
    s.hidden = Some(64);
    s.heads = Some(4);
    s.kv_heads = Some(2);
    s.ffn = Some(128);
    s.experts = Some(4);
    s.top_k = Some(2);
    s.expert_ffn = Some(64);
    s.vocab = Some(97);
    s.quant = QuantType::F32;
    s.seed = 11;
    let p = dir.join(format!("{arch}.cflow"));
    generate(&s, &p, |_, _| {}).unwrap();
    Arc::new(CflowFile::open(&p).unwrap())
}

fn engine(f: &Arc<CflowFile>, threads: usize) -> Engine {
    Engine::new(
        f.clone(),
        EngineOptions {
            threads,
            isa: Isa::detect(),
            int_act: false,
            layout: Layout::Cflow,
            timings: true,
            kv_f16: false,
            ..Default::default()
        },
    )
}

#[test]
fn every_style_matches_the_independent_reference() {
    let dir = tempfile::tempdir().unwrap();
    for arch in cflow::convert::generate::ARCHS {
        let f = tiny(arch, dir.path());
        check_against_reference(&f, arch);
    }
}

/// Greedy generation of 16 tokens after a 3-token prompt: the final hidden state within 1e-4
/// relative of the reference's and the reference's argmax at every position. Returns the
/// engine's last logits.
fn check_against_reference(f: &Arc<CflowFile>, arch: &str) -> Vec<f32> {
    {
        let mut e = engine(f, 2);
        // Greedy generation of 16 tokens after a 3-token prompt.
        let mut seq = vec![5u32, 17, 42];
        let mut last = None;
        for (i, &t) in seq.clone().iter().enumerate() {
            last = e.step(t, i == 2).unwrap().map(|l| l.to_vec());
        }
        let mut logits = last.unwrap();
        for _ in 0..16 {
            let nx = cflow::engine::sampler::argmax(&logits) as u32;
            seq.push(nx);
            logits = e.step(nx, true).unwrap().unwrap().to_vec();
        }
        let hidden = e.hidden().to_vec();
        let (rx, rl) = reference(f, &seq);
        let h = rx.last().unwrap();
        let num: f32 = h
            .iter()
            .zip(&hidden)
            .map(|(a, b)| (a - b).powi(2))
            .sum::<f32>()
            .sqrt();
        let den: f32 = h.iter().map(|a| a * a).sum::<f32>().sqrt();
        assert!(num / den < 1e-4, "{arch}: hidden rel err {}", num / den);
        for i in 2..seq.len() - 1 {
            assert_eq!(
                cflow::engine::sampler::argmax(&rl[i]) as u32,
                seq[i + 1],
                "{arch}: argmax at {i}"
            );
        }
        logits
    }
}

/// `f` rewritten with whole-projection Q/K RMSNorm weights (deterministic, in [0.75, 1.25]) and
/// `clip_qkv = clip`.
fn with_qk_norm(f: &CflowFile, clip: f32, out: &Path) -> Arc<CflowFile> {
    let mut cfg = f.cfg.clone();
    cfg.feature_flags |= FLAG_QK_NORM;
    cfg.meta.clip_qkv = clip;
    let mut w = CflowWriter::create(out, &cfg).unwrap();
    for i in 0..cfg.n_layers {
        let wts = |n: usize, salt: usize| -> Vec<f32> {
            (0..n)
                .map(|j| 0.75 + 0.05 * ((j * 7 + i * 13 + salt) % 11) as f32)
                .collect()
        };
        let mut l = f.layer_data(i);
        l.q_norm = Some(wts(cfg.q_dim(), 1));
        l.k_norm = Some(wts(cfg.kv_dim(), 5));
        w.write_layer(&l).unwrap();
    }
    w.finish(&f.vocab_data(), &cfg.meta).unwrap();
    Arc::new(CflowFile::open(out).unwrap())
}

/// OLMoE-style Q/K norms and `clip_qkv` against the reference, for a dense, a MoE and a
/// pipeline-native model; each feature must change the output (so neither can be skipped).
#[test]
fn qk_norm_and_clip_qkv_match_the_reference() {
    let dir = tempfile::tempdir().unwrap();
    for arch in ["llama", "mixtral", "arch2_4_combined"] {
        let f = tiny(arch, dir.path());
        let plain = check_against_reference(&f, arch);
        let p = dir.path().join(format!("{arch}-qkn.cflow"));
        let normed = check_against_reference(&with_qk_norm(&f, 0.0, &p), arch);
        let p = dir.path().join(format!("{arch}-qkn-clip.cflow"));
        let clipped = check_against_reference(&with_qk_norm(&f, 1.25, &p), arch);
        assert!(normed != plain, "{arch}: Q/K norms had no effect");
        assert!(clipped != normed, "{arch}: clip_qkv had no effect");
    }
}

#[test]
fn only_selected_experts_are_touched() {
    let dir = tempfile::tempdir().unwrap();
    let f = tiny("arch2_4_combined", dir.path());
    let mut e = engine(&f, 1);
    for (i, t) in [1u32, 2, 3, 4, 5, 6].iter().enumerate() {
        e.step(*t, true).unwrap();
        let c = &f.cfg;
        let bank: u64 = f.layers[0]
            .experts
            .iter()
            .map(|x| (x.gate.bytes() + x.up.bytes() + x.down.bytes()) as u64)
            .sum();
        let st = &e.stats;
        // Each layer routes k experts; with δe = 2 the injections of layers 3..5 clamp to layer 5.
        let routed: usize = st.layers.iter().map(|l| l.routing.len()).sum();
        assert_eq!(routed, c.n_layers * c.top_k, "token {i}");
        let touched: u64 = st.layers.iter().map(|l| l.bytes.experts).sum();
        assert_eq!(
            touched * c.n_experts as u64,
            bank * c.top_k as u64 * c.n_layers as u64
        );
    }
}

#[test]
fn deterministic_across_runs_and_thread_counts() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = GenSpec::new("arch2_4_combined");
    spec.layers = Some(3);
    spec.hidden = Some(256);
    spec.vocab = Some(500);
    let p = dir.path().join("q.cflow");
    generate(&spec, &p, |_, _| {}).unwrap();
    let f = Arc::new(CflowFile::open(&p).unwrap());
    let run = |threads| {
        let e = Engine::new(
            f.clone(),
            EngineOptions {
                threads,
                ..Default::default()
            },
        );
        let mut s = cflow::engine::session::Session::new(
            e,
            cflow::telemetry::SamplingParams {
                temperature: 0.8,
                seed: 3,
                ..Default::default()
            },
        )
        .unwrap();
        s.generate(&[1, 2, 3], 24, false, &mut |_| {}).tokens
    };
    let a = run(1);
    assert_eq!(a, run(1));
    assert_eq!(a, run(2));
}

#[test]
fn batched_prefill_matches_token_by_token() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = GenSpec::new("llama");
    spec.layers = Some(3);
    spec.hidden = Some(128);
    spec.heads = Some(4);
    spec.kv_heads = Some(2);
    spec.ffn = Some(256);
    spec.vocab = Some(300);
    spec.quant = QuantType::Q8_0;
    let p = dir.path().join("l.cflow");
    generate(&spec, &p, |_, _| {}).unwrap();
    let plain = Arc::new(CflowFile::open(&p).unwrap());
    // Also with OLMoE-style Q/K norms and clip_qkv (the batched path applies them too).
    let qkn = with_qk_norm(&plain, 1.25, &dir.path().join("lq.cflow"));
    let prompt: Vec<u32> = (0..70).map(|i| (i * 37 + 5) % 300).collect();
    for (f, int_act) in [(&plain, false), (&plain, true), (&qkn, false), (&qkn, true)] {
        let mk = || {
            Engine::new(
                f.clone(),
                EngineOptions {
                    threads: 2,
                    int_act,
                    ..Default::default()
                },
            )
        };
        let mut a = mk();
        assert!(a.can_batch_prefill());
        a.prefill(&prompt).unwrap();
        let la = a.logits().to_vec();
        let mut b = mk();
        for (i, &t) in prompt.iter().enumerate() {
            b.step(t, i + 1 == prompt.len()).unwrap();
        }
        let lb = b.logits().to_vec();
        let num: f32 = la
            .iter()
            .zip(&lb)
            .map(|(x, y)| (x - y).powi(2))
            .sum::<f32>()
            .sqrt();
        let den: f32 = lb.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!(
            num / den < 1e-5,
            "{}: int_act={int_act}: rel err {}",
            f.path.display(),
            num / den
        );
        assert_eq!(a.pos(), b.pos());
        // Decoding continues identically after either prefill.
        a.step(7, true).unwrap();
        b.step(7, true).unwrap();
        assert_eq!(
            cflow::engine::sampler::argmax(a.logits()),
            cflow::engine::sampler::argmax(b.logits())
        );
    }
}

#[test]
fn rowmajor_baseline_agrees_with_tiles() {
    let dir = tempfile::tempdir().unwrap();
    for (arch, q) in [
        ("arch2_4_combined", QuantType::Q4_0),
        ("llama", QuantType::Q4_1),
        ("mixtral", QuantType::Q8_0),
        ("llama", QuantType::F16),
    ] {
        let mut spec = GenSpec::new(arch);
        spec.layers = Some(3);
        spec.hidden = Some(320); // 256 + 64 column tiles
        spec.heads = Some(5);
        spec.ffn = Some(640);
        spec.experts = Some(4);
        spec.expert_ffn = Some(96);
        spec.vocab = Some(400);
        spec.quant = q;
        let p = dir.path().join(format!("{arch}-{q}.cflow"));
        generate(&spec, &p, |_, _| {}).unwrap();
        let f = Arc::new(CflowFile::open(&p).unwrap());
        for int_act in [false, true] {
            let mk = |layout| {
                Engine::new(
                    f.clone(),
                    EngineOptions {
                        threads: 2,
                        int_act,
                        layout,
                        ..Default::default()
                    },
                )
            };
            let (mut a, mut b) = (mk(Layout::Cflow), mk(Layout::RowMajor));
            for t in [3u32, 99, 250, 17, 5] {
                let la = a.step(t, true).unwrap().unwrap().to_vec();
                let lb = b.step(t, true).unwrap().unwrap().to_vec();
                let num: f32 = la
                    .iter()
                    .zip(&lb)
                    .map(|(x, y)| (x - y).powi(2))
                    .sum::<f32>()
                    .sqrt();
                let den: f32 = lb.iter().map(|x| x * x).sum::<f32>().sqrt();
                assert!(
                    num / den < 1e-5,
                    "{arch} {q} int={int_act}: rel err {}",
                    num / den
                );
                assert_eq!(
                    cflow::engine::sampler::argmax(&la),
                    cflow::engine::sampler::argmax(&lb)
                );
            }
        }
    }
}
