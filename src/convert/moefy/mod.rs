//! `moefy`: a real MoE with learned routing, made from a dense model without retraining (our
//! extension; MoEfication, Zhang et al. 2022; ExpertWeaver, 2026). Each layer's FFN units are
//! split into a shared expert (the units active for the most tokens) and `E` routed experts of
//! equal width (balanced k-means, [`cluster`]); a linear router per layer is fitted to rank the
//! experts by their activation norm ([`router`]). Statistics come from the engine itself
//! running the training text ([`crate::engine::capture`]). The selected experts are summed
//! with weight 1 (`RouterNorm::TopkUnweighted`), so K = E is the dense model.
//!
//! `route_from` D ≥ 1: layer ℓ's router reads the residual of layer ℓ−D, so its expert tiles
//! are known D layers early (`meta.route_ahead`); `expert_delay` δe ≥ 1: the paper's expert
//! delay retrofitted, layer ℓ's experts added δe layers later.

pub mod cluster;
pub mod router;
pub mod slice;

use crate::engine::ops::rmsnorm;
use crate::engine::{Engine, EngineOptions};
use crate::format::{CflowFile, CflowWriter, ExpertData, LayerData};
use crate::model::{CombineStyle, ModelConfig, RouterNorm};
use ndarray::Array2;
use std::path::Path;
use std::sync::Arc;

/// How units are grouped into experts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cluster {
    /// Per-unit co-activation profiles over sampled training tokens.
    CoActivation,
    /// The units' gate and up rows.
    Weights,
}

/// Where the routers come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RouterKind {
    /// Fitted to the experts' activation norms on the training text.
    Trained,
    /// Random weights (a lower bound).
    Random,
}

/// One MoE to make: the grouping and router settings plus the variant (`top_k`, `route_from`,
/// `expert_delay`). [`analyze`] serves every variant of one grouping at once.
#[derive(Clone, Debug)]
pub struct MoefySpec {
    pub experts: usize,
    pub top_k: usize,
    /// Shared-expert width in FFN units (0 = none).
    pub shared: usize,
    pub route_from: usize,
    pub expert_delay: usize,
    pub cluster: Cluster,
    pub router: RouterKind,
    pub seed: u64,
    pub threads: usize,
    /// Ridge strength relative to the mean diagonal of XᵀX.
    pub ridge: f64,
}

/// Tokens per sequence of the training text (the engine is reset between sequences).
pub const SEQ: usize = 256;
/// Tokens whose co-activation profile is kept for clustering.
const PROFILE_TOKENS: usize = 512;

/// What `moefy` did.
#[derive(Clone, Debug, serde::Serialize)]
pub struct MoefyReport {
    pub tokens: usize,
    pub experts: usize,
    pub top_k: usize,
    pub shared: usize,
    pub expert_ffn: usize,
    pub route_from: usize,
    pub expert_delay: usize,
    /// Router recall on the held-out tokens given to [`analyze`] (None without them): the mean
    /// share of the oracle's top-k experts (the k largest activation norms ‖h_e‖) the router
    /// picks, over layers, positions.
    pub heldout_recall: Option<f64>,
}

fn check_source(c: &ModelConfig) -> Result<(), String> {
    if c.combine_style != CombineStyle::Sequential
        || c.has_experts()
        || !c.has_dense()
        || c.dense_delay != 0
    {
        return Err(format!(
            "moefy needs a dense standard pre-norm model (Sequential, no experts, δd = 0); this \
             is {} with {} experts",
            c.combine_style.name(),
            c.n_experts
        ));
    }
    Ok(())
}

