//! `chat`: the line-oriented chat REPL (no TUI). On a terminal the line is edited with
//! rustyline (arrows, Ctrl-R, ...) and kept in a history file in the cache directory; from a
//! pipe, lines are read as bytes (a line that is not UTF-8 is refused, not the end). `/help`
//! lists the commands; a one-line summary follows each reply (like `ollama run --verbose`).

use super::args::ChatArgs;
use super::model::{build_session, install_sigint};
use super::run::RecordTap;
use crate::chat::conversation::Conversation;
use crate::engine::session::GenOutcome;
use crate::telemetry::Event;
use crate::{err, errln, outln};
use anyhow::{bail, Result};
use std::path::PathBuf;
use std::sync::Arc;

/// What `/help` prints.
pub const HELP: &str = "commands:
  /help          this list
  /reset         clear the conversation (the system prompt stays)
  /system TEXT   set the system prompt (/system alone clears it)
  /stats         the last reply's figures and the context use
  /quit, /exit   leave (or Ctrl-D)
Ctrl-C stops a reply; on a terminal the arrow keys edit the line and walk the history.";

/// The line printed after each reply: tokens, prefill speed, time to first token, decode speed,
/// ms/token, total time and the context use. No rate or ms/token from zero or one token (`stats::MIN_RATE_TOKENS`).
pub fn reply_summary(o: &GenOutcome, pos: usize, max_ctx: usize) -> String {
    let rate = |n: usize, ns: u64| crate::stats::tok_per_s_text(n as u64, ns);
    let ms_tok = match crate::stats::tok_per_s(o.tokens.len() as u64, o.decode_ns) {
        Some(_) => format!(
            ", {:.2} ms/token",
            o.decode_ns as f64 / 1e6 / o.tokens.len() as f64
        ),
        None => String::new(),
    };
    let ttft = o.ttft_ns.map_or(String::new(), |ns| {
        format!(", TTFT {}", crate::stats::latency_text(ns))
    });
    format!(
        "[{} tokens · prompt {} tokens, prefill {}{ttft} · decode {}{ms_tok} · total {:.2} s · context {pos}/{max_ctx}]",
        o.tokens.len(),
        o.prompt_tokens,
        rate(o.prompt_tokens, o.prefill_ns),
        rate(o.tokens.len(), o.decode_ns),
        (o.prefill_ns + o.decode_ns) as f64 / 1e9,
    )
}

/// One read from the user.
enum Input {
    Line(String),
    /// Nothing to act on (an abandoned line, or one refused and already reported).
    Nothing,
    Eof,
}

/// Where the REPL's lines come from.
enum Lines {
    /// A terminal: rustyline, with the history file (when the cache directory is usable).
    Edited(Box<rustyline::DefaultEditor>, Option<PathBuf>),
    /// A pipe or file: bytes up to each newline.
    Piped(std::io::Stdin),
    /// `--prompt`: its one message, then the end.
    Once(Option<String>),
}

impl Lines {
    fn open() -> Lines {
        use std::io::IsTerminal;
        let stdin = std::io::stdin();
        if !(stdin.is_terminal() && std::io::stderr().is_terminal()) {
            return Lines::Piped(stdin);
        }
        match rustyline::DefaultEditor::new() {
            Ok(mut ed) => {
                let history = crate::util::cache_dir()
                    .ok()
                    .map(|d| d.join("chat_history"));
                if let Some(h) = &history {
                    let _ = ed.load_history(h); // absent on first use
                }
                Lines::Edited(Box::new(ed), history)
            }
            Err(_) => Lines::Piped(stdin),
        }
    }

    fn read(&mut self) -> Result<Input> {
        use rustyline::error::ReadlineError;
        match self {
            Lines::Edited(ed, _) => match ed.readline("> ") {
                Ok(l) => Ok(Input::Line(l)),
                Err(ReadlineError::Interrupted) => Ok(Input::Nothing),
                Err(ReadlineError::Eof) => Ok(Input::Eof),
                Err(e) => Err(e.into()),
            },
            Lines::Once(p) => Ok(p.take().map_or(Input::Eof, Input::Line)),
            Lines::Piped(stdin) => {
                use std::io::BufRead;
                err!("\n> ");
                // Read bytes: a line that is not UTF-8 is refused, not the end of the
                // conversation.
                let mut raw = Vec::new();
                if stdin.lock().read_until(b'\n', &mut raw)? == 0 {
                    return Ok(Input::Eof);
                }
                match String::from_utf8(raw) {
                    Ok(l) => Ok(Input::Line(l.trim_end_matches(['\n', '\r']).to_string())),
                    Err(e) => {
                        errln!(
                            "(input ignored: not valid UTF-8 at byte {}; the conversation is kept)",
                            e.utf8_error().valid_up_to()
                        );
                        Ok(Input::Nothing)
                    }
                }
            }
        }
    }

