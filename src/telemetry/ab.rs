//! Controlled A/B statistics of ms/token for the four engine toggles (prefetch, fetch, layout,
//! expert tier), and the A/B auto schedule that interleaves a toggle's arms.
//!
//! Every measured token is kept as a [`Sample`] tagged with the full [`Setting`] it ran with and
//! its context position. A toggle's two arms are compared only under one *condition* — all other
//! toggles equal — choosing the condition where the smaller arm has the most samples; tokens run
//! under other conditions are not pooled in (pooling is what made prefetch and fetch show the same
//! samples when both were switched between two replies).
//!
//! ms/token grows with the context position (attention reads the whole KV cache), so arms run at
//! different positions differ even when the toggle does nothing. The correction has two steps:
//! 1. **matched positions** (caliper matching): a sample is used only if the other arm has a
//!    sample within [`CALIPER`] positions of it, so both arms cover the same positions. Arms that
//!    never ran at nearby positions are reported as such instead of compared;
//! 2. **a common-slope fit** for what is left: `ln(ms)` is regressed on position with one slope
//!    for both arms (the pooled within-arm least-squares slope), each sample is moved along it to
//!    a common position, and the arms' medians are compared there.
//!
//! Why both: a single straight line over the whole session misfits a curved ms(position) as soon
//! as the arms' position mixes differ (a manual toggle between replies, then A/B auto): on such a
//! synthetic stream with no effect it read 1.017× [1.011–1.023], a false positive; matching makes
//! the mixes alike. Matching alone is biased by the alternation itself: with blocks A A A A B B B
//! B … every A sits a few positions before its B, so a rising context makes A look faster; the
//! local slope removes that offset. The log scale makes a toggle's effect a constant shift
//! whatever the position dependence (scaling a token's time by r adds ln r), so one slope fits
//! both arms of a multiplicative effect. Medians, not means, keep the estimate robust to the
//! occasional slow token (page faults, a preempted thread).
//!
//! The ratio's 95% confidence interval is a percentile bootstrap ([`RESAMPLES`] stratified
//! resamples of each arm, slope refitted each time) with a fixed seed, so identical samples give
//! identical intervals (stable snapshots). Results are cached in [`AbBook`] and recomputed when
//! enough new samples arrived (every sample while few, then every 1/16 of the samples kept) or
//! when a caller flushes at a natural boundary (config change, end of a reply), which bounds the
//! cost: about 0.1 ms per token amortized with a full window (measured, release build).

use std::collections::VecDeque;

use super::event::EngineConfigInfo;
use crate::stats::{median, median_in_place, percentile_sorted};

/// Samples kept (oldest dropped first).
pub const WINDOW: usize = 2048;
/// Most recent matched samples per arm used in one comparison.
pub const ARM_CAP: usize = 256;
/// Samples each arm needs (at matching positions, under one condition) before a ratio is shown.
pub const MIN_PER_ARM: usize = 8;
/// A sample is used only if the other arm has one within this many context positions.
pub const CALIPER: u32 = 16;
/// Bootstrap resamples per comparison.
pub const RESAMPLES: usize = 1000;
/// Relative half-width of the 95% interval at which A/B auto stops.
pub const TIGHT: f64 = 0.02;
/// Tokens per block in A/B auto (A for N tokens, then B for N, …).
pub const AUTO_BLOCK: u32 = 8;
/// Blocks A/B auto runs at least before it may stop (two of each arm).
pub const AUTO_MIN_BLOCKS: u32 = 4;
const SEED: u64 = 0xab5e_ed00_c0ff_ee11;
/// At this many distinct settings, a new one first drops those no kept sample refers to (so
/// there are never more than `max(MAX_SETTINGS, WINDOW + 1)`).
const MAX_SETTINGS: usize = 256;

/// One engine toggle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Toggle {
    Prefetch,
    Fetch,
    Layout,
    Tier,
}

