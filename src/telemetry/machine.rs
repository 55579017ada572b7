//! The machine profile: CPU model, cores, ISA, RAM, cache sizes and a measured DRAM read
//! bandwidth ceiling per thread count; plus cheap process statistics (RSS, CPU%) for the status
//! line.
//!
//! The bandwidth probe ([`super::membw`]: ≥ 1 GiB, best of N, every thread count) is cached per
//! machine (key = CPU model + logical cores + RAM + probe method version) as JSON in
//! [`crate::util::cache_dir`], so only the first launch pays for it (a few seconds; the TUI runs
//! it in the background: [`MachineProfile::load_cached`], then [`MachineProfile::probe_and_cache`]).

use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

/// Static description of the machine a trace was recorded on.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct MachineProfile {
    pub cpu_model: String,
    pub physical_cores: u32,
    pub logical_cores: u32,
    /// ISA the kernels dispatched to (e.g. "avx2+fma"); supplied by the caller.
    pub isa: String,
    pub ram_bytes: u64,
    pub l1d_bytes: Option<u64>,
    pub l2_bytes: Option<u64>,
    pub l3_bytes: Option<u64>,
    pub kernel: Option<String>,
    /// Measured read bandwidth ceiling (None until probed).
    pub bandwidth: Option<Bandwidth>,
}

pub use super::membw::{probe_bandwidth, Bandwidth, ThreadCeiling};

impl MachineProfile {
    /// Detect everything except bandwidth (fast: a few sysfs/procfs reads).
    pub fn detect(isa: &str) -> MachineProfile {
        use sysinfo::{CpuRefreshKind, MemoryRefreshKind, RefreshKind, System};
        let sys = System::new_with_specifics(
            RefreshKind::nothing()
                .with_cpu(CpuRefreshKind::nothing())
                .with_memory(MemoryRefreshKind::nothing().with_ram()),
        );
        let logical = std::thread::available_parallelism()
            .map(|n| n.get() as u32)
            .unwrap_or(sys.cpus().len().max(1) as u32);
        let cpu_model = sys
            .cpus()
            .first()
            .map(|c| c.brand().trim().to_string())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "unknown CPU".into());
        let (l1d, l2, l3) = cache_sizes();
        MachineProfile {
            cpu_model,
            physical_cores: System::physical_core_count().unwrap_or(logical as usize) as u32,
            logical_cores: logical,
            isa: isa.to_string(),
            ram_bytes: sys.total_memory(),
            l1d_bytes: l1d,
            l2_bytes: l2,
            l3_bytes: l3,
            kernel: System::kernel_version(),
            bandwidth: None,
        }
    }

    /// [`detect`](Self::detect) plus the bandwidth ceiling, from the per-machine cache when
    /// present, else probed (a few seconds, once) and cached. Cache errors are ignored.
    pub fn load_or_probe(isa: &str) -> MachineProfile {
        let mut p = Self::load_cached(isa);
        if p.bandwidth.is_none() {
            p.probe_and_cache();
        }
        p
    }

    /// [`detect`](Self::detect) plus the cached bandwidth ceiling, if this machine has one
    /// (fast; `bandwidth` stays None otherwise: see [`Self::probe_and_cache`]).
    pub fn load_cached(isa: &str) -> MachineProfile {
        let mut p = Self::detect(isa);
        p.bandwidth = p.cached();
        p
    }

    /// The cached bandwidth ceiling of this machine, if any.
    pub fn cached(&self) -> Option<Bandwidth> {
        self.cache_path()
            .as_deref()
            .and_then(|f| self.cached_bandwidth(f))
    }

    /// Runs the bandwidth probe (≥ 1 GiB, every thread count: a few seconds), saves it in the
    /// per-machine cache (errors ignored: the next launch probes again) and returns it.
    pub fn probe_and_cache(&mut self) -> Bandwidth {
        let bw = probe_bandwidth(
            super::membw::BUFFER_BYTES,
            self.logical_cores as usize,
            super::membw::SAMPLES,
            super::membw::SAMPLE_BYTES,
        );
        if let Some(path) = self.cache_path() {
            let _ = self.save_bandwidth(&path, &bw);
        }
        self.bandwidth = Some(bw.clone());
        bw
    }

    /// Saves `bw` (a probe run elsewhere, e.g. `bench membw --save`) as this machine's profile
    /// and returns the file it went to.
    pub fn save_probe(&mut self, bw: &Bandwidth) -> anyhow::Result<PathBuf> {
        let path = self
            .cache_path()
            .ok_or_else(|| anyhow::anyhow!("no cache directory for the machine profile"))?;
        self.save_bandwidth(&path, bw)?;
        self.bandwidth = Some(bw.clone());
        Ok(path)
    }

    /// The cache key: CPU model, logical cores, RAM (GiB, rounded) and the probe's method
    /// version (a profile measured by an older, weaker probe is measured again).
    pub fn cache_key(&self) -> String {
        format!(
            "{} | {} cpus | {} GiB | {}",
            self.cpu_model,
            self.logical_cores,
            (self.ram_bytes + (1 << 29)) >> 30,
            super::membw::METHOD_VERSION
        )
    }

    /// Reads the cached profile at `path` (None when absent, unreadable, or for another key).
    pub fn cached_bandwidth(&self, path: &std::path::Path) -> Option<Bandwidth> {
        // A profile is a few hundred bytes; a FIFO planted there must not block the launch.
        crate::input::read_regular(path, 1 << 20)
            .ok()
            .and_then(|b| serde_json::from_slice::<CachedProbe>(&b).ok())
            .filter(|c| c.key == self.cache_key())
            .map(|c| c.bandwidth)
    }

    /// Saves `bw` as the cached profile at `path` (atomic replace).
    pub fn save_bandwidth(&self, path: &std::path::Path, bw: &Bandwidth) -> anyhow::Result<()> {
        let c = CachedProbe {
            key: self.cache_key(),
            bandwidth: bw.clone(),
        };
        // Atomic replace: a concurrent launch never reads a half-written profile.
        crate::output::Output::write_all_at(path, &serde_json::to_vec_pretty(&c)?)?;
        Ok(())
    }

    fn cache_path(&self) -> Option<PathBuf> {
        let dir = crate::util::cache_dir().ok()?;
        Some(dir.join(format!(
            "machine-{:016x}.json",
            crate::util::fnv1a(self.cache_key().as_bytes())
        )))
    }
}

