//! Fault injection on the expert-I/O threads and the engine thread (docs/RELIABILITY.md):
//! * a direct-tier read that fails (EIO), ends early (short read at end-of-file) or whose reader
//!   panics → that token fails with an error naming the file, layer, expert and offset, every
//!   staging slot is free again, and retrying the token continues exactly like an undisturbed run
//!   (sync and staged fetch);
//! * the same through a `Session`: an `Error` event and `Done{reason: error}` within a bounded
//!   time, and the next request gives the undisturbed tokens;
//! * the prefetch thread panics → a non-fatal `Error` event, the thread is restarted, the tokens
//!   are unaffected;
//! * the engine thread itself panics → a fatal `Error` event and `Done{reason: error}` instead of
//!   a dead thread, later requests are refused at once, `Quit` still ends the thread.
//!
//! Every scenario runs under a watchdog, so a hang fails the test instead of blocking the suite.

use cflow::convert::generate::{generate, GenSpec};
use cflow::engine::sampler::argmax;
use cflow::engine::session::Session;
use cflow::engine::worker::{spawn, WorkerOptions};
use cflow::engine::ForwardError;
use cflow::engine::{Engine, EngineOptions};
use cflow::engine::{ExpertTier, FetchMode};
use cflow::format::CflowFile;
use cflow::io::{FaultKind, FaultPlan, FetchHooks};
use cflow::quant::QuantType;
use cflow::telemetry::{Command, Event, SamplingParams, StopReason};
use crossbeam_channel::{unbounded, Receiver};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Layers × top-k of the test model: expert reads per token.
const LAYERS: usize = 4;
const TOP_K: usize = 2;
const PROMPT: [u32; 4] = [1, 17, 99, 3];
/// Bound on detecting a fault (generous for a loaded 2-core machine; measured times are µs–ms).
const BOUND: Duration = Duration::from_secs(5);

fn model(dir: &Path, tokenizer: bool) -> PathBuf {
    let p = dir.join(if tokenizer { "tok.cflow" } else { "m.cflow" });
    let mut s = GenSpec::new("arch2_4_combined");
    s.seed = 11;
    s.layers = Some(LAYERS);
    s.hidden = Some(128);
    s.heads = Some(4);
    s.ffn = Some(256);
    s.experts = Some(4);
    s.top_k = Some(TOP_K);
    s.expert_ffn = Some(128);
    s.ctx = Some(512);
    s.quant = QuantType::Q4_0;
    if tokenizer {
        s.tokenizer_json = cflow::cli::gpt2_tokenizer_json();
    } else {
        s.vocab = Some(384);
    }
    generate(&s, &p, |_, _| {}).expect("generate");
    p
}

fn engine(f: &Arc<CflowFile>, tier: ExpertTier, fetch: FetchMode, hooks: FetchHooks) -> Engine {
    Engine::new(
        f.clone(),
        EngineOptions {
            threads: 1,
            expert_tier: tier,
            fetch,
            // One reader: a reader that died would make every later read fail.
            readers: 1,
            prefetch: hooks
                .fault
                .is_some_and(|p| p.kind == FaultKind::PrefetchPanic),
            fetch_hooks: hooks,
            ..Default::default()
        },
    )
}

fn fault(kind: FaultKind, at: u64) -> FetchHooks {
    FetchHooks {
        fault: Some(FaultPlan { kind, at }),
        ..Default::default()
    }
}

/// Runs `f` on its own thread; fails if it takes longer than `secs` (a hang).
fn within<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = unbounded();
    std::thread::spawn(move || {
        let _ = tx.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)));
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(Ok(v)) => v,
        Ok(Err(p)) => std::panic::resume_unwind(p),
        Err(_) => panic!("no result within {secs} s: hang"),
    }
}

/// Checks a failed step: the engine, the error, (free, total) staging slots before the step.
type OnError<'a> = dyn FnMut(&Engine, ForwardError, (usize, usize)) + 'a;

