//! The overlap model of staged expert I/O (paper §5.14), with the token's edges and the reader
//! pool: the one home of the predicted staged-vs-sync speedup used by `bench overlap`,
//! `bench overlap-model` and the TUI's Overlap pane.
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
//!   then submits its `reads` expert reads to the pool of `readers` reader threads, FIFO: a read
//!   starts when it is submitted and a reader is free, and keeps that reader busy for
//!   `read_ns`, the reader-busy time per read measured in the sync arm;
//! * then the expert outputs scheduled for ℓ are injected: the compute waits until each of those
//!   reads is done, then spends `inject` computing them.
//!
//! Sync is what the sync arm measured: Σ (pre + io + inject), where `io` is the compute's wait
//! (IO_eff). That wait is longer than the reads' busy time on the pool: each sync layer pays the
//! hand-offs (submit → a reader wakes → the read → the compute wakes) and leaves the readers
//! idle while it computes, where staged keeps a queue behind them. A layer measured without
//! per-read figures (`reads` = 0) is one read of `io`: with one reader, the one-channel model
//! of the previous version.

use crate::telemetry::event::TokenStats;

/// One layer as measured in the sync arm (nanoseconds, per token).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LayerTiming {
    /// Compute before the layer's expert reads are submitted.
    pub pre_ns: f64,
    /// Compute of the expert outputs injected at this layer (after their reads are done).
    pub inject_ns: f64,
    /// Wall-clock I/O of this layer's expert reads (IO_eff: what the sync arm waits for).
    pub io_ns: f64,
    /// Expert reads submitted at this layer (0: no per-read figures, see the module docs).
    pub reads: usize,
    /// Reader-busy time of one of those reads (the pread's duration in the reader thread).
    pub read_ns: f64,
}

