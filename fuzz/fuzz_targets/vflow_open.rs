//! `.vflow` open + full validation, then everything the validated file exposes: the group table
//! (every group span and the vocabulary region), the O(1) expert-bank lookup for every
//! `(layer, expert)` (must agree with the validated views), every tile of every matrix
//! reassembled, `inspect`, and a re-conversion of the views to a fresh `.vflow` that must open.
#![no_main]

use cflow::format::vflow::{convert, VflowFile};
use libfuzzer_sys::fuzz_target;
use std::io::Write;

fuzz_target!(|data: &[u8]| {
    // The reader mmaps a path, so the input goes through a temp file (on tmpfs when there is
    // one: the writer `fsync`s, which would otherwise hit the disk on every execution).
    let Ok(dir) = scratch_dir() else {
        return;
    };
    let path = dir.path().join("in.vflow");
    let written = std::fs::File::create(&path).and_then(|mut f| f.write_all(data));
    if written.is_err() {
        return;
    }
    let Ok(v) = VflowFile::open(&path) else {
        return;
    };
    let _ = format!("{v:?}");
    let bytes = v.file.bytes();
    let (nl, ne) = (v.header.n_layers as usize, v.header.n_experts as usize);
    assert_eq!(v.groups.len(), v.header.n_groups as usize + 1);
    for g in &v.groups {
        let (a, n) = (g.offset as usize, g.len as usize);
        assert!(
            bytes.get(a..a + n).is_some(),
            "group span {g:?} outside the file"
        );
    }
    assert_eq!(v.file.layers.len(), nl);
    for (l, lv) in v.file.layers.iter().enumerate() {
        assert_eq!(lv.experts.len(), ne);
        for (e, ex) in lv.experts.iter().enumerate() {
            let r = v.expert_region(l, e);
            assert_eq!(
                r,
                Some((ex.offset, ex.len)),
                "bank lookup (layer {l}, expert {e})"
            );
            let (a, n) = (ex.offset as usize, ex.len as usize);
            assert!(
                bytes.get(a..a + n).is_some(),
                "expert region outside the file"
            );
        }
    }
    assert_eq!(v.expert_region(nl, 0), None);
    assert_eq!(v.expert_region(0, ne), None);
    let report = cflow::inspect::report(&v.file);
    let _ = cflow::inspect::render(&report);
    for i in 0..nl {
        let _ = v.file.layer_data(i);
    }
    let _ = v.file.vocab_data();
    // The writer must accept whatever the reader validated, and its output must validate.
    let group = (v.header.group_size as usize).min(nl.max(1));
    let out = dir.path().join("out.vflow");
    if let Err(e) = convert(&v.file, &out, group) {
        panic!("re-converting a validated .vflow failed: {e}");
    }
    if let Err(e) = VflowFile::open(&out) {
        panic!("the re-converted .vflow does not open: {e}");
    }
});

fn scratch_dir() -> std::io::Result<tempfile::TempDir> {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(d) = tempfile::tempdir_in(shm) {
            return Ok(d);
        }
    }
    tempfile::tempdir()
}
