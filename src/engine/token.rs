//! What the layers of one token touch ([`Token`]), and the three stages of a layer that the
//! decode loop ([`super::decode`]) calls by name: the dense FFN on its delayed input, routing
//! (the selection is queued for step ℓ+δe), and injecting the experts that are due.

use super::expert_io::TokenIo;
use super::layer::{dense, dense_bytes, dense_finish, shared_gate_scale};
use super::moe::{expert_input, route, run_pending, run_with_shared, select, RouteAhead};
use super::ops::rmsnorm;
use super::probe::Probe;
use super::schedule::{DelayInput, DelaySchedule, Pending};
use super::scratch::Scratch;
use super::styles::StyleRule;
use super::vertical::{Job, Key, Lane};
use super::weights::Weights;
use super::ForwardError;
use crate::engine::kv::KvCache;
use crate::format::reader::ExpertView;
use crate::telemetry::pmu::Pmu;
use crate::telemetry::TokenStats;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

/// Everything the layers of one token touch.
pub(super) struct Token<'a, 'w> {
    pub(super) rule: StyleRule,
    pub(super) sched: &'a mut DelaySchedule,
    pub(super) s: &'a mut Scratch,
    pub(super) kv: &'a mut KvCache,
    pub(super) io: &'a mut TokenIo<'w>,
    pub(super) stats: &'a mut TokenStats,
    pub(super) rel: &'a [Vec<ExpertView>],
    pub(super) stop: &'a AtomicBool,
    pub(super) pmu: &'a mut Pmu,
    pub(super) pos: usize,
    pub(super) timings: bool,
    pub(super) read_known_zero: bool,
    /// Vertical: the experts run on the second core (else here, after attention).
    pub(super) experts_aside: bool,
    /// `EngineOptions::fuse_shared`.
    pub(super) fuse_shared: bool,
    /// The vertical schedule's second core: the dense FFN and experts queued there (`None`:
    /// every stream runs here).
    pub(super) lane: Option<&'a mut Lane>,
}

impl Token<'_, '_> {
    /// `s.dense.out` = the dense FFN of step `l` (block `p`) on the input the schedule names:
    /// zero without reading a weight when that input is known to be zero, collected from the
    /// second core when it ran there. Returns the bytes read and the second core's time.
    pub(super) fn dense_ffn(&mut self, w: &Weights, l: usize, p: usize) -> (u64, Option<u64>) {
        let rule = self.rule;
        let lv = &w.file.layers[p];
        let s = &mut *self.s;
        if lv.gate.is_none() {
            s.dense.out.fill(0.0);
            return (0, None);
        }
        if self.lane.is_none() {
            if let Some(shared) = self.fused_ffn(w, l, p) {
                return (shared, None);
            }
        }
        let s = &mut *self.s;
        match self.sched.dense_input(l) {
            DelayInput::Zero if !self.read_known_zero => {
                s.dense.out.fill(0.0);
                return (0, None);
            }
            DelayInput::Zero => dense(w, lv, p, &vec![0.0; w.cfg.d_model], &mut s.dense),
            DelayInput::Delayed(x) => match self.lane.as_deref_mut() {
                Some(lane) => {
                    let done = lane.wait(Key::Dense(l));
                    s.dense.out.copy_from_slice(&done.out);
                    return (done.bytes, Some(done.ns));
                }
                None => dense(w, lv, p, x, &mut s.dense),
            },
            DelayInput::Current => {
                let (src, ds, _) = rule.read_with_ffn(s, rule.dense_in);
                dense(w, lv, p, src, ds);
                let mut cap = s.capture.take();
                if let Some(c) = cap.as_mut().and_then(|c| c.get_mut(l)) {
                    c.residual.clear();
                    c.residual.extend_from_slice(rule.read(s, rule.dense_in));
                    c.input.clone_from(&s.dense.xb);
                    c.hidden.clone_from(&s.dense.hb);
                }
                s.capture = cap;
            }
        }
        (dense_bytes(lv), None)
    }

