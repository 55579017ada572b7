//! The one keymap table: key → [`Action`], per context.
//!
//! Everything that shows keys (the `?` help overlay, the footer hints) is generated from
//! [`BINDINGS`], so the documentation cannot drift from the real bindings. Resolution order:
//! help-overlay keys, then `Global` bindings (F-keys, Alt+letter, Ctrl+C/Z, Tab, PgUp/PgDn — they
//! work everywhere, including while typing), then `Input` bindings and plain typing while the input
//! box has focus, otherwise `WhatIf`, `Replay` and `Nav` (single-letter) bindings.

use ratatui::crossterm::event::{
    KeyCode, KeyEvent, KeyEventKind, KeyModifiers, MouseEvent, MouseEventKind,
};

use super::app::{Action, App};

/// When a binding is active.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ctx {
    /// Always (also while typing in the input box).
    Global,
    /// While the input box has focus.
    Input,
    /// While the input box does not have focus.
    Nav,
    /// In what-if mode (and input not focused).
    WhatIf,
    /// When replaying (and input not focused).
    Replay,
    /// While the chat settings overlay is open (typing goes to the field).
    Settings,
}

impl Ctx {
    /// Heading in the help overlay.
    pub fn heading(self) -> &'static str {
        match self {
            Ctx::Global => "everywhere",
            Ctx::Input => "input box",
            Ctx::Nav => "panes (input not focused)",
            Ctx::WhatIf => "what-if mode",
            Ctx::Replay => "replay",
            Ctx::Settings => "chat settings (o)",
        }
    }
}

/// A key with modifiers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Key {
    pub code: KeyCode,
    pub mods: KeyModifiers,
}

const fn k(code: KeyCode) -> Key {
    Key {
        code,
        mods: KeyModifiers::NONE,
    }
}
const fn ch(c: char) -> Key {
    k(KeyCode::Char(c))
}
const fn ctrl(c: char) -> Key {
    Key {
        code: KeyCode::Char(c),
        mods: KeyModifiers::CONTROL,
    }
}
const fn alt(c: char) -> Key {
    Key {
        code: KeyCode::Char(c),
        mods: KeyModifiers::ALT,
    }
}
const fn f(n: u8) -> Key {
    k(KeyCode::F(n))
}

impl Key {
    /// Human-readable name ("F1", "Alt+p", "Ctrl+C", "Shift+Tab", "←").
    pub fn label(&self) -> String {
        let base = match self.code {
            KeyCode::Char(' ') => "Space".to_string(),
            KeyCode::Char(c) if self.mods.contains(KeyModifiers::CONTROL) => {
                c.to_ascii_uppercase().to_string()
            }
            KeyCode::Char(c) => c.to_string(),
            KeyCode::F(n) => format!("F{n}"),
            KeyCode::Enter => "Enter".into(),
            KeyCode::Esc => "Esc".into(),
            KeyCode::Tab => "Tab".into(),
            KeyCode::BackTab => "Shift+Tab".into(),
            KeyCode::Backspace => "Bksp".into(),
            KeyCode::Delete => "Del".into(),
            KeyCode::Left => "←".into(),
            KeyCode::Right => "→".into(),
            KeyCode::Up => "↑".into(),
            KeyCode::Down => "↓".into(),
            KeyCode::Home => "Home".into(),
            KeyCode::End => "End".into(),
            KeyCode::PageUp => "PgUp".into(),
            KeyCode::PageDown => "PgDn".into(),
            other => format!("{other:?}"),
        };
        let mut s = String::new();
        if self.mods.contains(KeyModifiers::CONTROL) {
            s.push_str("Ctrl+");
        }
        if self.mods.contains(KeyModifiers::ALT) {
            s.push_str("Alt+");
        }
        s + &base
    }
}

/// One row of the keymap.
#[derive(Clone, Copy, Debug)]
pub struct Binding {
    pub keys: &'static [Key],
    pub action: Action,
    pub ctx: Ctx,
    pub help: &'static str,
    /// Short footer label (None = not in the footer).
    pub footer: Option<&'static str>,
}

