//! Whether the kernels' own prefetch ([`super::prefetch::KernelPrefetch`]) pays on this CPU,
//! measured: each kernel family streams a synthetic matrix larger than the last-level cache on
//! one thread, with its prefetch on and off in alternating rounds, and keeps it only where it
//! is not slower. The hint's worth is a property of the CPU and the layout: on the Zen 4 guest
//! of docs/PERFORMANCE.md SmolLM2's repacked decode ran ~30 % faster without it and its
//! file-layout decode ~45 % slower, while earlier machines gained on both. It is also a
//! property of the pages: the probe streams from the memory the resident weights live in
//! (transparent huge pages), since the hint can pay on 4 KiB pages and cost on huge ones.

use super::dot::{kquant, packed, Q8Act, Tile};
use super::prefetch::{self, KernelPrefetch};
use super::Isa;
use crate::quant::QuantType;
use std::time::Instant;

/// Rows and columns of one synthetic tile (the file's tile shape).
const ROWS: usize = 128;
const COLS: usize = 256;

/// Measured rounds per family (after one warm-up pass of each arm).
pub const ROUNDS: usize = 7;

/// Prefetch stays on unless turning it off makes the stream this much faster (the median of
/// the per-round time ratios on / off): a smaller gain is within this probe's noise.
pub const OFF_ABOVE: f64 = 1.03;

/// A kernel family: one of [`KernelPrefetch`]'s fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    Repacked,
    Split,
    Superblock,
}

impl Family {
    /// `p` with this family's field set to `on`.
    fn set(self, mut p: KernelPrefetch, on: bool) -> KernelPrefetch {
        match self {
            Family::Repacked => p.repacked = on,
            Family::Split => p.split = on,
            Family::Superblock => p.superblock = on,
        }
        p
    }
}

/// One family's measurement.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct FamilyProbe {
    pub family: Family,
    /// The quant type streamed.
    pub quant: String,
    /// Median pass time with the prefetch on and off, ms.
    pub on_ms: f64,
    pub off_ms: f64,
    /// Median over rounds of on / off time (above 1: the prefetch costs).
    pub on_over_off: f64,
    /// Whether the family keeps its prefetch (`on_over_off` ≤ [`OFF_ABOVE`]).
    pub prefetch: bool,
}

/// The probe's result.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Probe {
    /// Bytes each pass streams.
    pub bytes: u64,
    pub rounds: usize,
    pub families: Vec<FamilyProbe>,
}

impl Probe {
    /// The setting the probe chose.
    pub fn choice(&self) -> KernelPrefetch {
        self.families
            .iter()
            .fold(KernelPrefetch::ALL, |c, f| f.family.set(c, f.prefetch))
    }
}

/// Bytes a pass streams: twice the last-level cache (so the stream comes from DRAM), at least
/// 64 MiB, at most 256 MiB (a CPU reporting a larger cache is measured partly in it).
pub fn pass_bytes(l3: Option<u64>) -> usize {
    let want = l3.unwrap_or(0).saturating_mul(2);
    want.clamp(64 << 20, 256 << 20) as usize
}