#[derive(Serialize, Deserialize)]
struct CachedProbe {
    key: String,
    bandwidth: Bandwidth,
}

/// L1d / L2 / L3 sizes of cpu0 from `/sys/devices/system/cpu/cpu0/cache/index*/`.
pub fn cache_sizes() -> (Option<u64>, Option<u64>, Option<u64>) {
    let (mut l1d, mut l2, mut l3) = (None, None, None);
    let base = std::path::Path::new("/sys/devices/system/cpu/cpu0/cache");
    for i in 0..8 {
        let dir = base.join(format!("index{i}"));
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok();
        let (Some(level), Some(kind), Some(size)) = (read("level"), read("type"), read("size"))
        else {
            continue;
        };
        let Some(bytes) = parse_size(&size) else {
            continue;
        };
        match (level.trim(), kind.trim()) {
            ("1", "Data") => l1d = Some(bytes),
            ("2", "Unified" | "Data") => l2 = Some(bytes),
            ("3", "Unified" | "Data") => l3 = Some(bytes),
            _ => {}
        }
    }
    (l1d, l2, l3)
}

/// Parse sysfs cache sizes like "32K", "512K", "32768K", "1M", "4096".
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mul) = match s.as_bytes().last()? {
        b'K' | b'k' => (&s[..s.len() - 1], 1u64 << 10),
        b'M' | b'm' => (&s[..s.len() - 1], 1 << 20),
        b'G' | b'g' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.trim().parse::<u64>().ok().map(|n| n * mul)
}

/// Resident set size and CPU usage of this process.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ProcessStats {
    pub rss_bytes: u64,
    /// Percent of one core since the previous call (0 on the first call); may exceed 100.
    pub cpu_percent: f32,
}

/// RSS and CPU% of the current process via sysinfo. CPU% is the process's accumulated CPU time
/// (all threads) over wall time since the previous call (a shared state is kept; the first call
/// reports 0), so call it at the UI's refresh rate.
pub fn process_stats() -> ProcessStats {
    use sysinfo::{ProcessRefreshKind, ProcessesToUpdate, System};
    struct State {
        sys: System,
        last: Option<(Instant, u64)>,
    }
    static STATE: OnceLock<Mutex<State>> = OnceLock::new();
    let Ok(pid) = sysinfo::get_current_pid() else {
        return ProcessStats::default();
    };
    let m = STATE.get_or_init(|| {
        Mutex::new(State {
            sys: System::new(),
            last: None,
        })
    });
    let mut st = match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    };
    st.sys.refresh_processes_specifics(
        ProcessesToUpdate::Some(&[pid]),
        false,
        ProcessRefreshKind::nothing().with_memory().with_cpu(),
    );
    let now = Instant::now();
    let Some((rss, cpu_ms)) = st
        .sys
        .process(pid)
        .map(|p| (p.memory(), p.accumulated_cpu_time()))
    else {
        return ProcessStats::default();
    };
    let cpu_percent = match st.last {
        Some((t, prev)) if now > t => {
            let wall_ms = now.duration_since(t).as_secs_f64() * 1e3;
            (cpu_ms.saturating_sub(prev) as f64 / wall_ms * 100.0) as f32
        }
        _ => 0.0,
    };
    st.last = Some((now, cpu_ms));
    ProcessStats {
        rss_bytes: rss,
        cpu_percent,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("32K\n"), Some(32 << 10));
        assert_eq!(parse_size("32768K"), Some(32 << 20));
        assert_eq!(parse_size("1M"), Some(1 << 20));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("x"), None);
    }

    #[test]
    fn profile_saves_and_loads_with_its_method() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("machine.json");
        let p = MachineProfile {
            cpu_model: "Test CPU".into(),
            logical_cores: 2,
            ram_bytes: 24 << 30,
            ..MachineProfile::default()
        };
        let bw = probe_bandwidth(1 << 20, 2, 2, 16 << 20);
        p.save_bandwidth(&path, &bw).unwrap();
        let back = p.cached_bandwidth(&path).unwrap();
        assert_eq!(back, bw);
        assert_eq!(back.per_threads.len(), 2);
        assert!(back.method.contains("best of 2"), "{}", back.method);
        // Another machine (or an older probe version) does not reuse it.
        let other = MachineProfile {
            logical_cores: 4,
            ..p.clone()
        };
        assert!(other.cached_bandwidth(&path).is_none());
        // A profile cached by the old probe (no method version in its key) is measured again.
        let old_key = format!("{} | {} cpus | {} GiB", p.cpu_model, p.logical_cores, 24);
        let old = serde_json::json!({"key": old_key, "bandwidth": {
            "read_gbps_1t": 8.5, "read_gbps_nt": 12.0, "threads": 2, "buffer_bytes": 134217728u64,
            "probe_ms": 300.0, "init_ms": 100.0, "passes": 2, "measured": "2026-11-29T00:00:00Z"}});
        std::fs::write(&path, old.to_string()).unwrap();
        assert!(p.cached_bandwidth(&path).is_none());
    }
}