impl Toggle {
    /// Display order.
    pub const ALL: [Toggle; 4] = [
        Toggle::Prefetch,
        Toggle::Fetch,
        Toggle::Layout,
        Toggle::Tier,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Toggle::Prefetch => "prefetch",
            Toggle::Fetch => "fetch",
            Toggle::Layout => "layout",
            Toggle::Tier => "tier",
        }
    }

    /// Canonical arm order; a ratio is first arm / second arm.
    pub fn order(self) -> &'static [&'static str] {
        match self {
            Toggle::Prefetch => &["on", "off"],
            Toggle::Fetch => &["sync", "staged"],
            Toggle::Layout => &["cflow", "vflow", "rowmajor"],
            Toggle::Tier => &["mmap", "direct"],
        }
    }

    fn index(self) -> usize {
        Toggle::ALL.iter().position(|&t| t == self).unwrap_or(0)
    }

    fn rank(self, label: &str) -> usize {
        let o = self.order();
        o.iter().position(|&x| x == label).unwrap_or(o.len())
    }
}

/// The values of the four toggles a token ran with.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Setting {
    pub prefetch: bool,
    pub fetch: String,
    pub layout: String,
    pub tier: String,
}

impl Setting {
    pub fn of(c: &EngineConfigInfo) -> Self {
        Setting {
            prefetch: c.prefetch,
            fetch: c.fetch.clone(),
            layout: c.layout.clone(),
            tier: c.expert_tier.clone(),
        }
    }

    /// The arm label of toggle `t` in this setting ("on"/"off" for prefetch).
    pub fn arm(&self, t: Toggle) -> &str {
        match t {
            Toggle::Prefetch => {
                if self.prefetch {
                    "on"
                } else {
                    "off"
                }
            }
            Toggle::Fetch => &self.fetch,
            Toggle::Layout => &self.layout,
            Toggle::Tier => &self.tier,
        }
    }

    /// True when every toggle except `t` has the same value in both settings.
    pub fn same_except(&self, o: &Setting, t: Toggle) -> bool {
        Toggle::ALL
            .iter()
            .all(|&u| u == t || self.arm(u) == o.arm(u))
    }

    /// The other toggles' values, e.g. "fetch staged · layout cflow · tier direct".
    pub fn others(&self, t: Toggle) -> String {
        Toggle::ALL
            .iter()
            .filter(|&&u| u != t)
            .map(|&u| format!("{} {}", u.name(), self.arm(u)))
            .collect::<Vec<_>>()
            .join(" · ")
    }
}

/// One measured token: the setting it ran with (an index into the book's settings), its context
/// position and its time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    pub setting: u16,
    pub pos: u32,
    pub ms: f64,
}

/// A position-corrected comparison of two arms (see the module doc).
#[derive(Clone, Debug, PartialEq)]
pub struct Estimate {
    /// Median ms/token of each arm, corrected to `pos_ref`.
    pub median_a: f64,
    pub median_b: f64,
    /// median_a / median_b.
    pub ratio: f64,
    /// 95% bootstrap percentile interval of the ratio.
    pub ci: (f64, f64),
    pub n_a: usize,
    pub n_b: usize,
    /// Context position the medians are corrected to (median position of the samples used).
    pub pos_ref: u32,
    /// Fitted common slope: relative change of ms/token per 1000 positions.
    pub slope_per_kpos: f64,
    pub resamples: usize,
}

impl Estimate {
    /// True when the interval includes 1.0: no significant difference.
    pub fn includes_one(&self) -> bool {
        self.ci.0 <= 1.0 && 1.0 <= self.ci.1
    }

    /// Half-width of the interval relative to the ratio.
    pub fn half_width(&self) -> f64 {
        (self.ci.1 - self.ci.0) / 2.0 / self.ratio
    }
}

/// Scratch buffers of one fit.
#[derive(Default)]
struct Fit {
    xa: Vec<f64>,
    ya: Vec<f64>,
    xb: Vec<f64>,
    yb: Vec<f64>,
    r: Vec<f64>,
}

