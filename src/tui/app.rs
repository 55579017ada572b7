//! All UI state and its single mutation point, [`App::apply`].
//!
//! The app is a pure state machine: engine [`Event`]s, UI [`Action`]s (produced by the keymap),
//! ticks and resizes go in as [`Msg`]; [`Effects`] come out — engine [`Command`]s and
//! [`UiRequest`]s the host handles (recording, replay control, quit, suspend). Nothing here touches
//! the terminal, a clock or a channel, so every behaviour is unit-testable.
//!
//! Engine-derived data lives in [`Telemetry`], which is cloned when the user freezes the panes:
//! the live copy keeps absorbing events while the frozen one is drawn.

pub use super::io_totals::IoTotals;
pub use super::telemetry::{Telemetry, WINDOW};
use crate::engine::{ExpertTier, FetchMode, Layout, Schedule};
use crate::telemetry::ab::{Arm, AutoAb, AutoStep, Setting, Toggle, AUTO_BLOCK};
use crate::telemetry::event::{Command, Event, Stamped, StopReason};

use crate::telemetry::event::GenSettings;
/// Ticks a status message stays visible (the run loop ticks at ~30 Hz).
pub const MESSAGE_TICKS: u64 = 120;
/// Largest hypothetical delay in what-if mode.
pub const MAX_WHATIF_DELAY: u32 = 8;
/// How the message after a generation that ran out of context begins (cleared by a reset).
const CONTEXT_FULL: &str = "context full";
/// Layout cycle order.
pub const LAYOUTS: &[Layout] = Layout::ALL;

/// The panes, in focus (Tab) order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PaneId {
    Text,
    Streams,
    Critical,
    Routing,
    Overlap,
    /// The run's ms/token or GB/s over time (the view slot under the Text pane).
    Timeline,
    /// Per layer × token: ms, bytes or expert ids.
    Heatmap,
    /// Each phase's GB/s against the read ceiling and a modelled compute roof.
    Roofline,
    Pmu,
    Ab,
}

/// The views that take turns in the slot under the Text pane (`c` cycles them).
pub const TIME_VIEWS: [PaneId; 3] = [PaneId::Timeline, PaneId::Heatmap, PaneId::Roofline];

/// What the Timeline plots.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TimelineMetric {
    /// Measured ms per token.
    #[default]
    Ms,
    /// Effective read rate: the token's bytes (as stored) over its measured time.
    Gbs,
}

/// What the heatmap shades.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HeatMetric {
    /// Measured ms per layer.
    #[default]
    Ms,
    /// Bytes per layer (as stored, KV included when known).
    Bytes,
    /// The top expert picked at each layer (MoE only).
    Experts,
}

/// The Timeline's window over the run: tokens back from the newest (0 = live), tokens per
/// column, and what it plots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimelineView {
    pub offset: u64,
    pub zoom: u64,
    pub metric: TimelineMetric,
}

impl Default for TimelineView {
    fn default() -> Self {
        TimelineView {
            offset: 0,
            zoom: 1,
            metric: TimelineMetric::Ms,
        }
    }
}

/// Largest Timeline zoom (tokens per column).
pub const MAX_ZOOM: u64 = 1 << 16;
/// Columns one pan step moves.
pub const PAN_COLUMNS: u64 = 16;

impl PaneId {
    /// Focus order.
    pub const ALL: [PaneId; 10] = [
        PaneId::Text,
        PaneId::Streams,
        PaneId::Critical,
        PaneId::Routing,
        PaneId::Overlap,
        PaneId::Timeline,
        PaneId::Heatmap,
        PaneId::Roofline,
        PaneId::Pmu,
        PaneId::Ab,
    ];

    /// Short name used in titles and the compact-layout tab strip.
    pub fn name(self) -> &'static str {
        match self {
            PaneId::Text => "Text",
            PaneId::Streams => "Streams",
            PaneId::Critical => "Critical path",
            PaneId::Routing => "Routing",
            PaneId::Overlap => "Overlap",
            PaneId::Timeline => "Timeline",
            PaneId::Heatmap => "Heatmap",
            PaneId::Roofline => "Roofline",
            PaneId::Pmu => "PMU",
            PaneId::Ab => "A/B",
        }
    }

    fn index(self) -> usize {
        PaneId::ALL.iter().position(|&p| p == self).unwrap_or(0)
    }

    /// Next pane in focus order (wraps).
    pub fn next(self) -> PaneId {
        PaneId::ALL[(self.index() + 1) % PaneId::ALL.len()]
    }

    /// Previous pane in focus order (wraps).
    pub fn prev(self) -> PaneId {
        PaneId::ALL[(self.index() + PaneId::ALL.len() - 1) % PaneId::ALL.len()]
    }
}

/// What a key does, independent of which key it is (see `keymap.rs`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Action {
    /// Toggle the help overlay.
    Help,
    /// Toggle the model-info overlay.
    ModelInfo,
    /// Show / hide the ms/token timeline.
    Timeline,
    /// Cycle the view under the Text pane: Timeline → Heatmap → Roofline.
    CycleView,
    /// Pan the Timeline by ±[`PAN_COLUMNS`] columns (−1 = back in time).
    TimelinePan(i32),
    /// Back to the newest token (live).
    TimelineLive,
    /// Zoom the Timeline: +1 = fewer tokens per column, −1 = more.
    TimelineZoom(i32),
    /// Timeline: ms/token ↔ GB/s.
    TimelineMetric,
    /// Heatmap: ms → bytes → expert ids (MoE).
    HeatMetric,
    FocusNext,
    FocusPrev,
    /// Maximize / restore the focused pane.
    Maximize,
    /// Freeze / unfreeze the metric panes.
    Freeze,
    /// Start / stop recording the event stream.
    Record,
    TogglePrefetch,
    ToggleFetch,
    CycleLayout,
    ToggleTier,
    /// Switch the schedule sequential ↔ vertical (paper §4.4).
    ToggleSchedule,
    /// Start / stop A/B auto on the focused toggle (the one last switched).
    AbAuto,
    /// Enter / leave what-if mode in the critical-path pane.
    WhatIf,
    /// Change the hypothetical dense delay by ±1.
    WhatIfDense(i32),
    /// Change the hypothetical expert delay by ±1.
    WhatIfExpert(i32),
    /// Reset the context (KV cache).
    ResetContext,
    Quit,
    /// Ctrl+C: stops a running generation, otherwise quits.
    Interrupt,
    /// Ctrl+Z.
    Suspend,
    /// Esc: close help, leave the input (stopping a generation), restore a maximized pane.
    Escape,
    /// Give the input box focus.
    FocusInput,
    ReplayPause,
    /// Step the replay by ±1 token.
    ReplayStep(i32),
    /// Double (+1) or halve (-1) the replay speed.
    ReplaySpeed(i32),
    /// Scroll the transcript up (older) by lines.
    ScrollUp(u16),
    /// Scroll the transcript down (newer) by lines.
    ScrollDown(u16),
    PageUp,
    PageDown,
    /// Jump back to following the stream.
    ScrollEnd,
    // --- input box editing ---
    Insert(char),
    Newline,
    Backspace,
    Delete,
    CursorLeft,
    CursorRight,
    CursorHome,
    CursorEnd,
    ClearInput,
    Submit,
    HistoryPrev,
    HistoryNext,
    // --- chat (settings overlay, transcript, clipboard, mouse) ---
    /// Open the chat settings overlay (sampling, system prompt).
    OpenSettings,
    /// Overlay: previous / next field.
    SettingsMove(i32),
    /// Overlay: step the field down / up.
    SettingsAdjust(i32),
    /// Overlay: type into the field.
    SettingsInsert(char),
    SettingsBackspace,
    /// Overlay: send the changes to the engine and close.
    SettingsApply,
    /// Overlay: close without changes.
    SettingsCancel,
    /// Save the conversation as Markdown.
    SaveTranscript,
    /// Copy the last reply to the clipboard (OSC 52).
    CopyReply,
    /// Release / re-capture the mouse (released: the terminal's own selection works).
    ToggleMouse,
}

pub use crate::telemetry::player::ReplayControl;

/// Requests for the host (things the UI cannot do by sending a `Command` to the engine).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum UiRequest {
    StartRecording,
    StopRecording,
    Replay(ReplayControl),
    /// Suspend the process (Ctrl+Z); `tui::run` handles it itself and does not forward it.
    Suspend,
    Quit,
    /// Write [`crate::tui::transcript::from_app`] to a new file (`tui::run` does it).
    SaveTranscript,
    /// Put [`App::last_reply`] on the clipboard (`tui::run` does it).
    CopyLastReply,
    /// Enable / disable mouse capture (`tui::run` does it).
    SetMouseCapture(bool),
}

/// Everything the app consumes.
#[derive(Clone, Debug, PartialEq)]
pub enum Msg {
    Event(Event),
    /// An event with its timestamp (replay shows the trace clock).
    Stamped(Stamped),
    Action(Action),
    /// Periodic tick (~30 Hz) for message expiry and animation.
    Tick,
    /// Terminal resized to (width, height).
    Resize(u16, u16),
    /// The event source closed (engine exited or the replay reached its end).
    SourceClosed,
    /// The background bandwidth probe finished (None: it ended without a result).
    Bandwidth(Option<crate::telemetry::membw::Bandwidth>),
    /// This machine's contention now (run queue, steal, load; live runs only).
    Contention(crate::telemetry::contention::Contention),
}

