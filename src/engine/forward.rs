//! The single-token forward pass and the delay-aware scheduler shared by every combine style
//! (paper §4.2–4.4; exact semantics in `docs/SEMANTICS.md`). One residual ring buffer of δd+1
//! snapshots and one pending-expert queue keyed by injection layer; everything is parameterized
//! by header fields, never by model family.

use super::ops::*;
use crate::format::reader::{ExpertView, LayerView, Matrix};
use crate::format::{CflowFile, MatrixData};
use crate::io::{
    ExpertFetcher, ExpertTier, FetchHooks, FetchMode, PrefetchCmd, Prefetcher, Ticket,
};
use crate::kernels::matvec::{rowmajor_matvec, tiled_matvec, tiled_matvec_batch, Act};
use crate::kernels::pool::ThreadPool;
use crate::kernels::{Isa, Q8Act};
use crate::model::kv::KvCache;
use crate::model::{CombineStyle, FfnAct, ModelConfig, RouterNorm};
use crate::telemetry::{EngineConfigInfo, LayerIo, LayerStat, StreamBytes, TokenStats};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Weight layout the matvecs read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Tiles in consumption order, straight from the mapped `.cflow` file.
    Cflow,
    /// The same tiles from the `.vflow` twin (vertical groups + expert bank, §3.4); available
    /// once a twin is attached with [`Engine::attach_vflow`].
    Vflow,
    /// The naive baseline: an in-memory row-major copy of the same quantized weights.
    RowMajor,
}

impl Layout {
    pub fn name(self) -> &'static str {
        match self {
            Layout::Cflow => "cflow",
            Layout::Vflow => "vflow",
            Layout::RowMajor => "rowmajor",
        }
    }
}

#[derive(Clone, Debug)]
pub struct EngineOptions {
    pub threads: usize,
    pub isa: Isa,
    /// Quantize activations to Q8 and use integer dot products for block types.
    pub int_act: bool,
    pub layout: Layout,
    /// Collect per-layer timings (bytes are always counted).
    pub timings: bool,
    /// Round cached keys/values to f16 (llama.cpp's default KV type) instead of keeping f32.
    pub kv_f16: bool,
    /// When expert bytes are read on the direct tier (sync at routing, staged until injection).
    pub fetch: FetchMode,
    /// Expert weights from the memory map or read (O_DIRECT) into staging slots.
    pub expert_tier: ExpertTier,
    /// Reader threads of the expert fetcher.
    pub readers: usize,
    /// Run the PREFETCHT0 prefetch thread.
    pub prefetch: bool,
    /// Test hooks of the expert fetcher (force buffered reads, slow readers).
    pub fetch_hooks: FetchHooks,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            threads: default_threads(),
            isa: Isa::detect(),
            int_act: true,
            layout: Layout::Cflow,
            timings: true,
            kv_f16: false,
            fetch: FetchMode::Staged,
            expert_tier: ExpertTier::Mmap,
            readers: 2,
            prefetch: false,
            fetch_hooks: FetchHooks::default(),
        }
    }
}

/// Physical cores (falls back to logical CPUs).
pub fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
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
}

/// Expert computation scheduled for a later layer (saved router activation + selection).
struct Pending {
    phys: usize,
    /// Layer whose routing produced this entry (I/O is attributed to it).
    from: usize,
    act: Vec<f32>,
    sel: Vec<(usize, f32)>,
    scale: f32,
    /// Staged reads of the selected experts (same order as `sel`); empty on the mmap tier.
    tickets: Vec<Ticket>,
}

#[derive(Default)]
struct Scratch {
    x: Vec<f32>,
    xa: Vec<f32>,
    xb: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    att: Vec<f32>,
    attn_out: Vec<f32>,
    hb: Vec<f32>,
    hb2: Vec<f32>,
    ffn_out: Vec<f32>,
    eh: Vec<f32>,
    eh2: Vec<f32>,
    eo: Vec<f32>,
    acc: Vec<f32>,
    /// [d] the second stream: DecoupledStreams `s_ffn` (eq. 4.18), PipelineRegisters `xfm_reg`
    /// (eq. 4.21); `x` is then `s_attn` / `attn_reg`.
    sf: Vec<f32>,
    /// [d] FixedPoint `x_block`: the input of the current block, fixed across its iterations
    /// (eq. 4.22).
    base: Vec<f32>,
    zero: Vec<f32>,
    ring: Vec<Vec<f32>>,
    logits: Vec<f32>,
    xq: Q8Act,
}

/// Row-major copies of every matrix, keyed by (layer, kind, expert).
type RowMajorWeights = HashMap<(usize, u8, u8), MatrixData>;

struct Ctx<'a> {
    file: &'a CflowFile,
    cfg: &'a ModelConfig,
    pool: &'a ThreadPool,
    isa: Isa,
    int_act: bool,
    rowmajor: Option<&'a RowMajorWeights>,
    kv_f16: bool,
}

impl Ctx<'_> {
    /// `outs[i].1 = outs[i].0 · x` for matrices of one layer sharing one input.
    fn mv(
        &self,
        layer: usize,
        expert: u8,
        xq: &mut Q8Act,
        x: &[f32],
        outs: &mut [(&Matrix, &mut [f32])],
    ) {
        self.mv_in(self.file.bytes(), layer, expert, xq, x, outs)
    }

    /// As `mv`, with the tiles read from `bytes` (the mapping, or a staging slot holding one
    /// expert region with region-relative stripe offsets).
    fn mv_in(
        &self,
        bytes: &[u8],
        layer: usize,
        expert: u8,
        xq: &mut Q8Act,
        x: &[f32],
        outs: &mut [(&Matrix, &mut [f32])],
    ) {
        let blocked = outs.iter().any(|(m, _)| m.quant.is_blocked());
        let use_q8 =
            self.int_act && blocked && x.len().is_multiple_of(32) && self.isa != Isa::Scalar
                || (self.int_act
                    && blocked
                    && x.len().is_multiple_of(32)
                    && std::env::var_os("CFLOW_FORCE_INT").is_some());
        if use_q8 {
            xq.quantize_from(x);
        }
        let act = Act {
            x,
            q8: if use_q8 { Some(&*xq) } else { None },
        };
        match self.rowmajor {
            Some(rm) => {
                for (m, y) in outs.iter_mut() {
                    let md = &rm[&(layer, m.kind as u8, expert)];
                    rowmajor_matvec(self.pool, self.isa, md, &act, y);
                }
            }
            None => tiled_matvec(self.pool, self.isa, bytes, outs, &act),
        }
    }
}

