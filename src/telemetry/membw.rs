//! The DRAM read-bandwidth probe behind the roofline (the read ceiling the Streams pane compares
//! a token's effective GB/s against), following `../shared/bench/membw.c`:
//!
//! * a buffer of [`BUFFER_BYTES`] (1 GiB, far beyond any L3 here), first-touched in parallel so
//!   no page is the shared zero page. It is the same kind of memory as the resident copy of the
//!   weights (`format::mmap::huge_anon`: anonymous, advised for transparent huge pages), so the
//!   ceiling is measured on the pages decode streams from. Under KVM a 4 KiB-page read pays
//!   two-level page walks that the weights do not: `membw.c` (4 KiB pages) read 23–34 GB/s on
//!   two threads where this buffer read 32–60 (docs/PERFORMANCE.md, "Machine"). The
//!   share of the buffer the kernel actually backed with huge pages is reported;
//! * a read-only sum with 8 independent accumulators (vectorised loads, no stores);
//! * every sample moves at least [`SAMPLE_BYTES`] (1 GiB; small buffers loop over themselves),
//!   and is timed from the first worker's start to the last worker's end (after a barrier), so a
//!   descheduled coordinator cannot shorten it;
//! * best (minimum time) of [`SAMPLES`] samples, for **every** thread count 1..=N, after a
//!   warm-up sample — the ceiling is per thread count because one core cannot saturate DRAM.
//!
//! GB/s with GB = 1e9 bytes. The result says how it was measured ([`Bandwidth::method`]) and the
//! UI shows that beside the percentage.

use serde::{Deserialize, Serialize};
use std::sync::Barrier;
use std::time::{Duration, Instant};

/// Probe buffer size (1 GiB).
pub const BUFFER_BYTES: usize = 1 << 30;
/// Bytes each timed sample reads at least (1 GiB).
pub const SAMPLE_BYTES: u64 = 1 << 30;
/// Timed samples per thread count (the best is kept).
pub const SAMPLES: u32 = 5;
/// Version of the method, part of the machine-profile cache key.
pub const METHOD_VERSION: &str = "read-probe v4 (huge pages, page size first)";

/// The read ceiling measured with one thread count.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ThreadCeiling {
    pub threads: u32,
    pub read_gbps: f64,
}

/// Result of the read-bandwidth probe. GB = 1e9 bytes.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Bandwidth {
    /// Best with 1 thread.
    pub read_gbps_1t: f64,
    /// Best with `threads` threads.
    pub read_gbps_nt: f64,
    /// Largest thread count measured.
    pub threads: u32,
    pub buffer_bytes: u64,
    /// Wall time of the whole probe (allocation included), ms.
    pub probe_ms: f64,
    /// Of which: allocating and first-touching the buffer, ms.
    pub init_ms: f64,
    /// Timed samples per thread count (best one reported).
    pub passes: u32,
    /// RFC 3339 time of the measurement.
    pub measured: String,
    /// Best per thread count, 1..=threads (absent in profiles of the old probe).
    #[serde(default)]
    pub per_threads: Vec<ThreadCeiling>,
    /// How it was measured, for the UI (absent in profiles of the old probe).
    #[serde(default)]
    pub method: String,
    /// Share of the probe buffer backed by transparent huge pages, 0–1 (None: unknown, or a
    /// profile of an older probe, which read 4 KiB pages).
    #[serde(default)]
    pub huge_page_share: Option<f64>,
}

impl Bandwidth {
    /// The read ceiling for `threads` engine threads: the measurement with that many threads,
    /// else the largest thread count measured below it, else the widest measurement.
    pub fn ceiling_for(&self, threads: u32) -> Option<ThreadCeiling> {
        let t = threads.max(1);
        if let Some(c) = self.per_threads.iter().find(|c| c.threads == t) {
            return Some(*c);
        }
        if let Some(c) = self
            .per_threads
            .iter()
            .filter(|c| c.threads < t)
            .max_by_key(|c| c.threads)
        {
            return Some(*c);
        }
        match (t, self.threads) {
            (1, _) if self.read_gbps_1t > 0.0 => Some(ThreadCeiling {
                threads: 1,
                read_gbps: self.read_gbps_1t,
            }),
            (_, n) if self.read_gbps_nt > 0.0 => Some(ThreadCeiling {
                threads: n,
                read_gbps: self.read_gbps_nt,
            }),
            _ => None,
        }
    }
}

