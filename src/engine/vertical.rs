//! The second core of the vertical (stage-major) schedule, paper §4.4. With δd ≥ 1
//! the dense FFN of step ℓ+δd has its input (the residual entering step ℓ) as soon as step ℓ
//! begins; with δe ≥ 1 the experts routed at step ℓ are needed only at the end of step ℓ+δe.
//! The engine thread sends that work here ([`Lane::submit`]) and runs the attention of the next
//! steps meanwhile; it collects each result where the sequential schedule would have computed
//! it ([`Lane::wait`]). The work runs the same functions on the same inputs, so the tokens are
//! bit-identical to the sequential schedule.
//!
//! The engine's `threads` are split between the two cores' pools ([`Cores::new`]): ⌈n/2⌉ for
//! the attention stream, ⌊n/2⌋ (at least 1) for the dense/expert stream; with one thread the
//! two streams share the core. The second core is a scoped thread that lives for one token
//! (no state survives a token, so an interrupted token leaves nothing behind).

use super::layer::dense;
use super::moe::{run_experts, Routed};
use super::scratch::{DenseScratch, ExpertScratch};
use super::weights::{RowMajorWeights, Weights};
use crate::format::CflowFile;
use crate::kernels::pool::ThreadPool;
use crate::kernels::Isa;
use crate::model::ModelConfig;
use crossbeam_channel::{Receiver, Sender, TryRecvError};
use std::time::{Duration, Instant};

/// Whether the vertical schedule places the experts on the second core: the engine thread
/// always runs the attention stream, the second core the delayed dense stream (δd ≥ 1; with
/// δd = 0 the dense FFN needs this layer's attention and stays with it); the experts (δe ≥ 1)
/// go to the core with fewer bytes per token so far, to balance the two.
pub fn experts_aside(layers: &[crate::telemetry::StreamBytes], dense_delay: usize) -> bool {
    let (a, d) = layers
        .iter()
        .fold((0u64, 0u64), |(a, d), b| (a + b.attn, d + b.dense));
    let (main, side) = if dense_delay >= 1 { (a, d) } else { (a + d, 0) };
    side < main
}

/// The pools and buffers of the two cores.
pub struct Cores {
    /// The engine thread's pool for the attention stream.
    pub main: ThreadPool,
    /// The second core's pool for the dense and expert streams.
    pub side: ThreadPool,
    pub dense: DenseScratch,
    pub experts: ExpertScratch,
    /// Jobs the second core ran over the engine's life.
    pub jobs: u64,
}

impl Cores {
    pub fn new(threads: usize, cfg: &ModelConfig) -> Cores {
        let side = (threads / 2).max(1);
        Cores {
            main: ThreadPool::new(threads.saturating_sub(side).max(1)),
            side: ThreadPool::new(side),
            dense: DenseScratch::new(cfg),
            experts: ExpertScratch::new(cfg),
            jobs: 0,
        }
    }
}

/// Which result a job produces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Key {
    /// The dense FFN output of a step.
    Dense(usize),
    /// The routed-expert sum of the routing made at a step.
    Experts(usize),
}

/// Work for the second core.
pub enum Job {
    /// FFN of `block` on `input` (Norm is applied there).
    Dense {
        l: usize,
        block: usize,
        input: Vec<f32>,
    },
    /// Experts `sel` of `block` on the router activation `act`.
    Experts {
        from: usize,
        block: usize,
        act: Vec<f32>,
        sel: Vec<(usize, f32)>,
    },
}

/// A finished job.
pub struct Done {
    pub key: Key,
    /// [d] the FFN output or the weighted expert sum.
    pub out: Vec<f32>,
    pub bytes: u64,
    /// Compute time on the second core.
    pub ns: u64,
}

/// The engine thread's end of the second core.
pub struct Lane {
    jobs: Sender<Job>,
    done: Receiver<Done>,
    /// Results that arrived before they were asked for.
    early: Vec<Done>,
    /// Jobs submitted so far.
    pub submitted: u64,
}

/// How long a waiting side spins before it blocks (a handoff per layer; blocking costs a
/// futex wake-up, spinning costs the core).
const SPIN: Duration = Duration::from_micros(200);