/// The decode engine over one open model.
pub struct Engine {
    pub file: Arc<CflowFile>,
    /// Views of the `.vflow` twin (read instead of `file` when the layout is `Vflow`).
    vflow: Option<Arc<CflowFile>>,
    pub cfg: ModelConfig,
    pub opts: EngineOptions,
    pool: ThreadPool,
    pub kv: KvCache,
    rowmajor: Option<RowMajorWeights>,
    s: Scratch,
    /// Stats of the last forward pass.
    pub stats: TokenStats,
    /// Set to stop the current forward pass at the next layer boundary.
    pub stop: Arc<AtomicBool>,
    /// Per-phase counters on the engine thread (disabled unless requested).
    pub pmu: crate::telemetry::pmu::Pmu,
    /// Expert views with stripe offsets relative to their region start, per physical layer.
    rel_experts: Vec<Vec<ExpertView>>,
    /// The direct-tier expert fetcher (created on first use).
    fetcher: Option<ExpertFetcher>,
    prefetcher: Option<Prefetcher>,
    /// Sticky notes about degraded modes (shown in `EngineConfigInfo.notes`).
    notes: Vec<String>,
}

/// `e` with every stripe offset made relative to the start of its region.
fn relative_expert(e: &ExpertView) -> ExpertView {
    let rel = |m: &Matrix| Matrix {
        stripes: m.stripes.iter().map(|&o| o - e.offset as usize).collect(),
        ..m.clone()
    };
    ExpertView {
        offset: 0,
        len: e.len,
        gate: rel(&e.gate),
        up: rel(&e.up),
        down: rel(&e.down),
    }
}

fn relative_experts(f: &CflowFile) -> Vec<Vec<ExpertView>> {
    f.layers
        .iter()
        .map(|l| l.experts.iter().map(relative_expert).collect())
        .collect()
}

/// Byte span [start, end) covering the tiles of `ms`.
fn span(ms: &[Option<&Matrix>]) -> Option<(usize, usize)> {
    let mut r: Option<(usize, usize)> = None;
    for m in ms.iter().flatten() {
        for (s, &o) in m.stripes.iter().enumerate() {
            let e = o + m.stripe_bytes(s);
            r = Some(match r {
                None => (o, e),
                Some((a, b)) => (a.min(o), b.max(e)),
            });
        }
    }
    r
}

impl Engine {
    pub fn new(file: Arc<CflowFile>, opts: EngineOptions) -> Engine {
        let cfg = file.cfg.clone();
        let d = cfg.d_model;
        let le = cfg.effective_layers();
        let s = Scratch {
            x: vec![0.0; d],
            xa: vec![0.0; d],
            xb: vec![0.0; d],
            q: vec![0.0; cfg.q_dim()],
            k: vec![0.0; cfg.kv_dim()],
            v: vec![0.0; cfg.kv_dim()],
            att: vec![0.0; cfg.q_dim()],
            attn_out: vec![0.0; d],
            hb: vec![0.0; cfg.d_ff],
            hb2: vec![0.0; cfg.d_ff],
            ffn_out: vec![0.0; d],
            eh: vec![0.0; cfg.expert_ffn],
            eh2: vec![0.0; cfg.expert_ffn],
            eo: vec![0.0; d],
            acc: vec![0.0; d],
            sf: vec![0.0; d],
            base: vec![0.0; d],
            zero: vec![0.0; d],
            ring: vec![vec![0.0; d]; cfg.dense_delay + 1],
            logits: vec![0.0; cfg.vocab],
            xq: Q8Act::default(),
        };
        let mut e = Engine {
            kv: KvCache::new(le, cfg.kv_dim(), cfg.max_ctx),
            pool: ThreadPool::new(opts.threads),
            file,
            vflow: None,
            cfg,
            rowmajor: None,
            s,
            stats: TokenStats::default(),
            stop: Arc::new(AtomicBool::new(false)),
            pmu: crate::telemetry::pmu::Pmu::disabled(),
            rel_experts: Vec::new(),
            fetcher: None,
            prefetcher: None,
            notes: Vec::new(),
            opts,
        };
        e.rel_experts = relative_experts(&e.file);
        if e.opts.layout == Layout::RowMajor {
            e.build_rowmajor();
        }
        if e.opts.layout == Layout::Vflow {
            // No twin yet: run from the .cflow until `attach_vflow` + `set_layout`.
            e.opts.layout = Layout::Cflow;
        }
        e
    }

