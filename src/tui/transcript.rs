//! The TUI side of chat transcripts: the per-reply summary line (like `ollama run --verbose`,
//! from the engine-measured `Prompt`/`Prefill`/`Done` events), the conversation on screen as a
//! [`Transcript`], saving it (Ctrl+S) under a new name through `output.rs`, and the startup
//! commands that continue a saved one (`--transcript FILE`, `--system TEXT`).

use std::path::{Path, PathBuf};

use super::app::{App, Role};
use crate::chat::sampling::{parse_spec, spec, ChatStart};
use crate::chat::transcript::{Message, Transcript, TranscriptError};
use crate::output::Output;
use crate::telemetry::event::{Command, HistoryMessage};

/// What one reply cost, as the engine measured it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ReplyStats {
    /// Tokens fed for this turn (the new part of the rendered chat prompt).
    pub prompt_tokens: u32,
    pub prefill_ns: u64,
    /// Time to first token (the `Done` event's `ttft_ns`: prefill, then the first sampling);
    /// `None` when no token came or the trace predates the field.
    pub ttft_ns: Option<u64>,
    /// Tokens generated.
    pub tokens: u32,
    pub decode_ns: u64,
}

/// "85.1", or "—" from zero or one token (`stats::MIN_RATE_TOKENS`).
fn rate(n: u32, ns: u64) -> String {
    crate::stats::tok_per_s(n as u64, ns).map_or("—".into(), |r| format!("{r:.1}"))
}

impl ReplyStats {
    /// "prompt 23 tok · prefill 610.2 tok/s · TTFT 37.8 ms · 48 tok · decode 85.1 tok/s ·
    /// 11.75 ms/tok · total 0.60 s" (TTFT = time to first token, left out when unknown; total
    /// = prefill + decode).
    pub fn line(&self) -> String {
        let ms_tok = if self.tokens > 0 {
            format!("{:.2}", self.decode_ns as f64 / self.tokens as f64 / 1e6)
        } else {
            "—".into()
        };
        let ttft = self.ttft_ns.map_or(String::new(), |ns| {
            format!(" · TTFT {}", crate::stats::latency_text(ns))
        });
        format!(
            "prompt {} tok · prefill {} tok/s{ttft} · {} tok · decode {} tok/s · {ms_tok} ms/tok · total {:.2} s",
            self.prompt_tokens,
            rate(self.prompt_tokens, self.prefill_ns),
            self.tokens,
            rate(self.tokens, self.decode_ns),
            (self.prefill_ns + self.decode_ns) as f64 / 1e9
        )
    }
}

/// The conversation since the last context reset, as the model sees it: user and model turns
/// (with their summary lines), the system prompt and the sampling in force.
pub fn from_app(app: &App) -> Transcript {
    let mut t = Transcript::default();
    if let Some(m) = &app.live.model {
        t.meta.push(("model".into(), m.name.clone()));
    }
    if let Some(s) = &app.settings {
        // Exact, so `--transcript` restores it (see `startup_commands`).
        t.meta.push(("sampling".into(), spec(&s.sampling)));
        t.meta
            .push(("numerics".into(), format!("act {} · kv {}", s.act, s.kv)));
        t.system = s.system.clone();
    }
    let start = app.conv_start.min(app.transcript.len());
    for (i, turn) in app.transcript.iter().enumerate().skip(start) {
        match turn.role {
            Role::User => t.messages.push(Message {
                role: "user".into(),
                text: turn.text.clone(),
                summary: None,
            }),
            Role::Model => t.messages.push(Message {
                role: "assistant".into(),
                text: turn.text.clone(),
                summary: app.summaries.get(&i).cloned(),
            }),
            Role::System | Role::Error => {}
        }
    }
    t
}

/// Writes the transcript to a new `cflow-chat-YYYYMMDDTHHMMSSZ[-N].md` in `dir`: the name is
/// reserved with O_EXCL (nothing is ever replaced), then the content is written to a temporary
/// file and renamed over it, so the file is never seen half-written.
pub fn save_in(dir: &Path, t: &Transcript) -> Result<PathBuf, String> {
    use std::io::Write;
    let stamp = crate::telemetry::recorder::basic_utc(std::time::SystemTime::now());
    for n in 1u32..10_000 {
        let name = if n == 1 {
            format!("cflow-chat-{stamp}.md")
        } else {
            format!("cflow-chat-{stamp}-{n}.md")
        };
        let path = dir.join(name);
        match Output::create_new(&path) {
            Ok(reserved) => {
                reserved.commit().map_err(|e| e.to_string())?;
                let mut out = Output::create(&path, &[]).map_err(|e| e.to_string())?;
                out.write_all(t.to_markdown().as_bytes())
                    .map_err(|e| e.to_string())?;
                out.commit().map_err(|e| e.to_string())?;
                return Ok(path);
            }
            Err(e) if e.io_kind() == Some(std::io::ErrorKind::AlreadyExists) => continue,
            Err(e) => return Err(e.to_string()),
        }
    }
    Err(format!(
        "{}: every name for this second is taken",
        dir.join(format!("cflow-chat-{stamp}-*.md")).display()
    ))
}

