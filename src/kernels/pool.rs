//! Persistent worker pool for the parallel matvecs of decode. The caller thread participates;
//! `n - 1` workers spin briefly on an epoch counter between jobs (a decode step issues hundreds
//! of small matvecs per token, so wake-up latency matters) and park on a condvar when idle.
//!
//! Tasks are claimed with a compare-and-swap on one word holding (epoch, next task), so a worker
//! that wakes late can never claim work of a finished job, and the caller waits only for tasks
//! that were actually claimed — not for descheduled workers. That keeps an oversubscribed
//! machine (other processes on every core) from stalling each matvec on a sleeping worker.
//!
//! A task that panics (on a worker or on the caller) is caught, still counted as finished, and
//! the first panic is re-raised on the caller once every claimed task is done: `run` never
//! unwinds while a worker may still be using the job, and a worker panic never hangs the caller.
//!
//! With [`ThreadPool::set_timing`] on, `run` also adds its wall time on the caller's clock to a
//! [`PoolTime`]: all of it, and the part spent waiting for other threads' tasks after the
//! caller's own were done (`bench decode` splits a decode step with it).
//!
//! With [`ThreadPool::set_thread_timing`] on, every thread (the caller as thread 0, worker `i`
//! as thread `i`) also adds the wall time it spent running tasks, and how many it ran, to its own
//! counters ([`ThreadBusy`], read with [`ThreadPool::take_thread_time`]): two clock reads per
//! job a thread takes part in; off, one relaxed load per job.

use std::any::Any;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

type JobFn = dyn Fn(usize) + Sync;

#[derive(Clone, Copy)]
struct JobPtr(*const JobFn);
// SAFETY: the pointer is only dereferenced for a task claimed under the job's epoch; the
// submitting `run` call does not return before every claimed task has finished, so the referent
// (which is `Sync`) outlives every use.
unsafe impl Send for JobPtr {}

struct Shared {
    /// Current job and its epoch (read together).
    job: Mutex<(u32, Option<JobPtr>, usize)>,
    /// High 32 bits: epoch; low 32 bits: next task index.
    claim: AtomicU64,
    /// Tasks finished in the current epoch.
    done: AtomicUsize,
    /// Epoch counter workers watch.
    epoch: AtomicU64,
    quit: AtomicBool,
    sleeping: AtomicUsize,
    lock: Mutex<()>,
    cv: Condvar,
    spin: Duration,
    /// First panic payload of the current job (re-raised by `run`).
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    /// Per-thread busy timing on (`set_thread_timing`).
    thread_timing: AtomicBool,
    /// Per thread (0 = the caller): ns spent running tasks, and tasks run, while timing was on.
    busy_ns: Vec<AtomicU64>,
    busy_tasks: Vec<AtomicU64>,
}

impl Shared {
    /// Runs every task of `epoch` this thread can claim; returns how many it ran. With per-thread
    /// timing on, adds their wall time and count to thread `me`'s counters.
    fn claim_and_run(
        &self,
        me: usize,
        epoch: u32,
        n: usize,
        f: &(dyn Fn(usize) + Sync + '_),
    ) -> usize {
        let t0 = self
            .thread_timing
            .load(Ordering::Relaxed)
            .then(Instant::now);
        let mut mine = 0;
        while let Some(t) = self.claim(epoch, n) {
            self.run_task(f, t);
            mine += 1;
        }
        if let (Some(t0), true) = (t0, mine > 0) {
            let ns = t0.elapsed().as_nanos() as u64;
            if let (Some(b), Some(k)) = (self.busy_ns.get(me), self.busy_tasks.get(me)) {
                b.fetch_add(ns, Ordering::Relaxed);
                k.fetch_add(mine as u64, Ordering::Relaxed);
            }
        }
        mine
    }

    /// Runs one task, catching a panic so the task still counts as finished.
    fn run_task(&self, f: &(dyn Fn(usize) + Sync + '_), t: usize) {
        if let Err(payload) = catch_unwind(AssertUnwindSafe(|| f(t))) {
            let mut slot = self.panic.lock().unwrap_or_else(|e| e.into_inner());
            slot.get_or_insert(payload);
        }
    }

    /// Claims the next task of `epoch`, if any.
    fn claim(&self, epoch: u32, n: usize) -> Option<usize> {
        let mut cur = self.claim.load(Ordering::Acquire);
        loop {
            if (cur >> 32) as u32 != epoch {
                return None;
            }
            let idx = (cur & 0xFFFF_FFFF) as usize;
            if idx >= n {
                return None;
            }
            match self.claim.compare_exchange_weak(
                cur,
                cur + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(idx),
                Err(v) => cur = v,
            }
        }
    }
}

/// The caller-side wall time of [`ThreadPool::run`] calls while timing was on: how many ran,
/// their whole time, and the part of it the caller spent waiting for tasks other threads had
/// claimed (its own were done). Measured with `Instant` on the caller thread.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolTime {
    pub runs: u64,
    pub ns_in_runs: u64,
    pub ns_waiting: u64,
}

impl PoolTime {
    /// Adds another span's times.
    pub fn add(&mut self, o: PoolTime) {
        self.runs += o.runs;
        self.ns_in_runs += o.ns_in_runs;
        self.ns_waiting += o.ns_waiting;
    }
}

/// One pool thread's work while per-thread timing was on: wall ns spent running tasks, and
/// how many it ran. Measured with `Instant` on that thread.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThreadBusy {
    pub busy_ns: u64,
    pub tasks: u64,
}

