//! A/B pane: for every toggle (prefetch, fetch, layout, expert tier, schedule) the controlled
//! comparison of the A/B book (`telemetry::ab`): per arm the blocks (n) and the
//! position-corrected mean ms/token, the ratio with its 95% interval over blocks ("no
//! significant difference" when it includes 1.0), or why there is none (one arm, another
//! setting changed with it — a side effect named as such —, too few blocks, a toggle that does
//! nothing on this model). Marks the arm the engine last ran, the toggle A/B auto works on, and
//! A/B auto's progress.

use ratatui::layout::Rect;
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use ratatui::Frame;

use super::app::{App, PaneId};
use super::common::{dim_line, pane_block, times};
use crate::telemetry::ab::{
    confound_reason, Toggle, ToggleView, Verdict, BLOCK, MIN_BLOCKS, TIGHT,
};

/// A run of spans that is never split across lines.
type Chunk<'a> = Vec<Span<'a>>;

fn width(spans: &[Span]) -> usize {
    spans.iter().map(|s| s.content.chars().count()).sum()
}

/// The chunks of one toggle's entry: head, one per arm, then the verdict.
fn chunks<'a>(app: &App, tv: &ToggleView, long: bool) -> Vec<Chunk<'a>> {
    let th = &app.theme;
    let t = tv.toggle;
    let cur = app.view().current_setting().map(|c| c.label(t));
    let focus = app.ab_focus == t;
    let auto = app.ab_auto.as_ref().is_some_and(|a| a.toggle == t);
    let mut head = vec![
        Span::styled(if focus { "▸" } else { " " }, th.key()),
        Span::styled(format!("{:<8}", t.name()), th.strong()),
    ];
    if auto {
        head.push(Span::styled(" AUTO", th.warn()));
    }
    let mut out = vec![head];
    let mark = |label: &str| {
        if cur == Some(label) {
            "●"
        } else {
            " "
        }
    };
    // (label, ms, count, unit)
    let arm_chunk = |label: &str, ms: Option<f64>, n: usize, first: bool| -> Chunk<'a> {
        let mut c = Vec::new();
        if !first {
            c.push(Span::styled("│", th.dim()));
        }
        c.push(Span::styled(mark(label).to_string(), th.good()));
        let shown = if label.is_empty() { "n/a" } else { label };
        c.push(Span::raw(match ms {
            Some(m) => format!("{shown} {m:.2}"),
            None => shown.to_string(),
        }));
        c.push(Span::styled(
            if ms.is_some() {
                format!(" n={n} blk")
            } else {
                format!(" {n} tok")
            },
            th.dim(),
        ));
        c
    };
    let dense = app.view().model.as_ref().is_some_and(|m| m.n_experts == 0);
    if dense && matches!(t, Toggle::Fetch | Toggle::Tier) {
        out.push(vec![Span::styled(
            if long {
                format!("no experts on this model: {} does nothing", t.key())
            } else {
                "no experts".into()
            },
            th.dim(),
        )]);
        return out;
    }
    match &tv.verdict {
        Verdict::Compared { a, b, est, .. } => {
            out.push(arm_chunk(a, Some(est.ms_a), est.n_a, true));
            out.push(arm_chunk(b, Some(est.ms_b), est.n_b, false));
            let style: Style = if est.includes_one() {
                th.dim()
            } else {
                th.measured()
            };
            out.push(vec![
                Span::styled(format!("{a}/{b} "), th.dim()),
                Span::styled(times(est.ratio), style),
                Span::styled(format!(" [{:.2}–{:.2}]", est.ci.0, est.ci.1), th.dim()),
            ]);
            if est.includes_one() {
                out.push(vec![Span::styled(
                    if long {
                        "no significant difference"
                    } else {
                        "n.s."
                    },
                    th.warn(),
                )]);
            }
        }
        other => {
            for (i, (label, n)) in tv.arms.iter().enumerate() {
                out.push(arm_chunk(label, None, *n, i == 0));
            }
            let unknown = tv.arms.len() == 1 && tv.arms[0].0.is_empty();
            let why = match other {
                Verdict::Confounded { with, .. } => confound_reason(t, with, long),
                Verdict::TooFew { n_a, n_b, .. } => {
                    if long {
                        format!("too few blocks: {n_a}/{n_b} of {MIN_BLOCKS}")
                    } else {
                        format!("too few ({n_a}/{n_b} blk)")
                    }
                }
                _ if tv.arms.is_empty() => String::new(),
                _ if unknown && t == Toggle::Schedule => "not recorded in this trace".into(),
                _ if unknown => {
                    if long {
                        format!(
                            "not in effect (experts from memory) — {} switches",
                            Toggle::Tier.key()
                        )
                    } else {
                        "not in effect".into()
                    }
                }
                _ => {
                    if long {
                        format!("one arm — {} switches", t.key())
                    } else {
                        "one arm".into()
                    }
                }
            };
            if !why.is_empty() {
                out.push(vec![Span::styled(why, th.dim())]);
            }
        }
    }
    out
}

