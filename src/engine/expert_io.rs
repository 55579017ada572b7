//! Expert I/O and prefetch for one token, behind the named points the decode loop calls:
//! [`TokenIo::layer_start`] (hint the next layer's tiles), [`TokenIo::routed`] (submit the
//! selected experts' reads, or hint them), [`TokenIo::before_experts`] (wait for the reads;
//! fails on a bad read), [`TokenIo::after_experts`] (free the slots) and [`TokenIo::finish`]
//! (per-layer I/O accounting). With the mmap tier and no prefetch thread every point is a
//! no-op.

use super::schedule::Pending;
use super::weights::span;
use super::ForwardError;
use crate::format::reader::LayerView;
use crate::format::CflowFile;
use crate::io::{ExpertFetcher, FetchMode, PrefetchCmd, Prefetcher, Ticket};
use crate::telemetry::{LayerIo, TokenStats};
use std::sync::Arc;

pub struct TokenIo<'a> {
    file: &'a Arc<CflowFile>,
    fetcher: Option<&'a mut ExpertFetcher>,
    prefetch: Option<&'a Prefetcher>,
    mode: FetchMode,
    /// Reader-busy ns and bytes of the reads issued at each step.
    io_acc: Vec<(u64, u64)>,
    /// Wait ns of the current step.
    wait_ns: u64,
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
        }
    }

    /// True when experts are read into staging slots (they then run where the reads land).
    pub fn fetching(&self) -> bool {
        self.fetcher.is_some()
    }

    /// Start of a step: hints the attention and dense tiles of the next block (`next`).
    pub fn layer_start(&mut self, next: Option<&LayerView>) {
        self.wait_ns = 0;
        let (Some(pf), Some(nv)) = (self.prefetch, next) else {
            return;
        };
        let spans = [
            span(&[Some(&nv.q), Some(&nv.k), Some(&nv.v), Some(&nv.o)]),
            span(&[nv.gate.as_ref(), nv.up.as_ref(), nv.down.as_ref()]),
        ];
        for (a, b) in spans.into_iter().flatten() {
            pf.send(PrefetchCmd::LinearRange {
                file: self.file.clone(),
                offset: a,
                len: b - a,
            });
        }
    }

    /// After routing at block `lv`: submits the reads of the selected experts (waiting for them
    /// at once under sync fetch) or hints their tiles; returns the tickets (empty on the mmap
    /// tier).
    pub fn routed(&mut self, lv: &LayerView, sel: &[(usize, f32)]) -> Vec<Ticket> {
        let mut tickets = Vec::new();
        if let Some(f) = self.fetcher.as_deref_mut() {
            for &(e, _) in sel {
                let ex = &lv.experts[e];
                tickets.push(f.submit(ex.offset, ex.len as usize));
            }
            if self.mode == FetchMode::Sync {
                for t in &tickets {
                    self.wait_ns += f.wait(*t);
                }
            }
        } else if let Some(pf) = self.prefetch {
            pf.send(PrefetchCmd::ExpertTiles {
                file: self.file.clone(),
                regions: sel
                    .iter()
                    .map(|&(e, _)| (lv.experts[e].offset as usize, lv.experts[e].len as usize))
                    .collect(),
            });
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
    pub fn finish(self, stats: &mut TokenStats) {
        for (st, (busy, b)) in stats.layers.iter_mut().zip(&self.io_acc) {
            if let Some(io) = st.io.as_mut() {
                io.io_ns = *busy;
                io.bytes = *b;
            }
        }
    }
}
