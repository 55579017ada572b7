//! The decode engine: one open model, its options, and the state a token needs. The token itself
//! is in [`decode`] (the loop), built from the style table ([`styles`]), the delay scheduler
//! ([`schedule`]), the layer functions ([`layer`], [`moe`]), the expert I/O points
//! ([`expert_io`]) and the second core of the vertical schedule ([`vertical`]). Prompts are fed
//! by [`prefill`]. Also here: the sampler, the critical-path analyzer, the memory check at open
//! and the engine thread.
//!
//! Module map: `options` (what a caller chooses, `CFLOW_*` read once), `styles` (combine styles
//! as data), `schedule` (§4.4 ring + expert queue), `decode` (the token loop), `token` (what a token touches; its dense/route/inject stages), `prefill`
//! (batched prompt), `layer` (attention, dense FFN, LM head), `moe` (router, experts),
//! `expert_io` (fetch/prefetch points), `vertical` (the second core), `weights` (where tiles
//! come from, matvec), `scratch` (buffers and their shapes), `streams` (bytes per stream),
//! `worker` (the engine thread and its channels), `engine_loop` (that thread's loop: one method
//! per message), `probe` (a phase's timer).

pub mod capture;
pub mod critical;
pub mod decode;
mod engine_loop;
pub mod expert_io;
pub mod finite;
pub mod kernel_prefetch;
pub mod kv;
pub mod kv_budget;
pub mod layer;
pub mod moe;
pub mod ops;
pub mod options;
pub mod prefill;
mod probe;
pub mod routing_log;
pub mod sampler;
pub mod schedule;
pub mod scratch;
pub mod session;
pub mod step_split;
pub mod streams;
pub mod styles;
pub mod token;
pub mod vertical;
pub mod weights;
pub mod worker;

pub use options::{default_threads, EngineOptions, ExpertTier, FetchMode, Layout, Schedule};
pub use streams::stream_bytes;

use crate::engine::kv::KvCache;
use crate::format::reader::ExpertView;
use crate::format::CflowFile;
use crate::io::{ExpertFetcher, FetchHooks, Prefetcher};
use crate::kernels::pool::ThreadPool;
use crate::model::ModelConfig;
use crate::telemetry::{EngineConfigInfo, TokenStats};
use schedule::DelaySchedule;
use scratch::Scratch;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use styles::StyleRule;
use weights::{relative_experts, RowMajorWeights};

/// `EngineOptions::expert_cache_mib` asking for [`auto_cache_mib`] (`--expert-cache-mib auto`).
pub const CACHE_AUTO: u64 = u64::MAX;

/// The expert cache `auto` sizes, in MiB: a third of the memory available at open (`available`
/// bytes, cgroup limits included; 0 when unknown), at most `expert_bytes` (every expert of the
/// model). A third leaves the rest to the page cache of the weights read through the map and to
/// the KV cache; measured on the 30B-A3B geometry under 4 and 8 GiB limits and without one
/// (docs/MOE.md, "Larger than memory").
pub fn auto_cache_mib(expert_bytes: u64, available: Option<u64>) -> u64 {
    let third = available.unwrap_or(0) / 3;
    third.min(expert_bytes).div_ceil(1 << 20)
}

/// Binds every matrix of `file` to its kernel on `isa` (`kernels::dot::select`), when this
/// engine holds the only reference (the CLI binds at open, `cli::model::open_for_decode`). A
/// file shared with another engine keeps its binding: a matrix bound for another ISA, or not
/// at all, has its kernel chosen per matvec.
fn bind_kernels(file: &mut Arc<CflowFile>, isa: crate::kernels::Isa) {
    if let Some(f) = Arc::get_mut(file) {
        crate::kernels::dot::select::bind(f, isa);
    }
}