/// Runs the probe on `isa` over `bytes` of synthetic weights (see [`pass_bytes`]) and leaves
/// the process's setting as it found it. About 50 passes: ~0.2 s for 64 MiB at 25 GB/s.
pub fn run(isa: Isa, bytes: usize) -> Probe {
    let before = prefetch::kernel();
    // Every byte 0x11: finite f16 scales, nibbles of 1; the values do not matter, only the
    // bytes streamed. The bytes sit in the kind of memory the resident weights are streamed
    // from (`format::mmap::huge_anon`, transparent huge pages): on the Zen 4 guest the hint
    // cost repacked decode 1.26× at one thread from such pages, while from a heap buffer in
    // 4 KiB pages it sped the same kernel up 1.28×, so a probe on other pages chose wrong.
    let mut mapped = crate::format::mmap::huge_anon(bytes).ok();
    let mut heap = Vec::new();
    let buf: &mut [u8] = match mapped.as_mut() {
        Some(m) => &mut m[..],
        None => {
            heap.resize(bytes, 0);
            &mut heap
        }
    };
    buf.fill(0x11);
    let buf = &*buf;
    let mut x = vec![0.0f32; COLS];
    for (i, v) in x.iter_mut().enumerate() {
        *v = ((i % 17) as f32 - 8.0) / 8.0;
    }
    let mut act = Q8Act::default();
    act.quantize_for(&x, [QuantType::Q4_1, QuantType::Q4_K]);
    let mut y = vec![0.0f32; ROWS];
    let mut families = Vec::new();
    let kernel = packed::Kernel::of(isa);
    // Only the AVX-512 VNNI repacked kernel prefetches (the AVX2 one never did).
    let mut cases = Vec::new();
    if isa.available() && kernel.path() == packed::Path::Vnni {
        cases.push((Family::Repacked, QuantType::Q4_1));
    }
    cases.push((Family::Split, QuantType::Q4_1));
    cases.push((Family::Superblock, QuantType::Q4_K));
    for (family, q) in cases {
        let tile = q.matrix_bytes(ROWS, COLS);
        let tiles = bytes / tile;
        let mut pass = |on: bool| -> f64 {
            prefetch::set_kernel(family.set(before, on));
            let t0 = Instant::now();
            for i in 0..tiles {
                let b = &buf[i * tile..(i + 1) * tile];
                match family {
                    Family::Repacked => packed::tile_run(
                        kernel,
                        Tile::body(q, ROWS, COLS, b),
                        &x,
                        Some(act.tile_slice(0, COLS)),
                        &mut y,
                    ),
                    Family::Split => {
                        let sb = ROWS * q.row_scale_bytes(COLS);
                        let t = Tile::split(q, ROWS, COLS, &b[..sb], &b[sb..]);
                        kquant::tile_matvec_act(isa, t, &x, Some(&act), 0, &mut y)
                    }
                    Family::Superblock => kquant::tile_matvec_act(
                        isa,
                        Tile::body(q, ROWS, COLS, b),
                        &x,
                        Some(&act),
                        0,
                        &mut y,
                    ),
                }
            }
            t0.elapsed().as_secs_f64() * 1e3
        };
        pass(true);
        pass(false);
        let (mut on, mut off, mut ratio) = (Vec::new(), Vec::new(), Vec::new());
        for r in 0..ROUNDS {
            // Alternate which arm goes first, so a drift in the machine's speed cancels.
            let (a, b) = if r % 2 == 0 {
                let a = pass(true);
                (a, pass(false))
            } else {
                let b = pass(false);
                (pass(true), b)
            };
            on.push(a);
            off.push(b);
            ratio.push(a / b);
        }
        let on_over_off = median(&mut ratio);
        families.push(FamilyProbe {
            family,
            quant: q.to_string(),
            on_ms: median(&mut on),
            off_ms: median(&mut off),
            on_over_off,
            prefetch: on_over_off <= OFF_ABOVE,
        });
    }
    prefetch::set_kernel(before);
    std::hint::black_box(&y);
    Probe {
        bytes: bytes as u64,
        rounds: ROUNDS,
        families,
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pass_size_is_twice_the_cache_within_bounds() {
        assert_eq!(pass_bytes(None), 64 << 20);
        assert_eq!(pass_bytes(Some(32 << 20)), 64 << 20);
        assert_eq!(pass_bytes(Some(96 << 20)), 192 << 20);
        assert_eq!(pass_bytes(Some(480 << 20)), 256 << 20);
    }

    /// A small probe measures every family this CPU has, restores the setting it found, and
    /// chooses exactly what its measurements say.
    #[test]
    fn probe_restores_the_setting_and_follows_its_figures() {
        let _g = prefetch::tests::LOCK
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let set = KernelPrefetch {
            repacked: false,
            split: true,
            superblock: false,
        };
        prefetch::set_kernel(set);
        let p = run(Isa::cached(), 4 << 20);
        assert_eq!(prefetch::kernel(), set);
        prefetch::set_kernel(KernelPrefetch::ALL);
        assert!(p.families.iter().any(|f| f.family == Family::Split));
        assert!(p.families.iter().any(|f| f.family == Family::Superblock));
        for f in &p.families {
            assert!(f.on_ms > 0.0 && f.off_ms > 0.0, "{f:?}");
            assert_eq!(f.prefetch, f.on_over_off <= OFF_ABOVE, "{f:?}");
        }
        let c = p.choice();
        let of = |n: Family| {
            p.families
                .iter()
                .find(|f| f.family == n)
                .map(|f| f.prefetch)
        };
        assert_eq!(Some(c.split), of(Family::Split));
        assert_eq!(Some(c.superblock), of(Family::Superblock));
        assert_eq!(c.repacked, of(Family::Repacked).unwrap_or(true));
    }

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
