//! Tolerant trace reader and trace summary.
//!
//! [`Replay::open`] reads a JSON Lines trace written by [`super::recorder::Recorder`]:
//! * empty file, wrong `format`, a newer MAJOR `version`, or an unreadable header → error;
//! * a corrupt line N (complete, newline-terminated, not a valid event) → error naming line N;
//! * a truncated last line (no trailing newline, does not parse — the writer crashed mid-line) →
//!   replayed up to the previous line, with a warning;
//! * event kinds this build does not know (newer minor versions) → skipped and counted;
//! * lines longer than [`MAX_LINE_BYTES`] → error naming the line, memory stays bounded.
//!
//! [`summary`] condenses a replay into a [`ReplaySummary`] (serde + `Display`).

use super::event::{EngineConfigInfo, Event, Stamped, StopReason};
use super::recorder::{TraceError, TraceHeader, TRACE_FORMAT, TRACE_MAJOR};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::io::{BufRead, BufReader};
use std::path::Path;

/// Longest accepted line (a Stats line of a 100-layer model is ~30 KiB).
pub const MAX_LINE_BYTES: usize = 16 << 20;

/// Event kinds known to this build (the `kind` tag of [`Event`]).
pub const KNOWN_KINDS: [&str; 13] = [
    "session", "prompt", "prefill", "token", "stats", "config", "done", "reset", "snapshot",
    "notice", "error", "settings", "history",
];

/// A loaded trace.
#[derive(Clone, Debug)]
pub struct Replay {
    pub header: TraceHeader,
    pub events: Vec<Stamped>,
    /// Non-fatal problems (truncated last line, …), human-readable.
    pub warnings: Vec<String>,
    /// Unknown event kinds skipped, by kind.
    pub skipped: BTreeMap<String, u64>,
    /// Lines read, header included.
    pub lines: u64,
}

enum Line {
    /// A complete line (newline stripped).
    Full(Vec<u8>),
    /// Last line without a trailing newline.
    Partial(Vec<u8>),
    Eof,
}

/// Read one line of at most `cap` bytes; longer lines are an error (the rest is not buffered).
fn read_line_capped<R: BufRead>(r: &mut R, cap: usize) -> std::io::Result<Option<Line>> {
    let mut buf = Vec::new();
    loop {
        let avail = match r.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if avail.is_empty() {
            return Ok(Some(if buf.is_empty() {
                Line::Eof
            } else {
                Line::Partial(buf)
            }));
        }
        let (take, done) = match avail.iter().position(|&b| b == b'\n') {
            Some(i) => (i, true),
            None => (avail.len(), false),
        };
        if buf.len() + take > cap {
            return Ok(None);
        }
        buf.extend_from_slice(&avail[..take]);
        r.consume(if done { take + 1 } else { take });
        if done {
            if buf.last() == Some(&b'\r') {
                buf.pop();
            }
            return Ok(Some(Line::Full(buf)));
        }
    }
}

fn major_of(version: &str) -> Option<u32> {
    version.split('.').next()?.trim().parse().ok()
}

impl Replay {
    /// Open and fully read a trace file.
    pub fn open(path: impl AsRef<Path>) -> Result<Replay, TraceError> {
        let path = path.as_ref();
        let (f, _) = crate::input::open_regular(path).map_err(|e| TraceError::Io {
            path: path.display().to_string(),
            source: e,
        })?;
        Self::from_reader(
            BufReader::with_capacity(256 << 10, f),
            &path.display().to_string(),
        )
    }

    /// Read a trace from any buffered reader; `name` is used in messages.
    pub fn from_reader<R: BufRead>(mut r: R, name: &str) -> Result<Replay, TraceError> {
        Self::from_reader_capped(&mut r, name, MAX_LINE_BYTES)
    }

