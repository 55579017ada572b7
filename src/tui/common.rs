//! Small shared drawing helpers: pane blocks (focus, FROZEN badge), number formatting, bars and
//! text wrapping. Pure functions only.

use ratatui::layout::Rect;
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, BorderType, Borders};

use super::app::{App, PaneId};

pub use crate::util::MIB;

/// The bordered block of a pane: title, focus highlight, FROZEN badge on metric panes.
///
/// `width` is the pane's width: when the title and the badge do not fit on the top border, the
/// title's trailing spans are dropped (then its first one shortened with "…") so that the badge
/// stays whole.
pub fn pane_block<'a>(app: &App, pane: PaneId, title: Vec<Span<'a>>, width: u16) -> Block<'a> {
    let th = &app.theme;
    let focused = app.focus == pane;
    let frozen = app.frozen.is_some() && pane != PaneId::Text;
    // Borders (2), the spaces around the title (2), the badge and its space.
    let room = (width as usize).saturating_sub(4 + if frozen { 9 } else { 0 });
    let mut spans = vec![Span::raw(" ")];
    spans.extend(fit_title(title, room));
    spans.push(Span::raw(" "));
    if frozen {
        spans.push(Span::styled(" FROZEN ", th.badge()));
        spans.push(Span::raw(" "));
    }
    let border = if focused {
        th.border_focused()
    } else {
        th.border()
    };
    Block::default()
        .borders(Borders::ALL)
        .border_type(if focused {
            BorderType::Thick
        } else {
            BorderType::Plain
        })
        .border_style(border)
        .title(Line::from(spans).style(if focused {
            th.border_focused()
        } else {
            th.title()
        }))
}

/// Characters in `spans`.
pub fn spans_width(spans: &[Span]) -> usize {
    spans.iter().map(|s| s.content.chars().count()).sum()
}

/// A title in at most `room` characters: the last span shortened with "…" while it keeps 8
/// characters, else dropped, then the first one shortened.
pub fn fit_title(mut title: Vec<Span<'_>>, room: usize) -> Vec<Span<'_>> {
    while title.len() > 1 && spans_width(&title) > room {
        let rest = spans_width(&title[..title.len() - 1]);
        match title.last_mut() {
            Some(last) if room.saturating_sub(rest) >= 8 => {
                last.content = truncate(&last.content, room - rest).into();
            }
            _ => {
                title.pop();
            }
        }
    }
    if let Some(first) = title.first_mut() {
        if first.content.chars().count() > room {
            first.content = truncate(&first.content, room).into();
        }
    }
    title
}

/// The first of `forms` (longest first) that fits in `width` characters, else the last one.
pub fn fit_line<'a>(forms: Vec<Vec<Span<'a>>>, width: usize) -> Line<'a> {
    let n = forms.len();
    for (i, f) in forms.into_iter().enumerate() {
        if i + 1 == n || spans_width(&f) <= width {
            return Line::from(f);
        }
    }
    Line::default()
}

/// "0.75" (MiB, two decimals).
pub fn mib(bytes: f64) -> String {
    format!("{:.2}", bytes / MIB)
}

/// Milliseconds from ns with a sensible precision.
pub fn ms(ns: f64) -> String {
    let m = ns / 1e6;
    if m >= 100.0 {
        format!("{m:.0}")
    } else if m >= 10.0 {
        format!("{m:.1}")
    } else {
        format!("{m:.2}")
    }
}

/// A count with k/M/G suffixes.
pub fn count(n: u64) -> String {
    let x = n as f64;
    if x >= 1e9 {
        format!("{:.2}G", x / 1e9)
    } else if x >= 1e6 {
        format!("{:.2}M", x / 1e6)
    } else if x >= 1e4 {
        format!("{:.1}k", x / 1e3)
    } else {
        format!("{n}")
    }
}

/// A ratio as "2.00×".
pub fn times(x: f64) -> String {
    format!("{x:.2}×")
}

/// Cells for `frac` of `width`, rounded to whole cells.
pub fn cells(frac: f64, width: u16) -> u16 {
    if !frac.is_finite() || frac <= 0.0 {
        return 0;
    }
    ((frac.min(1.0) * width as f64).round() as u16).min(width)
}

/// A horizontal stacked bar: segments of (value, glyph, style) scaled so that `scale` fills `width`.
/// Rounds cumulatively so the segments add up exactly. The remainder is padded with `rest`.
pub fn stacked_bar<'a>(
    segments: &[(f64, char, Style)],
    scale: f64,
    width: u16,
    rest: (char, Style),
) -> Vec<Span<'a>> {
    let mut spans = Vec::new();
    let mut acc = 0.0;
    let mut used = 0u16;
    for &(v, glyph, style) in segments {
        acc += v.max(0.0);
        let end = if scale > 0.0 {
            cells(acc / scale, width)
        } else {
            0
        };
        if end > used {
            spans.push(Span::styled(
                glyph.to_string().repeat((end - used) as usize),
                style,
            ));
            used = end;
        }
    }
    if used < width {
        spans.push(Span::styled(
            rest.0.to_string().repeat((width - used) as usize),
            rest.1,
        ));
    }
    spans
}