    /// The file the forward pass reads: the `.vflow` twin under `Layout::Vflow`.
    fn active(&self) -> &Arc<CflowFile> {
        match (self.opts.layout, &self.vflow) {
            (Layout::Vflow, Some(v)) => v,
            _ => &self.file,
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
    pub fn attach_vflow(&mut self, v: Arc<CflowFile>) -> Result<(), String> {
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
        self.vflow = Some(v);
        self.rel_experts = relative_experts(self.active());
        Ok(())
    }

    /// Selects sync or staged expert fetch (takes effect at the next token).
    pub fn set_fetch(&mut self, fetch: FetchMode) {
        self.quiesce();
        self.opts.fetch = fetch;
    }

    /// Selects the expert tier (takes effect at the next token).
    pub fn set_expert_tier(&mut self, tier: ExpertTier) {
        self.quiesce();
        self.opts.expert_tier = tier;
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
                Ok(f) => {
                    if let Some(n) = f.note() {
                        self.note(n.to_string());
                    }
                    self.fetcher = Some(f);
                }
                Err(e) => self.note(format!(
                    "expert fetcher unavailable ({e}): experts read from the map"
                )),
            }
        }
        if self.opts.prefetch && self.prefetcher.is_none() {
            match Prefetcher::with_fault(self.opts.fetch_hooks.fault) {
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
            if self.opts.layout == Layout::RowMajor {
                notes.push("rowmajor layout: experts come from the in-memory copy".into());
            }
        } else if self.opts.fetch == FetchMode::Staged && self.cfg.has_experts() {
            notes.push("mmap tier: experts read from the map; fetch mode has no effect".into());
        }
        EngineConfigInfo {
            threads: self.pool.threads() as u32,
            isa: format!("{:?}", self.opts.isa).to_lowercase(),
            prefetch: self.opts.prefetch,
            fetch: self.opts.fetch.name().into(),
            expert_tier: self.opts.expert_tier.name().into(),
            layout: self.opts.layout.name().into(),
            layouts_available: [
                Some("cflow"),
                self.vflow.as_ref().map(|_| "vflow"),
                Some("rowmajor"),
            ]
            .into_iter()
            .flatten()
            .map(String::from)
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
            self.rel_experts = relative_experts(self.active());
        }
        Ok(())
    }

    fn build_rowmajor(&mut self) {
        let f = &self.file;
        let mut rm = HashMap::new();
        for (li, l) in f.layers.iter().enumerate() {
            for m in [
                Some(&l.q),
                Some(&l.k),
                Some(&l.v),
                Some(&l.o),
                l.gate.as_ref(),
                l.up.as_ref(),
                l.down.as_ref(),
            ]
            .into_iter()
            .flatten()
            {
                rm.insert((li, m.kind as u8, 0xFF), f.matrix_data(m));
            }
            for (ei, e) in l.experts.iter().enumerate() {
                for m in [&e.gate, &e.up, &e.down] {
                    rm.insert((li, m.kind as u8, ei as u8), f.matrix_data(m));
                }
            }
        }
        let lm = f.lm_head();
        rm.insert((usize::MAX, lm.kind as u8, 0xFF), f.matrix_data(lm));
        self.rowmajor = Some(rm);
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
        Ok(if want_logits {
            Some(&self.s.logits)
        } else {
            None
        })
    }

    /// Whether prompts can be prefilled in batches: standard pre-norm dense models on the tiled
    /// layout (pipeline-native styles, MoE and the row-major baseline go token by token).
    pub fn can_batch_prefill(&self) -> bool {
        let c = &self.cfg;
        c.combine_style == CombineStyle::Sequential
            && !c.has_experts()
            && c.dense_delay == 0
            && c.has_dense()
            && self.opts.layout == Layout::Cflow
            && std::env::var_os("CFLOW_NO_BATCH_PREFILL").is_none()
    }

    /// Feeds `tokens` at the current position; afterwards `logits()` holds the prediction after
    /// the last one. Batched (weights read once per batch of up to 32 tokens) when the model
    /// allows it, otherwise token by token; the results are the same up to float rounding order.
    pub fn prefill(&mut self, tokens: &[u32]) -> Result<(), ForwardError> {
        if tokens.is_empty() {
            return Ok(());
        }
        let pos = self.kv.len;
        if pos + tokens.len() > self.cfg.max_ctx {
            return Err(ForwardError::ContextFull {
                pos: pos + tokens.len() - 1,
                max: self.cfg.max_ctx,
            });
        }
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= self.cfg.vocab) {
            return Err(ForwardError::BadToken {
                id,
                vocab: self.cfg.vocab,
            });
        }
        if !self.can_batch_prefill() || tokens.len() == 1 {
            for (i, &t) in tokens.iter().enumerate() {
                self.step(t, i + 1 == tokens.len())?;
            }
            return Ok(());
        }
        const B: usize = 32;
        let n_chunks = tokens.len().div_ceil(B);
        for (ci, chunk) in tokens.chunks(B).enumerate() {
            let p0 = self.kv.len;
            self.files_intact()?;
            self.forward_batch(chunk, p0, ci + 1 == n_chunks)?;
            self.files_intact()?;
            self.kv.len = p0 + chunk.len();
        }
        Ok(())
    }