impl Fit {
    /// (slope, median residual of a, median residual of b) of ln(ms) = arm + slope·pos.
    fn run(&mut self) -> Option<(f64, f64, f64)> {
        fn moments(x: &[f64], y: &[f64]) -> (f64, f64) {
            let n = x.len() as f64;
            let mx = x.iter().sum::<f64>() / n;
            let my = y.iter().sum::<f64>() / n;
            x.iter().zip(y).fold((0.0, 0.0), |(sxy, sxx), (&xi, &yi)| {
                (sxy + (xi - mx) * (yi - my), sxx + (xi - mx) * (xi - mx))
            })
        }
        let (sxy_a, sxx_a) = moments(&self.xa, &self.ya);
        let (sxy_b, sxx_b) = moments(&self.xb, &self.yb);
        let sxx = sxx_a + sxx_b;
        let slope = if sxx > 0.0 {
            (sxy_a + sxy_b) / sxx
        } else {
            0.0
        };
        let mut med = |x: &[f64], y: &[f64]| {
            self.r.clear();
            self.r
                .extend(x.iter().zip(y).map(|(&xi, &yi)| yi - slope * xi));
            median_in_place(&mut self.r)
        };
        let ma = med(&self.xa, &self.ya)?;
        let mb = med(&self.xb, &self.yb)?;
        Some((slope, ma, mb))
    }
}

fn finite(v: &[(u32, f64)]) -> Vec<(f64, f64)> {
    v.iter()
        .filter(|(_, ms)| ms.is_finite() && *ms > 0.0)
        .map(|&(p, ms)| (p as f64, ms.ln()))
        .collect()
}

/// Compare arm `a` with arm `b`, each given as (context position, ms/token) samples: the
/// position-corrected ratio of medians with its 95% bootstrap interval from `resamples`
/// resamples seeded with `seed`. None when an arm has fewer than 2 usable samples.
pub fn estimate(
    a: &[(u32, f64)],
    b: &[(u32, f64)],
    resamples: usize,
    seed: u64,
) -> Option<Estimate> {
    let (a, b) = (finite(a), finite(b));
    if a.len() < 2 || b.len() < 2 {
        return None;
    }
    let mut fit = Fit::default();
    let fill = |dst_x: &mut Vec<f64>, dst_y: &mut Vec<f64>, src: &[(f64, f64)]| {
        dst_x.clear();
        dst_y.clear();
        for &(x, y) in src {
            dst_x.push(x);
            dst_y.push(y);
        }
    };
    fill(&mut fit.xa, &mut fit.ya, &a);
    fill(&mut fit.xb, &mut fit.yb, &b);
    let (slope, ma, mb) = fit.run()?;
    let pos_ref = median(a.iter().chain(&b).map(|&(x, _)| x))?.round();
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut logs = Vec::with_capacity(resamples);
    for _ in 0..resamples {
        fit.xa.clear();
        fit.ya.clear();
        fit.xb.clear();
        fit.yb.clear();
        for _ in 0..a.len() {
            let (x, y) = a[rng.usize(..a.len())];
            fit.xa.push(x);
            fit.ya.push(y);
        }
        for _ in 0..b.len() {
            let (x, y) = b[rng.usize(..b.len())];
            fit.xb.push(x);
            fit.yb.push(y);
        }
        if let Some((_, ra, rb)) = fit.run() {
            logs.push(ra - rb);
        }
    }
    logs.sort_by(f64::total_cmp);
    let point = (ma - mb).exp();
    let lo = percentile_sorted(&logs, 0.025).map_or(point, f64::exp);
    let hi = percentile_sorted(&logs, 0.975).map_or(point, f64::exp);
    Some(Estimate {
        median_a: (ma + slope * pos_ref).exp(),
        median_b: (mb + slope * pos_ref).exp(),
        ratio: point,
        ci: (lo.min(point), hi.max(point)),
        n_a: a.len(),
        n_b: b.len(),
        pos_ref: pos_ref as u32,
        slope_per_kpos: (slope * 1000.0).exp() - 1.0,
        resamples,
    })
}

