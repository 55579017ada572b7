//! The Markdown transcript of a chat (the TUI's Ctrl+S, `--transcript FILE` to continue it):
//! the format, its writer and its validating parser.
//!
//! ```text
//! # cflow-tui transcript
//!
//! - model: SmolLM2-135M-Instruct
//! - sampling: temp 0.7 top-k 40 top-p 0.95 min-p 0.05 rep 1.1 seed 0
//!
//! ## system
//!
//! You are a pirate.
//!
//! ## user
//!
//! Hello
//!
//! ## assistant · prompt 23 tok · prefill 610 tok/s · 12 tok · decode 85.1 tok/s · …
//!
//! Arr!
//! ```
//!
//! A body line that would read as a heading (`#…`, after any backslashes) gets one more leading
//! backslash, so any text round-trips. The parser accepts an optional `## system` first, then
//! `## user` / `## assistant` alternating from a user message; whatever follows ` · ` on an
//! assistant heading is the reply's summary line (kept, not interpreted). Anything else is an
//! error naming the line.

use std::path::Path;

/// The first line of every transcript.
pub const TITLE: &str = "# cflow-tui transcript";
/// Largest transcript file read back.
pub const MAX_BYTES: u64 = 16 << 20;

/// One user or assistant message.
#[derive(Clone, Debug, PartialEq)]
pub struct Message {
    /// "user" | "assistant".
    pub role: String,
    pub text: String,
    /// The reply's summary line (assistant messages), as written on its heading.
    pub summary: Option<String>,
}

/// A whole transcript.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Transcript {
    /// `- key: value` lines of the preamble (model, sampling, …), in order.
    pub meta: Vec<(String, String)>,
    /// System prompt ("" = none).
    pub system: String,
    pub messages: Vec<Message>,
}

/// Why a transcript cannot be read; names the line (1-based) when it is about one.
#[derive(Debug, thiserror::Error)]
pub enum TranscriptError {
    #[error("{path}: cannot read the transcript: {err}")]
    Io { path: String, err: std::io::Error },
    #[error("{path}: {bytes} bytes is larger than a transcript may be ({MAX_BYTES} bytes)")]
    TooLarge { path: String, bytes: u64 },
    #[error("{path}: not UTF-8 text")]
    NotText { path: String },
    /// A `- key: value` line of the preamble that cannot be used (e.g. `sampling`).
    #[error("{path}: `- {key}:` {msg}")]
    BadMeta {
        path: String,
        key: String,
        msg: String,
    },
    #[error("{path}: line {line}: {msg}")]
    Malformed {
        path: String,
        line: usize,
        msg: String,
    },
}

fn escape(line: &str) -> String {
    if line.trim_start_matches('\\').starts_with('#') {
        format!("\\{line}")
    } else {
        line.to_string()
    }
}

fn unescape(line: &str) -> &str {
    if line.starts_with('\\') && line.trim_start_matches('\\').starts_with('#') {
        &line[1..]
    } else {
        line
    }
}

fn push_body(out: &mut String, text: &str) {
    for l in text.split('\n') {
        out.push_str(&escape(l));
        out.push('\n');
    }
}

impl Transcript {
    /// The Markdown text.
    pub fn to_markdown(&self) -> String {
        let mut out = format!("{TITLE}\n\n");
        for (k, v) in &self.meta {
            out.push_str(&format!("- {k}: {}\n", v.replace('\n', " ")));
        }
        if !self.system.is_empty() {
            out.push_str("\n## system\n\n");
            push_body(&mut out, &self.system);
        }
        for m in &self.messages {
            out.push_str(&format!("\n## {}", m.role));
            if let Some(s) = m.summary.as_ref().filter(|s| !s.is_empty()) {
                out.push_str(&format!(" · {}", s.replace('\n', " ")));
            }
            out.push_str("\n\n");
            push_body(&mut out, &m.text);
        }
        out
    }

    /// Parses `src` (named `path` in errors).
    pub fn parse(src: &str, path: &str) -> Result<Transcript, TranscriptError> {
        let bad = |line: usize, msg: String| TranscriptError::Malformed {
            path: path.to_string(),
            line,
            msg,
        };
        let src = src.strip_prefix('\u{feff}').unwrap_or(src);
        let lines: Vec<&str> = src.lines().collect();
        let first = lines.iter().position(|l| !l.trim().is_empty());
        match first {
            Some(i) if lines[i].trim_end() == TITLE => {}
            Some(i) => {
                return Err(bad(
                    i + 1,
                    format!("not a cflow-tui transcript (expected `{TITLE}`)"),
                ))
            }
            None => return Err(bad(1, "empty file: not a cflow-tui transcript".into())),
        }
        let mut t = Transcript::default();
        // (role, summary, heading line, body lines)
        let mut sections: Vec<(String, Option<String>, usize, Vec<&str>)> = Vec::new();
        for (i, &l) in lines.iter().enumerate().skip(first.unwrap_or(0) + 1) {
            let n = i + 1;
            if let Some(h) = l.strip_prefix("## ") {
                let (role, summary) = match h.split_once(" · ") {
                    Some((r, s)) => (r.trim(), Some(s.trim().to_string())),
                    None => (h.trim(), None),
                };
                if !matches!(role, "system" | "user" | "assistant") {
                    return Err(bad(
                        n,
                        format!("unknown section `## {role}` (expected system, user or assistant)"),
                    ));
                }
                sections.push((role.to_string(), summary, n, Vec::new()));
            } else if let Some(s) = sections.last_mut() {
                s.3.push(unescape(l));
            } else if l.starts_with('#') {
                return Err(bad(
                    n,
                    format!("unexpected heading `{l}` before the first section"),
                ));
            } else if let Some(kv) = l.strip_prefix("- ") {
                let Some((k, v)) = kv.split_once(": ") else {
                    return Err(bad(n, format!("expected `- key: value`, found `{l}`")));
                };
                t.meta.push((k.trim().to_string(), v.trim().to_string()));
            } else if !l.trim().is_empty() {
                return Err(bad(
                    n,
                    format!("unexpected text before the first section: `{l}`"),
                ));
            }
        }
        for (idx, (role, summary, n, mut body)) in sections.into_iter().enumerate() {
            while body.first().is_some_and(|l| l.is_empty()) {
                body.remove(0);
            }
            while body.last().is_some_and(|l| l.is_empty()) {
                body.pop();
            }
            let text = body.join("\n");
            if role == "system" {
                if idx != 0 {
                    return Err(bad(n, "`## system` must be the first section".into()));
                }
                t.system = text;
                continue;
            }
            let want = match t.messages.last() {
                None => "user",
                Some(m) if m.role == "user" => "assistant",
                Some(_) => "user",
            };
            if role != want {
                return Err(bad(
                    n,
                    format!("`## {role}` where `## {want}` must come (messages alternate, starting with the user)"),
                ));
            }
            if role == "user" && summary.is_some() {
                return Err(bad(
                    n,
                    "a summary (` · …`) belongs on assistant headings only".into(),
                ));
            }
            t.messages.push(Message {
                role,
                text,
                summary,
            });
        }
        Ok(t)
    }

