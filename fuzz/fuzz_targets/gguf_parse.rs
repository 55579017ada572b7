//! GGUF header/metadata/tensor-table parser, the tokenizer built from its metadata, and, for a
//! file whose architecture `import` runs (`gguf_arch::ARCHS`), the whole import into a temp
//! `.cflow` (expert counts, 3-D expert tensors, the shared expert, Q/K norms): it may refuse
//! with a typed error, never panic, and on error it leaves no output file.
#![no_main]

use cflow::convert::gguf::GgufFile;
use cflow::convert::gguf_arch::arch_spec;
use cflow::convert::gguf_tokenizer::tokenizer_from_gguf;
use cflow::convert::import_gguf::{import_gguf, QuantTarget};
use libfuzzer_sys::fuzz_target;
use std::io::Write;

fuzz_target!(|data: &[u8]| {
    let Ok(f) = GgufFile::parse(data.to_vec(), "fuzz.gguf") else {
        return;
    };
    let _ = format!("{f:?}");
    for t in f.tensors() {
        let _ = f.view(t);
    }
    if let Ok(tok) = tokenizer_from_gguf(&f) {
        let _ = format!("{tok:?}");
    }
    let runnable = f
        .opt_str("general.architecture")
        .ok()
        .flatten()
        .is_some_and(|a| arch_spec(a).is_some());
    // Imports of up to 4 MiB inputs only: the fuzzer's speed matters more than huge tensors.
    if !runnable || data.len() > 4 << 20 {
        return;
    }
    let Ok(dir) = tempfile::tempdir() else {
        return;
    };
    let src = dir.path().join("in.gguf");
    let out = dir.path().join("out.cflow");
    let Ok(mut w) = std::fs::File::create(&src) else {
        return;
    };
    if w.write_all(data).is_err() {
        return;
    }
    if import_gguf(&src, &out, QuantTarget::Keep, Some(64), |_, _| {}).is_err() {
        assert!(!out.exists(), "a failed import left its output");
    }
});
