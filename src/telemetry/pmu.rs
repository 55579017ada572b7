//! Per-token, per-phase performance counters through `perf_event_open` (the `perf-event` crate).
//!
//! [`Pmu::new`] opens, on the **calling thread** (create it on the engine thread), a counter group
//! with L1-d read accesses/misses, instructions and cycles. When the hardware PMU is missing (KVM
//! guests, containers) the reason, including the OS error, is kept in `unavailable` and only the
//! software counters (task-clock, page-faults, context-switches) are used; these always form a
//! second group so every token gets them.
//!
//! Per token the engine calls [`Pmu::begin_token`], then [`Pmu::phase`] at the *end* of every
//! phase ([`PmuPhase`]: `"attention"`, `"dense"`, `"experts"`, `"lm_head"`; the delta since the previous read
//! is attributed to the phase that just ended and accumulated over layers), then
//! [`Pmu::end_token`], which returns a [`PmuSample`]. Anything between the last `phase` call and
//! `end_token` is attributed to `"other"` when non-zero. Each read is one `read(2)` per group.
//! [`Pmu::disabled`] costs one branch per call.

use super::event::PmuSample;
use perf_event::events::{Cache, CacheOp, CacheResult, Hardware, Software, WhichCache};
use perf_event::{Builder, Counter, Group};

/// The phases of a token its counters are split into; [`PmuPhase::name`] is the phase's name in
/// `PmuSample`, the trace and the PMU pane.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PmuPhase {
    /// A layer's attention: norm, Q/K/V, heads, output projection.
    Attention,
    /// A layer's dense FFN (or shared expert).
    Dense,
    /// The routed experts injected at a layer's end.
    Experts,
    /// The final norm and the LM head.
    LmHead,
    /// Everything else (routing, combines, a layer without experts' end, between tokens).
    Other,
}

impl PmuPhase {
    pub fn name(self) -> &'static str {
        match self {
            PmuPhase::Attention => "attention",
            PmuPhase::Dense => "dense",
            PmuPhase::Experts => "experts",
            PmuPhase::LmHead => "lm_head",
            PmuPhase::Other => "other",
        }
    }
}

/// Hardware counter names (perf's spelling), in group order.
pub const HW_COUNTERS: [&str; 4] = [
    "L1-dcache-loads",
    "L1-dcache-load-misses",
    "instructions",
    "cycles",
];
/// Software counter names (perf's spelling), in group order. task-clock is in ns.
pub const SW_COUNTERS: [&str; 3] = ["task-clock", "page-faults", "context-switches"];

/// One perf group and its named members, with the previous reading.
struct CounterGroup {
    group: Group,
    members: Vec<(&'static str, Counter)>,
    last: Vec<u64>,
}

impl CounterGroup {
    fn read(&mut self) -> std::io::Result<Vec<u64>> {
        let counts = self.group.read()?;
        // Hardware counters may be multiplexed: scale to the enabled time.
        let (en, run) = (counts.time_enabled(), counts.time_running());
        Ok(self
            .members
            .iter()
            .map(|(_, c)| {
                let v = counts.get(c).copied().unwrap_or(0);
                if run > 0 && run < en {
                    (v as u128 * en as u128 / run as u128) as u64
                } else {
                    v
                }
            })
            .collect())
    }

    /// Read and return the deltas since the previous read.
    fn delta(&mut self) -> std::io::Result<Vec<u64>> {
        let now = self.read()?;
        let d = now
            .iter()
            .zip(&self.last)
            .map(|(n, l)| n.saturating_sub(*l))
            .collect();
        self.last = now;
        Ok(d)
    }
}

struct Active {
    hw: Option<CounterGroup>,
    sw: Option<CounterGroup>,
    /// Accumulated per-phase deltas of the current token: (phase, hw values ++ sw values).
    phases: Vec<(&'static str, Vec<u64>)>,
    /// Software totals of the current token.
    sw_total: Vec<u64>,
    /// First read error; after it the PMU stops reading.
    failed: Option<String>,
}

/// Per-thread counter set. See the module docs.
pub struct Pmu {
    active: Option<Active>,
    unavailable: Option<String>,
}

impl std::fmt::Debug for Pmu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pmu")
            .field("enabled", &self.is_enabled())
            .field("hardware", &self.has_hardware())
            .field("unavailable", &self.unavailable)
            .finish()
    }
}

