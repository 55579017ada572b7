//! Status bar (top: model, quant, threads, ISA, toggles, REC / REPLAY / FROZEN badges) and the
//! footer (decode / prefill tok/s, context gauge, a one-line A/B summary or the latest message,
//! and key hints generated from the keymap).

use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use ratatui::Frame;

use super::app::{fmt_speed, App};
use super::common::{times, truncate};
use super::keymap::footer_hints;
use crate::telemetry::ab::Verdict;

fn width(spans: &[Span]) -> usize {
    spans.iter().map(|s| s.content.chars().count()).sum()
}

/// Render the one-line status bar.
pub fn render_top(frame: &mut Frame, area: Rect, app: &App) {
    let th = &app.theme;
    let v = &app.live;
    let sep = || Span::styled(" │ ", th.bar());
    let compact = (area.width as usize) < 120;
    let mut spans = vec![Span::styled(
        " cflow-tui",
        th.bar().add_modifier(ratatui::style::Modifier::BOLD),
    )];
    // Badges come first so they survive truncation on narrow terminals.
    let mut badges: Vec<Span> = Vec::new();
    if app.recording {
        badges.push(Span::styled(" ", th.bar()));
        badges.push(Span::styled("● REC", th.bar().patch(th.bad())));
    }
    if let Some(r) = &app.replay {
        badges.push(Span::styled(" ", th.bar()));
        badges.push(Span::styled(
            format!(
                " REPLAY {} {} t={:.1}s ",
                if r.paused { "⏸" } else { "▶" },
                fmt_speed(r.speed),
                r.t_ns as f64 / 1e9
            ),
            th.badge(),
        ));
    }
    if app.frozen.is_some() {
        badges.push(Span::styled(" ", th.bar()));
        badges.push(Span::styled(" FROZEN ", th.badge()));
    }
    if app.whatif.is_some() {
        badges.push(Span::styled(" ", th.bar()));
        badges.push(Span::styled(" WHAT-IF ", th.badge()));
    }
    if !app.mouse_captured && app.replay.is_none() {
        badges.push(Span::styled(" ", th.bar()));
        badges.push(Span::styled(" MOUSE OFF ", th.badge()));
    }
    spans.extend(badges);
    match &v.model {
        Some(m) if compact => {
            spans.push(Span::styled(
                format!(" · {}", truncate(&m.name, 16)),
                th.bar(),
            ));
            if m.synthetic {
                spans.push(Span::styled(" (synthetic)", th.bar()));
            }
            if let Some(q) = m.quant_types.first() {
                spans.push(Span::styled(format!(" · {q}"), th.bar()));
            }
        }
        Some(m) => {
            let mut name = format!(" · {}", m.name);
            if !m.arch.is_empty() && m.arch != m.name {
                name.push_str(&format!(" {}", m.arch));
            }
            spans.push(Span::styled(name, th.bar()));
            if m.synthetic {
                spans.push(Span::styled(" (synthetic weights)", th.bar()));
            }
            if !m.quant_types.is_empty() {
                spans.push(Span::styled(
                    format!(" · {}", m.quant_types.join("/")),
                    th.bar(),
                ));
            }
        }
        None => spans.push(Span::styled(" · no session", th.bar())),
    }
    // A chat model's numerics and sampling come before the engine toggles (they change the
    // answers; the toggles only the speed), so they survive truncation.
    let chat_first = app.chat_mode();
    if chat_first {
        spans.extend(settings_spans(app, compact));
    }
    if let Some(c) = &v.config {
        let onoff = if c.prefetch { "ON" } else { "OFF" };
        if compact {
            spans.push(Span::styled(
                format!(" · {}t {}", c.threads, c.isa),
                th.bar(),
            ));
            spans.push(sep());
            spans.push(Span::styled(
                format!(
                    "pf {onoff} · {} · {} · {}",
                    c.fetch, c.layout, c.expert_tier
                ),
                th.bar(),
            ));
        } else {
            spans.push(Span::styled(
                format!(" · {} thr · {}", c.threads, c.isa),
                th.bar(),
            ));
            spans.push(sep());
            spans.push(Span::styled(format!("prefetch {onoff}"), th.bar()));
            spans.push(sep());
            spans.push(Span::styled(
                format!("fetch {}", c.fetch.to_uppercase()),
                th.bar(),
            ));
            spans.push(sep());
            spans.push(Span::styled(format!("layout {}", c.layout), th.bar()));
            spans.push(sep());
            spans.push(Span::styled(format!("tier {}", c.expert_tier), th.bar()));
        }
    }
    if !chat_first {
        spans.extend(settings_spans(app, compact));
    }
    let used = width(&spans);
    if used < area.width as usize {
        spans.push(Span::styled(
            " ".repeat(area.width as usize - used),
            th.bar(),
        ));
    }
    frame.render_widget(Paragraph::new(Line::from(spans)), area);
}