    /// Keeps `line` in the history (and its file) on a terminal.
    fn remember(&mut self, line: &str) {
        if let Lines::Edited(ed, history) = self {
            let _ = ed.add_history_entry(line);
            if let Some(h) = history {
                if let Err(e) = ed.save_history(h) {
                    errln!(
                        "warning: cannot save the chat history to {}: {e}",
                        h.display()
                    );
                    *history = None;
                }
            }
        }
    }
}

pub(super) fn cmd_chat(a: ChatArgs) -> Result<()> {
    if a.prompt.as_deref().is_some_and(|p| p.trim().is_empty()) {
        bail!("--prompt is empty: give the message to send");
    }
    let eng = &a.engine;
    let model = match a.model.clone() {
        Some(m) => Some(m),
        None => crate::convert::pull::smollm2_cflow(),
    };
    let mut sess = build_session(model, eng, a.sampling.chat_params()?)?;
    let Some(tok) = sess.tok.clone() else {
        bail!("this model has no tokenizer; chat needs one");
    };
    let name = sess.engine.cfg().meta.name.clone();
    let one_shot = a.prompt.is_some();
    let mut conv = match chat_template(&sess, &tok, a.template.as_deref())? {
        Some(t) => Some(Conversation {
            template: t,
            system: a.system.clone(),
            turns: Vec::new(),
        }),
        None => {
            // No chat template and none given: completion mode, as the TUI does on such a
            // model, rather than ChatML the model was never trained on (which loops).
            let what = if one_shot {
                "the prompt is continued as text"
            } else {
                "each line is continued as text in one running context (/reset clears it)"
            };
            errln!(
                "{name} has no chat template (a base model): completion mode, {what}; \
                 `--template chatml` (or a Jinja file) chats with a template anyway."
            );
            if a.system.is_some() {
                errln!("note: --system is ignored in completion mode");
            }
            None
        }
    };
    let mut tap = match &a.record {
        Some(p) => Some(RecordTap::start(p, &sess, conv.as_ref())?),
        None => None,
    };
    // rustyline is built with its `signal-hook` feature: without it, on a terminal it installs
    // a raw SIGINT handler, which replaced signal-hook's, and once anything had registered
    // with signal-hook before it (a temporary-file watcher of `output`: the cache of the
    // kernel-prefetch probe, `--record`), ours was never reinstalled and Ctrl-C did not stop a
    // reply. While it reads a line the terminal is raw and Ctrl-C reaches it as a key.
    let mut lines = match &a.prompt {
        Some(p) => Lines::Once(Some(p.clone())),
        None => Lines::open(),
    };
    // Ctrl-C stops the current reply (not the REPL): the handler sets the engine's stop flag.
    let stop = sess.engine.stop_flag().clone();
    let interrupted = Arc::new(std::sync::atomic::AtomicBool::new(false));
    install_sigint(stop.clone(), interrupted.clone());
    if !one_shot {
        errln!(
            "{} {name}{}. /help lists the commands. Ctrl-C stops a reply; Ctrl-D quits.",
            if conv.is_some() {
                "chatting with"
            } else {
                "completing with"
            },
            match (&conv, &a.template) {
                (Some(_), Some(t)) => format!(" (template: --template {t})"),
                _ => String::new(),
            }
        );
    }
    if sess.engine.cfg().meta.synthetic {
        errln!("note: synthetic model (random weights): replies are noise. `cflow-tui pull smollm2` gets a real model.");
    }
    let mut text_out = super::text_out::TextOut::new(stop);
    let mut last: Option<GenOutcome> = None;
    loop {
        let line = match lines.read()? {
            Input::Line(l) => l,
            Input::Nothing => continue,
            Input::Eof => {
                if !one_shot {
                    errln!();
                }
                break;
            }
        };
        if line.trim().is_empty() {
            continue;
        }
        lines.remember(&line);
        // `--prompt`'s text is a message, never a command.
        if !one_shot {
            match repl_command(&line, &mut conv, &mut sess, last.as_ref()) {
                Some(Cmd::Quit) => break,
                Some(Cmd::Done) => continue,
                None => {}
            }
        }
        let max_ctx = sess.engine.cfg().max_ctx;
        let suffix = match conv.as_mut() {
            // A template exception or limit, a tokenizer error, or a prompt leaving no room for
            // a reply refuses this message and keeps the conversation as it was (including
            // turns `fit` would have dropped).
            Some(conv) => {
                let turn = match conv.prepare_turn(&line, &tok, max_ctx, a.n.min(max_ctx / 2)) {
                    Ok(t) => t,
                    Err(e) => {
                        if one_shot {
                            errln!("error: {e}");
                        } else {
                            errln!("error: {e}\n(message not sent; the conversation is kept)");
                        }
                        continue;
                    }
                };
                if turn.dropped > 0 {
                    errln!(
                        "(context full: dropped the {} oldest messages)",
                        turn.dropped
                    );
                }
                sess.sync_prompt(&turn.ids)
            }
            // Completion mode: the line continues the running context.
            None => match sess.encode(&line) {
                Ok(ids) => ids,
                Err(e) => {
                    errln!("error: {e}");
                    continue;
                }
            },
        };
        if let Some(t) = tap.as_mut() {
            t.emit(Event::Prompt {
                text: line.clone(),
                tokens: suffix.clone(),
                chat: true,
            });
        }
        interrupted.store(false, std::sync::atomic::Ordering::Relaxed);
        let room = max_ctx.saturating_sub(sess.engine.pos() + suffix.len());
        let out = sess.generate(&suffix, a.n.min(room), true, &mut |e| {
            if let Some(t) = tap.as_mut() {
                t.emit(e.clone());
            }
            if let Event::Token { text, .. } = &e {
                text_out.write(text);
            }
        });
        text_out.check()?;
        outln!()?;
        if out.reason == Some(crate::telemetry::StopReason::Stopped) {
            errln!("(stopped)");
        }
        if let Some(e) = &out.error {
            errln!("error: {e}");
        }
        errln!(
            "{}",
            reply_summary(&out, sess.engine.pos(), sess.engine.cfg().max_ctx)
        );
        if out.reason == Some(crate::telemetry::StopReason::ContextFull) && !one_shot {
            errln!("(the context is full: /reset clears it)");
        }
        if one_shot && interrupted.load(std::sync::atomic::Ordering::Relaxed) {
            // As `run`: stopped by Ctrl-C / SIGINT, exit 130.
            std::process::exit(130);
        }
        if let Some(conv) = conv.as_mut() {
            conv.turns.push(crate::chat::template::ChatMessage::new(
                "assistant",
                out.text.clone(),
            ));
        }
        last = Some(out);
    }
    if one_shot {
        match &last {
            None => bail!("the --prompt message was not sent (the reason is above)"),
            Some(o) if o.error.is_some() => bail!("the reply to --prompt failed (see above)"),
            _ => {}
        }
        if let Some(e) = tap.as_ref().and_then(|t| t.failed()) {
            bail!("--record: {e}");
        }
    }
    Ok(())
}

