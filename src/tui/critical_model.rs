//! The critical-path figures the TUI draws, computed by [`crate::engine::critical`] (the one
//! home of eq. 4.23). Three accountings are kept, labelled as `critical_path_mib` names them:
//! `payload` (every layer's weights at nominal bits per weight, the paper's convention),
//! `payload_read` (the same without the zero-input dense FFNs, which are not read) and
//! `with_scales` (the bytes as stored and read, scales and tile headers included: what the
//! Streams pane shows, so the per-layer bars use it).

use crate::engine::critical::{critical_path, layer_bound, Bound, CriticalPath};
use crate::telemetry::event::ModelSummary;

const MIB: f64 = 1024.0 * 1024.0;

/// One layer's bar: bytes on the critical path, the undelayed reference, and what bounds it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BarLayer {
    pub critical: f64,
    pub undelayed: f64,
    pub bound: Bound,
}

/// The critical path under (δd, δe) in both accountings.
#[derive(Clone, Debug, PartialEq)]
pub struct Accounts {
    /// Per-layer bars, in the with-scales accounting.
    pub layers: Vec<BarLayer>,
    pub with_scales: CriticalPath,
    /// Payload as read (zero-input FFNs skipped); None when the session did not send payload
    /// bytes (older traces).
    pub payload_read: Option<CriticalPath>,
    /// Payload over every layer's weights (the paper's convention); None in older traces.
    pub payload: Option<CriticalPath>,
}

/// (naive, delayed) MiB/token of a path.
pub fn mib_pair(cp: &CriticalPath) -> (f64, f64) {
    (cp.naive / MIB, cp.critical / MIB)
}

/// The critical path of `model` under delays (δd, δe).
pub fn accounts(model: &ModelSummary, dd: u32, de: u32) -> Accounts {
    let (dd, de) = (dd as usize, de as usize);
    let with_scales = critical_path(&model.layer_bytes, dd, de);
    let of =
        |v: &[crate::telemetry::StreamBytes]| (!v.is_empty()).then(|| critical_path(v, dd, de));
    let payload_read = of(&model.layer_payload_bytes);
    let payload = of(&model.layer_payload_bytes_all);
    let layers = model
        .layer_bytes
        .iter()
        .zip(&with_scales.per_layer)
        .map(|(b, &(undelayed, critical))| BarLayer {
            critical,
            undelayed,
            bound: layer_bound(b, dd, de),
        })
        .collect();
    Accounts {
        layers,
        with_scales,
        payload_read,
        payload,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tui::fixture::demo_model;

    #[test]
    fn demo_shows_both_accountings() {
        let m = demo_model();
        let a = accounts(&m, m.dense_delay, m.expert_delay);
        let (n, d) = mib_pair(a.payload.as_ref().unwrap());
        assert_eq!(format!("{n:.2} → {d:.2}"), "9.00 → 4.50");
        assert_eq!(a.payload.as_ref().unwrap().ratio(), 2.0);
        // As read, layer 0's zero-input dense FFN (1.50 MiB) is skipped.
        let (rn, rd) = mib_pair(a.payload_read.as_ref().unwrap());
        assert_eq!(format!("{rn:.2} → {rd:.2}"), "8.25 → 4.25");
        // The bars are the with-scales bytes: their sums are the with-scales totals.
        let (wn, wd) = mib_pair(&a.with_scales);
        let bars: f64 = a.layers.iter().map(|l| l.critical).sum::<f64>() / MIB;
        let und: f64 = a.layers.iter().map(|l| l.undelayed).sum::<f64>() / MIB;
        assert!((bars - wd).abs() < 1e-12 && (und - wn).abs() < 1e-12);
        assert!(
            wn > rn && wd > rd,
            "scales add bytes: {wn} {wd} vs {rn} {rd}"
        );
        // Layer 0 reads no dense bytes, so its attention bounds it; the others are dense-bound.
        assert_eq!(a.layers[0].bound, Bound::Attn);
        assert!(a.layers[1..].iter().all(|l| l.bound == Bound::Dense));
        let z = accounts(&m, 0, 0);
        assert_eq!(z.with_scales.naive, z.with_scales.critical);
    }
}
