//! One layer's directory read into a [`LayerView`]: the attention matrices, the dense FFN, the
//! norm and bias vectors (each present exactly when the header's flags say), and the router
//! with its experts. Every offset is checked against the layer's region (and, in a `.vflow`,
//! the expert bank) before a view is made.

use super::directory::{group, new_matrix, read_dir_in, read_vector, walk_group, Dir};
use super::validate::V;
use super::views::{ExpertView, LayerView, Matrix};
use super::CflowFile;
use crate::format::error::FormatError;
use crate::format::header::EntryKind;
use crate::model::ModelConfig;

impl CflowFile {
    /// Reads layer `i` from the directory at `dir_off`. Its matrices and vectors must lie inside
    /// `region`; the expert table and expert regions inside `bank` when given (`.vflow`), else
    /// inside `region` (`.cflow`). The view's offset/len are the region's.
    pub(crate) fn read_layer_in(
        v: &V,
        c: &ModelConfig,
        i: usize,
        dir_off: u64,
        region: (u64, u64),
        bank: Option<(u64, u64)>,
    ) -> Result<LayerView, FormatError> {
        let what = format!("layer {i}");
        let dir = read_dir_in(v, &what, dir_off, region, bank, i as u32)?;
        let l = LayerDir {
            v,
            dir: &dir,
            what,
            li: i as u16,
            c,
        };
        let d = c.d_model;
        let [q, k, vm, o] = l.attention()?;
        let (gate, up, down) = l.dense_ffn()?;
        let attn_norm = l
            .vector(EntryKind::AttnNorm, d)?
            .ok_or_else(|| l.missing("AttnNorm entry"))?;
        let ffn_norm = l.vector(EntryKind::FfnNorm, d)?;
        let moe_norm = l.vector(EntryKind::MoeNorm, d)?;
        let q_bias = l.vector(EntryKind::QBias, c.q_dim())?;
        let k_bias = l.vector(EntryKind::KBias, c.kv_dim())?;
        let v_bias = l.vector(EntryKind::VBias, c.kv_dim())?;
        let (qn_len, kn_len) = c.qk_norm_lens();
        let (q_norm, k_norm) = l.flagged_pair(
            "Q/K norm entries",
            ("FLAG_QK_NORM", c.qk_norm()),
            (EntryKind::QNorm, "QNorm", qn_len),
            (EntryKind::KNorm, "KNorm", kn_len),
        )?;
        let (post_attn_norm, post_ffn_norm) = l.flagged_pair(
            "post-norm entries",
            ("FLAG_POST_NORMS", c.post_norms()),
            (EntryKind::PostAttnNorm, "PostAttnNorm", d),
            (EntryKind::PostFfnNorm, "PostFfnNorm", d),
        )?;
        let shared_gate = l.vector(EntryKind::SharedGate, d)?;
        if shared_gate.is_some() && gate.is_none() {
            return Err(l.unexpected(
                "a SharedGate entry only with a dense FFN (the shared expert)",
                "SharedGate without a dense FFN",
            ));
        }
        let router_bias = l.vector(EntryKind::RouterBias, c.n_experts)?;
        if router_bias.is_some() && !c.has_experts() {
            return Err(l.unexpected("no RouterBias entry (no experts)", "a RouterBias entry"));
        }
        let (router, experts) = l.experts(bank.unwrap_or(region))?;
        Ok(LayerView {
            offset: region.0,
            len: region.1,
            q,
            k,
            v: vm,
            o,
            gate,
            up,
            down,
            attn_norm,
            moe_norm_is_ffn_norm: moe_norm == ffn_norm,
            ffn_norm,
            moe_norm,
            q_bias,
            k_bias,
            v_bias,
            q_norm,
            k_norm,
            post_attn_norm,
            post_ffn_norm,
            shared_gate,
            router,
            router_bias,
            experts,
        })
    }
}

/// An optional vector entry (a norm or bias).
type Vector = Option<Vec<f32>>;