    fn forward_batch(
        &mut self,
        toks: &[u32],
        pos0: usize,
        want_logits: bool,
    ) -> Result<(), ForwardError> {
        let t_start = Instant::now();
        let ctx = Ctx {
            file: &self.file,
            cfg: &self.cfg,
            pool: &self.pool,
            isa: self.opts.isa,
            int_act: self.opts.int_act,
            rowmajor: None,
            kv_f16: self.opts.kv_f16,
        };
        let cfg = ctx.cfg;
        let n = toks.len();
        let (d, qd, kvd, ff) = (cfg.d_model, cfg.q_dim(), cfg.kv_dim(), cfg.d_ff);
        let bytes = ctx.file.bytes();
        let use_q8 = ctx.int_act && ctx.isa != Isa::Scalar;
        let quant = |xs: &[f32], width: usize| -> Option<Vec<Q8Act>> {
            if !use_q8 || !width.is_multiple_of(32) {
                return None;
            }
            Some(
                xs.chunks_exact(width)
                    .map(|x| {
                        let mut q = Q8Act::default();
                        q.quantize_from(x);
                        q
                    })
                    .collect(),
            )
        };
        let mut x = vec![0f32; n * d];
        for (b, &t) in toks.iter().enumerate() {
            embed(&ctx, t, &mut x[b * d..(b + 1) * d]);
            if cfg.embed_scale() {
                let k = (d as f32).sqrt();
                x[b * d..(b + 1) * d].iter_mut().for_each(|v| *v *= k);
            }
        }
        let mut xb = vec![0f32; n * d];
        let (mut q, mut k, mut v) = (vec![0f32; n * qd], vec![0f32; n * kvd], vec![0f32; n * kvd]);
        let mut att = vec![0f32; n * qd];
        let mut o = vec![0f32; n * d];
        let (mut g, mut u) = (vec![0f32; n * ff], vec![0f32; n * ff]);

        let mut stats = TokenStats {
            pos: pos0 as u32,
            layers: vec![LayerStat::default(); cfg.n_layers],
            ..Default::default()
        };
        for l in 0..cfg.n_layers {
            if self.stop.load(Ordering::Relaxed) {
                return Err(ForwardError::Stopped);
            }
            if ctx.file.changed() {
                return Err(ForwardError::ModelChanged(ctx.file.changed_error()));
            }
            let lv = &ctx.file.layers[l];
            let t0 = Instant::now();
            for b in 0..n {
                rmsnorm(
                    &mut xb[b * d..(b + 1) * d],
                    &x[b * d..(b + 1) * d],
                    Some(&lv.attn_norm),
                    cfg.rms_eps,
                );
            }
            let q8 = quant(&xb, d);
            tiled_matvec_batch(
                ctx.pool,
                ctx.isa,
                bytes,
                &mut [(&lv.q, &mut q), (&lv.k, &mut k), (&lv.v, &mut v)],
                &xb,
                q8.as_deref(),
                n,
            );
            for b in 0..n {
                let pos = pos0 + b;
                let (qb, kb, vb) = (
                    &mut q[b * qd..(b + 1) * qd],
                    &mut k[b * kvd..(b + 1) * kvd],
                    &mut v[b * kvd..(b + 1) * kvd],
                );
                qkv_post(&ctx, lv, l, pos, qb, kb, vb);
                self.kv.store(l, pos, kb, vb);
            }
            for b in 0..n {
                attend(
                    &ctx,
                    l,
                    l,
                    pos0 + b,
                    &self.kv,
                    &q[b * qd..(b + 1) * qd],
                    &mut att[b * qd..(b + 1) * qd],
                );
            }
            let q8 = quant(&att, qd);
            tiled_matvec_batch(
                ctx.pool,
                ctx.isa,
                bytes,
                &mut [(&lv.o, &mut o)],
                &att,
                q8.as_deref(),
                n,
            );
            add_into(&mut x, &o);
            let st = &mut stats.layers[l];
            st.bytes.attn = (lv.q.bytes() + lv.k.bytes() + lv.v.bytes() + lv.o.bytes()) as u64;
            st.ns_attn = t0.elapsed().as_nanos() as u64;
            let t1 = Instant::now();
            let (gm, um, dm) = (
                lv.gate.as_ref().expect("dense"),
                lv.up.as_ref().expect("dense"),
                lv.down.as_ref().expect("dense"),
            );
            for b in 0..n {
                rmsnorm(
                    &mut xb[b * d..(b + 1) * d],
                    &x[b * d..(b + 1) * d],
                    lv.ffn_norm.as_deref(),
                    cfg.rms_eps,
                );
            }
            let q8 = quant(&xb, d);
            tiled_matvec_batch(
                ctx.pool,
                ctx.isa,
                bytes,
                &mut [(gm, &mut g), (um, &mut u)],
                &xb,
                q8.as_deref(),
                n,
            );
            for b in 0..n {
                gated(
                    cfg.meta.ffn_act,
                    &mut g[b * ff..(b + 1) * ff],
                    &u[b * ff..(b + 1) * ff],
                );
            }
            let q8 = quant(&g, ff);
            tiled_matvec_batch(
                ctx.pool,
                ctx.isa,
                bytes,
                &mut [(dm, &mut o)],
                &g,
                q8.as_deref(),
                n,
            );
            add_into(&mut x, &o);
            st.bytes.dense = (gm.bytes() + um.bytes() + dm.bytes()) as u64;
            st.ns_dense = t1.elapsed().as_nanos() as u64;
        }
        let s = &mut self.s;
        s.x.copy_from_slice(&x[(n - 1) * d..]);
        if want_logits {
            let t4 = Instant::now();
            rmsnorm(
                &mut s.xb,
                &s.x,
                Some(&ctx.file.vocab.final_norm),
                cfg.rms_eps,
            );
            let lm = ctx.file.lm_head();
            let xbv = std::mem::take(&mut s.xb);
            ctx.mv(
                usize::MAX,
                0xFF,
                &mut s.xq,
                &xbv,
                &mut [(lm, &mut s.logits)],
            );
            s.xb = xbv;
            let cap = cfg.final_logit_softcap;
            if cap > 0.0 {
                s.logits
                    .iter_mut()
                    .for_each(|v| *v = cap * (*v / cap).tanh());
            }
            stats.vocab_bytes = lm.bytes() as u64;
            stats.ns_lm_head = t4.elapsed().as_nanos() as u64;
        }
        stats.ns_total = t_start.elapsed().as_nanos() as u64;
        self.stats = stats;
        Ok(())
    }

    /// Last computed logits.
    pub fn logits(&self) -> &[f32] {
        &self.s.logits
    }

    /// The final hidden state (after the last layer, before the final norm) of the last step.
    pub fn hidden(&self) -> &[f32] {
        &self.s.x
    }