/// Greedy decode after `PROMPT`: the generated tokens and the bits of the last logits. A step
/// that fails is handed to `on_error` (with the free and total staging slots before that step)
/// and retried at once.
fn decode(e: &mut Engine, n: usize, on_error: &mut OnError) -> (Vec<u32>, Vec<u32>) {
    e.reset();
    let mut out = Vec::new();
    let mut i = 0;
    while out.len() < n {
        let t = if i < PROMPT.len() {
            PROMPT[i]
        } else {
            *out.last().unwrap()
        };
        let slots = (e.fetch_free_slots(), e.fetch_slots());
        match e.step(t, true) {
            Ok(l) => {
                let next = argmax(l.unwrap()) as u32;
                if i + 1 >= PROMPT.len() {
                    out.push(next);
                }
                i += 1;
            }
            Err(err) => on_error(e, err, slots),
        }
    }
    (out, e.logits().iter().map(|v| v.to_bits()).collect())
}

fn no_error(_: &Engine, e: ForwardError, _: (usize, usize)) {
    panic!("unexpected error: {e}");
}

#[test]
fn read_faults_fail_the_token_cleanly_and_the_retry_is_identical() {
    let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
    let path = model(dir.path(), false);
    let f = Arc::new(CflowFile::open(&path).unwrap());
    let mut base = engine(&f, ExpertTier::Mmap, FetchMode::Sync, FetchHooks::default());
    let (want, want_logits) = decode(&mut base, 8, &mut no_error);
    // Read 2·8 + 3: the 4th read of the third token (layer 1, its second selected expert).
    let at = (2 * LAYERS * TOP_K + 3) as u64;
    for fetch in [FetchMode::Sync, FetchMode::Staged] {
        for (kind, cause) in [
            (FaultKind::Eio, "Input/output error"),
            (FaultKind::ShortRead, "short read: "),
            (
                FaultKind::ReaderPanic,
                "reader thread panicked: injected fault: reader thread panic",
            ),
        ] {
            let f = f.clone();
            let path = path.clone();
            let (want, want_logits) = (want.clone(), want_logits.clone());
            within(60, move || {
                let what = format!("{fetch:?} {kind:?}");
                let mut e = engine(&f, ExpertTier::Direct, fetch, fault(kind, at));
                let mut failures = 0;
                let mut on_error = |e: &Engine, err: ForwardError, slots_before: (usize, usize)| {
                    failures += 1;
                    let msg = err.to_string();
                    let ForwardError::ExpertRead {
                        path: p,
                        layer,
                        expert,
                        offset,
                        len,
                        error,
                    } = err
                    else {
                        panic!("{what}: not a read error: {msg}");
                    };
                    assert_eq!(p, path.display().to_string(), "{what}");
                    assert_eq!(layer, 1, "{what}: {msg}");
                    let ex = &f.layers[layer].experts[expert];
                    assert_eq!((offset, len), (ex.offset, ex.len), "{what}");
                    assert!(error.contains(cause), "{what}: {msg}");
                    assert!(
                        msg.starts_with(&format!(
                            "expert read failed: {p} layer 1 expert {expert} (offset {offset}, \
                             {len} bytes): "
                        )),
                        "{what}: {msg}"
                    );
                    // No slot leaked or left in flight, none was added.
                    assert_eq!(
                        (e.fetch_free_slots(), e.fetch_slots()),
                        slots_before,
                        "{what}"
                    );
                    assert!(slots_before.1 > 0, "{what}");
                    let c = e.fetch_counters().unwrap();
                    assert_eq!(c.submitted, c.completed, "{what}: {c:?}");
                    assert_eq!((c.failed, c.reuse_violations), (1, 0), "{what}: {c:?}");
                    // The failed position was not committed.
                    assert_eq!(e.pos(), 2, "{what}");
                };
                let (got, logits) = decode(&mut e, 8, &mut on_error);
                assert_eq!(failures, 1, "{what}");
                assert_eq!(got, want, "{what}: tokens after the retry differ");
                assert!(logits == want_logits, "{what}: logits differ");
                // The reader pool (one thread) still serves: a whole further run is clean.
                let before = e.fetch_counters().unwrap();
                let (again, _) = decode(&mut e, 8, &mut no_error);
                assert_eq!(again, want, "{what}");
                let c = e.fetch_counters().unwrap();
                assert_eq!(c.failed, before.failed, "{what}");
                assert!(c.completed > before.completed, "{what}");
            });
        }
    }
}