    /// The shared expert and the routed experts due at step `l` (block `p`) together
    /// (`moe::run_with_shared`, docs/SEMANTICS.md X3), with this step's route-ahead selection,
    /// when their selection is already known (route-ahead) and they read the same input; else
    /// `None` and nothing is computed. Returns the shared
    /// expert's bytes; the routed experts' bytes go to their [`Pending::fused`], their sum to
    /// `ExpertScratch::acc`.
    fn fused_ffn(&mut self, w: &Weights, l: usize, p: usize) -> Option<u64> {
        let (rule, cfg) = (self.rule, w.cfg);
        if !self.fuse_shared
            || w.oracle
            || l != p
            || cfg.meta.route_ahead == 0
            || self.io.fetching()
            || self.s.capture.is_some()
            || !matches!(self.sched.dense_input(l), DelayInput::Current)
        {
            return None;
        }
        let lv = &w.file.layers[p];
        let [pe] = self.sched.due_mut(l) else {
            return None;
        };
        if pe.block != p
            || pe.offloaded
            || !pe.tickets.is_empty()
            || pe.sel.is_empty()
            || pe.fused.is_some()
        {
            return None;
        }
        // The experts' input N_m(x) is the shared expert's N_f(x) when both norms and sources
        // agree (moefy's files): computed once. Otherwise it is computed and compared.
        let once = rule.route_in == rule.dense_in && lv.moe_norm_is_ffn_norm;
        let own = (!once).then(|| expert_input(cfg, lv, rule.read(self.s, rule.route_in)));
        let (src, ds, es) = rule.read_with_ffn(self.s, rule.dense_in);
        rmsnorm(&mut ds.xb, src, lv.ffn_norm.as_deref(), cfg.rms_eps);
        if own.is_some_and(|a| a != *ds.xb) {
            return None;
        }
        let gate_scale = lv
            .shared_gate
            .as_deref()
            .map(|g| shared_gate_scale(g, &ds.xb));
        // This step's route-ahead selection (of layer l + D, which `route_ahead` then takes)
        // as a task of the same run, when it reads the residual this FFN reads.
        let t = l + cfg.meta.route_ahead as usize;
        let ahead_lv = w.file.layers.get(t).filter(|lt| {
            l > 0 && rule.route_in == rule.dense_in && !lt.experts.is_empty() && lt.router.is_some()
        });
        let mut router_in = std::mem::take(&mut es.router_in);
        let mut ahead_sel = Vec::new();
        let ahead = ahead_lv.map(|lt| RouteAhead {
            lv: lt,
            src,
            router_in: &mut router_in,
            sel: &mut ahead_sel,
            next_router: w.file.layers.get(t + 1).and_then(|n| n.router.as_deref()),
        });
        let ran_ahead = ahead.is_some();
        let (shared, routed) = run_with_shared(w, lv, p, &pe.sel, ds, es, ahead);
        es.router_in = router_in;
        es.ahead = ran_ahead.then_some((t, ahead_sel));
        dense_finish(w, lv, gate_scale, ds);
        // The experts have run: their input is not kept (route-ahead skips a fused selection).
        pe.fused = Some((routed, 0));
        Some(shared)
    }

    /// Splits a fused layer's time ([`Self::fused_ffn`]) between the shared expert (returned)
    /// and the routed experts (kept on their [`Pending::fused`]) in proportion to their bytes.
    pub(super) fn split_fused_ns(&mut self, l: usize, shared_bytes: u64, ns: u64) -> u64 {
        match self.sched.due_mut(l) {
            [pe] => match &mut pe.fused {
                Some((routed, routed_ns)) => {
                    let all = (shared_bytes + *routed).max(1);
                    *routed_ns = (ns as u128 * *routed as u128 / all as u128) as u64;
                    ns - *routed_ns
                }
                None => ns,
            },
            _ => ns,
        }
    }

    /// Routes step `l` (block `p`) and queues its selection for injection at step ℓ+δe
    /// (eq. 4.16); with the vertical schedule, experts due later start on the second core.
    /// `next`: the block of step ℓ+1, whose experts the prefetcher may hint.
    pub(super) fn route_and_queue(&mut self, w: &Weights, l: usize, p: usize, next: Option<usize>) {
        let (rule, cfg) = (self.rule, w.cfg);
        let lv = &w.file.layers[p];
        let probe = Probe::start(self.timings);
        let src = rule.read(self.s, rule.route_in);
        let (act, sel) = route(cfg, lv, src);
        let nv = next.map(|b| &w.file.layers[b]);
        if let Some(r) = nv.and_then(|nv| nv.router.as_deref()) {
            crate::kernels::prefetch::to_l2(r);
        }
        // Direct tier with prefetch: the next layer's router on this layer's router input
        // predicts the experts to read ahead (an extension: docs/SEMANTICS.md).
        let spec: Option<Vec<usize>> = nv
            .filter(|nv| self.io.speculating() && nv.router.is_some() && !nv.experts.is_empty())
            .map(|nv| {
                select(cfg, nv, &expert_input(cfg, nv, src))
                    .into_iter()
                    .map(|(e, _)| e)
                    .collect()
            });
        let st = &mut self.stats.layers[l];
        st.routing = sel.iter().map(|&(e, w)| (e as u16, w)).collect();
        let tickets = self.io.routed(lv, &sel, nv, spec.as_deref());
        let later = self.experts_aside && self.sched.inject_step(l) > l && !self.io.fetching();
        let offloaded = match self.lane.as_deref_mut() {
            Some(lane) if later => {
                let (act, sel) = (act.clone(), sel.clone());
                lane.submit(Job::Experts {
                    from: l,
                    block: p,
                    act,
                    sel,
                });
                true
            }
            _ => false,
        };
        self.sched.defer(Pending {
            block: p,
            from: l,
            act,
            sel,
            scale: rule.scale,
            tickets,
            offloaded,
            fused: None,
        });
        if let Some(ns) = probe.ns() {
            self.stats.layers[l].ns_router = ns;
        }
    }

