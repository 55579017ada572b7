//! KV cache: per effective layer, f32 keys and values for every cached position.

/// Keys/values of all effective layers, `max_ctx` positions each.
pub struct KvCache {
    pub kv_dim: usize,
    pub max_ctx: usize,
    pub k: Vec<Vec<f32>>,
    pub v: Vec<Vec<f32>>,
    /// Number of filled positions.
    pub len: usize,
}

impl KvCache {
    /// Allocates lazily: memory grows with the positions actually used.
    pub fn new(layers: usize, kv_dim: usize, max_ctx: usize) -> KvCache {
        KvCache {
            kv_dim,
            max_ctx,
            k: vec![Vec::new(); layers],
            v: vec![Vec::new(); layers],
            len: 0,
        }
    }

    /// Bytes a full cache would take (for the resource check at open).
    pub fn full_bytes(layers: usize, kv_dim: usize, max_ctx: usize) -> u128 {
        2 * layers as u128 * kv_dim as u128 * max_ctx as u128 * 4
    }

    pub fn clear(&mut self) {
        for b in self.k.iter_mut().chain(self.v.iter_mut()) {
            b.clear();
        }
        self.len = 0;
    }

    /// Stores position `pos` of layer `l` (positions are appended in order).
    pub fn store(&mut self, l: usize, pos: usize, k: &[f32], v: &[f32]) {
        let d = self.kv_dim;
        let need = (pos + 1) * d;
        if self.k[l].len() < need {
            self.k[l].resize(need, 0.0);
            self.v[l].resize(need, 0.0);
        }
        self.k[l][pos * d..need].copy_from_slice(k);
        self.v[l][pos * d..need].copy_from_slice(v);
    }

    /// Drops every position ≥ `len` (used when truncating the context).
    pub fn truncate(&mut self, len: usize) {
        let d = self.kv_dim;
        for b in self.k.iter_mut().chain(self.v.iter_mut()) {
            b.truncate(len * d);
        }
        self.len = self.len.min(len);
    }
}
