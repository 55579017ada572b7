//! A/B pane: for every toggle (prefetch, fetch, layout, expert tier) the controlled comparison
//! of the A/B book (`telemetry::ab`): n and the position-corrected median ms/token per arm, the
//! ratio with its 95% bootstrap interval ("no significant difference" when it includes 1.0), or
//! why there is none (one arm, arms confounded with another toggle, too few samples). Marks the
//! current arm, the toggle A/B auto works on, and A/B auto's progress.

use ratatui::layout::Rect;
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use ratatui::Frame;

use super::app::{App, PaneId};
use super::common::{dim_line, pane_block, times};
use crate::telemetry::ab::{Setting, Toggle, ToggleView, Verdict, MIN_PER_ARM, TIGHT};

/// A run of spans that is never split across lines.
type Chunk<'a> = Vec<Span<'a>>;

fn width(spans: &[Span]) -> usize {
    spans.iter().map(|s| s.content.chars().count()).sum()
}

fn key_of(t: Toggle) -> char {
    match t {
        Toggle::Prefetch => 'p',
        Toggle::Fetch => 's',
        Toggle::Layout => 'l',
        Toggle::Tier => 't',
    }
}

/// The chunks of one toggle's entry: head, one per arm, then the verdict.
fn chunks<'a>(app: &App, tv: &ToggleView, long: bool) -> Vec<Chunk<'a>> {
    let th = &app.theme;
    let t = tv.toggle;
    let cur = app
        .view()
        .config
        .as_ref()
        .map(|c| Setting::of(c).arm(t).to_string());
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
        if cur.as_deref() == Some(label) {
            "●"
        } else {
            " "
        }
    };
    let arm_chunk = |label: &str, median: Option<f64>, n: usize, first: bool| -> Chunk<'a> {
        let mut c = Vec::new();
        if !first {
            c.push(Span::styled("│", th.dim()));
        }
        c.push(Span::styled(mark(label).to_string(), th.good()));
        c.push(Span::raw(match median {
            Some(m) => format!("{label} {m:.2}"),
            None => label.to_string(),
        }));
        c.push(Span::styled(format!(" n={n}"), th.dim()));
        c
    };
    match &tv.verdict {
        Verdict::Compared { a, b, est, .. } => {
            out.push(arm_chunk(a, Some(est.median_a), est.n_a, true));
            out.push(arm_chunk(b, Some(est.median_b), est.n_b, false));
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
            let why = match other {
                Verdict::Confounded { with, .. } => {
                    let w = if with.is_empty() {
                        "other toggles".to_string()
                    } else {
                        with.join("+")
                    };
                    if long {
                        format!("not comparable: {w} changed with it")
                    } else {
                        format!("confounded ({w})")
                    }
                }
                Verdict::TooFew { n_a, n_b, .. } => {
                    if long {
                        format!("too few at equal settings & ctx ({n_a}/{n_b} of {MIN_PER_ARM})")
                    } else {
                        format!("too few ({n_a}/{n_b})")
                    }
                }
                _ if tv.arms.is_empty() => String::new(),
                _ => {
                    if long {
                        format!("one arm — {} switches", key_of(t))
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
            Span::styled(" · median ms/token (controlled)", th.dim()),
        ],
    );
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let v = app.view();
    let (w, h) = (inner.width as usize, inner.height as usize);
    if v.tokens_seen == 0 {
        frame.render_widget(
            Paragraph::new(dim_line(
                app,
                "waiting for tokens — toggle with p s l t, a = A/B auto",
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
            "● current · ▸ a=A/B auto · [95% CI] · other toggles equal, ctx-corrected".into(),
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