/// A separator span that starts a chunk: joined with one space, dropped at a line start.
fn is_sep(s: &Span) -> bool {
    s.content == "│" || s.content == "· "
}

/// Pack chunks greedily onto lines of `w` cells; continuation lines start with `indent` spaces.
fn pack<'a>(chunks: Vec<Chunk<'a>>, w: usize, indent: usize) -> Vec<Line<'a>> {
    let mut lines: Vec<Vec<Span<'a>>> = Vec::new();
    for (i, c) in chunks.into_iter().enumerate() {
        let sep = if i == 0 {
            0
        } else if c.first().is_some_and(|s| is_sep(s)) {
            1
        } else {
            2
        };
        match lines.last_mut() {
            Some(l) if width(l) + sep + width(&c) <= w => {
                l.push(Span::raw(" ".repeat(sep)));
                l.extend(c);
            }
            _ if i == 0 => lines.push(c),
            _ => {
                // A continuation line does not start with the arm separator.
                let body = c.into_iter().skip_while(is_sep);
                let mut l = vec![Span::raw(" ".repeat(indent))];
                l.extend(body);
                lines.push(l);
            }
        }
    }
    lines.into_iter().map(Line::from).collect()
}

/// Render the A/B pane.
pub fn render(frame: &mut Frame, area: Rect, app: &App) {
    let th = &app.theme;
    let block = pane_block(
        app,
        PaneId::Ab,
        vec![
            Span::styled("A/B", th.title()),
            Span::styled(" · ms/token over blocks (measured)", th.dim()),
        ],
        area.width,
    );
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let v = app.view();
    let (w, h) = (inner.width as usize, inner.height as usize);
    if v.tokens_seen == 0 {
        frame.render_widget(
            Paragraph::new(dim_line(
                app,
                "waiting for tokens — toggle with p s l t v, a = A/B auto",
            )),
            inner,
        );
        return;
    }
    let indent = if w >= 50 { 10 } else { 3 };
    let build = |long: bool| -> Vec<Line> {
        v.ab.views()
            .iter()
            .flat_map(|tv| pack(chunks(app, tv, long), w, indent))
            .collect()
    };
    let mut lines = build(true);
    if lines.len() > h {
        lines = build(false);
    }
    // Extras, most useful first, while rows remain; each wraps at its " · " separators.
    let mut extras: Vec<Vec<Line>> = Vec::new();
    let dim_chunks = |text: String, first: Option<Span<'static>>| -> Vec<Chunk<'static>> {
        let mut out: Vec<Chunk> = Vec::new();
        for (i, part) in text.split(" · ").enumerate() {
            let mut c = Vec::new();
            if i == 0 {
                c.extend(first.clone());
            } else {
                c.push(Span::styled("· ", th.dim()));
            }
            c.push(Span::styled(part.to_string(), th.dim()));
            out.push(c);
        }
        out
    };
    if let Some(a) = &app.ab_auto {
        let hw = v.ab.estimate(a.toggle).map(|e| e.half_width());
        let text = format!(
            "{} {}⇄{} · block {} · {} · a stops",
            a.toggle.name(),
            a.arms[0],
            a.arms[1],
            a.blocks + 1,
            hw.map_or("±—".into(), |h| format!(
                "±{:.1}% → {:.0}%",
                100.0 * h,
                100.0 * TIGHT
            ))
        );
        extras.push(pack(
            dim_chunks(text, Some(Span::styled("A/B auto ", th.warn()))),
            w,
            2,
        ));
    }
    if let Some((t, c)) = app.prefetch_shares_core() {
        // Prefetch's arms differ in more than prefetching: "on" adds a thread to a full machine.
        let text = format!(
            "prefetch: its thread shares a core with the {t} compute thread{} ({c} CPUs) · \
             \"on\" also takes compute time",
            if t == 1 { "" } else { "s" }
        );
        extras.push(pack(
            dim_chunks(text, Some(Span::styled("⚠ ", th.warn()))),
            w,
            2,
        ));
    }
    let focus = v.ab.view(app.ab_focus);
    let shown = match &focus.verdict {
        Verdict::Compared { .. } => Some(focus),
        _ => {
            v.ab.views()
                .iter()
                .find(|tv| matches!(tv.verdict, Verdict::Compared { .. }))
        }
    };
    if let Some(Verdict::Compared { others, est, .. }) = shown.map(|tv| &tv.verdict) {
        let text = format!(
            "{}: {others} · at ctx {}",
            shown.map_or("", |tv| tv.toggle.name()),
            est.pos_ref
        );
        extras.push(pack(dim_chunks(text, None), w, 2));
    }
    extras.push(pack(
        dim_chunks(
            format!(
                "● as run · ▸ a=A/B auto · n = blocks of ≥{BLOCK} tok · [95% CI over blocks] · all other settings equal, ctx-corrected"
            ),
            None,
        ),
        w,
        2,
    ));
    for e in extras {
        if lines.len() + e.len() <= h {
            lines.extend(e);
        }
    }
    frame.render_widget(Paragraph::new(lines), inner);
}
