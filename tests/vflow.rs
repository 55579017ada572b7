//! `.vflow` (paper §3.4): conversion round trip, O(1) expert-bank lookup, the engine running from
//! the `.vflow` twin with bit-identical tokens and logits (every expert tier × fetch × prefetch
//! combination, and live switching between tokens), and typed errors on corrupted files.

use cflow::convert::generate::{generate, GenSpec};
use cflow::engine::sampler::argmax;
use cflow::engine::Layout;
use cflow::engine::{Engine, EngineOptions};
use cflow::engine::{ExpertTier, FetchMode};
use cflow::format::vflow::{convert, is_twin_of, VflowFile, VflowHeader, GROUP_ENTRY_SIZE};
use cflow::format::{CflowFile, FormatError};
use cflow::quant::QuantType;
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn gen(dir: &Path, arch: &str, layers: usize, hidden: usize, seed: u64) -> PathBuf {
    let p = dir.join(format!("{arch}-{layers}-{hidden}-{seed}.cflow"));
    let mut spec = GenSpec::new(arch);
    spec.seed = seed;
    spec.layers = Some(layers);
    spec.hidden = Some(hidden);
    spec.heads = Some(4);
    spec.ffn = Some(2 * hidden);
    spec.expert_ffn = Some(hidden);
    spec.vocab = Some(384);
    spec.ctx = Some(256);
    spec.quant = QuantType::Q4_0;
    generate(&spec, &p, |_, _| {}).unwrap();
    p
}

fn to_vflow(p: &Path, g: usize) -> PathBuf {
    let out = p.with_extension(format!("g{g}.vflow"));
    convert(&CflowFile::open(p).unwrap(), &out, g).unwrap();
    out
}

/// Greedy decode of `n` tokens after a fixed prompt; returns tokens and the final logits' bits.
fn decode(e: &mut Engine, n: usize) -> (Vec<u32>, Vec<u32>) {
    e.reset();
    let mut last = 0;
    for &t in &[1u32, 17, 99, 3] {
        last = argmax(e.step(t, true).unwrap().unwrap()) as u32;
    }
    let mut out = vec![last];
    for _ in 1..n {
        last = argmax(e.step(last, true).unwrap().unwrap()) as u32;
        out.push(last);
    }
    (out, e.logits().iter().map(|v| v.to_bits()).collect())
}

fn engine(c: &Arc<CflowFile>, v: Option<&Arc<CflowFile>>, opts: EngineOptions) -> Engine {
    let mut e = Engine::new(c.clone(), opts);
    if let Some(v) = v {
        e.attach_vflow(v.clone()).unwrap();
        e.set_layout(Layout::Vflow).unwrap();
    }
    e
}

fn opts(tier: ExpertTier, fetch: FetchMode, prefetch: bool) -> EngineOptions {
    EngineOptions {
        threads: 1,
        expert_tier: tier,
        fetch,
        prefetch,
        readers: 2,
        ..Default::default()
    }
}

/// Tokens and logits from the `.vflow` equal the `.cflow`'s in every I/O combination.
fn check_equivalence(cflow: &Path, vflow: &Path) {
    let c = Arc::new(CflowFile::open(cflow).unwrap());
    let vf = VflowFile::open(vflow).unwrap();
    assert!(is_twin_of(&vf, &c));
    let v = Arc::new(vf.into_file());
    let mut base = engine(&c, None, opts(ExpertTier::Mmap, FetchMode::Sync, false));
    let (toks, logits) = decode(&mut base, 8);
    let moe = c.cfg.has_experts();
    for tier in [ExpertTier::Mmap, ExpertTier::Direct] {
        for fetch in [FetchMode::Sync, FetchMode::Staged] {
            for pf in [false, true] {
                if !moe && (tier, fetch) != (ExpertTier::Mmap, FetchMode::Sync) {
                    continue; // the expert options have no effect on a dense model
                }
                let what = format!("{} {tier:?} {fetch:?} prefetch={pf}", vflow.display());
                let mut e = engine(&c, Some(&v), opts(tier, fetch, pf));
                assert_eq!(e.config_info().layout, Layout::Vflow);
                let (t, l) = decode(&mut e, 8);
                assert_eq!(t, toks, "tokens differ: {what}");
                assert!(l == logits, "logits differ: {what}");
                if tier == ExpertTier::Direct && moe {
                    let k = e.fetch_counters().expect("fetcher used");
                    assert!(k.submitted > 0 && k.submitted == k.completed, "{what}");
                    assert_eq!(k.failed, 0, "{what}");
                }
            }
        }
    }
    // Live switching between tokens (cflow ↔ vflow ↔ rowmajor) keeps the same tokens.
    let mut e = engine(
        &c,
        Some(&v),
        opts(ExpertTier::Direct, FetchMode::Staged, true),
    );
    assert!(e.config_info().layouts_available.contains(&Layout::Vflow));
    e.reset();
    let layouts = [Layout::Cflow, Layout::Vflow, Layout::Vflow, Layout::Cflow];
    let mut last = 0;
    for (i, &t) in [1u32, 17, 99, 3].iter().enumerate() {
        e.set_layout(layouts[i % 4]).unwrap();
        last = argmax(e.step(t, true).unwrap().unwrap()) as u32;
    }
    let mut out = vec![last];
    for i in 1..8 {
        e.set_layout(layouts[(i + 1) % 4]).unwrap();
        last = argmax(e.step(last, true).unwrap().unwrap()) as u32;
        out.push(last);
    }
    assert_eq!(out, toks, "tokens differ with live layout switching");
}

