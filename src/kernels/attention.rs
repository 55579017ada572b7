//! Multi-head attention of one query over a KV cache, parallel over heads on the thread pool
//! (the per-head work is independent; each task writes only its head's output slice).

use super::pool::ThreadPool;

/// Dot product with 8 independent accumulators (lets the compiler vectorize the reduction).
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

/// Geometry of one attention call.
pub struct AttnShape {
    pub n_heads: usize,
    pub group: usize,
    pub head_dim: usize,
    pub kv_dim: usize,
    /// First cached position attended to (sliding window) and the query's position.
    pub start: usize,
    pub pos: usize,
    pub scale: f32,
    /// Attention logit softcap (0 = off).
    pub cap: f32,
}

#[derive(Clone, Copy)]
struct Ptr(*mut f32);
// SAFETY: each task writes only the disjoint range of its own head (see `attend`).
unsafe impl Send for Ptr {}
// SAFETY: as above.
unsafe impl Sync for Ptr {}

/// `att[h] = softmax(q_h · K_{kv(h)} · scale) · V_{kv(h)}` for every head, over cached positions
/// `start..=pos` of `kc`/`vc` (row-major `[position][kv_dim]`).
pub fn attend(
    pool: &ThreadPool,
    sh: &AttnShape,
    q: &[f32],
    kc: &[f32],
    vc: &[f32],
    att: &mut [f32],
) {
    let hd = sh.head_dim;
    let n = sh.pos + 1 - sh.start;
    assert!(q.len() >= sh.n_heads * hd && att.len() >= sh.n_heads * hd);
    assert!(kc.len() >= (sh.pos + 1) * sh.kv_dim && vc.len() >= (sh.pos + 1) * sh.kv_dim);
    let out = Ptr(att.as_mut_ptr());
    let head = |h: usize, scores: &mut Vec<f32>| {
        let kh = h / sh.group;
        let qh = &q[h * hd..(h + 1) * hd];
        scores.clear();
        let mut m = f32::NEG_INFINITY;
        for t in sh.start..=sh.pos {
            let kt = &kc[t * sh.kv_dim + kh * hd..t * sh.kv_dim + (kh + 1) * hd];
            let mut s = dot(qh, kt) * sh.scale;
            if sh.cap > 0.0 {
                s = sh.cap * (s / sh.cap).tanh();
            }
            m = m.max(s);
            scores.push(s);
        }
        let mut sum = 0f32;
        for s in scores.iter_mut() {
            *s = (*s - m).exp();
            sum += *s;
        }
        let inv = 1.0 / sum;
        let o = out;
        // SAFETY: head h owns att[h·hd .. (h+1)·hd], inside `att` (asserted above); heads are
        // distinct tasks.
        let oh = unsafe { std::slice::from_raw_parts_mut(o.0.add(h * hd), hd) };
        oh.fill(0.0);
        for (i, t) in (sh.start..=sh.pos).enumerate() {
            let vt = &vc[t * sh.kv_dim + kh * hd..t * sh.kv_dim + (kh + 1) * hd];
            let w = scores[i] * inv;
            for j in 0..hd {
                oh[j] += w * vt[j];
            }
        }
    };
    // Below ~16k multiply-adds the pool's hand-off costs more than it saves.
    if pool.threads() > 1 && n * sh.n_heads * hd >= 16 * 1024 {
        pool.run(sh.n_heads, &|h| {
            let mut scores = Vec::with_capacity(n);
            head(h, &mut scores);
        });
    } else {
        let mut scores = Vec::with_capacity(n);
        for h in 0..sh.n_heads {
            head(h, &mut scores);
        }
    }
}
