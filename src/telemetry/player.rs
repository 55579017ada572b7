//! The replay player: feeds a recorded trace's events into the UI's channel at their recorded
//! pace (× speed), with pause, step and speed controls. The UI applies them exactly like live
//! events, so every pane works on a replay.
//!
//! Stepping is by token: a step releases one `Token` event *and everything recorded after it up
//! to the next token* (its `Stats`, toggles, `Done`…), so the panes show that token complete.
//! While paused, events between tokens keep flowing; the player waits in front of the next
//! `Token`. A backward step re-sends the trace from its start (the UI resets on `Session`) up to
//! the wanted token.
//!
//! At the end of the trace the player sends one [`END_OF_TRACE`] notice and stays, so ← still
//! steps back from the last token; it returns when the UI hangs up its controls.
//!
//! Idle time is skipped: a recorded gap between two events longer than [`MAX_IDLE_NS`] (the
//! user reading or typing, a run paused) plays as that long, so a replay starts with its first
//! prompt rather than seconds of dead air.

use super::{Event, Stamped};
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

/// Control messages for the player (the UI host forwards them to the player's thread).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ReplayControl {
    SetPaused(bool),
    /// Step by this many tokens (negative = back). A backward step re-sends the trace from its
    /// `Session` event up to the wanted token; the app resets its state on every `Session`.
    Step(i32),
    /// Playback speed multiplier (1.0 = recorded pace).
    SetSpeed(f64),
}

/// The longest recorded gap between two events that a replay plays out (longer ones shrink to it).
pub const MAX_IDLE_NS: u64 = 300_000_000;

/// The notice the player sends when it has played the last event.
pub const END_OF_TRACE: &str = "end of trace — ← steps back, q quits";

fn is_token(e: &Stamped) -> bool {
    matches!(e.event, Event::Token { .. })
}

/// Adds the steps already queued behind a step of `n` (a held arrow key queues one per key
/// repeat): one rewind for all of them, not one each. Other controls found on the way are
/// returned to be applied after the step.
fn coalesce(n: i32, ctl: &Receiver<ReplayControl>) -> (i64, Vec<ReplayControl>) {
    let mut sum = n as i64;
    let mut rest = Vec::new();
    while let Ok(c) = ctl.try_recv() {
        match c {
            ReplayControl::Step(m) => sum += m as i64,
            other => rest.push(other),
        }
    }
    (sum, rest)
}

