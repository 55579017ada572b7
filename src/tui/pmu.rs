//! PMU pane, titled by what it shows: per phase L1-d read accesses, misses, miss rate, instructions and IPC from the
//! latest token's hardware counters — or, when hardware counters are unavailable (e.g. under KVM),
//! the per-phase software counters that were recorded (task-clock, page faults, context
//! switches) and, once, the reason.
//!
//! Counter names are matched loosely so the pane works with perf-style names
//! ("L1-dcache-loads", "L1-dcache-load-misses", "instructions", "cycles") and with snake-case
//! variants ("l1d_read_access", "l1d_read_miss", ...).

use ratatui::layout::{Constraint, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Cell, Paragraph, Row, Table};
use ratatui::Frame;

use super::app::{App, PaneId};
use super::common::{count, dim_line, pane_block};

/// Counters of one phase, as the pane understands them.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PhaseCounters {
    pub l1d_access: Option<u64>,
    pub l1d_miss: Option<u64>,
    pub instructions: Option<u64>,
    pub cycles: Option<u64>,
}

impl PhaseCounters {
    /// Classify raw (name, value) counters.
    pub fn from_raw(raw: &[(String, u64)]) -> Self {
        let mut p = PhaseCounters::default();
        for (name, v) in raw {
            let n = name.to_ascii_lowercase();
            let l1 = n.contains("l1d") || n.contains("l1-d") || n.contains("dcache");
            if l1 && n.contains("miss") {
                p.l1d_miss = Some(*v);
            } else if l1 {
                p.l1d_access = Some(*v);
            } else if n.starts_with("instr") {
                p.instructions = Some(*v);
            } else if n == "cycles" || n.contains("cpu-cycles") || n.contains("cpu_cycles") {
                p.cycles = Some(*v);
            }
        }
        p
    }
    /// misses / accesses.
    pub fn miss_rate(&self) -> Option<f64> {
        match (self.l1d_access, self.l1d_miss) {
            (Some(a), Some(m)) if a > 0 => Some(m as f64 / a as f64),
            _ => None,
        }
    }
    /// instructions / cycles.
    pub fn ipc(&self) -> Option<f64> {
        match (self.instructions, self.cycles) {
            (Some(i), Some(c)) if c > 0 => Some(i as f64 / c as f64),
            _ => None,
        }
    }
}

fn software_line<'a>(app: &App, sw: &[(String, u64)]) -> Line<'a> {
    let th = &app.theme;
    let mut spans = vec![Span::styled("sw: ", th.dim())];
    for (i, (name, v)) in sw.iter().enumerate() {
        if i > 0 {
            spans.push(Span::styled(" · ", th.dim()));
        }
        let val = if name.contains("clock") || name.ends_with("_ns") {
            format!("{:.2} ms", *v as f64 / 1e6)
        } else {
            count(*v)
        };
        spans.push(Span::styled(format!("{name} "), th.dim()));
        spans.push(Span::styled(val, th.measured()));
    }
    Line::from(spans)
}

/// The pane's title says what it shows: hardware L1-d counters when the token carries them,
/// the software counters otherwise (no L1-d data exists then).
fn title<'a>(app: &App, pmu: Option<&crate::telemetry::event::PmuSample>) -> Vec<Span<'a>> {
    let th = &app.theme;
    let what = match pmu {
        Some(p) if p.unavailable.is_some() => " · per phase (this token)",
        Some(_) => " · L1-d per phase (this token)",
        None => " · per phase (this token)",
    };
    let name = match pmu {
        Some(p) if p.unavailable.is_some() => "Software counters",
        _ => "PMU",
    };
    vec![Span::styled(name, th.title()), Span::styled(what, th.dim())]
}

fn opt<T>(x: Option<T>, f: impl Fn(T) -> String) -> String {
    x.map(f).unwrap_or_else(|| "—".into())
}

