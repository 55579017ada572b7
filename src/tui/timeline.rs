//! The ms/token timeline: a sparkline of every recent token's time (newest at the right), with
//! a marker row under it — `P` where a prompt was prefilled, `T` where a toggle took effect —
//! and the latest toggle named, like a Perfetto track with instant events.

use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, BorderType, Borders, Paragraph};
use ratatui::Frame;

use super::app::App;
use super::telemetry::Mark;

const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];

/// The sparkline, marker row and scale of the last `width` tokens: (bars, marks, min ms, max ms).
pub fn series(app: &App, width: usize) -> (String, String, f64, f64) {
    let v = app.view();
    let n = v.timeline.len().min(width);
    let pts: Vec<&(u64, f64)> = v.timeline.iter().skip(v.timeline.len() - n).collect();
    let (lo, hi) = pts.iter().fold((f64::INFINITY, 0.0f64), |(a, b), p| {
        (a.min(p.1), b.max(p.1))
    });
    let bars: String = pts
        .iter()
        .map(|p| {
            let x = if hi > lo { (p.1 - lo) / (hi - lo) } else { 0.5 };
            BARS[((x * 7.0).round() as usize).min(7)]
        })
        .collect();
    let marks: String = pts
        .iter()
        .map(|p| {
            let here = v.marks.iter().filter(|m| m.0 == p.0);
            let mut c = ' ';
            for (_, m) in here {
                c = match (c, m) {
                    (' ', Mark::Prefill(_)) => 'P',
                    (' ', Mark::Toggle(_)) => 'T',
                    (_, _) => '*',
                };
            }
            c
        })
        .collect();
    (bars, marks, if lo.is_finite() { lo } else { 0.0 }, hi)
}

/// Render the timeline into `area` (bordered; 4 rows or more).
pub fn render(frame: &mut Frame, area: Rect, app: &App) {
    let th = &app.theme;
    let block = Block::default()
        .borders(Borders::ALL)
        .border_type(BorderType::Plain)
        .border_style(th.border())
        .title(Line::from(vec![
            Span::styled("Timeline", th.title()),
            Span::styled(" · ms/token · P prefill · T toggle · g hides", th.dim()),
        ]));
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let w = inner.width as usize;
    let v = app.view();
    if v.timeline.is_empty() {
        frame.render_widget(
            Paragraph::new(Line::styled("waiting for the first token…", th.dim())),
            inner,
        );
        return;
    }
    let (bars, marks, lo, hi) = series(app, w);
    let mut lines = vec![
        Line::styled(bars, th.measured()),
        Line::styled(marks, th.warn()),
    ];
    let last_toggle = v.marks.iter().rev().find_map(|(_, m)| match m {
        Mark::Toggle(t) => Some(t.as_str()),
        Mark::Prefill(_) => None,
    });
    let mut scale = format!(
        "{:.2}–{:.2} ms over {} tokens",
        lo,
        hi,
        v.timeline.len().min(w)
    );
    if let Some(t) = last_toggle {
        scale.push_str(&format!(" · last T: {t}"));
    }
    lines.push(Line::styled(scale, th.dim()));
    frame.render_widget(Paragraph::new(lines), inner);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tui::app::{Action, Msg};
    use crate::tui::fixture::demo_events;

    #[test]
    fn marks_prefill_and_toggle_at_their_tokens() {
        let mut app = App::default();
        for e in demo_events(20, true) {
            app.apply(Msg::Stamped(e));
        }
        let (bars, marks, lo, hi) = series(&app, 200);
        assert_eq!(bars.chars().count(), 20);
        assert_eq!(marks.chars().count(), 20);
        // The fixture prefills before token 0 and switches fetch to sync at token 10.
        assert_eq!(marks.chars().next(), Some('P'));
        assert_eq!(marks.chars().nth(10), Some('T'), "{marks:?}");
        assert_eq!(marks.chars().filter(|&c| c != ' ').count(), 2);
        assert!(lo > 0.0 && hi >= lo);
        // Narrower than the series: the newest tokens are kept.
        let (b5, m5, ..) = series(&app, 5);
        assert_eq!(b5.chars().count(), 5);
        assert!(!m5.contains('P'));
        // g hides it.
        app.apply(Msg::Action(Action::Timeline));
        assert!(!app.show_timeline);
    }
}
