//! Critical-path bandwidth analyzer (paper §4.5, eq. 4.23):
//! B_critical = Σ_ℓ max(B_attn, B_dense/(δd+1), B_expert/(δe+1)); B_naive is the same with δ = 0.

use crate::telemetry::StreamBytes;
use serde::Serialize;

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct CriticalPath {
    pub dense_delay: usize,
    pub expert_delay: usize,
    /// Per layer (naive, delayed) bytes.
    pub per_layer: Vec<(f64, f64)>,
    pub naive: f64,
    pub critical: f64,
    /// Fully serial total (attention + dense + experts).
    pub serial: f64,
}

impl CriticalPath {
    pub fn ratio(&self) -> f64 {
        if self.critical > 0.0 {
            self.naive / self.critical
        } else {
            1.0
        }
    }

    /// `{"naive", "delayed", "ratio"}` in MiB/token, the JSON shape every command uses.
    pub fn mib_json(&self) -> serde_json::Value {
        const MIB: f64 = 1048576.0;
        serde_json::json!({
            "naive": self.naive / MIB,
            "delayed": self.critical / MIB,
            "ratio": self.ratio(),
        })
    }
}

/// The critical path of a model file in both accountings, under the one JSON key every command
/// uses (`critical_path_mib`): `payload` counts the weights at their nominal bits per weight (the
/// paper's convention, eq. 4.23), `with_scales` the bytes as stored (block scales and tile
/// headers included), which is what a token actually reads.
pub fn critical_path_both(file: &crate::format::CflowFile) -> serde_json::Value {
    let (dd, de) = (file.cfg.dense_delay, file.cfg.expert_delay);
    let payload = critical_path(&payload_stream_bytes(file), dd, de);
    let stored = critical_path(&crate::engine::forward::stream_bytes(file), dd, de);
    serde_json::json!({"payload": payload.mib_json(), "with_scales": stored.mib_json()})
}

/// The stream that bounds a layer's critical path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Bound {
    Attn,
    Dense,
    Experts,
}

/// One layer's terms of eq. 4.23: (B_attn, B_dense/(δd+1), B_expert/(δe+1)).
pub fn layer_terms(b: &StreamBytes, dd: usize, de: usize) -> [f64; 3] {
    [
        b.attn as f64,
        b.dense as f64 / (dd + 1) as f64,
        b.experts as f64 / (de + 1) as f64,
    ]
}

/// Which term of [`layer_terms`] is the largest (attention wins ties, then dense).
pub fn layer_bound(b: &StreamBytes, dd: usize, de: usize) -> Bound {
    let [a, d, e] = layer_terms(b, dd, de);
    if a >= d && a >= e {
        Bound::Attn
    } else if d >= e {
        Bound::Dense
    } else {
        Bound::Experts
    }
}

/// Evaluates eq. 4.23 for per-layer stream bytes under delays (δd, δe).
pub fn critical_path(layers: &[StreamBytes], dd: usize, de: usize) -> CriticalPath {
    let max3 = |t: [f64; 3]| t[0].max(t[1]).max(t[2]);
    let per_layer: Vec<(f64, f64)> = layers
        .iter()
        .map(|b| (max3(layer_terms(b, 0, 0)), max3(layer_terms(b, dd, de))))
        .collect();
    CriticalPath {
        dense_delay: dd,
        expert_delay: de,
        naive: per_layer.iter().map(|p| p.0).sum(),
        critical: per_layer.iter().map(|p| p.1).sum(),
        serial: layers
            .iter()
            .map(|b| (b.attn + b.dense + b.experts) as f64)
            .sum(),
        per_layer,
    }
}

/// Paper-convention stream bytes (payload only: Q4 at 0.5 byte/param, no scales or headers).
pub fn payload_stream_bytes(file: &crate::format::CflowFile) -> Vec<StreamBytes> {
    let cfg = &file.cfg;
    (0..cfg.effective_layers())
        .map(|l| {
            let lv = &file.layers[cfg.physical_layer(l)];
            let attn = lv.q.payload_bytes()
                + lv.k.payload_bytes()
                + lv.v.payload_bytes()
                + lv.o.payload_bytes();
            let dense: f64 = [&lv.gate, &lv.up, &lv.down]
                .iter()
                .map(|m| m.as_ref().map_or(0.0, |m| m.payload_bytes()))
                .sum();
            let experts = lv.experts.first().map_or(0.0, |e| {
                (e.gate.payload_bytes() + e.up.payload_bytes() + e.down.payload_bytes())
                    * cfg.top_k as f64
            });
            StreamBytes {
                attn: attn as u64,
                dense: dense as u64,
                experts: experts as u64,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn demo_layers() -> Vec<StreamBytes> {
        // d=512, dff=2048, expert hidden 512, k=2 at 0.5 byte/param.
        vec![
            StreamBytes {
                attn: MIB / 2,
                dense: 3 * MIB / 2,
                experts: 3 * MIB / 4
            };
            6
        ]
    }

    fn mib(x: f64) -> f64 {
        x / MIB as f64
    }

    #[test]
    fn table_4_1() {
        let l = demo_layers();
        // arch2_4_combined (1, 2), arch2_4_sync (1, 0), arch1/arch3 (0, 0), arch4 (0, 2).
        for (dd, de, naive, crit) in [
            (1, 2, 9.0, 4.5),
            (1, 0, 9.0, 4.5),
            (0, 0, 9.0, 9.0),
            (0, 2, 9.0, 9.0),
        ] {
            let c = critical_path(&l, dd, de);
            assert_eq!(mib(c.naive), naive);
            assert_eq!(mib(c.critical), crit, "({dd}, {de})");
        }
        let c = critical_path(&l, 1, 2);
        assert_eq!(c.ratio(), 2.0);
        assert_eq!(mib(c.serial), 16.5);
    }
}
