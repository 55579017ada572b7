//! Expert fetch from disk into aligned staging slots (paper §3.9.4, §5.14).
//!
//! An [`ExpertFetcher`] owns a set of staging slots and a pool of reader threads. `submit` moves a
//! free slot's buffer to a reader together with the region to read; the reader fills it with
//! `pread` (on an `O_DIRECT` descriptor when the filesystem accepts it, else buffered) and sends
//! the buffer back. `wait` blocks until a slot's read has completed. Every slot carries a
//! pending-operation counter shared with the readers: it is incremented at submit and decremented
//! by the reader after its last write into the buffer, and a slot is only handed out again when
//! its counter is zero and its buffer is back, so a slot is never reused while a read is in
//! flight. The sync arm uses the same pool and waits immediately after submitting.
//!
//! Failures never hang or leak a slot: a read error (EIO, a short read at end-of-file) completes
//! the slot as failed with the message, and a panic inside a reader is caught around that one
//! read, so the buffer still comes back, the slot completes as failed ("reader thread panicked:
//! …") and the reader goes on serving (the pool recovers by itself; nothing is respawned). If
//! every reader is gone anyway, `wait` fails the outstanding slots instead of blocking. Faults
//! are injected through [`FetchHooks::fault`] (see [`super::fault`]).

use super::aligned::{round_up, AlignedBuf, ALIGN};
use super::fault::{panic_message, FaultKind, FaultPlan};
use crossbeam_channel::{unbounded, Receiver, Sender};
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Test and diagnostics hooks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FetchHooks {
    /// Never try `O_DIRECT` (exercises the buffered fallback).
    pub force_buffered: bool,
    /// Each read sleeps this long before returning (an artificially slow device).
    pub reader_delay: Duration,
    /// One injected fault (read error, short read, reader/waiter/prefetch panic); tests only.
    pub fault: Option<FaultPlan>,
}

/// The file expert regions are read from.
struct Source {
    file: File,
    direct: bool,
}

impl Source {
    /// Reads `need` bytes at the 4096-aligned `off` into `buf`. Returns the bytes read. The
    /// file is treated as ending `eof` bytes after `off` (a 4096 multiple; `usize::MAX` for the
    /// real end), which is how a short read is injected.
    fn read(
        &self,
        buf: &mut AlignedBuf,
        off: u64,
        need: usize,
        eof: usize,
    ) -> std::io::Result<usize> {
        let total = round_up(need).min(buf.len()).min(eof);
        let mut got = 0usize;
        while got < need && got < total {
            match self.file.read_at(&mut buf[got..total], off + got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if got < need {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("short read: {got} of {need} bytes at offset {off}"),
            ));
        }
        Ok(got)
    }
}

/// Opens `path` for expert reads: `O_DIRECT` unless refused. Returns the source and a note when
/// it fell back to buffered reads.
fn open_source(path: &Path, hooks: &FetchHooks) -> std::io::Result<(Source, Option<String>)> {
    let buffered = || -> std::io::Result<Source> {
        Ok(Source {
            file: File::open(path)?,
            direct: false,
        })
    };
    if hooks.force_buffered {
        return Ok((
            buffered()?,
            Some("O_DIRECT disabled (test hook): buffered pread".into()),
        ));
    }
    let direct = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path);
    match direct {
        Ok(file) => {
            // Some filesystems accept the flag at open and refuse the reads; probe one page.
            let src = Source { file, direct: true };
            let mut probe = AlignedBuf::new(ALIGN).expect("one page");
            let size = src.file.metadata()?.len();
            if size == 0 {
                return Ok((src, None));
            }
            match src.file.read_at(&mut probe, 0) {
                Ok(_) => Ok((src, None)),
                Err(e) => Ok((
                    buffered()?,
                    Some(format!("O_DIRECT refused ({e}): buffered pread")),
                )),
            }
        }
        Err(e) => Ok((
            buffered()?,
            Some(format!("O_DIRECT refused ({e}): buffered pread")),
        )),
    }
}

struct Req {
    slot: usize,
    buf: AlignedBuf,
    off: u64,
    need: usize,
    pending: Arc<AtomicU32>,
    /// Injected fault for this read (tests).
    fault: Option<FaultKind>,
}

