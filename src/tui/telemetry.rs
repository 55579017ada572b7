//! The engine-derived state the metric panes draw ([`Telemetry`]): the session's model and
//! configuration, the latest token, the recent window, the A/B book, speeds and the context
//! position. Freezing the panes clones it.

use std::collections::VecDeque;

use super::io_totals::IoTotals;
use crate::engine::FetchMode;
use crate::telemetry::ab::{AbBook, Setting};
use crate::telemetry::event::{EngineConfigInfo, ModelSummary, TokenStats};

/// Tokens kept for windowed views (routing heatmap, per-layer times, overlap).
pub const WINDOW: usize = 64;
/// Tokens kept for the ms/token timeline (wider than any terminal).
pub const TIMELINE: usize = 512;

/// An event marked on the timeline, before the token with that sequence number.
#[derive(Clone, Debug, PartialEq)]
pub enum Mark {
    /// A prompt was prefilled (its token count).
    Prefill(u32),
    /// A toggle took effect ("prefetch ON", "fetch sync", …).
    Toggle(String),
}

/// Engine-derived state (what freezing snapshots).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Telemetry {
    pub model: Option<ModelSummary>,
    pub config: Option<EngineConfigInfo>,
    /// The latest token's stats.
    pub last: Option<TokenStats>,
    /// The last [`WINDOW`] tokens' stats (oldest first).
    pub recent: VecDeque<TokenStats>,
    /// Every token's ms, tagged with its setting and position; the controlled A/B verdicts.
    pub ab: AbBook,
    /// Prefill speed of the last prompt.
    pub prefill_tps: Option<f64>,
    /// Decode speed: live during a generation, final after `Done`.
    pub decode_tps: Option<f64>,
    /// Tokens and ns of the current generation (for the live decode rate).
    pub gen_tokens: u32,
    pub gen_ns: u64,
    /// KV slots in use.
    pub ctx_used: u32,
    /// Stats events seen since the session started.
    pub tokens_seen: u64,
    /// ms of the last [`TIMELINE`] tokens, with their sequence number (`tokens_seen` before them).
    pub timeline: VecDeque<(u64, f64)>,
    /// Marks at token sequence numbers (oldest first, pruned with the timeline).
    pub marks: VecDeque<(u64, Mark)>,
    /// Expert-I/O totals of recent tokens, tagged with the fetch mode in force (oldest first).
    pub io_window: VecDeque<(FetchMode, IoTotals)>,
    /// The last [`WINDOW`] tokens with expert I/O run under sync fetch: the overlap model's input.
    pub sync_io: VecDeque<TokenStats>,
    /// The whole run, downsampled in bounded memory (the Timeline's history).
    pub history: super::history::History,
}

impl Telemetry {
    /// The model's delays (0, 0 when unknown).
    pub fn delays(&self) -> (u32, u32) {
        self.model
            .as_ref()
            .map(|m| (m.dense_delay, m.expert_delay))
            .unwrap_or((0, 0))
    }

    /// True when the model has experts.
    pub fn has_experts(&self) -> bool {
        self.model.as_ref().is_some_and(|m| m.n_experts > 0)
    }

    pub(crate) fn on_stats(&mut self, s: TokenStats) {
        // Keyed by what the engine reports it ran (the configuration only for old traces).
        if let Some(key) = Setting::of_stats(&s, self.config.as_ref()) {
            self.ab.record(&key, s.pos, s.ns_total as f64 / 1e6);
        }
        if let Some(cfg) = &self.config {
            if let Some(io) = IoTotals::of(&s) {
                if self.io_window.len() == WINDOW {
                    self.io_window.pop_front();
                }
                self.io_window.push_back((cfg.fetch, io));
                if cfg.fetch == FetchMode::Sync {
                    if self.sync_io.len() == WINDOW {
                        self.sync_io.pop_front();
                    }
                    self.sync_io.push_back(s.clone());
                }
            }
        }
        self.gen_tokens += 1;
        self.gen_ns += s.ns_total;
        if let Some(r) = crate::stats::tok_per_s(self.gen_tokens as u64, self.gen_ns) {
            self.decode_tps = Some(r);
        }
        // The engine position of the token just computed: the KV length is one more.
        self.ctx_used = s.pos + 1;
        if self.timeline.len() == TIMELINE {
            self.timeline.pop_front();
        }
        self.timeline
            .push_back((self.tokens_seen, s.ns_total as f64 / 1e6));
        let bytes = super::io_totals::TokenBytes::of(self.model.as_ref(), &s).total();
        self.history
            .push(s.ns_total as f64 / 1e6, bytes, s.ns_total);
        let oldest = self.timeline.front().map_or(0, |t| t.0);
        while self.marks.front().is_some_and(|m| m.0 < oldest) {
            self.marks.pop_front();
        }
        self.tokens_seen += 1;
        if self.recent.len() == WINDOW {
            self.recent.pop_front();
        }
        self.recent.push_back(s.clone());
        self.last = Some(s);
    }
}

impl Telemetry {
    /// The setting the engine ran the last token with (its report), else the configuration as
    /// asked (before any token, or in a trace without the report).
    pub fn current_setting(&self) -> Option<Setting> {
        self.last
            .as_ref()
            .filter(|s| s.ran.is_some())
            .and_then(|s| Setting::of_stats(s, None))
            .or_else(|| {
                self.config
                    .as_ref()
                    .map(|c| Setting::asked(c, self.ctx_used))
            })
    }

    /// Marks `m` before the next token.
    pub(crate) fn mark(&mut self, m: Mark) {
        self.history.mark(match m {
            Mark::Prefill(_) => super::history::MARK_PREFILL,
            Mark::Toggle(_) => super::history::MARK_TOGGLE,
        });
        self.marks.push_back((self.tokens_seen, m));
    }
}
