//! The whole run's per-token history in bounded memory: buckets of `stride` consecutive tokens
//! (min / max / sum of ms, bytes and ns, and the marks that fell in them). When the buckets fill
//! [`CAP`], neighbours merge pairwise and the stride doubles, so a run of any length keeps at
//! most `CAP` buckets. The Timeline pane draws columns of `zoom` tokens from it.

/// Most buckets kept (memory bound: a few hundred KiB, cloned when the panes freeze).
pub const CAP: usize = 2048;

/// Marks in a bucket.
pub const MARK_PREFILL: u8 = 1;
pub const MARK_TOGGLE: u8 = 2;

/// Consecutive tokens summarised.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Bucket {
    /// Sequence number of the first token.
    pub first: u64,
    /// Tokens in it.
    pub n: u64,
    pub ms_min: f64,
    pub ms_max: f64,
    pub ms_sum: f64,
    /// Bytes read (as stored, KV included when known) and measured ns, summed.
    pub bytes: u64,
    pub ns: u64,
    /// Highest and lowest per-token GB/s.
    pub gbs_min: f64,
    pub gbs_max: f64,
    /// `MARK_*` bits.
    pub marks: u8,
}

impl Bucket {
    fn point(seq: u64, ms: f64, bytes: u64, ns: u64, marks: u8) -> Bucket {
        let g = super::io_totals::gbps(bytes, ns);
        Bucket {
            first: seq,
            n: 1,
            ms_min: ms,
            ms_max: ms,
            ms_sum: ms,
            bytes,
            ns,
            gbs_min: g,
            gbs_max: g,
            marks,
        }
    }

    /// Merge `o` (the tokens right after) into this one.
    pub fn merge(&mut self, o: &Bucket) {
        if o.n == 0 {
            return;
        }
        if self.n == 0 {
            *self = *o;
            return;
        }
        self.n += o.n;
        self.ms_min = self.ms_min.min(o.ms_min);
        self.ms_max = self.ms_max.max(o.ms_max);
        self.ms_sum += o.ms_sum;
        self.bytes += o.bytes;
        self.ns += o.ns;
        self.gbs_min = self.gbs_min.min(o.gbs_min);
        self.gbs_max = self.gbs_max.max(o.gbs_max);
        self.marks |= o.marks;
    }

    /// Mean ms/token.
    pub fn ms_mean(&self) -> f64 {
        if self.n > 0 {
            self.ms_sum / self.n as f64
        } else {
            0.0
        }
    }

    /// Effective GB/s over the bucket: all its bytes over all its time.
    pub fn gbs(&self) -> f64 {
        super::io_totals::gbps(self.bytes, self.ns)
    }
}

/// The run's history.
#[derive(Clone, Debug, PartialEq)]
pub struct History {
    /// Tokens per bucket (a power of two).
    pub stride: u64,
    pub buckets: Vec<Bucket>,
    /// Tokens recorded.
    pub tokens: u64,
    /// Marks waiting for the next token.
    pending: u8,
}

impl Default for History {
    fn default() -> Self {
        History {
            stride: 1,
            buckets: Vec::new(),
            tokens: 0,
            pending: 0,
        }
    }
}

impl History {
    /// Mark the next token (`MARK_*`).
    pub fn mark(&mut self, bits: u8) {
        self.pending |= bits;
    }

    /// Record one token: its ms, bytes read and measured ns.
    pub fn push(&mut self, ms: f64, bytes: u64, ns: u64) {
        let p = Bucket::point(
            self.tokens,
            ms,
            bytes,
            ns,
            std::mem::take(&mut self.pending),
        );
        self.tokens += 1;
        match self.buckets.last_mut() {
            Some(b) if b.n < self.stride => b.merge(&p),
            _ => {
                if self.buckets.len() == CAP {
                    self.halve();
                    return self.push_merged(p);
                }
                self.buckets.push(p);
            }
        }
    }

    fn push_merged(&mut self, p: Bucket) {
        match self.buckets.last_mut() {
            Some(b) if b.n < self.stride => b.merge(&p),
            _ => self.buckets.push(p),
        }
    }

