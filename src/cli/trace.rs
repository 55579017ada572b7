//! Trace commands: `replay` (summary or TUI) and `export` (Chrome Trace Event JSON, CSV tables).

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
    use crate::telemetry::csv::Table;
    // Classify every output, and refuse the trace itself, before anything is read or written.
    let chrome = match &a.chrome {
        Some(p) => Some((crate::output::Output::create(p, &[&a.file])?, p.clone())),
        None => None,
    };
    let mut tables = Vec::new();
    if let Some(prefix) = &a.csv {
        for t in Table::ALL {
            let p = csv_path(prefix, t);
            tables.push((t, crate::output::Output::create(&p, &[&a.file])?, p));
        }
    }
    let r = crate::telemetry::replay::Replay::open(&a.file)?;
    // Errors name the path (`Output`); each file appears only when complete.
    if let Some((out, path)) = chrome {
        let mut w = std::io::BufWriter::new(out);
        crate::telemetry::chrome::export_chrome(&r, &mut w)?;
        w.into_inner().map_err(|e| e.into_error())?.commit()?;
        errln!(
            "wrote {} ({} events from {})",
            path.display(),
            r.events.len(),
            a.file.display()
        );
    }
    for (t, out, path) in tables {
        let mut w = std::io::BufWriter::new(out);
        let rows = crate::telemetry::csv::write_table(&r, t, &mut w)?;
        w.into_inner().map_err(|e| e.into_error())?.commit()?;
        errln!(
            "wrote {} ({rows} rows: {} table of {})",
            path.display(),
            t.name(),
            a.file.display()
        );
    }
    Ok(())
}

/// `PREFIX.NAME.csv` (a `.csv` ending of the prefix is dropped: `--csv out.csv` gives
/// `out.tokens.csv`).
fn csv_path(prefix: &std::path::Path, t: crate::telemetry::csv::Table) -> std::path::PathBuf {
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    let b = prefix.as_os_str().as_bytes();
    let mut v = b.strip_suffix(b".csv").unwrap_or(b).to_vec();
    v.extend_from_slice(format!(".{}.csv", t.name()).as_bytes());
    std::path::PathBuf::from(std::ffi::OsString::from_vec(v))
}
