//! The event stream (engine → UI / recorder) and the command stream (UI → engine).
//! Live runs and replays produce exactly these values; every pane is a function of them.

use serde::{Deserialize, Serialize};

/// Static description of the loaded model, sent once when a session starts.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ModelSummary {
    pub name: String,
    pub arch: String,
    /// True when the weights are synthetic (random): the UI must say the text is noise.
    pub synthetic: bool,
    pub n_layers: u32,
    pub d_model: u32,
    pub n_heads: u32,
    pub n_kv_heads: u32,
    pub d_ff: u32,
    pub n_experts: u32,
    pub top_k: u32,
    pub expert_ffn: u32,
    pub vocab: u32,
    pub max_ctx: u32,
    pub dense_delay: u32,
    pub expert_delay: u32,
    pub combine_style: String,
    /// Quant type names in use, e.g. ["Q4_1", "Q8_0", "F32"].
    pub quant_types: Vec<String>,
    pub has_chat_template: bool,
    /// Per-layer modelled bytes per token by stream (attention, dense, top-k experts), as stored
    /// (scales and tile headers included).
    pub layer_bytes: Vec<StreamBytes>,
    /// The same in the paper's convention (payload bits per weight only, e.g. Q4 = 0.5 B/param);
    /// the critical-path pane uses it when present.
    #[serde(default)]
    pub layer_payload_bytes: Vec<StreamBytes>,
    /// Bytes of the vocabulary (LM head) stream per token.
    pub vocab_bytes: u64,
    /// Hash of header + directory, hex.
    pub file_hash: String,
}

impl ModelSummary {
    /// Stream bytes for the critical-path model: the paper's payload convention when known.
    pub fn critical_bytes(&self) -> &[StreamBytes] {
        if self.layer_payload_bytes.is_empty() {
            &self.layer_bytes
        } else {
            &self.layer_payload_bytes
        }
    }
}

/// Bytes per stream.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct StreamBytes {
    pub attn: u64,
    pub dense: u64,
    pub experts: u64,
}

/// Engine settings that A/B toggles change; sent at start and after every change.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct EngineConfigInfo {
    pub threads: u32,
    pub isa: String,
    pub prefetch: bool,
    pub fetch: String,
    pub expert_tier: String,
    pub layout: String,
    /// Layouts that can be switched to right now.
    pub layouts_available: Vec<String>,
    /// A note when a mode degenerated (e.g. "O_DIRECT refused: buffered pread").
    pub notes: Vec<String>,
}

/// Measured stats of one layer for one token.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct LayerStat {
    pub bytes: StreamBytes,
    pub ns_attn: u64,
    pub ns_dense: u64,
    pub ns_router: u64,
    pub ns_experts: u64,
    /// Routing decided at this layer: (expert id, weight), best first. Empty for dense layers.
    pub routing: Vec<(u16, f32)>,
    /// Expert I/O for this layer (staged/sync fetch): compute, reader-busy and wait ns.
    pub io: Option<LayerIo>,
}

#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct LayerIo {
    pub compute_ns: u64,
    pub io_ns: u64,
    pub wait_ns: u64,
    pub bytes: u64,
}

/// Hardware or software counters for one token (per phase where available).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct PmuSample {
    /// None when hardware counters work; otherwise the reason they do not.
    pub unavailable: Option<String>,
    /// Per phase ("attention", "dense", "experts", "lm_head"): counter name → value.
    pub phases: Vec<(String, Vec<(String, u64)>)>,
    /// Software counters for the token (task-clock ns, page-faults, context-switches).
    pub software: Vec<(String, u64)>,
}

/// Everything measured for one generated (or prefilled) token.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct TokenStats {
    /// 0-based index of the token in this generation.
    pub index: u32,
    /// Position in the context (KV slot).
    pub pos: u32,
    pub ns_total: u64,
    pub ns_lm_head: u64,
    pub vocab_bytes: u64,
    pub layers: Vec<LayerStat>,
    pub pmu: Option<PmuSample>,
}