/// Plays `events` into `tx` until the end of the trace, or until the UI goes away (`tx` or
/// `ctl` disconnected). `speed0` is the initial speed (must be > 0).
pub fn play(events: Vec<Stamped>, tx: Sender<Stamped>, ctl: Receiver<ReplayControl>, speed0: f64) {
    let mut speed = if speed0 > 0.0 { speed0 } else { 1.0 };
    let mut paused = false;
    // Tokens the user released while paused and not yet sent.
    let mut released: i64 = 0;
    let mut i = 0usize;
    let mut anchor = (Instant::now(), events.first().map_or(0, |e| e.t_ns));
    let t_end = events.last().map_or(0, |e| e.t_ns);
    loop {
        if i >= events.len() {
            // The end: say so once, then wait for a backward step (or for the UI to go).
            let end = Stamped {
                t_ns: t_end,
                event: Event::Notice {
                    message: END_OF_TRACE.into(),
                },
            };
            if tx.send(end).is_err() {
                return;
            }
            loop {
                match ctl.recv() {
                    Err(_) => return,
                    Ok(ReplayControl::Step(n)) if n < 0 => {
                        paused = true;
                        released = 0;
                        let (n, _) = coalesce(n, &ctl);
                        let total = events.iter().filter(|e| is_token(e)).count() as i64;
                        match rewind(&events, &tx, (total + n.min(0)).max(0)) {
                            Some(at) => i = at,
                            None => return,
                        }
                        break;
                    }
                    Ok(ReplayControl::SetSpeed(s)) if s > 0.0 && s.is_finite() => speed = s,
                    Ok(_) => {}
                }
            }
            anchor = (Instant::now(), events.get(i).map_or(t_end, |e| e.t_ns));
            continue;
        }
        // Waiting in front of a token while paused (and none released): block on the controls.
        let blocked = paused && released == 0 && is_token(&events[i]);
        let timeout = if blocked {
            Duration::from_millis(50)
        } else {
            Duration::ZERO
        };
        match ctl.recv_timeout(timeout) {
            Ok(ReplayControl::SetPaused(p)) => {
                paused = p;
                released = 0;
                anchor = (Instant::now(), events[i].t_ns);
                continue;
            }
            Ok(ReplayControl::SetSpeed(s)) => {
                if s > 0.0 && s.is_finite() {
                    speed = s;
                    anchor = (Instant::now(), events[i].t_ns);
                }
                continue;
            }
            Ok(ReplayControl::Step(n)) => {
                paused = true;
                let (n, rest) = coalesce(n, &ctl);
                if let Some(s) = rest.iter().rev().find_map(|c| match c {
                    ReplayControl::SetSpeed(s) if *s > 0.0 && s.is_finite() => Some(*s),
                    _ => None,
                }) {
                    speed = s;
                }
                if n >= 0 {
                    released += n;
                } else {
                    // Tokens already shown, counted up to the current position.
                    let shown = events[..i].iter().filter(|e| is_token(e)).count() as i64;
                    match rewind(&events, &tx, (shown + n).max(0)) {
                        Some(at) => i = at,
                        None => return,
                    }
                    released = 0;
                }
                continue;
            }
            Err(RecvTimeoutError::Disconnected) if blocked => return,
            Err(_) => {}
        }
        if blocked {
            continue;
        }
        let e = &events[i];
        if !paused {
            let due = anchor.0
                + Duration::from_nanos((e.t_ns.saturating_sub(anchor.1) as f64 / speed) as u64);
            let now = Instant::now();
            if due > now {
                std::thread::sleep((due - now).min(Duration::from_millis(20)));
                continue;
            }
        } else if is_token(e) {
            released -= 1;
        }
        if tx.send(e.clone()).is_err() {
            return;
        }
        i += 1;
        // Idle time: the next event comes at most MAX_IDLE_NS (recorded) after this one.
        if let Some(next) = events.get(i) {
            let gap = next.t_ns.saturating_sub(events[i - 1].t_ns);
            if gap > MAX_IDLE_NS {
                anchor.1 += gap - MAX_IDLE_NS;
            }
        }
    }
}

