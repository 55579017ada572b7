//! The engine thread behind the TUI (and scriptable drivers): owns the `Session`, receives
//! `Command`s, emits timestamped `Event`s on a bounded channel (per-token stats are dropped when
//! the consumer lags; tokens never are) and taps the same stream into an optional trace
//! recorder. A small pump thread sets the stop flag the moment `Stop` arrives, so generation
//! stops within one layer; toggles queued during generation apply at the next token boundary.

use super::sampler::Sampler;
use super::session::Session;
use crate::chat::conversation::Conversation;
use crate::io::fault::panic_message;
use crate::telemetry::machine::MachineProfile;
use crate::telemetry::recorder::{Recorder, Tap, TraceHeader};
use crate::telemetry::{Command, EngineConfigInfo, Event, GenSettings, Stamped, StopReason};
use crossbeam_channel::{bounded, unbounded, Receiver, Sender, TrySendError};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// Messages to the engine thread: UI commands plus host controls.
#[derive(Debug)]
pub enum Ctl {
    Cmd(Command),
    /// Record to this path (replacing a regular file, writing a device or FIFO directly).
    StartRecording(PathBuf),
    /// Record to a new, uniquely named file in this directory (the TUI's `r`): see
    /// `Recorder::create_unique_in`.
    StartNewRecording(PathBuf),
    StopRecording,
}

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

/// The engine configuration as the UI shows it.
pub fn config_info(s: &Session) -> EngineConfigInfo {
    s.engine.config_info()
}

/// The generation settings in force: sampling, system prompt, numerics.
pub fn gen_settings(s: &Session, conv: Option<&Conversation>) -> GenSettings {
    let (act, kv) = s.engine.opts.numerics();
    GenSettings {
        sampling: s.sampler.p.clone(),
        system: conv.and_then(|c| c.system.clone()).unwrap_or_default(),
        act: act.into(),
        kv: kv.into(),
    }
}

/// Applies an engine toggle; returns a notice when it could not be applied.
fn toggle_engine(engine: &mut super::Engine, c: &Command) -> Option<String> {
    match c {
        Command::SetLayout(l) => return engine.set_layout(*l).err(),
        Command::SetPrefetch(on) => engine.set_prefetch(*on),
        Command::SetFetch(f) => engine.set_fetch(*f),
        Command::SetExpertTier(t) => engine.set_expert_tier(*t),
        Command::SetSchedule(s) => engine.set_schedule(*s),
        _ => {}
    }
    None
}

/// The engine thread's output: the shared recorder tap, then the UI's channel.
struct Out {
    tap: Mutex<Tap>,
    tx: Sender<Stamped>,
}

impl Out {
    fn tap(&self) -> std::sync::MutexGuard<'_, Tap> {
        self.tap.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn stamp(&self, e: Event) -> Stamped {
        self.tap().stamp(e)
    }

    fn emit(&self, e: Event) {
        let (st, err) = {
            let mut t = self.tap();
            let st = t.emit(e);
            (st, t.take_error())
        };
        match &st.event {
            Event::Stats(_) => match self.tx.try_send(st) {
                Ok(()) | Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {}
            },
            _ => {
                let _ = self.tx.send(st);
            }
        }
        if let Some(message) = err {
            let _ = self.tx.send(self.stamp(Event::Error {
                message,
                fatal: false,
            }));
        }
    }
}

/// Stops the recording (if any) and says where it was saved.
fn stop_recording(out: &Out) {
    let r = out.tap().stop();
    if let Some(r) = r {
        let path = r.path().display().to_string();
        let _ = r.finish();
        out.emit(Event::Notice {
            message: format!("recording saved to {path}"),
        });
    }
}

/// Applies a toggle command between generations; returns the events describing the outcome.
fn apply_toggle(s: &mut Session, c: &Command) -> Vec<Event> {
    let mut out = Vec::new();
    match c {
        Command::SetSampling(p) => {
            match crate::chat::sampling::validate(p) {
                Ok(()) => s.sampler = Sampler::new(p.clone()),
                Err(e) => out.push(Event::Error {
                    message: format!("sampling not changed: {e}"),
                    fatal: false,
                }),
            }
            return out;
        }
        other => {
            if let Some(n) = toggle_engine(&mut s.engine, other) {
                out.push(Event::Notice { message: n });
            }
        }
    }
    out.push(Event::Config(config_info(s)));
    out
}

