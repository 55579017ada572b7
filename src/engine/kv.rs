//! KV cache: per effective layer, the keys and values of every cached position, stored as f32, as
//! f16 (llama.cpp's default KV type; half the bytes each attention step reads) or as bf16 (the
//! same bytes, fewer mantissa bits; decode's `vdpbf16ps` kernel reads it on CPUs with
//! AVX512-BF16: `kernels::attention_bf16`). The element type is fixed when the cache is made
//! ([`KvType`]); storing rounds to it, attention reads it.
//!
//! A sliding-window layer ([`KvCache::with_windows`]) keeps only its window's positions and a
//! margin: when its buffer of `window + WINDOW_SLACK + WINDOW_RUN` rows is full, the newest
//! `window + WINDOW_SLACK` rows move to the front and the layer's first kept position (`base`)
//! advances. A reader addresses position `t` at row `t − base` ([`KvLayer::base`]). Gemma 3's
//! 15 local layers then hold 832 positions each instead of the whole context (at 4,096
//! positions, 12.8 MB of f16 rows instead of 63 MB).

use crate::kernels::kv_elem::KvElem;
use half::{bf16, f16};

/// What a cached value is stored as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvType {
    F32,
    F16,
    Bf16,
}

impl KvType {
    /// Bytes per cached value.
    pub fn bytes(self) -> usize {
        match self {
            KvType::F32 => <f32 as KvElem>::BYTES,
            KvType::F16 => <f16 as KvElem>::BYTES,
            KvType::Bf16 => <bf16 as KvElem>::BYTES,
        }
    }

    /// The name `run --json`, `bench --json` and the trace report (`kv`).
    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => <f32 as KvElem>::NAME,
            KvType::F16 => <f16 as KvElem>::NAME,
            KvType::Bf16 => <bf16 as KvElem>::NAME,
        }
    }
}

/// The rows of every layer in one element type.
#[derive(Clone, Debug)]
enum Rows {
    F32 {
        k: Vec<Vec<f32>>,
        v: Vec<Vec<f32>>,
    },
    F16 {
        k: Vec<Vec<f16>>,
        v: Vec<Vec<f16>>,
    },
    Bf16 {
        k: Vec<Vec<bf16>>,
        v: Vec<Vec<bf16>>,
    },
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
        base: usize,
    },
    F16 {
        k: &'a [f16],
        v: &'a [f16],
        cap: usize,
        base: usize,
    },
    Bf16 {
        k: &'a [bf16],
        v: &'a [bf16],
        cap: usize,
        base: usize,
    },
}

impl KvLayer<'_> {
    /// Positions each KV head's block holds (the distance between heads, in rows).
    pub fn cap(&self) -> usize {
        match *self {
            KvLayer::F32 { cap, .. } | KvLayer::F16 { cap, .. } | KvLayer::Bf16 { cap, .. } => cap,
        }
    }

    /// The position held in row 0 (0 unless a sliding-window layer has moved on).
    pub fn base(&self) -> usize {
        match *self {
            KvLayer::F32 { base, .. } | KvLayer::F16 { base, .. } | KvLayer::Bf16 { base, .. } => {
                base
            }
        }
    }
}

