//! End-to-end: drives the real binary in tmux (send-keys / capture-pane). Opens the demo model,
//! types a prompt, waits for tokens, presses p, s, l, ?, z and quits; checks the screen at each
//! step and that the terminal is restored. Then replays the recorded trace.
//! SKIPs when tmux is not installed (`.ci/run` installs it).

mod common;

use common::tmux::Tmux;
use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn demo_session_and_replay_in_tmux() {
    if !common::have_tmux() {
        return;
    }
    let bin = env!("CARGO_BIN_EXE_cflow-tui");
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let trace = dir.path().join("demo.trace.jsonl");
    let cmd = format!(
        "CFLOW_CACHE={} {bin} --record {} --max-tokens 40; echo EXITED $?; sleep 60",
        cache.display(),
        trace.display()
    );
    let t = Tmux::start("cflow-e2e", &cmd, 160, 48);
    // The panes appear first; the engine's Session event (model summary, banner) follows.
    let s = t.wait(90, "the TUI with the demo model", |s| {
        s.contains("Text") && s.contains("Streams") && s.contains("synthetic")
    });
    for title in ["Critical path", "Expert routing", "PMU", "Overlap", "A/B"] {
        assert!(s.contains(title), "missing pane {title}:\n{s}");
    }
    assert!(s.contains("synthetic"), "demo banner missing:\n{s}");
    // Issue 16 item 8 / first launch: the bandwidth probe runs in the background once the UI is
    // up (it used to hold the UI back for seconds), then lands in the saved machine profile.
    t.wait(30, "the probe under way", |s| s.contains("measuring…"));
    let profile = || {
        std::fs::read_dir(&cache)
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .any(|e| e.file_name().to_string_lossy().starts_with("machine-"))
            })
            .unwrap_or(false)
    };
    let t0 = Instant::now();
    while !profile() {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "no machine profile saved in {}",
            cache.display()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    t.wait(30, "the probe's end", |s| !s.contains("measuring…"));
    t.literal("Once upon a time");
    t.keys(&["Enter"]);
    let s = t.wait(90, "tokens", |s| {
        s.contains("model ") && s.contains("token #")
    });
    assert!(s.contains("you   Once upon a time"), "{s}");
    // Leave the input box, then toggles.
    t.keys(&["Tab"]);
    // The header shows the toggles in its long form (`prefetch ON │ fetch SYNC │ layout …`) or,
    // when the line is full (say "ON (shares a core)" on a busy 2-CPU machine), in its compact
    // form (`pf ON · sync · rowmajor · …`): match the header line in either.
    let header = |s: &str| s.lines().next().unwrap_or("").to_owned();
    let shows = |s: &str, long: &str, short: &str| {
        let h = header(s);
        h.contains(long) || h.contains(short)
    };
    assert!(
        shows(&s, "prefetch OFF", "pf OFF") && shows(&s, "fetch STAGED", " · staged"),
        "{s}"
    );
    t.keys(&["p"]);
    t.wait(10, "prefetch ON in the header", |s| {
        shows(s, "prefetch ON", "pf ON")
    });
    t.keys(&["s"]);
    t.wait(10, "fetch SYNC in the header", |s| {
        shows(s, "fetch SYNC", " · sync")
    });
    t.keys(&["l"]);
    t.wait(10, "layout rowmajor in the header", |s| {
        shows(s, "layout rowmajor", " · rowmajor · ")
    });
    t.keys(&["?"]);
    t.wait(10, "help overlay", |s| s.contains("Esc or ? closes"));
    t.keys(&["Escape"]);
    t.wait(10, "help overlay closed", |s| {
        !s.contains("Esc or ? closes")
    });
    t.keys(&["z"]);
    let s = t.wait(10, "maximized pane", |s| {
        !(s.contains("Expert routing") && s.contains("Critical path"))
    });
    assert!(!s.is_empty());
    t.keys(&["z"]);
    t.keys(&["q"]);
    let s = t.wait(30, "exit", |s| s.contains("EXITED 0"));
    // The alternate screen is gone: no pane borders remain.
    assert!(!s.contains("Streams · MiB"), "terminal not restored:\n{s}");
    drop(t);

    // Replay the recorded trace.
    assert!(trace.exists());
    let cmd = format!("{bin} replay {}; echo EXITED $?; sleep 60", trace.display());
    let t = Tmux::start("cflow-e2e-replay", &cmd, 120, 40);
    t.wait(30, "replay", |s| s.contains("REPLAY") && s.contains("Text"));
    // Played at the recorded pace: the prompt comes when it was typed. Its 40-token reply
    // follows within ~0.2 s and, wrapped in the 120-column layout's narrower Text pane, can
    // scroll the prompt line out of view between two looks at the screen; the reply's summary
    // line (`prompt 4 tok · …`) stays, and also shows that the prompt was replayed.
    t.wait(30, "the replayed prompt", |s| {
        s.contains("Once upon a time") || s.contains("prompt 4 tok")
    });
    // At the end the player stays: ← steps back from the last token and t= moves.
    let s = t.wait(30, "the end of the trace", |s| s.contains("end of trace"));
    let clock = |s: &str| {
        s.lines()
            .next()
            .and_then(|l| l.split("t=").nth(1))
            .and_then(|r| r.split('s').next())
            .map(str::to_owned)
    };
    let t_end = clock(&s).expect("t= in the title");
    t.keys(&["Left"]);
    t.wait(10, "t= to move back after ←", |s| {
        clock(s).is_some_and(|c| c != t_end) && s.contains("⏸")
    });
    t.keys(&["Space"]);
    t.keys(&["q"]);
    t.wait(30, "replay exit", |s| s.contains("EXITED 0"));
}