    fn forward(&mut self, token: u32, pos: usize, want_logits: bool) -> Result<(), ForwardError> {
        let t_start = Instant::now();
        self.ensure_io();
        let fetching = self.fetching() && self.fetcher.is_some();
        // Reads left in flight by an interrupted token complete here; every slot is free after.
        self.quiesce();
        let mode = self.opts.fetch;
        let prefetch = if self.opts.prefetch && self.opts.layout != Layout::RowMajor {
            self.prefetcher.as_ref()
        } else {
            None
        };
        let mut fetcher = if fetching {
            self.fetcher.as_mut()
        } else {
            None
        };
        let rel = &self.rel_experts;
        let timings = self.opts.timings;
        let file: &Arc<CflowFile> = match (self.opts.layout, &self.vflow) {
            (Layout::Vflow, Some(v)) => v,
            _ => &self.file,
        };
        let ctx = Ctx {
            file,
            cfg: &self.cfg,
            pool: &self.pool,
            isa: self.opts.isa,
            int_act: self.opts.int_act,
            rowmajor: if self.opts.layout == Layout::RowMajor {
                self.rowmajor.as_ref()
            } else {
                None
            },
            kv_f16: self.opts.kv_f16,
        };
        let cfg = ctx.cfg;
        let s = &mut self.s;
        let kv = &mut self.kv;
        let pmu = &mut self.pmu;
        let pmu_on = pmu.is_enabled();
        if pmu_on {
            pmu.begin_token();
        }
        let d = cfg.d_model;
        let le = cfg.effective_layers();
        let dd = cfg.dense_delay;
        let de = cfg.expert_delay;
        let style = cfg.combine_style;
        let both = cfg.has_dense() && cfg.has_experts();
        let par_scale = if style == CombineStyle::ParallelSqrt2 && both {
            std::f32::consts::FRAC_1_SQRT_2
        } else {
            1.0
        };

        let mut stats = TokenStats {
            pos: pos as u32,
            layers: vec![LayerStat::default(); le],
            ..Default::default()
        };

        embed(&ctx, token, &mut s.x);
        if cfg.embed_scale() {
            let k = (d as f32).sqrt();
            s.x.iter_mut().for_each(|v| *v *= k);
        }
        for r in s.ring.iter_mut() {
            r.fill(0.0);
        }
        let mut pending: Vec<Vec<Pending>> = (0..le).map(|_| Vec::new()).collect();
        // Reader-busy ns and bytes of the reads issued at each layer.
        let mut io_acc = vec![(0u64, 0u64); le];
        // Both streams (registers) start at the embedding.
        let two_streams = matches!(
            style,
            CombineStyle::DecoupledStreams | CombineStyle::PipelineRegisters
        );
        if two_streams {
            s.sf.copy_from_slice(&s.x);
        }
        let mut prev_block = usize::MAX;

        for l in 0..le {
            if self.stop.load(Ordering::Relaxed) {
                return Err(ForwardError::Stopped);
            }
            if ctx.file.changed() {
                return Err(ForwardError::ModelChanged(ctx.file.changed_error()));
            }
            let p = cfg.physical_layer(l);
            let lv = &ctx.file.layers[p];
            let st = &mut stats.layers[l];
            let t_layer = Instant::now();
            let mut wait_ns = 0u64;
            // Hint the next layer's attention and dense tiles to the prefetch thread.
            if let (Some(pf), true) = (prefetch, l + 1 < le) {
                let nv = &ctx.file.layers[cfg.physical_layer(l + 1)];
                let spans = [
                    span(&[Some(&nv.q), Some(&nv.k), Some(&nv.v), Some(&nv.o)]),
                    span(&[nv.gate.as_ref(), nv.up.as_ref(), nv.down.as_ref()]),
                ];
                for (a, b) in spans.into_iter().flatten() {
                    pf.send(PrefetchCmd::LinearRange {
                        file: file.clone(),
                        offset: a,
                        len: b - a,
                    });
                }
            }
            // Residual entering the layer, the one its FFN reads (DecoupledStreams: s_ffn;
            // PipelineRegisters: xfm_reg).
            let ring_src = if two_streams { &s.sf } else { &s.x };
            s.ring[l % (dd + 1)].copy_from_slice(ring_src);
            // FixedPoint: the first iteration of a block fixes x_block (eq. 4.22).
            if style == CombineStyle::FixedPoint && cfg.physical_layer(l) != prev_block {
                s.base.copy_from_slice(&s.x);
                prev_block = cfg.physical_layer(l);
            }

            // Attention (the attention stream for DecoupledStreams).
            let t0 = Instant::now();
            attention(&ctx, lv, l, p, pos, kv, s);
            st.bytes.attn = (lv.q.bytes() + lv.k.bytes() + lv.v.bytes() + lv.o.bytes()) as u64;
            if timings {
                st.ns_attn = t0.elapsed().as_nanos() as u64;
            }
            if pmu_on {
                pmu.phase("attention");
            }
            // a = x + A(x)
            s.xa.copy_from_slice(&s.x);
            add_into(&mut s.xa, &s.attn_out);

            // Dense FFN input: delayed residual when δd > 0, else the style's anchor.
            let t1 = Instant::now();
            let has_dense_out = lv.gate.is_some();
            if has_dense_out {
                let src: &[f32] = if dd > 0 {
                    if l >= dd {
                        &s.ring[(l - dd) % (dd + 1)]
                    } else {
                        &s.zero
                    }
                } else {
                    match style {
                        // Eq. 4.11 with δd = 0 (x_in); AsyncExperts: Norm(x_in) (§4.2.3).
                        CombineStyle::DelayedSum | CombineStyle::AsyncExperts => &s.x,
                        // Eq. 4.18 (s_ffn) and eq. 4.20 (xfm_reg_{ℓ−1}).
                        CombineStyle::DecoupledStreams | CombineStyle::PipelineRegisters => &s.sf,
                        // Eq. 4.3 (x_mid); FixedPoint: x + Attn_B(·) (eq. 4.22).
                        _ => &s.xa,
                    }
                };
                let src = src.to_vec();
                dense(&ctx, lv, p, &src, s);
                st.bytes.dense = (lv.gate.as_ref().map_or(0, |m| m.bytes())
                    + lv.up.as_ref().map_or(0, |m| m.bytes())
                    + lv.down.as_ref().map_or(0, |m| m.bytes()))
                    as u64;
            } else {
                s.ffn_out.fill(0.0);
            }
            if timings {
                st.ns_dense = t1.elapsed().as_nanos() as u64;
            }
            if pmu_on && has_dense_out {
                pmu.phase("dense");
            }

            // Routing: pre-attention anchor for AsyncExperts (eq. 4.13), the FFN's input for
            // DecoupledStreams / PipelineRegisters, post-attention otherwise (x_mid, §4.2.3).
            if cfg.has_experts() && !lv.experts.is_empty() {
                let t2 = Instant::now();
                let src: &[f32] = match style {
                    CombineStyle::AsyncExperts => &s.x,
                    CombineStyle::DecoupledStreams | CombineStyle::PipelineRegisters => &s.sf,
                    _ => &s.xa,
                };
                let (act, sel) = route(cfg, lv, src);
                st.routing = sel.iter().map(|&(e, w)| (e as u16, w)).collect();
                let target = (l + de).min(le - 1);
                let mut tickets = Vec::new();
                if let Some(f) = fetcher.as_deref_mut() {
                    for &(e, _) in &sel {
                        let ex = &lv.experts[e];
                        tickets.push(f.submit(ex.offset, ex.len as usize));
                    }
                    if mode == FetchMode::Sync {
                        for t in &tickets {
                            wait_ns += f.wait(*t);
                        }
                    }
                } else if let Some(pf) = prefetch {
                    pf.send(PrefetchCmd::ExpertTiles {
                        file: file.clone(),
                        regions: sel
                            .iter()
                            .map(|&(e, _)| {
                                (lv.experts[e].offset as usize, lv.experts[e].len as usize)
                            })
                            .collect(),
                    });
                }
                pending[target].push(Pending {
                    phys: p,
                    from: l,
                    act,
                    sel,
                    scale: par_scale,
                    tickets,
                });
                if timings {
                    st.ns_router = t2.elapsed().as_nanos() as u64;
                }
            }

            // Combine.
            match style {
                CombineStyle::DecoupledStreams => {
                    // Eq. 4.17–4.18: x is s_attn, sf is s_ffn.
                    add_into(&mut s.x, &s.attn_out);
                    add_into(&mut s.sf, &s.ffn_out);
                }
                CombineStyle::PipelineRegisters => {
                    // Eq. 4.19: attn_reg_ℓ = attn_reg_{ℓ−1} + Attn; eq. 4.21: xfm_reg_ℓ =
                    // attn_reg_ℓ + f_ℓ.
                    std::mem::swap(&mut s.x, &mut s.xa);
                    s.sf.copy_from_slice(&s.x);
                    add_into(&mut s.sf, &s.ffn_out);
                }
                CombineStyle::FixedPoint => {
                    // Eq. 4.22: x ← x_block + Attn_B(Norm(x)) + FFN_B(Norm(x + Attn_B(·))).
                    for i in 0..d {
                        s.x[i] = s.base[i] + s.attn_out[i] + s.ffn_out[i];
                    }
                }
                _ => {
                    std::mem::swap(&mut s.x, &mut s.xa);
                    add_scaled(&mut s.x, &s.ffn_out, par_scale);
                }
            }

            // Inject the expert outputs scheduled for the end of this layer.
            let t3 = Instant::now();
            let mut ebytes = 0u64;
            for pe in pending[l].drain(..) {
                if let Some(f) = fetcher.as_deref_mut() {
                    for (t, &(e, _)) in pe.tickets.iter().zip(&pe.sel) {
                        wait_ns += f.wait(*t);
                        let (busy, b) = f.io_of(*t);
                        io_acc[pe.from].0 += busy;
                        io_acc[pe.from].1 += b;
                        if let Err(error) = f.view(*t) {
                            let ex = &ctx.file.layers[pe.phys].experts[e];
                            let err = ForwardError::ExpertRead {
                                path: ctx.file.path.display().to_string(),
                                layer: pe.phys,
                                expert: e,
                                offset: ex.offset,
                                len: ex.len,
                                error: error.to_string(),
                            };
                            // Every other read of this token completes and every slot is free
                            // before the error leaves the engine.
                            f.drain();
                            return Err(err);
                        }
                    }
                }
                let eb = run_experts(
                    &ctx,
                    &ctx.file.layers[pe.phys],
                    &rel[pe.phys],
                    pe.phys,
                    &pe,
                    fetcher.as_deref(),
                    s,
                );
                ebytes += eb;
                if let Some(f) = fetcher.as_deref_mut() {
                    for t in &pe.tickets {
                        f.release(*t);
                    }
                }
                // Eq. 4.16: x^out_{ℓ+δe} += e_ℓ (the layer's complete output).
                let dst = if two_streams { &mut s.sf } else { &mut s.x };
                add_scaled(dst, &s.acc, pe.scale);
            }
            st.bytes.experts = ebytes;
            if pmu_on {
                pmu.phase(if ebytes > 0 { "experts" } else { "other" });
            }
            if timings && ebytes > 0 {
                st.ns_experts = t3.elapsed().as_nanos() as u64;
            }
            if fetching {
                let layer_ns = t_layer.elapsed().as_nanos() as u64;
                st.io = Some(LayerIo {
                    compute_ns: layer_ns.saturating_sub(wait_ns),
                    io_ns: 0,
                    wait_ns,
                    bytes: 0,
                });
            }

            if style == CombineStyle::DecoupledStreams {
                // §4.3.1: every merge_interval layers, s_attn = s_ffn = (s_attn + s_ffn)/2.
                let mi = cfg.meta.merge_interval.max(1) as usize;
                if (l + 1) % mi == 0 {
                    for i in 0..d {
                        let m = (s.x[i] + s.sf[i]) * 0.5;
                        s.x[i] = m;
                        s.sf[i] = m;
                    }
                }
            }
        }
        // The output: PipelineRegisters' xfm_reg_{L−1} (eq. 4.21, "the complete output");
        // DecoupledStreams reads s_attn (docs/SEMANTICS.md).
        if style == CombineStyle::PipelineRegisters {
            std::mem::swap(&mut s.x, &mut s.sf);
        }
        for (st, (busy, b)) in stats.layers.iter_mut().zip(&io_acc) {
            if let Some(io) = st.io.as_mut() {
                io.io_ns = *busy;
                io.bytes = *b;
            }
        }

        if want_logits {
            let t4 = Instant::now();
            let fnorm = &ctx.file.vocab.final_norm;
            rmsnorm(&mut s.xb, &s.x, Some(fnorm), cfg.rms_eps);
            let lm = ctx.file.lm_head();
            let xb = std::mem::take(&mut s.xb);
            ctx.mv(usize::MAX, 0xFF, &mut s.xq, &xb, &mut [(lm, &mut s.logits)]);
            s.xb = xb;
            let cap = cfg.final_logit_softcap;
            if cap > 0.0 {
                s.logits
                    .iter_mut()
                    .for_each(|v| *v = cap * (*v / cap).tanh());
            }
            stats.vocab_bytes = lm.bytes() as u64;
            stats.ns_lm_head = t4.elapsed().as_nanos() as u64;
            if pmu_on {
                pmu.phase("lm_head");
            }
        }
        if pmu_on {
            stats.pmu = Some(pmu.end_token());
        }
        stats.ns_total = t_start.elapsed().as_nanos() as u64;
        self.stats = stats;
        Ok(())
    }
}

