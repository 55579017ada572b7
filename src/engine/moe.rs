//! The routed experts (paper §4.2.3): the router's top-k selection and the evaluation of the
//! selected experts of one queued routing, from the map or from staging slots.

use super::layer::gated;
use super::ops::*;
use super::schedule::Pending;
use super::scratch::{DenseScratch, ExpertScratch, ExpertSlot};
use super::weights::Weights;
use crate::format::reader::{ExpertView, LayerView, Matrix};
use crate::kernels::matvec::{serial_matvec, Act};
use crate::kernels::Isa;
use crate::model::{FfnAct, ModelConfig, RouterNorm};

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
    expert_input_into(cfg, lv, src, &mut act);
    act
}

/// [`expert_input`] into `act` (length d).
pub fn expert_input_into(cfg: &ModelConfig, lv: &LayerView, src: &[f32], act: &mut [f32]) {
    rmsnorm(act, src, lv.moe_norm.as_deref(), cfg.rms_eps);
}

/// The top-k (expert, weight) list of router `lv` on its normalized input `act`, best first.
pub fn select(cfg: &ModelConfig, lv: &LayerView, act: &[f32]) -> Vec<(usize, f32)> {
    let d = cfg.d_model;
    let r = lv.router.as_ref().expect("router");
    // Eight lane sums per expert (`kernels::router`), not one serial sum: a 128-expert router
    // of width 2048 is 262 k additions per layer, latency-bound when serial.
    let mut logits = vec![0.0; cfg.n_experts];
    crate::kernels::router::logits(&r[..cfg.n_experts * d], &act[..d], &mut logits);
    let bias = |e: usize| lv.router_bias.as_ref().map_or(0.0, |b| b[e]);
    for (e, l) in logits.iter_mut().enumerate() {
        *l += bias(e);
    }
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

/// One layer's routing, as the experts run it: the block, the experts' input `N_m(x)` and the
/// selection (expert, weight), best first.
#[derive(Clone, Copy)]
pub struct Routed<'a> {
    pub block: usize,
    pub act: &'a [f32],
    pub sel: &'a [(usize, f32)],
}

/// Runs the selected experts of `r` into `es.acc`; `staged[i]` holds expert `r.sel[i]`'s region
/// when it was read into a staging slot (its views in `rel` are region-relative), else it is
/// read from the map. Returns the bytes touched.
pub fn run_experts(
    w: &Weights,
    lv: &LayerView,
    rel: &[ExpertView],
    r: Routed,
    staged: &[Option<&[u8]>],
    es: &mut ExpertScratch,
) -> u64 {
    let Routed { block: p, act, sel } = r;
    let oracle_sel;
    let (sel, staged) = if w.oracle {
        oracle_sel = oracle_select(w, lv, p, act, sel.len(), es);
        (&oracle_sel[..], &[][..])
    } else {
        (sel, staged)
    };
    if sel.len() > 1 && staged.iter().all(Option::is_none) {
        return run_experts_fused(w, lv, Routed { sel, ..r }, es);
    }
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
            Some(e as u8),
            &mut es.xq,
            act,
            &mut [(&ex.gate, &mut es.eh), (&ex.up, &mut es.eh2)],
        );
        gated(w.isa, w.cfg.meta.ffn_act, &mut es.eh, &es.eh2);
        w.mv_in(
            src,
            p,
            Some(e as u8),
            &mut es.xq,
            &es.eh,
            &mut [(&ex.down, &mut es.eo)],
        );
        add_scaled(&mut es.acc, &es.eo, wt);
        bytes += (ex.gate.bytes() + ex.up.bytes() + ex.down.bytes()) as u64;
    }
    bytes
}

/// The oracle's selection (`EngineOptions::oracle_router`, a diagnostic): the `k` experts of
/// layer `p` whose hidden activation `h_e = act(W_gate x) ⊙ W_up x` on `act` has the largest
/// norm, ties to the lower id, each with weight 1 (the oracle is offered only for
/// `router_norm = topk_unweighted` models, whose experts are summed with weight 1). Computes
/// every expert's gate and up projections from the map. moefy's routers are fitted to rank
/// experts by this norm, and its `--heldout` recall compares them with this selection.
pub fn oracle_select(
    w: &Weights,
    lv: &LayerView,
    p: usize,
    act: &[f32],
    k: usize,
    es: &mut ExpertScratch,
) -> Vec<(usize, f32)> {
    let mut norms: Vec<(usize, f32)> = Vec::with_capacity(lv.experts.len());
    for (e, ex) in lv.experts.iter().enumerate() {
        w.mv_in(
            w.file.bytes(),
            p,
            Some(e as u8),
            &mut es.xq,
            act,
            &mut [(&ex.gate, &mut es.eh), (&ex.up, &mut es.eh2)],
        );
        gated(w.isa, w.cfg.meta.ffn_act, &mut es.eh, &es.eh2);
        norms.push((e, es.eh.iter().map(|v| v * v).sum::<f32>()));
    }
    norms.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    norms.truncate(k);
    norms.into_iter().map(|(e, _)| (e, 1.0)).collect()
}

