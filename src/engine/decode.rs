//! One decode step: the token loop of paper §4.4, read top to bottom. For every execution step
//! (each block once; FixedPoint blocks `iterations` times): snapshot the residual → attention →
//! dense FFN (on its delayed input) → route (the experts are queued for step ℓ+δe) → combine →
//! inject the experts due now. What each style reads and writes comes from its
//! [`StyleRule`]; when and on which core the delayed work runs from the [`DelaySchedule`] and
//! the [`Lane`] of the vertical schedule. The stages with more than a line of bookkeeping
//! (dense FFN, route, inject) are [`Token`] methods in `token.rs`.

use super::expert_io::TokenIo;
use super::finite::{check, Phase};
use super::layer::{attention, attn_bytes, lm_head};
use super::ops::add_into;
use super::probe::Probe;
use super::styles::{steps, Step};
use super::token::Token;
use super::vertical::{with_second_core, Job, Shared};
use super::weights::{embed_input, use_q8, Weights};
use super::{between_layers, Engine, ExpertTier, ForwardError, Layout, Schedule};
use crate::telemetry::pmu::PmuPhase;
use crate::telemetry::{LayerStat, RunInfo, TokenStats};
use std::time::Instant;

impl Engine {
    pub(super) fn forward(
        &mut self,
        token: u32,
        pos: usize,
        want_logits: bool,
    ) -> Result<(), ForwardError> {
        let t_start = Instant::now();
        self.ensure_io();
        let fetching = self.fetching() && self.fetcher.is_some();
        // Reads left in flight by an interrupted token complete here; every slot is free after.
        self.quiesce();
        let schedule = self.schedule_now();
        // The step's pool runs on this thread's clock (`step_split`): from here on only.
        self.pool.set_timing(self.opts.step_split);
        self.pool.take_time();
        // Each pool thread's busy time over this token (`TokenStats::pool_threads`).
        let per_thread = self.opts.timings && schedule == Schedule::Sequential;
        self.pool.set_thread_timing(per_thread);
        self.pool.take_thread_time();
        if schedule == Schedule::Vertical && self.cores.is_none() {
            self.cores = Some(super::vertical::Cores::new(self.opts.threads, &self.cfg));
        }
        let ran = self.run_info(fetching, schedule);
        let Engine {
            file,
            vflow,
            cfg,
            opts,
            pool,
            kv,
            rowmajor,
            s,
            rule,
            sched,
            stop,
            pmu,
            rel_experts,
            fetcher,
            prefetcher,
            cores,
            experts_aside,
            ..
        } = self;
        let active = match (opts.layout, &*vflow) {
            (Layout::Vflow, Some(v)) => v,
            _ => &*file,
        };
        let w = Weights {
            file: active,
            cfg,
            pool,
            isa: opts.isa,
            q8: use_q8(opts.int_act, opts.force_int, opts.isa),
            rowmajor: rowmajor
                .as_ref()
                .filter(|_| opts.layout == Layout::RowMajor),
            oracle: opts.oracle_router,
        };
        let prefetch = prefetcher
            .as_ref()
            .filter(|_| opts.prefetch && opts.layout != Layout::RowMajor);
        let le = cfg.effective_layers();
        let mut io = TokenIo::new(
            active,
            fetcher.as_mut().filter(|_| fetching),
            prefetch,
            opts.fetch,
            le,
        );
        let mut stats = TokenStats {
            pos: pos as u32,
            layers: vec![LayerStat::default(); le],
            ran: Some(ran),
            ..Default::default()
        };
        if pmu.is_enabled() {
            pmu.begin_token();
        }
        embed_input(active, cfg, token, &mut s.x);
        check(&s.x, None, 0, Phase::Embedding, pos)?;
        let mut t = Token {
            rule: *rule,
            sched,
            s: &mut *s,
            kv,
            io: &mut io,
            stats: &mut stats,
            rel: rel_experts,
            stop,
            pmu: &mut *pmu,
            pos,
            timings: opts.timings,
            read_known_zero: opts.read_known_zero,
            experts_aside: *experts_aside,
            fuse_shared: opts.fuse_shared,
            lane: None,
        };
        match cores.as_mut().filter(|_| schedule == Schedule::Vertical) {
            // The attention stream here on `main`, the dense/expert streams on `side`.
            Some(c) => {
                let wm = w.with_pool(&c.main);
                let sh = Shared::of(&w);
                with_second_core(sh, &mut c.side, &mut c.dense, &mut c.experts, |lane| {
                    let mut t = t;
                    t.lane = Some(lane);
                    let r = t.layers(&wm);
                    c.jobs += t.lane.map_or(0, |l| l.submitted);
                    r
                })?;
            }
            None => t.layers(&w)?,
        }
        io.finish(&mut stats);
        if want_logits {
            let probe = Probe::start(true);
            stats.lm_head_bytes = lm_head(&w, s);
            stats.ns_lm_head = probe.ns().unwrap_or_default();
            // The final norm's output too: the integer kernels quantize a NaN input to 0.
            check(&s.xb, None, 0, Phase::Logits, pos)?;
            check(&s.logits, None, 0, Phase::Logits, pos)?;
            pmu.phase(PmuPhase::LmHead);
        }
        if pmu.is_enabled() {
            stats.pmu = Some(pmu.end_token());
        }
        stats.ns_total = t_start.elapsed().as_nanos() as u64;
        if per_thread {
            let t = self.pool.take_thread_time().into_iter();
            let t = t.map(|b| crate::telemetry::PoolThreadStat {
                busy_ns: b.busy_ns,
                tasks: b.tasks,
            });
            stats.pool_threads = Some(Box::new(crate::telemetry::PoolThreads(t.collect())));
        }
        let pool_time = self.pool.take_time();
        if self.opts.step_split && want_logits && schedule == Schedule::Sequential {
            self.split.add_step(stats.ns_total, pool_time);
        }
        self.auto_record(schedule, stats.ns_total);
        self.stats = stats;
        Ok(())
    }
}

