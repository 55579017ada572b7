//! Controlled A/B statistics of ms/token for the engine toggles (prefetch, fetch, layout, expert
//! tier, schedule), and the A/B auto schedule that interleaves a toggle's arms.
//!
//! **The key is what the engine ran.** Every measured token is kept as a [`Sample`] tagged with
//! the full [`Setting`] it ran with, built from the engine's own per-token report
//! ([`RunInfo`] in `TokenStats::ran`), not from what the UI asked: prefetch, fetch, layout,
//! expert tier, schedule *as run* (also `auto`'s own switching while it measures), threads,
//! weights mode, activation and KV numerics, and the context bucket ([`ctx_bucket`]). Requests the
//! engine did not carry out show as what happened instead: the rowmajor layout sends no prefetch
//! hints and reads the experts from its in-memory copy, so on the direct tier its tokens carry
//! `tier mmap`, not `direct`. Traces recorded before the report existed fall back to the
//! configuration (`Setting::asked`), with the schedule and numerics unknown.
//!
//! A toggle's two arms are compared only when **every other setting is equal**: each arm is one
//! exact setting, and the two differ in the toggle alone (for the tier, also in the fetch mode,
//! which only means something on the direct tier). When no such pair ran, the verdict names the
//! settings that changed with the toggle ([`Verdict::Confounded`]) instead of a ratio.
//!
//! **Blocks, not tokens, are the unit.** Neighbouring tokens share caches, page-cache state and
//! the machine's load, so their times are not independent samples: a per-token interval is far
//! too narrow (the issue-43 session read 0.78× [0.73–0.86] and 1.37× [1.33–1.42] for one toggle
//! in one run). A *run* is a stretch of consecutive context positions under one setting; its
//! first [`WARMUP`] token is dropped (it pays for the switch: a thread started, a reader opened),
//! and the rest is cut into blocks of at least [`BLOCK`] tokens (a short tail joins the last
//! block). A block's value is the mean of ln(ms) over its tokens (a batch mean), at the mean
//! position. A/B auto's alternation gives one block per arm turn.
//!
//! The comparison is an analysis of covariance over blocks: ln(ms) = arm + slope·position, one
//! slope for both arms (attention reads the whole KV cache, so ms/token grows with the context:
//! arms run at different positions differ even when the toggle does nothing). The ratio is
//! exp(difference of the adjusted arm means), its 95% interval Student's t with the residual
//! degrees of freedom (n_a + n_b − 3), so few blocks give a wide interval. A block is used only
//! if the other arm has a block within [`CALIPER`] positions (arms that never ran near each
//! other are reported as too few rather than extrapolated), and only the most recent
//! [`ARM_CAP`] blocks per arm. An interval that includes 1.0 is "no significant difference".
//!
//! Verdicts are cached in [`AbBook`] and recomputed when a sample arrives or on `flush`; without
//! resampling this is cheap (a pass over at most [`WINDOW`] samples).

use std::collections::VecDeque;

use super::event::{Command, EngineConfigInfo, RunInfo, TokenStats};
use crate::toggles::{ExpertTier, FetchMode, Layout, Schedule};

/// Samples kept (oldest dropped first).
pub const WINDOW: usize = 2048;
/// Tokens per block (at least; the tail of a run joins its last block).
pub const BLOCK: usize = 8;
/// Tokens dropped at the start of every run (the switch's own cost).
pub const WARMUP: usize = 1;
/// Blocks each arm needs (at matching positions, all other settings equal) before a ratio is
/// shown.
pub const MIN_BLOCKS: usize = 3;
/// Most recent matched blocks per arm used in one comparison.
pub const ARM_CAP: usize = 64;
/// A block is used only if the other arm has a block whose mean position is this close.
pub const CALIPER: f64 = 32.0;
/// Relative half-width of the 95% interval at which A/B auto stops.
pub const TIGHT: f64 = 0.02;
/// Tokens per arm turn in A/B auto: the warm-up token and one block.
pub const AUTO_BLOCK: u32 = (BLOCK + WARMUP) as u32;
/// Arm turns A/B auto runs at least before it may stop ([`MIN_BLOCKS`] of each arm).
pub const AUTO_MIN_BLOCKS: u32 = 2 * MIN_BLOCKS as u32;
/// Tokens A/B auto waits for a requested switch to show in the engine's report (the UI sees
/// tokens in batches, one per frame: at 30 frames/s and 6 ms/token a switch shows ~5 tokens
/// late).
pub const AUTO_PENDING_MAX: u32 = 64;
/// At this many distinct settings, a new one first drops those no kept sample refers to (so
/// there are never more than `max(MAX_SETTINGS, WINDOW + 1)`).
const MAX_SETTINGS: usize = 256;

/// The context bucket of a position: 0 for 0–255, then one per power of two (256–511 → 1,
/// 512–1023 → 2, …). Samples are compared only within one bucket.
pub fn ctx_bucket(pos: u32) -> u8 {
    if pos < 256 {
        0
    } else {
        (31 - pos.leading_zeros() - 7) as u8
    }
}

/// The positions of a context bucket, as text ("0–255", "256–511", …).
pub fn bucket_label(b: u8) -> String {
    if b == 0 {
        "0–255".into()
    } else {
        let lo = 1u64 << (b as u32 + 7);
        format!("{lo}–{}", 2 * lo - 1)
    }
}

/// One engine toggle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Toggle {
    Prefetch,
    Fetch,
    Layout,
    Tier,
    Schedule,
}

