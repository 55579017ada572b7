//! Intel AMX (tile matrix multiply, INT8) for the batched prefill of repacked Q4_0/Q4_1/Q8_0
//! tiles ([`super::packed::tile_run_batch`]), where the CPU and the kernel allow it.
//!
//! A repacked record (`quant::packed`: 16 rows × one 32-column block) is already AMX's "B"
//! operand layout: each 64-byte chunk holds 4 consecutive columns of each of the 16 rows. Q8_0's
//! chunks are loaded as they are; a Q4 record's 4 chunks become 8 by splitting the nibbles
//! (low nibbles: columns 8j..8j+3, high nibbles: 8j+4..8j+7, as in `packed`'s VNNI kernel).
//! Up to 16 tokens' Q8 activations of the block are the "A" operand (16 × 32 signed bytes). One
//! `TDPBSUD` (Q4: signed × unsigned) or `TDPBSSD` (Q8_0) gives each token's exact integer dot
//! with each of the 16 rows, 16 × 16 i32. Each token's float steps are then `packed`'s, in its
//! order (`packed::block_step`). The integer dot is the same exact value, so every token's
//! result is bit-identical to `packed::tile_run` on it (tested in `packed`).
//!
//! Availability: CPUID leaf 7 (AMX-TILE, AMX-INT8), the OS's XCR0 tile state bits, and Linux's
//! per-process permission (`arch_prctl(ARCH_REQ_XCOMP_PERM)`), asked once. `CFLOW_AMX=0` turns
//! it off (an A/B of the same binary). Stable Rust has no AMX intrinsics, so the tile
//! instructions are inline assembly. Each thread loads the tile configuration once.

use super::XqBlocks;
use crate::quant::packed::{record_bytes, record_scale_bytes, PACK_ROWS};
use crate::quant::{QuantType, QK};
use std::sync::OnceLock;

/// Tokens per tile pass (the A operand's rows).
pub const TOKENS: usize = 16;

/// True when this process may run AMX INT8 tile instructions (detected and permitted once).
pub fn available() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        if std::env::var("CFLOW_AMX").is_ok_and(|v| v == "0") {
            return false;
        }
        detect()
    })
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn detect() -> bool {
    use std::arch::x86_64::__cpuid_count;
    if __cpuid_count(0, 0).eax < 7 {
        return false;
    }
    let leaf7 = __cpuid_count(7, 0);
    let (tile, int8) = (leaf7.edx & (1 << 24) != 0, leaf7.edx & (1 << 25) != 0);
    // CPUID leaf 1 ECX bit 27 (OSXSAVE): XGETBV may be executed.
    let osxsave = __cpuid_count(1, 0).ecx & (1 << 27) != 0;
    if !(tile && int8 && osxsave) {
        return false;
    }
    // SAFETY: OSXSAVE was checked above.
    let xcr0 = unsafe { xgetbv0() };
    if xcr0 & (0b11 << 17) != 0b11 << 17 {
        return false;
    }
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl with these arguments only changes this process's permitted xstate.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        )
    };
    rc == 0
}

