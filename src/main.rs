//! The `cflow-tui` binary: a thin wrapper around `cflow::cli` (all `unsafe` lives in the library
//! modules `format`, `kernels` and `io`).
#![deny(unsafe_code)]

fn main() {
    std::process::exit(cflow::cli::main());
}
