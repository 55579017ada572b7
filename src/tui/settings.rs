//! The chat settings overlay (`o`): sampling (temperature, top-k, top-p, min-p, repeat
//! penalty, seed) and the system prompt, edited on a draft and sent to the engine on Enter as
//! `SetSampling` / `SetSystemPrompt` (the engine answers with a `Settings` event, which is what
//! the header shows and what traces record). ↑/↓ pick a field, ←/→ step it, typing replaces a
//! number (or edits the system prompt), Esc drops the draft.

use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, BorderType, Borders, Clear, Paragraph};
use ratatui::Frame;

use super::app::App;
use super::common::{centered, truncate, wrap};
use crate::chat::sampling::validate;
use crate::telemetry::event::{Command, GenSettings, SamplingParams};

/// The editable fields, in display order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    Temperature,
    TopK,
    TopP,
    MinP,
    RepeatPenalty,
    Seed,
    System,
}

pub const FIELDS: [Field; 7] = [
    Field::Temperature,
    Field::TopK,
    Field::TopP,
    Field::MinP,
    Field::RepeatPenalty,
    Field::Seed,
    Field::System,
];

impl Field {
    pub fn label(self) -> &'static str {
        match self {
            Field::Temperature => "temperature",
            Field::TopK => "top-k",
            Field::TopP => "top-p",
            Field::MinP => "min-p",
            Field::RepeatPenalty => "repeat penalty",
            Field::Seed => "seed",
            Field::System => "system prompt",
        }
    }

    /// What the field means, shown beside it.
    pub fn hint(self) -> &'static str {
        match self {
            Field::Temperature => "0 = greedy · ←→ ±0.05",
            Field::TopK => "0 = all · ←→ ±5",
            Field::TopP => "nucleus · ←→ ±0.05",
            Field::MinP => "× top prob · 0 = off · ←→ ±0.01",
            Field::RepeatPenalty => "1 = off · ←→ ±0.05",
            Field::Seed => "←→ ±1",
            Field::System => "type to edit · next reply",
        }
    }
}

/// Steps `v` by `d` multiples of `step` on the `step` grid, within `[lo, hi]`.
fn step(v: f32, d: i32, step: f32, lo: f32, hi: f32) -> f32 {
    let n = (v / step).round() + d as f32;
    (n * step).clamp(lo, hi)
}

/// The open overlay: a draft of the settings.
#[derive(Clone, Debug, PartialEq)]
pub struct SettingsEditor {
    pub sampling: SamplingParams,
    pub system: String,
    pub row: usize,
    /// A number being typed into the current row (committed on move, step or apply).
    pub typed: Option<String>,
    /// Why the last typed number was refused.
    pub error: Option<String>,
}

impl SettingsEditor {
    pub fn new(s: &GenSettings) -> Self {
        SettingsEditor {
            sampling: s.sampling.clone(),
            system: s.system.clone(),
            row: 0,
            typed: None,
            error: None,
        }
    }

    pub fn field(&self) -> Field {
        FIELDS[self.row.min(FIELDS.len() - 1)]
    }

    /// The current value of a numeric field as text.
    pub fn value(&self, f: Field) -> String {
        let p = &self.sampling;
        match f {
            Field::Temperature => format!("{:.2}", p.temperature),
            Field::TopK => p.top_k.to_string(),
            Field::TopP => format!("{:.2}", p.top_p),
            Field::MinP => format!("{:.2}", p.min_p),
            Field::RepeatPenalty => format!("{:.2}", p.repeat_penalty),
            Field::Seed => p.seed.to_string(),
            Field::System => self.system.clone(),
        }
    }