    /// As [`from_reader`](Self::from_reader) with an explicit line cap.
    pub fn from_reader_capped<R: BufRead>(
        r: &mut R,
        name: &str,
        cap: usize,
    ) -> Result<Replay, TraceError> {
        let path = name.to_string();
        let corrupt = |line: u64, message: String| TraceError::Corrupt {
            path: path.clone(),
            line,
            message,
        };
        let mut lineno = 0u64;
        let mut next = |lineno: &mut u64| -> Result<Line, TraceError> {
            loop {
                *lineno += 1;
                match read_line_capped(r, cap) {
                    Err(e) => {
                        return Err(TraceError::Io {
                            path: path.clone(),
                            source: e,
                        })
                    }
                    Ok(None) => {
                        return Err(TraceError::LineTooLong {
                            path: path.clone(),
                            line: *lineno,
                            limit: cap,
                        })
                    }
                    Ok(Some(Line::Full(b))) if b.iter().all(u8::is_ascii_whitespace) => continue,
                    Ok(Some(l)) => return Ok(l),
                }
            }
        };

        // Header.
        let (hdr_bytes, hdr_partial) = match next(&mut lineno)? {
            Line::Eof => return Err(TraceError::Empty { path: path.clone() }),
            Line::Full(b) => (b, false),
            Line::Partial(b) => (b, true),
        };
        let hv: serde_json::Value = serde_json::from_slice(&hdr_bytes).map_err(|e| {
            corrupt(
                lineno,
                if hdr_partial {
                    format!("truncated trace header: {e}")
                } else {
                    format!("invalid trace header (not JSON): {e}")
                },
            )
        })?;
        let format = hv.get("format").and_then(|v| v.as_str()).unwrap_or("");
        if format != TRACE_FORMAT {
            return Err(TraceError::WrongFormat {
                path: path.clone(),
                found: if format.is_empty() {
                    "<missing>".into()
                } else {
                    format.into()
                },
            });
        }
        let version = hv
            .get("version")
            .and_then(|v| v.as_str())
            .unwrap_or("")
            .to_string();
        match major_of(&version) {
            None => {
                return Err(corrupt(
                    lineno,
                    format!("invalid trace version {version:?} (expected \"MAJOR.MINOR\")"),
                ))
            }
            Some(m) if m > TRACE_MAJOR => {
                return Err(TraceError::UnsupportedVersion {
                    path: path.clone(),
                    found: version,
                    supported: TRACE_MAJOR,
                })
            }
            Some(_) => {}
        }
        let header: TraceHeader = serde_json::from_value(hv)
            .map_err(|e| corrupt(lineno, format!("invalid trace header: {e}")))?;

        let mut rep = Replay {
            header,
            events: Vec::new(),
            warnings: Vec::new(),
            skipped: BTreeMap::new(),
            lines: lineno,
        };
        loop {
            let (bytes, partial) = match next(&mut lineno)? {
                Line::Eof => break,
                Line::Full(b) => (b, false),
                Line::Partial(b) => (b, true),
            };
            rep.lines = lineno;
            let v: serde_json::Value = match serde_json::from_slice(&bytes) {
                Ok(v) => v,
                Err(_) if partial => {
                    rep.warnings.push(format!(
                        "line {lineno}: truncated last line ({} bytes) ignored; replayed {} events",
                        bytes.len(),
                        rep.events.len()
                    ));
                    break;
                }
                Err(e) => return Err(corrupt(lineno, format!("not valid JSON: {e}"))),
            };
            let kind = match v.get("kind").and_then(|k| k.as_str()) {
                Some(k) => k.to_string(),
                None => return Err(corrupt(lineno, "event without a \"kind\" string".into())),
            };
            if !KNOWN_KINDS.contains(&kind.as_str()) {
                *rep.skipped.entry(kind).or_default() += 1;
                continue;
            }
            let ev: Stamped = serde_json::from_value(v)
                .map_err(|e| corrupt(lineno, format!("invalid {kind:?} event: {e}")))?;
            rep.events.push(ev);
        }
        let n_skipped: u64 = rep.skipped.values().sum();
        if n_skipped > 0 {
            let kinds: Vec<_> = rep.skipped.keys().map(String::as_str).collect();
            rep.warnings.push(format!(
                "skipped {n_skipped} events of unknown kinds ({}) — trace written by a newer \
                 version ({})",
                kinds.join(", "),
                rep.header.version
            ));
        }
        Ok(rep)
    }

