//! The event stream (engine → UI / recorder) and the command stream (UI → engine).
//! Live runs and replays produce exactly these values; every pane is a function of them.

use crate::toggles::{ExpertTier, FetchMode, Layout, Schedule};
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
    /// Route-ahead distance (`moefy --route-from D`): layer ℓ's experts are chosen at layer ℓ−D.
    /// 0 (omitted) for every other model and in older traces.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub route_ahead: u32,
    pub combine_style: String,
    /// Quant type names in use, e.g. ["Q4_1", "Q8_0", "F32"].
    pub quant_types: Vec<String>,
    pub has_chat_template: bool,
    /// Per-layer modelled bytes per token by stream (attention, dense, top-k experts), as stored
    /// (scales and tile headers included).
    pub layer_bytes: Vec<StreamBytes>,
    /// The same in payload bits per weight only (e.g. Q4 = 0.5 B/param), as read: the dense FFN
    /// of a layer whose input is known to be zero (ℓ < δd) reads nothing.
    #[serde(default)]
    pub layer_payload_bytes: Vec<StreamBytes>,
    /// Payload over every layer's weights, zero-input FFNs included: the paper's convention for
    /// eq. 4.23 (Table 4.1). Absent in older traces.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layer_payload_bytes_all: Vec<StreamBytes>,
    /// Bytes of the LM head stream per token (`vocab_bytes` in traces before 2.0).
    #[serde(alias = "vocab_bytes")]
    pub lm_head_bytes: u64,
    /// K (and V) width per position of one layer's KV cache (n_kv_heads × head_dim); 0 when
    /// unknown (traces recorded before the KV stream was counted).
    #[serde(default)]
    pub kv_dim: u32,
    /// Bytes of one cached K or V element (4 for the f32 cache); 0 when unknown.
    #[serde(default)]
    pub kv_elem_bytes: u32,
    /// Sliding-window size per effective layer (0 or absent = full attention).
    #[serde(default)]
    pub kv_window: Vec<u32>,
    /// The `inspect --json` report of the model file (`crate::inspect::report`), for the TUI's
    /// model-info overlay; absent in older traces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inspect: Option<serde_json::Value>,
    /// Hash of header + directory, hex.
    pub file_hash: String,
}

fn is_zero_u32(v: &u32) -> bool {
    *v == 0
}

impl ModelSummary {
    /// Bytes of KV cache a token at context position `pos` reads: per effective layer, K and V
    /// over every attended position (pos + 1, or the layer's sliding window when smaller).
    /// None when the session did not describe its KV cache.
    pub fn kv_read_bytes(&self, pos: u32) -> Option<u64> {
        if self.kv_dim == 0 || self.kv_elem_bytes == 0 {
            return None;
        }
        (0..self.n_layers)
            .map(|l| self.kv_layer_read_bytes(l, pos))
            .sum()
    }

    /// [`kv_read_bytes`](Self::kv_read_bytes) of effective layer `layer` alone.
    pub fn kv_layer_read_bytes(&self, layer: u32, pos: u32) -> Option<u64> {
        if self.kv_dim == 0 || self.kv_elem_bytes == 0 {
            return None;
        }
        let per_pos = 2 * self.kv_dim as u64 * self.kv_elem_bytes as u64;
        let all = pos as u64 + 1;
        let attended = match self.kv_window.get(layer as usize).copied().unwrap_or(0) {
            0 => all,
            w => all.min(w as u64),
        };
        Some(per_pos * attended)
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
    /// Where decode reads the weights: "mmap" (the file's page cache) or "resident" (a private
    /// copy in huge pages); empty in traces recorded before it was recorded.
    #[serde(default)]
    pub weights: String,
    /// The resident copy's matrices were repacked at open (`CflowFile::is_repacked`); false in
    /// traces recorded before it was recorded.
    #[serde(default)]
    pub repacked: bool,
    /// Reader threads of the direct tier (0 in traces recorded before it was recorded).
    #[serde(default)]
    pub readers: u32,
    pub fetch: FetchMode,
    pub expert_tier: ExpertTier,
    pub layout: Layout,
    /// Layouts that can be switched to right now.
    pub layouts_available: Vec<Layout>,
    /// A note when a mode degenerated (e.g. "O_DIRECT refused: buffered pread").
    pub notes: Vec<String>,
}

/// Measured stats of one layer for one token.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct LayerStat {
    pub bytes: StreamBytes,
    /// Measured wall ns on the engine thread, per phase. Where the shared and routed experts
    /// run fused (docs/SEMANTICS.md X3), `ns_dense` and `ns_experts` split that run's time by
    /// bytes (modelled), and `ns_router` is only the routing's queueing: its selection ran
    /// inside the fused run.
    pub ns_attn: u64,
    pub ns_dense: u64,
    pub ns_router: u64,
    pub ns_experts: u64,
    /// Routing decided at this layer: (expert id, weight), best first. Empty for dense layers.
    pub routing: Vec<(u16, f32)>,
    /// Expert I/O for this layer (staged/sync fetch): compute, reader-busy and wait ns.
    pub io: Option<LayerIo>,
}