fn session(f: &Arc<CflowFile>, tier: ExpertTier, fetch: FetchMode, h: FetchHooks) -> Session {
    Session::new(engine(f, tier, fetch, h), SamplingParams::default()).expect("session")
}

/// The session back from a generation thread, with the tokens and the stop reason.
type Generated = (Session, Vec<u32>, Option<StopReason>);

/// Runs `s.generate(PROMPT, n)` on another thread; returns the event receiver and the thread.
fn generate_async(mut s: Session, n: usize) -> (Receiver<Event>, JoinHandle<Generated>) {
    let (tx, rx) = unbounded();
    let h = std::thread::spawn(move || {
        let out = s.generate(&PROMPT, n, false, &mut |e| {
            let _ = tx.send(e);
        });
        (s, out.tokens, out.reason)
    });
    (rx, h)
}

/// Waits (bounded) for the first `Error` event; returns its message, fatality and the delay.
fn first_error(rx: &Receiver<Event>, start: Instant) -> (String, bool, Duration) {
    loop {
        match rx.recv_timeout(BOUND.saturating_sub(start.elapsed())) {
            Ok(Event::Error { message, fatal }) => return (message, fatal, start.elapsed()),
            Ok(Event::Done { reason, .. }) => panic!("done ({reason:?}) without an error"),
            Ok(_) => {}
            Err(e) => panic!("no error event within {BOUND:?}: {e}"),
        }
    }
}

fn next_done(rx: &Receiver<Event>) -> StopReason {
    loop {
        match rx.recv_timeout(BOUND) {
            Ok(Event::Done { reason, .. }) => return reason,
            Ok(_) => {}
            Err(e) => panic!("no done event within {BOUND:?}: {e}"),
        }
    }
}

#[test]
fn session_reports_a_failed_read_and_the_next_request_is_undisturbed() {
    let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
    let path = model(dir.path(), false);
    let f = Arc::new(CflowFile::open(&path).unwrap());
    let mut base = session(&f, ExpertTier::Mmap, FetchMode::Sync, FetchHooks::default());
    let want = base.generate(&PROMPT, 8, false, &mut |_| {}).tokens;
    // Read 5 is in prefill, 4·8 + 5 in the decode loop.
    for (kind, fetch, at) in [
        (FaultKind::Eio, FetchMode::Staged, 5),
        (FaultKind::ShortRead, FetchMode::Sync, 5),
        (FaultKind::ReaderPanic, FetchMode::Staged, 4 * 8 + 5),
        (FaultKind::ReaderPanic, FetchMode::Sync, 4 * 8 + 5),
    ] {
        let what = format!("{kind:?} {fetch:?} at read {at}");
        let s = session(&f, ExpertTier::Direct, fetch, fault(kind, at));
        let start = Instant::now();
        let (rx, h) = generate_async(s, 8);
        let (msg, fatal, took) = first_error(&rx, start);
        eprintln!("{what}: error event after {took:?}");
        assert!(!fatal, "{what}");
        assert!(
            msg.starts_with(&format!("expert read failed: {} layer ", path.display())),
            "{what}: {msg}"
        );
        assert!(
            msg.contains(" expert ") && msg.contains("(offset "),
            "{what}: {msg}"
        );
        assert_eq!(next_done(&rx), StopReason::Error, "{what}");
        let (mut s, toks, reason) = within(10, move || h.join().unwrap());
        assert_eq!(reason, Some(StopReason::Error), "{what}");
        assert!(toks.len() < 8, "{what}: {toks:?}");
        assert_eq!(
            s.engine.fetch_free_slots(),
            s.engine.fetch_slots(),
            "{what}: slots"
        );
        // The next request, from a fresh context, gives the undisturbed tokens.
        s.reset();
        let mut events = Vec::new();
        let again = s.generate(&PROMPT, 8, false, &mut |e| events.push(e));
        assert_eq!(again.tokens, want, "{what}");
        assert_eq!(again.reason, Some(StopReason::Length), "{what}");
        assert!(
            !events.iter().any(|e| matches!(e, Event::Error { .. })),
            "{what}"
        );
    }
}