    /// Parses a typed number into the current field; false (and `error`) when refused.
    fn commit(&mut self) -> bool {
        let Some(t) = self.typed.take() else {
            return true;
        };
        let f = self.field();
        let mut p = self.sampling.clone();
        let ok = match f {
            Field::Temperature => t.parse().map(|v| p.temperature = v).is_ok(),
            Field::TopK => t.parse().map(|v| p.top_k = v).is_ok(),
            Field::TopP => t.parse().map(|v| p.top_p = v).is_ok(),
            Field::MinP => t.parse().map(|v| p.min_p = v).is_ok(),
            Field::RepeatPenalty => t.parse().map(|v| p.repeat_penalty = v).is_ok(),
            Field::Seed => t.parse().map(|v| p.seed = v).is_ok(),
            Field::System => true,
        };
        let checked = if ok {
            validate(&p).map_err(|e| e.0.replace("--", ""))
        } else {
            Err(format!("{}: `{t}` is not a number", f.label()))
        };
        match checked {
            Ok(()) => {
                self.sampling = p;
                self.error = None;
                true
            }
            Err(e) => {
                self.error = Some(e);
                false
            }
        }
    }

    pub fn move_row(&mut self, d: i32) {
        self.commit();
        let n = FIELDS.len() as i32;
        self.row = (self.row as i32 + d).rem_euclid(n) as usize;
    }

    pub fn adjust(&mut self, d: i32) {
        self.commit();
        let f = self.field();
        let p = &mut self.sampling;
        match f {
            Field::Temperature => p.temperature = step(p.temperature, d, 0.05, 0.0, 2.0),
            Field::TopK => p.top_k = (p.top_k as i64 + 5 * d as i64).clamp(0, 1000) as u32,
            Field::TopP => p.top_p = step(p.top_p, d, 0.05, 0.05, 1.0),
            Field::MinP => p.min_p = step(p.min_p, d, 0.01, 0.0, 1.0),
            Field::RepeatPenalty => p.repeat_penalty = step(p.repeat_penalty, d, 0.05, 0.5, 2.0),
            Field::Seed => p.seed = p.seed.saturating_add_signed(d as i64),
            Field::System => {}
        }
    }

    pub fn insert(&mut self, c: char) {
        if self.field() == Field::System {
            self.system.push(c);
        } else if c.is_ascii_digit() || c == '.' {
            self.typed.get_or_insert_with(String::new).push(c);
        }
    }

    pub fn backspace(&mut self) {
        if self.field() == Field::System {
            self.system.pop();
        } else if let Some(t) = &mut self.typed {
            t.pop();
        } else {
            self.typed = Some(String::new());
        }
    }

    /// The commands that turn `cur` into the draft (none when nothing changed), or the error
    /// of a refused typed number.
    pub fn apply(&mut self, cur: &GenSettings) -> Result<Vec<Command>, String> {
        if !self.commit() {
            return Err(self.error.clone().unwrap_or_default());
        }
        let mut out = Vec::new();
        if self.sampling != cur.sampling {
            out.push(Command::SetSampling(self.sampling.clone()));
        }
        if self.system != cur.system {
            out.push(Command::SetSystemPrompt(self.system.clone()));
        }
        Ok(out)
    }
}