/// Dequantizes embedding row `token` into `out`.
fn embed(ctx: &Ctx, token: u32, out: &mut [f32]) {
    let m = &ctx.file.vocab.embedding;
    let t = token as usize;
    let s = t / crate::format::TILE_ROWS;
    let r = t % crate::format::TILE_ROWS;
    for c in 0..m.n_col_tiles() {
        let tile = ctx.file.tile(m, s, c);
        let q = m.quant;
        let c0 = c * crate::format::TILE_COLS;
        let (sb, qb) = if q.is_blocked() {
            (
                (tile.cols / 32) * q.scale_bytes_per_block(),
                (tile.cols / 32) * q.quant_bytes_per_block(),
            )
        } else {
            (0, q.matrix_bytes(1, tile.cols))
        };
        crate::quant::dequantize_row(
            q,
            &tile.scales[r * sb..(r + 1) * sb],
            &tile.qs[r * qb..(r + 1) * qb],
            &mut out[c0..c0 + tile.cols],
        );
    }
}

/// Biases, whole-projection Q/K norms, clipping, RoPE, V-norm and (optionally) f16 rounding of
/// one token's Q/K/V.
#[allow(clippy::too_many_arguments)]
fn qkv_post(
    ctx: &Ctx,
    lv: &LayerView,
    p: usize,
    pos: usize,
    q: &mut [f32],
    k: &mut [f32],
    v: &mut [f32],
) {
    let cfg = ctx.cfg;
    let hd = cfg.head_dim;
    if let Some(b) = &lv.q_bias {
        add_into(q, b);
    }
    if let Some(b) = &lv.k_bias {
        add_into(k, b);
    }
    if let Some(b) = &lv.v_bias {
        add_into(v, b);
    }
    // OLMoE: RMSNorm over the whole projection (all heads at once), before the split into heads.
    for (x, w) in [(&mut *q, &lv.q_norm), (&mut *k, &lv.k_norm)] {
        if let Some(w) = w {
            let src = x.to_vec();
            rmsnorm(x, &src, Some(&w[..]), cfg.rms_eps);
        }
    }
    let clip = cfg.meta.clip_qkv;
    if clip > 0.0 {
        for x in q.iter_mut().chain(k.iter_mut()).chain(v.iter_mut()) {
            *x = x.clamp(-clip, clip);
        }
    }
    let rot = cfg.rope_dims();
    let theta = cfg.rope_theta_for(p);
    let style = cfg.meta.rope_style;
    for h in q.chunks_exact_mut(hd) {
        rope(h, pos, rot, theta, style);
    }
    for h in k.chunks_exact_mut(hd) {
        rope(h, pos, rot, theta, style);
    }
    if cfg.v_norm() {
        for h in v.chunks_exact_mut(hd) {
            let src = h.to_vec();
            rmsnorm(h, &src, None, cfg.rms_eps);
        }
    }
    if ctx.kv_f16 {
        // Emulate an f16 KV cache (llama.cpp's default) by rounding what is stored.
        for x in k.iter_mut().chain(v.iter_mut()) {
            *x = half::f16::from_f32(*x).to_f32();
        }
    }
}

