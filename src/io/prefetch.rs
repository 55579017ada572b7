//! The prefetch thread (paper §3.9.1–3.9.2): it receives byte ranges of the mapped model over a
//! bounded channel and walks them issuing `PREFETCHT0` every 64 bytes, so the lines are (ideally)
//! in cache when the compute thread gets there. The paper found it harmful on its machine; it is
//! an A/B toggle here. Off x86 the hint is a no-op.

use crate::format::CflowFile;
use crossbeam_channel::{bounded, Sender, TrySendError};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// What to prefetch. Offsets are into `file`'s mapping and are clamped to it.
#[derive(Clone, Debug)]
pub enum PrefetchCmd {
    /// A contiguous range (the next layer's attention or dense tiles).
    LinearRange {
        file: Arc<CflowFile>,
        offset: usize,
        len: usize,
    },
    /// The expert regions the current routing selected.
    ExpertTiles {
        file: Arc<CflowFile>,
        regions: Vec<(usize, usize)>,
    },
}

/// Counters shared with the thread.
#[derive(Debug, Default)]
pub struct PrefetchCounters {
    pub commands: AtomicU64,
    pub lines: AtomicU64,
    pub dropped: AtomicU64,
}

pub struct Prefetcher {
    tx: Option<Sender<PrefetchCmd>>,
    handle: Option<JoinHandle<()>>,
    pub counters: Arc<PrefetchCounters>,
}

/// Channel depth: a few layers ahead at most; older hints are worthless.
const DEPTH: usize = 8;

#[inline(always)]
fn hint(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    {
        #[allow(unused_unsafe)]
        // SAFETY: PREFETCHT0 is a hint that never faults, even on invalid addresses; SSE is part
        // of the x86_64 baseline. The pointer is in any case inside a live mapping (clamped).
        unsafe {
            std::arch::x86_64::_mm_prefetch(p as *const i8, std::arch::x86_64::_MM_HINT_T0)
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = p;
    }
}

fn walk(bytes: &[u8], offset: usize, len: usize) -> u64 {
    let start = offset.min(bytes.len());
    let end = offset.saturating_add(len).min(bytes.len());
    let mut n = 0;
    let base = bytes.as_ptr();
    let mut o = start;
    while o < end {
        // `o < bytes.len()`, so the address is inside the slice.
        hint(base.wrapping_add(o));
        o += 64;
        n += 1;
    }
    n
}

impl Prefetcher {
    pub fn start() -> std::io::Result<Prefetcher> {
        let (tx, rx) = bounded::<PrefetchCmd>(DEPTH);
        let counters = Arc::new(PrefetchCounters::default());
        let c = counters.clone();
        let handle = std::thread::Builder::new()
            .name("cflow-prefetch".into())
            .spawn(move || {
                while let Ok(cmd) = rx.recv() {
                    c.commands.fetch_add(1, Ordering::Relaxed);
                    let n = match &cmd {
                        PrefetchCmd::LinearRange { file, offset, len } => {
                            walk(file.bytes(), *offset, *len)
                        }
                        PrefetchCmd::ExpertTiles { file, regions } => {
                            regions.iter().map(|&(o, l)| walk(file.bytes(), o, l)).sum()
                        }
                    };
                    c.lines.fetch_add(n, Ordering::Relaxed);
                }
            })?;
        Ok(Prefetcher {
            tx: Some(tx),
            handle: Some(handle),
            counters,
        })
    }

    /// Queues a command; drops it (and counts it) when the thread is behind.
    pub fn send(&self, cmd: PrefetchCmd) {
        if let Some(tx) = &self.tx {
            match tx.try_send(cmd) {
                Ok(()) => {}
                Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                    self.counters.dropped.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}

impl Drop for Prefetcher {
    fn drop(&mut self) {
        self.tx = None;
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::walk;

    #[test]
    fn walk_clamps() {
        let b = vec![0u8; 1000];
        assert_eq!(walk(&b, 0, 1000), 16);
        assert_eq!(walk(&b, 990, 1 << 40), 1);
        assert_eq!(walk(&b, 5000, 10), 0);
        assert_eq!(walk(&b, usize::MAX, usize::MAX), 0);
    }
}
