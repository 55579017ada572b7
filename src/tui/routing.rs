//! Expert-routing pane: a layer × expert heatmap of how often each expert was chosen over the
//! recent token window, the current token's top-k (expert:weight) per layer, expert load balance
//! and layer-to-layer overlap — how often an expert chosen at ℓ is chosen again at ℓ+1, the
//! prefetch predictability of §3.9.2 — next to the prefetch thread's measured hit rate (hinted
//! next-layer experts that layer then routed) and its dropped hint commands. Dense models say
//! "no experts".

use std::collections::VecDeque;

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use ratatui::Frame;

use super::app::{App, PaneId};
use super::common::{dim_line, pane_block, truncate};
use crate::telemetry::event::{PrefetchStat, TokenStats};

/// Routing statistics over a token window.
#[derive(Clone, Debug, PartialEq)]
pub struct RoutingStats {
    /// Tokens in the window that carried routing.
    pub tokens: usize,
    /// counts\[layer\]\[expert\]: times chosen.
    pub counts: Vec<Vec<u32>>,
    /// Tokens with routing at each layer.
    pub layer_tokens: Vec<u32>,
    /// Mean |S_ℓ ∩ S_ℓ+1| / k over tokens and adjacent routed layer pairs (None without pairs).
    pub overlap: Option<f64>,
    /// Load balance: max expert share / mean expert share (1.0 = perfectly even).
    pub imbalance: Option<f64>,
    /// The prefetch thread's hints summed over the window's tokens that had it on.
    pub prefetch: Option<PrefetchStat>,
}

/// Compute routing statistics over `window` for a model with `n_experts` experts.
pub fn routing_stats(window: &VecDeque<TokenStats>, n_experts: usize) -> RoutingStats {
    let n_layers = window.iter().map(|t| t.layers.len()).max().unwrap_or(0);
    let mut counts = vec![vec![0u32; n_experts]; n_layers];
    let mut layer_tokens = vec![0u32; n_layers];
    let mut tokens = 0;
    let (mut ov_sum, mut ov_n) = (0.0f64, 0u64);
    let mut prefetch: Option<PrefetchStat> = None;
    for t in window {
        if let Some(p) = &t.prefetch {
            prefetch.get_or_insert_with(PrefetchStat::default).add(p);
        }
        let mut any = false;
        for (li, l) in t.layers.iter().enumerate() {
            if l.routing.is_empty() {
                continue;
            }
            any = true;
            layer_tokens[li] += 1;
            for &(e, _) in &l.routing {
                if let Some(c) = counts[li].get_mut(e as usize) {
                    *c += 1;
                }
            }
            if let Some(next) = t.layers.get(li + 1) {
                if !next.routing.is_empty() {
                    let k = l.routing.len().max(1);
                    let hits = l
                        .routing
                        .iter()
                        .filter(|(e, _)| next.routing.iter().any(|(f, _)| f == e))
                        .count();
                    ov_sum += hits as f64 / k as f64;
                    ov_n += 1;
                }
            }
        }
        if any {
            tokens += 1;
        }
    }
    let mut per_expert = vec![0u64; n_experts];
    for row in &counts {
        for (e, &c) in row.iter().enumerate() {
            per_expert[e] += c as u64;
        }
    }
    let total: u64 = per_expert.iter().sum();
    let imbalance = (total > 0 && n_experts > 0).then(|| {
        let mean = total as f64 / n_experts as f64;
        *per_expert.iter().max().unwrap_or(&0) as f64 / mean
    });
    RoutingStats {
        tokens,
        counts,
        layer_tokens,
        overlap: (ov_n > 0).then(|| ov_sum / ov_n as f64),
        imbalance,
        prefetch,
    }
}

/// "prefetch hit H% · dropped D/N": the measured counterpart of the overlap line.
fn prefetch_line(app: &App, p: Option<PrefetchStat>) -> Line<'static> {
    let th = &app.theme;
    let Some(p) = p else {
        return dim_line(app, "prefetch hit — (prefetch off)");
    };
    let pct = |x: Option<f64>| x.map_or("—".into(), |x| format!("{:.0}%", 100.0 * x));
    let drop_style = if p.dropped > 0 { th.bad() } else { th.strong() };
    Line::from(vec![
        Span::styled("prefetch hit ", th.dim()),
        Span::styled(pct(p.hit_rate()), th.strong()),
        Span::styled(format!(" of {} · dropped ", p.predicted), th.dim()),
        Span::styled(format!("{}", p.dropped), drop_style),
        Span::styled(format!("/{} hints", p.sent + p.dropped), th.dim()),
    ])
}