/// Why a forward pass did not complete.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    #[error("stopped")]
    Stopped,
    #[error("context full: position {pos} >= max context {max}")]
    ContextFull { pos: usize, max: usize },
    #[error("token id {id} out of range (vocab {vocab})")]
    BadToken { id: u32, vocab: usize },
    /// A direct-tier expert read failed (I/O error, short read, reader panic). The token is
    /// abandoned; every staging slot is free again and the next token can run.
    #[error("expert read failed: {path} layer {layer} expert {expert} (offset {offset}, {len} bytes): {error}")]
    ExpertRead {
        path: String,
        layer: usize,
        expert: usize,
        offset: u64,
        len: u64,
        error: String,
    },
    /// The mapped model file (or its `.vflow` twin) was truncated or rewritten while in use:
    /// this token is discarded and every later one is refused until the model is reopened.
    #[error(transparent)]
    ModelChanged(crate::format::FormatError),
    #[error(transparent)]
    NonFinite(#[from] finite::NonFinite),
}

/// The check between two layers of a token, in decode and prefill: a stop request ends the
/// token, and so does a model file whose pages vanished under a read (SIGBUS absorbed).
pub(crate) fn between_layers(
    stop: &AtomicBool,
    file: &crate::format::CflowFile,
) -> Result<(), ForwardError> {
    if stop.load(std::sync::atomic::Ordering::Relaxed) {
        return Err(ForwardError::Stopped);
    }
    if file.changed() {
        return Err(ForwardError::ModelChanged(file.changed_error()));
    }
    Ok(())
}

/// The `Auto` schedule's measurement: decode steps alternate sequential / vertical until each
/// has [`AUTO_SAMPLES`] timings (the first of each is a warm-up and dropped); then the schedule
/// with the lower minimum ns per token is kept until the options change.
#[derive(Clone, Debug, Default)]
struct AutoPick {
    /// ns per token measured under [sequential, vertical].
    ns: [Vec<u64>; 2],
    chosen: Option<Schedule>,
}

/// Timed tokens per schedule before `Auto` decides (plus one warm-up each).
pub const AUTO_SAMPLES: usize = 4;

/// The decode engine over one open model. Invariants kept by its methods: `kv`, `s` and
/// `sched` are shaped for `cfg` (`cap_context` changes both `cfg.max_ctx` and the cache's);
/// the fetcher reads the active file (reopened when the layout changes it); `rel_experts`
/// describes the active file.
pub struct Engine {
    file: Arc<CflowFile>,
    /// Views of the `.vflow` twin (read instead of `file` when the layout is `Vflow`).
    vflow: Option<Arc<CflowFile>>,
    cfg: ModelConfig,
    opts: EngineOptions,
    pool: ThreadPool,
    kv: KvCache,
    rowmajor: Option<RowMajorWeights>,
    s: Scratch,
    /// Batched prefill's buffers, reused by every batch.
    batch: scratch::BatchScratch,
    /// The combine style as data.
    rule: StyleRule,
    /// The residual ring and the expert queue (§4.4).
    sched: DelaySchedule,
    /// Stats of the last forward pass.
    stats: TokenStats,
    /// Set to stop the current forward pass at the next layer boundary.
    stop: Arc<AtomicBool>,
    /// Per-phase counters on the engine thread (disabled unless requested).
    pmu: crate::telemetry::pmu::Pmu,
    /// Expert views with stripe offsets relative to their region start, per physical layer.
    rel_experts: Vec<Vec<ExpertView>>,
    /// The direct-tier expert fetcher (created on first use).
    fetcher: Option<ExpertFetcher>,
    prefetcher: Option<Prefetcher>,
    /// The two cores of the vertical schedule (created on first use).
    cores: Option<vertical::Cores>,
    auto: AutoPick,
    /// Vertical schedule: the experts go to the second core ([`vertical::experts_aside`]).
    experts_aside: bool,
    /// Sticky notes about degraded modes (shown in `EngineConfigInfo.notes`).
    notes: Vec<String>,
    /// Decode steps' time split (with `opts.step_split`, sequential schedule), until taken.
    split: step_split::StepSplit,
    /// Every step's routing, when asked for (`set_routing_log`), until taken.
    routing_log: Option<Vec<routing_log::RoutedPosition>>,
}