impl Toggle {
    /// Display order.
    pub const ALL: [Toggle; 5] = [
        Toggle::Prefetch,
        Toggle::Fetch,
        Toggle::Layout,
        Toggle::Tier,
        Toggle::Schedule,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Toggle::Prefetch => "prefetch",
            Toggle::Fetch => "fetch",
            Toggle::Layout => "layout",
            Toggle::Tier => "tier",
            Toggle::Schedule => "schedule",
        }
    }

    /// The key that switches it.
    pub fn key(self) -> char {
        match self {
            Toggle::Prefetch => 'p',
            Toggle::Fetch => 's',
            Toggle::Layout => 'l',
            Toggle::Tier => 't',
            Toggle::Schedule => 'v',
        }
    }

    /// Canonical arm order; a ratio is first arm / second arm.
    pub fn order(self) -> &'static [Arm] {
        match self {
            Toggle::Prefetch => &[Arm::Prefetch(true), Arm::Prefetch(false)],
            Toggle::Fetch => &[Arm::Fetch(FetchMode::Sync), Arm::Fetch(FetchMode::Staged)],
            Toggle::Layout => &[
                Arm::Layout(Layout::Cflow),
                Arm::Layout(Layout::Vflow),
                Arm::Layout(Layout::RowMajor),
            ],
            Toggle::Tier => &[Arm::Tier(ExpertTier::Mmap), Arm::Tier(ExpertTier::Direct)],
            Toggle::Schedule => &[
                Arm::Schedule(Schedule::Sequential),
                Arm::Schedule(Schedule::Vertical),
            ],
        }
    }

    fn index(self) -> usize {
        Toggle::ALL.iter().position(|&t| t == self).unwrap_or(0)
    }

    /// Position of `arm` in [`Toggle::order`] (after every listed arm when not listed or None).
    fn rank(self, arm: Option<Arm>) -> usize {
        let o = self.order();
        o.iter().position(|&x| Some(x) == arm).unwrap_or(o.len())
    }
}

/// One arm of a toggle: the value the toggle takes, in the engine's own types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Arm {
    Prefetch(bool),
    Fetch(FetchMode),
    Layout(Layout),
    Tier(ExpertTier),
    Schedule(Schedule),
}

impl Arm {
    /// The toggle this is an arm of.
    pub fn toggle(self) -> Toggle {
        match self {
            Arm::Prefetch(_) => Toggle::Prefetch,
            Arm::Fetch(_) => Toggle::Fetch,
            Arm::Layout(_) => Toggle::Layout,
            Arm::Tier(_) => Toggle::Tier,
            Arm::Schedule(_) => Toggle::Schedule,
        }
    }

    /// Its label: "on"/"off" for prefetch, else the value's name.
    pub fn name(self) -> &'static str {
        match self {
            Arm::Prefetch(true) => "on",
            Arm::Prefetch(false) => "off",
            Arm::Fetch(f) => f.name(),
            Arm::Layout(l) => l.name(),
            Arm::Tier(t) => t.name(),
            Arm::Schedule(s) => s.name(),
        }
    }

    /// The command that switches the engine to this arm.
    pub fn command(self) -> Command {
        match self {
            Arm::Prefetch(on) => Command::SetPrefetch(on),
            Arm::Fetch(f) => Command::SetFetch(f),
            Arm::Layout(l) => Command::SetLayout(l),
            Arm::Tier(t) => Command::SetExpertTier(t),
            Arm::Schedule(s) => Command::SetSchedule(s),
        }
    }
}

impl std::fmt::Display for Arm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Every setting a token ran with that changes its time: the comparison key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Setting {
    pub prefetch: bool,
    /// None when the fetch mode had no effect (experts not read from disk).
    pub fetch: Option<FetchMode>,
    pub layout: Layout,
    /// Where the experts came from: direct (disk), mmap (memory), None (no experts).
    pub tier: Option<ExpertTier>,
    /// As run; None when unknown (traces without the engine's report).
    pub schedule: Option<Schedule>,
    pub threads: u32,
    pub weights: String,
    pub act: String,
    pub kv: String,
    /// The direct tier's expert cache capacity in MiB (0: off, or unknown in older traces).
    pub expert_cache_mib: u64,
    /// [`ctx_bucket`] of the token's position.
    pub ctx: u8,
}

/// The settings other than the toggles, in the order they are named.
const HIDDEN: [&str; 6] = ["threads", "weights", "act", "kv", "expert cache", "ctx"];

impl Setting {
    /// The key of a token from the engine's report.
    pub fn ran(r: &RunInfo, pos: u32) -> Self {
        Setting {
            prefetch: r.prefetch,
            fetch: r.fetch,
            layout: r.layout,
            tier: r.tier,
            schedule: Some(r.schedule),
            threads: r.threads,
            weights: r.weights.clone(),
            act: r.act.clone(),
            kv: r.kv.clone(),
            expert_cache_mib: r.expert_cache_mib,
            ctx: ctx_bucket(pos),
        }
    }

    /// The key from the configuration as asked (traces recorded before the engine reported what
    /// it ran): schedule and numerics unknown.
    pub fn asked(c: &EngineConfigInfo, pos: u32) -> Self {
        Setting {
            prefetch: c.prefetch,
            fetch: Some(c.fetch),
            layout: c.layout,
            tier: Some(c.expert_tier),
            schedule: None,
            threads: c.threads,
            weights: if c.repacked {
                format!("{} repacked", c.weights)
            } else {
                c.weights.clone()
            },
            act: String::new(),
            kv: String::new(),
            expert_cache_mib: 0,
            ctx: ctx_bucket(pos),
        }
    }