/// Positions a sliding-window layer keeps beyond its window: a prefill batch (32 positions)
/// and a short rollback of the context ([`KvCache::truncate`]).
pub const WINDOW_SLACK: usize = 64;
/// Positions a sliding-window layer stores between two moves of its rows to the front.
const WINDOW_RUN: usize = 256;

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
    /// Per layer: its sliding window (0: it attends to every position).
    window: Vec<usize>,
    /// Per layer: the position held in row 0.
    base: Vec<usize>,
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
            KvType::Bf16 => Rows::Bf16 {
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
            window: vec![0; layers],
            base: vec![0; layers],
            len: 0,
        }
    }

    /// The same cache with layer `l` limited to its last `windows[l]` positions (0: all), as
    /// the model's sliding windows say. Only for a cache that holds nothing yet.
    pub fn with_windows(mut self, windows: Vec<usize>) -> KvCache {
        assert_eq!(windows.len(), self.cap.len(), "one window per layer");
        assert!(
            self.cap.iter().all(|&c| c == 0),
            "the cache holds positions"
        );
        self.window = windows;
        self
    }

    /// Rows a layer's buffer holds at most: the context, or a window layer's ring.
    fn rows_limit(&self, l: usize) -> Option<usize> {
        let w = self.window[l];
        (w > 0 && w + WINDOW_SLACK + WINDOW_RUN < self.max_ctx)
            .then_some(w + WINDOW_SLACK + WINDOW_RUN)
    }

    /// The element type of the cache.
    pub fn ty(&self) -> KvType {
        match self.rows {
            Rows::F32 { .. } => KvType::F32,
            Rows::F16 { .. } => KvType::F16,
            Rows::Bf16 { .. } => KvType::Bf16,
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
        let (cap, base) = (self.cap[l], self.base[l]);
        match &self.rows {
            Rows::F32 { k, v } => KvLayer::F32 {
                k: &k[l],
                v: &v[l],
                cap,
                base,
            },
            Rows::F16 { k, v } => KvLayer::F16 {
                k: &k[l],
                v: &v[l],
                cap,
                base,
            },
            Rows::Bf16 { k, v } => KvLayer::Bf16 {
                k: &k[l],
                v: &v[l],
                cap,
                base,
            },
        }
    }

    /// Stores position `pos` of layer `l` (`k` and `v` hold all KV heads, `kv_dim` values),
    /// rounded to the cache's element type.
    pub fn store(&mut self, l: usize, pos: usize, k: &[f32], v: &[f32]) {
        let (hd, heads) = (self.head_dim, self.kv_dim / self.head_dim);
        let ring = self.rows_limit(l);
        let base = self.base[l];
        assert!(
            pos >= base,
            "layer {l}: position {pos} is before its first kept, {base}"
        );
        if let Some(ring) = ring.filter(|&r| pos - base >= r) {
            // Full: the newest window + slack rows before `pos` move to the front.
            let from = pos - (ring - WINDOW_RUN);
            let (cap, n) = (self.cap[l], pos - from);
            match &mut self.rows {
                Rows::F32 { k: kc, v: vc } => {
                    to_front(&mut kc[l], hd, heads, cap, from - base, n);
                    to_front(&mut vc[l], hd, heads, cap, from - base, n);
                }
                Rows::F16 { k: kc, v: vc } => {
                    to_front(&mut kc[l], hd, heads, cap, from - base, n);
                    to_front(&mut vc[l], hd, heads, cap, from - base, n);
                }
                Rows::Bf16 { k: kc, v: vc } => {
                    to_front(&mut kc[l], hd, heads, cap, from - base, n);
                    to_front(&mut vc[l], hd, heads, cap, from - base, n);
                }
            }
            self.base[l] = from;
        }
        let row = pos - self.base[l];
        let limit = ring.unwrap_or(self.max_ctx).max(row + 1);
        let cap = &mut self.cap[l];
        let old = *cap;
        if row >= old {
            *cap = (row + 1).max(2 * old).max(64).min(limit);
        }
        let cap = *cap;
        match &mut self.rows {
            Rows::F32 { k: kc, v: vc } => {
                put(&mut kc[l], hd, heads, old, cap, row, k);
                put(&mut vc[l], hd, heads, old, cap, row, v);
            }
            Rows::F16 { k: kc, v: vc } => {
                put(&mut kc[l], hd, heads, old, cap, row, k);
                put(&mut vc[l], hd, heads, old, cap, row, v);
            }
            Rows::Bf16 { k: kc, v: vc } => {
                put(&mut kc[l], hd, heads, old, cap, row, k);
                put(&mut vc[l], hd, heads, old, cap, row, v);
            }
        }
    }

    /// Drops every position ≥ `len` (used when truncating the context); the buffers keep their
    /// size, and later positions overwrite the dropped rows. Returns the positions kept: `len`
    /// (at most [`KvCache::len`]), or 0 when a sliding-window layer no longer holds the window
    /// of position `len` (a rollback past its slack), and then the whole context must be fed
    /// again.
    pub fn truncate(&mut self, len: usize) -> usize {
        let mut len = self.len.min(len);
        let lost = |(&w, &b): (&usize, &usize)| b > 0 && len + 1 < b + w;
        if self.window.iter().zip(&self.base).any(lost) {
            len = 0;
        }
        if len == 0 {
            self.base.iter_mut().for_each(|b| *b = 0);
        }
        self.len = len;
        len
    }
}