fn open_hw() -> Result<CounterGroup, String> {
    let l1 = Cache {
        which: WhichCache::L1D,
        operation: CacheOp::READ,
        result: CacheResult::ACCESS,
    };
    let l1_miss = Cache {
        result: CacheResult::MISS,
        ..l1
    };
    let mut group = Group::new().map_err(|e| format!("perf_event_open(group) failed: {e}"))?;
    let mut members = Vec::new();
    let kinds: [perf_event::events::Event; 4] = [
        l1.into(),
        l1_miss.into(),
        Hardware::INSTRUCTIONS.into(),
        Hardware::CPU_CYCLES.into(),
    ];
    for (name, kind) in HW_COUNTERS.iter().zip(kinds) {
        let c = Builder::new()
            .group(&mut group)
            .kind(kind)
            .build()
            .map_err(|e| {
                format!(
                    "perf_event_open({name}) failed: {e} \
                     (virtual machines often expose no PMU; using software counters)"
                )
            })?;
        members.push((*name, c));
    }
    finish_group(group, members).map_err(|e| format!("enabling hardware counters failed: {e}"))
}

fn open_sw() -> Result<CounterGroup, String> {
    let mut group = Group::new().map_err(|e| format!("perf_event_open(group) failed: {e}"))?;
    let mut members = Vec::new();
    let kinds = [
        Software::TASK_CLOCK,
        Software::PAGE_FAULTS,
        Software::CONTEXT_SWITCHES,
    ];
    for (name, kind) in SW_COUNTERS.iter().zip(kinds) {
        // Context switches and faults happen in the kernel: count kernel mode when allowed
        // (perf_event_paranoid permitting), else fall back to user-only.
        let mut b = Builder::new().group(&mut group).kind(kind);
        b.include_kernel();
        let c = match b.build() {
            Ok(c) => c,
            Err(_) => Builder::new()
                .group(&mut group)
                .kind(kind)
                .build()
                .map_err(|e| format!("perf_event_open({name}) failed: {e}"))?,
        };
        members.push((*name, c));
    }
    finish_group(group, members).map_err(|e| format!("enabling software counters failed: {e}"))
}