/// Checks `spec` against the source geometry; returns the routed experts' width.
pub fn check_spec(c: &ModelConfig, s: &MoefySpec) -> Result<usize, String> {
    check_source(c)?;
    if s.experts < 2 || s.experts > 255 {
        return Err(format!("--experts {}: must be in [2, 255]", s.experts));
    }
    if s.top_k == 0 || s.top_k > s.experts {
        return Err(format!(
            "--top-k {}: must be in [1, {}]",
            s.top_k, s.experts
        ));
    }
    if s.shared >= c.d_ff {
        return Err(format!(
            "--shared {}: must be below d_ff {}",
            s.shared, c.d_ff
        ));
    }
    let routed = c.d_ff - s.shared;
    if !routed.is_multiple_of(s.experts) {
        return Err(format!(
            "d_ff {} − shared {} = {routed} units do not split into {} equal experts",
            c.d_ff, s.shared, s.experts
        ));
    }
    if s.route_from > 0 && s.expert_delay > 0 {
        return Err("--route-from and --expert-delay are separate variants: give one".into());
    }
    if s.route_from >= c.n_layers || s.expert_delay >= c.n_layers {
        return Err(format!(
            "a distance must be below the {} layers",
            c.n_layers
        ));
    }
    Ok(routed / s.experts)
}

/// Runs the engine over `tokens` in sequences of [`SEQ`], calling `each(captures)` after every
/// token with what every layer's dense FFN saw.
fn collect(
    e: &mut Engine,
    tokens: &[u32],
    mut each: impl FnMut(&[crate::engine::capture::FfnCapture]),
    progress: &mut dyn FnMut(usize, usize),
) -> Result<(), String> {
    let mut done = 0;
    for chunk in tokens.chunks(SEQ) {
        e.reset();
        for &t in chunk {
            e.step(t, false).map_err(|err| err.to_string())?;
            each(e.ffn_capture().expect("capture on"));
            done += 1;
        }
        progress(done, tokens.len());
    }
    Ok(())
}

/// One layer's router: `e × d` row-major weights and `e` biases.
pub type LayerRouter = (Vec<f32>, Vec<f32>);

/// The grouping of every layer and the routers for each route-from distance: everything the
/// variants of one `(experts, shared, cluster, router)` setting share.
pub struct Analysis {
    pub tokens: usize,
    pub shared: Vec<Vec<usize>>,
    pub groups: Vec<Vec<Vec<usize>>>,
    /// (route_from, per layer (router e×d, bias e)).
    pub routers: Vec<(usize, Vec<LayerRouter>)>,
    /// (route_from, top_k, held-out recall).
    pub recall: Vec<(usize, usize, f64)>,
}

/// The router input of layer `l` reading from `route_from` layers back.
fn router_input(
    c: &ModelConfig,
    caps: &[crate::engine::capture::FfnCapture],
    norm: &[f32],
    l: usize,
    route_from: usize,
    x: &mut [f32],
) {
    rmsnorm(
        x,
        &caps[l.saturating_sub(route_from)].residual,
        Some(norm),
        c.rms_eps,
    );
}

/// Experts ranked by router `(r, b)` on input `x`, best first (ties → lower id).
fn rank(r: &[f32], b: &[f32], x: &[f32]) -> Vec<usize> {
    let d = x.len();
    let mut score: Vec<(f32, usize)> = b
        .iter()
        .enumerate()
        .map(|(k, bk)| {
            let s: f32 = r[k * d..(k + 1) * d]
                .iter()
                .zip(x)
                .map(|(a, b)| a * b)
                .sum();
            (s + bk, k)
        })
        .collect();
    score.sort_by(|p, q| q.0.total_cmp(&p.0).then(p.1.cmp(&q.1)));
    score.into_iter().map(|s| s.1).collect()
}

