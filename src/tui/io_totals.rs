//! Per-token byte totals: the expert I/O (summed over layers) and the bytes a token read by
//! stream (the Streams pane's MiB/token and effective GB/s, also the Timeline's GB/s and the
//! Roofline's phases). The overlap model's prediction lives in `telemetry::overlap_model`.

use crate::telemetry::event::{ModelSummary, TokenStats};

/// The bytes one token read, by stream (as stored, scales included; KV at its position when the
/// session described its cache).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TokenBytes {
    pub attn: u64,
    pub dense: u64,
    pub experts: u64,
    /// None: the session did not describe its KV cache.
    pub kv: Option<u64>,
    pub vocab: u64,
}

impl TokenBytes {
    /// Sum the token's streams; `model` gives the KV reads at the token's position.
    pub fn of(model: Option<&ModelSummary>, stats: &TokenStats) -> TokenBytes {
        let mut t = TokenBytes {
            vocab: stats.lm_head_bytes,
            ..TokenBytes::default()
        };
        for l in &stats.layers {
            t.attn += l.bytes.attn;
            t.dense += l.bytes.dense;
            t.experts += l.bytes.experts;
        }
        t.kv = model.and_then(|m| {
            (0..stats.layers.len() as u32)
                .map(|l| m.kv_layer_read_bytes(l, stats.pos))
                .sum::<Option<u64>>()
        });
        t
    }

    /// Every byte of the token (KV included when known): the MiB/token.
    pub fn total(&self) -> u64 {
        self.attn + self.dense + self.experts + self.kv.unwrap_or(0) + self.vocab
    }

    /// The effective read rate over the token's time, GB/s (0 for an untimed token).
    pub fn gbps(&self, ns: u64) -> f64 {
        gbps(self.total(), ns)
    }
}

/// `bytes` over `ns` in GB/s (0 when `ns` is 0).
pub fn gbps(bytes: u64, ns: u64) -> f64 {
    if ns > 0 {
        bytes as f64 / ns as f64
    } else {
        0.0
    }
}

/// Per-token expert-I/O totals (summed over layers), tagged with the fetch mode in force.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct IoTotals {
    pub compute_ns: u64,
    pub io_ns: u64,
    pub wait_ns: u64,
    pub bytes: u64,
    pub layers_with_io: u32,
}

/// Bytes the token read from disk for its experts (routed, plus speculative reads it did not
/// use) and that rate over the token, "N MB/s" ("—" for an untimed token). Measured.
pub fn disk_read(stats: &TokenStats) -> (u64, String) {
    let bytes = stats
        .layers
        .iter()
        .filter_map(|l| l.io)
        .map(|io| io.bytes)
        .sum::<u64>()
        + stats.prefetch.map_or(0, |p| p.wasted_bytes);
    let secs = stats.ns_total as f64 / 1e9;
    let rate = if secs > 0.0 {
        format!("{:.0} MB/s", bytes as f64 / 1e6 / secs)
    } else {
        "—".into()
    };
    (bytes, rate)
}

impl IoTotals {
    /// Sum the `LayerStat.io` entries of a token (None when no layer had I/O).
    pub fn of(stats: &TokenStats) -> Option<IoTotals> {
        let mut t = IoTotals::default();
        for io in stats.layers.iter().filter_map(|l| l.io.as_ref()) {
            t.compute_ns += io.compute_ns;
            t.io_ns += io.io_ns;
            t.wait_ns += io.wait_ns;
            t.bytes += io.bytes;
            t.layers_with_io += 1;
        }
        (t.layers_with_io > 0).then_some(t)
    }

    /// Fraction of I/O time hidden behind compute: 1 − wait / io.
    pub fn hidden(&self) -> Option<f64> {
        (self.io_ns > 0).then(|| (1.0 - self.wait_ns as f64 / self.io_ns as f64).clamp(0.0, 1.0))
    }

    /// Add another total.
    pub fn add(&mut self, o: &IoTotals) {
        self.compute_ns += o.compute_ns;
        self.io_ns += o.io_ns;
        self.wait_ns += o.wait_ns;
        self.bytes += o.bytes;
        self.layers_with_io += o.layers_with_io;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hidden_share() {
        let t = IoTotals {
            compute_ns: 3,
            io_ns: 4,
            wait_ns: 1,
            bytes: 0,
            layers_with_io: 1,
        };
        assert!((t.hidden().unwrap() - 0.75).abs() < 1e-12);
    }
}
