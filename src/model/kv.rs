//! KV cache: per effective layer, the keys and values of every cached position, stored as f32 or
//! as f16 (llama.cpp's default KV type; half the bytes each attention step reads). The element
//! type is fixed when the cache is made ([`KvType`]); storing rounds to it, attention reads it.

use crate::kernels::kv_elem::KvElem;
use half::f16;

/// What a cached value is stored as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvType {
    F32,
    F16,
}

impl KvType {
    /// Bytes per cached value.
    pub fn bytes(self) -> usize {
        match self {
            KvType::F32 => <f32 as KvElem>::BYTES,
            KvType::F16 => <f16 as KvElem>::BYTES,
        }
    }

    /// The name `run --json`, `bench --json` and the trace report (`kv`).
    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => <f32 as KvElem>::NAME,
            KvType::F16 => <f16 as KvElem>::NAME,
        }
    }
}

/// The rows of every layer in one element type.
#[derive(Clone, Debug)]
enum Rows {
    F32 { k: Vec<Vec<f32>>, v: Vec<Vec<f32>> },
    F16 { k: Vec<Vec<f16>>, v: Vec<Vec<f16>> },
}

/// One layer's cached keys and values, **head-major**: KV head `h`'s row at position `t`
/// starts at `(h · cap + t) · head_dim`, so one KV head's rows are one contiguous stream. (With
/// the rows position-major, `[position][kv_dim]`, a KV head read a third of every row on
/// SmolLM2; at depth 4096 that attention ran at 9 GB/s against 17 for the same bytes in one
/// stream: `examples/attn_layout_probe.rs`, docs/PERFORMANCE.md.)
#[derive(Clone, Copy, Debug)]
pub enum KvLayer<'a> {
    F32 {
        k: &'a [f32],
        v: &'a [f32],
        cap: usize,
    },
    F16 {
        k: &'a [f16],
        v: &'a [f16],
        cap: usize,
    },
}

impl KvLayer<'_> {
    /// Positions each KV head's block holds (the distance between heads, in rows).
    pub fn cap(&self) -> usize {
        match *self {
            KvLayer::F32 { cap, .. } | KvLayer::F16 { cap, .. } => cap,
        }
    }
}

/// Keys/values of all effective layers, up to `max_ctx` positions each.
#[derive(Clone, Debug)]
pub struct KvCache {
    pub kv_dim: usize,
    /// Width of one KV head (`kv_dim` is a whole number of heads).
    pub head_dim: usize,
    pub max_ctx: usize,
    rows: Rows,
    /// Positions per KV head each layer's buffers hold now (grown by doubling as positions are
    /// stored, so memory follows the positions actually used).
    cap: Vec<usize>,
    /// Number of filled positions.
    pub len: usize,
}

impl KvCache {
    /// Allocates lazily: memory grows with the positions actually used.
    pub fn new(
        layers: usize,
        kv_dim: usize,
        head_dim: usize,
        max_ctx: usize,
        ty: KvType,
    ) -> KvCache {
        assert!(
            head_dim > 0 && kv_dim.is_multiple_of(head_dim),
            "kv_dim {kv_dim} is not a whole number of heads of {head_dim}"
        );
        let rows = match ty {
            KvType::F32 => Rows::F32 {
                k: vec![Vec::new(); layers],
                v: vec![Vec::new(); layers],
            },
            KvType::F16 => Rows::F16 {
                k: vec![Vec::new(); layers],
                v: vec![Vec::new(); layers],
            },
        };
        KvCache {
            kv_dim,
            head_dim,
            max_ctx,
            rows,
            cap: vec![0; layers],
            len: 0,
        }
    }

    /// The element type of the cache.
    pub fn ty(&self) -> KvType {
        match self.rows {
            Rows::F32 { .. } => KvType::F32,
            Rows::F16 { .. } => KvType::F16,
        }
    }

    /// Bytes a full cache would take (for the resource check at open).
    pub fn full_bytes(layers: usize, kv_dim: usize, max_ctx: usize, ty: KvType) -> u128 {
        2 * layers as u128 * kv_dim as u128 * max_ctx as u128 * ty.bytes() as u128
    }

    pub fn clear(&mut self) {
        self.truncate(0);
    }

