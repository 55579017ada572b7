//! The overlap model of staged expert I/O (paper §5.14), with the token's edges: the one home of
//! the predicted staged-vs-sync speedup used by `bench overlap` and the TUI's Overlap pane.
//!
//! The paper's steady-state figure, (C + IO_eff) / max(C, IO_eff) per layer, assumes every
//! layer's compute hides some earlier layer's I/O. Within one token that is false at both edges:
//! the first δe layers have no pending I/O to hide (fill), and the routings of the last δe layers
//! are all injected at the last layer (the target ℓ + δe is clamped to L − 1), so their reads
//! have little or no compute behind them (drain). This model replays one token layer by layer
//! from per-layer measurements of the sync arm and nothing else (it is not fitted to the staged
//! arm):
//!
//! * layer ℓ computes `pre` (attention, dense, router: up to the point its experts are known),
//!   then submits its expert reads, which take `io` of wall-clock I/O on one shared I/O channel
//!   (FIFO: a read starts when both it is submitted and the previous read is done);
//! * then the expert outputs scheduled for ℓ are injected: the compute waits until each of those
//!   reads is done, then spends `inject` computing them.
//!
//! Sync is the same replay with every read waited for at once: Σ (pre + io + inject).

/// One layer as measured in the sync arm (nanoseconds, per token).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LayerTiming {
    /// Compute before the layer's expert reads are submitted.
    pub pre_ns: f64,
    /// Compute of the expert outputs injected at this layer (after their reads are done).
    pub inject_ns: f64,
    /// Wall-clock I/O of this layer's expert reads (IO_eff: what the sync arm waits for).
    pub io_ns: f64,
}

/// The model's prediction for one token.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OverlapPrediction {
    /// Σ over layers of pre + io + inject (the sync arm's layer time).
    pub sync_ns: f64,
    /// The staged replay's layer time, with fill and drain.
    pub staged_ns: f64,
    /// The steady-state figure for comparison: (C + IO) / max(C, IO) on the layer sums.
    pub steady_net: f64,
}

impl OverlapPrediction {
    /// Predicted net speedup of staged over sync for a whole token, where `other_ns` is the
    /// token's time outside the layers (embedding, LM head), the same in both arms.
    pub fn net(&self, other_ns: f64) -> f64 {
        let staged = self.staged_ns + other_ns;
        if staged > 0.0 {
            (self.sync_ns + other_ns) / staged
        } else {
            1.0
        }
    }
}

/// Replays one token: layers in order, reads of layer ℓ injected at min(ℓ + δe, L − 1).
/// Layers without experts have `io_ns` = 0 and `inject_ns` = 0.
pub fn predict(layers: &[LayerTiming], expert_delay: usize) -> OverlapPrediction {
    let n = layers.len();
    let mut done = vec![0.0f64; n]; // when layer ℓ's reads complete
    let mut t = 0.0f64; // the compute thread's clock
    let mut io_free = 0.0f64; // when the I/O channel is next free
    for (l, lt) in layers.iter().enumerate() {
        t += lt.pre_ns;
        let start = t.max(io_free);
        done[l] = start + lt.io_ns;
        io_free = done[l];
        // Inject every routing whose (clamped) target is this layer.
        for (src, d) in done.iter().enumerate().take(l + 1) {
            let target = (src + expert_delay).min(n - 1);
            if target == l && layers[src].io_ns > 0.0 {
                t = t.max(*d);
            }
        }
        t += lt.inject_ns;
    }
    let c: f64 = layers.iter().map(|l| l.pre_ns + l.inject_ns).sum();
    let io: f64 = layers.iter().map(|l| l.io_ns).sum();
    let m = c.max(io);
    OverlapPrediction {
        sync_ns: c + io,
        staged_ns: t,
        steady_net: if m > 0.0 { (c + io) / m } else { 1.0 },
    }
}

/// `bench overlap-model`: the model on uniform per-layer figures.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Example (the paper's Table 5.6, T = 4: 1128 ms/token sync = 16 layers × (38.0 + 32.5) ms):\n  \
    cflow-tui bench overlap-model --layers 16 --expert-delay 2 --c 38.0 --io 32.5 --io-eff 40 --sync-ms 1128"
)]
pub struct ModelArgs {
    /// Layers per token.
    #[arg(long)]
    pub layers: usize,
    /// Expert delay δe (reads of layer ℓ are injected at min(ℓ + δe, L − 1)).
    #[arg(long)]
    pub expert_delay: usize,
    /// Compute per layer before its expert reads are submitted, ms.
    #[arg(long)]
    pub c: f64,
    /// Compute per layer of the injected experts (after their reads), ms.
    #[arg(long, default_value_t = 0.0)]
    pub inject: f64,
    /// Wall-clock expert I/O per layer the staged arm's reads take, ms (IO_eff).
    #[arg(long)]
    pub io_eff: f64,
    /// Expert I/O per layer the sync arm pays, ms (default: --io-eff). The paper's Table 5.6
    /// gives IO = 32.5 for the sync arm and IO_eff ≈ 40 for the disk floor.
    #[arg(long)]
    pub io: Option<f64>,
    /// The measured sync ms/token, when known: the time outside the layers is then
    /// sync − L·(c + inject + io), the same in both arms; without it that time is taken as 0.
    #[arg(long)]
    pub sync_ms: Option<f64>,
}

