//! The prefetch thread (paper §3.9.1–3.9.2): it receives byte ranges of the mapped model over a
//! bounded channel and walks them issuing `PREFETCHT0` every 64 bytes, so the lines are (ideally)
//! in cache when the compute thread gets there. The paper found it harmful on its machine; it is
//! an A/B toggle here. Off x86 the hint is a no-op.
//!
//! The thread only gives hints, so its failure cannot corrupt a token: if it panics, `send`
//! finds the channel closed and counts the hints as dropped (it never blocks), and
//! [`Prefetcher::recover`] — called by the engine between tokens — joins the dead thread, starts
//! a fresh one on the same counters and returns the panic message for the session to report.

use super::fault::{panic_message, FaultKind, FaultPlan};
use crossbeam_channel::{bounded, Sender, TrySendError};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Bytes the prefetch thread walks: the model's mapping (`format::CflowFile` implements it; the
/// thread needs nothing else of the file).
pub trait Mapped: Send + Sync + std::fmt::Debug {
    fn bytes(&self) -> &[u8];
}

/// What to prefetch. Offsets are into `file`'s mapping and are clamped to it.
#[derive(Clone, Debug)]
pub enum PrefetchCmd {
    /// A contiguous range (the next layer's attention or dense tiles).
    LinearRange {
        file: Arc<dyn Mapped>,
        offset: usize,
        len: usize,
    },
    /// Expert regions: the tiles of the experts the current routing predicts for the next
    /// layer (§3.9.2: the same expert ids at ℓ+1).
    ExpertTiles {
        file: Arc<dyn Mapped>,
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
    fault: Option<FaultPlan>,
    depth: usize,
}

/// The default channel depth (tests and callers that do not size it).
pub const DEFAULT_DEPTH: usize = 8;

/// The depth that holds one token's hints: the compute thread sends at most 3 commands per step
/// (attention range, dense range, next-layer expert tiles), so with this depth a command is only
/// dropped when the thread is a whole token behind — when walking a token's hints takes longer
/// than computing the token, and then no finite depth stops drops in the steady state.
pub fn depth_for_steps(steps: usize) -> usize {
    (3 * steps).clamp(DEFAULT_DEPTH, 4096)
}

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

type Spawned = (Sender<PrefetchCmd>, JoinHandle<()>);

/// Starts the thread over `c`; it panics at command number `fault.at` for a `PrefetchPanic` plan.
fn spawn(
    c: Arc<PrefetchCounters>,
    fault: Option<FaultPlan>,
    depth: usize,
) -> std::io::Result<Spawned> {
    let (tx, rx) = bounded::<PrefetchCmd>(depth.max(1));
    let panic_at = fault
        .filter(|f| f.kind == FaultKind::PrefetchPanic)
        .map(|f| f.at);
    let handle = std::thread::Builder::new()
        .name("cflow-prefetch".into())
        .spawn(move || {
            while let Ok(cmd) = rx.recv() {
                let no = c.commands.fetch_add(1, Ordering::Relaxed);
                if panic_at == Some(no) {
                    panic!("injected fault: prefetch thread panic at command {no}");
                }
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
    Ok((tx, handle))
}

impl Prefetcher {
    pub fn start() -> std::io::Result<Prefetcher> {
        Prefetcher::with_fault(None)
    }

    /// As [`start`](Self::start), with an injected fault (tests).
    pub fn with_fault(fault: Option<FaultPlan>) -> std::io::Result<Prefetcher> {
        Prefetcher::with_depth(DEFAULT_DEPTH, fault)
    }

    /// A thread whose channel holds `depth` commands (see [`depth_for_steps`]).
    pub fn with_depth(depth: usize, fault: Option<FaultPlan>) -> std::io::Result<Prefetcher> {
        let counters = Arc::new(PrefetchCounters::default());
        let (tx, handle) = spawn(counters.clone(), fault, depth)?;
        Ok(Prefetcher {
            tx: Some(tx),
            handle: Some(handle),
            counters,
            fault,
            depth,
        })
    }

    /// The channel's depth in commands.
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// If the thread has died (it only ends early by panicking), joins it, starts a fresh one
    /// on the same counters and returns what happened. `None` while the thread is alive.
    pub fn recover(&mut self) -> Option<String> {
        if !self.handle.as_ref().is_some_and(|h| h.is_finished()) {
            return None;
        }
        let why = match self.handle.take().map(|h| h.join()) {
            Some(Err(p)) => panic_message(&*p),
            _ => "exited".into(),
        };
        self.tx = None;
        match spawn(self.counters.clone(), self.fault, self.depth) {
            Ok((tx, h)) => {
                self.tx = Some(tx);
                self.handle = Some(h);
                Some(format!(
                    "prefetch thread panicked ({why}); restarted (only prefetch hints were lost)"
                ))
            }
            Err(e) => Some(format!(
                "prefetch thread panicked ({why}); restart failed ({e}): prefetch is off"
            )),
        }
    }

    /// Queues a command; drops it (and counts it) when the channel is full or the thread is
    /// gone. Returns true when it was queued.
    pub fn send(&self, cmd: PrefetchCmd) -> bool {
        let Some(tx) = &self.tx else {
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            return false;
        };
        match tx.try_send(cmd) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.counters.dropped.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }
}

impl Prefetcher {
    /// A prefetcher whose thread never takes a command (tests): the channel fills after
    /// `depth` sends and the caller holds the receiving end.
    #[cfg(test)]
    pub(crate) fn stalled(depth: usize) -> (Prefetcher, crossbeam_channel::Receiver<PrefetchCmd>) {
        let (tx, rx) = bounded(depth);
        let p = Prefetcher {
            tx: Some(tx),
            handle: None,
            counters: Arc::new(PrefetchCounters::default()),
            fault: None,
            depth,
        };
        (p, rx)
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
    use super::*;

    /// A full channel drops the command, counts it and says so; a free slot queues it.
    #[test]
    fn full_channel_counts_drops() {
        #[derive(Debug)]
        struct Bytes(Vec<u8>);
        impl Mapped for Bytes {
            fn bytes(&self) -> &[u8] {
                &self.0
            }
        }
        let file: Arc<dyn Mapped> = Arc::new(Bytes(vec![0; 4096]));
        let (pf, rx) = Prefetcher::stalled(3);
        let cmd = || PrefetchCmd::LinearRange {
            file: file.clone(),
            offset: 0,
            len: 64,
        };
        let sent: Vec<bool> = (0..5).map(|_| pf.send(cmd())).collect();
        assert_eq!(sent, [true, true, true, false, false]);
        assert_eq!(pf.counters.dropped.load(Ordering::Relaxed), 2);
        rx.recv().unwrap();
        assert!(pf.send(cmd()));
        assert_eq!(pf.counters.dropped.load(Ordering::Relaxed), 2);
        assert_eq!(depth_for_steps(6), 18);
        assert_eq!(depth_for_steps(1), DEFAULT_DEPTH);
    }

    #[test]
    fn walk_clamps() {
        let b = vec![0u8; 1000];
        assert_eq!(walk(&b, 0, 1000), 16);
        assert_eq!(walk(&b, 990, 1 << 40), 1);
        assert_eq!(walk(&b, 5000, 10), 0);
        assert_eq!(walk(&b, usize::MAX, usize::MAX), 0);
    }
}
