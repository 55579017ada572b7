//! Streams pane: per-layer stacked bars of the bytes read for the latest token by stream
//! (attention / dense / experts as stored, i.e. with scales — the accounting of the Critical-path
//! bars — and the KV-cache reads at this context position), each layer's measured attention /
//! dense / expert time beside its bytes when there is room, the whole token's bytes on one bar
//! with the LM head's share (bytes, % of all the bytes the token read, KV included, and its own time),
//! MiB/token, effective GB/s (all bytes, KV included, / ns_total) and the share of the measured
//! read ceiling for the thread count in use, with the probe's method. On the direct tier (experts
//! read from disk) each layer's wait for its expert reads gets a column and a line gives the
//! token's disk read rate, its total wait and the expert cache's hits.

use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use ratatui::Frame;

use super::app::{App, PaneId};
use super::common::{dim_line, fit_line, mib, pane_block, stacked_bar, MIB};

/// Width of the per-layer time columns ("  0.14  0.36  0.71"): three columns of 6.
const TIMES_W: usize = 18;
/// Width of one time column (a space, then the value right-aligned in 5).
const TIME_COL: usize = 6;

/// Render the streams pane.
pub fn render(frame: &mut Frame, area: Rect, app: &App) {
    let th = &app.theme;
    let block = pane_block(
        app,
        PaneId::Streams,
        vec![
            Span::styled("Streams", th.title()),
            Span::styled(" · MiB, ms (measured)", th.dim()),
        ],
        area.width,
    );
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let v = app.view();
    let Some(last) = v.last.as_ref() else {
        let mut lines = vec![dim_line(app, "waiting for the first token…")];
        if app.bandwidth_pending {
            lines.push(dim_line(app, "read ceiling: measuring… (first launch)"));
        }
        frame.render_widget(Paragraph::new(lines), inner);
        return;
    };
    let w = inner.width as usize;
    let h = inner.height as usize;
    // KV bytes this token read, per layer (None: the session did not describe its cache).
    let kv: Option<Vec<u64>> = v.model.as_ref().and_then(|m| {
        (0..last.layers.len() as u32)
            .map(|l| m.kv_layer_read_bytes(l, last.pos))
            .collect()
    });
    let kv_at = |i: usize| kv.as_ref().and_then(|k| k.get(i).copied()).unwrap_or(0);
    let mut lines: Vec<Line> = Vec::new();
    // The legend, in its long form where it fits beside the column heads, else shorter.
    let legend_of = |long: bool, index: bool| {
        let mut l = vec![
            Span::styled(
                if index {
                    format!("token #{}  ", last.index)
                } else {
                    String::new()
                },
                th.dim(),
            ),
            Span::styled("█", th.attn()),
            Span::styled(" attn  ", th.dim()),
            Span::styled("▓", th.dense()),
            Span::styled(" dense  ", th.dim()),
            Span::styled("▒", th.experts()),
            Span::styled(
                if long {
                    " experts (at injection layer)  "
                } else {
                    " experts  "
                },
                th.dim(),
            ),
        ];
        if kv.is_some() {
            l.push(Span::styled("░", th.kv()));
            l.push(Span::styled(" kv", th.dim()));
        }
        l
    };
    let len = |l: &[Span]| l.iter().map(|s| s.content.chars().count()).sum::<usize>();
    let mut legend = legend_of(true, true);
    for (long, index) in [(false, true), (false, false)] {
        if len(&legend) <= w {
            break;
        }
        legend = legend_of(long, index);
    }
    lines.push(Line::from(legend));

    let n = last.layers.len();
    let io = super::io_totals::IoTotals::of(last);
    // Lines reserved below the bars: token share, lm head, Σ, totals, ceiling, method (and the
    // disk line on the direct tier).
    let footer = 6usize + io.is_some() as usize;
    let room = h.saturating_sub(1 + footer);
    let layer_total = |i: usize| {
        let b = &last.layers[i].bytes;
        b.attn + b.dense + b.experts + kv_at(i)
    };
    let scale = (0..n).map(|i| layer_total(i) as f64).fold(0.0, f64::max);
    let label_w = format!("L{}", n.saturating_sub(1)).len() + 1;
    let num_w = 6usize;
    // Per-layer times when the bar keeps at least 16 cells.
    let times = w >= label_w + num_w + 1 + TIMES_W + 16;
    // The wait column (direct tier) when the bar still keeps 16 cells.
    let waits = times && io.is_some() && w >= label_w + num_w + 1 + TIMES_W + TIME_COL + 16;
    let times_w = TIMES_W + if waits { TIME_COL } else { 0 };
    let bar_w = w.saturating_sub(label_w + num_w + if times { times_w } else { 0 }) as u16;
    let shown = if n > room { room.saturating_sub(1) } else { n };
    if shown > 0 && lines.len() < h {
        // Column heads over the MiB column and each time column, right-aligned like them.
        let head = if times {
            format!(
                "{:>nw$}{:>tc$}{:>tc$}{:>tc$}{}",
                "MiB",
                "attn",
                "dense",
                "exp",
                if waits {
                    format!("{:>TIME_COL$}", "wait")
                } else {
                    String::new()
                },
                nw = num_w,
                tc = TIME_COL
            )
        } else {
            format!("{:>num_w$}", "MiB")
        };
        if let Some(first) = lines.first_mut() {
            let used: usize = first.spans.iter().map(|s| s.content.chars().count()).sum();
            if used + head.len() + 1 > w {
                lines.push(Line::from(vec![
                    Span::raw(" ".repeat(w.saturating_sub(head.len()))),
                    Span::styled(head, th.dim()),
                ]));
            } else {
                first
                    .spans
                    .push(Span::raw(" ".repeat(w - used - head.len())));
                first.spans.push(Span::styled(head, th.dim()));
            }
        }
    }
    let shown = shown.min(h.saturating_sub(lines.len() + footer));
    for (i, l) in last.layers.iter().enumerate().take(shown) {
        let mut spans = vec![Span::styled(
            format!("{:<label_w$}", format!("L{i}")),
            th.dim(),
        )];
        spans.extend(stacked_bar(
            &[
                (l.bytes.attn as f64, '█', th.attn()),
                (l.bytes.dense as f64, '▓', th.dense()),
                (l.bytes.experts as f64, '▒', th.experts()),
                (kv_at(i) as f64, '░', th.kv()),
            ],
            scale,
            bar_w,
            (' ', th.dim()),
        ));
        spans.push(Span::raw(format!(" {:>5}", mib(layer_total(i) as f64))));
        if times {
            let t = |ns: u64| format!(" {:>5}", super::common::ms(ns as f64));
            spans.push(Span::styled(
                format!(
                    "{}{}{}",
                    t(l.ns_attn),
                    t(l.ns_dense),
                    t(l.ns_router + l.ns_experts)
                ),
                th.measured(),
            ));
            if waits {
                let wait = l.io.map_or(0, |x| x.wait_ns);
                spans.push(Span::styled(
                    t(wait),
                    if wait > 0 { th.bad() } else { th.dim() },
                ));
            }
        }
        lines.push(Line::from(spans));
    }
    if shown < n {
        let rest: u64 = (shown..n).map(layer_total).sum();
        lines.push(dim_line(
            app,
            format!("… +{} layers, {} MiB", n - shown, mib(rest as f64)),
        ));
    }

    let tb = super::io_totals::TokenBytes::of(v.model.as_ref(), last);
    let (a, d, e) = (tb.attn, tb.dense, tb.experts);
    let kv_total = tb.kv.unwrap_or(0);
    let total = tb.total();
    // The whole token on one bar, the LM head included: on a large-vocabulary model (Gemma 3's
    // 262k rows) it is most of the bytes, which the per-layer bars alone would hide.
    let share_w = w.saturating_sub(6) as u16;
    let mut share = vec![Span::styled("token ", th.dim())];
    share.extend(stacked_bar(
        &[
            (a as f64, '█', th.attn()),
            (d as f64, '▓', th.dense()),
            (e as f64, '▒', th.experts()),
            (kv_total as f64, '░', th.kv()),
            (last.lm_head_bytes as f64, '■', th.vocab()),
        ],
        total as f64,
        share_w,
        (' ', th.dim()),
    ));
    lines.push(Line::from(share));
    let pct = |b: u64| {
        if total > 0 {
            100.0 * b as f64 / total as f64
        } else {
            0.0
        }
    };
    let lm = |share: &str, time: &str| {
        vec![
            Span::styled("■ lm head ", th.vocab()),
            Span::styled(
                format!("{} MiB", mib(last.lm_head_bytes as f64)),
                th.vocab(),
            ),
            Span::styled(
                format!(" ({:.0}%{share})", pct(last.lm_head_bytes)),
                th.strong(),
            ),
            Span::styled(
                format!(" · {:.2} ms{time}", last.ns_lm_head as f64 / 1e6),
                th.dim(),
            ),
        ]
    };
    lines.push(fit_line(
        vec![
            lm(" of the token", " this token"),
            lm(" of the token", ""),
            lm("", ""),
        ],
        w,
    ));
    let sums = |ctx: bool| {
        let mut sums = vec![
            Span::styled(format!("Σ attn {}", mib(a as f64)), th.attn()),
            Span::styled(format!(" · dense {}", mib(d as f64)), th.dense()),
            Span::styled(format!(" · exp {}", mib(e as f64)), th.experts()),
        ];
        if kv.is_some() {
            sums.push(Span::styled(
                if ctx {
                    format!(" · kv {} (ctx {})", mib(kv_total as f64), last.pos + 1)
                } else {
                    format!(" · kv {}", mib(kv_total as f64))
                },
                th.kv(),
            ));
        }
        sums
    };
    lines.push(fit_line(vec![sums(true), sums(false)], w));
    let gbs = tb.gbps(last.ns_total);
    let mut totals = vec![
        Span::styled(format!("{:.2} MiB/token", total as f64 / MIB), th.strong()),
        Span::raw(" · "),
        Span::styled(format!("{gbs:.1} GB/s"), th.measured()),
        Span::styled(
            if kv.is_some() {
                " effective, KV incl."
            } else {
                " effective (no KV size in this trace)"
            },
            th.dim(),
        ),
    ];
    // The bytes are as stored (scales included), said where there is room.
    if totals
        .iter()
        .map(|s| s.content.chars().count())
        .sum::<usize>()
        + 14
        <= w
    {
        totals.insert(1, Span::styled(" with scales", th.dim()));
    }
    let mut short = totals.clone();
    short.truncate(3);
    lines.push(fit_line(vec![totals, short], w));
    if let Some(t) = io {
        lines.push(disk_line(app, last, &t, w));
    }
    let threads = v.config.as_ref().map_or(1, |c| c.threads);
    match app
        .bandwidth
        .as_ref()
        .and_then(|b| b.ceiling_for(threads).map(|c| (b, c)))
    {
        Some((b, c)) if c.read_gbps > 0.0 => {
            let pct = format!("{:.0}%", 100.0 * gbs / c.read_gbps);
            let thr = format!(
                " ({} thread{})",
                c.threads,
                if c.threads == 1 { "" } else { "s" }
            );
            let form = |what: &str, thr: &str| {
                vec![
                    Span::styled(pct.clone(), th.strong()),
                    Span::styled(
                        format!(" of the {:.1} GB/s {what}{thr}", c.read_gbps),
                        th.dim(),
                    ),
                ]
            };
            lines.push(fit_line(
                vec![
                    form("read ceiling", &thr),
                    form("ceiling", &thr),
                    form("ceiling", ""),
                ],
                w,
            ));
            let method = if b.method.is_empty() {
                "older probe: 1 and N threads only"
            } else {
                b.method.as_str()
            };
            // The method in full, wrapped (it names how the ceiling was measured).
            for l in super::common::wrap(&format!("ceiling: {method}"), w.max(1)) {
                lines.push(dim_line(app, l));
            }
            // The probe reads huge pages; weights read through the page cache are in 4 KiB
            // pages, which stream slower under a VM's two-level page walks.
            let mapped = v.config.as_ref().is_some_and(|c| c.weights == "mmap");
            if mapped && b.huge_page_share.is_some_and(|h| h >= 0.5) {
                for l in super::common::wrap("mmap'd weights (4 KiB pages) may not reach it", w) {
                    lines.push(dim_line(app, l));
                }
            }
        }
        _ if app.bandwidth_pending => lines.push(fit_line(
            vec![
                vec![Span::styled(
                    "ceiling: measuring… (first launch: ≥ 1 GiB read probe, a few seconds)",
                    th.dim(),
                )],
                vec![Span::styled("ceiling: measuring… (first launch)", th.dim())],
                vec![Span::styled("ceiling: measuring…", th.dim())],
            ],
            w,
        )),
        _ => lines.push(fit_line(
            vec![
                vec![Span::styled(
                    "ceiling unknown (no bandwidth probe)",
                    th.dim(),
                )],
                vec![Span::styled("ceiling unknown", th.dim())],
            ],
            w,
        )),
    }
    frame.render_widget(Paragraph::new(lines), inner);
}

