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
//!
//! The parts: `toggle` (the toggles and their arms), `setting` (what a token ran with),
//! `estimate` (blocks and the ratio over them), `book` (samples and verdicts), `auto` (A/B auto).

mod auto;
mod book;
mod estimate;
mod setting;
mod toggle;

pub use auto::*;
pub use book::*;
pub use estimate::*;
pub use setting::*;
pub use toggle::*;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::event::{EngineConfigInfo, RunInfo};
    use crate::toggles::{ExpertTier, FetchMode, Layout, Schedule};

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
