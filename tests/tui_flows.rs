//! TUI flows driven by the real engine: the events a run records, applied to `App` the way the
//! live UI applies them. A refused prompt (context full) must end the turn, so the next prompt
//! is accepted, and the context gauge must stay within the context.

mod common;

use cflow::telemetry::replay::Replay;
use cflow::telemetry::{Event, StopReason};
use cflow::tui::app::{App, Msg};
use common::{tiny_model, BIN};
use std::process::Command;

#[test]
fn a_prompt_refused_for_context_ends_the_turn_and_keeps_the_gauge_in_range() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_model(dir.path(), "2048");
    let trace = dir.path().join("t.trace.jsonl");
    let ids: Vec<String> = (1..=20).map(|i| i.to_string()).collect();
    let out = Command::new(BIN)
        .arg("run")
        .arg(&m)
        .args([
            "--max-ctx",
            "8",
            "--token-ids",
            &ids.join(","),
            "-n",
            "4",
            "--record",
        ])
        .arg(&trace)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a 20-token prompt fit in 8 positions?"
    );
    assert!(err.contains("does not fit"), "{err}");
    let r = Replay::open(&trace).unwrap();
    let kinds: Vec<&Event> = r.events.iter().map(|s| &s.event).collect();
    let done = kinds
        .iter()
        .rev()
        .find_map(|e| match e {
            Event::Done { reason, pos, .. } => Some((*reason, *pos)),
            _ => None,
        })
        .expect("a refused prompt still ends with Done");
    assert_eq!(done, (StopReason::ContextFull, Some(0)));

    let mut app = App::default();
    for s in r.events.iter().cloned() {
        app.apply(Msg::Stamped(s));
    }
    assert!(!app.generating, "the refused prompt left the UI generating");
    let v = app.view();
    let max = v.model.as_ref().expect("session header").max_ctx;
    assert!(v.ctx_used <= max, "ctx {}/{max}", v.ctx_used);
    assert_eq!(v.ctx_used, 0);
}

/// Waits for the worker's next event matching `f` (panics after 60 s), returning every event
/// seen on the way.
fn wait_for(
    rx: &crossbeam_channel::Receiver<cflow::telemetry::Stamped>,
    f: impl Fn(&Event) -> bool,
) -> Vec<Event> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let e = rx.recv_timeout(left).expect("worker event").event;
        let hit = f(&e);
        seen.push(e);
        if hit {
            return seen;
        }
    }
}

