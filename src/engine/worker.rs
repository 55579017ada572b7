//! The engine thread behind the TUI (and scriptable drivers): owns the `Session`, receives
//! `Command`s, emits timestamped `Event`s on a bounded channel (per-token stats are dropped when
//! the consumer lags; tokens never are) and taps the same stream into an optional trace
//! recorder. A small pump thread sets the stop flag the moment `Stop` arrives, so generation
//! stops within one layer; toggles queued during generation apply at the next token boundary.
//! The engine thread's loop, one method per message, is [`super::engine_loop`].

pub use super::engine_loop::{config_info, gen_settings, Ctl};
use super::engine_loop::{EngineLoop, Out};
use super::session::Session;
use crate::telemetry::machine::MachineProfile;
use crate::telemetry::{Command, Stamped};
use crossbeam_channel::{bounded, unbounded, Receiver, Sender};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

pub struct WorkerOptions {
    pub record: Option<PathBuf>,
    pub machine: Option<MachineProfile>,
    /// Sample PMU counters per phase.
    pub pmu: bool,
}

/// Handle to a running engine thread.
pub struct Worker {
    /// UI → engine commands (through the stop pump).
    pub commands: Sender<Command>,
    /// Host controls (recording).
    pub control: Sender<Ctl>,
    /// Engine → UI events.
    pub events: Receiver<Stamped>,
    pub stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Worker {
    /// Waits for the engine thread to finish (after `Command::Quit` or dropping `commands`).
    pub fn join(mut self) {
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Starts the engine thread over `session`.
pub fn spawn(mut session: Session, opts: WorkerOptions) -> Worker {
    let (cmd_tx, cmd_rx) = unbounded::<Command>();
    let (ctl_tx, ctl_rx) = unbounded::<Ctl>();
    let (ev_tx, ev_rx) = bounded::<Stamped>(8192);
    let stop = session.engine.stop_flag().clone();
    let stop_p = stop.clone();
    let ctl_fwd = ctl_tx.clone();
    let pump = std::thread::Builder::new()
        .name("cflow-cmd-pump".into())
        .spawn(move || {
            for c in cmd_rx {
                if matches!(c, Command::Stop | Command::Quit) {
                    stop_p.store(true, Ordering::Relaxed);
                }
                let quit = matches!(c, Command::Quit);
                if ctl_fwd.send(Ctl::Cmd(c)).is_err() || quit {
                    break;
                }
            }
            // Commands closed: ask the engine to quit.
            stop_p.store(true, Ordering::Relaxed);
            let _ = ctl_fwd.send(Ctl::Cmd(Command::Quit));
        })
        .expect("spawn pump thread");
    let WorkerOptions {
        record,
        machine,
        pmu,
    } = opts;
    let engine_thread = std::thread::Builder::new()
        .name("cflow-engine".into())
        .spawn(move || {
            // The PMU must be opened on the engine thread.
            if pmu {
                session.engine.set_pmu(crate::telemetry::pmu::Pmu::new());
            }
            let mut l = EngineLoop::new(session, Out::new(ev_tx), machine);
            l.open(record, pmu);
            l.run(ctl_rx);
        })
        .expect("spawn engine thread");
    Worker {
        commands: cmd_tx,
        control: ctl_tx,
        events: ev_rx,
        stop,
        threads: vec![pump, engine_thread],
    }
}
