//! What a frame costs: the Text pane wraps only what it shows and caches finished turns
//! (`tui::text::WrapCache`), so a long session draws as fast as a short one; the cached rows are
//! the rows an uncached wrap gives. `cargo bench --bench tui_frame_cost` prints µs/frame.

use cflow::telemetry::event::{Event, Stamped};
use cflow::tui::app::{App, Msg, TuiOptions};
use cflow::tui::fixture::demo_events;
use cflow::tui::screen;
use cflow::tui::text::{transcript_lines, transcript_tail};
use ratatui::backend::TestBackend;
use ratatui::Terminal;
use std::time::Instant;

fn app_with(n: u32, size: (u16, u16)) -> App {
    let mut app = App::new(&TuiOptions::default());
    app.apply(Msg::Resize(size.0, size.1));
    for e in demo_events(n, true) {
        app.apply(Msg::Stamped(e));
    }
    app
}

/// Mean µs per frame over `reps` frames.
fn frame_us(app: &App, term: &mut Terminal<TestBackend>, reps: u32) -> f64 {
    let t = Instant::now();
    for _ in 0..reps {
        term.draw(|f| screen::draw(f, app)).unwrap();
    }
    t.elapsed().as_secs_f64() * 1e6 / reps as f64
}

/// The frame cost does not grow with the history: a finished 20000-token reply draws within 2×
/// the time of a 24-token one (it was 4× when every frame wrapped the whole transcript).
/// Alternating best-of-5, so machine load hits both alike.
#[test]
fn a_long_finished_session_draws_about_as_fast_as_a_short_one() {
    let size = (160, 48);
    let short = app_with(24, size);
    let long = app_with(20_000, size);
    let mut ts = Terminal::new(TestBackend::new(size.0, size.1)).unwrap();
    let mut tl = Terminal::new(TestBackend::new(size.0, size.1)).unwrap();
    let (mut bs, mut bl) = (f64::MAX, f64::MAX);
    for _ in 0..5 {
        bs = bs.min(frame_us(&short, &mut ts, 20));
        bl = bl.min(frame_us(&long, &mut tl, 20));
    }
    assert!(
        bl < 2.0 * bs,
        "20000 tokens: {bl:.0} µs/frame vs 24 tokens: {bs:.0} µs/frame"
    );
}

/// The cached, windowed rows equal the last rows of a fresh, uncached wrap of everything, while
/// a reply streams, after it ends, across widths and across a new session.
#[test]
fn cached_rows_are_the_uncached_rows() {
    let mut app = App::new(&TuiOptions::default());
    app.apply(Msg::Resize(160, 48));
    let mut evs: Vec<Stamped> = demo_events(300, true);
    // A second session in the same app (a replay's backward step does this).
    evs.extend(demo_events(40, true));
    let check = |app: &App, w: usize, rows: usize| {
        let fresh = transcript_lines(&app.clone(), w);
        let want = &fresh[fresh.len().saturating_sub(rows)..];
        assert_eq!(
            transcript_tail(app, w, rows),
            want,
            "width {w}, {rows} rows"
        );
    };
    for (i, e) in evs.into_iter().enumerate() {
        let session = matches!(e.event, Event::Session { .. });
        app.apply(Msg::Stamped(e));
        if i % 7 == 0 || session {
            for w in [30, 71, 120] {
                check(&app, w, 10);
                check(&app, w, 1000);
            }
        }
    }
    assert!(!app.wrapped.is_empty());
    check(&app, 71, usize::MAX);
}