/// Greedy word wrap to `width` terminal cells (≥ 1; `textwrap`, widths by `unicode-width`).
/// Newlines start new lines; words break at ASCII spaces, and a word longer than a line breaks.
pub fn wrap(text: &str, width: usize) -> Vec<String> {
    let opts = textwrap::Options::new(width.max(1))
        .break_words(true)
        .word_separator(textwrap::WordSeparator::AsciiSpace)
        .word_splitter(textwrap::WordSplitter::NoHyphenation)
        .wrap_algorithm(textwrap::WrapAlgorithm::FirstFit);
    textwrap::wrap(text, opts)
        .into_iter()
        .map(|l| l.into_owned())
        .collect()
}

/// Display width of `s` in terminal cells (a CJK character or an emoji takes two).
pub fn width(s: &str) -> usize {
    unicode_width::UnicodeWidthStr::width(s)
}

/// Truncate a string to `cells` terminal cells of display width, ending with '…' when cut.
pub fn truncate(s: &str, cells: usize) -> String {
    if width(s) <= cells {
        return s.to_string();
    }
    if cells == 0 {
        return String::new();
    }
    let mut t = String::new();
    let mut used = 0;
    for c in s.chars() {
        let w = unicode_width::UnicodeWidthChar::width(c).unwrap_or(0);
        if used + w > cells - 1 {
            break;
        }
        t.push(c);
        used += w;
    }
    t.push('…');
    t
}

/// A centred rectangle of at most `w`×`h` inside `area`.
pub fn centered(area: Rect, w: u16, h: u16) -> Rect {
    let w = w.min(area.width);
    let h = h.min(area.height);
    Rect {
        x: area.x + (area.width - w) / 2,
        y: area.y + (area.height - h) / 2,
        width: w,
        height: h,
    }
}

/// A placeholder line in the dim style.
pub fn dim_line<'a>(app: &App, s: impl Into<String>) -> Line<'a> {
    Line::from(Span::styled(s.into(), app.theme.dim()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrap_words_and_long_words() {
        assert_eq!(wrap("hello world", 5), vec!["hello", "world"]);
        assert_eq!(wrap("abcdefghij", 4), vec!["abcd", "efgh", "ij"]);
        assert_eq!(wrap("a\nb", 10), vec!["a", "b"]);
        assert_eq!(wrap("", 10), vec![""]);
        assert_eq!(wrap("one two three", 8), vec!["one two", "three"]);
    }

    #[test]
    fn stacked_bar_adds_up() {
        let s = Style::new();
        let spans = stacked_bar(&[(1.0, 'a', s), (2.0, 'b', s)], 4.0, 8, ('.', s));
        let text: String = spans.iter().map(|s| s.content.as_ref()).collect();
        assert_eq!(text, "aabbbb..");
    }

    #[test]
    fn titles_and_lines_fit_their_room() {
        let t = vec![
            Span::raw("Overlap"),
            Span::raw(" · staged vs sync"),
            Span::raw(" · now"),
        ];
        let w = |v: &[Span]| spans_width(v);
        assert_eq!(w(&fit_title(t.clone(), 100)), 30);
        assert_eq!(w(&fit_title(t.clone(), 26)), 24);
        let cut = fit_title(t.clone(), 20);
        assert_eq!(cut[1].content, " · staged vs…");
        assert_eq!(w(&fit_title(t.clone(), 7)), 7);
        let short = fit_title(t, 4);
        assert_eq!(short[0].content, "Ove…");
        assert!(fit_title(vec![], 0).is_empty());
        let forms = vec![vec![Span::raw("long form")], vec![Span::raw("short")]];
        assert_eq!(fit_line(forms.clone(), 9).to_string(), "long form");
        assert_eq!(fit_line(forms.clone(), 8).to_string(), "short");
        assert_eq!(fit_line(forms, 2).to_string(), "short");
        assert_eq!(fit_line(vec![], 2).to_string(), "");
    }

    #[test]
    fn truncate_marks_cut() {
        assert_eq!(truncate("abcdef", 4), "abc…");
        assert_eq!(truncate("abc", 4), "abc");
        // Wide characters take two cells: three fit in 7 cells with the ellipsis.
        assert_eq!(truncate("日本語のテキスト", 7), "日本語…");
        assert_eq!(width(&truncate("日本語のテキスト", 7)), 7);
    }

    #[test]
    fn wrap_counts_display_width() {
        // Each of these characters is two cells wide: three per 6-cell row.
        assert_eq!(
            wrap("日本語のテキスト", 6),
            vec!["日本語", "のテキ", "スト"]
        );
        assert!(wrap("🦀🦀🦀 crab", 4).iter().all(|l| width(l) <= 4));
    }
}
