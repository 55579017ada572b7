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

/// The critical path of a model file under the one JSON key every command uses
/// (`critical_path_mib`), in three labelled accountings:
/// - `payload`: every layer's weights at their nominal bits per weight, the paper's own
///   convention for eq. 4.23 (Table 4.1);
/// - `payload_read`: the same bits, without the dense FFNs whose input is known to be zero
///   (ℓ < δd), which the engine does not read;
/// - `with_scales`: the bytes a token actually reads, as stored (block scales and tile headers
///   included, zero-input FFNs skipped), the accounting of the Streams pane's bars.
pub fn critical_path_both(file: &crate::format::CflowFile) -> serde_json::Value {
    let (dd, de) = (file.cfg.dense_delay, file.cfg.expert_delay);
    let paper = critical_path(&payload_stream_bytes_all(file), dd, de);
    let payload_read = critical_path(&payload_stream_bytes(file), dd, de);
    let stored = critical_path(&crate::engine::stream_bytes(file), dd, de);
    serde_json::json!({
        "payload": paper.mib_json(),
        "payload_read": payload_read.mib_json(),
        "with_scales": stored.mib_json(),
    })
}

/// arch5's two accountings (§4.3.6, issue: "9.00 vs 14.06"): eq. 4.23 sums, per pass, the
/// largest stream (one pass = one iteration of one block); the paper's Table 4.1 figure counts
/// every stream of every pass (iterations × the unique block bytes). Payload convention, MiB.
/// None unless the model iterates its blocks (FixedPoint).
pub fn fixed_point_accounting(file: &crate::format::CflowFile) -> Option<serde_json::Value> {
    const MIB: f64 = 1048576.0;
    let cfg = &file.cfg;
    if cfg.combine_style != crate::model::CombineStyle::FixedPoint {
        return None;
    }
    let passes = payload_stream_bytes_all(file);
    let c = critical_path(&passes, cfg.dense_delay, cfg.expert_delay);
    let iterations = cfg.meta.fixed_point_iterations.max(1) as usize;
    Some(serde_json::json!({
        "blocks": cfg.n_layers,
        "iterations": iterations,
        "passes": passes.len(),
        "eq_4_23_mib": c.naive / MIB,
        "all_streams_all_passes_mib": c.serial / MIB,
        "unique_block_mib": c.serial / iterations as f64 / MIB,
    }))
}

/// The one-line explanation of [`fixed_point_accounting`] (for `inspect`).
pub fn fixed_point_line(v: &serde_json::Value) -> String {
    let f = |k: &str| v[k].as_f64().unwrap_or(0.0);
    format!(
        "arch5 accountings: eq. 4.23 = {:.2} MiB/token (the largest stream of each of {} passes); \
         all streams of all passes = {} iterations × {:.2} MiB unique block payload = {:.2} MiB \
         (the paper's Table 4.1 counts this way from its own unique-block figure: 3 × 4.69 = 14.06 MB)",
        f("eq_4_23_mib"),
        v["passes"],
        v["iterations"],
        f("unique_block_mib"),
        f("all_streams_all_passes_mib")
    )
}

/// One layer's term of eq. 4.23: max(a, d/(δd+1), e/(δe+1)), for stream amounts (a, d, e)
/// in any unit (bytes, or the time each stream takes alone).
pub fn layer_term(a: f64, d: f64, e: f64, dd: usize, de: usize) -> f64 {
    a.max(d / (dd + 1) as f64).max(e / (de + 1) as f64)
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

/// Bandwidth reached by each stream, in bytes per ns (= GB/s).
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq)]
pub struct StreamRates {
    pub attn: f64,
    pub dense: f64,
    pub experts: f64,
}

/// Seconds-per-byte view of `layers` under `r`: ns each stream takes per layer (0 when a
/// stream reads nothing or was not measured).
fn stream_ns(b: &StreamBytes, r: StreamRates) -> (f64, f64, f64) {
    let t = |bytes: u64, rate: f64| if rate > 0.0 { bytes as f64 / rate } else { 0.0 };
    (
        t(b.attn, r.attn),
        t(b.dense, r.dense),
        t(b.experts, r.experts),
    )
}

