//! Corrupted `.cflow` files: every case must give a typed `FormatError` naming the file, never a
//! panic, UB or SIGBUS.

use cflow::convert::generate::{generate, GenSpec};
use cflow::format::{CflowFile, FormatError, GlobalHeader, TileHeader};
use cflow::quant::QuantType;
use std::path::{Path, PathBuf};

fn base(dir: &Path) -> (PathBuf, Vec<u8>) {
    let mut s = GenSpec::new("arch2_4_combined");
    s.layers = Some(3);
    s.hidden = Some(64);
    s.heads = Some(4);
    s.ffn = Some(128);
    s.experts = Some(4);
    s.expert_ffn = Some(64);
    s.vocab = Some(130);
    s.quant = QuantType::Q4_0;
    let p = dir.join("base.cflow");
    generate(&s, &p, |_, _| {}).unwrap();
    let b = std::fs::read(&p).unwrap();
    (p, b)
}

fn header(b: &[u8]) -> GlobalHeader {
    GlobalHeader::decode(b).unwrap()
}

fn put_header(b: &mut [u8], h: &GlobalHeader) {
    b[..88].copy_from_slice(&h.encode());
}

fn open_bytes(dir: &Path, name: &str, b: &[u8]) -> FormatError {
    let p = dir.join(name);
    std::fs::write(&p, b).unwrap();
    let e = CflowFile::open(&p).expect_err(name);
    let msg = e.to_string();
    assert!(
        msg.contains(name),
        "{name}: error does not name the file: {msg}"
    );
    e
}

fn table_entry(b: &[u8], i: usize) -> (usize, u64, u64) {
    let t = { header(b).layer_table_offset } as usize + i * 16;
    (
        t,
        u64::from_le_bytes(b[t..t + 8].try_into().unwrap()),
        u64::from_le_bytes(b[t + 8..t + 16].try_into().unwrap()),
    )
}