/// The most recent [`ARM_CAP`] samples of `v` that have a sample of `other` within [`CALIPER`]
/// positions, oldest first.
fn matched(v: &[(u32, f64)], other: &[(u32, f64)]) -> Vec<(u32, f64)> {
    let mut pos: Vec<u32> = other.iter().map(|x| x.0).collect();
    pos.sort_unstable();
    let near = |p: u32| {
        let i = pos.partition_point(|&q| q < p.saturating_sub(CALIPER));
        pos.get(i).is_some_and(|&q| q <= p.saturating_add(CALIPER))
    };
    let mut out: Vec<(u32, f64)> = v
        .iter()
        .rev()
        .filter(|x| near(x.0))
        .take(ARM_CAP)
        .copied()
        .collect();
    out.reverse();
    out
}

/// One condition's arms for a comparison: (score = the smaller matched arm, condition, arm a,
/// arm b, a's matched samples, b's matched samples).
type Candidate = (
    usize,
    usize,
    String,
    String,
    Vec<(u32, f64)>,
    Vec<(u32, f64)>,
);

/// What can be said about one toggle.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// Fewer than two arms seen.
    OneArm,
    /// The arms never ran with all other toggles equal; `with` names the toggles that differed.
    Confounded {
        a: String,
        b: String,
        with: Vec<&'static str>,
    },
    /// Both arms ran under one condition, but not yet [`MIN_PER_ARM`] samples each at matching
    /// positions.
    TooFew {
        a: String,
        b: String,
        n_a: usize,
        n_b: usize,
    },
    /// A controlled comparison under the condition `others`.
    Compared {
        a: String,
        b: String,
        others: String,
        est: Estimate,
    },
}

/// One toggle's arms (every sample seen, per arm, in canonical order) and its verdict.
#[derive(Clone, Debug, PartialEq)]
pub struct ToggleView {
    pub toggle: Toggle,
    pub arms: Vec<(String, usize)>,
    pub verdict: Verdict,
}

impl ToggleView {
    fn empty(toggle: Toggle) -> Self {
        ToggleView {
            toggle,
            arms: Vec::new(),
            verdict: Verdict::OneArm,
        }
    }

    /// The controlled estimate, if there is one.
    pub fn estimate(&self) -> Option<&Estimate> {
        match &self.verdict {
            Verdict::Compared { est, .. } => Some(est),
            _ => None,
        }
    }
}

/// All samples of the session and the cached verdict per toggle.
#[derive(Clone, Debug, PartialEq)]
pub struct AbBook {
    settings: Vec<Setting>,
    samples: VecDeque<Sample>,
    /// Samples ever recorded, and the count at the last recomputation.
    pushed: u64,
    computed: u64,
    views: Vec<ToggleView>,
}

impl Default for AbBook {
    fn default() -> Self {
        AbBook {
            settings: Vec::new(),
            samples: VecDeque::new(),
            pushed: 0,
            computed: 0,
            views: Toggle::ALL.iter().map(|&t| ToggleView::empty(t)).collect(),
        }
    }
}

impl AbBook {
    /// Record one token's time, measured with `cfg` at context position `pos`.
    pub fn record(&mut self, cfg: &EngineConfigInfo, pos: u32, ms: f64) {
        if !(ms.is_finite() && ms > 0.0) {
            return;
        }
        let s = Setting::of(cfg);
        let idx = match self.settings.iter().position(|x| *x == s) {
            Some(i) => i,
            None => {
                if self.settings.len() >= MAX_SETTINGS {
                    self.compact_settings();
                }
                self.settings.push(s);
                self.settings.len() - 1
            }
        };
        if self.samples.len() == WINDOW {
            self.samples.pop_front();
        }
        self.samples.push_back(Sample {
            setting: idx as u16,
            pos,
            ms,
        });
        self.pushed += 1;
        let fresh = self.pushed - self.computed;
        if fresh as usize >= (self.samples.len() / 16).max(1) {
            self.recompute();
        }
    }

