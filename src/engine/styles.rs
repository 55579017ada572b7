//! The combine styles as data (paper §4.2–4.3; exact reading in `docs/SEMANTICS.md`). Each style
//! is one [`StyleRule`]: which residual the dense FFN and the router read, which stream the
//! experts are injected into, the scale of the FFN terms, how a layer's outputs are combined,
//! when the two streams merge, which stream is the output, and how often each block runs. The
//! decode loop reads these rules; this file is the only place that matches on `CombineStyle`.

use super::scratch::Scratch;
use crate::model::{CombineStyle, ModelConfig};

/// A residual a stream reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Src {
    /// x_in: the residual entering the layer (pre-attention).
    In,
    /// x_mid = x_in + Attn(Norm(x_in)) (post-attention).
    Mid,
    /// The second stream: `s_ffn` (eq. 4.18) or `xfm_reg_{ℓ−1}` (eq. 4.20).
    Second,
}

/// A residual stream that is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    /// `x` (s_attn / attn_reg for the two-stream styles).
    Main,
    /// `sf` (s_ffn / xfm_reg).
    Second,
}

/// How a layer's attention output a and FFN output f become the next residual.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Combine {
    /// x ← x_mid + scale · f (eq. 4.3, 4.5, 4.11, 4.13).
    Residual,
    /// s_attn += a; s_ffn += f (eq. 4.17–4.18).
    Decoupled,
    /// attn_reg ← attn_reg + a; xfm_reg ← attn_reg + f (eq. 4.19, 4.21).
    Registers,
    /// x ← x_block + a + f (eq. 4.22).
    Anchored,
}

/// One combine style, as the decode loop needs it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StyleRule {
    /// The dense FFN's input when δd = 0 (with δd ≥ 1 it reads the delayed snapshot).
    pub dense_in: Src,
    /// The router's input.
    pub route_in: Src,
    /// The stream a layer's snapshot is taken from (the one its delayed FFN reads) and the
    /// experts are injected into (eq. 4.16).
    pub stream: Stream,
    /// Scale of the dense and expert terms (1/√2 for ParallelSqrt2 with both, else 1).
    pub scale: f32,
    pub combine: Combine,
    /// Merge s_attn = s_ffn = (s_attn + s_ffn)/2 after every this many layers (0: never).
    pub merge_every: usize,
    /// The stream the LM head reads after the last layer.
    pub output: Stream,
    /// Executions of each block per token (FixedPoint: `fixed_point_iterations`, else 1).
    pub iterations: usize,
}

impl StyleRule {
    pub fn of(cfg: &ModelConfig) -> StyleRule {
        let both = cfg.has_dense() && cfg.has_experts();
        let base = StyleRule {
            dense_in: Src::Mid,
            route_in: Src::Mid,
            stream: Stream::Main,
            scale: 1.0,
            combine: Combine::Residual,
            merge_every: 0,
            output: Stream::Main,
            iterations: 1,
        };
        match cfg.combine_style {
            CombineStyle::Sequential => base,
            CombineStyle::ParallelSqrt2 => StyleRule {
                scale: if both {
                    std::f32::consts::FRAC_1_SQRT_2
                } else {
                    1.0
                },
                ..base
            },
            // Eq. 4.11 with δd = 0 reads x_in; the router reads x_mid (§4.2.3).
            CombineStyle::DelayedSum => StyleRule {
                dense_in: Src::In,
                ..base
            },
            // §4.2.3: dense FFN and router both read Norm(x_in) (eq. 4.13).
            CombineStyle::AsyncExperts => StyleRule {
                dense_in: Src::In,
                route_in: Src::In,
                ..base
            },
            // DecoupledStreams reads s_attn at the end (docs/SEMANTICS.md).
            CombineStyle::DecoupledStreams => StyleRule {
                dense_in: Src::Second,
                route_in: Src::Second,
                stream: Stream::Second,
                combine: Combine::Decoupled,
                merge_every: cfg.meta.merge_interval.max(1) as usize,
                ..base
            },
            // Eq. 4.21: the output is xfm_reg_{L−1}, "the complete output".
            CombineStyle::PipelineRegisters => StyleRule {
                dense_in: Src::Second,
                route_in: Src::Second,
                stream: Stream::Second,
                combine: Combine::Registers,
                output: Stream::Second,
                ..base
            },
            CombineStyle::FixedPoint => StyleRule {
                combine: Combine::Anchored,
                iterations: cfg.meta.fixed_point_iterations.max(1) as usize,
                ..base
            },
        }
    }

    /// True when the style keeps a second stream (initialized to the embedding).
    pub fn two_streams(&self) -> bool {
        self.stream == Stream::Second
    }