#[test]
fn corrupted_files_give_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let (path, good) = base(dir.path());
    let f = CflowFile::open(&path).unwrap();
    let d = dir.path();

    // 1-4. Truncated at several points.
    for (i, cut) in [10usize, 100, good.len() / 2, good.len() - 1]
        .iter()
        .enumerate()
    {
        let e = open_bytes(d, &format!("trunc{i}.cflow"), &good[..*cut]);
        assert!(
            matches!(
                e,
                FormatError::TooSmall { .. }
                    | FormatError::OutOfBounds { .. }
                    | FormatError::BadMetadata { .. }
            ),
            "truncated at {cut}: {e}"
        );
    }
    // 5. Bad magic.
    let mut b = good.clone();
    b[0] = b'X';
    assert!(matches!(
        open_bytes(d, "magic.cflow", &b),
        FormatError::BadMagic { .. }
    ));
    // 6. Bad version.
    let mut b = good.clone();
    let mut h = header(&b);
    h.version = 4;
    put_header(&mut b, &h);
    assert!(matches!(
        open_bytes(d, "version.cflow", &b),
        FormatError::BadVersion { found: 4, .. }
    ));
    // 7. Header geometry contradicting the directory.
    let mut b = good.clone();
    let mut h = header(&b);
    h.d_ff = 256;
    put_header(&mut b, &h);
    assert!(matches!(
        open_bytes(d, "geometry.cflow", &b),
        FormatError::Mismatch { .. }
    ));
    // 8. Layer offset past EOF.
    let mut b = good.clone();
    let (t, _, _) = table_entry(&b, 1);
    b[t..t + 8].copy_from_slice(&(good.len() as u64 + 4096).to_le_bytes());
    assert!(matches!(
        open_bytes(d, "offset.cflow", &b),
        FormatError::OutOfBounds { .. }
    ));
    // 9. Overlapping regions.
    let mut b = good.clone();
    let (_, o0, _) = table_entry(&b, 0);
    let (t1, _, _) = table_entry(&b, 1);
    b[t1..t1 + 8].copy_from_slice(&(o0 + 64).to_le_bytes());
    assert!(matches!(
        open_bytes(d, "overlap.cflow", &b),
        FormatError::Overlap { .. }
    ));
    // 10. A tile header whose dimensions lie.
    let mut b = good.clone();
    let off = f.layers[1].k.stripes[0];
    let mut th = TileHeader::decode(&b[off..off + 16]).unwrap();
    th.tile_rows = 200;
    b[off..off + 16].copy_from_slice(&th.encode());
    assert!(matches!(
        open_bytes(d, "tiledims.cflow", &b),
        FormatError::Mismatch { .. }
    ));
    // 11. Expert table entry out of range.
    let mut b = good.clone();
    let ex = &f.layers[0].experts[2];
    // Locate the table entry of expert 2 by its (offset, length) bytes.
    let needle: Vec<u8> = ex
        .offset
        .to_le_bytes()
        .iter()
        .chain(ex.len.to_le_bytes().iter())
        .copied()
        .collect();
    let pos = b.windows(16).position(|w| w == needle.as_slice()).unwrap();
    b[pos..pos + 8].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(
        open_bytes(d, "experttable.cflow", &b),
        FormatError::Overflow { .. } | FormatError::OutOfBounds { .. }
    ));
    // 12. Metadata that is not JSON.
    let mut b = good.clone();
    let h = header(&b);
    b[h.metadata_offset as usize] = b'#';
    assert!(matches!(
        open_bytes(d, "meta.cflow", &b),
        FormatError::BadMetadata { .. }
    ));
    // 13. Zero layers.
    let mut b = good.clone();
    let mut h = header(&b);
    h.n_layers = 0;
    put_header(&mut b, &h);
    assert!(matches!(
        open_bytes(d, "zerolayers.cflow", &b),
        FormatError::BadField {
            field: "n_layers",
            ..
        }
    ));
    // 14. Huge dimensions that would overflow usize arithmetic.
    let mut b = good.clone();
    let mut h = header(&b);
    h.d_model = u32::MAX - 31;
    h.vocab = u32::MAX;
    put_header(&mut b, &h);
    assert!(matches!(
        open_bytes(d, "huge.cflow", &b),
        FormatError::BadField { .. }
    ));
    // 15. Metadata offset past EOF.
    let mut b = good.clone();
    let mut h = header(&b);
    h.metadata_offset = u64::MAX - 3;
    put_header(&mut b, &h);
    assert!(matches!(
        open_bytes(d, "metaoff.cflow", &b),
        FormatError::Overflow { .. } | FormatError::OutOfBounds { .. }
    ));
    // 16. Unknown combine style.
    let mut b = good.clone();
    let mut h = header(&b);
    h.combine_style = 99;
    put_header(&mut b, &h);
    assert!(matches!(
        open_bytes(d, "style.cflow", &b),
        FormatError::BadField {
            field: "combine_style",
            ..
        }
    ));
    // 17. A directory claiming a huge number of entries.
    let mut b = good.clone();
    let (_, o0, _) = table_entry(&b, 0);
    b[o0 as usize + 8..o0 as usize + 12].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(
        open_bytes(d, "direntries.cflow", &b),
        FormatError::BadField { .. }
    ));
    // 18. Empty file.
    assert!(matches!(
        open_bytes(d, "empty.cflow", &[]),
        FormatError::TooSmall { .. }
    ));
}

#[test]
fn every_truncation_point_is_an_error_not_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let (_, good) = base(dir.path());
    let p = dir.path().join("t.cflow");
    let step = (good.len() / 97).max(1);
    let mut cut = 0;
    while cut < good.len() {
        std::fs::write(&p, &good[..cut]).unwrap();
        assert!(CflowFile::open(&p).is_err(), "cut at {cut}");
        cut += step;
    }
}

/// `b` with its metadata JSON (the file's last section) edited by `f` and the header's
/// `metadata_len` updated.
fn with_meta(b: &[u8], f: impl FnOnce(&mut serde_json::Value)) -> Vec<u8> {
    let mut h = header(b);
    let (mo, ml) = (h.metadata_offset as usize, h.metadata_len as usize);
    assert_eq!(mo + ml, b.len(), "metadata is the last section");
    let mut v: serde_json::Value = serde_json::from_slice(&b[mo..]).unwrap();
    f(&mut v);
    let j = serde_json::to_vec(&v).unwrap();
    let mut out = b[..mo].to_vec();
    out.extend_from_slice(&j);
    h.metadata_len = j.len() as u32;
    put_header(&mut out, &h);
    out
}

