//! Text pane: the transcript (chat or completion) with the streaming reply, the synthetic-weights
//! banner, scrollback, and the multi-line input box.

use std::cell::RefCell;
use std::collections::HashMap;

use ratatui::layout::{Constraint, Layout, Position, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use ratatui::Frame;

use super::app::{App, PaneId, Role};
use super::common::{dim_line, pane_block, wrap};
use crate::telemetry::event::StopReason;

/// The banner shown on synthetic models.
pub const SYNTHETIC_BANNER: &str =
    "synthetic weights: text is noise — `cflow-tui pull smollm2` for a real model";

/// Most input lines shown before the box scrolls.
const MAX_INPUT_LINES: usize = 5;

/// Render the text pane.
pub fn render(frame: &mut Frame, area: Rect, app: &App) {
    let th = &app.theme;
    let mode = if app.chat_mode() {
        "chat"
    } else {
        "completion"
    };
    let mut title = vec![
        Span::styled("Text", th.title()),
        Span::styled(format!(" · {mode}"), th.dim()),
    ];
    if let Some(s) = app.settings.as_ref().filter(|s| !s.system.is_empty()) {
        title.push(Span::styled(
            format!(" · system: {}", super::common::truncate(&s.system, 24)),
            th.dim(),
        ));
    }
    if app.scroll > 0 {
        title.push(Span::styled(
            format!(" · ↑{} (End follows)", app.scroll),
            th.warn(),
        ));
    }
    if app.generating {
        let spin = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];
        title.push(Span::styled(
            format!(" {} generating", spin[(app.ticks / 3 % 10) as usize]),
            th.measured(),
        ));
    }
    let block = pane_block(app, PaneId::Text, title, area.width);
    let inner = block.inner(area);
    frame.render_widget(block, area);
    if inner.width < 4 || inner.height < 3 {
        return;
    }
    let width = inner.width as usize;

    // Banner.
    let mut banner: Vec<Line> = Vec::new();
    if app.live.model.as_ref().is_some_and(|m| m.synthetic) {
        for l in wrap(SYNTHETIC_BANNER, width) {
            banner.push(Line::from(Span::styled(l, th.warn())));
        }
    }

    // Input box lines.
    let prompt_w = 2usize;
    let in_w = width.saturating_sub(prompt_w).max(1);
    let mut input_lines: Vec<Line> = Vec::new();
    let (cur_line, cur_col) = app.input.cursor_line_col();
    let mut cursor_row = 0usize;
    let mut cursor_col = 0usize;
    if app.input.text.is_empty() && !app.input_focused {
        let hint = if app.replay.is_some() {
            "replay — Space pause, ←/→ step, +/- speed"
        } else {
            "press i or Enter to type · o settings"
        };
        input_lines.push(Line::from(vec![
            Span::styled("> ", th.dim()),
            Span::styled(hint, th.dim()),
        ]));
    } else {
        for (li, raw) in app.input.text.split('\n').enumerate() {
            let wrapped = wrap(raw, in_w);
            // Each row is a piece of `raw` in order (the spaces at a break are dropped): `at`
            // is where the row starts in `raw`, in bytes.
            let mut at = 0usize;
            for (wi, w) in wrapped.iter().enumerate() {
                let start_b = at + raw[at..].find(w.as_str()).unwrap_or(0);
                at = start_b + w.len();
                if li == cur_line {
                    // Place the cursor on the row that holds character `cur_col` (a cursor on
                    // a dropped space sits at the end of the row before it), at its display
                    // column: wide characters take two cells.
                    let start = raw[..start_b].chars().count();
                    let next = wrapped.get(wi + 1).map_or(usize::MAX, |n| {
                        raw[..at + raw[at..].find(n.as_str()).unwrap_or(0)]
                            .chars()
                            .count()
                    });
                    if cur_col >= start && cur_col < next {
                        let before: String = w.chars().take(cur_col - start).collect();
                        cursor_row = input_lines.len();
                        cursor_col = super::common::width(&before);
                    }
                }
                let lead = if li == 0 && wi == 0 { "> " } else { "  " };
                input_lines.push(Line::from(vec![
                    Span::styled(lead, th.user()),
                    Span::raw(w.clone()),
                ]));
            }
        }
    }
    let shown_input = input_lines.len().clamp(1, MAX_INPUT_LINES);
    let skip_input = if cursor_row >= shown_input {
        cursor_row + 1 - shown_input
    } else {
        0
    };

    let [banner_area, body, sep, input_area] = Layout::vertical([
        Constraint::Length(banner.len() as u16),
        Constraint::Min(1),
        Constraint::Length(1),
        Constraint::Length(shown_input as u16),
    ])
    .areas(inner);
    frame.render_widget(Paragraph::new(banner), banner_area);

    // Transcript: only the rows that can be on screen are built.
    let h = body.height as usize;
    let lines = transcript_tail(app, width, h + app.scroll as usize);
    let max_scroll = lines.len().saturating_sub(h);
    let scroll = (app.scroll as usize).min(max_scroll);
    let start = lines.len().saturating_sub(h + scroll);
    let visible: Vec<Line> = lines.into_iter().skip(start).take(h).collect();
    if visible.is_empty() {
        let hint = if app.live.model.is_none() {
            "waiting for the engine…"
        } else if app.chat_mode() {
            "say something below"
        } else {
            "type a prompt below; the model continues it"
        };
        frame.render_widget(Paragraph::new(dim_line(app, hint)), body);
    } else {
        frame.render_widget(Paragraph::new(visible), body);
    }

    let sep_style = if app.input_focused {
        th.border_focused()
    } else {
        th.border()
    };
    frame.render_widget(
        Paragraph::new(Line::from(Span::styled("─".repeat(width), sep_style))),
        sep,
    );
    let shown: Vec<Line> = input_lines
        .into_iter()
        .skip(skip_input)
        .take(shown_input)
        .collect();
    frame.render_widget(Paragraph::new(shown), input_area);
    if app.input_focused && app.focus == PaneId::Text && !app.show_help {
        let x = input_area.x + (prompt_w + cursor_col).min(width - 1) as u16;
        let y = input_area.y + (cursor_row - skip_input) as u16;
        frame.set_cursor_position(Position { x, y });
    }
}