/// Issue 16 item 2 and A/B auto: `r` pressed mid-session records a trace that replays alone
/// (session, toggles and context position restored), and A/B auto on prefetch produces a ratio
/// with its interval.
#[test]
fn record_mid_session_then_replay_it_and_ab_auto_gives_an_interval_in_tmux() {
    if !common::have_tmux() {
        return;
    }
    let bin = env!("CARGO_BIN_EXE_cflow-tui");
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    // 900 tokens per reply (two fit the demo's 2,048 positions): A/B auto needs six arm turns
    // in the second reply, and a turn waits for its switch to show on a frame. At ~580 tok/s
    // (the demo on Zen 4) 400 tokens were ~20 frames, and once, with the machine loaded, only
    // two blocks per arm before the reply ended.
    let cmd = format!(
        "cd {} && CFLOW_CACHE={} {bin} --max-tokens 900 --no-pmu; echo EXITED $?; sleep 60",
        dir.path().display(),
        cache.display()
    );
    let t = Tmux::start("cflow-e2e-mid", &cmd, 160, 48);
    t.wait(120, "the TUI with the demo model", |s| {
        s.contains("synthetic") && s.contains("prefetch OFF")
    });
    t.literal("Once upon a time");
    t.keys(&["Enter"]);
    t.wait(90, "the first reply to finish", |s| {
        s.contains("token #") && !s.contains("generating")
    });
    // Mid-session: toggle prefetch, start recording, A/B auto on prefetch, a second prompt.
    t.keys(&["Tab"]);
    t.keys(&["p"]);
    // The header may be in its compact form (`pf ON`) when the machine is busy.
    t.wait(10, "prefetch ON", |s| {
        s.contains("prefetch ON") || s.contains("pf ON")
    });
    t.keys(&["r"]);
    t.wait(10, "the REC badge and the engine's notice", |s| {
        s.contains("● REC") && s.contains("recording to")
    });
    t.keys(&["a"]);
    // The A/B pane's auto line (a state that was not on screen before).
    t.wait(10, "A/B auto armed", |s| s.contains("A/B auto "));
    t.keys(&["i"]);
    t.literal(" and then");
    // The prompt is in the input box before it is sent (under load the keys can lag the
    // screen; a lost `i` would send the letters to the panes instead).
    t.wait(20, "the second prompt in the input box", |s| {
        s.lines().any(|l| l.contains(">  and then"))
    });
    t.keys(&["Enter"]);
    let s = t.wait(120, "an A/B interval for prefetch", |s| {
        s.lines()
            .any(|l| (l.contains("on/off") || l.contains("off/on")) && l.contains("× ["))
    });
    assert!(s.contains("A/B"), "{s}");
    t.wait(120, "the second reply to finish", |s| {
        !s.contains("generating")
    });
    // The focus is back in the input box; F9 and F10 work there. (Esc then `r` sent at once
    // reaches the app as one read, ESC r, which is Alt+r: recording stopped but the input kept
    // the focus, so a following `q` was typed into it instead of quitting.)
    t.keys(&["F9"]);
    t.wait(10, "recording saved", |s| !s.contains("● REC"));
    t.keys(&["F10"]);
    t.wait(30, "exit", |s| s.contains("EXITED 0"));
    drop(t);
    let trace = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.to_string_lossy().ends_with(".trace.jsonl"))
        .expect("the `r` recording");
    let text = std::fs::read_to_string(&trace).unwrap();
    let second = text.lines().nth(1).unwrap_or("");
    assert!(second.contains("\"kind\":\"session\""), "{second}");

    // Its replay knows the session: the MoE panes draw, the gauge has its maximum, and ← works.
    // At a twentieth of the recorded pace: A/B auto flips prefetch at token boundaries, and the
    // first look at the screen must still see the state the recording started in (a loaded
    // machine took that look 60 tokens in at full pace, inside an "off" arm).
    let cmd = format!(
        "{bin} replay --speed 0.05 {}; echo EXITED $?; sleep 60",
        trace.display()
    );
    let t = Tmux::start("cflow-e2e-mid-replay", &cmd, 160, 48);
    let s = t.wait(30, "the replayed session", |s| {
        s.contains("REPLAY") && s.contains("payload") && s.contains("/2048")
    });
    assert!(!s.contains("waiting for a session"), "{s}");
    assert!(!s.contains("dense model"), "{s}");
    assert!(s.contains("prefetch ON"), "toggle state lost:\n{s}");
    t.wait(60, "replayed tokens", |s| s.contains("token #"));
    t.keys(&["Space"]);
    let tok = |s: &str| {
        s.split("token #")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|n| n.parse::<u32>().ok())
    };
    t.wait(10, "paused", |s| s.contains("REPLAY ⏸"));
    // Paused: the token number stops moving.
    let mut n0 = tok(&t.screen()).unwrap();
    loop {
        std::thread::sleep(Duration::from_millis(700));
        let n = tok(&t.screen()).unwrap();
        if n == n0 {
            break;
        }
        n0 = n;
    }
    t.keys(&["Left"]);
    t.wait(10, "one token back", |s| {
        tok(s).is_some_and(|n| n + 1 == n0 || (n0 == 0 && n == 0))
    });
    t.keys(&["q"]);
    t.wait(30, "replay exit", |s| s.contains("EXITED 0"));
}