#[test]
fn prefetch_thread_panic_is_reported_restarted_and_harmless() {
    let dir = tempfile::tempdir().unwrap();
    let path = model(dir.path(), false);
    let f = Arc::new(CflowFile::open(&path).unwrap());
    let mut base = session(&f, ExpertTier::Mmap, FetchMode::Sync, FetchHooks::default());
    let want = base.generate(&PROMPT, 8, false, &mut |_| {}).tokens;
    let mut s = session(
        &f,
        ExpertTier::Mmap,
        FetchMode::Sync,
        fault(FaultKind::PrefetchPanic, 5),
    );
    // The panic happens on the prefetch thread at its 6th command, asynchronously; the session
    // notices it after the next token. Repeat requests until it is reported (bounded).
    let start = Instant::now();
    let mut reported = None;
    while reported.is_none() {
        assert!(start.elapsed() < BOUND, "prefetch panic not reported");
        s.reset();
        let mut errors = Vec::new();
        let out = s.generate(&PROMPT, 8, false, &mut |e| {
            if let Event::Error { message, fatal } = e {
                errors.push((message, fatal));
            }
        });
        assert_eq!(out.tokens, want, "hints must not change the tokens");
        assert_eq!(out.reason, Some(StopReason::Length));
        assert!(errors.len() <= 1, "{errors:?}");
        reported = errors.pop().map(|e| (e, start.elapsed()));
    }
    let ((msg, fatal), took) = reported.unwrap();
    eprintln!("prefetch panic reported after {took:?}");
    assert!(!fatal);
    assert!(
        msg.starts_with(
            "prefetch thread panicked (injected fault: prefetch thread panic at command 5); \
             restarted"
        ),
        "{msg}"
    );
    // The restarted thread works: it processes the hints of further tokens.
    let (cmds, ..) = s.engine.prefetch_counters().unwrap();
    s.reset();
    let out = s.generate(&PROMPT, 8, false, &mut |_| {});
    assert_eq!(out.tokens, want);
    let deadline = Instant::now() + BOUND;
    while s.engine.prefetch_counters().unwrap().0 <= cmds {
        assert!(
            Instant::now() < deadline,
            "restarted prefetch thread is idle"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn engine_thread_panic_is_a_fatal_error_event_not_a_hang() {
    let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
    let path = model(dir.path(), true);
    let f = Arc::new(CflowFile::open(&path).unwrap());
    // The engine thread panics inside the fetcher's `wait` for read 3 (a bug stand-in).
    let s = session(
        &f,
        ExpertTier::Direct,
        FetchMode::Sync,
        fault(FaultKind::WaiterPanic, 3),
    );
    let w = spawn(
        s,
        WorkerOptions {
            record: None,
            machine: None,
            pmu: false,
        },
    );
    let complete = || Command::Complete {
        text: "Once upon a time".into(),
        max_tokens: 8,
    };
    // The stamped events as plain events.
    let (tx, rx) = unbounded();
    let evs = w.events.clone();
    std::thread::spawn(move || {
        for st in evs {
            if tx.send(st.event).is_err() {
                break;
            }
        }
    });
    w.commands.send(complete()).unwrap();
    let start = Instant::now();
    let (msg, fatal, took) = first_error(&rx, start);
    eprintln!("engine thread panic reported after {took:?}");
    assert!(fatal, "{msg}");
    assert!(
        msg.starts_with(
            "engine thread panicked: injected fault: panic in the engine thread waiting for \
             expert read 3; the engine is stopped"
        ),
        "{msg}"
    );
    assert_eq!(next_done(&rx), StopReason::Error);
    // Later requests are refused at once, with the reason.
    w.commands.send(complete()).unwrap();
    let (msg, fatal, took) = first_error(&rx, Instant::now());
    eprintln!("request after the panic refused after {took:?}");
    assert!(fatal, "{msg}");
    assert!(
        msg.starts_with("the engine stopped after a panic (injected fault: "),
        "{msg}"
    );
    assert_eq!(next_done(&rx), StopReason::Error);
    // The thread still answers Quit.
    w.commands.send(Command::Quit).unwrap();
    within(10, move || w.join());
}
