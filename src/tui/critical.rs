//! Critical-path pane (eq. 4.23, computed by `engine::critical` through `critical_model`): per
//! layer the modelled bytes on the critical path, max(B_attn, B_dense/(δd+1), B_expert/(δe+1)),
//! drawn against the undelayed bar max(B_attn, B_dense, B_expert), both in the with-scales
//! accounting the Streams pane uses; totals in both accountings, labelled ("payload 9.00 → 4.50",
//! "with scales 10.13 → 5.07"); the measured per-layer time (mean over the recent window) beside
//! the modelled bytes; and a what-if mode where the delays are changed hypothetically (labelled
//! "model").

use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use ratatui::Frame;

use super::app::{App, PaneId};
use super::common::{cells, dim_line, mib, ms, pane_block, times};
use super::critical_model::{accounts, mib_pair};
use crate::engine::critical::Bound;

/// Mean measured ns per layer over the recent window (attn + dense + router + experts).
pub fn measured_layer_ns(app: &App) -> Vec<f64> {
    let v = app.view();
    let n = v.recent.iter().map(|t| t.layers.len()).max().unwrap_or(0);
    let mut sum = vec![0.0; n];
    let mut cnt = vec![0u32; n];
    for t in &v.recent {
        for (i, l) in t.layers.iter().enumerate() {
            sum[i] += (l.ns_attn + l.ns_dense + l.ns_router + l.ns_experts) as f64;
            cnt[i] += 1;
        }
    }
    sum.iter()
        .zip(&cnt)
        .map(|(s, &c)| if c > 0 { s / c as f64 } else { 0.0 })
        .collect()
}

