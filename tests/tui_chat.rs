//! The TUI's chat features on screen (issue 16, item 10), with `TestBackend` snapshots at
//! 80×24, 100×30 and 160×48: the header's numerics and sampling, the system prompt in the Text
//! pane's title, the per-reply summary line, the settings overlay, and the zoomed Text pane
//! with its input box.

use cflow::chat::sampling::chat_defaults;
use cflow::telemetry::event::{Event, GenSettings, StopReason};
use cflow::tui::app::{Action, App, Msg, PaneId, TuiOptions};
use cflow::tui::fixture::dense_events;
use cflow::tui::screen;
use ratatui::backend::TestBackend;
use ratatui::Terminal;

const SIZES: [(u16, u16); 3] = [(80, 24), (100, 30), (160, 48)];

fn settings() -> GenSettings {
    GenSettings {
        sampling: chat_defaults(),
        system: "You are a concise assistant.".into(),
        act: "f32".into(),
        kv: "f32".into(),
    }
}

/// The dense chat fixture with the engine's `Settings` and the second reply finished.
fn chat((w, h): (u16, u16)) -> App {
    let mut app = App::new(&TuiOptions::default());
    app.apply(Msg::Resize(w, h));
    let mut evs = dense_events();
    // Settings right after the session, as the worker sends them.
    let first = evs.remove(0);
    app.apply(Msg::Stamped(first));
    app.apply(Msg::Event(Event::Settings(settings())));
    for e in evs {
        app.apply(Msg::Stamped(e));
    }
    app.apply(Msg::Event(Event::Token {
        index: 5,
        id: 1,
        text: " Rome.".into(),
    }));
    app.apply(Msg::Event(Event::Done {
        reason: StopReason::Eos,
        n_tokens: 6,
        decode_ns: 60_000_000,
        pos: Some(68),
        ttft_ns: Some(40_060_000),
    }));
    app
}

fn screen(app: &App, (w, h): (u16, u16)) -> String {
    let mut term = Terminal::new(TestBackend::new(w, h)).unwrap();
    term.draw(|f| screen::draw(f, app)).unwrap();
    term.backend().to_string()
}

#[test]
fn header_shows_numerics_and_sampling_and_replies_their_summary() {
    for size in SIZES {
        let app = chat(size);
        let s = screen(&app, size);
        let header = s.lines().next().unwrap();
        assert!(
            header.contains("act f32 kv f32") || header.contains("f32/kv f32"),
            "{size:?}: {header}"
        );
        assert!(
            header.contains("T0.7 k40 p0.95 m0.05"),
            "{size:?}: {header}"
        );
        assert!(s.contains("ms/tok"), "{size:?}: no summary line\n{s}");
        assert!(s.contains("system: You are a"), "{size:?}\n{s}");
        insta::assert_snapshot!(format!("chat_screen_{}x{}", size.0, size.1), s);
    }
}

/// Issue 16 item 10 (the header shows act and kv): the SmolLM2 header is fitted by priority —
/// model, act, kv, sampling, ctx, then threads and toggles — and never cut: at 160 columns it
/// holds everything, at 100 and 80 the low-priority parts shorten or go, whole.
#[test]
fn the_chat_header_fits_by_priority() {
    let want: [(u16, &[&str], &[&str]); 3] = [
        (
            160,
            &[
                "SmolLM2-135M-Instruct",
                "act f32 kv f32",
                "T0.7 k40 p0.95 m0.05 r1.1 s0",
                "ctx 2048",
                "AVX2",
                "OFF",
                "mmap",
            ],
            &[],
        ),
        (
            100,
            &[
                // A mix of types is never shown as its first type (issue 43 §3).
                "SmolLM2-135M-Instruct · 3 types",
                "f32",
                "kv f32",
                "T0.7 k40 p0.95 m0.05 r1.1 s0",
                "ctx 2048",
            ],
            &["prefetch", "Q4_1"],
        ),
        (
            80,
            &[
                "SmolLM2-135M-In",
                "f32",
                "kv f32",
                "T0.7 k40 p0.95 m0.05 r1.1 s0",
            ],
            &["prefetch", "Q4_1"],
        ),
    ];
    for (w, must, must_not) in want {
        let size = (w, 24);
        let s = screen(&chat(size), size);
        // TestBackend quotes each row.
        let header = s
            .lines()
            .next()
            .unwrap()
            .trim_matches('"')
            .trim_end()
            .to_string();
        for m in must {
            assert!(header.contains(m), "{w}: no {m:?} in {header:?}");
        }
        for m in must_not {
            assert!(!header.contains(m), "{w}: {m:?} in {header:?}");
        }
        // Nothing cut: the line ends with a whole part, inside the width.
        assert!(header.chars().count() <= w as usize, "{header}");
        assert!(
            ["s0", "ctx 2048", "AVX2", "mmap", "kv f32"]
                .iter()
                .any(|e| header.ends_with(e)),
            "{w}: cut: {header:?}"
        );
    }
}

#[test]
fn settings_overlay() {
    for size in SIZES {
        let mut app = chat(size);
        app.apply(Msg::Action(Action::OpenSettings));
        app.apply(Msg::Action(Action::SettingsAdjust(1)));
        app.apply(Msg::Action(Action::SettingsMove(-1)));
        let s = screen(&app, size);
        assert!(s.contains("Chat settings"), "{s}");
        assert!(s.contains("0.75"), "the draft shows: {s}");
        assert!(s.contains("You are a concise assistant.▌"), "{s}");
        insta::assert_snapshot!(format!("chat_settings_{}x{}", size.0, size.1), s);
    }
}

#[test]
fn zoomed_text_pane_keeps_its_input_box() {
    for size in SIZES {
        let mut app = chat(size);
        assert_eq!(app.focus, PaneId::Text);
        for c in "Tell me more".chars() {
            app.apply(Msg::Action(Action::Insert(c)));
        }
        app.apply(Msg::Action(Action::Maximize));
        let s = screen(&app, size);
        assert!(s.contains("> Tell me more"), "{size:?}\n{s}");
        assert!(!s.contains("Streams"), "{size:?}: not zoomed\n{s}");
        insta::assert_snapshot!(format!("chat_zoomed_text_{}x{}", size.0, size.1), s);
    }
}

#[test]
fn mouse_release_shows_a_badge() {
    let mut app = chat((160, 48));
    app.apply(Msg::Action(Action::ToggleMouse));
    assert!(screen(&app, (160, 48))
        .lines()
        .next()
        .unwrap()
        .contains("MOUSE OFF"));
    app.apply(Msg::Action(Action::ToggleMouse));
    assert!(!screen(&app, (160, 48)).contains("MOUSE OFF"));
}
