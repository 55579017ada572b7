//! The model-info overlay (`m`): what `cflow-tui inspect` reports about the model file, rendered
//! by `inspect::render` from the report the session sent (`ModelSummary::inspect`), so the two
//! never disagree. Older traces without the report get the summary's own fields.

use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, BorderType, Borders, Clear, Paragraph, Wrap};
use ratatui::Frame;

use super::app::App;
use super::common::centered;

/// The overlay's text lines.
pub fn info_lines(app: &App) -> Vec<String> {
    let Some(m) = app.view().model.as_ref() else {
        return vec!["no session yet".into()];
    };
    match &m.inspect {
        Some(r) => crate::inspect::render(r)
            .lines()
            .map(str::to_string)
            .collect(),
        None => vec![
            format!("model     {} · arch {}", m.name, m.arch),
            format!(
                "geometry  L={} d={} heads={}/{} kv d_ff={} experts={} top-k={} vocab={} ctx={}",
                m.n_layers,
                m.d_model,
                m.n_heads,
                m.n_kv_heads,
                m.d_ff,
                m.n_experts,
                m.top_k,
                m.vocab,
                m.max_ctx
            ),
            format!(
                "semantics {} · δd={} δe={} · quant {}",
                m.combine_style,
                m.dense_delay,
                m.expert_delay,
                m.quant_types.join("/")
            ),
            "(this trace predates the inspect report: run `cflow-tui inspect FILE`)".into(),
        ],
    }
}

/// Render the overlay over `area` (scrolls with ↑/↓ like the help overlay).
pub fn render(frame: &mut Frame, area: Rect, app: &App) {
    let th = &app.theme;
    let lines = info_lines(app);
    let w = area.width.saturating_sub(2);
    let h = area.height.saturating_sub(2);
    let popup = centered(area, w, h);
    frame.render_widget(Clear, popup);
    let block = Block::default()
        .borders(Borders::ALL)
        .border_type(BorderType::Rounded)
        .border_style(th.border_focused())
        .title(Line::from(vec![
            Span::styled(" Model info ", th.title()),
            Span::styled("· as `cflow-tui inspect` · Esc or m closes ", th.dim()),
        ]));
    let text: Vec<Line> = lines.into_iter().map(Line::raw).collect();
    frame.render_widget(
        Paragraph::new(text)
            .block(block)
            .wrap(Wrap { trim: false })
            .scroll((app.help_scroll, 0)),
        popup,
    );
}