impl Engine {
    pub fn new(mut file: Arc<CflowFile>, opts: EngineOptions) -> Engine {
        bind_kernels(&mut file, opts.isa);
        let cfg = file.cfg.clone();
        let le = cfg.effective_layers();
        let rule = StyleRule::of(&cfg);
        let windows = (0..le)
            .map(|l| cfg.sliding_window_for(rule.block_of(l)))
            .collect();
        let mut e = Engine {
            kv: KvCache::new(le, cfg.kv_dim(), cfg.head_dim, cfg.max_ctx, opts.kv)
                .with_windows(windows),
            pool: ThreadPool::new(opts.threads),
            s: Scratch::new(&cfg),
            batch: Default::default(),
            rule,
            sched: DelaySchedule::new(&cfg),
            file,
            vflow: None,
            cfg,
            rowmajor: None,
            stats: TokenStats::default(),
            stop: Arc::new(AtomicBool::new(false)),
            pmu: crate::telemetry::pmu::Pmu::disabled(),
            rel_experts: Vec::new(),
            fetcher: None,
            prefetcher: None,
            cores: None,
            auto: AutoPick::default(),
            experts_aside: false,
            notes: Vec::new(),
            split: step_split::StepSplit::default(),
            routing_log: None,
            opts,
        };
        if e.opts.expert_cache_mib == CACHE_AUTO {
            let avail = kv_budget::available_memory().map(|a| a.bytes);
            e.opts.expert_cache_mib = auto_cache_mib(streams::all_expert_bytes(&e.file), avail);
        }
        e.resolve_expert_tier();
        e.experts_aside = vertical::experts_aside(&stream_bytes(&e.file), e.cfg.dense_delay);
        e.rel_experts = relative_experts(&e.file, e.opts.isa);
        if e.opts.layout == Layout::RowMajor {
            e.build_rowmajor();
        }
        if e.opts.layout == Layout::Vflow {
            // No twin yet: run from the .cflow until `attach_vflow` + `set_layout`.
            e.opts.layout = Layout::Cflow;
        }
        e
    }

    /// The model file (the `.cflow`, also when the layout reads its `.vflow` twin).
    pub fn file(&self) -> &Arc<CflowFile> {
        &self.file
    }

    /// What the KV cache stores.
    pub fn kv_type(&self) -> crate::engine::kv::KvType {
        self.kv.ty()
    }

    /// The model configuration (its `max_ctx` is the context this engine runs to).
    pub fn cfg(&self) -> &ModelConfig {
        &self.cfg
    }

    pub fn opts(&self) -> &EngineOptions {
        &self.opts
    }

    /// Stats of the last forward pass.
    /// The decode steps' time split since the last call ([`step_split`]; empty unless
    /// `EngineOptions::step_split`, and under the vertical schedule), and a fresh start.
    pub fn take_step_split(&mut self) -> step_split::StepSplit {
        std::mem::take(&mut self.split)
    }

    /// Keeps (or stops keeping) what each layer's dense FFN saw at the last step
    /// ([`capture::FfnCapture`]; the token-by-token path: batched prefill is off while it is on).
    pub fn set_ffn_capture(&mut self, on: bool) {
        self.s.capture =
            on.then(|| vec![capture::FfnCapture::default(); self.cfg.effective_layers()]);
        self.opts.batch_prefill &= !on;
    }

    /// What each layer's dense FFN saw at the last step, when capturing.
    pub fn ffn_capture(&self) -> Option<&[capture::FfnCapture]> {
        self.s.capture.as_deref()
    }

    /// Keeps (or stops keeping) the routing of every position stepped from now on.
    pub fn set_routing_log(&mut self, on: bool) {
        self.routing_log = on.then(Vec::new);
    }