/// The text of `bench overlap-model`.
pub fn report(a: &ModelArgs) -> anyhow::Result<String> {
    let io = a.io.unwrap_or(a.io_eff);
    let finite = [a.c, a.inject, a.io_eff, io, a.sync_ms.unwrap_or(0.0)]
        .iter()
        .all(|v| v.is_finite() && *v >= 0.0);
    if a.layers == 0 || a.layers > 100_000 || !finite {
        anyhow::bail!("--layers must be 1..=100000 and the times finite and >= 0");
    }
    let l = LayerTiming {
        pre_ns: a.c * 1e6,
        inject_ns: a.inject * 1e6,
        io_ns: a.io_eff * 1e6,
    };
    let p = predict(&vec![l; a.layers], a.expert_delay);
    let sync_layers = a.layers as f64 * (a.c + a.inject + io) * 1e6;
    let other = a.sync_ms.map_or(0.0, |s| (s * 1e6 - sync_layers).max(0.0));
    let (sync, staged) = (sync_layers + other, p.staged_ns + other);
    let c = a.c + a.inject;
    Ok(format!(
        "L = {}, δe = {}, per layer: C = {} ms + inject {} ms, sync IO = {} ms, IO_eff = {} ms \
         (modelled from these figures; nothing measured)\n\
         sync {:.1} ms/token · staged (replay with fill and drain) {:.1} ms/token · outside the layers {:.1} ms\n\
         predicted net: {:.3}× with the token's edges · {:.3}× steady state (C + IO) / max(C, IO_eff)",
        a.layers,
        a.expert_delay,
        a.c,
        a.inject,
        io,
        a.io_eff,
        sync / 1e6,
        staged / 1e6,
        other / 1e6,
        sync / staged,
        (c + io) / c.max(a.io_eff).max(1e-12)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lt(pre: f64, inject: f64, io: f64) -> LayerTiming {
        LayerTiming {
            pre_ns: pre,
            inject_ns: inject,
            io_ns: io,
        }
    }

    /// Three layers, δe = 1, C = 10 before the reads, IO = 15 each (worked by hand):
    /// ℓ0: t = 10, read 0 runs 10–25.            ℓ1: t = 20, read 1 runs 25–40, inject 0: t = 25.
    /// ℓ2: t = 35, read 2 runs 40–55, inject 1 and 2 (target clamped): t = 55.
    /// Sync: 3·(10 + 15) = 75. Net 75/55 = 1.364, where the steady state says 25/15 = 1.667.
    #[test]
    fn hand_computed_fill_and_drain() {
        let p = predict(&[lt(10.0, 0.0, 15.0); 3], 1);
        assert_eq!(p.sync_ns, 75.0);
        assert_eq!(p.staged_ns, 55.0);
        assert!((p.net(0.0) - 75.0 / 55.0).abs() < 1e-12);
        assert!((p.steady_net - 25.0 / 15.0).abs() < 1e-12);
        // 20 ns outside the layers in both arms: (75 + 20) / (55 + 20).
        assert!((p.net(20.0) - 95.0 / 75.0).abs() < 1e-12);
    }

    /// With inject compute and δe = 2 over 4 layers (by hand):
    /// ℓ0: t=4, read0 4–10, t=4+1=5.   ℓ1: t=9, read1 10–16, t=10.
    /// ℓ2: t=14, read2 16–22, inject 0 (done 10): t=14+1=15.
    /// ℓ3: t=19, read3 22–28, inject 1, 2, 3 (clamped): t = max(19,16,22,28) = 28, +1 = 29.
    /// Sync: 4·(4 + 1 + 6) = 44.
    #[test]
    fn hand_computed_with_injection_compute() {
        let p = predict(&[lt(4.0, 1.0, 6.0); 4], 2);
        assert_eq!(p.staged_ns, 29.0);
        assert_eq!(p.sync_ns, 44.0);
    }

    /// No I/O: staged = sync, net 1. Compute-bound long models approach the steady state.
    #[test]
    fn limits() {
        let p = predict(&[lt(5.0, 1.0, 0.0); 6], 2);
        assert_eq!(p.staged_ns, p.sync_ns);
        assert_eq!(p.net(3.0), 1.0);
        let long = predict(&[lt(10.0, 0.0, 5.0); 400], 2);
        assert!((long.net(0.0) - long.steady_net).abs() / long.steady_net < 0.01);
        assert_eq!(predict(&[], 2).net(0.0), 1.0);
    }

    /// The paper's Table 5.6 at T = 4 (C 38.0, IO 32.5, IO_eff 40, 16 layers, δe 2): its own
    /// steady-state formula gives 70.5 / 40 = 1.76× (it prints 1.68×, the measured figure).
    #[test]
    fn report_on_the_papers_table() {
        let a = ModelArgs {
            layers: 16,
            expert_delay: 2,
            c: 38.0,
            inject: 0.0,
            io_eff: 40.0,
            io: Some(32.5),
            sync_ms: Some(1128.0),
        };
        let r = report(&a).unwrap();
        assert!(r.contains("1.762× steady state"), "{r}");
        assert!(r.contains("sync 1128.0 ms/token"), "{r}");
        let bad = ModelArgs { layers: 0, ..a };
        assert!(report(&bad).is_err());
    }
}