/// Draws the overlay centred over `area`.
pub fn render(frame: &mut Frame, area: Rect, app: &App) {
    let Some(ed) = &app.editor else {
        return;
    };
    let th = &app.theme;
    let w = area.width.saturating_sub(4).min(72);
    let label_w = 15usize;
    let inner_w = w.saturating_sub(2) as usize;
    let val_w = inner_w.saturating_sub(label_w + 2).max(1);
    let mut lines: Vec<Line> = Vec::new();
    for (i, f) in FIELDS.iter().enumerate() {
        let sel = i == ed.row;
        let mut val = match (&ed.typed, sel) {
            (Some(t), true) => format!("{t}▌"),
            _ => ed.value(*f),
        };
        let style = if sel { th.badge() } else { th.text() };
        let lead = Span::styled(
            format!("{}{:<label_w$}", if sel { "›" } else { " " }, f.label()),
            if sel { th.key() } else { th.dim() },
        );
        if *f == Field::System {
            if sel {
                val.push('▌');
            }
            let rows = if val.is_empty() {
                vec!["(none)".to_string()]
            } else {
                wrap(&val, val_w)
            };
            for (ri, r) in rows.iter().take(4).enumerate() {
                let l = if ri == 0 {
                    lead.clone()
                } else {
                    Span::raw(" ".repeat(label_w + 1))
                };
                lines.push(Line::from(vec![
                    l,
                    Span::raw(" "),
                    Span::styled(r.clone(), style),
                ]));
            }
        } else {
            let val = format!("{val:<8}");
            let hint_w = val_w.saturating_sub(val.chars().count() + 2);
            lines.push(Line::from(vec![
                lead,
                Span::raw(" "),
                Span::styled(val, style),
                Span::raw("  "),
                Span::styled(truncate(f.hint(), hint_w), th.dim()),
            ]));
        }
    }
    lines.push(Line::from(""));
    match &ed.error {
        Some(e) => lines.push(Line::from(Span::styled(truncate(e, inner_w), th.bad()))),
        None => lines.push(Line::from(Span::styled(
            truncate(
                "↑↓ field · ←→ step · type a value · Enter apply · Esc cancel",
                inner_w,
            ),
            th.dim(),
        ))),
    }
    let h = (lines.len() as u16 + 2).min(area.height);
    let popup = centered(area, w, h);
    frame.render_widget(Clear, popup);
    let block = Block::default()
        .borders(Borders::ALL)
        .border_type(BorderType::Rounded)
        .border_style(th.border_focused())
        .title(Line::from(vec![
            Span::styled(" Chat settings ", th.title()),
            Span::styled("· apply to the next reply ", th.dim()),
        ]));
    let inner = block.inner(popup);
    frame.render_widget(block, popup);
    frame.render_widget(Paragraph::new(lines), inner);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::sampling::chat_defaults;

    fn settings() -> GenSettings {
        GenSettings {
            sampling: chat_defaults(),
            system: String::new(),
            act: "f32".into(),
            kv: "f32".into(),
        }
    }

    #[test]
    fn steps_stay_on_the_grid_and_in_range() {
        let mut e = SettingsEditor::new(&settings());
        for _ in 0..3 {
            e.adjust(1);
        }
        assert_eq!(e.value(Field::Temperature), "0.85");
        for _ in 0..100 {
            e.adjust(-1);
        }
        assert_eq!(e.sampling.temperature, 0.0);
        e.move_row(-1); // wraps to the system prompt
        assert_eq!(e.field(), Field::System);
        e.move_row(-1);
        assert_eq!(e.field(), Field::Seed);
        e.adjust(-1);
        assert_eq!(e.sampling.seed, 0, "seed saturates at 0");
        e.move_row(-3); // top-p
        assert_eq!(e.field(), Field::TopP);
        for _ in 0..30 {
            e.adjust(1);
        }
        assert_eq!(e.sampling.top_p, 1.0);
    }

    #[test]
    fn typed_numbers_and_system_prompt_become_commands() {
        let cur = settings();
        let mut e = SettingsEditor::new(&cur);
        assert_eq!(e.apply(&cur).unwrap(), vec![], "nothing changed");
        e.move_row(5); // seed
        for c in "42".chars() {
            e.insert(c);
        }
        e.move_row(1); // system prompt (commits the seed)
        for c in "Be brief.".chars() {
            e.insert(c);
        }
        e.backspace();
        let cmds = e.apply(&cur).unwrap();
        let mut want = chat_defaults();
        want.seed = 42;
        assert_eq!(
            cmds,
            vec![
                Command::SetSampling(want),
                Command::SetSystemPrompt("Be brief".into())
            ]
        );
    }

    #[test]
    fn a_bad_typed_number_is_refused_with_the_field_named() {
        let cur = settings();
        let mut e = SettingsEditor::new(&cur);
        e.move_row(2); // top-p
        for c in "1.5".chars() {
            e.insert(c);
        }
        let err = e.apply(&cur).unwrap_err();
        assert!(err.contains("top-p"), "{err}");
        assert_eq!(e.sampling.top_p, 0.95);
        e.insert('.');
        e.insert('.');
        let err = e.apply(&cur).unwrap_err();
        assert!(err.contains("not a number"), "{err}");
    }
}
