//! Screen composition: status bar, the pane grid (docs/ARCHITECTURE.md, "The screen": 160×48) with
//! a view slot under the Text pane (Timeline, Heatmap or Roofline: `c` cycles, `g` hides), the
//! compact layout for small terminals (text beside one pane chosen with Tab, under a strip that
//! names every pane it hides and the keys that show them), the maximized pane, the footer and the
//! help / model-info overlays. On a dense model (no experts) Routing and Overlap shrink to one line
//! each saying why, and their space goes to the Text column and the view slot.

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use ratatui::Frame;

use super::app::{App, PaneId};
use super::{
    ab, critical, heatmap, help, info, overlap, pmu, roofline, routing, status, streams, text,
    timeline,
};

/// True when the session's model is known to have no experts.
pub fn dense_model(app: &App) -> bool {
    app.view().model.as_ref().is_some_and(|m| m.n_experts == 0)
}

/// The one line Routing or Overlap shrinks to on a dense model.
fn dense_line(frame: &mut Frame, area: Rect, app: &App, pane: PaneId, why: &str) {
    let th = &app.theme;
    let focused = app.focus == pane && !app.input_focused;
    frame.render_widget(
        Paragraph::new(Line::from(vec![
            Span::styled(
                format!("{} {}", if focused { "▸" } else { "─" }, pane.name()),
                if focused {
                    th.border_focused()
                } else {
                    th.title()
                },
            ),
            Span::styled(format!(" · dense model: {why}"), th.dim()),
        ])),
        area,
    );
}

/// Below this width or height the compact layout is used.
pub const WIDE_MIN: (u16, u16) = (120, 32);

/// True when `size` gets the compact layout.
pub fn is_compact(size: Rect) -> bool {
    size.width < WIDE_MIN.0 || size.height < WIDE_MIN.1
}

/// Render one pane by id.
pub fn render_pane(frame: &mut Frame, area: Rect, app: &App, pane: PaneId) {
    match pane {
        PaneId::Text => text::render(frame, area, app),
        PaneId::Streams => streams::render(frame, area, app),
        PaneId::Critical => critical::render(frame, area, app),
        PaneId::Routing => routing::render(frame, area, app),
        PaneId::Overlap => overlap::render(frame, area, app),
        PaneId::Timeline => timeline::render(frame, area, app),
        PaneId::Heatmap => heatmap::render(frame, area, app),
        PaneId::Roofline => roofline::render(frame, area, app),
        PaneId::Pmu => pmu::render(frame, area, app),
        PaneId::Ab => ab::render(frame, area, app),
    }
}

/// Draw the whole screen.
pub fn draw(frame: &mut Frame, app: &App) {
    let area = frame.area();
    if area.width < 20 || area.height < 6 {
        frame.render_widget(ratatui::widgets::Paragraph::new("terminal too small"), area);
        return;
    }
    let compact = is_compact(area);
    let footer_h = if compact { 1 } else { 2 };
    let [top, body, foot] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Min(3),
        Constraint::Length(footer_h),
    ])
    .areas(area);
    status::render_top(frame, top, app);
    status::render_footer(frame, foot, app);

    if app.maximized {
        render_pane(frame, body, app, app.focus);
    } else if compact {
        let [l, r] = Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)])
            .areas(body);
        text::render(frame, l, app);
        let right = if app.focus == PaneId::Text {
            app.compact_pane
        } else {
            app.focus
        };
        let strip = tab_strip(app, right, r.width as usize);
        let sh = (strip.len() as u16).min(r.height.saturating_sub(3));
        let [st, pane] = Layout::vertical([Constraint::Length(sh), Constraint::Min(0)]).areas(r);
        frame.render_widget(Paragraph::new(strip), st);
        render_pane(frame, pane, app, right);
    } else if dense_model(app) {
        // No experts: Routing and Overlap are one line each; Text and the timeline get the room.
        let [left, mid, right] = Layout::horizontal([
            Constraint::Percentage(46),
            Constraint::Percentage(27),
            Constraint::Percentage(27),
        ])
        .areas(body);
        left_column(frame, left, app, 12);
        let [s, ro] = Layout::vertical([Constraint::Min(3), Constraint::Length(1)]).areas(mid);
        streams::render(frame, s, app);
        dense_line(frame, ro, app, PaneId::Routing, "no experts");
        let [c, o] = Layout::vertical([Constraint::Min(3), Constraint::Length(1)]).areas(right);
        critical::render(frame, c, app);
        dense_line(frame, o, app, PaneId::Overlap, "no expert I/O");
    } else {
        let [left, mid, right] = Layout::horizontal([
            Constraint::Percentage(40),
            Constraint::Percentage(30),
            Constraint::Percentage(30),
        ])
        .areas(body);
        left_column(frame, left, app, 10);
        let [s, ro] =
            Layout::vertical([Constraint::Percentage(50), Constraint::Percentage(50)]).areas(mid);
        streams::render(frame, s, app);
        routing::render(frame, ro, app);
        let [c, o] =
            Layout::vertical([Constraint::Percentage(50), Constraint::Percentage(50)]).areas(right);
        critical::render(frame, c, app);
        overlap::render(frame, o, app);
    }
    if app.editor.is_some() {
        super::settings::render(frame, area, app);
    }
    if app.show_info {
        info::render(frame, area, app);
    }
    if app.show_help {
        help::render(frame, area, app);
    }
}

/// The compact layout's strip over the right pane: every pane it can show, the one shown
/// marked, and the keys that switch (Tab) or zoom (z) — so the hidden panes can be found.
pub fn tab_strip(app: &App, shown: PaneId, width: usize) -> Vec<Line<'static>> {
    let th = &app.theme;
    let mut items: Vec<Span<'static>> = vec![Span::styled("Tab ▸", th.key())];
    for p in PaneId::ALL.iter().filter(|&&p| p != PaneId::Text) {
        items.push(if *p == shown {
            Span::styled(format!("[{}]", p.name()), th.border_focused())
        } else {
            Span::styled(p.name().to_string(), th.dim())
        });
    }
    items.push(Span::styled("z zoom · c view", th.key()));
    let mut lines: Vec<Line<'static>> = Vec::new();
    let mut cur: Vec<Span<'static>> = Vec::new();
    let mut used = 0usize;
    for it in items {
        let n = it.content.chars().count();
        if used > 0 && used + 1 + n > width {
            lines.push(Line::from(std::mem::take(&mut cur)));
            used = 0;
        }
        if used > 0 {
            cur.push(Span::raw(" "));
            used += 1;
        }
        used += n;
        cur.push(it);
    }
    if !cur.is_empty() {
        lines.push(Line::from(cur));
    }
    lines
}

/// The left column of the wide layouts: Text, the view slot (`timeline_rows` tall when it is
/// shown: the Timeline, Heatmap or Roofline), PMU and A/B.
fn left_column(frame: &mut Frame, area: Rect, app: &App, timeline_rows: u16) {
    let tl = if app.show_timeline { timeline_rows } else { 0 };
    let [t, g, p, a] = Layout::vertical([
        Constraint::Min(8),
        Constraint::Length(tl),
        Constraint::Length(9),
        Constraint::Length(8),
    ])
    .areas(area);
    text::render(frame, t, app);
    if app.show_timeline {
        render_pane(frame, g, app, app.time_view);
    }
    pmu::render(frame, p, app);
    ab::render(frame, a, app);
}
