//! The Heatmap pane: per layer (rows) × token (columns, newest at the right) over the recent
//! window — each layer's measured ms, its bytes (as stored, KV included when known), or on an
//! MoE the top expert it routed to (`h` cycles). It follows the Timeline's pan position while
//! that stays inside the window the panes keep.

use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use ratatui::Frame;

use super::app::{App, HeatMetric, PaneId};
use super::common::{dim_line, fit_line, pane_block};
use crate::telemetry::event::TokenStats;

const SHADES: [char; 5] = [' ', '░', '▒', '▓', '█'];
const EXPERT_IDS: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";

/// Layer `l`'s value at token `s`: ns (ms metric) or bytes; None for the expert metric.
fn layer_value(app: &App, s: &TokenStats, l: usize) -> f64 {
    let Some(x) = s.layers.get(l) else {
        return 0.0;
    };
    match app.heat_metric {
        HeatMetric::Ms => (x.ns_attn + x.ns_dense + x.ns_router + x.ns_experts) as f64,
        HeatMetric::Bytes | HeatMetric::Experts => {
            let kv = app
                .view()
                .model
                .as_ref()
                .and_then(|m| m.kv_layer_read_bytes(l as u32, s.pos))
                .unwrap_or(0);
            (x.bytes.attn + x.bytes.dense + x.bytes.experts + kv) as f64
        }
    }
}

/// The glyph of the top expert a layer routed to ('·' for a dense layer).
pub fn expert_glyph(s: &TokenStats, l: usize) -> char {
    match s.layers.get(l).and_then(|x| x.routing.first()) {
        Some(&(id, _)) => EXPERT_IDS.get(id as usize).map_or('+', |&c| c as char),
        None => '·',
    }
}

/// The shade of `v` between the window's smallest and largest non-zero cells (' ' only for 0;
/// quarters of the range from ░ to █).
pub fn shade(v: f64, (min, max): (f64, f64)) -> char {
    let positive = |x: f64| x.is_finite() && x > 0.0;
    if !positive(v) || !positive(max) {
        return SHADES[0];
    }
    let span = max - min;
    if !positive(span) {
        return SHADES[4];
    }
    SHADES[1 + (((v - min) / span * 4.0).floor() as usize).min(3)]
}

