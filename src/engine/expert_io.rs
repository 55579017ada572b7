//! Expert I/O and prefetch for one token, behind the named points the decode loop calls:
//! [`TokenIo::layer_start`] (hint the next layer's tiles), [`TokenIo::routed`] (submit the
//! selected experts' reads, or hint the tiles of the same expert ids at the next layer — the
//! paper's §3.9.2 prediction — and check the previous step's prediction against this routing), [`TokenIo::before_experts`] (wait for the reads;
//! fails on a bad read), [`TokenIo::after_experts`] (free the slots) and [`TokenIo::finish`]
//! (per-layer I/O accounting). With the mmap tier and no prefetch thread every point is a
//! no-op.

use super::schedule::Pending;
use super::weights::span;
use super::FetchMode;
use super::ForwardError;
use crate::format::reader::LayerView;
use crate::format::CflowFile;
use crate::io::{ExpertFetcher, PrefetchCmd, Prefetcher, Ticket};
use crate::telemetry::{ExpertCacheStat, LayerIo, PrefetchStat, TokenStats};
use std::sync::Arc;

/// A speculative read: (expert id, its ticket, its bytes).
type SpecRead = (usize, Ticket, u64);

pub struct TokenIo<'a> {
    file: &'a Arc<CflowFile>,
    fetcher: Option<&'a mut ExpertFetcher>,
    prefetch: Option<&'a Prefetcher>,
    mode: FetchMode,
    /// Reader-busy ns and bytes of the reads issued at each step.
    io_acc: Vec<(u64, u64)>,
    /// Wait ns of the current step.
    wait_ns: u64,
    /// Steps started so far (the current step is `step - 1`).
    step: usize,
    /// The expert ids hinted for the next routed layer: (the step they are for, ids).
    predicted: Option<(usize, Vec<usize>)>,
    /// Direct tier with prefetch: the speculative reads submitted for the next routed layer:
    /// (the step they are for, (expert id, ticket, bytes)).
    spec: Option<(usize, Vec<SpecRead>)>,
    /// This token's hint counts.
    pf: PrefetchStat,
    /// This token's expert-cache hits and misses (direct tier with the cache on).
    cache: ExpertCacheStat,
}

