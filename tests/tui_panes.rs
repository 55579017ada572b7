//! Snapshot tests of every TUI pane (and whole screens) rendered with ratatui's `TestBackend` at
//! 80×24 and 160×48 from recorded-style event sequences (`cflow::tui::fixture`): the demo MoE
//! model and a dense Llama-like chat model.

use cflow::telemetry::event::Stamped;
use cflow::tui::app::{Action, App, Msg, PaneId, TuiOptions};
use cflow::tui::fixture::{demo_events, dense_events};
use cflow::tui::screen;
use ratatui::backend::TestBackend;
use ratatui::style::Color;
use ratatui::Terminal;

const SIZES: [(u16, u16); 3] = [(80, 24), (100, 30), (160, 48)];

fn app_from(events: Vec<Stamped>, opts: TuiOptions, size: (u16, u16)) -> App {
    let mut app = App::new(&opts);
    app.apply(Msg::Resize(size.0, size.1));
    for e in events {
        app.apply(Msg::Stamped(e));
    }
    app
}

fn demo(size: (u16, u16)) -> App {
    app_from(demo_events(24, false), TuiOptions::default(), size)
}

fn dense(size: (u16, u16)) -> App {
    app_from(dense_events(), TuiOptions::default(), size)
}

fn render_pane(app: &App, pane: PaneId, (w, h): (u16, u16)) -> String {
    let mut term = Terminal::new(TestBackend::new(w, h)).unwrap();
    term.draw(|f| screen::render_pane(f, f.area(), app, pane))
        .unwrap();
    term.backend().to_string()
}

fn render_screen(app: &App, (w, h): (u16, u16)) -> String {
    let mut term = Terminal::new(TestBackend::new(w, h)).unwrap();
    term.draw(|f| screen::draw(f, app)).unwrap();
    term.backend().to_string()
}

fn pane_slug(p: PaneId) -> &'static str {
    match p {
        PaneId::Text => "text",
        PaneId::Streams => "streams",
        PaneId::Critical => "critical",
        PaneId::Routing => "routing",
        PaneId::Overlap => "overlap",
        PaneId::Timeline => "timeline",
        PaneId::Heatmap => "heatmap",
        PaneId::Roofline => "roofline",
        PaneId::Pmu => "pmu",
        PaneId::Ab => "ab",
    }
}

#[test]
fn every_pane_demo() {
    for size in SIZES {
        let app = demo(size);
        for pane in PaneId::ALL {
            let name = format!("demo_{}_{}x{}", pane_slug(pane), size.0, size.1);
            insta::assert_snapshot!(name, render_pane(&app, pane, size));
        }
    }
}

#[test]
fn every_pane_dense() {
    for size in SIZES {
        let app = dense(size);
        for pane in PaneId::ALL {
            let name = format!("dense_{}_{}x{}", pane_slug(pane), size.0, size.1);
            insta::assert_snapshot!(name, render_pane(&app, pane, size));
        }
    }
}

#[test]
fn full_screens() {
    for size in SIZES {
        insta::assert_snapshot!(
            format!("screen_demo_{}x{}", size.0, size.1),
            render_screen(&demo(size), size)
        );
        insta::assert_snapshot!(
            format!("screen_dense_{}x{}", size.0, size.1),
            render_screen(&dense(size), size)
        );
    }
}

#[test]
fn screen_states() {
    let size = (80, 24);
    // Tab to the critical pane in compact mode, then what-if δd+1.
    let mut app = app_from(demo_events(30, true), TuiOptions::default(), size);
    app.apply(Msg::Action(Action::WhatIf));
    app.apply(Msg::Action(Action::WhatIfDense(1)));
    insta::assert_snapshot!("state_whatif_80x24", render_screen(&app, size));

    // Help overlay at both sizes.
    for size in SIZES {
        let mut app = demo(size);
        app.apply(Msg::Action(Action::Help));
        insta::assert_snapshot!(
            format!("state_help_{}x{}", size.0, size.1),
            render_screen(&app, size)
        );
    }

    // Maximized routing pane, frozen, recording.
    let size = (160, 48);
    let mut app = app_from(
        demo_events(40, true),
        TuiOptions {
            recording: true,
            bandwidth: Some(cflow::tui::fixture::demo_bandwidth()),
            ..TuiOptions::default()
        },
        size,
    );
    for _ in 0..3 {
        app.apply(Msg::Action(Action::FocusNext));
    }
    app.apply(Msg::Action(Action::Maximize));
    app.apply(Msg::Action(Action::Freeze));
    insta::assert_snapshot!("state_max_routing_frozen_160x48", render_screen(&app, size));

    // Replay badge, paused, typed multi-line input elsewhere is not possible: replay hint.
    let mut app = app_from(
        demo_events(12, false),
        TuiOptions {
            replay: true,
            ..TuiOptions::default()
        },
        (80, 24),
    );
    app.apply(Msg::Action(Action::ReplayPause));
    app.apply(Msg::Action(Action::ReplaySpeed(1)));
    insta::assert_snapshot!("state_replay_80x24", render_screen(&app, (80, 24)));

    // Multi-line input and scrollback in the dense chat.
    let mut app = dense((80, 24));
    for c in "first line".chars() {
        app.apply(Msg::Action(Action::Insert(c)));
    }
    app.apply(Msg::Action(Action::Newline));
    for c in "second".chars() {
        app.apply(Msg::Action(Action::Insert(c)));
    }
    app.apply(Msg::Action(Action::ScrollUp(2)));
    insta::assert_snapshot!("state_input_scroll_80x24", render_screen(&app, (80, 24)));
}