const fn b(
    keys: &'static [Key],
    action: Action,
    ctx: Ctx,
    help: &'static str,
    footer: Option<&'static str>,
) -> Binding {
    Binding {
        keys,
        action,
        ctx,
        help,
        footer,
    }
}

/// The keymap. Order matters inside a context (first match wins) and is the help order.
/// Bindings with an empty `help` are listed together on one "editing" line of the overlay.
#[rustfmt::skip]
pub const BINDINGS: &[Binding] = &[
    // --- everywhere ---
    b(&[f(1), alt('?'), alt('h')], Action::Help, Ctx::Global, "help overlay", Some("help")),
    b(&[f(2), alt('p')], Action::TogglePrefetch, Ctx::Global, "prefetch on/off (A/B)", Some("prefetch")),
    b(&[f(3), alt('s')], Action::ToggleFetch, Ctx::Global, "expert fetch staged/sync (A/B)", Some("fetch")),
    b(&[f(4), alt('l')], Action::CycleLayout, Ctx::Global, "layout cflow → vflow → rowmajor", Some("layout")),
    b(&[f(5), alt('t')], Action::ToggleTier, Ctx::Global, "expert tier mmap/direct", Some("tier")),
    b(&[alt('a')], Action::AbAuto, Ctx::Global, "A/B auto: interleave the last toggle's arms", Some("A/B auto")),
    b(&[f(6), alt('w')], Action::WhatIf, Ctx::Global, "what-if delays (critical path)", Some("what-if")),
    b(&[f(7), alt('f')], Action::Freeze, Ctx::Global, "freeze panes (data keeps coming)", Some("freeze")),
    b(&[f(8), alt('z')], Action::Maximize, Ctx::Global, "maximize focused pane", Some("zoom")),
    b(&[f(9), alt('r')], Action::Record, Ctx::Global, "start/stop recording", Some("rec")),
    b(&[f(10), alt('q')], Action::Quit, Ctx::Global, "quit", Some("quit")),
    b(&[f(11), alt('m')], Action::ModelInfo, Ctx::Global, "model info (what inspect shows)", Some("info")),
    b(&[f(12), alt('g')], Action::Timeline, Ctx::Global, "view under the text on/off", None),
    b(&[alt('c')], Action::CycleView, Ctx::Global, "view under the text: timeline → heatmap → roofline", None),
    b(&[ctrl('c')], Action::Interrupt, Ctx::Global, "stop generation, again to quit", None),
    b(&[ctrl('z')], Action::Suspend, Ctx::Global, "suspend (fg to resume)", None),
    b(&[ctrl('l'), alt('x')], Action::ResetContext, Ctx::Global, "reset context (clear KV)", None),
    b(&[k(KeyCode::Tab)], Action::FocusNext, Ctx::Global, "next pane (leaves input)", None),
    b(&[k(KeyCode::BackTab)], Action::FocusPrev, Ctx::Global, "previous pane", None),
    b(&[k(KeyCode::PageUp)], Action::PageUp, Ctx::Global, "scroll transcript up", None),
    b(&[k(KeyCode::PageDown)], Action::PageDown, Ctx::Global, "scroll transcript down", None),
    b(&[alt('o')], Action::OpenSettings, Ctx::Global, "chat settings: sampling, system prompt", None),
    b(&[ctrl('s')], Action::SaveTranscript, Ctx::Global, "save the transcript (Markdown)", None),
    b(&[alt('y')], Action::CopyReply, Ctx::Global, "copy the last reply (OSC 52)", None),
    b(&[alt('M')], Action::ToggleMouse, Ctx::Global, "release/capture the mouse (terminal selection)", None),
    // --- input box ---
    b(&[k(KeyCode::Enter)], Action::Submit, Ctx::Input, "send", None),
    b(
        &[
            Key {
                code: KeyCode::Enter,
                mods: KeyModifiers::ALT,
            },
            ctrl('j'),
        ],
        Action::Newline,
        Ctx::Input,
        "new line",
        None,
    ),
    b(&[k(KeyCode::Esc)], Action::Escape, Ctx::Input, "leave input (Esc again stops a generation)", None),
    b(&[k(KeyCode::Up)], Action::HistoryPrev, Ctx::Input, "previous prompt", None),
    b(&[k(KeyCode::Down)], Action::HistoryNext, Ctx::Input, "next prompt", None),
    b(&[k(KeyCode::Backspace)], Action::Backspace, Ctx::Input, "", None),
    b(&[k(KeyCode::Delete)], Action::Delete, Ctx::Input, "", None),
    b(&[k(KeyCode::Left)], Action::CursorLeft, Ctx::Input, "", None),
    b(&[k(KeyCode::Right)], Action::CursorRight, Ctx::Input, "", None),
    b(&[k(KeyCode::Home), ctrl('a')], Action::CursorHome, Ctx::Input, "", None),
    b(&[k(KeyCode::End), ctrl('e')], Action::CursorEnd, Ctx::Input, "", None),
    b(&[ctrl('u')], Action::ClearInput, Ctx::Input, "clear input", None),
    // --- what-if mode ---
    b(&[ch('d')], Action::WhatIfDense(-1), Ctx::WhatIf, "δd − 1 (model)", None),
    b(&[ch('D')], Action::WhatIfDense(1), Ctx::WhatIf, "δd + 1 (model)", None),
    b(&[ch('e')], Action::WhatIfExpert(-1), Ctx::WhatIf, "δe − 1 (model)", None),
    b(&[ch('E')], Action::WhatIfExpert(1), Ctx::WhatIf, "δe + 1 (model)", None),
    // --- replay ---
    b(&[ch(' ')], Action::ReplayPause, Ctx::Replay, "pause / resume", None),
    b(&[k(KeyCode::Right)], Action::ReplayStep(1), Ctx::Replay, "step one token", None),
    b(&[k(KeyCode::Left)], Action::ReplayStep(-1), Ctx::Replay, "step back one token", None),
    b(&[ch('+'), ch('=')], Action::ReplaySpeed(1), Ctx::Replay, "faster (×2)", None),
    b(&[ch('-')], Action::ReplaySpeed(-1), Ctx::Replay, "slower (÷2)", None),
    // --- chat settings overlay ---
    b(&[k(KeyCode::Up)], Action::SettingsMove(-1), Ctx::Settings, "previous field", None),
    b(&[k(KeyCode::Down), k(KeyCode::Tab)], Action::SettingsMove(1), Ctx::Settings, "next field", None),
    b(&[k(KeyCode::Left)], Action::SettingsAdjust(-1), Ctx::Settings, "step down", None),
    b(&[k(KeyCode::Right)], Action::SettingsAdjust(1), Ctx::Settings, "step up", None),
    b(&[k(KeyCode::Enter)], Action::SettingsApply, Ctx::Settings, "apply (next reply)", None),
    b(&[k(KeyCode::Esc)], Action::SettingsCancel, Ctx::Settings, "cancel", None),
    b(&[k(KeyCode::Backspace)], Action::SettingsBackspace, Ctx::Settings, "", None),
    // --- panes ---
    b(&[ch('?')], Action::Help, Ctx::Nav, "help overlay", None),
    b(&[ch('i'), k(KeyCode::Enter)], Action::FocusInput, Ctx::Nav, "type a prompt", None),
    b(&[k(KeyCode::Esc)], Action::Escape, Ctx::Nav, "stop generation / restore / close", None),
    b(&[ch('p')], Action::TogglePrefetch, Ctx::Nav, "prefetch on/off", None),
    b(&[ch('s')], Action::ToggleFetch, Ctx::Nav, "fetch staged/sync", None),
    b(&[ch('l')], Action::CycleLayout, Ctx::Nav, "cycle layout", None),
    b(&[ch('t')], Action::ToggleTier, Ctx::Nav, "expert tier mmap/direct", None),
    b(&[ch('v')], Action::ToggleSchedule, Ctx::Nav, "schedule sequential/vertical", None),
    b(&[ch('a')], Action::AbAuto, Ctx::Nav, "A/B auto on/off (last toggle)", None),
    b(&[ch('w')], Action::WhatIf, Ctx::Nav, "what-if mode", None),
    b(&[ch('f')], Action::Freeze, Ctx::Nav, "freeze panes", None),
    b(&[ch('z')], Action::Maximize, Ctx::Nav, "maximize pane", None),
    b(&[ch('r')], Action::Record, Ctx::Nav, "record on/off", None),
    b(&[ch('o')], Action::OpenSettings, Ctx::Nav, "chat settings", None),
    b(&[ch('y')], Action::CopyReply, Ctx::Nav, "copy the last reply", None),
    b(&[ch('M')], Action::ToggleMouse, Ctx::Nav, "release/capture the mouse", None),
    b(&[ch('q')], Action::Quit, Ctx::Nav, "quit", None),
    b(&[ch('m')], Action::ModelInfo, Ctx::Nav, "model info", None),
    b(&[ch('g')], Action::Timeline, Ctx::Nav, "view under the text on/off", None),
    b(&[ch('c')], Action::CycleView, Ctx::Nav, "cycle view: timeline → heatmap → roofline", None),
    b(&[ch('[')], Action::TimelinePan(-1), Ctx::Nav, "timeline/heatmap: back in time", None),
    b(&[ch(']')], Action::TimelinePan(1), Ctx::Nav, "timeline/heatmap: forward in time", None),
    b(&[ch('.')], Action::TimelineLive, Ctx::Nav, "timeline/heatmap: back to live", None),
    b(&[ch('<')], Action::TimelineZoom(-1), Ctx::Nav, "timeline: zoom out (more tokens per column)", None),
    b(&[ch('>')], Action::TimelineZoom(1), Ctx::Nav, "timeline: zoom in", None),
    b(&[ch('u')], Action::TimelineMetric, Ctx::Nav, "timeline: ms/token ↔ GB/s", None),
    b(&[ch('h')], Action::HeatMetric, Ctx::Nav, "heatmap: ms → bytes → expert ids", None),
    b(&[k(KeyCode::Up), ch('k')], Action::ScrollUp(1), Ctx::Nav, "scroll up", None),
    b(&[k(KeyCode::Down), ch('j')], Action::ScrollDown(1), Ctx::Nav, "scroll down", None),
    b(&[k(KeyCode::End), ch('G')], Action::ScrollEnd, Ctx::Nav, "follow the stream", None),
];

