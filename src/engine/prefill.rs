//! Prompt prefill: batches of up to 128 tokens (`BatchScratch::tokens_per_batch`) with each
//! weight read once per batch, for the models whose layers have no cross-token delays
//! (standard pre-norm, dense, δd = 0, tiled layout); other models are fed token by token
//! through the decode step. The batch path uses the same per-token functions as decode
//! (`qkv_post`, `attend`, `gated`, `lm_head`) around batched matvecs.

use super::finite::{check, NonFinite, Phase};
use super::layer::{attend_batch, attn_bytes, dense_bytes, gated, lm_head, qkv_post};
use super::ops::*;
use super::scratch::BatchScratch;
use super::weights::{embed_input, use_q8, Weights};
use super::{between_layers, Engine, ForwardError, Layout};
use crate::format::reader::Matrix;
use crate::kernels::matvec::tiled_matvec_batch;
use crate::kernels::pool::ThreadPool;
use crate::kernels::{Isa, Q8Act};
use crate::model::CombineStyle;
use crate::telemetry::{LayerStat, TokenStats};
use std::sync::atomic::Ordering;
use std::time::Instant;

impl Engine {
    /// Whether prompts can be prefilled in batches: standard pre-norm dense models on the tiled
    /// layout (pipeline-native styles, MoE and the row-major baseline go token by token).
    pub fn can_batch_prefill(&self) -> bool {
        let c = &self.cfg;
        c.combine_style == CombineStyle::Sequential
            && !c.has_experts()
            && c.dense_delay == 0
            && c.has_dense()
            && self.file.layers.iter().all(|l| l.shared_gate.is_none())
            && self.opts.layout == Layout::Cflow
            && self.opts.batch_prefill
    }

    /// Feeds `tokens` at the current position; afterwards `logits()` holds the prediction after
    /// the last one. Batched (weights read once per batch of up to 128 tokens) when the model
    /// allows it, otherwise token by token; the results are the same up to float rounding order.
    pub fn prefill(&mut self, tokens: &[u32]) -> Result<(), ForwardError> {
        if tokens.is_empty() {
            return Ok(());
        }
        self.check_prompt(tokens)?;
        if !self.can_batch_prefill() || tokens.len() == 1 {
            for (i, &t) in tokens.iter().enumerate() {
                self.step(t, i + 1 == tokens.len())?;
            }
            return Ok(());
        }
        let b = BatchScratch::tokens_per_batch(&self.cfg);
        let n_chunks = tokens.len().div_ceil(b);
        for (ci, chunk) in tokens.chunks(b).enumerate() {
            let p0 = self.kv.len;
            self.files_intact()?;
            self.forward_batch(chunk, p0, ci + 1 == n_chunks)?;
            self.files_intact()?;
            self.kv.len = p0 + chunk.len();
        }
        Ok(())
    }

    /// [`Engine::prefill`] that hands `each` the logits after every token of `tokens`, in
    /// order, as llama.cpp's perplexity evaluates a chunk: the prompt's batched arithmetic
    /// (`perplexity --batch`), where [`Engine::step`] gives decode's. Token by token when the
    /// model cannot batch. A batch's logits are handed out before the check that the model's
    /// pages are intact ends it; when that check fails the call returns its error and the
    /// caller must drop what it got.
    pub fn prefill_each(
        &mut self,
        tokens: &[u32],
        each: &mut dyn FnMut(&[f32]),
    ) -> Result<(), ForwardError> {
        if !self.can_batch_prefill() || tokens.len() < 2 {
            for &t in tokens {
                let l = self.step(t, true)?.expect("asked for logits");
                each(l);
            }
            return Ok(());
        }
        self.check_prompt(tokens)?;
        for chunk in tokens.chunks(BatchScratch::tokens_per_batch(&self.cfg)) {
            let p0 = self.kv.len;
            self.files_intact()?;
            let mut bs = std::mem::take(&mut self.batch);
            let r = self.forward_batch_in(&mut bs, chunk, p0, BatchLogits::Each(each));
            self.batch = bs;
            r?;
            self.files_intact()?;
            self.kv.len = p0 + chunk.len();
        }
        Ok(())
    }

