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

/// One layer's cached keys and values, row-major `[position][kv_dim]`, as stored.
#[derive(Clone, Copy, Debug)]
pub enum KvLayer<'a> {
    F32 { k: &'a [f32], v: &'a [f32] },
    F16 { k: &'a [f16], v: &'a [f16] },
}

/// Keys/values of all effective layers, `max_ctx` positions each.
#[derive(Clone, Debug)]
pub struct KvCache {
    pub kv_dim: usize,
    pub max_ctx: usize,
    rows: Rows,
    /// Number of filled positions.
    pub len: usize,
}

impl KvCache {
    /// Allocates lazily: memory grows with the positions actually used.
    pub fn new(layers: usize, kv_dim: usize, max_ctx: usize, ty: KvType) -> KvCache {
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
            max_ctx,
            rows,
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
        match &self.rows {
            Rows::F32 { k, v } => KvLayer::F32 { k: &k[l], v: &v[l] },
            Rows::F16 { k, v } => KvLayer::F16 { k: &k[l], v: &v[l] },
        }
    }

    /// Stores position `pos` of layer `l` (positions are appended in order), rounded to the
    /// cache's element type.
    pub fn store(&mut self, l: usize, pos: usize, k: &[f32], v: &[f32]) {
        match &mut self.rows {
            Rows::F32 { k: kc, v: vc } => {
                put(&mut kc[l], self.kv_dim, pos, k);
                put(&mut vc[l], self.kv_dim, pos, v);
            }
            Rows::F16 { k: kc, v: vc } => {
                put(&mut kc[l], self.kv_dim, pos, k);
                put(&mut vc[l], self.kv_dim, pos, v);
            }
        }
    }

    /// Drops every position ≥ `len` (used when truncating the context).
    pub fn truncate(&mut self, len: usize) {
        let n = len * self.kv_dim;
        match &mut self.rows {
            Rows::F32 { k, v } => k.iter_mut().chain(v).for_each(|b| b.truncate(n)),
            Rows::F16 { k, v } => k.iter_mut().chain(v).for_each(|b| b.truncate(n)),
        }
        self.len = self.len.min(len);
    }
}

/// Row `pos` of `buf` (rows of `d`) ← `x` converted, growing `buf` to hold it.
fn put<T: KvElem>(buf: &mut Vec<T>, d: usize, pos: usize, x: &[f32]) {
    let need = (pos + 1) * d;
    if buf.len() < need {
        buf.resize(need, T::default());
    }
    T::store(&mut buf[pos * d..need], x);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An f16 cache stores each value rounded to nearest-even; an f32 cache stores it as is;
    /// truncation keeps the earlier rows.
    #[test]
    fn store_rounds_to_the_element_type_and_truncate_keeps_earlier_rows() {
        let (k, v) = ([0.1f32, -2.5, 1.0 + 1.0 / 2048.0], [3.0f32, 1e-3, -0.7]);
        for ty in [KvType::F32, KvType::F16] {
            let mut c = KvCache::new(2, 3, 8, ty);
            c.store(1, 0, &k, &v);
            c.store(1, 1, &v, &k);
            let row = |c: &KvCache, pos: usize| -> (Vec<f32>, Vec<f32>) {
                match c.layer(1) {
                    KvLayer::F32 { k, v } => {
                        (k[pos * 3..][..3].to_vec(), v[pos * 3..][..3].to_vec())
                    }
                    KvLayer::F16 { k, v } => (
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
            c.truncate(1);
            assert_eq!(row(&c, 0), (round(&k), round(&v)), "{ty:?}");
            match c.layer(1) {
                KvLayer::F32 { k, .. } => assert_eq!(k.len(), 3),
                KvLayer::F16 { k, .. } => assert_eq!(k.len(), 3),
            }
            assert_eq!(c.ty(), ty);
        }
        assert_eq!(
            KvCache::full_bytes(2, 3, 8, KvType::F16) * 2,
            KvCache::full_bytes(2, 3, 8, KvType::F32)
        );
    }
}