/// Rows `from .. from + n` of every KV head of `buf` (blocks of `cap` rows of `hd`) move to rows
/// `0 .. n`.
fn to_front<T: KvElem>(buf: &mut [T], hd: usize, heads: usize, cap: usize, from: usize, n: usize) {
    for h in 0..heads {
        let b = h * cap * hd;
        buf.copy_within(b + from * hd..b + (from + n) * hd, b);
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
        let KvLayer::F32 { k, v, cap, .. } = c.layer(0) else {
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
        for ty in [KvType::F32, KvType::F16, KvType::Bf16] {
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
                    KvLayer::Bf16 { k, v, .. } => (
                        k[pos * 3..][..3].iter().map(|x| x.to_f32()).collect(),
                        v[pos * 3..][..3].iter().map(|x| x.to_f32()).collect(),
                    ),
                }
            };
            let round = |x: &[f32]| -> Vec<f32> {
                match ty {
                    KvType::F32 => x.to_vec(),
                    KvType::F16 => x.iter().map(|&x| f16::from_f32(x).to_f32()).collect(),
                    KvType::Bf16 => x.iter().map(|&x| bf16::from_f32(x).to_f32()).collect(),
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

    /// Keys of position `t`, head `h`, as a windowed layer addresses them (`t − base`).
    fn key_at(c: &KvCache, l: usize, t: usize, h: usize) -> Vec<f32> {
        let (hd, lay) = (c.head_dim, c.layer(l));
        let row = t - lay.base();
        let KvLayer::F32 { k, cap, .. } = lay else {
            panic!("f32")
        };
        k[(h * cap + row) * hd..][..hd].to_vec()
    }

    /// A window layer keeps, at every step, every position its window and a prefill batch
    /// need, at row `t − base`, equal to a full layer's row `t`; it never holds more than its
    /// ring; the full layer beside it is untouched.
    #[test]
    fn a_window_layer_keeps_its_window_in_a_bounded_ring() {
        let (hd, heads, w) = (2, 2, 16);
        let ring = w + WINDOW_SLACK + WINDOW_RUN;
        let mut c = KvCache::new(2, hd * heads, hd, 4096, KvType::F32).with_windows(vec![w, 0]);
        let x = |t: usize| -> Vec<f32> { (0..hd * heads).map(|i| (t * 10 + i) as f32).collect() };
        for pos in 0..2000 {
            c.store(0, pos, &x(pos), &x(pos));
            c.store(1, pos, &x(pos), &x(pos));
            c.len = pos + 1;
            assert!(c.layer(0).cap() <= ring);
            // The window of the newest position and a batch of 32 before it.
            for t in pos.saturating_sub(w + 32)..=pos {
                for h in 0..heads {
                    assert_eq!(key_at(&c, 0, t, h), x(t)[h * hd..][..hd], "pos {pos} t {t}");
                    assert_eq!(key_at(&c, 1, t, h), x(t)[h * hd..][..hd]);
                }
            }
        }
        assert!(c.layer(0).base() > 0);
        assert_eq!(c.layer(1).base(), 0);
        // A rollback inside the slack keeps the context; past it, the context restarts.
        let base = c.layer(0).base();
        let kept = base + w;
        assert_eq!(c.truncate(kept), kept);
        assert_eq!(c.truncate(kept - 2), 0);
        assert_eq!((c.len, c.layer(0).base()), (0, 0));
        c.store(0, 0, &x(7), &x(7));
        assert_eq!(key_at(&c, 0, 0, 1), x(7)[hd..][..hd]);
    }

    /// A window larger than the context never moves its rows.
    #[test]
    fn a_window_wider_than_the_context_is_a_full_layer() {
        let mut c = KvCache::new(1, 2, 2, 100, KvType::F16).with_windows(vec![64]);
        for pos in 0..100 {
            c.store(0, pos, &[1.0, 2.0], &[3.0, 4.0]);
        }
        assert_eq!((c.layer(0).base(), c.layer(0).cap()), (0, 100));
    }
}
