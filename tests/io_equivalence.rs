//! Expert I/O equivalence: every combination of expert tier {mmap, direct}, fetch {sync, staged},
//! prefetch {on, off} (and real O_DIRECT vs the buffered fallback) gives bit-identical tokens and
//! logits; staged fetch never loses a read or reuses a busy slot, even with a slow reader and
//! random toggling between tokens.

use cflow::convert::generate::{generate, GenSpec};
use cflow::engine::sampler::argmax;
use cflow::engine::{Engine, EngineOptions};
use cflow::engine::{ExpertTier, FetchMode};
use cflow::format::CflowFile;
use cflow::io::FetchHooks;
use cflow::quant::QuantType;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

fn gen(dir: &Path, arch: &str, layers: usize, hidden: usize) -> PathBuf {
    let p = dir.join(format!("{arch}-{layers}-{hidden}.cflow"));
    let mut spec = GenSpec::new(arch);
    spec.seed = 7;
    spec.layers = Some(layers);
    spec.hidden = Some(hidden);
    spec.heads = Some(4);
    spec.ffn = Some(2 * hidden);
    spec.expert_ffn = Some(hidden);
    spec.vocab = Some(384);
    spec.ctx = Some(2048);
    spec.quant = QuantType::Q4_0;
    generate(&spec, &p, |_, _| {}).unwrap();
    p
}

/// Greedy decode of `n` tokens after a fixed prompt; returns tokens and the final logits' bits.
fn decode(e: &mut Engine, n: usize) -> (Vec<u32>, Vec<u32>) {
    e.reset();
    let prompt = [1u32, 17, 99, 3];
    let mut last = 0;
    for &t in &prompt {
        last = argmax(e.step(t, true).unwrap().unwrap()) as u32;
    }
    let mut out = vec![last];
    for _ in 1..n {
        last = argmax(e.step(last, true).unwrap().unwrap()) as u32;
        out.push(last);
    }
    (out, e.logits().iter().map(|v| v.to_bits()).collect())
}

fn engine(
    f: &Arc<CflowFile>,
    tier: ExpertTier,
    fetch: FetchMode,
    pf: bool,
    h: FetchHooks,
) -> Engine {
    Engine::new(
        f.clone(),
        EngineOptions {
            threads: 1,
            expert_tier: tier,
            fetch,
            prefetch: pf,
            readers: 2,
            fetch_hooks: h,
            ..Default::default()
        },
    )
}