/// Runs the binary under a 4 GiB address-space limit (a runaway allocation fails fast) and
/// returns (exit code, signal, stderr).
fn limited(args: &[&str], model: &Path) -> (Option<i32>, Option<i32>, String) {
    use std::os::unix::process::ExitStatusExt;
    let o = std::process::Command::new("sh")
        .arg("-c")
        .arg("ulimit -v 4194304 || exit 99; exec \"$@\"")
        .arg("sh")
        .arg(env!("CARGO_BIN_EXE_cflow-tui"))
        .args(args)
        .arg(model)
        .output()
        .unwrap();
    assert_ne!(o.status.code(), Some(99), "ulimit -v failed");
    (
        o.status.code(),
        o.status.signal(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Issue 14 item 9: metadata numbers that size an allocation or index an array are validated at
/// open with a typed error naming the field. Before, `rope_dims = 1000` opened and then panicked
/// in `engine/ops.rs`, and `fixed_point_iterations = 4294967295` aborted `inspect` and `run` on
/// a 206 GB allocation.
#[test]
fn metadata_numbers_are_validated_at_open() {
    use serde_json::json;
    let dir = tempfile::tempdir().unwrap();
    let (_, good) = base(dir.path());
    let fixed_point = |b: &[u8]| {
        let mut b = b.to_vec();
        let mut h = header(&b);
        h.combine_style = 6;
        put_header(&mut b, &h);
        b
    };
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "rope_dims",
            with_meta(&good, |m| m["rope_dims"] = json!(1000)),
        ),
        ("rope_dims", with_meta(&good, |m| m["rope_dims"] = json!(7))),
        (
            "rope_theta_per_layer",
            with_meta(&good, |m| m["rope_theta_per_layer"] = json!([1e4, -1.0])),
        ),
        (
            "attn_logit_softcap",
            with_meta(&good, |m| m["attn_logit_softcap"] = json!(-1.0)),
        ),
        (
            "fixed_point_iterations",
            fixed_point(&with_meta(&good, |m| {
                m["fixed_point_iterations"] = json!(4294967295u32)
            })),
        ),
        ("bos_id", with_meta(&good, |m| m["bos_id"] = json!(130))),
        // Issue 44: a RoPE base <= 1 makes every logit NaN.
        (
            "rope_theta_per_layer",
            with_meta(&good, |m| m["rope_theta_per_layer"] = json!([1e4, 0.5])),
        ),
    ];
    for (i, (field, b)) in cases.iter().enumerate() {
        let name = format!("meta{i}.cflow");
        let e = open_bytes(dir.path(), &name, b);
        assert!(
            matches!(&e, FormatError::BadMetaField { field: f, .. } if f == field),
            "{field}: {e}"
        );
        assert!(e.to_string().contains(field), "{e}");
    }
    // The header's RoPE base must be finite and > 1 too (issue 44: 1e-45 gave NaN logits).
    for theta in [1e-45f32, 1.0, f32::NAN] {
        let mut b = good.clone();
        let mut h = header(&b);
        h.rope_theta = theta;
        put_header(&mut b, &h);
        let e = open_bytes(dir.path(), "theta.cflow", &b).to_string();
        assert!(
            e.contains("rope_theta") && e.contains("> 1"),
            "{theta}: {e}"
        );
    }
    // The reported crashes, end to end: a clear error and exit 1, no panic, no abort.
    for (i, _) in cases.iter().enumerate().filter(|(_, c)| c.0 != "bos_id") {
        let p = dir.path().join(format!("meta{i}.cflow"));
        for args in [
            &["inspect"][..],
            &["run", "--token-ids", "1,2", "-n", "2"][..],
        ] {
            let (code, sig, err) = limited(args, &p);
            assert_eq!(
                (code, sig),
                (Some(1), None),
                "{args:?} {}: {err}",
                cases[i].0
            );
            assert!(err.contains(cases[i].0), "{err}");
        }
    }
    // Values at the limits still open: partial rotary, per-layer lists (entries past the last
    // layer are never read: a file cut to fewer layers keeps them), FixedPoint with 3 blocks ×
    // 1365 iterations = 4095 layer executions.
    let ok = with_meta(&good, |m| {
        m["rope_dims"] = json!(8);
        m["rope_theta_per_layer"] = json!([1e4, 5e5, 1e4, -1.0]);
        m["sliding_window"] = json!([0, 16, 0, 8, 8]);
        m["fixed_point_iterations"] = json!(1365);
    });
    let p = dir.path().join("ok.cflow");
    std::fs::write(&p, fixed_point(&ok)).unwrap();
    let f = CflowFile::open(&p).unwrap();
    assert_eq!(f.cfg.effective_layers(), 4095);
}
