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
use super::common::{dim_line, fit_line, ms, pane_block, stacked_bar, times};
use crate::engine::{ExpertTier, FetchMode};
use crate::telemetry::ab::Toggle;
use crate::telemetry::overlap_model;

/// I/O totals summed over the recent window for one fetch mode (None = all modes).
pub fn window_io(app: &App, mode: Option<FetchMode>) -> Option<IoTotals> {
    let mut acc: Option<IoTotals> = None;
    for (m, io) in &app.view().io_window {
        if mode.is_none_or(|x| x == *m) {
            acc.get_or_insert_with(IoTotals::default).add(io);
        }
    }
    acc
}

/// The overlap model's net from the recent sync tokens (the same replay as `bench overlap`).
fn model_line(app: &App, w: usize) -> Line<'static> {
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
            let n = v.sync_io.len();
            let steady = times(p.steady_net);
            let form = |tail: String| {
                vec![
                    Span::styled("model net ", th.dim()),
                    Span::styled(times(p.net(other)), th.model()),
                    Span::styled(tail, th.dim()),
                ]
            };
            fit_line(
                vec![
                    form(format!(" steady {steady} · {who}, n={n} sync")),
                    form(format!(" steady {steady} · n={n} sync")),
                    form(format!(" · n={n} sync")),
                ],
                w,
            )
        }
        None => fit_line(
            vec![
                vec![Span::styled(
                    "model net — (from sync tokens: press s)",
                    th.dim(),
                )],
                vec![Span::styled("model net — (press s)", th.dim())],
            ],
            w,
        ),
    }
}