fn recv_spin<T>(rx: &Receiver<T>) -> Option<T> {
    let t0 = Instant::now();
    let mut n = 0u32;
    loop {
        match rx.try_recv() {
            Ok(v) => return Some(v),
            Err(TryRecvError::Disconnected) => return None,
            Err(TryRecvError::Empty) => {
                n += 1;
                if n.is_multiple_of(64) && t0.elapsed() > SPIN {
                    return rx.recv().ok();
                }
                std::hint::spin_loop();
            }
        }
    }
}

impl Lane {
    pub fn submit(&mut self, job: Job) {
        self.submitted += 1;
        // The second core outlives the lane (scoped thread); a send fails only if it panicked,
        // which `wait` then reports.
        let _ = self.jobs.send(job);
    }

    /// The result `key` (submitted earlier).
    ///
    /// Panics if the second core died (a panic in a kernel); the scope re-raises its panic.
    pub fn wait(&mut self, key: Key) -> Done {
        if let Some(i) = self.early.iter().position(|d| d.key == key) {
            return self.early.swap_remove(i);
        }
        loop {
            let d = recv_spin(&self.done).expect("the vertical schedule's second core stopped");
            if d.key == key {
                return d;
            }
            self.early.push(d);
        }
    }
}

/// The parts of [`Weights`] that can cross to the second core (its pool is its own).
#[derive(Clone, Copy)]
pub struct Shared<'a> {
    pub file: &'a CflowFile,
    pub cfg: &'a ModelConfig,
    pub isa: Isa,
    pub q8: bool,
    pub rowmajor: Option<&'a RowMajorWeights>,
    pub oracle: bool,
}

impl<'a> Shared<'a> {
    pub fn of(w: &Weights<'a>) -> Shared<'a> {
        Shared {
            file: w.file,
            cfg: w.cfg,
            isa: w.isa,
            q8: w.q8,
            rowmajor: w.rowmajor,
            oracle: w.oracle,
        }
    }
}

/// Runs `body` with a second core serving the jobs it submits to its lane.
pub fn with_second_core<R>(
    sh: Shared<'_>,
    side: &mut ThreadPool,
    dense_s: &mut DenseScratch,
    expert_s: &mut ExpertScratch,
    body: impl FnOnce(&mut Lane) -> R,
) -> R {
    let (jtx, jrx) = crossbeam_channel::unbounded::<Job>();
    let (dtx, drx) = crossbeam_channel::unbounded::<Done>();
    std::thread::scope(|sc| {
        std::thread::Builder::new()
            .name("cflow-vertical".into())
            .spawn_scoped(sc, move || serve(sh, side, jrx, dtx, dense_s, expert_s))
            .expect("spawn the vertical schedule's second core");
        let mut lane = Lane {
            jobs: jtx,
            done: drx,
            early: Vec::new(),
            submitted: 0,
        };
        let r = body(&mut lane);
        drop(lane); // closes the job channel: the second core returns and the scope joins it
        r
    })
}

fn serve(
    sh: Shared<'_>,
    side: &mut ThreadPool,
    jobs: Receiver<Job>,
    done: Sender<Done>,
    ds: &mut DenseScratch,
    es: &mut ExpertScratch,
) {
    let w = Weights {
        file: sh.file,
        cfg: sh.cfg,
        pool: side,
        isa: sh.isa,
        q8: sh.q8,
        rowmajor: sh.rowmajor,
        oracle: sh.oracle,
    };
    while let Some(job) = recv_spin(&jobs) {
        let t0 = Instant::now();
        let (key, out, bytes) = match job {
            Job::Dense { l, block, input } => {
                let lv = &w.file.layers[block];
                dense(&w, lv, block, &input, ds);
                (Key::Dense(l), ds.out.clone(), super::layer::dense_bytes(lv))
            }
            Job::Experts {
                from,
                block,
                act,
                sel,
            } => {
                let lv = &w.file.layers[block];
                let r = Routed {
                    block,
                    act: &act,
                    sel: &sel,
                };
                let b = run_experts(&w, lv, &[], r, &[], es);
                (Key::Experts(from), es.acc.clone(), b)
            }
        };
        let ns = t0.elapsed().as_nanos() as u64;
        if done
            .send(Done {
                key,
                out,
                bytes,
                ns,
            })
            .is_err()
        {
            return;
        }
    }
}