fn check_all_combinations(path: &Path, expect_direct: Option<bool>) {
    let f = Arc::new(CflowFile::open(path).unwrap());
    let mut base = engine(
        &f,
        ExpertTier::Mmap,
        FetchMode::Sync,
        false,
        FetchHooks::default(),
    );
    let (toks, logits) = decode(&mut base, 10);
    for tier in [ExpertTier::Mmap, ExpertTier::Direct] {
        for fetch in [FetchMode::Sync, FetchMode::Staged] {
            for pf in [false, true] {
                for force_buffered in [false, true] {
                    let h = FetchHooks {
                        force_buffered,
                        ..Default::default()
                    };
                    let mut e = engine(&f, tier, fetch, pf, h);
                    let (t, l) = decode(&mut e, 10);
                    let what = format!(
                        "{} {:?} {:?} prefetch={pf} buffered={force_buffered}",
                        path.display(),
                        tier,
                        fetch
                    );
                    assert_eq!(t, toks, "tokens differ: {what}");
                    assert!(l == logits, "logits differ: {what}");
                    if tier == ExpertTier::Direct {
                        let c = e.fetch_counters().expect("fetcher used");
                        assert!(
                            c.submitted > 0 && c.submitted == c.completed,
                            "{what}: {c:?}"
                        );
                        assert_eq!(c.failed, 0, "{what}");
                        assert_eq!(c.reuse_violations, 0, "{what}");
                        let info = e.config_info();
                        let st = &e.stats();
                        assert!(st.layers.iter().all(|l| l.io.is_some()), "{what}");
                        let bytes: u64 = st.layers.iter().map(|l| l.io.unwrap().bytes).sum();
                        let ebytes: u64 = st.layers.iter().map(|l| l.bytes.experts).sum();
                        assert!(bytes >= ebytes && bytes > 0, "{what}: {bytes} < {ebytes}");
                        let fallback = info.notes.iter().any(|n| n.contains("O_DIRECT"));
                        if force_buffered {
                            assert!(fallback, "{what}: {:?}", info.notes);
                        } else if let Some(d) = expect_direct {
                            assert_eq!(!fallback, d, "{what}: {:?}", info.notes);
                        }
                    } else {
                        assert!(e.stats().layers.iter().all(|l| l.io.is_none()));
                    }
                    if pf {
                        let (cmds, _, _) = e.prefetch_counters().expect("prefetcher");
                        let _ = cmds; // the thread may lag; only its existence is checked
                        let st = e.stats();
                        let p = st.prefetch.expect("the token reports its prefetch");
                        let routed = st.layers.iter().filter(|l| !l.routing.is_empty()).count();
                        if tier == ExpertTier::Direct && routed > 1 {
                            // Speculative reads: every routed layer after the first was predicted.
                            assert!(p.predicted > 0 && p.hits <= p.predicted, "{what}: {p:?}");
                        }
                        if tier == ExpertTier::Mmap {
                            assert_eq!(p.wasted_bytes, 0, "{what}");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn combinations_bit_identical_on_disk() {
    // target/ is on a real filesystem where O_DIRECT normally works.
    let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
    for (arch, layers) in [
        ("arch2_4_combined", 8),
        ("arch4_async_experts", 8),
        ("mixtral", 3),
    ] {
        let p = gen(dir.path(), arch, layers, 128);
        check_all_combinations(&p, None);
    }
}

/// The direct tier's expert cache changes where expert bytes come from, never the result:
/// with a cache too small for one layer's selection, one that holds part of the model and one
/// that holds all of it, sync and staged, the tokens and logits are bit-identical to the mmap
/// tier; a cache that holds everything serves every repeat selection from memory (hits > 0),
/// fewer bytes are read from disk than the experts touched, and nothing is read twice once
/// warm; reads and completions balance.
#[test]
fn expert_cache_is_bit_identical_at_every_size() {
    let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
    let p = gen(dir.path(), "arch2_4_combined", 8, 128);
    let f = Arc::new(CflowFile::open(&p).unwrap());
    let mut base = engine(
        &f,
        ExpertTier::Mmap,
        FetchMode::Sync,
        false,
        FetchHooks::default(),
    );
    let (toks, logits) = decode(&mut base, 12);
    let all_mib = (cflow::engine::streams::all_expert_bytes(&f) >> 20) + 1;
    for mib in [1, all_mib / 2, all_mib] {
        for fetch in [FetchMode::Sync, FetchMode::Staged] {
            let mut e = engine(&f, ExpertTier::Direct, fetch, false, FetchHooks::default());
            e.set_expert_cache_mib(mib);
            let (t, l) = decode(&mut e, 12);
            let what = format!("cache {mib} MiB {fetch:?}");
            assert_eq!(t, toks, "tokens differ: {what}");
            assert!(l == logits, "logits differ: {what}");
            let c = e.fetch_counters().expect("fetcher used");
            assert_eq!(c.submitted, c.completed, "{what}: {c:?}");
            assert_eq!((c.failed, c.reuse_violations), (0, 0), "{what}");
            assert_eq!(c.cache_hits + c.cache_misses, c.submitted, "{what}: {c:?}");
            let st = e.stats();
            let cache = st.expert_cache.expect("the token reports the cache");
            assert_eq!(cache.capacity_bytes, mib << 20, "{what}");
            assert!(cache.cached_bytes <= mib << 20, "{what}: {cache:?}");
            if mib == all_mib {
                assert!(c.cache_hits > 0, "{what}: {c:?}");
                // Warm: a second decode of the same tokens reads nothing from disk.
                let before = c.bytes;
                decode(&mut e, 12);
                let c2 = e.fetch_counters().unwrap();
                assert_eq!(c2.bytes, before, "{what}: warm cache read from disk");
            }
        }
    }
}

#[test]
fn combinations_bit_identical_on_tmpfs() {
    // /dev/shm is tmpfs: O_DIRECT is refused on older kernels (the fallback path) and accepted on
    // newer ones; either way the results must not change.
    let shm = Path::new("/dev/shm");
    if !shm.is_dir() {
        eprintln!("no /dev/shm: skipped");
        return;
    }
    let dir = tempfile::tempdir_in(shm).unwrap();
    let p = gen(dir.path(), "arch2_4_sync", 4, 128);
    check_all_combinations(&p, None);
}

#[test]
fn degenerate_staged_is_reported() {
    let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
    let p = gen(dir.path(), "arch2_4_sync", 2, 64);
    let f = Arc::new(CflowFile::open(&p).unwrap());
    let e = engine(
        &f,
        ExpertTier::Direct,
        FetchMode::Staged,
        false,
        FetchHooks::default(),
    );
    assert!(e
        .config_info()
        .notes
        .iter()
        .any(|n| n.contains("degenerates to sync")));
}

#[test]
fn slow_reader_loses_nothing() {
    let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
    let p = gen(dir.path(), "arch2_4_combined", 8, 64);
    let f = Arc::new(CflowFile::open(&p).unwrap());
    let mut base = engine(
        &f,
        ExpertTier::Mmap,
        FetchMode::Sync,
        false,
        FetchHooks::default(),
    );
    let (toks, logits) = decode(&mut base, 6);
    let h = FetchHooks {
        force_buffered: false,
        reader_delay: Duration::from_millis(2),
        ..Default::default()
    };
    for readers in [1, 3] {
        let mut e = engine(&f, ExpertTier::Direct, FetchMode::Staged, false, h.clone());
        e.set_readers(readers);
        let (t, l) = decode(&mut e, 6);
        assert_eq!(t, toks);
        assert!(l == logits);
        let c = e.fetch_counters().unwrap();
        assert_eq!(c.submitted, c.completed);
        assert_eq!((c.failed, c.reuse_violations), (0, 0));
        // The slow reader forces waits at the injection layers.
        let wait: u64 = e.stats().layers.iter().map(|l| l.io.unwrap().wait_ns).sum();
        assert!(wait > 0);
        // In flight at once: at most (δe + 1) routings × top_k experts.
        assert!(e.fetch_slots() <= 3 * 2, "{} slots", e.fetch_slots());
    }
    // Interrupted tokens leave reads in flight; the next token must drain them, not lose them.
    let mut e = engine(&f, ExpertTier::Direct, FetchMode::Staged, false, h);
    let stop = e.stop_flag().clone();
    let th = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(5));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    let mut stopped = 0;
    for i in 0..200 {
        if e.step((i % 300) as u32, false).is_err() {
            stopped += 1;
            break;
        }
    }
    th.join().unwrap();
    e.stop_flag()
        .store(false, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(stopped, 1);
    let (t, l) = decode(&mut e, 6);
    assert_eq!(t, toks);
    assert!(l == logits);
    let c = e.fetch_counters().unwrap();
    assert_eq!(c.submitted, c.completed);
    assert_eq!((c.failed, c.reuse_violations), (0, 0));
}

#[test]
fn stress_random_toggling_1000_tokens() {
    let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
    let p = gen(dir.path(), "arch2_4_combined", 8, 64);
    let f = Arc::new(CflowFile::open(&p).unwrap());
    let n = 1000;
    // Reference: teacher-forced fixed token sequence on the plain mmap path.
    let seq: Vec<u32> = (0..n).map(|i| ((i * 37 + 11) % 384) as u32).collect();
    let mut base = Engine::new(
        f.clone(),
        EngineOptions {
            threads: 1,
            ..Default::default()
        },
    );
    let mut want = Vec::with_capacity(n);
    for &t in &seq {
        want.push(argmax(base.step(t, true).unwrap().unwrap()) as u32);
    }
    let mut e = Engine::new(
        f.clone(),
        EngineOptions {
            threads: 1,
            ..Default::default()
        },
    );
    let mut rng = cflow::rng::Rng::new(0x1234_5678_9abc_def0);
    let mut checked = 0;
    for (i, &t) in seq.iter().enumerate() {
        let r = rng.next_u64();
        if r & 1 == 1 {
            e.set_fetch(if r & 2 == 0 {
                FetchMode::Sync
            } else {
                FetchMode::Staged
            });
        }
        if r & 4 == 4 {
            e.set_expert_tier(if r & 8 == 0 {
                ExpertTier::Mmap
            } else {
                ExpertTier::Direct
            });
        }
        if r & 16 == 16 {
            e.set_prefetch(r & 32 == 0);
        }
        if r & 0x3c0 == 0 {
            // A new reader count restarts the fetcher and its counters: check them first.
            fetches_clean(&e, &mut checked);
            e.set_readers(1 + (r >> 10) as usize % 3);
        }
        let got = argmax(e.step(t, true).unwrap().unwrap()) as u32;
        assert_eq!(got, want[i], "token {i}");
    }
    fetches_clean(&e, &mut checked);
    assert!(checked > 0, "the direct tier never ran");
}

/// No failed read and no reuse violation in the fetcher's counters (when it ran); counts the
/// checks that saw a fetcher.
fn fetches_clean(e: &Engine, checked: &mut usize) {
    if let Some(c) = e.fetch_counters() {
        assert_eq!(c.failed, 0);
        assert_eq!(c.reuse_violations, 0);
        *checked += 1;
    }
}

/// An imported MoE GGUF (llama.cpp's converter and quantizer, `tests/reference/moe_tiny/`):
/// Qwen2-MoE with its shared expert, and a Qwen3-MoE whose expert tiles are Q4_K/Q6_K. Every
/// tier × fetch × prefetch combination gives the same tokens and logits, bit for bit, as on
/// the generated models.
#[test]
fn combinations_bit_identical_on_imported_moe_ggufs() {
    use cflow::convert::import_gguf::{import_gguf, QuantTarget};
    let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
    let refs = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/reference/moe_tiny");
    for (case, q) in [
        ("qwen2moe", "q8_0"),
        ("qwen3moe_k", "q4_k_m"),
        ("olmoe", "q4_k_m"),
    ] {
        let p = dir.path().join(format!("{case}.cflow"));
        import_gguf(
            &refs.join(case).join(format!("model-{q}.gguf")),
            &p,
            QuantTarget::Keep,
            None,
            |_, _| {},
        )
        .unwrap();
        check_all_combinations(&p, None);
    }
}