fn finish_group(
    mut group: Group,
    members: Vec<(&'static str, Counter)>,
) -> std::io::Result<CounterGroup> {
    group.reset()?;
    group.enable()?;
    let mut g = CounterGroup {
        group,
        last: vec![0; members.len()],
        members,
    };
    g.last = g.read()?;
    Ok(g)
}

impl Pmu {
    /// Open hardware + software counters on the calling thread (see module docs).
    pub fn new() -> Pmu {
        Self::open(true)
    }

    /// Software counters only (no hardware attempt); `unavailable` says so.
    pub fn software_only() -> Pmu {
        Self::open(false)
    }

    /// A PMU that measures nothing; every call is a no-op.
    pub fn disabled() -> Pmu {
        Pmu {
            active: None,
            unavailable: Some("PMU disabled".into()),
        }
    }

    fn open(try_hw: bool) -> Pmu {
        let (hw, mut unavailable) = if try_hw {
            match open_hw() {
                Ok(g) => (Some(g), None),
                Err(e) => (None, Some(e)),
            }
        } else {
            (None, Some("hardware counters not requested".to_string()))
        };
        let sw = match open_sw() {
            Ok(g) => Some(g),
            Err(e) => {
                let prev = unavailable.take();
                unavailable = Some(match prev {
                    Some(p) => format!("{p}; software counters unavailable too: {e}"),
                    None => e,
                });
                None
            }
        };
        if hw.is_none() && sw.is_none() {
            return Pmu {
                active: None,
                unavailable,
            };
        }
        let n_sw = sw.as_ref().map_or(0, |g| g.members.len());
        Pmu {
            active: Some(Active {
                hw,
                sw,
                phases: Vec::new(),
                sw_total: vec![0; n_sw],
                failed: None,
            }),
            unavailable,
        }
    }

    /// True when at least one counter group is open.
    pub fn is_enabled(&self) -> bool {
        self.active.is_some()
    }

    /// True when the hardware group is open.
    pub fn has_hardware(&self) -> bool {
        self.active.as_ref().is_some_and(|a| a.hw.is_some())
    }

    /// Why hardware counters are not in use (None when they are).
    pub fn unavailable(&self) -> Option<&str> {
        self.unavailable.as_deref()
    }

    /// Names of the per-phase values, in the order `phase` records them.
    pub fn counter_names(&self) -> Vec<&'static str> {
        let Some(a) = &self.active else {
            return Vec::new();
        };
        let mut v = Vec::new();
        for g in [&a.hw, &a.sw].into_iter().flatten() {
            v.extend(g.members.iter().map(|(n, _)| *n));
        }
        v
    }

    /// Start a token: resets the per-phase accumulators and takes the baseline reading.
    pub fn begin_token(&mut self) {
        let Some(a) = &mut self.active else { return };
        a.phases.clear();
        a.sw_total.iter_mut().for_each(|v| *v = 0);
        let _ = a.sample();
    }

    /// Attribute the counts since the previous read to `phase` (the phase that just ended).
    #[inline]
    pub fn phase(&mut self, phase: PmuPhase) {
        let Some(a) = &mut self.active else { return };
        a.attribute(phase.name());
    }

    /// Finish the token and return its sample (phases in first-seen order).
    pub fn end_token(&mut self) -> PmuSample {
        let Some(a) = &mut self.active else {
            return PmuSample {
                unavailable: self.unavailable.clone(),
                ..Default::default()
            };
        };
        a.attribute(PmuPhase::Other.name());
        let names = {
            let mut v: Vec<&'static str> = Vec::new();
            for g in [&a.hw, &a.sw].into_iter().flatten() {
                v.extend(g.members.iter().map(|(n, _)| *n));
            }
            v
        };
        let phases = a
            .phases
            .iter()
            .filter(|(n, vals)| *n != "other" || vals.iter().any(|v| *v > 0))
            .map(|(n, vals)| {
                (
                    n.to_string(),
                    names
                        .iter()
                        .zip(vals)
                        .map(|(k, v)| (k.to_string(), *v))
                        .collect(),
                )
            })
            .collect();
        let software =
            a.sw.as_ref()
                .map(|g| {
                    g.members
                        .iter()
                        .zip(&a.sw_total)
                        .map(|((n, _), v)| (n.to_string(), *v))
                        .collect()
                })
                .unwrap_or_default();
        let unavailable = match (&self.unavailable, &a.failed) {
            (Some(u), Some(f)) => Some(format!("{u}; {f}")),
            (None, Some(f)) => Some(f.clone()),
            (u, None) => u.clone(),
        };
        PmuSample {
            unavailable,
            phases,
            software,
        }
    }
}

impl Default for Pmu {
    fn default() -> Self {
        Pmu::new()
    }
}

impl Active {
    /// Read all groups; returns hw deltas ++ sw deltas since the previous read.
    fn sample(&mut self) -> Option<Vec<u64>> {
        if self.failed.is_some() {
            return None;
        }
        let mut out = Vec::with_capacity(8);
        for g in [&mut self.hw, &mut self.sw].into_iter().flatten() {
            match g.delta() {
                Ok(d) => out.extend(d),
                Err(e) => {
                    self.failed = Some(format!("counter read failed: {e}"));
                    return None;
                }
            }
        }
        Some(out)
    }

    fn attribute(&mut self, name: &'static str) {
        let Some(d) = self.sample() else { return };
        let n_hw = self.hw.as_ref().map_or(0, |g| g.members.len());
        for (t, v) in self.sw_total.iter_mut().zip(&d[n_hw..]) {
            *t += v;
        }
        match self.phases.iter_mut().find(|(n, _)| *n == name) {
            Some((_, acc)) => acc.iter_mut().zip(&d).for_each(|(a, v)| *a += v),
            None => self.phases.push((name, d)),
        }
    }
}