impl From<Event> for Msg {
    fn from(e: Event) -> Self {
        Msg::Event(e)
    }
}

impl From<Action> for Msg {
    fn from(a: Action) -> Self {
        Msg::Action(a)
    }
}

/// What [`App::apply`] asks of the outside world.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Effects {
    pub commands: Vec<Command>,
    pub requests: Vec<UiRequest>,
}

impl Effects {
    fn cmd(c: Command) -> Self {
        Effects {
            commands: vec![c],
            requests: vec![],
        }
    }
    fn req(r: UiRequest) -> Self {
        Effects {
            commands: vec![],
            requests: vec![r],
        }
    }
    /// True when nothing is asked.
    pub fn is_empty(&self) -> bool {
        self.commands.is_empty() && self.requests.is_empty()
    }
}

/// Options the host passes in.
#[derive(Clone, Debug, PartialEq)]
pub struct TuiOptions {
    /// The UI is fed by a replay (toggles disabled, replay keys active, REPLAY badge).
    pub replay: bool,
    /// The replay's starting speed (`replay --speed`), shown in the REPLAY badge.
    pub replay_speed: f64,
    /// Recording is already on (e.g. `--record FILE`).
    pub recording: bool,
    /// The machine's measured DRAM read ceilings (per thread count), if known.
    pub bandwidth: Option<crate::telemetry::membw::Bandwidth>,
    /// The bandwidth probe is running in the background (`Msg::Bandwidth` brings its result).
    pub bandwidth_pending: bool,
    /// `max_tokens` sent with every prompt.
    pub max_tokens: u32,
    /// Capture the mouse (wheel scrollback).
    pub mouse: bool,
    /// Colour theme (`Theme::from_env()` honours NO_COLOR).
    pub theme: super::theme::Theme,
}

impl Default for TuiOptions {
    fn default() -> Self {
        TuiOptions {
            replay: false,
            replay_speed: 1.0,
            recording: false,
            bandwidth: None,
            bandwidth_pending: false,
            max_tokens: 256,
            mouse: true,
            theme: super::theme::Theme::default(),
        }
    }
}

/// Who said a transcript entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    User,
    Model,
    System,
    Error,
}

/// One transcript entry.
#[derive(Clone, Debug, PartialEq)]
pub struct Turn {
    pub role: Role,
    pub text: String,
    /// Set on model turns when the generation ended.
    pub end: Option<StopReason>,
}

/// The multi-line input box with history.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Input {
    pub text: String,
    /// Byte index of the cursor in `text`.
    pub cursor: usize,
    pub history: Vec<String>,
    /// Position while browsing history (None = editing the draft).
    hist_pos: Option<usize>,
    draft: String,
}

impl Input {
    fn insert(&mut self, c: char) {
        self.text.insert(self.cursor, c);
        self.cursor += c.len_utf8();
    }
    fn backspace(&mut self) {
        if let Some(c) = self.text[..self.cursor].chars().next_back() {
            self.cursor -= c.len_utf8();
            self.text.remove(self.cursor);
        }
    }
    fn delete(&mut self) {
        if self.cursor < self.text.len() {
            self.text.remove(self.cursor);
        }
    }
    fn left(&mut self) {
        if let Some(c) = self.text[..self.cursor].chars().next_back() {
            self.cursor -= c.len_utf8();
        }
    }
    fn right(&mut self) {
        if let Some(c) = self.text[self.cursor..].chars().next() {
            self.cursor += c.len_utf8();
        }
    }
    fn home(&mut self) {
        self.cursor = self.text[..self.cursor].rfind('\n').map_or(0, |i| i + 1);
    }
    fn end(&mut self) {
        self.cursor += self.text[self.cursor..]
            .find('\n')
            .unwrap_or(self.text.len() - self.cursor);
    }
    fn set(&mut self, s: String) {
        self.cursor = s.len();
        self.text = s;
    }
    fn take(&mut self) -> String {
        self.cursor = 0;
        self.hist_pos = None;
        std::mem::take(&mut self.text)
    }
    fn history_prev(&mut self) {
        if self.history.is_empty() {
            return;
        }
        let pos = match self.hist_pos {
            None => {
                self.draft = self.text.clone();
                self.history.len() - 1
            }
            Some(0) => 0,
            Some(p) => p - 1,
        };
        self.hist_pos = Some(pos);
        self.set(self.history[pos].clone());
    }
    fn history_next(&mut self) {
        match self.hist_pos {
            None => {}
            Some(p) if p + 1 < self.history.len() => {
                self.hist_pos = Some(p + 1);
                self.set(self.history[p + 1].clone());
            }
            Some(_) => {
                self.hist_pos = None;
                let d = std::mem::take(&mut self.draft);
                self.set(d);
            }
        }
    }
    /// (line, column in chars) of the cursor.
    pub fn cursor_line_col(&self) -> (usize, usize) {
        let before = &self.text[..self.cursor];
        let line = before.matches('\n').count();
        let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count());
        (line, col)
    }
}

/// Replay playback state.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ReplayState {
    pub paused: bool,
    pub speed: f64,
    /// Timestamp of the latest event applied (ns since the recorded session started).
    pub t_ns: u64,
    /// Tokens shown since the trace's `Session` (the player counts the same way).
    pub shown: u64,
    /// A backward step in flight: (the token count it ends at, its rewind has begun). The
    /// player re-sends the trace from its start; until it reaches the target the screen would
    /// show intermediate tokens, so the host does not draw ([`App::seeking`]).
    pub seek: Option<(u64, bool)>,
}

/// The whole UI state.
#[derive(Clone, Debug, PartialEq)]
pub struct App {
    /// Live engine-derived data.
    pub live: Telemetry,
    /// A snapshot drawn instead of `live` while frozen.
    pub frozen: Option<Box<Telemetry>>,
    pub transcript: Vec<Turn>,
    pub generating: bool,
    pub input: Input,
    pub input_focused: bool,
    pub focus: PaneId,
    /// The pane shown beside the text in the compact (80×24) layout.
    pub compact_pane: PaneId,
    pub maximized: bool,
    pub show_help: bool,
    /// Lines the help overlay is scrolled down (when it does not fit).
    pub help_scroll: u16,
    /// The model-info overlay is shown.
    pub show_info: bool,
    /// The ms/token timeline is shown in the Text column.
    pub show_timeline: bool,
    /// The view in the slot under the Text pane (one of [`TIME_VIEWS`]).
    pub time_view: PaneId,
    /// The Timeline's window over the run.
    pub timeline_view: TimelineView,
    /// What the heatmap shades.
    pub heat_metric: HeatMetric,
    pub recording: bool,
    pub replay: Option<ReplayState>,
    /// The input gave the keys to the panes when a prompt was sent; it takes them back when the
    /// reply ends (unless Esc or Tab left it meanwhile).
    pub refocus_after_reply: bool,
    /// This machine's contention, sampled by the host about once a second (live runs).
    pub contention: Option<crate::telemetry::contention::Contention>,
    /// Hypothetical (δd, δe) while in what-if mode.
    pub whatif: Option<(u32, u32)>,
    /// Transcript lines scrolled up from the bottom (0 = follow the stream).
    pub scroll: u16,
    /// A transient status message and the tick it expires at.
    pub message: Option<(String, u64)>,
    pub ticks: u64,
    pub size: (u16, u16),
    pub bandwidth: Option<crate::telemetry::membw::Bandwidth>,
    /// The bandwidth probe is still running (the Streams pane says "measuring…").
    pub bandwidth_pending: bool,
    pub max_tokens: u32,
    pub theme: super::theme::Theme,
    pub quit: bool,
    /// The event source has closed.
    pub source_closed: bool,
    /// Ctrl+C stopped a generation; a second Ctrl+C quits.
    interrupt_armed: bool,
    /// The toggle A/B auto works on: the one last switched (prefetch at first).
    pub ab_focus: Toggle,
    /// The schedule last asked for with `v` (None: the engine's default, auto).
    schedule: Option<Schedule>,
    /// A/B auto in progress.
    pub ab_auto: Option<AutoAb>,
    /// Sampling, system prompt and numerics in force (the engine's latest `Settings`).
    pub settings: Option<GenSettings>,
    /// The chat settings overlay, when open.
    pub editor: Option<super::settings::SettingsEditor>,
    /// Index in `transcript` where the conversation since the last context reset starts.
    pub conv_start: usize,
    /// Summary lines of finished replies, by the index of their model turn in `transcript`.
    pub summaries: std::collections::BTreeMap<usize, String>,
    /// The reply being measured (from `Prompt` and `Prefill`; finished by `Done`).
    pub reply: super::transcript::ReplyStats,
    /// Mouse captured by the UI (wheel scrollback); false = the terminal selects text.
    pub mouse_captured: bool,
    /// Bumped whenever `transcript` is cleared (keys [`Self::wrapped`]).
    pub transcript_epoch: u64,
    /// The Text pane's wrapped rows of finished turns (drawing state, not UI state).
    pub wrapped: super::text::WrapCache,
}