/// Round trip and bank structure: the views of the `.vflow` reassemble to exactly the `.cflow`'s
/// matrices and vectors; each (layer, expert) lookup is one table read, 4096-aligned, and its
/// bytes equal the source expert region.
fn check_structure(cflow: &Path, vflow: &Path, g: usize) {
    let c = CflowFile::open(cflow).unwrap();
    let vf = VflowFile::open(vflow).unwrap();
    let v = &vf.file;
    assert_eq!(v.cfg, c.cfg);
    for i in 0..c.cfg.n_layers {
        assert!(v.layer_data(i) == c.layer_data(i), "layer {i} differs");
    }
    assert!(v.vocab_data() == c.vocab_data());
    let h = vf.header;
    assert_eq!(h.group_size as usize, g);
    assert_eq!(h.n_groups as usize, c.cfg.n_layers.div_ceil(g));
    let ne = c.cfg.n_experts;
    for (l, lv) in v.layers.iter().enumerate() {
        for (e, ex) in lv.experts.iter().enumerate() {
            let (off, len) = vf.expert_region(l, e).unwrap();
            assert_eq!((off, len), (ex.offset, ex.len), "layer {l} expert {e}");
            assert_eq!(off % 4096, 0);
            assert!(off >= h.expert_bank_offset);
            let src = &c.layers[l].experts[e];
            assert_eq!(
                &v.bytes()[off as usize..(off + len) as usize],
                &c.bytes()[src.offset as usize..(src.offset + src.len) as usize]
            );
        }
    }
    assert_eq!(vf.expert_region(c.cfg.n_layers, 0), None);
    assert_eq!(vf.expert_region(0, ne), None);
    // Sequential region: within a group, every layer's attention precedes every dense tile, and
    // the groups follow each other in layer order.
    let mut prev_end = 0u64;
    for ge in &vf.groups[..h.n_groups as usize] {
        assert!(ge.offset >= prev_end && ge.offset % 4096 == 0);
        prev_end = ge.offset + ge.len;
        let ls = &v.layers[ge.first_layer as usize..(ge.first_layer + ge.n_layers) as usize];
        let last_attn = ls.iter().map(|l| l.o.stripes[0]).max().unwrap();
        for l in ls {
            assert_eq!((l.offset, l.len), (ge.offset, ge.len));
            let q0 = l.q.stripes[0] as u64;
            assert!(q0 >= ge.offset && q0 < prev_end);
            if let Some(gm) = &l.gate {
                assert!(gm.stripes[0] > last_attn, "dense tile before attention");
            }
        }
    }
    assert!(prev_end <= h.expert_bank_offset);
}

#[test]
fn vflow_demo_model_round_trip_and_identical_decode() {
    let dir = tempfile::tempdir().unwrap();
    let p = gen(dir.path(), "arch2_4_combined", 4, 64, 7);
    for g in [1, 2, 3] {
        let vp = to_vflow(&p, g);
        check_structure(&p, &vp, g);
    }
    check_equivalence(&p, &p.with_extension("g2.vflow"));
}