    /// The events in order.
    pub fn iter(&self) -> std::slice::Iter<'_, Stamped> {
        self.events.iter()
    }
}

impl<'a> IntoIterator for &'a Replay {
    type Item = &'a Stamped;
    type IntoIter = std::slice::Iter<'a, Stamped>;
    fn into_iter(self) -> Self::IntoIter {
        self.events.iter()
    }
}

/// Mean modelled MiB read per token, by stream.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct StreamMib {
    /// JSON names as in `run --json` and `inspect --json` (docs/JSON.md).
    #[serde(rename = "attention")]
    pub attn: f64,
    pub dense: f64,
    pub experts: f64,
    #[serde(alias = "vocab")]
    pub lm_head: f64,
    pub total: f64,
}

/// One configuration change seen in the trace.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ToggleChange {
    pub t_ns: u64,
    /// Tokens (Token events) seen before the change took effect.
    pub after_tokens: u32,
    /// "field: old → new" for each changed field.
    pub changes: Vec<String>,
    pub config: EngineConfigInfo,
}

/// PMU totals over all Stats events.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct PmuTotals {
    pub tokens_with_pmu: u32,
    /// Reason hardware counters were unavailable (last one seen).
    pub unavailable: Option<String>,
    /// Phase → counter → total.
    pub phases: BTreeMap<String, BTreeMap<String, u64>>,
    /// Software counter → total.
    pub software: BTreeMap<String, u64>,
}

/// Condensed view of a trace.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ReplaySummary {
    /// The model's name (`name`, as in `inspect --json`; `model` is a file path elsewhere).
    #[serde(rename = "name")]
    pub model: String,
    pub synthetic: bool,
    pub created: String,
    pub version: String,
    pub n_events: u64,
    /// Events by kind.
    pub event_counts: BTreeMap<String, u64>,
    pub skipped_unknown: BTreeMap<String, u64>,
    pub warnings: Vec<String>,
    /// Activations of the quantized matvecs (`q8` / `f32`) and the KV cache type (`f32` /
    /// `f16`), from the trace's latest `Settings` event (None for traces without one).
    pub act: Option<String>,
    pub kv: Option<String>,
    /// The generated token ids (`tokens` in every JSON output, docs/JSON.md).
    #[serde(rename = "tokens")]
    pub token_ids: Vec<u32>,
    pub text: String,
    pub n_stats: u32,
    /// Decode throughput: Σ Done.n_tokens / Σ Done.decode_ns, else 1 / mean Stats.ns_total.
    pub decode_tok_s: Option<f64>,
    /// Mean Stats.ns_total in ms.
    pub mean_token_ms: Option<f64>,
    pub prefill_tok_s: Option<f64>,
    pub mib_per_token: StreamMib,
    /// routing[layer][expert] = number of tokens routed there.
    pub routing: Vec<Vec<u64>>,
    pub toggles: Vec<ToggleChange>,
    pub pmu: PmuTotals,
    pub stop_reasons: Vec<StopReason>,
    pub errors: Vec<String>,
}

fn config_diff(a: &EngineConfigInfo, b: &EngineConfigInfo) -> Vec<String> {
    let mut v = Vec::new();
    let mut d = |name: &str, x: String, y: String| {
        if x != y {
            v.push(format!("{name}: {x} → {y}"));
        }
    };
    d("threads", a.threads.to_string(), b.threads.to_string());
    d("isa", a.isa.clone(), b.isa.clone());
    d("prefetch", a.prefetch.to_string(), b.prefetch.to_string());
    d("fetch", a.fetch.to_string(), b.fetch.to_string());
    d(
        "expert_tier",
        a.expert_tier.to_string(),
        b.expert_tier.to_string(),
    );
    d("layout", a.layout.to_string(), b.layout.to_string());
    d("notes", a.notes.join("; "), b.notes.join("; "));
    v
}