impl Default for App {
    fn default() -> Self {
        App::new(&TuiOptions::default())
    }
}

impl App {
    pub fn new(opts: &TuiOptions) -> Self {
        App {
            live: Telemetry::default(),
            frozen: None,
            transcript: Vec::new(),
            generating: false,
            input: Input::default(),
            input_focused: !opts.replay,
            focus: PaneId::Text,
            compact_pane: PaneId::Streams,
            maximized: false,
            show_help: false,
            help_scroll: 0,
            show_info: false,
            show_timeline: true,
            time_view: PaneId::Timeline,
            timeline_view: TimelineView::default(),
            heat_metric: HeatMetric::default(),
            recording: opts.recording,
            replay: opts.replay.then_some(ReplayState {
                paused: false,
                speed: opts.replay_speed,
                t_ns: 0,
                shown: 0,
                seek: None,
            }),
            contention: None,
            refocus_after_reply: false,
            whatif: None,
            scroll: 0,
            message: None,
            ticks: 0,
            size: (80, 24),
            bandwidth: opts.bandwidth.clone(),
            bandwidth_pending: opts.bandwidth_pending && opts.bandwidth.is_none(),
            max_tokens: opts.max_tokens,
            theme: opts.theme,
            quit: false,
            source_closed: false,
            interrupt_armed: false,
            ab_focus: Toggle::Prefetch,
            schedule: None,
            ab_auto: None,
            settings: None,
            editor: None,
            conv_start: 0,
            summaries: Default::default(),
            reply: Default::default(),
            mouse_captured: opts.mouse,
            transcript_epoch: 0,
            wrapped: Default::default(),
        }
    }

    /// The text of the last model reply, if any.
    pub fn last_reply(&self) -> Option<&str> {
        self.transcript
            .iter()
            .rev()
            .find(|t| t.role == Role::Model && !t.text.is_empty())
            .map(|t| t.text.as_str())
    }

    /// The telemetry the metric panes draw: the frozen snapshot if any, else live.
    pub fn view(&self) -> &Telemetry {
        self.frozen.as_deref().unwrap_or(&self.live)
    }

    /// True in chat mode (the model has a chat template), false in completion mode.
    pub fn chat_mode(&self) -> bool {
        self.live
            .model
            .as_ref()
            .is_some_and(|m| m.has_chat_template)
    }

    /// A backward replay step is being re-played from the trace's start: the screen would show
    /// intermediate tokens, so the host waits with drawing until it is done.
    pub fn seeking(&self) -> bool {
        self.replay.is_some_and(|r| r.seek.is_some())
    }

    /// The current status message, if not expired.
    /// (compute threads, CPUs) when the prefetch thread cannot have a core of its own: the
    /// engine's threads plus the prefetch thread outnumber the CPUs (known on a live run).
    pub fn prefetch_shares_core(&self) -> Option<(u32, u32)> {
        let threads = self.live.config.as_ref()?.threads;
        let cpus = self.contention?.cpus;
        (threads + 1 > cpus).then_some((threads, cpus))
    }

    pub fn status_message(&self) -> Option<&str> {
        self.message
            .as_ref()
            .filter(|(_, until)| *until > self.ticks)
            .map(|(m, _)| m.as_str())
    }

    pub(super) fn say(&mut self, m: impl Into<String>) {
        self.message = Some((m.into(), self.ticks + MESSAGE_TICKS));
    }

    /// The single mutation point.
    pub fn apply(&mut self, msg: Msg) -> Effects {
        match msg {
            Msg::Event(e) => {
                let stats = matches!(e, Event::Stats(_));
                self.on_event(e);
                if stats {
                    self.ab_auto_step()
                } else {
                    Effects::default()
                }
            }
            Msg::Stamped(s) => {
                if let Some(r) = &mut self.replay {
                    r.t_ns = s.t_ns;
                    match s.event {
                        Event::Session { .. } => {
                            r.shown = 0;
                            if let Some((_, begun)) = &mut r.seek {
                                *begun = true;
                            }
                        }
                        Event::Token { .. } => r.shown += 1,
                        _ => {}
                    }
                    if let Some((target, true)) = r.seek {
                        if r.shown >= target {
                            r.seek = None;
                        }
                    }
                }
                let stats = matches!(s.event, Event::Stats(_));
                self.on_event(s.event);
                if stats {
                    self.ab_auto_step()
                } else {
                    Effects::default()
                }
            }
            Msg::Action(a) => self.on_action(a),
            Msg::Tick => {
                self.ticks += 1;
                Effects::default()
            }
            Msg::Resize(w, h) => {
                self.size = (w, h);
                Effects::default()
            }
            Msg::Contention(c) => {
                self.contention = Some(c);
                Effects::default()
            }
            Msg::Bandwidth(b) => {
                self.bandwidth_pending = false;
                match b {
                    Some(b) => {
                        let threads = self.live.config.as_ref().map_or(1, |c| c.threads);
                        if let Some(c) = b.ceiling_for(threads) {
                            self.say(format!(
                                "read ceiling measured: {:.1} GB/s with {} thread{} (saved in the machine profile)",
                                c.read_gbps,
                                c.threads,
                                if c.threads == 1 { "" } else { "s" }
                            ));
                        }
                        self.bandwidth = Some(b);
                    }
                    None => self.say("the bandwidth probe ended without a result"),
                }
                Effects::default()
            }
            Msg::SourceClosed => {
                self.source_closed = true;
                self.generating = false;
                self.say(if self.replay.is_some() {
                    "end of trace — q quits"
                } else {
                    "engine stopped — q quits"
                });
                Effects::default()
            }
        }
    }

    fn model_turn(&mut self) -> &mut Turn {
        let open = matches!(
            self.transcript.last(),
            Some(Turn {
                role: Role::Model,
                end: None,
                ..
            })
        );
        if !open {
            self.transcript.push(Turn {
                role: Role::Model,
                text: String::new(),
                end: None,
            });
        }
        self.transcript.last_mut().expect("just pushed")
    }

    fn on_event(&mut self, e: Event) {
        match e {
            Event::Session { model, config } => {
                // A new session (or a replay restarting for a backward step): start clean.
                self.live = Telemetry {
                    model: Some(*model),
                    config: Some(config),
                    ..Telemetry::default()
                };
                self.transcript.clear();
                self.transcript_epoch += 1;
                self.generating = false;
                self.scroll = 0;
                self.whatif = None;
                self.ab_auto = None;
                self.settings = None;
                self.conv_start = 0;
                self.summaries.clear();
            }
            Event::Prompt { text, tokens, .. } => {
                self.transcript.push(Turn {
                    role: Role::User,
                    text,
                    end: None,
                });
                self.transcript.push(Turn {
                    role: Role::Model,
                    text: String::new(),
                    end: None,
                });
                self.generating = true;
                self.interrupt_armed = false;
                self.live.ctx_used += tokens.len() as u32;
                self.reply = super::transcript::ReplyStats {
                    prompt_tokens: tokens.len() as u32,
                    ..Default::default()
                };
                self.live.gen_tokens = 0;
                self.live.gen_ns = 0;
                if self.scroll > 0 {
                    self.scroll = self.scroll.saturating_add(2);
                }
            }
            Event::Prefill { n_tokens, ns } => {
                self.reply.prompt_tokens = n_tokens;
                self.reply.prefill_ns = ns;
                self.live.mark(super::telemetry::Mark::Prefill(n_tokens));
                if ns > 0 {
                    self.live.prefill_tps = Some(n_tokens as f64 * 1e9 / ns as f64);
                }
            }
            Event::Token { text, .. } => {
                let newlines = text.matches('\n').count() as u16;
                self.model_turn().text.push_str(&text);
                if self.scroll > 0 {
                    self.scroll = self.scroll.saturating_add(newlines);
                }
            }
            Event::Stats(s) => self.live.on_stats(s),
            Event::Config(c) => {
                if let Some(old) = &self.live.config {
                    let mut changes = Vec::new();
                    if old.prefetch != c.prefetch {
                        changes.push(format!(
                            "prefetch {}",
                            if c.prefetch { "ON" } else { "OFF" }
                        ));
                    }
                    if old.fetch != c.fetch {
                        changes.push(format!("fetch {}", c.fetch));
                    }
                    if old.layout != c.layout {
                        changes.push(format!("layout {}", c.layout));
                    }
                    if old.expert_tier != c.expert_tier {
                        changes.push(format!("tier {}", c.expert_tier));
                    }
                    let new_notes: Vec<&String> =
                        c.notes.iter().filter(|n| !old.notes.contains(n)).collect();
                    for c in &changes {
                        self.live.mark(super::telemetry::Mark::Toggle(c.clone()));
                    }
                    let mut m = changes.join(", ");
                    for n in new_notes {
                        if !m.is_empty() {
                            m.push_str(" · ");
                        }
                        m.push_str(n);
                    }
                    if !m.is_empty() {
                        self.say(m);
                    }
                }
                self.live.ab.flush();
                self.live.config = Some(c);
            }
            Event::Done {
                reason,
                n_tokens,
                decode_ns,
                pos,
                ttft_ns,
            } => {
                self.generating = false;
                self.interrupt_armed = false;
                self.live.ab.flush();
                if std::mem::take(&mut self.refocus_after_reply) && self.replay.is_none() {
                    self.input_focused = true;
                }
                // The engine's own count replaces the running estimate (a refused prompt was
                // counted at `Prompt` but never entered the KV cache).
                if let Some(p) = pos {
                    self.live.ctx_used = p;
                }
                if reason == StopReason::ContextFull {
                    self.say(format!(
                        "{CONTEXT_FULL} — Ctrl+L resets it (clears the KV cache)"
                    ));
                }
                if let Some(r) = crate::stats::tok_per_s(n_tokens as u64, decode_ns) {
                    self.live.decode_tps = Some(r);
                }
                self.model_turn().end = Some(reason);
                self.reply.tokens = n_tokens;
                self.reply.decode_ns = decode_ns;
                self.reply.ttft_ns = ttft_ns;
                if n_tokens > 0 || self.reply.prefill_ns > 0 {
                    let at = self.transcript.len() - 1;
                    self.summaries.insert(at, self.reply.line());
                }
                self.reply = Default::default();
            }
            Event::Snapshot { ctx_pos } => self.live.ctx_used = ctx_pos,
            Event::Reset => {
                self.live.ctx_used = 0;
                // The context is empty now: a "context full" message is stale.
                if self
                    .message
                    .as_ref()
                    .is_some_and(|(m, _)| m.starts_with(CONTEXT_FULL))
                {
                    self.message = None;
                }
                self.transcript.push(Turn {
                    role: Role::System,
                    text: "context reset".into(),
                    end: None,
                });
                self.conv_start = self.transcript.len();
            }
            Event::Settings(g) => self.on_settings(g),
            Event::History { messages } => {
                let n = messages.len();
                for m in messages {
                    let user = m.role == "user";
                    self.transcript.push(Turn {
                        role: if user { Role::User } else { Role::Model },
                        text: m.text,
                        end: (!user).then_some(StopReason::Eos),
                    });
                }
                self.transcript.push(Turn {
                    role: Role::System,
                    text: format!(
                        "loaded {n} messages from the transcript; the next reply continues them"
                    ),
                    end: None,
                });
            }
            // The PMU pane shows why hardware counters are missing; said once, there.
            Event::Notice { message } if message.starts_with("PMU: ") => {}
            // The recorded run's own recording: a replay records nothing.
            Event::Notice { message }
                if self.replay.is_some() && message.starts_with("recording to ") => {}
            Event::Notice { message } => {
                self.say(message.clone());
                self.transcript.push(Turn {
                    role: Role::System,
                    text: message,
                    end: None,
                });
            }
            Event::Error { message, fatal } => {
                // The recorder could not start (`r` in a read-only directory) or stopped on a
                // write error: the ● REC badge goes off with it.
                if message.starts_with("cannot record:")
                    || message.starts_with("recording stopped:")
                {
                    self.recording = false;
                }
                let text = if fatal {
                    format!("fatal: {message}")
                } else {
                    message
                };
                self.say(text.clone());
                self.transcript.push(Turn {
                    role: Role::Error,
                    text,
                    end: None,
                });
                if fatal {
                    self.generating = false;
                }
            }
        }
    }

