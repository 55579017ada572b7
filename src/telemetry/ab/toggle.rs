//! The A/B toggles (prefetch, fetch, layout, expert tier, schedule) and their two arms.

use super::super::event::Command;
use crate::toggles::{ExpertTier, FetchMode, Layout, Schedule};

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

    pub(super) fn index(self) -> usize {
        Toggle::ALL.iter().position(|&t| t == self).unwrap_or(0)
    }

    /// Position of `arm` in [`Toggle::order`] (after every listed arm when not listed or None).
    pub(super) fn rank(self, arm: Option<Arm>) -> usize {
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