    /// The key of a measured token: its report, else the configuration in force.
    pub fn of_stats(s: &TokenStats, cfg: Option<&EngineConfigInfo>) -> Option<Self> {
        match (&s.ran, cfg) {
            (Some(r), _) => Some(Setting::ran(r, s.pos)),
            (None, Some(c)) => Some(Setting::asked(c, s.pos)),
            (None, None) => None,
        }
    }

    /// The arm of toggle `t` in this setting (None: not in effect, or unknown).
    pub fn arm(&self, t: Toggle) -> Option<Arm> {
        match t {
            Toggle::Prefetch => Some(Arm::Prefetch(self.prefetch)),
            Toggle::Fetch => self.fetch.map(Arm::Fetch),
            Toggle::Layout => Some(Arm::Layout(self.layout)),
            Toggle::Tier => self.tier.map(Arm::Tier),
            Toggle::Schedule => self.schedule.map(Arm::Schedule),
        }
    }

    /// The label of [`Setting::arm`] ("on"/"off" for prefetch, "" when there is none).
    pub fn label(&self, t: Toggle) -> &'static str {
        self.arm(t).map_or("", Arm::name)
    }

    fn hidden(&self, name: &str) -> String {
        match name {
            "threads" => self.threads.to_string(),
            "weights" => self.weights.clone(),
            "act" => self.act.clone(),
            "kv" => self.kv.clone(),
            "expert cache" => format!("{} MiB", self.expert_cache_mib),
            _ => self.ctx.to_string(),
        }
    }

    /// The settings other than `t` in which `o` differs from this one. For the tier, the fetch
    /// mode is not compared: it means nothing on the mmap tier.
    pub fn differences(&self, o: &Setting, t: Toggle) -> Vec<&'static str> {
        let mut d: Vec<&'static str> = Toggle::ALL
            .iter()
            .filter(|&&u| u != t && !(t == Toggle::Tier && u == Toggle::Fetch))
            .filter(|&&u| self.arm(u) != o.arm(u))
            .map(|u| u.name())
            .collect();
        d.extend(
            HIDDEN
                .iter()
                .filter(|h| self.hidden(h) != o.hidden(h))
                .copied(),
        );
        d
    }

    /// True when every setting except `t` is the same in both.
    pub fn same_except(&self, o: &Setting, t: Toggle) -> bool {
        self.differences(o, t).is_empty()
    }

    /// The other settings' values, e.g. "prefetch off · fetch staged · tier direct · schedule
    /// sequential · 2 thr · mmap · q8/f16 · ctx 0–255" (unknown ones left out).
    pub fn others(&self, t: Toggle) -> String {
        let mut v: Vec<String> = Toggle::ALL
            .iter()
            .filter(|&&u| u != t && !(t == Toggle::Tier && u == Toggle::Fetch))
            .filter(|&&u| self.arm(u).is_some())
            .map(|&u| format!("{} {}", u.name(), self.label(u)))
            .collect();
        v.push(format!("{} thr", self.threads));
        if !self.weights.is_empty() {
            v.push(self.weights.clone());
        }
        if !self.act.is_empty() {
            v.push(format!("{}/{}", self.act, self.kv));
        }
        v.push(format!("ctx {}", bucket_label(self.ctx)));
        v.join(" · ")
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

/// One block: a batch of at least [`BLOCK`] consecutive tokens of one run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockMean {
    /// Mean context position of its tokens.
    pub pos: f64,
    /// Mean of ln(ms/token) over its tokens.
    pub ln_ms: f64,
    pub tokens: u32,
}

/// The blocks of one run of samples (consecutive positions, one setting), oldest first: the
/// first [`WARMUP`] tokens dropped, the rest cut into blocks of [`BLOCK`] tokens, a shorter tail
/// joining the last block.
pub fn run_blocks(run: &[(u32, f64)]) -> Vec<BlockMean> {
    let body: Vec<(u32, f64)> = run
        .iter()
        .skip(WARMUP)
        .filter(|(_, ms)| ms.is_finite() && *ms > 0.0)
        .copied()
        .collect();
    let nb = body.len() / BLOCK;
    (0..nb)
        .map(|k| {
            let end = if k + 1 == nb {
                body.len()
            } else {
                (k + 1) * BLOCK
            };
            let chunk = &body[k * BLOCK..end];
            let n = chunk.len() as f64;
            BlockMean {
                pos: chunk.iter().map(|x| x.0 as f64).sum::<f64>() / n,
                ln_ms: chunk.iter().map(|x| x.1.ln()).sum::<f64>() / n,
                tokens: chunk.len() as u32,
            }
        })
        .collect()
}

/// A position-corrected comparison of two arms over blocks (see the module doc).
#[derive(Clone, Debug, PartialEq)]
pub struct Estimate {
    /// Geometric-mean ms/token of each arm, corrected to `pos_ref`.
    pub ms_a: f64,
    pub ms_b: f64,
    /// ms_a / ms_b.
    pub ratio: f64,
    /// 95% confidence interval of the ratio (Student's t over blocks).
    pub ci: (f64, f64),
    /// Blocks per arm.
    pub n_a: usize,
    pub n_b: usize,
    /// Tokens in those blocks.
    pub tokens_a: usize,
    pub tokens_b: usize,
    /// Residual degrees of freedom of the fit.
    pub df: usize,
    /// Context position the arm means are corrected to (mean position of the blocks used).
    pub pos_ref: u32,
    /// Fitted common slope: relative change of ms/token per 1000 positions.
    pub slope_per_kpos: f64,
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

/// The 0.975 quantile of Student's t with `df` degrees of freedom (table to 30, then an
/// approximation good to 0.002).
pub fn t975(df: usize) -> f64 {
    const T: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042,
    ];
    match df {
        0 => f64::INFINITY,
        1..=30 => T[df - 1],
        _ => 1.96 + 2.4 / df as f64,
    }
}