#[test]
fn vflow_delayed_experts_8_layers() {
    let dir = tempfile::tempdir().unwrap();
    let p = gen(dir.path(), "arch2_4_combined", 8, 64, 11);
    assert_eq!(CflowFile::open(&p).unwrap().cfg.expert_delay, 2);
    let vp = to_vflow(&p, 3);
    check_structure(&p, &vp, 3);
    check_equivalence(&p, &vp);
}

#[test]
fn vflow_dense_llama() {
    let dir = tempfile::tempdir().unwrap();
    let p = gen(dir.path(), "llama", 5, 64, 3);
    let vp = to_vflow(&p, 2);
    check_structure(&p, &vp, 2);
    let vf = VflowFile::open(&vp).unwrap();
    assert_eq!(vf.header.n_experts, 0);
    check_equivalence(&p, &vp);
}

/// An imported MoE GGUF (Qwen2-MoE with its shared expert, `tests/reference/moe_tiny/`): the
/// `.vflow` twin keeps the shared-expert gate and decodes identically.
#[test]
fn vflow_imported_moe_gguf() {
    use cflow::convert::import_gguf::{import_gguf, QuantTarget};
    let dir = tempfile::tempdir().unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/reference/moe_tiny/qwen2moe/model-q8_0.gguf");
    let p = dir.path().join("qwen2moe.cflow");
    import_gguf(&src, &p, QuantTarget::Keep, None, |_, _| {}).unwrap();
    let vp = to_vflow(&p, 2);
    check_structure(&p, &vp, 2);
    let v = VflowFile::open(&vp).unwrap();
    assert!(v.file.layers.iter().all(|l| l.shared_gate.is_some()));
    check_equivalence(&p, &vp);
}

#[test]
fn vflow_engine_rejects_missing_or_foreign_twin() {
    let dir = tempfile::tempdir().unwrap();
    let a = gen(dir.path(), "arch2_4_combined", 4, 64, 1);
    let b = gen(dir.path(), "arch2_4_combined", 4, 64, 2);
    let ca = Arc::new(CflowFile::open(&a).unwrap());
    let mut e = Engine::new(ca.clone(), opts(ExpertTier::Mmap, FetchMode::Sync, false));
    assert!(e.set_layout(Layout::Vflow).is_err());
    assert_eq!(e.config_info().layout, Layout::Cflow);
    assert!(!e.config_info().layouts_available.contains(&Layout::Vflow));
    // Same configuration, different weights: the source hash tells them apart.
    let vb = VflowFile::open(&to_vflow(&b, 2)).unwrap();
    assert!(!is_twin_of(&vb, &ca));
    // A different configuration is refused by the engine itself.
    let d = gen(dir.path(), "llama", 4, 64, 1);
    let vd = VflowFile::open(&to_vflow(&d, 2)).unwrap();
    assert!(e.attach_vflow(Arc::new(vd.into_file())).is_err());
    // --layout vflow without a twin falls back to cflow at construction.
    let mut o = opts(ExpertTier::Mmap, FetchMode::Sync, false);
    o.layout = Layout::Vflow;
    let e = Engine::new(ca, o);
    assert_eq!(e.config_info().layout, Layout::Cflow);
}

fn rd64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

fn open_bytes(dir: &Path, name: &str, b: &[u8]) -> Result<VflowFile, FormatError> {
    let p = dir.join(name);
    std::fs::write(&p, b).unwrap();
    VflowFile::open(&p)
}