impl Engine {
    /// What this token runs with, as run (see [`RunInfo`]): `fetching` = the experts are read
    /// from disk through the fetcher, `schedule` = the schedule chosen for this token.
    fn run_info(&self, fetching: bool, schedule: Schedule) -> RunInfo {
        let (act, kv) = self.opts.numerics();
        let active = match (self.opts.layout, &self.vflow) {
            (Layout::Vflow, Some(v)) => v,
            _ => &self.file,
        };
        let experts = self.cfg.has_experts();
        RunInfo {
            // The same condition as the hints the forward pass sends (none under rowmajor).
            prefetch: self.prefetcher.is_some()
                && self.opts.prefetch
                && self.opts.layout != Layout::RowMajor,
            fetch: fetching.then_some(self.opts.fetch),
            tier: experts.then_some(if fetching {
                ExpertTier::Direct
            } else {
                ExpertTier::Mmap
            }),
            layout: self.opts.layout,
            schedule,
            threads: self.pool.threads() as u32,
            weights: if active.is_repacked() {
                format!("{} repacked", active.weights_mode())
            } else {
                active.weights_mode().into()
            },
            act: act.into(),
            kv: kv.into(),
            expert_cache_mib: if fetching {
                self.opts.expert_cache_mib
            } else {
                0
            },
        }
    }
}