impl<'a> TokenIo<'a> {
    /// `fetcher`: the direct-tier fetcher when experts are read through it; `prefetch`: the
    /// PREFETCHT0 thread when enabled.
    pub fn new(
        file: &'a Arc<CflowFile>,
        fetcher: Option<&'a mut ExpertFetcher>,
        prefetch: Option<&'a Prefetcher>,
        mode: FetchMode,
        steps: usize,
    ) -> TokenIo<'a> {
        TokenIo {
            file,
            fetcher,
            prefetch,
            mode,
            io_acc: vec![(0, 0); steps],
            wait_ns: 0,
            step: 0,
            predicted: None,
            spec: None,
            pf: PrefetchStat::default(),
            cache: ExpertCacheStat::default(),
        }
    }

    /// True when experts are read into staging slots (they then run where the reads land).
    pub fn fetching(&self) -> bool {
        self.fetcher.is_some()
    }

    /// True when the next routed layer's experts are read speculatively (direct tier with
    /// prefetch on): the caller then passes [`routed`](Self::routed) the next layer's router's
    /// prediction.
    pub fn speculating(&self) -> bool {
        self.fetcher.is_some() && self.prefetch.is_some()
    }

    /// Start of a step: hints the attention and dense tiles of the next block (`next`).
    pub fn layer_start(&mut self, next: Option<&LayerView>) {
        self.wait_ns = 0;
        self.step += 1;
        let (Some(pf), Some(nv)) = (self.prefetch, next) else {
            return;
        };
        let spans = [
            span(&[Some(&nv.q), Some(&nv.k), Some(&nv.v), Some(&nv.o)]),
            span(&[nv.gate.as_ref(), nv.up.as_ref(), nv.down.as_ref()]),
        ];
        for (a, b) in spans.into_iter().flatten() {
            let sent = pf.send(PrefetchCmd::LinearRange {
                file: self.file.clone(),
                offset: a,
                len: b - a,
            });
            self.count(sent);
        }
    }

    fn count(&mut self, sent: bool) {
        if sent {
            self.pf.sent += 1;
        } else {
            self.pf.dropped += 1;
        }
    }

    /// After routing at block `lv`: submits the reads of the selected experts (waiting for them
    /// at once under sync fetch) and returns the tickets (empty on the mmap tier). With prefetch
    /// on the direct tier, a selected expert already read speculatively for this step takes that
    /// read's ticket (a hit), the unused speculative reads are abandoned, and `spec` — the next
    /// layer's router's prediction for `next` — is read ahead. With the prefetch thread on the
    /// mmap tier instead: checks the previous step's prediction against `sel`, then hints the
    /// tiles of the same expert ids in `next` (the next step's block).
    pub fn routed(
        &mut self,
        lv: &LayerView,
        sel: &[(usize, f32)],
        next: Option<&LayerView>,
        spec: Option<&[usize]>,
    ) -> Vec<Ticket> {
        let mut tickets = Vec::new();
        let now = self.step.saturating_sub(1);
        if let Some(f) = self.fetcher.as_deref_mut() {
            let mut ahead = match self.spec.take() {
                Some((at, reads)) if at == now => reads,
                Some((_, reads)) => {
                    // Not for this step (cannot happen in a token's order): give them up.
                    for (_, t, b) in reads {
                        f.abandon(t);
                        self.pf.wasted_bytes += b;
                    }
                    Vec::new()
                }
                None => Vec::new(),
            };
            if !ahead.is_empty() {
                self.pf.predicted += ahead.len() as u32;
            }
            let cache_on = f.cache_bytes() > 0;
            let submit =
                |f: &mut ExpertFetcher, off: u64, len: usize, cache: &mut ExpertCacheStat| {
                    let t = f.submit(off, len);
                    if cache_on {
                        if f.was_hit(t) {
                            cache.hits += 1;
                        } else {
                            cache.misses += 1;
                        }
                    }
                    t
                };
            for &(e, _) in sel {
                if let Some(i) = ahead.iter().position(|&(id, _, _)| id == e) {
                    self.pf.hits += 1;
                    tickets.push(ahead.swap_remove(i).1);
                    continue;
                }
                let ex = &lv.experts[e];
                tickets.push(submit(f, ex.offset, ex.len as usize, &mut self.cache));
            }
            for (_, t, b) in ahead {
                f.abandon(t);
                self.pf.wasted_bytes += b;
            }
            if self.mode == FetchMode::Sync {
                for t in &tickets {
                    self.wait_ns += f.wait(*t);
                }
            }
            if let (Some(ids), Some(nv)) = (spec, next.filter(|nv| !nv.experts.is_empty())) {
                let reads: Vec<SpecRead> = ids
                    .iter()
                    .filter(|&&e| e < nv.experts.len())
                    .map(|&e| {
                        let ex = &nv.experts[e];
                        let t = submit(f, ex.offset, ex.len as usize, &mut self.cache);
                        // Bytes this read takes from disk (none when the cache served it).
                        (e, t, if f.was_hit(t) { 0 } else { ex.len })
                    })
                    .collect();
                self.spec = Some((now + 1, reads));
            }
        } else if let Some(pf) = self.prefetch {
            if let Some((_, ids)) = self.predicted.take().filter(|(at, _)| *at == now) {
                self.pf.predicted += ids.len() as u32;
                self.pf.hits += ids
                    .iter()
                    .filter(|e| sel.iter().any(|(s, _)| s == *e))
                    .count() as u32;
            }
            let Some(nv) = next.filter(|nv| !nv.experts.is_empty()) else {
                return tickets;
            };
            let ids: Vec<usize> = sel
                .iter()
                .map(|&(e, _)| e)
                .filter(|&e| e < nv.experts.len())
                .collect();
            let sent = pf.send(PrefetchCmd::ExpertTiles {
                file: self.file.clone(),
                regions: ids
                    .iter()
                    .map(|&e| (nv.experts[e].offset as usize, nv.experts[e].len as usize))
                    .collect(),
            });
            self.count(sent);
            if sent {
                self.predicted = Some((now + 1, ids));
            }
        }
        tickets
    }

    /// Before the experts of `pe` run: waits for their reads. A failed read abandons the token
    /// (every other read completes and every slot is free before the error is returned).
    pub fn before_experts(&mut self, pe: &Pending) -> Result<(), ForwardError> {
        let Some(f) = self.fetcher.as_deref_mut() else {
            return Ok(());
        };
        for (t, &(e, _)) in pe.tickets.iter().zip(&pe.sel) {
            self.wait_ns += f.wait(*t);
            let (busy, b) = f.io_of(*t);
            // A region served by the expert cache was not read: no bytes from disk.
            let b = if f.was_hit(*t) { 0 } else { b };
            self.io_acc[pe.from].0 += busy;
            self.io_acc[pe.from].1 += b;
            if let Err(error) = f.view(*t) {
                let ex = &self.file.layers[pe.block].experts[e];
                let err = ForwardError::ExpertRead {
                    path: self.file.path.display().to_string(),
                    layer: pe.block,
                    expert: e,
                    offset: ex.offset,
                    len: ex.len,
                    error: error.to_string(),
                };
                f.drain();
                return Err(err);
            }
        }
        Ok(())
    }

    /// The staging slot of each selected expert of `pe` (None: read it from the map).
    pub fn staged(&self, pe: &Pending) -> Vec<Option<&[u8]>> {
        let f = self.fetcher.as_deref();
        (0..pe.sel.len())
            .map(|i| {
                pe.tickets
                    .get(i)
                    .and_then(|t| f.and_then(|f| f.view(*t).ok()))
            })
            .collect()
    }

    /// After the experts of `pe` ran: frees their slots.
    pub fn after_experts(&mut self, pe: &Pending) {
        if let Some(f) = self.fetcher.as_deref_mut() {
            for t in &pe.tickets {
                f.release(*t);
            }
        }
    }

    /// Abandons the speculative reads still outstanding and waits for every abandoned read, so
    /// that between tokens every staging slot is free.
    fn give_up_speculation(&mut self) {
        let Some(f) = self.fetcher.as_deref_mut() else {
            return;
        };
        if let Some((_, reads)) = self.spec.take() {
            for (_, t, b) in reads {
                f.abandon(t);
                self.pf.wasted_bytes += b;
            }
        }
        f.reap();
    }

    /// End of step `l` that took `layer_ns`: its compute / wait split (direct tier only).
    pub fn layer_end(&self, st: &mut crate::telemetry::LayerStat, layer_ns: u64) {
        if self.fetching() {
            st.io = Some(LayerIo {
                compute_ns: layer_ns.saturating_sub(self.wait_ns),
                io_ns: 0,
                wait_ns: self.wait_ns,
                bytes: 0,
            });
        }
    }

    /// End of the token: reader-busy time and bytes of the reads issued at each step.
    pub fn finish(mut self, stats: &mut TokenStats) {
        self.give_up_speculation();
        if self.prefetch.is_some() {
            stats.prefetch = Some(self.pf);
        }
        if let Some(f) = self.fetcher.as_deref().filter(|f| f.cache_bytes() > 0) {
            self.cache.capacity_bytes = f.cache_bytes();
            self.cache.cached_bytes = f.cached_bytes();
            stats.expert_cache = Some(self.cache);
        }
        for (st, (busy, b)) in stats.layers.iter_mut().zip(&self.io_acc) {
            if let Some(io) = st.io.as_mut() {
                io.io_ns = *busy;
                io.bytes = *b;
            }
        }
    }
}