/// A fixed-size pool. `run(n, f)` calls `f(0..n)` spread over all threads and returns when done.
pub struct ThreadPool {
    n_threads: usize,
    shared: Arc<Shared>,
    handles: Vec<std::thread::JoinHandle<()>>,
    epoch: std::cell::Cell<u32>,
    timing: std::cell::Cell<bool>,
    time: std::cell::Cell<PoolTime>,
}

impl ThreadPool {
    pub fn new(n_threads: usize) -> ThreadPool {
        let n_threads = n_threads.max(1);
        let shared = Arc::new(Shared {
            job: Mutex::new((0, None, 0)),
            claim: AtomicU64::new(0),
            done: AtomicUsize::new(0),
            epoch: AtomicU64::new(0),
            quit: AtomicBool::new(false),
            sleeping: AtomicUsize::new(0),
            lock: Mutex::new(()),
            cv: Condvar::new(),
            panic: Mutex::new(None),
            thread_timing: AtomicBool::new(false),
            busy_ns: (0..n_threads).map(|_| AtomicU64::new(0)).collect(),
            busy_tasks: (0..n_threads).map(|_| AtomicU64::new(0)).collect(),
            spin: Duration::from_micros(
                std::env::var("CFLOW_SPIN_US")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(300),
            ),
        });
        let handles = (1..n_threads)
            .map(|i| {
                let s = shared.clone();
                std::thread::Builder::new()
                    .name(format!("cflow-worker-{i}"))
                    .spawn(move || worker(s, i))
                    .expect("spawn worker thread")
            })
            .collect();
        ThreadPool {
            n_threads,
            shared,
            handles,
            epoch: std::cell::Cell::new(0),
            timing: std::cell::Cell::new(false),
            time: std::cell::Cell::new(PoolTime::default()),
        }
    }

    /// Turns the caller-side timing of [`ThreadPool::run`] on or off (off by default: three
    /// clock reads per run).
    pub fn set_timing(&self, on: bool) {
        self.timing.set(on);
    }

    /// Turns the per-thread busy timing on or off (off by default; see the module doc).
    pub fn set_thread_timing(&self, on: bool) {
        self.shared.thread_timing.store(on, Ordering::Relaxed);
    }

    /// Each thread's [`ThreadBusy`] since the last call (index 0: the caller), and a fresh
    /// start. All zero while per-thread timing is off.
    pub fn take_thread_time(&self) -> Vec<ThreadBusy> {
        let s = &*self.shared;
        s.busy_ns
            .iter()
            .zip(&s.busy_tasks)
            .map(|(b, k)| ThreadBusy {
                busy_ns: b.swap(0, Ordering::Relaxed),
                tasks: k.swap(0, Ordering::Relaxed),
            })
            .collect()
    }

    /// The [`PoolTime`] summed since the last call, and a fresh start.
    pub fn take_time(&self) -> PoolTime {
        self.time.take()
    }

    /// Adds one run to the [`PoolTime`]: it began at `t0`, and the caller began to wait for the
    /// other threads at `wait` (None: it never waited).
    fn record(&self, t0: Option<Instant>, wait: Option<Instant>) {
        let Some(t0) = t0 else { return };
        let end = Instant::now();
        let mut t = self.time.get();
        t.runs += 1;
        t.ns_in_runs += end.duration_since(t0).as_nanos() as u64;
        if let Some(w) = wait {
            t.ns_waiting += end.duration_since(w).as_nanos() as u64;
        }
        self.time.set(t);
    }

    pub fn threads(&self) -> usize {
        self.n_threads
    }