/// The commands the TUI sends before the first prompt: the loaded transcript (system prompt and
/// messages, then the sampling it recorded, under any sampling flag given, which wins), then
/// `--system` (which wins over the transcript's).
pub fn startup_commands(a: &ChatStart) -> Result<Vec<Command>, TranscriptError> {
    let mut out = Vec::new();
    if let Some(p) = &a.transcript {
        let t = Transcript::load(p)?;
        let sampling = match t.meta.iter().rev().find(|(k, _)| k == "sampling") {
            Some((k, v)) => {
                let bad = |msg: String| TranscriptError::BadMeta {
                    path: p.display().to_string(),
                    key: k.clone(),
                    msg,
                };
                let recorded = parse_spec(v).map_err(|e| bad(e.to_string()))?;
                Some(a.sampling.over(recorded).map_err(|e| bad(e.to_string()))?)
            }
            None => None,
        };
        out.push(Command::LoadConversation {
            system: t.system,
            messages: t
                .messages
                .into_iter()
                .map(|m| HistoryMessage {
                    role: m.role,
                    text: m.text,
                })
                .collect(),
        });
        if let Some(sp) = sampling {
            out.push(Command::SetSampling(sp));
        }
    }
    if let Some(s) = &a.system {
        out.push(Command::SetSystemPrompt(s.clone()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_line_by_hand() {
        let s = ReplyStats {
            prompt_tokens: 20,
            prefill_ns: 40_000_000,
            ttft_ns: Some(40_120_000),
            tokens: 50,
            decode_ns: 500_000_000,
        };
        assert_eq!(
            s.line(),
            "prompt 20 tok · prefill 500.0 tok/s · TTFT 40.1 ms · 50 tok · decode 100.0 tok/s · 10.00 ms/tok · total 0.54 s"
        );
        // A trace from before the field: no TTFT, the rest unchanged.
        let old = ReplyStats { ttft_ns: None, ..s };
        assert_eq!(
            old.line(),
            "prompt 20 tok · prefill 500.0 tok/s · 50 tok · decode 100.0 tok/s · 10.00 ms/tok · total 0.54 s"
        );
        let none = ReplyStats::default();
        assert!(
            none.line().contains("decode — tok/s · — ms/tok"),
            "{}",
            none.line()
        );
    }

    #[test]
    fn save_never_replaces_and_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let t = Transcript {
            system: "sys".into(),
            messages: vec![Message {
                role: "user".into(),
                text: "hi".into(),
                summary: None,
            }],
            ..Default::default()
        };
        let a = save_in(dir.path(), &t).unwrap();
        let b = save_in(dir.path(), &t).unwrap();
        assert_ne!(a, b);
        assert_eq!(Transcript::load(&a).unwrap(), t);
        assert_eq!(Transcript::load(&b).unwrap(), t);
        let e = save_in(&dir.path().join("missing"), &t).unwrap_err();
        assert!(e.contains("missing"), "{e}");
    }

    /// Continuing a saved chat: the sampling a transcript recorded is restored
    /// on load, a sampling flag given with `--transcript` wins for its field, and a bad line is
    /// an error naming the file and the key.
    #[test]
    fn startup_restores_the_recorded_sampling_under_the_flags() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.md");
        let recorded = crate::telemetry::SamplingParams {
            temperature: 0.35,
            top_k: 12,
            top_p: 0.8,
            min_p: 0.1,
            repeat_penalty: 1.2,
            seed: 42,
        };
        let t = Transcript {
            meta: vec![("sampling".into(), spec(&recorded))],
            messages: vec![Message {
                role: "user".into(),
                text: "hi".into(),
                summary: None,
            }],
            ..Default::default()
        };
        std::fs::write(&p, t.to_markdown()).unwrap();
        let mut a = ChatStart {
            transcript: Some(p.clone()),
            ..Default::default()
        };
        let c = startup_commands(&a).unwrap();
        assert_eq!(
            c.get(1),
            Some(&Command::SetSampling(recorded.clone())),
            "{c:?}"
        );
        a.sampling.seed = Some(7);
        let c = startup_commands(&a).unwrap();
        let want = crate::telemetry::SamplingParams {
            seed: 7,
            ..recorded
        };
        assert_eq!(c.get(1), Some(&Command::SetSampling(want)), "{c:?}");
        std::fs::write(
            &p,
            "# cflow-tui transcript\n\n- sampling: temp hot\n\n## user\n\nhi\n",
        )
        .unwrap();
        let e = startup_commands(&a).unwrap_err().to_string();
        assert!(
            e.contains("t.md: `- sampling:`") && e.contains("not a number"),
            "{e}"
        );
    }

    #[test]
    fn startup_loads_then_applies_the_system_flag() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.md");
        std::fs::write(
            &p,
            "# cflow-tui transcript\n\n## system\n\nold\n\n## user\n\nhi\n\n## assistant · x\n\nyo\n",
        )
        .unwrap();
        let a = ChatStart {
            transcript: Some(p.clone()),
            system: Some("new".into()),
            ..Default::default()
        };
        let c = startup_commands(&a).unwrap();
        assert_eq!(
            c,
            vec![
                Command::LoadConversation {
                    system: "old".into(),
                    messages: vec![
                        HistoryMessage {
                            role: "user".into(),
                            text: "hi".into()
                        },
                        HistoryMessage {
                            role: "assistant".into(),
                            text: "yo".into()
                        }
                    ]
                },
                Command::SetSystemPrompt("new".into())
            ]
        );
        std::fs::write(&p, "## user\nhi\n").unwrap();
        let e = startup_commands(&a).unwrap_err().to_string();
        assert!(
            e.contains("t.md: line 1: not a cflow-tui transcript"),
            "{e}"
        );
    }
}