impl Drop for TokenIo<'_> {
    /// A token that ends early (stopped, or a failed read) leaves no speculative read behind.
    fn drop(&mut self) {
        self.give_up_speculation();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(dir: &std::path::Path) -> Arc<CflowFile> {
        let p = dir.join("m.cflow");
        let mut s = crate::convert::generate::GenSpec::new("arch2_4_combined");
        (s.vocab, s.hidden, s.ffn, s.expert_ffn) = (Some(64), Some(64), Some(64), Some(32));
        crate::convert::generate::generate(&s, &p, |_, _| {}).unwrap();
        Arc::new(CflowFile::open(&p).unwrap())
    }

    /// The routing at ℓ hints the same expert ids at ℓ+1 (their tiles in ℓ+1's block), and the
    /// next routing scores it: {1, 3} predicted, {3, 5} routed → 2 predicted, 1 hit; then
    /// {3, 5} predicted, {5, 3} routed → 2 more, 2 hits. By hand: predicted 4, hits 3.
    #[test]
    fn next_layer_prediction_hit_rate() {
        let dir = tempfile::tempdir().unwrap();
        let file = model(dir.path());
        let (pf, rx) = Prefetcher::stalled(64);
        let mut io = TokenIo::new(&file, None, Some(&pf), FetchMode::Sync, 3);
        let l = &file.layers;
        io.layer_start(Some(&l[1]));
        io.routed(&l[0], &[(1, 0.6), (3, 0.4)], Some(&l[1]), None);
        io.layer_start(Some(&l[2]));
        io.routed(&l[1], &[(3, 0.7), (5, 0.3)], Some(&l[2]), None);
        io.layer_start(None);
        io.routed(&l[2], &[(5, 0.5), (3, 0.5)], None, None);
        // Commands in order: ranges of ℓ1, tiles of ℓ1's experts 1 and 3, ranges of ℓ2, ...
        let cmds: Vec<PrefetchCmd> = rx.try_iter().collect();
        let tiles: Vec<Vec<(usize, usize)>> = cmds
            .iter()
            .filter_map(|c| match c {
                PrefetchCmd::ExpertTiles { regions, .. } => Some(regions.clone()),
                _ => None,
            })
            .collect();
        let region = |b: usize, e: usize| {
            (
                l[b].experts[e].offset as usize,
                l[b].experts[e].len as usize,
            )
        };
        assert_eq!(
            tiles,
            vec![
                vec![region(1, 1), region(1, 3)],
                vec![region(2, 3), region(2, 5)]
            ]
        );
        let mut stats = TokenStats {
            layers: vec![Default::default(); 3],
            ..Default::default()
        };
        io.finish(&mut stats);
        let p = stats.prefetch.unwrap();
        assert_eq!((p.predicted, p.hits, p.dropped), (4, 3, 0));
        assert_eq!(p.sent as usize, cmds.len());
        assert_eq!(p.hit_rate(), Some(0.75));
    }

    /// A dropped expert hint is counted and predicts nothing (no prefetch happened).
    #[test]
    fn dropped_hints_are_counted_and_not_scored() {
        let dir = tempfile::tempdir().unwrap();
        let file = model(dir.path());
        let (pf, _rx) = Prefetcher::stalled(1);
        let mut io = TokenIo::new(&file, None, Some(&pf), FetchMode::Sync, 2);
        let l = &file.layers;
        io.layer_start(Some(&l[1])); // attention range queued, dense range dropped
        io.routed(&l[0], &[(1, 0.6), (3, 0.4)], Some(&l[1]), None); // dropped
        io.layer_start(None);
        io.routed(&l[1], &[(1, 0.6), (3, 0.4)], None, None);
        let mut stats = TokenStats {
            layers: vec![Default::default(); 2],
            ..Default::default()
        };
        io.finish(&mut stats);
        let p = stats.prefetch.unwrap();
        assert_eq!((p.sent, p.dropped, p.predicted, p.hits), (1, 2, 0, 0));
        assert_eq!(
            pf.counters
                .dropped
                .load(std::sync::atomic::Ordering::Relaxed),
            2
        );
        // Without the prefetch thread the token carries no prefetch stat.
        let mut stats = TokenStats::default();
        TokenIo::new(&file, None, None, FetchMode::Sync, 0).finish(&mut stats);
        assert!(stats.prefetch.is_none());
    }

    /// Direct tier with prefetch: the next layer's predicted experts are read ahead; a routed
    /// expert that was read ahead takes that read (no second submission), the others are read
    /// then, and the unused reads count as wasted. Predicted {1, 3}, routed {3, 5}: 2 predicted,
    /// 1 hit, expert 1's bytes wasted, 2 + 2 + 1 submissions; every slot is free afterwards.
    #[test]
    fn speculative_reads_are_reused_or_abandoned() {
        let dir = tempfile::tempdir().unwrap();
        let file = model(dir.path());
        let mut f = ExpertFetcher::new(&file.path, 1, Default::default()).unwrap();
        let (pf, _rx) = Prefetcher::stalled(64);
        let l = &file.layers;
        {
            let mut io = TokenIo::new(&file, Some(&mut f), Some(&pf), FetchMode::Staged, 2);
            assert!(io.speculating());
            io.layer_start(Some(&l[1]));
            let t0 = io.routed(&l[0], &[(0, 0.5), (2, 0.5)], Some(&l[1]), Some(&[1, 3]));
            assert_eq!(t0.len(), 2);
            io.layer_start(None);
            let t1 = io.routed(&l[1], &[(3, 0.5), (5, 0.5)], None, None);
            for (ts, block, sel) in [(&t0, 0, [0, 2]), (&t1, 1, [3, 5])] {
                let pe = Pending {
                    block,
                    from: block,
                    act: Vec::new(),
                    sel: sel.iter().map(|&e| (e, 0.5)).collect(),
                    scale: 1.0,
                    tickets: ts.clone(),
                    offloaded: false,
                    fused: None,
                };
                io.before_experts(&pe).unwrap();
                for (i, v) in io.staged(&pe).into_iter().enumerate() {
                    let ex = &l[block].experts[sel[i]];
                    let want = &file.bytes()[ex.offset as usize..(ex.offset + ex.len) as usize];
                    assert_eq!(v.unwrap(), want, "block {block} expert {}", sel[i]);
                }
                io.after_experts(&pe);
            }
            let mut stats = TokenStats {
                layers: vec![Default::default(); 2],
                ..Default::default()
            };
            io.finish(&mut stats);
            let p = stats.prefetch.unwrap();
            assert_eq!((p.predicted, p.hits), (2, 1));
            assert_eq!(p.wasted_bytes, l[1].experts[1].len);
        }
        assert_eq!(f.counters.submitted, 5);
        assert_eq!(f.counters.submitted, f.counters.completed);
        assert_eq!(f.free_slots(), f.n_slots());
        assert_eq!(f.counters.reuse_violations, 0);
    }
}