/// Numerics and sampling: " │ act f32 kv f32 │ T0.7 k40 p0.95 m0.05 r1.1 s0" (compact: " │ f32/kv
/// f32 │ …"); the settings overlay (`o`) spells the fields out.
fn settings_spans<'a>(app: &App, compact: bool) -> Vec<Span<'a>> {
    use crate::chat::sampling::describe_short;
    let th = &app.theme;
    let Some(g) = &app.settings else {
        return Vec::new();
    };
    let sep = || Span::styled(" │ ", th.bar());
    let numerics = if compact {
        format!("{}/kv {}", g.act, g.kv)
    } else {
        format!("act {} kv {}", g.act, g.kv)
    };
    vec![
        sep(),
        Span::styled(numerics, th.bar()),
        sep(),
        Span::styled(describe_short(&g.sampling), th.bar()),
    ]
}

/// The metrics part of the footer.
fn metrics<'a>(app: &App, compact: bool) -> Vec<Span<'a>> {
    let th = &app.theme;
    let v = &app.live;
    let mut spans = vec![Span::raw(" ")];
    spans.push(Span::styled("decode ", th.dim()));
    spans.push(Span::styled(
        v.decode_tps.map_or("—".into(), |x| format!("{x:.0}")),
        th.strong(),
    ));
    spans.push(Span::styled(" tok/s · prefill ", th.dim()));
    spans.push(Span::styled(
        v.prefill_tps.map_or("—".into(), |x| format!("{x:.0}")),
        th.strong(),
    ));
    spans.push(Span::styled(
        if compact {
            " · ctx "
        } else {
            " tok/s · ctx "
        },
        th.dim(),
    ));
    let max = v.model.as_ref().map_or(0, |m| m.max_ctx);
    spans.push(Span::styled(format!("{}/{}", v.ctx_used, max), th.strong()));
    if max > 0 && !compact {
        let wgt = 8usize;
        let fill = ((v.ctx_used as f64 / max as f64).min(1.0) * wgt as f64).round() as usize;
        spans.push(Span::raw(" "));
        spans.push(Span::styled("▰".repeat(fill), th.measured()));
        spans.push(Span::styled("▱".repeat(wgt - fill), th.dim()));
    }
    if let Some(msg) = app.status_message() {
        spans.push(Span::styled(" · ", th.dim()));
        spans.push(Span::styled(msg.to_string(), th.warn()));
    } else if let Some((t, a, b, e)) = v.ab.views().iter().find_map(|tv| match &tv.verdict {
        Verdict::Compared { a, b, est, .. } => Some((tv.toggle, a, b, est)),
        _ => None,
    }) {
        spans.push(Span::styled(
            format!(" · A/B {} {a}/{b} ", t.name()),
            th.dim(),
        ));
        spans.push(Span::styled(times(e.ratio), th.measured()));
        spans.push(Span::styled(
            format!(" [{:.2}–{:.2}] n={}/{}", e.ci.0, e.ci.1, e.n_a, e.n_b),
            th.dim(),
        ));
    }
    spans
}

/// Key hints, generated from the keymap table.
fn hints<'a>(app: &App, max_width: usize) -> Vec<Span<'a>> {
    let th = &app.theme;
    let mut spans: Vec<Span> = Vec::new();
    let push = |spans: &mut Vec<Span<'a>>, k: String, label: &str| -> bool {
        let add = k.chars().count() + label.chars().count() + 3;
        if width(spans) + add > max_width {
            return false;
        }
        spans.push(Span::styled(k, th.key()));
        spans.push(Span::styled(format!(" {label}  "), th.dim()));
        true
    };
    for (k, label) in footer_hints(app.replay.is_some()) {
        if !push(&mut spans, k, label) {
            break;
        }
    }
    spans
}

/// Render the footer: one line (metrics + short hints) or two (metrics, then all key hints).
pub fn render_footer(frame: &mut Frame, area: Rect, app: &App) {
    let th = &app.theme;
    let w = area.width as usize;
    let compact = w < 120;
    let mut top = metrics(app, compact);
    if area.height >= 2 {
        frame.render_widget(
            Paragraph::new(vec![
                Line::from(top),
                Line::from({
                    let mut s = vec![Span::raw(" ")];
                    s.extend(hints(app, w.saturating_sub(1)));
                    s
                }),
            ]),
            area,
        );
        return;
    }
    let tail = vec![
        Span::styled("?", th.key()),
        Span::styled(" help  ", th.dim()),
        Span::styled("Tab", th.key()),
        Span::styled(" focus  ", th.dim()),
        Span::styled("q", th.key()),
        Span::styled(" quit ", th.dim()),
    ];
    let tw = width(&tail);
    let mw = width(&top);
    if mw + tw <= w {
        top.push(Span::raw(" ".repeat(w - mw - tw)));
        top.extend(tail);
    }
    frame.render_widget(Paragraph::new(Line::from(top)), area);
}