impl LayerTiming {
    /// The reads as the replay runs them: (count, ns each).
    fn jobs(&self) -> (usize, f64) {
        if self.reads > 0 {
            (self.reads, self.read_ns)
        } else if self.io_ns > 0.0 {
            (1, self.io_ns)
        } else {
            (0, 0.0)
        }
    }
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

/// Replays one token: layers in order, reads of layer ℓ on `readers` FIFO readers, injected at
/// min(ℓ + δe, L − 1). Layers without experts have no reads and `inject_ns` = 0.
pub fn predict(layers: &[LayerTiming], expert_delay: usize, readers: usize) -> OverlapPrediction {
    replay(layers, expert_delay, readers, None)
}

/// [`predict`] with the direct tier's speculative next-layer reads (`--prefetch on`,
/// docs/SEMANTICS.md X2) at hit rate `hit`: at each routed layer, after its own reads, the next
/// routed layer's k reads are submitted (round(k·hit) of them that layer will use; the others are
/// wasted but still keep a reader busy); at that next layer only its k − round(k·hit) misses are
/// submitted. The first routed layer has no prediction.
pub fn predict_with_speculation(
    layers: &[LayerTiming],
    expert_delay: usize,
    readers: usize,
    hit: f64,
) -> OverlapPrediction {
    replay(layers, expert_delay, readers, Some(hit.clamp(0.0, 1.0)))
}

fn replay(
    layers: &[LayerTiming],
    expert_delay: usize,
    readers: usize,
    spec: Option<f64>,
) -> OverlapPrediction {
    let n = layers.len();
    let mut done = vec![0.0f64; n]; // when layer ℓ's reads complete
    let mut t = 0.0f64; // the compute thread's clock
    let mut free = vec![0.0f64; readers.max(1)]; // when each reader is next free
                                                 // Queue `k` reads of `each` ns submitted at `at`; returns when the last of them completes.
    let mut submit = |at: f64, k: usize, each: f64| {
        let mut end_all = 0.0f64;
        for _ in 0..k {
            // FIFO from one queue: the read goes to the reader that frees up first.
            let r = (0..free.len())
                .min_by(|&a, &b| free[a].total_cmp(&free[b]))
                .unwrap_or(0);
            let end = at.max(free[r]) + each;
            free[r] = end;
            end_all = end_all.max(end);
        }
        end_all
    };
    let hits = |k: usize| spec.map_or(0, |h| ((k as f64 * h).round() as usize).min(k));
    let mut predicted = vec![false; n]; // layer ℓ's reads were submitted ahead
    for (l, lt) in layers.iter().enumerate() {
        t += lt.pre_ns;
        let (k, each) = lt.jobs();
        if k > 0 {
            let own = if predicted[l] { k - hits(k) } else { k };
            done[l] = done[l].max(submit(t, own, each));
            if spec.is_some() {
                if let Some(nx) = (l + 1..n).find(|&m| layers[m].jobs().0 > 0) {
                    let (kn, each_n) = layers[nx].jobs();
                    let h = hits(kn);
                    // Useful reads first (they were ranked first), then the wasted ones.
                    done[nx] = done[nx].max(submit(t, h, each_n));
                    submit(t, kn - h, each_n);
                    predicted[nx] = true;
                }
            }
        }
        // Inject every routing whose (clamped) target is this layer.
        for (src, d) in done.iter().enumerate().take(l + 1) {
            let target = (src + expert_delay).min(n - 1);
            if target == l && layers[src].jobs().0 > 0 {
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

/// Per-layer means over sync-arm tokens (the model's input), and the mean time outside the
/// layers per token (ns_total − Σ compute + wait). Tokens without expert I/O are skipped; None
/// when there are none. The split, per layer with I/O: `inject` = the expert phase's time (at
/// most the layer's compute), `pre` = the rest of the compute, `io` = the wait, `read_ns` = the
/// reader-busy time of the reads issued there over the routing's size.
pub fn sync_layers<'a>(
    tokens: impl IntoIterator<Item = &'a TokenStats>,
) -> Option<(Vec<LayerTiming>, f64)> {
    layer_means(tokens, false)
}

/// The same means over staged-arm tokens, for a consistency check only (never a prediction):
/// there the waits happen inside the expert phase, so `inject` = expert phase − wait. Replaying
/// these tests the model's structure on the staged arm's own compute and read times.
pub fn staged_layers<'a>(
    tokens: impl IntoIterator<Item = &'a TokenStats>,
) -> Option<(Vec<LayerTiming>, f64)> {
    layer_means(tokens, true)
}

fn layer_means<'a>(
    tokens: impl IntoIterator<Item = &'a TokenStats>,
    waits_in_experts: bool,
) -> Option<(Vec<LayerTiming>, f64)> {
    let mut per: Vec<LayerTiming> = Vec::new();
    let mut busy_n: Vec<(f64, usize)> = Vec::new(); // (Σ read ns, Σ reads) per layer
    let (mut n, mut other) = (0usize, 0.0f64);
    for tok in tokens {
        if !tok.layers.iter().any(|l| l.io.is_some()) {
            continue;
        }
        if per.len() < tok.layers.len() {
            per.resize(tok.layers.len(), LayerTiming::default());
            busy_n.resize(tok.layers.len(), (0.0, 0));
        }
        n += 1;
        let mut in_layers = 0.0;
        for (l, st) in tok.layers.iter().enumerate() {
            let Some(x) = st.io else { continue };
            let phase = if waits_in_experts {
                st.ns_experts.saturating_sub(x.wait_ns)
            } else {
                st.ns_experts
            };
            let inject = phase.min(x.compute_ns) as f64;
            per[l].pre_ns += x.compute_ns as f64 - inject;
            per[l].inject_ns += inject;
            per[l].io_ns += x.wait_ns as f64;
            per[l].reads = per[l].reads.max(st.routing.len());
            if !st.routing.is_empty() {
                busy_n[l].0 += x.io_ns as f64;
                busy_n[l].1 += st.routing.len();
            }
            in_layers += (x.compute_ns + x.wait_ns) as f64;
        }
        other += (tok.ns_total as f64 - in_layers).max(0.0);
    }
    if n == 0 {
        return None;
    }
    let k = n as f64;
    for (p, (busy, reads)) in per.iter_mut().zip(&busy_n) {
        p.pre_ns /= k;
        p.inject_ns /= k;
        p.io_ns /= k;
        p.read_ns = if *reads > 0 {
            busy / *reads as f64
        } else {
            0.0
        };
        if *reads == 0 {
            p.reads = 0;
        }
    }
    Some((per, other / k))
}

/// Uniform per-layer figures the model runs on (`bench overlap-model`'s flags, which say what
/// each means), in ms.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct UniformFigures {
    /// Layers per token.
    pub layers: usize,
    /// Expert delay δe.
    pub expert_delay: usize,
    /// Compute per layer before its expert reads are submitted.
    pub c: f64,
    /// Compute per layer of the injected experts.
    pub inject: f64,
    /// Wall-clock expert I/O per layer of the staged arm (IO_eff).
    pub io_eff: f64,
    /// Expert I/O per layer of the sync arm (default: `io_eff`).
    pub io: Option<f64>,
    /// The measured sync ms/token, when known.
    pub sync_ms: Option<f64>,
    /// Reader threads serving the reads (FIFO).
    pub readers: usize,
    /// Expert reads per layer.
    pub reads: usize,
    /// Reader-busy ms of one read (default: `io_eff / reads`).
    pub read_ms: Option<f64>,
}

/// The text of `bench overlap-model`.
pub fn report(a: &UniformFigures) -> anyhow::Result<String> {
    let io = a.io.unwrap_or(a.io_eff);
    let reads = a.reads.max(1);
    let read_ms = a.read_ms.unwrap_or(a.io_eff / reads as f64);
    let finite = [
        a.c,
        a.inject,
        a.io_eff,
        io,
        read_ms,
        a.sync_ms.unwrap_or(0.0),
    ]
    .iter()
    .all(|v| v.is_finite() && *v >= 0.0);
    if a.layers == 0 || a.layers > 100_000 || !finite || a.readers > 4096 || a.reads > 4096 {
        anyhow::bail!(
            "--layers must be 1..=100000, --readers and --reads at most 4096, and the times finite and >= 0"
        );
    }
    let l = LayerTiming {
        pre_ns: a.c * 1e6,
        inject_ns: a.inject * 1e6,
        io_ns: a.io_eff * 1e6,
        reads,
        read_ns: read_ms * 1e6,
    };
    let p = predict(&vec![l; a.layers], a.expert_delay, a.readers);
    let sync_layers = a.layers as f64 * (a.c + a.inject + io) * 1e6;
    let other = a.sync_ms.map_or(0.0, |s| (s * 1e6 - sync_layers).max(0.0));
    let (sync, staged) = (sync_layers + other, p.staged_ns + other);
    let c = a.c + a.inject;
    Ok(format!(
        "L = {}, δe = {}, per layer: C = {} ms + inject {} ms, sync IO = {} ms, IO_eff = {} ms, \
         {} read(s) of {} ms on {} reader(s) (modelled from these figures; nothing measured)\n\
         sync {:.1} ms/token · staged (replay with fill and drain) {:.1} ms/token · outside the layers {:.1} ms\n\
         predicted net: {:.3}× with the token's edges · {:.3}× steady state (C + IO) / max(C, IO_eff)",
        a.layers,
        a.expert_delay,
        a.c,
        a.inject,
        io,
        a.io_eff,
        reads,
        read_ms,
        a.readers.max(1),
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
            ..Default::default()
        }
    }

    /// Three layers, δe = 1, C = 10 before the reads, IO = 15 each (worked by hand):
    /// ℓ0: t = 10, read 0 runs 10–25.            ℓ1: t = 20, read 1 runs 25–40, inject 0: t = 25.
    /// ℓ2: t = 35, read 2 runs 40–55, inject 1 and 2 (target clamped): t = 55.
    /// Sync: 3·(10 + 15) = 75. Net 75/55 = 1.364, where the steady state says 25/15 = 1.667.
    #[test]
    fn hand_computed_fill_and_drain() {
        let p = predict(&[lt(10.0, 0.0, 15.0); 3], 1, 1);
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
        let p = predict(&[lt(4.0, 1.0, 6.0); 4], 2, 1);
        assert_eq!(p.staged_ns, 29.0);
        assert_eq!(p.sync_ns, 44.0);
    }

    /// No I/O: staged = sync, net 1. Compute-bound long models approach the steady state.
    #[test]
    fn limits() {
        let p = predict(&[lt(5.0, 1.0, 0.0); 6], 2, 1);
        assert_eq!(p.staged_ns, p.sync_ns);
        assert_eq!(p.net(3.0), 1.0);
        let long = predict(&[lt(10.0, 0.0, 5.0); 400], 2, 1);
        assert!((long.net(0.0) - long.steady_net).abs() / long.steady_net < 0.01);
        assert_eq!(predict(&[], 2, 1).net(0.0), 1.0);
    }

    /// The paper's Table 5.6 at T = 4 (C 38.0, IO 32.5, IO_eff 40, 16 layers, δe 2): its own
    /// steady-state formula gives 70.5 / 40 = 1.76× (it prints 1.68×, the measured figure).
    #[test]
    fn report_on_the_papers_table() {
        let a = UniformFigures {
            layers: 16,
            expert_delay: 2,
            c: 38.0,
            inject: 0.0,
            io_eff: 40.0,
            io: Some(32.5),
            sync_ms: Some(1128.0),
            readers: 1,
            reads: 1,
            read_ms: None,
        };
        let r = report(&a).unwrap();
        assert!(r.contains("1.762× steady state"), "{r}");
        assert!(r.contains("sync 1128.0 ms/token"), "{r}");
        let bad = UniformFigures { layers: 0, ..a };
        assert!(report(&bad).is_err());
    }

    fn rd(pre: f64, inject: f64, io: f64, reads: usize, read: f64) -> LayerTiming {
        LayerTiming {
            pre_ns: pre,
            inject_ns: inject,
            io_ns: io,
            reads,
            read_ns: read,
        }
    }

    /// Per-layer figures that differ, 2 reads per layer on 2 readers, δe = 1 (by hand):
    /// ℓ0: pre 5 → t=5; reads 5–13, 5–13 (readers A, B free at 13); inject nothing; t=5.
    /// ℓ1: pre 3 → t=8; reads A 13–21, B 13–21; inject ℓ0 (done 13): t=13, +2 = 15.
    /// ℓ2: pre 4 → t=19; no reads (dense layer); inject ℓ1 (21) and nothing of its own: t=21, +1 = 22.
    /// Sync (measured waits 10, 10, 0): 5+10 + 3+2+10 + 4+1 = 35. Net 35/22.
    /// With one reader the reads queue: ℓ0 5–13–21, ℓ1 21–29–37: t = max(8+…)=21+2=23 at ℓ1,
    /// ℓ2 t=27 then waits for ℓ1's 37, +1 = 38.
    #[test]
    fn hand_computed_reader_pool() {
        let layers = [
            rd(5.0, 0.0, 10.0, 2, 8.0),
            rd(3.0, 2.0, 10.0, 2, 8.0),
            rd(4.0, 1.0, 0.0, 0, 0.0),
        ];
        let p = predict(&layers, 1, 2);
        assert_eq!(p.sync_ns, 35.0);
        assert_eq!(p.staged_ns, 22.0);
        assert!((p.net(0.0) - 35.0 / 22.0).abs() < 1e-12);
        assert_eq!(predict(&layers, 1, 1).staged_ns, 38.0);
        // With idle readers ℓ1's reads need not queue behind ℓ0's: they run 8–16, done
        // before ℓ2 needs them at 19, so ℓ2 ends at 19 + 1 = 20.
        assert_eq!(predict(&layers, 1, 8).staged_ns, 20.0);
    }

    /// `sync_layers` on two synthetic sync tokens against the means by hand.
    #[test]
    fn sync_layers_means() {
        use crate::telemetry::event::{LayerIo, LayerStat};
        let layer = |compute: u64, wait: u64, busy: u64, experts: u64, k: usize| LayerStat {
            ns_experts: experts,
            routing: vec![(0, 0.5); k],
            io: Some(LayerIo {
                compute_ns: compute,
                io_ns: busy,
                wait_ns: wait,
                bytes: 0,
            }),
            ..Default::default()
        };
        let tok = |c0: u64, total: u64| TokenStats {
            ns_total: total,
            layers: vec![layer(c0, 20, 30, 4, 2), layer(10, 0, 0, 0, 0)],
            ..Default::default()
        };
        let toks = [tok(10, 50), tok(14, 60)];
        let (l, other) = sync_layers(&toks).unwrap();
        // ℓ0: compute 10, 14 → inject 4, pre 6 and 10 → 8; wait 20; busy 30 over 2 reads = 15.
        assert_eq!(l[0], rd(8.0, 4.0, 20.0, 2, 15.0));
        assert_eq!(l[1], rd(10.0, 0.0, 0.0, 0, 0.0));
        // outside the layers: 50 − (10+20+10) = 10, 60 − (14+20+10) = 16 → 13.
        assert_eq!(other, 13.0);
        assert!(sync_layers(&[TokenStats::default()]).is_none());
    }

    /// Speculation on a model without an expert delay: 3 layers of pre 10, one read of 15 each,
    /// no inject, one reader. Without it: sync, 3 × 25 = 75. With hit rate 1: layer 0 reads at
    /// 10 (done 25) and layer 1's read is queued behind it (done 40); layer 1 starts at 25, its
    /// pre ends at 35, waits to 40, queues layer 2's read (done 55); layer 2: 40 + 10 = 50,
    /// waits to 55. With hit rate 0 every prediction is wasted: it keeps the reader busy, so
    /// the token is slower than without speculation.
    #[test]
    fn speculation_hides_reads_by_hit_rate() {
        let l = [lt(10.0, 0.0, 15.0); 3];
        assert_eq!(predict(&l, 0, 1).staged_ns, 75.0);
        assert_eq!(predict_with_speculation(&l, 0, 1, 1.0).staged_ns, 55.0);
        assert!(predict_with_speculation(&l, 0, 1, 0.0).staged_ns > 75.0);
        // Two reads per layer on one reader at hit rate 0.5: one of the two is read ahead (with
        // two readers the miss alone costs as long as both reads in parallel).
        let two = [LayerTiming {
            reads: 2,
            read_ns: 7.5,
            ..lt(10.0, 0.0, 15.0)
        }; 3];
        let half = predict_with_speculation(&two, 0, 1, 0.5).staged_ns;
        let (none, all) = (
            predict(&two, 0, 1).staged_ns,
            predict_with_speculation(&two, 0, 1, 1.0).staged_ns,
        );
        assert_eq!((all, half, none), (55.0, 70.0, 75.0));
    }
}
