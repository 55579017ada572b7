//! The `?` help overlay, generated from the keymap table so it always lists the real bindings.
//! Single-letter keys are merged into the row of the F-key / Alt binding of the same action.

use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, BorderType, Borders, Clear, Paragraph};
use ratatui::Frame;

use super::app::App;
use super::common::{centered, truncate, width, wrap};
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

/// How the overlay is laid out in an area of `avail_w` × `avail_h` cells (inside the border).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HelpLayout {
    pub ncols: usize,
    /// Width of one column (gap included).
    pub col_w: usize,
    pub key_w: usize,
    /// Lines per column (the overlay scrolls when the single column is taller than the area).
    pub lines: usize,
}

/// Lines a row takes at description width `desc_w` (descriptions wrap; headings take one).
fn row_lines(row: &(String, String), key_w: usize, desc_w: usize) -> usize {
    if row.0.is_empty() {
        1
    } else {
        wrap(&row.1, desc_w).len().max(1) + usize::from(width(&row.0) > key_w)
    }
}

/// Widest key column: longer key lists (the editing keys) get a line of their own.
const KEY_W_MAX: usize = 16;

/// Chooses the layout: the most columns (≤ 3) in which every description fits unwrapped and the
/// rows fit the height; otherwise one full-width column with wrapped descriptions (scrolling).
pub fn layout(rows: &[(String, String)], avail_w: usize, avail_h: usize) -> HelpLayout {
    let key_w = rows
        .iter()
        .map(|(k, _)| width(k))
        .max()
        .unwrap_or(0)
        .min(KEY_W_MAX);
    let long_keys = rows.iter().filter(|(k, _)| width(k) > key_w).count();
    let desc_max = rows
        .iter()
        .filter(|(k, _)| !k.is_empty())
        .map(|(_, d)| width(d))
        .max()
        .unwrap_or(0);
    for ncols in (1..=3).rev() {
        let col_w = avail_w / ncols;
        // Slack for keeping sections whole and for long key lists.
        let lines = (rows.len() + long_keys).div_ceil(ncols) + ncols;
        if col_w >= 1 + key_w + 2 + desc_max + 2 && lines <= avail_h {
            return HelpLayout {
                ncols,
                col_w,
                key_w,
                lines,
            };
        }
    }
    let key_w = key_w.min(avail_w / 3);
    let desc_w = avail_w.saturating_sub(key_w + 3);
    HelpLayout {
        ncols: 1,
        col_w: avail_w,
        key_w,
        lines: rows.iter().map(|r| row_lines(r, key_w, desc_w)).sum(),
    }
}

/// The overlay's lines, column by column: sections are never split at a column's last line (a
/// heading always has its first entry under it), descriptions wrap under themselves.
fn columns<'a>(app: &App, rows: &[(String, String)], l: &HelpLayout) -> Vec<Vec<Line<'a>>> {
    let th = &app.theme;
    let desc_w = l
        .col_w
        .saturating_sub(l.key_w + 3 + usize::from(l.ncols > 1) * 2);
    let per_col = if l.ncols == 1 {
        usize::MAX
    } else {
        rows.len().div_ceil(l.ncols)
    };
    let mut cols: Vec<Vec<Line>> = vec![Vec::new()];
    for (i, (k, d)) in rows.iter().enumerate() {
        let used = cols.last().map_or(0, Vec::len);
        // Start a new column when this one is full, and never leave a heading last.
        let heading_last = k.is_empty() && used + 1 >= per_col;
        if cols.len() < l.ncols && (used >= per_col || heading_last) && i > 0 {
            cols.push(Vec::new());
        }
        let col = cols.last_mut().expect("one column");
        if k.is_empty() {
            col.push(Line::from(Span::styled(truncate(d, l.col_w), th.warn())));
            continue;
        }
        let own_line = width(k) > l.key_w;
        if own_line {
            col.push(Line::from(Span::styled(
                format!(" {}", truncate(k, l.col_w.saturating_sub(1))),
                th.key(),
            )));
        }
        for (j, part) in wrap(d, desc_w).into_iter().enumerate() {
            let key = if j == 0 && !own_line {
                k.clone()
            } else {
                String::new()
            };
            col.push(Line::from(vec![
                Span::styled(format!(" {key:<w$}", w = l.key_w), th.key()),
                Span::raw("  "),
                Span::raw(part),
            ]));
        }
    }
    cols
}

/// Render the overlay centred over `area` (↑/↓ PgUp/PgDn scroll it when it does not fit).
pub fn render(frame: &mut Frame, area: Rect, app: &App) {
    let th = &app.theme;
    let rows = help_rows();
    let avail_w = area.width.saturating_sub(2) as usize;
    let avail_h = area.height.saturating_sub(2) as usize;
    let l = layout(&rows, avail_w, avail_h);
    let cols = columns(app, &rows, &l);
    let tallest = cols.iter().map(Vec::len).max().unwrap_or(1);
    let inner_h = tallest.min(avail_h).max(1);
    let inner_w = if l.ncols == 1 {
        avail_w
    } else {
        (l.ncols * l.col_w).min(avail_w)
    };
    let scroll = if tallest > inner_h {
        (app.help_scroll as usize).min(tallest - inner_h)
    } else {
        0
    };
    let popup = centered(area, inner_w as u16 + 2, inner_h as u16 + 2);
    frame.render_widget(Clear, popup);
    let mut title = vec![
        Span::styled(" Keys ", th.title()),
        Span::styled("· Esc or ? closes ", th.dim()),
    ];
    if tallest > inner_h {
        title.push(Span::styled(
            format!(
                "· ↑↓ PgUp/PgDn scroll · lines {}–{} of {} ",
                scroll + 1,
                scroll + inner_h,
                tallest
            ),
            th.dim(),
        ));
    }
    let block = Block::default()
        .borders(Borders::ALL)
        .border_type(BorderType::Rounded)
        .border_style(th.border_focused())
        .title(Line::from(title));
    let inner = block.inner(popup);
    frame.render_widget(block, popup);
    let cw = if l.ncols == 1 {
        inner.width as usize
    } else {
        l.col_w
    };
    for (c, chunk) in cols.into_iter().enumerate() {
        let x = inner.x + (c * cw) as u16;
        if x >= inner.x + inner.width {
            break;
        }
        let r = Rect {
            x,
            y: inner.y,
            width: (cw as u16).min(inner.x + inner.width - x),
            height: inner.height,
        };
        let chunk: Vec<Line> = chunk.into_iter().skip(scroll).collect();
        frame.render_widget(Paragraph::new(chunk), r);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_description_fits_at_160x48_in_columns() {
        let rows = help_rows();
        let l = layout(&rows, 158, 46);
        assert!(l.ncols >= 2, "{l:?}");
        let desc_max = rows.iter().map(|(_, d)| width(d)).max().unwrap();
        assert!(l.col_w >= 1 + l.key_w + 2 + desc_max, "{l:?}");
        assert!(l.lines <= 46);
    }

    #[test]
    fn at_80x24_one_column_wraps_and_scrolls() {
        let rows = help_rows();
        let l = layout(&rows, 78, 22);
        assert_eq!(l.ncols, 1);
        assert!(l.lines > 22, "scrolls: {l:?}");
        assert_eq!(wrap("a bb ccc dddd", 6), ["a bb", "ccc", "dddd"]);
    }
}