/// [`run_experts`] with every selected expert read from the map: the experts in one pool run,
/// one task per expert ([`fused`]), instead of two runs per expert. The arithmetic, and the
/// order of the weighted sum, are those of the one-expert-at-a-time loop, so the result is
/// bit-identical (docs/MOE.md, "Speed at the default").
fn run_experts_fused(w: &Weights, lv: &LayerView, r: Routed, es: &mut ExpertScratch) -> u64 {
    es.ensure_slots(r.sel.len(), w.cfg.expert_ffn, w.cfg.d_model);
    let ExpertScratch {
        xq,
        slots,
        slot_xq,
        acc,
        ..
    } = es;
    let bufs = Slots {
        slots,
        xq: slot_xq,
        acc,
    };
    fused(w, lv, r, xq, None, bufs, None)
}

/// The shared expert (the layer's dense FFN) and the selected routed experts `sel` of block `p`
/// together, both on `ds.xb` (already `Norm(src)`, equal to the experts' input), in one pool
/// run with the shared expert as one more task ([`fused`], docs/SEMANTICS.md X3).
/// Leaves the shared expert's output in `ds.hb`/`ds.out` before its gate scale and post-norm
/// (the caller applies those, as [`super::layer::dense`] does), and the routed sum in `es.acc`
/// with the arithmetic of [`run_experts_fused`]. `ahead`: a route-ahead selection to make in
/// the same run ([`RouteAhead`]). Returns the shared and the routed bytes.
pub fn run_with_shared(
    w: &Weights,
    lv: &LayerView,
    p: usize,
    sel: &[(usize, f32)],
    ds: &mut DenseScratch,
    es: &mut ExpertScratch,
    ahead: Option<RouteAhead>,
) -> (u64, u64) {
    let (g, u, dn) = (
        lv.gate.as_ref().expect("a shared expert"),
        lv.up.as_ref().expect("a shared expert"),
        lv.down.as_ref().expect("a shared expert"),
    );
    // k slots for the experts, and k + 1 Q8 buffers for the down projections' inputs.
    es.ensure_slots(sel.len() + 1, w.cfg.expert_ffn, w.cfg.d_model);
    let DenseScratch {
        xb,
        hb,
        hb2,
        out,
        xq,
    } = ds;
    let shared = ExpertBufs {
        gate: g,
        up: u,
        down: dn,
        h: hb,
        h2: hb2,
        out,
    };
    let ExpertScratch {
        slots,
        slot_xq,
        acc,
        ..
    } = es;
    let r = Routed {
        block: p,
        act: xb,
        sel,
    };
    let bufs = Slots {
        slots,
        xq: slot_xq,
        acc,
    };
    let routed = fused(w, lv, r, xq, Some(shared), bufs, ahead);
    ((g.bytes() + u.bytes() + dn.bytes()) as u64, routed)
}

/// An expert's matrices and buffers in [`fused`] (the shared expert's, or a selected one's).
struct ExpertBufs<'a> {
    gate: &'a Matrix,
    up: &'a Matrix,
    down: &'a Matrix,
    h: &'a mut [f32],
    h2: &'a mut [f32],
    out: &'a mut [f32],
}

/// A fused run's per-expert buffers: each selected expert's slot, the Q8 copies of the down
/// projections' inputs, and the routed sum.
struct Slots<'a> {
    slots: &'a mut [ExpertSlot],
    xq: &'a mut [crate::kernels::Q8Act],
    acc: &'a mut [f32],
}

/// The experts of [`run_experts_fused`] and [`run_with_shared`] (the shared expert first, when
/// given) on `r.act`, its Q8 copy in `xq`, either [`by_expert`] or [`by_stripe`] (the rule:
/// [`BY_EXPERT_TASKS_PER_THREAD`]); then `acc` = Σ weight · expert output in `r.sel`'s order.
/// `ahead` is made as one more task of the run by expert, else before the runs by stripe.
/// Both ways compute each expert with the arithmetic of the one-expert-at-a-time loop, and the
/// sum in the same order, so the result is bit-identical either way. Returns the routed bytes.
fn fused(
    w: &Weights,
    lv: &LayerView,
    r: Routed,
    xq: &mut crate::kernels::Q8Act,
    shared: Option<ExpertBufs>,
    bufs: Slots,
    ahead: Option<RouteAhead>,
) -> u64 {
    let Slots {
        slots,
        xq: slot_xq,
        acc,
    } = bufs;
    let sel = r.sel;
    let tasks = sel.len() + usize::from(shared.is_some());
    if w.rowmajor.is_none() && tasks >= BY_EXPERT_TASKS_PER_THREAD * w.pool.threads() {
        by_expert(w, lv, r, xq, shared, (slots, slot_xq), ahead);
    } else {
        if let Some(mut a) = ahead {
            a.run(w.cfg);
        }
        by_stripe(w, lv, r, xq, shared, slots, slot_xq);
    }
    acc.fill(0.0);
    let mut routed = 0;
    for (slot, &(e, wt)) in slots.iter().zip(sel) {
        add_scaled(acc, &slot.o, wt);
        let ex = &lv.experts[e];
        routed += (ex.gate.bytes() + ex.up.bytes() + ex.down.bytes()) as u64;
    }
    routed
}

