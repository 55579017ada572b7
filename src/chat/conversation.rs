//! A chat conversation and its context policy: the system prompt plus user/assistant turns,
//! rendered with the model's chat template (ChatML fallback). When the rendered prompt plus the
//! reply budget would overflow the context, the oldest turns are dropped (the system prompt is
//! kept) and the caller is told how many. [`Conversation::prepare_turn`] is the one way a user
//! message becomes prompt tokens (the chat REPL, `run --chat` and the TUI's worker use it).

use super::template::{ChatMessage, ChatTemplate, TemplateError};
use super::tokenizer::TokenizerWrap;
use crate::model::ModelConfig;

/// Why a user message could not become a prompt (the conversation is left as it was).
#[derive(Debug, thiserror::Error)]
pub enum TurnError {
    #[error("chat template: {0}")]
    Template(TemplateError),
    #[error("cannot tokenize the chat prompt: {0}")]
    Tokenizer(String),
    /// Even with every older turn dropped, the prompt leaves no position for a reply.
    #[error("{0}")]
    NoRoom(String),
}

/// A user message made ready to send: the whole rendered prompt's tokens, and how many old
/// messages were dropped to fit it.
#[derive(Debug)]
pub struct PreparedTurn {
    pub ids: Vec<u32>,
    pub dropped: usize,
}

/// The BOS and EOS token strings chat templates refer to (empty when unknown).
pub fn special_strings(tok: Option<&TokenizerWrap>) -> (String, String) {
    let name = |id: Option<u32>| {
        id.and_then(|i| tok.and_then(|t| t.id_to_token(i)))
            .unwrap_or_default()
    };
    (
        name(tok.and_then(|t| t.bos_id())),
        name(tok.and_then(|t| t.eos_id())),
    )
}

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

    /// [`Conversation::for_model`] with the BOS/EOS strings of the model's tokenizer.
    pub fn for_tokenizer(
        cfg: &ModelConfig,
        tok: Option<&TokenizerWrap>,
    ) -> Result<Conversation, TemplateError> {
        let (bos, eos) = special_strings(tok);
        Conversation::for_model(cfg, &bos, &eos)
    }

    /// Adds the user message `text`, drops the oldest turns until the prompt plus `reserve`
    /// tokens fits in `max_ctx` ([`Conversation::fit`]), renders and tokenizes the prompt. On a
    /// template or tokenizer error, or when even then the prompt leaves no position for a reply
    /// ([`TurnError::NoRoom`], which says whether the system prompt alone is too long), the
    /// conversation is restored as it was (including turns `fit` had dropped) and the message
    /// is not added.
    pub fn prepare_turn(
        &mut self,
        text: &str,
        tok: &TokenizerWrap,
        max_ctx: usize,
        reserve: usize,
    ) -> Result<PreparedTurn, TurnError> {
        let kept = self.turns.clone();
        self.turns.push(ChatMessage::new("user", text));
        let count = |s: &str| tok.encode(s, false).map_or(s.len(), |v| v.len());
        let r = self
            .fit(max_ctx, reserve, &count)
            .and_then(|dropped| Ok((dropped, self.render()?)))
            .map_err(TurnError::Template)
            .and_then(|(dropped, prompt)| {
                let ids = tok
                    .encode(&prompt, false)
                    .map_err(|e| TurnError::Tokenizer(e.to_string()))?;
                Ok(PreparedTurn { ids, dropped })
            });
        let r = match r {
            Ok(t) if t.ids.len() >= max_ctx => Err(self.no_room(t.ids.len(), max_ctx, &count)),
            r => r,
        };
        if r.is_err() {
            self.turns = kept;
        }
        r
    }

    /// Why a prompt of `n` tokens leaves no room for a reply in `max_ctx` positions: the
    /// system prompt alone (rendered with an empty message, so with the template's framing),
    /// or this message.
    fn no_room(&mut self, n: usize, max_ctx: usize, count: &dyn Fn(&str) -> usize) -> TurnError {
        let turns = std::mem::replace(&mut self.turns, vec![ChatMessage::new("user", "")]);
        let base = self.render().map_or(n, |p| count(&p));
        self.turns = turns;
        let own = if self.system.is_some() {
            "the system prompt alone (with the chat template's framing) is"
        } else {
            "the chat template's framing alone (with any default system prompt it adds) is"
        };
        TurnError::NoRoom(if base + 1 >= max_ctx {
            format!(
                "{own} {base} tokens and the context is {max_ctx} positions (--max-ctx): no \
                 room for a message and a reply. Raise --max-ctx above {} or shorten the \
                 system prompt",
                base + 1
            )
        } else {
            format!(
                "this message makes the prompt {n} tokens ({base} before any message); the \
                 context is {max_ctx} positions (--max-ctx), which leaves no room for a reply. \
                 Shorten the message or raise --max-ctx"
            )
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

#[cfg(test)]
mod tests {
    use super::*;

    fn conv(template: &str) -> (Conversation, TokenizerWrap) {
        let tok =
            TokenizerWrap::from_json(crate::chat::bundled_gpt2_tokenizer().unwrap(), None).unwrap();
        let c = Conversation {
            template: ChatTemplate::from_optional(Some(template), "", "").unwrap(),
            system: None,
            turns: Vec::new(),
        };
        (c, tok)
    }

    #[test]
    fn prepare_turn_adds_the_message_and_restores_the_conversation_on_error() {
        let (mut c, tok) = conv(
            "{% for m in messages %}{% if 'boom' in m.content %}{{ raise_exception('no boom') }}\
             {% endif %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}<|assistant|>",
        );
        let p = c.prepare_turn("hello there", &tok, 4096, 16).unwrap();
        assert_eq!(p.dropped, 0);
        assert_eq!(
            tok.encode("<|user|>hello there\n<|assistant|>", false)
                .unwrap(),
            p.ids
        );
        c.turns.push(ChatMessage::new("assistant", "hi"));
        let before = c.turns.len();
        let e = c.prepare_turn("a boom", &tok, 4096, 16).unwrap_err();
        assert!(matches!(e, TurnError::Template(_)), "{e}");
        assert!(e.to_string().contains("no boom"), "{e}");
        assert_eq!(c.turns.len(), before);
        // A context that holds only the newest turn (13 tokens) and one reply position drops
        // the older pair.
        let p = c.prepare_turn("again", &tok, 14, 4).unwrap();
        assert_eq!(p.dropped, 2);
        assert_eq!(c.turns.len(), 1);
    }

    #[test]
    fn a_context_smaller_than_the_system_prompt_says_exactly_that() {
        // `--max-ctx` smaller than the system prompt.
        let (mut c, tok) = conv(
            "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}\
             {% if add_generation_prompt %}<|assistant|>{% endif %}",
        );
        c.system = Some("You are a careful assistant who answers in one short line.".into());
        let e = c.prepare_turn("Hi", &tok, 8, 0).unwrap_err().to_string();
        assert!(
            e.starts_with("the system prompt alone (with the chat template's framing) is "),
            "{e}"
        );
        assert!(e.contains("--max-ctx"), "{e}");
        assert!(c.turns.is_empty(), "the message is not added");
        // Room for the system prompt but not for this message and a reply.
        let e = c
            .prepare_turn(&"word ".repeat(60), &tok, 64, 0)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("this message makes the prompt "), "{e}");
        // It fits: no error.
        assert!(c.prepare_turn("Hi", &tok, 64, 0).is_ok());
    }
}
