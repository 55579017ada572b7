//! Persistent worker pool for the parallel matvecs of decode. The caller thread participates;
//! `n - 1` workers spin briefly on an epoch counter between jobs (a decode step issues hundreds
//! of small matvecs per token, so wake-up latency matters) and park on a condvar when idle.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

type JobFn = dyn Fn(usize) + Sync;

struct Shared {
    epoch: AtomicU64,
    /// The current job: a type-erased `&dyn Fn(task)`, valid while `pending > 0`.
    job: Mutex<Option<JobPtr>>,
    next: AtomicUsize,
    n_tasks: AtomicUsize,
    pending: AtomicUsize,
    quit: AtomicBool,
    sleeping: AtomicUsize,
    lock: Mutex<()>,
    cv: Condvar,
    spin: Duration,
}

#[derive(Clone, Copy)]
struct JobPtr(*const JobFn);
// SAFETY: the pointer is only dereferenced while the submitting `run` call is blocked waiting
// for all workers, so the referent (which is `Sync`) outlives every use.
unsafe impl Send for JobPtr {}

/// A fixed-size pool. `run(n, f)` calls `f(0..n)` spread over all threads and returns when done.
pub struct ThreadPool {
    n_threads: usize,
    shared: Arc<Shared>,
    handles: Vec<std::thread::JoinHandle<()>>,
}

impl ThreadPool {
    pub fn new(n_threads: usize) -> ThreadPool {
        let n_threads = n_threads.max(1);
        let shared = Arc::new(Shared {
            epoch: AtomicU64::new(0),
            job: Mutex::new(None),
            next: AtomicUsize::new(0),
            n_tasks: AtomicUsize::new(0),
            pending: AtomicUsize::new(0),
            quit: AtomicBool::new(false),
            sleeping: AtomicUsize::new(0),
            lock: Mutex::new(()),
            cv: Condvar::new(),
            spin: Duration::from_micros(
                std::env::var("CFLOW_SPIN_US")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(2000),
            ),
        });
        let handles = (1..n_threads)
            .map(|i| {
                let s = shared.clone();
                std::thread::Builder::new()
                    .name(format!("cflow-worker-{i}"))
                    .spawn(move || worker(s))
                    .expect("spawn worker thread")
            })
            .collect();
        ThreadPool {
            n_threads,
            shared,
            handles,
        }
    }

    pub fn threads(&self) -> usize {
        self.n_threads
    }

    /// Runs `f(task)` for every task in `0..n_tasks` across the pool; blocks until all finished.
    pub fn run(&self, n_tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        if n_tasks == 0 {
            return;
        }
        if self.n_threads == 1 || n_tasks == 1 {
            for t in 0..n_tasks {
                f(t);
            }
            return;
        }
        let s = &*self.shared;
        // SAFETY: we erase the lifetime of `f` to publish it to the workers. This call does not
        // return until `pending` drops to zero, i.e. until no worker can touch `f` any more.
        let ptr: *const JobFn = unsafe {
            std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), *const JobFn>(f as *const _)
        };
        *s.job.lock().expect("pool lock") = Some(JobPtr(ptr));
        s.next.store(0, Ordering::Relaxed);
        s.n_tasks.store(n_tasks, Ordering::Relaxed);
        s.pending.store(self.n_threads - 1, Ordering::Relaxed);
        s.epoch.fetch_add(1, Ordering::AcqRel);
        if s.sleeping.load(Ordering::Acquire) > 0 {
            let _g = s.lock.lock().expect("pool lock");
            s.cv.notify_all();
        }
        loop {
            let t = s.next.fetch_add(1, Ordering::Relaxed);
            if t >= n_tasks {
                break;
            }
            f(t);
        }
        while s.pending.load(Ordering::Acquire) != 0 {
            std::hint::spin_loop();
        }
        *s.job.lock().expect("pool lock") = None;
    }
}

fn worker(s: Arc<Shared>) {
    let mut seen = 0u64;
    loop {
        // Wait for a new epoch: spin, then park.
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
            if spins.is_multiple_of(1024) && start.elapsed() > s.spin {
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
        let job = *s.job.lock().expect("pool lock");
        if let Some(JobPtr(p)) = job {
            // SAFETY: see `JobPtr`: the submitter waits for `pending == 0` before invalidating.
            let f: &JobFn = unsafe { &*p };
            let n = s.n_tasks.load(Ordering::Relaxed);
            loop {
                let t = s.next.fetch_add(1, Ordering::Relaxed);
                if t >= n {
                    break;
                }
                f(t);
            }
        }
        s.pending.fetch_sub(1, Ordering::AcqRel);
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

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
}
