//! What a token ran with: the full [`Setting`] an A/B sample is keyed by, and the context
//! bucket of a position.

use super::super::event::{EngineConfigInfo, RunInfo, TokenStats};
use super::*;
use crate::toggles::{ExpertTier, FetchMode, Layout, Schedule};

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