/// Multi-head attention of one query (position `pos`) over the layer's cached K/V.
#[allow(clippy::too_many_arguments)]
fn attend(ctx: &Ctx, l: usize, p: usize, pos: usize, kv: &KvCache, q: &[f32], att: &mut [f32]) {
    let cfg = ctx.cfg;
    let win = cfg.sliding_window_for(p);
    let sh = crate::kernels::attention::AttnShape {
        n_heads: cfg.n_heads,
        group: cfg.n_heads / cfg.n_kv_heads,
        head_dim: cfg.head_dim,
        kv_dim: cfg.kv_dim(),
        start: if win > 0 && pos + 1 > win {
            pos + 1 - win
        } else {
            0
        },
        pos,
        scale: 1.0 / (cfg.head_dim as f32).sqrt(),
        cap: cfg.meta.attn_logit_softcap,
    };
    crate::kernels::attention::attend(ctx.pool, &sh, q, &kv.k[l], &kv.v[l], att);
}

fn attention(
    ctx: &Ctx,
    lv: &LayerView,
    l: usize,
    p: usize,
    pos: usize,
    kv: &mut KvCache,
    s: &mut Scratch,
) {
    let cfg = ctx.cfg;
    rmsnorm(&mut s.xb, &s.x, Some(&lv.attn_norm), cfg.rms_eps);
    {
        let xb = std::mem::take(&mut s.xb);
        ctx.mv(
            p,
            0xFF,
            &mut s.xq,
            &xb,
            &mut [(&lv.q, &mut s.q), (&lv.k, &mut s.k), (&lv.v, &mut s.v)],
        );
        s.xb = xb;
    }
    qkv_post(ctx, lv, p, pos, &mut s.q, &mut s.k, &mut s.v);
    kv.store(l, pos, &s.k, &s.v);
    attend(ctx, l, p, pos, kv, &s.q, &mut s.att);
    let att = std::mem::take(&mut s.att);
    ctx.mv(p, 0xFF, &mut s.xq, &att, &mut [(&lv.o, &mut s.attn_out)]);
    s.att = att;
}

