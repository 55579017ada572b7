//! The `?` help overlay, generated from the keymap table so it always lists the real bindings.
//! Single-letter keys are merged into the row of the F-key / Alt binding of the same action.

use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, BorderType, Borders, Clear, Paragraph};
use ratatui::Frame;

use super::app::App;
use super::common::{centered, truncate};
use super::keymap::{keys_label, Ctx, BINDINGS};

/// One help row: (keys, description), or a section heading when keys is empty.
pub fn help_rows() -> Vec<(String, String)> {
    let mut rows = Vec::new();
    let global_actions: Vec<_> = BINDINGS
        .iter()
        .filter(|b| b.ctx == Ctx::Global)
        .map(|b| b.action)
        .collect();
    for ctx in [
        Ctx::Global,
        Ctx::Nav,
        Ctx::Input,
        Ctx::WhatIf,
        Ctx::Replay,
        Ctx::Settings,
    ] {
        let mut section = Vec::new();
        let mut editing = Vec::new();
        for b in BINDINGS.iter().filter(|b| b.ctx == ctx) {
            if ctx == Ctx::Nav && global_actions.contains(&b.action) {
                continue;
            }
            if b.help.is_empty() {
                editing.push(keys_label(b));
                continue;
            }
            let mut keys = keys_label(b);
            if ctx == Ctx::Global {
                // F-key rows: "p F2" (the Alt+letter twin is explained once below).
                if let Some(n) = BINDINGS
                    .iter()
                    .find(|o| o.ctx == Ctx::Nav && o.action == b.action)
                {
                    keys = format!("{} {}", n.keys[0].label(), b.keys[0].label());
                }
            }
            section.push((keys, b.help.to_string()));
        }
        if !editing.is_empty() {
            section.push((editing.join(" "), "edit".to_string()));
        }
        if ctx == Ctx::Global {
            section.push((
                "Alt+letter".to_string(),
                "= the letter, also while typing".to_string(),
            ));
        }
        if !section.is_empty() {
            rows.push((String::new(), ctx.heading().to_string()));
            rows.extend(section);
        }
    }
    rows
}

/// Render the overlay centred over `area`.
pub fn render(frame: &mut Frame, area: Rect, app: &App) {
    let th = &app.theme;
    let rows = help_rows();
    let avail_w = area.width.saturating_sub(2) as usize;
    let avail_h = area.height.saturating_sub(2) as usize;
    let ncols = if avail_w >= 3 * 44 {
        3
    } else if avail_w >= 2 * 36 {
        2
    } else {
        1
    };
    let inner_h = rows.len().div_ceil(ncols).min(avail_h).max(1);
    let ncols = rows.len().div_ceil(inner_h).min(ncols);
    let inner_w = (ncols * 46).min(avail_w);
    let key_w = rows
        .iter()
        .map(|(k, _)| k.chars().count())
        .max()
        .unwrap_or(0)
        .min(14);
    let popup = centered(area, inner_w as u16 + 2, inner_h as u16 + 2);
    frame.render_widget(Clear, popup);
    let block = Block::default()
        .borders(Borders::ALL)
        .border_type(BorderType::Rounded)
        .border_style(th.border_focused())
        .title(Line::from(vec![
            Span::styled(" Keys ", th.title()),
            Span::styled("· Esc or ? closes ", th.dim()),
        ]));
    let inner = block.inner(popup);
    frame.render_widget(block, popup);
    let cw = (inner.width as usize / ncols.max(1)).max(1);
    for c in 0..ncols {
        let chunk: Vec<Line> = rows
            .iter()
            .skip(c * inner_h)
            .take(inner_h)
            .map(|(k, d)| {
                if k.is_empty() {
                    Line::from(Span::styled(truncate(d, cw), th.warn()))
                } else {
                    let desc_w = cw.saturating_sub(key_w + 4);
                    Line::from(vec![
                        Span::styled(format!(" {:<key_w$}", truncate(k, key_w)), th.key()),
                        Span::raw("  "),
                        Span::raw(truncate(d, desc_w)),
                    ])
                }
            })
            .collect();
        let x = inner.x + (c * cw) as u16;
        let r = Rect {
            x,
            y: inner.y,
            width: (cw as u16).min(inner.x + inner.width - x),
            height: inner.height,
        };
        frame.render_widget(Paragraph::new(chunk), r);
    }
}