    /// A prompt fits the context from the current position, and every id is in the vocabulary.
    fn check_prompt(&self, tokens: &[u32]) -> Result<(), ForwardError> {
        let pos = self.kv.len;
        if pos + tokens.len() > self.cfg.max_ctx {
            return Err(ForwardError::ContextFull {
                pos: pos + tokens.len() - 1,
                max: self.cfg.max_ctx,
            });
        }
        match tokens.iter().find(|&&t| t as usize >= self.cfg.vocab) {
            Some(&id) => Err(ForwardError::BadToken {
                id,
                vocab: self.cfg.vocab,
            }),
            None => Ok(()),
        }
    }

    /// One batch of a prompt, with the engine's batch scratch (kept between batches).
    fn forward_batch(
        &mut self,
        toks: &[u32],
        pos0: usize,
        want_logits: bool,
    ) -> Result<(), ForwardError> {
        let mut bs = std::mem::take(&mut self.batch);
        let logits = if want_logits {
            BatchLogits::Last
        } else {
            BatchLogits::None
        };
        let r = self.forward_batch_in(&mut bs, toks, pos0, logits);
        self.batch = bs;
        r
    }

    fn forward_batch_in(
        &mut self,
        bs: &mut BatchScratch,
        toks: &[u32],
        pos0: usize,
        logits: BatchLogits,
    ) -> Result<(), ForwardError> {
        let t_start = Instant::now();
        let ctx = Weights {
            file: &self.file,
            cfg: &self.cfg,
            pool: &self.pool,
            isa: self.opts.isa,
            q8: use_q8(self.opts.int_act, self.opts.force_int, self.opts.isa),
            rowmajor: None,
            oracle: false,
        };
        let cfg = ctx.cfg;
        let n = toks.len();
        let (d, qd, kvd, ff) = (cfg.d_model, cfg.q_dim(), cfg.kv_dim(), cfg.d_ff);
        let bytes = ctx.file.bytes();
        // Batched matvecs have integer kernels on every ISA but scalar.
        let use_q8 = self.opts.int_act && ctx.isa != Isa::Scalar;
        bs.resize(cfg, n);
        for (b, &t) in toks.iter().enumerate() {
            let xb = &mut bs.x[b * d..(b + 1) * d];
            embed_input(ctx.file, cfg, t, xb);
        }
        check(&bs.x, None, 0, Phase::Embedding, pos0).map_err(|e| at_row(e, d))?;

        // The end of layer l's attention or FFN phase: x += post-norm(o) on the pool, then the
        // phase's non-finite check of its normed input, its inner buffer (the attention's heads
        // or the gated hidden) and the residual; `check` names the first bad value.
        let end_phase = |bs: &mut BatchScratch, l: usize, phase: Phase, post: Option<&[f32]>| {
            let (x, o) = (&mut bs.x[..n * d], &mut bs.o[..n * d]);
            residual(ctx.pool, x, o, d, post, cfg.rms_eps);
            let (mid, w) = match phase {
                Phase::Attention => (&bs.att, qd),
                _ => (&bs.g, ff),
            };
            if finite(ctx.pool, &[&bs.xb, mid, &bs.x]) {
                return Ok(());
            }
            for (v, w) in [(&bs.xb, d), (mid, w), (&bs.x, d)] {
                check(v, Some(l), l, phase, pos0).map_err(|e| at_row(e, w))?;
            }
            Ok::<(), NonFinite>(())
        };
        let mut stats = TokenStats {
            pos: pos0 as u32,
            layers: vec![LayerStat::default(); cfg.n_layers],
            ..Default::default()
        };
        for l in 0..cfg.n_layers {
            between_layers(&self.stop, ctx.file)?;
            let lv = &ctx.file.layers[l];
            let t0 = Instant::now();
            let x = &bs.x;
            per_row(ctx.pool, &mut bs.xb[..n * d], d, &|b, xb| {
                rmsnorm(xb, &x[b * d..(b + 1) * d], Some(&lv.attn_norm), cfg.rms_eps)
            });
            let qkv = [&lv.q, &lv.k, &lv.v];
            let q8 = quantize_rows(ctx.pool, use_q8, &bs.xb, d, &qkv, &mut bs.xq);
            tiled_matvec_batch(
                ctx.pool,
                ctx.isa,
                bytes,
                &mut [
                    (qkv[0], &mut bs.q),
                    (qkv[1], &mut bs.k),
                    (qkv[2], &mut bs.v),
                ],
                &bs.xb,
                q8.then(|| &bs.xq[..n]),
                n,
            );
            for b in 0..n {
                let pos = pos0 + b;
                let (qb, kb, vb) = (
                    &mut bs.q[b * qd..(b + 1) * qd],
                    &mut bs.k[b * kvd..(b + 1) * kvd],
                    &mut bs.v[b * kvd..(b + 1) * kvd],
                );
                qkv_post(&ctx, lv, l, pos, &mut bs.rope, [qb, kb, vb]);
                self.kv.store(l, pos, kb, vb);
            }
            attend_batch(&ctx, l, l, pos0..pos0 + n, &self.kv, &bs.q, &mut bs.att);
            let q8 = quantize_rows(ctx.pool, use_q8, &bs.att, qd, &[&lv.o], &mut bs.xq);
            tiled_matvec_batch(
                ctx.pool,
                ctx.isa,
                bytes,
                &mut [(&lv.o, &mut bs.o)],
                &bs.att,
                q8.then(|| &bs.xq[..n]),
                n,
            );
            end_phase(bs, l, Phase::Attention, lv.post_attn_norm.as_deref())?;
            let st = &mut stats.layers[l];
            st.bytes.attn = attn_bytes(lv);
            st.ns_attn = t0.elapsed().as_nanos() as u64;
            let t1 = Instant::now();
            let (gm, um, dm) = (
                lv.gate.as_ref().expect("dense"),
                lv.up.as_ref().expect("dense"),
                lv.down.as_ref().expect("dense"),
            );
            let x = &bs.x;
            per_row(ctx.pool, &mut bs.xb[..n * d], d, &|b, xb| {
                rmsnorm(
                    xb,
                    &x[b * d..(b + 1) * d],
                    lv.ffn_norm.as_deref(),
                    cfg.rms_eps,
                )
            });
            let q8 = quantize_rows(ctx.pool, use_q8, &bs.xb, d, &[gm, um], &mut bs.xq);
            tiled_matvec_batch(
                ctx.pool,
                ctx.isa,
                bytes,
                &mut [(gm, &mut bs.g), (um, &mut bs.u)],
                &bs.xb,
                q8.then(|| &bs.xq[..n]),
                n,
            );
            let mut rows: Vec<&mut [f32]> = bs.g[..n * ff].chunks_exact_mut(ff).collect();
            let u = &bs.u;
            ctx.pool.for_each_mut(&mut rows, &|b, g| {
                gated(ctx.isa, cfg.meta.ffn_act, g, &u[b * ff..(b + 1) * ff])
            });
            let q8 = quantize_rows(ctx.pool, use_q8, &bs.g, ff, &[dm], &mut bs.xq);
            tiled_matvec_batch(
                ctx.pool,
                ctx.isa,
                bytes,
                &mut [(dm, &mut bs.o)],
                &bs.g,
                q8.then(|| &bs.xq[..n]),
                n,
            );
            end_phase(bs, l, Phase::FeedForward, lv.post_ffn_norm.as_deref())?;
            st.bytes.dense = dense_bytes(lv);
            st.ns_dense = t1.elapsed().as_nanos() as u64;
        }
        let s = &mut self.s;
        let t4 = Instant::now();
        let rows = match logits {
            BatchLogits::None => n..n,
            BatchLogits::Last => n - 1..n,
            BatchLogits::Each(_) => 0..n,
        };
        let mut each = match logits {
            BatchLogits::Each(f) => Some(f),
            _ => None,
        };
        for b in rows.clone() {
            s.x.copy_from_slice(&bs.x[b * d..(b + 1) * d]);
            stats.lm_head_bytes += lm_head(&ctx, s);
            check(&s.xb, None, 0, Phase::Logits, pos0 + b)?;
            check(&s.logits, None, 0, Phase::Logits, pos0 + b)?;
            if let Some(f) = each.as_mut() {
                f(&s.logits);
            }
        }
        if rows.is_empty() {
            s.x.copy_from_slice(&bs.x[(n - 1) * d..n * d]);
        } else {
            stats.ns_lm_head = t4.elapsed().as_nanos() as u64;
        }
        stats.ns_total = t_start.elapsed().as_nanos() as u64;
        self.stats = stats;
        Ok(())
    }
}

