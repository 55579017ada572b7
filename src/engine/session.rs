//! A generation session: engine + tokenizer + sampler, with the prefill/decode loop that emits
//! the `Event` stream (prompt, tokens, per-token stats, done). Shared by `run`, `chat`, `bench`
//! and the engine thread behind the TUI.

use super::forward::{stream_bytes, Engine, ForwardError};
use super::sampler::Sampler;
use crate::telemetry::{Event, ModelSummary, SamplingParams, StopReason, TokenStats};
use std::time::Instant;

/// Result of one generation.
#[derive(Clone, Debug, Default)]
pub struct GenOutcome {
    pub prompt_tokens: usize,
    pub tokens: Vec<u32>,
    pub text: String,
    pub prefill_ns: u64,
    pub decode_ns: u64,
    pub token_ns: Vec<u64>,
    pub stats: Vec<TokenStats>,
    pub reason: Option<StopReason>,
    pub error: Option<String>,
}

impl GenOutcome {
    pub fn decode_tok_s(&self) -> f64 {
        if self.decode_ns == 0 {
            0.0
        } else {
            self.tokens.len() as f64 / (self.decode_ns as f64 / 1e9)
        }
    }
    pub fn prefill_tok_s(&self) -> f64 {
        if self.prefill_ns == 0 {
            0.0
        } else {
            self.prompt_tokens as f64 / (self.prefill_ns as f64 / 1e9)
        }
    }
}

/// Tokenizer attached to a model (from its embedded tokenizer.json).
pub struct Tok {
    pub inner: tokenizers::Tokenizer,
}

impl Tok {
    pub fn from_json(json: &str) -> Result<Tok, String> {
        json.parse::<tokenizers::Tokenizer>()
            .map(|inner| Tok { inner })
            .map_err(|e| format!("embedded tokenizer.json is invalid: {e}"))
    }
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>, String> {
        self.inner
            .encode(text, add_special)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| e.to_string())
    }
    pub fn decode(&self, ids: &[u32]) -> String {
        self.inner.decode(ids, false).unwrap_or_default()
    }
}

/// Incremental, UTF-8-safe text for a growing id list: returns only newly completed text.
#[derive(Default)]
pub struct Detok {
    ids: Vec<u32>,
    emitted: usize,
}

impl Detok {
    pub fn push(&mut self, tok: &Tok, id: u32) -> String {
        self.ids.push(id);
        let s = tok.decode(&self.ids);
        if s.ends_with('\u{FFFD}') || s.len() < self.emitted || !s.is_char_boundary(self.emitted) {
            return String::new();
        }
        let out = s[self.emitted..].to_string();
        self.emitted = s.len();
        out
    }
}

pub struct Session {
    pub engine: Engine,
    pub tok: Option<Tok>,
    pub sampler: Sampler,
    /// Every token in the context, in order.
    pub context: Vec<u32>,
}

impl Session {
    pub fn new(engine: Engine, sampling: SamplingParams) -> Result<Session, String> {
        let tok = match &engine.cfg.meta.tokenizer_json {
            Some(j) => Some(Tok::from_json(j)?),
            None => None,
        };
        Ok(Session {
            engine,
            tok,
            sampler: Sampler::new(sampling),
            context: Vec::new(),
        })
    }

    pub fn summary(&self) -> ModelSummary {
        let f = &self.engine.file;
        let c = &self.engine.cfg;
        let mut quants: Vec<String> = Vec::new();
        let mut add = |q: crate::quant::QuantType| {
            if !quants.iter().any(|s| s == q.name()) {
                quants.push(q.name().to_string());
            }
        };
        for l in &f.layers {
            for m in [Some(&l.q), Some(&l.o), l.gate.as_ref(), l.down.as_ref()]
                .into_iter()
                .flatten()
            {
                add(m.quant);
            }
            if let Some(e) = l.experts.first() {
                add(e.gate.quant);
            }
        }
        add(f.vocab.embedding.quant);
        add(f.lm_head().quant);
        ModelSummary {
            name: c.meta.name.clone(),
            arch: c.meta.arch.clone(),
            synthetic: c.meta.synthetic,
            n_layers: c.effective_layers() as u32,
            d_model: c.d_model as u32,
            n_heads: c.n_heads as u32,
            n_kv_heads: c.n_kv_heads as u32,
            d_ff: c.d_ff as u32,
            n_experts: c.n_experts as u32,
            top_k: c.top_k as u32,
            expert_ffn: c.expert_ffn as u32,
            vocab: c.vocab as u32,
            max_ctx: c.max_ctx as u32,
            dense_delay: c.dense_delay as u32,
            expert_delay: c.expert_delay as u32,
            combine_style: c.combine_style.name().to_string(),
            quant_types: quants,
            has_chat_template: c.meta.chat_template.is_some(),
            layer_bytes: stream_bytes(f),
            vocab_bytes: f.lm_head().bytes() as u64,
            file_hash: crate::format::file_hash(f),
        }
    }

