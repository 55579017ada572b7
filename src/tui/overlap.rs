//! Overlap pane: expert I/O against compute. For the latest token, per layer, compute vs I/O vs
//! wait (from `LayerStat.io`); over the recent window the hidden share of I/O (1 − wait/io);
//! the controlled sync/staged comparison of the A/B book (medians at equal other toggles,
//! corrected for context position, with its 95% interval), next to the overlap model's
//! prediction (`telemetry::overlap_model`: the token replayed with fill, drain and the reader
//! pool, from the recent sync tokens' per-layer figures — the same model as `bench overlap`).

use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use ratatui::Frame;

use super::app::{App, IoTotals, PaneId};
use super::common::{dim_line, ms, pane_block, stacked_bar, times};
use crate::telemetry::ab::Toggle;
use crate::telemetry::overlap_model;

/// I/O totals summed over the recent window for one fetch mode (None = all modes).
pub fn window_io(app: &App, mode: Option<&str>) -> Option<IoTotals> {
    let mut acc: Option<IoTotals> = None;
    for (m, io) in &app.view().io_window {
        if mode.is_none_or(|x| x == m) {
            acc.get_or_insert_with(IoTotals::default).add(io);
        }
    }
    acc
}

/// The overlap model's net from the recent sync tokens (the same replay as `bench overlap`).
fn model_line(app: &App) -> Line<'static> {
    let th = &app.theme;
    let v = app.view();
    let (_, de) = v.delays();
    let readers = v.config.as_ref().map_or(0, |c| c.readers) as usize;
    match overlap_model::sync_layers(&v.sync_io) {
        Some((mut layers, other)) => {
            // A trace that did not record the reader count: each layer's IO_eff as one block
            // (the model without the pool) rather than a guessed pool.
            let who = match readers {
                0 => {
                    layers.iter_mut().for_each(|l| l.reads = 0);
                    "readers ? (IO_eff blocks)".to_string()
                }
                1 => "1 reader".to_string(),
                n => format!("{n} readers"),
            };
            let p = overlap_model::predict(&layers, de as usize, readers.max(1));
            Line::from(vec![
                Span::styled("model net ", th.dim()),
                Span::styled(times(p.net(other)), th.model()),
                Span::styled(
                    format!(
                        " steady {} · {who}, n={} sync",
                        times(p.steady_net),
                        v.sync_io.len()
                    ),
                    th.dim(),
                ),
            ])
        }
        None => dim_line(app, "model net — (from sync tokens: press s)"),
    }
}