struct Done {
    slot: usize,
    buf: AlignedBuf,
    result: Result<(), String>,
    busy_ns: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SlotState {
    Free,
    InFlight,
    Ready,
    Failed,
}

struct Slot {
    /// `None` while the buffer is with a reader.
    buf: Option<AlignedBuf>,
    pending: Arc<AtomicU32>,
    state: SlotState,
    /// Offset of the region inside the buffer (the read starts at the aligned-down offset).
    delta: usize,
    len: usize,
    busy_ns: u64,
    error: Option<String>,
    /// Submission number of the read in this slot.
    read_no: u64,
    /// Injected: `wait` on this read panics (once).
    waiter_panic: bool,
    /// The file region (offset, len) the buffer holds after a successful read; kept while the
    /// slot is free, so that with the expert cache on a later read of it is served from memory.
    holds: Option<(u64, usize)>,
    /// The region (offset, len) of the current or last submission.
    region: (u64, usize),
    /// The current ticket was served from the cache.
    hit: bool,
    /// The read's ticket was given up while in flight (a mispredicted speculative read): the
    /// slot becomes free when the read completes, without a `wait` on it.
    abandoned: bool,
    /// When the slot was last handed out (a submission number; least recently used evicts first).
    last_use: u64,
}

/// A submitted read: the slot index and a generation check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticket {
    slot: usize,
    gen: u64,
}

/// Counters over the fetcher's lifetime (for tests and telemetry).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FetchCounters {
    pub submitted: u64,
    pub completed: u64,
    pub failed: u64,
    /// Slots found with a non-zero pending counter while marked free (must stay 0).
    pub reuse_violations: u64,
    pub bytes: u64,
    /// With the expert cache on: submissions served from a cached region (no read), and
    /// submissions that had to read.
    pub cache_hits: u64,
    pub cache_misses: u64,
}

pub struct ExpertFetcher {
    req_tx: Option<Sender<Req>>,
    done_rx: Receiver<Done>,
    readers: Vec<JoinHandle<()>>,
    slots: Vec<Slot>,
    gens: Vec<u64>,
    direct: bool,
    note: Option<String>,
    fault: Option<FaultPlan>,
    /// Bytes of expert regions kept in free slots for reuse (0: the cache is off).
    cache_cap: u64,
    /// Submissions of each region (offset, len), halved every [`AGING`] submissions: the cache
    /// keeps the most often used regions (see [`ExpertFetcher::set_cache_bytes`]).
    freq: HashMap<(u64, usize), u32>,
    pub counters: FetchCounters,
}

/// Submissions between two halvings of the regions' use counts (so that the cache follows a
/// change of which experts are popular).
const AGING: u64 = 4096;

impl ExpertFetcher {
    /// Opens `path` (O_DIRECT unless refused or disabled) and starts `readers` reader threads.
    pub fn new(path: &Path, readers: usize, hooks: FetchHooks) -> std::io::Result<ExpertFetcher> {
        let (src, note) = open_source(path, &hooks)?;
        let direct = src.direct;
        let src = Arc::new(src);
        let (req_tx, req_rx) = unbounded::<Req>();
        let (done_tx, done_rx) = unbounded::<Done>();
        let mut handles = Vec::new();
        for i in 0..readers.max(1) {
            let rx = req_rx.clone();
            let tx = done_tx.clone();
            let src = src.clone();
            let delay = hooks.reader_delay;
            let h = std::thread::Builder::new()
                .name(format!("cflow-reader-{i}"))
                .spawn(move || reader_loop(&src, rx, tx, delay))?;
            handles.push(h);
        }
        Ok(ExpertFetcher {
            req_tx: Some(req_tx),
            done_rx,
            readers: handles,
            slots: Vec::new(),
            gens: Vec::new(),
            direct,
            note,
            fault: hooks.fault,
            cache_cap: 0,
            freq: HashMap::new(),
            counters: FetchCounters::default(),
        })
    }

    /// Sets the expert cache's capacity: up to `bytes` of expert regions stay in memory after
    /// their experts ran, and a later read of the same region is served from there (0: off;
    /// every read goes to the file). When the cache is full the region used least often (over
    /// the recent submissions) goes; among equally used ones the newest region is not admitted.
    /// A token walks the layers in order, so least-recently-used eviction would evict each
    /// layer's experts just before the next token needs them whenever one token's experts
    /// exceed the cache (0 hits); counting uses keeps the popular experts instead.
    pub fn set_cache_bytes(&mut self, bytes: u64) {
        self.cache_cap = bytes;
        if bytes == 0 {
            for s in &mut self.slots {
                s.holds = None;
            }
        }
        self.evict_to_cap();
    }

