//! The non-finite guard of the forward pass: after the embedding, after each layer's attention,
//! after each layer's feed-forward (dense FFN, experts and the combine into the residual) and
//! on the logits, the values are checked for NaN/±Inf. The first one found stops the token with
//! [`NonFinite`], naming the layer and the phase where it appeared (so a poisoned block scale, a
//! NaN norm weight or a degenerate RoPE base is reported instead of silently producing NaN
//! logits). The check is an integer max over the bit patterns (vectorized): a few vector
//! instructions per `d_model` floats, far below the matvecs it follows.

use std::fmt;

/// Where in the forward pass a value was checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// The token embedding (layer: none).
    Embedding,
    /// The attention output of a layer (norm, Q/K/V, RoPE, attention, output projection).
    Attention,
    /// The residual after a layer's feed-forward: dense FFN, routed/shared experts, combine.
    FeedForward,
    /// The logits (final norm and LM head; layer: none).
    Logits,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Phase::Embedding => "embedding",
            Phase::Attention => "attention",
            Phase::FeedForward => "feed-forward (FFN/experts + residual)",
            Phase::Logits => "final norm + LM head (logits)",
        })
    }
}

/// The first non-finite value of a forward pass.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("non-finite value {value} first appeared in {} at position {pos} (element {index}): the model's weights or metadata produce NaN/Inf (check block scales, norm weights, rope base)", self.location())]
pub struct NonFinite {
    /// Physical layer (block) where it appeared; `None` for the embedding and the logits.
    pub layer: Option<usize>,
    /// Execution step when it differs from `layer` (FixedPoint iterations).
    pub step: Option<usize>,
    pub phase: Phase,
    /// Token position.
    pub pos: usize,
    /// Index of the first non-finite element (for batches: within the whole batch buffer).
    pub index: usize,
    pub value: f32,
}

impl NonFinite {
    fn location(&self) -> String {
        match (self.layer, self.step) {
            (Some(l), Some(s)) => format!("layer {l} (execution step {s}), {}", self.phase),
            (Some(l), None) => format!("layer {l}, {}", self.phase),
            _ => format!("the {}", self.phase),
        }
    }
}

/// Whether every value of `v` is finite: an integer max over the bit patterns, vectorized
/// ([`crate::kernels::vec::all_finite`]).
#[inline]
pub fn all_finite(v: &[f32]) -> bool {
    crate::kernels::vec::all_finite(v)
}

/// `Err` naming `layer`/`phase` when `v` holds a NaN or ±Inf. `l` is the execution step,
/// `layer` the physical block it runs.
pub fn check(
    v: &[f32],
    layer: Option<usize>,
    l: usize,
    phase: Phase,
    pos: usize,
) -> Result<(), NonFinite> {
    if all_finite(v) {
        return Ok(());
    }
    let index = v.iter().position(|x| !x.is_finite()).unwrap_or(0);
    Err(NonFinite {
        layer,
        step: layer.filter(|&p| p != l).map(|_| l),
        phase,
        pos,
        index,
        value: v[index],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_nan_and_both_infinities_anywhere() {
        let mut v = vec![1.0f32; 1000];
        assert!(all_finite(&v));
        assert!(all_finite(&[]));
        v[999] = f32::MAX;
        v[0] = -f32::MAX;
        assert!(all_finite(&v));
        for bad in [f32::NAN, -f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            for at in [0, 7, 500, 999] {
                let mut w = v.clone();
                w[at] = bad;
                assert!(!all_finite(&w));
                let e = check(&w, Some(3), 3, Phase::Attention, 12).unwrap_err();
                assert_eq!((e.layer, e.step, e.index, e.pos), (Some(3), None, at, 12));
            }
        }
    }

    #[test]
    fn the_message_names_layer_and_phase() {
        let e = check(&[f32::NAN], Some(2), 5, Phase::FeedForward, 0).unwrap_err();
        let s = e.to_string();
        assert!(
            s.contains("layer 2 (execution step 5), feed-forward"),
            "{s}"
        );
        let e = check(&[f32::INFINITY], None, 0, Phase::Logits, 4).unwrap_err();
        assert!(e.to_string().contains("the final norm + LM head"), "{e}");
    }
}
