//! The machine profile: CPU model, cores, ISA, RAM, cache sizes and a measured DRAM read
//! bandwidth ceiling; plus cheap process statistics (RSS, CPU%) for the status line.
//!
//! The bandwidth probe sums a 128 MiB `u64` buffer (4× the L3 here; see [`PROBE_BYTES`]) with 1 thread and
//! with N threads (N = logical cores), best of a few passes inside a ≤ 300 ms budget including
//! the allocation. It is cached per machine (key = CPU model + logical cores + RAM) as JSON in
//! [`crate::util::cache_dir`], so only the first launch pays for it.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::{Barrier, Mutex, OnceLock};
use std::time::{Duration, Instant};

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

/// Result of the read-bandwidth probe. GB = 1e9 bytes.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Bandwidth {
    pub read_gbps_1t: f64,
    pub read_gbps_nt: f64,
    /// Thread count of the `read_gbps_nt` measurement.
    pub threads: u32,
    pub buffer_bytes: u64,
    /// Wall time of the whole probe (allocation included), ms.
    pub probe_ms: f64,
    /// Of which: allocating and first-touching the buffer, ms.
    pub init_ms: f64,
    /// Timed passes per thread count (best one reported).
    pub passes: u32,
    /// RFC 3339 time of the measurement.
    pub measured: String,
}

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
    /// present, else probed (≤ 300 ms) and cached. Cache errors are ignored (probe again).
    pub fn load_or_probe(isa: &str) -> MachineProfile {
        let mut p = Self::detect(isa);
        let path = p.cache_path();
        if let Some(bw) = path
            .as_ref()
            .and_then(|f| std::fs::read(f).ok())
            .and_then(|b| serde_json::from_slice::<CachedProbe>(&b).ok())
            .filter(|c| c.key == p.cache_key())
        {
            p.bandwidth = Some(bw.bandwidth);
            return p;
        }
        let bw = probe_bandwidth(PROBE_BYTES, p.logical_cores as usize, PROBE_BUDGET);
        if let Some(path) = path {
            let c = CachedProbe {
                key: p.cache_key(),
                bandwidth: bw.clone(),
            };
            if let Ok(s) = serde_json::to_vec_pretty(&c) {
                // Atomic replace: a concurrent launch never reads a half-written profile.
                let _ = crate::output::Output::create(&path, &[]).and_then(|mut o| {
                    std::io::Write::write_all(&mut o, &s).map_err(|e| o.error("write", e))?;
                    o.commit().map(drop)
                });
            }
        }
        p.bandwidth = Some(bw);
        p
    }

    /// The cache key: CPU model, logical cores and RAM (GiB, rounded).
    pub fn cache_key(&self) -> String {
        format!(
            "{} | {} cpus | {} GiB",
            self.cpu_model,
            self.logical_cores,
            (self.ram_bytes + (1 << 29)) >> 30
        )
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

/// Default probe buffer: 128 MiB (4× a 32 MiB L3). 256 MiB would be closer to STREAM practice,
/// but first-touching it alone takes ~300 ms on the 2-core KVM guest (4 KiB pages; THP is
/// `madvise`-only and `madvise` needs `unsafe`, which telemetry does not use).
pub const PROBE_BYTES: usize = 128 << 20;
/// Default probe budget (allocation + all passes).
pub const PROBE_BUDGET: Duration = Duration::from_millis(300);

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

/// Sum a slice with 8 independent accumulators (vectorizes to packed adds).
#[inline(never)]
fn sum_u64(s: &[u64]) -> u64 {
    let mut acc = [0u64; 8];
    let mut chunks = s.chunks_exact(8);
    for c in &mut chunks {
        for k in 0..8 {
            acc[k] = acc[k].wrapping_add(c[k]);
        }
    }
    let tail = chunks
        .remainder()
        .iter()
        .fold(0u64, |a, &x| a.wrapping_add(x));
    acc.iter().fold(tail, |a, &x| a.wrapping_add(x))
}

/// One timed read pass over `buf` split among `threads`. Each worker stamps its own start (after
/// a common barrier) and end; the pass time is last end − first start, so a descheduled
/// coordinating thread cannot shorten it.
fn timed_pass(buf: &[u64], threads: usize) -> (Duration, u64) {
    let threads = threads.max(1);
    if threads == 1 {
        let t0 = Instant::now();
        let s = std::hint::black_box(sum_u64(std::hint::black_box(buf)));
        return (t0.elapsed(), s);
    }
    let chunk = buf.len().div_ceil(threads);
    let barrier = Barrier::new(threads);
    let results: Vec<(Instant, Instant, u64)> = std::thread::scope(|sc| {
        let hs: Vec<_> = buf
            .chunks(chunk)
            .map(|part| {
                let b = &barrier;
                sc.spawn(move || {
                    b.wait();
                    let t0 = Instant::now();
                    let s = std::hint::black_box(sum_u64(std::hint::black_box(part)));
                    (t0, Instant::now(), s)
                })
            })
            .collect();
        hs.into_iter().filter_map(|h| h.join().ok()).collect()
    });
    let (Some(start), Some(end)) = (
        results.iter().map(|r| r.0).min(),
        results.iter().map(|r| r.1).max(),
    ) else {
        return (Duration::MAX, 0);
    };
    let sum = results.iter().fold(0u64, |a, r| a.wrapping_add(r.2));
    (end - start, sum)
}

/// Measure the read bandwidth ceiling: sum over `bytes` of `u64`s with 1 and `threads` threads,
/// best pass of each, within roughly `budget` (allocation and first touch included; at least
/// one pass of each kind always runs). GB/s with GB = 1e9 B.
pub fn probe_bandwidth(bytes: usize, threads: usize, budget: Duration) -> Bandwidth {
    let start = Instant::now();
    let threads = threads.max(1);
    let n = (bytes / 8).max(1024);
    // Write every element (first touch, in parallel): a calloc'd buffer would map the shared
    // zero page and measure the cache instead of DRAM.
    let mut buf: Vec<u64> = vec![0; n];
    let chunk = n.div_ceil(threads);
    std::thread::scope(|sc| {
        for (ci, part) in buf.chunks_mut(chunk).enumerate() {
            sc.spawn(move || {
                for (i, x) in part.iter_mut().enumerate() {
                    *x = (ci * chunk + i) as u64;
                }
            });
        }
    });
    let init = start.elapsed();
    let expected = (n as u64).wrapping_mul(n as u64 - 1) / 2;
    let bytes_read = (n * 8) as f64;
    let mut best1 = Duration::MAX;
    let mut bestn = Duration::MAX;
    // Warm-up (TLB, THP) then alternate 1-thread and N-thread passes while the budget lasts.
    let _ = timed_pass(&buf, threads);
    let mut passes = 0u32;
    loop {
        let (d1, s1) = timed_pass(&buf, 1);
        let (dn, sn) = timed_pass(&buf, threads);
        debug_assert_eq!(s1, expected, "bandwidth probe sum mismatch");
        debug_assert_eq!(sn, expected, "bandwidth probe sum mismatch");
        best1 = best1.min(d1);
        bestn = bestn.min(dn);
        passes += 1;
        let spent = start.elapsed();
        let per_round = (spent - init) / (passes + 1); // +1: the warm-up pass
        if passes >= 8 || (passes >= 2 && spent + per_round > budget) {
            break;
        }
    }
    drop(buf);
    // Rounded: the noise is far above 0.01 GB/s, and short decimals round-trip exactly in JSON.
    let round = |x: f64, q: f64| (x * q).round() / q;
    Bandwidth {
        read_gbps_1t: round(bytes_read / best1.as_secs_f64() / 1e9, 100.0),
        read_gbps_nt: round(bytes_read / bestn.as_secs_f64() / 1e9, 100.0),
        threads: threads as u32,
        buffer_bytes: (n * 8) as u64,
        probe_ms: round(start.elapsed().as_secs_f64() * 1e3, 10.0),
        init_ms: round(init.as_secs_f64() * 1e3, 10.0),
        passes,
        measured: super::recorder::rfc3339(std::time::SystemTime::now()),
    }
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
    fn sum_is_exact() {
        let v: Vec<u64> = (0..1003).collect();
        assert_eq!(sum_u64(&v), 1003 * 1002 / 2);
    }

    #[test]
    fn small_probe_runs() {
        let bw = probe_bandwidth(4 << 20, 2, Duration::from_millis(20));
        assert!(bw.read_gbps_1t > 0.1 && bw.read_gbps_nt > 0.1, "{bw:?}");
    }
}