/// `f(b, row b)` for every `width`-wide row of `rows`, spread over the pool. The batch's
/// per-token steps (norms, the residual add, the checks) ran on the engine thread alone while
/// the other threads waited: at 2 threads ~5 % of a SmolLM2 prefill.
fn per_row(
    pool: &ThreadPool,
    rows: &mut [f32],
    width: usize,
    f: &(dyn Fn(usize, &mut [f32]) + Sync),
) {
    let per = part_len(pool, rows.len(), width);
    let mut parts: Vec<&mut [f32]> = rows.chunks_mut(per).collect();
    pool.for_each_mut(&mut parts, &|p, part| {
        for (i, row) in part.chunks_exact_mut(width).enumerate() {
            f(p * per / width + i, row);
        }
    });
}

/// Floats per pool task when `len` floats of `width`-wide rows are split over the threads: one
/// contiguous range of whole rows per thread (a task per row cost more in claims than the
/// rows' work).
fn part_len(pool: &ThreadPool, len: usize, width: usize) -> usize {
    (len / width).div_ceil(pool.threads()).max(1) * width
}

/// `x += o` row by row, with `o` first normalized in place by `post` (Gemma 3's post-norms)
/// when given; on the pool.
fn residual(
    pool: &ThreadPool,
    x: &mut [f32],
    o: &mut [f32],
    width: usize,
    post: Option<&[f32]>,
    eps: f32,
) {
    let per = part_len(pool, x.len(), width);
    let mut parts: Vec<(&mut [f32], &mut [f32])> =
        x.chunks_mut(per).zip(o.chunks_mut(per)).collect();
    pool.for_each_mut(&mut parts, &|_, (x, o)| {
        if let Some(w) = post {
            for row in o.chunks_exact_mut(width) {
                rmsnorm_in_place(row, Some(w), eps);
            }
        }
        add_into(x, o);
    });
}