/// Render the critical-path pane.
pub fn render(frame: &mut Frame, area: Rect, app: &App) {
    let th = &app.theme;
    let title = if app.whatif.is_some() {
        vec![
            Span::styled("Critical path", th.title()),
            Span::raw(" "),
            Span::styled(" WHAT-IF ", th.badge()),
            Span::styled(" model", th.model()),
        ]
    } else {
        vec![
            Span::styled("Critical path", th.title()),
            Span::styled(" · MiB/token (model)", th.dim()),
        ]
    };
    let block = pane_block(app, PaneId::Critical, title, area.width);
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let v = app.view();
    let Some(model) = v.model.as_ref() else {
        frame.render_widget(
            Paragraph::new(dim_line(app, "waiting for a session…")),
            inner,
        );
        return;
    };
    if model.layer_bytes.is_empty() {
        frame.render_widget(
            Paragraph::new(dim_line(app, "no per-layer byte model in this session")),
            inner,
        );
        return;
    }
    let (dd, de) = app
        .whatif
        .unwrap_or((model.dense_delay, model.expert_delay));
    let cp = accounts(model, dd, de);
    let actual = accounts(model, model.dense_delay, model.expert_delay);
    let measured = measured_layer_ns(app);
    let has_measured = measured.iter().any(|&x| x > 0.0);

    let w = inner.width as usize;
    let h = inner.height as usize;
    let n = cp.layers.len();
    let label_w = format!("L{}", n.saturating_sub(1)).len() + 1;
    let num_w = 11usize; // " 0.75/1.50"
    let meas_w = if has_measured { 7usize } else { 0 }; // " {:>6}"
    let bar_w = w.saturating_sub(label_w + num_w + meas_w) as u16;
    let scale = cp.layers.iter().map(|l| l.undelayed).fold(0.0, f64::max);

    let mut lines: Vec<Line> = Vec::new();
    // The legend, shortened until the measured column's "ms" head fits beside it: the head
    // must never be the part that disappears (at ≤ 160 columns the pane is ~46 wide).
    let legend = |critical: &'static str, undelayed: &'static str| {
        vec![
            Span::styled("█", th.model()),
            Span::styled(critical, th.dim()),
            Span::styled("░", th.dim()),
            Span::styled(undelayed, th.dim()),
            Span::styled(format!("δd={dd} δe={de}"), th.strong()),
        ]
    };
    let width = |spans: &[Span]| {
        spans
            .iter()
            .map(|s| s.content.chars().count())
            .sum::<usize>()
    };
    let mut head = legend(" critical ", " undelayed (with scales) ");
    if has_measured {
        for (c, u) in [(" critical ", " undelayed "), (" crit ", " undel ")] {
            if width(&head) + 3 <= w {
                break;
            }
            head = legend(c, u);
        }
        // Right-align "ms" over the measured column (its values end at the pane's edge).
        let used = width(&head);
        if used + 3 <= w {
            head.push(Span::raw(" ".repeat(w - used - 2)));
            head.push(Span::styled("ms", th.measured()));
        } else {
            head = vec![
                Span::raw(" ".repeat(w.saturating_sub(2))),
                Span::styled("ms", th.measured()),
            ];
        }
    }
    lines.push(Line::from(head));
    let footer = if cp.payload.is_some() { 4usize } else { 3 };
    let room = h.saturating_sub(1 + footer);
    let shown = if n > room { room.saturating_sub(1) } else { n };
    for (i, l) in cp.layers.iter().enumerate().take(shown) {
        let full = if scale > 0.0 {
            cells(l.undelayed / scale, bar_w)
        } else {
            0
        };
        let crit = if scale > 0.0 {
            cells(l.critical / scale, bar_w).min(full)
        } else {
            0
        };
        let style = match l.bound {
            Bound::Attn => th.attn(),
            Bound::Dense => th.dense(),
            Bound::Experts => th.experts(),
        };
        let mut spans = vec![
            Span::styled(format!("{:<label_w$}", format!("L{i}")), th.dim()),
            Span::styled("█".repeat(crit as usize), style),
            Span::styled("░".repeat((full - crit) as usize), th.dim()),
            Span::raw(" ".repeat((bar_w - full) as usize)),
            Span::raw(format!(" {:>4}/{:<5}", mib(l.critical), mib(l.undelayed))),
        ];
        if has_measured {
            let m = measured.get(i).copied().unwrap_or(0.0);
            spans.push(Span::styled(format!(" {:>6}", ms(m)), th.measured()));
        }
        lines.push(Line::from(spans));
    }
    if shown < n {
        lines.push(dim_line(app, format!("… +{} layers", n - shown)));
    }
    // The accountings, labelled as `run`/`inspect --json` name them (critical_path_mib.{payload,
    // payload_read,with_scales}): every layer's payload (the paper's), and what is read.
    // Older traces carry only the as-read payload: shown under its own name, with no note.
    let skipped = matches!((&cp.payload, &cp.payload_read), (Some(p), Some(r)) if p != r);
    let read_only = cp.payload.is_none() && cp.payload_read.is_some();
    // "payload read" needs one more column than the other labels.
    let lw = if skipped || read_only { 13 } else { 12 };
    let total = |label: &str, c: &crate::engine::critical::CriticalPath| {
        let (n, d) = mib_pair(c);
        Line::from(vec![
            Span::styled(format!("{label:<lw$}"), th.dim()),
            Span::styled(format!("{} → ", fmt2(n)), th.dim()),
            Span::styled(format!("{} MiB/token", fmt2(d)), th.strong()),
            Span::raw(", "),
            Span::styled(times(c.ratio()), th.good()),
        ])
    };
    if let Some(p) = &cp.payload {
        lines.push(total("payload", p));
    }
    if let (true, Some(r)) = (skipped || read_only, &cp.payload_read) {
        lines.push(total("payload read", r));
    }
    lines.push(total("with scales", &cp.with_scales));
    if skipped {
        lines.push(dim_line(app, "read: ℓ<δd dense FFNs skipped (input 0)"));
    }
    if app.whatif.is_some() {
        lines.push(dim_line(
            app,
            format!(
                "actual δd={} δe={}: {} MiB/token with scales",
                model.dense_delay,
                model.expert_delay,
                fmt2(mib_pair(&actual.with_scales).1)
            ),
        ));
        lines.push(dim_line(app, "d/D δd −/+ · e/E δe −/+ · w leave"));
    } else {
        let bound = |b: Bound| cp.layers.iter().filter(|l| l.bound == b).count();
        lines.push(dim_line(
            app,
            format!(
                "bound: attn {} · dense {} · experts {}",
                bound(Bound::Attn),
                bound(Bound::Dense),
                bound(Bound::Experts)
            ),
        ));
        let sum_ms: f64 = measured.iter().sum::<f64>();
        let mut l = vec![Span::styled("[w]hat-if", th.key())];
        if has_measured {
            l.push(Span::styled(
                format!("  layers {} ms/tok measured", ms(sum_ms)),
                th.measured(),
            ));
        }
        lines.push(Line::from(l));
    }
    frame.render_widget(Paragraph::new(lines), inner);
}

fn fmt2(x: f64) -> String {
    format!("{x:.2}")
}