/// XCR0 (the OS-enabled state components).
///
/// # Safety
/// The CPU must support XGETBV (CPUID.1:ECX.OSXSAVE).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[target_feature(enable = "xsave")]
unsafe fn xgetbv0() -> u64 {
    std::arch::x86_64::_xgetbv(0)
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn detect() -> bool {
    false
}

/// The tile configuration (palette 1): tmm0 the 16 × 16 i32 result, tmm1 the activations
/// (16 tokens × 32 bytes), tmm2 the weights (8 groups of 4 columns × 16 rows × 4 bytes).
#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

#[cfg(target_arch = "x86_64")]
thread_local! {
    static CONFIGURED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Loads this thread's tile configuration unless it already has.
///
/// # Safety
/// [`available`] must have returned true.
#[cfg(target_arch = "x86_64")]
pub(super) unsafe fn configure() {
    if CONFIGURED.get() {
        return;
    }
    let mut c = TileConfig {
        palette: 1,
        start_row: 0,
        reserved: [0; 14],
        colsb: [0; 16],
        rows: [0; 16],
    };
    // Two sets (tmm0–2 and tmm3–5) so that consecutive blocks' products overlap.
    for k in [0, 3] {
        (c.rows[k], c.colsb[k]) = (TOKENS as u8, 64);
        (c.rows[k + 1], c.colsb[k + 1]) = (TOKENS as u8, QK as u16);
        (c.rows[k + 2], c.colsb[k + 2]) = ((QK / 4) as u8, 64);
    }
    std::arch::asm!("ldtilecfg [{}]", in(reg) &c as *const TileConfig, options(nostack, readonly));
    CONFIGURED.set(true);
}

/// Two blocks' integer dots: `c[t][r] = Σ_k a[t][k] · w[k][r]` for 16 tokens × 16 rows each,
/// with `a` 16 rows of 32 bytes at stride `sa` and `w` 8 rows of 64 bytes (the record layout),
/// the second block at `a + 32`, `w + sw2`, `c + 1 KiB`, on the second tile set.
/// `SIGNED_W`: Q8_0's signed weights (`TDPBSSD`), else the unsigned nibbles (`TDPBSUD`).
///
/// # Safety
/// [`configure`] ran on this thread; `a` points to 16 readable rows of 64 bytes at stride `sa`,
/// `w` and `w + sw2` to 512 readable bytes each, `c` to 2 KiB writable.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) unsafe fn two_block_dots<const SIGNED_W: bool>(
    a: *const i8,
    sa: usize,
    w: *const u8,
    sw2: usize,
    c: *mut i32,
) {
    two_dots::<SIGNED_W>(
        [a, a.add(QK)],
        sa,
        [w, w.add(sw2)],
        [c, c.add(TOKENS * PACK_ROWS)],
    );
}

/// Two independent tile products on the two tile sets: for `i` in 0..2,
/// `c[i][t][r] = Σ_k a[i][t][k] · w[i][k][r]`, `a[i]` 16 rows of 32 bytes at stride `sa`,
/// `w[i]` 8 rows of 64 bytes, `c[i]` 16 × 16 i32 (1 KiB). `SIGNED_W` as [`two_block_dots`].
///
/// # Safety
/// [`configure`] ran on this thread; each `a[i]` points to 16 readable rows of 32 bytes at
/// stride `sa`, each `w[i]` to 512 readable bytes, each `c[i]` to 1 KiB writable.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) unsafe fn two_dots<const SIGNED_W: bool>(
    a: [*const i8; 2],
    sa: usize,
    w: [*const u8; 2],
    c: [*mut i32; 2],
) {
    macro_rules! dots {
        ($op:literal) => {
            std::arch::asm!(
                "tilezero tmm0",
                "tilezero tmm3",
                "tileloadd tmm1, [{a} + {sa}*1]",
                "tileloadd tmm2, [{w} + {sw}*1]",
                "tileloadd tmm4, [{a2} + {sa}*1]",
                "tileloadd tmm5, [{w2} + {sw}*1]",
                concat!($op, " tmm0, tmm1, tmm2"),
                concat!($op, " tmm3, tmm4, tmm5"),
                "tilestored [{c} + {sw}*1], tmm0",
                "tilestored [{c2} + {sw}*1], tmm3",
                a = in(reg) a[0], sa = in(reg) sa, w = in(reg) w[0], sw = in(reg) 64usize,
                a2 = in(reg) a[1], w2 = in(reg) w[1], c = in(reg) c[0], c2 = in(reg) c[1],
                options(nostack),
            )
        };
    }
    if SIGNED_W {
        dots!("tdpbssd");
    } else {
        dots!("tdpbsud");
    }
}