#[test]
fn no_color_renders_same_text() {
    let size = (160, 48);
    let color = render_screen(&demo(size), size);
    let mono = render_screen(
        &app_from(
            demo_events(24, false),
            TuiOptions {
                theme: cflow::tui::Theme::mono(),
                ..TuiOptions::default()
            },
            size,
        ),
        size,
    );
    assert_eq!(color, mono);
    // Under NO_COLOR no cell carries a colour (foreground, background or underline), with every
    // overlay open too.
    let mut app = app_from(
        demo_events(24, false),
        TuiOptions {
            theme: cflow::tui::Theme::mono(),
            bandwidth: Some(cflow::tui::fixture::demo_bandwidth()),
            recording: true,
            ..TuiOptions::default()
        },
        size,
    );
    for overlay in [None, Some(Action::Help), Some(Action::ModelInfo)] {
        if let Some(a) = overlay {
            app.apply(Msg::Action(a));
        }
        for (w, h) in SIZES {
            let mut term = Terminal::new(TestBackend::new(w, h)).unwrap();
            term.draw(|f| screen::draw(f, &app)).unwrap();
            let buf = term.backend().buffer();
            for y in 0..h {
                for x in 0..w {
                    let c = &buf[(x, y)];
                    assert!(
                        c.fg == Color::Reset
                            && c.bg == Color::Reset
                            && c.underline_color == Color::Reset,
                        "cell ({x}, {y}) {:?} has a colour at {w}x{h} ({overlay:?})",
                        c.symbol()
                    );
                }
            }
        }
        if let Some(a) = overlay {
            app.apply(Msg::Action(a));
        }
    }
}

#[test]
fn critical_pane_labels_both_accountings() {
    let s = render_pane(&demo((160, 48)), PaneId::Critical, (160, 48));
    let line = |key: &str| s.lines().find(|l| l.contains(key)).expect(&s).to_string();
    // The paper's eq. 4.23 over every layer's weights (Table 4.1) ...
    let payload = line("payload  ");
    assert!(
        payload.contains("9.00 → 4.50 MiB/token, 2.00×"),
        "{payload}"
    );
    // ... and what is read: layer 0's zero-input dense FFN (δd = 1) is skipped.
    let read = line("payload read");
    assert!(read.contains("8.25 → 4.25 MiB/token, 1.94×"), "{read}");
    let scales = line("with scales ");
    assert!(scales.contains("9.29 → 4.79 MiB/token, 1.94×"), "{scales}");
    assert!(s.contains("ℓ<δd dense FFNs skipped"), "{s}");
    // The bars use the with-scales bytes (as Streams does): L0 reads its attention and experts
    // only (0.56 of 0.84 MiB), L1 0.84 of 1.69 MiB as stored.
    assert!(s.contains("undelayed (with scales)"), "{s}");
    assert!(s.contains("0.56/0.84") && s.contains("0.84/1.69"), "{s}");
}

#[test]
fn streams_counts_kv_reads_and_uses_the_ceiling_of_the_threads_in_use() {
    let app = app_from(
        demo_events(20, true),
        TuiOptions {
            bandwidth: Some(cflow::tui::fixture::demo_bandwidth()),
            ..TuiOptions::default()
        },
        (160, 48),
    );
    let last = app.view().last.clone().unwrap();
    // By hand: 6 layers × K and V × 512 dims × 4 B × (pos + 1) positions.
    let kv = 6 * 2 * 512 * 4 * (last.pos as u64 + 1);
    let s = render_pane(&app, PaneId::Streams, (160, 48));
    let want = format!("kv {:.2} (ctx {})", kv as f64 / 1048576.0, last.pos + 1);
    assert!(s.contains(&want), "{want}\n{s}");
    // Effective GB/s includes the KV bytes.
    let layers: u64 = last
        .layers
        .iter()
        .map(|l| l.bytes.attn + l.bytes.dense + l.bytes.experts)
        .sum();
    let gbs = (layers + kv + last.lm_head_bytes) as f64 / last.ns_total as f64;
    assert!(
        s.contains(&format!("{gbs:.1} GB/s effective, KV incl.")),
        "{gbs}\n{s}"
    );
    // The demo engine runs 2 threads: the 2-thread ceiling, with the probe's method.
    assert!(
        s.contains("of the 33.3 GB/s read ceiling (2 threads)"),
        "{s}"
    );
    assert!(
        s.contains("ceiling: 2 MiB pages (100%), read Σu64 over 1024 MiB, best of 5"),
        "{s}"
    );
    // The demo reads its weights through the page cache (4 KiB pages), the probe huge pages.
    assert!(
        s.contains("mmap'd weights (4 KiB pages) may not reach it"),
        "{s}"
    );
    // A resident model (huge pages, like the probe) gets no such note.
    let dense = app_from(
        dense_events(),
        TuiOptions {
            bandwidth: Some(cflow::tui::fixture::demo_bandwidth()),
            ..TuiOptions::default()
        },
        (160, 48),
    );
    let d = render_pane(&dense, PaneId::Streams, (160, 48));
    assert!(d.contains("GB/s read ceiling (2 threads)"), "{d}");
    assert!(!d.contains("mmap'd weights"), "{d}");
    // Per-layer attention / dense / expert ms beside the bytes.
    let l0 = &last.layers[0];
    let times = format!(
        "{:.2}  {:.2}  {:.2}",
        l0.ns_attn as f64 / 1e6,
        l0.ns_dense as f64 / 1e6,
        (l0.ns_router + l0.ns_experts) as f64 / 1e6
    );
    let row = s.lines().find(|l| l.contains("L0 ")).unwrap();
    assert!(row.contains(&times), "{times}\n{row}");
}

#[test]
fn help_overlay_has_every_entry_whole_at_160x48_and_80x24() {
    use cflow::tui::help::help_rows;
    let norm = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    // 160×48: everything at once.
    let mut app = demo((160, 48));
    app.apply(Msg::Action(Action::Help));
    let screen = norm(&render_screen(&app, (160, 48)));
    for (k, d) in help_rows() {
        assert!(screen.contains(&norm(&d)), "cut at 160x48: {k} {d}");
    }
    // 80×24: scrolling through shows every entry whole (descriptions wrap, never cut).
    let mut app = demo((80, 24));
    app.apply(Msg::Action(Action::Help));
    let mut seen = String::new();
    for _ in 0..40 {
        seen.push_str(&render_screen(&app, (80, 24)));
        app.apply(Msg::Action(Action::ScrollDown(3)));
    }
    // Joined wrapped lines: a description may continue on the next line.
    let joined = norm(
        &seen
            .lines()
            .map(|l| l.trim_matches(|c| c == '│' || c == '"' || c == ' '))
            .collect::<Vec<_>>()
            .join(" "),
    );
    for (k, d) in help_rows() {
        assert!(joined.contains(&norm(&d)), "cut at 80x24: {k} {d}");
    }
    assert!(app.show_help, "scrolling keeps the overlay open");
}