#[test]
fn corrupted_vflow_gives_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let p = gen(dir.path(), "arch2_4_combined", 4, 64, 5);
    let vp = to_vflow(&p, 2);
    let good = std::fs::read(&vp).unwrap();
    let h = VflowHeader::decode(&good).unwrap();
    let d = dir.path();
    let with = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut b = good.clone();
        f(&mut b);
        b
    };

    // Too small / truncated.
    let r = open_bytes(d, "small.vflow", &good[..40]);
    assert!(matches!(r, Err(FormatError::TooSmall { .. })), "{r:?}");
    let r = open_bytes(d, "trunc.vflow", &good[..good.len() - 100]);
    assert!(matches!(r, Err(FormatError::OutOfBounds { .. })), "{r:?}");
    // A .cflow is not a .vflow.
    let r = VflowFile::open(&p);
    assert!(matches!(r, Err(FormatError::Mismatch { .. })), "{r:?}");
    // Version.
    let r = open_bytes(d, "ver.vflow", &with(&|b| b[8] = 9));
    assert!(
        matches!(r, Err(FormatError::BadVersion { found: 9, .. })),
        "{r:?}"
    );
    // Group size 0 / inconsistent group count.
    let r = open_bytes(
        d,
        "g0.vflow",
        &with(&|b| b[12..14].copy_from_slice(&0u16.to_le_bytes())),
    );
    assert!(
        matches!(
            r,
            Err(FormatError::BadField {
                field: "group_size",
                ..
            })
        ),
        "{r:?}"
    );
    let r = open_bytes(
        d,
        "ng.vflow",
        &with(&|b| b[14..16].copy_from_slice(&7u16.to_le_bytes())),
    );
    assert!(matches!(r, Err(FormatError::Mismatch { .. })), "{r:?}");
    // Embedded metadata is not JSON.
    let mo = rd64(&good, h.model_header_offset as usize + 64) as usize;
    let r = open_bytes(d, "meta.vflow", &with(&|b| b[mo] = b'#'));
    assert!(matches!(r, Err(FormatError::BadMetadata { .. })), "{r:?}");
    // Group 1's span points past the end of the file.
    let g1 = h.group_table_offset as usize + GROUP_ENTRY_SIZE + 8;
    let r = open_bytes(
        d,
        "gspan.vflow",
        &with(&|b| b[g1..g1 + 8].copy_from_slice(&u64::MAX.to_le_bytes())),
    );
    assert!(
        matches!(
            r,
            Err(FormatError::Overflow { .. } | FormatError::OutOfBounds { .. })
        ),
        "{r:?}"
    );
    // Group 1 overlapping group 0.
    let r = open_bytes(
        d,
        "gover.vflow",
        &with(&|b| b[g1..g1 + 8].copy_from_slice(&h.seq_offset.to_le_bytes())),
    );
    assert!(matches!(r, Err(FormatError::Overlap { .. })), "{r:?}");
    // Wrong layer range in the group table.
    let gl = h.group_table_offset as usize + GROUP_ENTRY_SIZE;
    let r = open_bytes(d, "grange.vflow", &with(&|b| b[gl] = 3));
    assert!(matches!(r, Err(FormatError::Mismatch { .. })), "{r:?}");
    // Expert bank entry (layer 1, expert 3) moved off its 4096 boundary / outside the bank.
    let ne = h.n_experts as usize;
    let at = h.expert_bank_offset as usize + (ne + 3) * 16;
    let off = rd64(&good, at);
    let r = open_bytes(
        d,
        "xalign.vflow",
        &with(&|b| b[at..at + 8].copy_from_slice(&(off + 64).to_le_bytes())),
    );
    assert!(r.is_err(), "misaligned expert accepted");
    let r = open_bytes(
        d,
        "xout.vflow",
        &with(&|b| b[at..at + 8].copy_from_slice(&(good.len() as u64).to_le_bytes())),
    );
    assert!(matches!(r, Err(FormatError::OutOfBounds { .. })), "{r:?}");
    // A flipped tile header in the sequential region (layer 1's first Q tile).
    let vf = VflowFile::open(&vp).unwrap();
    let q1 = vf.file.layers[1].q.stripes[0];
    let r = open_bytes(d, "tile.vflow", &with(&|b| b[q1 + 2] ^= 0x40));
    assert!(matches!(r, Err(FormatError::Mismatch { .. })), "{r:?}");
    // A flipped expert tile header in the bank.
    let x = vf.file.layers[2].experts[1].offset as usize;
    let r = open_bytes(d, "xtile.vflow", &with(&|b| b[x] ^= 1));
    assert!(matches!(r, Err(FormatError::Mismatch { .. })), "{r:?}");
    // No panic on any single-byte corruption of the header, tables and directories.
    let gt_end = h.group_table_offset as usize + (h.n_groups as usize + 1) * GROUP_ENTRY_SIZE;
    let mut spots: Vec<usize> = (0..gt_end).collect();
    spots.extend((h.seq_offset as usize..).take(768).step_by(3));
    spots.extend(
        (h.expert_bank_offset as usize..)
            .take(4 * ne * 16)
            .step_by(5),
    );
    for (i, &s) in spots.iter().enumerate() {
        let b = with(&|b| b[s] ^= 0xA5);
        let _ = open_bytes(d, &format!("fuzz{}.vflow", i % 4), &b);
    }
}

