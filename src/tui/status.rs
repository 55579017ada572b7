//! Status bar (top: REC / REPLAY / FROZEN badges, model, quant, numerics, sampling, context
//! size, threads, ISA, toggles, fitted to the width by priority) and the
//! footer (decode / prefill tok/s, context gauge, a one-line A/B summary or the latest message,
//! and key hints generated from the keymap).

use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use ratatui::Frame;

use super::app::{fmt_speed, App};
use super::common::{times, truncate};
use super::keymap::footer_hints;
use crate::telemetry::ab::Verdict;

fn width(spans: &[Span]) -> usize {
    spans.iter().map(|s| s.content.chars().count()).sum()
}

/// One part of the status bar: its forms from the longest to the shortest; a `droppable` part
/// may vanish when even its shortest form does not fit.
struct Part {
    forms: Vec<String>,
    droppable: bool,
}

impl Part {
    fn new(forms: Vec<String>, droppable: bool) -> Self {
        Part { forms, droppable }
    }
}

fn cells(s: &str) -> usize {
    s.chars().count()
}

/// Picks a form for every part (None = dropped) so that the parts fit in `avail` cells, given
/// `prio`, the parts' indices from the most to the least important: shorten the least important
/// parts first, then drop them (least important first), then give the room left back, most
/// important first (dropped parts come back before any part grows). Parts that cannot fit are
/// left at their shortest (the line is cut).
fn fit(parts: &[Part], prio: &[usize], avail: usize) -> Vec<Option<usize>> {
    let mut pick: Vec<Option<usize>> = parts.iter().map(|_| Some(0)).collect();
    let width = |pick: &[Option<usize>]| -> usize {
        parts
            .iter()
            .zip(pick)
            .map(|(p, k)| k.map_or(0, |k| cells(&p.forms[k])))
            .sum()
    };
    for &i in prio.iter().rev() {
        while width(&pick) > avail {
            match pick[i] {
                Some(k) if k + 1 < parts[i].forms.len() => pick[i] = Some(k + 1),
                _ => break,
            }
        }
    }
    for &i in prio.iter().rev() {
        if width(&pick) > avail && parts[i].droppable {
            pick[i] = None;
        }
    }
    // Give the room back, most important first: dropped parts come back at their shortest
    // (being there counts more than being long), then parts grow.
    for &i in prio {
        if pick[i].is_none() {
            let mut t = pick.clone();
            t[i] = Some(parts[i].forms.len() - 1);
            if width(&t) <= avail {
                pick = t;
            }
        }
    }
    for &i in prio {
        while let Some(k) = pick[i].filter(|&k| k > 0) {
            let mut t = pick.clone();
            t[i] = Some(k - 1);
            if width(&t) > avail {
                break;
            }
            pick = t;
        }
    }
    pick
}