/// [`fused`] runs one task per expert when there are at least this many experts per pool
/// thread, else two pool runs split by stripes. Whole experts read each expert's region front
/// to back on one thread and make the gated products on every thread, but an expert is the
/// smallest piece of work: with few experts per thread, a thread that draws the last one leaves
/// the others waiting. Only moefy's default at 2 threads (a shared expert and 6 experts, 7
/// tasks) was measured (docs/MOE.md, "Speed at the default"); 3 is a judgment, not a measured
/// optimum.
const BY_EXPERT_TASKS_PER_THREAD: usize = 3;

/// [`fused`] in one pool run, one task per expert ([`ExpertTask::run`]): its gate and up
/// projections, gated product, Q8 copy and down projection on one thread. An expert's gate,
/// up and down are one region of the file, read front to back.
fn by_expert(
    w: &Weights,
    lv: &LayerView,
    r: Routed,
    xq: &mut crate::kernels::Q8Act,
    shared: Option<ExpertBufs>,
    (slots, slot_xq): (&mut [ExpertSlot], &mut [crate::kernels::Q8Act]),
    ahead: Option<RouteAhead>,
) {
    let Routed { act: x, sel, .. } = r;
    let mut xqs = slot_xq.iter_mut();
    // The route-ahead selection last: the largest task (the shared expert) goes first, so the
    // selection fills the gap the last expert leaves on the other thread.
    let mut jobs: Vec<Job> = Vec::with_capacity(sel.len() + 2);
    let routed = slots.iter_mut().zip(sel).map(|(slot, &(e, _))| {
        let ex = &lv.experts[e];
        ExpertBufs {
            gate: &ex.gate,
            up: &ex.up,
            down: &ex.down,
            h: &mut slot.h,
            h2: &mut slot.h2,
            out: &mut slot.o,
        }
    });
    for e in shared.into_iter().chain(routed) {
        // A selected expert's stripe offsets are usually cold: asked for together here, their
        // misses overlap instead of stalling each task.
        for m in [e.gate, e.up, e.down] {
            crate::kernels::prefetch::to_l2(&m.stripes);
        }
        let xq = xqs.next().expect("a Q8 buffer per expert");
        // The down projection's input decided here (`Weights` stays on this thread).
        let q8_down = w.q8_for(&*e.h, [e.down.quant]);
        jobs.push(Job::Expert(ExpertTask { e, xq, q8_down }));
    }
    let gate_up = || {
        jobs.iter()
            .filter_map(|j| match j {
                Job::Expert(t) => Some([t.e.gate.quant, t.e.up.quant]),
                Job::Route(_) => None,
            })
            .flatten()
    };
    let q8 = w.q8_for(x, gate_up());
    if q8 {
        xq.quantize_for(x, gate_up());
    }
    let act = Act {
        x,
        q8: q8.then_some(&*xq),
    };
    let (isa, ffn_act, bytes, cfg) = (w.isa, w.cfg.meta.ffn_act, w.file.bytes(), w.cfg);
    jobs.extend(ahead.map(Job::Route));
    w.pool.for_each_mut(&mut jobs, &|_, j| match j {
        Job::Expert(t) => t.run(isa, ffn_act, bytes, &act),
        Job::Route(a) => a.run(cfg),
    });
}

/// A task of [`by_expert`]'s pool run.
enum Job<'a> {
    Expert(ExpertTask<'a>),
    Route(RouteAhead<'a>),
}

/// A route-ahead selection (`meta.route_ahead` = D ≥ 1) made as a task of the fused FFN run of
/// the step before it is needed: the router of layer `lv` on its input `N_m(src)`, `src` the
/// step's router input (the residual the fused FFN reads), into `sel`; then the next layer's
/// router is asked for in L2. The same functions on the same input as `Token::route_ahead`'s
/// own selection, so the same experts and weights; on 2 threads it runs beside the experts
/// instead of on the engine thread alone (docs/SEMANTICS.md X3).
pub struct RouteAhead<'a> {
    pub lv: &'a LayerView,
    pub src: &'a [f32],
    /// The router's input buffer (d).
    pub router_in: &'a mut [f32],
    pub sel: &'a mut Vec<(usize, f32)>,
    /// The router to bring into L2 for the next step (the layer after `lv`).
    pub next_router: Option<&'a [f32]>,
}

