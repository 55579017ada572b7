//! The Roofline pane: each phase's (attention, dense, experts, lm head) achieved GB/s over the
//! recent window — its bytes as stored (KV reads in attention) over its measured time — against
//! the measured read ceiling (the bandwidth probe the Streams pane shows) and against a compute
//! roof. The phase's arithmetic intensity (FLOPs per byte) is modelled from the model's shapes,
//! and the compute roof from the ISA, the thread count and an assumed clock: both are labelled
//! "modelled" on screen.

use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use ratatui::Frame;

use super::app::{App, PaneId};
use super::common::{dim_line, fit_line, pane_block, stacked_bar};
use crate::telemetry::event::{ModelSummary, TokenStats};

/// The clock the compute roof assumes (the probe does not measure it).
pub const ASSUMED_GHZ: f64 = 3.0;

/// One phase summed over the window.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Phase {
    pub name: &'static str,
    pub bytes: f64,
    pub ns: f64,
    /// Modelled FLOPs (None: shapes unknown).
    pub flops: Option<f64>,
}

impl Phase {
    /// Achieved GB/s (measured time).
    pub fn gbps(&self) -> f64 {
        if self.ns > 0.0 {
            self.bytes / self.ns
        } else {
            0.0
        }
    }

    /// Arithmetic intensity, FLOPs per byte (modelled).
    pub fn intensity(&self) -> Option<f64> {
        self.flops
            .filter(|_| self.bytes > 0.0)
            .map(|f| f / self.bytes)
    }
}

/// Single-precision FLOPs per cycle per core of an ISA (FMA units × lanes × 2; a model).
pub fn flops_per_cycle(isa: &str) -> f64 {
    let i = isa.to_ascii_lowercase();
    if i.contains("512") {
        64.0
    } else if i.contains("avx2") || i.contains("fma") {
        32.0
    } else if ["avx", "neon", "sve", "sse"].iter().any(|x| i.contains(x)) {
        16.0
    } else {
        4.0
    }
}

/// Modelled FLOPs of one token per phase: 2 per weight of the matrices the phase applied (from
/// the shapes; layers with no bytes in a phase skipped it), plus 2 per KV element per query
/// head sharing it in attention.
fn token_flops(m: &ModelSummary, s: &TokenStats) -> [f64; 4] {
    let d = m.d_model as f64;
    let heads = m.n_heads.max(1) as f64;
    let group = heads / m.n_kv_heads.max(1) as f64;
    let kv_dim = m.kv_dim as f64;
    let mut f = [0.0; 4];
    for (l, x) in s.layers.iter().enumerate() {
        if x.bytes.attn > 0 {
            f[0] += 2.0 * (2.0 * d * d + 2.0 * d * kv_dim);
            if let (Some(kv), true) = (m.kv_layer_read_bytes(l as u32, s.pos), m.kv_elem_bytes > 0)
            {
                f[0] += 2.0 * group * kv as f64 / m.kv_elem_bytes as f64;
            }
        }
        if x.bytes.dense > 0 {
            f[1] += 2.0 * 3.0 * d * m.d_ff as f64;
        }
        f[2] += 2.0 * 3.0 * d * m.expert_ffn as f64 * x.routing.len() as f64;
    }
    f[3] = 2.0 * d * m.vocab as f64;
    f
}

/// The phases over the recent window.
pub fn phases(app: &App) -> Vec<Phase> {
    let v = app.view();
    let model = v.model.as_ref().filter(|m| m.d_model > 0);
    let mut p = [
        Phase {
            name: "attention",
            ..Phase::default()
        },
        Phase {
            name: "dense",
            ..Phase::default()
        },
        Phase {
            name: "experts",
            ..Phase::default()
        },
        Phase {
            name: "lm head",
            ..Phase::default()
        },
    ];
    for s in &v.recent {
        let tb = super::io_totals::TokenBytes::of(v.model.as_ref(), s);
        p[0].bytes += (tb.attn + tb.kv.unwrap_or(0)) as f64;
        p[1].bytes += tb.dense as f64;
        p[2].bytes += tb.experts as f64;
        p[3].bytes += tb.vocab as f64;
        for l in &s.layers {
            p[0].ns += l.ns_attn as f64;
            p[1].ns += l.ns_dense as f64;
            p[2].ns += (l.ns_router + l.ns_experts) as f64;
        }
        p[3].ns += s.ns_lm_head as f64;
        if let Some(m) = model {
            for (ph, f) in p.iter_mut().zip(token_flops(m, s)) {
                *ph.flops.get_or_insert(0.0) += f;
            }
        }
    }
    p.into_iter()
        .filter(|x| x.bytes > 0.0 || x.ns > 0.0)
        .collect()
}

