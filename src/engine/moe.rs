//! The routed experts (paper §4.2.3): the router's top-k selection and the evaluation of the
//! selected experts of one queued routing, from the map or from staging slots.

use super::layer::gated;
use super::ops::*;
use super::schedule::Pending;
use super::scratch::ExpertScratch;
use super::weights::Weights;
use crate::format::reader::{ExpertView, LayerView};
use crate::model::{ModelConfig, RouterNorm};

/// Router: returns the normalized activation (saved for the deferred expert computation) and the
/// top-k (expert, weight) list, best first.
pub fn route(cfg: &ModelConfig, lv: &LayerView, src: &[f32]) -> (Vec<f32>, Vec<(usize, f32)>) {
    let act = expert_input(cfg, lv, src);
    let sel = select(cfg, lv, &act);
    (act, sel)
}

/// The experts' (and the router's) input: `N_m(src)`.
pub fn expert_input(cfg: &ModelConfig, lv: &LayerView, src: &[f32]) -> Vec<f32> {
    let mut act = vec![0.0; cfg.d_model];
    rmsnorm(&mut act, src, lv.moe_norm.as_deref(), cfg.rms_eps);
    act
}

/// The top-k (expert, weight) list of router `lv` on its normalized input `act`, best first.
pub fn select(cfg: &ModelConfig, lv: &LayerView, act: &[f32]) -> Vec<(usize, f32)> {
    let d = cfg.d_model;
    let r = lv.router.as_ref().expect("router");
    let bias = |e: usize| lv.router_bias.as_ref().map_or(0.0, |b| b[e]);
    let mut logits: Vec<f32> = (0..cfg.n_experts)
        .map(|e| {
            r[e * d..(e + 1) * d]
                .iter()
                .zip(act)
                .map(|(a, b)| a * b)
                .sum::<f32>()
                + bias(e)
        })
        .collect();
    let mut idx: Vec<usize> = (0..cfg.n_experts).collect();
    // Stable: ties broken by lower expert id.
    idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    idx.truncate(cfg.top_k);
    match cfg.meta.router_norm {
        RouterNorm::SoftmaxTopk => {
            let mut w: Vec<f32> = idx.iter().map(|&i| logits[i]).collect();
            softmax(&mut w);
            idx.iter().copied().zip(w).collect()
        }
        RouterNorm::SoftmaxAll => {
            softmax(&mut logits);
            idx.iter().map(|&i| (i, logits[i])).collect()
        }
        RouterNorm::TopkUnweighted => idx.iter().map(|&i| (i, 1.0)).collect(),
    }
}

/// Runs the selected experts `sel` of block `p` on `act` into `es.acc`; `staged[i]` holds
/// expert `sel[i]`'s region when it was read into a staging slot (its views in `rel` are
/// region-relative), else it is read from the map. Returns the bytes touched.
#[allow(clippy::too_many_arguments)]
pub fn run_experts(
    w: &Weights,
    lv: &LayerView,
    rel: &[ExpertView],
    p: usize,
    act: &[f32],
    sel: &[(usize, f32)],
    staged: &[Option<&[u8]>],
    es: &mut ExpertScratch,
) -> u64 {
    es.acc.fill(0.0);
    let mut bytes = 0;
    for (i, &(e, wt)) in sel.iter().enumerate() {
        let (src, ex): (&[u8], &ExpertView) = match staged.get(i).copied().flatten() {
            Some(b) => (b, &rel[e]),
            None => (w.file.bytes(), &lv.experts[e]),
        };
        w.mv_in(
            src,
            p,
            e as u8,
            &mut es.xq,
            act,
            &mut [(&ex.gate, &mut es.eh), (&ex.up, &mut es.eh2)],
        );
        gated(w.isa, w.cfg.meta.ffn_act, &mut es.eh, &es.eh2);
        w.mv_in(
            src,
            p,
            e as u8,
            &mut es.xq,
            &es.eh,
            &mut [(&ex.down, &mut es.eo)],
        );
        add_scaled(&mut es.acc, &es.eo, wt);
        bytes += (ex.gate.bytes() + ex.up.bytes() + ex.down.bytes()) as u64;
    }
    bytes
}

/// Runs the experts of `pe` (see [`run_experts`]).
pub fn run_pending(
    w: &Weights,
    lv: &LayerView,
    rel: &[ExpertView],
    pe: &Pending,
    staged: &[Option<&[u8]>],
    es: &mut ExpertScratch,
) -> u64 {
    run_experts(w, lv, rel, pe.block, &pe.act, &pe.sel, staged, es)
}
