//! The memory check at open: a model whose KV cache for its full context cannot fit in the
//! memory available now is refused with the computed sizes, instead of running out of memory
//! later as the context fills (the cache grows with use).
//!
//! Size: effective layers × 2 (K and V) × kv heads × head dim × bytes per value (2 for `--kv f16`,
//! 4 for `--kv f32`) × context positions. Available memory is
//! `MemAvailable` from `/proc/meminfo`, or the room left under the cgroup memory limit when
//! that is smaller (v2 `memory.max` or v1 `memory.limit_in_bytes`, in the process's own cgroup
//! and at the mount root). It is read after the engine is built, so the weights that are not mmapped
//! (the in-memory row-major copy) are already taken out of it; mmapped weights are page cache.
//! The context can be lowered at run time ([`cap_context`], `--max-ctx N`) to open a model
//! whose declared context does not fit.

use super::Engine;
use crate::engine::kv::KvType;
use crate::model::ModelConfig;
use std::path::{Path, PathBuf};

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

/// `MemAvailable`, or the room under the cgroup memory limit when smaller (cgroup v2
/// `memory.max` or v1 `memory.limit_in_bytes`, see [`cgroup_room`]); `None` when nothing can be
/// read (the check is then skipped).
pub fn available_memory() -> Option<Available> {
    available_memory_in(
        Path::new("/proc/meminfo"),
        Path::new("/sys/fs/cgroup"),
        Path::new("/proc/self/cgroup"),
    )
}

/// [`available_memory`] with the files it reads given: `meminfo` (`/proc/meminfo`), the cgroup
/// mount `root` (`/sys/fs/cgroup`) and the process's `self_cgroup` (`/proc/self/cgroup`).
pub fn available_memory_in(meminfo: &Path, root: &Path, self_cgroup: &Path) -> Option<Available> {
    let meminfo = std::fs::read_to_string(meminfo).ok().and_then(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("MemAvailable:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kb| Available {
                bytes: kb.saturating_mul(1024),
                source: "MemAvailable",
            })
    });
    let membership = std::fs::read_to_string(self_cgroup).unwrap_or_default();
    match (meminfo, cgroup_room(root, &membership)) {
        (Some(m), Some(c)) => Some(if c.bytes < m.bytes { c } else { m }),
        (m, c) => m.or(c),
    }
}

/// v1 "no limit" is a page-rounded `i64::MAX`; anything this large is no limit.
const NO_LIMIT: u64 = 1 << 60;

/// The room left under the process's cgroup memory limit, the smallest over both hierarchies:
/// v2 (`0::/path` in `membership`; `memory.max`, `memory.current`) and v1 (a `memory`
/// controller line; `memory/…/memory.limit_in_bytes`, `memory.usage_in_bytes`). Each is looked
/// up in the process's own cgroup directory and at the mount root (inside a container with a
/// cgroup namespace the own cgroup is the root). `None` without any limit.
pub fn cgroup_room(root: &Path, membership: &str) -> Option<Available> {
    let read = |p: PathBuf| -> Option<u64> { std::fs::read_to_string(p).ok()?.trim().parse().ok() };
    // Usage minus the file pages charged to the cgroup (the page cache, also of the model's own
    // mapping): the kernel reclaims those before it fails an allocation, so they are room.
    let used = |dir: &Path, usage: &str| -> Option<u64> {
        let u = read(dir.join(usage))?;
        Some(u.saturating_sub(file_pages(&dir.join("memory.stat"))))
    };
    let mut v2_path = None;
    let mut v1_path = None;
    for line in membership.lines() {
        let mut f = line.splitn(3, ':');
        let (_, ctrl, path) = (f.next(), f.next().unwrap_or(""), f.next().unwrap_or(""));
        let rel = path.trim_start_matches('/');
        if ctrl.is_empty() {
            v2_path = Some(rel.to_string());
        } else if ctrl.split(',').any(|c| c == "memory") {
            v1_path = Some(rel.to_string());
        }
    }
    let mut best: Option<Available> = None;
    let mut consider = |limit: Option<u64>, used: Option<u64>, source: &'static str| {
        if let Some(l) = limit.filter(|&l| l < NO_LIMIT) {
            let room = Available {
                bytes: l.saturating_sub(used.unwrap_or(0)),
                source,
            };
            if best.is_none_or(|b| room.bytes < b.bytes) {
                best = Some(room);
            }
        }
    };
    let v2_dirs = [v2_path.map(|p| root.join(p)), Some(root.to_path_buf())];
    for dir in v2_dirs.into_iter().flatten() {
        // "max" does not parse: no limit.
        consider(
            read(dir.join("memory.max")),
            used(&dir, "memory.current"),
            "cgroup v2 memory.max",
        );
    }
    let v1_root = root.join("memory");
    let v1_dirs = [v1_path.map(|p| v1_root.join(p)), Some(v1_root.clone())];
    for dir in v1_dirs.into_iter().flatten() {
        consider(
            read(dir.join("memory.limit_in_bytes")),
            used(&dir, "memory.usage_in_bytes"),
            "cgroup v1 memory.limit_in_bytes",
        );
    }
    best
}