    /// Layer `l`'s cached rows.
    pub fn layer(&self, l: usize) -> KvLayer<'_> {
        let cap = self.cap[l];
        match &self.rows {
            Rows::F32 { k, v } => KvLayer::F32 {
                k: &k[l],
                v: &v[l],
                cap,
            },
            Rows::F16 { k, v } => KvLayer::F16 {
                k: &k[l],
                v: &v[l],
                cap,
            },
        }
    }

    /// Stores position `pos` of layer `l` (`k` and `v` hold all KV heads, `kv_dim` values),
    /// rounded to the cache's element type.
    pub fn store(&mut self, l: usize, pos: usize, k: &[f32], v: &[f32]) {
        let (hd, heads) = (self.head_dim, self.kv_dim / self.head_dim);
        let limit = self.max_ctx.max(pos + 1);
        let cap = &mut self.cap[l];
        let old = *cap;
        if pos >= old {
            *cap = (pos + 1).max(2 * old).max(64).min(limit);
        }
        let cap = *cap;
        match &mut self.rows {
            Rows::F32 { k: kc, v: vc } => {
                put(&mut kc[l], hd, heads, old, cap, pos, k);
                put(&mut vc[l], hd, heads, old, cap, pos, v);
            }
            Rows::F16 { k: kc, v: vc } => {
                put(&mut kc[l], hd, heads, old, cap, pos, k);
                put(&mut vc[l], hd, heads, old, cap, pos, v);
            }
        }
    }

    /// Drops every position ≥ `len` (used when truncating the context); the buffers keep their
    /// size, and later positions overwrite the dropped rows.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }
}

/// Row `pos` of every KV head of `buf` ← `x` (the heads side by side) converted. `buf` holds
/// `heads` blocks of `old` rows of `hd`; when `cap` > `old` it is re-laid out into blocks of
/// `cap` rows first (each head's rows move to its new block).
fn put<T: KvElem>(
    buf: &mut Vec<T>,
    hd: usize,
    heads: usize,
    old: usize,
    cap: usize,
    pos: usize,
    x: &[f32],
) {
    if cap != old {
        let mut grown = vec![T::default(); heads * cap * hd];
        for h in 0..heads {
            grown[h * cap * hd..][..old * hd].copy_from_slice(&buf[h * old * hd..][..old * hd]);
        }
        *buf = grown;
    }
    for h in 0..heads {
        T::store(
            &mut buf[(h * cap + pos) * hd..][..hd],
            &x[h * hd..(h + 1) * hd],
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An f16 cache stores each value rounded to nearest-even; an f32 cache stores it as is;
    /// truncation keeps the earlier rows.
    /// Head-major: each KV head's rows are one contiguous block of `cap` rows, and growing the
    /// cache (64 → 128 → 256 positions) keeps every stored row where the layout says.
    #[test]
    fn heads_are_contiguous_blocks_across_growth() {
        let (hd, heads) = (4, 3);
        let mut c = KvCache::new(1, hd * heads, hd, 1000, KvType::F32);
        let row = |pos: usize, h: usize| -> Vec<f32> {
            (0..hd).map(|d| (pos * 100 + h * 10 + d) as f32).collect()
        };
        for pos in 0..200 {
            let x: Vec<f32> = (0..heads).flat_map(|h| row(pos, h)).collect();
            c.store(0, pos, &x, &x);
        }
        let KvLayer::F32 { k, v, cap } = c.layer(0) else {
            panic!("f32")
        };
        assert_eq!(cap, 256);
        assert_eq!(k.len(), heads * cap * hd);
        for pos in 0..200 {
            for h in 0..heads {
                assert_eq!(
                    &k[(h * cap + pos) * hd..][..hd],
                    &row(pos, h)[..],
                    "{pos} {h}"
                );
                assert_eq!(&v[(h * cap + pos) * hd..][..hd], &row(pos, h)[..]);
            }
        }
    }

    #[test]
    fn store_rounds_to_the_element_type_and_truncate_keeps_earlier_rows() {
        let (k, v) = ([0.1f32, -2.5, 1.0 + 1.0 / 2048.0], [3.0f32, 1e-3, -0.7]);
        for ty in [KvType::F32, KvType::F16] {
            let mut c = KvCache::new(2, 3, 3, 8, ty);
            c.store(1, 0, &k, &v);
            c.store(1, 1, &v, &k);
            let row = |c: &KvCache, pos: usize| -> (Vec<f32>, Vec<f32>) {
                match c.layer(1) {
                    KvLayer::F32 { k, v, .. } => {
                        (k[pos * 3..][..3].to_vec(), v[pos * 3..][..3].to_vec())
                    }
                    KvLayer::F16 { k, v, .. } => (
                        k[pos * 3..][..3].iter().map(|x| x.to_f32()).collect(),
                        v[pos * 3..][..3].iter().map(|x| x.to_f32()).collect(),
                    ),
                }
            };
            let round = |x: &[f32]| -> Vec<f32> {
                match ty {
                    KvType::F32 => x.to_vec(),
                    KvType::F16 => x.iter().map(|&x| f16::from_f32(x).to_f32()).collect(),
                }
            };
            assert_eq!(row(&c, 0), (round(&k), round(&v)), "{ty:?}");
            assert_eq!(row(&c, 1), (round(&v), round(&k)), "{ty:?}");
            c.len = 2;
            c.truncate(1);
            assert_eq!(c.len, 1);
            assert_eq!(row(&c, 0), (round(&k), round(&v)), "{ty:?}");
            assert_eq!(c.ty(), ty);
        }
        assert_eq!(
            KvCache::full_bytes(2, 3, 8, KvType::F16) * 2,
            KvCache::full_bytes(2, 3, 8, KvType::F32)
        );
    }
}
