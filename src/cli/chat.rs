//! `chat`: the line-oriented chat REPL (no TUI).

use super::args::ChatArgs;
use super::model::{build_session, install_sigint};
use super::run::RecordTap;
use crate::engine::session::{GenOutcome, Session};
use crate::telemetry::Event;
use crate::{err, errln, outln};
use anyhow::{bail, Result};
use std::io::Write;
use std::sync::Arc;

/// bos/eos token strings for chat templates.
pub(super) fn special_strings(s: &Session) -> (String, String) {
    let t = s.tok.as_ref();
    let name = |id: Option<u32>| {
        id.and_then(|i| t.and_then(|t| t.id_to_token(i)))
            .unwrap_or_default()
    };
    (
        name(t.and_then(|t| t.bos_id())),
        name(t.and_then(|t| t.eos_id())),
    )
}

pub(super) fn cmd_chat(a: ChatArgs) -> Result<()> {
    let eng = &a.engine;
    use std::io::BufRead;
    let model = match a.model.clone() {
        Some(m) => Some(m),
        None => crate::convert::pull::smollm2_cflow(),
    };
    let mut sess = build_session(model, eng, a.sampling.params()?, true)?;
    if sess.tok.is_none() {
        bail!("this model has no tokenizer; chat needs one");
    }
    let (bos, eos) = special_strings(&sess);
    let mut conv = crate::chat::conversation::Conversation::for_model(&sess.engine.cfg, &bos, &eos)
        .map_err(|e| anyhow::anyhow!("chat template: {e}"))?;
    conv.system = a.system.clone();
    let mut tap = match &a.record {
        Some(p) => Some(RecordTap::start(p, &sess)?),
        None => None,
    };
    // Ctrl-C stops the current reply (not the REPL): the handler sets the engine's stop flag.
    let stop = sess.engine.stop.clone();
    let interrupted = Arc::new(std::sync::atomic::AtomicBool::new(false));
    install_sigint(stop.clone(), interrupted.clone());
    let name = sess.engine.cfg.meta.name.clone();
    errln!(
        "chatting with {name}{}. Commands: /reset, /system TEXT, /stats, /quit. Ctrl-C stops a reply; Ctrl-D quits.",
        if conv.template.is_fallback() { " (no template in the model: ChatML)" } else { "" }
    );
    if sess.engine.cfg.meta.synthetic {
        errln!("note: synthetic model (random weights): replies are noise. `cflow-tui pull smollm2` gets a real model.");
    }
    let stdin = std::io::stdin();
    let mut last: Option<GenOutcome> = None;
    loop {
        err!("\n> ");
        // Read bytes: a line that is not UTF-8 is refused, not the end of the conversation.
        let mut raw = Vec::new();
        if stdin.lock().read_until(b'\n', &mut raw)? == 0 {
            errln!();
            break;
        }
        let line = match String::from_utf8(raw) {
            Ok(l) => l,
            Err(e) => {
                errln!(
                    "(input ignored: not valid UTF-8 at byte {}; the conversation is kept)",
                    e.utf8_error().valid_up_to()
                );
                continue;
            }
        };
        let line = line.trim_end_matches(['\n', '\r']).to_string();
        if line.is_empty() {
            continue;
        }
        if line == "/quit" || line == "/exit" {
            break;
        }
        if line == "/reset" {
            conv.clear();
            sess.reset();
            errln!("(context cleared)");
            continue;
        }
        if let Some(sys) = line.strip_prefix("/system") {
            let sys = sys.trim();
            conv.system = if sys.is_empty() {
                None
            } else {
                Some(sys.to_string())
            };
            errln!(
                "(system prompt {})",
                if sys.is_empty() { "cleared" } else { "set" }
            );
            continue;
        }
        if line == "/stats" {
            match &last {
                Some(o) => errln!(
                    "last reply: {} tokens, prefill {:.1} tok/s ({} tokens), decode {:.1} tok/s; context {}/{}",
                    o.tokens.len(), o.prefill_tok_s(), o.prompt_tokens, o.decode_tok_s(), sess.engine.pos(), sess.engine.cfg.max_ctx
                ),
                None => errln!("no reply yet; context {}/{}", sess.engine.pos(), sess.engine.cfg.max_ctx),
            }
            continue;
        }
        if line.starts_with('/') {
            errln!("unknown command {line}; known: /reset, /system TEXT, /stats, /quit");
            continue;
        }
        // A template exception or limit, or a tokenizer error, refuses this message and keeps
        // the conversation as it was (including turns `fit` would have dropped).
        let kept = conv.turns.clone();
        conv.turns.push(crate::chat::template::ChatMessage::new(
            "user",
            line.clone(),
        ));
        let max_ctx = sess.engine.cfg.max_ctx;
        let prepared = (|| -> Result<(usize, Vec<u32>), String> {
            let tok = sess.tok.as_ref().ok_or("no tokenizer")?;
            let count = |s: &str| tok.encode(s, false).map_or(s.len(), |v| v.len());
            let dropped = conv
                .fit(max_ctx, a.n.min(max_ctx / 2), &count)
                .map_err(|e| format!("chat template: {e}"))?;
            let prompt = conv.render().map_err(|e| format!("chat template: {e}"))?;
            let ids = tok
                .encode(&prompt, false)
                .map_err(|e| format!("tokenizer: {e}"))?;
            Ok((dropped, ids))
        })();
        let (dropped, ids) = match prepared {
            Ok(x) => x,
            Err(e) => {
                conv.turns = kept;
                errln!("error: {e}\n(message not sent; the conversation is kept)");
                continue;
            }
        };
        if dropped > 0 {
            errln!("(context full: dropped the {dropped} oldest messages)");
        }
        let suffix = sess.sync_prompt(&ids);
        if let Some(t) = tap.as_mut() {
            t.emit(Event::Prompt {
                text: line.clone(),
                tokens: suffix.clone(),
                chat: true,
            });
        }
        interrupted.store(false, std::sync::atomic::Ordering::Relaxed);
        let room = max_ctx.saturating_sub(sess.engine.pos() + suffix.len());
        let stdout = std::io::stdout();
        let out = sess.generate(&suffix, a.n.min(room), true, &mut |e| {
            if let Some(t) = tap.as_mut() {
                t.emit(e.clone());
            }
            if let Event::Token { text, .. } = &e {
                // Model-controlled text: control characters are shown escaped on a terminal.
                let text = if std::io::IsTerminal::is_terminal(&stdout) {
                    crate::console::escape(text)
                } else {
                    text.into()
                };
                let mut o = stdout.lock();
                let _ = o.write_all(text.as_bytes());
                let _ = o.flush();
            }
        });
        outln!()?;
        if out.reason == Some(crate::telemetry::StopReason::Stopped) {
            errln!("(stopped)");
        }
        if let Some(e) = &out.error {
            errln!("error: {e}");
        }
        conv.turns.push(crate::chat::template::ChatMessage::new(
            "assistant",
            out.text.clone(),
        ));
        last = Some(out);
    }
    Ok(())
}
