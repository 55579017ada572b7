//! Trace commands: `replay` (summary or TUI) and `export` (Chrome Trace Event JSON).

use super::args::{ExportArgs, ReplayArgs};
use crate::{errln, out, outln};
use anyhow::{bail, Result};

pub(super) fn cmd_replay(a: ReplayArgs) -> Result<()> {
    use crate::telemetry::replay::{summary, Replay};
    let r = Replay::open(&a.file)?;
    for w in &r.warnings {
        errln!("warning: {w}");
    }
    let skipped: u64 = r.skipped.values().sum();
    if skipped > 0 {
        errln!(
            "warning: skipped {skipped} events of unknown kinds: {:?}",
            r.skipped
        );
    }
    use std::io::IsTerminal;
    if a.summary || !std::io::stdout().is_terminal() {
        let s = summary(&r);
        if a.json {
            outln!("{}", serde_json::to_string_pretty(&s)?)?;
        } else {
            out!("{s}")?;
        }
        return Ok(());
    }
    if !(a.speed > 0.0 && a.speed.is_finite()) {
        bail!("--speed must be > 0");
    }
    let (tx, rx) = crossbeam_channel::bounded::<crate::telemetry::Stamped>(1024);
    let (ctl_tx, ctl_rx) = crossbeam_channel::unbounded::<crate::tui::ReplayControl>();
    let events = r.events.clone();
    let speed0 = a.speed;
    let feeder =
        std::thread::spawn(move || crate::telemetry::player::play(events, tx, ctl_rx, speed0));
    let opts = crate::tui::TuiOptions {
        replay: true,
        replay_speed: speed0,
        bandwidth: r.header.machine.as_ref().and_then(|m| m.bandwidth.clone()),
        theme: crate::tui::Theme::from_env(),
        ..Default::default()
    };
    let (cmd_tx, _cmd_rx) = crossbeam_channel::unbounded();
    let res = crate::tui::run(opts, rx, cmd_tx, None, |req| {
        if let crate::tui::UiRequest::Replay(c) = req {
            let _ = ctl_tx.send(c);
        }
    });
    drop(ctl_tx);
    let _ = feeder.join();
    res
}

pub(super) fn cmd_export(a: ExportArgs) -> Result<()> {
    // Classify the output, and refuse the trace itself, before anything is read or written.
    let out = crate::output::Output::create(&a.chrome, &[&a.file])?;
    let r = crate::telemetry::replay::Replay::open(&a.file)?;
    // Errors name the path (`Output`); the file appears only when complete.
    let mut w = std::io::BufWriter::new(out);
    crate::telemetry::chrome::export_chrome(&r, &mut w)?;
    w.into_inner().map_err(|e| e.into_error())?.commit()?;
    errln!(
        "wrote {} ({} events from {})",
        a.chrome.display(),
        r.events.len(),
        a.file.display()
    );
    Ok(())
}