    /// The cache's capacity in bytes (0: off).
    pub fn cache_bytes(&self) -> u64 {
        self.cache_cap
    }

    /// Bytes of expert regions cached now (in free slots).
    pub fn cached_bytes(&self) -> u64 {
        self.slots
            .iter()
            .filter(|s| s.state == SlotState::Free)
            .filter_map(|s| s.holds.map(|(_, l)| l as u64))
            .sum()
    }

    /// Whether the read of `t` was served from the cache.
    pub fn was_hit(&self, t: Ticket) -> bool {
        self.gens[t.slot] == t.gen && self.slots[t.slot].hit
    }

    /// Eviction order of a cached region: fewest uses first, then the most recently used (a
    /// region no more used than those cached is not admitted).
    fn rank(&self, s: &Slot) -> (u32, std::cmp::Reverse<u64>) {
        let uses = s
            .holds
            .and_then(|r| self.freq.get(&r))
            .copied()
            .unwrap_or(0);
        (uses, std::cmp::Reverse(s.last_use))
    }

    /// Counts a submission of `region` (aging the counts every [`AGING`] submissions).
    fn count_use(&mut self, region: (u64, usize)) {
        if self.cache_cap == 0 {
            return;
        }
        *self.freq.entry(region).or_insert(0) += 1;
        if self.counters.submitted % AGING == AGING - 1 {
            self.freq.retain(|_, n| {
                *n /= 2;
                *n > 0
            });
        }
    }

    /// Drops cached regions, least used first ([`Self::rank`]), until the cache fits its
    /// capacity (their slots stay as free staging slots).
    fn evict_to_cap(&mut self) {
        loop {
            if self.cached_bytes() <= self.cache_cap {
                return;
            }
            let lru = self
                .slots
                .iter()
                .enumerate()
                .filter(|(_, s)| s.state == SlotState::Free && s.holds.is_some())
                .min_by_key(|(_, s)| self.rank(s))
                .map(|(i, _)| i);
            match lru {
                // The slot stays as a free staging slot; `acquire` hands it out first.
                Some(i) => self.slots[i].holds = None,
                None => return,
            }
        }
    }

    /// True when reads bypass the page cache (`O_DIRECT` accepted).
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// Why `O_DIRECT` is not in use, if it is not.
    pub fn note(&self) -> Option<&str> {
        self.note.as_deref()
    }

    pub fn readers(&self) -> usize {
        self.readers.len()
    }

    pub fn n_slots(&self) -> usize {
        self.slots.len()
    }

