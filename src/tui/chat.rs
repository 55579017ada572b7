//! The app's chat features (kept out of `app.rs`): the `Settings` event (what the header shows,
//! and a status message when it changed), the settings overlay's actions, saving the
//! transcript, copying the last reply and releasing the mouse. The terminal and file work is
//! the host's (`tui::run`): these only return [`UiRequest`]s and engine [`Command`]s.

use super::app::{Action, App, Effects, UiRequest};
use super::settings::SettingsEditor;
use crate::chat::sampling::describe;
use crate::telemetry::event::GenSettings;

impl App {
    /// A `Settings` event: keep it, and say what changed.
    pub(super) fn on_settings(&mut self, g: GenSettings) {
        if let Some(old) = &self.settings {
            let mut m = Vec::new();
            if old.sampling != g.sampling {
                m.push(format!("sampling → {}", describe(&g.sampling)));
            }
            if old.system != g.system {
                m.push(if g.system.is_empty() {
                    "system prompt cleared".to_string()
                } else {
                    "system prompt set (next reply)".to_string()
                });
            }
            if !m.is_empty() {
                self.say(m.join(" · "));
            }
        }
        self.settings = Some(g);
    }

    pub(super) fn on_chat_action(&mut self, a: Action) -> Effects {
        let mut fx = Effects::default();
        match a {
            Action::OpenSettings => {
                if self.toggles_blocked() {
                    return fx;
                }
                match &self.settings {
                    Some(s) => self.editor = Some(SettingsEditor::new(s)),
                    None => self.say("no settings from the engine yet"),
                }
            }
            Action::SettingsMove(d) => {
                if let Some(e) = &mut self.editor {
                    e.move_row(d);
                }
            }
            Action::SettingsAdjust(d) => {
                if let Some(e) = &mut self.editor {
                    e.adjust(d);
                }
            }
            Action::SettingsInsert(c) => {
                if let Some(e) = &mut self.editor {
                    e.insert(c);
                }
            }
            Action::SettingsBackspace => {
                if let Some(e) = &mut self.editor {
                    e.backspace();
                }
            }
            Action::SettingsCancel => self.editor = None,
            Action::SettingsApply => {
                let (Some(e), Some(cur)) = (self.editor.as_mut(), self.settings.as_ref()) else {
                    self.editor = None;
                    return fx;
                };
                // On an error the overlay stays open and shows it.
                if let Ok(cmds) = e.apply(cur) {
                    self.editor = None;
                    if cmds.is_empty() {
                        self.say("settings unchanged");
                    } else {
                        self.say(if self.generating {
                            "settings sent: they apply from the next reply"
                        } else {
                            "settings sent (next reply)"
                        });
                    }
                    fx.commands = cmds;
                }
            }
            Action::SaveTranscript => {
                if self.transcript.is_empty() {
                    self.say("nothing to save yet");
                } else {
                    fx.requests.push(UiRequest::SaveTranscript);
                }
            }
            Action::CopyReply => match self.last_reply() {
                Some(r) => {
                    let n = r.chars().count();
                    self.say(format!(
                        "copied the last reply ({n} chars) to the clipboard (OSC 52)"
                    ));
                    fx.requests.push(UiRequest::CopyLastReply);
                }
                None => self.say("no reply to copy yet"),
            },
            Action::ToggleMouse => {
                self.mouse_captured = !self.mouse_captured;
                self.say(if self.mouse_captured {
                    "mouse captured: the wheel scrolls the transcript"
                } else {
                    "mouse released: select text with the terminal (M or Alt+M captures it again)"
                });
                fx.requests
                    .push(UiRequest::SetMouseCapture(self.mouse_captured));
            }
            _ => {}
        }
        fx
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::sampling::chat_defaults;
    use crate::telemetry::event::{Command, Event, StopReason};
    use crate::tui::app::{Msg, Role};
    use crate::tui::fixture::dense_events;

    fn chat_app() -> App {
        let mut app = App::default();
        for e in dense_events() {
            app.apply(Msg::Stamped(e));
        }
        app.apply(Msg::Event(Event::Done {
            reason: StopReason::Eos,
            n_tokens: 5,
            decode_ns: 50_000_000,
            pos: None,
            ttft_ns: Some(20_100_000),
        }));
        app.apply(Msg::Event(Event::Settings(GenSettings {
            sampling: chat_defaults(),
            system: String::new(),
            act: "f32".into(),
            kv: "f32".into(),
        })));
        app
    }

    fn act(app: &mut App, a: Action) -> Effects {
        app.apply(Msg::Action(a))
    }

    #[test]
    fn settings_overlay_sends_sampling_and_system_prompt() {
        let mut app = chat_app();
        act(&mut app, Action::OpenSettings);
        assert!(app.editor.is_some());
        act(&mut app, Action::SettingsAdjust(1)); // temperature 0.75
        act(&mut app, Action::SettingsMove(-1)); // system prompt
        for c in "Be brief.".chars() {
            act(&mut app, Action::SettingsInsert(c));
        }
        let fx = act(&mut app, Action::SettingsApply);
        let mut want = chat_defaults();
        want.temperature = 0.75;
        assert_eq!(
            fx.commands,
            vec![
                Command::SetSampling(want.clone()),
                Command::SetSystemPrompt("Be brief.".into())
            ]
        );
        assert!(app.editor.is_none());
        // The header follows the engine's answer, not the draft.
        assert_eq!(app.settings.as_ref().unwrap().sampling, chat_defaults());
        app.apply(Msg::Event(Event::Settings(GenSettings {
            sampling: want,
            system: "Be brief.".into(),
            act: "f32".into(),
            kv: "f32".into(),
        })));
        let m = app.status_message().unwrap();
        assert!(
            m.contains("sampling → temp 0.75") && m.contains("system prompt set"),
            "{m}"
        );
        // Cancel drops a draft.
        act(&mut app, Action::OpenSettings);
        act(&mut app, Action::SettingsAdjust(1));
        act(&mut app, Action::SettingsCancel);
        assert!(app.editor.is_none());
    }

    #[test]
    fn replay_refuses_the_settings_overlay() {
        let mut app = App::new(&crate::tui::TuiOptions {
            replay: true,
            ..Default::default()
        });
        for e in dense_events() {
            app.apply(Msg::Stamped(e));
        }
        act(&mut app, Action::OpenSettings);
        assert!(app.editor.is_none());
    }

    #[test]
    fn reply_summary_follows_each_reply() {
        let app = chat_app();
        // dense_events: two prompts; the second reply (turn 3) ends with the Done above.
        let s = app.summaries.get(&3).expect("a summary line");
        assert_eq!(app.transcript[3].role, Role::Model);
        assert!(
            s.contains("5 tok · decode 100.0 tok/s · 10.00 ms/tok"),
            "{s}"
        );
        // The time to first token, from the Done event.
        assert!(s.contains(" · TTFT 20.1 ms · "), "{s}");
        let t = crate::tui::transcript::from_app(&app);
        assert_eq!(t.messages[3].summary.as_deref(), Some(s.as_str()));
    }

    #[test]
    fn copy_save_and_mouse_requests() {
        let mut app = chat_app();
        assert_eq!(app.last_reply(), Some("The capital of Italy is"));
        assert_eq!(
            act(&mut app, Action::CopyReply).requests,
            vec![UiRequest::CopyLastReply]
        );
        assert_eq!(
            act(&mut app, Action::SaveTranscript).requests,
            vec![UiRequest::SaveTranscript]
        );
        assert!(app.mouse_captured);
        assert_eq!(
            act(&mut app, Action::ToggleMouse).requests,
            vec![UiRequest::SetMouseCapture(false)]
        );
        assert_eq!(
            act(&mut app, Action::ToggleMouse).requests,
            vec![UiRequest::SetMouseCapture(true)]
        );
        let mut empty = App::default();
        assert!(act(&mut empty, Action::CopyReply).is_empty());
        assert!(act(&mut empty, Action::SaveTranscript).is_empty());
    }

    #[test]
    fn history_event_shows_the_loaded_conversation() {
        let mut app = chat_app();
        app.apply(Msg::Event(Event::Reset));
        let start = app.conv_start;
        app.apply(Msg::Event(Event::History {
            messages: vec![
                crate::telemetry::event::HistoryMessage {
                    role: "user".into(),
                    text: "hi".into(),
                },
                crate::telemetry::event::HistoryMessage {
                    role: "assistant".into(),
                    text: "yo".into(),
                },
            ],
        }));
        let t = crate::tui::transcript::from_app(&app);
        assert_eq!(t.messages.len(), 2, "{t:?}");
        assert_eq!(t.messages[1].text, "yo");
        assert_eq!(app.transcript[start].text, "hi");
    }
}