/// The vflow layout really reads the `.vflow` bytes: perturbing weight data (not headers) in the
/// twin changes the logits, for the sequential region and for the expert bank on both tiers.
#[test]
fn vflow_layout_reads_the_vflow_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let p = gen(dir.path(), "arch2_4_combined", 4, 64, 9);
    let vp = to_vflow(&p, 2);
    let c = Arc::new(CflowFile::open(&p).unwrap());
    let (_, base) = decode(
        &mut engine(&c, None, opts(ExpertTier::Mmap, FetchMode::Sync, false)),
        3,
    );
    let vf = VflowFile::open(&vp).unwrap();
    let q0 = vf.file.layers[0].q.stripes[0] + 16 + 8; // past the tile header and into the scales
    let experts: Vec<usize> = vf
        .file
        .layers
        .iter()
        .flat_map(|l| l.experts.iter().map(|e| e.offset as usize + 16 + 8))
        .collect();
    drop(vf);
    let good = std::fs::read(&vp).unwrap();
    let poke = |name: &str, at: &[usize]| {
        let mut b = good.clone();
        for &a in at {
            b[a] ^= 0x5A;
        }
        let out = dir.path().join(name);
        std::fs::write(&out, b).unwrap();
        Arc::new(VflowFile::open(&out).unwrap().into_file())
    };
    let seq = poke("seq.vflow", &[q0]);
    let bank = poke("bank.vflow", &experts);
    for (v, tiers) in [
        (&seq, &[ExpertTier::Mmap][..]),
        (&bank, &[ExpertTier::Mmap, ExpertTier::Direct][..]),
    ] {
        for &tier in tiers {
            let (_, l) = decode(
                &mut engine(&c, Some(v), opts(tier, FetchMode::Staged, false)),
                3,
            );
            assert!(
                l != base,
                "{} {tier:?}: perturbation not seen",
                v.path.display()
            );
        }
    }
}

/// Rewrites `src` to `dst` through the writer with one weight byte of layer 0 changed: same
/// header, metadata and directories (so the old header/directory hash matched), other weights.
fn perturbed_copy(src: &Path, dst: &Path) {
    let f = CflowFile::open(src).unwrap();
    let mut w = cflow::format::CflowWriter::create(dst, &f.cfg).unwrap();
    for i in 0..f.cfg.n_layers {
        let mut l = f.layer_data(i);
        if i == 0 {
            l.q.qs[0] ^= 0x11;
        }
        w.write_layer(&l).unwrap();
    }
    w.finish(&f.vocab_data(), &f.cfg.meta).unwrap();
}

fn cli(args: &[&str], model: &Path) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_cflow-tui"))
        .args(args)
        .arg(model)
        .output()
        .unwrap()
}