/// Render the routing pane.
pub fn render(frame: &mut Frame, area: Rect, app: &App) {
    let th = &app.theme;
    let v = app.view();
    let block = pane_block(
        app,
        PaneId::Routing,
        vec![
            Span::styled("Expert routing", th.title()),
            Span::styled(format!(" · last {} tok", v.recent.len()), th.dim()),
        ],
        area.width,
    );
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let Some(model) = v.model.as_ref() else {
        frame.render_widget(
            Paragraph::new(dim_line(app, "waiting for a session…")),
            inner,
        );
        return;
    };
    if model.n_experts == 0 {
        frame.render_widget(
            Paragraph::new(vec![
                Line::from(Span::styled("no experts", th.strong())),
                dim_line(app, "dense model: every layer runs the same FFN,"),
                dim_line(app, "so there is no routing to show."),
            ]),
            inner,
        );
        return;
    }
    let ne = model.n_experts as usize;
    let k = model.top_k.max(1) as usize;
    let st = routing_stats(&v.recent, ne);
    if st.tokens == 0 {
        frame.render_widget(
            Paragraph::new(dim_line(app, "waiting for routed tokens…")),
            inner,
        );
        return;
    }

    // Summary lines at the bottom.
    let chance = k as f64 / ne as f64;
    let summary = vec![
        Line::from(vec![
            Span::styled("ℓ→ℓ+1 overlap ", th.dim()),
            Span::styled(
                st.overlap
                    .map_or("—".into(), |o| format!("{:.0}%", 100.0 * o)),
                th.strong(),
            ),
            Span::styled(format!(" (chance {:.0}%)", 100.0 * chance), th.dim()),
        ]),
        if model.route_ahead > 0 {
            dim_line(
                app,
                format!(
                    "route-ahead {}: experts chosen {} layer(s) early (exact, not predicted)",
                    model.route_ahead, model.route_ahead
                ),
            )
        } else {
            prefetch_line(app, st.prefetch)
        },
        Line::from(vec![
            Span::styled("balance max/mean ", th.dim()),
            Span::styled(
                st.imbalance.map_or("—".into(), |b| format!("{b:.2}×")),
                th.strong(),
            ),
            Span::styled(format!(" · E={ne} k={k}"), th.dim()),
        ]),
        dim_line(app, "shade: share of tokens picking expert"),
    ];

    let side_by_side = inner.width >= 56;
    let [heat_area, topk_area, sum_area] = if side_by_side {
        let [top, sum] =
            Layout::vertical([Constraint::Min(2), Constraint::Length(summary.len() as u16)])
                .areas(inner);
        let [l, r] =
            Layout::horizontal([Constraint::Percentage(55), Constraint::Percentage(45)]).areas(top);
        [l, r, sum]
    } else {
        let n_layers = st.counts.len() as u16 + 1;
        let rest = inner.height.saturating_sub(summary.len() as u16);
        let heat_h = n_layers.min(rest.saturating_sub(rest / 3)).max(2);
        Layout::vertical([
            Constraint::Length(heat_h),
            Constraint::Min(0),
            Constraint::Length(summary.len() as u16),
        ])
        .areas(inner)
    };
    frame.render_widget(Paragraph::new(summary), sum_area);

    // Heatmap.
    let label_w = (format!("L{}", st.counts.len().saturating_sub(1)).len() + 1).max(4);
    let avail = (heat_area.width as usize).saturating_sub(label_w);
    let cell = if avail >= ne * 2 { 2 } else { 1 };
    let cols = (avail / cell).min(ne);
    let mut heat: Vec<Line> = Vec::new();
    let mut head = vec![Span::styled(format!("{:<label_w$}", "L\\E"), th.dim())];
    for e in 0..cols {
        let s = if cell == 2 {
            format!("{:<2}", e % 100)
        } else {
            format!("{}", e % 10)
        };
        head.push(Span::styled(s, th.dim()));
    }
    if cols < ne {
        head.push(Span::styled("…", th.dim()));
    }
    heat.push(Line::from(head));
    let rows = (heat_area.height as usize).saturating_sub(1);
    for (li, row) in st.counts.iter().enumerate().take(rows) {
        let mut spans = vec![Span::styled(
            format!("{:<label_w$}", format!("L{li}")),
            th.dim(),
        )];
        let lt = st.layer_tokens[li];
        if lt == 0 {
            spans.push(Span::styled("dense", th.dim()));
        } else {
            for &c in row.iter().take(cols) {
                let (g, s) = th.heat(c as f64 / lt as f64);
                let txt = if cell == 2 {
                    format!("{g} ")
                } else {
                    g.to_string()
                };
                spans.push(Span::styled(txt, s));
            }
        }
        heat.push(Line::from(spans));
    }
    frame.render_widget(Paragraph::new(heat), heat_area);

    // Current token's top-k.
    let mut topk: Vec<Line> = vec![Line::from(Span::styled(
        "this token: expert:weight",
        th.dim(),
    ))];
    if let Some(last) = v.last.as_ref() {
        let tw = topk_area.width as usize;
        for (li, l) in last
            .layers
            .iter()
            .enumerate()
            .take((topk_area.height as usize).saturating_sub(1))
        {
            let body = if l.routing.is_empty() {
                "dense".to_string()
            } else {
                l.routing
                    .iter()
                    .map(|(e, w)| format!("{e}:{w:.2}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            let label = format!("{:<label_w$}", format!("L{li}"));
            let body = truncate(&body, tw.saturating_sub(label_w));
            topk.push(Line::from(vec![
                Span::styled(label, th.dim()),
                Span::styled(body, th.experts()),
            ]));
        }
    }
    frame.render_widget(Paragraph::new(topk), topk_area);
}