/// Render the PMU pane.
pub fn render(frame: &mut Frame, area: Rect, app: &App) {
    let th = &app.theme;
    let v = app.view();
    let pmu_now = v.last.as_ref().and_then(|l| l.pmu.as_ref());
    let block = pane_block(app, PaneId::Pmu, title(app, pmu_now), area.width);
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let Some(last) = v.last.as_ref() else {
        frame.render_widget(
            Paragraph::new(dim_line(app, "waiting for the first token…")),
            inner,
        );
        return;
    };
    let Some(pmu) = last.pmu.as_ref() else {
        frame.render_widget(
            Paragraph::new(dim_line(app, "no counter sample for this token")),
            inner,
        );
        return;
    };
    if let Some(reason) = &pmu.unavailable {
        // No hardware counters: the per-phase software counters that were recorded, then the
        // reason (shown here only — not in the transcript or the status line).
        let mut lines: Vec<Line> = Vec::new();
        let names: Vec<&str> = pmu
            .phases
            .first()
            .map(|(_, c)| c.iter().map(|(n, _)| n.as_str()).collect())
            .unwrap_or_default();
        if names.is_empty() {
            lines.push(if pmu.software.is_empty() {
                dim_line(app, "no software counters either")
            } else {
                software_line(app, &pmu.software)
            });
        } else {
            let short = |n: &str| match n {
                "task-clock" => "task ms".to_string(),
                "page-faults" => "faults".to_string(),
                "context-switches" => "ctx-sw".to_string(),
                o => o.chars().take(8).collect(),
            };
            let mut head = vec![Span::styled(format!("{:<10}", "phase"), th.dim())];
            head.extend(
                names
                    .iter()
                    .map(|n| Span::styled(format!("{:>9}", short(n)), th.dim())),
            );
            lines.push(Line::from(head));
            for (phase, raw) in &pmu.phases {
                let mut row = vec![Span::raw(format!("{phase:<10}"))];
                for (n, v) in raw {
                    let val = if n.contains("clock") {
                        format!("{:.2}", *v as f64 / 1e6)
                    } else {
                        count(*v)
                    };
                    row.push(Span::styled(format!("{val:>9}"), th.measured()));
                }
                lines.push(Line::from(row));
            }
        }
        lines.push(Line::from(vec![
            Span::styled("no hardware PMU: ", th.warn()),
            // Traces recorded before the reason lost its own prefix say it twice otherwise.
            Span::styled(
                reason
                    .strip_prefix("no hardware PMU: ")
                    .unwrap_or(reason)
                    .to_string(),
                th.dim(),
            ),
        ]));
        lines.push(dim_line(
            app,
            "cache behaviour: valgrind --tool=cachegrind (simulated D1)",
        ));
        frame.render_widget(
            Paragraph::new(lines).wrap(ratatui::widgets::Wrap { trim: false }),
            inner,
        );
        return;
    }
    let header = Row::new(["phase", "L1d acc", "miss", "miss%", "instr", "IPC"]).style(th.dim());
    let mut rows = Vec::new();
    let mut tot = PhaseCounters::default();
    let add = |a: Option<u64>, b: Option<u64>| match (a, b) {
        (None, None) => None,
        (x, y) => Some(x.unwrap_or(0) + y.unwrap_or(0)),
    };
    for (phase, raw) in &pmu.phases {
        let p = PhaseCounters::from_raw(raw);
        tot = PhaseCounters {
            l1d_access: add(tot.l1d_access, p.l1d_access),
            l1d_miss: add(tot.l1d_miss, p.l1d_miss),
            instructions: add(tot.instructions, p.instructions),
            cycles: add(tot.cycles, p.cycles),
        };
        rows.push(row(phase, &p, th.text()));
    }
    rows.push(row("total", &tot, th.strong()));
    let widths = [
        Constraint::Length(9),
        Constraint::Length(8),
        Constraint::Length(8),
        Constraint::Length(6),
        Constraint::Length(8),
        Constraint::Length(5),
    ];
    let n_rows = rows.len() as u16 + 1;
    let table = Table::new(rows, widths).header(header).column_spacing(1);
    let [t_area, sw_area] =
        ratatui::layout::Layout::vertical([Constraint::Length(n_rows), Constraint::Min(0)])
            .areas(inner);
    frame.render_widget(table, t_area);
    if !pmu.software.is_empty() {
        frame.render_widget(
            Paragraph::new(software_line(app, &pmu.software))
                .wrap(ratatui::widgets::Wrap { trim: false }),
            sw_area,
        );
    }
}

fn row<'a>(phase: &str, p: &PhaseCounters, style: ratatui::style::Style) -> Row<'a> {
    Row::new(vec![
        Cell::from(phase.to_string()),
        Cell::from(opt(p.l1d_access, count)),
        Cell::from(opt(p.l1d_miss, count)),
        Cell::from(opt(p.miss_rate(), |r| format!("{:.2}", 100.0 * r))),
        Cell::from(opt(p.instructions, count)),
        Cell::from(opt(p.ipc(), |r| format!("{r:.2}"))),
    ])
    .style(style)
}