#[test]
fn overlays_at_every_size() {
    for size in SIZES {
        let mut app = demo(size);
        app.apply(Msg::Action(Action::Help));
        insta::assert_snapshot!(
            format!("overlay_help_{}x{}", size.0, size.1),
            render_screen(&app, size)
        );
        app.apply(Msg::Action(Action::Help));
        app.apply(Msg::Action(Action::ModelInfo));
        insta::assert_snapshot!(
            format!("overlay_info_{}x{}", size.0, size.1),
            render_screen(&app, size)
        );
    }
}

#[test]
fn dense_model_shrinks_routing_and_overlap_to_one_line() {
    let s = render_screen(&dense((160, 48)), (160, 48));
    assert!(s.contains("Routing · dense model: no experts"), "{s}");
    assert!(s.contains("Overlap · dense model: no expert I/O"), "{s}");
    assert!(!s.contains("Expert routing"), "{s}");
    assert!(s.contains("Timeline"), "{s}");
    // The MoE demo keeps both panes.
    let m = render_screen(&demo((160, 48)), (160, 48));
    assert!(
        m.contains("Expert routing") && m.contains("Overlap · staged vs sync"),
        "{m}"
    );
}

#[test]
fn pmu_pane_shows_per_phase_software_counters_and_the_reason_once() {
    use cflow::telemetry::event::Event;
    let mut app = demo((160, 48));
    // The engine's one-off notice about the missing PMU is not repeated elsewhere.
    app.apply(Msg::Event(Event::Notice {
        message: "PMU: perf_event_open: hardware events not supported (KVM guest without vPMU)"
            .into(),
    }));
    let s = render_screen(&app, (160, 48));
    assert_eq!(s.matches("hardware events not").count(), 1, "{s}");
    let p = render_pane(&app, PaneId::Pmu, (160, 48));
    for phase in ["attention", "dense", "experts", "lm_head"] {
        let row = p.lines().find(|l| l.contains(phase)).expect(phase);
        assert!(row.chars().any(|c| c.is_ascii_digit()), "{row}");
    }
    assert!(p.contains("task ms") && p.contains("faults"), "{p}");
}

/// Issue 43 §3: the engine's reason used to start with "no hardware PMU:" too, so the pane said
/// it twice; a trace recorded then still says it once.
#[test]
fn pmu_pane_says_no_hardware_pmu_once() {
    use cflow::telemetry::event::Event;
    let mut events = demo_events(3, true);
    for e in &mut events {
        if let Event::Stats(st) = &mut e.event {
            if let Some(p) = st.pmu.as_mut() {
                p.unavailable = Some(
                    "no hardware PMU: perf_event_open(L1-dcache-loads) failed: No such file or \
                     directory (virtual machines often expose no PMU; using software counters)"
                        .into(),
                );
            }
        }
    }
    let mut app = demo((160, 48));
    for e in events {
        app.apply(Msg::Event(e.event));
    }
    let p = render_pane(&app, PaneId::Pmu, (160, 48));
    assert_eq!(p.matches("no hardware PMU").count(), 1, "{p}");
}

#[test]
fn model_info_overlay_is_the_inspect_report() {
    use cflow::convert::generate::{generate, GenSpec};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.cflow");
    let mut spec = GenSpec::new("arch2_4_combined");
    spec.layers = Some(2);
    spec.hidden = Some(64);
    spec.heads = Some(4);
    spec.ffn = Some(128);
    spec.experts = Some(4);
    spec.expert_ffn = Some(64);
    spec.vocab = Some(130);
    generate(&spec, &path, |_, _| {}).unwrap();
    let f = cflow::format::CflowFile::open(&path).unwrap();
    let report = cflow::inspect::report(&f);
    let mut events = demo_events(2, true);
    if let cflow::telemetry::event::Event::Session { model, .. } = &mut events[0].event {
        model.inspect = Some(report.clone());
    }
    let mut app = app_from(events, TuiOptions::default(), (160, 48));
    app.apply(Msg::Action(Action::ModelInfo));
    let want: Vec<String> = cflow::inspect::render(&report)
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(cflow::tui::info::info_lines(&app), want);
    let s = render_screen(&app, (160, 48));
    assert!(s.contains("Model info"), "{s}");
    assert!(
        s.contains(&cflow::inspect::critical_path_line(&report["critical_path_mib"])[..60]),
        "{s}"
    );
    app.apply(Msg::Action(Action::Escape));
    assert!(!app.show_info);
}

#[test]
fn tiny_terminal_does_not_panic() {
    for (w, h) in [
        (1, 1),
        (10, 3),
        (20, 6),
        (40, 10),
        (60, 15),
        (119, 31),
        (300, 90),
    ] {
        let app = demo((w, h));
        let mut term = Terminal::new(TestBackend::new(w, h)).unwrap();
        term.draw(|f| screen::draw(f, &app)).unwrap();
        let mut app = app;
        app.apply(Msg::Action(Action::Help));
        term.draw(|f| screen::draw(f, &app)).unwrap();
        for pane in PaneId::ALL {
            term.draw(|f| screen::render_pane(f, f.area(), &app, pane))
                .unwrap();
        }
    }
}