    /// Slots that can be handed out now: free, buffer home, no read pending. Equal to
    /// [`n_slots`](Self::n_slots) between tokens, also after a failed one.
    pub fn free_slots(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| {
                s.state == SlotState::Free
                    && s.buf.is_some()
                    && s.pending.load(Ordering::Acquire) == 0
            })
            .count()
    }

    /// Slots currently in flight.
    pub fn in_flight(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| s.state == SlotState::InFlight)
            .count()
    }

    /// Submits a read of `len` bytes at file offset `offset`; returns its ticket.
    pub fn submit(&mut self, offset: u64, len: usize) -> Ticket {
        self.count_use((offset, len));
        if self.cache_cap > 0 {
            let hit = self.slots.iter().position(|s| {
                s.state == SlotState::Free
                    && s.holds == Some((offset, len))
                    && s.buf.is_some()
                    && s.pending.load(Ordering::Acquire) == 0
            });
            if let Some(idx) = hit {
                let read_no = self.counters.submitted;
                self.counters.submitted += 1;
                self.counters.cache_hits += 1;
                self.counters.completed += 1;
                let s = &mut self.slots[idx];
                s.state = SlotState::Ready;
                s.busy_ns = 0;
                s.hit = true;
                s.last_use = read_no;
                self.gens[idx] += 1;
                return Ticket {
                    slot: idx,
                    gen: self.gens[idx],
                };
            }
            self.counters.cache_misses += 1;
        }
        let a = ALIGN as u64;
        let off = offset / a * a;
        let delta = (offset - off) as usize;
        let need = delta + len;
        let idx = self.acquire(round_up(need));
        let read_no = self.counters.submitted;
        let fault = FaultPlan::for_read(self.fault, read_no);
        let slot = &mut self.slots[idx];
        slot.state = SlotState::InFlight;
        slot.delta = delta;
        slot.len = len;
        slot.busy_ns = 0;
        slot.error = None;
        slot.read_no = read_no;
        slot.waiter_panic = fault == Some(FaultKind::WaiterPanic);
        slot.holds = None;
        slot.hit = false;
        slot.abandoned = false;
        slot.last_use = read_no;
        slot.region = (offset, len);
        slot.pending.fetch_add(1, Ordering::AcqRel);
        let buf = slot.buf.take().expect("free slot owns its buffer");
        self.gens[idx] += 1;
        self.counters.submitted += 1;
        let req = Req {
            slot: idx,
            buf,
            off,
            need,
            pending: slot.pending.clone(),
            fault: fault.filter(|&k| k != FaultKind::WaiterPanic),
        };
        let sent = self.req_tx.as_ref().map(|tx| tx.send(req));
        if let Some(Err(e)) = sent {
            // Readers gone (cannot happen while `self` lives): complete the slot as failed.
            let r = e.into_inner();
            r.pending.fetch_sub(1, Ordering::AcqRel);
            self.complete(Done {
                slot: r.slot,
                buf: r.buf,
                result: Err("reader pool stopped".into()),
                busy_ns: 0,
            });
        }
        Ticket {
            slot: idx,
            gen: self.gens[idx],
        }
    }

    /// A free slot with a buffer of at least `cap` bytes (allocating a new slot if needed).
    fn acquire(&mut self, cap: usize) -> usize {
        // A free slot holding no cached region, else a new slot: a read never takes a cached
        // region's slot (the region it reads competes for the cache when it is released, see
        // `evict_to_cap`). Memory: the cache's capacity plus the slots of the reads in flight.
        let mut found = None;
        for (i, s) in self.slots.iter().enumerate() {
            if s.state != SlotState::Free {
                continue;
            }
            if s.pending.load(Ordering::Acquire) != 0 || s.buf.is_none() {
                self.counters.reuse_violations += 1;
                continue;
            }
            if s.holds.is_some() && self.cache_cap > 0 {
                continue;
            }
            found = Some(i);
            break;
        }
        match found {
            Some(i) => {
                let s = &mut self.slots[i];
                if s.buf.as_ref().is_none_or(|b| b.len() < cap) {
                    s.buf = Some(AlignedBuf::new(cap).expect("staging slot allocation"));
                }
                i
            }
            None => {
                self.slots.push(Slot {
                    buf: Some(AlignedBuf::new(cap).expect("staging slot allocation")),
                    pending: Arc::new(AtomicU32::new(0)),
                    state: SlotState::Free,
                    delta: 0,
                    len: 0,
                    busy_ns: 0,
                    error: None,
                    read_no: 0,
                    waiter_panic: false,
                    holds: None,
                    last_use: 0,
                    hit: false,
                    abandoned: false,
                    region: (0, 0),
                });
                self.gens.push(0);
                self.slots.len() - 1
            }
        }
    }

    fn complete(&mut self, d: Done) {
        let s = &mut self.slots[d.slot];
        debug_assert_eq!(s.state, SlotState::InFlight);
        s.buf = Some(d.buf);
        s.busy_ns = d.busy_ns;
        self.counters.completed += 1;
        match d.result {
            Ok(()) => {
                s.state = SlotState::Ready;
                self.counters.bytes += s.len as u64;
                s.holds = Some(s.region);
            }
            Err(e) => {
                s.state = SlotState::Failed;
                s.error = Some(e);
                self.counters.failed += 1;
            }
        }
        if s.abandoned {
            s.abandoned = false;
            self.free_slot(d.slot);
        }
    }

    /// Marks slot `i` free (keeping the region it holds only while the cache is on).
    fn free_slot(&mut self, i: usize) {
        let s = &mut self.slots[i];
        s.state = SlotState::Free;
        if s.error.is_some() || self.cache_cap == 0 {
            s.holds = None;
        } else {
            self.evict_to_cap();
        }
    }

    /// Gives up ticket `t` without waiting: a completed slot is freed now, an in-flight one when
    /// its read completes (its bytes count in `counters.bytes`; with the cache on the region is
    /// kept like any other). For speculative reads the routing did not select.
    pub fn abandon(&mut self, t: Ticket) {
        if self.gens[t.slot] != t.gen {
            return;
        }
        // A pending injected waiter panic belongs to a wait that will not happen.
        self.slots[t.slot].waiter_panic = false;
        if self.slots[t.slot].state == SlotState::InFlight {
            self.slots[t.slot].abandoned = true;
        } else {
            self.free_slot(t.slot);
        }
    }

    /// Blocks until every abandoned read has completed (and its slot is free): called at the end
    /// of a token, so that between tokens every slot is free. Returns the ns spent blocked.
    pub fn reap(&mut self) -> u64 {
        let mut ns = 0;
        for i in 0..self.slots.len() {
            if self.slots[i].abandoned {
                let t = Ticket {
                    slot: i,
                    gen: self.gens[i],
                };
                ns += self.wait(t);
            }
        }
        ns
    }

    /// Blocks until the read of `t` has completed. Returns the ns spent blocked.
    pub fn wait(&mut self, t: Ticket) -> u64 {
        if self.slots[t.slot].waiter_panic {
            self.slots[t.slot].waiter_panic = false;
            panic!(
                "injected fault: panic in the engine thread waiting for expert read {}",
                self.slots[t.slot].read_no
            );
        }
        let start = Instant::now();
        let mut blocked = false;
        while self.slots[t.slot].state == SlotState::InFlight {
            blocked = true;
            match self.done_rx.recv() {
                Ok(d) => self.complete(d),
                Err(_) => {
                    // All readers exited: fail the outstanding slots rather than hang.
                    for s in self.slots.iter_mut() {
                        if s.state == SlotState::InFlight {
                            s.state = SlotState::Failed;
                            s.error = Some("reader pool stopped".into());
                            s.buf = AlignedBuf::new(round_up(s.delta + s.len));
                            s.pending.store(0, Ordering::Release);
                            if s.abandoned {
                                s.abandoned = false;
                                s.state = SlotState::Free;
                                s.holds = None;
                            }
                        }
                    }
                }
            }
        }
        if blocked {
            start.elapsed().as_nanos() as u64
        } else {
            0
        }
    }

    /// The bytes of a completed read, or the error it failed with.
    pub fn view(&self, t: Ticket) -> Result<&[u8], &str> {
        let s = &self.slots[t.slot];
        if self.gens[t.slot] != t.gen {
            return Err("stale ticket");
        }
        match s.state {
            SlotState::Ready => {
                let b = s.buf.as_ref().expect("ready slot owns its buffer");
                Ok(&b[s.delta..s.delta + s.len])
            }
            SlotState::Failed => Err(s.error.as_deref().unwrap_or("read failed")),
            _ => Err("read not completed"),
        }
    }

    /// Reader-busy ns and bytes of a completed read.
    pub fn io_of(&self, t: Ticket) -> (u64, u64) {
        let s = &self.slots[t.slot];
        (s.busy_ns, s.len as u64)
    }

    /// Returns a completed slot to the free list.
    pub fn release(&mut self, t: Ticket) {
        if self.gens[t.slot] != t.gen {
            return;
        }
        self.wait(t);
        self.free_slot(t.slot);
    }

    /// Waits for every in-flight read and frees every slot (after an interrupted token).
    pub fn drain(&mut self) {
        for i in 0..self.slots.len() {
            let t = Ticket {
                slot: i,
                gen: self.gens[i],
            };
            self.wait(t);
            self.slots[i].state = SlotState::Free;
        }
    }
}

