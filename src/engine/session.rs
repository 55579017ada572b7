//! A generation session: engine + tokenizer + sampler, with the prefill/decode loop that emits
//! the `Event` stream (prompt, tokens, per-token stats, done). Shared by `run`, `chat`, `bench`
//! and the engine thread behind the TUI.

use super::kv_budget::{available_memory, KvTooLarge};
use super::sampler::Sampler;
use super::{stream_bytes, Engine, ForwardError};
use crate::chat::detok::Detok;
use crate::chat::tokenizer::TokenizerWrap;
use crate::model::special::SpecialTokens;
use crate::model::ModelConfig;
use crate::telemetry::{Event, ModelSummary, SamplingParams, StopReason, TokenStats};
use std::time::Instant;

/// Result of one generation.
#[derive(Clone, Debug, Default)]
pub struct GenOutcome {
    pub prompt_tokens: usize,
    pub tokens: Vec<u32>,
    pub text: String,
    pub prefill_ns: u64,
    /// Time to first token: from the start of the prompt's prefill to the first generated
    /// token sampled (the prefill, whose last position gives the logits, then the sampling);
    /// `None` when no token was generated.
    pub ttft_ns: Option<u64>,
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

/// Why a session could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("embedded tokenizer: {0}")]
    Tokenizer(String),
    /// The KV cache of the full context does not fit in available memory.
    #[error(transparent)]
    KvTooLarge(#[from] KvTooLarge),
}

/// Called at every token boundary (before each decode step) with the engine; applies queued
/// toggles and returns the events to emit (e.g. a `Config` event).
pub type BoundaryHook = Box<dyn FnMut(&mut Engine) -> Vec<Event> + Send>;

pub struct Session {
    pub engine: Engine,
    pub tok: Option<TokenizerWrap>,
    pub boundary: Option<BoundaryHook>,
    pub sampler: Sampler,
    /// Every token in the context, in order.
    pub context: Vec<u32>,
    /// Benchmarks only: feed a pseudo-random token at every step instead of the sampled one
    /// (drawn from the crate's one generator, `rng::Rng`), as llama-bench does. On a model with random weights the
    /// sampled text repeats itself and so routes the same experts every token; random tokens
    /// make the routing as varied as the router allows.
    pub random_feed: Option<crate::rng::Rng>,
    /// The `inspect --json` report of the model file, which [`Session::summary`] carries to the
    /// TUI's Info view; set by whoever opened the model (`crate::inspect::report`).
    pub report: Option<serde_json::Value>,
}

/// The tokenizer embedded in a model (`None` when it has none), with its special tokens from
/// the model's metadata. Building a large one frees most of what it allocated
/// (`chat::tokenizer_parts`): the allocator's free pages go back to the system afterwards, so
/// the process does not keep that peak for the whole run. Load it before the weights are
/// copied into memory, so that the two peaks do not add up.
pub fn load_tokenizer(cfg: &ModelConfig) -> Result<Option<TokenizerWrap>, SessionError> {
    let m = &cfg.meta;
    let Some(j) = &m.tokenizer_json else {
        return Ok(None);
    };
    let special = SpecialTokens {
        bos: m.bos_id,
        eos: m.eos_ids.first().copied(),
        eog: m.eos_ids.clone(),
        add_bos: m.add_bos,
        ..Default::default()
    };
    let tok = TokenizerWrap::from_json(j, Some(special))
        .map_err(|e| SessionError::Tokenizer(e.to_string()))?;
    crate::io::heap::release_free_heap();
    Ok(Some(tok))
}

impl Session {
    /// Opens a session over `engine`; refuses a model whose KV cache for its full context
    /// (`engine.cfg().max_ctx`) does not fit in available memory (`engine::kv_budget`).
    pub fn new(engine: Engine, sampling: SamplingParams) -> Result<Session, SessionError> {
        let tok = load_tokenizer(engine.cfg())?;
        Session::with_tokenizer(engine, sampling, tok)
    }

    /// [`Session::new`] with the model's tokenizer already loaded ([`load_tokenizer`]).
    pub fn with_tokenizer(
        engine: Engine,
        sampling: SamplingParams,
        tok: Option<TokenizerWrap>,
    ) -> Result<Session, SessionError> {
        super::kv_budget::check(engine.cfg(), engine.kv_type(), available_memory())?;
        Ok(Session {
            engine,
            tok,
            boundary: None,
            sampler: Sampler::new(sampling),
            context: Vec::new(),
            random_feed: None,
            report: None,
        })
    }