/// Every pane from *recorded* data: the committed example traces (a live demo session with
/// toggles on the direct tier, and a SmolLM2 chat) replayed into the app.
#[test]
fn every_pane_from_recorded_traces() {
    for (slug, file) in [
        ("trace_demo", "traces/demo-toggles.trace.jsonl"),
        ("trace_smollm2", "traces/smollm2-chat.trace.jsonl"),
    ] {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/").to_string() + file;
        let r = cflow::telemetry::replay::Replay::open(&path).unwrap();
        for size in SIZES {
            let app = app_from(r.events.clone(), TuiOptions::default(), size);
            for pane in PaneId::ALL {
                let name = format!("{slug}_{}_{}x{}", pane_slug(pane), size.0, size.1);
                insta::assert_snapshot!(name, render_pane(&app, pane, size));
            }
        }
    }
}

#[test]
fn streams_lm_head_time_is_the_lm_head_phase_not_the_whole_token() {
    // The fixture's lm head takes 1.90 ms of a much longer token.
    let app = demo((160, 48));
    let last = app.view().last.clone().unwrap();
    assert_eq!(last.ns_lm_head, 1_900_000);
    assert!(last.ns_total > 2 * last.ns_lm_head);
    let s = render_pane(&app, PaneId::Streams, (160, 48));
    let line = s.lines().find(|l| l.contains("lm head")).unwrap();
    assert!(line.contains("1.90 ms this token"), "{line}");
}

#[test]
fn streams_shows_the_lm_head_share_of_the_token_on_one_bar() {
    let app = app_from(demo_events(20, true), TuiOptions::default(), (160, 48));
    let last = app.view().last.clone().unwrap();
    let layers: u64 = last
        .layers
        .iter()
        .map(|l| l.bytes.attn + l.bytes.dense + l.bytes.experts)
        .sum();
    let kv = 6 * 2 * 512 * 4 * (last.pos as u64 + 1);
    let total = layers + kv + last.lm_head_bytes;
    let pct = 100.0 * last.lm_head_bytes as f64 / total as f64;
    let s = render_pane(&app, PaneId::Streams, (160, 48));
    let want = format!("({pct:.0}% of the token)");
    assert!(s.contains(&want), "{want}\n{s}");
    // The share bar gives the LM head its fraction of the bar's cells (±1 for rounding).
    let bar = s
        .lines()
        .find(|l| l.contains("token ■") || l.contains("token █"))
        .expect(&s);
    let cells = bar.chars().filter(|&c| c == '■').count() as f64;
    let width = bar.chars().filter(|c| "█▓▒░■".contains(*c)).count() as f64;
    assert!(
        (cells / width * 100.0 - pct).abs() < 100.0 / width + 1.0,
        "{cells} of {width} cells for {pct:.1}%\n{bar}"
    );
}

#[test]
fn overlap_hint_names_the_key_that_works_on_this_tier() {
    use cflow::telemetry::event::Event;
    // The demo fixture runs on the direct tier: `s` switches the arms there.
    let app = demo((160, 48));
    let s = render_pane(&app, PaneId::Overlap, (160, 48));
    assert!(s.contains("window (staged)"), "{s}");
    assert!(s.contains("this token"), "{s}");
    // On the mmap tier, `s` does nothing: the hint must name `t`.
    // One token: only one arm has a sample, so no measured ratio yet.
    let mut events = demo_events(1, false);
    for e in events.iter_mut() {
        match &mut e.event {
            Event::Session { config, .. } | Event::Config(config) => {
                config.expert_tier = cflow::engine::ExpertTier::Mmap
            }
            _ => {}
        }
    }
    let app = app_from(events, TuiOptions::default(), (160, 48));
    let s = render_pane(&app, PaneId::Overlap, (160, 48));
    assert!(s.contains("net measured —"), "{s}");
    assert!(s.contains("press t for the direct tier"), "{s}");
    assert!(!s.contains("press s for both arms"), "{s}");
    let s = render_pane(&app, PaneId::Streams, (160, 48));
    assert!(s.contains("injection layer"), "{s}");
}

#[test]
fn replay_badge_shows_the_speed_it_was_started_with() {
    let opts = TuiOptions {
        replay: true,
        replay_speed: 4.0,
        ..TuiOptions::default()
    };
    let app = app_from(demo_events(3, false), opts, (160, 48));
    let s = render_screen(&app, (160, 48));
    let top = s.lines().next().unwrap();
    assert!(
        top.contains(&format!("REPLAY ▶ {}", cflow::tui::app::fmt_speed(4.0))),
        "{top}"
    );
    assert!(!top.contains(" 1× "), "{top}");
    // The footer offers the replay controls, not the live toggles.
    let foot: Vec<&str> = s.lines().rev().take(2).collect();
    let foot = foot.join("\n");
    assert!(
        foot.contains("pause") && !foot.contains("prefetch"),
        "{foot}"
    );
}

/// The A/B pane as a controlled experiment at 80×24, 100×30 and 160×48: a synthetic stream with
/// a 20% prefetch effect (a manual toggle, then interleaved blocks) with A/B auto running, alone
/// and in the whole screen (compact layouts show it beside the text once it has focus).
#[test]
fn ab_pane_controlled_experiment() {
    use cflow::tui::fixture::ab_events;
    for size in [(80, 24), (100, 30), (160, 48)] {
        let mut events = ab_events(1.2, 240);
        // Leave the last block unfinished so the auto state is mid-run.
        let tail = events.split_off(events.len() - 6);
        let mut app = app_from(events, TuiOptions::default(), size);
        app.apply(Msg::Action(Action::AbAuto));
        for e in tail {
            app.apply(Msg::Stamped(e));
        }
        app.apply(Msg::Action(Action::FocusPrev));
        let name = format!("ab_experiment_{}x{}", size.0, size.1);
        insta::assert_snapshot!(name.clone(), render_pane(&app, PaneId::Ab, size));
        insta::assert_snapshot!(format!("{name}_screen"), render_screen(&app, size));
    }
}

