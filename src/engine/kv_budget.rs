//! The memory check at open: a model whose KV cache for its full context cannot fit in the
//! memory available now is refused with the computed sizes, instead of running out of memory
//! later as the context fills (the cache grows with use).
//!
//! Size: effective layers × 2 (K and V) × kv heads × head dim × bytes per value (2 for `--kv f16`,
//! 4 for `--kv f32`) × context positions. Available memory is
//! `MemAvailable` from `/proc/meminfo`, or the room left under a cgroup v2 `memory.max` when
//! that is smaller. It is read after the engine is built, so the weights that are not mmapped
//! (the in-memory row-major copy) are already taken out of it; mmapped weights are page cache.
//! The context can be lowered at run time ([`cap_context`], `--max-ctx N`) to open a model
//! whose declared context does not fit.

use super::Engine;
use crate::model::kv::KvType;
use crate::model::ModelConfig;

/// Memory that can be allocated now, and where the number comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Available {
    pub bytes: u64,
    pub source: &'static str,
}

/// The refusal, with every factor of the computation.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "KV cache for ctx {ctx}: {layers} layers × 2 × {kv_heads} kv heads × {head_dim} dims × \
     {elem_bytes} B × {ctx} positions = {} > {} available memory ({mem_source}); \
     it fits with --max-ctx {fits} or less",
    size(*need), size(*available)
)]
pub struct KvTooLarge {
    pub ctx: usize,
    pub layers: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub elem_bytes: u64,
    pub need: u64,
    pub available: u64,
    pub mem_source: &'static str,
    /// The largest context whose cache fits.
    pub fits: u64,
}

/// `bytes` as GiB with one decimal (MiB below 1 GiB).
fn size(bytes: u64) -> String {
    let g = bytes as f64 / (1u64 << 30) as f64;
    if g >= 1.0 {
        format!("{g:.1} GiB")
    } else {
        format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
    }
}

/// Bytes of the KV cache of one context position, with values of type `ty`.
pub fn bytes_per_position(cfg: &ModelConfig, ty: KvType) -> u64 {
    cfg.effective_layers() as u64 * 2 * cfg.kv_dim() as u64 * ty.bytes() as u64
}

/// Refuses `cfg` when its full-context KV cache of `ty` values exceeds `avail` (no check when
/// unknown).
pub fn check(cfg: &ModelConfig, ty: KvType, avail: Option<Available>) -> Result<(), KvTooLarge> {
    let Some(avail) = avail else {
        return Ok(());
    };
    let per = bytes_per_position(cfg, ty);
    let need = (per as u128 * cfg.max_ctx as u128).min(u64::MAX as u128) as u64;
    if need <= avail.bytes {
        return Ok(());
    }
    Err(KvTooLarge {
        ctx: cfg.max_ctx,
        layers: cfg.effective_layers(),
        kv_heads: cfg.n_kv_heads,
        head_dim: cfg.head_dim,
        elem_bytes: ty.bytes() as u64,
        need,
        available: avail.bytes,
        mem_source: avail.source,
        fits: avail.bytes / per.max(1),
    })
}

/// Lowers the context the engine will run to at most `n` positions (`n` ≥ 1).
pub fn cap_context(engine: &mut Engine, n: usize) {
    engine.cap_context(n);
}

/// `MemAvailable`, or the room under the cgroup v2 limit when smaller; `None` when neither can
/// be read (the check is then skipped).
pub fn available_memory() -> Option<Available> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok().and_then(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("MemAvailable:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kb| Available {
                bytes: kb.saturating_mul(1024),
                source: "MemAvailable",
            })
    });
    let read = |p: &str| -> Option<u64> { std::fs::read_to_string(p).ok()?.trim().parse().ok() };
    let cgroup = read("/sys/fs/cgroup/memory.max").map(|max| Available {
        bytes: max.saturating_sub(read("/sys/fs/cgroup/memory.current").unwrap_or(0)),
        source: "cgroup memory.max",
    });
    match (meminfo, cgroup) {
        (Some(m), Some(c)) => Some(if c.bytes < m.bytes { c } else { m }),
        (m, c) => m.or(c),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::generate::GenSpec;

    fn cfg(ctx: usize) -> ModelConfig {
        let mut s = GenSpec::new("llama");
        s.layers = Some(30);
        s.hidden = Some(576);
        s.heads = Some(9);
        s.kv_heads = Some(3);
        s.ctx = Some(ctx);
        s.config().unwrap()
    }

    #[test]
    fn refuses_with_the_computed_sizes() {
        // SmolLM2-135M's geometry at a 1 Mi context against 22.1 GiB.
        let avail = Available {
            bytes: (22.1 * (1u64 << 30) as f64) as u64,
            source: "MemAvailable",
        };
        let e = check(&cfg(1 << 20), KvType::F32, Some(avail)).unwrap_err();
        assert_eq!(e.need, 30 * 2 * 3 * 64 * 4 * (1 << 20));
        let msg = e.to_string();
        assert!(
            msg.starts_with(
                "KV cache for ctx 1048576: 30 layers × 2 × 3 kv heads × 64 dims × 4 B × \
                 1048576 positions = 45.0 GiB > 22.1 GiB available memory (MemAvailable)"
            ),
            "{msg}"
        );
        assert_eq!(e.fits, avail.bytes / (30 * 2 * 3 * 64 * 4));
        assert!(
            msg.ends_with(&format!("; it fits with --max-ctx {} or less", e.fits)),
            "{msg}"
        );
        // The largest fitting context passes, one more position does not.
        let fits = e.fits as usize;
        assert!(check(&cfg(fits), KvType::F32, Some(avail)).is_ok());
        assert!(check(&cfg(fits + 1), KvType::F32, Some(avail)).is_err());
        // An f16 cache takes half: twice the context fits.
        let e16 = check(&cfg(1 << 20), KvType::F16, Some(avail)).unwrap_err();
        assert_eq!((e16.need * 2, e16.elem_bytes), (e.need, 2));
        assert!(check(&cfg(2 * fits), KvType::F16, Some(avail)).is_ok());
        assert!(check(&cfg(2 * fits + 2), KvType::F16, Some(avail)).is_err());
        // Unknown memory: no check.
        assert!(check(&cfg(1 << 24), KvType::F32, None).is_ok());
    }

    #[test]
    fn this_machine_reports_some_memory() {
        let a = available_memory().expect("Linux has /proc/meminfo");
        assert!(a.bytes > 0);
    }
}
