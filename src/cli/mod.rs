//! The command line: clap definitions and dispatch to the subcommands. With no subcommand the
//! TUI opens on the given model (or the built-in demo).

mod args;
mod bench;
pub mod bench_io;
pub mod bench_layout;
pub mod bench_membw;
pub mod bench_readahead;
pub mod bench_schedule;
mod chat;
mod convert;
mod inspect;
mod model;
mod moefy;
mod perplexity;
mod run;
mod sampling_args;
mod text_out;
mod toggles;
mod trace;
mod tui_host;

pub use args::*;
pub use model::{demo_model_path, gpt2_tokenizer_json, open_model, progress_bar, resolve_model};

use crate::errln;
use anyhow::Result;
use bench::cmd_bench_decode;
use chat::cmd_chat;
use clap::Parser;
use convert::{cmd_convert, cmd_gen, cmd_import, cmd_pull};
use inspect::cmd_inspect;
use moefy::cmd_moefy;
use perplexity::cmd_perplexity;
use run::cmd_run;
use trace::{cmd_export, cmd_replay};
use tui_host::default_command;

/// Entry point of the binary; returns the process exit code.
pub fn main() -> i32 {
    let cli = Cli::parse();
    match dispatch(cli) {
        Ok(()) => 0,
        // A closed stdout (`cflow-tui … | head -1`) is the reader's choice: end quietly.
        Err(e) if crate::console::is_closed_pipe(&e) => 0,
        Err(e) => {
            errln!("error: {}", error_line(&e));
            wait_for_sigxfsz(&e);
            1
        }
    }
}

/// A write past `ulimit -f` fails with EFBIG and raises SIGXFSZ at the same time. Unless that
/// signal is ignored, the output module's watcher (its handler) removes the temporary files and
/// lets it kill the process: wait for it rather than race it to a plain exit status of 1.
fn wait_for_sigxfsz(e: &anyhow::Error) {
    let efbig = e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::raw_os_error)
            == Some(libc::EFBIG)
            || c.to_string().contains("File too large")
    });
    if efbig && !crate::io::signal::is_ignored(libc::SIGXFSZ) {
        std::thread::sleep(std::time::Duration::from_secs(5));
    }
}

/// `e` and its causes on one line, `a: b: c`, leaving out a cause whose text the line already
/// holds (an error that prints its source in its own message, as `thiserror`'s `{source}` does,
/// would otherwise show the OS error twice).
pub fn error_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let s = cause.to_string();
        if line.contains(&s) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&s);
    }
    line
}

fn dispatch(mut cli: Cli) -> Result<()> {
    // llama.cpp's `-m FILE` is the MODEL argument (clap refuses both at once).
    if cli.model.is_none() {
        cli.model = cli.model_flag.take();
    }
    if cli.cmd.is_none() {
        return default_command(&cli);
    }
    match cli.cmd {
        None => default_command(&cli),
        Some(Cmd::Run(mut a)) => {
            if a.model.is_none() {
                a.model = a.model_flag.take();
            }
            let eng = a.engine.clone();
            cmd_run(a, &eng)
        }
        Some(Cmd::Gen(a)) => cmd_gen(a),
        Some(Cmd::Inspect(a)) => cmd_inspect(a),
        Some(Cmd::Bench(BenchCmd::Decode(mut a))) => {
            if a.model.is_none() {
                a.model = a.model_flag.take();
            }
            cmd_bench_decode(a)
        }
        Some(Cmd::Bench(BenchCmd::Overlap(a))) => crate::cli::bench_io::overlap(&a),
        Some(Cmd::Bench(BenchCmd::OverlapModel(a))) => {
            crate::outln!("{}", crate::telemetry::overlap_model::report(&a.figures())?)?;
            Ok(())
        }
        Some(Cmd::Bench(BenchCmd::Layout(a))) => {
            crate::cli::bench_layout::layout(&a, a.isa.resolve()?)
        }
        Some(Cmd::Bench(BenchCmd::Prefetch(a))) => {
            let path = model::resolve_model(a.model.clone())?;
            crate::cli::bench_io::prefetch(&a, &path)
        }
        Some(Cmd::Bench(BenchCmd::Membw(a))) => crate::cli::bench_membw::bench(&a),
        Some(Cmd::Bench(BenchCmd::Readahead(a))) => crate::cli::bench_readahead::bench(&a),
        Some(Cmd::Bench(BenchCmd::Schedule(a))) => {
            let path = model::resolve_model(a.model.clone())?;
            crate::cli::bench_schedule::bench(&a, &path)
        }
        Some(Cmd::Perplexity(mut a)) => {
            if a.model.is_none() {
                a.model = a.model_flag.take();
            }
            cmd_perplexity(a)
        }
        Some(Cmd::Import(a)) => cmd_import(a),
        Some(Cmd::Moefy(a)) => cmd_moefy(a),
        Some(Cmd::Pull(a)) => cmd_pull(a),
        Some(Cmd::Chat(mut a)) => {
            if a.model.is_none() {
                a.model = a.model_flag.take();
            }
            cmd_chat(a)
        }
        Some(Cmd::Replay(a)) => cmd_replay(a),
        Some(Cmd::Export(a)) => cmd_export(a),
        Some(Cmd::Convert(a)) => cmd_convert(a),
    }
}