/// One layer's expert I/O on the direct tier (measured).
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct LayerIo {
    /// The layer's time not spent waiting for expert reads.
    pub compute_ns: u64,
    /// Reader-busy time of the expert reads issued at this layer (their preads).
    pub io_ns: u64,
    /// Time the compute thread waited for expert reads in this layer.
    pub wait_ns: u64,
    /// Bytes read from disk for the experts routed at this layer (regions the expert cache
    /// served count 0; speculative reads the routing did not use: `PrefetchStat::wasted_bytes`).
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
    /// Bytes the LM head read (`vocab_bytes` in traces before 2.0).
    #[serde(alias = "vocab_bytes")]
    pub lm_head_bytes: u64,
    pub layers: Vec<LayerStat>,
    pub pmu: Option<PmuSample>,
    /// The prefetch thread's hints for this token (None when it is off; absent in old traces).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefetch: Option<PrefetchStat>,
    /// What the engine actually ran for this token (absent in old traces): the key of the A/B
    /// comparisons, which must not trust the UI's request (`Config`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ran: Option<RunInfo>,
    /// The direct tier's expert cache over this token (None when it is off or the experts came
    /// from memory; absent in older traces).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expert_cache: Option<ExpertCacheStat>,
    /// The worker pool's threads over this token, index 0 the engine thread itself (it runs
    /// tasks too), then each worker: wall time spent running tasks and how many (measured on
    /// each thread, `ThreadPool::set_thread_timing`). Empty when timings are off, under the
    /// vertical schedule, and in older traces. Boxed: `Event::Stats` stays small.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_threads: Option<Box<PoolThreads>>,
}

impl TokenStats {
    /// [`TokenStats::pool_threads`] as a slice (empty when not recorded).
    pub fn pool_threads(&self) -> &[PoolThreadStat] {
        self.pool_threads.as_deref().map_or(&[], |p| &p.0)
    }
}

/// The pool threads of one token (see [`TokenStats::pool_threads`]); a JSON array.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct PoolThreads(pub Vec<PoolThreadStat>);

/// One worker-pool thread's work over one token (see [`TokenStats::pool_threads`]).
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct PoolThreadStat {
    /// Wall ns the thread spent running pool tasks (its own clock).
    pub busy_ns: u64,
    /// Pool tasks it ran.
    pub tasks: u64,
}

/// The engine's own report of how it computed one token (filled by the decode step): every
/// setting that changes ms/token, as run rather than as asked. A requested mode the engine could
/// not or did not apply shows here as what happened instead (e.g. `prefetch: false` under the
/// rowmajor layout, which issues no hints; `tier: "mmap"` when the experts came from memory on
/// the direct tier).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq, Hash)]
pub struct RunInfo {
    /// The prefetch thread hinted this token's ranges.
    pub prefetch: bool,
    /// "sync" | "staged" when the experts were read from disk by the fetcher, "" (None)
    /// otherwise (the fetch mode then has no effect).
    #[serde(with = "empty_is_none")]
    pub fetch: Option<FetchMode>,
    /// Where the experts came from: "direct" (read from disk through the fetcher), "mmap"
    /// (memory: the map or the row-major copy), "" (None: no experts).
    #[serde(with = "empty_is_none")]
    pub tier: Option<ExpertTier>,
    /// "cflow" | "vflow" | "rowmajor".
    pub layout: Layout,
    /// The schedule the token ran under: "sequential" | "vertical" (also while `auto` measures).
    pub schedule: Schedule,
    /// Pool threads.
    pub threads: u32,
    /// "mmap" | "resident" | "resident repacked".
    pub weights: String,
    /// Activation numerics ("q8" | "f32") and KV element type ("f16" | "bf16" | "f32").
    pub act: String,
    pub kv: String,
    /// The direct tier's expert cache capacity in MiB (0: off, or the experts came from
    /// memory; absent in older traces).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub expert_cache_mib: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// An optional toggle value written as its string, `""` for none (the trace's spelling of "not
/// in effect").
mod empty_is_none {
    use serde::de::{value::StrDeserializer, DeserializeOwned};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<T: Serialize, S: Serializer>(v: &Option<T>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(v) => v.serialize(s),
            None => s.serialize_str(""),
        }
    }