/// Compare arm `a` with arm `b`, given as blocks: ln(ms) = arm + slope·pos (common slope), the
/// ratio of the position-corrected arm means with its 95% t interval. None when an arm has
/// fewer than 2 blocks or no degree of freedom is left.
pub fn estimate(a: &[BlockMean], b: &[BlockMean]) -> Option<Estimate> {
    let ok = |v: &[BlockMean]| -> Vec<BlockMean> {
        v.iter()
            .filter(|x| x.ln_ms.is_finite() && x.pos.is_finite())
            .copied()
            .collect()
    };
    let (a, b) = (ok(a), ok(b));
    if a.len() < 2 || b.len() < 2 {
        return None;
    }
    let mean = |v: &[BlockMean], f: fn(&BlockMean) -> f64| -> f64 {
        v.iter().map(f).sum::<f64>() / v.len() as f64
    };
    let (xa, ya) = (mean(&a, |x| x.pos), mean(&a, |x| x.ln_ms));
    let (xb, yb) = (mean(&b, |x| x.pos), mean(&b, |x| x.ln_ms));
    let moments = |v: &[BlockMean], mx: f64, my: f64| -> (f64, f64) {
        v.iter().fold((0.0, 0.0), |(sxy, sxx), p| {
            (
                sxy + (p.pos - mx) * (p.ln_ms - my),
                sxx + (p.pos - mx) * (p.pos - mx),
            )
        })
    };
    let (sxy_a, sxx_a) = moments(&a, xa, ya);
    let (sxy_b, sxx_b) = moments(&b, xb, yb);
    let sxx = sxx_a + sxx_b;
    let n = a.len() + b.len();
    // The slope is fitted only when the arms' blocks spread over positions.
    let fit_slope = sxx > 1e-9 && n > 3;
    let slope = if fit_slope {
        (sxy_a + sxy_b) / sxx
    } else {
        0.0
    };
    let params = if fit_slope { 3 } else { 2 };
    let df = n - params;
    if df == 0 {
        return None;
    }
    let rss = |v: &[BlockMean], mx: f64, my: f64| -> f64 {
        v.iter()
            .map(|p| {
                let r = p.ln_ms - my - slope * (p.pos - mx);
                r * r
            })
            .sum::<f64>()
    };
    let sigma2 = (rss(&a, xa, ya) + rss(&b, xb, yb)) / df as f64;
    let diff = (ya - yb) - slope * (xa - xb);
    let mut var = sigma2 * (1.0 / a.len() as f64 + 1.0 / b.len() as f64);
    if fit_slope {
        var += sigma2 * (xa - xb) * (xa - xb) / sxx;
    }
    let half = t975(df) * var.max(0.0).sqrt();
    let pos_ref = (xa * a.len() as f64 + xb * b.len() as f64) / n as f64;
    let tokens = |v: &[BlockMean]| v.iter().map(|x| x.tokens as usize).sum();
    Some(Estimate {
        ms_a: (ya + slope * (pos_ref - xa)).exp(),
        ms_b: (yb + slope * (pos_ref - xb)).exp(),
        ratio: diff.exp(),
        ci: ((diff - half).exp(), (diff + half).exp()),
        n_a: a.len(),
        n_b: b.len(),
        tokens_a: tokens(&a),
        tokens_b: tokens(&b),
        df,
        pos_ref: pos_ref.round().max(0.0) as u32,
        slope_per_kpos: (slope * 1000.0).exp() - 1.0,
    })
}

/// The most recent [`ARM_CAP`] blocks of `v` that have a block of `other` within [`CALIPER`]
/// positions, oldest first.
fn matched(v: &[BlockMean], other: &[BlockMean]) -> Vec<BlockMean> {
    let mut out: Vec<BlockMean> = v
        .iter()
        .rev()
        .filter(|x| other.iter().any(|o| (o.pos - x.pos).abs() <= CALIPER))
        .take(ARM_CAP)
        .copied()
        .collect();
    out.reverse();
    out
}

/// A pair of settings for a comparison: (score = the smaller matched arm, setting a, setting
/// b, a's matched blocks, b's matched blocks).
type Candidate = (usize, u16, u16, Vec<BlockMean>, Vec<BlockMean>);

/// What can be said about one toggle.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// Fewer than two arms seen.
    OneArm,
    /// The arms never ran with every other setting equal; `with` names the settings that
    /// changed with the toggle (in the closest pair of settings).
    Confounded {
        a: String,
        b: String,
        with: Vec<&'static str>,
    },
    /// Both arms ran with all other settings equal, but not yet [`MIN_BLOCKS`] blocks each at
    /// matching positions.
    TooFew {
        a: String,
        b: String,
        n_a: usize,
        n_b: usize,
    },
    /// A controlled comparison under the setting `others`.
    Compared {
        a: String,
        b: String,
        others: String,
        est: Estimate,
    },
}

/// One toggle's arms (tokens seen per arm, in canonical order) and its verdict.
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