/// The context flags resolution depends on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeyState {
    pub input_focused: bool,
    pub replay: bool,
    pub whatif: bool,
    pub help_open: bool,
    /// The chat settings overlay is open.
    pub settings_open: bool,
}

impl KeyState {
    pub fn of(app: &App) -> Self {
        KeyState {
            input_focused: app.input_focused,
            replay: app.replay.is_some(),
            whatif: app.whatif.is_some(),
            help_open: app.show_help || app.show_info,
            settings_open: app.editor.is_some(),
        }
    }
}

fn normalize(key: &KeyEvent) -> Key {
    let mut mods =
        key.modifiers & (KeyModifiers::CONTROL | KeyModifiers::ALT | KeyModifiers::SHIFT);
    let mut code = key.code;
    // Shift is implied by the character itself ('D', '?', '+').
    if let KeyCode::Char(c) = code {
        mods.remove(KeyModifiers::SHIFT);
        if mods.contains(KeyModifiers::CONTROL) {
            code = KeyCode::Char(c.to_ascii_lowercase());
        }
    }
    if code == KeyCode::Tab && mods.contains(KeyModifiers::SHIFT) {
        code = KeyCode::BackTab;
    }
    if code == KeyCode::BackTab {
        mods.remove(KeyModifiers::SHIFT);
    }
    Key { code, mods }
}