/// Render the heatmap into `area`.
pub fn render(frame: &mut Frame, area: Rect, app: &App) {
    let th = &app.theme;
    let metric = app.heat_metric;
    let (what, how) = match metric {
        HeatMetric::Ms => ("ms per layer", " (measured)"),
        HeatMetric::Bytes => ("MiB per layer", " (as stored, KV incl.)"),
        HeatMetric::Experts => ("top expert per layer", " (routing)"),
    };
    let block = pane_block(
        app,
        PaneId::Heatmap,
        vec![
            Span::styled("Heatmap", th.title()),
            Span::styled(format!(" · {what}"), th.dim()),
            Span::styled(how, th.dim()),
            Span::styled(" · h metric", th.dim()),
        ],
        area.width,
    );
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let v = app.view();
    let w = inner.width as usize;
    let h = inner.height as usize;
    if v.recent.is_empty() {
        frame.render_widget(
            Paragraph::new(dim_line(app, "waiting for the first token…")),
            inner,
        );
        return;
    }
    let n_layers = v.recent.iter().map(|s| s.layers.len()).max().unwrap_or(0);
    if n_layers == 0 || h == 0 {
        frame.render_widget(
            Paragraph::new(dim_line(app, "no layers in the stats")),
            inner,
        );
        return;
    }
    // The window's tokens end where the Timeline is panned to, when that is inside it.
    let first_seq = v.tokens_seen - v.recent.len() as u64;
    let end_seq = v.tokens_seen.saturating_sub(app.timeline_view.offset);
    if end_seq <= first_seq {
        frame.render_widget(
            Paragraph::new(vec![
                dim_line(
                    app,
                    format!("the panes keep the last {} tokens;", v.recent.len()),
                ),
                dim_line(app, "the Timeline is panned before them (. = live)"),
            ]),
            inner,
        );
        return;
    }
    let end = (end_seq - first_seq) as usize;
    let label_w = format!("L{}", n_layers - 1).len() + 1;
    let cols = w.saturating_sub(label_w).max(1);
    let start = end.saturating_sub(cols);
    let toks: Vec<&TokenStats> = v.recent.iter().skip(start).take(end - start).collect();
    // Rows: legend, layers (grouped when they do not fit), the token range.
    let rows = h.saturating_sub(2).max(1);
    let per_row = n_layers.div_ceil(rows);
    let groups: Vec<(usize, usize)> = (0..n_layers)
        .step_by(per_row)
        .map(|a| (a, (a + per_row).min(n_layers)))
        .collect();
    let cell = |s: &TokenStats, g: (usize, usize)| -> f64 {
        (g.0..g.1).map(|l| layer_value(app, s, l)).sum()
    };
    let (min, max) = toks
        .iter()
        .flat_map(|s| groups.iter().map(move |&g| (s, g)))
        .map(|(s, g)| cell(s, g))
        .filter(|&x| x > 0.0)
        .fold((f64::INFINITY, 0.0f64), |(a, b), x| (a.min(x), b.max(x)));
    let min = if min.is_finite() { min } else { 0.0 };
    let mut lines: Vec<Line> = Vec::new();
    let (div, unit) = match metric {
        HeatMetric::Ms => (1e6, "ms"),
        _ => (crate::util::MIB, "MiB"),
    };
    let (lo, hi) = (min / div, max / div);
    if h >= 3 {
        let legend = match metric {
            HeatMetric::Experts => vec![
                vec![Span::styled(
                    "top expert id routed at each layer (measured routing)",
                    th.dim(),
                )],
                vec![Span::styled("top expert id per layer", th.dim())],
            ],
            _ => {
                let form = |long: bool| {
                    vec![
                        Span::styled("░▒▓█", th.experts()),
                        Span::styled(
                            if long {
                                format!(
                                    " quarters of {lo:.2}–{hi:.2} {unit}{}",
                                    if per_row > 1 {
                                        format!(" ({per_row} layers per row)")
                                    } else {
                                        String::new()
                                    }
                                )
                            } else {
                                format!(" {lo:.2}–{hi:.2} {unit}")
                            },
                            th.dim(),
                        ),
                    ]
                };
                vec![form(true), form(false)]
            }
        };
        lines.push(fit_line(legend, w));
    }
    for &g in groups.iter().take(rows) {
        // A grouped row is labelled by its first layer (the legend gives the group size).
        let label = format!("L{}", g.0);
        let cells: String = toks
            .iter()
            .map(|s| match metric {
                HeatMetric::Experts => expert_glyph(s, g.0),
                _ => shade(cell(s, g), (min, max)),
            })
            .collect();
        lines.push(Line::from(vec![
            Span::styled(format!("{label:<label_w$}"), th.dim()),
            Span::styled(cells, th.experts()),
        ]));
    }
    if h >= 2 {
        let from = first_seq + start as u64;
        let to = first_seq + end as u64 - 1;
        let live = if app.timeline_view.offset == 0 {
            "live"
        } else {
            "panned"
        };
        lines.push(fit_line(
            vec![
                vec![Span::styled(
                    format!("tok {from}–{to} (1 per column) · {live} · h: ms → MiB → experts"),
                    th.dim(),
                )],
                vec![Span::styled(format!("tok {from}–{to} · {live}"), th.dim())],
            ],
            w,
        ));
    }
    frame.render_widget(Paragraph::new(lines), inner);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tui::app::{Action, Msg};
    use crate::tui::fixture::demo_events;

    #[test]
    fn shades_and_expert_glyphs() {
        assert_eq!(shade(0.0, (0.0, 1.0)), ' ');
        assert_eq!(shade(1.0, (0.0, 0.0)), ' ');
        assert_eq!(shade(f64::NAN, (0.0, 1.0)), ' ');
        assert_eq!(shade(1.0, (1.0, 2.0)), '░');
        assert_eq!(shade(1.6, (1.0, 2.0)), '▓');
        assert_eq!(shade(2.0, (1.0, 2.0)), '█');
        assert_eq!(shade(3.0, (3.0, 3.0)), '█');
        let mut app = App::default();
        for e in demo_events(3, false) {
            app.apply(Msg::Stamped(e));
        }
        let last = app.view().last.clone().unwrap();
        assert!(EXPERT_IDS.contains(&(expert_glyph(&last, 0) as u8)));
        assert_eq!(expert_glyph(&last, 999), '·');
        // h cycles ms → bytes → experts on an MoE.
        app.apply(Msg::Action(Action::HeatMetric));
        assert_eq!(app.heat_metric, HeatMetric::Bytes);
        app.apply(Msg::Action(Action::HeatMetric));
        assert_eq!(app.heat_metric, HeatMetric::Experts);
        app.apply(Msg::Action(Action::HeatMetric));
        assert_eq!(app.heat_metric, HeatMetric::Ms);
    }
}