/// A dense FFN's gate, up and down (all present or all absent).
type Ffn = (Option<Matrix>, Option<Matrix>, Option<Matrix>);

/// A layer's directory, with what the reader needs to check its entries.
struct LayerDir<'a> {
    v: &'a V<'a>,
    dir: &'a Dir,
    /// "layer N", the prefix of every error.
    what: String,
    li: u16,
    c: &'a ModelConfig,
}

impl LayerDir<'_> {
    /// "`what` directory: expected `expected`, found missing".
    fn missing(&self, expected: &str) -> FormatError {
        self.unexpected(expected, "missing")
    }

    fn unexpected(&self, expected: &str, found: &str) -> FormatError {
        self.v
            .mismatch(format!("{} directory", self.what), expected, found)
    }

    fn vector(&self, k: EntryKind, n: usize) -> Result<Vector, FormatError> {
        read_vector(self.v, self.dir, k, n, &self.what)
    }

    /// The group of matrices `specs` (kind, rows, cols), when its first entry exists.
    fn group(
        &self,
        specs: &[(EntryKind, usize, usize)],
    ) -> Result<Option<Vec<Matrix>>, FormatError> {
        group(self.v, self.dir, &self.what, self.li, specs)
    }

    /// Q, K, V (one group) and O.
    fn attention(&self) -> Result<[Matrix; 4], FormatError> {
        let (c, d) = (self.c, self.c.d_model);
        let mut qkv = self
            .group(&[
                (EntryKind::Q, c.q_dim(), d),
                (EntryKind::K, c.kv_dim(), d),
                (EntryKind::V, c.kv_dim(), d),
            ])?
            .ok_or_else(|| self.missing("Q/K/V entries"))?;
        let vm = qkv.pop().expect("3");
        let km = qkv.pop().expect("3");
        let qm = qkv.pop().expect("3");
        let om = self
            .group(&[(EntryKind::O, d, c.q_dim())])?
            .ok_or_else(|| self.missing("O entry"))?
            .pop()
            .expect("1");
        Ok([qm, km, vm, om])
    }

    /// Gate and up (one group) and down when the layer has a dense FFN (`d_ff > 0`); none, and
    /// no Gate entry, otherwise.
    fn dense_ffn(&self) -> Result<Ffn, FormatError> {
        let (c, d) = (self.c, self.c.d_model);
        if !c.has_dense() {
            if self.dir.get(EntryKind::Gate).is_some() {
                return Err(self.unexpected("no dense FFN (d_ff = 0)", "a Gate entry"));
            }
            return Ok((None, None, None));
        }
        let mut gu = self
            .group(&[(EntryKind::Gate, c.d_ff, d), (EntryKind::Up, c.d_ff, d)])?
            .ok_or_else(|| self.missing("dense gate/up (d_ff > 0)"))?;
        let up = gu.pop();
        let gate = gu.pop();
        let down = self
            .group(&[(EntryKind::Down, d, c.d_ff)])?
            .ok_or_else(|| self.missing("dense down"))?
            .pop();
        Ok((gate, up, down))
    }

    /// Two vectors that the header's flag `(name, set)` requires together when set and forbids
    /// when clear (Q/K norms, post-norms); each as (kind, its name in errors, length).
    fn flagged_pair(
        &self,
        label: &str,
        (flag, set): (&str, bool),
        a: (EntryKind, &str, usize),
        b: (EntryKind, &str, usize),
    ) -> Result<(Vector, Vector), FormatError> {
        let va = self.vector(a.0, a.2)?;
        let vb = self.vector(b.0, b.2)?;
        if (va.is_some(), vb.is_some()) != (set, set) {
            return Err(self.v.mismatch(
                format!("{} {label}", self.what),
                if set {
                    format!("{} and {} ({flag} set)", a.1, b.1)
                } else {
                    format!("none ({flag} clear)")
                },
                format!("{} {}, {} {}", a.1, va.is_some(), b.1, vb.is_some()),
            ));
        }
        Ok((va, vb))
    }

    /// The router and the expert regions (which must lie, in order, inside `bank`) when the
    /// model has experts; none, and no expert table, otherwise.
    fn experts(&self, (xoff, xlen): (u64, u64)) -> Result<(Vector, Vec<ExpertView>), FormatError> {
        let (v, c, what, d) = (self.v, self.c, &self.what, self.c.d_model);
        if !c.has_experts() {
            if self.dir.get(EntryKind::ExpertTable).is_some() {
                return Err(self.unexpected("no experts (n_experts = 0)", "an expert table"));
            }
            return Ok((None, Vec::new()));
        }
        let e = self
            .dir
            .get(EntryKind::Router)
            .ok_or_else(|| self.missing("Router entry"))?;
        if e.rows as usize != c.n_experts
            || e.cols as usize != d
            || e.length != (c.n_experts * d * 4) as u64
        {
            return Err(v.mismatch(
                format!("{what} router shape"),
                format!("{}×{d}", c.n_experts),
                format!("{}×{}", { e.rows }, { e.cols }),
            ));
        }
        let router = v.f32s(
            &format!("{what} router"),
            e.offset,
            (c.n_experts * d) as u64,
        )?;
        let t = self
            .dir
            .get(EntryKind::ExpertTable)
            .ok_or_else(|| self.missing("ExpertTable entry"))?;
        if t.rows as usize != c.n_experts || t.length != (c.n_experts * 16) as u64 {
            return Err(v.mismatch(format!("{what} expert table"), c.n_experts, t.rows));
        }
        let tb = v.range(&format!("{what} expert table"), t.offset, t.length)?;
        let spec = |k: EntryKind, r: usize, cc: usize| -> Result<Matrix, FormatError> {
            let e = self
                .dir
                .get(k)
                .ok_or_else(|| self.missing(&format!("{k:?} entry")))?;
            new_matrix(v, e, k, r, cc, what)
        };
        let g0 = spec(EntryKind::ExpertGate, c.expert_ffn, d)?;
        let u0 = spec(EntryKind::ExpertUp, c.expert_ffn, d)?;
        let d0 = spec(EntryKind::ExpertDown, d, c.expert_ffn)?;
        let mut prev_end = t.offset + t.length;
        let mut experts = Vec::with_capacity(c.n_experts);
        for ei in 0..c.n_experts {
            let eo = u64::from_le_bytes(tb[ei * 16..ei * 16 + 8].try_into().expect("8"));
            let el = u64::from_le_bytes(tb[ei * 16 + 8..ei * 16 + 16].try_into().expect("8"));
            let ew = format!("{what} expert {ei}");
            let eend = eo.checked_add(el).ok_or_else(|| FormatError::Overflow {
                file: v.file.into(),
                what: ew.clone(),
            })?;
            if eo < prev_end || eend > xoff + xlen {
                return Err(FormatError::OutOfBounds {
                    file: v.file.into(),
                    what: format!(
                        "{ew} (must follow the previous expert inside [{xoff}, +{xlen}))"
                    ),
                    offset: eo,
                    len: el,
                    size: v.size(),
                });
            }
            let (mut g, mut u, mut dn) = (g0.clone(), u0.clone(), d0.clone());
            let p = walk_group(
                v,
                &ew,
                self.li,
                Some(ei as u8),
                &mut [&mut g, &mut u],
                eo,
                eend,
            )?;
            let p = walk_group(v, &ew, self.li, Some(ei as u8), &mut [&mut dn], p, eend)?;
            if p != eend {
                return Err(v.mismatch(format!("{ew} length"), el, p - eo));
            }
            prev_end = eend;
            experts.push(ExpertView {
                offset: eo,
                len: el,
                gate: g,
                up: u,
                down: dn,
            });
        }
        Ok((Some(router), experts))
    }
}