/// File-backed (page-cache) bytes in a cgroup's `memory.stat`: `active_file + inactive_file`
/// (v1: the hierarchical `total_*` when present). 0 when unreadable.
fn file_pages(stat: &Path) -> u64 {
    let Ok(text) = std::fs::read_to_string(stat) else {
        return 0;
    };
    let get = |k: &str| -> Option<u64> {
        text.lines().find_map(|l| {
            let (key, v) = l.split_once(' ')?;
            (key == k).then(|| v.trim().parse().ok()).flatten()
        })
    };
    match (get("total_active_file"), get("total_inactive_file")) {
        (Some(a), Some(i)) => a + i,
        _ => get("active_file").unwrap_or(0) + get("inactive_file").unwrap_or(0),
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

    fn fake(files: &[(&str, &str)]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for (p, v) in files {
            let p = d.path().join(p);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, v).unwrap();
        }
        d
    }

    #[test]
    fn cgroup_v1_and_v2_limits_are_both_read() {
        const G: u64 = 1 << 30;
        let meminfo = format!("MemTotal: 1 kB\nMemAvailable: {} kB\n", 64 * G / 1024);
        // v1 only (a process OOM-killed inside a cgroup v1 limit): 2 GiB limit, 0.5 GiB used, in the own cgroup.
        let d = fake(&[
            ("meminfo", &meminfo),
            ("self", "12:memory:/job/7\n11:cpu,cpuacct:/job/7\n"),
            (
                "cg/memory/job/7/memory.limit_in_bytes",
                &(2 * G).to_string(),
            ),
            (
                "cg/memory/job/7/memory.usage_in_bytes",
                &(G / 2).to_string(),
            ),
            ("cg/memory/memory.limit_in_bytes", "9223372036854771712"),
        ]);
        let a = available_memory_in(
            &d.path().join("meminfo"),
            &d.path().join("cg"),
            &d.path().join("self"),
        )
        .unwrap();
        assert_eq!(
            (a.bytes, a.source),
            (3 * G / 2, "cgroup v1 memory.limit_in_bytes")
        );
        // The page cache charged to the cgroup is room (the kernel reclaims it first): 2 GiB
        // limit, 1.5 GiB used of which 1 GiB file pages → 1.5 GiB room (v1 hierarchical keys).
        let d = fake(&[
            ("cg/memory/job/memory.limit_in_bytes", &(2 * G).to_string()),
            ("cg/memory/job/memory.usage_in_bytes", &(3 * G / 2).to_string()),
            (
                "cg/memory/job/memory.stat",
                &format!(
                    "cache 1\nactive_file 5\ninactive_file 5\ntotal_active_file {}\ntotal_inactive_file {}\n",
                    G / 4,
                    3 * G / 4
                ),
            ),
        ]);
        let a = cgroup_room(&d.path().join("cg"), "4:memory:/job\n").unwrap();
        assert_eq!(a.bytes, 3 * G / 2);
        // v2's memory.stat: active_file + inactive_file.
        let d = fake(&[
            ("cg/u/memory.max", &(2 * G).to_string()),
            ("cg/u/memory.current", &(2 * G).to_string()),
            (
                "cg/u/memory.stat",
                &format!("anon 5\nactive_file {G}\ninactive_file {}\n", G / 2),
            ),
        ]);
        let a = cgroup_room(&d.path().join("cg"), "0::/u\n").unwrap();
        assert_eq!(a.bytes, 3 * G / 2);
        // v1 at the mount root (a container with a cgroup namespace).
        let d = fake(&[
            ("self", "5:memory:/\n"),
            ("cg/memory/memory.limit_in_bytes", &G.to_string()),
        ]);
        assert_eq!(
            cgroup_room(&d.path().join("cg"), "5:memory:/\n")
                .unwrap()
                .bytes,
            G
        );
        // v2: "max" is no limit, a number is; the smaller of v1 and v2 wins.
        let d = fake(&[("cg/memory.max", "max\n")]);
        assert!(cgroup_room(&d.path().join("cg"), "0::/\n").is_none());
        let d = fake(&[
            ("cg/user/memory.max", &(3 * G).to_string()),
            ("cg/user/memory.current", &G.to_string()),
            ("cg/memory/memory.limit_in_bytes", &(4 * G).to_string()),
        ]);
        let a = cgroup_room(&d.path().join("cg"), "0::/user\n").unwrap();
        assert_eq!((a.bytes, a.source), (2 * G, "cgroup v2 memory.max"));
        // MemAvailable wins when it is smaller; nothing readable: None.
        let d = fake(&[("meminfo", "MemAvailable: 1024 kB\n")]);
        let a = available_memory_in(
            &d.path().join("meminfo"),
            &d.path().join("cg"),
            &d.path().join("x"),
        )
        .unwrap();
        assert_eq!((a.bytes, a.source), (1 << 20, "MemAvailable"));
        assert!(available_memory_in(
            &d.path().join("no"),
            &d.path().join("no"),
            &d.path().join("no")
        )
        .is_none());
    }

    #[test]
    fn this_machine_reports_some_memory() {
        let a = available_memory().expect("Linux has /proc/meminfo");
        assert!(a.bytes > 0);
    }
}