    pub fn summary(&self) -> ModelSummary {
        let f = &self.engine.file();
        let c = &self.engine.cfg();
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
            route_ahead: c.meta.route_ahead,
            combine_style: c.combine_style.name().to_string(),
            quant_types: quants,
            has_chat_template: c.meta.chat_template.is_some(),
            layer_bytes: stream_bytes(f),
            layer_payload_bytes: crate::engine::critical::payload_stream_bytes(f),
            layer_payload_bytes_all: crate::engine::critical::payload_stream_bytes_all(f),
            lm_head_bytes: f.lm_head().bytes() as u64,
            kv_dim: c.kv_dim() as u32,
            kv_elem_bytes: self.engine.kv_type().bytes() as u32,
            kv_window: super::styles::steps(c)
                .map(|st| c.sliding_window_for(st.block) as u32)
                .collect(),
            inspect: self.report.clone(),
            file_hash: crate::format::file_hash(f),
        }
    }

    pub fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        let tok = self
            .tok
            .as_ref()
            .ok_or("this model has no tokenizer; use --token-ids")?;
        let mut ids = tok.encode(text, false).map_err(|e| e.to_string())?;
        let m = &self.engine.cfg().meta;
        if m.add_bos && self.context.is_empty() {
            if let Some(b) = m.bos_id {
                ids.insert(0, b);
            }
        }
        Ok(ids)
    }

    pub fn is_eos(&self, id: u32) -> bool {
        self.engine.cfg().meta.eos_ids.contains(&id)
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
        let room = self.engine.cfg().max_ctx.saturating_sub(self.engine.pos());
        if prompt.len() > room {
            let msg = format!(
                "prompt of {} tokens does not fit: {} of {} context positions left",
                prompt.len(),
                room,
                self.engine.cfg().max_ctx
            );
            return self.fail_msg(out, StopReason::ContextFull, Some(msg), emit);
        }
        let t0 = Instant::now();
        if let Err(msg) = self.check_model_file() {
            return self.fail_msg(out, StopReason::Error, Some(msg), emit);
        }
        let prefilled = self.engine.prefill(prompt);
        self.report_io_incident(emit);
        if let Err(e) = prefilled {
            return self.fail(out, e, emit);
        }
        self.context.extend_from_slice(prompt);
        out.prefill_ns = t0.elapsed().as_nanos() as u64;
        emit(Event::Prefill {
            n_tokens: prompt.len() as u32,
            ns: out.prefill_ns,
        });
        if prompt.is_empty() {
            return self.fail_msg(out, StopReason::Length, None, emit);
        }
        let mut detok = self.tok.as_ref().map(|t| Detok::new(t.token_bytes()));
        let td = Instant::now();
        let mut next = self.next_token();
        if max_new > 0 {
            out.ttft_ns = Some(t0.elapsed().as_nanos() as u64);
        }
        for index in 0..max_new {
            let mut piece = detok.as_mut().map(|d| d.push(next)).unwrap_or_default();
            let ending = (stop_at_eos && self.is_eos(next)) || index + 1 == max_new;
            if ending {
                if let Some(d) = detok.as_mut() {
                    piece.push_str(&d.flush());
                }
            }
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
            // The context ran out (the caller capped `max_new` at the room left, or it did
            // not): that is the reason, not the token budget. The last token still fits.
            let max_ctx = self.engine.cfg().max_ctx;
            if self.engine.pos() + 1 >= max_ctx {
                out.reason = Some(StopReason::ContextFull);
                break;
            }
            if index + 1 == max_new {
                out.reason = Some(StopReason::Length);
                break;
            }
            if let Some(hook) = self.boundary.as_mut() {
                for ev in hook(&mut self.engine) {
                    emit(ev);
                }
            }
            let ts = Instant::now();
            if let Err(msg) = self.check_model_file() {
                out.decode_ns = td.elapsed().as_nanos() as u64;
                return self.fail_msg(out, StopReason::Error, Some(msg), emit);
            }
            let stepped = self.engine.step(next, true).map(|_| ());
            self.report_io_incident(emit);
            if let Err(e) = stepped {
                out.decode_ns = td.elapsed().as_nanos() as u64;
                return self.fail(out, e, emit);
            }
            self.context.push(next);
            out.token_ns.push(ts.elapsed().as_nanos() as u64);
            let mut st = self.engine.stats().clone();
            st.index = index as u32;
            emit(Event::Stats(st.clone()));
            out.stats.push(st);
            next = self.next_token();
        }
        // The last sampled token was not fed back yet: feed it (no logits needed) so a follow-up
        // turn continues right after it.
        if let Some(&last) = out.tokens.last() {
            if self.check_model_file().is_ok() && self.engine.step(last, false).is_ok() {
                self.context.push(last);
            }
        }
        out.decode_ns = td.elapsed().as_nanos() as u64;
        if out.reason.is_none() {
            // No token was asked for (`max_new` 0: a caller's cap at the room left).
            out.reason = Some(if self.engine.pos() >= self.engine.cfg().max_ctx {
                StopReason::ContextFull
            } else {
                StopReason::Length
            });
        }
        emit(Event::Done {
            reason: out.reason.unwrap_or(StopReason::Length),
            n_tokens: out.tokens.len() as u32,
            decode_ns: out.decode_ns,
            pos: Some(self.engine.pos() as u32),
            ttft_ns: out.ttft_ns,
        });
        out
    }

    /// Feeds `ids` into the context (one prefill, no sampling, no events): what `bench decode
    /// --depth` puts in the KV cache before the measured prompt.
    pub fn fill_context(&mut self, ids: &[u32]) -> Result<(), ForwardError> {
        self.engine
            .stop
            .store(false, std::sync::atomic::Ordering::Relaxed);
        self.engine.prefill(ids)?;
        self.context.extend_from_slice(ids);
        Ok(())
    }

    /// The token to feed next: sampled, or with [`Session::random_feed`] the generator's next draw.
    fn next_token(&mut self) -> u32 {
        match self.random_feed.as_mut() {
            Some(rng) => rng.below(self.engine.cfg().vocab) as u32,
            None => self.sampler.sample(self.engine.logits(), &self.context),
        }
    }

    /// A helper thread of the engine failed and was restarted (see
    /// `Engine::take_io_incident`): a non-fatal `Error` event; the generation goes on.
    fn report_io_incident(&mut self, emit: &mut dyn FnMut(Event)) {
        if let Some(message) = self.engine.take_io_incident() {
            emit(Event::Error {
                message,
                fatal: false,
            });
        }
    }

    /// The model file is memory-mapped: if another process truncates or rewrites it, what is
    /// read from the mapping is no longer the model (a page that vanished mid-token reads as
    /// zeros: `format::sigbus`). Checked before every token (`Engine::check_files`: the SIGBUS
    /// flag, then `fstat` of the descriptor opened with the mapping, so a file replaced by
    /// rename — harmless, the old inode stays mapped — is not reported) and inside every token
    /// after each layer (the flag).
    fn check_model_file(&self) -> Result<(), String> {
        self.engine.check_files().map_err(|e| e.to_string())
    }

    fn fail(
        &mut self,
        out: GenOutcome,
        e: ForwardError,
        emit: &mut dyn FnMut(Event),
    ) -> GenOutcome {
        let reason = match e {
            ForwardError::Stopped => StopReason::Stopped,
            ForwardError::ContextFull { .. } => StopReason::ContextFull,
            ForwardError::BadToken { .. }
            | ForwardError::ExpertRead { .. }
            | ForwardError::ModelChanged(_)
            | ForwardError::NonFinite(_) => StopReason::Error,
        };
        let msg = (reason != StopReason::Stopped).then(|| e.to_string());
        self.fail_msg(out, reason, msg, emit)
    }

    /// Ends a generation with `reason`; `msg` (if any) becomes the outcome's error and an
    /// `Error` event.
    fn fail_msg(
        &mut self,
        mut out: GenOutcome,
        reason: StopReason,
        msg: Option<String>,
        emit: &mut dyn FnMut(Event),
    ) -> GenOutcome {
        // A partially processed position is discarded (the KV length only advances on success).
        self.context.truncate(self.engine.pos());
        out.reason = Some(reason);
        if let Some(m) = msg {
            out.error = Some(m.clone());
            emit(Event::Error {
                message: m,
                fatal: false,
            });
        }
        emit(Event::Done {
            reason,
            n_tokens: out.tokens.len() as u32,
            decode_ns: out.decode_ns,
            pos: Some(self.engine.pos() as u32),
            ttft_ns: out.ttft_ns,
        });
        out
    }

    pub fn reset(&mut self) {
        self.engine.reset();
        self.context.clear();
    }

    /// Makes the context a prefix of `ids`: keeps the longest common prefix of the cached
    /// context and `ids` (truncating the KV cache there) and returns the tokens still to feed.
    pub fn sync_prompt(&mut self, ids: &[u32]) -> Vec<u32> {
        let mut common = self
            .context
            .iter()
            .zip(ids)
            .take_while(|(a, b)| a == b)
            .count();
        // Always re-feed at least one token so there are fresh logits to sample from.
        if common == ids.len() && common > 0 {
            common -= 1;
        }
        let common = self.engine.truncate_context(common);
        self.context.truncate(common);
        ids[common..].to_vec()
    }
}