    /// Recompute now if any sample arrived since the last computation (call at natural
    /// boundaries: a config change, the end of a reply).
    pub fn flush(&mut self) {
        if self.pushed != self.computed {
            self.recompute();
        }
    }

    /// Samples currently kept, oldest first, with their settings.
    pub fn samples(&self) -> impl DoubleEndedIterator<Item = (&Setting, &Sample)> {
        self.samples
            .iter()
            .map(|s| (&self.settings[s.setting as usize], s))
    }

    /// Number of samples kept.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// Samples the cached verdicts are based on (≤ [`AbBook::len`] between recomputations).
    pub fn computed_over(&self) -> u64 {
        self.computed.min(self.pushed)
    }

    /// The verdicts in display order.
    pub fn views(&self) -> &[ToggleView] {
        &self.views
    }

    /// The verdict of one toggle.
    pub fn view(&self, t: Toggle) -> &ToggleView {
        &self.views[t.index()]
    }

    /// The controlled estimate of one toggle, if there is one.
    pub fn estimate(&self, t: Toggle) -> Option<&Estimate> {
        self.view(t).estimate()
    }

    fn compact_settings(&mut self) {
        let mut used = vec![false; self.settings.len()];
        for s in &self.samples {
            used[s.setting as usize] = true;
        }
        let mut remap = vec![0u16; self.settings.len()];
        let mut kept = Vec::new();
        for (i, s) in std::mem::take(&mut self.settings).into_iter().enumerate() {
            if used[i] {
                remap[i] = kept.len() as u16;
                kept.push(s);
            }
        }
        self.settings = kept;
        for s in &mut self.samples {
            s.setting = remap[s.setting as usize];
        }
    }

    fn recompute(&mut self) {
        self.computed = self.pushed;
        self.views = Toggle::ALL.iter().map(|&t| self.evaluate(t)).collect();
    }

    fn evaluate(&self, t: Toggle) -> ToggleView {
        // Pooled counts per arm, canonical order first.
        let mut arms: Vec<(String, usize)> = Vec::new();
        for (s, _) in self.samples() {
            let l = s.arm(t);
            match arms.iter_mut().find(|(a, _)| a == l) {
                Some((_, n)) => *n += 1,
                None => arms.push((l.to_string(), 1)),
            }
        }
        arms.sort_by_key(|(l, _)| t.rank(l));
        let mut view = ToggleView {
            toggle: t,
            arms,
            verdict: Verdict::OneArm,
        };
        if view.arms.len() < 2 {
            return view;
        }
        // The condition of each setting: the first setting equal to it in every other toggle.
        let cond: Vec<usize> = self
            .settings
            .iter()
            .map(|s| {
                self.settings
                    .iter()
                    .position(|o| o.same_except(s, t))
                    .unwrap_or(0)
            })
            .collect();
        let mut best: Option<Candidate> = None;
        let mut any_shared = false;
        let mut conds: Vec<usize> = cond.clone();
        conds.sort_unstable();
        conds.dedup();
        for &c in &conds {
            // Arms present under condition c, canonical order.
            let mut labels: Vec<&str> = Vec::new();
            for (s, smp) in self.samples() {
                if cond[smp.setting as usize] == c && !labels.contains(&s.arm(t)) {
                    labels.push(s.arm(t));
                }
            }
            if labels.len() < 2 {
                continue;
            }
            any_shared = true;
            labels.sort_by_key(|l| t.rank(l));
            let (la, lb) = (labels[0], labels[1]);
            let take = |label: &str| -> Vec<(u32, f64)> {
                self.samples()
                    .filter(|(s, smp)| cond[smp.setting as usize] == c && s.arm(t) == label)
                    .map(|(_, smp)| (smp.pos, smp.ms))
                    .collect()
            };
            let (a_all, b_all) = (take(la), take(lb));
            let (a, b) = (matched(&a_all, &b_all), matched(&b_all, &a_all));
            let score = a.len().min(b.len());
            if best.as_ref().is_none_or(|bst| score > bst.0) {
                best = Some((score, c, la.to_string(), lb.to_string(), a, b));
            }
        }
        view.verdict = match best {
            None if !any_shared => {
                let (la, lb) = (view.arms[0].0.clone(), view.arms[1].0.clone());
                let with = Toggle::ALL
                    .iter()
                    .filter(|&&u| u != t)
                    .filter(|&&u| {
                        let vals = |l: &str| -> Vec<String> {
                            self.samples()
                                .filter(|(s, _)| s.arm(t) == l)
                                .map(|(s, _)| s.arm(u).to_string())
                                .collect()
                        };
                        let (va, vb) = (vals(&la), vals(&lb));
                        !va.iter().any(|x| vb.contains(x))
                    })
                    .map(|&u| u.name())
                    .collect();
                Verdict::Confounded { a: la, b: lb, with }
            }
            None => Verdict::OneArm,
            Some((score, c, a_label, b_label, a, b)) => {
                if score < MIN_PER_ARM {
                    Verdict::TooFew {
                        a: a_label,
                        b: b_label,
                        n_a: a.len(),
                        n_b: b.len(),
                    }
                } else {
                    let seed = SEED ^ (t.index() as u64);
                    match estimate(&a, &b, RESAMPLES, seed) {
                        Some(est) => Verdict::Compared {
                            a: a_label,
                            b: b_label,
                            others: self.settings[c].others(t),
                            est,
                        },
                        None => Verdict::TooFew {
                            a: a_label,
                            b: b_label,
                            n_a: a.len(),
                            n_b: b.len(),
                        },
                    }
                }
            }
        };
        view
    }
}