/// The Routing pane's prefetch line: the measured hit rate over the window (hinted next-layer
/// experts that layer routed) and the dropped hint commands, next to ℓ→ℓ+1 overlap.
#[test]
fn routing_pane_shows_prefetch_hit_rate_and_drops() {
    use cflow::telemetry::event::{Event, PrefetchStat};
    let events: Vec<Stamped> = demo_events(24, false)
        .into_iter()
        .map(|mut e| {
            if let Event::Stats(s) = &mut e.event {
                s.prefetch = Some(PrefetchStat {
                    sent: 17,
                    dropped: (s.index % 4 == 0) as u32,
                    predicted: 10,
                    hits: 4,
                    ..Default::default()
                });
            }
            e
        })
        .collect();
    for size in SIZES {
        let app = app_from(events.clone(), TuiOptions::default(), size);
        let s = render_pane(&app, PaneId::Routing, size);
        // 24 tokens: 96 of 240 predictions hit; 6 of 24 tokens dropped one of 18 commands.
        assert!(
            s.contains("prefetch hit 40% of 240 · dropped 6/414 hints"),
            "{s}"
        );
        insta::assert_snapshot!(format!("routing_prefetch_{}x{}", size.0, size.1), s);
    }
    let s = render_pane(&demo((80, 24)), PaneId::Routing, (80, 24));
    assert!(s.contains("prefetch hit — (prefetch off)"), "{s}");
}

/// The column (in cells) where `needle`'s first occurrence at or after column `from` ends.
fn col_end(line: &str, needle: &str, from: usize) -> Option<usize> {
    let chars: Vec<char> = line.chars().collect();
    let n: Vec<char> = needle.chars().collect();
    (from..chars.len().saturating_sub(n.len() - 1))
        .find(|&i| chars[i..i + n.len()] == n[..])
        .map(|i| i + n.len())
}

#[test]
fn streams_and_critical_column_heads_sit_over_their_columns() {
    // Issue 43 §3: `ms` sat over the Streams pane's MiB column, which had no head; the
    // Critical path's measured-ms head disappeared in the full layout (≤ 160 columns).
    for size in SIZES {
        let app = demo(size);
        for (what, s) in [
            ("pane", render_pane(&app, PaneId::Streams, size)),
            ("screen", render_screen(&app, size)),
        ] {
            let Some(head) = s.lines().find(|l| {
                l.contains("MiB")
                    && !l.contains("Streams")
                    && !l.contains("MiB/token")
                    && !l.contains("MiB (")
            }) else {
                // The pane is not on this screen size's default layout.
                assert!(what == "screen" && !s.contains("Streams"), "{s}");
                continue;
            };
            // The Streams pane's columns start after the Text pane on a screen.
            let start = if what == "screen" {
                col_end(head, "┃│", 0).unwrap_or(0)
            } else {
                0
            };
            // Layer 1's row (its MiB are 3.21; on a screen the Critical pane's L1 is a row up).
            let row = s.lines().find(|l| l.contains("3.21")).unwrap();
            let from = col_end(row, "L1 ", start).unwrap();
            let mib_head = col_end(head, "MiB  attn", start)
                .map(|c| c - 6)
                .or_else(|| col_end(head, "MiB", start));
            assert_eq!(
                mib_head,
                col_end(row, "3.21", from),
                "MiB head over the MiB column ({what} {size:?}):\n{s}"
            );
            if head.contains("attn dense   exp") {
                let dense = col_end(head, "attn dense", start).unwrap();
                // Layer 1's expert ms: the third figure after its MiB.
                let exp_ms = row.split("3.21").nth(1).unwrap().split_whitespace().nth(2);
                let exp_ms = exp_ms.map(|m| {
                    m.split(|c: char| !(c.is_ascii_digit() || c == '.'))
                        .next()
                        .unwrap_or(m)
                });
                let after_mib = col_end(row, "3.21", from).unwrap();
                assert_eq!(
                    col_end(head, "exp", dense),
                    col_end(row, exp_ms.unwrap(), after_mib),
                    "exp head over the expert ms column ({what} {size:?}):\n{s}"
                );
            }
        }
        // Critical path: the measured column keeps its head, right over it.
        for (what, s) in [
            ("pane", render_pane(&app, PaneId::Critical, size)),
            ("screen", render_screen(&app, size)),
        ] {
            // (The compact layout's strip names the pane without showing it.)
            if !s.contains("undel") {
                continue;
            }
            let head = s
                .lines()
                .find(|l| l.contains("undel") && l.contains("δe=2"))
                .unwrap();
            let from = col_end(head, "δe=2", 0).unwrap();
            let row = s.lines().find(|l| l.contains("0.84/1.69")).unwrap();
            let num = col_end(row, "0.84/1.69", 0).unwrap();
            // Layer 1's measured ms: the figure after its MiB pair.
            let ms = row
                .split("0.84/1.69")
                .nth(1)
                .unwrap()
                .split_whitespace()
                .next();
            let ms = ms.map(|m| {
                m.split(|c: char| !(c.is_ascii_digit() || c == '.'))
                    .next()
                    .unwrap_or(m)
            });
            assert_eq!(
                col_end(head, "ms", from),
                col_end(row, ms.unwrap(), num),
                "ms head over the measured column ({what} {size:?}):\n{s}"
            );
        }
    }
}

#[test]
fn pmu_pane_is_titled_by_what_it_shows() {
    // Issue 43 §3: titled "L1-d per phase" while it showed task ms · faults · ctx-sw.
    for size in SIZES {
        let s = render_pane(&demo(size), PaneId::Pmu, size);
        let title = s.lines().next().unwrap();
        assert!(!title.contains("L1-d"), "{title}");
        assert!(title.contains("Software counters · per phase"), "{title}");
        assert!(s.contains("task ms") && s.contains("ctx-sw"), "{s}");
    }
}

