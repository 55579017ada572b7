//! Engine options: everything a caller can choose about how a token is computed (threads, ISA,
//! activations, layout, expert tier, schedule), with the `CFLOW_*` environment knobs read once,
//! here, when the options are built — never inside a token.
//!
//! Environment knobs (documented in the README, "Environment"):
//! - `CFLOW_FORCE_INT=1`: Q8 activations and integer dot products also with `--isa scalar`
//!   ([`EngineOptions::force_int`]).
//! - `CFLOW_NO_BATCH_PREFILL=1`: prefill token by token even where batching is possible
//!   ([`EngineOptions::batch_prefill`]).
//! - `CFLOW_ISA` (kernels, read by `Isa::detect`) and `CFLOW_SPIN_US` (thread pool, read when a
//!   pool is built) are read by their own modules, also once.

use crate::engine::kv::KvType;
use crate::io::FetchHooks;
use crate::kernels::Isa;

pub use crate::toggles::{ExpertTier, FetchMode, Layout, Schedule};

#[derive(Clone, Debug)]
pub struct EngineOptions {
    pub threads: usize,
    pub isa: Isa,
    /// Quantize activations to Q8 and use integer dot products for block types.
    pub int_act: bool,
    /// Use Q8 activations even on the scalar ISA (`CFLOW_FORCE_INT`).
    pub force_int: bool,
    pub layout: Layout,
    /// Collect per-layer timings (bytes are always counted).
    pub timings: bool,
    /// Time each decode step's pool runs on the engine thread (`engine::step_split`, read by
    /// `bench decode`): three clock reads per pool run, so off unless asked for.
    pub step_split: bool,
    /// What cached keys/values are stored as: f16 (llama.cpp's default KV type, half the bytes)
    /// or f32.
    pub kv: KvType,
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
    /// Batch the prompt where the model allows it (off with `CFLOW_NO_BATCH_PREFILL`).
    pub batch_prefill: bool,
    /// Placement of the streams on the cores.
    pub schedule: Schedule,
    /// Read the weights of FFNs whose input is known to be zero (the first δd layers under a
    /// dense delay; a gated FFN of zero is zero). Off: they are skipped. On only to measure
    /// the saving; the tokens are the same.
    pub read_known_zero: bool,
    /// Diagnostic, not a router: every MoE layer runs the K experts with the largest hidden
    /// activation norm ‖h_e‖ on the layer's own input, computing all E experts' gate and up
    /// projections to find them (moefy's upper bound; `perplexity --oracle-router`).
    pub oracle_router: bool,
    /// Run a layer's shared expert (its dense FFN) and its routed experts together when they
    /// read the same input and the routed selection is already known (a route-ahead model,
    /// `meta.route_ahead` ≥ 1, on the mmap tier or resident, sequential schedule): one pool run
    /// of one task per expert (two runs split by stripes with fewer than 3 experts per thread),
    /// instead of two runs for the dense FFN and more for the experts. The outputs are
    /// bit-identical; the time is split between `ns_dense` and `ns_experts` in proportion to
    /// their bytes (a modelled split, docs/SEMANTICS.md X3).
    pub fuse_shared: bool,
    /// The direct tier's expert cache: MiB of expert regions kept in memory after their experts
    /// ran, served again without a read (0: off; [`super::CACHE_AUTO`]: sized when the engine
    /// opens the model, see [`super::auto_cache_mib`]). No effect on the mmap tier (the page
    /// cache plays that part there).
    pub expert_cache_mib: u64,
}

impl EngineOptions {
    /// The numerics these options actually run with, as `run --json`, `bench --json` and the
    /// trace's settings name them (docs/JSON.md): `act` is the activations fed to the quantized
    /// matvecs (`q8` only where an integer kernel exists: see [`super::weights::use_q8`]), `kv`
    /// what the KV cache stores (`f16` or `f32`).
    pub fn numerics(&self) -> (&'static str, &'static str) {
        (
            if super::weights::use_q8(self.int_act, self.force_int, self.isa) {
                "q8"
            } else {
                "f32"
            },
            self.kv.name(),
        )
    }
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            threads: default_threads(),
            isa: Isa::detect(),
            int_act: true,
            force_int: std::env::var_os("CFLOW_FORCE_INT").is_some(),
            layout: Layout::Cflow,
            timings: true,
            step_split: false,
            // As `--kv`'s default (cli::args): f16, chosen by KL divergence (docs/PERFORMANCE.md).
            kv: KvType::F16,
            fetch: FetchMode::Staged,
            expert_tier: ExpertTier::Mmap,
            readers: 2,
            prefetch: false,
            fetch_hooks: FetchHooks::default(),
            batch_prefill: std::env::var_os("CFLOW_NO_BATCH_PREFILL").is_none(),
            schedule: Schedule::Auto,
            read_known_zero: false,
            oracle_router: false,
            fuse_shared: true,
            expert_cache_mib: 0,
        }
    }
}

/// Physical cores (falls back to logical CPUs).
pub fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}