/// Sum of the little-endian u64 words of `s` (length a multiple of 8), 8 independent
/// accumulators (vectorizes to packed loads and adds).
#[inline(never)]
fn sum_u64(s: &[u8]) -> u64 {
    let word = |c: &[u8]| u64::from_le_bytes(c.try_into().expect("8 bytes"));
    let mut acc = [0u64; 8];
    let mut chunks = s.chunks_exact(64);
    for c in &mut chunks {
        for k in 0..8 {
            acc[k] = acc[k].wrapping_add(word(&c[8 * k..8 * k + 8]));
        }
    }
    let tail = chunks
        .remainder()
        .chunks_exact(8)
        .fold(0u64, |a, c| a.wrapping_add(word(c)));
    acc.iter().fold(tail, |a, &x| a.wrapping_add(x))
}

/// One timed sample: `threads` workers each read their share of `buf` `loops` times.
fn timed_sample(buf: &[u8], threads: usize, loops: u64) -> (Duration, u64) {
    let threads = threads.max(1);
    let run = |part: &[u8]| {
        let mut s = 0u64;
        for _ in 0..loops {
            s = s.wrapping_add(std::hint::black_box(sum_u64(std::hint::black_box(part))));
        }
        s
    };
    if threads == 1 {
        let t0 = Instant::now();
        let s = run(buf);
        return (t0.elapsed(), s);
    }
    let chunk = (buf.len() / 8).div_ceil(threads) * 8;
    let barrier = Barrier::new(threads);
    let results: Vec<(Instant, Instant, u64)> = std::thread::scope(|sc| {
        let hs: Vec<_> = buf
            .chunks(chunk)
            .map(|part| {
                let b = &barrier;
                let run = &run;
                sc.spawn(move || {
                    b.wait();
                    let t0 = Instant::now();
                    let s = run(part);
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

/// Measure the read ceiling over a `buffer_bytes` buffer for every thread count 1..=`max_threads`:
/// best of `samples` timed samples (each reading ≥ `sample_bytes`), after one warm-up sample.
pub fn probe_bandwidth(
    buffer_bytes: usize,
    max_threads: usize,
    samples: u32,
    sample_bytes: u64,
) -> Bandwidth {
    let start = Instant::now();
    let max_threads = max_threads.max(1);
    let samples = samples.max(1);
    let n = (buffer_bytes / 8).max(1024);
    // The weights' kind of memory (huge pages); a plain allocation if that mapping fails.
    let mut mapped = crate::format::mmap::huge_anon(n * 8).ok();
    let addr = mapped.as_ref().map(|m| m.as_ptr() as usize);
    let mut heap = Vec::new();
    let buf: &mut [u8] = match mapped.as_mut() {
        Some(m) => m,
        None => {
            heap.resize(n * 8, 0u8);
            &mut heap
        }
    };
    // Write every word (first touch, in parallel): untouched anonymous memory maps the shared
    // zero page and would measure the cache instead of DRAM.
    let chunk = n.div_ceil(max_threads) * 8;
    std::thread::scope(|sc| {
        for (ci, part) in buf.chunks_mut(chunk).enumerate() {
            sc.spawn(move || {
                for (i, x) in part.chunks_exact_mut(8).enumerate() {
                    x.copy_from_slice(&((ci * chunk / 8 + i) as u64).to_le_bytes());
                }
            });
        }
    });
    let buf: &[u8] = buf;
    let huge_page_share = addr.and_then(|a| {
        crate::format::mmap::anon_huge_kib(a)
            .map(|kib| ((kib * 1024) as f64 / (n * 8) as f64).min(1.0))
    });
    let init = start.elapsed();
    let bytes = (n * 8) as u64;
    let loops = sample_bytes.div_ceil(bytes).max(1);
    let expected = ((n as u64).wrapping_mul(n as u64 - 1) / 2).wrapping_mul(loops);
    let moved = (bytes * loops) as f64;
    // Warm-up (TLB).
    let _ = timed_sample(buf, max_threads, 1);
    // Rounded: the noise is far above 0.01 GB/s, and short decimals round-trip exactly in JSON.
    let round = |x: f64, q: f64| (x * q).round() / q;
    let mut per_threads = Vec::with_capacity(max_threads);
    for t in 1..=max_threads {
        let mut best = Duration::MAX;
        for _ in 0..samples {
            let (d, s) = timed_sample(buf, t, loops);
            debug_assert_eq!(s, expected, "bandwidth probe sum mismatch");
            best = best.min(d);
        }
        per_threads.push(ThreadCeiling {
            threads: t as u32,
            read_gbps: round(moved / best.as_secs_f64().max(1e-9) / 1e9, 100.0),
        });
    }
    drop(mapped);
    drop(heap);
    // The page size first: the Streams pane shows this in a narrow column and cuts the end.
    let pages = match huge_page_share {
        Some(h) if h >= 0.5 => format!("2 MiB pages ({:.0}%)", 100.0 * h),
        Some(h) => format!("4 KiB pages (THP gave {:.0}%)", 100.0 * h),
        None => "pages unknown".to_string(),
    };
    let method = format!(
        "{pages}, read Σu64 over {} MiB, best of {samples} × {} MiB per thread count",
        bytes >> 20,
        (bytes * loops) >> 20
    );
    Bandwidth {
        read_gbps_1t: per_threads[0].read_gbps,
        read_gbps_nt: per_threads[max_threads - 1].read_gbps,
        threads: max_threads as u32,
        buffer_bytes: bytes,
        probe_ms: round(start.elapsed().as_secs_f64() * 1e3, 10.0),
        init_ms: round(init.as_secs_f64() * 1e3, 10.0),
        passes: samples,
        measured: super::recorder::rfc3339(std::time::SystemTime::now()),
        per_threads,
        method,
        huge_page_share,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sum_is_exact() {
        // 1003 words: 125 chunks of 64 bytes and a tail of 3 words.
        let v: Vec<u8> = (0..1003u64).flat_map(|x| x.to_le_bytes()).collect();
        assert_eq!(sum_u64(&v), 1003 * 1002 / 2);
    }

    #[test]
    fn small_probe_covers_every_thread_count_and_says_how() {
        let bw = probe_bandwidth(1 << 20, 2, 3, 8 << 20);
        assert_eq!(
            bw.per_threads.iter().map(|c| c.threads).collect::<Vec<_>>(),
            [1, 2]
        );
        assert!(bw.per_threads.iter().all(|c| c.read_gbps > 0.1), "{bw:?}");
        assert_eq!(bw.read_gbps_1t, bw.per_threads[0].read_gbps);
        assert_eq!(bw.passes, 3);
        assert!(
            bw.method
                .ends_with(", read Σu64 over 1 MiB, best of 3 × 8 MiB per thread count")
                && ["2 MiB pages (", "4 KiB pages (", "pages unknown"]
                    .iter()
                    .any(|p| bw.method.starts_with(p)),
            "{}",
            bw.method
        );
    }

    #[test]
    fn the_probe_says_how_much_of_its_buffer_is_in_huge_pages() {
        // 8 MiB: large enough for 2 MiB pages where THP is enabled; the share is reported
        // either way on Linux (smaps), and the method says which page size it measured.
        let bw = probe_bandwidth(8 << 20, 1, 1, 8 << 20);
        let share = bw.huge_page_share.expect("smaps is readable on Linux");
        assert!((0.0..=1.0).contains(&share), "{share}");
        let want = if share >= 0.5 {
            "2 MiB pages ("
        } else {
            "4 KiB pages (THP gave "
        };
        assert!(bw.method.starts_with(want), "{}", bw.method);
    }

    #[test]
    fn ceiling_for_thread_counts() {
        let bw = Bandwidth {
            read_gbps_1t: 11.8,
            read_gbps_nt: 21.5,
            threads: 2,
            per_threads: vec![
                ThreadCeiling {
                    threads: 1,
                    read_gbps: 11.8,
                },
                ThreadCeiling {
                    threads: 2,
                    read_gbps: 21.5,
                },
            ],
            ..Bandwidth::default()
        };
        assert_eq!(bw.ceiling_for(1).unwrap().read_gbps, 11.8);
        assert_eq!(bw.ceiling_for(2).unwrap().read_gbps, 21.5);
        assert_eq!(bw.ceiling_for(8).unwrap().threads, 2);
        // An old profile (no per-thread list) still answers for 1 and N threads.
        let old = Bandwidth {
            per_threads: vec![],
            ..bw.clone()
        };
        assert_eq!(old.ceiling_for(1).unwrap().read_gbps, 11.8);
        assert_eq!(old.ceiling_for(2).unwrap().read_gbps, 21.5);
        assert!(Bandwidth::default().ceiling_for(1).is_none());
    }
}