/// Groups every layer's units and fits its routers for each distance of `route_froms` on
/// `tokens`; with `heldout` tokens, measures each router's recall for each k of `top_ks`.
pub fn analyze(
    src: &Arc<CflowFile>,
    tokens: &[u32],
    heldout: &[u32],
    spec: &MoefySpec,
    route_froms: &[usize],
    top_ks: &[usize],
    progress: &mut dyn FnMut(&str, usize, usize),
) -> Result<Analysis, String> {
    let c = &src.cfg;
    for &rf in route_froms {
        for &k in top_ks {
            check_spec(
                c,
                &MoefySpec {
                    route_from: rf,
                    top_k: k,
                    expert_delay: 0,
                    ..spec.clone()
                },
            )?;
        }
    }
    if tokens.is_empty() {
        return Err("no training tokens".into());
    }
    let (n_layers, d, ff, ne) = (c.n_layers, c.d_model, c.d_ff, spec.experts);
    let layers: Vec<LayerData> = (0..n_layers).map(|i| src.layer_data(i)).collect();
    let down_norms: Vec<Vec<f32>> = layers
        .iter()
        .map(|l| slice::col_norms(l.down.as_ref().expect("dense")))
        .collect();
    let mut e = Engine::new(
        src.clone(),
        EngineOptions {
            threads: spec.threads,
            ..Default::default()
        },
    );
    e.set_ffn_capture(true);

    // Pass 1: how often each unit is among the top quarter of its layer's contributions
    // (|h_i|·‖W_down[:, i]‖), and the first tokens' contribution profiles.
    let prof_n = tokens.len().min(PROFILE_TOKENS);
    let mut freq = vec![vec![0u32; ff]; n_layers];
    let mut prof = vec![Array2::<f64>::zeros((ff, prof_n)); n_layers];
    let mut tok_i = 0usize;
    let mut a = vec![0f32; ff];
    let mut sorted = vec![0f32; ff];
    collect(
        &mut e,
        tokens,
        |caps| {
            for (l, cap) in caps.iter().enumerate() {
                for ((ai, h), cn) in a.iter_mut().zip(&cap.hidden).zip(&down_norms[l]) {
                    *ai = h.abs() * cn;
                }
                sorted.copy_from_slice(&a);
                let q = ff * 3 / 4;
                let (_, thr, _) = sorted.select_nth_unstable_by(q, |x, y| x.total_cmp(y));
                let thr = *thr;
                for (f, &ai) in freq[l].iter_mut().zip(&a) {
                    *f += (ai >= thr) as u32;
                }
                if tok_i < prof_n {
                    let norm = a.iter().map(|v| (*v as f64).powi(2)).sum::<f64>().sqrt();
                    for (i, &ai) in a.iter().enumerate() {
                        prof[l][[i, tok_i]] = ai as f64 / norm.max(1e-30);
                    }
                }
            }
            tok_i += 1;
        },
        &mut |dn, t| progress("statistics", dn, t),
    )?;

    // Cluster each layer.
    let mut shared = Vec::with_capacity(n_layers);
    let mut groups = Vec::with_capacity(n_layers);
    for l in 0..n_layers {
        let sh = cluster::shared_units(&freq[l], spec.shared);
        let routed: Vec<usize> = (0..ff).filter(|i| sh.binary_search(i).is_err()).collect();
        let feats = match spec.cluster {
            Cluster::CoActivation => std::mem::take(&mut prof[l]),
            Cluster::Weights => {
                let (g, u) = (
                    layers[l].gate.as_ref().expect("dense"),
                    layers[l].up.as_ref().expect("dense"),
                );
                let mut f = Array2::<f64>::zeros((ff, 2 * d));
                for i in 0..ff {
                    let row: Vec<f32> = slice::row_f32(g, i)
                        .into_iter()
                        .chain(slice::row_f32(u, i))
                        .collect();
                    let n = row.iter().map(|v| (*v as f64).powi(2)).sum::<f64>().sqrt();
                    for (j, v) in row.iter().enumerate() {
                        f[[i, j]] = *v as f64 / n.max(1e-30);
                    }
                }
                f
            }
        };
        groups.push(cluster::balanced_kmeans(&feats, &routed, ne)?);
        shared.push(sh);
        progress("cluster", l + 1, n_layers);
    }

    // Pass 2: the routers' normal equations for every distance (input: the residual D layers
    // back, normalized with the layer's own FFN norm, as the engine's route-ahead computes it;
    // target: ‖h_e‖).
    let norms: Vec<Vec<f32>> = layers
        .iter()
        .map(|l| l.ffn_norm.clone().unwrap_or_else(|| vec![1.0; d]))
        .collect();
    let expert_norms = |caps: &[crate::engine::capture::FfnCapture], l: usize| -> Vec<f32> {
        groups[l]
            .iter()
            .map(|g: &Vec<usize>| {
                g.iter()
                    .map(|&i| caps[l].hidden[i] * caps[l].hidden[i])
                    .sum::<f32>()
                    .sqrt()
            })
            .collect()
    };
    let mut routers = Vec::new();
    match spec.router {
        RouterKind::Random => {
            let mut rng = fastrand::Rng::with_seed(spec.seed);
            let rs: Vec<_> = (0..n_layers)
                .map(|_| {
                    let r: Vec<f32> = (0..ne * d).map(|_| rng.f32() * 2.0 - 1.0).collect();
                    (r, vec![0f32; ne])
                })
                .collect();
            for &rf in route_froms {
                routers.push((rf, rs.clone()));
            }
        }
        RouterKind::Trained => {
            let mut accs: Vec<Vec<router::RidgeAcc>> = route_froms
                .iter()
                .map(|_| {
                    (0..n_layers)
                        .map(|_| router::RidgeAcc::new(d, ne))
                        .collect()
                })
                .collect();
            let mut x = vec![0f32; d];
            collect(
                &mut e,
                tokens,
                |caps| {
                    for l in 0..n_layers {
                        let y = expert_norms(caps, l);
                        for (ri, &rf) in route_froms.iter().enumerate() {
                            router_input(c, caps, &norms[l], l, rf, &mut x);
                            accs[ri][l].add(&x, &y);
                        }
                    }
                },
                &mut |dn, t| progress("router data", dn, t),
            )?;
            for (ri, &rf) in route_froms.iter().enumerate() {
                let rs = accs[ri]
                    .iter()
                    .map(|a| a.solve(spec.ridge))
                    .collect::<Result<Vec<_>, _>>()?;
                routers.push((rf, rs));
            }
        }
    }

    // Held-out recall: the share of the oracle's top-k (largest ‖h_e‖) the router picks.
    let mut recall = Vec::new();
    if !heldout.is_empty() {
        let mut hits = vec![vec![0u64; top_ks.len()]; route_froms.len()];
        let mut n = 0u64;
        let mut x = vec![0f32; d];
        collect(
            &mut e,
            heldout,
            |caps| {
                for l in 0..n_layers {
                    let y = expert_norms(caps, l);
                    let mut oracle: Vec<usize> = (0..ne).collect();
                    oracle.sort_by(|&p, &q| y[q].total_cmp(&y[p]).then(p.cmp(&q)));
                    for (ri, (rf, rs)) in routers.iter().enumerate() {
                        router_input(c, caps, &norms[l], l, *rf, &mut x);
                        let r = rank(&rs[l].0, &rs[l].1, &x);
                        for (ki, &k) in top_ks.iter().enumerate() {
                            hits[ri][ki] +=
                                r[..k].iter().filter(|e| oracle[..k].contains(e)).count() as u64;
                        }
                    }
                }
                n += 1;
            },
            &mut |dn, t| progress("held-out recall", dn, t),
        )?;
        for (ri, &rf) in route_froms.iter().enumerate() {
            for (ki, &k) in top_ks.iter().enumerate() {
                let denom = (n * n_layers as u64 * k as u64).max(1) as f64;
                recall.push((rf, k, hits[ri][ki] as f64 / denom));
            }
        }
    }
    Ok(Analysis {
        tokens: tokens.len(),
        shared,
        groups,
        routers,
        recall,
    })
}