/// Why a toggle's arms are not an A/B, in words: `with` are the settings that changed with it
/// ([`Verdict::Confounded`]). Side effects the engine is known to have are named as such.
pub fn confound_reason(t: Toggle, with: &[&str], long: bool) -> String {
    let has = |n: &str| with.contains(&n);
    if t == Toggle::Layout && has("tier") {
        return if long {
            "not an A/B: rowmajor reads the experts from memory, cflow from disk (tier direct) — t → mmap for a layout A/B".into()
        } else {
            "not an A/B: experts memory vs disk".into()
        };
    }
    if t == Toggle::Layout && has("prefetch") {
        return if long {
            "not an A/B: rowmajor sends no prefetch hints — p → off for a layout A/B".into()
        } else {
            "not an A/B: prefetch off under rowmajor".into()
        };
    }
    let w = if with.is_empty() {
        "other settings".to_string()
    } else {
        with.join("+")
    };
    if long {
        format!("not comparable: {w} changed with it")
    } else {
        format!("confounded ({w})")
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
    /// Record one token's time, measured with setting `s` at context position `pos`.
    pub fn record(&mut self, s: &Setting, pos: u32, ms: f64) {
        if !(ms.is_finite() && ms > 0.0) {
            return;
        }
        let idx = match self.settings.iter().position(|x| x == s) {
            Some(i) => i,
            None => {
                if self.settings.len() >= MAX_SETTINGS {
                    self.compact_settings();
                }
                self.settings.push(s.clone());
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

    /// The blocks of the kept samples, oldest first, with the index of their setting.
    pub fn blocks(&self) -> Vec<(u16, BlockMean)> {
        let mut out = Vec::new();
        let mut run: Vec<(u32, f64)> = Vec::new();
        let mut run_setting = 0u16;
        for s in &self.samples {
            let breaks = run
                .last()
                .is_some_and(|&(p, _)| s.setting != run_setting || s.pos != p.wrapping_add(1));
            if breaks {
                out.extend(run_blocks(&run).into_iter().map(|b| (run_setting, b)));
                run.clear();
            }
            run_setting = s.setting;
            run.push((s.pos, s.ms));
        }
        out.extend(run_blocks(&run).into_iter().map(|b| (run_setting, b)));
        out
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
        let blocks = self.blocks();
        self.views = Toggle::ALL
            .iter()
            .map(|&t| self.evaluate(t, &blocks))
            .collect();
    }

    fn evaluate(&self, t: Toggle, blocks: &[(u16, BlockMean)]) -> ToggleView {
        // Tokens per arm, canonical order first.
        let mut arms: Vec<(Option<Arm>, usize)> = Vec::new();
        for (s, _) in self.samples() {
            let l = s.arm(t);
            match arms.iter_mut().find(|(a, _)| *a == l) {
                Some((_, n)) => *n += 1,
                None => arms.push((l, 1)),
            }
        }
        arms.sort_by_key(|(l, _)| t.rank(*l));
        // None = not in effect (fetch when the experts came from memory): not an arm, unless it
        // is all there is (shown as "").
        if arms.iter().any(|(l, _)| l.is_some()) {
            arms.retain(|(l, _)| l.is_some());
        }
        let mut view = ToggleView {
            toggle: t,
            arms: arms
                .into_iter()
                .map(|(l, n)| (l.map_or("", Arm::name).to_string(), n))
                .collect(),
            verdict: Verdict::OneArm,
        };
        if view.arms.len() < 2 {
            return view;
        }
        // Settings in use (most recently used last), grouped by everything but `t`: pairs
        // within a group differ in `t` alone.
        let mut used: Vec<u16> = Vec::new();
        for s in self.samples.iter().rev() {
            if !used.contains(&s.setting) {
                used.push(s.setting);
            }
        }
        used.reverse();
        let mut groups: std::collections::HashMap<Setting, Vec<u16>> = Default::default();
        for &i in &used {
            let mut m = self.settings[i as usize].clone();
            match t {
                Toggle::Prefetch => m.prefetch = false,
                Toggle::Fetch => m.fetch = None,
                Toggle::Layout => m.layout = Layout::default(),
                Toggle::Tier => {
                    m.tier = None;
                    m.fetch = None;
                }
                Toggle::Schedule => m.schedule = None,
            }
            groups.entry(m).or_default().push(i);
        }
        let blocks_of = |i: u16| -> Vec<BlockMean> {
            blocks
                .iter()
                .filter(|(s, _)| *s == i)
                .map(|(_, b)| *b)
                .collect()
        };
        // Best pair: (score = the smaller matched arm, a, b, a's blocks, b's blocks).
        let mut best: Option<Candidate> = None;
        for g in groups.values().filter(|g| g.len() > 1) {
            for (k, &i) in g.iter().enumerate() {
                for &j in &g[k + 1..] {
                    let (si, sj) = (&self.settings[i as usize], &self.settings[j as usize]);
                    if si.arm(t) == sj.arm(t) || si.arm(t).is_none() || sj.arm(t).is_none() {
                        continue;
                    }
                    let (i, j) = if t.rank(si.arm(t)) <= t.rank(sj.arm(t)) {
                        (i, j)
                    } else {
                        (j, i)
                    };
                    let (bi, bj) = (blocks_of(i), blocks_of(j));
                    let (a, b) = (matched(&bi, &bj), matched(&bj, &bi));
                    let score = a.len().min(b.len());
                    let better = best.as_ref().is_none_or(|bst| {
                        score > bst.0 || (score == bst.0 && (i, j) < (bst.1, bst.2))
                    });
                    if better {
                        best = Some((score, i, j, a, b));
                    }
                }
            }
        }
        let arm = |i: u16| self.settings[i as usize].arm(t);
        let label = |i: u16| self.settings[i as usize].label(t).to_string();
        view.verdict = match best {
            None => {
                // The closest pair of settings with different arms: what changed with it.
                let mut closest: Option<(usize, u16, u16, Vec<&'static str>)> = None;
                let recent = &used[used.len().saturating_sub(32)..];
                for (k, &i) in recent.iter().enumerate() {
                    for &j in &recent[k + 1..] {
                        let (si, sj) = (&self.settings[i as usize], &self.settings[j as usize]);
                        if si.arm(t) == sj.arm(t) || si.arm(t).is_none() || sj.arm(t).is_none() {
                            continue;
                        }
                        let d = si.differences(sj, t);
                        if closest.as_ref().is_none_or(|c| d.len() < c.0) {
                            closest = Some((d.len(), i, j, d));
                        }
                    }
                }
                match closest {
                    Some((_, i, j, with)) => {
                        let (i, j) = if t.rank(arm(i)) > t.rank(arm(j)) {
                            (j, i)
                        } else {
                            (i, j)
                        };
                        Verdict::Confounded {
                            a: label(i),
                            b: label(j),
                            with,
                        }
                    }
                    None => Verdict::OneArm,
                }
            }
            Some((score, i, j, a, b)) => {
                let est = (score >= MIN_BLOCKS).then(|| estimate(&a, &b)).flatten();
                match est {
                    Some(est) => Verdict::Compared {
                        a: label(i),
                        b: label(j),
                        others: self.settings[i as usize].others(t),
                        est,
                    },
                    None => Verdict::TooFew {
                        a: label(i),
                        b: label(j),
                        n_a: a.len(),
                        n_b: b.len(),
                    },
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
    Switch(Arm),
    /// Stop, with the reason.
    Done(String),
}

/// The A/B auto schedule: run arm A for [`AUTO_BLOCK`] tokens (a warm-up token and a block),
/// then B, then A… (the way hyperfine and criterion interleave), until the toggle's interval is
/// tight. It follows the engine's report of what ran, not its own requests.
#[derive(Clone, Debug, PartialEq)]
pub struct AutoAb {
    pub toggle: Toggle,
    /// The two arms, the first one being the arm in force when auto started.
    pub arms: [Arm; 2],
    pub every: u32,
    /// Index into `arms` of the arm being run (or requested).
    pub target: usize,
    /// Tokens counted in the current block.
    pub in_block: u32,
    /// Blocks completed.
    pub blocks: u32,
    /// A switch was requested and has not shown up in the engine's report yet: tokens since.
    pending: Option<u32>,
}

impl AutoAb {
    /// A/B auto of `current`'s toggle between `current` and `other` (an arm of the same
    /// toggle), switching every `every` counted tokens.
    pub fn new(current: Arm, other: Arm, every: u32) -> Self {
        debug_assert_eq!(current.toggle(), other.toggle());
        AutoAb {
            toggle: current.toggle(),
            arms: [current, other],
            every: every.max(1),
            target: 0,
            in_block: 0,
            blocks: 0,
            pending: None,
        }
    }

    /// Feed one measured token (the setting it ran with) and the toggle's current interval
    /// half-width.
    pub fn on_token(&mut self, s: &Setting, half_width: Option<f64>) -> AutoStep {
        let arm = s.arm(self.toggle);
        let Some(i) = self.arms.iter().position(|&a| Some(a) == arm) else {
            return AutoStep::Done(format!(
                "A/B auto stopped: {} is now {}",
                self.toggle.name(),
                arm.map_or("not in effect", Arm::name)
            ));
        };
        let arm = self.arms[i];
        if i != self.target {
            if let Some(n) = self.pending.as_mut() {
                // The requested switch takes effect at a later token: not counted.
                *n += 1;
                if *n > AUTO_PENDING_MAX {
                    return AutoStep::Done(format!(
                        "A/B auto stopped: {} {} was asked for, but the engine still ran {arm} after {} tokens",
                        self.toggle.name(),
                        self.arms[self.target],
                        AUTO_PENDING_MAX
                    ));
                }
                return AutoStep::Continue;
            }
            // Switched by hand: follow it and start a new block.
            self.target = i;
            self.in_block = 0;
        }
        self.pending = None;
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
        self.pending = Some(0);
        AutoStep::Switch(self.arms[self.target])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use FetchMode::{Staged, Sync};

    fn cfg(prefetch: bool, fetch: FetchMode) -> EngineConfigInfo {
        EngineConfigInfo {
            threads: 2,
            isa: "AVX2".into(),
            prefetch,
            weights: "mmap".into(),
            repacked: false,
            readers: 1,
            fetch,
            expert_tier: ExpertTier::Direct,
            layout: Layout::Cflow,
            layouts_available: vec![Layout::Cflow],
            notes: vec![],
        }
    }

    fn ran(prefetch: bool, fetch: FetchMode, schedule: Schedule) -> RunInfo {
        RunInfo {
            prefetch,
            fetch: Some(fetch),
            tier: Some(ExpertTier::Direct),
            layout: Layout::Cflow,
            schedule,
            threads: 2,
            weights: "mmap".into(),
            act: "q8".into(),
            kv: "f16".into(),
            expert_cache_mib: 0,
        }
    }

    fn rec(book: &mut AbBook, c: &EngineConfigInfo, pos: u32, ms: f64) {
        book.record(&Setting::asked(c, pos), pos, ms);
    }

    /// Multiplicative noise of about ±3%.
    fn noise(rng: &mut crate::rng::Rng) -> f64 {
        1.0 + (rng.unit_f64() - 0.5) * 0.06
    }

    /// Blocks of an alternating stream (runs of `run` tokens): (a, b).
    fn alternating(
        n: u32,
        run: u32,
        mut ms: impl FnMut(u32, bool) -> f64,
    ) -> (Vec<BlockMean>, Vec<BlockMean>) {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        let mut cur: Vec<(u32, f64)> = Vec::new();
        for pos in 0..n {
            let arm_a = (pos / run).is_multiple_of(2);
            cur.push((pos, ms(pos, arm_a)));
            if (pos + 1).is_multiple_of(run) {
                let bl = run_blocks(&cur);
                if arm_a { &mut a } else { &mut b }.extend(bl);
                cur.clear();
            }
        }
        (a, b)
    }

    #[test]
    fn context_buckets() {
        assert_eq!(ctx_bucket(0), 0);
        assert_eq!(ctx_bucket(255), 0);
        assert_eq!(ctx_bucket(256), 1);
        assert_eq!(ctx_bucket(511), 1);
        assert_eq!(ctx_bucket(512), 2);
        assert_eq!(bucket_label(2), "512–1023");
        assert_eq!(bucket_label(0), "0–255");
    }

    #[test]
    fn runs_become_blocks_of_at_least_eight_after_the_warm_up_token() {
        let run: Vec<(u32, f64)> = (0..20)
            .map(|p| (p, if p == 0 { 100.0 } else { 2.0 }))
            .collect();
        let b = run_blocks(&run);
        assert_eq!(b.len(), 2);
        assert_eq!((b[0].tokens, b[1].tokens), (8, 11));
        assert!((b[0].ln_ms - 2f64.ln()).abs() < 1e-12, "warm-up dropped");
        assert_eq!(b[0].pos, 4.5);
        assert!(run_blocks(&run[..8]).is_empty());
        assert_eq!(run_blocks(&run[..9]).len(), 1);
    }

    #[test]
    fn null_effect_with_rising_context_includes_one() {
        let mut rng = crate::rng::Rng::new(3);
        let (a, b) = alternating(400, 9, |pos, _| (8.0 + 0.02 * pos as f64) * noise(&mut rng));
        let e = estimate(&a, &b).unwrap();
        assert!(e.includes_one(), "{e:?}");
        assert!((e.ratio - 1.0).abs() < 0.01, "{e:?}");
        assert!(
            e.slope_per_kpos > 1.0,
            "the context effect is visible: {e:?}"
        );
        assert_eq!(e.n_a + e.n_b, 44, "{e:?}");
    }

    #[test]
    fn twenty_percent_effect_is_found() {
        let mut rng = crate::rng::Rng::new(5);
        let (a, b) = alternating(400, 9, |pos, arm_a| {
            (8.0 + 0.02 * pos as f64) * noise(&mut rng) * if arm_a { 1.2 } else { 1.0 }
        });
        let e = estimate(&a, &b).unwrap();
        assert!(e.ci.0 <= 1.2 && 1.2 <= e.ci.1, "{e:?}");
        assert!((e.ratio - 1.2).abs() < 0.01, "{e:?}");
        assert!(!e.includes_one());
        assert!(e.half_width() < 0.02, "{e:?}");
    }

    /// Tokens of one block share a slow or fast phase of the machine (here ±15%, drawn per
    /// block): a per-token interval would call that a difference; blocks do not.
    #[test]
    fn shared_noise_within_blocks_widens_the_interval() {
        let mut rng = crate::rng::Rng::new(11);
        let mut phase = 1.0;
        let (a, b) = alternating(9 * 12, 9, |pos, _| {
            if pos % 9 == 0 {
                phase = 1.0 + (rng.unit_f64() - 0.5) * 0.3;
            }
            8.0 * phase * (1.0 + (rng.unit_f64() - 0.5) * 0.01)
        });
        let e = estimate(&a, &b).unwrap();
        assert!(e.includes_one(), "{e:?}");
        assert!(e.half_width() > 0.03, "{e:?}");
        assert_eq!((e.n_a, e.n_b, e.df), (6, 6, 9));
    }

    #[test]
    fn estimate_is_deterministic_and_needs_two_blocks_each() {
        let bl = |pos: f64, ms: f64| BlockMean {
            pos,
            ln_ms: f64::ln(ms),
            tokens: 8,
        };
        let a = [bl(1.0, 2.0), bl(20.0, 2.1), bl(40.0, 2.2)];
        let b = [bl(10.0, 1.0), bl(30.0, 1.1), bl(50.0, 1.05)];
        assert_eq!(estimate(&a, &b), estimate(&a, &b));
        assert!(estimate(&a[..1], &b).is_none());
        let e = estimate(&a[..2], &b[..2]).unwrap();
        assert_eq!(e.df, 1);
        assert_eq!(t975(1), 12.706);
        assert!((t975(60) - 2.000).abs() < 0.005);
    }

    #[test]
    fn arms_are_compared_only_under_equal_other_settings() {
        // Prefetch and fetch switched together between two replies: neither can be compared.
        let mut book = AbBook::default();
        for pos in 0..40 {
            rec(&mut book, &cfg(false, Staged), pos, 8.0);
        }
        for pos in 40..80 {
            rec(&mut book, &cfg(true, Sync), pos, 14.0);
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
        for pos in 80..260u32 {
            let f = if (pos / 9) % 2 == 0 { Sync } else { Staged };
            rec(
                &mut book,
                &cfg(true, f),
                pos,
                if f == Sync { 14.0 } else { 10.0 },
            );
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

    /// The engine's schedule changes halfway while only prefetch is visible in the
    /// configuration: the prefetch arms are not compared.
    #[test]
    fn a_hidden_schedule_change_confounds_the_visible_toggle() {
        let mut book = AbBook::default();
        for pos in 0..100u32 {
            let r = ran(false, Staged, Schedule::Sequential);
            book.record(&Setting::ran(&r, pos), pos, 10.0);
        }
        for pos in 100..200u32 {
            let r = ran(true, Staged, Schedule::Vertical);
            book.record(&Setting::ran(&r, pos), pos, 7.0);
        }
        book.flush();
        match &book.view(Toggle::Prefetch).verdict {
            Verdict::Confounded { with, .. } => assert_eq!(with, &vec!["schedule"]),
            v => panic!("{v:?}"),
        }
        assert!(matches!(
            book.view(Toggle::Schedule).verdict,
            Verdict::Confounded { .. }
        ));
    }

    #[test]
    fn arms_at_distant_positions_are_not_compared() {
        let mut book = AbBook::default();
        for pos in 0..40 {
            rec(&mut book, &cfg(false, Staged), pos, 8.0);
        }
        for pos in 200..240 {
            rec(&mut book, &cfg(false, Sync), pos, 9.0);
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
        let mut c = cfg(false, Staged);
        // A hostile trace: a new thread count on every token, then two values only.
        for i in 0..600u32 {
            c.threads = 1000 + i;
            rec(&mut book, &c, i % 200, 1.0);
        }
        assert_eq!(book.settings.len(), 600);
        for i in 0..WINDOW as u32 {
            c.threads = 10 + i % 2;
            rec(&mut book, &c, i % 200, 1.0 + (i % 2) as f64);
        }
        assert_eq!(book.len(), WINDOW);
        // The next new setting drops every setting no kept sample refers to.
        c.threads = 7;
        rec(&mut book, &c, 7, 1.0);
        assert!(book.settings.len() <= 5, "{}", book.settings.len());
        for (s, x) in book.samples() {
            assert!(s.threads == 7 || s.threads == 10 + x.pos % 2, "{s:?} {x:?}");
        }
        rec(&mut book, &c, 0, f64::NAN);
        assert_eq!(book.len(), WINDOW);
    }

    #[test]
    fn auto_alternates_every_block_and_waits_for_switches() {
        let mut auto = AutoAb::new(Arm::Prefetch(false), Arm::Prefetch(true), 3);
        let off = Setting::asked(&cfg(false, Staged), 0);
        let on = Setting::asked(&cfg(true, Staged), 0);
        let steps: Vec<AutoStep> = (0..3).map(|_| auto.on_token(&off, None)).collect();
        assert_eq!(
            steps,
            vec![
                AutoStep::Continue,
                AutoStep::Continue,
                AutoStep::Switch(Arm::Prefetch(true))
            ]
        );
        // The switch shows up one token late: that token is not counted.
        assert_eq!(auto.on_token(&off, None), AutoStep::Continue);
        assert_eq!(auto.on_token(&on, None), AutoStep::Continue);
        assert_eq!(auto.on_token(&on, None), AutoStep::Continue);
        assert_eq!(
            auto.on_token(&on, None),
            AutoStep::Switch(Arm::Prefetch(false))
        );
        // Tight, but only after AUTO_MIN_BLOCKS blocks.
        let mut cur = [&off, &on];
        while auto.blocks + 1 < AUTO_MIN_BLOCKS {
            let s = cur[auto.target];
            auto.on_token(s, Some(0.01));
            cur = [&off, &on];
        }
        let s = cur[auto.target];
        auto.on_token(s, Some(0.05));
        auto.on_token(s, Some(0.05));
        assert!(matches!(auto.on_token(s, Some(0.01)), AutoStep::Done(_)));
        // The fetch mode not in effect any more (the experts now come from memory).
        let mut other = AutoAb::new(Arm::Fetch(Staged), Arm::Fetch(Sync), 2);
        let mut s = Setting::asked(&cfg(false, Staged), 0);
        s.fetch = None;
        assert_eq!(
            other.on_token(&s, None),
            AutoStep::Done("A/B auto stopped: fetch is now not in effect".into())
        );
    }

    /// A switch the engine does not carry out (prefetch under rowmajor) stops A/B auto instead
    /// of waiting forever.
    #[test]
    fn auto_stops_when_the_switch_never_shows_in_the_report() {
        let mut auto = AutoAb::new(Arm::Prefetch(false), Arm::Prefetch(true), 2);
        let off = Setting::asked(&cfg(false, Staged), 0);
        auto.on_token(&off, None);
        assert_eq!(
            auto.on_token(&off, None),
            AutoStep::Switch(Arm::Prefetch(true))
        );
        for _ in 0..AUTO_PENDING_MAX {
            assert_eq!(auto.on_token(&off, None), AutoStep::Continue);
        }
        match auto.on_token(&off, None) {
            AutoStep::Done(m) => assert!(m.contains("still ran off"), "{m}"),
            s => panic!("{s:?}"),
        }
    }
}