/// One block's dots, as [`two_block_dots`]'s first half.
///
/// # Safety
/// As [`two_block_dots`], for one block.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) unsafe fn block_dots<const SIGNED_W: bool>(
    a: *const i8,
    sa: usize,
    w: *const u8,
    c: *mut i32,
) {
    macro_rules! dots {
        ($op:literal) => {
            std::arch::asm!(
                "tilezero tmm0",
                "tileloadd tmm1, [{a} + {sa}*1]",
                "tileloadd tmm2, [{w} + {sw}*1]",
                concat!($op, " tmm0, tmm1, tmm2"),
                "tilestored [{c} + {sw}*1], tmm0",
                a = in(reg) a, sa = in(reg) sa, w = in(reg) w, sw = in(reg) 64usize, c = in(reg) c,
                options(nostack),
            )
        };
    }
    if SIGNED_W {
        dots!("tdpbssd");
    } else {
        dots!("tdpbsud");
    }
}

/// `ys[j·rows ..][..rows] += W·x_j` for every token `j` of `xqs`, over a repacked tile of
/// `rows` rows and `nb` blocks (see the module docs for the arithmetic).
///
/// Per 16-row group, in three passes so that no load waits on a store just made: the Q4
/// records' nibbles are split into a buffer, then every block's tile product is stored, then
/// the float steps run over the stored dots with the 16 tokens' accumulators in registers
/// (padding tokens have zero activations and scales; their outputs are dropped).
///
/// # Safety
/// [`available`] returned true; AVX-512 F/BW and F16C are available; `body` holds the tile's
/// `rows / 16 · nb` records of `q`; every token's blocks hold `nb` blocks; `ys` holds
/// `xqs.len() · rows` values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
pub unsafe fn run_batch(
    q: QuantType,
    rows: usize,
    nb: usize,
    body: &[u8],
    xqs: &[XqBlocks],
    ys: &mut [f32],
) {
    use std::arch::x86_64::*;
    configure();
    let cols = nb * QK;
    SCRATCH.with_borrow_mut(|sc| {
        // Per pass: the activations of up to 16 tokens, token-major, padded with zero rows;
        // each block's `d_x` and `s'` per token (zero for padding). Per row group: the
        // unpacked weights (Q4) and every block's dots, 64-byte aligned. Kept per thread: an
        // allocation per call showed in the profile.
        sc.a.resize(TOKENS * cols / 64, _mm512_setzero_si512());
        sc.wbuf.resize(nb * 8, _mm512_setzero_si512());
        sc.dots.resize(nb * TOKENS, _mm512_setzero_si512());
        sc.dx.resize(nb * TOKENS, 0.0);
        sc.sp.resize(nb * TOKENS, 0.0);
        run_passes(q, rows, nb, body, xqs, ys, sc);
    });
}

/// Per-thread buffers of [`run_batch`].
#[cfg(target_arch = "x86_64")]
#[derive(Default)]
struct Scratch {
    a: Vec<std::arch::x86_64::__m512i>,
    wbuf: Vec<std::arch::x86_64::__m512i>,
    dots: Vec<std::arch::x86_64::__m512i>,
    dx: Vec<f32>,
    sp: Vec<f32>,
}

#[cfg(target_arch = "x86_64")]
thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::default();
}