/// Render the overlap pane.
pub fn render(frame: &mut Frame, area: Rect, app: &App) {
    let th = &app.theme;
    let v = app.view();
    let mode = v
        .config
        .as_ref()
        .map_or("?".to_string(), |c| c.fetch.to_string());
    let block = pane_block(
        app,
        PaneId::Overlap,
        vec![
            Span::styled("Overlap", th.title()),
            Span::styled(" · staged vs sync", th.dim()),
            Span::styled(format!(" · now {mode}"), th.dim()),
        ],
        area.width,
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
        Some(t) => {
            let form = |tail: &'static str| {
                vec![
                    Span::styled("C ", th.dim()),
                    Span::styled(format!("{} ms", ms(t.compute_ns as f64)), th.dense()),
                    Span::styled("  IO ", th.dim()),
                    Span::styled(format!("{} ms", ms(t.io_ns as f64)), th.experts()),
                    Span::styled("  wait ", th.dim()),
                    Span::styled(format!("{} ms", ms(t.wait_ns as f64)), th.bad()),
                    Span::styled(tail, th.dim()),
                ]
            };
            lines.push(fit_line(vec![form(" this token"), form("")], w));
        }
        None => {
            let tier = v
                .config
                .as_ref()
                .map_or("?".to_string(), |c| c.expert_tier.to_string());
            let forms = if v.has_experts() {
                vec![
                    format!("no expert I/O this token (tier {tier}: experts read via page cache)"),
                    format!("no expert I/O (tier {tier}: page cache)"),
                ]
            } else {
                vec![
                    "no experts: nothing to fetch (dense model)".to_string(),
                    "no experts (dense model)".to_string(),
                ]
            };
            lines.push(fit_line(
                forms
                    .into_iter()
                    .map(|f| vec![Span::styled(f, th.dim())])
                    .collect(),
                w,
            ));
        }
    }

    // Disk read rate and the expert cache, this token (measured).
    if tok.is_some() {
        let (bytes, rate) = super::io_totals::disk_read(last);
        let form = |read: bool, detail: bool| {
            let mut spans = vec![
                Span::styled("disk ", th.dim()),
                Span::styled(rate.clone(), th.experts()),
            ];
            if read {
                spans.push(Span::styled(
                    format!(" ({:.1} MB read)", bytes as f64 / 1e6),
                    th.dim(),
                ));
            }
            match last.expert_cache {
                Some(c) => {
                    spans.extend([
                        Span::styled(" · cache ", th.dim()),
                        Span::styled(
                            c.hit_rate()
                                .map_or("—".into(), |r| format!("{:.0}% hits", 100.0 * r)),
                            th.strong(),
                        ),
                    ]);
                    if detail {
                        spans.push(Span::styled(
                            format!(
                                " ({}/{}) of {:.0} MiB",
                                c.hits,
                                c.hits + c.misses,
                                c.capacity_bytes as f64 / crate::util::MIB
                            ),
                            th.dim(),
                        ));
                    }
                }
                None => spans.push(Span::styled(" · cache off", th.dim())),
            }
            spans
        };
        lines.push(fit_line(
            vec![form(true, true), form(true, false), form(false, false)],
            w,
        ));
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
            lines.push(fit_line(
                [
                    "per layer: compute █ · expert wait ▒ (at the injection layer)",
                    "per layer: compute █ · expert wait ▒ (injection layer)",
                    "per layer: compute █ · expert wait ▒",
                    "compute █ · wait ▒",
                ]
                .into_iter()
                .map(|f| vec![Span::styled(f, th.dim())])
                .collect(),
                w,
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
    let staged = window_io(app, Some(FetchMode::Staged));
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
    let mut s1_short = s1.clone();
    s1_short[2] = Span::styled(" (staged)", th.dim());
    if s1_short.len() > 3 {
        s1_short[3] = Span::styled(" · token ", th.dim());
    }
    lines.push(fit_line(vec![s1, s1_short], w));
    // `s` switches sync/staged only on the direct tier; elsewhere the key to press first is `t`.
    let direct = v
        .config
        .as_ref()
        .is_some_and(|c| c.expert_tier == ExpertTier::Direct);
    let hints: &[&str] = if direct {
        &["— (press s for both arms)", "— (press s)"]
    } else {
        &[
            "— (press t for the direct tier, then s)",
            "— (t: direct tier, then s)",
            "— (t, then s)",
        ]
    };
    let forms = match measured {
        Some(m) => vec![vec![
            Span::styled("net measured ", th.dim()),
            Span::styled(m, th.measured()),
        ]],
        None => hints
            .iter()
            .map(|h| {
                vec![
                    Span::styled("net measured ", th.dim()),
                    Span::styled(h.to_string(), th.measured()),
                ]
            })
            .collect(),
    };
    lines.push(fit_line(forms, w));
    lines.push(model_line(app, w));
    let arm = |label: &str, m: Option<(f64, usize)>, long: bool| {
        m.map_or(format!("{label} —"), |(m, n)| {
            if long {
                format!("{label} {m:.2} (n={n} blk)")
            } else {
                format!("{label} {m:.2} n={n}")
            }
        })
    };
    let arms = |long: bool| {
        vec![
            Span::styled(if long { "ms/tok " } else { "ms " }, th.dim()),
            Span::styled(
                arm(FetchMode::Sync.name(), fetch.map(|e| (e.ms_a, e.n_a)), long),
                th.text(),
            ),
            Span::styled(" │ ", th.dim()),
            Span::styled(
                arm(
                    FetchMode::Staged.name(),
                    fetch.map(|e| (e.ms_b, e.n_b)),
                    long,
                ),
                th.text(),
            ),
        ]
    };
    lines.push(fit_line(vec![arms(true), arms(false)], w));
    let notes = match fetch {
        Some(e) => vec![
            format!(
                "block means at ctx {}, all else equal (measured)",
                e.pos_ref
            ),
            format!("block means at ctx {} (measured)", e.pos_ref),
        ],
        None => vec![
            "block means, all else equal (A/B pane)".into(),
            "block means (A/B pane)".into(),
        ],
    };
    lines.push(fit_line(
        notes
            .into_iter()
            .map(|n| vec![Span::styled(n, th.dim())])
            .collect(),
        w,
    ));
    frame.render_widget(Paragraph::new(lines), inner);
}