/// Why a generation ended.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    Length,
    Eos,
    Stopped,
    ContextFull,
    Error,
}

/// One engine event.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Event {
    /// Session start: model and engine configuration.
    Session {
        model: Box<ModelSummary>,
        config: EngineConfigInfo,
    },
    /// A prompt (or chat turn) was submitted; `tokens` are the ids fed to the model.
    Prompt {
        text: String,
        tokens: Vec<u32>,
        chat: bool,
    },
    /// Prefill finished.
    Prefill { n_tokens: u32, ns: u64 },
    /// A generated token, with its decoded text piece (may be empty mid-UTF-8 sequence).
    Token { index: u32, id: u32, text: String },
    /// Measurements of the token just produced.
    Stats(TokenStats),
    /// Engine configuration changed (a toggle took effect at a token boundary).
    Config(EngineConfigInfo),
    /// Generation finished (also when it was refused or failed: every `Prompt` ends with one).
    Done {
        reason: StopReason,
        n_tokens: u32,
        decode_ns: u64,
        /// Context positions in use afterwards (the KV cache length), as the engine counts them;
        /// absent in traces recorded before this field existed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pos: Option<u32>,
    },
    /// Context was reset (KV cleared).
    Reset,
    /// A non-fatal message for the user (e.g. "dropped 2 oldest turns").
    Notice { message: String },
    /// An error; the engine stays usable unless `fatal`.
    Error { message: String, fatal: bool },
    /// Generation settings that change the answers (sampling, system prompt, numerics): sent
    /// after `Session` and after every change, so traces record them like the toggles.
    Settings(GenSettings),
    /// A saved conversation was loaded (`--transcript FILE`): the next chat turn continues it.
    History { messages: Vec<HistoryMessage> },
}

/// What the engine answers with: sampling, system prompt and the numerics in use.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct GenSettings {
    pub sampling: SamplingParams,
    /// The chat template's system message for the next turn ("" = none).
    #[serde(default)]
    pub system: String,
    /// Activation numerics of the matvecs: "q8" (quantized, integer dots) or "f32".
    pub act: String,
    /// Element type of the KV cache.
    pub kv: String,
}

/// One message of a loaded conversation.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct HistoryMessage {
    /// "user" | "assistant".
    pub role: String,
    pub text: String,
}

/// A recorded event with its monotonic timestamp (ns since the session started).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Stamped {
    pub t_ns: u64,
    #[serde(flatten)]
    pub event: Event,
}

/// Sampling parameters.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SamplingParams {
    /// 0 = greedy.
    pub temperature: f32,
    pub top_k: u32,
    pub top_p: f32,
    /// Keep tokens with probability ≥ min_p × the top token's (0 = off); absent in older traces.
    #[serde(default)]
    pub min_p: f32,
    pub repeat_penalty: f32,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.0,
            repeat_penalty: 1.0,
            seed: 0,
        }
    }
}

/// Commands from the UI (or a driver) to the engine thread.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Command {
    /// Plain completion of `text` (continues the current context).
    Complete {
        text: String,
        max_tokens: u32,
    },
    /// A chat turn: the template is applied by the engine side.
    Chat {
        text: String,
        max_tokens: u32,
    },
    /// Stop the current generation (within one layer).
    Stop,
    /// Clear the context.
    Reset,
    SetPrefetch(bool),
    /// "sync" | "staged"
    SetFetch(String),
    /// "mmap" | "direct"
    SetExpertTier(String),
    /// "cflow" | "vflow" | "rowmajor"
    SetLayout(String),
    /// "sequential" | "vertical" | "auto"
    SetSchedule(String),
    SetSampling(SamplingParams),
    SetSystemPrompt(String),
    /// Replace the conversation (system prompt and turns) with a loaded transcript; the next
    /// chat turn renders and prefills it.
    LoadConversation {
        system: String,
        messages: Vec<HistoryMessage>,
    },
    Quit,
}