    pub(super) fn toggles_blocked(&mut self) -> bool {
        if self.replay.is_some() {
            self.say("replay: toggles were recorded, they cannot be changed");
            return true;
        }
        if self.live.config.is_none() {
            self.say("no engine session yet");
            return true;
        }
        false
    }

    fn on_action(&mut self, a: Action) -> Effects {
        if a != Action::Interrupt {
            self.interrupt_armed = false;
        }
        // A key pressed during the reply means the user is at the panes: the input does not
        // take the keys back at its end (Submit sets it again).
        self.refocus_after_reply = false;
        if self.scroll_overlay(a) {
            return Effects::default();
        }
        match a {
            Action::Help
            | Action::ModelInfo
            | Action::Timeline
            | Action::FocusNext
            | Action::FocusPrev
            | Action::CycleView
            | Action::TimelinePan(_)
            | Action::TimelineLive
            | Action::TimelineZoom(_)
            | Action::TimelineMetric
            | Action::HeatMetric
            | Action::Maximize
            | Action::Freeze => {
                self.on_view_action(a);
                Effects::default()
            }
            Action::Record
            | Action::ResetContext
            | Action::Quit
            | Action::Interrupt
            | Action::Suspend
            | Action::Escape
            | Action::FocusInput
            | Action::ScrollUp(_)
            | Action::ScrollDown(_)
            | Action::PageUp
            | Action::PageDown
            | Action::ScrollEnd
            | Action::Submit => self.on_session_action(a),
            Action::TogglePrefetch
            | Action::ToggleFetch
            | Action::ToggleSchedule
            | Action::ToggleTier
            | Action::CycleLayout
            | Action::AbAuto
            | Action::WhatIf
            | Action::WhatIfDense(_)
            | Action::WhatIfExpert(_) => self.on_toggle_action(a),
            Action::ReplayPause | Action::ReplayStep(_) | Action::ReplaySpeed(_) => {
                self.on_replay_action(a)
            }
            Action::Insert(_)
            | Action::Newline
            | Action::Backspace
            | Action::Delete
            | Action::CursorLeft
            | Action::CursorRight
            | Action::CursorHome
            | Action::CursorEnd
            | Action::ClearInput
            | Action::HistoryPrev
            | Action::HistoryNext => self.on_edit_action(a),
            Action::OpenSettings
            | Action::SettingsMove(_)
            | Action::SettingsAdjust(_)
            | Action::SettingsInsert(_)
            | Action::SettingsBackspace
            | Action::SettingsApply
            | Action::SettingsCancel
            | Action::SaveTranscript
            | Action::CopyReply
            | Action::ToggleMouse => self.on_chat_action(a),
        }
    }

    /// Scrolls the help or model-info overlay when one is open; true when `a` was such a scroll.
    fn scroll_overlay(&mut self, a: Action) -> bool {
        if !(self.show_help || self.show_info) {
            return false;
        }
        let page = self.page();
        let s = &mut self.help_scroll;
        match a {
            Action::ScrollUp(n) => *s = s.saturating_sub(n),
            Action::ScrollDown(n) => *s = s.saturating_add(n),
            Action::PageUp => *s = s.saturating_sub(page),
            Action::PageDown => *s = s.saturating_add(page),
            _ => return false,
        }
        true
    }

    /// What the panes show: overlays, focus, the time views and their zoom, freezing. Changes
    /// only the view; the engine is not asked anything.
    fn on_view_action(&mut self, a: Action) {
        match a {
            Action::Help => {
                self.show_help = !self.show_help;
                self.help_scroll = 0;
            }
            Action::ModelInfo => {
                self.show_info = !self.show_info;
                self.help_scroll = 0;
            }
            Action::Timeline => self.show_timeline = !self.show_timeline,
            Action::FocusNext | Action::FocusPrev => {
                self.input_focused = false;
                self.focus = if a == Action::FocusNext {
                    self.focus.next()
                } else {
                    self.focus.prev()
                };
                if self.focus != PaneId::Text {
                    self.compact_pane = self.focus;
                }
                if TIME_VIEWS.contains(&self.focus) {
                    self.time_view = self.focus;
                    self.show_timeline = true;
                }
            }
            Action::CycleView => {
                let i = TIME_VIEWS
                    .iter()
                    .position(|&p| p == self.time_view)
                    .unwrap_or(0);
                let next = TIME_VIEWS[(i + 1) % TIME_VIEWS.len()];
                self.time_view = next;
                self.show_timeline = true;
                if TIME_VIEWS.contains(&self.focus) || TIME_VIEWS.contains(&self.compact_pane) {
                    self.compact_pane = next;
                }
                if TIME_VIEWS.contains(&self.focus) {
                    self.focus = next;
                }
                self.say(format!(
                    "view: {} (c cycles, z zooms when focused)",
                    next.name()
                ));
            }
            Action::TimelinePan(dir) => {
                let zoom = self.timeline_view.zoom;
                let step = PAN_COLUMNS * self.view().history.effective_zoom(zoom);
                let newest = self.view().history.tokens;
                let tv = &mut self.timeline_view;
                tv.offset = if dir < 0 {
                    tv.offset.saturating_add(step).min(newest)
                } else {
                    tv.offset.saturating_sub(step)
                };
            }
            Action::TimelineLive => self.timeline_view.offset = 0,
            Action::TimelineZoom(dir) => {
                let z = &mut self.timeline_view.zoom;
                *z = if dir < 0 { *z * 2 } else { *z / 2 }.clamp(1, MAX_ZOOM);
            }
            Action::TimelineMetric => {
                let m = &mut self.timeline_view.metric;
                *m = match m {
                    TimelineMetric::Ms => TimelineMetric::Gbs,
                    TimelineMetric::Gbs => TimelineMetric::Ms,
                };
            }
            Action::HeatMetric => {
                let moe = self.view().has_experts();
                self.heat_metric = match self.heat_metric {
                    HeatMetric::Ms => HeatMetric::Bytes,
                    HeatMetric::Bytes if moe => HeatMetric::Experts,
                    _ => HeatMetric::Ms,
                };
            }
            Action::Maximize => self.maximized = !self.maximized,
            Action::Freeze => {
                if self.frozen.take().is_none() {
                    self.frozen = Some(Box::new(self.live.clone()));
                    self.say("panes frozen (data keeps coming in) — f to resume");
                } else {
                    self.say("panes live");
                }
            }
            _ => {} // `on_action` routes only the view actions here
        }
    }

