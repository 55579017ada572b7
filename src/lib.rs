//! cflow: a CPU-first tile-streaming decode engine, and the cflow-tui workbench around it.
//!
//! Module map (see docs/ARCHITECTURE.md): `format` owns the on-disk `.cflow`/`.vflow` layouts,
//! `quant` the block formats, `kernels` the dot products and matvec drivers, `model` geometry and
//! weight views, `engine` the forward pass and scheduler, `io` prefetch and expert fetch,
//! `telemetry` events/PMU/traces, `convert` importers and generators, `chat` tokenizers and
//! templates, `tui` the terminal UI, `output` how every output path is written, `cache` cache
//! entries shared between processes, `gguf_cache` a `.gguf` opened through its cached import. The
//! engine never imports `tui`.
#![deny(unsafe_code)]

// Lets `cflow::` paths resolve inside the crate: the unit tests include the shared test GGUF
// writer (`tests/common/gguf_writer.rs`), which names the library as `cflow`.
#[cfg(test)]
extern crate self as cflow;

pub mod cache;
pub mod chat;
pub mod cli;
pub mod console;
pub mod convert;
pub mod engine;
#[allow(unsafe_code)]
pub mod format;
pub mod gguf_cache;
pub mod input;
pub mod inspect;
#[allow(unsafe_code)]
pub mod io;
#[allow(unsafe_code)]
pub mod kernels;
pub mod model;
pub mod output;
pub mod ppl;
pub mod quant;
pub mod rng;
pub mod stats;
pub mod telemetry;
pub mod toggles;
pub mod tui;
pub mod util;