    /// The routing kept since `set_routing_log(true)` (or the last take), oldest first.
    pub fn take_routing_log(&mut self) -> Vec<routing_log::RoutedPosition> {
        self.routing_log
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    pub fn stats(&self) -> &TokenStats {
        &self.stats
    }

    /// The flag that stops the current forward pass at the next layer boundary (the caller
    /// clears it before the next one).
    pub fn stop_flag(&self) -> &Arc<AtomicBool> {
        &self.stop
    }

    pub fn pmu(&self) -> &crate::telemetry::pmu::Pmu {
        &self.pmu
    }

    /// Replaces the per-phase counters (e.g. `Pmu::new()` to enable them).
    pub fn set_pmu(&mut self, pmu: crate::telemetry::pmu::Pmu) {
        self.pmu = pmu;
    }

    /// Lowers the context the engine runs to at most `n` positions (`n` ≥ 1; never above the
    /// model's): the configuration and the KV cache together.
    pub fn cap_context(&mut self, n: usize) {
        let n = n.max(1).min(self.cfg.max_ctx);
        self.cfg.max_ctx = n;
        self.kv.max_ctx = n;
    }

    /// Keeps every position of every layer, sliding-window layers too (the cache before
    /// [`KvCache::with_windows`]): the reference the windowed cache is tested against. Only
    /// before the first token.
    pub fn kv_without_windows(&mut self) {
        let le = self.cfg.effective_layers();
        self.kv = std::mem::replace(&mut self.kv, KvCache::new(0, 1, 1, 0, self.opts.kv))
            .with_windows(vec![0; le]);
    }

    /// Keeps the first `len` cached positions (a shared prompt prefix) and drops the rest.
    /// Returns the positions kept: `len`, or fewer when the cache no longer holds what position
    /// `len` needs (a sliding-window layer rolled back past its slack: [`KvCache::truncate`]).
    pub fn truncate_context(&mut self, len: usize) -> usize {
        self.kv.truncate(len)
    }

    /// True when the vertical schedule has independent work to place on a second core: a dense
    /// delay (the FFN input is known δd layers early) or an expert delay with experts computed
    /// from the map or the row-major copy (staged reads stay with the engine thread).
    pub fn vertical_applies(&self) -> bool {
        (self.cfg.dense_delay >= 1 && self.cfg.has_dense())
            || (self.cfg.expert_delay >= 1 && self.cfg.has_experts() && !self.fetching())
    }

    /// The schedule the next token runs under.
    fn schedule_now(&self) -> Schedule {
        if !self.vertical_applies() {
            return Schedule::Sequential;
        }
        match (self.opts.schedule, self.auto.chosen) {
            (Schedule::Auto, Some(c)) => c,
            (Schedule::Auto, None) => {
                if self.auto.ns[0].len() <= self.auto.ns[1].len() {
                    Schedule::Sequential
                } else {
                    Schedule::Vertical
                }
            }
            (s, _) => s,
        }
    }

    /// `Auto`: records the time of a token run under `ran`; decides once both have enough.
    fn auto_record(&mut self, ran: Schedule, ns: u64) {
        if self.opts.schedule != Schedule::Auto || self.auto.chosen.is_some() {
            return;
        }
        let i = (ran == Schedule::Vertical) as usize;
        self.auto.ns[i].push(ns);
        if self.auto.ns.iter().all(|v| v.len() > AUTO_SAMPLES) {
            let best = |v: &Vec<u64>| v[1..].iter().copied().min().unwrap_or(u64::MAX);
            self.auto.chosen = Some(if best(&self.auto.ns[1]) < best(&self.auto.ns[0]) {
                Schedule::Vertical
            } else {
                Schedule::Sequential
            });
        }
    }

    /// The schedule as the UI shows it (None for `Auto` before it decided).
    fn schedule_note(&self) -> Option<String> {
        match (self.opts.schedule, self.auto.chosen) {
            (Schedule::Auto, None) => None,
            _ if !self.vertical_applies() && self.opts.schedule == Schedule::Auto => None,
            (s, _) if !self.vertical_applies() => Some(format!(
                "schedule {}: runs sequential (δd = δe = 0: no work to overlap)",
                s.name()
            )),
            (Schedule::Auto, Some(c)) => Some(format!("schedule auto → {} (measured)", c.name())),
            (s, _) => Some(format!("schedule {}", s.name())),
        }
    }

    /// Jobs the second core of the vertical schedule ran over this engine's life.
    pub fn vertical_jobs(&self) -> u64 {
        self.cores.as_ref().map_or(0, |c| c.jobs)
    }

    /// The schedule the options ask for and the one the next token runs under.
    pub fn schedule(&self) -> (Schedule, Schedule) {
        (self.opts.schedule, self.schedule_now())
    }

    /// The file the forward pass reads: the `.vflow` twin under `Layout::Vflow`.
    fn active(&self) -> &Arc<CflowFile> {
        match (self.opts.layout, &self.vflow) {
            (Layout::Vflow, Some(v)) => v,
            _ => &self.file,
        }
    }

    /// Unmaps the pages of the model and its twin from this process (they stay in the page
    /// cache until evicted): a cold-read benchmark calls this after opening, whose validation
    /// touched the files through their mappings, and then evicts them.
    pub fn release_pages(&self) {
        self.file.release_pages();
        if let Some(v) = &self.vflow {
            v.release_pages();
        }
    }

    /// The files this engine reads: the model and its attached `.vflow` twin (an output path
    /// must not be one of them).
    pub fn input_files(&self) -> Vec<&std::path::Path> {
        let mut v = vec![self.file.path.as_path()];
        v.extend(self.vflow.as_ref().map(|f| f.path.as_path()));
        v
    }

    /// Attaches the views of a `.vflow` twin of `file` (same configuration; the caller checks
    /// the source hash with `format::vflow::is_twin_of`). Makes `Layout::Vflow` available.
    pub fn attach_vflow(&mut self, mut v: Arc<CflowFile>) -> Result<(), String> {
        if v.cfg != self.cfg || v.layers.len() != self.file.layers.len() {
            return Err(format!(
                "{}: not a twin of {} (configuration differs)",
                v.path.display(),
                self.file.path.display()
            ));
        }
        if self.opts.layout == Layout::Vflow {
            self.quiesce();
            self.fetcher = None;
        }
        bind_kernels(&mut v, self.opts.isa);
        self.vflow = Some(v);
        self.rel_experts = relative_experts(self.active(), self.opts.isa);
        Ok(())
    }

    /// Selects sync or staged expert fetch (takes effect at the next token).
    pub fn set_fetch(&mut self, fetch: FetchMode) {
        self.quiesce();
        self.opts.fetch = fetch;
    }

    /// Selects the expert tier (takes effect at the next token; `Auto` is resolved now, as at
    /// open).
    pub fn set_expert_tier(&mut self, tier: ExpertTier) {
        self.quiesce();
        self.opts.expert_tier = tier;
        self.resolve_expert_tier();
        self.auto = AutoPick::default();
    }

    /// Replaces `ExpertTier::Auto` in the options by the tier it picks for this model
    /// ([`ExpertTier::resolve`]), with a note when it picks direct.
    fn resolve_expert_tier(&mut self) {
        if self.opts.expert_tier == ExpertTier::Auto {
            let size = std::fs::metadata(&self.file.path).map_or(0, |m| m.len());
            let avail = kv_budget::available_memory().map(|a| a.bytes);
            let (tier, why) = ExpertTier::Auto.resolve(size, avail, self.file.is_resident());
            self.opts.expert_tier = tier;
            if let Some(why) = why.filter(|_| self.cfg.has_experts()) {
                self.note(why);
            }
        }
    }

    /// Selects the schedule (takes effect at the next token; `Auto` measures again).
    pub fn set_schedule(&mut self, schedule: Schedule) {
        self.opts.schedule = schedule;
        self.auto = AutoPick::default();
    }

    /// Turns the oracle router on or off (a diagnostic: [`EngineOptions::oracle_router`]).
    /// Refused for a model without experts, and for one whose selected experts are weighted
    /// (the oracle knows which experts matter, not their router weights): only
    /// `router_norm = topk_unweighted` models (moefy's) qualify.
    pub fn set_oracle_router(&mut self, on: bool) -> Result<(), String> {
        if on {
            if !self.cfg.has_experts() {
                return Err("the model has no routed experts".into());
            }
            if self.cfg.meta.router_norm != crate::model::RouterNorm::TopkUnweighted {
                return Err(format!(
                    "the oracle router needs experts summed with weight 1 (as moefy writes them); this model weights them ({:?})",
                    self.cfg.meta.router_norm
                ));
            }
        }
        self.quiesce();
        self.opts.oracle_router = on;
        Ok(())
    }

    /// Sets the direct tier's expert cache to `mib` MiB (0: off; takes effect at the next token,
    /// shrinking evicts the least used regions).
    pub fn set_expert_cache_mib(&mut self, mib: u64) {
        self.quiesce();
        self.opts.expert_cache_mib = mib;
        if let Some(f) = self.fetcher.as_mut() {
            f.set_cache_bytes(mib << 20);
        }
    }

    /// Turns the prefetch thread on or off.
    pub fn set_prefetch(&mut self, on: bool) {
        self.opts.prefetch = on;
        if !on {
            self.prefetcher = None;
        }
    }

    /// Changes the number of reader threads (restarts the fetcher).
    pub fn set_readers(&mut self, n: usize) {
        let n = n.clamp(1, 64);
        if n != self.opts.readers {
            self.quiesce();
            self.fetcher = None;
            self.opts.readers = n;
        }
    }

    /// Changes the fetcher test hooks (restarts the fetcher).
    pub fn set_fetch_hooks(&mut self, hooks: FetchHooks) {
        self.quiesce();
        self.fetcher = None;
        self.opts.fetch_hooks = hooks;
    }

    /// Waits for any read still in flight (after an interrupted token) and frees the slots.
    fn quiesce(&mut self) {
        if let Some(f) = self.fetcher.as_mut() {
            f.drain();
        }
    }

    /// Lifetime counters of the expert fetcher (None before the direct tier was first used).
    pub fn fetch_counters(&self) -> Option<crate::io::FetchCounters> {
        self.fetcher.as_ref().map(|f| f.counters)
    }

    /// Staging slots allocated by the fetcher.
    pub fn fetch_slots(&self) -> usize {
        self.fetcher.as_ref().map_or(0, |f| f.n_slots())
    }

    /// Staging slots free to be handed out (equals `fetch_slots` between tokens).
    pub fn fetch_free_slots(&self) -> usize {
        self.fetcher.as_ref().map_or(0, |f| f.free_slots())
    }

    /// A helper-thread failure since the last call, for the caller to report: the prefetch
    /// thread panicked (it is restarted here; only hints were lost, tokens are unaffected).
    pub fn take_io_incident(&mut self) -> Option<String> {
        self.prefetcher.as_mut().and_then(|p| p.recover())
    }

    /// Lifetime counters of the prefetch thread: (commands, lines hinted, dropped).
    pub fn prefetch_counters(&self) -> Option<(u64, u64, u64)> {
        self.prefetcher.as_ref().map(|p| {
            let c = &p.counters;
            (
                c.commands.load(Ordering::Relaxed),
                c.lines.load(Ordering::Relaxed),
                c.dropped.load(Ordering::Relaxed),
            )
        })
    }

    /// True when the experts of the next token will be read through the fetcher.
    fn fetching(&self) -> bool {
        self.opts.expert_tier == ExpertTier::Direct
            && self.opts.layout != Layout::RowMajor
            && self.cfg.has_experts()
    }

    /// Starts the fetcher (and prefetcher) needed by the current options.
    fn ensure_io(&mut self) {
        if self.fetching() && self.fetcher.is_none() {
            let path = self.active().path.clone();
            match ExpertFetcher::new(&path, self.opts.readers, self.opts.fetch_hooks.clone()) {
                Ok(mut f) => {
                    if let Some(n) = f.note() {
                        self.note(n.to_string());
                    }
                    f.set_cache_bytes(self.opts.expert_cache_mib << 20);
                    self.fetcher = Some(f);
                }
                Err(e) => self.note(format!(
                    "expert fetcher unavailable ({e}): experts read from the map"
                )),
            }
        }
        if self.opts.prefetch && self.prefetcher.is_none() {
            let depth = crate::io::prefetch::depth_for_steps(self.cfg().effective_layers());
            match Prefetcher::with_depth(depth, self.opts.fetch_hooks.fault) {
                Ok(p) => self.prefetcher = Some(p),
                Err(e) => self.note(format!("prefetch thread unavailable: {e}")),
            }
        }
    }

    fn note(&mut self, n: String) {
        if !self.notes.contains(&n) {
            self.notes.push(n);
        }
    }

    /// The engine settings as the UI shows them, with notes on degraded modes.
    pub fn config_info(&self) -> EngineConfigInfo {
        let mut notes = self.notes.clone();
        if self.opts.expert_tier == ExpertTier::Direct {
            if let Some(n) = self.fetcher.as_ref().and_then(|f| f.note()) {
                let n = n.to_string();
                if !notes.contains(&n) {
                    notes.push(n);
                }
            }
            if self.opts.fetch == FetchMode::Staged && self.cfg.expert_delay == 0 {
                notes.push("staged fetch with δe = 0 degenerates to sync".into());
            }
            if self.opts.layout == Layout::RowMajor && self.cfg.has_experts() {
                notes.push("rowmajor layout: experts come from the in-memory copy".into());
            }
            if self.active().is_repacked() && self.cfg.has_experts() {
                notes.push(
                    "direct tier reads experts in the file's layout, the resident copy's are                      repacked (other kernels): for a like-for-like tier A/B start with                      --weights mmap"
                        .into(),
                );
            }
        } else if self.opts.fetch == FetchMode::Staged && self.cfg.has_experts() {
            notes.push("mmap tier: experts read from the map; fetch mode has no effect".into());
        }
        if self.opts.expert_tier != ExpertTier::Direct
            && self.opts.fuse_shared
            && self.cfg.meta.route_ahead > 0
            && self
                .file
                .layers
                .iter()
                .any(|l| l.gate.is_some() && !l.experts.is_empty())
        {
            // docs/SEMANTICS.md X3: one pool run times both, so the split is modelled.
            notes.push(
                "shared + routed experts (and the route-ahead selection) run fused: their \
                 times are split by bytes (modelled)"
                    .into(),
            );
        }
        notes.extend(self.schedule_note());
        if self.active().is_resident() && self.opts.layout == Layout::RowMajor {
            notes.push(
                if self.active().is_repacked() {
                    "rowmajor copy is in 4 KiB pages and the file's block layout, the resident \
                 .cflow in huge pages and repacked (other kernels): for a like-for-like layout \
                 A/B start with --weights mmap"
                } else {
                    "rowmajor copy is in 4 KiB pages, the resident .cflow in huge pages: for a \
                 like-for-like layout A/B start with --weights mmap"
                }
                .into(),
            );
        }
        EngineConfigInfo {
            threads: self.pool.threads() as u32,
            isa: format!("{:?}", self.opts.isa).to_lowercase(),
            prefetch: self.opts.prefetch,
            weights: self.active().weights_mode().into(),
            repacked: self.active().is_repacked(),
            readers: self.opts.readers as u32,
            fetch: self.opts.fetch,
            expert_tier: self.opts.expert_tier,
            layout: self.opts.layout,
            layouts_available: [
                Some(Layout::Cflow),
                self.vflow.as_ref().map(|_| Layout::Vflow),
                Some(Layout::RowMajor),
            ]
            .into_iter()
            .flatten()
            .collect(),
            notes,
        }
    }

    /// Switches the weight layout (builds the row-major copy on first use; `Vflow` needs an
    /// attached twin). Takes effect at the next token.
    pub fn set_layout(&mut self, layout: Layout) -> Result<(), String> {
        if layout == Layout::Vflow && self.vflow.is_none() {
            return Err(
                "layout `vflow` needs a .vflow twin (convert --to vflow, --vflow FILE)".into(),
            );
        }
        if layout == Layout::RowMajor && self.rowmajor.is_none() {
            self.build_rowmajor();
        }
        let before = Arc::as_ptr(self.active());
        self.opts.layout = layout;
        if Arc::as_ptr(self.active()) != before {
            // The expert fetcher reads from the active file's path; reopen it on next use.
            self.quiesce();
            self.fetcher = None;
            self.rel_experts = relative_experts(self.active(), self.opts.isa);
        }
        Ok(())
    }

    fn build_rowmajor(&mut self) {
        self.rowmajor = Some(weights::build_rowmajor(&self.file));
    }

    pub fn threads(&self) -> usize {
        self.pool.threads()
    }

    /// Clears the KV cache.
    pub fn reset(&mut self) {
        self.kv.clear();
    }

    /// Number of cached positions.
    pub fn pos(&self) -> usize {
        self.kv.len
    }

    /// Fails once a mapped file this engine reads (the model, its `.vflow` twin) changed since it
    /// was opened (`CflowFile::check_unchanged`: a page vanished under a read, or `fstat` shows
    /// another size or modification time).
    pub fn check_files(&self) -> Result<(), ForwardError> {
        for f in std::iter::once(&self.file).chain(self.vflow.as_ref()) {
            f.check_unchanged().map_err(ForwardError::ModelChanged)?;
        }
        Ok(())
    }

    /// The cheap part of [`Engine::check_files`] (SIGBUS flags only), run inside every token.
    fn files_intact(&self) -> Result<(), ForwardError> {
        for f in std::iter::once(&self.file).chain(self.vflow.as_ref()) {
            if f.changed() {
                return Err(ForwardError::ModelChanged(f.changed_error()));
            }
        }
        Ok(())
    }

    /// Runs one token at position `self.pos()`; returns the logits when `want_logits`.
    pub fn step(&mut self, token: u32, want_logits: bool) -> Result<Option<&[f32]>, ForwardError> {
        self.files_intact()?;
        let pos = self.kv.len;
        if pos >= self.cfg.max_ctx {
            return Err(ForwardError::ContextFull {
                pos,
                max: self.cfg.max_ctx,
            });
        }
        if token as usize >= self.cfg.vocab {
            return Err(ForwardError::BadToken {
                id: token,
                vocab: self.cfg.vocab,
            });
        }
        self.forward(token, pos, want_logits)?;
        // Logits computed from zero pages (a page vanished mid-token) are never handed out.
        self.files_intact()?;
        self.kv.len = pos + 1;
        if let Some(log) = self.routing_log.as_mut() {
            log.push(routing_log::RoutedPosition::of(pos, token, &self.stats));
        }
        Ok(if want_logits {
            Some(&self.s.logits)
        } else {
            None
        })
    }

    /// Last computed logits.
    pub fn logits(&self) -> &[f32] {
        &self.s.logits
    }

    /// The final hidden state (after the last layer, before the final norm) of the last step.
    pub fn hidden(&self) -> &[f32] {
        &self.s.x
    }
}

#[cfg(test)]
mod cache_auto_tests {
    use super::auto_cache_mib;

    /// A third of the memory available, never more than every expert, off when unknown.
    #[test]
    fn auto_cache_is_a_third_of_available_at_most_all_experts() {
        let g = 1u64 << 30;
        assert_eq!(auto_cache_mib(16 * g, Some(3 * g)), 1024);
        assert_eq!(auto_cache_mib(g / 2, Some(30 * g)), 512);
        assert_eq!(auto_cache_mib(16 * g, None), 0);
        assert_eq!(auto_cache_mib(0, Some(30 * g)), 0);
    }
}
