//! The Timeline pane: the whole run's ms/token (measured) or effective GB/s (the token's bytes
//! as stored over its measured time — the Streams pane's figure) as bars over a y-axis with
//! units, one column per `zoom` tokens (the mean of the column; min–max of the window below),
//! with a marker row — `P` where a prompt was prefilled, `T` where a toggle took effect — like a
//! Perfetto track with instant events. It pans back through the run (`[` `]`, `.` = live) and
//! zooms (`<` `>`); the data is `history::History`, bounded for long runs.

use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use ratatui::Frame;

use super::app::{App, PaneId, TimelineMetric};
use super::common::{dim_line, pane_block, spans_width};
use super::history::{Bucket, MARK_PREFILL, MARK_TOGGLE};
use super::telemetry::Mark;

const BARS: [char; 9] = [' ', '▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
/// Width of the y-axis labels and their tick.
const AXIS_W: usize = 7;

/// A column's value in the metric's unit.
pub fn value(b: &Bucket, m: TimelineMetric) -> f64 {
    match m {
        TimelineMetric::Ms => b.ms_mean(),
        TimelineMetric::Gbs => b.gbs(),
    }
}

/// A number for an axis label (≤ 6 characters).
fn axis_num(x: f64) -> String {
    if x >= 1000.0 {
        format!("{:.0}k", x / 1000.0)
    } else if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

/// The top of the y-axis: the largest value rounded up to 1, 2 or 5 × 10ⁿ (1 when there is
/// nothing to plot).
pub fn nice_max(x: f64) -> f64 {
    if !x.is_finite() || x <= 0.0 {
        return 1.0;
    }
    let p = 10f64.powf(x.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * p)
        .find(|&v| v >= x * (1.0 - 1e-9))
        .unwrap_or(10.0 * p)
}

/// The y-axis range for values in `lo..=hi`: from 0 when they vary by more than half the
/// largest, else from a round floor under the smallest, so that small changes stay visible
/// (the bottom label says where the axis starts).
pub fn axis_range(lo: f64, hi: f64) -> (f64, f64) {
    let top = nice_max(hi);
    if !lo.is_finite() || lo <= 0.0 || hi <= 0.0 || hi - lo > 0.5 * hi {
        return (0.0, top);
    }
    let step = nice_max((hi - lo).max(hi * 0.02)) / 2.0;
    let floor = (lo / step).floor() * step;
    let ceil = ((hi / step).ceil() * step).max(floor + step);
    (floor.max(0.0), ceil)
}

/// The glyph rows of the bars (top row first) for `vals` on the axis `y0..ymax` over `rows`
/// rows (a value at or under `y0` gets the lowest glyph when it is positive).
pub fn bar_rows(vals: &[f64], (y0, ymax): (f64, f64), rows: usize) -> Vec<String> {
    let span = ymax - y0;
    (0..rows)
        .map(|r| {
            let below = (rows - 1 - r) * 8;
            vals.iter()
                .map(|&v| {
                    let eighths = if span > 0.0 && v.is_finite() && v > 0.0 {
                        (((v - y0) / span).clamp(0.0, 1.0) * (rows * 8) as f64)
                            .round()
                            .max(1.0) as usize
                    } else {
                        0
                    };
                    BARS[eighths.saturating_sub(below).min(8)]
                })
                .collect()
        })
        .collect()
}

/// Render the Timeline into `area`.
pub fn render(frame: &mut Frame, area: Rect, app: &App) {
    let th = &app.theme;
    let tv = app.timeline_view;
    let (unit, how) = match tv.metric {
        TimelineMetric::Ms => ("ms/token", " (measured)"),
        TimelineMetric::Gbs => ("GB/s", " (bytes as stored ÷ measured time)"),
    };
    let block = pane_block(
        app,
        PaneId::Timeline,
        vec![
            Span::styled("Timeline", th.title()),
            Span::styled(format!(" · {unit}"), th.dim()),
            Span::styled(how, th.dim()),
            Span::styled(" · [ ] pan · < > zoom · u units", th.dim()),
        ],
        area.width,
    );
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let v = app.view();
    let h = &v.history;
    if h.tokens == 0 {
        frame.render_widget(
            Paragraph::new(dim_line(app, "waiting for the first token…")),
            inner,
        );
        return;
    }
    let w = inner.width as usize;
    let ht = inner.height as usize;
    if w <= AXIS_W || ht == 0 {
        return;
    }
    let cols = w - AXIS_W;
    let (buckets, offset) = h.columns(cols, tv.zoom, tv.offset);
    let zoom = h.effective_zoom(tv.zoom);
    let vals: Vec<f64> = buckets.iter().map(|b| value(b, tv.metric)).collect();
    let (y0, ymax) = axis_range(
        vals.iter().copied().fold(f64::INFINITY, f64::min),
        vals.iter().copied().fold(0.0, f64::max),
    );
    // Rows: the bars, then the marks and the status line when there is room.
    let extra = match ht {
        1 => 0,
        2 => 1,
        _ => 2,
    };
    let rows = ht - extra;
    let mut lines: Vec<Line> = Vec::new();
    for (r, bars) in bar_rows(&vals, (y0, ymax), rows).into_iter().enumerate() {
        let label = if r == 0 {
            axis_num(ymax)
        } else if r + 1 == rows {
            if y0 == 0.0 {
                "0".to_string()
            } else {
                axis_num(y0)
            }
        } else if rows >= 5 && r == rows / 2 {
            axis_num(y0 + (ymax - y0) * (rows - r) as f64 / rows as f64)
        } else {
            String::new()
        };
        let tick = if label.is_empty() { '│' } else { '┤' };
        lines.push(Line::from(vec![
            Span::styled(format!("{label:>6}{tick}"), th.dim()),
            Span::styled(bars, th.measured()),
        ]));
    }
    if extra >= 2 {
        let marks: String = buckets
            .iter()
            .map(
                |b| match (b.marks & MARK_PREFILL != 0, b.marks & MARK_TOGGLE != 0) {
                    (true, true) => '*',
                    (true, false) => 'P',
                    (false, true) => 'T',
                    _ => ' ',
                },
            )
            .collect();
        let last_toggle = v.marks.iter().rev().find_map(|(_, m)| match m {
            Mark::Toggle(t) => Some(t.as_str()),
            Mark::Prefill(_) => None,
        });
        let mut spans = vec![
            Span::styled(format!("{:>6}└", unit_short(tv.metric)), th.dim()),
            Span::styled(marks.clone(), th.warn()),
        ];
        if let Some(t) = last_toggle {
            let note = format!(" last T: {t}");
            if marks.chars().count() + AXIS_W + note.chars().count() <= w {
                spans.push(Span::styled(note, th.dim()));
            }
        }
        lines.push(Line::from(spans));
    }
    if extra >= 1 {
        lines.push(status_line(app, &buckets, offset, zoom, w));
    }
    frame.render_widget(Paragraph::new(lines), inner);
}

/// The unit under the axis.
fn unit_short(m: TimelineMetric) -> &'static str {
    match m {
        TimelineMetric::Ms => "ms",
        TimelineMetric::Gbs => "GB/s",
    }
}

/// Which tokens are shown, how many per column, live or how far back, the window's range and
/// (GB/s) the measured read ceiling — longest form that fits.
fn status_line(app: &App, buckets: &[Bucket], offset: u64, zoom: u64, w: usize) -> Line<'static> {
    let th = &app.theme;
    let tv = app.timeline_view;
    let (Some(first), Some(last)) = (buckets.first(), buckets.last()) else {
        return Line::default();
    };
    let from = first.first;
    let to = last.first + last.n.saturating_sub(1);
    let (lo, hi) = match tv.metric {
        TimelineMetric::Ms => buckets.iter().fold((f64::INFINITY, 0.0f64), |(a, b), k| {
            (a.min(k.ms_min), b.max(k.ms_max))
        }),
        TimelineMetric::Gbs => buckets.iter().fold((f64::INFINITY, 0.0f64), |(a, b), k| {
            (a.min(k.gbs_min), b.max(k.gbs_max))
        }),
    };
    let lo = if lo.is_finite() { lo } else { 0.0 };
    let unit = unit_short(tv.metric);
    let pos = if offset == 0 {
        Span::styled("live", th.good())
    } else {
        Span::styled(format!("◂ {offset} tok back (. = live)"), th.warn())
    };
    let ceiling = match tv.metric {
        TimelineMetric::Gbs => {
            let threads = app.view().config.as_ref().map_or(1, |c| c.threads);
            app.bandwidth
                .as_ref()
                .and_then(|b| b.ceiling_for(threads))
                .map(|c| format!(" · ceiling {:.1} GB/s (measured)", c.read_gbps))
        }
        TimelineMetric::Ms => None,
    };
    let form = |range: bool, ceil: bool, per: &str| {
        let mut s = vec![
            Span::styled(format!("tok {from}–{to} · {zoom}{per} · "), th.dim()),
            pos.clone(),
        ];
        if range {
            s.push(Span::styled(
                format!(" · min {} max {} {unit}", axis_num(lo), axis_num(hi)),
                th.dim(),
            ));
        }
        if let (true, Some(c)) = (ceil, &ceiling) {
            s.push(Span::styled(c.clone(), th.dim()));
        }
        s
    };
    let forms = [
        form(true, true, " tok/col"),
        form(true, false, " tok/col"),
        form(false, false, " tok/col"),
        form(false, false, "/col"),
    ];
    for f in forms.iter() {
        if spans_width(f) <= w {
            return Line::from(f.clone());
        }
    }
    Line::from(forms[3].clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tui::app::{Action, Msg};
    use crate::tui::fixture::demo_events;

    #[test]
    fn axis_tops_are_round_and_bars_scale() {
        assert_eq!(nice_max(0.0), 1.0);
        assert_eq!(nice_max(f64::NAN), 1.0);
        assert_eq!(nice_max(9.64), 10.0);
        assert_eq!(nice_max(3.4), 5.0);
        assert_eq!(nice_max(0.12), 0.2);
        assert_eq!(nice_max(100.0), 100.0);
        let rows = bar_rows(&[0.0, 5.0, 10.0], (0.0, 10.0), 2);
        assert_eq!(rows, vec!["  █".to_string(), " ██".to_string()]);
        assert!(bar_rows(&[], (0.0, 1.0), 3).iter().all(|r| r.is_empty()));
        // Values that vary little get an axis from a round floor.
        assert_eq!(axis_range(9.42, 9.66), (9.25, 9.75));
        assert_eq!(axis_range(1.0, 9.0), (0.0, 10.0));
        assert_eq!(axis_range(f64::INFINITY, 0.0), (0.0, 1.0));
        let (a, b) = axis_range(5.0, 5.0);
        assert!(a <= 5.0 && b > 5.0, "{a} {b}");
    }

    #[test]
    fn marks_and_pan_zoom_keys_move_the_window() {
        let mut app = App::default();
        for e in demo_events(40, true) {
            app.apply(Msg::Stamped(e));
        }
        let h = &app.view().history;
        assert_eq!(h.tokens, 40);
        // The fixture prefills before token 0 and switches fetch to sync halfway.
        let (cols, _) = h.columns(100, 1, 0);
        assert_eq!(cols[0].marks & MARK_PREFILL, MARK_PREFILL);
        let toggles: Vec<u64> = cols
            .iter()
            .filter(|b| b.marks & MARK_TOGGLE != 0)
            .map(|b| b.first)
            .collect();
        assert_eq!(toggles, vec![20]);
        app.apply(Msg::Action(Action::TimelinePan(-1)));
        assert_eq!(app.timeline_view.offset, 16);
        app.apply(Msg::Action(Action::TimelinePan(-1)));
        app.apply(Msg::Action(Action::TimelinePan(-1)));
        assert_eq!(app.timeline_view.offset, 40, "clamped to the run");
        app.apply(Msg::Action(Action::TimelineLive));
        assert_eq!(app.timeline_view.offset, 0);
        app.apply(Msg::Action(Action::TimelineZoom(-1)));
        assert_eq!(app.timeline_view.zoom, 2);
        app.apply(Msg::Action(Action::TimelineZoom(1)));
        app.apply(Msg::Action(Action::TimelineZoom(1)));
        assert_eq!(app.timeline_view.zoom, 1);
        app.apply(Msg::Action(Action::TimelineMetric));
        assert_eq!(app.timeline_view.metric, TimelineMetric::Gbs);
        assert!(cols.iter().all(|b| b.gbs() > 0.0));
        // g hides it.
        app.apply(Msg::Action(Action::Timeline));
        assert!(!app.show_timeline);
    }
}