/// Summarize a replay.
pub fn summary(r: &Replay) -> ReplaySummary {
    use crate::util::MIB;
    let mut s = ReplaySummary {
        model: r.header.model.name.clone(),
        synthetic: r.header.model.synthetic,
        created: r.header.created.clone(),
        version: r.header.version.clone(),
        n_events: r.events.len() as u64,
        skipped_unknown: r.skipped.clone(),
        warnings: r.warnings.clone(),
        ..Default::default()
    };
    let n_exp = r.header.model.n_experts as usize;
    let mut cfg = r.header.config.clone();
    let (mut done_tok, mut done_ns) = (0u64, 0u64);
    let (mut pre_tok, mut pre_ns) = (0u64, 0u64);
    let mut sum_ns = 0u64;
    let mut bytes = [0u64; 4];
    for ev in r {
        let kind = match &ev.event {
            Event::Session { config, .. } => {
                cfg = config.clone();
                "session"
            }
            Event::Prompt { .. } => "prompt",
            Event::Prefill { n_tokens, ns } => {
                pre_tok += *n_tokens as u64;
                pre_ns += ns;
                "prefill"
            }
            Event::Token { id, text, .. } => {
                s.token_ids.push(*id);
                s.text.push_str(text);
                "token"
            }
            Event::Stats(st) => {
                s.n_stats += 1;
                sum_ns += st.ns_total;
                bytes[3] += st.lm_head_bytes;
                if s.routing.len() < st.layers.len() {
                    s.routing.resize(st.layers.len(), vec![0; n_exp]);
                }
                for (l, layer) in st.layers.iter().enumerate() {
                    bytes[0] += layer.bytes.attn;
                    bytes[1] += layer.bytes.dense;
                    bytes[2] += layer.bytes.experts;
                    for &(e, _) in &layer.routing {
                        let row = &mut s.routing[l];
                        if row.len() <= e as usize {
                            row.resize(e as usize + 1, 0);
                        }
                        row[e as usize] += 1;
                    }
                }
                if let Some(p) = &st.pmu {
                    s.pmu.tokens_with_pmu += 1;
                    if p.unavailable.is_some() {
                        s.pmu.unavailable.clone_from(&p.unavailable);
                    }
                    for (ph, vals) in &p.phases {
                        let e = s.pmu.phases.entry(ph.clone()).or_default();
                        for (k, v) in vals {
                            *e.entry(k.clone()).or_default() += v;
                        }
                    }
                    for (k, v) in &p.software {
                        *s.pmu.software.entry(k.clone()).or_default() += v;
                    }
                }
                "stats"
            }
            Event::Config(c) => {
                s.toggles.push(ToggleChange {
                    t_ns: ev.t_ns,
                    after_tokens: s.token_ids.len() as u32,
                    changes: config_diff(&cfg, c),
                    config: c.clone(),
                });
                cfg = c.clone();
                "config"
            }
            Event::Done {
                reason,
                n_tokens,
                decode_ns,
                ..
            } => {
                s.stop_reasons.push(*reason);
                done_tok += *n_tokens as u64;
                done_ns += decode_ns;
                "done"
            }
            Event::Reset => "reset",
            Event::Snapshot { .. } => "snapshot",
            Event::Notice { .. } => "notice",
            Event::Settings(g) => {
                s.act = Some(g.act.clone());
                s.kv = Some(g.kv.clone());
                "settings"
            }
            Event::History { .. } => "history",
            Event::Error { message, fatal } => {
                s.errors.push(if *fatal {
                    format!("fatal: {message}")
                } else {
                    message.clone()
                });
                "error"
            }
        };
        *s.event_counts.entry(kind.to_string()).or_default() += 1;
    }
    if s.n_stats > 0 {
        let n = s.n_stats as f64;
        s.mean_token_ms = Some(sum_ns as f64 / n / 1e6);
        let m = StreamMib {
            attn: bytes[0] as f64 / n / MIB,
            dense: bytes[1] as f64 / n / MIB,
            experts: bytes[2] as f64 / n / MIB,
            lm_head: bytes[3] as f64 / n / MIB,
            total: 0.0,
        };
        s.mib_per_token = StreamMib {
            total: m.attn + m.dense + m.experts + m.lm_head,
            ..m
        };
    }
    // No rate from zero or one token (`stats::MIN_RATE_TOKENS`).
    s.decode_tok_s = crate::stats::tok_per_s(done_tok, done_ns)
        .or_else(|| crate::stats::tok_per_s(s.n_stats as u64, sum_ns));
    s.prefill_tok_s = crate::stats::tok_per_s(pre_tok, pre_ns);
    s
}

