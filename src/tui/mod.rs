//! Terminal UI: the cflow-tui workbench.
//!
//! Data flows one way (docs/ARCHITECTURE.md, "Threads and channels"): engine or replay `Stamped`
//! events come in on a channel, are applied to [`App`] (pure state, [`App::apply`]), and the screen
//! is drawn from that state at ≤ 30 fps (drain-then-draw, frame rate independent of token rate).
//! Keys become [`Action`]s through the single table in [`keymap`]; actions may produce engine
//! [`Command`]s and [`UiRequest`]s for the host (recording, replay control, quit).
//!
//! Files: `app` (state and its mutation), `telemetry` (the engine-derived state the panes draw),
//! `io_totals` and `critical_model` (the statistics behind Overlap and Critical path), `keymap`, `theme`, `terminal` (guard), `screen` (layout), `common`
//! (helpers), one file per pane: `text`, `streams`, `critical`, `routing`, `pmu`, `overlap`, `ab`,
//! `status` (status bar + footer), `timeline` (the run's ms/token or GB/s with history: `history`
//! keeps it in bounded memory), `heatmap` (per layer × token), `roofline` (phases against the
//! read ceiling and a modelled compute roof), `help` and `info` (overlays);
//! the chat features: `chat` (actions), `settings` (overlay), `transcript` (summary line,
//! save/continue), `clipboard` (OSC 52).

pub mod ab;
pub mod app;
pub mod chat;
pub mod clipboard;
pub mod common;
pub mod critical;
pub mod critical_model;
pub mod fixture;
pub mod heatmap;
pub mod help;
pub mod history;
pub mod info;
pub mod io_totals;
pub mod keymap;
pub mod overlap;
pub mod pmu;
pub mod roofline;
pub mod routing;
pub mod screen;
pub mod settings;
pub mod status;
pub mod streams;
pub mod telemetry;
pub mod terminal;
pub mod text;
pub mod theme;
pub mod timeline;
pub mod transcript;

use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TryRecvError};
use ratatui::crossterm::event::{self as ct, Event as CtEvent};

pub use app::{Action, App, Effects, Msg, PaneId, ReplayControl, TuiOptions, UiRequest};
pub use theme::Theme;

use crate::telemetry::event::{Command, Stamped};

/// Target frame interval (10 fps, like a fast btop: smooth enough for streaming text, and leaves the cores to
/// decode — measured with benches/tui_overhead.sh).
pub const FRAME: Duration = Duration::from_millis(100);
/// Longest time the screen waits for a backward replay step to finish before drawing anyway.
const SEEK_MAX: Duration = Duration::from_secs(2);
/// How often a live run samples the machine's contention (/proc/stat, /proc/loadavg).
const CONTENTION_EVERY: Duration = Duration::from_secs(1);
/// Longest time spent draining events before drawing a frame.
const DRAIN_BUDGET: Duration = Duration::from_millis(20);

/// Performs the requests that need the app and the terminal (save the transcript, copy the
/// last reply, mouse capture) and reports their outcome to the app; returns the others.
fn local_requests(
    mut fx: Effects,
    app: &mut App,
    guard: &mut terminal::TerminalGuard,
) -> anyhow::Result<Effects> {
    use crate::telemetry::event::Event;
    let mut rest = Vec::new();
    for r in std::mem::take(&mut fx.requests) {
        let outcome = match r {
            UiRequest::SaveTranscript => {
                let t = transcript::from_app(app);
                Some(match transcript::save_in(std::path::Path::new("."), &t) {
                    Ok(p) => Event::Notice {
                        message: format!(
                            "transcript saved to {} (continue it: cflow-tui MODEL --transcript {})",
                            p.display(),
                            p.display()
                        ),
                    },
                    Err(e) => Event::Error {
                        message: format!("cannot save the transcript: {e}"),
                        fatal: false,
                    },
                })
            }
            UiRequest::CopyLastReply => {
                let text = app.last_reply().unwrap_or_default().to_string();
                match clipboard::copy(&mut std::io::stdout(), &text) {
                    Ok(n) if n < text.len() => Some(Event::Notice {
                        message: format!(
                            "copied the first {n} of {} bytes (OSC 52 limit)",
                            text.len()
                        ),
                    }),
                    Ok(_) => None,
                    Err(e) => Some(Event::Error {
                        message: format!("cannot copy: {e}"),
                        fatal: false,
                    }),
                }
            }
            UiRequest::SetMouseCapture(on) => {
                guard.set_mouse(on)?;
                None
            }
            other => {
                rest.push(other);
                None
            }
        };
        if let Some(e) = outcome {
            app.apply(Msg::Event(e));
        }
    }
    fx.requests = rest;
    Ok(fx)
}

/// Applies every pending event (until `deadline`), returning what they asked for (A/B auto's
/// toggle commands), whether any arrived, and whether the source closed.
pub fn drain(
    app: &mut App,
    events: &Receiver<Stamped>,
    deadline: Instant,
) -> (Effects, bool, bool) {
    let mut fx = Effects::default();
    let mut got = false;
    loop {
        match events.try_recv() {
            Ok(ev) => {
                let e = app.apply(Msg::Stamped(ev));
                fx.commands.extend(e.commands);
                fx.requests.extend(e.requests);
                got = true;
                if Instant::now() >= deadline {
                    return (fx, got, false);
                }
            }
            Err(TryRecvError::Empty) => return (fx, got, false),
            Err(TryRecvError::Disconnected) => {
                app.apply(Msg::SourceClosed);
                return (fx, true, true);
            }
        }
    }
}