#[test]
fn header_shows_the_mix_of_weight_types_not_the_first() {
    // Issue 43 §3: a Q4_K_M file (Q5_0, Q4_K, Q6_K and Q8_0 matrices) was shown as `Q5_0`.
    use cflow::telemetry::event::Event;
    let with = |inspect: Option<serde_json::Value>, types: &[&str], size: (u16, u16)| {
        let mut events = dense_events();
        if let Event::Session { model, .. } = &mut events[0].event {
            model.quant_types = types.iter().map(|s| s.to_string()).collect();
            model.inspect = inspect;
        }
        let app = app_from(events, TuiOptions::default(), size);
        render_screen(&app, size)
            .lines()
            .next()
            .unwrap()
            .to_string()
    };
    let report = serde_json::json!({"quant_mix": {
        "file_type": "Q4_K_M",
        "matrices": [
            {"quant": "Q5_0", "count": 81}, {"quant": "Q4_K", "count": 27},
            {"quant": "Q6_K", "count": 10}, {"quant": "Q8_0", "count": 1}
        ],
        "label": "Q4_K_M mix: Q5_0 ×81 · Q4_K ×27 · Q6_K ×10 · Q8_0 ×1"
    }});
    let types = ["Q5_0", "Q4_K", "Q6_K", "Q8_0"];
    let wide = with(Some(report.clone()), &types, (160, 48));
    assert!(
        wide.contains("Q4_K_M mix: Q5_0 ×81 · Q4_K ×27 · Q6_K ×10 · Q8_0 ×1"),
        "{wide}"
    );
    for size in [(100, 30), (80, 24)] {
        let h = with(Some(report.clone()), &types, size);
        assert!(
            !h.contains("· Q5_0 ") && !h.contains("· Q5_0│"),
            "{size:?}: {h}"
        );
        // An older trace (no inspect report): the type names, or how many, never just one.
        let old = with(None, &types, size);
        assert!(
            !old.contains("· Q5_0 │") && !old.ends_with("· Q5_0"),
            "{size:?}: {old}"
        );
    }
    let old = with(None, &types, (160, 48));
    assert!(old.contains("Q5_0/Q4_K/Q6_K/Q8_0"), "{old}");
}

#[test]
fn contention_and_the_prefetch_core_are_shown() {
    // Issue 43 §3: the prefetch thread takes one of the two cores; the A/B pane and the header
    // must say so, and the status bar shows the machine's contention.
    use cflow::telemetry::contention::Contention;
    use cflow::telemetry::event::Event;
    let size = (160, 48);
    let mut app = app_from(demo_events(24, false), TuiOptions::default(), size);
    let mut cfg = cflow::tui::fixture::demo_config(cflow::engine::FetchMode::Sync);
    cfg.prefetch = true;
    app.apply(Msg::Event(Event::Config(cfg)));
    let before = render_screen(&app, size);
    assert!(!before.contains("shares a core"), "unknown CPUs: no claim");
    app.apply(Msg::Contention(Contention {
        run_queue: 5,
        cpus: 2,
        steal_pct: 3.0,
        load1: 5.2,
        others_busy_cpus: 1.4,
    }));
    let s = render_screen(&app, size);
    let header = s.lines().next().unwrap();
    assert!(header.contains("prefetch ON (shares a core)"), "{header}");
    let ab = render_pane(&app, PaneId::Ab, size);
    assert!(
        ab.contains("its thread shares a core with the 2 compute threads (2 CPUs)"),
        "{ab}"
    );
    let footer = s.lines().nth(s.lines().count() - 2).unwrap();
    assert!(
        footer.contains("run-queue 5/2 CPUs · steal 3% · load 5.2"),
        "{footer}\n{s}"
    );
    // One thread per CPU left for prefetch: no note.
    app.apply(Msg::Contention(Contention {
        run_queue: 1,
        cpus: 4,
        ..Default::default()
    }));
    assert!(!render_screen(&app, size).contains("shares a core"));
}

/// The Overlap pane shows this token's disk read rate and, with the expert cache on, its hits
/// out of the regions the token selected and the capacity (measured, from `expert_cache`).
#[test]
fn overlap_pane_shows_disk_rate_and_expert_cache_hits() {
    use cflow::telemetry::event::Event;
    let mut events = demo_events(24, false);
    for e in events.iter_mut() {
        if let Event::Stats(s) = &mut e.event {
            s.expert_cache = Some(cflow::telemetry::ExpertCacheStat {
                hits: 3,
                misses: 5,
                capacity_bytes: 64 << 20,
                cached_bytes: 10 << 20,
            });
        }
    }
    let app = app_from(events, TuiOptions::default(), (160, 48));
    let s = render_pane(&app, PaneId::Overlap, (80, 24));
    assert!(s.contains("cache 38% hits (3/8) of 64 MiB"), "{s}");
    assert!(s.contains("disk ") && s.contains(" MB/s ("), "{s}");
    // Without the cache the pane says it is off.
    let s = render_pane(&demo((160, 48)), PaneId::Overlap, (80, 24));
    assert!(s.contains("cache off"), "{s}");
}

/// On the direct tier the Streams pane gives each layer's wait for its expert reads a column
/// (when there is room) and a line with the token's disk read rate, total wait and cache hits;
/// where there is no room for the column the line stays.
#[test]
fn streams_pane_shows_disk_rate_and_waits_on_the_direct_tier() {
    use cflow::telemetry::event::Event;
    let mut events = demo_events(24, false);
    for e in events.iter_mut() {
        if let Event::Stats(s) = &mut e.event {
            s.expert_cache = Some(cflow::telemetry::ExpertCacheStat {
                hits: 1,
                misses: 3,
                capacity_bytes: 64 << 20,
                cached_bytes: 10 << 20,
            });
        }
    }
    let app = app_from(events, TuiOptions::default(), (160, 48));
    let wide = render_pane(&app, PaneId::Streams, (110, 40));
    assert!(wide.contains(" wait"), "{wide}");
    assert!(
        wide.contains("disk ") && wide.contains(" MB/s · waited "),
        "{wide}"
    );
    assert!(wide.contains("cache 25% hits"), "{wide}");
    let narrow = render_pane(&app, PaneId::Streams, (60, 40));
    assert!(!narrow.contains(" wait "), "{narrow}");
    assert!(narrow.contains("disk "), "{narrow}");
}