    pub fn deserialize<'de, T: DeserializeOwned, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<T>, D::Error> {
        let s = String::deserialize(d)?;
        if s.is_empty() {
            return Ok(None);
        }
        T::deserialize(StrDeserializer::<D::Error>::new(&s)).map(Some)
    }
}

/// The direct tier's expert cache over one token: regions served from memory (`hits`) and read
/// from disk (`misses`), and the cache's capacity and fill at the end of the token.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ExpertCacheStat {
    pub hits: u32,
    pub misses: u32,
    pub capacity_bytes: u64,
    pub cached_bytes: u64,
}

impl ExpertCacheStat {
    /// Add another token's hits and misses (capacity and fill: the later token's).
    pub fn add(&mut self, o: &ExpertCacheStat) {
        self.hits += o.hits;
        self.misses += o.misses;
        self.capacity_bytes = o.capacity_bytes;
        self.cached_bytes = o.cached_bytes;
    }

    /// hits / (hits + misses) (None before any read).
    pub fn hit_rate(&self) -> Option<f64> {
        let n = self.hits + self.misses;
        (n > 0).then(|| self.hits as f64 / n as f64)
    }
}

/// The prefetch of one token. `sent` / `dropped` count the prefetch thread's hint commands
/// (attention and dense ranges, and on the mmap tier expert tiles) queued / dropped on a full
/// channel. `predicted` counts the expert ids fetched ahead for the next routed layer, `hits`
/// those of them that layer then actually routed. The prediction depends on the tier: on the
/// mmap tier the current routing's ids, hinted with `PREFETCHT0` (paper §3.9.2); on the direct
/// tier the next layer's own router applied one layer early, its experts read into staging
/// slots (an extension, docs/SEMANTICS.md), and `wasted_bytes` counts the bytes of those reads
/// the routing did not use.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct PrefetchStat {
    pub sent: u32,
    pub dropped: u32,
    pub predicted: u32,
    pub hits: u32,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub wasted_bytes: u64,
}

impl PrefetchStat {
    /// Add another token's counts.
    pub fn add(&mut self, o: &PrefetchStat) {
        self.sent += o.sent;
        self.dropped += o.dropped;
        self.predicted += o.predicted;
        self.hits += o.hits;
        self.wasted_bytes += o.wasted_bytes;
    }

    /// hits / predicted (None before any prediction was checked).
    pub fn hit_rate(&self) -> Option<f64> {
        (self.predicted > 0).then(|| self.hits as f64 / self.predicted as f64)
    }

    /// dropped / (sent + dropped) (None before any command).
    pub fn drop_rate(&self) -> Option<f64> {
        let n = self.sent + self.dropped;
        (n > 0).then(|| self.dropped as f64 / n as f64)
    }
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
        /// Time to first token: from the start of the prompt's prefill to the first generated
        /// token sampled (`GenOutcome::ttft_ns`); absent when no token was generated and in
        /// traces recorded before this field existed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ttft_ns: Option<u64>,
    },
    /// Context was reset (KV cleared).
    Reset,
    /// State a recording begun mid-session needs beyond its `Session` event (which it follows):
    /// the context position (KV length) at that moment.
    Snapshot { ctx_pos: u32 },
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
    SetFetch(FetchMode),
    /// `Auto` is resolved as when the model opens.
    SetExpertTier(ExpertTier),
    SetLayout(Layout),
    SetSchedule(Schedule),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_read_bytes_by_hand() {
        // SmolLM2-135M: 30 layers, 3 KV heads × 64 = 192, f32 cache. At ctx 1554 (pos 1553):
        // 2 (K, V) × 192 × 4 B × 1554 positions × 30 layers = 71,608,320 bytes.
        let mut m = ModelSummary {
            n_layers: 30,
            kv_dim: 192,
            kv_elem_bytes: 4,
            ..ModelSummary::default()
        };
        assert_eq!(m.kv_read_bytes(1553), Some(71_608_320));
        assert_eq!(m.kv_read_bytes(0), Some(2 * 192 * 4 * 30));
        // Sliding windows of 512 on every other layer (Gemma-style).
        m.kv_window = (0..30).map(|l| if l % 2 == 0 { 512 } else { 0 }).collect();
        assert_eq!(
            m.kv_read_bytes(1553),
            Some(2 * 192 * 4 * (15 * 1554 + 15 * 512))
        );
        // Unknown (old trace): no KV stream rather than a made-up one.
        assert_eq!(ModelSummary::default().kv_read_bytes(10), None);
    }
}