/// Render the overlap pane.
pub fn render(frame: &mut Frame, area: Rect, app: &App) {
    let th = &app.theme;
    let v = app.view();
    let mode = v
        .config
        .as_ref()
        .map_or("?".to_string(), |c| c.fetch.clone());
    let block = pane_block(
        app,
        PaneId::Overlap,
        vec![
            Span::styled("Overlap", th.title()),
            Span::styled(format!(" · staged vs sync · now {mode}"), th.dim()),
        ],
    );
    let inner = block.inner(area);
    frame.render_widget(block, area);
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
    let tok = IoTotals::of(last);
    match tok {
        Some(t) => lines.push(Line::from(vec![
            Span::styled("C ", th.dim()),
            Span::styled(format!("{} ms", ms(t.compute_ns as f64)), th.dense()),
            Span::styled("  IO ", th.dim()),
            Span::styled(format!("{} ms", ms(t.io_ns as f64)), th.experts()),
            Span::styled("  wait ", th.dim()),
            Span::styled(format!("{} ms", ms(t.wait_ns as f64)), th.bad()),
            Span::styled(" this token", th.dim()),
        ])),
        None => {
            let tier = v
                .config
                .as_ref()
                .map_or("?".to_string(), |c| c.expert_tier.clone());
            let why = if v.has_experts() {
                format!("no expert I/O this token (tier {tier}: experts read via page cache)")
            } else {
                "no experts: nothing to fetch (dense model)".to_string()
            };
            lines.push(dim_line(app, why));
        }
    }

    // Disk read rate and the expert cache, this token (measured).
    if tok.is_some() {
        let (bytes, rate) = super::io_totals::disk_read(last);
        let mut spans = vec![
            Span::styled("disk ", th.dim()),
            Span::styled(rate, th.experts()),
            Span::styled(format!(" ({:.1} MB read)", bytes as f64 / 1e6), th.dim()),
        ];
        match last.expert_cache {
            Some(c) => spans.extend([
                Span::styled(" · cache ", th.dim()),
                Span::styled(
                    c.hit_rate()
                        .map_or("—".into(), |r| format!("{:.0}% hits", 100.0 * r)),
                    th.strong(),
                ),
                Span::styled(
                    format!(
                        " ({}/{}) of {:.0} MiB",
                        c.hits,
                        c.hits + c.misses,
                        c.capacity_bytes as f64 / crate::util::MIB
                    ),
                    th.dim(),
                ),
            ]),
            None => spans.push(Span::styled(" · cache off", th.dim())),
        }
        lines.push(Line::from(spans));
    }

    // Per-layer bars: compute █ then wait ▒; IO drawn as a number. Each row is the layer where
    // the compute ran and the wait happened (experts are waited for at their injection layer).
    let footer = 6usize;
    let room = h.saturating_sub(lines.len() + footer);
    if let Some(_t) = tok {
        let io_layers: Vec<(usize, crate::telemetry::event::LayerIo)> = last
            .layers
            .iter()
            .enumerate()
            .filter_map(|(i, l)| l.io.map(|io| (i, io)))
            .collect();
        let scale = io_layers
            .iter()
            .map(|(_, io)| (io.compute_ns + io.wait_ns).max(io.io_ns) as f64)
            .fold(0.0, f64::max);
        let label_w = 4usize;
        let num_w = 16usize;
        let bar_w = w.saturating_sub(label_w + num_w) as u16;
        let shown = io_layers.len().min(room.saturating_sub(1));
        if shown > 0 {
            lines.push(dim_line(
                app,
                "per layer: compute █ · expert wait ▒ (at the injection layer)",
            ));
            for (i, io) in io_layers.iter().take(shown) {
                let mut spans = vec![Span::styled(
                    format!("{:<label_w$}", format!("L{i}")),
                    th.dim(),
                )];
                spans.extend(stacked_bar(
                    &[
                        (io.compute_ns as f64, '█', th.dense()),
                        (io.wait_ns as f64, '▒', th.bad()),
                    ],
                    scale,
                    bar_w,
                    (' ', th.dim()),
                ));
                spans.push(Span::styled(
                    format!(
                        " io {:>5} w {:>4}",
                        ms(io.io_ns as f64),
                        ms(io.wait_ns as f64)
                    ),
                    th.dim(),
                ));
                lines.push(Line::from(spans));
            }
        }
    }

    // Window summary. "hidden" is the share of expert I/O not waited for: over the recent
    // window of staged tokens, and (labelled apart) for this token alone.
    let staged = window_io(app, Some("staged"));
    let pct = |x: Option<f64>| x.map_or("—".into(), |x| format!("{:.0}%", 100.0 * x));
    let mut s1 = vec![Span::styled("hidden ", th.dim())];
    s1.push(Span::styled(
        pct(staged.and_then(|x| x.hidden())),
        th.strong(),
    ));
    s1.push(Span::styled(" window (staged)", th.dim()));
    if let Some(t) = tok {
        s1.push(Span::styled(" · this token ", th.dim()));
        s1.push(Span::styled(pct(t.hidden()), th.strong()));
    }
    // The fetch toggle's arms in canonical order are sync, staged: the ratio is sync/staged.
    let fetch = v.ab.estimate(Toggle::Fetch);
    let measured = fetch.map(|e| format!("{} [{:.2}–{:.2}]", times(e.ratio), e.ci.0, e.ci.1));
    lines.push(Line::from(s1));
    // `s` switches sync/staged only on the direct tier; elsewhere the key to press first is `t`.
    let direct = v.config.as_ref().is_some_and(|c| c.expert_tier == "direct");
    let hint = if direct {
        "— (press s for both arms)"
    } else {
        "— (press t for the direct tier, then s)"
    };
    lines.push(Line::from(vec![
        Span::styled("net measured ", th.dim()),
        Span::styled(measured.unwrap_or_else(|| hint.into()), th.measured()),
    ]));
    lines.push(model_line(app));
    let arm = |label: &str, m: Option<(f64, usize)>| {
        m.map_or(format!("{label} —"), |(m, n)| {
            format!("{label} {m:.2} (n={n} blk)")
        })
    };
    lines.push(Line::from(vec![
        Span::styled("ms/tok ", th.dim()),
        Span::styled(arm("sync", fetch.map(|e| (e.ms_a, e.n_a))), th.text()),
        Span::styled(" │ ", th.dim()),
        Span::styled(arm("staged", fetch.map(|e| (e.ms_b, e.n_b))), th.text()),
    ]));
    lines.push(dim_line(
        app,
        match fetch {
            Some(e) => format!(
                "block means at ctx {}, all else equal (measured)",
                e.pos_ref
            ),
            None => "block means, all else equal (A/B pane)".into(),
        },
    ));
    frame.render_widget(Paragraph::new(lines), inner);
}