/// The rows of a TestBackend capture, without the quotes.
fn rows(capture: &str) -> Vec<String> {
    capture
        .lines()
        .map(|l| l.trim_matches('"').to_string())
        .collect()
}

/// Rows of `pane` rendered at `size` that are cut off: the same row rendered 60 columns wider
/// continues past where the narrow one hits its right border. Titles: a FROZEN badge shown
/// wide must be shown narrow.
fn cut_rows(app: &App, pane: PaneId, (w, h): (u16, u16)) -> Vec<String> {
    let narrow = rows(&render_pane(app, pane, (w, h)));
    let wide = rows(&render_pane(app, pane, (w + 60, h)));
    let inner = w as usize - 2;
    let mut cut = Vec::new();
    let last = narrow.len().saturating_sub(1);
    for (r, (n, wd)) in narrow.iter().zip(&wide).enumerate().take(last) {
        if r == 0 {
            if wd.contains("FROZEN") && !n.contains("FROZEN") {
                cut.push(format!("title: {n}"));
            }
            continue;
        }
        let n_in: String = n.chars().skip(1).take(inner).collect();
        let w_in: String = wd.chars().skip(1).take(inner + 60).collect();
        let (n_t, w_t) = (n_in.trim_end(), w_in.trim_end());
        if n_t.chars().count() == inner && w_t.len() > n_t.len() && w_t.starts_with(n_t) {
            cut.push(format!("{pane:?} row {r}: {n_t}  (wide: {w_t})"));
        }
    }
    cut
}

/// Issue 43 §4: at 160×48, the full layout, no pane cuts a line, a title or the FROZEN badge
/// off — checked on the sizes the panes have there (the middle and right columns are 48 wide,
/// the left one 64), in the states that made the longest lines (staged fetch, expert cache,
/// bandwidth probe known, frozen, focused).
#[test]
fn nothing_is_cut_off_at_160x48() {
    use cflow::telemetry::event::Event;
    let mut events = demo_events(40, true);
    for e in events.iter_mut() {
        if let Event::Stats(s) = &mut e.event {
            s.expert_cache = Some(cflow::telemetry::ExpertCacheStat {
                hits: 3,
                misses: 5,
                capacity_bytes: 64 << 20,
                cached_bytes: 10 << 20,
            });
        }
    }
    let mut found = Vec::new();
    for bandwidth in [None, Some(cflow::tui::fixture::demo_bandwidth())] {
        for staged in [false, true] {
            let mut app = app_from(
                events.clone(),
                TuiOptions {
                    bandwidth: bandwidth.clone(),
                    ..TuiOptions::default()
                },
                (160, 48),
            );
            if staged {
                app.apply(Msg::Event(Event::Config(cflow::tui::fixture::demo_config(
                    cflow::engine::FetchMode::Staged,
                ))));
            }
            app.apply(Msg::Action(Action::Freeze));
            for focus in PaneId::ALL {
                app.focus = focus;
                for (pane, size) in [
                    (PaneId::Streams, (48, 22)),
                    (PaneId::Overlap, (48, 22)),
                    (PaneId::Critical, (48, 22)),
                    (PaneId::Routing, (48, 22)),
                    (PaneId::Pmu, (64, 9)),
                    (PaneId::Ab, (64, 8)),
                ] {
                    found.extend(cut_rows(&app, pane, size));
                }
            }
        }
    }
    found.dedup();
    assert!(found.is_empty(), "cut off at 160x48:\n{}", found.join("\n"));
}

/// Issue 43 §4: the Ctrl+S message (a long path, twice) is not cut off in the footer at 160×48,
/// even with the contention figures on the metrics line.
#[test]
fn ctrl_s_message_is_whole_at_160x48() {
    use cflow::telemetry::contention::Contention;
    use cflow::telemetry::event::Event;
    let size = (160, 48);
    let mut app = demo(size);
    app.apply(Msg::Contention(Contention {
        run_queue: 5,
        cpus: 2,
        steal_pct: 3.0,
        load1: 5.2,
        others_busy_cpus: 1.4,
    }));
    let path = "./cflow-transcript-2026-12-04T20-03-30-123456.md";
    let message =
        format!("transcript saved to {path} (continue it: cflow-tui MODEL --transcript {path})");
    app.apply(Msg::Event(Event::Notice {
        message: message.clone(),
    }));
    let s = render_screen(&app, size);
    let r = rows(&s);
    let footer = format!("{} {}", r[r.len() - 2].trim(), r[r.len() - 1].trim());
    assert!(footer.contains(&message), "{footer}\n{s}");
    // An even longer one wraps onto the hints line rather than being cut.
    let long = format!("{message} and a few more words that make it longer than one line");
    app.apply(Msg::Event(Event::Notice {
        message: long.clone(),
    }));
    let s = render_screen(&app, size);
    let r = rows(&s);
    let footer = format!("{} {}", r[r.len() - 2].trim(), r[r.len() - 1].trim());
    assert!(footer.contains(&long), "{footer}\n{s}");
}

/// Issue 43 §4: at 100×30 (the compact layout) the panes that are not shown are named, with the
/// keys that show (Tab) and zoom (z) them.
#[test]
fn compact_layout_names_the_hidden_panes_at_100x30() {
    for app in [demo((100, 30)), dense((100, 30))] {
        let s = render_screen(&app, (100, 30));
        for p in PaneId::ALL {
            assert!(s.contains(p.name()), "{} not named:\n{s}", p.name());
        }
        assert!(s.contains("Tab ▸") && s.contains("z zoom"), "{s}");
    }
    insta::assert_snapshot!(
        "compact_strip_100x30",
        render_screen(&demo((100, 30)), (100, 30))
    );
}

