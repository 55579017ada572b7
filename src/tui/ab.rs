//! A/B pane: for every toggle (prefetch, fetch, layout, expert tier) the running median ms/token
//! of each arm with its sample count, the current arm marked, and the ratio of the first two arms.

use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use ratatui::Frame;

use super::app::{AbToggle, App, PaneId};
use super::common::{dim_line, pane_block, times};

fn current_arm(app: &App, t: &AbToggle) -> Option<String> {
    let c = app.view().config.as_ref()?;
    Some(match t.name {
        "prefetch" => (if c.prefetch { "on" } else { "off" }).to_string(),
        "fetch" => c.fetch.clone(),
        "layout" => c.layout.clone(),
        _ => c.expert_tier.clone(),
    })
}

/// Render the A/B pane.
pub fn render(frame: &mut Frame, area: Rect, app: &App) {
    let th = &app.theme;
    let block = pane_block(
        app,
        PaneId::Ab,
        vec![
            Span::styled("A/B", th.title()),
            Span::styled(" · median ms/token per arm (measured)", th.dim()),
        ],
    );
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let v = app.view();
    if v.tokens_seen == 0 {
        frame.render_widget(
            Paragraph::new(dim_line(app, "waiting for tokens — toggle with p s l t")),
            inner,
        );
        return;
    }
    let mut lines = Vec::new();
    for t in v.ab.toggles() {
        let cur = current_arm(app, t);
        let mut spans = vec![Span::styled(format!("{:<9}", t.name), th.strong())];
        for (i, a) in t.arms.iter().enumerate() {
            if i > 0 {
                spans.push(Span::styled(" │ ", th.dim()));
            }
            let mark = if cur.as_deref() == Some(a.label.as_str()) {
                "●"
            } else {
                " "
            };
            spans.push(Span::styled(mark, th.good()));
            spans.push(Span::raw(format!(
                "{} {}",
                a.label,
                a.ms.median().map_or("—".into(), |m| format!("{m:.2}"))
            )));
            spans.push(Span::styled(format!(" n={}", a.ms.len()), th.dim()));
        }
        let mut tail = Vec::new();
        match t.ratio() {
            Some((r, a, b)) => {
                tail.push(Span::styled(
                    format!("  {}/{} ", a.label, b.label),
                    th.dim(),
                ));
                tail.push(Span::styled(times(r), th.measured()));
            }
            None if t.arms.len() < 2 => {
                tail.push(Span::styled("  (one arm)", th.dim()));
            }
            None => {}
        }
        let width = |v: &[Span]| v.iter().map(|s| s.content.chars().count()).sum::<usize>();
        if width(&spans) + width(&tail) > inner.width as usize {
            lines.push(Line::from(spans));
            let mut next = vec![Span::raw(" ".repeat(7))];
            next.extend(tail);
            lines.push(Line::from(next));
        } else {
            spans.extend(tail);
            lines.push(Line::from(spans));
        }
    }
    lines.push(dim_line(
        app,
        "● current arm · toggles apply at the next token",
    ));
    frame.render_widget(Paragraph::new(lines), inner);
}