/// Render the one-line status bar: the badges, then the model, the numerics and sampling, the
/// context size, threads and ISA, and the engine toggles, fitted to the width by priority (a
/// chat model: model, act, kv, sampling, ctx, quant types, then toggles and threads; otherwise
/// model, toggles, quant types, threads, numerics, sampling).
pub fn render_top(frame: &mut Frame, area: Rect, app: &App) {
    let th = &app.theme;
    let v = &app.live;
    let mut spans = vec![Span::styled(
        " cflow-tui",
        th.bar().add_modifier(ratatui::style::Modifier::BOLD),
    )];
    // Badges come first and are never dropped.
    let mut badges: Vec<Span> = Vec::new();
    if app.recording {
        badges.push(Span::styled(" ", th.bar()));
        badges.push(Span::styled("● REC", th.bar().patch(th.bad())));
    }
    if let Some(r) = &app.replay {
        badges.push(Span::styled(" ", th.bar()));
        badges.push(Span::styled(
            format!(
                " REPLAY {} {} t={:.3}s ",
                if r.paused { "⏸" } else { "▶" },
                fmt_speed(r.speed),
                r.t_ns as f64 / 1e9
            ),
            th.badge(),
        ));
    }
    if app.frozen.is_some() {
        badges.push(Span::styled(" ", th.bar()));
        badges.push(Span::styled(" FROZEN ", th.badge()));
    }
    if app.whatif.is_some() {
        badges.push(Span::styled(" ", th.bar()));
        badges.push(Span::styled(" WHAT-IF ", th.badge()));
    }
    if !app.mouse_captured && app.replay.is_none() {
        badges.push(Span::styled(" ", th.bar()));
        badges.push(Span::styled(" MOUSE OFF ", th.badge()));
    }
    spans.extend(badges);

    let empty = || Part::new(vec![String::new()], true);
    // The model's name (and whether its weights are synthetic), then its quant types.
    let (model, quant) = match &v.model {
        Some(m) => {
            let (syn_long, syn_short) = if m.synthetic {
                (" (synthetic weights)", " (synthetic)")
            } else {
                ("", "")
            };
            let arch = if !m.arch.is_empty() && m.arch != m.name {
                format!(" {}", m.arch)
            } else {
                String::new()
            };
            let short = truncate(&m.name, 16);
            let quant = match quant_forms(m) {
                Some(forms) => Part::new(forms, true),
                None => empty(),
            };
            (
                Part::new(
                    vec![
                        format!(" · {}{arch}{syn_long}", m.name),
                        format!(" · {}{syn_short}", m.name),
                        format!(" · {short}{syn_short}"),
                    ],
                    false,
                ),
                quant,
            )
        }
        None => (Part::new(vec![" · no session".into()], false), empty()),
    };
    let (numerics, sampling) = match &app.settings {
        Some(g) => (
            Part::new(
                vec![
                    format!(" │ act {} kv {}", g.act, g.kv),
                    format!(" │ {}/kv {}", g.act, g.kv),
                ],
                true,
            ),
            Part::new(
                vec![format!(
                    " │ {}",
                    crate::chat::sampling::describe_short(&g.sampling)
                )],
                true,
            ),
        ),
        None => (empty(), empty()),
    };
    let ctx = match &v.model {
        Some(m) if app.chat_mode() && m.max_ctx > 0 => {
            Part::new(vec![format!(" │ ctx {}", m.max_ctx)], true)
        }
        _ => empty(),
    };
    let (machine, toggles) = match &v.config {
        Some(c) => {
            // The prefetch thread is one more thread than the CPUs: it takes compute time.
            let shared = c.prefetch && app.prefetch_shares_core().is_some();
            let onoff = match (c.prefetch, shared) {
                (true, true) => "ON (shares a core)",
                (true, false) => "ON",
                _ => "OFF",
            };
            (
                // Where decode reads the weights (`--weights`) is the first detail to go.
                Part::new(
                    vec![
                        match (c.weights.as_str(), c.repacked) {
                            ("", _) => format!(" · {} thr · {}", c.threads, c.isa),
                            (w, false) => format!(" · {} thr · {} · {w}", c.threads, c.isa),
                            (w, true) => format!(" · {} thr · {} · {w} repacked", c.threads, c.isa),
                        },
                        format!(" · {} thr · {}", c.threads, c.isa),
                        format!(" · {}t {}", c.threads, c.isa),
                    ],
                    true,
                ),
                Part::new(
                    vec![
                        format!(
                            " │ prefetch {onoff} │ fetch {} │ layout {} │ tier {}",
                            c.fetch.name().to_uppercase(),
                            c.layout,
                            c.expert_tier
                        ),
                        format!(
                            " │ pf {onoff} · {} · {} · {}",
                            c.fetch, c.layout, c.expert_tier
                        ),
                        format!(" │ pf {onoff} · {}", c.fetch),
                    ],
                    true,
                ),
            )
        }
        None => (empty(), empty()),
    };
    // Display order and priority. A chat model's numerics and sampling come before the engine
    // toggles (they change the answers; the toggles only the speed).
    let parts = [model, quant, numerics, sampling, ctx, machine, toggles];
    let (order, prio): (&[usize], &[usize]) = if app.chat_mode() {
        (&[0, 1, 2, 3, 4, 5, 6], &[0, 2, 3, 4, 1, 6, 5])
    } else {
        (&[0, 1, 5, 6, 2, 3, 4], &[0, 6, 1, 5, 2, 3, 4])
    };
    let avail = (area.width as usize).saturating_sub(width(&spans));
    let pick = fit(&parts, prio, avail);
    for &i in order {
        if let Some(k) = pick[i] {
            if !parts[i].forms[k].is_empty() {
                spans.push(Span::styled(parts[i].forms[k].clone(), th.bar()));
            }
        }
    }
    let used = width(&spans);
    if used < area.width as usize {
        spans.push(Span::styled(
            " ".repeat(area.width as usize - used),
            th.bar(),
        ));
    }
    frame.render_widget(Paragraph::new(Line::from(spans)), area);
}

