//! What a TUI frame costs as the session grows: mean µs per full-screen draw of the demo
//! transcript with `NS` tokens (default 24, 2000, 20000) at 80×24 and 160×48, over `REPS` frames
//! (default 200). Print-only; `tests/tui_render_cost.rs` asserts that a long session draws about
//! as fast as a short one. `cargo bench --bench tui_frame_cost` (`NS=24,2000 REPS=50` to choose).

use cflow::tui::app::{App, Msg, TuiOptions};
use cflow::tui::fixture::demo_events;
use cflow::tui::screen;
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

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return; // `cargo test --benches` builds and starts this; only `cargo bench` measures.
    }
    let reps: u32 = std::env::var("REPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    let ns: Vec<u32> = std::env::var("NS")
        .ok()
        .map(|s| s.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or(vec![24, 2000, 20000]);
    for n in ns {
        for size in [(80, 24), (160, 48)] {
            let app = app_with(n, size);
            let mut term = Terminal::new(TestBackend::new(size.0, size.1)).expect("test backend");
            let t = Instant::now();
            for _ in 0..reps {
                term.draw(|f| screen::draw(f, &app)).expect("draw");
            }
            let us = t.elapsed().as_secs_f64() * 1e6 / reps.max(1) as f64;
            println!("{n} tokens {}x{}: {us:.0} µs/frame", size.0, size.1);
        }
    }
}
