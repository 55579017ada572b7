//! Screen composition: status bar, the pane grid (DESIGN §7 at 160×48), the compact layout for
//! small terminals (text beside one pane chosen with Tab), the maximized pane, the footer and the
//! help overlay.

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::Frame;

use super::app::{App, PaneId};
use super::{ab, critical, help, overlap, pmu, routing, status, streams, text};

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
        render_pane(frame, r, app, right);
    } else {
        let [left, mid, right] = Layout::horizontal([
            Constraint::Percentage(40),
            Constraint::Percentage(30),
            Constraint::Percentage(30),
        ])
        .areas(body);
        let [t, p, a] = Layout::vertical([
            Constraint::Min(8),
            Constraint::Length(9),
            Constraint::Length(8),
        ])
        .areas(left);
        text::render(frame, t, app);
        pmu::render(frame, p, app);
        ab::render(frame, a, app);
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
    if app.show_help {
        help::render(frame, area, app);
    }
}
