//! The engine thread's loop, which `worker::spawn` starts: it takes one message at a time and
//! handles it in its own method (recording, reset, system prompt, a saved conversation,
//! completion, chat, toggles). A panic while handling a message becomes a fatal `Error` event
//! (and `Done` for a request); from then on requests are refused at once.

use super::sampler::Sampler;
use super::session::Session;
use crate::chat::conversation::Conversation;
use crate::chat::template::ChatMessage;
use crate::io::fault::panic_message;
use crate::telemetry::machine::MachineProfile;
use crate::telemetry::recorder::{Recorder, Tap, TraceHeader};
use crate::telemetry::{
    Command, EngineConfigInfo, Event, GenSettings, HistoryMessage, Stamped, StopReason,
};
use crossbeam_channel::{Receiver, Sender, TrySendError};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

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

/// The engine thread's output: the shared recorder tap, then the UI's channel.
pub(super) struct Out {
    tap: Mutex<Tap>,
    tx: Sender<Stamped>,
}

impl Out {
    pub(super) fn new(tx: Sender<Stamped>) -> Out {
        Out {
            tap: Mutex::new(Tap::new()),
            tx,
        }
    }

    fn tap(&self) -> std::sync::MutexGuard<'_, Tap> {
        self.tap.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn stamp(&self, e: Event) -> Stamped {
        self.tap().stamp(e)
    }

    /// Records `e` (when recording) and sends it to the UI; per-token stats are dropped when
    /// the UI lags, nothing else is.
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

    fn error(&self, message: impl Into<String>) {
        self.emit(Event::Error {
            message: message.into(),
            fatal: false,
        });
    }

    /// The `Done` that ends a request the engine could not serve.
    fn done_with_error(&self) {
        self.emit(Event::Done {
            reason: StopReason::Error,
            n_tokens: 0,
            decode_ns: 0,
            pos: None,
            ttft_ns: None,
        });
    }

    /// Stops the recording (if any) and says where it was saved.
    fn stop_recording(&self) {
        let r = self.tap().stop();
        if let Some(r) = r {
            let path = r.path().display().to_string();
            let _ = r.finish();
            self.emit(Event::Notice {
                message: format!("recording saved to {path}"),
            });
        }
    }

    /// Closes the recording, if one is running, without a notice (the engine is quitting).
    fn finish(&self) {
        if let Some(r) = self.tap().stop() {
            let _ = r.finish();
        }
    }
}

/// The engine thread's state between messages.
pub(super) struct EngineLoop {
    session: Session,
    /// The chat history (none when the model has no usable chat template).
    conv: Option<Conversation>,
    out: Out,
    /// The machine profile a trace header carries.
    machine: Option<MachineProfile>,
    /// Set by a panic: the engine's state is unknown, so every later request is refused.
    poisoned: Option<String>,
}

impl EngineLoop {
    pub(super) fn new(session: Session, out: Out, machine: Option<MachineProfile>) -> EngineLoop {
        let conv = Conversation::for_tokenizer(&session.engine.cfg, session.tok.as_ref()).ok();
        EngineLoop {
            session,
            conv,
            out,
            machine,
            poisoned: None,
        }
    }

    /// Opens the session: starts the `record`ing asked for at launch, then announces the
    /// model, its configuration, an unavailable PMU and the generation settings.
    pub(super) fn open(&mut self, record: Option<PathBuf>, pmu: bool) {
        let summary = self.session.summary();
        if let Some(p) = record {
            self.start_recording(&Ctl::StartRecording(p), false);
        }
        self.out.emit(Event::Session {
            model: Box::new(summary),
            config: config_info(&self.session),
        });
        if let (true, Some(reason)) = (pmu, self.session.engine.pmu().unavailable()) {
            self.out.emit(Event::Notice {
                message: format!("PMU: {reason}"),
            });
        }
        self.out.emit(Event::Settings(self.settings()));
    }

    /// Handles messages until `Quit` or until every sender is gone, then closes the recording.
    pub(super) fn run(mut self, rx: Receiver<Ctl>) {
        let deferred = self.defer_non_toggles(rx.clone());
        loop {
            let queued = deferred
                .lock()
                .ok()
                .and_then(|mut d| (!d.is_empty()).then(|| d.remove(0)));
            let next = match queued {
                Some(c) => c,
                None => match rx.recv() {
                    Ok(c) => c,
                    Err(_) => break,
                },
            };
            let quit = match self.poisoned.clone() {
                Some(why) => self.refuse(next, &why),
                None => self.guarded(next),
            };
            if quit {
                break;
            }
        }
        self.out.finish();
    }