/// Writes the MoE of `spec` (its `top_k`, `route_from`, `expert_delay`) from `an`.
pub fn write_moe(
    src: &Arc<CflowFile>,
    an: &Analysis,
    spec: &MoefySpec,
    out: &Path,
    progress: &mut dyn FnMut(&str, usize, usize),
) -> Result<MoefyReport, String> {
    let c = &src.cfg;
    let ef = check_spec(c, spec)?;
    let (n_layers, d, ne) = (c.n_layers, c.d_model, spec.experts);
    // With an expert delay the router reads the layer's own input (distance 0).
    let rf = spec.route_from;
    let routers = &an
        .routers
        .iter()
        .find(|(r, _)| *r == rf)
        .ok_or_else(|| format!("no routers were fitted for --route-from {rf}"))?
        .1;
    let mut cfg = c.clone();
    cfg.d_ff = spec.shared;
    cfg.n_experts = ne;
    cfg.top_k = spec.top_k;
    cfg.expert_ffn = ef;
    cfg.expert_delay = spec.expert_delay;
    cfg.meta.router_norm = RouterNorm::TopkUnweighted;
    cfg.meta.route_ahead = rf as u32;
    cfg.meta.name = format!("{}-moe", c.meta.name);
    cfg.meta.provenance = serde_json::json!({
        "converter": "cflow-tui moefy",
        "source": src.path.file_name().map(|s| s.to_string_lossy().to_string()),
        "source_provenance": c.meta.provenance,
        "experts": ne, "top_k": spec.top_k, "shared": spec.shared,
        "route_from": rf, "expert_delay": spec.expert_delay,
        "cluster": format!("{:?}", spec.cluster), "router": format!("{:?}", spec.router),
        "training_tokens": an.tokens, "seed": spec.seed,
    });
    let mut w = CflowWriter::create_for(out, &cfg, &[&src.path]).map_err(|e| e.to_string())?;
    for (l, (router, bias)) in routers.iter().cloned().enumerate() {
        let ld = src.layer_data(l);
        let (g, u, dn) = (
            ld.gate.clone().expect("dense"),
            ld.up.clone().expect("dense"),
            ld.down.clone().expect("dense"),
        );
        let ffn_norm = ld.ffn_norm.clone();
        let sh = &an.shared[l];
        let mut experts = Vec::with_capacity(ne);
        for grp in &an.groups[l] {
            experts.push(ExpertData {
                gate: slice::rows_subset(&g, grp),
                up: slice::rows_subset(&u, grp),
                down: slice::cols_subset(&dn, grp)?,
            });
        }
        let nl = LayerData {
            gate: (!sh.is_empty()).then(|| slice::rows_subset(&g, sh)),
            up: (!sh.is_empty()).then(|| slice::rows_subset(&u, sh)),
            down: if sh.is_empty() {
                None
            } else {
                Some(slice::cols_subset(&dn, sh)?)
            },
            ffn_norm: if sh.is_empty() {
                None
            } else {
                ffn_norm.clone()
            },
            moe_norm: Some(ffn_norm.unwrap_or_else(|| vec![1.0; d])),
            router: Some(router),
            router_bias: Some(bias),
            experts,
            ..ld
        };
        w.write_layer(&nl).map_err(|e| e.to_string())?;
        progress("write", l + 1, n_layers);
    }
    w.finish(&src.vocab_data(), &cfg.meta)
        .map_err(|e| e.to_string())?;
    Ok(MoefyReport {
        tokens: an.tokens,
        experts: ne,
        top_k: spec.top_k,
        shared: spec.shared,
        expert_ffn: ef,
        route_from: rf,
        expert_delay: spec.expert_delay,
        heldout_recall: an
            .recall
            .iter()
            .find(|(r, k, _)| *r == rf && *k == spec.top_k)
            .map(|x| x.2),
    })
}

/// Makes the MoE of `spec` into `out` from the training `tokens` ([`analyze`] + [`write_moe`]).
pub fn moefy(
    src: &Arc<CflowFile>,
    tokens: &[u32],
    spec: &MoefySpec,
    out: &Path,
    progress: &mut dyn FnMut(&str, usize, usize),
) -> Result<MoefyReport, String> {
    let an = analyze(
        src,
        tokens,
        &[],
        spec,
        &[spec.route_from],
        &[spec.top_k],
        progress,
    )?;
    write_moe(src, &an, spec, out, progress)
}