    /// Recording, stopping and quitting, the input's focus, the text's scroll and submitting.
    fn on_session_action(&mut self, a: Action) -> Effects {
        match a {
            Action::Record => {
                self.recording = !self.recording;
                return Effects::req(if self.recording {
                    UiRequest::StartRecording
                } else {
                    UiRequest::StopRecording
                });
            }
            Action::ResetContext if self.replay.is_none() => return Effects::cmd(Command::Reset),
            Action::Quit => return self.quit(),
            Action::Interrupt => {
                if self.generating && !self.interrupt_armed {
                    self.interrupt_armed = true;
                    self.say("generation stopped — Ctrl+C again to quit");
                    return Effects::cmd(Command::Stop);
                }
                return self.quit();
            }
            Action::Suspend => return Effects::req(UiRequest::Suspend),
            Action::Escape => {
                if self.show_help {
                    self.show_help = false;
                } else if self.show_info {
                    self.show_info = false;
                } else if self.input_focused {
                    // Esc in the input only leaves it; outside, Esc stops a generation.
                    self.input_focused = false;
                    self.refocus_after_reply = false;
                    if self.generating && self.replay.is_none() {
                        self.say("Esc again stops the generation");
                    }
                } else if self.generating && self.replay.is_none() {
                    self.say("generation stopped");
                    return Effects::cmd(Command::Stop);
                } else if self.maximized {
                    self.maximized = false;
                } else if self.whatif.is_some() {
                    self.whatif = None;
                }
            }
            Action::FocusInput => {
                if self.replay.is_some() {
                    self.say("replay: no engine to talk to");
                } else {
                    self.input_focused = true;
                    self.focus = PaneId::Text;
                }
            }
            Action::ScrollUp(n) => self.scroll = self.scroll.saturating_add(n),
            Action::ScrollDown(n) => self.scroll = self.scroll.saturating_sub(n),
            Action::PageUp => self.scroll = self.scroll.saturating_add(self.page()),
            Action::PageDown => self.scroll = self.scroll.saturating_sub(self.page()),
            Action::ScrollEnd => self.scroll = 0,
            Action::Submit => return self.submit(),
            _ => {} // `on_action` routes only the session actions here
        }
        Effects::default()
    }

    /// The A/B toggles and the what-if model: each toggle says what it asks and returns the
    /// command (nothing while toggles are blocked, e.g. in a replay).
    fn on_toggle_action(&mut self, a: Action) -> Effects {
        match a {
            Action::TogglePrefetch => {
                if self.toggles_blocked() {
                    return Effects::default();
                }
                self.ab_focus = Toggle::Prefetch;
                let on = self.live.config.as_ref().is_some_and(|c| c.prefetch);
                self.say(format!(
                    "prefetch → {} (next token){}",
                    if on { "OFF" } else { "ON" },
                    self.inert_note(Toggle::Prefetch)
                ));
                return Effects::cmd(Command::SetPrefetch(!on));
            }
            Action::ToggleFetch => {
                if self.toggles_blocked() || self.refuse_without_experts(Toggle::Fetch) {
                    return Effects::default();
                }
                self.ab_focus = Toggle::Fetch;
                let cur = self.live.config.as_ref().map(|c| c.fetch);
                let next = if cur == Some(FetchMode::Sync) {
                    FetchMode::Staged
                } else {
                    FetchMode::Sync
                };
                self.say(format!(
                    "fetch → {next} (next token){}",
                    self.inert_note(Toggle::Fetch)
                ));
                return Effects::cmd(Command::SetFetch(next));
            }
            Action::ToggleSchedule => {
                if self.toggles_blocked() {
                    return Effects::default();
                }
                let next = if self.schedule == Some(Schedule::Vertical) {
                    Schedule::Sequential
                } else {
                    Schedule::Vertical
                };
                self.schedule = Some(next);
                self.ab_focus = Toggle::Schedule;
                self.say(format!("schedule → {next} (next token)"));
                return Effects::cmd(Command::SetSchedule(next));
            }
            Action::ToggleTier => {
                if self.toggles_blocked() || self.refuse_without_experts(Toggle::Tier) {
                    return Effects::default();
                }
                self.ab_focus = Toggle::Tier;
                let cur = self.live.config.as_ref().map(|c| c.expert_tier);
                let next = if cur == Some(ExpertTier::Mmap) {
                    ExpertTier::Direct
                } else {
                    ExpertTier::Mmap
                };
                self.say(format!(
                    "expert tier → {next} (next token){}",
                    self.inert_note(Toggle::Tier)
                ));
                return Effects::cmd(Command::SetExpertTier(next));
            }
            Action::CycleLayout => {
                if self.toggles_blocked() {
                    return Effects::default();
                }
                self.ab_focus = Toggle::Layout;
                return self.cycle_layout();
            }
            Action::AbAuto => self.toggle_ab_auto(),
            Action::WhatIf => {
                // w enters the what-if model, and leaves it when it is on.
                let was_on = self.whatif.take().is_some();
                if !was_on {
                    self.whatif = Some(self.live.delays());
                    self.focus = PaneId::Critical;
                    self.compact_pane = PaneId::Critical;
                    self.input_focused = false;
                    self.say("what-if: d/D δd −/+, e/E δe −/+, w to leave");
                }
            }
            Action::WhatIfDense(step) => {
                if let Some((dd, _)) = &mut self.whatif {
                    *dd = dd.saturating_add_signed(step).min(MAX_WHATIF_DELAY);
                }
            }
            Action::WhatIfExpert(step) => {
                if let Some((_, de)) = &mut self.whatif {
                    *de = de.saturating_add_signed(step).min(MAX_WHATIF_DELAY);
                }
            }
            _ => {}
        }
        Effects::default()
    }

    /// Replay playback: pause, step (backward steps rewind and re-send the trace), speed.
    fn on_replay_action(&mut self, a: Action) -> Effects {
        match a {
            Action::ReplayPause => {
                if let Some(r) = &mut self.replay {
                    r.paused = !r.paused;
                    return Effects::req(UiRequest::Replay(ReplayControl::SetPaused(r.paused)));
                }
            }
            Action::ReplayStep(n) => {
                if let Some(r) = &mut self.replay {
                    // Steps add up from the target of a step still in flight.
                    let from = r.seek.map_or(r.shown, |(t, _)| t);
                    let target = (from as i64 + n as i64).max(0) as u64;
                    if n < 0 && (target < r.shown || r.seek.is_some()) {
                        r.seek = Some((target, false));
                    } else if let Some(seek) = &mut r.seek {
                        seek.0 = target;
                    }
                    let mut fx = Effects::default();
                    if !r.paused {
                        r.paused = true;
                        fx.requests
                            .push(UiRequest::Replay(ReplayControl::SetPaused(true)));
                    }
                    fx.requests.push(UiRequest::Replay(ReplayControl::Step(n)));
                    return fx;
                }
            }
            Action::ReplaySpeed(dir) => {
                if let Some(r) = &mut self.replay {
                    r.speed = if dir > 0 {
                        r.speed * 2.0
                    } else {
                        r.speed / 2.0
                    }
                    .clamp(0.125, 64.0);
                    let s = r.speed;
                    self.say(format!("replay speed {}", fmt_speed(s)));
                    return Effects::req(UiRequest::Replay(ReplayControl::SetSpeed(s)));
                }
            }
            _ => {}
        }
        Effects::default()
    }

    /// Editing the input box: characters, cursor moves, deletion, history.
    fn on_edit_action(&mut self, a: Action) -> Effects {
        match a {
            Action::Insert(c) => self.input.insert(c),
            Action::Newline => self.input.insert('\n'),
            Action::Backspace => self.input.backspace(),
            Action::Delete => self.input.delete(),
            Action::CursorLeft => self.input.left(),
            Action::CursorRight => self.input.right(),
            Action::CursorHome => self.input.home(),
            Action::CursorEnd => self.input.end(),
            Action::ClearInput => {
                self.input.take();
            }
            Action::HistoryPrev => self.input.history_prev(),
            Action::HistoryNext => self.input.history_next(),
            _ => {}
        }
        Effects::default()
    }

    fn page(&self) -> u16 {
        (self.size.1 / 2).max(3)
    }

    fn quit(&mut self) -> Effects {
        self.quit = true;
        Effects {
            commands: vec![Command::Quit],
            requests: vec![UiRequest::Quit],
        }
    }

    fn submit(&mut self) -> Effects {
        if self.input.text.trim().is_empty() {
            return Effects::default();
        }
        if self.replay.is_some() {
            self.say("replay: no engine to talk to");
            return Effects::default();
        }
        if self.generating {
            self.say("still generating — Esc stops it");
            return Effects::default();
        }
        let text = self.input.take();
        if self.input.history.last() != Some(&text) {
            self.input.history.push(text.clone());
        }
        self.scroll = 0;
        // During the reply keys are commands (a toggle is never typed into the next prompt);
        // `i` types a draft, and the input takes the keys back when the reply ends.
        self.input_focused = false;
        self.refocus_after_reply = true;
        let max_tokens = self.max_tokens;
        Effects::cmd(if self.chat_mode() {
            Command::Chat { text, max_tokens }
        } else {
            Command::Complete { text, max_tokens }
        })
    }