/// What A/B auto asks for after a token.
#[derive(Clone, Debug, PartialEq)]
pub enum AutoStep {
    /// Keep running the current arm.
    Continue,
    /// Switch the toggle to this arm.
    Switch(String),
    /// Stop, with the reason.
    Done(String),
}

/// The A/B auto schedule: run arm A for [`AUTO_BLOCK`] tokens, then B, then A… (the way
/// hyperfine and criterion interleave), until the toggle's interval is tight.
#[derive(Clone, Debug, PartialEq)]
pub struct AutoAb {
    pub toggle: Toggle,
    /// The two arms, the first one being the arm in force when auto started.
    pub arms: [String; 2],
    pub every: u32,
    /// Index into `arms` of the arm being run (or requested).
    pub target: usize,
    /// Tokens counted in the current block.
    pub in_block: u32,
    /// Blocks completed.
    pub blocks: u32,
    /// A switch was requested and has not shown up in the config yet.
    pending: bool,
}

impl AutoAb {
    pub fn new(toggle: Toggle, current: &str, other: &str, every: u32) -> Self {
        AutoAb {
            toggle,
            arms: [current.to_string(), other.to_string()],
            every: every.max(1),
            target: 0,
            in_block: 0,
            blocks: 0,
            pending: false,
        }
    }