fn gated(act: FfnAct, g: &mut [f32], u: &[f32]) {
    match act {
        FfnAct::Swiglu => g.iter_mut().zip(u).for_each(|(g, u)| *g = silu(*g) * u),
        FfnAct::Geglu => g.iter_mut().zip(u).for_each(|(g, u)| *g = gelu(*g) * u),
    }
}

fn dense(ctx: &Ctx, lv: &LayerView, p: usize, src: &[f32], s: &mut Scratch) {
    let cfg = ctx.cfg;
    let norm = lv.ffn_norm.as_deref();
    rmsnorm(&mut s.xb, src, norm, cfg.rms_eps);
    let (g, u, dn) = (
        lv.gate.as_ref().expect("dense"),
        lv.up.as_ref().expect("dense"),
        lv.down.as_ref().expect("dense"),
    );
    let xb = std::mem::take(&mut s.xb);
    ctx.mv(
        p,
        0xFF,
        &mut s.xq,
        &xb,
        &mut [(g, &mut s.hb), (u, &mut s.hb2)],
    );
    s.xb = xb;
    gated(cfg.meta.ffn_act, &mut s.hb, &s.hb2);
    let hb = std::mem::take(&mut s.hb);
    ctx.mv(p, 0xFF, &mut s.xq, &hb, &mut [(dn, &mut s.ffn_out)]);
    s.hb = hb;
}

/// Router: returns the normalized activation (saved for the deferred expert computation) and the
/// top-k (expert, weight) list, best first.
fn route(cfg: &ModelConfig, lv: &LayerView, src: &[f32]) -> (Vec<f32>, Vec<(usize, f32)>) {
    let d = cfg.d_model;
    let mut act = vec![0.0; d];
    rmsnorm(&mut act, src, lv.moe_norm.as_deref(), cfg.rms_eps);
    let r = lv.router.as_ref().expect("router");
    let mut logits: Vec<f32> = (0..cfg.n_experts)
        .map(|e| {
            r[e * d..(e + 1) * d]
                .iter()
                .zip(&act)
                .map(|(a, b)| a * b)
                .sum()
        })
        .collect();
    let mut idx: Vec<usize> = (0..cfg.n_experts).collect();
    // Stable: ties broken by lower expert id.
    idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    idx.truncate(cfg.top_k);
    let sel = match cfg.meta.router_norm {
        RouterNorm::SoftmaxTopk => {
            let mut w: Vec<f32> = idx.iter().map(|&i| logits[i]).collect();
            softmax(&mut w);
            idx.iter().copied().zip(w).collect()
        }
        RouterNorm::SoftmaxAll => {
            softmax(&mut logits);
            idx.iter().map(|&i| (i, logits[i])).collect()
        }
    };
    (act, sel)
}

/// Runs the selected experts of a pending routing into `s.acc` (from the staging slots when the
/// experts were fetched, else from the map); returns the bytes touched.
fn run_experts(
    ctx: &Ctx,
    lv: &LayerView,
    rel: &[ExpertView],
    p: usize,
    pe: &Pending,
    fetcher: Option<&ExpertFetcher>,
    s: &mut Scratch,
) -> u64 {
    s.acc.fill(0.0);
    let mut bytes = 0;
    for (i, &(e, w)) in pe.sel.iter().enumerate() {
        let staged = pe
            .tickets
            .get(i)
            .and_then(|t| fetcher.and_then(|f| f.view(*t).ok()));
        let (src, ex): (&[u8], &ExpertView) = match staged {
            Some(b) => (b, &rel[e]),
            None => (ctx.file.bytes(), &lv.experts[e]),
        };
        ctx.mv_in(
            src,
            p,
            e as u8,
            &mut s.xq,
            &pe.act,
            &mut [(&ex.gate, &mut s.eh), (&ex.up, &mut s.eh2)],
        );
        gated(ctx.cfg.meta.ffn_act, &mut s.eh, &s.eh2);
        let eh = std::mem::take(&mut s.eh);
        ctx.mv_in(
            src,
            p,
            e as u8,
            &mut s.xq,
            &eh,
            &mut [(&ex.down, &mut s.eo)],
        );
        s.eh = eh;
        add_scaled(&mut s.acc, &s.eo, w);
        bytes += (ex.gate.bytes() + ex.up.bytes() + ex.down.bytes()) as u64;
    }
    bytes
}

/// Modelled bytes per token of each stream per layer (attention, dense, top-k experts).
pub fn stream_bytes(file: &CflowFile) -> Vec<StreamBytes> {
    let cfg = &file.cfg;
    (0..cfg.effective_layers())
        .map(|l| {
            let lv = &file.layers[cfg.physical_layer(l)];
            let attn = (lv.q.bytes() + lv.k.bytes() + lv.v.bytes() + lv.o.bytes()) as u64;
            let dense = [&lv.gate, &lv.up, &lv.down]
                .iter()
                .map(|m| m.as_ref().map_or(0, |m| m.bytes()))
                .sum::<usize>() as u64;
            let experts = lv.experts.first().map_or(0, |e| {
                (e.gate.bytes() + e.up.bytes() + e.down.bytes()) * cfg.top_k
            }) as u64;
            StreamBytes {
                attn,
                dense,
                experts,
            }
        })
        .collect()
}