    /// Start or stop A/B auto on [`App::ab_focus`].
    fn toggle_ab_auto(&mut self) {
        if let Some(a) = self.ab_auto.take() {
            self.say(format!("A/B auto stopped ({} blocks)", a.blocks));
            return;
        }
        if self.replay.is_some() {
            self.say("replay: A/B auto needs a live engine");
            return;
        }
        let Some(cfg) = self.live.config.as_ref() else {
            self.say("no engine session yet");
            return;
        };
        let t = self.ab_focus;
        if let Some(why) = self.not_an_ab(t) {
            self.say(format!("A/B auto refused: {why}"));
            return;
        }
        let Some(now) = self.live.current_setting() else {
            return;
        };
        let cur = now.arm(t);
        let other = match cur {
            Some(Arm::Layout(l)) => {
                let at = LAYOUTS.iter().position(|&x| x == l).unwrap_or(0);
                (1..LAYOUTS.len())
                    .map(|i| LAYOUTS[(at + i) % LAYOUTS.len()])
                    .find(|l| cfg.layouts_available.contains(l))
                    .map(Arm::Layout)
            }
            _ => t.order().iter().copied().find(|&a| Some(a) != cur),
        };
        let (Some(cur), Some(other)) = (cur, other) else {
            self.say(format!("A/B auto: no other {} available", t.name()));
            return;
        };
        self.say(format!(
            "A/B auto: {} {cur} ⇄ {other} every {AUTO_BLOCK} tokens — a stops",
            t.name()
        ));
        self.ab_auto = Some(AutoAb::new(cur, other, AUTO_BLOCK));
    }

    /// Advance A/B auto after a measured token: the toggle command when a block ends.
    fn ab_auto_step(&mut self) -> Effects {
        // The token just measured, keyed by what the engine reports it ran.
        let ran = self
            .live
            .last
            .as_ref()
            .and_then(|s| Setting::of_stats(s, self.live.config.as_ref()));
        let (Some(auto), Some(ran)) = (self.ab_auto.as_mut(), ran) else {
            return Effects::default();
        };
        let t = auto.toggle;
        let half = self.live.ab.estimate(t).map(|e| e.half_width());
        match auto.on_token(&ran, half) {
            AutoStep::Continue => Effects::default(),
            AutoStep::Done(m) => {
                self.ab_auto = None;
                self.say(m);
                Effects::default()
            }
            AutoStep::Switch(arm) => {
                let blocks = auto.blocks;
                self.say(format!(
                    "A/B auto: {} → {arm} (block {}){}",
                    t.name(),
                    blocks + 1,
                    half.map_or(String::new(), |h| format!(", ±{:.1}%", 100.0 * h))
                ));
                Effects::cmd(arm.command())
            }
        }
    }

    /// True (and says why) when `t` does nothing on this model: the fetch mode and the expert
    /// tier on a model without experts. Nothing is sent, so nothing is recorded.
    fn refuse_without_experts(&mut self, t: Toggle) -> bool {
        let dense = self.live.model.as_ref().is_some_and(|m| m.n_experts == 0);
        if dense {
            self.say(format!(
                "{}: this model has no experts — {} does nothing here (nothing sent, nothing recorded)",
                t.name(),
                t.key()
            ));
        }
        dense
    }

    /// A note for a toggle that is accepted but has no effect in the current setting.
    fn inert_note(&self, t: Toggle) -> &'static str {
        let Some(c) = self.live.config.as_ref() else {
            return "";
        };
        let moe = self.live.has_experts();
        match t {
            Toggle::Prefetch if c.layout == Layout::RowMajor => {
                " — no effect under rowmajor: it sends no prefetch hints"
            }
            Toggle::Fetch if moe && c.expert_tier == ExpertTier::Mmap => {
                " — no effect on tier mmap: the experts are read from memory"
            }
            Toggle::Fetch | Toggle::Tier if moe && c.layout == Layout::RowMajor => {
                " — no effect under rowmajor: its experts come from the in-memory copy"
            }
            _ => "",
        }
    }

    /// Why an A/B of `t` cannot be run in the current setting (A/B auto refuses it).
    fn not_an_ab(&self, t: Toggle) -> Option<String> {
        let c = self.live.config.as_ref()?;
        let moe = self.live.has_experts();
        let dense = self.live.model.as_ref().is_some_and(|m| m.n_experts == 0);
        match t {
            Toggle::Fetch | Toggle::Tier if dense => Some(format!(
                "this model has no experts: {} does nothing",
                t.name()
            )),
            Toggle::Layout if moe && c.expert_tier == ExpertTier::Direct => Some(
                "rowmajor's experts come from memory, not disk (tier direct) — t → mmap".into(),
            ),
            Toggle::Layout if c.prefetch => Some(
                "rowmajor sends no prefetch hints, cflow does — p → off for a layout A/B".into(),
            ),
            Toggle::Prefetch | Toggle::Fetch | Toggle::Tier
                if c.layout == Layout::RowMajor && (moe || t == Toggle::Prefetch) =>
            {
                Some(format!("{} has no effect under rowmajor", t.name()))
            }
            Toggle::Fetch if c.expert_tier == ExpertTier::Mmap => {
                Some("fetch has no effect on tier mmap (t → direct first)".into())
            }
            _ => None,
        }
    }

    fn cycle_layout(&mut self) -> Effects {
        let Some(cfg) = self.live.config.as_ref() else {
            return Effects::default();
        };
        let cur = LAYOUTS.iter().position(|&l| l == cfg.layout).unwrap_or(0);
        let mut skipped = Vec::new();
        for i in 1..LAYOUTS.len() {
            let cand = LAYOUTS[(cur + i) % LAYOUTS.len()];
            if cfg.layouts_available.contains(&cand) {
                let mut m = format!("layout → {cand} (next token)");
                if cand == Layout::RowMajor
                    && self.live.has_experts()
                    && cfg.expert_tier == ExpertTier::Direct
                {
                    m.push_str(" — its experts come from memory, not disk");
                }
                if !skipped.is_empty() {
                    m.push_str(&format!("; skipped {} (unavailable)", skipped.join(", ")));
                }
                self.say(m);
                return Effects::cmd(Command::SetLayout(cand));
            }
            skipped.push(cand.name());
        }
        let m = format!(
            "no other layout available (current {}; {} unavailable)",
            cfg.layout,
            skipped.join(", ")
        );
        self.say(m);
        Effects::default()
    }
}