/// Item 11 of issue 14: a twin converted from another model whose header, metadata and
/// directories are identical was accepted (its hash covered only those); now the content hash
/// (the weights) must match.
#[test]
fn a_twin_of_other_weights_with_the_same_header_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let a = gen(dir.path(), "arch2_4_combined", 4, 64, 1);
    let b = dir.path().join("b.cflow");
    perturbed_copy(&a, &b);
    let (fa, fb) = (CflowFile::open(&a).unwrap(), CflowFile::open(&b).unwrap());
    assert_eq!(fa.cfg, fb.cfg);
    assert_eq!(cflow::format::file_hash(&fa), cflow::format::file_hash(&fb));
    let vb = VflowFile::open(&to_vflow(&b, 2)).unwrap();
    assert!(is_twin_of(&vb, &fb));
    assert!(
        !is_twin_of(&vb, &fa),
        "a twin of other weights was accepted"
    );

    // Through the CLI: the stale twin at MODEL.vflow is ignored with a message; asked for
    // explicitly (--layout vflow) it is an error.
    std::fs::copy(b.with_extension("g2.vflow"), a.with_extension("vflow")).unwrap();
    let o = cli(&["run", "--token-ids", "1,2", "-n", "2"], &a);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("ignoring") && err.contains("stale twin"),
        "{err}"
    );
    let o = cli(
        &["run", "--token-ids", "1,2", "-n", "2", "--layout", "vflow"],
        &a,
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "a stale twin was used: {err}");
    assert!(err.contains("stale twin"), "{err}");
    // The real twin is used.
    std::fs::copy(to_vflow(&a, 2), a.with_extension("vflow")).unwrap();
    let o = cli(
        &["run", "--token-ids", "1,2", "-n", "2", "--layout", "vflow"],
        &a,
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// Only a regular file counts as a twin: a FIFO at MODEL.vflow hung `run` (opening it blocks
/// until a writer appears); now it is ignored with a message.
#[test]
fn a_fifo_at_model_vflow_is_ignored_without_hanging() {
    let dir = tempfile::tempdir().unwrap();
    let a = gen(dir.path(), "llama", 2, 64, 1);
    let fifo = a.with_extension("vflow");
    let mk = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(mk.success());
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_cflow-tui"))
        .args(["run", "--token-ids", "1,2", "-n", "2"])
        .arg(&a)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if t0.elapsed() > std::time::Duration::from_secs(30) {
            child.kill().unwrap();
            child.wait().unwrap();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    let status = status.expect("`run` hung on a FIFO at MODEL.vflow");
    assert!(status.success(), "{err}");
    assert!(err.contains("FIFO") && err.contains("ignoring"), "{err}");
    // Given explicitly, it is a clear error (not a hang either).
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_cflow-tui"))
        .args(["run", "--token-ids", "1", "-n", "1", "--vflow"])
        .arg(&fifo)
        .arg(&a)
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("not a regular file"));
}

/// Blanks a recorded hash key out of a file's metadata (same length, still valid JSON), as in
/// files written before hashes were recorded.
fn strip_hash(p: &Path, key: &str) {
    let mut b = std::fs::read(p).unwrap();
    let pat = format!(",\"{key}\":\"sha256:");
    let at = b
        .windows(pat.len())
        .position(|w| w == pat.as_bytes())
        .unwrap_or_else(|| panic!("{key} in {}", p.display()));
    let len = pat.len() + 64 + 1;
    b[at..at + len].fill(b' ');
    std::fs::write(p, b).unwrap();
}

/// Files written before content hashes were recorded still open; their hash is computed (the
/// `.cflow` from its bytes, an old twin by laying the `.cflow` out again from its views) and
/// gives the same answers.
#[test]
fn files_without_recorded_hashes_are_matched_by_computed_hashes() {
    let dir = tempfile::tempdir().unwrap();
    let a = gen(dir.path(), "arch2_4_combined", 4, 64, 2);
    let b = dir.path().join("b.cflow");
    perturbed_copy(&a, &b);
    let (va, vb) = (to_vflow(&a, 3), to_vflow(&b, 3));
    let recorded = CflowFile::open(&a).unwrap().content_hash();
    for (p, k) in [(&a, "content_hash"), (&b, "content_hash")] {
        strip_hash(p, k);
    }
    for p in [&va, &vb] {
        strip_hash(p, "source_content_hash");
    }
    let fa = CflowFile::open(&a).unwrap();
    assert!(!fa.has_recorded_content_hash());
    assert_eq!(fa.content_hash(), recorded);
    let (twa, twb) = (VflowFile::open(&va).unwrap(), VflowFile::open(&vb).unwrap());
    assert!(!twa.has_recorded_source_hash());
    assert_eq!(twa.file.content_hash(), recorded);
    assert!(is_twin_of(&twa, &fa));
    assert!(!is_twin_of(&twb, &fa));
    // A twin converted from an old file records the hash computed from it.
    let v2 = to_vflow(&a, 2);
    let t2 = VflowFile::open(&v2).unwrap();
    assert!(t2.has_recorded_source_hash());
    assert!(is_twin_of(&t2, &fa));
    // A malformed recorded hash is a typed error naming the field.
    let mut bytes = std::fs::read(&v2).unwrap();
    let pat = b"\"source_content_hash\":\"sha256:";
    let at = bytes.windows(pat.len()).position(|w| w == pat).unwrap() + pat.len();
    bytes[at] = b'g';
    let e = open_bytes(dir.path(), "bad.vflow", &bytes).unwrap_err();
    assert!(e.to_string().contains("source_content_hash"), "{e}");
}