/// Render the roofline into `area`.
pub fn render(frame: &mut Frame, area: Rect, app: &App) {
    let th = &app.theme;
    let block = pane_block(
        app,
        PaneId::Roofline,
        vec![
            Span::styled("Roofline", th.title()),
            Span::styled(" · GB/s per phase (measured)", th.dim()),
            Span::styled(" vs read ceiling (measured), compute (modelled)", th.dim()),
        ],
        area.width,
    );
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let v = app.view();
    let w = inner.width as usize;
    if v.recent.is_empty() {
        frame.render_widget(
            Paragraph::new(dim_line(app, "waiting for the first token…")),
            inner,
        );
        return;
    }
    let ph = phases(app);
    let threads = v.config.as_ref().map_or(1, |c| c.threads.max(1));
    let ceiling = app
        .bandwidth
        .as_ref()
        .and_then(|b| b.ceiling_for(threads))
        .map(|c| c.read_gbps)
        .filter(|&c| c > 0.0);
    let isa = v.config.as_ref().map_or("?".to_string(), |c| c.isa.clone());
    let fpc = flops_per_cycle(&isa);
    let compute = fpc * threads as f64 * ASSUMED_GHZ; // GFLOP/s
                                                      // Roof of a phase: the lower of the read ceiling and compute ÷ intensity.
    let roof = |p: &Phase| -> Option<f64> {
        let by_compute = p.intensity().map(|ai| compute / ai);
        match (ceiling, by_compute) {
            (Some(c), Some(b)) => Some(c.min(b)),
            (c, b) => c.or(b),
        }
    };
    let scale = ph
        .iter()
        .map(|p| p.gbps().max(roof(p).unwrap_or(0.0)))
        .fold(0.0, f64::max);
    let name_w = 10usize;
    let num_w = 14usize; // " 12.3 GB/s 3.6"
    let tail_w = 21usize; // " 100% of roof compute"
    let bar_w = w.saturating_sub(name_w + num_w + tail_w) as u16;
    let mut lines: Vec<Line> = vec![fit_line(
        vec![
            vec![Span::styled(
                format!(
                    "{:<name_w$}{:>9} {:>4}  achieved █ · roof ░ (0–{scale:.1} GB/s)",
                    "phase", "GB/s", "F/B"
                ),
                th.dim(),
            )],
            vec![Span::styled(
                format!(
                    "{:<name_w$}{:>9} {:>4}  █ achieved ░ roof",
                    "phase", "GB/s", "F/B"
                ),
                th.dim(),
            )],
        ],
        w,
    )];
    for p in &ph {
        let g = p.gbps();
        let r = roof(p);
        let mut spans = vec![
            Span::styled(format!("{:<name_w$}", p.name), th.text()),
            Span::styled(format!("{g:>9.1}"), th.measured()),
            Span::styled(
                format!(
                    " {:>4}",
                    p.intensity().map_or("—".into(), |ai| format!("{ai:.1}"))
                ),
                th.model(),
            ),
            Span::raw(" "),
        ];
        if bar_w > 0 {
            spans.extend(stacked_bar(
                &[
                    (g, '█', th.measured()),
                    ((r.unwrap_or(g) - g).max(0.0), '░', th.model()),
                ],
                scale,
                bar_w,
                (' ', th.dim()),
            ));
        }
        let bound = match (p.intensity(), ceiling) {
            (Some(ai), Some(c)) if ai * c > compute => "compute",
            (Some(_), Some(_)) => "reads",
            _ => "?",
        };
        let pct = r
            .filter(|&r| r > 0.0)
            .map_or("  —".into(), |r| format!("{:>3.0}%", 100.0 * g / r));
        spans.push(Span::styled(format!(" {pct} of roof"), th.strong()));
        spans.push(Span::styled(format!(" {bound}"), th.dim()));
        lines.push(Line::from(spans));
    }
    lines.push(match ceiling {
        Some(c) => fit_line(
            vec![
                vec![
                    Span::styled("read ceiling ", th.dim()),
                    Span::styled(format!("{c:.1} GB/s"), th.measured()),
                    Span::styled(
                        format!(" measured (bandwidth probe, {threads} thr)"),
                        th.dim(),
                    ),
                ],
                vec![
                    Span::styled("ceiling ", th.dim()),
                    Span::styled(format!("{c:.1} GB/s"), th.measured()),
                    Span::styled(" measured", th.dim()),
                ],
            ],
            w,
        ),
        None => fit_line(
            vec![
                vec![Span::styled(
                    "read ceiling unknown (no bandwidth probe): roofs from compute only",
                    th.dim(),
                )],
                vec![Span::styled("read ceiling unknown (no probe)", th.dim())],
            ],
            w,
        ),
    });
    lines.push(fit_line(
        vec![
            vec![
                Span::styled("compute ", th.dim()),
                Span::styled(format!("{compute:.0} GFLOP/s"), th.model()),
                Span::styled(
                    format!(
                        " modelled: {isa} {fpc:.0} FLOP/cycle × {threads} thr × {ASSUMED_GHZ:.1} GHz assumed"
                    ),
                    th.dim(),
                ),
            ],
            vec![
                Span::styled("compute ", th.dim()),
                Span::styled(format!("{compute:.0} GFLOP/s"), th.model()),
                Span::styled(" modelled (ISA × thr × clock)", th.dim()),
            ],
            vec![
                Span::styled(format!("{compute:.0} GFLOP/s"), th.model()),
                Span::styled(" modelled", th.dim()),
            ],
        ],
        w,
    ));
    let n = v.recent.len();
    let ridge = ceiling.map(|c| compute / c);
    lines.push(fit_line(
        vec![
            vec![Span::styled(
                format!(
                    "{}F/B modelled from shapes · GB/s: bytes as stored ÷ measured ms, last {n} tok",
                    ridge.map_or(String::new(), |r| format!("ridge {r:.1} F/B · "))
                ),
                th.dim(),
            )],
            vec![Span::styled(
                format!("F/B modelled · GB/s measured, last {n} tok"),
                th.dim(),
            )],
        ],
        w,
    ));
    frame.render_widget(Paragraph::new(lines), inner);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tui::app::Msg;
    use crate::tui::fixture::{demo_events, dense_events};

    #[test]
    fn phases_have_bytes_time_and_a_modelled_intensity() {
        for events in [demo_events(10, false), dense_events()] {
            let mut app = App::default();
            for e in events {
                app.apply(Msg::Stamped(e));
            }
            let ph = phases(&app);
            assert!(ph.iter().any(|p| p.name == "attention"));
            assert!(ph.iter().any(|p| p.name == "lm head"));
            for p in &ph {
                assert!(p.gbps().is_finite() && p.gbps() >= 0.0, "{p:?}");
                if let Some(ai) = p.intensity() {
                    // Quantized weights: a few FLOPs per byte, never absurd.
                    assert!(ai > 0.1 && ai < 100.0, "{p:?} {ai}");
                }
            }
        }
        assert_eq!(flops_per_cycle("AVX2"), 32.0);
        assert_eq!(flops_per_cycle("avx512f"), 64.0);
        assert_eq!(flops_per_cycle(""), 4.0);
        assert_eq!(Phase::default().gbps(), 0.0);
        assert!(phases(&App::default()).is_empty());
    }
}