/// Issue 14, item 5: `r` (here F9, its global key) twice within one second reused
/// `cflow-<secs>.trace.jsonl` and truncated the first recording. Three start/stop pairs sent
/// in one burst must leave three recordings with distinct date-time names.
#[test]
fn tui_recordings_started_in_one_second_never_overwrite_each_other() {
    if !common::have_tmux() {
        return;
    }
    let bin = env!("CARGO_BIN_EXE_cflow-tui");
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m.cflow");
    let ok = Command::new(bin)
        .args(["gen", "--arch", "llama", "--layers", "1", "--hidden", "64"])
        .args(["--heads", "2", "--ffn", "64", "--vocab", "256", "-o"])
        .arg(&model)
        .output()
        .unwrap()
        .status
        .success();
    assert!(ok);
    let rec = dir.path().join("rec");
    std::fs::create_dir(&rec).unwrap();
    let cmd = format!(
        "cd {} && CFLOW_CACHE={} {bin} {} --no-pmu; echo EXITED $?; sleep 60",
        rec.display(),
        dir.path().join("cache").display(),
        model.display()
    );
    let t = Tmux::start("cflow-e2e-rec", &cmd, 160, 48);
    t.wait(60, "the TUI", |s| {
        s.contains("Text") && s.contains("Streams")
    });
    t.keys(&["F9", "F9", "F9", "F9", "F9", "F9"]);
    let names = || -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&rec)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let t0 = Instant::now();
    while names().len() < 3 && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(500));
    t.keys(&["F10"]);
    t.wait(30, "exit", |s| s.contains("EXITED 0"));
    let names = names();
    assert_eq!(names.len(), 3, "{names:?}");
    for n in &names {
        assert!(
            n.starts_with("cflow-2") && n.ends_with(".trace.jsonl") && n.contains('T'),
            "not a date-time name: {n}"
        );
        let r = cflow::telemetry::replay::Replay::open(rec.join(n)).unwrap();
        assert!(r.warnings.is_empty(), "{n}: {:?}", r.warnings);
    }
}