    pub fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        let tok = self
            .tok
            .as_ref()
            .ok_or("this model has no tokenizer; use --tokens")?;
        let mut ids = tok.encode(text, false)?;
        let m = &self.engine.cfg.meta;
        if m.add_bos && self.context.is_empty() {
            if let Some(b) = m.bos_id {
                ids.insert(0, b);
            }
        }
        Ok(ids)
    }

    pub fn is_eos(&self, id: u32) -> bool {
        self.engine.cfg.meta.eos_ids.contains(&id)
    }

    /// Feeds `prompt` (continuing the context) and generates up to `max_new` tokens.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        max_new: usize,
        stop_at_eos: bool,
        emit: &mut dyn FnMut(Event),
    ) -> GenOutcome {
        let mut out = GenOutcome {
            prompt_tokens: prompt.len(),
            ..Default::default()
        };
        self.engine
            .stop
            .store(false, std::sync::atomic::Ordering::Relaxed);
        let room = self.engine.cfg.max_ctx.saturating_sub(self.engine.pos());
        if prompt.len() > room {
            out.reason = Some(StopReason::ContextFull);
            out.error = Some(format!(
                "prompt of {} tokens does not fit: {} of {} context positions left",
                prompt.len(),
                room,
                self.engine.cfg.max_ctx
            ));
            emit(Event::Error {
                message: out.error.clone().unwrap_or_default(),
                fatal: false,
            });
            return out;
        }
        let t0 = Instant::now();
        for (i, &id) in prompt.iter().enumerate() {
            let last = i + 1 == prompt.len();
            if let Err(e) = self.engine.step(id, last) {
                return self.fail(out, e, emit);
            }
            self.context.push(id);
        }
        out.prefill_ns = t0.elapsed().as_nanos() as u64;
        emit(Event::Prefill {
            n_tokens: prompt.len() as u32,
            ns: out.prefill_ns,
        });
        if prompt.is_empty() {
            out.reason = Some(StopReason::Length);
            return out;
        }
        let mut detok = Detok::default();
        let td = Instant::now();
        let mut next = self.sampler.sample(self.engine.logits(), &self.context);
        for index in 0..max_new {
            let piece = match &self.tok {
                Some(t) => detok.push(t, next),
                None => String::new(),
            };
            out.tokens.push(next);
            out.text.push_str(&piece);
            emit(Event::Token {
                index: index as u32,
                id: next,
                text: piece,
            });
            if stop_at_eos && self.is_eos(next) {
                out.reason = Some(StopReason::Eos);
                break;
            }
            if index + 1 == max_new {
                out.reason = Some(StopReason::Length);
                break;
            }
            let ts = Instant::now();
            if let Err(e) = self.engine.step(next, true) {
                out.decode_ns = td.elapsed().as_nanos() as u64;
                return self.fail(out, e, emit);
            }
            self.context.push(next);
            out.token_ns.push(ts.elapsed().as_nanos() as u64);
            let mut st = self.engine.stats.clone();
            st.index = index as u32;
            emit(Event::Stats(st.clone()));
            out.stats.push(st);
            next = self.sampler.sample(self.engine.logits(), &self.context);
        }
        // The last sampled token was not fed back; it will be the first input of a continuation.
        if let Some(&last) = out.tokens.last() {
            if self.engine.pos() < self.engine.cfg.max_ctx && out.reason != Some(StopReason::Eos) {
                // Keep the context consistent: feed it now so a follow-up continues after it.
                if self.engine.step(last, false).is_ok() {
                    self.context.push(last);
                }
            } else if out.reason == Some(StopReason::Eos) && self.engine.step(last, false).is_ok() {
                self.context.push(last);
            }
        }
        out.decode_ns = td.elapsed().as_nanos() as u64;
        emit(Event::Done {
            reason: out.reason.unwrap_or(StopReason::Length),
            n_tokens: out.tokens.len() as u32,
            decode_ns: out.decode_ns,
        });
        out
    }

    fn fail(
        &mut self,
        mut out: GenOutcome,
        e: ForwardError,
        emit: &mut dyn FnMut(Event),
    ) -> GenOutcome {
        let reason = match e {
            ForwardError::Stopped => StopReason::Stopped,
            ForwardError::ContextFull { .. } => StopReason::ContextFull,
            ForwardError::BadToken { .. } => StopReason::Error,
        };
        // A partially processed position is discarded (the KV length only advances on success).
        self.context.truncate(self.engine.pos());
        out.reason = Some(reason);
        if reason != StopReason::Stopped {
            out.error = Some(e.to_string());
            emit(Event::Error {
                message: e.to_string(),
                fatal: false,
            });
        }
        emit(Event::Done {
            reason,
            n_tokens: out.tokens.len() as u32,
            decode_ns: out.decode_ns,
        });
        out
    }

    pub fn reset(&mut self) {
        self.engine.reset();
        self.context.clear();
    }
}
