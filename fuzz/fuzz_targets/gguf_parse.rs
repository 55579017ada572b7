//! GGUF header/metadata/tensor-table parser, and the tokenizer built from its metadata.
#![no_main]

use cflow::convert::gguf::GgufFile;
use cflow::convert::gguf_tokenizer::tokenizer_from_gguf;
use libfuzzer_sys::fuzz_target;

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
});