/// Run the TUI until the user quits (or the event source closes and the user quits).
///
/// `events` is the live engine stream or a replay feeder; `commands` goes to the engine (a replay
/// host may simply drop them); `probe` brings the result of a background bandwidth probe (first
/// launch); `on_request` receives recording / replay-control / quit requests. Ctrl+Z suspend is
/// handled here.
pub fn run(
    opts: TuiOptions,
    events: Receiver<Stamped>,
    commands: Sender<Command>,
    mut probe: Option<Receiver<crate::telemetry::membw::Bandwidth>>,
    mut on_request: impl FnMut(UiRequest),
) -> anyhow::Result<()> {
    let mut guard = terminal::TerminalGuard::new(opts.mouse)?;
    let mut app = App::new(&opts);
    let size = guard.terminal.size()?;
    app.apply(Msg::Resize(size.width, size.height));

    let mut dirty = true;
    let mut closed = false;
    let mut last_draw = Instant::now() - FRAME;
    let mut last_tick = Instant::now();
    let mut seek_since: Option<Instant> = None;
    // This machine's contention, once a second on a live run (a replay's was another run's).
    let mut contention = (!opts.replay).then(crate::telemetry::contention::Sampler::default);
    let mut last_contention = Instant::now() - CONTENTION_EVERY;

    let dispatch = |fx: Effects,
                    guard: &mut terminal::TerminalGuard,
                    on_request: &mut dyn FnMut(UiRequest)|
     -> anyhow::Result<()> {
        for c in fx.commands {
            // The engine may already be gone (e.g. replay); nothing to do then.
            let _ = commands.send(c);
        }
        for r in fx.requests {
            match r {
                UiRequest::Suspend => guard.suspend()?,
                other => on_request(other),
            }
        }
        Ok(())
    };

    loop {
        // 1. Drain everything pending (bounded by a time budget so input stays responsive).
        if !closed {
            let (fx, got, end) = drain(&mut app, &events, Instant::now() + DRAIN_BUDGET);
            dirty |= got;
            closed = end;
            // Events can ask for commands (A/B auto switches its arm after a measured token).
            if !fx.is_empty() {
                let fx = local_requests(fx, &mut app, &mut guard)?;
                dispatch(fx, &mut guard, &mut on_request)?;
            }
        }

        if let Some(sampler) = contention.as_mut() {
            if last_contention.elapsed() >= CONTENTION_EVERY {
                last_contention = Instant::now();
                if let Some(c) = sampler.sample() {
                    app.apply(Msg::Contention(c));
                    dirty = true;
                }
            }
        }

        if let Some(rx) = &probe {
            let got = match rx.try_recv() {
                Ok(b) => Some(Some(b)),
                Err(TryRecvError::Disconnected) => Some(None),
                Err(TryRecvError::Empty) => None,
            };
            if let Some(b) = got {
                app.apply(Msg::Bandwidth(b));
                probe = None;
                dirty = true;
            }
        }

        // 2. Draw at most once per frame interval; not while a backward replay step re-plays
        // the trace from its start (its intermediate tokens would flash by), for at most 2 s.
        let seeking =
            app.seeking() && seek_since.get_or_insert_with(Instant::now).elapsed() < SEEK_MAX;
        if !app.seeking() {
            seek_since = None;
        }
        if dirty && !seeking && last_draw.elapsed() >= FRAME {
            guard.terminal.draw(|f| screen::draw(f, &app))?;
            last_draw = Instant::now();
            dirty = false;
        }
        if app.quit {
            break;
        }

        // 3. Input, waiting at most until the next frame is due.
        let wait = FRAME
            .saturating_sub(last_tick.elapsed())
            .max(Duration::from_millis(1));
        if ct::poll(wait)? {
            loop {
                let msg = match ct::read()? {
                    CtEvent::Key(k) => {
                        keymap::resolve(&k, keymap::KeyState::of(&app)).map(Msg::Action)
                    }
                    CtEvent::Mouse(m) => keymap::resolve_mouse(&m).map(Msg::Action),
                    CtEvent::Resize(w, h) => Some(Msg::Resize(w, h)),
                    CtEvent::Paste(s) => {
                        for c in s.chars() {
                            app.apply(Msg::Action(if c == '\n' {
                                Action::Newline
                            } else {
                                Action::Insert(c)
                            }));
                        }
                        dirty = true;
                        None
                    }
                    _ => None,
                };
                if let Some(msg) = msg {
                    let fx = app.apply(msg);
                    let fx = local_requests(fx, &mut app, &mut guard)?;
                    dispatch(fx, &mut guard, &mut on_request)?;
                    dirty = true;
                    // Key presses redraw immediately.
                    last_draw = Instant::now() - FRAME;
                }
                if app.quit || !ct::poll(Duration::ZERO)? {
                    break;
                }
            }
        }

        // 4. Tick (~30 Hz): message expiry and the generating spinner.
        if last_tick.elapsed() >= FRAME {
            last_tick = Instant::now();
            let had_msg = app.status_message().is_some();
            app.apply(Msg::Tick);
            if app.generating || had_msg != app.status_message().is_some() {
                dirty = true;
            }
        }
    }
    drop(guard);
    Ok(())
}