/// The metrics part of the footer.
fn metrics<'a>(app: &App, compact: bool) -> Vec<Span<'a>> {
    let th = &app.theme;
    let v = &app.live;
    let mut spans = vec![Span::raw(" ")];
    spans.push(Span::styled("decode ", th.dim()));
    spans.push(Span::styled(
        v.decode_tps.map_or("—".into(), |x| format!("{x:.0}")),
        th.strong(),
    ));
    spans.push(Span::styled(" tok/s · prefill ", th.dim()));
    spans.push(Span::styled(
        v.prefill_tps.map_or("—".into(), |x| format!("{x:.0}")),
        th.strong(),
    ));
    spans.push(Span::styled(
        if compact {
            " · ctx "
        } else {
            " tok/s · ctx "
        },
        th.dim(),
    ));
    let max = v.model.as_ref().map_or(0, |m| m.max_ctx);
    spans.push(Span::styled(format!("{}/{}", v.ctx_used, max), th.strong()));
    if max > 0 && !compact {
        let wgt = 8usize;
        let fill = ((v.ctx_used as f64 / max as f64).min(1.0) * wgt as f64).round() as usize;
        spans.push(Span::raw(" "));
        spans.push(Span::styled("▰".repeat(fill), th.measured()));
        spans.push(Span::styled("▱".repeat(wgt - fill), th.dim()));
    }
    // Contention on this machine (measured, live runs): threads running or runnable against
    // the CPUs, stolen time, load.
    if let Some(c) = &app.contention {
        let hot = c.run_queue > c.cpus || c.steal_pct >= 5.0;
        spans.push(Span::styled(
            if compact { " · rq " } else { " · run-queue " },
            th.dim(),
        ));
        spans.push(Span::styled(
            format!("{}/{}", c.run_queue, c.cpus),
            if hot { th.warn() } else { th.strong() },
        ));
        spans.push(Span::styled(
            if compact { " st " } else { " CPUs · steal " },
            th.dim(),
        ));
        spans.push(Span::styled(format!("{:.0}%", c.steal_pct), th.strong()));
        if !compact {
            spans.push(Span::styled(" · load ", th.dim()));
            spans.push(Span::styled(format!("{:.1}", c.load1), th.strong()));
        }
    }
    if let Some(msg) = app.status_message() {
        spans.push(Span::styled(" · ", th.dim()));
        spans.push(Span::styled(msg.to_string(), th.warn()));
    } else if let Some((t, a, b, e)) = v.ab.views().iter().find_map(|tv| match &tv.verdict {
        Verdict::Compared { a, b, est, .. } => Some((tv.toggle, a, b, est)),
        _ => None,
    }) {
        spans.push(Span::styled(
            format!(" · A/B {} {a}/{b} ", t.name()),
            th.dim(),
        ));
        spans.push(Span::styled(times(e.ratio), th.measured()));
        spans.push(Span::styled(
            format!(" [{:.2}–{:.2}] n={}/{} blk", e.ci.0, e.ci.1, e.n_a, e.n_b),
            th.dim(),
        ));
    }
    spans
}

/// Key hints, generated from the keymap table.
fn hints<'a>(app: &App, max_width: usize) -> Vec<Span<'a>> {
    let th = &app.theme;
    let mut spans: Vec<Span> = Vec::new();
    let push = |spans: &mut Vec<Span<'a>>, k: String, label: &str| -> bool {
        let add = k.chars().count() + label.chars().count() + 3;
        if width(spans) + add > max_width {
            return false;
        }
        spans.push(Span::styled(k, th.key()));
        spans.push(Span::styled(format!(" {label}  "), th.dim()));
        true
    };
    for (k, label) in footer_hints(app.replay.is_some()) {
        if !push(&mut spans, k, label) {
            break;
        }
    }
    spans
}