    /// Reads and parses the transcript at `path`.
    pub fn load(path: &Path) -> Result<Transcript, TranscriptError> {
        use std::io::Read;
        let name = path.display().to_string();
        let io = |err| TranscriptError::Io {
            path: name.clone(),
            err,
        };
        let (f, meta) = crate::input::open_regular(path).map_err(io)?;
        if meta.is_dir() {
            return Err(io(std::io::Error::other("is a directory")));
        }
        let mut buf = Vec::new();
        f.take(MAX_BYTES + 1).read_to_end(&mut buf).map_err(io)?;
        if buf.len() as u64 > MAX_BYTES {
            return Err(TranscriptError::TooLarge {
                path: name,
                bytes: meta.len().max(buf.len() as u64),
            });
        }
        let src =
            String::from_utf8(buf).map_err(|_| TranscriptError::NotText { path: name.clone() })?;
        Transcript::parse(&src, &name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(role: &str, text: &str, summary: Option<&str>) -> Message {
        Message {
            role: role.into(),
            text: text.into(),
            summary: summary.map(String::from),
        }
    }

    fn sample() -> Transcript {
        Transcript {
            meta: vec![("model".into(), "SmolLM2".into())],
            system: "You are a pirate.\n## not a heading".into(),
            messages: vec![
                msg("user", "# hello\n\\# two\n\nbye", None),
                msg("assistant", "Arr!", Some("prompt 3 tok · decode 9.0 tok/s")),
                msg("user", "again", None),
                msg("assistant", "", None),
            ],
        }
    }

    #[test]
    fn round_trips_any_text() {
        let t = sample();
        let md = t.to_markdown();
        assert!(md.starts_with(TITLE), "{md}");
        assert!(md.contains("\n\\# hello\n\\\\# two\n"), "{md}");
        assert!(md.contains("## assistant · prompt 3 tok"), "{md}");
        assert_eq!(Transcript::parse(&md, "t.md").unwrap(), t);
    }

    #[test]
    fn malformed_transcripts_name_the_line() {
        let cases = [
            ("", "line 1: empty file"),
            ("hello\n", "line 1: not a cflow-tui transcript"),
            (
                "# cflow-tui transcript\n\n## bot\n\nx\n",
                "line 3: unknown section `## bot`",
            ),
            (
                "# cflow-tui transcript\n## assistant\nx\n",
                "line 2: `## assistant` where `## user`",
            ),
            (
                "# cflow-tui transcript\n## user\na\n## user\nb\n",
                "line 4: `## user` where `## assistant`",
            ),
            (
                "# cflow-tui transcript\n## user\na\n## system\nb\n",
                "line 4: `## system` must be the first",
            ),
            (
                "# cflow-tui transcript\nstray words\n",
                "line 2: unexpected text",
            ),
            (
                "# cflow-tui transcript\n- novalue\n",
                "line 2: expected `- key: value`",
            ),
            (
                "# cflow-tui transcript\n## user · x\na\n",
                "line 2: a summary",
            ),
        ];
        for (src, want) in cases {
            let e = Transcript::parse(src, "t.md").unwrap_err().to_string();
            assert!(e.starts_with("t.md: ") && e.contains(want), "{src:?}: {e}");
        }
    }

    #[test]
    fn load_refuses_binary_large_and_missing_files() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("bin.md");
        std::fs::write(&p, [0xffu8, 0xfe, 0x00]).unwrap();
        assert!(matches!(
            Transcript::load(&p),
            Err(TranscriptError::NotText { .. })
        ));
        let big = dir.path().join("big.md");
        let f = std::fs::File::create(&big).unwrap();
        f.set_len(MAX_BYTES + 1).unwrap();
        assert!(matches!(
            Transcript::load(&big),
            Err(TranscriptError::TooLarge { .. })
        ));
        let e = Transcript::load(&dir.path().join("none.md"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("none.md: cannot read the transcript"), "{e}");
        assert!(Transcript::load(dir.path()).is_err());
        let ok = dir.path().join("ok.md");
        std::fs::write(&ok, sample().to_markdown()).unwrap();
        assert_eq!(Transcript::load(&ok).unwrap(), sample());
    }
}