impl RouteAhead<'_> {
    /// Selects into `sel` and prefetches `next_router`.
    pub fn run(&mut self, cfg: &ModelConfig) {
        expert_input_into(cfg, self.lv, self.src, self.router_in);
        *self.sel = select(cfg, self.lv, self.router_in);
        if let Some(r) = self.next_router {
            crate::kernels::prefetch::to_l2(r);
        }
    }
}

/// [`fused`] in two pool runs split by stripes: gate and up of every expert, then their down
/// projections (each on its own expert's gated product), with the gated products and their Q8
/// copies made on this thread between the runs.
fn by_stripe(
    w: &Weights,
    lv: &LayerView,
    r: Routed,
    xq: &mut crate::kernels::Q8Act,
    mut shared: Option<ExpertBufs>,
    slots: &mut [ExpertSlot],
    slot_xq: &mut [crate::kernels::Q8Act],
) {
    let Routed {
        block: p,
        act: x,
        sel,
    } = r;
    let k = sel.len();
    let bytes = w.file.bytes();
    let mut ids = Vec::with_capacity(2 * k + 2);
    let mut outs: Vec<(&Matrix, &mut [f32])> = Vec::with_capacity(2 * k + 2);
    if let Some(ExpertBufs {
        gate, up, h, h2, ..
    }) = shared.as_mut()
    {
        outs.push((gate, &mut **h));
        outs.push((up, &mut **h2));
        ids.extend([None, None]);
    }
    for (slot, &(e, _)) in slots.iter_mut().zip(sel) {
        let ex = &lv.experts[e];
        outs.push((&ex.gate, &mut slot.h));
        outs.push((&ex.up, &mut slot.h2));
        ids.extend([Some(e as u8), Some(e as u8)]);
    }
    // An expert's gate and up are stored interleaved (one group); experts apart.
    w.mv_each(
        bytes,
        (p, &ids),
        2,
        std::slice::from_mut(xq),
        &[x],
        &mut outs,
    );
    drop(outs);
    let act = w.cfg.meta.ffn_act;
    let mut xs: Vec<&[f32]> = Vec::with_capacity(k + 1);
    let mut outs: Vec<(&Matrix, &mut [f32])> = Vec::with_capacity(k + 1);
    ids.clear();
    if let Some(ExpertBufs {
        down, h, h2, out, ..
    }) = shared.as_mut()
    {
        gated(w.isa, act, h, h2);
        xs.push(&**h);
        outs.push((down, &mut **out));
        ids.push(None);
    }
    for (slot, &(e, _)) in slots.iter_mut().zip(sel) {
        gated(w.isa, act, &mut slot.h, &slot.h2);
        xs.push(&slot.h);
        outs.push((&lv.experts[e].down, &mut slot.o));
        ids.push(Some(e as u8));
    }
    w.mv_each(bytes, (p, &ids), 1, slot_xq, &xs, &mut outs);
}

/// One expert of a [`by_expert`] run: its matrices and buffers, and the Q8 copy of its gated
/// product (the down projection's input).
struct ExpertTask<'a> {
    e: ExpertBufs<'a>,
    xq: &'a mut crate::kernels::Q8Act,
    /// The down projection takes the Q8 copy ([`Weights::q8_for`]).
    q8_down: bool,
}

impl ExpertTask<'_> {
    /// The expert on the calling thread: `o = W_down · Q8(act(W_gate x) ⊙ W_up x)`, `x` as `act`.
    fn run(&mut self, isa: Isa, ffn_act: FfnAct, bytes: &[u8], act: &Act) {
        let ExpertBufs {
            gate,
            up,
            down,
            h,
            h2,
            out,
        } = &mut self.e;
        serial_matvec(isa, bytes, &mut [(gate, &mut **h), (up, &mut **h2)], act);
        gated(isa, ffn_act, h, h2);
        let q8 = self.q8_down;
        if q8 {
            self.xq.quantize_for(h, [down.quant]);
        }
        let act = Act {
            x: h,
            q8: q8.then_some(&*self.xq),
        };
        serial_matvec(isa, bytes, &mut [(down, &mut **out)], &act);
    }
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
    let r = Routed {
        block: pe.block,
        act: &pe.act,
        sel: &pe.sel,
    };
    run_experts(w, lv, rel, r, staged, es)
}