/// What a REPL command did.
enum Cmd {
    /// `/quit`, `/exit`.
    Quit,
    /// Handled (or refused as unknown); read the next line.
    Done,
}

/// Runs `line` when it is a REPL command (it starts with `/`, see [`HELP`]); `None` for a
/// message.
fn repl_command(
    line: &str,
    conv: &mut Option<Conversation>,
    sess: &mut crate::engine::session::Session,
    last: Option<&GenOutcome>,
) -> Option<Cmd> {
    if line == "/quit" || line == "/exit" {
        return Some(Cmd::Quit);
    }
    if line == "/help" {
        errln!("{HELP}");
        return Some(Cmd::Done);
    }
    if line == "/reset" {
        if let Some(c) = conv.as_mut() {
            c.clear();
        }
        sess.reset();
        errln!("(context cleared)");
        return Some(Cmd::Done);
    }
    if let Some(sys) = line.strip_prefix("/system") {
        let sys = sys.trim();
        let Some(conv) = conv.as_mut() else {
            errln!("(completion mode has no system prompt)");
            return Some(Cmd::Done);
        };
        conv.system = if sys.is_empty() {
            None
        } else {
            Some(sys.to_string())
        };
        errln!(
            "(system prompt {})",
            if sys.is_empty() { "cleared" } else { "set" }
        );
        return Some(Cmd::Done);
    }
    if line == "/stats" {
        match last {
            Some(o) => errln!(
                "last reply: {} tokens, prefill {} ({} tokens), decode {}; context {}/{}",
                o.tokens.len(),
                crate::stats::tok_per_s_text(o.prompt_tokens as u64, o.prefill_ns),
                o.prompt_tokens,
                crate::stats::tok_per_s_text(o.tokens.len() as u64, o.decode_ns),
                sess.engine.pos(),
                sess.engine.cfg().max_ctx
            ),
            None => errln!(
                "no reply yet; context {}/{}",
                sess.engine.pos(),
                sess.engine.cfg().max_ctx
            ),
        }
        return Some(Cmd::Done);
    }
    if line.starts_with('/') {
        errln!("unknown command {line}; /help lists the commands");
        return Some(Cmd::Done);
    }
    None
}

/// The template `chat` uses: `--template` (`chatml`, or a Jinja file), else the model's own;
/// `None` when the model has none and none was given (completion mode).
fn chat_template(
    sess: &crate::engine::session::Session,
    tok: &crate::chat::tokenizer::TokenizerWrap,
    given: Option<&str>,
) -> Result<Option<crate::chat::template::ChatTemplate>> {
    use crate::chat::template::ChatTemplate;
    let (bos, eos) = crate::chat::conversation::special_strings(Some(tok));
    let source = match given {
        Some("chatml") => crate::chat::template::CHATML_TEMPLATE.to_string(),
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("--template {path}: {e} (give `chatml` or a file)"))?,
        None => match sess.engine.cfg().meta.chat_template.as_deref() {
            Some(s) if !s.trim().is_empty() => s.to_string(),
            _ => return Ok(None),
        },
    };
    ChatTemplate::new(&source, &bos, &eos)
        .map(Some)
        .map_err(|e| anyhow::anyhow!("chat template: {e}"))
}