fn is_toggle(c: &Command) -> bool {
    matches!(
        c,
        Command::SetLayout(_)
            | Command::SetPrefetch(_)
            | Command::SetFetch(_)
            | Command::SetExpertTier(_)
            | Command::SetSchedule(_)
            | Command::SetSampling(_)
    )
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
    if opts.pmu {
        // The PMU must be opened on the engine thread; done below.
    }
    let machine = opts.machine.clone();
    let record = opts.record.clone();
    let pmu = opts.pmu;
    let engine_thread = std::thread::Builder::new()
        .name("cflow-engine".into())
        .spawn(move || {
            if pmu {
                session.engine.set_pmu(crate::telemetry::pmu::Pmu::new());
            }
            let out = Out {
                tap: Mutex::new(Tap::new()),
                tx: ev_tx,
            };
            let summary = session.summary();
            // `mid`: the session has already begun (the TUI's `r`), so the trace gets the
            // session's opening state (model, configuration with its toggles, context
            // position) and replays alone, like one recorded from the start.
            let start_recording = |ctl: &Ctl, s: &Session, out: &Out, mid: bool| {
                // A first launch probes the bandwidth in the background: a recording started
                // after it finished takes the ceiling from the saved profile.
                let mut m = machine.clone();
                if let Some(m) = m.as_mut().filter(|m| m.bandwidth.is_none()) {
                    m.bandwidth = m.cached();
                }
                let header = TraceHeader::new(s.summary(), config_info(s), m);
                let r = match ctl {
                    Ctl::StartNewRecording(dir) => Recorder::create_unique_in(dir, header),
                    Ctl::StartRecording(path) => {
                        Recorder::create_for(path, header, &s.engine.input_files())
                    }
                    _ => return,
                };
                let r = r.and_then(|mut r| {
                    if mid {
                        r.record(&out.stamp(Event::Session {
                            model: Box::new(s.summary()),
                            config: config_info(s),
                        }))?;
                        r.record(&out.stamp(Event::Snapshot {
                            ctx_pos: s.engine.pos() as u32,
                        }))?;
                    }
                    Ok(r)
                });
                match r {
                    Ok(r) => {
                        let message = format!("recording to {}", r.path().display());
                        out.tap().start(r);
                        out.emit(Event::Notice { message });
                    }
                    // The error names the path.
                    Err(e) => out.emit(Event::Error {
                        message: format!("cannot record: {e}"),
                        fatal: false,
                    }),
                }
            };
            if let Some(p) = &record {
                start_recording(&Ctl::StartRecording(p.clone()), &session, &out, false);
            }
            out.emit(Event::Session {
                model: Box::new(summary),
                config: config_info(&session),
            });
            if let (true, Some(reason)) = (pmu, session.engine.pmu().unavailable()) {
                out.emit(Event::Notice {
                    message: format!("PMU: {reason}"),
                });
            }
            let mut conv = Conversation::for_tokenizer(&session.engine.cfg, session.tok.as_ref()).ok();
            out.emit(Event::Settings(gen_settings(&session, conv.as_ref())));
            let deferred: Arc<Mutex<Vec<Ctl>>> = Arc::new(Mutex::new(Vec::new()));
            // Toggles that arrive mid-generation apply at the next token boundary.
            {
                let rx = ctl_rx.clone();
                let def = deferred.clone();
                session.boundary = Some(Box::new(move |engine| {
                    let mut evs = Vec::new();
                    while let Ok(c) = rx.try_recv() {
                        match c {
                            Ctl::Cmd(cmd)
                                if is_toggle(&cmd) && !matches!(cmd, Command::SetSampling(_)) =>
                            {
                                if let Some(n) = toggle_engine(engine, &cmd) {
                                    evs.push(Event::Notice { message: n });
                                }
                                evs.push(Event::Config(engine.config_info()));
                            }
                            other => {
                                if let Ok(mut d) = def.lock() {
                                    d.push(other);
                                }
                            }
                        }
                    }
                    evs
                }));
            }
            let mut poisoned: Option<String> = None;
            loop {
                let next = {
                    let d = deferred.lock().ok().and_then(|mut d| {
                        if d.is_empty() {
                            None
                        } else {
                            Some(d.remove(0))
                        }
                    });
                    match d {
                        Some(c) => c,
                        None => match ctl_rx.recv() {
                            Ok(c) => c,
                            Err(_) => break,
                        },
                    }
                };
                let request = matches!(
                    next,
                    Ctl::Cmd(Command::Complete { .. } | Command::Chat { .. })
                );
                if let Some(why) = &poisoned {
                    // After a panic the engine's state is unknown: refuse at once, stay
                    // responsive (recording controls and Quit still work).
                    match next {
                        Ctl::Cmd(Command::Quit) => break,
                        Ctl::Cmd(Command::Stop) => {}
                        Ctl::Cmd(_) => {
                            out.emit(Event::Error {
                                message: format!(
                                    "the engine stopped after a panic ({why}); restart cflow-tui"
                                ),
                                fatal: true,
                            });
                            if request {
                                out.emit(Event::Done {
                                    reason: StopReason::Error,
                                    n_tokens: 0,
                                    decode_ns: 0,
                                    pos: None,
                                    ttft_ns: None,
                                });
                            }
                        }
                        c @ (Ctl::StartRecording(_) | Ctl::StartNewRecording(_)) => {
                            start_recording(&c, &session, &out, true)
                        }
                        Ctl::StopRecording => stop_recording(&out),
                    }
                    continue;
                }
                // A panic anywhere in the engine while handling one message becomes a fatal
                // `Error` event (and `Done` for a request) instead of a dead thread and a UI
                // waiting forever; later requests fail fast (above).
                let handled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| -> bool {
                    match next {
                        c @ (Ctl::StartRecording(_) | Ctl::StartNewRecording(_)) => {
                            start_recording(&c, &session, &out, true)
                        }
                        Ctl::StopRecording => stop_recording(&out),
                        Ctl::Cmd(Command::Quit) => return true,
                        Ctl::Cmd(Command::Stop) => {
                            session.engine.stop_flag().store(false, Ordering::Relaxed)
                        }
                        Ctl::Cmd(Command::Reset) => {
                            session.reset();
                            if let Some(c) = conv.as_mut() {
                                c.clear();
                            }
                            out.emit(Event::Reset);
                        }
                        Ctl::Cmd(Command::SetSystemPrompt(s)) => {
                            if let Some(c) = conv.as_mut() {
                                c.system = if s.is_empty() { None } else { Some(s) };
                            }
                            out.emit(Event::Settings(gen_settings(&session, conv.as_ref())));
                        }
                        Ctl::Cmd(Command::LoadConversation { system, messages }) => {
                            let Some(c) = conv.as_mut() else {
                                out.emit(Event::Error {
                                    message: "this model has no usable chat template: a saved \
                                              conversation cannot continue on it"
                                        .into(),
                                    fatal: false,
                                });
                                return false;
                            };
                            c.system = (!system.is_empty()).then_some(system);
                            c.turns = messages
                                .iter()
                                .map(|m| {
                                    crate::chat::template::ChatMessage::new(&m.role, m.text.clone())
                                })
                                .collect();
                            out.emit(Event::History { messages });
                            out.emit(Event::Settings(gen_settings(&session, conv.as_ref())));
                        }
                        Ctl::Cmd(Command::Complete { text, max_tokens }) => {
                            session.engine.stop_flag().store(false, Ordering::Relaxed);
                            let ids = match session.encode(&text) {
                                Ok(i) => i,
                                Err(e) => {
                                    out.emit(Event::Error {
                                        message: e,
                                        fatal: false,
                                    });
                                    return false;
                                }
                            };
                            out.emit(Event::Prompt {
                                text,
                                tokens: ids.clone(),
                                chat: false,
                            });
                            session.generate(&ids, max_tokens as usize, true, &mut |e| out.emit(e));
                        }
                        Ctl::Cmd(Command::Chat { text, max_tokens }) => {
                            session.engine.stop_flag().store(false, Ordering::Relaxed);
                            let Some(c) = conv.as_mut() else {
                                out.emit(Event::Error {
                                    message: "this model has no usable chat template".into(),
                                    fatal: false,
                                });
                                return false;
                            };
                            let max_ctx = session.engine.cfg.max_ctx;
                            let Some(tok) = session.tok.as_ref() else {
                                out.emit(Event::Error {
                                    message: "cannot tokenize the chat prompt: this model has no tokenizer".into(),
                                    fatal: false,
                                });
                                return false;
                            };
                            // On an error the conversation is restored as it was.
                            let ids = match c.prepare_turn(&text, tok, max_ctx, max_tokens as usize) {
                                Ok(t) => {
                                    if t.dropped > 0 {
                                        out.emit(Event::Notice {
                                            message: format!(
                                                "context full: dropped the {} oldest messages",
                                                t.dropped
                                            ),
                                        });
                                    }
                                    t.ids
                                }
                                Err(e) => {
                                    out.emit(Event::Error {
                                        message: e.to_string(),
                                        fatal: false,
                                    });
                                    return false;
                                }
                            };
                            let suffix = session.sync_prompt(&ids);
                            out.emit(Event::Prompt {
                                text,
                                tokens: suffix.clone(),
                                chat: true,
                            });
                            let room = max_ctx.saturating_sub(session.engine.pos() + suffix.len());
                            let r = session.generate(
                                &suffix,
                                (max_tokens as usize).min(room),
                                true,
                                &mut |e| out.emit(e),
                            );
                            c.turns
                                .push(crate::chat::template::ChatMessage::new("assistant", r.text));
                        }
                        Ctl::Cmd(c) if is_toggle(&c) => {
                            for e in apply_toggle(&mut session, &c) {
                                out.emit(e);
                            }
                            if matches!(c, Command::SetSampling(_)) {
                                out.emit(Event::Settings(gen_settings(&session, conv.as_ref())));
                            }
                        }
                        Ctl::Cmd(_) => {}
                    }
                    false
                }));
                match handled {
                    Ok(true) => break,
                    Ok(false) => {}
                    Err(p) => {
                        let why = panic_message(&*p);
                        out.emit(Event::Error {
                            message: format!(
                                "engine thread panicked: {why}; the engine is stopped, restart \
                                 cflow-tui"
                            ),
                            fatal: true,
                        });
                        if request {
                            out.emit(Event::Done {
                                reason: StopReason::Error,
                                n_tokens: 0,
                                decode_ns: 0,
                                pos: None,
                                ttft_ns: None,
                            });
                        }
                        poisoned = Some(why);
                    }
                }
            }
            let last = out.tap().stop();
            if let Some(r) = last {
                let _ = r.finish();
            }
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