/// [`run_batch`]'s passes over its buffers.
///
/// # Safety
/// As [`run_batch`]; the buffers are sized as it sizes them.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
unsafe fn run_passes(
    q: QuantType,
    rows: usize,
    nb: usize,
    body: &[u8],
    xqs: &[XqBlocks],
    ys: &mut [f32],
    sc: &mut Scratch,
) {
    use std::arch::x86_64::*;
    let cols = nb * QK;
    let Scratch {
        a,
        wbuf,
        dots,
        dx,
        sp,
    } = sc;
    // SAFETY: `a` holds TOKENS · cols bytes (sized by `run_batch`).
    let a = std::slice::from_raw_parts_mut(a.as_mut_ptr() as *mut i8, TOKENS * cols);
    let (rb, rsb) = (record_bytes(q), record_scale_bytes(q));
    let m4 = _mm512_set1_epi8(0x0F);
    for (p, xs) in xqs.chunks(TOKENS).enumerate() {
        let nt = xs.len();
        // Only a short last pass has padding tokens; the others overwrite every slot.
        if nt < TOKENS {
            a[nt * cols..].fill(0);
            for b in 0..nb {
                dx[b * TOKENS + nt..(b + 1) * TOKENS].fill(0.0);
                sp[b * TOKENS + nt..(b + 1) * TOKENS].fill(0.0);
            }
        }
        for (t, (d, s, x)) in xs.iter().enumerate() {
            a[t * cols..(t + 1) * cols].copy_from_slice(&x[..cols]);
            for b in 0..nb {
                (dx[b * TOKENS + t], sp[b * TOKENS + t]) = super::packed::block_consts(q, d, s, b);
            }
        }
        let y = &mut ys[p * TOKENS * rows..];
        for g in 0..rows / PACK_ROWS {
            let gp = body.as_ptr().add(g * nb * rb);
            let wp = wbuf.as_mut_ptr() as *mut u8;
            if q != QuantType::Q8_0 {
                for b in 0..nb {
                    let qp = gp.add(b * rb + rsb);
                    for j in 0..4 {
                        let w = _mm512_loadu_si512(qp.add(64 * j) as *const _);
                        let o = wp.add(512 * b + 128 * j);
                        _mm512_store_si512(o as *mut _, _mm512_and_si512(w, m4));
                        let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(w), m4);
                        _mm512_store_si512(o.add(64) as *mut _, hi);
                    }
                }
            }
            let mut b = 0;
            while b < nb {
                let ab = a.as_ptr().add(b * QK);
                let out = dots.as_mut_ptr().add(b * TOKENS) as *mut i32;
                let two = b + 1 < nb;
                match (q == QuantType::Q8_0, two) {
                    (true, true) => two_block_dots::<true>(ab, cols, gp.add(b * rb + rsb), rb, out),
                    (true, false) => block_dots::<true>(ab, cols, gp.add(b * rb + rsb), out),
                    (false, true) => two_block_dots::<false>(ab, cols, wp.add(512 * b), 512, out),
                    (false, false) => block_dots::<false>(ab, cols, wp.add(512 * b), out),
                }
                b += if two { 2 } else { 1 };
            }
            let mut acc = [_mm512_setzero_ps(); TOKENS];
            for b in 0..nb {
                let rec = gp.add(b * rb);
                let dr = _mm512_cvtph_ps(_mm256_loadu_si256(rec as *const __m256i));
                let c = if q == QuantType::Q4_1 {
                    _mm512_cvtph_ps(_mm256_loadu_si256(rec.add(2 * PACK_ROWS) as *const __m256i))
                } else {
                    dr
                };
                let dxb = dx.as_ptr().add(b * TOKENS);
                let spb = sp.as_ptr().add(b * TOKENS);
                let db = dots.as_ptr().add(b * TOKENS);
                for (t, acc) in acc.iter_mut().enumerate() {
                    let (dot, dx, sp) = (*db.add(t), *dxb.add(t), *spb.add(t));
                    *acc = match q {
                        QuantType::Q4_0 => {
                            super::packed::avx512::q4_step::<false>(*acc, dot, dr, c, dx, sp)
                        }
                        QuantType::Q4_1 => {
                            super::packed::avx512::q4_step::<true>(*acc, dot, dr, c, dx, sp)
                        }
                        _ => {
                            let dd = _mm512_mul_ps(dr, _mm512_set1_ps(dx));
                            _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), dd, *acc)
                        }
                    };
                }
            }
            for (t, acc) in acc.iter().enumerate().take(nt) {
                let yp = y.as_mut_ptr().add(t * rows + g * PACK_ROWS);
                _mm512_storeu_ps(yp, _mm512_add_ps(_mm512_loadu_ps(yp), *acc));
            }
        }
    }
}
