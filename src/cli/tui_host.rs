//! Hosting the TUI: the default command (the TUI on a model, or the headless demo when stdout
//! is not a terminal) and the TUI side of `replay`.

use super::args::{Cli, RunArgs};
use super::model::{new_engine, open_for_decode, resolve_model};
use super::run::cmd_run;
use crate::engine::session::Session;
use crate::errln;
use anyhow::Result;
use std::path::PathBuf;

pub(super) fn default_command(cli: &Cli) -> Result<()> {
    use std::io::IsTerminal;
    let tty = std::io::stdout().is_terminal() && std::io::stdin().is_terminal();
    // A directory or a missing file: one line, before anything else is printed; a GGUF: its
    // import in the cache.
    let model = match &cli.model {
        Some(p) => Some(resolve_model(Some(p.clone()))?),
        None => None,
    };
    if cli.no_tui || !tty {
        errln!("cflow-tui: stdout is not a terminal (or --no-tui): running the headless demo instead of the TUI.");
        if cli.chat.transcript.is_some() || cli.chat.system.is_some() {
            errln!("cflow-tui: --transcript and --system apply to the TUI's chat; the headless demo ignores them.");
        }
        let a = RunArgs {
            model: model.clone(),
            model_flag: None,
            prompt: Some("Once upon a time".into()),
            token_ids: None,
            n: 32,
            sampling: cli.chat.sampling.clone(),
            json: false,
            verbose: false,
            dump_logits: None,
            dump_routing: None,
            top: 10,
            ignore_eos: false,
            chat: false,
            record: cli.record.clone(),
            engine: cli.engine.clone(),
        };
        return cmd_run(a, &cli.engine);
    }
    let path = resolve_model(model)?;
    let opened = open_for_decode(&path, &cli.engine)?;
    let opts = cli.engine.options()?;
    let report = crate::inspect::report(&opened.file);
    let engine = new_engine(&path, opened.file, opts, &cli.engine)?;
    let chat = engine.cfg().meta.chat_template.is_some();
    let sampling = match chat {
        true => cli.chat.sampling.chat_params()?,
        false => cli.chat.sampling.params()?,
    };
    let startup = crate::tui::transcript::startup_commands(&cli.chat.start())?;
    let mut session =
        Session::with_tokenizer(engine, sampling, opened.tokenizer).map_err(anyhow::Error::msg)?;
    session.report = Some(report);
    // The read ceiling comes from the saved machine profile; on the first launch the probe (a
    // few seconds) runs in the background once the UI is up, and the UI says "measuring…".
    let machine =
        crate::telemetry::machine::MachineProfile::load_cached(session.engine.opts().isa.name());
    let bandwidth = machine.bandwidth.clone();
    let probe = bandwidth.is_none().then(|| {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let mut m = machine.clone();
        let _ = std::thread::Builder::new()
            .name("cflow-membw".into())
            .spawn(move || {
                // Let the first frames draw before the probe takes the cores.
                std::thread::sleep(std::time::Duration::from_millis(300));
                let _ = tx.send(m.probe_and_cache());
            });
        rx
    });
    let worker = crate::engine::worker::spawn(
        session,
        crate::engine::worker::WorkerOptions {
            record: cli.record.clone(),
            machine: Some(machine),
            pmu: !cli.no_pmu,
        },
    );
    let opts = crate::tui::TuiOptions {
        replay: false,
        recording: cli.record.is_some(),
        bandwidth_pending: probe.is_some(),
        bandwidth,
        max_tokens: u32::try_from(cli.max_tokens).unwrap_or(u32::MAX),
        mouse: true,
        theme: crate::tui::Theme::from_env(),
        ..Default::default()
    };
    for c in startup {
        let _ = worker.commands.send(c);
    }
    let control = worker.control.clone();
    let res = crate::tui::run(
        opts,
        worker.events.clone(),
        worker.commands.clone(),
        probe,
        |r| match r {
            crate::tui::UiRequest::StartRecording => {
                // A new `cflow-<UTC date-time>[-N].trace.jsonl` in the working directory.
                let _ = control.send(crate::engine::worker::Ctl::StartNewRecording(
                    PathBuf::from("."),
                ));
            }
            crate::tui::UiRequest::StopRecording => {
                let _ = control.send(crate::engine::worker::Ctl::StopRecording);
            }
            _ => {}
        },
    );
    let _ = worker.commands.send(crate::telemetry::Command::Quit);
    worker.join();
    res
}