fn lookup(key: Key, ctx: Ctx) -> Option<Action> {
    BINDINGS
        .iter()
        .filter(|b| b.ctx == ctx)
        .find(|b| b.keys.contains(&key))
        .map(|b| b.action)
}

/// Map a key event to an action given the UI state (None = ignored).
pub fn resolve(key: &KeyEvent, st: KeyState) -> Option<Action> {
    if key.kind == KeyEventKind::Release {
        return None;
    }
    let key = normalize(key);
    if st.help_open
        && matches!(
            key.code,
            KeyCode::Esc | KeyCode::Char('?') | KeyCode::Char('q') | KeyCode::Char('m')
        )
    {
        return Some(Action::Escape);
    }
    if st.settings_open {
        if let Some(a) = lookup(key, Ctx::Settings).or_else(|| lookup(key, Ctx::Global)) {
            return Some(a);
        }
        return match key.code {
            KeyCode::Char(c)
                if !key
                    .mods
                    .intersects(KeyModifiers::CONTROL | KeyModifiers::ALT) =>
            {
                Some(Action::SettingsInsert(c))
            }
            _ => None,
        };
    }
    if st.help_open {
        // The overlay scrolls when it is taller than the terminal (80×24).
        match key.code {
            KeyCode::Up | KeyCode::Char('k') => return Some(Action::ScrollUp(1)),
            KeyCode::Down | KeyCode::Char('j') => return Some(Action::ScrollDown(1)),
            KeyCode::PageUp => return Some(Action::PageUp),
            KeyCode::PageDown | KeyCode::Char(' ') => return Some(Action::PageDown),
            _ => {}
        }
    }
    if let Some(a) = lookup(key, Ctx::Global) {
        return Some(a);
    }
    if st.input_focused {
        if let Some(a) = lookup(key, Ctx::Input) {
            return Some(a);
        }
        return match key.code {
            KeyCode::Char(c)
                if !key
                    .mods
                    .intersects(KeyModifiers::CONTROL | KeyModifiers::ALT) =>
            {
                Some(Action::Insert(c))
            }
            _ => None,
        };
    }
    if st.whatif {
        if let Some(a) = lookup(key, Ctx::WhatIf) {
            return Some(a);
        }
    }
    if st.replay {
        if let Some(a) = lookup(key, Ctx::Replay) {
            return Some(a);
        }
    }
    lookup(key, Ctx::Nav)
}