/// The direct tier's line: bytes read from disk this token (experts routed, plus speculative
/// reads not used) as MB/s over the token, the token's total wait for them, and the expert
/// cache's hits.
fn disk_line(
    app: &App,
    last: &crate::telemetry::TokenStats,
    t: &super::io_totals::IoTotals,
    w: usize,
) -> Line<'static> {
    let th = &app.theme;
    let (_, rate) = super::io_totals::disk_read(last);
    let form = |share: Option<&str>, cache: bool| {
        let mut spans = vec![
            Span::styled("disk ", th.dim()),
            Span::styled(rate.clone(), th.experts()),
            Span::styled(" · waited ", th.dim()),
            Span::styled(
                format!("{} ms", super::common::ms(t.wait_ns as f64)),
                th.bad(),
            ),
        ];
        if let (Some(of), true) = (share, last.ns_total > 0) {
            spans.push(Span::styled(
                format!(
                    " ({:.0}%{of})",
                    100.0 * t.wait_ns as f64 / last.ns_total as f64
                ),
                th.dim(),
            ));
        }
        if let (Some(c), true) = (last.expert_cache, cache) {
            spans.push(Span::styled(" · cache ", th.dim()));
            spans.push(Span::styled(
                c.hit_rate()
                    .map_or("—".into(), |r| format!("{:.0}% hits", 100.0 * r)),
                th.strong(),
            ));
        }
        spans
    };
    fit_line(
        vec![
            form(Some(" of the token"), true),
            form(Some(""), true),
            form(None, true),
            form(None, false),
        ],
        w,
    )
}
