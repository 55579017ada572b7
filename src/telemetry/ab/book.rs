//! The A/B book: every kept sample, the settings it ran with, and the cached verdict of each
//! toggle (ratio, too few, or confounded).

use super::estimate::matched;
use super::*;
use crate::toggles::Layout;
use std::collections::VecDeque;

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
    pub(super) settings: Vec<Setting>,
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

/// A pair of settings for a comparison: (score = the smaller matched arm, setting a, setting
/// b, a's matched blocks, b's matched blocks).
type Candidate = (usize, u16, u16, Vec<BlockMean>, Vec<BlockMean>);