/// Whether every value of every buffer is finite, each buffer checked in one part per thread.
/// Only when this fails do the callers run [`check`], which names the first non-finite value.
fn finite(pool: &ThreadPool, bufs: &[&[f32]]) -> bool {
    let parts = pool.threads();
    let ok = std::sync::atomic::AtomicBool::new(true);
    pool.run(parts, &|p| {
        for v in bufs {
            let (a, b) = (p * v.len() / parts, (p + 1) * v.len() / parts);
            if !super::finite::all_finite(&v[a..b]) {
                ok.store(false, Ordering::Relaxed);
            }
        }
    });
    ok.load(Ordering::Relaxed)
}

/// A [`NonFinite`] found in a batch buffer of `d`-wide rows: its position is the row's.
fn at_row(mut e: NonFinite, d: usize) -> NonFinite {
    e.pos += e.index / d;
    e.index %= d;
    e
}

/// Quantizes each `width`-wide row of `xs` into `out[row]` (grown as needed, buffers reused)
/// when the batched kernels take Q8 input (`use_q8`, `width` a multiple of 32), in the forms
/// `mats` read ([`Q8Act::quantize_for`]). Returns whether it did.
fn quantize_rows(
    pool: &ThreadPool,
    use_q8: bool,
    xs: &[f32],
    width: usize,
    mats: &[&Matrix],
    out: &mut Vec<Q8Act>,
) -> bool {
    if !use_q8 || !width.is_multiple_of(32) {
        return false;
    }
    let n = xs.len() / width;
    if out.len() < n {
        out.resize_with(n, Q8Act::default);
    }
    // One token per task: each row's quantization is the same on any thread.
    pool.for_each_mut(&mut out[..n], &|b, q| {
        q.quantize_for(
            &xs[b * width..(b + 1) * width],
            mats.iter().map(|m| m.quant),
        )
    });
    true
}

/// Which logits a batch computes: none (a prompt's inner batches), the last token's (the
/// prompt's last batch), or every token's, each handed to the callback in order
/// ([`Engine::prefill_each`]).
enum BatchLogits<'a> {
    None,
    Last,
    Each(&'a mut dyn FnMut(&[f32])),
}