    /// Route-ahead (`meta.route_ahead` = D ≥ 1, moefy's `--route-from D`): at step ℓ the routers
    /// of layer ℓ+D (at step 0: of layers 0..=D) select their experts from this step's router
    /// input, so their tiles can be read D layers early; the selection is queued for the layer
    /// it belongs to. Then this layer's queued experts get their input: this layer's own
    /// `N_m(x)`, exactly what they read without route-ahead.
    pub(super) fn route_ahead(&mut self, w: &Weights, l: usize, d: usize) {
        let (rule, cfg) = (self.rule, w.cfg);
        let n = cfg.n_layers;
        let targets = if l == 0 {
            0..(d + 1).min(n)
        } else if l + d < n {
            l + d..l + d + 1
        } else {
            0..0
        };
        let probe = Probe::start(self.timings);
        let mut router_in = std::mem::take(&mut self.s.experts.router_in);
        // Made by this step's fused FFN run (`fused_ffn`), for one of the targets.
        let mut made = self.s.experts.ahead.take();
        let src: &[f32] = rule.read(&*self.s, rule.route_in);
        for t in targets {
            let lt = &w.file.layers[t];
            if lt.experts.is_empty() {
                continue;
            }
            let sel = match made.take() {
                Some((mt, sel)) if mt == t => sel,
                other => {
                    debug_assert!(other.is_none(), "a selection made for another layer");
                    let mut sel = Vec::new();
                    RouteAhead {
                        lv: lt,
                        src,
                        router_in: &mut router_in,
                        sel: &mut sel,
                        // The router used at the next step, brought in while this layer computes.
                        next_router: w.file.layers.get(t + 1).and_then(|n| n.router.as_deref()),
                    }
                    .run(cfg);
                    sel
                }
            };
            self.stats.layers[t].routing = sel.iter().map(|&(e, w)| (e as u16, w)).collect();
            let tickets = self.io.routed(lt, &sel, None, None);
            self.sched.defer_at(
                t,
                Pending {
                    block: t,
                    from: l,
                    act: Vec::new(),
                    sel,
                    scale: rule.scale,
                    tickets,
                    offloaded: false,
                    fused: None,
                },
            );
        }
        let lv = &w.file.layers[l];
        for pe in self.sched.due_mut(l) {
            if pe.act.is_empty() && pe.fused.is_none() {
                pe.act = expert_input(cfg, lv, src);
            }
        }
        self.s.experts.router_in = router_in;
        if let Some(ns) = probe.ns() {
            self.stats.layers[l].ns_router = ns;
        }
    }

    /// Injects the expert outputs due at the end of step `l` into the residual the style names.
    /// Returns the expert bytes and the time: waits and compute of the experts that ran here,
    /// plus the second core's compute for those that ran there.
    pub(super) fn inject_due(&mut self, w: &Weights, l: usize) -> Result<(u64, u64), ForwardError> {
        let rule = self.rule;
        let (mut ebytes, mut here_ns, mut side_ns) = (0u64, 0u64, 0u64);
        for pe in self.sched.due(l) {
            let t3 = Instant::now();
            self.io.before_experts(&pe)?;
            if let Some((bytes, ns)) = pe.fused {
                // Computed with the shared expert; the sum waits in `acc`.
                (ebytes, side_ns) = (ebytes + bytes, side_ns + ns);
            } else if pe.offloaded {
                let lane = self
                    .lane
                    .as_deref_mut()
                    .expect("offloaded without a second core");
                let done = lane.wait(Key::Experts(pe.from));
                self.s.experts.acc.copy_from_slice(&done.out);
                (ebytes, side_ns) = (ebytes + done.bytes, side_ns + done.ns);
            } else {
                let staged = self.io.staged(&pe);
                let (lvb, rel) = (&w.file.layers[pe.block], &self.rel[pe.block]);
                ebytes += run_pending(w, lvb, rel, &pe, &staged, &mut self.s.experts);
            }
            self.io.after_experts(&pe);
            rule.inject(self.s, pe.scale);
            if !pe.offloaded || pe.fused.is_some() {
                here_ns += t3.elapsed().as_nanos() as u64;
            }
        }
        Ok((ebytes, here_ns + side_ns))
    }
}
