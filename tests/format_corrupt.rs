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
