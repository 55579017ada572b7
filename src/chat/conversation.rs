//! A chat conversation and its context policy: the system prompt plus user/assistant turns,
//! rendered with the model's chat template (ChatML fallback). When the rendered prompt plus the
//! reply budget would overflow the context, the oldest turns are dropped (the system prompt is
//! kept) and the caller is told how many.

use super::template::{ChatMessage, ChatTemplate, TemplateError};
use crate::model::ModelConfig;

pub struct Conversation {
    pub template: ChatTemplate,
    pub system: Option<String>,
    pub turns: Vec<ChatMessage>,
}

impl Conversation {
    /// A conversation using the model's template (or ChatML when it has none).
    pub fn for_model(
        cfg: &ModelConfig,
        bos: &str,
        eos: &str,
    ) -> Result<Conversation, TemplateError> {
        Ok(Conversation {
            template: ChatTemplate::from_optional(cfg.meta.chat_template.as_deref(), bos, eos)?,
            system: None,
            turns: Vec::new(),
        })
    }

    pub fn messages(&self) -> Vec<ChatMessage> {
        let mut m = Vec::new();
        if let Some(s) = &self.system {
            m.push(ChatMessage::new("system", s.clone()));
        }
        m.extend(self.turns.iter().cloned());
        m
    }

    /// The prompt text for the next assistant reply.
    pub fn render(&self) -> Result<String, TemplateError> {
        self.template.render(&self.messages(), true)
    }

    /// Drops the oldest turn pairs until `count(render())` + `reserve` fits in `max_ctx`.
    /// Returns how many messages were dropped. Never drops the newest user message.
    pub fn fit(
        &mut self,
        max_ctx: usize,
        reserve: usize,
        count: &dyn Fn(&str) -> usize,
    ) -> Result<usize, TemplateError> {
        let mut dropped = 0;
        loop {
            let n = count(&self.render()?);
            if n + reserve <= max_ctx || self.turns.len() <= 1 {
                return Ok(dropped);
            }
            self.turns.remove(0);
            dropped += 1;
            // Keep turns starting with a user message.
            while self.turns.len() > 1 && self.turns[0].role != "user" {
                self.turns.remove(0);
                dropped += 1;
            }
        }
    }

    pub fn clear(&mut self) {
        self.turns.clear();
    }
}
