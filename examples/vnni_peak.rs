//! The issue rate of `vpdpbusd` on 512-bit registers on this CPU: twelve independent chains of
//! it, nothing else, on one thread. Each instruction is 64 int8 multiply-adds (128 operations
//! as the GFLOP/s figures count them), so this is the ceiling of every VNNI matmul kernel here:
//! `packed::tile_run_batch` on Q4_0 needs 8 of them per 16-row × 32-column record and token,
//! against which `cargo bench --bench kernels -- tile_matmul_128tok/Q4_0` gives its share of the
//! peak (docs/PERFORMANCE.md, "Inside the thin cells").
//!
//! `cargo run --release --example vnni_peak [SECONDS]`

#[cfg(target_arch = "x86_64")]
fn main() {
    use std::time::Instant;
    if !(is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512vnni")) {
        eprintln!("this CPU has no AVX-512 VNNI");
        std::process::exit(2);
    }
    let secs: f64 = match std::env::args().nth(1) {
        None => 1.0,
        Some(s) => match s.parse::<f64>() {
            Ok(v) if v > 0.0 && v.is_finite() => v,
            _ => {
                eprintln!("usage: vnni_peak [SECONDS > 0], not {s:?}");
                std::process::exit(2);
            }
        },
    };
    let mut best = 0f64;
    for _ in 0..3 {
        let (n, dt) = run(secs / 3.0);
        best = best.max(n as f64 / dt);
    }
    println!(
        "vpdpbusd zmm: {:.2} G/s on one thread = {:.0} GOPS int8 (2 per multiply-add), best of 3",
        best / 1e9,
        best * 128.0 / 1e9
    );

    /// Runs the chains for about `secs` seconds; returns (instructions, seconds).
    fn run(secs: f64) -> (u64, f64) {
        let t0 = Instant::now();
        let mut n = 0u64;
        while t0.elapsed().as_secs_f64() < secs {
            // SAFETY: AVX-512 F and VNNI were detected above.
            let s = unsafe { chains(std::hint::black_box(1 << 20)) };
            std::hint::black_box(s);
            n += 12 << 20;
        }
        (n, t0.elapsed().as_secs_f64())
    }
}

/// `iters` rounds of 12 independent `vpdpbusd` chains; returns a sum so none is dead.
///
/// # Safety
/// AVX-512 F and VNNI must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn chains(iters: usize) -> i32 {
    use std::arch::x86_64::*;
    let w = _mm512_set1_epi32(0x0102_0304);
    let x = _mm512_set1_epi32(0x0506_0708);
    let mut a: [__m512i; 12] = std::array::from_fn(|i| _mm512_set1_epi32(i as i32));
    for _ in 0..iters {
        for v in a.iter_mut() {
            *v = _mm512_dpbusd_epi32(*v, w, x);
            // An empty asm that "changes" the register: the compiler can neither fold the
            // chain into one multiply nor move it out of the loop.
            std::arch::asm!(
                "/* {0} */",
                inout(zmm_reg) * v,
                options(pure, nomem, nostack)
            );
        }
    }
    _mm512_reduce_add_epi32(
        a.iter()
            .fold(_mm512_setzero_si512(), |s, v| _mm512_add_epi32(s, *v)),
    )
}

#[cfg(not(target_arch = "x86_64"))]
fn main() {
    eprintln!("x86-64 only");
    std::process::exit(2);
}