/// "task-clock 4.0 ms" for the ns counter, "name value" otherwise.
fn counter_text(k: &str, v: u64) -> String {
    if k == "task-clock" {
        format!("{k} {:.1} ms", v as f64 / 1e6)
    } else {
        format!("{k} {v}")
    }
}

impl fmt::Display for ReplaySummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "trace v{} · {}{} · recorded {}",
            self.version,
            self.model,
            if self.synthetic {
                " (synthetic weights: text is noise)"
            } else {
                ""
            },
            self.created
        )?;
        let counts: Vec<String> = self
            .event_counts
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        writeln!(f, "events  {} ({})", self.n_events, counts.join(", "))?;
        if let (Some(a), Some(k)) = (&self.act, &self.kv) {
            writeln!(f, "numerics act {a} · kv {k}")?;
        }
        for (k, v) in &self.skipped_unknown {
            writeln!(f, "skipped {v} unknown {k:?} events")?;
        }
        for w in &self.warnings {
            writeln!(f, "warning {w}")?;
        }
        let opt = |x: Option<f64>, unit: &str| match x {
            Some(v) => format!("{v:.1} {unit}"),
            None => "n/a".into(),
        };
        writeln!(
            f,
            "tokens  {} · decode {} · {} per token · prefill {}",
            self.token_ids.len(),
            opt(self.decode_tok_s, "tok/s"),
            opt(self.mean_token_ms, "ms"),
            opt(self.prefill_tok_s, "tok/s")
        )?;
        let m = &self.mib_per_token;
        writeln!(
            f,
            "MiB/tok attn {:.2} · dense {:.2} · experts {:.2} · lm head {:.2} · total {:.2}",
            m.attn, m.dense, m.experts, m.lm_head, m.total
        )?;
        if !self.text.is_empty() {
            let mut t: String = self.text.chars().take(200).collect();
            if self.text.chars().count() > 200 {
                t.push('…');
            }
            writeln!(f, "text    {t:?}")?;
        }
        if self.routing.iter().any(|r| r.iter().any(|&c| c > 0)) {
            writeln!(f, "routing (layer × expert token counts)")?;
            let n_exp = self.routing.iter().map(Vec::len).max().unwrap_or(0);
            let head: Vec<String> = (0..n_exp)
                .map(|e| format!("{:>5}", format!("E{e}")))
                .collect();
            writeln!(f, "      {}", head.join(""))?;
            for (l, row) in self.routing.iter().enumerate() {
                let cells: Vec<String> = row.iter().map(|c| format!("{c:>5}")).collect();
                writeln!(f, "  L{l:<3}{}", cells.join(""))?;
            }
        }
        for t in &self.toggles {
            writeln!(
                f,
                "toggle  at {:.3} s after {} tokens: {}",
                t.t_ns as f64 / 1e9,
                t.after_tokens,
                if t.changes.is_empty() {
                    "(no change)".to_string()
                } else {
                    t.changes.join(", ")
                }
            )?;
        }
        let p = &self.pmu;
        if p.tokens_with_pmu > 0 {
            if let Some(u) = &p.unavailable {
                writeln!(f, "pmu     hardware unavailable: {u}")?;
            }
            let sw: Vec<String> = p
                .software
                .iter()
                .map(|(k, v)| counter_text(k, *v))
                .collect();
            writeln!(
                f,
                "pmu     {} tokens · software: {}",
                p.tokens_with_pmu,
                sw.join(", ")
            )?;
            for (ph, vals) in &p.phases {
                let v: Vec<String> = vals.iter().map(|(k, v)| counter_text(k, *v)).collect();
                writeln!(f, "  {ph:<10} {}", v.join(", "))?;
            }
        } else {
            writeln!(f, "pmu     no samples")?;
        }
        for e in &self.errors {
            writeln!(f, "error   {e}")?;
        }
        Ok(())
    }
}