    /// The residual `src` of the current layer.
    pub fn read<'a>(&self, s: &'a Scratch, src: Src) -> &'a [f32] {
        match src {
            Src::In => &s.x,
            Src::Mid => &s.xa,
            Src::Second => &s.sf,
        }
    }

    /// [`StyleRule::read`] of `src`, borrowed together with the dense FFN's and the experts'
    /// buffers (so the FFN reads the residual in place rather than from a copy).
    pub fn read_with_ffn<'a>(
        &self,
        s: &'a mut Scratch,
        src: Src,
    ) -> (
        &'a [f32],
        &'a mut super::scratch::DenseScratch,
        &'a mut super::scratch::ExpertScratch,
    ) {
        let (ds, es) = (&mut s.dense, &mut s.experts);
        match src {
            Src::In => (&s.x, ds, es),
            Src::Mid => (&s.xa, ds, es),
            Src::Second => (&s.sf, ds, es),
        }
    }

    /// The residual entering the layer that a delayed FFN reads (the injection stream).
    pub fn snapshot_source<'a>(&self, s: &'a Scratch) -> &'a [f32] {
        match self.stream {
            Stream::Main => &s.x,
            Stream::Second => &s.sf,
        }
    }

    /// First iteration of a block: FixedPoint fixes x_block (eq. 4.22).
    pub fn enter_block(&self, s: &mut Scratch) {
        if self.combine == Combine::Anchored {
            s.base.copy_from_slice(&s.x);
        }
    }

    /// Eq. 4.16: x^out_{ℓ+δe} += scale · e_ℓ (`s.experts.acc`), into the injection stream.
    pub fn inject(&self, s: &mut Scratch, scale: f32) {
        let dst = match self.stream {
            Stream::Main => &mut s.x,
            Stream::Second => &mut s.sf,
        };
        super::ops::add_scaled(dst, &s.experts.acc, scale);
    }

    /// After the last layer: the stream the LM head reads is moved into `s.x`.
    pub fn finish(&self, s: &mut Scratch) {
        if self.output == Stream::Second {
            std::mem::swap(&mut s.x, &mut s.sf);
        }
    }

    /// Physical block run at execution step `l`.
    pub fn block_of(&self, l: usize) -> usize {
        l / self.iterations
    }

    /// Combines the layer's attention output (`s.attn_out`, with `s.xa` = x + a) and FFN output
    /// (`s.dense.out`) into the next residual.
    pub fn combine(&self, s: &mut Scratch) {
        let f = &s.dense.out;
        match self.combine {
            Combine::Residual => {
                std::mem::swap(&mut s.x, &mut s.xa);
                super::ops::add_scaled(&mut s.x, f, self.scale);
            }
            Combine::Decoupled => {
                super::ops::add_into(&mut s.x, &s.attn_out);
                super::ops::add_into(&mut s.sf, f);
            }
            Combine::Registers => {
                std::mem::swap(&mut s.x, &mut s.xa);
                s.sf.copy_from_slice(&s.x);
                super::ops::add_into(&mut s.sf, &s.dense.out);
            }
            Combine::Anchored => {
                for (i, x) in s.x.iter_mut().enumerate() {
                    *x = s.base[i] + s.attn_out[i] + f[i];
                }
            }
        }
    }

    /// §4.3.1: after execution step `l`, every `merge_every` layers,
    /// s_attn = s_ffn = (s_attn + s_ffn)/2.
    pub fn merge(&self, s: &mut Scratch, l: usize) {
        if self.merge_every > 0 && (l + 1).is_multiple_of(self.merge_every) {
            for i in 0..s.x.len() {
                let m = (s.x[i] + s.sf[i]) * 0.5;
                s.x[i] = m;
                s.sf[i] = m;
            }
        }
    }
}

/// One execution of a block: step `l` of the token (the KV-cache layer) runs physical block
/// `block`; `first` marks the first iteration of the block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    pub l: usize,
    pub block: usize,
    pub first: bool,
}

/// The execution steps of one token: each block `iterations` times in a row (FixedPoint,
/// eq. 4.22), else each block once.
pub fn steps(cfg: &ModelConfig) -> impl Iterator<Item = Step> {
    let it = StyleRule::of(cfg).iterations;
    (0..cfg.n_layers).flat_map(move |block| {
        (0..it).map(move |i| Step {
            l: block * it + i,
            block,
            first: i == 0,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::generate::GenSpec;

    #[test]
    fn fixed_point_repeats_each_block_and_others_run_once() {
        for (arch, it) in [("arch5", 2usize), ("arch2_4_combined", 1)] {
            let mut cfg = GenSpec::new(arch).config().unwrap();
            if it > 1 {
                cfg.meta.fixed_point_iterations = it as u32;
            }
            let s: Vec<Step> = steps(&cfg).collect();
            assert_eq!(s.len(), cfg.effective_layers());
            for (i, st) in s.iter().enumerate() {
                assert_eq!(st.l, i);
                assert_eq!(st.block, i / it);
                assert_eq!(st.first, i % it == 0);
            }
        }
    }
}