/// "2×", "0.5×", "0.125×".
pub fn fmt_speed(s: f64) -> String {
    let t = format!("{s:.3}");
    let t = t.trim_end_matches('0').trim_end_matches('.');
    format!("{t}×")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tui::fixture::{demo_config, demo_events, dense_events};

    fn app_with(events: Vec<Stamped>) -> App {
        let mut app = App::default();
        for e in events {
            app.apply(Msg::Stamped(e));
        }
        app
    }

    fn act(app: &mut App, a: Action) -> Effects {
        app.apply(Msg::Action(a))
    }

    #[test]
    fn events_build_transcript_and_stats() {
        let app = app_with(demo_events(20, true));
        assert!(!app.generating);
        assert_eq!(app.transcript.len(), 2);
        assert_eq!(app.transcript[0].role, Role::User);
        assert_eq!(app.transcript[0].text, "Once upon a time");
        assert_eq!(app.transcript[1].end, Some(StopReason::Length));
        assert!(!app.transcript[1].text.is_empty());
        let v = app.view();
        assert_eq!(v.tokens_seen, 20);
        assert_eq!(v.recent.len(), 20);
        assert_eq!(v.ctx_used, 24);
        assert!(v.prefill_tps.unwrap() > 600.0);
        assert!(v.decode_tps.unwrap() > 0.0);
        let f = v.ab.view(Toggle::Fetch);
        assert_eq!(f.arms, vec![("sync".into(), 10), ("staged".into(), 10)]);
        // One run of 10 tokens per arm: one block each (after the warm-up token), too few.
        assert_eq!(
            v.ab.view(Toggle::Fetch).verdict,
            crate::telemetry::ab::Verdict::TooFew {
                a: "sync".into(),
                b: "staged".into(),
                n_a: 1,
                n_b: 1
            }
        );
        assert_eq!(v.ab.view(Toggle::Prefetch).arms.len(), 1);
        assert!(v.ab.estimate(Toggle::Prefetch).is_none());
    }

    #[test]
    fn generating_flag_and_streaming_tokens() {
        let app = app_with(demo_events(5, false));
        assert!(app.generating);
        let app2 = app_with(dense_events());
        assert!(app2.chat_mode());
        assert!(app2.generating);
        assert_eq!(app2.transcript.len(), 4);
        assert_eq!(app2.transcript[1].text, "The capital of France is Paris.");
        assert_eq!(app2.transcript[3].text, "The capital of Italy is");
    }

    #[test]
    fn a_refused_prompt_ends_the_turn_and_the_engine_count_fixes_the_gauge() {
        // What the session emits for a prompt that does not fit: Prompt, Error, Done.
        let mut app = app_with(demo_events(4, true));
        let before = app.view().ctx_used;
        for e in [
            Event::Prompt {
                text: "long".into(),
                tokens: vec![1; 5000],
                chat: false,
            },
            Event::Error {
                message: "prompt of 5000 tokens does not fit".into(),
                fatal: false,
            },
            Event::Done {
                reason: StopReason::ContextFull,
                n_tokens: 0,
                decode_ns: 0,
                pos: Some(before),
                ttft_ns: None,
            },
        ] {
            app.apply(Msg::Event(e));
        }
        assert!(!app.generating);
        assert_eq!(app.view().ctx_used, before);
        assert!(app.status_message().is_some_and(|m| m.contains("Ctrl+L")));
        // The next prompt is accepted (not "still generating").
        act(&mut app, Action::Insert('x'));
        let fx = act(&mut app, Action::Submit);
        assert_eq!(fx.commands.len(), 1, "{:?}", app.status_message());
    }

    #[test]
    fn a_reset_clears_the_stale_context_full_message() {
        // After Ctrl+L the "context full" message must go.
        let mut app = app_with(demo_events(4, true));
        app.apply(Msg::Event(Event::Done {
            reason: StopReason::ContextFull,
            n_tokens: 3,
            decode_ns: 1_000_000,
            pos: Some(2048),
            ttft_ns: None,
        }));
        assert!(app
            .status_message()
            .is_some_and(|m| m.starts_with("context full")));
        app.apply(Msg::Event(Event::Reset));
        assert_eq!(app.status_message(), None);
    }

    #[test]
    fn window_is_bounded() {
        let app = app_with(demo_events(WINDOW as u32 + 10, true));
        assert_eq!(app.live.recent.len(), WINDOW);
        assert_eq!(app.live.recent.back().unwrap().index, WINDOW as u32 + 9);
    }

    #[test]
    fn session_resets_state() {
        let mut app = app_with(demo_events(8, true));
        app.apply(Msg::Stamped(demo_events(0, false).remove(0)));
        assert!(app.transcript.is_empty());
        assert_eq!(app.live.tokens_seen, 0);
        assert!(app.live.model.is_some());
    }

    #[test]
    fn toggles_emit_commands() {
        let mut app = app_with(demo_events(4, true));
        assert_eq!(
            act(&mut app, Action::TogglePrefetch).commands,
            vec![Command::SetPrefetch(true)]
        );
        // Config is now sync (fixture toggled mid-run).
        assert_eq!(
            act(&mut app, Action::ToggleFetch).commands,
            vec![Command::SetFetch(FetchMode::Staged)]
        );
        assert_eq!(
            act(&mut app, Action::ToggleTier).commands,
            vec![Command::SetExpertTier(ExpertTier::Mmap)]
        );
    }

    /// `s` and `t` on a dense model do nothing; they say so and send (record) nothing.
    #[test]
    fn fetch_and_tier_on_a_dense_model_say_so_and_send_nothing() {
        let mut app = app_with(dense_events());
        app.apply(Msg::Event(Event::Done {
            reason: StopReason::Eos,
            n_tokens: 5,
            decode_ns: 1,
            pos: None,
            ttft_ns: None,
        }));
        for (a, name) in [(Action::ToggleFetch, "fetch"), (Action::ToggleTier, "tier")] {
            let fx = act(&mut app, a);
            assert!(fx.is_empty(), "{a:?}: {fx:?}");
            let m = app.status_message().unwrap();
            assert!(m.starts_with(name) && m.contains("no experts"), "{m}");
        }
        // A/B auto on them is refused too.
        app.ab_focus = Toggle::Tier;
        act(&mut app, Action::AbAuto);
        assert!(app.ab_auto.is_none());
        assert!(app.status_message().unwrap().contains("no experts"));
    }

    /// On the direct tier rowmajor reads the experts from memory: `l` says so and A/B
    /// auto refuses a layout A/B there, with the reason.
    #[test]
    fn a_layout_ab_on_the_direct_tier_is_refused_with_the_reason() {
        let mut app = app_with(demo_events(4, true));
        let fx = act(&mut app, Action::CycleLayout);
        assert_eq!(fx.commands, vec![Command::SetLayout(Layout::RowMajor)]);
        let m = app.status_message().unwrap();
        assert!(m.contains("experts come from memory, not disk"), "{m}");
        act(&mut app, Action::AbAuto);
        assert!(app.ab_auto.is_none());
        let m = app.status_message().unwrap();
        assert!(
            m.contains("A/B auto refused") && m.contains("t → mmap"),
            "{m}"
        );
        // On the mmap tier it runs.
        let mut cfg = demo_config(FetchMode::Staged);
        cfg.expert_tier = ExpertTier::Mmap;
        app.apply(Msg::Event(Event::Config(cfg)));
        act(&mut app, Action::AbAuto);
        assert!(app.ab_auto.is_some(), "{:?}", app.status_message());
    }

    #[test]
    fn v_switches_the_schedule_both_ways() {
        let mut app = app_with(demo_events(4, true));
        for want in [Schedule::Vertical, Schedule::Sequential, Schedule::Vertical] {
            let fx = act(&mut app, Action::ToggleSchedule);
            assert_eq!(fx.commands, vec![Command::SetSchedule(want)]);
        }
    }

    #[test]
    fn layout_cycle_skips_unavailable() {
        let mut app = app_with(demo_events(2, true));
        let fx = act(&mut app, Action::CycleLayout);
        assert_eq!(fx.commands, vec![Command::SetLayout(Layout::RowMajor)]);
        assert!(app.status_message().unwrap().contains("skipped vflow"));
        let mut cfg = demo_config(FetchMode::Staged);
        cfg.layouts_available = vec![Layout::Cflow];
        app.apply(Msg::Event(Event::Config(cfg)));
        let fx = act(&mut app, Action::CycleLayout);
        assert!(fx.commands.is_empty());
        assert!(app.status_message().unwrap().contains("no other layout"));
    }

    #[test]
    fn submit_sends_complete_or_chat_and_keeps_history() {
        let mut app = app_with(demo_events(2, true));
        for c in "hello".chars() {
            act(&mut app, Action::Insert(c));
        }
        let fx = act(&mut app, Action::Submit);
        assert_eq!(
            fx.commands,
            vec![Command::Complete {
                text: "hello".into(),
                max_tokens: 256
            }]
        );
        assert!(app.input.text.is_empty());
        act(&mut app, Action::HistoryPrev);
        assert_eq!(app.input.text, "hello");
        act(&mut app, Action::HistoryNext);
        assert_eq!(app.input.text, "");

        let mut chat = App::default();
        for e in dense_events() {
            chat.apply(Msg::Stamped(e));
        }
        chat.apply(Msg::Event(Event::Done {
            reason: StopReason::Eos,
            n_tokens: 5,
            decode_ns: 1,
            pos: None,
            ttft_ns: None,
        }));
        act(&mut chat, Action::Insert('a'));
        act(&mut chat, Action::Newline);
        act(&mut chat, Action::Insert('b'));
        assert_eq!(chat.input.cursor_line_col(), (1, 1));
        let fx = act(&mut chat, Action::Submit);
        assert_eq!(
            fx.commands,
            vec![Command::Chat {
                text: "a\nb".into(),
                max_tokens: 256
            }]
        );
    }

    #[test]
    fn submit_refused_while_generating() {
        let mut app = app_with(demo_events(2, false));
        act(&mut app, Action::Insert('x'));
        assert!(act(&mut app, Action::Submit).is_empty());
        assert_eq!(app.input.text, "x");
    }

    #[test]
    fn escape_only_leaves_the_input_and_a_second_escape_stops() {
        // Esc leaves the input without stopping the generation.
        let mut app = app_with(demo_events(3, false));
        assert!(app.input_focused);
        let fx = act(&mut app, Action::Escape);
        assert!(fx.commands.is_empty(), "{fx:?}");
        assert!(!app.input_focused);
        assert_eq!(act(&mut app, Action::Escape).commands, vec![Command::Stop]);
        act(&mut app, Action::FocusInput);
        assert!(app.input_focused);
        assert_eq!(app.focus, PaneId::Text);
    }

    #[test]
    fn during_a_reply_toggle_keys_are_not_typed_into_the_prompt() {
        // `p` during a reply toggles prefetch, not the prompt.
        use crate::tui::keymap::{resolve, KeyState};
        use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
        let mut app = app_with(demo_events(3, true));
        act(&mut app, Action::Insert('x'));
        assert!(!act(&mut app, Action::Submit).is_empty());
        let p = KeyEvent::new(KeyCode::Char('p'), KeyModifiers::NONE);
        assert_eq!(
            resolve(&p, KeyState::of(&app)),
            Some(Action::TogglePrefetch)
        );
        // The reply ends with no key pressed meanwhile: the input has the keys again.
        app.apply(Msg::Event(Event::Done {
            reason: StopReason::Eos,
            n_tokens: 2,
            decode_ns: 1_000,
            pos: Some(40),
            ttft_ns: None,
        }));
        assert!(app.input_focused);
        assert_eq!(resolve(&p, KeyState::of(&app)), Some(Action::Insert('p')));
        // A key pressed during the reply (Tab to a pane, a toggle): the panes keep the keys.
        act(&mut app, Action::Insert('y'));
        assert!(!act(&mut app, Action::Submit).is_empty());
        act(&mut app, Action::TogglePrefetch);
        app.apply(Msg::Event(Event::Done {
            reason: StopReason::Eos,
            n_tokens: 2,
            decode_ns: 1_000,
            pos: Some(44),
            ttft_ns: None,
        }));
        assert!(!app.input_focused);
    }

    #[test]
    fn ctrl_c_stops_first_then_quits() {
        let mut app = app_with(demo_events(3, false));
        assert_eq!(
            act(&mut app, Action::Interrupt).commands,
            vec![Command::Stop]
        );
        assert!(!app.quit);
        let fx = act(&mut app, Action::Interrupt);
        assert!(app.quit);
        assert_eq!(fx.requests, vec![UiRequest::Quit]);
        let mut idle = app_with(demo_events(3, true));
        act(&mut idle, Action::Interrupt);
        assert!(idle.quit);
    }

    #[test]
    fn record_emits_requests() {
        let mut app = App::default();
        assert_eq!(
            act(&mut app, Action::Record).requests,
            vec![UiRequest::StartRecording]
        );
        assert!(app.recording);
        assert_eq!(
            act(&mut app, Action::Record).requests,
            vec![UiRequest::StopRecording]
        );
    }

    /// `r` in a read-only directory: the engine says it cannot record and the REC
    /// badge goes off (it stayed on).
    #[test]
    fn a_failed_recording_turns_the_rec_badge_off() {
        let mut app = app_with(demo_events(2, true));
        act(&mut app, Action::Record);
        assert!(app.recording);
        app.apply(Msg::Event(Event::Error {
            message: "cannot record: /ro/cflow-x.trace.jsonl: Permission denied (os error 13)"
                .into(),
            fatal: false,
        }));
        assert!(!app.recording);
        // `r` again starts a new attempt (not a stop).
        assert_eq!(
            act(&mut app, Action::Record).requests,
            vec![UiRequest::StartRecording]
        );
        app.apply(Msg::Event(Event::Error {
            message: "recording stopped: No space left on device (the trace keeps every line written so far)".into(),
            fatal: false,
        }));
        assert!(!app.recording);
    }

    #[test]
    fn freeze_keeps_applying_to_live() {
        let evs = demo_events(10, true);
        let mut app = app_with(evs[..12].to_vec());
        act(&mut app, Action::Freeze);
        let frozen_seen = app.view().tokens_seen;
        for e in evs[12..].iter().cloned() {
            app.apply(Msg::Stamped(e));
        }
        assert_eq!(app.view().tokens_seen, frozen_seen);
        assert_eq!(app.live.tokens_seen, 10);
        act(&mut app, Action::Freeze);
        assert_eq!(app.view().tokens_seen, 10);
    }

    #[test]
    fn focus_cycles_and_leaves_input() {
        let mut app = App::default();
        act(&mut app, Action::FocusNext);
        assert!(!app.input_focused);
        assert_eq!(app.focus, PaneId::Streams);
        act(&mut app, Action::FocusPrev);
        act(&mut app, Action::FocusPrev);
        assert_eq!(app.focus, PaneId::Ab);
        act(&mut app, Action::Maximize);
        assert!(app.maximized);
        act(&mut app, Action::Escape);
        assert!(!app.maximized);
    }

    #[test]
    fn whatif_changes_delays_hypothetically() {
        let mut app = app_with(demo_events(2, true));
        act(&mut app, Action::WhatIf);
        assert_eq!(app.whatif, Some((1, 2)));
        assert_eq!(app.focus, PaneId::Critical);
        act(&mut app, Action::WhatIfDense(1));
        act(&mut app, Action::WhatIfExpert(-1));
        act(&mut app, Action::WhatIfExpert(-1));
        act(&mut app, Action::WhatIfExpert(-1));
        assert_eq!(app.whatif, Some((2, 0)));
        assert_eq!(app.live.delays(), (1, 2));
        act(&mut app, Action::WhatIf);
        assert_eq!(app.whatif, None);
    }

    #[test]
    fn a_replay_does_not_show_the_recorded_runs_recording_notice() {
        // A replay must not show "recording to …" from the run it replays.
        let notice = || {
            Msg::Event(Event::Notice {
                message: "recording to /tmp/x.trace.jsonl".into(),
            })
        };
        let mut replay = App::new(&TuiOptions {
            replay: true,
            ..TuiOptions::default()
        });
        replay.apply(notice());
        assert_eq!(replay.status_message(), None);
        let mut live = App::new(&TuiOptions::default());
        live.apply(notice());
        assert!(live.status_message().is_some());
    }

    #[test]
    fn replay_controls() {
        let mut app = App::new(&TuiOptions {
            replay: true,
            ..TuiOptions::default()
        });
        assert!(!app.input_focused);
        assert_eq!(
            act(&mut app, Action::ReplayPause).requests,
            vec![UiRequest::Replay(ReplayControl::SetPaused(true))]
        );
        assert_eq!(
            act(&mut app, Action::ReplayStep(1)).requests,
            vec![UiRequest::Replay(ReplayControl::Step(1))]
        );
        act(&mut app, Action::ReplayPause);
        let fx = act(&mut app, Action::ReplayStep(-1));
        assert_eq!(
            fx.requests,
            vec![
                UiRequest::Replay(ReplayControl::SetPaused(true)),
                UiRequest::Replay(ReplayControl::Step(-1))
            ]
        );
        assert_eq!(
            act(&mut app, Action::ReplaySpeed(1)).requests,
            vec![UiRequest::Replay(ReplayControl::SetSpeed(2.0))]
        );
        for e in demo_events(2, true) {
            app.apply(Msg::Stamped(e));
        }
        assert!(act(&mut app, Action::TogglePrefetch).commands.is_empty());
        assert!(app.replay.unwrap().t_ns > 0);
    }

    /// ← re-plays the trace from its start; until it reaches the wanted token the app
    /// is `seeking` (the host does not draw the intermediate tokens), and held-key steps add up.
    #[test]
    fn a_backward_step_is_seeking_until_the_wanted_token() {
        let evs = demo_events(6, true);
        let mut app = App::new(&TuiOptions {
            replay: true,
            ..TuiOptions::default()
        });
        for e in evs.iter().cloned() {
            app.apply(Msg::Stamped(e));
        }
        assert_eq!(app.replay.unwrap().shown, 6);
        assert!(!app.seeking());
        act(&mut app, Action::ReplayStep(-1));
        act(&mut app, Action::ReplayStep(-1));
        assert!(app.seeking());
        assert_eq!(app.replay.unwrap().seek, Some((4, false)));
        // The player's rewind: from the start up to (not including) the 5th token.
        let mut tokens = 0;
        for e in evs.iter().cloned() {
            if matches!(e.event, Event::Token { .. }) {
                if tokens == 4 {
                    break;
                }
                tokens += 1;
            }
            assert!(app.seeking() || tokens == 4, "drawn at token {tokens}");
            app.apply(Msg::Stamped(e));
        }
        assert!(!app.seeking());
        assert_eq!(app.replay.unwrap().shown, 4);
    }

    /// First launch: the bandwidth probe runs in the background; its result replaces
    /// "measuring…" and is announced once.
    #[test]
    fn the_background_probe_result_lands_in_the_app() {
        let mut app = App::new(&TuiOptions {
            bandwidth_pending: true,
            ..TuiOptions::default()
        });
        assert!(app.bandwidth_pending && app.bandwidth.is_none());
        app.apply(Msg::Bandwidth(Some(crate::tui::fixture::demo_bandwidth())));
        assert!(!app.bandwidth_pending);
        assert!(app.bandwidth.is_some());
        assert!(
            app.status_message()
                .is_some_and(|m| m.starts_with("read ceiling measured:")),
            "{:?}",
            app.status_message()
        );
        let mut app = App::new(&TuiOptions {
            bandwidth_pending: true,
            ..TuiOptions::default()
        });
        app.apply(Msg::Bandwidth(None));
        assert!(!app.bandwidth_pending && app.bandwidth.is_none());
    }

    #[test]
    fn messages_expire() {
        let mut app = app_with(demo_events(2, true));
        act(&mut app, Action::TogglePrefetch);
        assert!(app.status_message().is_some());
        for _ in 0..MESSAGE_TICKS {
            app.apply(Msg::Tick);
        }
        assert!(app.status_message().is_none());
    }

    #[test]
    fn scroll_and_config_change_notice() {
        let mut app = app_with(demo_events(2, true));
        act(&mut app, Action::ScrollUp(3));
        act(&mut app, Action::PageUp);
        assert_eq!(app.scroll, 3 + 12);
        act(&mut app, Action::ScrollEnd);
        assert_eq!(app.scroll, 0);
        let mut cfg = demo_config(FetchMode::Sync);
        cfg.prefetch = true;
        cfg.notes = vec!["O_DIRECT refused: buffered pread".into()];
        app.apply(Msg::Event(Event::Config(cfg)));
        let m = app.status_message().unwrap();
        assert!(m.contains("prefetch ON") && m.contains("O_DIRECT"), "{m}");
    }
}
