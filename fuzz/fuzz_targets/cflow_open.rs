//! `.cflow` open + full validation + inspect + every tile reassembled.
#![no_main]

use cflow::format::CflowFile;
use libfuzzer_sys::fuzz_target;
use std::io::Write;

fuzz_target!(|data: &[u8]| {
    // The reader mmaps a path, so the input goes through a temp file (tmpfs under /tmp is fine).
    let Ok(mut tmp) = tempfile::NamedTempFile::new() else {
        return;
    };
    if tmp.write_all(data).and_then(|_| tmp.flush()).is_err() {
        return;
    }
    let Ok(f) = CflowFile::open(tmp.path()) else {
        return;
    };
    // Everything the validated file promises must hold without panicking.
    let report = cflow::inspect::report(&f);
    let _ = cflow::inspect::render(&report);
    for i in 0..f.layers.len() {
        let _ = f.layer_data(i);
    }
    let _ = f.vocab_data();
});