/// Issue 43 §5: the views over time — the Timeline (ms/token and GB/s, panned, zoomed), the
/// Heatmap (ms, bytes, expert ids) and the Roofline (with the measured ceiling) — as panes and
/// in the slot under the Text pane at 160×48.
#[test]
fn views_over_time() {
    let opts = TuiOptions {
        bandwidth: Some(cflow::tui::fixture::demo_bandwidth()),
        ..TuiOptions::default()
    };
    let size = (100, 30);
    let mut app = app_from(demo_events(300, true), opts.clone(), (160, 48));
    let pane = |app: &App, p: PaneId| render_pane(app, p, (100, 14));
    insta::assert_snapshot!("view_timeline_ms_live", pane(&app, PaneId::Timeline));
    app.apply(Msg::Action(Action::TimelineMetric));
    insta::assert_snapshot!("view_timeline_gbs_live", pane(&app, PaneId::Timeline));
    app.apply(Msg::Action(Action::TimelineMetric));
    app.apply(Msg::Action(Action::TimelineZoom(-1)));
    app.apply(Msg::Action(Action::TimelinePan(-1)));
    let s = pane(&app, PaneId::Timeline);
    assert!(s.contains("2 tok/col") && s.contains("32 tok back"), "{s}");
    insta::assert_snapshot!("view_timeline_zoom2_panned", s);
    // At 4 tokens per column the whole run fits: the pan clamps to live.
    app.apply(Msg::Action(Action::TimelineZoom(-1)));
    let s = pane(&app, PaneId::Timeline);
    assert!(s.contains("tok 0–299 · 4 tok/col · live"), "{s}");
    app.apply(Msg::Action(Action::TimelineLive));
    app.apply(Msg::Action(Action::TimelineZoom(1)));
    app.apply(Msg::Action(Action::TimelineZoom(1)));
    for (name, n) in [("ms", 0), ("bytes", 1), ("experts", 2)] {
        let mut a = app.clone();
        for _ in 0..n {
            a.apply(Msg::Action(Action::HeatMetric));
        }
        insta::assert_snapshot!(format!("view_heatmap_{name}"), pane(&a, PaneId::Heatmap));
    }
    let r = pane(&app, PaneId::Roofline);
    assert!(r.contains("measured") && r.contains("modelled"), "{r}");
    insta::assert_snapshot!("view_roofline", r);
    // Dense model: no experts phase, Heatmap cycles ms → bytes → ms.
    let mut d = app_from(dense_events(), opts, size);
    insta::assert_snapshot!("view_roofline_dense", pane(&d, PaneId::Roofline));
    d.apply(Msg::Action(Action::HeatMetric));
    d.apply(Msg::Action(Action::HeatMetric));
    assert_eq!(d.heat_metric, cflow::tui::app::HeatMetric::Ms);
    // In the slot under the Text pane: c cycles Timeline → Heatmap → Roofline.
    let mut full = app.clone();
    for (slug, view) in [("heatmap", PaneId::Heatmap), ("roofline", PaneId::Roofline)] {
        full.apply(Msg::Action(Action::CycleView));
        assert_eq!(full.time_view, view);
        insta::assert_snapshot!(
            format!("view_slot_{slug}_160x48"),
            render_screen(&full, (160, 48))
        );
    }
    full.apply(Msg::Action(Action::CycleView));
    assert_eq!(full.time_view, PaneId::Timeline);
    // Tab reaches the views; z zooms the focused one.
    let mut z = app.clone();
    while z.focus != PaneId::Roofline {
        z.apply(Msg::Action(Action::FocusNext));
    }
    assert_eq!(z.time_view, PaneId::Roofline);
    z.apply(Msg::Action(Action::Maximize));
    let s = render_screen(&z, (100, 30));
    assert!(s.contains("Roofline") && s.contains("read ceiling"), "{s}");
}

/// The views on an empty session, zero tokens and tiny areas do not panic.
#[test]
fn views_without_data_or_room() {
    let empty = App::default();
    let one = app_from(demo_events(1, false), TuiOptions::default(), (80, 24));
    for app in [&empty, &one] {
        for p in [PaneId::Timeline, PaneId::Heatmap, PaneId::Roofline] {
            for size in [(1, 1), (8, 3), (20, 5), (30, 4), (200, 60)] {
                let _ = render_pane(app, p, size);
            }
        }
    }
    assert!(render_pane(&empty, PaneId::Timeline, (60, 6)).contains("waiting"));
}

/// The input cursor sits at the display column of the character it is before: a wide (CJK)
/// character takes two cells, and a wrapped line puts the cursor on the row that holds it.
#[test]
fn input_cursor_counts_display_width() {
    let cursor_after = |text: &str, w: u16| {
        let mut app = demo((w, 24));
        app.focus = PaneId::Text;
        app.input_focused = true;
        for c in text.chars() {
            app.apply(Msg::Action(Action::Insert(c)));
        }
        let mut term = Terminal::new(TestBackend::new(w, 24)).unwrap();
        term.draw(|f| screen::render_pane(f, f.area(), &app, PaneId::Text))
            .unwrap();
        let screen = term.backend().to_string();
        let p = term.get_cursor_position().unwrap();
        (p.x, p.y, screen)
    };
    let (x_ascii, y_ascii, _) = cursor_after("abc", 80);
    let (x_wide, y_wide, screen) = cursor_after("日本語", 80);
    assert_eq!(y_ascii, y_wide);
    // Three two-cell characters put the cursor three cells further right than three ASCII ones.
    assert_eq!(x_wide, x_ascii + 3, "{screen}");
    // Wrapped: a 24-column pane's input row holds 10 wide characters (20 cells after the
    // prompt), so after 15 of them the cursor is 5 characters into the second row: the column
    // it has after 5 on one row.
    let (x_five, _, _) = cursor_after(&"語".repeat(5), 24);
    let (x_fifteen, _, screen) = cursor_after(&"語".repeat(15), 24);
    assert_eq!(x_fifteen, x_five, "{screen}");
    assert_eq!(x_five, 1 + 2 + 10, "{screen}");
}