    /// Runs `f(i, &mut items[i])` for every item across the pool, each item once, by one
    /// thread; blocks until all finished.
    pub fn for_each_mut<T: Send>(&self, items: &mut [T], f: &(dyn Fn(usize, &mut T) + Sync)) {
        struct Items<T>(*mut T);
        // SAFETY: the pointer is only used to hand out `&mut items[i]` for distinct `i`
        // (below), and `T: Send` lets each element move to the thread that runs its task.
        unsafe impl<T: Send> Sync for Items<T> {}
        let p = Items(items.as_mut_ptr());
        let n = items.len();
        self.run(n, &|i| {
            let p = &p;
            // SAFETY: `run` calls every task index in 0..n exactly once and returns only after
            // all calls ended, so each `&mut items[i]` is the only reference to that element
            // while it lives, and `items` outlives it.
            let item = unsafe { &mut *p.0.add(i) };
            f(i, item)
        });
    }

    /// Runs `f(task)` for every task in `0..n_tasks` across the pool; blocks until all finished.
    pub fn run(&self, n_tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        if n_tasks == 0 {
            return;
        }
        let t0 = self.timing.get().then(Instant::now);
        if self.n_threads == 1 || n_tasks == 1 {
            let tt = self
                .shared
                .thread_timing
                .load(Ordering::Relaxed)
                .then(Instant::now);
            for t in 0..n_tasks {
                f(t);
            }
            if let Some(tt) = tt {
                self.shared.busy_ns[0].fetch_add(tt.elapsed().as_nanos() as u64, Ordering::Relaxed);
                self.shared.busy_tasks[0].fetch_add(n_tasks as u64, Ordering::Relaxed);
            }
            self.record(t0, None);
            return;
        }
        assert!(n_tasks < u32::MAX as usize);
        let s = &*self.shared;
        let epoch = self.epoch.get().wrapping_add(1);
        self.epoch.set(epoch);
        // SAFETY: we erase the lifetime of `f` to publish it to the workers. A worker only calls
        // it for a task it claimed under this epoch, and this call does not return until all
        // claimed tasks are done (`done == n_tasks`), so `f` outlives every call.
        let ptr: *const JobFn = unsafe {
            std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), *const JobFn>(f as *const _)
        };
        s.done.store(0, Ordering::Relaxed);
        *s.job.lock().expect("pool lock") = (epoch, Some(JobPtr(ptr)), n_tasks);
        s.claim.store((epoch as u64) << 32, Ordering::Release);
        s.epoch.store(epoch as u64, Ordering::Release);
        if s.sleeping.load(Ordering::Acquire) > 0 {
            let _g = s.lock.lock().expect("pool lock");
            s.cv.notify_all();
        }
        let mine = s.claim_and_run(0, epoch, n_tasks, f);
        s.done.fetch_add(mine, Ordering::AcqRel);
        let wait = t0.map(|_| Instant::now());
        let mut spins = 0u32;
        while s.done.load(Ordering::Acquire) != n_tasks {
            spins += 1;
            if spins < 4096 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        self.record(t0, wait);
        let payload = s.panic.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(p) = payload {
            resume_unwind(p);
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.quit.store(true, Ordering::Release);
        {
            let _g = self.shared.lock.lock().expect("pool lock");
            self.shared.cv.notify_all();
        }
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

fn worker(s: Arc<Shared>, me: usize) {
    let mut seen = 0u64;
    loop {
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            if s.quit.load(Ordering::Acquire) {
                return;
            }
            if s.epoch.load(Ordering::Acquire) != seen {
                break;
            }
            spins += 1;
            if spins.is_multiple_of(256) && start.elapsed() > s.spin {
                s.sleeping.fetch_add(1, Ordering::AcqRel);
                let mut g = s.lock.lock().expect("pool lock");
                while s.epoch.load(Ordering::Acquire) == seen && !s.quit.load(Ordering::Acquire) {
                    g = s.cv.wait(g).expect("pool lock");
                }
                drop(g);
                s.sleeping.fetch_sub(1, Ordering::AcqRel);
            } else {
                std::hint::spin_loop();
            }
        }
        seen = s.epoch.load(Ordering::Acquire);
        let (epoch, job, n) = *s.job.lock().expect("pool lock");
        let Some(JobPtr(p)) = job else { continue };
        // SAFETY: `f` is only called for tasks claimed under `epoch`, whose submitter waits
        // for every one of them before the referent can go away.
        let f: &JobFn = unsafe { &*p };
        let mine = s.claim_and_run(me, epoch, n, f);
        if mine > 0 {
            s.done.fetch_add(mine, Ordering::AcqRel);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    /// Timing counts runs and their caller-side time only while on; the wait is part of the
    /// run's time; `take_time` starts afresh.
    #[test]
    fn timing_counts_runs_only_while_on() {
        for threads in [1, 2] {
            let pool = ThreadPool::new(threads);
            let nap = |_| std::thread::sleep(Duration::from_millis(3));
            pool.run(2, &nap);
            assert_eq!(pool.take_time(), PoolTime::default(), "off by default");
            pool.set_timing(true);
            pool.run(2, &nap);
            pool.run(1, &nap);
            pool.run(0, &nap);
            let t = pool.take_time();
            assert_eq!(t.runs, 2, "threads {threads}: runs with tasks are counted");
            assert!(t.ns_in_runs >= 6_000_000, "{t:?}");
            assert!(t.ns_waiting <= t.ns_in_runs, "{t:?}");
            if threads == 1 {
                assert_eq!(t.ns_waiting, 0, "one thread never waits");
            }
            assert_eq!(pool.take_time(), PoolTime::default(), "take resets");
            pool.set_timing(false);
            pool.run(2, &nap);
            assert_eq!(pool.take_time(), PoolTime::default());
        }
    }

    /// Per-thread timing counts every task on some thread, only while on; take resets.
    #[test]
    fn thread_timing_counts_every_task_once() {
        for threads in [1, 3] {
            let pool = ThreadPool::new(threads);
            let nap = |_| std::thread::sleep(Duration::from_millis(1));
            pool.run(4, &nap);
            let off = pool.take_thread_time();
            assert_eq!(off.len(), threads);
            assert!(
                off.iter().all(|b| *b == ThreadBusy::default()),
                "off by default"
            );
            pool.set_thread_timing(true);
            pool.run(6, &nap);
            pool.run(1, &nap);
            let t = pool.take_thread_time();
            assert_eq!(t.iter().map(|b| b.tasks).sum::<u64>(), 7, "{t:?}");
            assert!(t[0].tasks >= 1, "the caller takes part: {t:?}");
            for b in &t {
                assert!(b.busy_ns >= b.tasks * 1_000_000, "{t:?}");
            }
            assert!(
                pool.take_thread_time().iter().all(|b| b.tasks == 0),
                "take resets"
            );
            pool.set_thread_timing(false);
            pool.run(4, &nap);
            assert!(pool.take_thread_time().iter().all(|b| b.tasks == 0));
        }
    }

    #[test]
    fn every_task_runs_exactly_once() {
        for threads in 1..=3 {
            let pool = ThreadPool::new(threads);
            for n in [0usize, 1, 2, 7, 100] {
                let hits: Vec<AtomicU32> = (0..n).map(|_| AtomicU32::new(0)).collect();
                for _ in 0..50 {
                    pool.run(n, &|t| {
                        hits[t].fetch_add(1, Ordering::Relaxed);
                    });
                }
                assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 50));
            }
        }
    }

    #[test]
    fn a_panicking_task_is_reraised_on_the_caller_and_the_pool_keeps_working() {
        let pool = ThreadPool::new(3);
        for bad in [0usize, 5, 63] {
            let hits: Vec<AtomicU32> = (0..64).map(|_| AtomicU32::new(0)).collect();
            let r = catch_unwind(AssertUnwindSafe(|| {
                pool.run(64, &|t| {
                    hits[t].fetch_add(1, Ordering::Relaxed);
                    if t == bad {
                        panic!("task {t} failed");
                    }
                })
            }));
            let msg = r.expect_err("the panic must reach the caller");
            assert_eq!(
                msg.downcast_ref::<String>().unwrap(),
                &format!("task {bad} failed")
            );
            // Every task ran exactly once before `run` unwound (none still in flight).
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
            // The pool is still usable and the panic does not leak into the next job.
            let sum = AtomicUsize::new(0);
            pool.run(64, &|t| {
                sum.fetch_add(t, Ordering::Relaxed);
            });
            assert_eq!(sum.load(Ordering::Relaxed), 64 * 63 / 2);
        }
    }

    #[test]
    fn late_workers_never_run_stale_jobs() {
        // Many tiny jobs in a row with a short spin: workers often wake after the job finished.
        let pool = ThreadPool::new(3);
        for round in 0..2000u32 {
            let hits: Vec<AtomicU32> = (0..3).map(|_| AtomicU32::new(0)).collect();
            pool.run(3, &|t| {
                hits[t].fetch_add(round + 1, Ordering::Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == round + 1));
        }
    }
}