    /// Toggles that arrive mid-generation apply at the next token boundary (the session's
    /// hook); any other message read there waits in the returned queue for the loop.
    fn defer_non_toggles(&mut self, rx: Receiver<Ctl>) -> Arc<Mutex<Vec<Ctl>>> {
        let deferred: Arc<Mutex<Vec<Ctl>>> = Arc::new(Mutex::new(Vec::new()));
        let def = deferred.clone();
        self.session.boundary = Some(Box::new(move |engine| {
            let mut evs = Vec::new();
            while let Ok(c) = rx.try_recv() {
                match c {
                    Ctl::Cmd(cmd) if is_toggle(&cmd) && !matches!(cmd, Command::SetSampling(_)) => {
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
        deferred
    }

    /// After a panic: refuses every command at once (a request also gets its `Done`), while
    /// the recording controls and `Quit` still work. Returns true on `Quit`.
    fn refuse(&mut self, next: Ctl, why: &str) -> bool {
        match next {
            Ctl::Cmd(Command::Quit) => return true,
            Ctl::Cmd(Command::Stop) => {}
            Ctl::Cmd(c) => {
                self.out.emit(Event::Error {
                    message: format!("the engine stopped after a panic ({why}); restart cflow-tui"),
                    fatal: true,
                });
                if is_request(&c) {
                    self.out.done_with_error();
                }
            }
            c @ (Ctl::StartRecording(_) | Ctl::StartNewRecording(_)) => {
                self.start_recording(&c, true)
            }
            Ctl::StopRecording => self.out.stop_recording(),
        }
        false
    }

    /// [`Self::handle`] with a panic turned into a fatal `Error` event (and `Done` for a
    /// request) instead of a dead thread and a UI waiting forever. Returns true on `Quit`.
    fn guarded(&mut self, next: Ctl) -> bool {
        let request = matches!(&next, Ctl::Cmd(c) if is_request(c));
        let handled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.handle(next)));
        match handled {
            Ok(quit) => quit,
            Err(p) => {
                let why = panic_message(&*p);
                self.out.emit(Event::Error {
                    message: format!(
                        "engine thread panicked: {why}; the engine is stopped, restart cflow-tui"
                    ),
                    fatal: true,
                });
                if request {
                    self.out.done_with_error();
                }
                self.poisoned = Some(why);
                false
            }
        }
    }

    /// Handles one message. Returns true on `Quit`.
    fn handle(&mut self, next: Ctl) -> bool {
        match next {
            c @ (Ctl::StartRecording(_) | Ctl::StartNewRecording(_)) => {
                self.start_recording(&c, true)
            }
            Ctl::StopRecording => self.out.stop_recording(),
            Ctl::Cmd(Command::Quit) => return true,
            Ctl::Cmd(Command::Stop) => self
                .session
                .engine
                .stop_flag()
                .store(false, Ordering::Relaxed),
            Ctl::Cmd(Command::Reset) => self.reset(),
            Ctl::Cmd(Command::SetSystemPrompt(s)) => self.set_system_prompt(s),
            Ctl::Cmd(Command::LoadConversation { system, messages }) => {
                self.load_conversation(system, messages)
            }
            Ctl::Cmd(Command::Complete { text, max_tokens }) => self.complete(text, max_tokens),
            Ctl::Cmd(Command::Chat { text, max_tokens }) => self.chat(text, max_tokens),
            Ctl::Cmd(c) if is_toggle(&c) => self.toggle(c),
            Ctl::Cmd(_) => {}
        }
        false
    }

    fn settings(&self) -> GenSettings {
        gen_settings(&self.session, self.conv.as_ref())
    }

    /// Starts recording where `ctl` says. `mid`: the session has already begun (the TUI's
    /// `r`), so the trace gets the session's opening state (model, configuration with its
    /// toggles, context position) and replays alone, like one recorded from the start.
    fn start_recording(&self, ctl: &Ctl, mid: bool) {
        let s = &self.session;
        // A first launch probes the bandwidth in the background: a recording started after it
        // finished takes the ceiling from the saved profile.
        let mut m = self.machine.clone();
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
                r.record(&self.out.stamp(Event::Session {
                    model: Box::new(s.summary()),
                    config: config_info(s),
                }))?;
                r.record(&self.out.stamp(Event::Snapshot {
                    ctx_pos: s.engine.pos() as u32,
                }))?;
            }
            Ok(r)
        });
        match r {
            Ok(r) => {
                let message = format!("recording to {}", r.path().display());
                self.out.tap().start(r);
                self.out.emit(Event::Notice { message });
            }
            // The error names the path.
            Err(e) => self.out.error(format!("cannot record: {e}")),
        }
    }

    /// Clears the context and the chat history.
    fn reset(&mut self) {
        self.session.reset();
        if let Some(c) = self.conv.as_mut() {
            c.clear();
        }
        self.out.emit(Event::Reset);
    }

    /// Sets (or, when empty, removes) the chat's system prompt.
    fn set_system_prompt(&mut self, s: String) {
        if let Some(c) = self.conv.as_mut() {
            c.system = if s.is_empty() { None } else { Some(s) };
        }
        self.out.emit(Event::Settings(self.settings()));
    }

    /// Replaces the chat history by a saved conversation.
    fn load_conversation(&mut self, system: String, messages: Vec<HistoryMessage>) {
        let Some(c) = self.conv.as_mut() else {
            return self.out.error(
                "this model has no usable chat template: a saved conversation cannot continue on it",
            );
        };
        c.system = (!system.is_empty()).then_some(system);
        c.turns = messages
            .iter()
            .map(|m| ChatMessage::new(&m.role, m.text.clone()))
            .collect();
        self.out.emit(Event::History { messages });
        self.out.emit(Event::Settings(self.settings()));
    }

    /// Plain completion of `text`, continuing the current context.
    fn complete(&mut self, text: String, max_tokens: u32) {
        let s = &mut self.session;
        s.engine.stop_flag().store(false, Ordering::Relaxed);
        let ids = match s.encode(&text) {
            Ok(i) => i,
            Err(e) => return self.out.error(e),
        };
        self.out.emit(Event::Prompt {
            text,
            tokens: ids.clone(),
            chat: false,
        });
        let out = &self.out;
        s.generate(&ids, max_tokens as usize, true, &mut |e| out.emit(e));
    }

    /// One chat turn: the user's `text` through the template, the reply appended to the
    /// history. On an error the conversation stays as it was.
    fn chat(&mut self, text: String, max_tokens: u32) {
        let s = &mut self.session;
        s.engine.stop_flag().store(false, Ordering::Relaxed);
        let Some(c) = self.conv.as_mut() else {
            return self.out.error("this model has no usable chat template");
        };
        let max_ctx = s.engine.cfg.max_ctx;
        let Some(tok) = s.tok.as_ref() else {
            return self
                .out
                .error("cannot tokenize the chat prompt: this model has no tokenizer");
        };
        let ids = match c.prepare_turn(&text, tok, max_ctx, max_tokens as usize) {
            Ok(t) => {
                if t.dropped > 0 {
                    self.out.emit(Event::Notice {
                        message: format!("context full: dropped the {} oldest messages", t.dropped),
                    });
                }
                t.ids
            }
            Err(e) => return self.out.error(e.to_string()),
        };
        let suffix = s.sync_prompt(&ids);
        self.out.emit(Event::Prompt {
            text,
            tokens: suffix.clone(),
            chat: true,
        });
        let room = max_ctx.saturating_sub(s.engine.pos() + suffix.len());
        let out = &self.out;
        let r = s.generate(&suffix, (max_tokens as usize).min(room), true, &mut |e| {
            out.emit(e)
        });
        c.turns.push(ChatMessage::new("assistant", r.text));
    }

    /// A toggle between generations (sampling, or an engine setting).
    fn toggle(&mut self, c: Command) {
        for e in apply_toggle(&mut self.session, &c) {
            self.out.emit(e);
        }
        if matches!(c, Command::SetSampling(_)) {
            self.out.emit(Event::Settings(self.settings()));
        }
    }
}

/// A command that generates and so ends with `Done`.
fn is_request(c: &Command) -> bool {
    matches!(c, Command::Complete { .. } | Command::Chat { .. })
}