    /// Merge neighbouring buckets pairwise; the stride doubles.
    fn halve(&mut self) {
        let mut out = Vec::with_capacity(CAP / 2 + 1);
        for pair in self.buckets.chunks(2) {
            let mut b = pair[0];
            if let Some(o) = pair.get(1) {
                b.merge(o);
            }
            out.push(b);
        }
        self.buckets = out;
        self.stride *= 2;
    }

    /// Tokens per column at `zoom`: never finer than the stride.
    pub fn effective_zoom(&self, zoom: u64) -> u64 {
        zoom.max(self.stride).max(1)
    }

    /// Up to `cols` columns of `zoom` tokens each (rounded up to the stride), ending `offset`
    /// tokens before the newest (clamped to the run): (columns oldest first, the offset used).
    pub fn columns(&self, cols: usize, zoom: u64, offset: u64) -> (Vec<Bucket>, u64) {
        if cols == 0 || self.tokens == 0 {
            return (Vec::new(), 0);
        }
        let z = self.effective_zoom(zoom);
        let span = z.saturating_mul(cols as u64);
        let max_off = self.tokens.saturating_sub(span);
        let offset = offset.min(max_off);
        let end = self.tokens - offset;
        let start = end.saturating_sub(span);
        let mut out: Vec<Bucket> = Vec::with_capacity(cols);
        for b in &self.buckets {
            if b.first + b.n <= start || b.first >= end {
                continue;
            }
            // Columns are aligned to `start`; a bucket lands in the column of its first token.
            let col = ((b.first.max(start) - start) / z) as usize;
            while out.len() <= col {
                out.push(Bucket::default());
            }
            out[col].merge(b);
        }
        out.retain(|b| b.n > 0);
        (out, offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_history_has_no_columns() {
        let h = History::default();
        assert!(h.columns(80, 1, 0).0.is_empty());
        assert!(h.columns(0, 1, 5).0.is_empty());
    }

    #[test]
    fn stays_bounded_and_keeps_extremes_and_totals() {
        let mut h = History::default();
        let n = 100_000u64;
        for i in 0..n {
            let ms = if i == 77_777 {
                500.0
            } else {
                5.0 + (i % 7) as f64
            };
            if i == 12_345 {
                h.mark(MARK_TOGGLE);
            }
            h.push(ms, 1_000_000, 1_000_000);
        }
        assert!(h.buckets.len() <= CAP, "{}", h.buckets.len());
        assert!(h.stride.is_power_of_two() && h.stride > 1);
        assert_eq!(h.buckets.iter().map(|b| b.n).sum::<u64>(), n);
        assert_eq!(h.tokens, n);
        let all = h.columns(1, n, 0).0;
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].ms_max, 500.0);
        assert_eq!(all[0].ms_min, 5.0);
        assert!((all[0].gbs() - 1.0).abs() < 1e-12);
        assert_eq!(
            h.buckets
                .iter()
                .filter(|b| b.marks & MARK_TOGGLE != 0)
                .count(),
            1
        );
        // Buckets stay contiguous.
        for w in h.buckets.windows(2) {
            assert_eq!(w[0].first + w[0].n, w[1].first);
        }
    }

    #[test]
    fn columns_pan_and_zoom() {
        let mut h = History::default();
        for i in 0..100u64 {
            h.push(i as f64, 0, 0);
        }
        // Live, one token per column: the newest 10.
        let (c, off) = h.columns(10, 1, 0);
        assert_eq!(off, 0);
        assert_eq!(c.len(), 10);
        assert_eq!(c[9].ms_max, 99.0);
        assert_eq!(c[0].ms_max, 90.0);
        // 30 back.
        let (c, _) = h.columns(10, 1, 30);
        assert_eq!(c[9].ms_max, 69.0);
        // Past the start: clamped to the oldest tokens.
        let (c, off) = h.columns(10, 1, 1_000);
        assert_eq!(off, 90);
        assert_eq!(c[0].ms_min, 0.0);
        // Zoom 4: 10 columns cover 40 tokens, each the mean of its four.
        let (c, _) = h.columns(10, 4, 0);
        assert_eq!(c.len(), 10);
        assert_eq!(c[9].n, 4);
        assert!((c[9].ms_mean() - 97.5).abs() < 1e-12);
        // Wider than the run: every token, fewer columns.
        assert_eq!(h.columns(500, 1, 0).0.len(), 100);
        // No time: GB/s is 0, not NaN.
        assert_eq!(c[0].gbs(), 0.0);
    }
}