/// A backward step: re-sends the trace from its start up to (not including) token number `want`
/// (the UI resets on the trace's `Session`), and returns that token's index in `events`, where
/// playing resumes (None when the UI went away).
fn rewind(events: &[Stamped], tx: &Sender<Stamped>, want: i64) -> Option<usize> {
    let mut i = 0;
    let mut seen = 0i64;
    while i < events.len() {
        if is_token(&events[i]) {
            if seen == want {
                break;
            }
            seen += 1;
        }
        tx.send(events[i].clone()).ok()?;
        i += 1;
    }
    Some(i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::StopReason;

    fn trace() -> Vec<Stamped> {
        let mut v = vec![Stamped {
            t_ns: 0,
            event: Event::Prompt {
                text: "p".into(),
                tokens: vec![1],
                chat: false,
            },
        }];
        for k in 0..3u32 {
            v.push(Stamped {
                t_ns: 1_000 + k as u64 * 1_000,
                event: Event::Token {
                    index: k,
                    id: k,
                    text: format!("t{k}"),
                },
            });
            v.push(Stamped {
                t_ns: 1_500 + k as u64 * 1_000,
                event: Event::Notice {
                    message: format!("after t{k}"),
                },
            });
        }
        v.push(Stamped {
            t_ns: 9_000,
            event: Event::Done {
                reason: StopReason::Length,
                n_tokens: 3,
                decode_ns: 1,
                pos: Some(4),
                ttft_ns: None,
            },
        });
        v
    }

    fn label(s: &Stamped) -> String {
        match &s.event {
            Event::Prompt { .. } => "P".into(),
            Event::Token { text, .. } => text.clone(),
            Event::Notice { message } if message == END_OF_TRACE => "END".into(),
            Event::Notice { message } => message.replace("after ", "a"),
            Event::Done { .. } => "D".into(),
            _ => "?".into(),
        }
    }

    /// Drains what arrives within `ms` milliseconds.
    fn drain(rx: &Receiver<Stamped>, ms: u64) -> Vec<String> {
        let mut v = Vec::new();
        while let Ok(s) = rx.recv_timeout(Duration::from_millis(ms)) {
            v.push(label(&s));
        }
        v
    }

    #[test]
    fn idle_time_is_skipped() {
        // A replay must not begin with seconds of dead air (the user typing the prompt).
        let mut v = trace();
        for (i, s) in v.iter_mut().enumerate() {
            // Ten seconds of nothing before the prompt's tokens, at the recorded pace.
            s.t_ns += if i == 0 { 0 } else { 10_000_000_000 };
        }
        let (tx, rx) = crossbeam_channel::unbounded();
        let (_ctl_tx, ctl_rx) = crossbeam_channel::unbounded();
        let t0 = Instant::now();
        std::thread::spawn(move || play(v, tx, ctl_rx, 1.0));
        let got = drain(&rx, 3_000);
        assert_eq!(got.last().map(String::as_str), Some("END"), "{got:?}");
        assert!(
            t0.elapsed() < Duration::from_secs(6),
            "{:?} for a trace of 10 s idle + 9 µs",
            t0.elapsed()
        );
    }

    #[test]
    fn plays_everything_in_order_at_high_speed() {
        let (tx, rx) = crossbeam_channel::unbounded();
        // No controls: the player plays to the end, says so, and returns.
        let (ctl_tx, ctl) = crossbeam_channel::unbounded::<ReplayControl>();
        drop(ctl_tx);
        play(trace(), tx, ctl, 1e6);
        let got: Vec<String> = rx.try_iter().map(|s| label(&s)).collect();
        assert_eq!(
            got,
            ["P", "t0", "at0", "t1", "at1", "t2", "at2", "D", "END"]
        );
    }

    #[test]
    fn every_step_after_a_pause_shows_one_whole_token() {
        let (tx, rx) = crossbeam_channel::unbounded();
        let (ctl_tx, ctl) = crossbeam_channel::unbounded();
        ctl_tx.send(ReplayControl::SetPaused(true)).unwrap();
        let h = std::thread::spawn(move || play(trace(), tx, ctl, 1.0));
        // Paused: the events before the first token flow, then it waits in front of t0.
        assert_eq!(drain(&rx, 150), ["P"]);
        // The first step is not lost: t0 and what was recorded after it.
        ctl_tx.send(ReplayControl::Step(1)).unwrap();
        assert_eq!(drain(&rx, 150), ["t0", "at0"]);
        ctl_tx.send(ReplayControl::Step(1)).unwrap();
        assert_eq!(drain(&rx, 150), ["t1", "at1"]);
        // Back one token: from the start up to (not including) t1.
        ctl_tx.send(ReplayControl::Step(-1)).unwrap();
        assert_eq!(drain(&rx, 150), ["P", "t0", "at0"]);
        // Resume: the rest at recorded pace (microseconds here).
        ctl_tx.send(ReplayControl::SetPaused(false)).unwrap();
        assert_eq!(drain(&rx, 150), ["t1", "at1", "t2", "at2", "D", "END"]);
        drop(ctl_tx);
        h.join().unwrap();
    }

    /// At the end of the trace the player stays: ← steps back from the last token (the first
    /// press is not lost), → then shows it again, and the end is announced again.
    #[test]
    fn at_the_end_a_backward_step_still_works() {
        let (tx, rx) = crossbeam_channel::unbounded();
        let (ctl_tx, ctl) = crossbeam_channel::unbounded();
        let h = std::thread::spawn(move || play(trace(), tx, ctl, 1e6));
        assert_eq!(
            drain(&rx, 150),
            ["P", "t0", "at0", "t1", "at1", "t2", "at2", "D", "END"]
        );
        ctl_tx.send(ReplayControl::SetPaused(true)).unwrap();
        ctl_tx.send(ReplayControl::Step(-1)).unwrap();
        assert_eq!(drain(&rx, 150), ["P", "t0", "at0", "t1", "at1"]);
        ctl_tx.send(ReplayControl::Step(-1)).unwrap();
        assert_eq!(drain(&rx, 150), ["P", "t0", "at0"]);
        ctl_tx.send(ReplayControl::Step(1)).unwrap();
        assert_eq!(drain(&rx, 150), ["t1", "at1"]);
        ctl_tx.send(ReplayControl::Step(1)).unwrap();
        assert_eq!(drain(&rx, 150), ["t2", "at2", "D", "END"]);
        drop(ctl_tx);
        h.join().unwrap();
    }

    /// A held ← queues a step per key repeat; the player takes them together, so the
    /// trace is re-sent once (one `P`), not once per press, and ends at the sum of the steps.
    #[test]
    fn queued_steps_are_taken_together() {
        let (tx, rx) = crossbeam_channel::unbounded();
        let (ctl_tx, ctl) = crossbeam_channel::unbounded();
        let h = std::thread::spawn(move || play(trace(), tx, ctl, 1e6));
        assert_eq!(drain(&rx, 150).last().map(String::as_str), Some("END"));
        ctl_tx.send(ReplayControl::SetPaused(true)).unwrap();
        for _ in 0..2 {
            ctl_tx.send(ReplayControl::Step(-1)).unwrap();
        }
        assert_eq!(drain(&rx, 150), ["P", "t0", "at0"]);
        for _ in 0..3 {
            ctl_tx.send(ReplayControl::Step(1)).unwrap();
        }
        ctl_tx.send(ReplayControl::Step(-1)).unwrap();
        ctl_tx.send(ReplayControl::Step(-1)).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        // 1 + 3 − 2 = 2 tokens shown, with at most one rewind from the start (none when the
        // player saw the first forward step alone, then the rest together).
        let got = drain(&rx, 150);
        assert!(got.iter().filter(|l| *l == "P").count() <= 1, "{got:?}");
        let mut shown = vec!["t0".to_string()];
        for l in &got {
            match l.as_str() {
                "P" => shown.clear(),
                t if t.starts_with('t') => shown.push(t.to_string()),
                _ => {}
            }
        }
        assert_eq!(shown, ["t0", "t1"], "{got:?}");
        drop(ctl_tx);
        h.join().unwrap();
    }

    #[test]
    fn plays_at_the_recorded_pace() {
        let mut ev = trace();
        for (k, e) in ev.iter_mut().enumerate() {
            e.t_ns = k as u64 * 30_000_000; // 30 ms apart
        }
        let n = ev.len();
        let (tx, rx) = crossbeam_channel::unbounded();
        let (ctl_tx, ctl) = crossbeam_channel::unbounded::<ReplayControl>();
        let t0 = Instant::now();
        let h = std::thread::spawn(move || play(ev, tx, ctl, 2.0));
        let mut got = Vec::new();
        while let Ok(s) = rx.recv_timeout(Duration::from_millis(500)) {
            got.push(label(&s));
            if got.last().is_some_and(|l| l == "END") {
                break;
            }
        }
        let el = t0.elapsed().as_millis();
        drop(ctl_tx);
        h.join().unwrap();
        assert_eq!(got.len(), n + 1, "{got:?}");
        // (n-1) × 30 ms at 2× = 105 ms to the end notice.
        assert!((100..1000).contains(&el), "{el} ms");
    }

    #[test]
    fn the_player_ends_when_the_ui_goes_away() {
        let (tx, rx) = crossbeam_channel::unbounded();
        let (ctl_tx, ctl) = crossbeam_channel::unbounded();
        ctl_tx.send(ReplayControl::SetPaused(true)).unwrap();
        let h = std::thread::spawn(move || play(trace(), tx, ctl, 1.0));
        assert_eq!(drain(&rx, 100), ["P"]);
        drop(ctl_tx);
        h.join().unwrap();
    }
}