/// Mouse wheel → scrollback.
pub fn resolve_mouse(m: &MouseEvent) -> Option<Action> {
    match m.kind {
        MouseEventKind::ScrollUp => Some(Action::ScrollUp(3)),
        MouseEventKind::ScrollDown => Some(Action::ScrollDown(3)),
        _ => None,
    }
}

/// Keys of a binding joined for display ("F2/Alt+p").
pub fn keys_label(b: &Binding) -> String {
    b.keys.iter().map(Key::label).collect::<Vec<_>>().join("/")
}

/// Actions that need a live engine: a replay refuses them, so its footer does not offer them.
pub fn live_only(a: Action) -> bool {
    matches!(
        a,
        Action::TogglePrefetch | Action::ToggleFetch | Action::CycleLayout | Action::ToggleTier
    )
}

/// Footer hints of a replay: its own controls first (they have no footer label in the table).
const REPLAY_HINTS: [(&str, &str); 3] = [("space", "pause"), ("← →", "step"), ("- +", "speed")];

/// The footer hints: (key, label) for every binding with a footer label, using its first key plus
/// the single-letter Nav key for the same action when there is one (e.g. ("p F2", "prefetch")).
/// In a replay the live-only toggles are left out and the replay controls come first.
pub fn footer_hints(replay: bool) -> Vec<(String, &'static str)> {
    let lead = REPLAY_HINTS
        .iter()
        .filter(|_| replay)
        .map(|&(k, l)| (k.to_string(), l));
    lead.chain(BINDINGS.iter().filter_map(|bd| {
        if replay && live_only(bd.action) {
            return None;
        }
        {
            let label = bd.footer?;
            let letter = BINDINGS
                .iter()
                .find(|o| o.ctx == Ctx::Nav && o.action == bd.action)
                .map(|o| o.keys[0].label());
            let first = bd.keys[0].label();
            Some((
                match letter {
                    Some(l) => format!("{l} {first}"),
                    None => first,
                },
                label,
            ))
        }
    }))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(code: KeyCode, mods: KeyModifiers) -> KeyEvent {
        KeyEvent::new(code, mods)
    }
    const TYPING: KeyState = KeyState {
        input_focused: true,
        replay: false,
        whatif: false,
        help_open: false,
        settings_open: false,
    };
    const NAV: KeyState = KeyState {
        input_focused: false,
        replay: false,
        whatif: false,
        help_open: false,
        settings_open: false,
    };

    #[test]
    fn letters_type_while_input_focused() {
        let p = key(KeyCode::Char('p'), KeyModifiers::NONE);
        assert_eq!(resolve(&p, TYPING), Some(Action::Insert('p')));
        assert_eq!(resolve(&p, NAV), Some(Action::TogglePrefetch));
        let upper = key(KeyCode::Char('P'), KeyModifiers::SHIFT);
        assert_eq!(resolve(&upper, TYPING), Some(Action::Insert('P')));
    }

    #[test]
    fn fkeys_and_alt_work_everywhere() {
        for st in [TYPING, NAV] {
            assert_eq!(
                resolve(&key(KeyCode::F(2), KeyModifiers::NONE), st),
                Some(Action::TogglePrefetch)
            );
            assert_eq!(
                resolve(&key(KeyCode::Char('s'), KeyModifiers::ALT), st),
                Some(Action::ToggleFetch)
            );
            assert_eq!(
                resolve(&key(KeyCode::Char('c'), KeyModifiers::CONTROL), st),
                Some(Action::Interrupt)
            );
            assert_eq!(
                resolve(&key(KeyCode::Tab, KeyModifiers::NONE), st),
                Some(Action::FocusNext)
            );
        }
        assert_eq!(
            resolve(&key(KeyCode::BackTab, KeyModifiers::SHIFT), NAV),
            Some(Action::FocusPrev)
        );
    }

    #[test]
    fn enter_variants() {
        assert_eq!(
            resolve(&key(KeyCode::Enter, KeyModifiers::NONE), TYPING),
            Some(Action::Submit)
        );
        assert_eq!(
            resolve(&key(KeyCode::Enter, KeyModifiers::ALT), TYPING),
            Some(Action::Newline)
        );
        assert_eq!(
            resolve(&key(KeyCode::Char('j'), KeyModifiers::CONTROL), TYPING),
            Some(Action::Newline)
        );
        assert_eq!(
            resolve(&key(KeyCode::Enter, KeyModifiers::NONE), NAV),
            Some(Action::FocusInput)
        );
    }

    #[test]
    fn contexts() {
        let replay = KeyState {
            replay: true,
            ..NAV
        };
        assert_eq!(
            resolve(&key(KeyCode::Char(' '), KeyModifiers::NONE), replay),
            Some(Action::ReplayPause)
        );
        assert_eq!(
            resolve(&key(KeyCode::Right, KeyModifiers::NONE), replay),
            Some(Action::ReplayStep(1))
        );
        assert_eq!(
            resolve(&key(KeyCode::Char('+'), KeyModifiers::SHIFT), replay),
            Some(Action::ReplaySpeed(1))
        );
        assert_eq!(
            resolve(&key(KeyCode::Char(' '), KeyModifiers::NONE), NAV),
            None
        );
        let whatif = KeyState {
            whatif: true,
            ..NAV
        };
        assert_eq!(
            resolve(&key(KeyCode::Char('D'), KeyModifiers::SHIFT), whatif),
            Some(Action::WhatIfDense(1))
        );
        let help = KeyState {
            help_open: true,
            ..TYPING
        };
        assert_eq!(
            resolve(&key(KeyCode::Esc, KeyModifiers::NONE), help),
            Some(Action::Escape)
        );
    }

    #[test]
    fn settings_overlay_takes_the_keys_while_open() {
        let st = KeyState {
            settings_open: true,
            ..TYPING
        };
        assert_eq!(
            resolve(&key(KeyCode::Char('p'), KeyModifiers::NONE), st),
            Some(Action::SettingsInsert('p'))
        );
        assert_eq!(
            resolve(&key(KeyCode::Enter, KeyModifiers::NONE), st),
            Some(Action::SettingsApply)
        );
        assert_eq!(
            resolve(&key(KeyCode::Esc, KeyModifiers::NONE), st),
            Some(Action::SettingsCancel)
        );
        assert_eq!(
            resolve(&key(KeyCode::Right, KeyModifiers::NONE), st),
            Some(Action::SettingsAdjust(1))
        );
        // Global keys still work (Ctrl+C stops / quits).
        assert_eq!(
            resolve(&key(KeyCode::Char('c'), KeyModifiers::CONTROL), st),
            Some(Action::Interrupt)
        );
        // Closed: o opens it from the panes, Alt+o also while typing; Ctrl+S saves.
        assert_eq!(
            resolve(&key(KeyCode::Char('o'), KeyModifiers::NONE), NAV),
            Some(Action::OpenSettings)
        );
        assert_eq!(
            resolve(&key(KeyCode::Char('o'), KeyModifiers::ALT), TYPING),
            Some(Action::OpenSettings)
        );
        assert_eq!(
            resolve(&key(KeyCode::Char('s'), KeyModifiers::CONTROL), TYPING),
            Some(Action::SaveTranscript)
        );
        assert_eq!(
            resolve(&key(KeyCode::Char('M'), KeyModifiers::SHIFT), NAV),
            Some(Action::ToggleMouse)
        );
    }

    #[test]
    fn no_duplicate_keys_within_a_context() {
        for (i, a) in BINDINGS.iter().enumerate() {
            for b in &BINDINGS[i + 1..] {
                if a.ctx == b.ctx {
                    for k in a.keys {
                        assert!(!b.keys.contains(k), "{:?} bound twice in {:?}", k, a.ctx);
                    }
                }
            }
        }
    }

    #[test]
    fn footer_is_generated_from_table() {
        let hints = footer_hints(false);
        assert_eq!(hints[0], ("? F1".to_string(), "help"));
        assert!(hints.iter().any(|(k, l)| k == "p F2" && *l == "prefetch"));
        assert!(hints.iter().any(|(k, l)| k == "q F10" && *l == "quit"));
    }

    #[test]
    fn replay_footer_offers_no_toggle_that_replay_refuses() {
        let hints = footer_hints(true);
        assert_eq!(hints[0], ("space".to_string(), "pause"));
        for l in ["prefetch", "fetch", "layout", "tier"] {
            assert!(
                !hints.iter().any(|(_, x)| *x == l),
                "replay footer offers {l}"
            );
        }
        assert!(hints.iter().any(|(_, l)| *l == "quit"));
        // What the footer leaves out is exactly what a replay refuses.
        let mut app = crate::tui::App::new(&crate::tui::TuiOptions {
            replay: true,
            ..Default::default()
        });
        for bd in BINDINGS.iter().filter(|b| live_only(b.action)) {
            let fx = app.apply(crate::tui::Msg::Action(bd.action));
            assert!(fx.commands.is_empty(), "replay sent {:?}", fx.commands);
        }
    }
}