impl Token<'_, '_> {
    /// The layers of one token. `self.lane`: the second core (vertical schedule), else everything
    /// runs here.
    fn layers(&mut self, w: &Weights) -> Result<(), ForwardError> {
        let rule = self.rule;
        let cfg = w.cfg;
        self.sched.begin_token();
        // A route-ahead selection lives from a step's fused FFN to that step's routing only.
        self.s.experts.ahead = None;
        if rule.two_streams() {
            // Both streams (registers) start at the embedding.
            self.s.sf.copy_from_slice(&self.s.x);
        }
        for Step { l, block: p, first } in steps(cfg) {
            between_layers(self.stop, w.file)?;
            let lv = &w.file.layers[p];
            let layer_probe = Probe::start(true);
            let next = (l + 1 < cfg.effective_layers()).then(|| rule.block_of(l + 1));
            self.io.layer_start(next.map(|b| &w.file.layers[b]));

            // §4.4: snapshot the residual entering the layer (the one a delayed FFN reads).
            self.sched.snapshot(l, rule.snapshot_source(self.s));
            if first {
                rule.enter_block(self.s);
            }
            // Vertical: the FFN whose input just became known starts on the second core.
            if let (Some(lane), Some(ahead)) =
                (self.lane.as_deref_mut(), self.sched.dense_ready_after(l))
            {
                let block = rule.block_of(ahead);
                if w.file.layers[block].gate.is_some() {
                    let input = rule.snapshot_source(self.s).to_vec();
                    lane.submit(Job::Dense {
                        l: ahead,
                        block,
                        input,
                    });
                }
            }

            // Attention: a = Attn(Norm(x)); x_mid = x + a.
            let probe = Probe::start(self.timings);
            attention(w, lv, l, p, self.pos, self.kv, self.s);
            let st = &mut self.stats.layers[l];
            st.bytes.attn = attn_bytes(lv);
            if let Some(ns) = probe.ns() {
                st.ns_attn = ns;
            }
            self.pmu.phase(PmuPhase::Attention);
            // Norm(x), the attention's heads and its projection: the integer kernels quantize a
            // NaN input to 0, so each stage is checked, not only the output.
            for v in [&self.s.xb, &self.s.att, &self.s.attn_out] {
                check(v, Some(p), l, Phase::Attention, self.pos)?;
            }
            self.s.xa.copy_from_slice(&self.s.x);
            add_into(&mut self.s.xa, &self.s.attn_out);

            // Dense FFN: f = FFN(Norm(input)), the input delayed by δd (eq. 4.11).
            let probe = Probe::start(self.timings);
            let (bytes, side_ns) = self.dense_ffn(w, l, p);
            if let Some(ns) = probe.ns() {
                self.stats.layers[l].ns_dense =
                    self.split_fused_ns(l, bytes, side_ns.unwrap_or(ns));
            }
            self.stats.layers[l].bytes.dense = bytes;
            if lv.gate.is_some() {
                self.pmu.phase(PmuPhase::Dense);
            }

            // Route: the selection is queued for injection at step ℓ+δe (eq. 4.16).
            let ahead = cfg.meta.route_ahead as usize;
            if cfg.has_experts() && ahead > 0 {
                self.route_ahead(w, l, ahead);
            } else if cfg.has_experts() && !lv.experts.is_empty() {
                self.route_and_queue(w, l, p, next);
            }

            // Combine the layer's outputs into the next residual.
            rule.combine(self.s);

            // Inject the expert outputs due at the end of this layer.
            let (ebytes, ns) = self.inject_due(w, l)?;
            let st = &mut self.stats.layers[l];
            st.bytes.experts = ebytes;
            self.pmu.phase(if ebytes > 0 {
                PmuPhase::Experts
            } else {
                PmuPhase::Other
            });
            if self.timings && ebytes > 0 {
                st.ns_experts = ns;
            }
            self.io.layer_end(st, layer_probe.ns().unwrap_or_default());
            let d = &self.s.dense;
            for v in [&d.xb, &d.hb, &d.out, &self.s.x] {
                check(v, Some(p), l, Phase::FeedForward, self.pos)?;
            }
            if rule.two_streams() {
                check(&self.s.sf, Some(p), l, Phase::FeedForward, self.pos)?;
            }

            // DecoupledStreams: merge the two streams every merge_interval layers.
            rule.merge(self.s, l);
        }
        rule.finish(self.s);
        Ok(())
    }
}
