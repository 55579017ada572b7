//! The command line: clap definitions and dispatch to the subcommands. With no subcommand the
//! TUI opens on the given model (or the built-in demo).

mod args;
mod bench;
mod chat;
mod convert;
mod inspect;
mod model;
mod run;
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
use run::{cmd_perplexity, cmd_run};
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
            errln!("error: {e:#}");
            1
        }
    }
}

fn dispatch(cli: Cli) -> Result<()> {
    if cli.cmd.is_none() {
        return default_command(&cli);
    }
    match cli.cmd {
        None => default_command(&cli),
        Some(Cmd::Run(a)) => cmd_run(a, &cli.engine),
        Some(Cmd::Gen(a)) => cmd_gen(a),
        Some(Cmd::Inspect(a)) => cmd_inspect(a),
        Some(Cmd::Bench(BenchCmd::Decode(a))) => cmd_bench_decode(a, &cli.engine),
        Some(Cmd::Bench(BenchCmd::Overlap(a))) => {
            crate::bench_io::overlap(&a, cli.engine.options()?)
        }
        Some(Cmd::Bench(BenchCmd::Layout(a))) => {
            crate::bench_io::layout(&a, cli.engine.options()?.isa)
        }
        Some(Cmd::Bench(BenchCmd::Prefetch(a))) => {
            let path = resolve_model(a.model.clone())?;
            crate::bench_io::prefetch(&a, &path, cli.engine.options()?)
        }
        Some(Cmd::Perplexity(a)) => cmd_perplexity(a, &cli.engine),
        Some(Cmd::Import(a)) => cmd_import(a),
        Some(Cmd::Pull(a)) => cmd_pull(a),
        Some(Cmd::Chat(a)) => cmd_chat(a, &cli.engine),
        Some(Cmd::Replay(a)) => cmd_replay(a),
        Some(Cmd::Export(a)) => cmd_export(a),
        Some(Cmd::Convert(a)) => cmd_convert(a),
    }
}