/// Eq. 4.23 as time: Σ_ℓ max(t_attn, t_dense/(δd+1), t_expert/(δe+1)) ns per token, each
/// stream's time from its bytes at rate `r` (the vertical schedule's critical path).
pub fn critical_ns(layers: &[StreamBytes], dd: usize, de: usize, r: StreamRates) -> f64 {
    layers
        .iter()
        .map(|b| {
            let (a, d, e) = stream_ns(b, r);
            layer_term(a, d, e, dd, de)
        })
        .sum()
}

/// The fully serial time Σ_ℓ (t_attn + t_dense + t_expert) ns per token (the sequential
/// schedule).
pub fn serial_ns(layers: &[StreamBytes], r: StreamRates) -> f64 {
    layers
        .iter()
        .map(|b| {
            let (a, d, e) = stream_ns(b, r);
            a + d + e
        })
        .sum()
}

/// Paper-convention stream bytes (payload only: Q4 at 0.5 byte/param, no scales or headers), as
/// the engine reads them: a dense FFN whose input is known to be zero (ℓ < δd) reads nothing.
pub fn payload_stream_bytes(file: &crate::format::CflowFile) -> Vec<StreamBytes> {
    payload_bytes(file, true)
}

/// The same over every layer's stored weights, the zero-input dense FFNs included: the paper's
/// own accounting of eq. 4.23 (Table 4.1's 9.00 → 4.50 for arch2_4_combined).
pub fn payload_stream_bytes_all(file: &crate::format::CflowFile) -> Vec<StreamBytes> {
    payload_bytes(file, false)
}

fn payload_bytes(file: &crate::format::CflowFile, skip_zero_input: bool) -> Vec<StreamBytes> {
    let cfg = &file.cfg;
    crate::engine::styles::steps(cfg)
        .map(|st| {
            let lv = &file.layers[st.block];
            let attn = lv.q.payload_bytes()
                + lv.k.payload_bytes()
                + lv.v.payload_bytes()
                + lv.o.payload_bytes();
            let skipped = skip_zero_input
                && crate::engine::schedule::dense_input_is_zero(st.l, cfg.dense_delay);
            let dense: f64 = if skipped {
                0.0
            } else {
                [&lv.gate, &lv.up, &lv.down]
                    .iter()
                    .map(|m| m.as_ref().map_or(0.0, |m| m.payload_bytes()))
                    .sum()
            };
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

    /// arch5 at the paper's geometry (2 blocks × 3 iterations, d = 512): eq. 4.23 gives 6 × 1.50
    /// = 9.00 MiB; every stream of every pass is 3 × (2 blocks × 2.75 MiB) = 16.50 MiB.
    #[test]
    fn arch5_both_accountings() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a5.cflow");
        let mut s = crate::convert::generate::GenSpec::new("arch5");
        s.vocab = Some(256);
        crate::convert::generate::generate(&s, &p, |_, _| {}).unwrap();
        let f = crate::format::CflowFile::open(&p).unwrap();
        let v = fixed_point_accounting(&f).expect("arch5 iterates");
        assert_eq!(v["passes"], 6);
        assert_eq!(v["eq_4_23_mib"].as_f64(), Some(9.0));
        assert_eq!(v["all_streams_all_passes_mib"].as_f64(), Some(16.5));
        assert_eq!(v["unique_block_mib"].as_f64(), Some(5.5));
        assert!(fixed_point_line(&v).contains("9.00 MiB"));
    }

    #[test]
    fn time_prediction_divides_each_stream_by_its_rate() {
        let l = demo_layers();
        // 1 byte/ns for attention, 2 for dense, 0.5 for experts.
        let r = StreamRates {
            attn: 1.0,
            dense: 2.0,
            experts: 0.5,
        };
        let (a, d, e) = (MIB as f64 / 2.0, 0.75 * MIB as f64, 1.5 * MIB as f64);
        assert_eq!(serial_ns(&l, r), 6.0 * (a + d + e));
        // δd = 1, δe = 2: max(a, d/2, e/3) = a per layer.
        assert_eq!(critical_ns(&l, 1, 2, r), 6.0 * a);
        assert_eq!(critical_ns(&l, 0, 0, r), 6.0 * e);
        assert_eq!(critical_ns(&l, 1, 2, StreamRates::default()), 0.0);
    }
}