#[test]
fn a_recording_started_mid_session_replays_like_one_from_the_start() {
    use cflow::convert::generate::{generate, GenSpec};
    use cflow::engine::session::Session;
    use cflow::engine::worker::{spawn, Ctl, WorkerOptions};
    use cflow::engine::{Engine, EngineOptions};
    use cflow::format::CflowFile;
    use cflow::telemetry::{Command as Cmd, SamplingParams};
    use cflow::tui::app::{PaneId, TuiOptions};

    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m.cflow");
    let mut spec = GenSpec::new("arch2_4_combined");
    spec.layers = Some(2);
    spec.hidden = Some(64);
    spec.heads = Some(4);
    spec.ffn = Some(128);
    spec.experts = Some(4);
    spec.expert_ffn = Some(64);
    spec.tokenizer_json = cflow::chat::bundled_gpt2_tokenizer().map(str::to_string);
    generate(&spec, &model, |_, _| {}).unwrap();
    let file = std::sync::Arc::new(CflowFile::open(&model).unwrap());
    let engine = Engine::new(
        file,
        EngineOptions {
            threads: 1,
            ..Default::default()
        },
    );
    let session = Session::new(engine, SamplingParams::default()).unwrap();
    let w = spawn(
        session,
        WorkerOptions {
            record: None,
            machine: None,
            pmu: false,
        },
    );
    let done = |e: &Event| matches!(e, Event::Done { .. });
    wait_for(&w.events, |e| matches!(e, Event::Session { .. }));
    // A first turn and a toggle, before the recording starts.
    w.commands
        .send(Cmd::Complete {
            text: "Once upon a time".into(),
            max_tokens: 5,
        })
        .unwrap();
    wait_for(&w.events, done);
    w.commands.send(Cmd::SetPrefetch(true)).unwrap();
    wait_for(&w.events, |e| matches!(e, Event::Config(c) if c.prefetch));
    // `r` mid-session, one more turn, `r` again.
    let trace = dir.path().join("mid.trace.jsonl");
    w.control.send(Ctl::StartRecording(trace.clone())).unwrap();
    wait_for(
        &w.events,
        |e| matches!(e, Event::Notice { message } if message.starts_with("recording to")),
    );
    w.commands
        .send(Cmd::Complete {
            text: " there was".into(),
            max_tokens: 4,
        })
        .unwrap();
    let live = wait_for(&w.events, done);
    let Some(Event::Done {
        pos: Some(live_pos),
        ..
    }) = live.last()
    else {
        panic!("no Done with a position: {live:?}");
    };
    w.control.send(Ctl::StopRecording).unwrap();
    wait_for(
        &w.events,
        |e| matches!(e, Event::Notice { message } if message.starts_with("recording saved")),
    );
    w.commands.send(Cmd::Quit).unwrap();
    w.join();

    // Replayed alone, the trace knows its session: model (MoE), toggles, context position.
    let r = Replay::open(&trace).unwrap();
    assert!(
        matches!(r.events[0].event, Event::Session { .. }),
        "{:?}",
        r.events[0]
    );
    let mut app = App::new(&TuiOptions {
        replay: true,
        ..TuiOptions::default()
    });
    app.apply(Msg::Resize(160, 48));
    let first_prompt_at = r
        .events
        .iter()
        .position(|e| matches!(e.event, Event::Prompt { .. }))
        .unwrap();
    for e in r.events[..first_prompt_at].iter().cloned() {
        app.apply(Msg::Stamped(e));
    }
    let v = app.view();
    assert!(v.model.as_ref().is_some_and(|m| m.n_experts == 4));
    assert!(
        v.config.as_ref().is_some_and(|c| c.prefetch),
        "toggle state lost"
    );
    // The first turn (Once upon a time + 5 tokens) is already in the context.
    let before = v.ctx_used;
    assert!(
        before >= 5,
        "context position lost: {before} {:?}",
        &r.events[..first_prompt_at.min(4)]
            .iter()
            .map(|e| format!("{:?}", e.event)
                .chars()
                .take(80)
                .collect::<String>())
            .collect::<Vec<_>>()
    );
    for e in r.events[first_prompt_at..].iter().cloned() {
        app.apply(Msg::Stamped(e));
    }
    assert_eq!(
        app.view().ctx_used,
        *live_pos,
        "gauge after the recorded turn"
    );
    assert!(app.view().ctx_used <= app.view().model.as_ref().unwrap().max_ctx);
    // The panes that waited for a session draw it.
    let screen = render(&app);
    assert!(!screen.contains("waiting for a session"), "{screen}");
    assert!(!screen.contains("dense model"), "{screen}");
    // ← (a backward step) re-sends the trace from its start: the Session resets the app and
    // the snapshot restores the context position.
    use cflow::telemetry::player::{play, ReplayControl};
    let mut again = App::new(&TuiOptions {
        replay: true,
        ..TuiOptions::default()
    });
    let (tx, rx) = crossbeam_channel::unbounded();
    let (ctl_tx, ctl_rx) = crossbeam_channel::unbounded();
    ctl_tx.send(ReplayControl::SetPaused(true)).unwrap();
    ctl_tx.send(ReplayControl::Step(3)).unwrap();
    let events = r.events.clone();
    let t = std::thread::spawn(move || play(events, tx, ctl_rx, 1.0));
    let drain = |app: &mut App| {
        while let Ok(e) = rx.recv_timeout(std::time::Duration::from_millis(500)) {
            app.apply(Msg::Stamped(e));
        }
    };
    drain(&mut again);
    let at3 = again.view().ctx_used;
    assert!(at3 > before, "{at3} {before}");
    ctl_tx.send(ReplayControl::Step(-1)).unwrap();
    drain(&mut again);
    let v = again.view();
    assert!(v.model.as_ref().is_some_and(|m| m.n_experts == 4));
    assert!(v.config.as_ref().is_some_and(|c| c.prefetch));
    assert_eq!(
        v.ctx_used,
        at3 - 1,
        "← must land one token back, not at ctx 0"
    );
    drop(ctl_tx);
    let _ = t.join();
    let _ = PaneId::Critical;
}

fn render(app: &App) -> String {
    let backend = ratatui::backend::TestBackend::new(app.size.0, app.size.1);
    let mut term = ratatui::Terminal::new(backend).unwrap();
    term.draw(|f| cflow::tui::screen::draw(f, app)).unwrap();
    let buf = term.backend().buffer().clone();
    let mut s = String::new();
    for y in 0..buf.area.height {
        for x in 0..buf.area.width {
            s.push_str(buf[(x, y)].symbol());
        }
        s.push('\n');
    }
    s
}

