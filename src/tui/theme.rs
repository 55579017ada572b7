//! Colours and text styles for every pane, in one place.
//!
//! `Theme::from_env()` honours `NO_COLOR` (<https://no-color.org>): when it is set to any non-empty
//! value the theme keeps only modifiers (bold, dim, reversed) so every piece of information stays
//! readable without colour. Panes never construct colours themselves; they ask the theme.

use ratatui::style::{Color, Modifier, Style};

/// The palette used by all panes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Theme {
    /// False under `NO_COLOR`.
    pub color: bool,
}

impl Default for Theme {
    fn default() -> Self {
        Theme { color: true }
    }
}

impl Theme {
    /// Colour unless the `NO_COLOR` environment variable is set and non-empty.
    pub fn from_env() -> Self {
        let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        Theme { color: !no_color }
    }

    /// A monochrome theme (what `NO_COLOR` gives).
    pub fn mono() -> Self {
        Theme { color: false }
    }

    fn fg(&self, c: Color) -> Style {
        if self.color {
            Style::new().fg(c)
        } else {
            Style::new()
        }
    }

    /// Ordinary text.
    pub fn text(&self) -> Style {
        Style::new()
    }
    /// Secondary text: units, labels, hints.
    pub fn dim(&self) -> Style {
        self.fg(Color::DarkGray).add_modifier(if self.color {
            Modifier::empty()
        } else {
            Modifier::DIM
        })
    }
    /// Emphasised figures.
    pub fn strong(&self) -> Style {
        Style::new().add_modifier(Modifier::BOLD)
    }
    /// Border of an unfocused pane.
    pub fn border(&self) -> Style {
        self.fg(Color::DarkGray)
    }
    /// Border and title of the focused pane.
    pub fn border_focused(&self) -> Style {
        self.fg(Color::Cyan).add_modifier(Modifier::BOLD)
    }
    /// Pane titles.
    pub fn title(&self) -> Style {
        Style::new().add_modifier(Modifier::BOLD)
    }
    /// The attention stream.
    pub fn attn(&self) -> Style {
        self.fg(Color::Blue)
    }
    /// The dense FFN stream.
    pub fn dense(&self) -> Style {
        self.fg(Color::Green)
    }
    /// The expert stream.
    pub fn experts(&self) -> Style {
        self.fg(Color::Magenta)
    }
    /// The KV-cache read stream.
    pub fn kv(&self) -> Style {
        self.fg(Color::LightRed)
    }
    /// The vocabulary (LM head) stream.
    pub fn vocab(&self) -> Style {
        self.fg(Color::Yellow)
    }
    /// Modelled / estimated figures.
    pub fn model(&self) -> Style {
        self.fg(Color::Yellow).add_modifier(Modifier::ITALIC)
    }
    /// Measured figures.
    pub fn measured(&self) -> Style {
        self.fg(Color::Cyan)
    }
    /// Good news (ON toggles, speedups).
    pub fn good(&self) -> Style {
        self.fg(Color::Green).add_modifier(Modifier::BOLD)
    }
    /// Warnings (notes, degenerate modes, synthetic banner).
    pub fn warn(&self) -> Style {
        self.fg(Color::Yellow).add_modifier(Modifier::BOLD)
    }
    /// Errors and the recording dot.
    pub fn bad(&self) -> Style {
        self.fg(Color::Red).add_modifier(Modifier::BOLD)
    }
    /// The user's turns in the transcript.
    pub fn user(&self) -> Style {
        self.fg(Color::Cyan).add_modifier(Modifier::BOLD)
    }
    /// The model's turns in the transcript.
    pub fn assistant(&self) -> Style {
        self.fg(Color::Green).add_modifier(Modifier::BOLD)
    }
    /// Status bar background.
    pub fn bar(&self) -> Style {
        if self.color {
            Style::new().bg(Color::Rgb(30, 30, 46)).fg(Color::White)
        } else {
            Style::new().add_modifier(Modifier::REVERSED)
        }
    }
    /// Key names in the footer and help.
    pub fn key(&self) -> Style {
        self.fg(Color::Cyan).add_modifier(Modifier::BOLD)
    }
    /// Badges like REPLAY, FROZEN, WHAT-IF.
    pub fn badge(&self) -> Style {
        if self.color {
            Style::new()
                .bg(Color::Yellow)
                .fg(Color::Black)
                .add_modifier(Modifier::BOLD)
        } else {
            Style::new().add_modifier(Modifier::REVERSED | Modifier::BOLD)
        }
    }
    /// Heat shade for a value in 0..=1 (routing heatmap); colour plus a glyph so it reads mono.
    pub fn heat(&self, x: f64) -> (char, Style) {
        let x = x.clamp(0.0, 1.0);
        let glyph = if x <= 0.0 {
            '·'
        } else if x < 0.25 {
            '░'
        } else if x < 0.5 {
            '▒'
        } else if x < 0.75 {
            '▓'
        } else {
            '█'
        };
        let color = if x <= 0.0 {
            Color::DarkGray
        } else if x < 0.25 {
            Color::Blue
        } else if x < 0.5 {
            Color::Cyan
        } else if x < 0.75 {
            Color::Yellow
        } else {
            Color::Red
        };
        (glyph, self.fg(color))
    }
}