    /// Feed one measured token (its setting) and the toggle's current interval half-width.
    pub fn on_token(&mut self, s: &Setting, half_width: Option<f64>) -> AutoStep {
        let arm = s.arm(self.toggle);
        let Some(i) = self.arms.iter().position(|a| a == arm) else {
            return AutoStep::Done(format!(
                "A/B auto stopped: {} is now {arm}",
                self.toggle.name()
            ));
        };
        if i != self.target {
            if self.pending {
                // The requested switch takes effect at a later token: not counted.
                return AutoStep::Continue;
            }
            // Switched by hand: follow it and start a new block.
            self.target = i;
            self.in_block = 0;
        }
        self.pending = false;
        self.in_block += 1;
        if self.in_block < self.every {
            return AutoStep::Continue;
        }
        self.blocks += 1;
        self.in_block = 0;
        if self.blocks >= AUTO_MIN_BLOCKS {
            if let Some(h) = half_width.filter(|h| *h < TIGHT) {
                return AutoStep::Done(format!(
                    "A/B auto done: {} interval ±{:.1}% after {} blocks",
                    self.toggle.name(),
                    100.0 * h,
                    self.blocks
                ));
            }
        }
        self.target ^= 1;
        self.pending = true;
        AutoStep::Switch(self.arms[self.target].clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(prefetch: bool, fetch: &str) -> EngineConfigInfo {
        EngineConfigInfo {
            threads: 2,
            isa: "AVX2".into(),
            prefetch,
            weights: "mmap".into(),
            repacked: false,
            readers: 1,
            fetch: fetch.into(),
            expert_tier: "direct".into(),
            layout: "cflow".into(),
            layouts_available: vec!["cflow".into()],
            notes: vec![],
        }
    }

    /// Multiplicative noise of about ±3%.
    fn noise(rng: &mut fastrand::Rng) -> f64 {
        1.0 + (rng.f64() - 0.5) * 0.06
    }

    #[test]
    fn null_effect_with_rising_context_includes_one() {
        // Alternating blocks of 8 tokens while ms/token rises steeply with position.
        let mut rng = fastrand::Rng::with_seed(3);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for pos in 0..400u32 {
            let ms = (8.0 + 0.02 * pos as f64) * noise(&mut rng);
            if (pos / 8) % 2 == 0 { &mut a } else { &mut b }.push((pos, ms));
        }
        let e = estimate(&a, &b, RESAMPLES, 1).unwrap();
        assert!(e.includes_one(), "{e:?}");
        assert!((e.ratio - 1.0).abs() < 0.01, "{e:?}");
        assert!(
            e.slope_per_kpos > 1.0,
            "the context effect is visible: {e:?}"
        );
    }

    #[test]
    fn twenty_percent_effect_is_found() {
        let mut rng = fastrand::Rng::with_seed(5);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for pos in 0..400u32 {
            let base = (8.0 + 0.02 * pos as f64) * noise(&mut rng);
            if (pos / 8) % 2 == 0 {
                a.push((pos, 1.2 * base));
            } else {
                b.push((pos, base));
            }
        }
        let e = estimate(&a, &b, RESAMPLES, 1).unwrap();
        assert!(e.ci.0 <= 1.2 && 1.2 <= e.ci.1, "{e:?}");
        assert!((e.ratio - 1.2).abs() < 0.01, "{e:?}");
        assert!(!e.includes_one());
        assert!(e.half_width() < 0.02, "{e:?}");
    }

    #[test]
    fn estimate_is_deterministic_and_needs_two_samples() {
        let a = [(1, 2.0), (2, 2.1), (3, 2.2)];
        let b = [(1, 1.0), (2, 1.1), (4, 1.05)];
        assert_eq!(estimate(&a, &b, 200, 9), estimate(&a, &b, 200, 9));
        assert!(estimate(&a[..1], &b, 200, 9).is_none());
        assert!(estimate(&[(1, f64::NAN), (2, -1.0)], &b, 200, 9).is_none());
    }

    #[test]
    fn arms_are_compared_only_under_equal_other_toggles() {
        // Prefetch and fetch switched together between two replies: neither can be compared.
        let mut book = AbBook::default();
        for pos in 0..40 {
            book.record(&cfg(false, "staged"), pos, 8.0);
        }
        for pos in 40..80 {
            book.record(&cfg(true, "sync"), pos, 14.0);
        }
        book.flush();
        for t in [Toggle::Prefetch, Toggle::Fetch] {
            match &book.view(t).verdict {
                Verdict::Confounded { with, .. } => {
                    let other = if t == Toggle::Prefetch {
                        "fetch"
                    } else {
                        "prefetch"
                    };
                    assert_eq!(with, &vec![other]);
                }
                v => panic!("{t:?}: {v:?}"),
            }
        }
        assert_eq!(book.view(Toggle::Layout).verdict, Verdict::OneArm);
        // Now fetch alternates under prefetch on: fetch is comparable, prefetch still is not.
        for pos in 80..160u32 {
            let f = if (pos / 8) % 2 == 0 { "sync" } else { "staged" };
            book.record(&cfg(true, f), pos, if f == "sync" { 14.0 } else { 10.0 });
        }
        book.flush();
        let e = book.estimate(Toggle::Fetch).unwrap();
        assert!((e.ratio - 1.4).abs() < 1e-9, "{e:?}");
        match &book.view(Toggle::Fetch).verdict {
            Verdict::Compared { others, .. } => assert!(others.starts_with("prefetch on")),
            v => panic!("{v:?}"),
        }
        assert!(matches!(
            book.view(Toggle::Prefetch).verdict,
            Verdict::TooFew { .. } | Verdict::Confounded { .. }
        ));
    }

    #[test]
    fn arms_at_distant_positions_are_not_compared() {
        let mut book = AbBook::default();
        for pos in 0..40 {
            book.record(&cfg(false, "staged"), pos, 8.0);
        }
        for pos in 200..240 {
            book.record(&cfg(false, "sync"), pos, 9.0);
        }
        book.flush();
        assert_eq!(
            book.view(Toggle::Fetch).verdict,
            Verdict::TooFew {
                a: "sync".into(),
                b: "staged".into(),
                n_a: 0,
                n_b: 0
            }
        );
    }

    #[test]
    fn window_and_settings_are_bounded() {
        let mut book = AbBook::default();
        let mut c = cfg(false, "staged");
        // A hostile trace: a new layout string on every token, then two values only.
        for i in 0..600u32 {
            c.layout = format!("l{i}");
            book.record(&c, i, 1.0);
        }
        assert_eq!(book.settings.len(), 600);
        for i in 0..WINDOW as u32 {
            c.layout = format!("y{}", i % 2);
            book.record(&c, i, 1.0 + (i % 2) as f64);
        }
        assert_eq!(book.len(), WINDOW);
        // The next new setting drops every setting no kept sample refers to.
        c.layout = "z".into();
        book.record(&c, 7, 1.0);
        assert_eq!(book.settings.len(), 3);
        for (s, x) in book.samples() {
            assert!(
                s.layout == "z" || s.layout == format!("y{}", x.pos % 2),
                "{s:?} {x:?}"
            );
        }
        book.record(&c, 0, f64::NAN);
        assert_eq!(book.len(), WINDOW);
    }

    #[test]
    fn auto_alternates_every_block_and_waits_for_switches() {
        let mut auto = AutoAb::new(Toggle::Prefetch, "off", "on", 3);
        let off = Setting::of(&cfg(false, "staged"));
        let on = Setting::of(&cfg(true, "staged"));
        let steps: Vec<AutoStep> = (0..3).map(|_| auto.on_token(&off, None)).collect();
        assert_eq!(
            steps,
            vec![
                AutoStep::Continue,
                AutoStep::Continue,
                AutoStep::Switch("on".into())
            ]
        );
        // The switch shows up one token late: that token is not counted.
        assert_eq!(auto.on_token(&off, None), AutoStep::Continue);
        assert_eq!(auto.on_token(&on, None), AutoStep::Continue);
        assert_eq!(auto.on_token(&on, None), AutoStep::Continue);
        assert_eq!(auto.on_token(&on, None), AutoStep::Switch("off".into()));
        // Tight, but only after AUTO_MIN_BLOCKS blocks.
        for _ in 0..2 {
            auto.on_token(&off, Some(0.01));
        }
        assert_eq!(
            auto.on_token(&off, Some(0.01)),
            AutoStep::Switch("on".into())
        );
        auto.on_token(&on, Some(0.05));
        auto.on_token(&on, Some(0.05));
        assert!(matches!(auto.on_token(&on, Some(0.01)), AutoStep::Done(_)));
        let mut other = AutoAb::new(Toggle::Fetch, "staged", "sync", 2);
        let s = Setting::of(&cfg(false, "weird"));
        assert!(matches!(other.on_token(&s, None), AutoStep::Done(_)));
    }
}