/// Wrapped rows of finished turns, by (transcript epoch, turn index, width): a finished turn
/// never changes, so it is wrapped once, not at every frame. The streaming turn is wrapped at
/// every frame (it grows). Interior mutability: drawing takes `&App`. Not part of the UI state:
/// every cache compares equal.
#[derive(Default)]
pub struct WrapCache(RefCell<HashMap<(u64, usize, usize), CachedTurn>>);

/// One turn's rows and what they were built from.
struct CachedTurn {
    /// (text length, end, summary length) of the turn when wrapped.
    key: (usize, Option<StopReason>, usize),
    lines: Vec<Line<'static>>,
}

impl Clone for WrapCache {
    fn clone(&self) -> Self {
        WrapCache::default()
    }
}

impl PartialEq for WrapCache {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl std::fmt::Debug for WrapCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WrapCache({} turns)", self.0.borrow().len())
    }
}

impl WrapCache {
    /// Turns currently cached (for tests).
    pub fn len(&self) -> usize {
        self.0.borrow().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The rows of turn `i`, wrapped to `width`.
fn turn_lines(app: &App, i: usize, width: usize) -> Vec<Line<'static>> {
    let th = &app.theme;
    let label_w = 6usize;
    let text_w = width.saturating_sub(label_w).max(1);
    let turn = &app.transcript[i];
    let (label, lstyle, tstyle) = match turn.role {
        Role::User => ("you", th.user(), th.text()),
        Role::Model => ("model", th.assistant(), th.text()),
        Role::System => ("·", th.dim(), th.dim()),
        Role::Error => ("error", th.bad(), th.bad()),
    };
    let mut out = Vec::new();
    let streaming = turn.role == Role::Model && i + 1 == app.transcript.len() && app.generating;
    let rows = if streaming {
        let mut text = turn.text.clone();
        text.push('▌');
        wrap(&text, text_w)
    } else {
        wrap(&turn.text, text_w)
    };
    for (ri, r) in rows.into_iter().enumerate() {
        let lead = if ri == 0 {
            format!("{label:<label_w$}")
        } else {
            " ".repeat(label_w)
        };
        out.push(Line::from(vec![
            Span::styled(lead, lstyle),
            Span::styled(r, tstyle),
        ]));
    }
    let end = match turn.end {
        Some(StopReason::Stopped) => Some("[stopped]"),
        Some(StopReason::ContextFull) => Some("[context full]"),
        Some(StopReason::Error) => Some("[error]"),
        Some(StopReason::Length) => Some("[max tokens]"),
        _ => None,
    };
    if let (Role::Model, Some(e)) = (turn.role, end) {
        out.push(Line::from(vec![
            Span::raw(" ".repeat(label_w)),
            Span::styled(e, th.dim()),
        ]));
    }
    if let Some(sum) = app.summaries.get(&i) {
        for r in wrap(sum, text_w) {
            out.push(Line::from(vec![
                Span::raw(" ".repeat(label_w)),
                Span::styled(r, th.dim()),
            ]));
        }
    }
    out
}

/// The last `rows` transcript lines, wrapped and styled (oldest first; all of them when there
/// are fewer). Finished turns come from the [`WrapCache`]; turns above the window are not built.
pub fn transcript_tail(app: &App, width: usize, rows: usize) -> Vec<Line<'static>> {
    let n = app.transcript.len();
    let mut chunks: Vec<Vec<Line<'static>>> = Vec::new();
    let mut have = 0usize;
    let mut cache = app.wrapped.0.borrow_mut();
    for i in (0..n).rev() {
        if have >= rows {
            break;
        }
        let turn = &app.transcript[i];
        let streaming = i + 1 == n && app.generating;
        // Only the rows still needed are copied out (a long finished reply has thousands).
        let need = rows - have;
        let tail = |v: &[Line<'static>]| v[v.len().saturating_sub(need)..].to_vec();
        let lines = if streaming {
            tail(&turn_lines(app, i, width))
        } else {
            let key = (
                turn.text.len(),
                turn.end,
                app.summaries.get(&i).map_or(0, |s| s.len() + 1),
            );
            let hit = cache
                .get(&(app.transcript_epoch, i, width))
                .filter(|c| c.key == key)
                .map(|c| tail(&c.lines));
            match hit {
                Some(lines) => lines,
                None => {
                    let lines = turn_lines(app, i, width);
                    let t = tail(&lines);
                    cache.insert((app.transcript_epoch, i, width), CachedTurn { key, lines });
                    t
                }
            }
        };
        have += lines.len();
        chunks.push(lines);
    }
    // Entries of older epochs or widths are dropped now and then (resizes, new sessions).
    if cache.len() > 4 * n + 64 {
        let epoch = app.transcript_epoch;
        cache.retain(|k, _| k.0 == epoch && k.2 == width);
    }
    let mut out: Vec<Line<'static>> = chunks.into_iter().rev().flatten().collect();
    if out.len() > rows {
        out.drain(..out.len() - rows);
    }
    out
}

/// The whole transcript as wrapped, styled lines (oldest first).
pub fn transcript_lines(app: &App, width: usize) -> Vec<Line<'static>> {
    transcript_tail(app, width, usize::MAX)
}
