//! Streams pane: per-layer stacked bars of the bytes read for the latest token by stream
//! (attention / dense / experts), the LM head, MiB/token, effective GB/s (bytes / ns_total) and
//! the share of the bandwidth ceiling (when the host measured one).

use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use ratatui::Frame;

use super::app::{App, PaneId};
use super::common::{dim_line, mib, pane_block, stacked_bar, MIB};

/// Render the streams pane.
pub fn render(frame: &mut Frame, area: Rect, app: &App) {
    let th = &app.theme;
    let block = pane_block(
        app,
        PaneId::Streams,
        vec![
            Span::styled("Streams", th.title()),
            Span::styled(" · MiB/token (measured)", th.dim()),
        ],
    );
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let v = app.view();
    let Some(last) = v.last.as_ref() else {
        frame.render_widget(
            Paragraph::new(dim_line(app, "waiting for the first token…")),
            inner,
        );
        return;
    };
    let w = inner.width as usize;
    let h = inner.height as usize;
    let mut lines: Vec<Line> = Vec::new();
    lines.push(Line::from(vec![
        Span::styled(format!("token #{}  ", last.index), th.dim()),
        Span::styled("█", th.attn()),
        Span::styled(" attn  ", th.dim()),
        Span::styled("▓", th.dense()),
        Span::styled(" dense  ", th.dim()),
        Span::styled("▒", th.experts()),
        Span::styled(" experts (at injection layer)", th.dim()),
    ]));

    let n = last.layers.len();
    // Lines reserved below the bars: lm head, totals (2).
    let footer = 4usize;
    let room = h.saturating_sub(1 + footer);
    let scale = last
        .layers
        .iter()
        .map(|l| (l.bytes.attn + l.bytes.dense + l.bytes.experts) as f64)
        .fold(0.0, f64::max);
    let label_w = format!("L{}", n.saturating_sub(1)).len() + 1;
    let num_w = 6usize;
    let bar_w = w.saturating_sub(label_w + num_w + 1) as u16;
    let shown = if n > room { room.saturating_sub(1) } else { n };
    for (i, l) in last.layers.iter().enumerate().take(shown) {
        let tot = (l.bytes.attn + l.bytes.dense + l.bytes.experts) as f64;
        let mut spans = vec![Span::styled(
            format!("{:<label_w$}", format!("L{i}")),
            th.dim(),
        )];
        spans.extend(stacked_bar(
            &[
                (l.bytes.attn as f64, '█', th.attn()),
                (l.bytes.dense as f64, '▓', th.dense()),
                (l.bytes.experts as f64, '▒', th.experts()),
            ],
            scale,
            bar_w,
            (' ', th.dim()),
        ));
        spans.push(Span::raw(format!(" {:>5}", mib(tot))));
        lines.push(Line::from(spans));
    }
    if shown < n {
        let rest: u64 = last.layers[shown..]
            .iter()
            .map(|l| l.bytes.attn + l.bytes.dense + l.bytes.experts)
            .sum();
        lines.push(dim_line(
            app,
            format!("… +{} layers, {} MiB", n - shown, mib(rest as f64)),
        ));
    }

    let layer_bytes: u64 = last
        .layers
        .iter()
        .map(|l| l.bytes.attn + l.bytes.dense + l.bytes.experts)
        .sum();
    let total = layer_bytes + last.vocab_bytes;
    let (mut a, mut d, mut e) = (0u64, 0u64, 0u64);
    for l in &last.layers {
        a += l.bytes.attn;
        d += l.bytes.dense;
        e += l.bytes.experts;
    }
    lines.push(Line::from(vec![
        Span::styled("lm head ", th.dim()),
        Span::styled(format!("{} MiB", mib(last.vocab_bytes as f64)), th.vocab()),
        Span::styled(
            format!(" · {:.2} ms this token", last.ns_lm_head as f64 / 1e6),
            th.dim(),
        ),
    ]));
    lines.push(Line::from(vec![
        Span::styled(format!("Σ attn {}", mib(a as f64)), th.attn()),
        Span::styled(format!(" · dense {}", mib(d as f64)), th.dense()),
        Span::styled(format!(" · exp {}", mib(e as f64)), th.experts()),
    ]));
    let gbs = if last.ns_total > 0 {
        total as f64 / last.ns_total as f64
    } else {
        0.0
    };
    lines.push(Line::from(vec![
        Span::styled(format!("{:.2} MiB/token", total as f64 / MIB), th.strong()),
        Span::raw(" · "),
        Span::styled(format!("{gbs:.1} GB/s"), th.measured()),
        Span::styled(" effective", th.dim()),
    ]));
    lines.push(match app.bandwidth_ceiling_gbs {
        Some(c) if c > 0.0 => Line::from(vec![
            Span::styled(format!("{:.0}%", 100.0 * gbs / c), th.strong()),
            Span::styled(format!(" of the {c:.1} GB/s read ceiling"), th.dim()),
        ]),
        _ => dim_line(app, "ceiling unknown (no bandwidth probe)"),
    });
    frame.render_widget(Paragraph::new(lines), inner);
}
