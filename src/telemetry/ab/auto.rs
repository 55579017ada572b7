//! A/B auto: the schedule that interleaves a toggle's arms in blocks until the interval is
//! tight or the budget is spent.

use super::*;

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
