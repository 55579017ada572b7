//! The delay-aware scheduler of paper §4.4: a ring of the last δd+1 residual snapshots (the
//! dense FFN of layer ℓ reads the residual that entered layer ℓ−δd, eq. 4.11) and the queue of
//! expert work routed at layer ℓ and injected at the end of layer ℓ+δe (eq. 4.16). It also
//! states which FFN inputs are known to be zero: the first δd layers have no delayed snapshot
//! yet, so their dense FFN reads zeros and its output is zero without reading a weight.

use crate::io::Ticket;
use crate::model::ModelConfig;

/// Expert computation scheduled for a later layer (saved router activation + selection).
pub struct Pending {
    /// Physical block whose experts run.
    pub block: usize,
    /// Execution step whose routing produced this entry (I/O is attributed to it).
    pub from: usize,
    /// [d] Norm(router input), the experts' input.
    pub act: Vec<f32>,
    /// Selected (expert, weight), best first.
    pub sel: Vec<(usize, f32)>,
    /// Scale of the injected sum (the style's FFN scale).
    pub scale: f32,
    /// Staged reads of the selected experts (same order as `sel`); empty on the mmap tier.
    pub tickets: Vec<Ticket>,
    /// Computed on the second core (vertical schedule); the result is collected at injection.
    pub offloaded: bool,
    /// Already computed with the layer's shared expert (`EngineOptions::fuse_shared`): the
    /// experts' bytes and their share of the fused runs' time (split by bytes, a modelled
    /// split); their weighted sum waits in `ExpertScratch::acc` for injection.
    pub fused: Option<(u64, u64)>,
}

/// What the dense FFN of a layer reads.
pub enum DelayInput<'a> {
    /// δd = 0: the residual the style names (x_in, x_mid or s_ffn) of this layer.
    Current,
    /// δd ≥ 1: the snapshot taken δd layers earlier.
    Delayed(&'a [f32]),
    /// δd ≥ 1 and ℓ < δd: no snapshot exists; the input is the zero vector.
    Zero,
}

/// True when the dense FFN of execution step `l` reads the zero vector (ℓ < δd), so its
/// output is zero and its weights need not be read. The one home of that rule (the engine and
/// the byte accounting of `stream_bytes` both use it).
pub fn dense_input_is_zero(l: usize, dense_delay: usize) -> bool {
    dense_delay > 0 && l < dense_delay
}

pub struct DelaySchedule {
    dd: usize,
    de: usize,
    /// Execution steps per token.
    steps: usize,
    /// [δd+1][d] residual snapshots; step ℓ writes slot ℓ mod (δd+1).
    ring: Vec<Vec<f32>>,
    /// [steps] expert work to inject at the end of each step.
    queue: Vec<Vec<Pending>>,
}

impl DelaySchedule {
    pub fn new(cfg: &ModelConfig) -> DelaySchedule {
        let steps = cfg.effective_layers();
        DelaySchedule {
            dd: cfg.dense_delay,
            de: cfg.expert_delay,
            steps,
            ring: vec![vec![0.0; cfg.d_model]; cfg.dense_delay + 1],
            queue: (0..steps).map(|_| Vec::new()).collect(),
        }
    }

    pub fn dense_delay(&self) -> usize {
        self.dd
    }

    /// Forgets the previous token (snapshots and queued work).
    pub fn begin_token(&mut self) {
        for r in &mut self.ring {
            r.fill(0.0);
        }
        for q in &mut self.queue {
            q.clear();
        }
    }

    /// Records the residual entering step `l`.
    pub fn snapshot(&mut self, l: usize, residual: &[f32]) {
        let n = self.dd + 1;
        self.ring[l % n].copy_from_slice(residual);
    }

    /// The dense FFN input of step `l`.
    pub fn dense_input(&self, l: usize) -> DelayInput<'_> {
        if self.dd == 0 {
            DelayInput::Current
        } else if dense_input_is_zero(l, self.dd) {
            DelayInput::Zero
        } else {
            DelayInput::Delayed(&self.ring[(l - self.dd) % (self.dd + 1)])
        }
    }

    /// The step whose dense input became known with the snapshot of step `l` (ℓ+δd), when
    /// δd ≥ 1 and it exists: its FFN can run from now on.
    pub fn dense_ready_after(&self, l: usize) -> Option<usize> {
        (self.dd > 0 && l + self.dd < self.steps).then_some(l + self.dd)
    }

    /// The step at whose end the experts routed at step `l` are injected.
    pub fn inject_step(&self, l: usize) -> usize {
        (l + self.de).min(self.steps - 1)
    }

    /// Queues expert work routed at step `pe.from`.
    pub fn defer(&mut self, pe: Pending) {
        let t = self.inject_step(pe.from);
        self.queue[t].push(pe);
    }

    /// Queues expert work for injection at the end of step `step` (route-ahead: the routing of
    /// a later layer, decided now).
    pub fn defer_at(&mut self, step: usize, pe: Pending) {
        let t = step.min(self.steps - 1);
        self.queue[t].push(pe);
    }

    /// The expert work queued for step `l`, still in the queue (to complete its input).
    pub fn due_mut(&mut self, l: usize) -> &mut [Pending] {
        &mut self.queue[l]
    }

    /// The expert work due at the end of step `l`.
    pub fn due(&mut self, l: usize) -> Vec<Pending> {
        std::mem::take(&mut self.queue[l])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::generate::GenSpec;

    #[test]
    fn dense_reads_the_snapshot_delta_d_layers_back_and_zero_before() {
        let mut cfg = GenSpec::new("arch2_4_combined").config().unwrap();
        cfg.dense_delay = 2;
        let mut s = DelaySchedule::new(&cfg);
        s.begin_token();
        let d = cfg.d_model;
        for l in 0..cfg.effective_layers() {
            s.snapshot(l, &vec![l as f32 + 1.0; d]);
            match s.dense_input(l) {
                DelayInput::Zero => assert!(l < 2),
                DelayInput::Delayed(x) => assert_eq!(x[0], (l - 2) as f32 + 1.0),
                DelayInput::Current => panic!("δd = 2"),
            }
            assert_eq!(
                s.dense_ready_after(l),
                (l + 2 < cfg.effective_layers()).then_some(l + 2)
            );
        }
        assert!(dense_input_is_zero(1, 2) && !dense_input_is_zero(2, 2));
        assert!(!dense_input_is_zero(0, 0));
    }
}