impl Drop for ExpertFetcher {
    fn drop(&mut self) {
        self.req_tx = None;
        for h in self.readers.drain(..) {
            let _ = h.join();
        }
    }
}

/// One read, with its injected fault (if any) applied.
fn serve(src: &Source, r: &mut Req, delay: Duration) -> Result<(), String> {
    if !delay.is_zero() {
        std::thread::sleep(delay);
    }
    let eof = match r.fault {
        Some(FaultKind::Eio) => {
            return Err(std::io::Error::from_raw_os_error(libc::EIO).to_string())
        }
        Some(FaultKind::ReaderPanic) => panic!("injected fault: reader thread panic"),
        Some(FaultKind::ShortRead) => r.need / 2 / ALIGN * ALIGN,
        _ => usize::MAX,
    };
    src.read(&mut r.buf, r.off, r.need, eof)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn reader_loop(src: &Source, rx: Receiver<Req>, tx: Sender<Done>, delay: Duration) {
    while let Ok(mut r) = rx.recv() {
        let t0 = Instant::now();
        // A panic while serving one read fails that read; the buffer stays with `r` (only
        // borrowed by the closure), so it goes back to its slot, and this reader keeps serving.
        let result =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| serve(src, &mut r, delay)))
                .unwrap_or_else(|p| Err(format!("reader thread panicked: {}", panic_message(&*p))));
        let busy_ns = t0.elapsed().as_nanos() as u64;
        // Last touch of the buffer is above: the slot may be reused once this reaches zero and
        // the buffer is back with the owner.
        r.pending.fetch_sub(1, Ordering::AcqRel);
        let _ = tx.send(Done {
            slot: r.slot,
            buf: r.buf,
            result,
            busy_ns,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn sample(dir: &Path) -> (std::path::PathBuf, Vec<u8>) {
        let p = dir.join("fetch-sample.bin");
        let data: Vec<u8> = (0..5 * ALIGN + 123).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::File::create(&p).unwrap().write_all(&data).unwrap();
        (p, data)
    }

    #[test]
    fn reads_match_file_direct_and_buffered() {
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let (p, data) = sample(dir.path());
        for force in [false, true] {
            let hooks = FetchHooks {
                force_buffered: force,
                ..Default::default()
            };
            let mut f = ExpertFetcher::new(&p, 2, hooks).unwrap();
            assert_eq!(f.is_direct(), !force && f.note().is_none());
            let regions = [
                (0u64, 100usize),
                (4096, 8192),
                (8000, 5000),
                (4 * 4096, 4096 + 123),
            ];
            let ts: Vec<Ticket> = regions.iter().map(|&(o, l)| f.submit(o, l)).collect();
            for (t, &(o, l)) in ts.iter().zip(&regions) {
                f.wait(*t);
                assert_eq!(f.view(*t).unwrap(), &data[o as usize..o as usize + l]);
            }
            for t in ts {
                f.release(t);
            }
            // Past the end of the file: a failed read, not a panic.
            let t = f.submit(5 * 4096, 4096);
            f.wait(t);
            assert!(f.view(t).is_err());
            f.release(t);
            assert_eq!(f.counters.reuse_violations, 0);
        }
    }

    /// The expert cache: off, nothing is served from memory; on, a released region is served
    /// again without a read (same bytes), the cache never holds more than its capacity, the
    /// least used region is evicted first, and a failed read is never cached.
    #[test]
    fn expert_cache_hits_bounds_and_evicts_the_least_used() {
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let (p, data) = sample(dir.path());
        let read = |f: &mut ExpertFetcher, o: u64, l: usize| {
            let t = f.submit(o, l);
            f.wait(t);
            assert_eq!(f.view(t).unwrap(), &data[o as usize..o as usize + l]);
            let hit = f.was_hit(t);
            f.release(t);
            hit
        };
        let mut f = ExpertFetcher::new(&p, 2, FetchHooks::default()).unwrap();
        assert!(
            !read(&mut f, 0, 1000) && !read(&mut f, 0, 1000),
            "cache off"
        );
        assert_eq!((f.counters.cache_hits, f.counters.bytes), (0, 2000));
        // Room for two 1000-byte regions.
        f.set_cache_bytes(2000);
        let (a, b, c) = (
            (0u64, 1000usize),
            (4096u64, 1000usize),
            (8192u64, 1000usize),
        );
        assert!(!read(&mut f, a.0, a.1), "first read of a");
        assert!(!read(&mut f, b.0, b.1));
        assert!(read(&mut f, a.0, a.1), "a again: from the cache");
        assert!(f.cached_bytes() <= 2000);
        // c, used once like b but newer, is not admitted: a (used twice) and b stay.
        assert!(!read(&mut f, c.0, c.1));
        assert!(f.cached_bytes() <= 2000, "{}", f.cached_bytes());
        assert!(read(&mut f, a.0, a.1), "a stays");
        assert!(read(&mut f, b.0, b.1), "b stays");
        // Used more often than b, c takes b's place.
        assert!(!read(&mut f, c.0, c.1));
        assert!(!read(&mut f, c.0, c.1));
        assert!(read(&mut f, c.0, c.1), "c admitted");
        assert!(!read(&mut f, b.0, b.1), "b evicted");
        assert!(f.cached_bytes() <= 2000, "{}", f.cached_bytes());
        // The same offset with another length is another region.
        assert!(!read(&mut f, a.0, 500));
        assert_eq!(f.counters.reuse_violations, 0);
        assert_eq!(f.counters.submitted, f.counters.completed);
        // A failed read (past the end) is not cached.
        f.set_cache_bytes(1 << 20);
        for _ in 0..2 {
            let t = f.submit(5 * 4096, 4096);
            f.wait(t);
            assert!(f.view(t).is_err() && !f.was_hit(t));
            f.release(t);
        }
        // Two reads of one region in flight at once use two slots, both correct.
        let (t1, t2) = (f.submit(c.0, c.1), f.submit(4096 * 3, 700));
        f.wait(t1);
        f.wait(t2);
        assert_eq!(f.view(t2).unwrap(), &data[4096 * 3..4096 * 3 + 700]);
        f.release(t1);
        f.release(t2);
        f.set_cache_bytes(0);
        assert_eq!(f.cached_bytes(), 0);
        assert!(!read(&mut f, a.0, a.1), "off again: no hits");
    }

    /// An abandoned read frees its slot when it completes, with no `wait` on it: in flight it
    /// stays out of `acquire`'s hands (no reuse violation), `reap` leaves every slot free, the
    /// slot's bytes count as read, and with the cache on the abandoned region is served later.
    #[test]
    fn abandoned_reads_free_their_slots_and_may_be_cached() {
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let (p, data) = sample(dir.path());
        for cache in [0u64, 1 << 20] {
            let hooks = FetchHooks {
                reader_delay: Duration::from_millis(20),
                ..Default::default()
            };
            let mut f = ExpertFetcher::new(&p, 1, hooks).unwrap();
            f.set_cache_bytes(cache);
            let spec = f.submit(4096, 1000);
            f.abandon(spec);
            assert_eq!(f.in_flight(), 1, "still in flight after abandon");
            // A new read meanwhile gets another slot and the right bytes.
            let t = f.submit(0, 100);
            f.wait(t);
            assert_eq!(f.view(t).unwrap(), &data[..100]);
            f.release(t);
            f.reap();
            assert_eq!(f.free_slots(), f.n_slots());
            assert_eq!(f.counters.reuse_violations, 0);
            assert_eq!(f.counters.bytes, 1100);
            // Abandoning a stale ticket does nothing.
            f.abandon(spec);
            assert_eq!(f.free_slots(), f.n_slots());
            let again = f.submit(4096, 1000);
            assert_eq!(f.was_hit(again), cache > 0, "cache {cache}");
            f.wait(again);
            assert_eq!(f.view(again).unwrap(), &data[4096..5096]);
            f.abandon(again); // completed: freed at once
            assert_eq!(f.free_slots(), f.n_slots());
        }
    }

    /// A token reads the layers in order, a cyclic scan: with five regions and room for three,
    /// least-recently-used eviction would never hit; the cache keeps three regions and hits
    /// them on every later cycle (3 of 5 from the second cycle on).
    #[test]
    fn expert_cache_survives_a_cyclic_scan_larger_than_itself() {
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let (p, data) = sample(dir.path());
        let mut f = ExpertFetcher::new(&p, 1, FetchHooks::default()).unwrap();
        f.set_cache_bytes(3000);
        let mut hits = Vec::new();
        for _cycle in 0..6 {
            let mut h = 0;
            for r in 0..5u64 {
                let o = r * 4096;
                let t = f.submit(o, 1000);
                f.wait(t);
                assert_eq!(f.view(t).unwrap(), &data[o as usize..o as usize + 1000]);
                h += f.was_hit(t) as u32;
                f.release(t);
                assert!(f.cached_bytes() <= 3000);
            }
            hits.push(h);
        }
        assert_eq!(hits[0], 0);
        assert!(hits[1..].iter().all(|&h| h == 3), "{hits:?}");
    }
}