/// Issue 16 item 4: in a replay, `t=` in the REPLAY badge moves with every ← / → step, and the
/// first step after a pause is not lost (the app's requests go to the real player).
#[test]
fn replay_steps_move_the_clock_and_the_first_step_after_a_pause_works() {
    use cflow::telemetry::player::play;
    use cflow::tui::app::{Action, TuiOptions, UiRequest};
    let events = cflow::tui::fixture::demo_events(8, true);
    let mut app = App::new(&TuiOptions {
        replay: true,
        ..TuiOptions::default()
    });
    app.apply(Msg::Resize(160, 48));
    let (tx, rx) = crossbeam_channel::unbounded();
    let (ctl_tx, ctl_rx) = crossbeam_channel::unbounded();
    // The fixture's tokens are milliseconds apart: at 1/1000 speed the replay crawls, so
    // everything seen below comes from the steps.
    let t = std::thread::spawn(move || play(events, tx, ctl_rx, 0.001));
    let drain = |app: &mut App| {
        while let Ok(e) = rx.recv_timeout(std::time::Duration::from_millis(400)) {
            app.apply(Msg::Stamped(e));
        }
    };
    let send = |app: &mut App, a: Action| {
        for r in app.apply(Msg::Action(a)).requests {
            if let UiRequest::Replay(c) = r {
                ctl_tx.send(c).unwrap();
            }
        }
    };
    let clock = |app: &App| -> String {
        let s = render(app);
        let head = s.lines().next().unwrap_or("").to_string();
        head.split("t=")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .unwrap_or_else(|| panic!("no t= in {head}"))
            .to_string()
    };
    let token = |app: &App| app.view().last.as_ref().map(|l| l.index);
    drain(&mut app);
    send(&mut app, Action::ReplayPause);
    drain(&mut app);
    let (t0, n0) = (app.replay.unwrap().t_ns, token(&app));
    // The first → after the pause shows the next token, and the clock moves.
    send(&mut app, Action::ReplayStep(1));
    drain(&mut app);
    let (t1, n1) = (app.replay.unwrap().t_ns, token(&app));
    assert!(t1 > t0, "t= did not move on →: {t0} → {t1}");
    assert_eq!(n1, Some(n0.map_or(0, |n| n + 1)), "{n0:?} → {n1:?}");
    let c1 = clock(&app);
    send(&mut app, Action::ReplayStep(1));
    drain(&mut app);
    let t2 = app.replay.unwrap().t_ns;
    assert!(t2 > t1, "{t1} → {t2}");
    // Tokens are milliseconds apart: the badge must show that step, not round it away.
    assert_ne!(clock(&app), c1, "t= on screen did not move on →");
    // ← goes back one token, and so does the clock.
    send(&mut app, Action::ReplayStep(-1));
    drain(&mut app);
    let t3 = app.replay.unwrap().t_ns;
    assert!(t3 < t2, "t= did not move back on ←: {t2} → {t3}");
    assert_eq!(token(&app), n1);
    assert_eq!(clock(&app), c1, "the badge shows the token's time again");
    drop(ctl_tx);
    let _ = t.join();
}

/// A/B auto in the live TUI: the toggle command it asks for after a measured token must reach
/// the engine. The event drain of `tui::run` dropped the effects of events, so A/B auto
/// counted blocks but never switched the arm (found in the new-user A/B capture: 599 tokens,
/// all "off").
#[test]
fn a_b_auto_commands_from_events_are_not_dropped_by_the_drain() {
    use cflow::telemetry::Command;
    use cflow::tui::app::{Action, TuiOptions};
    let mut app = App::new(&TuiOptions::default());
    let evs = cflow::tui::fixture::demo_events(200, false);
    let (tx, rx) = crossbeam_channel::unbounded();
    // The session first, then arm A/B auto on the focused toggle (prefetch).
    tx.send(evs[0].clone()).unwrap();
    let _ = cflow::tui::drain(
        &mut app,
        &rx,
        std::time::Instant::now() + std::time::Duration::from_secs(5),
    );
    app.apply(Msg::Action(Action::AbAuto));
    assert!(app.ab_auto.is_some());
    for e in &evs[1..] {
        tx.send(e.clone()).unwrap();
    }
    let (fx, got, closed) = cflow::tui::drain(
        &mut app,
        &rx,
        std::time::Instant::now() + std::time::Duration::from_secs(5),
    );
    assert!(got && !closed);
    assert!(
        fx.commands
            .iter()
            .any(|c| matches!(c, Command::SetPrefetch(true))),
        "{:?}",
        fx.commands
    );
}