/// Render the footer: one line (metrics + short hints) or two (metrics, then all key hints).
pub fn render_footer(frame: &mut Frame, area: Rect, app: &App) {
    let th = &app.theme;
    let w = area.width as usize;
    let compact = w < 120;
    let mut top = metrics(app, compact);
    // A status message that does not fit after the metrics takes the line alone, and both lines
    // (the key hints give way while it shows) when it is longer still: it is never cut off.
    if let Some(msg) = app.status_message().filter(|_| width(&top) > w) {
        let rows = super::common::wrap(msg, w.saturating_sub(1).max(1));
        if rows.len() > 1 && area.height >= 2 {
            let lines: Vec<Line> = rows
                .into_iter()
                .take(area.height as usize)
                .map(|r| Line::from(vec![Span::raw(" "), Span::styled(r, th.warn())]))
                .collect();
            frame.render_widget(Paragraph::new(lines), area);
            return;
        }
        top = vec![Span::raw(" "), Span::styled(msg.to_string(), th.warn())];
    }
    if area.height >= 2 {
        frame.render_widget(
            Paragraph::new(vec![
                Line::from(top),
                Line::from({
                    let mut s = vec![Span::raw(" ")];
                    s.extend(hints(app, w.saturating_sub(1)));
                    s
                }),
            ]),
            area,
        );
        return;
    }
    let tail = vec![
        Span::styled("?", th.key()),
        Span::styled(" help  ", th.dim()),
        Span::styled("Tab", th.key()),
        Span::styled(" focus  ", th.dim()),
        Span::styled("q", th.key()),
        Span::styled(" quit ", th.dim()),
    ];
    let tw = width(&tail);
    let mw = width(&top);
    if mw + tw <= w {
        top.push(Span::raw(" ".repeat(w - mw - tw)));
        top.extend(tail);
    }
    frame.render_widget(Paragraph::new(Line::from(top)), area);
}

/// The model's weight types, longest form first: from the inspect report's `quant_mix` (a
/// mix names every type with its matrix count, never only its first type), else the older
/// traces' list of type names.
fn quant_forms(m: &crate::telemetry::ModelSummary) -> Option<Vec<String>> {
    let mix = m.inspect.as_ref().map(|r| &r["quant_mix"]);
    if let Some(label) = mix.and_then(|x| x["label"].as_str()) {
        let n = mix
            .and_then(|x| x["matrices"].as_array())
            .map_or(0, Vec::len);
        if n <= 1 {
            return Some(vec![format!(" · {label}")]);
        }
        let short = match mix.and_then(|x| x["file_type"].as_str()) {
            Some(t) => format!(" · {t} mix"),
            None => format!(" · {n} types"),
        };
        return Some(vec![format!(" · {label}"), short]);
    }
    match m.quant_types.as_slice() {
        [] => None,
        [q] => Some(vec![format!(" · {q}")]),
        qs => Some(vec![
            format!(" · {}", qs.join("/")),
            format!(" · {} types", qs.len()),
        ]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(forms: &[&str], droppable: bool) -> Part {
        Part::new(forms.iter().map(|s| s.to_string()).collect(), droppable)
    }

    #[test]
    fn fit_shortens_then_drops_the_least_important_first_then_gives_room_back() {
        let parts = [
            part(&["AAAAAAAA", "AAA"], false),
            part(&["BBBBBB", "BB"], true),
            part(&["CCCC", "C"], true),
        ];
        let prio = [0, 1, 2];
        // Everything fits.
        assert_eq!(fit(&parts, &prio, 18), vec![Some(0), Some(0), Some(0)]);
        // One cell short: the least important part shortens, nothing else.
        assert_eq!(fit(&parts, &prio, 17), vec![Some(0), Some(0), Some(1)]);
        // All shortest is 6; at 9 the room goes to the first part, by priority, that can
        // grow into it (A and B cannot).
        assert_eq!(fit(&parts, &prio, 9), vec![Some(1), Some(1), Some(0)]);
        // At 11: shortening C then B is enough; A keeps its long form.
        assert_eq!(fit(&parts, &prio, 11), vec![Some(0), Some(1), Some(1)]);
        // At 4: the droppable parts go, least important first, the rest is its shortest.
        assert_eq!(fit(&parts, &prio, 4), vec![Some(1), None, Some(1)]);
        assert_eq!(fit(&parts, &prio, 3), vec![Some(1), None, None]);
        // Not even the shortest undroppable part fits: it stays (the line is cut).
        assert_eq!(fit(&parts, &prio, 1), vec![Some(1), None, None]);
        // Being there counts more than being long: a dropped part comes back before a more
        // important one grows into its room.
        let parts = [
            part(&["AAAAA", "A"], false),
            part(&["BBBBBBBB"], true),
            part(&["CCC"], true),
        ];
        assert_eq!(fit(&parts, &prio, 5), vec![Some(1), None, Some(0)]);
    }
}