/// Issue 16, item 10: a sampling change through the settings overlay reaches the engine (the
/// header shows the engine's answer, replacing `greedy`) and is recorded in the trace; Ctrl+S
/// saves the conversation as a Markdown transcript that parses back; M releases the mouse;
/// a malformed `--transcript` is refused with the line named, before the TUI starts.
#[test]
fn chat_settings_and_transcript_in_tmux() {
    if !common::have_tmux() {
        return;
    }
    let bin = env!("CARGO_BIN_EXE_cflow-tui");
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let trace = dir.path().join("chat.trace.jsonl");
    let cmd = format!(
        "cd {} && CFLOW_CACHE={} {bin} --record {} --max-tokens 12 --no-pmu; echo EXITED $?; sleep 60",
        dir.path().display(),
        cache.display(),
        trace.display()
    );
    // Wide enough for the demo's whole header.
    let t = Tmux::start("cflow-e2e-chat", &cmd, 200, 50);
    let header = |s: &str| s.lines().next().unwrap_or("").to_string();
    t.wait(90, "the TUI with the engine's settings", |s| {
        s.contains("synthetic") && header(s).contains("greedy")
    });
    t.literal("Once upon a time");
    t.keys(&["Enter"]);
    t.wait(60, "the reply's summary line", |s| {
        s.contains("ms/tok · total")
    });
    t.keys(&["Tab"]);
    t.keys(&["o"]);
    t.wait(10, "the settings overlay", |s| s.contains("Chat settings"));
    t.keys(&["Right", "Right", "Enter"]);
    let s = t.wait(20, "the header to show the new temperature", |s| {
        header(s).contains("T0.1 k40") && !header(s).contains("greedy")
    });
    assert!(!s.contains("Chat settings"), "overlay still open:\n{s}");
    t.keys(&["M"]);
    t.wait(10, "mouse released", |s| header(s).contains("MOUSE OFF"));
    t.keys(&["M"]);
    t.wait(10, "mouse captured again", |s| {
        !header(s).contains("MOUSE OFF")
    });
    t.keys(&["C-s"]);
    t.wait(20, "the saved notice", |s| {
        s.contains("transcript saved to")
    });
    t.keys(&["q"]);
    t.wait(30, "exit", |s| s.contains("EXITED 0"));
    drop(t);

    let saved: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    assert_eq!(saved.len(), 1, "{saved:?}");
    let tr = cflow::chat::transcript::Transcript::load(&saved[0]).unwrap();
    assert_eq!(tr.messages.len(), 2, "{tr:?}");
    assert_eq!(tr.messages[0].text, "Once upon a time");
    assert!(tr.messages[1]
        .summary
        .as_deref()
        .is_some_and(|s| s.starts_with("prompt ") && s.contains("ms/tok")));
    assert!(
        tr.meta
            .iter()
            .any(|(k, v)| k == "sampling" && v.starts_with("temp 0.1 ")),
        "{:?}",
        tr.meta
    );
    // Loading it restores that sampling (the demo has no chat template, so the messages are
    // refused, but the sampling is the transcript's, not the default greedy).
    let cmd = format!(
        "CFLOW_CACHE={} {bin} --transcript {} --no-pmu; echo EXITED $?; sleep 60",
        cache.display(),
        saved[0].display()
    );
    let t = Tmux::start("cflow-e2e-chat-load", &cmd, 200, 50);
    t.wait(60, "the transcript's sampling in the header", |s| {
        header(s).contains("T0.1 k40") && !header(s).contains("greedy")
    });
    t.keys(&["Tab"]);
    t.keys(&["q"]);
    t.wait(30, "exit", |s| s.contains("EXITED 0"));
    drop(t);
    // The change is in the trace, like the toggles.
    let r = cflow::telemetry::replay::Replay::open(&trace).unwrap();
    let temps: Vec<f32> = r
        .events
        .iter()
        .filter_map(|e| match &e.event {
            cflow::telemetry::Event::Settings(g) => Some(g.sampling.temperature),
            _ => None,
        })
        .collect();
    assert_eq!(temps.first(), Some(&0.0), "{temps:?}");
    assert!(temps.iter().any(|&t| (t - 0.1).abs() < 1e-6), "{temps:?}");

    // A malformed transcript: one clear line, exit 1, no TUI.
    let bad = dir.path().join("bad.md");
    std::fs::write(&bad, "# cflow-tui transcript\n\n## bot\n\nhi\n").unwrap();
    let cmd = format!(
        "CFLOW_CACHE={} {bin} --transcript {}; echo EXITED $?; sleep 60",
        cache.display(),
        bad.display()
    );
    let t = Tmux::start("cflow-e2e-chat-bad", &cmd, 160, 20);
    let s = t.wait(60, "the refusal", |s| s.contains("EXITED 1"));
    assert!(
        s.contains("bad.md: line 3: unknown section `## bot`"),
        "{s}"
    );
}
