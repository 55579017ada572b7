//! Where the decode steps' wall time went on the engine thread: inside pool runs (the matvecs
//! and attention, split over the threads), and of that the part the engine thread spent waiting
//! for tasks other threads had claimed; the rest is serial work on the engine thread alone
//! (norms, RoPE, SwiGLU, quantizing activations, bookkeeping) while the workers idle. Measured
//! with `Instant` on the engine thread (`ThreadPool::set_timing`), for the sequential schedule.
//! A step is a single-token forward pass that computes logits: every decode step, and the
//! prompt's last position when the prompt is not prefilled in one batch.

use crate::kernels::pool::PoolTime;

/// The summed split of some decode steps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepSplit {
    /// Decode steps measured.
    pub steps: u64,
    /// Their wall time (each step's `TokenStats::ns_total`).
    pub ns_steps: u64,
    /// Their pool runs on the engine thread's clock.
    pub pool: PoolTime,
}

impl StepSplit {
    /// Adds one step of `ns` nanoseconds whose pool runs took `pool`.
    pub fn add_step(&mut self, ns: u64, pool: PoolTime) {
        self.steps += 1;
        self.ns_steps += ns;
        self.pool.add(pool);
    }

    /// Adds another split's steps.
    pub fn add(&mut self, o: &StepSplit) {
        self.steps += o.steps;
        self.ns_steps += o.ns_steps;
        self.pool.add(o.pool);
    }

    /// Serial time: the steps' time outside pool runs.
    pub fn ns_serial(&self) -> u64 {
        self.ns_steps.saturating_sub(self.pool.ns_in_runs)
    }

    /// The `time_split` object of `bench decode --json` (docs/JSON.md): per step, and as
    /// fractions of the steps' wall time. None before any step was measured.
    pub fn json(&self) -> Option<serde_json::Value> {
        if self.steps == 0 || self.ns_steps == 0 {
            return None;
        }
        let (n, total) = (self.steps as f64, self.ns_steps as f64);
        Some(serde_json::json!({
            "steps": self.steps,
            "ms_per_step": total / n / 1e6,
            "pool_runs_per_step": self.pool.runs as f64 / n,
            "in_pool_runs": self.pool.ns_in_runs as f64 / total,
            "waiting_in_pool_runs": self.pool.ns_waiting as f64 / total,
            "serial": self.ns_serial() as f64 / total,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fractions are shares of the steps' time: in pool runs + serial = 1, waiting is part
    /// of the pool runs; steps and runs are averaged per step.
    #[test]
    fn fractions_add_up_and_average_per_step() {
        let mut s = StepSplit::default();
        assert!(s.json().is_none());
        let pool = |runs, ns_in_runs, ns_waiting| PoolTime {
            runs,
            ns_in_runs,
            ns_waiting,
        };
        s.add_step(4_000_000, pool(150, 3_600_000, 300_000));
        s.add_step(2_000_000, pool(152, 1_800_000, 100_000));
        let j = s.json().unwrap();
        assert_eq!(j["steps"], 2);
        assert_eq!(j["ms_per_step"], 3.0);
        assert_eq!(j["pool_runs_per_step"], 151.0);
        let f = |k: &str| j[k].as_f64().unwrap();
        assert!((f("in_pool_runs") - 0.9).abs() < 1e-12);
        assert!((f("serial") - 0.1).abs() < 1e-12);
        assert!((f("waiting_in_pool_runs") - 400_000.0 / 6e6).abs() < 1e-12);
        // A clock that put more inside the runs than the step took never gives negative serial.
        let mut odd = StepSplit::default();
        odd.add_step(100, pool(1, 120, 0));
        assert_eq!(odd.ns_serial(), 0);
    }
}
